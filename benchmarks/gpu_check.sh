#!/usr/bin/env bash
# Every GPU check of the project in one pass, for a lent GPU machine (see CONTRIBUTING notes in README):
# the CUDA tests, a recorded GPU training run (NVML + CUDA events), the GPU fast-path benchmarks and the
# recorder's overhead on a many-core machine. Writes its log and JSON under $OUT (default ./gpu-check).
# Wheels for packages the machine lacks can be put in .whl/ beforehand.
set -u
OUT=${OUT:-./gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
LOG="$OUT/log.txt"
step() { echo; echo "=== $* ($(date +%T))"; }
{
  step environment
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nproc
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
      && export PYTHONPATH=/tmp/site
  fi
  python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -2
  python3 -c "import torch, stallscope; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"

  step "CUDA tests (pytest -m gpu)"
  timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/unit/test_data_device.py \
    tests/unit/test_doctor_gpu.py tests/e2e/test_gpu.py 2>&1 | tail -15

  step "recorded GPU runs: starved and compute-heavy"
  timeout 60 python3 -m stallscope run --json "$OUT/starved.json" -- \
    python3 tests/scripts/gpu_train.py --workers 0 --sleep-ms 1 --width 16 2>&1 | tail -25
  timeout 60 python3 -m stallscope run --json "$OUT/heavy.json" -- \
    python3 tests/scripts/gpu_train.py --workers 4 --size 128 --width 256 2>&1 | tail -25
  python3 - "$OUT" <<'PY'
import json, sys, shutil
out = sys.argv[1]
for name in ("starved", "heavy"):
    s = json.load(open(f"{out}/{name}.json"))
    sess = json.load(open(s["session"]))
    gpu = sess["samples"].get("gpu") or {}
    util = [v[0] for v in gpu.get("util_percent", []) if v and v[0] is not None]
    print(name, "verdict", s["verdict"], "wait", s["data_wait_fraction"], "gpu_timing", s["gpu_timing"])
    print("  NVML:", gpu.get("names"), "ticks", len(util), "util mean", sum(util) / max(1, len(util)),
          "absent", sess["samples"].get("absent"), "sampler cost", sess["samples"].get("cost"))
    if name == "starved":
        shutil.copy(s["session"], f"{out}/starved_session.json")
PY

  step "benchmarks/gpu_fastpath.py"
  timeout 150 python3 benchmarks/gpu_fastpath.py --rounds 2 2>&1

  step "benchmarks/fastpath.py --device cuda"
  timeout 200 python3 benchmarks/fastpath.py --device cuda --rounds 1 --seconds 2 2>&1 | grep -v "^\s*$"

  step "benchmarks/overhead.py on this machine"
  timeout 120 python3 benchmarks/overhead.py --pairs 4 2>&1

  step "benchmarks/ddp_overhead.py"
  timeout 90 python3 benchmarks/ddp_overhead.py --pairs 3 2>&1
  step done
} 2>&1 | tee "$LOG"

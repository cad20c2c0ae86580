"""On a CUDA machine: NVML samples and CUDA-event timings land in the session and agree with the verdict.

Skipped without a GPU (CI has none); run on a GPU machine with ``pytest -m gpu``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.e2e,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

SCRIPT = Path(__file__).parent.parent / "scripts" / "gpu_train.py"


def _run(tmp_path: Path, name: str, *script_args: str) -> tuple[dict, dict]:
    out = tmp_path / f"{name}.json"
    proc = subprocess.run([sys.executable, "-m", "stallscope", "run", "--json", str(out), "--", sys.executable,
                           str(SCRIPT), *script_args], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(out.read_text())
    session = json.loads(Path(summary["session"]).read_text())
    return summary, session


def test_cuda_events_and_nvml_are_recorded_and_agree_with_the_verdict(tmp_path):
    starved, starved_session = _run(tmp_path, "starved", "--workers", "0", "--sleep-ms", "1", "--width", "16")
    heavy, heavy_session = _run(tmp_path, "heavy", "--workers", "4", "--size", "128", "--width", "256")
    for summary, session in ((starved, starved_session), (heavy, heavy_session)):
        g = summary["gpu_timing"]
        assert g is not None and g["steps"] >= 30, g
        assert g["h2d_copies"] >= 60 and g["h2d_gb_per_s"] > 0.1, g
        assert any(s["kind"] == "idle" for s in session["gpu_spans"])
        gpu = session["system_samples"].get("gpu")
        try:
            import pynvml  # noqa: F401
        except ImportError:
            assert "gpu" in session["system_samples"]["absent"]
        else:
            assert gpu and gpu["names"] and any(v[0] is not None for v in gpu["util_percent"]), session["system_samples"]
    assert starved["verdict"] == "input-bound" and heavy["verdict"] == "compute-bound"
    # what the GPU saw agrees with the CPU-side verdict: starved means idle between steps
    assert starved["gpu_timing"]["idle_fraction"] > 0.5 > heavy["gpu_timing"]["idle_fraction"]

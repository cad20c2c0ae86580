"""Predicted vs measured throughput across worker counts, kept so that the model can be re-scored.

For each scenario: record the baseline, then the same script with each ``--workers`` count (``--set
num_workers=W``), alternating rounds. Every run's session is kept under ``--out``, with a
``results.json`` listing them, so ``--rescore OUT`` re-predicts each worker count from the saved
baselines with the model as it is now (analysis is a pure function of the session) and prints the
errors, without running anything. That is how a change to the throughput model is judged: on the
same measurements as the model before it.

Run:   python benchmarks/worker_sweep.py --out /tmp/sweep [--workers 1 2 3] [--rounds 1] [--steps 40]
Score: python benchmarks/worker_sweep.py --rescore /tmp/sweep
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from predictions import TESTS
from predictions import scenarios as prediction_scenarios

from stallscope.analysis import analyze
from stallscope.session import Session


def scenarios() -> dict[str, list[str]]:
    base = prediction_scenarios()  # the 2-thread compute and the heavy model come from there
    base.pop("early epoch exit (2 persistent workers)")  # its change is prefetch_factor, not workers
    return {**base, "tokenize in process (0 workers)": [sys.executable, str(TESTS / "scenario_tokenize.py"), "0"]}


def record(store: Path, command: list[str], steps: int, workers: int | None, out: Path) -> dict:
    args = [sys.executable, "-m", "stallscope", "run", "--quiet", "--store", str(store), "--json", str(out),
            "--steps", str(steps)]
    if workers is not None:
        args += ["--set", f"num_workers={workers}"]
    done = subprocess.run([*args, "--", *command], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"failed: {' '.join(command)}\n{done.stderr[-2000:]}")
    summary = json.loads(out.read_text())
    return {"session": summary["session"], "samples_per_s": summary["throughput"]["samples_per_s"]}


def measure(args: argparse.Namespace) -> dict:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {}
    for name, command in scenarios().items():
        if args.only and not any(name.startswith(o) for o in args.only):
            continue
        rows: dict = {"baseline": [], "workers": {str(w): [] for w in args.workers}}
        for _ in range(args.rounds):
            rows["baseline"].append(record(out / "store", command, args.steps, None, out / "s.json"))
            for w in args.workers:
                rows["workers"][str(w)].append(record(out / "store", command, args.steps, w, out / "s.json"))
        results[name] = rows
        (out / "results.json").write_text(json.dumps(results, indent=1))
        print(f"measured {name}", flush=True)
    return results


def rescore(results: dict) -> int:
    errors = []
    print("| scenario | workers | predicted | measured | error |")
    print("|---|--:|--:|--:|--:|")
    for name, rows in results.items():
        base_rate = statistics.median(r["samples_per_s"] for r in rows["baseline"])
        model = analyze(Session.load(rows["baseline"][0]["session"])).capacity.model
        if model is None:
            print(f"| {name} | | (no model) | | |")
            continue
        for w, runs in rows["workers"].items():
            measured = statistics.median(r["samples_per_s"] for r in runs) / base_rate
            predicted = model.rate(workers=int(w)) / model.rate()
            error = predicted / measured - 1
            errors.append(abs(error))
            print(f"| {name} | {model.workers}->{w} | {predicted:.2f}x | {measured:.2f}x | {100 * error:+.0f}% |")
    if errors:
        print(f"\nmedian absolute error {100 * statistics.median(errors):.0f}%, worst {100 * max(errors):.0f}%, "
              f"{len(errors)} predictions")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="folder for the sessions and results.json")
    p.add_argument("--rescore", metavar="OUT", help="re-predict from a finished --out folder; runs nothing")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--only", nargs="*", help="scenario names (prefixes) to run")
    args = p.parse_args()
    if args.rescore:
        return rescore(json.loads((Path(args.rescore) / "results.json").read_text()))
    if not args.out:
        p.error("give --out DIR (or --rescore DIR)")
    return rescore(measure(args))


if __name__ == "__main__":
    sys.exit(main())

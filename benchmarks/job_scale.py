"""A multi-node job's report as the job grows: gathering (each node's note read, every session loaded), merging, the
analysis and the summary, for 2, 8, 32 and 128 ranks; time and peak memory per size, and time per rank.

First a real job is recorded: two launchers on loopback (``torchrun --nnodes 2``, one rank each, gloo,
``tests/scripts/ddp_train.py --barrier``, rank 1 slowed), sharing one store. Larger jobs are those two node sessions
replicated: node i is node i % 2's session with rank i, the world size N, and its clock shifted by i x 1.7 s (so the
merge must find every offset from the job's own synchronizations, as on real nodes). Each size is gathered, merged
and reported in a fresh process (``--one N STORE``), which reads its own peak resident memory (ru_maxrss) at the end.

Run:  python benchmarks/job_scale.py                  (2, 8, 32, 128 ranks)
      python benchmarks/job_scale.py --ranks 2 8      (a quick look)

Measured on the 2-core development VM: see the docs' calibration table (job-scale).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DDP = REPO / "tests" / "scripts" / "ddp_train.py"
SHIFT_NS = 1_700_000_000


def record_two_nodes(folder: Path) -> list[Path]:
    """The two node sessions of a real 2-node job on loopback (one shared store)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "stallscope", "run", "--quiet", "--json", str(folder / f"s{node}.json"),
               "--store", str(folder / "recorded"), "--gather-wait", "0", "--", sys.executable, "-m",
               "torch.distributed.run", "--nnodes", "2", "--node_rank", str(node), "--nproc_per_node", "1",
               "--master_addr", "127.0.0.1", "--master_port", str(port), str(DDP), "--samples", "4096", "--workers", "2", "--barrier",
               "--slow-rank", "1", "--slow-ms", "2"]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
    if any(p.wait(timeout=600) != 0 for p in procs):
        raise SystemExit("the 2-node job failed")
    return [Path(json.loads((folder / f"s{n}.json").read_text())["session"]) for n in (0, 1)]


def replicate(sessions: list[Path], ranks: int, store: Path) -> None:
    """``ranks`` node sessions of one rank each in ``store``, with the gathering notes a shared folder holds."""
    from stallscope.gather.parts import job_folder, part_of
    from stallscope.merge import _shift
    from stallscope.session import RECORD_LISTS, Session

    base = [Session.load(p) for p in sessions]
    for i in range(ranks):
        s = base[i % 2]
        shift = i * SHIFT_NS
        changes = {name: [_shift(r, -shift, {}) for r in getattr(s, name)] for name in RECORD_LISTS}
        changes["ranks"] = [dataclasses.replace(r, rank=i, world_size=ranks) for r in changes["ranks"]]
        node = dataclasses.replace(s, run_id=f"node{i:04d}", start_ns=s.start_ns + shift, end_ns=s.end_ns + shift,
                                   **changes)
        folder = store / "runs" / node.run_id
        folder.mkdir(parents=True)
        path = node.save(folder / "session.json")
        part = part_of(node, path, store)
        assert part is not None
        (job_folder(store, part.job) / f"{node.run_id}.part.json").write_text(json.dumps(dataclasses.asdict(part)))


def one(ranks: int, store: Path) -> dict:
    """Gather, merge and report one replicated job (in its own process)."""
    from stallscope.analysis import analyze
    from stallscope.gather.parts import Part, merge_from_folder
    from stallscope.render.summary import summary_dict

    t0 = time.perf_counter()
    folder = next((store / "jobs").iterdir())
    parts = [Part.from_json(p.read_text()) for p in sorted(folder.glob("*.part.json"))]
    gathered = merge_from_folder(store, folder, parts)
    t1 = time.perf_counter()
    analysis = analyze(gathered.merged)
    t2 = time.perf_counter()
    summary = summary_dict(gathered.merged, analysis, gathered.path)
    t3 = time.perf_counter()
    return {"ranks": ranks, "gather_merge_s": t1 - t0, "analyze_s": t2 - t1, "summary_s": t3 - t2,
            "straggler": (summary["distributed"] or {}).get("straggler", {}).get("rank"),
            "ranks_in_report": len(summary["ranks"]), "job_mb": gathered.path.stat().st_size / 1e6,
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 8, 32, 128])
    p.add_argument("--profile", type=int, metavar="RANKS", help="profile gathering and reporting RANKS ranks")
    p.add_argument("--one", nargs=2, metavar=("RANKS", "STORE"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(one(int(args.one[0]), Path(args.one[1]))))
        return 0
    with tempfile.TemporaryDirectory(prefix="job-scale-") as tmp:
        work = Path(tmp)
        t = time.perf_counter()
        sessions = record_two_nodes(work)
        print(f"recorded a 2-node job in {time.perf_counter() - t:.1f} s: node sessions "
              f"{', '.join(f'{p.stat().st_size / 1e6:.2f} MB' for p in sessions)}")
        print(f"{'ranks':>5} {'gather+merge':>13} {'analyze':>8} {'summary':>8} {'total':>7} {'per rank':>9} "
              f"{'peak MB':>8} {'job MB':>7}  straggler")
        if args.profile:
            import cProfile
            import pstats

            replicate(sessions, args.profile, work / "profiled")
            cProfile.runctx("one(ranks, store)", globals(), {"ranks": args.profile, "store": work / "profiled"},
                            str(work / "prof"))
            pstats.Stats(str(work / "prof")).sort_stats("cumulative").print_stats(35)
            return 0
        for ranks in args.ranks:
            store = work / f"store{ranks}"
            replicate(sessions, ranks, store)
            done = subprocess.run([sys.executable, __file__, "--one", str(ranks), str(store)], capture_output=True,
                                  text=True, check=True)
            row = json.loads(done.stdout.strip().splitlines()[-1])
            total = row["gather_merge_s"] + row["analyze_s"] + row["summary_s"]
            print(f"{ranks:5d} {row['gather_merge_s']:12.2f}s {row['analyze_s']:7.2f}s {row['summary_s']:7.2f}s "
                  f"{total:6.2f}s {1000 * total / ranks:7.0f}ms {row['peak_mb']:8.0f} {row['job_mb']:7.1f}  "
                  f"rank {row['straggler']} ({row['ranks_in_report']} ranks in the report)")
            shutil.rmtree(store)
    return 0


if __name__ == "__main__":
    sys.exit(main())

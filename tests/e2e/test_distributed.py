"""torchrun and torch.multiprocessing.spawn jobs on CPU (gloo): per-rank recording, the sync node,
the straggler, multi-node merge, crashes and ``--steps``."""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from stallscope.analysis import analyze
from stallscope.merge import merge_sessions
from stallscope.session import Session
from tests.conftest import SCRIPTS, free_port, run_cli

pytestmark = pytest.mark.e2e
DDP = str(SCRIPTS / "ddp_train.py")


def torchrun(nproc: int, *args: str, port: int | None = None) -> list[str]:
    """torchrun on this machine; without ``port``, ``--standalone`` lets it take a free port itself
    (a port chosen here could be taken again before torchrun binds it)."""
    where = ["--master_addr", "127.0.0.1", "--master_port", str(port)] if port else ["--standalone"]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), *where, *args]


def _ranks(summary: dict) -> dict[int, dict]:
    return {r["rank"]: r for r in summary["ranks"]}


def test_slow_rank_is_the_straggler_and_stalls_the_other_in_sync(tmp_path):
    result = run_cli(tmp_path, ["--", *torchrun(2, DDP, "--samples", "256", "--slow-rank", "1", "--slow-ms", "5")])
    assert result.returncode == 0, result.stderr[-3000:]
    summary = result.summary
    ranks = _ranks(summary)
    assert sorted(ranks) == [0, 1]
    assert {r["local_rank"] for r in ranks.values()} == {0, 1}
    assert ranks[0]["verdict"] == "sync-bound" and ranks[0]["bottleneck"]["node"] == "sync"
    assert ranks[0]["sync_fraction"] > 0.5
    assert ranks[1]["verdict"] == "input-bound" and ranks[1]["bottleneck"]["node"] == "storage"
    straggler = summary["distributed"]["straggler"]
    assert straggler["rank"] == 1 and straggler["node"] == "storage"
    # the job's top-level keys are the straggler's: it sets the pace
    assert summary["verdict"] == "input-bound" and summary["bottleneck"]["node"] == "storage"
    assert any("rank 1's storage stalls all ranks" in line for line in summary["bottleneck"]["evidence"])
    assert summary["steps"] == 16 and ranks[0]["steps"] == 16


@pytest.mark.speed  # which stage differs is read from the two ranks' measured times
@pytest.mark.parametrize("plant", ["data", "step-code"])
def test_a_straggler_is_named_by_the_stage_it_differs_in(tmp_path, plant):
    """Rank 1 sleeps 2 ms a sample beside a heavier compute (its largest stage is not its data), or runs 20 ms of
    Python metrics a step that rank 0 does not: the straggler's cause is where it differs from rank 0."""
    extra = (["--repeat", "6", "--hidden", "256", "--layers", "4", "--slow-ms", "2"] if plant == "data"
             else ["--slow-code-ms", "20"])
    result = run_cli(tmp_path, ["--", *torchrun(2, DDP, "--samples", "384", "--slow-rank", "1", *extra)])
    assert result.returncode == 0, result.stderr[-3000:]
    summary = result.summary
    straggler = summary["distributed"]["straggler"]
    assert straggler["rank"] == 1, summary["distributed"]
    differs = straggler["differs_s_per_step"]
    if plant == "data":
        assert straggler["node"] == "storage" and straggler["part"] is None, straggler
        assert differs["storage"] > 0.010 > abs(differs["compute"]), differs
        assert summary["verdict"] == "input-bound" and summary["bottleneck"]["node"] == "storage"
        assert any(line.startswith("rank 1 is the straggler") and "storage" in line and "differs from the others"
                   in line for line in summary["bottleneck"]["evidence"]), summary["bottleneck"]["evidence"]
    else:
        assert (straggler["node"], straggler["part"]) == ("compute", "step_code"), straggler
        assert differs["step_code"] > 0.015 > abs(differs["forward"]), differs
        first = summary["recommendations"][0]
        assert first["id"] == "python-in-step" and first["facts"]["file"] == DDP, summary["recommendations"]
        assert first["facts"]["function"] == "_python_metrics"
    assert "straggler: rank 1 (" + ("storage: +" if plant == "data" else "compute, step code: +") in result.stderr


def test_balanced_job_has_no_straggler(tmp_path):
    # 5 ms per sample, 40 ms steps: the straggler threshold (15% of a step) is far above wake-up jitter
    result = run_cli(tmp_path, ["--", *torchrun(2, DDP, "--samples", "256", "--sleep-ms", "5")])
    assert result.returncode == 0, result.stderr[-3000:]
    summary = result.summary
    assert summary["distributed"]["straggler"] is None
    assert all(r["verdict"] != "sync-bound" for r in summary["ranks"])
    assert summary["distributed"]["primary_rank"] == 0


@pytest.mark.parametrize("late_hook", [-1, 3], ids=["default-allreduce", "hook-registered-after-forward"])
def test_recorder_does_not_change_training(tmp_path, late_hook):
    """Losses with and without the recorder (which times DDP's backward) are identical, bit for bit, also
    when the script registers a comm hook of its own after the first forward."""
    plain = tmp_path / "plain"
    env = {k: v for k, v in os.environ.items() if not k.startswith("STALLSCOPE")}
    args = ("--samples", "128", "--hidden", "96", "--late-hook", str(late_hook))
    # The baseline is torch alone, without stallscope: what it is for is its losses, which each rank writes before
    # its closing barrier. Its exit is torch's, not the tool's (once in CI a rank died after writing them, with
    # "terminate called without an active exception": SIGABRT in gloo's threads at exit), so the losses are checked
    # and an odd exit is only said.
    proc = subprocess.run(torchrun(2, DDP, *args, "--losses", str(plain)),
                          env=env, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert all(Path(f"{plain}.{rank}").is_file() for rank in (0, 1)), (proc.returncode, proc.stderr[-3000:])
    if proc.returncode != 0:
        warnings.warn(f"torch alone (no stallscope) exited {proc.returncode} after writing its losses: "
                      f"{proc.stderr[-500:]}", stacklevel=1)
    recorded = tmp_path / "recorded"
    result = run_cli(tmp_path, ["--", *torchrun(2, DDP, *args, "--losses", str(recorded))])
    assert result.returncode == 0, result.stderr[-3000:]
    session = Session.load(result.summary["session"])
    assert any(c.op == "ddp.allreduce" for c in session.collectives)  # the hook was installed
    for rank in (0, 1):
        a = json.loads(Path(f"{plain}.{rank}").read_text())
        b = json.loads(Path(f"{recorded}.{rank}").read_text())
        assert len(a) == 8 and a == b


@pytest.mark.parametrize("dynamic", [False, True], ids=["static-graph", "last-layer-unused-on-odd-steps"])
def test_gradient_wait_matches_ddps_own_timer(tmp_path, dynamic):
    """The sync time of each backward equals what DDP's reducer itself times (last gradient computed to
    all-reduce done, its runtime statistics read every step), with several buckets and a slow rank; and
    with a model whose last layer gets no gradient on odd steps (the recorder's parameter hook misses
    step 1, then it times each graph from its root)."""
    waits = tmp_path / "reducer"
    shape = ("--dynamic",) if dynamic else ("--layers", "5", "--hidden", "256", "--bucket-mb", "0.25")
    result = run_cli(tmp_path, ["--", *torchrun(2, DDP, "--samples", "192", *shape, "--slow-rank", "1",
                                                "--slow-ms", "1", "--reducer-waits", str(waits))])
    assert result.returncode == 0, result.stderr[-3000:]
    session = Session.load(result.summary["session"])
    for rank in session.ranks:
        ours = [c.end_ns - c.start_ns for c in sorted(session.collectives, key=lambda c: c.start_ns)
                if c.pid == rank.pid and c.op == "ddp.allreduce"]
        logged = json.loads(Path(f"{waits}.{rank.rank}").read_text())
        assert len(logged) == 11  # DDP logs a backward at the next forward: all 12 but the last
        theirs = [wait for wait, _ in logged]
        compute = statistics.median(c for _, c in logged)
        if dynamic:
            assert len(ours) == 11  # none for step 1, where the hooked parameter went without a gradient
            theirs = theirs[:1] + theirs[2:]  # ours: steps 0, 2, 3, ...; theirs: steps 0, 1, 2, ...
        else:
            assert len(ours) == 12
        assert all(c.enter_ns < c.start_ns for c in session.collectives if c.op == "ddp.allreduce")
        gaps = [a - b for a, b in zip(ours, theirs)]
        # ours starts a little earlier (our callback runs first) and ends a little later (at the return):
        # tens of microseconds, against the backward compute that a wrong start would add (measured by
        # DDP in the same steps, so a loaded machine slows both); a preemption can lengthen one gap only
        assert all(gap >= 0 for gap in gaps), (rank.rank, gaps)
        assert statistics.median(gaps) < compute / 2, (rank.rank, gaps, compute)
    assert sum(w for w, _ in json.loads(Path(f"{waits}.0").read_text())) > 12 * 1_000_000  # rank 0 waited


def test_steps_limit_ends_every_rank_at_the_same_step(tmp_path):
    result = run_cli(tmp_path, ["--steps", "5", "--", *torchrun(2, DDP, "--samples", "256", "--slow-rank", "1",
                                                                 "--slow-ms", "2")], timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.summary["ended_by"] == "steps"
    assert [r["steps"] for r in result.summary["ranks"]] == [5, 5]


def test_failure_after_the_steps_limit_keeps_exit_code_1(tmp_path):
    result = run_cli(tmp_path, ["--steps", "3", "--", *torchrun(2, DDP, "--samples", "256", "--fail-after-exit")],
                     timeout=120)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "planted failure while stopping" in result.stderr


def test_crashing_rank_keeps_exit_code_and_survivors_data(tmp_path):
    result = run_cli(tmp_path, ["--", *torchrun(2, DDP, "--samples", "256", "--crash-rank", "1",
                                                "--crash-at", "6")], timeout=180)
    assert result.returncode == 1 and result.summary["exit_code"] == 1
    ranks = _ranks(result.summary)
    assert sorted(ranks) == [0, 1]
    assert ranks[0]["steps"] >= 5 and ranks[1]["steps"] >= 5
    assert ranks[1]["failed"].startswith("RuntimeError: planted crash on rank 1")
    # the job's failure is the rank that crashed, not rank 0's lost connection to it
    failed = result.summary["failure"]
    assert (failed["message"], failed["rank"], failed["cause"]) == ("planted crash on rank 1 at step 6", 1, None)
    assert "the script failed in rank 1: RuntimeError: planted crash on rank 1 at step 6" in result.stderr
    session = Session.load(result.summary["session"])
    assert {r.rank for r in session.ranks} == {0, 1}


def test_spawned_ranks_are_recorded(tmp_path):
    port = str(free_port())
    env_cmd = ["env", f"DDP_PORT={port}", sys.executable, DDP, "--spawn", "2", "--samples", "128",
               "--slow-rank", "0", "--slow-ms", "4"]
    result = run_cli(tmp_path, ["--", *env_cmd])
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = _ranks(result.summary)
    assert sorted(ranks) == [0, 1] and all(r["steps"] == 8 for r in ranks.values())
    assert result.summary["distributed"]["straggler"]["rank"] == 0
    session = Session.load(result.summary["session"])
    assert {p.role for p in session.processes} >= {"main", "rank"}


def test_two_nodes_merge_with_aligned_clocks(tmp_path):
    """Two launchers, one per simulated node (torchrun --nnodes 2 over localhost), merged into one job; node 1's
    dataset sleeps 4 ms a sample, so node 0's own summary says the pace is set on another node."""
    port = free_port()
    procs = []
    for node in (0, 1):
        cwd = tmp_path / f"node{node}"
        cwd.mkdir()
        cmd = [sys.executable, "-m", "stallscope", "run", "--quiet", "--json", str(cwd / "s.json"),
               "--store", str(cwd / "store"), "--", sys.executable, "-m", "torch.distributed.run",
               "--nnodes", "2", "--node_rank", str(node), "--nproc_per_node", "1", "--master_addr", "127.0.0.1",
               "--master_port", str(port), DDP, "--samples", "256", "--barrier", "--slow-rank", "1", "--slow-ms", "4"]
        procs.append(subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for proc in procs:
        out, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, out[-3000:]
    sessions = [Session.load(json.loads((tmp_path / f"node{n}" / "s.json").read_text())["session"]) for n in (0, 1)]
    assert [[r.rank for r in s.ranks] for s in sessions] == [[0], [1]]
    assert {r.job for s in sessions for r in s.ranks} == {f"port={port}"}  # what merge checks the nodes share
    own = [json.loads((tmp_path / f"node{n}" / "s.json").read_text())["recommendations"] for n in (0, 1)]
    assert [r["id"] for r in own[0]] == ["wait-for-other-nodes"], own[0]
    assert "wait-for-other-nodes" not in [r["id"] for r in own[1]], own[1]
    # Node 1's clock as if it had booted 7 s later: the merge must find that from the job's own barriers.
    shift = 7_000_000_000
    sessions[1] = _shift_clock(sessions[1], shift)
    merged = merge_sessions([sessions[1], sessions[0]])
    assert [r.rank for r in merged.ranks] == [0, 1]
    node1 = next(a for a in merged.clock_alignment if a["ranks"] == [1])
    assert abs(node1["offset_ns"] - shift) < 5_000_000, node1
    analysis = analyze(merged)
    steps = {r.rank: r for r in analysis.ranks}
    assert steps[0].steps == steps[1].steps == 16
    ends = {rank: [o.end_ns for o in merged.optimizer_steps if o.pid == steps[rank].pid] for rank in (0, 1)}
    # every step ends at a barrier, so aligned timelines end each step within a few ms of each other
    gaps = [abs(a - b) for a, b in zip(ends[0], ends[1])]
    assert statistics.median(gaps) < 5_000_000, gaps
    out = tmp_path / "merged.json"
    cli = subprocess.run([sys.executable, "-m", "stallscope", "merge", *(str(s) for s in _session_paths(tmp_path)),
                          "-o", str(out), "--json", str(tmp_path / "m.json"), "--quiet"],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr[-2000:]
    summary = json.loads((tmp_path / "m.json").read_text())
    assert [r["rank"] for r in summary["ranks"]] == [0, 1]
    assert (summary["distributed"]["straggler"]["rank"], summary["distributed"]["straggler"]["node"]) == (1, "storage")
    assert "wait-for-other-nodes" not in [r["id"] for r in summary["recommendations"]]
    if os.path.exists("/dev/full"):  # the summary cannot be written: its own name is said, not the session's
        full = subprocess.run([sys.executable, "-m", "stallscope", "merge", *(str(s) for s in _session_paths(tmp_path)),
                               "-o", str(tmp_path / "again.json"), "--json", "/dev/full", "--quiet"],
                              capture_output=True, text=True, timeout=120)
        assert full.returncode == 2 and "cannot write /dev/full: No space left on device" in full.stderr, full.stderr


def _session_paths(tmp_path: Path) -> list[Path]:
    return [Path(json.loads((tmp_path / f"node{n}" / "s.json").read_text())["session"]) for n in (0, 1)]


def _shift_clock(session: Session, offset: int) -> Session:
    from stallscope.merge import _shift
    from stallscope.session import RECORD_LISTS

    changes = {name: [_shift(r, -offset, {}) for r in getattr(session, name)] for name in RECORD_LISTS}
    return dataclasses.replace(session, start_ns=session.start_ns + offset, end_ns=session.end_ns + offset, **changes)

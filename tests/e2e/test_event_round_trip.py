"""Events written by the real recorder in a real job, read back by the collector: every field where expected."""

from __future__ import annotations

import socket
import sys

import pytest

from stallscope.launcher import launch
from tests.conftest import SCRIPTS

pytestmark = pytest.mark.e2e


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def test_round_trip_through_the_real_recorder(tmp_path) -> None:
    pytest.importorskip("torch")
    outcome = launch([sys.executable, str(SCRIPTS / "event_round_trip.py"), _free_port()], store=tmp_path,
                     sample_interval_s=0, stdout=open(tmp_path / "out.txt", "w"), stderr=open(tmp_path / "err.txt", "w"))
    s = outcome.session
    assert outcome.exit_code == 1 and "malformed" not in " ".join(s.notes), (tmp_path / "err.txt").read_text()
    main = next(p for p in s.processes if p.role == "main")
    assert main.start_ns is not None and main.exit_ns is not None and main.start_ns < main.exit_ns

    loaders = {ld.loader_id: ld for ld in s.loaders}
    assert sorted(ld.config["num_workers"] for ld in loaders.values()) == [0, 1]
    assert {it.loader_id for it in s.iters} == set(loaders)
    assert all(it.num_workers == loaders[it.loader_id].config["num_workers"] for it in s.iters)
    assert len(s.nexts) == 8 and all(n.batch_size == 4 and n.start_ns <= n.end_ns for n in s.nexts)
    assert {n.loader_id for n in s.nexts} == set(loaders) and len(s.stops) == 2
    fetched = [f for f in s.fetches if f.outcome != "StopIteration"]
    assert len(fetched) == 8 and all(f.items == 4 and f.start_ns <= f.end_ns and f.cpu_ns >= 0 for f in fetched)
    assert {f.worker for f in fetched} == {-1, 0}
    # each fetch's page faults, from its own thread, in the worker and in the training process alike
    assert all(f.minflt >= 0 for f in fetched) if sys.platform == "linux" else all(f.minflt == -1 for f in fetched)
    [start] = s.worker_starts
    assert start.created_ns <= start.entered_ns <= start.ready_ns and start.worker == 0
    assert any(f.pid == start.pid for f in fetched)
    assert len(s.sends) >= 4 and all(send.worker == 0 for send in s.sends)
    [shutdown] = s.shutdowns  # the 1-worker loader's, at the end of its epoch: inside its last next()
    [with_workers] = [i for i, ld in loaders.items() if ld.config["num_workers"] == 1]
    [stop] = [st for st in s.stops if st.loader_id == with_workers]
    assert (shutdown.loader_id, shutdown.num_workers, shutdown.pid) == (with_workers, 1, main.pid)
    assert stop.start_ns <= shutdown.start_ns <= shutdown.end_ns <= stop.end_ns
    assert [info["loader_id"] for info in s.batch_info] == sorted(loaders)
    assert len(s.optimizer_steps) == 8 and {o.kind for o in s.optimizer_steps} == {"SGD"}

    [rank] = s.ranks
    assert (rank.rank, rank.world_size, rank.backend) == (0, 1, "gloo")
    assert rank.init_start_ns <= rank.init_end_ns
    assert [c.op for c in s.collectives] == ["all_reduce"] and s.collectives[0].blocking
    [error] = [e for e in s.errors if e.where == "main"]
    assert (error.type, error.message) == ("ValueError", "planted at the end")
    raise_line = next(i for i, line in enumerate((SCRIPTS / "event_round_trip.py").read_text().splitlines(), 1)
                      if "planted at the end" in line)
    assert error.location.endswith(f"event_round_trip.py:{raise_line}")
    try:
        import lmdb  # noqa: F401
    except ImportError:
        return
    assert [o["pid"] for o in s.lmdb_opens] == [main.pid]


def test_workers_stopped_by_the_loop_are_recorded_and_those_freed_on_another_thread_are_not(tmp_path) -> None:
    pytest.importorskip("torch")
    outcome = launch([sys.executable, str(SCRIPTS / "worker_stops.py")], store=tmp_path, sample_interval_s=0,
                     stdout=open(tmp_path / "out.txt", "w"), stderr=open(tmp_path / "err.txt", "w"))
    s = outcome.session
    assert outcome.exit_code == 0, (tmp_path / "err.txt").read_text()
    first, second = sorted({n.iter_id for n in s.nexts})
    [stop] = s.shutdowns
    assert (stop.iter_id, stop.num_workers) == (first, 1) and stop.start_ns <= stop.end_ns
    assert stop.start_ns >= max(n.end_ns for n in s.nexts if n.iter_id == first)  # after the loop broke out

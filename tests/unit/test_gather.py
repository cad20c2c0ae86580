"""Gathering a job's node sessions: which sessions are parts of a larger job, the notes in a shared store folder, the
merge at the last node, and the exchange over a real TCPStore on loopback; on hand-built node sessions."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import pytest

from stallscope.gather import gather
from stallscope.gather.parts import Part, belongs, covers, part_of
from stallscope.recorder.distributed import store_address
from stallscope.session import Session
from tests.conftest import free_port
from tests.unit.test_ranks import _node

S = 1_000_000_000


def _saved(store: Path, session: Session) -> Path:
    folder = store / "runs" / session.run_id
    folder.mkdir(parents=True)
    return session.save(folder / "session.json")


def _of_job(session: Session, job: str = "port=1234", address: str | None = None) -> Session:
    return dataclasses.replace(session, ranks=[dataclasses.replace(r, job=job, store=address) for r in session.ranks])


def _part(run_id: str, ranks: tuple[int, ...], met: int | None, done: int, job: str = "port=1") -> Part:
    return Part(job, 4, ranks, "h", run_id, f"runs/{run_id}/session.json", met, done, None)


def test_a_session_holding_its_whole_job_or_no_rank_has_nothing_to_gather(tmp_path):
    a, b = _node(100, 0, 0), _node(200, 1, 0)
    whole = dataclasses.replace(a, ranks=a.ranks + b.ranks)
    assert part_of(whole, tmp_path / "s.json", tmp_path) is None
    assert part_of(dataclasses.replace(a, ranks=[]), tmp_path / "s.json", tmp_path) is None
    part = part_of(_of_job(a), tmp_path / "runs" / "n0" / "session.json", tmp_path)
    assert part is not None and (part.ranks, part.world, part.session) == ((0,), 2, "runs/n0/session.json")


def test_a_part_of_an_earlier_job_under_the_same_words_is_not_taken_for_this_ones():
    mine = _part("a", (0, 1), met=1000 * S, done=1100 * S)
    assert belongs(mine, _part("b", (2, 3), met=1000 * S + S // 2, done=1101 * S))
    assert not belongs(mine, _part("b", (2, 3), met=900 * S, done=990 * S))  # ended before this job met
    assert not belongs(mine, _part("b", (2, 3), met=1000 * S - 121 * S, done=1101 * S))  # met minutes apart
    assert not belongs(mine, _part("b", (1, 2), met=1000 * S, done=1101 * S))  # a rank held twice
    assert not belongs(mine, _part("b", (2, 3), met=1000 * S, done=1101 * S, job="port=2"))
    assert not belongs(mine, mine)
    assert covers([mine, _part("b", (2, 3), 0, 0)]) and not covers([mine, _part("b", (3,), 0, 0)])


def test_the_jobs_store_address_is_its_tcp_init_method_else_its_master_variables():
    env = {"MASTER_ADDR": "node0", "MASTER_PORT": "29500"}
    assert store_address(env) == "node0:29500"
    assert store_address(env, "tcp://10.0.0.1:23456") == "10.0.0.1:23456"
    assert store_address(env, "tcp://[fe80::1]:23456?rank=0") == "fe80::1:23456"
    assert store_address(env, "env://") == "node0:29500"
    assert store_address({"MASTER_ADDR": "node0"}) is None and store_address({}, "file:///tmp/x") is None


def test_nodes_sharing_the_store_folder_merge_at_the_last_to_finish(tmp_path):
    first, last = _of_job(_node(100, 0, 0)), _of_job(_node(100, 1, 3 * S))
    first_path, last_path = _saved(tmp_path, first), _saved(tmp_path, last)
    alone = gather(first, first_path, tmp_path, grace_s=0.2)  # no other note yet, and no address to meet at
    assert alone is not None and alone.merged is None and "no MASTER_ADDR" in alone.lines[0]
    done = gather(last, last_path, tmp_path, grace_s=0.2)
    assert done is not None and done.merged is not None and done.missing == []
    assert [r.rank for r in done.merged.ranks] == [0, 1]
    assert done.path == tmp_path / "jobs" / "port=1234" / f"{done.merged.run_id}.session.json"
    assert Session.load(done.path).run_id == done.merged.run_id
    again = gather(last, last_path, tmp_path, grace_s=0.2)  # the job was merged once: a late repeat leaves it
    assert again is not None and again.merged is None and "another node" in again.lines[0]


def test_nodes_apart_hand_their_sessions_over_a_tcpstore_at_the_jobs_address(tmp_path):
    pytest.importorskip("torch.distributed")
    address = f"127.0.0.1:{free_port()}"
    nodes = [_of_job(_node(100, rank, rank * 5 * S), address=address) for rank in (0, 1)]
    stores = [tmp_path / "a", tmp_path / "b"]
    results: dict[int, object] = {}

    def node(i: int) -> None:
        results[i] = gather(nodes[i], _saved(stores[i], nodes[i]), stores[i], wait_s=60, grace_s=0.2)

    threads = [threading.Thread(target=node, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    merged = [r for r in results.values() if r.merged is not None]
    assert len(merged) == 1 and [r.rank for r in merged[0].merged.ranks] == [0, 1] and merged[0].missing == []
    other = next(r for r in results.values() if r.merged is None)
    assert any(str(merged[0].path) in line for line in other.lines), other.lines


def test_a_node_alone_at_the_jobs_address_merges_what_came_and_names_the_rank_that_sent_nothing(tmp_path):
    pytest.importorskip("torch.distributed")
    node = _of_job(_node(100, 0, 0), address=f"127.0.0.1:{free_port()}")
    done = gather(node, _saved(tmp_path, node), tmp_path, wait_s=1.5, grace_s=0.2)
    assert done is not None and done.merged is not None and done.missing == [1]
    assert any("rank 1 of the job's 2 sent no session within" in n for n in done.merged.notes)


def test_a_nodes_history_row_names_its_job_host_and_ranks():
    from stallscope.analysis import analyze
    from stallscope.history.runs import RunRow, row_values
    from stallscope.render.history import history_table, job_cell

    node = _of_job(_node(100, 1, 0))
    row = RunRow(**row_values(node, analyze(node), None, None))
    assert {k: row.environment[k] for k in ("job", "job_ranks", "job_world_size", "job_host")} == {
        "job": "port=1234", "job_ranks": [1], "job_world_size": 2, "job_host": "h1"}
    assert job_cell(row) == "port=1234 h1 rank 1 of 2"
    whole = dataclasses.replace(node, ranks=[*node.ranks, dataclasses.replace(node.ranks[0], rank=0, pid=7)])
    assert job_cell(RunRow(**row_values(whole, analyze(whole), None, None))) == "port=1234 h1 ranks 0-1 of 2"
    alone = RunRow(**row_values(dataclasses.replace(node, ranks=[]), analyze(node), None, None))
    assert job_cell(alone) == "" and "job" not in alone.environment
    headers = [c.header for c in history_table([row, alone]).columns]
    assert headers[:2] == ["run", "job"] and "job" not in [c.header for c in history_table([alone]).columns]


def test_a_node_stopped_by_its_user_or_scheduler_does_not_wait_to_gather(tmp_path):
    node = dataclasses.replace(_of_job(_node(100, 0, 0), address=f"127.0.0.1:{free_port()}"), ended_by="interrupt",
                               exit_code=130)
    done = gather(node, _saved(tmp_path, node), tmp_path, wait_s=60, grace_s=60)
    assert done is not None and done.merged is None and "not gathered" in done.lines[0]
    assert not (tmp_path / "jobs").exists()


def test_torchrun_on_one_node_has_nothing_to_gather_whatever_ranks_its_session_lacks(tmp_path):
    from stallscope.gather import one_node_launch

    py = "/usr/bin/python3"
    assert one_node_launch([py, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "t.py"])
    assert one_node_launch(["torchrun", "--nnodes=1", "--nproc-per-node=4", "t.py"])
    assert one_node_launch(["/opt/bin/torchrun", "--nnodes", "1:1", "t.py"])
    assert not one_node_launch(["torchrun", "--nnodes", "2", "--node_rank", "0", "t.py"])
    assert not one_node_launch([py, "t.py", "--standalone"]) and not one_node_launch([])
    assert not one_node_launch(["torchrun", "--nnodes", "2", "t.py", "--standalone"])  # the script's own option
    node = _of_job(_node(100, 0, 0), address=f"127.0.0.1:{free_port()}")
    alone = dataclasses.replace(node, command=["torchrun", "--standalone", "--nproc_per_node", "2", "t.py"])
    assert gather(alone, _saved(tmp_path, alone), tmp_path, wait_s=60) is None


def test_a_node_hosting_on_the_network_leaves_the_merge_to_a_shared_folder_found_later(tmp_path):
    """Node 0 finishes first, sees no other note within its look at the folder and hosts on the network; node 1
    finishes later in the same store folder, finds node 0's note there and merges: node 0 stops hosting (it does not
    wait out its 60 s), and the job is merged once."""
    pytest.importorskip("torch.distributed")
    address = f"127.0.0.1:{free_port()}"
    first, last = (_of_job(_node(100, rank, rank * S), address=address) for rank in (0, 1))
    first_path, last_path = _saved(tmp_path, first), _saved(tmp_path, last)
    results: dict[str, object] = {}
    hosting = threading.Thread(target=lambda: results.update(
        first=gather(first, first_path, tmp_path, wait_s=60, grace_s=0.2)))
    hosting.start()
    time.sleep(3)  # node 0 is hosting by now
    results["last"] = gather(last, last_path, tmp_path, wait_s=60, grace_s=0.2)
    hosting.join(30)
    assert not hosting.is_alive()
    merged = [r for r in results.values() if r.merged is not None]
    assert len(merged) == 1 and [r.rank for r in merged[0].merged.ranks] == [0, 1]
    assert len(list((tmp_path / "jobs" / "port=1234").glob("*.session.json"))) == 1

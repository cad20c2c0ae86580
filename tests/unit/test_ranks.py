"""Per-rank analysis, the sync node and the straggler, and the merge of node sessions, on hand-built sessions."""

from __future__ import annotations

import dataclasses

import pytest

from stallscope.analysis import analyze
from stallscope.analysis.steps import step_stats
from stallscope.analysis.sync import sync_intervals
from stallscope.merge import MergeError, clock_offset, merge_sessions
from stallscope.session import (
    CollectiveRecord,
    LoaderRecord,
    NextRecord,
    OptimizerStepRecord,
    ProcessRecord,
    RankRecord,
    Session,
)

MS = 1_000_000
CONFIG = {"num_workers": 0, "batch_size": 8, "sampler": "DistributedSampler", "dataset_len": 160}


def _rank_records(pid: int, rank: int, wait_ms: int, work_ms: int, sync_ms: int, steps: int = 10,
                  t0: int = 0, host: str = "a") -> dict[str, list]:
    """One rank: per step a data wait, own work (the last 4 ms of it ``backward``), then the end of
    ``backward`` waits ``sync_ms`` more for DDP's all-reduce (recorded from the last gradient, 2 ms earlier)."""
    nexts, opts, colls = [], [], []
    t = t0
    for i in range(steps):
        nexts.append(NextRecord(0, 0, 0, t, t + wait_ms * MS, -1, 8, pid))
        t += (wait_ms + work_ms) * MS
        colls.append(CollectiveRecord("ddp.allreduce", -1, t - 2 * MS, t + sync_ms * MS, pid, enter_ns=t - 4 * MS))
        t += sync_ms * MS
        opts.append(OptimizerStepRecord(1, "SGD", t, t + MS, pid))
        t += MS
    return {"nexts": nexts, "optimizer_steps": opts, "collectives": colls,
            "loaders": [LoaderRecord(0, pid, t0, "train.py:1", dict(CONFIG), {})],
            "processes": [ProcessRecord(pid, 1, "rank", [], 0, t0)],
            "ranks": [RankRecord(pid, rank, rank, 2, 0, host, "gloo", t0 - 5 * MS, t0 - MS)]}


def _session(*ranks: dict[str, list], **kw) -> Session:
    lists: dict[str, list] = {}
    for r in ranks:
        for k, v in r.items():
            lists.setdefault(k, []).extend(v)
    for k in ("nexts", "optimizer_steps", "collectives"):
        lists[k].sort(key=lambda r: r.start_ns)
    return Session("stallscope.session/1", kw.get("run_id", "r"), ["torchrun"], "/", 0.0, 0, 10**12, 0, "exit", {},
                   None, {"cpus_affinity": 8}, **lists)


def test_ddp_wait_is_sync_and_comes_out_of_compute():
    s = _session(_rank_records(100, 0, wait_ms=1, work_ms=5, sync_ms=40))
    stats = step_stats(s, 100)
    assert [st.sync_ns for st in stats.steps] == [42 * MS] * 10  # from the last gradient to the return
    assert stats.steady[0].compute_ns == (1 + 5 + 40 + 1 - 1 - 42) * MS


def test_merge_takes_a_backward_as_entered_at_its_start():
    """A rank may hand its first buckets over as soon as ``backward`` starts, so that is its entry."""
    from stallscope.merge import sync_points

    s = _session(_rank_records(100, 0, wait_ms=1, work_ms=5, sync_ms=40, steps=2))
    ddp = sorted((k[2], v) for k, v in sync_points(s).items() if k[1] == "ddp")
    assert ddp == [(0, (2 * MS, 46 * MS)), (1, (49 * MS, 93 * MS))]


def test_bucket_groups_split_at_a_repeated_bucket_index():
    """Sessions of earlier versions: one record per DDP bucket."""
    colls = [CollectiveRecord("ddp.allreduce", -1, a * MS, b * MS, 7, blocking=False, bucket=k)
             for a, b, k in [(0, 3, 1), (2, 5, 0), (10, 11, 1), (12, 20, 0)]]
    s = _session({"collectives": colls, "nexts": [], "optimizer_steps": []})
    assert sync_intervals(s, 7) == [(2 * MS, 5 * MS), (12 * MS, 20 * MS)]


def test_straggler_named_with_its_stage_and_job_keys_are_its_own():
    fast = _rank_records(100, 0, wait_ms=1, work_ms=5, sync_ms=40)
    slow = _rank_records(200, 1, wait_ms=41, work_ms=5, sync_ms=0)
    a = analyze(_session(fast, slow))
    by_rank = {r.rank: r for r in a.ranks}
    assert by_rank[0].verdict == "sync-bound" and by_rank[0].bottleneck_node == "sync"
    assert by_rank[1].verdict == "input-bound"
    assert a.distributed.straggler_rank == 1 and a.distributed.primary_rank == 1
    assert a.distributed.straggler_stage == by_rank[1].bottleneck_node == "loader"
    assert a.verdict == "input-bound"
    assert a.distributed.skew_median_s == pytest.approx(0.040, abs=0.002)


def test_a_straggler_slow_for_its_data_is_named_by_its_data_not_its_largest_stage():
    """Rank 1 waits 12 ms a step for data where rank 0 waits 1 ms; both compute 30 ms: compute is rank 1's largest
    stage, its data wait (28%) is under the input-bound mark, and the data is why the job waits for it."""
    from stallscope.render import words

    a = analyze(_session(_rank_records(100, 0, wait_ms=1, work_ms=30, sync_ms=12),
                         _rank_records(200, 1, wait_ms=12, work_ms=30, sync_ms=0)))
    d = a.distributed
    assert d.straggler_rank == 1 and d.straggler_limit == "compute" and d.straggler_verdict == "balanced"
    assert d.straggler_stage == "loader" and d.straggler_differs_s["loader"] == pytest.approx(0.011, abs=1e-4)
    assert d.straggler_differs_s["compute"] == pytest.approx(0.0, abs=1e-4)
    assert (a.verdict, a.bottleneck_node) == ("input-bound", "loader")  # the job is analysed for the straggler's data
    said = words.evidence(a)
    assert any("it differs from the others in loader: +11.0 ms a step (data wait 28% of its step time, 2% on the "
               "others)" in line for line in said), said
    assert words.straggler_short(d) == "loader: +11.0 ms a step over the others"


def test_a_straggler_slow_in_one_part_of_its_step_is_named_with_the_part():
    from stallscope.analysis.ranks import RankSummary, straggler_cause

    def rank(n: int, compute: float, parts: dict[str, float]) -> RankSummary:
        nodes = {"storage": 0.0, "decode": 0.0, "transform": 0.1, "loader": 0.1, "transfer": 0.0,
                 "compute": compute, "sync": 0.5 if n == 0 else 0.0}
        return RankSummary(n, n, 0, "a", 100 + n, 3, "compute-bound", "compute", 0.8, 0.1, 0.1, 10, 1.0, None, None,
                           None, nodes, 0, None, None, None, steady_steps=10, parts_s=parts)

    parts = {"forward": 1.0, "backward": 2.0, "optimizer": 0.2, "step_code": 0.3}
    slow = rank(2, 4.0, {**parts, "step_code": 0.8})
    stage, part, differs = straggler_cause(slow, [rank(0, 3.5, parts), rank(1, 3.5, parts)])
    assert (stage, part) == ("compute", "step_code")
    assert differs["compute"] == pytest.approx(0.05) and differs["step_code"] == pytest.approx(0.05)
    assert "sync" not in differs  # the others' wait for it is not own time


def test_a_straggler_fix_is_held_to_the_job_pace():
    """Fixing the straggler makes the job at most as fast as the next slowest rank's own work."""
    from stallscope.analysis.findings import Recommendation
    from stallscope.analysis.job import _straggler_analysis
    from stallscope.render import words

    session = _session(_rank_records(100, 0, wait_ms=1, work_ms=30, sync_ms=12),
                       _rank_records(200, 1, wait_ms=12, work_ms=30, sync_ms=0))
    a = analyze(session)
    fix = Recommendation("pack-dataset", "storage", 3.0, facts={"blocked_s": 0.4, "share": 0.3})
    straggler = next(r for r in session.ranks if r.rank == 1)
    held = _straggler_analysis(session, straggler, dataclasses.replace(a, recommendations=[fix]), a.distributed,
                               a.ranks, 8).recommendations[0]
    ceiling = 0.043 / 0.030  # rank 1's step against rank 0's own work
    assert held.predicted_speedup == pytest.approx(ceiling, abs=0.01)
    assert held.facts["pace_rank"] == 0 and held.facts["rank_speedup"] == 3.0
    assert "on this rank alone 3.00x, but the job then runs at rank 0's pace: at most 1.43x" in \
        words.recommendation(held).reason


def test_one_nodes_session_that_waits_for_the_others_says_the_pace_is_set_elsewhere():
    """Rank 0 of 2, recorded alone (its node's session), waits 40 ms of a 47 ms step for rank 1."""
    from stallscope.render import words

    waiting = analyze(_session(_rank_records(100, 0, wait_ms=1, work_ms=5, sync_ms=40)))
    assert [r.id for r in waiting.recommendations] == ["wait-for-other-nodes"]
    facts = waiting.recommendations[0].facts
    assert (facts["world_size"], facts["ranks_here"]) == (2, [0]) and facts["sync_share"] > 0.8
    said = words.recommendation(waiting.recommendations[0])
    assert said.reason.startswith("rank 0 of the job's 2 is recorded here, and it waits for the others 89% of the step")
    assert "stallscope merge" in said.change
    # a node whose own work sets the pace (little sync) keeps its own advice
    busy = analyze(_session(_rank_records(100, 1, wait_ms=30, work_ms=5, sync_ms=1)))
    assert "wait-for-other-nodes" not in [r.id for r in busy.recommendations]


def test_balanced_ranks_have_no_straggler():
    a = analyze(_session(_rank_records(100, 0, 1, 20, 1), _rank_records(200, 1, 1, 20, 1)))
    assert a.distributed.straggler_rank is None and a.distributed.primary_rank == 0
    assert {r.verdict for r in a.ranks} == {"compute-bound"}
    assert "sync_share" not in a.recommendations[0].facts  # the compute is the larger part: the usual words


def test_ranks_that_all_wait_for_their_all_reduce_are_told_the_sync_sets_the_pace():
    from stallscope.render import words

    a = analyze(_session(_rank_records(100, 0, 1, 5, 20), _rank_records(200, 1, 1, 5, 20)))
    assert a.distributed.straggler_rank is None
    first = a.recommendations[0]
    assert first.id == "no-input-fix" and first.facts["sync_share"] > 0.7
    said = words.recommendation(first)
    assert said.title == "No input-side fix needed: the ranks' gradient sync sets the pace"
    assert "no_sync()" in said.change


def test_sharding_and_workers_per_node_recommendations():
    a0, a1 = _rank_records(100, 0, 1, 20, 1), _rank_records(200, 1, 1, 20, 1, steps=8)
    for rec in (a0, a1):
        rec["loaders"] = [dataclasses.replace(ld, config={**CONFIG, "sampler": "RandomSampler", "num_workers": 4})
                          for ld in rec["loaders"]]
    ids = [r.id for r in analyze(_session(a0, a1)).recommendations]
    assert {"distributed-sampler", "uneven-shards", "workers-per-node"} <= set(ids)


def test_single_process_sessions_are_unchanged():
    s = _session(_rank_records(100, 0, 1, 20, 0))
    s = dataclasses.replace(s, ranks=[], collectives=[], processes=[ProcessRecord(100, 1, "main", [], 0, 0)])
    a = analyze(s)
    assert a.ranks == [] and a.distributed is None and a.node_seconds["sync"] == 0.0


def test_old_sessions_without_rank_fields_load():
    data = _session(_rank_records(100, 0, 1, 20, 0)).to_dict()
    for key in ("ranks", "collectives", "clock_alignment"):
        del data[key]
    for proc in data["processes"]:
        del proc["owner"]
    s = Session.from_dict(data)
    assert s.ranks == [] and s.processes[0].owner is None


def test_main_pid_is_lowest_rank_when_launcher_child_is_an_agent():
    s = _session(_rank_records(100, 1, 1, 5, 0), _rank_records(200, 0, 1, 5, 0))
    s = dataclasses.replace(s, processes=[ProcessRecord(50, 1, "main", [], 0, 0), *s.processes])
    assert s.main_pid == 200


def _node(pid: int, rank: int, clock: int) -> Session:
    """A node whose clock reads ``clock`` ns more than true time; every rank leaves init at true 1000 ms."""
    rec = _rank_records(pid, rank, 1, 5, 2, t0=1_000 * MS + clock, host=f"h{rank}")
    rec["ranks"] = [RankRecord(pid, rank, 0, 2, rank, f"h{rank}", "gloo", 900 * MS + rank * 50 * MS + clock,
                               1_000 * MS + rank * MS // 2 + clock)]
    return _session(rec, run_id=f"n{rank}")


def test_merge_recovers_node_clock_offset_from_the_rendezvous():
    a, b = _node(100, 0, 0), _node(100, 1, 3_000 * MS)
    offset, low, high = clock_offset(a, b)
    assert low <= 3_000 * MS <= high and abs(offset - 3_000 * MS) < 2 * MS
    merged = merge_sessions([b, a])
    assert [r.rank for r in merged.ranks] == [0, 1]
    assert len({r.pid for r in merged.ranks}) == 2  # the same pid on two nodes is renumbered
    ends = sorted(o.end_ns for o in merged.optimizer_steps)
    assert abs(ends[0] - ends[1]) < 2 * MS
    assert merged.clock_alignment[1]["offset_ns"] == offset


def test_merge_keeps_every_nodes_compute_facts_and_profiler_window_on_the_reference_clock():
    a, b = _node(100, 0, 0), _node(100, 1, 3_000 * MS)
    a.compute_facts.append({"pid": 100, "kind": "optimizer", "t_ns": 5 * MS, "tensors": 4})
    b.compute_facts.append({"pid": 100, "kind": "optimizer", "t_ns": 3_005 * MS, "tensors": 4})
    b.op_windows.append({"pid": 100, "start_ns": 3_010 * MS, "opened_ns": 3_011 * MS, "stop_ns": 3_020 * MS,
                         "end_ns": 3_021 * MS, "steps": 5, "folded": True, "ops": []})
    merged = merge_sessions([a, b])
    offset = merged.clock_alignment[1]["offset_ns"]
    assert len(merged.compute_facts) == 2 and len(merged.op_windows) == 1
    window = merged.op_windows[0]
    assert window["start_ns"] == 3_010 * MS - offset and window["end_ns"] == 3_021 * MS - offset
    node_b = {r.pid for r in merged.ranks if r.rank == 1}
    assert window["pid"] in node_b and merged.compute_facts[1]["pid"] in node_b
    assert b.op_windows[0]["start_ns"] == 3_010 * MS  # the node's own session is left as it was


def test_merge_keeps_every_nodes_windows_and_folded_spans_on_the_reference_clock():
    """Long runs fold per node (folding.py): the job's session keeps each node's window rows and folded spans,
    shifted and renumbered as its records are."""
    a, b = _node(100, 0, 0), _node(100, 1, 3_000 * MS)
    for node, shift in ((a, 0), (b, 3_000 * MS)):
        node.windows.append({"pid": 100, "start_ns": shift + 10 * MS, "end_ns": shift + 20 * MS, "steps": 7})
        node.recording.update({"window_ns": 10 * MS, "folded": [[shift + 12 * MS, shift + 14 * MS]],
                               "kept_windows": {"leading": 1}, "folded_counts": {"100": [3, 3, 0, 0, 0]}})
    merged = merge_sessions([a, b])
    offset = merged.clock_alignment[1]["offset_ns"]
    node_b = next(r.pid for r in merged.ranks if r.rank == 1)
    assert sorted(w["pid"] for w in merged.windows) == sorted([100, node_b])
    assert {w["start_ns"] for w in merged.windows if w["pid"] == node_b} == {3_010 * MS - offset}
    assert merged.recording["folded"] == sorted([[12 * MS, 14 * MS], [3_012 * MS - offset, 3_014 * MS - offset]])
    assert merged.recording["kept_windows"] == {"leading": 2}
    assert set(merged.recording["folded_counts"]) == {"100", str(node_b)}


def test_merge_refuses_the_nodes_of_different_jobs():
    """Two runs of a job recorded one after the other share no rendezvous: merged, they made a 'clock offset' of
    minutes and a straggler that was not one."""
    from stallscope.job_names import job_identity

    def node(rank: int, world: int = 2, job: str | None = None, wall_s: float = 1e9) -> Session:
        s = _node(100 + rank, rank, 0)
        ranks = [dataclasses.replace(r, world_size=world, job=job) for r in s.ranks]
        processes = [dataclasses.replace(p, wall_ns=int(wall_s * 1e9), mono_ns=0) for p in s.processes]
        return dataclasses.replace(s, ranks=ranks, processes=processes)

    assert merge_sessions([node(0, job="run=a port=29500"), node(1, job="port=29500", wall_s=1e9 + 0.5)]).ranks
    with pytest.raises(MergeError, match="a job of 2 ranks and n1 one of 3"):
        merge_sessions([node(0), node(1, world=3)])
    with pytest.raises(MergeError, match=r"different jobs to their launchers \(port 29500 against 41733\)"):
        merge_sessions([node(0, job="port=29500"), node(1, job="port=41733")])
    with pytest.raises(MergeError, match="left their rendezvous 723 s apart"):
        merge_sessions([node(0), node(1, wall_s=1e9 + 723)])
    assert job_identity({"TORCHELASTIC_RUN_ID": "none", "MASTER_PORT": "29500", "SLURM_JOB_ID": "77"}) == \
        "slurm=77 port=29500"
    assert job_identity({}) is None


def test_merge_refuses_overlapping_ranks():
    with pytest.raises(MergeError):
        merge_sessions([_node(100, 0, 0), _node(200, 0, 0)])


def test_reports_show_every_rank():
    from stallscope.history.compare import compare
    from stallscope.render import html, trace
    from stallscope.render.markdown import render_compare
    from stallscope.history.runs import row_from_session

    session = _session(_rank_records(100, 0, wait_ms=1, work_ms=5, sync_ms=40),
                       _rank_records(200, 1, wait_ms=41, work_ms=5, sync_ms=0))
    analysis = analyze(session)
    events = trace.render(session, analysis)["traceEvents"]
    names = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert any("rank 1 (pid 200" in n for n in names) and any("rank 0)" in n for n in names)
    assert {e["name"] for e in events if e.get("cat") == "sync"} >= {"ddp.allreduce"}
    page = html.render(session, analysis, plotly_js="")
    assert "<h3>Ranks</h3>" in page and "straggler: <b>rank 1</b>" in page
    balanced = _session(_rank_records(100, 0, wait_ms=1, work_ms=5, sync_ms=2),
                        _rank_records(200, 1, wait_ms=1, work_ms=5, sync_ms=2), run_id="b")
    rows = [row_from_session(s, analyze(s), None) for s in (session, balanced)]
    text = render_compare(compare(rows))
    assert "rank 1 data-wait share" in text and "rank 0 sync share" in text


def _cpus_check(affinity: int, quota: float | None) -> dict:
    return {"id": "cpu.usable", "status": "ok", "data": {"usable": max(1, int(min(affinity, quota or affinity))),
                                                         "affinity": affinity, "quota_cpus": quota}}


def test_a_straggler_on_a_node_with_fewer_cpus_is_named_by_them_with_the_jobs_gain():
    """Rank 1's node allows half a CPU (a cgroup quota), rank 0's one: rank 1's own work is 20 ms a step against 6
    on rank 0, which waits 15 ms for it. Its CPUs are the cause; with the others' CPUs its own work would take half
    as long, and the job's step would be the longer of that and rank 0's own work, plus rank 1's own collective wait."""
    fast = _session(_rank_records(100, 0, wait_ms=1, work_ms=5, sync_ms=15), run_id="n0")
    slow = _session(_rank_records(200, 1, wait_ms=1, work_ms=19, sync_ms=1), run_id="n1")
    fast = dataclasses.replace(fast, checks=[_cpus_check(1, None)])
    slow = dataclasses.replace(slow, checks=[_cpus_check(1, 0.5)])
    merged = merge_sessions([fast, slow])
    assert [(n["usable_cpus"], n["cpus"]) for n in merged.clock_alignment] == [(1, 1.0), (1, 0.5)]
    a = analyze(merged)
    d = a.distributed
    assert d.straggler_rank == 1 and d.straggler_cpus == {"rank": 0.5, "others": 1.0}
    first = a.recommendations[0]
    assert first.id == "straggler-cpus" and first.facts["cpus"] == 0.5 and first.facts["others_cpus"] == 1.0
    slow_rank = next(r for r in a.ranks if r.rank == 1)
    fast_own = next(r for r in a.ranks if r.rank == 0).own_step_s
    sync = slow_rank.median_step_s - slow_rank.own_step_s
    expected = slow_rank.median_step_s / (max(slow_rank.own_step_s / 2, fast_own) + sync)
    assert first.predicted_speedup == pytest.approx(expected, abs=0.01) and first.predicted_speedup > 1.5
    # the same job on nodes of equal CPUs: the straggler is named by its stage alone
    even = analyze(merge_sessions([fast, dataclasses.replace(slow, checks=[_cpus_check(1, None)])]))
    assert even.distributed.straggler_rank == 1 and even.distributed.straggler_cpus is None
    assert "straggler-cpus" not in [r.id for r in even.recommendations]


def _turns(pid: int, rank: int, works_ms: list[int], step_ms: int = 20) -> dict[str, list]:
    """A rank whose own work a step is ``works_ms[i]`` and which waits in DDP's all-reduce for the rest of a
    ``step_ms`` step (the slowest rank's pace)."""
    nexts, opts, colls = [], [], []
    t = 0
    for work in works_ms:
        nexts.append(NextRecord(0, 0, 0, t, t + MS, -1, 8, pid))
        end_work = t + (1 + work) * MS
        colls.append(CollectiveRecord("ddp.allreduce", -1, end_work - 2 * MS, t + (step_ms - 1) * MS, pid,
                                      enter_ns=end_work - 4 * MS))
        opts.append(OptimizerStepRecord(1, "SGD", t + (step_ms - 1) * MS, t + step_ms * MS, pid))
        t += step_ms * MS
    return {"nexts": nexts, "optimizer_steps": opts, "collectives": colls,
            "loaders": [LoaderRecord(0, pid, 0, "train.py:1", dict(CONFIG), {})],
            "processes": [ProcessRecord(pid, 1, "rank", [], 0, 0)],
            "ranks": [RankRecord(pid, rank, rank, 2, 0, "a", "gloo", -5 * MS, -MS)]}


def test_a_slowest_rank_that_moves_from_step_to_step_is_said_as_uneven_work_not_a_slow_node():
    from stallscope.render import words

    steps = 20
    moving = analyze(_session(_turns(100, 0, [17 if i % 2 else 4 for i in range(steps)]),
                              _turns(200, 1, [4 if i % 2 else 17 for i in range(steps)])))
    d = moving.distributed
    assert d.slowest_moves and set(d.slowest_share) == {0, 1} and max(d.slowest_share.values()) < 0.6
    assert any("the slowest rank moves from step to step" in line for line in words.evidence(moving))
    steady = analyze(_session(_turns(100, 0, [4] * steps), _turns(200, 1, [17] * steps)))
    assert not steady.distributed.slowest_moves and steady.distributed.slowest_share[1] == 1.0
    assert steady.distributed.straggler_rank == 1


def test_a_merged_job_of_nodes_with_several_ranks_has_a_row_per_node():
    import io

    from rich.console import Console

    from stallscope.render import terminal
    from stallscope.render.summary import summary_dict

    def node(run_id: str, host: str, ranks: list[tuple[int, int, int]]) -> Session:
        recs = []
        for pid, rank, wait in ranks:
            rec = _rank_records(pid, rank, wait_ms=wait, work_ms=5, sync_ms=40 - wait, host=host)
            rec["ranks"] = [dataclasses.replace(r, world_size=4) for r in rec["ranks"]]
            recs.append(rec)
        return dataclasses.replace(_session(*recs, run_id=run_id), checks=[_cpus_check(8, None)])

    merged = merge_sessions([node("n0", "h0", [(100, 0, 1), (101, 1, 1)]),
                             node("n1", "h1", [(100, 2, 30), (101, 3, 1)])])
    a = analyze(merged)
    rows = a.distributed.nodes
    assert [(r["host"], r["ranks"], r["cpus"]) for r in rows] == [("h0", [0, 1], 8.0), ("h1", [2, 3], 8.0)]
    assert rows[1]["data_wait_fraction"] > rows[0]["data_wait_fraction"]
    assert summary_dict(merged, a, None)["distributed"]["nodes"] == rows
    out = io.StringIO()
    terminal.render(merged, a, Console(file=out, width=140))
    table = out.getvalue()
    assert "node  host  ranks  CPUs" in table and "h1    2-3" in table

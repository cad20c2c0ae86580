"""Which process is the training process (``Session.main_pid``), what the analysis says of it, how ``collect`` tells a
forked child from the script, and the launcher's check that the run's events folder is the one it made: on
hand-built sessions and real event files."""

from __future__ import annotations

import json

from stallscope import launcher
from stallscope.analysis import analyze
from stallscope.analysis.training_process import training_process
from stallscope.collect import build_session
from stallscope.render import words
from stallscope.session import (
    ErrorRecord,
    LoaderRecord,
    NextRecord,
    OptimizerStepRecord,
    ProcessRecord,
    Session,
    WorkerStartRecord,
)

MS = 1_000_000
CONFIG = {"num_workers": 0, "batch_size": 8, "dataset_len": 800}


def _training(pid: int, steps: int, optimizers: int = 1, t0: int = 0, loader_id: int = 0) -> dict[str, list]:
    """``steps`` batches of process ``pid``, each followed by ``optimizers`` optimizer steps (a GAN: 2)."""
    nexts, opts = [], []
    t = t0
    for _ in range(steps):
        nexts.append(NextRecord(loader_id, 0, 0, t, t + MS, -1, 8, pid))
        t += 3 * MS
        for k in range(optimizers):
            opts.append(OptimizerStepRecord(k, "SGD", t, t + MS // 10, pid))
            t += MS
    return {"nexts": nexts, "optimizer_steps": opts, "loaders": [LoaderRecord(loader_id, pid, t0, "train.py:9",
                                                                              dict(CONFIG), {})]}


def _session(processes: list[ProcessRecord], *parts: dict[str, list], **extra) -> Session:
    lists: dict[str, list] = {"processes": processes}
    for part in parts:
        for key, values in part.items():
            lists.setdefault(key, []).extend(values)
    for key in ("nexts", "optimizer_steps"):
        lists.setdefault(key, []).sort(key=lambda r: r.start_ns)
    return Session("stallscope.session/1", "r", ["python", "wrapper.py"], "/", 0.0, 0, 10**12, 0, "exit", {}, None,
                   {"cpus_affinity": 4}, **lists, **extra)


LAUNCHED = ProcessRecord(10, 1, "main", ["wrapper.py"], 0, 0)
CHILD = ProcessRecord(11, 10, "child", ["train.py", "--lr", "0.1"], 0, 0)


def test_the_process_that_made_the_optimizer_steps_is_the_training_process():
    s = _session([LAUNCHED, CHILD], _training(11, 30))
    assert s.launched_pid == 10 and s.main_pid == 11
    tp = training_process(s)
    assert (tp.pid, tp.launched, tp.depth, tp.steps, tp.others) == (11, False, 1, 30, [])
    assert tp.argv == ["train.py", "--lr", "0.1"]


def test_a_dataloader_worker_is_never_the_training_process():
    """A worker that iterates a DataLoader of its own inside a fetch and even steps an optimizer is still a worker."""
    worker = ProcessRecord(12, 10, "worker", ["wrapper.py"], 0, 0)
    started = WorkerStartRecord(0, 0, 0, 13, 0, 0, 0, {})  # a worker known only from its start record
    s = _session([LAUNCHED, worker, ProcessRecord(13, 10, "child", [], 0, 0)],
                 _training(10, 5), _training(12, 50, t0=10**9), _training(13, 50, t0=2 * 10**9),
                 worker_starts=[started])
    assert s.main_pid == 10
    assert training_process(s).others == []


def test_two_optimizers_on_one_batch_are_one_step_and_the_most_steps_wins():
    """A GAN's launched process steps two optimizers per batch (40 optimizer calls, 20 steps); a child made 30 steps."""
    s = _session([LAUNCHED, CHILD], _training(10, 20, optimizers=2), _training(11, 30, t0=10**9))
    assert s.training_counts == {10: (20, 20), 11: (30, 30)}
    assert s.main_pid == 11
    tp = training_process(s)
    assert [(o.pid, o.steps) for o in tp.others] == [(10, 20)] and tp.launched_pid == 10


def test_on_a_tie_the_launched_process_is_the_training_process_and_without_any_step_the_most_batches():
    s = _session([CHILD, LAUNCHED], _training(10, 12), _training(11, 12, t0=10**9))
    assert s.main_pid == 10
    evaluation = _training(11, 40, t0=10**9)
    evaluation["optimizer_steps"] = []
    s = _session([LAUNCHED, CHILD], evaluation, {**_training(10, 5), "optimizer_steps": []})
    assert s.main_pid == 11 and training_process(s).others[0].batches == 5
    assert _session([LAUNCHED, CHILD]).main_pid == 10  # nobody took a batch


def test_a_session_recorded_before_forked_children_were_told_apart_keeps_the_launched_process():
    """Then a forked child said ``main`` too: the launched process is the one whose parent recorded nothing."""
    forked = ProcessRecord(11, 10, "main", ["wrapper.py"], 0, 0)
    s = _session([forked, LAUNCHED], _training(11, 8))
    assert s.launched_pid == 10 and s.main_pid == 11


def test_depth_follows_processes_that_recorded_nothing_through_the_system_samples():
    """wrapper.py -> sh -c (no events) -> train.py: the shell's parent comes from the sampler's process tree."""
    grandchild = ProcessRecord(12, 99, "child", ["train.py"], 0, 0)
    samples = {"t_ns": [0], "processes": {"99": {"ppid": 10, "name": "sh", "first": 0, "ticks": [0],
                                                 "cpu_s": [0.0], "rss_bytes": [1]}}}
    s = _session([LAUNCHED, grandchild], _training(12, 10), system_samples=samples)
    assert training_process(s).depth == 2
    assert training_process(_session([LAUNCHED, grandchild], _training(12, 10))).depth is None


def test_the_analysis_and_its_words_say_which_process_trained():
    s = _session([LAUNCHED, CHILD], _training(11, 30), _training(10, 4, t0=10**9, loader_id=1))
    analysis = analyze(s)
    assert analysis.steps.steps and len(analysis.steps.steps) == 30
    said = words.training_process(analysis.training_process)
    assert said[0].startswith("training ran in process 11 (python train.py --lr 0.1), which the script started")
    assert said[1].startswith("the script's own process 10 (python wrapper.py) also trained (4 steps)")
    alone = analyze(_session([LAUNCHED], _training(10, 30)))
    assert alone.training_process.launched and words.training_process(alone.training_process) == []


def test_a_distributed_job_keeps_its_ranks_and_names_no_training_process():
    from stallscope.session import RankRecord

    ranks = [ProcessRecord(20, 10, "rank", [], 0, 0), ProcessRecord(21, 10, "rank", [], 0, 0)]
    s = _session([LAUNCHED, *ranks], _training(21, 40), _training(20, 10, t0=10**9),
                 ranks=[RankRecord(20, 0, 0, 2, 0, "h"), RankRecord(21, 1, 1, 2, 0, "h")])
    assert s.main_pid == 20  # the lowest rank, as before, whatever its steps
    assert training_process(s) is None


def _write(events, pid: int, ppid: int, role: str, records: list) -> None:
    events.mkdir(parents=True, exist_ok=True)
    header = {"pid": pid, "ppid": ppid, "role": role, "argv": [f"p{pid}.py"], "wall_ns": 0, "mono_ns": 0}
    (events / f"{pid}.jsonl").write_text("\n".join(json.dumps(line) for line in [{"header": header}, *records]) + "\n")


def _meta() -> dict:
    return {"run_id": "r1", "command": ["python", "w.py"], "cwd": "/", "started_wall": 1.0, "start_ns": 0,
            "end_ns": 5_000_000_000, "exit_code": 0, "ended_by": "exit"}


def _trained(n: int) -> list:
    records = [["loader", 0, 5, "t.py:3", {"num_workers": 0}, {}]]
    for i in range(n):
        records += [["next", 0, 0, 0, 100 + 10 * i, 105 + 10 * i, -1, 4], ["opt", 1, "SGD", 106 + 10 * i, 107 + 10 * i]]
    return records


def test_collect_tells_a_forked_child_from_the_script_and_says_only_the_script_was_killed(tmp_path):
    """A child forked by the script inherits its ``main`` header; ended by os._exit it records its exit."""
    events = tmp_path / "events"
    _write(events, 10, 1, "main", [["process_start", 1, ["w.py"]], ["process_exit", 900, None]])
    _write(events, 11, 10, "main", [*_trained(6), ["process_exit", 800, 0]])
    session = build_session(tmp_path, _meta())
    assert {p.pid: p.role for p in session.processes} == {10: "main", 11: "child"}
    assert session.main_pid == 11
    assert not any("ended without writing out" in note for note in session.notes), session.notes


def test_collect_says_a_training_child_that_was_killed_outright(tmp_path):
    events = tmp_path / "events"
    _write(events, 10, 1, "main", [["process_start", 1, ["w.py"]], ["process_exit", 900, None]])
    _write(events, 11, 10, "child", [["process_start", 2, ["t.py"]], *_trained(6)])  # no exit: SIGKILL, OOM
    _write(events, 12, 10, "child", [["process_start", 3, ["helper.py"]]])  # killed too, but it did not train
    session = build_session(tmp_path, _meta())
    said = [note for note in session.notes if "ended without writing out" in note]
    assert said == [("the training process 11 ended without writing out its last events (killed outright, like "
                     "SIGKILL or the OOM killer): up to its last 0.5 s may be missing")]


def test_an_events_folder_made_anew_after_the_runs_was_removed_is_said_to_have_vanished(tmp_path):
    events = tmp_path / "run" / "events"
    events.mkdir(parents=True)
    marked = launcher._mark(events)
    assert marked and launcher._events_vanished(events, marked) is False
    (events / launcher.EVENTS_MARK).unlink()
    events.rmdir()
    assert launcher._events_vanished(events, marked) is None  # gone
    events.mkdir()  # a worker that started later wrote its events again
    assert launcher._events_vanished(events, marked) is True


def _error(pid: int, message: str) -> ErrorRecord:
    return ErrorRecord("main", pid, 5 * MS, "RuntimeError", message, "x.py:1", f"Traceback\nRuntimeError: {message}")


def test_a_side_program_that_failed_is_not_the_jobs_failure():
    """A helper program the script starts (a probe, a converter) failing while the job ends well is not the script
    failing; where the job failed, the training process's own error is its cause (a wrapper's CalledProcessError
    only passes it on)."""
    from dataclasses import replace

    from stallscope.analysis.failures import failure

    side = ProcessRecord(12, 10, "child", ["probe.py"], 0, 0)
    s = _session([LAUNCHED, CHILD, side], _training(11, 30), errors=[_error(12, "probe failed")])
    assert failure(s) is None
    failed = replace(s, exit_code=1, errors=[_error(10, "CalledProcessError: train.py returned 1"),
                                             _error(11, "CUDA out of memory"), _error(12, "probe failed")])
    assert (failure(failed).message, failure(failed).pid) == ("CUDA out of memory", 11)
    only_side = replace(s, exit_code=1, errors=[_error(12, "probe failed")])
    assert failure(only_side).message == "probe failed"  # nothing better known: said as it is

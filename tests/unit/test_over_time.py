"""The run over time (analysis/over_time.py) on sessions built window by window: a change called only beyond noise,
where it began, the part of the step that changed and its cause; memory that grew."""

from __future__ import annotations

import random

import pytest

from stallscope.analysis.over_time import over_time
from stallscope.render.words import over_time as said
from stallscope.session import Session

S = 1_000_000_000
PID = 100


def _session(rates: list[float], *, parts=None, disk=None, rss=None, noise=0.03, seed=1, gc_longest=None,
             worker_uss=None, batch_bytes=None, gpu_clock=None, busy_cores=None) -> Session:
    """A run of 10-second windows, one per rate (steps/s); ``parts(i)`` gives the window's (wait, forward, backward,
    optimizer) shares of each step; ``disk(i)`` its disk read bytes/s, ``rss(i)`` the training process's RSS,
    ``worker_uss(i)`` a DataLoader worker's private memory (read every other sample, its RSS at 900 MiB),
    ``batch_bytes(i)`` the bytes of the batches sized in it, ``gpu_clock(i)`` a busy GPU's SM clock,
    ``busy_cores(i)`` the machine's busy cores (of 4; the job's own process uses none of its CPU)."""
    rng = random.Random(seed)
    rows, ticks, disk_values, rss_values = [], [], [], []
    for i, rate in enumerate(rates):
        rate *= 1 + rng.uniform(-noise, noise)
        steps = int(rate * 10)
        step_ns = int(10 * S)
        wait, fwd, bwd, opt = parts(i) if parts else (0.1, 0.3, 0.4, 0.1)
        rows.append({"pid": PID, "start_ns": i * 10 * S, "end_ns": (i + 1) * 10 * S, "steps": steps, "batches": steps,
                     "samples": steps * 8, "samples_known": True, "wait_ns": int(wait * step_ns),
                     "step_ns": step_ns, "max_step_ns": 0, "fetches": 0, "fetch_ns": 0, "fetch_cpu_ns": 0,
                     "forward_ns": int(fwd * step_ns), "backward_ns": int(bwd * step_ns),
                     "optimizer_ns": int(opt * step_ns), "h2d_bytes": 0, "epochs": 0, "stalls": 0, "errors": 0,
                     "records": steps * 3, "gc_ns": 0,
                     "gc_longest_ns": int(gc_longest(i) * 1e6) if gc_longest else 0,
                     "batch_bytes": int(batch_bytes(i)) * 10 if batch_bytes else 0,
                     "batches_sized": 10 if batch_bytes else 0})
        for k in range(5):  # samples every 2 s
            ticks.append(i * 10 * S + k * 2 * S)
            disk_values.append(disk(i) if disk else 0.0)
            rss_values.append(int(rss(i)) if rss else 500 << 20)
    samples = {"t_ns": ticks, "interval_s": 2.0,
               "system": {"disk_read_bytes_per_s": disk_values, "iowait_percent": [1.0] * len(ticks)},
               "processes": {str(PID): {"ticks": list(range(len(ticks))), "cpu_s": [0.0] * len(ticks),
                                        "rss_bytes": rss_values, "read_bytes": [None] * len(ticks)}}}
    if busy_cores:
        samples["system"]["per_core_percent"] = [[25.0 * busy_cores(t // 5)] * 4 for t in range(len(ticks))]
    if gpu_clock:
        samples["gpu"] = {"names": ["H200", "H200"], "util_percent": [[97.0, 0.0]] * len(ticks),
                          "sm_clock_mhz": [[gpu_clock(t // 5), 345.0] for t in range(len(ticks))]}
    if worker_uss:
        read = list(range(0, len(ticks), 2))
        samples["processes"][str(PID + 1)] = {
            "ticks": list(range(len(ticks))), "cpu_s": [0.0] * len(ticks), "rss_bytes": [900 << 20] * len(ticks),
            "read_bytes": [None] * len(ticks), "uss_ticks": read, "uss_bytes": [int(worker_uss(t // 5)) for t in read]}
    return Session(schema="stallscope.session/1", run_id="r", command=["python"], cwd=".", started_wall=0.0,
                   start_ns=0, end_ns=len(rates) * 10 * S, exit_code=0, ended_by="exit", overrides={},
                   max_steps=None, environment={}, system_samples=samples, windows=rows,
                   recording={"window_ns": 10 * S, "folded": [], "kept_windows": {}})


def test_a_steady_run_with_noise_has_no_change():
    found = over_time(_session([100.0] * 40, noise=0.1), PID)
    assert found is not None and found.change is None and found.memory == []
    assert len(found.windows) == 40 and abs(found.windows[5].steps_per_s - 100) < 11


def test_a_run_that_reads_from_disk_from_epoch_two_slowed_for_its_data():
    def parts(i):  # the data wait per step triples from window 20 on, the rest the same per step
        return (0.1, 0.3, 0.4, 0.1) if i < 20 else (0.55, 0.15, 0.2, 0.05)

    rates = [100.0 if i < 20 else 50.0 for i in range(40)]
    found = over_time(_session(rates, parts=parts, disk=lambda i: 0.0 if i < 20 else 80 << 20), PID).change
    assert found is not None and found.direction == "slower" and 0.45 < found.ratio < 0.55
    assert 19 * 10 * S <= found.began_ns <= 21 * 10 * S
    assert found.part == "data_wait" and found.cause == "page-cache"
    line = said.change(found, 0)
    assert "from 3.3 min on" in line and "page cache" in line and "data wait per step grew" in line


def test_a_run_whose_model_slowed_gradually_names_the_compute():
    rates = [100.0 / (1 + max(0, i - 10) * 0.05) for i in range(40)]

    def parts(i):
        grow = 1 + max(0, i - 10) * 0.05  # forward and backward per step grow; wait and optimizer per step stay
        return (0.1 / grow, 0.3 * (1 + 1.6 * (grow - 1)) / grow, 0.4 * (1 + 1.6 * (grow - 1)) / grow, 0.1 / grow)

    found = over_time(_session(rates, parts=parts), PID).change
    assert found is not None and found.direction == "slower"
    assert found.part in ("forward", "backward") and found.cause == "compute"
    assert 8 * 10 * S <= found.began_ns <= 13 * 10 * S


def test_a_loop_that_keeps_more_every_step_is_named_by_its_memory():
    rates = [100.0 / (1 + i * 0.04) for i in range(40)]

    def parts(i):
        grow = 1 + i * 0.04
        return (0.1 / grow, 0.3 / grow, 0.4 / grow, 0.1 / grow)  # the rest: step code, growing

    session = _session(rates, parts=parts, rss=lambda i: (600 << 20) + i * (20 << 20))
    found = over_time(session, PID)
    assert found.change is not None and found.change.part == "step_code" and found.change.cause == "memory-growth"
    [memory] = found.memory
    assert memory.who == "training" and memory.late_bytes > 1.5 * memory.early_bytes
    assert "memory grew over time: the training process" in said.memory(memory, 0)


def test_a_run_that_sped_up_says_so_without_a_cause():
    rates = [50.0 if i < 15 else 100.0 for i in range(40)]
    found = over_time(_session(rates), PID).change
    assert found is not None and found.direction == "faster" and found.ratio > 1.8 and found.cause == "unknown"
    assert said.change(found, 0).startswith("over time: the run sped up")


def test_a_change_that_comes_with_other_programs_load_is_the_machines():
    """Other programs took 2 more CPUs as the run slowed (and gave them back as another sped up): the cause is the
    machine's load, said with its CPUs, not the part of the step that took longer under it."""
    slowed = [100.0 if i < 15 else 55.0 for i in range(40)]
    found = over_time(_session(slowed, busy_cores=lambda i: 0.4 if i < 15 else 2.4), PID).change
    assert found is not None and found.direction == "slower" and found.cause == "other-load"
    assert found.evidence["other_cpus"] == pytest.approx((0.4, 2.4), abs=0.05)
    assert "other programs on the machine kept 0.4 -> 2.4 CPUs busy meanwhile" in said.change(found, 0)
    faster = [55.0 if i < 15 else 100.0 for i in range(40)]
    found = over_time(_session(faster, busy_cores=lambda i: 2.4 if i < 15 else 0.4), PID).change
    assert found is not None and found.direction == "faster" and found.cause == "other-load"
    # load that moved the other way, or too little of it, is no cause
    found = over_time(_session(slowed, busy_cores=lambda i: 2.4 if i < 15 else 0.4), PID).change
    assert found is not None and found.cause != "other-load"
    found = over_time(_session(slowed, busy_cores=lambda i: 0.4 if i < 15 else 0.6), PID).change
    assert found is not None and found.cause != "other-load"


def test_too_few_windows_or_a_small_change_are_not_called():
    assert over_time(_session([100.0] * 5 + [50.0] * 5), PID).change is None  # 10 windows: too few
    assert over_time(_session([100.0] * 20 + [92.0] * 20, noise=0.0), PID).change is None  # 8%: under CHANGE_AT


def test_full_collections_that_grow_longer_are_named_without_a_slowdown():
    """A leak of Python objects on 3.11: the collector's total time stays, each full collection grows (a window
    without one shows only young collections: the quarter's longest is compared)."""
    found = over_time(_session([100.0] * 40, gc_longest=lambda i: (40 + 12 * i) if i % 3 == 0 else 1.5), PID)
    assert found.change is None and found.gc_pauses is not None
    assert found.gc_pauses.late_ms > 2 * found.gc_pauses.early_ms
    assert "garbage collection pauses grew" in said.gc_pauses(found.gc_pauses, 0)
    steady = over_time(_session([100.0] * 40, gc_longest=lambda i: 60.0 if i % 3 == 0 else 1.5), PID)
    assert steady.gc_pauses is None


def test_workers_that_copy_the_dataset_as_they_read_it_are_named_from_where_it_began():
    """Copy-on-read: a worker's private memory flat, then climbing from window 15 (its RSS, which counts the pages it
    still shares, flat): the workers' growth is named, from about then; the training process's is not."""
    found = over_time(_session([100.0] * 40, worker_uss=lambda i: (40 << 20) + max(0, i - 15) * (30 << 20)), PID)
    assert found.change is None
    [memory] = found.memory
    assert memory.who == "workers" and memory.early_bytes < 50 << 20 and memory.late_bytes > 500 << 20
    assert 13 * 10 * S <= memory.began_ns <= 17 * 10 * S
    line = said.memory(memory, 0)
    assert "the DataLoader workers 40 -> " in line and "copy-on-read" in line and "from 2.5 min on" in line


def _compute_grows(i: int) -> tuple[float, float, float, float]:
    grow = 1 + max(0, i - 10) * 0.05  # forward and backward per step grow from window 10; the rest stays
    return (0.1 / grow, 0.3 * (1 + 1.6 * (grow - 1)) / grow, 0.4 * (1 + 1.6 * (grow - 1)) / grow, 0.1 / grow)


def test_compute_that_grows_with_the_batches_names_the_data():
    rates = [100.0 / (1 + max(0, i - 10) * 0.05) for i in range(40)]
    found = over_time(_session(rates, parts=_compute_grows, batch_bytes=lambda i: 4096 * (1 + max(0, i - 10) * 0.05)),
                      PID).change
    assert found is not None and found.cause == "data-growing", found
    early, late = found.evidence["batch_bytes"]
    assert late > 1.25 * early
    assert "the batches grew over the run (4.0 KiB -> " in said.change(found, 0)


def test_compute_that_grows_as_the_gpu_clocks_down_names_the_clocks():
    """The busy GPU's SM clock falls 1,980 -> 1,400 MHz as the step grows; the idle one (345 MHz) is not read."""
    rates = [100.0 / (1 + max(0, i - 10) * 0.05) for i in range(40)]
    found = over_time(_session(rates, parts=_compute_grows, batch_bytes=lambda i: 4096.0,
                               gpu_clock=lambda i: 1980.0 - max(0, i - 10) * 20), PID).change
    assert found is not None and found.cause == "clocks", found
    assert found.evidence["gpu_mhz"][0] > 1900 and found.evidence["gpu_mhz"][1] < 1500
    assert "the GPUs' SM clock 1,9" in said.change(found, 0)
    # the same slowdown with steady clocks and batches: the compute itself
    steady = over_time(_session(rates, parts=_compute_grows, batch_bytes=lambda i: 4096.0,
                                gpu_clock=lambda i: 1980.0), PID).change
    assert steady is not None and steady.cause == "compute"


def test_every_cause_of_a_change_over_time_has_its_words():
    from types import SimpleNamespace

    from stallscope.render.words.over_time import _CAUSES, _cause

    evidence = {"disk_read_bytes_per_s": [1 << 20, 50 << 20], "iowait_percent": [1, 30], "fetch_ms": [2.0, 9.0],
                "gc_ms": [0.1, 3.0], "rss_bytes": [100 << 20, 900 << 20], "batch_bytes": [1 << 20, 3 << 20],
                "gpu_mhz": [1980, 1410], "cpu_mhz": [3000, 2900], "other_cpus": [0.2, 1.5]}
    said = {cause: _cause(SimpleNamespace(cause=cause, evidence=evidence)) for cause in _CAUSES}
    assert all(said.values()) and len(set(said.values())) == len(said)
    assert "50.0 MiB/s, iowait 1% -> 30%" in said["page-cache"] and "1,980 -> 1,410 MHz" in said["clocks"]
    assert _cause(SimpleNamespace(cause="unknown", evidence={})) == ""

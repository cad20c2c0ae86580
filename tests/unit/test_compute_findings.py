"""Compute findings from the facts a run recorded: another thread's hold on the step (``thread-in-step``), and on a
GPU the device's busy time and the host's waits in the profiler window (``host-bound``, ``device-sync``)."""

from __future__ import annotations

import pytest

from stallscope.analysis.compute_findings import THREAD_SHARE, _allocator, _ddp_buckets, _ddp_compress, _device, _threads
from stallscope.analysis.operators import Operator, Operators
from stallscope.render import words
from stallscope.render.words.recommendations import recommendation

MS = 1_000_000


def _facts(wall: int, cpu: int, run_queue: int, thread_cpu: int, lines=None) -> list[dict]:
    return [{"kind": "threads", "pid": 1, "wall_ns": wall, "cpu_ns": cpu, "run_queue_ns": run_queue,
             "intervals": 100, "threads": [{"name": "metrics-exporter", "target": "export", "cpu_ns": thread_cpu,
                                            "lines": lines or [["/job/train.py", 12, "export", 40]]}]}]


def test_a_thread_running_while_the_step_is_blocked_is_named_with_a_floor():
    # 1000 ms computing: 400 ms on CPU, 100 ms in the run queue, 500 ms blocked; the thread ran 450 ms of it
    (rec,) = _threads(_facts(1000 * MS, 400 * MS, 100 * MS, 450 * MS), computing=0.8)
    assert rec.id == "thread-in-step"
    share = 0.45 * 0.8  # the lesser of blocked and the thread's CPU, times the share of the step spent computing
    assert rec.facts["share_of_step"] == pytest.approx(share)
    assert rec.predicted_speedup == pytest.approx(1 / (1 - share), abs=0.01)
    assert (rec.facts["thread"], rec.facts["file"], rec.facts["line"]) == ("metrics-exporter", "/job/train.py", 12)
    assert words.gain(rec).startswith("at least ")
    said = recommendation(rec)
    assert "metrics-exporter" in said.title and "train.py:12" in said.change and "blocked 50%" in said.reason


def test_the_batches_the_process_loads_itself_wait_for_the_lock_too():
    """num_workers=0: 6% of step time blocked in computing while the thread ran, and 15% of it spent loading
    batches that waited for the lock (``FetchRecord.threads_cpu_ns``)."""
    assert _threads(_facts(1000 * MS, 800 * MS, 0, 200 * MS), computing=0.3) == []  # 6% alone: under the mark
    (rec,) = _threads(_facts(1000 * MS, 800 * MS, 0, 200 * MS), computing=0.3, loading=0.15)
    assert rec.facts["share_of_step"] == pytest.approx(0.2 * 0.3 + 0.15)


def test_a_fetch_waiting_for_the_lock_is_not_storage():
    """A batch loaded in the training process: 10 ms wall, 3 ms CPU, 1 ms run queue; its other threads ran 4 ms:
    4 of the 6 ms off the CPU waited for the interpreter (like the run queue, to its CPU nodes), 2 ms blocked."""
    from stallscope.analysis.pipeline import fetch_parts, split_fetch
    from stallscope.session import FetchRecord

    fetch = FetchRecord(0, 0, -1, 0, 0, 10 * MS, 3 * MS, 1 * MS, 8, {"transform": [3 * MS, 3 * MS, 8]}, {}, None, 1,
                        threads_cpu_ns=4 * MS)
    assert fetch_parts(fetch) == ({"transform": 3 * MS}, 5 * MS, 2 * MS)
    assert split_fetch(fetch) == {"transform": 8 * MS, "storage": 2 * MS}
    no_threads = FetchRecord(0, 0, -1, 0, 0, 10 * MS, 3 * MS, 1 * MS, 8, {"transform": [3 * MS, 3 * MS, 8]}, {}, None,
                             1)
    assert split_fetch(no_threads) == {"transform": 4 * MS, "storage": 6 * MS}


def test_a_thread_taking_cores_but_not_the_lock_is_not_a_finding():
    # compression with the lock released: the main thread waits in the run queue, hardly ever blocked
    assert _threads(_facts(1000 * MS, 650 * MS, 330 * MS, 800 * MS), computing=1.0) == []


def test_a_thread_that_seldom_runs_is_not_a_finding():
    # blocked half the time (a GPU sync, say) while the logger took 3%: the lesser is below the threshold
    assert _threads(_facts(1000 * MS, 500 * MS, 0, 30 * MS), computing=1.0) == []
    assert 0.03 < THREAD_SHARE


def test_no_threads_no_finding():
    assert _threads([], computing=1.0) == []
    facts = _facts(1000 * MS, 100 * MS, 0, 0)
    facts[0]["threads"] = []
    assert _threads(facts, computing=1.0) == []


# --- on a GPU: the profiler window's device time and the host's waits (``host-bound``, ``device-sync``) ------------

def _window(device_s: float, waits: list[Operator], steps: int = 5) -> Operators:
    return Operators(steps=steps, window_s=0.5, cost_s=0.1, self_cpu_s=0.2, self_device_s=device_s, waits=waits)


def _wait(name: str, part: str, cpu_s: float, calls: int) -> Operator:
    return Operator(part, name, calls, cpu_s, 0.0, 0.1, 0.0)


def test_a_device_busy_under_half_of_compute_is_a_host_bound_step_with_its_ceiling():
    # 5 steps of 10 ms compute in a 12 ms step; the kernels took 1 ms a step
    (rec,) = _device(_window(0.005, []), compute=0.010, step_s=0.012, spots=[])
    assert rec.id == "host-bound" and rec.facts["ceiling"]
    assert rec.facts["device_share_of_compute"] == pytest.approx(0.1)
    assert rec.predicted_speedup == pytest.approx(0.012 / 0.003, abs=0.01)  # compute cut to the device's 1 ms
    said = recommendation(rec)
    assert "torch.compile" in said.change and "1.00 ms of each step's 10.00 ms" in said.reason


def test_a_busy_device_is_not_host_bound_and_no_device_time_says_nothing():
    assert _device(_window(0.040, []), compute=0.010, step_s=0.012, spots=[]) == []
    assert _device(_window(0.0, []), compute=0.010, step_s=0.012, spots=[]) == []  # a CPU run
    assert _device(None, compute=0.010, step_s=0.012, spots=[]) == []


def test_the_host_waiting_in_item_is_named_with_its_operator_and_line():
    item = _wait("cudaStreamSynchronize < aten::_local_scalar_dense", "step_code", 0.010, 5)
    spot = type("Spot", (), {"stage": "compute", "part": "step_code", "file": "/job/train.py", "line": 40,
                             "function": "train"})()
    (rec,) = _device(_window(0.040, [item]), compute=0.010, step_s=0.012, spots=[spot])
    assert rec.id == "device-sync" and rec.facts["wait_ms_per_step"] == pytest.approx(2.0)
    assert rec.predicted_speedup == pytest.approx(12 / 10, abs=0.01)  # the host's 10 ms; the device's 8 + 2 ms
    assert not rec.facts.get("ceiling")
    # a device busy the whole step: waiting for it costs nothing the step could save
    assert _device(_window(0.055, [item]), compute=0.010, step_s=0.012, spots=[]) == []
    said = recommendation(rec)
    assert ".item()" in said.change and "train.py:40" in said.change and "1 a step" in said.reason


def test_a_wait_is_placed_at_the_line_timed_reading_back_in_the_window():
    """The window timed .item() at train.py:72 (2.5 ms over 5 steps): that line, not the part's costliest."""
    from stallscope.analysis.operators import SyncSite

    item = _wait("cudaStreamSynchronize < aten::_local_scalar_dense", "step_code", 0.010, 5)
    site = SyncSite(".item()", "/job/train.py", 72, "train", "cuda", 5, 0.0125)
    window = Operators(steps=5, window_s=0.5, cost_s=0.1, self_cpu_s=0.2, self_device_s=0.040, waits=[item],
                       sync_sites=[site])
    (rec,) = _device(window, compute=0.010, step_s=0.012, spots=[])
    assert (rec.facts["file"], rec.facts["line"], rec.facts["placed"]) == ("/job/train.py", 72, "timed")
    assert rec.facts["site_ms_per_step"] == pytest.approx(2.5)
    assert "at train.py:72 train (/job/train.py): .item() there held the host 2.50 ms a step" in \
        recommendation(rec).change


def test_waits_under_the_threshold_are_not_a_finding():
    tiny = _wait("cudaStreamSynchronize < aten::_local_scalar_dense", "step_code", 0.0001, 5)
    assert _device(_window(0.040, [tiny]), compute=0.010, step_s=0.012, spots=[]) == []


# --- the CUDA caching allocator (``allocator``) ---------------------------------------------------------------------

def _allocator_facts(**counters) -> list[dict]:
    base = {"kind": "allocator", "pid": 1, "reserved_peak": 4 << 30, "allocated_peak": 3 << 30, "retries": 0,
            "device_allocs": 40, "alloc_conf": None}
    return [{**base, **counters}]


def test_allocator_retries_are_said_without_a_figure():
    (rec,) = _allocator(_allocator_facts(retries=3), None, step_s=0.05)
    assert rec.id == "allocator" and rec.predicted_speedup is None
    said = recommendation(rec)
    assert "expandable_segments:True" in said.change and "retried 3 time(s)" in said.reason


def test_device_allocations_in_the_window_are_priced_as_a_ceiling():
    window = Operators(steps=5, window_s=0.5, cost_s=0.1, self_cpu_s=0.2, self_device_s=0.2, device_alloc_s=0.005)
    (rec,) = _allocator(_allocator_facts(), window, step_s=0.05)
    assert rec.facts["malloc_ms_per_step"] == pytest.approx(1.0) and rec.facts["ceiling"]
    assert rec.predicted_speedup == pytest.approx(50 / 49, abs=0.01)


def test_a_fragmented_cache_fires_and_a_healthy_or_already_expandable_one_does_not():
    (rec,) = _allocator(_allocator_facts(reserved_peak=12 << 30, allocated_peak=6 << 30), None, step_s=0.05)
    assert rec.facts["fragmented"]
    assert _allocator(_allocator_facts(), None, step_s=0.05) == []
    assert _allocator(_allocator_facts(retries=3, alloc_conf="expandable_segments:True"), None, step_s=0.05) == []


# --- DDP's buckets (``ddp-buckets``) -----------------------------------------------------------------------------

def _ddp(size_mb: float, cap_mb: float = 25, device: str = "cuda") -> list[dict]:
    return [{"kind": "ddp", "pid": 1, "bucket_cap_bytes": int(cap_mb * 2**20), "parameter_bytes": int(size_mb * 2**20),
             "device": device}]


def test_gradients_in_one_bucket_waited_for_after_the_backward_are_cut_smaller():
    (rec,) = _ddp_buckets(_ddp(8.1), wait_s=0.010, backward_s=0.005, step_s=0.020)
    assert rec.id == "ddp-buckets" and rec.facts["advised_mb"] == 3  # 8.1 MB over four buckets, whole MB
    assert rec.predicted_speedup == pytest.approx(0.020 / 0.015, abs=0.01)  # at most the backward hides the wait
    said = recommendation(rec)
    assert "bucket_cap_mb=3" in said.change and "ddp_bucket_cap_mb=3" in said.change
    assert words.gain(rec).startswith("at most ")


def test_no_bucket_advice_on_cpus_many_buckets_or_a_small_wait():
    assert _ddp_buckets(_ddp(8.1, device="cpu"), 0.010, 0.005, 0.020) == []  # gloo shares the backward's cores
    assert _ddp_buckets(_ddp(300), 0.010, 0.005, 0.020) == []  # twelve buckets already
    assert _ddp_buckets(_ddp(8.1), 0.001, 0.005, 0.020) == []  # 5% of the step: under DDP_WAIT_SHARE
    assert _ddp_buckets(_ddp(2.5, cap_mb=1), 0.010, 0.005, 0.020) == []  # already no bigger than advised


# --- DDP's gradients over a slow link (``ddp-compress``) -----------------------------------------------------------

def test_float32_gradients_waited_for_over_a_slow_link_are_compressed_with_a_floor():
    """100 MB of gradients over 8 ranks, a 20 ms wait in a 60 ms step: at most 2*7/8*100 MB / 20 ms = 9.2 GB/s, a
    link well under NVLink's: half the wait is the floor."""
    facts = [{**_ddp(100)[0], "gradient_dtype": "float32", "comm_hook": None}]
    (rec,) = _ddp_compress(facts, wait_s=0.020, step_s=0.060, world=8)
    assert rec.id == "ddp-compress" and rec.facts["floor"]
    assert rec.facts["link_gb_per_s_at_most"] == pytest.approx(2 * 7 / 8 * 100 * 2**20 / 0.020 / 1e9, abs=0.01)
    assert rec.predicted_speedup == pytest.approx(0.060 / 0.050, abs=0.01)
    said = recommendation(rec)
    assert "bf16_compress_hook" in said.change and "at most 9.2 GB/s" in said.reason
    assert words.gain(rec).startswith("at least ")


def test_no_compression_where_a_hook_runs_on_cpus_one_rank_a_fast_link_or_a_small_wait():
    slow = {**_ddp(100)[0], "gradient_dtype": "float32", "comm_hook": None}
    assert _ddp_compress([{**slow, "comm_hook": "fp16_compress_hook"}], 0.020, 0.060, 8) == []
    assert _ddp_compress([{**slow, "device": "cpu"}], 0.020, 0.060, 8) == []
    assert _ddp_compress([{**slow, "gradient_dtype": "bfloat16"}], 0.020, 0.060, 8) == []
    assert _ddp_compress([slow], 0.020, 0.060, 1) == []
    assert _ddp_compress([slow], 0.002, 0.060, 8) == []  # 3% of the step: under DDP_WAIT_SHARE
    assert _ddp_compress([{**slow, "parameter_bytes": 4 << 30}], 0.020, 0.060, 8) == []  # >= 25 GB/s: NVLink-fast

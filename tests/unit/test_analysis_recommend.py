"""Ranking of recommendations: measured configuration changes before assumed code changes."""

from __future__ import annotations

import pytest

from stallscope.analysis.recommend import SPECULATIVE_DISCOUNT, _rank_value
from stallscope.analysis.findings import Recommendation
from stallscope.render import words
from stallscope.render.words import recommendations


def rec(id_, overrides, gain):
    return Recommendation(id_, "loader", gain, overrides)


def test_measured_set_change_beats_a_slightly_larger_assumed_gain():
    measured = rec("num-workers", {"num_workers": 2}, 1.9)
    assumed = rec("dataset-code", {}, 2.1)
    assert _rank_value(measured) > _rank_value(assumed)
    assert _rank_value(assumed) == 2.1 * SPECULATIVE_DISCOUNT


def test_much_larger_assumed_gain_still_wins():
    assert _rank_value(rec("pack", {}, 4.0)) > _rank_value(rec("w", {"num_workers": 3}, 1.5))


def test_unpredicted_changes_rank_last():
    assert _rank_value(rec("sharing-strategy", {"sharing_strategy": "file_system"}, None)) == 0.0


def _train(fetched: int, used: int, epochs: int, prefetch: int = 2, workers: int = 2):
    from stallscope.analysis.findings import LoaderSummary, WorkerPipeline

    pipeline = WorkerPipeline(0, workers, fetched, 1.0, {}, {}, fetched * 16, 1.0, 1.0, 0.0, None, {}, None, None,
                              [], None, None, None, 0.0, 0)
    config = {"num_workers": workers, "prefetch_factor": prefetch, "persistent_workers": True}
    return LoaderSummary(0, "train", "train.py:1", config, {}, used, epochs, 0.0, 0.0, pipeline)


def test_batches_dropped_at_every_early_epoch_end_recommend_less_prefetch():
    from stallscope.analysis.capacity import ThroughputModel
    from stallscope.analysis.recommend import _discarded_prefetch

    # input-bound: 2 workers at 8 ms per sample loaded, the model needs 2 ms
    model = ThroughputModel({"decode": 0.008}, 0.002, 0.002, 2, 4.0)
    # 10 epochs of 10 batches, each leaving 4 batches in flight: 140 loaded for 100 used
    rec_ = _discarded_prefetch(_train(fetched=140, used=100, epochs=10), model, 2)
    assert rec_ is not None and rec_.overrides == {"prefetch_factor": 1}
    assert words.recommendation(rec_).change.startswith("--set prefetch_factor=1")
    # loaded per used: 1.40 now, 1 + (36 + 4) / 2 / 100 = 1.20 with prefetch 1
    assert rec_.predicted_speedup == round(1.40 / 1.20, 2)
    assert _discarded_prefetch(_train(fetched=104, used=100, epochs=10), model, 2) is None  # only the last queue
    assert _discarded_prefetch(_train(fetched=140, used=100, epochs=10, prefetch=1), model, 2) is None


def test_the_worker_advice_says_how_hyper_threads_were_counted():
    from dataclasses import replace

    from stallscope.analysis.model_from_run import build_model
    from stallscope.analysis.recommend import recommend
    from tests.unit.test_analysis_capacity import _ten_steps_of_eight

    stats, train = _ten_steps_of_eight(workers=0)
    plain = build_model(stats, train, 4.0, main_cpu_s=0.34)
    smt = replace(plain, physical_cores=2.0)
    seconds = {"transform": 0.3, "compute": 0.1}
    (advice, *_) = recommend("input-bound", stats, train, seconds, 4, model=smt)
    (plain_advice, *_) = recommend("input-bound", stats, train, seconds, 4, model=plain)
    assert advice.id == plain_advice.id == "num-workers"
    assert advice.facts["threads_per_core"] == 2.0 and "threads_per_core" not in plain_advice.facts
    assert advice.predicted_speedup < plain_advice.predicted_speedup  # 4 threads on 2 cores are 2.5 cores' work
    reason = words.recommendation(advice).reason
    assert reason.startswith("4 usable CPUs (2 hardware threads per core: a thread on a core whose other thread is "
                             "busy is counted as 25% of a core); each sample costs")
    assert words.recommendation(plain_advice).reason.startswith("4 usable CPUs; each sample costs")


def test_the_worker_advice_says_what_a_cpu_second_is_estimated_to_cost_at_its_load():
    from stallscope.analysis.model_from_run import build_model
    from stallscope.analysis.recommend import recommend
    from tests.unit.test_analysis_capacity import _ten_steps_of_eight

    stats, train = _ten_steps_of_eight(workers=0)
    m = build_model(stats, train, 2.0, main_cpu_s=0.34)
    (advice, *_) = recommend("input-bound", stats, train, {"transform": 0.3, "compute": 0.1}, 2, model=m)
    assert advice.id == "num-workers" and advice.overrides == {"num_workers": 2}
    assert advice.facts["cpu_second_cost"] == pytest.approx(m.cpu_second_cost(2), abs=1e-3)
    assert advice.predicted_speedup == pytest.approx(m.speedup(2), abs=0.01)
    assert advice.facts["cpu_second_cost"] > 1.04  # every core busy, and more threads than cores
    reason = words.recommendation(advice).reason
    assert ("; with 2 workers the cores are busier than in this run: each CPU second is estimated to cost "
            f"{round(100 * (advice.facts['cpu_second_cost'] - 1))}% more") in reason
    # more threads than CPUs: the time-sharing part is named; at most one a CPU, only the shared caches are
    assert advice.facts["busy_threads_per_cpu"] > 1.0
    # the training computes on the CPU beside the workers a share of the time: said with its share
    priced = m.at_load(2)
    share = priced.computing_share(2, priced.rate(2))
    assert advice.facts["computing_beside_workers"] == round(share, 2) > 0.05
    assert ("(caches and memory shared between busy cores, switching between more threads than cores, the training "
            f"step computing on another core {100 * share:.0f}% of the time)") in reason
    alone = dict(advice.facts, computing_beside_workers=0.0)
    assert "computing on another core" not in recommendations._cpu_second_cost(alone, 2)
    # the training step's own work is priced apart: its own figure
    workers, compute = m.load_costs(2)
    assert advice.facts["compute_cpu_second_cost"] == pytest.approx(compute, abs=1e-3)
    dearer = dict(advice.facts, compute_cpu_second_cost=advice.facts["cpu_second_cost"] + 0.05)
    assert (f", the training step's own {round(100 * (dearer['compute_cpu_second_cost'] - 1))}% more (its "
            "working set evicted by the others), counted in the prediction") in recommendations._cpu_second_cost(dearer, 2)
    # within a point of the workers' price, it is not said apart
    assert "training step's own" not in recommendations._cpu_second_cost(dict(advice.facts, compute_cpu_second_cost=(
        advice.facts["cpu_second_cost"] + 0.005)), 2)
    calmer = dict(advice.facts, busy_threads_per_cpu=0.9, compute_cpu_second_cost=None, computing_beside_workers=0.0)
    assert recommendations._cpu_second_cost(calmer, 2).endswith(
        "(caches and memory shared between busy cores), counted in the prediction")
    assert recommendations._cpu_second_cost(dict(advice.facts, cpu_second_cost=0.9), 2) == (
        "; with 2 workers the cores are less busy than in this run: each CPU second is estimated to cost 10% less, "
        "counted in the prediction")
    assert recommendations._cpu_second_cost(dict(advice.facts, cpu_second_cost=1.004), 2) == ""  # not worth saying


def test_the_worker_advice_from_a_zero_worker_run_says_how_its_shared_memory_cost_was_estimated():
    from stallscope.analysis.model_from_run import build_model
    from stallscope.analysis.recommend import recommend
    from stallscope.analysis.sample_costs import RECEIVED_BATCH_READS
    from tests.unit.test_analysis_capacity import _ten_steps_of_eight

    stats, train = _ten_steps_of_eight(workers=0)
    calibration = {"nbytes": 4_000_000, "write_extra_ns": 2_000_000, "read_extra_ns": 250_000}
    shares = {"transform": 0.3, "compute": 0.1}
    said = {}
    for on_cpu in (True, False):
        m = build_model(stats, train, 2.0, main_cpu_s=0.34, bytes_per_sample=600_000, shm_calibration=calibration,
                        compute_on_cpu=on_cpu)
        (advice, *_) = recommend("input-bound", stats, train, shares, 2, model=m)
        assert advice.id == "num-workers"
        # 0.3 ms to write 600 kB in a worker, 0.0375 ms to read it once: a CPU step reads it 4 times over
        reads = RECEIVED_BATCH_READS if on_cpu else 1.0
        assert advice.facts["shared_memory_reads"] == reads
        assert advice.facts["shared_memory_s_per_sample"] == pytest.approx(0.0003 + reads * 0.0000375)
        said[on_cpu] = words.recommendation(advice).reason
    assert ("passing batches through shared memory adds an estimated 0.45 ms per sample (per-byte cost measured on "
            "this machine, read 4 times over by the training step on the CPU, estimated)") in said[True]
    assert "adds an estimated 0.34 ms per sample (per-byte cost measured on this machine)" in said[False]


def test_more_compute_threads_than_cpus_are_cut_to_the_cpus_first_even_where_no_input_fix_is_the_finding():
    from stallscope.analysis.model_from_run import build_model
    from stallscope.analysis.recommend import recommend
    from tests.unit.test_analysis_capacity import _ten_steps_of_eight

    stats, train = _ten_steps_of_eight(workers=0)
    train.config["torch_threads"] = 2
    # 1 usable CPU, 2 threads: 1.25 ms of compute per sample is 1.25 / 1.55 of one thread's time and its waits
    m = build_model(stats, train, 1.0, main_cpu_s=0.34)
    assert m.compute_oversubscribed and m.compute_per_sample_s == pytest.approx(0.00125)
    first, second, *_ = recommend("compute-bound", stats, train, {"transform": 0.3, "compute": 0.1}, 1, model=m)
    assert (first.id, first.overrides, second.id) == ("compute-threads", {"torch_threads": 1}, "no-input-fix")
    cut = m.with_compute_threads(1)
    assert first.facts["cut_compute_s_per_sample"] == pytest.approx(0.00125 / 1.55)
    assert first.predicted_speedup == round(cut.rate() / m.rate(), 2) and first.predicted_speedup >= 1.05
    said = words.recommendation(first)
    assert said.title == "Use 1 compute thread (now 2)"
    assert said.change.startswith("--set torch_threads=1   (in code: torch.set_num_threads(1)")
    assert "2 intra-op threads on 1 usable CPU: each parallel region waits" in said.reason
    assert "0.81 ms per sample instead of 1.25 ms" in said.reason
    # as many CPUs as threads: nothing to cut; a compute on the GPU: not its threads' waits
    roomy = build_model(stats, train, 2.0, main_cpu_s=0.34)
    assert all(r.id != "compute-threads" for r in recommend("compute-bound", stats, train, {}, 2, model=roomy))
    gpu = build_model(stats, train, 1.0, main_cpu_s=0.34, compute_on_cpu=False)
    assert all(r.id != "compute-threads" for r in recommend("compute-bound", stats, train, {}, 1, model=gpu))

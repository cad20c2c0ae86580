"""The throughput model: exact rates on hand-set costs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from stallscope.analysis.capacity import ThroughputModel
from stallscope.analysis.recommend import best_worker_count


def model(**kw) -> ThroughputModel:
    base = dict(cost_s={"decode": 0.004, "transform": 0.004, "loader": 0.0, "storage": 0.0},
                compute_per_sample_s=0.002, main_cpu_per_sample_s=0.002, workers=1, usable_cpus=4.0)
    base.update(kw)
    return ThroughputModel(**base)


def _ten_steps_of_eight(workers: int = 0, unpickle_s: float = 0.0, unpickle_cpu_s: float = 0.0):
    """A recorded run by hand: 10 steps of 8 samples, 40 ms each, 30 ms of it in next(), 10 ms compute; the loader's
    0.3 s of work is 0.24 s of transform CPU."""
    from stallscope.analysis.findings import LoaderSummary, Step, StepStats, WorkerPipeline

    ms = 1_000_000
    steps = [Step(k, k * 40 * ms, (k + 1) * 40 * ms, 30 * ms, 0, 1, 8) for k in range(10)]
    stats = StepStats(0, "optimizer", steps, 0, 0.4, 0.3, 0.0, 0.1, unpickle_s, unpickle_cpu_s, 80, 0.04, 0.04, 0.03,
                      0.04)
    pipeline = WorkerPipeline(0, workers, 10, 0.3, {"transform": 0.3}, {"transform": 0.24}, 80, 0.0, 0.24, 0.06, None,
                              {}, None, None, [], None, None, None, 0.0, 0)
    return stats, LoaderSummary(0, "train", "train.py:1", {"num_workers": workers}, {}, 10, 1, 0.3, 0.0, pipeline)


def test_workers_scale_until_the_cpu_budget():
    m = model()
    assert m.rate() == pytest.approx(125.0)  # one worker, 8 ms per sample
    assert m.rate(workers=2) == pytest.approx(250.0)
    # 4 cores / (8 ms worker CPU + 2 ms training CPU) = 400/s; compute allows 500/s.
    assert m.rate(workers=8) == pytest.approx(400.0)
    assert best_worker_count(m, 4) == (4, pytest.approx(3.2))


def test_zero_workers_adds_costs():
    m = model(workers=0)
    assert m.rate() == pytest.approx(1 / 0.010)
    assert m.speedup(workers=2) == pytest.approx(250 / 100)


def test_blocking_io_overlaps_beyond_cores():
    m = model(cost_s={"decode": 0.001, "storage": 0.040}, usable_cpus=2.0)
    assert m.rate() == pytest.approx(1 / 0.041)
    assert m.rate(workers=8) == pytest.approx(8 / 0.041)
    workers, gain = best_worker_count(m, 2)
    assert workers > 2 and gain > 4


def test_compute_bound_gains_nothing_from_input_fixes():
    m = model(compute_per_sample_s=0.050, workers=2)
    assert m.speedup(workers=4) == pytest.approx(1.0)
    assert m.speedup(scale={"decode": 0.5}) == pytest.approx(1.0)


def test_stage_capacity_reports_each_stage_alone():
    caps = model(workers=2).stage_capacity()
    assert caps["decode"] == pytest.approx(2 / 0.004)
    assert caps["loader"] is None and caps["storage"] is None
    assert caps["compute"] == pytest.approx(500.0)


def test_helper_processes_share_the_cpu_budget():
    # a local data server the script started burns 10 ms of CPU per sample it serves
    m = model(cost_s={"decode": 0.001, "storage": 0.040}, usable_cpus=2.0, helper_cpu_per_sample_s=0.010)
    assert m.rate(workers=8) == pytest.approx(2.0 / (0.001 + 0.002 + 0.010))  # CPU-bound, not 8 / 41 ms
    assert model(cost_s={"decode": 0.001, "storage": 0.040}, usable_cpus=2.0).rate(workers=8) == \
        pytest.approx(8 / 0.041)


def test_helper_cpu_counts_descendants_of_the_training_process_only():

    from stallscope.analysis.system_metrics import helper_cpu_between
    from stallscope.session import WorkerStartRecord
    from tests.unit.test_analysis_pitfalls import base

    session = base()
    main = session.main_pid

    def proc(ppid, cores):
        return {"ppid": ppid, "ticks": list(range(11)), "cpu_s": [cores * 0.1 * k for k in range(11)]}

    samples = {"t_ns": [k * 100_000_000 for k in range(11)], "interval_s": 0.1, "processes": {
        str(main): proc(1, 1.0), "501": proc(main, 0.9),  # the training process and a worker
        "600": proc(main, 0.5), "601": proc(600, 0.25),   # a server it started, and that server's child
        "700": proc(1, 0.8)}}                             # unrelated: not the job's
    session = replace(session, system_samples=samples, worker_starts=[WorkerStartRecord(0, 0, 0, 501, 0, 1, 2, {})])
    assert helper_cpu_between(session, main, 0, 1_000_000_000) == pytest.approx(0.75)


def test_workers_that_cannot_keep_up_share_the_cores_with_a_cpu_compute():
    # 2 cores; the training computes with two threads (occupancy 2): 4 ms of compute, 6 ms of loader CPU
    m = model(cost_s={"transform": 0.006}, compute_per_sample_s=0.004, main_cpu_per_sample_s=0.008,
              workers=0, usable_cpus=2.0, main_occupancy=2.0)
    assert m.rate() == pytest.approx(100.0)  # nothing overlaps: 10 ms per sample
    # one worker beside the two threads: 3 demands on 2 cores. The threads then run at one core's speed
    # (8 ms of CPU per sample); the worker, at 2/3 speed, makes 8 / 9 of a sample meanwhile; 6 ms x 1/9 alone
    assert m.shared_cores_rate(1) == pytest.approx(1 / (0.008 + 0.006 / 9))
    assert m.speedup(workers=1) == pytest.approx(0.010 / (0.008 + 0.006 / 9))  # 1.15x, not the pooled 1.43x


def test_a_single_threaded_compute_slows_by_its_fair_share():
    m = model(cost_s={"transform": 0.008}, compute_per_sample_s=0.004, main_cpu_per_sample_s=0.004,
              workers=0, usable_cpus=2.0, main_occupancy=1.0)
    # two workers and the compute: 3 demands on 2 cores. Computing takes 6 ms; the workers make
    # 2 x 6 / 12 = 1 sample meanwhile: they keep up, and the pooled budget (2 / 12 ms) holds
    assert m.shared_cores_rate(2) is None
    assert m.rate(workers=2) == pytest.approx(2 / 0.012)
    slow = model(cost_s={"transform": 0.016}, compute_per_sample_s=0.004, main_cpu_per_sample_s=0.004,
                 workers=0, usable_cpus=2.0, main_occupancy=1.0)
    # 16 ms of loader CPU: the workers make 2 x 6 / 24 = 1/2 sample while it computes, then 16 ms / 2 alone
    assert slow.shared_cores_rate(2) == pytest.approx(1 / (0.006 + 0.5 * 0.016 / 2))


def test_threads_held_back_at_every_batch_stay_slow_even_when_workers_keep_up():
    # the shape of a Trainer job: two compute threads (1.15 ms, 2.2 ms of CPU), 0.9 ms of tokenizing per sample
    m = model(cost_s={"transform": 0.0009}, compute_per_sample_s=0.00115, main_cpu_per_sample_s=0.0022,
              workers=0, usable_cpus=2.0, main_occupancy=1.9)
    assert m.shared_cores_rate(1) == pytest.approx(1 / (0.00115 * 1.9))
    assert m.speedup(workers=1) < 1.0  # moving the loading to a worker costs more than it saves


def test_a_gpu_compute_is_not_slowed_by_shared_cores():
    m = model(cost_s={"transform": 0.006}, compute_per_sample_s=0.004, main_cpu_per_sample_s=0.008,
              workers=0, usable_cpus=2.0, main_occupancy=2.0, compute_on_cpu=False)
    # computing takes its 4 ms; the worker (at 2/3 speed) makes 4 / 9 of a sample, then 6 ms x 5/9 alone
    assert m.shared_cores_rate(1) == pytest.approx(1 / (0.004 + 0.006 * 5 / 9))


def test_workers_that_keep_up_leave_the_pooled_budget_in_charge():
    m = model(cost_s={"transform": 0.004}, compute_per_sample_s=0.004, main_cpu_per_sample_s=0.004,
              workers=0, usable_cpus=2.0, main_occupancy=1.0)
    # two workers make a sample every 2 ms even at 2/3 speed: compute-bound, the shared phase never binds
    assert m.shared_cores_rate(2) is None
    assert m.rate(workers=2) == pytest.approx(min(250.0, 2 / 0.008))


def test_blocked_time_wants_no_core():
    m = model(cost_s={"transform": 0.002, "storage": 0.018}, compute_per_sample_s=0.004,
              main_cpu_per_sample_s=0.004, workers=0, usable_cpus=2.0, main_occupancy=1.0)
    # one worker, 10% of its time on a core: 1.1 cores wanted of 2, nobody waits for a core
    assert m.shared_cores_rate(1) is None
    assert m.rate(workers=1) == pytest.approx(1 / 0.020)


def test_occupancy_is_the_training_process_cpu_over_its_compute():
    from stallscope.analysis.model_from_run import build_model

    # 10 steps of 8 samples, each 40 ms: 30 ms waiting for data (loaded in process), 10 ms compute
    stats, train = _ten_steps_of_eight()
    # the sampler saw 0.44 CPU seconds: 0.24 of them loading, 0.20 computing in 0.1 s of compute: 2 cores
    m = build_model(stats, train, 4.0, 0.44)
    assert m.main_occupancy == pytest.approx(2.0)
    assert m.main_cpu_per_sample_s == pytest.approx(0.20 / 80)
    assert build_model(stats, train, 4.0, None).main_occupancy == 1.0  # no sampler: one core assumed
    assert build_model(stats, train, 1.0, 0.44).main_occupancy == 1.0  # never more than the usable cores
    assert build_model(stats, train, 4.0, 0.44, compute_on_cpu=False).compute_on_cpu is False


def test_restarted_workers_warm_up_is_taken_out_of_their_steady_cost():
    """A tenth of 2 restarted workers' CPU went into warming up new workers: the steady cost per sample is the
    rest (the epochs' own cost prices the warm-up at every restart); a run without workers has none to take out."""
    from stallscope.analysis.model_from_run import build_model

    stats, train = _ten_steps_of_eight(workers=2)
    assert build_model(stats, train, 4.0, 0.1).cost_s["transform"] == pytest.approx(0.24 / 80)
    warmed = build_model(stats, train, 4.0, 0.1, warmup_share=0.1)
    assert warmed.cost_s["transform"] == pytest.approx(0.9 * 0.24 / 80)
    assert warmed.cost_s["storage"] == pytest.approx(0.06 / 80)  # blocked time stays
    stats, train = _ten_steps_of_eight(workers=0)
    assert build_model(stats, train, 4.0, 0.44, warmup_share=0.1).cost_s["transform"] == pytest.approx(0.24 / 80)


def test_no_predicted_gain_says_why():
    from stallscope.analysis.recommend import _no_predicted_gain
    from stallscope.render import words

    m = model(cost_s={"transform": 0.001}, compute_per_sample_s=0.004, main_cpu_per_sample_s=0.008,
              workers=0, usable_cpus=2.0, main_occupancy=2.0)
    rec = _no_predicted_gain(m, 0)
    assert rec.id == "no-predicted-gain" and rec.predicted_speedup is None and rec.overrides == {}
    assert rec.facts["reason"] == "compute-takes-the-cores"
    said = words.recommendation(rec)
    assert said.title == "No change is predicted to help"
    assert "keeps 2.0 of 2.0 usable cores busy while it computes: a worker would take its core" in said.reason


def test_shared_memory_costs_count_only_with_workers():
    # 0.5 ms of collate into shared memory per sample (worker CPU) and 0.1 ms to map it and read it once in the
    # training process, which computes on a GPU: its copy to the device reads it once
    m = model(workers=0, shm_write_per_sample_s=0.0005, shm_read_per_sample_s=0.0001, worker_only_basis="typical",
              compute_on_cpu=False)
    assert m.rate() == pytest.approx(1 / 0.010)  # without workers: 8 ms loading + 2 ms compute, no shared memory
    assert m.rate(workers=1) == pytest.approx(1 / 0.0085)  # one worker: 8.5 ms per sample
    assert m.compute_rate(workers=1) == pytest.approx(1 / 0.0021)  # compute plus mapping each batch
    # 4 cores / (8.5 ms worker CPU + 2 ms training CPU + 0.1 ms mapping batches in the training process)
    assert m.rate(workers=8) == pytest.approx(4 / 0.0106)
    assert m.receive_s(0) == 0.0 and m.receive_s(2) == pytest.approx(0.0001)
    # a training step on the CPU reads it 4 times over (RECEIVED_BATCH_READS): 0.4 ms; the same recording moved to
    # a GPU (plan --gpus) pays one pass again
    on_cpu = replace(m, compute_on_cpu=True)
    assert on_cpu.shm_read_s() == pytest.approx(0.0004) and on_cpu.receive_s(2) == pytest.approx(0.0004)
    assert on_cpu.compute_rate(workers=1) == pytest.approx(1 / 0.0024)
    assert replace(on_cpu, compute_on_cpu=False).shm_read_s() == pytest.approx(0.0001)


def test_a_zero_worker_run_prices_shared_memory_from_its_bytes_and_the_calibration():
    from stallscope.analysis.model_from_run import build_model
    from stallscope.analysis.sample_costs import TYPICAL_SHM_WRITE_S_PER_BYTE

    stats, train = _ten_steps_of_eight()
    # 600 kB per sample; the recorder measured 2 ms extra to write 4 MB and 0.25 ms to map and read it
    calibration = {"nbytes": 4_000_000, "write_extra_ns": 2_000_000, "read_extra_ns": 250_000}
    # a training step on the CPU reads the batch 4 times over (RECEIVED_BATCH_READS); a copy to a GPU once
    m = build_model(stats, train, 2.0, None, bytes_per_sample=600_000, shm_calibration=calibration)
    assert m.shm_write_per_sample_s == pytest.approx(0.0003)
    assert m.shm_read_per_sample_s == pytest.approx(0.0000375)  # one pass, as calibrated
    assert m.shm_read_s() == pytest.approx(4 * 0.0000375)
    assert m.worker_only_basis == "measured at exit"
    on_gpu = build_model(stats, train, 2.0, None, bytes_per_sample=600_000, shm_calibration=calibration,
                         compute_on_cpu=False)
    assert on_gpu.shm_read_s() == pytest.approx(0.0000375)
    assert on_gpu.worker_only_basis == "measured at exit"
    typical = build_model(stats, train, 2.0, None, bytes_per_sample=600_000, compute_on_cpu=False)
    assert typical.shm_write_per_sample_s == pytest.approx(600_000 * TYPICAL_SHM_WRITE_S_PER_BYTE)
    assert typical.worker_only_basis == "typical"
    unknown = build_model(stats, train, 2.0, None)
    assert unknown.shm_write_per_sample_s == 0.0 and unknown.worker_only_basis is None
    _, with_workers = _ten_steps_of_eight(workers=2)
    measured = build_model(stats, with_workers, 2.0, None, bytes_per_sample=600_000, shm_calibration=calibration)
    assert measured.shm_write_per_sample_s == 0.0  # a run with workers measured it in their collate


def test_waiting_for_a_workers_descriptors_is_the_training_processs_serial_time():
    from stallscope.analysis.model_from_run import build_model

    # 10 steps of 8 samples, 40 ms each: 30 ms in next(), of which 2 ms rebuilding the batch (0.4 ms of CPU,
    # the rest waiting for the worker to hand over its tensors' descriptors), 10 ms compute
    stats, train = _ten_steps_of_eight(workers=1, unpickle_s=0.02, unpickle_cpu_s=0.004)
    # the training process used 0.104 s of CPU: 0.1 computing (one core) and 0.004 rebuilding batches
    m = build_model(stats, train, 2.0, 0.104)
    assert m.receive_per_sample_s == pytest.approx(0.02 / 80)  # the whole wall time of taking the batches
    assert m.main_occupancy == pytest.approx(1.0)  # only the CPU part of it is taken from the occupancy
    assert m.compute_rate() == pytest.approx(1 / (0.1 / 80 + 0.02 / 80))


def test_a_single_thread_read_a_little_over_one_core_is_not_a_threaded_compute():
    # a compute-bound job with one compute thread, its occupancy read as 1.003 (the sampler's rounding, the
    # interpreter's own threads); one worker's 0.02 ms of loading per sample is all the workers do
    m = model(cost_s={"loader": 0.000013, "transform": 0.000008, "storage": 0.000001},
              compute_per_sample_s=0.00253, main_cpu_per_sample_s=0.002556, workers=1, usable_cpus=1.97,
              main_occupancy=1.003, receive_per_sample_s=0.000024, receive_cpu_per_sample_s=0.000024)
    # two workers keep up many times over: the pooled budget holds, no parallel region is held back
    assert m.shared_cores_rate(2) is None
    assert m.speedup(workers=2) == pytest.approx(1.0)
    # two compute threads really held back at each batch stay slow: 1.9 + 2 x 21/22 cores wanted of 1.97
    threaded = replace(m, main_occupancy=1.9)
    slowdown = (1.9 + 2 * 21 / 22) / 1.97
    assert threaded.shared_cores_rate(2) == pytest.approx(1 / (0.00253 * slowdown + 0.000024))


def test_waiting_for_a_busy_worker_to_hand_over_falls_with_more_workers():
    # a tokenizing job: one worker, 4.8 ms per sample of receiving of which 0.1 ms is CPU (rebuilding); the rest
    # waited for the worker, busy in a call that holds the GIL, to hand over the batch's descriptors
    m = model(cost_s={"transform": 0.005}, compute_per_sample_s=0.00025, main_cpu_per_sample_s=0.00035,
              workers=1, usable_cpus=2.0, main_occupancy=1.0,
              receive_per_sample_s=0.0048, receive_cpu_per_sample_s=0.0001)
    assert m.receive_s() == pytest.approx(0.0048)  # as recorded
    assert m.handover_wait_s(2) == pytest.approx(0.0047 / 2)  # each worker busy half as often when asked
    assert m.receive_s(2) == pytest.approx(0.0001 + 0.0047 / 2)  # the CPU part stays per sample
    assert m.receive_s(4) == pytest.approx(0.0001 + 0.0047 / 4)
    assert m.receive_s(0) == 0.0  # nothing to receive without workers
    # recorded with 2 workers, planned for 1: each worker is busy twice as often when asked
    assert replace(m, workers=2).handover_wait_s(1) == pytest.approx(0.0047 * 2)
    # a model that was never told the CPU part takes all of the receiving as CPU: no wait to scale
    assert replace(m, receive_cpu_per_sample_s=None).handover_wait_s(2) == 0.0
    assert replace(m, receive_cpu_per_sample_s=None).receive_s(2) == pytest.approx(0.0048)
    # a fix that halves the worker's work halves how long it is busy when asked: the wait halves too
    assert m.handover_wait_s(1, {"transform": 0.5}) == pytest.approx(0.0047 / 2)
    assert m.handover_wait_s(2, {"transform": 0.5}) == pytest.approx(0.0047 / 4)
    assert m.speedup(1, {"transform": 0.5}) == pytest.approx(
        min(1 / 0.0025, 2.0 / (0.0025 + 0.00035), 1 / (0.00025 + 0.0001 + 0.0047 / 2)) / (1 / (0.00025 + 0.0048)))
    # 2 workers: the compute (1 thread) and two workers want 3 cores of 2. While computing (0.25 ms x 1.5, plus
    # 0.1 ms rebuilding) the workers run at 2/3 speed; while it waits for a hand-over (2.35 ms) they have the
    # cores to themselves. They make 2 x 0.475 / 7.5 + 2 x 2.35 / 5 = 1.07 samples meanwhile: they keep up.
    assert m.shared_cores_rate(2) is None
    assert m.speedup(2) == pytest.approx(min(2 / 0.005, 2.0 / (0.005 + 0.00035), 1 / (0.00025 + 0.00245))
                                         / (1 / (0.00025 + 0.0048)))
    slower = replace(m, cost_s={"transform": 0.006})
    # 6 ms per sample: 2 x 0.475 / 9 + 2 x 2.35 / 6 = 8/9 of a sample; the last 1/9 takes 6 ms / 2 alone
    made = 2 * 0.000475 / 0.009 + 2 * 0.00235 / 0.006
    assert slower.shared_cores_rate(2) == pytest.approx(1 / (0.000475 + 0.00235 + (1 - made) * 0.006 / 2))


def test_a_cores_second_hardware_thread_adds_a_fraction_of_a_core():
    # 8 CPUs that are the two hardware threads of 4 cores: 4 busy threads get 4 cores' work done, 8 get 4 + 4 x 0.25
    m = model(usable_cpus=8.0, physical_cores=4.0, compute_on_cpu=False, main_cpu_per_sample_s=0.0, main_occupancy=0.0,
              compute_per_sample_s=0.0005)
    assert [m.core_capacity(b) for b in (2, 4, 6, 8, 12)] == pytest.approx([2.0, 4.0, 4.5, 5.0, 5.0])
    assert m.smt_speed(8) == pytest.approx(5.0 / 8)
    assert m.smt_speed(16) == pytest.approx(5.0 / 8)  # time-sharing beyond the CPUs is not the hardware threads'
    assert m.rate(workers=4) == pytest.approx(500.0)  # 4 workers, 8 ms each, a core each
    # 8 workers: each runs at 5/8 of a core, 8 / (8 ms / 0.625) = 625/s, not 1000/s
    assert m.rate(workers=8) == pytest.approx(625.0)
    assert m.speedup(workers=8) == pytest.approx(625.0 / 125.0)
    plain = replace(m, physical_cores=None)
    assert plain.rate(workers=8) == pytest.approx(1000.0)  # the same CPUs as cores of their own


def test_a_compute_beside_workers_on_shared_cores_slows_by_their_hardware_threads():
    # 4 CPUs on 2 cores; a single-threaded CPU compute (2 ms, one core) beside 3 busy workers: 4 threads, 2.5 cores
    m = model(usable_cpus=4.0, physical_cores=2.0, workers=3, cost_s={"transform": 0.024, "storage": 0.0})
    # everyone at 2.5 / 4 of a core: compute 2 ms / 0.625 = 3.2 ms; the workers make 3.2 x 3 / (24 / 0.625) = 0.25
    # samples in it, and the rest (0.75 of a sample) alone, 3 threads on 2.25 cores: 0.75 x (24 ms / 0.75) / 3 = 8 ms
    assert m.shared_cores_rate(3) == pytest.approx(1.0 / (0.0032 + 0.008))
    # the same CPUs as cores of their own: 4 threads on 4 CPUs share nothing
    assert replace(m, physical_cores=None).shared_cores_rate(3) is None


def test_costs_recorded_with_hardware_threads_busy_are_taken_at_a_cores_speed():
    from stallscope.analysis.model_from_run import build_model

    # 4 CPUs on 2 cores, one worker: 2 threads busy on 2 cores (a core each), costs as measured
    stats, train = _ten_steps_of_eight(workers=1)
    alone = build_model(stats, train, 4.0, main_cpu_s=0.05, physical_cores=2.0)
    assert alone.cost_s["transform"] == pytest.approx(0.24 / 80)
    # on 1 core with 2 hardware threads, a training process busier on the CPU (0.3 s over the 0.4 s): the run kept
    # 1.35 threads busy (200 samples/s x (3 + 3.75) ms of CPU per sample), each at (1 + 0.25 x 0.35) / 1.35 of a
    # core; the costs are scaled to a core's speed
    one_core = build_model(stats, train, 2.0, main_cpu_s=0.3, physical_cores=1.0)
    busy = 200.0 * (0.003 + 0.3 / 80)
    speed = (1.0 + 0.25 * (busy - 1.0)) / busy
    assert busy == pytest.approx(1.35) and speed == pytest.approx(0.8056, abs=1e-4)
    assert one_core.cost_s["transform"] == pytest.approx(0.003 * speed)
    assert one_core.main_cpu_per_sample_s == pytest.approx(0.3 / 80 * speed)
    assert one_core.compute_per_sample_s == pytest.approx(0.1 / 80)  # the compute's wall time stays as measured
    # 2 CPUs as cores of their own: nothing to take out
    assert build_model(stats, train, 2.0, main_cpu_s=0.3).cost_s["transform"] == pytest.approx(0.003)


def test_a_recorded_run_whose_cpus_were_hardware_threads_of_fewer_cores_is_modelled_with_them():
    """A real session (0 workers on 2 CPUs) with the doctor's check saying the 2 CPUs are one core's two threads."""
    from pathlib import Path

    from stallscope.analysis import analyze
    from stallscope.session import Session

    session = Session.load(Path(__file__).parent.parent / "data" / "summaries" / "image-pipeline" / "session.json")
    checks = [dict(c, data={**c["data"], "physical_cores": 1}) if c["id"] == "cpu.usable" else c for c in session.checks]
    plain, smt = analyze(session), analyze(replace(session, checks=checks))
    assert plain.capacity.model.physical_cores is None
    assert smt.capacity.model.physical_cores == pytest.approx(1.0 * smt.capacity.model.usable_cpus / 2)
    (advice,) = [r for r in smt.recommendations if r.id == "num-workers"]
    (plain_advice,) = [r for r in plain.recommendations if r.id == "num-workers"]
    assert advice.predicted_speedup < plain_advice.predicted_speedup
    assert advice.facts["threads_per_core"] == 2.0


def test_cpus_that_are_each_a_core_stay_so_whatever_other_programs_took():
    """3 CPUs on 3 cores, less a fraction other programs kept busy: no hardware threads appear (no rounding)."""
    from pathlib import Path

    from stallscope.analysis import analyze
    from stallscope.session import Session

    session = Session.load(Path(__file__).parent.parent / "data" / "summaries" / "image-pipeline" / "session.json")
    checks = [dict(c, data={**c["data"], "usable": 3, "affinity": 3, "physical_cores": 3})
              if c["id"] == "cpu.usable" else c for c in session.checks]
    three = analyze(replace(session, checks=checks, environment={**session.environment, "cpu_count": 3}))
    model = three.capacity.model
    assert 2.9 < model.usable_cpus < 3.0  # other programs' share taken off
    assert model.physical_cores is None
    assert all("threads_per_core" not in r.facts for r in three.recommendations)


# --- what a CPU second costs under the load a configuration puts on the cores (issue 16) ---

def _recorded_alone(**kw) -> ThroughputModel:
    """0 workers on 2 CPUs: 4 ms of loading CPU and 1 ms of compute per sample, one thread busy (200/s)."""
    base = dict(cost_s={"decode": 0.002, "transform": 0.002, "loader": 0.0, "storage": 0.0},
                compute_per_sample_s=0.001, main_cpu_per_sample_s=0.001, workers=0, usable_cpus=2.0,
                recorded_load_cost=1.0)
    base.update(kw)
    return ThroughputModel(**base)


def test_a_cpu_second_costs_more_as_the_cores_fill_and_more_again_once_threads_outnumber_them():
    from stallscope.analysis.cpu_load import ALL_CORES_BUSY_COST, TIME_SHARING_COST

    assert (ALL_CORES_BUSY_COST, TIME_SHARING_COST) == (0.04, 0.08)
    m = model(usable_cpus=4.0)
    assert m.load_cost(1.0) == pytest.approx(1.0)  # one thread: the cost every single-threaded run measured
    assert m.load_cost(2.5) == pytest.approx(1.02)  # half the way from one core busy to all four
    assert m.load_cost(4.0) == pytest.approx(1.04)
    assert m.load_cost(6.0) == pytest.approx(1.08)  # 1.5 threads per CPU: half the time-sharing cost
    assert m.load_cost(8.0) == m.load_cost(20.0) == pytest.approx(1.12)  # switching does not get more frequent
    # 4 CPUs that are 2 cores' hardware threads: the cores are all busy at 2 threads (SMT_YIELD prices the rest)
    assert model(usable_cpus=4.0, physical_cores=2.0).load_cost(2.0) == pytest.approx(1.04)
    # one CPU: nothing to share but time
    assert model(usable_cpus=1.0).load_cost(1.0) == pytest.approx(1.0)
    assert model(usable_cpus=1.0).load_cost(1.5) == pytest.approx(1.04)


def test_busy_threads_count_each_thread_while_it_runs_or_waits_for_a_core():
    m = _recorded_alone()
    assert m.busy_threads(0, None, 200.0) == pytest.approx(1.0)  # loading and computing on one thread
    assert m.busy_threads(0, None, 100.0) == pytest.approx(0.5)  # half the time blocked elsewhere
    # 2 workers at 400/s on 2 CPUs: 3 threads want a core while the training computes, so each waits half again
    # as long (stretch 1.5): the workers' 1.6 CPU seconds a second are 2 threads at all times (no more: there are
    # 2), the compute's 0.4 is 0.6 of the time
    assert m.busy_threads(2, None, 400.0) == pytest.approx(2.0 + 0.6)
    # a slow compute sets the pace: the workers' 0.4 CPU seconds a second, stretched the same
    slow = _recorded_alone(compute_per_sample_s=0.010, main_cpu_per_sample_s=0.010)
    assert slow.busy_threads(2, None, 100.0) == pytest.approx(1.0 + 100 * 0.004 * 1.5)
    # workers blocked on storage half of their time want 2 x 0.5 cores: no one waits for a core
    blocked = _recorded_alone(cost_s={"decode": 0.002, "storage": 0.002})
    assert blocked.busy_threads(2, None, 400.0) == pytest.approx(0.4 + 400 * 0.002)
    # a compute on a GPU is not stretched by the cores' queue
    gpu = _recorded_alone(compute_on_cpu=False)
    assert gpu.busy_threads(2, None, 400.0) == pytest.approx(2.0 + 0.4)


def test_the_rate_prices_cpu_work_at_the_load_of_the_configuration_against_the_recorded_one():
    m = _recorded_alone()
    assert m.rate() == pytest.approx(200.0) and m.load_costs() == pytest.approx((1.0, 1.0))
    # 2 workers: 400/s at the recorded cost (the CPU budget: 2 cores / 5 ms). Both workers stay busy, and the
    # compute, stretched by 3 threads wanting 2 CPUs, adds 1.5 * rate * its priced 1 ms: x threads per CPU beyond
    # one cost the workers' CPU second 1 + 0.04 (all cores busy) + 0.08 x, the compute's 1 + 0.04 + 0.1 x; the
    # workers' is dearer again by 0.3 of the share of the time the training computes beside them (rate * its
    # priced 1 ms), and the rate is the budget at those prices; the four agree at:
    workers, compute = m.load_costs(2)
    rate = m.rate(workers=2)
    x = (2 + 1.5 * rate * 0.001 * compute) / 2 - 1
    share = rate * 0.001 * compute
    assert m.computing_share(2, rate) == pytest.approx(rate * 0.001)  # at the recorded price; priced, as above
    assert workers == pytest.approx((1.04 + 0.08 * x) * (1 + 0.3 * share))
    assert compute == pytest.approx(1.04 + 0.1 * x)
    assert rate == pytest.approx(2 / (0.004 * workers + 0.001 * compute))
    assert (workers, compute, rate) == pytest.approx((1.1797, 1.0677, 345.63), rel=1e-4)
    assert m.cpu_second_cost(2) == workers
    assert m.speedup(workers=2) == pytest.approx(rate / 200)
    # planned for one CPU: 200/s with 2 workers at the recorded cost, 2.6 threads on it: the full time-sharing costs,
    # and no compute beside the workers (it takes turns with them on the one CPU)
    one = replace(m, usable_cpus=1.0)
    assert one.computing_share(2, 200.0) == 0.0
    assert one.load_costs(2) == pytest.approx((1.08, 1.1))
    assert one.rate(workers=2) == pytest.approx(1 / (0.004 * 1.08 + 0.001 * 1.1))
    # a model without a recorded load (hand-built, or an older caller) is priced as recorded
    assert replace(m, recorded_load_cost=None).rate(workers=2) == pytest.approx(400.0)


def test_the_training_process_pays_more_for_sharing_its_core_than_the_workers():
    """A training step's working set (weights, activations) is evicted at every switch on a shared core; a
    decode streams through its image: one thread more than the CPUs costs the compute 10%, a worker 8%."""
    from stallscope.analysis.cpu_load import COMPUTE_TIME_SHARING_COST

    assert COMPUTE_TIME_SHARING_COST == 0.1
    m = model(usable_cpus=4.0)
    assert m.load_cost(4.0, compute=True) == pytest.approx(1.04)  # all cores busy: as the workers' work
    assert m.load_cost(6.0, compute=True) == pytest.approx(1.09)  # 1.5 threads per CPU: half of it
    assert m.load_cost(8.0, compute=True) == m.load_cost(20.0, compute=True) == pytest.approx(1.14)
    # a model recorded with its compute sharing the CPU: a quieter configuration is cheaper for the compute, as
    # much as the recorded load cost it (2 threads on 1 CPU: 1.4), the workers' work by their 1.12
    shared = _recorded_alone(workers=1, usable_cpus=1.0, recorded_load_cost=1.12, recorded_compute_load_cost=1.4)
    assert shared.load_costs(0) == pytest.approx((1 / 1.12, 1 / 1.4))
    assert shared.rate(workers=0) == pytest.approx(1 / (0.004 / 1.12 + 0.001 / 1.4))
    # without its own recorded figure (an older caller), the compute is priced against the workers' recorded load
    older = replace(shared, recorded_compute_load_cost=None)
    assert older.load_costs(0) == pytest.approx((1 / 1.12, 1 / 1.12))


def test_workers_pay_more_for_a_cpu_second_while_the_training_computes_beside_them():
    """A training step on the CPU is a heavier neighbour than another worker: the share of the time it computes
    beside the workers, on another core, makes their CPU second dearer by up to COMPUTE_NEIGHBOUR_COST."""
    from stallscope.analysis.cpu_load import COMPUTE_NEIGHBOUR_COST

    assert COMPUTE_NEIGHBOUR_COST == 0.3
    m = _recorded_alone()
    assert m.computing_share(0, 200.0) == 0.0  # no workers: the training loads and computes in turn
    assert m.computing_share(2, 400.0) == pytest.approx(0.4)  # 400/s x 1 ms
    assert m.computing_share(2, 2000.0) == 1.0  # all of the time at most
    assert replace(m, usable_cpus=1.5).computing_share(2, 400.0) == pytest.approx(0.2)  # half a CPU beside it
    assert replace(m, compute_on_cpu=False).computing_share(2, 400.0) == 0.0  # a GPU's compute: no CPU neighbour
    # a step time given for the target (plan --step-ms on a CPU machine) is still a compute beside the workers
    assert replace(m, compute_priced=False).computing_share(2, 400.0) == pytest.approx(0.4)
    # 2 CPUs that are one core's hardware threads: SMT_YIELD prices what they share, not this
    assert replace(m, physical_cores=1.0).computing_share(2, 400.0) == 0.0
    # recorded with 2 workers beside a compute 30% of the time: the workers' recorded costs hold 1.09 of it, so
    # a configuration whose compute is beside them 40% of the time prices their CPU second at 1.12 / 1.09 of it
    loaded = _recorded_alone(workers=2, recorded_load_cost=1.04, recorded_computing_share=0.3)
    workers, _ = loaded.load_costs(2)
    rate = loaded.rate(workers=2)
    busy = loaded.cpu_slowed(*loaded.load_costs(2)).busy_threads(2, None, rate)
    share = loaded.cpu_slowed(*loaded.load_costs(2)).computing_share(2, rate)
    assert workers == pytest.approx(loaded.load_cost(busy) * (1 + 0.3 * share) / (1.04 * (1 + 0.3 * 0.3)))
    # a slowed model (priced already) carries no recorded share, as it carries no recorded load
    assert loaded.cpu_slowed(1.1).recorded_computing_share is None


def test_a_model_recorded_under_load_prices_a_quieter_configuration_cheaper():
    """Recorded with 2 workers on 2 busy CPUs (load cost 1.156): back to 0 workers, one thread, costs less."""
    loaded = _recorded_alone(workers=2, recorded_load_cost=1.156)
    assert loaded.cpu_second_cost(0) == pytest.approx(1 / 1.156)
    assert loaded.rate(workers=0) == pytest.approx(200 * 1.156)


def test_the_priced_rate_never_rises_as_the_compute_gets_slower():
    """Near the point where the compute takes over the pace, the load is read continuously: a slower GPU step is
    never predicted faster (8 workers on 2 CPUs, 4 ms of decode each)."""
    rates = [ThroughputModel({"decode": 0.004}, compute, 0.001, 8, 2.0, compute_on_cpu=False,
                             recorded_load_cost=1.0).rate()
             for compute in (0.0020, 0.0024, 0.00245, 0.00249, 0.0025, 0.0030, 0.0040)]
    assert all(later <= earlier + 1e-9 for earlier, later in zip(rates, rates[1:]))


def test_a_slowed_model_stretches_cpu_work_but_not_blocked_time_nor_a_gpus_compute():
    m = _recorded_alone(cost_s={"decode": 0.002, "storage": 0.003}, receive_per_sample_s=0.0005,
                        receive_cpu_per_sample_s=0.0002, shm_write_per_sample_s=0.0001, compute_on_cpu=False)
    slowed = m.cpu_slowed(1.5)
    assert slowed.cost_s == {"decode": pytest.approx(0.003), "storage": 0.003}
    assert slowed.compute_per_sample_s == 0.001  # on the GPU
    assert slowed.main_cpu_per_sample_s == pytest.approx(0.0015)
    assert slowed.shm_write_per_sample_s == pytest.approx(0.00015)
    assert slowed.receive_cpu_s() == pytest.approx(0.0003)
    assert slowed.receive_per_sample_s == pytest.approx(0.0006)  # the wait for a worker's hand-over stays
    assert slowed.recorded_load_cost is None and slowed.recorded_compute_load_cost is None
    assert _recorded_alone().cpu_slowed(1.5).compute_per_sample_s == pytest.approx(0.0015)  # on the CPU
    # the training process's own work at its own price: its compute and CPU, but not its rebuilding of batches
    # (0.2 ms of its 1 ms with a worker) nor the workers' work
    own = _recorded_alone(workers=1, receive_per_sample_s=0.0002, receive_cpu_per_sample_s=0.0002).cpu_slowed(1.1, 1.5)
    assert own.compute_per_sample_s == pytest.approx(0.0015)
    assert own.main_cpu_per_sample_s == pytest.approx(0.0008 * 1.5 + 0.0002 * 1.1)
    assert own.receive_cpu_s() == pytest.approx(0.0002 * 1.1) and own.cost_s["decode"] == pytest.approx(0.0022)
    on_gpu = _recorded_alone(compute_on_cpu=False).cpu_slowed(1.1, 1.5)  # its Python and launches: as the workers'
    assert on_gpu.compute_per_sample_s == 0.001 and on_gpu.main_cpu_per_sample_s == pytest.approx(0.0011)


def test_a_built_model_records_the_load_its_costs_were_measured_under():
    from stallscope.analysis.model_from_run import build_model

    stats, train = _ten_steps_of_eight(workers=0)
    m = build_model(stats, train, 2.0, main_cpu_s=0.34)
    assert m.recorded_load_cost == pytest.approx(m.load_cost(m.busy_threads(0, None, m.rate())))
    assert m.recorded_compute_load_cost == pytest.approx(m.load_cost(m.busy_threads(0, None, m.rate()), compute=True))
    assert m.cpu_second_cost() == pytest.approx(1.0)  # the recorded configuration is priced as measured
    assert m.cpu_second_cost(2) > 1.0
    assert m.recorded_computing_share == 0.0  # no workers: nothing computed beside them
    loaded = build_model(*_ten_steps_of_eight(workers=2), 2.0, main_cpu_s=0.34)
    assert loaded.recorded_computing_share == pytest.approx(loaded.computing_share(2, loaded._rate(2, None)))
    assert loaded.recorded_computing_share > 0.0 and loaded.cpu_second_cost() == pytest.approx(1.0)


def _eight_threads_on_eight_cores(**kw) -> ThroughputModel:
    """8 cores; a CPU compute on 8 threads keeps all 8 busy (2 ms per sample, 16 ms of CPU); 12 ms of loading."""
    return model(cost_s={"transform": 0.012}, compute_per_sample_s=0.002, main_cpu_per_sample_s=0.016, workers=0,
                 usable_cpus=8.0, main_occupancy=8.0, compute_threads=8, **kw)


def test_fewer_compute_threads_spread_the_same_cpu_work_and_leave_cores_to_workers():
    m = _eight_threads_on_eight_cores()
    four = m.with_compute_threads(4)
    assert four.compute_per_sample_s == pytest.approx(0.004) and four.main_occupancy == 4.0
    assert four.main_cpu_per_sample_s == pytest.approx(0.016) and four.compute_threads == 4
    # 4 threads and 4 workers want the 8 cores and no more: nothing held back. The compute's 4 ms sets the pace
    # (workers 4 / 12 ms = 333/s, CPU budget 8 / 28 ms = 286/s)
    assert four.rate(4) == pytest.approx(250.0)
    assert m.rate(0) == pytest.approx(1 / 0.014)
    # the same 4 workers beside all 8 threads hold every parallel region back: the compute at one core's speed
    assert m.rate(4) == pytest.approx(1 / 0.016)
    # what the recorded threads burned beyond their work (spinning at a region's end) goes with them
    spinning = replace(m, main_cpu_per_sample_s=0.030)
    assert spinning.with_compute_threads(2).main_cpu_per_sample_s == pytest.approx(0.008 * 2)
    # unchanged: as many threads as it kept busy, a GPU compute, threads not recorded
    assert m.with_compute_threads(8) is m and m.with_compute_threads(12) is m
    assert replace(m, compute_on_cpu=False).with_compute_threads(4).compute_per_sample_s == 0.002
    assert replace(m, compute_threads=None).with_compute_threads(4).compute_per_sample_s == 0.002


def test_splitting_the_cores_is_recommended_where_workers_alone_would_hold_the_compute_back():
    from stallscope.analysis.recommend import _split_the_cores
    from stallscope.render import words

    m = _eight_threads_on_eight_cores()
    rec = _split_the_cores(m, 0, None, 1.0)
    # 7 threads leave 1 core (83/s), 6 leave 2 (167/s), 5 threads and 3 workers 250/s; 4 threads gain nothing more
    assert rec.id == "split-the-cores" and rec.overrides == {"torch_threads": 5, "num_workers": 3}
    assert rec.predicted_speedup == round(250 * 0.014, 2)
    assert rec.facts["split_compute_s_per_sample"] == pytest.approx(0.0032)
    said = words.recommendation(rec)
    assert said.title == "Split the cores: 5 compute threads (now 8) and 3 DataLoader workers (now 0)"
    assert said.change.startswith("--set torch_threads=5 --set num_workers=3")
    assert "torch.set_num_threads(5) at the start of training, and DataLoader(..., num_workers=3)" in said.change
    assert "keeping 8.0 of 8.0 usable cores busy" in said.reason and "3.20 ms per sample instead of 2.00" in said.reason
    # not where workers alone do as well, nor for a single thread or a GPU's compute
    assert _split_the_cores(m, 0, None, 3.5) is None
    assert _split_the_cores(replace(m, compute_threads=1), 0, None, 1.0) is None
    assert _split_the_cores(replace(m, compute_on_cpu=False), 0, None, 1.0) is None


def test_a_split_asks_for_no_more_workers_than_cpus_unless_they_wait_on_storage():
    """2 CPUs, 2 compute threads; 6 ms of transform and 1 ms blocked on storage per sample. With 1 thread the model
    gives 3 workers 244.6/s against 2 workers' 233.0/s (their CPU bursts wait for a core, ``queued_rate``), but a split shares the cores out and torch warns of more
    workers than CPUs: 2. Where the workers mostly wait on storage, more than the CPUs stay allowed."""
    from stallscope.analysis.recommend import _split_the_cores

    m = model(cost_s={"transform": 0.006, "storage": 0.001}, compute_per_sample_s=0.001,
              main_cpu_per_sample_s=0.002, workers=0, usable_cpus=2.0, main_occupancy=2.0, compute_threads=2)
    split = m.with_compute_threads(1)
    assert split.rate(3) == pytest.approx(244.58, abs=0.01) and split.rate(2) == pytest.approx(232.98, abs=0.01)
    assert _split_the_cores(m, 0, None, 1.0).overrides == {"torch_threads": 1, "num_workers": 2}
    waiting = replace(m, cost_s={"transform": 0.001, "storage": 0.030})
    assert _split_the_cores(waiting, 0, None, 1.0).overrides["num_workers"] > 2
    # the CPUs are counted whole: other programs' 3% of a core leave 1.97 usable, still room for 2 workers (a 1.97
    # read as 1 held a recorded 2-thread compute on 2 cores to a single worker, which gains nothing)
    busy_host = replace(m, usable_cpus=1.97, main_occupancy=1.97)
    assert _split_the_cores(busy_host, 0, None, 1.0).overrides == {"torch_threads": 1, "num_workers": 2}


def test_a_worker_count_is_held_to_the_usable_cpus_counted_whole():
    from stallscope.analysis.recommend import whole_cpus

    assert [whole_cpus(c) for c in (0.3, 1.0, 1.5, 1.74, 1.75, 1.97, 2.0, 7.6)] == [1, 1, 1, 1, 2, 2, 2, 7]


def test_a_compute_busier_than_torchs_threads_is_not_advised_torch_threads():
    """8 cores busy with 4 torch threads recorded: the rest are another library's (OpenBLAS, onnxruntime), which
    torch.set_num_threads would not change."""
    from stallscope.analysis.recommend import _split_the_cores

    assert _split_the_cores(replace(_eight_threads_on_eight_cores(), compute_threads=4), 0, None, 1.0) is None


def test_other_programs_load_is_said_beside_the_evidence_and_taken_off_the_cpus():
    """A real session (2 CPUs, the host's too): the cores other programs kept busy are this analysis's other_cpus,
    taken off the model's CPUs, and said in the evidence once they reach a quarter of a core."""
    from pathlib import Path

    from stallscope.analysis import analyze
    from stallscope.render import words
    from stallscope.session import Session

    session = Session.load(Path(__file__).parent.parent / "data" / "summaries" / "image-pipeline" / "session.json")
    analysis = analyze(session)
    assert analysis.other_cpus == pytest.approx(analysis.usable_cpus - analysis.capacity.model.usable_cpus)
    busy = replace(analysis, other_cpus=1.0)
    (said,) = [line for line in words.evidence(busy) if line.startswith("other programs")]
    assert said.startswith(f"other programs kept 1.0 of the {analysis.usable_cpus} CPUs busy during these steps: "
                           f"this job had about {analysis.usable_cpus - 1.0:.1f} for itself")
    assert not any(line.startswith("other programs") for line in words.evidence(replace(analysis, other_cpus=0.2)))


def test_an_input_stage_named_beside_a_larger_compute_says_why():
    from pathlib import Path

    from stallscope.analysis import analyze
    from stallscope.render import words
    from stallscope.session import Session

    session = Session.load(Path(__file__).parent.parent / "data" / "summaries" / "image-pipeline" / "session.json")
    analysis = analyze(session)
    stage = analysis.bottleneck_node
    assert stage not in (None, "compute")
    larger = replace(analysis, node_seconds={stage: 0.31, "compute": 0.69}, bottleneck_share=0.31)
    assert words.beside_compute(larger) == ("; the input stage the training waits for most, beside 69% of "
                                            "computing, which no input change shortens")
    assert words.beside_compute(replace(larger, node_seconds={stage: 0.6, "compute": 0.4}, bottleneck_share=0.6)) == ""


def _two_waiting_workers_on_one_core(**kw) -> ThroughputModel:
    """Two workers that each wait 40 ms on storage and compute 10 ms per sample, one core, a training process that
    takes no CPU of its own (a GPU's compute)."""
    base = dict(cost_s={"transform": 0.010, "storage": 0.040}, compute_per_sample_s=0.001, main_cpu_per_sample_s=0.0,
                workers=2, usable_cpus=1.0, main_occupancy=0.0, compute_on_cpu=False)
    base.update(kw)
    return ThroughputModel(**base)


def test_workers_that_wake_at_random_wait_for_a_core_the_others_hold():
    # Each finds the other on the core for its share f = (r/2) R of the time: R = 10 ms (1 + f) and r = 2 / (40 + R)
    # give R^2 + 20 R - 400 = 0, R = 12.36 ms, r = 2 / 52.36 ms = 38.20/s, under the pooled 2 / 50 ms = 40/s.
    m = _two_waiting_workers_on_one_core()
    assert m.pipeline_rate() == pytest.approx(40.0)
    assert m.queued_cpu_s(2, 0.010, 38.197) == pytest.approx(0.01236, abs=1e-5)
    assert m.rate() == pytest.approx(2 / (0.040 + (-0.020 + (0.020 ** 2 + 4 * 0.0004) ** 0.5) / 2), rel=1e-6)
    assert m.rate() == pytest.approx(38.197, abs=1e-3)


def test_a_single_worker_or_a_core_for_each_thread_waits_for_no_core():
    # One worker's work is paced by the training process's batches (the shared-cores phases price that), and two
    # workers on two cores with a training process that takes none never find a core taken.
    assert _two_waiting_workers_on_one_core(workers=1).rate() == pytest.approx(1 / 0.050)
    assert _two_waiting_workers_on_one_core().queued_rate(1, None, 20.0) is None
    assert _two_waiting_workers_on_one_core(usable_cpus=2.0).queued_rate(2, None, 40.0) is None
    assert _two_waiting_workers_on_one_core(usable_cpus=2.0).rate() == pytest.approx(40.0)
    # workers that never wait on storage are always runnable: the budget and the shared-cores phases price them
    assert _two_waiting_workers_on_one_core(cost_s={"transform": 0.010}).queued_rate(2, None, 100.0) is None


def test_the_training_processs_cpu_is_found_on_the_core_too():
    # 5 ms of the training process's CPU per sample, at 30 samples/s: each worker is on the core 15 R of the time,
    # the training process 0.15 (1 + 2 x 15 R) (slowed by the workers it finds); R = 10 ms (1 + 15 R + 0.15 + 4.5 R)
    # gives R = 11.5 ms / 0.805 = 14.286 ms, against 12.36 ms without it.
    busy = _two_waiting_workers_on_one_core(main_cpu_per_sample_s=0.005, main_occupancy=1.0)
    assert busy.queued_cpu_s(2, 0.010, 30.0) == pytest.approx(0.0115 / 0.805, rel=1e-6)
    rate = busy.rate()
    assert rate < _two_waiting_workers_on_one_core().rate()
    assert rate == pytest.approx(2 / (0.040 + busy.queued_cpu_s(2, 0.010, rate)), rel=1e-6)


def test_no_queueing_term_where_the_blocked_time_holds_the_waits_for_a_core_already():
    # a kernel without run-queue figures: the wait for a core was counted as blocked time, not to be added again
    blind = _two_waiting_workers_on_one_core(blocked_holds_core_waits=True)
    assert blind.queued_rate(2, None, 40.0) is None and blind.rate() == pytest.approx(40.0)


def test_intra_op_threads_spinning_while_the_process_loads_are_not_a_load_on_the_cores():
    """Recorded with 0 workers on 2 CPUs, a compute on 2 threads: 1 ms per sample on both cores (2 ms of work),
    and 4 ms of the process's CPU per sample: the other 2 ms are the second thread spinning while the first loaded
    batches (OpenMP's wait). The recorded load counts the work: at 160/s, 4 ms of loading and 2 ms of compute keep
    0.96 threads busy, not 1.28 (which would price every CPU second it measured 3% dearer than it was)."""
    spun = _recorded_alone(main_cpu_per_sample_s=0.004, main_occupancy=2.0, compute_threads=2)
    assert spun.working_cpu_s() == pytest.approx(0.002)
    assert spun.busy_threads(0, None, 160.0) == pytest.approx(160 * (0.004 + 0.002))
    assert spun.load_cost(spun.busy_threads(0, None, 160.0)) == pytest.approx(1.0)
    # a compute on a GPU keeps its process's CPU as it is (Python, launches), and so does one thread's compute
    assert replace(spun, compute_on_cpu=False).working_cpu_s() == 0.004
    assert _recorded_alone().working_cpu_s() == 0.001
    # nothing is received without workers: a recording with them does not lend its rebuilding to 0 workers' load
    assert replace(spun, receive_per_sample_s=0.0005, receive_cpu_per_sample_s=0.0003).working_cpu_s() == (
        pytest.approx(0.002))
    # 2 threads on 4 CPUs: the occupancy read from the process's CPU (spin and all) is capped at the threads
    wide = replace(spun, usable_cpus=4.0, main_cpu_per_sample_s=0.006, main_occupancy=4.0)
    assert wide.working_cpu_s() == pytest.approx(0.002)


@pytest.mark.parametrize("cpus", [1.0, 2.0, 4.0])
@pytest.mark.parametrize("compute", [0.0005, 0.001, 0.004])
def test_the_two_load_costs_are_a_fixed_point_of_the_load_they_price(cpus, compute):
    """``load_costs`` stops after ``LOAD_PASSES``: what it returns must price a load that gives the same costs
    back, for the workers' work and the compute's, from an idle configuration to one that time-shares."""
    from stallscope.analysis.cpu_load import COMPUTE_NEIGHBOUR_COST

    m = _recorded_alone(usable_cpus=cpus, compute_per_sample_s=compute, main_cpu_per_sample_s=compute,
                        recorded_compute_load_cost=1.0)
    for workers in range(0, 6):
        costs = m.load_costs(workers)
        slowed = m.cpu_slowed(*costs)
        rate = slowed._rate(workers, None)
        busy = slowed.busy_threads(workers, None, rate)
        neighbour = 1.0 + COMPUTE_NEIGHBOUR_COST * slowed.computing_share(workers, rate)
        assert costs == pytest.approx((m.load_cost(busy) * neighbour, m.load_cost(busy, compute=True)), abs=1e-5)


def test_a_compute_recorded_with_more_threads_than_cpus_is_credited_their_waits_when_cut_to_the_cpus():
    """2 threads on 1 CPU computed for 1.55 ms per sample: 1 ms of one thread's time and 0.55 of waiting at each
    parallel region for the thread without a CPU (OVERSUBSCRIBED_THREAD_COST). Cut to 1 thread: 1 ms."""
    from stallscope.analysis.model_from_run import build_model
    from stallscope.analysis.sample_costs import OVERSUBSCRIBED_THREAD_COST

    assert OVERSUBSCRIBED_THREAD_COST == pytest.approx(0.55)
    m = model(cost_s={"transform": 0.004}, compute_per_sample_s=0.00155, main_cpu_per_sample_s=0.00155, workers=0,
              usable_cpus=1.0, main_occupancy=1.0, compute_threads=2, compute_oversubscribed=True)
    assert m.one_thread_compute_s() == pytest.approx(0.001)
    one = m.with_compute_threads(1)
    assert one.compute_per_sample_s == pytest.approx(0.001) and one.main_cpu_per_sample_s == pytest.approx(0.001)
    assert one.compute_threads == 1 and one.main_occupancy == 1.0 and one.compute_oversubscribed is False
    # 4 threads on 2 CPUs: 1 + 0.55 * 2 one-thread times; cut to 2, the one-thread time over 2 (ideal), to 3 (still
    # more than the CPUs) as recorded
    four = replace(m, usable_cpus=2.0, main_occupancy=2.0, compute_threads=4, compute_per_sample_s=0.0021,
                   main_cpu_per_sample_s=0.0042)
    assert four.one_thread_compute_s() == pytest.approx(0.001)
    assert four.with_compute_threads(2).compute_per_sample_s == pytest.approx(0.0005)
    assert four.with_compute_threads(3) is four
    # 16 threads on 2 CPUs (torch's default in a 2-CPU container): no more than 3 beyond the CPUs are credited
    many = replace(four, compute_threads=16, compute_per_sample_s=0.01)
    assert many.one_thread_compute_s() == pytest.approx(0.01 / (1 + 0.55 * 3))
    # not recorded so (as many CPUs as threads): the recorded time stays, as before
    plain = replace(m, compute_oversubscribed=False)
    assert plain.one_thread_compute_s() == pytest.approx(0.00155) and plain.with_compute_threads(1) is plain
    # build_model marks it from the recorded threads against the usable CPUs, for a CPU compute only
    stats, train = _ten_steps_of_eight()
    train.config["torch_threads"] = 2
    assert build_model(stats, train, 1.0, 0.44).compute_oversubscribed is True
    assert build_model(stats, train, 2.0, 0.44).compute_oversubscribed is False
    assert build_model(stats, train, 1.0, 0.44, compute_on_cpu=False).compute_oversubscribed is False


def test_work_that_takes_no_fresh_memory_pays_little_for_sharing_a_core():
    """A worker's time-sharing cost follows the page faults its work takes per CPU second: the full
    TIME_SHARING_COST at FRESH_PAGES_FOR_FULL_SHARING_COST and over, RESIDENT_TIME_SHARING_COST at none, in
    proportion between; the full cost where the faults were not counted (an older session)."""
    from stallscope.analysis.cpu_load import (FRESH_PAGES_FOR_FULL_SHARING_COST, RESIDENT_TIME_SHARING_COST,
                                              TIME_SHARING_COST)

    assert (RESIDENT_TIME_SHARING_COST, FRESH_PAGES_FOR_FULL_SHARING_COST) == (0.02, 20_000.0)
    assert model().worker_sharing_cost() == TIME_SHARING_COST == 0.08
    assert model(fresh_pages_per_cpu_s=0.0).worker_sharing_cost() == pytest.approx(0.02)
    assert model(fresh_pages_per_cpu_s=5_000.0).worker_sharing_cost() == pytest.approx(0.035)
    assert model(fresh_pages_per_cpu_s=60_000.0).worker_sharing_cost() == pytest.approx(0.08)
    # on one CPU with 2 threads wanting it: the whole time-sharing cost, the workers' by their faults
    resident = model(usable_cpus=1.0, fresh_pages_per_cpu_s=1_000.0)
    assert resident.load_cost(2.0) == pytest.approx(1.023)
    assert resident.load_cost(2.0, compute=True) == pytest.approx(1.1)  # the compute's own work: as before
    assert model(usable_cpus=1.0, fresh_pages_per_cpu_s=30_000.0).load_cost(2.0) == pytest.approx(1.08)


def test_a_built_model_counts_the_fetches_faults_and_a_zero_worker_runs_shared_memory_pages():
    """The pipeline's faults per CPU second of its fetches; a 0-worker run's batches would be collated into fresh
    shared memory by workers: a page per 4096 bytes of each sample, with that collate's estimated CPU."""
    from stallscope.analysis.model_from_run import build_model

    stats, train = _ten_steps_of_eight(workers=2)
    counted = replace(train, pipeline=replace(train.pipeline, fresh_pages=480))  # 80 samples, 0.24 s of CPU
    assert build_model(stats, counted, 2.0, main_cpu_s=0.34).fresh_pages_per_cpu_s == pytest.approx(2_000.0)
    assert build_model(stats, train, 2.0, main_cpu_s=0.34).fresh_pages_per_cpu_s is None  # not counted
    stats, train = _ten_steps_of_eight(workers=0)
    counted = replace(train, pipeline=replace(train.pipeline, fresh_pages=480))
    m = build_model(stats, counted, 2.0, main_cpu_s=0.34, bytes_per_sample=40960.0)  # typical shm cost: 0.72 ns/B
    assert m.shm_write_per_sample_s == pytest.approx(40960 * 0.72e-9)
    assert m.fresh_pages_per_cpu_s == pytest.approx((480 + 80 * 10) / (0.24 + 80 * 40960 * 0.72e-9))
    assert m.fresh_pages_per_cpu_s == pytest.approx(5_281.4, rel=1e-4)

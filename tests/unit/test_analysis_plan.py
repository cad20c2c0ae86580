"""``stallscope plan``: a recorded model moved to another machine, with exact figures on hand-set costs."""

from __future__ import annotations

import pytest

from stallscope.analysis.capacity import ThroughputModel
from stallscope.analysis.plan import PlanError, Target, plan_dict, project, target_model
from stallscope.constants import PLAN_SCHEMA


def recorded(**kw) -> ThroughputModel:
    """4 ms of transform CPU per sample, 1 ms of compute on one core, recorded with 0 workers on 2 CPUs."""
    base = {"cost_s": {"decode": 0.0, "transform": 0.004, "loader": 0.0, "storage": 0.0},
                "compute_per_sample_s": 0.001, "main_cpu_per_sample_s": 0.001, "workers": 0, "usable_cpus": 2.0,
                "measured_samples_per_s": 200.0}
    base.update(kw)
    return ThroughputModel(**base)


def test_two_gpus_on_eight_cores_share_four_cores_each_and_run_out_of_cores():
    plan = project(recorded(), Target(cores=8, gpus=2, step_s=0.016), samples_per_step=16)
    rates = {r.workers: r.samples_per_s for r in plan.rows}
    # 0 workers: loading and compute add up (5 ms); then 250/s per worker until the 4 cores are spent:
    # 4 cores / (4 ms in a worker + 1 ms of the training process's core) = 800/s.
    assert rates == pytest.approx({0: 200.0, 1: 250.0, 2: 500.0, 3: 750.0, 4: 800.0, 5: 800.0, 6: 800.0})
    assert plan.compute_samples_per_s == pytest.approx(1000.0)
    assert plan.row(4).data_wait_fraction == pytest.approx(0.2)
    assert plan.row(4).total_samples_per_s == pytest.approx(1600.0)
    assert plan.row(4).cores_wanted == pytest.approx(4.0)
    assert plan.workers_needed is None and plan.best_workers == 4
    assert plan.limit == "cores" and plan.saturates_first == "transform"
    assert plan.fixes == []  # no normalization measured, no decode or storage to cut


def test_normalizing_on_the_gpu_is_priced_where_the_cores_give_out():
    plan = project(recorded(), Target(cores=8, gpus=2, step_s=0.016), samples_per_step=16, normalize_fraction=0.5)
    (fix,) = plan.fixes
    assert fix.id == "uint8-device-normalize" and fix.scale == {"transform": 0.5, "loader": 0.5}
    # 2 ms per sample: two workers make 1000/s, what the compute takes.
    assert fix.workers == 2 and fix.workers_needed == 2
    assert fix.samples_per_s == pytest.approx(1000.0) and fix.gain == pytest.approx(1.25)
    assert fix.data_wait_fraction == pytest.approx(0.0)


def test_a_step_time_or_a_job_rate_set_the_same_compute():
    by_step = project(recorded(), Target(cores=8, gpus=2, step_s=0.016), samples_per_step=16)
    by_rate = project(recorded(), Target(cores=8, gpus=2, samples_per_s=2000), samples_per_step=16)
    assert [r.samples_per_s for r in by_step.rows] == pytest.approx([r.samples_per_s for r in by_rate.rows])


def test_enough_cores_feed_the_gpu_and_name_the_worker_count():
    plan = project(recorded(), Target(cores=16, gpus=1, step_s=0.016), samples_per_step=16)
    assert plan.workers_needed == 4 and plan.limit == "fed"
    assert plan.row(4).samples_per_s == pytest.approx(1000.0)  # 4 workers x 250/s, the compute's 1000/s
    assert plan.row(3).data_wait_fraction == pytest.approx(0.25)


def test_a_cpu_target_keeps_the_recorded_compute_and_its_cores():
    model = recorded(main_occupancy=1.5, main_cpu_per_sample_s=0.0015)
    moved, notes = target_model(model, Target(cores=4), samples_per_step=16)
    assert moved.compute_on_cpu and moved.usable_cpus == 4.0
    assert moved.compute_per_sample_s == pytest.approx(0.001)
    assert moved.main_occupancy == pytest.approx(1.5) and moved.main_cpu_per_sample_s == pytest.approx(0.0015)
    assert any("as recorded" in n for n in notes)
    assert any("0 workers" in n for n in notes)  # what only workers cost was not measured
    halved, _ = target_model(model, Target(cores=4, step_s=0.008), samples_per_step=16)
    assert halved.main_cpu_per_sample_s == pytest.approx(0.00075)  # CPU per sample follows the compute time


def test_storage_bound_runs_tabulate_past_the_cores():
    model = recorded(cost_s={"decode": 0.001, "storage": 0.020}, compute_per_sample_s=0.002)
    plan = project(model, Target(cores=2, gpus=1, step_s=0.032), samples_per_step=16)
    assert plan.rows[-1].workers == 8  # blocked I/O overlaps: up to 4 per core, at least 8
    assert plan.saturates_first == "storage"


@pytest.mark.parametrize("kwargs, message", [
    ({"cores": 0}, "--cores"),
    ({"cores": float("nan")}, "--cores"),
    ({"cores": 4, "gpus": -1}, "--gpus"),
    ({"cores": 4, "step_s": 0.01, "samples_per_s": 10}, "not both"),
    ({"cores": 4, "step_s": -1}, "--step-ms"),
    ({"cores": 4, "samples_per_s": float("inf")}, "--samples-per-s"),
    ({"cores": 4, "workers": -2}, "--workers"),
    ({"cores": 4, "threads_per_core": 0.5}, "--threads-per-core"),
    ({"cores": 4, "threads_per_core": 16}, "--threads-per-core"),
    ({"cores": 4, "gpus": 1000}, "at least a core of its own"),
    ({"cores": 1e6, "gpus": 1000}, "--cores must be at most 65536"),
    ({"cores": 8192, "gpus": 100_000}, "--gpus must be at most 4096"),
    ({"cores": 4, "step_s": 1e305}, r"--step-ms must be at most 86400000 \(a day per step\)"),
    ({"cores": 4, "samples_per_s": 1e300}, "--samples-per-s must be at most 1e"),
])
def test_impossible_targets_are_refused(kwargs, message):
    with pytest.raises(PlanError, match=message):
        Target(**kwargs)


def test_the_plan_document():
    plan = project(recorded(), Target(cores=8, gpus=2, step_s=0.016, workers=3), samples_per_step=16)
    doc = plan_dict(plan, "run-1", PLAN_SCHEMA)
    assert doc["schema"] == "stallscope.plan/1" and doc["run_id"] == "run-1"
    assert doc["target"]["cores_per_process"] == 4.0 and doc["target"]["processes"] == 2
    # 750/s x (4 ms in workers + 1 ms of the training process) = 3.75 cores
    assert doc["at_workers"] == {"workers": 3, "samples_per_s": 750.0, "total_samples_per_s": 1500.0,
                                 "data_wait_fraction": 0.25, "cores_wanted": 3.75,
                                 "cpu_second_cost": 1.0,  # a hand-built model: no recorded load to price against
                                 "compute_threads": None,  # the compute is on the GPU: no threads to cut
                                 "compute_cpu_second_cost": None}  # nor a CPU compute's own price
    assert doc["workers_needed_per_process"] is None and doc["limit"] == "cores"
    assert len(doc["rows"]) == 7 and doc["assumptions"]


def test_a_gpu_run_planned_for_a_machine_without_one_needs_its_step_time():
    gpu = recorded(compute_on_cpu=False)
    with pytest.raises(PlanError, match="computed on a GPU"):
        project(gpu, Target(cores=8), samples_per_step=16)
    plan = project(gpu, Target(cores=8, step_s=0.032), samples_per_step=16)  # 2 ms per sample on that CPU
    assert plan.compute_samples_per_s == pytest.approx(500.0)


def test_the_wait_for_other_ranks_stays_in_the_recorded_compute():
    plan = project(recorded(), Target(cores=8, ranks=2), samples_per_step=16, sync_per_sample_s=0.001)
    assert plan.target.processes == 2 and plan.target.cores_per_process == 4.0
    assert plan.compute_samples_per_s == pytest.approx(500.0)  # 1 ms compute + 1 ms waiting for the other rank
    assert any("waiting for other ranks" in a for a in plan.assumptions)
    given = project(recorded(), Target(cores=8, ranks=2, step_s=0.016), samples_per_step=16, sync_per_sample_s=0.001)
    assert given.compute_samples_per_s == pytest.approx(1000.0)  # a given step time is the whole step


def test_workers_needed_never_names_a_slower_row_than_the_best():
    # Taking a batch from a worker costs the training process 0.5 ms per sample: one worker waits for nothing
    # but runs at 1/1.5 ms, slower than loading in process (1/(0.2 + 1) ms).
    model = recorded(cost_s={"transform": 0.0002}, receive_per_sample_s=0.0005, receive_cpu_per_sample_s=0.0005,
                     workers=1)
    plan = project(model, Target(cores=4, gpus=1, step_s=0.016), samples_per_step=16)
    assert plan.row(1).data_wait_fraction == 0.0
    assert plan.row(0).samples_per_s == pytest.approx(1 / 0.0012)
    assert plan.row(1).samples_per_s == pytest.approx(1 / 0.0015)
    assert plan.workers_needed is None and plan.best_workers == 0 and plan.limit == "no-worker-helps"


def test_where_the_cores_give_out_the_first_stage_is_a_cpu_stage_not_blocked_storage():
    model = recorded(cost_s={"transform": 0.004, "storage": 0.006})
    plan = project(model, Target(cores=1, gpus=1, step_s=0.016), samples_per_step=16)
    assert plan.limit == "cores" and plan.saturates_first == "transform"


def test_an_asked_worker_count_beyond_the_table_is_computed_alone():
    plan = project(recorded(), Target(cores=8, gpus=2, step_s=0.016, workers=1000), samples_per_step=16)
    assert [r.workers for r in plan.rows][-2:] == [6, 1000]
    assert plan.row(1000).samples_per_s == pytest.approx(800.0)  # the cores, as with 4 workers
    with pytest.raises(PlanError, match="between 0 and 1024"):
        Target(cores=8, workers=100_000_000)


def test_small_per_sample_figures_are_said_in_microseconds():
    from stallscope.analysis.plan import _ms

    assert _ms(0.000004) == "4 us" and _ms(0.0025) == "2.500 ms"


def test_a_target_with_hyper_threading_counts_a_cores_second_thread_as_a_quarter_core():
    # a GPU step of 4 ms (0.25 ms per sample, a core busy meanwhile) on 8 CPUs: as 8 cores the CPU budget is
    # 8 / (4 ms + 0.25 ms) = 1882/s; as 4 cores of 2 threads, every thread busy gets 4 + 4 x 0.25 = 5 cores' work
    # done: 5 / 4.25 ms = 1176/s
    target = {"cores": 8, "gpus": 1, "step_s": 0.004}
    cores = project(recorded(), Target(**target), samples_per_step=16)
    threads = project(recorded(), Target(**target, threads_per_core=2), samples_per_step=16)
    assert max(r.samples_per_s for r in cores.rows) == pytest.approx(8 / 0.00425)
    assert max(r.samples_per_s for r in threads.rows) == pytest.approx(5 / 0.00425)
    assert threads.row(3).samples_per_s == pytest.approx(750.0)  # 3 workers and the training process: a core each
    assert threads.row(4).samples_per_s < cores.row(4).samples_per_s == pytest.approx(1000.0)  # 5 threads, 4 cores
    assert threads.limit == "cores" and threads.row(8).cores_wanted == pytest.approx(5.0)
    assert any("8 CPU(s) per process are 4 core(s) with 2 hardware threads each (given)" in n
               for n in threads.assumptions)
    assert any("each CPU a core of its own (as recorded; --threads-per-core 2" in n for n in cores.assumptions)
    doc = plan_dict(threads, "r1", PLAN_SCHEMA)
    assert doc["target"]["threads_per_core"] == 2 and doc["recorded"]["threads_per_core"] == 1.0
    # a fraction of a core is said to three figures, not as Python's repr of 2 / 3 (the tester's "0.666667")
    thirds = project(recorded(), Target(cores=2, gpus=1, step_s=0.004, threads_per_core=3), samples_per_step=16)
    assert any("2 CPU(s) per process are 0.667 core(s) with 3 hardware threads each (given)" in n
               for n in thirds.assumptions)


def test_a_run_recorded_with_hyper_threading_is_planned_with_it_unless_told_otherwise():
    smt = recorded(usable_cpus=2.0, physical_cores=1.0)
    target = {"cores": 8, "gpus": 1, "step_s": 0.004}
    same = project(smt, Target(**target), samples_per_step=16)
    assert any("are 4 core(s) with 2 hardware threads each (as recorded)" in n for n in same.assumptions)
    assert max(r.samples_per_s for r in same.rows) == pytest.approx(5 / 0.00425)
    plain = project(smt, Target(**target, threads_per_core=1), samples_per_step=16)
    assert max(r.samples_per_s for r in plain.rows) == pytest.approx(8 / 0.00425)
    assert plan_dict(same, "r1", PLAN_SCHEMA)["target"]["threads_per_core"] == 2.0


def test_each_row_prices_cpu_work_at_its_load_and_a_given_step_time_is_taken_as_it_is():
    loaded = recorded(recorded_load_cost=1.0)
    plan = project(loaded, Target(cores=2), samples_per_step=16)
    # 2 workers on 2 CPUs: 4 ms of transform priced 1.180 times and 1 ms of compute 1.068 (test_analysis_capacity)
    workers, compute = loaded.load_costs(2)
    assert plan.row(2).cpu_second_cost == pytest.approx(workers) == pytest.approx(1.1797, rel=1e-4)
    assert plan.row(2).samples_per_s == pytest.approx(2 / (0.004 * workers + 0.001 * compute))
    assert plan.row(0).cpu_second_cost == pytest.approx(1.0) and plan.row(0).samples_per_s == pytest.approx(200.0)
    assert plan.row(2).to_dict()["cpu_second_cost"] == 1.18
    assert plan.row(2).to_dict()["compute_cpu_second_cost"] == round(compute, 3) == 1.068
    assert any("priced at the load of each worker count" in n and "10% for the compute's own work" in n
               for n in plan.assumptions)
    # --step-ms on a CPU target: the given 16 ms per 16 samples is the target's own figure, not priced again
    given, notes = target_model(loaded, Target(cores=2, step_s=0.016), samples_per_step=16)
    assert given.compute_priced is False
    assert given.cpu_slowed(1.5).compute_per_sample_s == pytest.approx(0.001)
    assert given.cpu_slowed(1.5).main_cpu_per_sample_s == pytest.approx(0.0015)  # the CPU part is priced
    assert any("the given step time is taken as it is" in n for n in notes)


def test_a_process_whose_own_loading_takes_under_5_percent_is_fed_without_workers():
    import io

    from rich.console import Console

    from stallscope.render import plan as plan_render

    # 20 us of loading per sample beside 1 ms of compute: 2% of the step, in the training process itself
    model = recorded(cost_s={"transform": 0.00002}, receive_per_sample_s=0.0005, receive_cpu_per_sample_s=0.0005)
    plan = project(model, Target(cores=4, gpus=1, step_s=0.016), samples_per_step=16)
    assert plan.row(0).data_wait_fraction == pytest.approx(0.02 / 1.02)
    assert plan.workers_needed == 0 and plan.best_workers == 0 and plan.limit == "fed"
    out = io.StringIO()
    plan_render.render(plan, "RUN", Console(file=out, width=200))
    said = out.getvalue()
    assert "0 (best, fed)" in said
    assert "each training process is fed without workers: loading in it takes at most 5% of its step" in said
    assert "best: the fewest workers within 2% of the highest rate; fed: the fewest that also wait at most 5%" in said


def test_where_taking_batches_caps_the_rate_the_plan_says_so():
    import io

    from rich.console import Console

    from stallscope.render import plan as plan_render

    # 2 ms of blocked loading, 0.1 ms of compute, 0.05 ms to take each sample from a worker: no wait at many
    # workers, yet the rate stops at 1 / 0.15 ms, a third below what the compute could take
    model = recorded(cost_s={"transform": 0.0, "storage": 0.002}, compute_per_sample_s=0.0001,
                     main_cpu_per_sample_s=0.0001, receive_per_sample_s=0.00005, receive_cpu_per_sample_s=0.00005,
                     workers=1)
    plan = project(model, Target(cores=64, gpus=0), samples_per_step=16)
    top = max(plan.rows, key=lambda r: r.samples_per_s)
    assert top.samples_per_s == pytest.approx(1 / 0.00015) and top.data_wait_fraction == 0.0
    out = io.StringIO()
    plan_render.render(plan, "RUN", Console(file=out, width=200))
    assert ("beyond its compute, the training process spends 0.050 ms per sample taking batches from the workers: "
            f"no worker count takes it past {top.samples_per_s:,.1f} samples/s") in out.getvalue()


def test_threads_a_one_core_recording_could_not_show_spread_over_the_targets_cores():
    """2 intra-op threads recorded on 1 CPU kept 1 busy; on 4 they keep 2 busy, in half the time at best."""
    model = recorded(usable_cpus=1.0, main_occupancy=1.0, compute_threads=2, compute_per_sample_s=0.002,
                     main_cpu_per_sample_s=0.002)
    moved, notes = target_model(model, Target(cores=4), samples_per_step=16)
    assert moved.main_occupancy == pytest.approx(2.0) and moved.compute_per_sample_s == pytest.approx(0.001)
    assert moved.main_cpu_per_sample_s == pytest.approx(0.002)
    assert any("2 intra-op threads, recorded on 1 CPU(s)" in n and "at best 2.00x" in n for n in notes)
    given, _ = target_model(model, Target(cores=4, step_s=0.016), samples_per_step=16)  # the target's own figure
    assert given.main_occupancy == pytest.approx(1.0) and given.compute_per_sample_s == pytest.approx(0.001)


def test_threads_that_outnumber_the_targets_cores_do_not_spin_so_only_their_work_is_cpu():
    """Recorded on 2 CPUs, 2 threads spun while the process loaded its own batches: 6 ms of CPU per sample for
    1 ms of compute on 2 cores. On 1 core (more threads than CPUs) OpenMP hardly spins: 2 ms, the compute's work."""
    model = recorded(usable_cpus=2.0, main_occupancy=2.0, compute_threads=2, compute_per_sample_s=0.001,
                     main_cpu_per_sample_s=0.006)
    moved, notes = target_model(model, Target(cores=1), samples_per_step=16)
    assert moved.main_cpu_per_sample_s == pytest.approx(0.002) and moved.main_occupancy == pytest.approx(1.0)
    assert any("do not spin" in n for n in notes)
    same, _ = target_model(model, Target(cores=2), samples_per_step=16)  # as many CPUs as threads: they spin
    assert same.main_cpu_per_sample_s == pytest.approx(0.006) and same.main_occupancy == pytest.approx(2.0)
    one_thread, _ = target_model(recorded(usable_cpus=1.0, compute_threads=1), Target(cores=4), samples_per_step=16)
    assert one_thread.main_occupancy == pytest.approx(1.0)
    assert one_thread.compute_per_sample_s == pytest.approx(0.001)


def test_a_threaded_cpu_compute_is_planned_beside_workers_with_its_threads_cut_to_the_cores_they_leave():
    """4 threads kept 4 of 4 cores busy for 1 ms per sample; transform 4 ms of CPU. Beside 1 worker the compute keeps
    3 threads (the worker holds one core), beside 3 or more it keeps 1; with 0 workers it keeps its 4."""
    from stallscope.analysis.plan import split_threads

    model = recorded(usable_cpus=4.0, main_occupancy=4.0, compute_threads=4, main_cpu_per_sample_s=0.004)
    moved, _ = target_model(model, Target(cores=4), samples_per_step=16)
    assert [split_threads(moved, w) for w in range(5)] == [None, 3, 2, 1, 1]
    plan = project(model, Target(cores=4), samples_per_step=16)
    assert [r.compute_threads for r in plan.rows[:5]] == [None, 3, 2, 1, 1]
    # 3 threads for 4/3 ms per sample (4 ms of CPU over 3 cores), 1 worker: 4 ms per sample, the worker's pace
    assert plan.row(1).samples_per_s == pytest.approx(250.0)
    assert plan.row(1).to_dict()["compute_threads"] == 3
    # cores enough for all: 8 cores leave 4 for the workers, nothing is cut up to 4 workers
    wide = project(model, Target(cores=8), samples_per_step=16)
    assert [r.compute_threads for r in wide.rows[:5]] == [None] * 5 and wide.row(5).compute_threads == 3
    given = project(model, Target(cores=4, step_s=0.016), samples_per_step=16)  # the target's own step time
    assert all(r.compute_threads is None for r in given.rows)
    single = recorded(usable_cpus=4.0, main_occupancy=1.0, compute_threads=1)  # one thread: nothing to cut
    single_plan = project(single, Target(cores=2), samples_per_step=16)
    assert all(r.compute_threads is None for r in single_plan.rows)

    import io

    from rich.console import Console

    from stallscope.render import plan as plan_render

    out = io.StringIO()
    plan_render.render(plan, "RUN", Console(file=out, width=200))
    said = out.getvalue()
    assert "compute threads" in said and "torch.set_num_threads(N)" in said
    zero_row = next(line for line in said.splitlines() if line.strip().startswith("0 "))
    assert zero_row.split()[-1] == "4"  # the recorded threads, where nothing is cut
    out = io.StringIO()
    plan_render.render(single_plan, "RUN", Console(file=out, width=200))
    assert "compute threads" not in out.getvalue()  # no column where no row cuts them


def test_the_training_process_taking_batches_from_workers_is_said_where_it_caps_the_rate():
    """The tester's plan for 64 cores and 8 GPUs showed 145 samples/s against 160 of compute with no data wait,
    and nothing said where the rest went: taking each batch from a worker, which the training process does
    serially after its compute (0.2 ms per sample here, recorded with 1 worker, after 1 ms of compute)."""
    with_workers = recorded(workers=1, receive_per_sample_s=0.0002, receive_cpu_per_sample_s=0.0002)
    plan = project(with_workers, Target(cores=64, gpus=8, step_s=0.016), samples_per_step=16)
    [said] = [n for n in plan.assumptions if n.startswith("with workers the training process also takes")]
    assert said == ("with workers the training process also takes each batch from them: 0.200 ms per sample as "
                    "recorded with 1 (rebuilding it, waiting for the hand-over, mapping it), after its 1.000 ms of "
                    "compute: about 833.3 samples/s per training process with no wait for data, before the load's "
                    "pricing (the wait for a busy worker's hand-over shrinks as more workers share the batches)")
    assert max(r.samples_per_s for r in plan.rows) == pytest.approx(1 / 0.0012)
    # recorded without workers there is nothing recorded to say (the estimate's own line says what is estimated)
    assert not any(n.startswith("with workers the training")
                   for n in project(recorded(), Target(cores=64, gpus=8, step_s=0.016), 16).assumptions)


def test_the_assumptions_say_how_a_zero_worker_runs_shared_memory_cost_was_estimated():
    estimated = dict(shm_write_per_sample_s=0.0003, shm_read_per_sample_s=0.00015, worker_only_basis="measured at exit")
    on_cpu = project(recorded(**estimated), Target(cores=2), samples_per_step=16)
    note = next(n for n in on_cpu.assumptions if "passing batches through shared memory is estimated" in n)
    assert note == ("recorded with 0 workers: passing batches through shared memory is estimated (0.300 ms per sample "
                    "in a worker, 0.600 ms in the training process, whose CPU training step reads it 4 times over; "
                    "per-byte cost measured at exit); pickling and descriptor passing are not")
    on_gpu = project(recorded(compute_on_cpu=False, **estimated), Target(cores=2, gpus=1), samples_per_step=16)
    assert any("0.150 ms in the training process; per-byte cost measured at exit" in n for n in on_gpu.assumptions)
    # recorded computing on the CPU, planned for a GPU: the copy to the device reads the batch once
    moved = project(recorded(**estimated), Target(cores=2, gpus=1), samples_per_step=16)
    assert any("0.150 ms in the training process; per-byte cost measured at exit" in n for n in moved.assumptions)


def test_threads_that_outnumber_the_targets_cores_are_cut_beside_workers():
    """2 threads recorded on 2 cores, planned on 1: beside any worker the plan keeps 1 thread (its occupancy there
    is already the one core, so comparing with it cut nothing), with 0 workers the script's 2; on 2 cores with 1
    worker of 2 ms per sample the cores are shared and the threads cut to 1 as before."""
    from stallscope.analysis.plan import split_threads

    model = recorded(usable_cpus=2.0, main_occupancy=2.0, compute_threads=2, compute_per_sample_s=0.001,
                     main_cpu_per_sample_s=0.006)
    moved, _ = target_model(model, Target(cores=1), samples_per_step=16)
    assert moved.main_occupancy == pytest.approx(1.0) and moved.compute_threads == 2
    assert [split_threads(moved, w) for w in range(4)] == [None, 1, 1, 1]
    plan = project(model, Target(cores=1), samples_per_step=16)
    assert [r.compute_threads for r in plan.rows[:4]] == [None, 1, 1, 1]
    # the rate is the one-core budget either way: the compute's 2 ms of work (no spin on one core) and the
    # workers' 4 ms of transform; 1 thread changes what is run, not the work priced
    assert plan.row(1).samples_per_s == pytest.approx(moved.at_load(1).rate(workers=1))
    same, _ = target_model(model, Target(cores=2), samples_per_step=16)
    assert split_threads(same, 1) == 1 and split_threads(same, 0) is None
    single = recorded(usable_cpus=2.0, main_occupancy=1.0, compute_threads=1)
    assert split_threads(target_model(single, Target(cores=1), samples_per_step=16)[0], 2) is None


def test_threads_recorded_on_fewer_cpus_are_planned_from_their_one_thread_time():
    """2 threads recorded on 1 CPU, 1.55 ms of compute per sample: 1 ms of one thread's time (see
    OVERSUBSCRIBED_THREAD_COST). On 2 cores: 0.5 ms on 2 threads (ideal), and beside workers, cut to 1 thread, 1 ms;
    on 4 cores the same; a compute not recorded so is spread from its recorded time as before."""
    from dataclasses import replace

    model = recorded(usable_cpus=1.0, main_occupancy=1.0, compute_threads=2, compute_per_sample_s=0.00155,
                     main_cpu_per_sample_s=0.00155, compute_oversubscribed=True)
    moved, notes = target_model(model, Target(cores=2), samples_per_step=16)
    assert moved.compute_per_sample_s == pytest.approx(0.0005) and moved.main_occupancy == pytest.approx(2.0)
    assert moved.compute_oversubscribed is False
    assert any("waited for the threads that had no CPU" in n and "3.10x as fast" in n for n in notes)
    plan = project(model, Target(cores=2), samples_per_step=16)
    assert plan.row(1).compute_threads == 1
    assert moved.with_compute_threads(1).compute_per_sample_s == pytest.approx(0.001)  # its work on one thread
    # still more threads than cores there (4 recorded on 1, planned on 2): the one-thread time and 2 threads' waits
    four = replace(model, compute_threads=4, compute_per_sample_s=0.001 * (1 + 0.55 * 3))
    wide, _ = target_model(four, Target(cores=2), samples_per_step=16)
    assert wide.compute_per_sample_s == pytest.approx(0.001 * (1 + 0.55 * 2)) and wide.compute_oversubscribed
    assert wide.with_compute_threads(2).compute_per_sample_s == pytest.approx(0.0005)
    before, _ = target_model(replace(model, compute_oversubscribed=False), Target(cores=2), samples_per_step=16)
    assert before.compute_per_sample_s == pytest.approx(0.00155 / 2)


def test_the_plan_says_what_the_workers_pay_for_sharing_a_core_and_why():
    """The time-sharing cost stated in the assumptions is the run's own (from its page faults), with the figure."""
    def sharing_note(**kw) -> str:
        plan = project(recorded(recorded_load_cost=1.0, **kw), Target(cores=1), samples_per_step=16)
        return next(n for n in plan.assumptions if "priced at the load of each worker count" in n)

    resident = sharing_note(fresh_pages_per_cpu_s=1_000.0)
    assert ("up to 2% more again once threads outnumber the cores, as the workers' work takes 1,000 page faults"
            in resident)
    assert "its memory mostly stays put; work on fresh memory pays up to 8%" in resident
    fresh = sharing_note(fresh_pages_per_cpu_s=60_000.0)
    assert "up to 8% more again" in fresh and "60,000 page faults per CPU second (fresh memory: the full cost)" in fresh
    uncounted = sharing_note()  # a session recorded before faults were counted: the full cost, no figure
    assert "up to 8% more again once threads outnumber the cores (" in uncounted and "page faults" not in uncounted


def _straggler_job(gradient_bytes: int | None):
    """The recorded 2-rank straggler session, with (or without) a DDP model of ``gradient_bytes`` on each rank."""
    import dataclasses
    from pathlib import Path

    from stallscope.session import Session

    session = Session.load(Path(__file__).parent.parent / "data" / "summaries" / "straggler" / "session.json")
    facts = [] if gradient_bytes is None else [
        {"kind": "ddp", "pid": r.pid, "t_ns": 0, "parameter_bytes": gradient_bytes, "device": "cpu"}
        for r in session.ranks]
    return dataclasses.replace(session, compute_facts=[*session.compute_facts, *facts])


def test_a_job_over_nodes_prices_its_gradients_ring_all_reduce_on_the_link():
    from stallscope.analysis.plan import plan_run, ring_sync_s

    # 2(n-1)/n of the bytes over the link: 100 MiB over 8 ranks at 100 Gb/s (12.5 GB/s)
    assert ring_sync_s(100 * 2**20, 8, 100.0) == pytest.approx(2 * 7 / 8 * 100 * 2**20 / 12.5e9)
    assert ring_sync_s(100 * 2**20, 1, 100.0) == 0.0
    small = plan_run(_straggler_job(1 * 2**20), cores=4, nodes=4, link_gbps=100)
    large = plan_run(_straggler_job(400 * 2**20), cores=4, nodes=4, link_gbps=100)
    slow = plan_run(_straggler_job(400 * 2**20), cores=4, nodes=4, link_gbps=10)
    assert small.nodes is not None and small.nodes.ranks == 4 * small.target.processes
    assert large.nodes.sync_s == pytest.approx(ring_sync_s(400 * 2**20, large.nodes.ranks, 100))
    assert slow.nodes.sync_s == pytest.approx(10 * large.nodes.sync_s)
    assert slow.compute_samples_per_s < large.compute_samples_per_s < small.compute_samples_per_s
    doc = plan_dict(large, "r", PLAN_SCHEMA)["nodes"]
    best = large.row(large.best_workers)
    assert doc["nodes"] == 4 and doc["job_samples_per_s"] == pytest.approx(4 * best.total_samples_per_s, rel=1e-3)
    assert any("all-reduced in one ring" in line for line in large.assumptions)
    # a given step time on the target gets the all-reduce added, not replaced
    timed = plan_run(_straggler_job(400 * 2**20), cores=4, step_ms=50, nodes=4, link_gbps=100)
    assert timed.target.step_s == pytest.approx(0.05 + large.nodes.sync_s)


@pytest.mark.parametrize("gradient,kwargs,message", [
    (2**20, {"nodes": 4}, "--nodes needs --link-gbps"),
    (2**20, {"nodes": 0, "link_gbps": 10}, "--nodes must be between"),
    (2**20, {"nodes": 2, "link_gbps": -1}, "--link-gbps must be a positive number"),
    (None, {"nodes": 2, "link_gbps": 10}, "no DistributedDataParallel model"),
])
def test_a_job_over_nodes_needs_a_link_and_a_ddp_model(gradient, kwargs, message):
    from stallscope.analysis.plan import plan_run

    with pytest.raises(PlanError, match=message):
        plan_run(_straggler_job(gradient), cores=4, **kwargs)

"""Step segmentation and verdicts on hand-built sessions (exact numbers, no real time)."""

from __future__ import annotations

import dataclasses

import pytest

from stallscope.analysis import analyze
from stallscope.analysis.attribution import verdict_for
from stallscope.analysis.steps import step_stats
from stallscope.constants import SESSION_SCHEMA
from stallscope.render import words
from stallscope.render.words import failures
from stallscope.session import (
    FetchRecord,
    LoaderRecord,
    NextRecord,
    OptimizerStepRecord,
    ProcessRecord,
    IterRecord,
    Session,
    ShutdownRecord,
    StopRecord,
    TransferRecord,
)

MS = 1_000_000
PID = 100


def make_session(nexts, opts=(), stops=(), fetches=(), loaders=(0,), workers=0) -> Session:
    return Session(
        schema=SESSION_SCHEMA, run_id="t", command=["x"], cwd="/", started_wall=0.0, start_ns=0,
        end_ns=10_000 * MS, exit_code=0, ended_by="exit", overrides={}, max_steps=None,
        environment={"cpus_affinity": 4},
        processes=[ProcessRecord(PID, 1, "main", [], 0, 0)],
        loaders=[LoaderRecord(i, PID, 0, f"train.py:{10 + i}", {"num_workers": workers, "batch_size": 4}, {})
                 for i in loaders],
        nexts=list(nexts), stops=list(stops), optimizer_steps=list(opts), fetches=list(fetches))


def nxt(t0, t1, loader=0, epoch=0):
    return NextRecord(loader, loader, epoch, t0 * MS, t1 * MS, -1, 4, PID)


def opt(t0, t1):
    return OptimizerStepRecord(1, "SGD", t0 * MS, t1 * MS, PID)


def test_optimizer_steps_delimit_steps_and_wait_is_measured():
    # Each step: 30 ms waiting for data, then 70 ms of compute ending in the optimizer step.
    nexts = [nxt(100 * k, 100 * k + 30) for k in range(5)]
    opts = [opt(100 * k + 90, 100 * k + 100) for k in range(5)]
    stats = step_stats(make_session(nexts, opts))
    assert stats.boundary == "optimizer"
    assert len(stats.steps) == 5 and stats.warmup_steps == 1
    assert [s.duration_ns for s in stats.steps] == [100 * MS] * 5
    assert stats.wait_s == pytest.approx(0.120)
    assert stats.data_wait_fraction == pytest.approx(0.3)
    assert verdict_for(stats) == "input-bound"


def test_stopping_and_starting_an_epochs_workers_is_data_wait_not_compute():
    """A loop that breaks out of its epoch drops the iterator: its workers are stopped (300-600 ms, a spawned worker
    tearing down) and the next iter() starts new ones (500-700 ms, overlapping the stop: counted once)."""
    nexts = [nxt(100 * k, 100 * k + 30) for k in range(3)] + [nxt(700, 730, epoch=1), nxt(800, 830, epoch=1)]
    opts = [opt(100 * k + 90, 100 * k + 100) for k in range(3)] + [opt(790, 800), opt(890, 900)]
    stop = ShutdownRecord(0, 0, 300 * MS, 600 * MS, 1, PID)
    started = IterRecord(0, 1, 0, 500 * MS, 700 * MS, 1, PID)
    stats = step_stats(dataclasses.replace(make_session(nexts, opts), shutdowns=[stop], iters=[started]))
    step = stats.steps[3]  # from the third optimizer step (300 ms) to the fourth (800 ms)
    assert (step.start_ns, step.end_ns) == (300 * MS, 800 * MS)
    assert step.wait_ns == 400 * MS + 30 * MS  # stopping and starting the workers, then its batch
    assert step.compute_ns == 70 * MS


def test_the_steady_steps_start_after_the_workers_first_round():
    """Four workers started together deliver their first four batches together: steps 1-3 waited for nothing and
    would flatter the rate. The count is the one the iterator ran with, not the constructor's (a script may set
    ``loader.num_workers`` after building it)."""
    nexts = [nxt(100 * k, 100 * k + 30) for k in range(15)]
    opts = [opt(100 * k + 90, 100 * k + 100) for k in range(15)]
    started = IterRecord(0, 0, 0, 0, 1 * MS, 4, PID)
    stats = step_stats(dataclasses.replace(make_session(nexts, opts), iters=[started]))
    assert stats.warmup_steps == 4 and len(stats.steady) == 11
    # at most a third of the steps goes to the first round
    eight = dataclasses.replace(started, num_workers=8)
    stats = step_stats(dataclasses.replace(make_session(nexts, opts), iters=[eight]))
    assert stats.warmup_steps == 5
    # without workers: the recorder's one warm-up step
    assert step_stats(make_session(nexts, opts)).warmup_steps == 1


def test_a_ctrl_z_pause_is_left_out_of_the_steps():
    """The job stood still for 2 s inside step 3's wait and 0.5 s inside step 4's compute: neither is its time."""
    nexts = [nxt(100 * k, 100 * k + 30) for k in range(5)]
    opts = [opt(100 * k + 90, 100 * k + 100) for k in range(5)]
    shifted_nexts, shifted_opts = [], []
    for k, (n, o) in enumerate(zip(nexts, opts, strict=True)):  # 2000 ms from step 3's wait on, 500 more in step 4
        before = (2000 if k >= 4 else 0) + (500 if k >= 5 else 0)  # where its wait starts
        after = (2000 if k >= 3 else 0) + (500 if k >= 5 else 0)  # where its wait ends
        done = (2000 if k >= 3 else 0) + (500 if k >= 4 else 0)  # where its optimizer step is
        shifted_nexts.append(NextRecord(0, 0, 0, n.start_ns + before * MS, n.end_ns + after * MS, -1, 4, PID))
        shifted_opts.append(OptimizerStepRecord(1, "SGD", o.start_ns + done * MS, o.end_ns + done * MS, PID))
    session = make_session(shifted_nexts, shifted_opts)
    session = dataclasses.replace(session, pauses=[{"start_ns": 310 * MS, "end_ns": 2310 * MS},
                                                   {"start_ns": 2450 * MS, "end_ns": 2950 * MS}])
    stats = step_stats(session)
    assert [s.duration_ns for s in stats.steps] == [100 * MS] * 5
    assert [s.wait_ns for s in stats.steps] == [30 * MS] * 5
    assert stats.wall_s == pytest.approx(0.4) and stats.data_wait_fraction == pytest.approx(0.3)


def test_two_optimizers_on_one_batch_are_one_step():
    nexts = [nxt(100 * k, 100 * k + 5) for k in range(4)]
    opts = [o for k in range(4) for o in (opt(100 * k + 50, 100 * k + 60), opt(100 * k + 80, 100 * k + 90))]
    stats = step_stats(make_session(nexts, opts))
    assert len(stats.steps) == 4
    assert stats.steps[1].batches == 1


def test_gradient_accumulation_puts_several_batches_in_a_step():
    nexts = [nxt(50 * k, 50 * k + 10) for k in range(8)]
    opts = [opt(50 * k + 45, 50 * k + 50) for k in (1, 3, 5, 7)]
    stats = step_stats(make_session(nexts, opts))
    assert len(stats.steps) == 4
    assert all(s.batches == 2 for s in stats.steps)
    assert stats.steps[1].wait_ns == 20 * MS


def test_validation_loop_is_excluded_from_the_training_step():
    nexts = [nxt(0, 10), nxt(100, 110), nxt(200, 210),
             nxt(300, 340, loader=1), nxt(350, 390, loader=1), nxt(500, 510)]
    stops = [StopRecord(1, 1, 0, 400 * MS, 450 * MS, PID)]
    opts = [opt(90, 100), opt(190, 200), opt(290, 300), opt(590, 600)]
    session = make_session(nexts, opts, stops, loaders=(0, 1))
    stats = step_stats(session)
    assert stats.loader_id == 0
    last = stats.steps[-1]
    assert last.excluded_ns == 150 * MS  # 300..450 was the validation loop
    assert last.duration_ns == 150 * MS
    roles = {ld.loader_id: ld.role for ld in analyze(session).loaders}
    assert roles == {0: "train", 1: "eval"}


def _zipped(first_wait: int, second_wait: int, steps: int = 6) -> Session:
    """``for images, noise in zip(loader0, loader1)``: each 100 ms step takes loader 0's batch, then loader 1's
    (zip asks them in that order), then computes and steps the optimizer."""
    nexts, opts = [], []
    for k in range(steps):
        t = 100 * k
        nexts += [nxt(t, t + first_wait), nxt(t + first_wait, t + first_wait + second_wait, loader=1)]
        opts.append(opt(t + 90, t + 100))
    return make_session(nexts, opts, loaders=(0, 1))


def test_a_loader_zipped_with_the_training_loader_is_paired_and_its_waits_are_the_steps():
    """The costly loader asked first (60 ms) is the training loader, though the cheap one's batch (5 ms) is the last
    before each optimizer step; both waits are the step's data wait, and nothing is left out as a validation loop."""
    session = _zipped(60, 5)
    stats = step_stats(session)
    assert stats.loader_ids == (0,) and stats.paired_loader_ids == (1,)
    assert [s.wait_ns for s in stats.steps] == [65 * MS] * 6
    assert all(s.excluded_ns == 0 for s in stats.steps)
    assert stats.data_wait_fraction == pytest.approx(0.65)
    roles = {ld.loader_id: ld.role for ld in analyze(session).loaders}
    assert roles == {0: "train", 1: "paired"}


def test_of_zipped_loaders_the_one_the_steps_wait_on_longest_is_the_training_loader():
    session = _zipped(5, 60)
    stats = step_stats(session)
    assert stats.loader_ids == (1,) and stats.paired_loader_ids == (0,)
    assert [s.wait_ns for s in stats.steps] == [65 * MS] * 6


def test_a_loader_that_feeds_few_of_the_steps_is_not_paired():
    """Loader 1 delivers in 2 of the 6 steps the training loader feeds (a third, under ``PAIRED_SHARE``): a loop of
    its own, left out of the steps it falls in."""
    nexts, opts = [], []
    for k in range(6):
        t = 100 * k
        nexts.append(nxt(t, t + 10))
        if k in (2, 4):
            nexts.append(nxt(t + 20, t + 50, loader=1))
        opts.append(opt(t + 90, t + 100))
    session = make_session(nexts, opts, loaders=(0, 1))
    stats = step_stats(session)
    assert stats.loader_ids == (0,) and stats.paired_loader_ids == ()
    assert [s.excluded_ns for s in stats.steps] == [0, 0, 30 * MS, 0, 30 * MS, 0]
    assert [s.wait_ns for s in stats.steps] == [10 * MS] * 6


def test_a_pause_inside_a_validation_loop_or_a_copy_is_left_out_once():
    """300..450 is the validation loop, and the job stood still 320..420 inside it: 150 ms left out, not 250."""
    nexts = [nxt(0, 10), nxt(100, 110), nxt(200, 210),
             nxt(300, 340, loader=1), nxt(350, 390, loader=1), nxt(500, 510)]
    stops = [StopRecord(1, 1, 0, 400 * MS, 450 * MS, PID)]
    opts = [opt(90, 100), opt(190, 200), opt(290, 300), opt(590, 600)]
    copies = [TransferRecord(520 * MS, 570 * MS, 1 << 20, True, False, "to", PID)]  # stood still 540..560
    session = dataclasses.replace(make_session(nexts, opts, stops, loaders=(0, 1)), transfers=copies, pauses=[
        {"start_ns": 320 * MS, "end_ns": 420 * MS}, {"start_ns": 540 * MS, "end_ns": 560 * MS}])
    last = step_stats(session).steps[-1]
    assert last.excluded_ns == 170 * MS and last.duration_ns == 130 * MS
    assert last.transfer_ns == 30 * MS and last.wait_ns == 10 * MS and last.compute_ns == 90 * MS


def test_without_optimizer_each_batch_is_a_step():
    nexts = [nxt(100 * k, 100 * k + 2) for k in range(6)]
    stops = [StopRecord(0, 0, 0, 600 * MS, 601 * MS, PID)]
    stats = step_stats(make_session(nexts, stops=stops))
    assert stats.boundary == "batch"
    assert len(stats.steps) == 6
    assert verdict_for(stats) == "compute-bound"


def test_no_loader_is_unknown():
    session = make_session([], loaders=())
    result = analyze(session)
    assert result.verdict == "unknown"
    assert result.bottleneck_node is None
    assert result.conditions == ["no-dataloader"]
    assert any("no torch DataLoader" in n for n in words.notes(result))


def test_starved_main_process_fetch_is_split_exactly():
    # num_workers=0: every 100 ms step waits 60 ms, of which the fetch was 50 ms (decode 30, transform 20 CPU).
    nexts = [nxt(100 * k, 100 * k + 60) for k in range(5)]
    opts = [opt(100 * k + 95, 100 * k + 100) for k in range(5)]
    fetches = [FetchRecord(0, 0, -1, k, (100 * k + 5) * MS, (100 * k + 55) * MS, 50 * MS, 0, 4,
                           {"decode": [30 * MS, 30 * MS, 4]}, {"Image.convert": [30 * MS, 30 * MS, 4]}, None, PID)
               for k in range(5)]
    result = analyze(make_session(nexts, opts, fetches=fetches))
    assert result.verdict == "input-bound"
    seconds = result.node_seconds
    assert seconds["decode"] == pytest.approx(0.240 * 30 / 60)
    assert seconds["transform"] == pytest.approx(0.240 * 20 / 60)
    assert seconds["loader"] == pytest.approx(0.240 * 10 / 60)
    assert seconds["compute"] == pytest.approx(0.160)
    assert result.bottleneck_node == "decode"
    top = result.recommendations[0]
    assert top.id == "num-workers" and top.predicted_speedup > 1.5


def test_a_loader_without_batching_whose_dataset_batches_counts_the_batches_samples():
    """``batch_size=None`` over a dataset that yields ready batches of 4 (WebDataset's ``.batched(4)``): each fetch is
    one item, a batch of 4 samples as the steps count them, so the loader's cost per sample is the fetch's over 4
    (it read 4 times that, and the model's rate a quarter of the measured one)."""
    nexts = [nxt(100 * k, 100 * k + 60) for k in range(5)]
    opts = [opt(100 * k + 95, 100 * k + 100) for k in range(5)]
    fetches = [FetchRecord(0, 0, -1, k, (100 * k + 5) * MS, (100 * k + 55) * MS, 50 * MS, 0, 1,
                           {"decode": [30 * MS, 30 * MS, 4]}, {"Image.convert": [30 * MS, 30 * MS, 4]}, None, PID)
               for k in range(5)]
    session = make_session(nexts, opts, fetches=fetches)
    unbatched = {"num_workers": 0, "batch_size": None, "batch_sampler": None}
    session = dataclasses.replace(session, loaders=[dataclasses.replace(session.loaders[0], config=unbatched)])
    result = analyze(session)
    assert result.train_loader.pipeline.samples == 20  # 5 fetches of one 4-sample batch each
    model = result.capacity.model
    assert model.cost_s["decode"] == pytest.approx(0.030 / 4)
    # the same run from a DataLoader that batches 4 items itself: the same model
    batching = {"num_workers": 0, "batch_size": 4, "batch_sampler": "BatchSampler"}
    batched = dataclasses.replace(session, loaders=[dataclasses.replace(session.loaders[0], config=batching)],
                                  fetches=[dataclasses.replace(f, items=4) for f in fetches])
    same = analyze(batched)
    assert same.train_loader.pipeline.samples == 20
    assert model.rate(workers=0) == pytest.approx(same.capacity.model.rate(workers=0))
    assert model.rate(workers=2) == pytest.approx(same.capacity.model.rate(workers=2))
    # a batching loader counts its fetched items, whatever the batches' first length
    assert analyze(dataclasses.replace(batched, fetches=fetches)).train_loader.pipeline.samples == 5


def _per_epoch_session(helper_eval: bool):
    """4 epochs, each a new training DataLoader (ids 0, 2, 4, 6) built at one line, 3 batches and optimizer
    steps each, then an evaluation loader (ids 1, 3, 5, 7) with 2 batches and no optimizer step. With
    ``helper_eval`` the evaluation loaders are built at the same line (one helper makes both)."""
    nexts, opts, stops, loaders = [], [], [], []
    t = 0
    for epoch in range(4):
        train, evaluation = 2 * epoch, 2 * epoch + 1
        loaders.append(LoaderRecord(train, PID, t * MS, "train.py:10", {"num_workers": 0, "batch_size": 4}, {}))
        for _ in range(3):
            nexts.append(nxt(t, t + 20, loader=train))
            opts.append(opt(t + 90, t + 100))
            t += 100
        stops.append(StopRecord(train, train, 0, t * MS, (t + 1) * MS, PID))
        site = "train.py:10" if helper_eval else "train.py:20"
        loaders.append(LoaderRecord(evaluation, PID, t * MS, site, {"num_workers": 0, "batch_size": 4}, {}))
        nexts += [nxt(t + 10, t + 50, loader=evaluation), nxt(t + 60, t + 100, loader=evaluation)]
        stops.append(StopRecord(evaluation, evaluation, 0, (t + 110) * MS, (t + 120) * MS, PID))
        t += 200
    session = make_session(nexts, opts, stops)
    return dataclasses.replace(session, loaders=loaders)


@pytest.mark.parametrize("helper_eval", [False, True])
def test_a_dataloader_built_every_epoch_is_one_training_loader(helper_eval):
    analysis = analyze(_per_epoch_session(helper_eval))
    stats = analysis.steps
    assert stats.loader_ids == (0, 2, 4, 6) and len(stats.steps) == 12  # every epoch's steps, not the first's
    # the evaluation loops between epochs are left out of the steps that span them
    assert all(s.wait_ns == 20 * MS for s in stats.steps)
    train = analysis.train_loader
    assert (train.ids, train.batches, train.epochs) == ((0, 2, 4, 6), 12, 4)
    [evaluation] = [ld for ld in analysis.loaders if ld.role == "eval"]
    assert (evaluation.ids, evaluation.batches) == ((1, 3, 5, 7), 8)


@pytest.mark.parametrize("code, said", [(3, "the script exited with code 3"),
                                        (139, "the script was killed by SIGSEGV (exit code 139)"),
                                        (137, "the script was killed by SIGKILL (exit code 137)"),
                                        (200, "the script exited with code 200")])
def test_an_exit_code_from_a_signal_names_the_signal(code, said):
    from stallscope.analysis.findings import Failure

    assert failures.failure_message(Failure("main", "exit", None, None, exit_code=code)) == said


def test_only_copies_during_the_steps_count_toward_pinning_advice():
    """A model's weights copied once before training are never pinned: they must not make pinned batches read as
    pageable (a 400 MB model against twelve 1 MB batches)."""
    from stallscope.analysis.job import _unpinned_fraction

    nexts = [nxt(100 * k, 100 * k + 30) for k in range(5)]
    opts = [opt(100 * k + 90, 100 * k + 100) for k in range(5)]
    weights = TransferRecord(-50 * MS, -10 * MS, 400 << 20, False, False, "to", PID)
    batches = [TransferRecord((100 * k + 40) * MS, (100 * k + 45) * MS, 1 << 20, True, True, "to", PID)
               for k in range(5)]
    session = dataclasses.replace(make_session(nexts, opts), transfers=[weights, *batches])
    assert _unpinned_fraction(session, step_stats(session)) == 0.0
    pageable = [dataclasses.replace(b, pinned=False) for b in batches]
    session = dataclasses.replace(session, transfers=[weights, *pageable])
    assert _unpinned_fraction(session, step_stats(session)) == 1.0


@pytest.mark.parametrize("failure, headline, detail", [
    (("main", "KeyboardInterrupt", "", "torch/autograd/graph.py:1072"), "the script was interrupted",
     "KeyboardInterrupt (Ctrl-C or SIGINT) while at torch/autograd/graph.py:1072"),
    (("main", "exit", None, None, None, None, 129), "the script was stopped",
     "the script was killed by SIGHUP (exit code 129)"),
    (("main", "exit", None, None, None, None, 143), "the script was stopped",
     "the script was killed by SIGTERM (exit code 143)"),
    (("main", "exit", None, None, None, None, 130), "the script was stopped",
     "the script was killed by SIGINT (exit code 130)"),
    (("main", "RuntimeError", "boom", "train.py:9"), "the script failed", "RuntimeError: boom  at train.py:9"),
    # a worker's interrupt is the worker's end, not the user's stop of the script
    (("worker", "KeyboardInterrupt", "", None, 0, 1), "the script failed", "KeyboardInterrupt: "),
])
def test_a_ctrl_c_or_a_termination_is_said_as_a_stop_not_a_failure(failure, headline, detail):
    from stallscope.analysis.findings import Failure

    f = Failure(*failure)
    assert (failures.failure_headline(f), failures.failure_detail(f)) == (headline, detail)


def test_a_module_the_scripts_python_lacks_and_stallscopes_has_is_said_with_the_command_to_use(tmp_path):
    """``stallscope run -- python train.py`` where that ``python`` is another interpreter without torch: the
    failure says stallscope's own Python has the module, and the command that uses it."""
    import shlex
    import sys

    from stallscope.analysis.findings import Failure

    missing = Failure("main", "ModuleNotFoundError", "No module named 'json.decoder'", "train.py:1")
    other = str(tmp_path / "python3")  # an interpreter that is not this one
    assert failures.missing_module_hint(missing, [other, "train.py", "--lr", "0.1 x"]) == (
        f"the script's Python ({other}) cannot import json; stallscope's own Python has it: "
        f"stallscope run -- {shlex.join([sys.executable, 'train.py', '--lr', '0.1 x'])}")
    # a virtual environment's python links to the interpreter it was made from: the environment's is not the
    # base one's, although both resolve to the same file
    venv_python = tmp_path / "venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.symlink_to(sys.executable)
    assert failures.missing_module_hint(missing, [str(venv_python), "train.py"]) is not None
    # nothing to say: the script ran on this very Python, the module is nowhere, the failure is another, or the
    # command is not a Python (its arguments are not a script's)
    assert failures.missing_module_hint(missing, [sys.executable, "train.py"]) is None
    assert failures.missing_module_hint(missing, [str(tmp_path / "torchrun"), "--nproc_per_node", "2", "t.py"]) is None
    nowhere = Failure("main", "ModuleNotFoundError", "No module named 'no_such_module_anywhere'", None)
    assert failures.missing_module_hint(nowhere, [other, "train.py"]) is None
    assert failures.missing_module_hint(Failure("main", "RuntimeError", "No module named 'json'", None),
                                     [other, "train.py"]) is None


@pytest.mark.parametrize("seconds,note,condition", [
    (0.4, "SIGINT was forwarded to the script, which went on and exited with code 1", "stopped-while-starting"),
    (0.4, "stopped by SIGTERM sent to stallscope", "stopped-while-starting"),
    (60.0, "stopped by SIGINT sent to stallscope", "recorder-not-started"),  # it ran: the recorder did not start
    (0.4, None, "recorder-not-started"),
])
def test_a_job_with_no_recorded_process_says_whether_a_signal_stopped_it_while_starting(seconds, note, condition):
    """Ctrl-C while Python imports stallscope's recorder (sitecustomize) ends the script before any process is
    recorded: that is not python -I ignoring the recorder."""
    session = dataclasses.replace(make_session([], loaders=()), processes=[], end_ns=int(seconds * 1e9),
                                  notes=[note] if note else [])
    result = analyze(session)
    assert result.conditions == [condition]
    said = " ".join(words.notes(result))
    assert ("while Python was starting" in said) == (condition == "stopped-while-starting")
    assert ("python -I" in said) == (condition == "recorder-not-started")

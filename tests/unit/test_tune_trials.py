"""Trial bookkeeping (stallscope.tuning.trials): failure reasons, --set arguments, normalization."""

from __future__ import annotations

from stallscope.tuning.trials import failure_reason, normalize, set_arguments
from stallscope.tuning.tuning import pooled
from stallscope.tuning.noise import Rate
from stallscope.tuning.trials import TrialResult
from stallscope.tuning.tuning import TuneResult


def test_failure_reasons() -> None:
    ok = {"exit_code": 0, "failure": None, "steady_steps": 30}
    assert failure_reason(0, ok, "") is None
    assert failure_reason(0, {**ok, "steady_steps": 0}, "") == "no training steps were measured"
    assert failure_reason(0, {**ok, "steady_steps": 0, "loaders": [{"role": "train"}]}, "") \
        == "no training steps were measured"
    assert failure_reason(0, {**ok, "steady_steps": 0, "loaders": []}, "") \
        == "no torch DataLoader was created: tune changes DataLoader arguments only"
    crash = {"exit_code": 1, "steady_steps": 3,
             "failure": {"where": "main", "type": "RuntimeError", "message": "planted main failure at step 3"}}
    assert failure_reason(1, crash, "") == "crashed in the script: RuntimeError: planted main failure at step 3"
    worker = {**crash, "failure": {"where": "worker", "type": "ValueError", "message": "bad"}}
    assert failure_reason(1, worker, "").startswith("crashed in a DataLoader worker")
    oom = {**crash, "failure": {"where": "main", "type": "OutOfMemoryError", "message": "CUDA out of memory"}}
    assert failure_reason(1, oom, "").startswith("out of memory")
    assert failure_reason(137, {"exit_code": 137, "failure": None, "steady_steps": 2}, "") \
        == "out of memory (killed by SIGKILL)"
    assert failure_reason(2, None, "stallscope run: script not found: x.py").endswith("script not found: x.py")
    assert failure_reason(3, {"exit_code": 3, "failure": None, "steady_steps": 9}, "") \
        == "the script exited with code 3"
    exited = {"exit_code": 3, "steady_steps": 9, "failure": {"where": "main", "type": "exit", "message": None}}
    assert failure_reason(3, exited, "") == "the script exited with code 3"  # not "crashed in the script: exit: None"


def test_a_run_that_ended_well_without_a_summary_says_why_not_that_it_failed() -> None:
    """Exit 0 and no summary: the trial's run ended well but its summary could not be written (a full disk, where
    its stderr is lost too), which "stallscope run failed (exit 0)" misread."""
    ended = "the run ended (exit 0) but its summary could not be written: "
    assert failure_reason(0, None, "", disk_full=True) == ended + "the disk holding the trial folder is full"
    said = "stallscope run: error: the summary JSON was not written to s.json: Disk quota exceeded"
    assert failure_reason(0, None, said) == ended + said
    assert "failed (exit 0)" not in failure_reason(0, None, "")
    assert failure_reason(2, None, "", disk_full=True) == \
        "stallscope run failed (exit 2): the disk holding the trial folder is full"
    assert failure_reason(2, None, "") == "stallscope run failed (exit 2): no summary written"


def test_set_arguments_in_knob_order() -> None:
    assert set_arguments({"persistent_workers": True, "num_workers": 4, "prefetch_factor": None}) == [
        "--set", "num_workers=4", "--set", "persistent_workers=true", "--set", "prefetch_factor=none"]


def test_normalize() -> None:
    assert normalize({"num_workers": 0, "prefetch_factor": 4, "persistent_workers": True}) == {
        "num_workers": 0, "prefetch_factor": None, "persistent_workers": False, "pin_memory": False}
    assert normalize({"num_workers": 2})["prefetch_factor"] == 2


def test_pooled_rate_of_repeats() -> None:
    runs = [TrialResult(i, "confirm", {}, {}, ok=True, rate=Rate(v, 3.0, 20)) for i, v in enumerate((100.0, 110.0))]
    runs.append(TrialResult(3, "confirm", {}, {}, ok=False, reason="timed out"))
    rate = pooled(runs)
    assert rate.value == 105.0
    assert abs(rate.se - (18 ** 0.5) / 2) < 1e-9
    assert rate.steps == 40


def _tuned(original_rate: float, winner_rate: float, se: float) -> TuneResult:
    original = TrialResult(1, "original", {}, {"num_workers": 0}, True, rate=Rate(340.0, 9.0, 100))
    winner = TrialResult(4, "num_workers", {"num_workers": 3}, {"num_workers": 3}, True, rate=Rate(359.0, 9.0, 100))
    return TuneResult(["python", "train.py"], 100, [original, winner], [], original, winner, {"num_workers": 3},
                      Rate(original_rate, se, 100), Rate(winner_rate, se, 100), "trials", "/tmp/tune-folder")


def test_a_winner_that_confirms_slower_is_not_handed_out():
    from rich.console import Console

    from stallscope.render.tune import render

    console = Console(record=True, width=200)
    render(_tuned(343.6, 318.6, 3.0), console)  # as measured by tune_grid.py on 2026-12-01: 0.93x, beyond noise
    text = console.export_text()
    assert "0.93x" in text and "Keep the original configuration" in text
    assert "The change:" not in text and "--set" not in text.split("On confirmation:")[1]
    console = Console(record=True, width=200)
    render(_tuned(340.0, 380.0, 3.0), console)  # a gain that held: the change is printed as before
    text = console.export_text()
    assert "The change:" in text and "num_workers=3" in text and "Keep the original" not in text


def test_a_worse_ranked_recommendation_never_undoes_a_better_ones_settings() -> None:
    from stallscope.tuning.search import diagnosis_changes

    split = {"id": "split-the-cores", "overrides": {"torch_threads": 2, "num_workers": 2, "persistent_workers": True}}
    alone = {"id": "num-workers", "overrides": {"num_workers": 1, "prefetch_factor": 4}}
    assert diagnosis_changes([split, alone]) == {"torch_threads": 2, "num_workers": 2, "persistent_workers": True,
                                                 "prefetch_factor": 4}


def test_the_title_says_why_the_search_ended_in_words():
    from dataclasses import replace

    from rich.console import Console

    from stallscope.render.tune import render

    limited = replace(_tuned(340.0, 380.0, 3.0), stopped_by="budget", limit="--trials 6")
    assert limited.stopped_said == "stopped at its limit, --trials 6"
    assert replace(limited, limit="--budget 600 s").stopped_said == "stopped at its limit, --budget 600 s"
    assert replace(limited, stopped_by="converged").stopped_said == "search done"
    console = Console(record=True, width=200)
    render(limited, console)
    text = console.export_text()
    assert "(stopped at its limit, --trials 6)" in text and "(budget)" not in text
    assert limited.to_dict()["stopped_by"] == "budget"  # the JSON's vocabulary stays


def test_a_failed_original_says_where_its_output_is():
    from rich.console import Console

    from stallscope.render.tune import render

    original = TrialResult(1, "original", {}, {"num_workers": 0}, ok=False, reason="crashed in the script: "
                           "RuntimeError: boom", trial_dir="/tmp/tune-folder/trial-01-original")
    result = TuneResult(["python", "train.py"], 100, [original], [], original, None, {}, None, None, "original failed",
                        "/tmp/tune-folder")
    console = Console(record=True, width=200)
    render(result, console)
    text = console.export_text()
    assert "The original configuration failed (crashed in the script: RuntimeError: boom); nothing to tune against." \
        in text
    assert "Its output (stdout.txt, stderr.txt): /tmp/tune-folder/trial-01-original" in text

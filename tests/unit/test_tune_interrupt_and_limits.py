"""How tuning stops a trial when the tuner leaves early, and the run budget that leaves room for a candidate.

The trial here is a real subprocess in its own session, as ``launch`` starts every trial; the tuner's
"interrupt" is a SIGALRM whose handler raises, sent once the child is ready (no timing assumption).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from stallscope.tuning import trials
from stallscope.tuning.search import Budget, SearchOutcome
from stallscope.tuning.trials import TrialResult, launch
from stallscope.tuning.tuning import (
    _confirm,
    _Confirmed,
    _untried_note,
    min_trials,
    tune,
)
from tests.conftest import process_alive

CHILD = """
import os, signal, sys, time
from pathlib import Path
ready = Path(sys.argv[1])
def on_int(signum, frame):
    Path(str(ready) + ".sigint").write_text("1")
    if sys.argv[2] == "saves":
        sys.exit(0)
signal.signal(signal.SIGINT, on_int)
if sys.argv[2] == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
ready.write_text(str(os.getpid()))
while True:
    time.sleep(0.05)
"""


class LeftEarly(Exception):
    pass


def _interrupt_when_ready(ready: Path) -> threading.Thread:
    """SIGALRM to the main thread (its handler raises ``LeftEarly``) once the child wrote its pid."""
    main = threading.main_thread().ident

    def watch() -> None:
        deadline = time.monotonic() + 60  # a guard against hanging, not a timing assertion
        while not ready.is_file() and time.monotonic() < deadline:
            time.sleep(0.02)
        signal.pthread_kill(main, signal.SIGALRM)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def raising_alarm():
    def raise_left_early(signum, frame):
        raise LeftEarly

    previous = signal.signal(signal.SIGALRM, raise_left_early)
    yield
    signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("behaviour", ["saves", "stubborn"])
def test_a_trial_is_sent_sigint_then_killed_when_the_tuner_leaves(tmp_path, monkeypatch, raising_alarm, behaviour):
    """``saves`` exits on SIGINT (as ``stallscope run`` does after saving); ``stubborn`` ignores SIGINT and SIGTERM."""
    monkeypatch.setattr(trials, "INTERRUPT_GRACE_S", 0.5)
    monkeypatch.setattr(trials, "TERM_GRACE_S", 0.5)
    ready = tmp_path / "child.pid"
    _interrupt_when_ready(ready)
    with pytest.raises(LeftEarly):
        launch([sys.executable, "-c", CHILD, str(ready), behaviour], tmp_path, 600, dict(os.environ))
    pid = int(ready.read_text())
    assert Path(f"{ready}.sigint").is_file(), "the trial was not given SIGINT first"
    assert not process_alive(pid), "the trial outlived the tuner"


def test_min_trials_leaves_room_for_one_candidate_and_its_confirmation() -> None:
    assert min_trials(1) == 4  # original, candidate, winner and original again
    assert min_trials(2) == 6
    assert min_trials(0) == 4  # one round at least, as tune runs it


def test_tune_refuses_a_trial_budget_with_no_room_before_running(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no room for a candidate"):
        tune(["python", "train.py"], trials=3, store=tmp_path / "store")
    assert not (tmp_path / "store").exists()


def _original(wall_s: float = 8.0) -> TrialResult:
    from stallscope.tuning.noise import Rate

    return TrialResult(1, "original", {}, {"num_workers": 0}, True, rate=Rate(100.0, 2.0, 40), wall_s=wall_s)


def _never_called(*args):
    raise AssertionError("nothing should be confirmed")


def test_a_time_budget_that_ran_only_the_original_says_so_and_what_budget_would_do() -> None:
    original = _original(wall_s=8.0)
    outcome = SearchOutcome([original], original, original, "budget")
    confirmed = _Confirmed()
    assert _confirm(outcome, 1, _never_called, confirmed) == []  # not "nothing beat the original"
    [note] = _untried_note(outcome, Budget(seconds=20, reserve=2))
    assert note.startswith("no candidate was tried") and "--budget 32" in note  # 8 s x (original, candidate, 2)


def test_a_search_that_tried_candidates_keeps_its_verdict() -> None:
    original = _original()
    other = TrialResult(2, "num_workers", {"num_workers": 1}, {"num_workers": 1}, True, rate=original.rate)
    outcome = SearchOutcome([original, other], original, original, "converged")
    assert _confirm(outcome, 1, _never_called, _Confirmed()) == [
        "no configuration beat the original by more than the noise: keep it as it is"]
    assert _untried_note(outcome, Budget(trials=10)) == []


def test_a_confirmation_run_under_other_programs_load_is_said() -> None:
    """The tester's confirmation ran while other programs kept a CPU busy, and tune said nothing: the confirmed
    gain compares runs that had different shares of the machine."""
    from stallscope.tuning.noise import Rate

    original = _original()
    winner = TrialResult(2, "num_workers", {"num_workers": 2}, {"num_workers": 2}, True, rate=Rate(150.0, 2.0, 40))
    outcome = SearchOutcome([original, winner], original, winner, "converged")
    load = {"confirm-winner": 0.1, "confirm-original": 1.04}

    def evaluate(overrides, label, config):
        return TrialResult(3, label, overrides, config, True, rate=Rate(120.0, 2.0, 40), other_cpus=load[label])

    assert _confirm(outcome, 1, evaluate, _Confirmed()) == [
        "other programs kept CPUs busy during the confirmation (confirm-original 1.04 CPUs): the confirmed figures "
        "are for a machine that busy, and may move on a quiet one; run tune again when it is quiet to be sure"]
    load["confirm-original"] = 0.2  # under the threshold report uses too: nothing to say
    assert _confirm(outcome, 1, evaluate, _Confirmed()) == []

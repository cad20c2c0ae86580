"""What tune says after confirming its winner: a change is handed out only where the confirmation measured it
faster than the original beyond the noise (issue 43, case 6: "Confirmed ... within noise of each other on
confirmation", then "The change: ..." all the same)."""

from __future__ import annotations

from rich.console import Console

from stallscope.render.tune import render
from stallscope.tuning.noise import Rate
from stallscope.tuning.trials import TrialResult
from stallscope.tuning.tuning import TuneResult


def _result(original_rate: Rate, winner_rate: Rate) -> TuneResult:
    original = TrialResult(1, "original", {}, {"num_workers": 0}, True, rate=Rate(100.0, 3.0, 40), wall_s=10.0)
    winner = TrialResult(2, "diagnosis", {"num_workers": 2}, {"num_workers": 2}, True, rate=Rate(130.0, 3.0, 40),
                         wall_s=10.0)
    confirmation = [TrialResult(3, "confirm-winner", {"num_workers": 2}, {"num_workers": 2}, True, rate=winner_rate),
                    TrialResult(4, "confirm-original", {}, {"num_workers": 0}, True, rate=original_rate)]
    return TuneResult(command=["python", "train.py"], steps=40, trials=[original, winner], confirmation=confirmation,
                      original=original, winner=winner, winner_overrides={"num_workers": 2},
                      original_confirmed=original_rate, winner_confirmed=winner_rate, stopped_by="converged",
                      folder="/tmp/tune-folder")


def _said(result: TuneResult) -> str:
    console = Console(record=True, width=200)
    render(result, console)
    return console.export_text()


def test_a_winner_within_noise_on_confirmation_is_not_handed_out_as_a_gain() -> None:
    result = _result(Rate(100.0, 4.0, 40), Rate(104.0, 4.0, 40))  # 4 apart, 2 x hypot(4, 4) = 11.3 allowed
    assert result.confirmed_within_noise
    said = _said(result)
    assert "The change:" not in said and "Without editing code" not in said
    assert "Confirmed:" not in said
    assert "No setting tried was confirmed better than the original" in said
    document = result.to_dict()
    assert document["confirmed"] is False
    assert document["set_args"] == [] and document["dataloader_kwargs"] == "" and document["in_code"] == ""
    assert document["winner_overrides"] == {"num_workers": 2}  # what was tried stays on record


def test_a_winner_confirmed_beyond_the_noise_is_the_change() -> None:
    result = _result(Rate(100.0, 4.0, 40), Rate(140.0, 4.0, 40))
    said = _said(result)
    assert "Confirmed:" in said and "1.40x" in said and "The change:" in said
    document = result.to_dict()
    assert document["confirmed"] is True and document["set_args"] == ["--set", "num_workers=2"]
    assert "No setting tried" not in said


def test_a_winner_slower_on_confirmation_is_not_the_change() -> None:
    result = _result(Rate(100.0, 1.0, 40), Rate(80.0, 1.0, 40))
    said = _said(result)
    assert "The change:" not in said and "ran slower than the original" in said
    assert result.to_dict()["confirmed"] is False

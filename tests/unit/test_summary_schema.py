"""The summary JSON only grows: summaries stored when their sessions were recorded (commit 77341c2, before
findings became data) must come out again, field for field and value for value, from today's analysis."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stallscope.analysis import analyze
from stallscope.render.summary import summary_dict
from stallscope.session import Session

DATA = Path(__file__).parent.parent / "data" / "summaries"
CONTRACT = ("schema", "exit_code", "steps", "samples", "wall_s", "verdict", "data_wait_fraction", "throughput",
            "bottleneck", "nodes", "recommendations", "distributed", "session")


def _missing_or_changed(stored: Any, now: Any, where: str = "") -> list[str]:
    if where.endswith("/change") and isinstance(stored, str) and isinstance(now, str):
        # A change's words may say more (where it goes in the user's code); the --set part is the contract.
        command = stored.split("(in code:")[0].rstrip()
        return [] if now.startswith(command) else [f"{where}: {stored!r} -> {now!r}"]
    if (where.endswith("/reason") or where.startswith("/bottleneck/evidence[")) and isinstance(stored, str) \
            and isinstance(now, str):
        # A reason, or a line of evidence, may say more (an estimate the prediction counts, where a straggler
        # differs from the other ranks); what it said stays, word for word.
        return [] if now.startswith(stored) else [f"{where}: {stored!r} -> {now!r}"]
    if where.endswith("/predicted_speedup") and isinstance(stored, float) and isinstance(now, float):
        return []  # predictions follow the throughput model, which improves; that there is one is the contract
    if where in ("/capacity/cpu_budget_samples_per_s", "/system/other_cores_mean") and isinstance(stored, float) \
            and isinstance(now, float):
        # The cores' budget, and the CPU the model counts as other programs' (since 2026-12-01 without the ticks
        # in which a just-started worker ran unseen), follow the model too; the figure being there is the contract.
        return []
    if "/by_call_s/" in where and isinstance(stored, float) and isinstance(now, float):
        # A call's seconds are its share of its stage's (issue 43, case 6: never more than the stage), so they follow
        # the stage split; the call being there is the contract.
        return []
    if isinstance(stored, dict):
        if not isinstance(now, dict):
            return [f"{where}: now {type(now).__name__}"]
        return [problem for key, value in stored.items()
                for problem in (_missing_or_changed(value, now[key], f"{where}/{key}") if key in now
                                else [f"{where}/{key}: missing"])]
    if isinstance(stored, list) and where == "/notes":  # notes are advice, and a newer analysis may add some
        return [] if isinstance(now, list) and all(n in now for n in stored) else [f"{where}: a note went missing"]
    if isinstance(stored, list):
        if not isinstance(now, list) or len(now) != len(stored):
            return [f"{where}: list changed"]
        return [p for i, (a, b) in enumerate(zip(stored, now)) for p in _missing_or_changed(a, b, f"{where}[{i}]")]
    return [] if stored == now else [f"{where}: {stored!r} -> {now!r}"]


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.iterdir()))
def test_stored_summary_is_a_subset_of_todays(name: str) -> None:
    folder = DATA / name
    stored = json.loads((folder / "summary.json").read_text())
    session = Session.load(folder / "session.json")
    now = json.loads(json.dumps(summary_dict(session, analyze(session), "session.json")))
    assert _missing_or_changed(stored, now) == []
    assert set(CONTRACT) <= set(now)


def test_recommendations_carry_their_overrides_as_data() -> None:
    session = Session.load(DATA / "image-pipeline" / "session.json")
    recs = summary_dict(session, analyze(session), None)["recommendations"]
    by_id = {r["id"]: r for r in recs}
    assert by_id["num-workers"]["overrides"] == {"num_workers": 2}  # the change text says --set num_workers=2
    assert by_id["reduced-size-decode"]["overrides"] == {}  # a code change: nothing to --set


def test_the_checker_sees_a_removed_or_changed_field() -> None:
    assert _missing_or_changed({"a": {"b": 1}}, {"a": {"b": 1, "c": 2}}) == []
    assert _missing_or_changed({"a": {"b": 1}}, {"a": {}}) == ["/a/b: missing"]
    assert _missing_or_changed({"a": [1, 2]}, {"a": [1, 3]}) == ["/a[1]: 2 -> 3"]
    assert _missing_or_changed({"change": "--set a=1   (in code: x)"}, {"change": "--set a=1   (in code: x at y)"}) == []
    assert _missing_or_changed({"change": "--set a=1"}, {"change": "--set a=2"}) != []


def test_the_capacity_says_the_loads_its_costs_were_measured_under() -> None:
    session = Session.load(DATA / "image-pipeline" / "session.json")
    analysis = analyze(session)
    capacity = summary_dict(session, analysis, None)["capacity"]
    model = analysis.capacity.model
    assert capacity["recorded_load_cost"] == round(model.recorded_load_cost, 4)
    assert capacity["recorded_compute_load_cost"] == round(model.recorded_compute_load_cost, 4)
    assert capacity["recorded_compute_load_cost"] >= capacity["recorded_load_cost"] >= 1.0
    assert capacity["recorded_computing_share"] == round(model.recorded_computing_share, 4)
    assert (model.workers == 0) == (capacity["recorded_computing_share"] == 0.0)  # no workers: none beside them

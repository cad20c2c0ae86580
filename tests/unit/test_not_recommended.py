"""A likely fix left out of the advice says why, in one line (issue 43, case 6).

The demo, run while other programs kept 1.4 of its 2 CPUs busy, said "num_workers=0: nothing overlaps" and no
recommendation mentioned workers, nor why not: with about one CPU left to the job, a worker only moves the loading
off the training process's core. The why-not is a finding (its cause and figures) said in words by the renderers.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from stallscope.analysis import analyze
from stallscope.analysis.capacity import ThroughputModel
from stallscope.analysis.findings import LoaderSummary, Recommendation, WorkerPipeline
from stallscope.analysis.recommend import MIN_GAIN, not_recommended, recommend
from stallscope.analysis.steps import step_stats
from stallscope.render import html, terminal, words
from stallscope.render.summary import summary_dict
from stallscope.session import Session

BUSY_DEMO = Path(__file__).parent.parent / "data" / "sessions" / "busy-starved-demo" / "session.json"


def _train(workers: int = 0) -> LoaderSummary:
    pipeline = WorkerPipeline(0, workers, 50, 1.0, {"decode": 0.4, "transform": 0.4}, {}, 800, 0.8, 0.8, 0.0, 0.0,
                              {}, None, None, [], None, None, None, 0.0, 0)
    return LoaderSummary(0, "train", "train.py:1", {"num_workers": workers}, {}, 50, 1, 0.0, 0.0, pipeline)


def _loaded_model(usable: float) -> ThroughputModel:
    """8 ms of loading and 2 ms of compute per sample, all CPU, measured with num_workers=0."""
    return ThroughputModel({"decode": 0.004, "transform": 0.004}, 0.002, 0.002, 0, usable)


def test_workers_left_out_on_a_machine_others_keep_busy_say_so_with_the_figures() -> None:
    # 2 CPUs, other programs on 1.2 of them: the job has 0.8, counted as 1
    model = _loaded_model(usable=0.8)
    train = _train(workers=0)
    seconds = {"decode": 0.4, "transform": 0.4, "compute": 0.2}
    recs = [r for r in recommend("input-bound", _steps(), train, seconds, 2, model=model,
                                 other_cpus=1.2) if "num_workers" in r.overrides]
    assert recs == []  # on 0.8 of a CPU a worker gains nothing
    [why] = [n for n in not_recommended("input-bound", train, model, [], seconds, 2, other_cpus=1.2)
             if n.id == "num-workers"]
    assert why.node == "loader" and why.cause == "other-load"
    assert why.facts["other_cpus"] == 1.2 and why.facts["cpus"] == 2 and why.facts["workers"] == 0
    assert why.facts["best_speedup"] < MIN_GAIN <= why.facts["quiet_speedup"]  # quiet, workers would pay
    said = words.not_recommended(why)
    assert "\n" not in said.reason
    assert said.reason.startswith("other programs kept 1.2 of the 2 CPUs busy, leaving this job about 0.8")
    assert f"on a quiet machine {why.facts['quiet_workers']} workers are predicted at " in said.reason


def test_workers_left_out_on_a_quiet_machine_say_their_own_cause() -> None:
    model = _loaded_model(usable=2.0)
    busy_compute = replace(model, compute_per_sample_s=0.02, main_cpu_per_sample_s=0.04, main_occupancy=2.0)
    [why] = [n for n in not_recommended("balanced", _train(0), busy_compute, [], {"compute": 1.0}, 2)
             if n.id == "num-workers"]
    assert why.cause == "compute-takes-the-cores"
    assert "a worker would take its core from the compute" in words.not_recommended(why).reason


def test_no_why_not_where_workers_are_advised_or_not_likely() -> None:
    model = _loaded_model(usable=2.0)
    advised = [Recommendation("num-workers", "loader", 1.6, {"num_workers": 2})]
    assert not_recommended("input-bound", _train(0), model, advised, {"decode": 1.0}, 2) == []
    assert not_recommended("compute-bound", _train(0), model, [], {"compute": 1.0}, 2) == []
    # as many workers as CPUs already: more is no likely fix
    assert [n for n in not_recommended("input-bound", _train(2), model, [], {"decode": 1.0}, 2)
            if n.id == "num-workers"] == []


def test_a_limiting_stages_fix_predicted_under_the_threshold_says_so() -> None:
    """Halving transform is predicted to gain under 5% where the CPUs, not transform, hold the job back."""
    model = ThroughputModel({"transform": 0.001}, 0.02, 0.02, 0, 1.0)
    train = _train(0)
    seconds = {"transform": 0.3, "compute": 0.7}
    [why] = [n for n in not_recommended("input-bound", train, model, [], seconds, 1) if n.node == "transform"]
    assert why.cause == "below-min-gain" and why.facts["predicted_speedup"] < MIN_GAIN
    assert f"predicted at {why.facts['predicted_speedup']:.2f}x" in words.not_recommended(why).reason


def test_the_busy_demo_says_why_not_workers_in_the_terminal_and_the_summary() -> None:
    """The demo as recorded on a 2-CPU machine that other programs kept busy (1.4 CPUs)."""
    session = Session.load(BUSY_DEMO)
    analysis = analyze(session)
    assert analysis.other_cpus > 1.0 and analysis.train_loader.config["num_workers"] == 0
    assert not any("num_workers" in r.overrides for r in analysis.recommendations)
    [why] = [n for n in analysis.not_recommended if n.id == "num-workers"]
    assert why.cause == "other-load"
    summary = json.loads(json.dumps(summary_dict(session, analysis, None)))
    [entry] = [n for n in summary["not_recommended"] if n["id"] == "num-workers"]
    assert entry["node"] == "loader" and entry["cause"] == "other-load"
    assert entry["reason"] == words.not_recommended(why).reason and entry["facts"]["cpus"] == 2
    console = Console(record=True, width=400)
    terminal.render(session, analysis, console)
    lines = [line for line in console.export_text().splitlines() if line.startswith("not advised:")]
    assert lines == [f"not advised: {words.not_recommended(why).title}: {entry['reason']}"]
    report = html.render(session, analysis, plotly_js="")
    assert html._e(entry["reason"]) in report


def _steps():
    """Steps of a real run (the recommendation reads their wait and wall time only here)."""
    return step_stats(Session.load(BUSY_DEMO))

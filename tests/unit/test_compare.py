"""Deltas between runs and the noise test, on hand-made per-step samples (seeded, exact)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from stallscope.history.compare import MIN_STEPS, compare
from stallscope.render.markdown import render_compare
from stallscope.history.runs import RunRow


def make_row(run_id: str, durations_ms: list[float], wait_share: float = 0.5, command=("python", "train.py"),
             overrides=None, env="e1") -> RunRow:
    durations = [round(d * 1000) for d in durations_ms]
    waits = [round(d * wait_share) for d in durations]
    ordered = sorted(durations)
    total_s = sum(durations) / 1e6
    return RunRow(
        run_id=run_id, recorded_at=0.0, started_wall=1_700_000_000.0, command=list(command), cwd="/w",
        overrides=overrides or {}, environment={}, env_fingerprint=env, git_commit="a" * 40, exit_code=0,
        ended_by="exit", verdict="input-bound", bottleneck="storage", steps=len(durations) + 1,
        steady_steps=len(durations), wall_s=total_s + 1, step_median_s=ordered[int(0.5 * (len(ordered) - 1) + 0.5)] / 1e6,
        step_p90_s=ordered[int(0.9 * (len(ordered) - 1) + 0.5)] / 1e6, steps_per_s=len(durations) / total_s,
        samples_per_s=8 * len(durations) / total_s, data_wait_fraction=sum(waits) / sum(durations),
        node_seconds={"storage": total_s * wait_share, "compute": total_s * (1 - wait_share)},
        gpu_util_mean=None, peak_device_mem_bytes=None, peak_rss_bytes=2**30, session_path=None,
        step_detail={"duration_us": durations, "wait_us": waits, "samples": [8] * len(durations)})


def noisy(center_ms: float, n: int = 30, spread: float = 0.08, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [center_ms * (1 + rng.uniform(-spread, spread)) for _ in range(n)]


def test_same_distribution_is_within_noise():
    result = compare([make_row("a", noisy(40, seed=1)), make_row("b", noisy(40, seed=2))])
    tested = [row for row in result.rows if row.metric.statistic is not None]
    assert {r.metric.key for r in tested} == {"step_median_s", "step_p90_s", "steps_per_s", "samples_per_s",
                                              "data_wait_fraction"}
    assert all(r.deltas[1].verdict == "noise" for r in tested)
    assert result.row("node:storage").deltas[1].verdict == "untested"


def test_halved_step_time_is_real_and_better():
    result = compare([make_row("a", noisy(40, seed=1)), make_row("b", noisy(20, seed=2), wait_share=0.1)])
    throughput = result.row("steps_per_s").deltas[1]
    assert throughput.verdict == "real"
    assert throughput.relative == pytest.approx(1.0, abs=0.1)
    assert throughput.interval[0] > 0.5
    assert result.row("step_median_s").deltas[1].verdict == "real"
    wait = result.row("data_wait_fraction").deltas[1]
    assert wait.verdict == "real" and wait.change == pytest.approx(-0.4, abs=0.01)


def test_a_clear_but_tiny_shift_is_not_reported_as_a_change():
    # Identical noise, 6% slower: the interval excludes zero but the change is below the noise floor.
    base = noisy(40, n=200, spread=0.01, seed=3)
    rows = [make_row("a", base), make_row("b", [d * 1.06 for d in base])]
    delta = compare(rows).row("step_median_s").deltas[1]
    assert delta.interval[0] > 0 and delta.verdict == "noise"
    assert compare(rows, min_effect=0.05).row("step_median_s").deltas[1].verdict == "real"


def test_too_few_steps_are_not_tested():
    result = compare([make_row("a", [40.0] * (MIN_STEPS - 1)), make_row("b", noisy(20))])
    delta = result.row("steps_per_s").deltas[1]
    assert delta.verdict == "untested" and "fewer than" in delta.reason


def test_result_is_reproducible():
    rows = [make_row("a", noisy(40, seed=1)), make_row("b", noisy(30, seed=2))]
    assert compare(rows).row("step_p90_s").deltas[1] == compare(rows).row("step_p90_s").deltas[1]


def test_markdown_table_with_three_runs():
    rows = [make_row("run-a", noisy(40, seed=1), command=("python", "train.py", "--tag", "a|b`c")),
            make_row("run-b", noisy(40, seed=2)),
            make_row("run-c", noisy(20, seed=3), overrides={"num_workers": 2}, env="e2")]
    text = render_compare(compare(rows))
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("| metric"))
    assert header == "| metric | A | B | Δ B vs A | C | Δ C vs A |"
    throughput = next(line for line in lines if line.startswith("| throughput (steps/s)"))
    cells = [c.strip() for c in throughput.split(" | ")]
    assert "within noise" in cells[3] and "**beyond noise** (better)" in cells[5]
    assert "a\\|b'c" in text  # a pipe in a command cannot break the table
    assert "`--set num_workers=2`" in text
    assert "environments differ" in text
    assert all(line.count("|") - line.count("\\|") == header.count("|") for line in lines
               if line.startswith("| ") and "metric" not in line and lines.index(line) > lines.index(header))


def test_compare_needs_two_runs():
    with pytest.raises(ValueError):
        compare([make_row("a", noisy(40))])


def test_a_typical_step_that_stays_while_the_slow_steps_change_is_said():
    """Uneven steps: every fourth step of the baseline is slow (a worker's batch); the candidate's are even at the
    same typical step. The median does not move, the throughput does: the report says why they disagree."""
    base = [40.0 if i % 4 else 200.0 for i in range(60)]
    even = [41.0] * 60
    result = compare([make_row("a", base), make_row("b", even)])
    assert result.row("step_median_s").deltas[1].verdict == "noise"
    assert result.row("steps_per_s").deltas[1].verdict == "real"
    assert result.typical_and_total_disagree() == [1]
    assert "for B, the median step and the throughput disagree" in render_compare(result)
    agreeing = compare([make_row("a", noisy(40, seed=1)), make_row("b", noisy(20, seed=2))])
    assert agreeing.typical_and_total_disagree() == []
    assert "disagree" not in render_compare(agreeing)



def test_a_median_and_a_throughput_that_moved_the_same_way_are_not_said_to_disagree():
    """Both faster, only one of them past the noise floor: they agree, and nothing is said."""
    rows = [make_row("a", noisy(40, n=200, spread=0.01, seed=3)),
            make_row("b", [d * 0.905 for d in noisy(40, n=200, spread=0.01, seed=3)])]
    result = compare(rows)
    # the median 9.5% faster (under the 10% floor), the throughput 10.5% higher (past it)
    assert result.row("step_median_s").deltas[1].verdict == "noise"
    assert result.row("steps_per_s").deltas[1].verdict == "real"
    assert result.typical_and_total_disagree() == []


def test_a_change_from_about_zero_is_said_in_the_unit_not_as_a_percentage():
    from stallscope.history.compare import METRICS, Delta
    from stallscope.render.markdown import format_delta

    per_step = next(m for m in METRICS if m.key == "node:decode")
    # 0.04 ms -> 1.5 ms shows as 0.0 -> 1.5 in the table: "+3650%" would say nothing
    grown = Delta(0.00146, 0.00146 / 0.00004, "untested", None, "no per-step distribution")
    assert format_delta(per_step, grown) == "+1.5 ms from about 0"
    from_nothing = Delta(0.002, None, "untested", None, "no per-step distribution")
    assert format_delta(per_step, from_nothing) == "+2.0 ms from about 0"
    assert format_delta(per_step, Delta(0.0, 0.0, "untested", None, "no per-step distribution")) == "+0.0%"
    # a baseline the table shows stays a percentage, with its interval
    median = next(m for m in METRICS if m.key == "step_median_s")
    halved = Delta(-0.010, -0.5, "real", (-0.55, -0.45))
    assert format_delta(median, halved) == "-50.0% **beyond noise** (better) [-55.0…-45.0%]"


def test_other_programs_load_is_a_row_said_in_cpus_and_a_note_names_the_loaded_run():
    quiet = make_row("a", noisy(100.0))
    loaded = make_row("b", noisy(130.0, seed=1))
    quiet = replace(quiet, step_detail={**quiet.step_detail, "other_cpus": 0.05})
    loaded = replace(loaded, step_detail={**loaded.step_detail, "other_cpus": 0.47})
    result = compare([quiet, loaded])
    row = next(r for r in result.rows if r.metric.key == "other_cpus")
    assert row.values == [0.05, 0.47]
    text = render_compare(result)
    assert "| other programs' load (CPUs) | 0.05 | 0.47 | +0.42 CPUs |" in text  # not +840%
    assert "> Note: other programs kept 0.47 CPUs during B's steps: that run had less of the machine" in text
    # a history written before the figure was kept has no such row and no note
    older = compare([make_row("a", noisy(100.0)), make_row("b", noisy(130.0, seed=1))])
    assert all(r.metric.key != "other_cpus" for r in older.rows)
    assert "other programs" not in render_compare(older)


def test_a_runs_history_row_keeps_the_load_other_programs_put_on_its_steady_steps():
    """From a real session (the stored image pipeline, sampled): its other_cpus, rounded, in the row's step detail."""
    from pathlib import Path

    from stallscope.analysis import analyze
    from stallscope.history.runs import step_detail
    from stallscope.session import Session

    session = Session.load(Path(__file__).parent.parent / "data" / "summaries" / "image-pipeline" / "session.json")
    analysis = analyze(session)
    assert analysis.system.present and analysis.steps.steady
    assert step_detail(replace(analysis, other_cpus=0.4321))["other_cpus"] == 0.43
    unsampled = replace(analysis, system=replace(analysis.system, present=False))
    assert "other_cpus" not in step_detail(unsampled)  # not measured: absent, never 0


def test_a_failed_a_stopped_an_empty_run_and_a_run_compared_with_itself_are_said():
    base = make_row("a", noisy(100.0))
    failed = replace(make_row("b", noisy(100.0, seed=1)), exit_code=1)
    stopped = replace(make_row("c", noisy(100.0, seed=2)), exit_code=130)
    empty = replace(make_row("d", [50.0]), exit_code=1, steady_steps=0, step_detail={})
    text = render_compare(compare([base, failed, stopped, empty, base]))
    assert "| exit code | 0 | 1 | 130 | 1 | 0 |" in text
    assert "> Note: B failed (exit code 1): its figures are of the 30 steady steps before that." in text
    assert "> Note: C was stopped (exit code 130): its figures are of the 30 steady steps before that." in text
    assert "> Note: D measured no steady step: its rates are unknown (–)" in text
    assert "> Note: E is the same run as A: it is compared with itself." in text
    assert "Note: A" not in text  # the baseline ended well


def test_history_suggests_comparing_the_newest_two_measured_runs_of_one_command():
    from stallscope.cli.history_cmd import pair_to_compare

    failed = replace(make_row("f", [50.0]), steady_steps=0, command=["python", "other.py"])
    a, b = make_row("a", noisy(100.0)), make_row("b", noisy(90.0, seed=1))
    other = make_row("o", noisy(80.0, seed=2), command=("python", "other.py"))
    # the history's rows come newest first; the pair comes older first (compare's baseline)
    assert pair_to_compare([other, b, a, failed]) == (a, b)  # not the failed run, nor a lone run of another script
    assert pair_to_compare([other, a, failed]) == (a, other)  # two measured runs, of two scripts: the newest two
    assert pair_to_compare([a, failed]) is None

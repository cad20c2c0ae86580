"""The ``compare`` table as GitHub-flavoured markdown, ready to paste into a pull request."""

from __future__ import annotations

import shlex
import time

from stallscope.analysis.system_metrics import OTHER_LOAD_NOTABLE_CPUS
from stallscope.history.compare import (
    CONFIDENCE,
    MIN_SHARE_EFFECT,
    RESAMPLES,
    Comparison,
    Delta,
    Metric,
)
from stallscope.history.runs import RunRow
from stallscope.render import words
from stallscope.render.safe_text import one_line, printable
from stallscope.render.words import failures

GIB = 1024 ** 3


def _cell(text: str) -> str:
    """A table cell: pipes and newlines would break the row, backticks the code span, control codes the terminal
    it is printed on."""
    return one_line(text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ").replace("`", "'"))


def _code(text: str) -> str:
    return f"`{_cell(text)}`" if text else "–"


def _label(index: int) -> str:
    return chr(ord("A") + index) if index < 26 else f"R{index}"


def format_value(metric: Metric, value: float | None) -> str:
    if value is None:
        return "–"
    if metric.unit == "ms":
        return f"{1000 * value:.1f}"
    if metric.unit == "%":
        return f"{100 * value:.1f}" if metric.share else f"{value:.1f}"
    if metric.unit == "GiB":
        return f"{value / GIB:.2f}"
    if value >= 100:
        return f"{value:.0f}"
    return f"{value:.2f}"


def _near_zero_baseline(metric: Metric, delta: Delta) -> bool:
    """A baseline that shows as 0 at the table's precision (or is 0): a percentage of it means nothing (+2846% for
    0.05 -> 1.5 ms), so the change is said in the metric's unit instead."""
    if delta.relative is None or delta.change is None:
        return True
    if delta.relative == 0:  # no change, from whatever baseline
        return False
    return format_value(metric, abs(delta.change / delta.relative)).strip("0.") == ""


def _signed(metric: Metric, value: float) -> str:
    """A change in the metric's own unit, with its sign, at the table's precision."""
    shown = format_value(metric, abs(value))
    return ("-" if value < 0 and shown.strip("0.") else "+") + shown


def format_delta(metric: Metric, delta: Delta | None) -> str:
    if delta is None or delta.change is None:
        return "–"
    if metric.share:
        text = f"{100 * delta.change:+.1f} pts"
        interval = f"{100 * delta.interval[0]:+.1f}…{100 * delta.interval[1]:+.1f}" if delta.interval else ""
    elif metric.absolute or delta.relative is None or _near_zero_baseline(metric, delta):
        unit = metric.unit if metric.unit == "%" else f" {metric.unit}"
        text = f"{_signed(metric, delta.change)}{unit}" + ("" if metric.absolute else " from about 0")
        interval = ""  # relative to about nothing: no figure worth showing
    else:
        text = f"{100 * delta.relative:+.1f}%"
        interval = f"{100 * delta.interval[0]:+.1f}…{100 * delta.interval[1]:+.1f}%" if delta.interval else ""
    if delta.verdict == "real":
        better = ((delta.change < 0) == (metric.better == "lower")) if metric.better else None
        mark = {True: " (better)", False: " (worse)", None: ""}[better]
        return f"{text} **beyond noise**{mark}" + (f" [{interval}]" if interval else "")
    if delta.verdict == "noise":
        return f"{text} within noise" + (f" [{interval}]" if interval else "")
    untested_by_design = delta.reason == "no per-step distribution"  # said once, under the table
    return f"{text} (not tested: {delta.reason})" if delta.reason and not untested_by_design else text


def _when(run: RunRow) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(run.started_wall)) if run.started_wall else "–"


def short_commit(commit: str | None) -> str:
    if not commit:
        return ""
    return commit[:12] + ("+dirty" if commit.endswith("+dirty") else "")


def _overrides(run: RunRow) -> str:
    return words.overrides(run.overrides)


def _run_notes(runs: list[RunRow], labels: list[str]) -> list[str]:
    """Notes on runs that are no fair comparison: one compared with itself, one that measured no steady step, one
    that failed or was stopped (its steps are measured, but its end is not the training's)."""
    lines = []
    ids = [r.run_id for r in runs]
    for i, run in enumerate(runs):
        if run.run_id in ids[:i]:
            lines += [f"> Note: {labels[i]} is the same run as {labels[ids.index(run.run_id)]}: it is compared with "
                      "itself.", ""]
        elif not run.steady_steps:
            lines += [f"> Note: {labels[i]} measured no steady step: its rates are unknown (–), and what it shows "
                      "is of its start only.", ""]
        elif run.exit_code:
            how = "was stopped" if run.exit_code in failures.STOPPED_EXIT_CODES else "failed"
            lines += [f"> Note: {labels[i]} {how} (exit code {run.exit_code}): its figures are of the "
                      f"{run.steady_steps} steady steps before that.", ""]
    return lines


def render_compare(comparison: Comparison) -> str:
    runs = comparison.runs
    labels = [_label(i) for i in range(len(runs))]
    lines = ["### stallscope compare", ""]
    lines.append("| | " + " | ".join(f"{label}{' (baseline)' if i == 0 else ''}" for i, label in enumerate(labels))
                 + " |")
    lines.append("|---|" + "---|" * len(runs))
    lines.append("| run | " + " | ".join(_code(r.run_id) for r in runs) + " |")
    lines.append("| started | " + " | ".join(_when(r) for r in runs) + " |")
    lines.append("| command | " + " | ".join(_code(shlex.join(r.command)) for r in runs) + " |")
    lines.append("| overrides | " + " | ".join(_code(_overrides(r)) for r in runs) + " |")
    lines.append("| git | " + " | ".join(_code(short_commit(r.git_commit)) for r in runs) + " |")
    lines.append("| verdict | " + " | ".join(_cell(f"{r.verdict or '–'} ({r.bottleneck or '–'})") for r in runs) + " |")
    lines.append("| steady steps | " + " | ".join(str(r.steady_steps if r.steady_steps is not None else "–")
                                                  for r in runs) + " |")
    lines.append("| exit code | " + " | ".join(str(r.exit_code if r.exit_code is not None else "–") for r in runs)
                 + " |")
    lines.append("")
    lines += _run_notes(runs, labels)
    header = ["metric", labels[0]]
    for label in labels[1:]:
        header += [label, f"Δ {label} vs {labels[0]}"]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|---|--:|" + "--:|---|" * (len(runs) - 1))
    for row in comparison.rows:
        metric = row.metric
        cells = [f"{metric.label} ({metric.unit})", format_value(metric, row.values[0])]
        for value, delta in zip(row.values[1:], row.deltas[1:]):
            cells += [format_value(metric, value), format_delta(metric, delta)]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    lines.append("")
    for i in comparison.typical_and_total_disagree():
        lines.append(f"> Note: for {labels[i]}, the median step and the throughput disagree: the steps are uneven "
                     "(slow epoch starts, a slow batch every few steps), and the time moved between the typical "
                     "step and the others. Throughput counts every step: it is what the training's length follows.")
        lines.append("")
    loaded = [(label, r.step_detail.get("other_cpus")) for label, r in zip(labels, runs)]
    loaded = [(label, cpus) for label, cpus in loaded if isinstance(cpus, (int, float)) and
              cpus >= OTHER_LOAD_NOTABLE_CPUS]
    if loaded:
        said = ", ".join(f"{cpus:.2f} CPUs during {label}'s steps" for label, cpus in loaded)
        lines.append(f"> Note: other programs kept {said}: that run had less of the machine, and part of its "
                     "change may come from there (compare runs made under the same load).")
        lines.append("")
    fingerprints = {r.env_fingerprint for r in runs}
    if len(fingerprints) > 1:
        lines.append("> Note: the runs' environments differ (machine, Python or library versions); "
                     "some of the change may come from there.")
        lines.append("")
    lines.append(f"Δ is the change against {labels[0]}. *Beyond noise*: the {100 * CONFIDENCE:.0f}% bootstrap "
                 f"interval of the change ({RESAMPLES} resamples of each run's steady steps, shown in brackets) "
                 f"excludes zero and the change is at least {100 * comparison.min_relative_effect:.0f}% "
                 f"({100 * MIN_SHARE_EFFECT:.0f} points for shares). Per-node, per-rank, GPU, memory and load rows "
                 "have no per-step distribution and are not tested.")
    return printable("\n".join(lines)) + "\n"

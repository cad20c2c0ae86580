"""Compare runs of the history: deltas against the first run, and whether each is beyond noise.

A run's steady steps are a sample of its step-time distribution. Each delta is tested with a
percentile bootstrap: both runs' steps are resampled (with replacement, a fixed seed so the answer
is reproducible), the statistic is recomputed on each pair of resamples, and the change counts as
real when its ``CONFIDENCE`` interval excludes zero *and* it is at least ``MIN_RELATIVE_EFFECT``
(``MIN_SHARE_EFFECT`` points for shares). The second condition keeps a statistically clear but
tiny shift (a busier machine, a warmer cache) from being reported as a change.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from stallscope.constants import NODE_IDS
from stallscope.history.runs import RunRow

CONFIDENCE = 0.99
RESAMPLES = 1000
#: Two runs of one configuration on a busy machine differ by several percent however many steps they have: below
#: this, a change is noise (calibration: history-min-relative-effect).
MIN_RELATIVE_EFFECT = 0.10
MIN_SHARE_EFFECT = 0.02
MIN_STEPS = 5
SEED = 20240607

StepSample = Sequence[tuple[int, int, int | None]]  # (duration_us, wait_us, samples) per steady step


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


def _median(steps: StepSample) -> float | None:
    return _quantile([s[0] for s in steps], 0.5) / 1e6 if steps else None


def _p90(steps: StepSample) -> float | None:
    return _quantile([s[0] for s in steps], 0.9) / 1e6 if steps else None


def _steps_per_s(steps: StepSample) -> float | None:
    total = sum(s[0] for s in steps)
    return len(steps) / (total / 1e6) if total > 0 else None


def _samples_per_s(steps: StepSample) -> float | None:
    total = sum(s[0] for s in steps)
    if total <= 0 or any(s[2] is None for s in steps):
        return None
    return sum(s[2] or 0 for s in steps) / (total / 1e6)


def _wait_share(steps: StepSample) -> float | None:
    total = sum(s[0] for s in steps)
    return sum(s[1] for s in steps) / total if total > 0 else None


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    unit: str  # "ms" | "/s" | "%" | "GiB" | "s" | "CPUs"
    better: str | None  # "lower" | "higher" | None
    share: bool = False
    absolute: bool = False  # a change is said in the unit, not as a percentage (a load from about nothing)
    statistic: Callable[[StepSample], float | None] | None = None


METRICS: tuple[Metric, ...] = (
    Metric("step_median_s", "step time median", "ms", "lower", statistic=_median),
    Metric("step_p90_s", "step time p90", "ms", "lower", statistic=_p90),
    Metric("steps_per_s", "throughput", "steps/s", "higher", statistic=_steps_per_s),
    Metric("samples_per_s", "throughput", "samples/s", "higher", statistic=_samples_per_s),
    Metric("data_wait_fraction", "data-wait share", "%", "lower", share=True, statistic=_wait_share),
    *(Metric(f"node:{node}", f"{node} per step", "ms", "lower") for node in NODE_IDS),
    Metric("gpu_util_mean", "GPU utilization mean", "%", "higher"),
    Metric("peak_device_mem_bytes", "peak device memory", "GiB", None),
    Metric("peak_rss_bytes", "peak host RSS (process tree)", "GiB", None),
    Metric("other_cpus", "other programs' load", "CPUs", None, absolute=True),
)


@dataclass(frozen=True)
class Delta:
    """A candidate run against the baseline for one metric."""
    change: float | None  # candidate - baseline, in the metric's own unit (a fraction for shares)
    relative: float | None  # change / baseline
    verdict: str  # "real" | "noise" | "untested"
    interval: tuple[float, float] | None  # CONFIDENCE interval of the change (relative; points for shares)
    reason: str = ""


@dataclass(frozen=True)
class MetricComparison:
    metric: Metric
    values: list[float | None]  # one per run
    deltas: list[Delta | None]  # one per run; None for the baseline


@dataclass(frozen=True)
class Comparison:
    runs: list[RunRow]
    rows: list[MetricComparison]
    confidence: float = CONFIDENCE
    min_relative_effect: float = MIN_RELATIVE_EFFECT
    min_share_effect: float = MIN_SHARE_EFFECT

    def row(self, key: str) -> MetricComparison:
        return next(r for r in self.rows if r.metric.key == key)

    def typical_and_total_disagree(self) -> list[int]:
        """The runs (by index) whose median step and throughput tell different stories: one beyond noise and the
        other not, or both beyond it in opposite directions. Where steps are uneven (slow epoch starts, a slow
        batch in every few) the typical step can stay put while the time moves into the others; throughput
        counts every step."""
        try:
            median, total = self.row("step_median_s"), self.row("steps_per_s")
        except StopIteration:
            return []
        disagree = []
        for i, (m, t) in enumerate(zip(median.deltas, total.deltas)):
            if m is None or t is None or "untested" in (m.verdict, t.verdict):
                continue
            faster = -(m.relative or 0.0)  # a shorter median step is faster, as is more throughput
            more = t.relative or 0.0
            if m.verdict == t.verdict == "real":
                if (faster > 0) != (more > 0):
                    disagree.append(i)
            elif m.verdict != t.verdict:  # one beyond noise: the other moved less than half as far, or back
                real, noise = (more, faster) if t.verdict == "real" else (faster, more)
                if noise * real <= 0 or abs(noise) < abs(real) / 2:
                    disagree.append(i)
        return disagree


def step_sample(run: RunRow) -> list[tuple[int, int, int | None]]:
    detail = run.step_detail
    durations = detail.get("duration_us") or []
    waits = detail.get("wait_us") or [0] * len(durations)
    samples = detail.get("samples") or [None] * len(durations)
    return list(zip(durations, waits, samples))


def rank_metrics(runs: Sequence[RunRow]) -> list[Metric]:
    """Per-rank rows for distributed runs: each rank's throughput, data-wait and sync shares."""
    ranks = sorted({int(r["rank"]) for run in runs for r in run.step_detail.get("ranks") or []})
    return [metric for rank in ranks for metric in (
        Metric(f"rank:{rank}:steps_per_s", f"rank {rank} throughput", "steps/s", "higher"),
        Metric(f"rank:{rank}:data_wait_fraction", f"rank {rank} data-wait share", "%", "lower", share=True),
        Metric(f"rank:{rank}:sync_fraction", f"rank {rank} sync share", "%", "lower", share=True))]


def metric_value(run: RunRow, metric: Metric) -> float | None:
    if metric.key.startswith("rank:"):
        _, rank, name = metric.key.split(":", 2)
        entry = next((r for r in run.step_detail.get("ranks") or [] if str(r.get("rank")) == rank), None)
        value = entry.get(name) if entry else None
        return float(value) if isinstance(value, (int, float)) else None
    if metric.key == "other_cpus":
        value = run.step_detail.get("other_cpus")
        return float(value) if isinstance(value, (int, float)) else None
    if metric.key.startswith("node:"):
        node = metric.key[5:]
        if not run.node_seconds or not run.steady_steps:
            return None
        return float(run.node_seconds.get(node, 0.0)) / run.steady_steps
    value = getattr(run, metric.key)
    return float(value) if value is not None else None


def _bootstrap(base: StepSample, cand: StepSample, metrics: Sequence[Metric],
               rng: random.Random) -> dict[str, list[float]]:
    """Per metric, the bootstrap distribution of the change (relative, or in points for shares)."""
    out: dict[str, list[float]] = {m.key: [] for m in metrics}
    for _ in range(RESAMPLES):
        a = rng.choices(base, k=len(base))
        b = rng.choices(cand, k=len(cand))
        for m in metrics:
            assert m.statistic is not None
            va, vb = m.statistic(a), m.statistic(b)
            if va is None or vb is None:
                continue
            if m.share:
                out[m.key].append(vb - va)
            elif va > 0:
                out[m.key].append(vb / va - 1.0)
    return out


def _delta(metric: Metric, base_value: float | None, value: float | None, boot: list[float] | None,
           reason: str, min_effect: float) -> Delta:
    if base_value is None or value is None:
        return Delta(None, None, "untested", None, "not measured in both runs")
    change = value - base_value
    relative = change / base_value if base_value else None
    if metric.statistic is None:
        return Delta(change, relative, "untested", None, "no per-step distribution")
    if not boot:
        return Delta(change, relative, "untested", None, reason)
    alpha = (1 - CONFIDENCE) / 2
    low, high = _quantile(boot, alpha), _quantile(boot, 1 - alpha)
    effect = abs(change) if metric.share else abs(relative if relative is not None else 0.0)
    threshold = MIN_SHARE_EFFECT if metric.share else min_effect
    real = (low > 0 or high < 0) and effect >= threshold
    return Delta(change, relative, "real" if real else "noise", (low, high))


def compare(runs: Sequence[RunRow], min_effect: float = MIN_RELATIVE_EFFECT) -> Comparison:
    """Each run after the first against the first (the baseline); ``min_effect`` is the noise floor."""
    if len(runs) < 2:
        raise ValueError("compare needs at least two runs")
    tested = [m for m in METRICS if m.statistic is not None]
    base = runs[0]
    base_steps = step_sample(base)
    boots: list[dict[str, list[float]]] = []
    reasons: list[str] = []
    for cand in runs[1:]:
        cand_steps = step_sample(cand)
        if len(base_steps) < MIN_STEPS or len(cand_steps) < MIN_STEPS:
            boots.append({})
            reasons.append(f"fewer than {MIN_STEPS} steady steps")
        else:
            boots.append(_bootstrap(base_steps, cand_steps, tested, random.Random(SEED)))
            reasons.append("")
    rows = []
    for metric in (*METRICS, *rank_metrics(runs)):
        values = [metric_value(r, metric) for r in runs]
        if all(v is None for v in values) or (metric.key.startswith("node:") and not any(values)):
            continue
        deltas: list[Delta | None] = [None]
        for i in range(1, len(runs)):
            deltas.append(_delta(metric, values[0], values[i], boots[i - 1].get(metric.key), reasons[i - 1],
                                 min_effect))
        rows.append(MetricComparison(metric, values, deltas))
    return Comparison(list(runs), rows, min_relative_effect=min_effect)

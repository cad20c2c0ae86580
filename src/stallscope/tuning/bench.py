"""``stallscope.tuning.bench``: how fast the input pipeline can go alone, and how fast the model could go.

Two runs of the user's script: a normal one (its measured throughput), and one in bench mode
(``recorder/bench_mode.py``) that drains the script's first DataLoader with no model at a few
worker counts (*input capacity*) and then replays loaded batches to the script's own loop
(*ceiling*: the compute-only rate, the speed if data were free). The ceiling over the current
throughput is the most any input-side fix can gain (the DS-Analyzer idea, on the user's script).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from stallscope import paths
from stallscope.environment import usable_cpus
from stallscope.settings import ENV_BENCH
from stallscope.tuning.trials import TrialResult, launch, run_trial, trial_command

DEFAULT_SECONDS = 3.0
DEFAULT_STEPS = 50


@dataclass(frozen=True)
class BenchResult:
    command: list[str]
    normal: TrialResult | None
    capacity: list[dict[str, Any]]  # one per worker count: num_workers, samples_per_s, batches_per_s, ...
    ceiling: dict[str, Any] | None
    script_num_workers: int | None
    folder: str
    errors: list[str] = field(default_factory=list)

    @property
    def unit(self) -> str:
        return "samples/s" if self._use_samples else "batches/s"

    @property
    def _use_samples(self) -> bool:
        return bool(self.ceiling and self.ceiling.get("samples_per_s")) and \
            (self.normal is None or self.normal.unit == "samples/s")

    def _rate(self, entry: dict[str, Any] | None, key_samples: str, key_other: str) -> float | None:
        if not entry:
            return None
        return entry.get(key_samples) if self._use_samples else entry.get(key_other)

    @property
    def best_capacity(self) -> dict[str, Any] | None:
        ok = [c for c in self.capacity if self._rate(c, "samples_per_s", "batches_per_s")]
        return max(ok, key=lambda c: self._rate(c, "samples_per_s", "batches_per_s") or 0.0) if ok else None

    @property
    def capacity_rate(self) -> float | None:
        return self._rate(self.best_capacity, "samples_per_s", "batches_per_s")

    @property
    def ceiling_rate(self) -> float | None:
        return self._rate(self.ceiling, "samples_per_s", "steps_per_s")

    @property
    def throughput(self) -> float | None:
        return self.normal.rate.value if self.normal and self.normal.ok and self.normal.rate else None

    @property
    def max_input_gain(self) -> float | None:
        """Ceiling over current throughput: the most any input-side fix can give."""
        if self.ceiling_rate and self.throughput:
            return self.ceiling_rate / self.throughput
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": "stallscope.bench/1", "command": self.command, "unit": self.unit,
            "throughput": self.throughput,
            "throughput_se": self.normal.rate.se if self.throughput and self.normal and self.normal.rate else None,
            "capacity": self.capacity, "best_capacity": self.best_capacity, "capacity_rate": self.capacity_rate,
            "ceiling": self.ceiling, "ceiling_rate": self.ceiling_rate, "max_input_gain": self.max_input_gain,
            "script_num_workers": self.script_num_workers,
            "normal": self.normal.to_dict() if self.normal else None, "folder": self.folder, "errors": self.errors,
        }


def default_worker_counts(cpus: int | None = None) -> list[int]:
    if cpus is None:
        cpus = usable_cpus()
    return sorted({0, 1, max(1, cpus // 2), cpus})


def bench(command: list[str], *, workers: Sequence[int] | None = None, seconds: float = DEFAULT_SECONDS,
          max_batches: int = 400, ceiling_steps: int = 30, ceiling_batches: int = 8, normal_steps: int = DEFAULT_STEPS,
          normal: bool = True, timeout_s: float = 600.0, store: str | os.PathLike[str] | None = None,
          progress: Callable[[str], None] | None = None) -> BenchResult:
    store_dir = paths.store_dir(store)
    folder = paths.store_folder(store_dir, "bench", paths.new_run_id())
    say = progress or (lambda text: None)
    errors: list[str] = []
    normal_result = None
    if normal:
        say(f"normal run ({normal_steps} steps)")
        normal_result = run_trial(command, {}, index=1, label="normal", trial_dir=folder / "normal", store=store_dir,
                                  steps=normal_steps, timeout_s=timeout_s)
        if not normal_result.ok:
            errors.append(f"normal run failed: {normal_result.reason}")
    say("input pipeline alone, then replayed batches")
    bench_dir = folder / "bench-mode"
    bench_dir.mkdir(parents=True, exist_ok=True)
    out = bench_dir / "bench.json"
    config = {"out": str(out), "workers": list(workers if workers is not None else default_worker_counts()),
              "seconds": seconds, "max_batches": max_batches, "ceiling_steps": ceiling_steps,
              "ceiling_batches": ceiling_batches}
    env = dict(os.environ, **{ENV_BENCH: json.dumps(config)})
    cmd = trial_command(command, {}, None, bench_dir / "summary.json", store_dir)
    exit_code, _wall = launch(cmd, bench_dir, timeout_s, env)
    report: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    if exit_code is None:
        errors.append(f"bench run timed out after {timeout_s:.0f} s")
    elif exit_code != 0:
        errors.append(f"bench run exited with code {exit_code}; see {bench_dir / 'stderr.txt'}")
    if not report:
        errors.append("the script never iterated a DataLoader, so there was nothing to bench")
    for entry in report.get("capacity", []):
        if entry.get("error"):
            errors.append(f"{entry['num_workers']} workers: {entry['error']}")
    if report and not report.get("ceiling"):
        errors.append(report.get("ceiling_error") or "the ceiling was not measured (the script left its loop early)")
    result = BenchResult(command=list(command), normal=normal_result, capacity=report.get("capacity", []),
                         ceiling=report.get("ceiling"), script_num_workers=report.get("script_num_workers"),
                         folder=str(folder), errors=errors)
    paths.write_file(folder / "bench.json", json.dumps(result.to_dict(), indent=1, default=str))  # never a half file
    return result


__all__ = ["BenchResult", "bench", "default_worker_counts"]

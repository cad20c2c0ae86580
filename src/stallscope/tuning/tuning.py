"""``stallscope.tuning.tune``: diagnose, try, measure, confirm, on the user's unmodified script."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stallscope import paths
from stallscope.analysis.system_metrics import OTHER_LOAD_NOTABLE_CPUS
from stallscope.settings import PROCESS_SETTINGS, in_code
from stallscope.tuning.noise import DEFAULT_Z, Rate, better, mean_rate, within_noise
from stallscope.tuning.search import Budget, SearchOutcome, Tuner, config_key, overrides_for
from stallscope.tuning.trials import TrialResult, run_trial, set_arguments

DEFAULT_STEPS = 50
DEFAULT_TRIALS = 10
#: A trial may take this many times as long as the original run before it counts as hung.
TIMEOUT_FACTOR = 3.0
MIN_TIMEOUT_S = 60.0
FIRST_TIMEOUT_S = 600.0

OnStart = Callable[[int, str, dict[str, Any]], None]
OnDone = Callable[[TrialResult], None]


@dataclass(frozen=True)
class TuneResult:
    command: list[str]
    steps: int
    trials: list[TrialResult]  # the search, original first
    confirmation: list[TrialResult]  # winner and original, alternating
    original: TrialResult | None
    winner: TrialResult | None
    winner_overrides: dict[str, Any]
    original_confirmed: Rate | None
    winner_confirmed: Rate | None
    stopped_by: str
    folder: str
    z: float = DEFAULT_Z
    notes: list[str] = field(default_factory=list)
    limit: str = ""  # what bounded the search: "--trials 10" (the default), "--budget 600 s", or both

    @property
    def stopped_said(self) -> str:
        """Why the search ended, in words: ``stopped_by`` is the JSON's fixed vocabulary."""
        if self.stopped_by == "budget":
            return f"stopped at its limit, {self.limit}" if self.limit else "stopped at its limit"
        return {"converged": "search done", "original failed": "the original run failed",
                "interrupted": "interrupted"}.get(self.stopped_by, self.stopped_by)

    @property
    def unit(self) -> str:
        return self.original.unit if self.original else "samples/s"

    @property
    def speedup(self) -> float | None:
        if self.original_confirmed and self.winner_confirmed and self.original_confirmed.value > 0:
            return self.winner_confirmed.value / self.original_confirmed.value
        return None

    @property
    def runs(self) -> int:
        return len(self.trials) + len(self.confirmation)

    @property
    def confirmed_within_noise(self) -> bool | None:
        if self.original_confirmed and self.winner_confirmed:
            return within_noise(self.original_confirmed, self.winner_confirmed, self.z)
        return None

    @property
    def confirmed(self) -> bool:
        """Whether the search's winner is the change to make: run again against the original, it measured faster
        by more than the noise (``change_confirmed``)."""
        return change_confirmed(self.winner_overrides, self.original_confirmed, self.winner_confirmed, self.z)

    @property
    def change(self) -> dict[str, Any]:
        """The overrides to hand out: the winner's where its gain was confirmed, none otherwise (``winner_overrides``
        keeps what was tried)."""
        return self.winner_overrides if self.confirmed else {}

    def set_args(self) -> list[str]:
        return set_arguments(self.change)

    def dataloader_kwargs(self) -> str:
        """The change as DataLoader keyword arguments, ready to paste (settings of the training process, such as
        ``torch_threads``, are no DataLoader arguments: ``in_code`` says them as their torch calls)."""
        return ", ".join(f"{k}={_python_literal(v)}" for k, v in _ordered(self.change)
                         if k not in PROCESS_SETTINGS)

    def in_code(self) -> str:
        """The change in the user's framework and where it goes (``TrainingArguments(...)`` at the script's
        line for the Hugging Face Trainer, the ``DataLoader(...)`` call otherwise)."""
        if not self.change:
            return ""
        return in_code(dict(_ordered(self.change)), self.original.code if self.original else None)

    def rerun_command(self) -> list[str]:
        """The whole training with the change, recorded, without editing code: no ``--steps``, which only
        bounded the trials."""
        return ["stallscope", "run", *self.set_args(), "--", *self.command]

    def to_dict(self) -> dict[str, Any]:
        def rate(r: Rate | None) -> dict[str, Any] | None:
            return {"value": round(r.value, 3), "se": round(r.se, 3), "steps": r.steps} if r else None

        return {
            "schema": "stallscope.tune/1",
            "command": self.command, "steps_per_trial": self.steps, "unit": self.unit,
            "stopped_by": self.stopped_by, "runs": self.runs,
            "trials": [t.to_dict() for t in self.trials],
            "confirmation": [t.to_dict() for t in self.confirmation],
            "original_confirmed": rate(self.original_confirmed), "winner_confirmed": rate(self.winner_confirmed),
            "speedup": round(self.speedup, 3) if self.speedup else None,
            # the search's winner; set_args, dataloader_kwargs, in_code and rerun are the change to make, empty
            # unless "confirmed" (faster than the original beyond the noise when both ran again)
            "winner_overrides": self.winner_overrides, "confirmed": self.confirmed, "set_args": self.set_args(),
            "dataloader_kwargs": self.dataloader_kwargs(), "in_code": self.in_code(), "rerun": self.rerun_command(),
            "folder": self.folder, "notes": self.notes,
        }


def _ordered(overrides: dict[str, Any]) -> list[tuple[str, Any]]:
    from stallscope.tuning.trials import KNOBS

    return sorted(overrides.items(), key=lambda kv: KNOBS.index(kv[0]) if kv[0] in KNOBS else 99)


def _python_literal(value: Any) -> str:
    return repr(value) if not isinstance(value, str) else repr(value)


def pooled(results: list[TrialResult]) -> Rate | None:
    """The mean rate of repeated runs of one configuration, with the standard error of that mean."""
    rates = [r.rate for r in results if r.ok and r.rate is not None]
    return mean_rate(rates) if rates else None


def reserved_runs(confirm_rounds: int = 1) -> int:
    """Runs kept back for confirming a winner: each round is the winner and the original once."""
    return 2 * max(1, confirm_rounds)


def min_trials(confirm_rounds: int = 1) -> int:
    """The smallest ``trials`` that tries any candidate: the original, one candidate, and the runs kept back to
    confirm it. A smaller budget would measure only the original and then report that nothing beat it."""
    return 2 + reserved_runs(confirm_rounds)


class TuneInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) during ``tune``: ``result`` holds the runs that completed, ``stopped_by="interrupted"``,
    no change proposed (none was confirmed). Still a KeyboardInterrupt for callers that only stop."""

    def __init__(self, result: TuneResult, signum: int) -> None:
        super().__init__(f"tune interrupted after {result.runs} completed run(s)")
        self.result = result
        self.signum = signum


@dataclass
class _Confirmed:
    runs: list[TrialResult] = field(default_factory=list)  # filled as they complete, so an interrupt keeps them
    winner_overrides: dict[str, Any] = field(default_factory=dict)
    original: Rate | None = None
    winner: Rate | None = None


def tune(command: list[str], *, trials: int | None = None, budget_s: float | None = None,
         steps: int = DEFAULT_STEPS, tune_batch_size: bool = False, max_workers: int | None = None,
         trial_timeout_s: float | None = None, confirm_rounds: int = 1, z: float = DEFAULT_Z,
         store: str | os.PathLike[str] | None = None, on_start: OnStart | None = None,
         on_done: OnDone | None = None, numerics: bool = False) -> TuneResult:
    """Try DataLoader changes on the real script and confirm the fastest against the original.

    ``trials`` bounds all runs, confirmation included, and must leave room for one candidate
    (:func:`min_trials`); ``budget_s`` bounds wall time (the confirmation's share is reserved from the
    mean trial time). Without either, 10 runs. Interrupted, it raises :class:`TuneInterrupted` with
    the runs that completed (also written to the folder's ``tune.json``). ``numerics``: on a GPU, also try TF32
    matmuls and cuDNN's algorithm search (they change what is computed).
    """
    if trials is None and budget_s is None:
        trials = DEFAULT_TRIALS
    if trials is not None and trials < min_trials(confirm_rounds):
        raise ValueError(f"trials={trials} leaves no room for a candidate; at least {min_trials(confirm_rounds)}")
    store_dir = paths.store_dir(store)
    folder = paths.store_folder(store_dir, "tune", paths.new_run_id())
    reserve = reserved_runs(confirm_rounds)
    budget = Budget(trials=trials, seconds=budget_s, reserve=reserve)
    counter = iter(range(1, 10_000))
    state: dict[str, Any] = {}

    def timeout() -> float:
        if trial_timeout_s is not None:
            return trial_timeout_s
        first = state.get("original")
        return max(MIN_TIMEOUT_S, TIMEOUT_FACTOR * first.wall_s) if first else FIRST_TIMEOUT_S

    def evaluate_overrides(overrides: dict[str, Any], label: str, intended: dict[str, Any]) -> TrialResult:
        index = next(counter)
        if on_start:
            on_start(index, label, overrides)
        result = run_trial(command, overrides, index=index, label=label, store=store_dir,
                           trial_dir=folder / f"trial-{index:02d}-{label}", steps=steps, timeout_s=timeout(),
                           intended=intended)
        if on_done:
            on_done(result)
        return result

    def evaluate(config: dict[str, Any], label: str) -> TrialResult:
        original = state.get("original")
        overrides = overrides_for(config, original.config) if original else {}
        result = evaluate_overrides(overrides, label, config)
        if original is None:
            state["original"] = result
        return result

    tuner = Tuner(evaluate, budget, tune_batch_size=tune_batch_size, z=z, max_workers=max_workers, numerics=numerics)
    confirmed = _Confirmed()
    limit = " or ".join([*([f"--trials {trials}"] if trials is not None else []),
                         *([f"--budget {budget_s:g} s"] if budget_s is not None else [])])
    common: dict[str, Any] = {"command": list(command), "steps": steps, "folder": str(folder), "z": z, "limit": limit}
    try:
        outcome: SearchOutcome = tuner.run()
        notes = _confirm(outcome, confirm_rounds, evaluate_overrides, confirmed)
    except KeyboardInterrupt as exc:
        partial = TuneResult(**common, trials=list(tuner.trials), confirmation=confirmed.runs,
                             original=tuner.original, winner=None, winner_overrides={}, original_confirmed=None,
                             winner_confirmed=None, stopped_by="interrupted",
                             notes=[*tuner.notes,
                                    _interrupted_note(len(tuner.trials) + len(confirmed.runs), str(folder))])
        with contextlib.suppress(OSError):  # an unwritable folder must not hide the interrupt
            _write(partial)
        raise TuneInterrupted(partial, int(getattr(exc, "signum", signal.SIGINT))) from exc
    notes = outcome.notes + notes + _untried_note(outcome, budget)
    result = TuneResult(**common, trials=outcome.trials, confirmation=confirmed.runs, original=outcome.original,
                        winner=outcome.best, winner_overrides=confirmed.winner_overrides,
                        original_confirmed=confirmed.original, winner_confirmed=confirmed.winner,
                        stopped_by=outcome.stopped_by, notes=notes)
    _write(result)
    return result


def _interrupted_note(runs: int, folder: str) -> str:
    return (f"interrupted: {runs} run(s) completed and nothing was confirmed, so no change is proposed. "
            f"Trial folders: {folder}")


def _write(result: TuneResult) -> None:
    paths.write_file(Path(result.folder, "tune.json"), json.dumps(result.to_dict(), indent=1))  # never a half file


def _confirm(outcome: SearchOutcome, confirm_rounds: int,
             evaluate_overrides: Callable[[dict[str, Any], str, dict[str, Any]], TrialResult],
             confirmed: _Confirmed) -> list[str]:
    """Run the search's winner and the original again, alternately, into ``confirmed``; the notes to print."""
    original, best = outcome.original, outcome.best
    if original is None or best is None:
        return []
    confirmed.winner_overrides = overrides_for(best.config, original.config) if best is not original else {}
    if not confirmed.winner_overrides:
        confirmed.original = confirmed.winner = original.rate
        if not _candidates(outcome):
            return []  # nothing else was tried: _untried_note says why
        return ["no configuration beat the original by more than the noise: keep it as it is"]
    order = []
    for r in range(max(1, confirm_rounds)):
        order += [("winner", "original")] if r % 2 == 0 else [("original", "winner")]
    runs: dict[str, list[TrialResult]] = {"winner": [], "original": []}
    for pair in order:
        for who in pair:
            result = evaluate_overrides(confirmed.winner_overrides if who == "winner" else {},
                                        f"confirm-{who}", best.config if who == "winner" else original.config)
            confirmed.runs.append(result)
            runs[who].append(result)
    confirmed.original, confirmed.winner = pooled(runs["original"]), pooled(runs["winner"])
    if confirmed.winner is None:
        return ["the winner's confirmation run failed; see its trial folder"]
    return _loaded_confirmation_note(confirmed.runs)


def change_confirmed(winner_overrides: dict[str, Any], original: Rate | None, winner: Rate | None,
                     z: float = DEFAULT_Z) -> bool:
    """A winner other than the original whose confirmation runs measured it faster than the original's by more than
    ``z`` combined standard errors: a tie or a loss on confirmation is no change to make."""
    return bool(winner_overrides) and original is not None and winner is not None and better(winner, original, z)


def _loaded_confirmation_note(runs: list[TrialResult]) -> list[str]:
    """Where other programs kept ``OTHER_LOAD_NOTABLE_CPUS`` or more busy during a confirmation run, say so: the
    confirmed gain compares runs that had different shares of the machine."""
    loaded = [r for r in runs if r.ok and r.other_cpus >= OTHER_LOAD_NOTABLE_CPUS]
    if not loaded:
        return []
    said = ", ".join(f"{r.label} {r.other_cpus:.2f}" for r in loaded)
    return [f"other programs kept CPUs busy during the confirmation ({said} CPUs): the confirmed figures are for a "
            "machine that busy, and may move on a quiet one; run tune again when it is quiet to be sure"]


def _candidates(outcome: SearchOutcome) -> list[TrialResult]:
    """The trials of another configuration than the original's (not the original run again)."""
    original = outcome.original
    key = config_key(original.config) if original is not None else None
    return [t for t in outcome.trials if config_key(t.config) != key]


def _untried_note(outcome: SearchOutcome, budget: Budget) -> list[str]:
    """When the original was the only run, say so and why: "nothing beat the original" would claim a
    comparison that never happened."""
    original = outcome.original
    if original is None or not original.ok or _candidates(outcome):
        return []
    if outcome.stopped_by == "budget":
        runs = len(outcome.trials)  # the original's, once or twice (run again under other programs' load)
        need = math.ceil(original.wall_s * (runs + 1 + budget.reserve))
        return [(f"no candidate was tried: the original run took {original.wall_s:.0f} s, and the budget kept no "
                 f"room for a candidate plus its {budget.reserve} confirmation run(s); --budget {need} (or more) "
                 "would try at least one")]
    return [("no candidate was tried: no other configuration was left to try within the limits given "
             "(see --max-workers)")]


__all__ = ["TuneInterrupted", "TuneResult", "min_trials", "pooled", "reserved_runs", "tune"]

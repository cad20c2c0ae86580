"""Which configurations to try, in which order, and when to stop. Pure: trials come from a callback.

Order: the original configuration; then what its diagnosis prescribes (every ``--set`` of its
recommendations at once, e.g. the predicted worker count); then a coordinate search, one
argument at a time (num_workers, persistent_workers, prefetch_factor, pin_memory when batches go
to a device, batch_size only when asked), climbing in one direction while each step is better
beyond noise (going up num_workers, one step further after a step that did not pay: one worker restarted at every
epoch can lose to none while two win). Before each argument the incumbent's own diagnosis is consulted again, since a
new worker count can reveal a new limit (e.g. worker restarts every epoch). A configuration
replaces the incumbent only when it is faster by more than ``z`` combined standard errors
(``DIAGNOSIS_Z`` for a change the diagnosis predicted: the prediction is prior evidence). A diagnosis that
predicted a real gain over the incumbent (``SECOND_LOOK_GAIN``) and measured a tie with it runs once more, and the mean
of its two runs faces the incumbent: one run on a shared machine moves by as much as such a gain.

Where the training computes on the CPU with several intra-op threads (``torch_threads`` above 1, no batches sent to
a device), the first argument is the split of the cores: fewer compute threads and as many more workers, both at
once. One at a time neither pays (a small CNN's 2 threads with 0 workers: one worker more measured 0.84x, one thread
fewer 0.80x, both together 1.33x), and the model cannot price it ahead where the threads' CPU overstates their
parallel speed-up (they spin between parallel regions).

Everything after the original starts from its diagnosis, which is for the machine as its run found it: where other
programs kept a good part of a CPU busy then (``OTHER_LOAD_NOTABLE_CPUS``), the model planned for fewer CPUs than the
trials will have, and the original's rate is low by that much. So a loaded original runs once more, and the run that
saw less load is the one the search starts from and compares against; the other run takes no further part (its
diagnosis is not followed, and it is never the final pick).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from stallscope.analysis.system_metrics import OTHER_LOAD_NOTABLE_CPUS
from stallscope.settings import overrides_text
from stallscope.tuning.noise import DEFAULT_Z, better, mean_rate, within_noise
from stallscope.tuning.trials import KNOBS, NUMERICS, TrialResult, normalize

Evaluate = Callable[[dict[str, Any], str], TrialResult]
WORKER_LADDER = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
PREFETCH_LADDER = (1, 2, 4, 8)
DIAGNOSIS_Z = 1.0
#: A final pick must be measured this much faster than the incumbent (calibration: tune-practical-gain).
PRACTICAL_GAIN = 1.03
#: Nor may its standard error be this share of its rate or more: a trial's is a few percent, a wild one's is no
#: evidence (calibration: tune-pick-rel-se).
PICK_REL_SE = 0.25
#: A diagnosis predicting at least this speedup over the incumbent it came from, that measured within the noise of it,
#: runs once more: one run on a shared machine moves by as much (calibration: tune-second-look-gain).
SECOND_LOOK_GAIN = 1.10


class BudgetExhausted(Exception):
    pass


@dataclass
class Budget:
    """At most ``trials`` runs and/or ``seconds`` of wall time, ``reserve`` runs kept for confirmation."""
    trials: int | None = None
    seconds: float | None = None
    reserve: int = 2
    clock: Callable[[], float] = time.monotonic
    started: float = field(default=0.0)
    used: int = 0
    spent_s: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.started = self.clock()

    def mean_trial_s(self) -> float:
        return sum(self.spent_s) / len(self.spent_s) if self.spent_s else 0.0

    def allows(self, extra: int = 1, keep_reserve: bool = True) -> bool:
        reserve = self.reserve if keep_reserve else 0
        if self.trials is not None and self.used + extra + reserve > self.trials:
            return False
        if self.seconds is not None and self.spent_s:
            elapsed = self.clock() - self.started
            if elapsed + self.mean_trial_s() * (extra + reserve) > self.seconds:
                return False
        return True

    def record(self, wall_s: float) -> None:
        self.used += 1
        self.spent_s.append(wall_s)


def diagnosis_changes(recommendations: Sequence[Mapping[str, Any]], numerics: bool = False) -> dict[str, Any]:
    """The DataLoader arguments the diagnosis prescribes (each recommendation's ``overrides``), limited to
    the knobs tuning may change (the batch size changes the training, so only when asked, by the search; the
    numerics, TF32 and cuDNN's search, likewise: only with ``numerics``). The
    recommendations come best first: a later one adds settings but never changes one a better one set (splitting
    the cores sets the workers its threads make room for; a worker count advised alone must not undo them)."""
    changes: dict[str, Any] = {}
    for rec in recommendations:
        overrides = rec.get("overrides") or {}
        for key, value in overrides.items():
            if key in KNOBS and key != "batch_size" and (numerics or key not in NUMERICS):
                changes.setdefault(key, value)
    return changes


def diagnosis_speedup(recommendations: Sequence[Mapping[str, Any]]) -> float:
    """The largest predicted speedup among recommendations that are a configuration change."""
    speedups = [float(r.get("predicted_speedup") or 1.0) for r in recommendations
                if set(r.get("overrides") or {}) & set(KNOBS)]  # a knob tuning may turn (not the numerics, say)
    return max(speedups, default=1.0)


def config_key(config: Mapping[str, Any]) -> tuple[Any, ...]:
    norm = normalize(config)
    return tuple(norm.get(k) for k in KNOBS)


def overrides_for(config: Mapping[str, Any], original: Mapping[str, Any]) -> dict[str, Any]:
    """The ``--set`` arguments that turn the original configuration into ``config``.

    Worker-only arguments are compared with what the script would get if only num_workers
    changed, so ``0 -> 2 workers`` does not also print torch's default prefetch_factor.
    """
    target = normalize(config)
    implied = normalize({**original, "num_workers": target["num_workers"]})
    out: dict[str, Any] = {}
    if target["num_workers"] != normalize(original)["num_workers"]:
        out["num_workers"] = target["num_workers"]
    for name in KNOBS:
        if name != "num_workers" and target.get(name) != implied.get(name):
            out[name] = target[name]
    return out


def _fewer_threads(threads: int) -> list[int]:
    """Thread counts to split ``threads`` down to, most first: one fewer, then halves, down to one."""
    counts = {threads - 1}
    half = threads // 2
    while half >= 1:
        counts.add(half)
        half //= 2
    return sorted((c for c in counts if 1 <= c < threads), reverse=True)


def _ladder(values: tuple[int, ...], current: int, cap: int | None = None) -> list[int]:
    ladder = sorted({v for v in values if cap is None or v <= cap} | {current})
    return ladder


@dataclass
class SearchOutcome:
    trials: list[TrialResult]
    original: TrialResult | None
    best: TrialResult | None
    stopped_by: str  # "converged" | "budget" | "original failed"
    notes: list[str] = field(default_factory=list)


class Tuner:
    """Drive the search. ``evaluate(config, label)`` runs one trial of a full knob configuration."""

    def __init__(self, evaluate: Evaluate, budget: Budget, *, tune_batch_size: bool = False,
                 z: float = DEFAULT_Z, max_workers: int | None = None, numerics: bool = False) -> None:
        self.evaluate = evaluate
        self.budget = budget
        self.tune_batch_size = tune_batch_size
        self.numerics = numerics  # also try the numerics the compute findings name (they change what is computed)
        self.z = z
        self.max_workers = max_workers
        self.trials: list[TrialResult] = []
        self.tried: dict[tuple[Any, ...], TrialResult] = {}
        self.best: TrialResult | None = None
        self.original: TrialResult | None = None
        self.diagnosed: set[tuple[Any, ...]] = set()
        self.parents: dict[tuple[Any, ...], TrialResult] = {}  # diagnosis trial -> the trial it came from
        self.superseded: TrialResult | None = None  # the original's run not kept, where it ran twice
        self.notes: list[str] = []  # what the search did that its trials alone do not say
        self._said: set[str] = set()

    # -- running one configuration -------------------------------------------------------------
    def _try(self, config: Mapping[str, Any], label: str) -> TrialResult | None:
        key = config_key(config)
        if key in self.tried:
            return self.tried[key]
        if self.original is not None and not self.budget.allows():
            raise BudgetExhausted
        result = self.evaluate(normalize(config), label)
        self.budget.record(result.wall_s)
        self.trials.append(result)
        self.tried[key] = result
        # A change the diagnosis predicted needs less evidence than a blind probe: the model is a
        # prior, so one combined standard error suffices there (the confirmation run still checks).
        z = min(self.z, DIAGNOSIS_Z) if label == "diagnosis" else self.z
        if result.ok and self.best is not None and self.best.rate is not None and result.rate is not None \
                and better(result.rate, self.best.rate, z):
            self.best = result
        return result

    def _improved(self, result: TrialResult | None, incumbent: TrialResult) -> bool:
        return result is not None and result is self.best and result is not incumbent

    # -- the search ------------------------------------------------------------------------------
    def run(self, original_config: Mapping[str, Any] | None = None) -> SearchOutcome:
        first = self._try(original_config or {}, "original")
        assert first is not None
        self.original = first
        if not first.ok:
            return SearchOutcome(self.trials, first, None, "original failed")
        first = self._quieter_original(first)
        self.original_config = dict(first.config)
        self.best = first
        try:
            self._apply_diagnosis()
            for knob in self._axes():
                self._apply_diagnosis()
                self._climb(knob)
        except BudgetExhausted:
            return self._outcome("budget")
        return self._outcome("converged")

    def _outcome(self, stopped_by: str) -> SearchOutcome:
        winner = self._winner()
        changed = set(overrides_for(winner.config, self.original_config)) & set(NUMERICS) if winner else set()
        if changed:
            self.notes.append(f"the winner changes the training's numerics ({', '.join(sorted(changed))}): it "
                              "computes in lower precision or other algorithms, so check the model's accuracy with it")
        return SearchOutcome(self.trials, self.original, winner, stopped_by, self.notes)

    def _quieter_original(self, first: TrialResult) -> TrialResult:
        """The original run again where other programs kept ``OTHER_LOAD_NOTABLE_CPUS`` or more busy during its
        steady steps (and the budget leaves room for it, a candidate and the confirmation): the run that saw less
        load is the original from then on, the other is ``superseded``. Said in the notes when it ran."""
        if first.other_cpus < OTHER_LOAD_NOTABLE_CPUS or not self.budget.allows(extra=2):
            return first
        again = self._run_again(first, "original-again")
        quieter = again.ok and again.rate is not None and again.other_cpus < first.other_cpus
        kept = again if quieter else first
        then = f"{again.other_cpus:.2f} busy then" if again.ok else f"that run failed: {again.reason}"
        self.notes.append(f"other programs kept {first.other_cpus:.2f} CPUs busy during the original's run, so it "
                          f"ran again ({then}); the search started from the {'second' if quieter else 'first'} run"
                          + (" (other programs stayed busy: the advice is for a machine that busy)"
                             if again.ok and kept.other_cpus >= OTHER_LOAD_NOTABLE_CPUS else ""))
        self.superseded = first if quieter else again
        if quieter:
            self.tried[config_key(first.config)] = again
            self.original = again
        return kept

    def _run_again(self, trial: TrialResult, label: str) -> TrialResult:
        """``trial``'s configuration once more, past ``_try``'s cache of what was tried: a trial of its own, on the
        budget, in the search's list."""
        again = self.evaluate(normalize(trial.config), label)
        self.budget.record(again.wall_s)
        self.trials.append(again)
        return again

    def _winner(self) -> TrialResult | None:
        """The fastest trial measured with a rate that is evidence (``PICK_REL_SE``), when it beats the search's
        incumbent by a practical margin.

        The significance test steers the climb (it must not wander on noise), but the final pick
        between configurations the climb could not tell apart is better made on the measured
        rates than on the order they were tried in; the confirmation run then measures it again.
        A trial whose rate is no evidence (steps so uneven, or so few, that its standard error is a
        quarter of it or more) does not take the pick (calibration: tune-pick-rel-se).
        Where the incumbent is what a diagnosis predicted, the prediction is evidence too: a configuration the
        climb tried blind displaces it only past ``z`` combined standard errors, as it would have in the climb
        (``PRACTICAL_GAIN`` alone let one take a pick it then lost head to head; calibration: tune-practical-gain).
        """
        incumbent = self.best
        if incumbent is None or incumbent.rate is None:
            return incumbent
        measured = [t for t in self.trials if t.ok and t.rate is not None and t is not self.superseded
                    and t.rate.rel_se < PICK_REL_SE]
        fastest = max(measured, key=lambda t: t.rate.value if t.rate is not None else float("-inf"), default=incumbent)
        if fastest.rate is None or fastest.rate.value < incumbent.rate.value * PRACTICAL_GAIN:
            return incumbent
        incumbent_predicted, fastest_predicted = (t.label.startswith("diagnosis") for t in (incumbent, fastest))
        other = config_key(fastest.config) != config_key(incumbent.config)
        if incumbent_predicted and not fastest_predicted and other and not better(fastest.rate, incumbent.rate, self.z):
            return incumbent
        return fastest

    def _apply_diagnosis(self) -> None:
        """Follow a diagnosis whose predicted rate could beat the incumbent, the most promising first.

        Any trial's diagnosis counts, not only the incumbent's: 2 workers restarted every epoch
        may lose to 0 workers while its diagnosis (keep workers alive) predicts the best of all.
        """
        while True:
            assert self.best is not None and self.best.rate is not None
            incumbent_key = config_key(self.best.config)
            candidates = []
            for trial in self.trials:
                key = config_key(trial.config)
                if not trial.ok or trial.rate is None or key in self.diagnosed or trial is self.superseded:
                    continue
                measured = self.tried.get(key, trial)  # over both runs where a diagnosis ran twice
                changes = diagnosis_changes(trial.recommendations, self.numerics and trial.uses_device)
                if "num_workers" in changes and self.max_workers is not None:
                    changes["num_workers"] = min(changes["num_workers"], self.max_workers)
                target = {**trial.config, **changes}
                if not changes or config_key(target) in self.tried:
                    self.diagnosed.add(key)
                    continue
                parent = self.parents.get(key)
                if parent is not None and parent.rate is not None and measured.rate is not None \
                        and not better(measured.rate, parent.rate, self.z):
                    changed = {k for k in KNOBS if trial.config.get(k) != parent.config.get(k)}
                    if changed & set(changes):
                        self.diagnosed.add(key)  # more of a change that did not pay: do not chain on it
                        continue
                speedup = diagnosis_speedup(trial.recommendations)
                predicted = (measured.rate or trial.rate).value * speedup
                if key == incumbent_key or predicted > self.best.rate.value:
                    candidates.append((predicted, trial, target, speedup))
            if not candidates:
                return
            _predicted, trial, target, speedup = max(candidates, key=lambda c: c[0])
            self.diagnosed.add(config_key(trial.config))
            self.parents.setdefault(config_key(target), trial)
            incumbent = self.best
            result = self._try(target, "diagnosis")
            if config_key(trial.config) == incumbent_key and speedup >= SECOND_LOOK_GAIN:
                self._second_look(result, incumbent, speedup)

    def _second_look(self, result: TrialResult | None, incumbent: TrialResult, speedup: float) -> None:
        """Run a diagnosis trial that tied the incumbent once more; the mean of both runs then faces the incumbent.

        The diagnosis predicted ``speedup`` (``SECOND_LOOK_GAIN`` or more) and its one run measured within the noise
        of the incumbent, neither past it by ``DIAGNOSIS_Z`` standard errors nor behind it by ``z``: on a machine
        where one run moves by 10-15%, that says nothing about the prediction either way, and taking nothing sends
        the climb down the incumbent's side. A run clearly slower refutes the prediction and is not repeated. The
        second run is said in the notes, with the mean and whether it was taken.
        """
        if result is None or not result.ok or result.rate is None or incumbent.rate is None \
                or result is self.best or not within_noise(result.rate, incumbent.rate, self.z) \
                or not self.budget.allows():
            return
        again = self._run_again(result, "diagnosis-again")
        if not again.ok or again.rate is None:
            self.notes.append(f"the diagnosis' {self._change_text(result)} tied the {self._who(incumbent)} and ran "
                              f"again, which failed: {again.reason}")
            return
        mean = mean_rate([result.rate, again.rate])
        taken = better(mean, incumbent.rate, DIAGNOSIS_Z)
        if taken:
            self.best = replace(again, rate=mean)
            self.tried[config_key(result.config)] = self.best
        unit = result.unit
        self.notes.append(
            f"the diagnosis' {self._change_text(result)} (predicted {speedup:.2f}x) measured {result.rate.value:.1f} "
            f"{unit} against the {self._who(incumbent)}'s {incumbent.rate.value:.1f}, within the noise, so it ran "
            f"again ({again.rate.value:.1f}); over both runs {mean.value:.1f} ± {mean.se:.1f}: "
            + ("taken, the search went on from it" if taken else f"not past the {self._who(incumbent)}, which stayed"))

    def _change_text(self, trial: TrialResult) -> str:
        changes = overrides_for(trial.config, self.original_config)
        return overrides_text(changes) or "configuration"

    def _who(self, trial: TrialResult) -> str:
        return "original" if trial is self.original else "incumbent"

    def _axes(self) -> list[str]:
        axes = ["num_workers", "persistent_workers", "prefetch_factor"]
        threads = self.best.config.get("torch_threads") if self.best is not None else None
        if any(t.uses_device for t in self.trials):
            axes.append("pin_memory")
        elif isinstance(threads, int) and threads > 1:  # a compute on the CPU, on several threads
            axes.insert(0, "split")
        if self.tune_batch_size:
            axes.append("batch_size")
        if self.numerics and any(t.uses_device for t in self.trials):
            axes += list(NUMERICS)
        elif self.numerics and "numerics" not in self._said:
            self._said.add("numerics")
            self.notes.append("--numerics: the job computes on the CPU, where TF32 and cuDNN's algorithm search "
                              "change nothing: not tried")
        return axes

    def _values(self, knob: str, current: Any) -> list[Any]:
        if knob == "num_workers":
            usable = self.original.usable_cpus or 1 if self.original else 1
            cap = self.max_workers if self.max_workers is not None else max(4, 2 * usable, current)
            return _ladder(WORKER_LADDER, current, cap)
        if knob == "prefetch_factor":
            return _ladder(PREFETCH_LADDER, current)
        if knob == "batch_size":
            base = int(self.original_config.get("batch_size") or 1)
            return sorted({max(1, base // 2), base, base * 2, current})
        return [False, True]

    def _split(self) -> None:
        """Fewer compute threads and as many more workers, at once: down the thread counts while each pays."""
        incumbent = self.best
        assert incumbent is not None
        threads, workers = incumbent.config.get("torch_threads"), incumbent.config.get("num_workers") or 0
        if not isinstance(threads, int) or threads <= 1:
            return
        for fewer in _fewer_threads(threads):
            before = self.best
            assert before is not None  # the incumbent, or a trial that beat it
            more = workers + threads - fewer
            if self.max_workers is not None and more > self.max_workers:
                return
            result = self._try({**before.config, "torch_threads": fewer, "num_workers": more}, "split")
            if not self._improved(result, before):
                return

    def _climb(self, knob: str) -> None:
        incumbent = self.best
        assert incumbent is not None
        if knob == "split":
            self._split()
            return
        current = incumbent.config.get(knob)
        if knob in ("persistent_workers", "prefetch_factor") and not incumbent.config.get("num_workers"):
            return
        if current is None and knob == "batch_size":
            return
        if knob == "matmul_precision":  # TF32 where it is off; "medium" (bf16) is a change no finding names
            if current == "highest":
                self._try({**incumbent.config, knob: "high"}, knob)
            return
        if knob == "cudnn_benchmark":
            if not current:
                self._try({**incumbent.config, knob: True}, knob)
            return
        if knob in ("autocast", "channels_last"):  # only where the diagnosis names them (a conv net; bfloat16 units)
            named = diagnosis_changes(incumbent.recommendations, numerics=True)
            if not current and knob in named:
                self._try({**incumbent.config, knob: named[knob]}, knob)
            return
        values = self._values(knob, current)
        if knob in ("persistent_workers", "pin_memory"):
            self._try({**incumbent.config, knob: not current}, knob)
            return
        at = values.index(current)
        # Up first when we got here by going up from the original (more workers). A deeper prefetch
        # only helps when the queue runs dry in bursts, which the diagnosis says ("prefetch"); without
        # that, fewer batches in flight (less memory, less CPU racing the training process) go first.
        went_up = (self.original_config.get(knob) or 0) < (current or 0)
        if knob == "prefetch_factor":
            went_up = any(r.get("id") == "prefetch" for r in incumbent.recommendations)
        for direction in ((1, -1) if went_up or at == 0 else (-1, 1)):
            moved = False
            failures = 0
            # More workers: one count that did not pay says little about the next (one worker restarted at every
            # epoch's start can lose to none while two win), so look one further before turning back.
            patience = 1 if knob == "num_workers" and direction == 1 else 0
            i = at
            while 0 <= i + direction < len(values):
                i += direction
                before = self.best
                assert before is not None  # the incumbent, or a trial that beat it
                result = self._try({**before.config, knob: values[i]}, knob)
                if result is not None and not result.ok and failures == 0:
                    failures += 1  # a failed value says nothing about the next one: look one further
                    continue
                if not self._improved(result, before):
                    if patience > 0 and result is not None and result.ok:
                        patience -= 1
                        continue
                    break
                moved = True
                patience = 1 if knob == "num_workers" and direction == 1 else 0  # again from the new incumbent
            if moved:
                return

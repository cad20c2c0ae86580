"""The tuning search (stallscope.tuning.search) driven by fake trial results: order, noise, budget, failures."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from stallscope.tuning.noise import Rate
from stallscope.tuning.search import Budget, Tuner, config_key, diagnosis_changes, overrides_for
from stallscope.tuning.trials import TrialResult, normalize

ORIGINAL = normalize({"num_workers": 0, "batch_size": 16, "pin_memory": False})


class FakeJob:
    """Trial results from a model of the job: rate(config) with a fixed standard error."""

    def __init__(self, rate_fn, se: float = 1.0, recs=None, fail=None, wall_s: float = 3.0) -> None:
        self.rate_fn, self.se, self.recs, self.fail, self.wall_s = rate_fn, se, recs or (lambda c: []), fail, wall_s
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, config: dict[str, Any], label: str) -> TrialResult:
        config = normalize({**ORIGINAL, **config})
        self.seen.append((label, config))
        index = len(self.seen)
        reason = self.fail(config) if self.fail else None
        if reason:
            return TrialResult(index, label, {}, config, ok=False, reason=reason, wall_s=self.wall_s)
        return TrialResult(index, label, {}, config, ok=True, rate=Rate(self.rate_fn(config), self.se, 40),
                           wall_s=self.wall_s, recommendations=self.recs(config), usable_cpus=4)


def workers_model(config: dict[str, Any]) -> float:
    """Input-bound up to 3 workers, then flat; persistent workers add 10%."""
    w = config["num_workers"]
    rate = 100.0 * (1 + min(w, 3)) if w else 80.0
    return rate * (1.1 if config["persistent_workers"] else 1.0)


def recommend_two(config: dict[str, Any]) -> list[dict[str, Any]]:
    if config["num_workers"] == 0:
        return [{"id": "num-workers", "overrides": {"num_workers": 2}}]
    return []


def test_starts_from_original_then_diagnosis_then_climbs() -> None:
    job = FakeJob(workers_model, recs=recommend_two)
    outcome = Tuner(job, Budget(trials=20)).run()
    labels = [label for label, _ in job.seen]
    assert labels[:2] == ["original", "diagnosis"]
    assert job.seen[1][1]["num_workers"] == 2
    # From 2 the climb goes up (3 is better, 4 is not, nor is 6, the one step it looks further), then keeps 3 and
    # tries persistence and prefetch.
    assert [c["num_workers"] for label, c in job.seen if label == "num_workers"] == [3, 4, 6]
    assert outcome.best.config["num_workers"] == 3
    assert outcome.best.config["persistent_workers"] is True
    assert outcome.stopped_by == "converged"
    assert len({config_key(c) for _, c in job.seen}) == len(job.seen), "no configuration is run twice"


def test_noise_does_not_pick_a_winner() -> None:
    job = FakeJob(lambda c: 100.0 + c["num_workers"], se=5.0)  # +1 per worker, noise 5: nothing is significant
    outcome = Tuner(job, Budget(trials=20)).run()
    assert outcome.best is outcome.original


def test_budget_keeps_room_for_confirmation() -> None:
    job = FakeJob(workers_model, recs=recommend_two)
    outcome = Tuner(job, Budget(trials=5, reserve=2)).run()
    assert len(job.seen) == 3
    assert outcome.stopped_by == "budget"


def test_time_budget_uses_mean_trial_time() -> None:
    now = [0.0]
    job = FakeJob(workers_model, recs=recommend_two, wall_s=10.0)

    def evaluate(config, label):
        now[0] += 10.0
        return job(config, label)

    budget = Budget(seconds=45.0, reserve=2, clock=lambda: now[0])
    Tuner(evaluate, budget).run()
    # After 1 trial (10 s): 10 + 10 * 3 = 40 <= 45 allows a 2nd; after 2 (20 s): 20 + 30 > 45 stops.
    assert len(job.seen) == 2


def test_failed_trials_are_recorded_and_search_continues() -> None:
    job = FakeJob(workers_model, recs=recommend_two,
                  fail=lambda c: "timed out after 60 s (killed)" if c["num_workers"] == 3 else None)
    outcome = Tuner(job, Budget(trials=20)).run()
    failed = [t for t in outcome.trials if not t.ok]
    assert [t.reason for t in failed] == ["timed out after 60 s (killed)"]
    # The climb looks past a failed value: 4 workers (as fast as 3 would have been) wins over 2.
    assert outcome.best.config["num_workers"] == 4
    assert outcome.best.config["persistent_workers"] is True  # tuning went on after the failure


def test_original_failure_stops_the_search() -> None:
    job = FakeJob(workers_model, fail=lambda c: "crashed in the script: RuntimeError: boom")
    outcome = Tuner(job, Budget(trials=20)).run()
    assert outcome.stopped_by == "original failed"
    assert len(job.seen) == 1 and outcome.best is None


def test_max_workers_bounds_the_ladder_and_the_diagnosis() -> None:
    job = FakeJob(lambda c: 100.0 * (1 + c["num_workers"]), recs=lambda c: [
        {"overrides": {"num_workers": 8}}] if c["num_workers"] == 0 else [])
    outcome = Tuner(job, Budget(trials=30), max_workers=3).run()
    assert max(c["num_workers"] for _, c in job.seen) == 3
    assert outcome.best.config["num_workers"] == 3


def test_batch_size_only_when_asked() -> None:
    job = FakeJob(workers_model, recs=recommend_two)
    Tuner(job, Budget(trials=30)).run()
    assert all(c["batch_size"] == 16 for _, c in job.seen)
    job = FakeJob(workers_model, recs=recommend_two)
    Tuner(job, Budget(trials=30), tune_batch_size=True).run()
    # the rate does not depend on the batch size: half and double are each tried once, and neither wins
    assert sorted(c["batch_size"] for label, c in job.seen if label == "batch_size") == [8, 32]
    assert all(c["batch_size"] == 16 for label, c in job.seen if label != "batch_size")


def test_diagnosis_changes_reads_overrides() -> None:
    recs = [{"change": "--set num_workers=4", "overrides": {"num_workers": 4}},
            {"overrides": {"persistent_workers": True}},
            {"change": "--set prefetch_factor=8 (the words are not read)"},
            {"overrides": {}},
            {"overrides": {"batch_size": 64}}]
    assert diagnosis_changes(recs) == {"num_workers": 4, "persistent_workers": True}


@pytest.mark.parametrize("config, expected", [
    ({"num_workers": 2, "prefetch_factor": 2}, {"num_workers": 2}),
    ({"num_workers": 2, "prefetch_factor": 4, "persistent_workers": True},
     {"num_workers": 2, "prefetch_factor": 4, "persistent_workers": True}),
    ({"num_workers": 0, "prefetch_factor": 8}, {}),
    ({"num_workers": 0, "pin_memory": True}, {"pin_memory": True}),
])
def test_overrides_are_the_minimal_change(config, expected) -> None:
    assert overrides_for({**ORIGINAL, **config}, ORIGINAL) == expected


def test_a_losing_trials_diagnosis_is_followed_when_it_predicts_a_win() -> None:
    """0 workers beats 2 restarted workers, but the latter's diagnosis (persistent workers) wins overall."""
    def rate(c):
        if c["num_workers"] == 0:
            return 300.0
        return (420.0 if c["persistent_workers"] else 160.0) + c["num_workers"]

    def recs(c):
        if c["num_workers"] == 0:
            return [{"overrides": {"num_workers": 2}, "predicted_speedup": 1.8}]
        if not c["persistent_workers"]:
            return [{"overrides": {"persistent_workers": True}, "predicted_speedup": 2.5}]
        return []

    job = FakeJob(rate, recs=recs)
    outcome = Tuner(job, Budget(trials=20)).run()
    assert [label for label, _ in job.seen][:3] == ["original", "diagnosis", "diagnosis"]
    assert job.seen[2][1] == {**ORIGINAL, "num_workers": 2, "persistent_workers": True, "prefetch_factor": 2}
    assert outcome.best.config["persistent_workers"] is True


def test_a_diagnosis_that_did_not_pay_is_not_chained() -> None:
    """Each prefetch trial's diagnosis asks for double the prefetch; none helps, so the chain stops at one."""
    def recs(c):
        if c["num_workers"] == 0:
            return [{"overrides": {"num_workers": 2}, "predicted_speedup": 1.5}]
        return [{"overrides": {"prefetch_factor": 2 * c["prefetch_factor"]}, "predicted_speedup": 3.0}]

    job = FakeJob(lambda c: 100.0, recs=recs)
    Tuner(job, Budget(trials=20)).run()
    assert sorted(c["prefetch_factor"] for label, c in job.seen if label == "diagnosis" and c["num_workers"]) == [2, 4]


@pytest.mark.parametrize("dry_queue,first", [(False, 1), (True, 4)])
def test_prefetch_goes_deeper_first_only_when_the_queue_runs_dry(dry_queue, first) -> None:
    def recs(config: dict[str, Any]) -> list[dict[str, Any]]:
        out = recommend_two(config)
        if dry_queue and config["num_workers"]:
            out.append({"id": "prefetch"})
        return out

    job = FakeJob(workers_model, recs=recs)
    Tuner(job, Budget(trials=30)).run()
    tried = [c["prefetch_factor"] for label, c in job.seen if label == "prefetch_factor"]
    assert tried and tried[0] == first


def test_a_predicted_change_needs_less_evidence_than_a_blind_probe() -> None:
    # +30 samples/s with se 15 per trial: 1.4 combined standard errors, below z=2, above DIAGNOSIS_Z=1
    def rate(config: dict[str, Any]) -> float:
        return 100.0 + (30.0 if config["num_workers"] >= 1 else 0.0)

    predicted = FakeJob(rate, se=15.0, recs=recommend_two)
    Tuner(predicted, Budget(trials=20)).run()
    assert [c["num_workers"] for label, c in predicted.seen if label == "num_workers"] == [3, 4, 1], \
        "the predicted 2 workers became the incumbent: the climb starts from there"
    blind = FakeJob(rate, se=15.0)
    outcome = Tuner(blind, Budget(trials=20)).run()
    assert [c["num_workers"] for _, c in blind.seen] == [0, 1, 2], \
        "a blind probe within noise does not move the climb (it looks one count further, and stops)"
    assert outcome.best.config["num_workers"] == 1, "but the final pick is the fastest measured"


def test_final_pick_needs_a_practical_margin() -> None:
    job = FakeJob(lambda c: 100.0 + 2.0 * c["num_workers"], se=5.0, recs=recommend_two)  # +4% at 2 workers
    outcome = Tuner(job, Budget(trials=20)).run()
    assert outcome.best.config["num_workers"] == 2
    flat = FakeJob(lambda c: 100.0 + 0.5 * c["num_workers"], se=5.0, recs=recommend_two)  # +1%: not worth a change
    assert Tuner(flat, Budget(trials=20)).run().best.config["num_workers"] == 0


def restarts_model(config: dict[str, Any]) -> float:
    """Short epochs: one worker restarted at every epoch's start loses to none, two or more win, persistence more."""
    w = config["num_workers"]
    rate = {0: 220.0, 1: 190.0, 2: 245.0, 3: 240.0}.get(w, 200.0)
    return rate * (1.15 if w and config["persistent_workers"] else 1.0)


def test_one_worker_count_that_did_not_pay_does_not_end_the_climb() -> None:
    job = FakeJob(restarts_model, se=3.0)  # no diagnosis: the climb alone
    outcome = Tuner(job, Budget(trials=20)).run()
    climbed = [c["num_workers"] for label, c in job.seen if label == "num_workers"]
    assert climbed[:3] == [1, 2, 3]  # 1 lost, 2 was looked at anyway and won, 3 did not pay, 4 is the one beyond
    assert climbed[3] == 4 and len(climbed) == 4
    assert outcome.best.config["num_workers"] == 2 and outcome.best.config["persistent_workers"] is True


def test_fewer_workers_are_not_looked_past() -> None:
    job = FakeJob(lambda c: {4: 300.0, 3: 250.0, 2: 400.0}.get(c["num_workers"], 100.0), se=3.0)
    Tuner(job, Budget(trials=20)).run({"num_workers": 4})
    climbed = [c["num_workers"] for label, c in job.seen if label == "num_workers"]
    # down first (the original's count, not one the climb went up to): 3 loses and it looks no further down; then up:
    # 6 loses, and 8, the one step it looks past that, too
    assert climbed == [3, 6, 8]
    assert 2 not in climbed


class LoadedOriginal(FakeJob):
    """The original's first run saw other programs keep ``loads[0]`` CPUs busy, its second ``loads[1]``; in a loaded
    run everything measures slower by that share of 2 CPUs, and the diagnosis advises workers only when quiet."""

    def __init__(self, loads: tuple[float, float]) -> None:
        super().__init__(workers_model, recs=lambda c: recommend_two(c) if self.load < 0.25 else [])
        self.loads = list(loads)
        self.load = 0.0

    def __call__(self, config: dict[str, Any], label: str) -> TrialResult:
        self.load = self.loads.pop(0) if self.loads else 0.0
        result = super().__call__(config, label)
        rate = Rate(result.rate.value * (1 - self.load / 2), 1.0, 40) if result.rate else None
        return TrialResult(result.index, label, {}, result.config, ok=result.ok, reason=result.reason, rate=rate,
                           wall_s=result.wall_s,
                           recommendations=result.recommendations, usable_cpus=4, other_cpus=self.load)


def test_a_loaded_original_runs_again_and_the_quieter_run_leads() -> None:
    job = LoadedOriginal((0.9, 0.05))
    outcome = Tuner(job, Budget(trials=20)).run()
    labels = [label for label, _ in job.seen]
    assert labels[:3] == ["original", "original-again", "diagnosis"]  # the quiet run's advice is followed
    assert outcome.original is outcome.trials[1] and outcome.original.other_cpus == 0.05
    assert outcome.original.rate.value == 80.0 * (1 - 0.05 / 2)
    assert outcome.notes == ["other programs kept 0.90 CPUs busy during the original's run, so it ran again (0.05 "
                             "busy then); the search started from the second run"]


def test_a_loaded_original_that_stays_loaded_keeps_its_first_run_and_says_so() -> None:
    job = LoadedOriginal((0.5, 0.8))
    outcome = Tuner(job, Budget(trials=20)).run()
    assert [label for label, _ in job.seen][:2] == ["original", "original-again"]
    assert outcome.original is outcome.trials[0]
    assert "the search started from the first run (other programs stayed busy" in outcome.notes[0]


def test_a_quiet_original_or_a_tight_budget_runs_once() -> None:
    quiet = LoadedOriginal((0.2, 0.0))
    Tuner(quiet, Budget(trials=20)).run()
    assert [label for label, _ in quiet.seen].count("original") == 1 and "original-again" not in \
        [label for label, _ in quiet.seen]
    failed = LoadedOriginal((0.9, 0.0))
    failed.fail = lambda c: "exit code 1" if len(failed.seen) == 2 else None  # the run again fails
    outcome = Tuner(failed, Budget(trials=20)).run()
    assert outcome.original is outcome.trials[0]
    assert outcome.notes == ["other programs kept 0.90 CPUs busy during the original's run, so it ran again (that "
                             "run failed: exit code 1); the search started from the first run"]  # no load measured
    tight = LoadedOriginal((0.9, 0.0))  # 4 runs: the original, one candidate, two confirmations; no room for another
    outcome = Tuner(tight, Budget(trials=4, reserve=2)).run()
    assert "original-again" not in [label for label, _ in tight.seen] and outcome.notes == []


class ScriptedOriginal(FakeJob):
    """The original runs twice: ``runs`` gives each of its runs' (rate, other CPUs, recommendations); every other
    configuration measures ``workers_model``'s rate, quiet."""

    def __init__(self, runs: list[tuple[float, float, list]], se: float = 1.0) -> None:
        super().__init__(workers_model, se=se)
        self.runs = list(runs)

    def __call__(self, config: dict[str, Any], label: str) -> TrialResult:
        result = super().__call__(config, label)
        if not label.startswith("original"):
            return result
        rate, other, recs = self.runs.pop(0)
        return TrialResult(result.index, label, {}, result.config, ok=True, rate=Rate(rate, self.se, 40),
                           wall_s=result.wall_s, recommendations=recs, usable_cpus=4, other_cpus=other)


def test_the_originals_run_not_kept_is_never_the_final_pick():
    """The loaded first run measured fastest of all (110), the quieter second 100; a candidate at 104 beats 100: the
    pick is the candidate, not the set-aside run of the original (past the candidate by the practical margin)."""
    job = ScriptedOriginal([(110.0, 0.30, []), (100.0, 0.28, [])], se=1.0)
    job.rate_fn = lambda c: 104.0
    outcome = Tuner(job, Budget(trials=20)).run()
    assert outcome.original is outcome.trials[1]
    assert outcome.best is not outcome.trials[0] and outcome.best.config["num_workers"] > 0
    assert outcome.notes[0].startswith("other programs kept 0.30 CPUs busy during the original's run, so it ran again "
                                       "(0.28 busy then); the search started from the second run (other programs")


def test_the_louder_run_again_lends_the_search_no_advice():
    """The second run saw more load and is set aside: its advice (2 workers) is not followed; the first run's none."""
    advice = [{"id": "num-workers", "overrides": {"num_workers": 2}, "predicted_speedup": 3.0}]
    job = ScriptedOriginal([(80.0, 0.30, []), (60.0, 0.90, advice)])
    outcome = Tuner(job, Budget(trials=20)).run()
    assert outcome.original is outcome.trials[0]
    assert "diagnosis" not in [label for label, _ in job.seen]


def test_a_rate_that_is_no_evidence_does_not_take_the_final_pick():
    """From the tester: 4 workers measured 810 +- 54 (the diagnosis' pick), 8 workers 892 +- 710 (steps so uneven
    that its error is 80% of its rate): 10% faster in no sense that counts, so 4 workers stays the pick (8 workers'
    confirmation measured 165, and the tuner had proposed nothing)."""
    rates = {0: (166.7, 5.0), 4: (810.1, 54.2), 8: (892.0, 710.4)}

    def evaluate(config: dict[str, Any], label: str) -> TrialResult:
        config = normalize({**ORIGINAL, **config})
        value, se = rates.get(config["num_workers"], (150.0, 5.0))
        recs = [{"id": "num-workers", "overrides": {"num_workers": 4}, "predicted_speedup": 4.0}] \
            if config["num_workers"] == 0 else []
        return TrialResult(1, label, {}, config, ok=True, rate=Rate(value, se, 40), wall_s=3.0, recommendations=recs,
                           usable_cpus=4)

    outcome = Tuner(evaluate, Budget(trials=20)).run()
    assert any(t.config["num_workers"] == 8 for t in outcome.trials)
    assert outcome.best.config["num_workers"] == 4


class RepeatedRuns(FakeJob):
    """Each configuration's runs measure the next of its listed rates (the last one again after that); the original
    (0 workers) advises 2 persistent workers at ``predicted``; configurations not listed measure 200."""

    def __init__(self, runs: dict[int, list[float]], predicted: float, se: float = 8.0) -> None:
        advice = [{"id": "num-workers", "overrides": {"num_workers": 2, "persistent_workers": True},
                   "predicted_speedup": predicted}]
        super().__init__(lambda c: 200.0, se=se, recs=lambda c: advice if c["num_workers"] == 0 else [])
        self.runs = {workers: list(rates) for workers, rates in runs.items()}

    def __call__(self, config: dict[str, Any], label: str) -> TrialResult:
        result = super().__call__(config, label)
        rates = self.runs.get(result.config["num_workers"])
        if not rates or (result.config["num_workers"] and not result.config["persistent_workers"]):
            return result
        value = rates.pop(0) if len(rates) > 1 else rates[0]
        return replace(result, rate=Rate(value, self.se, 40))


def test_a_diagnosis_that_tied_the_original_runs_again_and_the_mean_of_both_is_taken() -> None:
    """Session 23's tune: 2 persistent workers predicted 1.24x and measured 315.0 against the original's 316.1. The
    second run measures 345.0: over both, 330.0 +- 8 * sqrt(2) / 2 = 5.66, past 316.0 by 14.0 > 1 combined standard
    error (sqrt(5.66^2 + 8^2) = 9.80), so the search goes on from 2 persistent workers."""
    job = RepeatedRuns({0: [316.0], 2: [315.0, 345.0]}, predicted=1.24)
    outcome = Tuner(job, Budget(trials=20)).run()
    assert [label for label, _ in job.seen][:3] == ["original", "diagnosis", "diagnosis-again"]
    best = outcome.best
    assert best.config["num_workers"] == 2 and best.config["persistent_workers"] is True
    assert best.index == 3 and best.label == "diagnosis-again"  # the final pick: its faster run (345 > 1.03 x 330)
    assert outcome.trials[2].rate == Rate(345.0, 8.0, 40), "the second run's own row keeps its own rate"
    assert outcome.notes == [
        "the diagnosis' num_workers=2 persistent_workers=true (predicted 1.24x) measured 315.0 samples/s against the "
        "original's 316.0, within the noise, so it ran again (345.0); over both runs 330.0 ± 5.7: taken, the search "
        "went on from it"]
    # The climb starts from the mean's configuration: 3 workers next, kept alive.
    label, config = job.seen[3]
    assert (label, config["num_workers"], config["persistent_workers"]) == ("num_workers", 3, True)
    assert sum(1 for label, _ in job.seen if label == "diagnosis-again") == 1


def test_a_tie_that_holds_on_the_second_run_leaves_the_original() -> None:
    """The second run measures 318.0: over both 316.5, past 316.0 by less than a standard error: the original stays
    and the climb goes from 0 workers (1 worker next)."""
    job = RepeatedRuns({0: [316.0], 2: [315.0, 318.0]}, predicted=1.24)
    outcome = Tuner(job, Budget(trials=20)).run()
    assert outcome.best is outcome.original
    assert outcome.notes[0].endswith("over both runs 316.5 ± 5.7: not past the original, which stayed")
    label, config = job.seen[3]
    assert (label, config["num_workers"], config["persistent_workers"]) == ("num_workers", 1, False)


@pytest.mark.parametrize("runs,predicted,trials,why", [
    ({0: [316.0], 2: [280.0]}, 1.24, 20, "clearly slower (36 > 2 combined errors, 22.6): the prediction is refuted"),
    ({0: [316.0], 2: [315.0]}, 1.05, 20, "a 5% prediction is within one run's noise anyway"),
    ({0: [316.0], 2: [315.0]}, 1.24, 4, "the budget keeps its last two runs for the confirmation"),
])
def test_no_second_run_without_a_tie_a_real_prediction_and_the_budget(runs, predicted, trials, why) -> None:
    job = RepeatedRuns(runs, predicted=predicted)
    outcome = Tuner(job, Budget(trials=trials, reserve=2)).run()
    assert "diagnosis-again" not in [label for label, _ in job.seen], why
    assert outcome.notes == []


@pytest.mark.parametrize("three,picked", [(108.0, 2), (116.0, 3)])
def test_a_blind_probe_displaces_the_diagnosis_pick_only_past_the_noise(three, picked) -> None:
    """The diagnosis' 2 workers measure 100 +- 5 (past the original's 80); the climb's 3 workers 108 (8% faster, but
    within z = 2 combined standard errors, 14.1): the pick stays with the prediction. At 116 (16 > 14.1) it is
    taken, in the climb and as the pick."""
    rates = {0: 80.0, 1: 85.0, 2: 100.0, 3: three, 4: 90.0}
    job = FakeJob(lambda c: rates.get(c["num_workers"], 70.0), se=5.0, recs=recommend_two)
    outcome = Tuner(job, Budget(trials=20)).run()
    assert [label for label, _ in job.seen][:3] == ["original", "diagnosis", "num_workers"]
    assert outcome.best.config["num_workers"] == picked


def test_a_blind_probe_still_takes_the_pick_from_the_original_by_the_practical_margin() -> None:
    """No diagnosis: 1 worker 85 +- 5 against the original's 80 is within the noise, but 6% faster: it is the pick."""
    job = FakeJob(lambda c: {0: 80.0, 1: 85.0}.get(c["num_workers"], 70.0), se=5.0)
    assert Tuner(job, Budget(trials=20)).run().best.config["num_workers"] == 1


def split_model(config: dict[str, Any]) -> float:
    """A CPU compute on 2 threads beside which a worker holds the threads back: one worker more (84) or one thread
    fewer (80) loses, both together win (133), as a small CNN on 2 cores measured."""
    rates = {(2, 0): 100.0, (2, 1): 84.0, (1, 0): 80.0, (1, 1): 133.0, (1, 2): 125.0}
    return rates.get((config["torch_threads"], config["num_workers"]), 90.0)


def test_a_threaded_cpu_compute_tries_fewer_threads_and_more_workers_together() -> None:
    job = FakeJob(split_model)
    outcome = Tuner(job, Budget(trials=20)).run({"torch_threads": 2})
    splits = [(c["torch_threads"], c["num_workers"]) for label, c in job.seen if label == "split"]
    assert splits == [(1, 1)]  # first, before the worker climb: one thread fewer, one worker more
    assert [label for label, _ in job.seen][:2] == ["original", "split"]
    assert (outcome.best.config["torch_threads"], outcome.best.config["num_workers"]) == (1, 1)
    # the worker climb then starts from the split: 2 workers with 1 thread lost, 3 did too
    assert [c["num_workers"] for label, c in job.seen if label == "num_workers"][:2] == [2, 3]


class DeviceJob(FakeJob):
    def __call__(self, config: dict[str, Any], label: str) -> TrialResult:
        return replace(super().__call__(config, label), uses_device=True)


def test_no_split_where_the_compute_has_one_thread_or_batches_go_to_a_device() -> None:
    for job, original in ((FakeJob(split_model), {"torch_threads": 1}), (DeviceJob(split_model), {"torch_threads": 2})):
        Tuner(job, Budget(trials=20)).run(original)
        assert not [c for label, c in job.seen if label == "split"]


def test_the_split_goes_down_the_thread_counts_while_each_pays() -> None:
    from stallscope.tuning.search import _fewer_threads

    assert _fewer_threads(8) == [7, 4, 2, 1] and _fewer_threads(2) == [1] and _fewer_threads(3) == [2, 1]
    job = FakeJob(lambda c: {8: 100.0, 7: 120.0, 4: 150.0, 2: 140.0}.get(c["torch_threads"], 90.0))
    Tuner(job, Budget(trials=30)).run({"torch_threads": 8})
    splits = [(c["torch_threads"], c["num_workers"]) for label, c in job.seen if label == "split"]
    assert splits == [(7, 1), (4, 4), (2, 6)]  # 2 threads lost to 4: no further down


def _gpu_job(rate_fn, recs=None) -> FakeJob:
    """A job on a GPU (its trials moved batches to a device), numerics as its loader recorded them."""
    job = FakeJob(rate_fn, recs=recs)
    plain = job.__call__

    def on_gpu(config: dict[str, Any], label: str) -> TrialResult:
        config = {"matmul_precision": "highest", "cudnn_benchmark": False, **config}
        return replace(plain(config, label), uses_device=True)

    job.__call__ = on_gpu  # type: ignore[method-assign]
    return job


def _numerics_model(config: dict[str, Any]) -> float:
    """TF32 pays 30%, cuDNN's search 10%, on top of 3 workers' input."""
    rate = workers_model(config)
    return rate * (1.3 if config.get("matmul_precision") == "high" else 1.0) \
        * (1.1 if config.get("cudnn_benchmark") else 1.0)


def _tf32_finding(config: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"id": "tf32", "overrides": {"matmul_precision": "high"}, "predicted_speedup": None}]


def test_numerics_are_tried_only_when_asked_and_only_on_a_gpu() -> None:
    job = _gpu_job(_numerics_model, recs=_tf32_finding)
    outcome = Tuner(lambda c, label: job.__call__(c, label), Budget(trials=30)).run()
    assert not any(c.get("matmul_precision") == "high" or c.get("cudnn_benchmark") for _, c in job.seen)
    assert not any("numerics" in note for note in outcome.notes)

    job = _gpu_job(_numerics_model, recs=_tf32_finding)
    outcome = Tuner(lambda c, label: job.__call__(c, label), Budget(trials=30), numerics=True).run()
    assert outcome.best.config["matmul_precision"] == "high" and outcome.best.config["cudnn_benchmark"] is True
    assert overrides_for(outcome.best.config, outcome.original.config) == {
        "num_workers": 3, "persistent_workers": True, "matmul_precision": "high", "cudnn_benchmark": True}
    assert any(note.startswith("the winner changes the training's numerics (cudnn_benchmark, matmul_precision)")
               for note in outcome.notes), outcome.notes

    # autocast only where the diagnosis names it (a device with bfloat16 units): then tried, and kept where it pays
    def mixed(config: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"id": "mixed-precision", "overrides": {"autocast": "bfloat16"}, "predicted_speedup": None}]

    job = _gpu_job(lambda c: workers_model(c) * (1.5 if c.get("autocast") == "bfloat16" else 1.0), recs=mixed)
    outcome = Tuner(lambda c, label: job.__call__(c, label), Budget(trials=30), numerics=True).run()
    assert outcome.best.config["autocast"] == "bfloat16", [c for _, c in job.seen]
    assert {label for label, c in job.seen if c.get("autocast")} & {"diagnosis", "autocast"}

    cpu = FakeJob(_numerics_model, recs=_tf32_finding)
    outcome = Tuner(cpu, Budget(trials=30), numerics=True).run()
    assert not any(c.get("matmul_precision") == "high" or c.get("cudnn_benchmark") for _, c in cpu.seen)
    assert any("computes on the CPU" in note and "not tried" in note for note in outcome.notes), outcome.notes

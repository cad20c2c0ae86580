"""Cut the main process's timeline into training steps and measure the data wait in each.

Boundaries come from optimizer steps when the script has any: a step ends at the first
optimizer step after at least one batch of the training loader (two optimizers on one batch
are one step; gradient accumulation over several batches is one step). Without an optimizer
(evaluation, inference) every batch of the busiest loader is a step. Time spent inside other
loaders' loops (a validation pass between training steps) is excluded from the step it falls in.

A loader whose batches feed (nearly) every optimizer step beside the training loader's is fed with it, not a loop of
its own: ``zip(images, captions)``, a GAN's real images and its noise. Its waits are the step's data wait, and of the
loaders fed together the training loader is the one the step waited on longest (the one to fix); the others are
"paired". Taking the last batch before each optimizer step alone named ``zip``'s second loader, a cheap one, and left
the costly first loader's waits out of every step as if they were a validation loop's.
"""

from __future__ import annotations

import bisect
import dataclasses
import statistics
from collections import Counter
from collections.abc import Sequence
from typing import Any

from stallscope.analysis.findings import Step, StepStats
from stallscope.analysis.spans import SpanIndex, index_of
from stallscope.analysis.step_parts import PartsMeter
from stallscope.analysis.sync import merge_intervals, overlap_ns, sync_intervals
from stallscope.session import NextRecord, Session

#: Below this many steady steps a run's figures are said to rest on too few steps (a run killed early, a --steps of
#: a few): one slow batch moves a 5-step median and rate by a fifth.
FEW_STEADY_STEPS = 10
#: A loader (its line's loaders together) that delivered batches in at least this share of the optimizer steps the
#: training loader fed is fed with it; a validation loader delivers in one step per epoch or so.
PAIRED_SHARE = 0.8


def _quantile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


def same_site(session: Session, loader_id: int) -> list[int]:
    """The loaders the same process created at the same line as ``loader_id``: a loop that builds a new
    DataLoader every epoch makes one such loader per epoch."""
    by_id = {ld.loader_id: ld for ld in session.loaders}
    first = by_id.get(loader_id)
    if first is None:
        return [loader_id]
    return [ld.loader_id for ld in session.loaders if ld.pid == first.pid and ld.site == first.site]


def epochs_of(session: Session, loader_ids: Sequence[int], pid: int | None = None
              ) -> dict[tuple[int, int, int], list[NextRecord]]:
    """The batches taken from ``loader_ids`` (by process ``pid`` where given: loader ids are numbered per process),
    per epoch, in the order the epochs began: keyed by (loader, iterator, epoch). A new ``iter(loader)`` starts an
    epoch; a loader with persistent workers keeps one iterator across epochs, so its epochs are told apart by
    ``epoch`` too."""
    ids = set(loader_ids)
    epochs: dict[tuple[int, int, int], list[NextRecord]] = {}
    taken = (n for n in session.nexts if n.loader_id in ids and (pid is None or n.pid == pid))
    for n in sorted(taken, key=lambda n: n.start_ns):
        epochs.setdefault((n.loader_id, n.iter_id, n.epoch), []).append(n)
    return epochs


def training_loaders(session: Session, pid: int | None) -> tuple[tuple[int, ...], str, tuple[int, ...]]:
    """The training loader(s), how steps end, and the loaders paired with them. The training loader's batches
    precede optimizer steps (without optimizer steps: the busiest loader). Every loader built at its line whose
    batches also feed optimizer steps is the same training loader in a later epoch; one built there that feeds none
    (an evaluation loader made by the same helper) is not. Loaders built at another line that fed ``PAIRED_SHARE``
    of its optimizer steps are fed together with it (``zip``): of those, the one whose batches the steps waited on
    longest is the training loader, and the others are paired."""
    nexts = [n for n in session.nexts if n.pid == pid]
    if not nexts:
        return (), "none", ()
    opts = [o for o in session.optimizer_steps if o.pid == pid]
    if opts:
        votes: Counter[int] = Counter()
        fed: Counter[int] = Counter()  # optimizer steps each loader delivered a batch for
        i = 0
        last: NextRecord | None = None
        for opt in opts:
            delivered: set[int] = set()
            while i < len(nexts) and nexts[i].end_ns <= opt.start_ns:
                last = nexts[i]
                delivered.add(last.loader_id)
                i += 1
            if last is not None:
                votes[last.loader_id] += 1
            fed.update(delivered)
        if votes:
            winner = votes.most_common(1)[0][0]
            train = tuple(sorted(i for i in same_site(session, winner) if votes[i] > 0 or i == winner))
            groups = _paired_groups(session, train, fed)
            if groups:
                waited: Counter[int] = Counter()
                for n in nexts:
                    waited[n.loader_id] += n.end_ns - n.start_ns
                groups.append(train)
                train = max(groups, key=lambda g: (sum(waited[i] for i in g), g == groups[-1]))
                paired = tuple(sorted(i for g in groups if g != train for i in g))
                return train, "optimizer", paired
            return train, "optimizer", ()
    busiest = Counter(n.loader_id for n in nexts).most_common(1)[0][0]
    used = {n.loader_id for n in nexts}
    return tuple(sorted(i for i in same_site(session, busiest) if i in used)), "batch", ()


def _paired_groups(session: Session, train: tuple[int, ...], fed: Counter[int]) -> list[tuple[int, ...]]:
    """The other lines' loaders (each line's together) that delivered batches in ``PAIRED_SHARE`` of the optimizer
    steps the training loader ``train`` did."""
    steps_fed = sum(fed[i] for i in train)
    groups: list[tuple[int, ...]] = []
    seen = set(train)
    for loader_id in sorted(fed):
        if loader_id in seen:
            continue
        # not the training loader's own ids: an evaluation loader built by the same helper shares its line
        group = tuple(sorted(i for i in same_site(session, loader_id) if fed[i] > 0 and i not in train))
        seen.update(group)
        if steps_fed > 0 and sum(fed[i] for i in group) >= PAIRED_SHARE * steps_fed:
            groups.append(group)
    return groups


def _other_loader_spans(session: Session, pid: int | None, train_ids: tuple[int, ...]) -> list[tuple[int, int]]:
    """Spans where the main process was looping over another loader (from its first batch to its stop)."""
    spans: list[tuple[int, int]] = []
    events = sorted(
        [(n.start_ns, n.end_ns, n.loader_id) for n in session.nexts if n.pid == pid]
        + [(s.start_ns, s.end_ns, s.loader_id) for s in session.stops if s.pid == pid],
    )
    current: list[int] | None = None
    for start, end, loader_id in events:
        if loader_id in train_ids:
            if current is not None:
                spans.append((current[0], current[1]))
                current = None
            continue
        if current is None:
            current = [start, end]
        else:
            current[1] = end
    if current is not None:
        spans.append((current[0], current[1]))
    return spans


def _overlap(a0: int, a1: int, b0: int, b1: int) -> int:
    return max(0, min(a1, b1) - max(a0, b0))


def _unpaused(paused: list[tuple[int, int]], a: int, b: int, s0: int, s1: int) -> int:
    """Nanoseconds of [a, b) inside the step [s0, s1), less those the job stood still."""
    lo, hi = max(a, s0), min(b, s1)
    return max(0, hi - lo - overlap_ns(paused, lo, hi)) if hi > lo else 0


def _first_round(session: Session, pid: int | None, train_ids: tuple[int, ...]) -> int:
    """Batches the training loader's workers deliver together when they start: one from each, as many as its
    first ``iter()`` of this process started (what ran, even where the script changed ``num_workers`` after
    building the loader)."""
    first = next((it for it in session.iters if it.pid == pid and it.loader_id in train_ids), None)
    return max(0, first.num_workers) if first is not None else 0


def _warm_up(steps: list[Step], warmup: int, first_round: int) -> int:
    """Steps to leave out of the steady ones: ``warmup``, and every step up to the last batch of the workers'
    first round. W workers started together finish their first batches together, so W-1 of them arrive with
    no wait at all: counted, they would flatter a run with many workers (8 workers over 40 steps measured 20%
    above their steady rate). From the next step on, batches come at the steady pace. At most a third of the
    steps goes to the first round; none is left out of a run too short to keep two."""
    delivered = warm = 0
    while warm < len(steps) and delivered < first_round:
        delivered += steps[warm].batches
        warm += 1
    warm = max(warmup, min(warm, len(steps) // 3))
    return warm if len(steps) > warm + 1 else 0


def step_stats(session: Session, pid: int | None = None, warmup: int = 1) -> StepStats:
    pid = session.main_pid if pid is None else pid
    train_ids, boundary, paired_ids = training_loaders(session, pid)
    if not train_ids:
        return StepStats(None, "none", [], 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, None, None, None, None, None)
    nexts = [n for n in session.nexts if n.pid == pid and n.loader_id in train_ids]
    iters = [it for it in session.iters if it.pid == pid and it.loader_id in train_ids]
    # Starting and stopping the training loader's workers (a new epoch without persistent_workers) is time
    # the training process spends on its data, not on compute: counted as data wait, once where they overlap.
    # Neither lies inside a batch's next(): torch stops workers in the next() that ends an epoch (a `stop`,
    # not a batch) or when the loop drops its iterator.
    boundaries = merge_intervals([(it.start_ns, it.end_ns) for it in iters]
                                 + [(sd.start_ns, sd.end_ns) for sd in session.shutdowns
                                    if sd.pid == pid and sd.loader_id in train_ids])
    transfers = [t for t in session.transfers if t.pid == pid]
    others = _other_loader_spans(session, pid, train_ids + paired_ids)
    # Ctrl-Z: the job stood still; like another loader's loop, not the step's time (nor its wait's, its copies')
    paused = merge_intervals([(int(p["start_ns"]), int(p["end_ns"])) for p in session.pauses])
    left_out = merge_intervals([*others, *paused])  # a stop inside a validation loop is left out once
    waits_for_ranks = sync_intervals(session, pid)

    bounds: list[tuple[int, int]] = []
    # spans of a long run whose records were folded (folding.py): the steps across them are left out below
    folded = index_of((int(a), int(b)) for a, b in session.recording.get("folded", []))
    if boundary == "optimizer":
        first = min(n.start_ns for n in session.nexts if n.pid == pid and n.loader_id in {*train_ids, *paired_ids})
        start = min([first] + [it.start_ns for it in iters if it.start_ns <= first])
        i = 0
        seen_batch = False
        for opt in (o for o in session.optimizer_steps if o.pid == pid):
            while i < len(nexts) and nexts[i].end_ns <= opt.start_ns:
                seen_batch = True
                i += 1
            if not seen_batch and folded.spans and folded.overlapping(start, opt.start_ns):
                seen_batch = True  # its batch was in a folded span: a step, as the folder counted it
            if seen_batch:
                bounds.append((start, opt.end_ns))
                start = opt.end_ns
                seen_batch = False
    else:
        stops = sorted([s.start_ns for s in session.stops if s.pid == pid and s.loader_id in train_ids]
                       + [s.start_ns for s in session.stalls if s.pid == pid and s.loader_id in train_ids])
        for k, n in enumerate(nexts):
            following = nexts[k + 1].start_ns if k + 1 < len(nexts) else None
            at = bisect.bisect_left(stops, n.end_ns)
            later_stop = stops[at] if at < len(stops) else None
            if following is not None and (later_stop is None or following <= later_stop):
                bounds.append((n.start_ns, following))
            elif later_stop is not None:
                bounds.append((n.start_ns, later_stop))

    # each step finds what lies in it by bisection: scanning the whole run for each step was quadratic
    batches = SpanIndex((n.start_ns, n.end_ns, n) for n in nexts)
    paired_set = set(paired_ids)
    paired = SpanIndex((n.start_ns, n.end_ns, n) for n in session.nexts if n.pid == pid and n.loader_id in paired_set)
    restarts, copies = index_of(boundaries), SpanIndex((t.start_ns, t.end_ns, t) for t in transfers)
    outside, rank_waits = index_of(left_out), index_of(waits_for_ranks)
    not_compute = [(n.start_ns, n.end_ns) for n in session.nexts if n.pid == pid and n.loader_id in {*train_ids,
                                                                                                   *paired_ids}]
    parts = PartsMeter(session, pid, not_compute + boundaries + [(t.start_ns, t.end_ns) for t in transfers]
                       + left_out + waits_for_ranks)
    steps: list[Step] = []
    for index, (s0, s1) in enumerate(bounds):
        inside = batches.within(s0, s1)
        wait = sum(_unpaused(paused, n.start_ns, n.end_ns, n.start_ns, n.end_ns) for n in inside)
        wait += sum(_unpaused(paused, b0, b1, s0, s1) for b0, b1, _ in paired.overlapping(s0, s1))
        wait += sum(_unpaused(paused, b0, b1, s0, s1) for b0, b1, _ in restarts.overlapping(s0, s1))
        transfer = sum(_unpaused(paused, t0, t1, s0, s1) for t0, t1, _ in copies.overlapping(s0, s1))
        excluded = outside.overlap_ns(s0, s1)
        sizes = [n.batch_size for n in inside]
        samples = sum(v for v in sizes if v is not None) if sizes and all(v is not None for v in sizes) else None
        unpickle = sum(n.unpickle_ns for n in inside)
        sync = min(rank_waits.overlap_ns(s0, s1), max(0, s1 - s0 - excluded - wait - transfer))
        step = Step(index, s0, s1, wait, transfer, len(inside), samples, excluded, unpickle_ns=unpickle,
                    unpickle_cpu_ns=sum(n.unpickle_cpu_ns for n in inside), sync_ns=sync)
        split = parts.measure(s0, s1, step.compute_ns)
        steps.append(dataclasses.replace(step, forward_ns=split.forward_ns, backward_ns=split.backward_ns,
                                         optimizer_ns=split.optimizer_ns))

    # a window the script's end (or its own profiler) cut short is left in: its few steps are the run's last
    profiled = index_of((int(w["start_ns"]), int(w["end_ns"])) for w in session.op_windows
                        if w.get("pid") == pid and w.get("folded"))
    # the profiler window's steps, and the step its folding lands in: its cost, not the job's; counted as steps,
    # left out of the steady ones
    profiled_ids = frozenset(s.index for s in steps
                             if profiled.spans and profiled.overlapping(s.start_ns, s.end_ns))
    across_folded = frozenset(s.index for s in steps if folded.spans and folded.overlapping(s.start_ns, s.end_ns))
    kept = [s for s in steps if s.index not in profiled_ids | across_folded]
    warm = _warm_up(kept, warmup, _first_round(session, pid, train_ids))
    steady = kept[warm:]
    warm = steps.index(steady[0]) if steady else len(steps)  # the warm-up, counted in the recorded steps
    # A next() that never returned (hung workers, a timeout) is data wait no step shows: count it.
    stalled = sum(_unpaused(paused, s.start_ns, s.end_ns, s.start_ns, s.end_ns)
                  for s in session.stalls if s.pid == pid and s.loader_id in train_ids) / 1e9
    stalled = stalled if steady else 0.0
    wall = sum(s.duration_ns for s in steady) / 1e9 + stalled
    sample_counts = [s.samples for s in steady]
    return StepStats(
        loader_id=train_ids[0],
        loader_ids=train_ids,
        boundary=boundary,
        steps=steps,
        warmup_steps=warm,
        wall_s=wall,
        wait_s=sum(s.wait_ns for s in steady) / 1e9 + stalled,
        transfer_s=sum(s.transfer_ns for s in steady) / 1e9,
        compute_s=sum(s.compute_ns for s in steady) / 1e9,
        unpickle_s=sum(s.unpickle_ns for s in steady) / 1e9,
        unpickle_cpu_s=sum(s.unpickle_cpu_ns for s in steady) / 1e9,
        samples=(sum(v for v in sample_counts if v is not None)
                 if sample_counts and all(v is not None for v in sample_counts) else None),
        median_step_s=statistics.median(s.duration_ns for s in steady) / 1e9 if steady else None,
        p90_step_s=(_quantile([s.duration_ns for s in steady], 0.9) or 0) / 1e9 if steady else None,
        median_wait_s=statistics.median(s.wait_ns for s in steady) / 1e9 if steady else None,
        first_step_s=steps[0].duration_ns / 1e9 if steps else None,
        sync_s=sum(s.sync_ns for s in steady) / 1e9,
        stalled_s=stalled,
        paired_loader_ids=paired_ids,
        left_out=profiled_ids,
        parts_s=_parts_s(steady) if parts.recorded else None,
        across_folded=across_folded,
        **_window_counts(session, pid, bool(folded.spans)),
    )


def _window_counts(session: Session, pid: int | None, folded: bool) -> dict[str, Any]:
    """Where records were folded: the run's steps and samples as its windows counted them, and the steps inside
    the folded spans (``Session.windows``, ``Session.recording``)."""
    if not folded:
        return {}
    rows = [r for r in session.windows if r.get("pid") == pid]
    known = all(r.get("samples_known", True) for r in rows if r.get("batches"))
    folded_counts = session.recording.get("folded_counts", {}).get(str(pid), {})
    return {"window_steps": sum(int(r.get("steps", 0)) for r in rows),
            "window_samples": sum(int(r.get("samples", 0)) for r in rows) if known else None,
            "folded_steps": int(folded_counts.get("steps", 0))}


def _parts_s(steady: list[Step]) -> dict[str, float]:
    """Steady seconds per part of compute; ``step_code`` is what the others leave of it."""
    forward, backward, optimizer = (sum(getattr(s, f"{name}_ns") for s in steady) / 1e9
                                    for name in ("forward", "backward", "optimizer"))
    compute = sum(s.compute_ns for s in steady) / 1e9
    return {"forward": forward, "backward": backward, "optimizer": optimizer,
            "step_code": max(0.0, compute - forward - backward - optimizer)}

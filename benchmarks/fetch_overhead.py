"""The recorder's cost inside a DataLoader worker: one batch fetch of the reference workload, plain and recorded.

A worker's time is spent in ``fetch`` (indices in, collated batch out). This runs that fetch in one process,
the way a worker does (the reference workload's demo ImageFolder, ``RandomResizedCrop``/flip/``ToTensor``/
``Normalize``, batches of 16), alternating per batch between:
- ``plain``: PyTorch's own ``fetch``;
- ``every``: recorded, every library call of every batch timed;
- ``never``: recorded, calls never timed (the per-batch record only: wall, CPU, run-queue wait);
- ``default``: recorded, calls timed in one batch of every few as ``record.calls.timing_interval`` decides,
  and the Python stack sampled during the fetch (``record/stacks.py``, at its default rate);
- ``nostacks``: ``default`` without the stack sampler (what the recorder cost before it), so ``default`` minus
  ``nostacks`` is the sampler's cost.
Every round fetches the same random indices with each variant in a shuffled order, so each recorded batch is
compared with a plain one of the same images fetched moments apart (paired differences: the host's drift
cancels; its noise does not, hence many rounds).

Run:  python benchmarks/fetch_overhead.py [--rounds 1500] [--image-size 96] [--variants every,never,default]

Measured on the 2-core development machine (2026-11-30), 1,500 rounds at 96 px (paired differences against
plain: mean, as a share of a plain batch; one batch's noise here is +-2-3 ms, so the standard error of a mean is
~70-100 us, 0.2-0.3%):
- plain batch 34.1 ms: every +688 us (+2.00%), never +158 us (+0.46%), default +260 us (+0.75%), the default rule
  timing the calls of 246 batches of 1,501 (intervals 5-8, at 10 us estimated per call);
- 2026-12-01, with the stack sampler (record/stacks.py): 600 rounds at 67 Hz: default +1,379 us (+3.06%) vs
  nostacks +670 us (+1.49%): the sampler +0.7 ms per 44 ms batch (~240 us per sample), so the rate became 19 Hz;
  500 rounds at 19 Hz: default +234 us (+0.51%) vs nostacks +407 us (+0.88%) wall, +316 vs +290 us CPU (the
  sampler within the noise, ~150 us here), its own CPU 0.33% of the sampled fetches' time (counting its idle
  ticks during the other variants);
- 2026-12-01 (later), the signal sampler (SIGALRM handler in the fetching thread, timer armed only during fetches, no
  switch-interval change), 19 Hz, ``--variants default,nostacks``: 1,500 rounds, plain batch 47.5 ms: default
  +764 us (+1.61%) vs nostacks +472 us (+0.99%) wall, +713 vs +444 us CPU (means; medians +428 vs +416 us wall);
  1,000 rounds, plain 46.4 ms: default +963 us (+2.08%) vs nostacks +546 us (+1.18%) wall. The handler's own CPU
  (``sampler_cpu_ns``, all in the fetching thread) is 0.22-0.23% of the sampled fetches' time (~110 us a sample:
  the stack walk, a schedstat read, the re-arm); the paired means put the sampler at +0.3..+0.4 ms per batch
  (0.6-0.9%), within about two standard errors of that, and its medians at +12..+300 us;
- 2026-12-01, the signal sampler at 9 Hz (its default from then on), nothing else running, 1,200 rounds,
  ``--variants default,nostacks``, plain batch 39.2 ms: default +363 us (+0.87%) vs nostacks +329 us (+0.78%) wall;
  the sampler alone (default - nostacks, paired in each round) +0.08% +- 0.23% (standard error) wall, +0.05% +-
  0.23% CPU; its own CPU 0.09% of the sampled fetches' time. (At 19 Hz on a busy host the same pairing gave
  +0.98% +- 0.42% CPU.)
- earlier, plain batch 42.6 ms, with 8 us estimated per call: every +1,226 us (+2.85%), never +271 us (+0.63%),
  default +507 us (+1.18%, intervals 3-5); from the two, ~10 us per timed call (~97 calls per batch).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=1500, help="batches per variant (each round: one of each)")
    p.add_argument("--image-size", type=int, default=96, help="RandomResizedCrop size (the reference: 224)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--variants", default="every,never,default,nostacks",
                   help="recorded variants to compare with plain")
    a = p.parse_args()

    import torch

    torch.set_num_threads(1)  # as in a DataLoader worker
    import torch.utils.data._utils.fetch as fetch_module

    plain_fetch = fetch_module._MapDatasetFetcher.fetch
    from stallscope.settings import ENV_RUN_DIR

    os.environ.setdefault(ENV_RUN_DIR, tempfile.mkdtemp(prefix="stallscope-fetch-bench-"))
    from stallscope.recorder import bootstrap, calls, stacks

    bootstrap.install()
    recorded_fetch = fetch_module._MapDatasetFetcher.fetch
    from torch.utils.data._utils.collate import default_collate
    from torchvision import datasets

    from stallscope.demo.dataset import demo_dataset
    from stallscope.demo.reference_train import build_transform

    data = datasets.ImageFolder(str(demo_dataset(progress=True)), build_transform(a.image_size, heavy=False))
    fetcher = fetch_module._MapDatasetFetcher(data, True, default_collate, False)
    default_rule = calls.timing_interval
    intervals: list[int] = []  # what the default rule chose, once per timed batch

    def counted_default(account: Any, wall_ns: int) -> int:
        intervals.append(default_rule(account, wall_ns))
        return intervals[-1]

    rules: dict[str, Callable[[Any, int], int] | None] = {
        "plain": None, "every": lambda account, wall: 1, "never": lambda account, wall: 1 << 40,
        "default": counted_default, "nostacks": default_rule}
    sampling = stacks.fetch_started
    chosen = ["plain", *(v for v in a.variants.split(",") if v)]
    unknown = [v for v in chosen if v not in rules]
    if unknown:
        p.error(f"unknown variant(s) {', '.join(unknown)}; choose from every, never, default, nostacks")
    rules = {name: rule for name, rule in rules.items() if name in chosen}
    contexts = {name: (0, 0, i) for i, name in enumerate(rules)}  # one worker identity per variant

    def fetch(name: str, indices: list[int]) -> tuple[int, int]:
        """(wall, thread CPU) ns of one batch: CPU leaves out the host's preemptions, the larger noise here."""
        rule = rules[name]
        if rule is not None:
            calls.timing_interval = rule
        fetcher._stallscope_ctx = contexts[name]
        stacks.fetch_started = (lambda loader_id: None) if name == "nostacks" else sampling
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        (plain_fetch if rule is None else recorded_fetch)(fetcher, indices)
        return time.perf_counter_ns() - t0, time.thread_time_ns() - c0

    rng = random.Random(0)
    for name in rules:  # a worker's first batch is always timed; warm-up, not measured
        fetch(name, rng.sample(range(len(data)), a.batch_size))
    took: dict[str, list[tuple[int, int]]] = {name: [] for name in rules}
    names = list(rules)
    for r in range(a.rounds):
        indices = rng.sample(range(len(data)), a.batch_size)
        rng.shuffle(names)
        for name in names:
            torch.manual_seed(r)  # the same crops and flips for every variant
            took[name].append(fetch(name, indices))
        if r % 25 == 24:
            print(f"round {r + 1}/{a.rounds}", flush=True)
    calls.timing_interval = default_rule
    stacks.fetch_started = sampling
    stacks.emit_counts()
    sampled_ns = sum(w for w, _ in took.get("default", []))
    if sampled_ns:
        print(f"stack sampler: {stacks.sampler_cpu_ns / 1e6:.1f} ms of its own CPU over {sampled_ns / 1e9:.1f} s of "
              f"sampled fetches ({100 * stacks.sampler_cpu_ns / sampled_ns:.2f}%) at {stacks.DEFAULT_HZ:.0f} Hz")
    plain = took["plain"]
    print(f"\nplain batch: median {statistics.median(w for w, _ in plain) / 1e6:.2f} ms wall, "
          f"{statistics.median(c for _, c in plain) / 1e6:.2f} ms CPU over {len(plain)} batches ({a.batch_size} "
          f"images at {a.image_size} px); the default rule timed the calls of {len(intervals)} batches of "
          f"{a.rounds + 1} (intervals {sorted(set(intervals))})")
    for name in rules:
        if name == "plain":
            continue
        for clock, label in ((0, "wall"), (1, "CPU ")):
            diffs = [x[clock] - y[clock] for x, y in zip(took[name], plain)]
            q = statistics.quantiles(diffs, n=4)
            mean_plain = statistics.mean(y[clock] for y in plain)
            print(f"{name:8s} {label} paired difference: median {statistics.median(diffs) / 1e3:+6.0f} us "
                  f"(quartiles {q[0] / 1e3:+.0f}..{q[2] / 1e3:+.0f}), mean {statistics.mean(diffs) / 1e3:+6.0f} us "
                  f"= {100 * statistics.mean(diffs) / mean_plain:+.2f}% of a plain batch")
    if "default" in took and "nostacks" in took:  # the sampler alone: paired within each round, one pairing
        for clock, label in ((0, "wall"), (1, "CPU ")):
            diffs = [x[clock] - y[clock] for x, y in zip(took["default"], took["nostacks"])]
            mean_plain = statistics.mean(y[clock] for y in plain)
            mean, error = statistics.mean(diffs), statistics.stdev(diffs) / len(diffs) ** 0.5
            print(f"sampler  {label} default - nostacks: mean {mean / 1e3:+6.0f} us +- {error / 1e3:.0f} (standard "
                  f"error) = {100 * mean / mean_plain:+.2f}% +- {100 * error / mean_plain:.2f}% of a plain batch; "
                  f"median {statistics.median(diffs) / 1e3:+.0f} us")


if __name__ == "__main__":
    main()

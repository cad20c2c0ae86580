"""``stallscope bench`` inside the target: drain the script's first DataLoader alone, then replay.

Activated by ``STALLSCOPE_BENCH`` (a JSON config) in the main process of the job. When the script
first iterates a DataLoader, that loader is benchmarked instead of trained on:

1. *input capacity*: for each requested worker count, a fresh DataLoader with the script's own
   dataset, sampler, collate function and worker set-up is drained with no model for a bounded
   time, and its steady rate is measured (the first burst of batches, one per worker, excluded);
2. *ceiling*: a few already-loaded batches are handed to the script's own loop over and over, so
   the model runs as if data were free; the time between batch requests is the compute-only step.

Results go to the config's ``out`` file; the process then ends with exit code 0.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

_config: dict[str, Any] = {}
_done = False
_perf = time.perf_counter


def install(config_text: str) -> None:
    from stallscope.recorder import importhook

    _config.update(json.loads(config_text))
    _config.setdefault("pid", os.getpid())
    importhook.when_imported("torch.utils.data.dataloader", _patch)


def _patch(module: Any) -> None:
    DataLoader = module.DataLoader
    wrapped_iter = DataLoader.__iter__  # whatever is there now: the recorder's patch, or torch's own

    def __iter__(self: Any) -> Any:
        global _done
        if _done or os.getpid() != _config.get("pid") or _in_worker():
            return wrapped_iter(self)
        _done = True
        return _benchmark(self, DataLoader)

    DataLoader.__iter__ = __iter__


def _in_worker() -> bool:
    from torch.utils.data import get_worker_info

    return get_worker_info() is not None


def _samples(batch: Any) -> int | None:
    from stallscope.recorder.loader import batch_size_of

    return batch_size_of(batch)


def _clone(loader: Any, DataLoader: Any, workers: int) -> Any:
    """A new DataLoader over the same dataset, sampling and collation, with ``workers`` workers."""
    from torch.utils.data import IterableDataset

    kw: dict[str, Any] = dict(num_workers=workers, collate_fn=loader.collate_fn, pin_memory=loader.pin_memory,
                              timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
                              generator=loader.generator)
    if workers > 0:
        kw.update(prefetch_factor=loader.prefetch_factor or 2, multiprocessing_context=loader.multiprocessing_context)
    if isinstance(loader.dataset, IterableDataset):
        kw.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
    elif loader.batch_sampler is not None:
        kw["batch_sampler"] = loader.batch_sampler
    else:
        kw.update(batch_size=None, sampler=loader.sampler)
    from stallscope.recorder import loader as recorder_loader

    saved = dict(recorder_loader.overrides)
    recorder_loader.overrides.clear()  # the drain sets its own worker count; --set must not undo it
    try:
        return DataLoader(loader.dataset, **kw)
    finally:
        recorder_loader.overrides.update(saved)


def drain(loader: Any, seconds: float, max_batches: int, keep: int = 0) -> tuple[dict[str, Any], list[Any]]:
    """Iterate ``loader`` with no model; return its rates and the first ``keep`` batches."""
    t0 = _perf()
    arrivals: list[float] = []
    sizes: list[int | None] = []
    kept: list[Any] = []
    iterator = iter(loader)
    try:
        while True:  # a small dataset is drained over several epochs; restarts count, as in training
            for batch in iterator:
                arrivals.append(_perf())
                sizes.append(_samples(batch))
                if len(kept) < keep:
                    kept.append(batch)
                if len(arrivals) >= max_batches or (arrivals[-1] - arrivals[0] >= seconds and len(arrivals) >= 4):
                    break
            else:
                if arrivals and _perf() - t0 < seconds:
                    iterator = iter(loader)
                    continue
            break
    finally:
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        del iterator
    workers = int(getattr(loader, "num_workers", 0) or 0)
    skip = min(max(1, workers), max(1, len(arrivals) // 3))
    result: dict[str, Any] = {"num_workers": workers, "batches": len(arrivals),
                              "first_batch_s": (arrivals[0] - t0) if arrivals else None,
                              "batches_per_s": None, "samples_per_s": None}
    if len(arrivals) > skip:
        span = arrivals[-1] - arrivals[skip - 1]
        if span > 0:
            result["batches_per_s"] = (len(arrivals) - skip) / span
            counted = sizes[skip:]
            if all(s is not None for s in counted):
                result["samples_per_s"] = sum(counted) / span  # type: ignore[arg-type]
    return result, kept


class Replay:
    """Yields cached batches to the script's loop; times the gaps between requests (compute only)."""

    def __init__(self, batches: list[Any], steps: int, warmup: int, on_finish: Any) -> None:
        self.batches, self.steps, self.warmup, self.on_finish = batches, steps, warmup, on_finish
        self.requests: list[float] = []
        self.sizes: list[int | None] = []

    def __iter__(self) -> Replay:
        return self

    def __len__(self) -> int:
        return self.steps

    def __next__(self) -> Any:
        self.requests.append(_perf())
        served = len(self.requests) - 1
        if served >= self.steps:
            self.on_finish(self)
            raise SystemExit(0)
        batch = self.batches[served % len(self.batches)]
        self.sizes.append(_samples(batch))
        return batch

    def result(self) -> dict[str, Any]:
        gaps = [b - a for a, b in zip(self.requests, self.requests[1:])]
        sizes = self.sizes[: len(gaps)]
        kept_gaps, kept_sizes = gaps[self.warmup:], sizes[self.warmup:]
        out: dict[str, Any] = {"steps": len(kept_gaps), "warmup_steps": self.warmup,
                               "steps_per_s": None, "samples_per_s": None,
                               "step_times_s": [round(g, 6) for g in kept_gaps]}
        total = sum(kept_gaps)
        if total > 0:
            out["steps_per_s"] = len(kept_gaps) / total
            if kept_sizes and all(s is not None for s in kept_sizes):
                out["samples_per_s"] = sum(kept_sizes) / total  # type: ignore[arg-type]
        return out


def _write(report: dict[str, Any]) -> None:
    path = _config["out"]
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(report, fh, indent=1)
    os.replace(tmp, path)


def _benchmark(loader: Any, DataLoader: Any) -> Any:
    seconds = float(_config.get("seconds", 3.0))
    max_batches = int(_config.get("max_batches", 200))
    own = int(loader.num_workers or 0)
    counts = sorted({int(w) for w in _config.get("workers", [])} | {own})
    keep = int(_config.get("ceiling_batches", 8))
    report: dict[str, Any] = {"schema": "stallscope.bench-target/1", "script_num_workers": own,
                              "batch_size": loader.batch_size, "capacity": [], "ceiling": None}
    cached: list[Any] = []
    for workers in counts:
        try:
            result, kept = drain(_clone(loader, DataLoader, workers), seconds, max_batches,
                                 keep=keep if not cached else 0)
        except Exception as exc:  # one failing worker count must not lose the others
            result, kept = {"num_workers": workers, "error": f"{type(exc).__name__}: {exc}"[:300]}, []
        cached = cached or kept
        report["capacity"].append(result)
        _write(report)
        print(f"stallscope bench: {workers} workers: {result.get('samples_per_s') or result.get('batches_per_s')}",
              file=sys.stderr, flush=True)
    if not cached:
        report["ceiling_error"] = "no batch could be loaded"
        _write(report)
        raise SystemExit(0)

    def finish(replay: Replay) -> None:
        report["ceiling"] = replay.result()
        _write(report)

    steps = int(_config.get("ceiling_steps", 30))
    warmup = int(_config.get("ceiling_warmup", 3))
    return Replay(cached, steps + warmup + 1, warmup, finish)

"""Ranked changes, each with the exact edit and a speedup predicted by the throughput model.

Predictions are ratios of the model's rates (new configuration over current), so a constant bias
of the model cancels. The model is in ``capacity.py``.
"""

from __future__ import annotations

from stallscope.analyze.capacity import ThroughputModel
from stallscope.analyze.findings import LoaderSummary, Recommendation, StepStats

MIN_GAIN = 1.05
#: Code changes are predicted under an assumption (the stage gets twice as cheap); a configuration change
#: is predicted from measured costs alone. Ranking discounts the former so a comparable measured fix wins.
SPECULATIVE_DISCOUNT = 0.8
NORMALIZE_CALLS = ("ToTensor", "Normalize", "ConvertImageDtype", "ToDtype", "F.to_tensor", "F.normalize")


def best_worker_count(model: ThroughputModel, usable_cpus: float) -> tuple[int, float]:
    """The smallest worker count within 2% of the best predicted rate, and its speedup."""
    io_heavy = model.cost_s.get("storage", 0.0) > sum(v for k, v in model.cost_s.items() if k != "storage")
    ceiling = int(min(32, max(4 * usable_cpus, 8) if io_heavy else usable_cpus + 2))
    rates = {w: model.rate(workers=w) for w in range(1, ceiling + 1)}
    top = max(rates.values())
    choice = min(w for w, r in rates.items() if r >= 0.98 * top)
    return choice, rates[choice] / model.rate()


def recommend(verdict: str, stats: StepStats, train: LoaderSummary | None, seconds: dict[str, float],
              usable_cpus: int, startup_s: float = 0.0, model: ThroughputModel | None = None,
              transfer_unpinned_fraction: float | None = None) -> list[Recommendation]:
    recs: list[Recommendation] = []
    wait_pct = 100 * stats.data_wait_fraction
    if verdict == "compute-bound":
        recs.append(Recommendation(
            "no-input-fix", "compute", "No input-side fix needed: the model's compute sets the pace",
            "none: leave the DataLoader as it is; speed up the model (mixed precision, larger batch, torch.compile)",
            None, f"data wait is {wait_pct:.1f}% of step time"))
    if train is None or verdict == "unknown":
        return recs
    config = train.config
    workers = int(config.get("num_workers") or 0)
    pipeline = train.pipeline
    input_side = verdict != "compute-bound"
    best_workers = workers
    if model is not None and input_side:
        best_workers, gain = best_worker_count(model, model.usable_cpus)
        if best_workers != workers and gain >= MIN_GAIN:
            recs.append(Recommendation(
                "num-workers", "loader", f"Use {best_workers} DataLoader worker{'s' if best_workers != 1 else ''} "
                f"(now {workers})",
                f"--set num_workers={best_workers}   (in code: DataLoader(..., num_workers={best_workers}))",
                round(gain, 2),
                f"{usable_cpus} usable CPUs; each sample costs {1000 * sum(model.cost_s.values()):.1f} ms of loader "
                f"work ({1000 * model.cost_s.get('storage', 0.0):.1f} ms of it blocked) and "
                f"{1000 * model.compute_per_sample_s:.1f} ms of compute"))
        elif workers > usable_cpus + 1 and best_workers < workers:
            recs.append(Recommendation(
                "fewer-workers", "loader", f"Use {best_workers} workers instead of {workers}",
                f"--set num_workers={best_workers}", round(max(gain, 1.0), 2),
                f"{workers} workers compete for {usable_cpus} CPUs: the extra ones only add memory and contention"))
    if input_side and pipeline is not None and workers > 0:
        if not config.get("persistent_workers") and train.epochs > 1 and startup_s / max(stats.wall_s, 1e-9) > 0.03:
            gain = stats.wall_s / max(stats.wall_s - startup_s, 1e-9)
            per_start = sum(pipeline.startup_s) / max(1, len(pipeline.startup_s))
            recs.append(Recommendation(
                "persistent-workers", "loader", "Keep workers alive between epochs",
                "--set persistent_workers=true   (in code: DataLoader(..., persistent_workers=True))",
                round(gain, 2),
                f"workers take {per_start:.2f} s to start and are restarted every epoch ({train.epochs} epochs): "
                f"{startup_s:.2f} s of waiting for restarts"))
        if model is not None and (pipeline.empty_queue_fraction or 0) > 0.25 \
                and model.pipeline_rate() > 1.15 * model.compute_rate() and model.measured_samples_per_s:
            depth = 2 * int(config.get("prefetch_factor") or 2)
            gain = model.rate() / model.measured_samples_per_s
            if gain >= MIN_GAIN:
                recs.append(Recommendation(
                    "prefetch", "loader", "Prefetch deeper: the queue runs dry in bursts",
                    f"--set prefetch_factor={depth}", round(gain, 2),
                    f"no batch was ready on {100 * pipeline.empty_queue_fraction:.0f}% of requests although the "
                    f"workers can produce {model.pipeline_rate():.0f} samples/s for a model that takes "
                    f"{model.compute_rate():.0f}"))
        discarded = _discarded_prefetch(train, model, workers)
        if discarded is not None:
            recs.append(discarded)
    waiting_for_fds = stats.unpickle_s - stats.unpickle_cpu_s
    if input_side and workers > 0 and stats.steady and waiting_for_fds > 0.15 * stats.wall_s \
            and config.get("sharing_strategy", "file_descriptor") != "file_system":
        per_batch = 1000 * waiting_for_fds / max(1, sum(s.batches for s in stats.steady))
        recs.append(Recommendation(
            "sharing-strategy", "loader", "Pass batches through shared-memory files, not file descriptors",
            "--set sharing_strategy=file_system   (in code: torch.multiprocessing.set_sharing_strategy("
            "'file_system') before building the DataLoader)", None,
            f"the training process waited {per_batch:.1f} ms per batch ({100 * waiting_for_fds / stats.wall_s:.0f}% "
            "of step time) for workers to hand over tensors' file descriptors: a worker busy in Python answers "
            "only between its own work. Not predicted: measure it with the --set above"))
    if transfer_unpinned_fraction is not None and transfer_unpinned_fraction > 0.5 and seconds.get("transfer", 0) > 0:
        step = sum(seconds.values())
        gain = step / max(step - seconds["transfer"] / 2, 1e-9)
        if gain >= MIN_GAIN:
            recs.append(Recommendation(
                "pin-memory", "transfer", "Pin host memory and copy asynchronously",
                "--set pin_memory=true, and .to(device, non_blocking=True) in the loop", round(gain, 2),
                f"{100 * transfer_unpinned_fraction:.0f}% of host-to-device bytes came from pageable memory"))
    if verdict == "input-bound" and pipeline is not None:
        recs.extend(r for r in _stage_fixes(seconds, train, model, workers)
                    if r.predicted_speedup is None or r.predicted_speedup >= MIN_GAIN)
    recs.sort(key=lambda r: (r.id != "no-input-fix", -_rank_value(r)))
    return recs


def _discarded_prefetch(train: LoaderSummary, model: ThroughputModel | None, workers: int) -> Recommendation | None:
    """Batches the workers loaded that the script never took: a loop that leaves each epoch early
    (``break`` after N batches) makes the next ``iter(loader)`` drop every batch already in flight,
    ``num_workers * prefetch_factor`` of them, so that much loading is thrown away at every epoch."""
    pipeline = train.pipeline
    prefetch = int(train.config.get("prefetch_factor") or 2)
    if pipeline is None or model is None or prefetch <= 1 or train.epochs < 2 or not train.batches:
        return None
    in_flight = workers * prefetch  # the last epoch's queue, left when the run ended: not a recurring loss
    wasted = pipeline.batches - train.batches - in_flight
    if wasted < 0.1 * pipeline.batches:
        return None
    old = pipeline.batches / train.batches  # batches loaded per batch used
    new = (train.batches + (wasted + in_flight) / prefetch) / train.batches  # waste shrinks with the queue
    stages = ("decode", "transform", "loader", "storage")
    gain = model.rate(scale=dict.fromkeys(stages, new)) / model.rate(scale=dict.fromkeys(stages, old))
    if gain < MIN_GAIN:
        return None
    return Recommendation(
        "discarded-prefetch", "loader", "Prefetch less: batches in flight are thrown away at every epoch",
        "--set prefetch_factor=1   (or let the loop finish its epochs instead of breaking out early)",
        round(gain, 2),
        f"workers loaded {pipeline.batches} batches and the script used {train.batches}: {wasted} were dropped "
        f"by {train.epochs - 1} new iter(loader) calls while up to {in_flight} batches were in flight "
        f"({workers} workers x prefetch_factor {prefetch})")


def _rank_value(rec: Recommendation) -> float:
    gain = rec.predicted_speedup or 0.0
    return gain if rec.change.startswith("--set") else gain * SPECULATIVE_DISCOUNT


def _gain(model: ThroughputModel | None, workers: int, scale: dict[str, float], fallback: float) -> float:
    if model is None:
        return fallback
    return round(model.rate(workers=workers, scale=scale) / model.rate(), 2)


def _stage_fixes(seconds: dict[str, float], train: LoaderSummary, model: ThroughputModel | None,
                 workers: int) -> list[Recommendation]:
    pipeline = train.pipeline
    total = sum(seconds.values()) or 1.0
    ranked = sorted(("storage", "decode", "transform", "loader"), key=lambda n: -seconds.get(n, 0.0))
    recs: list[Recommendation] = []
    for node in ranked[:2]:
        share = seconds.get(node, 0.0) / total
        if share < 0.15:
            continue
        halved = round(1.0 / (1.0 - share / 2), 2)
        if node == "decode":
            recs.append(Recommendation(
                "reduced-size-decode", "decode", "Decode JPEGs at the size you need",
                "use stallscope.data.FastImageFolder (DCT-scaled decode before the crop) or pack with "
                "`stallscope pack SRC OUT --max-side 500`", _gain(model, workers, {"decode": 0.5}, halved),
                f"decode is {100 * share:.0f}% of step time; predicted for decoding at half the cost"))
        elif node == "transform":
            calls = pipeline.by_call
            transform_s = pipeline.node_s.get("transform", 0.0) or 1e-9
            normalize_s = sum(v for k, v in calls.items() if k in NORMALIZE_CALLS)
            cut = min(0.9, normalize_s / transform_s)
            if cut > 0.1:
                recs.append(Recommendation(
                    "uint8-device-normalize", "transform", "Keep uint8 through the loader and normalize on the device",
                    "replace ToTensor()+Normalize() with PILToTensor() and normalize the batch after .to(device) "
                    "(stallscope.data: collate_fn=collate_uint8, then DeviceNormalizer); the loader then moves a quarter "
                    "of the bytes",
                    _gain(model, workers, {"transform": 1 - cut, "loader": 0.5}, halved),
                    f"ToTensor/Normalize take {100 * cut:.0f}% of transform time"))
            top = ", ".join(list(calls)[:3])
            by_calls = pipeline.direct_s / pipeline.busy_s if pipeline.busy_s else 0.0
            if by_calls < 0.5:
                recs.append(Recommendation(
                    "dataset-code", "transform", "Speed up the dataset's own Python code",
                    "profile __getitem__ (py-spy top --pid WORKER_PID), then precompute, vectorize or move the work "
                    "out of the loop (for example tokenize the corpus once, ahead of training)",
                    _gain(model, workers, {"transform": 0.5}, halved),
                    f"transform is {100 * share:.0f}% of step time and {100 * (1 - by_calls):.0f}% of the loader's "
                    "time is in no library call stallscope knows: it is the dataset's own code"))
            else:
                recs.append(Recommendation(
                    "cheaper-transforms", "transform", "Make the augmentations cheaper or batch them on the device",
                    "replace the costliest transforms (torchvision.transforms.v2 on uint8 tensors, or batched GPU "
                    "augmentation after the copy)", _gain(model, workers, {"transform": 0.5}, halved),
                    f"transform is {100 * share:.0f}% of step time; costliest calls: {top}"))
        elif node == "storage":
            recs.append(Recommendation(
                "pack-dataset", "storage", "Read fewer, larger files",
                "pack the dataset: `stallscope pack SRC OUT --format lmdb`, or cache it in RAM if it fits",
                _gain(model, workers, {"storage": 0.3}, halved),
                f"workers spent {pipeline.blocked_s:.1f} s blocked (I/O or waits), {100 * share:.0f}% of step time; "
                "predicted for a third of the blocking"))
        else:
            recs.append(Recommendation(
                "cheaper-collate", "loader", "Make batches cheaper to assemble",
                "return one stacked tensor per field instead of many small tensors; avoid per-sample Python objects",
                _gain(model, workers, {"loader": 0.5}, halved),
                f"collate and loader overhead are {100 * share:.0f}% of step time"))
    return recs

"""Ranked changes with a predicted speedup from a simple throughput model.

The model: a step takes the longest of (a) the compute the main process does, (b) the time
the workers need to produce the step's batches, each worker working serially, and (c) all the
CPU work of a step (main process counted as one busy core while computing) spread over the
usable cores. With ``num_workers=0`` nothing overlaps and a step is compute plus fetch.
"""

from __future__ import annotations

from stallscope.analyze.findings import LoaderSummary, Recommendation, StepStats

MIN_GAIN = 1.05


def predicted_step_s(compute_s: float, batch_wall_s: float, batch_cpu_s: float, batches_per_step: float,
                     workers: int, usable_cpus: int) -> float:
    if workers <= 0:
        return compute_s + batch_wall_s * batches_per_step
    produce = batch_wall_s * batches_per_step / workers
    cpu_bound = (compute_s + batch_cpu_s * batches_per_step) / max(1, usable_cpus)
    return max(compute_s, produce, cpu_bound)


def _worker_choice(stats: StepStats, train: LoaderSummary, usable_cpus: int,
                   startup_s: float) -> tuple[int, float] | None:
    pipeline = train.pipeline
    steady = stats.steady
    if pipeline is None or not steady or pipeline.batch_wall_median_s is None:
        return None
    compute = (stats.compute_s + stats.transfer_s) / len(steady)
    batches = max(1.0, sum(s.batches for s in steady) / len(steady))
    cpu = pipeline.batch_cpu_median_s or 0.0
    # Off-CPU time that is not run-queue waiting (I/O, sleeps) overlaps across workers without using cores.
    wall = pipeline.batch_wall_median_s
    if pipeline.runqueue_s is not None and pipeline.busy_s > 0:
        wall -= pipeline.runqueue_s / max(1, pipeline.batches)
        wall = max(wall, cpu)
    current_step = (stats.wall_s - startup_s) / len(steady)
    best: tuple[int, float] | None = None
    ceiling = max(2 * usable_cpus, 4) if pipeline.blocked_s > pipeline.cpu_s else usable_cpus + 1
    for workers in range(1, min(ceiling, 32) + 1):
        predicted = predicted_step_s(compute, wall, cpu, batches, workers, usable_cpus)
        gain = current_step / predicted if predicted > 0 else 1.0
        if best is None or gain > best[1] * 1.02:
            best = (workers, gain)
    return best


def recommend(verdict: str, stats: StepStats, train: LoaderSummary | None, seconds: dict[str, float],
              usable_cpus: int, startup_s: float = 0.0) -> list[Recommendation]:
    """``startup_s``: seconds of the steady window spent starting workers (epoch restarts)."""
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
    choice = _worker_choice(stats, train, usable_cpus, startup_s)
    if verdict != "compute-bound" and choice and choice[0] != workers and choice[1] >= MIN_GAIN:
        n, gain = choice
        recs.append(Recommendation(
            "num-workers", "loader", f"Use {n} DataLoader worker{'s' if n != 1 else ''} (now {workers})",
            f"--set num_workers={n}   (in code: DataLoader(..., num_workers={n}))", round(gain, 2),
            f"{usable_cpus} usable CPUs; a batch takes {1000 * (pipeline.batch_wall_median_s or 0):.0f} ms "
            f"to produce and the model {1000 * stats.compute_s / max(1, len(stats.steady)):.0f} ms to consume"))
    total = sum(seconds.values()) or 1.0
    if verdict != "compute-bound" and pipeline is not None:
        if workers > 0 and not config.get("persistent_workers") and train.epochs > 1 and startup_s > 0:
            if startup_s / max(stats.wall_s, 1e-9) > 0.03:
                gain = stats.wall_s / max(stats.wall_s - startup_s, 1e-9)
                per_start = sum(pipeline.startup_s) / max(1, len(pipeline.startup_s))
                recs.append(Recommendation(
                    "persistent-workers", "loader", "Keep workers alive between epochs",
                    "--set persistent_workers=true   (in code: DataLoader(..., persistent_workers=True))",
                    round(gain, 2),
                    f"workers take {per_start:.2f} s to start and are restarted every epoch ({train.epochs} "
                    f"epochs): {startup_s:.2f} s of waiting for restarts"))
        dominant = max(("storage", "decode", "transform", "loader"), key=lambda n: seconds.get(n, 0.0))
        share = seconds.get(dominant, 0.0) / total
        saturated = workers >= max(1, usable_cpus - 1)
        if share > 0.15 and (saturated or not choice or choice[1] < MIN_GAIN):
            recs.extend(_stage_fix(dominant, share, stats, pipeline))
    recs.sort(key=lambda r: (r.id != "no-input-fix", -(r.predicted_speedup or 0.0)))
    return recs


def _stage_fix(node: str, share: float, stats: StepStats, pipeline) -> list[Recommendation]:
    # Halving a stage that takes `share` of the step removes share/2 of it when it is the limit.
    halved = round(1.0 / (1.0 - share / 2), 2)
    if node == "decode":
        return [Recommendation(
            "reduced-size-decode", "decode", "Decode JPEGs at the size you need",
            "use stallscope.data.FastImageFolder (DCT-scaled decode before the crop) or pack with "
            "`stallscope pack SRC OUT --max-side 500`", halved,
            f"decode is {100 * share:.0f}% of step time")]
    if node == "transform":
        calls = ", ".join(list(pipeline.by_call)[:3])
        return [Recommendation(
            "uint8-device-normalize", "transform", "Keep uint8 through the loader and normalize on the device",
            "replace ToTensor()+Normalize() with PILToTensor() and normalize the batch after .to(device) "
            "(stallscope.data has a helper)", halved,
            f"transform is {100 * share:.0f}% of step time; costliest calls: {calls}")]
    if node == "storage":
        return [Recommendation(
            "pack-dataset", "storage", "Read fewer, larger files",
            "pack the dataset: `stallscope pack SRC OUT --format lmdb`, or cache it in RAM if it fits", halved,
            f"workers spent {pipeline.blocked_s:.1f} s blocked (I/O or waits), {100 * share:.0f}% of step time")]
    return [Recommendation(
        "cheaper-collate", "loader", "Make batches cheaper to assemble",
        "return one stacked tensor per field instead of many small tensors; avoid per-sample Python objects",
        halved, f"collate and loader overhead are {100 * share:.0f}% of step time")]

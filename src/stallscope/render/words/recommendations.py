"""Recommendations and the fixes left out, in words: one function per id, found through ``_SAYS``.

The ids are the catalogue's (``analysis/fixes.py``); an id with no words here is said by its facts.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stallscope.analysis import Recommendation
from stallscope.analysis.cpu_load import SMT_YIELD
from stallscope.render.words import compute
from stallscope.render.words.phrases import PART_LABELS, facts_text, overrides
from stallscope.settings import in_code

if TYPE_CHECKING:
    from stallscope.data.crop_fit import CropFit


@dataclass(frozen=True)
class Said:
    """A recommendation in words: what it is, the change to make, and why."""
    title: str
    change: str
    reason: str


def created_at(loader: Any) -> str:
    """Where a loader was built: the user's frame, with the library's beside it when a framework built it."""
    code = loader.code
    if code is None or not code.site or code.site == loader.site:
        return loader.site
    library = f" (via {code.library_site})" if code.library_site and code.framework != "transformers" else ""
    if code.framework == "transformers":
        return f"{loader.site} (the Trainer's; TrainingArguments at {code.site})"
    return f"{code.site}{library}"


def _set_change(o: dict[str, Any], f: dict[str, Any], extra: str = "") -> str:
    """A ``--set`` change and the same change in the user's code."""
    return f"{overrides(o)}   (in code: {in_code(o, f.get('in_code'))}){extra}"


def _no_input_fix(rec: Recommendation, f: dict[str, Any], o: dict[str, Any]) -> tuple[str, str, str]:
    if "sync_share" in f:  # the gradient sync, not the compute, is the larger part of the step
        return ("No input-side fix needed: the ranks' gradient sync sets the pace",
                "none on the input side; reduce less often: larger batches per rank, or gradient accumulation with "
                "DDP's no_sync() (Hugging Face: gradient_accumulation_steps; Lightning: accumulate_grad_batches), "
                "which changes the effective batch; on GPUs, smaller DDP buckets overlap it with the backward",
                f"data wait is {100 * f['data_wait_fraction']:.1f}% of step time; waiting for the gradient "
                f"all-reduce is {100 * f['sync_share']:.0f}%")
    return ("No input-side fix needed: the model's compute sets the pace",
            "none: leave the DataLoader as it is; speed up the model (mixed precision, larger batch, "
            "torch.compile)", f"data wait is {100 * f['data_wait_fraction']:.1f}% of step time")


def _no_predicted_gain(rec: Recommendation, f: dict[str, Any], o: dict[str, Any]) -> tuple[str, str, str]:
    return ("No change is predicted to help", "none on this machine: more cores (or a GPU for the compute) "
            "would; stallscope tune tries settings if you want to measure", _no_workers_why(f["reason"], f))


def _num_workers(rec: Recommendation, f: dict[str, Any], o: dict[str, Any]) -> tuple[str, str, str]:
    n = o["num_workers"]
    kept = ", kept alive between epochs" if o.get("persistent_workers") else ""
    if "prefetch_factor" in o:
        depth = o["prefetch_factor"]
        kept += f"{' and' if kept else ','} {depth} batch{'es' if depth != 1 else ''} each in flight"
    spawn = o.get("multiprocessing_context") == "spawn" and f.get("connection_before_fork")
    if spawn:
        kept += f"{' and' if kept else ','} spawned"
    return (f"Use {n} DataLoader worker{'s' if n != 1 else ''} (now {f['workers']}){kept}",
            _set_change(o, f),
            f"{f['usable_cpus']} usable CPUs{_hardware_threads(f)}; each sample costs "
            f"{1000 * f['loader_s_per_sample']:.1f} ms of "
            f"loader work ({1000 * f['blocked_s_per_sample']:.1f} ms of it blocked) and "
            f"{1000 * f['compute_s_per_sample']:.1f} ms of compute" + _shared_memory_estimate(f)
            + _cpu_second_cost(f, n) + _epoch_starts(f, n)
            + ("; spawned, not forked: the worker sent its requests over a connection the training process had "
               "opened before forking it (pitfall connection-before-fork), and forked workers would share that "
               "socket, crossing their answers" if spawn else ""))


def _split_the_cores(rec: Recommendation, f: dict[str, Any], o: dict[str, Any]) -> tuple[str, str, str]:
    n, t = o["num_workers"], o["torch_threads"]
    kept = ", kept alive between epochs" if o.get("persistent_workers") else ""
    return (f"Split the cores: {t} compute thread{'s' if t != 1 else ''} (now {f['torch_threads']}) and {n} "
            f"DataLoader worker{'s' if n != 1 else ''} (now {f['workers']}){kept}", _set_change(o, f),
            f"the training process computes on the CPU with {f['torch_threads']} threads, keeping "
            f"{f['main_occupancy']:.1f} of {f['usable_cpus']:.1f} usable cores busy: workers beside it would hold "
            f"its threads back at every parallel region (workers alone are predicted at "
            f"{f['workers_alone_speedup']:.2f}x); with {t} thread{'s' if t != 1 else ''} its compute is predicted "
            f"to take {1000 * f['split_compute_s_per_sample']:.2f} ms per sample instead of "
            f"{1000 * f['compute_s_per_sample']:.2f} ms, and the workers load on the cores it leaves"
            + _cpu_second_cost(f, n))


def _compute_threads(rec: Recommendation, f: dict[str, Any], o: dict[str, Any]) -> tuple[str, str, str]:
    t = o["torch_threads"]
    return (f"Use {t} compute thread{'s' if t != 1 else ''} (now {f['torch_threads']})", _set_change(o, f),
            f"the training process computes on the CPU with {f['torch_threads']} intra-op threads on "
            f"{f['usable_cpus']:g} usable CPU{'s' if f['usable_cpus'] != 1 else ''}: each parallel region waits "
            f"for the threads that have no CPU; with {t} its compute is predicted to take "
            f"{1000 * f['cut_compute_s_per_sample']:.2f} ms per sample instead of "
            f"{1000 * f['compute_s_per_sample']:.2f} ms (estimated: each thread beyond the CPUs priced at "
            f"{f['oversubscribed_thread_cost']:g} of one thread's time, as measured on a 2-CPU machine)")


def _fewer_workers(rec: Recommendation, f: dict[str, Any], o: dict[str, Any]) -> tuple[str, str, str]:
    n = o["num_workers"]
    return (f"Use {n} worker{'s' if n != 1 else ''} instead of {f['workers']}", _set_change(o, f),
            f"{f['workers']} workers compete for {f['usable_cpus']} CPUs: the extra ones only add memory and "
            "contention")


def _persistent_workers(rec: Recommendation, f: dict[str, Any], o: dict[str, Any]) -> tuple[str, str, str]:
    return ("Keep workers alive between epochs",
            _set_change(o, f),
            f"workers take {f['startup_s_per_worker']:.2f} s to start and are restarted every epoch "
            f"({f['epochs']} epochs): {f['restart_wait_s']:.2f} s of waiting for restarts")


def _build_loader_once(rec: Recommendation, f: dict[str, Any], o: dict[str, Any]) -> tuple[str, str, str]:
    return ("Build the DataLoader once, before the epoch loop",
            f"create it once (at {f['site']}) and iterate it every epoch, with persistent_workers=True",
            f"the script built {f['loaders']} DataLoaders at that line, one per epoch, and each started its "
            f"workers again ({f['startup_s_per_worker']:.2f} s per worker): {f['restart_wait_s']:.2f} s of "
            "waiting for them; --set persistent_workers=true cannot keep workers of a new loader")


def _prefetch(rec: Recommendation, f: dict[str, Any], o: dict[str, Any]) -> tuple[str, str, str]:
    return ("Prefetch deeper: the queue runs dry in bursts", _set_change(o, f),
            f"no batch was ready on {100 * f['empty_queue_fraction']:.0f}% of requests although the workers can "
            f"produce {f['pipeline_samples_per_s']:.0f} samples/s for a model that takes "
            f"{f['compute_samples_per_s']:.0f}")


def _discarded_prefetch(rec: Recommendation, f: dict[str, Any], o: dict[str, Any]) -> tuple[str, str, str]:
    return ("Prefetch less: batches in flight are thrown away at every epoch",
            _set_change(o, f, "; or let the loop finish its epochs instead of breaking out early"),
            f"workers loaded {f['loaded_batches']} batches and the script used {f['used_batches']}: "
            f"{f['dropped_batches']} were dropped by {f['restarts']} new iter(loader) calls while up to "
            f"{f['in_flight']} batches were in flight ({f['workers']} workers x prefetch_factor "
            f"{f['prefetch_factor']})")


def _sharing_strategy(rec: Recommendation, f: dict[str, Any], o: dict[str, Any]) -> tuple[str, str, str]:
    per_batch = 1000 * f["fd_wait_s"] / max(1, f["batches"])
    return ("Pass batches through shared-memory files, not file descriptors",
            "--set sharing_strategy=file_system   (in code: torch.multiprocessing.set_sharing_strategy("
            "'file_system') before building the DataLoader)",
            f"the training process waited {per_batch:.1f} ms per batch "
            f"({100 * f['fd_wait_s'] / f['step_time_s']:.0f}% of step time) for workers to hand over tensors' "
            "file descriptors: a worker busy in Python answers only between its own work. Not predicted: "
            "measure it with the --set above")


def _pin_memory(rec: Recommendation, f: dict[str, Any], o: dict[str, Any]) -> tuple[str, str, str]:
    return ("Pin host memory and copy asynchronously",
            _set_change(o, f, ", and .to(device, non_blocking=True) in the loop"),
            f"{100 * f['unpinned_fraction']:.0f}% of host-to-device bytes came from pageable memory")


def crop_fit_of(crop: dict[str, Any]) -> CropFit:
    """The recorded crop (``loaders[].config.crop``) as the rule ``pack --max-side auto`` sizes images by."""
    from stallscope.data.crop_fit import CropFit

    if crop.get("kind") == "Resize":
        return CropFit(resize_shorter=int(crop["resize_shorter"]))
    (height, width), scale, ratio = crop["size"], crop["scale"], crop["ratio"]
    return CropFit((int(height), int(width)), float(scale[0]), (float(ratio[0]), float(ratio[1])))


def pack_auto_flags(crop: dict[str, Any] | None) -> str:
    """``pack --max-side auto``'s flags for the crop the run's transform takes (none where it is torchvision's
    default RandomResizedCrop(224), or unknown)."""
    if not crop:
        return ""
    if crop.get("kind") == "Resize":
        return f" --resize-shorter {crop['resize_shorter']}"
    (height, width), scale, ratio = crop["size"], crop["scale"], crop["ratio"]
    # pack's --crop is square: a non-square output is sized for its longer side (never smaller than needed)
    flags = f" --crop {max(height, width)}" if (height, width) != (224, 224) else ""
    if abs(scale[0] - 0.08) > 1e-9:
        flags += f" --crop-scale {scale[0]:g}"
    if abs(ratio[0] - 3 / 4) > 1e-6 or abs(ratio[1] - 4 / 3) > 1e-6:
        flags += f" --crop-ratio {ratio[0]:.4g} {ratio[1]:.4g}"
    return flags


def _reduced_size_decode(rec: Recommendation, f: dict[str, Any], o: dict[str, Any]) -> tuple[str, str, str]:
    crop = f.get("crop")
    taken = f" for the run's {crop_fit_of(crop).describe()}" if crop else ""
    return ("Decode JPEGs at the size you need",
            "use stallscope.data.FastImageFolder (DCT-scaled decode before the crop) or pack with "
            f"`stallscope pack SRC OUT --max-side auto{pack_auto_flags(crop)}` (each image at the size its crop "
            f"needs{taken})",
            f"decode is {100 * f['share']:.0f}% of step time; predicted for decoding at half the cost")


def _uint8_device_normalize(rec: Recommendation, f: dict[str, Any], o: dict[str, Any]) -> tuple[str, str, str]:
    return ("Keep uint8 through the loader and normalize on the device",
            "replace ToTensor()+Normalize() with PILToTensor() and normalize the batch after .to(device) "
            "(stallscope.data: collate_fn=collate_uint8, then DeviceNormalizer); the loader then moves a "
            "quarter of the bytes",
            f"ToTensor/Normalize take {100 * f['normalize_fraction']:.0f}% of transform time")


def _dataset_code(rec: Recommendation, f: dict[str, Any], o: dict[str, Any]) -> tuple[str, str, str]:
    spots = f.get("hotspots") or []
    start = (f"start with {'; then '.join(_hotspot_place(h, rec.node) for h in spots)}" if spots
             else "profile __getitem__ (py-spy top --pid WORKER_PID)")
    return ("Speed up the dataset's own Python code",
            f"{start}, then precompute, vectorize or move the work "
            "out of the loop (for example tokenize the corpus once, ahead of training)",
            f"transform is {100 * f['share']:.0f}% of step time and "
            f"{100 * (1 - f['transform_in_calls_fraction']):.0f}% of it is in no library call stallscope times: "
            "it is the dataset's own code")


def _cheaper_transforms(rec: Recommendation, f: dict[str, Any], o: dict[str, Any]) -> tuple[str, str, str]:
    return ("Make the augmentations cheaper or batch them on the device",
            "replace the costliest transforms (torchvision.transforms.v2 on uint8 tensors, or batched GPU "
            "augmentation after the copy)",
            f"transform is {100 * f['share']:.0f}% of step time; costliest calls: "
            f"{', '.join(f['costliest_calls'])}")


def _pack_dataset(rec: Recommendation, f: dict[str, Any], o: dict[str, Any]) -> tuple[str, str, str]:
    return ("Read fewer, larger files",
            "pack the dataset: `stallscope pack SRC OUT --format lmdb`, or cache it in RAM if it fits",
            f"workers spent {f['blocked_s']:.1f} s blocked (I/O or waits), {100 * f['share']:.0f}% of step "
            "time; predicted for a third of the blocking")


#: The connections boto3's and requests' pools keep by default.
POOL_DEFAULT = 10
#: How each HTTP client is given as many connections as threads (urllib opens one per request: nothing to say).
_CONNECTIONS = {
    "boto3": "boto3: `botocore.config.Config(max_pool_connections={n})` for the client, whose default is 10",
    "requests": "requests: `session.mount('https://', requests.adapters.HTTPAdapter(pool_maxsize={n}))`, whose "
                "default is 10",
}


def _requests_in_flight(rec: Recommendation, f: dict[str, Any], o: dict[str, Any]) -> tuple[str, str, str]:
    threads = f["threads"]
    bound = {"latency": "waiting for the store to answer", "bandwidth": "reading answers' bodies",
             "client-cpu": "the client's own CPU"}.get(f["bound"], f["bound"])
    client, connections = f.get("client", ""), f.get("connections", threads)
    pool = _CONNECTIONS.get(client, "") if connections > POOL_DEFAULT else ""
    now = f.get("concurrent", 1.0)
    if client == "fsspec":  # s3fs, gcsfs: the filesystem fetches a list at once on its own event loop
        how = ("define `__getitems__(self, indices)` on the dataset to read a batch's objects with one "
               "`fs.cat([paths])` (the DataLoader hands it the whole batch; fsspec fetches them at once on its event "
               "loop, as many at a time as the client's pool of connections holds: 10 by default in s3fs)")
        title = "Read each batch's objects with one fs.cat"
    else:
        how = (f"define `__getitems__(self, indices)` on the dataset to fetch a batch's objects with a "
               f"`concurrent.futures.ThreadPoolExecutor({threads})` (the DataLoader hands it the whole batch)"
               + (f", and let the client keep as many connections ({pool.format(n=connections)})" if pool
                  else f" ({client}'s default pool of {POOL_DEFAULT} connections holds them)"
                  if client in _CONNECTIONS else ""))
        title = f"Fetch each batch's objects on {threads} threads"
    return (title + (f" (about {now:.1f} at once now)" if now >= 1.5 else ""),
            how
            + "; packing does not apply to data that stays in a bucket",
            f"storage is {100 * f['share']:.0f}% of step time and its requests' time is mostly {bound}: "
            f"{f['requests_per_sample']:.1f} requests a sample, {f['latency_ms']:.1f} ms to the first byte "
            f"({f['request_ms']:.1f} ms in all), {f['in_flight']:.1f} in flight on average; predicted for the "
            f"requests' time cut {threads / now:.1f}-fold, the client's CPU unchanged")


#: How each streaming library names the size of the shards it writes ({n}: bytes), and the library in words.
_SHARD_SIZE = {
    "streaming": ("MosaicML Streaming", "write the shards with `MDSWriter(out=..., size_limit={n})` (its default is "
                  "1 << 26, 64 MiB)"),
    "litdata": ("LitData", "write the chunks with `litdata.optimize(..., chunk_bytes={n})`"),
    "webdataset": ("WebDataset", "write the shards with `wds.ShardWriter(pattern, maxsize={n})`"),
    "s3transfer": ("boto3's transfer manager", "store fewer, larger objects ({n} bytes each)"),
}


def library_words(library: str) -> str:
    """Whose download threads: a library by the name its users know it by, possessive."""
    return f"{_SHARD_SIZE.get(library, (library, ''))[0]}'s" if library else "the loader's own"


def _megabytes(n: float) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.0f} KB"


def _larger_shards(rec: Recommendation, f: dict[str, Any], o: dict[str, Any]) -> tuple[str, str, str]:
    factor, target = f["factor"], int(f["target_bytes"])
    how = _SHARD_SIZE.get(f.get("library", ""), ("", "write larger shards or objects ({n} bytes each)"))[1]
    return (f"Write shards {factor}x larger (about {_megabytes(target)})",
            how.format(n=target) + "; each download pays the store's latency once, so fewer, larger shards pay it "
            "less often (more DataLoader workers also put more downloads in flight, a thread each)",
            f"storage is {100 * f['share']:.0f}% of step time; {100 * f['background_share']:.0f}% of its requests "
            f"were {library_words(f.get('library', ''))} download threads, one shard at a time per worker: "
            f"{f['latency_ms']:.1f} ms to the "
            f"first byte of a request for a {_megabytes(f['shard_bytes'])} shard ({f['request_ms']:.1f} ms in all), "
            f"{f['in_flight']:.1f} in flight on average; predicted for that latency paid {factor}x less often, "
            "the bodies unchanged")


def _cheaper_collate(rec: Recommendation, f: dict[str, Any], o: dict[str, Any]) -> tuple[str, str, str]:
    return ("Make batches cheaper to assemble",
            "return one stacked tensor per field instead of many small tensors; avoid per-sample Python objects",
            f"collate and loader overhead are {100 * f['share']:.0f}% of step time")


def _distributed_sampler(rec: Recommendation, f: dict[str, Any], o: dict[str, Any]) -> tuple[str, str, str]:
    return ("Shard the input across ranks with DistributedSampler",
            "DataLoader(dataset, sampler=DistributedSampler(dataset), ...) and sampler.set_epoch(epoch) each "
            "epoch",
            f"every rank uses {', '.join(f['samplers'])}: each reads the whole dataset, {f['world_size']}x the "
            "input work for the same training")


def _uneven_shards(rec: Recommendation, f: dict[str, Any], o: dict[str, Any]) -> tuple[str, str, str]:
    spread = ", ".join(f"rank {r} {v:.0f}" for r, v in f["batches_per_epoch"].items())
    return ("Give every rank the same number of batches per epoch",
            "DistributedSampler(dataset, drop_last=True)   (or wrap the loop in model.join() for uneven inputs)",
            f"batches per epoch differ ({spread}): ranks with fewer finish early and the others wait or hang "
            "in the all-reduce")


def _sampler_drop_last(rec: Recommendation, f: dict[str, Any], o: dict[str, Any]) -> tuple[str, str, str]:
    return ("Drop the uneven tail instead of repeating samples", "DistributedSampler(dataset, drop_last=True)",
            f"{f['dataset_len']} samples do not split evenly over {f['world_size']} ranks: DistributedSampler "
            "pads the shards by repeating samples")


def _workers_per_node(rec: Recommendation, f: dict[str, Any], o: dict[str, Any]) -> tuple[str, str, str]:
    return (f"Use at most {o['num_workers']} DataLoader workers per rank on {f['host']}",
            f"--set num_workers={o['num_workers']}",
            f"{f['ranks']} ranks x their workers ({f['workers']} in all) compete for {f['usable_cpus']} usable "
            "CPUs on one node")


def _wait_for_other_nodes(rec: Recommendation, f: dict[str, Any], o: dict[str, Any]) -> tuple[str, str, str]:
    here = f["ranks_here"]
    ranks = f"rank {here[0]}" if len(here) == 1 else "ranks " + ", ".join(map(str, here))
    return ("The job waits for ranks on other nodes: no change on this node shortens the step",
            "read the job's report, which names the rank the others wait for and why: `stallscope run` gathers the "
            "nodes' sessions into it when the job ends (the node that merges says where it saved it), or merge them "
            "by hand (`stallscope merge NODE0_SESSION NODE1_SESSION ... -o job.json`)",
            f"{ranks} of the job's {f['world_size']} {'is' if len(here) == 1 else 'are'} recorded here, and "
            f"{'it waits' if len(here) == 1 else 'they wait'} for the others {100 * f['sync_share']:.0f}% of the "
            f"step; {100 * f['own_share']:.0f}% is {'its' if len(here) == 1 else 'their'} own work")


def _straggler_cpus(rec: Recommendation, f: dict[str, Any], o: dict[str, Any]) -> tuple[str, str, str]:
    return (f"Give rank {f['rank']}'s node the CPUs the others have",
            f"let the job use as many CPUs on {f['host']} as on the other nodes ({f['cpus']:.3g} now against "
            f"{f['others_cpus']:.3g}): its CPU affinity (taskset, numactl), its cgroup's CPU quota (the container's "
            "CPU limit, Kubernetes' resources.limits.cpu), or Slurm's --cpus-per-task",
            f"rank {f['rank']} does {f['extra_ms']:.1f} ms more of its own work a step than the fastest rank, on "
            f"{f['cpus']:.3g} CPUs where the others have {f['others_cpus']:.3g}: all its CPU work is slower, and "
            "every other rank waits for it")


#: recommendation id -> its words (title, change to make, reason)
_SAYS = {
    "no-input-fix": _no_input_fix,
    "no-predicted-gain": _no_predicted_gain,
    "num-workers": _num_workers,
    "split-the-cores": _split_the_cores,
    "compute-threads": _compute_threads,
    "fewer-workers": _fewer_workers,
    "persistent-workers": _persistent_workers,
    "build-loader-once": _build_loader_once,
    "prefetch": _prefetch,
    "discarded-prefetch": _discarded_prefetch,
    "sharing-strategy": _sharing_strategy,
    "pin-memory": _pin_memory,
    "reduced-size-decode": _reduced_size_decode,
    "uint8-device-normalize": _uint8_device_normalize,
    "dataset-code": _dataset_code,
    "cheaper-transforms": _cheaper_transforms,
    "pack-dataset": _pack_dataset,
    "requests-in-flight": _requests_in_flight,
    "larger-shards": _larger_shards,
    "cheaper-collate": _cheaper_collate,
    "distributed-sampler": _distributed_sampler,
    "uneven-shards": _uneven_shards,
    "sampler-drop-last": _sampler_drop_last,
    "workers-per-node": _workers_per_node,
    "wait-for-other-nodes": _wait_for_other_nodes,
    "straggler-cpus": _straggler_cpus,
    **compute.SAYS,
}


def recommendation(rec: Recommendation) -> Said:
    say = _SAYS.get(rec.id)
    if say is None:
        return Said(rec.id, overrides(rec.overrides) or "see the facts", facts_text(rec.facts))
    said = Said(*say(rec, rec.facts, rec.overrides))
    if "job_ceiling" in rec.facts:  # a straggler's fix, held to the job's pace
        f = rec.facts
        said = dataclasses.replace(said, reason=f"{said.reason}; on this rank alone {f['rank_speedup']:.2f}x, but the "
                                   f"job then runs at rank {f['pace_rank']}'s pace: at most {f['job_ceiling']:.2f}x")
    return said


def _no_workers_why(cause: str, f: dict[str, Any]) -> str:
    """Why no worker count is advised (``recommend.workers_cause``), with the best count's prediction: the reason of
    ``no-predicted-gain`` and of the workers' why-not alike."""
    other, n = f.get("other_cpus", 0.0), f["best_workers"]
    why = {
        "other-load": f"other programs kept {other:.1f} of the {f.get('cpus')} CPUs busy, leaving this job about "
                      f"{f['usable_cpus']:.1f}: on that, {n} worker{'s' if n != 1 else ''} "
                      f"{'are' if n != 1 else 'is'} predicted at {f['best_speedup']:.2f}x; on a quiet "
                      f"machine {f.get('quiet_workers')} workers are predicted at {f.get('quiet_speedup', 0):.2f}x "
                      "(estimated from this run's costs): measure them there",
        "compute-takes-the-cores": f"the training process keeps {f['main_occupancy']:.1f} of {f['usable_cpus']:.1f} "
                                   "usable cores busy while it computes: a worker would take its core from the "
                                   "compute",
        "epoch-starts": f"the measured steps start {f.get('epoch_starts')} new epochs of about "
                        f"{f.get('samples_per_epoch', 0):.0f} samples each, and each would cost "
                        f"{f['best_workers']} workers about {f.get('epoch_cost_s', 0):.2f} s "
                        f"({_epoch_cost_parts(f)}): more than their {f['best_speedup']:.2f}x steady-state gain "
                        "saves (longer epochs, or one loop over more batches, would let workers pay off)",
        "cpu-budget": f"every core is busy already: {1000 * f['loader_cpu_s_per_sample']:.1f} ms of loader CPU and "
                      f"{1000 * f['compute_s_per_sample']:.1f} ms of compute per sample on "
                      f"{f['usable_cpus']:.1f} usable cores",
    }.get(cause, "no DataLoader setting the model knows is predicted to gain 5%")
    best = (f"; the best worker count, {f['best_workers']}, is predicted at {f['best_speedup']:.2f}x"
            if f["best_workers"] != f["workers"] and cause not in ("epoch-starts", "other-load") else "")
    return why + best


#: What each left-out fix is, as its why-not names it (the advice's own title where it has one).
_LEFT_OUT = {"num-workers": "more DataLoader workers"}


def not_recommended(item: Any) -> Said:
    """A likely fix left out of the advice (``analysis.findings.NotRecommended``), in one line: ``title`` names it,
    ``reason`` says why; ``change`` is empty (there is none to make)."""
    f = item.facts
    if item.id == "num-workers":
        title = f"{_LEFT_OUT[item.id]} (now num_workers={f['workers']})"
        return Said(title, "", _no_workers_why(item.cause, f))
    if item.cause == "below-min-gain":
        said = recommendation(Recommendation(item.id, item.node, f.get("predicted_speedup"), facts=f))
        return Said(f"{said.title} ({item.node})", "",
                    f"predicted at {f['predicted_speedup']:.2f}x, under the {f['min_gain']:.2f}x worth advising: "
                    "the rest of the job would still hold it back")
    return Said(item.id, "", f"{item.cause}: {facts_text(f)}")


def _hotspot_place(h: dict[str, Any], stage: str) -> str:
    """``Text.__getitem__`` (train.py:31) is 60% of transform (in tokenizers encode)."""
    inside = f" (in {h['library']})" if h.get("library") else ""
    return (f"{h['function']} ({os.path.basename(h['file'])}:{h['line']}) is {100 * h['share_of_stage']:.0f}% of "
            f"{stage}{inside}")


def hotspot(h: Any) -> str:
    """One hotspot under its stage: ``train.py:31 Text.__getitem__  60% of transform (tokenizers encode)``."""
    inside = f" ({h.library})" if h.library else ""
    part = f", in {PART_LABELS[h.part]}" if getattr(h, "part", None) in PART_LABELS else ""
    return (f"{os.path.basename(h.file)}:{h.line} {h.function}  {100 * h.share_of_stage:.0f}% of {h.stage}"
            f"{part}{inside}")


def _hardware_threads(f: dict) -> str:
    """Where the CPUs are hardware threads of fewer cores, how the prediction counts them."""
    threads = f.get("threads_per_core")
    if not threads:
        return ""
    return (f" ({threads:g} hardware threads per core: a thread on a core whose other thread is busy is counted as "
            f"{100 * SMT_YIELD:.0f}% of a core)")


def _epoch_starts(facts: dict, workers: int) -> str:
    """Where the measured steps start new epochs: what each start costs the workers, counted in the prediction."""
    if "epoch_starts" not in facts:
        return ""
    basis = facts.get("worker_start_basis")
    start = ("" if not facts["epoch_start_s"] else
             f"; a worker takes {facts['worker_start_s']:.2f} s to start"
             + (", measured" if basis == "measured" else f" ({basis}, estimated)"))
    if facts.get("epoch_warmup_s") and facts.get("warmup_batches"):
        start += (f"; a new worker's first two batches cost {facts['warmup_batches']:.2f} of a batch's CPU more than "
                  "its later ones" + (", measured" if facts.get("warmup_basis") == "measured"
                                      else f" ({facts.get('warmup_basis')}, estimated)"))
    if facts.get("prefetch_factor", facts.get("prefetch_factor_now")) != facts.get("prefetch_factor_now"):
        start += (f"; the loop leaves each epoch early, and the batches in flight then are dropped: with "
                  f"prefetch_factor={facts['prefetch_factor']} a worker has {facts['prefetch_factor']} in flight, not "
                  f"{facts['prefetch_factor_now']}")
    stop_basis = facts.get("worker_stop_basis")
    if facts.get("epoch_stop_s"):
        start += (f"; a stopped worker takes {facts['worker_stop_s']:.2f} s to exit"
                  + (", measured" if stop_basis == "measured" else f" ({stop_basis}, estimated)"))
    now = ""
    if facts.get("epoch_cost_now_s") and (facts.get("epoch_start_now_s") or facts.get("epoch_stop_now_s")):
        now = (f" (now {facts['epoch_cost_now_s']:.2f} s each"
               + "".join(f", {what} {facts[key]:.2f} s" for what, key in
                         (("stopping the workers", "epoch_stop_now_s"), ("starting them", "epoch_start_now_s"))
                         if facts.get(key))
               + ")")
    return (f"; the measured steps start {facts['epoch_starts']} new epochs{now}, each costing {workers} "
            f"worker{'s' if workers != 1 else ''} "
            f"about {facts['epoch_cost_s']:.2f} s ({_epoch_cost_parts(facts)}){start}, counted in the "
            f"prediction (steady state alone: {facts['steady_speedup']:.2f}x)")


def _epoch_cost_parts(facts: dict) -> str:
    """What one epoch start costs the workers, by part, as the facts give it."""
    parts = [f"stopping the last epoch's {facts.get('epoch_stop_s', 0):.2f} s" if facts.get("epoch_stop_s") else "",
             f"starting them {facts.get('epoch_start_s', 0):.2f} s" if facts.get("epoch_start_s") else "",
             f"refilling the queue {facts.get('epoch_fill_s', 0):.2f} s" if facts.get("epoch_fill_s") else "",
             f"the new workers' first batches costing more CPU {facts.get('epoch_warmup_s', 0):.2f} s"
             if facts.get("epoch_warmup_s") else "",
             f"batches in flight dropped when the loop leaves the epoch early {facts.get('epoch_dropped_s', 0):.2f} s"
             if facts.get("epoch_dropped_s") else ""]
    return ", ".join(p for p in parts if p) or "nothing"


def _cpu_second_cost(facts: dict, workers: int) -> str:
    """How much more (or less) a CPU second is estimated to cost at the advised load than at the recorded one."""
    cost = facts.get("cpu_second_cost")
    if cost is None or abs(cost - 1.0) < 0.01:
        return ""
    plural = "s" if workers != 1 else ""
    if cost < 1.0:
        return (f"; with {workers} worker{plural} the cores are less busy than in this run: each CPU second is "
                f"estimated to cost {100 * (1.0 - cost):.0f}% less, counted in the prediction")
    why = "caches and memory shared between busy cores"
    if facts.get("busy_threads_per_cpu", 0.0) > 1.0:
        why += ", switching between more threads than cores"
    beside = facts.get("computing_beside_workers", 0.0)
    if beside >= 0.05:
        why += f", the training step computing on another core {100 * beside:.0f}% of the time"
    compute = facts.get("compute_cpu_second_cost")
    own = (f", the training step's own {100 * (compute - 1.0):.0f}% more (its working set evicted by the others)"
           if compute is not None and compute - cost >= 0.01 else "")
    return (f"; with {workers} worker{plural} the cores are busier than in this run: each CPU second is estimated "
            f"to cost {100 * (cost - 1.0):.0f}% more ({why}){own}, counted in the prediction")


def _shared_memory_estimate(facts: dict) -> str:
    """From a 0-worker run: the estimated cost of passing batches through shared memory, said as such."""
    if "shared_memory_s_per_sample" not in facts:
        return ""
    basis = "per-byte cost measured on this machine" if facts.get("shared_memory_basis") == "measured at exit" \
        else "typical per-byte cost"
    reads = facts.get("shared_memory_reads", 1.0)
    if reads > 1.0:  # a training step on the CPU passes over its batch more than once (RECEIVED_BATCH_READS)
        basis += f", read {reads:g} times over by the training step on the CPU, estimated"
    seconds = facts["shared_memory_s_per_sample"]
    amount = f"{1e6 * seconds:.0f} us" if seconds < 1e-4 else f"{1000 * seconds:.2f} ms"
    return (f"; with workers, passing batches through shared memory adds an estimated {amount} per sample "
            f"({basis}), counted in the prediction")

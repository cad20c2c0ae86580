"""Every sentence stallscope says about a run, made from the findings' data.

The analysis returns ids, numbers and changes (``analysis/findings.py``); this module is where they
become words, once, for the terminal, the HTML report and the summary JSON alike. A finding id this
module does not know is shown by its id and facts rather than dropped.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from typing import Any

from stallscope.analysis import Analysis, Recommendation
from stallscope.analysis.cpu_load import SMT_YIELD
from stallscope.analysis.pipeline import calls_in_step_time
from stallscope.analysis.steps import FEW_STEADY_STEPS
from stallscope.analysis.system_metrics import OTHER_LOAD_NOTABLE_CPUS
from stallscope.settings import format_value, in_code

MIB = 1 << 20


@dataclass(frozen=True)
class Said:
    """A recommendation in words: what it is, the change to make, and why."""
    title: str
    change: str
    reason: str


@dataclass(frozen=True)
class PitfallSaid:
    """A pitfall in words: what it is, what this run showed, and the fix."""
    title: str
    evidence: str
    fix: str


# --- recommendations -----------------------------------------------------------------------------------------

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


def _recommendation_words(rec: Recommendation) -> tuple[str, str, str]:
    f, o = rec.facts, rec.overrides
    rid = rec.id
    if rid == "no-input-fix":
        return ("No input-side fix needed: the model's compute sets the pace",
                "none: leave the DataLoader as it is; speed up the model (mixed precision, larger batch, "
                "torch.compile)", f"data wait is {100 * f['data_wait_fraction']:.1f}% of step time")
    if rid == "no-predicted-gain":
        return ("No change is predicted to help", "none on this machine: more cores (or a GPU for the compute) "
                "would; stallscope tune tries settings if you want to measure", _no_workers_why(f["reason"], f))
    if rid == "num-workers":
        n = o["num_workers"]
        kept = ", kept alive between epochs" if o.get("persistent_workers") else ""
        if "prefetch_factor" in o:
            depth = o["prefetch_factor"]
            kept += f"{' and' if kept else ','} {depth} batch{'es' if depth != 1 else ''} each in flight"
        return (f"Use {n} DataLoader worker{'s' if n != 1 else ''} (now {f['workers']}){kept}",
                _set_change(o, f),
                f"{f['usable_cpus']} usable CPUs{_hardware_threads(f)}; each sample costs "
                f"{1000 * f['loader_s_per_sample']:.1f} ms of "
                f"loader work ({1000 * f['blocked_s_per_sample']:.1f} ms of it blocked) and "
                f"{1000 * f['compute_s_per_sample']:.1f} ms of compute" + _shared_memory_estimate(f)
                + _cpu_second_cost(f, n) + _epoch_starts(f, n))
    if rid == "split-the-cores":
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
    if rid == "compute-threads":
        t = o["torch_threads"]
        return (f"Use {t} compute thread{'s' if t != 1 else ''} (now {f['torch_threads']})", _set_change(o, f),
                f"the training process computes on the CPU with {f['torch_threads']} intra-op threads on "
                f"{f['usable_cpus']:g} usable CPU{'s' if f['usable_cpus'] != 1 else ''}: each parallel region waits "
                f"for the threads that have no CPU; with {t} its compute is predicted to take "
                f"{1000 * f['cut_compute_s_per_sample']:.2f} ms per sample instead of "
                f"{1000 * f['compute_s_per_sample']:.2f} ms (estimated: each thread beyond the CPUs priced at "
                f"{f['oversubscribed_thread_cost']:g} of one thread's time, as measured on a 2-CPU machine)")
    if rid == "fewer-workers":
        n = o["num_workers"]
        return (f"Use {n} worker{'s' if n != 1 else ''} instead of {f['workers']}", _set_change(o, f),
                f"{f['workers']} workers compete for {f['usable_cpus']} CPUs: the extra ones only add memory and "
                "contention")
    if rid == "persistent-workers":
        return ("Keep workers alive between epochs",
                _set_change(o, f),
                f"workers take {f['startup_s_per_worker']:.2f} s to start and are restarted every epoch "
                f"({f['epochs']} epochs): {f['restart_wait_s']:.2f} s of waiting for restarts")
    if rid == "build-loader-once":
        return ("Build the DataLoader once, before the epoch loop",
                f"create it once (at {f['site']}) and iterate it every epoch, with persistent_workers=True",
                f"the script built {f['loaders']} DataLoaders at that line, one per epoch, and each started its "
                f"workers again ({f['startup_s_per_worker']:.2f} s per worker): {f['restart_wait_s']:.2f} s of "
                "waiting for them; --set persistent_workers=true cannot keep workers of a new loader")
    if rid == "prefetch":
        return ("Prefetch deeper: the queue runs dry in bursts", _set_change(o, f),
                f"no batch was ready on {100 * f['empty_queue_fraction']:.0f}% of requests although the workers can "
                f"produce {f['pipeline_samples_per_s']:.0f} samples/s for a model that takes "
                f"{f['compute_samples_per_s']:.0f}")
    if rid == "discarded-prefetch":
        return ("Prefetch less: batches in flight are thrown away at every epoch",
                _set_change(o, f, "; or let the loop finish its epochs instead of breaking out early"),
                f"workers loaded {f['loaded_batches']} batches and the script used {f['used_batches']}: "
                f"{f['dropped_batches']} were dropped by {f['restarts']} new iter(loader) calls while up to "
                f"{f['in_flight']} batches were in flight ({f['workers']} workers x prefetch_factor "
                f"{f['prefetch_factor']})")
    if rid == "sharing-strategy":
        per_batch = 1000 * f["fd_wait_s"] / max(1, f["batches"])
        return ("Pass batches through shared-memory files, not file descriptors",
                "--set sharing_strategy=file_system   (in code: torch.multiprocessing.set_sharing_strategy("
                "'file_system') before building the DataLoader)",
                f"the training process waited {per_batch:.1f} ms per batch "
                f"({100 * f['fd_wait_s'] / f['step_time_s']:.0f}% of step time) for workers to hand over tensors' "
                "file descriptors: a worker busy in Python answers only between its own work. Not predicted: "
                "measure it with the --set above")
    if rid == "pin-memory":
        return ("Pin host memory and copy asynchronously",
                _set_change(o, f, ", and .to(device, non_blocking=True) in the loop"),
                f"{100 * f['unpinned_fraction']:.0f}% of host-to-device bytes came from pageable memory")
    if rid == "reduced-size-decode":
        return ("Decode JPEGs at the size you need",
                "use stallscope.data.FastImageFolder (DCT-scaled decode before the crop) or pack with "
                "`stallscope pack SRC OUT --max-side 500`",
                f"decode is {100 * f['share']:.0f}% of step time; predicted for decoding at half the cost")
    if rid == "uint8-device-normalize":
        return ("Keep uint8 through the loader and normalize on the device",
                "replace ToTensor()+Normalize() with PILToTensor() and normalize the batch after .to(device) "
                "(stallscope.data: collate_fn=collate_uint8, then DeviceNormalizer); the loader then moves a "
                "quarter of the bytes",
                f"ToTensor/Normalize take {100 * f['normalize_fraction']:.0f}% of transform time")
    if rid == "dataset-code":
        spots = f.get("hotspots") or []
        start = (f"start with {'; then '.join(_hotspot_place(h, rec.node) for h in spots)}" if spots
                 else "profile __getitem__ (py-spy top --pid WORKER_PID)")
        return ("Speed up the dataset's own Python code",
                f"{start}, then precompute, vectorize or move the work "
                "out of the loop (for example tokenize the corpus once, ahead of training)",
                f"transform is {100 * f['share']:.0f}% of step time and "
                f"{100 * (1 - f['transform_in_calls_fraction']):.0f}% of it is in no library call stallscope times: "
                "it is the dataset's own code")
    if rid == "cheaper-transforms":
        return ("Make the augmentations cheaper or batch them on the device",
                "replace the costliest transforms (torchvision.transforms.v2 on uint8 tensors, or batched GPU "
                "augmentation after the copy)",
                f"transform is {100 * f['share']:.0f}% of step time; costliest calls: "
                f"{', '.join(f['costliest_calls'])}")
    if rid == "pack-dataset":
        return ("Read fewer, larger files",
                "pack the dataset: `stallscope pack SRC OUT --format lmdb`, or cache it in RAM if it fits",
                f"workers spent {f['blocked_s']:.1f} s blocked (I/O or waits), {100 * f['share']:.0f}% of step "
                "time; predicted for a third of the blocking")
    if rid == "cheaper-collate":
        return ("Make batches cheaper to assemble",
                "return one stacked tensor per field instead of many small tensors; avoid per-sample Python objects",
                f"collate and loader overhead are {100 * f['share']:.0f}% of step time")
    if rid == "distributed-sampler":
        return ("Shard the input across ranks with DistributedSampler",
                "DataLoader(dataset, sampler=DistributedSampler(dataset), ...) and sampler.set_epoch(epoch) each "
                "epoch",
                f"every rank uses {', '.join(f['samplers'])}: each reads the whole dataset, {f['world_size']}x the "
                "input work for the same training")
    if rid == "uneven-shards":
        spread = ", ".join(f"rank {r} {v:.0f}" for r, v in f["batches_per_epoch"].items())
        return ("Give every rank the same number of batches per epoch",
                "DistributedSampler(dataset, drop_last=True)   (or wrap the loop in model.join() for uneven inputs)",
                f"batches per epoch differ ({spread}): ranks with fewer finish early and the others wait or hang "
                "in the all-reduce")
    if rid == "sampler-drop-last":
        return ("Drop the uneven tail instead of repeating samples", "DistributedSampler(dataset, drop_last=True)",
                f"{f['dataset_len']} samples do not split evenly over {f['world_size']} ranks: DistributedSampler "
                "pads the shards by repeating samples")
    if rid == "workers-per-node":
        return (f"Use at most {o['num_workers']} DataLoader workers per rank on {f['host']}",
                f"--set num_workers={o['num_workers']}",
                f"{f['ranks']} ranks x their workers ({f['workers']} in all) compete for {f['usable_cpus']} usable "
                "CPUs on one node")
    return rid, overrides(o) or "see the facts", _facts(f)


def recommendation(rec: Recommendation) -> Said:
    return Said(*_recommendation_words(rec))


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
        said = _recommendation_words(Recommendation(item.id, item.node, f.get("predicted_speedup"), facts=f))
        return Said(f"{said[0]} ({item.node})", "",
                    f"predicted at {f['predicted_speedup']:.2f}x, under the {f['min_gain']:.2f}x worth advising: "
                    "the rest of the job would still hold it back")
    return Said(item.id, "", f"{item.cause}: {_facts(f)}")


def _hotspot_place(h: dict[str, Any], stage: str) -> str:
    """``Text.__getitem__`` (train.py:31) is 60% of transform (in tokenizers encode)."""
    inside = f" (in {h['library']})" if h.get("library") else ""
    return (f"{h['function']} ({os.path.basename(h['file'])}:{h['line']}) is {100 * h['share_of_stage']:.0f}% of "
            f"{stage}{inside}")


def hotspot(h: Any) -> str:
    """One hotspot under its stage: ``train.py:31 Text.__getitem__  60% of transform (tokenizers encode)``."""
    inside = f" ({h.library})" if h.library else ""
    return f"{os.path.basename(h.file)}:{h.line} {h.function}  {100 * h.share_of_stage:.0f}% of {h.stage}{inside}"


# --- pitfalls ------------------------------------------------------------------------------------------------

def _shm_evidence(f: dict[str, Any]) -> str:
    """Where /dev/shm ran out, in torch's words, with its size and the batches in flight where known."""
    where = (f"worker {f['worker']} of loader {f['loader_id']}" if f.get("worker") is not None
             else "a DataLoader worker" if f.get("where") == "worker" else "the training process")
    parts = [f"{where}: {f['said']}"]
    if f.get("shm_size_bytes"):
        free = f" ({f['shm_free_bytes'] / MIB:.3g} MiB free)" if f.get("shm_free_bytes") is not None else ""
        parts.append(f"/dev/shm held {f['shm_size_bytes'] / MIB:.3g} MiB{free} when the run started")
    if f.get("in_flight_bytes"):
        parts.append(f"{f['workers']} workers x prefetch {f['prefetch_factor']} x {f['batch_bytes'] / MIB:.3g} MiB "
                     f"batches = {f['in_flight_bytes'] / MIB:.3g} MiB in flight")
    elif f.get("workers"):
        parts.append(f"{f['workers']} workers x prefetch {f['prefetch_factor']} batches in flight")
    return "; ".join(parts)


def _pitfall_words(pid: str, f: dict[str, Any]) -> tuple[str, str, str]:
    if pid == "worker-memory-growth":
        if f["memory"] == "private":
            rate = f", {f['growth_bytes_per_min'] / MIB:.0f} MiB/min" if f.get("growth_bytes_per_min") else ""
            what = (f"pid {f['pid']} from {f['start_bytes'] / MIB:.0f} to {f['end_bytes'] / MIB:.0f} MiB "
                    f"private{rate}")
        else:
            what = (f"pid {f['pid']} resident memory from {f['start_bytes'] / MIB:.0f} to "
                    f"{f['end_bytes'] / MIB:.0f} MiB")
        return ("DataLoader workers' memory keeps growing", f"{f['workers_grown']} worker(s) grew; worst: {what}",
                "a Python list/dict of per-sample objects in the dataset is copied page by page as workers read it "
                "(copy-on-read, pytorch issue 13246): store paths and labels in numpy arrays or a packed file; "
                "also check the dataset does not cache samples it loads")
    if pid == "shm-headroom":
        return ("/dev/shm is small for the batches in flight",
                f"loader {f['loader_id']}: {f['workers']} workers x prefetch {f['prefetch_factor']} x "
                f"{f['batch_bytes'] / MIB:.1f} MiB batches = {f['in_flight_bytes'] / MIB:.0f} MiB vs "
                f"{f['shm_free_bytes'] / MIB:.0f} MiB free",
                "enlarge /dev/shm (docker run --shm-size=8g), or lower prefetch_factor/num_workers, or send uint8")
    if pid == "shm-exhausted":
        return ("/dev/shm ran out: the batches in flight did not fit", _shm_evidence(f),
                "enlarge /dev/shm: docker run --shm-size=8g (or --ipc=host); Kubernetes: an emptyDir with medium: "
                "Memory mounted at /dev/shm; or keep fewer batches in flight (--set prefetch_factor=1, fewer "
                "workers with --set num_workers=N) or make them smaller (uint8 images instead of float32); "
                "sharing_strategy=file_system does not help, it allocates in /dev/shm too")
    if pid == "workers-above-cores":
        advised = f.get("advised_workers")  # the recommendation's count, where one sets it: one owner for the number
        return (f"{f['workers']} workers on {f['usable_cpus']} usable CPUs",
                f"workers waited for a CPU {100 * f['runqueue_fraction']:.0f}% of their busy time",
                f"use {advised} worker{'s' if advised != 1 else ''}, the count predicted fastest for this job on these "
                "CPUs (see the recommendations)" if advised is not None else
                f"use at most {f['usable_cpus']} workers for CPU-bound loading (more only when they block on I/O)")
    if pid == "thread-oversubscription":
        return ("Each worker runs several compute threads",
                f"loader {f['loader_id']}: up to {f['threads_per_worker']} threads per worker x {f['workers']} "
                f"workers on {f['usable_cpus']} CPUs ({f['thread_settings']})",
                "in worker_init_fn: torch.set_num_threads(1); cv2.setNumThreads(0); or OMP_NUM_THREADS=1")
    if pid == "unpinnable-batch":
        return ("pin_memory cannot pin this batch type",
                f"loader {f['loader_id']} yields {', '.join(f['types'])} without a pin_memory() method: its "
                f"{f['tensors']} tensors stay in pageable memory",
                "give the batch class a pin_memory(self) method returning a copy with pinned tensors, or return a "
                "dict/tuple of tensors")
    if pid == "cuda-in-forked-worker":
        return ("CUDA used inside a forked DataLoader worker", f"{f['type']}: {f['message']}",
                "keep datasets on the CPU (move batches to the GPU in the training loop), or use "
                "multiprocessing_context='spawn'")
    if pid == "lmdb-before-fork":
        return ("LMDB environment opened before the workers forked",
                f"{f['path']} was opened in the main process and never reopened in a worker",
                "open the environment lazily in __getitem__ (once per worker process), not in __init__")
    if pid == "slow-worker":
        return ("Batches wait in order behind one slow worker",
                f"worker {f['worker']}'s median batch takes {f['slowest_batch_ns'] / 1e6:.0f} ms vs "
                f"{f['fastest_batch_ns'] / 1e6:.0f} ms for the fastest; no batch was ready on "
                f"{100 * f['empty_queue_fraction']:.0f}% of requests",
                "balance per-sample cost (sort or bucket by size), or DataLoader(in_order=False) if order does not "
                "matter")
    how = f.get("how") or ""
    if pid == "loader-stalled" and f.get("dead_workers") and how not in ("exit", "os._exit", "KeyboardInterrupt") \
            and not how.startswith("SIG"):  # an interrupt or a kill ends the workers too: the hang came first
        respawned = f.get("start_method") in ("spawn", "forkserver")
        return ("The DataLoader's workers died", _stall_evidence(f),
                "the workers' own error is in the script's output, above this summary"
                + ("; under spawn and forkserver each worker imports the script again, so a script that trains at "
                   "module level needs its training under if __name__ == \"__main__\":" if respawned else
                   "; a worker killed without an error was often out of memory (dmesg says so)"))
    if pid == "loader-stalled":
        return ("The DataLoader stopped delivering batches", _stall_evidence(f),
                "find where the workers block: py-spy dump --pid WORKER_PID shows each one's stack (a lock taken "
                "before fork, a read that never returns, a queue nobody fills)"
                + ("" if f.get("timeout") else "; DataLoader(timeout=SECONDS) turns a silent hang into an error"))
    return pid, _facts(f), ""


def _stall_evidence(f: dict[str, Any]) -> str:
    ended = {"exit": "when the script ended", "os._exit": "when the script called os._exit"}.get(
        f["how"], f"until {f['how']} ended it")
    if f.get("message") and "timed out" in f["message"]:
        ended = f"until the DataLoader timeout fired ({f['message']})"
    which = {"train": "the training loader", "eval": "the evaluation loader"}.get(
        f["role"], f"the DataLoader built at {f['site']}" if f.get("site") else "a DataLoader")
    before = (f"after {f['batches_before']} batch(es) of that epoch" if f["batches_before"]
              else "before the epoch's first batch")
    text = f"{which} waited {f['seconds']:.1f} s for its next batch {ended}, {before}"
    if f.get("awaited_worker") is not None:
        text += f"; it waited for worker {f['awaited_worker']}"
    if f.get("pending_workers"):
        text += f"; {_workers(f['pending_workers'])} had not returned their batches"
    if f.get("dead_workers"):
        text += f"; {_workers(f['dead_workers'])} {'was' if len(f['dead_workers']) == 1 else 'were'} no longer alive"
    return text


def _workers(ids: list[int]) -> str:
    return f"worker{'s' if len(ids) != 1 else ''} {', '.join(map(str, ids))}"


def pitfall(p: Any) -> PitfallSaid:
    return PitfallSaid(*_pitfall_words(p.id, p.facts))


# --- the diagnosis -------------------------------------------------------------------------------------------

def beside_compute(analysis: Analysis) -> str:
    """Where an input stage limits a run whose compute takes more of the step: why a smaller share is named
    (the training waits for that stage; the compute is not what a change to the input would shorten)."""
    total = sum(analysis.node_seconds.values())
    compute = analysis.node_seconds.get("compute", 0.0) / total if total > 0 else 0.0
    if analysis.bottleneck_node in (None, "compute") or compute <= analysis.bottleneck_share:
        return ""
    return (f"; the input stage the training waits for most, beside {100 * compute:.0f}% of computing, "
            "which no input change shortens")


def evidence(analysis: Analysis) -> list[str]:
    """The numbers behind the verdict and the limiting stage, one line each."""
    lines = _rank_evidence(analysis)
    stats = analysis.steps
    if stats.steady:
        lines.append(
            f"data wait is {100 * stats.data_wait_fraction:.1f}% of step time over {len(stats.steady)} steps "
            f"(median step {1000 * (stats.median_step_s or 0):.1f} ms, median wait "
            f"{1000 * (stats.median_wait_s or 0):.1f} ms)"
            + (f", including {stats.stalled_s:.1f} s blocked in a next() that never returned a batch"
               if stats.stalled_s > 0 else ""))
    seconds = analysis.node_seconds
    node = analysis.bottleneck_node
    total = sum(seconds.values())
    if node and total > 0:
        lines.append(f"{node} accounts for {100 * seconds[node] / total:.0f}% of step time "
                     f"({seconds[node]:.2f} s of {total:.2f} s)")
    train = analysis.train_loader
    pipeline = train.pipeline if train else None
    cpus = analysis.usable_cpus
    if analysis.other_cpus >= OTHER_LOAD_NOTABLE_CPUS:
        left = max(1.0, cpus - analysis.other_cpus)
        lines.append(f"other programs kept {analysis.other_cpus:.1f} of the {cpus} CPUs busy during these steps: "
                     f"this job had about {left:.1f} for itself, and its figures and advice are for a machine that "
                     "busy (compare it with runs made under the same load, or rerun on a quiet machine)")
    if pipeline is not None and pipeline.busy_s > 0:
        # of step time, each with its stage, as the stages are: a call never shows more than its stage
        top = ", ".join(f"{name} {100 * s / total:.0f}% ({stage})"
                        for name, stage, s in calls_in_step_time(pipeline, seconds)[:3]) if total > 0 else ""
        lines.append(f"loader work per batch: {1000 * (pipeline.batch_wall_median_s or 0):.1f} ms wall, "
                     f"{1000 * (pipeline.batch_cpu_median_s or 0):.1f} ms CPU; costliest calls"
                     + (f" (share of step time): {top}" if top else ": none"))
        if pipeline.num_workers > 0:
            busy = f", busy {100 * pipeline.busy_fraction:.0f}% of their time" if pipeline.busy_fraction else ""
            plural = "s" if pipeline.num_workers != 1 else ""
            lines.append(f"{pipeline.num_workers} worker{plural} on {cpus} usable CPUs{busy}")
            if pipeline.empty_queue_fraction is not None:
                lines.append(f"no batch was ready on {100 * pipeline.empty_queue_fraction:.0f}% of requests "
                             f"(mean {pipeline.queue_depth_mean:.1f} batches queued)")
        else:
            lines.append(f"num_workers=0: batches are loaded in the training process, nothing overlaps "
                         f"({cpus} usable CPUs)")
        if pipeline.blocked_s > 0.2 * pipeline.busy_s:
            lines.append(f"workers were blocked (I/O, sleeps, network) "
                         f"{100 * pipeline.blocked_s / pipeline.busy_s:.0f}% of their busy time")
    return lines


def _rank_evidence(analysis: Analysis) -> list[str]:
    findings = analysis.distributed
    summaries = analysis.ranks
    if findings is None:
        return []
    lines: list[str] = []
    by_rank = {s.rank: s for s in summaries}
    if findings.straggler_rank is not None:
        s = by_rank[findings.straggler_rank]
        others = [o for o in summaries if o.rank != s.rank]
        waits = ", ".join(f"rank {o.rank} {100 * o.sync_fraction:.0f}%" for o in others[:6])
        lines.append(f"rank {s.rank} is the straggler: {1000 * findings.straggler_extra_s:.1f} ms more of its own "
                     f"work per step than the fastest rank; its limiting stage is {findings.straggler_stage} "
                     f"(data wait {100 * s.data_wait_fraction:.0f}% of its step time)")
        collective = "all-reduce" if findings.straggler_stage else "collectives"
        lines.append(f"rank {s.rank}'s {findings.straggler_stage} stalls all ranks in {collective}: "
                     f"time waiting for the others is {waits} of step time")
    elif len(summaries) > 1:
        lines.append(f"no straggler across {len(summaries)} ranks: per-step skew median "
                     f"{1000 * (findings.skew_median_s or 0):.1f} ms")
    return lines


NO_SAMPLES = "no system samples in this session"

CONDITIONS = {
    "recorder-not-started": "the recorder started in no process of the command: it starts through the "
                            "sitecustomize that stallscope puts on PYTHONPATH, which python -I, -E and -S ignore, "
                            "as do Pythons older than 3.10 and those of another version without stallscope installed",
    "stopped-while-starting": "nothing was measured: the signal (see the note) reached the script while Python was "
                              "starting, before the recorder started in it",
    "events-lost": "nothing was measured: the run's folder, and the events recorded in it, were removed while "
                   "the job ran (see the note)",
    "no-dataloader": "no torch DataLoader was created: stallscope measures DataLoader-fed training",
    "no-training-step": "no training step was recorded: none completed, or the script was killed before the "
                        "recorder wrote its last records (it writes them every second or so)",
    "few-steps": f"fewer than {FEW_STEADY_STEPS} steady steps were measured (after the warm-up and the workers' first "
                 "round): too few for the figures and the predictions to act on; record a run of more steps (more "
                 "data or epochs, or a larger --steps where one was given)",
}


#: How much of a process's command line is said (a launcher's child can carry a long list of options).
COMMAND_CHARS = 80


def _process_command(argv: list[str]) -> str:
    said = "python " + shlex.join(argv) if argv else "command not recorded"
    return said if len(said) <= COMMAND_CHARS else said[:COMMAND_CHARS - 3] + "..."


def training_process(tp: Any) -> list[str]:
    """Which process trained, where it is not the launched script itself, and the other processes that trained
    (``analysis.training_process.TrainingProcess``); nothing where the script trained alone."""
    if tp is None:
        return []
    lines = []
    if not tp.launched:
        started = ("which the script started" if tp.depth == 1 else
                   f"started by the script through {tp.depth - 1} process{'es' if tp.depth > 2 else ''} between"
                   if tp.depth else "started by the script")
        lines.append(f"training ran in process {tp.pid} ({_process_command(tp.argv)}), {started}: these figures "
                     "are that process's")
    for other in tp.others:
        done = f"{other.steps} steps" if other.steps else f"{other.batches} batches"
        who = "the script's own process" if other.pid == tp.launched_pid else "process"
        lines.append(f"{who} {other.pid} ({_process_command(other.argv)}) also trained ({done}): not in these "
                     f"figures, which are of process {tp.pid} ({tp.steps or tp.batches} "
                     f"{'steps' if tp.steps else 'batches'})")
    return lines


def notes(analysis: Analysis) -> list[str]:
    """The session's own notes, then what limited the analysis."""
    return list(analysis.notes) + [CONDITIONS.get(c, c) for c in analysis.conditions]


def gpu_timing(g: Any) -> str:
    """The CUDA-event timings in one sentence."""
    parts = []
    if g.steps:
        parts.append(f"GPU (CUDA events, {g.steps} steps): busy {g.busy_ms_median:.1f} ms per step, idle "
                     f"{g.idle_ms_median:.1f} ms between steps ({100 * g.idle_fraction:.0f}% of its timeline idle)")
    if g.h2d_copies:
        rate = f" at {g.h2d_gb_per_s:.1f} GB/s" if g.h2d_gb_per_s else ""
        parts.append(f"host-to-device: {g.h2d_copies} copies, {g.h2d_bytes / 1e6:.1f} MB in {g.h2d_ms:.1f} ms{rate}")
    return "; ".join(parts)


def rate(analysis: Analysis) -> str:
    """The steady throughput: steps/s, and samples/s where batches have a size."""
    text = f"{analysis.steps_per_s:.2f} steps/s"
    if analysis.samples_per_s is not None:
        text += f", {analysis.samples_per_s:.1f} samples/s"
    return text


def overrides(values: dict[str, Any]) -> str:
    """Overrides as the ``--set`` arguments that give them."""
    return " ".join(f"--set {k}={format_value(v)}" for k, v in values.items())


def _facts(facts: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in facts.items())


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


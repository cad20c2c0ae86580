"""Findings inside compute: what the training step itself spends, where, and the change to make.

From the step split (``step_parts.py``), the lines sampled in the training process's main thread (stage
``compute`` hotspots, each with the part it was in) and the facts recorded once (``recorder/model_facts.py``):

- ``python-in-step``: a line of the user's own Python (no library call under it) holds a large share of the step;
  removing it gains at most its share (the ceiling is the prediction);
- ``optimizer-foreach``: the optimizer is a large share of the step and updates many tensors one by one (neither
  ``foreach`` nor ``fused``); the gain is bounded by the optimizer's share;
- ``ddp-find-unused``: DDP searches the graph for unused parameters every step and found none; the search's own
  time per step is the predicted gain;
- ``thread-in-step``: while the step computed, its main thread was blocked (off CPU, not waiting for a core) and
  another Python thread of the process ran: the interpreter lock it holds is what the step waits for. The lesser of
  the two is the time lost; the prediction is a floor (a thread holding the lock also delays every operator's return
  by up to the switch interval, which one run cannot price);
- ``host-bound``: on a GPU, the device computed (its kernels' time in the profiler window) under half of the
  step's compute: the host sets the pace, launching kernels one by one from Python. The ceiling is the step with
  compute cut to the device's busy time;
- ``device-sync``: on a GPU, the host waited for the device inside the step (the profiler window's synchronizing
  CUDA calls, each with the operator that made it: ``.item()``, ``.cpu()``, ``nonzero``,
  ``torch.cuda.synchronize()``); without them the host runs ahead of the device, and the step is predicted at the
  longer of the host's own time (the step less the waits) and the device's busy time with the data wait;
- ``allocator``: on a GPU, the caching allocator retried after a failed cudaMalloc (it freed its cache and
  allocated again), or the window's steps called cudaMalloc/cudaFree for a measurable share of the step, or it
  reserved far more than it ever allocated (fragmentation); the change is its expandable segments. Priced (a
  ceiling) only where the window timed the device allocations;
- ``ddp-compress``: on GPUs, DDP waits for its float32 gradients' all-reduce over a link the wait shows to be slow,
  without a communication hook: bfloat16 compression halves the bytes; half the wait is the predicted floor;
- ``mixed-precision``, ``tf32``, ``cudnn-benchmark``, ``channels-last``: on a CUDA device, numerics left at their
  slowest (facts from the run: the model's dtype, autocast, the flags); their gain cannot be predicted from one run,
  and they change what is computed, so they are said as facts with the change, without a figure.
"""

from __future__ import annotations

import math
from typing import Any

from stallscope.analysis.findings import Recommendation, StepStats
from stallscope.analysis.fixes import advise
from stallscope.analysis.operators import Operators, operators
from stallscope.analysis.pipeline import interpreter_wait_ns
from stallscope.constants import is_user_file
from stallscope.session import Session

#: A line of the step's own Python is a finding from this share of step time on.
LINE_SHARE = 0.10
#: The optimizer is a finding from this share of step time on, when it walks this many tensors one by one.
OPTIMIZER_SHARE = 0.15
OPTIMIZER_TENSORS = 32
#: DDP's graph search is a finding from this share of step time on.
DDP_SEARCH_SHARE = 0.005
#: Another thread's hold on the step is a finding from this share of step time on.
THREAD_SHARE = 0.08
#: DDP's wait for its gradient all-reduce after backward, as a share of step time, from which its buckets are looked
#: at: gradients that fill at most ``FEW_BUCKETS`` buckets are reduced after the backward rather than beside it.
DDP_WAIT_SHARE = 0.10
FEW_BUCKETS = 2
#: An all-reduce no faster than this (bytes a second, the most the measured wait allows) runs over a slow link (PCIe
#: between GPUs, a network between nodes; NVLink moves several times more): there compressing the gradients to 16
#: bits halves the bytes.
SLOW_LINK_BYTES_PER_S = 25e9
#: Buckets the advised ``bucket_cap_mb`` cuts the gradients into.
ADVISED_BUCKETS = 4
#: On a GPU, the device busy under this share of the step's compute is a host-bound step.
HOST_BOUND_DEVICE_SHARE = 0.5
#: The host's waits for the device are a finding from this share of step time on.
SYNC_SHARE = 0.05
#: The allocator's device calls are a finding from this share of step time on.
ALLOC_SHARE = 0.02
#: Reserved over allocated at their peaks from which, with at least ``FRAGMENTED_BYTES`` between them, the cache is
#: taken as fragmented.
FRAGMENTED_RATIO = 1.5
FRAGMENTED_BYTES = 1 << 30
#: Compute capability from which a CUDA device has bf16 Tensor Cores and TF32 (Ampere).
AMPERE = (8, 0)


def compute_findings(session: Session, stats: StepStats, seconds: dict[str, float],
                     spots: list[Any]) -> list[Recommendation]:
    """The compute findings of the training process, costliest first; ``seconds``: step time per stage."""
    step = sum(seconds.values())
    if step <= 0 or not stats.steady:
        return []
    found: list[Recommendation] = []
    found += _python_lines(spots)
    facts = [f for f in session.compute_facts if f.get("pid") == session.main_pid]
    parts = stats.parts_s or {}
    found += _optimizer(facts, parts.get("optimizer", 0.0) / step)
    found += _ddp_search(facts, step / len(stats.steady))
    steps = len(stats.steady)
    found += _ddp_buckets(facts, stats.sync_s / steps, parts.get("backward", 0.0) / steps, step / steps)
    found += _ddp_compress(facts, stats.sync_s / steps, step / steps, _world_size(session))
    found += thread_finding(session, stats)
    ops = operators(session)
    found += _device(ops, stats.compute_s / len(stats.steady), step / len(stats.steady), spots)
    found += _allocator(facts, ops, step / len(stats.steady))
    found += _numerics(facts)
    return sorted(found, key=lambda r: -(r.predicted_speedup or 1.0))


def _python_lines(spots: list[Any]) -> list[Recommendation]:
    """The step's own Python lines (compute hotspots with no library call under them) above ``LINE_SHARE``."""
    found = []
    for spot in spots:
        if spot.stage != "compute" or spot.library is not None or spot.share_of_step < LINE_SHARE:
            continue
        if not is_user_file(spot.file):  # a library's own frame (torch's backward engine call): not the user's Python
            continue
        found.append(advise("python-in-step", round(1 / (1 - min(spot.share_of_step, 0.95)), 2), facts={
            "part": spot.part, "share_of_step": round(spot.share_of_step, 4), "ceiling": True,
            "file": spot.file, "line": spot.line, "function": spot.function}))
    return found[:2]




def _optimizer(facts: list[dict[str, Any]], share: float) -> list[Recommendation]:
    if share < OPTIMIZER_SHARE:
        return []
    for f in facts:
        if f["kind"] != "optimizer" or f.get("foreach") or f.get("fused"):
            continue
        if (f.get("tensors_with_grad") or f.get("tensors") or 0) >= OPTIMIZER_TENSORS:
            return [advise("optimizer-foreach", round(1 / (1 - min(share, 0.95)), 2), facts={
                "optimizer": f.get("optimizer_kind"), "tensors": f.get("tensors"), "numel": f.get("numel"),
                "share_of_step": round(share, 4), "ceiling": True, "device": f.get("device")})]
    return []


def _device(ops: Operators | None, compute: float, step_s: float, spots: list[Any]) -> list[Recommendation]:
    """From the profiler window on a GPU: the device's busy time against the step's ``compute`` (seconds per step),
    and the host's waits for it."""
    if ops is None or ops.self_device_s <= 0 or not ops.steps or step_s <= 0:
        return []
    found = []
    busy = ops.self_device_s / ops.steps
    if compute > 0 and busy < HOST_BOUND_DEVICE_SHARE * compute:
        found.append(advise("host-bound", round(step_s / max(step_s - (compute - busy), 1e-9), 2), facts={
            "device_ms_per_step": round(1e3 * busy, 3), "compute_ms_per_step": round(1e3 * compute, 3),
            "step_ms": round(1e3 * step_s, 3), "device_share_of_compute": round(busy / compute, 4),
            "ceiling": True}))
    waited = sum(op.self_cpu_s for op in ops.waits) / ops.steps
    after = max(step_s - waited, busy + (step_s - compute))  # without the waits the host runs ahead of the device
    if ops.waits and waited >= SYNC_SHARE * step_s and after < step_s:  # a device busier than that gains nothing
        top = ops.waits[0]
        line = next((h for h in spots if h.stage == "compute" and getattr(h, "part", None) == top.part), None)
        site = ops.sync_sites[0] if ops.sync_sites else None  # the line that read back, timed in the window
        found.append(advise("device-sync", round(step_s / max(after, 1e-9), 2), facts={
            "call": top.name, "part": top.part, "calls_per_step": round(top.calls / ops.steps, 2),
            "wait_ms_per_step": round(1e3 * waited, 3), "step_ms": round(1e3 * step_s, 3),
            "share_of_step": round(waited / step_s, 4), "device_ms_per_step": round(1e3 * busy, 3),
            **({"file": site.file, "line": site.line, "function": site.function, "sync_call": site.call,
                "site_ms_per_step": round(1e3 * site.seconds / ops.steps, 3), "placed": "timed"} if site else
               {"file": line.file, "line": line.line, "function": line.function, "placed": "part"} if line else {})}))
    return found


def _allocator(facts: list[dict[str, Any]], ops: Operators | None, step_s: float) -> list[Recommendation]:
    counters = [f for f in facts if f["kind"] == "allocator"]
    if not counters or "expandable_segments:True" in (counters[-1].get("alloc_conf") or "") or step_s <= 0:
        return []
    last = counters[-1]
    malloc = ops.device_alloc_s / ops.steps if ops is not None and ops.steps else 0.0
    reserved, allocated = last.get("reserved_peak", 0), last.get("allocated_peak", 0)
    fragmented = reserved >= FRAGMENTED_RATIO * allocated and reserved - allocated >= FRAGMENTED_BYTES
    if not (last.get("retries") or malloc >= ALLOC_SHARE * step_s or fragmented):
        return []
    gain = round(step_s / (step_s - malloc), 2) if malloc >= ALLOC_SHARE * step_s else None
    return [advise("allocator", gain, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, facts={
        "retries": last.get("retries", 0), "reserved_peak_gib": round(reserved / 2**30, 2),
        "allocated_peak_gib": round(allocated / 2**30, 2), "device_allocs": last.get("device_allocs", 0),
        "malloc_ms_per_step": round(1e3 * malloc, 3), "step_ms": round(1e3 * step_s, 3),
        "fragmented": fragmented, **({"ceiling": True} if gain else {})})]


def thread_finding(session: Session, stats: StepStats) -> list[Recommendation]:
    """Another Python thread of the training process holding the interpreter lock: the share of step time the
    main thread waited for it, while it computed (blocked while the threads ran, over the compute intervals they
    were watched in) and while it loaded a batch itself (``num_workers=0``: the batch's wait for the lock,
    ``FetchRecord.threads_cpu_ns``). Whatever the verdict: the batches and the step wait alike."""
    if stats.wall_s <= 0 or not stats.steady:
        return []
    facts = [f for f in session.compute_facts if f.get("pid") == session.main_pid]
    return _threads(facts, (stats.compute_s + stats.transfer_s) / stats.wall_s, _loading_share(session, stats))


def _threads(facts: list[dict[str, Any]], computing: float, loading: float = 0.0) -> list[Recommendation]:
    """``computing``: the share of step time the main thread computed (the intervals the threads were watched in);
    ``loading``: the share it waited for the lock while loading batches itself."""
    totals = [f for f in facts if f["kind"] == "threads"]
    if not totals or not totals[-1].get("threads") or totals[-1]["wall_ns"] <= 0:
        return []
    last = totals[-1]
    wall = last["wall_ns"]
    blocked = max(0, wall - last["cpu_ns"] - last["run_queue_ns"])
    others = sum(t["cpu_ns"] for t in last["threads"])
    share = min(blocked, others) / wall * computing + loading
    if share < THREAD_SHARE:
        return []
    thread = last["threads"][0]  # the one that ran most
    line = next(iter(thread["lines"]), None)
    return [advise("thread-in-step", round(1 / (1 - min(share, 0.95)), 2), facts={
        "thread": thread["name"], "target": thread["target"], "share_of_step": round(share, 4), "floor": True,
        "blocked_share": round(blocked / wall, 4), "thread_cpu_share": round(thread["cpu_ns"] / wall, 4),
        "threads": len(last["threads"]),
        **({"file": line[0], "line": line[1], "function": line[2]} if line else {})})]


def _world_size(session: Session) -> int:
    return max((int(r.world_size or 1) for r in session.ranks), default=1)


def _ddp_compress(facts: list[dict[str, Any]], wait_s: float, step_s: float, world: int) -> list[Recommendation]:
    """DDP waits for its float32 gradients' all-reduce for ``DDP_WAIT_SHARE`` of the step or more, without a
    communication hook, over a link the wait shows to be slow: a ring all-reduce moves 2(n-1)/n of the gradients'
    bytes, in no less than the wait, so bytes over wait bound the link's speed from above. Compressed to bfloat16
    the bytes halve; the prediction is a floor: half the wait saved (more where the all-reduce also overlaps the
    backward). CUDA only: on CPUs (gloo) the casts and copies take the cores the all-reduce runs on (measured no
    gain on 2 cores)."""
    if step_s <= 0 or wait_s < DDP_WAIT_SHARE * step_s or world < 2:
        return []
    for f in facts:
        size = f.get("parameter_bytes") or 0
        if f["kind"] != "ddp" or f.get("device") != "cuda" or f.get("comm_hook") or size <= 0:
            continue
        if f.get("gradient_dtype") not in (None, "float32"):
            continue
        moved = 2 * (world - 1) / world * size
        bound = moved / wait_s
        if bound >= SLOW_LINK_BYTES_PER_S:
            continue
        return [advise("ddp-compress", round(step_s / max(step_s - wait_s / 2, 1e-9), 2), facts={
            "gradient_mb": round(size / 2**20, 2), "world_size": world, "wait_ms": round(1e3 * wait_s, 3),
            "step_ms": round(1e3 * step_s, 3), "link_gb_per_s_at_most": round(bound / 1e9, 2), "floor": True})]
    return []


def _loading_share(session: Session, stats: StepStats) -> float:
    """The share of step time the training process's own batch loading waited for the interpreter lock."""
    t0, t1 = stats.steady[0].start_ns, stats.steady[-1].end_ns
    waited = sum(interpreter_wait_ns(f) for f in session.fetches if f.pid == session.main_pid and t0 <= f.start_ns < t1)
    return waited / 1e9 / stats.wall_s


def _ddp_search(facts: list[dict[str, Any]], step_s: float) -> list[Recommendation]:
    for f in facts:
        if f["kind"] != "ddp" or not f.get("find_unused_parameters") or f.get("unused_parameter_size"):
            continue
        calls = f.get("post_forward_calls") or 0
        per_step = f.get("post_forward_ns", 0) / 1e9 / calls if calls else 0.0
        if per_step <= 0 or per_step / step_s < DDP_SEARCH_SHARE:
            continue
        return [advise("ddp-find-unused", round(step_s / max(step_s - per_step, 1e-9), 2), facts={
            "search_ms": round(1e3 * per_step, 3), "step_ms": round(1e3 * step_s, 3),
            "unused_parameter_size": f.get("unused_parameter_size")})]
    return []


def _ddp_buckets(facts: list[dict[str, Any]], wait_s: float, backward_s: float,
                 step_s: float) -> list[Recommendation]:
    """DDP waits for its all-reduce after the backward (``wait_s`` a step), and its gradients fill no more than
    ``FEW_BUCKETS`` buckets: the reduction cannot start until the backward is (nearly) over. Smaller buckets start
    it beside the backward. Its gain is a ceiling: the wait hidden behind the whole backward. Called for the job's
    primary rank, which is not waiting for a straggler (a straggler's wait is its own advice's)."""
    if step_s <= 0 or wait_s < DDP_WAIT_SHARE * step_s or backward_s <= 0:
        return []
    for f in facts:
        cap, size = f.get("bucket_cap_bytes") or 0, f.get("parameter_bytes") or 0
        if f["kind"] != "ddp" or cap <= 0 or size <= 0 or size > FEW_BUCKETS * cap or f.get("device") != "cuda":
            continue  # on CPUs the all-reduce (gloo) takes the backward's own cores: smaller buckets measured no gain
        advised = max(1, math.ceil(size / ADVISED_BUCKETS / 2**20))
        if advised * 2**20 >= cap:
            continue
        hidden = min(wait_s, backward_s)
        return [advise("ddp-buckets", round(step_s / max(step_s - hidden, 1e-9), 2), facts={
            "bucket_cap_mb": round(cap / 2**20, 2), "gradient_mb": round(size / 2**20, 2), "advised_mb": advised,
            "wait_ms": round(1e3 * wait_s, 3), "backward_ms": round(1e3 * backward_s, 3),
            "step_ms": round(1e3 * step_s, 3), "ceiling": True})]
    return []


def _numerics(facts: list[dict[str, Any]]) -> list[Recommendation]:
    """CUDA numerics left at their slowest, as facts of the run (no predicted gain)."""
    found = []
    for f in facts:
        if f["kind"] != "model" or f.get("device") != "cuda" or not f.get("grad_enabled", True):
            continue
        capability = tuple(int(x) for x in str(f.get("capability") or "0.0").split(".")[:2])
        fp32 = f.get("param_dtype") == "float32"
        if fp32 and not f.get("autocast"):  # bfloat16 (Ampere on) needs no GradScaler: --set can apply it
            found.append(advise("mixed-precision", None, {"autocast": "bfloat16"} if capability >= AMPERE else {},
                                facts={
                "module": f.get("module"), "param_dtype": f.get("param_dtype"), "capability": f.get("capability"),
                "dtype": "bfloat16" if capability >= AMPERE else "float16"}))
        if fp32 and not f.get("autocast") and capability >= AMPERE and f.get("matmul_precision") == "highest" \
                and not f.get("cuda_matmul_tf32"):
            found.append(advise("tf32", None, {"matmul_precision": "high"},
                                facts={"matmul_precision": f.get("matmul_precision"),
                                       "capability": f.get("capability")}))
        if f.get("convolutions") and not f.get("cudnn_benchmark"):
            found.append(advise("cudnn-benchmark", None, {"cudnn_benchmark": True},
                                facts={"convolutions": f.get("convolutions"), "input_shape": f.get("input_shape")}))
        if f.get("convolutions") and f.get("input_channels_last") is False:
            found.append(advise("channels-last", None, {"channels_last": True},
                                facts={"convolutions": f.get("convolutions"), "input_shape": f.get("input_shape")}))
        break  # the first model's: a GAN's second model runs with the same flags
    return found

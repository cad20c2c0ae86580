"""The compute findings in words (``analysis/compute_findings.py``): one function per id, merged into
``recommendations._SAYS``. Each says the change in plain PyTorch; where it is code, at the user's line."""

from __future__ import annotations

import os
from typing import Any

from stallscope.render.words.phrases import PART_LABELS, overrides
from stallscope.settings import in_code

_PART_CHANGE = {
    "forward": "vectorize it (one tensor operation over the batch instead of a Python loop), or torch.compile the "
               "model",
    "backward": "replace it with tensor operations, or a custom autograd.Function with a vectorized backward",
    "optimizer": "vectorize it, or use a foreach/fused optimizer",
    "step_code": "take it off the step: compute it every N steps, or keep it on the device as tensors "
                 "(no .item()/.tolist() per step) and read it once per log interval",
}


def _where(f: dict[str, Any]) -> str:
    return f"{os.path.basename(f['file'])}:{f['line']} {f['function']}"


def _python_in_step(rec: Any, f: dict[str, Any], o: dict[str, Any]) -> tuple[str, str, str]:
    part = f.get("part") or "step_code"
    return (f"Take the Python work out of the step's {PART_LABELS.get(part, part)}",
            f"at {_where(f)} ({f['file']}): {_PART_CHANGE.get(part, _PART_CHANGE['step_code'])}",
            f"that line's own Python (no library call under it) is {100 * f['share_of_step']:.0f}% of step time, in "
            f"{PART_LABELS.get(part, part)}; the prediction is its ceiling: the step without that line")


def _optimizer_foreach(rec: Any, f: dict[str, Any], o: dict[str, Any]) -> tuple[str, str, str]:
    fused = "fused=True (or foreach=True)" if f.get("device") in ("cuda", "cpu") else "foreach=True"
    return ("Update the parameters in one kernel per group, not one per tensor",
            f"torch.optim.{f.get('optimizer') or 'Optimizer'}(..., {fused}); in the Hugging Face Trainer "
            "optim=\"adamw_torch_fused\"; in Lightning, in configure_optimizers",
            f"the optimizer is {100 * f['share_of_step']:.0f}% of step time and updates {f.get('tensors')} tensors "
            f"({f.get('numel'):,} values) one by one (neither foreach nor fused); the prediction is its ceiling: the "
            "step without the optimizer's time")


def _ddp_find_unused(rec: Any, f: dict[str, Any], o: dict[str, Any]) -> tuple[str, str, str]:
    return ("Stop DDP's search for unused parameters",
            "DistributedDataParallel(model, find_unused_parameters=False) (or static_graph=True where the graph "
            "never changes); in the Hugging Face Trainer ddp_find_unused_parameters=False; in Lightning "
            "strategy=\"ddp\" rather than \"ddp_find_unused_parameters_true\"",
            f"find_unused_parameters=True searched the autograd graph after every forward, "
            f"{f['search_ms']:.2f} ms of a {f['step_ms']:.1f} ms step, and found no unused parameter")


def _ddp_buckets(rec: Any, f: dict[str, Any], o: dict[str, Any]) -> tuple[str, str, str]:
    mb = f["advised_mb"]
    return ("Cut DDP's gradients into smaller buckets, so their all-reduce runs beside the backward",
            f"DistributedDataParallel(model, bucket_cap_mb={mb}); in the Hugging Face Trainer ddp_bucket_cap_mb={mb}; "
            f"in Lightning strategy=DDPStrategy(bucket_cap_mb={mb})",
            f"the {f['gradient_mb']:.1f} MB of gradients fill no more than two of DDP's {f['bucket_cap_mb']:.0f} MB "
            f"buckets, so their all-reduce waits for the backward: each step then waits {f['wait_ms']:.1f} ms for "
            f"it, after a {f['backward_ms']:.1f} ms backward; the prediction is its ceiling, that wait hidden behind "
            "the whole backward")


def _ddp_compress(rec: Any, f: dict[str, Any], o: dict[str, Any]) -> tuple[str, str, str]:
    return ("Compress DDP's gradients to 16 bits for their all-reduce",
            "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks; "
            "model.register_comm_hook(None, default_hooks.bf16_compress_hook) after wrapping the model in "
            "DistributedDataParallel (fp16_compress_hook before NCCL 2.10); in Lightning "
            "DDPStrategy(ddp_comm_hook=default_hooks.bf16_compress_hook); in the Hugging Face Trainer the same call on "
            "the wrapped model",
            f"each step waits {f['wait_ms']:.1f} ms of {f['step_ms']:.1f} for the all-reduce of {f['gradient_mb']:.1f} "
            f"MB of float32 gradients over {f['world_size']} ranks: at most {f['link_gb_per_s_at_most']:.1f} GB/s, "
            "a link (PCIe, a network) where halving the bytes halves the time; the prediction is a floor (half the "
            "wait); it changes the gradients' precision in transit: check the model's accuracy")


def _thread_in_step(rec: Any, f: dict[str, Any], o: dict[str, Any]) -> tuple[str, str, str]:
    where = f" (it runs at {_where(f)}, {f['file']})" if f.get("file") else ""
    return (f"Take thread '{f['thread']}' off the training process",
            f"run {f['target']}{where} in a separate process (multiprocessing.Process, a subprocess), or give it less "
            "to do per call and call it less often; a logger: log every N steps, hand it tensors already on the "
            "host",
            f"the step's main thread was blocked {100 * f['blocked_share']:.0f}% of its compute time (off CPU, not "
            f"waiting for a core) while thread '{f['thread']}' ran for {100 * f['thread_cpu_share']:.0f}% of it: a "
            "Python thread holds the interpreter lock the step needs between its operators; the prediction is a "
            "floor: the step also waits for the lock after every operator, which one run cannot price")


#: What a synchronizing call's operator is, in the user's words.
_SYNC_SOURCES = {
    "aten::_local_scalar_dense": ".item() (or .tolist(), float(t), a device tensor in an if or a print)",
    "aten::nonzero": "nonzero(), or indexing with a boolean mask",
    "aten::copy_": ".cpu(), .to(\"cpu\"), .numpy() or .tolist()",
    "aten::_to_copy": ".cpu(), .to(\"cpu\"), .numpy() or .tolist()",
    "aten::to": ".cpu(), .to(\"cpu\"), .numpy() or .tolist()",
}


def _host_bound(rec: Any, f: dict[str, Any], o: dict[str, Any]) -> tuple[str, str, str]:
    return ("Give the device more work per launch",
            "a larger batch (scale the learning rate with it); torch.compile(model) to fuse the small kernels, with "
            "mode=\"reduce-overhead\" to replay them as CUDA graphs; fewer, larger tensors in the step's own code",
            f"the device computed {f['device_ms_per_step']:.2f} ms of each step's {f['compute_ms_per_step']:.2f} ms "
            f"of compute ({100 * f['device_share_of_compute']:.0f}%; its kernels' time in the profiler window): the "
            "host launching kernels one by one sets the pace; the prediction is its ceiling: compute cut to the "
            "device's busy time")


def _device_sync(rec: Any, f: dict[str, Any], o: dict[str, Any]) -> tuple[str, str, str]:
    call, _, op = f["call"].partition(" < ")
    source = _SYNC_SOURCES.get(op, op or "torch.cuda.synchronize()")
    if f.get("placed") == "timed":  # the line itself, timed reading back in the window
        where = (f" at {_where(f)} ({f['file']}): {f['sync_call']} there held the host {f['site_ms_per_step']:.2f} ms "
                 "a step")
    elif f.get("file"):
        where = f" (the costliest line of that part: {_where(f)}, {f['file']})"
    else:
        where = ""
    part = PART_LABELS.get(f["part"], f["part"])
    return ("Stop waiting for the device inside the step",
            f"read values back from the device every N steps, not every step: keep running sums as tensors on the "
            f"device and call .item() once per log interval; drop torch.cuda.synchronize() outside timing code; "
            f"replace boolean-mask indexing with torch.where; here, {source} in {part}{where}",
            f"the host waited {f['wait_ms_per_step']:.2f} ms of each {f['step_ms']:.1f} ms step in {call} "
            f"({f['calls_per_step']:g} a step, from {op or 'the step'}, in {part}): while it waits it launches "
            f"nothing; predicted: the longer of the step without the waits and the device's "
            f"{f['device_ms_per_step']:.2f} ms of work a step")


def _allocator(rec: Any, f: dict[str, Any], o: dict[str, Any]) -> tuple[str, str, str]:
    seen = []
    if f["retries"]:
        seen.append(f"it retried {f['retries']} time(s) after a failed cudaMalloc, freeing its cache each time")
    if f["malloc_ms_per_step"]:
        seen.append(f"cudaMalloc and cudaFree took {f['malloc_ms_per_step']:.2f} ms of each {f['step_ms']:.1f} ms "
                    "step (the profiler window)")
    if f["fragmented"]:
        seen.append(f"it reserved {f['reserved_peak_gib']:.1f} GiB for {f['allocated_peak_gib']:.1f} GiB allocated "
                    "at most (fragmented)")
    return ("Let the CUDA allocator grow its segments",
            f"{overrides(o)}   (in code: {in_code(o, None)}); tensors of fewer sizes help too: pad varying "
            "batches or sequences to a few lengths",
            "the caching allocator: " + "; ".join(seen) + ("" if rec.predicted_speedup else
                                                           "; the gain is not predicted from one run"))


def _mixed_precision(rec: Any, f: dict[str, Any], o: dict[str, Any]) -> tuple[str, str, str]:
    dtype = f.get("dtype", "bfloat16")
    return ("Compute in mixed precision",
            f"with torch.autocast(\"cuda\", dtype=torch.{dtype}): around the forward and the loss"
            + (" (with float16, a torch.amp.GradScaler)" if dtype == "float16" else "")
            + f"; Hugging Face Trainer: {'bf16' if dtype == 'bfloat16' else 'fp16'}=True; Lightning: "
            f"precision=\"{'bf16' if dtype == 'bfloat16' else '16'}-mixed\""
            + (f"; to measure it first: {overrides(o)} (stallscope tune --numerics tries it)" if o else ""),
            f"{f.get('module')}'s parameters are {f.get('param_dtype')} and no autocast was active in its forward, "
            f"on a device of compute capability {f.get('capability')}; the gain depends on the model and is not "
            "predicted from one run, and it changes what is computed: measure it (stallscope compare RUN_A RUN_B)")


def _tf32(rec: Any, f: dict[str, Any], o: dict[str, Any]) -> tuple[str, str, str]:
    return ("Let float32 matmuls use TF32",
            f"{overrides(o)}   (in code: {in_code(o, None)}; Hugging Face Trainer: tf32=True): measure it with "
            "stallscope run --set, it changes what is computed",
            f"float32 matmul precision is \"{f.get('matmul_precision')}\" on a device of compute capability "
            f"{f.get('capability')}, whose TF32 units then sit idle; not predicted, and it changes what is computed")


def _cudnn_benchmark(rec: Any, f: dict[str, Any], o: dict[str, Any]) -> tuple[str, str, str]:
    return ("Let cuDNN pick its fastest convolution algorithms",
            f"{overrides(o)}   (in code: {in_code(o, None)}, for inputs of fixed size; Lightning: "
            "Trainer(benchmark=True))",
            f"the model has {f.get('convolutions')} convolutions and cudnn.benchmark is off; not predicted")


def _channels_last(rec: Any, f: dict[str, Any], o: dict[str, Any]) -> tuple[str, str, str]:
    return ("Keep images in channels_last memory format",
            "model = model.to(memory_format=torch.channels_last) and the same on each batch's images"
            + (f"; to measure it first: {overrides(o)} (stallscope tune --numerics tries it)" if o else ""),
            f"the model has {f.get('convolutions')} convolutions and its input {f.get('input_shape')} is not "
            "channels_last, which Tensor Core convolutions want; not predicted")


SAYS = {
    "python-in-step": _python_in_step,
    "optimizer-foreach": _optimizer_foreach,
    "thread-in-step": _thread_in_step,
    "host-bound": _host_bound,
    "device-sync": _device_sync,
    "allocator": _allocator,
    "ddp-find-unused": _ddp_find_unused,
    "ddp-buckets": _ddp_buckets,
    "ddp-compress": _ddp_compress,
    "mixed-precision": _mixed_precision,
    "tf32": _tf32,
    "cudnn-benchmark": _cudnn_benchmark,
    "channels-last": _channels_last,
}

"""The run over time in words (``analysis/over_time.py``): a slowdown or speed-up with where it began, the part of
the step that changed and its cause; memory that kept growing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stallscope.render.words.phrases import MIB, PART_LABELS

_PART = {**PART_LABELS, "data_wait": "data wait", "several": "several parts of the step"}


def when(t_ns: int, origin_ns: int) -> str:
    """A moment of the run, from its start: seconds, minutes or hours."""
    s = max(0.0, (t_ns - origin_ns) / 1e9)
    if s < 120:
        return f"{s:.0f} s"
    return f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"


def _size(nbytes: float) -> str:
    return f"{nbytes / MIB:,.1f} MiB" if nbytes >= MIB else f"{nbytes / 1024:,.1f} KiB"


def _page_cache(ev: dict[str, Any]) -> str:
    a, b = ev["disk_read_bytes_per_s"]
    iowait = ev.get("iowait_percent")
    waited = f", iowait {iowait[0]:.0f}% -> {iowait[1]:.0f}%" if iowait else ""
    return (f"the machine now reads the data from disk ({a / MIB:.1f} -> {b / MIB:.1f} MiB/s{waited}): the page "
            "cache no longer holds the dataset, which outgrew the memory the cache may use; give the job more "
            "memory, or read a smaller or packed copy of the data (stallscope pack), or from faster storage")


def _input(ev: dict[str, Any]) -> str:
    fetch = ev.get("fetch_ms")
    took = f" (a batch took {fetch[0]:.1f} -> {fetch[1]:.1f} ms to load)" if fetch else ""
    return f"the input pipeline got slower{took}: the data changed, or the storage under it slowed"


def _gc(ev: dict[str, Any]) -> str:
    a, b = ev["gc_ms"]
    memory = ev.get("rss_bytes")
    grew = f", its memory {memory[0] / MIB:,.0f} -> {memory[1] / MIB:,.0f} MiB" if memory else ""
    return (f"the garbage collector takes {a:.2f} -> {b:.2f} ms per step{grew}: the loop keeps more Python "
            "objects alive at every step (a list that grows, a cache without a bound), and every full collection "
            "walks them all; bound what the loop keeps, or gc.freeze() what must stay")


def _memory_growth(ev: dict[str, Any]) -> str:
    a, b = ev["rss_bytes"]
    return (f"the training process's memory kept growing ({a / MIB:,.0f} -> {b / MIB:,.0f} MiB): the loop keeps "
            "more at every step (tensors kept in a list with their graphs, a cache without a bound), and the step "
            "works over what it keeps or the garbage collector walks it at every collection; keep plain numbers "
            "(loss.item(), or computed under torch.no_grad()) and bound what the loop keeps")


def _data_growing(ev: dict[str, Any]) -> str:
    a, b = ev["batch_bytes"]
    return (f"the batches grew over the run ({_size(a)} -> {_size(b)} a batch): the data changed (longer "
            "sequences, larger images, a curriculum), and the step's time follows the data it is given; where "
            "that is not meant, look at the dataset's order (sorted by length?) or the padding; where it is, "
            "bucket by length so each batch pads less")


def _clocks(ev: dict[str, Any]) -> str:
    said = [f"{name} {a:,.0f} -> {b:,.0f} MHz" for key, name in (("gpu_mhz", "the GPUs' SM clock"),
                                                                    ("cpu_mhz", "the CPUs' clock"))
            if (pair := ev.get(key)) and (a := pair[0]) and (b := pair[1]) < a]
    return (f"the device slowed down ({', '.join(said)}): it throttles as it heats or meets its power limit, and "
            "the same work takes longer; check its cooling and power limit (nvidia-smi -q -d PERFORMANCE names "
            "the reason the GPU is held back)")


#: an over-time change's cause -> its words, from the change's evidence
_CAUSES: dict[str, Callable[[dict[str, Any]], str]] = {
    "page-cache": _page_cache, "input": _input, "gc": _gc, "memory-growth": _memory_growth,
    "data-growing": _data_growing, "clocks": _clocks,
    "compute": lambda ev: ("the model's forward and backward take longer per step for batches of the same size: a "
                           "device that slowed (clocks falling as it heats) or inputs that grew inside the batch's "
                           "fixed size"),
    "step-code": lambda ev: "the step's own Python code takes longer per step",
    "other-load": lambda ev: (f"other programs on the machine kept {ev['other_cpus'][0]:.1f} -> "
                              f"{ev['other_cpus'][1]:.1f} CPUs busy meanwhile: the machine's load changed, not the "
                              "job; compare runs made under the same load"),
}


def _cause(change: Any) -> str:
    words = _CAUSES.get(change.cause)
    return words(change.evidence) if words else ""


def change(found: Any, origin_ns: int) -> str:
    """One line: how the rate changed, from when, which part of the step, and why where the evidence says."""
    early, late = found.per_step_ms.get(found.part, (None, None))
    part = _PART.get(found.part, found.part)
    grew = "grew" if found.direction == "slower" else "shrank"
    text = (f"over time: the run {'slowed' if found.direction == 'slower' else 'sped up'}, "
            f"{found.early_steps_per_s:.2f} -> {found.late_steps_per_s:.2f} steps/s ({found.ratio:.2f}x), from "
            f"{when(found.began_ns, origin_ns)} on")
    if early is not None and found.part != "several":
        text += f"; the {part} per step {grew} from {early:.2f} to {late:.2f} ms"
    elif found.part == "several":
        text += "; several parts of the step changed together"
    cause = _cause(found)
    return f"{text}; {cause}" if cause else text


def memory(found: Any, origin_ns: int) -> str:
    if found.who == "workers":
        return (f"memory grew over time: the DataLoader workers {found.early_bytes / MIB:,.0f} -> "
                f"{found.late_bytes / MIB:,.0f} MiB together (each its private memory where read), from "
                f"{when(found.began_ns, origin_ns)} on: workers copy, page by page, the Python objects of the dataset "
                "they read (copy-on-read: each read touches a reference count), or the dataset caches what it loads; "
                "keep per-sample lists and dicts in numpy arrays or a packed file, and bound any cache")
    return (f"memory grew over time: the training process {found.early_bytes / MIB:,.0f} -> "
            f"{found.late_bytes / MIB:,.0f} MiB resident, from {when(found.began_ns, origin_ns)} on: what the loop "
            "keeps from step to step (a list of tensors, a cache, a history of metrics) grows with the run")


def gc_pauses(found: Any, origin_ns: int) -> str:
    return (f"garbage collection pauses grew: the longest {found.early_ms:,.0f} -> {found.late_ms:,.0f} ms, from "
            f"{when(found.began_ns, origin_ns)} on: the training process keeps more Python objects alive as it goes "
            "(a list that grows every step, a cache without a bound), and each full collection walks them all; "
            "bound what the loop keeps, or gc.freeze() what must stay")


def lines(found: Any, origin_ns: int) -> list[str]:
    """Every over-time finding of a run (``analysis.over_time``), one line each; none for a run without any."""
    if found is None:
        return []
    said = [change(found.change, origin_ns)] if found.change is not None else []
    said += [memory(m, origin_ns) for m in found.memory]
    return said + ([gc_pauses(found.gc_pauses, origin_ns)] if found.gc_pauses is not None else [])

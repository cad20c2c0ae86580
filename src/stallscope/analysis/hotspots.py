"""Inside the stages: the lines of the user's code, and the library calls under them, that the fetch time goes to.

The recorder counts Python stacks sampled during batch fetches (``Session.stack_samples``: each with its stage,
read from the timed library call in progress or, outside one, from whether the thread was on the CPU; see
``recorder/stacks.py``). Here each sample is put at a site: the innermost frame in the user's own code (outside
the standard library and site-packages: ``frameworks.is_user_file``), with the library frame it called (the
next frame in), or the innermost frame when the stack never enters the user's code (collate, a library's
dataset). A site's ``share_of_stage`` is its samples over the stage's samples; its ``share_of_step`` scales
that by the stage's share of step time, so sites of different stages rank on one scale.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from stallscope.analysis.findings import shares
from stallscope.analysis.frameworks import is_user_file, split_frame
from stallscope.constants import LIBRARY_ROOTS
from stallscope.session import Session

#: Sites kept per run (the summary's ``hotspots``), the costliest first.
MAX_HOTSPOTS = 20
_PACKAGE_FOLDERS = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")


@dataclass(frozen=True)
class Hotspot:
    """One site of one stage: ``file``:``line`` in ``function``; ``library``: what that line was inside
    (``json loads``), None when the samples were in the line's own code or in calls without Python frames."""
    stage: str
    file: str
    line: int
    function: str
    library: str | None
    samples: int
    share_of_stage: float
    share_of_step: float
    #: compute's sites: the part of the step most of its samples were in (forward, backward, optimizer, step_code)
    part: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "file": self.file, "line": self.line, "function": self.function,
                "share_of_stage": round(self.share_of_stage, 4), "share_of_step": round(self.share_of_step, 4),
                "library": self.library, **({"part": self.part} if self.part else {})}


def library_name(path: str) -> str:
    """The package a library file belongs to: ``numpy`` for ``.../site-packages/numpy/core/x.py``, ``json`` for
    the standard library's ``json/decoder.py``, the module's name otherwise."""
    normalized = os.path.normpath(path)
    for folder in _PACKAGE_FOLDERS:
        if folder in normalized:
            return _first_part(normalized.rsplit(folder, 1)[1])
    for root in LIBRARY_ROOTS:
        if normalized.startswith(root):
            return _first_part(normalized[len(root):])
    return _first_part(os.path.basename(normalized))


def _first_part(relative: str) -> str:
    first = relative.split(os.sep, 1)[0]
    return first.removesuffix(".py")


#: Frames of these code objects are a line of their enclosing function (Python before 3.12 gives comprehensions
#: their own frame): the site names that function.
_INLINE_CODE = tuple(f"{scope}.<{kind}>" for scope in (".<locals>", "") for kind in ("listcomp", "dictcomp", "setcomp",
                                                                                  "genexpr"))


def _enclosing(function: str) -> str:
    """The function a comprehension's frame belongs to, however deeply nested (a generator in a list comprehension)."""
    stripped = True
    while stripped:
        stripped = False
        for suffix in _INLINE_CODE:
            if function.endswith(suffix):
                function, stripped = function[: -len(suffix)], True
    return function


def site_of(frames: list[str]) -> tuple[str, int, str, str | None] | None:
    """(file, line, function, library) of a sampled stack, innermost frame first; None for an empty one."""
    parsed = [split_frame(frame) for frame in frames]
    for i, (path, line, function) in enumerate(parsed):
        if is_user_file(path):
            library = None
            if i > 0:
                inner_path, _, inner_function = parsed[i - 1]
                library = f"{library_name(inner_path)} {inner_function}".strip()
            return path, int(line or 0), _enclosing(function), library
    if not parsed:
        return None
    path, line, function = parsed[0]
    return path, int(line or 0), function, None


def job_pids(session: Session) -> set[int]:
    """The training process and every process under it (its DataLoader workers, a forkserver's children)."""
    root = session.main_pid
    if root is None:
        return set()
    children: dict[int, list[int]] = {}
    for proc in session.processes:
        children.setdefault(proc.ppid, []).append(proc.pid)
    found, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def hotspots(samples: Iterable[dict[str, Any]], stage_shares: dict[str, float],
             loader_ids: Iterable[int] | None = None, pids: Iterable[int] | None = None,
             limit: int = MAX_HOTSPOTS) -> list[Hotspot]:
    """The sites of ``samples`` (``Session.stack_samples`` rows), ordered by ``share_of_step``: only samples of
    ``loader_ids`` from ``pids`` when given. ``stage_shares``: each stage's share of step time."""
    loaders = set(loader_ids) if loader_ids is not None else None
    processes = set(pids) if pids is not None else None
    per_stage: dict[str, int] = {}
    per_site: dict[tuple[str, str, int, str, str | None], int] = {}
    parts: dict[tuple[str, str, int, str, str | None], Counter[str]] = {}
    for row in samples:
        if loaders is not None and row.get("loader_id") not in loaders:
            continue
        if processes is not None and row.get("pid") not in processes:
            continue
        stage, count = row["stage"], int(row["count"])
        per_stage[stage] = per_stage.get(stage, 0) + count
        site = site_of(row["frames"])
        if site is not None:
            key = (stage, *site)
            per_site[key] = per_site.get(key, 0) + count
            if row.get("part"):
                parts.setdefault(key, Counter())[row["part"]] += count
    found = []
    for key, count in per_site.items():
        stage, path, line, function, library = key
        of_stage = count / per_stage[stage]
        part = parts[key].most_common(1)[0][0] if key in parts else None
        found.append(Hotspot(stage, path, line, function, library, count, of_stage,
                             of_stage * stage_shares.get(stage, 0.0), part))
    found.sort(key=lambda h: (-h.share_of_step, -h.samples, h.stage, h.file, h.line, h.library or ""))
    return found[:limit]


def session_hotspots(session: Session, loader_ids: Iterable[int], stage_seconds: dict[str, float]) -> list[Hotspot]:
    """The job's hotspots: samples of its training loader (``loader_ids``; every loader when empty) in the
    training process and the processes under it, and the training step's own (stage ``compute``, sampled in the
    training process's main thread); ``stage_seconds``: step time per stage."""
    ids = tuple(loader_ids)
    stage_shares = shares(stage_seconds)
    fetched = [row for row in session.stack_samples if row.get("stage") != "compute"]
    stepped = [row for row in session.stack_samples if row.get("stage") == "compute"]
    found = (hotspots(fetched, stage_shares, ids or None, job_pids(session))
             + hotspots(stepped, stage_shares, None, {session.main_pid} if session.main_pid is not None else None))
    found.sort(key=lambda h: (-h.share_of_step, -h.samples, h.stage, h.file, h.line, h.library or ""))
    return found[:MAX_HOTSPOTS]


def top_of_stage(found: list[Hotspot], stage: str | None, n: int = 3) -> list[Hotspot]:
    """The ``n`` sites with the largest share of ``stage``."""
    return sorted((h for h in found if h.stage == stage), key=lambda h: -h.share_of_stage)[:n]

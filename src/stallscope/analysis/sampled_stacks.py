"""The job's sampled stacks as typed data, read once for every view of them.

``Session.stack_samples`` holds counted stacks as the recorder wrote them (frames as ``file:line:function``
strings, innermost first). The HTML flame graph, the Perfetto trace's stack tracks and the speedscope export all
need the same selection (the training loader's samples from the training process and the processes under it, as
the hotspots use) and the same parse (outermost first, as a flame graph and speedscope lay them out), so they
read them here, and a call tree merges the stacks once for the two views that draw one.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from stallscope.analysis.frameworks import split_frame
from stallscope.analysis.hotspots import job_pids
from stallscope.session import Session


@dataclass(frozen=True)
class Frame:
    """One frame of a sampled stack: the line its function was running."""
    file: str
    line: int
    function: str

    @property
    def label(self) -> str:
        """What a flame graph writes on the frame: the function, then where (the file's base name)."""
        where = f"{os.path.basename(self.file)}:{self.line}" if self.file else ""
        return f"{self.function or '?'} ({where})" if where else self.function or "?"


@dataclass(frozen=True)
class SampledStack:
    """``count`` samples of one stack of one process in one stage. ``sampler``: ``signal`` or ``thread`` (None
    in sessions recorded before it was noted)."""
    pid: int
    loader_id: int
    stage: str
    frames: tuple[Frame, ...]  # outermost first
    count: int
    sampler: str | None = None


@dataclass
class CallNode:
    """A node of the merged call tree: ``key`` is a Frame, or a stage's name at the stage level; ``count``
    includes the children's samples."""
    key: Frame | str | None
    count: int = 0
    children: dict[Frame | str, CallNode] = field(default_factory=dict)

    def ordered(self) -> list[CallNode]:
        """The children, largest first (a flame graph's left-heavy order; ties by label, for a stable layout)."""
        return sorted(self.children.values(), key=lambda n: (-n.count, _key_text(n.key)))

    def depth(self) -> int:
        """Levels below this node."""
        return 1 + max((child.depth() for child in self.children.values()), default=0) if self.children else 0


def _key_text(key: Frame | str | None) -> str:
    return key.label if isinstance(key, Frame) else str(key or "")


def parse_frames(frames: Iterable[str]) -> tuple[Frame, ...]:
    """``file:line:function`` strings, innermost first, as Frames outermost first."""
    parsed = []
    for text in frames:
        path, line, function = split_frame(text)
        parsed.append(Frame(path, int(line) if line.isdigit() else 0, function))
    return tuple(reversed(parsed))


def job_stacks(session: Session, loader_ids: Iterable[int] = ()) -> list[SampledStack]:
    """The samples the hotspots are made of: of the training loader (``loader_ids``; every loader when empty),
    from the training process and the processes under it, and the training step's own (stage ``compute``)."""
    loaders = set(loader_ids) or None
    pids = job_pids(session)
    found = []
    for row in session.stack_samples:
        if row.get("pid") not in pids:
            continue
        if row.get("stage") == "compute":
            if row.get("pid") != session.main_pid:
                continue
        elif loaders is not None and row.get("loader_id") not in loaders:
            continue
        found.append(SampledStack(int(row["pid"]), int(row.get("loader_id", -1)), str(row["stage"]),
                                  parse_frames(row["frames"]), int(row["count"]), row.get("sampler")))
    return found


def call_tree(stacks: Iterable[SampledStack], by_stage: bool = False) -> CallNode:
    """The stacks merged from the outermost frame in; with ``by_stage``, under one node per stage."""
    root = CallNode(None)
    for stack in stacks:
        root.count += stack.count
        node = root
        for key in ((stack.stage,) if by_stage else ()) + stack.frames:
            child = node.children.get(key)
            if child is None:
                child = node.children[key] = CallNode(key)
            child.count += stack.count
            node = child
    return root

"""Which process trained: the launched script itself, or a process it started (a launcher script running
``python train.py``, an ``os.fork`` or ``multiprocessing`` child), and which others trained beside it.

``Session.main_pid`` picks the process (the most training steps, else the most batches; never a DataLoader worker);
this says which it was, so a report of a child's training is not read as the launched script's, and a second
process that trained (two trainings in a row, a GAN split over two processes) is named, not silently left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stallscope.session import Session

#: Parent links followed up from the training process to the launched one before giving up (a loop in bad data).
MAX_DEPTH = 64


@dataclass(frozen=True)
class OtherTraining:
    """A process that trained too but is not the one analysed."""
    pid: int
    argv: list[str]
    steps: int  # training steps (optimizer steps after a batch)
    batches: int


@dataclass(frozen=True)
class TrainingProcess:
    pid: int
    argv: list[str]  # its ``sys.argv`` as recorded
    launched: bool  # the process stallscope started (the script itself)
    depth: int | None  # 0: the launched process; 1: a process it started; 2: one that one started; None: not traced
    steps: int
    batches: int
    others: list[OtherTraining] = field(default_factory=list)  # most steps first
    launched_pid: int | None = None


def training_process(session: Session) -> TrainingProcess | None:
    """The process the analysis is of, and the other processes that trained; None where no process took a batch or
    the job is distributed (its ranks are said one by one)."""
    pid = session.main_pid
    counts = session.training_counts
    if pid is None or pid not in counts or session.ranks:
        return None
    launched = session.launched_pid
    argv = {proc.pid: list(proc.argv) for proc in session.processes}
    steps, batches = counts[pid]
    # the rival trainers: processes with training steps, or with batches where the analysed one made no step
    others = sorted((OtherTraining(other, argv.get(other, []), s, b) for other, (s, b) in counts.items()
                     if other != pid and (s > 0 if steps > 0 else b > 0)),
                    key=lambda o: (-o.steps, -o.batches, o.pid))
    return TrainingProcess(pid, argv.get(pid, []), pid == launched, _depth(session, pid, launched), steps, batches,
                           others, launched)


def _depth(session: Session, pid: int, launched: int | None) -> int | None:
    """Parent links from ``pid`` up to the launched process: from the processes' own records, and from the system
    sampler's process tree for those between that recorded nothing (a shell, a non-Python wrapper)."""
    if launched is None:
        return None
    parents = {p: series.ppid for p, series in session.system.processes.items() if series.ppid is not None}
    parents.update({proc.pid: proc.ppid for proc in session.processes})
    here = pid
    for depth in range(MAX_DEPTH):
        if here == launched:
            return depth
        if here not in parents:
            return None
        here = parents[here]
    return None

"""The recorded run: a frozen, versioned Session built from the per-process event files.

A Session holds only what was measured (timestamps in ``perf_counter`` nanoseconds, which on
Linux is CLOCK_MONOTONIC and so comparable across the processes of one machine). Analysis is a
pure function of it, so a session saved today can be re-analysed and re-rendered later.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stallscope.constants import SESSION_SCHEMA
from stallscope.paths import write_parts
from stallscope.system_samples import SystemSamples


@dataclass(frozen=True)
class ProcessRecord:
    pid: int
    ppid: int
    role: str
    argv: list[str]
    wall_ns: int
    mono_ns: int
    owner: int | None = None  # the rank process a worker works for (multi-process jobs)
    start_ns: int | None = None  # when the recorder started in it (main and rank processes)
    exit_ns: int | None = None  # when it left through Python's exit; None: killed, os._exit, or not recorded
    cuda_device: str | None = None  # the CUDA device it initialised, if any


@dataclass(frozen=True)
class LoaderRecord:
    loader_id: int
    pid: int
    created_ns: int
    site: str  # file:line of the first frame outside torch (a framework's, or the script's)
    config: dict[str, Any]
    overrides: dict[str, Any]
    stack: list[str] = field(default_factory=list)  # file:line:function from ``site`` outward (to the user's code)


@dataclass(frozen=True)
class IterRecord:
    """``iter(loader)``: for multi-process loaders this call starts the worker processes."""
    loader_id: int
    iter_id: int
    epoch: int
    start_ns: int
    end_ns: int
    num_workers: int
    pid: int


@dataclass(frozen=True)
class NextRecord:
    """One ``__next__`` on a DataLoader iterator: the main process blocked from start to end."""
    loader_id: int
    iter_id: int
    epoch: int
    start_ns: int
    end_ns: int
    worker: int
    batch_size: int | None
    pid: int
    unpickle_ns: int = 0  # of the wait: rebuilding the batch received from a worker (multi-process loaders)
    unpickle_cpu_ns: int = 0  # the CPU part of it; the rest is waiting on the worker (file descriptor passing)


@dataclass(frozen=True)
class StopRecord:
    loader_id: int
    iter_id: int
    epoch: int
    start_ns: int
    end_ns: int
    pid: int


@dataclass(frozen=True)
class ShutdownRecord:
    """A multi-process iterator stopping its workers: when an epoch ends without ``persistent_workers`` (inside
    the last ``next()``, or when a loop that broke out drops the iterator), or when the loader is freed. The
    training process waits through it: the workers finish the batch they are on and exit, which for a spawned
    worker means tearing down a whole interpreter (seconds with torch imported)."""
    loader_id: int
    iter_id: int
    start_ns: int
    end_ns: int
    num_workers: int
    pid: int


@dataclass(frozen=True)
class StallRecord:
    """A ``__next__`` that never returned a batch: still blocked when the process ended (``how`` is how
    it ended: ``exit``, ``SIGTERM``...), or ended by an exception (``how`` is its type, such as the
    ``RuntimeError`` of a DataLoader ``timeout``). ``pending``: workers that owed batches then;
    ``awaited``: the one owing the batch the loader waited for; ``dead``: workers no longer alive."""
    loader_id: int
    iter_id: int
    epoch: int
    start_ns: int
    end_ns: int
    how: str
    message: str | None
    pending: list[int]
    awaited: int | None
    dead: list[int]
    pid: int


@dataclass(frozen=True)
class SendRecord:
    loader_id: int
    iter_id: int
    epoch: int
    send_idx: int
    worker: int
    t_ns: int
    pid: int = -1


@dataclass(frozen=True)
class FetchRecord:
    """One batch fetched by a worker (worker -1: by the main process, ``num_workers=0``).

    ``by_node`` and ``by_name`` map to ``[wall_ns, cpu_ns, calls]`` of instrumented calls,
    exclusive of nested calls; a ``by_name`` row has the call's node fourth (absent in sessions recorded
    before it was: ``analysis.pipeline.call_nodes`` reads it from the totals then). ``runqueue_ns`` is -1 when
    the kernel does not report it.
    ``timed`` is False for a batch whose library calls were not timed (the recorder times one batch
    in every few where timing each call would cost more than its budget): its ``by_node`` and
    ``by_name`` are empty and its per-node split is estimated from the loader's timed batches.
    ``minflt``: minor page faults the fetching thread took, -1 where not counted (not Linux, or a
    session recorded before they were).
    ``threads_cpu_ns``: for a batch the training process loaded itself, the CPU its other Python threads (a logger,
    a metrics exporter) took meanwhile, -1 where none ran or it was not read: the batch waited for the interpreter
    lock while they ran Python (``analysis.pipeline.fetch_parts``). For a worker's batch, the CPU the loader's own
    download threads (a streaming library's) took meanwhile: loading's CPU, not time blocked.
    ``requests``: the batch's HTTP requests, ``[requests, first-byte ns, body ns, body bytes, failed, connections
    opened, connect ns, answers with a body]`` (``recorder/http_requests.py``; sessions recorded before the last
    field have seven), then, where the loader's own threads (a streaming library's downloads) made some of them
    meanwhile, how many and which library (an index into ``constants.DOWNLOAD_LIBRARIES``); None where it made none.
    """
    loader_id: int
    iter_id: int
    worker: int
    seq: int
    start_ns: int
    end_ns: int
    cpu_ns: int
    runqueue_ns: int
    items: int
    by_node: dict[str, list[int]]
    by_name: dict[str, list[Any]]
    outcome: str | None
    pid: int
    timed: bool = True
    minflt: int = -1
    threads_cpu_ns: int = -1
    requests: list[int] | None = None


@dataclass(frozen=True)
class WorkerStartRecord:
    loader_id: int
    iter_id: int
    worker: int
    pid: int
    created_ns: int
    entered_ns: int
    ready_ns: int
    threads: dict[str, Any]


@dataclass(frozen=True)
class OptimizerStepRecord:
    optimizer: int
    kind: str
    start_ns: int
    end_ns: int
    pid: int


@dataclass(frozen=True)
class ForwardRecord:
    """A root module's outermost call (recorder/step_parts.py)."""
    start_ns: int
    end_ns: int
    module: str
    pid: int


@dataclass(frozen=True)
class BackwardRecord:
    """An outermost ``torch.autograd.backward`` (how: "backward") or ``torch.autograd.grad`` ("grad") call."""
    start_ns: int
    end_ns: int
    how: str
    pid: int


@dataclass(frozen=True)
class PinRecord:
    main_thread: bool
    start_ns: int
    end_ns: int
    pid: int


@dataclass(frozen=True)
class TransferRecord:
    start_ns: int
    end_ns: int
    nbytes: int
    pinned: bool
    non_blocking: bool
    call: str
    pid: int


@dataclass(frozen=True)
class GpuSpanRecord:
    """A span timed with CUDA events in the stream: ``kind`` is ``step`` (the device's work on a
    training step), ``idle`` (the device waiting between steps) or ``h2d`` (a host-to-device copy,
    ``nbytes`` moved). ``start_ns``/``end_ns`` are the CPU times the events were recorded;
    ``gpu_ns`` is the elapsed time between them on the GPU."""
    kind: str
    step: int
    start_ns: int
    end_ns: int
    gpu_ns: int
    nbytes: int
    pid: int


@dataclass(frozen=True)
class RankRecord:
    """A process of a torch.distributed job: its rank, where it ran, and its ``init_process_group``."""
    pid: int
    rank: int
    local_rank: int
    world_size: int
    node_rank: int
    host: str
    backend: str | None = None
    init_start_ns: int | None = None
    init_end_ns: int | None = None
    job: str | None = None  # the launcher's words for the job (job_names.job_identity)
    store: str | None = None  # the job's store, ``MASTER_ADDR:MASTER_PORT`` (recorder/distributed.store_address)


@dataclass(frozen=True)
class CollectiveRecord:
    """Time in a collective. ``blocking``: the caller waited from start to end (a synchronous call, or
    ``ddp.allreduce``: the end of a DDP model's ``backward``, waiting for its gradient all-reduce);
    otherwise (async launches, and DDP buckets in sessions of earlier versions) start is the
    hand-over and end the completion. ``enter_ns``: when the rank may first have handed over its
    part, where that is before ``start_ns`` (DDP hands buckets over while ``backward`` computes)."""
    op: str
    seq: int
    start_ns: int
    end_ns: int
    pid: int
    group_size: int = -1
    blocking: bool = True
    bucket: int = -1
    enter_ns: int | None = None


@dataclass(frozen=True)
class ErrorRecord:
    """An exception: ``where`` is ``main`` (uncaught in the script) or ``worker`` (inside a fetch)."""
    where: str
    pid: int
    t_ns: int
    type: str
    message: str
    location: str | None
    traceback: str
    loader_id: int | None = None
    worker: int | None = None


@dataclass(frozen=True)
class Session:
    schema: str
    run_id: str
    command: list[str]
    cwd: str
    started_wall: float
    start_ns: int
    end_ns: int
    exit_code: int
    ended_by: str
    overrides: dict[str, Any]
    max_steps: int | None
    environment: dict[str, Any]
    processes: list[ProcessRecord] = field(default_factory=list)
    loaders: list[LoaderRecord] = field(default_factory=list)
    iters: list[IterRecord] = field(default_factory=list)
    nexts: list[NextRecord] = field(default_factory=list)
    stops: list[StopRecord] = field(default_factory=list)
    shutdowns: list[ShutdownRecord] = field(default_factory=list)
    stalls: list[StallRecord] = field(default_factory=list)
    sends: list[SendRecord] = field(default_factory=list)
    fetches: list[FetchRecord] = field(default_factory=list)
    worker_starts: list[WorkerStartRecord] = field(default_factory=list)
    optimizer_steps: list[OptimizerStepRecord] = field(default_factory=list)
    forwards: list[ForwardRecord] = field(default_factory=list)
    backwards: list[BackwardRecord] = field(default_factory=list)
    pins: list[PinRecord] = field(default_factory=list)
    transfers: list[TransferRecord] = field(default_factory=list)
    errors: list[ErrorRecord] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)
    system_samples: dict[str, Any] = field(default_factory=dict)  # the sampler's ticks: read them through .system
    notes: list[str] = field(default_factory=list)
    batch_info: list[dict[str, Any]] = field(default_factory=list)  # first batch of each iterator: bytes, types
    lmdb_opens: list[dict[str, Any]] = field(default_factory=list)
    #: {pid, t_ns, opened_by, address}: a process's requests over a connection another process opened (fork)
    shared_connections: list[dict[str, Any]] = field(default_factory=list)
    framework_args: list[dict[str, Any]] = field(default_factory=list)  # e.g. where TrainingArguments was built
    tracker_runs: list[dict[str, Any]] = field(default_factory=list)  # MLflow/W&B/TensorBoard runs the script started
    #: measured at exit: {pid, kind ('shared_memory'), nbytes, write_extra_ns, read_extra_ns} (recorder/shm_cost.py)
    calibrations: list[dict[str, Any]] = field(default_factory=list)
    #: what the training step computes with (recorder/model_facts.py): {pid, kind ('optimizer', 'model', 'ddp'),
    #: t_ns, ...its figures}; and the other Python threads while it computed (kind 'threads', cumulative: the
    #: last of a pid holds its totals; recorder/step_threads.py)
    compute_facts: list[dict[str, Any]] = field(default_factory=list)
    #: the profiler window (recorder/op_window.py): {pid, start_ns, opened_ns, stop_ns, end_ns, steps, folded,
    #: ops: [[part, name, calls, self CPU ns, self device ns], ...], cpu_ns, device_ns}
    op_windows: list[dict[str, Any]] = field(default_factory=list)
    ranks: list[RankRecord] = field(default_factory=list)
    collectives: list[CollectiveRecord] = field(default_factory=list)
    clock_alignment: list[dict[str, Any]] = field(default_factory=list)  # per merged node: offset and its bounds
    gpu_spans: list[GpuSpanRecord] = field(default_factory=list)
    #: Python stacks sampled during batch fetches (recorder/stacks.py), counted: each {pid, loader_id, stage,
    #: frames (file:line:function, innermost first), count, sampler ("signal" or "thread"; absent in sessions
    #: recorded before it was)}; ``analysis/hotspots.py`` and ``analysis/sampled_stacks.py`` read them.
    stack_samples: list[dict[str, Any]] = field(default_factory=list)
    #: the whole job stopped (Ctrl-Z, SIGTSTP) and continued: {start_ns, end_ns}, the launcher's clock (monotonic,
    #: as every process's); steps leave these out (``analysis/steps.py``)
    pauses: list[dict[str, Any]] = field(default_factory=list)
    #: the run's time cut into windows (``folding.py``): per window and process, its steps, batches, samples, data
    #: wait, fetches, forward/backward/optimizer time, epochs, stalls, errors; every window of the run, whether its
    #: records were kept or folded
    windows: list[dict[str, Any]] = field(default_factory=list)
    #: how the run was kept over time: {window_ns, folded: [[start_ns, end_ns], ...] spans whose records were folded
    #: into ``windows`` alone, kept_windows: {why: count}}; empty in sessions recorded before it was
    recording: dict[str, Any] = field(default_factory=dict)

    @functools.cached_property
    def system(self) -> SystemSamples:
        """The system samples, read (the one reader: ``system_samples.SystemSamples``)."""
        return SystemSamples.read(self.system_samples)

    @property
    def wall_s(self) -> float:
        return max(0.0, (self.end_ns - self.start_ns) / 1e9)

    @property
    def launched_pid(self) -> int | None:
        """The process stallscope started (the script itself): the ``main`` process whose parent recorded nothing.
        A child it forks inherits that role in sessions recorded before ``collect`` told them apart."""
        pids = {proc.pid for proc in self.processes}
        mains = [proc for proc in self.processes if proc.role == "main"]
        return next((proc.pid for proc in mains if proc.ppid not in pids), mains[0].pid if mains else None)

    @functools.cached_property
    def training_counts(self) -> dict[int, tuple[int, int]]:
        """Per process that took batches from a DataLoader, DataLoader workers left out: (training steps, batches).
        A training step is an optimizer step after at least one batch since the last one (``recorder/steps.py``'s
        rule: a GAN's two optimizers on one batch make one step)."""
        workers = {proc.pid for proc in self.processes if proc.role == "worker"} | {w.pid for w in self.worker_starts}
        batch_ends: dict[int, list[int]] = {}
        for n in self.nexts:
            if n.pid not in workers:
                batch_ends.setdefault(n.pid, []).append(n.end_ns)
        counts: dict[int, tuple[int, int]] = {}
        for pid, ends in batch_ends.items():
            ends.sort()
            steps = taken = 0
            for opt in (o for o in self.optimizer_steps if o.pid == pid):
                if taken < len(ends) and ends[taken] <= opt.start_ns:
                    steps += 1
                    while taken < len(ends) and ends[taken] <= opt.start_ns:
                        taken += 1
            counts[pid] = (steps, len(ends))
        return counts

    @functools.cached_property
    def main_pid(self) -> int | None:
        """The training process: the one that made the most training steps or, where none made any, took the most
        batches (``training_counts``; DataLoader workers never are). Most often the launched script itself, but it
        may be a process the script started (a launcher script running ``python train.py``, an ``os.fork`` or a
        ``multiprocessing`` child); on a tie, the launched process. Where no process trained, the launched one.
        In a distributed job whose launched process is not a rank (torchrun's agent, a script that spawns its
        ranks), the lowest rank."""
        main = self.launched_pid
        if self.ranks and main not in {r.pid for r in self.ranks}:
            return min(self.ranks, key=lambda r: r.rank).pid
        if self.ranks:
            return main
        counts = self.training_counts
        if counts:
            order = {proc.pid: i for i, proc in enumerate(self.processes)}
            return max(counts, key=lambda pid: (counts[pid], pid == main, -order.get(pid, len(order))))
        if main is not None:
            return main
        return self.loaders[0].pid if self.loaders else None

    def to_dict(self) -> dict[str, Any]:
        """The session as JSON-ready values, for saving: record lists become lists of dicts; the other values are
        the session's own (not copied: ``dataclasses.asdict`` deep-copies every list and dict, which made it most
        of the time a large merged job took to save)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):
                out[f.name] = [_record_dict(r) for r in value]
            else:
                out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Session:
        """Rebuild a saved session; a ``SessionFormatError`` says what is wrong when it is not one."""
        if not isinstance(data, dict):
            raise SessionFormatError(f"not a stallscope session (a JSON {type(data).__name__}, not an object)")
        schema = data.get("schema")
        if schema != SESSION_SCHEMA:
            raise SessionFormatError(f"unsupported session schema {schema!r} (this stallscope reads "
                                     f"{SESSION_SCHEMA})")
        if "samples" in data and "system_samples" not in data:  # sessions saved before the field was renamed
            data = {**data, "system_samples": data["samples"]}
        return _build(cls, data, "session")

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write atomically: a crash mid-save never leaves a truncated session behind."""
        return write_parts(path, self.json_parts())

    def json_parts(self, records_per_part: int = 2000) -> Iterator[bytes]:
        """``json.dumps(self.to_dict(), separators=(",", ":"))`` in parts, a record list a few thousand records at a
        time: saving a long run's session never holds its records as dicts and its text whole at once."""
        dumps = json.JSONEncoder(separators=(",", ":")).encode
        for n, f in enumerate(dataclasses.fields(self)):
            value = getattr(self, f.name)
            yield f'{"," if n else "{"}{dumps(f.name)}:'.encode()
            if isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):
                for start in range(0, len(value), records_per_part):
                    part = ",".join(dumps(_record_dict(r)) for r in value[start:start + records_per_part])
                    yield f'{"," if start else "["}{part}'.encode()
                yield b"]"
            else:
                yield dumps(value).encode()
        yield b"}"

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Session:
        """The session saved at ``path``. Anything that is not one (binary garbage, JSON of another shape,
        missing or mistyped fields, nesting too deep to parse) raises ``SessionFormatError`` (a
        ``ValueError``) naming the file and what is wrong; an unreadable file raises ``OSError``."""
        raw = Path(path).read_bytes()
        try:
            data = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise SessionFormatError(f"{path} is not a stallscope session (not UTF-8 text)", unparsable=True) from None
        except json.JSONDecodeError as exc:
            raise SessionFormatError(f"{path} is not a stallscope session (invalid JSON: {exc})",
                                     unparsable=True) from None
        except RecursionError:
            raise SessionFormatError(f"{path} is not a stallscope session (JSON nested too deep)",
                                     unparsable=True) from None
        try:
            return cls.from_dict(data)
        except SessionFormatError as exc:
            raise SessionFormatError(f"{path}: {exc}") from None


#: The Session's lists of records, name -> record type, in field order: the one list of record kinds
#: (collect, merge and the per-rank views all iterate it).
RECORD_LISTS: dict[str, type] = {
    f.name: typing.get_args(hint)[0]
    for f in dataclasses.fields(Session)
    if typing.get_origin(hint := typing.get_type_hints(Session)[f.name]) is list
    and dataclasses.is_dataclass(typing.get_args(hint)[0])
}
#: Record fields that are points on a process's clock (``merge`` shifts them; durations are not points).
CLOCK_FIELDS = frozenset({"start_ns", "end_ns", "t_ns", "created_ns", "entered_ns", "ready_ns", "mono_ns",
                          "init_start_ns", "init_end_ns", "enter_ns", "exit_ns"})
#: Record fields that hold an os pid (``merge`` renumbers them across nodes).
PID_FIELDS = ("pid", "ppid", "owner")
#: Lists kept in time order (by ``start_ns``, or ``t_ns``); the others keep the order they were recorded in.
TIME_ORDERED = ("nexts", "fetches", "iters", "shutdowns", "sends", "optimizer_steps", "forwards", "backwards", "pins",
                "transfers", "collectives", "gpu_spans")
#: Lists whose records belong to one process (its ``pid``): a rank's view keeps those of its own processes.
PER_PROCESS = tuple(name for name, kind in RECORD_LISTS.items()
                    if name not in ("processes", "ranks") and "pid" in {f.name for f in dataclasses.fields(kind)})


def sort_in_time(lists: dict[str, list[Any]]) -> None:
    """Order the ``TIME_ORDERED`` lists of ``lists`` in place."""
    for name in TIME_ORDERED:
        if name in lists:
            lists[name].sort(key=lambda r: getattr(r, "start_ns", getattr(r, "t_ns", 0)))


@functools.cache
def _field_names(cls: Any) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def _record_dict(record: Any) -> dict[str, Any]:
    """A record's fields by name; a record holding another record is left to ``dataclasses.asdict``."""
    kind: Any = type(record)
    row = {name: getattr(record, name) for name in _field_names(kind)}
    if any(dataclasses.is_dataclass(v) for v in row.values()):
        return dataclasses.asdict(record)
    return row


class SessionFormatError(ValueError):
    """A file or document that is not a session this stallscope can read; the message says what is wrong.
    ``unparsable``: the file is not a JSON document at all (damaged, cut short, not text), not one of another shape."""

    def __init__(self, message: str, *, unparsable: bool = False) -> None:
        super().__init__(message)
        self.unparsable = unparsable


@functools.cache
def _shape(cls: type) -> tuple[tuple[str, Any, bool], ...]:
    """(field, expected JSON type(s) or a record type or ``list`` of one, required) per field of ``cls``."""
    hints = typing.get_type_hints(cls)
    shape = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        origin = typing.get_origin(hint)
        if origin is list and dataclasses.is_dataclass(typing.get_args(hint)[0]):
            expected: Any = [typing.get_args(hint)[0]]
        else:
            options = typing.get_args(hint) if origin in (typing.Union, types.UnionType) else (hint,)
            kinds = {typing.get_origin(o) or o for o in options}
            expected = tuple(k for k in kinds if k is not Any) if Any not in kinds else None
            if expected and float in expected:
                expected = (*expected, int)
        shape.append((f.name, expected, required))
    return tuple(shape)


def _is_one_of(value: Any, expected: tuple[type, ...]) -> bool:
    """``isinstance`` for JSON values, where ``True`` is no integer and ``None`` only fits an optional field."""
    if isinstance(value, bool):
        return bool in expected
    return isinstance(value, expected)


def _build(cls: type, data: Any, where: str) -> Any:
    """Rebuild a dataclass (and lists of dataclasses) from plain JSON values, checking each field's type."""
    if not isinstance(data, dict):
        raise SessionFormatError(f"{where} is a {type(data).__name__}, not an object")
    values = {}
    for name, expected, required in _shape(cls):
        if name not in data:
            if required:
                raise SessionFormatError(f"{where} has no field {name!r}")
            continue
        value = data[name]
        if isinstance(expected, list):
            if not isinstance(value, list):
                raise SessionFormatError(f"{where}.{name} is a {type(value).__name__}, not a list")
            value = [_build(expected[0], item, f"{where}.{name}[{i}]") for i, item in enumerate(value)]
        elif expected and not _is_one_of(value, expected):
            raise SessionFormatError(f"{where}.{name} is {type(value).__name__} {str(value)[:40]!r}, "
                                     f"not {' or '.join(sorted(t.__name__ for t in expected))}")
        values[name] = value
    return cls(**values)

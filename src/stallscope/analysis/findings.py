"""What the analysis concludes, as data: numbers, ids and the changes to make. Words are produced by the
renderers (``render/words/``), from the ``facts`` each finding carries."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stallscope.analysis.frameworks import CodeSite
from stallscope.analysis.store_requests import RequestStats


@dataclass(frozen=True)
class Step:
    """One training step: from the end of the previous step to its optimizer step (or next batch)."""
    index: int
    start_ns: int
    end_ns: int
    wait_ns: int
    transfer_ns: int
    batches: int
    samples: int | None
    excluded_ns: int = 0  # time inside the interval spent in other loaders' loops (validation)
    unpickle_ns: int = 0  # part of the wait spent rebuilding batches received from workers
    unpickle_cpu_ns: int = 0  # the CPU part of that; the rest waited on the sending worker
    sync_ns: int = 0  # time waiting for other ranks in collectives (taken out of compute)
    # compute's parts (analysis/step_parts.py); the rest of compute is the script's own step code
    forward_ns: int = 0
    backward_ns: int = 0
    optimizer_ns: int = 0

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns - self.excluded_ns

    @property
    def compute_ns(self) -> int:
        return max(0, self.duration_ns - self.wait_ns - self.transfer_ns - self.sync_ns)


@dataclass(frozen=True)
class StepStats:
    loader_id: int | None
    boundary: str  # "optimizer" | "batch" | "none"
    steps: list[Step]
    warmup_steps: int
    wall_s: float  # steady-state seconds (sum of durations of steps after warm-up)
    wait_s: float
    transfer_s: float
    compute_s: float
    unpickle_s: float
    unpickle_cpu_s: float
    samples: int | None
    median_step_s: float | None
    p90_step_s: float | None
    median_wait_s: float | None
    first_step_s: float | None
    sync_s: float = 0.0  # steady-state seconds waiting in collectives
    loader_ids: tuple[int, ...] = ()  # the training loader's ids: one per DataLoader built at its line
    stalled_s: float = 0.0  # in wall_s and wait_s: blocked in next() calls that never returned a batch
    # loaders fed together with the training loader (zip): their waits are in wait_s
    paired_loader_ids: tuple[int, ...] = ()
    #: compute split into the step's parts, steady seconds: forward, backward, optimizer, step_code (the rest of
    #: compute); None where forward and backward were not recorded (a session of an older version)
    parts_s: dict[str, float] | None = None
    #: indices of steps left out of every figure: the profiler window's, and the one its folding landed in
    left_out: frozenset[int] = frozenset()
    #: indices of steps across a span whose records were folded (a long run, ``folding.py``): their bounds are
    #: minutes apart
    across_folded: frozenset[int] = frozenset()
    #: where records were folded, the run's steps and samples as its windows counted them (the recorder's rule: an
    #: optimizer step after any batch), and the steps inside the folded spans; None where nothing was folded
    window_steps: int | None = None
    window_samples: int | None = None
    folded_steps: int = 0

    @property
    def profiled_steps(self) -> int:
        return len(self.left_out)

    @property
    def sync_fraction(self) -> float:
        return self.sync_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def steady(self) -> list[Step]:
        """The steps after the warm-up, less the profiler window's."""
        after = self.steps[self.warmup_steps:]
        out = self.left_out | self.across_folded
        return [s for s in after if s.index not in out] if out else after

    @property
    def run_steps(self) -> int:
        """Every training step of the run: those recorded, or where records were folded, those its windows counted."""
        return self.window_steps if self.window_steps is not None else len(self.steps)

    @property
    def data_wait_fraction(self) -> float:
        return self.wait_s / self.wall_s if self.wall_s > 0 else 0.0


@dataclass(frozen=True)
class WorkerPipeline:
    """Where the workers' busy time went, per node, for one loader."""
    loader_id: int
    num_workers: int
    batches: int
    busy_s: float
    node_s: dict[str, float]
    node_cpu_s: dict[str, float]  # CPU time only (no run-queue share): what more cores would parallelize
    samples: int
    direct_s: float  # time inside instrumented calls (the rest is inferred: CPU->transform, off-CPU->storage)
    cpu_s: float
    blocked_s: float
    runqueue_s: float | None
    by_call: dict[str, float]  # worker seconds per timed call: its share of its node's (``call_node``) node_s
    batch_wall_median_s: float | None
    batch_cpu_median_s: float | None
    startup_s: list[float]
    busy_fraction: float | None  # busy time / (workers x their lifetime)
    queue_depth_mean: float | None
    empty_queue_fraction: float | None  # share of consumed batches that were not ready when asked for
    pin_s: float
    errors: int
    #: Batches whose library calls were timed (the rest had their split estimated from these); None: all.
    call_timed_batches: int | None = None
    #: Minor page faults the fetches took (fresh memory touched); None where a fetch did not count them.
    fresh_pages: int | None = None
    #: The node of each call of ``by_call`` (whose seconds are its share of that node's, so never more than it).
    call_node: dict[str, str] = field(default_factory=dict)
    #: The batches' HTTP requests (an object store), None where they made none (``store_requests.py``).
    requests: RequestStats | None = None


@dataclass(frozen=True)
class LoaderSummary:
    """One loader of the script: the DataLoaders built at one line of it (``loader_ids``, one per epoch
    when the script builds a new one each epoch), with their batches, epochs and waits together."""
    loader_id: int
    role: str  # "train" | "paired" (fed with it, zip) | "eval" | "other"
    site: str
    config: dict[str, Any]
    overrides: dict[str, Any]
    batches: int
    epochs: int
    wait_s: float
    iter_start_s: float
    pipeline: WorkerPipeline | None
    loader_ids: tuple[int, ...] = ()
    code: CodeSite | None = None  # where the user changes its settings, in their framework's words
    pid: int | None = None  # the process that built it: loader ids are numbered per process

    @property
    def ids(self) -> tuple[int, ...]:
        return self.loader_ids or (self.loader_id,)


@dataclass(frozen=True)
class Recommendation:
    """A change to make. ``overrides``: the DataLoader arguments to set when the change is a ``--set``
    (the tuner and the demo apply them as they are); empty for a code change. ``facts``: the figures
    behind it, by name (what the words cite)."""
    id: str
    node: str
    predicted_speedup: float | None
    overrides: dict[str, Any] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class NotRecommended:
    """A likely fix left out of the recommendations, and why: ``id`` and ``node`` as the recommendation would have
    them, ``cause`` (``other-load``, ``compute-takes-the-cores``, ``below-min-gain``, ...) and the figures behind it
    (``facts``), which ``render/words/recommendations.py`` says in one line."""
    id: str
    node: str
    cause: str
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Failure:
    """How the script failed: an exception (``where`` main or worker, with its type and message), or
    ``type == "exit"``: it exited with a non-zero ``exit_code`` and no exception was seen (``message``: what it
    gave ``sys.exit``, if not a number). ``location``: the line of the user's code it happened at; ``pid``: the
    process it happened in, where known; ``traceback``: as recorded, for the reports that show it whole.
    ``cause`` ``peer-lost``: a rank of a distributed job lost its connection to another rank, which ended first
    (``rank``: this one's): the failure is elsewhere, and this rank's error only its consequence."""
    where: str
    type: str
    message: str | None
    location: str | None
    loader_id: int | None = None
    worker: int | None = None
    exit_code: int | None = None
    pid: int | None = None
    traceback: str | None = None
    cause: str | None = None
    rank: int | None = None


@dataclass(frozen=True)
class Analysis:
    """Everything the renderers need. ``capacity``, ``pitfalls`` and ``system`` are typed in their modules
    (capacity.CapacityReport, pitfalls.Pitfall, system_metrics.SystemSummary)."""
    verdict: str
    data_wait_fraction: float
    steps: StepStats
    node_seconds: dict[str, float]
    bottleneck_node: str | None
    bottleneck_share: float
    loaders: list[LoaderSummary]
    recommendations: list[Recommendation]
    failure: Failure | None
    usable_cpus: int
    notes: list[str] = field(default_factory=list)  # the session's own notes (recorder, launcher), as recorded
    conditions: list[str] = field(default_factory=list)  # what limits the analysis: no-dataloader, no-training-step
    capacity: Any = None
    pitfalls: list[Any] = field(default_factory=list)
    system: Any = None
    ranks: list[Any] = field(default_factory=list)  # ranks.RankSummary per rank process (distributed jobs)
    distributed: Any = None  # ranks.DistributedFindings when the job has several ranks
    gpu_timing: Any = None  # gpu_timing.GpuTiming when CUDA events were recorded
    hotspots: list[Any] = field(default_factory=list)  # hotspots.Hotspot: sites in the user's code, costliest first
    #: Per fetch of ``session.fetches`` (same order): nanoseconds per stage, adding up to its wall time
    #: (``pipeline.fetch_stages``); what the worker timelines of the report and the trace draw.
    fetch_stages: list[dict[str, int]] = field(default_factory=list)
    #: Cores other programs kept busy over the steady steps (on the job's CPUs): not this job's to use, so its
    #: figures and advice are for a machine that busy.
    other_cpus: float = 0.0
    #: store_requests.LocalServers: the servers on this machine that the job's requests reached (a local store, a
    #: proxy), whose CPU is priced per sample rather than counted in ``other_cpus``; None where none was found
    local_servers: Any = None
    #: training_process.TrainingProcess: which process the findings are of (the script, or a process it started)
    #: and the others that trained; None in distributed jobs (the ranks are said) and where nothing took a batch
    training_process: Any = None
    #: Likely fixes the recommendations leave out, each with why (``NotRecommended``).
    not_recommended: list[Any] = field(default_factory=list)
    #: operators.Operators: the run's profiler window folded (top operators by part, its cost); None without one
    operators: Any = None
    #: over_time.OverTime: the run's windows, a slowdown or speed-up beyond noise and memory that grew; None for a
    #: session recorded before windows were
    over_time: Any = None

    @property
    def train_loader(self) -> LoaderSummary | None:
        return next((ld for ld in self.loaders if ld.role == "train"), None)

    @property
    def node_shares(self) -> dict[str, float]:
        """Each stage's share of step time (0 for every stage when no step time was measured)."""
        return shares(self.node_seconds)

    @property
    def steps_per_s(self) -> float:
        return len(self.steps.steady) / self.steps.wall_s if self.steps.wall_s > 0 else 0.0

    @property
    def samples_per_s(self) -> float | None:
        if self.steps.samples is None or self.steps.wall_s <= 0:
            return None
        return self.steps.samples / self.steps.wall_s


def shares(seconds: dict[str, float]) -> dict[str, float]:
    """Each key's share of the total; all 0 when the total is not positive. The one rule for stage shares."""
    total = sum(seconds.values())
    return {key: (value / total if total > 0 else 0.0) for key, value in seconds.items()}

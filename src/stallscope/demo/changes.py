"""How the demo applies each recommendation its reference training can get, so that it can measure it.

The demo owns its training script: a ``--set`` change it applies through the overrides the recommendation carries,
and a code change through the reference script's own flag for it (the script carries both versions of its code).
Advice to change nothing has nothing to measure, and what the demo cannot apply is said with its reason. The table
is keyed by recommendation id (``analysis/recommend.py``, ``analysis/ranks.py``): data, never read from the advice's
words. A test fails when the analysis gains an id this table does not place.
"""

from __future__ import annotations

from dataclasses import dataclass

from stallscope.analysis.findings import Recommendation


@dataclass(frozen=True)
class ThroughSet:
    """Applied through the recommendation's own ``--set`` overrides."""


@dataclass(frozen=True)
class ScriptFlags:
    """A code change the reference script makes behind its own flags (``reference_train.py``)."""
    args: tuple[str, ...]


@dataclass(frozen=True)
class NothingToChange:
    """Advice to leave things as they are: nothing to measure."""


@dataclass(frozen=True)
class NotApplied:
    """A change the demo cannot make for its script; ``reason`` is an id, said in words by the demo's verb."""
    reason: str


How = ThroughSet | ScriptFlags | NothingToChange | NotApplied

#: ``NotApplied`` reasons.
ONE_PROCESS = "one-process"  # advice for the ranks of a distributed job: the reference training is one process
LOADER_BUILT_ONCE = "loader-built-once"  # the reference script builds its DataLoader once already
NO_DATASET_CODE = "no-dataset-code"  # its dataset is torchvision's ImageFolder: no Python of its own to speed up
NO_REQUESTS = "no-requests"  # its files are on a local disk: no request to put in flight beside another
PLANTED_LATENCY = "planted-latency"  # its storage latency is planted per file read: packing would skip the plant
STEP_CODE = "step-code"  # a change inside the training step's own code: the reference script has one version of it
NUMERICS = "numerics"  # a change to what the training computes (precision, layout): never made without being asked
ALREADY_APPLIED = "already-applied"  # the script's command has the change's flags already (passed after --)
UNKNOWN = "unknown"  # an id this table does not place (a test keeps the table complete)

CHEAPER_TRANSFORMS = ScriptFlags(("--cheaper-transforms",))
UINT8_TO_DEVICE = ScriptFlags(("--uint8-to-device",))
REDUCED_SIZE_DECODE = ScriptFlags(("--reduced-size-decode",))

APPLY: dict[str, How] = {
    # configuration changes: their overrides
    "num-workers": ThroughSet(),
    "fewer-workers": ThroughSet(),
    "split-the-cores": ThroughSet(),
    "compute-threads": ThroughSet(),
    "persistent-workers": ThroughSet(),
    "prefetch": ThroughSet(),
    "discarded-prefetch": ThroughSet(),
    "sharing-strategy": ThroughSet(),
    "pin-memory": ThroughSet(),
    "workers-per-node": ThroughSet(),
    # code changes the reference script makes behind a flag
    "cheaper-transforms": CHEAPER_TRANSFORMS,
    "uint8-device-normalize": UINT8_TO_DEVICE,
    "cheaper-collate": UINT8_TO_DEVICE,  # its batches are one image tensor and one label tensor: uint8 is a quarter
    "reduced-size-decode": REDUCED_SIZE_DECODE,
    # advice to change nothing
    "no-input-fix": NothingToChange(),
    "no-predicted-gain": NothingToChange(),
    # what the demo cannot apply
    "pack-dataset": NotApplied(PLANTED_LATENCY),
    "requests-in-flight": NotApplied(NO_REQUESTS),
    "larger-shards": NotApplied(NO_REQUESTS),
    "dataset-code": NotApplied(NO_DATASET_CODE),
    "build-loader-once": NotApplied(LOADER_BUILT_ONCE),
    "distributed-sampler": NotApplied(ONE_PROCESS),
    "uneven-shards": NotApplied(ONE_PROCESS),
    "wait-for-other-nodes": NotApplied(ONE_PROCESS),
    "straggler-cpus": NotApplied(ONE_PROCESS),
    "sampler-drop-last": NotApplied(ONE_PROCESS),
    "ddp-find-unused": NotApplied(ONE_PROCESS),
    "python-in-step": NotApplied(STEP_CODE),
    "optimizer-foreach": NotApplied(STEP_CODE),
    "thread-in-step": NotApplied(STEP_CODE),
    "host-bound": NotApplied(STEP_CODE),
    "device-sync": NotApplied(STEP_CODE),
    "allocator": NotApplied(STEP_CODE),
    "ddp-buckets": NotApplied(ONE_PROCESS),
    "ddp-compress": NotApplied(ONE_PROCESS),
    "mixed-precision": NotApplied(NUMERICS),
    "tf32": NotApplied(NUMERICS),
    "cudnn-benchmark": NotApplied(NUMERICS),
    "channels-last": NotApplied(NUMERICS),
}


def how_to_apply(rec: Recommendation) -> How:
    """How the demo applies ``rec``: a recommendation with overrides goes through them whatever its id."""
    if rec.overrides:
        return ThroughSet()
    how = APPLY.get(rec.id, NotApplied(UNKNOWN))
    return NotApplied(UNKNOWN) if isinstance(how, ThroughSet) else how  # a --set change that carries none


def choose(recs: list[Recommendation], command: list[str]) -> tuple[Recommendation | None,
                                                                    list[tuple[Recommendation, NotApplied]]]:
    """The recommendation the demo measures, the first change in ``recs`` it can apply to ``command``, and the
    changes ranked above it that it cannot, each with why. Advice to change nothing (which ranks first where it
    applies) is no change to measure: passed over without a reason."""
    passed: list[tuple[Recommendation, NotApplied]] = []
    for rec in recs:
        how = how_to_apply(rec)
        if isinstance(how, ScriptFlags) and all(arg in command for arg in how.args):
            how = NotApplied(ALREADY_APPLIED)
        if isinstance(how, NothingToChange):
            continue
        if isinstance(how, NotApplied):
            passed.append((rec, how))
            continue
        return rec, passed
    return None, passed

"""Named bottleneck scenarios of the reference script, and the datasets they need."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from stallscope.demo.dataset import DatasetSpec, demo_dataset

REFERENCE_SCRIPT = Path(__file__).resolve().parent / "reference_train.py"

STANDARD = DatasetSpec()
LARGE = DatasetSpec(n_files=300, width=2000, height=1500, quality_min=90, quality_max=95)


@dataclass(frozen=True)
class Scenario:
    name: str
    expected_verdict: str
    expected_node: str
    args: tuple[str, ...]
    dataset: DatasetSpec = STANDARD
    about: str = ""


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("default", "balanced", "compute", ("--workers", "2", "--threads", "1"),
             about="the standard recipe with 2 workers"),
    Scenario("starved", "input-bound", "transform", ("--workers", "0", "--threads", "1"),
             about="num_workers=0: loading runs inside the training loop (the default)"),
    Scenario("large-images", "input-bound", "decode", ("--workers", "1", "--threads", "1"), dataset=LARGE,
             about="2000x1500 JPEGs decoded by one worker"),
    Scenario("slow-storage", "input-bound", "storage",
             ("--workers", "1", "--storage-latency-ms", "40", "--threads", "1"),
             about="every file read waits 40 ms, like a remote file system"),
    Scenario("heavy-transform", "input-bound", "transform", ("--workers", "1", "--heavy-transform", "--threads", "1"),
             about="blur, rotation and colour jitter on every image"),
    Scenario("compute-bound", "compute-bound", "compute",
             ("--workers", "1", "--model", "big", "--in-memory", "128", "--image-size", "96", "--threads", "1"),
             about="a big CNN on pre-decoded images held in RAM"),
)}


def scenario_command(name: str, extra: list[str] | None = None, progress: bool = False) -> list[str]:
    """The full command line for a scenario, generating (or reusing) its dataset."""
    scenario = SCENARIOS[name]
    data = demo_dataset(scenario.dataset, progress=progress)
    # Enough epochs that --steps, not the dataset's end, stops the run.
    return [sys.executable, str(REFERENCE_SCRIPT), "--data", str(data), "--epochs", "50", *scenario.args,
            *(extra or [])]

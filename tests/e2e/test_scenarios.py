"""Planted bottlenecks of the reference script: the verdict and the limiting node must be right."""

from __future__ import annotations

import sys

import pytest

from stallscope.demo.scenarios import REFERENCE_SCRIPT
from tests.conftest import run_cli

pytestmark = pytest.mark.e2e

# (name, reference-script args, dataset fixture, expected verdict, acceptable limiting nodes)
SCENARIOS = [
    ("starved", ["--workers", "0", "--batch-size", "16"], "image_folder", "input-bound", {"decode", "transform"}),
    ("large-images", ["--workers", "1", "--batch-size", "8"], "large_image_folder", "input-bound", {"decode"}),
    ("slow-storage", ["--workers", "1", "--storage-latency-ms", "40", "--batch-size", "8"], "image_folder",
     "input-bound", {"storage"}),
    ("heavy-transform", ["--workers", "1", "--heavy-transform", "--batch-size", "16"], "image_folder",
     "input-bound", {"transform"}),
    # batches of 8: the big model's step is still all of the time (data wait about 1%) at a quarter of the compute
    ("compute-bound", ["--workers", "1", "--model", "big", "--in-memory", "96", "--image-size", "96",
                       "--batch-size", "8"], "image_folder", "compute-bound", {"compute"}),
]


#: Scenarios whose first advice rests on this machine's spare CPUs: workers for decoding pay only where a core is
#: free for them (under other programs' load a cheaper transform comes first, rightly).
SPARE_CPUS = {"starved"}


@pytest.mark.parametrize("name,args,folder,verdict,nodes",
                         [pytest.param(*s, marks=[pytest.mark.speed] if s[0] in SPARE_CPUS else [], id=s[0])
                          for s in SCENARIOS])
def test_planted_bottleneck_is_found(request, tmp_path, name, args, folder, verdict, nodes):
    data = request.getfixturevalue(folder)
    result = run_cli(tmp_path, ["--steps", "16", "--", sys.executable, str(REFERENCE_SCRIPT), "--data", str(data),
                                "--threads", "1", "--epochs", "20", *args])
    assert result.returncode == 0, result.stderr[-3000:]
    summary = result.summary
    assert summary["verdict"] == verdict, summary["bottleneck"]
    assert summary["bottleneck"]["node"] in nodes, summary["nodes"]
    assert summary["steps"] == 16
    assert summary["ended_by"] == "steps"
    top = summary["recommendations"][0]
    if verdict == "compute-bound":
        assert top["id"] == "no-input-fix"
    else:
        assert top["node"] != "compute"
    if name == "starved":
        assert top["id"] == "num-workers" and top["predicted_speedup"] > 1.2

    train = next(ld for ld in summary["loaders"] if ld["role"] == "train")
    pipeline = train["pipeline"]
    assert pipeline["batches"] >= 16
    if name != "compute-bound":
        # The per-node split accounts for the workers' busy time (acceptance: at least 90%).
        assert pipeline["node_seconds_over_busy"] >= 0.9
        assert sum(pipeline["node_seconds"].values()) == pytest.approx(pipeline["busy_s"], rel=0.1)
    if name in ("starved", "large-images", "heavy-transform"):
        # Time inside instrumented calls (decode, transforms, collate) explains most of it directly.
        assert pipeline["direct_call_fraction"] >= 0.8
        assert any(call.startswith(("Image.", "PIL.")) for call in pipeline["by_call_s"])

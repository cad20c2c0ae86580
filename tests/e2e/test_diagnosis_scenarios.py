"""Planted scenarios of other shapes than the reference script: each must get the right verdict and node.

Together with test_scenarios.py (five reference-script scenarios) this is the diagnosis suite:
text tokenized in Python, samples fetched over HTTP with latency, a dict of hundreds of tensors,
a heavy model, a dataset whose workers' memory grows, batches that travel through file
descriptors from a busy worker, and pitfalls that must fire on evidence.
"""

from __future__ import annotations

import sys

import pytest

from tests.conftest import SCRIPTS, run_cli

pytestmark = pytest.mark.e2e

# (script, args, verdict, acceptable limiting nodes, recommendation id expected first (or ids, any of them) or None)
SCENARIOS = {
    "tokenize-in-process": ("scenario_tokenize.py", ["0"], "input-bound", {"transform"}, "num-workers"),
    # more workers or a batch's requests on threads: each puts more requests in flight, ranked by predicted gain
    "http-latency": ("scenario_http.py", ["2"], "input-bound", {"storage"}, {"num-workers", "requests-in-flight"}),
    "many-tensors-collate": ("scenario_many_tensors.py", ["1"], "input-bound", {"loader"}, None),
    "heavy-model": ("scenario_heavy_model.py", ["1"], "compute-bound", {"compute"}, "no-input-fix"),
    "memory-growth": ("scenario_memory_growth.py", ["1"], "input-bound", {"transform"}, None),
}


#: Scenarios whose first advice rests on this machine's spare CPUs: workers for Python tokenizing pay only where a
#: core is free for them (under other programs' load the dataset's own code comes first, rightly).
SPARE_CPUS = {"tokenize-in-process"}


@pytest.mark.parametrize("name", [pytest.param(name, marks=[pytest.mark.speed] if name in SPARE_CPUS else [])
                                  for name in SCENARIOS])
def test_scenario_diagnosis(tmp_path, name):
    script, args, verdict, nodes, first = SCENARIOS[name]
    steps = "80" if name == "memory-growth" else "30"
    result = run_cli(tmp_path, ["--steps", steps, "--", sys.executable, str(SCRIPTS / script), *args])
    assert result.returncode == 0, result.stderr[-3000:]
    summary = result.summary
    assert summary["verdict"] == verdict, (summary["data_wait_fraction"], summary["nodes"])
    assert summary["bottleneck"]["node"] in nodes, summary["nodes"]
    recs = summary["recommendations"]
    if isinstance(first, set):
        assert recs and recs[0]["id"] in first and first <= {r["id"] for r in recs}, recs
    elif first is not None:
        assert recs and recs[0]["id"] == first, recs
    if verdict == "compute-bound":
        assert all(r["node"] == "compute" for r in recs[:1])
    else:
        assert recs and recs[0]["node"] != "compute"
    assert summary["capacity"]["predicted_samples_per_s"] > 0
    assert summary["system"]["present"] is True
    if name == "memory-growth":
        assert "worker-memory-growth" in {p["id"] for p in summary["pitfalls"]}
    else:
        assert "worker-memory-growth" not in {p["id"] for p in summary["pitfalls"]}


@pytest.mark.speed  # the descriptors' wait (over 15% of a step) and the fix's halving of it are measured
def test_file_descriptor_passing_from_a_busy_worker_is_loader_time(tmp_path):
    """One worker tokenizing in Python answers the training process's fd requests late."""
    result = run_cli(tmp_path, ["--steps", "30", "--", sys.executable, str(SCRIPTS / "scenario_tokenize.py"), "1"])
    assert result.returncode == 0, result.stderr[-3000:]
    summary = result.summary
    waited = summary["receive_s"]["wall"] - summary["receive_s"]["cpu"]
    recs = {r["id"]: r for r in summary["recommendations"]}
    assert "sharing-strategy" in recs, [r["id"] for r in summary["recommendations"]]
    facts = recs["sharing-strategy"]["facts"]
    assert facts["fd_wait_s"] == pytest.approx(waited, abs=1e-3)  # the steady steps' wait beyond unpickling
    assert facts["fd_wait_s"] > 0.15 * facts["step_time_s"]  # over 15% of step time spent on descriptors
    assert recs["sharing-strategy"]["overrides"] == {"sharing_strategy": "file_system"}
    fixed = run_cli(tmp_path, ["--steps", "30", "--set", "sharing_strategy=file_system", "--",
                               sys.executable, str(SCRIPTS / "scenario_tokenize.py"), "1"], json_name="fixed.json")
    assert fixed.summary["loaders"][0]["config"]["sharing_strategy"] == "file_system"
    assert fixed.summary["receive_s"]["wall"] - fixed.summary["receive_s"]["cpu"] < waited / 2


def test_unpinnable_custom_batch_is_flagged(tmp_path):
    result = run_cli(tmp_path, ["--", sys.executable, str(SCRIPTS / "tiny_train.py"), "--workers", "1", "--pin",
                                "--collate", "class", "--sleep-ms", "1"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "unpinnable-batch" in {p["id"] for p in result.summary["pitfalls"]}
    plain = run_cli(tmp_path, ["--", sys.executable, str(SCRIPTS / "tiny_train.py"), "--workers", "1", "--pin"],
                    json_name="plain.json")
    assert "unpinnable-batch" not in {p["id"] for p in plain.summary["pitfalls"]}


def test_lmdb_opened_before_fork_is_flagged(tmp_path):
    lmdb = pytest.importorskip("lmdb")
    script = tmp_path / "lmdb_train.py"
    script.write_text(f"""
import sys
import lmdb
import torch
from torch.utils.data import DataLoader, Dataset

path = {str(tmp_path / "db")!r}
with lmdb.open(path, map_size=1 << 24) as env, env.begin(write=True) as txn:
    for i in range(64):
        txn.put(str(i).encode(), bytes([i % 256]) * 64)

class Eager(Dataset):
    def __init__(self):
        self.env = lmdb.open(path, readonly=True, lock=False)   # opened before the workers fork
    def __len__(self):
        return 64
    def __getitem__(self, i):
        with self.env.begin() as txn:
            return torch.tensor(list(txn.get(str(i).encode())[:4]), dtype=torch.float32)

class Lazy(Eager):
    def __init__(self):
        self.env = None
    def __getitem__(self, i):
        if self.env is None:
            self.env = lmdb.open(path, readonly=True, lock=False)
        return super().__getitem__(i)

data = Eager() if sys.argv[1] == "eager" else Lazy()
loader = DataLoader(data, batch_size=8, num_workers=2, multiprocessing_context="fork")
for batch in loader:
    pass
""")
    assert lmdb is not None
    eager = run_cli(tmp_path, [str(script), "eager"], json_name="eager.json")
    assert eager.returncode == 0, eager.stderr[-3000:]
    assert "lmdb-before-fork" in {p["id"] for p in eager.summary["pitfalls"]}
    lazy = run_cli(tmp_path, [str(script), "lazy"], json_name="lazy.json")
    assert "lmdb-before-fork" not in {p["id"] for p in lazy.summary["pitfalls"]}


@pytest.mark.speed  # the worker count advised rests on the cores free of other programs during the run
def test_short_epochs_price_every_epoch_start_and_keep_the_workers_alive(tmp_path):
    """Eight epochs of six batches without workers: each new epoch would start the workers again and refill their
    queue, so the worker advice keeps them alive and its prediction counts the epoch starts it still pays."""
    result = run_cli(tmp_path, ["--", sys.executable, str(SCRIPTS / "tiny_train.py"), "--workers", "0", "--n", "48",
                                "--batch-size", "8", "--epochs", "8", "--sleep-ms", "4"])
    assert result.returncode == 0, result.stderr[-3000:]
    recs = {r["id"]: r for r in result.summary["recommendations"]}
    assert "num-workers" in recs, list(recs)
    advice = recs["num-workers"]
    assert advice["overrides"]["persistent_workers"] is True and advice["overrides"]["num_workers"] >= 2
    facts = advice["facts"]
    assert facts["epoch_starts"] >= 5 and facts["left_early"] is False  # the sampler ran out: nothing dropped
    assert facts["worker_start_basis"] != "measured" and facts["epoch_start_s"] == 0.0  # estimated; kept alive
    assert facts["epoch_fill_s"] > 0 and advice["predicted_speedup"] < facts["steady_speedup"]
    assert "--set persistent_workers=true" in advice["change"] and "new epochs" in advice["reason"]

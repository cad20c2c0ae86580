"""Loader shapes the recorder must handle: start methods, iterable datasets, samplers, collates, pinning."""

from __future__ import annotations

import multiprocessing

import sys
from pathlib import Path

import pytest

from stallscope.session import Session
from tests.conftest import SCRIPTS, run_cli

pytestmark = pytest.mark.e2e
TINY = str(SCRIPTS / "tiny_train.py")


def _train(summary: dict) -> dict:
    return next(ld for ld in summary["loaders"] if ld["role"] == "train")


@pytest.mark.parametrize("ctx", [c for c in ("fork", "spawn", "forkserver")
                                 if c in multiprocessing.get_all_start_methods()])
def test_workers_are_recorded_under_every_start_method(tmp_path, ctx):
    result = run_cli(tmp_path, ["--", sys.executable, TINY, "--workers", "2", "--ctx", ctx, "--sleep-ms", "1"])
    assert result.returncode == 0, result.stderr[-3000:]
    summary = result.summary
    train = _train(summary)
    assert train["config"]["multiprocessing_context"] == ctx
    pipeline = train["pipeline"]
    assert pipeline["batches"] == 12  # 96 samples / batch 8, every one fetched by a worker
    assert len(pipeline["worker_startup_s"]) == 2 and all(s > 0 for s in pipeline["worker_startup_s"])
    assert summary["steps"] == 12
    session = Session.load(summary["session"])
    worker_pids = {f.pid for f in session.fetches}
    assert len(worker_pids) == 2 and session.main_pid not in worker_pids
    assert {p.role for p in session.processes} >= {"main", "worker"}


def test_iterable_dataset(tmp_path):
    result = run_cli(tmp_path, ["--", sys.executable, TINY, "--workers", "2", "--iterable"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.summary["steps"] == 12
    assert _train(result.summary)["config"]["iterable"] is True


def test_batch_sampler_and_custom_collate(tmp_path):
    result = run_cli(tmp_path, ["--", sys.executable, TINY, "--workers", "1", "--batch-sampler", "--collate", "dict"])
    assert result.returncode == 0, result.stderr[-3000:]
    train = _train(result.summary)
    assert train["config"]["batch_sampler"] == "BatchSampler"
    assert train["config"]["collate_fn"] == "custom_collate"
    assert "collate" in train["pipeline"]["by_call_s"]
    assert result.summary["samples"] == 96


def test_persistent_workers_start_once(tmp_path):
    result = run_cli(tmp_path, ["--", sys.executable, TINY, "--workers", "2", "--persistent", "--epochs", "3"])
    assert result.returncode == 0, result.stderr[-3000:]
    train = _train(result.summary)
    assert train["epochs"] == 3
    assert len(train["pipeline"]["worker_startup_s"]) == 2
    result = run_cli(tmp_path, ["--", sys.executable, TINY, "--workers", "2", "--epochs", "3"])
    assert len(_train(result.summary)["pipeline"]["worker_startup_s"]) == 6


def test_pin_memory_on_cpu_only_machine(tmp_path):
    result = run_cli(tmp_path, ["--", sys.executable, TINY, "--workers", "2", "--pin"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.summary["steps"] == 12
    assert result.summary["nodes"]["transfer"]["seconds"] == 0.0


def test_custom_batch_class(tmp_path):
    result = run_cli(tmp_path, ["--", sys.executable, TINY, "--workers", "2", "--collate", "class"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.summary["steps"] == 12


def test_without_optimizer_batches_are_steps(tmp_path):
    result = run_cli(tmp_path, ["--", sys.executable, TINY, "--no-optimizer", "--workers", "1"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.summary["step_boundary"] == "batch"
    assert result.summary["steps"] == 12
    assert result.summary["verdict"] != "unknown"


def test_train_and_validation_loaders_are_told_apart(tmp_path):
    result = run_cli(tmp_path, ["--", sys.executable, TINY, "--val", "--epochs", "2", "--sleep-ms", "1"])
    assert result.returncode == 0, result.stderr[-3000:]
    roles = {ld["role"]: ld for ld in result.summary["loaders"]}
    assert set(roles) == {"train", "eval"}
    assert roles["train"]["batches"] == 24 and roles["eval"]["batches"] == 8
    assert roles["train"]["site"] != roles["eval"]["site"]
    assert result.summary["steps"] == 24


def test_script_without_dataloader_says_so(tmp_path):
    result = run_cli(tmp_path, [str(SCRIPTS / "no_loader.py"), "3"])
    assert result.returncode == 3
    assert result.summary["verdict"] == "unknown"
    assert any("no torch DataLoader" in note for note in result.summary["notes"])
    assert result.summary["bottleneck"]["node"] is None


def test_module_form_runs(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "trainmod.py").write_text(
        "import torch\nfrom torch.utils.data import DataLoader\n"
        "m = torch.nn.Linear(1, 1); o = torch.optim.Adam(m.parameters())\n"
        "for x in DataLoader(torch.arange(16.).unsqueeze(1), batch_size=4):\n"
        "    o.zero_grad(); m(x).sum().backward(); o.step()\n")
    result = run_cli(tmp_path, ["-m", "pkg.trainmod"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.summary["steps"] == 4


@pytest.mark.parametrize("workers", [0, 1])
def test_a_new_dataloader_every_epoch_counts_every_step(tmp_path, workers):
    """``for epoch ...: for x, y in DataLoader(...)``: 4 loaders from one line are one training loader."""
    result = run_cli(tmp_path, ["--", sys.executable, str(SCRIPTS / "loader_per_epoch.py"), "--workers", str(workers)])
    assert result.returncode == 0, result.stderr[-3000:]
    summary = result.summary
    assert summary["steps"] == 40
    roles = {ld["role"]: ld for ld in summary["loaders"]}
    assert sorted(roles) == ["eval", "train"] and len(summary["loaders"]) == 2
    assert (len(roles["train"]["loader_ids"]), roles["train"]["batches"], roles["train"]["epochs"]) == (4, 40, 4)
    assert (len(roles["eval"]["loader_ids"]), roles["eval"]["batches"]) == (4, 8)
    assert "persistent-workers" not in {r["id"] for r in summary["recommendations"]}


PAIRED = str(SCRIPTS / "paired_loaders.py")


@pytest.mark.speed  # the worker count advised rests on the cores free of other programs during the run
@pytest.mark.parametrize("swap", [False, True])
def test_loaders_fed_together_with_zip_are_diagnosed_by_the_one_the_steps_wait_on(tmp_path, swap):
    """``zip(slow, cheap)``: the cheap loader's batch is the last before each optimizer step, yet the steps wait on the
    slow one. It is the training loader whichever zip asks first, the cheap one is paired, and both loaders' waits are
    the steps' (not left out as a validation loop's, which read this run as compute-bound at 7.9% data wait)."""
    result = run_cli(tmp_path, ["--", sys.executable, PAIRED, *(["--swap"] if swap else [])])
    assert result.returncode == 0, result.stderr[-2000:]
    summary = result.summary
    roles = {ld["site"].rsplit(":", 1)[-1]: ld["role"] for ld in summary["loaders"]}
    source = Path(PAIRED).read_text().splitlines()
    slow_line = str(next(i for i, line in enumerate(source, 1) if "the slow loader's line" in line))
    cheap_line = str(next(i for i, line in enumerate(source, 1) if "the cheap loader's line" in line))
    assert roles == {slow_line: "train", cheap_line: "paired"}
    assert summary["verdict"] == "input-bound" and summary["data_wait_fraction"] > 0.5
    assert summary["steady_steps"] >= 30  # 40 steps, all of them steps (none left out)
    assert summary["recommendations"][0]["overrides"].get("num_workers", 0) >= 1


def test_a_dataset_that_batches_itself_under_batch_size_none_is_costed_per_sample(tmp_path):
    """One fetched item is a batch of 8 samples (WebDataset's ``.batched()``): its 8 sleeps of 2 ms are 2 ms per
    sample, not 16, and the model reproduces the run it was built from (it read an eighth of it: 17 samples/s for a
    measured 137 on a WebDataset pipeline)."""
    result = run_cli(tmp_path, ["--", sys.executable, str(SCRIPTS / "self_batching.py")])
    assert result.returncode == 0, result.stderr[-2000:]
    capacity = result.summary["capacity"]
    assert 1.9 <= capacity["cost_ms_per_sample"]["storage"] < 8.0, capacity
    assert 0.8 < capacity["predicted_samples_per_s"] / capacity["measured_samples_per_s"] < 1.25, capacity

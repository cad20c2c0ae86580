"""Training that runs in a process the launched script starts (a launcher script running ``python train.py``, an
``os.fork`` child, a ``multiprocessing.Process``): that process is the one analysed, and the report says which it
was. And a run whose folder vanishes under the job says its events were lost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from stallscope.settings import ENV_HOME
from tests.conftest import SCRIPTS, run_cli

pytestmark = pytest.mark.e2e
WRAPPER = str(SCRIPTS / "train_in_child.py")
#: tiny_train's 96 samples in batches of 8: 12 optimizer steps an epoch
EPOCHS, STEPS = 4, 48


def _session(summary: dict) -> dict:
    return json.loads(Path(summary["session"]).read_text())


def _launched_pid(session: dict) -> int:
    pids = {p["pid"] for p in session["processes"]}
    return next(p["pid"] for p in session["processes"] if p["role"] == "main" and p["ppid"] not in pids)


def _check_trained_in_child(result, steps: int = STEPS, depth: int = 1) -> dict:
    """The summary analyses the process that made the optimizer steps, and names it."""
    assert result.returncode == 0, result.stderr[-3000:]
    summary = result.summary
    session = _session(summary)
    by_pid = Counter(o["pid"] for o in session["optimizer_steps"])
    trainer = by_pid.most_common(1)[0][0]
    assert trainer != _launched_pid(session)
    workers = {p["pid"] for p in session["processes"] if p["role"] == "worker"}
    assert trainer not in workers
    assert summary["verdict"] != "unknown", summary["notes"]
    assert summary["steps"] == steps
    training = summary["training_process"]
    assert training["pid"] == trainer and training["launched"] is False and training["depth"] == depth
    assert any("tiny_train.py" in word for word in training["argv"]), training
    assert not any("no training step was recorded" in note for note in summary["notes"]), summary["notes"]
    assert not any("killed outright" in note for note in summary["notes"]), summary["notes"]
    assert f"training ran in process {trainer}" in " ".join(result.stderr.split()), result.stderr[-3000:]
    return summary


@pytest.mark.parametrize("how", ["subprocess", "fork", "fork-os-exit", "mp-fork", "mp-spawn"])
def test_training_in_a_child_process_is_the_one_analysed(tmp_path, how):
    result = run_cli(tmp_path, ["--", sys.executable, WRAPPER, how, "--", "--epochs", str(EPOCHS)])
    _check_trained_in_child(result)


def test_training_two_wrappers_down_is_found(tmp_path):
    result = run_cli(tmp_path, ["--", sys.executable, WRAPPER, "subprocess", "--levels", "2", "--",
                                "--epochs", str(EPOCHS)])
    _check_trained_in_child(result, depth=2)


@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_a_training_child_with_dataloader_workers(tmp_path, ctx):
    """The child's DataLoader workers are its workers, never the training process."""
    result = run_cli(tmp_path, ["--", sys.executable, WRAPPER, "subprocess", "--",
                                "--epochs", "2", "--workers", "2", "--ctx", ctx])
    summary = _check_trained_in_child(result, steps=24)
    assert summary["loaders"][0]["pipeline"]["num_workers"] == 2


def test_steps_stops_the_training_child_and_the_report_says_so(tmp_path):
    result = run_cli(tmp_path, ["--steps", "20", "--", sys.executable, WRAPPER, "subprocess", "--",
                                "--epochs", "10"])
    summary = _check_trained_in_child(result, steps=20)
    assert summary["ended_by"] == "steps"
    assert "done" not in result.stdout  # tiny_train was stopped before its own end


def test_the_wrapper_keeps_the_training_childs_exit_code(tmp_path):
    result = run_cli(tmp_path, ["--", sys.executable, WRAPPER, "subprocess", "--", "--epochs", "2",
                                "--exit-code", "3"])
    assert result.returncode == 3 and result.summary["exit_code"] == 3
    assert result.summary["steps"] == 24 and result.summary["training_process"]["launched"] is False


def test_of_two_processes_that_train_the_one_with_most_steps_is_analysed_and_the_other_named(tmp_path):
    result = run_cli(tmp_path, ["--", sys.executable, WRAPPER, "subprocess", "--parent-steps", "5", "--",
                                "--epochs", str(EPOCHS)])
    summary = _check_trained_in_child(result)
    session = _session(summary)
    others = summary["training_process"]["others"]
    assert [(o["pid"], o["steps"]) for o in others] == [(_launched_pid(session), 5)]
    assert f"process {_launched_pid(session)}" in " ".join(result.stderr.split())


def test_a_script_that_trains_itself_is_said_as_launched(tmp_path):
    result = run_cli(tmp_path, ["--", sys.executable, str(SCRIPTS / "tiny_train.py"), "--epochs", "2"])
    assert result.returncode == 0, result.stderr[-3000:]
    training = result.summary["training_process"]
    assert training["launched"] is True and training["depth"] == 0 and training["others"] == []
    assert training["pid"] == _launched_pid(_session(result.summary))
    assert "training ran in process" not in result.stderr


def test_a_script_that_deletes_its_starting_folder_is_said_to_have_lost_its_events(tmp_path):
    """The store is ./.stallscope of the folder the script deletes; DataLoader workers started after it was deleted
    wrote events again (the recorder made the folders anew), which once hid the loss behind "no torch DataLoader
    was created"."""
    start = tmp_path / "job"
    start.mkdir()
    script = tmp_path / "delete_start.py"
    script.write_text(
        "import os, shutil\nimport torch\nfrom torch.utils.data import DataLoader, TensorDataset\n"
        "here = os.getcwd()\n"
        "loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.zeros(64)), batch_size=8, num_workers=2)\n"
        "model = torch.nn.Linear(4, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for epoch in range(3):\n"
        "    for step, (x, y) in enumerate(loader):\n"
        "        if epoch == 0 and step == 4:\n"
        "            shutil.rmtree(here)\n"
        "        loss = (model(x).squeeze(1) - y).pow(2).mean()\n"
        "        opt.zero_grad(); loss.backward(); opt.step()\n")
    out = tmp_path / "summary.json"
    proc = subprocess.run([sys.executable, "-m", "stallscope", "run", "--json", str(out), "--", sys.executable,
                           str(script)], capture_output=True, text=True, timeout=240, cwd=start, check=False,
                          env={k: v for k, v in os.environ.items() if k != ENV_HOME})
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = " ".join(proc.stderr.split())
    assert "the run's folder was removed while the job ran" in said, said[-3000:]
    assert "no torch DataLoader was created" not in said
    summary = json.loads(out.read_text())
    assert any(note.startswith("the run's folder was removed while the job ran") for note in summary["notes"])
    assert not any("no torch DataLoader" in note for note in summary["notes"]), summary["notes"]
    assert not start.exists()  # the folder the script deleted stays deleted: neither workers nor the save make it again
    assert "the session was not saved" in said

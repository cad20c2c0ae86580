"""``stallscope plan`` on a real recorded run: the table, the JSON contract, and clear refusals."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SCRIPTS, run_cli

pytestmark = pytest.mark.e2e


def plan(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stallscope", "plan", "--store", str(tmp_path / "store"), *args],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("plan")
    done = run_cli(where, ["--", sys.executable, str(SCRIPTS / "tiny_train.py"), "--n", "480", "--sleep-ms", "2"])
    assert done.returncode == 0, done.stderr
    return where


def test_plan_projects_the_run_to_a_machine_with_gpus(recorded):
    out = recorded / "plan.json"
    done = plan(recorded, "last", "--cores", "16", "--gpus", "2", "--step-ms", "5", "--workers", "3",
                "--json", str(out))
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    assert doc["schema"] == "stallscope.plan/1"
    assert doc["target"] == {"cores": 16.0, "gpus": 2, "step_ms": 5.0, "samples_per_s": None, "workers": 3,
                             "cores_per_process": 8.0, "processes": 2, "threads_per_core": 1.0}
    assert doc["recorded"]["workers"] == 0 and doc["recorded"]["samples_per_step"] == 8.0
    rows = {r["workers"]: r for r in doc["rows"]}
    assert set(rows) == set(range(len(rows))) and len(rows) >= 8
    # The dataset sleeps 2 ms per sample (blocked, overlapping across workers): more workers, more samples/s.
    assert rows[2]["samples_per_s"] > rows[1]["samples_per_s"] > rows[0]["samples_per_s"]
    assert doc["at_workers"] == rows[3]
    assert doc["saturates_first"] == "storage"
    needed = doc["workers_needed_per_process"]
    assert needed is None or rows[needed]["data_wait_fraction"] <= 0.05
    # The 0-worker run measured at exit what shared memory would cost its batches with workers.
    assert any("0 workers" in a and "measured at exit" in a for a in doc["assumptions"])
    # The terminal table says the same.
    assert "workers" in done.stdout and "assumptions" in done.stdout and "3 (asked)" in done.stdout


def test_plan_json_to_stdout_is_the_document_alone(recorded):
    done = plan(recorded, "last", "--cores", "4", "--json", "-")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["target"]["gpus"] == 0 and doc["target"]["cores_per_process"] == 4.0


@pytest.mark.parametrize("args, message", [
    (["last", "--cores", "0"], "--cores must be a positive number"),
    (["last", "--step-ms", "-3"], "--step-ms must be a positive number"),
    (["last", "--threads-per-core", "0"], "--threads-per-core must be between 1 and 8"),
    (["no-such-run"], "no run 'no-such-run'"),
])
def test_bad_input_is_one_line_and_exit_2(recorded, args, message):
    done = plan(recorded, *args)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr


def test_a_run_without_a_dataloader_cannot_be_planned(tmp_path):
    done = run_cli(tmp_path, ["--", sys.executable, str(SCRIPTS / "no_loader.py")])
    assert done.returncode == 0, done.stderr
    result = plan(tmp_path, "last")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "no steady training steps fed by a DataLoader" in result.stderr


def test_a_run_of_a_few_steps_is_said_to_be_too_short_by_report_and_plan(tmp_path):
    done = run_cli(tmp_path, ["--steps", "6", "--", sys.executable, str(SCRIPTS / "tiny_train.py"), "--n", "480",
                              "--sleep-ms", "2"])
    assert done.returncode == 0, done.stderr
    assert any(n.startswith("fewer than 10 steady steps were measured") for n in done.summary["notes"]), \
        done.summary["notes"]
    assert "fewer than 10 steady steps were measured" in done.stderr
    planned = plan(tmp_path, "last", "--cores", "4", "--json", "-")
    assert planned.returncode == 0, planned.stderr
    doc = json.loads(planned.stdout)
    assert doc["recorded"]["steady_steps"] < 10
    assert "too few for these figures to act on" in doc["assumptions"][0]


def test_a_run_that_crashed_is_said_at_the_top_of_its_plan(tmp_path):
    """From the tester: a plan from a crashed run printed its prediction and said nothing of the crash."""
    done = run_cli(tmp_path, ["--", sys.executable, str(SCRIPTS / "tiny_train.py"), "--n", "480", "--sleep-ms", "2",
                              "--crash-main-at", "40"])
    assert done.returncode == 1, done.stderr
    planned = plan(tmp_path, "last", "--cores", "4", "--json", "-")
    assert planned.returncode == 0, planned.stderr
    doc = json.loads(planned.stdout)
    (crash,) = [c for c in doc["cautions"] if c.startswith("the recorded run did not end as the training would")]
    assert "in the script" in crash and f"its {doc['recorded']['steady_steps']} steady step(s) before that" in crash
    assert crash in doc["assumptions"]
    shown = plan(tmp_path, "last", "--cores", "4")
    flat = " ".join(shown.stdout.split())
    assert "note: the recorded run did not end as the training would" in flat
    assert flat.count("the recorded run did not end as the training would") == 1  # not again under assumptions

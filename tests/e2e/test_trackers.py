"""Results sent to real local tracker back ends and read back with each tracker's own reader (issue 19, item 4):
an MLflow SQLite store (MlflowClient), TensorBoard event files (EventAccumulator) and a W&B offline run
(``wandb leet inspect``, W&B's reader of its .wandb log). Nothing reaches a network. Each test is skipped
where its tracker is not installed (they are extras: stallscope[mlflow], [wandb], [tensorboard])."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stallscope.trackers.metrics import flat_metrics, tags
from tests.conftest import SCRIPTS, run_cli

pytestmark = pytest.mark.e2e

FILES = {"stallscope-summary.json", "stallscope-report.html"}


def _tracker_job(tracker: str, where: str) -> list[str]:
    return ["--log-to", tracker, "--quiet", "--", sys.executable, str(SCRIPTS / "tracker_job.py"),
            "--tracker", tracker, "--where", where]


def _script_run_id(stdout: str) -> str:
    return re.search(r"tracker run (\S+)", stdout).group(1)


def _no_network_env(tmp_path: Path) -> dict[str, str]:
    """W&B offline, silent, with every folder it writes under tmp_path; MLflow never asked for a server."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_"))}
    env.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DISABLE_GIT="true", WANDB_DISABLE_CODE="true",
               WANDB_DIR=str(tmp_path / "wb"), WANDB_CACHE_DIR=str(tmp_path / "wbcache"),
               WANDB_CONFIG_DIR=str(tmp_path / "wbconfig"), WANDB_DATA_DIR=str(tmp_path / "wbdata"),
               MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'default-mlflow.db'}")
    return env


def _cli(tmp_path: Path, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stallscope", *args], check=False, capture_output=True, text=True,
                          timeout=240, cwd=tmp_path, env=env)


def _mlflow_run(uri: str, run_id: str):
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    run = client.get_run(run_id)
    artifacts = {Path(a.path).name for a in client.list_artifacts(run_id, "stallscope")}
    return run, artifacts


def test_mlflow_results_go_to_the_scripts_own_active_run(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    pytest.importorskip("sqlalchemy")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'elsewhere.db'}")  # the script's wins
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = run_cli(tmp_path, _tracker_job("mlflow", uri))
    assert result.returncode == 0, result.stderr[-3000:]
    run_id = _script_run_id(result.stdout)
    assert f"logged to MLflow run {run_id} (the script's own) at {uri}" in result.stderr
    run, artifacts = _mlflow_run(uri, run_id)
    expected = flat_metrics(result.summary)
    assert {k: v for k, v in run.data.metrics.items() if k.startswith("stallscope/")} == expected
    assert "loss" in run.data.metrics  # the script's own metric, in the same run
    assert len(expected) >= 10 and expected["stallscope/steps_per_s"] > 0
    assert {k: v for k, v in run.data.tags.items() if k.startswith("stallscope/")} == tags(result.summary)
    assert artifacts == FILES
    assert not (tmp_path / "elsewhere.db").exists()


def test_tensorboard_events_land_in_the_scripts_summary_writer_folder(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log_dir = tmp_path / "tb" / "exp1"
    result = run_cli(tmp_path, _tracker_job("tensorboard", str(log_dir)))
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"logged to TensorBoard log dir {log_dir} (the script's own)" in result.stderr
    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    expected = flat_metrics(result.summary)
    scalars = {tag: events.Scalars(tag)[-1] for tag in events.Tags()["scalars"]}
    assert "loss" in scalars  # the script's own scalars: one TensorBoard run
    ours = {tag: event for tag, event in scalars.items() if tag.startswith("stallscope/")}
    assert set(ours) == set(expected)
    for tag, event in ours.items():
        assert event.value == pytest.approx(expected[tag], rel=1e-6) and event.step == result.summary["steps"]
    texts = {tag.removesuffix("/text_summary"): events.Tensors(tag)[-1].tensor_proto.string_val[0].decode()
             for tag in events.Tags()["tensors"]}
    assert texts == tags(result.summary)
    assert FILES <= {p.name for p in log_dir.iterdir()}
    saved = json.loads((log_dir / "stallscope-summary.json").read_text())
    assert saved["run_id"] == result.summary["run_id"] and saved["verdict"] == result.summary["verdict"]


def _wandb_inspect(run_dir: Path, env: dict[str, str]) -> dict:
    """W&B's own reader of an offline run's .wandb log: state, summary, config and tags."""
    wandb_cli = Path(sys.executable).with_name("wandb")
    done = subprocess.run([str(wandb_cli), "leet", "inspect", "--summary", "--json", str(run_dir)],
                          check=False, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_wandb_offline_run_of_the_script_is_resumed_and_read_back(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    env = _no_network_env(tmp_path)
    for key in [k for k in os.environ if k.startswith(("WANDB_", "MLFLOW_"))]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        if key.startswith("WANDB_"):
            monkeypatch.setenv(key, value)
    result = run_cli(tmp_path, _tracker_job("wandb", str(tmp_path / "wb")), timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    run_id = _script_run_id(result.stdout)
    assert f"logged to W&B run {run_id} (the script's own, offline)" in result.stderr
    ours = [p.parent.parent for p in (tmp_path / "wb" / "wandb").glob(f"offline-run-*-{run_id}/files/"
                                                                        "stallscope-summary.json")]
    assert len(ours) == 1, list((tmp_path / "wb" / "wandb").iterdir())
    assert FILES <= {p.name for p in (ours[0] / "files").iterdir()}
    read = _wandb_inspect(ours[0], env)
    assert read["run_id"] == run_id and read["project"] == "tracker-job" and read["state"] == "finished"
    assert {k: v for k, v in read["summary"].items() if k.startswith("stallscope/")} == pytest.approx(
        flat_metrics(result.summary))
    assert read["config"] == {**read["config"], **tags(result.summary)}
    summary_tags = tags(result.summary)
    assert set(read["tags"]) == {f"verdict:{summary_tags['stallscope/verdict']}",
                                 f"bottleneck:{summary_tags['stallscope/bottleneck']}"}


def test_export_last_to_mlflow_makes_a_run_where_mlflow_points(tmp_path):
    pytest.importorskip("mlflow")
    pytest.importorskip("sqlalchemy")
    result = run_cli(tmp_path, ["--quiet", "--", sys.executable, str(SCRIPTS / "tiny_train.py"), "--n", "64"])
    assert result.returncode == 0, result.stderr[-3000:]
    env = _no_network_env(tmp_path)
    done = _cli(tmp_path, ["export", "last", "--to", "mlflow", "--store", str(tmp_path / "store")], env)
    assert done.returncode == 0, done.stderr[-3000:]
    match = re.search(r"logged run (\S+) to MLflow run (\w+) \(new\) at (\S+)", done.stdout)
    assert match and match.group(1) == result.summary["run_id"], done.stdout
    assert match.group(3) == env["MLFLOW_TRACKING_URI"]
    run, artifacts = _mlflow_run(match.group(3), match.group(2))
    assert run.data.metrics == flat_metrics(result.summary)
    assert {k: v for k, v in run.data.tags.items() if k.startswith("stallscope/")} == tags(result.summary)
    assert run.info.status == "FINISHED" and run.info.run_name == f"stallscope-{result.summary['run_id']}"
    assert artifacts == FILES


def test_export_to_tensorboard_dir_and_wrong_options_are_one_line(tmp_path):
    pytest.importorskip("tensorboard")
    result = run_cli(tmp_path, ["--quiet", "--", sys.executable, str(SCRIPTS / "tiny_train.py"), "--n", "32"])
    assert result.returncode == 0, result.stderr[-3000:]
    env = _no_network_env(tmp_path)
    store = ["--store", str(tmp_path / "store")]
    done = _cli(tmp_path, ["export", "--to", "tensorboard", *store], env)  # no folder given: the default one
    default = tmp_path / "runs" / "stallscope" / result.summary["run_id"]
    assert done.returncode == 0 and f"TensorBoard log dir {default}" in done.stdout, done.stderr
    assert FILES <= {p.name for p in default.iterdir()} and list(default.glob("events.out.tfevents.*"))
    wrong = _cli(tmp_path, ["export", "--to", "tensorboard", "--uri", "sqlite:///x.db", *store], env)
    assert wrong.returncode == 2
    assert wrong.stderr.strip().splitlines() == ["stallscope export: --uri goes with --to mlflow, not --to tensorboard"]


def test_a_tracker_that_fails_after_the_run_leaves_the_scripts_exit_code(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "nosuchscheme://nowhere")
    result = run_cli(tmp_path, ["--log-to", "mlflow", "--quiet", "--", sys.executable, str(SCRIPTS / "tiny_train.py"),
                                "--n", "32", "--exit-code", "3"])
    assert result.returncode == 3 and result.summary is not None
    warnings = [line for line in result.stderr.splitlines() if line.startswith("stallscope run:")]
    assert len(warnings) == 1 and warnings[0].startswith("stallscope run: warning: could not log to mlflow: ")
    assert "Traceback" not in result.stderr


BLOCKED = ("import sys\nsys.modules['mlflow'] = None  # as if the mlflow extra were not installed\n"
           "from stallscope.cli.main import main\nsys.exit(main(sys.argv[1:]))\n")


def test_a_missing_tracker_library_is_one_line_and_exit_2(tmp_path):
    session = next((Path(__file__).parent.parent / "data" / "summaries").glob("*/session.json"))
    done = subprocess.run([sys.executable, "-c", BLOCKED, "export", str(session), "--to", "mlflow"],
                          check=False, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "stallscope export: --to mlflow needs mlflow; install it with: pip install 'stallscope[mlflow]'"]
    marker = tmp_path / "ran"
    done = subprocess.run([sys.executable, "-c", BLOCKED, "run", "--log-to", "mlflow", "--store", str(tmp_path / "s"),
                           "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
                          check=False, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2 and not marker.exists()  # refused before the script starts
    assert done.stderr.strip().splitlines() == [
        "stallscope run: --log-to mlflow needs mlflow; install it with: pip install 'stallscope[mlflow]'"]


@pytest.mark.parametrize("tracker", ["tensorboard", "wandb"])
def test_a_tracker_writing_to_a_full_disk_is_one_line_not_its_threads_tracebacks(tmp_path, tracker):
    """TensorBoard's event-file thread and W&B's loggers printed their own tracebacks (W&B: 650 lines) on a full
    disk before the export's one-line error."""
    pytest.importorskip(tracker)
    from tests.conftest import on_a_small_disk

    full = tmp_path / "full"
    result = run_cli(tmp_path, ["--quiet", "--", sys.executable, str(SCRIPTS / "tiny_train.py"), "--n", "32"])
    assert result.returncode == 0, result.stderr[-3000:]
    env = _no_network_env(tmp_path)
    env["WANDB_DIR"] = str(full / "wb")
    where = ["--dir", str(full / "tb")] if tracker == "tensorboard" else []
    export = [sys.executable, "-m", "stallscope", "export", "last", "--to", tracker, *where,
              "--store", str(tmp_path / "store")]
    done = on_a_small_disk(tmp_path, full, " ".join(f"'{part}'" for part in export), fill=True, env=env)
    assert done.returncode == 1, done.stderr[-3000:]
    assert done.stderr.strip().splitlines() == [
        f"stallscope export: could not log to {tracker}: OSError: [Errno 28] No space left on device"]

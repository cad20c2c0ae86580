"""MLflow: the script's own run when it started one, else a new run where MLflow's settings point.

Logging goes through ``MlflowClient`` with an explicit run id, which works on a run that has already
finished (the script's run ended with the script) and leaves no active run in this process.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from stallscope.session import Session
from stallscope.trackers import metrics, script_run


def require() -> None:
    import mlflow  # noqa: F401 - ImportError here is the caller's "install stallscope[mlflow]"


def absolute_uri(uri: str, cwd: str) -> str:
    """A local store URI relative to the script's working folder, made absolute so logging from another
    folder (``stallscope export``) finds the same store. Server URIs are returned as they are."""
    if uri.startswith("sqlite:///"):
        path = uri[len("sqlite:///"):]
        if path and not path.startswith("/") and path != ":memory:":
            return "sqlite:///" + str(Path(cwd, path).resolve())
        return uri
    if uri.startswith("file:") and not uri.startswith("file://"):
        path = uri[len("file:"):]
        return uri if path.startswith("/") else Path(cwd, path).resolve().as_uri()
    if ":" not in uri and uri != "databricks" and not os.path.isabs(uri):  # a bare folder: MLflow's file store
        return str(Path(cwd, uri).resolve())
    return uri


#: Seconds to wait for an MLflow server to accept a connection before giving up on it.
CONNECT_TIMEOUT_S = 5.0


class UnreachableServer(ConnectionError):
    """The tracking URI names a server that does not accept connections."""


def check_reachable(uri: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Fail at once where an http(s) tracking server does not accept a connection. MLflow's client retries every
    request with back-off for minutes (made for servers that rate-limit), so an export to a server that is down
    or a mistyped port would sit silent for about four minutes; a refused or timed-out connection is not a rate
    limit. Other URIs (files, databases, databricks) are left to MLflow."""
    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise UnreachableServer(f"the MLflow tracking URI {uri} has an invalid port") from None
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout_s):
            pass
    except OSError as exc:
        reason = (f"no answer within {timeout_s:g} s" if isinstance(exc, TimeoutError)
                  else (exc.strerror or type(exc).__name__).lower())
        raise UnreachableServer(f"the MLflow server at {uri} does not accept connections ({reason}); is it running, "
                                f"and is that its address?") from None


def _experiment_id(client: Any) -> str:
    """The experiment a new run goes to: ``MLFLOW_EXPERIMENT_ID``, ``MLFLOW_EXPERIMENT_NAME`` (made when
    missing), else MLflow's default experiment."""
    if os.environ.get("MLFLOW_EXPERIMENT_ID"):
        return os.environ["MLFLOW_EXPERIMENT_ID"]
    name = os.environ.get("MLFLOW_EXPERIMENT_NAME")
    if name:
        found = client.get_experiment_by_name(name)
        return found.experiment_id if found is not None else client.create_experiment(name)
    return "0"


def log(summary: dict[str, Any], session: Session, files: list[Path], *, uri: str | None = None) -> str:
    import mlflow
    from mlflow import MlflowClient
    from mlflow.entities import Metric, RunTag

    logging.getLogger("mlflow").setLevel(logging.WARNING)  # keep store migrations' INFO lines off the output
    script = script_run(session, "mlflow")
    script_uri = absolute_uri(script["uri"], script.get("cwd") or session.cwd) if script else None
    attach = script is not None and (uri is None or absolute_uri(uri, os.getcwd()) == script_uri)
    tracking_uri = script_uri if attach and script_uri is not None else (uri or mlflow.get_tracking_uri())
    check_reachable(tracking_uri)
    client = MlflowClient(tracking_uri=tracking_uri)
    tags = metrics.tags(summary)
    if attach:
        assert script is not None
        run_id = script["run_id"]
    else:
        run_id = client.create_run(_experiment_id(client), run_name=f"stallscope-{session.run_id}",
                                   tags=tags).info.run_id
    when_ms = int((session.started_wall + session.wall_s) * 1000)
    step = int(summary.get("steps") or 0)
    client.log_batch(run_id, metrics=[Metric(k, v, when_ms, step) for k, v in metrics.flat_metrics(summary).items()],
                     tags=[RunTag(k, v) for k, v in tags.items()])
    for path in files:
        client.log_artifact(run_id, str(path), artifact_path="stallscope")
    if not attach:
        client.set_terminated(run_id, status="FINISHED" if session.exit_code == 0 else "FAILED")
    whose = "the script's own" if attach else "new"
    return f"MLflow run {run_id} ({whose}) at {tracking_uri}"

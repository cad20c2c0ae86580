"""``stallscope.run(...)`` from Python: the same recording, analysis, summary and history as the CLI's."""

from __future__ import annotations

import json
import sys

import pytest

import stallscope
from stallscope.analysis import analyze
from stallscope.history.store import get_run, list_runs
from stallscope.render.summary import summary_dict
from stallscope.session import Session
from tests.conftest import SCRIPTS, run_cli

pytestmark = pytest.mark.e2e
TINY = str(SCRIPTS / "tiny_train.py")


def test_library_run_returns_the_summary_and_writes_history(tmp_path):
    store = tmp_path / "store"
    with open(tmp_path / "out.txt", "w") as out:
        result = stallscope.run([sys.executable, TINY, "--sleep-ms", "2"], store=store, max_steps=12,
                                overrides={"num_workers": 1}, stdout=out, stderr=out)
    assert result.exit_code == 0 and result.history_error is None
    assert result.summary["steps"] == 12 and result.summary["overrides"] == {"num_workers": 1}
    assert result.summary["session"] == str(result.session_path)
    assert result.verdict == result.summary["verdict"] == result.analysis.verdict
    # what it returns is what the saved session gives when analysed again (what `report` prints)
    again = Session.load(result.session_path)
    assert json.dumps(summary_dict(again, analyze(again), result.session_path), sort_keys=True) == \
        json.dumps(result.summary, sort_keys=True)
    row = get_run(store, result.session.run_id)
    assert row.verdict == result.analysis.verdict and row.steady_steps == result.summary["steady_steps"]

    cli = run_cli(tmp_path, ["--steps", "12", "--set", "num_workers=1", "--", sys.executable, TINY, "--sleep-ms", "2"])
    assert cli.returncode == 0, cli.stderr[-2000:]
    assert set(cli.summary) == set(result.summary)
    assert [r.run_id for r in list_runs(store)] == [result.session.run_id, cli.summary["run_id"]]

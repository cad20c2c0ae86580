"""``with stallscope.record() as rec:`` in the training process itself (a notebook's way): the same diagnosis
as ``stallscope run`` on the same loop, workers recorded under fork and spawn, exceptions passed on, each
block its own session, and nothing left behind in the process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stallscope.history.store import list_runs
from stallscope.session import Session
from tests.conftest import SCRIPTS, run_cli

pytestmark = pytest.mark.e2e
JOB = str(SCRIPTS / "inprocess_job.py")


def in_process(tmp_path: Path, *args: str, out: str = "inprocess.json") -> dict:
    done = subprocess.run([sys.executable, JOB, *args, "--inprocess", str(tmp_path / out),
                           "--store", str(tmp_path / "store")], check=False, capture_output=True, text=True,
                          timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((tmp_path / out).read_text())


@pytest.mark.speed  # two runs' shares of step time, about 1 s of steady steps each, agree within 5 points
@pytest.mark.parametrize(("workers", "ctx"), [(1, "fork"), (1, "spawn"), (0, "fork")])
def test_the_same_diagnosis_as_stallscope_run(tmp_path, workers, ctx):
    job = ["--workers", str(workers), "--ctx", ctx]
    launched = run_cli(tmp_path, ["--", sys.executable, JOB, *job])
    assert launched.returncode == 0, launched.stderr[-3000:]
    result = in_process(tmp_path, *job)
    a, b = launched.summary, result["summary"]

    assert b["schema"] == "stallscope.summary/1" and set(b) == set(a)
    assert b["exit_code"] == 0 and b["steps"] == a["steps"] == 32
    assert b["verdict"] == a["verdict"] == "input-bound"
    assert b["bottleneck"]["node"] == a["bottleneck"]["node"]
    shares = {node: (a["nodes"][node]["share"], b["nodes"][node]["share"]) for node in a["nodes"]}
    assert all(abs(x - y) <= 0.05 for x, y in shares.values()), shares
    # the recorder changed nothing the loop computed, and left the environment as it found it
    assert f"loss {result['loss']:.6f}" in launched.stdout and result["loss"] == result["plain_loss"]
    assert result["environ_unchanged"]

    pipeline = b["loaders"][0]["pipeline"]
    if workers:  # the workers' own records are in the session: their start, their busy time
        assert pipeline["num_workers"] == workers and len(pipeline["worker_startup_s"]) == workers
        assert pipeline["busy_s"] > 0 and b["loaders"][0]["config"]["multiprocessing_context"] == ctx
        session = Session.load(b["session"])
        assert sum(p.role == "worker" for p in session.processes) == workers
        assert len({f.pid for f in session.fetches}) == workers
    saved = Path(b["session"])
    assert saved.is_file() and saved.parent.parent.parent == tmp_path / "store"
    assert b["run_id"] in [row.run_id for row in list_runs(tmp_path / "store")]


def test_an_exception_in_the_block_goes_on_unchanged_and_the_session_is_saved(tmp_path):
    result = in_process(tmp_path, "--workers", "1", "--raise")
    summary = result["summary"]
    assert result["propagated_same"] and result["environ_unchanged"]
    assert summary["exit_code"] == 1 and summary["steps"] == 8
    assert summary["failure"]["type"] == "ValueError" and "planted <b>failure</b>" in summary["failure"]["message"]
    assert Path(summary["session"]).is_file()
    assert summary["run_id"] in [row.run_id for row in list_runs(tmp_path / "store")]
    # the notebook view: the verdict, and the exception's text escaped, never markup
    html = result["html"]
    assert summary["verdict"] in html and "planted &lt;b&gt;failure&lt;/b&gt; &amp; [red]" in html
    assert "<b>failure" not in html


def test_two_blocks_are_two_sessions_and_what_follows_is_not_recorded(tmp_path):
    result = in_process(tmp_path, "--workers", "1", "--twice")
    first, second = result["summaries"]
    assert first["run_id"] != second["run_id"]
    assert (first["steps"], second["steps"]) == (16, 8)  # 128 and 64 samples of 8: the blocks' own loops only
    for summary in (first, second):
        assert summary["verdict"] == "input-bound" and summary["loaders"][0]["pipeline"]["batches"] == summary["steps"]
    # training after the blocks wrote nothing into either run (no events folder made again)
    assert result["run_dirs_after"] == [["run.json", "session.json"]] * 2
    assert result["environ_unchanged"]
    rows = list_runs(tmp_path / "store")
    assert [r.run_id for r in rows] == [first["run_id"], second["run_id"]]
    assert [r.command for r in rows] == [["<in-process>", "first"], ["<in-process>", "second"]]


CELL_MAGIC = """
import json, sys
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
shell.run_line_magic("load_ext", "stallscope")
cell = '''%%stallscope --store {store} --label notebook
import sys
sys.path.insert(0, {scripts!r})
import argparse, inprocess_job
inprocess_job.train(argparse.Namespace(workers=0, ctx="fork", work=2000), 64)
'''
rec = shell.run_cell(cell).result
failed = shell.run_cell(cell.replace("64)", "64); 1 / 0")).result
print(json.dumps({{"verdict": rec.verdict, "steps": rec.summary()["steps"], "html": rec._repr_html_(),
                  "failed": [failed.exit_code, failed.summary()["failure"]["type"]]}}))
"""


def test_the_cell_magic_records_a_cell(tmp_path):
    pytest.importorskip("IPython")
    code = CELL_MAGIC.format(store=tmp_path / "store", scripts=str(SCRIPTS))
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["steps"] == 8 and result["verdict"] in result["html"]
    assert result["failed"] == [1, "ZeroDivisionError"]
    assert [r.command for r in list_runs(tmp_path / "store")] == [["<in-process>", "notebook"]] * 2


def test_a_block_inside_a_recorded_block_is_refused(tmp_path):
    code = textwrap.dedent(f"""
        import stallscope
        with stallscope.record(store={str(tmp_path / 'store')!r}) as outer:
            try:
                with stallscope.record():
                    pass
            except stallscope.inprocess.RecordingError as exc:
                print("refused:", exc)
        print(outer.exit_code)
        """)
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "refused: this process is being recorded already" in done.stdout and done.stdout.endswith("0\n")

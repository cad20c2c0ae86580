"""A full disk costs the saved session, never the script's exit code or the summary (issue 18, case 5).

Two ways: a real full file system (a 16 MiB tmpfs in a private mount namespace, where the machine
allows mounting one), and a simulated ENOSPC from the session save (always). Then what each verb says on a
real full disk: the history names it and the full disk (never SQLite's "no such table"), tune and bench name the
store, a tune trial says its summary was lost and why, and a --json file that could not be written is an error line.
"""

from __future__ import annotations

import errno
import json
import os
import sys

import pytest

from stallscope import api
from tests.conftest import SCRIPTS, on_a_small_disk

FILL = str(SCRIPTS / "fill_disk.py")


def test_a_disk_that_fills_during_training_keeps_the_exit_code_and_prints_the_summary(tmp_path):
    store = tmp_path / "store"
    out, rebuilt, leftovers = tmp_path / "summary.json", tmp_path / "rebuilt.json", tmp_path / "leftovers.txt"
    py = sys.executable
    done = on_a_small_disk(tmp_path, store, size="16m", commands=(
        f"FILL_DIR={store} {py} -m stallscope run --store {store} --json {out} -- {py} {FILL}; "
        f"echo $? > {tmp_path / 'rc'}; "
        f"(find {store} -name '*.tmp' | wc -l; ls {store}/runs/*/events | wc -l) > {leftovers}; "
        f"rm {store}/filler && {py} -m stallscope report {store}/runs/* --json {rebuilt} > /dev/null"))
    assert (tmp_path / "rc").read_text().strip() == "3", done.stderr[-3000:]  # the script's own exit code
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "could not be saved" in done.stderr and "the disk is full" in done.stderr  # the summary, from memory
    assert "verdict:" in done.stderr
    summary = json.loads(out.read_text())  # written outside the full disk
    assert summary["exit_code"] == 3 and summary["session"] is None and summary["steps"] == 30
    notes = " ".join(summary["notes"])
    assert "the disk is full" in notes and "stallscope report" in notes
    tmp_files, event_files = (int(n) for n in leftovers.read_text().split())
    assert tmp_files == 0, "a partial file was left on the full disk"
    assert event_files >= 1, "the raw events are kept to rebuild the session"
    # Once there is room again, report rebuilds the session from the kept raw events.
    assert done.returncode == 0, done.stderr[-3000:]
    again = json.loads(rebuilt.read_text())
    assert again["ended_by"] == "recovered" and again["steps"] == 30
    # the script's own code, kept by the launcher in space reserved at the start (it used to be inferred: 137)
    assert again["exit_code"] == 3 and any("the one stallscope recorded" in n for n in again["notes"])


def test_a_session_save_that_fails_with_enospc_is_a_note_not_a_crash(tmp_path, monkeypatch):
    from stallscope import paths

    real_fdopen = os.fdopen

    class HalfWritten:
        """The session's temporary file: part of it reaches the disk, then the disk is full."""

        def __init__(self, fh):
            self.fh = fh

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

        def write(self, data):
            self.fh.write(data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")

    def full_disk(fd, *args, **kwargs):
        fh = real_fdopen(fd, *args, **kwargs)
        return HalfWritten(fh) if ".session.json." in os.readlink(f"/proc/self/fd/{fd}") else fh

    monkeypatch.setattr(paths.os, "fdopen", full_disk)
    script = tmp_path / "t.py"
    script.write_text("import sys\nfrom torch.utils.data import DataLoader\n"
                      "for b in DataLoader(list(range(20)), batch_size=2):\n    pass\nsys.exit(5)\n")
    result = api.run([sys.executable, str(script)], store=tmp_path / "store")
    assert result.exit_code == 5 and result.summary["exit_code"] == 5
    assert result.session_path is None and result.summary["session"] is None
    assert result.summary["steps"] == 10
    assert "the disk is full" in (result.history_error or "")
    [run_dir] = list((tmp_path / "store" / "runs").iterdir())
    assert not list(run_dir.glob("*.tmp")) and not (run_dir / "session.json").exists()
    assert any("could not be saved" in n and "the disk is full" in n for n in result.summary["notes"])
    # what was measured is kept (folded as the run went, or raw) and rebuilds the same run
    from stallscope.collect import recover_session
    from stallscope.render.summary import summary_dict

    rebuilt = recover_session(run_dir)
    assert summary_dict(rebuilt, api.analyze(rebuilt), None)["steps"] == 10 and rebuilt.exit_code == 5


def test_a_history_the_full_disk_never_let_be_written_says_the_disk_is_full(tmp_path):
    """The session fits on the nearly full disk but the history's database does not: SQLite says "disk I/O error"
    (its -shm index cannot grow) and leaves a file without tables, which `history` then read as "no such table:
    schema_version". Both say the disk holding the history is full, naming it."""
    store = tmp_path / "store"
    py = sys.executable
    done = on_a_small_disk(tmp_path, store, commands=(
        f"FILL_DIR={store} {py} -m stallscope run --quiet --store {store} --json {tmp_path / 's.json'} -- {py} "
        f"{FILL} --workers 0 --leave-room {48 * 1024} --exit-code 0 2> {tmp_path / 'run.err'}; "
        f"echo $? > {tmp_path / 'run.rc'}; {py} -m stallscope history "
        f"--store {store}"), size="1m")
    run_err = (tmp_path / "run.err").read_text()
    full = f"the run history {store / 'history.sqlite3'} cannot be written: the disk holding it is full"
    assert (tmp_path / "run.rc").read_text().strip() == "0", run_err
    assert json.loads((tmp_path / "s.json").read_text())["session"], "the session itself was saved"
    assert full in run_err and "disk I/O error" not in run_err, run_err
    assert done.returncode == 2 and "no such table" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"stallscope history: {full}; free some space there, or choose another store with --store DIR"]


def test_a_fresh_store_on_a_full_disk_says_the_disk_is_full_not_no_such_table(tmp_path):
    store = tmp_path / "store"
    py = sys.executable
    rebuild = f"{py} -m stallscope history --rebuild --store {store} 2> {tmp_path / 'rebuild.err'}"
    done = on_a_small_disk(tmp_path, store, f"{rebuild}; {py} -m stallscope history --store {store}", fill=True)
    full = f"the run history {store / 'history.sqlite3'} cannot be written: the disk holding it is full"
    assert full in (tmp_path / "rebuild.err").read_text()
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        f"stallscope history: {full}; free some space there, or choose another store with --store DIR"], done.stderr


@pytest.mark.parametrize("verb", ["tune", "bench"])
def test_tune_and_bench_on_a_full_store_name_it_and_the_reason(tmp_path, verb):
    store = tmp_path / "store"
    done = on_a_small_disk(tmp_path, store, fill=True, commands=(
        f"{sys.executable} -m stallscope {verb} --store {store} -- {sys.executable} {SCRIPTS / 'tiny_train.py'} "
        "--n 32"))
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        (f"stallscope {verb}: cannot write in the store {store}: No space left on device; free some space there, or "
         "choose another store with --store DIR")]


def test_a_tune_trial_whose_summary_the_full_disk_lost_says_so_not_run_failed_exit_0(tmp_path):
    """The script fills the store's disk and exits 0: the trial's summary (and its stderr, on the same disk) are
    lost. The trial line says the summary could not be written and why, not "stallscope run failed (exit 0)"."""
    store = tmp_path / "store"
    py = sys.executable
    done = on_a_small_disk(tmp_path, store, commands=(
        f"FILL_DIR={store} {py} -m stallscope tune --trials 4 --steps 4 --store {store} -- {py} {FILL} --first "
        "--workers 0 --exit-code 0; "
        f"find {store} -name tune.json -size 0 | wc -l > {tmp_path / 'empty'}"), size="16m")
    assert (tmp_path / "empty").read_text().strip() == "0", "an empty tune.json was left on the full disk"
    said = " ".join(done.stderr.split())  # the trial line may be wrapped
    assert "failed (exit 0)" not in said, said
    assert ("failed: the run ended (exit 0) but its summary could not be written: the disk holding the trial folder "
            "is full") in said, said
    assert done.stderr.strip().splitlines()[-1] == (f"stallscope tune: cannot write in the store {store}: No space "
                                                    "left on device; free some space there, or choose another store "
                                                    "with --store DIR")


def test_a_summary_json_the_full_disk_refused_is_an_error_line_and_the_script_keeps_its_exit_code(tmp_path):
    full = tmp_path / "full"
    py = sys.executable
    done = on_a_small_disk(tmp_path, full, fill=True, commands=(
        f"{py} -m stallscope run --store {tmp_path / 'store'} --json {full}/summary.json -- {py} "
        f"{SCRIPTS / 'tiny_train.py'} --n 32 --exit-code 4"))
    assert done.returncode == 4, done.stderr[-3000:]
    assert "verdict:" in done.stderr  # the summary is still printed
    assert done.stderr.strip().splitlines()[-1] == (
        f"stallscope run: error: the summary JSON was not written to {full}/summary.json: No space left on device "
        "(the exit code is still the script's, 4)")

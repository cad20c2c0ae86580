"""The script's exit code is kept, and the session is saved on crashes and on Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stallscope.analysis.steps import step_stats
from stallscope.launcher import REPEAT_WINDOW_S
from stallscope.session import Session
from tests.conftest import SCRIPTS, process_alive, run_cli, wait_for

pytestmark = pytest.mark.e2e
TINY = str(SCRIPTS / "tiny_train.py")


def _session_files(store: Path) -> list[Path]:
    return sorted(store.glob("runs/*/session.json"))


def test_exception_in_main_process_keeps_exit_code_and_saves(tmp_path):
    result = run_cli(tmp_path, ["--", sys.executable, TINY, "--workers", "2", "--crash-main-at", "3"])
    assert result.returncode == 1
    assert "planted main failure" in result.stderr
    summary = result.summary
    assert summary["exit_code"] == 1
    assert summary["failure"]["where"] == "main"
    assert summary["failure"]["type"] == "RuntimeError"
    assert "tiny_train.py" in summary["failure"]["location"]
    assert summary["steps"] == 3
    assert Path(summary["session"]).is_file()


def test_exception_in_worker_is_attributed_to_the_worker(tmp_path):
    result = run_cli(tmp_path, ["--", sys.executable, TINY, "--workers", "2", "--crash-worker-at", "20"])
    assert result.returncode == 1
    summary = result.summary
    assert summary["failure"]["where"] == "worker"
    assert summary["failure"]["type"] == "ValueError"
    assert "planted dataset failure" in summary["failure"]["message"]
    assert summary["failure"]["worker"] in (0, 1)
    assert Path(summary["session"]).is_file()


def test_plain_exit_code_is_kept(tmp_path):
    result = run_cli(tmp_path, [TINY, "--exit-code", "7"])
    assert result.returncode == 7
    assert result.summary["exit_code"] == 7
    assert result.summary["failure"]["type"] == "exit"
    said = " ".join(result.stderr.split())
    assert "the script failed in the main process: the script exited with code 7" in said, result.stderr[-1500:]


def test_sigint_to_launcher_stops_script_and_saves_session(tmp_path):
    store = tmp_path / "store"
    out = tmp_path / "summary.json"
    cmd = [sys.executable, "-m", "stallscope", "run", "--json", str(out), "--store", str(store), "--",
           sys.executable, TINY, "--workers", "2", "--forever", "--sleep-ms", "2", "--print-loss"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        lines = 0
        while lines < 20:  # wait until the script is really training
            line = proc.stdout.readline()
            assert line, proc.stderr.read()[-3000:]
            lines += line.startswith("loss")
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGINT, stderr[-3000:]
    summary = json.loads(out.read_text())
    assert summary["ended_by"] == "interrupt"
    assert summary["steps"] >= 19
    assert summary["exit_code"] == 128 + signal.SIGINT
    # a Ctrl-C is not the script failing: said as an interruption, with the steps before it kept
    assert "the script failed" not in stderr, stderr[-3000:]
    assert "the script was interrupted in the main process: KeyboardInterrupt" in stderr, stderr[-3000:]
    assert len(_session_files(store)) == 1
    assert not list(store.glob("runs/*/events")), "raw event files are folded into the session"


def test_script_not_found_is_a_clear_error(tmp_path):
    result = run_cli(tmp_path, ["--", sys.executable, str(tmp_path / "missing.py")])
    assert result.returncode == 2
    assert "script not found" in result.stderr
    assert result.summary is None


def test_a_file_that_is_not_executable_is_said_as_such_not_as_a_missing_command(tmp_path):
    data = tmp_path / "notes.txt"
    data.write_text("not a program\n")
    result = run_cli(tmp_path, ["--", str(data)])
    assert result.returncode == 2 and result.summary is None
    assert f"not executable: {data} (run it with its interpreter" in result.stderr, result.stderr
    assert "command not found" not in result.stderr


def test_bad_set_is_refused_before_running(tmp_path):
    result = run_cli(tmp_path, ["--set", "num_wrokers=2", "--", sys.executable, TINY])
    assert result.returncode == 2
    assert "num_wrokers" in result.stderr and "num_workers" in result.stderr
    result = run_cli(tmp_path, ["--set", "num_workers=lots", "--", sys.executable, TINY])
    assert result.returncode == 2
    assert "expected an integer" in result.stderr


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX process groups")
def test_killed_script_reports_signal(tmp_path):
    script = tmp_path / "suicide.py"
    # Killed outright (like the OOM killer): what was recorded more than ~0.5 s before survives. The script
    # waits until the recorder's background flusher has written the loader's end (no flush of its own: the
    # file is only read), so a slow flusher thread on a loaded machine delays the kill instead of losing them.
    # It waits for the "stop" record, not for 4 "next" records: a flush that lands after the 4th batch but
    # before the loop's end writes 4 nexts, and the last step is only complete once the loader has ended.
    script.write_text("import os, signal, time, torch\nfrom torch.utils.data import DataLoader\n"
                      "for b in DataLoader(list(range(8)), batch_size=2):\n    time.sleep(0.01)\n"
                      "path = os.path.join(os.environ['STALLSCOPE_RUN_DIR'], 'events', f'{os.getpid()}.jsonl')\n"
                      "deadline = time.time() + 60\n"
                      "while time.time() < deadline:\n"
                      "    if os.path.exists(path) and open(path).read().count('[\"stop\",') >= 1:\n"
                      "        break\n"
                      "    time.sleep(0.1)\n"
                      "os.kill(os.getpid(), signal.SIGKILL)\n")
    result = run_cli(tmp_path, [str(script)])
    assert result.returncode == 128 + signal.SIGKILL
    assert result.summary["ended_by"] == "signal"
    assert result.summary["steps"] == 4


@pytest.mark.parametrize("where", ["a-file", "under-a-file"])
def test_a_store_that_cannot_be_written_is_one_line_and_exit_2(tmp_path, where):
    """Chosen behaviour: nothing would be saved, so the script is not started (documented in docs/reliability.md)."""
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a folder")
    store = blocker if where == "a-file" else blocker / "store"
    marker = tmp_path / "ran"
    script = tmp_path / "t.py"
    script.write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    for verb in ("run", "tune"):
        done = subprocess.run([sys.executable, "-m", "stallscope", verb, "--store", str(store), "--",
                               sys.executable, str(script)], capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert str(blocker) in done.stderr
    assert not marker.exists()


def _ending_signals_as_a_terminal_gives_them() -> None:
    """The ending signals at their defaults in the launcher: a test run under ``nohup`` or as a background job
    inherits SIGHUP (and SIGINT, SIGQUIT) ignored, and an ignored signal stays ignored across exec, in the script
    too, as it would for plain Python; these tests are about a job started from a terminal."""
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def _start_forever(tmp_path: Path, **popen: object) -> tuple[subprocess.Popen[str], Path, Path]:
    """The tiny script training forever under ``stallscope run``, once it printed 20 losses."""
    store, out = tmp_path / "store", tmp_path / "summary.json"
    cmd = [sys.executable, "-m", "stallscope", "run", "--json", str(out), "--store", str(store), "--",
           sys.executable, TINY, "--workers", "2", "--forever", "--sleep-ms", "2", "--print-loss"]
    popen.setdefault("preexec_fn", _ending_signals_as_a_terminal_gives_them)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, **popen)
    lines = 0
    while lines < 20:
        line = proc.stdout.readline()
        if not line:
            proc.kill()
            raise AssertionError(proc.stderr.read()[-3000:])
        lines += line.startswith("loss")
    return proc, store, out


def _job_pids(store: Path) -> list[int]:
    """The script's processes (main and workers), from the event files they write."""
    return [int(p.stem) for p in store.glob("runs/*/events/*.jsonl")]


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGQUIT])
def test_hangup_and_quit_end_the_job_like_plain_python_and_save_it(tmp_path, sig):
    proc, store, out = _start_forever(tmp_path)
    try:
        pids = _job_pids(store)
        proc.send_signal(sig)
        try:
            _, stderr = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:  # say which process still ran, and what stallscope had said, then fail
            alive = {pid: _state(pid) for pid in [proc.pid, *pids] if process_alive(pid)}
            proc.kill()
            _, stderr = proc.communicate(timeout=30)
            raise AssertionError(f"no end 60 s after {signal.Signals(sig).name}; still running (pid: state): "
                                 f"{alive}; launcher pid {proc.pid}; stderr: {stderr[-3000:]}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig, stderr[-3000:]  # plain Python dies of SIGHUP with 129
    summary = json.loads(out.read_text())
    assert summary["ended_by"] == "interrupt" and summary["steps"] >= 19
    assert f"stopped by {signal.Signals(sig).name}" in " ".join(summary["notes"])
    assert wait_for(lambda: not any(process_alive(p) for p in pids)), "the script or a worker outlived the run"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux's")
def test_killed_launcher_takes_the_job_with_it_and_report_rebuilds_the_run(tmp_path):
    proc, store, _ = _start_forever(tmp_path)
    try:
        pids = _job_pids(store)
        assert pids
        proc.kill()  # SIGKILL: no handler runs in stallscope
        proc.communicate(timeout=60)
        assert wait_for(lambda: not any(process_alive(p) for p in pids)), "training outlived a killed stallscope"
    finally:
        if proc.poll() is None:
            proc.kill()
    [run_dir] = [p.parent for p in store.glob("runs/*/run.json")]
    assert not (run_dir / "session.json").exists()
    rebuilt = tmp_path / "rebuilt.json"
    done = subprocess.run([sys.executable, "-m", "stallscope", "report", str(run_dir), "--json", str(rebuilt)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "rebuilt it from its raw events" in done.stderr
    summary = json.loads(rebuilt.read_text())
    assert summary["ended_by"] == "recovered"
    assert summary["exit_code"] == 128 + signal.SIGTERM  # the parent-death signal, recorded by the script
    assert summary["steps"] >= 19 and summary["verdict"]
    assert any("rebuilt from raw events" in n for n in summary["notes"])
    assert (run_dir / "session.json").is_file() and not (run_dir / "events").exists()
    history = subprocess.run([sys.executable, "-m", "stallscope", "history", "--store", str(store)],
                             capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert history.returncode == 0 and run_dir.name[:15] in history.stdout, history.stdout + history.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads process states from /proc")
def test_ctrl_z_stops_the_job_and_fg_continues_it(tmp_path):
    # In a process group of its own whose parent (pytest) is in another group of the session, the launcher
    # is stopped by SIGTSTP as under a job-control shell.
    proc, store, out = _start_forever(tmp_path, process_group=0)
    try:
        main = next(int(p.stem) for p in store.glob("runs/*/events/*.jsonl")
                    if '"role": "main"' in p.read_text().splitlines()[0])
        proc.send_signal(signal.SIGTSTP)
        assert wait_for(lambda: _state(proc.pid) == "T" and _state(main) == "T"), (_state(proc.pid), _state(main))
        time.sleep(0.5)
        assert _state(main) == "T"
        proc.send_signal(signal.SIGCONT)  # what fg does
        assert wait_for(lambda: _state(main) != "T" and _state(proc.pid) != "T")
        losses = 0
        while losses < 5:  # training goes on
            losses += proc.stdout.readline().startswith("loss")
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGINT, stderr[-3000:]
    summary = json.loads(out.read_text())
    assert "stopped (Ctrl-Z / SIGTSTP) 1 time(s)" in " ".join(summary["notes"])
    # the half second (and more) it stood still is no step's time
    session = Session.load(summary["session"])
    [pause] = session.pauses
    assert pause["end_ns"] - pause["start_ns"] >= 0.5e9
    assert max(s.duration_ns for s in step_stats(session).steps) < 0.5e9, "a step kept the pause"


def _start_training(tmp_path, script) -> tuple[subprocess.Popen, Path]:
    """``stallscope run --json`` on ``script``, its output piped: (the process, where its summary will be)."""
    out = tmp_path / "s.json"
    proc = subprocess.Popen([sys.executable, "-m", "stallscope", "run", "--json", str(out), "--store",
                             str(tmp_path / "store"), "--", sys.executable, str(script)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    return proc, out


def _ctrl_c_ignored(tmp_path, batches: int, second: int | None = None) -> tuple[int, str, str, dict]:
    """A script that ignores Ctrl-C over ``batches`` batches: stallscope gets SIGINT once it trains, then ``second``
    (if any) once the script has said it ignored the first. (exit code, stdout after 'training', stderr, summary)."""
    script = tmp_path / "stubborn.py"
    script.write_text("import signal, time\nfrom torch.utils.data import DataLoader\n"
                      "signal.signal(signal.SIGINT, lambda *a: print('ignoring Ctrl-C', flush=True))\n"
                      f"for i, b in enumerate(DataLoader(list(range({2 * batches})), batch_size=2)):\n"
                      "    time.sleep(0.01)\n"
                      "    if i == 20: print('training', flush=True)\n"
                      "print('done', flush=True)\n")
    proc, out = _start_training(tmp_path, script)
    said = ""
    try:
        while "training" not in proc.stdout.readline():
            pass
        proc.send_signal(signal.SIGINT)
        if second is not None:
            while "ignoring Ctrl-C" not in (line := proc.stdout.readline()):
                pass
            said = line
            time.sleep(3 * REPEAT_WINDOW_S)  # a person reads that it was ignored, then presses again
            proc.send_signal(second)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, said + stdout, stderr, json.loads(out.read_text())


def test_a_script_that_handles_sigint_and_finishes_is_not_reported_as_interrupted(tmp_path):
    code, stdout, stderr, summary = _ctrl_c_ignored(tmp_path, 200)
    assert "ignoring Ctrl-C" in stdout and "done" in stdout
    assert code == 0, stderr[-3000:]
    assert summary["ended_by"] == "exit" and summary["exit_code"] == 0 and summary["steps"] == 200
    assert any("SIGINT was forwarded to the script, which went on and exited with code 0" in n
               for n in summary["notes"])


def test_ctrl_c_twice_on_a_script_that_ignores_the_first_ends_with_130_and_keeps_the_steps(tmp_path):
    """The second Ctrl-C reaches the script as SIGTERM (stallscope's escalation), which kills it; the exit code is
    the user's Ctrl-C (130), as on the bare script, not 143, and the steps before it are saved."""
    code, _, stderr, summary = _ctrl_c_ignored(tmp_path, 50_000, signal.SIGINT)
    assert code == 128 + signal.SIGINT, stderr[-3000:]
    assert summary["ended_by"] == "interrupt" and summary["exit_code"] == 130
    assert summary["steps"] >= 20
    assert any("stopped by SIGINT sent to stallscope 2 times: the script went on after the first, so it was sent "
               "SIGTERM" in n for n in summary["notes"]), summary["notes"]


def test_a_sigterm_from_outside_after_an_ignored_ctrl_c_ends_with_143_as_on_the_bare_script(tmp_path):
    """The second signal was SIGTERM itself, not stallscope's stand-in for a repeated Ctrl-C: its code, 143."""
    code, _, stderr, summary = _ctrl_c_ignored(tmp_path, 50_000, signal.SIGTERM)
    assert code == 128 + signal.SIGTERM, stderr[-3000:]
    assert summary["ended_by"] == "interrupt" and summary["exit_code"] == 143
    assert "stopped by SIGINT, then SIGTERM sent to stallscope" in summary["notes"], summary["notes"]


HUNG = str(SCRIPTS / "hung_loader.py")


def test_a_dataloader_timeout_is_a_stall_counted_in_the_data_wait(tmp_path):
    result = run_cli(tmp_path, ["--", sys.executable, HUNG, "--timeout", "2"])
    assert result.returncode == 1
    summary = result.summary
    assert summary["steps"] == 10
    [stall] = [p for p in summary["pitfalls"] if p["id"] == "loader-stalled"]
    facts = stall["facts"]
    assert facts["how"] == "RuntimeError" and "timed out" in facts["message"]
    assert facts["seconds"] >= 2.0 and facts["batches_before"] == 10
    assert facts["pending_workers"] == [0, 1] and facts["awaited_worker"] == 0
    assert "2.0 s" in stall["evidence"] or "2.1 s" in stall["evidence"]
    # The 2 s blocked are data wait: more than the 9 steady steps' own time, so most of the run's.
    assert summary["data_wait_fraction"] > 0.5 and summary["bottleneck"]["node"] == "loader"
    assert "blocked in a next() that never returned" in " ".join(summary["bottleneck"]["evidence"])


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_hung_dataloader_interrupted_is_named_with_the_workers_that_owed_batches(tmp_path, sig):
    out = tmp_path / "s.json"
    proc = subprocess.Popen([sys.executable, "-m", "stallscope", "run", "--json", str(out), "--store",
                             str(tmp_path / "store"), "--", sys.executable, HUNG, "--workers", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        while "batch 9" not in proc.stdout.readline():  # the last batch before the workers hang
            assert proc.poll() is None, proc.stderr.read()[-3000:]
        time.sleep(2.5)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig, stderr[-3000:]
    summary = json.loads(out.read_text())
    assert summary["steps"] == 10
    [stall] = [p for p in summary["pitfalls"] if p["id"] == "loader-stalled"]
    facts = stall["facts"]
    assert facts["how"] == ("KeyboardInterrupt" if sig == signal.SIGINT else "SIGTERM")
    assert facts["seconds"] >= 2.0 and facts["pending_workers"] == [0, 1]
    assert summary["data_wait_fraction"] > 0.5 and summary["verdict"] == "input-bound"


@pytest.mark.parametrize("death", ["os._exit", "SIGTERM", "SIGKILL"])
def test_a_script_that_dies_right_after_its_steps_keeps_them_or_says_they_may_be_missing(tmp_path, death):
    ending = {"os._exit": "os._exit(4)", "SIGTERM": "os.kill(os.getpid(), signal.SIGTERM)",
              "SIGKILL": "os.kill(os.getpid(), signal.SIGKILL)"}[death]
    script = tmp_path / "quick.py"
    script.write_text("import os, signal, torch\nfrom torch.utils.data import DataLoader\n"
                      "model = torch.nn.Linear(2, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                      "for x in DataLoader(torch.randn(22, 2), batch_size=2):\n"
                      "    opt.zero_grad(); model(x).sum().backward(); opt.step()\n"
                      f"{ending}\n")
    result = run_cli(tmp_path, [str(script)])
    assert result.returncode == {"os._exit": 4, "SIGTERM": 143, "SIGKILL": 137}[death], result.stderr[-2000:]
    summary = result.summary
    if death == "SIGKILL":  # nothing can flush: the summary says the last events may be missing
        assert any("ended without writing out its last events" in n for n in summary["notes"])
    else:  # flushed before dying: all 11 steps are there
        assert summary["steps"] == 11
        assert not any("ended without writing out its last events" in n for n in summary["notes"])


@pytest.mark.parametrize("stderr_too", [False, True])
def test_output_piped_into_head_keeps_the_scripts_exit_code(tmp_path, stderr_too):
    """``stallscope run ... [2>&1] | head -1``: the reader goes away; the summary is lost, the exit code is not."""
    script = tmp_path / "s.py"
    script.write_text("print('one', flush=True)\nimport time\nfrom torch.utils.data import DataLoader\n"
                      "for b in DataLoader(list(range(40)), batch_size=2):\n    time.sleep(0.01)\n")
    proc = subprocess.Popen([sys.executable, "-m", "stallscope", "run", "--store", str(tmp_path / "store"), "--",
                             sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if stderr_too else subprocess.DEVNULL, cwd=tmp_path)
    assert proc.stdout.readline() == b"one\n"
    proc.stdout.close()  # what head does after its line
    assert proc.wait(timeout=120) == 0
    assert list((tmp_path / "store").glob("runs/*/session.json")), "the session is saved all the same"


def test_a_failure_said_into_a_closed_pipe_keeps_its_exit_code(tmp_path):
    """``stallscope run -- ./missing 2>&1 | head -0``: the reader is gone before the error is said. A closed pipe
    means "the reader had what it wanted" for standard output only; the failure's code is kept."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # as head -0 does: gone before anything is written
    try:
        proc = subprocess.run([sys.executable, "-m", "stallscope", "run", "--store", str(tmp_path / "store"), "--",
                               str(tmp_path / "missing")], stdout=write_end, stderr=write_end, cwd=tmp_path,
                              timeout=120, check=False)
    finally:
        os.close(write_end)
    assert proc.returncode == 2


@pytest.mark.parametrize("verb", [["report"], ["report", "--json", "-"], ["history"], ["doctor"]])
def test_a_verb_whose_reader_stops_early_exits_0_without_a_word(tmp_path, verb):
    """``stallscope report | head -1``: the reader had what it wanted. rich's own answer was exit code 1, no word
    (and with ``set -o pipefail`` a failed pipeline); plain printing's was an internal error."""
    store = tmp_path / "store"
    recorded = run_cli(tmp_path, ["--quiet", "--", sys.executable, TINY])
    assert recorded.returncode == 0, recorded.stderr[-2000:]
    args = [*verb, "--store", str(store)] if verb[0] != "doctor" else verb
    proc = subprocess.Popen([sys.executable, "-m", "stallscope", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=tmp_path)
    assert proc.stdout.readline()  # the first line, as head reads it
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert b"Traceback" not in err and b"internal error" not in err, err.decode()[-2000:]


def test_a_run_folder_removed_while_the_job_runs_is_said_as_lost_events(tmp_path):
    result = run_cli(tmp_path, ["--", sys.executable, str(SCRIPTS / "remove_run_folder.py")])
    assert result.returncode == 0, result.stderr[-2000:]  # the script's own exit code
    assert "Traceback" not in result.stderr
    assert "the run's folder was removed while the job ran" in result.stderr
    assert "the recorder started in no process" not in result.stderr
    assert "nothing was measured" in result.stderr


def test_a_sigint_sent_twice_with_a_sigcont_as_timeout_sends_it_interrupts_the_script_once(tmp_path):
    """``timeout -s INT`` sends SIGINT to stallscope, then to its process group, then SIGCONT to both, at once. The
    script's Ctrl-C handler (saving a checkpoint) runs once and is not cut short by a SIGTERM for a "second" Ctrl-C;
    and the SIGINT is forwarded at once, not when the script ends (the SIGCONT once took the SIGINT with it into the
    launcher's sampler thread, which left the main thread waiting for the script)."""
    script = tmp_path / "checkpointing.py"
    script.write_text("import sys, time\nfrom torch.utils.data import DataLoader\n"
                      "i = -1\n"
                      "try:\n"
                      "    for i, b in enumerate(DataLoader(list(range(100_000)), batch_size=2)):\n"
                      "        time.sleep(0.01)\n"
                      "        if i == 20: print('training', flush=True)\n"
                      "except KeyboardInterrupt:\n"
                      "    print(f'interrupted at batch {i}: saving', flush=True)\n"
                      "    time.sleep(1.0)\n"
                      "    print('saved', flush=True)\n"
                      "    sys.exit(5)\n")
    proc, out = _start_training(tmp_path, script)
    try:
        while "training" not in proc.stdout.readline():
            pass
        for sig in (signal.SIGINT, signal.SIGINT, signal.SIGCONT, signal.SIGCONT):
            os.kill(proc.pid, sig)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 5, stderr[-3000:]
    [interrupted] = [line for line in stdout.splitlines() if line.startswith("interrupted at batch")]
    assert int(interrupted.split()[3].rstrip(":")) < 20_000, "the Ctrl-C reached the script only at its end"
    assert "saved" in stdout.splitlines()
    summary = json.loads(out.read_text())
    assert summary["exit_code"] == 5 and summary["ended_by"] == "exit"
    assert "SIGINT was forwarded to the script, which went on and exited with code 5" in summary["notes"]

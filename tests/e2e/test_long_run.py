"""A long run under the real CLI, its folding shrunk (STALLSCOPE_FOLDING, STALLSCOPE_SEGMENT_BYTES) so that seconds
fold as days would: every step counted, bounded detail, a report on the run while it goes, and a launcher killed
outright whose run rebuilds with every window up to the kill."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = str(Path(__file__).parent.parent / "scripts" / "long_steps.py")
SHRUNK = {"STALLSCOPE_SEGMENT_BYTES": "65536",
          "STALLSCOPE_FOLDING": "window_ms=250,chunk_ms=250,lead=3000,trail=3000,anomaly=1500,period_ms=200,lag_ms=300,"
                                "samples_ms=400"}


def stallscope(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stallscope", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **SHRUNK})


def test_a_long_run_is_folded_as_it_goes_and_counts_every_step(tmp_path):
    done = stallscope("run", "--quiet", "--store", "st", "--json", "s.json", "--", sys.executable, SCRIPT,
                      "--steps", "8000", "--workers", "1", "--epoch-steps", "3000", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["steps"] == 8000 and summary["samples"] == 32000  # the folded steps too
    recording = summary["recording"]
    assert recording["folded_s"] > 0 and recording["steps_folded"] > 0
    assert recording["steps_in_detail"] + recording["steps_folded"] == 8000
    session = json.loads(Path(summary["session"]).read_text())
    kept = len(session["nexts"]) + len(session["optimizer_steps"]) + len(session["fetches"])
    assert kept < 3 * 8000 / 2, "the detail of the folded windows is gone"
    assert not (Path(summary["session"]).parent / "folded").exists()  # folded into the session, then removed
    # the findings rest on the steps kept in detail; the windows count the whole run: they agree on the data wait
    rows = [r for r in session["windows"] if r["steps"]]
    whole = sum(r["wait_ns"] for r in rows) / sum(r["step_ns"] for r in rows)
    assert abs(summary["data_wait_fraction"] - whole) < 0.15, (summary["data_wait_fraction"], whole)
    assert summary["verdict"] in ("input-bound", "balanced", "compute-bound")


def test_a_run_read_while_it_goes_and_then_killed_outright_rebuilds_up_to_the_kill(tmp_path):
    launcher = subprocess.Popen([sys.executable, "-m", "stallscope", "run", "--quiet", "--store", "st", "--",
                                 sys.executable, SCRIPT, "--steps", "100000000"], cwd=tmp_path,
                                env={**os.environ, **SHRUNK}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        state = None
        while time.monotonic() < deadline:
            found = list((tmp_path / "st" / "runs").glob("*/folded/state.json"))
            if found and json.loads(found[0].read_text()).get("folded"):
                state = found[0]
                break
            time.sleep(0.2)
        assert state is not None, "no window was folded in two minutes"
        run_dir = state.parent.parent
        # a report on the run as it goes: the summary so far, nothing written into its folder
        going = stallscope("report", str(run_dir), "--json", str(tmp_path / "going.json"), cwd=tmp_path)
        assert going.returncode == 0, going.stderr[-3000:]
        assert "still running" in going.stderr
        so_far = json.loads((tmp_path / "going.json").read_text())
        assert so_far["ended_by"] == "running" and so_far["exit_code"] == -1 and so_far["steps"] > 0
        assert so_far["recording"]["steps_folded"] > 0
        assert so_far["system"]["present"], "the system samples saved as the run goes are read too"
        assert not (run_dir / "session.json").exists()
        time.sleep(1.0)
    finally:
        os.killpg(launcher.pid, signal.SIGKILL)  # the launcher and the script, outright
        launcher.wait(timeout=60)
    killed_at = time.perf_counter_ns()
    time.sleep(0.5)
    started = time.monotonic()
    again = stallscope("report", str(run_dir), "--json", str(tmp_path / "after.json"), cwd=tmp_path)
    took = time.monotonic() - started
    assert again.returncode == 0, again.stderr[-3000:]
    after = json.loads((tmp_path / "after.json").read_text())
    # the script was killed with the group, or took the SIGTERM its launcher's death sends it
    assert after["ended_by"] == "recovered" and after["exit_code"] in (128 + signal.SIGKILL, 128 + signal.SIGTERM)
    assert after["steps"] > so_far["steps"]
    assert after["recording"]["steps_folded"] >= so_far["recording"]["steps_folded"]
    session = json.loads(Path(after["session"]).read_text())
    # every window up to the kill: the last one ends within a window and the lag of it
    last_end = max(r["end_ns"] for r in session["windows"])
    assert killed_at - last_end < 2_000_000_000, (killed_at - last_end) / 1e9
    # the launcher's system samples, as last saved before the kill
    ticks = session["system_samples"]["t_ns"]
    assert ticks and killed_at - ticks[-1] < 5_000_000_000, (killed_at - ticks[-1]) / 1e9
    assert any("system samples up to" in note for note in after["notes"]), after["notes"]
    assert took < 60, took


DRIFTING = str(Path(__file__).parent.parent / "scripts" / "drifting_job.py")
WINDOWED = {**os.environ, "STALLSCOPE_FOLDING": "window_ms=1000,chunk_ms=500,period_ms=300,lag_ms=400"}


def _drifting(tmp_path: Path, plant: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "stallscope", "run", "--quiet", "--store", "st", "--json", "s.json",
                           "--", sys.executable, DRIFTING, "--plant", plant, "--seconds", "20"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env=WINDOWED)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((tmp_path / "s.json").read_text())["over_time"]


@pytest.mark.speed  # the rates per window are what this machine measured
def test_a_loop_that_keeps_every_steps_metric_slows_and_is_named_by_its_memory(tmp_path):
    found = _drifting(tmp_path, "leak")
    change = found["change"]
    assert change is not None and change["direction"] == "slower" and change["ratio"] < 0.7, change
    assert change["part"] == "step_code" and change["cause"] == "memory-growth", change
    early, late = change["per_step_ms"]["step_code"]
    assert late > 2 * early
    assert [m["who"] for m in found["memory_growth"]] == ["training"]
    assert 0 < change["began_s"] < 25 and len(found["windows"]) >= 15


@pytest.mark.speed  # the rates per window are what this machine measured
def test_inputs_that_grow_over_the_run_slow_the_compute_and_are_named_by_the_batches_bytes(tmp_path):
    change = _drifting(tmp_path, "growing-inputs")["change"]
    assert change is not None and change["direction"] == "slower" and change["cause"] == "data-growing", change
    assert change["part"] in ("forward", "backward")
    early, late = change["evidence"]["batch_bytes"]
    assert late > 1.25 * early and "the batches grew over the run" in change["said"]


@pytest.mark.speed  # the rates per window are what this machine measured
def test_a_steady_job_shows_its_windows_and_no_change(tmp_path):
    found = _drifting(tmp_path, "none")
    assert found["change"] is None and found["memory_growth"] == []
    rates = [w["steps_per_s"] for w in found["windows"] if w["steps_per_s"]]
    assert len(rates) >= 15 and min(rates) > 0


MEMORY_CGROUPS = Path("/sys/fs/cgroup/memory")


@pytest.mark.speed  # the rates per window are what this machine measured
@pytest.mark.skipif(os.geteuid() != 0 or not MEMORY_CGROUPS.is_dir(),
                    reason="needs root and a cgroup v1 memory controller (to limit the page cache a job may use)")
def test_a_dataset_the_page_cache_no_longer_holds_is_named(tmp_path):
    """A 1 GiB file read at random by a job in a 900 MiB memory cgroup: warm at first (read outside it), its cache
    dropped a third of the way in, as memory pressure would, and never whole again under the limit."""
    cgroup = MEMORY_CGROUPS / f"stallscope-test-{os.getpid()}"
    cgroup.mkdir()
    try:
        (cgroup / "memory.limit_in_bytes").write_text(str(900 << 20))
        data = tmp_path / "records.bin"
        with open(data, "wb") as f:
            for _ in range(1024):
                f.write(os.urandom(1 << 20))
            f.flush()
            os.fsync(f.fileno())  # written back: dropping the cache drops only clean pages
        with open(data, "rb") as f:  # warm, charged to this process's cgroup, not the job's
            while f.read(1 << 24):
                pass
        job = ["sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec "$@"', "job", sys.executable,
               str(Path(__file__).parent.parent / "scripts" / "page_cache_job.py"), "--file", str(data),
               "--seconds", "30"]
        proc = subprocess.Popen([sys.executable, "-m", "stallscope", "run", "--quiet", "--store", "st", "--json",
                                 "s.json", "--", *job], cwd=tmp_path, env=WINDOWED, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        time.sleep(14)  # start-up and 10 s warm
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
    finally:
        for _ in range(50):  # the job's processes leave the cgroup as they exit
            try:
                cgroup.rmdir()
                break
            except OSError:
                time.sleep(0.1)
    change = json.loads((tmp_path / "s.json").read_text())["over_time"]["change"]
    assert change is not None and change["direction"] == "slower" and change["part"] == "data_wait", change
    assert change["cause"] == "page-cache", change
    disk = change["evidence"]["disk_read_bytes_per_s"]
    assert disk[1] > 4 * max(disk[0], 1.0)


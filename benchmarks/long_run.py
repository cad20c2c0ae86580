"""Long runs under the recorder: the session's size, the time ``report`` takes, the launcher's peak memory (it is
also the collector: it folds the run as it goes and builds the session at the end) and the recorder's overhead.

Each size runs ``tests/scripts/long_steps.py`` (tiny steps on in-memory data, an epoch every 5,000 steps) under
``stallscope run``; the launcher's peak resident memory is its VmHWM, read from /proc while it runs (it holds its
peak until it exits). The overhead pairs run the same script bare and recorded, alternating, at ``--step-ms``
steps (a busy loop pads each step), and compare the milliseconds per step the script itself prints.

Run:  python benchmarks/long_run.py                      (100k and 1M steps in the training process, 100k with 2
                                                          workers, 3 overhead pairs of 20k steps at 1 ms)
      python benchmarks/long_run.py --sizes 20000 --workers-steps 0 --pairs 1   (a quick look)
      python benchmarks/long_run.py --planted [--planted-seconds 240]   (the over-time findings on planted jobs,
          each several minutes at the default 10-second windows: tests/scripts/drifting_job.py's leak, python-leak,
          growing-inputs, copy-on-read and none; as root with a cgroup v1 memory controller, also
          tests/scripts/page_cache_job.py in a 900 MiB cgroup over a 1 GiB file, warm at first, its page cache
          dropped a third of the way in)
      python benchmarks/long_run.py --killed-after 3600 [--keep]   (an hour, then SIGKILL; the rebuild timed)

Measured on the 2-core development VM (2026-12-06), chunks of 1 s, windows of 10 s, detail budgets 30,000 /
30,000 / 15,000 records (docs/calibration.md, fold-*):
- 100,000 steps (0.66 ms each): session 9.3 MB, 14,518 steps in detail; report 2.43 s (its peak 83 MB); the
  launcher's peak 114 MB; summary steps 100,000; balanced, data wait 26.3%.
- 1,000,000 steps (668 s): session 10.3 MB, 15,256 steps in detail; report 2.27 s (peak 89 MB); the launcher's
  peak 115 MB (flat from 100k); summary steps 1,000,000; balanced, data wait 26.1%.
- 100,000 steps with 2 workers (252 s): session 9.9 MB, 12,833 steps in detail; report 3.03 s (peak 88 MB); the
  launcher's peak 109 MB; input-bound, data wait 67.0%.
- Overhead at 1 ms steps (1.10-1.12 ms as padded): median +0.5% over 3 pairs of 20,000 steps (-1.3% to +1.3%).
- Before folding (same VM, same script): 20,000 steps made a 13.2 MB session and report took 2.5-3.3 s; the issue
  measured 97 MB and 28 s at 200,000 steps.
- After folding read fields by position (same day): 100,000 steps, the launcher 3.7% of a core over the middle half
  of the run (folding, sampling), peak 109 MB; session 8.8 MB, report 2.64 s.
- --planted, 240 s each at 10-second windows: leak 0.29x from 30 s, step code 10.4 -> 38.3 ms a step, memory
  1,225 -> 2,100 MiB; growing-inputs 0.45x, compute (backward 11.2 -> 31.4 ms a step); none: nothing called
  (606-888 steps/s per window); page-cache 0.46x from 80 s (the drop), data wait 0.73 -> 2.38 ms a step, disk
  2.4 -> 841 MiB/s; python-leak: memory 1,748 -> 6,294 MiB, and (run again by hand) GC pauses 1.4 -> 4.5 s.
- --planted, 240 s each, 2026-12-07 (another job busy on one of the 2 cores): copy-on-read: the workers' memory
  32 -> 100 MiB together from 20 s on, no slowdown called; growing-inputs: 0.42x from 40 s on, named data-growing
  (batches 1.4 -> 3.4 MiB, backward 12.3 -> 29.7 ms a step); python-leak: memory 1,569 -> 6,014 MiB from 10 s on
  and GC pauses 1,236 -> 3,727 ms (its onset, read on the sparse longest pauses, at 3.3 min), no slowdown called.
- --killed-after SECONDS: record, SIGKILL the launcher and the job together, time report's rebuild. 2026-12-07,
  --killed-after 3600: run folder 14.1 MB; report rebuilt it in 5.84 s (peak 116 MB): 5,090,538 steps, 360
  windows, the last ending at the kill (3,600 s).
- The defaults again, 2026-12-07 (samples saved every 30 s, batches sized once a second), machine otherwise idle:
  100,000 steps: session 9.9 MB, report 2.28 s (peak 86 MB), launcher peak 114 MB, 5.2% of a core; 1,000,000 steps
  (647 s): session 9.7 MB, report 2.13 s (peak 85 MB), launcher peak 114 MB, 4.8% of a core; 100,000 steps with 2
  workers (335 s): 10.0 MB, report 3.05 s (peak 88 MB), launcher peak 111 MB; overhead at 1 ms steps (1.11-1.12 ms
  padded): median +1.4% over 3 pairs (+0.6% to +3.4%).
- Later on 2026-12-07, machine quiet: 100,000 steps: session 9.9 MB, report 3.60 s (peak 86 MB), launcher peak
  106 MB; 1,000,000 steps (554 s): session 10.6 MB, report 2.17 s (peak 90 MB), launcher peak 132 MB (not flat:
  +25%, not yet explained); overhead at 1 ms steps median +0.7% over 3 pairs (+0.5% to +1.4%). Under another job on
  the other core: 100,000 steps with 2 workers 9.5 MB, report 1.93 s, launcher peak 107 MB; --killed-after 3600:
  run folder 15.3 MB, rebuilt in 3.94 s (peak 117 MB), 5,743,459 steps, 360 windows to the kill; --planted: leak
  0.45x from 30 s, python-leak GC pauses 1,381 -> 3,800 ms from 3.5 min, growing-inputs 0.38x from 20 s
  (data-growing), page-cache 0.54x from 80 s, copy-on-read not called under that load (alone: workers 31 -> 107 MiB
  from 20 s), and the steady job "sped up 1.28x" as the other job ended (now said as other-load).
- Later on 2026-12-07, the launcher polling every 2 s instead of 10 (docs/calibration.md, fold-period), writing its
  fold state at most every 10 s, its system samples held in 8 bytes a reading; machine quiet: 20,000 steps: launcher
  peak 84 MB (session 8.7 MB, report 1.57 s); 100,000 steps (38 s): session 8.8 MB, report 1.72 s (peak 80 MB),
  launcher peak 85 MB (67, 83, 84 by 25/50/75% of the run), 6.3% of a core; 1,000,000 steps (326 s): session 9.3 MB,
  report 1.62 s (peak 83 MB), launcher peak 95 MB (89, 89, 90), 7.3% of a core; 100,000 steps with 2 workers
  (154 s): 9.4 MB, report 1.46 s, launcher peak 82 MB (46, 50, 50); overhead at 1 ms steps median +0.9% over 3
  pairs (+0.2% to +2.2%). With the 2 s polls alone (state written at every poll), 3,000,000 steps (1,004 s): 9.2 MB,
  report 1.47 s, launcher peak 100 MB (91, 91, 94). The launcher reaches its working size within its first minute
  and stays there; its peak comes at the end, building the session (about 84 MB from 20,000 steps on). Polling every
  10 s, 1,000,000 steps had peaked at 133 MB (105, 108, 109 by 25/50/75%).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = str(ROOT / "tests" / "scripts" / "long_steps.py")


def _peak_kb(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    found = re.search(r"VmHWM:\s+(\d+) kB", text)
    return int(found.group(1)) if found else None


def _cpu_s(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime, its own


PEAKS_AT = (0.25, 0.5, 0.75)  # shares of a run's wall time at which its peak so far is kept


def watched(command: list[str], peaks: list[float] | None = None
            ) -> tuple[subprocess.CompletedProcess, float, int | None, float | None]:
    """(the finished process, its wall seconds, its own peak resident kB, and its CPU per second over the middle half
    of its life: the launcher's cost while the job runs, without its start-up and the analysis at the end). With
    ``peaks``, its peak so far at each share of PEAKS_AT is added there (MB): whether the peak grew while the job ran
    or came at the end, when the session is built."""
    started = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = None
    used: list[tuple[float, float]] = []
    so_far: list[tuple[float, int]] = []
    while proc.poll() is None:
        found, cpu = _peak_kb(proc.pid), _cpu_s(proc.pid)
        peak = max(peak or 0, found) if found is not None else peak
        if cpu is not None:
            used.append((time.perf_counter() - started, cpu))
        if peak is not None:
            so_far.append((time.perf_counter() - started, peak))
        time.sleep(0.05)
    out, err = proc.communicate()
    wall = time.perf_counter() - started
    if peaks is not None:
        peaks.extend(max((kb for t, kb in so_far if t <= share * wall), default=0) / 1024 for share in PEAKS_AT)
    middle = [(t, c) for t, c in used if wall / 4 <= t <= 3 * wall / 4]
    rate = (middle[-1][1] - middle[0][1]) / (middle[-1][0] - middle[0][0]) if len(middle) > 1 else None
    return subprocess.CompletedProcess(command, proc.returncode, out, err), wall, peak, rate


def recorded(steps: int, workers: int, where: Path) -> dict:
    store = where / f"store-{steps}-{workers}"
    summary_path = where / f"s-{steps}-{workers}.json"
    peaks: list[float] = []
    done, wall, peak, core = watched([sys.executable, "-m", "stallscope", "run", "--quiet", "--store", str(store),
                                     "--json", str(summary_path), "--", sys.executable, SCRIPT, "--steps", str(steps),
                                     "--workers", str(workers)], peaks)
    if done.returncode != 0:
        raise SystemExit(f"the recorded run failed:\n{done.stderr[-3000:]}")
    summary = json.loads(summary_path.read_text())
    session = Path(summary["session"])
    report, report_s, report_peak, _ = watched([sys.executable, "-m", "stallscope", "report", str(session), "--json",
                                             os.devnull])
    if report.returncode != 0:
        raise SystemExit(f"report failed:\n{report.stderr[-3000:]}")
    recording = summary.get("recording") or {}
    return {"steps": steps, "workers": workers, "wall_s": wall, "launcher_peak_mb": (peak or 0) / 1024,
            "launcher_peaks_mb": peaks, "launcher_core": core or 0.0,
            "session_mb": session.stat().st_size / 2**20, "report_s": report_s,
            "report_peak_mb": (report_peak or 0) / 1024, "summary_steps": summary["steps"],
            "steps_in_detail": recording.get("steps_in_detail", summary["steps"]),
            "window_s": recording.get("window_s"), "verdict": summary["verdict"],
            "data_wait": summary["data_wait_fraction"]}


def ms_per_step(command: list[str]) -> float:
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    found = re.search(r"\(([\d.]+) ms a step\)", done.stdout)
    if done.returncode != 0 or not found:
        raise SystemExit(f"no step time from {command}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return float(found.group(1))


def overhead(pairs: int, steps: int, step_ms: float, where: Path) -> list[tuple[float, float]]:
    bare = [sys.executable, SCRIPT, "--steps", str(steps), "--step-ms", str(step_ms)]
    under = [sys.executable, "-m", "stallscope", "run", "--quiet", "--store", str(where / "overhead"), "--", *bare]
    results = []
    for i in range(pairs):
        order = (bare, under) if i % 2 == 0 else (under, bare)
        times = {id(cmd): ms_per_step(cmd) for cmd in order}
        results.append((times[id(bare)], times[id(under)]))
        print(f"  pair {i + 1}: bare {results[-1][0]:.3f} ms a step, recorded {results[-1][1]:.3f} ms", flush=True)
    return results


CGROUP = Path("/sys/fs/cgroup/memory/stallscope_page_cache")


def planted(name: str, job: list[str], where: Path, seconds: float, in_cgroup: bool = False) -> dict:
    """Run a planted job under stallscope run; the page-cache one in a memory-limited cgroup, its file's cache dropped
    (as memory pressure would) a third of the way in."""
    summary_path = where / f"planted-{name}.json"
    if in_cgroup:
        job = ["sh", "-c", f'echo $$ > {CGROUP}/cgroup.procs && exec "$@"', "job", *job]
    proc = subprocess.Popen([sys.executable, "-m", "stallscope", "run", "--quiet", "--store", str(where / "planted"),
                             "--json", str(summary_path), "--", *job], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    if in_cgroup:
        time.sleep(seconds / 3)
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"the planted {name} run failed:\n{err[-3000:]}")
    over = json.loads(summary_path.read_text())["over_time"] or {}
    pauses = over.get("gc_pauses")
    return {"name": name, "change": (over.get("change") or {}).get("said"),
            "memory": [m["said"] for m in over.get("memory_growth", [])] + ([pauses["said"]] if pauses else []),
            "windows": len(over.get("windows", []))}


def killed_run(seconds: float, where: Path) -> None:
    """Record ``long_steps.py`` for ``seconds``, SIGKILL the launcher and the job together (a preempted node, the OOM
    killer), then time ``report RUN_DIR`` rebuilding it, and compare its last window with the kill."""
    store = where / "killed"
    launcher = subprocess.Popen([sys.executable, "-m", "stallscope", "run", "--quiet", "--store", str(store), "--",
                                 sys.executable, SCRIPT, "--steps", str(10**10)], start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    started = time.perf_counter()
    try:
        while time.perf_counter() - started < seconds:
            if launcher.poll() is not None:
                raise SystemExit(f"the recorded run ended by itself after {time.perf_counter() - started:.0f} s")
            time.sleep(1.0)
    finally:
        killed_at = time.perf_counter()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()
    run_dir = next(store.glob("runs/*/folded/state.json")).parent.parent
    size = sum(f.stat().st_size for f in run_dir.rglob("*") if f.is_file())
    out = where / "killed.json"
    report, report_s, report_peak, _ = watched([sys.executable, "-m", "stallscope", "report", str(run_dir), "--json",
                                             str(out)])
    if report.returncode != 0:
        raise SystemExit(f"report failed:\n{report.stderr[-3000:]}")
    summary = json.loads(out.read_text())
    over = summary.get("over_time") or {}
    windows = over.get("windows") or []
    last_end = max((w["start_s"] for w in windows), default=0.0) + (over.get("window_s") or 0.0)
    print(f"killed after {seconds:.0f} s: run folder {run_dir}")
    print(f"killed after {seconds:.0f} s: run folder {size / 2**20:.1f} MB; report rebuilt it in {report_s:.2f} s "
          f"(peak {(report_peak or 0) / 1024:.0f} MB): {summary['steps']:,} steps, ended_by {summary['ended_by']}, "
          f"{len(windows)} windows, the last ending {last_end:.0f} s into the run "
          f"(the kill at {killed_at - started:.0f} s after the launcher started); {summary['verdict']}")


PLANTS = ("leak", "python-leak", "growing-inputs", "copy-on-read", "none", "page-cache")


def run_planted(seconds: float, where: Path, plants: tuple[str, ...] = PLANTS) -> None:
    drifting = str(ROOT / "tests" / "scripts" / "drifting_job.py")
    results = [planted(plant, [sys.executable, drifting, "--plant", plant, "--seconds", str(seconds)], where, seconds)
               for plant in plants if plant != "page-cache"]
    memory = Path("/sys/fs/cgroup/memory")
    if "page-cache" not in plants:
        pass
    elif os.geteuid() == 0 and memory.is_dir():
        CGROUP.mkdir(exist_ok=True)
        (CGROUP / "memory.limit_in_bytes").write_text(str(900 << 20))
        data = where / "records.bin"
        subprocess.run([sys.executable, str(ROOT / "tests" / "scripts" / "page_cache_job.py"), "--file", str(data),
                        "--make", "1024", "--seconds", "0"], check=True, capture_output=True)
        with open(data, "rb") as f:  # warm: read once outside the cgroup
            while f.read(1 << 24):
                pass
        job = [sys.executable, str(ROOT / "tests" / "scripts" / "page_cache_job.py"), "--file", str(data),
               "--seconds", str(seconds)]
        try:
            results.append(planted("page-cache", job, where, seconds, in_cgroup=True))
        finally:
            with contextlib.suppress(OSError):
                CGROUP.rmdir()
    else:
        print("page-cache plant skipped: it needs root and a cgroup v1 memory controller")
    for r in results:
        print(f"{r['name']} ({r['windows']} windows): {r['change'] or 'no change called'}")
        for line in r["memory"]:
            print(f"  {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000],
                        help="steps of each recorded run in the training process (num_workers=0)")
    parser.add_argument("--workers-steps", type=int, default=100_000, help="steps of a run with 2 workers; 0: none")
    parser.add_argument("--pairs", type=int, default=3, help="overhead pairs (bare, recorded); 0: none")
    parser.add_argument("--pair-steps", type=int, default=20_000)
    parser.add_argument("--step-ms", type=float, default=1.0)
    parser.add_argument("--planted", action="store_true", help="run the planted over-time jobs instead")
    parser.add_argument("--planted-seconds", type=float, default=240.0)
    parser.add_argument("--plants", nargs="+", choices=PLANTS, default=list(PLANTS))
    parser.add_argument("--killed-after", type=float, metavar="SECONDS",
                        help="record until SECONDS, SIGKILL the launcher and the job, time report's rebuild")
    parser.add_argument("--keep", action="store_true", help="with --killed-after: keep the run's folder (printed)")
    args = parser.parse_args()
    if args.killed_after and args.keep:
        killed_run(args.killed_after, Path(tempfile.mkdtemp(prefix="stallscope-killed-")))
        return
    if args.killed_after:
        with tempfile.TemporaryDirectory(prefix="stallscope-killed-") as tmp:
            killed_run(args.killed_after, Path(tmp))
        return
    if args.planted:
        with tempfile.TemporaryDirectory(prefix="stallscope-planted-") as tmp:
            run_planted(args.planted_seconds, Path(tmp), tuple(args.plants))
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="stallscope-long-") as tmp:
        where = Path(tmp)
        runs = [(n, 0) for n in args.sizes] + ([(args.workers_steps, 2)] if args.workers_steps else [])
        for steps, workers in runs:
            print(f"recording {steps:,} steps with {workers} workers...", flush=True)
            rows.append(recorded(steps, workers, where))
            r = rows[-1]
            print(f"  {r['wall_s']:.0f} s; session {r['session_mb']:.1f} MB; report {r['report_s']:.2f} s "
                  f"(peak {r['report_peak_mb']:.0f} MB); launcher peak {r['launcher_peak_mb']:.0f} MB ("
                  + ", ".join(f"{mb:.0f} by {share:.0%}" for share, mb in zip(PEAKS_AT, r["launcher_peaks_mb"]))
                  + " of the wall time), "
                  f"{r['launcher_core']:.1%} of a core while the job ran; summary "
                  f"steps {r['summary_steps']:,} ({r['steps_in_detail']:,} in detail, window {r['window_s']} s); "
                  f"{r['verdict']}, data wait {r['data_wait']:.1%}", flush=True)
        pairs = overhead(args.pairs, args.pair_steps, args.step_ms, where) if args.pairs else []
    print("\nsteps      workers  session MB  report s  launcher peak MB  report peak MB  steps counted")
    for r in rows:
        print(f"{r['steps']:>9,}  {r['workers']:>7}  {r['session_mb']:>10.1f}  {r['report_s']:>8.2f}  "
              f"{r['launcher_peak_mb']:>16.0f}  {r['report_peak_mb']:>14.0f}  {r['summary_steps']:>13,}")
    if pairs:
        ratios = [under / bare for bare, under in pairs]
        print(f"overhead at {args.step_ms} ms steps: median {statistics.median(ratios) - 1:+.1%} over {len(pairs)} "
              f"pairs (each {args.pair_steps:,} steps; min {min(ratios) - 1:+.1%}, max {max(ratios) - 1:+.1%})")


if __name__ == "__main__":
    main()

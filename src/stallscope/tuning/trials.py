"""One trial: the unmodified script under ``stallscope run --steps N --set ...``, bounded in time.

Each trial is a subprocess (``python -m stallscope run``) in its own process group, so a crash,
a hang or the kernel's out-of-memory killer ends that trial only. Its output goes to files in
the trial's folder, never to the terminal. A trial past its timeout gets SIGTERM (the launcher
forwards it and still saves the session), then SIGKILL for everything left. Because the trial is in
its own session, the terminal's Ctrl-C reaches only the tuner: when the tuner is interrupted, it
forwards SIGINT to the trial itself (which stops the script and saves what it measured), then
escalates, so no trial outlives the tuner.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from stallscope import paths, settings
from stallscope.tuning.noise import Rate, rate_of, warmup_steps

#: The settings tuning may change, in the order the search visits them. ``torch_threads`` (the training process's
#: intra-op threads) is no axis of the search: it changes only with the diagnosis that splits the cores, together
#: with the workers that diagnosis gives the cores to.
KNOBS: tuple[str, ...] = ("num_workers", "persistent_workers", "prefetch_factor", "pin_memory", "batch_size",
                          "torch_threads", "matmul_precision", "cudnn_benchmark", "autocast", "channels_last")
#: The knobs that change what the training computes (its numerics): tried only with ``tune --numerics``, on a GPU.
NUMERICS: tuple[str, ...] = ("matmul_precision", "cudnn_benchmark", "autocast", "channels_last")

KILL_GRACE_S = 8.0
#: After forwarding Ctrl-C, how long the trial has to save its session, then how long after SIGTERM.
INTERRUPT_GRACE_S = 5.0
TERM_GRACE_S = 3.0


@dataclass(frozen=True)
class TrialResult:
    index: int
    label: str  # why this configuration was tried: "original", "diagnosis", "num_workers", ...
    overrides: dict[str, Any]  # the --set arguments given
    config: dict[str, Any]  # the training loader's knobs as they ran (or as intended, if it failed)
    ok: bool
    reason: str | None = None  # why it failed
    rate: Rate | None = None
    unit: str = "samples/s"
    wall_s: float = 0.0
    verdict: str | None = None
    data_wait_fraction: float | None = None
    step_times_s: list[float] = field(default_factory=list)
    recommendations: list[dict[str, Any]] = field(default_factory=list)
    usable_cpus: int | None = None
    uses_device: bool = False
    trial_dir: str | None = None
    session: str | None = None
    code: dict[str, Any] | None = None  # where the training loader's settings go in the user's code (summary)
    other_cpus: float = 0.0  # CPUs other programs kept busy over its steady steps (its rate and advice are for that)

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index, "label": self.label, "overrides": self.overrides, "config": self.config,
            "ok": self.ok, "reason": self.reason,
            "rate": round(self.rate.value, 3) if self.rate else None,
            "rate_se": round(self.rate.se, 3) if self.rate else None,
            "steps_measured": self.rate.steps if self.rate else 0, "unit": self.unit,
            "wall_s": round(self.wall_s, 2), "verdict": self.verdict,
            "data_wait_fraction": self.data_wait_fraction, "trial_dir": self.trial_dir, "session": self.session,
            "other_cpus": round(self.other_cpus, 2),
        }


def set_arguments(overrides: Mapping[str, Any]) -> list[str]:
    """``["--set", "num_workers=2", ...]`` in the order the search visits the knobs."""
    return settings.set_arguments(overrides, KNOBS)


def trial_command(command: list[str], overrides: Mapping[str, Any], steps: int | None, json_path: Path,
                  store: Path) -> list[str]:
    cmd = [sys.executable, "-m", "stallscope", "run", "--quiet", "--json", str(json_path), "--store", str(store)]
    if steps:
        cmd += ["--steps", str(steps)]
    return [*cmd, *set_arguments(overrides), "--", *command]


def _family(proc: subprocess.Popen[bytes]) -> list[Any]:
    """The launcher and all its descendants now (the script runs in a session of its own, so signalling the
    launcher's group does not reach it); empty when psutil cannot tell."""
    try:
        import psutil

        root = psutil.Process(proc.pid)
        return [root, *root.children(recursive=True)]
    except Exception:
        return []


def _signal_group(proc: subprocess.Popen[bytes], signum: int) -> None:
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _exited_within(proc: subprocess.Popen[bytes], seconds: float) -> bool:
    try:
        proc.wait(seconds)
    except subprocess.TimeoutExpired:
        return False
    return True


def _stop_tree(proc: subprocess.Popen[bytes], steps: tuple[tuple[int, float], ...]) -> None:
    """Send each (signal, grace) of ``steps`` to the launcher's group until it exits, then SIGKILL whatever is
    left of the launcher's family (psutil checks a pid still names the same process before it signals)."""
    family = _family(proc)
    try:
        for signum, grace_s in steps:
            _signal_group(proc, signum)
            if _exited_within(proc, grace_s):
                break
    except KeyboardInterrupt:
        pass  # Ctrl-C again while waiting: no more grace
    finally:
        for p in [*family, *_family(proc)]:
            try:
                p.kill()
            except Exception:
                pass
        _signal_group(proc, signal.SIGKILL)
        proc.wait()


def _kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """A trial past its timeout: SIGTERM the launcher's group (it forwards to the script's own group, and
    still saves the session), then SIGKILL what is left."""
    _stop_tree(proc, ((signal.SIGTERM, KILL_GRACE_S),))


def _interrupt_tree(proc: subprocess.Popen[bytes]) -> None:
    """The tuner is leaving mid-trial (Ctrl-C, SIGTERM, an error): SIGINT first, as the terminal would have
    sent, so the trial's ``stallscope run`` stops the script and saves what it measured; then SIGTERM, then
    SIGKILL."""
    _stop_tree(proc, ((signal.SIGINT, INTERRUPT_GRACE_S), (signal.SIGTERM, TERM_GRACE_S)))


class Terminated(KeyboardInterrupt):
    """SIGTERM, turned into the same unwinding as Ctrl-C by :func:`interrupt_on_sigterm`."""

    signum = signal.SIGTERM


@contextlib.contextmanager
def interrupt_on_sigterm() -> Iterator[None]:
    """While trials run, SIGTERM (``kill``, a batch scheduler) ends the tuner as Ctrl-C does: the running trial
    is stopped and saves its session, and what was measured is kept. Python's default for SIGTERM would die at
    once and orphan the trial, which runs in a session of its own. Only the main thread may set handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum: int, frame: Any) -> None:
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def interrupted_exit_code(exc: KeyboardInterrupt) -> int:
    """128 + the signal that interrupted: 130 for Ctrl-C, 143 for SIGTERM, as a shell reports them."""
    return 128 + int(getattr(exc, "signum", signal.SIGINT))


def _tail(path: Path, limit: int = 400) -> str:
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        return ""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return (lines[-1] if lines else "")[-limit:]


def _is_oom(exit_code: int, failure: Mapping[str, Any] | None) -> bool:
    if exit_code in (137, -9, 128 + 9) and not failure:
        return True
    if not failure:
        return False
    text = f"{failure.get('type')} {failure.get('message')}".lower()
    return "memoryerror" in text or "out of memory" in text or "outofmemory" in text


def failure_reason(exit_code: int, summary: Mapping[str, Any] | None, stderr_tail: str,
                   disk_full: bool = False) -> str | None:
    """Why a finished trial does not count, or None when it does. ``disk_full``: the trial folder's disk has no
    room left, which explains a missing summary when the trial's own stderr (on the same disk) is empty too."""
    if summary is None:
        why = stderr_tail or ("the disk holding the trial folder is full" if disk_full else "")
        if exit_code == 0:  # the run ended well: only its summary is missing, so it cannot be measured
            return f"the run ended (exit 0) but its summary could not be written: {why or 'no reason was given'}"
        return f"stallscope run failed (exit {exit_code}): {why or 'no summary written'}"
    failure = summary.get("failure")
    code = summary.get("exit_code", exit_code)
    if _is_oom(code, failure):
        what = f": {failure.get('type')}: {failure.get('message')}" if failure else " (killed by SIGKILL)"
        return f"out of memory{what}"[:300]
    if code != 0:
        if failure:
            where = "in a DataLoader worker" if failure.get("where") == "worker" else "in the script"
            if failure.get("type") == "exit":  # no exception: the script (or a worker) exited with a code
                who = "a DataLoader worker" if failure.get("where") == "worker" else "the script"
                return f"{who} exited with code {code}"
            return f"crashed {where}: {failure.get('type')}: {failure.get('message')}"[:300]
        return f"the script exited with code {code}"
    if not summary.get("steady_steps"):
        if "loaders" in summary and not summary["loaders"]:
            return "no torch DataLoader was created: tune changes DataLoader arguments only"
        return "no training steps were measured"
    return None


def loader_knobs(config: Mapping[str, Any]) -> dict[str, Any]:
    """The tunable knobs of a recorded loader configuration, normalized (see :func:`normalize`)."""
    return normalize({k: config.get(k) for k in KNOBS})


def normalize(config: Mapping[str, Any]) -> dict[str, Any]:
    """Worker-only arguments mean nothing without workers; torch's default prefetch is 2."""
    out = dict(config)
    workers = int(out.get("num_workers") or 0)
    out["num_workers"] = workers
    out["pin_memory"] = bool(out.get("pin_memory"))
    if workers == 0:
        out["prefetch_factor"] = None
        out["persistent_workers"] = False
    else:
        out["prefetch_factor"] = out.get("prefetch_factor") or 2
        out["persistent_workers"] = bool(out.get("persistent_workers"))
    return out


def measured_rate(session: Any, config: Mapping[str, Any]) -> tuple[Rate | None, str, list[float]]:
    """Rate over the steady steps, after discarding warm-up and the prefetched start-up batches."""
    rate, unit, durations, _other = _measured(session, config)
    return rate, unit, durations


def _measured(session: Any, config: Mapping[str, Any]) -> tuple[Rate | None, str, list[float], float]:
    """``measured_rate``'s figures and the CPUs other programs kept busy over the steady steps."""
    from stallscope.analysis import analyze

    return _figures_of(analyze(session), config)


def _figures_of(analysis: Any, config: Mapping[str, Any]) -> tuple[Rate | None, str, list[float], float]:
    other = analysis.other_cpus
    steps = analysis.steps.steps
    batches = sum(s.batches for s in steps) / len(steps) if steps else 1.0
    skip = warmup_steps(len(steps), int(config.get("num_workers") or 0), config.get("prefetch_factor"),
                        batches, analysis.steps.warmup_steps)
    kept = steps[skip:]
    durations = [s.duration_ns / 1e9 for s in kept]
    if kept and all(s.samples is not None for s in kept):
        return rate_of(durations, [float(s.samples or 0) for s in kept]), "samples/s", durations, other
    return rate_of(durations), "steps/s", durations, other


def write_trial_figures(path: str, session: Any, analysis: Any) -> None:
    """In a trial's ``stallscope run``: what the tuner measures of the trial, from the Analysis that run made, so
    the tuner need not analyse the session again. Never a half-written file (``paths.write_file``)."""
    train = next((ld for ld in analysis.loaders if ld.role == "train"), None)
    rate, unit, durations, other = _figures_of(analysis, loader_knobs(train.config) if train else {})
    figures = {"rate": asdict(rate) if rate else None, "unit": unit, "durations_s": durations,
               "other_cpus": other, "uses_device": bool(session.transfers)}
    paths.write_file(Path(path), json.dumps(figures))


def _read_trial_figures(path: Path) -> tuple[Rate | None, str, list[float], float, bool] | None:
    """The figures a trial's run wrote (``write_trial_figures``); None where it wrote none (it died first)."""
    try:
        figures = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    rate = Rate(**figures["rate"]) if figures["rate"] else None
    return rate, figures["unit"], figures["durations_s"], figures["other_cpus"], figures["uses_device"]


def launch(cmd: list[str], trial_dir: Path, timeout_s: float, env: Mapping[str, str]) -> tuple[int | None, float]:
    """Run ``cmd`` with its output in ``trial_dir``; (exit code or None when it timed out, seconds)."""
    t0 = time.monotonic()
    with open(trial_dir / "stdout.txt", "wb") as out, open(trial_dir / "stderr.txt", "wb") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=dict(env),
                                start_new_session=True)
        try:
            exit_code: int | None = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            _kill_tree(proc)
            exit_code = None
        except BaseException:  # Ctrl-C, SIGTERM (see interrupt_on_sigterm), an error: no orphaned trial
            _interrupt_tree(proc)
            raise
    return exit_code, time.monotonic() - t0


def run_trial(command: list[str], overrides: Mapping[str, Any], *, index: int, label: str, trial_dir: Path,
              store: Path, steps: int | None, timeout_s: float, intended: Mapping[str, Any] | None = None,
              env: Mapping[str, str] | None = None) -> TrialResult:
    """Run one trial and return its measured rate, or why it failed. Never raises for the script's faults."""
    trial_dir.mkdir(parents=True, exist_ok=True)
    json_path = trial_dir / "summary.json"
    cmd = trial_command(command, overrides, steps, json_path, store)
    (trial_dir / "command.json").write_text(json.dumps(cmd))
    figures_path = trial_dir / "figures.json"
    child_env = dict(os.environ)
    child_env.update(env or {})
    child_env[settings.ENV_TRIAL_FIGURES] = str(figures_path)
    base: dict[str, Any] = dict(overrides=dict(overrides), index=index, label=label, trial_dir=str(trial_dir))
    intended_config = normalize(dict(intended or overrides))
    exit_code, wall = launch(cmd, trial_dir, timeout_s, child_env)
    if exit_code is None:
        return TrialResult(**base, config=intended_config, ok=False, wall_s=wall,
                           reason=f"timed out after {timeout_s:.0f} s (killed)")
    summary = json.loads(json_path.read_text()) if json_path.exists() else None
    if exit_code < 0 and summary is None:
        killed = "out of memory (killed by SIGKILL)" if exit_code == -signal.SIGKILL \
            else f"killed by signal {-exit_code}"
        return TrialResult(**base, config=intended_config, ok=False, wall_s=wall, reason=killed)
    reason = failure_reason(exit_code, summary, _tail(trial_dir / "stderr.txt"),
                            disk_full=summary is None and paths.disk_full(trial_dir))
    train = next((ld for ld in (summary or {}).get("loaders", []) if ld.get("role") == "train"), None)
    config = loader_knobs(train["config"]) if train else intended_config
    if reason is not None or summary is None:  # (a run without a summary always has a reason)
        return TrialResult(**base, config=config, ok=False, wall_s=wall, reason=reason,
                           session=(summary or {}).get("session"))
    from stallscope.session import Session

    figures = _read_trial_figures(figures_path)
    if figures is not None:
        rate, unit, durations, other, uses_device = figures
    else:  # a run that wrote none (an older stallscope on the path): its session, analysed here
        try:
            session = Session.load(summary["session"])
            rate, unit, durations, other = _measured(session, config)
            uses_device = bool(session.transfers)
        except Exception as exc:  # an unreadable session is this trial's failure, not the tuner's
            said = (f"could not read {exc.filename}: {exc.strerror}" if isinstance(exc, OSError) and exc.filename
                    and exc.strerror else f"could not analyze its session: {type(exc).__name__}: {exc}")
            return TrialResult(**base, config=config, ok=False, wall_s=wall, reason=said)
    if rate is None:
        return TrialResult(**base, config=config, ok=False, wall_s=wall, reason="no steady steps to measure")
    return TrialResult(**base, config=config, ok=True, rate=rate, unit=unit, wall_s=wall,
                       verdict=summary.get("verdict"), data_wait_fraction=summary.get("data_wait_fraction"),
                       step_times_s=durations, recommendations=list(summary.get("recommendations") or []),
                       usable_cpus=summary.get("usable_cpus"), uses_device=uses_device,
                       session=summary.get("session"), code=train.get("code") if train else None,
                       other_cpus=other)

"""Shared helpers: run the real CLI in a subprocess and read its summary JSON; the suite's rerun policy; data
sets made once per run."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests import patch_guard

SCRIPTS = Path(__file__).parent / "scripts"

#: How many times a failed ``speed`` test runs again (pytest-rerunfailures, each rerun reported as R in the
#: summary); every other test runs once.
SPEED_RERUNS = 2


@pytest.hookimpl(tryfirst=True)  # before -m selects: `-m serial` must see the markers added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The flakiness policy, in one place. A ``speed`` test asserts on what this machine measured (a speedup, a
    ranking, shares of time), so other programs on a shared machine can fail it: it reruns up to SPEED_RERUNS
    times and is ``serial`` (no test of this suite beside it). No other test reruns: a flake there is a bug."""
    if config.pluginmanager.hasplugin("rerunfailures"):
        if config.getoption("reruns", None) or config.getoption("force_reruns", None) or config.getini("reruns"):
            raise pytest.UsageError("--reruns/--force-reruns would rerun every test: only `speed` tests rerun "
                                    "(tests/conftest.py)")
    for item in items:
        if item.get_closest_marker("speed"):
            item.add_marker(pytest.mark.flaky(reruns=SPEED_RERUNS))
            item.add_marker(pytest.mark.serial)
        elif item.get_closest_marker("flaky"):
            raise pytest.UsageError(f"{item.nodeid}: only a test marked `speed` may rerun; mark it so if its "
                                    "outcome rests on the machine's speed, or fix what makes it flaky")


def made_once(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], Path]) -> Path:
    """``make(folder)``'s result, made once for the whole run: under pytest-xdist the workers share their base
    folder's parent, and the first to ask makes it there under a lock while the others wait (a data set generated
    in each worker would cost each the same minutes)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    folder, made = base / f"once-{name}", base / f"once-{name}.made"
    with open(base / f"once-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not made.is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            made.write_text(str(make(folder)))
    return Path(made.read_text())


def wait_for(condition, timeout_s: float = 30) -> bool:
    """Poll ``condition`` until it holds: a guard against hanging, not a timing assertion."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def can_mount_tmpfs(where: Path) -> bool:
    """True where this machine lets a private mount namespace (``unshare -rm``) mount a tmpfs on ``where``: the way
    the tests fill a real disk without touching the machine's own."""
    import shutil

    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {where}"],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


def on_a_small_disk(tmp_path: Path, disk: Path, commands: str, size: str = "64k", fill: bool = False,
                    env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``commands`` (shell, run in ``tmp_path``) with a ``size`` tmpfs mounted on ``disk`` in a private mount
    namespace: filled to the last byte first (``fill``), or left for the commands to fill. Skips the test where this
    machine allows no such mount."""
    import pytest

    disk.mkdir(exist_ok=True)
    if not can_mount_tmpfs(disk):
        pytest.skip("this machine does not allow mounting a tmpfs")
    driver = f"mount -t tmpfs -o size={size} tmpfs {disk} && "
    driver += f"head -c {size} /dev/zero > {disk}/filler; " if fill else ""
    return subprocess.run(["unshare", "-rm", "sh", "-c", driver + commands], capture_output=True, text=True,
                          timeout=timeout, cwd=tmp_path, env=env)


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str
    summary: dict[str, Any] | None


def run_cli(tmp_path: Path, args: list[str], json_name: str = "summary.json", timeout: float = 240,
            cwd: Path | None = None) -> CliResult:
    """``python -m stallscope run --json ... --store ... ARGS`` and the parsed summary (None if absent)."""
    out = tmp_path / json_name
    if out.exists():
        out.unlink()
    cmd = [sys.executable, "-m", "stallscope", "run", "--json", str(out), "--store", str(tmp_path / "store"), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd or tmp_path)
    summary = json.loads(out.read_text()) if out.exists() else None
    return CliResult(proc.returncode, proc.stdout, proc.stderr, summary)


@pytest.fixture(autouse=True)
def recorder_left_as_found():
    """Fail a test that leaves a recorder patch installed or the recorder configured in this process."""
    yield
    left = patch_guard.installed()
    assert not left, f"the test left the recorder's changes in place: {left[:10]}"


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """400 real-photo JPEGs of about 500x400 in 10 class folders."""
    from stallscope.demo.dataset import DatasetSpec, make_dataset

    return made_once(tmp_path_factory, "images", lambda where: make_dataset(where, DatasetSpec(n_files=400, seed=1)))


@pytest.fixture(scope="session")
def large_image_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """60 JPEGs of about 2000x1500: decoding dominates."""
    from stallscope.demo.dataset import DatasetSpec, make_dataset

    spec = DatasetSpec(n_files=60, width=2000, height=1500, quality_min=90, quality_max=95)
    return made_once(tmp_path_factory, "large", lambda where: make_dataset(where, spec))


@pytest.fixture(scope="session")
def demo_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An XDG_CACHE_HOME that holds the demo's dataset (2,000 JPEGs, about 80 MB), made once for the run rather than
    by each test's first ``stallscope demo``."""
    from unittest import mock

    from stallscope.demo.dataset import demo_dataset

    def make(where: Path) -> Path:
        with mock.patch.dict(os.environ, {"XDG_CACHE_HOME": str(where)}):
            demo_dataset()
        return where

    return made_once(tmp_path_factory, "demo-cache", make)


def free_port() -> int:
    """A port free on loopback now (a process may take it before the caller binds it: fine for tests run serially
    against one launcher)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

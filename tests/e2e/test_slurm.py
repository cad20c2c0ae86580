"""A real `srun`: a one-machine Slurm cluster of our own (munged, slurmctld and slurmd from Debian's slurm-wlm packages,
on their own socket, ports and spool folders), and `srun -n 2 stallscope run -- python train.py`: each task one
launcher and one rank, gathered into one job named by Slurm's job id. Skipped where the daemons are not installed
(``.ci/run`` installs them where apt-get works) or this is not root."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stallscope.analysis import analyze
from stallscope.render.summary import summary_dict
from stallscope.session import Session
from tests.conftest import SCRIPTS, free_port

pytestmark = pytest.mark.e2e

DDP = str(SCRIPTS / "ddp_train.py")
DAEMONS = ("/usr/sbin/munged", "/usr/sbin/mungekey", "/usr/sbin/slurmctld", "/usr/sbin/slurmd")


def _up(env: dict[str, str], deadline: float) -> bool:
    while time.monotonic() < deadline:
        done = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, env=env, check=False)
        if done.returncode == 0 and done.stdout.strip() in ("idle", "mix", "alloc"):
            return True
        time.sleep(0.5)
    return False


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment under which sinfo and srun reach a private one-node cluster."""
    if os.geteuid() != 0 or not all(os.access(p, os.X_OK) for p in DAEMONS) or not shutil.which("srun"):
        pytest.skip("a real srun needs root and slurm-wlm's daemons (apt-get install slurmd slurmctld slurm-client "
                    "munge)")
    base = tmp_path_factory.mktemp("slurm")
    base.chmod(0o755)
    for sub in ("ctld", "d"):
        (base / sub).mkdir()
    key = base / "munge.key"
    _start(["/usr/sbin/mungekey", "-c", "-k", str(key)])
    key.chmod(0o600)
    munge = [f"--socket={base / 'munge.sock'}", f"--key-file={key}", f"--pid-file={base / 'munged.pid'}",
             f"--log-file={base / 'munged.log'}", f"--seed-file={base / 'munged.seed'}"]
    _start(["/usr/sbin/munged", "-f", *munge])
    host, ports = socket.gethostname(), (free_port(), free_port())
    conf = base / "slurm.conf"
    conf.write_text("\n".join([
        f"ClusterName=ss{os.getpid() % 100000}", f"SlurmctldHost={host}", "SlurmUser=root", "SlurmdUser=root",
        "AuthType=auth/munge", f"AuthInfo=socket={base / 'munge.sock'}", "CredType=cred/munge",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU", "ReturnToService=2", f"SlurmctldPort={ports[0]}", f"SlurmdPort={ports[1]}",
        f"StateSaveLocation={base / 'ctld'}", f"SlurmdSpoolDir={base / 'd'}", f"SlurmctldPidFile={base / 'ctld.pid'}",
        f"SlurmdPidFile={base / 'd.pid'}", f"SlurmctldLogFile={base / 'ctld.log'}", f"SlurmdLogFile={base / 'd.log'}",
        "MpiDefault=none", f"NodeName={host} CPUs={os.cpu_count() or 1} State=UNKNOWN",
        f"PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES", ""]))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    try:
        _start(["/usr/sbin/slurmctld", "-i", "-f", str(conf)], env)
        _start(["/usr/sbin/slurmd", "-f", str(conf)], env)
        if not _up(env, time.monotonic() + 60):
            pytest.skip("the private Slurm cluster did not come up: " + (base / "d.log").read_text()[-1000:])
        yield env
    finally:
        _stop(base, ("d.pid", "ctld.pid", "munged.pid"))


def _start(argv: list[str], env: dict[str, str] | None = None) -> None:
    """A daemon started (it forks away), or the test skipped with its words: this machine cannot run it."""
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot start {Path(argv[0]).name} here: {(done.stderr or done.stdout).strip()[-500:]}")


def _stop(base: Path, pid_files: tuple[str, ...]) -> None:
    """The daemons ended: SIGTERM, and SIGKILL for one still there 10 s later."""
    pids = []
    for pid_file in pid_files:
        try:
            pids.append(int((base / pid_file).read_text().split()[0]))
            os.kill(pids[-1], signal.SIGTERM)
        except (OSError, ValueError, IndexError):
            pass
    deadline = time.monotonic() + 10
    for pid in pids:
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
            time.sleep(0.2)
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def test_a_real_srun_job_is_gathered_and_named_by_its_slurm_job_id(tmp_path, slurm):
    port = free_port()
    task = (f"exec {sys.executable} -m stallscope run --quiet --json s$SLURM_PROCID.json --store store$SLURM_PROCID "
            f"--gather-wait 90 -- {sys.executable} {DDP} --slurm 127.0.0.1:{port} --samples 256 --barrier "
            "--slow-rank 1 --slow-ms 4")
    done = subprocess.run(["srun", "-N1", "-n2", "sh", "-c", task], cwd=tmp_path, env=slurm, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    own = [json.loads((tmp_path / f"s{n}.json").read_text()) for n in (0, 1)]
    job_ids = {s["job"]["id"] for s in own}
    assert len(job_ids) == 1 and next(iter(job_ids)).startswith("slurm="), job_ids
    assert sorted(s["job"]["ranks_here"][0] for s in own) == [0, 1]
    job_id = next(iter(job_ids)).split("=", 1)[1].split()[0]
    assert sorted(s["run_id"].split("-", 2)[2].rsplit("-", 1)[0] for s in own) == [
        f"slurm-{job_id}-task0", f"slurm-{job_id}-task1"]
    merged = list(tmp_path.glob("store*/jobs/slurm=*/*.session.json"))
    assert len(merged) == 1, done.stderr[-3000:]
    session = Session.load(merged[0])
    summary = summary_dict(session, analyze(session), merged[0])
    assert [r["rank"] for r in summary["ranks"]] == [0, 1] and summary["job"]["missing_ranks"] == []
    assert (summary["distributed"]["straggler"]["rank"], summary["distributed"]["straggler"]["node"]) == (1, "storage")
    assert Path(merged[0]).parent.name == next(iter(job_ids))

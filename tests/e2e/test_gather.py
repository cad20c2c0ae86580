"""A job on several "nodes" (one launcher each, torchrun --nnodes over loopback) comes out as one report with no
manual step: through the store folder where the nodes share it, over torch's TCPStore at the job's address where they
do not; a node killed mid-run is named in the report of the others."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from stallscope.analysis import analyze
from stallscope.render.summary import summary_dict
from stallscope.session import Session
from tests.conftest import SCRIPTS, free_port

pytestmark = pytest.mark.e2e

DDP = str(SCRIPTS / "ddp_train.py")


def _start(tmp_path: Path, node: int, nodes: int, port: int, store: Path, *job_args: str,
           gather_wait: float = 90) -> subprocess.Popen[str]:
    cwd = tmp_path / f"node{node}"
    cwd.mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "stallscope", "run", "--quiet", "--json", str(cwd / "s.json"), "--store", str(store),
           "--gather-wait", str(gather_wait), "--", sys.executable, "-m", "torch.distributed.run", "--nnodes",
           str(nodes), "--node_rank", str(node), "--nproc_per_node", "1", "--master_addr", "127.0.0.1",
           "--master_port", str(port), DDP, *job_args]
    return subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _finish(procs: list[subprocess.Popen[str]], timeout: float = 300) -> list[str]:
    """Every launcher's output once it ended; on a hang, every one killed (with what it started), outputs said."""
    deadline, outputs = time.monotonic() + timeout, []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
    except subprocess.TimeoutExpired:
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                proc.kill()
        pytest.fail("the launchers did not end: " + " | ".join(p.communicate()[0][-2000:] for p in procs))
    return outputs


def _merged(outputs: list[str]) -> tuple[int, Path]:
    """The node that merged, and where it saved the job's session (from its own words)."""
    said = [(node, line) for node, out in enumerate(outputs) for line in out.splitlines()
            if "node sessions merged into " in line]
    assert len(said) == 1, outputs
    node, line = said[0]
    return node, Path(line.split("merged into ", 1)[1].split(";")[0].strip())


def _summary(path: Path) -> dict:
    session = Session.load(path)
    return summary_dict(session, analyze(session), path)


@pytest.mark.parametrize("nodes,shared", [(2, True), (3, False)], ids=["2-shared", "3-apart"])
def test_a_job_on_several_nodes_is_gathered_into_one_report(tmp_path, nodes, shared):
    port = free_port()
    stores = [tmp_path / "store" if shared else tmp_path / f"node{n}" / "store" for n in range(nodes)]
    slow = nodes - 1  # the last node's rank reads every sample 4 ms slower
    procs = [_start(tmp_path, n, nodes, port, stores[n], "--samples", str(128 * nodes), "--barrier",
                    "--slow-rank", str(slow), "--slow-ms", "4") for n in range(nodes)]
    outputs = _finish(procs)
    assert [p.returncode for p in procs] == [0] * nodes, outputs
    merger, path = _merged(outputs)
    assert path.parent == stores[merger] / "jobs" / f"port={port}"
    for node, out in enumerate(outputs):
        if node != merger:
            assert ("merged on" in out and str(path) in out) or "another node of the job is merging it" in out, out
    summary = _summary(path)
    assert [r["rank"] for r in summary["ranks"]] == list(range(nodes))
    assert summary["job"]["id"] == f"port={port}" and summary["job"]["missing_ranks"] == []
    assert sorted(r for n in summary["job"]["nodes"] for r in n["ranks"]) == list(range(nodes))
    straggler = summary["distributed"]["straggler"]
    assert (straggler["rank"], straggler["node"]) == (slow, "storage")
    # each node's own summary names the job it is part of
    own = [json.loads((tmp_path / f"node{n}" / "s.json").read_text()) for n in range(nodes)]
    assert [(s["job"]["id"], s["job"]["ranks_here"], s["job"]["world_size"]) for s in own] == [
        (f"port={port}", [n], nodes) for n in range(nodes)]


def _two_nodes_past_step_3(tmp_path: Path, gather_wait: float) -> list[subprocess.Popen[str]]:
    """Two nodes with their own stores, a long job (rank 1 slowed), once node 1's rank has taken 3 steps."""
    port, mark = free_port(), tmp_path / "mark"
    job = ["--samples", "4096", "--barrier", "--slow-rank", "1", "--slow-ms", "4", "--mark", str(mark)]
    procs = [_start(tmp_path, n, 2, port, tmp_path / f"node{n}" / "store", *job, gather_wait=gather_wait)
             for n in (0, 1)]
    deadline = time.monotonic() + 240
    while not Path(f"{mark}.1").exists():
        if time.monotonic() > deadline or procs[1].poll() is not None:
            _finish(procs, timeout=1)  # ends them all, saying what they printed
            pytest.fail("node 1's rank never took 3 steps")
        time.sleep(0.2)
    return procs


def test_a_node_killed_mid_run_is_named_in_the_job_report(tmp_path):
    """Node 1's launcher and everything under it are killed (SIGKILL) after its rank took 3 steps: node 0's job
    fails on the lost peer, keeps its exit code, and its report names rank 1 as having sent nothing."""
    procs = _two_nodes_past_step_3(tmp_path, gather_wait=8)
    os.killpg(procs[1].pid, signal.SIGKILL)
    procs[1].wait()
    out = _finish(procs[:1])[0]
    own = json.loads((tmp_path / "node0" / "s.json").read_text())
    assert procs[0].returncode == own["exit_code"] != 0, out
    merger, path = _merged([out])
    summary = _summary(path)
    assert summary["job"]["missing_ranks"] == [1] and summary["job"]["ranks_here"] == [0], summary["job"]
    assert any("rank 1 of the job's 2 sent no session within" in n for n in summary["notes"]), summary["notes"]
    assert "wait-for-other-nodes" not in [r["id"] for r in summary["recommendations"]]


def _srun_env(task: int, tasks: int, job_id: str) -> dict[str, str]:
    """What `srun --nodes N --ntasks-per-node 1` sets for a task (Slurm 23.x), less what only its own daemons read."""
    return {**os.environ, "SLURM_JOB_ID": job_id, "SLURM_JOBID": job_id, "SLURM_JOB_NAME": "train",
            "SLURM_STEP_ID": "0", "SLURM_STEPID": "0", "SLURM_PROCID": str(task), "SLURM_LOCALID": "0",
            "SLURM_NODEID": str(task), "SLURM_NTASKS": str(tasks), "SLURM_NPROCS": str(tasks),
            "SLURM_NNODES": str(tasks), "SLURM_JOB_NUM_NODES": str(tasks),
            "SLURM_JOB_NODELIST": f"node[0-{tasks - 1}]", "SLURM_STEP_NODELIST": f"node[0-{tasks - 1}]",
            "SLURMD_NODENAME": f"node{task}", "SLURM_TASKS_PER_NODE": f"1(x{tasks})",
            "SLURM_STEP_TASKS_PER_NODE": f"1(x{tasks})", "SLURM_LAUNCH_NODE_IPADDR": "127.0.0.1",
            "SLURM_SRUN_COMM_HOST": "127.0.0.1", "SLURM_CPUS_ON_NODE": "2", "SLURM_SUBMIT_DIR": os.getcwd(),
            "SLURM_CLUSTER_NAME": "test"}


def test_srun_tasks_are_gathered_like_torchrun_nodes(tmp_path):
    """`srun stallscope run -- python train.py`: each task one launcher and one rank (rank and world size from
    SLURM_PROCID and SLURM_NTASKS, init_process_group at tcp://HOST:PORT, no MASTER_* variables): the job is named by
    Slurm's job id and gathered as torchrun's nodes are, with the same straggler."""
    port = free_port()
    procs = []
    for task in (0, 1):
        cwd = tmp_path / f"node{task}"
        cwd.mkdir()
        cmd = [sys.executable, "-m", "stallscope", "run", "--quiet", "--json", str(cwd / "s.json"), "--store",
               str(cwd / "store"), "--gather-wait", "90", "--", sys.executable, DDP, "--slurm", f"127.0.0.1:{port}",
               "--samples", "256", "--barrier", "--slow-rank", "1", "--slow-ms", "4"]
        procs.append(subprocess.Popen(cmd, cwd=cwd, env=_srun_env(task, 2, "4242"), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, start_new_session=True))
    outputs = _finish(procs)
    assert [p.returncode for p in procs] == [0, 0], outputs
    own = [json.loads((tmp_path / f"node{n}" / "s.json").read_text()) for n in (0, 1)]
    assert [(s["job"]["id"], s["job"]["ranks_here"]) for s in own] == [("slurm=4242", [0]), ("slurm=4242", [1])]
    assert [s["run_id"].split("-", 2)[2].rsplit("-", 1)[0] for s in own] == ["slurm-4242-task0", "slurm-4242-task1"]
    _, path = _merged(outputs)
    assert path.parent.name == "slurm=4242"
    summary = _summary(path)
    assert [r["rank"] for r in summary["ranks"]] == [0, 1] and summary["job"]["missing_ranks"] == []
    assert (summary["distributed"]["straggler"]["rank"], summary["distributed"]["straggler"]["node"]) == (1, "storage")


@dataclass(frozen=True)
class Host:
    netns: str
    name: str  # its host name, as its own UTS namespace and every host's /etc/hosts say
    address: str
    device: str

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run on this "host": in its network namespace, under its own host name."""
        return ["ip", "netns", "exec", self.netns, "unshare", "--uts", "sh", "-c", f'hostname {self.name}; exec "$@"',
                "sh", *argv]


@pytest.fixture
def hosts():
    """make(N): N "machines" on one link: a network namespace each (its own loopback and host name, 10.77.X.i on a
    veth attached to a bridge), with an /etc/hosts naming them all (``ip netns exec`` mounts /etc/netns/NS/hosts).
    torchrun's c10d rendezvous hands the ranks the host's name, so the names must resolve to the link. Needs root,
    iproute2 and unshare; skipped where any is missing or the kernel refuses."""
    made: list[list[str]] = []
    tag = f"s{secrets.token_hex(2)}"  # a name of its own: a namespace just deleted frees its links only later

    def run(*step: str) -> None:
        done = subprocess.run(list(step), capture_output=True, text=True, check=False)
        if done.returncode != 0:
            pytest.skip(f"cannot make network namespaces here: {' '.join(step)}: {done.stderr.strip()}")

    def make(count: int) -> list[Host]:
        if os.geteuid() != 0 or not (shutil.which("ip") and shutil.which("unshare")):
            pytest.skip("network namespaces need root, iproute2 (ip) and unshare")
        net = secrets.randbelow(200) + 20
        bridge = f"{tag}br"
        run("ip", "link", "add", bridge, "type", "bridge")
        made.append(["ip", "link", "del", bridge])
        run("ip", "link", "set", bridge, "up")
        found = [Host(f"{tag}n{i}", f"{tag}node{i}", f"10.77.{net}.{i + 1}", f"{tag}v{i}") for i in range(count)]
        names = "".join(f"{h.address} {h.name}\n" for h in found)
        for i, h in enumerate(found):
            run("ip", "netns", "add", h.netns)
            made.append(["ip", "netns", "del", h.netns])
            Path(f"/etc/netns/{h.netns}").mkdir(parents=True, exist_ok=True)
            Path(f"/etc/netns/{h.netns}/hosts").write_text(f"127.0.0.1 localhost\n{names}")
            made.append(["rm", "-rf", f"/etc/netns/{h.netns}"])
            run("ip", "link", "add", h.device, "type", "veth", "peer", "name", f"{tag}p{i}")
            run("ip", "link", "set", h.device, "netns", h.netns)
            run("ip", "link", "set", f"{tag}p{i}", "master", bridge)
            run("ip", "link", "set", f"{tag}p{i}", "up")
            run("ip", "-n", h.netns, "addr", "add", f"{h.address}/24", "dev", h.device)
            run("ip", "-n", h.netns, "link", "set", h.device, "up")
            run("ip", "-n", h.netns, "link", "set", "lo", "up")
        return found

    try:
        yield make
    finally:
        for step in reversed(made):
            subprocess.run(step, capture_output=True, check=False)


@pytest.mark.parametrize("count,rendezvous,shared", [(2, "static", False), (3, "c10d", False), (2, "c10d", True)],
                         ids=["2-static-apart", "3-c10d-apart", "2-c10d-shared"])
def test_nodes_on_separate_hosts_are_gathered_over_the_jobs_address(tmp_path, hosts, count, rendezvous, shared):
    """Each node on its own "host". With its own store, the node that owns the job's address hosts the gathering
    once torchrun there has let the port go, and the others can only reach it over the link; with one store folder
    the hosts share (a shared file system), the last node to finish merges there."""
    machines = hosts(count)
    port = free_port()
    where = (["--master_addr", machines[0].address, "--master_port", str(port)] if rendezvous == "static" else
             ["--rdzv_backend", "c10d", "--rdzv_endpoint", f"{machines[0].name}:{port}", "--rdzv_id", "job-7"])
    procs = []
    for node, host in enumerate(machines):
        cwd = tmp_path / f"node{node}"
        cwd.mkdir()
        rank_args = ["--node_rank", str(node)] if rendezvous == "static" else []
        store = tmp_path / "shared-store" if shared else cwd / "store"
        cmd = [sys.executable, "-m", "stallscope", "run", "--quiet", "--json", str(cwd / "s.json"), "--store",
               str(store), "--gather-wait", "90", "--", sys.executable, "-m", "torch.distributed.run",
               "--nnodes", str(count), *rank_args, "--nproc_per_node", "1", *where, DDP, "--samples",
               str(128 * count), "--barrier", "--slow-rank", str(count - 1), "--slow-ms", "4"]
        env = {**os.environ, "GLOO_SOCKET_IFNAME": host.device}  # gloo's own address: the link's
        procs.append(subprocess.Popen(host.command(cmd), cwd=cwd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, start_new_session=True))
    outputs = _finish(procs)
    assert [p.returncode for p in procs] == [0] * count, outputs
    merger, path = _merged(outputs)
    assert path.is_relative_to(tmp_path / "shared-store" if shared else tmp_path / f"node{merger}" / "store"), outputs
    for node, out in enumerate(outputs):
        if node != merger:
            assert (("the job's report was merged on" in out and str(path) in out)
                    or (shared and "another node of the job is merging it" in out)), out
    summary = _summary(path)
    assert [r["rank"] for r in summary["ranks"]] == list(range(count)) and summary["job"]["missing_ranks"] == []
    assert sorted(n["host"] for n in summary["job"]["nodes"]) == sorted(h.name for h in machines)
    # c10d numbers the ranks itself: the slow one is wherever rank count-1 ran
    straggler = summary["distributed"]["straggler"]
    assert (straggler["rank"], straggler["node"]) == (count - 1, "storage")
    if rendezvous == "c10d":  # each node's run folder is named by the job (torchrun's run id)
        assert all("-run-job-7-" in n["run_id"] for n in summary["job"]["nodes"]), summary["job"]["nodes"]


@pytest.mark.parametrize("trouble", ["rendezvous-timeout", "store-unreachable"])
def test_a_node_whose_job_never_met_keeps_its_session_and_exit_code(tmp_path, trouble):
    """torchrun's c10d rendezvous that no other node joins (it times out), or whose store no node hosts (it cannot be
    reached): torchrun fails before any rank starts; the node's launcher keeps its exit code and saves its session,
    and has nothing to gather."""
    conf = "join_timeout=10" if trouble == "rendezvous-timeout" else "is_host=0,timeout=10,read_timeout=10"
    out = tmp_path / "s.json"
    done = subprocess.run([sys.executable, "-m", "stallscope", "run", "--quiet", "--json", str(out), "--store",
                           str(tmp_path / "store"), "--", sys.executable, "-m", "torch.distributed.run", "--nnodes",
                           "2", "--nproc_per_node", "1", "--rdzv_backend", "c10d", "--rdzv_endpoint",
                           f"127.0.0.1:{free_port()}", "--rdzv_id", trouble, "--rdzv_conf", conf, DDP, "--samples",
                           "64"], capture_output=True, text=True, timeout=240, check=False)
    summary = json.loads(out.read_text())
    assert done.returncode == summary["exit_code"] == 1, done.stderr[-3000:]
    assert Path(summary["session"]).is_file() and summary["job"] is None
    assert "merged" not in done.stderr and not (tmp_path / "store" / "jobs").exists()


def test_ctrl_c_on_one_nodes_launcher_keeps_every_nodes_session_and_exit_code(tmp_path):
    """SIGINT to node 1's launcher after its rank's third step (a terminal's Ctrl-C): node 1's job stops (torchrun
    ends its rank and exits 1) and node 0's fails on the lost peer; each node keeps its session and its exit code, and
    the job's report is gathered once, on whichever node hosted it (node 1 may already have left: then rank 1 is named
    as having sent nothing)."""
    procs = _two_nodes_past_step_3(tmp_path, gather_wait=10)
    procs[1].send_signal(signal.SIGINT)
    outputs = _finish(procs)
    own = [json.loads((tmp_path / f"node{n}" / "s.json").read_text()) for n in (0, 1)]
    for proc, summary in zip(procs, own):
        assert proc.returncode == summary["exit_code"] != 0 and Path(summary["session"]).is_file(), outputs
    _, path = _merged(outputs)
    assert _summary(path)["job"]["missing_ranks"] in ([], [1])

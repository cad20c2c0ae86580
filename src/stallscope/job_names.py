"""What the launcher says the job is: torchrun's run id, Slurm's job id, a Kubernetes PyTorchJob's name.

Read in each rank (the words every rank of one job shares, which ``merge`` and the gathering compare) and in the
launcher before the script starts (a short label that names each node's run folder after its job).
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping, Sequence

#: A pod's name as the Kubernetes training operators make it: ``<job>-master-0``/``<job>-worker-3`` (PyTorchJob),
#: ``<job>-node-0-1-<5 letters>`` (Kubeflow Trainer's TrainJob, through a JobSet).
POD_NAME = re.compile(r"^(?P<job>[a-z0-9][a-z0-9.-]*?)-(?:(?:master|worker)-\d+|node-\d+-\d+(?:-[a-z0-9]{5})?)$")

#: torchrun's options (either spelling) whose values name the job and the node.
_RDZV_ID = ("--rdzv-id", "--rdzv_id")
_NODE_RANK = ("--node-rank", "--node_rank")


def kubernetes_job(env: Mapping[str, str]) -> str | None:
    """The PyTorchJob (or TrainJob) a pod runs, read from its pod name where the operator's torchrun variables
    (``PET_*``) say it is one; None elsewhere, and for a pod on the host's network (its name is the machine's)."""
    if not any(name in env for name in ("PET_NNODES", "PET_MASTER_ADDR", "PET_MASTER_PORT")):
        return None
    found = POD_NAME.match(env.get("HOSTNAME") or socket.gethostname())
    return found["job"] if found else None


def job_identity(env: Mapping[str, str] | None = None) -> str | None:
    """The job as ``key=value`` words every rank of one job shares: torchrun's run id (not its default ``none``),
    Slurm's job id, a PyTorchJob's name, the rendezvous store's port (the address is left out: nodes may name one
    host differently). ``merge`` refuses sessions whose words disagree."""
    env = os.environ if env is None else env
    words = [f"{key}={env[name]}" for key, name in (("run", "TORCHELASTIC_RUN_ID"), ("slurm", "SLURM_JOB_ID"))
             if env.get(name, "").strip() not in ("", "none")]
    if job := kubernetes_job(env):
        words.append(f"pytorchjob={job}")
    if env.get("MASTER_PORT", "").strip():
        words.append(f"port={env['MASTER_PORT'].strip()}")
    return " ".join(words) or None


def _option(argv: Sequence[str], names: tuple[str, ...]) -> str | None:
    """The value of a launcher option given as ``--name VALUE`` or ``--name=VALUE`` (the last one wins)."""
    value = None
    for i, arg in enumerate(argv):
        name, eq, inline = arg.partition("=")
        if name in names:
            value = inline if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return value


def _torchrun_args(argv: Sequence[str]) -> list[str] | None:
    """torchrun's own options (those before the script), or None when the command is no torchrun."""
    for i, arg in enumerate(argv):
        base = os.path.basename(arg)
        if base in ("torchrun", "torchrun.exe"):
            return list(argv[i + 1:])
        if arg == "-m" and i + 1 < len(argv) and argv[i + 1] in ("torch.distributed.run", "torch.distributed.launch"):
            return list(argv[i + 2:])
    return None


def _script_at(args: list[str]) -> int:
    """Where torchrun's options end: the first word that is neither an option nor an option's value."""
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("-"):
            return i
        flag_only = "=" in arg or arg in ("--standalone", "--no-python", "--no_python", "-m", "--module",
                                          "--virtual-local-rank", "--virtual_local_rank", "--use-env", "--use_env",
                                          "--run-path", "--run_path")
        i += 1 if flag_only else 2
    return i


def torchrun_options(argv: Sequence[str]) -> list[str] | None:
    """The options a torchrun command gives torchrun itself (not its script's), or None when it is no torchrun."""
    torchrun = _torchrun_args(argv)
    return torchrun[:_script_at(torchrun)] if torchrun is not None else None


def run_label(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str | None:
    """A short name of the job and this node for the run's folder (``slurm-812-task1``, ``pytorchjob-bert-node2``,
    ``run-exp7-node1``), from what the launcher knows before the script starts; None outside a job."""
    env = os.environ if env is None else env
    torchrun = torchrun_options(argv)
    options = torchrun or []
    words: list[str] = []
    node: str | None = None
    if env.get("SLURM_JOB_ID", "").strip():
        words.append(f"slurm-{env['SLURM_JOB_ID'].strip()}")
        if env.get("SLURM_NTASKS", "1").strip() != "1":
            node = f"task{env.get('SLURM_PROCID', '').strip()}"
    elif job := kubernetes_job(env):
        words.append(f"pytorchjob-{job}")
    elif torchrun is not None and "--standalone" not in options:
        run_id = _option(options, _RDZV_ID) or env.get("PET_RDZV_ID") or ""
        if run_id.strip() not in ("", "none"):
            words.append(f"run-{run_id.strip()}")
    if words and node is None:
        rank = (_option(options, _NODE_RANK) or env.get("PET_NODE_RANK")) if torchrun is not None else env.get("RANK")
        if rank and rank.strip().isdigit():
            node = f"node{rank.strip()}" if torchrun is not None else f"rank{rank.strip()}"
    if node and node[-1].isdigit():
        words.append(node)
    label = re.sub(r"[^A-Za-z0-9._-]+", "_", "-".join(words)).strip("._-")[:48].rstrip("._-")
    return label or None

"""The job's name as its launcher gives it: the words every rank shares, the label of each node's run folder."""

from __future__ import annotations

import re

from stallscope import paths
from stallscope.job_names import job_identity, kubernetes_job, run_label

PY = ["/usr/bin/python3"]
TORCHRUN = ["torchrun", "--nnodes", "2", "--nproc_per_node", "8"]


def test_torchruns_run_id_and_node_rank_name_the_run_folder_in_either_spelling():
    assert run_label([*TORCHRUN, "--rdzv_id", "exp7", "--node_rank", "1", "train.py"], {}) == "run-exp7-node1"
    assert run_label([*PY, "-m", "torch.distributed.run", "--rdzv-id=exp7", "--node-rank=0", "train.py"], {}) == \
        "run-exp7-node0"
    # torchrun reads its options from PET_* variables too
    assert run_label([*TORCHRUN, "train.py"], {"PET_RDZV_ID": "exp8", "PET_NODE_RANK": "3"}) == "run-exp8-node3"


def test_the_scripts_own_options_are_not_torchruns():
    assert run_label([*TORCHRUN, "train.py", "--rdzv_id", "x", "--node_rank", "1"], {}) is None
    assert run_label([*TORCHRUN, "--rdzv_id", "exp", "train.py", "--node_rank", "1"], {}) == "run-exp"


def test_no_label_outside_a_job():
    assert run_label([*PY, "train.py"], {}) is None
    assert run_label([*TORCHRUN, "--rdzv_id", "none", "train.py"], {}) is None  # torchrun's default
    assert run_label(["torchrun", "--standalone", "--nproc_per_node", "2", "--rdzv_id", "a", "t.py"], {}) is None


def test_slurm_names_the_job_and_the_task():
    env = {"SLURM_JOB_ID": "812", "SLURM_PROCID": "5", "SLURM_NTASKS": "8"}
    assert run_label([*PY, "train.py"], env) == "slurm-812-task5"
    assert run_label([*PY, "train.py"], {**env, "SLURM_NTASKS": "1"}) == "slurm-812"
    # one torchrun per node under srun: Slurm's job id first, the task is the node
    assert run_label([*TORCHRUN, "--rdzv_id", "x", "train.py"], {**env, "SLURM_NTASKS": "2", "SLURM_PROCID": "1"}) \
        == "slurm-812-task1"


def test_a_pytorchjob_pod_is_named_by_its_job():
    pet = {"PET_NNODES": "4", "PET_MASTER_ADDR": "bert-large-master-0", "PET_MASTER_PORT": "23456"}
    worker = {**pet, "HOSTNAME": "bert-large-worker-2", "PET_NODE_RANK": "3"}
    assert kubernetes_job(worker) == "bert-large"
    assert kubernetes_job({**pet, "HOSTNAME": "bert-large-master-0"}) == "bert-large"
    assert kubernetes_job({**pet, "HOSTNAME": "mnist-node-0-1-x7k2p"}) == "mnist"  # a TrainJob's JobSet pod
    assert kubernetes_job({**pet, "HOSTNAME": "gpu-host-17"}) is None  # on the host's network: the machine's name
    assert kubernetes_job({"HOSTNAME": "bert-large-worker-2"}) is None  # no operator's variables
    assert run_label([*TORCHRUN, "train.py"], worker) == "pytorchjob-bert-large-node3"
    # the older operator starts `python train.py` in each pod with RANK and WORLD_SIZE set
    assert run_label([*PY, "train.py"], {**worker, "RANK": "2"}) == "pytorchjob-bert-large-rank2"
    assert job_identity({**worker, "MASTER_PORT": "23456"}) == "pytorchjob=bert-large port=23456"


def test_the_label_is_a_safe_file_name_between_the_time_and_the_random_part():
    label = run_label([*TORCHRUN, "--rdzv_id", "a/b c" + "x" * 80, "train.py"], {})
    assert label is not None and re.fullmatch(r"[A-Za-z0-9._-]{1,48}", label)
    run_id = paths.new_run_id(0.0, label)
    assert re.fullmatch(r"\d{8}-\d{6}-" + re.escape(label) + r"-[0-9a-f]{6}", run_id)
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{6}", paths.new_run_id(0.0))

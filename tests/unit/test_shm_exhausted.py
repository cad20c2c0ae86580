"""A /dev/shm too small for the batches in flight is named as the cause of the failure, with its fix, in each of the
ways torch says it (texts as torch writes them: the first captured from a real run on a 2 MiB /dev/shm, the SIGBUS
ones from torch's own format strings, which a tmpfs with fallocate never produces)."""

from __future__ import annotations

import dataclasses

import pytest

from stallscope.analysis import analyze
from stallscope.render import words
from stallscope.session import ErrorRecord, StallRecord
from tests.unit.report_fixtures import PID, two_worker_session

TORCH = "/venv/lib/python3.11/site-packages/torch"
ENOSPC = "unable to allocate shared memory(shm) for file </torch_19570_1206947490_0>: No space left on device (28)"
BUS = ("DataLoader worker (pid 4242) is killed by signal: Bus error. It is possible that dataloader's workers are out "
       "of shared memory. Please try to raise your shared memory limit.")
BUS_TRACEBACK = (
    "Traceback (most recent call last):\n"
    f'  File "{TORCH}/utils/data/_utils/signal_handling.py", line 73, in handler\n'
    "    _error_if_any_worker_fails()\n"
    f"RuntimeError: {BUS}\n\n"
    "The above exception was the direct cause of the following exception:\n\n"
    "Traceback (most recent call last):\n"
    '  File "/home/me/train.py", line 20, in <module>\n'
    "    for batch in loader:\n"
    f'  File "{TORCH}/utils/data/dataloader.py", line 1306, in _try_get_data\n'
    "    raise RuntimeError(\n"
    "RuntimeError: DataLoader worker (pid(s) 4242) exited unexpectedly\n")
SHM_CHECK = {"id": "shm", "status": "fail", "data": {"size_bytes": 64 << 20, "free_bytes": 60 << 20}}


def _pitfalls(**changes):
    batches = [{"loader_id": 0, "iter_id": 0, "nbytes": 8 << 20}]  # what the training process got before it failed
    session = dataclasses.replace(two_worker_session(), checks=[SHM_CHECK], batch_info=batches, **changes)
    return {p.id: p for p in analyze(session).pitfalls}


@pytest.mark.parametrize("changes, said", [
    ({"errors": [ErrorRecord("worker", 200, 5, "RuntimeError", ENOSPC, f"{TORCH}/storage.py:423", "", 0, 1)]},
     f"worker 1 of loader 0: {ENOSPC}"),
    ({"errors": [ErrorRecord("main", PID, 5, "RuntimeError", "DataLoader worker (pid(s) 4242) exited unexpectedly",
                             f"{TORCH}/utils/data/dataloader.py:1306", BUS_TRACEBACK)]},
     f"the training process: RuntimeError: {BUS}"),
    ({"stalls": [StallRecord(0, 0, 0, 1, 2, "RuntimeError", BUS, [1], 1, [1], PID)]},
     f"the training process: {BUS}"),
    ({"exit_code": 135}, "the training process: the training process was killed by SIGBUS (exit code 135)"),
])
def test_each_way_torch_says_it_is_the_shm_pitfall_with_its_fix(changes, said):
    found = _pitfalls(**changes)
    said_as = words.pitfall(found["shm-exhausted"])
    assert said_as.evidence == (f"{said}; /dev/shm held 64 MiB (60 MiB free) when the run started; 2 workers x "
                                "prefetch 2 x 8 MiB batches = 32 MiB in flight")
    assert "--shm-size" in said_as.fix and "prefetch_factor" in said_as.fix and "num_workers" in said_as.fix
    assert said_as.title == "/dev/shm ran out: the batches in flight did not fit"
    assert "shm-headroom" not in found  # the same cause, said once


def test_a_full_disk_elsewhere_is_not_the_shm_pitfall():
    checkpoint = ErrorRecord("main", PID, 5, "OSError", "[Errno 28] No space left on device: '/data/ckpt.pt'",
                             "/home/me/train.py:30", "OSError: [Errno 28] No space left on device: '/data/ckpt.pt'")
    assert "shm-exhausted" not in _pitfalls(errors=[checkpoint])
    assert "shm-exhausted" not in _pitfalls(exit_code=1)

"""DDP's gradient wait as the recorder times it: once per synchronising backward, never for
``no_sync()`` accumulation or a model outside DDP (a real one-process gloo group, in a subprocess
so the patch stays out of the test process)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import SCRIPTS


def test_one_wait_per_synchronising_backward():
    proc = subprocess.run([sys.executable, str(SCRIPTS / "ddp_wait_probe.py")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["labels"].count("sync-1") == 1
    waits = result["waits"]
    # sync-1, sync-2, sync-3 and sync-4 (through torch.autograd.backward); not the accumulation steps
    # inside no_sync() nor the backward of the model outside DDP
    assert len(waits) == 4, waits
    for started, computed, returned in waits:
        assert started < computed <= returned
    assert [w[0] for w in waits] == sorted(w[0] for w in waits)

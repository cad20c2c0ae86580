"""The recorder never changes what the training computes: identical losses with and without it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from stallscope.demo.scenarios import REFERENCE_SCRIPT
from tests.conftest import SCRIPTS, run_cli

pytestmark = pytest.mark.e2e


def _losses(text: str) -> list[str]:
    return [line for line in text.splitlines() if "loss" in line]


@pytest.mark.parametrize("workers", ["0", "2"])
def test_reference_losses_identical(tmp_path, image_folder, workers):
    args = [str(REFERENCE_SCRIPT), "--data", str(image_folder), "--workers", workers, "--max-batches", "6",
            "--batch-size", "16", "--image-size", "96", "--print-loss", "--seed", "3", "--threads", "1"]
    plain = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=240)
    assert plain.returncode == 0, plain.stderr[-2000:]
    recorded = run_cli(tmp_path, ["--", sys.executable, *args])
    assert recorded.returncode == 0, recorded.stderr[-2000:]
    assert len(_losses(plain.stdout)) == 6
    assert _losses(recorded.stdout) == _losses(plain.stdout)


def test_tiny_losses_identical_with_spawn_workers(tmp_path):
    args = [str(SCRIPTS / "tiny_train.py"), "--workers", "2", "--ctx", "spawn", "--print-loss", "--epochs", "2"]
    plain = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=240)
    recorded = run_cli(tmp_path, ["--", sys.executable, *args])
    assert recorded.returncode == 0
    assert _losses(recorded.stdout) == _losses(plain.stdout) and len(_losses(plain.stdout)) == 24

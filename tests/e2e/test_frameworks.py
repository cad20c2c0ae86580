"""Advice in the user's framework's words, at the user's line: a real Hugging Face Trainer job and a real
Lightning job (issue 19, item 1). Skipped where the framework is not installed (it is not a test dependency)."""

from __future__ import annotations

import sys

import pytest

from tests.conftest import SCRIPTS, run_cli


def _line_of(script: str, text: str) -> int:
    return next(i for i, line in enumerate((SCRIPTS / script).read_text().splitlines(), 1) if text in line)


def test_a_trainer_job_is_told_to_change_its_training_arguments(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    # One compute thread: with torch's default of one per core, a worker would take a core from the compute
    # on a 2-core machine and no DataLoader setting is predicted to help (the job says so instead).
    result = run_cli(tmp_path, ["--", sys.executable, str(SCRIPTS / "hf_trainer_job.py"), "--steps", "40",
                                "--threads", "1"])
    assert result.returncode == 0, result.stderr[-3000:]
    summary = result.summary
    [train] = [ld for ld in summary["loaders"] if ld["role"] == "train"]
    args_line = f"hf_trainer_job.py:{_line_of('hf_trainer_job.py', 'TrainingArguments(output_dir')}"
    assert train["code"]["framework"] == "transformers" and train["code"]["site"].endswith(args_line)
    assert "hf_trainer_job.py" not in train["site"]  # the DataLoader itself is built by the Trainer (accelerate)
    settable = [r for r in summary["recommendations"] if r["overrides"]]
    assert settable, summary["recommendations"]
    for rec in settable:
        assert "(in code: TrainingArguments(..., dataloader_" in rec["change"] and args_line in rec["change"]


def test_a_lightning_job_is_pointed_at_its_train_dataloader_hook(tmp_path):
    pytest.importorskip("lightning")
    result = run_cli(tmp_path, ["--", sys.executable, str(SCRIPTS / "lightning_job.py"), "--steps", "40"])
    assert result.returncode == 0, result.stderr[-3000:]
    summary = result.summary
    [train] = [ld for ld in summary["loaders"] if ld["role"] == "train"]
    hook_line = f"lightning_job.py:{_line_of('lightning_job.py', 'return DataLoader(')}"
    assert train["code"]["framework"] == "lightning" and train["code"]["function"] == "train_dataloader"
    assert train["code"]["site"].endswith(hook_line)
    [workers] = [r for r in summary["recommendations"] if r["id"] == "num-workers"]
    assert "in train_dataloader() at" in workers["change"] and hook_line in workers["change"]

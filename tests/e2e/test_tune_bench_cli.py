"""``stallscope tune`` and ``stallscope bench`` end to end, on tiny scripts (each real trial costs ~3-5 s).

No wall-clock thresholds: assertions compare rates measured within the same command.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

from tests.conftest import SCRIPTS

TINY = str(SCRIPTS / "tiny_train.py")
FRAGILE = str(SCRIPTS / "fragile_train.py")


def stallscope(tmp_path: Path, args: list[str], timeout: float = 300) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, "-m", "stallscope", *args[:1], "--json", str(out),
                           "--store", str(tmp_path / "store"), *args[1:]],
                          capture_output=True, text=True, timeout=timeout, cwd=tmp_path)
    return proc, (json.loads(out.read_text()) if out.exists() else {})


def test_tune_finds_workers_and_confirms_against_the_original(tmp_path: Path) -> None:
    proc, result = stallscope(tmp_path, ["tune", "--trials", "4", "--steps", "20", "--",
                                         sys.executable, TINY, "--sleep-ms", "4", "--n", "4000"])
    assert proc.returncode == 0, proc.stderr
    assert result["schema"] == "stallscope.tune/1"
    labels = [t["label"] for t in result["trials"]]
    assert labels[:2] == ["original", "diagnosis"]
    assert result["runs"] <= 4
    # Sleeping in __getitem__ overlaps across workers: the winner uses workers and is confirmed faster.
    assert result["winner_overrides"].get("num_workers", 0) >= 1
    assert [t["label"] for t in result["confirmation"]] == ["confirm-winner", "confirm-original"]
    assert result["winner_confirmed"]["value"] > result["original_confirmed"]["value"]
    assert result["set_args"][:2] == ["--set", f"num_workers={result['winner_overrides']['num_workers']}"]
    assert "num_workers=" in result["dataloader_kwargs"]
    for trial in result["trials"]:  # the script's own output went to the trial folder, not the terminal
        assert Path(trial["trial_dir"], "stdout.txt").exists()
    assert "trial" in proc.stderr and "The change:" in proc.stderr


def test_crashing_and_hanging_trials_are_recorded_and_tuning_continues(tmp_path: Path) -> None:
    # the timeout applies to every trial: long enough for a whole `stallscope run` on a loaded machine
    proc, result = stallscope(tmp_path, ["tune", "--trials", "6", "--steps", "10", "--trial-timeout", "45", "--",
                                         sys.executable, FRAGILE, "--sleep-ms", "3", "--crash-workers", "1",
                                         "--hang-from-workers", "2"])
    assert proc.returncode == 0, proc.stderr
    trials = result["trials"]
    assert trials[0]["ok"] and trials[0]["label"] == "original"
    failed = {t["config"]["num_workers"]: t["reason"] for t in trials if not t["ok"]}
    assert failed[1].startswith("crashed in the script: RuntimeError: planted failure with 1 workers")
    hung = [n for n in failed if n >= 2]
    assert hung and failed[hung[0]] == "timed out after 45 s (killed)"
    assert len(trials) >= 3  # a trial ran after the first failure
    assert result["winner_overrides"] == {}  # nothing that worked beat the original
    assert "keep it as it is" in " ".join(result["notes"])


def test_bench_brackets_the_normal_run(tmp_path: Path) -> None:
    proc, result = stallscope(tmp_path, ["bench", "--workers", "0,2", "--seconds", "1.5", "--steps", "30", "--",
                                         sys.executable, TINY, "--sleep-ms", "3", "--n", "400", "--epochs", "50"])
    assert proc.returncode == 0, proc.stderr
    assert result["unit"] == "samples/s"
    assert {c["num_workers"] for c in result["capacity"]} == {0, 2}
    throughput = result["throughput"]
    assert throughput and result["capacity_rate"] and result["ceiling_rate"]
    # The drain at the script's own worker count runs the same loading without the model, and the
    # ceiling runs the same model without loading: both can only be faster than the normal run.
    # 10% tolerance: the three are separate processes on a shared machine.
    assert result["capacity_rate"] >= 0.9 * throughput
    assert result["ceiling_rate"] >= 0.9 * throughput
    assert result["max_input_gain"] == pytest.approx(result["ceiling_rate"] / throughput)
    assert result["ceiling"]["steps"] >= 20 and not result["errors"]


def test_decoder_race_on_a_folder(tmp_path: Path) -> None:
    from PIL import Image

    folder = tmp_path / "jpegs"
    folder.mkdir()
    for i in range(4):
        Image.new("RGB", (320, 240), (i * 40, 90, 160)).save(folder / f"{i}.jpg", quality=90)
    proc = subprocess.run([sys.executable, "-m", "stallscope", "bench", "--decoders", str(folder),
                           "--json", str(tmp_path / "race.json")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    race = json.loads((tmp_path / "race.json").read_text())
    rates = {(r["decoder"], r["scale"]): r["images_per_s"] for r in race["results"]}
    assert rates[("pillow", 1)] > 0
    assert ("pillow+draft", 4) in rates
    if _turbojpeg_loads():  # stallscope's own libjpeg-turbo 3 binding races too, full size and DCT-scaled
        assert rates[("turbojpeg-fast", 1)] > 0 and rates[("turbojpeg", 8)] > 0
    assert race["files"] == 4


def _turbojpeg_loads() -> bool:
    try:
        from stallscope.data.decoders import TurboJpegDecoder

        TurboJpegDecoder()
    except Exception:  # noqa: BLE001 - the extra is not installed here
        return False
    return True

"""``stallscope demo``, the README's first command: diagnose the planted starved scenario, then measure the fix
in alternated pairs of runs."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cpu_load import CpuLoad

pytestmark = pytest.mark.e2e


def _demo(tmp_path: Path, *args: str, cache: Path | None = None) -> subprocess.CompletedProcess:
    tmp_path.mkdir(parents=True, exist_ok=True)
    # the dataset is generated here, not in ~
    env = {**os.environ, "XDG_CACHE_HOME": str(cache or tmp_path / "cache")}
    return subprocess.run([sys.executable, "-m", "stallscope", "demo", "--store", str(tmp_path / "store"),
                           "--json", str(tmp_path / "first.json"), *args],
                          capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)


def _runs(folder: Path) -> list[dict]:
    runs = [json.loads(path.read_text()) for path in (folder / "store" / "runs").glob("*/run.json")]
    return sorted(runs, key=lambda run: run["started_wall"])


@pytest.mark.speed  # the advice reads this machine's spare CPUs; the fix's speedup is measured on them
def test_demo_diagnoses_then_measures_the_fix_in_two_alternated_pairs(tmp_path, demo_cache):
    done = _demo(tmp_path, "--steps", "10", cache=demo_cache)
    assert done.returncode == 0, done.stderr[-2000:]
    first = json.loads((tmp_path / "first.json").read_text())
    assert first["verdict"] == "input-bound"
    top = first["recommendations"][0]
    change = top["overrides"]
    if set(change) != {"num_workers"}:
        # Workers are the fix only where the CPUs are there to run them: a machine whose other programs kept one
        # busy (a shared CI runner) is told so and advised otherwise. Only that load excuses other advice.
        other = first["system"]["other_cores_mean"] or 0.0
        assert other >= 0.25, (change, other, done.stderr[-2000:])
        # and the model planned for the CPUs left to it (2 less 1 busy: no room for a worker beside the training)
        assert first["capacity"]["usable_cpus"] <= first["usable_cpus"] - 0.25, first["capacity"]
        pytest.skip(f"other programs kept {other:.2f} CPUs busy during the demo's first run: advice for that load "
                    "checked, the fix's measurement needs a quieter machine")
    assert change["num_workers"] >= 1  # as many as this machine's cores allow
    runs = _runs(tmp_path)
    assert [run["overrides"] for run in runs] == [{}, change, change, {}]
    err = " ".join(done.stderr.split())
    assert "run 3 of 4: after again" in err and "run 4 of 4: before again" in err
    measured = re.search(r"measured speedup (\d+\.\d\d)x \(predicted (\d+\.\d\d)x, pairs (\d+\.\d\d)x-(\d+\.\d\d)x\)",
                         err)
    assert measured, err[-1500:]
    # the printed figures are the geometric mean and the range of the pairs' after/before ratios, from the printed rates
    before = [float(v) for v in re.search(r"before: ([\d.]+), ([\d.]+) samples/s", err).groups()]
    after = [float(v) for v in re.search(r"after: ([\d.]+), ([\d.]+) samples/s", err).groups()]
    ratios = [a / b for a, b in zip(after, before)]
    assert float(measured[1]) == pytest.approx((ratios[0] * ratios[1]) ** 0.5, abs=0.01)
    assert (float(measured[3]), float(measured[4])) == pytest.approx((min(ratios), max(ratios)), abs=0.01)
    assert float(measured[2]) == pytest.approx(top["predicted_speedup"], abs=0.005)
    assert "stallscope compare last~3 last~2" in err


@pytest.mark.serial  # it loads every CPU on purpose: nothing of the suite beside it
def test_on_a_busy_machine_the_demo_still_verifies_its_top_recommendation(tmp_path, demo_cache):
    """With other programs keeping every CPU busy, workers are no fix and the top recommendation is likely a code
    change: the demo owns its training script, so it applies that change too (through the script's own flags) and
    measures it, whatever the recommendation is."""
    with CpuLoad() as load:
        done = _demo(tmp_path, "--steps", "20", "--pairs", "1", cache=demo_cache)
    assert done.returncode == 0, done.stderr[-2000:]
    # the load ran and left the CPUs no idle time, and the demo's own recorder saw other programs keep them busy
    assert load.ran_throughout and load.cpu_seconds() > 0, load.cpu_seconds()
    assert load.idle_fraction() < 0.1, load.idle_fraction()
    summary = json.loads((tmp_path / "first.json").read_text())
    assert (summary["system"]["other_cores_mean"] or 0.0) >= 0.5, summary["system"]
    top = summary["recommendations"][0]
    verified = summary.get("verification")
    assert verified is not None and verified.get("measured_speedup"), (top["id"], done.stderr[-2000:])
    assert verified["verified"] is True and verified["passed_over"] == []
    assert verified["recommendation"] == top["id"]
    assert verified["predicted_speedup"] == top["predicted_speedup"]
    assert len(verified["before_samples_per_s"]) == len(verified["after_samples_per_s"]) == 1
    ratio = verified["after_samples_per_s"][0] / verified["before_samples_per_s"][0]
    assert verified["measured_speedup"] == pytest.approx(ratio, rel=1e-6)
    # the change applied is named, and the after run is the first run with that change and nothing else
    applied = verified["applied"]
    before_run, after_run = _runs(tmp_path)
    if applied["overrides"]:
        assert applied["overrides"] == top["overrides"] and not applied["script_args"]
        assert after_run["command"] == before_run["command"] and after_run["overrides"] == top["overrides"]
    else:
        assert applied["script_args"] and not top["overrides"], (applied, top)
        assert after_run["command"] == before_run["command"] + applied["script_args"]
        assert after_run["overrides"] == before_run["overrides"] == {}
    err = " ".join(done.stderr.split())
    assert f"measured speedup {verified['measured_speedup']:.2f}x" in err
    # workers, the usual fix for a job that loads in its training process, are advised, or it says why not
    if not any("num_workers" in rec["overrides"] for rec in summary["recommendations"]):
        assert "num-workers" in {left["id"] for left in summary["not_recommended"]}, summary["not_recommended"]
        assert "not advised: more DataLoader workers" in err, err[-3000:]


@pytest.mark.parametrize("flags", [["--cheaper-transforms"], ["--uint8-to-device"], ["--reduced-size-decode"],
                                   ["--cheaper-transforms", "--uint8-to-device", "--reduced-size-decode",
                                    "--heavy-transform", "--storage-latency-ms", "1"]])
def test_the_reference_script_trains_with_each_code_change_the_demo_applies(tmp_path, flags):
    """The flags the demo verifies code changes with (demo/changes.py) train, in a real DataLoader worker."""
    from stallscope.demo.dataset import DatasetSpec, make_dataset
    from stallscope.demo.scenarios import REFERENCE_SCRIPT

    data = make_dataset(tmp_path / "data", DatasetSpec(n_files=24, n_classes=3, width=160, height=120))
    done = subprocess.run([sys.executable, str(REFERENCE_SCRIPT), "--data", str(data), "--workers", "1",
                           "--batch-size", "8", "--image-size", "64", "--max-batches", "2", "--print-loss", *flags],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    losses = [float(line.split()[-1]) for line in done.stdout.splitlines() if line.startswith("step ")]
    assert len(losses) == 2 and all(math.isfinite(v) for v in losses), done.stdout
    assert "trained 2 steps" in done.stdout


def test_demo_refuses_zero_pairs_before_running(tmp_path):
    done = _demo(tmp_path, "--pairs", "0")
    assert done.returncode == 2
    assert "--pairs must be at least 1" in done.stderr
    assert not (tmp_path / "store").exists() and not (tmp_path / "cache").exists()


def test_a_full_cache_disk_is_one_line_that_says_where_and_how_much(tmp_path):
    """The demo's dataset is generated into the user's cache; a full disk there is said in one line, and leaves no
    half-written JPEG for the next call to trust."""
    from tests.conftest import on_a_small_disk

    cache = tmp_path / "cache"
    done = on_a_small_disk(tmp_path, cache, size="256k", commands=(
        f"XDG_CACHE_HOME={cache} {sys.executable} -m stallscope demo --store {tmp_path / 'store'}; "
        f"echo $? > {tmp_path / 'rc'}; find {cache} -name '*.tmp' | wc -l > {tmp_path / 'tmp_files'}"))
    assert (tmp_path / "rc").read_text().strip() == "2", done.stderr[-2000:]
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "cannot write the demo dataset in" in done.stderr and "No space left on device" in done.stderr
    assert "XDG_CACHE_HOME" in done.stderr
    assert (tmp_path / "tmp_files").read_text().strip() == "0"

"""A tune trial's ``stallscope run`` hands the tuner its figures from the Analysis it made (``figures.json``), so
the tuner does not analyse the session again; they equal what analysing the saved session gives, and the script
never sees the variable that asks for them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from stallscope.session import Session
from stallscope.settings import ENV_TRIAL_FIGURES
from stallscope.tuning.trials import _measured, loader_knobs, run_trial
from tests.conftest import SCRIPTS

pytestmark = pytest.mark.e2e

PROBE = """import os, runpy, sys
open(sys.argv[1], "w").write(repr(os.environ.get({name!r})))
sys.argv = [{tiny!r}, *sys.argv[2:]]
runpy.run_path({tiny!r}, run_name="__main__")
"""


def test_a_trial_reads_its_figures_from_the_runs_own_analysis(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE.format(name=ENV_TRIAL_FIGURES, tiny=str(SCRIPTS / "tiny_train.py")))
    seen = tmp_path / "seen.txt"
    trial = run_trial([sys.executable, str(probe), str(seen), "--workers", "1", "--n", "640"], {"num_workers": 1},
                      index=0, label="original", trial_dir=tmp_path / "trial", store=tmp_path / "store", steps=20,
                      timeout_s=240)
    assert trial.ok, trial.reason
    assert seen.read_text() == "None"  # the launcher took it out of the script's environment
    figures = json.loads((tmp_path / "trial" / "figures.json").read_text())
    summary = json.loads((tmp_path / "trial" / "summary.json").read_text())
    train = next(ld for ld in summary["loaders"] if ld["role"] == "train")
    rate, unit, durations, other = _measured(Session.load(summary["session"]), loader_knobs(train["config"]))
    assert rate is not None and figures["rate"] == {"value": rate.value, "se": rate.se, "steps": rate.steps}
    assert (figures["unit"], figures["durations_s"], figures["other_cpus"]) == (unit, durations, other)
    assert (trial.rate, trial.unit, trial.step_times_s) == (rate, unit, durations)

"""Hotspots: planted costs at known lines come out as the top hotspot of the limiting stage, under fork and spawn.

tests/scripts/hotspot_job.py plants one cost per sample (a pure-Python augmentation loop, a tokenizer written
in Python, a regex, a JSON parse, a blocking sleep, a NumPy sort) on a line marked ``# planted: SCENARIO``.
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import SCRIPTS, CliResult, run_cli

pytestmark = pytest.mark.e2e


@pytest.fixture(autouse=True)
def sample_faster(monkeypatch):
    """Runs of a second or two: sample at 67 Hz rather than the default rate chosen for long runs."""
    monkeypatch.setenv("STALLSCOPE_STACK_SAMPLE_HZ", "67")

SCRIPT = SCRIPTS / "hotspot_job.py"
# scenario -> (limiting stage, function of the planted line, library the line calls into)
PLANTED = {
    "augment": ("transform", "augment", None),
    "tokenize": ("transform", "tokenize", None),
    "regex": ("transform", "strip_markup", "re findall"),
    "json": ("transform", "parse_record", "json loads"),
    "io": ("storage", "read_slowly", None),
    "numpy": ("transform", "normalize", "numpy sort"),
}


def _planted_line(scenario: str) -> int:
    lines = SCRIPT.read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if text.rstrip().endswith(f"# planted: {scenario}"))


def _both_start_methods(tmp_path: Path, args: list[str]) -> dict[str, CliResult]:
    """The same run under fork and under spawn (``START`` in ``args``), side by side: most of a run is
    importing torch."""
    def one(method: str) -> CliResult:
        (tmp_path / method).mkdir()
        return run_cli(tmp_path / method, [method if a == "START" else a for a in args])

    with ThreadPoolExecutor(2) as pool:
        return dict(zip(("fork", "spawn"), pool.map(one, ("fork", "spawn"))))


@pytest.mark.parametrize("scenario", list(PLANTED))
def test_planted_line_is_the_top_hotspot_of_the_limiting_stage(tmp_path, scenario):
    # 200 steps: about 2 s of fetching at the sampler's 9 Hz gives ~20 samples (30 steps gave 1-3, too few to say
    # what share of a stage the planted line has)
    runs = _both_start_methods(tmp_path, ["--steps", "200", "--", sys.executable, str(SCRIPT), scenario, "START"])
    for start_method, result in runs.items():
        _check_planted(scenario, start_method, result)


def _check_planted(scenario: str, start_method: str, result: CliResult) -> None:
    stage, function, library = PLANTED[scenario]
    assert result.returncode == 0, (start_method, result.stderr[-3000:])
    summary = result.summary
    assert summary["bottleneck"]["node"] == stage, (start_method, summary["nodes"])
    spots = summary["hotspots"]
    assert spots, (start_method, summary["notes"])
    top = max((h for h in spots if h["stage"] == stage), key=lambda h: h["share_of_stage"])
    assert (top["file"], top["line"]) == (str(SCRIPT), _planted_line(scenario)), (start_method, spots[:4])
    assert top["function"] == function
    assert top["library"] == library
    # almost all of a sample's time is on the planted line: most of the stage's samples, where it has enough of them
    # to say (a 30-step run that drew 2 samples there, one of them the worker's collate, read exactly 0.5 once in CI)
    session = json.loads(Path(summary["session"]).read_text())
    drawn = sum(row["count"] for row in session["stack_samples"] if row["stage"] == stage)
    assert drawn >= 1
    if drawn >= 5:
        assert top["share_of_stage"] > 0.5, (drawn, spots[:4])
    assert top["share_of_step"] == pytest.approx(top["share_of_stage"] * summary["nodes"][stage]["share"], abs=2e-4)
    shares = [h["share_of_step"] for h in spots]
    assert shares == sorted(shares, reverse=True)
    assert f"hotspot_job.py:{top['line']} {function}" in result.stderr  # the terminal's top three
    if stage == "transform":
        dataset_code = next(r for r in summary["recommendations"] if r["id"] == "dataset-code")
        assert f"{function} (hotspot_job.py:{top['line']})" in dataset_code["change"]


def test_persistent_workers_ended_at_the_jobs_exit_keep_their_batches_and_hotspots(tmp_path):
    """``persistent_workers=True`` and a script that ends after its epoch: the workers are still alive, and
    multiprocessing terminates them at exit under torch's own SIGTERM handler, which runs no Python. Every batch
    they loaded is still in the session, and so are the sampled stacks of a run of a second."""
    runs = _both_start_methods(tmp_path, ["--", sys.executable, str(SCRIPTS / "persistent_workers.py"), "START"])
    for start_method, result in runs.items():
        assert result.returncode == 0, (start_method, result.stderr[-3000:])
        session = json.loads(Path(result.summary["session"]).read_text())
        assert len(session["fetches"]) == len(session["sends"]) == 16, (start_method, len(session["fetches"]))
        assert result.summary["hotspots"], (start_method, result.summary["notes"])


def test_main_process_fetches_are_sampled_too(tmp_path):
    """num_workers=0: the training process fetches, and its own sampler finds the line."""
    result = run_cli(tmp_path, ["--steps", "30", "--", sys.executable, str(SCRIPT), "json", "fork", "0"])
    assert result.returncode == 0, result.stderr[-3000:]
    top = max((h for h in result.summary["hotspots"] if h["stage"] == "transform"),
              key=lambda h: h["share_of_stage"])
    assert (top["line"], top["function"], top["library"]) == (_planted_line("json"), "parse_record", "json loads")


def test_sampling_impossible_run_completes_and_says_why(tmp_path):
    """Neither sampler can run in any process (the script takes SIGALRM and removes ``sys._current_frames``),
    under fork and spawn: the run goes on with its exit code, there are no hotspots, and the notes say why."""
    runs = _both_start_methods(tmp_path, ["--steps", "10", "--", sys.executable, str(SCRIPT), "augment", "START",
                                          "1", "--no-frames"])
    for result in runs.values():
        assert result.returncode == 0, result.stderr[-3000:]
        summary = result.summary
        assert summary["exit_code"] == 0 and summary["steps"] == 10
        assert summary["hotspots"] == []
        assert any("stack sampling did not run" in n and "the script handles SIGALRM" in n
                   and "sys._current_frames is not available" in n
                   for n in summary["notes"]), summary["notes"]

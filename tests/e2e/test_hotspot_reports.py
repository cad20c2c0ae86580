"""The hotspots in every output of a real run: the HTML report's table and flame graph, the Perfetto trace's
stack tracks, the speedscope file; and the note when the thread sampler took the samples.

tests/scripts/hotspot_job.py plants a JSON parse per sample at a line marked ``# planted: json``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import SCRIPTS, CliResult, run_cli
from tests.unit.test_render_speedscope import check_speedscope
from tests.unit.test_render_trace import check_trace_format

pytestmark = pytest.mark.e2e

SCRIPT = SCRIPTS / "hotspot_job.py"


@pytest.fixture(autouse=True)
def sample_faster(monkeypatch):
    """Runs of a second or two: sample at 67 Hz rather than the default rate chosen for long runs."""
    monkeypatch.setenv("STALLSCOPE_STACK_SAMPLE_HZ", "67")


def _planted_line() -> int:
    lines = SCRIPT.read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if text.rstrip().endswith("# planted: json"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, CliResult]]:
    """Two workers under fork: with the signal sampler (``signal``), and with the script owning SIGALRM
    (``thread``); side by side, since most of a run is importing torch."""
    def one(name: str) -> tuple[Path, CliResult]:
        folder = tmp_path_factory.mktemp(name)
        extra = ["--own-sigalrm"] if name == "thread" else []
        return folder, run_cli(folder, ["--steps", "200", "--", sys.executable, str(SCRIPT), "json", "fork", "2",
                                        *extra])

    with ThreadPoolExecutor(2) as pool:
        return dict(zip(("signal", "thread"), pool.map(one, ("signal", "thread"))))


@pytest.mark.speed  # how many stack samples land on the planted line rests on the run's pace on this machine
def test_report_writes_the_hotspots_into_html_trace_and_speedscope(runs):
    folder, result = runs["signal"]
    assert result.returncode == 0, result.stderr[-3000:]
    line, where = _planted_line(), f"parse_record ({SCRIPT.name}:{_planted_line()})"
    out = {"html": folder / "r.html", "trace": folder / "t.json", "speedscope": folder / "s.speedscope.json"}
    done = subprocess.run([sys.executable, "-m", "stallscope", "report", result.summary["session"],
                           "--html", str(out["html"]), "--trace", str(out["trace"]),
                           "--speedscope", str(out["speedscope"])],
                          capture_output=True, text=True, timeout=240, cwd=folder, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"wrote speedscope profile: {out['speedscope']}" in done.stdout

    profiles = json.loads(out["speedscope"].read_text())
    check_speedscope(profiles)
    frames = profiles["shared"]["frames"]
    planted = next(i for i, f in enumerate(frames) if (f["file"], f["line"]) == (str(SCRIPT), line))
    assert frames[planted]["name"] == "parse_record"
    transform = profiles["profiles"][profiles["activeProfileIndex"]]
    assert transform["name"].startswith("transform (limiting stage): ")
    on_line = sum(w for stack, w in zip(transform["samples"], transform["weights"]) if planted in stack)
    assert on_line > 0.5 * transform["endValue"]

    trace = json.loads(out["trace"].read_text())
    check_trace_format(trace)
    tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
              if e["ph"] == "M" and e["name"] == "thread_name" and "sampled stacks" in e["args"]["name"]}
    assert sorted(re.sub(r"pid \d+", "pid N", name) for name in tracks.values()) == [
        "worker 0 (pid N): sampled stacks by share of samples, not in time",
        "worker 1 (pid N): sampled stacks by share of samples, not in time"]
    slices = [e for e in trace["traceEvents"] if e.get("cat") == "stack_sample"]
    assert {(e["pid"], e["tid"]) for e in slices} == set(tracks)
    assert any(e["name"] == where and e["args"]["line"] == line for e in slices)

    page = out["html"].read_text(encoding="utf-8")
    table = page.split("<h2 id=hotspots>", 1)[1].split("<h2", 1)[0]
    assert f"<code>{SCRIPT}:{line}</code></td><td><code>parse_record</code></td><td><code>json loads</code>" in table
    figures = json.loads(re.search(r"<script type=application/json id=report-figures>(.*?)</script>", page,
                                   re.DOTALL).group(1))
    assert where in figures["chart-flame"]["data"][0]["labels"]


def test_samples_name_their_sampler_and_the_thread_sampler_is_noted_once(runs):
    _, signal_run = runs["signal"]
    _, thread_run = runs["thread"]
    for result in (signal_run, thread_run):
        assert result.returncode == 0, result.stderr[-3000:]
    signal_session = json.loads(Path(signal_run.summary["session"]).read_text())
    thread_session = json.loads(Path(thread_run.summary["session"]).read_text())
    assert {row.get("sampler") for row in signal_session["stack_samples"]} == {"signal"}
    assert {row.get("sampler") for row in thread_session["stack_samples"]} == {"thread"}
    assert not any("thread sampler" in n for n in signal_run.summary["notes"])
    noted = [n for n in thread_run.summary["notes"] if "thread sampler" in n]
    assert len(noted) == 1, thread_run.summary["notes"]
    # every process whose fetches the thread sampler sampled, and only those (a worker that drew no sample in a short
    # run on a loaded machine is not listed: which workers drew one depends on the scheduler)
    sampled = sorted({row["pid"] for row in thread_session["stack_samples"] if row["stage"] != "compute"})
    assert sampled and set(sampled) <= {p["pid"] for p in thread_session["processes"] if p["role"] == "worker"}
    assert re.fullmatch(rf"stack samples of process(es)? {', '.join(map(str, sampled))} were taken by the thread "
                        r"sampler \(the script handles SIGALRM\): it is biased toward .*", noted[0]), noted
    assert thread_run.summary["hotspots"]  # the thread sampler still finds sites

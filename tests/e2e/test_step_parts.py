"""Inside compute: the step split (forward, backward, optimizer, step code) and the step's own lines, on planted
training loops (tests/scripts/step_parts_job.py), and losses bit for bit the same with and without the recorder."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stallscope.analysis.plan import plan_run
from stallscope.session import Session
from tests.conftest import SCRIPTS, run_cli

pytestmark = pytest.mark.e2e

SCRIPT = SCRIPTS / "step_parts_job.py"
# plant -> the part of the step it makes the largest, and the first finding
PLANTED = {"slow_layer": "forward", "metric_loop": "step_code", "heavy_optimizer": "optimizer"}
FINDING = {"slow_layer": "python-in-step", "metric_loop": "python-in-step", "heavy_optimizer": "optimizer-foreach"}


@pytest.fixture(autouse=True)
def sample_faster(monkeypatch):
    """Runs of a second or two: sample at 300 Hz rather than the default rate chosen for long runs."""
    monkeypatch.setenv("STALLSCOPE_STACK_SAMPLE_HZ", "300")


def _planted_line(plant: str) -> int:
    lines = SCRIPT.read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if text.rstrip().endswith(f"# planted: {plant}"))


def _parts(summary: dict) -> dict[str, float]:
    return {name: p["seconds"] for name, p in summary["nodes"]["compute"]["parts"].items()}


@pytest.mark.speed  # the top hotspot is what the main thread's samples caught at this machine's pace
@pytest.mark.parametrize("plant", sorted(PLANTED))
def test_the_planted_cost_is_the_largest_part_and_its_line_the_top_hotspot_of_compute(tmp_path, plant):
    result = run_cli(tmp_path, ["--", sys.executable, str(SCRIPT), "--plant", plant, "--steps", "150"])
    assert result.returncode == 0, result.stderr
    summary = result.summary
    parts = _parts(summary)
    assert max(parts, key=parts.get) == PLANTED[plant], parts
    compute = summary["nodes"]["compute"]["seconds"]
    assert sum(parts.values()) == pytest.approx(compute, rel=0.02, abs=2e-4)
    spots = [h for h in summary["hotspots"] if h["stage"] == "compute"]
    top = max(spots, key=lambda h: h["share_of_stage"])
    assert (top["file"], top["line"], top["part"]) == (str(SCRIPT), _planted_line(plant), PLANTED[plant]), spots
    said = result.stderr
    assert "  forward" in said and "  step code" in said  # the terminal table shows the parts under compute
    assert f"step_parts_job.py:{_planted_line(plant)}" in said
    first = summary["recommendations"][0]
    assert first["id"] == FINDING[plant], summary["recommendations"]
    assert first["predicted_speedup"] > 1.1 and first["facts"]["ceiling"] is True
    if first["id"] == "python-in-step":  # the change is at the planted line, in its part
        assert (first["facts"]["line"], first["facts"]["part"]) == (_planted_line(plant), PLANTED[plant])
        assert f"step_parts_job.py:{_planted_line(plant)}" in first["change"]
    else:
        assert first["facts"]["tensors"] >= 400 and "fused=True" in first["change"]
    assert f"next step: {first['title']} (at most" in said
    # plan: a 4x faster device shrinks forward, backward and optimizer, not the step's own code
    plan = plan_run(Session.load(summary["session"]), device_speedup=4.0)
    device = (parts["forward"] + parts["backward"] + parts["optimizer"]) / sum(parts.values())
    note = next(a for a in plan.assumptions if a.startswith("compute:"))
    assert f"({100 * device:.0f}% of the recorded compute) 4x as fast" in note, note


@pytest.mark.speed  # with no CPU to spare, the thread takes the step's CPU rather than its GIL: not measured as held
def test_a_thread_holding_the_interpreter_is_named_with_its_line(tmp_path):
    """A metrics exporter formatting a large dict in Python half the time: the step waits for the interpreter lock."""
    result = run_cli(tmp_path, ["--", sys.executable, str(SCRIPT), "--plant", "logger_thread", "--width", "256",
                                "--steps", "120"])
    assert result.returncode == 0, result.stderr
    first = result.summary["recommendations"][0]
    assert first["id"] == "thread-in-step", result.summary["recommendations"]
    facts = first["facts"]
    assert (facts["thread"], facts["target"]) == ("metrics-exporter", "export_metrics")
    assert (facts["file"], facts["line"]) == (str(SCRIPT), _planted_line("logger_thread"))
    assert facts["floor"] and first["predicted_speedup"] >= 1.08  # at least the finding's threshold, 8% of the step
    assert f"next step: {first['title']} (at least" in result.stderr


def test_ddp_searching_for_unused_parameters_that_never_are_is_named_with_its_cost(tmp_path):
    result = run_cli(tmp_path, ["--", sys.executable, str(SCRIPT), "--ddp-find-unused", "--depth", "40",
                                "--steps", "80"])
    assert result.returncode == 0, result.stderr
    found = {r["id"]: r for r in result.summary["recommendations"]}
    assert "ddp-find-unused" in found, result.summary["recommendations"]
    facts = found["ddp-find-unused"]["facts"]
    assert facts["unused_parameter_size"] == 0 and 0 < facts["search_ms"] < facts["step_ms"]
    assert found["ddp-find-unused"]["predicted_speedup"] > 1.0
    assert "find_unused_parameters=False" in found["ddp-find-unused"]["change"]
    # the DDP facts the gradient-compression finding reads: float32 gradients, no communication hook
    session = json.loads(Path(result.summary["session"]).read_text())
    [ddp] = [f for f in session["compute_facts"] if f["kind"] == "ddp"]
    assert ddp["gradient_dtype"] == "float32" and ddp["comm_hook"] is None and ddp["device"] == "cpu"
    assert "ddp-compress" not in found  # one CPU rank: nothing to compress


@pytest.mark.parametrize("extra", [["--accumulate", "4"], ["--gan"], ["--accumulate", "3", "--gan"]],
                         ids=["accumulate", "gan", "accumulate-gan"])
def test_the_split_adds_up_and_counts_every_pass_under_accumulation_and_two_optimizers(tmp_path, extra):
    steps = 40
    result = run_cli(tmp_path, ["--", sys.executable, str(SCRIPT), "--steps", str(steps), *extra])
    assert result.returncode == 0, result.stderr
    summary = result.summary
    accumulate = int(extra[1]) if extra[0] == "--accumulate" else 1
    # one step per optimizer round, whatever the batches and optimizers in it; the profiler window's (and the step
    # its folding landed in) counted, and left out of the steady steps
    left_out = summary["operators"]["steps_left_out"]
    assert left_out == summary["operators"]["steps"] + 1
    assert summary["steps"] == steps and summary["steady_steps"] <= steps - left_out
    parts = _parts(summary)
    assert sum(parts.values()) == pytest.approx(summary["nodes"]["compute"]["seconds"], rel=0.02, abs=2e-4)
    assert all(value > 0 for value in parts.values()), parts
    session = Session.load(summary["session"])
    main = session.main_pid
    forwards = [f for f in session.forwards if f.pid == main]
    backwards = [b for b in session.backwards if b.pid == main]
    models = 1 + ("--gan" in extra)
    # the model's forward on every batch; the critic's twice per step and once per batch (the GAN's generator loss)
    expected = steps * accumulate + ("--gan" in extra) * (steps * accumulate + 2 * steps)
    assert len(forwards) == expected, (len(forwards), expected)
    assert {f.module for f in forwards} == ({"Sequential"} if models == 1 else {"Sequential"})
    assert len(backwards) == steps * accumulate + ("--gan" in extra) * steps
    assert len([o for o in session.optimizer_steps if o.pid == main]) == steps * models


def test_a_model_built_after_the_first_ones_is_still_seen(tmp_path):
    """A throwaway model trained without a DataLoader first, then two folds each with a model of its own: every
    training batch's forward is recorded, the later folds' models included."""
    steps = 30
    result = run_cli(tmp_path, ["--", sys.executable, str(SCRIPT), "--steps", str(steps), "--folds", "2",
                                "--warm-up-pass"])
    assert result.returncode == 0, result.stderr
    session = Session.load(result.summary["session"])
    forwards = [f for f in session.forwards if f.pid == session.main_pid]
    last_fold = [f for f in forwards if f.start_ns > max(n.end_ns for n in session.nexts if n.loader_id == 0)]
    assert len(forwards) >= 2 * steps  # the warm-up pass's own forwards may be seen too
    assert len(last_fold) >= steps - 1, len(last_fold)  # the second fold's model, built after the roots settled
    parts = _parts(result.summary)
    assert parts["forward"] > 0 and sum(parts.values()) == pytest.approx(
        result.summary["nodes"]["compute"]["seconds"], rel=0.02, abs=2e-4)


def test_the_profiler_window_gives_the_operators_of_each_part_and_its_steps_are_left_out(tmp_path):
    """Adam stepping 400 tensors one by one: its elementwise operators, in the optimizer, lead the window."""
    steps = 50
    result = run_cli(tmp_path, ["--", sys.executable, str(SCRIPT), "--plant", "heavy_optimizer",
                                "--steps", str(steps)])
    assert result.returncode == 0, result.stderr
    ops = result.summary["operators"]
    assert ops["steps"] == 5 and ops["steps_left_out"] == 6 and result.summary["steps"] == steps
    assert result.summary["steady_steps"] == steps - 6 - 1  # less the window's and the warm-up step
    assert 0 < ops["cost_s"] < ops["window_s"]
    assert {"forward", "backward", "optimizer"} <= set(ops["by_part"]), ops["by_part"]
    assert max(ops["by_part"], key=lambda part: ops["by_part"][part]["cpu_s"]) == "optimizer", ops["by_part"]
    top = ops["top"][0]
    assert top["part"] == "optimizer" and top["name"].startswith("aten::") and top["calls"] >= 400 * 5, top
    assert "operators (torch.profiler over 5 steps" in result.stderr  # said in the terminal, with its cost
    session = Session.load(result.summary["session"])
    window = next(w for w in session.op_windows if w["pid"] == session.main_pid)
    steps_in_window = [s for s in session.optimizer_steps
                       if s.pid == session.main_pid and window["start_ns"] <= s.start_ns <= window["end_ns"]]
    assert len(steps_in_window) >= 5
    # the window timed the step's read-backs at their lines: loss.item() (and Adam's own, at opt.step())
    lines = SCRIPT.read_text().splitlines()
    item = next(i for i, text in enumerate(lines, 1) if "losses.append(loss.item())" in text)
    assert [".item()", str(SCRIPT), item, "train", "cpu"] in [row[:5] for row in window["syncs"]], window["syncs"]
    assert next(row for row in window["syncs"] if row[2] == item)[5] == 5  # once a step
    assert ops["sync_sites"] == []  # a CPU tensor's .item() waits for no device: nothing to place


def _losses(tmp_path, args: list[str], recorded: bool) -> list[str]:
    out = tmp_path / f"losses-{'rec' if recorded else 'bare'}.txt"
    command = [sys.executable, str(SCRIPT), *args, "--losses", str(out)]
    if recorded:
        result = run_cli(tmp_path, ["--", *command], timeout=600)
        assert result.returncode == 0, result.stderr
        assert result.summary["operators"]["steps"] > 0  # the profiler window ran inside these steps
    else:
        subprocess.run(command, check=True, capture_output=True, timeout=600)
    return out.read_text().splitlines()


@pytest.mark.parametrize("args", [["--plant", "slow_layer"], ["--plant", "metric_loop"],
                                  ["--plant", "heavy_optimizer", "--steps", "50"], ["--accumulate", "3", "--gan"],
                                  ["--compile", "--steps", "40"], ["--folds", "2", "--warm-up-pass", "--steps", "20"],
                                  ["--ddp-find-unused", "--depth", "8", "--steps", "40"], ["--plant", "logger_thread", "--steps", "40"]],
                         ids=["slow_layer", "metric_loop", "heavy_optimizer", "accumulate-gan", "compile", "folds",
                              "ddp", "logger_thread"])
def test_losses_are_bit_identical_with_and_without_the_recorder(tmp_path, args):
    bare = _losses(tmp_path, args, recorded=False)
    recorded = _losses(tmp_path, args, recorded=True)
    assert bare and recorded == bare

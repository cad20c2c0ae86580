"""Compute split into forward, backward, optimizer and the step's own code, on hand-built sessions (exact numbers)."""

from __future__ import annotations

import dataclasses

import pytest

from stallscope.analysis.compute_findings import compute_findings
from stallscope.analysis.hotspots import hotspots
from stallscope.analysis.steps import step_stats
from stallscope.render import words
from stallscope.render.summary import _parts_dict
from stallscope.session import BackwardRecord, ForwardRecord, TransferRecord
from tests.unit.test_analysis_steps import MS, PID, make_session, nxt, opt


def fwd(t0, t1, module="Net"):
    return ForwardRecord(t0 * MS, t1 * MS, module, PID)


def bwd(t0, t1, how="backward"):
    return BackwardRecord(t0 * MS, t1 * MS, how, PID)


def _session(steps=4, **lists):
    """Each 100 ms step: data wait 0-10, forward 10-40, step code 40-45 (loss), backward 45-75, step code 75-90
    (metrics), optimizer 90-100."""
    nexts = [nxt(100 * k, 100 * k + 10) for k in range(steps)]
    session = make_session(nexts, [opt(100 * k + 90, 100 * k + 100) for k in range(steps)])
    return dataclasses.replace(session, forwards=[fwd(100 * k + 10, 100 * k + 40) for k in range(steps)],
                               backwards=[bwd(100 * k + 45, 100 * k + 75) for k in range(steps)], **lists)


def test_parts_are_each_spans_time_and_the_step_code_is_the_rest():
    stats = step_stats(_session())
    steady = stats.steady
    assert [s.forward_ns for s in steady] == [30 * MS] * len(steady)
    assert [s.backward_ns for s in steady] == [30 * MS] * len(steady)
    assert [s.optimizer_ns for s in steady] == [10 * MS] * len(steady)
    assert stats.parts_s == pytest.approx({"forward": 0.09, "backward": 0.09, "optimizer": 0.03, "step_code": 0.06})
    assert sum(stats.parts_s.values()) == pytest.approx(stats.compute_s)


def test_a_copy_to_the_device_inside_forward_is_transfer_not_forward():
    copies = [TransferRecord((100 * k + 15) * MS, (100 * k + 20) * MS, 1 << 20, False, False, "Tensor.to", PID)
              for k in range(4)]
    stats = step_stats(_session(transfers=copies))
    assert [s.forward_ns for s in stats.steady] == [25 * MS] * len(stats.steady)
    assert stats.parts_s["forward"] + stats.parts_s["step_code"] + stats.parts_s["backward"] \
        + stats.parts_s["optimizer"] == pytest.approx(stats.compute_s)


def test_forward_and_backward_inside_an_optimizers_closure_are_theirs():
    """L-BFGS: optimizer.step(closure) runs forward and backward inside the step; the optimizer keeps the rest."""
    nexts = [nxt(100 * k, 100 * k + 10) for k in range(4)]
    session = make_session(nexts, [opt(100 * k + 20, 100 * k + 100) for k in range(4)])
    session = dataclasses.replace(session, forwards=[fwd(100 * k + 30, 100 * k + 50) for k in range(4)],
                                  backwards=[bwd(100 * k + 50, 100 * k + 80) for k in range(4)])
    step = step_stats(session).steady[0]
    assert (step.forward_ns, step.backward_ns, step.optimizer_ns) == (20 * MS, 30 * MS, 30 * MS)


def test_a_forward_recomputed_inside_backward_is_backward():
    """Activation checkpointing reruns a module inside backward: that time is backward's."""
    session = _session()
    extra = [fwd(100 * k + 50, 100 * k + 60, "Block") for k in range(4)]
    step = step_stats(dataclasses.replace(session, forwards=session.forwards + extra)).steady[0]
    assert (step.forward_ns, step.backward_ns) == (30 * MS, 30 * MS)


def test_gradient_accumulation_and_two_models_count_every_pass_of_the_step():
    """Two batches per optimizer step (accumulation), each with a generator's and a critic's forward."""
    nexts = [nxt(200 * k + 100 * j, 200 * k + 100 * j + 10) for k in range(3) for j in range(2)]
    session = make_session(nexts, [opt(200 * k + 185, 200 * k + 190) for k in range(3)]
                           + [opt(200 * k + 195, 200 * k + 200) for k in range(3)])
    base = [200 * k + 100 * j for k in range(3) for j in range(2)]
    session = dataclasses.replace(
        session, forwards=[fwd(t + 10, t + 30, "Generator") for t in base] + [fwd(t + 30, t + 40, "Critic")
                                                                               for t in base],
        backwards=[bwd(t + 40, t + 70) for t in base])
    stats = step_stats(session)
    step = stats.steady[0]
    assert step.batches == 2
    assert (step.forward_ns, step.backward_ns, step.optimizer_ns) == (60 * MS, 60 * MS, 10 * MS)
    assert sum(stats.parts_s.values()) == pytest.approx(stats.compute_s)


def test_a_session_without_forward_or_backward_records_has_no_parts():
    session = dataclasses.replace(_session(), forwards=[], backwards=[])
    stats = step_stats(session)
    assert stats.parts_s is None and _parts_dict(stats) is None
    assert all(s.forward_ns == 0 for s in stats.steps)


def test_the_parts_in_the_summary_add_up_to_compute():
    parts = _parts_dict(step_stats(_session()))
    assert set(parts) == {"forward", "backward", "optimizer", "step_code"}
    assert sum(p["share_of_compute"] for p in parts.values()) == pytest.approx(1.0, abs=1e-3)
    assert parts["forward"]["per_step_ms"] == pytest.approx(30.0)


def test_compute_hotspots_carry_the_part_most_of_their_samples_were_in():
    rows = [{"pid": PID, "loader_id": -1, "stage": "compute", "part": "step_code", "count": 6,
             "frames": ["/home/u/train.py:53:accuracy", "/home/u/train.py:103:main"]},
            {"pid": PID, "loader_id": -1, "stage": "compute", "part": "forward", "count": 1,
             "frames": ["/home/u/train.py:53:accuracy", "/home/u/train.py:103:main"]},
            {"pid": PID, "loader_id": -1, "stage": "compute", "part": "optimizer", "count": 3,
             "frames": ["/usr/lib/python3/site-packages/torch/optim/adam.py:200:Adam.step",
                        "/home/u/train.py:106:main"]}]
    found = hotspots(rows, {"compute": 0.5})
    assert [(h.line, h.part, h.samples) for h in found] == [(53, "step_code", 7), (106, "optimizer", 3)]
    assert found[0].share_of_stage == pytest.approx(0.7) and found[0].share_of_step == pytest.approx(0.35)
    assert found[0].to_dict()["part"] == "step_code"


def _facts_session(*facts):
    session = _session()
    return dataclasses.replace(session, compute_facts=[{"pid": PID, "t_ns": 0, **f} for f in facts])


CUDA_MODEL = {"kind": "model", "module": "ResNet", "device": "cuda", "param_dtype": "float32", "autocast": False,
              "grad_enabled": True, "matmul_precision": "highest", "cuda_matmul_tf32": False, "cudnn_benchmark": False,
              "convolutions": 53, "input_channels_last": False, "input_shape": [64, 3, 224, 224], "capability": "9.0"}


def test_cuda_numerics_left_at_their_slowest_are_facts_without_a_prediction():
    session = _facts_session(CUDA_MODEL)
    stats = step_stats(session)
    found = compute_findings(session, stats, {"compute": 1.0}, [])
    assert [r.id for r in found] == ["mixed-precision", "tf32", "cudnn-benchmark", "channels-last"]
    assert all(r.predicted_speedup is None for r in found)
    assert found[0].facts["dtype"] == "bfloat16"
    said = words.recommendation(found[0])
    assert "torch.autocast(\"cuda\", dtype=torch.bfloat16)" in said.change and "bf16=True" in said.change
    assert found[0].overrides == {"autocast": "bfloat16"} and "--set autocast=bfloat16" in said.change
    assert found[3].overrides == {"channels_last": True}
    assert "--set channels_last=true" in words.recommendation(found[3]).change


def test_numerics_already_fast_or_on_the_cpu_say_nothing():
    fast = {**CUDA_MODEL, "autocast": True, "cudnn_benchmark": True, "input_channels_last": True}
    on_cpu = {**CUDA_MODEL, "device": "cpu"}
    older = {**CUDA_MODEL, "capability": "7.0", "convolutions": 0}
    for facts, expected in ((fast, []), (on_cpu, []), (older, ["mixed-precision"])):
        session = _facts_session(facts)
        found = compute_findings(session, step_stats(session), {"compute": 1.0}, [])
        assert [r.id for r in found] == expected, facts
    session = _facts_session(older)
    [older_advice] = compute_findings(session, step_stats(session), {"compute": 1.0}, [])
    assert older_advice.facts["dtype"] == "float16" and older_advice.overrides == {}  # a GradScaler: code only


def test_the_optimizer_finding_needs_a_large_share_and_tensors_updated_one_by_one():
    per_tensor = {"kind": "optimizer", "optimizer_kind": "AdamW", "tensors": 400, "tensors_with_grad": 400,
                  "numel": 10_000, "foreach": None, "fused": None, "device": "cpu"}
    session = _facts_session(per_tensor)
    stats = step_stats(session)  # the optimizer: 10 of each 100 ms step
    assert compute_findings(session, stats, {"compute": stats.wall_s}, []) == []  # 10% is under OPTIMIZER_SHARE
    heavy = dataclasses.replace(stats, parts_s={**stats.parts_s, "optimizer": 0.5 * stats.wall_s})
    found = compute_findings(session, heavy, {"compute": stats.wall_s}, [])
    assert [r.id for r in found] == ["optimizer-foreach"] and found[0].predicted_speedup == pytest.approx(2.0)
    assert words.gain(found[0]) == "at most 2.00x"
    fused = _facts_session({**per_tensor, "fused": True})
    assert compute_findings(fused, heavy, {"compute": stats.wall_s}, []) == []


def test_a_ddp_search_that_found_unused_parameters_is_not_a_finding():
    ddp = {"kind": "ddp", "find_unused_parameters": True, "unused_parameter_size": 0, "post_forward_ns": 10 * MS,
           "post_forward_calls": 10}
    session = _facts_session(ddp)
    stats = step_stats(session)
    found = compute_findings(session, stats, {"compute": stats.wall_s}, [])
    assert [r.id for r in found] == ["ddp-find-unused"]
    assert found[0].predicted_speedup == pytest.approx(100 / 99, abs=0.01) and found[0].facts["search_ms"] == 1.0
    used = _facts_session({**ddp, "unused_parameter_size": 4096})
    assert compute_findings(used, stats, {"compute": stats.wall_s}, []) == []

"""CUDA-event step timing with a fake ``torch.cuda`` whose events run on a scripted GPU clock."""

from __future__ import annotations

import contextlib
import importlib
import types

import pytest

from stallscope.analysis.gpu_timing import gpu_timing
from stallscope.recorder import cuda_timing, events
from stallscope.session import GpuSpanRecord
from tests.unit.report_fixtures import two_worker_session


class FakeGpu:
    """A stream that reaches each recorded event at a time the test sets: ``gpu_at[n]`` for the n-th event."""

    def __init__(self, gpu_at: list[float], done: int | None = None) -> None:
        self.gpu_at, self.recorded, self.done = gpu_at, 0, done
        self.capturing = False
        self.devices_used: set[int] = set()

    def is_current_stream_capturing(self) -> bool:
        return self.capturing

    def device(self, index: int) -> contextlib.AbstractContextManager:
        self.devices_used.add(index)
        return contextlib.nullcontext()

    def current_stream(self, index: int) -> str:
        return f"stream of cuda:{index}"

    def Event(self, enable_timing: bool = False) -> FakeEvent:  # noqa: N802 - mirrors torch.cuda.Event
        assert enable_timing
        return FakeEvent(self)


class FakeEvent:
    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu, self.index = gpu, None

    def record(self, stream: str) -> None:
        assert stream == "stream of cuda:1"
        self.index = self.gpu.recorded
        self.gpu.recorded += 1

    def query(self) -> bool:
        return self.gpu.done is None or self.index < self.gpu.done

    def elapsed_time(self, end: FakeEvent) -> float:
        return self.gpu.gpu_at[end.index] - self.gpu.gpu_at[self.index]  # milliseconds


def start(timing, gpu: FakeGpu) -> None:
    """CUDA initialised by the script, then its first batch copied to cuda:1 (untimed: it names the device)."""
    timing.enable(gpu)
    recorded = gpu.recorded
    timing.time_copy(lambda: types.SimpleNamespace(device=types.SimpleNamespace(index=1)), 10)
    assert gpu.recorded == recorded and timing._device == 1


@pytest.fixture()
def recorder(monkeypatch):
    module = importlib.reload(cuda_timing)
    emitted: list[tuple] = []
    monkeypatch.setattr(events, "emit", lambda *record: emitted.append(record))
    monkeypatch.setattr(module.atexit, "register", lambda fn: None)
    return module, emitted


def test_steps_and_idle_gaps_come_from_the_gpu_clock(recorder):
    timing, emitted = recorder
    # events in order: ready0 end0 ready1 end1 (the first optimizer step only arms the timer)
    gpu = FakeGpu([0.0, 5.0, 9.0, 14.0])
    start(timing, gpu)
    timing.on_batch(False)       # before any optimizer step: not timed
    timing.on_step_end()    # first optimizer step: from now on batches open steps
    timing.on_batch(True)     # ready0 @0
    timing.on_batch(True)     # a second batch of the same step (gradient accumulation): ignored
    timing.on_step_end()    # end0 @5
    timing.on_batch(True)     # ready1 @9: the GPU sat idle 4 ms
    timing.on_step_end()    # end1 @14
    spans = [(r[1], r[2], r[5]) for r in emitted if r[0] == "gpu_span"]
    assert spans == [("step", 0, 5_000_000), ("idle", 1, 4_000_000), ("step", 1, 5_000_000)]
    assert gpu.devices_used == {1}, "events only on the device the batches go to"


def test_pending_events_are_not_waited_for_and_come_out_in_order(recorder):
    timing, emitted = recorder
    gpu = FakeGpu([0.0, 5.0, 6.0, 8.0], done=2)  # the GPU has reached only the first two events
    start(timing, gpu)
    timing.on_step_end()
    timing.on_batch(True)
    timing.on_step_end()
    timing.on_batch(True)
    timing.on_step_end()
    assert [r[1] for r in emitted] == ["step"]
    gpu.done = None
    timing.poll()
    assert [r[1] for r in emitted] == ["step", "idle", "step"]


def test_nothing_is_recorded_during_graph_capture_or_before_cuda(recorder):
    timing, emitted = recorder
    timing.on_step_end()
    timing.on_batch(True)
    timing.on_step_end()
    assert emitted == [] and not timing._pending  # CUDA never initialised by the script
    gpu = FakeGpu([0.0, 1.0])
    timing.enable(gpu)
    timing.on_step_end()
    timing.on_batch(True)
    timing.on_step_end()
    assert gpu.recorded == 0, "no event before a copy names the device"
    start(timing, gpu)
    gpu.capturing = True
    timing.on_step_end()
    timing.on_batch(True)
    timing.on_step_end()
    assert gpu.recorded == 0 and emitted == []


def test_copies_are_timed_between_two_events(recorder):
    timing, emitted = recorder
    gpu = FakeGpu([0.0, 2.0])
    start(timing, gpu)
    assert timing.time_copy(lambda: "copied", 8_000_000) == "copied"
    timing.poll()
    assert emitted == [("gpu_span", "h2d", -1, emitted[0][3], emitted[0][4], 2_000_000, 8_000_000)]


def test_analysis_reports_busy_idle_and_bandwidth():
    session = two_worker_session()
    pid = session.main_pid
    spans = [GpuSpanRecord("step", i, 0, 0, 6_000_000, 0, pid) for i in range(4)]
    spans += [GpuSpanRecord("idle", i, 0, 0, 2_000_000, 0, pid) for i in range(1, 4)]
    spans += [GpuSpanRecord("h2d", -1, 0, 0, 1_000_000, 20_000_000, pid)]
    spans += [GpuSpanRecord("step", 0, 0, 0, 99_000_000, 0, pid + 1)]  # another process: not counted
    import dataclasses

    g = gpu_timing(dataclasses.replace(session, gpu_spans=spans))
    assert g.steps == 4 and g.busy_ms_median == 6.0 and g.idle_ms_median == 2.0
    assert g.idle_fraction == pytest.approx(6 / 30)
    assert g.h2d_gb_per_s == pytest.approx(20.0)
    assert gpu_timing(session) is None


@pytest.mark.parametrize("args,kwargs,expected", [
    (("cuda",), {}, True), (("cuda:1",), {}, True), ((0,), {}, True), ((), {"device": "cuda"}, True),
    (("cpu",), {}, False), ((), {"dtype": "float"}, False), ((), {}, False),
])
def test_only_copies_to_a_cuda_device_are_timed(args, kwargs, expected):
    import torch

    from stallscope.recorder.transfer import _targets_cuda

    assert _targets_cuda(args, kwargs) is expected
    assert _targets_cuda((torch.float16,), {}) is False
    assert _targets_cuda((torch.device("cuda", 0),), {}) is True
    assert _targets_cuda((torch.zeros(1),), {}) is False  # .to(other_tensor) on the host


_DTYPE = object()  # where torch.float32 goes (only the bool after it is the flag)


@pytest.mark.parametrize("name, args, kwargs, expected", [
    ("to", ("cuda",), {"non_blocking": True}, True),
    ("to", ("cuda", _DTYPE, True), {}, True),  # Module.to's positional call
    ("to", ("cuda", _DTYPE, False), {}, False),
    ("to", ("cuda",), {}, False),
    ("cuda", (0, True), {}, True),  # Tensor.cuda(device, non_blocking)
    ("cuda", (0,), {}, False),
    ("cuda", (), {"non_blocking": True}, True),
])
def test_non_blocking_is_read_by_keyword_or_position(name, args, kwargs, expected):
    from stallscope.recorder.transfer import _non_blocking

    assert _non_blocking(name, args, kwargs) is expected

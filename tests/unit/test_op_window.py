"""The profiler window's fold (``recorder/op_window.py``): self times from the nesting of the profiler's raw events,
parts from our ranges, a kernel's device time to the operator that launched it, and a host's wait named with its
operator. The events are built here in the shape torch's ``_KinetoEvent`` gives them, so the device path is checked
without a device; ``tests/e2e/test_step_parts.py`` runs the real profiler on the CPU."""

from __future__ import annotations

from dataclasses import dataclass

from stallscope.recorder.op_window import _fold


@dataclass
class Event:
    _name: str
    _start: int
    _duration: int
    _thread: int = 1
    _device: str = "DeviceType.CPU"
    _correlation: int = 0
    _linked: int = 0

    def name(self) -> str:
        return self._name

    def start_ns(self) -> int:
        return self._start

    def duration_ns(self) -> int:
        return self._duration

    def start_thread_id(self) -> int:
        return self._thread

    def device_type(self) -> str:
        return self._device

    def correlation_id(self) -> int:
        return self._correlation

    def linked_correlation_id(self) -> int:
        return self._linked


def test_self_time_is_the_duration_less_the_direct_children_and_the_part_is_the_innermost_range():
    events = [
        Event("stallscope.forward", 0, 1000),
        Event("aten::linear", 100, 600, _correlation=1),
        Event("aten::addmm", 200, 400, _correlation=2),
        Event("stallscope.optimizer", 2000, 500),
        Event("aten::add_", 2100, 100, _correlation=3),
        Event("aten::mul", 3000, 50, _correlation=4),  # outside every range: the step's own code
    ]
    ops, (cpu, device) = _fold(events)
    assert ops[("forward", "aten::linear")] == [1, 200, 0]
    assert ops[("forward", "aten::addmm")] == [1, 400, 0]
    assert ops[("optimizer", "aten::add_")] == [1, 100, 0]
    assert ops[("step_code", "aten::mul")] == [1, 50, 0]
    assert (cpu, device) == (750, 0)


def test_the_operators_inside_a_dataloader_next_are_data_wait_and_left_out():
    events = [Event("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 900),
              Event("aten::stack", 100, 500, _correlation=1), Event("stallscope.forward", 1000, 100)]
    ops, _ = _fold(events)
    assert not any(name == "aten::stack" for _, name in ops)


def test_a_kernel_counts_for_the_operator_that_launched_it_and_a_backward_thread_is_backward():
    events = [
        Event("stallscope.forward", 0, 1000),
        Event("aten::mm", 100, 300, _correlation=7),
        Event("cudaLaunchKernel", 150, 50, _correlation=900, _linked=7),  # the runtime call, linked to its op
        Event("gemm_kernel", 400, 2500, _device="DeviceType.CUDA", _correlation=900, _linked=7),
        Event("aten::mm", 5000, 100, _thread=2, _correlation=8),  # autograd's device thread
        Event("gemm_kernel", 5200, 700, _device="DeviceType.CUDA", _correlation=901, _linked=8),
    ]
    ops, (cpu, device) = _fold(events)
    assert ops[("forward", "aten::mm")] == [1, 250, 2500]
    assert ops[("forward", "cudaLaunchKernel")] == [1, 50, 0]
    assert ops[("backward", "aten::mm")] == [1, 100, 700]
    assert device == 3200


def test_a_wait_for_the_device_is_named_with_the_operator_that_made_it():
    events = [
        Event("aten::item", 0, 2000, _correlation=1),
        Event("aten::_local_scalar_dense", 10, 1900, _correlation=2),
        Event("cudaMemcpyAsync", 20, 50, _correlation=500, _linked=2),
        Event("cudaStreamSynchronize", 100, 1700, _correlation=501, _linked=0),
        Event("cudaDeviceSynchronize", 3000, 400),  # torch.cuda.synchronize(): no operator around it
    ]
    ops, _ = _fold(events)
    assert ops[("step_code", "cudaStreamSynchronize < aten::_local_scalar_dense")] == [1, 1700, 0]
    assert ops[("step_code", "cudaMemcpyAsync < aten::_local_scalar_dense")] == [1, 50, 0]
    assert ops[("step_code", "aten::_local_scalar_dense")] == [1, 150, 0]
    assert ops[("step_code", "cudaDeviceSynchronize")] == [1, 400, 0]

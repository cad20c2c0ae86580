"""Per-call timing inside a fetch, with injected clocks so every number is exact."""

from __future__ import annotations

import pytest

from stallscope.record import calls


class FakeClock:
    def __init__(self) -> None:
        self.wall = 0
        self.cpu = 0

    def advance(self, wall: int, cpu: int | None = None) -> None:
        self.wall += wall
        self.cpu += wall if cpu is None else cpu


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(calls, "_perf", lambda: fake.wall)
    monkeypatch.setattr(calls, "_cpu", lambda: fake.cpu)
    yield fake
    calls.end_fetch()


def test_exclusive_time_by_node_and_name(clock):
    def read_bytes():
        clock.advance(300, cpu=100)  # 200 ns blocked inside a decode call

    decode = calls.timed_call(read_bytes, "decode", "load")

    def transform_fn():
        clock.advance(50)
        decode()
        clock.advance(70)

    transform = calls.timed_call(transform_fn, "transform", "resize")
    account = calls.begin_fetch()
    transform()
    calls.end_fetch()
    assert account.by_node == {"decode": [300, 100, 1], "transform": [120, 120, 1]}
    assert account.by_name == {"load": [300, 100, 1], "resize": [120, 120, 1]}


def test_same_node_nesting_passes_through(clock):
    inner = calls.timed_call(lambda: clock.advance(10), "transform", "F.resize")

    def outer_fn():
        clock.advance(5)
        inner()

    outer = calls.timed_call(outer_fn, "transform", "RandomResizedCrop")
    account = calls.begin_fetch()
    outer()
    outer()
    calls.end_fetch()
    assert account.by_name == {"RandomResizedCrop": [30, 30, 2]}
    assert account.by_node == {"transform": [30, 30, 2]}


def test_outside_a_fetch_nothing_is_recorded(clock):
    seen = []
    fn = calls.timed_call(lambda x: seen.append(x) or x * 2, "decode")
    assert fn(21) == 42 and seen == [21]
    assert calls.current_account() is None


def test_exception_still_accounts_and_propagates(clock):
    def boom():
        clock.advance(40)
        raise KeyError("x")

    fn = calls.timed_call(boom, "decode", "bad")
    account = calls.begin_fetch()
    with pytest.raises(KeyError):
        fn()
    assert account.by_node == {"decode": [40, 40, 1]}
    assert account.stack == []


def test_timed_method_labels_by_instance_class(clock):
    class Base:
        def forward(self, x):
            clock.advance(7)
            return x + 1

    class Blur(Base):
        pass

    assert calls.timed_method(Base, "forward", "transform")
    assert not calls.timed_method(Base, "forward", "transform"), "never wrapped twice"
    account = calls.begin_fetch()
    assert Blur().forward(1) == 2
    assert account.by_name == {"Blur": [7, 7, 1]}


def test_wrapping_is_idempotent_and_keeps_metadata():
    def decode_jpeg(data):
        """doc"""
        return data

    once = calls.timed_call(decode_jpeg, "decode")
    assert calls.timed_call(once, "decode") is once
    assert once.__name__ == "decode_jpeg" and once.__doc__ == "doc"


def test_a_call_right_after_another_reuses_its_cpu_reading(clock, monkeypatch):
    """Chained calls take their CPU start from the previous reading: exact while the thread stayed on
    the CPU in between; a longer gap reads the clock again, so time blocked there is nobody's."""
    reads = []
    monkeypatch.setattr(calls, "_cpu", lambda: reads.append(clock.cpu) or clock.cpu)
    decode = calls.timed_call(lambda: clock.advance(300, cpu=100), "decode", "load")
    transform = calls.timed_call(lambda: clock.advance(80), "transform", "resize")
    account = calls.begin_fetch()
    decode()  # first call of the fetch: reads the clock at its start and end
    clock.advance(500)  # 0.5 us of Python in between, on the CPU
    transform()  # starts from the last reading + 500 ns: one read, at its end
    clock.advance(2 * calls.CPU_CLOCK_REUSE_NS, cpu=0)  # blocked between calls, longer than the reuse window
    decode()
    calls.end_fetch()
    assert len(reads) == 2 + 1 + 2
    assert account.by_name == {"load": [600, 200, 2], "resize": [80, 80, 1]}
    assert account.by_node == {"decode": [600, 200, 2], "transform": [80, 80, 1]}

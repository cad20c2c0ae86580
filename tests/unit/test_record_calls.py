"""Per-call timing inside a fetch, with injected clocks so every number is exact."""

from __future__ import annotations

import pytest

from stallscope.recorder import calls


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
    assert account.by_name == {"load": [300, 100, 1, "decode"], "resize": [120, 120, 1, "transform"]}


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
    assert account.by_name == {"RandomResizedCrop": [30, 30, 2, "transform"]}
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
    assert account.by_name == {"Blur": [7, 7, 1, "transform"]}


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
    assert account.by_name == {"load": [600, 200, 2, "decode"], "resize": [80, 80, 1, "transform"]}
    assert account.by_node == {"decode": [600, 200, 2], "transform": [80, 80, 1]}


def test_timing_interval_spaces_timed_batches_by_what_their_calls_cost():
    def account_with(calls_made: int) -> calls.FetchAccount:
        account = calls.FetchAccount()
        account.by_name["f"] = [0, 0, calls_made]
        return account

    cost = calls.TIMED_CALL_COST_NS
    # A batch of 16 slow decodes (5 ms each): timing is far under budget, every batch is timed.
    assert calls.timing_interval(account_with(16), 16 * 5_000_000) == 1
    # Calls that cost twice the budget: every other batch.
    wall = int(10 * cost / calls.CALL_TIMING_BUDGET)
    assert calls.timing_interval(account_with(20), wall) == 2
    # Many cheap calls: capped, so some batches are always timed.
    assert calls.timing_interval(account_with(1000), 10_000) == calls.MAX_TIMING_INTERVAL
    assert calls.timing_interval(calls.FetchAccount(), 0) == 1


def test_fetches_time_their_calls_in_one_batch_of_every_few_when_calls_are_cheap(clock, monkeypatch):
    from stallscope.recorder import events, workers

    emitted = []
    monkeypatch.setattr(events, "emit", lambda *record: emitted.append(record))
    monkeypatch.setattr(workers, "_perf", lambda: clock.wall)
    monkeypatch.setattr(workers, "_cpu", lambda: clock.cpu)
    monkeypatch.setattr(workers, "read_runqueue_wait_ns", lambda: -1)
    monkeypatch.setattr(workers, "worker_context", (7, 0, 0))
    monkeypatch.setattr(workers, "_fetch_seq", {})
    monkeypatch.setattr(workers, "_next_timed_seq", {})

    def sample(cost_ns: int) -> int:
        clock.advance(cost_ns)
        return 1

    timed_sample = calls.timed_call(sample, "transform", "sample")

    class Fetcher:
        _stallscope_ctx = None

        def __init__(self, cost_ns: int) -> None:
            self.cost_ns = cost_ns
            self.collate_fn = list

        def fetch(self, indices):
            return self.collate_fn([timed_sample(self.cost_ns) for _ in indices])

    fetch = workers.timed_fetch(Fetcher.fetch)
    cheap = Fetcher(cost_ns=2_000)  # 8 calls of 2 us: timing them would cost far more than the budget
    for _ in range(40):
        assert fetch(cheap, list(range(8))) == [1] * 8
    flags = [r[13] for r in emitted]
    assert [i for i, timed in enumerate(flags) if timed] == [0, 16, 32]
    for record in emitted:
        assert record[0] == "fetch" and record[1:4] == (7, 0, 0)
        by_node, by_name = record[10], record[11]
        assert (by_name["sample"][2] == 8 and by_node["transform"][2] == 8) if record[13] else by_name == by_node == {}
    emitted.clear()
    workers._fetch_seq.clear()
    workers._next_timed_seq.clear()
    slow = Fetcher(cost_ns=5_000_000)  # 5 ms per sample, as a JPEG decode: every batch is timed
    for _ in range(5):
        fetch(slow, list(range(8)))
    assert [r[13] for r in emitted] == [True] * 5


@pytest.mark.skipif(not hasattr(__import__("resource"), "RUSAGE_THREAD"), reason="per-thread page faults: Linux only")
def test_a_fetch_counts_the_page_faults_its_thread_takes(monkeypatch):
    """The kernel's own count: a fetch that writes 8 MiB of freshly mapped memory takes a fault per 4 KiB page of
    it, one that writes memory it had already touched next to none."""
    import mmap

    from stallscope.recorder import events, workers

    emitted = []
    monkeypatch.setattr(events, "emit", lambda *record: emitted.append(record))
    monkeypatch.setattr(workers, "worker_context", (7, 0, 0))
    monkeypatch.setattr(workers, "_fetch_seq", {})
    monkeypatch.setattr(workers, "_next_timed_seq", {})
    size, page = 8 << 20, 4096

    def fresh_mapping() -> mmap.mmap:
        mapped = mmap.mmap(-1, size)
        if hasattr(mapped, "madvise") and hasattr(mmap, "MADV_NOHUGEPAGE"):
            mapped.madvise(mmap.MADV_NOHUGEPAGE)  # a page of 4 KiB each, whatever the kernel's huge-page setting
        return mapped

    kept = fresh_mapping()
    kept[::page] = b"\x01" * (size // page)  # touched once, outside any fetch

    class Fetcher:
        _stallscope_ctx = None
        collate_fn = staticmethod(list)

        def fresh(self, indices):
            mapped = fresh_mapping()
            mapped[::page] = b"\x01" * (size // page)
            mapped.close()
            return list(indices)

        def reused(self, indices):
            kept[::page] = b"\x02" * (size // page)
            return list(indices)

    workers.timed_fetch(Fetcher.fresh)(Fetcher(), [0])
    workers.timed_fetch(Fetcher.reused)(Fetcher(), [0])
    (fresh, reused) = [record[14] for record in emitted]
    assert fresh >= size // page
    assert 0 <= reused < 64

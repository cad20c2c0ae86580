"""stallscope's own threads leave the signals a program handles to its main thread (``background.start_thread``)."""

from __future__ import annotations

import signal
import threading

import pytest

from stallscope.background import MAIN_THREAD_SIGNALS, start_thread

pytestmark = pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="no per-thread signal masks here")


def test_a_started_thread_blocks_the_main_threads_signals_and_the_starter_keeps_its_mask():
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    seen: list[set[int]] = []
    done = threading.Event()

    def read_mask() -> None:
        seen.append(set(signal.pthread_sigmask(signal.SIG_BLOCK, [])))
        done.set()

    thread = start_thread(read_mask, "mask-reader")
    assert done.wait(10) and thread.daemon and thread.name == "mask-reader"
    assert {signal.SIGINT, signal.SIGTERM, signal.SIGCONT, signal.SIGTSTP, signal.SIGALRM} <= MAIN_THREAD_SIGNALS
    assert MAIN_THREAD_SIGNALS <= seen[0]
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before


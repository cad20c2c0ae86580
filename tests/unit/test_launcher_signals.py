"""What a run that ended by signals is said to have ended by, and its exit code: the user's signals, stallscope's
stand-ins for repeated ones (SIGTERM for a second Ctrl-C, SIGKILL for a third), and the script's own way out."""

from __future__ import annotations

import signal

import pytest

from stallscope.launcher import REPEAT_WINDOW_S, _ending, _exit_code, _SignalForwarder

INT, TERM, KILL = signal.SIGINT, signal.SIGTERM, signal.SIGKILL


class _NoChild:
    pid = 2 ** 22 + 12345  # above any pid Linux gives; and nothing is sent anyway (below)


class _Clock:
    """Seconds that pass only when ``advance`` says (the forwarder reads it at each signal)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _forwarder(clock: _Clock, sent: list[int] | None = None) -> _SignalForwarder:
    forwarder = _SignalForwarder(_NoChild(), clock=clock)  # type: ignore[arg-type]
    # no process is signalled: what would have been sent is kept
    forwarder._signal_group = (sent if sent is not None else []).append  # type: ignore[method-assign]
    return forwarder


def _ended(received: list[int], returncode: int) -> tuple[int, str, list[str]]:
    clock = _Clock()
    forwarder = _forwarder(clock)
    for signum in received:  # a second apart: each one a signal of its own
        clock.now += 1.0
        forwarder._forward(signum, None)
    return (_exit_code(forwarder, returncode), *_ending(forwarder, returncode))


@pytest.mark.parametrize("received,returncode,code,note", [
    ([INT], -INT, 130, "stopped by SIGINT sent to stallscope"),
    ([INT, INT], -TERM, 130, "stopped by SIGINT sent to stallscope 2 times: the script went on after the first, so "
                             "it was sent SIGTERM"),
    # it died of the SIGTERM sent for the second Ctrl-C before the third one's SIGKILL mattered
    ([INT, INT, INT], -TERM, 130, "stopped by SIGINT sent to stallscope 3 times: the script went on after the "
                                  "first, so it was sent SIGTERM"),
    ([INT, INT, INT], -KILL, 130, "stopped by SIGINT sent to stallscope 3 times: the script went on after the "
                                  "first, so it was sent SIGKILL"),
    # a SIGTERM from outside is the user's own: its code, as on the bare script
    ([INT, TERM], -TERM, 143, "stopped by SIGINT, then SIGTERM sent to stallscope"),
    ([TERM, INT], -TERM, 143, "stopped by SIGTERM, then SIGINT sent to stallscope"),
    ([INT, INT], 0, 0, "SIGINT, then SIGTERM (for SIGINT) were forwarded to the script, which went on and exited "
                       "with code 0"),
])
def test_a_run_ended_by_signals_keeps_the_users_code_and_says_what_was_sent(received, returncode, code, note):
    exit_code, ended_by, notes = _ended(received, returncode)
    assert exit_code == code and notes == [note]
    assert ended_by == ("exit" if returncode == 0 else "interrupt")


def test_the_same_signal_again_within_the_window_is_one_signal_delivered_twice():
    """``timeout -s INT`` sends SIGINT to stallscope and then to its group: one Ctrl-C, forwarded once, no SIGTERM."""
    clock, sent = _Clock(), []
    forwarder = _forwarder(clock, sent)
    forwarder._forward(INT, None)
    clock.now += REPEAT_WINDOW_S - 0.01
    forwarder._forward(INT, None)
    assert sent == [INT] and forwarder.received == [INT] and forwarder.repeats == 1
    assert _exit_code(forwarder, -INT) == 130
    assert _ending(forwarder, -INT) == ("interrupt", ["stopped by SIGINT sent to stallscope"])


def test_the_same_signal_after_the_window_escalates_and_a_different_one_within_it_counts():
    clock, sent = _Clock(), []
    forwarder = _forwarder(clock, sent)
    forwarder._forward(INT, None)
    clock.now += 0.01
    forwarder._forward(INT, None)  # a repeat, not counted
    clock.now += REPEAT_WINDOW_S  # 0.26 s after the first: a second Ctrl-C
    forwarder._forward(INT, None)
    assert sent == [INT, TERM] and forwarder.received == [INT, INT]
    clock.now += 0.01
    forwarder._forward(TERM, None)  # another signal, however soon: the user's own
    assert sent == [INT, TERM, KILL] and forwarder.received == [INT, INT, TERM]

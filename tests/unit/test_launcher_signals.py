"""What a run that ended by signals is said to have ended by, and its exit code: the user's signals, stallscope's
stand-ins for repeated ones (SIGTERM for a second Ctrl-C, SIGKILL for a third), and the script's own way out."""

from __future__ import annotations

import signal

import pytest

from stallscope.launcher import _ending, _exit_code, _SignalForwarder

INT, TERM, KILL = signal.SIGINT, signal.SIGTERM, signal.SIGKILL


class _NoChild:
    pid = 2 ** 22 + 12345  # above any pid Linux gives; and nothing is sent anyway (below)


def _ended(received: list[int], returncode: int) -> tuple[int, str, list[str]]:
    forwarder = _SignalForwarder(_NoChild())  # type: ignore[arg-type]
    forwarder._signal_group = lambda signum: None  # type: ignore[method-assign]  # no process is signalled
    for signum in received:
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

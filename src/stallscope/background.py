"""stallscope's own threads, started so that they never take a signal meant for the program's main thread.

Linux gives a signal sent to a process to any one of its threads that does not block it, and Python runs the
handler only in the main thread, at its next bytecode. A signal taken by another thread therefore waits while the
main thread sits in a system call: the launcher blocked in ``waitpid`` for the script, the script blocked on a
worker's queue. ``timeout -s INT`` sends SIGINT and, at once, SIGCONT: with the SIGINT pending in the launcher's main
thread, the kernel gave the SIGCONT to the sampler thread, which then took the SIGINT with it, and the launcher
forwarded the Ctrl-C only when the script ended, 12 seconds later, as if it had been ignored. Without stallscope
those processes have no such thread, so each of ours starts with the signals that end, stop, continue or time a
program blocked: the kernel hands them to the main thread, as it would without us. The thread inherits the
mask from the thread that starts it, which blocks them for the moment of the start only (no window in which the
new thread could take one before blocking them itself).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

#: The signals a program's main thread handles: ending (Ctrl-C, SIGTERM, a closed terminal, Ctrl-\), stopping and
#: continuing (Ctrl-Z, fg), the user's own (SIGUSR1/2, often "save a checkpoint"), timers (SIGALRM: the script's
#: ``signal.alarm`` and the stack sampler's wall-clock timer), a resized terminal and a child's end.
MAIN_THREAD_SIGNALS = frozenset(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGTSTP", "SIGCONT", "SIGUSR1",
                                       "SIGUSR2", "SIGALRM", "SIGWINCH", "SIGCHLD") if hasattr(signal, name))


def start_thread(target: Callable[..., Any], name: str, args: tuple[Any, ...] = ()) -> threading.Thread:
    """Start a daemon thread running ``target(*args)`` with ``MAIN_THREAD_SIGNALS`` blocked in it (where the
    platform has ``pthread_sigmask``; elsewhere a plain thread)."""
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    if not hasattr(signal, "pthread_sigmask"):
        thread.start()
        return thread
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, MAIN_THREAD_SIGNALS)
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    return thread

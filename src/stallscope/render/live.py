"""The live view: one status line under the script's own terminal output while it runs.

The script's output cannot simply share the terminal with a status line: its writes would land in
the middle of ours. So when stdout and stderr are both the same terminal, the script gets one
pseudo-terminal for both instead (it still sees a terminal: same buffering, colours and width, and
its stdout and stderr lines stay in the order it wrote them), and a thread here copies what it
writes to the real terminal, erasing the status line first and drawing it again under each finished
line. A line the script has not finished (a progress bar redrawn with ``\\r``) is left alone: the
status line waits until the line ends. Anywhere else (a pipe, a file, ``| tee``) nothing is
changed: the output is byte for byte what the script wrote. The numbers change at most twice a
second.

Only the copy thread touches the pseudo-terminal, from start to end: it closes it when the last
writer has gone. Once the script ended, the launcher waits until its output has been copied (the
pseudo-terminal quiet for a moment, at most ``DRAIN_AT_MOST_S``); a process the script left behind
that still writes is copied on, without a status line, for as long as stallscope runs. If the
thread ever fails, it keeps copying plainly, so the script can never block on a full
pseudo-terminal.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import os
import selectors
import signal
import struct
import termios
import threading
import time
from collections.abc import Callable
from typing import Any

from rich.text import Text

from stallscope.background import start_thread
from stallscope.render.safe_text import safe_console
from stallscope.sample.progress import Progress

UPDATE_EVERY_S = 0.5
_ERASE = b"\r\x1b[2K"
#: After the script ended: its output is drained until nothing came for this long...
DRAIN_QUIET_S = 0.3
#: ...but the launcher waits no longer than this (a process it left behind may write for ever).
DRAIN_AT_MOST_S = 2.0


def status_text(progress: Progress) -> Text:
    """``stallscope ▸ step 1,234 · 11.6 steps/s · data wait 43% · leading so far: transform``."""
    text = Text()
    text.append("stallscope ▸ ", style="bold cyan")
    if progress.steps == 0:
        text.append(f"starting, {progress.elapsed_s:.0f} s, no training step yet", style="dim")
        return text
    text.append(f"step {progress.steps:,}")
    if progress.steps_per_s is not None:
        text.append(f" · {progress.steps_per_s:.1f} steps/s")
    if progress.trend is not None:
        said = f"{'slower' if progress.trend < 1 else 'faster'}: {progress.trend:.2f}x its first minute"
        text.append(f" ({said})", style="bold yellow" if progress.trend < 1 else "green")
    if progress.data_wait_fraction is not None:
        wait = progress.data_wait_fraction
        text.append(" · data wait ")
        text.append(f"{wait:.0%}", style="bold red" if wait >= 0.3 else ("yellow" if wait >= 0.1 else "green"))
    if progress.leading:
        text.append(" · leading so far: ")
        text.append(progress.leading, style="bold")
    return text


def render_status(progress: Progress, width: int) -> bytes:
    """The status line as terminal bytes, cut to ``width`` columns (never wraps onto a second line)."""
    buffer = io.StringIO()
    console = safe_console(file=buffer, force_terminal=True, width=max(20, width), color_system="standard",
                      highlight=False, legacy_windows=False)
    line = status_text(progress)
    line.truncate(max(19, width - 1), overflow="ellipsis")
    console.print(line, end="", no_wrap=True, overflow="ellipsis", soft_wrap=False)
    return buffer.getvalue().encode("utf-8", "replace")


def same_terminal(out_fd: int = 1, err_fd: int = 2) -> bool:
    """stdout and stderr are both the same terminal: the only case the live view changes anything."""
    try:
        return os.isatty(out_fd) and os.isatty(err_fd) and os.path.samestat(os.fstat(out_fd), os.fstat(err_fd))
    except OSError:
        return False


def _terminal_width(fd: int) -> int:
    try:
        return os.get_terminal_size(fd).columns or 80
    except OSError:
        return 80


def _copy_size(from_fd: int, to_fd: int) -> None:
    with contextlib.suppress(OSError):
        size = fcntl.ioctl(from_fd, termios.TIOCGWINSZ, struct.pack("HHHH", 0, 0, 0, 0))
        fcntl.ioctl(to_fd, termios.TIOCSWINSZ, size)


class LiveView:
    """Copy the script's terminal output to ours and keep a status line under it.

    Use: ``view = LiveView(poll)``; give ``view.child_fd`` to the child as its stdout and stderr,
    ``view.start()`` once it runs, ``view.close()`` after it ended (the status line is erased and the
    script's last output copied, so what follows prints where the script's output ended). Build and
    close it in the main thread (it follows the terminal's size through SIGWINCH)."""

    def __init__(self, poll: Callable[[], Progress], terminal_fd: int = 2) -> None:
        self.poll = poll
        self.terminal_fd = terminal_fd
        self._master, self.child_fd = os.openpty()
        _copy_size(terminal_fd, self.child_fd)
        with contextlib.suppress(termios.error):  # the real terminal translates when we write to it
            attrs = termios.tcgetattr(self.child_fd)
            attrs[1] &= ~termios.OPOST
            termios.tcsetattr(self.child_fd, termios.TCSANOW, attrs)
        self._status = b""
        self._shown = False
        self._line_open = False  # the script's last write did not end its line
        self._plain = False  # copy only, no status line: the run ended, or the view failed
        self._child_done = threading.Event()
        self._drained = threading.Event()  # ...and copied what the script wrote (quiet for a moment, or EOF)
        self._thread: threading.Thread | None = None
        self._previous_winch: Any = None

    def start(self) -> None:
        """The child has its end of the pseudo-terminal: ours must close, or its end-of-file never comes."""
        os.close(self.child_fd)
        self._thread = start_thread(self._run, "stallscope-live")
        with contextlib.suppress(ValueError, OSError):  # not the main thread: the size stays as it was
            self._previous_winch = signal.signal(signal.SIGWINCH, self._resized)

    def close(self) -> None:
        """After the script ended: wait until the status line is gone and its output has been copied
        (at most ``DRAIN_AT_MOST_S``; after that the thread goes on copying on its own)."""
        self._child_done.set()
        if self._thread is not None and self._thread.is_alive():
            self._drained.wait(timeout=DRAIN_AT_MOST_S)
        if self._previous_winch is not None:
            with contextlib.suppress(ValueError, OSError):
                signal.signal(signal.SIGWINCH, self._previous_winch)

    def _resized(self, signum: int, frame: Any) -> None:
        _copy_size(self.terminal_fd, self._master)

    def _run(self) -> None:
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(self._master, selectors.EVENT_READ)
                self._loop(selector)
        except Exception:  # noqa: BLE001 - the view must never stop the output: copy plainly from here on
            self._plain = True
            self._drained.set()
            with contextlib.suppress(Exception):
                while self._copy():
                    pass
        finally:
            self._drained.set()
            with contextlib.suppress(OSError):
                os.close(self._master)

    def _loop(self, selector: selectors.BaseSelector) -> None:
        next_update = 0.0
        quiet_since: float | None = None
        while True:
            now = time.monotonic()
            if self._child_done.is_set() and not self._plain:
                self._erase()
                self._plain = True
            if not self._plain and now >= next_update:
                next_update = now + UPDATE_EVERY_S
                self._refresh()
            ready = selector.select(timeout=0.1)
            if ready and not self._copy():
                return  # every writer has closed its end
            if self._child_done.is_set():  # keep copying until the last writer has gone (EOF), but let the
                if ready:                      # launcher go on once the script's own output is through
                    quiet_since = None
                elif quiet_since is None:
                    quiet_since = now
                elif now - quiet_since >= DRAIN_QUIET_S:
                    self._drained.set()

    def _copy(self) -> bool:
        """Copy what is there; False once every writer has closed its end."""
        try:
            data = os.read(self._master, 65536)
        except OSError as exc:
            if exc.errno in (errno.EINTR, errno.EAGAIN):
                return True
            return False  # EIO: the last writer has gone
        if not data:
            return False
        self._erase()
        _write_all(self.terminal_fd, data)
        self._line_open = not data.endswith(b"\n")
        self._draw()
        return True

    def _refresh(self) -> None:
        try:
            progress = self.poll()
            self._status = render_status(progress, _terminal_width(self.terminal_fd))
        except Exception:  # noqa: BLE001 - a bad poll costs one update, never the run
            return
        self._draw()

    def _draw(self) -> None:
        if self._plain or self._line_open or not self._status:
            return
        _write_all(self.terminal_fd, _ERASE + self._status)
        self._shown = True

    def _erase(self) -> None:
        if self._shown:
            _write_all(self.terminal_fd, _ERASE)
            self._shown = False


def _write_all(fd: int, data: bytes) -> None:
    with contextlib.suppress(OSError):  # a terminal that went away costs the view, never the run
        while data:
            data = data[os.write(fd, data):]

"""The live view: one status line under the script's own terminal output while it runs.

The script's output cannot simply share the terminal with a status line: its writes would land in
the middle of ours. So where a stream of the launcher is a terminal, the script gets a
pseudo-terminal for it instead (it still sees a terminal: same buffering, same colours, same
width), and a thread here copies what it writes to the real terminal, erasing the status line
first and drawing it again under each finished line. A line the script has not finished (a
progress bar redrawn with ``\\r``) is left alone: the status line waits until the line ends.
Streams that are not terminals are not touched, so piped and redirected output is byte for byte
what the script wrote. The numbers change at most twice a second.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import os
import select
import struct
import termios
import threading
import time
from collections.abc import Callable

from rich.console import Console
from rich.text import Text

from stallscope.sample.progress import Progress

UPDATE_EVERY_S = 0.5
_ERASE = b"\r\x1b[2K"
#: After the script ended, how long its output may keep arriving (workers flushing) before we stop.
DRAIN_QUIET_S = 0.3


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
    console = Console(file=buffer, force_terminal=True, width=max(20, width), color_system="standard",
                      highlight=False, legacy_windows=False)
    line = status_text(progress)
    line.truncate(max(19, width - 1), overflow="ellipsis")
    console.print(line, end="", no_wrap=True, overflow="ellipsis", soft_wrap=False)
    return buffer.getvalue().encode("utf-8", "replace")


def _terminal_width(fd: int) -> int:
    try:
        return os.get_terminal_size(fd).columns or 80
    except OSError:
        return 80


def _make_pty(like_fd: int) -> tuple[int, int]:
    """A pseudo-terminal with the size of ``like_fd``'s terminal and no output translation (the real
    terminal translates when we write to it, so what reaches the screen is what it would have been)."""
    master, slave = os.openpty()
    with contextlib.suppress(OSError):
        size = fcntl.ioctl(like_fd, termios.TIOCGWINSZ, struct.pack("HHHH", 0, 0, 0, 0))
        fcntl.ioctl(slave, termios.TIOCSWINSZ, size)
    with contextlib.suppress(termios.error):
        attrs = termios.tcgetattr(slave)
        attrs[1] &= ~termios.OPOST
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
    return master, slave


class LiveView:
    """Copy the script's terminal streams to ours and keep a status line under them.

    Use: ``view = LiveView(poll)``; give ``view.child_stdout``/``view.child_stderr`` to the child (None:
    inherit), ``view.start()`` once it runs, ``view.close()`` after it ended (drains what is left and
    erases the status line, so what follows prints where the script's output ended)."""

    def __init__(self, poll: Callable[[], Progress], status_fd: int = 2, out_fd: int = 1) -> None:
        self.poll = poll
        self.status_fd = status_fd
        self._pipes: dict[int, int] = {}  # master fd -> real fd it is copied to
        self._slaves: list[int] = []
        for real in (out_fd, status_fd):
            if os.isatty(real):
                master, slave = _make_pty(real)
                self._pipes[master] = real
                self._slaves.append(slave)
            else:
                self._slaves.append(-1)
        self.child_stdout = self._slaves[0] if self._slaves[0] >= 0 else None
        self.child_stderr = self._slaves[1] if self._slaves[1] >= 0 else None
        self._status = b""
        self._shown = False
        self._line_open = False  # the script's last write did not end its line
        self._next_update = 0.0
        self._child_done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="stallscope-live", daemon=True)

    def start(self) -> None:
        """The child has its ends of the pseudo-terminals: ours must close, or its EOF never comes."""
        for slave in self._slaves:
            if slave >= 0:
                os.close(slave)
        self._slaves = []
        self._thread.start()

    def close(self) -> None:
        self._child_done.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._erase()
        for master in list(self._pipes):
            with contextlib.suppress(OSError):
                os.close(master)
        self._pipes.clear()

    def _loop(self) -> None:
        quiet_since: float | None = None
        while self._pipes:
            now = time.monotonic()
            if now >= self._next_update and not self._child_done.is_set():
                self._next_update = now + UPDATE_EVERY_S
                self._refresh()
            try:
                ready, _, _ = select.select(list(self._pipes), [], [], 0.1)
            except (OSError, ValueError):
                return
            for master in ready:
                self._copy(master)
            if self._child_done.is_set():  # drain: stop once nothing came for a moment
                if ready:
                    quiet_since = None
                elif quiet_since is None:
                    quiet_since = now
                elif now - quiet_since >= DRAIN_QUIET_S:
                    return

    def _copy(self, master: int) -> None:
        try:
            data = os.read(master, 65536)
        except OSError as exc:  # EIO: every writer closed its end
            if exc.errno != errno.EIO:
                raise
            data = b""
        if not data:
            self._pipes.pop(master, None)
            return
        self._erase()
        _write_all(self._pipes[master], data)
        self._line_open = not data.endswith(b"\n")
        self._draw()

    def _refresh(self) -> None:
        try:
            progress = self.poll()
        except Exception:  # noqa: BLE001 - the view must never disturb the run
            return
        self._status = render_status(progress, _terminal_width(self.status_fd))
        self._draw()

    def _draw(self) -> None:
        if self._line_open or not self._status or self._child_done.is_set():
            return
        _write_all(self.status_fd, _ERASE + self._status)
        self._shown = True

    def _erase(self) -> None:
        if self._shown:
            _write_all(self.status_fd, _ERASE)
            self._shown = False


def _write_all(fd: int, data: bytes) -> None:
    with contextlib.suppress(OSError):  # a terminal that went away costs the view, never the run
        while data:
            data = data[os.write(fd, data):]

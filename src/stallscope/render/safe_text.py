"""Text from a run (paths, argv, exception messages, notes, host names) made safe to print on a terminal.

A session is data anyone can plant or a dataset can shape (a file name, an exception message), and a terminal
obeys the control codes in what it is given: an OSC sequence retitles the window, ``ESC[2J`` clears the screen,
``ESC[8m`` hides the text after it, CR and BS overwrite what was printed. ``printable`` is the one filter: every
control character becomes a visible stand-in of the same length (U+2400's control pictures, U+FFFD for C1 and
bidirectional controls), so the text stays readable, a rich ``Text``'s spans stay valid, and nothing reaches the
terminal as a command. ``safe_console`` is a rich Console that passes everything it prints through it.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console, ConsoleOptions, RenderableType, RenderHook, RenderResult
from rich.constrain import Constrain
from rich.rule import Rule
from rich.segment import Segment

#: C1 controls (0x9b is a one-byte CSI on some terminals) and the bidirectional overrides and isolates that can
#: reorder what a line shows ("Trojan Source").
_REPLACEMENT = "\ufffd"
_UNSAFE: dict[int, str] = {
    **{code: chr(0x2400 + code) for code in range(0x20)},
    0x7F: "\u2421",
    **{code: _REPLACEMENT for code in range(0x80, 0xA0)},
    **{code: _REPLACEMENT for code in (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))},
}
_KEEP_LINES = {code: text for code, text in _UNSAFE.items() if code not in (0x09, 0x0A)}


def printable(text: str, *, keep_newlines: bool = True) -> str:
    """``text`` with every control character shown as a visible character of its own (ESC as ␛, CR as ␍, a C1 byte
    or a bidirectional control as U+FFFD). Tabs and newlines stay where ``keep_newlines`` (the default) says a
    block of several lines is fine; in one table cell or one status line they are shown too (␉, ␊)."""
    return text.translate(_KEEP_LINES if keep_newlines else _UNSAFE)


def one_line(text: str) -> str:
    """``printable`` for a place that holds one line: a newline shows as ␊ instead of breaking the row."""
    return printable(text, keep_newlines=False)


class _Printable:
    """A renderable rendered as usual, then with the control characters in its text shown (rich's own styles and
    cursor moves travel in segments of their own, marked ``control`` or as styles, and are left alone)."""

    def __init__(self, inner: RenderableType) -> None:
        self.inner = inner

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for segment in console.render(self.inner, options):
            if segment.control or segment.text.isprintable() or segment.text == "\n":
                yield segment
            else:
                yield Segment(printable(segment.text), segment.style, segment.control)


class _PrintableHook(RenderHook):
    def process_renderables(self, renderables: list[Any]) -> list[Any]:
        return [_Printable(renderable) for renderable in renderables]


def safe_console(**options: Any) -> Console:
    """A rich Console (``options`` as for ``Console``) that shows the control characters of everything it prints
    instead of sending them to the terminal: the net under every terminal renderer of session text."""
    console = Console(**options)
    console.push_render_hook(_PrintableHook())
    return console


#: Where the output is no terminal (a pipe, a file, a CI log), rich would fold every line at 80 columns, mid-phrase:
#: there it is never folded, and tables get up to this many columns, so that none is squeezed.
UNBOUNDED_WIDTH = 1000
#: A rule (the line under a title) has no width of its own off a terminal: it keeps this one.
RULE_WIDTH = 80


class _NarrowRules(RenderHook):
    """Off a terminal: a rule as wide as ``RULE_WIDTH``, not as the unbounded width lines and tables get."""

    def process_renderables(self, renderables: list[Any]) -> list[Any]:
        return [_Printable(Constrain(r.inner, RULE_WIDTH)) if isinstance(r, _Printable) and isinstance(r.inner, Rule)
                else Constrain(r, RULE_WIDTH) if isinstance(r, Rule) else r for r in renderables]


def terminal_console(stderr: bool = False, **options: Any) -> Console:
    """The ``safe_console`` a verb prints with (on standard error where ``stderr``): on a terminal, lines wrap at
    its width; on a pipe or a file, they are never wrapped (a sentence cut at column 80 is half a sentence to a
    grep or a log reader) and tables take the width they need. A ``width`` in ``options`` is kept either way."""
    console = safe_console(stderr=stderr, **options)
    if not console.is_terminal and "width" not in options:
        console.width = UNBOUNDED_WIDTH
        console.soft_wrap = True
        console.push_render_hook(_NarrowRules())
    return console

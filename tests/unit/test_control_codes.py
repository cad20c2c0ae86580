"""Terminal control codes in a session's text never reach the terminal (issue 43, case 2): every renderer of
session text (the summary, report, compare's markdown, history, plan, the live line) shows them as visible
characters instead, through one filter (``render/safe_text.py``)."""

from __future__ import annotations

import io
import re
from dataclasses import replace

from rich.table import Table
from rich.text import Text

from stallscope.analysis import analyze
from stallscope.history.compare import compare
from stallscope.render import terminal
from stallscope.render.history import history_table
from stallscope.render.live import render_status
from stallscope.render.markdown import render_compare
from stallscope.render.safe_text import one_line, printable, safe_console
from stallscope.sample.progress import Progress
from stallscope.session import ErrorRecord, LoaderRecord
from tests.unit.report_fixtures import PID, T0, two_worker_session
from tests.unit.test_compare import make_row, noisy

#: An OSC window title, a screen clear, hidden text, the one-byte C1 CSI, a carriage return over what came before,
#: backspaces, a bell and a right-to-left override.
EVIL = "/data/cats/\x1b]0;OWNED\x07\x1b[2J\x1b[8mhidden.jpg\x9b31m\rok\x08\x08\u202e"
#: What a terminal may be sent besides printable text and newlines: rich's own colour codes (SGR), nothing else.
SGR = re.compile(r"\x1b\[[0-9;]*m")


def unsafe(output: str) -> list[str]:
    """The control characters left in ``output`` once rich's own SGR colour codes are taken out."""
    return [ch for ch in SGR.sub("", output) if not ch.isprintable() and ch not in "\n"]


def hostile_session():
    session = two_worker_session()
    error = ErrorRecord("worker", 200, session.end_ns - 1, "FileNotFoundError", f"[Errno 2] No such file: {EVIL!r}",
                        f"{EVIL}/train.py:42", f"Traceback\n  {EVIL}", loader_id=0, worker=0)
    return replace(session, command=["python", f"{EVIL}/train.py", f"--data={EVIL}"], cwd=EVIL,
                   notes=[f"note about {EVIL}"], errors=[error],
                   loaders=[LoaderRecord(0, PID, T0 + 200 * 1_000_000, f"{EVIL}/train.py:10",
                                         {"num_workers": 2, "batch_size": 4}, {})])


def test_the_filter_shows_every_control_character_and_keeps_the_length():
    shown = printable(EVIL)
    assert unsafe(shown) == [] and len(shown) == len(EVIL)
    assert "␛]0;OWNED" in shown and "hidden.jpg" in shown and "\ufffd31m" in shown and "␍ok␈␈" in shown
    assert one_line("a\nb\tc") == "a␊b␉c" and printable("a\nb\tc") == "a\nb\tc"


def test_the_summary_and_report_show_session_text_without_its_control_codes():
    session = hostile_session()
    for terminal_like in (False, True):
        buffer = io.StringIO()
        console = safe_console(file=buffer, width=300, force_terminal=terminal_like, color_system="standard")
        terminal.render(session, analyze(session), console, session_ref=f"{EVIL}/session.json")
        out = buffer.getvalue()
        assert unsafe(out) == [], out
        assert "␛]0;OWNED" in out  # shown, not dropped: the user sees what the text was


def test_the_default_console_of_the_summary_is_the_safe_one(capsys):
    session = hostile_session()
    terminal.render(session, analyze(session))
    assert unsafe(capsys.readouterr().err) == []


def test_compare_markdown_shows_no_control_codes_in_its_cells():
    rows = [make_row("a", noisy(40, seed=1), command=("python", f"{EVIL}.py")),
            make_row("b", noisy(20, seed=2), command=("python", "x\r\x08\x08y.py"))]
    text = render_compare(compare(rows))
    assert unsafe(text) == [] and "x␍␈␈y.py" in text


def test_history_rows_show_no_control_codes():
    row = replace(make_row("a", noisy(40, seed=1)), command=["python", f"{EVIL}.py", "two\nlines"])
    buffer = io.StringIO()
    safe_console(file=buffer, width=400).print(history_table([row]))
    assert unsafe(buffer.getvalue()) == []


def test_the_live_line_shows_no_control_codes():
    line = render_status(Progress(12, 3.0, 0.4, EVIL, 4.0), 400).decode()
    assert unsafe(line) == []


def test_a_table_cell_and_markup_text_are_filtered_by_the_console():
    buffer = io.StringIO()
    console = safe_console(file=buffer, width=200, force_terminal=True, color_system="standard")
    table = Table()
    table.add_column("a")
    table.add_row(Text(EVIL))
    console.print(table)
    console.print(f"[bold]{EVIL}[/bold]", markup=False)
    console.rule(EVIL)
    assert unsafe(buffer.getvalue()) == []

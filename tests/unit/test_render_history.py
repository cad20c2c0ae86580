"""``stallscope history``'s table keeps one run on one line, whatever its text holds."""

from __future__ import annotations

import io
from dataclasses import replace

from stallscope.render.history import history_table
from stallscope.render.safe_text import safe_console
from tests.unit.test_compare import make_row, noisy


def test_a_newline_in_an_argument_or_an_override_stays_on_the_runs_line():
    row = replace(make_row("20260101-000000-abcdef", noisy(40, seed=1)),
                  command=["python", "/w/train\nnew.py", "--note", "two\nlines"],
                  overrides={"sampler_note": "a\r\nb"})
    buffer = io.StringIO()
    safe_console(file=buffer, width=400).print(history_table([row, row]))
    lines = buffer.getvalue().splitlines()
    assert len(lines) == 3, lines  # the header and one line per run
    assert "'train␊new.py' --note 'two␊lines'" in lines[1] and "a␍␊b" in lines[1], lines[1]

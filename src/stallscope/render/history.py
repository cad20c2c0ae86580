"""``stallscope history``'s table: one row per recorded run."""

from __future__ import annotations

import shlex
import time
from pathlib import Path

from rich.table import Table
from rich.text import Text

from stallscope.history.runs import RunRow
from stallscope.render.markdown import short_commit
from stallscope.render.safe_text import one_line
from stallscope.settings import overrides_text


def short_command(command: list[str]) -> str:
    """The script and its arguments: the interpreter and the script's directory are the same in most rows."""
    parts = list(command)
    if parts and Path(parts[0]).name.startswith("python"):
        parts = parts[1:]
    if parts:
        parts[0] = Path(parts[0]).name
    return shlex.join(parts)


def _fmt(value: float | None, scale: float = 1.0, digits: int = 1) -> str:
    return "–" if value is None else f"{value * scale:.{digits}f}"


def job_cell(row: RunRow) -> str:
    """``JOB host ranks 0-7 of 16``: the job a run of ranks was part of; empty for a run of its own."""
    env = row.environment or {}
    ranks, world = env.get("job_ranks") or [], env.get("job_world_size")
    if not ranks:
        return ""
    held = f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 and ranks == list(range(ranks[0], ranks[-1] + 1)) else (
        ",".join(map(str, ranks)))
    return f"{env.get('job') or '?'} {env.get('job_host') or ''} rank{'s' if len(ranks) > 1 else ''} {held} of {world}"


def history_table(rows: list[RunRow]) -> Table:
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    jobs = any(job_cell(r) for r in rows)
    for name, justify in (("run", "left"), *((("job", "left"),) if jobs else ()), ("started", "left"),
                          ("command", "left"), ("overrides", "left"),
                          ("git", "left"), ("verdict", "left"), ("steady steps", "right"), ("median ms", "right"),
                          ("p90 ms", "right"), ("steps/s", "right"), ("samples/s", "right"), ("wait %", "right"),
                          ("GPU %", "right"), ("RSS GiB", "right"), ("exit", "right")):
        table.add_column(name, justify=justify, no_wrap=True,
                         overflow="ellipsis", max_width=40 if name in ("command", "job") else None)
    for r in rows:
        started = time.strftime("%m-%d %H:%M", time.localtime(r.started_wall)) if r.started_wall else "–"
        command = short_command(r.command)
        table.add_row(  # one run, one line: a newline in an argument or a setting is shown, not followed
            Text(one_line(r.run_id)), *((Text(one_line(job_cell(r))),) if jobs else ()), started,
            Text(one_line(command)),
            Text(one_line(overrides_text(r.overrides))), Text(one_line(short_commit(r.git_commit))),
            Text(one_line(f"{r.verdict or '–'}" + (f" ({r.bottleneck})" if r.bottleneck else ""))),
            str(r.steady_steps if r.steady_steps is not None else "–"),
            _fmt(r.step_median_s, 1000), _fmt(r.step_p90_s, 1000), _fmt(r.steps_per_s, digits=2),
            _fmt(r.samples_per_s), _fmt(r.data_wait_fraction, 100), _fmt(r.gpu_util_mean),
            _fmt(r.peak_rss_bytes, 1 / 1024 ** 3, 2), str(r.exit_code))
    return table

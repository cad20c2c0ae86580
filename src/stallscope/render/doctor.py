"""``stallscope doctor``'s table of checks, with why and fix for those that did not pass."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from stallscope.health import FAIL, PASS, UNKNOWN, WARN, DoctorReport

STATUS_STYLE = {PASS: "green", WARN: "yellow", FAIL: "bold red", UNKNOWN: "magenta", "n/a": "dim"}


def render(report: DoctorReport, console: Console, verbose: bool = False) -> None:
    """The checks as a table, then why and fix for each check that did not pass (all of them with ``verbose``)."""
    table = Table(title="stallscope doctor", title_justify="left", show_lines=False, expand=False)
    table.add_column("status", no_wrap=True)
    table.add_column("check", no_wrap=True)
    table.add_column("value", overflow="fold")
    table.add_column("threshold", overflow="fold", style="dim")
    for check in report.checks:
        table.add_row(Text(check.status, style=STATUS_STYLE.get(check.status, "")), check.id, Text(check.value),
                      check.threshold)
    console.print(table)
    explain = [c for c in report.checks if verbose or c.status in (WARN, FAIL, UNKNOWN)]
    for check in explain:
        if not (check.why or check.fix):
            continue
        console.print(Text.assemble((f"{check.status} ", STATUS_STYLE.get(check.status, "")), (check.id, "bold"),
                                    f"  {check.title}"))
        if check.why:
            console.print(f"  why: {check.why}", markup=False, highlight=False)
        if check.fix:
            console.print(f"  fix: {check.fix}", markup=False, highlight=False)
    counts = ", ".join(f"{report.count(s)} {s}" for s in (PASS, WARN, FAIL, "n/a", UNKNOWN) if report.count(s))
    console.print(f"{len(report.checks)} checks in {report.elapsed_s:.1f} s: {counts}", highlight=False)

"""``stallscope bench``'s tables: the input pipeline alone per worker count, the ceiling, the decoder race."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from stallscope.tuning.bench import BenchResult
from stallscope.tuning.decoders import DecoderRace


def _fmt(value: float | None) -> str:
    return f"{value:.1f}" if value else "-"


def render(result: BenchResult, console: Console) -> None:
    unit = result.unit
    table = Table(title="stallscope bench: input pipeline alone (no model)")
    for col in ("workers", unit, "first batch s", "batches"):
        table.add_column(col, justify="right")
    for c in result.capacity:
        rate = c.get("samples_per_s") if unit == "samples/s" else c.get("batches_per_s")
        mark = " (script's own)" if c.get("num_workers") == result.script_num_workers else ""
        table.add_row(f"{c.get('num_workers')}{mark}",
                      _fmt(rate) if not c.get("error") else f"[red]{escape(str(c['error']))}[/]",
                      _fmt(c.get("first_batch_s")), str(c.get("batches", "-")))
    console.print(table)
    best = result.best_capacity
    console.print(f"input capacity   {_fmt(result.capacity_rate)} {unit}"
                  + (f"  (best at {best['num_workers']} workers)" if best else ""))
    console.print(f"ceiling          {_fmt(result.ceiling_rate)} {unit}  (model on replayed batches: data free)")
    se = f" ± {result.normal.rate.se:.1f}" if result.throughput and result.normal and result.normal.rate else ""
    console.print(f"current          {_fmt(result.throughput)}{se} {unit}  (a normal run)")
    if result.max_input_gain:
        console.print(f"[bold]Any input-side fix can gain at most {result.max_input_gain:.2f}x[/] "
                      f"(ceiling / current).")
    for err in result.errors:
        console.print(f"[yellow]{escape(err)}[/]")
    console.print(f"Details: {result.folder}", markup=False)


def render_race(race: DecoderRace, console: Console) -> None:
    table = Table(title=f"JPEG decoder race on {race.files} files of {race.folder} "
                        f"({race.megapixels:.2f} MP average), one core")
    for col in ("decoder", "scale", "images/s", "vs Pillow"):
        table.add_column(col, justify="right" if col != "decoder" else "left")
    base = next((r["images_per_s"] for r in race.results if r["decoder"] == "pillow" and r["scale"] == 1), None)
    for r in race.ranked() + [r for r in race.results if not r.get("images_per_s")]:
        rate = r.get("images_per_s")
        table.add_row(r["decoder"], "1" if r["scale"] == 1 else f"1/{r['scale']}",
                      _fmt(rate) if rate else f"[red]{escape(str(r.get('error')))}[/]",
                      f"{rate / base:.2f}x" if rate and base else "-")
    console.print(table)
    if race.skipped:
        shown = ", ".join(f"{escape(item['path'])} ({escape(item['error'])})" for item in race.skipped[:3])
        more = f" and {len(race.skipped) - 3} more" if len(race.skipped) > 3 else ""
        console.print(f"[yellow]left out {len(race.skipped)} file(s) that could not be decoded:[/] {shown}{more}")

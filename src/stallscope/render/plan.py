"""``stallscope plan`` in the terminal: the worker table, the answer, the fixes and the assumptions."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from stallscope.analysis.plan import FED_WAIT, Plan
from stallscope.analysis.plan_store import StoreNeed
from stallscope.render.safe_text import terminal_console

FIX_WORDS = {
    "pack-dataset": "pack the dataset (stallscope pack SRC OUT): storage time to about 0.3x",
    "reduced-size-decode": "decode at reduced size (DCT scaling, FastImageFolder): decode time to about 0.5x",
    "uint8-device-normalize": "send uint8 batches and normalize on the GPU (collate_uint8, DeviceNormalizer)",
}
LIMIT_WORDS = {
    "fed": "fed",
    "cores": "the cores: every usable core is busy before the compute is fed",
    "workers": "the worker count: more workers than tabulated would still help (blocked I/O overlaps)",
    "no-worker-helps": "the cores: loading in the training process beats any worker count (workers would take "
                       "the cores the compute uses)",
}


def _shown_rows(plan: Plan) -> list[int]:
    """A readable subset of worker counts: the first few, powers of two, and the ones the plan names."""
    counts = [r.workers for r in plan.rows]
    keep = {c for c in counts if c <= 4 or (c & (c - 1)) == 0}
    keep |= {plan.best_workers, counts[-1]}
    if plan.workers_needed is not None:
        keep.add(plan.workers_needed)
    if plan.target.workers is not None:
        keep.add(plan.target.workers)
    return sorted(keep)


def render(plan: Plan, run_ref: str, console: Console | None = None) -> None:
    console = console or terminal_console()
    t = plan.target
    gpus = f"{t.gpus} GPU(s), one training process each" if t.gpus else "no GPU (training on the CPU)"
    console.rule("[bold]stallscope plan")
    console.print(f"run {escape(run_ref)} projected to {t.cores:.4g} cores, {gpus}: "
                  f"{t.cores_per_process:.3g} core(s) per training process")
    rec = plan.recorded
    measured = rec.get("samples_per_s")
    whole = rec.get("samples_per_s_with_startups")
    rate = f", {measured:,.1f} samples/s" if isinstance(measured, float) else ""
    if isinstance(measured, float) and isinstance(whole, float) and abs(whole - measured) > 0.02 * measured:
        rate += f" between the workers' start-ups ({whole:,.1f} with them, as report counts)"
    console.print(f"recorded: {rec.get('workers')} worker(s), {rec.get('cpus_free'):.2f} CPU(s) free per training "
                  "process" + rate
                  + (", compute on the CPU" if rec.get("compute_on_cpu") else ", compute on a GPU"))
    for caution in plan.cautions:
        console.print(f"[yellow]note: {escape(caution)}[/]")
    console.print(f"the compute could take {plan.compute_samples_per_s:,.1f} samples/s per process")
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    shown = [row for row in (plan.row(count) for count in _shown_rows(plan)) if row is not None]
    cut = any(row.compute_threads for row in shown)
    for name in ("workers", "samples/s per process", "whole job", "data wait", "cores wanted",
                 *(("compute threads",) if cut else ())):
        table.add_column(name, justify="right")
    marks = {plan.best_workers: "best"}
    if plan.workers_needed is not None:
        marks[plan.workers_needed] = "best, fed" if plan.workers_needed == plan.best_workers else "fed"
    if t.workers is not None:
        marks[t.workers] = "asked"
    for row in shown:
        count = row.workers
        style = "bold" if count in marks else ""
        label = f"{count} ({marks[count]})" if count in marks else str(count)
        threads = (f"{row.compute_threads or rec.get('compute_threads') or '?'}",) if cut else ()
        table.add_row(label, f"{row.samples_per_s:,.1f}", f"{row.total_samples_per_s:,.1f}",
                      f"{100 * row.data_wait_fraction:.1f}%", f"{row.cores_wanted:.2f}", *threads, style=style)
    console.print(table)
    console.print("[dim]best: the fewest workers within 2% of the highest rate; fed: the fewest that also wait at "
                  f"most {100 * FED_WAIT:.0f}% of the step for data[/]")
    if cut:
        console.print("[dim]compute threads: where the compute's intra-op threads and the workers would want more "
                      "cores than there are, the row keeps only the threads the workers leave a core for "
                      "(torch.set_num_threads(N) at the start of training, or --set torch_threads=N): threads that "
                      "lose their core to a worker hold the compute back at every parallel region[/]")
    if plan.workers_needed == 0:
        console.print(f"[bold]each training process is fed without workers[/]: loading in it takes at most "
                      f"{100 * FED_WAIT:.0f}% of its step")
    elif plan.workers_needed is not None:
        console.print(f"[bold]each training process needs {plan.workers_needed} worker(s)[/] to wait at most "
                      f"{100 * FED_WAIT:.0f}% of its step for data and run within 2% of its best rate")
    else:
        best = plan.row(plan.best_workers)
        wait = f"{100 * best.data_wait_fraction:.0f}%" if best else "?"
        console.print(f"[bold]no worker count keeps it fed[/]: the best, {plan.best_workers} worker(s), still waits "
                      f"{wait} of each step; the limit is {LIMIT_WORDS[plan.limit]}")
    top = max(plan.rows, key=lambda r: r.samples_per_s)
    if top.workers > 0 and top.data_wait_fraction <= FED_WAIT and top.samples_per_s < 0.95 * plan.compute_samples_per_s:
        beyond = (1.0 - top.data_wait_fraction) / top.samples_per_s - 1.0 / plan.compute_samples_per_s
        console.print(f"beyond its compute, the training process spends {1000 * beyond:.3f} ms per sample taking "
                      f"batches from the workers: no worker count takes it past {top.samples_per_s:,.1f} samples/s")
    if plan.nodes is not None:
        n, best = plan.nodes, plan.row(plan.best_workers)
        per_node = best.total_samples_per_s if best else 0.0
        console.print(f"[bold]the job on {n.count} node(s)[/]: {per_node * n.count:,.1f} samples/s at its best "
                      f"({per_node:,.1f} per node), the gradients' all-reduce taking at most {1e3 * n.sync_s:.2f} ms "
                      f"a step over {n.link_gbps:g} Gb/s ({n.ranks} ranks; recorded here: "
                      f"{1e3 * n.recorded_sync_s:.2f} ms)")
    if plan.store is not None:
        console.print(escape(store_words(plan.store)))
    console.print(f"the stage that gives out first: {plan.saturates_first}")
    for fix in plan.fixes:
        fed = (f"fed with {fix.workers_needed} worker(s)" if fix.workers_needed is not None
               else f"data wait {100 * fix.data_wait_fraction:.0f}% at {fix.workers} worker(s)")
        console.print(f"  fix: {FIX_WORDS.get(fix.id, fix.id)}: predicted {fix.gain:.2f}x, {fed}")
    console.print("[dim]assumptions:[/]")
    for line in plan.assumptions:
        if line not in plan.cautions:  # said at the top
            console.print(f"[dim]  - {escape(line)}[/]")


def store_words(need: StoreNeed) -> str:
    """The plan's line about the store."""
    said = (f"the store ({need.url}, probed by doctor): {need.samples_per_s:,.0f} samples/s read "
            f"{need.objects_per_s:,.0f} objects/s ({need.per_sample:.2f} a sample); ")
    if need.reached:
        said += f"the probe read that with {need.connections} request(s) in flight from one process (measured)"
    else:
        said += (f"one process read at most {need.process_best_objects_per_s:,.0f}/s in the probe: about "
                 f"{need.connections} requests in flight (Little's law on its {need.request_ms:.1f} ms request), "
                 f"spread over at least {need.processes} processes")
    said += (f"; the recorded run kept {need.in_flight_per_worker:.1f} in flight a worker, so {need.workers} "
             f"worker(s) keep about {need.in_flight_planned:.0f}")
    if need.enough:
        said += ": enough"
    else:
        said += (f": short of {need.connections}; keep {need.per_worker_needed} request(s) in flight a worker "
                 "(threads fetching each batch's objects in the dataset's __getitems__), or use more workers")
    capped = need.capped_samples_per_s
    if capped is not None:
        said += (f". But the store gave at most {need.highest_objects_per_s:,.0f} objects/s to several processes "
                 "at once with this machine's CPUs to spare (its limit or its link's, measured by doctor): expect "
                 f"at most {capped:,.0f} samples/s from it, however many workers")
    return said

"""The end-of-run summary in the terminal (rich): verdict, wait share, throughput, nodes, next step."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from stallscope import paths
from stallscope.analysis import Analysis, shares
from stallscope.analysis.hotspots import top_of_stage
from stallscope.constants import NODE_IDS
from stallscope.render import words
from stallscope.render.safe_text import terminal_console
from stallscope.render.summary import recording_dict
from stallscope.render.words import failures
from stallscope.render.words import over_time as over_time_words
from stallscope.session import Session

_VERDICT_STYLE = {"input-bound": "bold red", "compute-bound": "bold green", "balanced": "bold yellow",
                  "unknown": "bold"}


def _bar(share: float, width: int = 24) -> str:
    filled = int(round(share * width))
    return "█" * filled + "·" * (width - filled)


def render(session: Session, analysis: Analysis, console: Console | None = None,
           session_ref: str | None = None, just_saved: bool = True) -> None:
    """The run's report. ``session_ref``: where its session file is, said at the end as ``saved:`` where it was
    written just now (``just_saved``), as ``session:`` where a saved one is rendered again."""
    console = console or terminal_console(stderr=True)
    stats = analysis.steps
    console.rule("[bold]stallscope")
    head = Text("verdict: ")
    head.append(analysis.verdict, style=_VERDICT_STYLE.get(analysis.verdict, "bold"))
    if analysis.verdict != "unknown":
        head.append(f"   data wait {100 * analysis.data_wait_fraction:.1f}% of step time")
    console.print(head)
    if stats.steady:
        console.print(f"throughput: {words.rate(analysis)}   ({len(stats.steady)} steps measured after "
                      f"{stats.warmup_steps} warm-up; "
                      f"median step {1000 * (stats.median_step_s or 0):.1f} ms; steps end at each "
                      f"{'optimizer step' if stats.boundary == 'optimizer' else 'batch'})")
    if (kept := words.recording(recording_dict(session, stats))) is not None:
        console.print(f"  • {kept}", markup=False, highlight=False)
    for line in over_time_words.lines(analysis.over_time, session.start_ns):
        console.print(f"  • {line}", markup=False, highlight=False)
    for line in words.training_process(analysis.training_process):
        console.print(f"  • {line}", markup=False, highlight=False)
    total = sum(analysis.node_seconds.values())
    shares = analysis.node_shares
    if total > 0:
        table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
        table.add_column("node")
        table.add_column("seconds", justify="right")
        table.add_column("share", justify="right")
        table.add_column("")
        for node in NODE_IDS:
            seconds = analysis.node_seconds.get(node, 0.0)
            share = shares.get(node, 0.0)
            style = "bold" if node == analysis.bottleneck_node else ""
            table.add_row(Text(node, style=style), f"{seconds:.2f}", f"{100 * share:.0f}%", _bar(share))
            if node == "compute" and stats.parts_s and seconds > 0:
                for part, part_s in stats.parts_s.items():  # the step's parts, on the same scale as the stages
                    table.add_row(Text(f"  {words.PART_LABELS[part]}", style="dim"), f"{part_s:.2f}",
                                  f"{100 * part_s / total:.0f}%", _bar(part_s / total), style="dim")
        console.print(table)
    if len(analysis.ranks) > 1:
        _rank_table(console, analysis)
    if analysis.bottleneck_node:
        console.print(f"[bold]limiting stage:[/bold] {analysis.bottleneck_node} "
                      f"({100 * analysis.bottleneck_share:.0f}% of step time{words.beside_compute(analysis)})")
        for spot in top_of_stage(analysis.hotspots, analysis.bottleneck_node):
            console.print(f"    {words.hotspot(spot)}", markup=False, highlight=False)
        if analysis.bottleneck_node in ("compute", "sync") and analysis.operators is not None:
            for line in words.operators(analysis.operators):
                console.print(f"    {line}", markup=False, highlight=False)
    for line in words.evidence(analysis):
        console.print(f"  • {line}", markup=False, highlight=False)
    if analysis.gpu_timing is not None:
        console.print(f"  • {words.gpu_timing(analysis.gpu_timing)}", markup=False, highlight=False)
    for ld in analysis.loaders:
        if ld.role != "train" and ld.batches:
            console.print(f"  • loader {ld.loader_id} ({ld.role}, {escape(words.created_at(ld))}): {ld.batches} "
                          "batches, "
                          f"waited {ld.wait_s:.2f} s", highlight=False)
    for pitfall in analysis.pitfalls:
        said = words.pitfall(pitfall)
        console.print(f"[bold yellow]pitfall[/bold yellow] ({pitfall.node}): {escape(said.title)}", highlight=False)
        console.print(f"    {said.evidence}", markup=False, highlight=False)
        console.print(f"    fix: {said.fix}", markup=False, highlight=False)
    if analysis.recommendations:
        top = analysis.recommendations[0]
        advice = words.recommendation(top)
        gain = f" ({words.gain(top)})" if top.predicted_speedup else ""
        console.print(f"[bold]next step:[/bold] {escape(advice.title)}{gain}")
        console.print(f"  change: {advice.change}", markup=False, highlight=False)
        console.print(f"  why: {advice.reason}", markup=False, highlight=False)
        for rec in analysis.recommendations[1:3]:
            gain = f" ({words.gain(rec, short=True)})" if rec.predicted_speedup else ""
            also = words.recommendation(rec)
            console.print(f"  also: {also.title}{gain}: {also.change}", markup=False, highlight=False)
    for left_out in analysis.not_recommended:  # a likely fix the advice leaves out: why, in one line
        why_not = words.not_recommended(left_out)
        console.print(f"not advised: {why_not.title}: {why_not.reason}", markup=False, highlight=False)
    if analysis.failure:
        f = analysis.failure
        stopped = failures.failure_is_stop(f)
        colour = "yellow" if stopped else "red"
        console.print(f"[bold {colour}]{failures.failure_headline(f)}[/bold {colour}] in {failures.failure_place(f)}: "
                      f"{escape(failures.failure_detail(f))}", highlight=False)
        if hint := failures.missing_module_hint(f, session.command):
            console.print(f"  hint: {escape(hint)}", highlight=False)
        if session.overrides and not stopped:
            console.print(f"  it ran with {escape(words.overrides(session.overrides))}, a change stallscope made to "
                          "its DataLoader: run it without that to see whether the change caused this", highlight=False)
    for note in words.notes(analysis):
        console.print(f"[dim]note: {escape(note)}[/dim]", highlight=False)
    if session.overrides:
        console.print(f"[dim]overrides: {escape(str(session.overrides))}[/dim]", highlight=False)
    if session_ref:
        again = (paths.report_command(session_ref, session.run_id) if session.run_id
                 else f"stallscope report {session_ref}")
        label = "saved" if just_saved else "session"
        console.print(f"[dim]{label}: {escape(session_ref)}   re-render: {escape(again)}[/dim]", highlight=False)


def _node_table(console: Console, nodes: list[dict]) -> None:
    """One row per node of a merged job whose nodes hold several ranks each."""
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    for name in ("node", "host", "ranks", "CPUs", "leading", "data wait", "sync", "steps/s"):
        table.add_column(name, justify="left" if name in ("host", "ranks", "leading") else "right")
    for i, n in enumerate(nodes):
        held = f"{n['ranks'][0]}-{n['ranks'][-1]}" if len(n["ranks"]) > 1 else str(n["ranks"][0] if n["ranks"] else "-")
        if not n.get("sent"):
            table.add_row(str(i), Text(str(n["host"])), held, "-", "sent nothing", "-", "-", "-")
            continue
        table.add_row(str(i), Text(str(n["host"])), held, f"{n['cpus']:.3g}" if n.get("cpus") else "-",
                      n.get("leading") or "-", f"{100 * n['data_wait_fraction']:.0f}%",
                      f"{100 * n['sync_fraction']:.0f}%", f"{n['steps_per_s']:.2f}")
    console.print(table)


def _rank_table(console: Console, analysis: Analysis) -> None:
    """One row per rank: where its step time goes and what limits it."""
    dist = analysis.distributed
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    for name in ("rank", "host", "verdict", "limit", "data wait", "sync", "compute", "steps/s"):
        table.add_column(name, justify="left" if name in ("host", "verdict", "limit") else "right")
    for r in analysis.ranks:
        compute = shares(r.node_seconds).get("compute", 0.0)
        style = "bold" if dist is not None and r.rank == dist.straggler_rank else ""
        table.add_row(Text(str(r.rank), style=style), Text(r.host), r.verdict, r.bottleneck_node or "-",
                      f"{100 * r.data_wait_fraction:.0f}%", f"{100 * r.sync_fraction:.0f}%",
                      f"{100 * compute:.0f}%", f"{r.steps_per_s:.2f}")
    console.print(table)
    if dist is not None and len(dist.nodes) > 1 and any(len(n["ranks"]) > 1 for n in dist.nodes):
        _node_table(console, dist.nodes)
    if dist is not None and dist.straggler_rank is not None:
        console.print(f"[bold]straggler:[/bold] rank {dist.straggler_rank} ({words.straggler_short(dist)}); the job's "
                      "figures below are this rank's")

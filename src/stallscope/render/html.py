"""A self-contained HTML report of one run: charts (plotly.js, inlined so it works offline) and findings.

Every string that comes from the user's run (paths, command lines, exception text) is HTML-escaped
where it appears in markup, and the chart data travels in a ``<script type="application/json">``
block whose ``<``, ``>`` and ``&`` are written as ``\\u003c``-style escapes, so nothing from the
run can close the block or become markup. The one chart with user strings, the flame graph, writes them as
entities for plotly's text (``render/hotspots_html.py``).
"""

from __future__ import annotations

import html
import json
import math
import os
import shlex
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import stallscope
from stallscope.analysis import Analysis, shares
from stallscope.analysis.pipeline import calls_in_step_time
from stallscope.constants import NODE_IDS
from stallscope.paths import write_file
from stallscope.render import hotspots_html, words
from stallscope.render.words import failures
from stallscope.render.words import over_time as over_time_words
from stallscope.session import Session
from stallscope.system_samples import SystemSamples

#: Fixed colours per node, in pipeline order, so every chart of the report agrees.
NODE_COLORS = {"storage": "#8c564b", "decode": "#d62728", "transform": "#ff7f0e", "loader": "#9467bd",
               "transfer": "#17becf", "compute": "#2ca02c", "sync": "#7f7f7f"}
#: Compute's parts: greens, darkest first.
PART_COLORS = {"forward": "#1b7a1b", "backward": "#2ca02c", "optimizer": "#74c476", "step_code": "#bae4b3"}
WAIT_COLOR = "#d62728"
MAX_STEP_BARS = 5000
MAX_WORKER_BATCHES = 4000
GIB = 1024 ** 3

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1200px;
       padding: 1rem 2rem 3rem; color: #222; }
h1 { font-size: 1.5rem; margin-bottom: .2rem; } h2 { font-size: 1.15rem; margin-top: 2rem;
     border-bottom: 1px solid #ddd; padding-bottom: .2rem; }
code, pre { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: .85rem; }
pre { background: #f6f6f6; padding: .5rem; overflow-x: auto; white-space: pre-wrap; }
table { border-collapse: collapse; margin: .5rem 0; font-size: .9rem; }
td, th { border-bottom: 1px solid #eee; padding: .25rem .6rem; text-align: left; vertical-align: top; }
th { background: #fafafa; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.verdict { display: inline-block; padding: .1rem .6rem; border-radius: .8rem; color: #fff; font-weight: 600; }
.v-input-bound { background: #c0392b; } .v-compute-bound { background: #27ae60; }
.v-balanced { background: #d4a017; } .v-unknown { background: #777; }
.muted { color: #666; } .failure { border-left: 4px solid #c0392b; padding-left: .8rem; }
.stopped { border-left: 4px solid #d4a017; padding-left: .8rem; }
.chart { width: 100%; min-height: 320px; } nav a { margin-right: 1rem; }
"""

#: Before plotly.js: any error on the page (plotly's included) is kept and shown, not lost in the console.
_ERRORS = """
window.reportErrors = [];
window.noteReportError = function (message) {
  window.reportErrors.push(message);
  var el = document.getElementById("report-errors");
  if (el) { el.textContent += message + "\\n"; el.hidden = false; }
};
window.addEventListener("error", function (e) { window.noteReportError(String(e.message || "error")); });
window.addEventListener("unhandledrejection", function (e) {
  window.noteReportError("unhandled rejection: " + String(e.reason));
});
"""

_BOOT = """
(function () {
  var el = document.getElementById("report-errors");
  if (window.reportErrors.length) { el.textContent = window.reportErrors.join("\\n") + "\\n"; el.hidden = false; }
  var figures = JSON.parse(document.getElementById("report-figures").textContent);
  var config = {displaylogo: false, responsive: true, typesetMath: false};
  var pending = [];
  Object.keys(figures).forEach(function (id) {
    var div = document.getElementById(id);
    if (!div) { return; }
    try {
      pending.push(Plotly.newPlot(div, figures[id].data, figures[id].layout, config));
    } catch (err) {
      window.noteReportError("chart " + id + ": " + String(err));
    }
  });
  Promise.all(pending).then(function () {
    document.body.setAttribute("data-charts-drawn", String(pending.length));
  }, function (err) { window.noteReportError("chart: " + String(err)); });
})();
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def script_json(value: Any) -> str:
    """JSON that is safe inside a ``<script>`` element: no ``<``, ``>`` or ``&`` appear literally."""
    text = json.dumps(_finite(value), separators=(",", ":"), allow_nan=False)
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _layout(title: str, **extra: Any) -> dict[str, Any]:
    layout = {"title": {"text": title, "font": {"size": 15}, "x": 0, "xanchor": "left", "y": 0.98, "yanchor": "top"},
              "margin": {"l": 70, "r": 30, "t": 80, "b": 50},
              "legend": {"orientation": "h", "x": 0, "y": 1.0, "yanchor": "bottom", "traceorder": "normal"},
              "hovermode": "closest", "template": None}
    layout.update(extra)
    return layout


# --- figures ---------------------------------------------------------------------------------------

def step_figure(analysis: Analysis) -> dict[str, Any] | None:
    stats = analysis.steps
    # a long run's steps across a folded span last minutes: drawn, they would flatten every other bar
    steps = [s for s in stats.steps if s.index not in stats.across_folded] if stats.across_folded else stats.steps
    if not steps:
        return None
    stride = max(1, math.ceil(len(steps) / MAX_STEP_BARS))
    shown = steps[::stride]
    x = [s.index for s in shown]
    data = [
        {"type": "bar", "name": "data wait", "x": x, "y": [s.wait_ns / 1e6 for s in shown],
         "marker": {"color": WAIT_COLOR}},
        {"type": "bar", "name": "host-to-device transfer", "x": x, "y": [s.transfer_ns / 1e6 for s in shown],
         "marker": {"color": NODE_COLORS["transfer"]}},
    ]
    if stats.parts_s is None:
        data.append({"type": "bar", "name": "compute", "x": x, "y": [s.compute_ns / 1e6 for s in shown],
                     "marker": {"color": NODE_COLORS["compute"]}})
    else:  # compute in its parts, the step's own code being what the others leave of it
        parts = {"forward": [s.forward_ns for s in shown], "backward": [s.backward_ns for s in shown],
                 "optimizer": [s.optimizer_ns for s in shown],
                 "step_code": [s.compute_ns - s.forward_ns - s.backward_ns - s.optimizer_ns for s in shown]}
        data += [{"type": "bar", "name": f"compute: {words.PART_LABELS[name]}", "x": x,
                  "y": [v / 1e6 for v in values], "marker": {"color": PART_COLORS[name]}}
                 for name, values in parts.items()]
    shapes = []
    if stats.warmup_steps:
        shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": -0.5, "x1": stats.warmup_steps - 0.5,
                       "y0": 0, "y1": 1, "fillcolor": "#999", "opacity": 0.15, "line": {"width": 0}})
    title = "step timeline: data wait vs compute per step (ms)"
    if stride > 1:
        title += f", every {stride}th step"
    if stats.warmup_steps:
        title += " (shaded: warm-up, not counted)"
    return {"data": data, "layout": _layout(title, barmode="stack", shapes=shapes, bargap=0.1,
                                            xaxis={"title": {"text": "step"}}, yaxis={"title": {"text": "ms"}})}


def over_time_figure(session: Session, analysis: Analysis) -> dict[str, Any] | None:
    """The whole run, window by window (``analysis/over_time.py``): steps/s, and the data wait's share on a second
    axis; where the run slowed or sped up, a line at the window it began."""
    found = analysis.over_time
    shown = [w for w in found.windows if w.steps_per_s is not None] if found is not None else []
    if found is None or len(shown) < 2:
        return None
    minutes = [(w.start_ns - session.start_ns) / 6e10 for w in shown]
    data = [{"type": "scatter", "mode": "lines", "name": "steps/s", "x": minutes, "y": [w.steps_per_s for w in shown],
             "line": {"color": NODE_COLORS["compute"]}},
            {"type": "scatter", "mode": "lines", "name": "data wait (% of step time)", "x": minutes, "yaxis": "y2",
             "y": [100 * (w.data_wait_fraction or 0.0) for w in shown], "line": {"color": WAIT_COLOR}}]
    shapes = []
    if found.change is not None:
        at = (found.change.began_ns - session.start_ns) / 6e10
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": at, "x1": at, "y0": 0, "y1": 1,
                       "line": {"color": "#d62728", "dash": "dot"}})
    title = f"the run over time, per {found.window_s:g}-second window"
    if found.change is not None:
        title += f" (dotted: the run {'slowed' if found.change.direction == 'slower' else 'sped up'} from here)"
    return {"data": data, "layout": _layout(title, shapes=shapes, xaxis={"title": {"text": "minutes"}},
                                            yaxis={"title": {"text": "steps/s"}, "rangemode": "tozero"},
                                            yaxis2={"title": {"text": "data wait %"}, "overlaying": "y",
                                                    "side": "right", "range": [0, 100]})}


def node_figure(analysis: Analysis) -> dict[str, Any] | None:
    if sum(analysis.node_seconds.values()) <= 0:
        return None
    nodes = list(NODE_IDS)[::-1]
    seconds = [analysis.node_seconds.get(n, 0.0) for n in nodes]
    share = analysis.node_shares
    data = [{"type": "bar", "orientation": "h", "y": nodes, "x": seconds,
             "marker": {"color": [NODE_COLORS[n] for n in nodes],
                        "line": {"color": ["#000" if n == analysis.bottleneck_node else "rgba(0,0,0,0)"
                                           for n in nodes], "width": 2}},
             "text": [f"{100 * share.get(n, 0.0):.0f}%" for n in nodes], "textposition": "outside",
             "hovertemplate": "%{y}: %{x:.3f} s<extra></extra>", "showlegend": False}]
    return {"data": data, "layout": _layout("step time by pipeline stage (s, steady steps)",
                                            xaxis={"title": {"text": "seconds"}}, height=340)}


def worker_figure(session: Session, analysis: Analysis) -> dict[str, Any] | None:
    """Gantt chart: one row per worker (and the main process), batches split into their stages."""
    stages = analysis.fetch_stages
    split_of = {id(f): stages[i] for i, f in enumerate(session.fetches) if i < len(stages)}
    fetches = sorted((f for f in session.fetches if f.outcome != "StopIteration"), key=lambda f: f.start_ns)
    if not fetches:
        return None
    shown = fetches[:MAX_WORKER_BATCHES]
    origin = session.start_ns
    multi_loader = len({f.loader_id for f in fetches}) > 1

    def row(loader_id: int, worker: int) -> str:
        who = f"worker {worker}" if worker >= 0 else "main process"
        return f"loader {loader_id} · {who}" if multi_loader else who

    segments: dict[str, dict[str, list[Any]]] = defaultdict(lambda: {"y": [], "x": [], "base": [], "text": []})
    for f in shown:
        cursor = f.start_ns
        split = split_of.get(id(f), {})
        how = "" if f.timed else " (split estimated from the call-timed batches)"
        for node in NODE_IDS:
            value = split.get(node, 0)
            if value <= 0:
                continue
            seg = segments[node]
            seg["y"].append(row(f.loader_id, f.worker))
            seg["base"].append((cursor - origin) / 1e9)
            seg["x"].append(value / 1e9)
            seg["text"].append(f"batch {f.seq}: {node} {value / 1e6:.1f} ms of {(f.end_ns - f.start_ns) / 1e6:.1f} ms"
                               f"{how}")
            cursor += value
    data: list[dict[str, Any]] = []
    starts = [w for w in session.worker_starts]
    if starts:
        data.append({"type": "bar", "orientation": "h", "name": "worker start-up",
                     "y": [row(w.loader_id, w.worker) for w in starts],
                     "base": [(w.created_ns - origin) / 1e9 for w in starts],
                     "x": [(w.ready_ns - w.created_ns) / 1e9 for w in starts],
                     "marker": {"color": "#bbbbbb"}, "hovertemplate": "start-up %{x:.3f} s<extra></extra>"})
    for node in NODE_IDS:
        if node in segments:
            seg = segments[node]
            data.append({"type": "bar", "orientation": "h", "name": node, "y": seg["y"], "x": seg["x"],
                         "base": seg["base"], "text": seg["text"], "textposition": "none",
                         "hovertemplate": "%{text}<extra></extra>", "marker": {"color": NODE_COLORS[node]}})
    main_pid = session.main_pid
    waits = [n for n in session.nexts if n.pid == main_pid]
    if waits:
        data.append({"type": "bar", "orientation": "h", "name": "main process waiting for a batch",
                     "y": ["main: data wait"] * len(waits), "base": [(n.start_ns - origin) / 1e9 for n in waits],
                     "x": [(n.end_ns - n.start_ns) / 1e9 for n in waits], "marker": {"color": WAIT_COLOR},
                     "opacity": 0.6, "hovertemplate": "waited %{x:.4f} s<extra></extra>"})
    rows = sorted({y for trace in data for y in trace["y"]}, key=lambda y: (y.startswith("main"), y))
    title = "worker timeline (a batch's stages shown in pipeline order)"
    if len(fetches) > len(shown):
        title += f"; first {len(shown)} of {len(fetches)} batches"
    return {"data": data, "layout": _layout(
        title, barmode="overlay", bargap=0.25, height=max(280, 150 + 40 * len(rows)),
        xaxis={"title": {"text": "seconds since the start of the run"}},
        yaxis={"categoryorder": "array", "categoryarray": rows[::-1], "automargin": True})}


def _series(samples: SystemSamples) -> tuple[list[int], dict[str, list[Any]], dict[str, list[Any]]]:
    """Sample times and two groups of series: percentages, and everything else (in GiB where bytes)."""
    if not samples.present:
        return [], {}, {}
    percent: dict[str, list[Any]] = {}
    other: dict[str, list[Any]] = {}
    for name, values in samples.scalar_series().items():
        if "percent" in name:
            percent[f"system {name}"] = values
        elif "bytes" in name:
            unit = "GiB/s" if "per_s" in name else "GiB"
            other[f"system {name} ({unit})"] = [v / GIB if v is not None else None for v in values]
        else:
            other[f"system {name}"] = values
    rss = samples.tree_rss()
    if any(v is not None for v in rss):
        other["process tree RSS (GiB)"] = [v / GIB if v is not None else None for v in rss]
    for key, target, scale, label in (("util_percent", percent, 1.0, "GPU{} utilization %"),
                                      ("mem_used_bytes", other, 1 / GIB, "GPU{} memory used (GiB)")):
        for k, values in enumerate(samples.gpu_series(key)):
            target[label.format(k)] = [v * scale if v is not None else None for v in values]
    return samples.t_ns, percent, other


def system_figure(session: Session) -> dict[str, Any] | None:
    ticks, percent, other = _series(session.system)
    if not ticks or not (percent or other):
        return None
    x = [(t - session.start_ns) / 1e9 for t in ticks]
    data: list[dict[str, Any]] = []
    for name, values in percent.items():
        data.append({"type": "scatter", "mode": "lines", "name": name, "x": x, "y": values[:len(x)]})
    for name, values in other.items():
        data.append({"type": "scatter", "mode": "lines", "name": name, "x": x, "y": values[:len(x)], "yaxis": "y2",
                     "line": {"dash": "dot"}})
    return {"data": data, "layout": _layout(
        "system metrics over time", margin={"l": 70, "r": 80, "t": 80, "b": 50},
        xaxis={"title": {"text": "seconds since the start of the run"}},
        yaxis={"title": {"text": "%"}, "rangemode": "tozero"},
        yaxis2={"title": {"text": "GiB (dotted lines)"}, "overlaying": "y", "side": "right", "rangemode": "tozero"})}


# --- markup ----------------------------------------------------------------------------------------

def _table(rows: list[tuple[str, str]], raw: bool = False) -> str:
    cells = "".join(f"<tr><th>{_e(k)}</th><td>{v if raw else _e(v)}</td></tr>" for k, v in rows)
    return f"<table>{cells}</table>"


def _run_section(session: Session, analysis: Analysis) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(session.started_wall)) if session.started_wall else "?"
    overrides = words.overrides(session.overrides) or "none"
    rows = [("command", f"<code>{_e(shlex.join(session.command))}</code>"),
            ("working directory", f"<code>{_e(session.cwd)}</code>"),
            ("started", _e(started)), ("wall time", f"{session.wall_s:.2f} s"),
            ("exit code", f"{session.exit_code} ({_e(session.ended_by)})"),
            ("overrides", f"<code>{_e(overrides)}</code>"),
            ("usable CPUs", str(analysis.usable_cpus))]
    env = ", ".join(f"{k}={v}" for k, v in session.environment.items() if v is not None)
    rows.append(("environment", f"<span class=muted>{_e(env)}</span>"))
    return "<h2 id=run>Run</h2>" + _table(rows, raw=True)


def _findings_section(analysis: Analysis, origin_ns: int = 0) -> str:
    stats = analysis.steps
    parts = ["<h2 id=findings>Findings</h2>",
             f"<p><span class='verdict v-{_e(analysis.verdict)}'>{_e(analysis.verdict)}</span> "]
    if analysis.verdict != "unknown":
        parts.append(f"data wait is <b>{100 * analysis.data_wait_fraction:.1f}%</b> of step time; ")
    if stats.steady:
        parts.append(f"{words.rate(analysis)} over {len(stats.steady)} steps after {stats.warmup_steps} warm-up "
                     f"(median step {1000 * (stats.median_step_s or 0):.1f} ms, "
                     f"p90 {1000 * (stats.p90_step_s or 0):.1f} ms)")
    parts.append("</p>")
    if analysis.bottleneck_node:
        parts.append(f"<p>limiting stage: <b>{_e(analysis.bottleneck_node)}</b> "
                     f"({100 * analysis.bottleneck_share:.0f}% of step time)</p>")
    evidence = words.evidence(analysis) + over_time_words.lines(analysis.over_time, origin_ns)
    if evidence:
        parts.append("<p>evidence:</p><ul>" + "".join(f"<li>{_e(line)}</li>" for line in evidence) + "</ul>")
    for pitfall in analysis.pitfalls:
        said = words.pitfall(pitfall)
        parts.append(f"<p><b>pitfall</b> ({_e(pitfall.node)}): {_e(said.title)}<br>{_e(said.evidence)}"
                     f"<br><span class=muted>fix: {_e(said.fix)}</span></p>")
    loaders = [ld for ld in analysis.loaders if ld.batches]
    if loaders:
        parts.append("<table><tr><th>loader</th><th>role</th><th>created at</th><th>num_workers</th>"
                     "<th>batches</th><th>epochs</th><th>waited</th></tr>")
        for ld in loaders:
            parts.append(f"<tr><td>{ld.loader_id}</td><td>{_e(ld.role)}</td><td><code>{_e(words.created_at(ld))}</code></td>"
                         f"<td class=num>{_e(ld.config.get('num_workers', '?'))}</td>"
                         f"<td class=num>{ld.batches}</td><td class=num>{ld.epochs}</td>"
                         f"<td class=num>{ld.wait_s:.2f} s</td></tr>")
        parts.append("</table>")
    if analysis.failure:
        f = analysis.failure
        location = f"<br>at <code>{_e(f.location)}</code>" if f.location else ""
        kind = "stopped" if failures.failure_is_stop(f) else "failure"
        parts.append(f"<div class={kind}><p><b>{_e(failures.failure_headline(f))}</b> in "
                     f"{_e(failures.failure_place(f))}: "
                     f"<code>{_e(f.type)}</code>{location}</p><pre>{_e(failures.failure_message(f))}</pre>"
                     + (f"<details><summary>traceback</summary><pre>{_e(f.traceback)}</pre></details>"
                        if f.traceback else "") + "</div>")
    parts.append(_ranks_table(analysis))
    if analysis.gpu_timing is not None:
        parts.append(f"<p>{_e(words.gpu_timing(analysis.gpu_timing))}</p>")
    for note in words.notes(analysis):
        parts.append(f"<p class=muted>note: {_e(note)}</p>")
    return "".join(parts)


def _ranks_table(analysis: Analysis) -> str:
    """One row per rank of a distributed job, the straggler in bold (as in the terminal summary)."""
    if len(analysis.ranks) < 2:
        return ""
    dist = analysis.distributed
    straggler = dist.straggler_rank if dist is not None else None
    rows = []
    for r in analysis.ranks:
        compute = shares(r.node_seconds).get("compute", 0.0)
        rank = f"<b>{r.rank}</b>" if r.rank == straggler else str(r.rank)
        rows.append(f"<tr><td class=num>{rank}</td><td>{_e(r.host)}</td><td>{_e(r.verdict)}</td>"
                    f"<td>{_e(r.bottleneck_node or '-')}</td>"
                    f"<td class=num>{100 * r.data_wait_fraction:.0f}%</td>"
                    f"<td class=num>{100 * r.sync_fraction:.0f}%</td>"
                    f"<td class=num>{100 * compute:.0f}%</td>"
                    f"<td class=num>{r.steps_per_s:.2f}</td><td class=num>{_e(r.num_workers)}</td>"
                    f"<td>{'failed' if r.failed else ''}</td></tr>")
    head = ("<h3>Ranks</h3><table><tr><th>rank</th><th>host</th><th>verdict</th><th>limit</th><th>data wait</th>"
            "<th>sync</th><th>compute</th><th>steps/s</th><th>workers</th><th></th></tr>")
    note = (f"<p>straggler: <b>rank {straggler}</b> ({_e(words.straggler_short(dist))}); the job's figures above are "
            "this rank's</p>") if straggler is not None else "<p class=muted>no straggler rank</p>"
    return head + "".join(rows) + "</table>" + note


def _recommendations_section(analysis: Analysis) -> str:
    if not analysis.recommendations:
        return "<h2 id=recommendations>Recommendations</h2><p class=muted>none: nothing to change was found.</p>"
    rows = "".join(
        f"<tr><td>{i + 1}</td><td><b>{_e(said.title)}</b><br><span class=muted>{_e(said.reason)}</span></td>"
        f"<td>{_e(r.node)}</td><td><code>{_e(said.change)}</code></td>"
        f"<td class=num>{words.gain(r, short=True) if r.predicted_speedup else '–'}</td></tr>"
        for i, (r, said) in enumerate((r, words.recommendation(r)) for r in analysis.recommendations))
    return ("<h2 id=recommendations>Recommendations</h2><table><tr><th>#</th><th>what and why</th><th>stage</th>"
            f"<th>change</th><th>predicted speedup</th></tr>{rows}</table>" + _not_recommended_list(analysis))


def _not_recommended_list(analysis: Analysis) -> str:
    """The likely fixes left out of the advice, each with why."""
    items = "".join(f"<li><b>{_e(said.title)}</b> ({_e(n.node)}): {_e(said.reason)}</li>"
                    for n, said in ((n, words.not_recommended(n)) for n in analysis.not_recommended))
    return f"<p>not advised:</p><ul>{items}</ul>" if items else ""


def _nodes_table(analysis: Analysis) -> str:
    if sum(analysis.node_seconds.values()) <= 0:
        return ""
    share = analysis.node_shares
    rows = "".join(f"<tr><td>{'<b>' + n + '</b>' if n == analysis.bottleneck_node else n}</td>"
                   f"<td class=num>{analysis.node_seconds.get(n, 0.0):.3f}</td>"
                   f"<td class=num>{100 * share.get(n, 0.0):.1f}%</td></tr>"
                   for n in NODE_IDS)
    table = f"<table><tr><th>stage</th><th>seconds</th><th>share</th></tr>{rows}</table>"
    train = analysis.train_loader
    p = train.pipeline if train else None
    if p is not None and p.by_call:
        # in the stages' seconds above: each call's share of its stage (never more than the stage)
        calls = "".join(f"<tr><td><code>{_e(name)}</code></td><td>{node}</td><td class=num>{seconds:.3f}</td></tr>"
                        for name, node, seconds in calls_in_step_time(p, analysis.node_seconds)[:12])
        table += ("<p>costliest instrumented calls in the training loader's batches, in the stages' seconds:</p>"
                  f"<table><tr><th>call</th><th>stage</th><th>seconds</th></tr>{calls}</table>")
    return table


def _chart(div_id: str, figure: dict[str, Any] | None, figures: dict[str, Any], empty: str) -> str:
    if figure is None:
        return f"<p class=muted>{_e(empty)}</p>"
    figures[div_id] = figure
    return f"<div class=chart id={div_id}></div>"


def render(session: Session, analysis: Analysis, plotly_js: str | None = None) -> str:
    """The report as one HTML string. ``plotly_js`` defaults to the bundle of the installed plotly."""
    if plotly_js is None:
        from plotly.offline import get_plotlyjs

        plotly_js = get_plotlyjs()
    if "</script" in plotly_js.lower():
        raise ValueError("the plotly.js bundle cannot be inlined: it contains '</script'")
    figures: dict[str, Any] = {}
    body = [
        f"<h1>stallscope report <code>{_e(session.run_id)}</code></h1>",
        "<nav><a href=#findings>findings</a><a href=#recommendations>recommendations</a><a href=#steps>steps</a>"
        "<a href=#nodes>stages</a><a href=#hotspots>hotspots</a><a href=#workers>workers</a>"
        "<a href=#system>system</a><a href=#run>run</a></nav>",
        "<pre id=report-errors hidden></pre>",
        _findings_section(analysis, session.start_ns),
        _recommendations_section(analysis),
        "<h2 id=steps>Steps</h2>",
        _chart("chart-steps", step_figure(analysis), figures, "no training step was recorded"),
        _chart("chart-over-time", over_time_figure(session, analysis), figures,
               "no over-time figures: a run too short for two windows, or recorded before windows were"),
        "<h2 id=nodes>Where step time went</h2>",
        _chart("chart-nodes", node_figure(analysis), figures, "no steady steps to split"),
        _nodes_table(analysis),
        "<h2 id=hotspots>Hotspots: the lines the step time goes to</h2>",
        hotspots_html.hotspots_table(analysis),
        _chart("chart-flame", hotspots_html.flame_figure(
            session, analysis, _layout, NODE_COLORS.get(analysis.bottleneck_node or "", "#ff7f0e")),
            figures, "no stack samples of the limiting stage to draw"),
        "<h2 id=workers>Workers</h2>",
        _chart("chart-workers", worker_figure(session, analysis), figures, "no batch fetch was recorded"),
        "<h2 id=system>System</h2>",
        _chart("chart-system", system_figure(session), figures,
               "no system samples in this session (recorded by newer stallscope versions)"),
        _run_section(session, analysis),
        f"<p class=muted>stallscope {_e(stallscope.__version__)}; re-render with "
        f"<code>stallscope report {_e(session.run_id)} --html PATH</code></p>",
    ]
    return (
        "<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
        "<meta name=viewport content='width=device-width, initial-scale=1'>"
        f"<title>stallscope report {_e(session.run_id)}</title><style>{_CSS}</style>"
        f"<script>{_ERRORS}</script><script>{plotly_js}</script></head>\n<body>\n" + "\n".join(body)
        + f"\n<script type=application/json id=report-figures>{script_json(figures)}</script>"
        + f"\n<script>{_BOOT}</script>\n</body></html>\n"
    )


def write_html(path: str | os.PathLike[str], text: str) -> Path:
    return write_file(path, text)

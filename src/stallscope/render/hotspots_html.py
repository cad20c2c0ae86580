"""The HTML report's hotspots: the table of sites and a flame graph of the limiting stage's sampled stacks.

The flame graph is a plotly icicle laid out as a flame (outermost frame at the bottom, widths by samples), so it
stays one chart with thousands of frames: plotly draws the levels that fit (``maxdepth``) and a click zooms into
a frame. Its labels and hover text are the user's function names and paths; plotly's text reads a few tags
(``<b>``, ``<br>``, ``<a>``) and turns entities back into characters, so ``&``, ``<`` and ``>`` go in as
entities: ``<lambda>`` and ``<module>`` show as written and nothing in a name becomes markup.
"""

from __future__ import annotations

import html
from collections import deque
from collections.abc import Callable
from typing import Any

from stallscope.analysis import Analysis
from stallscope.analysis.sampled_stacks import CallNode, Frame, call_tree, job_stacks
from stallscope.session import Session

#: Frames drawn at most: the costliest (a frame is drawn only with its caller).
MAX_FLAME_NODES = 3000
#: Levels shown at once; a click on a frame shows the levels under it.
MAX_FLAME_LEVELS = 14
#: Frames with fewer samples than this share of the stage are left out (their caller's bar shows them).
MIN_FLAME_SHARE = 0.001


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def plotly_text(value: str) -> str:
    """A user string as plotly text that shows as written: its tag and entity characters as entities."""
    return value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def hotspots_table(analysis: Analysis) -> str:
    """The sites of every stage, costliest first (the summary's ``hotspots``), as an HTML table."""
    if not analysis.hotspots:
        return ("<p class=muted>no hotspots: no stack samples of the training loader's fetches "
                "(the notes say why when sampling could not run)</p>")
    rows = "".join(
        f"<tr><td>{'<b>' + _e(h.stage) + '</b>' if h.stage == analysis.bottleneck_node else _e(h.stage)}</td>"
        f"<td><code>{_e(h.file)}:{h.line}</code></td><td><code>{_e(h.function)}</code></td>"
        f"<td>{'<code>' + _e(h.library) + '</code>' if h.library else '–'}</td>"
        f"<td class=num>{100 * h.share_of_stage:.1f}%</td><td class=num>{100 * h.share_of_step:.1f}%</td></tr>"
        for h in analysis.hotspots)
    return ("<table><tr><th>stage</th><th>file:line</th><th>function</th><th>library call</th>"
            f"<th>share of stage</th><th>share of step</th></tr>{rows}</table>")


def _kept(root: CallNode) -> list[tuple[CallNode, int, int]]:
    """(node, its index, its parent's index; -1 for the root) of the nodes drawn: the costliest, each with its
    caller, none under ``MIN_FLAME_SHARE`` of the root."""
    floor = max(1, root.count * MIN_FLAME_SHARE)
    candidates: list[tuple[int, int, int, CallNode, int]] = []  # (-count, depth, order, node, parent order)
    todo: deque[tuple[CallNode, int, int]] = deque([(root, 0, -1)])
    while todo:  # breadth first: a caller comes before its callees, siblings largest first
        node, depth, parent = todo.popleft()
        order = len(candidates)
        candidates.append((-node.count, depth, order, node, parent))
        todo.extend((child, depth + 1, order) for child in node.ordered() if child.count >= floor)
    index: dict[int, int] = {}
    kept: list[tuple[CallNode, int, int]] = []
    for _, _, order, node, parent in sorted(candidates, key=lambda c: c[:3]):
        if len(kept) >= MAX_FLAME_NODES:
            break
        if parent == -1 or parent in index:
            index[order] = len(kept)
            kept.append((node, len(kept), index.get(parent, -1)))
    return kept


def flame_figure(session: Session, analysis: Analysis, layout: Callable[..., dict[str, Any]],
                 color: str = "#ff7f0e") -> dict[str, Any] | None:
    """A flame graph (plotly icicle) of the limiting stage's sampled stacks; None without samples of it."""
    stage = analysis.bottleneck_node
    stacks = [s for s in job_stacks(session, analysis.steps.loader_ids) if s.stage == stage]
    root = call_tree(stacks)
    if root.count <= 0:
        return None
    kept = _kept(root)
    ids, parents, labels, values, hover = [], [], [], [], []
    for node, index, parent in kept:
        ids.append(f"f{index}")
        parents.append(f"f{parent}" if parent >= 0 else "")
        values.append(node.count)
        if isinstance(node.key, Frame):
            labels.append(plotly_text(node.key.label))
            hover.append(plotly_text(f"{node.key.function} at {node.key.file}:{node.key.line}"))
        else:
            labels.append(plotly_text(f"{stage}: all sampled stacks"))
            hover.append(plotly_text(f"{stage}: every sample of the stage"))
    levels = min(root.depth() + 1, MAX_FLAME_LEVELS)
    data = [{"type": "icicle", "ids": ids, "parents": parents, "labels": labels, "values": values,
             "branchvalues": "total", "customdata": hover, "maxdepth": levels, "sort": False,
             "tiling": {"orientation": "v", "flip": "y"}, "textinfo": "label",
             "marker": {"colors": [color] * len(ids), "line": {"width": 0.5, "color": "#fff"}},
             "pathbar": {"visible": True, "side": "bottom"},
             "hovertemplate": "%{customdata}<br>%{value} samples, %{percentRoot:.1%} of the stage<extra></extra>"}]
    title = (f"flame graph of {stage}, the limiting stage: {root.count} sampled stacks "
             "(outermost frame at the bottom; click a frame to zoom)")
    if len(kept) < sum(1 for _ in _all(root)):
        title += f"; the {len(kept)} costliest frames"
    return {"data": data, "layout": layout(title, height=max(320, 120 + 28 * levels),
                                           margin={"l": 10, "r": 10, "t": 80, "b": 30})}


def _all(node: CallNode) -> Any:
    yield node
    for child in node.children.values():
        yield from _all(child)

"""The HTML report: self-contained, user strings escaped, and (in headless Chromium) free of errors."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from stallscope.analysis import analyze
from stallscope.render import html
from tests.unit.report_fixtures import (
    HOSTILE,
    HOSTILE_FUNCTION,
    HOSTILE_MESSAGE,
    two_worker_session,
)

FAKE_PLOTLY = "window.Plotly = {newPlot: function () { return Promise.resolve(); }};"
CHROMIUM = Path("/usr/bin/chromium")


def render(plotly_js: str | None = FAKE_PLOTLY, **kwargs) -> str:
    session = two_worker_session(**{"stacks": True, **kwargs})
    return html.render(session, analyze(session), plotly_js=plotly_js)


def figures_of(text: str) -> dict:
    match = re.search(r'<script type=application/json id=report-figures>(.*?)</script>', text, re.S)
    assert match
    return json.loads(match.group(1))


def test_report_has_every_section_and_chart():
    text = render()
    for anchor in ("findings", "recommendations", "steps", "nodes", "hotspots", "workers", "system", "run"):
        assert f"id={anchor}>" in text
    figures = figures_of(text)
    assert set(figures) == {"chart-steps", "chart-nodes", "chart-flame", "chart-workers", "chart-system"}
    steps = figures["chart-steps"]["data"]
    assert [t["name"] for t in steps] == ["data wait", "host-to-device transfer", "compute"]
    assert steps[0]["y"][1] == 40.0 and steps[2]["y"][1] == 60.0
    rows = {y for t in figures["chart-workers"]["data"] for y in t["y"]}
    assert rows == {"worker 0", "worker 1", "main: data wait"}
    assert "input-bound" in text and "limiting stage" in text


def test_user_strings_are_escaped_everywhere():
    text = render()
    assert HOSTILE not in text and HOSTILE_MESSAGE not in text
    assert "&lt;script&gt;document.body.setAttribute(&#x27;data-pwned&#x27;,&#x27;1&#x27;)&lt;/script&gt;" in text
    assert "&lt;img src=x onerror=" in text
    assert HOSTILE_FUNCTION not in text
    # Only the report's own four script elements exist: error catcher, plotly, chart data, boot.
    assert len(re.findall(r"<script", text, re.I)) == 4
    figures_block = text.split("id=report-figures>", 1)[1].split("</script>", 1)[0]
    assert "<" not in figures_block and ">" not in figures_block and "&" not in figures_block


def test_hotspots_table_lists_every_site_costliest_first():
    text = render()
    table = text.split("<h2 id=hotspots>", 1)[1].split("<h2", 1)[0]
    rows = re.findall(r"<tr>(.*?)</tr>", table)
    cells = [re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row) for row in rows]
    path = html._e(HOSTILE) + "/train.py"
    assert cells == [
        ["stage", "file:line", "function", "library call", "share of stage", "share of step"],
        ["storage", f"<code>{path}:20</code>", "<code>read_bytes</code>", "–", "100.0%", "12.5%"],
        ["<b>decode</b>", f"<code>{path}:31</code>", "<code>Images.__getitem__</code>", "<code>PIL open</code>",
         "50.0%", "8.2%"],
        ["<b>decode</b>", f"<code>{path}:12</code>", f"<code>{html._e(HOSTILE_FUNCTION)}</code>", "–", "25.0%",
         "4.1%"],
        ["<b>decode</b>", f"<code>{path}:40</code>", "<code>Images.__getitem__.&lt;locals&gt;.&lt;lambda&gt;</code>",
         "–", "25.0%", "4.1%"],
    ]


def test_flame_graph_of_the_limiting_stage_merges_stacks_from_the_outermost_frame():
    flame = figures_of(render())["chart-flame"]
    (icicle,) = flame["data"]
    assert icicle["type"] == "icicle" and icicle["branchvalues"] == "total"
    assert icicle["tiling"] == {"orientation": "v", "flip": "y"}  # a flame: the outermost frame at the bottom
    assert list(zip(icicle["ids"], icicle["parents"], icicle["labels"], icicle["values"])) == [
        ("f0", "", "decode: all sampled stacks", 100),
        ("f1", "f0", "_MapDatasetFetcher.fetch (fetch.py:54)", 100),
        ("f2", "f1", "Images.__getitem__ (train.py:31)", 50),
        ("f3", "f1", "Images.__getitem__ (train.py:33)", 50),
        ("f4", "f2", "open (Image.py:3300)", 50),
        ("f5", "f3", "&lt;img src=x onerror=\"document.body.setAttribute('data-pwned','3')\"&gt; (train.py:12)", 25),
        ("f6", "f3", "Images.__getitem__.&lt;locals&gt;.&lt;lambda&gt; (train.py:40)", 25),
    ]
    assert icicle["customdata"][4] == "open at /venv/lib/python3.11/site-packages/PIL/Image.py:3300"
    assert "decode, the limiting stage: 100 sampled stacks" in flame["layout"]["title"]["text"]


def test_flame_graph_keeps_the_costliest_frames_with_their_callers(monkeypatch):
    from stallscope.render import hotspots_html

    monkeypatch.setattr(hotspots_html, "MAX_FLAME_NODES", 4)
    flame = figures_of(render())["chart-flame"]
    (icicle,) = flame["data"]
    assert icicle["ids"] == ["f0", "f1", "f2", "f3"] and icicle["parents"] == ["", "f0", "f1", "f1"]
    assert "the 4 costliest frames" in flame["layout"]["title"]["text"]


def test_without_stack_samples_the_hotspots_section_says_so():
    text = render(stacks=False)
    assert "no hotspots: no stack samples" in text and "no stack samples of the limiting stage to draw" in text
    assert "chart-flame" not in figures_of(text)


def test_script_json_cannot_close_its_script_element():
    encoded = html.script_json({"path": "</script><script>alert(1)</script>&amp;", "x": float("nan")})
    assert "</" not in encoded and "&" not in encoded
    assert json.loads(encoded) == {"path": "</script><script>alert(1)</script>&amp;", "x": None}


def test_plotly_bundle_that_cannot_be_inlined_is_refused():
    with pytest.raises(ValueError):
        render(plotly_js="var s = '</script>';")


def test_without_samples_the_system_section_says_so():
    text = render(samples=False)
    assert "no system samples in this session" in text
    assert "chart-system" not in figures_of(text)


def test_default_bundle_is_inlined_and_offline(tmp_path):
    pytest.importorskip("plotly")
    text = render(plotly_js=None)
    assert len(text) > 1_000_000  # plotly.js itself is in the file
    assert not re.search(r"<(script|link)[^>]+(src|href)=['\"]?https?:", text)
    path = html.write_html(tmp_path / "r.html", text)
    assert path.read_text(encoding="utf-8") == text


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
             f"--user-data-dir={tmp_path / 'chromium-profile'}", "--enable-logging=stderr", "--v=0",
             "--virtual-time-budget=10000", "--window-size=1280,3400"]
    return subprocess.run([str(CHROMIUM), *flags, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.browser
def test_report_in_headless_chromium(tmp_path):
    """The real report in a real browser: charts drawn, no console message, the hostile path inert.

    Skipped where Chromium is missing, except in CI: ``.ci/run`` installs it where it can and then sets
    STALLSCOPE_REQUIRE_BROWSER, so a browser that should be there and is not fails instead of skipping."""
    if not CHROMIUM.exists():
        if os.environ.get("STALLSCOPE_REQUIRE_BROWSER"):
            pytest.fail(f"STALLSCOPE_REQUIRE_BROWSER is set but {CHROMIUM} is missing")
        pytest.skip("needs /usr/bin/chromium (Debian: apt-get install chromium; .ci/run installs it as root)")
    pytest.importorskip("plotly")
    page = tmp_path / "report.html"
    html.write_html(page, render(plotly_js=None))
    url = page.as_uri()

    dom = _chromium(tmp_path, "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console
    body = re.search(r"<body[^>]*>", dom.stdout).group(0)
    assert 'data-charts-drawn="5"' in body, body
    assert "data-pwned" not in body
    assert re.search(r'<pre id="report-errors" hidden="">\s*</pre>', dom.stdout)
    assert dom.stdout.count('class="main-svg"') >= 5  # plotly drew SVG for the charts
    assert "iciclelayer" in dom.stdout  # the flame graph is drawn, its frames as SVG text
    assert "&lt;lambda&gt; (train.py:40)" in dom.stdout and "<lambda>" not in dom.stdout

    shot = tmp_path / "report.png"
    screenshot = _chromium(tmp_path, f"--screenshot={shot}", url)
    assert screenshot.returncode == 0 and shot.stat().st_size > 10_000, screenshot.stderr[-2000:]
    if os.environ.get("STALLSCOPE_SCREENSHOT_DIR"):  # to look at it afterwards
        keep = Path(os.environ["STALLSCOPE_SCREENSHOT_DIR"])
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, keep / "report.png")
        shutil.copy(page, keep / "report.html")


@pytest.mark.browser
def test_a_flame_graph_of_thousands_of_frames_in_headless_chromium(tmp_path, monkeypatch):
    """3,000 frames (random stacks up to 40 deep, none left out): drawn, and nothing on the console."""
    if not CHROMIUM.exists():
        pytest.skip("needs /usr/bin/chromium")
    pytest.importorskip("plotly")
    from stallscope.render import hotspots_html

    monkeypatch.setattr(hotspots_html, "MIN_FLAME_SHARE", 0.0)
    rng = random.Random(1)
    session = two_worker_session(stacks=True)
    for _ in range(3000):
        frames = [f"/u/train.py:{rng.randint(1, 30)}:f{rng.randint(0, 8)}_{d}" for d in range(rng.randint(5, 40))]
        session.stack_samples.append({"pid": 200, "loader_id": 0, "stage": "decode", "frames": frames,
                                      "count": rng.randint(1, 50)})
    text = html.render(session, analyze(session), plotly_js=None)
    assert len(figures_of(text)["chart-flame"]["data"][0]["ids"]) == hotspots_html.MAX_FLAME_NODES
    page = html.write_html(tmp_path / "report.html", text)
    dom = _chromium(tmp_path, "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert [line for line in dom.stderr.splitlines() if ":CONSOLE" in line] == []
    assert 'data-charts-drawn="5"' in re.search(r"<body[^>]*>", dom.stdout).group(0)
    assert dom.stdout.count('class="slice') >= 1000


def test_report_html_without_plotly_is_one_line_and_exit_2(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    session = next((Path(__file__).parent.parent / "data" / "summaries").glob("*/session.json"))
    blocked = ("import sys\nsys.modules['plotly'] = None  # as if the report extra were not installed\n"
               "from stallscope.cli.main import main\nsys.exit(main(sys.argv[1:]))\n")
    done = subprocess.run([sys.executable, "-c", blocked, "report", str(session), "--html", str(tmp_path / "r.html")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "stallscope report: --html needs plotly (plotly.offline); install it with: pip install 'stallscope[report]'"]
    assert not (tmp_path / "r.html").exists()

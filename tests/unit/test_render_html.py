"""The HTML report: self-contained, user strings escaped, and (in headless Chromium) free of errors."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from stallscope.analysis import analyze
from stallscope.render import html
from tests.unit.report_fixtures import HOSTILE, HOSTILE_MESSAGE, two_worker_session

FAKE_PLOTLY = "window.Plotly = {newPlot: function () { return Promise.resolve(); }};"
CHROMIUM = Path("/usr/bin/chromium")


def render(plotly_js: str | None = FAKE_PLOTLY, **kwargs) -> str:
    session = two_worker_session(**kwargs)
    return html.render(session, analyze(session), plotly_js=plotly_js)


def figures_of(text: str) -> dict:
    match = re.search(r'<script type=application/json id=report-figures>(.*?)</script>', text, re.S)
    assert match
    return json.loads(match.group(1))


def test_report_has_every_section_and_chart():
    text = render()
    for anchor in ("findings", "recommendations", "steps", "nodes", "workers", "system", "run"):
        assert f"id={anchor}>" in text
    figures = figures_of(text)
    assert set(figures) == {"chart-steps", "chart-nodes", "chart-workers", "chart-system"}
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
    # Only the report's own four script elements exist: error catcher, plotly, chart data, boot.
    assert len(re.findall(r"<script", text, re.I)) == 4
    figures_block = text.split("id=report-figures>", 1)[1].split("</script>", 1)[0]
    assert "<" not in figures_block and ">" not in figures_block and "&" not in figures_block


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
    assert 'data-charts-drawn="4"' in body, body
    assert "data-pwned" not in body
    assert re.search(r'<pre id="report-errors" hidden="">\s*</pre>', dom.stdout)
    assert dom.stdout.count('class="main-svg"') >= 4  # plotly drew SVG for the charts

    shot = tmp_path / "report.png"
    screenshot = _chromium(tmp_path, f"--screenshot={shot}", url)
    assert screenshot.returncode == 0 and shot.stat().st_size > 10_000, screenshot.stderr[-2000:]
    if os.environ.get("STALLSCOPE_SCREENSHOT_DIR"):  # to look at it afterwards
        keep = Path(os.environ["STALLSCOPE_SCREENSHOT_DIR"])
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, keep / "report.png")
        shutil.copy(page, keep / "report.html")


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

"""A recording shown in Jupyter (``_repr_html_``): the terminal summary as HTML, user text escaped, no plotly."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from stallscope.analysis import analyze
from stallscope.api import RunResult
from stallscope.inprocess import Recording
from stallscope.render.summary import summary_dict
from stallscope.session import Session

DATA = Path(__file__).parent.parent / "data" / "summaries"


def _recording(path: Path, **changes: object) -> Recording:
    session = dataclasses.replace(Session.load(path), **changes)
    analysis = analyze(session)
    rec = Recording()
    rec.result = RunResult(session.exit_code, session, path, analysis, summary_dict(session, analysis, path))
    return rec


def test_html_has_the_verdict_and_escapes_user_text(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "plotly", None)  # the core install: no plotly
    path = DATA / "image-pipeline" / "session.json"
    rec = _recording(path, notes=["<script>alert('x')</script> & [red]not markup[/red]"],
                     overrides={"pin_memory_device": "<b>cuda</b>"})
    html = rec._repr_html_()
    assert html.startswith("<pre") and html.rstrip().endswith("</pre>")
    assert "verdict: " in html and f">{rec.verdict}</span>" in html and rec.verdict != "unknown"
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; [red]not markup[/red]" in html
    assert "<script>" not in html and "<b>cuda</b>" not in html and "&lt;b&gt;cuda&lt;/b&gt;" in html
    assert rec.summary()["verdict"] == rec.verdict and rec.session_path == path


def test_before_its_block_ends_a_recording_says_so() -> None:
    rec = Recording(label="<mine>")
    assert rec._repr_html_() == "<pre>&lt;stallscope.Recording not concluded&gt;</pre>"
    try:
        rec.summary()
    except RuntimeError as exc:
        assert "has not run" in str(exc)
    else:
        raise AssertionError("a summary before the recording ran")

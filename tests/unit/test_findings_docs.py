"""docs/findings.md has a section for every recommendation and pitfall id the product can emit, and none for an
id it no longer emits: a user who reads an id in the terminal or the summary JSON finds it there."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from pathlib import Path

import stallscope

SOURCE = Path(stallscope.__file__).parent
FINDINGS = Path(__file__).resolve().parents[2] / "docs" / "findings.md"

#: The constructors a finding is built with in place, and the kind of finding each makes.
CONSTRUCTORS = {"Recommendation": "recommendation", "Pitfall": "pitfall"}


def emitted_ids(root: Path = SOURCE) -> dict[str, set[str]]:
    """Every id the product can emit, by kind: the catalogue of fixes (``analysis/fixes.py``, ``FIXES``) where there
    is one, and the string literals any module still builds a ``Recommendation`` or a ``Pitfall`` with (first
    argument or ``id=``), found by reading the source. The check that known ids are found says when this stops
    seeing them (a new catalogue, say a pitfalls one: read its ids here)."""
    found: dict[str, set[str]] = {kind: set() for kind in CONSTRUCTORS.values()}
    if importlib.util.find_spec("stallscope.analysis.fixes") is not None:
        found["recommendation"] |= set(importlib.import_module("stallscope.analysis.fixes").FIXES)
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            if name not in CONSTRUCTORS:
                continue
            given = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "id"), None)
            if isinstance(given, ast.Constant) and isinstance(given.value, str):
                found[CONSTRUCTORS[name]].add(given.value)
    return found


def documented_ids(text: str) -> set[str]:
    """The ids with a section: a heading that is the id alone, in backticks (its anchor, on GitHub and in the Sphinx
    build alike, is the id: ``findings.md#num-workers``)."""
    return set(re.findall(r"^#{2,4} `([a-z0-9-]+)`[ \t]*$", text, flags=re.MULTILINE))


def test_the_scan_finds_the_ids_the_analysis_builds():
    found = emitted_ids()
    assert {"num-workers", "cheaper-transforms", "no-predicted-gain", "distributed-sampler"} <= found["recommendation"]
    assert {"loader-stalled", "shm-exhausted", "worker-memory-growth"} <= found["pitfall"]


def test_every_emitted_id_has_a_section_in_the_findings_page():
    documented = documented_ids(FINDINGS.read_text(encoding="utf-8"))
    missing = {kind: sorted(ids - documented) for kind, ids in emitted_ids().items() if ids - documented}
    assert not missing, f"ids without a section (a '### `id`' heading) in {FINDINGS}: {missing}"


def test_the_findings_page_documents_no_id_the_product_no_longer_emits():
    emitted = set().union(*emitted_ids().values())
    stale = documented_ids(FINDINGS.read_text(encoding="utf-8")) - emitted
    assert not stale, f"sections for ids nothing emits any more: {sorted(stale)}"


def test_only_a_heading_that_is_the_id_counts_as_its_section():
    text = "### `num-workers`\n\nsee `prefetch` and ### `pin-memory` in text\n\n### Pinning (`pin-memory`)\n"
    assert documented_ids(text) == {"num-workers"}

"""The source carries the why of a constant, not its measurement diary: no dates, numbered runs or "the development VM"
in comments and docstrings (the figures live in docs/calibration.md), and every ``calibration: ID`` cited in the code
is a row of that table."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "stallscope"
CALIBRATION = ROOT / "docs" / "calibration.md"

_MONTH = (r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|June?|July?|Aug(?:ust)?|Sept?(?:ember)?"
          r"|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)")
_RUN = r"(?:[Rr]uns?|[Ss]essions?|[Pp]ass(?:es)?|[Rr]ounds?|[Aa]ttempts?|[Tt]ries|[Tt]ry)"
#: A number after "run" that counts something else: "run 2 workers", "run 10-25% below".
_COUNTED = (r"\.\d|(?:-\d+)?\s*(?:%|x\b|(?:workers?|threads?|steps?|process(?:es)?|times|batch(?:es)?|epochs?"
            r"|cores?|CPUs?|ms|s|us)\b)")
_LATER = r"(?:third|fourth|fifth|sixth|seventh|eighth|ninth|tenth)"
#: What a lab note looks like, by kind: the failure message names the kind. Month names are matched capitalised
#: (and May only with a year), so that "may 2 workers" is prose.
LAB_NOTE = {
    "date": re.compile(rf"\b(?:19|20)\d\d-[01]\d-[0-3]\d\b|\b{_MONTH}\.?\s+[0-3]?\d(?:st|nd|rd|th)?\b"
                       rf"|\b[0-3]?\d(?:st|nd|rd|th)?\s+(?:{_MONTH}|May)\b|\bMay\s+[0-3]?\d,?\s+(?:19|20)\d\d\b"
                       r"|(?i:\b(?:this|last|next) (?:week|month)\b|\b(?:yesterday|this morning)\b)"),
    "the machine it was measured on": re.compile(
        r"\b(?:development|dev)\s+(?:VM|machine|box|host)\b|\bthis\s+(?:VM|box)\b|\bour\s+(?:[\w-]+\s+)?(?:VM|box|machine)\b"
        r"|\b(?:\d+|two|four)-(?:core|CPU|vCPU)\s+(?:VM|box)\b", re.IGNORECASE),
    "numbered run": re.compile(rf"\b{_RUN}\s+#?\d+\b(?!{_COUNTED})|\b\d+(?:st|nd|rd|th)\s+{_RUN}\b"
                               rf"|\b(?:second|{_LATER})\s+[Ss]essions?\b|\b{_LATER}\s+{_RUN}\b", re.IGNORECASE),
}
#: A citation of a calibration row, which a comment may break across two lines.
CITATION = re.compile(r"\bcalibration:\s*([a-z0-9][a-z0-9-]*[a-z0-9])")


def _sources() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _comments(text: str) -> Iterator[tuple[int, str]]:
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string


def _docstrings(text: str) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                for offset, line in enumerate(first.value.value.splitlines()):
                    yield first.value.lineno + offset, line


def _blocks(path: Path) -> Iterator[tuple[int, str]]:
    """Each docstring, and each run of comments on consecutive lines, as one text (its first line's number)."""
    text = path.read_text(encoding="utf-8")
    block: list[str] = []
    start = last = 0
    for number, comment in _comments(text):
        if block and number != last + 1:
            yield start, "\n".join(block)
            block = []
        if not block:
            start = number
        block.append(comment.lstrip("#:").strip())
        last = number
    if block:
        yield start, "\n".join(block)
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node, clean=False)
            if docstring is not None:
                yield node.body[0].lineno, docstring


def _prose(path: Path) -> Iterator[tuple[int, str]]:
    text = path.read_text(encoding="utf-8")
    yield from _comments(text)
    yield from _docstrings(text)


def _lab_notes(line: str) -> list[str]:
    return [kind for kind, pattern in LAB_NOTE.items() if pattern.search(line)]


def test_patterns_catch_lab_notes_and_spare_plain_prose() -> None:
    for note in ("measured 2026-11-30", "on Nov 30 the tuner", "this week's figures", "run 3 measured 1.2x",
                 "the 12th run", "session 27: 315 against 316", "sessions 17-20", "on the development VM",
                 "the 2-core dev VM", "on this VM", "our 2-core box", "the 3rd run", "rounds 4-6", "December 4",
                 "4 Dec", "May 3, 2026", "the third run"):
        assert _lab_notes(note), note
    for prose in ("2000x1500 JPEGs", "a second run of the script", "runs once more", "the first pass over the data",
                  "2 workers on 2 cores", "in a VM or a container", "may 2 workers share a core", "600 rounds",
                  "the first round of batches", "its second run, with both runs' mean", "median of all runs 0.5",
                  "a session saved today", "clocks run 10-25% below", "trials run 2 workers"):
        assert not _lab_notes(prose), prose


def test_no_lab_notes_in_comments_or_docstrings() -> None:
    found = [f"{path.relative_to(ROOT)}:{number}: {', '.join(kinds)}: {line.strip()[:100]}"
             for path in _sources() for number, line in _prose(path) if (kinds := _lab_notes(line))]
    assert not found, ("lab notes in src/ (move the figures to docs/calibration.md, keep one line of why and cite "
                       "its row as `calibration: ID`):\n" + "\n".join(found))


def _table_ids() -> list[str]:
    ids = []
    for line in CALIBRATION.read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells and cells[0] not in ("id", "") and not set(cells[0]) <= set("-: "):
            ids.append(cells[0].strip("`"))
    return ids


def test_calibration_table_ids_are_unique_and_sorted() -> None:
    ids = _table_ids()
    assert len(ids) == len(set(ids)), sorted({i for i in ids if ids.count(i) > 1})
    assert ids == sorted(ids), "keep docs/calibration.md's table sorted by id"


def test_every_cited_calibration_row_exists() -> None:
    ids = set(_table_ids())
    missing = [f"{path.relative_to(ROOT)}:{start + text.count(chr(10), 0, match.start())}: {match.group(1)}"
               for path in _sources() for start, text in _blocks(path)
               for match in CITATION.finditer(text) if match.group(1) not in ids]
    assert not missing, "cited in src/ but no row in docs/calibration.md:\n" + "\n".join(missing)

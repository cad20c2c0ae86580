"""The docs cover the real CLI: the reference is generated from the parser every verb is added to, each verb has a
section in the guide, and the docs build with warnings as errors, every verb and option string in the built
reference."""

from __future__ import annotations

import argparse
import html
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stallscope.cli.main import VERBS, build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
#: Verbs whose guide is the getting-started page (the first run and the demo); every other verb has a section of
#: its own in verbs.md, headed by its name: "## tune: ...", or "## report, history and compare: ...".
GETTING_STARTED_VERBS = {"run", "demo"}


def _verb_parsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def _option_strings(parser: argparse.ArgumentParser) -> list[str]:
    """What a reader looks a verb's options up by: every option string (``-q``, ``--quiet``), and each positional's
    name; ``-h`` is argparse's own."""
    names = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        names.extend(action.option_strings or [action.metavar if isinstance(action.metavar, str) else action.dest])
    return names


def _headed_verbs(markdown: str) -> set[str]:
    """Verbs named at the start of a heading: ``## tune: try ...`` or ``## report, history and compare: ...``."""
    named: set[str] = set()
    for heading in re.findall(r"^#{2,3} (.+)$", markdown, flags=re.MULTILINE):
        lead = heading.split(":", 1)[0] if ":" in heading else ""
        named.update(word.strip(" `") for word in re.split(r",| and ", lead))
    return named


def test_the_cli_reference_is_generated_from_the_parser_the_cli_runs():
    text = (DOCS / "cli.md").read_text()
    directive = re.search(r"\.\. argparse::\n((?:   :\w+:.*\n)+)", text)
    assert directive, "docs/cli.md must hold a sphinx-argparse directive in an {eval-rst} block"
    options = dict(re.findall(r"   :(\w+): *(.*)", directive.group(1)))
    assert options.get("module") == "stallscope.cli.main" and options.get("func") == "build_parser", options
    module = importlib.import_module(options["module"])
    assert getattr(module, options["func"]) is build_parser  # the function the `stallscope` command parses with


def test_every_verb_of_the_parser_imports_and_is_in_the_reference():
    """build_parser stands in "(unavailable: ...)" for a verb whose module fails to import: right for a user, but
    the reference would document nothing for it (docs/conf.py fails the build on it too)."""
    parsers = _verb_parsers()
    assert set(parsers) == set(VERBS)
    for verb, parser in parsers.items():
        assert len(_option_strings(parser)) > 0 or parser.description, f"{verb}: no options and no description"
        assert not any(a.help and "(unavailable:" in a.help for a in parser._actions), verb


def test_every_verb_has_a_section_in_the_guide():
    """A verb added to the parser and to nothing else fails here: the reference lists it on its own, but a reader
    also needs what it is for and what it prints."""
    in_verbs_page = _headed_verbs((DOCS / "verbs.md").read_text())
    getting_started = (DOCS / "getting-started.md").read_text()
    for verb in _verb_parsers():
        if verb in GETTING_STARTED_VERBS:
            assert f"stallscope {verb}" in getting_started, f"getting-started.md does not show `stallscope {verb}`"
        else:
            assert verb in in_verbs_page, f"docs/verbs.md has no section headed '## {verb}: ...'"


def test_the_api_page_documents_the_library_twins():
    text = (DOCS / "api.md").read_text()
    for name in ("stallscope.run", "stallscope.record", "stallscope.analyze", "stallscope.plan",
                 "stallscope.data.FastImageFolder", "stallscope.data.PackedImageDataset"):
        assert re.search(rf"^\.\. auto\w+:: {re.escape(name)}$", text, flags=re.MULTILINE), name


def test_the_toctree_names_every_page_of_the_docs():
    index = (DOCS / "index.md").read_text()
    listed = set(re.findall(r"^([a-z][a-z-]*)$", index, flags=re.MULTILINE))
    pages = {p.stem for p in DOCS.glob("*.md")} - {"index"}
    assert pages <= listed, f"pages missing from the toctree: {sorted(pages - listed)}"


@pytest.fixture(scope="module")
def built_docs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The docs built as CI builds them (``-W``: a warning fails), once for this module's tests."""
    out = tmp_path_factory.mktemp("docs-html")
    done = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                           "-d", str(out / ".doctrees"), str(DOCS), str(out)],
                          capture_output=True, text=True, timeout=280, cwd=ROOT)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return out


@pytest.mark.e2e
def test_the_docs_build_with_warnings_as_errors(built_docs: Path):
    for page in ("index", "getting-started", "reading-the-output", "cli", "api", "findings", "calibration"):
        assert (built_docs / f"{page}.html").is_file(), page


@pytest.mark.e2e
def test_every_verb_and_option_of_the_parser_is_in_the_built_reference(built_docs: Path):
    page = (built_docs / "cli.html").read_text()
    top = _option_strings(build_parser())
    starts = {verb: page.find(f'id="stallscope-{verb}"') for verb in _verb_parsers()}
    missing_verbs = [verb for verb, at in starts.items() if at < 0]
    assert not missing_verbs, f"verbs without a section in the built reference: {missing_verbs}"
    bounds = sorted(starts.values()) + [len(page)]
    for verb, parser in _verb_parsers().items():
        section = page[starts[verb]:bounds[bounds.index(starts[verb]) + 1]]
        shown = {name.strip() for kbd in re.findall(r"<kbd>(.*?)</kbd>", section) for name in
                 html.unescape(kbd).split(",")}
        absent = [name for name in _option_strings(parser) if name not in shown]
        assert not absent, f"stallscope {verb}: not in the built reference: {absent}"
    head = page[:min(starts.values())]
    assert all(f"<kbd>{name}</kbd>" in head for name in top), top

"""Sphinx configuration of stallscope's documentation (MyST Markdown, furo, sphinx-argparse, autodoc).

Build it as CI does, warnings as errors:
    .venv/bin/python -m sphinx -W --keep-going -b html docs build/docs
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from docutils import nodes

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))  # the package being documented, installed or not

import sphinxarg.ext  # noqa: E402

import stallscope  # noqa: E402 - after the path is set
from stallscope.cli.main import VERBS  # noqa: E402

# ``build_parser`` replaces a verb whose module cannot be imported by a stub that says "(unavailable: ...)", which
# is right for a user but would put an empty page in the reference without a warning: here it fails the build.
for _module in VERBS.values():
    importlib.import_module(_module)

project = "stallscope"
author = "the stallscope authors"
copyright = "the stallscope authors"  # noqa: A001 - Sphinx's name for it
version = release = stallscope.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinxarg.ext",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build"]
smartquotes = False  # "--" in a command line stays two hyphens

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3  # [text](page.md#a-heading) works for headings down to ###

# The public API's type hints are strings (``from __future__ import annotations``): shown as written.
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_member_order = "bysource"

html_theme = "furo"
html_title = f"stallscope {release}"
pygments_style = "sphinx"
pygments_dark_style = "monokai"

_render_list = sphinxarg.ext.render_list


def _render_help_text(texts: list, markdown_help: bool, settings: object = None) -> list:
    """sphinx-argparse reads a verb's description and epilog as reStructuredText, which folds the examples of
    ``--help`` (laid out by ``RawDescriptionHelpFormatter``) into one paragraph or a broken definition list. A
    text that has line breaks is shown as it is in the terminal instead."""
    if texts and all(isinstance(text, str) for text in texts) and any("\n" in text.strip() for text in texts):
        return [nodes.literal_block(text, text) for text in texts]
    return _render_list(texts, markdown_help, settings)


sphinxarg.ext.render_list = _render_help_text

"""Sphinx configuration of the spherepde documentation: ``make docs`` (or
``python -m sphinx -W -b html docs docs/_build/html``) builds it; the tests build it with warnings as errors.

The guides are the Markdown pages of this folder (MyST); the API reference (api.rst) is autodoc on the
package's docstrings, which are numpydoc-style (napoleon). Two conventions of our docstrings are not
reStructuredText and are handled here rather than rewritten in 1000 places: norms are written |x|
(reST would read a substitution), escaped outside inline literals by :func:`_escape_bars`.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import spherepde  # noqa: E402

project = "spherepde"
author = "The spherepde developers"
copyright = "2026, " + author
release = version = spherepde.__version__

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.mathjax", "sphinx.ext.viewcode",
              "myst_parser"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "notebooks", "examples", "api.md"]
myst_heading_anchors = 3

# numpydoc-style sections (Parameters, Returns, Notes); types stay text (shapes such as "(n, 3)" are not
# cross-references), attributes documented once (by autodoc, not a second time from "Attributes")
napoleon_numpy_docstring = True
napoleon_google_docstring = False
napoleon_use_param = False
napoleon_use_rtype = False
napoleon_use_ivar = True
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "show-inheritance": False}
autodoc_typehints = "signature"

html_theme = "alabaster"
html_title = f"spherepde {release}"

_LITERAL = re.compile(r"(``.*?``|`[^`]*`)")


def _escape_bars(app, what, name, obj, options, lines):
    """|x| in a docstring is a norm, not a reST substitution reference: escape the bars outside inline
    literals, literal blocks (the indented lines after a line ending in ``::``) and directives (``.. math::``
    with its continuation lines)."""
    block = None  # indentation of the line that opened the literal block we are in
    for i, line in enumerate(lines):
        indent = len(line) - len(line.lstrip())
        if block is not None:
            if not line.strip() or indent > block:
                continue
            block = None
        if line.lstrip().startswith(".. "):
            block = indent
            continue
        parts = _LITERAL.split(line)
        lines[i] = "".join(p if k % 2 else p.replace("|", r"\|") for k, p in enumerate(parts))
        if line.rstrip().endswith("::"):
            block = indent


# The validation studies' READMEs live beside their code (validation/<study>/README.md, where GitHub shows
# them); the HTML docs get one page per study that includes it (docs/studies/, written here, not
# committed), and the report's links to the READMEs are pointed at those pages when it is read.
STUDIES = sorted(p.parent.name for p in (ROOT / "validation").glob("*/README.md"))
_STUDY_DIR = Path(__file__).resolve().parent / "studies"
_STUDY_DIR.mkdir(exist_ok=True)
for _name in STUDIES:
    _page = (f"```{{include}} ../../validation/{_name}/README.md\n:relative-images:\n:relative-docs: ../\n```\n")
    _f = _STUDY_DIR / f"{_name}.md"
    if not _f.exists() or _f.read_text() != _page:
        _f.write_text(_page)
_README_LINK = re.compile(r"\]\(\.\./validation/([\w-]+)/README\.md\)")


def _study_links(app, docname, source):
    if docname == "validation":
        source[0] = _README_LINK.sub(lambda m: f"](studies/{m.group(1)}.md)", source[0])


def setup(app):
    app.connect("autodoc-process-docstring", _escape_bars)
    app.connect("source-read", _study_links)

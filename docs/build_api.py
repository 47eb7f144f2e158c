"""Generate docs/api.md from the package's docstrings (no Sphinx).

Usage: ``python docs/build_api.py [--check]`` (``--check`` exits 1 if api.md is out of date).

For each module listed in MODULES: its docstring, then every public name (``__all__``, else names not
starting with ``_`` defined in the module) with its signature and docstring; classes also list their
public methods and properties.
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import re
import sys
from pathlib import Path

MODULES = [
    "spherepde",
    "spherepde.solver",
    "spherepde.grids.healpix",
    "spherepde.grids.tensor",
    "spherepde.models.zero_temperature",
    "spherepde.models.attention",
    "spherepde.models.prescribed",
    "spherepde.exact",
    "spherepde.particles",
    "spherepde.spectral",
    "spherepde.diagnostics",
    "spherepde.wasserstein",
    "spherepde.sampling",
    "spherepde.config",
    "spherepde.io",
    "spherepde.runner",
    "spherepde.plotting",
    "spherepde.cli",
    "spherepde.progress",
]

OUT = Path(__file__).resolve().parent / "api.md"


_ROLE = re.compile(r":(?:func|class|meth|data|mod|attr|exc):`~?([^`]+)`")


def _plain(text: str) -> str:
    return _ROLE.sub(r"\1", text)


def _doc(obj) -> str:
    """The docstring, with Sphinx roles (``:func:`x```) written as plain ``x`` (the text is shown as is)."""
    d = inspect.getdoc(obj)
    return _ROLE.sub(r"\1", d.strip()) if d else "*(no docstring)*"


def _sig(obj) -> str:
    try:
        text = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return ""
    # a default that is a logger shows its current level, which depends on what ran before
    return re.sub(r"<Logger ([\w.]+) \(\w+\)>", r"<Logger \1>", text)


def _public_names(mod):
    names = getattr(mod, "__all__", None)
    if names is None:
        names = [n for n, v in vars(mod).items() if not n.startswith("_")
                 and getattr(v, "__module__", None) == mod.__name__ and (inspect.isclass(v) or inspect.isfunction(v))]
    return list(names)


def _fence(text: str) -> str:
    return "```text\n" + text + "\n```\n"


def document_class(cls, lines):
    lines.append(f"### class `{cls.__name__}{_sig(cls)}`\n")
    lines.append(_fence(_doc(cls)))
    for name, member in sorted(vars(cls).items()):
        if name.startswith("_"):
            continue
        if isinstance(member, property):
            first = (inspect.getdoc(member) or "").splitlines()
            lines.append(f"- property `{name}`: {_plain(first[0]) if first else ''}\n")
        elif isinstance(member, (classmethod, staticmethod)) or inspect.isfunction(member):
            fn = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
            lines.append(f"#### `{cls.__name__}.{name}{_sig(fn)}`\n")
            if inspect.getdoc(fn):
                lines.append(_fence(_doc(fn)))


def document_module(modname, lines) -> bool:
    try:
        mod = importlib.import_module(modname)
    except ImportError as exc:
        lines.append(f"## `{modname}`\n\n*(not importable here: {exc})*\n")
        return False
    lines.append(f"## `{modname}`\n")
    lines.append(_fence(_doc(mod)))
    for name in _public_names(mod):
        obj = getattr(mod, name, None)
        if obj is None:
            continue
        home = getattr(obj, "__module__", None)
        if (inspect.isclass(obj) or inspect.isfunction(obj)) and home and home != modname \
                and home.startswith("spherepde") and home in MODULES:
            first = (inspect.getdoc(obj) or "").strip().splitlines()
            lines.append(f"- `{name}`: {_plain(first[0]) if first else ''} (see `{home}`)\n")
            continue
        if inspect.isclass(obj):
            document_class(obj, lines)
        elif inspect.isfunction(obj) or inspect.isbuiltin(obj):
            lines.append(f"### `{name}{_sig(obj)}`\n")
            lines.append(_fence(_doc(obj)))
        elif inspect.ismodule(obj):
            continue
        else:
            # object addresses ("<function f at 0x7f...>") would make the file differ on every build
            text = re.sub(r"<(function|built-in function|class) ([\w.]+)( at 0x[0-9a-f]+)?>", r"\2", repr(obj))
            if len(text) > 200:
                text = text[:200] + " ..."
            lines.append(f"### `{name}` = `{text}`\n")
    return True


def build() -> str:
    lines = ["# API reference\n",
             "Generated from the docstrings by `python docs/build_api.py`; do not edit by hand.\n"]
    lines.append("Modules: " + ", ".join(f"`{m}`" for m in MODULES) + "\n")
    for m in MODULES:
        document_module(m, lines)
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if docs/api.md differs from the docstrings")
    args = p.parse_args(argv)
    text = build()
    if args.check:
        current = OUT.read_text() if OUT.exists() else ""
        if current != text:
            sys.stderr.write("docs/api.md is out of date: run python docs/build_api.py\n")
            return 1
        return 0
    OUT.write_text(text)
    sys.stderr.write(f"wrote {OUT} ({len(text)} characters)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

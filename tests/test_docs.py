"""The documentation builds (Sphinx, warnings as errors) and documents the whole public API, so neither a
broken docstring nor a new name without documentation can slip in (issue #20 item 10)."""
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def html(tmp_path_factory):
    pytest.importorskip("sphinx")  # the test extra installs it; a bare install has no docs build
    out = tmp_path_factory.mktemp("html")
    before = (ROOT / "docs" / "validation.md").read_text()
    run = subprocess.run([sys.executable, "-m", "sphinx", "-W", "-q", "-b", "html", "-d", str(out / ".doctrees"),
                          str(ROOT / "docs"), str(out)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    assert (ROOT / "docs" / "validation.md").read_text() == before  # the report belongs to make validate
    return out


def _inventory(html) -> set:
    raw = (html / "objects.inv").read_bytes()
    body = zlib.decompress(raw.split(b"\n", 4)[4]).decode()
    return {line.split(" ", 1)[0] for line in body.splitlines()}


def test_every_public_name_is_in_the_api_reference(html):
    import spherepde

    names = _inventory(html)
    missing = []
    for name in spherepde.__all__:
        if name == "__version__":  # the docs' release number
            continue
        obj = getattr(spherepde, name)
        home = getattr(obj, "__module__", "spherepde")
        if not any(f"{mod}.{name}" in names for mod in (home, "spherepde")):
            missing.append(f"{home}.{name}")
    assert not missing, missing
    assert "spherepde.solver.Options" in names and "spherepde.sweeps.sweep" in names
    page = (html / "api.html").read_text()
    assert ":func:" not in page and ":class:" not in page  # roles are rendered as links, not shown raw
    assert 'href="#spherepde.solver.solve"' in page


def test_the_guides_and_every_study_have_pages(html):
    for page in ("index", "quickstart", "user_guide", "theory", "sweeps", "validation"):
        assert (html / f"{page}.html").is_file(), page
    studies = sorted(p.parent.name for p in (ROOT / "validation").glob("*/README.md"))
    assert len(studies) >= 10
    report = (html / "validation.html").read_text()
    for name in studies:
        assert (html / "studies" / f"{name}.html").is_file(), name
    linked = [name for name in studies if f'href="studies/{name}.html"' in report]
    assert len(linked) >= 10, linked  # the report's README links lead to the study pages
    assert (html / "_images" / "maps.png").is_file()  # a study's figures come along

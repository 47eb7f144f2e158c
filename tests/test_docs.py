"""The generated API reference matches the docstrings (so docs/api.md cannot silently go stale)."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _builder():
    spec = importlib.util.spec_from_file_location("build_api", ROOT / "docs" / "build_api.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_api_reference_is_current():
    b = _builder()
    text = b.build()
    assert "0x" not in "".join(line for line in text.splitlines() if line.startswith("### ")), \
        "object addresses in the reference would make it differ on every build"
    assert (ROOT / "docs" / "api.md").read_text() == text, "docs/api.md is stale: run python docs/build_api.py"


def test_builder_leaves_the_validation_report_alone(tmp_path, monkeypatch):
    """docs/validation.md belongs to `make validate` (validation/run_all.py), not to the API builder."""
    b = _builder()
    monkeypatch.setattr(b, "OUT", tmp_path / "api.md")
    before = (ROOT / "docs" / "validation.md").read_text()
    assert b.main([]) == 0
    assert (tmp_path / "api.md").read_text() == b.build()
    assert (ROOT / "docs" / "validation.md").read_text() == before

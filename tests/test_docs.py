"""docs/adding-a-method.md walks through FedProx's files: what it shows is what ships."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GUIDE = (ROOT / "docs" / "adding-a-method.md").read_text()


def block_after(caption: str, language: str) -> str:
    """The guide's first ``language`` code block after ``caption``."""
    found = re.search(re.escape(caption) + r".*?```" + language + r"\n(.*?)```", GUIDE, re.S)
    assert found, caption
    return found.group(1)


def test_the_guides_method_file_is_fedprox_as_shipped() -> None:
    assert block_after("`fltune/methods/fedprox.py`:", "python") == (ROOT / "fltune/methods/fedprox.py").read_text()


def test_the_guides_search_space_is_fedprox_as_shipped() -> None:
    assert block_after("`search_spaces/fedprox.yaml` says", "yaml") == (ROOT / "search_spaces/fedprox.yaml").read_text()


def test_the_guides_tests_are_in_fedprox_tests() -> None:
    """The guide shows two of the tests: each is in the test file, word for word."""
    shown = block_after("`tests/methods/test_fedprox.py` computes", "python")
    tests = re.findall(r"^def test_.*?(?=^def |\Z)", shown, re.S | re.M)
    shipped = (ROOT / "tests/methods/test_fedprox.py").read_text()
    assert len(tests) == 2 and all(test.strip() in shipped for test in tests)

"""The docs against the code: docs/adding-a-method.md shows FedProx's files as they ship, and docs/methods.md
writes out every registered method."""

from __future__ import annotations

import re
from pathlib import Path

from fltune.methods import METHODS

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


def test_every_registered_method_is_written_out_in_methods_md() -> None:
    """§2 of docs/methods.md gives each method's equation, defaults and [U] choices, under its `name`."""
    text = (ROOT / "docs" / "methods.md").read_text()
    methods = text[text.index("## 2. Methods"):text.index("## 3. ")]
    assert [name for name in sorted(METHODS) if f"`{name}`" not in methods] == []

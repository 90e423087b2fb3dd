"""``require`` (tests/conftest.py): an optional dependency skips only where its extra was never installed; where
the extra is installed, a missing or broken module fails the tests that need it instead of skipping them."""

from __future__ import annotations

import importlib

import conftest
import pytest
from conftest import require


def _broken_import(name: str):
    raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def test_an_installed_module_is_returned():
    assert require("transformers").__name__ == "transformers"


def test_a_broken_module_of_an_installed_extra_fails_instead_of_skipping(monkeypatch):
    monkeypatch.setattr(importlib, "import_module", _broken_import)
    with pytest.raises(ModuleNotFoundError, match="transformers"):
        require("transformers")


def test_a_module_missing_from_an_otherwise_installed_extra_fails(monkeypatch):
    monkeypatch.setattr(conftest, "_installed", lambda name: name == "accelerate")  # transformers failed to install
    monkeypatch.setattr(importlib, "import_module", _broken_import)
    with pytest.raises(ModuleNotFoundError, match="transformers"):
        require("transformers")


def test_an_extra_never_installed_skips(monkeypatch):
    monkeypatch.setattr(conftest, "_installed", lambda name: False)
    with pytest.raises(pytest.skip.Exception, match=r"'hf' extra is not installed"):
        require("transformers")


def test_a_module_outside_the_extra_is_refused():
    with pytest.raises(ValueError, match=r"'numpy' is not part of attnzoo's 'hf' extra \(its members: \["):
        require("numpy")


def test_the_suite_has_one_conftest_so_that_from_conftest_imports_this_one():
    from pathlib import Path

    tests = Path(__file__).resolve().parent
    assert sorted(p.relative_to(tests).as_posix() for p in tests.rglob("conftest.py")) == ["conftest.py"]

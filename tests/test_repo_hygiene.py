"""The repository tracks sources and documentation only: no archives, weights or build products, nothing large."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: suffixes of files that never belong in git (archives, weights, compiled objects)
FORBIDDEN = (
    ".whl",
    ".zip",
    ".tar",
    ".gz",
    ".tgz",
    ".bz2",
    ".xz",
    ".7z",
    ".rar",
    ".egg",
    ".so",
    ".o",
    ".pyc",
    ".safetensors",
    ".pt",
    ".pth",
    ".ckpt",
    ".bin",
    ".npy",
    ".npz",
    ".pkl",
    ".pickle",
)
#: the documentation's plots are the only binary files tracked, each well below this size
MAX_BYTES = 600 * 1024


def _tracked() -> list[Path]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.fail("the hygiene checks need a git checkout of the repository (CI runs on a clean clone)")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [ROOT / p for p in out.decode().split("\0") if p]


def test_no_archives_weights_or_build_products():
    bad = [p.relative_to(ROOT).as_posix() for p in _tracked() if p.name.lower().endswith(FORBIDDEN)]
    assert not bad, f"tracked files that belong in .gitignore, not git: {bad}"


def test_no_large_files_and_binaries_only_as_plots():
    files = [p for p in _tracked() if p.exists()]
    large = [(p.relative_to(ROOT).as_posix(), p.stat().st_size) for p in files if p.stat().st_size > MAX_BYTES]
    assert not large, f"tracked files over {MAX_BYTES // 1024} KiB: {large}"
    binary = [p.relative_to(ROOT).as_posix() for p in files if b"\0" in p.read_bytes()[:8192]]
    assert all(b.startswith("docs/") and b.endswith(".png") for b in binary), binary


def _check_structure(src: Path) -> subprocess.CompletedProcess:
    import sys

    script = ROOT / "scripts" / "check_structure.py"
    return subprocess.run([sys.executable, str(script), str(src)], capture_output=True, text=True)


def test_no_import_cycle_and_no_function_over_80_lines():
    r = _check_structure(ROOT / "src")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "import cycles (strongly connected components): 0" in r.stdout
    assert "functions over 80 lines: 0" in r.stdout


def test_structure_check_finds_a_cycle_and_a_long_function(tmp_path):
    pkg = tmp_path / "attnzoo"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from attnzoo import b\n")
    # an import inside a function counts; one under `if TYPE_CHECKING:` does not
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from attnzoo import c\n\n"
        "def f():\n    from attnzoo import a\n" + "    x = 1\n" * 80
    )
    (pkg / "c.py").write_text("from attnzoo import b\n")
    r = _check_structure(tmp_path)
    assert r.returncode == 1
    assert "import cycles (strongly connected components): 1" in r.stdout
    assert "attnzoo.a" in r.stdout and "attnzoo.b" in r.stdout and "attnzoo.c" not in r.stdout
    assert "functions over 80 lines: 1" in r.stdout and "b.py" in r.stdout


@pytest.mark.parametrize("module", ["attnzoo.registry", "attnzoo.models._registry"])
def test_a_registry_imports_only_the_standard_library(module):
    # registries are imported by every mechanism and model file: an import of the package here would be a cycle
    import ast
    import importlib
    import sys

    tree = ast.parse(Path(importlib.import_module(module).__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"relative import in {module}"
            imported.add(node.module)
    top = {name.split(".")[0] for name in imported}
    assert top <= set(sys.stdlib_module_names) | {"__future__"}, sorted(top - set(sys.stdlib_module_names))

"""What ``attnzoo.ops`` may depend on, and how its mechanisms name their backends.

Dependencies point one way (ops <- layers <- models <- ...): a module inside ``ops`` imports its own op's modules,
the shared ``ops/_*`` helpers and the leaf checks of :mod:`attnzoo._checks`, never the ``attnzoo.ops`` facade
(whose names shadow the sub-packages) nor anything above ``ops``. A backend of the same module is declared as the
function itself, so that go-to-definition leads from the mechanism to it; only an optional import is named.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
from pathlib import Path

import pytest
import torch

import attnzoo.ops
from attnzoo.ops._spec import Backend, Mechanism

OPS = Path(attnzoo.ops.__file__).parent
#: modules above ``ops`` that it may import: leaves that import nothing of attnzoo
ALLOWED_OUTSIDE = {"attnzoo._checks"}


def _module_name(path: Path) -> str:
    parts = ["attnzoo", "ops", *path.relative_to(OPS).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    """Whether ``name`` is a module of ``ops`` (a file or a package under it); no import happens."""
    if not name.startswith("attnzoo.ops."):
        return False
    where = OPS.joinpath(*name.split(".")[2:])
    return where.with_suffix(".py").is_file() or (where / "__init__.py").is_file()


def _facade_name(package: str, name: str) -> bool:
    return package == "attnzoo.ops" and name in attnzoo.ops.__all__


def _bad_imports(path: Path, source: str | None = None) -> list[str]:
    """The imports of ``path`` (or of ``source`` as if it were ``path``) that reach the facade or above ``ops``
    (function-level ones included)."""
    here = _module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    bad = []
    for node in ast.walk(ast.parse(path.read_text() if source is None else source)):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            # "from P import n" names the submodule P.n where there is one, otherwise P itself; the facade's own
            # names (tssa, csp, ...) shadow the sub-packages of the same name
            targets = [
                f"{base}.{a.name}" if _is_module(f"{base}.{a.name}") and not _facade_name(base, a.name) else base
                for a in node.names
            ]
        else:
            continue
        for t in targets:
            if not t.startswith("attnzoo"):
                continue
            if t in ("attnzoo", "attnzoo.ops") or not (t.startswith("attnzoo.ops.") or t in ALLOWED_OUTSIDE):
                bad.append(f"{path.relative_to(OPS.parent)}:{node.lineno}: {ast.unparse(node)}")
    return bad


def test_no_module_inside_ops_imports_the_facade_or_anything_above_ops():
    files = sorted(OPS.rglob("*.py"))
    assert len(files) > 50  # every op's modules are read, not an empty glob
    bad = [line for f in files for line in _bad_imports(f)]
    assert not bad, "imports of the attnzoo.ops facade or of modules above ops:\n" + "\n".join(bad)
    for name in ALLOWED_OUTSIDE:  # the modules above ops that it may import must stay leaves
        tree = ast.parse(Path(importlib.util.find_spec(name).origin).read_text())
        imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        assert not [m for m in imported if m.split(".")[0] == "attnzoo"], (name, imported)


@pytest.mark.parametrize(
    "statement",
    ["from attnzoo import ops", "from attnzoo.ops import tssa", "import attnzoo.ops", "from attnzoo.layers import x"],
)
def test_the_import_check_finds_a_facade_or_upward_import(statement):
    planted = OPS / "tssa" / "bench.py"
    assert _bad_imports(planted, f"def f():\n    {statement}\n"), statement  # a function-level one too
    ok = "from attnzoo.ops import _cpu_kernels\nfrom attnzoo._checks import check_bool\nfrom .naive import tssa_naive\n"
    assert not _bad_imports(planted, ok)


def _mechanisms() -> list[Mechanism]:
    found = []
    for info in pkgutil.iter_modules(attnzoo.ops.__path__, "attnzoo.ops."):
        if info.ispkg:
            mod = importlib.import_module(info.name)
            found += [v for v in vars(mod).values() if isinstance(v, Mechanism)]
    return found


def test_backends_are_declared_as_functions():
    mechanisms = _mechanisms()
    assert {m.op for m in mechanisms} >= {"tssa", "fastmax", "csp", "cbsa", "mssa", "linear_attention"}
    named = [f"{m.op}.{n}" for m in mechanisms for n, b in m.backends.items() if isinstance(b.fn, str)]
    assert not named, f"backends named by string (declare the function itself): {named}"
    for m in mechanisms:
        for b in m.backends.values():
            assert b.load() is b.fn and b.attr == b.fn.__name__ and b.module == b.fn.__module__


def test_a_backend_named_by_module_is_imported_when_it_runs():
    b = Backend("attnzoo.ops.tssa.naive", "tssa_naive", kind="reference")
    from attnzoo.ops.tssa.naive import tssa_naive

    assert b.load() is tssa_naive and b.module == "attnzoo.ops.tssa.naive"
    with pytest.raises(ValueError, match=r"Backend\('attnzoo.ops.tssa.naive'\) names a module: give the function"):
        Backend("attnzoo.ops.tssa.naive")
    with pytest.raises(TypeError, match="Backend takes a function or a module name, got int 3"):
        Backend(3)


def _twice(x, toks=None):
    return 2 * x


def test_a_masked_call_is_told_by_the_mechanisms_mask_options():
    # the op hands its masks on under "toks": a backend that takes none is refused for such a call, never run
    from attnzoo.ops._dispatch import call_backend
    from attnzoo.ops._spec import Options, op_backends

    mech = Mechanism(
        op="toy",
        options=Options,
        backends=op_backends(_twice, _twice, plain=Backend(_twice, masks=False)),
        mask_options=("toks",),
        causal=False,
    )
    x = torch.ones(2)
    assert mech.masked({"toks": object()}) and not mech.masked({"toks": None, "attention_mask": object()})
    with pytest.raises(ValueError, match=r"backend='plain' of toy does not take attention_mask / cu_seqlens"):
        call_backend(mech, "plain", (x,), toks=object())
    assert torch.equal(call_backend(mech, "plain", (x,), toks=None), 2 * x)
    assert call_backend(mech, "auto", (x,), toks=object()).tolist() == [2.0, 2.0]


def test_op_backends_and_kernel_devices_follow_the_convention():
    from attnzoo.ops._spec import op_backends

    b = op_backends(_twice, _twice, cpu=Backend(_twice, kind="cpu"), gpu=Backend(_twice, kind="triton"))
    assert [(n, x.kind, x.devices) for n, x in b.items()] == [
        ("naive", "reference", ("any",)),
        ("torch", "torch", ("any",)),
        ("cpu", "cpu", ("cpu",)),
        ("gpu", "triton", ("cuda",)),
    ]
    assert Backend(_twice, kind="cpu", devices=("cpu", "meta")).devices == ("cpu", "meta")

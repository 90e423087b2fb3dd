"""Shared test setup: deterministic seeds, and uninitialised memory filled with NaN.

With deterministic algorithms on, PyTorch fills tensors from ``torch.empty`` (and friends) with NaN,
so a fast path that forgets to write part of its output fails the comparison instead of passing by luck.
"""

import dataclasses
import importlib
import importlib.metadata
import os
from types import ModuleType

import pytest
import torch
from packaging.requirements import Requirement

os.environ.setdefault("MPLBACKEND", "Agg")
# Triton reads the interpreter flag when a kernel is decorated, i.e. when attnzoo.ops.*.triton is first imported,
# which any test module may trigger (the CLI, selftest, the hf models): without a GPU, set it before all of them.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _deterministic_nan_filled():
    torch.manual_seed(0)
    prev = torch.are_deterministic_algorithms_enabled()
    prev_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    prev_fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    yield
    torch.use_deterministic_algorithms(prev, warn_only=prev_warn)
    torch.utils.deterministic.fill_uninitialized_memory = prev_fill


@pytest.fixture
def one_thread():
    """One torch thread for the test: small models on a shared 2-core machine run faster and reproducibly."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _extra_members(extra: str, project: str = "attnzoo") -> list[str]:
    """The distributions that ``pip install -e '.[extra]'`` installs for ``project`` (from its metadata)."""
    names = []
    for line in importlib.metadata.requires(project) or []:
        req = Requirement(line)
        if req.marker is not None and req.marker.evaluate({"extra": extra}):
            names.append(req.name)
    return names


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def require(module: str, extra: str = "hf") -> ModuleType:
    """Import the optional dependency ``module`` of attnzoo's ``extra`` for a test (at module level or inside one).

    Skips only where no distribution of ``extra`` is installed (the extra was never asked for). Where any is, the
    extra was installed (scripts/setup.sh always installs it), so a missing or broken ``module`` fails the test
    with its ImportError instead of silently skipping everything that needs it.
    """
    members = _extra_members(extra)
    if module not in members:
        raise ValueError(f"{module!r} is not part of attnzoo's {extra!r} extra (its members: {members})")
    if not any(_installed(name) for name in members):
        reason = f"attnzoo's {extra!r} extra is not installed (pip install -e '.[{extra}]')"
        pytest.skip(reason, allow_module_level=True)
    return importlib.import_module(module)


def patch_backend_function(monkeypatch, module: ModuleType, attr: str, replacement) -> None:
    """Replace the function ``module.attr`` for a test, also where a mechanism of ``module`` holds it as a backend
    (backends hold the function itself, so replacing the module's name alone would not reach them)."""
    from attnzoo.ops._spec import Mechanism

    original = getattr(module, attr)
    monkeypatch.setattr(module, attr, replacement)
    for mech in [v for v in vars(module).values() if isinstance(v, Mechanism)]:
        for name, backend in mech.backends.items():
            if backend.fn is original:
                monkeypatch.setitem(mech.backends, name, dataclasses.replace(backend, fn=replacement))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that reads the shared smoke run goes to one pytest-xdist worker (``--dist loadgroup`` in
    pyproject.toml), so the run (about two minutes on one thread) is made once per suite, not once per worker."""
    for item in items:
        if "smoke" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("smoke"))


@pytest.fixture(scope="session")
def smoke(tmp_path_factory):
    """One ``attnzoo reproduce`` smoke run (single torch thread, restored afterwards) shared by every test that reads
    a whole run. It lives here, not in a ``tests/reproduce/conftest.py``: a second module named ``conftest`` would
    shadow this one for the tests that import ``require`` from it."""
    from attnzoo.reproduce import main

    out = tmp_path_factory.mktemp("reproduce") / "smoke"
    threads = torch.get_num_threads()
    try:
        rc = main(["--budget", "smoke", "--out", str(out), "--seed", "0", "--no-progress", "--threads", "1"])
    finally:
        torch.set_num_threads(threads)
    assert rc == 0
    return out


def mask_backends(mechanism, *, reference: bool = True) -> list[str]:
    """The backends of ``mechanism`` that take ``attention_mask`` / ``cu_seqlens`` and run on CPU tensors, read from
    its spec (Triton kernels have their own tests under the interpreter); ``reference=False`` leaves the reference
    out (for tests comparing with it)."""
    return [
        n
        for n in mechanism.mask_backends()
        if mechanism.backends[n].kind != "triton" and (reference or n != mechanism.reference)
    ]


#: unit roundoff of the half-precision dtypes (8 and 11 significant bits)
UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def assert_half_close(out: torch.Tensor, ref: torch.Tensor) -> None:
    """A half-precision output against its float32 or float64 reference: within ``2 u max|ref|`` (``u``: the unit
    roundoff of ``out``'s dtype), a bound an output off by 2% exceeds.

    The ops' half-precision errors in tests/ops measured at most 1.01 u max|ref| in bfloat16 (softmax) and 1.25 u in
    float16 (MSSA) over seeds 0-5; a sum accumulated in half precision, or a wrong term, goes well past 2 u.
    """
    bound = 2 * UNIT_ROUNDOFF[out.dtype] * ref.abs().max().item()
    err = (out.double() - ref.double()).abs().max().item()
    assert err <= bound, f"{out.dtype} error {err:.3g} > 2 u max|ref| = {bound:.3g}"
    off = (0.98 * out.double() - ref.double()).abs().max().item()
    assert off > bound, f"the bound {bound:.3g} does not catch an output off by 2% (error {off:.3g})"

"""``attnzoo selftest`` and the Triton fallback of ``backend="auto"``, on a CPU-only machine.

No GPU here: the CUDA side is simulated. The ops' "auto" dispatch asks ``_triton_utils._triton_device``
whether a tensor is on a Triton device; patching it to say yes for CPU tensors sends "auto" to the Triton
entry points, which are patched to fail as a kernel that does not compile would. The selftest's CUDA plan
(its Triton rows) is run on CPU under ``TRITON_INTERPRET=1`` in a subprocess.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from conftest import patch_backend_function

import attnzoo.ops  # noqa: F401  (binds the op subpackages in sys.modules)
from attnzoo import selftest
from attnzoo.cli import main as cli_main
from attnzoo.ops import _triton_utils
from attnzoo.ops._triton_utils import TritonFallbackWarning
from attnzoo.ops.fastmax import fastmax
from attnzoo.ops.softmax import softmax_attention
from attnzoo.ops.tssa import tssa

TSSA_MOD = sys.modules["attnzoo.ops.tssa"]  # attnzoo.ops.tssa is the function; the package is here
SOFTMAX_MOD = sys.modules["attnzoo.ops.softmax"]
LINEAR_MOD = sys.modules["attnzoo.ops.linear"]


@pytest.fixture
def one_thread():
    # the selftest's many tiny ops run fastest on one thread (and a busy 2-core CI box makes two threads spin)
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


def _rows(text: str) -> dict[tuple[str, str, str], list[str]]:
    """Table lines of the selftest output: (mechanism, backend, check) -> the remaining columns
    ``[cases, f32 err, tol, f64 err, tol, result, (message)]``."""
    names = sorted(
        {s.name for s in selftest.specs()} | {"fastmax", "softmax", "linear", "mssa", "tssa"}, key=len, reverse=True
    )
    out = {}
    for line in text.splitlines():
        name = next((n for n in names if line.startswith(n + " ")), None)
        if name is not None:
            cols = [c.strip() for c in line[len(name) :].split("  ") if c.strip()]
            out[(name, cols[0], cols[1])] = cols[2:]
    return out


def _status(cols: list[str]) -> str:
    return cols[5]


# ------------------------------------------------------------------------------------------ the command


@pytest.fixture
def exact_numerics(monkeypatch):
    """Every comparison of the selftest reports a zero error: the tests of its table, not of the ops' numbers
    (those are tests/contract's, through these same functions)."""
    for name in ("leak_error", "decode_error", "mask_error", "layer_decode_error"):
        monkeypatch.setattr(selftest, name, lambda *args, **kwargs: 0.0)
    monkeypatch.setattr(selftest, "forward_backward_errors", lambda *args, **kwargs: (0.0, 0.0))


def _expected_rows(device: torch.device) -> set[tuple[str, str, str]]:
    """(mechanism, backend, check) of every row the selftest prints on ``device``, from the registry."""
    from attnzoo.layers import attention_info, list_attentions

    rows = set()
    for case in selftest.specs():
        causal = any(c.get("causal") for c in case.configs(True))
        checks = ["forward", "backward"] + ["causal leak"] * causal + ["decode"] * (causal and case.step is not None)
        rows |= {(case.name, b, c) for b, _ in selftest.plan(case.mechanism, device) for c in checks}
    for name in list_attentions():
        info = attention_info(name)
        if getattr(info, "supports_masks", False):
            rows |= {(name, b, c) for b, _ in selftest.plan(info.mechanism, device) for c in ("mask", "varlen")}
    rows |= {(n, "layer (auto)", "decode") for n in list_attentions(causal=True) if attention_info(n).supports_step}
    return rows


def test_the_table_has_a_row_per_case_backend_and_check(capsys, one_thread, exact_numerics):
    assert cli_main(["selftest", "--device", "cpu", "--quick"]) == 0
    assert torch.get_num_threads() == 1  # the command restores the caller's thread count
    out = capsys.readouterr().out
    rows = _rows(out)
    assert set(rows) == _expected_rows(torch.device("cpu"))
    assert not [key for key in rows if key[1] in ("naive", "triton")]  # the reference; Triton rows are CUDA's
    skipped = {k for k, cols in rows.items() if _status(cols) == "skip"}
    assert all(_status(rows[k]) == "ok" and int(rows[k][0]) > 0 for k in set(rows) - skipped)
    # a backend that takes no masks has skipped mask rows, saying so; nothing else is skipped on this machine
    assert all(k[2] in ("mask", "varlen") and "does not take masks" in rows[k][-1] for k in skipped)
    assert f"selftest: {len(rows)} rows, 0 failed, {len(skipped)} skipped" in out


def _scaled(fn, factor):
    def wrong(*args, **kwargs):
        return fn(*args, **kwargs) * factor

    return wrong


def _leaky_linear_chunk(fn):
    # the future leaks in at 1e-3 of the mean over *all* tokens: small, but a causal op must not move at all
    def leaky(q, k, v, **kwargs):
        out = fn(q, k, v, **kwargs)
        return out + 1e-3 * v.mean(dim=2, keepdim=True) if kwargs.get("causal") else out

    return leaky


def _broken_tssa_step(fn):
    def wrong(w_t, temp, state, **kwargs):
        out, new = fn(w_t, temp, state, **kwargs)
        return out * 1.001, new

    return wrong


@pytest.mark.parametrize(
    "module,attr,breaker,failing,passing",
    [
        # a backend 0.1% off: forward and backward rows of that backend fail, other mechanisms stay ok
        (
            SOFTMAX_MOD,
            "softmax_attention_sdpa",
            lambda f: _scaled(f, 1.001),
            [("softmax", "torch", "forward"), ("softmax", "torch", "backward")],
            [("tssa", "torch", "forward"), ("tssa", "cpu", "backward")],
        ),
        # a causal path that reads later tokens: the leak row fails
        (
            LINEAR_MOD,
            "linear_attention_chunk",
            _leaky_linear_chunk,
            [("linear", "torch", "causal leak")],
            [("tssa", "torch", "causal leak")],
        ),
        # a recurrence that drifts from the parallel form: only the decode rows fail
        (
            TSSA_MOD,
            "tssa_step",
            _broken_tssa_step,
            [("tssa", "torch", "decode"), ("tssa", "cpu", "decode")],
            [("tssa", "torch", "forward"), ("tssa", "cpu", "causal leak")],
        ),
    ],
)
def test_a_broken_backend_fails_its_row(monkeypatch, capsys, one_thread, module, attr, breaker, failing, passing):
    patch_backend_function(monkeypatch, module, attr, breaker(getattr(module, attr)))
    only = sorted({m.split()[0] for m, _, _ in failing + passing})
    assert selftest.main(["--device", "cpu", "--quick", "--only", *only]) == 1
    out = capsys.readouterr().out
    rows = _rows(out)
    for key in failing:
        assert _status(rows[key]) == "FAIL", rows[key]
        assert f"{key[0]} / {key[1]} / {key[2]}" in out.splitlines()[-1]  # the summary names the row
    for key in passing:
        assert _status(rows[key]) == "ok", rows[key]


def test_an_exception_in_a_backend_is_a_failing_row_with_its_message(monkeypatch, capsys, one_thread):
    def boom(*args, **kwargs):
        raise RuntimeError("simulated kernel crash")

    patch_backend_function(monkeypatch, SOFTMAX_MOD, "softmax_attention_sdpa", boom)
    assert selftest.main(["--device", "cpu", "--quick", "--only", "softmax"]) == 1
    rows = _rows(capsys.readouterr().out)
    cols = rows[("softmax", "torch", "forward")]
    assert _status(cols) == "FAIL" and cols[1] == cols[3] == "error"
    assert cols[6] == "float32: RuntimeError: simulated kernel crash"


@pytest.mark.parametrize("cuda_build", [None, "12.4"])
def test_cuda_device_without_cuda_is_a_clear_error(monkeypatch, capsys, cuda_build):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", cuda_build)
    assert cli_main(["selftest", "--device", "cuda", "--quick"]) == 2
    err = capsys.readouterr().err
    assert "--device cuda: CUDA is not available" in err and "attnzoo selftest --device cpu" in err
    why = "no CUDA support" if cuda_build is None else "no CUDA GPU is visible"
    assert why in err
    assert "Traceback" not in err


def test_bad_arguments(capsys):
    assert selftest.main(["--only", "nosuch"]) == 2
    assert "--only ['nosuch'] unknown; valid:" in capsys.readouterr().err
    assert selftest.main(["--threads", "0"]) == 2
    assert "--threads must be a positive integer, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        selftest.main(["--device", "tpu"])


def test_cuda_plan_lists_the_triton_kernels_and_cpu_plan_the_cpu_kernels():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    by_name = {s.name: s for s in selftest.specs()}

    def planned(case: str, device: torch.device) -> list[str]:
        return [b for b, _ in selftest.plan(by_name[case].mechanism, device)]

    assert planned("tssa", cuda) == ["torch", "triton"]
    assert planned("tssa", cpu) == ["torch", "cpu"]
    for p in (1, 2):
        assert planned(f"fastmax p={p}", cuda) == ["torch", "torch_autograd", "explicit", "triton"]
        assert "triton" not in planned(f"fastmax p={p}", cpu)
        assert "cpu" in planned(f"fastmax p={p}", cpu)
    assert planned("csp", cpu) == ["torch", "cpu"] and planned("csp", cuda) == ["torch"]
    # every registered backend but the reference runs on CPU or on CUDA, as its declared devices say
    for case in by_name.values():
        mech = case.mechanism
        both = set(planned(case.name, cpu)) | set(planned(case.name, cuda))
        assert both == set(mech.backends) - {mech.reference}, case.name


def test_cpu_plan_skips_the_cpu_kernels_with_the_reason_when_they_do_not_build(monkeypatch):
    from attnzoo.ops import _cpu_kernels

    monkeypatch.setattr(_cpu_kernels, "cpu_kernels", lambda: None)
    monkeypatch.setattr(_cpu_kernels, "cpu_kernels_error", lambda: "simulated: no compiler")
    plan = dict(selftest.plan(TSSA_MOD.TSSA, torch.device("cpu")))
    assert plan == {"torch": None, "cpu": "CPU kernels unavailable: simulated: no compiler"}


def test_cuda_plan_triton_rows_run_under_the_interpreter():
    # The rows `--device cuda` adds (the Triton kernels), run end to end on CPU tensors by Triton's interpreter.
    # A subprocess: the interpreter must be on before triton and the kernels are first imported. Tiny shapes
    # and float32 only, to stay quick (the kernels' own tests cover the rest).
    script = textwrap.dedent(
        """
        import sys, torch
        torch.set_num_threads(1)
        import attnzoo.selftest as st
        from attnzoo.ops import _selftest_inputs
        cuda = torch.device("cuda")
        cuda_plan = st.plan
        st.plan = lambda mech, device: [x for x in cuda_plan(mech, cuda) if x[0] == "triton"]
        st.DTYPES = (torch.float32,)
        _selftest_inputs.SHAPES_QUICK[:] = [(1, 2, 5, 3)]
        st._decode_shapes = lambda quick: [(1, 2, 4, 3)]
        rows = st.run_selftest(torch.device("cpu"), quick=True, only=["tssa", "fastmax p=1"])
        # the Triton kernels take masks: their mask / varlen rows run (named backend) and pass
        masked = [(r.mechanism, r.backend, r.check) for r in rows if r.check in ("mask", "varlen")]
        assert masked == [(m, "triton", c) for m in ("fastmax", "tssa") for c in ("mask", "varlen")], masked
        got = [(r.mechanism, r.backend, r.check) for r in rows if r.check not in ("mask", "varlen")]
        checks = ("forward", "backward", "causal leak", "decode")
        want = [(m, "triton", c) for m in ("fastmax p=1", "tssa") for c in checks]
        assert got == want, got
        assert all(r.ok and r.cells["float32"].cases > 0 for r in rows)

        # "auto" on a (simulated) GPU with the real kernels: the first call runs behind the backward guard,
        # the next (its backward kernels verified) straight through the kernel's autograd function
        import warnings
        from attnzoo.ops import _cpu_kernels, _triton_utils
        from attnzoo.ops.tssa import tssa
        _triton_utils._triton_device = lambda x: True
        _cpu_kernels.cpu_kernels = lambda: None
        warnings.simplefilter("error")
        w = torch.randn(2, 3, 9, 5, dtype=torch.float64, requires_grad=True)
        temp = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64, requires_grad=True)
        bias = (0.1 * torch.randn(3, 12, 1, dtype=torch.float64)).requires_grad_()
        ref = torch.autograd.grad(tssa(w, temp, causal=True, bias=bias, backend="naive").pow(2).sum(), (w, temp, bias))
        for guarded in (True, False):
            out = tssa(w, temp, causal=True, bias=bias)
            assert (type(out.grad_fn).__name__ == "_GuardedBackwardBackward") == guarded, out.grad_fn
            for a, b in zip(torch.autograd.grad(out.pow(2).sum(), (w, temp, bias)), ref):
                torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
        assert _triton_utils.triton_failures() == {}
        """
    )
    env = dict(os.environ, TRITON_INTERPRET="1")
    res = subprocess.run(
        [sys.executable, "-c", script], check=False, env=env, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "FAIL" not in res.stdout and res.stdout.count(" ok") == 12  # 8 kernel rows + 4 mask / varlen rows


def test_every_registered_mechanism_has_a_selftest(capsys):
    rows = selftest._coverage_rows(selftest.specs(), lambda row: None)
    assert rows == []
    # a case list missing one (a mechanism's case that did not run) gives a failing row
    rows = selftest._coverage_rows([s for s in selftest.specs() if s.name != "csp"], lambda row: None)
    assert [(r.mechanism, r.ok) for r in rows] == [("csp", False)]
    rows = selftest._coverage_rows([s for s in selftest.specs() if s.name != "ema"], lambda row: None)
    assert [(r.mechanism, r.ok) for r in rows] == [("mega", False)]  # MEGA's cases include its EMA's


# ------------------------------------------------------------------------------ a mechanism registered at runtime

# A toy mechanism's folder, written by the test into a temporary package: each output token is the mean of the
# values up to it (causal) or of all of them. Its reference, a PyTorch path, a CUDA-only backend, its selftest case
# and its layer; nothing in attnzoo names it.
_TOY_FILES = {
    "__init__.py": """
        from dataclasses import dataclass

        import torch

        from attnzoo.ops._spec import Backend, Mechanism, Options


        @dataclass(frozen=True)
        class ToyOptions(Options):
            \"\"\"No options.\"\"\"


        def toy_cumsum(v, *, causal):
            if not causal:
                return v.mean(dim=2, keepdim=True).expand_as(v)
            return v.cumsum(dim=2) / torch.arange(1, v.shape[2] + 1, dtype=v.dtype, device=v.device).view(-1, 1)


        TOY = Mechanism(
            op="toy",
            options=ToyOptions,
            backends={
                "naive": Backend("attnzoo_toy.naive", "toy_naive", kind="reference"),
                "torch": Backend(__name__, "toy_cumsum"),
                "gpu": Backend(__name__, "toy_cumsum", devices=("cuda",)),
            },
            causal=True,
            checks="attnzoo_toy.checks",
        )


        def toy(v, *, causal=False, backend="torch"):
            return TOY.backends[backend].load()(v, causal=causal)
        """,
    "naive.py": """
        import torch


        def toy_naive(v, *, causal):
            n = v.shape[2]
            w = torch.ones(n, n, dtype=v.dtype, device=v.device)
            w = torch.tril(w) if causal else w
            return (w / w.sum(dim=-1, keepdim=True)) @ v
        """,
    "checks.py": """
        import torch

        from attnzoo.ops._selftest_inputs import causal_configs, randn
        from attnzoo.ops._spec import CheckCase
        from attnzoo_toy import toy


        def make(shape, cfg, gen):
            return {"v": randn(shape, gen)}


        def call(x, cfg, backend):
            return toy(x["v"], causal=cfg["causal"], backend=backend)


        def step(x, cfg):
            v = x["v"]
            total, outs = torch.zeros_like(v[:, :, :1]), []
            for t in range(v.shape[2]):
                total = total + v[:, :, t : t + 1]
                outs.append(total / (t + 1))
            return torch.cat(outs, dim=2)


        CASES = (CheckCase("toy", make, call, ("v",), causal_configs, lambda quick: [(2, 3, 7, 5)], {"v": 2}, step),)
        """,
    "layer.py": """
        from torch import nn

        from attnzoo.layers.base import Attention, register_attention
        from attnzoo_toy import TOY, toy


        @register_attention("toy")
        class ToyAttention(Attention):
            mechanism = TOY

            def __init__(self, dim, heads, *, causal=False, **options):
                super().__init__(dim, heads, causal=causal, **options)
                self.proj = nn.Linear(dim, dim)

            def forward(self, x):
                v = self.proj(x).unflatten(-1, (self.heads, self.head_dim)).transpose(1, 2)
                return toy(v, causal=self.causal).transpose(1, 2).flatten(2)
        """,
}


@pytest.fixture
def toy_mechanism(monkeypatch, tmp_path):
    """The toy package importable and its layer registered, unregistered afterwards."""
    from attnzoo.layers import list_attentions, unregister_attention

    pkg = tmp_path / "attnzoo_toy"
    pkg.mkdir()
    for name, text in _TOY_FILES.items():
        (pkg / name).write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    before = list_attentions()
    yield importlib.import_module("attnzoo_toy.layer")
    if "toy" in list_attentions():
        unregister_attention("toy")
    assert list_attentions() == before
    for name in [m for m in sys.modules if m == "attnzoo_toy" or m.startswith("attnzoo_toy.")]:
        del sys.modules[name]


def test_a_mechanism_registered_at_runtime_gets_its_rows(toy_mechanism, monkeypatch, capsys, one_thread):
    from attnzoo.layers import attention_info, list_attentions, unregister_attention

    assert "toy" in list_attentions() and attention_info("toy") is toy_mechanism.ToyAttention
    toy_mech = toy_mechanism.TOY
    assert "toy" in [s.name for s in selftest.specs()]
    assert [b for b, _ in selftest.plan(toy_mech, torch.device("cuda"))] == ["torch", "gpu"]
    assert selftest.main(["--device", "cpu", "--quick", "--only", "toy"]) == 0
    rows = _rows(capsys.readouterr().out)
    checks = ("forward", "backward", "causal leak", "decode")
    assert sorted(rows) == sorted(("toy", "torch", c) for c in checks)  # no reference row, no CUDA-only row
    assert all(_status(cols) == "ok" for cols in rows.values())
    assert selftest._coverage_rows(selftest.specs(), lambda row: None) == []

    # a wrong PyTorch path fails its rows
    monkeypatch.setattr(sys.modules["attnzoo_toy"], "toy_cumsum", _scaled(sys.modules["attnzoo_toy"].toy_cumsum, 1.01))
    assert selftest.main(["--device", "cpu", "--quick", "--only", "toy"]) == 1
    rows = _rows(capsys.readouterr().out)
    assert _status(rows[("toy", "torch", "forward")]) == "FAIL"

    # declaring no checks is a failing coverage row
    monkeypatch.setattr(toy_mechanism.ToyAttention, "mechanism", dataclasses.replace(toy_mech, checks=None))
    rows = selftest._coverage_rows(selftest.specs(), lambda row: None)
    assert [(r.mechanism, r.check, r.ok) for r in rows] == [("toy", "coverage", False)]

    unregister_attention("toy")  # what the fixture does afterwards: the toy does not outlive the test
    assert "toy" not in list_attentions() and "toy" not in [s.name for s in selftest.specs()]


# ------------------------------------------------------------------------------ Triton fallback of "auto"


@pytest.fixture
def fake_gpu(monkeypatch):
    """CPU tensors look like Triton-device tensors to the "auto" dispatch; no op has failed yet. The fused CPU
    kernels are hidden too: on a GPU, "auto" without Triton means the PyTorch path."""
    from attnzoo.ops import _cpu_kernels

    monkeypatch.setattr(_triton_utils, "_triton_device", lambda x: True)
    monkeypatch.setattr(_triton_utils, "_FAILED", {})
    monkeypatch.setattr(_triton_utils, "_BACKWARD_OK", set())
    monkeypatch.setattr(_cpu_kernels, "cpu_kernels", lambda: None)


def _failing_kernel(calls: list, exc: Exception):
    def kernel(*args, **kwargs):
        calls.append(1)
        raise exc

    return kernel


def _assert_falls_back_once(op_name, run_auto, run_torch, calls):
    with pytest.warns(TritonFallbackWarning, match=rf"Triton kernel of {op_name} failed \(RuntimeError: simulated"):
        out = run_auto()
    assert calls == [1]  # the kernel was tried
    torch.testing.assert_close(out, run_torch(), rtol=0, atol=0)  # the PyTorch path's result, bit for bit
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = run_auto()
    assert not [w for w in caught if issubclass(w.category, TritonFallbackWarning)]  # warned once only
    assert calls == [1]  # and not tried again: PyTorch for the rest of the process
    torch.testing.assert_close(again, out, rtol=0, atol=0)
    assert op_name in _triton_utils.triton_failures()


@pytest.mark.parametrize("causal", [False, True])
def test_tssa_auto_falls_back_to_torch_when_the_kernel_fails(monkeypatch, fake_gpu, causal):
    tssa_triton_mod = importlib.import_module("attnzoo.ops.tssa.triton")

    calls: list = []
    monkeypatch.setattr(tssa_triton_mod, "tssa_triton", _failing_kernel(calls, RuntimeError("simulated PTX error")))
    g = torch.Generator().manual_seed(0)
    w = torch.randn(2, 3, 9, 4, generator=g, requires_grad=True)
    temp = torch.rand(3, generator=g) + 0.5
    bias = 0.1 * torch.randn(3, 12, 1, generator=g) if causal else None
    _assert_falls_back_once(
        "tssa",
        lambda: tssa(w, temp, causal=causal, bias=bias),
        lambda: tssa(w, temp, causal=causal, bias=bias, backend="torch"),
        calls,
    )
    # the fallback result is differentiable like the PyTorch path
    (gw,) = torch.autograd.grad(tssa(w, temp, causal=causal, bias=bias).sum(), w)
    (gt,) = torch.autograd.grad(tssa(w, temp, causal=causal, bias=bias, backend="torch").sum(), w)
    torch.testing.assert_close(gw, gt, rtol=0, atol=0)
    # naming the backend explicitly never falls back: the kernel's error reaches the caller
    with pytest.raises(RuntimeError, match="simulated PTX error"):
        tssa(w, temp, causal=causal, bias=bias, backend="triton")


@pytest.mark.parametrize("p", [1, 2])
def test_fastmax_auto_falls_back_to_torch_when_the_kernel_fails(monkeypatch, fake_gpu, p):
    fastmax_triton_mod = importlib.import_module("attnzoo.ops.fastmax.triton")

    calls: list = []
    monkeypatch.setattr(
        fastmax_triton_mod, "fastmax_triton", _failing_kernel(calls, RuntimeError("simulated out of shared memory"))
    )
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 11, 4, generator=g) for _ in range(3))
    _assert_falls_back_once(
        "fastmax",
        lambda: fastmax(q, k, v, p=p, causal=True),
        lambda: fastmax(q, k, v, p=p, causal=True, backend="torch"),
        calls,
    )


def test_softmax_family_auto_falls_back_to_torch_when_the_kernel_fails(monkeypatch, fake_gpu):
    # no softmax-family op ships a Triton kernel yet; "auto" wraps whichever one its spec declares
    import dataclasses

    from attnzoo.ops._spec import Backend

    calls: list = []
    monkeypatch.setattr(
        SOFTMAX_MOD,
        "softmax_attention_triton",
        _failing_kernel(calls, RuntimeError("simulated compile error")),
        raising=False,
    )
    triton = Backend("attnzoo.ops.softmax", "softmax_attention_triton", kind="triton", available=lambda: True)
    spec = SOFTMAX_MOD.SOFTMAX
    monkeypatch.setattr(SOFTMAX_MOD, "SOFTMAX", dataclasses.replace(spec, backends={**spec.backends, "triton": triton}))
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 2, 7, 5, generator=g) for _ in range(3))
    _assert_falls_back_once(
        "softmax_attention",
        lambda: softmax_attention(q, k, v, causal=True),
        lambda: softmax_attention(q, k, v, causal=True, backend="torch"),
        calls,
    )


class _BackwardFails(torch.autograd.Function):
    """Identity whose backward raises, as a backward kernel that does not compile would."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("simulated backward kernel compile error")


@pytest.mark.parametrize("op", ["tssa", "fastmax"])
def test_auto_falls_back_when_the_backward_kernel_fails(monkeypatch, fake_gpu, op):
    mod = importlib.import_module(f"attnzoo.ops.{op}.triton")
    torch_path = {
        # the kernels' signatures; seg (the padding / packing segments) is None in these unmasked calls
        "tssa": lambda w, temp, causal, bias, seg=None: tssa(w, temp, causal=causal, bias=bias, backend="torch"),
        "fastmax": lambda qs, kh, v, p, causal, chunk_size, seg=None: sys.modules[
            "attnzoo.ops.fastmax"
        ].fastmax_factorized(qs, kh, v, p=p, causal=causal, chunk=chunk_size),
    }[op]
    calls: list = []

    def kernel(*args, **kwargs):  # forward fine (the PyTorch result), backward broken
        calls.append(1)
        return _BackwardFails.apply(torch_path(*args, **kwargs))

    monkeypatch.setattr(mod, f"{op}_triton", kernel)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 2, 9, 4, generator=g, dtype=torch.float64, requires_grad=True)
    temp = torch.tensor([0.7, 1.3], dtype=torch.float64, requires_grad=True)

    def run(backend):
        return (
            tssa(x, temp, causal=True, backend=backend)
            if op == "tssa"
            else fastmax(x, x, x, causal=True, backend=backend)
        )

    cot = torch.randn(2, 2, 9, 4, generator=g, dtype=torch.float64)
    ref_grads = torch.autograd.grad((run("torch") * cot).sum(), (x, temp), allow_unused=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = run("auto")  # the forward kernel runs and succeeds: no warning yet
        assert calls == [1] and not caught
        torch.testing.assert_close(out, run("torch"), rtol=0, atol=0)
    with pytest.warns(TritonFallbackWarning, match=rf"Triton kernel of {op} failed .*simulated backward kernel"):
        grads = torch.autograd.grad((out * cot).sum(), (x, temp), allow_unused=True)
    for got, ref in zip(grads, ref_grads, strict=True):  # the PyTorch path's gradients, through the whole graph
        if ref is None:
            assert got is None
        else:
            torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    run("auto")
    assert calls == [1]  # PyTorch from then on


def test_a_backward_kernel_that_ran_once_is_not_guarded_again(monkeypatch, fake_gpu):
    mod = importlib.import_module("attnzoo.ops.tssa.triton")
    monkeypatch.setattr(
        mod,
        "tssa_triton",
        lambda w, temp, causal, bias, seg=None: tssa(w, temp, causal=causal, bias=bias, backend="torch"),
    )
    w = torch.randn(1, 2, 6, 3, requires_grad=True)
    temp = torch.ones(2)
    first = tssa(w, temp)
    assert type(first.grad_fn).__name__ == "_GuardedBackwardBackward"
    first.sum().backward(retain_graph=True)
    g1 = w.grad.clone()
    first.sum().backward()  # a retained graph can be walked again through the guard
    torch.testing.assert_close(w.grad, 2 * g1, rtol=1e-6, atol=1e-6)
    second = tssa(w, temp)
    assert type(second.grad_fn).__name__ != "_GuardedBackwardBackward"  # (tssa, non-causal, float32) verified
    assert type(tssa(w, temp, causal=True).grad_fn).__name__ == "_GuardedBackwardBackward"  # other kernels: not yet
    assert _triton_utils.triton_failures() == {}


def test_working_kernel_is_used_and_out_of_memory_is_not_a_kernel_failure(monkeypatch, fake_gpu):
    tssa_triton_mod = importlib.import_module("attnzoo.ops.tssa.triton")

    w, temp = torch.randn(1, 2, 5, 3), torch.ones(2)
    marker = torch.full((1, 2, 5, 3), 7.0)
    monkeypatch.setattr(tssa_triton_mod, "tssa_triton", lambda *a, **k: marker)
    assert tssa(w, temp) is marker  # "auto" on a (simulated) GPU runs the kernel

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("simulated CUDA out of memory")

    monkeypatch.setattr(tssa_triton_mod, "tssa_triton", oom)
    with pytest.raises(torch.OutOfMemoryError):
        tssa(w, temp)
    assert "tssa" not in _triton_utils.triton_failures()  # a transient shortage does not disable the kernel


def test_without_a_gpu_auto_never_tries_triton(monkeypatch):
    tssa_triton_mod = importlib.import_module("attnzoo.ops.tssa.triton")

    calls: list = []
    monkeypatch.setattr(tssa_triton_mod, "tssa_triton", _failing_kernel(calls, RuntimeError("must not run")))
    w, temp = torch.randn(1, 2, 5, 3), torch.ones(2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TritonFallbackWarning)
        tssa(w, temp)
    assert calls == []


def test_selftest_reports_an_auto_fallback(monkeypatch, capsys, one_thread):
    monkeypatch.setattr(_triton_utils, "_FAILED", {"tssa": "CompilationError: simulated"})
    assert selftest.main(["--device", "cpu", "--quick", "--only", "csp"]) == 0
    out = capsys.readouterr().out
    note = "note: backend='auto' fell back to PyTorch for tssa: its Triton kernel failed (CompilationError: simulated)"
    assert note in out


# ------------------------------------------------------------------------------------------ masks and packed rows


def test_a_layer_that_ignores_the_mask_fails_its_rows(monkeypatch, capsys, one_thread):
    from attnzoo.layers.softmax import SoftmaxAttention

    forward = SoftmaxAttention.forward

    def unmasked(self, x, *, attention_mask=None, cu_seqlens=None):
        return forward(self, x)  # padding and other sequences mixed in: what the rows must catch

    monkeypatch.setattr(SoftmaxAttention, "forward", unmasked)
    assert cli_main(["selftest", "--device", "cpu", "--quick", "--only", "softmax", "tssa"]) == 1
    rows = _rows(capsys.readouterr().out)
    assert _status(rows[("softmax", "torch", "mask")]) == "FAIL"
    assert _status(rows[("softmax", "torch", "varlen")]) == "FAIL"
    assert _status(rows[("tssa", "cpu", "varlen")]) == "ok" and _status(rows[("tssa", "torch", "mask")]) == "ok"
    assert _status(rows[("softmax", "torch", "forward")]) == "ok"  # the op itself is fine

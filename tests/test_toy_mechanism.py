"""A mechanism added from outside the package: its folder (op and bench case) in a temporary package, its Mechanism
and layer declared here and registered at runtime. Without any other file edited, it is measured by the bench,
swapped into a pretrained-style model with its projections copied, captured, and listed in the README table."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass

import pytest
import torch
from conftest import require
from einops import rearrange
from torch import nn

import attnzoo
from attnzoo.analysis.capture import capture_layers, subspace_bases
from attnzoo.bench import cases
from attnzoo.layers import Attention, register_attention, unregister_attention
from attnzoo.layers._table import mechanisms_table_markdown
from attnzoo.ops._spec import Backend, BenchCase, Card, Mechanism, Options, Projections, Shape, option

FOLDER = {
    "__init__.py": """
        import torch.nn.functional as F


        def toy_attention(q, k, v, causal=False):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    """,
    "bench.py": """
        from pathlib import Path

        import torch

        from toyattn import toy_attention


        def toy(s, causal, device, dtype):
            q, k, v = (torch.randn(s.batch, s.heads, s.length, s.head_dim, device=device, dtype=dtype) for _ in "qkv")
            return [q, k, v], lambda: toy_attention(q, k, v, causal=causal), 4 * q.numel() * q.element_size()
    """,
    "selftest_cases.py": """
        from attnzoo.ops._selftest_inputs import causal_configs, qkv
        from attnzoo.ops._spec import CheckCase


        def call(x, cfg, backend):
            from toyattn import toy_attention

            return toy_attention(x["q"], x["k"], x["v"][..., :-1], causal=cfg["causal"])


        CASES = (CheckCase("toy", qkv, call, ("q", "k", "v"), causal_configs, lambda quick: [(2, 3, 7, 5)], {"q": 2}),)
    """,
}


#: the toy's C++ kernel, ``cpu.cpp`` in its folder: found by the convention of attnzoo.ops._cpu_kernels (every
#: ``<folder>/*.cpp`` under a kernel root), with no list to edit
TOY_KERNEL = """
#include <ATen/core/Tensor.h>
#include <torch/library.h>

at::Tensor toy_twice(const at::Tensor& x) { return x.mul(2); }

TORCH_LIBRARY_FRAGMENT(attnzoo_cpu, m) { m.def("toy_twice(Tensor x) -> Tensor"); }
TORCH_LIBRARY_IMPL(attnzoo_cpu, CPU, m) { m.impl("toy_twice", &toy_twice); }
"""


@dataclass(frozen=True)
class ToyOptions(Options):
    proj_bias: bool = option(True)


TOY = Mechanism(
    op="toy_attention",
    options=ToyOptions,
    backends={
        "naive": Backend("toyattn", "toy_attention", kind="reference"),
        "torch": Backend("toyattn", "toy_attention"),
    },
    causal=True,
    projections=Projections(q="to_q", k="to_k", v="to_v", out="to_out", follows=("proj_bias",)),
    bench=(BenchCase("toy", "toyattn.bench:toy", causal=True, module={}),),
    card=Card("a toy for the tests", "O(N²)", "O(N)", causal="masked"),
    checks="toyattn.selftest_cases",
    order=50,
)


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """Register the toy for one test; the registry and sys.path are restored afterwards."""
    pkg = tmp_path / "toyattn"
    pkg.mkdir()
    for name, text in FOLDER.items():
        (pkg / name).write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))

    @register_attention("toy")
    class ToyAttention(Attention):
        mechanism = TOY

        def __init__(self, dim: int, heads: int, *, causal: bool = False, **options) -> None:
            super().__init__(dim, heads, causal=causal, **options)
            self.to_q, self.to_k, self.to_v = (nn.Linear(dim, dim) for _ in "qkv")
            self.to_out = nn.Linear(dim, dim, bias=self.options.proj_bias)

        def _qkv(self, x):
            return tuple(
                rearrange(f(x), "b n (h p) -> b h n p", h=self.heads) for f in (self.to_q, self.to_k, self.to_v)
            )

        def forward(self, x):
            from toyattn import toy_attention

            q, k, v = self._qkv(x)
            self.record(q=q)
            return self.to_out(rearrange(toy_attention(q, k, v, causal=self.causal), "b h n p -> b n (h p)"))

    yield ToyAttention
    unregister_attention("toy")
    for mod in ("toyattn.bench", "toyattn.selftest_cases", "toyattn"):
        sys.modules.pop(mod, None)


def test_toy_is_listed_and_in_the_readme_table(toy):
    assert "toy" in attnzoo.list_attentions(causal=True)
    row = mechanisms_table_markdown().splitlines()[-1]
    assert row == "| `toy` | a toy for the tests | O(N²) | O(N) | yes (masked) | `attnzoo.ops.toy_attention` |"


def test_toy_is_a_bench_case(toy):
    assert cases.OP_CASES[-1] == "toy" and "toy" in cases.CAUSAL_OP_CASES and "toy" not in cases.DECODE_CASES
    from attnzoo.bench import _parse

    assert _parse(["--mechanisms", "softmax,toy", "--preset", "quick"]).mechanisms == ["softmax", "toy"]
    s = Shape(batch=1, heads=2, length=9, dim=8)
    for level in ("op", "module"):
        prep = cases.prepare("toy", s, causal=True, level=level, device=torch.device("cpu"), dtype=torch.float32)
        for t in prep.inputs:
            t.requires_grad_(True)
        out = prep.run()
        assert torch.autograd.grad(out.sum(), prep.inputs)[0].isfinite().all() and prep.bytes_moved > 0


def test_toy_swaps_into_gpt2_with_its_projections_copied(toy):
    transformers = require("transformers")
    cfg = transformers.GPT2Config(n_embd=16, n_layer=2, n_head=2, vocab_size=11, n_positions=16, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    attn = model.transformer.h[1].attn
    q, k, v = attn.c_attn.weight.detach().t().clone().chunk(3)
    qb, kb, vb = attn.c_attn.bias.detach().clone().chunk(3)
    o = attn.c_proj.weight.detach().t().clone()
    report = attnzoo.swap_attention(model, "toy")
    mixer = model.transformer.h[1].attn.mixer
    assert isinstance(mixer, toy)
    for lin, w, b in ((mixer.to_q, q, qb), (mixer.to_k, k, kb), (mixer.to_v, v, vb)):
        assert torch.equal(lin.weight, w) and torch.equal(lin.bias, b)
    assert torch.equal(mixer.to_out.weight, o)
    assert all(layer.reused == ["q", "k", "v", "o"] and not layer.not_reused for layer in report.layers)
    model(torch.randint(0, 11, (1, 7))).logits.sum().backward()
    llama = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, vocab_size=11
        )
    )
    # its queries and keys are the copied ones: Llama's rotary embedding rotates them, as in the original
    assert any("rotary position embeddings rotate" in n for n in attnzoo.swap_attention(llama, "toy").notes)


def test_toy_is_captured(toy):
    model = nn.Sequential(attnzoo.build_attention("toy", 8, 2), nn.Linear(8, 8))
    _, layers = capture_layers(model, torch.randn(2, 5, 8))
    assert [(lay.name, lay.mechanism) for lay in layers] == [("0", "toy")]
    assert layers[0].internals["q"].shape == (2, 2, 5, 4)
    assert subspace_bases(layers[0].module) is None  # separate q/k/v: no shared subspace projection


def test_a_shared_projection_is_the_subspace_bases_and_is_not_rotated(toy, monkeypatch):
    # the same layer declaring its `to_q` as one projection U shared as query, key and value (as TSSA's `qkv`)
    shared = dataclasses.replace(TOY, projections=Projections(shared="to_q", out="to_out"))
    monkeypatch.setattr(toy, "mechanism", shared)
    m = attnzoo.build_attention("toy", 8, 2)
    torch.testing.assert_close(subspace_bases(m), rearrange(m.to_q.weight.detach(), "(k p) d -> k d p", k=2))
    transformers = require("transformers")
    cfg = transformers.LlamaConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, vocab_size=11
    )
    report = attnzoo.swap_attention(transformers.LlamaForCausalLM(cfg), "toy")
    layer = report.layers[0]
    assert layer.reused == ["o"] and "shared as query, key and value" in layer.not_reused["q"]
    # fresh queries and keys: a rotation would not be the original's
    assert any("rotary position embeddings are not applied" in n for n in report.notes)


def test_the_registry_is_restored():
    assert "toy" not in attnzoo.list_attentions() and "toy" not in cases.ALL_OP_CASES


def test_toy_is_in_the_selftest(toy, capsys, one_thread):
    from attnzoo import selftest

    assert selftest.main(["--device", "cpu", "--quick", "--only", "toy"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("toy ")]
    assert sorted((r[1], r[2]) for r in rows) == [("torch", "backward"), ("torch", "causal"), ("torch", "forward")]
    assert all(r[-1] == "ok" for r in rows)


def test_toy_kernel_in_its_folder_is_found_and_compiled(toy, tmp_path, monkeypatch):
    from attnzoo.ops import _cpu_kernels

    (tmp_path / "toyattn" / "cpu.cpp").write_text(TOY_KERNEL)
    builtin = _cpu_kernels.kernel_sources()
    monkeypatch.setattr(_cpu_kernels, "KERNEL_ROOTS", [*_cpu_kernels.KERNEL_ROOTS, tmp_path])
    assert _cpu_kernels.kernel_sources() == [*builtin, tmp_path / "toyattn" / "cpu.cpp"]
    # compiled on its own in a fresh process (this one may hold the built-in library under the same namespace):
    # the toy's root alone, so the build costs one small source, not every kernel again
    code = textwrap.dedent(
        f"""
        from pathlib import Path

        import torch
        from attnzoo.ops import _cpu_kernels

        _cpu_kernels.KERNEL_ROOTS[:] = [Path({str(tmp_path)!r})]
        kernels = _cpu_kernels.required_cpu_kernels()
        x = torch.arange(5.0)
        assert torch.equal(kernels.toy_twice(x), 2 * x), kernels.toy_twice(x)
        print("toy kernel ok")
        """
    )
    env = {**os.environ, "ATTNZOO_CPU_KERNELS_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0 and done.stdout.strip() == "toy kernel ok", done.stderr[-3000:]

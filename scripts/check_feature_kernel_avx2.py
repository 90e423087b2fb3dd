"""Build the feature-map kernel (src/attnzoo/ops/_kernels/feature_attention.cpp) for AVX2 (-march=haswell) beside
the package's own build, check it against the references and time it against the PyTorch path (docs/performance.md,
2026-11-27).

The package compiles its kernels with -march=native, so on an AVX-512 machine the AVX2 code paths (kReadRows = 2,
the loops GCC vectorises without masked instructions) are neither tested nor timed; this script does both. Run it on
an x86-64 machine with a C++ compiler:

    python scripts/check_feature_kernel_avx2.py [BUILD_DIR]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.cpp_extension import load

from attnzoo.ops import _cpu_kernels
from attnzoo.ops._segment_ops import run_each_alone
from attnzoo.ops._varlen import segments
from attnzoo.ops.fastmax.naive import naive_from_hat
from attnzoo.ops.linear import linear_attention

SRC = Path(__file__).resolve().parents[1] / "src" / "attnzoo" / "ops" / "_kernels" / "feature_attention.cpp"


def build(where: Path) -> object:
    """The kernel as its own library (namespace attnzoo_avx2), compiled for AVX2."""
    src = where / "linear_avx2.cpp"
    text = (
        SRC.read_text()
        .replace("(attnzoo_cpu, m)", "(attnzoo_avx2, m)")
        .replace("(attnzoo_cpu, CPU, m)", "(attnzoo_avx2, CPU, m)")
    )
    src.write_text(text)
    flags = ["-O3", "-march=haswell", "-fopenmp"]
    load("attnzoo_avx2", [str(src)], extra_cflags=flags, extra_ldflags=["-fopenmp"], build_directory=str(where),
         is_python_module=False, verbose=False)  # fmt: skip
    return torch.ops.attnzoo_avx2


def check() -> float:
    """The worst float64 error (relative for gradients) over feature maps, causal modes and padded shapes."""
    from attnzoo.ops._kernels.feature_attention import feature_attention_cpu

    torch.manual_seed(0)
    worst = 0.0
    for fmap in ("elu", "relu", "fastmax1", "fastmax2"):
        for causal in (False, True):
            for b, h, n, d, r in ((2, 3, 37, 5, 3), (1, 2, 21, 8, 7), (1, 1, 9, 17, 5)):
                q, k = (0.5 * torch.randn(b, h, n, d, dtype=torch.float64) for _ in range(2))
                v = torch.randn(b, h, n, r, dtype=torch.float64)
                mask = torch.rand(b, n) > 0.3
                mask[:, 0] = True
                seg = segments(b, n, attention_mask=mask)
                ins = [t.clone().requires_grad_() for t in (q, k, v)]
                ref_ins = [t.clone().requires_grad_() for t in (q, k, v)]
                if fmap in ("elu", "relu"):
                    ref = linear_attention(
                        *ref_ins, causal=causal, feature_map=fmap, backend="naive", attention_mask=mask
                    )
                    eps = 1e-6
                else:
                    p = int(fmap[-1])

                    def alone(a, b_, c, p=p, causal=causal):
                        return naive_from_hat(a, b_, c, p=p, causal=causal)

                    ref, eps = run_each_alone(alone, seg, ref_ins, r), 0.0
                got = feature_attention_cpu(*ins, causal=causal, feature_map=fmap, eps=eps, ids=seg.ids)
                g = torch.randn_like(ref)
                errs = [(got - ref).abs().max().item()]
                for a, e in zip(torch.autograd.grad(got, ins, g), torch.autograd.grad(ref, ref_ins, g), strict=True):
                    errs.append(((a - e).abs().max() / (e.abs().max() + 1e-12)).item())
                worst = max(worst, *errs)
    return worst


def timing() -> None:
    """Forward+backward ms of the kernel and of the PyTorch path at the varlen sweep's shape (one thread)."""
    from attnzoo.ops._kernels.feature_attention import feature_attention_cpu

    torch.set_num_threads(1)
    lengths = [4096, 4096, 3415, 2731]
    h, d = 4, 16
    x = [torch.randn(1, h, sum(lengths), d, requires_grad=True) for _ in range(3)]

    def ms(fn) -> float:
        times = []
        for _ in range(4):
            t = time.perf_counter()
            fn().sum().backward()
            times.append(time.perf_counter() - t)
        return sorted(times[1:])[1] * 1e3

    for causal in (False, True):
        kernel = ms(lambda c=causal: feature_attention_cpu(*x, causal=c, feature_map="elu", eps=1e-6))
        torch_ = ms(lambda c=causal: linear_attention(*x, causal=c, backend="torch"))
        print(
            f"linear causal={causal} fwd+bwd: kernel {kernel:.0f} ms, PyTorch path {torch_:.0f} ms "
            f"({kernel / torch_:.2f}x)"
        )


def main() -> int:
    where = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="attnzoo-avx2-"))
    where.mkdir(parents=True, exist_ok=True)
    ops = build(where)

    class Kernels:  # the wrapper's calls go to the AVX2 build
        linear_forward = staticmethod(ops.linear_forward)
        linear_backward = staticmethod(ops.linear_backward)

    _cpu_kernels.required_cpu_kernels = lambda: Kernels
    worst = check()
    print(f"AVX2 build: worst float64 error against the references {worst:.1e}")
    timing()
    return 0 if worst < 1e-8 else 1


if __name__ == "__main__":
    raise SystemExit(main())

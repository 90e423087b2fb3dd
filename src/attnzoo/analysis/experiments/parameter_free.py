"""Parameter-free experiments on synthetic data: ``denoise`` (AoT Fig. 4 / Theorem 1), ``compress``
(CBSA Fig. 4) and ``rank-collapse`` (CSP Theorem 1 / Fig. 3, after Dong et al. 2021).

Each ``<name>(...)`` computes a JSON-ready result dict; ``plot_<name>(result)`` draws it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from attnzoo._checks import check_choice, check_positive_int

from .. import iterations as its
from .. import measures, synthetic
from ..plotting import PALETTE, new_figure

__all__ = [
    "denoise",
    "plot_denoise",
    "compress",
    "plot_compress",
    "rank_collapse",
    "plot_rank_collapse",
    "DEFAULT_SNAPSHOTS",
]

#: CBSA Fig. 4's panels: raw data, 1 iteration, 256, 512, 640, 768, 896 and 1024 iterations
DEFAULT_SNAPSHOTS = (0, 1, 256, 512, 640, 768, 896, 1024)


def _fit_growth(series: Sequence[float]) -> float:
    """Per-layer factor ``exp(slope)`` of a least-squares line through ``log(series)`` vs layer."""
    y = np.log(np.asarray(series, dtype=np.float64))
    if len(y) < 2 or not np.all(np.isfinite(y)):
        return float("nan")
    x = np.arange(len(y), dtype=np.float64)
    return float(np.exp(np.polyfit(x, y, 1)[0]))


# ---------------------------------------------------------------------------------------------
# denoise: AoT Fig. 4
# ---------------------------------------------------------------------------------------------
def denoise(
    *,
    k: int = 4,
    p: int = 32,
    n_per: int = 50,
    delta: float = 0.05,
    eta: float = 0.1,
    tau: float = 0.75,
    layers: int = 12,
    seed: int = 0,
) -> dict:
    """Iterate AoT eq 3 on Definition 1 data with ``φ`` = soft-max and Theorem 1's thresholded soft-max.

    Returns ``snr[variant]`` (per layer ``0..L``, mean over the ``K`` subspaces, eq 6),
    ``snr_per_cluster``, the fitted per-layer growth factor of each variant next to Theorem 1's
    ``1 + ητ``, and the theorem's conditions (Lemma 2/3 constants) evaluated at these settings.
    """
    for name, v in (("k", k), ("p", p), ("n_per", n_per), ("layers", layers)):
        check_positive_int(name, v)
    gen = torch.Generator().manual_seed(seed)
    z0, labels, u = synthetic.subspace_mixture(k, p, n_per, delta=delta, generator=gen)
    n = k * n_per
    snr, per_cluster, fitted = {}, {}, {}
    for phi in ("threshold", "softmax"):
        zs = its.aot_denoise(z0, u, layers, eta=eta, phi=phi, tau=tau)
        vals = torch.stack([measures.subspace_snr(z, u, labels) for z in zs])  # (L+1, K)
        per_cluster[phi] = vals
        snr[phi] = vals.mean(-1)
        fitted[phi] = _fit_growth(snr[phi].tolist())
    log_n = math.log(n)
    tau_hi = 1.0 / (1.0 + n * math.exp(-9.0 * p / 32.0))
    conditions = {
        "delta_max": math.sqrt(log_n / p) / 8.0,  # eq 11
        "p_min": 16.0 * (math.sqrt(log_n) + 1.0) ** 2,  # Lemma 2
        "tau_interval": [0.5, tau_hi],  # Theorem 1 / eq 29
    }
    conditions["satisfied"] = {
        "delta": delta <= conditions["delta_max"],
        "p": p >= conditions["p_min"],
        "tau": 0.5 < tau <= tau_hi,
    }
    return {
        "experiment": "denoise",
        "params": dict(k=k, p=p, n_per=n_per, delta=delta, eta=eta, tau=tau, layers=layers, seed=seed),
        "layers": list(range(layers + 1)),
        "snr": {phi: v.tolist() for phi, v in snr.items()},
        "snr_per_cluster": {phi: v.tolist() for phi, v in per_cluster.items()},
        "growth_factor_fit": fitted,
        "growth_factor_theory": 1.0 + eta * tau,
        "theorem_conditions": conditions,
    }


def plot_denoise(result: dict):
    """SNR per layer (log scale) for both ``φ``, with Theorem 1's ``(1+ητ)^l`` line."""
    fig = new_figure(6.4, 4.2)
    ax = fig.add_subplot()
    layers = np.asarray(result["layers"])
    theory = result["growth_factor_theory"]
    labels = {"threshold": "thresholded soft-max φ (Theorem 1)", "softmax": "soft-max φ"}
    for i, (phi, series) in enumerate(result["snr"].items()):
        fit = result["growth_factor_fit"][phi]
        ax.plot(layers, series, "o-", color=PALETTE[i], ms=4, label=f"{labels.get(phi, phi)}: fitted ×{fit:.3f}/layer")
    s0 = result["snr"]["threshold"][0]
    ax.plot(layers, s0 * theory**layers, "--", color="gray", label=f"Theorem 1: ×(1+ητ) = ×{theory:.3f}/layer")
    ax.set_yscale("log")
    ax.set_xlabel("layer l")
    ax.set_ylabel("SNR(Z_k^(l)), mean over k  (AoT eq 6)")
    prm = result["params"]
    ax.set_title(
        f"AoT eq 3 on Definition 1 data: K={prm['k']}, p={prm['p']}, N={prm['k'] * prm['n_per']}, "
        f"δ={prm['delta']}, η={prm['eta']}, τ={prm['tau']}",
        fontsize=9,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return fig


# ---------------------------------------------------------------------------------------------
# compress: CBSA Fig. 4
# ---------------------------------------------------------------------------------------------
def compress(
    *,
    classes: int = 10,
    n_per: int = 50,
    noise: float = 0.1,
    eps: float = 0.05,
    kappa: float = 0.15,
    iterations: int = 1024,
    snapshots: Sequence[int] = DEFAULT_SNAPSHOTS,
    seed: int = 0,
) -> dict:
    """Iterate CBSA's parameter-free linear-attention variant (eq 12, ``U = I``) per class on points
    from ``classes`` noisy lines in ``R³``.

    Returns ``coding_rate`` (``Σ_c R(Z_c)``, eq 1, per iteration ``0..iterations``),
    ``coding_rate_all`` (``R`` of all tokens together, at the snapshots), ``points`` at the snapshots and
    ``line_fit`` (mean ``σ₂/σ₁`` per class: 0 once every class lies on a line).
    """
    check_positive_int("iterations", iterations)
    snaps = sorted({int(s) for s in snapshots if 0 <= int(s) <= iterations} | {iterations})
    gen = torch.Generator().manual_seed(seed)
    z, labels, dirs = synthetic.noisy_lines(classes, n_per, noise=noise, generator=gen)
    eye = torch.eye(z.shape[-1], dtype=z.dtype)[None]  # parameter-free: one subspace = the ambient space
    rate, rate_all, points, line_fit = [], {}, {}, {}
    for it in range(iterations + 1):
        rate.append(float(measures.coding_rate(z, eps).sum()))
        if it in snaps:
            rate_all[str(it)] = float(measures.coding_rate(z.reshape(-1, z.shape[-1]), eps))
            points[str(it)] = np.round(z.reshape(-1, z.shape[-1]).numpy(), 5).tolist()
            s = torch.linalg.svdvals(z)
            line_fit[str(it)] = float((s[:, 1] / s[:, 0]).mean())
        if it < iterations:
            z = its.cbsa_linear_step(z, eye, eps=eps, kappa=kappa)
    return {
        "experiment": "compress",
        "params": dict(
            classes=classes,
            n_per=n_per,
            noise=noise,
            eps=eps,
            kappa=kappa,
            iterations=iterations,
            snapshots=snaps,
            seed=seed,
        ),
        "iterations": list(range(iterations + 1)),
        "coding_rate": rate,
        "coding_rate_all": rate_all,
        "line_fit": line_fit,
        "labels": labels.tolist(),
        "directions": dirs.tolist(),
        "points": points,
    }


def plot_compress(result: dict):
    """Scatter of the points at each snapshot (3-D) and the coding rate per iteration."""
    snaps = list(result["points"])
    labels = np.asarray(result["labels"])
    cols = min(4, len(snaps))
    rows = math.ceil(len(snaps) / cols) + 1
    fig = new_figure(3.0 * cols, 2.9 * rows)
    gs = fig.add_gridspec(rows, cols)
    lim = float(np.abs(np.asarray(result["points"][snaps[0]])).max())
    colors = np.asarray(PALETTE)[labels % len(PALETTE)]
    for i, it in enumerate(snaps):
        pts = np.asarray(result["points"][it])
        ax = fig.add_subplot(gs[i // cols, i % cols], projection="3d" if pts.shape[1] == 3 else None)
        if pts.shape[1] == 3:
            ax.scatter(pts[:, 0], pts[:, 1], pts[:, 2], c=colors, s=3, depthshade=False)
            ax.set_zlim(-lim, lim)
            ax.set_zticklabels([])
        else:
            ax.scatter(pts[:, 0], pts[:, 1], c=colors, s=3)
        ax.set_xlim(-lim, lim)
        ax.set_ylim(-lim, lim)
        ax.set_xticklabels([])
        ax.set_yticklabels([])
        title = "raw" if it == "0" else f"{it} iter" + ("s" if it != "1" else "")
        ax.set_title(f"{title}  (σ₂/σ₁={result['line_fit'][it]:.3f})", fontsize=8)
    ax = fig.add_subplot(gs[rows - 1, :])
    ax.plot(result["iterations"], result["coding_rate"], color=PALETTE[0], label="Σ_c R(Z_c)  (per class)")
    ax.set_xlabel("iteration")
    ax.set_ylabel("coding rate (CBSA eq 1)")
    prm = result["params"]
    ax.set_title(
        f"CBSA eq 12, parameter-free, per class: ε={prm['eps']}, κ={prm['kappa']}, noise={prm['noise']}", fontsize=9
    )
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return fig


# ---------------------------------------------------------------------------------------------
# rank-collapse: stacks of attention without skip connections
# ---------------------------------------------------------------------------------------------
def _reference_stacks(depth: int, dim: int, heads: int, gen: torch.Generator):
    """Explicit softmax-MHA (Dong et al.) and CSP layers with Gaussian weights of variance 1/dim."""

    def w():
        return torch.randn(dim, dim, generator=gen, dtype=torch.float64) / math.sqrt(dim)

    soft = []
    for _ in range(depth):
        wq, wk, wv = w(), w(), w()
        soft.append(lambda x, wq=wq, wk=wk, wv=wv: its.softmax_attention_reference(x, wq, wk, wv, heads))
    csp = []
    for _ in range(depth):
        wc = w()
        csp.append(lambda x, wc=wc: its.csp_reference(x, wc))
    return {"softmax_reference": soft, "csp_reference": csp}


def _module_stack(name: str, depth: int, dim: int, heads: int, seed: int, init: str):
    from attnzoo.layers import build_attention

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        mods = [build_attention(name, dim, heads).to(torch.float64).eval() for _ in range(depth)]
        if init == "gaussian":
            # Same random linear maps for every mechanism (as the references): N(0, 1/fan_in) weights
            # keep norms O(1) over depth, zero biases add no rank-1 drift 1bᵀ. Other parameters
            # (temperatures, step sizes) keep the mechanism's own initialisation.
            for m in mods:
                for lin in m.modules():
                    if isinstance(lin, torch.nn.Linear):
                        torch.nn.init.normal_(lin.weight, std=lin.in_features**-0.5)
                        if lin.bias is not None:
                            torch.nn.init.zeros_(lin.bias)
    return mods


def _token_mixers() -> list[str]:
    """The registered bidirectional token mixers; a layer that owns its residual update (MEGA) is a whole block."""
    from attnzoo.layers import attention_info, list_attentions

    return [n for n in list_attentions(causal=False) if not attention_info(n).owns_residual]


def rank_collapse(
    *,
    depth: int = 12,
    tokens: int = 32,
    dim: int = 32,
    heads: int = 4,
    batch: int = 2,
    mechanisms: Sequence[str] | None = None,
    init: str = "gaussian",
    seed: int = 0,
) -> dict:
    """Relative rank-collapse residual ``‖ε(X_l)‖_{1,∞}/‖X_l‖_{1,∞}`` (CSP eq 6) per depth ``l`` of
    stacks of attention layers *without* skip connections on Gaussian inputs ``(batch, tokens, dim)``.

    Always runs the explicit references ``softmax_reference`` (multi-head softmax attention, Dong et
    al.) and ``csp_reference`` (CSP eq 4); ``mechanisms`` (default: every registered non-causal
    mechanism) are built with :func:`attnzoo.build_attention`; ``init="gaussian"`` redraws their
    linear layers like the references' (``N(0, 1/fan_in)`` weights, zero biases), ``init="default"``
    keeps the modules' own initialisation. Also returns the normalised singular spectrum of each stack's output
    (CSP Fig. 3).
    """
    for name, v in (("depth", depth), ("tokens", tokens), ("dim", dim), ("heads", heads), ("batch", batch)):
        check_positive_int(name, v)
    if dim % heads:
        raise ValueError(f"dim={dim} must be divisible by heads={heads}")
    check_choice("init", init, ["gaussian", "default"])
    gen = torch.Generator().manual_seed(seed)
    x0 = torch.randn(batch, tokens, dim, generator=gen, dtype=torch.float64)
    stacks: dict[str, list] = dict(_reference_stacks(depth, dim, heads, gen))
    skipped: dict[str, str] = {}
    if mechanisms is None:
        try:
            mechanisms = _token_mixers()
        except Exception as e:  # noqa: BLE001 - the references still make the experiment meaningful
            skipped["*"] = f"could not list mechanisms: {e}"
            mechanisms = []
    for i, name in enumerate(mechanisms):
        try:
            stacks[name] = _module_stack(name, depth, dim, heads, seed + 1 + i, init)
        except Exception as e:  # noqa: BLE001 - report, do not abort the other stacks
            skipped[name] = f"{type(e).__name__}: {e}"
    residual, residual_abs, spectrum, norms = {}, {}, {}, {}
    for name, layers in stacks.items():
        x = x0
        rel, absr, nrm = [], [], []
        try:
            with torch.no_grad():
                for li in range(depth + 1):
                    if li > 0:
                        x = layers[li - 1](x)
                    rel.append(float(measures.rank_collapse_residual(x, relative=True).mean()))
                    absr.append(float(measures.rank_collapse_residual(x).mean()))
                    nrm.append(float(measures.norm_1_inf(x).mean()))
        except Exception as e:  # noqa: BLE001
            skipped[name] = f"{type(e).__name__}: {e}"
            continue
        residual[name], residual_abs[name], norms[name] = rel, absr, nrm
        spectrum[name] = measures.singular_spectrum(x[0]).tolist()
    return {
        "experiment": "rank-collapse",
        "params": dict(
            depth=depth,
            tokens=tokens,
            dim=dim,
            heads=heads,
            batch=batch,
            mechanisms=list(mechanisms),
            init=init,
            seed=seed,
        ),
        "depth": list(range(depth + 1)),
        "residual": residual,
        "residual_abs": residual_abs,
        "norm": norms,
        "spectrum": spectrum,
        "spectrum_input": measures.singular_spectrum(x0[0]).tolist(),
        "skipped": skipped,
    }


def plot_rank_collapse(result: dict):
    """Relative residual vs depth (log scale) and the output singular spectra."""
    fig = new_figure(11.0, 4.2)
    ax1, ax2 = fig.subplots(1, 2)
    depth = np.asarray(result["depth"])
    floor = 1e-17  # keep exact zeros visible on the log axis
    markers = "os^vD<>px*h"
    for i, (name, series) in enumerate(result["residual"].items()):
        style = "--" if name.endswith("_reference") else "-"
        ax1.plot(
            depth,
            np.maximum(series, floor),
            style,
            marker=markers[i % len(markers)],
            ms=4,
            mfc="none",
            color=PALETTE[i % len(PALETTE)],
            label=name,
        )
        ax2.plot(np.maximum(result["spectrum"][name], floor), style, color=PALETTE[i % len(PALETTE)], label=name)
    ax2.plot(result["spectrum_input"], ":", color="black", label="input X")
    ax1.set_yscale("log")
    ax1.set_xlabel("depth (layers, no skip connections)")
    ax1.set_ylabel("‖ε(X)‖₁,∞ / ‖X‖₁,∞   (CSP eq 6)")
    ax1.set_title("rank collapse of attention-only stacks", fontsize=10)
    ax1.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=7, ncol=2)
    ax2.set_yscale("log")
    ax2.set_xlabel("singular value index")
    ax2.set_ylabel("σ_i / σ_1 of the output (sample 0)")
    ax2.set_title(f"singular spectrum after {depth[-1]} layers (CSP Fig. 3)", fontsize=10)
    ax2.grid(True, which="both", alpha=0.3)
    ax2.legend(fontsize=7, ncol=2)
    return fig

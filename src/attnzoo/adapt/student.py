"""The student of an adaptation: a copy of a pretrained model with its attention swapped for a mechanism.

:func:`make_student` recognises the model's family (``transformers`` GPT-2, Llama-family decoders, ViT, or an
attnzoo model whose blocks hold attnzoo mixers), checks that the mechanism fits it (a causal form for decoders),
and returns the swapped copy with, per swapped layer, the module names in teacher and student and which of the
mechanism's parameters are new (the rest are the inherited projections).
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from attnzoo.layers.base import Attention, list_attentions
from attnzoo.layers.fastmax import FastmaxAttention
from attnzoo.models.blocks import check_mixer_form
from attnzoo.ops.cbsa import resolve_contraction

__all__ = ["AdaptLayer", "Student", "model_family", "make_student", "FAMILIES", "QKV_CBSA", "QKVCBSA"]

#: model families :func:`make_student` adapts
FAMILIES = ("gpt2", "llama", "vit", "attnzoo")

#: CBSA §4 / Fig. 9's adapted forms, which keep the teacher's three q/k/v projections (attnzoo's registered "cbsa"
#: has one shared projection U, eq 8): mechanism name -> :class:`QKVCBSA` variant
QKV_CBSA = {"cbsa-qkv": "cbsa", "agent-qkv": "agent"}


@dataclass
class AdaptLayer:
    """One swapped attention: ``name`` (the same module path in teacher and student), the student module's
    parameters that the mechanism adds (``new``) and those inherited from the teacher's projections
    (``inherited``), each a list of full parameter names in the student model."""

    name: str
    new: list[str] = field(default_factory=list)
    inherited: list[str] = field(default_factory=list)


@dataclass
class Student:
    """The swapped copy (``model``), its family, whether it is a causal decoder, and its :class:`AdaptLayer`\\ s."""

    model: nn.Module
    family: str
    causal: bool
    layers: list[AdaptLayer]
    report: str


class QKVCBSA(nn.Module):
    """CBSA with three inherited projections (CBSA §4, Fig. 9): eqs 5 and 8 with ``W_q, W_k, W_v`` for ``U_k``.

    Per head, with ``q, k, v`` ``(B, H, N, P)`` the pretrained projections of the tokens:

    1. initial representatives (agents) ``a = avgpool(q)`` ``(B, H, M, P)`` (eq 5's ``Q_ini``, as in Algorithm 1);
    2. extraction (eq 5): ``E = softmax_N(a k^T * scale)`` ``(B, H, M, N)``; the representatives are ``Q = Z A_k``,
       so their query/key/value projections are ``E q``, ``E k``, ``E v`` (``W Q = (W Z) A_k``);
    3. contraction (eq 8, variant "cbsa"): ``C = softmax_M((E q)(E k)^T * scale) (E v)``; variant "agent" skips it
       (``C = E v``: "CBSA without contraction", Agent Attention);
    4. broadcast: ``out = kappa * softmax_M(q a^T * scale) C``, then the inherited output projection.

    Deviations from the shared-projection layer, for adapting a softmax ViT: the broadcast is normalised over the
    representatives (Agent Attention's form, so the adapted layer's output has the teacher's scale) rather than
    reusing ``A_k`` column-normalised over tokens; eq 5's initial guess is not added back to the representatives
    (Agent Attention has none); ``kappa`` (eq 6, per head) starts at 1, the contraction's sign absorbed in it.
    ``kappa`` is the one new parameter; ``qkv`` ``(3 dim, dim)`` and ``proj`` are the teacher's.
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        *,
        variant: str = "cbsa",
        grid: tuple[int, int] | None = None,
        rep_grid: tuple[int, int] | None = None,
        num_reps: int | None = None,
        num_prefix_tokens: int = 0,
        scale: float | None = None,
        qkv_bias: bool = True,
        proj_bias: bool = True,
    ) -> None:
        super().__init__()
        if variant not in QKV_CBSA.values():
            raise ValueError(f"variant must be one of {sorted(QKV_CBSA.values())}, got {variant!r}")
        if not isinstance(heads, int) or heads < 1 or dim % heads:
            raise ValueError(f"dim={dim} must split into heads={heads} equal heads")
        self.dim, self.heads, self.head_dim, self.variant = dim, heads, dim // heads, variant
        # the variant's contraction as the CBSA op defines it: softmax (eq 8), or None for the agent form
        self.contraction = resolve_contraction(variant, None)
        self.grid, self.rep_grid, self.num_reps = grid, rep_grid, num_reps
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.scale = float(scale) if scale is not None else self.head_dim**-0.5
        self.causal = False
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim, bias=proj_bias)
        self.kappa = nn.Parameter(torch.ones(heads, 1, 1))

    def forward(
        self, x: torch.Tensor, *, attention_mask: torch.Tensor | None = None, cu_seqlens: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``x`` ``(B, N, dim)`` -> ``(B, N, dim)``; unpadded batches only (the adapted ViTs have none)."""
        from attnzoo.ops.cbsa import pool_reps

        if attention_mask is not None or cu_seqlens is not None:
            raise ValueError(f"{type(self).__name__} takes no attention_mask / cu_seqlens (whole images only)")
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must have shape (B, N, dim={self.dim}), got {tuple(x.shape)}")
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        a = pool_reps(
            q, num_reps=self.num_reps, grid=self.grid, rep_grid=self.rep_grid, num_prefix_tokens=self.num_prefix_tokens
        )
        extract = torch.softmax(a @ k.transpose(-1, -2) * self.scale, dim=-1)  # (B, H, M, N)
        reps_v = extract @ v
        if self.contraction is not None:
            reps_q, reps_k = extract @ q, extract @ k
            contracted = torch.softmax(reps_q @ reps_k.transpose(-1, -2) * self.scale, dim=-1) @ reps_v
        else:
            contracted = reps_v
        broadcast = torch.softmax(q @ a.transpose(-1, -2) * self.scale, dim=-1)  # (B, H, N, M)
        out = self.kappa * (broadcast @ contracted)
        return self.proj(out.transpose(1, 2).reshape(b, n, self.dim))

    def extra_repr(self) -> str:
        reps = f"grid={self.grid}, rep_grid={self.rep_grid}" if self.grid else f"num_reps={self.num_reps}"
        return f"dim={self.dim}, heads={self.heads}, variant={self.variant!r}, {reps}"


def _swap_qkv_cbsa(model: nn.Module, mechanism: str, options: dict[str, Any]) -> tuple[list[AdaptLayer], str]:
    """Swap every attnzoo softmax mixer of ``model`` for :class:`QKVCBSA`, in place, copying its q/k/v and output
    projections; anything else (a mixer without a fused q/k/v) is an error naming it."""
    allowed = {"rep_grid", "num_reps"}
    bad = sorted(set(options) - allowed)
    if bad:
        raise ValueError(f"{mechanism} takes only the options {sorted(allowed)}, got {bad}")
    layers, lines = [], []
    for name, old in _attnzoo_mixers(model):
        layout = getattr(getattr(old, "mechanism", None), "projections", None)
        qkv = getattr(old, layout.qkv, None) if layout is not None and layout.qkv else None
        proj = _output_projection(old)
        if not isinstance(qkv, nn.Linear) or not isinstance(proj, nn.Linear) or old.causal:
            raise ValueError(
                f"{mechanism} inherits a fused q/k/v and an output projection from a bidirectional mixer; "
                f"{name} ({type(old).__name__}) has not both"
            )
        grid = tuple(model.grid) if hasattr(model, "grid") else None
        new = QKVCBSA(
            old.dim,
            old.heads,
            variant=QKV_CBSA[mechanism],
            grid=grid,
            rep_grid=tuple(options["rep_grid"]) if options.get("rep_grid") is not None else None,
            num_reps=options.get("num_reps"),
            num_prefix_tokens=int(getattr(model, "num_prefix_tokens", 0)) if grid else 0,
            scale=getattr(old, "scale", None),
            qkv_bias=qkv.bias is not None,
            proj_bias=proj.bias is not None,
        ).to(device=qkv.weight.device, dtype=qkv.weight.dtype)
        with torch.no_grad():
            new.qkv.load_state_dict(qkv.state_dict())
            new.proj.load_state_dict(proj.state_dict())
        new.train(old.training)
        parent_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, attr, new)
        layers.append(
            AdaptLayer(
                name,
                new=[f"{name}.kappa"],
                inherited=[f"{name}.qkv.{p}" for p, _ in new.qkv.named_parameters()]
                + [f"{name}.proj.{p}" for p, _ in new.proj.named_parameters()],
            )
        )
        lines.append(f"  {name} ({type(old).__name__} -> {mechanism}): reused q, k, v, o; new kappa")
    return layers, f"swapped {len(layers)} attnzoo mixer(s) for {mechanism!r}\n" + "\n".join(lines)


def _hf_family(model: nn.Module) -> str | None:
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type is None:
        return None
    names = {type(m).__name__ for m in model.modules()}
    if any(n.startswith("GPT2Attention") for n in names):
        return "gpt2"
    if model_type.startswith("vit") and any(n.startswith("ViTAttention") for n in names):
        return "vit"
    for m in model.modules():
        if all(isinstance(getattr(m, n, None), nn.Linear) for n in ("q_proj", "k_proj", "v_proj", "o_proj")):
            if getattr(m, "is_causal", False):
                return "llama"
    return None


def _attnzoo_mixers(model: nn.Module) -> list[tuple[str, Attention]]:
    """The outermost attnzoo mixers of ``model`` (a mixer inside another, e.g. a hybrid's branch, is not listed)."""
    out: list[tuple[str, Attention]] = []
    for name, m in model.named_modules():
        if isinstance(m, Attention) and not any(name.startswith(p + ".") for p, _ in out):
            out.append((name, m))
    return out


def model_family(model: nn.Module) -> str:
    """``"gpt2"``, ``"llama"``, ``"vit"`` or ``"attnzoo"``; a clear error for anything else."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    family = _hf_family(model)
    if family is not None:
        return family
    if _attnzoo_mixers(model):
        return "attnzoo"
    config = getattr(model, "config", None)
    what = f"{type(model).__name__}" + (f" (model_type {config.model_type!r})" if hasattr(config, "model_type") else "")
    raise ValueError(
        f"cannot adapt {what}: adaptable models are transformers GPT-2, Llama-family decoders (q_proj/k_proj/"
        f"v_proj/o_proj, e.g. Llama, Mistral, Qwen2, SmolLM2) and ViT, and attnzoo models (blocks of attnzoo mixers)"
    )


def _check_mechanism(mechanism: str, causal: bool, family: str) -> None:
    if not isinstance(mechanism, str) or mechanism not in list_attentions():
        raise ValueError(f"unknown mechanism {mechanism!r}; valid mechanisms: {list_attentions()}")
    check_mixer_form(mechanism, causal, f"{family} model")


def _swap_attnzoo(model: nn.Module, mechanism: str, options: dict[str, Any]) -> tuple[list[AdaptLayer], str]:
    """Swap every attnzoo mixer of ``model`` for ``mechanism``, in place, reusing q/k/v/o where both have them."""
    from attnzoo.hf.swap import _build, _Projections

    mixers = _attnzoo_mixers(model)
    config = getattr(model, "config", None)
    lens = [getattr(config, k, None) for k in ("max_len", "block_size")]
    max_len = next((v for v in lens if isinstance(v, int)), None)
    layers, lines = [], []
    for i, (name, old) in enumerate(mixers):
        dim, heads, causal = old.dim, old.heads, old.causal
        ref = next(old.parameters(), None)
        if ref is None:
            ref = torch.zeros((), device=next(model.parameters()).device, dtype=next(model.parameters()).dtype)
        # the old mixer's spec says whether its q/k/v come from one fused (q | k | v) projection
        layout = getattr(getattr(old, "mechanism", None), "projections", None)
        fused = layout is not None and layout.qkv is not None
        qkv, proj = (getattr(old, layout.qkv, None) if fused else None), _output_projection(old)
        if fused and isinstance(qkv, nn.Linear) and qkv.weight.shape == (3 * dim, dim):
            w = qkv.weight.detach()
            b = qkv.bias.detach() if qkv.bias is not None else None
            parts = [(w[j * dim : (j + 1) * dim], None if b is None else b[j * dim : (j + 1) * dim]) for j in range(3)]
        else:
            # no q/k/v to inherit: the new mechanism's projections keep their own initialisation
            parts = None
        if isinstance(proj, nn.Linear) and proj.weight.shape == (dim, dim):
            o = (proj.weight.detach(), proj.bias.detach() if proj.bias is not None else None)
        else:
            o = (torch.empty(0, 0), None)
        scale = getattr(old, "scale", None)
        p = _Projections(
            *(parts or [(torch.empty(0, 0), None)] * 3),
            o,
            heads=heads,
            head_dim=dim // heads,
            kv_heads=heads,
            scale=float(scale) if isinstance(scale, (int, float)) else None,
            attn_dropout=0.0,
            proj_dropout=0.0,
        )
        context: dict[str, Any] = {"layer_index": i, "num_layers": len(mixers)}
        if causal and max_len:
            context["max_len"] = int(max_len)
        if not causal and hasattr(model, "grid"):  # attnzoo vision models: the patch grid behind any prefix tokens
            context["grid"] = tuple(model.grid)
            context["num_prefix_tokens"] = int(getattr(model, "num_prefix_tokens", 0))
        if parts is not None:
            mixer, info = _build(mechanism, p, dim, causal, options, context, ref)
        else:
            mixer, info = _fresh(mechanism, p, dim, causal, options, context, ref)
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        mixer.train(old.training)
        setattr(parent, attr, mixer)
        new = [f"{name}.{n}" for n in info.new]
        inherited = [f"{name}.{n}" for n, _ in mixer.named_parameters() if f"{name}.{n}" not in new]
        layers.append(AdaptLayer(name=name, new=new, inherited=inherited))
        lines.append(f"  {name} ({type(old).__name__} -> {mechanism}): reused {info.reused or 'nothing'}")
    return layers, f"swapped {len(layers)} attnzoo mixer(s) for {mechanism!r}\n" + "\n".join(lines)


def _output_projection(mixer: nn.Module) -> nn.Linear | None:
    """The mixer's output projection, as its spec declares it (CBSA's ``proj`` is its input subspace, not this)."""
    layout = getattr(getattr(mixer, "mechanism", None), "projections", None)
    m = getattr(mixer, layout.out, None) if layout is not None and layout.out else None
    return m if isinstance(m, nn.Linear) else None


def _fresh(mechanism, p, dim, causal, options, context, ref):
    """A mechanism with nothing to inherit but (maybe) the output projection (the source mixer had no q/k/v)."""
    from attnzoo.hf.swap import SwappedLayer, _copy
    from attnzoo.models.blocks import build_mixer

    with torch.device(ref.device):
        mixer = build_mixer(mechanism, dim, p.heads, causal=causal, options=dict(options), context=context)
    mixer.to(ref.dtype)
    info = SwappedLayer(name="", original="", causal=causal)
    out = _output_projection(mixer)
    reused = set()
    if out is not None and p.o[0].shape == out.weight.shape:
        _copy(out, *p.o)
        info.reused.append("o")
        reused.add("proj" if out is getattr(mixer, "proj", None) else "to_out")
    info.new = sorted(n for n, _ in mixer.named_parameters() if n.split(".")[0] not in reused)
    return mixer, info


def _warn_negative_fastmax_weights(student: nn.Module) -> None:
    """Warn when a Fastmax p = 1 layer's scale lets its weights ``1 + s`` go negative (``scale > 1/head_dim``).

    A model trained from scratch learns around it; a pretrained model's queries and keys do not: SmolLM2 swapped
    at the default ``head_dim**-0.5`` scored perplexity 2.18 M and did not train, at ``1/head_dim`` it adapted
    like the other mechanisms (docs/adapt.md)."""
    for name, m in student.named_modules():
        if isinstance(m, FastmaxAttention) and m.p == 1 and m.scale * m.head_dim > 1.0:
            warnings.warn(
                f"fastmax p=1 in {name}: scale={m.scale:.4g} > 1/head_dim = {1 / m.head_dim:.4g}, so the weights "
                "1 + s can be negative and row normalisers can cross zero; pretrained projections adapt poorly "
                f"at this scale (pass option scale={1 / m.head_dim:.6g}, e.g. --option scale={1 / m.head_dim:.6g})",
                stacklevel=3,
            )
            return


def make_student(model: nn.Module, mechanism: str, options: dict[str, Any] | None = None) -> Student:
    """A deep copy of ``model`` with every self-attention replaced by ``mechanism`` (``options`` passed to it),
    the pretrained projections reused where the mechanism has them; ``model`` itself is left unchanged.
    ``mechanism`` may also be ``"cbsa-qkv"`` / ``"agent-qkv"`` (:data:`QKV_CBSA`, attnzoo models only)."""
    family = model_family(model)
    options = dict(options or {})
    if mechanism in QKV_CBSA:
        if family != "attnzoo":
            raise ValueError(f"{mechanism} adapts attnzoo models (e.g. vit_s) only, got a {family} model")
        student = copy.deepcopy(model)
        layers, report = _swap_qkv_cbsa(student, mechanism, options)
        return Student(student, family, False, layers, report)
    if family == "attnzoo":
        mixers = _attnzoo_mixers(model)
        causal = any(m.causal for _, m in mixers)
    else:
        causal = family in ("gpt2", "llama")
    _check_mechanism(mechanism, causal, family)
    student = copy.deepcopy(model)
    if family == "attnzoo":
        layers, report = _swap_attnzoo(student, mechanism, options)
        _warn_negative_fastmax_weights(student)
        return Student(student, family, causal, layers, report)
    from attnzoo.hf.swap import swap_attention

    rep = swap_attention(student, mechanism, **options)
    _warn_negative_fastmax_weights(student)
    layers = []
    for info in rep.layers:
        module = student.get_submodule(info.name)
        new = {f"{info.name}.mixer.{n}" for n in info.new}
        names = [f"{info.name}.{n}" for n, _ in module.named_parameters()]
        layers.append(AdaptLayer(info.name, [n for n in names if n in new], [n for n in names if n not in new]))
    return Student(student, family, causal, layers, str(rep))

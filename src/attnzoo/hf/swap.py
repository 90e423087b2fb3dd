"""``swap_attention``: put an attnzoo mechanism in place of every self-attention of a ``transformers`` model.

Supported layouts (``transformers`` 5): GPT-2 (``GPT2Attention``: fused ``c_attn`` / ``c_proj`` ``Conv1D``),
Llama-family decoders (``q_proj``/``k_proj``/``v_proj``/``o_proj``, grouped key/value heads allowed; Llama,
Mistral, Qwen2, ...) and ViT (``ViTAttention``, the same four projections). Each attention module is replaced
by a :class:`SwappedAttention` holding the attnzoo mechanism, built causal for decoders (``is_causal``) and
bidirectional for encoders; the query/key/value/output weights are copied into the mechanism where it has the
matching projection, and the report says which it could not reuse.

Linearising a pretrained model this way is the usual first step before fine-tuning (the new mechanism's own
parameters, e.g. TSSA's temperatures, start from their initial values).
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from attnzoo.layers.base import Attention, attention_info, list_attentions
from attnzoo.models.blocks import build_mixer
from attnzoo.models.masking import mask_keywords, masked_step
from attnzoo.models.prefill import prefill
from attnzoo.ops._spec import Projections

__all__ = ["SwapReport", "SwappedLayer", "SwappedAttention", "swap_attention"]


@dataclass
class SwappedLayer:
    """What happened to one attention module: its name, the mechanism now in place, and which of the original
    ``q``/``k``/``v``/``o`` projections were copied (``reused``) or could not be (``not_reused``: name -> why);
    ``new`` lists the mechanism's parameters that start from their initial values; ``notes`` anything else."""

    name: str
    original: str
    causal: bool
    reused: list[str] = field(default_factory=list)
    not_reused: dict[str, str] = field(default_factory=dict)
    new: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class SwapReport:
    """Returned by :func:`swap_attention`: one :class:`SwappedLayer` per replaced module, plus ``skipped``
    (module name -> reason, e.g. cross-attention) and ``notes`` that hold for the whole model."""

    mechanism: str
    options: dict
    layers: list[SwappedLayer] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def swapped(self) -> list[str]:
        return [layer.name for layer in self.layers]

    def __str__(self) -> str:
        lines = [f"swap_attention({self.mechanism!r}, {self.options}): {len(self.layers)} module(s) replaced"]
        for layer in self.layers:
            kind = "causal" if layer.causal else "bidirectional"
            lines.append(f"  {layer.name} ({layer.original}, {kind}): reused {layer.reused or 'nothing'}")
            for what, why in layer.not_reused.items():
                lines.append(f"    not reused {what}: {why}")
            if layer.new:
                lines.append(f"    new parameters: {layer.new}")
        for name, why in self.skipped.items():
            lines.append(f"  skipped {name}: {why}")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------
# Reading the original projections as (out, in) Linear weights
# ---------------------------------------------------------------------------------------------------


@dataclass
class _Projections:
    q: tuple[torch.Tensor, torch.Tensor | None]
    k: tuple[torch.Tensor, torch.Tensor | None]
    v: tuple[torch.Tensor, torch.Tensor | None]
    o: tuple[torch.Tensor, torch.Tensor | None]
    heads: int
    head_dim: int
    kv_heads: int
    scale: float | None
    attn_dropout: float
    proj_dropout: float


def _linear(m: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    return m.weight.detach(), (m.bias.detach() if getattr(m, "bias", None) is not None else None)


def _kind(module: nn.Module) -> str | None:
    """``"gpt2"`` / ``"qkvo"`` for supported self-attention modules, ``None`` for anything else."""
    if all(hasattr(module, n) for n in ("c_attn", "c_proj", "split_size", "head_dim")):
        return "gpt2"
    if all(isinstance(getattr(module, n, None), nn.Linear) for n in ("q_proj", "k_proj", "v_proj", "o_proj")):
        if hasattr(module, "head_dim") and hasattr(module, "is_causal"):
            return "qkvo"
    return None


def _read(module: nn.Module, kind: str) -> _Projections:
    if kind == "gpt2":
        # Conv1D stores (in, out); the fused c_attn output is (q | k | v), each heads x head_dim
        w = module.c_attn.weight.detach().t()
        b = module.c_attn.bias.detach() if module.c_attn.bias is not None else None
        d = module.split_size
        qkv = [(w[i * d : (i + 1) * d], b[i * d : (i + 1) * d] if b is not None else None) for i in range(3)]
        o = (module.c_proj.weight.detach().t(), module.c_proj.bias.detach() if module.c_proj.bias is not None else None)
        heads = module.num_heads
        return _Projections(
            *qkv,
            o,
            heads=heads,
            head_dim=module.head_dim,
            kv_heads=heads,
            scale=float(module.scaling),
            attn_dropout=float(module.attn_dropout.p),
            proj_dropout=float(module.resid_dropout.p),
        )
    head_dim = int(module.head_dim)
    heads = module.q_proj.out_features // head_dim
    kv_heads = module.k_proj.out_features // head_dim
    drop = getattr(module, "attention_dropout", 0.0)
    return _Projections(
        _linear(module.q_proj),
        _linear(module.k_proj),
        _linear(module.v_proj),
        _linear(module.o_proj),
        heads=heads,
        head_dim=head_dim,
        kv_heads=kv_heads,
        scale=float(getattr(module, "scaling", head_dim**-0.5)),
        attn_dropout=float(drop if isinstance(drop, (int, float)) else 0.0),
        proj_dropout=0.0,
    )


def _expand_kv(p: tuple[torch.Tensor, torch.Tensor | None], kv_heads: int, heads: int, head_dim: int):
    """Grouped key/value heads repeated to one per query head (what ``repeat_kv`` does to the activations)."""
    if kv_heads == heads:
        return p
    rep = heads // kv_heads
    w, b = p
    w = w.reshape(kv_heads, head_dim, -1).repeat_interleave(rep, dim=0).reshape(heads * head_dim, -1)
    if b is not None:
        b = b.reshape(kv_heads, head_dim).repeat_interleave(rep, dim=0).reshape(-1)
    return w, b


# ---------------------------------------------------------------------------------------------------
# The replacement module
# ---------------------------------------------------------------------------------------------------


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x (B, H, T, P)`` with ``cos, sin (B, T, R)``, ``R <= P`` (the first ``R`` channels
    rotate, in ``transformers``' half-split layout: ``x cos + rotate_half(x) sin``)."""
    r = cos.shape[-1]
    cos, sin = cos.unsqueeze(1).to(x.dtype), sin.unsqueeze(1).to(x.dtype)
    xr, rest = x[..., :r], x[..., r:]
    half = torch.cat([-xr[..., r // 2 :], xr[..., : r // 2]], dim=-1)
    return torch.cat([xr * cos + half * sin, rest], dim=-1)


def _slice(rope: tuple[torch.Tensor, torch.Tensor] | None, i: int):
    return None if rope is None else (rope[0][:, i : i + 1], rope[1][:, i : i + 1])


def _key_mask(mask: Any, batch: int) -> torch.Tensor | None:
    """The ``(B, K)`` keep-mask (True = a real token) of the keys in ``transformers``' attention mask; ``None`` when
    nothing is padded.

    Decoder layers get a 4-D ``(B, 1, Q, K)`` mask: bool (True = attend, SDPA) or additive float (0 = attend,
    eager), or ``None`` when nothing is masked beyond causality. The last query row attends to every real key
    (the causal limit is the last key), so it is the padding mask of the keys.
    """
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor) or mask.ndim != 4 or mask.shape[0] not in (1, batch):
        raise ValueError(
            f"swapped attention got an attention mask it cannot read ({type(mask).__name__}"
            f"{tuple(mask.shape) if isinstance(mask, torch.Tensor) else ''}); it reads the 4-D (B, 1, Q, K) bool or "
            f"additive masks of the 'sdpa' and 'eager' attention implementations"
        )
    row = mask[:, 0, -1, :]
    keep = row if row.dtype == torch.bool else row > torch.finfo(row.dtype).min / 2
    keep = keep.expand(batch, -1)
    return None if bool(keep.all()) else keep


class SwappedAttention(nn.Module):
    """An attnzoo mechanism behind the call signature of the ``transformers`` attention it replaced.

    ``forward(hidden_states (B, N, dim), ...)`` returns ``(output (B, N, dim), None)`` like ``transformers``'
    attention modules (no attention weights). The padding in ``transformers``' ``attention_mask`` reaches the
    mechanism as its ``(B, N)`` ``attention_mask`` (an error for a mechanism whose layer cannot honour it, never
    ignored); in decoding a padding token leaves its row's state unchanged (:func:`attnzoo.models.masking.masked_step`).

    Decoding with ``transformers``' cache (``generate`` with ``use_cache=True``): the ``transformers`` cache
    holds zero-width key/value entries so its length (hence the positions) advances, and the mechanism's own
    recurrent state (``init_state``/``step``) is kept here per cache object. The prompt pass runs in parallel;
    where the mechanism has a prefill (:func:`attnzoo.models.prefill.prefill`: softmax, MSSA, Fastmax, TSSA,
    linear) that pass also gives the state, padded prompts included; otherwise the prompt is replayed through
    ``step`` on the first decoding step.
    """

    def __init__(self, mixer: Attention, layer_idx: int | None, original: str) -> None:
        super().__init__()
        self.mixer = mixer
        self.layer_idx = layer_idx
        self.original = original
        self.is_causal = mixer.causal
        # cache object -> {"state", "prefix"}: weak, so a finished generate() frees the state
        self._decoding: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    @property
    def applies_rotary(self) -> bool:
        """Whether rotary position embeddings passed by the model reach the mechanism (its copied queries and
        keys come from ``_qkv``)."""
        return _rotates(type(self.mixer))

    @contextlib.contextmanager
    def _rotary(self, rope: tuple[torch.Tensor, torch.Tensor] | None):
        """Rotate the mechanism's queries and keys by ``rope = (cos, sin)``, each ``(B, T, R)``, inside the block.

        Llama-family attention rotates q and k after the projections (RoFormer eq. 34); the q/k/v mechanisms
        (softmax, linear, Fastmax) compute all three in ``_qkv``, so the rotation wraps that method.
        """
        if rope is None or not self.applies_rotary:
            yield
            return
        cos, sin = rope
        # the grouped projection where the mixer has one (its _qkv repeats what it returns): rotating before the
        # repeat rotates each key/value head once
        name = "_qkv_grouped" if callable(getattr(type(self.mixer), "_qkv_grouped", None)) else "_qkv"
        mixer, method = self.mixer, getattr(type(self.mixer), name)

        def rotated_qkv(x: torch.Tensor):
            q, k, v = method(mixer, x)
            return _rotate(q, cos, sin), _rotate(k, cos, sin), v

        setattr(mixer, name, rotated_qkv)  # an instance attribute shadows the method for this call only
        try:
            yield
        finally:
            delattr(mixer, name)

    def forward(self, hidden_states: torch.Tensor, *_args: Any, past_key_values=None, cache=None, **kwargs: Any):
        rope = kwargs.get("position_embeddings")
        keep = _key_mask(kwargs.get("attention_mask"), hidden_states.shape[0])
        # transformers >= 5.24 hands the decoder layers' cache over as `cache`, earlier versions as `past_key_values`
        cache = cache if cache is not None else past_key_values
        if cache is None or not self.mixer.causal or not hasattr(cache, "update"):
            with self._rotary(rope):
                return self.mixer(hidden_states, **self._keywords(keep)), None
        if self.layer_idx is None:
            raise ValueError(f"{self.original} swapped without a layer index cannot use transformers' cache")
        b, t, _ = hidden_states.shape
        seen = cache.get_seq_length(self.layer_idx)
        # One-channel placeholder entries advance the cache's length (transformers derives positions and masks
        # from it) at B x T values per layer; the mechanism's real state lives in self._decoding.
        mark = hidden_states.new_zeros(b, 1, t, 1)
        cache.update(mark, mark, self.layer_idx)
        entry = self._decoding.get(cache)
        if entry is None:
            if seen != 0:
                raise ValueError(
                    f"this transformers cache already holds {seen} tokens this swapped attention did not see; "
                    f"start decoding from an empty cache"
                )
            if self._needs_mask(keep) and not getattr(self.mixer, "supports_masks", False):
                # the mechanism cannot take the mask in its parallel form: the padded prompt goes through its step,
                # which leaves a row's state unchanged at its padding
                state = self.mixer.init_state(b, device=mark.device, dtype=mark.dtype)
                entry = {"state": state, "pos": 0, "mask": None}
                self._decoding[cache] = entry
                return self._steps(entry, hidden_states, rope, keep, 0), None
            with self._rotary(rope):
                pre = prefill(self.mixer, hidden_states, keep)
            if pre is not None:  # the state after the prompt from the parallel pass: nothing to replay
                self._decoding[cache] = {"state": pre[1], "pos": t, "mask": keep}
                return pre[0], None
            # prompt: parallel forward; keep its inputs to build the recurrent state if decoding follows
            entry = {"state": None, "prefix": hidden_states.detach(), "rope": rope, "pos": t, "mask": keep}
            self._decoding[cache] = entry
            with self._rotary(rope):
                return self.mixer(hidden_states, **self._keywords(keep)), None
        if entry["pos"] != seen:
            raise ValueError(
                f"this transformers cache holds {seen} tokens this swapped attention did not see; start decoding "
                f"from an empty cache"
            )
        if entry["state"] is None:
            self._replay(entry, b, hidden_states)
        return self._steps(entry, hidden_states, rope, keep, seen), None

    def _steps(self, entry: dict, x: torch.Tensor, rope, keep: torch.Tensor | None, seen: int) -> torch.Tensor:
        """``x (B, T, dim)`` through the mechanism's ``step`` after ``seen`` tokens; ``keep (B, seen + T)``."""
        b, t, _ = x.shape
        hist = entry["mask"]  # (B, tokens fed) once a padding token was seen, else None
        if hist is not None or keep is not None:
            new = keep[:, seen:] if keep is not None else x.new_ones(b, t, dtype=torch.bool)
            hist = torch.cat([hist if hist is not None else new.new_ones(b, seen), new], dim=1)
        outs = []
        for i in range(t):
            with self._rotary(_slice(rope, i)):
                m = None if hist is None else hist[:, : seen + i + 1]
                y, entry["state"] = masked_step(self.mixer, x[:, i : i + 1], entry["state"], m)
            outs.append(y)
        entry["pos"] += t
        entry["mask"] = hist
        return outs[0] if t == 1 else torch.cat(outs, dim=1)  # a decoded token: no copy

    def _needs_mask(self, keep: torch.Tensor | None) -> bool:
        """Whether padding ``keep (B, N)`` must reach the parallel form: trailing padding in a causal mechanism
        needs no mask (no real token sees it)."""
        if keep is None:
            return False
        return not self.mixer.causal or bool((keep[:, 1:] & ~keep[:, :-1]).any())

    def _keywords(self, keep: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """The mask keywords of a parallel forward over ``keep (B, N)``; an error when the mechanism cannot honour
        a needed mask."""
        return mask_keywords(self.mixer, attention_mask=keep) if self._needs_mask(keep) else {}

    def _replay(self, entry: dict, b: int, ref: torch.Tensor) -> None:
        """The recurrent state after the prompt the parallel forward saw, fed through ``step`` token by token."""
        state = self.mixer.init_state(b, device=ref.device, dtype=ref.dtype)
        prefix, prefix_rope, mask = entry.pop("prefix"), entry.pop("rope"), entry["mask"]
        for i in range(prefix.shape[1]):
            with self._rotary(_slice(prefix_rope, i)):
                m = None if mask is None else mask[:, : i + 1]
                _, state = masked_step(self.mixer, prefix[:, i : i + 1], state, m)
        entry["state"] = state

    def extra_repr(self) -> str:
        return f"original={self.original}, layer_idx={self.layer_idx}"


# ---------------------------------------------------------------------------------------------------
# Building the mechanism with the original weights
# ---------------------------------------------------------------------------------------------------


def _layout(mechanism: str) -> Projections:
    """The projections ``mechanism``'s layer declares (its ``Mechanism.projections``): where the weights go."""
    spec = attention_info(mechanism).mechanism
    layout = spec.projections if spec is not None else None
    if layout is None:
        raise ValueError(
            f"mechanism {mechanism!r} declares no projections (Mechanism.projections in its ops/<op>/__init__.py): "
            f"swap_attention cannot tell where the pretrained query/key/value/output weights go"
        )
    return layout


def _rotates(cls: type[Attention]) -> bool:
    """Whether rotary embeddings can reach ``cls``'s queries and keys: it computes them in ``_qkv`` from query and
    key projections a swap copies (rotating fresh projections would only scramble them)."""
    layout = cls.mechanism.projections if cls.mechanism is not None else None
    has_qk = layout is not None and (layout.qkv is not None or (layout.q is not None and layout.k is not None))
    return has_qk and callable(getattr(cls, "_qkv", None))


def _copy(dst: nn.Linear, w: torch.Tensor, b: torch.Tensor | None) -> None:
    with torch.no_grad():
        dst.weight.copy_(w)
        if dst.bias is not None:
            if b is not None:
                dst.bias.copy_(b)
            else:
                dst.bias.zero_()  # the original had no bias: a zero bias computes the same function


def _copy_into(mixer: Attention, attr: str, w: torch.Tensor, b: torch.Tensor | None) -> str | None:
    """Copy ``(w, b)`` into the projection ``mixer.<attr>``; the reason when it cannot (``None``: copied)."""
    dst = getattr(mixer, attr, None)
    if not isinstance(dst, nn.Linear):
        return f"its `{attr}` is not a Linear projection in this configuration"
    if dst.weight.shape != w.shape:
        return f"its `{attr}` has shape {tuple(dst.weight.shape)}, the original {tuple(w.shape)}"
    _copy(dst, w, b)
    return None


def _swap_options(layout: Projections, accepted: list[str], proj: _Projections, options: dict) -> dict:
    """``options`` with the settings the layout follows taken from the original where the caller left them; the
    q/k/v bias only where q/k/v are copied (TSSA's or CBSA's fresh projection U keeps its paper's default)."""
    original = {
        "qkv_bias": proj.q[1] is not None,
        "v_bias": proj.v[1] is not None,
        "proj_bias": proj.o[1] is not None,
        "scale": proj.scale,
        "attn_dropout": proj.attn_dropout,
        "proj_dropout": proj.proj_dropout,
    }
    opts = dict(options)
    for name in layout.follows:
        if name in accepted and name not in opts:
            opts[name] = original[name]
    return opts


_ROLE = {"q": "query", "k": "key", "v": "value"}


def _copy_weights(
    mechanism: str, mixer: Attention, layout: Projections, proj: _Projections, info: SwappedLayer
) -> set[str]:
    """Copy the original's projections into ``mixer`` as ``layout`` says; the names of the projections copied."""
    # a mixer with grouped key/value heads (its kv_heads option) takes them as they are; others get them repeated
    grouped = getattr(mixer, "kv_heads", proj.heads) == proj.kv_heads
    k = proj.k if grouped else _expand_kv(proj.k, proj.kv_heads, proj.heads, proj.head_dim)
    v = proj.v if grouped else _expand_kv(proj.v, proj.kv_heads, proj.heads, proj.head_dim)
    roles = {"q": proj.q, "k": k, "v": v, "o": proj.o}
    if layout.qkv is not None:  # qkv = (q | k | v), the fused projection of standard attention
        w = torch.cat([proj.q[0], k[0], v[0]], dim=0)
        biases = [proj.q[1], k[1], v[1]]
        b = torch.cat([x if x is not None else torch.zeros_like(proj.q[0][:, 0]) for x in biases])
        roles["qkv"] = (w, b if any(x is not None for x in biases) else None)
    copied: set[str] = set()
    for role, attr in layout.copied().items():
        why = _copy_into(mixer, attr, *roles[role])
        done = ["q", "k", "v"] if role == "qkv" else [role]
        if why is None:
            info.reused += done
            copied.add(attr)
        else:
            info.not_reused.update({r: f"{mechanism}: {why}" for r in done})
    for role in ("q", "k", "v", "o"):
        if role in info.reused or role in info.not_reused:
            continue
        if role != "o" and layout.shared is not None:
            info.not_reused[role] = (
                f"{mechanism} has one projection U (its `{layout.shared}`) shared as query, key and value, "
                f"not separate q/k/v"
            )
        elif role == "o":
            info.not_reused["o"] = f"{mechanism} has no output projection of shape {tuple(proj.o[0].shape)}"
        else:
            info.not_reused[role] = f"{mechanism} has no {_ROLE[role]} projection"
    info.reused.sort(key=["q", "k", "v", "o"].index)
    return copied


def _build(
    mechanism: str, proj: _Projections, dim: int, causal: bool, options: dict, context: dict, ref: torch.Tensor
) -> tuple[Attention, SwappedLayer]:
    if proj.heads * proj.head_dim != dim:
        raise ValueError(
            f"attention with {proj.heads} heads of head_dim {proj.head_dim} != hidden size {dim}: attnzoo's "
            f"mechanisms split the hidden size into equal heads"
        )
    layout = _layout(mechanism)
    opts = _swap_options(layout, attention_info(mechanism).mechanism.options.names(), proj, options)
    with torch.device(ref.device):
        mixer = build_mixer(mechanism, dim, proj.heads, causal=causal, options=opts, context=context)
    mixer.to(ref.dtype)
    info = SwappedLayer(name="", original="", causal=causal)
    kv_heads = getattr(mixer, "kv_heads", proj.heads)
    if kv_heads not in (proj.heads, proj.kv_heads):
        raise ValueError(
            f"kv_heads={kv_heads}: the original has {proj.kv_heads} key/value heads for {proj.heads} query heads; "
            f"valid: kv_heads={proj.kv_heads} (grouped as in the original) or None (one per query head)"
        )
    if proj.kv_heads != proj.heads:
        kept = kv_heads == proj.kv_heads
        info.notes.append(
            f"{proj.kv_heads} key/value heads "
            + ("kept, each shared by its query heads" if kept else f"repeated to {proj.heads}")
        )
    copied = _copy_weights(mechanism, mixer, layout, proj, info)
    info.new = sorted(n for n, _ in mixer.named_parameters() if n.split(".")[0] not in copied)
    return mixer, info


def _whole_model_notes(report: SwapReport, mechanism: str, rope: bool) -> None:
    """The notes that hold for the whole swapped model: rotary embeddings, padding masks."""
    if rope and report.layers:
        if _rotates(attention_info(mechanism)):
            report.notes.append(
                "rotary position embeddings rotate the mechanism's queries and keys, as in the original"
            )
        else:
            report.notes.append(
                f"rotary position embeddings are not applied: {mechanism} has no separate queries and keys to "
                f"rotate; causal masking still orders the tokens"
            )
    if not getattr(attention_info(mechanism), "supports_masks", False):
        report.notes.append(
            f"{mechanism} does not honour padding masks yet: a padded batch raises without transformers' cache; "
            f"with it, a padded prompt goes through the mechanism's step where its decoding state has a fixed size"
        )


def swap_attention(model: nn.Module, mechanism: str, **options: Any) -> SwapReport:
    """Replace every self-attention module of a ``transformers`` GPT-2, Llama-family or ViT model, in place,
    by attnzoo's ``mechanism`` (built with ``options``, see ``attnzoo.attention_info(mechanism)``).

    Decoders get the causal form of the mechanism (it must have one: ``attnzoo.list_attentions(causal=True)``);
    ViT gets the bidirectional form, told about its CLS token (``num_prefix_tokens=1``) and patch grid where
    the mechanism takes them. The q/k/v/output weights are copied into the projections the mechanism declares
    (``Mechanism.projections``; grouped key/value heads are repeated to one per head); biases, the softmax scale
    and dropout rates follow the original unless ``options`` set them; Llama-family rotary embeddings rotate the
    queries and keys of the q/k/v mechanisms (softmax, linear, Fastmax). Returns a :class:`SwapReport`;
    ``print(report)`` lists what was reused and what starts fresh. Cross-attention modules are left alone (listed
    in ``report.skipped``).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module (a transformers model), got {type(model).__name__}")
    if not isinstance(mechanism, str) or mechanism not in list_attentions():
        raise ValueError(f"unknown mechanism {mechanism!r}; valid mechanisms: {list_attentions()}")
    if attention_info(mechanism).owns_residual:
        swappable = [n for n in list_attentions() if not attention_info(n).owns_residual]
        raise ValueError(
            f"mechanism {mechanism!r} computes its own normalisation and residual update (a whole block, not an "
            f"attention module) and cannot replace a transformers attention module; swappable: {swappable}"
        )
    _layout(mechanism)  # refused before anything is built
    config = getattr(model, "config", None)
    dim = getattr(config, "hidden_size", None)
    if not isinstance(dim, int):
        raise ValueError("model has no config.hidden_size: swap_attention needs a transformers model")
    targets = [(n, m, _kind(m)) for n, m in model.named_modules()]
    targets = [(n, m, k) for n, m, k in targets if k is not None]
    report = SwapReport(mechanism=mechanism, options=dict(options))
    if not targets:
        raise ValueError(
            f"found no supported self-attention module in {type(model).__name__}; supported: GPT-2 "
            f"(GPT2Attention), Llama-family (q_proj/k_proj/v_proj/o_proj) and ViT attention"
        )
    num_layers = int(getattr(config, "num_hidden_layers", len(targets)))
    image = getattr(config, "image_size", None)
    patch = getattr(config, "patch_size", None)
    rope = any(hasattr(m, "rotary_emb") for m in model.modules()) or hasattr(config, "rope_parameters")
    for i, (name, module, kind) in enumerate(targets):
        if kind == "gpt2" and getattr(module, "is_cross_attention", False):
            report.skipped[name] = "cross-attention (only self-attention is swapped)"
            continue
        causal = bool(getattr(module, "is_causal", False))
        layer_idx = getattr(module, "layer_idx", None)
        proj = _read(module, kind)
        context: dict[str, Any] = {
            "layer_index": layer_idx if layer_idx is not None else i,
            "num_layers": max(num_layers, i + 1),
        }
        if causal:
            max_pos = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
            if max_pos:
                context["max_len"] = int(max_pos)
        elif isinstance(image, int) and isinstance(patch, int) and image % patch == 0:
            context["grid"] = (image // patch, image // patch)
            context["num_prefix_tokens"] = 1  # ViT's CLS token leads the sequence
        ref = next(module.parameters())
        mixer, info = _build(mechanism, proj, dim, causal, options, context, ref)
        info.name, info.original = name, type(module).__name__
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        swapped = SwappedAttention(mixer, layer_idx, type(module).__name__)
        swapped.train(module.training)
        setattr(parent, attr, swapped)
        report.layers.append(info)
        report.notes.extend(n for n in info.notes if n not in report.notes)
    _whole_model_notes(report, mechanism, rope)
    return report

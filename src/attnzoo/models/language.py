"""Causal decoder language model (nanoGPT layout) on the shared skeleton: GPT-2, ToST, AoT, Fastmax GPT."""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from attnzoo.models._registry import register_architecture
from attnzoo.models.blocks import build_blocks, init_weights, set_norm_eps, supports_step
from attnzoo.models.checkpoint import PretrainedModel
from attnzoo.models.config import CausalLMConfig
from attnzoo.models.embeddings import sinusoidal_positions
from attnzoo.models.prefill import has_prefill, prefill
from attnzoo.ops._varlen import check_attention_mask, segments

__all__ = ["CausalLM", "check_token_ids", "last_real_logits", "sample_next"]


def check_token_ids(name: str, idx: torch.Tensor, vocab_size: int, max_len: int | None) -> None:
    """Validate a ``(B, T)`` integer token tensor."""
    if not isinstance(idx, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of token ids (B, T), got {type(idx).__name__}")
    if idx.ndim != 2:
        raise ValueError(f"{name} must have shape (B, T), got {tuple(idx.shape)}")
    if idx.dtype.is_floating_point or idx.dtype.is_complex or idx.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids, got dtype {idx.dtype}")
    if idx.shape[1] < 1:
        raise ValueError(f"{name} must hold at least one token (T >= 1)")
    if max_len is not None and idx.shape[1] > max_len:
        raise ValueError(f"{name} has T={idx.shape[1]} tokens but the model handles at most {max_len}")
    if idx.numel() and not torch.compiler.is_compiling() and idx.device.type != "meta":
        lo, hi = torch.aminmax(idx).__iter__()
        lo, hi = torch.stack([lo, hi]).tolist()  # one host sync for both bounds
        if lo < 0 or hi >= vocab_size:
            raise ValueError(
                f"{name} holds token ids in [{lo}, {hi}] but vocab_size={vocab_size} (valid: 0..{vocab_size - 1})"
            )


def sample_next(
    logits: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Next token ``(B,)`` from last-position logits ``(B, V)``; ``temperature=0`` is greedy."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None:
        k = min(top_k, logits.shape[-1])
        kth = torch.topk(logits, k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@register_architecture
class CausalLM(PretrainedModel):
    """``(B, T)`` token ids -> ``(B, T, vocab_size)`` next-token logits; token ``t`` sees tokens ``<= t`` only.

    Input and output embeddings are tied (``tie_weights``). When every block's mixer implements
    ``init_state/step`` (:class:`attnzoo.layers.RecurrentMixin`), :meth:`step` and :meth:`generate`
    decode token by token with per-layer state instead of re-running the prefix.
    """

    config_class = CausalLMConfig

    def __init__(self, config: CausalLMConfig) -> None:
        super().__init__(config)
        cfg = config
        self.wte = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.wpe = nn.Embedding(cfg.block_size, cfg.dim) if cfg.pos_embed == "learned" else None
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = build_blocks(cfg, causal=True, context={"max_len": cfg.block_size})
        self.ln_f = nn.LayerNorm(cfg.dim) if cfg.final_norm else nn.Identity()
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        init_weights(self)
        set_norm_eps(self, cfg.norm_eps)
        # GPT-2: residual output projections scaled by 1/sqrt(2 * depth)
        for blk in self.blocks:
            if blk.ffn_kind == "mlp":
                nn.init.trunc_normal_(blk.ffn.fc2.weight, std=0.02 / math.sqrt(2 * cfg.depth))
        if cfg.tie_weights:
            self.lm_head.weight = self.wte.weight

    # ---- full forward ------------------------------------------------------------------------
    def _embed(self, idx: torch.Tensor, start: int | torch.Tensor) -> torch.Tensor:
        """Token plus position embeddings of ``idx (B, T)``; positions ``start + 0..T-1`` with ``start`` an int or a
        per-row ``(B,)`` tensor, or given per token as a ``(B, T)`` tensor (``Segments.pos`` of a padded batch)."""
        t = idx.shape[1]
        x = self.wte(idx)
        kind = self.config.pos_embed
        if kind not in ("learned", "sinusoidal"):
            return self.drop(x)
        if isinstance(start, int):
            if kind == "learned":
                return self.drop(x + self.wpe(torch.arange(start, start + t, device=idx.device)))
            table = sinusoidal_positions(start + t, self.config.dim, device=idx.device, dtype=x.dtype)
            return self.drop(x + table[start:])
        pos = start if start.ndim == 2 else start[:, None] + torch.arange(t, device=idx.device)
        if kind == "learned":
            return self.drop(x + self.wpe(pos))
        table = sinusoidal_positions(int(pos.max()) + 1, self.config.dim, device=idx.device, dtype=x.dtype)
        return self.drop(x + table[pos])

    def forward(
        self, idx: torch.Tensor, *, attention_mask: torch.Tensor | None = None, cu_seqlens: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``idx (B, T)`` -> logits ``(B, T, V)``. ``attention_mask (B, T)`` (1 = real token, padding anywhere) or
        ``cu_seqlens (S + 1,)`` (sequences packed in one row, ``B = 1``): each sequence is computed as if alone
        (positions restart at its first real token; logits at padding positions are meaningless)."""
        # a packed row may exceed block_size: each of its sequences may not (positions restart at each one)
        check_token_ids("idx", idx, self.config.vocab_size, None if cu_seqlens is not None else self.config.block_size)
        seg = segments(*idx.shape, attention_mask=attention_mask, cu_seqlens=cu_seqlens, device=idx.device)
        if cu_seqlens is not None and seg.lengths.numel() and int(seg.lengths.max()) > self.config.block_size:
            raise ValueError(
                f"cu_seqlens holds a sequence of {int(seg.lengths.max())} tokens but the model handles at most "
                f"block_size={self.config.block_size} per sequence"
            )
        x = self._embed(idx, 0 if seg is None else seg.pos)
        for blk in self.blocks:
            x = blk(x, attention_mask=attention_mask, cu_seqlens=cu_seqlens)
        return self.lm_head(self.ln_f(x))

    def loss(self, idx: torch.Tensor, targets: torch.Tensor, *, ignore_index: int = -100) -> torch.Tensor:
        """Mean next-token cross-entropy; ``targets (B, T)`` (``ignore_index`` entries skipped)."""
        if not isinstance(targets, torch.Tensor) or targets.shape != idx.shape:
            raise ValueError(
                f"targets must have the shape of idx {tuple(idx.shape)}, got "
                f"{tuple(targets.shape) if isinstance(targets, torch.Tensor) else type(targets).__name__}"
            )
        logits = self(idx).flatten(0, 1)
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()  # the log-sum-exp over the vocabulary in float32 at least
        return F.cross_entropy(logits, targets.flatten(), ignore_index=ignore_index)

    # ---- incremental decoding ----------------------------------------------------------------
    @property
    def supports_incremental(self) -> bool:
        """Whether every mixer decodes token by token (``init_state`` / ``step``)."""
        return all(supports_step(b.attn) for b in self.blocks)

    def _require_incremental(self) -> None:
        if not self.supports_incremental:
            bad = sorted({type(b.attn).__name__ for b in self.blocks if not supports_step(b.attn)})
            raise ValueError(
                f"incremental decoding needs init_state/step on every mixer; {bad} do not implement it "
                f"(use generate(..., use_cache=False))"
            )

    def init_state(self, batch_size: int, *, device=None, dtype=None) -> dict:
        """Empty decoding state for ``batch_size`` sequences (position 0)."""
        self._require_incremental()
        p = self.wte.weight
        device = p.device if device is None else device
        dtype = p.dtype if dtype is None else dtype
        return {
            "pos": 0,
            "layers": [b.attn.init_state(batch_size, device=device, dtype=dtype) for b in self.blocks],
        }

    def step(
        self, idx_t: torch.Tensor, state: dict, *, attention_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict]:
        """Feed one token per sequence, ``idx_t (B,)``; returns logits ``(B, vocab_size)`` and the new state.

        Equals ``forward(prefix)[:, -1]`` for the prefix fed so far. ``attention_mask (B,)`` (1 = real): a padding
        token leaves its row's state and position unchanged and gets zero logits, so each row decodes its real
        tokens alone (left-padded prompts).
        """
        if not isinstance(idx_t, torch.Tensor) or idx_t.ndim != 1:
            raise ValueError(
                f"idx_t must be a (B,) tensor of token ids, got "
                f"{tuple(idx_t.shape) if isinstance(idx_t, torch.Tensor) else type(idx_t).__name__}"
            )
        real = None
        if attention_mask is not None:
            if isinstance(attention_mask, torch.Tensor) and attention_mask.ndim == 1:
                attention_mask = attention_mask[:, None]
            real = check_attention_mask(attention_mask, idx_t.shape[0], 1, name="attention_mask (B,)")
        x, state = self._step_hidden(idx_t[:, None], state, real)
        logits = self.lm_head(self.ln_f(x))[:, 0]
        if real is not None:
            logits = torch.where(real, logits, torch.zeros_like(logits))
        return logits, state

    def _step_hidden(self, idx: torch.Tensor, state: dict, real: torch.Tensor | None) -> tuple[torch.Tensor, dict]:
        """One token ``idx (B, 1)`` through the blocks: hidden ``(B, 1, dim)`` and the new state; ``real (B, 1)``
        bool marks real tokens (``None``: all). The state's ``pos`` is an int, or ``(B,)`` once rows differ, and
        its ``mask (B, t)`` the real tokens fed so far (kept once a padding token has been fed)."""
        pos, hist = state["pos"], state.get("mask")
        if len(state["layers"]) != len(self.blocks):
            raise ValueError(
                f"state holds {len(state['layers'])} layers' states but this model has {len(self.blocks)} blocks; "
                "start from this model's init_state"
            )
        top = int(pos.max()) if isinstance(pos, torch.Tensor) else pos
        if self.config.pos_embed == "learned" and top >= self.config.block_size:
            raise ValueError(
                f"position {top} is past block_size={self.config.block_size} (learned positions end there)"
            )
        check_token_ids("idx_t", idx, self.config.vocab_size, None)
        b = idx.shape[0]
        if hist is None and (real is None or bool(real.all())):
            real = None  # nothing padded so far: the unmasked step
        else:
            hist = hist if hist is not None else torch.ones(b, pos, dtype=torch.bool, device=idx.device)
            real = real if real is not None else torch.ones(b, 1, dtype=torch.bool, device=idx.device)
            hist = torch.cat([hist, real], dim=1)
        x = self._embed(idx, pos)
        layers = []
        for blk, s in zip(self.blocks, state["layers"], strict=True):
            x, s = blk.step(x, s, attention_mask=hist)
            layers.append(s)
        if hist is None:
            return x, {"pos": pos + 1, "layers": layers}
        rows = pos if isinstance(pos, torch.Tensor) else torch.full((b,), pos, device=idx.device)
        return x, {"pos": rows + real[:, 0].long(), "layers": layers, "mask": hist}

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        use_cache: bool | None = None,
        generator: torch.Generator | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Append ``max_new_tokens`` sampled tokens to ``idx (B, T)``; returns ``(B, T + max_new_tokens)``.

        ``use_cache=None`` decodes incrementally when every mixer supports it and the result fits in
        ``block_size``; otherwise the (cropped) prefix is re-run for each new token, as nanoGPT does.
        ``temperature=0`` decodes greedily. ``attention_mask (B, T)`` (1 = real) marks padding in the prompts (left,
        right or anywhere): each row continues its real tokens as if alone; the new tokens follow the padding.
        """
        check_token_ids("idx", idx, self.config.vocab_size, None)
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be a non-negative integer, got {max_new_tokens!r}")
        if not isinstance(temperature, (int, float)) or temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature!r}")
        if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
            raise ValueError(f"top_k must be a positive integer or None, got {top_k!r}")
        mask = None if attention_mask is None else check_attention_mask(attention_mask, *idx.shape).to(idx.device)
        if mask is not None and bool(mask.all()):
            mask = None
        total = idx.shape[1] + max_new_tokens
        fits = self.config.pos_embed != "learned" or total <= self.config.block_size
        if use_cache is None:
            use_cache = self.supports_incremental and fits
        if max_new_tokens == 0:
            return idx
        sample = functools.partial(sample_next, temperature=temperature, top_k=top_k, generator=generator)
        if use_cache:
            self._require_incremental()
            if not fits:
                raise ValueError(
                    f"cached decoding of {total} tokens exceeds block_size={self.config.block_size}; "
                    f"pass use_cache=False to decode with a sliding window"
                )
            return self._generate_cached(idx, max_new_tokens, mask, sample)
        for _ in range(max_new_tokens):
            window = idx[:, -self.config.block_size :]
            if mask is None:
                logits = self(window)[:, -1]
            else:
                m = mask[:, -self.config.block_size :]
                # the last real token of each row predicts its next one (right padding puts it before the end)
                last = (torch.arange(m.shape[1], device=m.device) * m).argmax(dim=1)
                logits = self(window, attention_mask=m)[torch.arange(m.shape[0]), last]
                mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
            idx = torch.cat([idx, sample(logits)[:, None]], dim=1)
        return idx

    def prefill(
        self, idx: torch.Tensor, *, attention_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict] | None:
        """The prompt ``idx (B, T)`` through the parallel causal form once: logits ``(B, T, V)`` and the decoding
        state after it (equal to feeding it through :meth:`step`); ``None`` when a mixer has no prefill
        (:func:`attnzoo.models.prefill.prefill`), whose prompt :meth:`generate` feeds token by token.

        ``attention_mask (B, T)`` (1 = real; padding left, right or anywhere): positions restart at each row's first
        real token, the state holds each row's real tokens alone, and its ``pos`` ``(B,)`` and ``mask (B, T)`` are
        those :meth:`step` keeps after a padded prompt (logits at padding positions are meaningless).
        """
        if not all(has_prefill(b.attn) for b in self.blocks):
            return None
        check_token_ids("idx", idx, self.config.vocab_size, self.config.block_size)
        mask = None
        if attention_mask is not None:
            mask = check_attention_mask(attention_mask, *idx.shape).to(idx.device)
            mask = None if bool(mask.all()) else mask
        seg = segments(*idx.shape, attention_mask=mask, device=idx.device)
        x = self._embed(idx, 0 if seg is None else seg.pos)
        layers = []
        for blk in self.blocks:
            box = {}

            def mix(h: torch.Tensor, attn=blk.attn, box=box) -> torch.Tensor:
                box["pre"] = prefill(attn, h, mask)
                return h if box["pre"] is None else box["pre"][0]

            x = blk._run(x, mix)
            if box["pre"] is None:
                return None  # a layer declines this prompt (MEGA's, when padded): step through it instead
            layers.append(box["pre"][1])
        logits = self.lm_head(self.ln_f(x))
        if mask is None:
            return logits, {"pos": idx.shape[1], "layers": layers}
        return logits, {"pos": mask.sum(dim=1), "layers": layers, "mask": mask}

    def _generate_cached(
        self, idx: torch.Tensor, max_new_tokens: int, mask: torch.Tensor | None, sample
    ) -> torch.Tensor:
        """Incremental decoding of :meth:`generate`; ``mask (B, T)`` bool or ``None`` (no padding)."""
        pre = self.prefill(idx, attention_mask=mask)
        state = pre[1] if pre is not None else self.init_state(idx.shape[0], device=idx.device)
        logits = None if pre is None else last_real_logits(pre[0], mask)
        for t in range(0 if pre is None else idx.shape[1], idx.shape[1]):
            real = None if mask is None else mask[:, t : t + 1]
            x, state = self._step_hidden(idx[:, t : t + 1], state, real)
            new = self.lm_head(self.ln_f(x))[:, 0]
            # a padding token keeps the logits of its row's last real token (right padding ends the prompt with it)
            if real is not None:
                new = torch.where(real, new, logits if logits is not None else torch.zeros_like(new))
            logits = new
        out = [idx]
        for i in range(max_new_tokens):
            nxt = sample(logits)
            out.append(nxt[:, None])
            if i + 1 < max_new_tokens:
                logits, state = self.step(nxt, state)
        return torch.cat(out, dim=1)


def last_real_logits(logits: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``(B, V)``: the logits ``(B, T, V)`` at each row's last real token of ``mask (B, T)`` (zeros for a row without
    one, as stepping gives); the last position when ``mask`` is ``None``."""
    if mask is None:
        return logits[:, -1]
    last = (torch.arange(mask.shape[1], device=mask.device) * mask).argmax(dim=1)
    out = logits[torch.arange(logits.shape[0], device=logits.device), last]
    return torch.where(mask.any(dim=1, keepdim=True), out, torch.zeros_like(out))

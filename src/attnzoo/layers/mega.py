"""The MEGA layer (Ma et al. 2022, §3): damped EMA, single-head gated attention (or CSP), reset and update gates."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from attnzoo.layers._norms import build_norm
from attnzoo.layers.base import Attention, RecurrentMixin, check_kv_cache, check_step_input, register_attention
from attnzoo.ops._varlen import check_attention_mask, segments
from attnzoo.ops.csp import csp, csp_shifts
from attnzoo.ops.ema import ema, ema_step, init_ema_state
from attnzoo.ops.ema.scan import decay_powers
from attnzoo.ops.mega import MEGA, MegaOptions, mega_attention
from attnzoo.ops.mega.step import mega_attention_step

__all__ = ["MegaLayer"]


@register_attention("mega")
class MegaLayer(RecurrentMixin, Attention):
    """Moving average equipped gated attention (MEGA §3.1-3.2): bidirectional as MEGA's encoders use it, or causal
    (``causal=True``) as its decoders do, with token-by-token decoding (:meth:`step`).

    With ``X`` the normalised input (``prenorm``; the raw input otherwise) of width ``D = dim``:

    - ``X' = silu(EMA(X) + omega ⊙ X)``: the damped EMA (§3.1, :func:`attnzoo.ops.ema`), whose
      ``alpha = sigmoid(.)``, ``delta = sigmoid(.)``, ``beta``, ``eta / sqrt(h)`` are ``(2, D, h)`` parameters
      (forward and backward EMA; ``(1, D, h)`` when causal: the forward EMA only);
    - ``[u, Z, r, H_x] = [sigmoid, silu, silu, id](X' W + b)`` (§3.2) and ``V = silu(X W_v + b_v)``
      (width ``E = hdim``);
    - ``Q = Z ⊙ kappa_q + mu_q``, ``K = Z ⊙ kappa_k + mu_k`` and ``O = f(Q Kᵀ / c + B_rel) V`` with ``f`` the
      softmax or the Laplace function, within chunks of ``chunk_size`` (§3.3, §3.5), or ``O = CSP(V)`` (CSP eq 4
      in place of the attention, with CSP's ``csp_groups`` and ``shift_schedule``: CSP §4, Table 7); causal: key
      ``j <= i`` of query i's chunk only (CSP has no causal form: ``attention="csp"`` refuses ``causal=True``);
    - ``H = silu(H_x + (r ⊙ O) W_h + b_h)`` and the update gate ``Y = u ⊙ H + (1 - u) ⊙ X_in``
      with ``X_in`` the layer's raw input; post-norm normalises ``Y``.

    The layer owns its residual (the update gate mixes ``H`` with the raw input): in the skeleton's
    :class:`~attnzoo.models.blocks.Block` it takes the residual stream and returns the new one, and the block's
    feed-forward half is MEGA's normalised FFN. ``heads`` is checked and otherwise ignored: MEGA is single-head.

    Parameters (``E = hdim``, ``R`` = ``chunk_size`` or ``max_len``): norm ``2D`` (``1`` for ScaleNorm);
    EMA ``8Dh + D`` (``4Dh + D`` causal); ``W_v`` ``DE + E``; ``W`` ``D(Z + E + 2D) + Z + E + 2D``; ``W_h``
    ``ED + D``; offsets ``4Z``; relative bias ``2R - 1``. With ``attention="csp"`` the shared ``Z``, its offsets and
    the bias are not built.

    Recorded internals: ``ema`` (``X'``, ``(B, N, D)``), ``u`` (update gate ``(B, N, D)``), ``r`` (reset gate).

    Decoding (causal): ``state = init_state(B)``, then ``y, state = step(x_t (B, 1, dim), state)``; the state is the
    EMA's ``(B, D, h)`` and the keys/values of the current chunk (MEGA's incremental state, emptied at each chunk
    boundary), so it is O(chunk_size) per sequence with chunks and grows with the context without them.
    :meth:`prefill` computes that state from a prompt in one parallel pass.
    """

    mechanism = MEGA
    supports_masks = True  # forward honours attention_mask / cu_seqlens
    owns_residual = True

    def build(self, o: MegaOptions) -> None:
        """The projections and parameters of the options ``o``."""
        self.attention, self.ndim, self.zdim = o.attention, o.ndim, o.zdim
        self.hdim = o.hdim if o.hdim is not None else 2 * self.dim
        self.chunk_size, self.max_len, self.prenorm = o.chunk_size, o.max_len, o.prenorm
        self.csp_groups, self.shift_schedule = o.csp_groups, o.shift_schedule
        self.layer_index, self.num_layers = o.layer_index, o.num_layers
        self.init = o.init
        self._build_parameters(o)
        self._shift_cache: dict[tuple[int, str], torch.Tensor] = {}
        self.reset_parameters()

    def _build_parameters(self, o: MegaOptions) -> None:
        D, h, Z, E = self.dim, self.ndim, self.zdim, self.hdim
        self.norm = build_norm(o.norm_layer, D)
        # EMA coefficients, forward then backward direction (MEGA's bidirectional kernel of width 2D); a causal
        # layer has the forward one only (MEGA's decoders build the EMA with bidirectional=False)
        dirs = 1 if self.causal else 2
        self.ema_alpha = nn.Parameter(torch.empty(dirs, D, h))
        self.ema_delta = nn.Parameter(torch.empty(dirs, D, h))
        self.ema_beta = nn.Parameter(torch.empty(dirs, D, h))
        self.ema_eta = nn.Parameter(torch.empty(dirs, D, h))
        self.ema_omega = nn.Parameter(torch.empty(D))
        self.v_proj = nn.Linear(D, E)
        zw = 0 if o.attention == "csp" else Z
        self.mx_proj = nn.Linear(D, D + zw + E + D)
        self.h_proj = nn.Linear(E, D)
        if o.attention != "csp":
            self.qk_scale = nn.Parameter(torch.empty(2, Z))  # kappa_q, kappa_k
            self.qk_offset = nn.Parameter(torch.empty(2, Z))  # mu_q, mu_k
            R = o.chunk_size if o.chunk_size is not None else o.max_len
            self.rel_bias = nn.Parameter(torch.empty(2 * R - 1))
        self.drop = nn.Dropout(o.dropout)
        self.hidden_drop = nn.Dropout(o.hidden_dropout)

    def reset_parameters(self) -> None:
        """EMA as MEGA's code: rates N(0, 0.2) before the sigmoid, ``beta`` near ``(1, -1, 1, ...)``, ``eta`` and
        ``omega`` N(0, 1); zero biases and offsets.

        ``init="mega"``: projections and ``kappa_q, kappa_k`` N(0, 0.02), as MEGA's code. The attention path is then
        a product of four small factors (``r``, ``v``, ``W_h`` ~ 0.02-0.06; scores ~ 1e-7): its gradients
        (``kappa`` ~ 1e-12, ``W_v``, ``W_h`` ~ 1e-7) sit below Adam's epsilon, so in a short run the attention never
        moves and the layer is no better than no token mixing at all (ListOps, 300 steps: 18.5%, the majority
        class). ``init="scaled"`` (default): projections N(0, 1/fan_in) and ``kappa`` N(0, 1), so ``r``, ``v`` and
        the scores are O(0.1-1) and the attention learns from the first steps."""
        with torch.no_grad():
            nn.init.normal_(self.ema_alpha, std=0.2)
            nn.init.normal_(self.ema_delta, std=0.2)
            signs = torch.ones(self.ndim)
            signs[1::2] = -1.0  # alternating signs: MEGA's code finds them more stable
            self.ema_beta.normal_(std=0.02).add_(signs)
            nn.init.normal_(self.ema_eta, std=1.0)
            nn.init.normal_(self.ema_omega, std=1.0)
            scaled = self.init == "scaled"
            for lin in (self.v_proj, self.mx_proj, self.h_proj):
                nn.init.normal_(lin.weight, std=lin.in_features**-0.5 if scaled else 0.02)
                nn.init.zeros_(lin.bias)
            if self.attention != "csp":
                nn.init.normal_(self.qk_scale, std=1.0 if scaled else 0.02)
                nn.init.zeros_(self.qk_offset)
                nn.init.normal_(self.rel_bias, std=0.02)

    def ema_coefficients(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``alpha, delta, beta, eta`` as :func:`attnzoo.ops.ema` takes them (eta scaled by 1/sqrt(h)): ``(2, D, h)``,
        or ``(D, h)`` when causal."""
        coeffs = (
            torch.sigmoid(self.ema_alpha),
            torch.sigmoid(self.ema_delta),
            self.ema_beta,
            self.ema_eta * math.sqrt(1.0 / self.ndim),
        )
        return tuple(c[0] for c in coeffs) if self.causal else coeffs

    def shifts_for(self, N: int, device: torch.device | None = None) -> torch.Tensor:
        """CSP's per-channel shift steps ``(hdim,)`` for N tokens (cached per N and device)."""
        key = (N, str(device))
        s = self._shift_cache.get(key)
        if s is None:
            s = csp_shifts(N, self.hdim, self.shift_schedule, layer=self.layer_index, num_layers=self.num_layers)
            s = self._shift_cache[key] = s.to(device)
        return s

    def _check_length(self, N: int) -> int | None:
        """CSP's groups for N tokens (``None`` for attention), or a clear error when N does not fit the options."""
        if self.attention == "csp":
            groups = N if self.csp_groups is None else self.csp_groups
            if N % groups:
                valid = [d for d in range(1, N + 1) if N % d == 0]
                raise ValueError(
                    f"MegaLayer(attention='csp', csp_groups={groups}) needs N divisible by csp_groups, got N={N}; "
                    f"valid csp_groups: {valid} (or None: shifting only)"
                )
            return groups
        if self.chunk_size is None and N > self.max_len:
            raise ValueError(
                f"MegaLayer(max_len={self.max_len}) got N={N} tokens: its relative position bias covers "
                f"max_len tokens; build it with max_len >= {N}, or set chunk_size"
            )
        return None

    def _check_segments(self, x: torch.Tensor, attention_mask, cu_seqlens):
        """The :class:`~attnzoo.ops._varlen.Segments` of a masked call, after the checks the options need."""
        toks = segments(x.shape[0], x.shape[1], attention_mask=attention_mask, cu_seqlens=cu_seqlens, device=x.device)
        if self.options.norm_layer == "batchnorm" and self.training:
            raise ValueError(
                "MegaLayer(norm_layer='batchnorm') pools statistics over every token of the batch in training, "
                "padding included; use 'layernorm' or 'scalenorm' with attention_mask / cu_seqlens"
            )
        for n in toks.lengths.unique().tolist():
            if n > 0:
                self._check_length(int(n))  # each sequence must fit the options as it would alone
        return toks

    def _seq_shifts(self, toks, device) -> torch.Tensor:
        """CSP's shift schedule per sequence ``(B, S, hdim)``, each from its own length."""
        shifts = torch.zeros(*toks.lengths.shape, self.hdim, dtype=torch.long, device=device)
        for n in toks.lengths.unique().tolist():
            if n > 0:
                shifts[toks.lengths == n] = self.shifts_for(int(n), device)
        return shifts

    def forward(
        self, x: torch.Tensor, *, attention_mask: torch.Tensor | None = None, cu_seqlens: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``x`` ``(B, N, dim)`` -> ``(B, N, dim)``; with ``attention_mask`` ``(B, N)`` or ``cu_seqlens`` ``(S + 1,)``
        every sequence is the layer alone (EMA restarted, attention and chunks within it), zeros at padding."""
        self.check_input(x)
        N, D, E = x.shape[1], self.dim, self.hdim
        masked = attention_mask is not None or cu_seqlens is not None
        toks = self._check_segments(x, attention_mask, cu_seqlens) if masked else None
        # CSP's groups: csp_groups (None: groups of one token) with masks, else checked against N
        groups = self.csp_groups if masked else self._check_length(N)
        kw = dict(attention_mask=attention_mask, cu_seqlens=cu_seqlens)
        with self.naming_input(x):
            residual = x
            xn = self.norm(x) if self.prenorm else x
            v = self.hidden_drop(F.silu(self.v_proj(xn)))
            ema_out = ema(xn, *self.ema_coefficients(), causal=self.causal, **kw)
            mx = self.drop(F.silu(ema_out + xn * self.ema_omega))  # EMA(X) + omega X
            base = self.mx_proj(mx)
            if self.attention != "csp":
                u, zr, hx = torch.split(base, [D, self.zdim + E, D], dim=-1)
                z, r = torch.split(F.silu(zr), [self.zdim, E], dim=-1)  # shared Z, reset gate r
                q = z * self.qk_scale[0] + self.qk_offset[0]  # the two offsets of Z
                k = z * self.qk_scale[1] + self.qk_offset[1]
                o = mega_attention(
                    q, k, v, self.rel_bias, fn=self.attention, chunk_size=self.chunk_size, causal=self.causal, **kw
                )
            else:
                u, r, hx = torch.split(base, [D, E, D], dim=-1)
                r = F.silu(r)
                shifts = self._seq_shifts(toks, x.device) if masked else self.shifts_for(N, x.device)
                o = csp(v, shifts, groups, **kw)  # CSP eq 4 in place of eq 9
            u = torch.sigmoid(u)  # update gate
            h = self.drop(F.silu(hx + self.h_proj(o * r)))
            y = residual + u * (h - residual)  # u ⊙ H + (1 - u) ⊙ X
            if self.capturing:
                self.record(ema=mx, u=u, r=r)
            y = y if self.prenorm else self.norm(y)
            return y * toks.real.unsqueeze(-1).to(y.dtype) if masked else y

    # ---- decoding ------------------------------------------------------------------------------------------
    _STATE = ("ema", "k", "v", "key_pos", "pos")

    def init_state(self, batch_size: int, *, device=None, dtype=None) -> dict[str, torch.Tensor]:
        """The state before the first token: EMA ``(B, D, h)`` zeros, empty caches ``k (B, 0, Z)``, ``v (B, 0, E)``,
        ``key_pos (B, 0)`` (each key's position; -1 for a slot of a padding token) and ``pos (B,)`` zeros."""
        w = self.v_proj.weight
        device, dtype = device or w.device, dtype or w.dtype
        zw = 0 if self.attention == "csp" else self.zdim
        return {
            "ema": init_ema_state(batch_size, self.dim, self.ndim, device=device, dtype=dtype),
            "k": torch.zeros(batch_size, 0, zw, device=device, dtype=dtype),
            "v": torch.zeros(batch_size, 0, self.hdim, device=device, dtype=dtype),
            "key_pos": torch.zeros(batch_size, 0, dtype=torch.long, device=device),
            "pos": torch.zeros(batch_size, dtype=torch.long, device=device),
        }

    def step(
        self, x: torch.Tensor, state: dict[str, torch.Tensor], *, attention_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One token ``x (B, 1, dim)`` -> ``(B, 1, dim)`` and the new state; equals the causal forward at that position.

        ``attention_mask (B, t + 1)``: the tokens fed so far, this one last (True = real); a padding token gets a
        zero output and leaves its row's EMA state and position unchanged, so each row decodes its real tokens alone.
        """
        check_step_input(self, x)
        check_kv_cache(state, x.shape[0], self._STATE)
        B, D, E = x.shape[0], self.dim, self.hdim
        real = None
        if attention_mask is not None:
            if not isinstance(attention_mask, torch.Tensor) or attention_mask.ndim != 2:
                raise ValueError(
                    f"attention_mask must be the (B, t + 1) mask of the tokens fed so far, got "
                    f"{getattr(attention_mask, 'shape', type(attention_mask).__name__)}"
                )
            real = check_attention_mask(attention_mask, B, attention_mask.shape[1])[:, -1].to(x.device)
        pos = state["pos"]
        if self.chunk_size is None and bool((pos >= self.max_len).any()):
            raise ValueError(
                f"MegaLayer(max_len={self.max_len}) cannot decode token {int(pos.max()) + 1}: its relative position "
                f"bias covers max_len tokens; build it with a larger max_len, or set chunk_size"
            )
        with self.naming_input(x):
            residual = x
            xn = self.norm(x) if self.prenorm else x
            v = self.hidden_drop(F.silu(self.v_proj(xn)))
            ema_out, ema_state = ema_step(xn, state["ema"], *self.ema_coefficients())
            mx = self.drop(F.silu(ema_out + xn * self.ema_omega))
            u, zr, hx = torch.split(self.mx_proj(mx), [D, self.zdim + E, D], dim=-1)
            z, r = torch.split(F.silu(zr), [self.zdim, E], dim=-1)
            q = z * self.qk_scale[0] + self.qk_offset[0]
            k = z * self.qk_scale[1] + self.qk_offset[1]
            new_pos = pos if real is None else torch.where(real, pos, -1)  # a padding token leaves no key
            keys = torch.cat([state["k"], k], dim=1)
            values = torch.cat([state["v"], v], dim=1)
            key_pos = torch.cat([state["key_pos"], new_pos[:, None]], dim=1)
            o = mega_attention_step(
                q, keys, values, self.rel_bias, key_pos, pos, fn=self.attention, chunk=self.chunk_size
            )
            h = self.drop(F.silu(hx + self.h_proj(o * r)))
            y = residual + torch.sigmoid(u) * (h - residual)
            y = y if self.prenorm else self.norm(y)
            if real is not None:
                y = y * real[:, None, None].to(y.dtype)
                ema_state = torch.where(real[:, None, None], ema_state, state["ema"])
                pos = pos + real.long()
            else:
                pos = pos + 1
            # MEGA-chunk's decoder empties its cache at a chunk boundary: drop the keys no later query reads
            start = torch.zeros_like(pos) if self.chunk_size is None else pos - pos % self.chunk_size
            live = ((key_pos >= start[:, None]) & (key_pos >= 0)).any(0)
            if not bool(live.all()):
                keys, values, key_pos = keys[:, live], values[:, live], key_pos[:, live]
            return y, {"ema": ema_state, "k": keys, "v": values, "key_pos": key_pos, "pos": pos}

    def prefill(
        self, x: torch.Tensor, *, attention_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]] | None:
        """The prompt ``x (B, T, dim)`` through the causal forward once: ``(out (B, T, dim), state)`` with the state
        :meth:`step` would hold after it (EMA state in closed form, MEGA §A eq 23; the keys/values of the last,
        unfinished chunk). ``None`` for a padded prompt (``attention_mask`` with padding): replay it through step."""
        if not self.causal:
            raise ValueError("MegaLayer.prefill decodes causally; build the module with causal=True")
        if attention_mask is not None and not bool(torch.as_tensor(attention_mask).bool().all()):
            return None
        self.check_input(x)
        B, T, D = x.shape
        out = self(x)
        with self.naming_input(x):
            xn = self.norm(x) if self.prenorm else x
            a, d, b, e = self.ema_coefficients()
            # h_T = sum_t q^{T-1-t} alpha beta x_t (q = 1 - alpha delta): the recurrence's state after T tokens
            acc = init_ema_state(1, 1, 1, dtype=x.dtype).dtype
            powers = decay_powers((1 - a * d).to(acc), T).flip(-1)  # (D, h, T): q^{T-1-t}
            ema_state = torch.einsum("dnt,btd->bdn", (a * b).to(acc).unsqueeze(-1) * powers, xn.to(acc))
            start = 0 if self.chunk_size is None else T - T % self.chunk_size  # the unfinished chunk's first token
            tail = xn[:, start:]
            v = self.hidden_drop(F.silu(self.v_proj(tail)))
            mx = self.drop(F.silu(ema(xn, a, d, b, e, causal=True)[:, start:] + tail * self.ema_omega))
            zr = torch.split(self.mx_proj(mx), [D, self.zdim + self.hdim, D], dim=-1)[1]
            z = F.silu(zr)[..., : self.zdim]
            k = z * self.qk_scale[1] + self.qk_offset[1]
            key_pos = torch.arange(start, T, device=x.device).expand(B, -1)
            pos = torch.full((B,), T, dtype=torch.long, device=x.device)
            return out, {"ema": ema_state, "k": k, "v": v, "key_pos": key_pos, "pos": pos}

    def extra_repr(self) -> str:
        extra = f"chunk_size={self.chunk_size}" if self.attention != "csp" else f"csp_groups={self.csp_groups}"
        return (
            f"{super().extra_repr()}, attention={self.attention!r}, ndim={self.ndim}, zdim={self.zdim}, "
            f"hdim={self.hdim}, {extra}, prenorm={self.prenorm}"
        )

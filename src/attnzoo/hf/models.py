"""attnzoo's causal LMs and vision classifiers as ``transformers`` models (``PreTrainedModel``).

Each wraps the attnzoo model it mirrors under ``self.model`` (:class:`attnzoo.models.language.CausalLM`,
:class:`attnzoo.models.vision.VisionTransformer`), so the computation is attnzoo's own, parameter for
parameter: the ``transformers`` checkpoint layout is attnzoo's with a ``model.`` prefix
(:mod:`attnzoo.hf.conversion`).

Decoding: the cache is :class:`RecurrentCache`, the per-layer state of each mechanism's ``init_state`` /
``step`` (:class:`attnzoo.layers.RecurrentMixin`). TSSA, Fastmax and linear attention keep running sums of a
fixed size (decoding memory is flat in the context length); softmax and MSSA keep their key/value cache.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast, ImageClassifierOutput

from attnzoo.hf.configs import AttnZooCausalLMConfig, AttnZooVisionConfig
from attnzoo.models.language import CausalLM, last_real_logits
from attnzoo.models.masking import RowInts, map_state
from attnzoo.models.vision import VisionTransformer
from attnzoo.ops._varlen import segments

__all__ = ["RecurrentCache", "AttnZooForCausalLM", "AttnZooForImageClassification"]

# transformers 5.24 renamed the decoding cache argument of generate()/forward() from ``past_key_values`` to ``cache``
# (the old name warns until 5.40). attnzoo's forward takes both; generation passes whichever this version expects.
_GENERATE_CACHE_ARG = (
    "cache"
    if "cache" in inspect.signature(GenerationMixin.prepare_inputs_for_generation).parameters
    else "past_key_values"
)
# ... and the output field that holds it (constructing the output with the old name warns on every first generate)
_OUTPUT_CACHE = (
    "cache" if "cache" in {f.name for f in dataclasses.fields(CausalLMOutputWithPast)} else "past_key_values"
)


def _map_tensors(state: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """Apply ``fn`` to every tensor of a mechanism state (the values of its per-row ints included; ints kept)."""

    def leaf(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return fn(v)
        if isinstance(v, RowInts):  # per-row positions of a padded batch (attnzoo.models.masking)
            return RowInts(fn(v.values))
        return v

    return map_state(state, leaf)


def _tensors(state: Any) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    _map_tensors(state, lambda t: out.append(t) or t)
    return out


class RecurrentCache:
    """Decoding cache of :class:`AttnZooForCausalLM`: the number of tokens seen and one state per block.

    The states are those of the mechanisms' ``init_state``/``step``: running sums of fixed size for TSSA
    (``TSSAState``), Fastmax (``FastmaxState``) and linear attention (``{"s", "z"}``), a growing key/value
    cache for softmax (``{"k", "v"}``) and MSSA (``{"w"}``).
    """

    is_compileable = False
    is_croppable = False

    def __init__(self, layers: list[Any]) -> None:
        self.layers = list(layers)
        #: tokens fed so far, padding included (transformers' cache length)
        self.pos = 0
        #: once a padding token has been fed: each row's position ``(B,)`` (its real tokens so far), the ``(B, pos)``
        #: mask of the tokens fed (1 = real) and the logits ``(B, V)`` of each row's last real token
        self.row_pos: torch.Tensor | None = None
        self.mask: torch.Tensor | None = None
        self.last_logits: torch.Tensor | None = None

    def _rows(self) -> list[str]:
        return [n for n in ("row_pos", "mask", "last_logits") if getattr(self, n) is not None]

    def get_seq_length(self, layer_idx: int = 0) -> int:  # noqa: ARG002 (transformers' Cache API; one length)
        """Tokens fed so far."""
        return self.pos

    def nbytes(self) -> int:
        """Bytes held by the state tensors (constant in the context for the recurrent mechanisms)."""
        return sum(t.numel() * t.element_size() for t in _tensors(self.layers))

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Select / reorder the batch rows (beam search)."""
        self.layers = [_map_tensors(s, lambda t: t.index_select(0, beam_idx.to(t.device))) for s in self.layers]
        for n in self._rows():
            t = getattr(self, n)
            setattr(self, n, t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.layers = [_map_tensors(s, lambda t: t.repeat_interleave(repeats, dim=0)) for s in self.layers]
        for n in self._rows():
            setattr(self, n, getattr(self, n).repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.reorder_cache(indices)

    def __len__(self) -> int:
        return len(self.layers)

    def __repr__(self) -> str:
        return f"RecurrentCache(layers={len(self.layers)}, pos={self.pos}, bytes={self.nbytes()})"


def _check_attention_mask(mask: torch.Tensor | None, batch: int, total: int) -> torch.Tensor | None:
    """The ``(batch, past + new tokens)`` 0/1 mask as bool; ``None`` when absent or all ones (nothing padded).

    Padding anywhere (left, right, holes) is honoured: a padding token is skipped by the decoding state and each
    row is computed as if alone (:meth:`AttnZooForCausalLM.forward`).
    """
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor) or mask.ndim != 2 or tuple(mask.shape) != (batch, total):
        raise ValueError(
            f"attention_mask must be a (batch, past + new tokens) = ({batch}, {total}) tensor of 0/1, got "
            f"{tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__}"
        )
    m = mask.to(torch.int64)
    if bool(((m != 0) & (m != 1)).any()):
        raise ValueError("attention_mask must hold only 0 and 1")
    return None if bool(m.all()) else m.bool()


class AttnZooPreTrainedModel(PreTrainedModel):
    """Shared ``transformers`` plumbing: the wrapped attnzoo model initialises its own weights."""

    base_model_prefix = "model"
    supports_gradient_checkpointing = False
    _no_split_modules = ["Block"]

    def _init_weights(self, module: nn.Module) -> None:  # noqa: ARG002 (transformers' hook; nothing to do)
        # attnzoo's constructors already initialise every parameter as the papers do (GPT-2 / ViT normal
        # init, each mechanism its own); transformers' generic init would overwrite that.
        return

    @classmethod
    def from_pretrained(cls, *args: Any, **kwargs: Any):
        """``transformers``' loader, then every tensor it left at an unaligned address is copied to fresh memory.

        The loader can hand out views into the safetensors file at arbitrary byte offsets; CPU matmul
        kernels take different vector paths for unaligned data and round differently, so without the copy
        a reloaded model's outputs differ from the saved model's in the last bits.
        """
        model = super().from_pretrained(*args, **kwargs)
        with torch.no_grad():
            for t in list(model.parameters()) + list(model.buffers()):
                if t.numel() and t.data_ptr() % 64:
                    t.data = t.data.clone()
        return model


class AttnZooForCausalLM(AttnZooPreTrainedModel, GenerationMixin):
    """attnzoo causal decoder (GPT-2, ToST, AoT, Fastmax GPT, any causal mechanism) as a ``transformers`` LM.

    ``forward(input_ids (B, T), labels=None, past_key_values=None, use_cache=None)`` returns
    ``CausalLMOutputWithPast`` with logits ``(B, T, vocab_size)``; ``labels`` are the inputs (shifted inside,
    ``-100`` ignored). Without a cache the whole sequence runs in parallel; with one (``use_cache=True``, as
    ``generate()`` does) tokens are fed one at a time through each mechanism's ``step`` and the returned
    :class:`RecurrentCache` continues from there.
    """

    config_class = AttnZooCausalLMConfig
    _tied_weights_keys = {"model.lm_head.weight": "model.wte.weight"}

    def __init__(self, config: AttnZooCausalLMConfig) -> None:
        super().__init__(config)
        self.model = CausalLM(config.to_attnzoo())
        if not self.model.supports_incremental:
            raise ValueError(f"attention {config.attention!r} has no token-by-token decoding (init_state/step)")
        self.post_init()

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        # the cache is a RecurrentCache built by forward, not transformers' key/value DynamicCache
        return False

    def get_input_embeddings(self) -> nn.Module:
        return self.model.wte

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.model.wte = value

    def get_output_embeddings(self) -> nn.Module:
        return self.model.lm_head

    def set_output_embeddings(self, value: nn.Module) -> None:
        self.model.lm_head = value

    def new_cache(self, batch_size: int, *, device=None, dtype=None) -> RecurrentCache:
        """An empty :class:`RecurrentCache` for ``batch_size`` sequences."""
        state = self.model.init_state(batch_size, device=device, dtype=dtype)
        return RecurrentCache(state["layers"])

    def _decode(
        self, input_ids: torch.Tensor, cache: RecurrentCache, keep: int, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """Feed ``input_ids (B, T)`` one token at a time; logits ``(B, keep, V)`` of the last ``keep`` tokens.

        Each step is :meth:`attnzoo.models.language.CausalLM.step`'s computation, so decoding equals attnzoo's own
        ``generate`` token for token. ``mask (B, T)`` (True = real, ``None``: all real): a padding token leaves its
        row's state and position unchanged and repeats the logits of the row's last real token (zeros before any),
        so a left- or right-padded prompt continues as that prompt alone.
        """
        m = self.model
        t_new = input_ids.shape[1]
        top = int(cache.row_pos.max()) if cache.row_pos is not None else cache.pos
        if m.config.pos_embed == "learned" and top + t_new > m.config.block_size:
            raise ValueError(
                f"decoding {top + t_new} tokens exceeds block_size={m.config.block_size} (learned positions "
                f"end there); generate fewer tokens or decode with use_cache=False for a sliding window"
            )
        pre = m.prefill(input_ids, attention_mask=mask) if cache.pos == 0 and t_new > 1 else None
        if pre is not None:  # the prompt through the parallel form once, its state handed to step
            logits, state = pre
            cache.layers, cache.pos = state["layers"], t_new
            if "mask" not in state:
                return logits[:, t_new - keep :]
            cache.row_pos, cache.mask = state["pos"], state["mask"]
            cache.last_logits = last_real_logits(logits, state["mask"])
            return _repeat_last_real(logits, state["mask"], t_new - keep)
        state = {"pos": cache.row_pos if cache.row_pos is not None else cache.pos, "layers": cache.layers}
        if cache.mask is not None:
            state["mask"] = cache.mask
        last = cache.last_logits
        logits = []
        for t in range(t_new):
            real = None if mask is None else mask[:, t : t + 1]
            x, state = m._step_hidden(input_ids[:, t : t + 1], state, real)
            cache.pos += 1
            if t < t_new - keep and real is None and last is None:
                continue  # no logits needed
            new = m.lm_head(m.ln_f(x))[:, 0]
            if real is not None or last is not None:
                real = real if real is not None else torch.ones_like(new[:, :1], dtype=torch.bool)
                new = torch.where(real, new, last if last is not None else torch.zeros_like(new))
                last = new
            if t >= t_new - keep:
                logits.append(new[:, None])
        cache.layers = state["layers"]
        if "mask" in state:
            cache.row_pos, cache.mask, cache.last_logits = state["pos"], state["mask"], last
        return torch.cat(logits, dim=1)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: RecurrentCache | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        logits_to_keep: int = 0,
        inputs_embeds: torch.Tensor | None = None,
        cache: RecurrentCache | None = None,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast | tuple:
        """``input_ids (B, T)`` -> logits ``(B, T, V)`` (the last ``logits_to_keep`` positions when > 0).

        The decoding cache comes as ``cache`` (transformers >= 5.24) or ``past_key_values`` (its earlier name)."""
        if cache is not None:
            if past_key_values is not None:
                raise ValueError("pass the decoding cache once, as cache= or past_key_values=, not both")
            past_key_values = cache
        position_ids = kwargs.pop("position_ids", None)
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        self._check_inputs(input_ids, inputs_embeds, past_key_values, logits_to_keep, kwargs)
        return_dict = self.config.return_dict if return_dict is None else return_dict
        b, t = input_ids.shape
        if use_cache is None:
            use_cache = past_key_values is not None
        past = past_key_values.pos if past_key_values is not None else 0
        if position_ids is not None:
            expected = torch.arange(past, past + t, device=input_ids.device).expand(b, -1)
            if tuple(position_ids.shape) != (b, t) or not torch.equal(position_ids.to(expected.device), expected):
                raise ValueError("position_ids must be the default 0..T-1 after the cache; attnzoo takes no others")
        mask = _check_attention_mask(attention_mask, b, past + t)

        keep = t if logits_to_keep == 0 else min(logits_to_keep, t)
        hidden_states = None
        if use_cache:
            if output_hidden_states:
                raise ValueError("output_hidden_states needs the parallel forward; pass use_cache=False")
            cache = past_key_values if past_key_values is not None else self.new_cache(b, device=input_ids.device)
            logits = self._decode(input_ids, cache, keep, None if mask is None else mask[:, past:])
        else:
            if past_key_values is not None:
                raise ValueError("past_key_values was given with use_cache=False; pass use_cache=True to extend it")
            cache = None
            logits, hidden_states = self._parallel(input_ids, keep, bool(output_hidden_states), mask)
        loss = None if labels is None else _next_token_loss(logits, labels, input_ids, keep, num_items_in_batch)
        if not return_dict:
            out = (logits, cache) if cache is not None else (logits,)
            return ((loss,) + out) if loss is not None else out
        return CausalLMOutputWithPast(loss=loss, logits=logits, hidden_states=hidden_states, **{_OUTPUT_CACHE: cache})

    def _check_inputs(
        self,
        input_ids: torch.LongTensor | None,
        inputs_embeds: torch.Tensor | None,
        past_key_values: Any,
        logits_to_keep: Any,
        kwargs: dict[str, Any],
    ) -> None:
        """Refuse, with the reason, what ``transformers`` may pass but attnzoo does not support."""
        from attnzoo.models.language import check_token_ids

        if inputs_embeds is not None:
            raise ValueError("inputs_embeds is not supported by attnzoo models; pass input_ids")
        if input_ids is None:
            raise ValueError("input_ids (B, T) is required")
        if kwargs.pop("output_attentions", None):
            raise ValueError("output_attentions is not supported; use attnzoo.capture_internals(model) instead")
        unexpected = sorted(k for k, v in kwargs.items() if v is not None)
        if unexpected:
            raise TypeError(f"unexpected arguments {unexpected} for {type(self).__name__}.forward")
        check_token_ids("input_ids", input_ids, self.config.vocab_size, None)
        if not isinstance(logits_to_keep, int) or logits_to_keep < 0:
            raise ValueError(f"logits_to_keep must be a non-negative int, got {logits_to_keep!r}")
        if past_key_values is not None and not isinstance(past_key_values, RecurrentCache):
            raise TypeError(
                f"past_key_values must be the RecurrentCache an AttnZooForCausalLM returned, got "
                f"{type(past_key_values).__name__}"
            )

    def _parallel(
        self, input_ids: torch.Tensor, keep: int, output_hidden_states: bool, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
        """The whole of ``input_ids (B, T)`` at once: logits ``(B, keep, V)`` of the last ``keep`` positions and,
        when asked, the hidden states ``(B, T, D)`` after the embedding and after each block.

        ``mask (B, T)`` (True = real): positions restart at each row's first real token and the mixers get the mask
        (an error for a mechanism that cannot honour it) unless the padding only trails the real tokens, which a
        causal model needs no mask for; a padding position repeats the logits of its row's last real token."""
        from attnzoo.models.language import check_token_ids

        m = self.model
        t = input_ids.shape[1]
        check_token_ids("input_ids", input_ids, m.config.vocab_size, m.config.block_size)
        trailing = mask is None or not bool((mask[:, 1:] & ~mask[:, :-1]).any())  # no 0 before a 1
        layer_mask = None if trailing else mask
        seg = segments(*input_ids.shape, attention_mask=layer_mask, device=input_ids.device)
        x = m._embed(input_ids, 0 if seg is None else seg.pos)
        states = [x] if output_hidden_states else None
        for blk in m.blocks:
            x = blk(x, attention_mask=layer_mask)
            if states is not None:
                states.append(x)
        x = m.ln_f(x)
        hidden_states = None
        if states is not None:
            states[-1] = x  # transformers' convention: the last entry is after the final norm
            hidden_states = tuple(states)
        if mask is None:
            return m.lm_head(x[:, t - keep :]), hidden_states
        idx = _last_real_index(mask, t - keep)
        logits = m.lm_head(x.gather(1, idx.clamp_min(0)[..., None].expand(-1, -1, x.shape[-1])))
        return torch.where(idx[..., None] >= 0, logits, torch.zeros_like(logits)), hidden_states

    def prepare_inputs_for_generation(self, input_ids, past_key_values=None, cache=None, **kwargs):
        # position ids are implied by the cache; attnzoo computes its own positions
        kwargs.pop("position_ids", None)
        kwargs[_GENERATE_CACHE_ARG] = cache if cache is not None else past_key_values
        return super().prepare_inputs_for_generation(input_ids, **kwargs)


def _last_real_index(mask: torch.Tensor, start: int) -> torch.Tensor:
    """``(B, T - start)``: for each position from ``start`` on, the index of its row's last real token so far in
    ``mask (B, T)`` (-1 before the first); its logits stand for the padding positions."""
    t = mask.shape[1]
    return torch.where(mask, torch.arange(t, device=mask.device), -1).cummax(dim=1).values[:, start:]


def _repeat_last_real(logits: torch.Tensor, mask: torch.Tensor, start: int) -> torch.Tensor:
    """The logits ``(B, T, V)`` of positions ``start..T-1``, each padding position's replaced by its row's last real
    logits so far (zeros before any), as :meth:`AttnZooForCausalLM._parallel` gives them."""
    idx = _last_real_index(mask, start)
    got = logits.gather(1, idx.clamp_min(0)[..., None].expand(-1, -1, logits.shape[-1]))
    return torch.where(idx[..., None] >= 0, got, torch.zeros_like(got))


def _next_token_loss(
    logits: torch.Tensor, labels: torch.Tensor, input_ids: torch.Tensor, keep: int, num_items_in_batch: Any
) -> torch.Tensor:
    """Cross-entropy of ``logits (B, T, V)`` at position i against ``labels[:, i + 1]`` (``-100`` ignored), as
    ``transformers`` does with ``labels = input_ids``; summed over ``num_items_in_batch`` when given."""
    t = input_ids.shape[1]
    if keep != t:
        raise ValueError("labels need the logits of every position; leave logits_to_keep=0")
    if not isinstance(labels, torch.Tensor) or labels.shape != input_ids.shape:
        raise ValueError(f"labels must have the shape of input_ids {tuple(input_ids.shape)}")
    shift_logits = logits[:, :-1].flatten(0, 1).float()
    shift_labels = labels[:, 1:].flatten().to(logits.device)
    if num_items_in_batch is None:
        return F.cross_entropy(shift_logits, shift_labels, ignore_index=-100)
    loss = F.cross_entropy(shift_logits, shift_labels, ignore_index=-100, reduction="sum")
    return loss / torch.as_tensor(num_items_in_batch, device=loss.device)


class AttnZooForImageClassification(AttnZooPreTrainedModel):
    """attnzoo vision classifier (ViT/DeiT, XCiT, ToST, CRATE, CBT, AoT, CSP-ViT) as a ``transformers`` model.

    ``forward(pixel_values (B, C, H, W), labels=None)`` returns ``ImageClassifierOutput`` with logits
    ``(B, num_labels)``; the loss follows ``config.problem_type`` as in ``transformers``' classifiers.
    """

    config_class = AttnZooVisionConfig
    main_input_name = "pixel_values"

    def __init__(self, config: AttnZooVisionConfig) -> None:
        super().__init__(config)
        self.model = VisionTransformer(config.to_attnzoo())
        self.post_init()

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> ImageClassifierOutput | tuple:
        """``pixel_values (B, in_chans, image_size, image_size)`` -> logits ``(B, num_labels)``."""
        if pixel_values is None:
            raise ValueError("pixel_values (B, C, H, W) is required")
        kwargs.pop("num_items_in_batch", None)
        if kwargs.pop("output_attentions", None):
            raise ValueError("output_attentions is not supported; use attnzoo.capture_internals(model) instead")
        if kwargs:
            raise TypeError(f"unexpected arguments {sorted(kwargs)}")
        return_dict = self.config.return_dict if return_dict is None else return_dict
        hidden_states = None
        if output_hidden_states:
            states: list[torch.Tensor] = []
            hooks = [blk.register_forward_hook(lambda _m, _i, o: states.append(o)) for blk in self.model.blocks]
            try:
                logits = self.model(pixel_values)
            finally:
                for h in hooks:
                    h.remove()
            hidden_states = tuple(states)
        else:
            logits = self.model(pixel_values)
        loss = None
        if labels is not None:
            loss = self.loss_function(labels, logits, self.config)
        if not return_dict:
            return (loss, logits) if loss is not None else (logits,)
        return ImageClassifierOutput(loss=loss, logits=logits, hidden_states=hidden_states)

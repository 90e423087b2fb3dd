"""Language-model data for adaptation: offline text tokenised by the pretrained model's own tokenizer.

Training text and held-out text never overlap: Shakespeare splits by play (Hamlet, The Tempest, Twelfth Night and
the Sonnets held out, as in :mod:`attnzoo.data.text`), IMDB by review (the last 5% held out).
"""

from __future__ import annotations

import math
import time
from typing import Callable

import torch
from torch import nn

__all__ = ["TEXT_SOURCES", "load_text_split", "token_stream", "window_batches", "perplexity", "generation_speed"]

#: the offline corpora ``attnzoo adapt --data`` takes
TEXT_SOURCES = ("shakespeare", "imdb")


def load_text_split(source: str) -> tuple[str, str]:
    """``(train_text, held_out_text)`` of an offline corpus (:data:`TEXT_SOURCES`)."""
    if source == "shakespeare":
        from attnzoo.data.text import load_shakespeare

        train, val = load_shakespeare()
        return "\n\n".join(train[k] for k in sorted(train)), "\n\n".join(val[k] for k in sorted(val))
    if source == "imdb":
        from attnzoo.data.text import load_imdb

        texts, _ = load_imdb()
        cut = len(texts) - max(1, len(texts) // 20)
        return "\n\n".join(texts[:cut]), "\n\n".join(texts[cut:])
    raise ValueError(f"unknown text source {source!r}; valid sources: {list(TEXT_SOURCES)}")


def token_stream(tokenizer, text: str, max_tokens: int, vocab_size: int) -> torch.Tensor:
    """The first ``max_tokens`` token ids ``(T,)`` of ``text``; an id outside the model's vocabulary is an error (the
    tokenizer does not belong to the model)."""
    # tokenise a prefix only: about 6 characters per token leaves a margin for English text
    ids = tokenizer(text[: max(max_tokens * 8, 1024)], add_special_tokens=False).input_ids
    ids = torch.tensor(ids[:max_tokens], dtype=torch.long)
    if ids.numel() and int(ids.max()) >= vocab_size:
        raise ValueError(
            f"the tokenizer gives token id {int(ids.max())} but the model's vocabulary has {vocab_size} entries: the "
            f"tokenizer does not belong to this model"
        )
    return ids


def window_batches(tokens: torch.Tensor, block: int, batch: int, seed: int) -> Callable[[int], dict]:
    """``batches(step)``: ``batch`` windows of ``block`` tokens at offsets drawn from ``(seed, step)`` only, as
    ``{"input_ids", "labels"}`` (``transformers`` shifts the labels)."""
    if tokens.numel() <= block:
        raise ValueError(f"the training text has {tokens.numel()} tokens, fewer than one block of {block}")

    def batches(step: int) -> dict:
        g = torch.Generator().manual_seed(seed * 1_000_003 + step)
        starts = torch.randint(0, tokens.numel() - block + 1, (batch,), generator=g)
        x = torch.stack([tokens[s : s + block] for s in starts.tolist()])
        return {"input_ids": x, "labels": x}

    return batches


@torch.no_grad()
def perplexity(model: nn.Module, tokens: torch.Tensor, block: int) -> dict[str, float]:
    """Perplexity ``exp(mean NLL)`` of ``model`` on ``tokens (T,)`` in disjoint windows of ``block`` tokens (each
    window predicts its tokens after the first from the ones before it)."""
    total, count = 0.0, 0
    tokens = tokens.to(next(model.parameters()).device)
    for s in range(0, tokens.numel() - 1, block):
        x = tokens[s : s + block + 1][None]
        if x.shape[1] < 2:
            break
        logits = model(input_ids=x[:, :-1]).logits
        nll = nn.functional.cross_entropy(logits[0].float(), x[0, 1:], reduction="sum")
        total += float(nll)
        count += x.shape[1] - 1
    loss = total / max(count, 1)
    return {"loss": loss, "perplexity": math.exp(loss)}


class _TokenClock:
    """A ``transformers`` streamer that only notes when each batch of tokens arrives: the prompt first, then every
    new token, so one ``generate`` call gives both the time to the first token and the decoding rate after it."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, _value) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


@torch.no_grad()
def generation_speed(
    model: nn.Module, tokens: torch.Tensor, contexts: list[int], new_tokens: int = 16
) -> list[dict[str, float]]:
    """Greedy generation speed of a ``transformers`` causal LM after prompts of each length in ``contexts`` (taken
    from ``tokens (T,)``): ``{"context", "prefill_s"`` (the prompt and first token), ``"decode_s_per_token"`` and
    ``"decode_tokens_per_s"`` (the mean over the ``new_tokens - 1`` tokens after it)``}``, one run each after a
    one-token warm-up. Both come from the one
    ``generate`` call's token times (a streamer), not from the difference of two calls, which the machine's noise
    can make negative."""
    if new_tokens < 2:
        raise ValueError(f"new_tokens must be >= 2 (a prefill and at least one decoded token), got {new_tokens}")
    bad = [c for c in contexts if not 1 <= c <= tokens.numel()]
    if bad:
        raise ValueError(f"contexts {bad} are not in [1, {tokens.numel()}] (the tokens given)")
    was = model.training
    model.eval()
    device = next(model.parameters()).device
    kw = dict(do_sample=False, pad_token_id=0)
    model.generate(tokens[None, :1].to(device), max_new_tokens=1, min_new_tokens=1, **kw)
    out = []
    for c in contexts:
        clock = _TokenClock()
        t0 = time.perf_counter()
        model.generate(
            tokens[None, :c].to(device), max_new_tokens=new_tokens, min_new_tokens=new_tokens, streamer=clock, **kw
        )
        first, last = clock.times[1], clock.times[-1]  # times[0]: the prompt, handed over before any work
        decoded = len(clock.times) - 2
        per_token = (last - first) / decoded
        out.append(
            {
                "context": c,
                "prefill_s": first - t0,
                "decode_s_per_token": per_token,
                "decode_tokens_per_s": 1 / per_token,
            }
        )
    model.train(was)
    return out

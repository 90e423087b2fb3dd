"""How ``attnzoo selftest`` exercises linear attention (:class:`~attnzoo.ops._spec.CheckCase`)."""

from __future__ import annotations

import torch

from attnzoo.ops._selftest_inputs import qkv, shapes
from attnzoo.ops._spec import CheckCase


def _configs(quick: bool) -> list[dict]:
    # chunk_size=5: many (and ragged) chunks of the causal scan at small N; max_n keeps that sweep short
    maps = ("elu",) if quick else ("elu", "relu")
    cfgs = [dict(causal=c, feature_map=f) for c in (False, True) for f in maps]
    return cfgs + ([] if quick else [dict(causal=True, feature_map="elu", chunk_size=5, max_n=130)])


def _call(x: dict[str, torch.Tensor], cfg: dict, backend: str) -> torch.Tensor:
    # imported when called: a test may replace the op's functions in their module
    from attnzoo.ops.linear import linear_attention

    return linear_attention(
        x["q"],
        x["k"],
        x["v"],
        causal=cfg["causal"],
        feature_map=cfg["feature_map"],
        chunk_size=cfg.get("chunk_size"),
        backend=backend,
    )


def _step(x: dict[str, torch.Tensor], cfg: dict) -> torch.Tensor:
    from attnzoo.ops.linear import linear_attention_recurrent

    state, outs = None, []
    for t in range(x["q"].shape[2]):
        o, state = linear_attention_recurrent(
            *(x[k][:, :, t : t + 1] for k in "qkv"), state, feature_map=cfg["feature_map"]
        )
        outs.append(o)
    return torch.cat(outs, dim=2)


CASES = (CheckCase("linear", qkv, _call, ("q", "k", "v"), _configs, shapes, {"q": 2, "k": 2, "v": 2}, _step),)

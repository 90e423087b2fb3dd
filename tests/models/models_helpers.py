"""Tiny-size overrides for the registered models, so every architecture runs in milliseconds on CPU.

(A uniquely named helper module rather than conftest.py, so that ``from models_helpers import ...`` never
resolves to another directory's conftest when the whole suite runs.)
"""

import torch

from attnzoo.models import get_config

TINY_VISION = dict(image_size=16, patch_size=2, dim=32, heads=4, depth=2, num_classes=5, class_attention_layers=1)
TINY_LM = dict(vocab_size=50, block_size=16, dim=32, heads=4, depth=2)
TINY_SEQ = dict(vocab_size=20, max_len=24, dim=32, heads=4, depth=2, mlp_dim=48)
TINY_ICL = dict(n_dims=5, max_points=6, dim=32, heads=4, depth=2)
TINY_SEGMENTER = dict(TINY_VISION, num_classes=3, decoder_depth=1)
TINY = {
    "vision": TINY_VISION,
    "causal_lm": TINY_LM,
    "sequence_classifier": TINY_SEQ,
    "icl_regressor": TINY_ICL,
    "segmenter": TINY_SEGMENTER,
}


def tiny_overrides(name: str, **extra) -> dict:
    """Overrides that shrink a registered model while keeping its architecture (mechanisms, layouts)."""
    cfg = get_config(name)
    over = dict(TINY[cfg.arch])
    if cfg.ffn_layers is not None:
        over["ffn_layers"] = 1  # the first half of 2 blocks, as Hybrid's first half of 12
    if cfg.second_attention is not None and cfg.second_attention_from is not None:
        over["second_attention_from"] = 1
    if cfg.mlp_dim is not None and cfg.arch == "vision":
        over["mlp_dim"] = 48
    if cfg.attention == "csp" and cfg.arch == "vision":
        over["attention_options"] = dict(cfg.attention_options, groups=8)  # 64 tokens in groups of 8
    if cfg.attention == "mega" and cfg.attention_options.get("csp_groups"):
        # CSP's groups must divide the tiny length: keep the model's group size (N / K tokens) where it fits
        n = over.get("max_len", cfg.max_len)
        k = cfg.attention_options["csp_groups"]
        over["attention_options"] = dict(cfg.attention_options, csp_groups=max(1, n * k // cfg.max_len))
    over.update(extra)
    return over


def example_input(cfg, batch: int = 2, n: int | None = None, generator=None):
    """A valid input tuple for a model of config ``cfg`` (token counts default to the maximum)."""
    g = generator
    if cfg.arch in ("vision", "segmenter"):
        return (torch.randn(batch, cfg.in_chans, cfg.image_size, cfg.image_size, generator=g),)
    if cfg.arch == "causal_lm":
        n = cfg.block_size if n is None else n
        return (torch.randint(0, cfg.vocab_size, (batch, n), generator=g),)
    if cfg.arch == "sequence_classifier":
        n = cfg.max_len if n is None else n
        a = torch.randint(0, cfg.vocab_size, (batch, n), generator=g)
        if cfg.dual:
            return (a, torch.randint(0, cfg.vocab_size, (batch, n), generator=g))
        return (a,)
    if cfg.arch == "icl_regressor":
        n = cfg.max_points if n is None else n
        return (torch.randn(batch, n, cfg.n_dims, generator=g), torch.randn(batch, n, generator=g))
    raise AssertionError(cfg.arch)


def expected_shape(cfg, batch: int, n: int | None = None) -> tuple:
    """The documented output shape of each architecture."""
    if cfg.arch == "vision":
        return (batch, cfg.num_classes)
    if cfg.arch == "causal_lm":
        return (batch, cfg.block_size if n is None else n, cfg.vocab_size)
    if cfg.arch == "sequence_classifier":
        return (batch, cfg.num_classes)
    if cfg.arch == "icl_regressor":
        return (batch, cfg.max_points if n is None else n)
    if cfg.arch == "segmenter":
        return (batch, cfg.num_classes, cfg.image_size, cfg.image_size)
    raise AssertionError(cfg.arch)

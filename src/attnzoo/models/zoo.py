"""The papers' configurations, registered by name.

Parameter figures are the papers' own; ``tests/models/test_param_counts.py`` checks every one (within 5%)
on the meta device. Where a figure needs a convention to be met (binary millions, nanoGPT's
"non-embedding" count) or cannot be met, the entry's ``note`` and the comment beside it say why.
"""

from __future__ import annotations

from attnzoo.models._registry import register_model
from attnzoo.models.config import CausalLMConfig, ICLConfig, SequenceClassifierConfig, VisionConfig
from attnzoo.models.segmenter import SegmenterConfig

MIB = 2.0**20  # some ToST Table 2/5 figures are in units of 2^20 parameters, see below

# ---------------------------------------------------------------------------------------------------
# ViT / DeiT (ToST Table 5 baselines; CBSA Table 3 ViT-S)
# ---------------------------------------------------------------------------------------------------


def _vit(dim: int, depth: int, heads: int, **kw) -> VisionConfig:
    base = dict(
        dim=dim,
        depth=depth,
        heads=heads,
        attention="softmax",
        patch_embed="linear",
        pos_embed="learned",
        pool="cls",
        ffn="mlp",
        mlp_ratio=4.0,
        norm="pre",
    )
    base.update(kw)
    return VisionConfig(**base)


@register_model(
    "vit_s", paper="DeiT-S (Touvron et al. 2021) as in ToST Table 5 / CBSA Table 3", paper_params=22.1, tags=("vision",)
)
def vit_s() -> VisionConfig:
    return _vit(384, 12, 6)


@register_model("vit_b", paper="DeiT-B (Touvron et al. 2021) as in ToST Table 5", paper_params=86.6, tags=("vision",))
def vit_b() -> VisionConfig:
    return _vit(768, 12, 12)


# ---------------------------------------------------------------------------------------------------
# XCiT without LPI and ToST (ToST Tables 2/5, App. C.2): XCiT skeleton, convolutional patch embedding,
# Fourier positional encoding on the patch tokens, LayerScale, two class-attention layers over a CLS
# token appended after the blocks. LayerScale init follows XCiT: 1.0 for 12-layer, 1e-5 for 24-layer models.
# Where the paper is silent the authors' code (tost_vision/tost.py, built on XCiT's) decides: every model
# there has LayerNorm eps 1e-6 (norm_layer=partial(nn.LayerNorm, eps=1e-6), ToST and XCiT alike) and
# qkv_bias=True, which for TSSA is a bias on its one dim x dim projection (+ dim per layer; XCA's qkv
# already has its bias).
#
# Units: ToST-T/S (5.8M, 22.6M) match our counts in 10^6, but ToST-M, XCiT-S and XCiT-M (68.1M, 24.9M,
# 80.2M) are our counts in units of 2^20 (71.48e6 / 2^20 = 68.17, 26.14e6 / 2^20 = 24.93,
# 84.09e6 / 2^20 = 80.19): the table mixes units. In 10^6 these three are 4.85-4.97% above the figures.
# ---------------------------------------------------------------------------------------------------


def _xcit_skeleton(dim: int, depth: int, heads: int, attention: str, **kw) -> VisionConfig:
    base = dict(
        dim=dim,
        depth=depth,
        heads=heads,
        attention=attention,
        patch_embed="conv",
        pos_embed="fourier",
        pool="class_attention",
        class_attention_layers=2,
        ffn="mlp",
        mlp_ratio=4.0,
        norm="pre",
        layerscale=1.0 if depth <= 12 else 1e-5,
        norm_eps=1e-6,
    )
    base.update(kw)
    return VisionConfig(**base)


#: TSSA options of the authors' ToST models (qkv_bias=True in every tost_* constructor of their code)
_TOST_TSSA = {"qkv_bias": True}


@register_model("tost_t", paper="ToST Table 5 (ToST-T)", paper_params=5.8, tags=("vision",))
def tost_t() -> VisionConfig:
    return _xcit_skeleton(192, 12, 4, "tssa", attention_options=_TOST_TSSA)


@register_model("tost_s", paper="ToST Table 5 (ToST-S)", paper_params=22.6, tags=("vision",))
def tost_s() -> VisionConfig:
    return _xcit_skeleton(384, 12, 8, "tssa", attention_options=_TOST_TSSA)


@register_model(
    "tost_m",
    paper="ToST Table 5 (ToST-M)",
    paper_params=68.1,
    paper_params_unit=MIB,
    note="= 71.5M; Table 5 mixes 10^6 and 2^20 units",
    tags=("vision",),
)
def tost_m() -> VisionConfig:
    return _xcit_skeleton(512, 24, 8, "tssa", attention_options=_TOST_TSSA)


@register_model(
    "xcit_s",
    paper="ToST Table 5 (XCiT-S12/16 without LPI)",
    paper_params=24.9,
    paper_params_unit=MIB,
    note="= 26.1M; Table 5 mixes 10^6 and 2^20 units",
    tags=("vision",),
)
def xcit_s() -> VisionConfig:
    return _xcit_skeleton(384, 12, 8, "xca")


@register_model(
    "xcit_m",
    paper="ToST Table 5 (XCiT-M24/16 without LPI)",
    paper_params=80.2,
    paper_params_unit=MIB,
    note="= 84.1M; Table 5 mixes 10^6 and 2^20 units",
    tags=("vision",),
)
def xcit_m() -> VisionConfig:
    return _xcit_skeleton(512, 24, 8, "xca")


# ---------------------------------------------------------------------------------------------------
# CRATE (Yu et al. 2023): MSSA + ISTA, Z <- ISTA(LN(Z + MSSA(LN(Z)))), linear patch embedding with
# LayerNorms, learned positions, CLS token, LayerNorm + linear head. Sizes of CRATE Table 1
# (T 384/12/6, S 576/12/12, B 768/12/12, L 1024/24/16); B and L figures are CBSA Table 3's.
# ---------------------------------------------------------------------------------------------------


def _crate(dim: int, depth: int, heads: int, **kw) -> VisionConfig:
    base = dict(
        dim=dim,
        depth=depth,
        heads=heads,
        attention="mssa",
        patch_embed="linear_ln",
        pos_embed="learned",
        pool="cls",
        ffn="ista",
        norm="pre",
        ista_step=0.1,
        ista_lambda=0.1,
    )
    base.update(kw)
    return VisionConfig(**base)


@register_model("crate_t", paper="CRATE-T (Yu et al. 2023, Table 1)", paper_params=6.09, tags=("vision",))
def crate_t() -> VisionConfig:
    return _crate(384, 12, 6)


@register_model("crate_s", paper="CRATE-S (Yu et al. 2023, Table 1)", paper_params=13.12, tags=("vision",))
def crate_s() -> VisionConfig:
    return _crate(576, 12, 12)


@register_model("crate_b", paper="CBSA Table 3 (CRATE-B)", paper_params=22.8, tags=("vision",))
def crate_b() -> VisionConfig:
    return _crate(768, 12, 12)


@register_model("crate_l", paper="CBSA Table 3 (CRATE-L)", paper_params=77.6, tags=("vision",))
def crate_l() -> VisionConfig:
    return _crate(1024, 24, 16)


# ---------------------------------------------------------------------------------------------------
# CBT (CBSA Table 3): CBSA + ISTA on the CRATE skeleton with the convolutional embedding. The paper gives
# head size m = p = d/H = 64 (App. A) and the counts, not the widths; widths/depths below are the
# ViT-family sizes (T 192/12/3, S 384/12/6, B 768/12/12, L 1024/24/16) whose counts reproduce Table 3
# (1.79M, 6.67M, 25.69M, 83.05M) with XCiT's convolutional stem.
# ---------------------------------------------------------------------------------------------------


def _cbt(dim: int, depth: int, heads: int, **kw) -> VisionConfig:
    base = dict(attention="cbsa", patch_embed="conv")
    base.update(kw)
    return _crate(dim, depth, heads, **base)


@register_model("cbt_t", paper="CBSA Table 3 (CBT-T)", paper_params=1.8, tags=("vision",))
def cbt_t() -> VisionConfig:
    return _cbt(192, 12, 3)


@register_model("cbt_s", paper="CBSA Table 3 (CBT-S)", paper_params=6.7, tags=("vision",))
def cbt_s() -> VisionConfig:
    return _cbt(384, 12, 6)


@register_model("cbt_b", paper="CBSA Table 3 (CBT-B)", paper_params=25.7, tags=("vision",))
def cbt_b() -> VisionConfig:
    return _cbt(768, 12, 12)


@register_model("cbt_l", paper="CBSA Table 3 (CBT-L)", paper_params=83.1, tags=("vision",))
def cbt_l() -> VisionConfig:
    return _cbt(1024, 24, 16)


# CRATE+CBT hybrid (CBSA §4.1, Tables 5/6): first half of the attention layers MSSA, second half CBSA,
# on the CBT skeleton. No parameter figure in the paper.
@register_model("crate_cbt_t", paper="CBSA §4.1 (CRATE+CBT)", tags=("vision",))
def crate_cbt_t() -> VisionConfig:
    return _cbt(192, 12, 3, attention="mssa", second_attention="cbsa")


@register_model("crate_cbt_s", paper="CBSA §4.1, Tables 5/6 ((CRATE+CBT)-S)", tags=("vision",))
def crate_cbt_s() -> VisionConfig:
    return _cbt(384, 12, 6, attention="mssa", second_attention="cbsa")


# ---------------------------------------------------------------------------------------------------
# Segmentation decoders (CBSA Fig. 8): a ViT-S encoder (DeiT-S, as ``vit_s``) under a 2-layer decoder, either
# Segmenter's softmax mask transformer (Strudel et al. 2021, the paper's baseline) or CBSA layers without
# feed-forward. ADE20K's 150 classes; ``num_classes`` is overridden by the task. No parameter figure in the paper.
# ---------------------------------------------------------------------------------------------------


def _vit_segmenter(decoder: str) -> SegmenterConfig:
    fields = {
        f: getattr(vit_s(), f) for f in ("dim", "depth", "heads", "attention", "patch_embed", "pos_embed", "pool")
    }
    return SegmenterConfig(**fields, mlp_ratio=4.0, norm="pre", ffn="mlp", num_classes=150, decoder=decoder)


@register_model("segmenter_vit_s", paper="CBSA Fig. 8 (Segmenter's mask transformer on ViT-S)", tags=("segmentation",))
def segmenter_vit_s() -> SegmenterConfig:
    return _vit_segmenter("mask_transformer")


@register_model(
    "cbsa_decoder_vit_s", paper="CBSA Fig. 8 (CBSA decoder, no feed-forward, on ViT-S)", tags=("segmentation",)
)
def cbsa_decoder_vit_s() -> SegmenterConfig:
    return _vit_segmenter("cbsa")


# ---------------------------------------------------------------------------------------------------
# AoT vision (AoT Table 2, §4.2): MSSA + skip only (no LayerNorm, no MLP), CRATE's pre-processing and
# head. The paper gives depth and counts only; widths are ViT-B/L/H's (768, 1024, 1280).
# ---------------------------------------------------------------------------------------------------


def _aot_vision(dim: int, depth: int, heads: int, head_dim: int | None = None) -> VisionConfig:
    options = {} if head_dim is None else {"head_dim": head_dim}
    return VisionConfig(
        dim=dim,
        depth=depth,
        heads=heads,
        attention="mssa",
        attention_options=options,
        patch_embed="linear_ln",
        pos_embed="learned",
        pool="cls",
        ffn="none",
        norm="none",
        final_norm=True,
    )


@register_model("aot_vision_b", paper="AoT Table 2 (AoT-Base)", paper_params=16.0, tags=("vision",))
def aot_vision_b() -> VisionConfig:
    return _aot_vision(768, 12, 12)


@register_model("aot_vision_l", paper="AoT Table 2 (AoT-Large)", paper_params=52.0, tags=("vision",))
def aot_vision_l() -> VisionConfig:
    return _aot_vision(1024, 24, 16)


# AoT-Huge: 16 subspaces of CRATE's dim_head = 64 (1024-dim inner width at width 1280); with
# dim // heads = 80 the same model would have 107.4M parameters instead of the paper's 86M.
@register_model("aot_vision_h", paper="AoT Table 2 (AoT-Huge)", paper_params=86.0, tags=("vision",))
def aot_vision_h() -> VisionConfig:
    return _aot_vision(1280, 32, 16, head_dim=64)


# ---------------------------------------------------------------------------------------------------
# CSP-ViT (CSP Table 3 / Table 5, CIFAR-10): vit-pytorch ViT, 32x32 images, 4x4 patches (N = 64),
# width 512, 6 layers, MLP 512, mean pooling, K = 32 groups, linear shifts. Table 3: 9.52M with MHA,
# 6.38M with CSP (Table 5 says 6.46M for the same model; we test Table 3).
# ---------------------------------------------------------------------------------------------------


def _cifar_vit(attention: str, options: dict) -> VisionConfig:
    return VisionConfig(
        image_size=32,
        patch_size=4,
        num_classes=10,
        dim=512,
        depth=6,
        heads=8,
        mlp_dim=512,
        attention=attention,
        attention_options=options,
        patch_embed="linear_ln",
        pos_embed="learned",
        pool="mean",
        ffn="mlp",
        norm="pre",
        dropout=0.1,
    )


@register_model("csp_vit_cifar", paper="CSP Table 3 (ViT + CSP, CIFAR-10)", paper_params=6.38, tags=("vision",))
def csp_vit_cifar() -> VisionConfig:
    return _cifar_vit("csp", {"groups": 32, "shift_schedule": "linear"})


@register_model("vit_cifar", paper="CSP Table 3 (ViT + MHA, CIFAR-10)", paper_params=9.52, tags=("vision",))
def vit_cifar() -> VisionConfig:
    return _cifar_vit("softmax", {})


# ---------------------------------------------------------------------------------------------------
# Causal language models (nanoGPT layout, GPT-2 vocabulary 50257, context 1024, tied embeddings).
# ---------------------------------------------------------------------------------------------------


def _gpt(dim: int, depth: int, heads: int, **kw) -> CausalLMConfig:
    base = dict(
        dim=dim,
        depth=depth,
        heads=heads,
        vocab_size=50257,
        block_size=1024,
        attention="softmax",
        ffn="mlp",
        mlp_ratio=4.0,
        norm="pre",
    )
    base.update(kw)
    return CausalLMConfig(**base)


@register_model(
    "gpt2_base",
    paper="GPT-2 (Radford et al. 2019) as in ToST Table 4 / AoT Table 1",
    paper_params=124.0,
    tags=("language",),
)
def gpt2_base() -> CausalLMConfig:
    return _gpt(768, 12, 12)


# ToST Table 6: causal TSSA (App. B, Alg. 2) with its learned (heads, max_len) position bias, GPT-2 MLPs.
@register_model("tost_gpt_base", paper="ToST Tables 4/6 (ToST-Base)", paper_params=110.0, tags=("language",))
def tost_gpt_base() -> CausalLMConfig:
    return _gpt(768, 12, 12, attention="tssa")


@register_model("tost_gpt_medium", paper="ToST Tables 4/6 (ToST-Medium)", paper_params=304.0, tags=("language",))
def tost_gpt_medium() -> CausalLMConfig:
    return _gpt(1024, 24, 16, attention="tssa")


@register_model("tost_gpt_large", paper="ToST Tables 4/6 (ToST-Large)", paper_params=655.0, tags=("language",))
def tost_gpt_large() -> CausalLMConfig:
    return _gpt(1280, 36, 20, attention="tssa")


# AoT §4.1 / Table 1: causal MSSA with normalised queries, LayerNorm before each MSSA, no MLP.
# The paper gives counts, not shapes. Base/Medium/Large are GPT-2 Medium/Large/XL shapes without MLPs
# (1024/24, 1280/36, 1600/48); Hybrid and Full-MLP are GPT-2 Base shapes (768/12) with MLPs in the first
# half / all blocks. Table 1's figures are nanoGPT's printed count, which leaves out the position
# embedding (``get_num_params(non_embedding=True)``); with that convention all five match within 1.1%.
_AOT_MSSA = {"normalize_query": True}


@register_model(
    "aot_gpt_base", paper="AoT Table 1 (Base)", paper_params=102.0, tags=("language",), count_excludes=("wpe.",)
)
def aot_gpt_base() -> CausalLMConfig:
    return _gpt(1024, 24, 16, attention="mssa", attention_options=_AOT_MSSA, ffn="none")


@register_model(
    "aot_gpt_medium", paper="AoT Table 1 (Medium)", paper_params=182.0, tags=("language",), count_excludes=("wpe.",)
)
def aot_gpt_medium() -> CausalLMConfig:
    return _gpt(1280, 36, 20, attention="mssa", attention_options=_AOT_MSSA, ffn="none")


@register_model(
    "aot_gpt_large", paper="AoT Table 1 (Large)", paper_params=326.0, tags=("language",), count_excludes=("wpe.",)
)
def aot_gpt_large() -> CausalLMConfig:
    return _gpt(1600, 48, 25, attention="mssa", attention_options=_AOT_MSSA, ffn="none")


@register_model(
    "aot_gpt_hybrid",
    paper="AoT §4.1, Table 1 (Hybrid)",
    paper_params=81.0,
    tags=("language",),
    count_excludes=("wpe.",),
)
def aot_gpt_hybrid() -> CausalLMConfig:
    return _gpt(768, 12, 12, attention="mssa", attention_options=_AOT_MSSA, ffn="mlp", ffn_layers=6)


@register_model(
    "aot_gpt_full_mlp",
    paper="AoT §4.1, Table 1 (Full MLP)",
    paper_params=109.0,
    tags=("language",),
    count_excludes=("wpe.",),
)
def aot_gpt_full_mlp() -> CausalLMConfig:
    return _gpt(768, 12, 12, attention="mssa", attention_options=_AOT_MSSA, ffn="mlp")


# Fastmax (FAST paper): p = 1, 2 factorised attention in a GPT-2 Base decoder. The paper reports no LM
# configuration or count; the shape is GPT-2 Base's so the models compare with gpt2_base.
@register_model("fastmax_gpt_p1", paper="FAST §3 (Fastmax1) in a GPT-2 Base decoder", tags=("language",))
def fastmax_gpt_p1() -> CausalLMConfig:
    return _gpt(768, 12, 12, attention="fastmax", attention_options={"p": 1})


@register_model("fastmax_gpt_p2", paper="FAST §3 (Fastmax2) in a GPT-2 Base decoder", tags=("language",))
def fastmax_gpt_p2() -> CausalLMConfig:
    return _gpt(768, 12, 12, attention="fastmax", attention_options={"p": 2})


# MEGA's enwik8 decoder (MEGA Table 9, App. D.4): 12 causal MEGA-chunk layers of width 512, z = 128, v = FFN = 1024,
# h = 16, chunk 2048, dropout 0.1, byte vocabulary. Differences of form: MEGA adds rotary embeddings inside its
# attention (for length extrapolation); ours keeps MEGA's learned relative bias per chunk (MEGA's choice on its
# other tasks, App. D.1). Context 8192 = the longest training segment (m <= 4 chunks of 2048, App. D.4). MEGA's LM
# norm is not stated in the paper: pre-norm LayerNorm here.
@register_model("mega_lm", paper="MEGA Table 9 (enwik8): causal MEGA-chunk decoder", tags=("language",))
def mega_lm() -> CausalLMConfig:
    return CausalLMConfig(
        dim=512,
        depth=12,
        heads=1,  # MEGA's attention is single-head
        vocab_size=256,
        block_size=8192,
        attention="mega",
        attention_options=dict(attention="softmax", zdim=128, hdim=1024, ndim=16, chunk_size=2048),
        mlp_dim=1024,
        act="silu",
        norm="pre",
        dropout=0.1,
        pos_embed="none",  # the EMA and the relative bias carry positions
    )


# ---------------------------------------------------------------------------------------------------
# In-context regression (AoT §4.1.2, Garg et al. 2022): d = 20 inputs, width 128, 8 heads; the
# transformer and Full-MLP have 16 layers, Hybrid 24 (MLP in the first half), AoT 16. Up to 41 points.
# ---------------------------------------------------------------------------------------------------


def _icl(attention: str, depth: int, ffn: str, ffn_layers: int | None = None) -> ICLConfig:
    opts = dict(_AOT_MSSA) if attention == "mssa" else {}
    return ICLConfig(
        n_dims=20,
        max_points=41,
        dim=128,
        heads=8,
        depth=depth,
        attention=attention,
        attention_options=opts,
        ffn=ffn,
        ffn_layers=ffn_layers,
        norm="pre",
    )


@register_model("icl_gpt", paper="AoT §4.1.2 (Transformer)", tags=("icl",))
def icl_gpt() -> ICLConfig:
    return _icl("softmax", 16, "mlp")


@register_model("icl_aot", paper="AoT §4.1.2 (AoT)", tags=("icl",))
def icl_aot() -> ICLConfig:
    return _icl("mssa", 16, "none")


@register_model("icl_aot_hybrid", paper="AoT §4.1.2 (Hybrid)", tags=("icl",))
def icl_aot_hybrid() -> ICLConfig:
    return _icl("mssa", 24, "mlp", ffn_layers=12)


@register_model("icl_aot_full_mlp", paper="AoT §4.1.2 (Full MLP)", tags=("icl",))
def icl_aot_full_mlp() -> ICLConfig:
    return _icl("mssa", 16, "mlp")


# ---------------------------------------------------------------------------------------------------
# Long Range Arena. Task data (Tay et al. 2021): ListOps 2000 tokens / 10 classes, Text (bytes) 4096 / 2,
# Retrieval (bytes, two documents) 4000 each / 2, Image (grey CIFAR-10 pixels) 1024 / 10, Pathfinder
# 1024 / 2. Vocabularies: ListOps 18 symbols (digits, 4 operators, brackets, padding), bytes/pixels 256.
# The papers give no parameter counts for these.
# ---------------------------------------------------------------------------------------------------

_LRA_TASKS = {
    "listops": dict(vocab_size=18, max_len=2000, num_classes=10),
    "text": dict(vocab_size=256, max_len=4096, num_classes=2),
    "retrieval": dict(vocab_size=256, max_len=4000, num_classes=2, dual=True),
    "image": dict(vocab_size=256, max_len=1024, num_classes=10),
    "pathfinder": dict(vocab_size=256, max_len=1024, num_classes=2),
}

# ToST Table 7: (layers, width, heads, MLP width, pre-norm, dropout). Pooling is not stated; we mean-pool.
# The authors' released code has no LRA models; like their vision ToST models these take qkv_bias=True
# and LayerNorm eps 1e-6.
_TOST_LRA = {
    "listops": (6, 512, 8, 2048, True, 0.1),
    "text": (4, 256, 4, 1024, True, 0.1),
    "retrieval": (6, 128, 4, 512, True, 0.1),
    "image": (8, 64, 8, 128, True, 0.0),
    "pathfinder": (2, 64, 2, 128, False, 0.1),
}

# CSP Table 6: (layers, width), K = 1 (complete sorting), CLS pooling. Heads and MLP widths are not given
# (CSP has no heads); we take ToST Table 7's heads and MLP-to-width ratio for the same task, pre-norm.
_CSP_LRA = {
    "listops": (4, 512, 8, 2048),
    "text": (4, 256, 4, 1024),
    "retrieval": (4, 128, 4, 512),
    "image": (4, 128, 8, 256),
    "pathfinder": (6, 64, 2, 128),
}


def _register_lra() -> None:
    for task, data in _LRA_TASKS.items():
        depth, dim, heads, mlp, pre, drop = _TOST_LRA[task]

        def tost_cfg(depth=depth, dim=dim, heads=heads, mlp=mlp, pre=pre, drop=drop, data=data):
            return SequenceClassifierConfig(
                depth=depth,
                dim=dim,
                heads=heads,
                mlp_dim=mlp,
                norm="pre" if pre else "post",
                dropout=drop,
                attention="tssa",
                attention_options=dict(_TOST_TSSA),
                norm_eps=1e-6,
                pool="mean",
                **data,
            )

        register_model(f"tost_lra_{task}", paper=f"ToST Table 7 ({task})", tags=("lra",))(tost_cfg)

        depth, dim, heads, mlp = _CSP_LRA[task]

        def csp_cfg(depth=depth, dim=dim, heads=heads, mlp=mlp, data=data):
            return SequenceClassifierConfig(
                depth=depth,
                dim=dim,
                heads=heads,
                mlp_dim=mlp,
                norm="pre",
                attention="csp",
                attention_options={"groups": 1, "shift_schedule": "none"},
                pool="cls",
                **data,
            )

        register_model(f"csp_lra_{task}", paper=f"CSP Table 6 ({task})", tags=("lra",))(csp_cfg)


_register_lra()


# MEGA on LRA (Ma et al. 2022), as its released code configures it (facebookresearch/mega: fairseq/models/lra/model.py,
# mega_lra_* architectures, and examples/mega/README.lra.md's command lines): (layers, width D, Z, E = hidden = FFN
# width, attention function, norm, pre-norm, dropout). Checked against MEGA Table 8 (App. D.2: Depth, d_model, z, v =
# d_FFN, h, Attn-FN, Norm, Pre-norm, Dropout): every entry agrees. EMA expansion h = 16, SiLU, mean pooling, no
# positional embedding (the EMA and the relative bias carry positions), final norm only with pre-norm, head Linear(D, E)
# -> act -> Linear(E, classes). The code's ListOps default norm is ScaleNorm but its README trains with LayerNorm; we
# follow the README. Differences of form: our token embedding also serves the image tasks (MEGA embeds a pixel with a
# Linear(1, D)); the dual head reads [u, v, u*v, u-v] (4D, MEGA's 2D); the relative bias spans our max_len (MEGA: 2002 /
# 4002 positions for ListOps / Text and Retrieval).
_MEGA_LRA = {
    "listops": (6, 80, 64, 160, "softmax", "layernorm", False, 0.1),
    "text": (4, 128, 64, 256, "softmax", "scalenorm", False, 0.1),
    "retrieval": (6, 128, 64, 256, "softmax", "scalenorm", False, 0.1),
    "image": (8, 160, 96, 320, "laplace", "batchnorm", True, 0.0),
    "pathfinder": (6, 128, 64, 256, "laplace", "batchnorm", True, 0.0),
}

#: Mega-chunk's chunk size r on these tasks: MEGA §4.1 sets "c = 128 for all the tasks, except Path-X where
#: c = 4096" (Path-X is not registered here); MEGA's code leaves it to --chunk-size (README.lra.md: CHUNK).
MEGA_CHUNK = 128

# CSP Table 7 (MEGA using CSP): (groups K, shift schedule, hidden dims, dropout). K = "—" (Image: shifting only)
# is None; "—" shifts are "none", "Linear" is "linear". "Hidden Dims" is read as MEGA's --encoder-hidden-dim,
# which in MEGA's code also sets the FFN width; layers, norms and the rest as MEGA's (Table 7's layer counts agree).
_MEGA_CSP_LRA = {
    "listops": (1, "none", 160, 0.1),
    "text": (1, "none", 256, 0.1),
    "retrieval": (1, "none", 256, 0.1),
    "image": (None, "linear", 1024, 0.0),
    "pathfinder": (512, "linear", 256, 0.1),
}


def _mega_lra(task: str, *, chunk_size: int | None = None, csp: bool = False) -> SequenceClassifierConfig:
    depth, dim, zdim, hidden, fn, norm_layer, pre, drop = _MEGA_LRA[task]
    head = hidden
    options: dict = dict(attention=fn, zdim=zdim, ndim=16, chunk_size=chunk_size)
    if csp:
        groups, schedule, hidden, drop = _MEGA_CSP_LRA[task]
        options = dict(attention="csp", ndim=16, csp_groups=groups, shift_schedule=schedule)
    options["hdim"] = hidden
    return SequenceClassifierConfig(
        depth=depth,
        dim=dim,
        heads=1,  # MEGA's attention is single-head
        attention="mega",
        attention_options=options,
        mlp_dim=hidden,
        act="silu",
        norm="pre" if pre else "post",
        norm_layer=norm_layer,
        final_norm=pre,
        dropout=drop,
        pool="mean",
        pos_embed="none",
        head_dim=head,
        **_LRA_TASKS[task],
    )


def _register_mega_lra() -> None:
    for task in _LRA_TASKS:
        register_model(f"mega_lra_{task}", paper=f"MEGA LRA ({task}), CSP Table 4", tags=("lra",))(
            lambda task=task: _mega_lra(task)
        )
        register_model(f"mega_chunk_lra_{task}", paper=f"MEGA-chunk LRA ({task}, r = 128), CSP Table 4", tags=("lra",))(
            lambda task=task: _mega_lra(task, chunk_size=MEGA_CHUNK)
        )
        register_model(f"mega_csp_lra_{task}", paper=f"CSP Table 7 ({task}): MEGA using CSP", tags=("lra",))(
            lambda task=task: _mega_lra(task, csp=True)
        )


_register_mega_lra()

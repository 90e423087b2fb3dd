"""The five papers' claims as data: one :class:`PaperClaim` per claim the report checks, one :class:`Check` per sanity
check, each keyed by a short stable id that every finding carries as its ``claim_id``.

A section reads a claim's reference, statement, paper value, margin and conditions from here (``get(claim_id)``).
A claim tested several ways has ``tests``, and each finding carries ``"<id>#<test>"``. Plain data: nothing from the
package is imported here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "PAPERS",
    "CLAIM_KINDS",
    "COMBINE_EVERY",
    "LRA_TESTS",
    "Conditions",
    "PaperClaim",
    "Check",
    "CLAIMS",
    "CHECKS",
    "base_id",
    "test_of",
    "get",
    "finding_kw",
    "compare_kw",
    "size_ratios",
]

PAPERS = ("ToST", "FAST", "CSP", "CBSA", "AoT")
#: how a claim is judged: a trained comparison with margin 0 (superiority) or > 0 (non-inferiority), a cost or speed
#: figure measured once (measurement), or a trend with a rule of its own (qualitative: probes, curves)
CLAIM_KINDS = ("superiority", "non-inferiority", "measurement", "qualitative")
#: the one rule by which the tests of a claim tested several ways make its verdict
COMBINE_EVERY = (
    "agrees only if every test that decides agrees; disagrees if any test that decides disagrees; else inconclusive"
)
#: the tests of an LRA accuracy claim: its average over the learned tasks, then each task
LRA_TESTS = ("average", "listops", "text", "retrieval", "image", "pathfinder")


@dataclass(frozen=True)
class Conditions:
    """What must hold for a test to count as the paper's: the pair's parameter ratio, head dimension, length."""

    #: params(a) / params(b) of the paper's own comparison (a comparison far from it is gated on conditions)
    param_ratio: float | None = None
    param_ratio_source: str = ""
    #: the head dimension D the claim is made at (None: any)
    head_dim: int | None = None
    #: the smallest sequence length N at which the claim applies (None: any)
    min_n: int | None = None
    note: str = ""


@dataclass(frozen=True)
class PaperClaim:
    """One claim of one of the five papers, as the report checks it."""

    id: str
    #: the reference as the report prints it: the paper, then where in it
    ref: str
    #: the claim as the report states it (closely paraphrased from the paper's text)
    statement: str
    #: the figure the paper gives for it, as the report quotes it (``{name}`` fields are filled by the section)
    paper_value: str
    metric: str
    #: the compared rows as the report names them, a then b (empty where nothing is compared)
    rows: tuple[str, ...]
    kind: str
    task: str
    higher_is_better: bool = True
    margin: float = 0.0
    margin_source: str = ""
    #: what a relative margin is a fraction of (empty: the margin is in the metric's unit)
    margin_relative_to: str = ""
    #: the paper's own effect for the pair, oriented as a finding's effect (positive favours row a), in the metric
    paper_effect: float | None = None
    paper_effect_source: str = ""
    conditions: Conditions = field(default_factory=Conditions)
    #: the ways the claim is tested, their verdicts combined by :data:`COMBINE_EVERY`
    tests: tuple[str, ...] = ()

    @property
    def paper(self) -> str:
        return self.ref.split(" ", 1)[0]

    @property
    def where(self) -> str:
        return self.ref.split(" ", 1)[1]

    @property
    def reference(self) -> str:
        """The reference a finding shows in its ``paper`` column."""
        return self.ref

    @property
    def combine(self) -> str:
        return COMBINE_EVERY if self.tests else ""

    @property
    def claim_type(self) -> str:
        """The :func:`~attnzoo.reproduce.claims.compare` type of a trained comparison."""
        if self.kind not in ("superiority", "non-inferiority"):
            raise ValueError(f"claim {self.id!r} is a {self.kind} claim, not a trained comparison")
        return self.kind


@dataclass(frozen=True)
class Check:
    """A sanity check (kind ``"check"``): an implementation or baseline property, not a paper's claim."""

    id: str
    #: the reference as the report prints it (a paper, "all five papers", a baseline's paper)
    reference: str
    statement: str
    paper_value: str
    #: what the test part of a ``claim_id`` names where the check runs once per item (a mechanism, a task)
    per: str = ""
    tests: tuple[str, ...] = ()


_VIT = "top-1 accuracy (%)"
_LRA = "LRA accuracy (%)"
_LOSS = "validation loss (nats)"

CLAIMS: tuple[PaperClaim, ...] = (
    # vision (ToST Table 2, CBSA Tables 3-4, AoT Table 2, CSP Table 3)
    PaperClaim(
        id="tost-t2-vit",
        ref="ToST Table 2",
        statement="ToST is competitive with ViT at similar size",
        paper_value="ToST-S 77.9 vs ViT-S 79.8 ImageNet top-1 (-1.9 pts)",
        metric=_VIT,
        rows=("tost", "vit"),
        kind="non-inferiority",
        task="image classification",
        margin=1.9,
        margin_source="ToST-S 1.9 pts below ViT-S, called competitive",
        paper_effect=-1.9,
        paper_effect_source="ToST Table 2: ToST-S 77.9 vs ViT-S 79.8 ImageNet top-1",
        conditions=Conditions(22.6 / 22.1, "ToST Table 5: ToST-S 22.6M vs ViT-S 22.1M"),
        tests=("architecture", "controlled-swap", "matched-params"),
    ),
    PaperClaim(
        id="tost-t2-xcit",
        ref="ToST Table 2",
        statement="ToST is competitive with XCiT (same skeleton, XCA attention)",
        paper_value="ToST-S 77.9 vs XCiT-S 80.5 (-2.6 pts)",
        metric=_VIT,
        rows=("tost", "xcit"),
        kind="non-inferiority",
        task="image classification",
        margin=2.6,
        margin_source="ToST-S 2.6 pts below XCiT-S, called comparable",
        paper_effect=-2.6,
        paper_effect_source="ToST Table 2: ToST-S 77.9 vs XCiT-S 80.5 ImageNet top-1",
        conditions=Conditions(22.6 / 24.9, "ToST Table 5: ToST-S 22.6M vs XCiT-S 24.9M"),
        tests=("architecture", "controlled-swap"),
    ),
    PaperClaim(
        id="cbsa-t3-crate",
        ref="CBSA Table 3",
        statement="CBT beats CRATE",
        paper_value="CBT-B 73.4 vs CRATE-B 70.8 ImageNet top-1 (+2.6 pts)",
        metric=_VIT,
        rows=("cbt", "crate"),
        kind="superiority",
        task="image classification",
        paper_effect=2.6,
        paper_effect_source="CBSA Table 3: CBT-B 73.4 vs CRATE-B 70.8 ImageNet-1K top-1",
        conditions=Conditions(25.7 / 22.8, "CBSA Table 3: CBT-B 25.7M vs CRATE-B 22.8M"),
    ),
    PaperClaim(
        id="cbsa-t4-mssa",
        ref="CBSA Table 4",
        statement="CBSA is competitive with MSSA when only the attention differs",
        paper_value="CBSA-T 63.2 vs MSSA-T 64.7, CBSA-S 71.4 vs MSSA-S 72.1 ImageNet top-1 (fair comparison)",
        metric=_VIT,
        rows=("vit+cbsa", "vit+mssa"),
        kind="non-inferiority",
        task="image classification",
        margin=1.5,
        margin_source="CBSA-T 1.5 pts below MSSA-T, called competitive",
        paper_effect=-1.5,
        paper_effect_source="CBSA Table 4: CBSA-T 63.2 vs MSSA-T 64.7 ImageNet-1K top-1",
        conditions=Conditions(note="only the attention differs (CBSA Table 4's fair comparison)"),
    ),
    PaperClaim(
        id="aot-t2-crate",
        ref="AoT Table 2 / §4.2",
        statement="attention-only AoT is competitive with CRATE despite no MLP",
        paper_value="AoT-B 70.2 vs CRATE-α-B 81.2 (-11 pts; the paper calls it comparable)",
        metric=_VIT,
        rows=("aot", "crate"),
        kind="non-inferiority",
        task="image classification",
        margin=11.0,
        margin_source="AoT-B 11 pts below CRATE-α-B, called comparable",
        paper_effect=-11.0,
        paper_effect_source="AoT Table 2: AoT-Base 70.2% vs CRATE-α-B/16 81.2% ImageNet-1K top-1",
    ),
    PaperClaim(
        id="csp-t3-vit",
        ref="CSP Table 3",
        statement="CSP-ViT beats the MHA ViT",
        paper_value="CSP 84.81 vs MHA 81.90 CIFAR-10 top-1 (+2.9 pts)",
        metric=_VIT,
        rows=("csp_vit", "vit"),
        kind="superiority",
        task="image classification",
        paper_effect=2.91,
        paper_effect_source="CSP Table 3: ViT with CSP 84.81 vs MHA 81.90 CIFAR-10 top-1",
        conditions=Conditions(
            param_ratio=6.38 / 9.52,
            param_ratio_source="CSP Table 3: ViT with CSP 6.38M vs MHA 9.52M",
            note="CSP Table 3 compares at 6.38M (CSP) vs 9.52M (MHA) parameters on CIFAR-10",
        ),
        tests=("architecture", "controlled-swap"),
    ),
    # one claim tested in the vision skeleton and on every LRA task
    PaperClaim(
        id="fast-t1-accuracy",
        ref="FAST Table 1",
        statement="Fastmax keeps softmax's accuracy",
        paper_value="Fastmax2 57.90 vs vanilla 57.37 (LRA average)",
        metric=_LRA,
        rows=("fastmax", "softmax"),
        kind="non-inferiority",
        task="LRA and image classification",
        margin=2.6,
        margin_source="Fastmax2 up to 2.6 pts below vanilla on a task (Retrieval), said to keep its accuracy",
        paper_effect=0.53,
        paper_effect_source="FAST Table 1: Fastmax2 57.90 vs vanilla Transformer 57.37 LRA average",
        conditions=Conditions(note="the same encoder with its attention swapped"),
        tests=("vision",) + LRA_TESTS,
    ),
    # CBSA Fig. 9: adapting pretrained ViTs
    PaperClaim(
        id="cbsa-f9-linear",
        ref="CBSA §4 / Fig. 9",
        statement="CBSA adapted from a pretrained ViT is comparable to linear attention at nearly the same FLOPs",
        paper_value="§4: 'CBSA achieves comparable performance to that of linear attention with nearly the same "
        "FLOPs' (Fig. 9, ViTs pretrained on ImageNet-21k, 50 epochs on ImageNet-1k)",
        metric=_VIT,
        rows=("cbsa", "linear"),
        kind="non-inferiority",
        task="adapting a pretrained ViT",
        margin=1.5,
        margin_source="Fig. 9 states no values; CBSA Table 4 calls CBSA-T 1.5 pts below MSSA-T competitive",
        paper_effect_source="Fig. 9's bar values are in the figure image only",
    ),
    PaperClaim(
        id="cbsa-f9-no-contraction",
        ref="CBSA §4 / Fig. 9",
        statement="without the contraction step (Agent Attention) adapted CBSA surpasses linear attention",
        paper_value="§4: 'when the contraction step is removed, CBSA surpasses linear attention' (Fig. 9)",
        metric=_VIT,
        rows=("cbsa-no-contraction", "linear"),
        kind="superiority",
        task="adapting a pretrained ViT",
        paper_effect_source="Fig. 9's bar values are in the figure image only",
    ),
    # long-range arena
    PaperClaim(
        id="tost-t3-lra",
        ref="ToST Table 3",
        statement="TSSA keeps the softmax Transformer's accuracy",
        paper_value="ToST 37.25 vs Transformer 37.11 ListOps; 59.90 vs 59.24 LRA average",
        metric=_LRA,
        rows=("tssa", "softmax"),
        kind="non-inferiority",
        task="LRA",
        margin=2.42,
        margin_source="ToST up to 2.42 pts below the Transformer on a task (Pathfinder), said to outperform it on "
        "average; ListOps 37.25 vs 37.11",
        paper_effect=0.66,
        paper_effect_source="ToST Table 3: ToST 59.90 vs Transformer 59.24 LRA average",
        tests=LRA_TESTS,
    ),
    PaperClaim(
        id="csp-t4-lra",
        ref="CSP Table 4",
        statement="CSP beats the softmax Transformer",
        paper_value="CSP 58.91 vs Transformer 54.39 (LRA average)",
        metric=_LRA,
        rows=("csp", "softmax"),
        kind="superiority",
        task="LRA",
        paper_effect=4.52,
        paper_effect_source="CSP Table 4: CSP 58.91 vs Transformer 54.39 LRA average",
        tests=LRA_TESTS,
    ),
    PaperClaim(
        id="csp-t4-mega",
        ref="CSP Table 4",
        statement="MEGA using CSP (linear) beats chunked MEGA",
        paper_value="MEGA using CSP 85.89 vs MEGA-chunk 85.66 (LRA average)",
        metric=_LRA,
        rows=("mega_csp", "mega_chunk"),
        kind="superiority",
        task="LRA",
        paper_effect=0.23,
        paper_effect_source="CSP Table 4: MEGA using CSP 85.89 vs MEGA-chunk 85.66 LRA average",
        conditions=Conditions(note="MEGA-chunk's chunks of r = 128 at 1K-4K tokens (8-32 chunks), not dense MEGA"),
        tests=LRA_TESTS,
    ),
    PaperClaim(
        id="fast-t2-speed",
        ref="FAST Table 2",
        statement="Fastmax2 trains faster than softmax beyond N = 1024, where the two are equal (D = 32)",
        paper_value="6.1 vs 1.8 steps/s at N=4000 (Text); equal at N=1000",
        metric="training speed-up over softmax (x)",
        rows=("fastmax", "softmax"),
        kind="measurement",
        task="LRA training / the attention op",
        paper_effect=6.1 / 1.8,
        paper_effect_source="FAST Table 2: Fastmax2 6.1 vs vanilla 1.8 steps/s on Text",
        conditions=Conditions(head_dim=32, min_n=1024, note="cost O(N·D^(p+1)): the claim is at D = 32"),
        # the LRA encoder's own training speed, and the op timed at the paper's head dimension
        tests=("lra-training", "op-d32"),
    ),
    PaperClaim(
        id="tost-t4-speed",
        ref="ToST Table 4 (right)",
        statement="TSSA is faster than softmax attention at long N",
        paper_value="0.60x the time of GPT-2 at 4k tokens",
        metric="training speed-up over softmax (x)",
        rows=("tssa", "softmax"),
        kind="measurement",
        task="LRA training",
        paper_effect=1 / 0.60,
        paper_effect_source="ToST Table 4 (right): ToST-Base 0.60x GPT2-Base's time at length 4k",
        conditions=Conditions(min_n=1024),
    ),
    PaperClaim(
        id="csp-f4-faster",
        ref="CSP §4.2 / Fig. 4",
        statement="CSP trains faster than the softmax Transformer on LRA",
        paper_value="the fastest training speed of all compared models",
        metric="training speed-up over softmax (x)",
        rows=("csp", "softmax"),
        kind="measurement",
        task="LRA training",
        conditions=Conditions(min_n=1024),
    ),
    PaperClaim(
        id="csp-f4-fastest",
        ref="CSP §4.2 / Fig. 4",
        statement="CSP has the fastest training of all models compared",
        paper_value="fastest of 14 Transformer variants on LRA",
        metric="geometric-mean training steps/s",
        rows=("csp",),
        kind="measurement",
        task="LRA training",
        conditions=Conditions(min_n=1024, note="among the mechanisms of the paper's comparison set run here"),
    ),
    # efficiency of the ops
    PaperClaim(
        id="tost-f6-speed",
        ref="ToST Fig. 6 (left)",
        statement="TSSA is ~10x faster than ViT's attention at 10k tokens",
        paper_value="nearly 10x faster at n=10k (d=384, K=8, GPU)",
        metric="forward speed-up over softmax (x)",
        rows=("tssa", "softmax"),
        kind="measurement",
        task="the attention op",
        paper_effect=10.0,
        paper_effect_source="ToST App. D.2: 'for 10k tokens ... ToST is nearly 10 times faster than ViT'",
        conditions=Conditions(min_n=8192),
    ),
    PaperClaim(
        id="tost-f6-memory",
        ref="ToST Fig. 6 (left)",
        statement="TSSA uses ~100x less memory than ViT's attention",
        paper_value="roughly 100x less GPU memory at n=10k (vs an explicit N x N attention)",
        metric="forward peak memory ratio softmax / TSSA (x)",
        rows=("tssa", "softmax"),
        kind="measurement",
        task="the attention op",
        paper_effect=100.0,
        paper_effect_source="ToST App. D.2: 'uses roughly 100 times less GPU memory'",
        conditions=Conditions(min_n=8192),
    ),
    PaperClaim(
        id="csp-t4-mega-linear",
        ref="CSP Table 4",
        statement="MEGA using CSP is linear in N",
        paper_value="O(CN) for MEGA using CSP vs O(CN²) for MEGA",
        metric="exponent of forward time in N",
        higher_is_better=False,
        rows=("mega_csp",),
        kind="measurement",
        task="the attention op",
        conditions=Conditions(min_n=2048),
    ),
    # in-context learning (per task: linear, sparse linear)
    PaperClaim(
        id="aot-f6-icl-learns",
        ref="AoT Fig. 6",
        statement="aot learns {task} functions in context (error falls with examples)",
        paper_value="error near least squares' once k ≥ d (after 50k+ steps)",
        metric="normalised squared error",
        higher_is_better=False,
        rows=("aot",),
        kind="qualitative",
        task="in-context regression",
        tests=("linear", "sparse"),
    ),
    PaperClaim(
        id="aot-f6-icl-close",
        ref="AoT Fig. 6",
        statement="AoT in-context learns {task} functions close to the GPT-2 transformer",
        paper_value="AoT's curve lies close to the Transformer's",
        metric="normalised squared error averaged over k",
        higher_is_better=False,
        rows=("aot", "gpt"),
        kind="non-inferiority",
        task="in-context regression",
        margin=0.1,
        margin_source="Fig. 6 gives curves only: 10% of the zero predictor's error is this report's 'close'",
        margin_relative_to="the zero predictor's error (linear ~1, sparse ~0.26)",
        paper_effect_source="AoT Fig. 6 gives curves, no number",
        tests=("linear", "sparse"),
    ),
    # language modelling
    PaperClaim(
        id="tost-t4-lm",
        ref="ToST Table 4",
        statement="swapping TSSA for softmax largely preserves LM quality",
        paper_value="ToST-Base vs GPT2-Base loss: OWT +12.7%, LAMBADA +15.3%, WikiText +15.5%, PTB +11.1%",
        metric=_LOSS,
        higher_is_better=False,
        rows=("tost", "gpt"),
        kind="non-inferiority",
        task="language modelling",
        margin=0.155,
        margin_source="the largest loss gap called preserved (WikiText, +15.5%; OWT alone: +12.7%)",
        margin_relative_to="gpt's mean loss",
        paper_effect=-0.58,
        paper_effect_source="ToST Table 4: GPT2-Base 4.26 vs ToST-Base 4.84 average zero-shot loss",
        conditions=Conditions(110 / 124, "ToST Table 4: ToST-Base 110M vs GPT2-Base 124M"),
    ),
    PaperClaim(
        id="aot-t1-lm",
        ref="AoT Table 1",
        statement="attention-only AoT comes close to GPT-2",
        paper_value="AoT-Medium 4.47 vs GPT-2 Base 4.32 LAMBADA loss (+3.5%); §4.1 calls only Medium and Large "
        "comparable",
        metric=_LOSS,
        higher_is_better=False,
        rows=("aot", "gpt"),
        kind="non-inferiority",
        task="language modelling",
        margin=0.035,
        margin_source="AoT-Medium's largest loss gap to GPT-2 Base (LAMBADA, +3.5%), called comparable (Base's +8.8% "
        "is not)",
        margin_relative_to="gpt's mean loss",
        paper_effect=-0.15,
        paper_effect_source="AoT Table 1: GPT-2 Base 4.32 vs AoT-Medium 4.47 LAMBADA loss",
        conditions=Conditions(182 / 124, "AoT Table 1: AoT-Medium 182M vs GPT-2 Base 124M (the comparable pair)"),
    ),
    PaperClaim(
        id="fast-f6-lm",
        ref="FAST §3, Fig. 6",
        statement="Fastmax's training follows softmax's",
        paper_value="loss curves of Fastmax follow softmax's",
        metric=_LOSS,
        higher_is_better=False,
        rows=("fastmax", "gpt"),
        kind="non-inferiority",
        task="language modelling",
        margin=0.05,
        margin_source="Fig. 6 gives curves only: 5% is this report's 'follows'",
        margin_relative_to="gpt's mean loss",
        paper_effect_source="FAST Fig. 6 gives curves, no number",
        conditions=Conditions(1.0, "FAST: the same Transformer with its attention swapped"),
    ),
    PaperClaim(
        id="aot-t1-hybrid",
        ref="AoT Table 1 / §4.1.2",
        statement="MLPs add little to AoT (Hybrid ≈ attention-only)",
        paper_value="Hybrid 4.84 vs Base 4.70 LAMBADA loss (Hybrid has fewer parameters)",
        metric=_LOSS,
        higher_is_better=False,
        rows=("aot", "aot_hybrid"),
        kind="non-inferiority",
        task="language modelling",
        margin=0.03,
        margin_source="Hybrid's LAMBADA loss 3.0% above Base's",
        margin_relative_to="aot_hybrid's mean loss",
        paper_effect=0.14,
        paper_effect_source="AoT Table 1: Hybrid 81M 4.84 vs Base 102M 4.70 LAMBADA loss",
        conditions=Conditions(102 / 81, "AoT Table 1: AoT-Base 102M vs Hybrid 81M"),
    ),
    # white-box probes
    PaperClaim(
        id="aot-thm1-denoise",
        ref="AoT Theorem 1 / Fig. 4",
        statement="each layer of eq 3 (thresholded φ) multiplies the SNR by about 1+ητ",
        paper_value="1+ητ = {theory:.4f} at η={eta:g}",
        metric="fitted SNR growth per layer",
        rows=(),
        kind="qualitative",
        task="denoising a mixture of subspaces",
    ),
    PaperClaim(
        id="aot-f4-softmax-denoise",
        ref="AoT Fig. 4",
        statement="eq 3 with the plain soft-max φ (practical MSSA) also denoises",
        paper_value="Fig. 4 shows the SNR rising per layer (the φ and η used are not stated)",
        metric="SNR per layer",
        rows=(),
        kind="qualitative",
        task="denoising a mixture of subspaces",
    ),
    PaperClaim(
        id="cbsa-f4-compress",
        ref="CBSA Fig. 4",
        statement="the parameter-free CBSA iteration compresses tokens (coding rate falls)",
        paper_value="coding rate decreases, points collapse onto their lines",
        metric="coding rate",
        higher_is_better=False,
        rows=(),
        kind="qualitative",
        task="noisy points on lines",
    ),
    PaperClaim(
        id="csp-thm1-rank",
        ref="CSP Theorem 1 / Dong et al.",
        statement="softmax attention without skips collapses to rank 1; CSP does not",
        paper_value="softmax residual → 0 doubly exponentially; CSP keeps full rank",
        metric="residual from rank 1",
        rows=("csp", "softmax"),
        kind="qualitative",
        task="a stack of attention layers without skips",
    ),
    PaperClaim(
        id="tost-f4a-compression",
        ref="ToST Fig. 4a",
        statement="the trained {name}'s layers decrease the compression term (mostly, layer by layer)",
        paper_value="the compression term mostly decreases by layer (ToST-S, ImageNet)",
        metric="variational compression term R^var_c per layer",
        higher_is_better=False,
        rows=("tost",),
        kind="qualitative",
        task="image classification",
    ),
    PaperClaim(
        id="cbsa-f5-compression",
        ref="CBSA Fig. 5",
        statement="the trained {name}'s layers decrease the compression term over the latter half of the layers",
        paper_value="the latter half of the layers exhibit consecutive compression (CBSA Fig. 5, CRATE's plots)",
        metric="compression term R^c per layer",
        higher_is_better=False,
        rows=(),
        kind="qualitative",
        task="image classification",
        # the white-box models whose layers the paper's figure (and CRATE's plots) read
        tests=("cbt", "crate", "aot"),
    ),
    # segmentation on scenes (CBSA Tables 5-6 and Fig. 8, ToST Fig. 5)
    PaperClaim(
        id="cbsa-t5-ranking",
        ref="CBSA Table 5",
        statement="zero-shot segmentation by the [CLS] map ranks CRATE+CBT > CRATE > CBT > ToST (foreground IoU)",
        paper_value="foreground IoU 0.68 / 0.65 / 0.51 / 0.42 ((CRATE+CBT)-S, CRATE-S, CBT-S, ToST-S on PASCAL VOC12): "
        "effects +0.03, +0.14, +0.09",
        metric="foreground IoU of the thresholded [CLS] map (best layer and head)",
        rows=("crate_cbt", "tost"),
        kind="superiority",
        task="zero-shot segmentation",
        # each adjacent pair of the ranking, with its own effect from the table (the section passes it)
        tests=("crate_cbt-vs-crate", "crate-vs-cbt", "cbt-vs-tost"),
    ),
    PaperClaim(
        id="cbsa-t6-persistence",
        ref="CBSA Table 6 / Fig. 7",
        statement="the hybrid's segmentation persists: its later-half layers keep a higher foreground IoU than CBT's",
        paper_value="mean foreground IoU of L7-L12: 0.56 (CRATE+CBT)-S vs 0.35 CBT-S",
        metric="mean over the later half of the layers of the best head's foreground IoU",
        rows=("crate_cbt", "cbt"),
        kind="superiority",
        task="zero-shot segmentation",
        paper_effect=0.215,
        paper_effect_source="CBSA Table 6: L7-L12 means 0.563 ((CRATE+CBT)-S) and 0.348 (CBT-S)",
    ),
    PaperClaim(
        id="tost-f5-segments",
        ref="ToST Fig. 5",
        statement="ToST's penultimate class-attention [CLS] map segments objects without segmentation labels (above "
        "an untrained ToST's)",
        paper_value="ToST-S's penultimate-layer [CLS] maps outline the objects (qualitative; no IoU given)",
        metric="foreground IoU of the penultimate class-attention layer's [CLS] map (best head)",
        rows=("tost", "tost@init"),
        kind="superiority",
        task="zero-shot segmentation",
    ),
    PaperClaim(
        id="cbsa-f8-miou",
        ref="CBSA Fig. 8 / §4",
        statement="a decoder of CBSA layers without feed-forward beats Segmenter's softmax mask transformer in mIoU",
        paper_value="the best CBT decoder +1.5 mIoU over Segmenter (ADE20K)",
        metric="mIoU (%)",
        rows=("cbsa", "mask_transformer"),
        kind="superiority",
        task="semantic segmentation",
        paper_effect=1.5,
        paper_effect_source="CBSA §4: the best-performing CBT decoder improves upon Segmenter by 1.5% mIoU",
    ),
    PaperClaim(
        id="cbsa-f8-flops",
        ref="CBSA Fig. 8 / §4",
        statement="the CBSA decoder costs a fraction of the FLOPs of Segmenter's decoder",
        paper_value="20% of Segmenter's FLOPs (and 0.06% of its pairwise similarities)",
        metric="decoder FLOPs per image, CBSA / Segmenter",
        higher_is_better=False,
        rows=("cbsa", "mask_transformer"),
        kind="measurement",
        task="semantic segmentation",
        conditions=Conditions(
            min_n=1024,
            note="ADE20K at 512x512, about 1,024 patch tokens, where the pairwise similarities dominate the "
            "decoder's cost; at tens of tokens its projections do",
        ),
    ),
    PaperClaim(
        id="cbsa-f8-robust",
        ref="CBSA Fig. 8 (middle, right)",
        statement="with Gaussian noise on the decoder's attention parameters, the CBSA decoder loses less mIoU than "
        "Segmenter's",
        paper_value="CBSA's mIoU stays nearly flat while Segmenter's collapses (figure only; no values stated)",
        metric="mIoU drop (pts) at the largest noise std",
        higher_is_better=False,
        rows=("cbsa", "mask_transformer"),
        kind="superiority",
        task="semantic segmentation",
    ),
)

_TOKEN_MIXER = "implicit in every paper: a token mixer is needed"

CHECKS: tuple[Check, ...] = (
    Check(
        "vision-attention-helps",
        "all five papers",
        "attention helps: the mean-pooled ViT beats its no-attention control (identity token mixer; same skeleton and "
        "pooling)",
        _TOKEN_MIXER,
    ),
    Check(
        "lra-attention-helps",
        "all five papers",
        "attention helps: softmax beats its no-attention control (identity token mixer) on {task}",
        _TOKEN_MIXER,
        per="task",
    ),
    Check(
        "lm-attention-helps",
        "all five papers",
        "attention helps: GPT beats its no-attention control (identity token mixer, same layout)",
        _TOKEN_MIXER,
    ),
    Check(
        "adapt-beats-scratch",
        "CBSA §4 / Fig. 9",
        "adapting the pretrained ViT beats training the same CBSA student from scratch for the same steps",
        "(implied: the point of adapting pretrained weights)",
    ),
    Check(
        "adapt-flops",
        "CBSA §4 / Fig. 9",
        "adapted CBSA costs nearly the same FLOPs as linear attention",
        "§4: 'with nearly the same FLOPs' (Fig. 9)",
    ),
    Check(
        "linear-fastest-long-n",
        "all five papers",
        "the linear mechanisms beat softmax attention at long N",
        "linear vs quadratic cost in N",
    ),
    Check(
        "memory-linear-in-n",
        "attnzoo's target (4N/N peak ≤ 4.5, docs/performance.md) / papers' O(N) memory",
        "{mechanism}: memory linear in N",
        "ratio of peak memory at 4N vs N ≤ 4.5",
        per="mechanism",
    ),
    Check(
        "decode-time-flat",
        "ToST Fig. 8 / FAST §2.5",
        "{mechanism}: decode step time flat in the context",
        "constant per-token cost for linear attention",
        per="mechanism",
    ),
    Check(
        "icl-gpt-learns",
        "Garg et al. 2022 (AoT's baseline)",
        "gpt learns {task} functions in context (error falls with examples)",
        "error near least squares' once k ≥ d (after 50k+ steps)",
        per="task",
    ),
    Check(
        "lm-decode-memory-tost",
        "ToST Fig. 8 / Table 4",
        "tost decodes with constant memory in the context (softmax's KV cache grows)",
        "ToST: 0.24x GPT-2's memory at 8k tokens",
    ),
    Check(
        "lm-decode-memory-fastmax",
        "FAST §2.5 (recurrent form)",
        "fastmax decodes with constant memory in the context (softmax's KV cache grows)",
        "recurrent form: O(1) state per token",
    ),
    Check(
        "lm-decode-time-tost",
        "ToST Fig. 8",
        "tost's per-token decode time does not grow with context",
        "ToST: flat per-token time vs growing for GPT-2",
    ),
    Check(
        "lm-decode-time-fastmax",
        "FAST §2.5",
        "fastmax's per-token decode time does not grow with context",
        "O(1) work per decoded token",
    ),
)

_BY_ID: dict[str, PaperClaim | Check] = {r.id: r for r in (*CLAIMS, *CHECKS)}


def base_id(claim_id: str) -> str:
    """The record's id of a finding's ``claim_id`` (without its ``#test`` part)."""
    return claim_id.split("#", 1)[0]


def test_of(claim_id: str) -> str:
    """The test part of a ``claim_id`` (``"tost-t3-lra#listops"`` -> ``"listops"``; ``""`` without one)."""
    return claim_id.partition("#")[2]


def get(claim_id: str) -> PaperClaim | Check:
    """The record of ``claim_id`` (``"<id>"`` or ``"<id>#<test>"``); a test part must be one of the record's."""
    rec = _BY_ID.get(base_id(claim_id))
    if rec is None:
        raise KeyError(f"unknown claim id {claim_id!r}; valid ids: {sorted(_BY_ID)}")
    test = test_of(claim_id)
    per = getattr(rec, "per", "")
    if test and not per and test not in rec.tests:
        raise KeyError(f"claim {rec.id!r} has no test {test!r}; its tests: {rec.tests or 'none'}")
    return rec


def finding_kw(claim_id: str, **fields: str) -> dict:
    """``paper``, ``claim``, ``paper_value`` and ``claim_id`` of a finding of ``claim_id``, as
    :func:`~attnzoo.reproduce.claims.finding` and ``not_tested`` take them; ``fields`` fill the record's ``{name}``
    fields (the task, the mechanism)."""
    rec = get(claim_id)
    return {
        "paper": rec.reference,
        "claim": rec.statement.format(**fields) if fields else rec.statement,
        "paper_value": rec.paper_value.format(**fields) if fields else rec.paper_value,
        "claim_id": claim_id,
    }


def compare_kw(claim_id: str, **fields: str) -> dict:
    """:func:`finding_kw` and the claim type, margin and its source, as
    :func:`~attnzoo.reproduce.claims.compare` takes them (a relative margin stays a fraction: see
    ``margin_relative_to``)."""
    rec = get(claim_id)
    if not isinstance(rec, PaperClaim):
        return finding_kw(claim_id, **fields)
    return {
        **finding_kw(claim_id, **fields),
        "claim_type": rec.claim_type,
        "margin": rec.margin,
        "margin_source": rec.margin_source,
    }


def size_ratios(*claim_ids: str) -> dict[tuple[str, str], tuple[float, str]]:
    """``(row a, row b) -> (the paper's parameter ratio, its source)`` of the claims (ids without a test part) that
    state one, as :func:`~attnzoo.reproduce.claims.size_gate` reads them."""
    out = {}
    for cid in claim_ids:
        rec = _BY_ID[cid]
        if isinstance(rec, PaperClaim) and rec.conditions.param_ratio is not None:
            out[rec.rows[:2]] = (rec.conditions.param_ratio, rec.conditions.param_ratio_source)
    return out

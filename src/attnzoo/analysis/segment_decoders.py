"""Segmentation decoders on scenes (CBSA Fig. 8): build, fit, mIoU, decoder FLOPs, and the robustness sweep that adds
Gaussian noise of std ``sigma`` to every parameter of the decoder's attention layers (Fig. 8, middle and right).

The model is the registered ``segmenter`` architecture (:class:`~attnzoo.models.segmenter.SegmentationModel`), the
loss and the mIoU are the ``semantic_segmentation`` objective of ``attnzoo train``
(:mod:`attnzoo.train.objectives`): a decoder fitted here and one trained by ``attnzoo train scenes_*_decoder_small``
are the same model under the same loss, and the sweep runs on either (:func:`load_segmenter_run`).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from attnzoo.data.scenes import SceneDataset
from attnzoo.layers.base import Attention
from attnzoo.models.segmenter import SegmentationModel, SegmenterConfig
from attnzoo.train.objectives import compute_loss, confusion_matrix, mean_iou

__all__ = [
    "build_segmenter",
    "confusion_matrix",
    "mean_iou",
    "fit_segmenter",
    "evaluate_miou",
    "load_segmenter_run",
    "decoder_flops",
    "perturb_attention",
    "perturbation_sweep",
    "compare_decoders",
    "sweep_runs",
    "plot_decoder_sweep",
    "add_decoders_parser",
    "run_decoders_cli",
]


def build_segmenter(
    encoder: str,
    decoder: str,
    *,
    num_classes: int,
    image_size: int,
    in_chans: int = 1,
    decoder_depth: int = 2,
    decoder_options: dict | None = None,
    **encoder_options: Any,
) -> SegmentationModel:
    """A registered vision model ``encoder`` (sized by ``encoder_options``) under a ``decoder`` ("cbsa" or
    "mask_transformer") predicting ``num_classes`` classes (background included) per pixel: the ``segmenter``
    architecture with the encoder's config fields."""
    from attnzoo.models import build_model, get_config

    enc = get_config(encoder, image_size=image_size, in_chans=in_chans, num_classes=0, **encoder_options)
    if enc.arch != "vision":
        raise ValueError(f"encoder {encoder!r} is a {enc.arch!r} model; a segmentation encoder is a 'vision' model")
    fields = {k: v for k, v in enc.to_dict().items() if k not in ("arch", "num_classes")}
    cfg = SegmenterConfig(
        **fields,
        num_classes=num_classes,
        decoder=decoder,
        decoder_depth=decoder_depth,
        decoder_attention_options=dict(decoder_options or {}),
    )
    return build_model(cfg)


def _batches(scenes: SceneDataset, images: int, batch_size: int):
    for start in range(0, images, batch_size):
        idx = np.arange(start, min(images, start + batch_size))
        (x,), _ = scenes.get_batch(idx)
        yield x, scenes.masks(idx)["semantic"]


def fit_segmenter(
    model: SegmentationModel,
    scenes: SceneDataset,
    *,
    steps: int,
    batch_size: int = 32,
    lr: float = 1e-3,
    seed: int = 0,
) -> list[float]:
    """Per-pixel cross-entropy on the scenes' semantic maps with AdamW; returns the training losses."""
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r} must be a positive int")
    gen = np.random.default_rng(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    model.train()
    losses = []
    for _ in range(steps):
        idx = gen.integers(0, len(scenes), batch_size)
        (x,), _ = scenes.get_batch(idx)
        target = scenes.masks(idx)["semantic"]
        loss, _ = compute_loss("semantic_segmentation", model(x), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


@torch.no_grad()
def evaluate_miou(model: nn.Module, scenes: SceneDataset, *, images: int = 256, batch_size: int = 64) -> float:
    """mIoU of ``model``'s per-pixel argmax on the first ``images`` scenes (classes + background)."""
    if not 1 <= images <= len(scenes):
        raise ValueError(f"images={images!r} must lie in [1, {len(scenes)}]")
    model.eval()
    conf = None
    for x, target in _batches(scenes, images, batch_size):
        logits = model(x)
        c = confusion_matrix(logits.argmax(1), target, logits.shape[1])
        conf = c if conf is None else conf + c
    return mean_iou(conf)


def load_segmenter_run(run: str | Path) -> tuple[SegmentationModel, SceneDataset]:
    """``(model in eval mode, validation scenes)`` of a finished ``attnzoo train`` run of a decoder on the
    ``scenes_segmentation`` task (its saved model, ``RUN/model``)."""
    from attnzoo.models import from_pretrained
    from attnzoo.train.run_dir import load_run
    from attnzoo.train.trainer import build_run_task

    run = Path(run)
    cfg = load_run(run)
    if cfg.task != "scenes_segmentation":
        raise ValueError(
            f"run {str(run)!r} trained on task {cfg.task!r}; the decoder sweep needs a 'scenes_segmentation' run"
        )
    if not (run / "model").is_dir():
        raise ValueError(f"run {str(run)!r} has no saved model (RUN/model): it has not finished; resume it first")
    model = from_pretrained(run / "model")
    if not isinstance(model, SegmentationModel):
        raise ValueError(f"run {str(run)!r} holds a {type(model).__name__}, not a segmentation model")
    return model, build_run_task(cfg).val


def decoder_flops(model: SegmentationModel, image_size: int, in_chans: int = 1) -> int:
    """Floating-point operations of one image's pass through the decoder (``torch.utils.flop_counter``)."""
    with torch.no_grad():
        patches = model.patch_tokens(torch.zeros(1, in_chans, image_size, image_size))
        counter = FlopCounterMode(display=False)
        with counter:
            model.decoder(patches)
    return int(counter.get_total_flops())


def perturb_attention(model: SegmentationModel, sigma: float, generator: torch.Generator) -> SegmentationModel:
    """A copy of ``model`` with ``N(0, sigma^2)`` noise added to every parameter of the decoder's attention layers."""
    if not sigma >= 0:
        raise ValueError(f"sigma={sigma!r} must be >= 0")
    noisy = copy.deepcopy(model)
    with torch.no_grad():
        for mod in noisy.decoder.modules():
            if isinstance(mod, Attention):
                for p in mod.parameters():
                    p.add_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * sigma)
    return noisy


def perturbation_sweep(
    model: SegmentationModel,
    scenes: SceneDataset,
    sigmas: list[float],
    *,
    draws: int = 3,
    images: int = 128,
    seed: int = 0,
) -> dict[str, Any]:
    """mIoU per ``sigma`` over ``draws`` noise draws (CBSA Fig. 8, middle and right): ``{"sigmas", "miou"}`` with
    ``miou[i]`` the list of the draws' mIoUs at ``sigmas[i]``."""
    if not isinstance(draws, int) or draws < 1:
        raise ValueError(f"draws={draws!r} must be a positive int")
    gen = torch.Generator().manual_seed(seed)
    out = []
    for sigma in sigmas:
        out.append([evaluate_miou(perturb_attention(model, sigma, gen), scenes, images=images) for _ in range(draws)])
    return {"sigmas": list(sigmas), "draws": draws, "miou": out}


def compare_decoders(
    scenes_train: SceneDataset,
    scenes_val: SceneDataset,
    *,
    encoder: str = "vit_s",
    encoder_options: dict | None = None,
    decoder_depth: int = 2,
    steps: int = 300,
    batch_size: int = 32,
    lr: float = 1e-3,
    sigmas: tuple[float, ...] = (0.0, 0.01, 0.02, 0.05, 0.1),
    draws: int = 3,
    images: int = 128,
    seed: int = 0,
) -> dict[str, Any]:
    """CBSA Fig. 8 on scenes: both decoders on one encoder configuration, each fitted from the same initial encoder
    for ``steps``; per decoder the mIoU, the decoder's FLOPs and parameters, and the noise sweep."""
    opts = {"patch_size": 8, "dim": 96, "depth": 4, "heads": 4, **dict(encoder_options or {})}
    num_classes = int(scenes_train.sources[1].max()) + 2  # the object classes and the background
    size = scenes_train.spec.canvas
    rows = {}
    for kind in ("mask_transformer", "cbsa"):
        torch.manual_seed(seed)
        model = build_segmenter(
            encoder, kind, num_classes=num_classes, image_size=size, decoder_depth=decoder_depth, **opts
        )
        losses = fit_segmenter(model, scenes_train, steps=steps, batch_size=batch_size, lr=lr, seed=seed)
        rows[kind] = {
            "miou": evaluate_miou(model, scenes_val, images=images),
            "decoder_flops": decoder_flops(model, size),
            "decoder_params": sum(p.numel() for p in model.decoder.parameters()),
            "final_loss": float(np.mean(losses[-20:])),
            "sweep": perturbation_sweep(model, scenes_val, list(sigmas), draws=draws, images=images, seed=seed),
        }
    params = dict(encoder=encoder, encoder_options=opts, decoder_depth=decoder_depth, steps=steps, lr=lr, seed=seed)
    return {"experiment": "segment-decoders", "params": {**params, "images": images}, "decoders": rows}


def plot_decoder_sweep(result: dict):
    """mIoU against the noise std sigma on the decoder's attention parameters (mean and range over draws)."""
    from .plotting import PALETTE, new_figure

    fig = new_figure(4.6, 3.0)
    ax = fig.add_subplot(1, 1, 1)
    for c, (kind, row) in enumerate(result["decoders"].items()):
        s = row["sweep"]
        vals = np.asarray(s["miou"])
        ax.plot(s["sigmas"], vals.mean(1), "o-", color=PALETTE[c], label=f"{kind} (mIoU {row['miou']:.2f})")
        ax.fill_between(s["sigmas"], vals.min(1), vals.max(1), color=PALETTE[c], alpha=0.2)
    ax.set_xlabel("noise std sigma on the decoder's attention parameters")
    ax.set_ylabel("mIoU")
    ax.legend(fontsize=7)
    ax.set_title("CBSA Fig. 8 on scenes: robustness of the decoders", fontsize=9)
    return fig


def sweep_runs(
    runs: list[str | Path], sigmas: list[float], *, draws: int = 3, images: int = 128, seed: int = 0
) -> dict[str, Any]:
    """The measurements of :func:`compare_decoders` on decoders trained by ``attnzoo train`` (one run per decoder
    kind): per run its mIoU on the first ``images`` validation scenes, decoder FLOPs and parameters, and the sweep."""
    rows, where = {}, {}
    for run in runs:
        model, scenes = load_segmenter_run(run)
        kind, size = model.config.decoder, model.config.image_size
        if kind in rows:
            raise ValueError(f"runs {where[kind]!r} and {str(run)!r} both train a {kind!r} decoder; give one per kind")
        n = min(images, len(scenes))
        rows[kind] = {
            "miou": evaluate_miou(model, scenes, images=n),
            "decoder_flops": decoder_flops(model, size, model.config.in_chans),
            "decoder_params": sum(p.numel() for p in model.decoder.parameters()),
            "sweep": perturbation_sweep(model, scenes, list(sigmas), draws=draws, images=n, seed=seed),
        }
        where[kind] = str(run)
    params = {"runs": where, "images": images, "seed": seed}
    return {"experiment": "segment-decoders", "params": params, "decoders": rows}


def add_decoders_parser(sub):
    """The ``segment-decoders`` sub-command of ``attnzoo analyze``."""
    desc = "CBSA Fig. 8 on scenes: CBSA vs softmax mask-transformer decoders (mIoU, FLOPs, noise on attention)"
    epilog = (
        "With RUN directories (decoders trained by `attnzoo train scenes_segmenter_small` / "
        "`scenes_cbsa_decoder_small`), nothing is fitted: the sweep runs on each run's saved model."
    )
    p = sub.add_parser("segment-decoders", help=desc, description=desc, epilog=epilog)
    p.add_argument("runs", nargs="*", metavar="RUN", help="attnzoo train runs of decoders on scenes_segmentation")
    p.add_argument(
        "--out", default=None, help="output directory (new or empty unless --overwrite; default RUN/segment-decoders)"
    )
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--source", choices=["digits", "fashion_mnist"], default="digits", help="the scenes' objects")
    p.add_argument("--n-train", type=int, default=4000, help="training scenes")
    p.add_argument("--images", type=int, default=128, help="validation scenes scored")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--dim", type=int, default=96)
    p.add_argument("--depth", type=int, default=4, help="encoder blocks")
    p.add_argument("--decoder-depth", type=int, default=2)
    p.add_argument("--sigmas", default="0,0.01,0.02,0.05,0.1", help="comma-separated noise stds")
    p.add_argument("--draws", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dpi", type=int, default=110)
    return p


def run_decoders_cli(args) -> list:
    """Fit both decoders (or load the RUN directories' trained ones), write ``segment-decoders.json`` and the sweep's
    plot; returns the paths."""
    from attnzoo._io import atomic_save_figure

    from .io import prepare_out_dir, write_json

    try:
        sigmas = tuple(float(t) for t in args.sigmas.split(",") if t.strip())
    except ValueError:
        raise ValueError(f"--sigmas must be comma-separated numbers, got {args.sigmas!r}") from None
    if args.out is None and not args.runs:
        raise ValueError("--out is required when no RUN directory is given (the decoders are fitted here)")
    out = prepare_out_dir(args.out or Path(args.runs[0]) / "segment-decoders", overwrite=args.overwrite)
    if args.runs:
        result = sweep_runs(args.runs, list(sigmas), draws=args.draws, images=args.images, seed=args.seed)
    else:
        result = _fit_both(args, sigmas)
    paths = [write_json(out / "segment-decoders.json", result)]
    paths.append(atomic_save_figure(plot_decoder_sweep(result), out / "segment-decoders.png", dpi=args.dpi))
    for kind, row in result["decoders"].items():
        pairs = zip(row["sweep"]["sigmas"], row["sweep"]["miou"], strict=True)
        sweep = ", ".join(f"{s:g}: {np.mean(v):.3f}" for s, v in pairs)
        print(
            f"{kind:>16}: mIoU {row['miou']:.3f}, decoder {row['decoder_flops'] / 1e6:.2f} MFLOPs, "
            f"{row['decoder_params']:,} parameters; mIoU by sigma {sweep}"
        )
    return paths


def _fit_both(args, sigmas: tuple[float, ...]) -> dict[str, Any]:
    """Both decoders fitted from one initial encoder on freshly built scenes (the CLI without RUN directories)."""
    from attnzoo.data.tasks import build_task

    task = build_task("scenes", source=args.source, n_train=args.n_train, n_val=args.images, seed=args.seed)
    return compare_decoders(
        task.train,
        task.val,
        encoder_options={"dim": args.dim, "depth": args.depth},
        decoder_depth=args.decoder_depth,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        sigmas=sigmas,
        draws=args.draws,
        images=args.images,
        seed=args.seed,
    )

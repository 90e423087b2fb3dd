"""``attnzoo analyze <experiment> --out DIR [options]``: run one white-box probe, write PNG + JSON.

Examples::

    attnzoo analyze denoise --out runs/denoise
    attnzoo analyze compress --out runs/compress --iterations 256
    attnzoo analyze rank-collapse --out runs/rank --depth 8
    attnzoo analyze layerwise --out runs/tost --checkpoint runs/tost-cifar/best
    attnzoo analyze attention-maps --out runs/maps --checkpoint runs/softmax --checkpoint runs/fastmax
    attnzoo analyze segment runs/scenes-crate-cbt
    attnzoo analyze segment-decoders --out runs/decoders --steps 300
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from typing import Any, Callable

from .experiments import EXPERIMENTS, save_experiment
from .io import prepare_out_dir
from .segment import add_segment_parser
from .segment_decoders import add_decoders_parser

__all__ = ["main", "build_parser"]


def _csv_ints(text: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _grid(text: str) -> tuple[int, int]:
    try:
        h, w = (int(t) for t in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a grid like 14x14, got {text!r}") from None
    return h, w


def _kv(text: str) -> tuple[str, object]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    k, v = text.split("=", 1)
    try:
        return k, json.loads(v)
    except json.JSONDecodeError:
        return k, v


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="output directory (must be empty or new unless --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="replace files in a non-empty --out")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dpi", type=int, default=110)


def _model_args(p: argparse.ArgumentParser, *, multiple: bool = False, needs_input: bool = True) -> None:
    act = "append" if multiple else "store"
    p.add_argument(
        "--checkpoint",
        action=act,
        help="directory written by save_pretrained / attnzoo train"
        + (" (repeat to compare models)" if multiple else ""),
    )
    p.add_argument(
        "--model",
        action=act,
        help="registered model name (random init), instead of --checkpoint"
        + (" (repeat to compare)" if multiple else ""),
    )
    p.add_argument(
        "--model-opt",
        type=_kv,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="create_model override for --model (JSON values), repeatable",
    )
    if needs_input:
        p.add_argument("--data", help="a .pt/.npy file holding a ready input batch (default: random inputs)")
        p.add_argument("--batch", type=int, default=8, help="batch size")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnzoo analyze",
        description="White-box probes: each experiment writes <out>/<experiment>.png and <out>/<experiment>.json.",
    )
    sub = parser.add_subparsers(dest="experiment", metavar="experiment")
    sub.required = True

    p = sub.add_parser("denoise", help=EXPERIMENTS["denoise"], description=EXPERIMENTS["denoise"])
    _common(p)
    p.add_argument("--k", type=int, default=4, help="number of subspaces K")
    p.add_argument("--p", type=int, default=32, help="subspace dimension p (d = K p)")
    p.add_argument("--n-per", type=int, default=50, help="tokens per subspace N/K")
    p.add_argument("--delta", type=float, default=0.05, help="noise level δ of Definition 1")
    p.add_argument("--eta", type=float, default=0.1, help="denoising strength η of eq 3")
    p.add_argument("--tau", type=float, default=0.75, help="threshold τ of Theorem 1")
    p.add_argument("--layers", type=int, default=12)

    p = sub.add_parser("compress", help=EXPERIMENTS["compress"], description=EXPERIMENTS["compress"])
    _common(p)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--n-per", type=int, default=50, help="points per class")
    p.add_argument("--noise", type=float, default=0.1)
    p.add_argument("--eps", type=float, default=0.05, help="ε of eq 12 and of the measured coding rate")
    p.add_argument("--kappa", type=float, default=0.15, help="step size κ")
    p.add_argument("--iterations", type=int, default=1024)
    p.add_argument("--snapshots", type=_csv_ints, default=None, help="iterations to draw, e.g. 0,1,256,1024")

    p = sub.add_parser("rank-collapse", help=EXPERIMENTS["rank-collapse"], description=EXPERIMENTS["rank-collapse"])
    _common(p)
    p.add_argument("--depth", type=int, default=12)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument(
        "--mechanisms",
        default=None,
        help="comma-separated registered mechanisms (default: all non-causal; 'none' for references only)",
    )
    p.add_argument(
        "--init",
        choices=["gaussian", "default"],
        default="gaussian",
        help="gaussian: N(0, 1/fan_in) linear weights, zero biases (as the references); "
        "default: the modules' own initialisation",
    )

    p = sub.add_parser("layerwise", help=EXPERIMENTS["layerwise"], description=EXPERIMENTS["layerwise"])
    _common(p)
    _model_args(p)
    p.add_argument("--eps", type=float, default=0.5, help="ε of the coding rates")

    p = sub.add_parser("membership", help=EXPERIMENTS["membership"], description=EXPERIMENTS["membership"])
    _common(p)
    _model_args(p)
    p.add_argument("--layers", type=_csv_ints, default=None, help="TSSA layer indices (default: 4 spread out)")
    p.add_argument("--image", type=int, default=0, help="which input of the batch to draw")
    p.add_argument("--grid", type=_grid, default=None, help="token grid HxW (default: from the model config)")

    p = sub.add_parser("attention-maps", help=EXPERIMENTS["attention-maps"], description=EXPERIMENTS["attention-maps"])
    _common(p)
    _model_args(p, multiple=True)
    p.add_argument("--layer", type=int, default=None, help="self-attention layer index (default: last)")
    p.add_argument("--image", type=int, default=0)
    p.add_argument("--grid", type=_grid, default=None)

    p = sub.add_parser("subspaces", help=EXPERIMENTS["subspaces"], description=EXPERIMENTS["subspaces"])
    _common(p)
    _model_args(p, needs_input=False)
    p.add_argument("--directions", type=int, default=4, help="random directions per subspace (0: all)")
    add_segment_parser(sub)
    add_decoders_parser(sub)
    return parser


def _one_model(args):
    from .experiments import load_model

    return load_model(checkpoint=args.checkpoint, model=args.model, options=dict(args.model_opt))


def _by_name(fn: Callable[..., dict], args: argparse.Namespace, **given: Any) -> dict:
    """``fn(**options)``: each keyword parameter of ``fn`` from the parsed option of its name (the subparser names
    its options after the experiment's parameters), ``given`` first; an option left ``None`` keeps ``fn``'s default."""
    parsed = {n: getattr(args, n) for n in inspect.signature(fn).parameters if getattr(args, n, None) is not None}
    return fn(**{**parsed, **given})


def _run(args) -> dict:
    from .experiments import (
        attention_maps,
        compress,
        denoise,
        example_input,
        layerwise,
        load_model,
        membership,
        rank_collapse,
        subspaces,
    )

    name = args.experiment
    if name == "denoise":
        return _by_name(denoise, args)
    if name == "compress":
        return _by_name(compress, args)
    if name == "rank-collapse":
        mechs = None
        if args.mechanisms is not None:
            mechs = (
                []
                if args.mechanisms.strip().lower() == "none"
                else [m.strip() for m in args.mechanisms.split(",") if m.strip()]
            )
        return _by_name(rank_collapse, args, mechanisms=mechs)
    if name == "subspaces":
        return subspaces(_one_model(args), directions=args.directions or None, seed=args.seed)
    if name in ("layerwise", "membership"):
        model = _one_model(args)
        x = example_input(model, batch=args.batch, data=args.data, seed=args.seed)
        if name == "layerwise":
            return layerwise(model, x, eps=args.eps)
        return membership(model, x, layers=args.layers, image=args.image, grid=args.grid)
    # attention-maps: one or more models
    ckpts, names = args.checkpoint or [], args.model or []
    if not ckpts and not names:
        raise ValueError("attention-maps needs --checkpoint DIR and/or --model NAME (repeatable)")
    models = {}
    for c in ckpts:
        models[str(c)] = load_model(checkpoint=c)
    for m in names:
        models[m] = load_model(model=m, options=dict(args.model_opt))
    inputs = {label: example_input(m, batch=args.batch, data=args.data, seed=args.seed) for label, m in models.items()}
    return attention_maps(models, inputs, layer=args.layer, image=args.image, grid=args.grid)


def _segment(args) -> int:
    from attnzoo.data.paths import DatasetNotFoundError

    from .segment import run_segment_cli
    from .segment_decoders import run_decoders_cli

    run = run_segment_cli if args.experiment == "segment" else run_decoders_cli
    try:  # a bad run, config or checkpoint raises a ValueError subclass
        paths = run(args)
    except (ValueError, TypeError, FileExistsError, DatasetNotFoundError) as e:
        print(f"attnzoo analyze {args.experiment}: error: {e}", file=sys.stderr)
        return 2
    print("\n".join(f"wrote {p}" for p in paths))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.experiment in ("segment", "segment-decoders"):
        return _segment(args)
    needs_model = args.experiment in ("layerwise", "membership", "subspaces")
    if needs_model and (args.checkpoint is None) == (args.model is None):
        parser.error(f"{args.experiment} needs exactly one of --checkpoint DIR or --model NAME")
    try:
        prepare_out_dir(args.out, overwrite=args.overwrite)  # fail before computing anything
        result = _run(args)
        paths = save_experiment(result, args.out, overwrite=args.overwrite, dpi=args.dpi)
    except (ValueError, TypeError, FileExistsError) as e:
        print(f"attnzoo analyze {args.experiment}: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {paths['png']}\nwrote {paths['json']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

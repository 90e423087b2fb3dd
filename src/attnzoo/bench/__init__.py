"""``attnzoo bench``: time and peak memory of every mechanism beside the SDPA softmax baseline.

Sweeps: ``n`` (sequence length at fixed width; ToST Fig. 6 left / Fig. 7, FAST Fig. 3), ``d`` (width at
fixed length; ToST Fig. 6 right) and ``decode`` (causal per-token step time vs context; ToST Fig. 8).
Writes ``results.csv``, ``results.json`` (with the machine description) and log-log PNGs, prints a table,
and reports each op's fraction of the machine's roofline: the time to stream its inputs and output once
at the bandwidth of a large copy measured in the same run, divided by its measured time.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import sys
from typing import NamedTuple

import torch

from attnzoo.bench import cases
from attnzoo.bench.cases import Shape
from attnzoo.bench.memory import cpu_peak_supported, timing_allocator
from attnzoo.bench.runner import Row, machine_info, measure_bandwidth, measure_decode, measure_series, write_results

#: the README's CPU figures (ToST Fig. 6: K=8, d=384)
_DEFAULT_PRESET = dict(
    lengths=[1024, 2048, 4096, 8192, 16384],
    dims=[128, 256, 512, 1024],
    d_sweep_length=4096,
    dim=384,
    heads=8,
    contexts=[128, 512, 2048, 8192],
    repeats=3,
    decode_dim=768,
    decode_heads=12,
)

PRESETS = {
    # seconds on CI: tiny shapes, every code path
    "quick": dict(
        lengths=[64, 256],
        dims=[32, 64],
        d_sweep_length=256,
        dim=64,
        heads=4,
        contexts=[16, 64],
        repeats=2,
        decode_dim=64,
        decode_heads=4,
    ),
    "default": _DEFAULT_PRESET,
    # GPU: the default's widths at longer sequences, and ToST Fig. 7's K=32, d=4096
    "paper": dict(
        _DEFAULT_PRESET,
        lengths=[1024, 4096, 16384, 32768, 65536, 131072],
        dims=[256, 512, 1024, 2048, 4096],
        contexts=[128, 1024, 8192, 32768],
        repeats=5,
    ),
}


def _parse(argv):
    ap = argparse.ArgumentParser(prog="attnzoo bench", description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="default")
    ap.add_argument(
        "--sweeps",
        default="n,d,decode",
        help="comma list of: n, d, decode, varlen (padded/packed vs unmasked at equal real tokens)",
    )
    ap.add_argument(
        "--mechanisms", default=None, help=f"comma list (default {cases.OP_CASES}; also {cases.EXTRA_OP_CASES})"
    )
    ap.add_argument("--lengths", type=int, nargs="+", help="N values of the n sweep")
    ap.add_argument("--dims", type=int, nargs="+", help="d values of the d sweep")
    ap.add_argument("--dim", type=int, help="model width d of the n sweep")
    ap.add_argument("--heads", type=int, help="heads K")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--d-sweep-length", type=int, help="N of the d sweep (default: the preset's; 4096, quick 256)")
    ap.add_argument("--varlen-batch", type=int, default=4, help="varlen sweep: rows B (half of them padded)")
    ap.add_argument("--varlen-length", type=int, default=4096, help="varlen sweep: grid length N")
    ap.add_argument(
        "--varlen-backend",
        default=None,
        help="varlen sweep: run every form on this backend where the op has it (e.g. triton: 'auto' does not take "
        "the masked Triton kernels); default: what 'auto' picks",
    )
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument(
        "--causal", choices=["both", "yes", "no"], default="both", help="n sweep: causal, non-causal or both"
    )
    ap.add_argument(
        "--level", choices=["op", "module"], default="op", help="pure op on (B,H,N,P) or module incl. projections"
    )
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default="float32")
    ap.add_argument("--repeats", type=int)
    ap.add_argument(
        "--budget-s", type=float, default=20.0, help="stop growing N for a mechanism once one call exceeds this"
    )
    ap.add_argument("--no-backward", action="store_true", help="forward only")
    ap.add_argument("--out", default=None, help="output dir (default results/bench-<timestamp>)")
    ap.add_argument("--overwrite", action="store_true", help="replace the results of an earlier run in --out")
    args = ap.parse_args(argv)
    preset = PRESETS[args.preset]
    for key in ("lengths", "dims", "d_sweep_length", "dim", "heads", "repeats"):
        if getattr(args, key) is None:
            setattr(args, key, preset[key])
    args.contexts, args.decode_dim, args.decode_heads = preset["contexts"], preset["decode_dim"], preset["decode_heads"]
    args.sweeps = [s.strip() for s in args.sweeps.split(",") if s.strip()]
    bad = [s for s in args.sweeps if s not in SWEEPS]
    if bad:
        ap.error(f"unknown sweep(s) {bad}; valid: {list(SWEEPS)}")
    mechs = cases.OP_CASES if args.mechanisms is None else [m.strip() for m in args.mechanisms.split(",")]
    valid = cases.ALL_OP_CASES
    bad = [m for m in mechs if m not in valid]
    if bad:
        ap.error(f"unknown mechanism(s) {bad}; valid: {valid}")
    args.mechanisms = mechs
    _check_args(ap, args)
    return args


#: every file a bench run writes into --out (--overwrite removes these, and only these)
OUTPUT_FILES = ("results.csv", "results.json", "sweep_n.png", "sweep_d.png", "decode.png", "varlen.csv")
SWEEPS = ("n", "d", "decode", "varlen")


def _check_args(ap: argparse.ArgumentParser, args) -> None:
    """Refuse sizes a sweep cannot measure before anything is measured (argparse's one-line usage error)."""
    for key in ("lengths", "dims"):
        bad = [v for v in getattr(args, key) if v < 1]
        if bad:
            ap.error(f"--{key} must be positive integers, got {bad}")
    for key in ("dim", "heads", "batch", "d_sweep_length", "repeats", "varlen_batch"):
        if getattr(args, key) < 1:
            ap.error(f"--{key.replace('_', '-')} must be a positive integer, got {getattr(args, key)}")
    if args.varlen_length < 4:
        ap.error(f"--varlen-length must be at least 4, got {args.varlen_length}")
    if args.threads is not None and args.threads < 1:
        ap.error(f"--threads must be a positive integer, got {args.threads}")
    if "varlen" in args.sweeps and args.device.split(":")[0] not in ("cpu", "cuda"):
        ap.error(f"the varlen sweep times CPU or CUDA calls; got --device {args.device} (pass --device cpu or cuda)")
    if "varlen" in args.sweeps and args.dim % args.heads:
        ap.error(f"--dim {args.dim} is not divisible by --heads {args.heads}")
    if not args.budget_s > 0:
        ap.error(f"--budget-s must be a positive number of seconds, got {args.budget_s}")
    # head size = dim // heads: a remainder would measure a narrower model than the results say
    if "n" in args.sweeps and args.dim % args.heads:
        ok = [h for h in range(1, args.dim + 1) if args.dim % h == 0]
        ap.error(f"--dim {args.dim} is not divisible by --heads {args.heads}; heads dividing {args.dim}: {ok}")
    if "d" in args.sweeps:
        bad = [d for d in args.dims if d % args.heads]
        if bad:
            ap.error(f"--dims {bad} are not divisible by --heads {args.heads}; use multiples of {args.heads}")
    if args.out is not None and os.path.exists(args.out) and not os.path.isdir(args.out):
        ap.error(f"--out {args.out} exists and is not a directory; choose a directory")


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def print_table(rows: list[Row]) -> None:
    unit = set(cases.SPEED_UNIT_CASES)  # the SDPA softmax baseline, declared by its mechanism
    base = {(r.sweep, r.causal, r.length, r.dim): r.fwd_ms for r in rows if r.mechanism in unit and r.fwd_ms}
    hdr = (
        f"{'sweep':<7}{'mechanism':<20}{'causal':<7}{'N':>7}{'d':>6}{'fwd ms':>11}{'fwd+bwd ms':>12}"
        f"{'peak MiB':>10}{'x SDPA':>8}{'roofline':>9}"
    )
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        ref = base.get((r.sweep, r.causal, r.length, r.dim))
        speed = ref / r.fwd_ms if (ref and r.fwd_ms) else None
        roof = None if r.roofline_frac is None else 100 * r.roofline_frac
        if r.status != "ok":
            print(f"{r.sweep:<7}{r.mechanism:<20}{str(r.causal):<7}{r.length:>7}{r.dim:>6}  {r.status}")
            continue
        print(
            f"{r.sweep:<7}{r.mechanism:<20}{str(r.causal):<7}{r.length:>7}{r.dim:>6}{_fmt(r.fwd_ms, '11.3f')}"
            f"{_fmt(r.fwdbwd_ms, '12.3f')}{_fmt(r.fwd_peak_mb, '10.1f')}{_fmt(speed, '8.1f')}"
            f"{_fmt(roof, '8.1f')}{'%' if roof is not None else ''}"
        )


class _Series(NamedTuple):
    """One mechanism's shapes in one sweep, measured in order until a call exceeds the time budget."""

    sweep: str
    mech: str
    causal: bool
    shapes: list[Shape]


def run(args) -> tuple[list[Row], dict]:
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    timing_allocator()
    bandwidth = measure_bandwidth(device)
    meta = machine_info(device) | {
        "bandwidth_GBps": bandwidth / 1e9,
        "dtype": args.dtype,
        "level": args.level,
        "preset": args.preset,
        "argv": sys.argv[1:],
    }
    print(
        f"machine: {meta['cpu']} | threads {meta['threads']} | {meta.get('gpu', 'no GPU')} | "
        f"copy bandwidth {bandwidth / 1e9:.1f} GB/s | memory: {meta['memory_method']}"
    )
    rows: list[Row] = []
    todo: list[_Series] = []
    if "n" in args.sweeps:
        modes = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
        causal_cases = cases.CAUSAL_OP_CASES
        for causal in modes:
            for mech in args.mechanisms:
                if causal and mech not in causal_cases:
                    continue
                shapes = [Shape(args.batch, args.heads, n, args.dim) for n in args.lengths]
                todo.append(_Series("n", mech, causal, shapes))
    if "d" in args.sweeps:
        for mech in args.mechanisms:
            shapes = [Shape(args.batch, args.heads, args.d_sweep_length, d) for d in args.dims if d % args.heads == 0]
            todo.append(_Series("d", mech, False, shapes))
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover
        tqdm = None
    bar = tqdm(total=sum(len(t.shapes) for t in todo), desc="bench", leave=False, file=sys.stderr) if tqdm else None
    for t in todo:
        rows += measure_series(
            t.sweep,
            t.mech,
            t.shapes,
            causal=t.causal,
            level=args.level,
            device=device,
            dtype=dtype,
            repeats=args.repeats,
            backward=not args.no_backward,
            bandwidth=bandwidth,
            budget_s=args.budget_s,
            on_shape=bar.update if bar else None,
        )
    if bar:
        bar.close()
    if "decode" in args.sweeps:
        decode = [m for m in cases.DECODE_CASES if m in args.mechanisms]
        dbar = tqdm(decode, desc="decode", leave=False, file=sys.stderr) if tqdm else decode
        for mech in dbar:
            rows += measure_decode(mech, args.decode_dim, args.decode_heads, args.contexts, device, dtype, args.repeats)
    if "varlen" in args.sweeps:
        meta["varlen"] = _run_varlen(args, device, dtype)
    return rows, meta


def _run_varlen(args, device: torch.device, dtype: torch.dtype) -> dict:
    """The varlen sweep (:mod:`attnzoo.bench.varlen`) of the chosen mechanisms that declare one."""
    from dataclasses import asdict

    from attnzoo.bench import varlen

    names = [m for m in args.mechanisms if m in varlen.varlen_cases()]
    skipped = [m for m in args.mechanisms if m not in names]
    if skipped:
        print(f"varlen sweep: no varlen form for {skipped}; measuring {names}", file=sys.stderr)
    modes = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    if args.varlen_backend is not None:
        known = sorted({b for m in names for b in varlen.case_backends(m)})
        if args.varlen_backend not in known:
            raise SystemExit(
                f"attnzoo bench: --varlen-backend {args.varlen_backend!r} is a backend of none of {names}; "
                f"valid: {known}"
            )
    load_before = varlen.load_average()
    rows = []
    for mech in names:
        for causal in modes:
            rows += varlen.measure_varlen(
                mech,
                batch=args.varlen_batch,
                heads=args.heads,
                length=args.varlen_length,
                dim=args.dim,
                causal=causal,
                backward=not args.no_backward,
                device=device,
                dtype=dtype,
                repeats=args.repeats,
                backend=args.varlen_backend,
            )
    return {
        "lengths": varlen.varlen_lengths(args.varlen_batch, args.varlen_length),
        "load_before": load_before,
        "load_after": varlen.load_average(),
        "rows": [asdict(r) for r in rows],
    }


def _report_varlen(out: str, res: dict) -> None:
    import csv
    import io

    from attnzoo._io import atomic_write_text
    from attnzoo.bench.varlen import VarlenRow, print_varlen

    rows = [VarlenRow(**r) for r in res["rows"]]
    print(f"varlen: lengths {res['lengths']}, load average before {res['load_before']}, after {res['load_after']}")
    print_varlen(rows)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(VarlenRow.__dataclass_fields__))
    w.writeheader()
    w.writerows(res["rows"])
    atomic_write_text(os.path.join(out, "varlen.csv"), buf.getvalue())


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parse(argv)
    if args.device == "cpu":
        if not cpu_peak_supported():
            print(
                "bench: this torch's profiler reports no CPU allocation events; CPU peak memory cannot be measured",
                file=sys.stderr,
            )
            return 2
    out = args.out or os.path.join("results", "bench-" + _dt.datetime.now().strftime("%Y%m%d-%H%M%S"))
    earlier = [f for f in OUTPUT_FILES if os.path.exists(os.path.join(out, f))]
    if earlier and not args.overwrite:  # checked before measuring, so nobody waits an hour to be refused
        print(
            f"bench: {out} already holds {earlier} from an earlier run; pass --overwrite to replace them "
            "or choose another --out",
            file=sys.stderr,
        )
        return 2
    os.makedirs(out, exist_ok=True)  # fails now (not after the run) if --out cannot be created
    if not os.access(out, os.W_OK):
        print(f"bench: --out {out} is not writable", file=sys.stderr)
        return 2
    rows, meta = run(args)
    if rows:
        print_table(rows)
    if "varlen" in meta:
        _report_varlen(out, meta["varlen"])
    for f in earlier:  # --overwrite: an earlier run's plots this run does not redraw must not stay beside it
        os.remove(os.path.join(out, f))
    csv_path, json_path = write_results(out, rows, meta)
    from attnzoo.bench.plots import plot_sweep  # imports matplotlib: not for --help or a refused run

    pngs = [
        plot_sweep(
            rows, "n", "length", os.path.join(out, "sweep_n.png"), f"K={args.heads}, d={args.dim}, {args.level} level"
        ),
        plot_sweep(rows, "d", "dim", os.path.join(out, "sweep_d.png"), f"K={args.heads}, N={args.d_sweep_length}"),
        plot_sweep(
            rows, "decode", "length", os.path.join(out, "decode.png"), "causal decoding: per-token step vs context"
        ),
    ]
    print(f"wrote {csv_path}, {json_path}" + "".join(f", {p}" for p in pngs if p))
    failed = [r for r in rows if r.status.startswith("error")]
    for r in failed:
        print(f"bench: {r.mechanism} ({r.sweep} sweep, N={r.length}, d={r.dim}) failed: {r.status}", file=sys.stderr)
    return 1 if failed else 0

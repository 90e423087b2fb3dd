"""Efficiency: the ``attnzoo bench`` sweep at a reduced size — forward and forward+backward time and peak memory
of every mechanism's op against SDPA softmax over the sequence length N (ToST Fig. 6, FAST Fig. 3), and causal
per-token decode step time vs context (ToST Fig. 8). One step per mechanism, so an interrupted sweep resumes.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from attnzoo.bench.memory import timing_allocator
from attnzoo.reproduce import claims, paper_claims
from attnzoo.reproduce.common import Context, Section, Table, fmt
from attnzoo.reproduce.store import Step

KEY = "efficiency"
TITLE = "Efficiency: time and memory vs sequence length"


def plan_steps(plan: dict, _seed: int) -> list[Step]:  # no seeds: measurements
    from attnzoo.bench import cases

    bad = [m for m in plan["mechanisms"] if m not in cases.ALL_OP_CASES]
    bad += [m for m in plan["decode"] if m not in cases.DECODE_CASES]
    if bad:
        raise ValueError(
            f"unknown efficiency mechanism(s) {bad}; op cases: {cases.ALL_OP_CASES}, decode cases: {cases.DECODE_CASES}"
        )
    machine = Step(f"{KEY}/machine", KEY, {"kind": "machine"}, _run_machine, label="machine")
    steps = [machine]
    modes = [False, True] if plan.get("causal") else [False]
    for causal in modes:
        for mech in plan["mechanisms"]:
            if causal and mech not in cases.CAUSAL_OP_CASES:
                continue
            cfg = {
                "kind": "n",
                "mechanism": mech,
                "causal": causal,
                "lengths": plan["lengths"],
                "dim": plan["dim"],
                "heads": plan["heads"],
                "repeats": plan["repeats"],
                "budget_s": plan["budget_s"],
            }
            sid = f"{KEY}/n/{mech}" + ("-causal" if causal else "")
            steps.append(Step(sid, KEY, cfg, _run_sweep, deps=(machine.id,), label=sid.split("/", 1)[1]))
    if plan.get("explicit_softmax"):
        # ablation for the papers' memory claims: softmax with the N x N matrix stored, forward only, longest N
        cfg = {
            "kind": "explicit",
            "mechanism": "softmax_explicit",
            "length": max(plan["lengths"]),
            "dim": plan["dim"],
            "heads": plan["heads"],
        }
        steps.append(Step(f"{KEY}/explicit/softmax", KEY, cfg, _run_explicit, deps=(machine.id,), label="explicit"))
    for mech in FAST_D32_MECHANISMS:
        cfg = {
            "kind": "d32",
            "mechanism": mech,
            "lengths": fast_d32_lengths(plan),
            "heads": FAST_D32_HEADS,
            "head_dim": FAST_HEAD_DIM,
            "repeats": plan["repeats"],
            "budget_s": plan["budget_s"],
        }
        sid = f"{KEY}/d32/{mech}"
        steps.append(Step(sid, KEY, cfg, _run_d32, deps=(machine.id,), label=sid.split("/", 1)[1]))
    for mech in plan["decode"]:
        cfg = {
            "kind": "decode",
            "mechanism": mech,
            "contexts": plan["contexts"],
            "dim": plan["decode_dim"],
            "heads": plan["decode_heads"],
            "repeats": plan["repeats"],
        }
        steps.append(Step(f"{KEY}/decode/{mech}", KEY, cfg, _run_decode, deps=(machine.id,), label=f"decode/{mech}"))
    return [dataclasses.replace(s, timed=True) for s in steps]  # every figure is a timing: run alone under --jobs


#: FAST Table 2's speed claim is at head dimension D = 32 (Fastmax costs O(N·D^(p+1)), softmax O(N²·D))
FAST_HEAD_DIM = 32
#: heads of the D = 32 measurement (both ops scale linearly in the heads; two keep it cheap on a CPU)
FAST_D32_HEADS = 2
FAST_D32_MECHANISMS = ("softmax", "fastmax_p2")


def fast_d32_lengths(plan: dict) -> list[int]:
    """The lengths of the D = 32 measurement: those of FAST Table 2's range (1,024 to 4,096) up to the plan's longest
    N, or the plan's longest N alone when it is shorter (then the claim, made from N = 1,024 on, is not tested)."""
    longest = max(plan["lengths"])
    return [n for n in (1024, 2048, 4096) if n <= longest] or [longest]


def _device(ctx: Context) -> torch.device:
    dev = ctx.device if ctx.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(dev)


def _run_machine(ctx: Context, _step: Step) -> dict:
    from attnzoo.bench.memory import cpu_peak_supported
    from attnzoo.bench.runner import machine_info, measure_bandwidth

    dev = _device(ctx)
    timing_allocator()
    bw = measure_bandwidth(dev, mib=128, repeats=3)
    info = machine_info(dev)
    info["bandwidth_GBps"] = bw / 1e9
    info["peak_memory_supported"] = dev.type == "cuda" or cpu_peak_supported()
    return info


def _bandwidth(ctx: Context) -> float:
    rec = ctx.store.load_by_id(f"{KEY}/machine")
    return rec["result"]["bandwidth_GBps"] * 1e9


def _run_sweep(ctx: Context, step: Step) -> dict:
    from attnzoo.bench import cases
    from attnzoo.bench.runner import measure_case, measure_series

    c = step.config
    dev = _device(ctx)
    timing_allocator()
    bw = _bandwidth(ctx)
    # a throw-away call first: the first call of a process pays one-off allocations (thread pools, workspaces)
    measure_case(
        "n",
        c["mechanism"],
        cases.Shape(1, c["heads"], min(c["lengths"]), c["dim"]),
        causal=c["causal"],
        level="op",
        device=dev,
        dtype=torch.float32,
        repeats=1,
        backward=True,
        bandwidth=bw,
    )
    shapes = [cases.Shape(1, c["heads"], n, c["dim"]) for n in c["lengths"]]
    rows = measure_series(
        "n",
        c["mechanism"],
        shapes,
        causal=c["causal"],
        level="op",
        device=dev,
        dtype=torch.float32,
        repeats=c["repeats"],
        backward=True,
        bandwidth=bw,
        budget_s=c["budget_s"],
    )
    return {"rows": [dataclasses.asdict(r) for r in rows]}


def _run_explicit(ctx: Context, step: Step) -> dict:
    from attnzoo.bench import cases
    from attnzoo.bench.runner import measure_case

    c = step.config
    timing_allocator()
    row = measure_case(
        "n",
        c["mechanism"],
        cases.Shape(1, c["heads"], c["length"], c["dim"]),
        causal=False,
        level="op",
        device=_device(ctx),
        dtype=torch.float32,
        repeats=1,
        backward=False,
        bandwidth=_bandwidth(ctx),
    )
    return {"rows": [dataclasses.asdict(row)]}


def _run_d32(ctx: Context, step: Step) -> dict:
    """Forward+backward time of one op at head dimension 32 over N (timing only: no memory profile, so it is
    cheap); a length whose call takes longer than ``budget_s`` stops the series."""
    from attnzoo.bench import cases
    from attnzoo.bench.runner import time_call

    c = step.config
    dev = _device(ctx)
    timing_allocator()
    rows = []
    for n in c["lengths"]:
        prep = cases.prepare(
            c["mechanism"],
            cases.Shape(1, c["heads"], n, c["heads"] * c["head_dim"]),
            causal=False,
            level="op",
            device=dev,
            dtype=torch.float32,
        )
        for t in prep.inputs:
            t.requires_grad_(True)
        with torch.no_grad():
            grad_out = torch.ones_like(prep.run())

        def fwdbwd(prep=prep, grad_out=grad_out):
            return torch.autograd.grad(prep.run(), prep.inputs, grad_out)

        ms = time_call(fwdbwd, dev, c["repeats"]) * 1e3
        rows.append({"length": n, "fwdbwd_ms": ms})
        if ms > 1e3 * c["budget_s"]:
            break
    return {"rows": rows, "heads": c["heads"], "head_dim": c["head_dim"]}


def _run_decode(ctx: Context, step: Step) -> dict:
    from attnzoo.bench.runner import measure_decode

    c = step.config
    timing_allocator()
    # warm-up
    measure_decode(c["mechanism"], c["dim"], c["heads"], [min(c["contexts"])], _device(ctx), torch.float32, 1)
    rows = measure_decode(
        c["mechanism"], c["dim"], c["heads"], c["contexts"], _device(ctx), torch.float32, c["repeats"]
    )
    return {"rows": [dataclasses.asdict(r) for r in rows]}


def summarize(records: dict[str, dict], plan: dict, plots_dir, rel) -> Section:
    from attnzoo.bench.plots import plot_sweep
    from attnzoo.bench.runner import Row

    sec = Section(KEY, TITLE)
    machine = records.get(f"{KEY}/machine", {}).get("result", {})
    rows = []
    for sid, rec in records.items():
        if sid.startswith(f"{KEY}/n/") or sid.startswith(f"{KEY}/decode/"):
            rows += [Row(**r) for r in rec["result"]["rows"]]
    n_rows = [r for r in rows if r.sweep == "n"]
    dec_rows = [r for r in rows if r.sweep == "decode"]
    rec = records.get(f"{KEY}/explicit/softmax")
    explicit = Row(**rec["result"]["rows"][0]) if rec else None
    sec.intro = (
        f"Ops on `(B=1, H={plan['heads']}, N, d/H)` tensors, d={plan['dim']}, float32, median of "
        f"{plan['repeats']} repeats after a warm-up (`attnzoo bench`'s harness); N stops growing once a call takes "
        f"over {plan['budget_s']} s. Softmax is PyTorch SDPA. Peak memory: {machine.get('memory_method', '-')}. "
        f"Copy bandwidth: {fmt(machine.get('bandwidth_GBps'), '.1f')} GB/s."
    )
    table_rows = n_rows + ([explicit] if explicit else [])
    lengths = sorted({r.length for r in table_rows})
    mechs = list(dict.fromkeys(r.mechanism + ("-causal" if r.causal else "") for r in table_rows))

    def cell(mech, n, attr, spec):
        for r in table_rows:
            if r.mechanism + ("-causal" if r.causal else "") == mech and r.length == n:
                return fmt(getattr(r, attr), spec) if r.status == "ok" else r.status
        return "-"

    # the forward figures are the ones the findings judge; forward+backward times are in the plot and results.json
    # (FAST's training-speed claim has its own table at D = 32)
    for attr, title, spec in (
        ("fwd_ms", "Forward time (ms)", ".2f"),
        ("fwd_peak_mb", "Forward peak memory (MiB)", ".1f"),
    ):
        cells = [[m] + [cell(m, n, attr, spec) for n in lengths] for m in mechs]
        # a mechanism not measured at any N here (the explicit-matrix softmax has no backward run) has no row
        cells = [c for c in cells if any(x != "-" for x in c[1:])]
        sec.tables.append(Table(title, ["mechanism"] + [f"N={n}" for n in lengths], cells))
    if dec_rows:
        sec.tables.append(_decode_table(dec_rows, plan))
    plots_dir.mkdir(parents=True, exist_ok=True)
    p1 = plot_sweep(
        rows,
        "n",
        "length",
        str(plots_dir / "efficiency_n.png"),
        f"ops, K={plan['heads']}, d={plan['dim']} (CPU figures of attnzoo bench at reduced size)",
    )
    if p1:
        sec.plots.append(
            (rel(plots_dir / "efficiency_n.png"), "Forward and forward+backward time, peak memory vs N (log-log).")
        )
    p2 = plot_sweep(
        rows, "decode", "length", str(plots_dir / "efficiency_decode.png"), "causal decoding: per-token step vs context"
    )
    if p2:
        sec.plots.append((rel(plots_dir / "efficiency_decode.png"), "Per-token decode time and memory vs context."))
    sec.data = {"machine": machine, "rows": [dataclasses.asdict(r) for r in rows]}
    sec.findings = _findings(n_rows, dec_rows, plan, explicit)
    d32 = {m: records[f"{KEY}/d32/{m}"]["result"] for m in FAST_D32_MECHANISMS if f"{KEY}/d32/{m}" in records}
    if d32:
        table, finding = fast_d32(d32)
        sec.tables.append(table)
        sec.findings.append(finding)
        sec.data["fast_d32"] = d32
    return sec


def _decode_table(dec_rows: list, plan: dict) -> Table:
    ctxs = sorted({r.length for r in dec_rows})
    dm = list(dict.fromkeys(r.mechanism for r in dec_rows))
    by = {(r.mechanism, r.length): r for r in dec_rows}
    return Table(
        f"Causal decoding: per-token step time (ms), d={plan['decode_dim']}, K={plan['decode_heads']}",
        ["mechanism"] + [f"context {c}" for c in ctxs],
        [[m] + [fmt(getattr(by.get((m, c)), "fwd_ms", None), ".3f") for c in ctxs] for m in dm],
    )


def fast_d32(d32: dict[str, dict]) -> tuple[Table, dict]:
    """FAST Table 2 at its head dimension: softmax and Fastmax p=2 forward+backward time over N at D = 32, and the
    claim "Fastmax2 trains faster than softmax beyond N = 1024" judged at every N > 1024 both measured."""
    by = {m: {r["length"]: r["fwdbwd_ms"] for r in res["rows"]} for m, res in d32.items()}
    lengths = sorted({n for v in by.values() for n in v})
    heads = next(iter(d32.values()))["heads"]
    rows = [[m] + [fmt(by[m].get(n), ".1f") for n in lengths] for m in by]
    soft, fast = by.get("softmax", {}), by.get("fastmax_p2", {})
    rows.append(
        ["softmax / fastmax_p2"] + [fmt(soft[n] / fast[n], ".2f") if n in soft and n in fast else "-" for n in lengths]
    )
    table = Table(
        f"FAST at its head dimension: forward+backward time (ms), D = {FAST_HEAD_DIM}, {heads} heads, B = 1",
        ["op"] + [f"N={n}" for n in lengths],
        rows,
        caption="The last row is Fastmax's speed-up over SDPA softmax (> 1: Fastmax faster).",
    )
    kw = paper_claims.finding_kw("fast-t2-speed#op-d32")
    both = [n for n in lengths if n in soft and n in fast and n >= 1024]
    if not both:
        measured = ", ".join(f"N={n}: {soft[n] / fast[n]:.2f}x" for n in lengths if n in soft and n in fast)
        return table, claims.not_tested(
            **kw, why=f"no N ≥ 1024 measured at D = {FAST_HEAD_DIM} (speed-up {measured or 'n/a'})"
        )
    n = max(both)
    ratio = soft[n] / fast[n]
    # the paper's break-even is N = 1024 (equal there): the claim is that Fastmax is faster at every longer N
    above = {k: soft[k] / fast[k] for k in both if k > 1024}
    verdict = (
        "inconclusive"
        if not above
        else "agrees"
        if all(r > 1 for r in above.values())
        else "disagrees"
        if all(r < 1 for r in above.values())
        else "inconclusive"
    )
    return table, claims.finding(
        **kw,
        measured=f"at D = {FAST_HEAD_DIM}, N={n}: fastmax_p2 {fast[n]:.1f} ms vs softmax {soft[n]:.1f} ms "
        f"({ratio:.2f}x)"
        + "".join(f"; N={k}: {soft[k] / fast[k]:.2f}x" for k in lengths if k in soft and k in fast and k != n),
        verdict=verdict,
        rule="agrees if faster than SDPA softmax at every measured N above the paper's break-even (1024), "
        "disagrees if slower at every one",
        kind="paper",
        measurement=True,
    )


def _findings(n_rows, dec_rows, plan: dict | None = None, explicit=None) -> list[dict]:
    # only completed non-causal forward timings are comparable across mechanisms
    ok = [r for r in n_rows if r.status == "ok" and not r.causal and r.fwd_ms]
    if not ok:
        return [claims.not_tested(**paper_claims.finding_kw("tost-f6-speed"), why="no efficiency measurements")]
    out = [_fastest_finding(ok)]
    out += _tssa_findings(ok, plan, explicit)
    out += _memory_growth_findings(ok)
    out += _mega_csp_linear_findings(ok)
    out += _decode_findings(dec_rows)
    return out


def _fastest_finding(ok) -> dict:
    """Which op is fastest at the longest N measured (the shared claim of all five papers)."""
    longest = max(r.length for r in ok)
    at = {r.mechanism: r for r in ok if r.length == longest}
    fastest = min(at, key=lambda m: at[m].fwd_ms)
    return claims.finding(
        **paper_claims.finding_kw("linear-fastest-long-n"),
        measured=f"fastest forward at N={longest}: {fastest} ({at[fastest].fwd_ms:.2f} ms)",
        verdict="agrees" if fastest != "softmax" else "disagrees",
        rule="agrees if softmax is not the fastest op at the longest N measured",
        kind="check",
        measurement=True,
    )


def _tssa_findings(ok, plan: dict | None, explicit=None) -> list[dict]:
    """ToST Fig. 6 (left): TSSA's speed and memory against softmax at the longest N both were measured at."""
    soft = {r.length: r for r in ok if r.mechanism == "softmax"}
    common = max((n for n in soft if any(r.length == n and r.mechanism == "tssa" for r in ok)), default=None)
    if common is None:
        return []
    tssa = {r.length: r for r in ok if r.mechanism == "tssa"}
    s, t = soft[common], tssa[common]
    speed = s.fwd_ms / t.fwd_ms
    mem = (s.fwd_peak_mb / t.fwd_peak_mb) if (s.fwd_peak_mb and t.fwd_peak_mb) else None
    verdict = "not tested" if common < 8192 else ("agrees" if speed >= 10 else "disagrees")
    out = [
        claims.finding(
            **paper_claims.finding_kw("tost-f6-speed"),
            measured=f"at N={common}: {speed:.1f}x faster than SDPA",
            verdict=verdict,
            rule="agrees if ≥10x faster at N ≥ 8192; not tested at shorter N",
            kind="paper",
            measurement=True,
        )
    ]
    if speed >= 30:  # a ratio many times the paper's is another regime (a CPU baseline), not a better TSSA
        out[0]["explanation"] = f"{speed:.0f}x against the paper's ~10x: SDPA on this CPU here, a GPU in the paper"
    if mem is None or common < 8192:
        out.append(
            claims.not_tested(**paper_claims.finding_kw("tost-f6-memory"), why="no peak-memory pair at N ≥ 8192")
        )
    else:
        out.append(_tssa_memory_finding(common, s, t, mem, plan, explicit))
    return out


def _tssa_memory_finding(common, s, t, mem: float, plan: dict | None, explicit=None) -> dict:
    """TSSA vs SDPA forward peak memory at N=common, explained when it falls short of the paper's gap: by the
    measured explicit-matrix softmax when the plan ran it, else by the size of the N x N scores. When the explicit
    softmax was measured at the same N, the verdict is judged against it: that is the attention the paper measured."""
    if explicit is not None and explicit.length == common and explicit.status == "ok" and explicit.fwd_peak_mb:
        ratio = explicit.fwd_peak_mb / t.fwd_peak_mb
        return claims.finding(
            **paper_claims.finding_kw("tost-f6-memory"),
            measured=f"at N={common}: softmax storing the N x N matrix {explicit.fwd_peak_mb:.0f} MiB vs tssa "
            f"{t.fwd_peak_mb:.1f} MiB = {ratio:.0f}x (SDPA, which streams the scores: {s.fwd_peak_mb:.1f} MiB, "
            f"{mem:.1f}x)",
            verdict="agrees" if ratio >= 10 else "disagrees",
            rule="agrees if ≥10x less forward peak memory than the explicit-matrix softmax at N ≥ 8192",
            kind="paper",
            measurement=True,
        )
    f = claims.finding(
        **paper_claims.finding_kw("tost-f6-memory"),
        measured=f"at N={common}: softmax (SDPA) {s.fwd_peak_mb:.1f} MiB vs tssa {t.fwd_peak_mb:.1f} MiB = {mem:.1f}x",
        verdict="agrees" if mem >= 10 else "disagrees",
        rule="agrees if ≥10x less forward peak memory at N ≥ 8192 (SDPA's CPU kernel does "
        "not store the N x N matrix, unlike the ViT attention the paper measured)",
        kind="paper",
        measurement=True,
    )
    if f["verdict"] == "agrees" or not plan:
        return f
    heads = plan.get("heads", 1)
    if explicit is not None and explicit.length == common and explicit.status == "ok" and explicit.fwd_peak_mb:
        ratio = explicit.fwd_peak_mb / t.fwd_peak_mb
        f["explanation"] = (
            f"ablation softmax_explicit (the same op with the N x N scores and weights stored, as the ViT "
            f"attention the paper measured): forward peak {explicit.fwd_peak_mb:.0f} MiB at N={common}, "
            f"{ratio:.0f}x TSSA's {t.fwd_peak_mb:.1f} MiB ({'≥' if ratio >= 10 else '<'} 10x: "
            f"{'agrees' if ratio >= 10 else 'disagrees'} against that baseline) and {explicit.fwd_ms / 1e3:.1f} s "
            f"per forward; SDPA's CPU kernel streams the scores (its forward peaks at {s.fwd_peak_mb:.1f} MiB), "
            "so the gap is the baseline's implementation, not TSSA"
        )
        return f
    explicit_mb = common * common * heads * 4 / 2**20  # float32 scores of one batch element
    f["explanation"] = (
        f"the paper's ViT attention stores the N x N scores: at N={common} with {heads} heads in float32 "
        f"that matrix alone is {explicit_mb:.0f} MiB, {explicit_mb / t.fwd_peak_mb:.0f}x TSSA's measured peak; "
        f"SDPA's CPU kernel streams the scores instead (its whole forward peaks at {s.fwd_peak_mb:.1f} "
        "MiB), so the gap is the baseline's implementation, not TSSA (a computed bound from this run's "
        "shapes, not a measurement of an explicit-matrix baseline)"
    )
    return f


#: the mechanisms quadratic in N by design (no O(N) memory claim to check): MSSA, and dense MEGA (O(C N^2), CSP
#: Table 4), whose N^2 growth is CSP's argument for MEGA with CSP
QUADRATIC = ("mssa", "mega")


def _memory_growth_findings(ok) -> list[dict]:
    """Per linear mechanism: peak memory at 4N vs N, the papers' O(N) memory claim."""
    out = []
    for mech in sorted({r.mechanism for r in ok} - {"softmax"}):
        rs = {r.length: r for r in ok if r.mechanism == mech}
        # below ~1 MiB fixed-size buffers (statistics, states) dominate and the ratio says nothing about N
        pairs = [
            (n, 4 * n)
            for n in rs
            if 4 * n in rs and (rs[n].fwd_peak_mb or 0) > 1.0 and (rs[4 * n].fwd_peak_mb or 0) > 1.0
        ]
        if mech in QUADRATIC or not pairs:
            continue
        n, n4 = max(pairs)
        ratio = rs[n4].fwd_peak_mb / rs[n].fwd_peak_mb
        out.append(
            claims.finding(
                **paper_claims.finding_kw(f"memory-linear-in-n#{mech}", mechanism=mech),
                measured=f"{rs[n4].fwd_peak_mb:.1f} / {rs[n].fwd_peak_mb:.1f} MiB = {ratio:.2f} (N={n}->{n4})",
                verdict="agrees" if ratio <= 4.5 else "disagrees",
                rule="agrees if ≤ 4.5",
                kind="check",
                measurement=True,
            )
        )
    return out


def _decode_findings(dec_rows) -> list[dict]:
    """ToST Fig. 8 / FAST §2.5: each non-softmax mechanism's per-token decode time is flat in the context."""
    out = []
    if not dec_rows:  # the original guard: a missing decode sweep (None or empty) yields no findings
        return out
    by = {}
    for r in dec_rows:
        by.setdefault(r.mechanism, {})[r.length] = r.fwd_ms
    for mech, d in by.items():
        if mech == "softmax" or len(d) < 2:
            continue
        lo, hi = min(d), max(d)
        growth = d[hi] / d[lo]
        sm = by.get("softmax", {})
        sg = f", softmax x{sm[hi] / sm[lo]:.2f}" if lo in sm and hi in sm else ""
        out.append(
            claims.finding(
                **paper_claims.finding_kw(f"decode-time-flat#{mech}", mechanism=mech),
                measured=f"x{growth:.2f} from context {lo} to {hi}{sg}",
                verdict="agrees" if growth <= 1.5 else "disagrees",
                rule="agrees if ≤ x1.5 (timing noise)",
                kind="check",
                measurement=True,
            )
        )
    return out


def _time_exponent(rs: dict) -> tuple[float, int, int]:
    """The exponent a of forward time ~ N^a between the shortest and longest N of ``rs`` (length -> row)."""
    lo, hi = min(rs), max(rs)
    return math.log(rs[hi].fwd_ms / rs[lo].fwd_ms) / math.log(hi / lo), lo, hi


#: forward-time exponents: at most this is linear (timing noise and fixed costs allowed), at least the upper bound
#: is closer to quadratic than to linear
LINEAR_EXPONENT, QUADRATIC_EXPONENT = 1.25, 1.75
#: below this longest N, per-call overheads rather than the O(N) / O(N²) terms set the exponent
SCALING_MIN_N = 2048


def _mega_csp_linear_findings(ok) -> list[dict]:
    """CSP Table 4: MEGA using CSP costs O(CN), dense MEGA O(CN²): the measured exponent of forward time in N."""
    by: dict[str, dict] = {}
    for r in ok:
        by.setdefault(r.mechanism, {})[r.length] = r
    rs = by.get("mega_csp", {})
    if len(rs) < 2:
        return []
    a, lo, hi = _time_exponent(rs)
    if hi < SCALING_MIN_N:
        return [
            claims.not_tested(
                **paper_claims.finding_kw("csp-t4-mega-linear"),
                why=f"longest N measured is {hi} < {SCALING_MIN_N}: fixed per-call costs decide the exponent "
                f"(measured N^{a:.2f} from N={lo})",
            )
        ]
    ref = []
    for m in ("mega", "mega_chunk"):
        if len(by.get(m, {})) >= 2:
            ref.append(f"{m} N^{_time_exponent(by[m])[0]:.2f}")
    verdict = "agrees" if a <= LINEAR_EXPONENT else ("disagrees" if a >= QUADRATIC_EXPONENT else "inconclusive")
    return [
        claims.finding(
            **paper_claims.finding_kw("csp-t4-mega-linear"),
            measured=f"MEGA-CSP forward time grows as N^{a:.2f} from N={lo} to {hi}"
            + (f" ({', '.join(ref)})" if ref else ""),
            verdict=verdict,
            rule=f"agrees if the exponent is ≤ {LINEAR_EXPONENT}, disagrees if ≥ {QUADRATIC_EXPONENT}",
            kind="paper",
            measurement=True,
        )
    ]

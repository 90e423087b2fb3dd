"""``attnzoo reproduce --budget {smoke,default,long,full} --out DIR [--seed S] [--only section,...]``."""

from __future__ import annotations

import argparse
import sys

from attnzoo.reproduce.budgets import BUDGETS, SECTIONS

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="attnzoo reproduce",
        description="Train and measure every mechanism side by side on the offline tasks and write DIR/report.md "
        "(tables, plots, verdicts against the papers) and DIR/results.json. Resumable: rerunning with the "
        "same --out skips finished steps.",
    )
    ap.add_argument(
        "--budget",
        choices=sorted(BUDGETS),
        default="default",
        help="smoke: ~2 min CPU (CI); default: about half an hour on a 2-core CPU with --jobs 2; long: hours on a "
        "2-core CPU (--estimate predicts it); full: a GPU",
    )
    ap.add_argument("--out", default=None, help="output directory (default results/<timestamp>/); reuse it to resume")
    ap.add_argument("--seed", type=int, default=0, help="seed of every run (same seed, same numbers on one machine)")
    ap.add_argument("--only", default=None, help=f"comma list of sections to run: {','.join(SECTIONS)}")
    ap.add_argument("--device", default="auto", help="auto (CUDA if available), cpu or cuda")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's default)")
    ap.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="run independent steps in N processes (each with --threads torch threads, default 1); a step's numbers "
        "are those of --jobs 1 --threads 1",
    )
    ap.add_argument(
        "--report-only",
        action="store_true",
        help="compute nothing: write the report from the steps stored so far, listing the plan's missing steps",
    )
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    ap.add_argument("--list", action="store_true", help="print the steps of the plan and exit")
    ap.add_argument(
        "--check-plan",
        action="store_true",
        help="train nothing: print each compared pair's parameter ratio in the plan against the paper's, and exit "
        "1 if a planned pair is more than 10%% off",
    )
    ap.add_argument(
        "--estimate",
        action="store_true",
        help="train nothing: predict the plan's thread time and its wall clock with --jobs from the steps of the "
        "runs given with --reuse (same config: their time; otherwise a stored step of the same shape, scaled by "
        "the examples it trains)",
    )
    ap.add_argument(
        "--reuse",
        action="append",
        default=None,
        metavar="RESULTS",
        help="import the steps of an earlier run (its results.json or its directory; repeatable) whose config is "
        "unchanged: only new or changed steps are computed, e.g. to rebuild a report under new rules",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="change one setting the budget has (VALUE read as YAML; repeatable), e.g. --set "
        "language.train.steps=3200: the report's provenance records the command and its plan",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    from attnzoo._lock import DirectoryLocked
    from attnzoo.reproduce.runner import ReproduceError, plan, resolve_sections, run, stored_records, summary_line

    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    try:
        if args.list:
            sections = resolve_sections(args.only)
            for s in (s for s in plan(args.budget, args.seed, args.set)[1] if s.section in sections):
                print(f"{s.id}  [{s.hash}]" + (f"  (needs {', '.join(s.deps)})" if s.deps else ""))
            return 0
        if args.check_plan:
            from attnzoo.reproduce.plan_check import render_size_checks, size_checks

            checks = size_checks(plan(args.budget, args.seed, args.set)[1])
            print(render_size_checks(checks), end="")
            return 1 if any(c.planned and not c.holds for c in checks) else 0
        if args.estimate:
            from attnzoo.reproduce.estimate import estimate, render_estimate

            if not args.reuse:
                raise ReproduceError(
                    "--estimate times the plan from earlier runs: give one or more with --reuse RESULTS"
                )
            # a later source's record of a step wins, as with --reuse
            records = {sid: rec for source in args.reuse for sid, rec in stored_records(source).items()}
            sections = resolve_sections(args.only)
            steps = [s for s in plan(args.budget, args.seed, args.set)[1] if s.section in sections]
            print(render_estimate(estimate(steps, records, args.jobs), args.reuse), end="")
            return 0
        kw = dict(seed=args.seed, only=args.only, device=args.device, threads=args.threads, reuse=args.reuse)
        kw |= dict(jobs=args.jobs, report_only=args.report_only, progress=not args.no_progress, settings=args.set)
        outcome = run(args.out, args.budget, argv=argv, **kw)
    except (ReproduceError, DirectoryLocked) as e:
        from attnzoo.cli import debug_enabled

        if debug_enabled():
            raise
        print(f"attnzoo reproduce: error: {e}", file=sys.stderr)
        return 1 if isinstance(e, DirectoryLocked) else 2
    if outcome.interrupted:
        return 130
    print(summary_line(outcome))
    for sid, why in outcome.failed.items():
        print(f"  failed: {sid}: {why}", file=sys.stderr)
    return 1 if outcome.failed else 0

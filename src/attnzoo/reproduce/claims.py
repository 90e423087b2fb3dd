"""Checking the papers' claims against measured numbers: every verdict is computed, with its rule stated.

A finding is a dict ``{paper, claim, paper_value, measured, verdict, rule}``. Verdicts:
``agrees``, ``disagrees``, ``inconclusive`` (inside the tolerance band of an ordering claim) and
``not tested`` (the run lacks a model or a length the claim needs).
"""
from __future__ import annotations

__all__ = ["ACC_TOL", "compare", "finding", "not_tested", "VERDICTS"]

#: accuracy difference (percentage points) within which two single-seed laptop runs are called comparable
ACC_TOL = 2.0

VERDICTS = ("agrees", "disagrees", "inconclusive", "not tested")


def finding(paper: str, claim: str, paper_value: str, measured: str, verdict: str, rule: str) -> dict:
    if verdict not in VERDICTS:
        raise ValueError(f"verdict {verdict!r} is not one of {VERDICTS}")
    return {"paper": paper, "claim": claim, "paper_value": paper_value, "measured": measured, "verdict": verdict,
            "rule": rule}


def not_tested(paper: str, claim: str, paper_value: str, why: str) -> dict:
    return finding(paper, claim, paper_value, why, "not tested", "-")


def compare(a: float | None, b: float | None, *, kind: str, tol: float, unit: str, paper: str, claim: str,
            paper_value: str, a_name: str, b_name: str, lower_is_better: bool = False) -> dict:
    """Verdict on ``a`` (the paper's mechanism) against ``b`` (its baseline).

    ``kind="comparable"``: agrees when ``a`` is better than ``b`` or worse by at most ``tol``.
    ``kind="at_least"``: agrees when ``a`` is at least as good as ``b``; disagrees when worse by more than
    ``tol``; inconclusive in between. ``lower_is_better`` flips the direction (losses, errors).
    """
    if a is None or b is None:
        return not_tested(paper, claim, paper_value, f"no measurement for {a_name if a is None else b_name}")
    gain = (b - a) if lower_is_better else (a - b)  # > 0: the paper's mechanism is better
    better = "lower" if lower_is_better else "higher"
    measured = f"{a_name} {a:.3g} vs {b_name} {b:.3g} ({'+' if a - b >= 0 else ''}{a - b:.3g} {unit})"
    if kind == "comparable":
        verdict = "agrees" if gain >= -tol else "disagrees"
        rule = f"agrees if {a_name} is {better} or within {tol:g} {unit} of {b_name}"
    elif kind == "at_least":
        verdict = "agrees" if gain >= 0 else ("disagrees" if gain < -tol else "inconclusive")
        rule = (f"agrees if {a_name} is at least as good as {b_name} ({better} is better); disagrees if worse by "
                f"> {tol:g} {unit}, else inconclusive")
    else:
        raise ValueError(f"kind must be 'comparable' or 'at_least', got {kind!r}")
    return finding(paper, claim, paper_value, measured, verdict, rule)

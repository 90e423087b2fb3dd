"""Checking the papers' claims against measured numbers: every verdict is computed, with its rule stated.

A finding is a dict ``{paper, claim, paper_value, measured, verdict, rule, seeds, explanation}``. Verdicts:
``agrees``, ``disagrees``, ``inconclusive`` and ``not tested`` (the run lacks a model or a length the claim
needs). ``seeds`` is how many seeds the numbers rest on; ``explanation`` names the ablation run for a
disagreement (and its numbers), or is empty.

Trained figures are :class:`Stat` objects (one value per seed). A verdict on "``a`` is at least as good as
``b``" (or "within ``tol`` of ``b``") accounts for their spread: with ``gain`` the oriented difference of the
means and ``se = sqrt(s_a^2/n_a + s_b^2/n_b)`` its standard error,

* ``agrees`` when ``gain >= -tol`` (the point estimate lies on the paper's side of the line),
* ``disagrees`` only when ``gain < -tol - 2 se`` (contradicted by more than two standard errors),
* ``inconclusive`` in between, and whenever a side has a single seed (its spread is unknown), with the spread
  stated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

__all__ = ["ACC_TOL", "Stat", "stat", "compare", "finding", "not_tested", "VERDICTS", "verdict_from_stats"]

#: accuracy difference (percentage points) within which two models are called comparable by a "comparable" claim
ACC_TOL = 2.0

VERDICTS = ("agrees", "disagrees", "inconclusive", "not tested")


@dataclass(frozen=True)
class Stat:
    """One figure measured over seeds: ``values`` in seed order."""

    values: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return sum(self.values) / len(self.values)

    @property
    def std(self) -> float | None:
        """Sample standard deviation (``ddof=1``); ``None`` for a single seed."""
        if self.n < 2:
            return None
        m = self.mean
        return math.sqrt(sum((v - m) ** 2 for v in self.values) / (self.n - 1))

    @property
    def sem(self) -> float | None:
        s = self.std
        return None if s is None else s / math.sqrt(self.n)

    def fmt(self, spec: str = ".3g") -> str:
        """``mean ± std`` (``mean`` alone for one seed)."""
        s = self.std
        return format(self.mean, spec) if s is None else f"{format(self.mean, spec)} ± {format(s, spec)}"

    def scaled(self, k: float) -> "Stat":
        return Stat(tuple(k * v for v in self.values))

    def __str__(self) -> str:
        return self.fmt()


def stat(values: float | Iterable[float | None] | Stat | None) -> Stat | None:
    """A :class:`Stat` from a number, a sequence (``None`` entries dropped) or a Stat; ``None`` if empty."""
    if values is None:
        return None
    if isinstance(values, Stat):
        return values
    if isinstance(values, (int, float)):
        return Stat((float(values),)) if math.isfinite(values) else None
    vals = tuple(float(v) for v in values if v is not None and math.isfinite(float(v)))
    return Stat(vals) if vals else None


def finding(
    paper: str,
    claim: str,
    paper_value: str,
    measured: str,
    verdict: str,
    rule: str,
    *,
    seeds: int = 1,
    explanation: str = "",
) -> dict:
    if verdict not in VERDICTS:
        raise ValueError(f"verdict {verdict!r} is not one of {VERDICTS}")
    if not isinstance(seeds, int) or seeds < 0:
        raise ValueError(f"seeds must be a non-negative int, got {seeds!r}")
    return {
        "paper": paper,
        "claim": claim,
        "paper_value": paper_value,
        "measured": measured,
        "verdict": verdict,
        "rule": rule,
        "seeds": seeds,
        "explanation": explanation,
    }


def not_tested(paper: str, claim: str, paper_value: str, why: str) -> dict:
    return finding(paper, claim, paper_value, why, "not tested", "-", seeds=0)


def verdict_from_stats(
    a: Stat, b: Stat, *, threshold: float, lower_is_better: bool = False
) -> tuple[str, float, float | None]:
    """``(verdict, gain, se)`` for the claim "``a`` is better than ``b`` by at least ``threshold``".

    ``gain`` is the difference of the means oriented so that positive favours ``a``; ``threshold`` is in the
    same units (0 for "at least as good", ``-tol`` for "within tol"). See the module docstring for the rule.
    """
    gain = (b.mean - a.mean) if lower_is_better else (a.mean - b.mean)
    se = None
    if a.n >= 2 and b.n >= 2:
        se = math.sqrt(a.std**2 / a.n + b.std**2 / b.n)
    if gain >= threshold:
        return "agrees", gain, se
    if se is not None and gain < threshold - 2 * se:
        return "disagrees", gain, se
    return "inconclusive", gain, se


def compare(
    a: float | Sequence[float] | Stat | None,
    b: float | Sequence[float] | Stat | None,
    *,
    kind: str,
    tol: float,
    unit: str,
    paper: str,
    claim: str,
    paper_value: str,
    a_name: str,
    b_name: str,
    lower_is_better: bool = False,
    relative: bool = False,
    spec: str = ".3g",
) -> dict:
    """Verdict on ``a`` (the paper's mechanism, one value per seed) against ``b`` (its baseline).

    ``kind="comparable"``: the paper's side is "better than ``b`` or worse by at most ``tol``";
    ``kind="at_least"``: "at least as good as ``b``". ``relative=True`` reads ``tol`` as a fraction of ``b``'s
    mean (losses: "at most 15% above"). ``lower_is_better`` flips the direction (losses, errors). A contradiction
    is a disagreement only beyond two standard errors of the difference of the means.
    """
    if kind not in ("comparable", "at_least"):
        raise ValueError(f"kind must be 'comparable' or 'at_least', got {kind!r}")
    sa, sb = stat(a), stat(b)
    if sa is None or sb is None:
        return not_tested(paper, claim, paper_value, f"no measurement for {a_name if sa is None else b_name}")
    tol_abs = tol * abs(sb.mean) if relative else tol
    threshold = -tol_abs if kind == "comparable" else 0.0
    verdict, gain, se = verdict_from_stats(sa, sb, threshold=threshold, lower_is_better=lower_is_better)
    diff = sa.mean - sb.mean
    n = min(sa.n, sb.n)
    rel = f", {100 * diff / sb.mean:+.1f}%" if relative and sb.mean else ""
    measured = (
        f"{a_name} {sa.fmt(spec)} vs {b_name} {sb.fmt(spec)} ({'+' if diff >= 0 else ''}{diff:.3g} {unit}{rel}"
        + (f"; se of the difference {se:.2g}" if se is not None else "")
        + f"; {n} seed{'s' if n != 1 else ''})"
    )
    better = "lower" if lower_is_better else "higher"
    side = (
        f"{a_name} is {better} or within {tol:g}{'x' + b_name if relative else ' ' + unit} of {b_name}"
        if kind == "comparable"
        else f"{a_name} is at least as good as {b_name} ({better} is better)"
    )
    rule = (
        f"agrees if {side} (difference of the means); disagrees only if contradicted by more than 2 standard "
        "errors of the difference; else inconclusive (always with one seed)"
    )
    if verdict == "inconclusive":
        spread = (
            f"spread: {a_name} sd {_sd(sa)}, {b_name} sd {_sd(sb)}"
            if se is not None
            else "one seed: the spread between seeds is unknown"
        )
        measured += f" [{spread}]"
    return finding(paper, claim, paper_value, measured, verdict, rule, seeds=n)


def _sd(s: Stat) -> str:
    return "-" if s.std is None else f"{s.std:.3g}"

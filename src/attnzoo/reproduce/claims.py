"""The report's rule for a paper claim: a :class:`Finding` per tested claim, its verdict computed and its rule stated.

A trained comparison (:func:`compare`) gives ``effect``, the difference of the seed means oriented so that positive
favours the claim, with its 95% Welch-t interval ``ci95``. A *superiority* claim ("A beats B") has margin 0, a
*non-inferiority* claim ("A is comparable to B") the largest gap the paper calls comparable (``margin_source``). It
**agrees** when the whole interval lies above ``-margin``, **disagrees** when wholly below it (a superiority claim
with the paper's own effect ``E``: below :data:`REFUTE_FRACTION` x ``E``), else it is inconclusive (always with one
seed a side). Cost and speed figures measured once keep rules of their own (``measurement``). The gates
(:data:`GATES`) make a decided verdict ``inconclusive`` when a precondition fails.
"""

from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass, fields
from typing import Iterable, Sequence

from attnzoo.reproduce import paper_claims

__all__ = [
    "Finding",
    "FINDING_SCHEMA",
    "GATES",
    "REFUTE_FRACTION",
    "trend_gate",
    "Stat",
    "stat",
    "welch_ci",
    "verdict_from_ci",
    "compare",
    "finding",
    "not_tested",
    "gate",
    "explain",
    "numbers_verdict",
    "size_gate",
    "SIZE_TOLERANCE",
    "within_ratio",
    "margin_control_gate",
    "untuned_control_gate",
    "compared_row_gate",
    "replicated_gate",
    "plateau_gate",
    "VERDICTS",
    "change_word",
]

VERDICTS = ("agrees", "disagrees", "inconclusive", "not tested")
KINDS = ("paper", "check")
CLAIM_TYPES = ("superiority", "non-inferiority")


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

    def fmt(self, spec: str = ".3g") -> str:
        """``mean ± std`` (``mean`` alone for one seed)."""
        s = self.std
        return format(self.mean, spec) if s is None else f"{format(self.mean, spec)} ± {format(s, spec)}"

    def scaled(self, k: float) -> "Stat":
        return Stat(tuple(k * v for v in self.values))

    def __str__(self) -> str:
        return self.fmt()


#: what a figure over seeds may be given as: one value, one per seed, a :class:`Stat`, or nothing measured
Values = float | Sequence[float] | Stat | None


#: version of :class:`Finding`'s serialised form in results.json (raised when a field changes meaning)
FINDING_SCHEMA = 1


@dataclass
class Finding:
    """One tested claim with the fields of results.json (:data:`FINDING_SCHEMA`), read and written as a mapping of
    the declared fields only (a field is present when set): a new key is a schema change, not an unseen typo."""

    # every finding
    claim_id: str
    kind: str
    paper: str
    claim: str
    paper_value: str
    measured: str
    verdict: str
    rule: str
    seeds: int
    explanation: str
    measurement: bool | None = None
    trained: bool | None = None
    # a trained comparison (:func:`compare`)
    claim_type: str | None = None
    a_name: str | None = None
    b_name: str | None = None
    unit: str | None = None
    effect: float | None = None
    ci95: list[float] | None = None
    df: float | None = None
    margin: float | None = None
    margin_source: str | None = None
    margin_rel: float | None = None
    values_a: list[float] | None = None
    values_b: list[float] | None = None
    lower_is_better: bool | None = None
    paper_effect: float | None = None
    refute_below: float | None = None
    params_a: int | None = None
    params_b: int | None = None
    flops_a: int | None = None
    flops_b: int | None = None
    # gates (:func:`gate`) and their evidence
    gate: str | None = None
    gate_reasons: list[str] | None = None
    ungated_verdict: str | None = None
    gates_section: bool | None = None
    control_effect: float | None = None
    control_ci95: list[float] | None = None
    random_init_control: dict | None = None
    literal_measure: dict | None = None
    probe_model: str | None = None
    # evidence at twice the steps (:func:`trend_gate`, :func:`replicated_gate`)
    trend_2x: dict | None = None
    replicated_2x: dict | None = None
    at_2x: dict | None = None
    paired_2x: dict | None = None
    compared_row_change: float | None = None
    longer_run: str | None = None
    # a comparison's verdict in words (``attnzoo compare``)
    reading: str | None = None

    @classmethod
    def from_dict(cls, d: dict) -> "Finding":
        unknown = sorted(set(d) - _FIELDS)
        if unknown:
            raise ValueError(
                f"finding {d.get('claim_id') or d.get('claim')!r} has fields {unknown} that Finding does not declare "
                f"(schema {FINDING_SCHEMA}); declare them in attnzoo.reproduce.claims.Finding"
            )
        return cls(**{"claim_id": "", **d})

    def to_dict(self) -> dict:
        """The fields that are set, in declaration order; a comparison's interval even when null (one seed a side)."""
        keep = _INTERVAL if self.claim_type else ()
        return {k: v for k, v in asdict(self).items() if v is not None or k in keep}

    @classmethod
    def checked(cls, f: "Finding | dict") -> dict:
        """The serialised form of ``f`` (a dict is read through :meth:`from_dict`, which refuses unknown keys)."""
        return (f if isinstance(f, Finding) else cls.from_dict(f)).to_dict()

    def _field(self, key: str) -> str:
        if key not in _FIELDS:
            raise KeyError(f"{key!r} is not a field of Finding (schema {FINDING_SCHEMA})")
        return key

    def __getitem__(self, key: str):
        return getattr(self, self._field(key))

    def __setitem__(self, key: str, value) -> None:
        setattr(self, self._field(key), value)

    def __contains__(self, key: object) -> bool:
        return key in _FIELDS and getattr(self, key) is not None

    def get(self, key: str, default=None):
        v = getattr(self, key, None) if key in _FIELDS else None
        return default if v is None else v

    def keys(self) -> list[str]:
        return list(self.to_dict())

    def __iter__(self):
        return iter(self.keys())


_FIELDS = frozenset(f.name for f in fields(Finding))
_INTERVAL = ("ci95", "df")


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


def welch_ci(
    a: Stat, b: Stat, *, lower_is_better: bool = False, level: float = 0.95
) -> tuple[float, tuple[float, float] | None, float | None]:
    """``(effect, (lo, hi), df)``: ``effect = mean(a) - mean(b)`` (negated when lower is better) ± ``t_{(1+level)/2,
    df} · sqrt(s_a²/n_a + s_b²/n_b)``, ``df`` by Welch-Satterthwaite; no interval with one seed a side."""
    from scipy.stats import t as student_t

    effect = (b.mean - a.mean) if lower_is_better else (a.mean - b.mean)
    if abs(effect) <= 64 * sys.float_info.epsilon * max(abs(a.mean), abs(b.mean)):
        effect = 0.0  # equal means summed in another order differ by rounding; a tie prints as 0, not 7e-15
    if a.n < 2 or b.n < 2:
        return effect, None, None
    va, vb = a.std**2 / a.n, b.std**2 / b.n
    se = math.sqrt(va + vb)
    if se == 0.0:
        return effect, (effect, effect), float(a.n + b.n - 2)
    df = (va + vb) ** 2 / (va**2 / (a.n - 1) + vb**2 / (b.n - 1))
    half = float(student_t.ppf(0.5 + level / 2, df)) * se
    return effect, (effect - half, effect + half), df


#: a superiority claim ("A beats B") disagrees when its whole interval lies below this fraction of the paper's own
#: effect: the data then exclude every gain half as large as the paper's, so the paper's effect is not seen here even
#: if it was overstated twofold. Without a stated effect only an interval wholly below zero refutes it.
REFUTE_FRACTION = 0.5


def verdict_from_ci(ci: tuple[float, float] | None, margin: float, refute_below: float | None = None) -> str:
    """The rule: the whole interval above ``-margin`` agrees, wholly below ``-margin`` (or ``refute_below``, a
    superiority claim's :data:`REFUTE_FRACTION` of the paper's effect) disagrees."""
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    if ci is None:
        return "inconclusive"
    lo, hi = ci
    if lo > -margin:
        return "agrees"
    if hi < (-margin if refute_below is None else refute_below):
        return "disagrees"
    return "inconclusive"


def finding(
    paper: str,
    claim: str,
    paper_value: str,
    measured: str,
    verdict: str,
    rule: str,
    *,
    kind: str,
    seeds: int = 1,
    explanation: str = "",
    measurement: bool = False,
    claim_id: str = "",
) -> Finding:
    """A :class:`Finding`; ``measurement=True`` marks a cost or speed figure measured once."""
    if verdict not in VERDICTS:
        raise ValueError(f"verdict {verdict!r} is not one of {VERDICTS}")
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r} is not one of {KINDS}")
    if not isinstance(seeds, int) or seeds < 0:
        raise ValueError(f"seeds must be a non-negative int, got {seeds!r}")
    return Finding(
        claim_id, kind, paper, claim, paper_value, measured, verdict, rule, seeds, explanation, measurement or None
    )


def not_tested(
    paper: str, claim: str, paper_value: str, why: str, *, kind: str = "paper", claim_id: str = ""
) -> Finding:
    return finding(paper, claim, paper_value, why, "not tested", "-", kind=kind, seeds=0, claim_id=claim_id)


def compare(
    a: Values,
    b: Values,
    *,
    claim_type: str,
    unit: str,
    paper: str,
    claim: str,
    paper_value: str,
    a_name: str,
    b_name: str,
    kind: str = "paper",
    margin: float = 0.0,
    margin_source: str = "",
    lower_is_better: bool = False,
    relative: bool = False,
    spec: str = ".3g",
    claim_id: str = "",
    paper_effect: float | None = None,
) -> Finding:
    """Verdict on ``a`` (the paper's mechanism, per seed) against ``b`` (its baseline) by the module's rule.

    ``margin`` is in ``unit`` (a fraction of ``b``'s mean with ``relative``); ``paper_effect`` (superiority only,
    oriented like ours) refutes below :data:`REFUTE_FRACTION` of it."""
    if claim_type not in CLAIM_TYPES:
        raise ValueError(f"claim_type must be one of {CLAIM_TYPES}, got {claim_type!r}")
    if claim_type == "superiority" and margin != 0:
        raise ValueError(f"a superiority claim has margin 0, got {margin}")
    if claim_type == "non-inferiority" and (margin <= 0 or not margin_source):
        raise ValueError(
            f"a non-inferiority claim needs margin > 0 and the paper's comparison it comes from (margin_source), "
            f"got margin={margin!r}, margin_source={margin_source!r}"
        )
    sa, sb = stat(a), stat(b)
    if sa is None or sb is None:
        missing = a_name if sa is None else b_name
        return not_tested(paper, claim, paper_value, f"no measurement for {missing}", kind=kind, claim_id=claim_id)
    margin_abs = margin * abs(sb.mean) if relative else float(margin)
    if paper_effect is None and claim_type == "superiority" and claim_id:
        paper_effect = _table_effect(claim_id)
    refute = _refute_below(claim_type, paper_effect)
    effect, ci, df = welch_ci(sa, sb, lower_is_better=lower_is_better)
    verdict = verdict_from_ci(ci, margin_abs, refute)
    n = min(sa.n, sb.n)
    rel = f", {100 * (sa.mean - sb.mean) / sb.mean:+.1f}%" if relative and sb.mean else ""
    ci_txt = f"95% CI [{ci[0]:+.3g}, {ci[1]:+.3g}]" if ci is not None else "one seed: no interval"
    measured = (
        f"{a_name} {sa.fmt(spec)} vs {b_name} {sb.fmt(spec)}: effect {effect:+.3g} {unit}{rel}, {ci_txt} "
        f"({sa.n} vs {sb.n} seeds)"
    )
    rule = _rule_text(claim_type, lower_is_better, margin, margin_abs, relative, margin_source, b_name, unit, refute)
    f = finding(paper, claim, paper_value, measured, verdict, rule, kind=kind, seeds=n, claim_id=claim_id)
    f.claim_type, f.a_name, f.b_name, f.unit = claim_type, a_name, b_name, unit
    f.effect, f.ci95, f.df = effect, list(ci) if ci is not None else None, df
    f.margin, f.margin_source, f.margin_rel = margin_abs, margin_source, float(margin) if relative else None
    f.values_a, f.values_b, f.lower_is_better = list(sa.values), list(sb.values), lower_is_better
    if refute is not None:
        f.paper_effect, f.refute_below = float(paper_effect), refute
    return f


def _rule_text(claim_type, lower_is_better, margin, margin_abs, relative, margin_source, b_name, unit, refute) -> str:
    """The finding's rule in words, with its own margin and source or its refuting bar."""
    better = "lower" if lower_is_better else "higher"
    if claim_type == "superiority":
        below = (
            f"below {REFUTE_FRACTION:g}x the paper's effect {refute / REFUTE_FRACTION:+.3g} = {refute:+.3g}"
            if refute is not None
            else "below 0"
        )
        return (
            f"superiority ({better} is better): agrees if the 95% Welch-t CI of the effect lies above 0, "
            f"disagrees if it lies {below}, else inconclusive"
        )
    m_txt = f"{margin:g}×{b_name}'s mean = {margin_abs:.3g} {unit}" if relative else f"{margin:g} {unit}"
    return (
        f"non-inferiority, margin {m_txt} ({margin_source}): agrees if the 95% Welch-t CI of the effect lies "
        f"above -{margin_abs:.3g}, disagrees if below, else inconclusive"
    )


def _table_effect(claim_id: str) -> float | None:
    """The claim table's effect of a superiority claim; an LRA task's test has none (the paper's is the average's)."""
    rec = paper_claims.get(claim_id)
    if paper_claims.test_of(claim_id) in set(paper_claims.LRA_TESTS) - {"average"}:
        return None
    return getattr(rec, "paper_effect", None)


def _refute_below(claim_type: str, paper_effect: float | None) -> float | None:
    if claim_type != "superiority" or paper_effect is None:
        return None
    if not (math.isfinite(paper_effect) and paper_effect > 0):
        raise ValueError(f"a superiority claim's paper_effect must be finite and > 0 (oriented), got {paper_effect}")
    return REFUTE_FRACTION * paper_effect


@dataclass(frozen=True)
class GateRule:
    """A precondition of a verdict: which decided verdicts it can hold back, and the argument for that direction."""

    holds_back: tuple[str, ...]
    why: str


#: why a verdict can be gated (``gate``'s ``reason``; the summary counts them), with the verdicts each holds back. The
#: report's legend prints these arguments; a gate that holds back one direction says why the other needs none.
GATES: dict[str, GateRule] = {
    "plateau": GateRule(
        ("agrees", "disagrees"),
        "a comparison still moving with the steps can cross its boundary either way, so neither verdict is shown to "
        "hold with more training",
    ),
    "not tuned": GateRule(
        ("agrees", "disagrees"),
        "a row away from its best learning rate can score higher or lower than at it, so either verdict could be "
        "the rate's and not the mechanism's",
    ),
    "did not learn": GateRule(
        ("agrees", "disagrees"),
        "a row that did not learn the task measures the set-up, not the mechanism, whichever side its interval "
        "falls on",
    ),
    "conditions": GateRule(
        ("agrees", "disagrees"),
        "under other sizes or settings than the paper's, the test is of another claim, whichever way it comes out",
    ),
    "control": GateRule(
        ("agrees",),
        "a control that shows the claimed effect without what the claim credits (a model without attention inside "
        "the margin, an untrained model's layers) would agree as well, so an agreement says nothing of the "
        "mechanism; a disagreement needs no such gate: the mechanism is then shown worse than the margin (or its "
        "trained layers short of what even the control shows), which the control does not explain",
    ),
}
GATE_REASONS = tuple(GATES)


def gate(f: Finding, why: str, reason: str) -> Finding:
    """Make a decided verdict ``inconclusive`` (kept in ``ungated_verdict``) because a precondition fails.

    Only the verdicts :data:`GATES` names for ``reason`` are held back; for the others ``why`` goes to the
    explanation. ``why`` is appended to ``gate`` and ``reason`` to ``gate_reasons``."""
    if reason not in GATES:
        raise ValueError(f"unknown gate reason {reason!r}; valid: {GATE_REASONS}")
    if numbers_verdict(f) in ("agrees", "disagrees") and numbers_verdict(f) not in GATES[reason].holds_back:
        return explain(f, f"{why} (a {reason} gate, which does not hold back a verdict that {numbers_verdict(f)})")
    if f.verdict in ("agrees", "disagrees"):
        f.ungated_verdict, f.verdict = f.verdict, "inconclusive"
    f.gate = f"{f.gate}; {why}" if f.gate else why
    f.gate_reasons = sorted(set(f.gate_reasons or []) | {reason})
    return f


def explain(f: Finding, text: str) -> Finding:
    """Append ``text`` to ``f``'s explanation (the footnote a reader sees under the table)."""
    f.explanation = f"{f.explanation}; {text}" if f.explanation else text
    return f


#: how far (relative, either way) a pair's parameter ratio may be from the paper's and still count as its conditions
SIZE_TOLERANCE = 0.10


def within_ratio(here: float, paper: float, tolerance: float = SIZE_TOLERANCE) -> bool:
    """Whether the ratio ``here`` is within ``tolerance`` (relative, either way) of the ratio ``paper``."""
    return 1 / (1 + tolerance) <= here / paper <= 1 + tolerance


def size_gate(
    f: Finding, paper_ratios: dict[tuple[str, str], tuple[float, str]], tolerance: float = SIZE_TOLERANCE
) -> Finding:
    """Gate ``f`` on conditions when ``params_a / params_b`` is not :func:`within_ratio` of
    ``paper_ratios[(a_name, b_name)]``, the ratio of the paper's own comparison and its source."""
    paper = paper_ratios.get((f.a_name, f.b_name))
    pa, pb = f.params_a, f.params_b
    if paper is None or not (pa and pb):
        return f
    paper_ratio, source = paper
    here = pa / pb
    if not within_ratio(here, paper_ratio, tolerance):
        gate(
            f,
            f"parameters {here:.2f}x here against {paper_ratio:.2f}x in the paper ({source}): more than "
            f"{tolerance:.0%} apart, so the sizes are not the paper's",
            "conditions",
        )
    return f


def margin_control_gate(
    f: Finding, control: Values, control_name: str, twin: tuple[str, Stat] | None = None
) -> Finding:
    """Gate a non-inferiority finding when its margin admits ``control``, a model without attention.

    The control is judged against the finding's baseline (or ``twin``, ``(name, metric)``: the control's own skeleton
    with attention, where the baseline differs in more than the token mixer). Unless its 95% Welch-t interval lies
    wholly below ``-margin``, an "agrees" cannot tell the mechanism from no token mixing; a "disagrees" stays."""
    sc = stat(control)
    if f.claim_type != "non-inferiority" or sc is None or not f.values_b:
        return f
    base_name, sb = twin if twin is not None else (f.b_name, stat(f.values_b))
    # the control's effect against the same baseline, oriented like the finding's (positive favours "comparable")
    effect, ci, _ = welch_ci(sc, sb, lower_is_better=bool(f.lower_is_better))
    f.control_effect, f.control_ci95 = effect, list(ci) if ci else None
    top = ci[1] if ci else effect
    if top > -f.margin:
        where = f"{effect:+.3g} [{ci[0]:+.3g}, {ci[1]:+.3g}]" if ci else f"{effect:+.3g}"
        gate(
            f,
            f"the margin admits no attention: {control_name} is {where} {f.unit or ''} from {base_name}, "
            f"not shown outside the margin {f.margin:.3g}",
            "control",
        )
    return f


def untuned_control_gate(f: Finding, why: str | None, control_name: str) -> Finding:
    """Gate a finding whose margin test (:func:`margin_control_gate`) passed on a control that is not tuned (``why``):
    at a better rate the control could come inside the margin."""
    if why and f.control_effect is not None and "control" not in (f.gate_reasons or []):
        gate(
            f,
            f"the margin test's control is not tuned: {why}, so it is not shown to lose by more than the "
            f"margin ({control_name})",
            "control",
        )
    return f


def plateau_gate(
    findings: list[Finding],
    baseline: str,
    base: Stat | None,
    longer: Stat | None,
    unit: str,
    spec: str = ".3g",
    curves: str = "",
    longer_run: str = "at twice the steps",
) -> dict:
    """The plateau evidence of a section's baseline, applied to the section's trained comparisons.

    ``change`` is how far the baseline's metric (seed means) moves at twice the steps. A verdict decided by its
    interval stands only if that interval clears the boundary (``-margin``) by more than ``|change|``; the others,
    and all without a run at twice the steps, are gated. The baseline has plateaued when every decided verdict
    stands (never when none is decided: there is no bar). ``curves`` (the validation curves in words) end the text;
    ``longer_run`` is how it names the baseline's longer run.
    Returns ``{"baseline", "plateaued", "change", "smallest_effect", "standing", "gated", "text"}``."""
    compared = [f for f in findings if f.claim_type]
    # the numbers' verdict (before any other gate): each precondition is judged on its own
    decided = [f for f in compared if numbers_verdict(f) in ("agrees", "disagrees") and f.ci95]
    clearance = {id(f): _clearance(f) for f in decided}
    smallest = min(clearance.values()) if clearance else None
    if base is None or longer is None:
        change = None
        fails = compared
        text = f"{baseline}: no run {longer_run}, so its plateau is not shown"
    else:
        # a plateau run of fewer seeds (the first ones) is compared with the same seeds of the baseline: the seeds'
        # spread is not a change with the steps (one seed against a three-seed mean mixes the two)
        paired, change = _paired_change(base, longer)
        drift = [f for f in decided if clearance[id(f)] <= abs(change)]
        # a comparison replicated at twice the steps is judged on that (:func:`replicated_gate`), not on this drift
        fails = [f for f in drift if f.replicated_2x is None]
        same = (
            f"; on the same seed{'s' if longer.n > 1 else ''} ({longer.n} of {base.n}): {paired.mean:{spec}} -> "
            f"{longer.mean:{spec}}"
            if paired is not base
            else ""
        )
        text = (
            f"{baseline} {longer_run}: {longer.fmt(spec)} vs {base.fmt(spec)} {unit}{same} (change "
            f"{change:+.3g}); "
            + (
                "no decided comparison in this section to set the bar"
                if smallest is None
                else f"{len(decided) - len(drift)} of {len(decided)} decided verdicts clear their boundary by more "
                f"than {abs(change):.3g} {unit} and stand"
            )
        )
        if len(drift) > len(fails):
            text += (
                f"; {len(drift) - len(fails)} more {'is' if len(drift) - len(fails) == 1 else 'are'} judged on "
                f"{'its' if len(drift) - len(fails) == 1 else 'their'} comparison at twice the steps instead"
            )
    for f in fails:
        # the section's plateau evidence is printed once, under its tables; the note says what decides this claim
        why = (
            f"{baseline} has no run {longer_run}"
            if change is None
            else f"{baseline} moved {change:+.3g} {unit} {longer_run}, at least the {clearance[id(f)]:.3g} by which "
            "this interval clears its boundary"
        )
        gate(f, f"the baseline is not shown to plateau for it: {why}", "plateau")
    # with nothing decided there is no bar to clear, so no plateau is shown (however small the change)
    ok = change is not None and bool(decided) and not fails
    if change is not None and not decided:
        text += ", so its plateau is not shown"
    if curves:
        text += f"; validation curves (seed means): {curves}"
    return {
        "baseline": baseline,
        "plateaued": ok,
        "change": change,
        "smallest_effect": smallest,
        "standing": len(decided) - (len(fails) if change is not None else len(decided)),
        "gated": len(fails),
        "text": text,
    }


def trend_gate(f: Finding, e2: float, ci2: tuple[float, float], margin2: float, at2: str) -> Finding:
    """The one trend rule for a decided comparison with evidence at twice the steps (``e2``, ``ci2``, ``margin2``,
    from ``at2``): it stands only if the same rule gives the same verdict there and the interval there clears its
    boundary by more than the effect moved in that doubling; else it is gated (``plateau``)."""
    v1 = numbers_verdict(f)
    v2 = verdict_from_ci(ci2, margin2, f.refute_below)
    move = e2 - f.effect
    c2 = _clearance_of(v2, ci2, margin2, f.refute_below) if v2 != "inconclusive" else None
    f.trend_2x = {"effect": e2, "ci95": list(ci2), "margin": margin2, "verdict": v2, "move": move, "clearance": c2}
    said = (
        f"{at2}: the same rule gives {v2} (effect {f.effect:+.3g} -> {e2:+.3g} {f.unit or ''}, 95% CI "
        f"[{ci2[0]:+.3g}, {ci2[1]:+.3g}])"
    )
    if v2 != v1:
        return gate(f, f"{said}, not the verdict of the reported steps", "plateau")
    if c2 <= abs(move):
        return gate(
            f,
            f"{said}, but the effect moved {move:+.3g} in one doubling, at least the {c2:.3g} its interval there "
            "clears the boundary by: at that pace the next doubling could cross it",
            "plateau",
        )
    return explain(f, f"{said}; the effect moved {move:+.3g}, less than the {c2:.3g} it clears the boundary by there")


def replicated_gate(f: Finding, a_longer: Stat | None, b_longer: Stat | None, *, row: str, baseline: str) -> Finding:
    """Whether a comparison survives twice the steps, judged on the comparison itself.

    With two or more seeds a side there, its own rule (a relative margin re-read on the longer baseline) and
    :func:`trend_gate` decide, and the drift gates leave it alone (``replicated_2x``); an undecided one only says what
    the rule gives there. With fewer seeds, the effect on the seeds both longer runs share is described
    (``paired_2x``)."""
    if not f.ci95 or a_longer is None or b_longer is None:
        return f
    lower = bool(f.lower_is_better)
    unit = f.unit or ""
    decided = numbers_verdict(f) in ("agrees", "disagrees")
    if a_longer.n >= 2 and b_longer.n >= 2:
        m2 = f.margin_rel * abs(b_longer.mean) if f.margin_rel is not None else f.margin or 0.0
        e2, ci2, _ = welch_ci(a_longer, b_longer, lower_is_better=lower)
        at2 = f"at twice the steps ({row} {a_longer.n} vs {baseline} {b_longer.n} seeds, margin {m2:.3g})"
        if not decided:
            v2 = verdict_from_ci(ci2, m2, f.refute_below)
            f.at_2x = {"effect": e2, "ci95": list(ci2), "margin": m2, "verdict": v2}
            tail = (
                "; the verdict depends on the number of steps, so it stays inconclusive" if v2 != "inconclusive" else ""
            )
            return explain(
                f,
                f"{at2} the same rule gives {v2}: effect {e2:+.3g} {unit}, 95% CI [{ci2[0]:+.3g}, {ci2[1]:+.3g}]"
                + tail,
            )
        f.replicated_2x = {}  # marks the finding as judged at twice the steps (the gates below skip it)
        trend_gate(f, e2, ci2, m2, at2)
        f.replicated_2x = f.trend_2x
        return f
    if not decided:
        return f
    k = min(a_longer.n, b_longer.n, len(f.values_a), len(f.values_b))
    sign = -1.0 if lower else 1.0
    e1 = sign * (Stat(tuple(f.values_a[:k])).mean - Stat(tuple(f.values_b[:k])).mean)
    e2 = sign * (Stat(a_longer.values[:k]).mean - Stat(b_longer.values[:k]).mean)
    f.paired_2x = {"seeds": k, "effect_1x": e1, "effect_2x": e2}
    few = "one seed a side gives" if k == 1 else "so few seeds a side give"
    text = (
        f"on the {'seed' if k == 1 else f'{k} seeds'} both {row} and {baseline} ran at twice the steps, the effect "
        f"goes from {e1:+.4g} to {e2:+.4g} {unit}; {few} no interval at twice the steps, so the comparison is not "
        "replicated there"
    )
    return explain(f, text)


def compared_row_gate(f: Finding, row: str, base: Stat | None, longer: Stat | None, unit: str) -> Finding:
    """The trend test of a compared row (``f``'s side a) where only it ran at twice the steps: its move (on the seeds
    the longer run has) shifts the effect and its interval, and :func:`trend_gate` decides."""
    if base is None or longer is None or numbers_verdict(f) not in ("agrees", "disagrees") or not f.ci95:
        return f
    if f.replicated_2x is not None:  # judged on the comparison at twice the steps (:func:`replicated_gate`)
        return f
    paired, change = _paired_change(base, longer)
    f.compared_row_change = change
    shift = -change if f.lower_is_better else change
    lo, hi = f.ci95
    at2 = f"{row} itself moves {change:+.3g} {unit} at twice the steps ({paired.mean:.4g} -> {longer.mean:.4g})"
    return trend_gate(f, f.effect + shift, (lo + shift, hi + shift), f.margin or 0.0, at2)


def _paired_change(base: Stat, longer: Stat) -> tuple[Stat, float]:
    """How far a run at twice the steps moved: against the same (first) seeds of ``base`` when it has fewer."""
    paired = Stat(tuple(base.values[: longer.n])) if longer.n < base.n else base
    return paired, longer.mean - paired.mean


def numbers_verdict(f: Finding) -> str:
    """The verdict the numbers alone give, before any gate (a gated finding keeps it in ``ungated_verdict``)."""
    return f.ungated_verdict or f.verdict


def margin_sensitivity(f: Finding, other: float, label: str, *, relative: bool = True) -> Finding:
    """Say what a non-inferiority finding's interval gives with another of the paper's gaps as the margin (``other``:
    a fraction of the baseline, or in the effect's unit), here and at twice the steps; words only."""
    own = f.margin_rel if relative else f.margin
    if not f.ci95 or not own:
        return f
    m = f.margin * other / own
    parts = [f"{verdict_from_ci(f.ci95, m)} (margin {m:.3g})"]
    rep = f.replicated_2x
    if rep and rep.get("ci95"):
        m2 = rep["margin"] * other / own
        parts.append(f"at twice the steps {verdict_from_ci(rep['ci95'], m2)} (margin {m2:.3g})")
    verb = "the same intervals give " if rep and rep.get("ci95") else "the same interval gives "
    what = f"{label} ({other:.1%})" if relative else f"{label} ({other:g} {f.unit or ''})"
    return explain(f, f"with {what} as the margin, {verb}" + ", ".join(parts))


def _clearance(f: Finding) -> float:
    """How far a decided finding's 95% CI lies beyond its decision boundary, in the effect's unit."""
    return _clearance_of(numbers_verdict(f), f.ci95, f.margin or 0.0, f.refute_below)


def _clearance_of(verdict: str, ci, margin: float, refute_below: float | None = None) -> float:
    lo, hi = ci
    return lo + margin if verdict == "agrees" else (-margin if refute_below is None else refute_below) - hi


def change_word(before: float, after: float, *, noise: float) -> str:
    """How a gap (``before`` -> ``after``, oriented gaps, not scores) moved, in words, at resolution ``noise``.

    Into the noise from outside it: "is no longer distinguishable from zero" (equality is not shown); within it:
    "stays"; a sign change beyond it: "reverses"; else "shrinks" or "widens"."""
    if noise < 0 or not (math.isfinite(before) and math.isfinite(after) and math.isfinite(noise)):
        raise ValueError(f"change_word needs finite values and noise >= 0, got {before}, {after}, {noise}")
    if abs(after) <= noise < abs(before):
        return "is no longer distinguishable from zero"
    if abs(after - before) <= noise:
        return "stays"
    if before > noise and after < -noise:
        return "reverses"
    return "shrinks" if abs(after) < abs(before) else "widens"

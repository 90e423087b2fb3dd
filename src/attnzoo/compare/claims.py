"""A paper claim's :class:`Finding`: its verdict from a 95% Welch-t interval, the rule it states, and the gates.

A trained comparison's ``effect`` is the difference of the seed means, oriented so that positive favours the claim. It
agrees when the whole interval lies above ``-margin`` (0 for superiority, the paper's "comparable" gap for
non-inferiority) and disagrees when wholly below it (for a superiority claim with a stated effect ``E``: below
:data:`REFUTE_FRACTION` x ``E``); otherwise, and always with one seed a side, it is inconclusive. A gate (:data:`GATES`)
makes a decided verdict inconclusive when a precondition fails.
"""

from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass, fields
from typing import Iterable, Sequence

VERDICTS = ("agrees", "disagrees", "inconclusive", "not tested")
DECIDED = ("agrees", "disagrees")
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
        s = self.std
        return format(self.mean, spec) if s is None else f"{format(self.mean, spec)} ± {format(s, spec)}"

    def scaled(self, k: float) -> "Stat":
        return Stat(tuple(k * v for v in self.values))

    def __str__(self) -> str:
        return self.fmt()


#: a figure over seeds: one value, one per seed, a :class:`Stat`, or nothing measured
Values = float | Sequence[float] | Stat | None

#: version of :class:`Finding`'s serialised form in results.json (raised when a field changes meaning)
FINDING_SCHEMA = 2


@dataclass
class Finding:
    """One tested claim as results.json holds it; read as a mapping of the declared fields only, so that a new key is
    a schema change (:data:`FINDING_SCHEMA`), not an unseen typo."""

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
    # the gates and their evidence
    gate: str | None = None
    gate_reasons: list[str] | None = None
    ungated_verdict: str | None = None
    gates_section: bool | None = None
    control_effect: float | None = None
    control_ci95: list[float] | None = None
    control_ci99: list[float] | None = None
    dated_pilot: str | None = None
    #: how the plan came to this evidence where a reader must know it (a seed count chosen after a reading was seen)
    caveat: str | None = None
    #: what the compared rows differ in besides the mechanism (an architecture comparison), in words
    confound: str | None = None
    random_init_control: dict | None = None
    literal_measure: dict | None = None
    probe_model: str | None = None
    # evidence at twice the steps
    trend_2x: dict | None = None
    replicated_2x: dict | None = None
    at_2x: dict | None = None
    paired_2x: dict | None = None
    compared_row_change: float | None = None
    drift_2x: dict | None = None
    longer_run: str | None = None
    # the verdict in words (``attnzoo compare``)
    reading: str | None = None

    @classmethod
    def from_dict(cls, d: dict) -> "Finding":
        unknown = sorted(set(d) - _FIELDS)
        if unknown:
            raise ValueError(
                f"finding {d.get('claim_id') or d.get('claim')!r} has fields {unknown} that Finding does not declare "
                f"(schema {FINDING_SCHEMA}); declare them in attnzoo.compare.claims.Finding"
            )
        return cls(**{"claim_id": "", **d})

    def to_dict(self) -> dict:
        """The fields that are set; a comparison's interval even when null (one seed a side)."""
        keep = ("ci95", "df") if self.claim_type else ()
        return {k: v for k, v in asdict(self).items() if v is not None or k in keep}

    @classmethod
    def checked(cls, f: "Finding | dict") -> dict:
        """The serialised form of ``f``; a dict goes through :meth:`from_dict`, which refuses unknown keys."""
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


def stat(values: float | Iterable[float | None] | Stat | None) -> Stat | None:
    """A :class:`Stat` of a number, a sequence (``None``, non-finite entries dropped) or a Stat; ``None`` if empty."""
    if values is None or isinstance(values, Stat):
        return values
    if isinstance(values, (int, float)):
        return Stat((float(values),)) if math.isfinite(values) else None
    vals = tuple(float(v) for v in values if v is not None and math.isfinite(float(v)))
    return Stat(vals) if vals else None


def welch_ci(
    a: Stat, b: Stat, *, lower_is_better: bool = False, level: float = 0.95
) -> tuple[float, tuple[float, float] | None, float | None]:
    """``(effect, interval at level, df)`` of ``mean(a) - mean(b)`` (negated when lower is better), ``df`` by
    Welch-Satterthwaite; no interval with one seed a side."""
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


#: the stricter level every decided claim is checked at too (its interval and its control's): seed counts were raised
#: after earlier intervals
STRICT_LEVEL = 0.99

#: a superiority claim disagrees when its whole interval lies below this fraction of the paper's own effect: the data
#: then exclude every gain half as large as the paper's. Without a stated effect only an interval below 0 refutes it.
REFUTE_FRACTION = 0.5


def verdict_from_ci(ci: tuple[float, float] | None, margin: float, refute_below: float | None = None) -> str:
    """The rule: an interval wholly above ``-margin`` agrees, wholly below it (or ``refute_below``) disagrees."""
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    if ci is not None and ci[0] > -margin:
        return "agrees"
    if ci is not None and ci[1] < (-margin if refute_below is None else refute_below):
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
    for name, value, valid in (("verdict", verdict, VERDICTS), ("kind", kind, KINDS)):
        if value not in valid:
            raise ValueError(f"{name} {value!r} is not one of {valid}")
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

    ``margin`` is in ``unit``, or a fraction of ``b``'s mean with ``relative``. A superiority claim's ``paper_effect``
    (oriented like ours) sets its refuting bar."""
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
    superiority = claim_type == "superiority"
    refute = REFUTE_FRACTION * paper_effect if superiority and paper_effect is not None else None
    if refute is not None and not (math.isfinite(paper_effect) and paper_effect > 0):
        raise ValueError(f"a superiority claim's paper_effect must be finite and > 0 (oriented), got {paper_effect}")
    margin_abs = margin * abs(sb.mean) if relative else float(margin)
    effect, ci, df = welch_ci(sa, sb, lower_is_better=lower_is_better)
    rel = f", {100 * (sa.mean - sb.mean) / sb.mean:+.1f}%" if relative and sb.mean else ""
    ci_txt = f"95% CI [{ci[0]:+.3g}, {ci[1]:+.3g}]" if ci is not None else "one seed: no interval"
    measured = (
        f"{a_name} {sa.fmt(spec)} vs {b_name} {sb.fmt(spec)}: effect {effect:+.3g} {unit}{rel}, {ci_txt} "
        f"({sa.n} vs {sb.n} seeds)"
    )
    verdict = verdict_from_ci(ci, margin_abs, refute)
    f = finding(paper, claim, paper_value, measured, verdict, "", kind=kind, seeds=min(sa.n, sb.n), claim_id=claim_id)
    f.claim_type, f.a_name, f.b_name, f.unit = claim_type, a_name, b_name, unit
    f.effect, f.ci95, f.df = effect, list(ci) if ci is not None else None, df
    f.margin, f.margin_source, f.margin_rel = margin_abs, margin_source, float(margin) if relative else None
    f.values_a, f.values_b, f.lower_is_better = list(sa.values), list(sb.values), lower_is_better
    if refute is not None:
        f.paper_effect, f.refute_below = float(paper_effect), refute
    f.rule = _rule(f)
    return f


def _rule(f: Finding) -> str:
    """A comparison's verdict rule, in words (a superiority claim with the paper's effect: its refuting bar)."""
    if f.claim_type == "superiority":
        below = "below 0"
        if f.refute_below is not None:
            below = f"below {REFUTE_FRACTION:g}x the paper's effect {f.paper_effect:+.3g} = {f.refute_below:+.3g}"
        better = "lower" if f.lower_is_better else "higher"
        return (
            f"superiority ({better} is better): agrees if the 95% Welch-t CI of the effect lies above 0, "
            f"disagrees if it lies {below}, else inconclusive"
        )
    m_txt = f"{f.margin:g} {f.unit}"
    if f.margin_rel is not None:
        m_txt = f"{f.margin_rel:g}×{f.b_name}'s mean = {f.margin:.3g} {f.unit}"
    return (
        f"non-inferiority, margin {m_txt} ({f.margin_source}): agrees if the 95% Welch-t CI of the effect lies "
        f"above -{f.margin:.3g}, disagrees if below, else inconclusive"
    )


@dataclass(frozen=True)
class GateRule:
    """A precondition of a verdict: which decided verdicts it can hold back, and the argument for that direction."""

    holds_back: tuple[str, ...]
    why: str


#: why a verdict can be gated, with the verdicts each holds back; the report's legend prints these arguments.
GATES: dict[str, GateRule] = {
    "plateau": GateRule(DECIDED, "a comparison still moving with the steps can cross its boundary either way"),
    "not tuned": GateRule(DECIDED, "off its best learning rate a row can score higher or lower"),
    "did not learn": GateRule(DECIDED, "a row that did not learn measures the set-up, not the mechanism"),
    "conditions": GateRule(DECIDED, "off the paper's sizes or settings, the test is of another claim"),
    "control": GateRule(
        ("agrees",),
        "a control lacking what the claim credits (no token mixer in its blocks, yet not shown outside the margin "
        "against the claim's own baseline or, where one ran, its own skeleton with attention; an untrained model's "
        "layers) would agree too; it does not explain a disagreement. A superiority claim needs no such gate: its "
        "interval already shows a difference; where the compared architectures differ in more than the attention, "
        "the report says the attention's share is not shown",
    ),
}
GATE_REASONS = tuple(GATES)


def gate(f: Finding, why: str, reason: str) -> Finding:
    """Make a decided verdict that ``reason`` holds back ``inconclusive`` (kept in ``ungated_verdict``), recording
    ``why`` and ``reason``; for a verdict it does not hold back, ``why`` goes to the explanation."""
    if reason not in GATES:
        raise ValueError(f"unknown gate reason {reason!r}; valid: {GATE_REASONS}")
    v = numbers_verdict(f)
    if v in DECIDED and v not in GATES[reason].holds_back:
        return explain(f, f"{why} (a {reason} gate does not hold back {v})")
    if f.verdict in DECIDED:
        f.ungated_verdict, f.verdict = f.verdict, "inconclusive"
    f.gate = f"{f.gate}; {why}" if f.gate else why
    f.gate_reasons = sorted(set(f.gate_reasons or []) | {reason})
    return f


def explain(f: Finding, text: str) -> Finding:
    """Append ``text`` to the footnote a reader sees under the table."""
    f.explanation = f"{f.explanation}; {text}" if f.explanation else text
    return f


def numbers_verdict(f: Finding) -> str:
    """The verdict the numbers alone give, before any gate."""
    return f.ungated_verdict or f.verdict


#: how far (relative, either way) a pair's parameter ratio may be from the paper's and still count as its conditions
SIZE_TOLERANCE = 0.10


def within_ratio(here: float, paper: float, tolerance: float = SIZE_TOLERANCE) -> bool:
    return 1 / (1 + tolerance) <= here / paper <= 1 + tolerance


def size_gate(f: Finding, paper_ratios: dict[tuple[str, str], tuple[float, str]]) -> Finding:
    """Gate on conditions a pair whose parameter ratio is off the paper's own comparison's, ``(ratio, source)``."""
    paper = paper_ratios.get((f.a_name, f.b_name))
    if paper is None or not (f.params_a and f.params_b):
        return f
    paper_ratio, source = paper
    here = f.params_a / f.params_b
    if not within_ratio(here, paper_ratio):
        why = f"parameters {here:.2f}x here against {paper_ratio:.2f}x in the paper ({source})"
        gate(f, f"{why}: over {SIZE_TOLERANCE:.0%} apart", "conditions")
    return f


def margin_control_gate(
    f: Finding, control: Values, control_name: str, twin: tuple[str, Stat] | None = None
) -> Finding:
    """Gate a non-inferiority agreement whose margin also admits ``control``, a model without a token mixer.

    The control is compared with the finding's baseline and, where given, with ``twin`` (``(name, metric)``: its own
    skeleton with attention, one factor apart where the baseline differs in more than the token mixer); the reading
    that comes closer to the margin is the one recorded and judged, so either can hold the agreement back."""
    sc = stat(control)
    if f.claim_type != "non-inferiority" or sc is None or not f.values_b:
        return f
    lower = bool(f.lower_is_better)
    readings = []
    for base_name, sb in [(f.b_name, stat(f.values_b)), *([twin] if twin is not None else [])]:
        effect, ci, _ = welch_ci(sc, sb, lower_is_better=lower)
        readings.append((ci[1] if ci else effect, base_name, sb, effect, ci))
    top, base_name, sb, effect, ci = max(readings, key=lambda r: r[0])
    f.control_effect, f.control_ci95 = effect, list(ci) if ci else None
    strict = welch_ci(sc, sb, lower_is_better=lower, level=STRICT_LEVEL)[1]
    f.control_ci99 = list(strict) if strict else None
    if top > -f.margin:
        where = f"{effect:+.3g} [{ci[0]:+.3g}, {ci[1]:+.3g}]" if ci else f"{effect:+.3g}"
        why = f"control {control_name} (no token mixer in its blocks) is {where} {f.unit or ''} from {base_name}"
        gate(f, f"{why}, not shown outside the margin", "control")
    return f


def untuned_control_gate(f: Finding, why: str | None, control_name: str) -> Finding:
    """Gate a finding whose margin test passed on a control not at its best rate (``why``): tuned, it might not."""
    if why and f.control_effect is not None and "control" not in (f.gate_reasons or []):
        text = f"the margin test's control is not tuned: {why}, so it is not shown to lose by more than the margin"
        gate(f, f"{text} ({control_name})", "control")
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
    """Gate each decided comparison whose interval clears its boundary by no more than the baseline moved at twice the
    steps (every one, without that run); the baseline has plateaued when some verdict is decided and all stand."""
    compared = [f for f in findings if f.claim_type]
    # each precondition is judged on the numbers' verdict, not on what another gate made of it
    decided = [f for f in compared if numbers_verdict(f) in DECIDED and f.ci95]
    clearance = {id(f): _clearance(numbers_verdict(f), f.ci95, f.margin or 0.0, f.refute_below) for f in decided}
    change = None
    if base is None or longer is None:
        fails = compared
        text = f"{baseline}: no run {longer_run}, so its plateau is not shown"
    else:
        paired, change = _paired_change(base, longer)
        drift = [f for f in decided if clearance[id(f)] <= abs(change)]
        for f in decided:  # the largest baseline move a verdict was judged against, for the report's first screen
            if f.drift_2x is None or abs(change) > abs(f.drift_2x["change"]):
                f.drift_2x = {"row": baseline, "change": change, "clearance": clearance[id(f)]}
        fails = [f for f in drift if f.replicated_2x is None]  # a replicated one is judged on its own longer runs
        same = ""
        if paired is not base:
            seeds = f"seed{'s' if longer.n > 1 else ''} ({longer.n} of {base.n})"
            same = f"; on the same {seeds}: {paired.mean:{spec}} -> {longer.mean:{spec}}"
        text = f"{baseline} {longer_run}: {longer.fmt(spec)} vs {base.fmt(spec)} {unit}{same} (change {change:+.3g}); "
        n = len(decided)
        cleared = f"{n - len(drift)} of {n} comparisons decided by their numbers alone (checks too) clear the change"
        text += cleared if decided else "no decided comparison to set the bar, so its plateau is not shown"
        if k := len(drift) - len(fails):
            text += f"; {k} more judged on {'its' if k == 1 else 'their'} own comparison at 2x"
    for f in fails:
        why = f"{baseline} has no run {longer_run}"
        if change is not None:
            why = f"{baseline} moved {change:+.3g} {unit} {longer_run} ≥ clearance {clearance[id(f)]:.3g}"
        gate(f, f"not shown to plateau: {why}", "plateau")
    if curves:
        text += f"; validation curves (seed means): {curves}"
    return {
        "baseline": baseline,
        "plateaued": change is not None and bool(decided) and not fails,
        "change": change,
        "smallest_effect": min(clearance.values(), default=None),
        "standing": 0 if change is None else len(decided) - len(fails),
        "gated": len(fails),
        "text": text,
    }


def trend_gate(f: Finding, e2: float, ci2: tuple[float, float], margin2: float, at2: str) -> Finding:
    """A decided comparison stands at twice the steps (``e2``, ``ci2``, ``margin2``, described by ``at2``) only if the
    rule gives the same verdict there and that interval clears its boundary by more than the effect moved."""
    v2 = verdict_from_ci(ci2, margin2, f.refute_below)
    move = e2 - f.effect
    c2 = _clearance(v2, ci2, margin2, f.refute_below) if v2 != "inconclusive" else None
    f.trend_2x = {"effect": e2, "ci95": list(ci2), "margin": margin2, "verdict": v2, "move": move, "clearance": c2}
    said = f"{at2}: {v2}, {f.effect:+.3g} -> {e2:+.3g} {f.unit or ''} [{ci2[0]:+.3g}, {ci2[1]:+.3g}]"
    if v2 != numbers_verdict(f):
        return gate(f, f"{said}: not the reported steps' verdict", "plateau")
    if c2 <= abs(move):
        return gate(f, f"{said}; moved {move:+.3g} ≥ clearance {c2:.3g}: the next doubling could cross", "plateau")
    return explain(f, f"{said}; moved {move:+.3g} < clearance {c2:.3g}")


def replicated_gate(f: Finding, a_longer: Stat | None, b_longer: Stat | None, *, row: str, baseline: str) -> Finding:
    """Judge a comparison on its own runs at twice the steps.

    With two or more seeds a side there, its rule (a relative margin re-read on the longer baseline) and
    :func:`trend_gate` decide (``replicated_2x``, which the drift gates then skip); an undecided one only says what
    the rule gives there. With fewer seeds, the effect on the seeds both longer runs share is described."""
    if not f.ci95 or a_longer is None or b_longer is None:
        return f
    lower, unit = bool(f.lower_is_better), f.unit or ""
    decided = numbers_verdict(f) in DECIDED
    if a_longer.n >= 2 and b_longer.n >= 2:
        m2 = f.margin_rel * abs(b_longer.mean) if f.margin_rel is not None else f.margin or 0.0
        e2, ci2, _ = welch_ci(a_longer, b_longer, lower_is_better=lower)
        at2 = f"2x steps ({a_longer.n} vs {b_longer.n} seeds, margin {m2:.3g})"
        if decided:
            f.replicated_2x = trend_gate(f, e2, ci2, m2, at2).trend_2x
            return f
        v2 = verdict_from_ci(ci2, m2, f.refute_below)
        f.at_2x = {"effect": e2, "ci95": list(ci2), "margin": m2, "verdict": v2}
        tail = ": the verdict depends on the steps" if v2 != "inconclusive" else ""
        return explain(f, f"{at2}: {v2}, {e2:+.3g} {unit} [{ci2[0]:+.3g}, {ci2[1]:+.3g}]{tail}")
    if not decided:
        return f
    k = min(a_longer.n, b_longer.n, len(f.values_a), len(f.values_b))
    sign = -1.0 if lower else 1.0
    e1 = sign * (Stat(tuple(f.values_a[:k])).mean - Stat(tuple(f.values_b[:k])).mean)
    e2 = sign * (Stat(a_longer.values[:k]).mean - Stat(b_longer.values[:k]).mean)
    f.paired_2x = {"seeds": k, "effect_1x": e1, "effect_2x": e2}
    seeds, few = ("seed", "one seed a side gives") if k == 1 else (f"{k} seeds", "so few seeds a side give")
    both = f"on the {seeds} both {row} and {baseline} ran at 2x steps"
    return explain(f, f"{both}: {e1:+.4g} -> {e2:+.4g} {unit}; {few} no interval")


def compared_row_gate(f: Finding, row: str, base: Stat | None, longer: Stat | None, unit: str) -> Finding:
    """Where only the compared row (side a) ran at twice the steps, its move shifts the effect and its interval, and
    :func:`trend_gate` decides; a comparison replicated there was judged on that instead."""
    if base is None or longer is None or numbers_verdict(f) not in DECIDED or not f.ci95 or f.replicated_2x is not None:
        return f
    paired, change = _paired_change(base, longer)
    f.compared_row_change = change
    shift = -change if f.lower_is_better else change
    at2 = f"{row} alone moves {change:+.3g} {unit} at 2x steps ({paired.mean:.4g} -> {longer.mean:.4g})"
    return trend_gate(f, f.effect + shift, (f.ci95[0] + shift, f.ci95[1] + shift), f.margin or 0.0, at2)


def _paired_change(base: Stat, longer: Stat) -> tuple[Stat, float]:
    """How far a run at twice the steps moved from the same (first) seeds of ``base``: seed spread is no step change."""
    paired = Stat(tuple(base.values[: longer.n])) if longer.n < base.n else base
    return paired, longer.mean - paired.mean


def _clearance(verdict: str, ci, margin: float, refute_below: float | None = None) -> float:
    """How far a decided interval lies beyond its decision boundary, in the effect's unit."""
    lo, hi = ci
    return lo + margin if verdict == "agrees" else (-margin if refute_below is None else refute_below) - hi


def margin_sensitivity(f: Finding, other: float, label: str, *, relative: bool = True) -> Finding:
    """Say what a non-inferiority finding's interval gives with another of the paper's gaps as the margin (``other``:
    a fraction of the baseline, or in the effect's unit), here and at twice the steps; words only."""
    own = f.margin_rel if relative else f.margin
    if not f.ci95 or not own:
        return f
    parts, rep = [], f.replicated_2x or {}
    for at, ci, margin in (("", f.ci95, f.margin), ("at 2x steps ", rep.get("ci95"), rep.get("margin"))):
        if ci:
            m = margin * other / own
            said = f" (margin {m:.3g})" if relative else ""  # an absolute margin is the label's own figure
            parts.append(f"{at}{verdict_from_ci(ci, m)}{said}")
    what = f"{label} ({other:.1%})" if relative else f"{label} ({other:g} {f.unit or ''})"
    return explain(f, f"with {what} as margin: " + ", ".join(parts))


def change_word(before: float, after: float, *, noise: float) -> str:
    """How a gap moved (``before`` -> ``after``) at resolution ``noise``: into the noise from outside it "is no longer
    distinguishable from zero" (equality is not shown), within it "stays", across zero "reverses", else "shrinks" or
    "widens"."""
    if noise < 0 or not (math.isfinite(before) and math.isfinite(after) and math.isfinite(noise)):
        raise ValueError(f"change_word needs finite values and noise >= 0, got {before}, {after}, {noise}")
    if abs(after) <= noise < abs(before):
        return "is no longer distinguishable from zero"
    if abs(after - before) <= noise:
        return "stays"
    if before > noise and after < -noise:
        return "reverses"
    return "shrinks" if abs(after) < abs(before) else "widens"

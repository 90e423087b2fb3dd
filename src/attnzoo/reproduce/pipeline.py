"""One pipeline for every trained comparison: the section's evidence in, one fixed chain of gates over its findings.

A section folds each row's seeds, checks which rows learned, compares them (:func:`attnzoo.reproduce.claims.compare`:
a Welch-t interval per claim) and states the rest as :class:`Evidence`; :func:`judge` applies :data:`CHAIN`, the gates
in one order, to every finding alike (``attnzoo compare`` goes through it too).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from attnzoo.reproduce import claims
from attnzoo.reproduce.claims import Finding, Stat

__all__ = [
    "CHAIN",
    "Control",
    "Evidence",
    "Longer",
    "Plateau",
    "Tuning",
    "judge",
    "judged",
    "compared",
    "every",
    "paper_finding",
]

#: the order the gates run in: whether the rows learned, under which conditions, against which control, whether the
#: verdict survives twice the steps, and whether the rows ran at their best learning rate
CHAIN = ("did not learn", "conditions", "control", "plateau", "not tuned")
assert set(CHAIN) == set(claims.GATES), "every gate reason has its place in the chain"

Selector = Callable[[Finding], bool]


def every(_f: Finding) -> bool:
    return True


def paper_finding(f: Finding) -> bool:
    """A paper claim's finding, not an implementation check."""
    return f.kind == "paper"


def compared(f: Finding) -> bool:
    """A trained comparison (an interval's verdict), not a measurement or a check of one row."""
    return bool(f.claim_type)


@dataclass
class Longer:
    """A compared row's own runs at twice the steps (per seed), beside its runs at the reported steps."""

    label: str
    base: Stat | None
    longer: Stat | None


@dataclass
class Plateau:
    """A baseline's runs at twice the steps and the findings they judge (:func:`claims.plateau_gate`).

    A comparison with ``baseline`` whose compared row has runs there too (``rows``, by ``a_name``) is judged on the
    comparison (:func:`claims.replicated_gate`), else on the row's own move (:func:`claims.compared_row_gate`)."""

    baseline: str
    label: str
    base: Stat | None
    longer: Stat | None
    unit: str
    spec: str = ".3g"
    curves: str = ""
    judges: Selector = every
    rows: dict[str, Longer] = field(default_factory=dict)
    key: str = ""
    #: how the text names the baseline's longer run
    longer_run: str = "at twice the steps"


@dataclass
class Control:
    """A no-attention control: a margin it meets admits no attention (:func:`claims.margin_control_gate`).

    ``twin``: the control's skeleton with attention, the reference for the findings ``twin_for`` picks; ``untuned``:
    why the control is not at its best rate (:func:`claims.untuned_control_gate`); ``task``: the task it controls."""

    name: str
    values: Stat | None
    judges: Selector
    twin: tuple[str, Stat] | None = None
    twin_for: Selector = every
    untuned: str | None = None
    task: str = ""


@dataclass
class Tuning:
    """The rows of the findings ``judges`` picks that did not run at their best learning rate: ``{row: why}``."""

    untuned: dict[str, str]
    judges: Selector = compared


@dataclass
class Evidence:
    """What a section's gates read, gathered before any runs; ``gates``: the section's own ``(finding, reason, why)``,
    applied at their reason's place in the chain."""

    unlearned: dict[str, str] = field(default_factory=dict)
    sizes: dict[tuple[str, str], tuple[float, str]] = field(default_factory=dict)
    controls: list[Control] = field(default_factory=list)
    plateaus: list[Plateau] = field(default_factory=list)
    tuning: list[Tuning] = field(default_factory=list)
    gates: list[tuple[Finding, str, str]] = field(default_factory=list)
    #: readings that depend on the gates' evidence (words only, after every gate)
    readings: list[Callable[[Finding], None]] = field(default_factory=list)


def judge(findings: list[Finding], ev: Evidence) -> dict[str, dict]:
    """Apply :data:`CHAIN` to ``findings`` in place; returns each plateau's evidence by its ``key``."""
    out = {}
    for reason in CHAIN:
        for f, r, why in ev.gates:
            if r == reason:
                claims.gate(f, why, r)
        out.update(_STAGES[reason](findings, ev) or {})
    for f in findings:
        for read in ev.readings:
            read(f)
    return out


def _unlearned(findings: list[Finding], ev: Evidence) -> None:
    """A comparison naming a row that did not learn measures the set-up, not the mechanism."""
    for f in findings:
        why = [ev.unlearned[n] for n in (f.a_name, f.b_name) if n in ev.unlearned]
        if why:
            claims.gate(f, "; ".join(why), "did not learn")


def _conditions(findings: list[Finding], ev: Evidence) -> None:
    for f in findings:
        claims.size_gate(f, ev.sizes)


def _controls(findings: list[Finding], ev: Evidence) -> None:
    for c in ev.controls:
        for f in findings:
            if c.judges(f):
                claims.margin_control_gate(f, c.values, c.name, c.twin if c.twin_for(f) else None)


def _plateaus(findings: list[Finding], ev: Evidence) -> dict[str, dict]:
    """Per baseline: replicated comparisons, then the baseline's drift on the rest, then the compared rows' own
    moves (:func:`claims.plateau_gate` leaves replicated ones alone)."""
    out = {}
    for p in ev.plateaus:
        own = [f for f in findings if p.judges(f)]
        for f in own:
            row = p.rows.get(f.a_name)
            if row is not None and p.longer is not None and f.b_name == p.baseline:
                claims.replicated_gate(f, row.longer, p.longer, row=f.a_name, baseline=p.baseline)
        out[p.key] = claims.plateau_gate(own, p.label, p.base, p.longer, p.unit, p.spec, p.curves, p.longer_run)
        for f in own:
            row = p.rows.get(f.a_name)
            if row is not None:
                claims.compared_row_gate(f, row.label, row.base, row.longer, p.unit)
    return out


def _tuning(findings: list[Finding], ev: Evidence) -> None:
    for t in ev.tuning:
        for f in findings:
            why = [t.untuned[n] for n in (f.a_name, f.b_name) if n in t.untuned]
            if why and t.judges(f):
                claims.gate(f, "not tuned: " + "; ".join(why), "not tuned")
    for c in ev.controls:
        for f in findings:
            if c.judges(f):
                claims.untuned_control_gate(f, c.untuned, c.name)


_STAGES = {
    "did not learn": _unlearned,
    "conditions": _conditions,
    "control": _controls,
    "plateau": _plateaus,
    "not tuned": _tuning,
}


def judged(findings: list[Finding], ev: Evidence) -> list[Finding]:
    """``findings`` after :func:`judge`."""
    judge(findings, ev)
    return findings

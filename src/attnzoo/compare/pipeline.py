"""One fixed chain of gates over every trained comparison's findings (``attnzoo compare`` goes through it too).

A section compares its rows (:func:`attnzoo.compare.claims.compare`), states what its gates read as
:class:`Evidence`, and :func:`judge` applies the gates in :data:`CHAIN` order to every finding alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from attnzoo.compare import claims
from attnzoo.compare.claims import Finding, Stat

#: the order the gates run in: whether the rows learned, under which conditions, against which control, whether the
#: verdict survives twice the steps, and whether the rows ran at their best learning rate
CHAIN = ("did not learn", "conditions", "control", "plateau", "not tuned")
assert set(CHAIN) == set(claims.GATES), "every gate reason has its place in the chain"

Selector = Callable[[Finding], bool]


def every(_f: Finding) -> bool:
    return True


def paper_finding(f: Finding) -> bool:
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
    """A baseline's runs at twice the steps and the findings they judge; a compared row with runs there too
    (``rows``, by ``a_name``) is judged on its own comparison or move instead."""

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
    longer_run: str = "at twice the steps"


@dataclass
class Control:
    """A no-attention control, compared with ``twin`` (its skeleton with attention) for the findings ``twin_for``
    picks; ``untuned`` says why it is not at its best rate."""

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
    """What a section's gates read; ``gates``: the section's own ``(finding, reason, why)``, applied at their reason's
    place in the chain; ``readings``: words that depend on the gates, added after all of them."""

    unlearned: dict[str, str] = field(default_factory=dict)
    sizes: dict[tuple[str, str], tuple[float, str]] = field(default_factory=dict)
    controls: list[Control] = field(default_factory=list)
    plateaus: list[Plateau] = field(default_factory=list)
    tuning: list[Tuning] = field(default_factory=list)
    gates: list[tuple[Finding, str, str]] = field(default_factory=list)
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


def judged(findings: list[Finding], ev: Evidence) -> list[Finding]:
    judge(findings, ev)
    return findings


def _rows_in(f: Finding, why: dict[str, str]) -> list[str]:
    return [why[n] for n in (f.a_name, f.b_name) if n in why]


def _merged(f: Finding, why: dict[str, str]) -> str:
    """Both rows' reasons, as one sentence naming both rows where they differ only in the row's name."""
    texts = _rows_in(f, why)
    a, b = f.a_name, f.b_name
    if len(texts) == 2 and a != b and texts[0].startswith(f"{a}'s ") and texts[1].startswith(f"{b}'s "):
        if (rest := texts[0].removeprefix(f"{a}'s ")) == texts[1].removeprefix(f"{b}'s "):
            return f"{a}'s and {b}'s {rest}"
    return "; ".join(texts)


def _unlearned(findings: list[Finding], ev: Evidence) -> None:
    for f in findings:
        if why := _rows_in(f, ev.unlearned):
            claims.gate(f, "; ".join(why), "did not learn")


def _conditions(findings: list[Finding], ev: Evidence) -> None:
    for f in findings:
        claims.size_gate(f, ev.sizes)


def _controls(findings: list[Finding], ev: Evidence) -> None:
    for c in ev.controls:
        for f in filter(c.judges, findings):
            claims.margin_control_gate(f, c.values, c.name, c.twin if c.twin_for(f) else None)


def _plateaus(findings: list[Finding], ev: Evidence) -> dict[str, dict]:
    """Per baseline: comparisons replicated at 2x steps, the baseline's drift on the rest, the rows' own moves."""
    out = {}
    for p in ev.plateaus:
        own = list(filter(p.judges, findings))
        for f in own:
            if (row := p.rows.get(f.a_name)) is not None and f.b_name == p.baseline:
                claims.replicated_gate(f, row.longer, p.longer, row=f.a_name, baseline=p.baseline)
        out[p.key] = claims.plateau_gate(own, p.label, p.base, p.longer, p.unit, p.spec, p.curves, p.longer_run)
        for f in own:
            if (row := p.rows.get(f.a_name)) is not None:
                claims.compared_row_gate(f, row.label, row.base, row.longer, p.unit)
    return out


def _tuning(findings: list[Finding], ev: Evidence) -> None:
    for t in ev.tuning:
        for f in findings:
            if _rows_in(f, t.untuned) and t.judges(f):
                claims.gate(f, "not tuned: " + _merged(f, t.untuned), "not tuned")
    for c in ev.controls:
        for f in filter(c.judges, findings):
            claims.untuned_control_gate(f, c.untuned, c.name)


_STAGES = {
    "did not learn": _unlearned,
    "conditions": _conditions,
    "control": _controls,
    "plateau": _plateaus,
    "not tuned": _tuning,
}

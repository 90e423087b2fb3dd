"""The five papers' claims as data: one :class:`PaperClaim` per claim the report checks, one :class:`Check` per sanity
check, each keyed by a short stable id that every finding carries as its ``claim_id``.

A section reads a claim's reference, statement, paper value, margin and conditions from here (``get(claim_id)``).
A claim tested several ways has ``tests``, and each finding carries ``"<id>#<test>"``. The records themselves are
in the data file ``claims.yaml`` beside this module, checked field by field when it loads; nothing from the package
is imported here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "PAPERS",
    "CLAIM_KINDS",
    "COMBINE_EVERY",
    "LRA_TESTS",
    "Conditions",
    "PaperClaim",
    "Check",
    "CLAIMS",
    "CHECKS",
    "CLAIMS_FILE",
    "load",
    "base_id",
    "test_of",
    "get",
    "finding_kw",
    "compare_kw",
    "size_ratios",
]

PAPERS = ("ToST", "FAST", "CSP", "CBSA", "AoT")
#: how a claim is judged: a trained comparison with margin 0 (superiority) or > 0 (non-inferiority), a cost or speed
#: figure measured once (measurement), or a trend with a rule of its own (qualitative: probes, curves)
CLAIM_KINDS = ("superiority", "non-inferiority", "measurement", "qualitative")
#: the one rule by which the tests of a claim tested several ways make its verdict
COMBINE_EVERY = (
    "agrees only if every test that decides agrees; disagrees if any test that decides disagrees; else inconclusive"
)
#: the tests of an LRA accuracy claim: its average over the learned tasks, then each task
LRA_TESTS = ("average", "listops", "text", "retrieval", "image", "pathfinder")


@dataclass(frozen=True)
class Conditions:
    """What must hold for a test to count as the paper's: the pair's parameter ratio, head dimension, length."""

    #: params(a) / params(b) of the paper's own comparison (a comparison far from it is gated on conditions)
    param_ratio: float | None = None
    param_ratio_source: str = ""
    #: the head dimension D the claim is made at (None: any)
    head_dim: int | None = None
    #: the smallest sequence length N at which the claim applies (None: any)
    min_n: int | None = None
    note: str = ""


@dataclass(frozen=True)
class PaperClaim:
    """One claim of one of the five papers, as the report checks it."""

    id: str
    #: the reference as the report prints it: the paper, then where in it
    ref: str
    #: the claim as the report states it (closely paraphrased from the paper's text)
    statement: str
    #: the figure the paper gives for it, as the report quotes it (``{name}`` fields are filled by the section)
    paper_value: str
    metric: str
    #: the compared rows as the report names them, a then b (empty where nothing is compared)
    rows: tuple[str, ...]
    kind: str
    task: str
    higher_is_better: bool = True
    margin: float = 0.0
    margin_source: str = ""
    #: what a relative margin is a fraction of (empty: the margin is in the metric's unit)
    margin_relative_to: str = ""
    #: the paper's own effect for the pair, oriented as a finding's effect (positive favours row a), in the metric
    paper_effect: float | None = None
    paper_effect_source: str = ""
    conditions: Conditions = field(default_factory=Conditions)
    #: the ways the claim is tested, their verdicts combined by :data:`COMBINE_EVERY`
    tests: tuple[str, ...] = ()

    @property
    def paper(self) -> str:
        return self.ref.split(" ", 1)[0]

    @property
    def where(self) -> str:
        return self.ref.split(" ", 1)[1]

    @property
    def reference(self) -> str:
        """The reference a finding shows in its ``paper`` column."""
        return self.ref

    @property
    def combine(self) -> str:
        return COMBINE_EVERY if self.tests else ""

    @property
    def claim_type(self) -> str:
        """The :func:`~attnzoo.reproduce.claims.compare` type of a trained comparison."""
        if self.kind not in ("superiority", "non-inferiority"):
            raise ValueError(f"claim {self.id!r} is a {self.kind} claim, not a trained comparison")
        return self.kind


@dataclass(frozen=True)
class Check:
    """A sanity check (kind ``"check"``): an implementation or baseline property, not a paper's claim."""

    id: str
    #: the reference as the report prints it (a paper, "all five papers", a baseline's paper)
    reference: str
    statement: str
    paper_value: str
    #: what the test part of a ``claim_id`` names where the check runs once per item (a mechanism, a task)
    per: str = ""
    tests: tuple[str, ...] = ()


#: the records' data file, shipped with the package
CLAIMS_FILE = Path(__file__).with_name("claims.yaml")
#: the fields holding a ratio, written ``[numerator, denominator]`` where the paper gives two figures
_RATIOS = ("paper_effect", "param_ratio")


def _field_value(where: str, name: str, value: Any, kind: Any) -> Any:
    """``value`` of field ``name`` checked against the field's type and made what the record holds."""
    is_num = isinstance(value, (int, float)) and not isinstance(value, bool)
    if (
        name in _RATIOS
        and isinstance(value, list)
        and len(value) == 2
        and all(isinstance(v, (int, float)) for v in value)
    ):
        return value[0] / value[1]
    if "tuple" in str(kind):
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise ValueError(f"{where}: field {name!r} must be a list of words, got {value!r}")
        return tuple(value)
    ok = {
        "str": isinstance(value, str),
        "bool": isinstance(value, bool),
        "float": is_num,
        "float | None": is_num,
        "int | None": isinstance(value, int) and not isinstance(value, bool),
    }.get(str(kind))
    if not ok:
        raise ValueError(f"{where}: field {name!r} must be {kind}, got {value!r}")
    return float(value) if kind in ("float", "float | None") else value


def _record(cls: type, raw: Any, where: str) -> Any:
    """One record of ``cls`` from its mapping in the data file; a missing, unknown or mistyped field names it."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a mapping of fields, got {raw!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if unknown := sorted(set(raw) - set(fields)):
        raise ValueError(f"{where}: unknown field(s) {unknown}; valid: {sorted(fields)}")
    missing = [n for n, f in fields.items() if n not in raw and f.default is f.default_factory is dataclasses.MISSING]
    if missing:
        raise ValueError(f"{where}: missing field(s) {missing}")
    kw = {}
    for name, value in raw.items():
        if name == "conditions":
            kw[name] = _record(Conditions, value, f"{where}, field 'conditions'")
        else:
            kw[name] = _field_value(where, name, value, fields[name].type)
    return cls(**kw)


def _records(cls: type, raws: Any, what: str, path: Path) -> tuple:
    if not isinstance(raws, list):
        raise ValueError(f"{path}: {what}s must be a list of records")
    return tuple(
        _record(cls, raw, f"{path}: {what} {raw.get('id') if isinstance(raw, dict) else '?'!r}") for raw in raws
    )


def load(path: Path = CLAIMS_FILE) -> tuple[tuple[PaperClaim, ...], tuple[Check, ...]]:
    """The claims and checks of the data file ``path``, each checked field by field."""
    with open(path, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    if not isinstance(data, dict) or set(data) != {"claims", "checks"}:
        raise ValueError(f"{path}: expected the two lists 'claims' and 'checks'")
    claims = _records(PaperClaim, data["claims"], "claim", path)
    checks = _records(Check, data["checks"], "check", path)
    for rec in claims:
        if rec.kind not in CLAIM_KINDS:
            raise ValueError(f"{path}: claim {rec.id!r}: field 'kind' must be one of {CLAIM_KINDS}, got {rec.kind!r}")
    return claims, checks


CLAIMS, CHECKS = load()

_BY_ID: dict[str, PaperClaim | Check] = {r.id: r for r in (*CLAIMS, *CHECKS)}


def base_id(claim_id: str) -> str:
    """The record's id of a finding's ``claim_id`` (without its ``#test`` part)."""
    return claim_id.split("#", 1)[0]


def test_of(claim_id: str) -> str:
    """The test part of a ``claim_id`` (``"tost-t3-lra#listops"`` -> ``"listops"``; ``""`` without one)."""
    return claim_id.partition("#")[2]


def get(claim_id: str) -> PaperClaim | Check:
    """The record of ``claim_id`` (``"<id>"`` or ``"<id>#<test>"``); a test part must be one of the record's."""
    rec = _BY_ID.get(base_id(claim_id))
    if rec is None:
        raise KeyError(f"unknown claim id {claim_id!r}; valid ids: {sorted(_BY_ID)}")
    test = test_of(claim_id)
    per = getattr(rec, "per", "")
    if test and not per and test not in rec.tests:
        raise KeyError(f"claim {rec.id!r} has no test {test!r}; its tests: {rec.tests or 'none'}")
    return rec


def finding_kw(claim_id: str, **fields: str) -> dict:
    """``paper``, ``claim``, ``paper_value`` and ``claim_id`` of a finding of ``claim_id``, as
    :func:`~attnzoo.reproduce.claims.finding` and ``not_tested`` take them; ``fields`` fill the record's ``{name}``
    fields (the task, the mechanism)."""
    rec = get(claim_id)
    return {
        "paper": rec.reference,
        "claim": rec.statement.format(**fields) if fields else rec.statement,
        "paper_value": rec.paper_value.format(**fields) if fields else rec.paper_value,
        "claim_id": claim_id,
    }


def compare_kw(claim_id: str, **fields: str) -> dict:
    """:func:`finding_kw` and the claim type, margin and its source, as
    :func:`~attnzoo.reproduce.claims.compare` takes them (a relative margin stays a fraction: see
    ``margin_relative_to``)."""
    rec = get(claim_id)
    if not isinstance(rec, PaperClaim):
        return finding_kw(claim_id, **fields)
    return {
        **finding_kw(claim_id, **fields),
        "claim_type": rec.claim_type,
        "margin": rec.margin,
        "margin_source": rec.margin_source,
    }


def size_ratios(*claim_ids: str) -> dict[tuple[str, str], tuple[float, str]]:
    """``(row a, row b) -> (the paper's parameter ratio, its source)`` of the claims (ids without a test part) that
    state one, as :func:`~attnzoo.reproduce.claims.size_gate` reads them."""
    out = {}
    for cid in claim_ids:
        rec = _BY_ID[cid]
        if isinstance(rec, PaperClaim) and rec.conditions.param_ratio is not None:
            out[rec.rows[:2]] = (rec.conditions.param_ratio, rec.conditions.param_ratio_source)
    return out

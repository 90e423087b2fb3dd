"""The five papers' claims and the report's sanity checks as data, loaded from ``claims.yaml`` beside this module.

Each record has a short stable id that every finding carries as its ``claim_id``; a claim tested several ways has
``tests``, and its findings carry ``"<id>#<test>"``. Every field is checked when the file loads.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from attnzoo.compare import claims

PAPERS = ("ToST", "FAST", "CSP", "CBSA", "AoT")
#: how a claim is judged: a trained comparison with margin 0 (superiority) or > 0 (non-inferiority), a cost or speed
#: figure measured once (measurement), or a trend with a rule of its own (qualitative: probes, curves)
CLAIM_KINDS = ("superiority", "non-inferiority", "measurement", "qualitative")
#: the one rule by which the tests of a claim tested several ways make its verdict
COMBINE_EVERY = "disagrees if any test disagrees, else agrees if any agrees, else inconclusive"
#: the rule for a claim that is a conjunction of its tests (a ranking holds only if each of its pairs does)
COMBINE_ALL = "disagrees if any test disagrees, else agrees only if every test agrees, else inconclusive"
#: a claim's ``combine``: which rule joins its tests
COMBINE_RULES = {"any": COMBINE_EVERY, "all": COMBINE_ALL}
#: the tests of an LRA accuracy claim: its average over the learned tasks, then each task
LRA_TESTS = ("average", "listops", "text", "retrieval", "image", "pathfinder")
_LRA_TASKS = set(LRA_TESTS) - {"average"}


@dataclass(frozen=True)
class Conditions:
    """What must hold for a test to count as the paper's (a test off them is gated on conditions)."""

    #: params(a) / params(b) of the paper's own comparison
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
    #: the claim, closely paraphrased from the paper's text
    statement: str
    #: the paper's figure for it as the report quotes it (``{name}`` fields are filled by the section)
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
    #: the ways the claim is tested, their verdicts combined by the rule ``combine`` names (:data:`COMBINE_RULES`)
    tests: tuple[str, ...] = ()
    combine: str = "any"

    @property
    def reference(self) -> str:
        return self.ref

    @property
    def claim_type(self) -> str:
        """The :func:`~attnzoo.compare.claims.compare` type of a trained comparison."""
        if self.kind not in ("superiority", "non-inferiority"):
            raise ValueError(f"claim {self.id!r} is a {self.kind} claim, not a trained comparison")
        return self.kind


@dataclass(frozen=True)
class Check:
    """A sanity check: an implementation or baseline property, not a paper's claim."""

    id: str
    #: the reference as the report prints it (a paper, "all five papers", a baseline's paper)
    reference: str
    statement: str
    paper_value: str
    #: what the test part of a ``claim_id`` names where the check runs once per item (a mechanism, a task)
    per: str = ""
    tests: tuple[str, ...] = ()


CLAIMS_FILE = Path(__file__).with_name("claims.yaml")
#: the fields holding a ratio, written ``[numerator, denominator]`` where the paper gives two figures
_RATIOS = ("paper_effect", "param_ratio")
#: whether a value fits a field, by the field's declared type (a ``| None`` field: the type's own check)
_FITS = {
    "str": lambda v: isinstance(v, str),
    "bool": lambda v: isinstance(v, bool),
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "tuple[str, ...]": lambda v: isinstance(v, list) and all(isinstance(w, str) and w for w in v),
}
#: the fields whose value must be one of a list
_CHOICES = {"kind": CLAIM_KINDS, "combine": tuple(sorted(COMBINE_RULES))}


def _field_value(where: str, name: str, value: Any, kind: str) -> Any:
    """``value`` of field ``name`` checked against the field's type and made what the record holds."""
    if kind == "Conditions":
        return _record(Conditions, value, f"{where}, field {name!r}")
    if name in _RATIOS and isinstance(value, list) and len(value) == 2 and all(_FITS["float"](v) for v in value):
        return value[0] / value[1]
    kind = kind.removesuffix(" | None")
    if kind not in _FITS or not _FITS[kind](value):
        what = "a list of words" if kind.startswith("tuple") else kind
        raise ValueError(f"{where}: field {name!r} must be {what}, got {value!r}")
    if name in _CHOICES and value not in _CHOICES[name]:
        raise ValueError(f"{where}: field {name!r} must be one of {list(_CHOICES[name])}, got {value!r}")
    return tuple(value) if kind.startswith("tuple") else float(value) if kind == "float" else value


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
    return cls(**{name: _field_value(where, name, value, fields[name].type) for name, value in raw.items()})


def _records(cls: type, raws: Any, what: str, path: Path) -> tuple:
    if not isinstance(raws, list):
        raise ValueError(f"{path}: {what}s must be a list of records")
    return tuple(_record(cls, r, f"{path}: {what} {r.get('id') if isinstance(r, dict) else '?'!r}") for r in raws)


def load(path: Path = CLAIMS_FILE) -> tuple[tuple[PaperClaim, ...], tuple[Check, ...]]:
    """The claims and checks of the data file ``path``, each checked field by field."""
    with open(path, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    if not isinstance(data, dict) or set(data) != {"claims", "checks"}:
        raise ValueError(f"{path}: expected the two lists 'claims' and 'checks'")
    return _records(PaperClaim, data["claims"], "claim", path), _records(Check, data["checks"], "check", path)


CLAIMS, CHECKS = load()
_BY_ID: dict[str, PaperClaim | Check] = {r.id: r for r in (*CLAIMS, *CHECKS)}


def base_id(claim_id: str) -> str:
    """The record's id of a finding's ``claim_id`` (without its ``#test`` part)."""
    return claim_id.split("#", 1)[0]


def test_of(claim_id: str) -> str:
    """The test part of a ``claim_id`` (``"tost-t3-lra#listops"`` -> ``"listops"``; ``""`` without one)."""
    return claim_id.partition("#")[2]


def get(claim_id: str) -> PaperClaim | Check:
    """The record of ``claim_id``; a test part must be one of the record's, unless the check runs per item."""
    rec = _BY_ID.get(base_id(claim_id))
    if rec is None:
        raise KeyError(f"unknown claim id {claim_id!r}; valid ids: {sorted(_BY_ID)}")
    test = test_of(claim_id)
    if test and not getattr(rec, "per", "") and test not in rec.tests:
        raise KeyError(f"claim {rec.id!r} has no test {test!r}; its tests: {rec.tests or 'none'}")
    return rec


def conjunction(claim_id: str) -> bool:
    """Whether claim ``claim_id`` holds only if every test does (``combine: all``); False for an unknown id."""
    return getattr(_BY_ID.get(base_id(claim_id)), "combine", "any") == "all"


def finding_kw(claim_id: str, **fields: str) -> dict:
    """The record's ``paper``, ``claim``, ``paper_value`` and ``claim_id`` as
    :func:`~attnzoo.compare.claims.finding` takes them, ``fields`` filled into its ``{name}`` fields."""
    rec = get(claim_id)
    return {
        "paper": rec.reference,
        "claim": rec.statement.format(**fields) if fields else rec.statement,
        "paper_value": rec.paper_value.format(**fields) if fields else rec.paper_value,
        "claim_id": claim_id,
    }


def compare_kw(claim_id: str, **fields: str) -> dict:
    """:func:`finding_kw` and a paper claim's type, margin and its source, as
    :func:`~attnzoo.compare.claims.compare` takes them (a relative margin stays a fraction)."""
    rec = get(claim_id)
    kw = finding_kw(claim_id, **fields)
    if isinstance(rec, PaperClaim):
        kw.update(claim_type=rec.claim_type, margin=rec.margin, margin_source=rec.margin_source)
        # an LRA task's test has no effect of its own (the paper's is the average's)
        if rec.claim_type == "superiority" and test_of(claim_id) not in _LRA_TASKS:
            kw["paper_effect"] = rec.paper_effect
    return kw


def size_ratios(*claim_ids: str) -> dict[tuple[str, str], tuple[float, str]]:
    """``(row a, row b) -> (the paper's parameter ratio, its source)`` of the claims that state one."""
    recs = [_BY_ID[cid] for cid in claim_ids]
    stated = [r for r in recs if isinstance(r, PaperClaim) and r.conditions.param_ratio is not None]
    return {r.rows[:2]: (r.conditions.param_ratio, r.conditions.param_ratio_source) for r in stated}


def measured_finding(
    claim_id: str, measured: str, verdict: bool | str, rule: str, kind: str = "check", seeds: int = 1, **fields: str
) -> claims.Finding:
    """A finding judged from one measurement (a cost or a speed): ``verdict`` True agrees, False disagrees."""
    if isinstance(verdict, bool):
        verdict = "agrees" if verdict else "disagrees"
    kw = finding_kw(claim_id, **fields)
    return claims.finding(**kw, measured=measured, verdict=verdict, rule=rule, kind=kind, seeds=seeds, measurement=True)

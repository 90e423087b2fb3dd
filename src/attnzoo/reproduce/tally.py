"""The claims counted once: a claim tested several ways is one row, with one verdict and, undecided, one cause."""

from __future__ import annotations

from dataclasses import dataclass, field

from attnzoo.reproduce import paper_claims

#: why a claim is undecided, in the order a claim is filed under (its first cause): what was knowable before
#: training first, then what training showed, then too little evidence
CAUSES = {
    "conditions": "the paper's conditions not met (sizes, task, configuration)",
    "control": "a control lacking what the claim credits is not shown outside the margin",
    "did not learn": "a compared row did not learn the task",
    "not tuned": "a row is not tuned",
    "plateau": "not shown to survive more training",
    "steps": "decided only at twice the steps",
    "threshold": "a measurement on its rule's threshold (no seeds, no interval)",
    "wide": "interval too wide at this many seeds",
    "not tested": "not tested at this budget",
}


@dataclass
class ClaimResult:
    """One paper claim of the report: its tests (findings with their section's title) and the combined verdict."""

    id: str
    tests: list[tuple[str, dict]] = field(default_factory=list)

    @property
    def findings(self) -> list[dict]:
        return [f for _, f in self.tests]

    @property
    def verdict(self) -> str:
        return combine([f["verdict"] for f in self.findings], every=paper_claims.conjunction(self.id))

    @property
    def trained(self) -> bool:
        return any(f.get("claim_type") or f.get("trained") for f in self.findings)

    @property
    def cause(self) -> str | None:
        return cause_of(self.findings) if self.verdict in ("inconclusive", "not tested") else None

    @property
    def sections(self) -> str:
        return ", ".join(dict.fromkeys(t for t, _ in self.tests))


def combine(verdicts: list[str], every: bool = False) -> str:
    """The claim table's rule (:data:`paper_claims.COMBINE_EVERY`; ``every``: a conjunction's,
    :data:`paper_claims.COMBINE_ALL`); not tested if no test ran."""
    if set(verdicts) == {"not tested"}:
        return "not tested"
    if "disagrees" in verdicts:
        return "disagrees"
    agrees = all(v == "agrees" for v in verdicts) if every else "agrees" in verdicts
    return "agrees" if agrees else "inconclusive"


def cause_of(findings: list[dict]) -> str:
    """The first cause (in :data:`CAUSES` order) that keeps a claim's tests from a verdict: a gate that held a
    decided verdict back, then any gate of an inconclusive test, then what the numbers lack."""
    if all(f["verdict"] == "not tested" for f in findings):
        return "not tested"
    gated = {r for f in findings if f.get("ungated_verdict") for r in f.get("gate_reasons", ())}
    reasons = {r for f in findings if f["verdict"] == "inconclusive" for r in f.get("gate_reasons", ())}
    if found := next((c for found in (gated, reasons) for c in CAUSES if c in found), None):
        return found
    if any((f.get("at_2x") or {}).get("verdict") in ("agrees", "disagrees") for f in findings):
        return "steps"
    return "wide" if any(f.get("ci95") for f in findings) else "threshold"


def tally(pairs: list[tuple[str, dict]]) -> list[ClaimResult]:
    """The paper findings ``(section title, finding)`` grouped into claims by ``claim_id`` (a finding without one is
    a claim of its own), in the order they first appear."""
    out: dict[str, ClaimResult] = {}
    for title, f in pairs:
        key = paper_claims.base_id(f["claim_id"]) if f.get("claim_id") else f"{f['paper']}: {f['claim']}"
        out.setdefault(key, ClaimResult(key)).tests.append((title, f))
    return list(out.values())

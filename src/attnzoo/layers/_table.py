"""The README mechanisms table, generated from the attention registry (``scripts/models_table.py --update``)."""

from __future__ import annotations

from attnzoo.layers.base import attention_info, list_attentions

__all__ = ["mechanisms_table_markdown"]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def mechanisms_table_markdown() -> str:
    """One row per registered mechanism, in listing order (``Mechanism.order``), from its ``Mechanism.card``."""
    specs = [(n, attention_info(n).mechanism) for n in list_attentions()]
    specs = sorted(((n, m) for n, m in specs if m is not None), key=lambda nm: (nm[1].order, nm[0]))
    lines = ["| name | paper | time in N | memory in N | causal | op |", "|---|---|---|---|---|---|"]
    for name, mech in specs:
        card = mech.card
        causal = "yes" if mech.causal else "no"
        if card is not None and card.causal:
            causal += f" ({card.causal})"
        ops = ", ".join(f"`attnzoo.ops.{op}`" for op in ((card.ops if card else ()) or (mech.op,)))
        cells = [f"`{name}`"] + ([card.paper, card.time, card.memory] if card else ["", "", ""]) + [causal, ops]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)

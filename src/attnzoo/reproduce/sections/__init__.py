"""The report's sections, in order; each module has ``KEY``, ``TITLE``, ``plan_steps`` and ``summarize``."""

from __future__ import annotations

from attnzoo.reproduce.sections import adapt_vision, efficiency, icl, language, lra, probes, segmentation, vision

#: section key -> module, in report order
SECTION_MODULES = {m.KEY: m for m in (vision, adapt_vision, lra, language, icl, efficiency, probes, segmentation)}

#: accepted spellings of section keys on the command line
ALIASES = {
    **dict.fromkeys(("lra", "long_range", "longrange"), lra.KEY),
    **dict.fromkeys(("adapt", "fig9"), adapt_vision.KEY),
    **dict.fromkeys(("segment", "seg"), segmentation.KEY),
    "bench": efficiency.KEY,
    "lm": language.KEY,
    "probe": probes.KEY,
}

__all__ = ["SECTION_MODULES", "ALIASES"]

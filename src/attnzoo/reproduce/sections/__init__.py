"""The report's sections, in order; each module has ``KEY``, ``TITLE``, ``plan_steps`` and ``summarize``."""

from __future__ import annotations

from attnzoo.reproduce.sections import adapt_vision, efficiency, icl, language, lra, probes, segmentation, vision

#: section key -> module, in report order
SECTION_MODULES = {
    vision.KEY: vision,
    adapt_vision.KEY: adapt_vision,
    lra.KEY: lra,
    language.KEY: language,
    icl.KEY: icl,
    efficiency.KEY: efficiency,
    probes.KEY: probes,
    segmentation.KEY: segmentation,
}

#: accepted spellings of section keys on the command line
ALIASES = {
    "lra": lra.KEY,
    "long_range": lra.KEY,
    "longrange": lra.KEY,
    "bench": efficiency.KEY,
    "lm": language.KEY,
    "probe": probes.KEY,
    "adapt": adapt_vision.KEY,
    "fig9": adapt_vision.KEY,
    "segment": segmentation.KEY,
    "seg": segmentation.KEY,
}

__all__ = ["SECTION_MODULES", "ALIASES"]

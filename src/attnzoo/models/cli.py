"""``attnzoo models``: list the registered models with their parameter counts (computed on the meta device)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

__all__ = ["main", "model_rows", "models_table_markdown", "ModelRow"]


@dataclass
class ModelRow:
    name: str
    arch: str
    attention: str
    params: int | None
    paper: str
    paper_figure: str
    note: str
    error: str = ""


def _fmt_millions(n: float) -> str:
    return f"{n / 1e6:.2f}M"


def _label(name: str, options: dict) -> str | None:
    """The mechanism's own description of these options (:meth:`attnzoo.ops._spec.Options.label`)."""
    from attnzoo.layers import attention_info

    try:
        return attention_info(name).mechanism.options.build(name, **options).label()
    except (ValueError, TypeError):  # a model's options are checked when it is built; its row reports that error
        return None


def model_rows(pattern: str | None = None) -> list[ModelRow]:
    """One row per registered model (parameter counts on the meta device, no allocation)."""
    from attnzoo.models.registry import count_parameters, list_models, model_entry

    rows = []
    for name in list_models(pattern):
        entry = model_entry(name)
        cfg = entry.config()
        mechs = list(dict.fromkeys(cfg.mechanisms()))
        attention = " + ".join(mechs)
        label = _label(cfg.attention, cfg.attention_options)
        if label is not None:  # what the options make of the mechanism (the attention MEGA's layer runs)
            attention += f" ({label})"
        if getattr(cfg, "pool", None) == "class_attention":
            attention += " (+ class attention)"
        figure = ""
        if entry.paper_params is not None:
            unit = "M" if entry.paper_params_unit == 1e6 else " × 2^20"
            figure = f"{entry.paper_params:g}{unit}"
            if entry.count_excludes:
                figure += " without " + ", ".join(e.rstrip(".") for e in entry.count_excludes)
        try:
            params, error = count_parameters(name), ""
        except (ValueError, TypeError) as e:  # e.g. a mechanism that is not available in this install
            params, error = None, str(e).split(";")[0]
        rows.append(ModelRow(name, cfg.arch, attention, params, entry.paper, figure, entry.note, error))
    return rows


def models_table_markdown(pattern: str | None = None) -> str:
    """The README models table, generated from the registry."""
    lines = [
        "| Model | Paper | Params | Paper figure | Attention |",
        "|---|---|---:|---:|---|",
    ]
    for r in model_rows(pattern):
        params = _fmt_millions(r.params) if r.params is not None else "n/a"
        figure = r.paper_figure + (f" ({r.note})" if r.note and r.paper_figure else "")
        figure = figure.replace("|", "\\|")
        lines.append(f"| `{r.name}` | {r.paper} | {params} | {figure} | {r.attention} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="attnzoo models", description="List the registered models.")
    parser.add_argument("pattern", nargs="?", default=None, help="shell-style name filter, e.g. 'tost_*'")
    parser.add_argument("--markdown", action="store_true", help="print the README models table (markdown)")
    args = parser.parse_args(argv)
    from attnzoo.models.registry import list_models

    if args.pattern is not None and not list_models(args.pattern):
        print(f"attnzoo models: no model matches {args.pattern!r}; valid names: {list_models()}", file=sys.stderr)
        return 2
    if args.markdown:
        print(models_table_markdown(args.pattern))
        return 0
    rows = model_rows(args.pattern)
    w = max([len("model")] + [len(r.name) for r in rows])
    wa = max([len("attention")] + [len(r.attention) for r in rows])
    head = f"{'model'.ljust(w)}  {'arch'.ljust(19)}  {'params':>9}  {'paper figure':<22}  {'attention'.ljust(wa)}"
    print(f"{head}  paper")
    for r in rows:
        params = _fmt_millions(r.params) if r.params is not None else "n/a"
        line = f"{r.name.ljust(w)}  {r.arch.ljust(19)}  {params:>9}  {r.paper_figure:<22}  {r.attention.ljust(wa)}"
        print(f"{line}  {r.paper}")
        if r.error:
            print(f"{''.ljust(w)}  ! {r.error}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

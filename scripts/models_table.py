#!/usr/bin/env python3
"""Generate the README models table (name, paper, params, attention) from the model registry, and the mechanisms
table (name, paper, cost, causal form, op) from the attention registry (each mechanism's ``Mechanism.card``).

Parameter counts are computed on the meta device (nothing is allocated).

    python scripts/models_table.py                 # print the models table
    python scripts/models_table.py --mechanisms    # print the mechanisms table
    python scripts/models_table.py --update README.md

``--update`` replaces the text between the markers ``<!-- models-table:begin -->`` and
``<!-- models-table:end -->`` in the given file, and between ``<!-- mechanisms-table:begin -->`` and
``<!-- mechanisms-table:end -->`` where the file has those (written atomically; the file is left untouched if the
models markers are missing).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

BEGIN = "<!-- models-table:begin -->"
END = "<!-- models-table:end -->"
MECHANISMS_BEGIN = "<!-- mechanisms-table:begin -->"
MECHANISMS_END = "<!-- mechanisms-table:end -->"


def _replace(path: Path, text: str, table: str, begin: str, end: str) -> str:
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise SystemExit(f"{path}: needs exactly one '{begin}' followed by one '{end}' marker")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{table}\n{end}{tail}"


def update_file(path: Path, table: str, mechanisms: str | None = None) -> None:
    """Replace the models table (its markers are required) and the mechanisms table (where it is marked)."""
    new = _replace(path, path.read_text(encoding="utf-8"), table, BEGIN, END)
    if mechanisms is not None and MECHANISMS_BEGIN in new:
        new = _replace(path, new, mechanisms, MECHANISMS_BEGIN, MECHANISMS_END)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(new)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", type=Path, default=None, help="file whose marked section is replaced")
    parser.add_argument("--pattern", default=None, help="only models matching this shell-style pattern")
    parser.add_argument("--mechanisms", action="store_true", help="print the mechanisms table instead")
    args = parser.parse_args(argv)
    from attnzoo.layers._table import mechanisms_table_markdown
    from attnzoo.models.cli import models_table_markdown

    if args.update is None:
        print(mechanisms_table_markdown() if args.mechanisms else models_table_markdown(args.pattern))
    else:
        update_file(args.update, models_table_markdown(args.pattern), mechanisms_table_markdown())
        print(f"updated {args.update}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

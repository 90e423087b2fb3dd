#!/usr/bin/env python3
"""Generate the README models table (name, paper, params, attention) from the model registry.

Parameter counts are computed on the meta device (nothing is allocated).

    python scripts/models_table.py                 # print the markdown table
    python scripts/models_table.py --update README.md

``--update`` replaces the text between the markers ``<!-- models-table:begin -->`` and
``<!-- models-table:end -->`` in the given file (written atomically; the file is left untouched if the
markers are missing).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

BEGIN = "<!-- models-table:begin -->"
END = "<!-- models-table:end -->"


def update_file(path: Path, table: str) -> None:
    text = path.read_text(encoding="utf-8")
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise SystemExit(f"{path}: needs exactly one '{BEGIN}' followed by one '{END}' marker")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{BEGIN}\n{table}\n{END}{tail}"
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
    args = parser.parse_args(argv)
    from attnzoo.models.cli import models_table_markdown

    table = models_table_markdown(args.pattern)
    if args.update is None:
        print(table)
    else:
        update_file(args.update, table)
        print(f"updated {args.update}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

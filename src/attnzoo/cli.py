"""The ``attnzoo`` command: dispatches ``attnzoo <command> ...`` to the module that owns the command.

Each command module exposes ``main(argv: list[str] | None) -> int`` with its own argparse parser.
"""
from __future__ import annotations

import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("attnzoo.demo", "build every mechanism and print output statistics and cost at a few lengths"),
    "train": ("attnzoo.train.cli", "train a model: attnzoo train <config.yaml|preset> --out DIR [--key=value ...]"),
    "eval": ("attnzoo.train.eval_cli", "evaluate a checkpoint on its task"),
    "generate": ("attnzoo.train.generate_cli", "sample text from a trained language model"),
    "presets": ("attnzoo.train.presets_cli", "list the training presets"),
    "bench": ("attnzoo.bench", "time/memory benchmark of every mechanism, with plots"),
    "analyze": ("attnzoo.analysis.cli", "white-box probes and experiments (denoise, compress, ...)"),
    "reproduce": ("attnzoo.reproduce", "the papers' comparisons at laptop scale, one report"),
    "models": ("attnzoo.models.cli", "list registered models with parameter counts"),
    "selftest": ("attnzoo.selftest", "check every mechanism x backend on this device against the float64 reference"),
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: attnzoo <command> [options]", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {desc}" for name, (_, desc) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        print(f"attnzoo: unknown command {cmd!r}; valid commands: {sorted(COMMANDS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[cmd][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    raise SystemExit(main())

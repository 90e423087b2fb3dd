"""The ``attnzoo`` command: dispatches ``attnzoo <command> ...`` to the module that owns the command.

Each command module exposes ``main(argv: list[str] | None) -> int`` with its own argparse parser. Errors are one
line ``attnzoo <command>: error: ...`` with a non-zero exit; ``attnzoo --debug <command> ...`` (or
``ATTNZOO_DEBUG=1``) shows the traceback.
"""

from __future__ import annotations

import importlib
import os
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
    "compare": ("attnzoo.compare", "which mechanism is better on your own task: tuned rates, seeds, 95% intervals"),
    "adapt": ("attnzoo.adapt.cli", "adapt a pretrained model (SmolLM2, GPT-2, Llama, an attnzoo run) into a mechanism"),
    "adapt-speed": ("attnzoo.adapt.speed", "prefill and per-token decoding time of a teacher and its adapted models"),
    "models": ("attnzoo.models.cli", "list registered models with parameter counts"),
    "selftest": ("attnzoo.selftest", "check every mechanism x backend on this device against the float64 reference"),
    "kernels": ("attnzoo.kernels", "list the fused CPU kernels' builds; --clean removes all but this environment's"),
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: attnzoo [--debug] <command> [options]", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {desc}" for name, (_, desc) in COMMANDS.items()]
    return "\n".join(lines)


def _debug_requested(argv: list[str]) -> tuple[bool, list[str]]:
    debug = os.environ.get("ATTNZOO_DEBUG", "").strip().lower() not in ("", "0", "false", "no")
    if argv and argv[0] == "--debug":
        return True, argv[1:]
    return debug, argv


def _one_line(e: BaseException) -> str:
    """The error as one line: its message, prefixed with its type where the type carries the meaning."""
    msg = " ".join(str(e).split()) or type(e).__name__
    # ValueError/TypeError subclasses are attnzoo's validation errors: the message says it all
    if isinstance(e, (ValueError, TypeError, KeyError, LookupError)) and type(e).__module__.startswith("attnzoo"):
        return msg
    if type(e) in (ValueError, TypeError):
        return msg
    return f"{type(e).__name__}: {msg}"


def main(argv: list[str] | None = None) -> int:
    """Run ``attnzoo [--debug] <command> ...``; an error is one line ``attnzoo <command>: error: ...`` and a
    non-zero exit (``--debug`` or ``ATTNZOO_DEBUG=1`` shows the traceback instead)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug, argv = _debug_requested(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        print(f"attnzoo: error: unknown command {cmd!r}; valid commands: {sorted(COMMANDS)}", file=sys.stderr)
        return 2
    prev = os.environ.get("ATTNZOO_DEBUG")
    if debug:
        os.environ["ATTNZOO_DEBUG"] = "1"  # the commands' own error handlers re-raise too
    try:
        module = importlib.import_module(COMMANDS[cmd][0])
        return int(module.main(rest) or 0)
    except SystemExit as e:  # argparse's usage errors (already printed as one line) and commands' exits
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except KeyboardInterrupt:
        print(f"attnzoo {cmd}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the CLI's last resort: one line, no traceback, unless --debug
        if debug:
            raise
        print(
            f"attnzoo {cmd}: error: {_one_line(e)} (run `attnzoo --debug {cmd} ...` for the traceback)", file=sys.stderr
        )
        return 1
    finally:
        if debug:
            if prev is None:
                os.environ.pop("ATTNZOO_DEBUG", None)
            else:
                os.environ["ATTNZOO_DEBUG"] = prev


def debug_enabled() -> bool:
    """Whether errors should show their traceback (``attnzoo --debug`` or ``ATTNZOO_DEBUG=1``)."""
    return _debug_requested([])[0]


if __name__ == "__main__":
    raise SystemExit(main())

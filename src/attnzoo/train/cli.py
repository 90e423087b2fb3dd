"""``attnzoo train <config.yaml | preset> [--out DIR] [--resume | --overwrite] [--key=value ...]``.

Exit status: 0 done, 2 bad configuration or input (config, task options, checkpoint), 1 other errors, 3 missing
dataset, 130 / 143 stopped by SIGINT / SIGTERM (after writing a checkpoint; continue with ``--resume``).
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import time
from pathlib import Path

USAGE = """usage: attnzoo train [CONFIG] [--out DIR] [--resume | --overwrite] [--no-progress] [--nproc-per-node N]
                     [--key=value ...]

CONFIG is a YAML file or a preset name (attnzoo presets). Overrides use the config keys, with dotted keys
into option mappings: --steps=200 --lr=3e-4 --attention=tssa --model_options.depth=4 --task_options.n_train=1000

  --out DIR      run directory (default runs/<preset or config name>)
  --resume       continue the run in DIR from its latest checkpoint (bit-exact); starts it if DIR is empty
  --overwrite    delete the attnzoo run in DIR and start again (never deletes a directory that is not a run)
  --no-progress  no progress bar
  --nproc-per-node N
                 data-parallel over N processes on this machine (torchrun's launcher, in-process: an error is one
                 line, without torchrun's ChildFailedError summary); global batch_size is split over them
Distributed over several machines: torchrun ... -m attnzoo train ...
"""


def _take_nproc(argv: list[str]) -> tuple[int | None, list[str]]:
    """``--nproc-per-node N`` (or ``--nproc_per_node``, ``=N``) and the remaining arguments, for the workers."""
    from attnzoo.train.config import ConfigError

    nproc, rest, i = None, [], 0
    while i < len(argv):
        a = argv[i]
        name, eq, value = a.partition("=")
        if name.replace("_", "-") != "--nproc-per-node":
            rest.append(a)
            i += 1
            continue
        if not eq:
            if i + 1 >= len(argv):
                raise ConfigError("--nproc-per-node needs a number of processes")
            value = argv[i + 1]
        if not value.isdigit() or int(value) < 1:
            raise ConfigError(f"--nproc-per-node must be a positive whole number, got {value!r}")
        nproc = int(value)
        i += 1 if eq else 2
    return nproc, rest


def _split_args(argv: list[str]):
    config = out = None
    resume = overwrite = False
    progress = True
    rest: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-h", "--help"):
            return None
        if a in ("--out", "-o") and i + 1 < len(argv):
            out = argv[i + 1]
            i += 2
            continue
        if a.startswith("--out="):
            out = a.split("=", 1)[1]
        elif a == "--resume":
            resume = True
        elif a == "--overwrite":
            overwrite = True
        elif a == "--no-progress":
            progress = False
        elif not a.startswith("-") and config is None and not rest:
            config = a
        else:
            rest.append(a)
        i += 1
    return config, out, resume, overwrite, progress, rest


#: how long a rank other than 0 waits before exiting on an error every rank meets alike, so that torchrun (which
#: terminates the other ranks when one exits) does not stop rank 0 before it prints the error line
PEER_GRACE_S = 3.0


def _fail(e: BaseException, code: int, out: str | None = None) -> int:
    """Print ``e`` as one line (``--debug`` / ``ATTNZOO_DEBUG=1``: re-raise for the traceback).

    Under torchrun the errors every process meets alike (a bad config or directory, a locked run) are printed by
    the main process only, so the user reads one line; a write error ends with the command that continues.
    """
    from attnzoo._io import WriteError
    from attnzoo._lock import DirectoryLocked
    from attnzoo.cli import _one_line, debug_enabled
    from attnzoo.train.launch import record_error_line

    if debug_enabled():
        raise e
    rank = os.environ.get("RANK", "0")
    # these messages say what happened in full; a type name in front ("WriteError: ...") would add nothing
    msg = " ".join(str(e).split()) if isinstance(e, (DirectoryLocked, WriteError)) else _one_line(e)
    if isinstance(e, WriteError) and out is not None:
        msg += (
            f". The run's checkpoints and files written before are kept; free space (or fix the cause) and continue "
            f"with: attnzoo train --resume --out {shlex.quote(out)}"
        )
    if rank != "0" and isinstance(e, (ValueError, TypeError, DirectoryLocked)):
        # every rank meets it alike: rank 0 prints it; torchrun's summary names it whichever rank it calls first.
        # The launcher terminates the other ranks as soon as one exits: wait for rank 0 to print its line first
        record_error_line(f"attnzoo train: error: {msg}")
        time.sleep(PEER_GRACE_S)
        return code
    line = f"attnzoo train: error{'' if rank == '0' else f' (rank {rank})'}: {msg}"
    print(line, file=sys.stderr)
    record_error_line(line)  # torchrun's failure summary then names it (see attnzoo.train.launch)
    return code


def main(argv: list[str] | None = None) -> int:
    from attnzoo.data.paths import DatasetNotFoundError
    from attnzoo.train.config import ConfigError, load_config, parse_overrides  # noqa: F401 (ConfigError below)
    from attnzoo.train.run_dir import load_run
    from attnzoo.train.trainer import train

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        nproc, argv = _take_nproc(argv)
    except ValueError as e:
        return _fail(e, 2)
    if nproc is not None and nproc > 1 and "-h" not in argv and "--help" not in argv:
        if "WORLD_SIZE" in os.environ:
            return _fail(ConfigError("--nproc-per-node starts the processes itself: do not use it under torchrun"), 2)
        from attnzoo.train.launch import launch

        return launch(nproc, argv)
    parsed = _split_args(argv)
    if parsed is None:
        print(USAGE)
        return 0
    config, out, resume, overwrite, progress, rest = parsed
    try:
        overrides = parse_overrides(rest)
        if config is None and not resume:
            raise ConfigError("no config given: pass a YAML file or a preset name (attnzoo presets lists them)")
        if out is None:
            if config is None:
                raise ConfigError("--resume needs --out DIR (the run directory)")
            out = str(Path("runs") / Path(config).stem)
        if config is None:
            cfg = load_run(Path(out))
            if overrides:
                from attnzoo.train.config import apply_overrides

                cfg = apply_overrides(cfg, overrides)
        else:
            cfg = load_config(config, overrides)
        main_process = os.environ.get("RANK", "0") == "0"  # torchrun starts one CLI per process
        if main_process:
            print(f"attnzoo train: {cfg.task} / {cfg.model} -> {out}", file=sys.stderr)
        result = train(cfg, out, resume=resume, overwrite=overwrite, progress=progress)
    except DatasetNotFoundError as e:
        return _fail(e, 3, out)
    except (ValueError, TypeError, OSError, RuntimeError) as e:
        # ConfigError, both CheckpointErrors, NonFiniteError, bad task options, unreadable files, a run locked by
        # another process, a failed write: one line each
        return _fail(e, 2 if isinstance(e, (ValueError, TypeError)) else 1, out)
    if result.interrupted:
        return 128 + int(result.signal or signal.SIGTERM)
    metrics = ", ".join(f"{k}={v:.4f}" for k, v in result.final_metrics.items() if isinstance(v, float))
    if main_process:
        print(f"attnzoo train: done at step {result.step}: {metrics}. Run directory: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

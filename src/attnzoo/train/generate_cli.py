"""``attnzoo generate RUN_DIR --prompt TEXT``: sample text from a trained character-level language model."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="attnzoo generate", description="sample from a trained language model run")
    p.add_argument("run", help="run directory of a causal-LM task (e.g. a shakespeare_* preset)")
    p.add_argument("--prompt", default="\n", help="text to continue (characters of the run's vocabulary)")
    p.add_argument("--max-new-tokens", type=int, default=300)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--num-samples", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", default="latest")
    p.add_argument("--device", default="auto")
    a = p.parse_args(argv)
    if a.max_new_tokens < 1:
        p.error(f"--max-new-tokens must be a positive integer, got {a.max_new_tokens}")
    if a.num_samples < 1:
        p.error(f"--num-samples must be a positive integer, got {a.num_samples}")
    if not (a.temperature >= 0 and a.temperature != float("inf")):
        p.error(f"--temperature must be a finite number >= 0 (0 = greedy), got {a.temperature}")
    if a.top_k is not None and a.top_k < 1:
        p.error(f"--top-k must be a positive integer, got {a.top_k}")

    import torch

    from attnzoo._lock import DirectoryLocked, DirLock
    from attnzoo.data.tasks import build_task
    from attnzoo.data.text import CharVocab
    from attnzoo.train.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint
    from attnzoo.train.config import ConfigError
    from attnzoo.train.device import resolve_device
    from attnzoo.train.objectives import build_task_model
    from attnzoo.train.run_dir import RUN_MARKER, load_run

    run = Path(a.run)
    # not while attnzoo train rewrites the checkpoints; no lock file is made in a directory that is no run
    lock = DirLock(run, mode="shared", what="run directory", create=(run / RUN_MARKER).is_file())
    try:
        lock.acquire()
        cfg = load_run(run)
        vocab_file = run / "vocab.json"
        if not vocab_file.is_file():
            raise ConfigError(f"{run} is not a language-model run (no vocab.json); task was {cfg.task!r}")
        try:
            vocab = CharVocab.from_json(vocab_file.read_bytes().decode("utf-8"))
        except (ValueError, KeyError, TypeError) as e:
            raise ConfigError(
                f"{vocab_file} is corrupt ({type(e).__name__}: {e}); it should hold "
                f'{{"chars": [...]}} as written by attnzoo train'
            ) from e
        ckpt = latest_checkpoint(run / "checkpoints") if a.checkpoint == "latest" else Path(a.checkpoint)
        if ckpt is None:
            raise CheckpointError(f"{run} has no checkpoint yet")
        device = resolve_device(a.device)
        # the model needs the task's sizes, not its data: build it with the saved task options
        task = build_task(cfg.task, **cfg.task_options)
        model = build_task_model(cfg, task).to(device)
        load_checkpoint(ckpt, model, restore_rng=False)
        model.eval()
        ids = torch.as_tensor(vocab.encode(a.prompt or "\n"), device=device)[None].repeat(a.num_samples, 1)
        g = torch.Generator(device=device).manual_seed(a.seed)
        out = model.generate(ids, a.max_new_tokens, temperature=a.temperature, top_k=a.top_k, generator=g)
    except (ConfigError, CheckpointError, ValueError, DirectoryLocked) as e:
        from attnzoo.cli import debug_enabled

        if debug_enabled():
            raise
        print(f"attnzoo generate: error: {e}", file=sys.stderr)
        return 2
    finally:
        lock.release()
    for i, row in enumerate(out.tolist()):
        if a.num_samples > 1:
            print(f"--- sample {i}")
        print(vocab.decode(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

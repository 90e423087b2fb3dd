"""``attnzoo presets [show NAME | tasks]``: the shipped training presets and the available tasks."""

from __future__ import annotations

import argparse
import sys

#: what a task option's default ``None`` stands for, where that is not "no limit / not used"
_NONE_MEANS = {"val_fraction": " (0.1 when root has no train/ and val/ folders)"}


def main(argv: list[str] | None = None) -> int:
    from attnzoo.data.tasks import list_tasks, task_kind, task_options
    from attnzoo.train.config import ConfigError, list_presets, load_config, preset_path

    p = argparse.ArgumentParser(prog="attnzoo presets", description="list training presets and tasks")
    p.add_argument("what", nargs="?", default="list", choices=["list", "show", "tasks"])
    p.add_argument("name", nargs="?", help="preset name (for show)")
    a = p.parse_args(argv)
    if a.what == "tasks":
        for name, desc in list_tasks().items():
            import inspect

            opts = ", ".join(
                f"{k}=(required)"
                if v is inspect.Parameter.empty
                else f"{k}={v!r}{_NONE_MEANS.get(k, '') * (v is None)}"
                for k, v in task_options(name).items()
            )
            print(f"{name:18s} [{task_kind(name)}] {desc}\n{'':18s} options: {opts}")
        return 0
    if a.what == "show":
        if not a.name:
            print("attnzoo presets: error: show needs a preset name", file=sys.stderr)
            return 2
        try:
            print(preset_path(a.name).read_text(), end="")
        except ConfigError as e:
            print(f"attnzoo presets: error: {e}", file=sys.stderr)
            return 2
        return 0
    presets = list_presets()
    width = max(map(len, presets))
    print(f"{'preset'.ljust(width)}  {'task':18s} {'model':20s} description")
    for name, desc in presets.items():
        cfg = load_config(name)
        print(f"{name.ljust(width)}  {cfg.task:18s} {cfg.model:20s} {desc}")
    print("\ntrain one: attnzoo train PRESET --out DIR [--key=value ...]; see a preset: attnzoo presets show PRESET")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

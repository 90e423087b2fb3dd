"""``attnzoo kernels [--clean] [--keep N]``: the build cache of the fused CPU kernels (``ops/*/*.cpp``).

Without options it lists the build directories, most recently used first, marking the one this Python environment
loads. ``--clean`` removes all but that one; ``--keep N`` keeps the N most recently used (the current one among
them). Loading the kernels already keeps :data:`~attnzoo.ops._cpu_kernels.KEEP_BUILDS`.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from attnzoo.ops import _cpu_kernels


def _size_mb(d: Path) -> float:
    return sum(f.stat().st_size for f in d.rglob("*") if f.is_file()) / 2**20


def _describe(d: Path, current: Path) -> str:
    age_h = (time.time() - _cpu_kernels.last_used(d)) / 3600
    mark = "  (this environment)" if d == current else ""
    return f"  {d.name}  {_size_mb(d):7.1f} MiB  used {age_h:6.1f} h ago{mark}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="attnzoo kernels", description="list or clean the fused CPU kernels' builds")
    p.add_argument("--clean", action="store_true", help="remove every build but this environment's")
    p.add_argument("--keep", type=int, default=None, metavar="N", help="remove all but the N most recently used")
    a = p.parse_args(argv)
    if a.keep is not None and a.keep < 1:
        p.error(f"--keep must be >= 1 (this environment's build always stays), got {a.keep}")
    current = _cpu_kernels.current_build_dir()
    if a.clean or a.keep is not None:
        removed = _cpu_kernels.clean_builds(1 if a.keep is None else a.keep)
        for d in removed:
            print(f"removed {d}")
        print(f"{len(removed)} build(s) removed from {_cpu_kernels.cache_root()}")
        return 0
    found = _cpu_kernels.builds()
    print(f"{_cpu_kernels.cache_root()}: {len(found)} build(s), most recently used first")
    for d in found:
        print(_describe(d, current))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

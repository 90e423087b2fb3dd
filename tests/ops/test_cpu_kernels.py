"""The build-on-first-use machinery of the fused CPU kernels (``attnzoo.ops._cpu_kernels``)."""
import os
import shutil
import subprocess
import sys

import torch

from attnzoo.ops import _cpu_kernels


def test_kernels_build_here():
    # CI has a C++ compiler: the kernels must load (the "cpu" backend tests rely on it, and "auto" uses them)
    assert _cpu_kernels.cpu_kernels() is not None, _cpu_kernels.cpu_kernels_error()
    assert _cpu_kernels.cpu_kernels_error() == ""


def test_build_dir_is_keyed_by_torch_and_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNZOO_CPU_KERNELS_DIR", str(tmp_path))
    d = _cpu_kernels._build_dir()
    assert d.parent == tmp_path and d.is_dir()
    assert d.name == f"torch{torch.__version__.replace('+', '_')}-{_cpu_kernels._cpu_signature()}"


def test_a_stale_torch_lock_does_not_hang_the_next_build(tmp_path):
    # a build killed mid-way leaves torch's "lock" file; the next process must clear it instead of waiting
    # forever. Run in a subprocess on a copy of this machine's build (the library is already loaded here).
    src = _cpu_kernels._build_dir()
    _cpu_kernels.cpu_kernels()
    root = tmp_path / "cache"
    shutil.copytree(src, root / src.name)
    (root / src.name / "lock").write_text("")
    env = dict(os.environ, ATTNZOO_CPU_KERNELS_DIR=str(root))
    code = ("from attnzoo.ops._cpu_kernels import cpu_kernels, cpu_kernels_error\n"
            "k = cpu_kernels(); assert k is not None, cpu_kernels_error(); print('loaded')")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0 and "loaded" in res.stdout, res.stderr[-2000:]
    assert not (root / src.name / "lock").exists()

"""The build-on-first-use machinery of the fused CPU kernels (``attnzoo.ops._cpu_kernels``)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.utils.cpp_extension

from attnzoo import ops
from attnzoo.ops import _cpu_kernels


def test_kernels_build_here():
    # CI has a C++ compiler: the kernels must load (the "cpu" backend tests rely on it, and "auto" uses them)
    assert _cpu_kernels.cpu_kernels() is not None, _cpu_kernels.cpu_kernels_error()
    assert _cpu_kernels.cpu_kernels_error() == ""


def test_build_dir_is_keyed_by_torch_cpu_environment_flags_and_sources(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNZOO_CPU_KERNELS_DIR", str(tmp_path))
    d = _cpu_kernels._build_dir()
    assert d.parent == tmp_path and d.is_dir()
    assert d.name == (
        f"torch{torch.__version__.replace('+', '_')}-{_cpu_kernels._cpu_signature()}-{_cpu_kernels._build_key()}"
    )
    assert _cpu_kernels._build_dir() == d  # stable
    edited = tmp_path / "edited"
    (edited / "tssa").mkdir(parents=True)
    (edited / "tssa" / "cpu.cpp").write_text(_cpu_kernels.kernel_sources()[0].read_text() + "\n// edited\n")
    changes = [
        (sys, "executable", "/envs/b/bin/python"),
        (sys, "prefix", "/envs/b"),
        (torch, "__version__", "9.9.9"),
        (_cpu_kernels, "_cflags", lambda: ["-O2"]),
        (_cpu_kernels, "_ldflags", lambda: ["-lm"]),
        (_cpu_kernels, "KERNEL_ROOTS", [edited]),
    ]
    for obj, attr, value in changes:
        with monkeypatch.context() as m:
            m.setattr(obj, attr, value)
            assert _cpu_kernels._build_dir().name.rsplit("-", 1)[1] != d.name.rsplit("-", 1)[1], attr


def test_kernel_sources_are_every_cpp_file_in_a_folder_of_ops():
    ops_dir = Path(_cpu_kernels.__file__).resolve().parent
    found = [p.relative_to(ops_dir).as_posix() for p in _cpu_kernels.kernel_sources()]
    assert found == sorted(p.relative_to(ops_dir).as_posix() for p in ops_dir.glob("*/*.cpp"))
    assert {"tssa/cpu.cpp", "csp/cpu.cpp", "fastmax/cpu.cpp", "_kernels/feature_attention.cpp"} <= set(found)


def test_a_new_folder_with_a_kernel_is_compiled_without_an_edit_elsewhere(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNZOO_CPU_KERNELS_DIR", str(tmp_path / "cache"))
    before, key = _cpu_kernels.kernel_sources(), _cpu_kernels._build_key()
    extra = tmp_path / "mine"
    (extra / "toy").mkdir(parents=True)
    (extra / "toy" / "cpu.cpp").write_text("// a new mechanism's kernel\n")
    (extra / "toy" / "notes.txt").write_text("not a source")
    (extra / "stray.cpp").write_text("// not inside a folder: not a mechanism's kernel")
    monkeypatch.setattr(_cpu_kernels, "KERNEL_ROOTS", [*_cpu_kernels.KERNEL_ROOTS, extra])
    assert _cpu_kernels.kernel_sources() == [*before, extra / "toy" / "cpu.cpp"]
    assert _cpu_kernels._build_key() != key  # the new source makes a new build
    staged = _cpu_kernels._staged_sources(_cpu_kernels._build_dir())
    assert len({p.name for p in staged}) == len(staged) and staged[-1].name == "toy_cpu.cpp"


def test_a_moved_source_makes_a_new_build(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    for root, folder in ((a, "one"), (b, "two")):
        (root / folder).mkdir(parents=True)
        (root / folder / "k.cpp").write_text("// the same text\n")
    keys = []
    for root in (a, b):
        monkeypatch.setattr(_cpu_kernels, "KERNEL_ROOTS", [root])
        keys.append(_cpu_kernels._build_key())
    assert keys[0] != keys[1]  # staged as one_k.cpp, then two_k.cpp: the object files differ


def _fake_load(builds):
    """Stands in for ``torch.utils.cpp_extension.load`` like ninja does: rebuild when the recorded recipe
    (compiler command, include paths of this environment) differs or the library is missing, else nothing."""

    def load(name, sources, extra_cflags, extra_ldflags, build_directory, **kw):
        d = Path(build_directory)
        recipe = json.dumps([sys.executable, sys.prefix, sources, extra_cflags, extra_ldflags])
        ninja, lib = d / "build.ninja", d / f"{name}.so"
        if ninja.is_file() and ninja.read_text() == recipe and lib.is_file():
            return
        builds.append((sys.prefix, d.name))
        ninja.write_text(recipe)
        lib.write_bytes(b"\x7fELF")

    return load


def test_two_environments_used_alternately_compile_once_each(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNZOO_CPU_KERNELS_DIR", str(tmp_path))
    builds = []
    monkeypatch.setattr(torch.utils.cpp_extension, "load", _fake_load(builds))
    envs = [("/envs/a/bin/python", "/envs/a"), ("/envs/b/bin/python", "/envs/b")] * 3

    def use_alternately():
        for exe, prefix in envs:  # one process of each environment after another
            with monkeypatch.context() as m:
                m.setattr(sys, "executable", exe)
                m.setattr(sys, "prefix", prefix)
                _cpu_kernels._build(wait_s=5)

    use_alternately()
    assert [b[0] for b in builds] == ["/envs/a", "/envs/b"]
    assert builds[0][1] != builds[1][1] and len(list(tmp_path.iterdir())) == 2
    # control: with one shared directory (the old key) the same sequence rebuilds on every switch
    builds.clear()
    shared = tmp_path / "shared"
    shared.mkdir()
    monkeypatch.setattr(_cpu_kernels, "_build_dir", lambda: shared)
    use_alternately()
    assert len(builds) == 6


def test_waiting_for_another_build_says_so_once_then_falls_back(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("ATTNZOO_CPU_KERNELS_DIR", str(tmp_path))
    monkeypatch.setenv("ATTNZOO_CPU_KERNELS_WAIT", "1.5")
    build_dir = _cpu_kernels._build_dir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom pathlib import Path\n"
            "from attnzoo.ops._cpu_kernels import _build_lock\n"
            "with _build_lock(Path(sys.argv[1])):\n    print('held', flush=True)\n    time.sleep(120)\n",
            str(build_dir),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"

        def no_compile(*a, **kw):
            raise AssertionError("must not build while another process holds the lock")

        monkeypatch.setattr(torch.utils.cpp_extension, "load", no_compile)
        # as in a fresh process: nothing loaded yet
        monkeypatch.setattr(_cpu_kernels, "_loaded", False)
        monkeypatch.setattr(_cpu_kernels, "_error", None)
        monkeypatch.setattr(_cpu_kernels, "_announced", False)
        capfd.readouterr()
        t0 = time.monotonic()
        with pytest.warns(
            RuntimeWarning,
            match=rf"gave up waiting .*process {holder.pid} held the build lock .* "
            rf"1\.5 s .*uses the PyTorch path",
        ):
            assert _cpu_kernels.cpu_kernels() is None
        assert 1.5 <= time.monotonic() - t0 < 30
        assert _cpu_kernels.cpu_kernels() is None  # no second wait
        err = capfd.readouterr().err
        assert err.count("attnzoo: waiting for") == 1, err
        assert f"waiting for process {holder.pid}, which is building the fused CPU kernels in {build_dir}" in err
        assert "ATTNZOO_CPU_KERNELS_WAIT" in err and f"process {holder.pid}" in _cpu_kernels.cpu_kernels_error()
        # the ops work on, on their PyTorch path
        w = torch.randn(2, 3, 7, 4, dtype=torch.float64)
        temp = torch.ones(3, dtype=torch.float64)
        torch.testing.assert_close(ops.tssa(w, temp, backend="auto"), ops.tssa(w, temp, backend="naive"))
    finally:
        holder.kill()
        holder.wait()
    # the dead holder's lock is gone with it: the next build proceeds at once
    builds = []
    monkeypatch.setattr(torch.utils.cpp_extension, "load", _fake_load(builds))
    _cpu_kernels._build(wait_s=0)
    assert len(builds) == 1


@pytest.mark.parametrize("raw", ["-1", "soon", "inf", "nan"])
def test_bad_wait_setting_is_named(monkeypatch, raw):
    monkeypatch.setenv("ATTNZOO_CPU_KERNELS_WAIT", raw)
    monkeypatch.setattr(_cpu_kernels, "_loaded", False)
    monkeypatch.setattr(_cpu_kernels, "_error", None)
    with pytest.raises(ValueError, match=rf"ATTNZOO_CPU_KERNELS_WAIT='{raw}': expected a finite number of seconds"):
        _cpu_kernels.cpu_kernels()


def test_a_stale_torch_lock_does_not_hang_the_next_build():
    # a build killed mid-way leaves torch's "lock" file; the next process must clear it instead of waiting
    # forever. It is planted in this machine's own, up-to-date build (a copy elsewhere would be compiled again,
    # ninja's recorded commands naming the original directory) while holding the build lock, so that no other
    # process is inside torch's load meanwhile; a subprocess then loads (the library is already loaded here).
    _cpu_kernels.cpu_kernels()
    build_dir = _cpu_kernels._build_dir()
    with _cpu_kernels._build_lock(build_dir):
        (build_dir / "lock").write_text("")
    code = (
        "from attnzoo.ops._cpu_kernels import cpu_kernels, cpu_kernels_error\n"
        "k = cpu_kernels(); assert k is not None, cpu_kernels_error(); print('loaded')"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "loaded" in res.stdout, res.stderr[-2000:]
    assert not (build_dir / "lock").exists()


def _fake_builds(root: Path, ages_h: list[float]) -> list[Path]:
    # build directories named as _cpu_kernels names them, last used ages_h hours ago
    now = time.time()
    dirs = []
    for i, age in enumerate(ages_h):
        d = root / f"torch9.9.9-{i:012x}-{'ab' * 6}"
        d.mkdir()
        (d / "attnzoo_cpu.so").write_bytes(b"\x7fELF")
        (d / "last_used").touch()
        os.utime(d / "last_used", (now - age * 3600,) * 2)
        dirs.append(d)
    return dirs


def test_old_builds_are_removed_least_recently_used_first(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNZOO_CPU_KERNELS_DIR", str(tmp_path))
    builds = []
    monkeypatch.setattr(torch.utils.cpp_extension, "load", _fake_load(builds))
    old = _fake_builds(tmp_path, [5.0, 1.0, 30.0, 2.0])
    (tmp_path / "notes").mkdir()  # not a build: never touched
    _cpu_kernels._build(wait_s=5)
    current = _cpu_kernels.current_build_dir()
    # the current build and the two most recently used others stay (KEEP_BUILDS = 3)
    assert _cpu_kernels.builds() == [current, old[1], old[3]]
    assert (tmp_path / "notes").is_dir()
    assert _cpu_kernels.clean_builds(keep=1) == [old[1], old[3]]
    assert _cpu_kernels.builds() == [current]


def test_a_build_another_process_holds_is_not_removed(tmp_path, monkeypatch):
    pytest.importorskip("fcntl")
    monkeypatch.setenv("ATTNZOO_CPU_KERNELS_DIR", str(tmp_path))
    busy, idle = _fake_builds(tmp_path, [10.0, 20.0])
    code = (
        "import fcntl, os, sys, time\n"
        "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('held', flush=True); time.sleep(60)"
    )
    lock = str(busy / _cpu_kernels._LOCK_NAME)
    holder = subprocess.Popen([sys.executable, "-c", code, lock], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"  # building or loading in another process
        assert _cpu_kernels.clean_builds(keep=0) == [idle]
        assert busy.is_dir() and not idle.exists()
    finally:
        holder.kill()
        holder.wait()
    with pytest.raises(ValueError, match="keep must be an integer >= 0"):
        _cpu_kernels.clean_builds(keep=-1)


def test_kernels_command_lists_and_cleans(tmp_path, monkeypatch, capsys):
    from attnzoo.cli import main

    monkeypatch.setenv("ATTNZOO_CPU_KERNELS_DIR", str(tmp_path))
    old = _fake_builds(tmp_path, [3.0, 1.0])
    assert main(["kernels"]) == 0
    out = capsys.readouterr().out
    assert "2 build(s)" in out and out.index(old[1].name) < out.index(old[0].name)
    assert main(["kernels", "--keep", "2"]) == 0
    assert "removed" in capsys.readouterr().out and not old[0].exists() and old[1].exists()
    assert main(["kernels", "--clean"]) == 0
    assert "1 build(s) removed" in capsys.readouterr().out and _cpu_kernels.builds() == []
    assert main(["kernels", "--keep", "0"]) == 2

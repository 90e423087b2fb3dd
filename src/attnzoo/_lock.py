"""One writer per directory: an OS-level lock (``fcntl.flock``) on ``DIR/.attnzoo-lock``.

``attnzoo train`` and ``attnzoo reproduce`` hold it exclusively while they write a run or reproduce directory;
``attnzoo eval`` and ``attnzoo generate`` hold it shared while they read one (readers exclude writers, not each
other). A second writer fails at once with :class:`DirectoryLocked`, whose message names the holder's pid, host and
command (recorded inside the lock file). The kernel drops a ``flock`` when its process dies, so the lock of a
killed process is never stale: the next process simply takes it. The lock file itself is never deleted while in
use (deleting a locked file would let a second process lock a new file of the same name); a lock file that this
process created together with its otherwise empty directory is removed again on release.
"""

from __future__ import annotations

import errno
import os
import shlex
import socket
import sys
import time
from pathlib import Path
from typing import Literal

try:
    import fcntl
except ImportError:  # Windows: no flock; directories are then not locked (documented in the README)
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCK_NAME", "DirectoryLocked", "DirLock", "lock_directory", "holder_of", "refuse_if_locked"]

#: the lock file inside a locked directory (a run file: ``--overwrite`` and the emptiness checks ignore it)
LOCK_NAME = ".attnzoo-lock"


class DirectoryLocked(RuntimeError):
    """Another process holds the directory's lock (the message names it)."""


def _this_command() -> str:
    """This process's command line, as a user would type it (``attnzoo train ...``, ``python -m attnzoo ...``)."""
    argv = list(sys.argv) or ["python"]
    head = argv[0]
    if head.endswith("__main__.py"):
        head = f"python -m {Path(head).parent.name}"  # python -m attnzoo / python -m attnzoo.reproduce
    elif head == "-c":
        head = "python -c"
    else:
        head = Path(head).name
    return " ".join([head, shlex.join(argv[1:])]).strip()[:500]


def holder_of(directory: str | os.PathLike) -> str:
    """What the lock file of ``directory`` says about its (last) exclusive holder: ``pid N on HOST (COMMAND)``."""
    try:
        text = (Path(directory) / LOCK_NAME).read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return "another process"
    fields = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    if "pid" not in fields:
        return "another process"
    since = f", since {fields['since']}" if fields.get("since") else ""
    return f"pid {fields['pid']} on {fields.get('host', '?')} ({fields.get('command', '?')}{since})"


class DirLock:
    """``flock`` on ``directory/.attnzoo-lock`` (created, with ``directory``, when missing).

    ``mode="exclusive"`` (writers) or ``"shared"`` (readers); ``what`` names the directory in the message, e.g.
    ``"run directory"``; ``create=False`` locks nothing where the lock file is missing (a reader of a directory
    that may not be attnzoo's). Use as a context manager or with :meth:`acquire` / :meth:`release`.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        mode: Literal["exclusive", "shared"] = "exclusive",
        what: str = "directory",
        create: bool = True,
    ) -> None:
        if mode not in ("exclusive", "shared"):
            raise ValueError(f"lock mode must be 'exclusive' or 'shared', got {mode!r}")
        self.directory = Path(directory)
        self.mode = mode
        self.create = create
        self.what = what
        self._fd: int | None = None
        self._created_dir = False

    @property
    def path(self) -> Path:
        return self.directory / LOCK_NAME

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> DirLock:
        """Take the lock or raise :class:`DirectoryLocked` at once (never waits)."""
        if self._fd is not None or fcntl is None:
            return self
        for _ in range(10):  # retried only when the file was replaced between open and flock (see below)
            # inside the loop: a holder that created the directory removes it on release, maybe between our open
            # and our flock; the retry then recreates it rather than failing to open a file in a missing directory
            if not self._make_directory():
                return self  # a reader of a missing directory: its own error says so
            fd = self._open()
            if fd is None:  # a read-only directory without a lock file: nothing can write it, nothing to lock
                return self
            op = (fcntl.LOCK_EX if self.mode == "exclusive" else fcntl.LOCK_SH) | fcntl.LOCK_NB
            try:
                fcntl.flock(fd, op)
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    os.close(fd)
                    raise
                readers = self.mode == "exclusive" and _can_share(fd)
                os.close(fd)
                self._created_dir = False
                raise DirectoryLocked(self._message(readers=readers)) from None
            # the holder before us may have removed the file on release: then we locked a file nobody else sees
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self._fd = fd
                break
            os.close(fd)
        else:
            raise DirectoryLocked(f"{self.path} keeps being replaced; is another program deleting it?")
        if self.mode == "exclusive":
            self._record()
        return self

    def _make_directory(self) -> bool:
        """Create the missing directory of a writer; ``False`` for a reader of a missing directory (nothing to lock)."""
        if self.directory.exists():
            return True
        if self.mode == "shared":
            return False
        self.directory.mkdir(parents=True, exist_ok=True)
        self._created_dir = True
        return True

    def _open(self) -> int | None:
        if not self.create and not self.path.is_file():
            return None
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        except PermissionError:
            if self.mode == "shared" and self.path.is_file():
                return os.open(self.path, os.O_RDONLY)
            if self.mode == "shared" and not self.path.exists():
                return None
            raise

    def _record(self) -> None:
        """Write who holds the lock into the lock file itself (in place: a rename would change the locked file)."""
        info = (
            f"pid={os.getpid()}\nhost={socket.gethostname()}\ncommand={_this_command()}\n"
            f"since={time.strftime('%Y-%m-%d %H:%M:%S')}\n"
        )
        try:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, info.encode("utf-8", "replace"), 0)
        except OSError:
            pass  # a full disk must not stop the run for want of this note; the lock itself is held

    def _message(self, readers: bool = False) -> str:
        if readers:  # readers record nothing (there may be several): the file names an earlier writer
            return (
                f"{self.what} {self.directory} is being read by another process (attnzoo eval or attnzoo generate); "
                "wait for it to finish and try again"
            )
        who = holder_of(self.directory)
        if self.mode == "shared":
            return (
                f"{self.what} {self.directory} is being written by {who}; wait for it to finish "
                f"(or stop it) and try again"
            )
        return (
            f"{self.what} {self.directory} is in use by {who}; only one attnzoo process may write it at a time "
            f"(attnzoo eval/generate also hold it while they read): wait for it to finish, or choose another directory"
        )

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            if self._created_dir and {p.name for p in self.directory.iterdir()} == {LOCK_NAME}:
                # nothing but our lock file in the directory we created: leave no trace of a run that wrote nothing
                self.path.unlink()
                self.directory.rmdir()
        except OSError:
            pass
        finally:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None
            self._created_dir = False

    def __enter__(self) -> DirLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def lock_directory(directory: str | os.PathLike, what: str = "directory") -> DirLock:
    """An exclusive :class:`DirLock` on ``directory``, already acquired."""
    return DirLock(directory, what=what).acquire()


def _can_share(fd: int) -> bool:
    """Whether the file of ``fd``, which is locked, could be locked shared: its holders are readers."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return False
    fcntl.flock(fd, fcntl.LOCK_UN)
    return True


def refuse_if_locked(directory: str | os.PathLike, what: str = "directory") -> None:
    """Raise :class:`DirectoryLocked` if another process holds ``directory``'s lock (writes nothing).

    For errors about a directory's state: when another process is writing it, that process is the real culprit.
    """
    path = Path(directory) / LOCK_NAME
    if fcntl is None or not path.is_file():
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            raise DirectoryLocked(DirLock(directory, what=what)._message(readers=_can_share(fd))) from None
    finally:
        os.close(fd)

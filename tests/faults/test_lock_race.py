"""The run-directory lock under a forced race: a writer opens the lock file, then the holder releases the lock and
deletes the file (and the directory it created) before the writer's ``flock``; the writer must end up holding the
lock of the file that others see, so that exactly one writer holds the directory."""

from __future__ import annotations

import os

import pytest

from attnzoo._lock import LOCK_NAME, DirectoryLocked, DirLock


def _release_after_open(monkeypatch, waiter: DirLock, holder: DirLock, *, delete: bool = False) -> list[int]:
    """Make ``waiter``'s first open of the lock file be followed at once by ``holder``'s release (before flock).

    ``delete``: another program then deletes the lock file too (a holder of a directory it did not create keeps it).
    """
    original_open = DirLock._open
    opened: list[int] = []

    def open_then_holder_releases(self: DirLock) -> int | None:
        fd = original_open(self)
        if self is waiter and not opened:
            opened.append(fd)
            holder.release()
            if delete:
                os.unlink(holder.path)
        return fd

    monkeypatch.setattr(DirLock, "_open", open_then_holder_releases)
    return opened


@pytest.mark.parametrize("holder_made_the_directory", [True, False])
def test_a_writer_racing_the_release_holds_the_lock_that_others_see(tmp_path, monkeypatch, holder_made_the_directory):
    d = tmp_path / "run"
    if not holder_made_the_directory:
        d.mkdir()
        (d / "mine.txt").write_text("x")
    holder = DirLock(d).acquire()
    waiter = DirLock(d)
    opened = _release_after_open(monkeypatch, waiter, holder, delete=not holder_made_the_directory)
    waiter.acquire()
    try:
        assert opened and waiter.held
        assert (d / LOCK_NAME).is_file()
        assert os.fstat(waiter._fd).st_ino == os.stat(d / LOCK_NAME).st_ino  # the visible file, not the deleted one
        assert f"pid={os.getpid()}" in (d / LOCK_NAME).read_text()
        with pytest.raises(DirectoryLocked, match="is in use by pid"):  # a third writer is refused
            DirLock(d).acquire()
    finally:
        waiter.release()
    with DirLock(d) as third:  # and takes it once the waiter is done
        assert third.held


def test_a_reader_racing_the_release_of_a_directory_that_is_then_gone_locks_nothing(tmp_path, monkeypatch):
    d = tmp_path / "run"
    holder = DirLock(d).acquire()
    reader = DirLock(d, mode="shared")
    _release_after_open(monkeypatch, reader, holder)
    reader.acquire()  # no raw FileNotFoundError: a reader of a missing directory holds nothing, as without a race
    assert not reader.held and not d.exists()

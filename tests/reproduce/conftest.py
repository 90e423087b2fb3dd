"""Fixtures shared by the ``attnzoo reproduce`` tests."""

from __future__ import annotations

import pytest
import torch

from attnzoo.reproduce import main


@pytest.fixture(scope="session")
def smoke(tmp_path_factory):
    """One smoke run (single torch thread, restored afterwards) shared by every test that reads a whole run."""
    out = tmp_path_factory.mktemp("reproduce") / "smoke"
    threads = torch.get_num_threads()
    try:
        rc = main(["--budget", "smoke", "--out", str(out), "--seed", "0", "--no-progress", "--threads", "1"])
    finally:
        torch.set_num_threads(threads)
    assert rc == 0
    return out

"""Shared test setup: deterministic seeds, and uninitialised memory filled with NaN.

With deterministic algorithms on, PyTorch fills tensors from ``torch.empty`` (and friends) with NaN,
so a fast path that forgets to write part of its output fails the comparison instead of passing by luck.
"""

import os

import pytest
import torch

os.environ.setdefault("MPLBACKEND", "Agg")
# Triton reads the interpreter flag when a kernel is decorated, i.e. when attnzoo.ops.*.triton is first imported,
# which any test module may trigger (the CLI, selftest, the hf models): without a GPU, set it before all of them.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _deterministic_nan_filled():
    torch.manual_seed(0)
    prev = torch.are_deterministic_algorithms_enabled()
    prev_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    prev_fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    yield
    torch.use_deterministic_algorithms(prev, warn_only=prev_warn)
    torch.utils.deterministic.fill_uninitialized_memory = prev_fill


@pytest.fixture
def one_thread():
    """One torch thread for the test: small models on a shared 2-core machine run faster and reproducibly."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)

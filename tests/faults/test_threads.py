"""Threads: ``capture_internals`` records only the calling thread's forward, refuses a second thread's capture of
the same model, and nested captures give the outer one back."""

from __future__ import annotations

import copy
import threading

import pytest
import torch

from attnzoo import build_attention, capture_internals

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _pi(m, x):
    with torch.no_grad(), capture_internals(m) as store:
        m(x)
    return store[""]["pi"]


def test_another_threads_forward_during_a_capture_is_not_recorded():
    m = build_attention("tssa", 16, 2).eval()
    xa, xb = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    expect = _pi(m, xa)
    other_ran = threading.Event()
    errors: list[BaseException] = []

    def other():
        try:
            with torch.no_grad():
                m(xb)  # runs while the main thread's capture is open, after its forward
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)
        other_ran.set()

    with torch.no_grad(), capture_internals(m) as store:
        m(xa)
        t = threading.Thread(target=other)
        t.start()
        assert other_ran.wait(60)
        t.join()
    assert not errors
    got = store[""]["pi"]
    assert got.shape == expect.shape == (2, 2, 5)  # (B, H, N) of the main thread's input, not the other's N=7
    torch.testing.assert_close(got, expect)


def test_capturing_is_false_in_other_threads():
    m = build_attention("softmax", 8, 2)
    seen: list[bool] = []
    with capture_internals(m):
        assert m.capturing
        t = threading.Thread(target=lambda: seen.append(m.capturing))
        t.start()
        t.join()
    assert seen == [False] and not m.capturing


def test_a_concurrent_capture_of_the_same_model_raises_and_a_copy_works():
    m = build_attention("tssa", 16, 2).eval()
    result: dict[str, object] = {}

    def other():
        try:
            with capture_internals(m):
                pass
        except RuntimeError as e:
            result["error"] = str(e)
        mine = copy.deepcopy(m)  # a copy per thread is fine (it is not part of the other thread's capture)
        with torch.no_grad(), capture_internals(mine) as store:
            mine(torch.randn(1, 3, 16))
        result["copy"] = store

    with capture_internals(m):
        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert m.capturing  # the failed attempt took nothing away
    assert "is being captured by another thread" in result["error"]
    assert result["copy"][""]["pi"].shape == (1, 2, 3)
    assert not m.capturing


def test_nested_captures_in_one_thread_restore_the_outer_one():
    m = build_attention("tssa", 16, 2).eval()
    xa, xb = torch.randn(1, 4, 16), torch.randn(1, 6, 16)
    with torch.no_grad(), capture_internals(m) as outer:
        with capture_internals(m) as inner:
            m(xb)
        m(xa)
    assert inner[""]["pi"].shape[-1] == 6 and outer[""]["pi"].shape[-1] == 4

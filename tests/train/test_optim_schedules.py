"""Learning-rate schedules and the Lion optimiser."""

import itertools
import math

import pytest
import torch
from torch import nn

from attnzoo.train.optim import Lion, build_optimizer
from attnzoo.train.schedules import lr_at


def test_warmup_then_cosine():
    lrs = [lr_at(s, lr=1.0, steps=110, schedule="cosine", warmup_steps=10, min_lr_ratio=0.1) for s in range(110)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert lrs[10] == pytest.approx(1.0)
    assert lrs[60] == pytest.approx(0.1 + 0.9 * 0.5)  # half-way through the decay
    assert all(a >= b for a, b in itertools.pairwise(lrs[10:])) and lrs[-1] > 0.1


def test_linear_inverse_sqrt_constant():
    assert lr_at(50, lr=2.0, steps=100, schedule="linear") == pytest.approx(1.0)
    assert lr_at(99, lr=1.0, steps=100, schedule="inverse_sqrt", warmup_steps=4) == pytest.approx(math.sqrt(4 / 100))
    assert lr_at(3, lr=1.0, steps=100, schedule="inverse_sqrt", warmup_steps=4) == pytest.approx(1.0)
    assert lr_at(77, lr=0.3, steps=100, schedule="constant") == 0.3
    with pytest.raises(ValueError, match="valid choices"):
        lr_at(0, lr=1.0, steps=10, schedule="exp")


def test_lion_matches_hand_computation():
    p = nn.Parameter(torch.tensor([1.0, -2.0, 0.5]))
    opt = Lion([p], lr=0.1, betas=(0.9, 0.99), weight_decay=0.5)
    m = torch.zeros(3)
    ref = p.detach().clone()
    for g in (torch.tensor([0.3, -0.1, 0.0]), torch.tensor([-0.2, -0.4, 1.0])):
        p.grad = g.clone()
        opt.step()
        ref = ref * (1 - 0.1 * 0.5) - 0.1 * torch.sign(0.9 * m + 0.1 * g)
        m = 0.99 * m + 0.01 * g
        torch.testing.assert_close(p.detach(), ref)
        torch.testing.assert_close(opt.state[p]["exp_avg"], m)
    with pytest.raises(ValueError, match="betas"):
        Lion([p], betas=(1.0, 0.9))


def test_build_optimizer_decays_matrices_only():
    model = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4))
    for name in ("adamw", "lion"):
        opt = build_optimizer(model, name, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.99))
        decay, no_decay = opt.param_groups
        assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
        assert [p.ndim for p in decay["params"]] == [2] and len(no_decay["params"]) == 3
    with pytest.raises(ValueError, match=r"valid choices: \['adamw', 'lion'\]"):
        build_optimizer(model, "sgd", lr=1e-3, weight_decay=0.0, betas=(0.9, 0.99))

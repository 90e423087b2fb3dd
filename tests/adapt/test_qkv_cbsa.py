"""CBSA with three inherited projections (CBSA Fig. 9): ``cbsa-qkv`` / ``agent-qkv`` against a loop reference,
the projections a swap copies, gradients, and bad inputs."""

import pytest
import torch

from attnzoo.adapt.student import QKV_CBSA, QKVCBSA, make_student
from attnzoo.models import create_model


def _pool(x: torch.Tensor, grid: tuple[int, int], rep_grid: tuple[int, int], prefix: int) -> torch.Tensor:
    """Adaptive 2-D average pooling of the grid tokens, one representative at a time (PyTorch's bin edges)."""
    gh, gw = grid
    rh, rw = rep_grid
    body = x[..., prefix:, :].reshape(*x.shape[:-2], gh, gw, x.shape[-1])
    reps = []
    for i in range(rh):
        y0, y1 = (i * gh) // rh, -((-(i + 1) * gh) // rh)
        for j in range(rw):
            x0, x1 = (j * gw) // rw, -((-(j + 1) * gw) // rw)
            reps.append(body[..., y0:y1, x0:x1, :].mean(dim=(-3, -2)))
    return torch.stack(reps, dim=-2)


def reference(layer: QKVCBSA, x: torch.Tensor) -> torch.Tensor:
    """The docstring's four steps, written per batch element and head with explicit softmaxes."""
    b, n, d = x.shape
    h, p = layer.heads, layer.head_dim
    qkv = x @ layer.qkv.weight.T + layer.qkv.bias
    out = torch.zeros(b, n, d, dtype=x.dtype)
    for bi in range(b):
        for hi in range(h):
            q, k, v = (qkv[bi, :, j * d + hi * p : j * d + (hi + 1) * p] for j in range(3))
            a = _pool(q, layer.grid, layer.rep_grid, layer.num_prefix_tokens)
            e = torch.exp(a @ k.T * layer.scale)
            e = e / e.sum(-1, keepdim=True)
            reps_v = e @ v
            if layer.variant == "cbsa":
                s = torch.exp((e @ q) @ (e @ k).T * layer.scale)
                reps_v = (s / s.sum(-1, keepdim=True)) @ reps_v
            br = torch.exp(q @ a.T * layer.scale)
            out[bi, :, hi * p : (hi + 1) * p] = layer.kappa[hi] * (br / br.sum(-1, keepdim=True)) @ reps_v
    return out @ layer.proj.weight.T + layer.proj.bias


@pytest.mark.parametrize("variant", sorted(QKV_CBSA.values()))
@pytest.mark.parametrize(
    "grid,rep_grid,prefix,heads",
    [((4, 4), (2, 2), 1, 2), ((3, 5), (2, 3), 1, 1), ((5, 3), (3, 2), 0, 4)],  # rep grids that do not divide the grid
)
def test_matches_the_loop_reference(variant, grid, rep_grid, prefix, heads):
    torch.manual_seed(0)
    dim = 4 * heads
    layer = QKVCBSA(dim, heads, variant=variant, grid=grid, rep_grid=rep_grid, num_prefix_tokens=prefix).double()
    with torch.no_grad():
        layer.kappa.normal_()  # a per-head kappa other than its initial 1 reaches the output
    x = torch.randn(2, prefix + grid[0] * grid[1], dim, dtype=torch.float64, requires_grad=True)
    got, want = layer(x), reference(layer, x)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    g = torch.randn_like(got)
    grads = torch.autograd.grad(got, [x, *layer.parameters()], g)
    grads_ref = torch.autograd.grad(want, [x, *layer.parameters()], g)
    for a, b in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_contraction_changes_the_output():
    torch.manual_seed(0)
    a = QKVCBSA(16, 2, variant="cbsa", grid=(4, 4), rep_grid=(2, 2), num_prefix_tokens=1)
    b = QKVCBSA(16, 2, variant="agent", grid=(4, 4), rep_grid=(2, 2), num_prefix_tokens=1)
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 17, 16)
    assert (a(x) - b(x)).abs().max() > 1e-3


def _vit(seed: int = 0):
    torch.manual_seed(seed)
    return create_model("vit_s", dim=16, depth=2, heads=2, patch_size=2, image_size=8, in_chans=1, num_classes=4)


@pytest.mark.parametrize("mechanism", sorted(QKV_CBSA))
def test_swap_inherits_qkv_and_output_projections(mechanism):
    teacher = _vit()
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    st = make_student(teacher, mechanism, {"rep_grid": [2, 2]})
    assert len(st.layers) == 2 and not st.causal
    for layer in st.layers:
        new = st.model.get_submodule(layer.name)
        old = teacher.get_submodule(layer.name)
        assert isinstance(new, QKVCBSA) and new.variant == QKV_CBSA[mechanism]
        assert new.grid == (4, 4) and new.num_prefix_tokens == 1 and new.rep_grid == (2, 2)
        assert new.scale == old.scale
        torch.testing.assert_close(new.qkv.weight, old.qkv.weight, rtol=0, atol=0)
        torch.testing.assert_close(new.qkv.bias, old.qkv.bias, rtol=0, atol=0)
        torch.testing.assert_close(new.proj.weight, old.proj.weight, rtol=0, atol=0)
        assert layer.new == [f"{layer.name}.kappa"]
        assert sorted(layer.inherited) == sorted(
            f"{layer.name}.{n}" for n in ("qkv.weight", "qkv.bias", "proj.weight", "proj.bias")
        )
    # the teacher is left as it was
    assert all(torch.equal(before[k], v) for k, v in teacher.state_dict().items())
    x = torch.randn(3, 1, 8, 8)
    assert st.model(x).shape == (3, 4)


def test_bad_inputs():
    teacher = _vit()
    with pytest.raises(ValueError, match=r"takes only the options \['num_reps', 'rep_grid'\], got \['p'\]"):
        make_student(teacher, "cbsa-qkv", {"p": 2})
    with pytest.raises(ValueError, match="variant must be one of"):
        QKVCBSA(16, 2, variant="mssa")
    with pytest.raises(ValueError, match="dim=15 must split into heads=2"):
        QKVCBSA(15, 2)
    layer = QKVCBSA(16, 2, grid=(4, 4), num_prefix_tokens=1)
    with pytest.raises(ValueError, match="takes no attention_mask"):
        layer(torch.randn(1, 17, 16), attention_mask=torch.ones(1, 17, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"x must have shape \(B, N, dim=16\), got \(1, 17, 8\)"):
        layer(torch.randn(1, 17, 8))
    tssa_vit = create_model("vit_s", dim=16, depth=1, heads=2, patch_size=2, image_size=8, in_chans=1, attention="tssa")
    with pytest.raises(ValueError, match="has not both"):
        make_student(tssa_vit, "agent-qkv")

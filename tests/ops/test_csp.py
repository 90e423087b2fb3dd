"""CSP op (CSP eqs 3-5, §3.2.2, App. B): fast gather path vs explicit permutation matrices, and properties."""

import itertools

import pytest
import torch

from attnzoo.ops.csp import csp, csp_permutations, csp_shifts, csp_source_index
from attnzoo.ops.csp.naive import shift_matrix

# (B, N, C, groups): complete sort, size-2 groups (min/max path), other divisors, pure shift, odd N, N=1
CASES = [
    (2, 6, 4, 1),
    (2, 6, 4, 3),
    (2, 6, 4, 2),
    (2, 6, 4, 6),
    (1, 1, 3, 1),
    (3, 7, 5, 1),
    (2, 7, 5, 7),
    (2, 12, 5, 4),
    (2, 10, 3, 5),
    (1, 9, 4, 3),
    (1, 15, 3, 3),
]


def _shift_variants(N, C, gen):
    yield csp_shifts(N, C)
    # arbitrary steps, incl. a shifted reference channel, negatives and steps beyond N (taken mod N)
    yield torch.randint(-2 * N, 3 * N, (C,), generator=gen)


def _distinct(shape, dtype=torch.float64):
    """Values pairwise at least 0.37 apart, so finite differences never reorder them."""
    n = 1
    for s in shape:
        n *= s
    return ((torch.randperm(n).to(dtype) - n / 2) * 0.37).view(shape)


@pytest.mark.parametrize("B,N,C,groups", CASES)
def test_fast_matches_naive_forward(B, N, C, groups):
    gen = torch.Generator().manual_seed(N * 31 + C)
    for shifts in _shift_variants(N, C, gen):
        v64 = torch.randn(B, N, C, dtype=torch.float64)
        torch.testing.assert_close(csp(v64, shifts, groups), csp(v64, shifts, groups, backend="naive"), rtol=0, atol=0)
        v32 = torch.randn(B, N, C)
        torch.testing.assert_close(
            csp(v32, shifts, groups, backend="torch"), csp(v32, shifts, groups, backend="naive"), rtol=1e-6, atol=1e-6
        )
        torch.testing.assert_close(
            csp_permutations(v64, shifts, groups),
            csp_permutations(v64, shifts, groups, backend="naive"),
            rtol=0,
            atol=0,
        )


@pytest.mark.parametrize("B,N,C,groups", CASES)
def test_fast_matches_naive_backward(B, N, C, groups):
    gen = torch.Generator().manual_seed(N * 7 + C)
    for shifts in _shift_variants(N, C, gen):
        v = torch.randn(B, N, C, dtype=torch.float64)
        g = torch.randn(B, N, C, dtype=torch.float64)
        grads = []
        for backend in ("torch", "cpu", "naive"):
            vv = v.clone().requires_grad_(True)
            (csp(vv, shifts, groups, backend=backend) * g).sum().backward()
            grads.append(vv.grad)
        torch.testing.assert_close(grads[0], grads[2], rtol=0, atol=0)
        torch.testing.assert_close(grads[1], grads[2], rtol=0, atol=0)


@pytest.mark.parametrize("B,N,C,groups", [(2, 4, 3, 1), (1, 6, 3, 3), (1, 6, 2, 2), (2, 5, 2, 5), (1, 1, 2, 1)])
@pytest.mark.parametrize("backend", ["torch", "cpu", "naive"])
def test_gradcheck(B, N, C, groups, backend):
    v = _distinct((B, N, C)).requires_grad_(True)
    shifts = csp_shifts(N, C)
    assert torch.autograd.gradcheck(lambda t: csp(t, shifts, groups, backend=backend), (v,))


def test_gradgradcheck_fast():
    v = _distinct((1, 6, 3)).requires_grad_(True)
    assert torch.autograd.gradgradcheck(lambda t: csp(t, [0, 2, 4], 2), (v,))


@pytest.mark.parametrize("N,groups", [(8, 1), (8, 4), (8, 2), (9, 3)])
def test_ties_are_broken_identically(N, groups):
    # few distinct values -> many ties in both the reference and the sorted channels
    v = torch.randint(0, 3, (2, N, 4)).double()
    shifts = [0, 1, 3, 5]
    P_fast = csp_permutations(v, shifts, groups)
    P_naive = csp_permutations(v, shifts, groups, backend="naive")
    torch.testing.assert_close(P_fast, P_naive, rtol=0, atol=0)
    g = torch.randn_like(v)
    grads = []
    for backend in ("torch", "naive"):
        vv = v.clone().requires_grad_(True)
        (csp(vv, shifts, groups, backend=backend) * g).sum().backward()
        grads.append(vv.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0)


def test_stable_tie_rule_on_hand_example():
    # one group of size 2, equal reference values: stable sort keeps slot 0 as the smaller one
    v = torch.tensor([[[1.0, 5.0], [1.0, 2.0]]])
    idx = csp_source_index(v, [0, 0], 1)
    assert idx[0, :, 1].tolist() == [1, 0]
    assert csp(v, [0, 0], 1)[0, :, 1].tolist() == [2.0, 5.0]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_is_exact_permutation(dtype):
    v = torch.randn(2, 8, 4).to(dtype)
    y = csp(v, [0, 1, 2, 3], 2)
    assert y.dtype == dtype
    torch.testing.assert_close(y.float(), csp(v.float(), [0, 1, 2, 3], 2), rtol=0, atol=0)


def test_hand_computed_example():
    # N=4, C=2, shifts (0, 1), groups of size 2.
    # channel 1 = [10, 40, 30, 20] -> S_1 -> [20, 10, 40, 30];
    # group 0: reference [3, 1] is descending -> [20, 10]; group 1: reference [2, 4] ascending -> [30, 40].
    v = torch.tensor([[[3.0, 10.0], [1.0, 40.0], [2.0, 30.0], [4.0, 20.0]]])
    for backend in ("torch", "naive"):
        y = csp(v, [0, 1], 2, backend=backend)
        assert y[0, :, 0].tolist() == [3.0, 1.0, 2.0, 4.0]
        assert y[0, :, 1].tolist() == [20.0, 10.0, 30.0, 40.0]


def test_shift_matrix_matches_eq3():
    # S_J v moves entry i to i + J (mod N): rows [0, J) take the last J entries
    v = torch.arange(5.0)
    assert (shift_matrix(5, 2) @ v).tolist() == [3.0, 4.0, 0.0, 1.0, 2.0]
    assert (shift_matrix(5, 7) @ v).tolist() == [3.0, 4.0, 0.0, 1.0, 2.0]
    assert torch.equal(shift_matrix(5, 0), torch.eye(5))


@pytest.mark.parametrize("N,groups", [(6, 1), (6, 3), (8, 4), (9, 3), (5, 5), (1, 1)])
@pytest.mark.parametrize("backend", ["torch", "naive"])
def test_implied_maps_are_permutations(N, groups, backend):
    """Identity of eq 4-5: every P_c is a 0/1 doubly stochastic matrix, P_c = T_c S_{J_c}, csp = ||_c P_c v_c."""
    B, C = 2, 4
    v = torch.randn(B, N, C, dtype=torch.float64)
    shifts = [0, 1, N + 2, -1]
    P = csp_permutations(v, shifts, groups, backend=backend)
    assert P.shape == (B, C, N, N)
    assert bool(((P == 0) | (P == 1)).all())
    ones = torch.ones(B, C, N, dtype=P.dtype)
    torch.testing.assert_close(P.sum(-1), ones, rtol=0, atol=0)
    torch.testing.assert_close(P.sum(-2), ones, rtol=0, atol=0)
    torch.testing.assert_close(torch.einsum("bcij,bjc->bic", P, v), csp(v, shifts, groups), rtol=0, atol=0)
    # channel 0 is only shifted (P_1 = I for a zero step)
    torch.testing.assert_close(P[:, 0], torch.eye(N, dtype=P.dtype).expand(B, N, N), rtol=0, atol=0)
    # T_c = P_c S_{J_c}^T is block diagonal with groups of size N / groups
    G = N // groups
    block = torch.block_diag(*[torch.ones(G, G, dtype=P.dtype)] * groups)
    for c, j in enumerate(shifts):
        T = P[:, c] @ shift_matrix(N, j, dtype=P.dtype).T
        assert bool((T * (1 - block) == 0).all())


@pytest.mark.parametrize("G", [2, 3, 4, 5])
def test_group_sort_is_brute_force_optimal_transport(G):
    """App. B: within each group, T_c^(k) maximises <v_1 v_c^T, T> over all G x G permutation matrices."""
    K, C, B = 2, 4, 2
    N = K * G
    shifts = [0, 1, 2, G + 1]
    v = torch.randn(B, N, C, dtype=torch.float64)
    y = csp(v, shifts, K)
    u = torch.stack([torch.roll(v[:, :, c], shifts[c], dims=1) for c in range(C)], dim=-1)  # S_{J_c} v_c
    perms = list(itertools.permutations(range(G)))
    for b in range(B):
        for k in range(K):
            sl = slice(k * G, (k + 1) * G)
            ref = u[b, sl, 0]
            for c in range(C):
                uc = u[b, sl, c]
                # <ref uc^T, T_sigma> = sum_i ref[i] * uc[sigma(i)]
                objectives = torch.stack([(ref * uc[list(s)]).sum() for s in perms])
                best = int(objectives.argmax())
                ours = (ref * y[b, sl, c]).sum()
                torch.testing.assert_close(ours, objectives.max(), rtol=1e-12, atol=1e-12)
                # continuous random values: the optimum is unique, so the permutation itself agrees
                assert y[b, sl, c].tolist() == uc[list(perms[best])].tolist()


def test_complete_sorting_follows_reference_order():
    """groups=1: each channel keeps its values, is ordered like channel 0, and shifts of c >= 1 are redundant."""
    v = torch.randn(3, 9, 5, dtype=torch.float64)
    y = csp(v, [0, 0, 0, 0, 0], 1)
    torch.testing.assert_close(y.sort(dim=1).values, v.sort(dim=1).values, rtol=0, atol=0)
    ref_order = v[:, :, 0].argsort(dim=1)
    for c in range(5):
        assert torch.equal(y[:, :, c].argsort(dim=1), ref_order)
    torch.testing.assert_close(csp(v, [0, 3, 1, 8, 4], 1), y, rtol=0, atol=0)


def test_complete_sort_without_shift_is_permutation_equivariant():
    v = torch.randn(2, 7, 4, dtype=torch.float64)
    pi = torch.randperm(7)
    torch.testing.assert_close(csp(v[:, pi], [0] * 4, 1), csp(v, [0] * 4, 1)[:, pi], rtol=0, atol=0)


def test_not_token_permutation_equivariant():
    # pure shift (groups = N): channel 1 = [10, 20, 30] -> [30, 10, 20]; swapping tokens 0 and 1 first
    # gives [20, 10, 30] -> [30, 20, 10], which is not the swap [10, 30, 20] of the original output.
    v = torch.tensor([[[1.0, 10.0], [2.0, 20.0], [3.0, 30.0]]])
    pi = torch.tensor([1, 0, 2])
    out_perm_first = csp(v[:, pi], [0, 1], 3)
    perm_of_out = csp(v, [0, 1], 3)[:, pi]
    assert out_perm_first[0, :, 1].tolist() == [30.0, 20.0, 10.0]
    assert perm_of_out[0, :, 1].tolist() == [10.0, 30.0, 20.0]
    # groups of size 2 without shifts: moving a token across a group boundary changes which values meet
    w = torch.tensor([[[1.0, 4.0], [2.0, 3.0], [3.0, 2.0], [4.0, 1.0]]])
    pi = torch.tensor([0, 2, 1, 3])
    assert not torch.equal(csp(w[:, pi], [0, 0], 2), csp(w, [0, 0], 2)[:, pi])


def test_source_index_reproduces_output():
    v = torch.randn(2, 12, 5)
    shifts = csp_shifts(12, 5)
    idx = csp_source_index(v, shifts, 4)
    assert idx.dtype == torch.long and idx.shape == (2, 12, 5)
    torch.testing.assert_close(v.gather(1, idx), csp(v, shifts, 4), rtol=0, atol=0)


# ---- shift schedules (§3.2.2), values worked out by hand from the formulas -------------------------


def test_linear_schedule_hand_values():
    # J_c = (c-1) * ceil(N/C) mod N, 1-based c
    assert csp_shifts(16, 4).tolist() == [0, 4, 8, 12]  # ceil(16/4) = 4
    assert csp_shifts(10, 4).tolist() == [0, 3, 6, 9]  # ceil(10/4) = 3
    assert csp_shifts(6, 4).tolist() == [0, 2, 4, 0]  # ceil(6/4) = 2, 6 mod 6 = 0
    assert csp_shifts(5, 8).tolist() == [0, 1, 2, 3, 4, 0, 1, 2]  # C > N: (c-1) mod N (Table 1)
    assert csp_shifts(1, 3).tolist() == [0, 0, 0]
    assert csp_shifts(7, 3, layer=1, num_layers=2).tolist() == [0, 3, 6]  # linear ignores the layer


def test_power_schedule_hand_values():
    # channel g = 1..LC over all layers is shifted by round(J^(g-1)) - 1 with the real J = N^(1/(LC-1))
    # N=1000, C=2, L=2: LC=4, J=10 (the float root is 9.999...; the last shift must still be N-1)
    assert csp_shifts(1000, 2, "power", layer=0, num_layers=2).tolist() == [0, 9]
    assert csp_shifts(1000, 2, "power", layer=1, num_layers=2).tolist() == [99, 999]
    # N=64, C=4, L=1: J = 4 -> 4^0-1, 4^1-1, 4^2-1, 4^3-1
    assert csp_shifts(64, 4, "power").tolist() == [0, 3, 15, 63]
    # N=100, C=3, L=2: LC=6, J = 100^(1/5) = 2.512: J^(g-1) = 1, 2.51, 6.31, 15.85, 39.81, 100
    # (the literal floor(J) = 2 would give 0, 1, 3, 7, 15, 31: never past N/3)
    assert csp_shifts(100, 3, "power", layer=0, num_layers=2).tolist() == [0, 2, 5]
    assert csp_shifts(100, 3, "power", layer=1, num_layers=2).tolist() == [15, 39, 99]
    # base override keeps the literal integer formula: N=10, J=3 -> 0, 2, 8, (27-1) mod 10 = 6
    assert csp_shifts(10, 4, "power", base=3).tolist() == [0, 2, 8, 6]
    assert csp_shifts(64, 4, "power", base=4).tolist() == csp_shifts(64, 4, "power").tolist()
    # a single channel overall has no reference to differ from
    assert csp_shifts(50, 1, "power").tolist() == [0]
    assert csp_shifts(9, 3, "none").tolist() == [0, 0, 0]


def test_shift_schedule_range_and_dtype():
    for N, C, sched in [(1, 4, "linear"), (37, 5, "linear"), (4096, 8, "power"), (3, 9, "power")]:
        s = csp_shifts(N, C, sched, layer=0, num_layers=3)
        assert s.dtype == torch.long and s.shape == (C,)
        assert bool(((s >= 0) & (s < N)).all())
        assert int(s[0]) == 0


def test_power_schedule_spreads_over_a_long_sequence():
    """Path-X (N=16384) with L=4 layers of C=128 channels: the literal floor(N^(1/511)) = 1 made every shift 0."""
    N, L, C = 16384, 4, 128
    s = torch.cat([csp_shifts(N, C, "power", layer=i, num_layers=L) for i in range(L)])
    assert s.shape == (L * C,)
    assert bool(((s >= 0) & (s < N)).all())
    assert int(s[0]) == 0 and int(s[-1]) == N - 1
    assert bool((s[1:] >= s[:-1]).all())  # non-decreasing over g = 1..LC
    assert len(set(s.tolist())) >= 300  # 355, as many as the authors' ceil(N^(g/LC))
    assert int(csp_shifts(N, C, "power", layer=L - 1, num_layers=L).max()) >= N // 2
    # geometric: the middle channel's shift is about sqrt(N) (J^((LC-1)/2) = N^(1/2) = 128)
    assert abs(int(s[(L * C - 1) // 2]) - 128) <= 2
    # the literal formula with its J = 1 is still there for whoever asks for it
    assert csp_shifts(N, C, "power", layer=1, num_layers=L, base=1).tolist() == [0] * C


@pytest.mark.parametrize("N, C, L", [(1, 3, 2), (3, 9, 3), (7, 2, 1), (50, 5, 4), (4096, 8, 3), (16384, 64, 6)])
def test_power_schedule_small_and_odd_cases(N, C, L):
    s = torch.cat([csp_shifts(N, C, "power", layer=i, num_layers=L) for i in range(L)])
    assert bool(((s >= 0) & (s < N)).all()) and bool((s[1:] >= s[:-1]).all())
    assert int(s[0]) == 0 and int(s[-1]) == N - 1
    # as many distinct shifts as channels while the sequence is long enough to hold them
    if N >= 2 ** (L * C):
        assert len(set(s.tolist())) == L * C


def test_shift_schedule_errors():
    with pytest.raises(ValueError, match=r"schedule='cosine'.*\['linear', 'power', 'none'\]"):
        csp_shifts(8, 4, "cosine")
    with pytest.raises(ValueError, match=r"layer must be an integer in \[0, num_layers=2\), got 2"):
        csp_shifts(8, 4, "power", layer=2, num_layers=2)
    with pytest.raises(ValueError, match="N must be a positive integer, got 0"):
        csp_shifts(0, 4)
    with pytest.raises(ValueError, match="base=2 only applies to schedule='power'"):
        csp_shifts(8, 4, "linear", base=2)


# ---- input validation ---------------------------------------------------------------------------


def test_groups_must_divide_n():
    v = torch.randn(1, 6, 3)
    with pytest.raises(ValueError, match=r"N=6 .*groups=4.*\[1, 2, 3, 6\]"):
        csp(v, [0, 1, 2], 4)
    with pytest.raises(ValueError, match=r"N=6 .*groups=4.*\[1, 2, 3, 6\]"):
        csp_permutations(v, [0, 1, 2], 4)
    with pytest.raises(ValueError, match="groups must be a positive integer, got 0"):
        csp(v, [0, 1, 2], 0)


def test_bad_inputs():
    v = torch.randn(1, 6, 3)
    with pytest.raises(ValueError, match=r"backend='cuda'.*\['auto', 'naive', 'torch', 'cpu'\]"):
        csp(v, [0, 1, 2], 1, backend="cuda")
    with pytest.raises(ValueError, match=r"C=3 steps.*got 2"):
        csp(v, [0, 1], 1)
    with pytest.raises(ValueError, match=r"shape \(C,\) = \(3,\), got shape \(2, 3\)"):
        csp(v, torch.zeros(2, 3, dtype=torch.long), 1)
    with pytest.raises(TypeError, match="shifts must hold integers.*float32"):
        csp(v, torch.zeros(3), 1)
    with pytest.raises(TypeError, match="shifts must hold integers"):
        csp(v, [0, 1.5, 2], 1)
    with pytest.raises(TypeError, match="length-C sequence"):
        csp(v, 3, 1)
    with pytest.raises(ValueError, match=r"v must have shape \(B, N, C\)"):
        csp(torch.randn(6, 3), [0, 1, 2], 1)
    with pytest.raises(TypeError, match="floating-point"):
        csp(torch.ones(1, 6, 3, dtype=torch.long), [0, 1, 2], 1)


# ---------------------------------------------------------------- small-group fast path (ops/csp/small.py)


@pytest.fixture(params=["gather_shift", "loop_shift"])
def shift_form(request, monkeypatch):
    """Both forms of the circular shift: one gather (short N, non-CPU) and per-channel slices (CPU, long N)."""
    from attnzoo.ops.csp import small

    monkeypatch.setattr(small, "_LOOP_SHIFT_MIN_N", 10**9 if request.param == "gather_shift" else 1)
    return request.param


def _no_general_path(monkeypatch):
    from attnzoo.ops.csp import parallel as gather

    def forbidden(*args, **kwargs):
        raise AssertionError("groups of 1, 2, 3, 4 or 8 tokens must take the small-group path")

    monkeypatch.setattr(gather, "csp_source_index", forbidden)


@pytest.mark.parametrize("backend", ["torch", "cpu"])
@pytest.mark.parametrize("G", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("B,K,C", [(1, 1, 1), (2, 3, 5), (3, 5, 4), (2, 7, 37)])
def test_small_groups_match_naive_exactly_with_ties(G, B, K, C, shift_form, backend, monkeypatch):
    N = G * K
    gen = torch.Generator().manual_seed(G * 100 + N + C)
    # few distinct values (and signed zeros): many ties, decided by the stable-sort rule of the reference
    v = torch.randint(-2, 3, (B, N, C), generator=gen).double() * 0.5
    signs = torch.randint(0, 2, ((v == 0).sum().item(),), generator=gen)
    v[v == 0] = torch.tensor([0.0, -0.0], dtype=torch.float64)[signs]
    shifts = torch.randint(-2 * N, 3 * N, (C,), generator=gen)
    ref_v = v.clone().requires_grad_(True)
    ref = csp(ref_v, shifts, K, backend="naive")
    # the naive matmul turns -0.0 into 0.0; the general path's gather moves the very elements
    general = v.gather(1, csp_source_index(v, shifts, K))
    _no_general_path(monkeypatch)
    vv = v.clone().requires_grad_(True)
    out = csp(vv, shifts, K, backend=backend)
    assert torch.equal(out, ref) and torch.equal(out.signbit(), general.signbit())
    w = torch.randn(B, N, C, dtype=torch.float64, generator=gen)
    (g_ref,) = torch.autograd.grad((ref * w).sum(), ref_v)
    (g_out,) = torch.autograd.grad((out * w).sum(), vv)
    assert torch.equal(g_out, g_ref)


@pytest.mark.parametrize("backend", ["torch", "cpu"])
@pytest.mark.parametrize("schedule", ["linear", "none"])
@pytest.mark.parametrize("G", [1, 2, 4, 8])
def test_small_groups_long_sequence_matches_general_path(G, schedule, backend):
    # default dispatch at N >= 512 on CPU: the per-channel slice shift; the general gather/sort path is the reference
    from attnzoo.ops.csp.parallel import _TokenPermute
    from attnzoo.ops.csp.parallel import csp_source_index as general_index

    B, N, C = 2, 1024, 6
    v = torch.randint(-3, 4, (B, N, C)).float().requires_grad_(True)
    shifts = csp_shifts(N, C, schedule)
    ref = _TokenPermute.apply(v, general_index(v, shifts, N // G))
    out = csp(v, shifts, N // G, backend=backend)
    assert torch.equal(out, ref)
    w = torch.randn(B, N, C)
    assert torch.equal(torch.autograd.grad((out * w).sum(), v)[0], torch.autograd.grad((ref * w).sum(), v)[0])


@pytest.mark.parametrize("G", [3, 4, 8])
def test_sorting_networks_sort_every_zero_one_input(G):
    # 0-1 principle: a comparator network sorts every input iff it sorts every 0/1 input
    from attnzoo.ops.csp.small import NETWORKS

    for bits in itertools.product([0, 1], repeat=G):
        x = list(bits)
        for i, j in NETWORKS[G]:
            assert i < j
            if x[i] > x[j]:
                x[i], x[j] = x[j], x[i]
        assert x == sorted(bits), (bits, x)


@pytest.mark.parametrize("backend", ["torch", "cpu"])
@pytest.mark.parametrize("G", [2, 4])
def test_small_groups_gradgradcheck(G, shift_form, backend):
    v = _distinct((1, 2 * G, 3)).requires_grad_(True)
    assert torch.autograd.gradgradcheck(lambda t: csp(t, [0, 1, 3], 2, backend=backend), (v,))


@pytest.mark.parametrize("backend", ["torch", "cpu"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_small_groups_low_precision_bits(dtype, shift_form, backend):
    v = torch.randn(2, 16, 5).to(dtype)
    for K in (8, 4, 2):  # G = 2, 4, 8
        got = csp(v, [0, 1, 2, 3, 4], K, backend=backend)
        assert torch.equal(got, csp(v.double(), [0, 1, 2, 3, 4], K, backend="naive").to(dtype))


# ---------------------------------------------------------------- fused CPU kernel for groups of two (ops/csp/cpu.cpp)


def test_auto_takes_the_fused_kernel_for_pairs_and_falls_back_without_it(monkeypatch):
    from attnzoo.ops import _cpu_kernels
    from attnzoo.ops._dispatch import resolve_backend
    from attnzoo.ops.csp import CSP

    v = torch.randn(2, 8, 3)
    assert resolve_backend(CSP, "auto", v) == "cpu"
    calls = []
    real = _cpu_kernels.cpu_kernels()
    monkeypatch.setattr(_cpu_kernels, "cpu_kernels", lambda: calls.append(1) or real)
    csp(v, [0, 1, 2], 4)
    assert calls, "groups of two on CPU must reach the fused kernels"
    monkeypatch.setattr(_cpu_kernels, "cpu_kernels", lambda: None)
    monkeypatch.setattr(_cpu_kernels, "cpu_kernels_error", lambda: "no compiler")
    assert resolve_backend(CSP, "auto", v) == "torch"
    torch.testing.assert_close(csp(v, [0, 1, 2], 4), csp(v, [0, 1, 2], 4, backend="naive"), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="backend='cpu' needs attnzoo's CPU kernels: no compiler"):
        csp(v, [0, 1, 2], 4, backend="cpu")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])  # float32: the AVX-512 path where the CPU has it
@pytest.mark.parametrize(
    "B,N,C",
    # C = 80, 128, 144: several 16-channel tiles per task, full tiles (streamed stores) and a short last group
    [(1, 2, 1), (2, 34, 17), (1, 130, 48), (3, 64, 40), (1, 1030, 35), (1, 66, 80), (2, 40, 128), (1, 98, 144)],
)
def test_fused_pairs_kernel_matches_reference_forward_and_backward(B, N, C, dtype):
    # C not a multiple of the kernel's 16-channel tile, a shifted reference channel, shifts that wrap a pair,
    # N beyond one 512-token block of the portable path
    gen = torch.Generator().manual_seed(B * 1000 + N + C)
    v = (torch.randint(-3, 4, (B, N, C), generator=gen).double() * 0.25).to(dtype)  # ties
    shifts = torch.randint(-3 * N, 3 * N, (C,), generator=gen)
    shifts[0] = N - 1  # the reference's first pair wraps around the end
    ref_v, vv = v.clone().requires_grad_(True), v.clone().requires_grad_(True)
    ref = csp(ref_v, shifts, N // 2, backend="naive")
    out = csp(vv, shifts, N // 2, backend="cpu")
    assert torch.equal(out, ref)
    w = torch.randn(B, N, C, dtype=torch.float64, generator=gen).to(dtype)
    assert torch.equal(torch.autograd.grad((out * w).sum(), vv)[0], torch.autograd.grad((ref * w).sum(), ref_v)[0])


def test_fused_pairs_kernel_rejects_bad_arguments():
    from attnzoo.ops import _cpu_kernels

    k = _cpu_kernels.cpu_kernels()
    v = torch.randn(1, 4, 3)
    with pytest.raises(RuntimeError, match=r"shifts must lie in \[0, N\) = \[0, 4\), got 4 at channel 1"):
        k.csp_pairs(v, torch.tensor([0, 4, 1]))
    with pytest.raises(RuntimeError, match="even N, got N = 5"):
        k.csp_pairs(torch.randn(1, 5, 3), torch.tensor([0, 1, 2]))
    with pytest.raises(RuntimeError, match=r"swap must be the forward's contiguous int16 \(B, ceil\(C / 16\), N / 2\)"):
        k.csp_pairs_bwd(v, torch.tensor([0, 1, 2]), torch.zeros(1, 2, 3, dtype=torch.bool))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])  # AVX-512 and portable kernels
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_fused_pairs_kernel_finds_nonfinite_values_while_moving_them(bad, dtype):
    # the 'cpu' backend checks v inside its kernel (no pass of its own): same error as the other backends,
    # for a value in any sample, tile (C = 35: a partial last tile) and position
    from attnzoo._checks import NonFiniteError

    B, N, C = 3, 66, 35
    for b, n, c in [(0, 0, 0), (2, 65, 34), (1, 31, 17)]:
        v = torch.randn(B, N, C).to(dtype)
        shifts = torch.arange(C) * 5
        assert torch.isfinite(csp(v, shifts, N // 2, backend="cpu")).all()
        v[b, n, c] = bad
        for backend in ("cpu", "torch"):
            with pytest.raises(NonFiniteError, match=r"csp: v .*(NaN|Inf)"):
                csp(v, shifts, N // 2, backend=backend)
    # groups other than pairs take the PyTorch path behind 'cpu': checked before it runs
    with pytest.raises(NonFiniteError, match=r"csp: v "):
        csp(v, shifts, N // 3, backend="cpu")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fused_pairs_double_backward_unpacks_the_swap_bits_of_every_tile(dtype):
    # create_graph=True takes the differentiable path, fed by the kernel's packed swaps (C = 35: three words).
    # g = P^T w is linear in w; its derivative along r is P r, so both must match the reference.
    B, N, C = 2, 10, 35
    gen = torch.Generator().manual_seed(5)
    v = torch.randn(B, N, C, generator=gen, dtype=torch.float64).to(dtype)
    shifts = torch.randint(0, N, (C,), generator=gen)
    r = torch.randn(B, N, C, generator=gen, dtype=torch.float64).to(dtype)
    results = []
    for backend in ("cpu", "naive"):
        vv = v.clone().requires_grad_(True)
        w = torch.randn(B, N, C, generator=torch.Generator().manual_seed(6), dtype=torch.float64).to(dtype)
        w.requires_grad_(True)
        (g,) = torch.autograd.grad((csp(vv, shifts, N // 2, backend=backend) * w).sum(), vv, create_graph=True)
        (gw,) = torch.autograd.grad((g * r).sum(), w)
        results.append((g.detach(), gw))
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])

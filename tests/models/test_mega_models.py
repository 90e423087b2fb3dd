"""MEGA, MEGA-chunk and MEGA using CSP on the LRA tasks: shapes at each task's length, gradients, parameter counts
against MEGA's module shapes (facebookresearch/mega) and CSP Table 7's settings."""

import pytest
import torch

from attnzoo.models.registry import count_parameters, create_model, get_config
from attnzoo.models.zoo import MEGA_CHUNK

pytestmark = pytest.mark.usefixtures("one_thread")  # small tensors on a shared 2-core machine

TASKS = ["listops", "text", "retrieval", "image", "pathfinder"]
NAMES = [f"{kind}_lra_{task}" for task in TASKS for kind in ("mega", "mega_chunk", "mega_csp")]


def _inputs(cfg, n, device=None):
    x = torch.randint(
        0,
        cfg.vocab_size,
        (2, n),
        generator=None if device == "meta" else torch.Generator().manual_seed(0),
        device=device,
    )
    return (x, x.flip(1)) if cfg.dual else (x,)


@pytest.mark.parametrize("name", NAMES)
def test_forward_at_the_task_length(name):
    # the task's full length on the meta device (shapes only: a real 4000-token pass costs seconds per model)
    cfg = get_config(name)
    m = create_model(name, device="meta").eval()
    y = m(*_inputs(cfg, cfg.max_len, device="meta"))
    assert y.shape == (2, cfg.num_classes)


@pytest.mark.parametrize("name", NAMES)
def test_short_sequences_train_every_parameter(name):
    cfg = get_config(name)
    n = 48
    opts = dict(cfg.attention_options)
    if opts.get("csp_groups"):  # keep Table 7's group size (N / K tokens) on the short sequence
        opts["csp_groups"] = max(1, n * opts["csp_groups"] // cfg.max_len)
    torch.manual_seed(0)
    m = create_model(name, max_len=n, attention_options=opts).train()
    y = m(*_inputs(cfg, n))
    assert y.shape == (2, cfg.num_classes) and torch.isfinite(y).all()
    y.logsumexp(-1).sum().backward()
    silent = [k for k, p in m.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not silent


def _norm(kind, D):
    return 1 if kind == "scalenorm" else 2 * D


def _expected(name):
    # embedding; per layer MEGA's MovingAverageGatedAttention + NormalizedFeedForwardNetwork shapes; final norm
    # (pre-norm only); the head Linear(feat, E) -> Linear(E, classes)
    cfg = get_config(name)
    o = cfg.attention_options
    D, E, h, F = cfg.dim, o["hdim"], o["ndim"], cfg.mlp_dim
    csp = o["attention"] == "csp"
    Z = 0 if csp else o["zdim"]
    R = o["chunk_size"] or cfg.max_len if not csp else 0
    layer = _norm(cfg.norm_layer, D) + 8 * D * h + D  # norm, EMA (delta, alpha, beta, gamma (2D, h); omega)
    layer += D * E + E + D * (Z + E + 2 * D) + Z + E + 2 * D + E * D + D  # v_proj, mx_proj, h_proj
    layer += 0 if csp else 4 * Z + 2 * R - 1  # q/k offsets and scales, relative bias
    layer += _norm(cfg.norm_layer, D) + D * F + F + F * D + D  # the normalised FFN
    feat = 4 * D if cfg.dual else D
    head = feat * cfg.head_dim + cfg.head_dim + cfg.head_dim * cfg.num_classes + cfg.num_classes
    final = _norm(cfg.norm_layer, D) if cfg.final_norm else 0
    return cfg.vocab_size * D + cfg.depth * layer + final + head


@pytest.mark.parametrize("name", NAMES)
def test_parameter_counts_follow_the_configurations(name):
    assert count_parameters(name) == _expected(name)


def test_configurations_follow_mega_and_csp_table_7():
    # MEGA Table 8 (App. D.2: layers, D, z, v = d_FFN, function, norm, pre-norm, dropout; h = 16), MEGA §4.1
    # (Mega-chunk's c = 128 on every task but Path-X) and CSP Table 7 (K, shifts, hidden, dropout)
    assert MEGA_CHUNK == 128
    want = {
        "listops": (6, 80, 64, 160, "softmax", "layernorm", "post", 0.1, 1, "none", 160, 0.1),
        "text": (4, 128, 64, 256, "softmax", "scalenorm", "post", 0.1, 1, "none", 256, 0.1),
        "retrieval": (6, 128, 64, 256, "softmax", "scalenorm", "post", 0.1, 1, "none", 256, 0.1),
        "image": (8, 160, 96, 320, "laplace", "batchnorm", "pre", 0.0, None, "linear", 1024, 0.0),
        "pathfinder": (6, 128, 64, 256, "laplace", "batchnorm", "pre", 0.0, 512, "linear", 256, 0.1),
    }
    for task, (depth, D, Z, E, fn, norm, pre, drop, K, shifts, csp_hidden, csp_drop) in want.items():
        mega, chunk, csp = (get_config(f"{k}_lra_{task}") for k in ("mega", "mega_chunk", "mega_csp"))
        for cfg in (mega, chunk, csp):
            assert (cfg.depth, cfg.dim, cfg.norm_layer, cfg.norm, cfg.pool) == (depth, D, norm, pre, "mean")
        for cfg in (mega, chunk):
            assert (cfg.mlp_dim, cfg.dropout) == (E, drop)
        assert mega.attention_options == dict(attention=fn, zdim=Z, ndim=16, chunk_size=None, hdim=E)
        assert chunk.attention_options == dict(attention=fn, zdim=Z, ndim=16, chunk_size=MEGA_CHUNK, hdim=E)
        o = csp.attention_options
        assert (o["csp_groups"], o["shift_schedule"], o["hdim"], csp.mlp_dim, csp.dropout) == (
            K,
            shifts,
            csp_hidden,
            csp_hidden,
            csp_drop,
        )


def test_the_block_hands_mega_the_residual_stream():
    from attnzoo.layers import build_attention
    from attnzoo.models.blocks import Block

    torch.manual_seed(0)
    mixer = build_attention("mega", 16, 1, max_len=8, prenorm=True).double().eval()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    blk = Block(16, mixer, hidden=24, act="silu", norm="pre", norm_layer="scalenorm").double().eval()
    assert isinstance(blk.norm1, torch.nn.Identity)  # MEGA's own norm stands in for it
    y = mixer(x)
    torch.testing.assert_close(blk(x), y + blk.ffn(blk.norm2(y)), rtol=1e-13, atol=1e-13)
    scaled = Block(16, mixer, hidden=24, act="silu", norm="pre", layerscale=0.5).double().eval()
    scaled.ffn.load_state_dict(blk.ffn.state_dict())
    z = x + 0.5 * (y - x)  # LayerScale scales the layer's update
    want = z + 0.5 * scaled.ffn(scaled.norm2(z))  # and the FFN branch, as in every block
    torch.testing.assert_close(scaled(x), want, rtol=1e-13, atol=1e-13)
    with pytest.raises(ValueError, match="residual=False cannot remove it"):
        Block(16, mixer, residual=False)


def test_norm_layer_is_checked():
    with pytest.raises(ValueError, match=r"norm_layer='rmsnorm' is not supported; valid choices: \['layernorm'"):
        get_config("mega_lra_text", norm_layer="rmsnorm")


def _mega_lm(chunk_size):
    opts = dict(attention="laplace", zdim=6, hdim=10, ndim=3, chunk_size=chunk_size)
    over = dict(vocab_size=23, block_size=12, dim=8, heads=1, depth=2, mlp_dim=16, attention_options=opts)
    torch.manual_seed(0)
    return create_model("mega_lm", **over, dtype=torch.float64).eval()


def test_mega_lm_follows_mega_table_9():
    # MEGA's enwik8 decoder: 12 layers, width 512, z = 128, v = FFN = 1024, h = 16, chunk 2048; the paper counts 39M
    cfg = get_config("mega_lm")
    assert (cfg.depth, cfg.dim, cfg.mlp_dim, cfg.dropout, cfg.vocab_size) == (12, 512, 1024, 0.1, 256)
    assert cfg.attention_options == dict(attention="softmax", zdim=128, hdim=1024, ndim=16, chunk_size=2048)
    assert 38.5e6 < count_parameters("mega_lm") < 39.5e6


@pytest.mark.parametrize("chunk_size", [None, 4])
def test_mega_lm_is_causal_and_decodes_as_its_forward(chunk_size):
    model = _mega_lm(chunk_size)
    ids = torch.randint(0, 23, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(ids)
        later = ids.clone()
        later[:, 6:] = (later[:, 6:] + 5) % 23
        torch.testing.assert_close(model(later)[:, :6], logits[:, :6], rtol=0, atol=0)  # no future token read
        pre_logits, pre_state = model.prefill(ids[:, :5])  # generate's cache starts from the prompt's parallel pass
        torch.testing.assert_close(pre_logits, logits[:, :5], rtol=1e-12, atol=1e-12)
        state, steps = model.init_state(2), []
        for t in range(11):
            out, state = model.step(ids[:, t], state)
            steps.append(out)
        torch.testing.assert_close(torch.stack(steps, 1), logits, rtol=1e-10, atol=1e-10)
        after, _ = model.step(ids[:, 5], pre_state)
        torch.testing.assert_close(after, logits[:, 5], rtol=1e-10, atol=1e-10)
        cached = model.generate(ids[:, :5], 6, temperature=0, use_cache=True)
        replayed = model.generate(ids[:, :5], 6, temperature=0, use_cache=False)
    assert torch.equal(cached, replayed)

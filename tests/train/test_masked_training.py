"""Training with masks: the padded LRA tasks give each example what it gets alone, the mask reaches every
layer, and a packed language-model batch's loss equals its documents' losses computed alone; resume stays exact."""

import csv
import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attnzoo.data import lra
from attnzoo.data.datasets import IGNORE_INDEX, ArrayDataset, PackedWindowDataset, WindowDataset
from attnzoo.data.tasks import Task, build_task, pack_task
from attnzoo.models import CausalLMConfig, SequenceClassifierConfig
from attnzoo.models.language import CausalLM
from attnzoo.models.sequence import SequenceClassifier
from attnzoo.train.config import ConfigError, load_config, parse_overrides
from attnzoo.train.objectives import MetricAccumulator, compute_loss
from attnzoo.train.trainer import evaluate, train

sys.path.insert(0, str(Path(__file__).parent))
from tiny_models import tiny_factory  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


# ---- the pad id is never a real token ------------------------------------------------------------------------
def test_pad_id_is_never_a_real_token():
    enc = lra.encode_bytes(b"\x00a\x00\xff", 7)  # byte 0 is real text here: it must not read as padding
    assert enc.tolist() == [1, 98, 1, 256, 0, 0, 0]
    docs = [np.zeros(64, np.uint8), np.full(64, 7, np.uint8)]  # all-zero bytes, the worst case
    rng = np.random.default_rng(0)
    for _ in range(20):
        (a, b), _ = lra.retrieval_sample(rng, docs, 16)
        assert a.min() >= 1 and b.min() >= 1
    tokens, _ = lra.listops_sample(np.random.default_rng(1), 5, 60)
    assert min(tokens) >= 1 and lra.LISTOPS_TOKENS[lra.PAD] == "<pad>"
    t = build_task("lra_listops", n_train=4, n_val=2, min_len=5, max_len=30)
    assert t.info["pad_id"] == lra.PAD == 0 and t.info["mask_padding"] is True
    t = build_task("lra_text", seq_len=512, n_train=16, n_val=2)
    inputs, _ = t.train.get_batch(np.arange(16))
    (ids,), (mask,) = inputs, t.model_args(inputs)[1].values()
    # reviews are written from the first byte on and padded after their end: the mask is a prefix of each row
    assert (ids[:, 0] != 0).all() and (~mask).any() and torch.equal(mask, mask.cummin(1).values)


# ---- LRA classifiers: a padded batch equals each example alone ----------------------------------------------------
def _classifier(attention: str, pool: str, dual: bool = False, vocab: int = lra.LISTOPS_VOCAB, max_len: int = 30):
    cfg = SequenceClassifierConfig(
        vocab_size=vocab, max_len=max_len, num_classes=10, dim=12, depth=2, heads=3, attention=attention, pool=pool,
        dual=dual,
    )  # fmt: skip
    torch.manual_seed(0)
    return SequenceClassifier(cfg).double().eval()


@pytest.mark.parametrize("attention", ["softmax", "tssa", "fastmax", "mssa", "mega", "csp", "cbsa", "xca", "linear"])
@pytest.mark.parametrize("pool", ["mean", "cls"])
def test_padded_listops_batch_gives_each_example_alone(attention, pool):
    task = build_task("lra_listops", n_train=6, n_val=2, min_len=5, max_len=30, seed=2)
    inputs, _ = task.train.get_batch(np.arange(6))
    lengths = (inputs[0] != 0).sum(1).tolist()
    assert len(set(lengths)) > 1 and max(lengths) < 30  # padded, unevenly: the test would be vacuous otherwise
    model = _classifier(attention, pool)
    args, kw = task.model_args(inputs)
    assert torch.equal(kw["attention_mask"], inputs[0] != 0)
    with torch.no_grad():
        together = model(*args, **kw)
        alone = torch.cat([model(inputs[0][i : i + 1, :n]) for i, n in enumerate(lengths)])
        unmasked = model(*args)
    torch.testing.assert_close(together, alone, rtol=1e-9, atol=1e-10)
    assert (unmasked - alone).abs().max() > 1e-3  # padding does change an unmasked model: the mask is what helps


def test_padded_pair_batch_masks_each_document():
    # Retrieval's passages: two documents per example, each padded differently
    gen = torch.Generator().manual_seed(3)
    a = torch.randint(1, 257, (3, 20), generator=gen)
    b = torch.randint(1, 257, (3, 20), generator=gen)
    la, lb = [20, 13, 5], [7, 20, 16]
    for i in range(3):
        a[i, la[i] :] = 0
        b[i, lb[i] :] = 0
    info = dict(num_classes=2, vocab_size=257, seq_len=20, pad_id=0, mask_padding=True)
    ds = ArrayDataset([a.numpy(), b.numpy()], np.zeros(3, np.int64))
    task = Task("pairs", "pair_classification", ds, ds, info)
    args, kw = task.model_args(ds.get_batch(np.arange(3))[0])
    assert sorted(kw) == ["attention_mask", "attention_mask2"]
    model = _classifier("softmax", "mean", dual=True, vocab=257, max_len=20)
    with torch.no_grad():
        together = model(*args, **kw)
        alone = torch.cat([model(a[i : i + 1, : la[i]], b[i : i + 1, : lb[i]]) for i in range(3)])
    torch.testing.assert_close(together, alone, rtol=1e-9, atol=1e-10)


def test_unmasked_task_passes_no_mask():
    task = build_task("lra_listops", n_train=2, n_val=2, min_len=5, max_len=30, mask_padding=False)
    inputs, _ = task.train.get_batch(np.arange(2))
    assert task.model_args(inputs) == (inputs, {})


@pytest.mark.parametrize("pool", ["mean", "cls"])
def test_the_mask_reaches_every_layer_in_evaluation(pool):
    task = build_task("lra_listops", n_train=4, n_val=5, min_len=5, max_len=30, seed=1)
    model = _classifier("softmax", pool).float()
    seen = []

    def hook(_mod, _args, kwargs):
        seen.append(kwargs.get("attention_mask"))

    for blk in model.blocks:
        blk.attn.register_forward_pre_hook(hook, with_kwargs=True)
    evaluate(model, task, batch_size=5, device=torch.device("cpu"))
    (ids,), _ = task.val.get_batch(np.arange(5))
    want = ids != 0
    if pool == "cls":  # the CLS token is a real token before the sequence
        want = torch.cat([torch.ones(5, 1, dtype=torch.bool), want], 1)
    assert len(seen) == len(model.blocks) and all(m is not None and torch.equal(m.bool(), want) for m in seen)


# ---- packing the language-model task ----------------------------------------------------------------------------
def _stream(seed=0, vocab=9):
    rng = np.random.default_rng(seed)
    lengths = [5, 1, 13, 3, 9, 2, 11]  # short documents: most windows cross a boundary, one holds a whole document
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    return rng.integers(0, vocab, sum(lengths)), starts


def test_packed_windows_are_the_unpacked_windows_cut_at_documents():
    tokens, starts = _stream()
    plain = WindowDataset(tokens, 6, doc_starts=starts)
    packed = plain.packed()
    idx = np.array([0, 3, 17, 4, 30])
    (ids,), tgt = plain.get_batch(idx)
    (pids, cu), ptgt = packed.get_batch(idx)
    assert pids.shape == (1, 30) and cu.dtype == torch.int32 and torch.equal(pids[0], ids.reshape(-1))
    # independent reference: a sequence begins at each window start and at each document start inside a window
    doc = np.searchsorted(starts, np.arange(len(tokens)), side="right")
    begins = [k * 6 + p for k, j in enumerate(idx) for p in range(6) if p == 0 or doc[j + p] != doc[j + p - 1]]
    assert cu.tolist() == begins + [30]
    crossing = [k * 6 + p for k, j in enumerate(idx) for p in range(6) if doc[j + p + 1] != doc[j + p]]
    want = tgt.reshape(-1).clone()
    want[crossing] = IGNORE_INDEX
    assert crossing and torch.equal(ptgt[0], want)


@pytest.mark.parametrize("attention", ["softmax", "tssa", "fastmax", "linear"])
def test_packed_batch_loss_equals_the_documents_alone(attention):
    tokens, starts = _stream(1)
    block = 7
    ds = PackedWindowDataset(tokens, block, 1, starts)
    idx = np.array([2, 0, 20, 8, 36])
    (ids, cu), target = ds.get_batch(idx)
    torch.manual_seed(0)
    cfg = CausalLMConfig(vocab_size=9, block_size=block, dim=12, depth=2, heads=3, attention=attention)
    model = CausalLM(cfg).double().eval()
    assert ids.shape[1] > block  # the packed row is longer than one sequence may be
    with torch.no_grad():
        logits = model(ids, cu_seqlens=cu)
        loss, _ = compute_loss("causal_lm", logits, target)  # the trainer's loss, in float32
        loss64 = F.cross_entropy(logits[0], target[0], ignore_index=IGNORE_INDEX)
        # each piece of a document alone, scored on its next tokens inside the same document
        doc = np.searchsorted(starts, np.arange(len(tokens)), side="right")
        total, count = 0.0, 0
        for j in idx:
            p0 = j
            for p in range(j + 1, j + block + 1):
                if p == j + block or doc[p] != doc[p0]:
                    piece = torch.as_tensor(tokens[p0:p])[None]
                    nxt = torch.as_tensor(tokens[p0 + 1 : p + 1])
                    keep = torch.as_tensor(doc[p0 + 1 : p + 1] == doc[p0])
                    ce = F.cross_entropy(model(piece)[0], nxt, reduction="none")
                    total += float(ce[keep].sum())
                    count += int(keep.sum())
                    p0 = p
    assert count == int((target != IGNORE_INDEX).sum()) < target.numel()
    assert abs(float(loss64) - total / count) < 1e-12 and abs(float(loss) - total / count) < 1e-6
    acc = MetricAccumulator("causal_lm", {})
    acc.update(loss, None, target)
    assert acc.count == count  # evaluation counts real targets only


def test_pack_refuses_what_cannot_be_packed():
    assert parse_overrides(["--pack"]) == {"pack": True}  # `attnzoo train ... --pack`
    with pytest.raises(ConfigError, match="causal_lm"):
        load_config(None, {"task": "digits", "model": "tost_gpt_base", "pack": True}).validate()
    with pytest.raises(ValueError, match="causal_lm"):
        pack_task(build_task("lra_listops", n_train=2, n_val=2, min_len=5, max_len=30))
    with pytest.raises(ValueError, match="doc_starts"):
        WindowDataset(np.arange(20), 4).packed()
    tokens, starts = _stream(2)
    model = CausalLM(CausalLMConfig(vocab_size=9, block_size=4, dim=12, depth=1, heads=3))
    with pytest.raises(ValueError, match="block_size=4"):
        model(torch.as_tensor(tokens[:10])[None], cu_seqlens=torch.tensor([0, 5, 10], dtype=torch.int32))


def _train_losses(out: Path) -> list[tuple[str, str]]:
    with open(out / "metrics.csv", newline="") as f:
        return [(r["step"], r["loss"]) for r in csv.DictReader(f) if r["split"] == "train"]


def test_packed_training_resumes_exactly(tmp_path):
    cfg = load_config(
        None,
        dict(
            task="shakespeare_char", task_options={"block_size": 16}, pack=True, steps=8, batch_size=4, lr=3e-2,
            eval_every=8, eval_batches=2, log_every=1, ckpt_every=4, seed=5,
        ),
    )  # fmt: skip
    full = train(cfg, tmp_path / "a", model_factory=tiny_factory, progress=False)

    def stop_at_3(step, _loss):
        if step == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    part = train(cfg, tmp_path / "b", model_factory=tiny_factory, progress=False, callback=stop_at_3)
    assert part.interrupted and part.step == 3
    rest = train(None, tmp_path / "b", resume=True, model_factory=tiny_factory, progress=False)
    assert rest.step == 8 and _train_losses(tmp_path / "a") == _train_losses(tmp_path / "b")
    assert full.final_metrics == rest.final_metrics and full.final_metrics["loss"] > 0


def test_training_steps_pass_the_mask_to_every_layer(tmp_path):
    seen = []  # (training?, the model's tokens, each mixer's mask)

    def factory(cfg, task):
        model = _classifier("tssa", "mean", max_len=task.info["seq_len"]).float()
        model.register_forward_pre_hook(
            lambda m, args, kw: seen.append((m.training, args[0], [])) or None, with_kwargs=True
        )
        for blk in model.blocks:
            blk.attn.register_forward_pre_hook(
                lambda _m, _a, kw: seen[-1][2].append(kw.get("attention_mask")), with_kwargs=True
            )
        return model

    cfg = load_config(
        None,
        dict(
            task="lra_listops", task_options={"n_train": 8, "n_val": 4, "min_len": 5, "max_len": 30}, steps=2,
            batch_size=4, eval_every=2, log_every=1, ckpt_every=2, model="tost_lra_listops",
        ),
    )  # fmt: skip
    train(cfg, tmp_path / "run", model_factory=factory, progress=False)
    assert [t for t, _, _ in seen] == [True, True, False]  # two training steps, one evaluation batch
    for _, ids, masks in seen:
        assert (ids == 0).any() and len(masks) == 2  # padded batches, one mask per layer
        assert all(m is not None and torch.equal(m.bool(), ids != 0) for m in masks)

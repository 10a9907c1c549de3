"""Tiny GGUF files written here, offline: a random Llama model and a byte-level BPE tokenizer trained on a few
sentences, in llama.cpp's layout (``blk.N.attn_q.weight`` …, Q and K rows permuted as llama.cpp's converter
does), float32 tensors — so a model read back must equal the one written, to float precision."""

from __future__ import annotations

from pathlib import Path

import numpy as np

SENTENCES = [
    "When Mary and John went to the store, John gave a drink to Mary.",
    "The capital of France is Paris.\nThe cat sat on the mat.",
    "naïve café — 日本語 ok\ttabs  two  spaces",
] * 8


def byte_level_tokenizer(vocab_size: int = 320):
    """A GPT-2-style byte-level BPE tokenizer (``tokenizers``), trained on :data:`SENTENCES`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(SENTENCES, trainer)
    return tok


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's ``permute`` of Q / K rows (the inverse of transformers' ``_reverse_permute_weights``)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tiny_llama(vocab_size: int, *, seed: int = 0, layers: int = 2, heads: int = 4, kv_heads: int = 2):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=128,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # norms away from 1, so that a dropped norm weight shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


def write_gguf(path: Path, model, tokenizer, *, architecture: str = "llama", quantized: bool = False) -> Path:
    """Write ``model`` (a Llama) and ``tokenizer`` as a float32 GGUF file at ``path``; ``quantized``: its matrices
    (rows of a multiple of 32) as Q8_0 blocks, the embedding as Q4_1 (gguf's ``quantize``), the norms float32."""
    import gguf

    cfg = model.config
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny-llama")
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    writer.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    vocab = tokenizer.get_vocab()
    pieces = [p for p, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    import json

    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(pieces)
    writer.add_token_types([3 if p.startswith("<") and p.endswith(">") else 1 for p in pieces])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
    }
    if not cfg.tie_word_embeddings:
        names["lm_head.weight"] = "output.weight"
    per_layer = {
        "input_layernorm": "attn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "post_attention_layernorm": "ffn_norm",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for i in range(cfg.num_hidden_layers):
        for hf, gg in per_layer.items():
            names[f"model.layers.{i}.{hf}.weight"] = f"blk.{i}.{gg}.weight"
    for hf_name, gg_name in names.items():
        w = sd[hf_name]
        if gg_name.endswith("attn_q.weight"):
            w = _permute(w, cfg.num_attention_heads)
        elif gg_name.endswith("attn_k.weight"):
            w = _permute(w, cfg.num_key_value_heads)
        w = np.ascontiguousarray(w, dtype=np.float32)
        if quantized and w.ndim == 2 and w.shape[-1] % 32 == 0:
            kind = gguf.GGMLQuantizationType.Q4_1 if "token_embd" in gg_name else gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(gg_name, gguf.quants.quantize(w, kind), raw_dtype=kind)
        else:
            writer.add_tensor(gg_name, w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_blob(folder: Path, name: str, *, seed: int, quantized: bool = False, tie: bool = False):
    """``(path, model, tokenizer)``: a tiny random Llama and its byte-level tokenizer written as the extension-less
    GGUF blob ``folder / name`` (as Ollama names its blobs, ``sha256-…``); ``quantized``: as :func:`write_gguf`;
    ``tie``: no ``output.weight`` (the unembedding is the embedding)."""
    tok = byte_level_tokenizer()
    model = tiny_llama(tok.get_vocab_size(), seed=seed)
    if tie:
        model.config.tie_word_embeddings = True
        model.lm_head.weight = model.model.embed_tokens.weight
    path = folder / name
    write_gguf(path, model, tok, quantized=quantized)
    return path, model, tok


def gguf_routes(folder: Path):
    """A quantized GGUF file with a tied unembedding (:func:`write_blob`) opened without a cache both ways: ``(whole,
    layer by layer)`` model views."""
    from headwise.models import open_model

    path, _, _ = write_blob(folder, "sha256-q8", seed=5, quantized=True, tie=True)
    whole = open_model(path, cache=False, by_layer=False)
    layered = open_model(path, cache=False, by_layer=True)
    assert whole.stream is None and layered.stream is not None
    return whole, layered

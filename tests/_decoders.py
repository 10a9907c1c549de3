"""Tiny random Hugging Face checkpoints saved to folders, with a word-level tokenizer built offline."""

from __future__ import annotations

import json
from pathlib import Path

WORDS = [
    "the",
    "a",
    "cat",
    "dog",
    "sat",
    "on",
    "mat",
    "and",
    "ran",
    "to",
    "in",
    "of",
    "it",
    "was",
    "good",
    "god",
    "saw",
    "light",
    ",",
    ".",
    "created",
    "heavens",
    "earth",
    "beginning",
    "day",
    "night",
    "water",
    "land",
    "one",
    "two",
    "three",
    "red",
    "blue",
    "green",
    "big",
    "small",
    "house",
    "tree",
]
SPECIALS = ("<bos>", "<eos>", "<pad>", "<unk>")

#: family → config sizes (2 layers, 4 query heads; GQA where the family has it).
FAMILIES = {
    "llama": dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    ),
    "qwen2": dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    ),
    "gpt2": dict(n_embd=32, n_layer=2, n_head=4, n_inner=64),
    "mistral": dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1
    ),
}
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "gpt2": "GPT2LMHeadModel",
    "mistral": "MistralForCausalLM",
}


def save_tokenizer(folder: Path, *, bos: bool = True) -> int:
    """A whitespace word-level tokenizer (``<bos>`` prepended when ``bos``); returns its vocabulary size."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {w: i for i, w in enumerate(SPECIALS + tuple(WORDS))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    tok.add_special_tokens(list(SPECIALS))
    if bos:
        tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 0)])
    tok.save(str(folder / "tokenizer.json"))
    return len(vocab)


def save_decoder(
    folder: Path,
    family: str = "llama",
    *,
    tokenizer: bool = True,
    seed: int = 0,
    positions: int = 128,
    init: float = 0.02,
    layers: int | None = None,
) -> Path:
    """Save a tiny random causal LM of ``family`` (safetensors + config.json, maybe tokenizer.json).

    ``init``: the weights' standard deviation (``initializer_range``); 0.5 gives sharp, varied heads. ``layers``:
    that many layers (default: the family's 2).
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    vocab = len(SPECIALS) + len(WORDS)
    sizes = dict(FAMILIES[family])
    if layers is not None:
        sizes["n_layer" if family == "gpt2" else "num_hidden_layers"] = layers
    if family == "gpt2":
        sizes.update(n_positions=positions, vocab_size=vocab, bos_token_id=0, eos_token_id=1)
    else:
        sizes.update(
            max_position_embeddings=positions, vocab_size=vocab, bos_token_id=0, eos_token_id=1, pad_token_id=2
        )
    config = AutoConfig.for_model(family, architectures=[ARCHITECTURES[family]], initializer_range=init, **sizes)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    model.save_pretrained(folder, safe_serialization=True)
    if tokenizer:
        save_tokenizer(folder)
    return folder


def config_of(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def routes_tol(folder: Path, *, scale: float) -> float:
    """The tolerance between two float32 routes through the decoder saved in ``folder`` (whole or layer by layer,
    another batch's shapes, another CPU's kernels), which differ in their sums' order alone: each layer's attention
    and MLP and the unembedding are a stage of sums of at most ``max(hidden, intermediate)`` terms of about
    ``scale`` (``_helpers.float32_tol``). Measured: 4.9e-5 on a patching metric of 3.8 on an AVX2 machine."""
    from _helpers import float32_tol

    c = config_of(folder)
    width = max(c.get("hidden_size", c.get("n_embd", 1)), c.get("intermediate_size") or c.get("n_inner") or 1)
    layers = c.get("num_hidden_layers", c.get("n_layer", 1))
    return float32_tol(width, stages=2 * layers + 1, scale=scale)

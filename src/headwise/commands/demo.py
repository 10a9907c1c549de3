"""``headwise demo``'s flow: a sentence through multi-head attention — the untrained ``AttentionBlock`` of the first
article, the pretrained all-MiniLM-L6-v2 encoder or SmolLM2-135M-Instruct decoder — as one :class:`DemoResult` (the
shapes, the parameter counts, one layer's weights ``(H, L, L)``, the positions the model uses), for the command line
to print and draw. :func:`run` takes a :class:`DemoOptions` (the model chosen, every option checked) and returns it.

Shape legend: B batch (1), L tokens, D model width, H query heads, Hkv key/value heads, Dh head width, P positions
drawn.

Errors are ValueErrors naming the option (``--text``, ``--heads``, ``--d-model``, ``--layer``, ``--model``).
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from headwise.checks import layer_number

__all__ = [
    "MAX_TOKENS",
    "MODELS",
    "PE_ROWS",
    "DemoOptions",
    "DemoResult",
    "check_layer",
    "check_sizes",
    "real_model_available",
    "run",
    "run_minilm",
    "run_smollm2",
    "run_untrained",
    "smollm2_source",
    "tokenize",
    "vocabulary",
]

#: most tokens the tables and pictures stay readable with
MAX_TOKENS = 64
#: rows of the positional-encoding picture (at least the sentence's length): the article's Figure 2 has 50
PE_ROWS = 50
#: ``--model``'s choices
MODELS = ("auto", "untrained", "minilm", "smollm2")
NO_MODEL = "--model minilm: needs headwise.models and the bundled checkpoint (pip install 'headwise[models]')"


def tokenize(text: str) -> list[str]:
    """Words and punctuation marks, in order: ``"the cat's mat."`` -> ``["the", "cat's", "mat", "."]``.

    Raises:
        ValueError: no token at all, or more than :data:`MAX_TOKENS`.
    """
    tokens = re.findall(r"\w+(?:'\w+)?|[^\w\s]", text)
    if not tokens:
        raise ValueError(f"--text: expected at least one word, got {text!r}")
    if len(tokens) > MAX_TOKENS:
        raise ValueError(f"--text: expected at most {MAX_TOKENS} tokens (words and punctuation), got {len(tokens)}")
    return tokens


def vocabulary(tokens: list[str]) -> dict[str, int]:
    """Token -> id, numbered in order of first appearance (``the``=0, ``cat``=1, …)."""
    vocab: dict[str, int] = {}
    for t in tokens:
        vocab.setdefault(t, len(vocab))
    return vocab


@dataclass
class DemoResult:
    """What a model did with the sentence, ready to print and draw.

    Attributes:
        title: the model, in words.
        tokens: the L tokens the model saw (rows and columns of every head).
        weights: ``(H, L, L)`` NumPy attention weights of the layer shown.
        shapes: (what, shape) lines, in the order the data flows.
        params: (what, count) lines; the first is the total.
        positions: ``(P, D)`` NumPy table of the positions the model adds, and its caption.
        notes: lines printed after the header.
    """

    title: str
    tokens: list[str]
    weights: object
    shapes: list[tuple[str, tuple[int, ...]]]
    params: list[tuple[str, int]]
    positions: object
    positions_caption: str
    notes: list[str] = field(default_factory=list)


def _count(module) -> int:
    return sum(p.numel() for p in module.parameters())


def check_sizes(heads: int, d_model: int) -> None:
    """The untrained block's sizes: ``d_model`` a positive even multiple of ``heads``.

    Raises:
        ValueError: naming the option.
    """
    if heads <= 0:
        raise ValueError(f"--heads: expected a positive integer, got {heads}")
    if d_model <= 0:
        raise ValueError(f"--d-model: expected a positive integer, got {d_model}")
    if d_model % heads:
        raise ValueError(f"--d-model: expected a multiple of --heads={heads}, got {d_model}")
    if d_model % 2:
        raise ValueError(
            f"--d-model: expected an even width (sinusoidal positions come in sin/cos pairs), got {d_model}"
        )


def run_untrained(text: str, heads: int, d_model: int, seed: int) -> DemoResult:
    """The first article's ``AttentionBlock`` on ``text``, random weights from ``seed``.

    Raises:
        ValueError: sizes that do not fit (``d_model`` not a positive even multiple of ``heads``).
    """
    check_sizes(heads, d_model)
    tokens = tokenize(text)
    vocab = vocabulary(tokens)

    import torch

    from headwise import AttentionBlock

    ids = torch.tensor([[vocab[t] for t in tokens]])  # (B=1, L)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        block = AttentionBlock(vocab_size=len(vocab), d_model=d_model, num_heads=heads).eval()
    with torch.no_grad():
        x = block.emb_pe(ids)  # (1, L, D): embedding + position
        out, weights = block(ids, need_weights=True, average_weights=False)  # (1, L, D), (1, H, L, L)
    mha = block.mha
    L = len(tokens)
    return DemoResult(
        title=f"untrained AttentionBlock (the first article's), random weights, seed {seed}",
        tokens=tokens,
        weights=weights[0].numpy(),
        shapes=[
            ("token ids", tuple(ids.shape)),
            ("embeddings + positions", tuple(x.shape)),
            ("queries, keys, values per head", (1, heads, L, mha.head_dim)),
            ("attention weights", tuple(weights.shape)),
            ("attention output", tuple(out.shape)),
        ],
        params=[
            ("total", _count(block)),
            (f"token embedding ({len(vocab)} words × {d_model})", _count(block.emb_pe.emb)),
            (f"attention Wq, Wk, Wv, Wo (4 × ({d_model}·{d_model} + {d_model}))", _count(mha)),
            ("sinusoidal positions (fixed, not trained)", 0),
        ],
        positions=block.emb_pe.pos.pe[: max(PE_ROWS, L)].numpy(),
        positions_caption=f"sinusoidal positional encoding added to the tokens (rows 0–{L - 1} used here)",
        notes=[f"vocabulary made from the text: {', '.join(f'{t}={i}' for t, i in vocab.items())}"],
    )


def real_model_available() -> bool:
    """Whether :mod:`headwise.models` can load the bundled pretrained all-MiniLM-L6-v2 here."""
    import importlib.util

    if any(importlib.util.find_spec(m) is None for m in ("tokenizers", "safetensors")):  # the models extra
        return False
    try:
        from headwise import models

        models.default_model_path()
    except (ImportError, AttributeError, FileNotFoundError):
        return False
    return hasattr(models, "open_model")


def _check_layer(layer: int, layers: int, model: str) -> None:
    """ValueError naming ``--layer`` unless ``layer`` is one of the model's ``layers``
    (:func:`headwise.checks.layer_number`)."""
    try:
        layer_number("--layer", layer, layers, model=model)
    except ValueError as e:
        raise ValueError(str(e)) from None


def check_layer(layer: int) -> None:
    """``layer`` is one of the bundled model's layers (read from its config.json, before loading weights).

    Raises:
        ValueError: naming ``--layer``.
    """
    from headwise.models import BertConfig, default_model_path

    layers = BertConfig.from_file(default_model_path() / "config.json").num_hidden_layers
    _check_layer(layer, layers, "all-MiniLM-L6-v2")


def run_minilm(text: str, layer: int) -> DemoResult:
    """The pretrained all-MiniLM-L6-v2 encoder of :mod:`headwise.models` on ``text``; layer ``layer``'s heads.

    Raises:
        ValueError: :mod:`headwise.models` cannot load the model, or ``layer`` is out of range.
    """
    if not real_model_available():
        raise ValueError(NO_MODEL)
    import torch

    from headwise.models import encode, open_model

    check_layer(layer)
    hm = open_model(None)  # the one door; None: the bundled checkpoint
    model, tokenizer = hm.model, hm.tokenizer
    config = model.config
    with warnings.catch_warnings(record=True):  # too long: cut to MAX_TOKENS, said in the notes below
        warnings.simplefilter("always")
        batch = encode(tokenizer, [text], max_length=MAX_TOKENS)
    with torch.no_grad():
        result = model(batch.input_ids, batch.attention_mask, output_attentions=True)
    weights = result.attentions[layer]  # (1, H, L, L)
    attn = model.layers[layer].attn
    tokens = batch.tokens[0]
    L, H, D = len(tokens), config.num_attention_heads, config.hidden_size
    attention = sum(_count(lay.attn) for lay in model.layers)
    return DemoResult(
        title=f"pretrained all-MiniLM-L6-v2 (headwise.models.open_model), layer {layer} of {config.num_hidden_layers}",
        tokens=tokens,
        weights=weights[0].numpy(),
        shapes=[
            ("token ids ([CLS] … [SEP])", tuple(batch.input_ids.shape)),
            ("embeddings (word + position + segment, LayerNorm)", tuple(result.hidden_states[0].shape)),
            ("queries, keys, values per head", (1, H, L, attn.head_dim)),
            (f"attention weights, layer {layer}", tuple(weights.shape)),
            (f"hidden states after layer {layer}", tuple(result.hidden_states[layer + 1].shape)),
        ],
        params=[
            ("total (no pooler)", _count(model)),
            ("embeddings (word, position, segment, LayerNorm)", _count(model.embed)),
            (f"attention Wq, Wk, Wv, Wo, all {config.num_hidden_layers} layers", attention),
            (f"attention of layer {layer} (4 × ({D}·{D} + {D}))", _count(attn)),
            ("feed-forward and LayerNorms, all layers", _count(model) - _count(model.embed) - attention),
        ],
        positions=model.embed.position.weight[: max(PE_ROWS, L)].detach().numpy(),
        positions_caption=f"learned position embeddings of all-MiniLM-L6-v2 (rows 0–{L - 1} used here)",
        notes=[f"{H} heads of width {attn.head_dim}; WordPiece tokens, lower-cased, with [CLS] and [SEP]"]
        + (
            [f"the text has {batch.num_tokens[0]} word pieces: cut to the first {MAX_TOKENS} (with [SEP])"]
            if batch.truncated[0]
            else []
        ),
    )


def smollm2_source(layer: int | None):
    """The bundled SmolLM2's checked source (its GGUF header read, nothing loaded) and the layer to show
    (default: the last).

    Raises:
        ValueError: the model's package is missing, or ``layer`` is out of range (read from the header).
    """
    from headwise.models import inspect_source

    try:
        info = inspect_source("smollm2")
    except (OSError, ValueError) as e:
        raise ValueError(f"--model: {' '.join(str(e).split())}") from None
    layers = int(info.header.get("block_count"))
    layer = layers - 1 if layer is None else layer
    _check_layer(layer, layers, "SmolLM2-135M")
    return info, layer


def run_smollm2(text: str, info, layer: int) -> DemoResult:
    """The bundled SmolLM2-135M-Instruct (a Llama-style decoder, read from its GGUF file through the one door,
    de-quantised once into the user's cache) on ``text``; layer ``layer``'s heads (:func:`smollm2_source`).

    Raises:
        ValueError: the model cannot be opened here (the cache cannot be written).
    """
    import torch

    from headwise.models import open_model

    try:
        hm = open_model(info)
    except (OSError, ValueError) as e:
        raise ValueError(f"--model: {' '.join(str(e).split())}") from None
    model, config = hm.model, hm.model.config
    layers = config.num_hidden_layers
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        enc = hm.encode([text])
    ids = enc.ids[:, :MAX_TOKENS]  # (1, L)
    with torch.no_grad():
        hidden = model(ids, output_hidden_states=True).hidden_states  # NL + 1 of (1, L, D)
    weights = hm.attentions(ids, None)[layer]  # (1, H, L, L)
    tokens = hm.token_texts(ids[0].tolist())
    L, H, D = len(tokens), config.num_attention_heads, config.hidden_size
    Hkv, Dh = config.num_key_value_heads, getattr(config, "head_dim", None) or D // H
    anatomy = hm.anatomy  # the model's parts, as every tool reads them
    attentions = [part.attention for part in anatomy.layers]
    attn = attentions[layer]
    attention = sum(_count(a) for a in attentions)
    embed = _count(anatomy.embed)
    inv_freq = next(m.inv_freq for m in model.modules() if isinstance(getattr(m, "inv_freq", None), torch.Tensor))
    angles = torch.arange(max(PE_ROWS, L))[:, None] * inv_freq[None, :].float()  # (P, Dh/2)
    return DemoResult(
        title=f"pretrained SmolLM2-135M-Instruct (GGUF, headwise.models.open_model), layer {layer} of {layers}",
        tokens=tokens,
        weights=weights[0],
        shapes=[
            ("token ids (byte-level BPE, no BOS)", tuple(ids.shape)),
            ("embeddings (token only: positions are rotated into q and k)", tuple(hidden[0].shape)),
            ("queries per head (RoPE applied)", (1, H, L, Dh)),
            (f"keys, values per KV head (GQA: {H // Hkv} query heads share one)", (1, Hkv, L, Dh)),
            (f"attention weights, layer {layer} (causal)", tuple(weights.shape)),
            (f"hidden states after layer {layer}", tuple(hidden[layer + 1].shape)),
        ],
        params=[
            ("total (the unembedding is tied to the embedding)", _count(model)),
            (f"token embedding ({config.vocab_size:,} × {D})", embed),
            (f"attention q, k, v, o, all {layers} layers", attention),
            (f"attention of layer {layer} ({D}·{H * Dh} + 2 · {D}·{Hkv * Dh} + {H * Dh}·{D})", _count(attn)),
            ("feed-forward (SwiGLU) and RMSNorms, all layers", _count(model) - embed - attention),
        ],
        positions=torch.cos(angles).numpy(),
        positions_caption=f"RoPE of SmolLM2: cos(position × frequency), {Dh // 2} frequencies — rotated into q "
        f"and k, not added (rows 0–{L - 1} used here)",
        notes=[
            f"{H} query heads of width {Dh} on {Hkv} key/value heads; tokens shown as text (␣ a leading space, "
            "↵ a line break)"
        ]
        + ([f"the text has {enc.ids.shape[1]} tokens: cut to the first {MAX_TOKENS}"] if enc.ids.shape[1] > L else []),
    )


@dataclass(frozen=True)
class DemoOptions:
    """What ``headwise demo`` runs (its options).

    Attributes:
        text: the sentence; out: the folder for the pictures (created before the model runs).
        model: ``"auto"`` (``minilm`` when it can be loaded and no untrained size is given, else ``untrained``),
            ``"untrained"``, ``"minilm"`` or ``"smollm2"`` (:data:`MODELS`).
        heads, d_model, seed: the untrained block's (None: 4, 128, 0); refused for a pretrained model.
        layer: the layer shown of ``minilm`` (default 0) or ``smollm2`` (default the last); refused for the block.
    Raises:
        ValueError: naming the option: an unknown model.
    """

    text: str
    out: Path
    model: str = "auto"
    heads: int | None = None
    d_model: int | None = None
    seed: int | None = None
    layer: int | None = None

    def __post_init__(self):
        if self.model not in MODELS:
            raise ValueError(f"--model: expected one of {', '.join(MODELS)}, got {self.model!r}")
        object.__setattr__(self, "out", Path(self.out))


def run(options: DemoOptions) -> DemoResult:
    """``headwise demo``: the model chosen, the options checked against it, ``--out`` created, the sentence run.

    Raises:
        ValueError: one line naming the option, before anything is written.
    """
    from headwise.commands._folders import prepare_folder

    o, chosen, layer = options, options.model, options.layer
    if chosen == "auto":
        untrained_only = o.heads is not None or o.d_model is not None or o.seed is not None
        chosen = "minilm" if not untrained_only and real_model_available() else "untrained"
    if chosen in ("minilm", "smollm2"):
        for option, value in (("--heads", o.heads), ("--d-model", o.d_model), ("--seed", o.seed)):
            if value is not None:
                raise ValueError(f"{option}: applies to --model untrained only (the pretrained model is fixed)")
    if chosen == "smollm2":
        if not o.text.strip():
            raise ValueError(f"--text: expected at least one word, got {o.text!r}")
        info, layer = smollm2_source(layer)
        prepare_folder(o.out, "--out")
        return run_smollm2(o.text, info, layer)
    if chosen == "minilm":
        layer = 0 if layer is None else layer
        tokenize(o.text)  # the same checks as the model's, before loading anything
        if not real_model_available():
            raise ValueError(NO_MODEL)
        check_layer(layer)
        prepare_folder(o.out, "--out")
        return run_minilm(o.text, layer)
    if layer is not None:
        raise ValueError("--layer: applies to --model minilm or smollm2 only (the untrained block has one layer)")
    heads, d_model = 4 if o.heads is None else o.heads, 128 if o.d_model is None else o.d_model
    check_sizes(heads, d_model)
    tokenize(o.text)
    prepare_folder(o.out, "--out")
    return run_untrained(o.text, heads, d_model, 0 if o.seed is None else o.seed)

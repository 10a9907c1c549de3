"""Any local checkpoint folder as a model whose heads can be read, gated and ablated.

Shape legend: B batch, L padded length, NL layers, H heads per layer, Dh head width, D model width, V vocabulary.

:func:`load_head_model` opens a folder with ``config.json`` and safetensors weights — never a pickle:
a folder holding only ``pytorch_model.bin`` (or another pickle) is refused, and nothing is unpickled —
and returns a :class:`HeadModel`:

- ``model_type`` ``"bert"``: headwise's own BERT encoder (:func:`headwise.models.load_bert`);
- ``model_type`` starting with ``"headwise-lab"``: a lab checkpoint (``headwise.lab.load``), decoder;
- any other type Hugging Face transformers knows: ``AutoModelForCausalLM`` when the checkpoint is a
  causal LM (its ``architectures`` say ``…ForCausalLM`` / ``…LMHeadModel``, or the type has no masked-LM
  class), else ``AutoModel`` (an encoder), loaded with ``attn_implementation="headwise"``: attention runs
  on headwise's Hugging Face backend (:mod:`headwise.hf`), per-head weights come from
  :func:`headwise.hf.capture`, and a family that writes its own attention is refused.

Before anything is loaded the folder is checked: every safetensors header is read and the file length
compared with it (corrupt or truncated files are named), the ``model_type`` must be known, and the
parameters are counted from ``config.json`` (the model built on PyTorch's ``meta`` device, no memory)
and refused when their float32 size exceeds the machine's memory. Errors are ``FileNotFoundError`` /
``ValueError`` with one-line messages naming the file.

**Gates.** :meth:`HeadModel.gated` multiplies each head's output by a gate ξ where the heads enter the
output projection (the input of ``Wo`` / ``o_proj``, before the heads are mixed), as Michel et al. 2019
define head masking: ξ = 1 changes nothing, ξ = 0 removes the head. For headwise's modules this is a
pre-hook on ``Wo``; for Hugging Face models an observer of the headwise backend
(:class:`headwise.hf.backend.Observer`), which sees each layer's per-head output ``(B, H, L, Dh)``
before the heads are merged for the output projection — where :func:`headwise.hf.ablate` acts too.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import struct
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["HeadModel", "EncodedTexts", "load_head_model", "inspect_folder", "FolderInfo", "machine_memory"]

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
#: Longest input analysed (tokens), whatever the model's position limit: maps are L × L per head.
MAX_ANALYSIS_LENGTH = 1024


@dataclass
class FolderInfo:
    """What :func:`inspect_folder` found: the config, its ``model_type``, the weight files, their tensors."""

    folder: Path
    config: dict
    model_type: str
    weights: list[Path]
    num_parameters: int
    tokenizer: Path | None


def machine_memory() -> int:
    """Bytes of physical memory of this machine (``os.sysconf``)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _safetensors_tensors(path: Path) -> int:
    """Check one safetensors file's header against its length; return its number of tensor elements.

    Raises:
        ValueError: not a safetensors file, a header that does not parse, tensors past the end (truncated).
    """
    size = path.stat().st_size
    bad = f"{path}: corrupt or truncated safetensors file"
    if size < 8:
        raise ValueError(f"{bad} ({size} bytes; the header alone needs 8)")
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


def _known_type(model_type: str) -> bool:
    if model_type == "bert" or model_type.startswith("headwise-lab"):
        return True
    from transformers import CONFIG_MAPPING

    return model_type in CONFIG_MAPPING


def _config_parameters(config: dict, fallback: int, source: str) -> int:
    """Parameters of the model ``config`` describes, counted on the meta device (no memory).

    BERT is headwise's own encoder, its config checked by :class:`headwise.models.BertConfig`; a lab
    checkpoint counts the tensors its safetensors declare (``fallback``).

    Raises:
        ValueError: a BERT config with a bad field (naming it).
    """
    import torch

    model_type = config.get("model_type", "")
    if model_type.startswith("headwise-lab"):
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


def inspect_folder(path: str | os.PathLike) -> FolderInfo:
    """Check a checkpoint folder without loading its weights.

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
    if not isinstance(model_type, str) or not _known_type(model_type):
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
        pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
        if pickles:
            raise FileNotFoundError(
                f"{folder}: found only {', '.join(pickles)} (a pickle checkpoint, which headwise never loads: "
                "unpickling runs arbitrary code); expected *.safetensors"
            )
        raise FileNotFoundError(f"{folder}: no *.safetensors file (a checkpoint folder needs its weights)")
    stored = sum(_safetensors_tensors(w) for w in weights)
    if model_type == "bert":  # headwise's BertConfig names the bad field itself
        params = _config_parameters(config, stored, str(cfg_path))
    else:
        try:
            params = _config_parameters(config, stored, str(cfg_path))
        except Exception as e:  # a config transformers cannot build a model from
            msg = " ".join(str(e).split())
            raise ValueError(f"{cfg_path}: cannot build a {model_type!r} model from it ({msg})") from None
    need, have = 4 * params, machine_memory()
    if need > have:
        raise ValueError(
            f"{cfg_path}: {params:,} parameters (counted from the config) need {need / 2**30:.1f} GiB in float32, "
            f"more than this machine's {have / 2**30:.1f} GiB of memory"
        )
    tok = folder / "tokenizer.json"
    return FolderInfo(folder, config, model_type, weights, params, tok if tok.is_file() else None)


@dataclass
class EncodedTexts:
    """Texts as token ids: ``ids`` and ``mask`` ``(B, L)`` long (mask 1 = real token), right-padded;
    ``tokens`` the token strings of each text (no padding); ``truncated`` which texts were cut."""

    ids: object
    mask: object
    tokens: list[list[str]]
    truncated: list[bool] = field(default_factory=list)


@dataclass
class HeadModel:
    """A loaded model, ready for head analysis.

    Attributes:
        model: the ``torch.nn.Module`` (eval mode, float32).
        kind: ``"decoder"`` (causal) or ``"encoder"``.
        family: the config's ``model_type``.
        name: the folder's name (or the bundled model's).
        num_layers, num_heads: NL and H (query heads).
        max_length: the longest input analysed (the model's positions, at most :data:`MAX_ANALYSIS_LENGTH`).
        vocab_size: V.
        tokenizer: a ``tokenizers.Tokenizer`` or None (the folder has none).
        bos_id: the id a probe starts with (the config's ``bos_token_id``), or None.
        special_ids: ids the probe never draws (the tokenizer's special tokens, BOS / EOS / PAD).
        backend: ``"headwise"`` (headwise's own modules) or ``"hf+headwise"`` (Hugging Face on headwise
            attention).
    """

    model: object
    kind: str
    family: str
    name: str
    num_layers: int
    num_heads: int
    max_length: int
    vocab_size: int
    tokenizer: object | None
    bos_id: int | None
    special_ids: tuple[int, ...]
    backend: str
    _attention_modules: list = field(default_factory=list, repr=False)
    _head_points: list = field(default_factory=list, repr=False)

    @property
    def title(self) -> str:
        return f"{self.name} ({self.family} {self.kind}, {self.num_layers} layers × {self.num_heads} heads)"

    # -- text --------------------------------------------------------------------------------------
    def encode(self, texts: Sequence[str]) -> EncodedTexts:
        """Tokenize texts with the checkpoint's tokenizer (its own special tokens), truncate to
        :attr:`max_length` (a ``TruncationWarning`` per text), pad right.

        Raises:
            ValueError: no tokenizer, an empty text.
        """
        import torch

        from headwise.models import TruncationWarning, encode

        if self.tokenizer is None:
            raise ValueError(
                f"TEXT: the checkpoint {self.name} has no tokenizer.json; run without a text to analyse its probe"
            )
        texts = [texts] if isinstance(texts, str) else list(texts)
        for k, t in enumerate(texts):
            if not isinstance(t, str) or not t.strip():
                raise ValueError(f"texts[{k}]: expected a non-empty text, got {t!r}")
        if self.family == "bert":
            b = encode(self.tokenizer, texts, max_length=self.max_length)
            tokens = [[t for t, m in zip(row, mask) if m] for row, mask in zip(b.tokens, b.attention_mask.tolist())]
            return EncodedTexts(b.input_ids, b.attention_mask, tokens, b.truncated)
        rows, cut = [], []
        for k, enc in enumerate(self.tokenizer.encode_batch(texts)):
            ids = list(enc.ids)
            if not ids:
                raise ValueError(f"texts[{k}]: the tokenizer gave no token for {texts[k]!r}")
            if len(ids) > self.max_length:
                warnings.warn(
                    f"texts[{k}]: {len(ids)} tokens, more than the model's {self.max_length} positions; "
                    f"truncated to the first {self.max_length}",
                    TruncationWarning,
                    stacklevel=2,
                )
                ids = ids[: self.max_length]
            cut.append(len(enc.ids) > self.max_length)
            rows.append(ids)
        length = max(map(len, rows))
        ids = torch.zeros((len(rows), length), dtype=torch.long)
        mask = torch.zeros((len(rows), length), dtype=torch.long)
        for b, row in enumerate(rows):
            ids[b, : len(row)] = torch.tensor(row)
            mask[b, : len(row)] = 1
        tokens = [[self.tokenizer.id_to_token(i) or f"<{i}>" for i in row] for row in rows]
        return EncodedTexts(ids, mask, tokens, cut)

    def token_strings(self, ids) -> list[str]:
        """The strings of one sequence's ids (``<id>`` without a tokenizer)."""
        if self.tokenizer is None:
            return [f"<{int(i)}>" for i in ids]
        return [self.tokenizer.id_to_token(int(i)) or f"<{int(i)}>" for i in ids]

    # -- running ------------------------------------------------------------------------------------
    def forward(self, ids, mask=None, *, math_path: bool = False):
        """Logits ``(B, L, V)`` for a decoder, last hidden states ``(B, L, D)`` for an encoder.

        ``math_path``: headwise's attention modules on their readable path end to end (``backend="math"``: each
        projection an ``nn.Linear`` call, the softmax written out), which forward-mode differentiation goes
        through (the fast kernels do not carry tangents). No effect on Hugging Face models.
        """
        if self.backend == "headwise":
            with _on_math_path(self._attention_modules if math_path else []):
                if self.kind == "encoder":
                    return self.model(ids, mask, output_attentions=False).last_hidden_state
                return self.model(ids)
        out = self.model(input_ids=ids, attention_mask=mask)
        return out.logits if self.kind == "decoder" else out.last_hidden_state

    def attentions(self, ids, mask=None) -> list[np.ndarray]:
        """Per-head weights of every layer: NL float32 arrays ``(B, H, L, L)``.

        Hugging Face models: through :func:`headwise.hf.capture` (headwise attention).
        """
        import torch

        with torch.no_grad():
            if self.backend == "headwise":
                maps = self._headwise_attentions(ids, mask)
            else:
                import headwise.hf

                with headwise.hf.capture(self.model) as attn:
                    self.model(input_ids=ids, attention_mask=mask)
                maps = list(attn.weights)
        if len(maps) != self.num_layers:
            raise RuntimeError(f"{self.name}: captured {len(maps)} attention layers, expected {self.num_layers}")
        return [m.float().cpu().numpy() for m in maps]

    def _headwise_attentions(self, ids, mask):
        if self.kind == "encoder":
            return list(self.model(ids, mask, output_attentions=True).attentions)
        out = self.model(ids, need_weights=True)
        return list(out[1])

    @contextlib.contextmanager
    def gated(self, gates):
        """Within the block, multiply each head's output by ``gates`` where heads enter the output projection
        (a hook on every attention layer's ``hook_heads``; nested blocks multiply their gates).

        Args:
            gates: ``(NL, H)`` or ``(B, NL, H)`` float tensor (per example: one gate per sequence of the
                batch, so one backward pass gives every example's ∂L/∂ξ). May require grad.
        """
        from headwise.core.hooks import hooked

        if tuple(gates.shape[-2:]) != (self.num_layers, self.num_heads):
            raise ValueError(
                f"gates: expected shape (…, {self.num_layers}, {self.num_heads}), got {tuple(gates.shape)}"
            )

        def gate(layer: int, heads_out):  # (B, H, L, Dh)
            g = gates[..., layer, :]  # (H,) or (B, H)
            shape = (g.shape[0] if g.dim() == 2 else 1, self.num_heads, 1, 1)
            return heads_out * g.reshape(shape).to(heads_out.dtype)

        with hooked((point, functools.partial(gate, layer)) for layer, point in enumerate(self._head_points)):
            yield


@contextlib.contextmanager
def _on_math_path(modules):
    """Inside the block, ``modules`` run ``backend="math"``; each gets its own backend back after."""
    saved = [m.backend for m in modules]
    try:
        for m in modules:
            m.backend = "math"
        yield
    finally:
        for m, backend in zip(modules, saved):
            m.backend = backend


# -- loading ---------------------------------------------------------------------------------------


def _headwise_modules(model) -> list:
    from headwise.core.attention import MultiHeadAttention

    return [m for m in model.modules() if isinstance(m, MultiHeadAttention)]


def _hook_headwise(hm: HeadModel) -> None:
    """The ``hook_heads`` point of each headwise attention layer, where :meth:`HeadModel.gated` acts."""
    hm._head_points = [m.hook_heads for m in hm._attention_modules]


def _observe_gates(hm: HeadModel) -> None:
    """The ``hook_heads`` point the Hugging Face backend keeps for each attention layer."""
    from headwise.hf.backend import hook_points

    hm._head_points = [hook_points(m).hook_heads for m in hm._attention_modules]


def _hf_class(config: dict):
    from transformers import AutoModel, AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    archs = config.get("architectures") or []
    model_type = config["model_type"]
    if any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs):
        return "decoder", AutoModelForCausalLM
    if (
        not archs
        and model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        and model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES
    ):
        return "decoder", AutoModelForCausalLM
    return "encoder", AutoModel


def _load_hf(info: FolderInfo) -> HeadModel:
    import torch
    from transformers.utils import logging as hf_logging

    import headwise.hf

    kind, cls = _hf_class(info.config)
    bars = hf_logging.is_progress_bar_enabled()
    verbosity = hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = cls.from_pretrained(
                os.fspath(info.folder), attn_implementation=headwise.hf.NAME, use_safetensors=True, dtype=torch.float32
            )
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
    model.eval()
    c = model.config
    text_config = c.get_text_config() if hasattr(c, "get_text_config") else c
    modules = headwise.hf.attention_layers(model)
    positions = getattr(text_config, "max_position_embeddings", None) or MAX_ANALYSIS_LENGTH
    hm = HeadModel(
        model=model,
        kind=kind,
        family=info.model_type,
        name=info.folder.name,
        num_layers=len(modules),
        num_heads=headwise.hf.num_heads(modules[0]),
        max_length=int(min(positions, MAX_ANALYSIS_LENGTH)),
        vocab_size=int(text_config.vocab_size),
        tokenizer=None,
        bos_id=getattr(text_config, "bos_token_id", None),
        special_ids=(),
        backend="hf+headwise",
    )
    hm._attention_modules = modules
    _observe_gates(hm)
    return hm


def _load_bert(folder: Path | None) -> HeadModel:
    from headwise.models import load_bert

    model, tokenizer = load_bert(folder)
    c = model.config
    hm = HeadModel(
        model=model,
        kind="encoder",
        family="bert",
        name="all-MiniLM-L6-v2" if folder is None else folder.name,
        num_layers=c.num_hidden_layers,
        num_heads=c.num_attention_heads,
        max_length=min(c.max_position_embeddings, MAX_ANALYSIS_LENGTH),
        vocab_size=c.vocab_size,
        tokenizer=tokenizer,
        bos_id=None,
        special_ids=tuple(
            tokenizer.token_to_id(t)
            for t in ("[CLS]", "[SEP]", "[PAD]", "[MASK]", "[UNK]")
            if tokenizer.token_to_id(t) is not None
        ),
        backend="headwise",
    )
    hm._attention_modules = _headwise_modules(model)
    _hook_headwise(hm)
    return hm


def _load_lab(info: FolderInfo) -> HeadModel:
    try:
        from headwise import lab
    except ImportError:
        raise ValueError(f"{info.folder}: a headwise lab checkpoint, but headwise.lab is not installed") from None
    model = lab.load(info.folder)
    modules = _headwise_modules(model)
    hm = HeadModel(
        model=model,
        kind="decoder",
        family=info.model_type,
        name=info.folder.name,
        num_layers=len(modules),
        num_heads=int(modules[0].num_heads),
        max_length=min(int(model.context_length), MAX_ANALYSIS_LENGTH),
        vocab_size=int(model.vocab_size),
        tokenizer=None,
        bos_id=None,
        special_ids=(),
        backend="headwise",
    )
    hm._attention_modules = modules
    _hook_headwise(hm)
    return hm


def _special_ids(hm: HeadModel, config: dict) -> tuple[int, ...]:
    ids = set()
    for key in ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id"):
        v = config.get(key)
        for x in v if isinstance(v, list) else [v]:
            if isinstance(x, int) and 0 <= x < hm.vocab_size:
                ids.add(x)
    if hm.tokenizer is not None:
        for tid, tok in hm.tokenizer.get_added_tokens_decoder().items():
            if tok.special and tid < hm.vocab_size:
                ids.add(int(tid))
    return tuple(sorted(ids))


def load_head_model(path: str | os.PathLike | None = None) -> HeadModel:
    """Load a checkpoint folder (None: the bundled all-MiniLM-L6-v2) as a :class:`HeadModel`.

    Raises:
        FileNotFoundError / ValueError: see :func:`inspect_folder`; a tokenizer.json that does not load.
    """
    if path is None:
        return _load_bert(None)
    info = inspect_folder(path)
    if info.model_type == "bert":
        return _load_bert(info.folder)
    if info.model_type.startswith("headwise-lab"):
        hm = _load_lab(info)
    else:
        try:
            hm = _load_hf(info)
        except (OSError, ValueError, RuntimeError, KeyError, TypeError, ImportError) as e:
            msg = " ".join(str(e).split())
            raise ValueError(f"{info.folder}: cannot load the checkpoint ({msg[:300]})") from None
    if info.tokenizer is not None:
        from tokenizers import Tokenizer

        try:
            hm.tokenizer = Tokenizer.from_file(os.fspath(info.tokenizer))
        except Exception as e:  # tokenizers raises a bare Exception on bad JSON
            raise ValueError(f"{info.tokenizer}: not a valid tokenizer.json ({' '.join(str(e).split())})") from None
        hm.tokenizer.no_padding()
        hm.tokenizer.no_truncation()
    hm.special_ids = _special_ids(hm, info.config)
    if hm.bos_id is not None and not 0 <= hm.bos_id < hm.vocab_size:
        hm.bos_id = None
    return hm

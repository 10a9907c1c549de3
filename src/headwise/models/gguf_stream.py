"""A GGUF file opened without a float32 copy: each part's blocks de-quantised when that part runs.

The cached route (:func:`headwise.models.gguf.gguf_folder`) de-quantises the whole file once through transformers and
keeps a float32 safetensors copy. This route writes nothing: the module is built with its parameters on the ``meta``
device and a :class:`~headwise.models.streamed.LayerStream` brings each layer's tensors in when it runs, read from the
file with ``os.pread`` (nothing mapped, so nothing of the file stays in the process's resident memory) a few MB at a
time, de-quantised by the ``gguf`` package's ``dequantize`` — the function transformers' loader calls — and passed
through transformers' tensor processor of the architecture (llama.cpp's Q/K row permutation undone, Gemma's norms less
one …). The float32 values are therefore the cached route's, bit for bit.

Names are mapped as transformers' ``get_gguf_hf_weights_map`` maps them (the ``gguf`` package's tensor name map, Hugging
Face name → ``blk.N.attn_q.weight``). The config is read from the header alone (transformers' own lean metadata reader,
its GGUF config mapping and defaults), and the tokenizer is built from the header's arrays by transformers' GGUF
tokenizer converter: ``gguf.GGUFReader``, which turns every vocabulary entry into a numpy array (0.16 GB for
SmolLM2's 49,152 tokens), is never opened.

- :class:`GGUFTensors` — the :class:`~headwise.models.streamed.StoredTensors` of a GGUF file.
- :func:`streams` — whether a file's architecture can open this way (:func:`headwise.models.layered.gguf_layered`
  builds the module and its hooks).
- :func:`header_config`, :func:`header_tokenizer` — the config dict and the tokenizer from the header alone.
- :func:`cache_fits` — whether a float32 copy fits the cache directory's disk (else the route is this one).

Shape legend: V vocabulary, D model width, NL layers.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from headwise.models.gguf import GGUFHeader

__all__ = ["GGUFTensors", "cache_fits", "gguf_names", "header_config", "header_tokenizer", "streams"]

#: Stored bytes read and de-quantised at once (the float32 chunk is at most 8× that for 4-bit blocks).
CHUNK = 8 * 2**20
#: Free disk the cache directory keeps after a float32 copy is written (else the copy is not written).
DISK_MARGIN = 2**30

# transformers' tensor processors whose output has the stored shape in torch order (GPT-2's: some transposed);
# the others (mixtures of experts, Mamba, T5, LFM2) change shapes or merge tensors: those files open whole.
_PROCESSED_ALIKE = {"llama", "gemma2", "gemma3", "nemotron", "bloom", "gpt2"}
_GPT2_TRANSPOSED = ("attn_qkv.weight", "ffn_down.weight", "ffn_up.weight", "attn_output.weight")
# config keys whose legacy handling in transformers' load_gguf_checkpoint goes beyond the metadata mapping
_SPECIAL_CONFIG = ("t5", "stablelm", "qwen2moe", "qwen3moe", "gpt-oss", "gpt_oss", "minimax-m2", "lfm2", "gemma4")


def _plain_types() -> dict[int, np.dtype]:
    from gguf import GGMLQuantizationType as T

    return {T.F32: np.float32, T.F16: np.float16, T.F64: np.float64, T.I8: np.int8, T.I16: np.int16,
            T.I32: np.int32, T.I64: np.int64}  # fmt: skip


def _processor_class(architecture: str):
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    return TENSOR_PROCESSORS.get(architecture, TensorProcessor)


def streams(header: GGUFHeader) -> bool:
    """Whether ``header``'s file opens layer by layer here: an architecture transformers loads through its tensor
    processors (not its newer block-kept path) whose processor keeps each tensor's shape, and a config read from the
    metadata mapping alone."""
    from transformers.integrations.gguf.gguf_config_mapping import GGUF_CONFIG_ARCHS  # the block-kept path's
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS

    arch = header.architecture
    if arch in GGUF_CONFIG_ARCHS or any(s in arch for s in _SPECIAL_CONFIG):
        return False
    return arch not in TENSOR_PROCESSORS or arch in _PROCESSED_ALIKE


class GGUFTensors:
    """The tensors of a GGUF file by their GGUF names (``blk.3.attn_q.weight``), de-quantised to float32 per call.

    Args:
        header: the file's :func:`~headwise.models.gguf.read_header`.
        config: the Hugging Face config dict (:func:`header_config`), which the tensor processor reads (head counts).
    A tensor is read ``CHUNK`` stored bytes at a time (whole rows: a block never spans two rows) with ``os.pread``
    and de-quantised into one float32 array, which the architecture's tensor processor then finishes.
    """

    def __init__(self, header: GGUFHeader, config: dict):
        self.header, self.path = header, Path(header.path)
        self.processor = _processor_class(header.architecture)(config=config)
        self._transposed = header.architecture == "gpt2"

    def names(self) -> list[str]:
        return list(self.header.tensors)

    def shape(self, name: str) -> tuple[int, ...]:
        """The tensor's shape as the model holds it: GGUF's dims reversed (torch order)."""
        dims = tuple(reversed(self.header.tensors[name][0]))
        if self._transposed and name.endswith(_GPT2_TRANSPOSED) and len(dims) == 2:
            dims = dims[::-1]
        return dims

    def stored_bytes(self, name: str) -> int:
        return self.header.tensors[name][2]

    def load(self, names: Sequence[str], *, into=None) -> dict:
        """The tensors ``names`` de-quantised to float32 (``into[name]``: written into that tensor of its shape)."""
        import torch

        into = into or {}
        fd = os.open(self.path, os.O_RDONLY)
        try:
            out = {}
            for name in names:
                t = torch.from_numpy(self._finished(name, self._dequantized(fd, name)))
                out[name] = into[name].copy_(t) if name in into else t
            return out
        finally:
            os.close(fd)

    def rows_ok(self, name: str) -> bool:
        """Whether :meth:`load_rows` reads ``name``: the token embedding or the unembedding, a matrix whose rows the
        tensor processors leave as they are."""
        return name in ("token_embd.weight", "output.weight") and len(self.header.tensors[name][0]) == 2

    def load_rows(self, name: str, rows):
        """Rows ``rows`` (sorted, distinct; a tensor or sequence of ints, ``(n,)``) of the matrix ``name`` (``(V, D)``
        in torch order) as a new float32 ``(n, D)`` tensor: each run of consecutive rows read and de-quantised at
        once."""
        import torch

        index = [int(r) for r in rows]
        fd = os.open(self.path, os.O_RDONLY)
        try:
            out = np.empty((len(index), self.shape(name)[-1]), np.float32)  # (n, D)
            k = 0
            while k < len(index):
                end = k + 1
                while end < len(index) and index[end] == index[end - 1] + 1:
                    end += 1
                out[k:end] = self._read_rows(fd, name, index[k], end - k)
                k = end
        finally:
            os.close(fd)
        return torch.from_numpy(self._finished(name, out))

    def _read_rows(self, fd: int, name: str, first: int, n: int) -> np.ndarray:
        """Rows ``first`` … ``first + n - 1`` of a 2-D tensor, de-quantised: ``(n, D)`` float32."""
        from gguf import dequantize

        shape, kind, nbytes = self.header.tensors[name]
        cols, rows = shape[0], shape[1]  # GGUF's order: the row length first
        row_bytes = nbytes // rows
        raw = os.pread(fd, n * row_bytes, self.header.offsets[name] + first * row_bytes)
        if len(raw) != n * row_bytes:
            raise ValueError(f"{self.path}: truncated GGUF file (tensor {name!r} ends past the end of the file)")
        plain = _plain_types().get(kind)
        block = np.frombuffer(raw, plain).reshape(n, cols) if plain else np.frombuffer(raw, np.uint8).reshape(
            n, row_bytes)  # fmt: skip
        return dequantize(block, kind).reshape(n, cols)

    def _dequantized(self, fd: int, name: str) -> np.ndarray:
        """The tensor as float32, in torch order, read and de-quantised a chunk of rows at a time."""
        from gguf import dequantize

        shape, kind, nbytes = self.header.tensors[name]
        dims = tuple(reversed(shape))  # torch order: the last dim is GGUF's first, the one blocks run along
        cols = dims[-1] if dims else 1
        rows = max(1, int(np.prod(dims[:-1], dtype=np.int64)))
        row_bytes = nbytes // rows
        plain = _plain_types().get(kind)
        out = np.empty((rows, cols), np.float32)
        step = max(1, CHUNK // max(1, row_bytes))
        start = self.header.offsets[name]
        for r0 in range(0, rows, step):
            n = min(step, rows - r0)
            raw = os.pread(fd, n * row_bytes, start + r0 * row_bytes)
            if len(raw) != n * row_bytes:
                raise ValueError(f"{self.path}: truncated GGUF file (tensor {name!r} ends past the end of the file)")
            block = np.frombuffer(raw, plain).reshape(n, cols) if plain else np.frombuffer(raw, np.uint8).reshape(
                n, row_bytes)  # fmt: skip
            out[r0 : r0 + n] = dequantize(block, kind).reshape(n, cols)
        return out.reshape(dims)

    def _finished(self, name: str, weights: np.ndarray) -> np.ndarray:
        """The architecture's tensor processor applied (as transformers' loader applies it), contiguous."""
        parsed: dict = {"tensors": {}}
        result = self.processor.process(weights=weights, name=name, tensor_key_mapping={}, parsed_parameters=parsed)
        done = result.weights
        if result.name is None:  # GPT-2's output.weight: put aside under its Hugging Face name
            (done,) = [t.numpy() for t in parsed["tensors"].values()]
        return np.ascontiguousarray(done, dtype=np.float32)


def gguf_names(architecture: str, num_layers: int, hf_names: Sequence[str]) -> dict[str, str]:
    """Hugging Face parameter name → GGUF tensor name, as transformers' ``get_gguf_hf_weights_map`` maps them (the
    ``gguf`` package's ``get_tensor_name_map`` of the architecture; ``.weight`` / ``.bias`` kept). Names it does not
    map are left out."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    arch = next((k for k, v in MODEL_ARCH_NAMES.items() if v == architecture), None)
    if arch is None:
        raise ValueError(f"GGUF architecture {architecture!r} is unknown to the installed gguf package")
    name_map = get_tensor_name_map(arch, num_layers)
    out = {}
    for hf in hf_names:
        base, suffix = hf, ""
        if hf.endswith((".weight", ".bias")):
            base, suffix = hf.rsplit(".", 1)
            suffix = "." + suffix
        found = name_map.get_name(base)
        if found is not None:
            out[hf] = found + suffix
    return out


#: transformers' config defaults for the token ids of the types headwise's own decoder opens (``LlamaConfig``,
#: ``MistralConfig``): what a config.json written from the file holds.
_TOKEN_DEFAULTS = {"llama": {"bos_token_id": 1, "eos_token_id": 2}, "mistral": {"bos_token_id": 1, "eos_token_id": 2}}


def header_config(header: GGUFHeader, *, full: bool = True) -> dict:
    """The Hugging Face ``config.json`` dict of a GGUF file, from its metadata alone — what
    :func:`headwise.models.gguf.gguf_config` gives (transformers' ``load_gguf_checkpoint(return_tensors=False)``),
    read with transformers' lean metadata reader instead of ``gguf.GGUFReader``: the metadata mapping
    (``GGUF_CONFIG_MAPPING``), its defaults, ``tie_word_embeddings`` from the absence of ``output.weight``, the
    vocabulary's length where ``vocab_size`` is missing; then ``AutoConfig.for_model``.

    ``full=False``: the mapped keys and the token ids' defaults alone, for headwise's own Llama decoder (which fills
    the rest with transformers' defaults itself) — without ``AutoConfig``, whose import holds 0.06 GB.
    """
    from transformers.integrations.gguf import read_gguf_metadata
    from transformers.modeling_gguf_pytorch_utils import GGUF_CONFIG_DEFAULTS_MAPPING, GGUF_TO_TRANSFORMERS_MAPPING

    metadata, tensor_names = read_gguf_metadata(os.fspath(header.path))
    arch = metadata["general.architecture"]
    name = metadata.get("general.name")
    updated = "mistral" if "llama" in arch and name == "mistral" else arch  # as load_gguf_checkpoint reads it
    config: dict = {"tie_word_embeddings": "output.weight" not in tensor_names or arch in ("falcon", "bloom")}
    for key, value in GGUF_CONFIG_DEFAULTS_MAPPING.get(updated, GGUF_CONFIG_DEFAULTS_MAPPING.get(arch) or {}).items():
        config.setdefault(key, value)
    renames = GGUF_TO_TRANSFORMERS_MAPPING["config"]
    for key, value in metadata.items():
        key = key.replace(arch, updated)
        prefix, _, rest = key.partition(".")
        if isinstance(value, str) and arch in value:
            value = value.replace(arch, updated)
        target = renames.get(prefix, {}).get(rest)
        if target is not None and target != -1:
            config[target] = value
    if config.get("model_type") == "gemma3":
        config["model_type"] = "gemma3_text"
    if "vocab_size" not in config and "tokenizer.ggml.tokens" in metadata:
        config["vocab_size"] = int(metadata["tokenizer.ggml.tokens"])  # the reader gives a string array's length
    config.pop("_model_name_or_path", None)  # as gguf_config drops it
    if not full:
        return {**_TOKEN_DEFAULTS.get(config["model_type"], {}), **config}
    from transformers import AutoConfig

    model_type = config.pop("model_type")
    return AutoConfig.for_model(model_type, **config).to_dict()


def header_tokenizer(header: GGUFHeader):
    """The file's tokenizer (a ``tokenizers.Tokenizer``, no padding or truncation), built as transformers builds a
    GGUF tokenizer (``get_gguf_tokenizer``: the vocabulary and merges read from the header alone;
    ``convert_gguf_tokenizer``).

    Raises:
        ValueError: a tokenizer type transformers cannot build, naming the file.
    """
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer, get_gguf_tokenizer

    try:
        arch, tokens, _ = get_gguf_tokenizer(os.fspath(header.path))
        tokenizer, _ = convert_gguf_tokenizer(arch, tokens)
    except (ValueError, KeyError) as e:
        raise ValueError(f"{header.path}: cannot build the tokenizer ({' '.join(str(e).split())})") from None
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def cache_fits(header: GGUFHeader, root: Path) -> bool:
    """Whether a float32 copy of ``header``'s model (4 bytes a parameter) fits the free disk of the cache directory
    ``root`` (its nearest existing parent) with :data:`DISK_MARGIN` to spare."""
    where = Path(root)
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        return True  # the cache's own write names what is wrong with it
    return 4 * header.num_parameters + DISK_MARGIN <= free

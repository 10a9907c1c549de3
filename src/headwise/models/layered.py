"""The route a checkpoint opens on under a memory budget, and the models opened layer by layer.

:func:`memory_route` decides, before any weight is read: the whole model in float32 when it fits the budget
(:func:`headwise.models.memory.plan_memory`), else — for a Hugging Face family or headwise's own Llama decoder stored
as safetensors — a module whose parameters stay on the ``meta`` device and whose layers are brought in one at a time
(:class:`headwise.models.streamed.LayerStream`). Other kinds (headwise's BERT, a lab checkpoint) open whole or are
refused in one line naming the memory they need.

Shape legend: NL layers.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from dataclasses import dataclass

from headwise.models.folder import FolderInfo
from headwise.models.memory import MemoryPlan, plan_memory

__all__ = ["Layered", "gguf_layered", "hf_class", "memory_route", "native_stream", "hf_stream", "sharded_hidden_states"]


@dataclass
class Layered:
    """A module opened layer by layer: the module (meta parameters, hooks attached) and its :class:`LayerStream`."""

    model: object
    stream: object


def _file_bytes(info: FolderInfo) -> int:
    return sum(os.path.getsize(p) for p in info.weights)


def memory_route(
    info: FolderInfo,
    max_memory,
    *,
    native: bool,
    by_layer: bool | None = None,
    cache: bool = True,
) -> tuple[MemoryPlan, Layered | None]:
    """The :class:`MemoryPlan` of a checked source (:func:`headwise.models.inspect_source`) under ``max_memory``, and
    the layer-by-layer module when the plan says ``"layers"`` (None for ``"whole"``: the usual loaders open it).

    Args:
        info: the source; max_memory: the budget (a size, ``"1.5GB"``; None: what the machine has free, with a
            margin); native: headwise's own Llama decoder (``backend="headwise"``).
        by_layer: True: layer by layer whatever the budget (where the kind allows; to compare the routes); False:
            whole, planned against the budget all the same; None: as the budget says.
        cache: a GGUF file: False (no float32 copy cached) lets it go layer by layer, its blocks de-quantised when
            their layer runs (:mod:`headwise.models.gguf_stream`; ``info.config``: the file's config already read).
    Raises:
        MemoryBudgetError (a ValueError): a budget that is not a size or is smaller than the smallest that works,
            naming that smallest budget (and carrying it, the budget and the route).
    """
    subject = info.name or info.folder.name
    whole = 4 * info.num_parameters + _file_bytes(info)
    build = _builder(info, native, cache)
    if build is not None and by_layer is not False:
        plan = None
        if not by_layer:  # the whole route, when it fits, without building anything
            try:
                plan = plan_memory(max_memory, whole=whole, units=None, subject=subject)
            except ValueError:
                plan = None
        if plan is not None:
            return plan, None
        layered = build()
        stream = layered.stream
        whole = stream.whole_bytes() + _file_bytes(info)
        plan = plan_memory(max_memory, whole=whole, units=stream.sizes(), subject=subject)
        if by_layer and plan.route == "whole":
            plan = dataclasses.replace(plan, route="layers")
        if plan.route == "layers":
            stream.attach()
            return plan, layered
        return plan, None
    return plan_memory(max_memory, whole=whole, units=None, subject=subject), None


def _builder(info: FolderInfo, native: bool, cache: bool):
    """What builds ``info``'s layer-by-layer model, or None where it cannot go layer by layer."""
    if info.kind == "hf":
        return (lambda: native_stream(info)) if native else (lambda: hf_stream(info))
    if info.kind == "gguf" and not cache:
        from headwise.models import gguf_stream

        if gguf_stream.streams(info.header):
            config = info.config if "num_hidden_layers" in info.config else None
            return lambda: gguf_layered(info.header, native=native, config=config)
    return None


def native_stream(info: FolderInfo) -> Layered:
    """headwise's :class:`~headwise.models.llama.LlamaLM` of a Llama-family folder on the meta device, its layers read
    from the safetensors files when they run (names as :func:`~headwise.models.llama.load_llama` maps them)."""
    import torch

    from headwise.models.llama import LlamaConfig, LlamaLM, hf_names
    from headwise.models.streamed import LayerStream, SafetensorsTensors

    cfg = LlamaConfig.from_dict(info.config, source=str(info.folder / "config.json"))
    model = LlamaLM(cfg, device="meta", dtype=torch.float32).eval()
    names = hf_names(cfg)
    if cfg.tie_word_embeddings:
        names["lm_head.weight"] = names["embed_tokens.weight"]
    stream = LayerStream(model, SafetensorsTensors(info.weights), names.get, where=str(info.folder))
    return Layered(model, stream)


def hf_stream(info: FolderInfo) -> Layered:
    """A Hugging Face model of a folder on headwise's attention backend, built with meta parameters
    (:func:`~headwise.models.streamed.meta_parameters`), its layers read from the safetensors files when they run.
    A parameter is read under its own name, the name of a parameter tied to it, or its name with / without the base
    model's prefix."""
    import torch
    from transformers import AutoConfig
    from transformers.utils import logging as hf_logging

    import headwise.hf
    from headwise.models.streamed import LayerStream, SafetensorsTensors, meta_parameters

    kind, cls = hf_class(info.config)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings(), meta_parameters():
            warnings.simplefilter("ignore")
            config = AutoConfig.from_pretrained(os.fspath(info.folder))
            model = cls.from_config(config, attn_implementation=headwise.hf.NAME, dtype=torch.float32)
    finally:
        hf_logging.set_verbosity(verbosity)
    model.eval()
    tensors = SafetensorsTensors(info.weights)
    stored = set(tensors.names())
    renamed = _renamed(model, stored)  # the model's name -> the stored one, where transformers renames on loading
    prefix = getattr(model, "base_model_prefix", "") or ""
    tied: dict[int, list[str]] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        tied.setdefault(id(p), []).append(n)
    params = dict(model.named_parameters(remove_duplicate=False))

    def stored_name(full: str) -> str | None:
        for n in [full, *tied.get(id(params.get(full)), [])]:
            for candidate in (n, renamed.get(n), n.removeprefix(prefix + "."), f"{prefix}.{n}"):
                if candidate in stored:
                    return candidate
        return None

    stream = LayerStream(model, tensors, stored_name, where=str(info.folder))
    return Layered(model, stream)


def gguf_layered(header, *, native: bool, config: dict | None = None) -> Layered:
    """The model of a GGUF file on the ``meta`` device, its layers de-quantised from the file when they run.

    Args:
        header: the file's :class:`~headwise.models.gguf.GGUFHeader` (:func:`~headwise.models.gguf_stream.streams`
            true for it).
        native: headwise's :class:`~headwise.models.llama.LlamaLM` (a Llama-family file; transformers' modelling code
            is not imported), else the Hugging Face model on headwise's attention backend.
        config: the file's :func:`~headwise.models.gguf_stream.header_config`, if already read.
    Returns:
        the :class:`~headwise.models.layered.Layered` model, its stream not attached yet.
    Raises:
        ValueError: a config headwise's decoder does not open (``native``), naming the file.
    """
    from headwise.models.gguf_stream import GGUFTensors, gguf_names, header_config
    from headwise.models.streamed import LayerStream

    config = config or header_config(header, full=not native)
    tensors = GGUFTensors(header, config)
    where = str(header.path)
    if native:
        import torch

        from headwise.models.llama import LlamaConfig, LlamaLM, hf_names

        cfg = LlamaConfig.from_dict(config, source=where)
        model = LlamaLM(cfg, device="meta", dtype=torch.float32).eval()
        names = hf_names(cfg)
        if cfg.tie_word_embeddings:
            names["lm_head.weight"] = names["embed_tokens.weight"]
        to_gguf = gguf_names(header.architecture, cfg.num_hidden_layers, names.values())
        stored = {mine: to_gguf.get(theirs) for mine, theirs in names.items()}
        return Layered(model, LayerStream(model, tensors, stored.get, where=where))
    model = _gguf_meta_model(config)
    params = dict(model.named_parameters(remove_duplicate=False))
    to_gguf = gguf_names(header.architecture, config["num_hidden_layers"], params)
    tied: dict[int, list[str]] = {}
    for n, p in params.items():
        tied.setdefault(id(p), []).append(n)

    def stored_name(full: str) -> str | None:  # a tied matrix is read under the name the file holds it by
        for n in tied.get(id(params.get(full)), [full]):
            if to_gguf.get(n) in header.tensors:
                return to_gguf[n]
        return to_gguf.get(full)

    return Layered(model, LayerStream(model, tensors, stored_name, where=where))


def _gguf_meta_model(config: dict):
    """The Hugging Face causal LM of ``config`` with meta parameters, attention on headwise's backend."""
    import warnings

    import torch
    from transformers import AutoConfig
    from transformers.utils import logging as hf_logging

    import headwise.hf
    from headwise.models.streamed import meta_parameters

    _, cls = hf_class(config)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings(), meta_parameters():
            warnings.simplefilter("ignore")
            rest = {k: v for k, v in config.items() if k != "model_type"}
            cfg = AutoConfig.for_model(config["model_type"], **rest)
            model = cls.from_config(cfg, attn_implementation=headwise.hf.NAME, dtype=torch.float32)
    finally:
        hf_logging.set_verbosity(verbosity)
    return model.eval()


def _renamed(model, stored: set[str]) -> dict[str, str]:
    """The renamings transformers applies to a checkpoint's names when it loads one (``WeightRenaming`` s of
    ``get_model_conversion_mapping``: GPT-NeoX's ``embed_out`` → ``lm_head``, legacy ``gamma`` / ``beta``), as a map
    from the model's names to the stored ones. Conversions that merge or split tensors are not followed (a parameter
    they make is then named missing)."""
    import re

    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightRenaming

        rules = [
            (re.compile(src), tgt)
            for t in get_model_conversion_mapping(model)
            if isinstance(t, WeightRenaming) and not getattr(t, "scope_prefix", None)
            for src, tgt in zip(t.source_patterns, t.target_patterns)
        ]
    except (ImportError, AttributeError, TypeError):  # another transformers: the names as they are
        return {}
    out = {}
    for name in stored:
        new = name
        for pattern, target in rules:
            new = pattern.sub(target, new)
        if new != name:
            out[new] = name
    return out


def hf_class(config: dict):
    """``("decoder", AutoModelForCausalLM)`` for a causal LM's config (its ``architectures``, or a type without a
    masked-LM class), else ``("encoder", AutoModel)``."""
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


def sharded_hidden_states(model, ids, attention_mask=None, *, group=None):
    """headwise's :class:`~headwise.models.llama.LlamaLM` run as layer shards over the ranks of ``group``
    (:func:`headwise.distributed.layer_shards.run_stages`): rank 0 embeds ``ids`` ``(B, L)`` and runs its blocks,
    each next rank its own (:func:`~headwise.distributed.layer_shards.shard_layers`), the last one the final norm.
    Opened layer by layer, a rank brings in its own units alone. Returns the final hidden states ``(B, L, D)`` on
    every rank — ``model.hidden_states(ids, attention_mask)`` of one process.

    Raises:
        TypeError: a model other than headwise's Llama decoder; ValueError: bad ids (as ``hidden_states``), fewer
            layers than ranks.
    """
    import torch
    import torch.distributed as dist

    from headwise.distributed.layer_shards import run_stages, shard_layers
    from headwise.models.llama import LlamaLM

    if not isinstance(model, LlamaLM):
        raise TypeError(f"model: layer shards run headwise's LlamaLM, got {type(model).__name__}")
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("sharded_hidden_states: no process group; call headwise.distributed.init_from_env() first")
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    a, b = shard_layers(len(model.layers), world)[rank]
    padding = model._check(ids, attention_mask)

    def stage(h):
        with torch.no_grad():
            x = model.embed_tokens(ids) if h is None else h  # (B, L, D)
            for layer in model.layers[a:b]:
                x = layer(x, key_padding_mask=padding)  # (B, L, D)
            return model.norm(x) if rank == world - 1 else x

    return run_stages(stage, (*ids.shape, model.config.hidden_size), group=group)

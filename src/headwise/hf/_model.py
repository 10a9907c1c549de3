"""What capture and ablation share: finding a model's attention layers, and running it on headwise.

Shape legend: H query heads.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from torch import nn

from headwise.checks import layer_number
from headwise.hf.backend import NAME, calls_interface, hook_points
from headwise.points import NamedPoints


def family(model: nn.Module) -> str:
    """The model's family: its config's ``model_type`` (``"llama"``, ``"bert"`` …) or its class name."""
    config = getattr(model, "config", None)
    return getattr(config, "model_type", None) or type(model).__name__


def attention_layers(model: nn.Module) -> list[nn.Module]:
    """The attention modules that call transformers' attention interface, in ``model.modules()`` order.

    Their positions in this list are the layer numbers of :func:`headwise.hf.capture` and
    :func:`headwise.hf.ablate` (for a decoder-only or encoder-only model, the block index).

    Raises:
        TypeError: ``model`` is not a transformers ``PreTrainedModel``.
        ValueError: the family writes its own attention (Falcon, BLOOM, MPT …), named in the message.
    """
    from transformers import PreTrainedModel

    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"model: expected a transformers PreTrainedModel, got {type(model).__name__}")
    layers = [m for m in model.modules() if calls_interface(type(m))]
    if not layers or not type(model)._can_set_attn_implementation():
        raise ValueError(
            f"model: the {family(model)!r} family writes its own attention instead of calling transformers' "
            f"AttentionInterface, so it cannot run on {NAME!r} attention"
        )
    return layers


def num_heads(module: nn.Module) -> int:
    """H, the query heads of one attention module (its own attribute, else its config's)."""
    for name in ("num_heads", "num_attention_heads", "n_heads"):
        value = getattr(module, name, None)
        if isinstance(value, int) and value > 0:
            return value
    config = getattr(module, "config", None)
    value = getattr(config, "num_attention_heads", None)
    if isinstance(value, int) and value > 0:
        return value
    raise ValueError(f"model: cannot tell how many heads the {type(module).__name__} attention module has")


def named_points(model: nn.Module) -> NamedPoints:
    """The named hook points of a Hugging Face model (:mod:`headwise.points`): its attention layers'
    :func:`headwise.hf.backend.hook_points`, its blocks' and MLPs' inputs and outputs. They act while the model
    runs on headwise's attention (:func:`on_headwise`).

    Raises:
        TypeError / ValueError: as :func:`attention_layers`.
    """
    return NamedPoints(model, attention_layers(model), hook_points)


def _configs(model: nn.Module) -> list:
    """Every config object whose ``_attn_implementation`` steers part of ``model`` (sub-configs included)."""
    from transformers import PreTrainedModel

    found: dict[int, object] = {}
    stack = [m.config for m in model.modules() if isinstance(m, PreTrainedModel)]
    while stack:
        config = stack.pop()
        if config is None or id(config) in found:
            continue
        found[id(config)] = config
        for key in getattr(config, "sub_configs", {}) or {}:
            stack.append(getattr(config, key, None))
    return list(found.values())


@contextmanager
def on_headwise(model: nn.Module) -> Iterator[None]:
    """Run ``model`` on headwise attention inside the block; put back every config's own implementation after,
    also when the block raises."""
    saved = [(c, getattr(c, "_attn_implementation_internal", None)) for c in _configs(model)]
    try:
        model.set_attn_implementation(NAME)
        yield
    finally:
        for config, implementation in saved:
            config._attn_implementation_internal = implementation


def layer_selection(name: str, layers, count: int) -> list[int]:
    """Sorted, distinct layer numbers from ``layers`` (None = all), each checked against ``count``."""
    if layers is None:
        return list(range(count))
    if isinstance(layers, (int, Mapping)) or not hasattr(layers, "__iter__"):
        raise TypeError(f"{name}: expected an iterable of layer numbers or None, got {layers!r}")
    return sorted({layer_number(name, layer, count) for layer in layers})

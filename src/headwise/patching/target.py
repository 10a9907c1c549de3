"""What patching needs from a model: a forward ``ids -> logits`` and each attention layer's ``hook_heads``.

Shape legend: B batch, L length, V vocabulary, NL attention layers, H query heads, Dh head width.

:func:`as_target` accepts, and tells apart:

- a Hugging Face ``PreTrainedModel`` with a language-model head (``…ForCausalLM``) running on headwise's
  attention backend (``attn_implementation="headwise"``): its attention layers are
  :func:`headwise.hf.attention_layers`, their points :func:`headwise.hf.backend.hook_points`;
- a :class:`~headwise.models.HeadModel` (what :func:`headwise.models.open_model` returns): its module;
- any ``nn.Module`` built from headwise's attention modules (the lab's ``TransformerLM``, a stack of
  :class:`~headwise.core.layers.DecoderLayer`): every submodule with a ``hook_heads``
  :class:`~headwise.core.hooks.HookPoint`, in ``modules()`` order; ``module(ids)`` must return the logits
  (or a tuple whose first item they are).

Patching acts only at ``hook_heads``: the per-head outputs ``(B, H, L, Dh)`` where the heads meet the output
projection (``Wo``, ``o_proj``, GPT-2's ``c_proj``). Query heads are counted, so a GQA model's heads that
share keys and values are patched one by one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from headwise.core.hooks import HookPoint

__all__ = ["Target", "as_target"]


@dataclass
class Target:
    """A model ready for patching.

    Attributes:
        module: the ``nn.Module`` that runs.
        attention: the NL attention modules, in layer order.
        points: each layer's ``hook_heads`` point.
        num_heads: H of each layer (query heads).
        family: the config's ``model_type`` for Hugging Face models, else the module's class name.
        hf: whether ``module`` is a Hugging Face model.
    """

    module: nn.Module
    attention: list[nn.Module]
    points: list[HookPoint]
    num_heads: list[int]
    family: str
    hf: bool = False
    _device: torch.device | None = field(default=None, repr=False)

    @property
    def num_layers(self) -> int:
        return len(self.points)

    @property
    def max_heads(self) -> int:
        return max(self.num_heads)

    @property
    def device(self) -> torch.device:
        param = next(self.module.parameters(), None)
        return param.device if param is not None else torch.device("cpu")

    def logits(self, ids: Tensor, *, last_only: bool = False) -> Tensor:
        """``ids (B, L)`` -> logits ``(B, L, V)`` (the model's final logits, soft-capping included).

        ``last_only``: a Hugging Face model computes the last position's logits alone (``logits_to_keep=1``:
        ``(B, 1, V)``, the unembedding of one position instead of L); headwise's modules return all L.
        """
        if self.hf:
            keep = {"logits_to_keep": 1} if last_only else {}
            return self.module(input_ids=ids, use_cache=False, **keep).logits
        out = self.module(ids)
        return out[0] if isinstance(out, (tuple, list)) else out

    def check_layer_head(self, layer, head) -> tuple[int, int]:
        """``(layer, head)`` if both are ints in range; else ValueError / TypeError naming the value."""
        for name, value in (("layer", layer), ("head", head)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name}: expected an int, got {value!r}")
        if not 0 <= layer < self.num_layers:
            raise ValueError(
                f"layer: {layer} is out of range: the model has {self.num_layers} attention layers "
                f"(0..{self.num_layers - 1})"
            )
        H = self.num_heads[layer]
        if not 0 <= head < H:
            raise ValueError(f"head: {head} is out of range in layer {layer}, which has {H} heads (0..{H - 1})")
        return layer, head


def _is_hf(model) -> bool:
    try:
        from transformers import PreTrainedModel
    except ImportError:  # pragma: no cover - the hf extra is missing
        return False
    return isinstance(model, PreTrainedModel)


def _from_hf(model: nn.Module) -> Target:
    from headwise.hf import NAME, attention_layers, family, num_heads
    from headwise.hf.backend import hook_points

    modules = attention_layers(model)
    implementation = getattr(model.config, "_attn_implementation", None)
    if implementation != NAME:
        raise ValueError(
            f"model: runs on {implementation!r} attention; patching acts where heads meet the output projection "
            f"on headwise's backend: load it with attn_implementation={NAME!r} (after import headwise.hf) or call "
            f"model.set_attn_implementation({NAME!r})"
        )
    if model.get_output_embeddings() is None:
        raise ValueError(
            f"model: the {family(model)!r} model has no language-model head (load it with AutoModelForCausalLM): "
            "the metric reads logits"
        )
    return Target(
        module=model,
        attention=modules,
        points=[hook_points(m).hook_heads for m in modules],
        num_heads=[num_heads(m) for m in modules],
        family=family(model),
        hf=True,
    )


def _from_modules(model: nn.Module) -> Target:
    modules = [m for m in model.modules() if isinstance(getattr(m, "hook_heads", None), HookPoint)]
    if not modules:
        raise ValueError(
            f"model: no attention module with a hook_heads point in the {type(model).__name__}: expected "
            "headwise's attention modules or a Hugging Face model on headwise's backend"
        )
    return Target(
        module=model,
        attention=modules,
        points=[m.hook_heads for m in modules],
        num_heads=[int(m.num_heads) for m in modules],
        family=type(model).__name__,
    )


def as_target(model) -> Target:
    """The :class:`Target` of ``model`` (see the module docstring for what is accepted).

    Raises:
        TypeError: not a module, a HeadModel or a Target.
        ValueError: a Hugging Face model not on headwise's attention, or without a language-model head; a
            module with no headwise attention inside; a family that writes its own attention (named).
    """
    if isinstance(model, Target):
        return model
    inner = getattr(model, "model", None)
    if not isinstance(model, nn.Module) and isinstance(inner, nn.Module) and hasattr(model, "head_points"):
        return as_target(inner)  # a HeadModel: patch the module it holds
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected an nn.Module, a HeadModel or a Target, got {type(model).__name__}")
    return _from_hf(model) if _is_hf(model) else _from_modules(model)

"""What patching needs from a model: the model view (:class:`headwise.models.HeadModel`) with a language-model head.

Shape legend: B batch, L length, V vocabulary, NL attention layers, H query heads, Dh head width.

:func:`as_target` accepts:

- a Hugging Face ``PreTrainedModel`` with a language-model head (``…ForCausalLM``) running on headwise's
  attention backend (``attn_implementation="headwise"``);
- a :class:`~headwise.models.HeadModel` (what :func:`headwise.models.open_model` returns), as it is;
- any ``nn.Module`` built from headwise's attention modules (the lab's ``TransformerLM``, a stack of
  :class:`~headwise.core.layers.DecoderLayer`): every submodule with a ``hook_heads``
  :class:`~headwise.core.hooks.HookPoint`, in ``modules()`` order; ``module(ids)`` must return the logits
  (or a tuple whose first item they are).

and returns the view built by its one constructor. Patching acts only at ``layers.{i}.attn.heads``: the per-head
outputs ``(B, H, L, Dh)`` where the heads meet the output projection (``Wo``, ``o_proj``, GPT-2's ``c_proj``).
Query heads are counted, so a GQA model's heads that share keys and values are patched one by one.
"""

from __future__ import annotations

from headwise.models.head_model import HeadModel

__all__ = ["as_target"]


def as_target(model) -> HeadModel:
    """The model view of ``model`` (see the module docstring for what is accepted).

    Raises:
        TypeError: not a module or a HeadModel.
        ValueError: a Hugging Face model not on headwise's attention, or without a language-model head; a
            module with no headwise attention inside; a family that writes its own attention (named).
    """
    view = model if isinstance(model, HeadModel) else HeadModel(model)
    if view.hf and view.model.get_output_embeddings() is None:
        raise ValueError(
            f"model: the {view.family!r} model has no language-model head (load it with AutoModelForCausalLM): "
            "the metric reads logits"
        )
    return view

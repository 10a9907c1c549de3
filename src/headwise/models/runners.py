"""The runners: how each backend a :class:`~headwise.models.HeadModel` holds runs, chosen once (:func:`runner_for`).

Shape legend: B batch, L padded length, V vocabulary, H heads, NL layers.

A runner is the only place that knows how its backend runs a forward pass, reads rows without the language-model
head, forms every layer's weights or computes the last position's logits alone, and where its attention modules and
their hook points are:

- headwise's own modules — a decoder run as ``module(ids)`` (the lab's ``TransformerLM``, any stack of headwise's
  attention modules), headwise's :class:`~headwise.models.llama.LlamaLM` (``hidden_states`` for a pass whose logits
  nobody reads) and headwise's BERT (an encoder);
- a Hugging Face ``PreTrainedModel`` on headwise's attention backend (refused, by name, on another attention).
"""

from __future__ import annotations

import contextlib
import sys

__all__ = ["MAX_ANALYSIS_LENGTH", "runner_for"]

#: Longest input an encoder is analysed on (tokens): its maps are L × L per head. Decoders are read by the
#: streaming pass (:mod:`headwise.analysis.streaming`) up to their context.
MAX_ANALYSIS_LENGTH = 1024


# -- the runners, one per backend ---------------------------------------------------------------------------------


class _Headwise:
    """A module built from headwise's attention modules: a decoder ``module(ids) -> logits`` (or a tuple whose
    first item they are)."""

    backend = "headwise"
    kind = "decoder"

    def attention(self, model) -> list:
        from headwise.core.hooks import HookPoint

        modules = [m for m in model.modules() if isinstance(getattr(m, "hook_heads", None), HookPoint)]
        if not modules:
            raise ValueError(
                f"model: no attention module with a hook_heads point in the {type(model).__name__}: expected "
                "headwise's attention modules or a Hugging Face model on headwise's backend"
            )
        return modules

    def points(self, model, attention: list, provider):
        from headwise.points import NamedPoints

        return NamedPoints(model, attention, _itself, provider)

    def num_heads(self, module) -> int:
        return int(module.num_heads)

    def family(self, model) -> str:
        return type(model).__name__

    def max_length(self, model, kind: str) -> int:
        return int(getattr(model, "context_length", None) or MAX_ANALYSIS_LENGTH)

    def vocab_size(self, model) -> int | None:
        value = getattr(model, "vocab_size", None)
        return int(value) if value is not None else None

    def bos_id(self, model) -> int | None:
        return None

    def run(self, model, ids, mask):
        """The output (logits for a decoder, last hidden states for an encoder)."""
        out = model(ids)
        return out[0] if isinstance(out, (tuple, list)) else out

    def logits(self, model, ids, last_only: bool):
        return self.run(model, ids, None)

    def read(self, model, ids, mask) -> None:
        """One pass whose output nobody reads (hooked points do)."""
        model(ids)

    def attentions(self, model, ids, mask) -> list:
        return list(model(ids, need_weights=True)[1])

    def math_path(self, attention: list, on: bool):
        return _on_math_path(attention if on else [])


class _HeadwiseEncoder(_Headwise):
    """headwise's BERT: ``module(ids, mask, output_attentions=…)`` -> :class:`~headwise.models.BertOutput`."""

    kind = "encoder"

    def family(self, model) -> str:
        return "bert"

    def max_length(self, model, kind: str) -> int:
        return min(int(model.config.max_position_embeddings), MAX_ANALYSIS_LENGTH)

    def vocab_size(self, model) -> int:
        return int(model.config.vocab_size)

    def run(self, model, ids, mask):
        return model(ids, mask, output_attentions=False).last_hidden_state

    def read(self, model, ids, mask) -> None:
        model(ids, mask)

    def attentions(self, model, ids, mask) -> list:
        return list(model(ids, mask, output_attentions=True).attentions)


class _HeadwiseLM(_Headwise):
    """headwise's :class:`~headwise.models.llama.LlamaLM`: ``module(ids, mask)`` -> logits, and
    ``module.hidden_states(ids, mask)`` for a pass whose logits nobody reads (no ``(L, V)`` unembedding)."""

    def max_length(self, model, kind: str) -> int:
        return int(model.context_length)

    def bos_id(self, model) -> int | None:
        return model.config.bos_token_id

    def run(self, model, ids, mask):
        return model(ids, mask)

    def logits(self, model, ids, last_only: bool):
        if not last_only:
            return model(ids)
        return model.lm_head(model.hidden_states(ids)[:, -1:])  # (B, 1, V)

    def read(self, model, ids, mask) -> None:
        model.hidden_states(ids, mask)

    def attentions(self, model, ids, mask) -> list:
        return list(model.hidden_states(ids, mask, need_weights=True)[1])  # no (L, V) unembedding nobody reads


class _HuggingFace:
    """A transformers ``PreTrainedModel`` on headwise's attention backend."""

    backend = "hf+headwise"

    def __init__(self, model):
        import headwise.hf

        implementation = getattr(model.config, "_attn_implementation", None)
        if implementation != headwise.hf.NAME:
            raise ValueError(
                f"model: runs on {implementation!r} attention; the named points act where heads meet the output "
                f"projection on headwise's backend: load it with attn_implementation={headwise.hf.NAME!r} (after "
                f"import headwise.hf) or call model.set_attn_implementation({headwise.hf.NAME!r})"
            )
        self.kind = "decoder" if type(model).__name__.endswith(("ForCausalLM", "LMHeadModel")) else "encoder"

    def attention(self, model) -> list:
        import headwise.hf

        return headwise.hf.attention_layers(model)

    def points(self, model, attention: list, provider):
        from headwise.hf.backend import hook_points
        from headwise.points import NamedPoints

        return NamedPoints(model, attention, hook_points, provider)

    def num_heads(self, module) -> int:
        import headwise.hf

        return headwise.hf.num_heads(module)

    def family(self, model) -> str:
        import headwise.hf

        return headwise.hf.family(model)

    @staticmethod
    def _text_config(model):
        c = model.config
        return c.get_text_config() if hasattr(c, "get_text_config") else c

    def max_length(self, model, kind: str) -> int:
        positions = getattr(self._text_config(model), "max_position_embeddings", None) or MAX_ANALYSIS_LENGTH
        return int(positions if kind == "decoder" else min(positions, MAX_ANALYSIS_LENGTH))

    def vocab_size(self, model) -> int:
        return int(self._text_config(model).vocab_size)

    def bos_id(self, model) -> int | None:
        return getattr(self._text_config(model), "bos_token_id", None)

    def run(self, model, ids, mask):
        out = model(input_ids=ids, attention_mask=mask)  # a causal LM's logits, an encoder's hidden states
        logits = getattr(out, "logits", None)
        return logits if logits is not None else out.last_hidden_state

    def logits(self, model, ids, last_only: bool):
        keep = {"logits_to_keep": 1} if last_only else {}
        return model(input_ids=ids, use_cache=False, **keep).logits

    def read(self, model, ids, mask) -> None:
        """The base model (no language-model head: an 8,192-token pass would otherwise form ``(L, V)`` logits
        nobody reads)."""
        base = getattr(model, "base_model", None) or model
        base(input_ids=ids, attention_mask=mask)

    def attentions(self, model, ids, mask) -> list:
        import headwise.hf

        with headwise.hf.capture(model) as attn:
            model(input_ids=ids, attention_mask=mask)
        return list(attn.weights)

    def math_path(self, attention: list, on: bool):
        return contextlib.nullcontext()


def _itself(module):
    return module


def runner_for(model):
    from torch import nn

    if not isinstance(model, nn.Module):
        raise TypeError(
            "model: expected an nn.Module (headwise's modules, or a Hugging Face model on headwise's attention), "
            f"got {type(model).__name__}"
        )
    if "transformers.modeling_utils" in sys.modules:  # no PreTrainedModel before its module is imported (importing
        try:  # it for the check would hold 0.12 GB: a GGUF file read layer by layer imports transformers' GGUF parts)
            from transformers import PreTrainedModel
        except ImportError:  # pragma: no cover - the hf extra is missing
            PreTrainedModel = ()  # noqa: N806
        if isinstance(model, PreTrainedModel):
            return _HuggingFace(model)
    from headwise.models.bert import BertEncoder
    from headwise.models.llama import LlamaLM

    if isinstance(model, LlamaLM):
        return _HeadwiseLM()
    return _HeadwiseEncoder() if isinstance(model, BertEncoder) else _Headwise()


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

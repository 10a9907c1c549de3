"""What the analysis calls on a model it is handed: the protocol, declared (the analysis opens no model).

Shape legend: B batch, L length, NL layers, H heads per layer, V vocabulary, D model width.

:class:`headwise.models.HeadModel` satisfies both protocols (a test checks it); a test double needs only the
part it stands in for. The protocols list exactly the attributes and methods ``analysis/`` uses — nothing of
``models/`` is imported here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Protocol, runtime_checkable

__all__ = ["RowModel", "GatedModel", "SweptModel", "AnalysedModel"]


@runtime_checkable
class RowModel(Protocol):
    """What the streaming pass (:func:`headwise.analysis.streaming.read_rows`) needs: the head counts and one
    forward pass with a reader hooked on each layer's ``layers.{i}.attn.qk`` point."""

    num_layers: int
    num_heads: int

    def read_rows(self, ids, mask, readers: Sequence[Callable]) -> None:
        """Run ``ids (B, L)`` once (no gradient) with ``readers[layer]`` on each layer's rows."""
        ...


@runtime_checkable
class GatedModel(Protocol):
    """What head importance (:mod:`headwise.analysis.importance`) needs: the kind, the head counts, the module
    (its parameters' dtype), a forward pass and gates where the heads meet W_O."""

    kind: str
    num_layers: int
    num_heads: int
    model: object

    def forward(self, ids, mask=None, *, math_path: bool = False):
        """Logits ``(B, L, V)`` of a decoder, last hidden states ``(B, L, D)`` of an encoder."""
        ...

    def gated(self, gates) -> AbstractContextManager[None]:
        """Within the block, each head's output multiplied by ``gates (NL, H)`` or ``(B, NL, H)``."""
        ...


@runtime_checkable
class SweptModel(GatedModel, Protocol):
    """What the batched sweep (:mod:`headwise.analysis.batched`, the ablations and curves of
    :mod:`headwise.analysis.importance`) needs besides :class:`GatedModel`: the named points and hooks on them."""

    points: Mapping
    """The named points (``name -> Point`` with ``.module``): the sweep copies rows at a block's
    ``layers.{l}.resid_pre``."""

    def hooks(self, fns) -> AbstractContextManager[None]:
        """Within the block, ``fns[name]`` hooked at each named point (``fn(tensor) -> replacement or None``)."""
        ...


@runtime_checkable
class AnalysedModel(RowModel, SweptModel, Protocol):
    """Everything the analysis calls on a model (:class:`RowModel`, :class:`GatedModel` and :class:`SweptModel`
    together)."""

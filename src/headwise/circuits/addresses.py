"""Where a write comes from and where it is read: the two addresses the wiring, the graph, paths, edges, atp* and
faithfulness share (one type each, never a bare tuple).

- :class:`Write` — what one forward pass records (:meth:`headwise.circuits.wiring.Wiring.run`): the senders'
  writes ``Write("embed", -1)`` ``(N, 1, L, D)``, ``Write("heads", l)`` ``(N, H, L, D)``, ``Write("mlp", l)``
  ``(N, 1, L, D)``, and beside them ``Write("z", l)`` (the heads' outputs ``(N, H, L, Dv)``), ``Write("o", l)``
  (the attention's output before a norm on its write) and ``Write("o_heads", l)`` (each head's projected write
  before that norm).
- :class:`Receiver` — a receiver group's input: ``Receiver("q", l)`` (the layer's H query heads),
  ``Receiver("k", l)`` / ``Receiver("v", l)`` (its Hkv key / value groups), ``Receiver("mlp", l)``,
  ``Receiver("logits", NL)``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RECEIVER_INPUTS", "SENDER_KINDS", "WRITE_KINDS", "Receiver", "Write"]

#: The senders' writes (the graph's sender groups).
SENDER_KINDS = ("embed", "heads", "mlp")
#: Everything a pass records: the senders' writes, then the heads' outputs and the attention's output and heads'
#: projected writes before a norm on the attention's write.
WRITE_KINDS = (*SENDER_KINDS, "z", "o", "o_heads")
#: A receiver group's input.
RECEIVER_INPUTS = ("q", "k", "v", "mlp", "logits")


@dataclass(frozen=True)
class Write:
    """One recorded write: ``kind`` (:data:`WRITE_KINDS`) of ``layer`` (-1 for the embeddings)."""

    kind: str
    layer: int

    def __post_init__(self):
        if self.kind not in WRITE_KINDS:
            raise ValueError(f"write: expected a kind in {WRITE_KINDS}, got {self.kind!r}")

    @property
    def sender(self) -> bool:
        """Whether it is a sender's write (a group of the graph's senders)."""
        return self.kind in SENDER_KINDS


@dataclass(frozen=True)
class Receiver:
    """One receiver group: ``input`` (:data:`RECEIVER_INPUTS`) of ``layer`` (NL for the logits)."""

    input: str
    layer: int

    def __post_init__(self):
        if self.input not in RECEIVER_INPUTS:
            raise ValueError(f"receiver: expected an input in {RECEIVER_INPUTS}, got {self.input!r}")

"""A model opened layer by layer, its attention parts kept in for a tool that reads them from the weights (the weights'
circuits), the rest of each layer still streamed: every layer's at once (:func:`attention_pinned`,
:func:`~headwise.circuits.composition.head_weights`), or a few layers' at a time (:func:`attention_held`,
``heads --composition``'s groups of layers).

Such a tool reads, of every layer, only what attention uses — the q / k / v / o projections, a QK-norm, the norms
around the attention (and the final norm) — besides activations of one forward pass; the MLP's matrices, most of a
layer's bytes, are needed by that pass alone. :func:`attention_pinned` pins every parameter of each layer's attention
module and every 1-D parameter (norms' gains, biases) on the :class:`~headwise.models.streamed.LayerStream`
(:meth:`~headwise.models.streamed.LayerStream.pinned`): they are read once, in float32, and stay in while the forward
hooks bring in and release the rest of each layer as before. The anatomy (:attr:`HeadModel.anatomy`) is then read on
the streamed model as on a whole one (its reading touches no MLP weight: the MLP's input and output are recorded);
it keeps modules, never weights, so after the block the model streams again and holds what it held before.

:func:`attention_held` reads the same parameters of the layers named alone, as stored, into float32
(:meth:`~headwise.models.streamed.LayerStream.holding` with ``only``: the MLP's matrices stay on the meta device),
and puts them back on the meta device after; the caller reads the anatomy inside a
:func:`~headwise.models.layer_walk.layer_walk` and weighs its own need (:func:`layer_attention_bytes`: each layer's
share).

Before anything is pinned, the memory the tool needs is weighed against the budget (:func:`attention_need`): what the
process holds now, the pinned parameters in float32, the largest part still streamed (its float32 and stored bytes),
:data:`~headwise.models.memory.MIN_WORKING` for the activations, and what the tool adds (``extra``); over the budget,
one line naming that memory (:func:`~headwise.models.memory.whole_refused`, worded as every tool words it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from headwise.models.head_model import HeadModel

__all__ = [
    "READS",
    "attention_bytes",
    "attention_held",
    "attention_need",
    "attention_pinned",
    "check_attention",
    "layer_attention_bytes",
]

#: What such a tool reads, as the refusal names it.
READS = "every layer's attention weights at once"


def _chosen(hm: HeadModel) -> dict[str, list[str]]:
    """Unit → the relative names of the parameters pinned: each attention module's, and every 1-D parameter."""
    ids = {id(m) for m in hm.attention_modules}
    prefixes = tuple(f"{name}." for name, m in hm.model.named_modules() if id(m) in ids)
    return hm.stream.select(lambda full, p: p.dim() <= 1 or full.startswith(prefixes))


def attention_bytes(hm: HeadModel) -> int:
    """Float32 bytes of the parameters :func:`attention_pinned` pins (0 for a model opened whole)."""
    if hm.stream is None:
        return 0
    return sum(f32 for f32, _ in hm.stream.chosen_sizes(_chosen(hm)).values())


def attention_need(hm: HeadModel, *, extra: int = 0) -> int:
    """Bytes of peak resident memory a tool reading the attention parts needs on ``hm`` opened layer by layer: what
    the process holds now, the pinned parameters in float32, the largest part still streamed (float32 and stored
    bytes of what is not pinned of it), :data:`~headwise.models.memory.MIN_WORKING` and ``extra`` (what the tool
    itself holds: copies of the weights, products)."""
    from headwise.models import memory

    pinned = hm.stream.chosen_sizes(_chosen(hm))
    rest = max((f32 + st - sum(pinned.get(unit, (0, 0))) for unit, (f32, st) in hm.stream.sizes().items()), default=0)
    return hm.stream.process_bytes() + sum(f32 for f32, _ in pinned.values()) + rest + memory.MIN_WORKING + extra


def check_attention(hm: HeadModel, what: str, *, extra: int = 0) -> None:
    """ValueError (one line naming the memory ``what`` would need, :func:`attention_need`) when ``hm`` was opened
    layer by layer and its attention parts do not fit its budget; nothing for a model opened whole."""
    if hm.stream is None or hm.stream.pin_depth:
        return
    from headwise.models.memory import whole_refused

    need = attention_need(hm, extra=extra)
    if need > hm.memory.budget:
        raise whole_refused(hm.name, hm.memory, what, reads=READS, need=need)


@contextlib.contextmanager
def attention_pinned(hm: HeadModel, what: str, *, extra: int = 0) -> Iterator[None]:
    """Within the block, a model opened layer by layer keeps every layer's attention parts in (see the module's
    notes) and its anatomy can be read; after it, they go back to the meta device. A model opened whole: nothing
    changes. Blocks nest (the outermost pins and checks).

    Args:
        hm: a :class:`~headwise.models.HeadModel`.
        what: the tool, as the refusal names it (``"qk"``, ``"--composition"``).
        extra: bytes the tool holds beyond the pinned parameters (see :func:`attention_need`).
    Raises:
        ValueError: over the budget — one line naming the memory needed (:func:`check_attention`).
    """
    if hm.stream is None:
        yield
        return
    outermost = hm.stream.pin_depth == 0
    if outermost:
        check_attention(hm, what, extra=extra)
    with hm.stream.pinned(_chosen(hm) if outermost else {}):  # the stream counts its open blocks
        yield


def layer_attention_bytes(hm: HeadModel) -> list[tuple[int, int]]:
    """Per layer, ``(float32 bytes, stored bytes)`` of what :func:`attention_held` reads of it: its attention
    module's parameters and its 1-D parameters (norms' gains, biases); ``[]`` for a model opened whole."""
    if hm.stream is None:
        return []
    sizes = hm.stream.chosen_sizes(_chosen(hm))
    return [sizes.get(unit, (0, 0)) for unit in hm.stream.block_units()]


@contextlib.contextmanager
def attention_held(hm: HeadModel, *layers: int) -> Iterator[None]:
    """Within the block, the attention parts of ``layers`` (layer indices) are in on a model opened layer by layer —
    each layer's attention module's parameters and its 1-D parameters, read as stored into float32 (the MLP's
    matrices stay on the meta device) — and released after
    (:meth:`~headwise.models.streamed.LayerStream.holding` with the parameters :func:`attention_pinned` would pin);
    a model opened whole: nothing. For a tool that reads a few layers' attention weights at a time."""
    if hm.stream is None:
        yield
        return
    chosen = _chosen(hm)
    with contextlib.ExitStack() as stack:
        for layer in layers:
            unit = hm.stream.unit_of(layer)
            stack.enter_context(hm.stream.holding(unit, only=chosen.get(unit, [])))
        yield

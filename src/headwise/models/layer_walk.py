"""Gradients of a model opened layer by layer: a forward pass that keeps only the residual stream at layer
boundaries, and a backward pass that walks the layers in reverse, bringing each layer's weights in again,
recomputing its forward from the saved boundary and back-propagating through it alone — gradient checkpointing at
the granularity of a layer (Chen et al. 2016, ``torch.utils.checkpoint``), with the weights streamed as stored.

A model opened layer by layer (:mod:`headwise.models.streamed`) runs a forward pass with one unit's weights in at a
time, but autograd keeps every tensor a backward pass needs — each layer's weights and activations — so a plain
backward pass holds the whole model. Within :func:`layer_walk`:

- each block of the layer list runs as a non-reentrant ``torch.utils.checkpoint`` region whenever a gradient is
  recorded: the forward keeps the region's inputs (the residual stream at the boundary, the position tables and
  masks the block is called with) and drops what the region would save; when the backward pass reaches the block,
  its forward is recomputed with its weights brought in again, and they stay in through that block's backward
  until the next block's are brought (one block in at a time);
- a large unembedding applied a slice of rows at a time is differentiated by reading the slices again in the
  backward pass (:class:`~headwise.models.streamed.LayerStream`, always); the embedding's rows need no gradient;
- the model view reads its anatomy (:attr:`~headwise.models.HeadModel.anatomy`), which keeps modules, never
  weights: a tool reads a layer's weights through it inside that layer's forward (the named points' hooks) or its
  backward (gradient hooks), when the layer is in.

The hooks at named points are called again in the recomputation (they must: the recomputed graph has to be the
original's), with the same inputs, so a hook that records overwrites what it recorded with equal values; a gradient
hook registered in the recomputation never fires (that graph is not differentiated). A caller keeps its hooks
registered until its backward pass has run (:meth:`~headwise.models.HeadModel.hooks` around both).

On a model opened whole nothing changes. The maths is the whole route's: the same float32 weights, the same
operations in the same order, so gradients equal the whole route's (tested on tiny random models of several
families against autograd on the whole model).

Memory: the residual stream at every boundary ``(N, L, D)`` per layer, one block's weights (float32 and the stored
bytes read to make them) with its working set and activations, and a slice of the unembedding (:func:`walk_need`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from headwise.models.head_model import HeadModel
    from headwise.models.streamed import LayerStream

__all__ = ["READS", "check_walk", "layer_walk", "walk_need"]

#: What a tool differentiated layer by layer reads, as a refusal names it.
READS = "one layer's weights at a time and what it keeps of every layer's activations"


def walk_need(hm: HeadModel, *, activations: int = 0) -> int:
    """Bytes of peak resident memory a forward and backward pass need on ``hm`` opened layer by layer: what the
    process holds now (less the freed buffers the stream keeps to read the next layer into), the largest unit's
    float32 and stored bytes and its float32 bytes once more (the layer's working set: a tool's copies of its
    matrices, the allocator's slack — a circuit on Llama 3 8B's shapes peaked 0.41 GB above the estimate without
    it), the activations ``activations`` (the caller's estimate) and :data:`~headwise.models.memory.MIN_WORKING`."""
    from headwise.models import memory

    sizes = hm.stream.sizes().values()
    largest = max((2 * f32 + st for f32, st in sizes), default=0)
    return hm.stream.process_bytes() + largest + activations + memory.MIN_WORKING


def check_walk(hm: HeadModel, what: str, *, activations: int = 0) -> None:
    """ValueError (one line naming the memory ``what`` needs, :func:`walk_need`, worded as every tool's refusal)
    when ``hm`` was opened layer by layer and that is over its budget; nothing for a model opened whole."""
    if hm.stream is None:
        return
    from headwise.models.memory import whole_refused

    need = walk_need(hm, activations=activations)
    if need > hm.memory.budget:
        raise whole_refused(hm.name, hm.memory, what, reads=READS, need=need)


@contextlib.contextmanager
def layer_walk(hm: HeadModel) -> Iterator[None]:
    """Within the block, a model opened layer by layer is differentiated layer by layer (see the module's notes)
    and its anatomy can be read; a model opened whole: nothing changes. Blocks nest.

    Args:
        hm: a :class:`~headwise.models.HeadModel`.
    """
    from headwise.points import layer_point, replaced_calls

    stream = hm.stream
    if stream is None or stream.walk_depth:
        with stream.walking() if stream is not None else contextlib.nullcontext():
            yield
        return
    names = [layer_point(layer, "resid_pre") for layer in range(hm.num_layers)]
    walk = _Walk(stream, [hm.points.point("names", name).module for name in names])
    try:
        with stream.walking(), replaced_calls(hm.points, names, walk.call):
            yield
    finally:
        walk.close()


class _Walk:
    """The checkpointed blocks of one :func:`layer_walk`: ``blocks`` the layers' blocks, in order."""

    def __init__(self, stream: LayerStream, blocks: list):
        self.stream, self.blocks = stream, blocks
        self.units = [stream.unit_of(block) for block in blocks]
        self.current: int | None = None  # the layer whose weights the backward pass holds now
        self.handles = [block.register_forward_pre_hook(self._forward_again, prepend=True) for block in blocks]

    def call(self, layer: int, forward, *args, **kwargs):
        """Layer ``layer``'s block called (:func:`headwise.points.replaced_calls`): where a gradient is recorded, a
        non-reentrant checkpoint whose recomputation brings the layer's weights in again."""
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        from torch.utils.checkpoint import checkpoint

        def again(*args, **kwargs):
            if any(p.device.type == "meta" for p in self.blocks[layer].parameters()):
                self.stream.direction = "backward"
                self._keep(layer)  # the backward's recomputation: in until the next block's weights are brought
            return forward(*args, **kwargs)

        return checkpoint(again, *args, use_reentrant=False, preserve_rng_state=False, **kwargs)

    def _forward_again(self, module, args) -> None:
        """A block's forward pre-hook, before the stream's: a forward pass after a backward one — the block the
        backward pass left in is let go (released, or left to this forward's own release if it is this block)."""
        self.stream.direction = "forward"  # before the stream brings the block in (its progress reads it)
        if self.current is not None:
            if self.blocks[self.current] is not module:
                self.stream.release(self.units[self.current])
            self.current = None

    def _keep(self, layer: int) -> None:
        if self.current is not None and self.current != layer:
            self.stream.release(self.units[self.current])
        self.stream.bring(self.units[layer])
        self.current = layer

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        if self.current is not None:
            self.stream.release(self.units[self.current])
            self.current = None
        self.stream.direction = "forward"

"""Per-head attention weights from any Hugging Face model on the attention interface.

``with capture(model) as attn: model(**batch)`` runs the model on headwise attention inside the block —
whatever implementation it was loaded with (``sdpa``, ``eager``, a flash kernel) — and afterwards
``attn.weights`` holds one ``(B, H, L, S)`` tensor per attention layer, in layer order, read at each
layer's ``hook_pattern`` (:func:`headwise.hf.backend.hook_points`). They are the weights
the functional actually used (``need_weights=True``: after scaling, soft-capping, masks, windows and
sinks), so they equal eager's ``output_attentions`` where eager's maths is the same (tested ≤ 1e-5 on the
real query rows; a fully masked row — left padding — is zeros here, evenly spread in eager).

Shape legend: B batch, H query heads, L query length, S key length (cached keys included).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from functools import partial

from torch import Tensor, nn

from headwise.hf._model import layer_selection, named_points, on_headwise
from headwise.points import attention_point


class Capture:
    """The weights recorded by :func:`capture`, one forward pass (a *step*) at a time.

    Attributes:
        layers: the captured layer numbers, ascending.
        steps: one dict ``{layer: weights (B, H, L, S)}`` per forward pass inside the block (several under
            ``generate``: the prompt, then ``L = 1`` per new token).
    """

    def __init__(self, layers: list[int]):
        self.layers = layers
        self.steps: list[dict[int, Tensor]] = []
        self._seen: set[int] = set()

    def hooks(self, num_layers: int) -> list[tuple[str, object]]:
        """``(point name, fn)`` pairs: each captured layer's ``layers.{i}.attn.pattern`` records its weights;
        every other layer's ``layers.{i}.attn.heads`` only marks that it ran (a layer seen again starts a new
        step)."""
        keep = set(self.layers)
        return [
            (attention_point(layer, "pattern"), partial(self._record, layer))
            if layer in keep
            else (attention_point(layer, "heads"), partial(self._mark, layer))
            for layer in range(num_layers)
        ]

    def _mark(self, layer: int, _out: Tensor | None = None) -> None:
        if not self.steps or layer in self._seen:  # a layer seen again: a new forward pass began
            self.steps.append({})
            self._seen = set()
        self._seen.add(layer)

    def _record(self, layer: int, weights: Tensor) -> None:
        self._mark(layer)
        self.steps[-1][layer] = weights

    @property
    def weights(self) -> list[Tensor]:
        """The last forward pass's weights: one ``(B, H, L, S)`` tensor per captured layer, in layer order.

        Raises:
            RuntimeError: no forward pass ran inside the block, or one of the captured layers did not run.
        """
        if not self.steps:
            raise RuntimeError("capture: no forward pass of the model ran inside the block")
        step = self.steps[-1]
        missing = [layer for layer in self.layers if layer not in step]
        if missing:
            raise RuntimeError(f"capture: attention layers {missing} did not run in the last forward pass")
        return [step[layer] for layer in self.layers]


@contextmanager
def capture(model: nn.Module, *, layers: Iterable[int] | None = None) -> Iterator[Capture]:
    """Record per-head attention weights of ``model`` inside the block.

    Args:
        model: a transformers ``PreTrainedModel`` whose attention goes through the attention interface.
        layers: the attention layers to keep (numbers as in :func:`headwise.hf.attention_layers`), or None
            for all. Layers not kept run without forming weights.
    Yields:
        a :class:`Capture`; after a forward pass ``capture.weights`` is a list of ``(B, H, L, S)`` tensors
        (they keep their autograd graph when gradients are on).
    Raises:
        TypeError / ValueError: not a ``PreTrainedModel``; a family that writes its own attention (named); a
            layer number out of range (named).

    The model's own attention implementation is restored when the block ends, also when it raises.
    """
    points = named_points(model)
    count = len(points.attention)
    recorder = Capture(layer_selection("layers", layers, count))
    with points.hooks(recorder.hooks(count)), on_headwise(model):
        yield recorder

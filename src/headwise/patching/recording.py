"""What the direct logit attribution and the residual stream's parts read of one forward pass: the parts named by
the model's anatomy (:attr:`headwise.models.HeadModel.anatomy`) and a recorder of their inputs and outputs.

Shape legend: P prompts, L length, D model width.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import partial

import torch
from torch import Tensor

from headwise.models.anatomy import Anatomy, affine
from headwise.models.head_model import HeadModel
from headwise.patching.target import as_target
from headwise.points import layer_point, output_tensor

__all__ = ["LayerRecord", "Recorder", "decomposed_anatomy", "read_structure"]


def decomposed_anatomy(target: HeadModel) -> Anatomy:
    """The model's anatomy (:attr:`HeadModel.anatomy`), refused (its one sentence) where its unembedding is not a
    linear map (what the decompositions read)."""
    anatomy = target.anatomy
    if anatomy.unembed is None or affine(anatomy.unembed) is None:
        raise anatomy.refuse("its unembedding is not a linear map")
    return anatomy


def read_structure(model) -> Anatomy:
    """The parts the decompositions read: the model's anatomy (:attr:`HeadModel.anatomy` — per layer the block,
    the output projection, the MLP, the norms and multiplier on the writes; the final norm and the unembedding).

    Raises:
        ValueError: a structure headwise does not read (the anatomy's one sentence).
    """
    return decomposed_anatomy(as_target(model))


@dataclass
class LayerRecord:
    """One layer's parts as one pass recorded them at the recorder's position (``(P, …)``; ``(P, L, …)`` for every
    position).

    Attributes:
        heads: the output projection's input, the heads side by side ``(P, [L,] H·Dv)`` (W_O's input).
        attn_out: the output projection's output, the attention's write before a norm on it ``(P, [L,] D)``.
        block_out: the block's output ``(P, [L,] D)``.
        attn_post_out: the norm on the attention's write, its output (None without one).
        mlp_write: the MLP's write through a norm on it (None without an MLP).
    """

    heads: Tensor
    attn_out: Tensor
    block_out: Tensor
    attn_post_out: Tensor | None = None
    mlp_write: Tensor | None = None

    def rows(self, n: int) -> LayerRecord:
        """The same record with every position a row: ``(P, L, …)`` seen as ``(P·L, …)`` (what the frozen norms
        read); a record of one position as it is."""

        def flat(t: Tensor | None) -> Tensor | None:
            return t if t is None or t.dim() < 3 else t.reshape(n, *t.shape[2:])

        return LayerRecord(*(flat(getattr(self, f.name)) for f in fields(self)))


class Recorder:
    """The anatomy's parts of one pass at one position (or every position), read at the model view's named points.

    After :meth:`finish`: :attr:`embed` (the first block's input), :attr:`layers` (a :class:`LayerRecord` per
    recorded layer), :attr:`resid` (the input of block ``upto``, None where ``upto`` is the last), and with
    ``final``: :attr:`final_in` / :attr:`final_out` (the final norm's input and output, ``final_out`` None without
    one) and :attr:`unembed` (the unembedding's output). The norms on the writes, the final norm and the unembedding
    are applied to what the points recorded (pure functions of their input), so nothing but the named points is
    hooked.

    Use: ``with target.hooks(rec.hooks()): …`` then ``rec.finish()``.
    """

    def __init__(self, target: HeadModel, anatomy: Anatomy, position, *, upto: int, final: bool):
        self.target, self.anatomy, self.position = target, anatomy, position
        self.upto, self.final = upto, final
        self.embed: Tensor | None = None
        self.layers: list[LayerRecord] = []
        self.resid: Tensor | None = None
        self.final_in = self.final_out = self.unembed = None
        self._raw: dict[str, list] = {"heads": [None] * upto, "attn": [None] * upto, "mlp": [None] * upto}
        self._raw["block"] = [None] * upto

    def _keep(self, where: list, i: int, x: Tensor) -> None:
        # a copy: a family may add to a module's output in place (Falcon: mlp_output += attention_output)
        where[i] = x[:, self.position].detach().clone()  # (P, …)

    def _keep_heads(self, i: int, z: Tensor) -> None:
        z = z[:, :, self.position].detach()  # (P, H, Dv) or (P, H, L, Dv)
        z = z.reshape(z.shape[0], -1) if z.dim() == 3 else z.permute(0, 2, 1, 3).reshape(*z.shape[:1], z.shape[2], -1)
        self._raw["heads"][i] = z  # (P, H·Dv) or (P, L, H·Dv): the heads side by side, W_O's input

    def _keep_one(self, name: str, x: Tensor) -> None:
        self._raw[name] = x[:, self.position].detach().clone()  # (P, …)

    def hooks(self) -> list:
        """``(name, fn)`` pairs for :meth:`HeadModel.hooks`."""
        NL, raw = self.target.num_layers, self._raw
        out = [(layer_point(0, "resid_pre"), partial(self._keep_one, "embed"))]
        for layer in range(self.upto):
            out.append((layer_point(layer, "attn.heads"), partial(self._keep_heads, layer)))
            out.append((layer_point(layer, "attn.out"), partial(self._keep, raw["attn"], layer)))
            if self.anatomy[layer].mlp is not None:
                out.append((layer_point(layer, "mlp.out"), partial(self._keep, raw["mlp"], layer)))
            after = layer_point(layer + 1, "resid_pre") if layer + 1 < NL else "resid_final"
            out.append((after, partial(self._keep, raw["block"], layer)))
        if self.upto < NL:
            out.append((layer_point(self.upto, "resid_pre"), partial(self._keep_one, "resid")))
        if self.final:
            out.append(("resid_final", partial(self._keep_one, "final")))
        return out

    def finish(self) -> None:
        """Fill the records from what the points recorded."""
        raw, anatomy = self._raw, self.anatomy
        self.embed = raw["embed"]
        with torch.no_grad():
            for layer in range(self.upto):
                part, attn = anatomy[layer], raw["attn"][layer]
                with self.target.holding(layer):  # the norms on the writes (a model opened layer by layer)
                    post = output_tensor(part.attn_post(attn)) if part.attn_post is not None else None
                    mlp = part.mlp_write(raw["mlp"][layer]) if part.mlp is not None else None
                self.layers.append(LayerRecord(raw["heads"][layer], attn, raw["block"][layer], post, mlp))
            self.resid = raw.get("resid")
            if self.final:
                x = self.final_in = raw["final"]
                if anatomy.final_norm is not None:
                    x = self.final_out = output_tensor(anatomy.final_norm(x))
                self.unembed = output_tensor(anatomy.unembed(x))

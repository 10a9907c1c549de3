"""What the direct logit attribution and the residual stream's parts read of one forward pass: the parts named by
the model's anatomy (:attr:`headwise.models.HeadModel.anatomy`) and a recorder of their inputs and outputs.

Shape legend: P prompts, L length, D model width.
"""

from __future__ import annotations

import torch
from torch import Tensor

from headwise.models.anatomy import Anatomy, affine
from headwise.models.head_model import HeadModel
from headwise.patching.target import as_target
from headwise.points import output_tensor

__all__ = ["FlatRecorder", "Recorder", "decomposed_anatomy", "read_structure"]


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


class Recorder:
    """The anatomy's parts of one pass at one position (or every position), read at the model view's named points:
    ``inputs[key]`` / ``outputs[key]`` ``(P, …)`` (``(P, L, …)`` for ``position=slice(None)``).

    Keys: ``"embed"`` (the first block's input), per recorded layer ``("proj", l)`` (the output projection's input,
    the heads side by side, and its output, the attention's write), ``("block", l)`` (the block's output),
    ``("attn_post", l)`` (the norm on the attention's write, its output), ``("mlp", l)`` (the MLP's write, through
    a norm on it), then ``"resid"`` (the input of block ``upto``),
    ``"final"`` / ``"final_out"`` (the final norm's input and output) and ``"unembed"`` (the unembedding's
    output). The norms on the writes, the final norm and the unembedding are applied to what the points recorded
    (pure functions of their input), so nothing but the named points is hooked.

    Use: ``with target.hooks(rec.hooks()): …`` then ``rec.finish()``.
    """

    def __init__(self, target: HeadModel, anatomy: Anatomy, position, *, upto: int, final: bool):
        self.target, self.anatomy, self.position = target, anatomy, position
        self.upto, self.final = upto, final
        self.inputs: dict[object, Tensor] = {}
        self.outputs: dict[object, Tensor] = {}
        self._raw: dict = {}

    def _keep(self, key, x: Tensor) -> None:
        # a copy: a family may add to a module's output in place (Falcon: mlp_output += attention_output)
        self._raw[key] = x[:, self.position].detach().clone()  # (P, …)

    def _keep_heads(self, key, z: Tensor) -> None:
        z = z[:, :, self.position].detach()  # (P, H, Dv) or (P, H, L, Dv)
        z = z.reshape(z.shape[0], -1) if z.dim() == 3 else z.permute(0, 2, 1, 3).reshape(*z.shape[:1], z.shape[2], -1)
        self._raw[key] = z  # (P, H·Dv) or (P, L, H·Dv): the heads side by side, W_O's input

    def hooks(self) -> list:
        """``(name, fn)`` pairs for :meth:`HeadModel.hooks`."""
        NL = self.target.num_layers
        out = [("layers.0.resid_pre", lambda x: self._keep("embed", x))]
        for layer in range(self.upto):
            out.append((f"layers.{layer}.attn.heads", lambda z, k=("z", layer): self._keep_heads(k, z)))
            out.append((f"layers.{layer}.attn.out", lambda x, k=("o", layer): self._keep(k, x)))
            if self.anatomy[layer].mlp is not None:
                out.append((f"layers.{layer}.mlp.out", lambda x, k=("mlp", layer): self._keep(k, x)))
            after = f"layers.{layer + 1}.resid_pre" if layer + 1 < NL else "resid_final"
            out.append((after, lambda x, k=("block", layer): self._keep(k, x)))
        if self.upto < NL:
            out.append((f"layers.{self.upto}.resid_pre", lambda x: self._keep("resid", x)))
        if self.final:
            out.append(("resid_final", lambda x: self._keep("final", x)))
        return out

    def finish(self) -> None:
        """Fill :attr:`inputs` / :attr:`outputs` from what the points recorded."""
        raw, anatomy = self._raw, self.anatomy
        self.inputs["embed"] = raw["embed"]
        with torch.no_grad():
            for layer in range(self.upto):
                part = anatomy[layer]
                self.inputs[("proj", layer)] = raw[("z", layer)]
                self.outputs[("proj", layer)] = raw[("o", layer)]
                self.outputs[("block", layer)] = raw[("block", layer)]
                if part.attn_post is not None:
                    self.outputs[("attn_post", layer)] = output_tensor(part.attn_post(raw[("o", layer)]))
                if part.mlp is not None:
                    self.outputs[("mlp", layer)] = part.mlp_write(raw[("mlp", layer)])
            if "resid" in raw:
                self.inputs["resid"] = raw["resid"]
            if self.final:
                x = raw["final"]
                self.inputs["final"] = x
                if anatomy.final_norm is not None:
                    x = output_tensor(anatomy.final_norm(x))
                    self.outputs["final_out"] = x
                self.outputs["unembed"] = output_tensor(anatomy.unembed(x))


class FlatRecorder:
    """A recorder's tensors of every position seen as ``(P·L, …)`` rows (what the frozen norms read)."""

    def __init__(self, rec: Recorder, rows: int):
        self.inputs = {k: v.reshape(rows, *v.shape[2:]) for k, v in rec.inputs.items() if v.dim() >= 3}
        self.outputs = {k: v.reshape(rows, *v.shape[2:]) for k, v in rec.outputs.items() if v.dim() >= 3}

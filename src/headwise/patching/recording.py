"""What the direct logit attribution and the residual stream's parts read of one forward pass: the parts named by
the model's anatomy (:attr:`headwise.models.HeadModel.anatomy`) and a recorder of their inputs and outputs.

Shape legend: P prompts, L length, D model width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from headwise.models.anatomy import affine
from headwise.models.head_model import HeadModel
from headwise.patching.target import as_target
from headwise.points import output_tensor

__all__ = ["FlatRecorder", "Recorder", "Structure", "read_structure", "structure_of"]


@dataclass
class Structure:
    """The parts this decomposition reads, per attention layer (from the model's anatomy)."""

    blocks: list[nn.Module]
    out_projs: list[nn.Module]
    mlps: list[nn.Module | None]
    attn_posts: list[nn.Module | None]
    mlp_posts: list[nn.Module | None]
    scales: list[float]
    final_norm: nn.Module | None
    unembed: nn.Module


def structure_of(target: HeadModel) -> Structure:
    anatomy = target.anatomy
    if anatomy.unembed is None or affine(anatomy.unembed) is None:
        raise anatomy.refuse("its unembedding is not a linear map")
    layers = anatomy.layers
    return Structure(
        [p.block for p in layers],
        [p.out_proj for p in layers],
        [p.mlp for p in layers],
        [p.attn_post for p in layers],
        [p.mlp_post for p in layers],
        [p.scale for p in layers],
        anatomy.final_norm,
        anatomy.unembed,
    )


def read_structure(model) -> Structure:
    """The modules this decomposition reads, from the model's anatomy (:attr:`HeadModel.anatomy`): ``blocks``,
    ``out_projs``, ``mlps`` (None for attention-only blocks), ``attn_posts`` / ``mlp_posts`` (norms on the writes),
    ``scales`` (each layer's multiplier on its writes), per attention layer, then ``final_norm`` (None: the
    unembedding reads the last block's output) and ``unembed``.

    Raises:
        ValueError: a structure headwise does not read (the anatomy's one sentence).
    """
    return structure_of(as_target(model))


class Recorder:
    """The anatomy's parts of one pass at one position (or every position), read at the model view's named points:
    ``inputs[key]`` / ``outputs[key]`` ``(P, …)`` (``(P, L, …)`` for ``position=slice(None)``).

    Keys: ``"embed"`` (the first block's input), per recorded layer ``("proj", l)`` (the output projection's input,
    the heads side by side, and its output, the attention's write), ``("block", l)`` (the block's output),
    ``(l, id(module))`` (the MLP's output, a post-norm's output), then ``"resid"`` (the input of block ``upto``),
    ``"final"`` / ``"final_out"`` (the final norm's input and output) and ``"unembed"`` (the unembedding's
    output). The norms on the writes, the final norm and the unembedding are applied to what the points recorded
    (pure functions of their input), so nothing but the named points is hooked.

    Use: ``with target.hooks(rec.hooks()): …`` then ``rec.finish()``.
    """

    def __init__(self, target: HeadModel, st: Structure, position, *, upto: int, final: bool):
        self.target, self.st, self.position = target, st, position
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
            if self.st.mlps[layer] is not None:
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
        raw, st = self._raw, self.st
        self.inputs["embed"] = raw["embed"]
        with torch.no_grad():
            for layer in range(self.upto):
                self.inputs[("proj", layer)] = raw[("z", layer)]
                self.outputs[("proj", layer)] = raw[("o", layer)]
                self.outputs[("block", layer)] = raw[("block", layer)]
                if st.attn_posts[layer] is not None:
                    self.outputs[(layer, id(st.attn_posts[layer]))] = output_tensor(
                        st.attn_posts[layer](raw[("o", layer)])
                    )
                mlp = st.mlps[layer]
                if mlp is not None:
                    self.outputs[(layer, id(mlp))] = raw[("mlp", layer)]
                    if st.mlp_posts[layer] is not None:
                        post = output_tensor(st.mlp_posts[layer](raw[("mlp", layer)]))
                        self.outputs[(layer, id(st.mlp_posts[layer]))] = post
            if "resid" in raw:
                self.inputs["resid"] = raw["resid"]
            if self.final:
                x = raw["final"]
                self.inputs["final"] = x
                if st.final_norm is not None:
                    x = output_tensor(st.final_norm(x))
                    self.outputs["final_out"] = x
                self.outputs["unembed"] = output_tensor(st.unembed(x))


class FlatRecorder:
    """A recorder's tensors of every position seen as ``(P·L, …)`` rows (what the frozen norms read)."""

    def __init__(self, rec: Recorder, rows: int):
        self.inputs = {k: v.reshape(rows, *v.shape[2:]) for k, v in rec.inputs.items() if v.dim() >= 3}
        self.outputs = {k: v.reshape(rows, *v.shape[2:]) for k, v in rec.outputs.items() if v.dim() >= 3}

"""What the direct logit attribution and the residual stream's parts read of one forward pass: the parts named by
the model's anatomy (:attr:`headwise.models.HeadModel.anatomy`) and a recorder of their inputs and outputs.

Shape legend: P prompts, L length, D model width.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from headwise.models.anatomy import affine
from headwise.models.head_model import HeadModel
from headwise.patching.target import as_target

__all__ = ["FlatRecorder", "Recorder", "Structure", "output_tensor", "read_structure", "structure_of"]


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


def _first_tensor(args, kwargs) -> Tensor | None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, Tensor) and value.is_floating_point():
            return value
    return None


def output_tensor(output) -> Tensor:
    return output[0] if isinstance(output, (tuple, list)) else output


class Recorder:
    """Inputs and outputs of chosen modules at one position: ``inputs[key]`` / ``outputs[key]`` ``(P, …)``."""

    def __init__(self, position: int):
        self.position = position
        self.inputs: dict[object, Tensor] = {}
        self.outputs: dict[object, Tensor] = {}
        self.handles = []

    def _at(self, x: Tensor) -> Tensor:
        # a copy: a family may add to a module's output in place (Falcon: mlp_output += attention_output)
        return x[:, self.position].detach().clone()  # (P, …)

    def watch(self, key, module: nn.Module, *, inputs: bool = True, outputs: bool = True) -> None:
        if inputs:

            def pre(_m, args, kwargs):
                x = _first_tensor(args, kwargs)
                if x is not None and x.dim() >= 3:
                    self.inputs[key] = self._at(x)

            self.handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        if outputs:

            def post(_m, _args, output):
                y = output_tensor(output)
                if isinstance(y, Tensor) and y.dim() >= 3:
                    self.outputs[key] = self._at(y)

            self.handles.append(module.register_forward_hook(post))

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


class FlatRecorder:
    """A recorder's tensors of every position seen as ``(P·L, …)`` rows (what the frozen norms read)."""

    def __init__(self, rec: Recorder, rows: int):
        self.inputs = {k: v.reshape(rows, *v.shape[2:]) for k, v in rec.inputs.items() if v.dim() >= 3}
        self.outputs = {k: v.reshape(rows, *v.shape[2:]) for k, v in rec.outputs.items() if v.dim() >= 3}

"""The residual stream entering a block, at every position, as the sum of its writes: the direct logit attribution's
decomposition (:mod:`headwise.patching.logit_attribution`) kept at every position, one layer at a time (shared with
:mod:`headwise.circuits`: QK attribution projects each part into one head's query and key).

Shape legend: P prompts, L length, D model width, H query heads, Dv value head width, E a projection's width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from headwise.models.anatomy import Anatomy, affine, same
from headwise.models.head_model import HeadModel
from headwise.patching.logit_attribution import head_writes
from headwise.patching.recording import Recorder, decomposed_anatomy
from headwise.patching.target import as_target

__all__ = ["ResidualParts", "affine_weight", "residual_parts"]


@dataclass
class ResidualParts:
    """The residual stream entering block ``layer`` at every position of one forward pass, as the sum of its
    writes (the decomposition of :func:`direct_logit_attribution`, kept at every position).

    Attributes:
        layer: the block whose input is decomposed (0 … NL − 1).
        residual: ``(P, L, D)`` float64, that block's actual input.
        labels: the parts' names in residual-stream order: ``"embed"``, then per earlier layer ``l`` each head
            ``"L{l}.H{h}"``, ``"L{l}.attn_bias"`` (the output projection's bias, with a post-norm's bias) and
            ``"L{l}.mlp"`` (absent without a feed-forward).
    """

    layer: int
    residual: Tensor
    labels: list[str]
    _target: HeadModel
    _anatomy: Anatomy
    _recorder: Recorder

    def parts(self, project: Tensor | None = None):
        """Yield ``(labels, writes)`` one layer at a time — ``writes (n, P, L, D)`` float64 for the ``n`` labels
        (the embeddings alone first, then each earlier layer's heads, bias and MLP) — so that a caller can
        reduce each layer's writes before the next is formed (memory: one layer's parts). Each layer's writes
        are checked to add up to its change of the residual stream, the last to the block's input.

        ``project`` ``(D, E)`` float64: yield ``writes @ project`` ``(n, P, L, E)`` instead. Where the output
        projection is an ``nn.Linear`` or ``Conv1D``, each head's write is then formed as ``z_h (W_O,h project)``
        (never in D: ``L·H·Dh·E`` multiply-adds instead of ``L·H·(H·Dh)·D``), the heads' sum checked against
        the projection's output on the first rows, the block's sum in D as before."""
        rec, target = self._recorder, self._target
        embed = rec.embed.double()  # (P, L, D)
        P, L, D = embed.shape

        def out(v: Tensor) -> Tensor:  # (…, D) -> (…, E)
            return v if project is None else v @ project.to(v.device)

        residual = embed
        yield ["embed"], out(embed)[None]
        for layer in range(self.layer):
            with target.holding(layer):  # the layer's weights in (a model opened layer by layer)
                part, flat, H, scale, writes, attn_write = self._attention_writes(layer, project, out)
            if scale != 1.0:  # the layer's multiplier on its writes (Granite)
                writes = [w * scale for w in writes]
            labels = [f"L{layer}.H{h}" for h in range(H)] + [f"L{layer}.attn_bias"]
            total = attn_write.reshape(P, L, D) * scale
            if part.mlp is not None:
                mlp_write = flat.mlp_write.double() * scale
                labels.append(f"L{layer}.mlp")
                writes.append(out(mlp_write.reshape(1, P, L, D)))
                total = total + mlp_write.reshape(P, L, D)
            after = rec.layers[layer].block_out.double()
            if not same(residual + total, after):
                raise ValueError(
                    f"model: layer {layer}'s attention and MLP writes do not add up to its change of the residual "
                    f"stream ({type(part.block).__name__} is not a residual block this decomposition reads)"
                )
            residual = after
            yield labels, torch.cat(writes, 0)
        if not same(residual, self.residual):
            raise ValueError(f"model: the parts do not add up to block {self.layer}'s input")

    def _attention_writes(self, layer: int, project: Tensor | None, out):
        """Layer ``layer``'s attention writes at every position (see :meth:`parts`): ``(part, its recorded rows, H,
        the layer's multiplier, [heads (H, P, L, E), bias (1, P, L, E)], the attention's write (P·L, D))``."""
        rec, target = self._recorder, self._target
        P, L, D = rec.embed.shape
        part = self._anatomy[layer]
        proj = part.out_proj
        H = target.heads_per_layer[layer]
        flat = rec.layers[layer].rows(P * L)  # every position a row
        z = flat.heads  # (P·L, H·Dv)
        o_out = flat.attn_out.double()  # (P·L, D)
        scale = part.scale
        W = affine_weight(proj) if project is not None else None
        if W is not None:  # heads formed in the projected space
            bias = head_writes(proj, z[:1], H)[1]  # (D,): the projection at 0
            rows = slice(0, min(P * L, 64))
            if not same(z[rows].double() @ W + bias, o_out[rows]):
                raise ValueError(f"model: layer {layer}'s heads do not add up to its output projection's output")
            Wh = W.reshape(H, -1, D)  # (H, Dv, D)
            zh = z.double().reshape(P * L, H, -1)  # (P·L, H, Dv)
            M = project.to(W.device)
            attn_write = o_out
            frozen = part.attn_post_frozen(o_out, flat.attn_post_out)
            if frozen is not None:
                M = frozen.fold(M)
                heads = torch.einsum("nhd,hde->hne", zh, Wh @ M) * frozen.inv[None, :, None]
                bias = frozen(bias.expand(P * L, -1)) + frozen.bias  # (P·L, D)
                attn_write = frozen(o_out) + frozen.bias
            else:
                heads = torch.einsum("nhd,hde->hne", zh, Wh @ M)  # (H, P·L, E)
                bias = bias.expand(P * L, -1)
            E = heads.shape[-1]
            writes = [heads.reshape(H, P, L, E), out(bias).reshape(1, P, L, E)]
        else:
            each, bias = head_writes(proj, z, H)  # (P·L, H, D), (D,)
            if not same(each.sum(1) + bias, o_out):
                raise ValueError(f"model: layer {layer}'s heads do not add up to its output projection's output")
            frozen = part.attn_post_frozen(o_out, flat.attn_post_out)
            if frozen is not None:
                each, bias = frozen(each), frozen(bias.expand(P * L, -1)) + frozen.bias
            else:
                bias = bias.expand(P * L, -1)
            attn_write = each.sum(1) + bias
            writes = [out(each.reshape(P, L, H, D).permute(2, 0, 1, 3)), out(bias.reshape(1, P, L, D))]
        return part, flat, H, scale, writes, attn_write


def affine_weight(proj: nn.Module) -> Tensor | None:
    """``W (in, out)`` float64 of ``x ↦ x W + b`` for an ``nn.Linear`` or GPT-2's ``Conv1D``, else None."""
    found = affine(proj)
    return None if found is None else found[0].detach().double().T


def residual_parts(model, ids, layer: int, *, forward=None) -> ResidualParts:
    """Record one forward pass and decompose the residual stream entering block ``layer`` at every position.

    Args:
        model: see :func:`headwise.patching.as_target`.
        ids: token ids ``(L,)`` or ``(P, L)``.
        layer: the block whose input is decomposed, ``0 ≤ layer < NL``.
        forward: ``forward(target, ids)`` runs the pass (default: the model's rows without the language-model
            head, :meth:`HeadModel.run_with_cache` of nothing); a caller passes its own to read other points
            in the same pass. The writes of every block up to ``layer`` are recorded at every position.
    Returns:
        :class:`ResidualParts` (iterate :meth:`ResidualParts.parts`).
    Raises:
        ValueError: a layer out of range, or a structure this decomposition does not read (the check named).
    """
    from headwise.checks import layer_number
    from headwise.patching.exact import check_pair

    target = as_target(model)
    layer = layer_number("layer", layer, target.num_layers)
    ids, _ = check_pair(target, ids, ids)
    anatomy = decomposed_anatomy(target)
    rec = Recorder(target, anatomy, slice(None), upto=layer, final=False)
    with torch.no_grad(), target.hooks(rec.hooks()):
        if forward is None:
            target.run_with_cache(ids, names=[])
        else:
            forward(target, ids)
    rec.finish()
    labels = ["embed"]
    for l_ in range(layer):
        labels += [f"L{l_}.H{h}" for h in range(target.heads_per_layer[l_])] + [f"L{l_}.attn_bias"]
        if anatomy[l_].mlp is not None:
            labels.append(f"L{l_}.mlp")
    return ResidualParts(layer, rec.resid.double(), labels, target, anatomy, rec)

"""Direct logit attribution: each head's, each MLP's and the embeddings' share of a logit difference.

Shape legend: P prompts, L length, D model width, V vocabulary, NL layers, H query heads, Dv value head width.

The residual stream at the read position is a sum of writes (Elhage et al. 2021): the embeddings (scaled,
with positions — the input of the first block), then in each block the attention's write and the MLP's
write. The attention's write is the output projection of the concatenated heads, so it splits exactly into
one term per head plus the projection's bias::

    o_proj(z) = Σ_h o_proj(z with every head but h zeroed) − (H − 1)·o_proj(0),   o_proj(0) = bias

(computed that way, so any affine projection — ``nn.Linear``, GPT-2's ``Conv1D`` — needs no layout). The
final norm is made linear by freezing its scale from the actual run (``1/σ`` of the read position, a
constant; LayerNorm's mean-centering is linear and applied to every part); a norm on the attention's write
(Gemma 2/3, OLMo 2: ``residual + norm(o_proj(z))``) is frozen the same way, so heads stay additive. Each
part, through the frozen final norm and the unembedding's rows ``U[answer] − U[wrong]``, is its direct
contribution. The parts — embeddings, every head, every output-projection bias, every MLP, the final norm's
bias and the unembedding's bias — add up to the unembedding's output difference (tested to 1e-4).

Soft-capping and logit scaling act after the unembedding (Gemma 2's ``final_logit_softcapping``:
``c·tanh(x/c)``), where nothing is additive: the parts add up to the difference *before* the cap, and
:class:`LogitAttribution` carries both that and the model's final difference.

The parts are the model's anatomy (:attr:`headwise.models.HeadModel.anatomy`: blocks, output projections, MLPs,
norms and multipliers on the writes, final norm, unembedding), read once for every tool; a structure it does not
read is refused there, in the sentence every tool repeats. Every identity is still checked on the run (the heads
against the projection's output, each block's writes against its change of the residual, each frozen norm against
the norm's output, the sum against the logits, with the anatomy's one tolerance). A layer's multiplier on its
writes (Granite) scales its heads, bias and MLP; parallel blocks (GPT-NeoX) add up the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from headwise.models.anatomy import affine, same
from headwise.patching.metric import LogitDifference
from headwise.patching.recording import Recorder, decomposed_anatomy
from headwise.patching.target import as_target
from headwise.points import output_tensor

__all__ = ["LogitAttribution", "direct_logit_attribution", "head_writes"]


@dataclass
class LogitAttribution:
    """Direct contributions to ``logit(answer) − logit(wrong)`` at one position, per prompt (leading P).

    Attributes:
        heads: ``(P, NL, H)`` each head's write through the frozen final norm (NaN where a layer has fewer).
        head_bias: ``(P, NL)`` each attention's output-projection bias (with a post-norm's bias).
        mlp: ``(P, NL)`` each MLP's write (zero for attention-only layers).
        embed: ``(P,)`` the embeddings (the first block's input).
        norm_bias: ``(P,)`` the final norm's bias.
        unembed_bias: ``(P,)`` the unembedding's bias.
        total: ``(P,)`` the sum of every part.
        unembed_difference: ``(P,)`` the unembedding's output difference — what the parts add up to.
        logit_difference: ``(P,)`` the model's final logits' difference (after soft-capping, if any).
        position: the position read.
    """

    heads: Tensor
    head_bias: Tensor
    mlp: Tensor
    embed: Tensor
    norm_bias: Tensor
    unembed_bias: Tensor
    total: Tensor
    unembed_difference: Tensor
    logit_difference: Tensor
    position: int

    def rows(self) -> list[tuple[str, int | None, int | None, float]]:
        """``(part, layer, head, value)`` of every part, means over the prompts, in residual-stream order."""
        out: list[tuple[str, int | None, int | None, float]] = [("embed", None, None, float(self.embed.mean()))]
        heads = self.heads.mean(0)
        for layer in range(heads.shape[0]):
            for head in range(heads.shape[1]):
                if not math.isnan(float(heads[layer, head])):
                    out.append(("head", layer, head, float(heads[layer, head])))
            out.append(("attention_bias", layer, None, float(self.head_bias[:, layer].mean())))
            out.append(("mlp", layer, None, float(self.mlp[:, layer].mean())))
        out.append(("final_norm_bias", None, None, float(self.norm_bias.mean())))
        out.append(("unembed_bias", None, None, float(self.unembed_bias.mean())))
        return out


# -- the attribution -------------------------------------------------------------------------------------------


def head_writes(out_proj: nn.Module, z: Tensor, H: int) -> tuple[Tensor, Tensor]:
    """``z (P, H·Dv)`` -> each head's write ``(P, H, D)`` and the projection's bias ``(D,)``."""
    P, width = z.shape
    Dv = width // H
    keep = torch.eye(H, dtype=z.dtype, device=z.device).repeat_interleave(Dv, dim=1)  # (H, H·Dv)
    with torch.no_grad():
        zero = output_tensor(out_proj(torch.zeros(1, 1, width, dtype=z.dtype, device=z.device)))[0, 0]  # (D,)
        each = output_tensor(out_proj(z[:, None, :] * keep[None]))  # (P, H, D)
    return (each.double() - zero.double()), zero.double()


def _layer_writes(target, anatomy, rec: Recorder, embed: Tensor):
    """Each layer's writes at the read position — its heads ``(P, H, D)``, its bias and its MLP ``(P, D)`` each,
    through a frozen norm on the write and times the layer's multiplier — checked to add up to each block's change
    of the residual stream; and the last block's output. Returns ``(heads, biases, mlps, residual)``."""
    residual = embed
    head_parts, bias_parts, mlp_parts = [], [], []
    for layer, part in enumerate(anatomy.layers):
        H = target.heads_per_layer[layer]
        got = rec.layers[layer]
        with target.holding(layer):  # the layer's weights in (a model opened layer by layer)
            each, bias = head_writes(part.out_proj, got.heads, H)  # (P, H, D), (D,)
            o_out = got.attn_out.double()  # (P, D)
            post = part.attn_post_frozen(o_out, got.attn_post_out)
        if not same(each.sum(1) + bias, o_out):
            raise ValueError(f"model: layer {layer}'s heads do not add up to its output projection's output")
        scale = part.scale
        if post is not None:
            each, bias = post(each), post(bias.expand(embed.shape[0], -1)) + post.bias  # (P, H, D), (P, D)
        else:
            bias = bias.expand(embed.shape[0], -1)  # (P, D)
        each, bias = each * scale, bias * scale  # the layer's multiplier on its writes (Granite)
        if part.mlp is not None:
            mlp_write = got.mlp_write.double() * scale  # (P, D)
        else:
            mlp_write = torch.zeros_like(embed)
        after = got.block_out.double()
        if not same(residual + each.sum(1) + bias + mlp_write, after):
            raise ValueError(
                f"model: layer {layer}'s attention and MLP writes do not add up to its change of the residual "
                f"stream ({type(part.block).__name__} is not a residual block this decomposition reads)"
            )
        residual = after
        head_parts.append(each)
        bias_parts.append(bias)
        mlp_parts.append(mlp_write)
    return head_parts, bias_parts, mlp_parts, residual


def _unembedding_rows(target, unembed: nn.Module, rows: Tensor) -> tuple[Tensor, Tensor | None]:
    """``(W[rows] (n, D), b[rows] (n,) or None)``: the unembedding's rows ``rows`` in ``nn.Linear``'s orientation —
    on a model opened layer by layer, read alone from the checkpoint where the unembedding is read by rows, else
    with the unembedding brought in for the read."""
    stream = getattr(target, "stream", None)
    if stream is not None and stream.unit_of(unembed) in stream.sliced:  # a bias-free nn.Linear read by rows
        return target.weight_rows(unembed, rows), None
    with target.holding(*([unembed] if stream is not None else [])):
        W, b = affine(unembed)
        rows = rows.to(W.device)
        return W.detach()[rows], None if b is None else b.detach()[rows]


def direct_logit_attribution(model, ids, metric: LogitDifference) -> LogitAttribution:
    """Split ``logit(answer) − logit(wrong)`` at ``metric.position`` into the parts that write it.

    Args:
        model: see :func:`headwise.patching.as_target` (Hugging Face decoders on headwise's backend, headwise's
            pre-norm decoders).
        ids: token ids ``(L,)`` or ``(P, L)``.
        metric: a :class:`~headwise.patching.LogitDifference` (one answer and wrong id per prompt).
    Returns:
        :class:`LogitAttribution`.
    Raises:
        TypeError: ``metric`` is not a LogitDifference.
        ValueError: the model's structure is not one this decomposition reads; the failed check is named.
    """
    from headwise.patching.exact import check_pair

    if not isinstance(metric, LogitDifference):
        raise TypeError(f"metric: expected a LogitDifference (logit_difference(answer, wrong)), got {metric!r}")
    target = as_target(model)
    ids, _ = check_pair(target, ids, ids)
    P = ids.shape[0]
    if len(metric.answer) != P:
        raise ValueError(f"metric: expected one answer per prompt ({P}), got {len(metric.answer)}")
    anatomy = decomposed_anatomy(target)
    rec = Recorder(target, anatomy, metric.position, upto=target.num_layers, final=True)
    with torch.no_grad(), target.hooks(rec.hooks()):
        logits = target.logits(ids)  # (P, L, V)
    rec.finish()
    a = torch.tensor(metric.answer, device=ids.device)
    w = torch.tensor(metric.wrong, device=ids.device)
    rows_ = torch.arange(P, device=ids.device)
    logit_difference = (logits[rows_, metric.position, a] - logits[rows_, metric.position, w]).double().cpu()

    # the residual stream's parts at the read position, each (P, D) or (P, H, D), float64
    embed = rec.embed.double()
    head_parts, bias_parts, mlp_parts, residual = _layer_writes(target, anatomy, rec, embed)
    x_final = rec.final_in.double()
    if not same(residual, x_final):
        raise ValueError("model: the final norm's input is not the last block's output")
    with target.holding(*([anatomy.final_norm] if anatomy.final_norm is not None else [])):
        final = anatomy.final_norm_frozen(x_final, rec.final_out)
    if final is not None:
        lin, norm_bias = final, final.bias
    else:
        lin, norm_bias = (lambda v: v), torch.zeros(x_final.shape[-1], dtype=torch.float64, device=x_final.device)

    U, ub = _unembedding_rows(target, anatomy.unembed, torch.cat([a, w]))  # (2P, D), (2P,) or None
    direction = (U[:P].double() - U[P:].double()).to(embed.device)  # (P, D)

    def through(part: Tensor) -> Tensor:  # (P, …, D) -> (P, …)
        d = direction.reshape(P, *([1] * (part.dim() - 2)), -1)
        return (lin(part) * d).sum(-1)

    unembed_bias = (ub[:P] - ub[P:]).double() if ub is not None else torch.zeros(P, dtype=torch.float64)
    heads = torch.full((P, target.num_layers, target.max_heads), float("nan"), dtype=torch.float64)
    for layer, each in enumerate(head_parts):
        heads[:, layer, : each.shape[1]] = through(each).cpu()
    head_bias = torch.stack([through(b).cpu() for b in bias_parts], 1)  # (P, NL)
    mlp = torch.stack([through(m).cpu() for m in mlp_parts], 1)  # (P, NL)
    embed_part = through(embed).cpu()
    norm_part = (norm_bias.to(direction.device) * direction).sum(-1).cpu()  # (P,)
    total = heads.nansum((1, 2)) + head_bias.sum(1) + mlp.sum(1) + embed_part + norm_part + unembed_bias.cpu()
    out = rec.unembed.double()  # (P, V)
    unembed_difference = (out[rows_, a] - out[rows_, w]).cpu()
    if not same(total, unembed_difference):
        raise ValueError(
            f"model: the parts add up to {total.tolist()}, the unembedding's difference is "
            f"{unembed_difference.tolist()} (a path this decomposition does not see)"
        )
    return LogitAttribution(
        heads=heads,
        head_bias=head_bias,
        mlp=mlp,
        embed=embed_part,
        norm_bias=norm_part,
        unembed_bias=unembed_bias.cpu(),
        total=total,
        unembed_difference=unembed_difference,
        logit_difference=logit_difference,
        position=metric.position,
    )

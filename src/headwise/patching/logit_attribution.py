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

The structure is read at run time, not from a list of families: the blocks are the attention modules'
parents, the MLP the block's child named ``mlp`` (``ff``, ``feed_forward``, …), a norm whose input is the
projection's (or MLP's) output is a post-norm. Every identity is checked on the run (the heads against the
projection's output, each block's writes against its change of the residual, each frozen norm against the
norm's output, the sum against the logits); a structure it does not read (parallel branches it cannot see,
a norm of another form) is refused with the check that failed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from headwise.models.anatomy import affine, norm_epsilon, same
from headwise.models.head_model import HeadModel
from headwise.patching.metric import LogitDifference
from headwise.patching.target import as_target

__all__ = [
    "FrozenNorm",
    "LogitAttribution",
    "ResidualParts",
    "affine_weight",
    "direct_logit_attribution",
    "freeze_norm",
    "read_structure",
    "residual_parts",
]


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


# -- reading the structure -------------------------------------------------------------------------------------


@dataclass
class _Structure:
    """The parts this decomposition reads, per attention layer (from the model's anatomy)."""

    blocks: list[nn.Module]
    out_projs: list[nn.Module]
    mlps: list[nn.Module | None]
    attn_posts: list[nn.Module | None]
    mlp_posts: list[nn.Module | None]
    scales: list[float]
    final_norm: nn.Module | None
    unembed: nn.Module


def _structure(target: HeadModel) -> _Structure:
    anatomy = target.anatomy
    if anatomy.unembed is None or affine(anatomy.unembed) is None:
        raise anatomy.refuse("its unembedding is not a linear map")
    layers = anatomy.layers
    return _Structure(
        [p.block for p in layers],
        [p.out_proj for p in layers],
        [p.mlp for p in layers],
        [p.attn_post for p in layers],
        [p.mlp_post for p in layers],
        [p.scale for p in layers],
        anatomy.final_norm,
        anatomy.unembed,
    )


def read_structure(model) -> _Structure:
    """The modules this decomposition reads, from the model's anatomy (:attr:`HeadModel.anatomy`): ``blocks``,
    ``out_projs``, ``mlps`` (None for attention-only blocks), ``attn_posts`` / ``mlp_posts`` (norms on the writes),
    ``scales`` (each layer's multiplier on its writes), per attention layer, then ``final_norm`` (None: the
    unembedding reads the last block's output) and ``unembed``.

    Raises:
        ValueError: a structure headwise does not read (the anatomy's one sentence).
    """
    return _structure(as_target(model))


# -- capture ---------------------------------------------------------------------------------------------------


def _first_tensor(args, kwargs) -> Tensor | None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, Tensor) and value.is_floating_point():
            return value
    return None


def _output_tensor(output) -> Tensor:
    return output[0] if isinstance(output, (tuple, list)) else output


class _Recorder:
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
                y = _output_tensor(output)
                if isinstance(y, Tensor) and y.dim() >= 3:
                    self.outputs[key] = self._at(y)

            self.handles.append(module.register_forward_hook(post))

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


# -- frozen norms ----------------------------------------------------------------------------------------------


def _close(a: Tensor, b: Tensor) -> bool:
    """The anatomy's one check (:func:`headwise.models.anatomy.same`) on sums of parts formed in float64."""
    return same(a, b)


@dataclass(frozen=True)
class FrozenNorm:
    """A norm at one run as ``y = lin(x) + bias`` with its scale frozen per row: ``lin(v) = C(v) · gain · inv``.

    Attributes:
        inv: ``(N,)`` float64, ``1/σ`` (LayerNorm) or ``1/rms`` (RMS norms) of each row of the run.
        gain: ``(D,)`` float64, the norm's learned gain (Gemma's ``1 + w`` read as it acts).
        bias: ``(D,)`` float64, the norm's bias (zeros without one).
        centred: True for a LayerNorm (``C`` subtracts the mean over D, which is linear), else ``C`` = identity.
    """

    inv: Tensor
    gain: Tensor
    bias: Tensor
    centred: bool

    def __call__(self, v: Tensor) -> Tensor:
        """``lin`` on parts ``(N, …, D)`` (rows first, as the run's rows)."""
        if self.centred:
            v = v - v.mean(-1, keepdim=True)
        inv = self.inv.to(v.device).reshape(self.inv.shape[0], *([1] * (v.dim() - 1)))
        return v * self.gain.to(v.device) * inv


def freeze_norm(norm: nn.Module, x: Tensor, y: Tensor, what: str) -> FrozenNorm:
    """The norm ``norm`` at inputs ``x (N, D)`` frozen as a :class:`FrozenNorm`, checked against its actual
    outputs ``y (N, D)`` (a LayerNorm, or an RMS norm ``x·g/rms(x) + b`` of any layout — the gain and bias
    are read by probing the module at 0 and 1).

    Raises:
        ValueError: the norm is neither (``what`` names it), or names no epsilon.
    """
    D = x.shape[-1]
    x64 = x.double()
    if isinstance(norm, nn.LayerNorm):
        inv = 1.0 / torch.sqrt(x64.var(-1, unbiased=False) + norm.eps)  # (N,)
        gain = norm.weight.detach().double() if norm.weight is not None else torch.ones(D, dtype=torch.float64)
        bias = norm.bias.detach().double() if norm.bias is not None else torch.zeros(D, dtype=torch.float64)
        frozen = FrozenNorm(inv, gain.to(x.device), bias.to(x.device), True)
    else:
        frozen = next(
            (f for centred in (False, True) if (f := _probed(norm, x64, y, centred)) is not None),
            None,
        )
        if frozen is None:
            raise ValueError(
                f"model: the {what} ({type(norm).__name__}) is neither a LayerNorm nor an RMS norm x·g/rms(x) + b "
                "at this run; its scale cannot be frozen"
            )
    if not _close(frozen(x64) + frozen.bias, y.double()):
        raise ValueError(
            f"model: the {what} ({type(norm).__name__}) is neither a LayerNorm nor an RMS norm x·g/rms(x) + b "
            "at this run; its scale cannot be frozen"
        )
    return frozen


def _zero_mean_probe(D: int) -> Tensor:
    """``(D,)`` float64 of ±1 and 2 with mean 0 and no zero entry (every column's gain is read)."""
    u = torch.ones(D, dtype=torch.float64)
    u[1::2] = -1.0
    if D % 2:
        u[-3:] = torch.tensor([2.0, -1.0, -1.0], dtype=torch.float64) if D >= 3 else u[-3:]
    return u


def _probed(norm: nn.Module, x64: Tensor, y: Tensor, centred: bool) -> FrozenNorm | None:
    """A norm of any class as ``(C(x) · g · inv) + b`` (``C`` the centring of a LayerNorm form, or nothing for an
    RMS form): the bias read at 0, the gain at a zero-mean probe; the per-row scale from the norm's epsilon, or,
    for a norm that names none (OLMo's), fitted to the run's rows by least squares. None when the form does not
    reproduce ``y``."""
    D = x64.shape[-1]
    param = next(norm.parameters(), None)
    dtype = param.dtype if param is not None else y.dtype
    u = _zero_mean_probe(D)
    with torch.no_grad():
        bias = _output_tensor(norm(torch.zeros(1, D, dtype=dtype, device=x64.device)))[0].double()
        at_u = _output_tensor(norm(u[None].to(dtype=dtype, device=x64.device)))[0].double()
    eps = norm_epsilon(norm)
    gain = (at_u - bias) / u.to(x64.device) * math.sqrt(float(u.pow(2).mean()) + (eps or 0.0))
    v = x64 - x64.mean(-1, keepdim=True) if centred else x64
    if eps is not None:
        inv = 1.0 / torch.sqrt(v.pow(2).mean(-1) + eps)  # (N,)
    else:
        target = (y.double() - bias) / gain.where(gain.abs() > 1e-12, torch.ones_like(gain))
        keep = gain.abs() > 1e-12
        inv = (v * target * keep).sum(-1) / (v.pow(2) * keep).sum(-1).clamp_min(1e-30)
    frozen = FrozenNorm(inv, gain, bias, centred)
    return frozen if _close(frozen(x64) + frozen.bias, y.double()) else None


def _frozen_norm(norm: nn.Module, x: Tensor, y: Tensor, what: str):
    """``(lin, bias)``: the norm at ``x (P, D)`` as ``y = lin(x) + bias``, its scale frozen; ``lin`` acts on
    ``(P, …, D)`` parts. Checked against the norm's actual output ``y``."""
    frozen = freeze_norm(norm, x, y, what)
    return frozen, frozen.bias


# -- the attribution -------------------------------------------------------------------------------------------


def _head_writes(out_proj: nn.Module, z: Tensor, H: int) -> tuple[Tensor, Tensor]:
    """``z (P, H·Dv)`` -> each head's write ``(P, H, D)`` and the projection's bias ``(D,)``."""
    P, width = z.shape
    Dv = width // H
    keep = torch.eye(H, dtype=z.dtype, device=z.device).repeat_interleave(Dv, dim=1)  # (H, H·Dv)
    with torch.no_grad():
        zero = _output_tensor(out_proj(torch.zeros(1, 1, width, dtype=z.dtype, device=z.device)))[0, 0]  # (D,)
        each = _output_tensor(out_proj(z[:, None, :] * keep[None]))  # (P, H, D)
    return (each.double() - zero.double()), zero.double()


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
    st = _structure(target)
    rec = _Recorder(metric.position)
    try:
        rec.watch("embed", st.blocks[0], outputs=False)
        for layer, (block, proj) in enumerate(zip(st.blocks, st.out_projs)):
            rec.watch(("block", layer), block, inputs=False)
            rec.watch(("proj", layer), proj)
            for part in (st.mlps[layer], st.attn_posts[layer], st.mlp_posts[layer]):
                if part is not None:
                    rec.watch((layer, id(part)), part)
        rec.watch("final", st.final_norm if st.final_norm is not None else st.unembed, outputs=False)
        if st.final_norm is not None:
            rec.watch("final_out", st.final_norm, inputs=False)
        rec.watch("unembed", st.unembed, inputs=False)
        with torch.no_grad():
            logits = target.logits(ids)  # (P, L, V)
    finally:
        rec.close()
    a = torch.tensor(metric.answer, device=ids.device)
    w = torch.tensor(metric.wrong, device=ids.device)
    rows_ = torch.arange(P, device=ids.device)
    logit_difference = (logits[rows_, metric.position, a] - logits[rows_, metric.position, w]).double().cpu()

    # the residual stream's parts at the read position, each (P, D) or (P, H, D), float64
    embed = rec.inputs["embed"].double()
    residual = embed
    head_parts, bias_parts, mlp_parts = [], [], []
    for layer, (block, proj, mlp) in enumerate(zip(st.blocks, st.out_projs, st.mlps)):
        H = target.heads_per_layer[layer]
        each, bias = _head_writes(proj, rec.inputs[("proj", layer)], H)  # (P, H, D), (D,)
        o_out = rec.outputs[("proj", layer)].double()  # (P, D)
        if not _close(each.sum(1) + bias, o_out):
            raise ValueError(f"model: layer {layer}'s heads do not add up to its output projection's output")
        norm, post, scale = st.attn_posts[layer], st.mlp_posts[layer], st.scales[layer]
        if norm is not None:
            lin, nb = _frozen_norm(norm, o_out, rec.outputs[(layer, id(norm))], f"layer {layer}'s attention norm")
            each, bias = lin(each), lin(bias.expand(embed.shape[0], -1)) + nb  # (P, H, D), (P, D)
        else:
            bias = bias.expand(embed.shape[0], -1)  # (P, D)
        each, bias = each * scale, bias * scale  # the layer's multiplier on its writes (Granite)
        if mlp is not None:
            mlp_write = rec.outputs[(layer, id(post if post is not None else mlp))].double() * scale  # (P, D)
        else:
            mlp_write = torch.zeros_like(embed)
        after = rec.outputs[("block", layer)].double()
        if not _close(residual + each.sum(1) + bias + mlp_write, after):
            raise ValueError(
                f"model: layer {layer}'s attention and MLP writes do not add up to its change of the residual "
                f"stream ({type(block).__name__} is not a residual block this decomposition reads)"
            )
        residual = after
        head_parts.append(each)
        bias_parts.append(bias)
        mlp_parts.append(mlp_write)
    x_final = rec.inputs["final"].double()
    if not _close(residual, x_final):
        raise ValueError("model: the final norm's input is not the last block's output")
    if st.final_norm is not None:
        lin, norm_bias = _frozen_norm(st.final_norm, x_final, rec.outputs["final_out"], "final norm")
    else:
        lin, norm_bias = (lambda v: v), torch.zeros(x_final.shape[-1], dtype=torch.float64, device=x_final.device)

    U = affine(st.unembed)[0].detach().double()  # (V, D)
    direction = (U[a] - U[w]).to(embed.device)  # (P, D)

    def through(part: Tensor) -> Tensor:  # (P, …, D) -> (P, …)
        d = direction.reshape(P, *([1] * (part.dim() - 2)), -1)
        return (lin(part) * d).sum(-1)

    ub = affine(st.unembed)[1]
    unembed_bias = (ub[a] - ub[w]).double() if ub is not None else torch.zeros(P, dtype=torch.float64)
    heads = torch.full((P, target.num_layers, target.max_heads), float("nan"), dtype=torch.float64)
    for layer, each in enumerate(head_parts):
        heads[:, layer, : each.shape[1]] = through(each).cpu()
    head_bias = torch.stack([through(b).cpu() for b in bias_parts], 1)  # (P, NL)
    mlp = torch.stack([through(m).cpu() for m in mlp_parts], 1)  # (P, NL)
    embed_part = through(embed).cpu()
    norm_part = (norm_bias.to(direction.device) * direction).sum(-1).cpu()  # (P,)
    total = heads.nansum((1, 2)) + head_bias.sum(1) + mlp.sum(1) + embed_part + norm_part + unembed_bias.cpu()
    out = rec.outputs["unembed"].double()  # (P, V)
    unembed_difference = (out[rows_, a] - out[rows_, w]).cpu()
    if not _close(total, unembed_difference):
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


# -- the residual stream's parts at every position (shared with headwise.circuits) -----------------------------


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
    _structure: _Structure
    _recorder: _Recorder

    def parts(self, project: Tensor | None = None):
        """Yield ``(labels, writes)`` one layer at a time — ``writes (n, P, L, D)`` float64 for the ``n`` labels
        (the embeddings alone first, then each earlier layer's heads, bias and MLP) — so that a caller can
        reduce each layer's writes before the next is formed (memory: one layer's parts). Each layer's writes
        are checked to add up to its change of the residual stream, the last to the block's input.

        ``project`` ``(D, E)`` float64: yield ``writes @ project`` ``(n, P, L, E)`` instead. Where the output
        projection is an ``nn.Linear`` or ``Conv1D``, each head's write is then formed as ``z_h (W_O,h project)``
        (never in D: ``L·H·Dh·E`` multiply-adds instead of ``L·H·(H·Dh)·D``), the heads' sum checked against
        the projection's output on the first rows, the block's sum in D as before."""
        rec, st, target = self._recorder, self._structure, self._target
        embed = rec.inputs["embed"].double()  # (P, L, D)
        P, L, D = embed.shape

        def out(v: Tensor) -> Tensor:  # (…, D) -> (…, E)
            return v if project is None else v @ project.to(v.device)

        residual = embed
        yield ["embed"], out(embed)[None]
        for layer in range(self.layer):
            block, proj, mlp = st.blocks[layer], st.out_projs[layer], st.mlps[layer]
            H = target.heads_per_layer[layer]
            z = rec.inputs[("proj", layer)].reshape(P * L, -1)
            o_out = rec.outputs[("proj", layer)].reshape(P * L, D).double()
            flat = _FlatRecorder(rec, P * L)
            norm, post, scale = st.attn_posts[layer], st.mlp_posts[layer], st.scales[layer]
            W = affine_weight(proj) if project is not None else None
            if W is not None:  # heads formed in the projected space
                bias = _head_writes(proj, z[:1], H)[1]  # (D,): the projection at 0
                rows = slice(0, min(P * L, 64))
                if not _close(z[rows].double() @ W + bias, o_out[rows]):
                    raise ValueError(f"model: layer {layer}'s heads do not add up to its output projection's output")
                Wh = W.reshape(H, -1, D)  # (H, Dv, D)
                zh = z.double().reshape(P * L, H, -1)  # (P·L, H, Dv)
                M = project.to(W.device)
                attn_write = o_out
                if norm is not None:
                    frozen = freeze_norm(
                        norm, o_out, flat.outputs[(layer, id(norm))], f"layer {layer}'s attention norm"
                    )
                    M = frozen.gain[:, None] * M
                    M = M - M.mean(0, keepdim=True) if frozen.centred else M
                    heads = torch.einsum("nhd,hde->hne", zh, Wh @ M) * frozen.inv[None, :, None]
                    bias = frozen(bias.expand(P * L, -1)) + frozen.bias  # (P·L, D)
                    attn_write = frozen(o_out) + frozen.bias
                else:
                    heads = torch.einsum("nhd,hde->hne", zh, Wh @ M)  # (H, P·L, E)
                    bias = bias.expand(P * L, -1)
                E = heads.shape[-1]
                writes = [heads.reshape(H, P, L, E), out(bias).reshape(1, P, L, E)]
            else:
                each, bias = _head_writes(proj, z, H)  # (P·L, H, D), (D,)
                if not _close(each.sum(1) + bias, o_out):
                    raise ValueError(f"model: layer {layer}'s heads do not add up to its output projection's output")
                if norm is not None:
                    lin, nb = _frozen_norm(
                        norm, o_out, flat.outputs[(layer, id(norm))], f"layer {layer}'s attention norm"
                    )
                    each, bias = lin(each), lin(bias.expand(P * L, -1)) + nb
                else:
                    bias = bias.expand(P * L, -1)
                attn_write = each.sum(1) + bias
                writes = [out(each.reshape(P, L, H, D).permute(2, 0, 1, 3)), out(bias.reshape(1, P, L, D))]
            if scale != 1.0:  # the layer's multiplier on its writes (Granite)
                writes = [w * scale for w in writes]
            labels = [f"L{layer}.H{h}" for h in range(H)] + [f"L{layer}.attn_bias"]
            total = attn_write.reshape(P, L, D) * scale
            if mlp is not None:
                mlp_write = flat.outputs[(layer, id(post if post is not None else mlp))].double() * scale
                labels.append(f"L{layer}.mlp")
                writes.append(out(mlp_write.reshape(1, P, L, D)))
                total = total + mlp_write.reshape(P, L, D)
            after = rec.outputs[("block", layer)].double()
            if not _close(residual + total, after):
                raise ValueError(
                    f"model: layer {layer}'s attention and MLP writes do not add up to its change of the residual "
                    f"stream ({type(block).__name__} is not a residual block this decomposition reads)"
                )
            residual = after
            yield labels, torch.cat(writes, 0)
        if not _close(residual, self.residual):
            raise ValueError(f"model: the parts do not add up to block {self.layer}'s input")


def affine_weight(proj: nn.Module) -> Tensor | None:
    """``W (in, out)`` float64 of ``x ↦ x W + b`` for an ``nn.Linear`` or GPT-2's ``Conv1D``, else None."""
    found = affine(proj)
    return None if found is None else found[0].detach().double().T


class _FlatRecorder:
    """A recorder's tensors of every position seen as ``(P·L, …)`` rows (what the frozen norms read)."""

    def __init__(self, rec: _Recorder, rows: int):
        self.inputs = {k: v.reshape(rows, *v.shape[2:]) for k, v in rec.inputs.items() if v.dim() >= 3}
        self.outputs = {k: v.reshape(rows, *v.shape[2:]) for k, v in rec.outputs.items() if v.dim() >= 3}


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
    st = _structure(target)
    rec = _Recorder(slice(None))
    try:
        rec.watch("embed", st.blocks[0], outputs=False)
        rec.watch("resid", st.blocks[layer], outputs=False)
        for l_ in range(layer):
            block = st.blocks[l_]
            rec.watch(("block", l_), block, inputs=False)
            rec.watch(("proj", l_), st.out_projs[l_])
            for part in (st.mlps[l_], st.attn_posts[l_], st.mlp_posts[l_]):
                if part is not None:
                    rec.watch((l_, id(part)), part)
        with torch.no_grad():
            if forward is None:
                target.run_with_cache(ids, names=[])
            else:
                forward(target, ids)
    finally:
        rec.close()
    labels = ["embed"]
    for l_ in range(layer):
        labels += [f"L{l_}.H{h}" for h in range(target.heads_per_layer[l_])] + [f"L{l_}.attn_bias"]
        if st.mlps[l_] is not None:
            labels.append(f"L{l_}.mlp")
    return ResidualParts(layer, rec.inputs["resid"].double(), labels, target, st, rec)

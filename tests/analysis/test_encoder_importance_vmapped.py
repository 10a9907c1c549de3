"""The encoder's importance (one primal, every head's tangent batched, rows packed by length) against one forward-mode
pass per layer and head on the batches as given."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

import headwise.hf  # noqa: E402
from _hf_models import VOCAB, build  # noqa: E402
from headwise.analysis import gates as G  # noqa: E402
from headwise.analysis import objective as O  # noqa: E402
from headwise.models import BertConfig, BertEncoder, HeadModel  # noqa: E402
from headwise.points import attention_point  # noqa: E402


def _ragged(lengths, L: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, mask)`` ``(len(lengths), L)``, right padding, row p with ``lengths[p]`` real tokens."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (len(lengths), L), generator=g)
    mask = (torch.arange(L)[None, :] < torch.tensor(lengths)[:, None]).long()
    return ids.masked_fill(mask == 0, 0), mask


def _one_head_at_a_time(hm, batches) -> tuple[np.ndarray, int]:
    """``E_x ‖(I − ê êᵀ) ∂e/∂ξ_h‖ / ‖e‖``: for every layer and head its own forward-mode pass over each batch as
    given (padding included), the tangent on that head's gate alone."""
    import torch.autograd.forward_ad as fwad

    nl, h = hm.num_layers, hm.num_heads
    dtype = next(hm.model.parameters()).dtype
    total, sequences = np.zeros((nl, h)), 0
    with torch.no_grad():
        for ids, mask in batches:
            b = ids.shape[0]
            e = O.mean_pooled(hm.forward(ids, mask, math_path=True), mask)
            unit = e / e.norm(dim=-1, keepdim=True)
            for layer in range(nl):
                for head in range(h):
                    tangent = torch.zeros((b, h), dtype=dtype)
                    tangent[:, head] = 1.0
                    with fwad.dual_level():
                        gates = fwad.make_dual(torch.ones_like(tangent), tangent)

                        def gate(out, gates=gates):
                            return out * gates[:, :, None, None].to(out.dtype)

                        with hm.hooks({attention_point(layer, "heads"): gate}):
                            pooled = O.mean_pooled(hm.forward(ids, mask, math_path=True), mask)
                        de = fwad.unpack_dual(pooled).tangent  # (B, D)
                    turn = de - (de * unit).sum(-1, keepdim=True) * unit
                    total[layer, head] += float((turn.norm(dim=-1) / e.norm(dim=-1)).double().sum())
            sequences += b
    return total / sequences, sequences


def _headwise_bert(seed: int = 0):
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=3, num_attention_heads=4, intermediate_size=32
    )
    return HeadModel(BertEncoder(config).eval())


@pytest.mark.parametrize("which", ["hf_bert", "headwise_bert"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_batched_tangents_equal_one_pass_per_head(which, dtype):
    hm = HeadModel(build("bert", attn=headwise.hf.NAME, seed=2)) if which == "hf_bert" else _headwise_bert()
    hm.model.to(dtype)
    batches = [_ragged([8, 3, 6], 8, 1), _ragged([2, 7], 9, 4)]  # padding inside and past each batch's longest
    with torch.no_grad():
        references = [O.mean_pooled(hm.forward(ids, mask), mask) for ids, mask in batches]
    got, sequences = G.encoder_importance(hm, batches, references, lambda *a: None)
    want, want_sequences = _one_head_at_a_time(hm, batches)
    assert sequences == want_sequences == 5
    assert got.shape == (hm.num_layers, hm.num_heads) and got.min() > 0
    atol = 1e-5 if dtype == torch.float32 else 1e-12
    np.testing.assert_allclose(got, want, rtol=0, atol=atol * max(1.0, float(np.abs(want).max())))


def test_packing_does_not_change_the_importance():
    """The same sentences as one batch or three, in another order: the same importance (rows packed alike)."""
    hm = _headwise_bert(1)
    hm.model.double()
    ids, mask = _ragged([5, 9, 2, 7, 4], 9, 3)
    order = [3, 0, 4, 1, 2]
    split = [(ids[order[:2]], mask[order[:2]]), (ids[order[2:3]], mask[order[2:3]]), (ids[order[3:]], mask[order[3:]])]
    runs = []
    for batches in ([(ids, mask)], split):
        with torch.no_grad():
            references = [O.mean_pooled(hm.forward(i, m), m) for i, m in batches]
        runs.append(G.encoder_importance(hm, batches, references, lambda *a: None)[0])
    np.testing.assert_allclose(runs[0], runs[1], rtol=0, atol=1e-12)

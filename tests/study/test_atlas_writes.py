"""Every head's written tokens, direct effect on the loss and largest writes (study/atlas_writes.py) against a brute
force on the model's own modules: each head's write formed by the output projection on its slice alone, the final
norm's scale computed by hand, the loss recomputed through the model's final norm and unembedding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from _decoders import save_decoder
from headwise.models import open_model
from headwise.patching.logit_attribution import head_writes
from headwise.points import layer_point
from headwise.study.atlas_writes import HeadWrites, ov_mappings

TEXTS = ["the cat sat on the mat and the dog ran to the tree", "a red tree . the big house", "one two three"]


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def hm(request, tmp_path_factory):
    folder = save_decoder(tmp_path_factory.mktemp(request.param), request.param, init=0.5, seed=3)
    return open_model(str(folder))


def _brute(hm, ids, mask):
    """Per head: the mean write through the frozen final norm (NL, H, D), per predicted token the write (NL, H, M, D),
    the final residual rows, their targets."""
    names = [layer_point(i, "attn.heads") for i in range(hm.num_layers)] + ["resid_final"]
    cache = hm.run_with_cache(ids, mask, names=names)
    m = mask.bool()
    x = cache["resid_final"][m].double()  # (N, D)
    norm = hm.anatomy.final_norm
    if hasattr(norm, "variance_epsilon"):  # RMS
        inv = (x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon).rsqrt()
        gain, centred = norm.weight.double(), False
    else:  # LayerNorm
        inv = (x.var(-1, unbiased=False, keepdim=True) + norm.eps).rsqrt()
        gain, centred = norm.weight.double(), True
    writes = []
    for i in range(hm.num_layers):
        z = cache[layer_point(i, "attn.heads")]  # (B, H, L, Dh)
        B, H, L, Dh = z.shape
        flat = z.permute(0, 2, 1, 3).reshape(B, L, H * Dh)[m]  # (N, H·Dh)
        each, _ = head_writes(hm.anatomy[i].out_proj, flat.float(), H)  # (N, H, D)
        writes.append(each)
    w = torch.stack(writes)  # (NL, N, H, D)
    v = w - w.mean(-1, keepdim=True) if centred else w
    u = v * gain * inv[None, :, None, :]
    return w, u, x


@torch.no_grad()
def test_written_tokens_and_loss_effect_equal_a_brute_force(hm):
    enc = hm.encode(TEXTS)
    ids, mask = enc.ids, enc.mask
    writes = HeadWrites(hm, top=3, context=6, exact_tokens=10)
    with torch.no_grad(), writes.batch(ids.numpy(), mask.numpy(), 0):
        hm.forward(ids, mask)
    got = writes.result()
    w, u, x = _brute(hm, ids, mask)
    N = x.shape[0]
    assert got.tokens == N
    np.testing.assert_allclose(got.mean_write, u.mean(1).numpy(), rtol=1e-4, atol=1e-6)

    # written tokens: the unembedding of the mean write
    U = hm.anatomy.unembed.weight.double()
    (raises, lowers) = writes.written(got, k=3)[1][2]
    logits = U @ u.mean(1)[1, 2]
    assert [i for i, _ in raises] == logits.topk(3).indices.tolist()
    assert [i for i, _ in lowers] == (-logits).topk(3).indices.tolist()
    np.testing.assert_allclose([v for _, v in raises], logits.topk(3).values.numpy(), rtol=1e-4)

    # the loss: predicted tokens and their targets
    m = mask.bool()
    pred = m[:, :-1] & m[:, 1:]
    targets = ids[:, 1:][pred]
    nxt = torch.zeros_like(m)
    nxt[:, :-1] = pred
    rows = nxt[m]  # (N,) predicted among the real tokens
    xs, ws, us = x[rows], w[:, rows], u[:, rows]  # (M, D), (NL, M, H, D)
    M = xs.shape[0]
    assert got.predicted == M

    def ce(r, t):  # (…, m, D), (m,) -> (…, m)
        y = hm.anatomy.final_norm(r.float()).double()
        lp = torch.log_softmax(y @ U.T, -1)
        return -lp.gather(-1, t.expand(*r.shape[:-1]).unsqueeze(-1)).squeeze(-1)

    # first order, the final norm frozen: the write removed changes the logits by −U u
    logits = hm.anatomy.final_norm(xs.float()).double() @ U.T
    g = torch.softmax(logits, -1)
    g[torch.arange(M), targets] -= 1  # dL/dlogits
    est = -(us @ U.T * g[None, :, None]).sum(-1)  # (NL, M, H)
    np.testing.assert_allclose(got.loss_effect, est.mean(1).numpy(), rtol=1e-4, atol=1e-7)
    assert (got.stride, got.loss_tokens) == (1, M)
    np.testing.assert_allclose(got.loss_stderr, est.std(1).numpy() / M**0.5, rtol=1e-4, atol=1e-8)
    # a budget of 5 tokens: every s-th predicted token, s the smallest power of two that keeps at most 5
    small = HeadWrites(hm, top=1, exact_tokens=3, loss_tokens=5)
    for s in (slice(0, 1), slice(1, 3)):  # two batches: the stride is the corpus's, not a batch's
        e = hm.encode(TEXTS[s])
        with small.batch(e.ids.numpy(), e.mask.numpy(), s.start):
            hm.forward(e.ids, e.mask)
    thin = small.result()
    stride = next(2**j for j in range(10) if len(range(0, M, 2**j)) <= 5)
    assert (thin.stride, thin.loss_tokens, thin.predicted) == (stride, len(range(0, M, stride)), M)
    on = est[:, ::stride]
    np.testing.assert_allclose(thin.loss_effect, on.mean(1).numpy(), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(thin.loss_stderr, on.std(1).numpy() / on.shape[1] ** 0.5, rtol=1e-4, atol=1e-8)
    np.testing.assert_allclose(thin.estimate_sample, est[:, :3].mean(1).numpy(), rtol=1e-4, atol=1e-7)
    # told the corpus's length, the stride is set after the first batch (its tokens a text): the same rule holds
    told = HeadWrites(hm, top=1, exact_tokens=3, loss_tokens=3, texts=3)
    for s in (slice(0, 1), slice(1, 3)):
        e = hm.encode(TEXTS[s])
        with told.batch(e.ids.numpy(), e.mask.numpy(), s.start):
            hm.forward(e.ids, e.mask)
    hinted = told.result()
    assert hinted.stride > 1 and hinted.loss_tokens == len(range(0, M, hinted.stride)) <= 3
    np.testing.assert_allclose(hinted.loss_effect, est[:, :: hinted.stride].mean(1).numpy(), rtol=1e-4, atol=1e-7)
    with pytest.raises(ValueError, match="loss_tokens"):
        HeadWrites(hm, loss_tokens=0)
    # exact on the first 10 predicted tokens
    k = got.sampled
    assert k == min(10, M)
    exact = ce(xs[:k][None, None] - ws[:, :k].permute(0, 2, 1, 3), targets[:k]) - ce(xs[:k], targets[:k])  # (NL, H, k)
    np.testing.assert_allclose(got.exact_sample, exact.mean(-1).numpy(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got.estimate_sample, est[:, :k].mean(1).numpy(), rtol=1e-4, atol=1e-7)

    # the largest writes: the brute force's top norms, with their positions
    norms = w.norm(dim=-1)  # (NL, N, H)
    pos = torch.arange(ids.shape[1]).expand_as(m)[m]
    txt = torch.arange(ids.shape[0])[:, None].expand_as(m)[m]
    for layer in range(hm.num_layers):
        for h in range(hm.num_heads):
            vals, idx = norms[layer, :, h].topk(3)
            kept = got.top[layer][h]
            np.testing.assert_allclose([r[0] for r in kept], vals.numpy(), rtol=1e-4)
            where = {(int(txt[i]), int(pos[i])): float(norms[layer, i, h]) for i in range(len(pos))}
            for r in kept:  # each kept record is that token's write (ties may come in either order)
                assert r[0] == pytest.approx(where[(r[1], r[2])], rel=1e-4)
            norm_, text, position, snippet, at = kept[0]
            assert snippet[at] == int(ids[text, position])


@torch.no_grad()
def test_two_batches_add_up_to_one(hm):
    enc = hm.encode(TEXTS)
    one = HeadWrites(hm, top=2, exact_tokens=4)
    with torch.no_grad(), one.batch(enc.ids.numpy(), enc.mask.numpy(), 0):
        hm.forward(enc.ids, enc.mask)
    two = HeadWrites(hm, top=2, exact_tokens=4)
    for s in (slice(0, 1), slice(1, 3)):
        e = hm.encode(TEXTS[s])
        with torch.no_grad(), two.batch(e.ids.numpy(), e.mask.numpy(), s.start):
            hm.forward(e.ids, e.mask)
    a, b = one.result(), two.result()
    np.testing.assert_allclose(a.mean_write, b.mean_write, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(a.loss_effect, b.loss_effect, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(a.exact_sample, b.exact_sample, rtol=1e-5, atol=1e-7)
    for layer_a, layer_b in zip(a.top, b.top):
        for kept_a, kept_b in zip(layer_a, layer_b):
            np.testing.assert_allclose([r[0] for r in kept_a], [r[0] for r in kept_b], rtol=1e-5)


@torch.no_grad()
def test_ov_mappings_by_hand(hm):
    sources = torch.tensor([4, 5, 6, 7])
    targets = torch.tensor([4, 5, 6, 7, 8, 9])
    got = ov_mappings(hm, sources, targets, k=2)
    a = hm.anatomy
    e = a.embed(sources[None])[0].double()
    U = a.unembed.weight.double()[targets] * a.final_norm.weight.double()
    if hasattr(a.final_norm, "eps") and not hasattr(a.final_norm, "variance_epsilon"):
        U = U - U.mean(-1, keepdim=True)
    for layer in range(hm.num_layers):
        part = a[layer]
        x = part.attn_input(e.float()).double()
        Wv, bv = part.v.weights("rows")
        vals = x @ Wv.double().T + (0 if bv is None else bv.double())  # (F, n·Dv)
        n = part.v.n
        Dv = vals.shape[1] // n
        Wo = part.heads_out().double()
        for h in range(hm.num_heads):
            g = h * n // hm.num_heads
            s = vals[:, g * Dv : (g + 1) * Dv] @ Wo[h] @ U.T  # (F, T)
            s = s - s.mean(0, keepdim=True)
            best = s.argmax(1)
            share = float((targets[best] == sources).double().mean())
            assert got[layer][h]["copying"] == pytest.approx(share)
            order = s.max(1).values.argsort(descending=True)[:2]
            assert [t[0] for t in got[layer][h]["top"]] == sources[order].tolist()
            assert [t[1] for t in got[layer][h]["top"]] == targets[best[order]].tolist()


def test_the_sample_is_named_with_an_ordinal():
    from headwise.study.heads_lines import ordinal

    got = [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 32, 112, 512)]
    assert got == ["1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "32nd", "112th", "512th"]

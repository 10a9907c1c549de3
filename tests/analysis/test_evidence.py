"""The atlas's evidence (offsets, first token, marks, top contexts), read in the streaming pass, equals a brute force
on every head's full attention maps: padding, several blocks per layer, two batches merged, a non-causal encoder,
and runs split in two and merged through their states."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headwise.analysis import DecoderStats, TokenInfo
from headwise.analysis.evidence import LINE_START, SAME_TOKEN, HeadEvidence
from headwise.analysis.evidence_top import GAP, snippets
from headwise.analysis.streaming import read_rows
from headwise.models import BertConfig, BertEncoder, HeadModel, LMConfig, TransformerLM
from headwise.models.llama import LlamaConfig, LlamaLM

K, TOP, MIN_KEYS, CONTEXT = 4, 5, 7, 6


def _randomised(model, seed: int, scale: float):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, scale, generator=g)
    return model.eval()


def _decoder(seed: int = 0) -> HeadModel:
    config = LMConfig(vocab_size=12, context_length=32, d_model=16, num_layers=2, num_heads=2, positional="learned")
    return HeadModel(_randomised(TransformerLM(config), seed, 0.6))


def _llama(seed: int = 0) -> HeadModel:
    """headwise's Llama with grouped-query heads (4 query heads over 2 key/value groups)."""
    config = LlamaConfig.from_dict(dict(
        model_type="llama", vocab_size=12, hidden_size=16, intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
    ))  # fmt: skip
    return HeadModel(_randomised(LlamaLM(config), seed, 0.6))


def _encoder(seed: int = 1) -> HeadModel:
    config = BertConfig(
        vocab_size=12, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=16,
        max_position_embeddings=32,
    )  # fmt: skip
    return HeadModel(_randomised(BertEncoder(config), seed, 0.6))


def _batch(rng, lengths, L, vocab=12, *, left=False):
    ids = np.zeros((len(lengths), L), dtype=np.int64)
    mask = np.arange(L)[None] < np.asarray(lengths)[:, None]
    mask = mask[:, ::-1].copy() if left else mask
    ids[mask] = rng.integers(1, vocab, int(mask.sum()))
    return ids, mask


def _line_starts(ids, mask, newline: int = 3):
    """Each real token's line start among the real tokens: the token after the last ``newline`` before it."""
    out = np.full(ids.shape, -1)
    for b in range(ids.shape[0]):
        start = 0
        for i, slot in enumerate(np.flatnonzero(mask[b])):
            out[b, slot] = start
            if ids[b, slot] == newline:
                start = i + 1
    return out


def _brute(maps, ids, mask, first_text, marks, line, *, causal, skip_self=False):
    """Every statistic from the full maps, row by row."""
    NL, H = len(maps), maps[0].shape[1]
    off, first, beyond = np.zeros((NL, H, 2 * K)), np.zeros((NL, H)), np.zeros((NL, H))
    got_marks = {name: np.zeros((NL, H)) for name in (SAME_TOKEN, *marks, LINE_START)}
    cands = [[[] for _ in range(H)] for _ in range(NL)]
    rows = 0
    for b in range(ids.shape[0]):
        idx = np.flatnonzero(mask[b])
        n, t = len(idx), ids[b, idx]
        rows += n
        for layer, m in enumerate(maps):
            a = m[b][:, idx][:, :, idx].astype(np.float64)
            a = a / a.sum(-1, keepdims=True)
            for i in range(n):
                for j in range(n):
                    s, d = a[:, i, j], i - j
                    if j == 0:
                        first[layer] += s
                        continue
                    if -K <= d < K:
                        off[layer, :, d + K] += s
                    else:
                        beyond[layer] += s
                    got_marks[SAME_TOKEN][layer] += s * (t[i] == t[j] and i != j)
                    for name, mk in marks.items():
                        got_marks[name][layer] += s * mk[b, idx[j]]
                    got_marks[LINE_START][layer] += s * (j == line[b, idx[i]] and j != i)
                if (i + 1 if causal else n) >= MIN_KEYS:
                    for h in range(H):
                        row = a[h, i].copy()
                        row[0] = -1
                        if skip_self:
                            row[i] = -1
                        j = int(np.argmax(row))
                        if row[j] > 0:
                            cands[layer][h].append((-row[j], first_text + b, i, j))
    top = [[sorted(c)[:TOP] for c in per_layer] for per_layer in cands]
    return off / rows, first / rows, beyond / rows, {k: v / rows for k, v in got_marks.items()}, top, rows


def _check(evidence, brute, texts, *, causal):
    off, first, beyond, marks, top, rows = brute
    r = evidence.result()
    assert r.rows == rows
    if causal:
        assert r.start == 0 and not off[..., :K].any()
        off = off[..., K:]
    else:
        assert r.start == -K
    np.testing.assert_allclose(r.offsets, off, atol=1e-5, rtol=0)
    np.testing.assert_allclose(r.first, first, atol=1e-5, rtol=0)
    np.testing.assert_allclose(r.beyond, beyond, atol=1e-5, rtol=0)
    np.testing.assert_allclose(r.first + r.offsets.sum(-1) + r.beyond, 1.0, atol=1e-5)
    assert set(r.marks) == set(marks)
    for name in marks:
        np.testing.assert_allclose(r.marks[name], marks[name], atol=1e-5, rtol=0, err_msg=name)
    for layer, per_layer in enumerate(top):
        for h, want in enumerate(per_layer):
            got = r.contexts[layer][h]
            assert [(c.text, c.query, c.key) for c in got] == [(t, i, j) for _, t, i, j in want], (layer, h)
            np.testing.assert_allclose([c.weight for c in got], [-w for w, _, _, _ in want], atol=1e-5, rtol=0)
            for c in got:  # the snippet shows the text's tokens, key and query where it says
                tokens = texts[c.text]
                assert len(c.ids) <= CONTEXT
                assert c.ids[c.key_at] == tokens[c.key] and c.ids[c.query_at] == tokens[c.query]
                pieces = c.ids.count(GAP)
                assert pieces <= 1 and (pieces == 1) == (abs(c.query - c.key) + 1 + 2 * (CONTEXT // 8) > CONTEXT)
    return r


def _run(hm, batches, *, causal, block_size, split=False, skip_self=False):
    """The streaming pass over ``batches`` (with the statistics), beside the brute force on the full maps."""
    marks_names = ("newline",)
    evs = [HeadEvidence(hm.num_layers, hm.num_heads, top=TOP, offsets=K, min_keys=MIN_KEYS, context=CONTEXT,
                        marks=marks_names, line_start=True, skip_self=skip_self)
           for _ in range(2 if split else 1)]  # fmt: skip
    stats = DecoderStats(hm.num_layers, hm.num_heads, max_length=hm.max_length)
    sums = None
    texts, first_text = {}, 0
    for k, (ids, mask) in enumerate(batches):
        marks, line = {"newline": ids == 3}, _line_starts(ids, mask)
        ev = evs[k % len(evs)]
        read_rows(
            hm, torch.as_tensor(ids), torch.as_tensor(mask), TokenInfo(mask, *[np.zeros_like(mask)] * 3),
            head_stats=stats.heads, detector_stats=stats.detectors, block_size=block_size,
            extra=[ev.reader(first_text=first_text, marks=marks, line_start=line)],
        )  # fmt: skip
        maps = hm.attentions(torch.as_tensor(ids), torch.as_tensor(mask))
        part = _brute(maps, ids, mask, first_text, marks, line, causal=causal, skip_self=skip_self)
        for b in range(ids.shape[0]):
            texts[first_text + b] = ids[b, mask[b]].tolist()
        sums = part if sums is None else _add(sums, part)
        first_text += ids.shape[0]
    if split:
        evs[0].add_state(evs[1].state())
    return evs[0], sums, texts


def _add(a, b):
    (o1, f1, b1, m1, t1, r1), (o2, f2, b2, m2, t2, r2) = a, b
    r = r1 + r2
    mix = lambda x, y: (x * r1 + y * r2) / r  # noqa: E731
    top = [[sorted(x + y)[:TOP] for x, y in zip(p, q)] for p, q in zip(t1, t2)]
    return mix(o1, o2), mix(f1, f2), mix(b1, b2), {k: mix(m1[k], m2[k]) for k in m1}, top, r


@pytest.mark.parametrize("model, block_size, skip_self", [("lab", 3, False), ("lab", 64, False), ("lab", 4, True),
                                                         ("llama", 5, False)])  # fmt: skip
def test_a_decoders_evidence_in_the_streaming_pass_equals_the_brute_force(model, block_size, skip_self):
    hm, rng = _decoder() if model == "lab" else _llama(), np.random.default_rng(0)
    batches = [_batch(rng, [14, 5, 20], 20), _batch(rng, [9, 17], 17)]  # padding, two batches
    ev, brute, texts = _run(hm, batches, causal=True, block_size=block_size, skip_self=skip_self)
    r = _check(ev, brute, texts, causal=True)
    assert any(c.text >= 3 for per in r.contexts for cs in per for c in cs)  # the second batch's texts kept too
    assert any(GAP in c.ids for per in r.contexts for cs in per for c in cs)  # a cut snippet was checked


def test_an_encoders_evidence_has_negative_offsets_and_equals_the_brute_force():
    hm, rng = _encoder(), np.random.default_rng(1)
    batches = [_batch(rng, [12, 7], 12), _batch(rng, [15], 15)]
    ev, brute, texts = _run(hm, batches, causal=False, block_size=4)
    _check(ev, brute, texts, causal=False)


@pytest.mark.parametrize("skip_self", [False, True])
def test_runs_split_in_two_and_merged_through_their_states_equal_one_run(skip_self):
    """Also a left-padded batch (texts starting at different slots, said by the token info)."""
    hm, rng = _decoder(2), np.random.default_rng(2)
    batches = [_batch(rng, [11, 16], 16), _batch(rng, [13, 6, 10], 13, left=True), _batch(rng, [8], 8)]
    ev, brute, texts = _run(hm, batches, causal=True, block_size=5, split=True, skip_self=skip_self)
    _check(ev, brute, texts, causal=True)


def test_the_evidence_pass_leaves_the_statistics_unchanged():
    hm, rng = _decoder(3), np.random.default_rng(3)
    ids, mask = _batch(rng, [12, 9], 12)
    out = []
    for extra in ([], [HeadEvidence(2, 2).reader(first_text=0)]):
        stats = DecoderStats(2, 2, max_length=32)
        read_rows(hm, torch.as_tensor(ids), mask, head_stats=stats.heads, detector_stats=stats.detectors, extra=extra)
        out.append(stats.state())
    for key in out[0]:
        torch.testing.assert_close(out[1][key], out[0][key], rtol=0, atol=0, msg=key)


def test_snippets_keep_key_and_query_and_cut_long_spans():
    q, k, n = torch.tensor([2, 30, 5, 40]), torch.tensor([0, 1, 5, 39]), torch.tensor([10, 50, 6, 41])
    pos, key_at, query_at = snippets(q, k, n, 9)
    for m in range(4):
        row = pos[m].tolist()
        assert row[int(key_at[m])] == k[m] and row[int(query_at[m])] == q[m]
        shown = [p for p in row if p >= 0]
        assert shown == sorted(shown) and len(row) == 9 and all(0 <= p < n[m] for p in shown)
    assert GAP in pos[1].tolist() and GAP not in pos[0].tolist()
    pos, key_at, query_at = snippets(torch.tensor([29, 40]), torch.tensor([12, 12]), torch.tensor([64, 64]), 24)
    assert GAP not in pos[0].tolist() and GAP in pos[1].tolist()
    assert (key_at >= 3).all() and (pos[torch.arange(2), query_at + 3] == torch.tensor([32, 43])).all()  # 3 each side


def test_the_accumulators_arguments_are_checked():
    with pytest.raises(ValueError, match="context"):
        HeadEvidence(2, 2, context=4)
    with pytest.raises(ValueError, match="top"):
        HeadEvidence(2, 2, top=0)
    with pytest.raises(ValueError, match="marks"):
        HeadEvidence(2, 2, marks=(SAME_TOKEN,))
    hm, rng = _decoder(), np.random.default_rng(4)
    ids, mask = _batch(rng, [6], 6)
    ev = HeadEvidence(2, 2, marks=("newline",))
    with pytest.raises(ValueError, match="marks: expected the names"):
        read_rows(hm, torch.as_tensor(ids), mask, extra=[ev.reader(first_text=0)])
    with pytest.raises(ValueError, match="shape"):
        read_rows(hm, torch.as_tensor(ids), mask, extra=[ev.reader(first_text=0, marks={"newline": ids[:, :3]})])
    with pytest.raises(ValueError, match="state"):
        ev.add_state(HeadEvidence(2, 2).state())

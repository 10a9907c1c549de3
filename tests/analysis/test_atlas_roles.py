"""The atlas's roles: a head built by hand to look three tokens back is named positional at offset 3 with its top
contexts there; the rules' priority, "other" only where nothing fits, and the thresholds' checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headwise.analysis import DecoderStats
from headwise.analysis.atlas_roles import ATLAS_ROLES, AtlasThresholds, atlas_roles
from headwise.analysis.evidence import LINE_START, SAME_TOKEN, Evidence, HeadEvidence
from headwise.analysis.streaming import read_rows
from headwise.models import HeadModel, LMConfig, TransformerLM

P, D = 24, 48  # positions, width: dims 0 … P − 1 carry a one-hot position, the rest the token


def _offset_model(offset: int) -> HeadModel:
    """One attention layer, two heads of width 24: head 0's query at position p is the one-hot of p − ``offset``
    and its key the one-hot of p, so it attends ``offset`` tokens back; head 1 random."""
    torch.manual_seed(0)
    model = TransformerLM(LMConfig(vocab_size=16, context_length=P, d_model=D, num_layers=1, num_heads=2,
                                   positional="learned")).eval()  # fmt: skip
    attn = model.layers[0].self_attn
    with torch.no_grad():
        model.pos_embed.weight.zero_()
        model.pos_embed.weight[:, :P] = torch.eye(P)
        model.embed.weight.normal_(0, 0.1)
        model.embed.weight[:, :P] = 0
        for lin in (attn.Wq, attn.Wk):
            lin.bias.zero_()
            lin.weight[:P].zero_()
        attn.Wk.weight[:P, :P] = torch.eye(P)
        attn.Wq.weight[: P - offset, offset:P] = 3 * torch.eye(P - offset)  # reads position p, writes p − offset
    return HeadModel(model)


def _corpus(hm, batches, **kw):
    evidence = HeadEvidence(hm.num_layers, hm.num_heads, **kw)
    stats = DecoderStats(hm.num_layers, hm.num_heads, max_length=hm.max_length)
    first = 0
    for ids in batches:
        read_rows(hm, torch.as_tensor(ids), None, head_stats=stats.heads, detector_stats=stats.detectors,
                  block_size=7, extra=[evidence.reader(first_text=first)])  # fmt: skip
        first += ids.shape[0]
    return stats.result(), evidence.result()


def test_a_head_built_to_look_three_back_is_positional_at_offset_3():
    hm, rng = _offset_model(3), np.random.default_rng(0)
    report, ev = _corpus(hm, [rng.integers(0, 16, (3, P)), rng.integers(0, 16, (2, P))])
    assert ev.at_offset(3)[0, 0] > 0.7  # rows 4 … 23 of 24 (row 3's key is the first token, counted apart)
    roles = atlas_roles(report, ev)
    assert roles.primary[0, 0] == "positional"
    named = {r.name: r for r in roles.roles[0][0]}
    assert named["positional"].detail == "offset 3" and named["positional"].threshold == 0.5
    assert roles.roles[0][0][0].name == "positional"
    contexts = ev.contexts[0][0]
    assert len(contexts) == 8 and all(c.offset == 3 and c.weight > 0.99 for c in contexts)
    assert [(c.text, c.query) for c in contexts] == sorted((c.text, c.query) for c in contexts)  # ties: text, query
    assert not any(r.detail == "offset 3" for r in roles.roles[0][1])


def _evidence(first, offsets, marks, start=0):
    NL, H = np.shape(first)
    return Evidence(np.asarray(offsets, dtype=float), start, np.asarray(first, dtype=float), np.zeros((NL, H)),
                    {k: np.asarray(v, dtype=float) for k, v in marks.items()}, [[[]] * H] * NL, 100, 8)  # fmt: skip


def test_the_rules_priority_and_other_only_where_nothing_fits():
    # four heads of one layer: induction + sink, previous-token, a delimiter + copying head, nothing
    metrics = {
        "induction_probe": [[0.9, 0.1, 0.1, 0.1]],
        "duplicate_probe": [[0.0, 0.0, 0.0, 0.0]],
        "prev": [[0.1, 0.8, 0.1, 0.1]],
        "entropy_ratio_causal": [[0.1, 0.1, 0.1, 0.5]],
    }
    offsets = np.zeros((1, 4, 4))
    offsets[0, 1, 1] = 0.8  # the previous-token head's offset 1: not positional
    offsets[0, 2, 2] = 0.3
    marks = {SAME_TOKEN: [[0, 0, 0, 0.1]], "newline": [[0, 0, 0.6, 0]], "comma": [[0, 0, 0.55, 0]],
             LINE_START: [[0, 0, 0, 0.39]]}  # fmt: skip
    ev = _evidence([[0.7, 0.1, 0.2, 0.3]], offsets, marks)
    roles = atlas_roles(metrics, ev, copying=np.array([[0.2, 0.0, 0.9, 0.4]]))
    assert roles.primary.tolist() == [["induction", "previous-token", "delimiter", "other"]]
    assert [r.name for r in roles.roles[0][0]] == ["induction", "first-token sink"]
    assert [r.name for r in roles.roles[0][1]] == ["previous-token"]
    assert [(r.name, r.detail) for r in roles.roles[0][2]] == [
        ("delimiter", "share on newline tokens"), ("copying", "OV copying score")
    ]  # fmt: skip
    assert roles.roles[0][3] == []
    # lower thresholds: the quiet head gets line-start, broad and copying; copying is primary only without another
    low = AtlasThresholds(line_start=0.3, broad=0.5, copying=0.4)
    roles = atlas_roles(metrics, ev, copying=np.array([[0.2, 0.0, 0.9, 0.4]]), thresholds=low)
    assert [r.name for r in roles.roles[0][3]] == [LINE_START, "copying", "broad"]
    only_copying = atlas_roles(metrics, ev, copying=np.array([[0.2, 0.0, 0.9, 0.4]]),
                               thresholds=AtlasThresholds(line_start=0.9, copying=0.4))  # fmt: skip
    assert only_copying.primary[0, 3] == "copying"
    sink_and_copying = atlas_roles(metrics, ev, copying=np.array([[0.6, 0.0, 0.9, 0.4]]))
    assert [r.name for r in sink_and_copying.roles[0][0]] == ["induction", "first-token sink", "copying"]
    assert atlas_roles({k: v for k, v in metrics.items() if "probe" not in k}, ev).primary[0, 0] == "first-token sink"


def test_positional_skips_offsets_0_and_1_and_reads_an_encoders_negative_offsets():
    offsets = np.zeros((1, 2, 8))  # start −4: d = −4 … 3
    offsets[0, 0, 4] = 0.9  # d = 0: self
    offsets[0, 1, 2] = 0.6  # d = −2
    ev = _evidence([[0.0, 0.0]], offsets, {SAME_TOKEN: [[0, 0]]}, start=-4)
    roles = atlas_roles({"prev": [[0.0, 0.0]], "entropy_ratio": [[0.0, 0.0]]}, ev)
    assert roles.primary.tolist() == [["self", "positional"]]
    assert roles.roles[0][1][0].detail == "offset -2"


def test_thresholds_and_shapes_are_checked():
    for field in ("positional", "delimiter", "copying"):
        with pytest.raises(ValueError, match=field):
            AtlasThresholds(**{field: 0.0})
        with pytest.raises(ValueError, match=field):
            AtlasThresholds(**{field: 1.5})
    ev = _evidence([[0.0, 0.0]], np.zeros((1, 2, 4)), {SAME_TOKEN: [[0, 0]]})
    with pytest.raises(ValueError, match="copying: expected shape"):
        atlas_roles({}, ev, copying=np.zeros(2))
    with pytest.raises(ValueError, match="delimiters"):
        atlas_roles({}, ev, delimiters=["newline"])
    names = [n for n, _ in ATLAS_ROLES]
    assert len(set(names)) == len(names) and names[-1] == "other"
    t = AtlasThresholds(positional=0.3)
    assert t.for_role("positional") == 0.3 and t.for_role("self") == t.position and t.for_role("other") is None
    assert all(isinstance(t.for_role(n), float) for n in names[:-1])
    with pytest.raises(ValueError, match="name"):
        t.for_role("sink")

"""The lab's trained induction model read by the atlas's evidence: its previous-token head's top contexts sit at
offset 1, and every induction head's top contexts lie in a repeated segment, the key just after the earlier copy
of the query's token. Training takes about a minute and a half on one thread: a slow test."""

from __future__ import annotations

import pytest

from headwise.analysis import HeadEvidence
from headwise.analysis.streaming import read_rows
from headwise.lab.induction import InductionSetup, probe_stream, run_induction
from headwise.lab.tasks import induction_probe
from headwise.models import HeadModel


def _evidence(model, setup: InductionSetup, seed: int, *, skip_self: bool):
    hm = HeadModel(model.eval())
    ids, _, _ = induction_probe(probe_stream(seed, 2), 32, length=setup.context_length, vocab_size=setup.vocab_size)
    evidence = HeadEvidence(hm.num_layers, hm.num_heads, min_keys=16, skip_self=skip_self)
    for start in range(0, ids.shape[0], 8):
        read_rows(hm, ids[start : start + 8], None, extra=[evidence.reader(first_text=start)])
    return ids, evidence.result()


def _head(name: str) -> tuple[int, int]:
    layer, head = name[1:].split("H")
    return int(layer), int(head)


def check_induction_evidence(model, summary: dict, setup: InductionSetup, seed: int) -> None:
    """With the query's own key left out of the contexts: an induction head falls back on the current token where
    nothing repeats, rows of weight ≈ 1 that would otherwise fill its top (see ``HeadEvidence(skip_self=)``)."""
    ids, ev = _evidence(model, setup, seed, skip_self=True)
    assert summary["previous_token_heads"] and summary["induction_heads"], summary["scores"]
    for name in summary["previous_token_heads"]:
        layer, head = _head(name)
        contexts = ev.contexts[layer][head]
        assert len(contexts) == 8 and all(c.offset == 1 for c in contexts), (name, contexts)
        assert ev.at_offset(1)[layer, head] > 0.5
    for name in summary["induction_heads"]:
        layer, head = _head(name)
        contexts = ev.contexts[layer][head]
        assert len(contexts) == 8, name
        for c in contexts:
            text = ids[c.text].tolist()
            assert 1 <= c.key <= c.query and text[c.key - 1] == text[c.query], (name, c)  # after the earlier copy
            assert c.key_at >= 1 and c.ids[c.key_at - 1] == c.ids[c.query_at]  # the snippet shows it


@pytest.mark.slow
def test_the_lab_induction_models_heads_show_their_contexts():
    setup = InductionSetup()
    run = run_induction(setup, seed=0)
    assert run.summary["passed"], run.summary["final"]
    check_induction_evidence(run.model, run.summary, setup, 0)

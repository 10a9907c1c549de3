"""The circuit suite: tasks whose circuit is known by construction. Fast tests check the generators (pairs of one
length, answers right by construction, differences only where the mechanism reads), the known circuits' names against
real graphs, the files and the command's mistakes; the slow test trains the suite and checks each known circuit is
confirmed and exact patching recovers it."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from headwise.circuits import EDGE_METHODS, build_graph, wiring
from headwise.lab.circuit_suite import run_suite, run_task, suite_methods, suite_tasks, table_lines
from headwise.lab.circuit_tasks import OFFSET, TASKS, expand_known, pattern_share, role_heads
from headwise.models.transformer_lm import TransformerLM


def _answer_by_rule(task: str, row: list[int]) -> int:
    """What the last position's answer is, read from the tokens alone by the task's rule (brute force)."""
    L = len(row)
    if task == "offset":
        return row[L - 1 - OFFSET]
    if task == "retrieve":  # the one marked token
        marked = [t for t in row if t >= 32]
        assert len(marked) == 1 and row[-1] < 32
        return marked[0]
    if task == "induction":  # the token after the earlier occurrence of the last 6 tokens
        tail = row[-6:]
        hits = [s for s in range(L - 6) if row[s : s + 6] == tail]
        assert len(hits) == 1, hits
        return row[hits[0] + 6]
    # query, value: the token before the copy of the token asked (query: the one before the final filler)
    back = 2 if task == "query" else 1
    hits = [s for s in range(L - back) if row[s] == row[-back]]
    assert len(hits) == 1, hits
    return row[hits[0] - 1]


@pytest.mark.parametrize("name", list(TASKS))
def test_pairs_have_one_length_and_answers_by_construction(name):
    task = TASKS[name]
    clean, corrupted, answer, wrong = task.pairs(np.random.default_rng(5), 32)
    assert clean.shape == corrupted.shape and clean.dtype == corrupted.dtype == torch.long
    assert len(answer) == len(wrong) == 32
    assert int(clean.max()) < task.model.vocab_size and int(clean.min()) >= 0
    assert clean.shape[1] <= task.model.context_length
    for p in range(32):
        c, x = clean[p].tolist(), corrupted[p].tolist()
        assert _answer_by_rule(name, c) == answer[p]
        assert _answer_by_rule(name, x) == wrong[p]
        assert answer[p] != wrong[p]
        differ = [t for t in range(len(c)) if c[t] != x[t]]
        assert differ and max(differ) < len(c) - 1  # the last token, the query's own, never changes …
        if name == "induction":  # … except the prefixes before the two continuations
            assert len(differ) <= 12
        else:
            assert len(differ) == 1


@pytest.mark.parametrize("name", list(TASKS))
def test_training_batches_score_the_rule(name):
    """Every scored target of a training batch is the rule's answer for the prefix that ends there."""
    task = TASKS[name]
    x, y, scored = task.batch(np.random.default_rng(1), 8)
    assert x.shape == y.shape == scored.shape and scored.dtype == torch.bool and bool(scored.any())
    for b in range(8):
        for t in scored[b].nonzero()[:, 0].tolist():
            if name == "induction":  # the next token
                assert y[b, t] == x[b, t + 1]
            else:
                assert y[b, t] == _answer_by_rule(name, x[b, : t + 1].tolist())


@pytest.mark.parametrize("name", list(TASKS))
def test_probe_keys_point_back_inside_the_sequence(name):
    task = TASKS[name]
    ids, keys = task.probe(np.random.default_rng(2), 8)
    assert set(keys) == set(task.roles)
    L = ids.shape[1]
    for key in keys.values():
        assert key.shape == ids.shape
        t = torch.arange(L).expand_as(key)
        assert bool(((key == -1) | ((key >= 0) & (key < t))).all())
        assert bool((key >= 0).any())


@pytest.mark.parametrize("name", list(TASKS))
def test_known_circuits_name_real_edges(name):
    """Every template, with each role taken by any head of its layer, names an edge of the task model's graph."""
    task = TASKS[name]
    graph = build_graph(wiring(TransformerLM(task.model)))
    heads = {role: list(range(task.model.num_heads)) for role in task.roles}
    names = expand_known(task.known, heads)
    assert len({graph.edge("known", e) for e in names}) == len(names)
    one = expand_known(task.known, {role: [1] for role in task.roles})
    assert len(one) == len(task.known) and all("{" not in e for e in one)


def test_expand_known_and_roles_by_hand():
    assert expand_known(("embed->L0.KV{a}.v", "L0.H{a}->L1.KV{b}.k"), {"a": [2], "b": [0, 3]}) == [
        "embed->L0.KV2.v", "L0.H2->L1.KV0.k", "L0.H2->L1.KV3.k",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="role 'c'"):
        expand_known(("L0.H{c}->logits",), {"a": [0]})
    assert role_heads([0.1, 0.7, 0.5, 0.2]) == [1, 2]
    assert role_heads([0.1, 0.3, 0.2]) == [1]  # none over the threshold: the best one


def test_pattern_share_by_hand():
    w = torch.zeros(1, 2, 3, 3)  # (B, H, L, L)
    w[0, 0, :, 0] = 1.0  # head 0 attends to the first token
    w[0, 1, 0, 0] = w[0, 1, 1, 0] = w[0, 1, 2, 1] = 1.0  # head 1 to the token before
    key = torch.tensor([[-1, 0, 1]])  # queries 1 and 2 should look at 0 and 1
    assert pattern_share(w, key) == [0.5, 1.0]
    assert all(math.isnan(v) for v in pattern_share(w, torch.full((1, 3), -1)))


def test_methods_follow_the_edge_methods():
    assert suite_methods() == [*EDGE_METHODS, "exact"]
    assert suite_tasks("--tasks", " value,offset ") == ["value", "offset"]
    for bad in ("offset,offset", "", "sum"):
        with pytest.raises(ValueError, match="--tasks"):
            suite_tasks("--tasks", bad)


def test_a_tiny_run_has_every_number_and_says_it_failed():
    """Two training steps learn nothing: the run completes, with every method's numbers, and is not confirmed."""
    r = run_task("offset", seed=1, steps=2)
    assert set(r["methods"]) == set(suite_methods())
    c = r["confirmation"]
    assert c["confirmed"] is False and c["checks"]["accuracy"] is False
    assert len(r["known"]["edges"]) >= 2 and set(c["known_ranks"]) == set(r["known"]["edges"])
    for m in r["methods"].values():
        assert set(m) >= {"auroc", "cpr", "cmd", "top_k_recall", "faithfulness", "bootstrap", "seconds"}
        assert m["bootstrap"]["size"] == len(r["known"]["edges"]) and 0 <= m["bootstrap"]["jaccard"] <= 1
        assert len(m["faithfulness"]["recovered"]) == len(m["faithfulness"]["sizes"])
    json.dumps(r, allow_nan=False)  # NaN written as null
    lines = table_lines({"tasks": {"offset": r}})
    assert "NOT CONFIRMED (accuracy" in lines[0] and len(lines) == 1 + len(suite_methods())


@pytest.mark.slow
def test_the_suite_confirms_every_known_circuit_and_exact_recovers_it():
    """Trains every task (a few CPU minutes on one thread): each known circuit is confirmed by exact patching, exact
    patching ranks the known edges high, and the table has every method."""
    result = run_suite(seed=0, num_threads=1)
    assert result["methods"] == suite_methods()
    for name, r in result["tasks"].items():
        c = r["confirmation"]
        assert c["confirmed"], (name, c)
        assert set(r["methods"]) == set(suite_methods())
        assert r["methods"]["exact"]["auroc"] >= 0.9, (name, r["methods"]["exact"])
        # a circuit exact patching confirms is stable across resamples of its pairs (the ≥ 0.8 bar)
        assert r["methods"]["exact"]["bootstrap"]["jaccard"] >= 0.8, (name, r["methods"]["exact"]["bootstrap"])

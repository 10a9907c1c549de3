"""The articles' claims: transcribed faithfully, all reproduced (errata as errata), and the checks can fail."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest

from headwise.articles import (
    ARTICLES,
    ERRATUM,
    FAIL,
    PASS,
    QUANTITIES,
    all_claims,
    check,
    check_all,
    claims_about,
    size_note,
)
from headwise.articles.claim import Above, Approx, Below, Claim, Count, Decimals, Holds, Shape, Text

EXCERPTS = Path(__file__).resolve().parent / "excerpts"  # the checked passages, quoted (see its README)
#: a folder holding the two articles' full texts under the file names of ARTICLES, when one is at hand
FULL_ARTICLES = os.environ.get("HEADWISE_FULL_ARTICLES")

#: the claims that must always be checked, by key
REQUIRED = {
    "p4.builtin.out",
    "p4.builtin.weights",
    "p4.builtin.equal",
    "p4.scratch.params",
    "p4.equivariance",
    "p4.equivariance.pe",
    "p4.pe.row0",
    "p4.pe.row1",
    "p4.pe.row7",
    "p4.emb.shape",
    "p4.token5.pos0",
    "p4.token5.pos1",
    "p4.block.out",
    "p4.block.params",
    "p4.llama2.attention",
    "p4.llama2.total",
    "p4.llama2.share",
    "p4.llama3.attention",
    "tb.weights.h1",
    "tb.weights.h2",
    "tb.concat",
    "tb.output",
    "tb.table.h2.sat",
}
#: the known errata, found while re-running the articles' own code (docs/verify.md)
ERRATA = {"tb.table.h2.sat", "p4.llama2.total", "p4.llama2.share", "p4.llama3.attention", "p4.gpt2.total"}


def _printed(key: str) -> str:
    return next(c.printed for c in all_claims() if c.key == key)


def _squash(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def results():
    return {r.claim.key: r for r in check_all()}


def test_every_claim_reproduces(results):
    failed = {k: r.shown for k, r in results.items() if r.status == FAIL}
    assert failed == {}
    assert {k for k, r in results.items() if r.status == ERRATUM} == ERRATA
    assert set(results) >= REQUIRED


def test_keys_unique_and_articles_known():
    claims = all_claims()
    assert len({c.key for c in claims}) == len(claims)
    assert {c.article for c in claims} == set(ARTICLES)
    assert [c.key for c in all_claims("techbyte")] == [c.key for c in claims if c.article == "techbyte"]
    with pytest.raises(ValueError, match="article"):
        all_claims("nope")


def _passages(text: str) -> list[str]:
    """The quoted passages of an excerpt file, whitespace squashed."""
    return [_squash(p) for p in text.split("\n[…]\n")]


def test_printed_text_is_verbatim_from_the_article():
    """Every claim's words and section heading stand in the article's quoted passages (kept in the
    repository, so this runs from a clone alone)."""
    for claim in all_claims():
        passages = _passages((EXCERPTS / ARTICLES[claim.article][1]).read_text(encoding="utf-8"))
        assert any(_squash(claim.printed) in p for p in passages), claim.key
        assert claim.value is None or claim.value in claim.printed, claim.key
        assert any(_squash(claim.section) in p for p in passages), claim.key


def test_the_check_of_the_words_can_fail():
    passages = _passages((EXCERPTS / ARTICLES["part4"][1]).read_text(encoding="utf-8"))
    assert not any(_squash("Parameters   : 66,049") in p for p in passages)
    assert any(_squash("Parameters   : 66,048") in p for p in passages)


@pytest.mark.skipif(
    not (FULL_ARTICLES and Path(FULL_ARTICLES).is_dir()),
    reason="set HEADWISE_FULL_ARTICLES to a folder holding the full source articles",
)
def test_quoted_passages_are_verbatim_from_the_full_articles():
    for _, name in ARTICLES.values():
        article = _squash((Path(FULL_ARTICLES) / name).read_text(encoding="utf-8"))
        passages = _passages((EXCERPTS / name).read_text(encoding="utf-8"))
        positions = [article.find(p) for p in passages]
        assert -1 not in positions, [p for p, i in zip(passages, positions) if i < 0]
        assert positions == sorted(positions), name  # in the article's order


def test_typo_erratum_gives_the_matrix_value(results):
    """The article's table line for head 2 / 'sat' disagrees with its own matrix; headwise gives the matrix's."""
    typo = results["tb.table.h2.sat"]
    matrix = Decimals(4).parse(results["tb.weights.h2"].claim.printed)
    assert typo.claim.expected == pytest.approx(0.2603)
    assert round(typo.computed, 4) == pytest.approx(matrix[0, 1]) == pytest.approx(0.1943)


def test_llama_figures_from_the_formula(results):
    """Computed by headwise.sizing; checked here against the formula of the errata note."""
    assert results["p4.llama2.attention"].computed == 32 * 4 * 4096**2
    assert results["p4.llama3.attention"].computed == 32 * (2 * 4096**2 + 2 * 4096 * 1024)
    share = results["p4.llama2.share"].computed
    assert share == pytest.approx(32 * 4 * 4096**2 / results["p4.llama2.total"].computed)
    assert 0.31 < share < 0.33


def test_size_claims_recompute_the_sizing_figure_of_their_model(results):
    """A claim about a real model's size is the sizing arithmetic of that model, nothing else."""
    from headwise.sizing import attention_params, get_arch, total_params

    sized = [c for c in all_claims() if c.model is not None]
    assert {c.key for c in sized} >= {"p4.gpt2.total", "p4.gpt3.total", "p4.llama3.attention"} | {
        f"p4.llama2.{q}" for q in ("attention", "total", "share")
    }
    for claim in sized:
        arch = get_arch(claim.model)
        attention, total = attention_params(arch).total, total_params(arch)
        figure = {"attention": attention, "total": total, "attention_share": attention / total}[claim.quantity]
        assert results[claim.key].computed == figure, claim.key
        assert claim.quantity in QUANTITIES


def test_claims_about_a_model_and_what_agrees():
    """``headwise size`` reads these: Llama-2-7B's 2.1B attention agrees, its 8B total and 26% do not;
    Llama-3-8B's ~1.5B does not (1,342,177,280 computed); GPT-3's 175B agrees; any alias finds them."""

    def agreeing(name):
        return {c.quantity: c.rule.agrees(c.expected, check(c).computed) for c in claims_about(name)}

    assert agreeing("Llama-2-7B") == {"attention": True, "total": False, "attention_share": False}
    assert agreeing("meta-llama/Llama-2-7b-hf") == agreeing("llama2-7b") == agreeing("Llama-2-7B")
    (llama3,) = claims_about("llama-3-8b")
    assert check(llama3).computed == 1_342_177_280 and llama3.expected == pytest.approx(1.5e9)
    assert agreeing("llama-3-8b") == {"attention": False}
    assert agreeing("GPT-3 175B") == {"total": True}
    assert claims_about("Mistral-7B") == [] and claims_about("no such model") == []


def test_size_note_says_what_the_articles_claim_and_whether_it_agrees():
    """``headwise size``'s note: Llama-2-7B's three claims (2.1B attention agrees, 8B and 26% do not), GPT-3's
    175B agreeing, nothing for a model the articles do not size."""
    short, full = size_note("Llama-2-7B")
    assert short.startswith("article: ") and short.endswith(" — OFF")
    assert "attention" in full and "(article 8B: off)" in full and "agrees" in full
    short, full = size_note("GPT-3 175B")
    assert short.endswith(" — agrees") and "computed: total" in full
    assert size_note("Mistral-7B") == ("", "")


def test_a_size_claim_names_model_and_quantity_together():
    with pytest.raises(ValueError, match="model and quantity together"):
        Claim("k", "part4", "s", "w", "1", lambda: 1, Count(), model="gpt2")
    with pytest.raises(ValueError, match=r"quantity: expected one of \('attention'"):
        Claim("k", "part4", "s", "w", "1", lambda: 1, Count(), model="gpt2", quantity="flops")


def test_equivariance_is_round_off_without_positions_only(results):
    assert results["p4.equivariance"].computed < 1e-6
    assert results["p4.equivariance.pe"].computed > 1e-2


# -- the rules --------------------------------------------------------------------------------------


def test_decimals_reads_numpy_and_list_prints():
    d = Decimals(4)
    m = d.parse("[[0.472  0.2676 0.2603]\n [0.2635 0.3618 0.3746]\n [0.4565 0.2735 0.27  ]]")
    assert m.shape == (3, 3) and m[2, 2] == 0.27 and m[0, 0] == 0.472
    assert d.parse("[[-0.0194 -0.8694]\n [ 0.3008 -0.8794]]").tolist() == [[-0.0194, -0.8694], [0.3008, -0.8794]]
    assert d.parse("PE[7]    : [0.6570, 0.7539, -0.8593]").tolist() == [0.657, 0.7539, -0.8593]
    assert float(d.parse("Head 2 -> 'sat': 0.2603")) == 0.2603


def test_decimals_agrees_only_to_the_printed_rounding():
    d = Decimals(4)
    expected = d.parse("[0.8415, 0.5403]")
    assert d.agrees(expected, np.array([0.84147, 0.54030]))
    assert not d.agrees(expected, np.array([0.84137, 0.54030]))  # off by 1e-4
    assert not d.agrees(expected, np.array([0.84147]))  # wrong shape
    assert not d.agrees(d.parse("[[1.0, 2.0]]"), np.array([1.0, 2.0]))


def test_other_rules():
    assert Shape().parse("Output shape  : torch.Size([2, 10, 128])") == (2, 10, 128)
    assert Shape().parse("Concatenated output (shape (3, 4) ):") == (3, 4)
    assert Shape().agrees((2, 10), (2, 10)) and not Shape().agrees((2, 10), (10, 2))
    assert Shape("numpy").show((3, 4)) == "(3, 4)" and Shape().show((3, 4)) == "torch.Size([3, 4])"
    assert Count().parse("Parameters    : 1,346,048") == 1_346_048
    assert Count().parse("d_k=64") == 64 and Count().parse("zero") == 0
    assert Approx(0.05).parse("~1.5B") == 1.5e9 and Approx().parse("26%") == pytest.approx(0.26)
    assert Approx(0.05).agrees(2.1e9, 2_147_483_648) and not Approx(0.05).agrees(1.5e9, 1_342_177_280)
    assert Below(1e-6).agrees(None, 1.19e-7) and not Below(1e-6).agrees(None, 2e-6)
    assert Above(1e-3).agrees(None, 0.09) and not Above(1e-3).agrees(None, 1e-7)
    assert Text().agrees("cat", "cat") and not Text().agrees("cat", "mat")
    assert Holds().agrees(True, (True, "x")) and not Holds().agrees(True, (False, "x"))


def _claim(**kw) -> Claim:
    base = dict(key="k", article="part4", section="s", what="w", printed="66,048", compute=lambda: 66_048, rule=Count())
    return Claim(**{**base, **kw})


def test_status_logic():
    assert check(_claim()).status == PASS
    assert check(_claim(printed="66,049")).status == FAIL
    # an erratum holds only when the article is wrong AND headwise gives the correction
    assert check(_claim(printed="66,049", correct="66,048")).status == ERRATUM
    assert check(_claim(printed="66,048", correct="66,048")).status == FAIL  # the article is right after all
    assert check(_claim(printed="66,049", correct="66,047")).status == FAIL  # neither
    broken = check(_claim(compute=lambda: 1 / 0))
    assert broken.status == FAIL and "ZeroDivisionError" in broken.shown


@pytest.mark.parametrize(
    "key, printed",
    [
        ("p4.scratch.params", "Parameters   : 66,049"),
        ("p4.pe.row1", "PE[1]    : [0.8415, 0.5403, 0.6816, 0.7318, 0.5332, 0.8461]"),
        ("p4.block.out", "Output shape  : torch.Size([2, 16, 127])"),
        ("tb.output", _printed("tb.output").replace("1.0458", "1.0459")),
        ("tb.table.h2.sat", "Head 2 -> 'sat': 0.1943"),  # the erratum no longer holds
    ],
)
def test_a_changed_printed_value_fails(key, printed):
    claim = next(c for c in all_claims() if c.key == key)
    assert check(dataclasses.replace(claim, printed=printed)).status == FAIL

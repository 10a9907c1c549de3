"""``headwise verify``: the table of claims, exit 0 when everything reproduces, exit 1 when a claim fails."""

from __future__ import annotations

import dataclasses
import re

import pytest

import headwise.articles as articles
from _cli_helpers import assert_user_error


def _statuses(out: str) -> list[str]:
    """The status column of every table row (a row starts with its number)."""
    return re.findall(r"^│\s+\d+ │.*│ (pass|erratum|FAIL)\s+│$", out, flags=re.M)


def test_verify_passes(run_cli):
    outcome = run_cli("verify")
    assert outcome.code == 0, outcome.out[-2000:]
    statuses = _statuses(outcome.out)
    n = len(articles.all_claims())
    assert len(statuses) == n
    assert statuses.count("FAIL") == 0
    assert statuses.count("erratum") == 5
    assert f"{n} claims: {n - 5} pass, 5 erratum" in outcome.out
    assert "0 FAIL" in outcome.out
    for title, _ in articles.ARTICLES.values():
        assert title in outcome.out
    assert "0.2603" in outcome.out and "0.1943" in outcome.out  # the typo and its correction
    assert "Typo" in outcome.out  # the erratum is explained


def test_verify_one_article(run_cli):
    outcome = run_cli("verify", "--article", "techbyte", "--width", "100")
    assert outcome.code == 0
    assert len(_statuses(outcome.out)) == len(articles.all_claims("techbyte"))
    assert articles.ARTICLES["part4"][0] not in outcome.out


def _patched(monkeypatch, key: str, printed: str) -> None:
    real = articles.all_claims

    def claims(article=None):
        return [dataclasses.replace(c, printed=printed) if c.key == key else c for c in real(article)]

    monkeypatch.setattr(articles, "all_claims", claims)


def test_verify_fails_on_a_wrong_figure(run_cli, monkeypatch):
    _patched(monkeypatch, "p4.scratch.params", "Parameters   : 66,049")
    outcome = run_cli("verify")
    assert outcome.code == 1
    assert _statuses(outcome.out).count("FAIL") == 1
    assert "1 FAIL" in outcome.out


def test_verify_fails_when_an_erratum_no_longer_holds(run_cli, monkeypatch):
    _patched(monkeypatch, "tb.table.h2.sat", "Head 2 -> 'sat': 0.1943")
    outcome = run_cli("verify", "--article", "techbyte")
    assert outcome.code == 1
    assert _statuses(outcome.out).count("FAIL") == 1


@pytest.mark.parametrize(
    "args, words", [(["--article", "part5"], ["--article", "part5"]), (["--width", "10"], ["--width"])]
)
def test_verify_user_mistakes(run_cli, args, words):
    assert_user_error(run_cli("verify", *args), *words)

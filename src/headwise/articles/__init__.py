"""The two source articles as checkable claims: what each prints, and what headwise computes.

``headwise verify`` prints :func:`check_all`'s results as a table::

    from headwise.articles import all_claims, check_all
    results = check_all()                 # one Result per claim, in the articles' order
    [r for r in results if r.status == "FAIL"]   # [] when everything reproduces

See :mod:`headwise.articles.claim` for the statuses (pass / erratum / FAIL) and the comparison rules.
"""

from __future__ import annotations

from headwise.articles import encoder_layer, two_head_example, under_the_hood
from headwise.articles.claim import ERRATUM, FAIL, PASS, QUANTITIES, Claim, Result, check

__all__ = [
    "ARTICLES",
    "Claim",
    "Result",
    "PASS",
    "ERRATUM",
    "FAIL",
    "QUANTITIES",
    "all_claims",
    "check",
    "check_all",
    "claims_about",
]

#: article key -> (title, file name: the article's own, kept for its quoted passages in ``tests/articles/excerpts/``)
ARTICLES = {
    under_the_hood.KEY: ("LLM Under the Hood, Part 4: Multi-Head Attention", "000_5713966d6f8be7c5.txt"),
    two_head_example.KEY: ("TechByteByByte: Multi-Head Attention", "001_c2870792325014b6.txt"),
}


def all_claims(article: str | None = None) -> list[Claim]:
    """The claims of one article (a key of :data:`ARTICLES`), or of both (None).

    Raises:
        ValueError: an unknown article key.
    """
    if article is not None and article not in ARTICLES:
        raise ValueError(f"article: expected one of {sorted(ARTICLES)}, got {article!r}")
    found = under_the_hood.claims() + encoder_layer.claims() + two_head_example.claims()
    return [c for c in found if article is None or c.article == article]


def check_all(claims: list[Claim] | None = None) -> list[Result]:
    """Check ``claims`` (default: :func:`all_claims`), in order."""
    return [check(c) for c in (all_claims() if claims is None else claims)]


def claims_about(name: str) -> list[Claim]:
    """The claims on the size of one real model (``headwise size`` shows them), in the articles' order.

    Args:
        name: any name or alias :func:`headwise.sizing.get_arch` knows.
    Returns:
        The claims whose :attr:`Claim.model` is that architecture (empty for a model the articles do not
        size, or for a name no architecture has).
    """
    from headwise.sizing import get_arch, normalize_name

    def canonical(n: str) -> str | None:
        try:
            return get_arch(n).name
        except ValueError:
            return None

    wanted = canonical(name) or normalize_name(name)
    return [c for c in all_claims() if c.model is not None and canonical(c.model) == wanted]

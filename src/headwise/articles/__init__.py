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
    "size_note",
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


def size_note(name: str) -> tuple[str, str]:
    """(short note, full sentence) on what the source articles say about the size of the real model ``name``, each
    claim checked (``headwise size`` prints them); empty strings when they say nothing.

    A claimed figure agrees when the claim's rule says so (``Approx``: within its tolerance); ``headwise verify``
    checks the same claims.
    """
    from headwise.sizing.units import format_count

    claims = claims_about(name)
    if not claims:
        return "", ""
    figures = {c.quantity: c.figure.strip().lstrip("~") for c in claims}
    if "attention" in figures and "total" in figures:
        short = f"{figures['attention']} of {figures['total']}"
    elif "attention" in figures:
        short = f"{figures['attention']} attention"
    elif "total" in figures:
        short = f"{figures['total']} total"
    else:
        short = ""
    if "attention_share" in figures:
        short = f"{short}, {figures['attention_share']}" if short else figures["attention_share"]
    label = {"attention": "attention", "total": "total", "attention_share": "share"}
    parts, notes, all_agree = [], [], True
    for claim in claims:
        result = check(claim)
        agrees = result.computed is not None and claim.rule.agrees(claim.expected, result.computed)
        all_agree &= agrees
        if result.computed is None:
            computed = result.shown
        elif claim.quantity == "attention_share":
            computed = f"{100 * result.computed:.1f}%"
        else:
            computed = format_count(result.computed)
        state = "agrees" if agrees else "off"
        parts.append(f"{label[claim.quantity]} {computed} (article {figures[claim.quantity]}: {state})")
        if not agrees and claim.note and claim.note not in notes:
            notes.append(claim.note)
    printed = list(dict.fromkeys(c.printed for c in claims))
    where = "; ".join(dict.fromkeys(f"{ARTICLES[c.article][1]}, {c.section}" for c in claims))
    full = f'the article ({where}) says "{" ".join(printed)}"; computed: {"; ".join(parts)}'
    if notes:
        full += " — " + " ".join(notes)
    full += "" if full.endswith(".") else "."
    return f"article: {short} — {'agrees' if all_agree else 'OFF'}", full

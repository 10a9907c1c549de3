"""The offline atlas page in a real headless Chromium (Debian's ``chromium``, driven by Playwright): every request
but the file's own is blocked and recorded, the grid, the cards, the links, the hash and the filters work."""

from __future__ import annotations

import functools
import time

import pytest

from _atlas import MARKUP, synthetic_atlas
from _browser import BROWSER_MARKS, chromium
from headwise.viz.atlas_page import atlas_card_html, write_atlas_page

pytestmark = BROWSER_MARKS


def _open(browser, path, *, fragment: str = "", width: int = 1300, height: int = 900):
    """Open ``path`` (+ ``#fragment``) in ``browser`` with every request but ``file:`` / ``data:`` aborted.

    Returns:
        ``(page, problems, attempted)``: console errors and warnings and uncaught exceptions, and the URLs of the
        requests that were blocked.
    """
    page = browser.new_page(viewport={"width": width, "height": height})
    problems, attempted = [], []

    def route(r):
        if r.request.url.startswith(("file:", "data:")):
            r.continue_()
        else:
            attempted.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.goto(path.as_uri() + (f"#{fragment}" if fragment else ""))
    page.wait_for_selector("body[data-ready='1']", timeout=30_000)
    return page, problems, attempted


@pytest.fixture(scope="module")
def open_atlas():
    """:func:`_open` on one chromium for the whole module (skipped where chromium or Playwright is missing)."""
    with chromium() as browser:
        yield functools.partial(_open, browser)


def _card(page) -> str:
    return page.text_content("#aw-card-id")


def _count(page) -> int:
    return int(page.get_attribute("#aw-count", "data-count"))


def _search(page, text: str) -> int:
    page.fill("#aw-search", text)
    return _count(page)


def _follow_first_partner(page) -> str:
    """Click the card's first partner link; its head id."""
    link = page.locator("#aw-partners a[data-head]").first
    partner = link.get_attribute("data-head")
    link.click()
    return partner


def _bare(atlas: dict, index: int) -> None:
    """Head ``index`` with every optional field null or empty."""
    h = atlas["heads"][index]
    h.update(role="other", roles=[], stats={}, offsets=None, contexts=None, outputs=None, writes=None)
    h.update(ov=None, loss_effect=None, importance=None, partners=None)


def test_cards_links_and_markup_offline(open_atlas, tmp_path):
    atlas = synthetic_atlas(4, 5, markup=True)
    _bare(atlas, 19)  # L3.H4
    path = write_atlas_page(atlas, tmp_path / "atlas.html")
    page, problems, attempted = open_atlas(path)
    assert page.locator("#aw-grid .cell").count() == 20 and _count(page) == 20
    # Importance: a bar per head that has one, hatched for an estimate, the largest full height.
    largest = max(abs(h["importance"]["value"]) for h in atlas["heads"] if h["importance"])
    for h in atlas["heads"]:
        bar = page.locator(f".cell[data-id='{h['id']}'] .bar")
        if h["importance"] is None:
            assert bar.count() == 0
            continue
        assert ("est" in bar.get_attribute("class").split()) == (not h["importance"]["exact"]), h["id"]
        height = float(bar.evaluate("b => getComputedStyle(b).height").removesuffix("px"))
        assert height == max(2, round(16 * abs(h["importance"]["value"]) / largest)), h["id"]
    assert "an estimate, not a measurement" in page.text_content("#aw-legend")
    page.click(".cell[data-id='L2.H3']")
    assert _card(page) == "L2.H3" and page.evaluate("location.hash") == "#L2.H3"
    assert page.get_attribute("#aw-card", "data-head") == "L2.H3"
    assert page.locator(".cell.sel").count() == 1 and page.get_attribute(".cell.sel", "data-id") == "L2.H3"
    assert page.get_attribute("#aw-card svg.offsets", "data-bars") == "12"
    assert page.get_attribute("#aw-contexts", "data-count") == "8"
    # A partner link opens its card, and the hash follows.
    partner = _follow_first_partner(page)
    assert partner == atlas["heads"][13]["partners"]["in"][0]["head"] != "L2.H3"
    assert _card(page) == partner and page.evaluate("location.hash") == f"#{partner}"
    page.go_back()
    page.wait_for_function("document.getElementById('aw-card-id').textContent === 'L2.H3'")
    # A token carrying markup is text: no element made from it.
    page.click(".cell[data-id='L1.H0']")
    card = page.text_content("#aw-card")
    assert MARKUP in card and card.count(MARKUP) >= 8  # every context's key token, and a raised token
    assert page.locator("#aw-card b, #aw-card script").count() == 0 and page.locator("b").count() == 0
    key = page.locator("#aw-contexts .tok.key").first
    assert key.text_content() == MARKUP
    assert "exact" in page.text_content("#aw-imp") or "estimate" in page.text_content("#aw-imp")
    # A head with every optional field empty still opens, saying what is missing.
    page.click(".cell[data-id='L3.H4']")
    assert _card(page) == "L3.H4" and "not computed" in page.text_content("#aw-imp")
    assert "no role passes" in page.text_content("#aw-card")
    # Keyboard: the arrows move along the grid, Enter opens the head.
    page.focus(".cell[data-id='L0.H0']")
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowDown")
    page.keyboard.press("Enter")
    assert _card(page) == "L1.H1"
    assert problems == [] and attempted == []
    page.close()


def test_search_and_filters_fade_the_others(open_atlas, tmp_path):
    atlas = synthetic_atlas(4, 5)
    path = write_atlas_page(atlas, tmp_path / "atlas.html")
    page, problems, attempted = open_atlas(path)
    heads = atlas["heads"]
    induction = sum(
        any(n.startswith("induction") for n in [h["role"]] + [r["name"] for r in h["roles"]]) for h in heads
    )
    assert 0 < induction < 20
    assert _search(page, "induction") == induction
    assert page.locator(".cell.off").count() == 20 - induction
    assert _search(page, "l2.h3") == 1 and page.locator(".cell:not(.off)").get_attribute("data-id") == "L2.H3"
    assert _search(page, "L2") == 5  # a whole layer
    assert _search(page, "L2 induction") == sum(
        h["layer"] == 2 and any(r["name"] == "induction" for r in h["roles"]) for h in heads
    )
    written = next(t["token"].strip() for h in heads[7:] for t in h["writes"]["lowers"] if len(t["token"].strip()) > 1)
    expected = sum(
        any(written.lower() in t["token"].strip().lower() for t in h["writes"]["raises"] + h["writes"]["lowers"])
        for h in heads
    )
    assert _search(page, written) == expected >= 1
    assert _search(page, "nothing-like-this") == 0
    assert _search(page, "") == 20
    page.uncheck("#aw-roles input[value='other']")
    others = sum(h["role"] == "other" for h in heads)
    assert others > 0 and _count(page) == 20 - others
    page.check("#aw-roles input[value='other']")
    page.fill("#aw-layer-min", "1")
    page.fill("#aw-layer-max", "2")
    assert _count(page) == 10
    page.fill("#aw-layer-min", "0")
    page.fill("#aw-layer-max", "3")
    least = sorted(abs(h["importance"]["value"]) for h in heads if h["importance"])[-4]
    page.fill("#aw-min-imp", repr(least))
    assert _count(page) == 4 and "4 of 20 heads match" in page.text_content("#aw-count")
    assert problems == [] and attempted == []
    page.close()


def test_a_hash_opens_its_card_and_a_card_alone_for_a_notebook(open_atlas, tmp_path):
    atlas = synthetic_atlas(3, 2)
    path = write_atlas_page(atlas, tmp_path / "atlas.html")
    page, problems, attempted = open_atlas(path, fragment="L1.H0")
    assert _card(page) == "L1.H0" and page.get_attribute(".cell.sel", "data-id") == "L1.H0"
    page.evaluate("location.hash = '#L2.H1'")
    page.wait_for_function("document.getElementById('aw-card-id').textContent === 'L2.H1'")
    assert problems == [] and attempted == []
    page.close()
    one = tmp_path / "card.html"
    one.write_text(atlas_card_html(atlas, "L2.H1"), encoding="utf-8")
    page, problems, attempted = open_atlas(one)
    assert _card(page) == "L2.H1" and not page.is_visible("#aw-grid") and not page.is_visible("#aw-search")
    partner = _follow_first_partner(page)
    assert _card(page) == partner and page.evaluate("location.hash") == ""  # the frame's URL is left alone
    assert problems == [] and attempted == []
    page.close()


def test_a_thousand_heads_render(open_atlas, tmp_path):
    path = write_atlas_page(synthetic_atlas(32, 32, markup=True), tmp_path / "atlas.html")
    start = time.perf_counter()
    page, problems, attempted = open_atlas(path, width=1600, height=1000)
    loaded = time.perf_counter() - start
    assert page.get_attribute("#aw-grid", "data-cells") == "1024" and page.locator(".cell").count() == 1024
    assert _count(page) == 1024
    page.click(".cell[data-id='L31.H31']")
    assert _card(page) == "L31.H31"
    assert _search(page, "L31") == 32
    assert loaded < 15, f"the page took {loaded:.1f} s to be ready"
    assert problems == [] and attempted == []
    page.close()

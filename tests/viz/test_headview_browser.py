"""The offline head view in a real headless Chromium (Debian's ``chromium``, driven by Playwright)."""

from __future__ import annotations

import base64
import time

import numpy as np
import pytest

from _browser import BROWSER_MARKS, chromium, open_page
from headwise.viz.headview import TOP_K, headview_payload, query_overview, render_headview, write_headview

pytestmark = BROWSER_MARKS
pytest.importorskip("playwright.sync_api", reason="playwright (Python) is not installed")

N = 10


def _known_maps() -> np.ndarray:
    """Layer 0: head 0 identity, head 1 previous token (row 0 on itself), head 2 uniform; layer 1: identity."""
    a = np.zeros((2, 3, N, N))
    a[0, 0] = np.eye(N)
    a[0, 1, 0, 0] = 1.0
    a[0, 1, np.arange(1, N), np.arange(N - 1)] = 1.0
    a[0, 2] = 1.0 / N
    a[1] = np.eye(N)
    return a


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


def _open(browser, path):
    return open_page(browser, path, width=1000, height=800, timeout_ms=20_000)


def _lines(page) -> int:
    return int(page.get_attribute("#hv-canvas", "data-lines"))


def _pixels(page) -> str:
    return page.evaluate("document.getElementById('hv-canvas').toDataURL()")


def test_renders_and_selectors_change_what_is_drawn(browser, tmp_path):
    tokens = ["[CLS]", "in", "the", "</script><b>x", "god", "created", ",", "light", ".", "[SEP]"]
    path = write_headview(_known_maps(), tokens, tmp_path / "headview.html", roles=[["self", "prev", "broad"]] * 2)
    page, problems, requests = _open(browser, path)
    assert page.text_content("#hv-title") == "head view"
    assert page.locator("#hv-layer option").count() == 2
    assert page.locator("#hv-heads input[type=checkbox]").count() == 3
    # Layer 0, all heads: identity N + previous N + uniform N·N lines (1/N = 0.1 → opacity 26/255).
    assert _lines(page) == N + N + N * N
    before = _pixels(page)
    page.select_option("#hv-layer", "1")
    assert page.get_attribute("#hv-canvas", "data-layer") == "1" and _lines(page) == 3 * N
    assert _pixels(page) != before
    page.select_option("#hv-layer", "0")
    page.uncheck("#hv-heads input[data-head='2']")
    assert _lines(page) == 2 * N and page.get_attribute("#hv-canvas", "data-heads") == "0,1"
    page.dblclick("#hv-heads label[data-head='1']")
    assert _lines(page) == N and page.get_attribute("#hv-canvas", "data-heads") == "1"
    page.click("#hv-all")
    assert _lines(page) == N + N + N * N
    # Hovering a query token (left column) shows only its lines: 1 + 1 + N.
    box = page.locator("#hv-canvas").bounding_box()
    row_h, pad = 18, 6
    page.mouse.move(box["x"] + 20, box["y"] + pad + 3 * row_h + row_h / 2)
    assert page.get_attribute("#hv-canvas", "data-hover") == "left:3" and _lines(page) == 1 + 1 + N
    # Hovering key token 0 (right column): identity row 0, previous-token rows 0 and 1, uniform N.
    page.mouse.move(box["x"] + box["width"] - 20, box["y"] + pad + row_h / 2)
    assert page.get_attribute("#hv-canvas", "data-hover") == "right:0" and _lines(page) == 1 + 2 + N
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] + 50)
    assert _lines(page) == N + N + N * N
    assert page.locator("#hv-heads .role").first.text_content() == "· self"
    assert page.is_hidden("#hv-range")  # not a pooled overview: no choice of queries
    assert problems == [] and requests == []
    page.close()


FRAME = "new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r(0))))"  # painted


def _timed(page, action) -> float:
    start = time.perf_counter()
    action()
    page.evaluate(FRAME)
    return time.perf_counter() - start


@pytest.mark.slow
def test_stays_responsive_at_512_tokens(browser, tmp_path):
    rng = np.random.default_rng(0)
    n, layers, heads = 512, 6, 12
    x = rng.normal(size=(layers, heads, n, n)).astype(np.float32) * 4  # denser than real heads: a hard case
    x = np.exp(x - x.max(-1, keepdims=True))
    maps = x / x.sum(-1, keepdims=True)
    payload = headview_payload(maps, [f"tok{i}" for i in range(n)])
    assert payload["k"] == TOP_K and payload["dropped"] < 0.5
    path = tmp_path / "long.html"
    path.write_text(render_headview(payload), encoding="utf-8")
    assert path.stat().st_size < 8_000_000
    start = time.perf_counter()
    page, problems, requests = _open(browser, path)
    page.evaluate(FRAME)
    load_s = time.perf_counter() - start
    assert 0 < _lines(page) <= 20_000  # the line budget: faint lines left out, and the page says so
    assert float(page.get_attribute("#hv-canvas", "data-min-weight")) > 1 / 255
    assert "hidden" in page.text_content("#hv-status")
    timings = [_timed(page, lambda v=v: page.select_option("#hv-layer", v)) for v in ("3", "5", "0")]
    timings.append(_timed(page, lambda: page.evaluate("document.getElementById('hv-wrap').scrollTop = 3000")))
    box = page.locator("#hv-canvas").bounding_box()
    timings.append(_timed(page, lambda: page.mouse.move(box["x"] + 20, box["y"] + 200)))
    hover = page.get_attribute("#hv-canvas", "data-hover")
    assert hover.startswith("left:")
    row = int(hover.split(":")[1])
    weights = np.frombuffer(base64.b64decode(payload["weights"]), dtype=np.uint8).reshape(layers, heads, n, TOP_K)
    assert _lines(page) == int((weights[0, :, row] > 0).sum())  # hovering shows all of the token's lines
    nodes = page.evaluate("document.querySelectorAll('*').length")
    assert nodes < 200, nodes  # no element per line or per token
    assert max(timings) < 5.0, timings  # seconds to a painted frame: software rendering, shared CI cores
    assert load_s < 30, load_s
    assert problems == [] and requests == []
    page.close()


def test_a_pooled_overview_chooses_queries_and_shows_their_command(browser, tmp_path):
    """128 bins of 64 tokens (an 8,192-token input): head 0 on its own bin, head 1 uniform over earlier bins."""
    bins = 128
    maps = np.zeros((2, 2, bins, bins))
    maps[:, 0] = np.eye(bins)
    maps[:, 1] = np.tril(np.ones((bins, bins))) / np.arange(1, bins + 1)[:, None]
    bounds = np.arange(0, 8192 + 1, 64)
    labels = [f"{a}–{b - 1}" for a, b in zip(bounds[:-1], bounds[1:])]
    ov = query_overview(bounds, command="headwise heads --model ./m TEXT --out ./o", max_queries=512, note="TEXT: …")
    path = write_headview(maps, labels, tmp_path / "headview.html", causal=True, overview=ov)
    page, problems, requests = _open(browser, path)
    assert page.is_visible("#hv-range") and page.is_disabled("#hv-copy")
    assert page.text_content("#hv-command") == "headwise heads --model ./m TEXT --out ./o --queries A:B"
    assert page.get_attribute("#hv-zoom", "data-rows") == ""
    page.focus("#hv-qa")
    page.keyboard.type("650")
    page.keyboard.press("Tab")
    page.focus("#hv-qb")
    page.keyboard.type("800")
    page.keyboard.press("Enter")
    assert page.text_content("#hv-command") == "headwise heads --model ./m TEXT --out ./o --queries 650:800"
    assert page.get_attribute("#hv-canvas", "data-range") == "10,13"  # tokens 650 … 799: bins 10 … 12
    # Enlarged rows 10 … 12 over key bins 0 … 12: head 0 one cell a row, head 1 r + 1 cells (11 + 12 + 13).
    assert page.get_attribute("#hv-zoom", "data-rows") == "10,13"
    assert page.get_attribute("#hv-zoom", "data-heads") == "0,1"
    assert int(page.get_attribute("#hv-zoom", "data-cells")) == 3 + 36
    page.uncheck("#hv-heads input[data-head='1']")
    assert int(page.get_attribute("#hv-zoom", "data-cells")) == 3
    assert not page.is_disabled("#hv-copy") and "TEXT: …" in page.text_content("#hv-range-note")
    assert problems == [] and requests == []
    page.close()

"""The model view (every layer × head as a thumbnail) of the offline page, in a real headless Chromium."""

from __future__ import annotations

import time

import numpy as np
import pytest

from _browser import BROWSER_MARKS, chromium, open_page
from headwise.viz.headview import THUMB, headview_payload, render_headview, thumbnails, write_headview

N = 10


def _causal_maps(layers: int = 2, heads: int = 3, n: int = N) -> np.ndarray:
    """Head 0: previous token (token 0 on itself); head 1: first token; head 2: uniform over the prefix."""
    a = np.zeros((layers, heads, n, n))
    a[:, 0, 0, 0] = 1.0
    a[:, 0, np.arange(1, n), np.arange(n - 1)] = 1.0
    a[:, 1, :, 0] = 1.0
    a[:, 2] = np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]
    return a


def test_thumbnails_pool_by_hand():
    a = _causal_maps()
    pooled, bounds = thumbnails(a)
    np.testing.assert_array_equal(pooled, a.astype(np.float32))  # n ≤ THUMB: one cell per token (float32 maps)
    np.testing.assert_array_equal(bounds, np.arange(N + 1))
    big = _causal_maps(1, 3, 2 * THUMB)
    pooled, bounds = thumbnails(big)
    assert pooled.shape == (1, 3, THUMB, THUMB) and bounds[-1] == 2 * THUMB
    np.testing.assert_allclose(pooled.sum(-1), 1.0, rtol=1e-6)  # rows still sum to 1 (float32 maps)
    # First-token head: every query bin puts everything on key bin 0; previous-token head: bins of two
    # tokens, query 2p+1 looks inside its own bin and query 2p into bin p − 1 (half each, bin 0 all inside).
    np.testing.assert_allclose(pooled[0, 1, :, 0], 1.0)
    expected = np.zeros((THUMB, THUMB))
    expected[0, 0] = 1.0
    for p in range(1, THUMB):
        expected[p, p] = expected[p, p - 1] = 0.5
    np.testing.assert_allclose(pooled[0, 0], expected, atol=1e-7)
    assert np.triu(pooled[0, 2], k=1).max() == 0.0  # causal: nothing above the diagonal


def browser_only(test):
    """Mark a test as needing Debian's chromium (skipped with the reason when it is missing)."""
    for mark in reversed(BROWSER_MARKS):
        test = mark(test)
    return test


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


def _open(browser, path, height=900):
    return open_page(browser, path, width=1100, height=height)


def _pixels(page, points):
    """RGB of the model-view canvas at CSS pixels [(x, y), …] — one readback of the whole canvas."""
    return page.evaluate(
        """(points) => { const c = document.getElementById('mv-canvas'), d = window.devicePixelRatio || 1;
        const all = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        return points.map(([x, y]) => { const o = 4 * (Math.floor(y * d) * c.width + Math.floor(x * d));
        return [all[o], all[o + 1], all[o + 2]]; }); }""",
        [list(p) for p in points],
    )


def _cell(page, layer, head, q, k, heads=3, n=N):
    """CSS coordinates, inside the model canvas, of the centre of token cell (q, k) of a thumbnail
    (the page's layout: 28 px of layer labels, 16 px of head labels, 4 px between thumbnails)."""
    width = page.evaluate("document.getElementById('mv-canvas').clientWidth")
    left, top, gap = 28, 16, 4
    cell = (width - left) / heads - gap
    return left + head * (cell + gap) + (k + 0.5) * cell / n, top + layer * (cell + gap) + (q + 0.5) * cell / n


@browser_only
@pytest.mark.parametrize("causal", [True, False])
def test_model_view_renders_and_a_click_opens_the_head(browser, tmp_path, causal):
    tokens = ["<bos>", "in", "the", "</script><b>x", "god", "created", ",", "light", ".", "end"]
    path = write_headview(
        _causal_maps(), tokens, tmp_path / "hv.html", causal=causal, roles=[["prev", "first", "broad"]] * 2
    )
    page, problems, requests = _open(browser, path)
    assert page.locator("#mv-canvas").count() == 1
    assert page.get_attribute("#mv-canvas", "data-selected") == ""
    # Previous-token head of layer 0: the cell (3, 2) is dark, (3, 4) is a future key.
    dark, future = _pixels(page, [_cell(page, 0, 0, 3, 2), _cell(page, 0, 0, 3, 4)])
    assert dark[0] < 60, dark
    assert future == ([238, 240, 243] if causal else [255, 255, 255]), future
    page.locator("#mv").scroll_into_view_if_needed()
    box = page.locator("#mv-canvas").bounding_box()
    x, y = _cell(page, 1, 2, 5, 5)
    page.mouse.click(box["x"] + x, box["y"] + y)
    assert page.get_attribute("#hv-canvas", "data-layer") == "1"
    assert page.get_attribute("#hv-canvas", "data-heads") == "2"
    assert page.get_attribute("#mv-canvas", "data-selected") == "1,2"
    assert page.input_value("#hv-layer") == "1"
    assert page.is_checked("#hv-heads input[data-head='2']") and not page.is_checked("#hv-heads input[data-head='0']")
    # Uniform over the prefix: token i has i + 1 lines, every query together N (N + 1) / 2.
    assert int(page.get_attribute("#hv-canvas", "data-lines")) == N * (N + 1) // 2
    # Clicking the gap between thumbnails changes nothing.
    page.mouse.click(box["x"] + 2, box["y"] + 2)
    assert page.get_attribute("#mv-canvas", "data-selected") == "1,2"
    page.click("#hv-all")
    assert page.get_attribute("#mv-canvas", "data-selected") == ""
    assert problems == [] and requests == []
    page.close()


FRAME = "new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r(0))))"


@pytest.mark.slow
@browser_only
def test_a_512_token_decoder_stays_responsive(browser, tmp_path):
    rng = np.random.default_rng(0)
    n, layers, heads = 512, 12, 12
    x = rng.normal(size=(layers, heads, n, n)).astype(np.float32) * 4
    x = np.where(np.tril(np.ones((n, n), dtype=bool)), x, -np.inf)  # causal
    x = np.exp(x - x.max(-1, keepdims=True))
    maps = x / x.sum(-1, keepdims=True)
    payload = headview_payload(maps, [f"t{i}" for i in range(n)], causal=True)
    assert payload["thumb"] == THUMB and payload["causal"]
    path = tmp_path / "long.html"
    path.write_text(render_headview(payload), encoding="utf-8")
    assert path.stat().st_size < 16_000_000
    start = time.perf_counter()
    page, problems, requests = _open(browser, path)
    page.evaluate(FRAME)
    load_s = time.perf_counter() - start
    timings = []
    for layer, head in ((3, 7), (11, 0), (0, 11)):
        t0 = time.perf_counter()
        page.evaluate(f"window.headview.openHead({layer}, {head})")
        page.evaluate(FRAME)
        timings.append(time.perf_counter() - t0)
        assert page.get_attribute("#mv-canvas", "data-selected") == f"{layer},{head}"
        assert page.get_attribute("#hv-canvas", "data-layer") == str(layer)
    lines = int(page.get_attribute("#hv-canvas", "data-lines"))
    assert 0 < lines <= 20_000
    nodes = page.evaluate("document.querySelectorAll('*').length")
    assert nodes < 250, nodes  # one canvas for all 144 thumbnails, none per head
    assert max(timings) < 5.0, timings  # to a painted frame: software rendering on shared CI cores
    assert load_s < 40, load_s
    assert problems == [] and requests == []
    page.close()

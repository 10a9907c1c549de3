"""The offline circuit page in a real headless Chromium (Debian's ``chromium``, driven by Playwright)."""

from __future__ import annotations

import numpy as np
import pytest

from _browser import BROWSER_MARKS, canvas_image, chromium, open_page
from _circuit_dicts import make_circuit
from headwise.viz.circuit import edge_scores
from headwise.viz.circuit_page import write_circuit_page

pytestmark = BROWSER_MARKS
pytest.importorskip("playwright.sync_api", reason="playwright (Python) is not installed")


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


def _drawn(page) -> int:
    return int(page.get_attribute("#cg-canvas", "data-drawn"))


def _click_node(page, node_id: str) -> None:
    x, y = page.evaluate(f"window.circuitView.nodeXY({node_id!r})")
    box = page.locator("#cg-canvas").bounding_box()
    page.mouse.click(box["x"] + x, box["y"] + y)


def test_the_graph_draws_the_strongest_edges_and_the_controls_change_them(browser, tmp_path):
    d = make_circuit(layers=3, heads=4, kv_groups=2, keep=6)
    d["tokens"][1] = "</script><b>x"
    path = write_circuit_page(d, tmp_path / "circuit.html")
    page, problems, requests = open_page(browser, path)
    edges = len(d["edges"])
    assert page.text_content("#cg-title") == d["model"]
    assert page.locator("#cg-method option").count() == 2
    assert _drawn(page) == min(150, edges) and page.get_attribute("#cg-canvas", "data-method") == "eap"
    before = canvas_image(page, "cg-canvas")
    page.fill("#cg-count", "5")
    page.dispatch_event("#cg-count", "change")
    assert _drawn(page) == 5 and page.input_value("#cg-slider") == "5"
    few = canvas_image(page, "cg-canvas")
    assert np.abs(before.astype(int) - few.astype(int)).max() > 100
    page.fill("#cg-count", str(10**6))  # clamped to every edge
    page.dispatch_event("#cg-count", "change")
    assert _drawn(page) == edges
    page.check("#cg-only")
    assert _drawn(page) == 6 and "the circuit" in page.text_content("#cg-status")
    page.uncheck("#cg-only")
    page.select_option("#cg-method", "exact")
    assert page.get_attribute("#cg-canvas", "data-method") == "exact"
    assert problems == [] and requests == []
    page.close()


def test_clicking_a_head_shows_its_pattern_effect_and_strongest_edges(browser, tmp_path):
    d = make_circuit(layers=2, heads=4, kv_groups=2, tokens=8)
    eye = np.eye(8)
    d["node_details"]["L1.H3"]["pattern"] = eye.tolist()  # each token on itself: a dark diagonal
    d["node_details"]["L1.H3"]["direct_effect"] = -0.4321
    path = write_circuit_page(d, tmp_path / "circuit.html")
    page, problems, requests = open_page(browser, path, width=1300)
    _click_node(page, "L1.H3")
    assert page.get_attribute("#cg-canvas", "data-selected") == "L1.H3"
    assert page.text_content("#cg-direct") == "-0.4321"
    assert "query head 3 of layer 1" in page.text_content("#cg-kind") and "group 1" in page.text_content("#cg-kind")
    assert page.get_attribute("#cg-pattern", "data-cells") == "64"
    image = canvas_image(page, "cg-pattern").astype(float).mean(-1)  # (h, w) brightness, device pixels
    dpr = page.evaluate("window.devicePixelRatio")
    offset, cell = (float(page.get_attribute("#cg-pattern", f"data-{k}")) * dpr for k in ("offset", "cell"))
    assert offset > 0  # the tokens label the rows and columns

    def at(q, k):
        return image[int(offset + (q + 0.5) * cell), int(offset + (k + 0.5) * cell)]

    diagonal = [at(i, i) for i in range(8)]
    off = [at(i, (i + 3) % 8) for i in range(8)]
    assert max(diagonal) < 120 and min(off) > 250
    # The edge table: the 12 strongest edges touching the head, strongest first, by the ranking's score.
    s = edge_scores(d)
    touching = [i for i, e in enumerate(d["edges"]) if "L1.H3" in (e["sender"], e["receiver"])]
    best = sorted(touching, key=lambda i: (-abs(s[i]), i))[:12]
    rows = page.locator("#cg-edges tbody tr")
    assert rows.count() == len(best)
    first = [c.strip(" ●") for c in rows.nth(0).locator("td").all_text_contents()]
    e = d["edges"][best[0]]
    assert first[:3] == [e["sender"], e["receiver"], e["input"]]
    assert float(first[3]) == pytest.approx(s[best[0]], abs=1e-3)
    assert page.text_content("#cg-qk") == "none for this node"
    # A key/value group has no pattern; the find box selects by id.
    page.fill("#cg-find", "L0.KV1")
    page.press("#cg-find", "Enter")
    assert page.get_attribute("#cg-canvas", "data-selected") == "L0.KV1"
    assert page.text_content("#cg-pattern-note") == "not a head"
    assert page.get_attribute("#cg-pattern", "data-cells") == "0"
    assert "shared by heads 2, 3" in page.text_content("#cg-kind")
    page.fill("#cg-find", "L9.H9")
    page.press("#cg-find", "Enter")
    assert "no node" in page.text_content("#cg-status")
    assert page.get_attribute("#cg-canvas", "data-selected") == "L0.KV1"
    assert problems == [] and requests == []
    page.close()


def test_a_query_key_attribution_is_shown_by_part(browser, tmp_path):
    d = make_circuit(layers=2, heads=2, kv_groups=None, mlp=False, tokens=5)
    terms = [
        {"query_part": "embed", "key_part": "L0.H1", "value": 0.5},
        {"query_part": "L0.H0", "key_part": "embed", "value": -2.0},
        {"query_part": "embed", "key_part": "embed", "value": 1.25},
    ]
    d["node_details"]["L1.H0"]["qk"] = {"query": 4, "key": 2, "terms": terms}
    page, problems, _ = open_page(browser, write_circuit_page(d, tmp_path / "circuit.html"))
    _click_node(page, "L1.H0")
    assert page.get_attribute("#cg-qk", "data-terms") == "3"
    cells = page.locator("#cg-qk table tr").nth(1).locator("td").all_text_contents()
    assert cells[:3] == ["L0.H0", "embed", "-2.000"]  # the largest |value| first
    assert "query 4 «t4» on key 2 «t2»" in page.text_content("#cg-qk")
    assert "sum of the parts: -0.2500" in page.text_content("#cg-qk")
    assert problems == []
    page.close()


@pytest.mark.slow
def test_a_model_of_thirty_layers_and_seventy_thousand_edges(browser, tmp_path):
    d = make_circuit(layers=30, heads=9, kv_groups=3, tokens=16, keep=40)
    path = write_circuit_page(d, tmp_path / "circuit.html")
    page, problems, requests = open_page(browser, path, width=1400, height=900, timeout_ms=60_000)
    assert _drawn(page) == 150
    page.fill("#cg-count", "5000")
    page.dispatch_event("#cg-count", "change")
    assert _drawn(page) == 5000
    _click_node(page, "L29.H8")
    assert page.get_attribute("#cg-canvas", "data-selected") == "L29.H8"
    assert page.get_attribute("#cg-pattern", "data-cells") == str(16 * 16)
    assert page.locator("#cg-edges tbody tr").count() == 12
    assert problems == [] and requests == []
    page.close()


def test_edges_are_drawn_fainter_the_less_often_they_survive(browser, tmp_path):
    """With a bootstrap the circuit's edges fade by survival (a page where every edge survives against one where none
    does), and the agreement box states the bootstrap."""
    d = make_circuit(layers=2, heads=4, kv_groups=2, keep=6)
    images = []
    for survival in (1.0, 0.0):
        for e in d["edges"]:
            e["survival"] = survival
        d["bootstrap"] = {"resamples": 40, "pairs": 8, "size": 6, "circuit_jaccard": 0.5, "stable_share": survival}
        page, problems, requests = open_page(browser, write_circuit_page(d, tmp_path / f"c{survival}.html"))
        images.append(_alpha(page))
        said = page.text_content("#cg-agreement")
        assert "bootstrap (40 resamples of 8 pairs)" in said and f"{round(100 * survival)}% of its edges" in said
        assert problems == [] and requests == []
        page.close()
    assert images[1].sum() < 0.8 * images[0].sum()  # less ink where no edge survives


def _alpha(page):
    """The graph canvas's alpha channel (what is drawn on its transparent ground), as integers."""
    import base64
    import io

    from PIL import Image

    url = page.evaluate("document.getElementById('cg-canvas').toDataURL()")
    png = base64.b64decode(url.split(",", 1)[1])
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGBA"))[..., 3].astype(int)

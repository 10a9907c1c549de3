"""``headwise heads --model DIR`` at 8,192 tokens, end to end: the real command on a tiny random Llama-style
decoder, then both head views in a real headless Chromium — the pooled overview with its in-page choice of
queries, and ``headview_queries.html`` — and the command the page shows, run, draws the queries chosen."""

from __future__ import annotations

import base64
import json
import shlex

import numpy as np
import pytest

from _browser import BROWSER_MARKS, canvas_image, chromium, open_page
from headwise.viz.headview import page_size_bound

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from _decoders import WORDS, save_decoder  # noqa: E402

pytestmark = [*BROWSER_MARKS, pytest.mark.slow]

L = 8192  # tokens, BOS included
LAYERS, HEADS = 2, 4  # _decoders.FAMILIES["llama"]
BINS = 128  # the pooled overview's rows (headwise.study.VIEW_BINS)
ROW_H, PAD = 18, 6  # the head view's row height for ≤ 128 rows, and its top padding (headview.js)
HIGHLIGHT = (209, 233, 255)  # a chosen bin's background in the query column (headview.js)


def _stored(data: dict) -> tuple[np.ndarray, np.ndarray]:
    """A page's kept lines: weights · 255 and key indices, ``(NL, H, n, K)`` each."""
    shape = (data["layers"], data["heads"], data["n"], data["k"])
    weights = np.frombuffer(base64.b64decode(data["weights"]), dtype=np.uint8).reshape(shape)
    keys = np.frombuffer(base64.b64decode(data["keys"]), dtype="<u2").reshape(shape)
    return weights, keys


def _attr(page, selector: str, name: str) -> str:
    return page.get_attribute(selector, name)


def _choose_by_keyboard(page, a: int, b: int) -> None:
    """Type A, Tab, type B, Enter — the number inputs, as a keyboard user would."""
    page.focus("#hv-qa")
    page.keyboard.press("Control+A")
    page.keyboard.type(str(a))
    page.keyboard.press("Tab")
    page.focus("#hv-qb")
    page.keyboard.press("Control+A")
    page.keyboard.type(str(b))
    page.keyboard.press("Enter")


def _check_overview(browser, out, model) -> str:
    """headview.html: renders, layer / head selection changes what is drawn, queries are chosen by dragging,
    shift-click, the keyboard, clamped past 512; returns the command shown for the dragged range."""
    page, problems, requests = open_page(browser, out / "headview.html", width=1200, height=900)
    data = page.evaluate("window.headview.data")
    ov = data["overview"]
    bounds = ov["bounds"]
    assert data["n"] == BINS and ov["tokens"] == L and len(bounds) == BINS + 1 and ov["max_queries"] == 512
    assert page.locator("#hv-layer option").count() == LAYERS
    assert page.locator("#hv-heads input[type=checkbox]").count() == HEADS
    assert page.is_visible("#hv-range")
    assert page.get_attribute("#hv-links a", "href") == "headview_queries.html"
    prefix = f"headwise heads --model {shlex.quote(str(model))} TEXT --queries-only --out {shlex.quote(str(out))}"
    # The --queries range the command was given is the first choice.
    assert page.text_content("#hv-command") == f"{prefix} --queries 4000:4100"
    assert _attr(page, "#hv-zoom", "data-queries") == "4000:4100"
    assert "already at full resolution" in page.text_content("#hv-range-note")

    # Layer and heads: what is drawn changes (the overview's lines and the enlarged rows alike).
    lines0 = int(_attr(page, "#hv-canvas", "data-lines"))
    overview0, zoom0 = canvas_image(page, "hv-canvas"), canvas_image(page, "hv-zoom")
    assert lines0 > 0
    page.select_option("#hv-layer", "1")
    assert _attr(page, "#hv-canvas", "data-layer") == "1" and _attr(page, "#hv-zoom", "data-layer") == "1"
    assert not np.array_equal(canvas_image(page, "hv-canvas"), overview0)
    assert not np.array_equal(canvas_image(page, "hv-zoom"), zoom0)
    page.dblclick("#hv-heads label[data-head='2']")
    assert _attr(page, "#hv-canvas", "data-heads") == "2" and _attr(page, "#hv-zoom", "data-heads") == "2"
    assert int(_attr(page, "#hv-canvas", "data-lines")) < lines0

    # Drag over the query column from bin 10 to bin 12: bins 10 … 12, their exact token bounds.
    box = page.locator("#hv-canvas").bounding_box()
    page.evaluate("document.getElementById('hv-wrap').scrollTop = 0")
    x = box["x"] + 20
    page.mouse.move(x, box["y"] + PAD + 10 * ROW_H + ROW_H / 2)
    page.mouse.down()
    page.mouse.move(x, box["y"] + PAD + 12 * ROW_H + ROW_H / 2, steps=4)
    page.mouse.up()
    a, b = bounds[10], bounds[13]
    assert (a, b) == (640, 832)  # 64 tokens a bin at 8,192
    shown = page.text_content("#hv-command")
    assert shown == f"{prefix} --queries {a}:{b}"
    assert page.input_value("#hv-qa") == str(a) and page.input_value("#hv-qb") == str(b)
    assert _attr(page, "#hv-canvas", "data-range") == "10,13" and _attr(page, "#hv-zoom", "data-rows") == "10,13"
    # Highlighted: the query column's background in the chosen bins, and only there (the mouse moved off, so
    # that no hovered row is drawn over them).
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] - 20)
    assert _attr(page, "#hv-canvas", "data-hover") == ""
    image = canvas_image(page, "hv-canvas")
    dpr = page.evaluate("window.devicePixelRatio || 1")
    at = [image[int((PAD + i * ROW_H + ROW_H / 2) * dpr), int(4 * dpr)].tolist() for i in (9, 10, 11, 12, 13)]
    assert at[1:4] == [list(HIGHLIGHT)] * 3 and list(HIGHLIGHT) not in (at[0], at[4]), at
    # Enlarged: every stored line of head 2's chosen rows in layer 1 whose key bin is not after the rows
    # (causal: the rows of bins 10 … 12 see key bins 0 … 12) is one cell.
    weights, keys = _stored(data)
    rows = slice(10, 13)
    cells = int(((weights[1, 2, rows] > 0) & (keys[1, 2, rows] < 13)).sum())
    assert int(_attr(page, "#hv-zoom", "data-cells")) == cells > 0
    assert "not repeated here" in page.text_content("#hv-range-note")  # what TEXT stands for

    # Shift-click extends from the drag's first bin; a plain click chooses one bin.
    page.keyboard.down("Shift")
    page.mouse.click(x, box["y"] + PAD + 14 * ROW_H + ROW_H / 2)
    page.keyboard.up("Shift")
    assert page.text_content("#hv-command").endswith(f"--queries {bounds[10]}:{bounds[15]}")
    page.mouse.click(x, box["y"] + PAD + 3 * ROW_H + ROW_H / 2)
    assert page.text_content("#hv-command").endswith(f"--queries {bounds[3]}:{bounds[4]}")

    # The keyboard: any token range, mid-bin included; the bins that hold it are chosen.
    _choose_by_keyboard(page, 5000, 5300)
    assert page.text_content("#hv-command").endswith("--queries 5000:5300")
    assert _attr(page, "#hv-canvas", "data-range") == f"{5000 // 64},{5299 // 64 + 1}"
    # Past the input and past 512 queries: clamped to what --queries accepts.
    _choose_by_keyboard(page, 100, 9000)
    assert page.text_content("#hv-command").endswith("--queries 100:612")
    assert "cut to the 512" in page.text_content("#hv-range-note")
    page.click("#hv-clear")
    assert _attr(page, "#hv-canvas", "data-range") == "" and page.is_disabled("#hv-copy")

    # Copy: to the clipboard where the browser allows it, else the text is selected for Ctrl+C.
    _choose_by_keyboard(page, a, b)
    page.click("#hv-copy")
    page.wait_for_function("document.getElementById('hv-copied').textContent !== ''", timeout=5_000)
    assert page.evaluate("document.querySelectorAll('*').length") < 250  # no element per line, bin or token
    assert problems == [] and requests == []
    page.close()
    return shown


def _check_queries_page(browser, out, a: int, b: int, tokens: list[str]) -> None:
    """headview_queries.html: renders queries a … b − 1 at full resolution, with lines, linked back."""
    page, problems, requests = open_page(browser, out / "headview_queries.html", width=1200, height=900)
    data = page.evaluate("window.headview.data")
    assert data["n"] == b - a and data["tokens"] == tokens[a:b] and data["overview"] is None
    assert f"queries {a}–{b - 1}" in page.text_content("#hv-title")
    assert page.get_attribute("#hv-links a", "href") == "headview.html"
    assert page.is_hidden("#hv-range")
    weights, _ = _stored(data)
    lines = int(_attr(page, "#hv-canvas", "data-lines"))
    assert 0 < lines <= int((weights[0] > 0).sum())
    before = canvas_image(page, "hv-canvas")
    page.select_option("#hv-layer", "1")
    assert _attr(page, "#hv-canvas", "data-layer") == "1"
    assert not np.array_equal(canvas_image(page, "hv-canvas"), before)
    # Hovering a query (of the first 30, on screen: the one with most lines) shows every line stored for it.
    row = int(np.argmax((weights[1, :, :30] > 0).sum(axis=(0, 2))))
    box = page.locator("#hv-canvas").bounding_box()
    row_h = ROW_H if b - a <= 128 else 14  # 14 px rows past 128 tokens
    page.mouse.move(box["x"] + 20, box["y"] + PAD + row * row_h + row_h / 2)
    assert _attr(page, "#hv-canvas", "data-hover") == f"left:{row}"
    assert int(_attr(page, "#hv-canvas", "data-lines")) == int((weights[1, :, row] > 0).sum()) > 0
    assert problems == [] and requests == []
    page.close()


def test_8192_tokens_the_head_views_render_choose_queries_and_the_command_shown_draws_them(run_cli, tmp_path):
    model = save_decoder(tmp_path / "llama", "llama", positions=L, init=0.5)
    words = np.random.default_rng(0).choice(WORDS[:18], L - 1)
    text = " ".join(words)  # one token a word, after BOS
    out = tmp_path / "out"
    outcome = run_cli("heads", text, "--model", str(model), "--out", str(out), "--queries", "4000:4100")
    assert outcome.code == 0, outcome.err
    info = json.loads((out / "heads.json").read_text())
    assert info["num_tokens"] == L and info["view"]["bins"] == BINS and info["view"]["queries"] == [4000, 4100]
    tokens = info["sentence"]["tokens"]
    sizes = {name: (out / name).stat().st_size for name in ("headview.html", "headview_queries.html")}
    assert sizes["headview.html"] <= page_size_bound(BINS, LAYERS, HEADS)  # whatever L is
    assert sizes["headview_queries.html"] <= page_size_bound(100, LAYERS, HEADS)
    with chromium() as browser:
        shown = _check_overview(browser, out, model)
        _check_queries_page(browser, out, 4000, 4100, tokens)
        # The command the page showed for bins 10 … 12, TEXT put back, writes those queries at full resolution
        # from a pass over those rows alone, and leaves every other file as it was.
        argv = [text if arg == "TEXT" else arg for arg in shlex.split(shown)]
        assert argv[:2] == ["headwise", "heads"] and "--queries-only" in argv
        before = {f.name: f.read_bytes() for f in out.iterdir() if f.name != "headview_queries.html"}
        outcome = run_cli(*argv[1:])
        assert outcome.code == 0, outcome.err
        assert {f.name: f.read_bytes() for f in out.iterdir() if f.name != "headview_queries.html"} == before
        _check_queries_page(browser, out, 640, 832, tokens)

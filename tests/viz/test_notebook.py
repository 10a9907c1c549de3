"""Views inline in notebooks: a notebook executed with nbclient (a real Jupyter kernel), exported to HTML with
nbconvert and opened in Debian's Chromium — every view renders in its own frame, offline, with no clash."""

from __future__ import annotations

import html
import os

import numpy as np
import pytest

from headwise.viz.notebook import head_view, report_view

CHROMIUM = "/usr/bin/chromium"


def _maps(layers=2, heads=3, n=9, seed=0, causal=False):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(layers, heads, n, n)) * 2
    if causal:
        x = np.where(np.tril(np.ones((n, n), bool)), x, -np.inf)
    x = np.exp(x - x.max(-1, keepdims=True))
    return x / x.sum(-1, keepdims=True)


def test_a_view_is_a_sandboxed_frame_of_the_whole_page(tmp_path):
    view = head_view(_maps(), [f"t{i}" for i in range(9)], title="A <b>title</b>")
    out = view._repr_html_()
    assert out.startswith("<iframe") and 'sandbox="allow-scripts"' in out
    assert "<script" not in out.split("srcdoc=")[0]
    page = html.unescape(out.split('srcdoc="', 1)[1].rsplit('"', 1)[0])
    assert page == view.page  # the frame holds exactly the page
    assert "http://" not in page and "https://" not in page
    saved = view.save(tmp_path / "v.html")
    assert saved.read_text(encoding="utf-8") == view.page


@pytest.mark.parametrize(("kwargs", "message"), [({"show": "all"}, "show"), ({"height": 10}, "height")])
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        head_view(_maps(), [f"t{i}" for i in range(9)], **kwargs)


def test_report_view_lists_every_head():
    from headwise.analysis import HeadStats, token_info

    maps = _maps(n=7)
    stats = HeadStats(2, 3, max_length=7)
    tokens = ["[CLS]", "a", "b", ",", "c", ".", "[SEP]"]
    stats.update([m[None] for m in maps], token_info([tokens], np.ones((1, 7), bool)))
    report = stats.result()
    page = report_view(report, title="random heads").page
    assert page.count("<tr>") == 1 + 2 * 3  # the header and one row per head
    assert "6 heads" in page and report.rows()[0]["role"] in page


NOTEBOOK_CELLS = [
    "import numpy as np\nfrom headwise.viz.notebook import head_view, report_view",
    "rng = np.random.default_rng(1)\n"
    "def maps(n, causal=False):\n"
    "    x = rng.normal(size=(2, 3, n, n)) * 2\n"
    "    if causal: x = np.where(np.tril(np.ones((n, n), bool)), x, -np.inf)\n"
    "    x = np.exp(x - x.max(-1, keepdims=True)); return x / x.sum(-1, keepdims=True)",
    "head_view(maps(8), [f'a{i}' for i in range(8)], title='first view')",
    "head_view(maps(12, causal=True), [f'b{i}' for i in range(12)], title='second view', causal=True, show='model')",
    "from headwise.analysis import HeadStats, token_info\n"
    "s = HeadStats(2, 3, max_length=8)\n"
    "s.update([m[None] for m in maps(8)], token_info([['x'] * 8], np.ones((1, 8), bool)))\n"
    "report_view(s.result(), title='the report')",
]


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} missing (apt-get install chromium)")
def test_notebook_executes_and_its_html_renders_every_view(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nbconvert = pytest.importorskip("nbconvert")
    sync_api = pytest.importorskip("playwright.sync_api")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in NOTEBOOK_CELLS])
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    html_outputs = [o for c in nb.cells for o in c.get("outputs", []) if "text/html" in o.get("data", {})]
    assert len(html_outputs) == 3
    # "basic": the notebook's cells without nbconvert's own page furniture (which loads MathJax and
    # require.js from the web): every request the page then makes is one of the views'.
    body, _ = nbconvert.HTMLExporter(template_name="basic").from_notebook_node(nb)
    path = tmp_path / "views.html"
    path.write_text(f'<!DOCTYPE html><html><head><meta charset="utf-8"></head><body>{body}</body></html>', "utf-8")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
        )
        page = browser.new_page(viewport={"width": 1100, "height": 900})
        problems, requests = [], []
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.on("request", lambda r: requests.append(r.url) if r.url.startswith(("http:", "https:")) else None)
        page.goto(path.as_uri())
        page.wait_for_load_state("load")
        frames = [f for f in page.frames if f != page.main_frame]
        assert len(frames) == 3
        for frame in frames:
            frame.wait_for_selector("body[data-ready='1']", timeout=20_000)
        first, second, report = frames
        assert first.text_content("#hv-title") == "first view"
        assert second.text_content("#hv-title") == "second view"
        assert int(first.get_attribute("#hv-canvas", "data-lines")) > 0
        # "model": only the model view until a head is opened from it; then the head view shows that head.
        assert second.evaluate("getComputedStyle(document.getElementById('hv-wrap')).display") == "none"
        second.evaluate("window.headview.openHead(1, 2)")
        assert second.evaluate("getComputedStyle(document.getElementById('hv-wrap')).display") != "none"
        assert second.get_attribute("#hv-canvas", "data-heads") == "2"
        # the views do not share state: the first view still shows its layer 0, every head
        assert first.get_attribute("#hv-canvas", "data-layer") == "0"
        assert first.get_attribute("#hv-canvas", "data-heads") == "0,1,2"
        assert report.locator("tbody tr").count() == 6
        assert problems == [] and requests == []
        browser.close()

"""The page ``headwise circuit`` writes, from a real circuit, in a headless Chromium: a click on a head shows the
pattern and direct effect that circuit.json holds for it."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from _browser import BROWSER_MARKS, canvas_image, chromium, open_page  # noqa: E402
from _decoders import save_decoder  # noqa: E402

pytestmark = BROWSER_MARKS
pytest.importorskip("playwright.sync_api", reason="playwright (Python) is not installed")


@pytest.mark.slow
def test_a_click_on_a_head_shows_what_circuit_json_holds(run_cli, tmp_path):
    folder = save_decoder(tmp_path / "llama", "llama", init=0.5)
    out = tmp_path / "out"
    argv = ["circuit", "--model", str(folder), "--out", str(out), "--exact-top", "4"]
    argv += ["--clean", "the cat sat on the mat", "--corrupted", "the dog sat on the mat"]
    argv += ["--answer", "cat", "--wrong", "dog"]
    assert run_cli(*argv).code == 0
    report = json.loads((out / "circuit.json").read_text())
    detail = report["node_details"]["L1.H1"]
    n = len(report["tokens"])
    with chromium() as browser:
        page, problems, requests = open_page(browser, out / "circuit.html", width=1300)
        assert int(page.get_attribute("#cg-canvas", "data-drawn")) == min(150, len(report["edges"]))
        assert page.locator("#cg-method option").count() == 2  # eap, and exact on the top 4
        x, y = page.evaluate("window.circuitView.nodeXY('L1.H1')")
        box = page.locator("#cg-canvas").bounding_box()
        page.mouse.click(box["x"] + x, box["y"] + y)
        assert page.get_attribute("#cg-canvas", "data-selected") == "L1.H1"
        assert float(page.text_content("#cg-direct")) == pytest.approx(detail["direct_effect"], abs=5e-4, rel=1e-3)
        assert page.get_attribute("#cg-pattern", "data-cells") == str(n * n)
        # The darkest cell of each query row is where circuit.json's pattern puts the most weight.
        image = canvas_image(page, "cg-pattern").astype(float).mean(-1)
        dpr = page.evaluate("window.devicePixelRatio")
        offset, cell = (float(page.get_attribute("#cg-pattern", f"data-{k}")) * dpr for k in ("offset", "cell"))
        pattern = np.array(detail["pattern"])
        for q in range(n):
            row = [image[int(offset + (q + 0.5) * cell), int(offset + (k + 0.5) * cell)] for k in range(q + 1)]
            if np.sort(pattern[q, : q + 1])[-1] - np.sort(pattern[q, : q + 1])[-2 if q else -1] > 0.05 or q == 0:
                assert int(np.argmin(row)) == int(np.argmax(pattern[q, : q + 1])), q
        assert problems == [] and requests == []
        page.close()

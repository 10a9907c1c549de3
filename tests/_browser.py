"""Debian's chromium driven by Playwright, as every browser test opens the offline pages."""

from __future__ import annotations

import os
from contextlib import contextmanager

import pytest

CHROMIUM = "/usr/bin/chromium"

#: ``pytestmark`` of a browser test module: marked, and skipped with the reason when chromium is missing.
BROWSER_MARKS = [
    pytest.mark.browser,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} missing (apt-get install chromium)"),
]


@contextmanager
def chromium():
    """A headless chromium (skips the test when Playwright for Python is not installed)."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (Python) is not installed")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
        )
        try:
            yield browser
        finally:
            browser.close()


def open_page(browser, path, *, width: int = 1000, height: int = 800, timeout_ms: int = 30_000):
    """Open ``path`` (a file) and wait for the page's ``body[data-ready='1']``.

    Returns:
        ``(page, problems, requests)``: console errors and warnings and uncaught exceptions as they come, and
        every request for anything but a ``file:`` or ``data:`` URL.
    """
    page = browser.new_page(viewport={"width": width, "height": height})
    problems, requests = [], []
    page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.on("request", lambda r: requests.append(r.url) if not r.url.startswith(("file:", "data:")) else None)
    page.goto(path.as_uri())
    page.wait_for_selector("body[data-ready='1']", timeout=timeout_ms)
    return page, problems, requests


def canvas_image(page, canvas_id: str):
    """The canvas ``canvas_id`` as an RGB ``(height, width, 3)`` uint8 array in device pixels (through
    ``toDataURL``: a PNG, no ``getImageData`` readback for chromium to warn about)."""
    import base64
    import io

    import numpy as np
    from PIL import Image

    url = page.evaluate(f"document.getElementById({canvas_id!r}).toDataURL()")
    png = base64.b64decode(url.split(",", 1)[1])
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))

"""``atlas.html``: one self-contained, offline page of every attention head of a model (an ``atlas.json``).

Shape legend: NL layers, H heads per layer.

The page reads an atlas in the format ``"headwise.atlas/1"`` (``atlas.json``'s contents, as the atlas library
computes it) and draws:

- a grid of NL rows (layers) × H columns (heads), one element per head built once; each cell coloured by the
  head's primary role (a fixed colour-blind-friendly palette, Okabe–Ito's, in the order of ``atlas["roles"]``;
  "other" grey) with an inner bar whose height is |importance| relative to the largest — solid for a measured
  (exact) value, hatched and outlined for an estimate, absent where there is none; the legend says so;
- a click on a cell (one delegated listener) opens the head's card, rendered on demand: its roles with score
  and threshold, statistics, the offset profile (an SVG bar chart, offsets on x), the top contexts as token
  strips (the key token shaded by its weight, the query token underlined), the outputs where its write is
  largest, the tokens it raises and lowers, the OV copying score and mappings, the loss effect and the
  importance with their labels ("exact" / "estimate"), the partners in and out as links to their cards. The
  URL hash follows the open card (``#L3.H5``); a page opened with a hash opens that card;
- a search box (a head id — ``L3`` for a layer —, a role, or a token the head writes), role checkboxes, a layer
  range and a minimum |importance|: cells that do not match fade, a count says how many match.

Everything is inline: the script (``atlas_page.js``) and styles (``atlas_page.html``) are package data, the atlas
is JSON in a ``<script type="application/json">`` block, written with ``<``, ``>``, ``&``, U+2028 and U+2029 as
``\\uXXXX`` escapes (the same strings once parsed: nothing in the data can end the block or open a comment); the
script shows every string through ``textContent``, never as HTML. No request leaves the file.

Size: the page is a fixed 26 kB of code plus the JSON as written (the escapes add under 2 %). Measured with the
synthetic atlas of the tests (per head 8 contexts of 24 tokens, 3 outputs of 12 tokens, 6 written tokens, the
roles, statistics and a 12-offset profile): 270 heads (30 × 9) 0.94 MB, 1,024 heads (32 × 32) 3.5 MB; the
tests hold them under 1.2 MB and 4.5 MB. In the browser the grid is built once (one element per head, one
delegated listener for clicks and keys) and a card is drawn only when opened.

For a notebook, :func:`atlas_card_html` is the same page opened on one head's card with the grid hidden, and
:func:`headwise.viz.notebook.atlas_view` shows either in a sandboxed frame.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from importlib import resources
from pathlib import Path

from headwise._io import write_text_atomic

__all__ = ["FORMAT", "atlas_card_html", "atlas_html", "write_atlas_page"]

#: The atlas format this page reads.
FORMAT = "headwise.atlas/1"

#: Characters written as ``\\uXXXX`` inside the page's JSON blocks (``<`` ``>`` ``&`` end a script or open a
#: comment; U+2028 / U+2029 end a line in older JavaScript).
_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def script_json(value, *, name: str) -> str:
    """``value`` as JSON safe inside a ``<script>`` element (see :data:`_ESCAPES`); parsed, it is ``value``.

    Raises:
        ValueError: ``value`` holds NaN or an infinity (JSON has none; the format writes null), naming ``name``.
    """
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError as e:
        raise ValueError(f"{name}: expected JSON values only (null, not NaN or infinity): {e}") from None
    for char, escape in _ESCAPES.items():
        text = text.replace(char, escape)
    return text


def check_atlas(atlas) -> None:
    """Check that ``atlas`` is an atlas the page can draw.

    Raises:
        TypeError: ``atlas`` is not a mapping, or its ``heads`` not a list of mappings.
        ValueError: its ``format`` is not :data:`FORMAT`, a head lacks an id or has a layer / head outside
            ``model.num_layers`` / ``model.num_heads``, or two heads share an id.
    """
    if not isinstance(atlas, Mapping):
        raise TypeError(f"atlas: expected a dict (atlas.json's contents), got {type(atlas).__name__}")
    if atlas.get("format") != FORMAT:
        raise ValueError(f"atlas: expected format {FORMAT!r}, got {atlas.get('format')!r}")
    heads = atlas.get("heads")
    if not isinstance(heads, list) or not all(isinstance(h, Mapping) for h in heads):
        raise TypeError(f"atlas: expected 'heads' to be a list of dicts, got {type(heads).__name__}")
    model = atlas.get("model") or {}
    limits = (model.get("num_layers"), model.get("num_heads"))
    seen = set()
    for i, h in enumerate(heads):
        hid, layer, head = h.get("id"), h.get("layer"), h.get("head")
        if not isinstance(hid, str) or not hid:
            raise ValueError(f"atlas: head {i} has no id (got {hid!r})")
        if hid in seen:
            raise ValueError(f"atlas: head id {hid!r} appears twice")
        seen.add(hid)
        for what, value, limit in (("layer", layer, limits[0]), ("head", head, limits[1])):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"atlas: head {hid!r} has {what} {value!r}, expected an integer ≥ 0")
            if isinstance(limit, int) and value >= limit:
                raise ValueError(f"atlas: head {hid!r} has {what} {value}, the model has {limit}")


def _page(atlas, options: dict) -> str:
    check_atlas(atlas)
    package = resources.files("headwise.viz")
    template = (package / "atlas_page.html").read_text(encoding="utf-8")
    script = (package / "atlas_page.js").read_text(encoding="utf-8")
    if "</script" in script.lower():
        raise ValueError("atlas_page.js: the script must not contain '</script'")
    blocks = {
        "/*__ATLAS_DATA__*/": script_json(atlas, name="atlas"),
        "/*__ATLAS_OPTIONS__*/": script_json(options, name="options"),
        "/*__ATLAS_JS__*/": script,
    }
    for marker, text in blocks.items():
        template = template.replace(marker, text)
    return template


def atlas_html(atlas: dict) -> str:
    """The self-contained offline page of an atlas.json dict (format ``"headwise.atlas/1"``).

    Args:
        atlas: ``atlas.json``'s contents; embedded as it is (the page's JSON block parses back to it exactly).
    Returns:
        The whole HTML page (see the module's docstring for what it shows and its size).
    Raises:
        TypeError / ValueError: ``atlas`` is not an atlas of this format (:func:`check_atlas`), or holds NaN.
    """
    return _page(atlas, {"open": None, "card_only": False})


def atlas_card_html(atlas: dict, head_id: str) -> str:
    """The atlas page opened on the card of ``head_id``, the grid and filters hidden (a notebook's view of one
    head); its partner links open their cards in the same page.

    Raises:
        ValueError: ``head_id`` is not a head of ``atlas``; ``atlas`` as :func:`atlas_html` says.
    """
    check_atlas(atlas)
    ids = [h["id"] for h in atlas["heads"]]
    if head_id not in ids:
        raise ValueError(f"head_id: expected the id of one of the atlas's {len(ids)} heads, got {head_id!r}")
    return _page(atlas, {"open": head_id, "card_only": True})


def write_atlas_page(atlas: dict, path: str | os.PathLike) -> Path:
    """Write :func:`atlas_html` of ``atlas`` to ``path`` (atomically; its folder must exist).

    Returns:
        ``path``. Raises: as :func:`atlas_html`; OSError: the folder is not writable.
    """
    return write_text_atomic(path, atlas_html(atlas))

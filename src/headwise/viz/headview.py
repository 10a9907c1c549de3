"""``headview.html``: one self-contained, offline page showing which tokens each head links (like bertviz's head view).

Shape legend: NL layers, H heads per layer, n tokens, K lines kept per query token.

The page lists the tokens twice, queries on the left and keys on the right, and draws one line from
query i to key j for every selected head, with opacity equal to the weight α_ij (quantised to 1/255;
weights below 1/510 round to 0 and are not drawn) in the head's colour. A selector picks the layer,
check boxes the heads (double-click: that head alone); hovering a token shows only its lines. The
JavaScript (``headview.js``) and the data are inlined: no CDN, no network, it opens straight from disk.

Below it, the **model view** (as bertviz's) shows every layer × head at once, each head a thumbnail of
its map pooled to at most :data:`THUMB` × :data:`THUMB` cells (queries down, keys across; a cell holds
the mean over its query tokens of the attention summed over its key tokens, shaded with a square-root
scale so that faint weights stay visible); a click opens that head alone in the head view. With
``causal=True`` (decoders) the cells of future keys are drawn as masked, so the causal triangle shows;
in the head view a decoder's lines only ever go to the current or earlier tokens.

Drawing is on one ``<canvas>``, with one path per opacity level and head, so that a 512-token view
stays responsive (no SVG node per line). Size: for n ≤ :data:`EXACT_UP_TO` every weight is kept; for
longer texts each query row keeps its :data:`TOP_K` largest weights (the faint rest would be nearly
invisible lines), and the page says the largest attention mass left undrawn.

**Long inputs.** A page whose rows are the bins of a pooled overview (``headwise heads`` past 256 tokens:
128 bins over the whole input) is handed :func:`query_overview`: the bins' token bounds and the command that
drew it. The user then chooses a range of queries on the page (drag or click over the query column, or two
number inputs): the range is highlighted, its pooled rows are drawn enlarged for the selected heads, and the
page shows the command, with ``--queries A:B`` in exact token indices, that writes those rows at full
resolution. ``links`` adds relative links between pages written together (``headview_queries.html``).
Such a page's size does not depend on L: :func:`page_size_bound`.
"""

from __future__ import annotations

import base64
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from headwise._io import write_text_atomic
from headwise.viz._files import inline_page

__all__ = [
    "EXACT_UP_TO",
    "TOP_K",
    "THUMB",
    "PAGE_FIXED_BYTES",
    "thumbnails",
    "page_size_bound",
    "query_overview",
    "headview_payload",
    "render_headview",
    "write_headview",
]

#: Longest text whose every weight is stored.
EXACT_UP_TO = 64
#: Weights kept per query token for longer texts.
TOP_K = 32
#: Cells per side of a model-view thumbnail (at most; a shorter text keeps one cell per token).
THUMB = 32
#: Bytes of a page that do not grow with its heads: the template, the script, the note, the title and subtitle
#: (the subtitle is cut at 600 characters by :func:`headwise.viz.report.write_head_views`), a command line.
PAGE_FIXED_BYTES = 100_000
#: JSON bytes allowed per row label (token) and per head's role label in :func:`page_size_bound`.
LABEL_BYTES = 48


def page_size_bound(rows: int, num_layers: int, num_heads: int) -> int:
    """The most bytes of a page of ``rows`` rows (tokens, or bins of a pooled overview) and NL × H heads.

    Per head: each row's kept lines (K = rows up to :data:`EXACT_UP_TO`, else :data:`TOP_K`) at one byte of
    weight and two of key index, the T × T thumbnail at one byte a cell, all base64 (4/3), and a role label;
    per row a label; plus :data:`PAGE_FIXED_BYTES`. Row and role labels are assumed to take at most
    :data:`LABEL_BYTES` bytes of JSON each (a bin label such as ``"8128–8191"`` takes 12).

    A pooled overview has 128 rows whatever L is: at most 17,798 bytes per head plus 106,144 bytes (4.91 MB
    for 30 × 9 heads); a ``--queries`` page of 512 rows: at most 66,950 bytes per head plus 124,576 bytes.
    """
    k = rows if rows <= EXACT_UP_TO else TOP_K
    t = min(rows, THUMB)
    per_head = math.ceil(4 * (3 * rows * k + t * t) / 3) + LABEL_BYTES
    return num_layers * num_heads * per_head + rows * LABEL_BYTES + PAGE_FIXED_BYTES


_RELATIVE_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def query_overview(
    bounds,
    *,
    command: str,
    max_queries: int,
    queries: tuple[int, int] | None = None,
    note: str = "",
) -> dict:
    """What a pooled page needs to let the user choose queries: the payload's ``overview``.

    Args:
        bounds: ``(P + 1,)`` token bounds of the page's P rows: row p pools queries ``bounds[p] … bounds[p+1] − 1``
            (0 first, strictly increasing; the last is the input's length L).
        command: the command line that wrote the page, without ``--queries``; the page appends
            `` --queries A:B`` for the range chosen.
        max_queries: the most queries one ``--queries`` range may hold (the page clamps a longer range).
        queries: ``(A, B)`` already written at full resolution beside the page (shown first), or None.
        note: a line shown under the command (what a placeholder in it stands for).
    Returns:
        ``{"bounds", "tokens", "command", "max_queries", "queries", "note"}`` (plain JSON types).
    Raises:
        ValueError: bounds not 0 first and strictly increasing, ``max_queries`` < 1, ``queries`` outside them.
    """
    b = [int(x) for x in np.asarray(bounds).ravel()]
    if len(b) < 2 or b[0] != 0 or any(y <= x for x, y in zip(b[:-1], b[1:])):
        raise ValueError(f"bounds: expected token bounds 0 = b0 < b1 < … (P + 1 of them), got {b[:6]}…")
    if int(max_queries) < 1:
        raise ValueError(f"max_queries: expected a positive count, got {max_queries}")
    if queries is not None:
        a, z = (int(x) for x in queries)
        if not 0 <= a < z <= b[-1]:
            raise ValueError(f"queries: expected 0 ≤ A < B ≤ {b[-1]}, got {queries}")
        queries = [a, z]
    return {
        "bounds": b,
        "tokens": b[-1],
        "command": str(command),
        "max_queries": int(max_queries),
        "queries": queries,
        "note": str(note),
    }


def _as_maps(attentions) -> np.ndarray:
    """``(NL, H, n, n)`` float32 maps, checked: a float32 array of that shape as it is (no copy: a 256-token view
    of 30 layers × 9 heads is 71 MB), else the layers stacked; checked a layer at a time (no whole-size masks)."""
    if isinstance(attentions, np.ndarray) and attentions.dtype == np.float32 and attentions.ndim == 4:
        a = attentions
    else:
        a = np.asarray([np.asarray(x, dtype=np.float32).reshape(np.shape(x)[-3:]) for x in attentions])
    if a.ndim != 4 or a.shape[-1] != a.shape[-2] or 0 in a.shape:
        raise ValueError(f"attentions: expected shape (NL, H, n, n), got {a.shape}")
    for layer in a:
        if not np.all(np.isfinite(layer)) or np.any(layer < 0):
            raise ValueError("attentions: expected finite, non-negative weights")
    return a


def thumbnails(maps: np.ndarray, size: int = THUMB) -> tuple[np.ndarray, np.ndarray]:
    """Pool ``(NL, H, n, n)`` maps to ``(NL, H, T, T)``, T = min(n, size).

    Token i falls in bin ``b`` when ``bounds[b] ≤ i < bounds[b + 1]`` (near-equal bins). Cell ``(p, q)``
    is the mean over the query tokens of bin p of their attention summed over the key tokens of bin q,
    so every pooled row still sums to 1.

    Returns:
        ``(pooled (NL, H, T, T) float64, bounds (T + 1,) int)``.
    """
    a = _as_maps(maps)
    n = a.shape[-1]
    t = min(n, size)
    bounds = np.linspace(0, n, t + 1).round().astype(np.int64)  # (T + 1,)
    of = np.searchsorted(bounds, np.arange(n), side="right") - 1  # (n,) bin of each token
    one_hot = np.zeros((n, t))
    one_hot[np.arange(n), of] = 1.0
    rows = one_hot.T / one_hot.sum(axis=0)[:, None]  # (T, n): mean over each query bin
    pooled = np.empty((*a.shape[:2], t, t))
    for i, layer in enumerate(a):  # a layer at a time: (H, n, T) float64 of the key bins, not (NL, H, n, T)
        keys = layer @ one_hot  # (H, n, T): summed over each key bin
        pooled[i] = np.einsum("pn,hnq->hpq", rows, keys)
    return pooled, bounds


def headview_payload(
    attentions,
    tokens: Sequence[str],
    *,
    roles=None,
    title: str = "head view",
    subtitle: str = "",
    causal: bool = False,
    overview: dict | None = None,
    links: Sequence[tuple[str, str]] = (),
) -> dict:
    """The JSON data the page reads: tokens, sizes, and the kept weights as base64 byte arrays.

    Args:
        attentions: ``(NL, H, n, n)`` weights of one sentence (real tokens only), or NL arrays ``(H, n, n)``.
        tokens: the n tokens.
        roles: optional ``(NL, H)`` role labels shown beside the head selectors.
        title, subtitle: page heading (text, never parsed as HTML).
        causal: a decoder's maps: the model view draws future keys as masked.
        overview: the rows are the bins of a pooled overview: :func:`query_overview` (its n + 1 bounds).
        links: ``(file name, text)`` of pages written beside this one (relative file names only).
    Returns:
        A dict: ``n, layers, heads, k, tokens, keys`` (uint16 LE, ``(NL, H, n, K)``), ``weights`` (uint8
        = round(255 · α), same layout), ``roles``, ``title``, ``subtitle``, ``note``, ``dropped`` (the
        largest attention mass of a row not drawn), ``causal``, ``thumb`` (T), ``bins`` (T + 1 bounds, in
        rows, of the thumbnails' cells), ``thumbs`` (uint8 = round(255 · pooled), ``(NL, H, T, T)``, see
        :func:`thumbnails`), ``overview`` (or None) and ``links`` (``[{"href", "text"}]``).
    Raises:
        ValueError: maps not ``(NL, H, n, n)``, a token count other than n, roles of the wrong shape, an
            overview whose bounds are not n + 1, a link that is not a plain file name.
    """
    a = _as_maps(attentions)
    num_layers, num_heads, n, _ = a.shape
    tokens = [str(t) for t in tokens]
    if len(tokens) != n:
        raise ValueError(f"tokens: expected {n} tokens for maps of shape {a.shape}, got {len(tokens)}")
    if roles is not None:
        roles = [[str(r) for r in row] for row in roles]
        if len(roles) != num_layers or any(len(row) != num_heads for row in roles):
            raise ValueError(f"roles: expected ({num_layers}, {num_heads}) labels")
    if overview is not None and len(overview["bounds"]) != n + 1:
        raise ValueError(f"overview: expected {n + 1} bounds for {n} rows, got {len(overview['bounds'])}")
    for href, _ in links:
        if not _RELATIVE_FILE.fullmatch(str(href)):
            raise ValueError(f"links: expected a file name beside the page, got {href!r}")
    k = n if n <= EXACT_UP_TO else TOP_K
    if k == n:
        keys = np.broadcast_to(np.arange(n, dtype=np.uint16), a.shape)  # (NL, H, n, n)
        q = np.clip(np.rint(a * 255.0), 0, 255).astype(np.uint8)  # (NL, H, n, n)
        dropped = 0.0
    else:  # a layer at a time: argpartition's int64 indices of a whole (NL, H, n, n) would be twice the maps
        keys = np.empty((num_layers, num_heads, n, k), np.uint16)  # (NL, H, n, K): the K largest
        q = np.empty((num_layers, num_heads, n, k), np.uint8)
        dropped = 0.0
        for i, layer in enumerate(a):
            top = np.argpartition(-layer, k - 1, axis=-1)[..., :k]  # (H, n, K)
            kept = np.take_along_axis(layer, top, axis=-1)
            keys[i], q[i] = top, np.clip(np.rint(kept * 255.0), 0, 255)
            dropped = max(dropped, float(np.max(layer.sum(-1) - kept.sum(-1))))
    note = (
        f"{n} tokens, {num_layers} layers × {num_heads} heads. Line opacity = attention weight "
        "(quantised to 1/255; weights under 0.002 are not drawn)."
    )
    if k < n:
        note += (
            f" Each token keeps its {k} strongest lines per head; at most {dropped:.1%} of a token's "
            "attention is left undrawn."
        )
    if causal:
        note += " Causal: each token attends only to itself and earlier tokens."
    pooled, bounds = thumbnails(a)
    thumbs = np.clip(np.rint(pooled * 255.0), 0, 255).astype(np.uint8)  # (NL, H, T, T)
    return {
        "causal": bool(causal),
        "thumb": int(pooled.shape[-1]),
        "bins": [int(b) for b in bounds],
        "thumbs": base64.b64encode(np.ascontiguousarray(thumbs).tobytes()).decode("ascii"),
        "n": n,
        "layers": num_layers,
        "heads": num_heads,
        "k": k,
        "tokens": tokens,
        "keys": base64.b64encode(np.ascontiguousarray(keys, dtype="<u2").tobytes()).decode("ascii"),
        "weights": base64.b64encode(np.ascontiguousarray(q).tobytes()).decode("ascii"),
        "roles": roles,
        "title": str(title),
        "subtitle": str(subtitle),
        "note": note,
        "dropped": dropped,
        "overview": overview,
        "links": [{"href": str(href), "text": str(text)} for href, text in links],
    }


def render_headview(payload: dict) -> str:
    """The whole HTML page for a :func:`headview_payload` (template and script inlined)."""
    return inline_page("headview", "HEADVIEW", payload)


def write_headview(
    attentions,
    tokens: Sequence[str],
    path: str | os.PathLike,
    *,
    roles=None,
    title: str = "head view",
    subtitle: str = "",
    causal: bool = False,
    overview: dict | None = None,
    links: Sequence[tuple[str, str]] = (),
) -> Path:
    """Write the self-contained head view of one sentence to ``path`` (atomically).

    Args:
        attentions: ``(NL, H, n, n)`` (or NL arrays ``(H, n, n)``), the sentence's real tokens only.
        tokens: the n tokens.
        path: the ``.html`` file; its folder must exist.
        roles: optional ``(NL, H)`` role labels.
        title, subtitle: page heading.
        causal: a decoder's maps (the model view shows the causal triangle).
        overview: a pooled page's :func:`query_overview` (the in-page choice of queries).
        links: ``(file name, text)`` of pages beside this one.
    Returns:
        ``path``.
    Raises:
        ValueError: see :func:`headview_payload`. OSError: the folder is not writable.
    """
    payload = headview_payload(
        attentions, tokens, roles=roles, title=title, subtitle=subtitle, causal=causal, overview=overview, links=links
    )
    return write_text_atomic(path, render_headview(payload))

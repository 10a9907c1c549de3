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
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import numpy as np

from headwise._io import write_text_atomic

__all__ = ["EXACT_UP_TO", "TOP_K", "THUMB", "thumbnails", "headview_payload", "render_headview", "write_headview"]

#: Longest text whose every weight is stored.
EXACT_UP_TO = 64
#: Weights kept per query token for longer texts.
TOP_K = 32
#: Cells per side of a model-view thumbnail (at most; a shorter text keeps one cell per token).
THUMB = 32


def _as_maps(attentions) -> np.ndarray:
    a = np.asarray([np.asarray(x, dtype=np.float32).reshape(np.shape(x)[-3:]) for x in attentions])
    if a.ndim != 4 or a.shape[-1] != a.shape[-2] or 0 in a.shape:
        raise ValueError(f"attentions: expected shape (NL, H, n, n), got {a.shape}")
    if not np.all(np.isfinite(a)) or np.any(a < 0):
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
    keys = a @ one_hot  # (NL, H, n, T): summed over each key bin
    rows = one_hot.T / one_hot.sum(axis=0)[:, None]  # (T, n): mean over each query bin
    return np.einsum("pn,lhnq->lhpq", rows, keys), bounds


def headview_payload(
    attentions,
    tokens: Sequence[str],
    *,
    roles=None,
    title: str = "head view",
    subtitle: str = "",
    causal: bool = False,
) -> dict:
    """The JSON data the page reads: tokens, sizes, and the kept weights as base64 byte arrays.

    Args:
        attentions: ``(NL, H, n, n)`` weights of one sentence (real tokens only), or NL arrays ``(H, n, n)``.
        tokens: the n tokens.
        roles: optional ``(NL, H)`` role labels shown beside the head selectors.
        title, subtitle: page heading (text, never parsed as HTML).
        causal: a decoder's maps: the model view draws future keys as masked.
    Returns:
        A dict: ``n, layers, heads, k, tokens, keys`` (uint16 LE, ``(NL, H, n, K)``), ``weights`` (uint8
        = round(255 · α), same layout), ``roles``, ``title``, ``subtitle``, ``note``, ``dropped`` (the
        largest attention mass of a row not drawn), ``causal``, ``thumb`` (T), ``bins`` (T + 1 token
        bounds) and ``thumbs`` (uint8 = round(255 · pooled), ``(NL, H, T, T)``, see :func:`thumbnails`).
    Raises:
        ValueError: maps not ``(NL, H, n, n)``, a token count other than n, roles of the wrong shape.
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
    k = n if n <= EXACT_UP_TO else TOP_K
    if k == n:
        keys = np.broadcast_to(np.arange(n, dtype=np.uint16), a.shape)  # (NL, H, n, n)
        kept = a
    else:
        keys = np.argpartition(-a, k - 1, axis=-1)[..., :k].astype(np.uint16)  # (NL, H, n, K): the K largest
        kept = np.take_along_axis(a, keys.astype(np.int64), axis=-1)
    q = np.clip(np.rint(kept * 255.0), 0, 255).astype(np.uint8)  # (NL, H, n, K)
    dropped = float(np.max(a.sum(-1) - kept.sum(-1))) if k < n else 0.0
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
    }


def render_headview(payload: dict) -> str:
    """The whole HTML page for a :func:`headview_payload` (template and script inlined)."""
    package = resources.files("headwise.viz")
    template = (package / "headview.html").read_text(encoding="utf-8")
    script = (package / "headview.js").read_text(encoding="utf-8")
    # JSON inside <script>: no "<" may appear raw (no "</script>", no "<!--"); \u003c is the same string.
    blob = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")
    if "</script" in script.lower():
        raise ValueError("headview.js: the script must not contain '</script'")
    return template.replace("/*__HEADVIEW_DATA__*/", blob).replace("/*__HEADVIEW_JS__*/", script)


def write_headview(
    attentions,
    tokens: Sequence[str],
    path: str | os.PathLike,
    *,
    roles=None,
    title: str = "head view",
    subtitle: str = "",
    causal: bool = False,
) -> Path:
    """Write the self-contained head view of one sentence to ``path`` (atomically).

    Args:
        attentions: ``(NL, H, n, n)`` (or NL arrays ``(H, n, n)``), the sentence's real tokens only.
        tokens: the n tokens.
        path: the ``.html`` file; its folder must exist.
        roles: optional ``(NL, H)`` role labels.
        title, subtitle: page heading.
        causal: a decoder's maps (the model view shows the causal triangle).
    Returns:
        ``path``.
    Raises:
        ValueError: see :func:`headview_payload`. OSError: the folder is not writable.
    """
    payload = headview_payload(attentions, tokens, roles=roles, title=title, subtitle=subtitle, causal=causal)
    return write_text_atomic(path, render_headview(payload))

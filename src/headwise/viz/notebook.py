"""The head view, the model view and a head report inline in Jupyter and VS Code notebooks, offline.

Shape legend: NL layers, H heads per layer, n tokens.

Each view is the same self-contained page that ``headview.html`` is (script, data and styles inlined: no
network resource), shown inside an ``<iframe srcdoc=…>``: the frame gives each view its own document, so
several views in one notebook never share an element id, a style or a script variable, and the page
behaves exactly as it does from disk. The frame is sandboxed to scripts only (no navigation, no forms,
no access to the notebook's page). Objects display themselves (``_repr_html_``), so the last expression
of a cell shows the view; :meth:`HTMLView.save` writes the page as a file.

- :func:`head_view` — the head view with the model view below it (``show="both"``), the head view alone
  (``"head"``) or the model view alone, the head view opening when a thumbnail is clicked (``"model"``).
- :func:`atlas_view` — an atlas (``atlas.json``'s contents): the whole page, or one head's card
  (:func:`headwise.viz.atlas_page.atlas_card_html`).
- :func:`report_view` — a head report (``HeadReport`` / ``DecoderReport``: every head's row) as a table,
  with its role counts.
"""

from __future__ import annotations

import html
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from headwise._io import write_text_atomic
from headwise.viz.atlas_page import atlas_card_html, atlas_html
from headwise.viz.headview import headview_payload, render_headview

__all__ = ["HTMLView", "atlas_view", "head_view", "report_view", "SHOW"]

SHOW = ("both", "head", "model")


class HTMLView:
    """A whole HTML page that a notebook shows in a sandboxed frame of ``height`` pixels."""

    def __init__(self, page: str, *, height: int = 720, title: str = "headwise"):
        if not isinstance(height, int) or height < 100:
            raise ValueError(f"height: expected an integer number of pixels ≥ 100, got {height!r}")
        self.page, self.height, self.title = page, height, title

    def _repr_html_(self) -> str:
        srcdoc = html.escape(self.page, quote=True)
        return (
            f'<iframe title="{html.escape(self.title, quote=True)}" sandbox="allow-scripts" '
            f'style="width: 100%; height: {self.height}px; border: 1px solid #d0d5dd; border-radius: 4px" '
            f'srcdoc="{srcdoc}"></iframe>'
        )

    def save(self, path: str | os.PathLike) -> Path:
        """Write the page to ``path`` (atomically); it opens from disk in any browser."""
        return write_text_atomic(path, self.page)

    def __repr__(self) -> str:
        return f"HTMLView({self.title!r}, {len(self.page):,} characters)"


def head_view(
    attentions,
    tokens: Sequence[str],
    *,
    roles=None,
    title: str = "head view",
    subtitle: str = "",
    causal: bool = False,
    show: str = "both",
    height: int = 720,
) -> HTMLView:
    """The head view (and model view) of one text, for a notebook.

    Args:
        attentions: ``(NL, H, n, n)`` weights of one text (real tokens only), or NL arrays ``(H, n, n)``.
        tokens: the n tokens as text (see :func:`headwise.models.token_text.token_texts`).
        roles: optional ``(NL, H)`` role labels.
        title, subtitle: the heading (text, never parsed as HTML).
        causal: a decoder's maps (the model view draws the causal triangle).
        show: ``"both"``, ``"head"`` or ``"model"``.
        height: the frame's height in pixels.
    Raises:
        ValueError: ``show`` or ``height`` out of range; maps / tokens / roles as
            :func:`headwise.viz.headview.headview_payload` says.
    """
    if show not in SHOW:
        raise ValueError(f"show: expected one of {', '.join(SHOW)}, got {show!r}")
    payload = headview_payload(attentions, tokens, roles=roles, title=title, subtitle=subtitle, causal=causal)
    payload["show"] = show
    return HTMLView(render_headview(payload), height=height, title=title)


def atlas_view(atlas: dict, *, head: str | None = None, height: int = 720) -> HTMLView:
    """An atlas for a notebook: the whole page (grid, filters, cards), or with ``head`` (e.g. ``"L3.H5"``) that
    head's card alone, its partner links opening their cards in the same frame.

    Raises:
        ValueError / TypeError: ``atlas`` or ``head`` as :func:`headwise.viz.atlas_page.atlas_card_html` says;
            ``height`` below 100.
    """
    page = atlas_html(atlas) if head is None else atlas_card_html(atlas, head)
    title = "atlas" if head is None else f"atlas: {head}"
    return HTMLView(page, height=height, title=title)


_REPORT_STYLE = """
body { margin: 0; font: 13px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1d2330; }
h1 { font-size: 15px; margin: 8px 8px 2px; } p { margin: 2px 8px 8px; color: #667085; }
table { border-collapse: collapse; margin: 0 8px 8px; font-variant-numeric: tabular-nums; }
th, td { padding: 2px 8px; border-bottom: 1px solid #eaecf0; text-align: right; }
th { position: sticky; top: 0; background: #fff; border-bottom: 1px solid #d0d5dd; }
td.text, th.text { text-align: left; }
"""


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if value != value else f"{value:.3f}"
    if isinstance(value, (list, tuple)):
        return html.escape(", ".join(str(v) for v in value))
    return html.escape(str(value))


def report_view(report, *, title: str = "heads", height: int = 480) -> HTMLView:
    """A head report as a table, one row per head (the rows of ``heads.csv``), for a notebook.

    Args:
        report: an object with ``rows()`` (a list of dicts with the same keys: ``HeadReport``,
            ``DecoderReport``); the count of each ``role`` is shown above the table.
        title: the heading.
        height: the frame's height in pixels.
    """
    rows = report.rows()
    if not rows:
        raise ValueError("report: it has no heads to show")
    columns = list(rows[0])
    head = "".join(
        f'<th class="{"text" if isinstance(rows[0][c], str) else "num"}">{html.escape(c)}</th>' for c in columns
    )
    body = "".join(
        "<tr>"
        + "".join(f'<td class="{"text" if isinstance(r[c], str) else "num"}">{_cell(r[c])}</td>' for c in columns)
        + "</tr>"
        for r in rows
    )
    roles = Counter(str(r["role"]) for r in rows if "role" in r)
    summary = " · ".join(f"{html.escape(k)}: {v}" for k, v in roles.most_common())
    page = (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>'
        + html.escape(title)
        + "</title><style>"
        + _REPORT_STYLE
        + "</style></head><body><h1>"
        + html.escape(title)
        + f"</h1><p>{len(rows)} heads{' · ' + summary if summary else ''}</p>"
        + f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        + '<script>document.body.dataset.ready = "1";</script></body></html>'
    )
    return HTMLView(page, height=height, title=title)

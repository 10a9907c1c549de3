"""heads.png, roles.png, the head view's data, and the atomic writing of every output."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from headwise import analysis as A
from headwise.viz.heads import plot_head_grid
from headwise.viz.headview import (
    EXACT_UP_TO,
    TOP_K,
    headview_payload,
    page_size_bound,
    query_overview,
    render_headview,
    write_headview,
)
from headwise.viz.report import OUTPUTS, report_csv, report_json, write_heads_outputs
from headwise.viz.roles import plot_role_maps

TOKENS = ["[CLS]", "it", "was", "good", ",", "very", "good", ".", "[SEP]"]


def _maps(rng, layers=2, heads=3, n=9):  # n = len(TOKENS)
    x = rng.normal(size=(layers, heads, n, n)) * 3
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _sentence(rng):
    maps = _maps(rng)
    info = A.token_info([TOKENS])
    stats = A.HeadStats(2, 3, max_length=16)
    stats.update([m[None] for m in maps], info)
    return A.SentenceHeads(stats.result(), list(TOKENS), maps.astype(np.float32))


def _png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_head_grid_and_role_maps(tmp_path):
    s = _sentence(np.random.default_rng(0))
    grid = plot_head_grid(s.attentions, s.tokens, tmp_path / "heads.png", roles=s.report.roles)
    assert _png_size(grid.path) == (grid.width, grid.height)
    one = plot_head_grid(s.attentions, s.tokens, tmp_path / "one.png", layers=[1])
    assert one.height < grid.height * 1.5
    roles = plot_role_maps(s.report, tmp_path / "roles.png", title="t")
    assert _png_size(roles.path) == (roles.width, roles.height)
    with pytest.raises(ValueError, match="layers"):
        plot_head_grid(s.attentions, s.tokens, tmp_path / "x.png", layers=[2])
    with pytest.raises(ValueError, match="tokens"):
        plot_head_grid(s.attentions, s.tokens[:-1], tmp_path / "x.png")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["heads.png", "one.png", "roles.png"]  # no temp files


def _drawn_grid(monkeypatch, tmp_path, **kw):
    """The figure plot_head_grid draws (captured at save), with its renderer."""
    import headwise.viz.heads as heads_module

    drawn = {}
    save = heads_module.save_figure

    def keep(fig, path, **k):
        drawn["fig"] = fig
        return save(fig, path, **k)

    monkeypatch.setattr(heads_module, "save_figure", keep)
    plot_head_grid(path=tmp_path / "heads.png", **kw)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = drawn["fig"]
    return fig, FigureCanvasAgg(fig).get_renderer()


@pytest.mark.parametrize(
    "layers, heads, with_roles",
    [
        (6, 12, True),
        pytest.param(6, 12, False, marks=pytest.mark.slow),
        (1, 4, True),
        pytest.param(12, 12, True, marks=pytest.mark.slow),
    ],
)
def test_the_title_clears_the_first_rows_labels(monkeypatch, tmp_path, layers, heads, with_roles):
    """The figure's title sits above every panel title and every panel, and inside the picture; panel titles
    sit between their panel and the row above, and no two of them meet."""
    rng = np.random.default_rng(1)
    maps = _maps(rng, layers, heads)
    roles = [["[CLS] sink"] * heads] * layers if with_roles else None
    title = "all-MiniLM-L6-v2 (6 layers × 12 heads) — attention of every head on one sentence"
    fig, renderer = _drawn_grid(monkeypatch, tmp_path, attentions=maps, tokens=TOKENS, roles=roles, title=title)
    top = fig.texts[0].get_window_extent(renderer)  # the suptitle
    assert fig.texts[0].get_text() == title
    assert top.y1 <= fig.bbox.y1, "the title is cut at the top"
    ax = fig.axes[0]  # every panel in one image; the last axes is the colour bar
    titles = ax.texts
    assert [t.get_text().split("\n")[0] for t in titles] == [f"L{r} H{h}" for r in range(layers) for h in range(heads)]
    boxes = [t.get_window_extent(renderer) for t in titles]
    assert max(b.y1 for b in boxes) < top.y0
    assert top.y0 - max(b.y1 for b in boxes) > 0.03 * fig.dpi  # a visible gap, not touching
    for i, a in enumerate(boxes):
        assert a.x0 >= 0 and a.x1 <= fig.bbox.x1
        for b in boxes[i + 1 :]:
            assert not a.overlaps(b), "two panel titles meet"
    # each panel (where its map is drawn) lies below its own title and above the next row's titles
    image = ax.images[0].get_array()  # (rows, cols, 4) RGBA bytes; gaps are white
    to_display = ax.transData.transform
    n = len(TOKENS)
    for k, box in enumerate(boxes):
        r = k // heads
        filled = np.flatnonzero((image[:, :, :3] != 255).any(-1).any(-1))  # image rows holding a panel
        rows_of_r = filled[r * n : (r + 1) * n]
        y_top = to_display((0, rows_of_r[0] - 0.5))[1]
        y_bottom = to_display((0, rows_of_r[-1] + 0.5))[1]
        assert box.y0 >= y_top - 0.5, titles[k].get_text()  # the title is above its panel
        if r + 1 < layers:
            assert boxes[(r + 1) * heads].y1 < y_bottom  # the next row's titles are below this panel


def test_the_grid_draws_every_map_where_its_title_says(monkeypatch, tmp_path):
    """The one image holds each head's map, coloured on [0, 1], under the title naming it."""
    rng = np.random.default_rng(4)
    maps = _maps(rng, 3, 4)
    fig, renderer = _drawn_grid(monkeypatch, tmp_path, attentions=maps, tokens=TOKENS)
    ax = fig.axes[0]
    image = ax.images[0].get_array()  # (rows, cols, 4)
    from matplotlib import colormaps

    want = colormaps["viridis"](maps, bytes=True)  # (NL, H, n, n, 4)
    inv = ax.transData.inverted()
    n = len(TOKENS)
    for t in ax.texts:
        layer, head = (int(x[1:]) for x in t.get_text().split())
        box = t.get_window_extent(renderer)
        col, row = inv.transform(((box.x0 + box.x1) / 2, box.y0))  # under the title's centre
        c0 = int(round(col - (n - 1) / 2))
        r0 = int(np.ceil(row))
        r0 += int(np.argmax((image[r0:, c0, :3] != 255).any(-1)))  # the first row of the panel below
        np.testing.assert_array_equal(image[r0 : r0 + n, c0 : c0 + n], want[layer, head])


def test_the_overlap_check_can_fail(monkeypatch, tmp_path):
    """Moved onto the panels, a title is caught by the geometry the test above reads."""
    fig, renderer = _drawn_grid(monkeypatch, tmp_path, attentions=_maps(np.random.default_rng(2)), tokens=TOKENS)
    fig.suptitle("over the panels", y=0.5)
    top = fig.texts[0].get_window_extent(renderer)
    assert max(t.get_window_extent(renderer).y1 for t in fig.axes[0].texts) >= top.y0


def _decode(payload):
    layers, heads, n, k = payload["layers"], payload["heads"], payload["n"], payload["k"]
    keys = np.frombuffer(base64.b64decode(payload["keys"]), dtype="<u2").reshape(layers, heads, n, k)
    weights = np.frombuffer(base64.b64decode(payload["weights"]), dtype=np.uint8).reshape(layers, heads, n, k)
    dense = np.zeros((layers, heads, n, n))
    np.put_along_axis(dense, keys.astype(np.int64), weights / 255.0, axis=-1)
    return dense


def test_headview_payload_round_trips_the_weights():
    maps = _maps(np.random.default_rng(1))
    payload = headview_payload(maps, TOKENS, roles=[["a", "b", "c"], ["d", "e", "f"]])
    assert payload["k"] == len(TOKENS) and payload["dropped"] == 0.0
    np.testing.assert_allclose(_decode(payload), maps, atol=0.5 / 255 + 1e-7)  # quantised to 1/255


def test_headview_keeps_the_largest_weights_of_long_texts():
    n = EXACT_UP_TO + 16
    maps = _maps(np.random.default_rng(2), 1, 2, n)
    payload = headview_payload(maps, [str(i) for i in range(n)])
    assert payload["k"] == TOP_K
    dense = _decode(payload)
    kth = np.sort(maps, axis=-1)[..., -TOP_K][..., None]  # (1, 2, n, 1): the K-th largest weight of each row
    kept = maps >= kth
    np.testing.assert_allclose(dense[kept], maps[kept], atol=0.5 / 255 + 1e-7)
    assert np.all(dense[~kept] == 0)
    assert payload["dropped"] == pytest.approx(np.max(1 - np.where(kept, maps, 0).sum(-1)), abs=1e-5)


def test_headview_is_self_contained_and_escapes_text(tmp_path):
    maps = _maps(np.random.default_rng(3), 1, 2, 4)
    path = write_headview(maps, ["</script>", "<!--", "&amp;", "é"], tmp_path / "v.html", title="<b>t</b>")
    html = path.read_text(encoding="utf-8")
    assert html.count("</script>") == 2  # the data block's and the script's own closing tags only
    assert "<b>t</b>" not in html and "\\u003cb>t\\u003c/b>" in html
    for remote in ("http://", "https://", "src=", "<link"):
        assert remote not in html
    data = html.split('id="headview-data">', 1)[1].split("</script>", 1)[0]
    assert json.loads(data)["tokens"] == ["</script>", "<!--", "&amp;", "é"]
    assert "__HEADVIEW" not in render_headview(headview_payload(maps, ["a", "b", "c", "d"]))


def _causal_uniform(layers: int, heads: int, n: int) -> np.ndarray:
    """Every head uniform over the prefix (the densest causal maps the top-K lines can meet)."""
    row = np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]
    return np.broadcast_to(row, (layers, heads, n, n)).astype(np.float32)


def test_query_overview_checks_its_bounds_and_queries():
    bounds = np.linspace(0, 8192, 129).round().astype(int)
    ov = query_overview(bounds, command="headwise heads --model m TEXT", max_queries=512, queries=(4000, 4100))
    assert ov["tokens"] == 8192 and ov["bounds"][:3] == [0, 64, 128] and ov["queries"] == [4000, 4100]
    json.dumps(ov)  # plain JSON types
    for bad in ([1, 5, 9], [0, 5, 5, 9], [0]):
        with pytest.raises(ValueError, match="bounds"):
            query_overview(bad, command="c", max_queries=512)
    with pytest.raises(ValueError, match="queries"):
        query_overview(bounds, command="c", max_queries=512, queries=(8000, 8193))
    with pytest.raises(ValueError, match="max_queries"):
        query_overview(bounds, command="c", max_queries=0)
    maps = _causal_uniform(1, 2, 128)
    with pytest.raises(ValueError, match="overview: expected 65 bounds for 64 rows, got 129"):
        headview_payload(maps[..., :64, :64], [str(i) for i in range(64)], overview=ov)
    for href in ("../x.html", "/tmp/x.html", "https://example.com/x.html", "a/b.html", ""):
        with pytest.raises(ValueError, match="links"):
            headview_payload(maps, [str(i) for i in range(128)], links=[(href, "x")])


@pytest.mark.parametrize(("rows", "layers", "heads"), [(128, 1, 1), (128, 3, 5), (100, 2, 4), (40, 2, 3)])
def test_page_size_bound_holds(rows, layers, heads):
    """The stated bound against real pages: bin labels as the CLI writes them, roles, an overview and a link."""
    n = 8192 if rows == 128 else rows
    bounds = np.linspace(0, n, rows + 1).round().astype(int)
    labels = [f"{a}–{b - 1}" for a, b in zip(bounds[:-1], bounds[1:])]
    ov = query_overview(bounds, command="headwise heads --model ./model TEXT --out ./out", max_queries=512)
    html = render_headview(
        headview_payload(
            _causal_uniform(layers, heads, rows),
            labels,
            roles=[["previous-token"] * heads] * layers,
            title="a decoder head view",
            subtitle=" ".join(labels)[:600],
            causal=True,
            overview=ov,
            links=[("headview_queries.html", "queries 4000–4099 at full resolution")],
        )
    )
    size = len(html.encode("utf-8"))
    assert size <= page_size_bound(rows, layers, heads)


def test_write_heads_outputs_writes_every_file_atomically(tmp_path):
    s = _sentence(np.random.default_rng(4))
    out = tmp_path / "out"
    paths = write_heads_outputs(s, s.report, out, title="tiny", extra={"model": "tiny"})
    assert list(paths) == list(OUTPUTS)
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUTS)  # nothing half-written left
    data = json.loads((out / "heads.json").read_text())
    assert data["model"] == "tiny" and data["num_layers"] == 2 and len(data["heads"]) == 6
    assert data["heads"][4]["prev"] == pytest.approx(float(s.report.metrics["prev"][1, 1]))
    assert len(data["js_distance"]) == 6
    lines = (out / "heads.csv").read_text().splitlines()
    assert lines[0].startswith("layer,head,cls,sep,punct") and len(lines) == 7
    assert report_csv(s.report) == (out / "heads.csv").read_text()
    assert json.loads(report_json(s.report))["num_heads"] == 3


def test_a_failed_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    from headwise import _io

    def boom(*args, **kwargs):
        raise OSError(28, "No space left on device")

    (tmp_path / "heads.json").write_text("old")
    monkeypatch.setattr(_io.os, "replace", boom)
    with pytest.raises(OSError, match="No space"):
        _io.write_text_atomic(tmp_path / "heads.json", "new")
    assert [p.name for p in tmp_path.iterdir()] == ["heads.json"]
    assert (tmp_path / "heads.json").read_text() == "old"


@pytest.mark.slow  # the fast suite keeps a lighter test of the same path
def test_concurrent_drawing_writes_the_same_files_and_survives_a_failed_child(tmp_path, monkeypatch):
    """``concurrent=True`` (heads.png from a forked child) writes byte for byte what the sequential call writes; a
    child that fails leaves heads.png to the parent."""
    import os

    import headwise.viz.heads as heads_module

    s = _sentence(np.random.default_rng(5))
    one, two, three = (tmp_path / d for d in ("one", "two", "three"))
    for d in (one, two, three):
        d.mkdir()
    from headwise.viz.report import write_head_views

    write_head_views(s, one, title="t")
    write_head_views(s, two, title="t", concurrent=True)
    parent = os.getpid()
    draw = heads_module.plot_head_grid

    def fails_in_a_child(*a, **k):
        if os.getpid() != parent:
            raise RuntimeError("the child cannot draw")
        return draw(*a, **k)

    monkeypatch.setattr(heads_module, "plot_head_grid", fails_in_a_child)
    paths = write_head_views(s, three, title="t", concurrent=True)
    assert list(paths) == ["heads.png", "roles.png", "headview.html"]
    for name in paths:
        assert (two / name).read_bytes() == (one / name).read_bytes() == (three / name).read_bytes(), name
    assert sorted(p.name for p in three.iterdir()) == sorted(paths)  # nothing half-written left


def test_an_interrupt_while_the_child_draws_stops_it_and_leaves_nothing(tmp_path, monkeypatch):
    """Ctrl-C in the parent during concurrent drawing: the child is interrupted too and reaped, and neither its
    picture nor a temporary file is left."""
    import time

    import headwise.viz.heads as heads_module
    import headwise.viz.roles as roles_module
    from headwise.viz.report import write_head_views

    s = _sentence(np.random.default_rng(6))
    draw = heads_module.plot_head_grid

    def slow(*a, **k):
        time.sleep(30)  # interrupted long before
        return draw(*a, **k)

    def interrupt(*a, **k):
        time.sleep(0.5)  # the child is asleep in `slow` by now
        raise KeyboardInterrupt

    monkeypatch.setattr(heads_module, "plot_head_grid", slow)
    monkeypatch.setattr(roles_module, "plot_role_maps", interrupt)
    start = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        write_head_views(s, tmp_path, title="t", concurrent=True)
    assert time.perf_counter() - start < 10  # the child was interrupted and reaped, not waited out
    assert list(tmp_path.iterdir()) == []


def _interrupted_mid_write(tmp_path, monkeypatch, *, child_ignores_sigterm: bool) -> float:
    """Draw concurrently with SIGINT ignored (as a ``nohup … &`` job starts): the child opens heads.png's temporary
    and sleeps inside the write; once that temporary exists the parent is interrupted. Returns the seconds taken."""
    import signal
    import time

    import headwise.viz.heads as heads_module
    import headwise.viz.roles as roles_module
    from headwise._io import atomic_write
    from headwise.viz.report import write_head_views

    s = _sentence(np.random.default_rng(7))

    def sleeps_mid_write(attentions, tokens, path, **k):
        if child_ignores_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with atomic_write(path, "wb"):
            time.sleep(30)  # stopped long before

    def interrupt(*a, **k):
        deadline = time.monotonic() + 10
        while not any(tmp_path.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [p.name.startswith(".heads.png.") for p in tmp_path.iterdir()] == [True]  # the child's temporary
        raise KeyboardInterrupt

    monkeypatch.setattr(heads_module, "plot_head_grid", sleeps_mid_write)
    monkeypatch.setattr(roles_module, "plot_role_maps", interrupt)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # the child inherits it
    start = time.perf_counter()
    try:
        with pytest.raises(KeyboardInterrupt):
            write_head_views(s, tmp_path, title="t", concurrent=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    return time.perf_counter() - start


def test_a_child_started_with_sigint_ignored_is_stopped_mid_write_and_leaves_no_temporary(tmp_path, monkeypatch):
    assert _interrupted_mid_write(tmp_path, monkeypatch, child_ignores_sigterm=False) < 10
    assert list(tmp_path.iterdir()) == []


def test_a_child_that_ignores_sigterm_is_killed_and_its_temporary_removed(tmp_path, monkeypatch):
    import headwise.viz.report as report

    monkeypatch.setattr(report, "STOP_GRACE_S", 0.2)
    assert _interrupted_mid_write(tmp_path, monkeypatch, child_ignores_sigterm=True) < 10
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # the fast suite keeps a lighter test of the same path
def test_a_child_killed_mid_write_leaves_no_temporary_and_the_parent_draws(tmp_path, monkeypatch):
    import os
    import signal

    import headwise.viz.heads as heads_module
    from headwise._io import atomic_write
    from headwise.viz.report import write_head_views

    s = _sentence(np.random.default_rng(8))
    parent, draw = os.getpid(), heads_module.plot_head_grid

    def killed_in_a_child(attentions, tokens, path, **k):
        if os.getpid() != parent:
            with atomic_write(path, "wb"):
                os.kill(os.getpid(), signal.SIGKILL)
        return draw(attentions, tokens, path, **k)

    monkeypatch.setattr(heads_module, "plot_head_grid", killed_in_a_child)
    paths = write_head_views(s, tmp_path, title="t", concurrent=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(paths)  # drawn here, no temporary left

"""The attention and positional-encoding heatmaps: valid files of the stated size, atomic writes, bad input."""

from __future__ import annotations

import numpy as np
import pytest

from _pictures import assert_not_blank, read_png
from headwise.reference import sinusoidal_table
from headwise.viz._files import save_figure
from headwise.viz.attention import attention_layout, plot_attention_heads
from headwise.viz.positional import plot_positional_encoding

TOKENS = ["the", "cat", "sat", "on", "the", "mat"]


def _weights(heads: int, n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).dirichlet(np.ones(n), size=(heads, n))  # (H, L, L), rows sum to 1


def _leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_attention_png_has_the_stated_size_and_content(tmp_path):
    picture = plot_attention_heads(_weights(4, 6), TOKENS, tmp_path / "attention.png", title="t")
    image = read_png(tmp_path / "attention.png")
    assert image.shape[:2] == (picture.height, picture.width)
    rows, cols, panel = attention_layout(4, 6)
    assert (rows, cols) == (1, 4)
    assert picture.width == round((cols * panel + 1.0) * 100)  # four panels side by side + the colour bar
    assert_not_blank(image)
    assert _leftovers(tmp_path) == []  # no temporary file left behind


@pytest.mark.slow  # the fast suite keeps the attention picture's size and content test
def test_more_heads_wrap_into_rows(tmp_path):
    tokens = ["a", "b", "c"]
    four = plot_attention_heads(_weights(4, 3), tokens, tmp_path / "four.png", dpi=40)
    five = plot_attention_heads(_weights(5, 3), tokens, tmp_path / "five.png", dpi=40)
    assert attention_layout(5, 3)[:2] == (2, 4)
    assert five.width == four.width and five.height > 1.8 * four.height
    assert read_png(tmp_path / "five.png").shape[:2] == (five.height, five.width)


def test_different_weights_draw_different_pictures(tmp_path):
    plot_attention_heads(_weights(2, 6, seed=1), TOKENS, tmp_path / "a.png", dpi=40)
    plot_attention_heads(_weights(2, 6, seed=2), TOKENS, tmp_path / "b.png", dpi=40)
    a, b = read_png(tmp_path / "a.png"), read_png(tmp_path / "b.png")
    assert a.shape == b.shape and np.abs(a - b).max() > 0.1


def test_single_head_and_cross_attention_labels(tmp_path):
    w = np.full((3, 2), 0.5)  # (L=3 queries, S=2 keys)
    picture = plot_attention_heads(w, ["a", "b", "c"], tmp_path / "one.png", key_tokens=["x", "y"], dpi=40)
    assert read_png(tmp_path / "one.png").shape[:2] == (picture.height, picture.width)


def test_svg_output(tmp_path):
    plot_attention_heads(_weights(2, 3), ["a", "b", "c"], tmp_path / "w.svg")
    assert b"<svg" in (tmp_path / "w.svg").read_bytes()[:2000]


@pytest.mark.parametrize(
    "weights, tokens, kwargs, words",
    [
        (np.ones((2, 3, 3)) / 3, ["a", "b"], {}, "tokens"),
        (np.ones((2, 3, 3)) / 3, ["a", "b", "c"], {"key_tokens": ["x"]}, "key_tokens"),
        (np.ones((2, 3, 3)) / 3, ["a", "b", "c"], {"head_labels": ["h"]}, "head_labels"),
        (np.ones((2, 2, 3, 3)), ["a", "b", "c"], {}, "weights"),
        (np.full((1, 3, 3), np.nan), ["a", "b", "c"], {}, "weights"),
    ],
)
def test_attention_bad_input(tmp_path, weights, tokens, kwargs, words):
    with pytest.raises(ValueError, match=words):
        plot_attention_heads(weights, tokens, tmp_path / "x.png", **kwargs)
    assert list(tmp_path.iterdir()) == []


def test_unsupported_suffix(tmp_path):
    with pytest.raises(ValueError, match=r"\.png"):
        plot_attention_heads(_weights(1, 3), ["a", "b", "c"], tmp_path / "x.jpg")


def test_missing_folder_leaves_nothing(tmp_path):
    with pytest.raises(FileNotFoundError):
        plot_attention_heads(_weights(1, 3), ["a", "b", "c"], tmp_path / "nope" / "x.png")
    assert list(tmp_path.iterdir()) == []


def test_pe_png_size_and_content(tmp_path):
    picture = plot_positional_encoding(sinusoidal_table(50, 64), tmp_path / "pe.png")
    image = read_png(tmp_path / "pe.png")
    assert image.shape[:2] == (500, 800) == (picture.height, picture.width)  # figsize (8, 5) at 100 dpi
    assert_not_blank(image)
    # The sinusoidal table uses the full diverging scale: strong reds (+1) and strong blues (−1).
    rgb = image[..., :3]
    assert ((rgb[..., 0] > 0.6) & (rgb[..., 2] < 0.3)).sum() > 1000
    assert ((rgb[..., 2] > 0.6) & (rgb[..., 0] < 0.3)).sum() > 1000


def test_pe_bad_input(tmp_path):
    with pytest.raises(ValueError, match="table"):
        plot_positional_encoding(np.zeros(5), tmp_path / "pe.png")
    with pytest.raises(ValueError, match="table"):
        plot_positional_encoding(np.full((2, 2), np.inf), tmp_path / "pe.png")


class _FailingFigure:
    """A figure whose save writes half a file and then breaks."""

    def savefig(self, fh, **kwargs):
        fh.write(b"\x89PNG half")
        raise RuntimeError("disk full")


def test_a_failed_write_keeps_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "attention.png"
    target.write_bytes(b"old picture")
    with pytest.raises(RuntimeError, match="disk full"):
        save_figure(_FailingFigure(), target, dpi=100)
    assert target.read_bytes() == b"old picture"
    assert [p.name for p in tmp_path.iterdir()] == ["attention.png"]


def test_a_rewrite_replaces_the_file(tmp_path):
    target = tmp_path / "pe.png"
    target.write_bytes(b"old picture")
    plot_positional_encoding(sinusoidal_table(10, 8), target, dpi=40)
    read_png(target)
    assert _leftovers(tmp_path) == []

"""``qk.png``: the shown parts add up to the whole matrix, and the picture is written with the size it says."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headwise.viz.qk import plot_qk, shown_parts

pytest.importorskip("matplotlib")


def test_shown_parts_keep_the_largest_and_sum_the_rest():
    rng = np.random.default_rng(0)
    t = rng.normal(size=(9, 7))
    t[4] *= 20  # a dominant query part
    t[:, 2] *= 20  # a dominant key part
    m, qa, kb = shown_parts(t, 3)
    assert 4 in qa and 2 in kb and m.shape == (4, 4)
    assert m.sum() == pytest.approx(t.sum())
    np.testing.assert_allclose(m[:3, :3], t[np.ix_(qa, kb)])
    rest_a = [a for a in range(9) if a not in qa]
    np.testing.assert_allclose(m[3, :3], t[np.ix_(rest_a, kb)].sum(0))
    m_all, qa_all, kb_all = shown_parts(t, 20)  # nothing left: no rest row or column
    np.testing.assert_allclose(m_all, t)
    with pytest.raises(ValueError, match="top"):
        shown_parts(t, 0)


def test_the_picture_is_written(tmp_path):
    pytest.importorskip("transformers")
    from _patching_models import hf_model
    from headwise.circuits import qk_attribution

    ids = torch.randint(3, 90, (12,), generator=torch.Generator().manual_seed(0))
    r = qk_attribution(hf_model("gemma2"), ids, 1, 0, 11)
    out = plot_qk(r, tmp_path / "qk.png", top=4, title="t")
    from PIL import Image

    with Image.open(out.path) as image:
        assert image.size == (out.width, out.height)

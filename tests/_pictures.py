"""Reading back the pictures headwise writes (PNG signature, decoded size, real content)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def read_png(path: Path) -> np.ndarray:
    """Decode ``path`` as a PNG (``(height, width, 3 or 4)`` floats in [0, 1]), after checking its signature."""
    import matplotlib.image as mpimg

    data = Path(path).read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG file"
    image = mpimg.imread(path, format="png")
    assert image.ndim == 3 and image.shape[2] in (3, 4)
    return image


def assert_not_blank(image: np.ndarray) -> None:
    """The picture has real content: many distinct colours, not one flat fill."""
    rgb = image[..., :3].reshape(-1, 3)
    assert rgb.std(axis=0).max() > 0.05
    assert len(np.unique(np.round(rgb, 2), axis=0)) > 20

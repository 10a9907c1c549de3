"""The reference's one mask convention: bool True = may not attend, float = added to the scores."""

from __future__ import annotations

import numpy as np


def split_mask(mask):
    """A user mask as ``(blocked bool or None, bias float or None)``.

    Raises:
        TypeError: a mask that is neither bool nor floating point.
    """
    if mask is None:
        return None, None
    mask = np.asarray(mask)
    if mask.dtype == np.bool_:
        return mask, None
    if np.issubdtype(mask.dtype, np.floating):
        return None, mask
    raise TypeError(f"mask: expected a bool or float array, got dtype {mask.dtype}")

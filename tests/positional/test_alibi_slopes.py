"""The core's ALiBi slopes (torch) equal the NumPy reference's, and both follow the paper's rule.

The two are computed independently: the core as ``2^(-8h/n)`` per head, the reference as the paper's
code does it (``start * start**i``, whose rounding grows with the head index: up to 7e-15 relative at
H = 128, 5.6e-16 absolute). Hence the parity is held to 1e-15 absolute; the core alone is held to
one ulp of the exact value (torch's ``pow`` is faithfully, not always correctly, rounded).
"""

import math

import numpy as np
import pytest
import torch

import headwise.reference as ref
from headwise.positional import ALiBi, alibi_slopes


@pytest.mark.parametrize("num_heads", range(1, 129))
def test_torch_slopes_equal_the_reference(num_heads):
    ours = alibi_slopes(num_heads)
    assert ours.dtype == torch.float64 and ours.shape == (num_heads,)
    np.testing.assert_allclose(ours.numpy(), ref.alibi_slopes(num_heads), rtol=0, atol=1e-15)


@pytest.mark.parametrize("num_heads", [1, 3, 8, 12, 40, 80, 96, 128])
def test_torch_slopes_are_within_one_ulp_of_exact(num_heads):
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.prec = 200
    n = 2 ** int(math.log2(num_heads))
    exponents = [mpmath.mpf(8 * h) / n for h in range(1, n + 1)]
    exponents += [mpmath.mpf(8 * h) / (2 * n) for h in range(1, 2 * n + 1, 2)][: num_heads - n]
    for got, e in zip(alibi_slopes(num_heads).tolist(), exponents):
        exact = mpmath.power(2, -e)
        assert abs(mpmath.mpf(got) - exact) <= np.spacing(got), (num_heads, got)


@pytest.mark.parametrize("num_heads", [1, 2, 3, 5, 6, 7, 12, 16, 20, 24, 40, 48, 64, 71, 80, 96, 112])
def test_slopes_follow_the_papers_rule(num_heads):
    """Written out independently: 2^(-8h/n) for the largest power of two n ≤ H, then the odd-numbered
    slopes of 2n for the heads left over (Press et al. 2022's code)."""
    n = 2 ** int(math.log2(num_heads))
    expected = [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]
    expected += [2.0 ** (-8.0 * h / (2 * n)) for h in range(1, 2 * n + 1, 2)][: num_heads - n]
    np.testing.assert_allclose(alibi_slopes(num_heads).numpy(), expected, rtol=1e-15, atol=0)


def test_the_part_serves_the_same_slopes_in_any_dtype():
    part = ALiBi(12).to(torch.bfloat16)
    assert part.slopes.dtype == torch.float64
    np.testing.assert_array_equal(part.slopes.numpy(), alibi_slopes(12).numpy())

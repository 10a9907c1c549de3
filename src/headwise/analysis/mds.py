"""Classical multidimensional scaling (Torgerson 1952): points in the plane whose distances match a matrix.

Clark et al. 2019 (§6, Figure 6) map BERT's heads to two dimensions from their Jensen–Shannon
distances with (metric, SMACOF) MDS from scikit-learn; headwise uses the classical closed form with
NumPy alone: double-centre the squared distances, ``G = −½ J D² J`` with ``J = I − 11ᵀ/N``, and take
the top eigenvectors of G scaled by the square roots of their eigenvalues. For distances that are
exactly Euclidean in ``dims`` dimensions it recovers the points up to a rotation, reflection and shift.
"""

from __future__ import annotations

import numpy as np

from headwise import checks

__all__ = ["classical_mds"]


def classical_mds(distances, dims: int = 2) -> np.ndarray:
    """Embed N items in ``dims`` dimensions from their ``(N, N)`` distance matrix.

    Args:
        distances: ``(N, N)`` symmetric, non-negative, zero diagonal.
        dims: output dimensions (2 for a map).
    Returns:
        ``(N, dims)`` coordinates, centred at 0, ordered by decreasing eigenvalue; each axis's sign is
        fixed so that its largest-magnitude coordinate is positive (deterministic output). Axes whose
        eigenvalue is not positive are 0.
    Raises:
        ValueError: a matrix that is not square, symmetric, finite and non-negative; ``dims`` < 1.
    """
    d = np.asarray(distances, dtype=np.float64)
    if d.ndim != 2 or d.shape[0] != d.shape[1]:
        raise ValueError(f"distances: expected a square (N, N) matrix, got shape {d.shape}")
    checks.positive_int("dims", dims)
    if not np.all(np.isfinite(d)) or np.any(d < 0) or not np.allclose(d, d.T, atol=1e-9):
        raise ValueError("distances: expected a finite, non-negative, symmetric matrix")
    n = d.shape[0]
    j = np.eye(n) - np.full((n, n), 1.0 / n)
    g = -0.5 * j @ (d**2) @ j  # (N, N) Gram matrix of centred points
    vals, vecs = np.linalg.eigh(0.5 * (g + g.T))
    order = np.argsort(vals)[::-1][:dims]
    vals, vecs = vals[order], vecs[:, order]
    coords = vecs * np.sqrt(np.clip(vals, 0.0, None))[None, :]  # (N, dims)
    if coords.shape[1] < dims:
        coords = np.pad(coords, ((0, 0), (0, dims - coords.shape[1])))
    for k in range(dims):
        col = coords[:, k]
        if col.size and col[np.argmax(np.abs(col))] < 0:
            coords[:, k] = -col
    return coords

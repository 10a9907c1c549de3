"""Test helpers: headwise modules as NumPy reference parameters; the tolerance between two float32 routes."""

import math

import numpy as np

EPS32 = float(np.finfo(np.float32).eps)  # 2⁻²³ ≈ 1.19e-7


def float32_tol(terms: int, *, stages: int = 1, scale: float = 1.0) -> float:
    """The tolerance between two float32 routes of the same maths that differ only in the order of their sums —
    another kernel, another CPU's blocking (AVX2 against AVX-512), a model run whole or layer by layer.

    A float32 sum of ``terms`` numbers is off by about ε·√terms of their magnitude: each addition rounds by at most
    ε/2 of its partial sum, and the roundings, of either sign, add as a random walk (blocked and pairwise sums, as
    every kernel here does them, stay near √terms, far from the worst case ε·terms). ``stages`` sums in a row (a
    model's layers) add theirs; ``scale`` is the terms' magnitude where it is not about 1 (the round-off is
    relative to the terms, not to the result, so a difference of two large numbers keeps theirs); a factor 4
    leaves room for an unlucky draw. Never below 1e-6: the floor of a comparison of float32 outputs.
    """
    return max(1e-6, 4 * EPS32 * math.sqrt(terms) * stages * scale)


def ref_params(m):
    """A headwise MultiHeadAttention's weights in the reference's ``x @ w + b`` convention."""
    out = {}
    for name, lin in (("q", m.Wq), ("k", m.Wk), ("v", m.Wv), ("o", m.Wo)):
        out[f"w{name}"] = lin.weight.detach().double().numpy().T
        if lin.bias is not None:
            out[f"b{name}"] = lin.bias.detach().double().numpy()
    return out


def np64(t):
    return t.detach().double().numpy()


# bf16 against the float64 reference, measured at (2, 128, 256, 4), default init, x ~ N(0, 1): ‖err‖/‖ref‖ = 3.3e-3,
# max|err|/max|ref| = 5.1e-3 (bf16 keeps 8 significant bits: 2⁻⁹ ≈ 2e-3 per rounding). The bounds leave a factor
# of about 3.
BF16_REL_FRO = 1e-2
BF16_REL_MAX = 2e-2


def assert_bf16_bounded(mode):
    """A bf16 ``MultiHeadAttention`` (``mode="bf16-module"``) or a float32 one under bf16 autocast
    (``"autocast"``) against the float64 NumPy reference: errors within the bf16 bounds above, and not zero."""
    import torch

    import headwise
    import headwise.reference as ref

    torch.manual_seed(0)
    B, L, D, H = 2, 128, 256, 4
    m64 = headwise.MultiHeadAttention(D, H).double().eval()
    x = torch.randn(B, L, D, dtype=torch.float64)
    want, _ = ref.multi_head_attention(np64(x), ref_params(m64), H)
    with torch.no_grad():
        if mode == "bf16-module":
            m = headwise.MultiHeadAttention(D, H, dtype=torch.bfloat16).eval()
            m.load_state_dict(m64.state_dict())
            out, _ = m(x.bfloat16())
        else:
            m = headwise.MultiHeadAttention(D, H).eval()
            m.load_state_dict(m64.state_dict())
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out, _ = m(x.float())
    assert out.dtype == torch.bfloat16
    err = np64(out) - want
    assert np.linalg.norm(err) / np.linalg.norm(want) < BF16_REL_FRO
    assert np.abs(err).max() / np.abs(want).max() < BF16_REL_MAX
    assert np.abs(err).max() > 0  # it is bf16 arithmetic, not float64 in disguise


def logits_scale(report: dict) -> float:
    """The logits' magnitude behind a patching report's metrics (each a difference of two logits), taken as twice
    the largest metric: the scale of their round-off (``float32_tol``)."""
    return 2 * float(np.abs([report["metric_clean"], report["metric_corrupted"], *np.ravel(report["patched"])]).max())


def assert_normalised(report: dict) -> None:
    """A patching report's ``normalised = (patched - corrupted) / (clean - corrupted)`` is its own ``patched``
    metrics normalised, within the file's six decimals carried through the quotient. (Compared between two routes
    it would not say much: where clean and corrupted are close, the quotient multiplies their round-off.)"""
    clean, corrupted = report["metric_clean"], report["metric_corrupted"]
    want = (np.asarray(report["patched"], np.float64) - corrupted) / (clean - corrupted)
    rounding = 5e-7 * (2 + 2 * np.abs(want)) / abs(clean - corrupted) + 5e-7
    assert (np.abs(np.asarray(report["normalised"], np.float64) - want) <= rounding).all()


__all__ = [
    "EPS32",
    "assert_bf16_bounded",
    "assert_normalised",
    "float32_tol",
    "logits_scale",
    "np",
    "np64",
    "ref_params",
]


def all_meta(hm) -> bool:
    """Every parameter of a model read layer by layer back on the meta device (nothing of its weights kept)."""
    return all(p.device.type == "meta" for p in hm.model.parameters())

"""Test helpers: headwise modules as NumPy reference parameters."""

import numpy as np


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


__all__ = ["ref_params", "np64", "np", "assert_bf16_bounded"]

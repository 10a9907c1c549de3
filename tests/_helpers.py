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


__all__ = ["ref_params", "np64", "np"]

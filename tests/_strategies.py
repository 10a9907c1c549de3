"""Hypothesis strategies shared by the property suite: shapes, head counts, masks, positions."""

import torch
from hypothesis import strategies as st

import headwise

POSITIONAL = ["none", "rope-half", "rope-interleaved", "alibi"]


@st.composite
def attention_configs(draw, positional=POSITIONAL, max_len=8):
    hkv = draw(st.sampled_from([1, 2, 3]))
    h = hkv * draw(st.sampled_from([1, 2, 3]))
    dh = draw(st.sampled_from([2, 4, 8]))
    d = draw(st.sampled_from([h * dh, 6, 16]))
    return {
        "B": draw(st.integers(1, 3)),
        "L": draw(st.integers(1, max_len)),
        "d": d,
        "h": h,
        "hkv": hkv,
        "dh": dh,
        "pos": draw(st.sampled_from(positional)),
        "bias": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**31 - 1)),
    }


def make_module(c, dtype=torch.float64, backend="auto"):
    torch.manual_seed(c["seed"])
    part = None
    if c["pos"].startswith("rope"):
        part = headwise.RotaryEmbedding(c["dh"], convention=c["pos"].split("-")[1])
    elif c["pos"] == "alibi":
        part = headwise.ALiBi(c["h"])
    m = headwise.MultiHeadAttention(
        c["d"], c["h"], num_kv_heads=c["hkv"], head_dim=c["dh"], bias=c["bias"], positional=part, backend=backend
    )
    return m.to(dtype).eval()


def make_input(c, dtype=torch.float64, L=None):
    g = torch.Generator().manual_seed(c["seed"] + 1)
    return torch.randn(c["B"], L or c["L"], c["d"], generator=g, dtype=torch.float64).to(dtype)


def random_bool(shape, seed, p=0.3):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(*shape, generator=g) < p

"""The claims of "TechByteByByte: Multi-Head Attention" (the two-head NumPy example), recomputed with headwise.

The inputs are the article's: the three tokens, ``X``, and the weights drawn as the article draws
them (``np.random.seed(3)``, then ``np.round(np.random.randn(d_model, d_head) * 0.5, 2)`` for
``Wq1, Wk1, Wv1, Wq2, Wk2, Wv2`` and ``(d_model, d_model)`` for ``Wo``). The computation is
:mod:`headwise.reference`'s, not a copy of the article's code: the two heads' matrices are
concatenated into one ``wq (D, H·Dh)`` etc., and ``multi_head_attention`` / ``split_heads`` /
``scaled_dot_product_attention`` / ``merge_heads`` do the rest.

Every ``printed`` string is copied from the article, TechByteByByte's "Multi-Head Attention".

Shape legend: L tokens (3), D model width (4), H heads (2), Dh head width (2).
"""

from __future__ import annotations

import functools

import numpy as np

from headwise.articles.claim import Claim, Count, Decimals, Shape, Text

__all__ = ["KEY", "TOKENS", "claims", "example"]

KEY = "techbyte"
TOKENS = ("cat", "sat", "mat")

_EXAMPLE = "9. Python / NumPy Example"
_HOW = "10. How It Works"


@functools.cache
def example() -> dict[str, np.ndarray]:
    """The worked example through :mod:`headwise.reference`.

    Returns:
        ``weights (H, L, L)``, ``heads (H, L, Dh)`` (each head's output), ``concatenated (L, H·Dh)``,
        ``output (L, D)`` and ``d_head``.
    """
    from headwise import reference as ref

    X = np.array(
        [
            [1.0, 0.0, 1.0, 0.0],
            [0.0, 1.0, 0.0, 1.0],
            [1.0, 1.0, 0.0, 0.0],
        ]
    )  # (L, D)
    d_model, num_heads = 4, 2
    d_head = d_model // num_heads
    rng = np.random.RandomState(3)  # the stream of np.random.seed(3)
    draw = [np.round(rng.randn(d_model, d_head) * 0.5, 2) for _ in range(6)]  # Wq1 Wk1 Wv1 Wq2 Wk2 Wv2
    wo = np.round(rng.randn(d_model, d_model) * 0.5, 2)
    head1, head2 = draw[:3], draw[3:]
    params = {
        name: np.concatenate([w1, w2], axis=-1)  # (D, H·Dh): head 1's columns, then head 2's
        for name, w1, w2 in zip(("wq", "wk", "wv"), head1, head2)
    }
    params["wo"] = wo
    output, weights = ref.multi_head_attention(X, params, num_heads)  # (L, D), (H, L, L)

    q = ref.split_heads(X @ params["wq"], num_heads)  # (H, L, Dh)
    k = ref.split_heads(X @ params["wk"], num_heads)
    v = ref.split_heads(X @ params["wv"], num_heads)
    heads, head_weights = ref.scaled_dot_product_attention(q, k, v)  # (H, L, Dh), (H, L, L)
    if not np.allclose(head_weights, weights, rtol=0, atol=1e-12):  # the two reference paths must agree
        raise AssertionError("reference: multi_head_attention and scaled_dot_product_attention disagree")
    concatenated = ref.merge_heads(heads)  # (L, H·Dh)
    return {
        "weights": weights,
        "heads": heads,
        "concatenated": concatenated,
        "output": output,
        "d_head": q.shape[-1],
    }


def _cat_row(head: int, token: str) -> float:
    """What 'cat' (query row 0) gives ``token`` in ``head`` (0-based)."""
    return float(example()["weights"][head, 0, TOKENS.index(token)])


def _top_for_cat(head: int) -> str:
    return TOKENS[int(np.argmax(example()["weights"][head, 0]))]


_H1 = """[[0.472  0.2676 0.2603]
 [0.2635 0.3618 0.3746]
 [0.4565 0.2735 0.27  ]]"""
_H2 = """[[0.3627 0.1943 0.443 ]
 [0.3326 0.4491 0.2182]
 [0.3124 0.3025 0.3851]]"""
_CONCAT = """[[-0.0194 -0.8694 -0.9616 -0.3999]
 [ 0.3008 -0.8794 -0.8637 -0.4963]
 [ 0.0033 -0.8711 -0.9156 -0.4626]]"""
_FINAL = """[[-1.0682  0.1421 -0.3248  1.0458]
 [-1.4414 -0.0608 -0.1886  1.0093]
 [-1.1078  0.0533 -0.322   0.9565]]"""
_TABLE = {
    "cat": "Head 1 -> 'cat': 0.4720   |   Head 2 -> 'cat': 0.3627",
    "sat": "Head 1 -> 'sat': 0.2676   |   Head 2 -> 'sat': 0.2603",
    "mat": "Head 1 -> 'mat': 0.2603   |   Head 2 -> 'mat': 0.4430",
}
_TOP = "Head 1 attends most to “cat” itself (0.472), while Head 2 attends most to “mat” (0.443)"


def claims() -> list[Claim]:
    """Every printed figure of the second article's worked example, in the article's order."""
    c = functools.partial(Claim, article=KEY, section=_EXAMPLE)
    table = []
    for token, line in _TABLE.items():
        left, right = line.split("|")
        for head, part in ((0, left.strip()), (1, right.strip())):
            typo = head == 1 and token == "sat"
            table.append(
                c(
                    key=f"tb.table.h{head + 1}.{token}",
                    what=f"'cat' -> '{token}', head {head + 1}",
                    printed=part,
                    compute=functools.partial(_cat_row, head, token),
                    rule=Decimals(4),
                    correct="0.1943" if typo else None,
                    note=(
                        "Typo in the article's last table: the code gives 0.1943, the value the article "
                        "itself prints at row 0, column 1 of the Head 2 matrix."
                        if typo
                        else ""
                    ),
                )
            )
    return [
        c(
            key="tb.d_head",
            what="d_head = d_model / num_heads",
            printed="d_model=4, num_heads=2, d_head=2",
            compute=lambda: example()["d_head"],
            rule=Count(),
        ),
        c(
            key="tb.weights.h1",
            what="Head 1 attention weights",
            printed=_H1,
            compute=lambda: example()["weights"][0],
            rule=Decimals(4),
        ),
        c(
            key="tb.weights.h2",
            what="Head 2 attention weights",
            printed=_H2,
            compute=lambda: example()["weights"][1],
            rule=Decimals(4),
        ),
        c(
            key="tb.concat.shape",
            what="concatenated output shape",
            printed="Concatenated output (shape (3, 4)):",
            compute=lambda: example()["concatenated"].shape,
            rule=Shape("numpy"),
        ),
        c(
            key="tb.concat",
            what="concatenated head outputs",
            printed=_CONCAT,
            compute=lambda: example()["concatenated"],
            rule=Decimals(4),
        ),
        c(
            key="tb.output.shape",
            what="final output shape",
            printed="Final multi-head attention output (shape (3, 4)):",
            compute=lambda: example()["output"].shape,
            rule=Shape("numpy"),
        ),
        c(
            key="tb.output",
            what="final output (after Wo)",
            printed=_FINAL,
            compute=lambda: example()["output"],
            rule=Decimals(4),
        ),
        *table,
        c(
            key="tb.top.h1",
            section=_HOW,
            what="head 1's top key for 'cat'",
            printed=_TOP,
            value="cat",
            compute=functools.partial(_top_for_cat, 0),
            rule=Text(),
        ),
        c(
            key="tb.top.h2",
            section=_HOW,
            what="head 2's top key for 'cat'",
            printed=_TOP,
            value="mat",
            compute=functools.partial(_top_for_cat, 1),
            rule=Text(),
        ),
        c(
            key="tb.head.shape",
            section=_HOW,
            what="each head's output shape",
            printed="Each head’s output has shape (3, 2)",
            compute=lambda: example()["heads"].shape[1:],
            rule=Shape("numpy"),
        ),
    ]

"""The claims of "LLM Under the Hood, Part 4: Multi-Head Attention", recomputed with headwise.

Every ``printed`` string is copied from the article ("LLM Under the Hood — Part 4: Multi-Head Attention"); every
computed value comes from headwise's modules (``MultiHeadAttention``, ``EmbeddingWithPE``,
``AttentionBlock``, ``sinusoidal_table``, ``interop.from_torch``, ``sizing``), run the way the
article runs its own code (same sizes, same seeds where the article sets one).

Shape legend: B batch, L sequence length, D model width, H heads.
"""

from __future__ import annotations

import contextlib
import functools

from headwise.articles.claim import Above, Approx, Below, Claim, Count, Decimals, Holds, Shape

__all__ = ["KEY", "claims"]

KEY = "part4"

_MHA = "PyTorch’s built-in and a from-scratch version"
_POSITION = "The position problem"
_PE = "Computing the PE matrix in PyTorch"
_INJECT = "Injecting position into the model"
_BLOCK = "Putting it together: the full attention block"
_HEADS = "What each head attends to"
_REAL = "MHA parameter count in real models"


@contextlib.contextmanager
def _seeded(seed: int | None):
    """Run with ``torch.manual_seed(seed)`` without touching the caller's random state."""
    import torch

    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        yield


@functools.cache
def _builtin_example():
    """The article's ``nn.MultiheadAttention`` example, and headwise's module with the same weights."""
    import torch
    from torch import nn

    from headwise.interop import from_torch

    with _seeded(0), torch.no_grad():
        theirs = nn.MultiheadAttention(embed_dim=128, num_heads=4, batch_first=True)
        x = torch.randn(2, 10, 128)  # (B, L, D)
        out_t, w_t = theirs(x, x, x)
        ours = from_torch(theirs)
        out, w = ours(x, need_weights=True)  # averaged over heads, as nn.MultiheadAttention
        causal = torch.ones(10, 10, dtype=torch.bool).triu(1)
        out_tc, w_tc = theirs(x, x, x, attn_mask=causal)
        out_c, w_c = ours(x, attn_mask=causal, need_weights=True)
    diff = max(float((a - b).abs().max()) for a, b in ((out, out_t), (w, w_t), (out_c, out_tc), (w_c, w_tc)))
    return {"out": tuple(out.shape), "weights": tuple(w.shape), "diff": diff}


@functools.cache
def _scratch_example():
    import torch

    from headwise import MultiHeadAttention

    with _seeded(0), torch.no_grad():
        mha = MultiHeadAttention(d_model=128, num_heads=4)
        out, _ = mha(torch.randn(2, 10, 128))
    return {"out": tuple(out.shape), "params": sum(p.numel() for p in mha.parameters()), "d_k": mha.head_dim}


def _equivariance_gap(with_positions: bool) -> float:
    """The article's check: ``max |mha(x[:, perm]) − mha(x)[:, perm]|`` for perm = [2, 0, 3, 1].

    With ``with_positions`` the sinusoidal table is added to the tokens first (each slot keeps its
    position), as ``EmbeddingWithPE`` does — the gap is then no longer round-off.
    """
    import torch

    from headwise import MultiHeadAttention, sinusoidal_table

    perm = [2, 0, 3, 1]
    with _seeded(0), torch.no_grad():
        mha = MultiHeadAttention(d_model=128, num_heads=4)  # the same draws as the article's module
        x = torch.randn(1, 4, 128)  # (B, L, D)
        pe = sinusoidal_table(4, 128) if with_positions else torch.zeros(4, 128)  # (L, D)
        out, _ = mha(x + pe)
        out_shuffled, _ = mha(x[:, perm] + pe)
    return float((out_shuffled - out[:, perm]).abs().max())


def _pe_shape() -> tuple[int, ...]:
    from headwise import sinusoidal_table

    return tuple(sinusoidal_table(50, 64).shape)


def _pe_row(pos: int):
    from headwise import sinusoidal_table

    return sinusoidal_table(50, 64)[pos, :6].numpy()


def _pe_params() -> int:
    from headwise import SinusoidalPositionalEncoding

    return sum(p.numel() for p in SinusoidalPositionalEncoding(64, 50).parameters())


def _embedding_shape():
    import torch

    from headwise import EmbeddingWithPE

    with _seeded(0), torch.no_grad():
        emb = EmbeddingWithPE(vocab_size=10000, d_model=64)
        return tuple(emb(torch.randint(0, 10000, (2, 20))).shape)


@functools.cache
def _token5_rows():
    """The article's ``TransformerEmbedding`` (``nn.Embedding(100, 128)`` + sinusoidal table) is
    headwise's ``EmbeddingWithPE(100, 128)``: the same draws after ``torch.manual_seed(0)``."""
    import torch

    from headwise import EmbeddingWithPE

    with _seeded(0), torch.no_grad():
        emb = EmbeddingWithPE(vocab_size=100, d_model=128, max_len=512)
        out_a = emb(torch.tensor([[5, 3, 8, 1]]))  # (1, 4, 128)
        out_b = emb(torch.tensor([[8, 5, 1, 3]]))
    return out_a[0, 0, :4].numpy(), out_b[0, 1, :4].numpy()


@functools.cache
def _block_example():
    import torch

    from headwise import AttentionBlock

    with _seeded(0), torch.no_grad():
        block = AttentionBlock(vocab_size=10000, d_model=128, num_heads=4)
        out = block(torch.randint(0, 10000, (2, 16)))
    return {"out": tuple(out.shape), "params": sum(p.numel() for p in block.parameters())}


def _heads_keep_params():
    from headwise import MultiHeadAttention

    counts = {h: sum(p.numel() for p in MultiHeadAttention(128, h).parameters()) for h in (1, 2, 4, 8, 16, 32)}
    same = len(set(counts.values())) == 1
    return same, f"{next(iter(counts.values())):,} for every h in {tuple(counts)} at d_model=128"


def _arch(name: str):
    from headwise.sizing import get_arch

    return get_arch(name)


def _attention(name: str) -> int:
    from headwise.sizing import attention_params

    return attention_params(_arch(name)).total


def _total(name: str) -> int:
    from headwise.sizing import total_params

    return total_params(_arch(name))


_LLAMA2 = "In a 7B model like Llama-2-7B, attention parameters are about 2.1B out of 8B total — roughly 26%."
_LLAMA3 = "attention params land closer to ~1.5B on a fully GQA’d model."
_GPT = "GPT-2 (117M parameters) uses h=12 with d_k=64. GPT-3 (175B parameters) uses h=96 with d_k=128."


def claims() -> list[Claim]:
    """Every checkable figure of the first article, in the article's order."""
    c = functools.partial(Claim, article=KEY)
    return [
        c(
            key="p4.d_k",
            section="Figure 1",
            what="d_k = d_model / h",
            printed="d_k = 128/4 = 32",
            compute=lambda: _scratch_example()["d_k"],
            rule=Count(),
        ),
        c(
            key="p4.builtin.out",
            section=_MHA,
            what="nn.MultiheadAttention output shape",
            printed="Output shape  : torch.Size([2, 10, 128])",
            compute=lambda: _builtin_example()["out"],
            rule=Shape(),
            note="headwise.interop.from_torch of the article's nn.MultiheadAttention, run on the same input.",
        ),
        c(
            key="p4.builtin.weights",
            section=_MHA,
            what="nn.MultiheadAttention weight shape (averaged over heads)",
            printed="Weight shape  : torch.Size([2, 10, 10])",
            compute=lambda: _builtin_example()["weights"],
            rule=Shape(),
        ),
        c(
            key="p4.builtin.equal",
            section=_MHA,
            what="headwise = nn.MultiheadAttention, same weights",
            printed="both produce identical outputs",
            compute=lambda: _builtin_example()["diff"],
            rule=Below(1e-6),
            note="Largest |difference| of outputs and averaged weights, without a mask and with a causal "
            "boolean mask, float32.",
        ),
        c(
            key="p4.scratch.out",
            section=_MHA,
            what="from-scratch module output shape",
            printed="Output shape : torch.Size([2, 10, 128])",
            compute=lambda: _scratch_example()["out"],
            rule=Shape(),
        ),
        c(
            key="p4.scratch.params",
            section=_MHA,
            what="parameters at d_model=128, h=4",
            printed="Parameters   : 66,048",
            compute=lambda: _scratch_example()["params"],
            rule=Count(),
        ),
        c(
            key="p4.heads.params",
            section=_HEADS,
            what="parameter count independent of h",
            printed="The relationship d_k = d_model / h keeps the parameter count fixed regardless of how "
            "many heads you use.",
            compute=_heads_keep_params,
            rule=Holds(),
        ),
        c(
            key="p4.equivariance",
            section=_POSITION,
            what="permutation equivariance, no positions",
            printed="Max difference (should be ~0): 1.19e-07",
            compute=lambda: _equivariance_gap(False),
            rule=Below(1e-6),
            note="float32 round-off: checked as below 1e-6, not as the exact 1.19e-07.",
        ),
        c(
            key="p4.equivariance.pe",
            section=_INJECT,
            what="the same check once positions are added",
            printed="Positional encoding has broken the symmetry.",
            compute=lambda: _equivariance_gap(True),
            rule=Above(1e-3),
            note="The equivariance check of 'The position problem' with the sinusoidal table added to "
            "the inputs: the gap is no longer round-off.",
        ),
        c(
            key="p4.pe.shape",
            section=_PE,
            what="PE table shape",
            printed="PE shape : torch.Size([50, 64])",
            compute=_pe_shape,
            rule=Shape(),
        ),
        *(
            c(
                key=f"p4.pe.row{pos}",
                section=_PE,
                what=f"PE[{pos}, :6]",
                printed=text,
                compute=functools.partial(_pe_row, pos),
                rule=Decimals(4),
            )
            for pos, text in (
                (0, "PE[0]    : [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]"),
                (1, "PE[1]    : [0.8415, 0.5403, 0.6816, 0.7318, 0.5332, 0.8460]"),
                (7, "PE[7]    : [0.6570, 0.7539, -0.8593, 0.5114, -0.7137, -0.7004]"),
            )
        ),
        c(
            key="p4.pe.params",
            section="Sine/cosine positional encoding",
            what="trainable parameters of the PE",
            printed="The whole thing has zero trainable parameters.",
            value="zero",
            compute=_pe_params,
            rule=Count(),
        ),
        c(
            key="p4.emb.shape",
            section=_INJECT,
            what="EmbeddingWithPE output shape",
            printed="Output shape : torch.Size([2, 20, 64])",
            compute=_embedding_shape,
            rule=Shape(),
        ),
        c(
            key="p4.token5.pos0",
            section=_INJECT,
            what="token 5 at position 0 (seed 0)",
            printed="Position 0: [0.5408, 0.0522, 0.2021, 0.6493]",
            compute=lambda: _token5_rows()[0],
            rule=Decimals(4),
            note="headwise.EmbeddingWithPE(100, 128) after torch.manual_seed(0) draws the same embedding "
            "as the article's TransformerEmbedding.",
        ),
        c(
            key="p4.token5.pos1",
            section=_INJECT,
            what="token 5 at position 1 (seed 0)",
            printed="Position 1: [1.3822, -0.4075, 0.9639, 0.2972]",
            compute=lambda: _token5_rows()[1],
            rule=Decimals(4),
        ),
        c(
            key="p4.block.out",
            section=_BLOCK,
            what="AttentionBlock output shape",
            printed="Output shape  : torch.Size([2, 16, 128])",
            compute=lambda: _block_example()["out"],
            rule=Shape(),
        ),
        c(
            key="p4.block.params",
            section=_BLOCK,
            what="AttentionBlock parameters (10000, 128, 4)",
            printed="Parameters    : 1,346,048",
            compute=lambda: _block_example()["params"],
            rule=Count(),
            note="headwise's AttentionBlock is built on its own MultiHeadAttention (the article uses "
            "nn.MultiheadAttention): the same 1,346,048.",
        ),
        c(
            key="p4.gpt2.h",
            section=_HEADS,
            what="GPT-2 heads",
            printed=_GPT,
            value="h=12",
            compute=lambda: _arch("gpt2").num_heads,
            rule=Count(),
        ),
        c(
            key="p4.gpt2.d_k",
            section=_HEADS,
            what="GPT-2 head width",
            printed=_GPT,
            value="d_k=64",
            compute=lambda: _arch("gpt2").head_dim,
            rule=Count(),
        ),
        c(
            key="p4.gpt2.total",
            model="gpt2",
            quantity="total",
            section=_HEADS,
            what="GPT-2 parameters",
            printed=_GPT,
            value="117M",
            correct="124M",
            compute=lambda: _total("gpt2"),
            rule=Approx(0.02),
            note="117M is the figure of the GPT-2 paper's table; the released GPT-2 small has 124,439,808 "
            "parameters (tied embeddings), as headwise.sizing counts.",
        ),
        c(
            key="p4.gpt3.h",
            section=_HEADS,
            what="GPT-3 heads",
            printed=_GPT,
            value="h=96",
            compute=lambda: _arch("gpt-3").num_heads,
            rule=Count(),
        ),
        c(
            key="p4.gpt3.d_k",
            section=_HEADS,
            what="GPT-3 head width",
            printed=_GPT,
            value="d_k=128",
            compute=lambda: _arch("gpt-3").head_dim,
            rule=Count(),
        ),
        c(
            key="p4.gpt3.total",
            model="gpt-3",
            quantity="total",
            section=_HEADS,
            what="GPT-3 parameters",
            printed=_GPT,
            value="175B",
            compute=lambda: _total("gpt-3"),
            rule=Approx(0.02),
        ),
        c(
            key="p4.llama2.attention",
            model="llama-2-7b",
            quantity="attention",
            section=_REAL,
            what="Llama-2-7B attention parameters",
            printed=_LLAMA2,
            value="2.1B",
            compute=lambda: _attention("llama-2-7b"),
            rule=Approx(0.05),
            note="32 layers × 4 · 4096² = 2,147,483,648.",
        ),
        c(
            key="p4.llama2.total",
            model="llama-2-7b",
            quantity="total",
            section=_REAL,
            what="Llama-2-7B parameters in all",
            printed=_LLAMA2,
            value="8B",
            correct="6.74B",
            compute=lambda: _total("llama-2-7b"),
            rule=Approx(0.05),
            note="The article mixes two models: Llama-2-7B has 6.74B parameters in all (8B is Llama-3-8B).",
        ),
        c(
            key="p4.llama2.share",
            model="llama-2-7b",
            quantity="attention_share",
            section=_REAL,
            what="Llama-2-7B attention share",
            printed=_LLAMA2,
            value="26%",
            correct="32%",
            compute=lambda: _attention("llama-2-7b") / _total("llama-2-7b"),
            rule=Approx(0.05),
            note="2.15B of 6.74B is 32% (26% would need the 8B total of another model).",
        ),
        c(
            key="p4.llama3.attention",
            model="llama-3-8b",
            quantity="attention",
            section=_REAL,
            what="Llama-3-8B attention parameters (GQA, 8 KV heads)",
            printed=_LLAMA3,
            value="~1.5B",
            correct="1.34B",
            compute=lambda: _attention("llama-3-8b"),
            rule=Approx(0.05),
            note="32 layers × (2 · 4096² + 2 · 4096 · 1024) = 1,342,177,280: the article's ~1.5B is 12% high.",
        ),
    ]

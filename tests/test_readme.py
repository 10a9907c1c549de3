"""The README's Python examples run as written, and say what they compute.

Each block is run one top-level statement at a time. Every call of a ``MultiHeadAttention`` is recorded
and its output (and weights, when asked for) compared, as a whole tensor, with the NumPy reference
(``headwise.reference.multi_head_attention``, float64) on the same weights, masks, positional part and
cache slots. The figures the README's comments state — a parameter count, the shapes of ``out`` and
``w`` — are read from the comments and checked against the objects the statement made.
"""

import ast
import pathlib
import re

import numpy as np
import pytest
import torch

import headwise
import headwise.reference as ref
from _helpers import np64, ref_params

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
#: float32 module against the float64 reference (D up to 512): measured at most 7.2e-7
TOL = 5e-6


#: Blocks that open the bundled real decoder (a 20 s de-quantisation on a fresh cache) run in the slow suite.
REAL_MODEL = 'open_model("smollm2")'


def _blocks(*, real_model: bool = False):
    text = README.read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    return [b for b in blocks if (REAL_MODEL in b) == real_model]


def _reference_kwargs(m):
    positional = m.positional
    if isinstance(positional, headwise.RotaryEmbedding):
        return {"rope": {"base": positional.base, "convention": positional.convention}}
    if isinstance(positional, headwise.ALiBi):
        return {"alibi": True}
    assert positional is None, f"no reference mapping for {positional!r}"
    return {}


class Recorder:
    """Wraps ``MultiHeadAttention.forward``: records every self-attention call with what the cache held."""

    def __init__(self, monkeypatch):
        self.calls = []
        self.fed = {}  # id(cache) -> the inputs appended to it so far
        forward = headwise.MultiHeadAttention.forward

        def record(module, query, *args, **kwargs):
            assert not args, "the README's calls are self-attention with keyword options"
            cache = kwargs.get("cache")
            before = [] if cache is None else list(self.fed.get(id(cache), []))
            result = forward(module, query, *args, **kwargs)
            if cache is not None:
                self.fed[id(cache)] = before + [query.detach().clone()]
            self.calls.append((module, query.detach().clone(), dict(kwargs), before, result))
            return result

        monkeypatch.setattr(headwise.MultiHeadAttention, "forward", record)


def _check_against_reference(module, query, kwargs, before, result):
    out, w = result
    mask = None
    if kwargs.get("key_padding_mask") is not None:
        mask = np.asarray(kwargs["key_padding_mask"])[:, None, None, :]  # (B, 1, 1, S)
    if kwargs.get("attn_mask") is not None:
        raise AssertionError("extend the README test to attn_mask")
    context = torch.cat([*before, query], dim=1) if before else None  # the cache's keys' inputs
    start = sum(t.shape[1] for t in before)
    r_out, r_w = ref.multi_head_attention(
        np64(query),
        ref_params(module),
        module.num_heads,
        num_kv_heads=module.num_kv_heads,
        context=None if context is None else np64(context),
        positions=np.arange(start, start + query.shape[1]),
        key_positions=np.arange(start + query.shape[1]),
        mask=mask,
        causal=kwargs.get("is_causal", False),
        **_reference_kwargs(module),
    )
    np.testing.assert_allclose(np64(out), r_out, rtol=0, atol=TOL)
    if kwargs.get("need_weights"):
        expected = r_w.mean(axis=1) if kwargs.get("average_weights", True) else r_w
        np.testing.assert_allclose(np64(w), expected, rtol=0, atol=TOL)
    else:
        assert w is None


def _stated_shapes(comment: str) -> dict[str, tuple[int, ...]]:
    """``out (2, 10, 128), w (2, 10, 10)`` -> {"out": (2, 10, 128), "w": (2, 10, 10)}."""
    return {
        name: tuple(int(n) for n in dims.split(","))
        for name, dims in re.findall(r"\b([a-z_]\w*) \((\d+(?:, *\d+)*)\)", comment)
    }


def test_readme_python_blocks_run_and_equal_the_reference(monkeypatch):
    blocks = _blocks()
    assert blocks, "README has no python examples"
    recorder = Recorder(monkeypatch)
    namespace: dict = {}
    stated = 0
    for block in blocks:
        lines = block.splitlines()
        for statement in ast.parse(block).body:
            code = ast.get_source_segment(block, statement)
            exec(compile(code, str(README), "exec"), namespace)  # noqa: S102 - our own README
            comment = lines[statement.lineno - 1].partition("#")[2]
            count = re.search(r"([\d,]+) parameters", comment)
            if count:
                (target,) = [t.id for t in statement.targets]
                params = sum(p.numel() for p in namespace[target].parameters())
                assert params == int(count.group(1).replace(",", "")), (code, params)
                stated += 1
            for name, shape in _stated_shapes(comment).items():
                assert tuple(namespace[name].shape) == shape, (code, name, tuple(namespace[name].shape))
                stated += 1
    assert stated >= 4, "the README's comments state fewer figures than this test reads"
    assert len(recorder.calls) >= 8
    for call in recorder.calls:
        _check_against_reference(*call)


def test_a_wrong_readme_figure_is_caught(monkeypatch):
    """The comparison can fail: a module with a changed weight no longer equals the reference it was
    recorded against."""
    recorder = Recorder(monkeypatch)
    m = headwise.MultiHeadAttention(16, 4)
    m(torch.randn(1, 3, 16), need_weights=True)
    module, query, kwargs, before, result = recorder.calls[0]
    with torch.no_grad():
        module.Wo.weight.add_(1e-3)
    with pytest.raises(AssertionError):
        _check_against_reference(module, query, kwargs, before, result)


@pytest.mark.slow
def test_readme_real_decoder_block_runs_as_stated():
    """The tour's SmolLM2 block: 30 layers of (1, 9, 14, 14) maps, tokens as text, a notebook view."""
    pytest.importorskip("gguf")
    from headwise.models import bundled_path

    try:
        bundled_path("smollm2")
    except FileNotFoundError as e:
        pytest.skip(str(e))
    [block] = _blocks(real_model=True)
    namespace: dict = {}
    exec(compile(block, str(README), "exec"), namespace)  # noqa: S102 - our own README
    maps, enc = namespace["maps"], namespace["enc"]
    assert len(maps) == 30 and all(tuple(m.shape) == (1, 9, 14, 14) for m in maps)
    np.testing.assert_allclose(np.asarray(maps[5])[0].sum(-1), 1.0, atol=1e-5)  # causal rows sum to 1
    assert np.all(np.triu(np.asarray(maps[5])[0], k=1) == 0)
    texts = namespace["hm"].token_texts(enc.ids[0].tolist())
    assert texts[1] == "␣Mary" and texts[0] == "When"

"""headwise's BERT equals Hugging Face's ``BertModel`` (eager attention), layer by layer and head by head."""

from __future__ import annotations

import warnings
from importlib import resources

import pytest
import torch

import headwise.models as M

transformers = pytest.importorskip("transformers")

TOL = 1e-5  # float32, absolute, every layer / head, real tokens


def _sentences(k: int) -> list[str]:
    text = (resources.files("headwise") / "data" / "corpus" / "web_sentences.txt").read_text(encoding="utf-8")
    lines = text.splitlines()
    return lines[:: len(lines) // k][:k]


def _compare(ours, theirs, mask):
    real = mask.bool()  # (B, L)
    pair = real[:, None, :, None] & real[:, None, None, :]  # (B, 1, L, L)
    assert len(ours.hidden_states) == len(theirs.hidden_states)
    assert len(ours.attentions) == len(theirs.attentions)
    diffs = {"hidden": 0.0, "attn": 0.0}
    for a, b in zip(ours.hidden_states, theirs.hidden_states):
        assert a.shape == b.shape
        diffs["hidden"] = max(diffs["hidden"], (a - b)[real].abs().max().item())
    for a, b in zip(ours.attentions, theirs.attentions):
        assert a.shape == b.shape  # (B, H, L, L)
        diffs["attn"] = max(diffs["attn"], (a - b).masked_select(pair.expand_as(a)).abs().max().item())
        pad_keys = ~real[:, None, None, :]
        assert a.masked_select(pad_keys.expand_as(a)).abs().max().item() == 0.0  # padding gets no weight
    return diffs


@pytest.mark.slow
def test_minilm_matches_hugging_face_on_padded_batch():
    model, tok = M.load_bert()
    assert (model.config.num_hidden_layers, model.config.num_attention_heads, model.config.hidden_size) == (6, 12, 384)
    texts = _sentences(24) + ["Jesus wept.", "Amen!"]
    batch = M.encode(tok, texts)
    assert batch.attention_mask.sum(1).min() < batch.input_ids.shape[1]  # padding really happens
    hf = transformers.BertModel.from_pretrained(str(M.default_model_path()), attn_implementation="eager").eval()
    with torch.no_grad():
        ours = model(batch.input_ids, attention_mask=batch.attention_mask)
        theirs = hf(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            output_hidden_states=True,
            output_attentions=True,
        )
    diffs = _compare(ours, theirs, batch.attention_mask)
    assert diffs["hidden"] <= TOL and diffs["attn"] <= TOL, diffs
    # A sentence alone gives the same maps as inside the padded batch (padding changes nothing).
    alone = M.encode(tok, [texts[-1]])
    with torch.no_grad():
        single = model(alone.input_ids, attention_mask=alone.attention_mask)
    n = alone.input_ids.shape[1]
    for a, b in zip(single.attentions, ours.attentions):
        torch.testing.assert_close(a[0], b[-1, :, :n, :n], atol=TOL, rtol=0)  # BLAS round-off only


def test_tiny_checkpoint_with_vocab_txt_matches_hugging_face(tiny_checkpoint):
    model, tok = M.load_bert(tiny_checkpoint)
    hf = transformers.BertModel.from_pretrained(str(tiny_checkpoint), attn_implementation="eager").eval()
    batch = M.encode(tok, ["the cat sat on the mat.", "god created heaven and earth, and it was good!", "dogs"])
    assert batch.tokens[2][:4] == ["[CLS]", "dog", "##s", "[SEP]"]
    types = torch.zeros_like(batch.input_ids)
    types[0, 4:] = 1
    with torch.no_grad():
        ours = model(batch.input_ids, attention_mask=batch.attention_mask, token_type_ids=types)
        theirs = hf(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            token_type_ids=types,
            output_hidden_states=True,
            output_attentions=True,
        )
    diffs = _compare(ours, theirs, batch.attention_mask)
    assert diffs["hidden"] <= TOL and diffs["attn"] <= TOL, diffs


def test_masked_lm_checkpoint_names_are_mapped(tiny_checkpoint, tmp_path):
    """``BertForMaskedLM`` stores ``bert.``-prefixed names and extra heads: the loader maps and ignores them."""
    import shutil

    mlm = transformers.BertForMaskedLM.from_pretrained(str(tiny_checkpoint))
    mlm.save_pretrained(tmp_path, safe_serialization=True)
    shutil.copy(tiny_checkpoint / "vocab.txt", tmp_path / "vocab.txt")
    a, _ = M.load_bert(tmp_path)
    b, _ = M.load_bert(tiny_checkpoint)
    for (name, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items()):
        torch.testing.assert_close(p, q, atol=0, rtol=0, msg=name)


def test_too_long_text_is_truncated_with_a_warning(tiny_checkpoint):
    model, tok = M.load_bert(tiny_checkpoint)
    long_text = " ".join(["the cat sat"] * 20)  # 62 tokens > 24 positions
    with pytest.warns(M.TruncationWarning, match=r"texts\[1\]: 62 tokens.*24 positions"):
        batch = M.encode(tok, ["a dog", long_text], max_length=model.config.max_position_embeddings)
    assert batch.input_ids.shape == (2, 24) and batch.truncated == [False, True] and batch.num_tokens[1] == 62
    assert batch.tokens[1][0] == "[CLS]" and batch.tokens[1][-1] == "[SEP]"
    with torch.no_grad():
        out = model(batch.input_ids, attention_mask=batch.attention_mask)
    assert out.attentions[0].shape == (2, 4, 24, 24)
    with pytest.raises(ValueError, match="max_position_embeddings=24"):
        model(torch.zeros((1, 25), dtype=torch.long))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        M.encode(tok, ["a dog"], max_length=24)  # no warning when it fits


def test_encode_and_forward_check_their_inputs(tiny_checkpoint):
    model, tok = M.load_bert(tiny_checkpoint)
    with pytest.raises(ValueError, match=r"texts\[1\]: expected a non-empty text"):
        M.encode(tok, ["a dog", "   "])
    with pytest.raises(ValueError, match="at least one text"):
        M.encode(tok, [])
    with pytest.raises(TypeError, match="input_ids"):
        model(torch.zeros((1, 3)))
    with pytest.raises(ValueError, match="attention_mask"):
        model(torch.zeros((1, 3), dtype=torch.long), attention_mask=torch.ones((1, 4)))
    with pytest.raises(ValueError, match="input_ids: expected ids in"):
        model(torch.full((1, 3), 10_000, dtype=torch.long))
    out = model(torch.zeros((1, 3), dtype=torch.long), output_attentions=False)
    assert out.attentions is None and len(out.hidden_states) == 3


def test_model_attend_returns_the_models_maps_and_the_batch_it_read(tiny_checkpoint):
    """The adapter the analysis drives: the encoder's own per-layer weights, as float32 arrays, beside the
    encoded batch; the batch reads as the token info of its tokens and mask."""
    from headwise import analysis

    model, tok = M.load_bert(tiny_checkpoint)
    texts = ["the cat sat on the mat.", "dogs"]
    maps, batch = M.model_attend(model, tok)(texts)
    expected = M.encode(tok, texts)
    assert torch.equal(batch.input_ids, expected.input_ids) and batch.tokens == expected.tokens
    with torch.no_grad():
        out = model(expected.input_ids, attention_mask=expected.attention_mask)
    assert len(maps) == model.config.num_hidden_layers
    for ours, theirs in zip(maps, out.attentions):
        assert ours.dtype.name == "float32"
        torch.testing.assert_close(torch.from_numpy(ours), theirs, rtol=0, atol=0)
    info = analysis.as_token_info(batch)
    assert info.valid.tolist() == expected.attention_mask.bool().tolist()

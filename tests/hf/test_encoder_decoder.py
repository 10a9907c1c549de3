"""An encoder-decoder on the backend: T5 (relative ``position_bias`` added to the scores, cross-attention,
a left-padded encoder batch) against Hugging Face's eager path."""

import pytest
import torch

import headwise.hf
from _hf_models import VOCAB, batch, randomise

transformers = pytest.importorskip("transformers")


def _t5(attn: str):
    config = transformers.AutoConfig.for_model(
        "t5", d_model=32, d_kv=8, num_heads=4, num_layers=2, num_decoder_layers=2, d_ff=48, vocab_size=VOCAB,
        decoder_start_token_id=0, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    return randomise(transformers.AutoModelForSeq2SeqLM.from_config(config, attn_implementation=attn))


@pytest.fixture(scope="module")
def t5():
    inputs = batch()
    inputs["decoder_input_ids"] = torch.randint(3, VOCAB, (3, 5), generator=torch.Generator().manual_seed(2))
    return _t5("eager"), _t5("headwise"), inputs


def test_logits_and_generation_equal_eager(t5):
    eager, mine, inputs = t5
    with torch.no_grad():
        torch.testing.assert_close(mine(**inputs).logits, eager(**inputs).logits, rtol=0, atol=1e-4)
        encoder_only = {k: inputs[k] for k in ("input_ids", "attention_mask")}
        expected = eager.generate(**encoder_only, max_new_tokens=6, do_sample=False)
        assert torch.equal(mine.generate(**encoder_only, max_new_tokens=6, do_sample=False), expected)


def test_capture_gives_self_and_cross_attention_in_module_order(t5):
    eager, _, inputs = t5
    with torch.no_grad():
        expected = eager(**inputs, output_attentions=True)
        with headwise.hf.capture(eager) as attn:
            eager(**inputs)
    # encoder self-attention ×2, then per decoder block: self-attention, cross-attention
    wanted = [*expected.encoder_attentions]
    for own, cross in zip(expected.decoder_attentions, expected.cross_attentions):
        wanted += [own, cross]
    assert [tuple(w.shape) for w in attn.weights] == [tuple(w.shape) for w in wanted]
    assert tuple(attn.weights[3].shape) == (3, 4, 5, 9)  # cross-attention: decoder queries, encoder keys
    for got, want in zip(attn.weights, wanted):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)

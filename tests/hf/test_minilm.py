"""The real all-MiniLM-L6-v2 (a BERT) through the ``"headwise"`` backend equals Hugging Face ≤ 1e-5: every
hidden state at the real tokens and every head's weights against eager, on a padded batch of corpus sentences;
every position against Hugging Face's own ``sdpa`` path (the same kernel, so ≤ 1e-6). At padding positions
eager and sdpa differ from each other by up to 3e-5 after six layers: those positions are never read."""

from importlib import resources

import pytest
import torch

import headwise.hf
import headwise.models as M

transformers = pytest.importorskip("transformers")

TOL = 1e-5  # float32, absolute


def _sentences(k: int) -> list[str]:
    text = (resources.files("headwise") / "data" / "corpus" / "web_sentences.txt").read_text(encoding="utf-8")
    lines = text.splitlines()
    return lines[:: len(lines) // k][:k] + ["Amen!"]


@pytest.fixture(scope="module")
def minilm():
    _, tok = M.load_bert()
    batch = M.encode(tok, _sentences(12))
    assert batch.attention_mask.sum(1).min() < batch.input_ids.shape[1]  # padding really happens
    path = str(M.default_model_path())
    models = {
        name: transformers.BertModel.from_pretrained(path, attn_implementation=name).eval()
        for name in ("eager", "sdpa", "headwise")
    }
    return models, {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}


def test_hidden_states_equal_hugging_face(minilm):
    models, inputs = minilm
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        out = {name: model(**inputs, output_hidden_states=True) for name, model in models.items()}
    assert models["headwise"].config._attn_implementation == "headwise"
    assert len(out["headwise"].hidden_states) == len(out["eager"].hidden_states) == 7
    for mine, eager, sdpa in zip(out["headwise"].hidden_states, out["eager"].hidden_states, out["sdpa"].hidden_states):
        torch.testing.assert_close(mine[real], eager[real], rtol=0, atol=TOL)
        torch.testing.assert_close(mine, sdpa, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_captured_weights_equal_output_attentions(minilm):
    models, inputs = minilm
    eager = models["eager"]
    with torch.no_grad():
        expected = eager(**inputs, output_attentions=True).attentions
        with headwise.hf.capture(eager) as attn:
            eager(**inputs)
    assert eager.config._attn_implementation == "eager"
    assert [tuple(w.shape) for w in attn.weights] == [tuple(w.shape) for w in expected]
    assert attn.weights[0].shape[1] == 12
    for a, b in zip(attn.weights, expected):
        torch.testing.assert_close(a, b, rtol=0, atol=TOL)

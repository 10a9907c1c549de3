"""Lab checkpoints: round trip, the documented config.json, whole-or-nothing folders, corrupt files named."""

from __future__ import annotations

import json

import pytest
import torch

from headwise._io import atomic_folder
from headwise.lab import LMConfig, TransformerLM, is_lab_checkpoint, load, save
from headwise.models.lab_checkpoint import CONFIG_FILE, MODEL_TYPE, WEIGHTS_FILE


@pytest.fixture
def model():
    torch.manual_seed(0)
    return TransformerLM(LMConfig(vocab_size=64, context_length=64, d_model=32, num_heads=4, d_ff=16))


def test_round_trip_same_logits_eval_mode(model, tmp_path):
    save(model, tmp_path / "ck", training={"seed": 3})
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == [CONFIG_FILE, WEIGHTS_FILE]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]  # no temporary left
    config = json.loads((tmp_path / "ck" / CONFIG_FILE).read_text())
    assert config["model_type"] == MODEL_TYPE == "headwise-lab"
    assert config["config"] == model.config.to_dict() and config["training"] == {"seed": 3}
    loaded = load(tmp_path / "ck")
    assert not loaded.training and loaded.vocab_size == 64 and loaded.context_length == 64
    ids = torch.randint(0, 64, (2, 64))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids), model.eval()(ids), rtol=0, atol=0)
    assert is_lab_checkpoint(tmp_path / "ck") and not is_lab_checkpoint(tmp_path)


def test_save_replaces_a_folder_whole(model, tmp_path):
    save(model, tmp_path / "ck")
    (tmp_path / "ck" / "extra.txt").write_text("old run")
    save(model, tmp_path / "ck")
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == [CONFIG_FILE, WEIGHTS_FILE]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def test_interrupted_folder_leaves_the_old_one(model, tmp_path):
    save(model, tmp_path / "ck")
    before = (tmp_path / "ck" / WEIGHTS_FILE).read_bytes()
    with pytest.raises(KeyboardInterrupt), atomic_folder(tmp_path / "ck") as tmp:
        (tmp / "half").write_text("x")
        raise KeyboardInterrupt
    assert (tmp_path / "ck" / WEIGHTS_FILE).read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]
    with pytest.raises(NotADirectoryError):
        save(model, tmp_path / "ck" / WEIGHTS_FILE)


def test_corrupt_or_foreign_checkpoints_are_named(model, tmp_path):
    save(model, tmp_path / "ck")
    with pytest.raises(FileNotFoundError, match="not a folder"):
        load(tmp_path / "missing")
    weights = tmp_path / "ck" / WEIGHTS_FILE
    good = weights.read_bytes()
    weights.write_bytes(good[: len(good) // 2])
    with pytest.raises(ValueError, match="safetensors"):
        load(tmp_path / "ck")
    weights.write_bytes(good)
    config = tmp_path / "ck" / CONFIG_FILE
    data = json.loads(config.read_text())
    config.write_text("{not json")
    with pytest.raises(ValueError, match="JSON"):
        load(tmp_path / "ck")
    config.write_text(json.dumps({**data, "model_type": "bert"}))
    with pytest.raises(ValueError, match="model_type"):
        load(tmp_path / "ck")
    config.write_text(json.dumps({**data, "config": {**data["config"], "d_model": 64}}))
    with pytest.raises(ValueError, match="does not fit"):
        load(tmp_path / "ck")
    config.write_text(json.dumps(data))
    weights.unlink()
    with pytest.raises(FileNotFoundError, match=WEIGHTS_FILE):
        load(tmp_path / "ck")

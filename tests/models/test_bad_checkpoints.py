"""Broken checkpoint folders give one clear error that names the file or the tensor."""

from __future__ import annotations

import json
import shutil

import pytest

import headwise.models as M

pytest.importorskip("transformers")


@pytest.fixture
def folder(tiny_checkpoint, tmp_path):
    dest = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, dest)
    return dest


def _edit_tensors(path, change):
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path))


def test_missing_folder_and_files(folder, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"model: no such folder: .*nowhere") as e:
        M.load_bert(tmp_path / "nowhere")
    assert type(e.value) is FileNotFoundError
    (folder / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        M.load_bert(folder)


def test_missing_weights(folder):
    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"model\.safetensors: no such file"):
        M.load_bert(folder)


def test_pickle_only_checkpoint_is_refused(folder):
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04 not loaded")
    with pytest.raises(FileNotFoundError, match=r"pytorch_model\.bin \(a pickle checkpoint"):
        M.load_bert(folder)


@pytest.mark.parametrize(
    "damage, message",
    [
        ("garbage", r"model\.safetensors"),
        ("truncated", r"model\.safetensors: corrupt or truncated safetensors file"),
        ("empty", r"model\.safetensors: not a safetensors file \(0 bytes"),
    ],
)
def test_corrupt_or_truncated_weights(folder, damage, message):
    path = folder / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes({"garbage": b"\x13" * 4096, "truncated": data[: len(data) // 2], "empty": b""}[damage])
    with pytest.raises(ValueError, match=message) as e:
        M.load_bert(folder)
    assert type(e.value) is ValueError


def test_missing_tensor_is_named(folder):
    _edit_tensors(folder / "model.safetensors", lambda t: t.pop("encoder.layer.1.attention.self.key.weight"))
    with pytest.raises(ValueError, match=r"missing tensor\(s\) 'encoder\.layer\.1\.attention\.self\.key\.weight'") as e:
        M.load_bert(folder)
    assert type(e.value) is ValueError


def test_wrong_shape_is_named(folder):
    import torch

    def change(t):
        t["encoder.layer.0.intermediate.dense.weight"] = torch.zeros(50, 32)

    _edit_tensors(folder / "model.safetensors", change)
    with pytest.raises(
        ValueError,
        match=r"tensor 'encoder\.layer\.0\.intermediate\.dense\.weight' has shape \(50, 32\), expected \(48, 32\)",
    ) as e:
        M.load_bert(folder)
    assert type(e.value) is ValueError


def _edit_config(folder, **changes):
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    cfg.update(changes)
    path.write_text(json.dumps(cfg))


def test_hidden_size_not_divisible_by_heads(folder):
    _edit_config(folder, num_attention_heads=5)
    with pytest.raises(
        ValueError, match=r"config\.json: .*hidden_size: expected a multiple of num_attention_heads=5, got 32"
    ) as e:
        M.load_bert(folder)
    assert type(e.value) is ValueError


def test_config_that_disagrees_with_the_weights(folder):
    _edit_config(folder, intermediate_size=64)
    with pytest.raises(ValueError, match=r"intermediate\.dense\.weight' has shape \(48, 32\), expected \(64, 32\)"):
        M.load_bert(folder)


def test_bad_config_values(folder):
    (folder / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"config\.json: not a valid JSON file") as e:
        M.load_bert(folder)
    assert type(e.value) is ValueError
    (folder / "config.json").write_text(json.dumps({"hidden_size": 32, "position_embedding_type": "relative_key"}))
    with pytest.raises(ValueError, match="relative_key"):
        M.load_bert(folder)
    with pytest.raises(ValueError, match="hidden_act"):
        M.BertConfig(hidden_act="swish")
    (folder / "config.json").write_text(json.dumps({"model_type": "roberta", "hidden_size": 32}))
    with pytest.raises(ValueError, match=r"config\.json: model_type='roberta' is not a BERT encoder"):
        M.load_bert(folder)


def test_missing_tokenizer(folder):
    (folder / "vocab.txt").unlink()
    with pytest.raises(FileNotFoundError, match=r"tokenizer\.json or vocab\.txt") as e:
        M.load_bert(folder)
    assert type(e.value) is FileNotFoundError

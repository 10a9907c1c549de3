"""The one door, ``headwise.models.open_model``: every kind of folder opened by what it holds, and every bad
folder refused by the one set of checks — one line naming the file, nothing loaded, nothing unpickled."""

from __future__ import annotations

import json
import pickle
import shutil

import pytest
import torch

import headwise.models as M
from headwise.models import folder as F

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from _decoders import save_decoder  # noqa: E402


@pytest.fixture(scope="module")
def lab_folder(tmp_path_factory):
    torch.manual_seed(0)
    model = M.TransformerLM(M.LMConfig(vocab_size=32, context_length=16, d_model=16, num_layers=2, num_heads=2))
    from headwise.models.lab_checkpoint import save

    return save(model, tmp_path_factory.mktemp("lab") / "ck"), model


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    return save_decoder(tmp_path_factory.mktemp("hf") / "llama", "llama")


def test_each_kind_is_opened_by_what_the_folder_holds(tiny_checkpoint, lab_folder, llama_folder):
    from headwise.core.attention import MultiHeadAttention

    bert = M.open_model(tiny_checkpoint)
    assert (bert.kind, bert.family, bert.backend, bert.num_layers, bert.num_heads) == (
        "encoder",
        "bert",
        "headwise",
        2,
        4,
    )
    assert isinstance(bert.model, M.BertEncoder)
    assert bert.head_points == [m.hook_heads for m in bert.attention_modules]

    lab_path, lab_model = lab_folder
    assert M.is_lab_checkpoint(lab_path) and M.inspect_source(lab_path).kind == "lab"
    lab = M.open_model(lab_path)
    assert (lab.kind, lab.family, lab.backend, lab.num_layers, lab.num_heads) == (
        "decoder",
        "headwise-lab",
        "headwise",
        2,
        2,
    )
    assert all(isinstance(m, MultiHeadAttention) for m in lab.attention_modules)
    ids = torch.randint(0, 32, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(lab.forward(ids), lab_model.eval()(ids), rtol=0, atol=0)

    hf = M.open_model(llama_folder)
    assert (hf.kind, hf.family, hf.backend) == ("decoder", "llama", "hf+headwise")
    assert hf.model.config._attn_implementation == "headwise" and hf.tokenizer is not None


def test_a_checked_folder_is_not_checked_again(lab_folder, monkeypatch):
    info = M.inspect_source(lab_folder[0])
    calls = []
    monkeypatch.setattr("headwise.models.sources.inspect_folder", lambda *a: calls.append(a))
    hm = M.open_model(info)
    assert calls == [] and hm.kind == "decoder"


def _copy(src, tmp_path, name="ck"):
    dest = tmp_path / name
    shutil.copytree(src, dest)
    return dest


@pytest.mark.parametrize("kind", ["bert", "lab", "hf"])
def test_pickle_only_folders_are_refused_and_never_unpickled(kind, tiny_checkpoint, lab_folder, llama_folder, tmp_path):
    dest = _copy({"bert": tiny_checkpoint, "lab": lab_folder[0], "hf": llama_folder}[kind], tmp_path)
    for weights in dest.glob("*.safetensors"):
        weights.unlink()
    marker = tmp_path / "unpickled"

    class Bomb:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    (dest / "pytorch_model.bin").write_bytes(pickle.dumps(Bomb()))
    with pytest.raises(FileNotFoundError, match=r"found only pytorch_model\.bin \(a pickle checkpoint") as e:
        M.open_model(dest)
    assert "\n" not in str(e.value)
    assert not marker.exists()


@pytest.mark.parametrize("kind", ["bert", "lab", "hf"])
def test_a_truncated_safetensors_file_is_named_before_loading(
    kind, tiny_checkpoint, lab_folder, llama_folder, tmp_path
):
    dest = _copy({"bert": tiny_checkpoint, "lab": lab_folder[0], "hf": llama_folder}[kind], tmp_path)
    (weights,) = dest.glob("*.safetensors")
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) - 16])
    with pytest.raises(ValueError, match=rf"{weights.name}: corrupt or truncated safetensors file \(tensors need"):
        M.open_model(dest)


def test_unknown_types_files_and_memory_are_refused(lab_folder, tmp_path, monkeypatch):
    dest = _copy(lab_folder[0], tmp_path)
    config = json.loads((dest / "config.json").read_text())
    (dest / "config.json").write_text(json.dumps({**config, "model_type": "no-such-family"}))
    with pytest.raises(ValueError, match=r"config\.json: unknown model_type 'no-such-family'"):
        M.open_model(dest)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(ValueError, match=r"model\.gguf: not a GGUF file \(4 bytes, shorter than a GGUF header\)"):
        M.open_model(gguf)  # the magic alone: refused by the header check, before anything is loaded
    other = tmp_path / "weights.bin"
    other.write_bytes(b"\x00" * 32)
    with pytest.raises(ValueError, match=r"a file that is neither"):
        M.open_model(other)
    with pytest.raises(FileNotFoundError, match=r"model: no such folder"):
        M.open_model(tmp_path / "nowhere")
    (dest / "config.json").write_text(json.dumps(config))
    monkeypatch.setattr(F, "machine_memory", lambda: 1024)
    with pytest.raises(ValueError, match=r"parameters \(counted from the config\) need .* more than this machine's"):
        M.open_model(dest)


def test_safetensors_elements_counts_what_the_header_declares(lab_folder):
    path = lab_folder[0] / "model.safetensors"
    assert F.safetensors_elements(path) == lab_folder[1].num_parameters()
    assert set(F.read_safetensors(path)) == set(lab_folder[1].state_dict())

"""GGUF files: the header read and checked before anything is de-quantised, the model read back equal to the
one written, the cached folder written whole or not at all, and every bad file named in one line."""

from __future__ import annotations

import json
import os
import struct

import pytest
import torch

pytest.importorskip("gguf")
pytest.importorskip("accelerate")
transformers = pytest.importorskip("transformers")

from _gguf import SENTENCES, byte_level_tokenizer, tiny_llama, write_blob, write_gguf  # noqa: E402
from headwise.models import gguf  # noqa: E402


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """(path of an extension-less GGUF blob, the model written, its tokenizer)."""
    return write_blob(tmp_path_factory.mktemp("blobs"), "sha256-0123abcd", seed=3)


def _ids(tok, text=SENTENCES[0]):
    return torch.tensor([tok.encode(text).ids])


def test_recognised_by_magic_bytes_whatever_the_name(written, tmp_path):
    path, _, _ = written
    assert gguf.is_gguf(path)
    other = tmp_path / "model.gguf"
    other.write_bytes(b"GGML" + path.read_bytes()[4:64])
    assert not gguf.is_gguf(other)
    assert not gguf.is_gguf(tmp_path)  # a folder


def test_header_counts_parameters_without_reading_weights(written):
    path, model, _ = written
    header = gguf.read_header(path)
    assert header.architecture == "llama"
    assert header.num_parameters == sum(p.numel() for p in model.parameters())
    assert header.get("block_count") == model.config.num_hidden_layers
    assert header.get("attention.head_count_kv") == model.config.num_key_value_heads
    assert header.tensors["blk.0.attn_q.weight"][0] == (32, 32)  # GGUF order: fastest dim first
    assert header.metadata["tokenizer.ggml.tokens"].startswith("<array of")


def test_model_read_back_equals_the_model_written(written):
    path, model, tok = written
    loaded, tokenizer = gguf.load_gguf(path)
    assert loaded.config.num_key_value_heads == model.config.num_key_value_heads
    assert getattr(loaded.config, "quantization_config", None) is None
    ids = _ids(tok)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, rtol=0, atol=1e-6)
    assert tokenizer(SENTENCES[1])["input_ids"] == tok.encode(SENTENCES[1]).ids


def test_cached_folder_is_written_once_and_opens_as_a_folder(written, tmp_path):
    path, model, tok = written
    folder = gguf.gguf_folder(path, root=tmp_path)
    assert folder.parent == tmp_path / "gguf" and folder.name == gguf.file_sha256(path)
    source = json.loads((folder / gguf.SOURCE_FILE).read_text())
    assert source["architecture"] == "llama" and source["bytes"] == path.stat().st_size
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert gguf.gguf_folder(path, root=tmp_path) == folder  # the second run reads nothing but the hash
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = _ids(tok)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, model(ids).logits, rtol=0, atol=1e-6)


def test_a_failed_write_leaves_nothing_in_the_cache(written, tmp_path, monkeypatch):
    path, _, _ = written

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(transformers.PreTrainedTokenizerBase, "save_pretrained", fail)
    with pytest.raises(OSError, match="No space left"):
        gguf.gguf_folder(path, root=tmp_path)
    assert [p.name for p in (tmp_path / "gguf").iterdir()] == []


def test_an_unwritable_cache_is_named(written, tmp_path):
    path, _, _ = written
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(OSError, match="cache directory cannot be written"):
        gguf.gguf_folder(path, root=blocker / "cache")


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("HEADWISE_CACHE_DIR", str(tmp_path / "hw"))
    assert gguf.cache_root() == tmp_path / "hw"
    monkeypatch.delenv("HEADWISE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert gguf.cache_root() == tmp_path / "xdg" / "headwise"


@pytest.mark.parametrize("keep", [3, 30, 200, 2_000, -1000, -1])
def test_truncated_files_are_named(written, tmp_path, keep):
    path, _, _ = written
    data = path.read_bytes()
    cut = tmp_path / "cut"
    cut.write_bytes(data[:keep] if keep > 0 else data[:keep])
    with pytest.raises(ValueError, match=r"(truncated|not a GGUF|corrupt)") as info:
        gguf.read_header(cut)
    assert str(cut) in str(info.value) and "\n" not in str(info.value)


def test_corrupt_headers_are_named(written, tmp_path):
    path, _, _ = written
    data = bytearray(path.read_bytes())
    cases = {
        "magic": (0, b"GGML"),
        "version": (4, struct.pack("<I", 9)),
        "counts": (8, struct.pack("<Q", 2**60)),
        "key length": (24, struct.pack("<Q", 2**40)),
    }
    for name, (at, patch) in cases.items():
        bad = bytearray(data)
        bad[at : at + len(patch)] = patch
        target = tmp_path / name.replace(" ", "-")
        target.write_bytes(bytes(bad))
        with pytest.raises(ValueError) as info:
            gguf.read_header(target)
        assert str(target) in str(info.value), name


def test_an_architecture_transformers_cannot_load_is_named(tmp_path):
    tok = byte_level_tokenizer()
    model = tiny_llama(tok.get_vocab_size())
    path = write_gguf(tmp_path / "odd.gguf", model, tok, architecture="nonesuch")
    with pytest.raises(ValueError, match="'nonesuch' cannot be loaded"):
        gguf.load_gguf(path)
    with pytest.raises(ValueError, match="'nonesuch' cannot be loaded"):
        gguf.gguf_folder(path, root=tmp_path / "cache")
    assert not (tmp_path / "cache" / "gguf").exists() or not any((tmp_path / "cache" / "gguf").iterdir())


def test_config_from_gguf_metadata_matches_the_model(written):
    path, model, _ = written
    config = gguf.gguf_config(path)
    for key in ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size", "vocab_size"):
        assert config[key] == getattr(model.config, key), key


def test_size_reads_a_gguf_file(written):
    from headwise import sizing

    path, model, _ = written
    arch = sizing.from_hf_config(path)
    assert arch.num_layers == model.config.num_hidden_layers
    assert arch.num_kv_heads == model.config.num_key_value_heads
    assert os.fspath(path) in arch.source

"""``headwise heads --model FILE.gguf`` (and extension-less blobs): the one door de-quantises once into the cache,
shows tokens as text, and refuses every bad file in one line with nothing half-written."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("gguf")
pytest.importorskip("accelerate")

from _cli_helpers import assert_user_error  # noqa: E402
from _gguf import byte_level_tokenizer, tiny_llama, write_gguf  # noqa: E402

TEXT = "When Mary and John went to the store,\nJohn gave a drink to"


@pytest.fixture(scope="module")
def blob(tmp_path_factory):
    tok = byte_level_tokenizer()
    path = tmp_path_factory.mktemp("ollama") / "sha256-5e1f00d"  # Ollama's blobs carry no extension
    return write_gguf(path, tiny_llama(tok.get_vocab_size(), seed=1), tok)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("HEADWISE_CACHE_DIR", str(root))
    return root


def test_a_gguf_blob_is_analysed_and_cached_once(run_cli, blob, cache, tmp_path):
    out = tmp_path / "out"
    first = run_cli("heads", "--model", str(blob), TEXT, "--out", str(out))
    assert first.code == 0, first.err
    [folder] = list((cache / "gguf").iterdir())
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    data = json.loads((out / "heads.json").read_text())
    sentence = data["sentence"]
    assert len(sentence["tokens"]) == len(sentence["pieces"]) == len(sentence["ids"])
    assert not any("Ġ" in t or "Ċ" in t for t in sentence["tokens"])  # text, not byte-level pieces
    assert any(p.startswith("Ġ") for p in sentence["pieces"])  # the raw pieces kept beside them
    assert "↵" in "".join(sentence["tokens"]) and "␣Mary" in sentence["tokens"]
    assert data["model"].startswith(blob.name)
    second = run_cli("heads", "--model", str(blob), TEXT, "--out", str(tmp_path / "again"))
    assert second.code == 0, second.err
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp  # opened from the cache
    again = json.loads((tmp_path / "again" / "heads.json").read_text())
    assert again["heads"] == data["heads"]


def test_no_cache_writes_nothing_to_the_cache(run_cli, blob, cache, tmp_path):
    outcome = run_cli("heads", "--model", str(blob), TEXT, "--no-cache", "--out", str(tmp_path / "out"))
    assert outcome.code == 0, outcome.err
    assert not cache.exists()


def test_no_cache_layer_by_layer_equals_the_cached_route(run_cli, blob, cache, tmp_path, monkeypatch):
    import headwise.models.layered as layered

    cached = run_cli("heads", "--model", str(blob), TEXT, "--out", str(tmp_path / "cached"))
    assert cached.code == 0, cached.err
    route = layered.memory_route  # a tiny file fits any budget whole: layer by layer whatever the budget
    monkeypatch.setattr(layered, "memory_route", lambda *a, **k: route(*a, **{**k, "by_layer": True}))
    files = sorted(p for p in cache.rglob("*") if p.is_file())
    out = run_cli(
        "heads", "--model", str(blob), TEXT, "--no-cache", "--max-memory", "4GB", "--out", str(tmp_path / "o")
    )
    assert out.code == 0, out.err
    assert "memory: layer by layer within 4.00 GB" in out.out
    assert sorted(p for p in cache.rglob("*") if p.is_file()) == files  # nothing written
    a = json.loads((tmp_path / "cached" / "heads.json").read_text())
    b = json.loads((tmp_path / "o" / "heads.json").read_text())
    assert b["memory"]["route"] == "layers" and a["sentence"] == b["sentence"]
    assert (tmp_path / "cached" / "heads.csv").read_text() == (tmp_path / "o" / "heads.csv").read_text()


@pytest.mark.slow  # the weights' circuits twice over a GGUF file: 4 s
def test_no_cache_layer_by_layer_composition_equals_the_cached_route(run_cli, blob, cache, tmp_path, monkeypatch):
    """``--composition`` on the file read without a cache, layer by layer (every layer's attention parts kept in,
    ``W_U W_E`` summed over slices of the embedding's rows): the scores of the cached float32 route."""
    import numpy as np

    import headwise.models.layered as layered

    cached = run_cli("heads", "--model", str(blob), TEXT, "--composition", "--out", str(tmp_path / "cached"))
    assert cached.code == 0, cached.err
    route = layered.memory_route
    monkeypatch.setattr(layered, "memory_route", lambda *a, **k: route(*a, **{**k, "by_layer": True}))
    out = run_cli("heads", "--model", str(blob), TEXT, "--composition", "--no-cache", "--max-memory", "4GB",
                  "--out", str(tmp_path / "o"))  # fmt: skip
    assert out.code == 0, out.err
    assert "memory: layer by layer within 4.00 GB" in out.out
    a = json.loads((tmp_path / "cached" / "heads.json").read_text())
    b = json.loads((tmp_path / "o" / "heads.json").read_text())
    assert b["memory"]["route"] == "layers"
    assert np.isfinite(np.array([h["copying"] for h in a["heads"]], dtype=np.float64)).all()
    for kind in ("q", "k", "v", "k_group", "v_group"):
        x, y = (np.array(r["composition"][kind], dtype=np.float64) for r in (a, b))
        np.testing.assert_allclose(y, x, rtol=1e-5, atol=2e-5, err_msg=kind)  # written to 5 decimals
    for name in ("copying", "copying_positive", "k_composition_max"):
        x, y = (np.array([h[name] for h in r["heads"]], dtype=np.float64) for r in (a, b))
        np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-7, err_msg=name)


def test_a_copy_too_big_for_the_disk_is_not_written(run_cli, blob, cache, tmp_path, monkeypatch):
    from headwise.models import gguf_stream

    monkeypatch.setattr(gguf_stream.shutil, "disk_usage", lambda p: type("Usage", (), {"free": 10**6})())
    out = run_cli("heads", "--model", str(blob), TEXT, "--out", str(tmp_path / "o"))
    assert out.code == 0, out.err
    warned = [line for line in out.err.splitlines() if line.startswith("headwise: warning: --model:")]
    assert len(warned) == 1 and "would not fit the free disk of the cache directory" in warned[0]
    assert not cache.exists() or not any(p.is_file() for p in cache.rglob("*"))


def test_a_truncated_gguf_is_refused_in_one_line(run_cli, blob, cache, tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(blob.read_bytes()[: blob.stat().st_size // 2])
    outcome = run_cli("heads", "--model", str(cut), TEXT, "--out", str(tmp_path / "out"))
    assert_user_error(outcome, "--model", str(cut), "truncated")
    assert not (tmp_path / "out").exists() and not cache.exists()


def test_a_file_that_is_neither_folder_nor_gguf_is_refused(run_cli, tmp_path):
    odd = tmp_path / "weights.bin"
    odd.write_bytes(b"\x00" * 64)
    assert_user_error(run_cli("heads", "--model", str(odd), TEXT, "--out", str(tmp_path / "o")), "neither", str(odd))


def test_an_architecture_transformers_cannot_load_is_named(run_cli, tmp_path, cache):
    tok = byte_level_tokenizer()
    path = write_gguf(tmp_path / "odd", tiny_llama(tok.get_vocab_size()), tok, architecture="nonesuch")
    assert_user_error(run_cli("heads", "--model", str(path), TEXT, "--out", str(tmp_path / "o")), "'nonesuch'")
    assert not (tmp_path / "o").exists()


def test_an_unwritable_cache_is_refused_and_nothing_is_written(run_cli, blob, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("HEADWISE_CACHE_DIR", str(blocker / "cache"))
    outcome = run_cli("heads", "--model", str(blob), TEXT, "--out", str(tmp_path / "o"))
    assert_user_error(outcome, "cache directory cannot be written", "--no-cache")
    assert not (tmp_path / "o").exists()


def test_more_parameters_than_memory_are_refused_before_de_quantising(run_cli, blob, cache, tmp_path, monkeypatch):
    from headwise.models import folder

    monkeypatch.setattr(folder, "machine_memory", lambda: 1024)
    outcome = run_cli("heads", "--model", str(blob), TEXT, "--out", str(tmp_path / "o"))
    assert_user_error(outcome, "counted from the GGUF header", "GiB")
    assert not cache.exists()


def test_size_reads_the_gguf_header(run_cli, blob):
    outcome = run_cli("size", "--config", str(blob))
    assert outcome.code == 0, outcome.err
    assert "GQA" in outcome.out

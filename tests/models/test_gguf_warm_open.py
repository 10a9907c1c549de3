"""A GGUF file whose cache entry is whole opens from that folder alone: the file hashed, its header not read again,
neither the ``gguf`` package nor transformers' GGUF loader imported — and the model opened is the one the full
route opens (same name, tokens, special ids and logits). A missing or damaged entry takes the full route."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("gguf")
pytest.importorskip("accelerate")
pytest.importorskip("transformers")

from _gguf import SENTENCES, write_blob  # noqa: E402
from headwise.models import gguf, open_model  # noqa: E402
from headwise.models.sources import _cached_gguf  # noqa: E402


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    return write_blob(tmp_path_factory.mktemp("blobs"), "sha256-warm0001", seed=7)


OPEN = """
import json, sys, torch
from headwise.models import open_model
hm = open_model(sys.argv[1])
ids = hm.tokenizer.encode(sys.argv[2]).ids
with torch.no_grad():
    logits = hm.model(torch.tensor([ids])).logits[0]
print(json.dumps({
    "gguf": "gguf" in sys.modules,
    "loader": "transformers.modeling_gguf_pytorch_utils" in sys.modules,
    "name": hm.name, "special_ids": list(hm.special_ids), "bos": hm.bos_id, "ids": ids,
    "logits": logits.tolist(),
}))
"""


@pytest.mark.slow  # two fresh interpreters (6 s): the fast suite keeps the cache tests of test_gguf_cache
def test_a_whole_entry_opens_without_the_gguf_loader_and_equals_the_full_route(written, tmp_path):
    path, model, tok = written
    root = tmp_path / "cache"
    folder = gguf.gguf_folder(path, root=root)  # the entry, written as the first run writes it
    proc = subprocess.run(
        [sys.executable, "-c", OPEN, str(path), SENTENCES[0]],
        capture_output=True, text=True, env={**os.environ, "HEADWISE_CACHE_DIR": str(root)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not got["gguf"] and not got["loader"]
    full = open_model(path, cache=False)  # the full route: the header read, de-quantised in memory
    assert got["name"] == full.name == path.name
    assert got["special_ids"] == list(full.special_ids) and got["bos"] == full.bos_id
    ids = full.tokenizer.encode(SENTENCES[0]).ids
    assert got["ids"] == ids == tok.encode(SENTENCES[0]).ids
    with torch.no_grad():
        want = full.model(torch.tensor([ids])).logits[0]
        written_logits = model(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(torch.tensor(got["logits"]), want, rtol=0, atol=1e-6)
    torch.testing.assert_close(want, written_logits, rtol=0, atol=1e-6)
    assert gguf.cached_entry(path, root=root).folder == folder


def test_no_entry_or_a_damaged_one_takes_the_full_route(written, tmp_path, monkeypatch):
    path, _, _ = written
    root = tmp_path / "cache"
    monkeypatch.setenv("HEADWISE_CACHE_DIR", str(root))
    assert gguf.cached_entry(path) is None and _cached_gguf(path) is None  # nothing written yet
    folder = gguf.gguf_folder(path)
    info = _cached_gguf(path)
    assert info is not None and info.folder == folder and info.kind == "hf" and info.name == path.name
    (folder / "tokenizer.json").unlink()  # damaged: the manifest lists it
    assert gguf.cached_entry(path) is None and _cached_gguf(path) is None
    assert _cached_gguf(tmp_path / "nothing-here") is None and _cached_gguf("no-such-bundled-name") is None
    plain = tmp_path / "plain.txt"
    plain.write_text("not a model")
    assert _cached_gguf(plain) is None

"""The de-quantised GGUF cache every rank and run shares heals: an entry that does not match its manifest (a file
truncated to half, a file missing, an older manifest over a truncated file) is rebuilt from the GGUF file with one
warning — equal to the model written — also when two processes meet the damaged entry at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest
import torch

pytest.importorskip("gguf")
pytest.importorskip("accelerate")
transformers = pytest.importorskip("transformers")

from _gguf import SENTENCES, write_blob  # noqa: E402
from headwise.models import gguf  # noqa: E402


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    return write_blob(tmp_path_factory.mktemp("blobs"), "sha256-feedbeef", seed=5)


def _truncate(path, keep=0.5):
    data = path.read_bytes()
    with open(path, "r+b") as fh:  # damage from outside headwise
        fh.truncate(int(len(data) * keep))


def _assert_model_equal(folder, model, tok):
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = torch.tensor([tok.encode(SENTENCES[0]).ids])
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, model(ids).logits, rtol=0, atol=1e-6)


def _heal(path, root):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        folder = gguf.gguf_folder(path, root=root)
    return folder, [w for w in caught if issubclass(w.category, gguf.CacheHealedWarning)]


def test_the_manifest_lists_every_file_with_its_length(written, tmp_path):
    path, _, _ = written
    folder = gguf.gguf_folder(path, root=tmp_path)
    files = json.loads((folder / gguf.SOURCE_FILE).read_text())["files"]
    on_disk = {p.name: p.stat().st_size for p in folder.iterdir() if p.name != gguf.SOURCE_FILE}
    assert files == on_disk and "model.safetensors" in files
    assert gguf.entry_problem(folder) is None


@pytest.mark.parametrize("damage", ["half", "missing tokenizer", "old manifest, half"])
def test_a_damaged_entry_is_rebuilt_with_one_warning(written, tmp_path, damage):
    path, model, tok = written
    folder = gguf.gguf_folder(path, root=tmp_path)
    if damage == "missing tokenizer":
        (folder / "tokenizer.json").unlink()
    else:
        _truncate(folder / "model.safetensors")
    if damage.startswith("old manifest"):  # written before the manifest listed its files
        source = json.loads((folder / gguf.SOURCE_FILE).read_text())
        del source["files"]
        (folder / gguf.SOURCE_FILE).write_text(json.dumps(source))
    assert gguf.entry_problem(folder) is not None
    again, healed = _heal(path, tmp_path)
    assert again == folder and len(healed) == 1
    assert "does not match its manifest" in str(healed[0].message) and "rebuilt from the GGUF file" in str(
        healed[0].message
    )
    assert gguf.entry_problem(folder) is None
    _assert_model_equal(folder, model, tok)
    assert _heal(path, tmp_path)[1] == []  # whole again: opened as it is
    assert sorted(p.name for p in (tmp_path / "gguf").iterdir()) == [folder.name]  # nothing left aside


@pytest.mark.slow
def test_the_command_heals_and_goes_on(written, tmp_path):
    path, _, _ = written
    folder = gguf.gguf_folder(path, root=tmp_path / "cache")
    _truncate(folder / "model.safetensors")
    proc = subprocess.run(
        [sys.executable, "-m", "headwise", "heads", "--model", str(path), SENTENCES[0], "--out", str(tmp_path / "o")],
        capture_output=True, text=True, env={**os.environ, "HEADWISE_CACHE_DIR": str(tmp_path / "cache")},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "manifest" in line]
    assert len(lines) == 1 and lines[0].startswith("headwise: warning: --model:"), proc.stderr
    assert (tmp_path / "o" / "heads.json").is_file() and gguf.entry_problem(folder) is None


HEAL = """
import sys, warnings
from pathlib import Path
from headwise.models import gguf
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    folder = gguf.gguf_folder(sys.argv[1], root=Path(sys.argv[2]))
print(sum(issubclass(w.category, gguf.CacheHealedWarning) for w in caught), folder.name)
"""


@pytest.mark.slow
def test_two_processes_meeting_a_damaged_entry_rebuild_it_once(written, tmp_path):
    path, model, tok = written
    folder = gguf.gguf_folder(path, root=tmp_path)
    _truncate(folder / "model.safetensors")
    procs = [
        subprocess.Popen([sys.executable, "-c", HEAL, str(path), str(tmp_path)], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sorted(int(o[0]) for o in outs) == [0, 1] and {o[1] for o in outs} == {folder.name}
    _assert_model_equal(folder, model, tok)

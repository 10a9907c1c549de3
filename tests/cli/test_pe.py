"""``headwise pe``: the first article's Figure 2 as a file; user mistakes exit 2 with one line."""

from __future__ import annotations

import pytest

from _cli_helpers import assert_user_error
from _pictures import assert_not_blank, read_png


def test_pe_writes_figure_2(run_cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    outcome = run_cli("pe", "--max-len", "50", "--d-model", "64", "--out", "pe.png")
    assert outcome.code == 0, outcome.err
    image = read_png(tmp_path / "pe.png")
    assert image.shape[:2] == (500, 800)
    assert_not_blank(image)
    assert "pe.png" in outcome.out and "50 positions × 64 dimensions" in outcome.out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pe.png"]  # no temporary left


def test_pe_defaults_and_new_folders(run_cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run_cli("pe").code == 0
    read_png(tmp_path / "pe.png")
    outcome = run_cli("pe", "--max-len", "8", "--d-model", "4", "--out", str(tmp_path / "a" / "b" / "small.svg"))
    assert outcome.code == 0, outcome.err
    assert b"<svg" in (tmp_path / "a" / "b" / "small.svg").read_bytes()[:2000]


@pytest.mark.parametrize(
    "args, words",
    [
        (["--d-model", "63"], ["--d-model", "63", "even"]),
        (["--d-model", "0"], ["--d-model"]),
        (["--max-len", "0"], ["--max-len"]),
        (["--max-len", "x"], ["--max-len"]),
        (["--out", "pe.jpg"], ["--out", ".png"]),
        (["--bogus"], ["--bogus"]),
    ],
)
def test_pe_user_mistakes(run_cli, tmp_path, monkeypatch, args, words):
    monkeypatch.chdir(tmp_path)
    assert_user_error(run_cli("pe", *args), *words)
    assert list(tmp_path.iterdir()) == []


def test_pe_unwritable_out(run_cli, tmp_path):
    (tmp_path / "file").write_text("not a folder")
    assert_user_error(run_cli("pe", "--out", str(tmp_path / "file" / "pe.png")), "--out")
    (tmp_path / "folder.png").mkdir()
    assert_user_error(run_cli("pe", "--out", str(tmp_path / "folder.png")), "--out", "folder")

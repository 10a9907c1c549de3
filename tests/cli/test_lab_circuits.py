"""``headwise lab circuits``: a tiny run writes circuits.json and circuits.png whole and exits 1 (nothing confirmed);
mistakes exit 2 with one line and write nothing."""

from __future__ import annotations

import json

import pytest

from _cli_helpers import assert_user_error
from _pictures import assert_not_blank, read_png
from headwise.lab.circuit_suite import suite_methods


def test_the_command_writes_json_and_png(run_cli, tmp_path):
    out = tmp_path / "suite"
    outcome = run_cli("lab", "circuits", "--out", str(out), "--tasks", "offset", "--steps", "2", "--seed", "1")
    assert outcome.code == 1, outcome.err  # not confirmed: said, files written, exit 1
    assert "NOT CONFIRMED" in outcome.out and "offset: exact patching" in outcome.err
    assert sorted(p.name for p in out.iterdir()) == ["circuits.json", "circuits.png"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["suite"]  # no temporary left
    data = json.loads((out / "circuits.json").read_text())
    assert data["methods"] == suite_methods() and list(data["tasks"]) == ["offset"] and data["seed"] == 1
    assert_not_blank(read_png(out / "circuits.png"))


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--tasks", "sum"], ["--tasks", "sum"]),
        (["--tasks", "offset,offset"], ["--tasks"]),
        (["--steps", "0"], ["--steps", "0"]),
        (["--threads", "0"], ["--threads", "0"]),
        (["--seed", "-1"], ["seed", "-1"]),
        (["--out", "FILE"], ["--out", "not a folder"]),
    ],
)
def test_mistakes_exit_2_with_one_line(run_cli, tmp_path, monkeypatch, argv, words):
    (tmp_path / "FILE").write_text("x")
    monkeypatch.chdir(tmp_path)
    full = ["lab", "circuits", *(["--out", "OUT"] if "--out" not in argv else []), *argv]
    assert_user_error(run_cli(*full), *words)
    assert not (tmp_path / "OUT").exists()

"""``headwise circuit --bootstrap N``: circuit.json's bootstrap and the printed line; its mistakes one line, exit 2,
nothing written."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from _cli_helpers import assert_user_error  # noqa: E402
from _decoders import save_decoder  # noqa: E402

PAIRS = [
    ("the cat sat on the mat and the dog", "the dog sat on the mat and the dog", "cat", "dog"),
    ("a dog ran to the tree and the cat", "a cat ran to the tree and the cat", "dog", "cat"),
    ("a cat ran to the tree and the dog", "a dog ran to the tree and the dog", "cat", "dog"),
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_decoder(tmp_path_factory.mktemp("boot") / "llama", "llama", init=0.5)


def _args(folder, out, *extra):
    argv = ["circuit", "--model", str(folder), "--out", str(out)]
    for clean, corrupted, answer, wrong in PAIRS:
        argv += ["--clean", clean, "--corrupted", corrupted, "--answer", answer, "--wrong", wrong]
    return (*argv, *extra)


def test_the_command_reports_the_bootstrap(run_cli, folder, tmp_path):
    out = tmp_path / "o"
    outcome = run_cli(*_args(folder, out, "--bootstrap", "20", "--seed", "2", "--exact-top", "0"))
    assert outcome.code == 0, outcome.err
    report = json.loads((out / "circuit.json").read_text())
    boot = report["bootstrap"]
    assert boot["resamples"] == 20 and boot["seed"] == 2 and boot["pairs"] == len(PAIRS)
    said = " ".join(outcome.out.split())
    assert f"bootstrap (20 resamples of the {len(PAIRS)} pairs): the {boot['size']}-edge circuit's Jaccard" in said
    assert f"{boot['circuit_jaccard']:.2f}" in said


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (("--bootstrap", "1"), ("--bootstrap", "at least 2", "1")),
        (("--bootstrap", "-3"), ("--bootstrap",)),
    ],
)
def test_bad_bootstrap_options_are_one_line(run_cli, folder, tmp_path, extra, words):
    out = tmp_path / "o"
    assert_user_error(run_cli(*_args(folder, out, *extra)), *words)
    assert not out.exists() or not any(out.iterdir())

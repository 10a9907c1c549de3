"""``headwise qk``: the files hold what the library computes, the table names tokens as text, and every mistake
is one line, exit 2, with nothing written."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from _cli_helpers import assert_user_error  # noqa: E402
from _decoders import save_decoder  # noqa: E402

TEXT = "the cat sat on the mat and the dog sat on the"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_decoder(tmp_path_factory.mktemp("qk") / "llama", "llama", init=0.5)


def test_the_files_hold_what_the_library_computes(run_cli, folder, tmp_path):
    from headwise.circuits import qk_attribution
    from headwise.models import open_model

    out = tmp_path / "out"
    outcome = run_cli("qk", "--model", str(folder), "--text", TEXT, "--head", "1.2", "--query", "-1", "--key", "3",
                      "--out", str(out), "--top", "5")  # fmt: skip
    assert outcome.code == 0, outcome.err
    assert sorted(p.name for p in out.iterdir()) == ["qk.json", "qk.png"]
    report = json.loads((out / "qk.json").read_text())
    hm = open_model(folder)
    ids = hm.tokenizer.encode(TEXT).ids
    r = qk_attribution(hm, torch.tensor(ids), 1, 2, len(ids) - 1, 3)
    assert report["ids"] == list(ids) and report["query"] == len(ids) - 1 and report["key"] == 3
    assert report["tokens"] == hm.token_texts(ids)
    torch.testing.assert_close(torch.tensor(report["scores"], dtype=torch.float64), r.scores)
    torch.testing.assert_close(torch.tensor(report["weights"], dtype=torch.float64), r.weights)
    assert report["top_terms"] == r.to_page(5)["terms"]
    c = r.key_index()
    assert [p["term"] for p in report["query_parts"]] == pytest.approx(r.query_terms[:, c].tolist())
    assert [p["effect"] for p in report["key_parts"]] == pytest.approx(r.key_effect[:, c].tolist())
    assert sum(p["term"] for p in report["key_parts"]) == pytest.approx(report["scores"][c], abs=1e-4)
    # the printed table: the top terms with the embedding named by its token's text
    top = r.top_terms(5)
    assert f"{top[0][2]:+.4f}" in outcome.out
    tokens = hm.token_texts(ids)
    if any(a == "embed" for a, _, _ in top):
        assert f"embed {tokens[len(ids) - 1]!r}" in outcome.out
    assert repr(tokens[3]) in outcome.out


def test_the_default_key_is_the_heaviest(run_cli, folder, tmp_path):
    out = tmp_path / "out"
    outcome = run_cli("qk", "--model", str(folder), "--text", TEXT, "--head", "0.1", "--query", "5", "--out", str(out))
    assert outcome.code == 0, outcome.err
    report = json.loads((out / "qk.json").read_text())
    assert report["keys"] == list(range(6))
    assert report["key"] == max(range(6), key=lambda k: report["weights"][k])


@pytest.mark.parametrize(
    "extra, words",
    [
        (("--head", "2.0", "--query", "1"), ["--head", "2"]),
        (("--head", "1.4", "--query", "1"), ["--head", "4"]),
        (("--head", "x", "--query", "1"), ["--head", "LAYER.HEAD"]),
        (("--head", "1.0", "--query", "40"), ["--query", "40"]),
        (("--head", "1.0", "--query", "2", "--key", "5"), ["--key", "5"]),
        (("--head", "1.0", "--query", "2", "--text", "  "), ["--text"]),
    ],
)
def test_mistakes_are_one_line_and_nothing_is_written(run_cli, folder, tmp_path, extra, words):
    out = tmp_path / "out"
    args = dict(zip(extra[::2], extra[1::2]))
    text = args.pop("--text", TEXT)
    rest = [x for kv in args.items() for x in kv]
    outcome = run_cli("qk", "--model", str(folder), "--text", text, *rest, "--out", str(out))
    assert_user_error(outcome, *words)
    assert not out.exists()


def test_an_out_that_is_a_file_is_refused(run_cli, folder, tmp_path):
    out = tmp_path / "file"
    out.write_text("x")
    outcome = run_cli("qk", "--model", str(folder), "--text", TEXT, "--head", "0.0", "--query", "2", "--out", str(out))
    assert_user_error(outcome, "--out")
    assert out.read_text() == "x"

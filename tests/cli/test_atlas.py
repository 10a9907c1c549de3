"""``headwise atlas`` on tiny random decoders: the files, the page, the printed summary, the library face, and bad
input refused in one line with nothing written."""

from __future__ import annotations

import json

import pytest

from _cli_helpers import assert_user_error
from _decoders import save_decoder
from headwise.viz.atlas_page import check_atlas

TEXTS = [
    "the cat sat on the mat and the dog ran to the tree .",
    "a red tree and a blue house , the big dog saw the cat .",
    "one two three , one two three , the cat sat .",
    "in the beginning god created the heavens and the earth .",
    "it was good , and the night was day .",
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_decoder(tmp_path_factory.mktemp("atlas") / "llama", "llama", init=0.5, seed=1)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "texts.txt"
    path.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    return path


def test_atlas_writes_every_head_and_the_page(run_cli, folder, corpus, tmp_path):
    out = tmp_path / "atlas"
    got = run_cli("atlas", "--model", str(folder), "--corpus", str(corpus), "--out", str(out), "--top", "3")
    assert got.code == 0, got.err
    data = json.loads((out / "atlas.json").read_text(encoding="utf-8"))
    check_atlas(data)  # the page's own check of the format
    assert data["format"] == "headwise.atlas/1"
    assert [h["id"] for h in data["heads"]] == [f"L{i}.H{h}" for i in range(2) for h in range(4)]
    assert data["corpus"]["texts"] == len(TEXTS)
    for h in data["heads"]:
        assert 0 < len(h["outputs"]) <= 3
        assert h["writes"]["raises"] and h["writes"]["lowers"]
        assert h["loss_effect"]["exact"] is False and "estimate" in h["loss_effect"]["label"]
        assert h["loss_effect"]["stderr"] >= 0
        imp = h["importance"]
        assert imp is not None and (imp["exact"] or "estimate" in imp["label"])
        assert h["partners"] is not None
    assert data["importance"]["measured"] >= 1
    loss = data["loss_effect"]  # a small corpus: every predicted token in the sample
    assert loss["stride"] == 1 and loss["sample_tokens"] == loss["predicted_tokens"] > loss["tokens"] > 0
    for h in data["heads"]:  # the evidence: every share of a row accounted for, contexts pointing into their tokens
        off = h["offsets"]
        assert off["start"] == 0 and len(off["shares"]) == 32  # a decoder: keys up to the query (its mask explicit)
        assert sum(off["shares"]) + off["beyond"] + off["first"] == pytest.approx(1, abs=1e-4)
        for c in h["contexts"]:
            assert 0 <= c["key"] < c["query"] < len(c["tokens"]) and 0 < c["weight"] <= 1
            assert c["position"] >= 7  # rows that see fewer than 8 keys are no context
        assert all(r["score"] >= r["threshold"] for r in h["roles"])
        assert h["role"] == (h["roles"][0]["name"] if h["roles"] else "other")
    page = (out / "atlas.html").read_text(encoding="utf-8")
    assert "headwise.atlas/1" in page
    # the screen: each role counted, not one row per head
    lines = got.out.strip().splitlines()
    assert len(lines) < 16
    assert any("importance:" in line for line in lines)
    roles = [line for line in lines if line.startswith("  ")]
    assert sum(int(line[: line.rindex("  ")].split()[-1]) for line in roles) == 8  # every head counted once


def test_library_face(folder, corpus):
    import headwise
    from headwise.models import open_model

    hm = open_model(str(folder))
    got = headwise.atlas(hm, str(corpus), importance=False, composition=False, top=2)
    assert isinstance(got, headwise.Atlas)
    assert len(got) == 8
    assert got["L1.H2"] is got[1, 2]
    assert got[1, 2]["importance"] is None and got[1, 2]["partners"] is None
    with pytest.raises(KeyError, match="L1.H3"):
        got["L5.H0"]
    assert "<iframe" in got._repr_html_()
    assert "#L0.H1" in got.card("L0.H1").page


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--top", "0"], ["--top"]),
        (["--top", "65"], ["--top", "65"]),
        (["--ablation", "half"], ["--ablation", "half"]),
        (["--corpus", "missing.txt"], ["--corpus", "missing.txt"]),
        (["--max-memory", "lots"], ["--max-memory"]),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(run_cli, folder, corpus, tmp_path, argv, words):
    out = tmp_path / "atlas"
    got = run_cli("atlas", "--model", str(folder), "--corpus", str(corpus), "--out", str(out), *argv)
    assert_user_error(got, *words)
    assert not out.exists()


def test_an_encoder_or_a_model_without_tokenizer_is_refused(run_cli, tmp_path, corpus):
    bare = save_decoder(tmp_path / "bare", "llama", tokenizer=False, init=0.5)
    got = run_cli("atlas", "--model", str(bare), "--corpus", str(corpus), "--out", str(tmp_path / "o"))
    assert_user_error(got, "--model", "tokenizer")
    assert not (tmp_path / "o").exists()


def test_an_encoder_atlas_from_its_full_maps(run_cli, corpus, tmp_path):
    """The bundled MiniLM: the evidence read from its full maps (keys on both sides: offsets from −32), no written
    tokens (no unembedding), the importance by the embedding's turning rate."""
    from headwise.models.checkpoint import default_model_path

    out = tmp_path / "atlas"
    got = run_cli("atlas", "--model", str(default_model_path()), "--corpus", str(corpus), "--out", str(out),
                  "--top", "2", "--importance-sentences", "3")  # fmt: skip
    assert got.code == 0, got.err
    data = json.loads((out / "atlas.json").read_text(encoding="utf-8"))
    check_atlas(data)
    assert data["model"]["kind"] == "encoder" and len(data["heads"]) == 72
    for h in data["heads"]:
        off = h["offsets"]
        assert off["start"] == -32 and sum(off["shares"]) + off["beyond"] + off["first"] == pytest.approx(1, abs=1e-4)
        assert h["writes"] is None and h["ov"] is None and h["partners"] is None
        assert h["importance"] is not None
        for c in h["contexts"]:
            assert c["tokens"][c["key"]] and c["key"] != c["query"]
    assert "separator" in data["heads"][0]["offsets"]["marks"]


def test_a_model_opened_layer_by_layer_is_refused_in_one_line(run_cli, folder, corpus, tmp_path, monkeypatch):
    """The atlas reads every layer's parts within each batch: a model streamed layer by layer is refused in the
    sentence every whole-model tool says, nothing written."""
    import headwise.models.layered as layered

    route = layered.memory_route
    monkeypatch.setattr(layered, "memory_route", lambda *a, **k: route(*a, **{**k, "by_layer": True}))
    out = tmp_path / "atlas"
    got = run_cli("atlas", "--model", str(folder), "--corpus", str(corpus), "--out", str(out), "--max-memory", "20GB")
    assert_user_error(got, "the atlas", "layer by layer")
    assert not out.exists()

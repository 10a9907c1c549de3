"""``headwise circuit``: the files hold what the library finds, pairs from options or a file, every mistake is
one line, exit 2, with nothing written."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from _cli_helpers import assert_user_error  # noqa: E402
from _decoders import save_decoder  # noqa: E402
from _pictures import assert_not_blank, read_png  # noqa: E402

PAIRS = [
    ("the cat sat on the mat and the dog", "the dog sat on the mat and the dog", "cat", "dog"),
    ("a dog ran to the tree and the cat", "a cat ran to the tree and the cat", "dog", "cat"),
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_decoder(tmp_path_factory.mktemp("circuit") / "llama", "llama", init=0.5)  # GQA: 4 heads, 2 groups


def _args(folder, out, *extra, pairs=PAIRS):
    argv = ["circuit", "--model", str(folder), "--out", str(out)]
    for clean, corrupted, answer, wrong in pairs:
        argv += ["--clean", clean, "--corrupted", corrupted, "--answer", answer, "--wrong", wrong]
    return (*argv, *extra)


def _library(folder, pairs=PAIRS, **options):
    from headwise.circuits import find_circuit
    from headwise.models import open_model

    hm = open_model(folder)
    c = torch.tensor([hm.tokenizer.encode(p[0]).ids for p in pairs])
    x = torch.tensor([hm.tokenizer.encode(p[1]).ids for p in pairs])
    answer = [hm.tokenizer.token_to_id(p[2]) for p in pairs]
    wrong = [hm.tokenizer.token_to_id(p[3]) for p in pairs]
    return find_circuit(hm, c, x, answer=answer, wrong=wrong, **options).to_dict()


def _same_circuit(report: dict, expected: dict) -> None:
    """The command's circuit.json against the library's own result, scores to float32 rounding."""
    assert [n["id"] for n in report["nodes"]] == [n["id"] for n in expected["nodes"]]
    assert [(e["sender"], e["receiver"], e["input"]) for e in report["edges"]] == [
        (e["sender"], e["receiver"], e["input"]) for e in expected["edges"]
    ]
    for method in {m for e in expected["edges"] for m in e["scores"]}:
        got = [e["scores"].get(method, np.nan) for e in report["edges"]]
        want = [e["scores"].get(method, np.nan) for e in expected["edges"]]
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-4, equal_nan=True)
    assert report["circuit"]["edges"] == expected["circuit"]["edges"]
    assert report["circuit"]["nodes"] == expected["circuit"]["nodes"]
    assert report["faithfulness"]["sizes"] == expected["faithfulness"]["sizes"]
    np.testing.assert_allclose(
        np.array(report["faithfulness"]["recovered"], dtype=float),
        np.array(expected["faithfulness"]["recovered"], dtype=float),
        atol=1e-4,
        rtol=1e-4,
    )


def test_the_files_hold_what_the_library_finds(run_cli, folder, tmp_path):
    out = tmp_path / "out"
    outcome = run_cli(*_args(folder, out, "--exact-top", "6"))
    assert outcome.code == 0, outcome.err
    assert sorted(p.name for p in out.iterdir()) == ["circuit.html", "circuit.json", "circuit.png"]
    report = json.loads((out / "circuit.json").read_text())
    expected = _library(folder, exact_top=6)
    _same_circuit(report, expected)
    assert report["method"] == "eap" and report["metric"] == "logit_diff" and report["ablation"] == "corrupted"
    assert report["prompts"] == [dict(zip(("clean", "corrupted", "answer", "wrong"), p)) for p in PAIRS]
    assert sum("exact" in e["scores"] for e in report["edges"]) == 6
    assert any(n["kind"] == "kv" for n in report["nodes"])  # GQA: key/value groups are receivers
    assert report["node_details"]["L1.H2"]["pattern"] == expected["node_details"]["L1.H2"]["pattern"]
    image = read_png(out / "circuit.png")
    assert_not_blank(image)
    html = (out / "circuit.html").read_text(encoding="utf-8")
    blob = re.search(r'<script type="application/json" id="circuit-data">(.*?)</script>', html, re.S).group(1)
    page = json.loads(blob)
    assert len(page["senders"]) == len(report["edges"]) and page["circuit_edges"] == report["circuit"]["edges"]
    assert "https://" not in html and "http://" not in html
    assert f"circuit: {len(report['circuit']['edges'])} edges" in outcome.out
    assert "wrote circuit.json, circuit.png, circuit.html" in outcome.out
    assert "Spearman" in outcome.out


def test_a_pairs_file_gives_the_same_circuit_as_the_options(run_cli, folder, tmp_path):
    lines = [json.dumps(dict(zip(("clean", "corrupted", "answer", "wrong"), p))) for p in PAIRS]
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(lines[0] + "\n\n" + lines[1] + "\n", encoding="utf-8")
    a, b = tmp_path / "a", tmp_path / "b"
    assert run_cli(*_args(folder, a, "--exact-top", "0")).code == 0
    assert (
        run_cli("circuit", "--model", str(folder), "--out", str(b), "--pairs", str(pairs), "--exact-top", "0").code == 0
    )
    ra, rb = (json.loads((p / "circuit.json").read_text()) for p in (a, b))
    assert ra["prompts"] == rb["prompts"]
    _same_circuit(rb, ra)
    assert ra["agreement"] is None and all(list(e["scores"]) == ["eap"] for e in ra["edges"])


def test_an_answer_given_once_serves_every_pair(run_cli, folder, tmp_path):
    pairs = [
        ("the cat sat on the mat", "the dog sat on the mat"),
        ("the cat ran to the tree", "the dog ran to the tree"),
    ]
    argv = ["circuit", "--model", str(folder), "--out", str(tmp_path / "out"), "--answer", "mat", "--wrong", "tree"]
    for clean, corrupted in pairs:
        argv += ["--clean", clean, "--corrupted", corrupted]
    assert run_cli(*argv, "--exact-top", "0").code == 0
    report = json.loads((tmp_path / "out" / "circuit.json").read_text())
    assert [(p["answer"], p["wrong"]) for p in report["prompts"]] == [("mat", "tree"), ("mat", "tree")]
    _same_circuit(report, _library(folder, [(*p, "mat", "tree") for p in pairs], exact_top=0))


@pytest.mark.slow
def test_exact_method_mean_ablation_and_probability(run_cli, folder, tmp_path):
    out = tmp_path / "out"
    extra = ("--method", "exact", "--ablation", "mean", "--metric", "prob", "--fraction", "0.5", "--batch-size", "7")
    outcome = run_cli(*_args(folder, out, *extra, pairs=PAIRS[:1]))
    assert outcome.code == 0, outcome.err
    report = json.loads((out / "circuit.json").read_text())
    assert (report["method"], report["ablation"], report["metric"]) == ("exact", "mean", "prob")
    assert report["circuit"]["fraction"] == 0.5
    assert all(list(e["scores"]) == ["exact"] for e in report["edges"])
    _same_circuit(report, _library(folder, PAIRS[:1], method="exact", ablation="mean", metric="prob", fraction=0.5))


def test_eap_ig_with_kl(run_cli, folder, tmp_path):
    out = tmp_path / "out"
    outcome = run_cli(*_args(folder, out, "--method", "eap-ig", "--steps", "3", "--metric", "kl", "--exact-top", "0"))
    assert outcome.code == 0, outcome.err
    report = json.loads((out / "circuit.json").read_text())
    assert report["method"] == "eap-ig" and report["steps"] == 3 and report["metric"] == "kl"
    _same_circuit(report, _library(folder, method="eap-ig", steps=3, metric="kl", exact_top=0))


ONE = PAIRS[:1]


@pytest.mark.parametrize(
    "pairs, extra, words",
    [
        (ONE, ["--method", "acdc"], ["--method", "eap, eap-ig, atp*, exact", "'acdc'"]),
        (ONE, ["--metric", "loss"], ["--metric", "'loss'"]),
        (ONE, ["--ablation", "zero"], ["--ablation", "corrupted, mean", "'zero'"]),
        (ONE, ["--fraction", "0"], ["--fraction", "(0, 1]", "0.0"]),
        (ONE, ["--fraction", "1.5"], ["--fraction", "1.5"]),
        (ONE, ["--metric", "kl"], ["--metric", "'kl'", "--method eap-ig"]),
        (ONE, ["--steps", "0"], ["--steps"]),
        ([], [], ["--clean, --corrupted, --answer, --wrong: missing"]),
        (ONE, ["--clean", "the dog sat on the mat and the cat"], ["--corrupted", "given 1 times for 2 --clean"]),
        (ONE, ["--pairs", "x.jsonl"], ["--pairs", "given with --clean, --corrupted, --answer, --wrong"]),
        (
            [("the cat sat on the mat", "the dog sat on the mat and", "cat", "dog")],
            [],
            ["--corrupted", "8 tokens, but --clean has 7"],
        ),
        (
            [PAIRS[0], ("the cat sat", "the dog sat", "cat", "dog")],
            [],
            ["--clean (pair 2 of the options)", "4 tokens, but the first pair has 10"],
        ),
        ([(*PAIRS[0][:2], "cat dog", "dog")], [], ["--answer", "'cat dog' encodes to 2 tokens"]),
        ([(*PAIRS[0][:2], "cat", "zebra")], [], ["--wrong", "'zebra' is not in the vocabulary"]),
        ([(*PAIRS[0][:2], "cat", "cat")], [], ["--wrong", "'cat' is the same token as --answer"]),
        ([("  ", "  ", "cat", "dog")], [], ["--clean", "expected a non-empty text"]),
    ],
)
def test_bad_options_and_pairs(run_cli, folder, tmp_path, pairs, extra, words):
    out = tmp_path / "out"
    assert_user_error(run_cli(*_args(folder, out, *extra, pairs=pairs)), *words)
    assert not out.exists()


def test_answers_given_a_wrong_number_of_times(run_cli, folder, tmp_path):
    out = tmp_path / "out"
    argv = ["circuit", "--model", str(folder), "--out", str(out)]
    for clean, corrupted, _, _ in PAIRS + [PAIRS[0]]:
        argv += ["--clean", clean, "--corrupted", corrupted]
    argv += ["--answer", "cat", "--answer", "dog", "--wrong", "dog"]
    assert_user_error(run_cli(*argv), "--answer", "given 2 times for 3 pairs", "once, or once per pair")
    assert not out.exists()


@pytest.mark.parametrize(
    "text, words",
    [
        (
            '{"clean": "the cat", "corrupted": "the dog", "answer": "cat"}\n',
            ["line 1", "clean, corrupted, answer, wrong"],
        ),
        ('\n{"clean": "the cat", "corrupted": "the dog", "answer": "cat", "wrong": 3}\n', ["line 2", "strings"]),
        ("clean\tcorrupted\tanswer\twrong\n", ["line 1", "is not JSON"]),
        ("\n\n", ["holds no prompt pair"]),
        ('{"clean": "the cat sat", "corrupted": "the dog sat on", "answer": "cat", "wrong": "dog"}', ["pair 1 of"]),
    ],
)
def test_a_bad_pairs_file(run_cli, folder, tmp_path, text, words):
    pairs, out = tmp_path / "pairs.jsonl", tmp_path / "out"
    pairs.write_text(text, encoding="utf-8")
    assert_user_error(
        run_cli("circuit", "--model", str(folder), "--out", str(out), "--pairs", str(pairs)),
        "--pairs" if "pair 1" not in words[0] else "--corrupted",
        *words,
    )
    assert not out.exists()


def test_missing_files_and_models(run_cli, folder, tmp_path):
    out = tmp_path / "out"
    missing = tmp_path / "none.jsonl"
    assert_user_error(
        run_cli("circuit", "--model", str(folder), "--out", str(out), "--pairs", str(missing)), "--pairs", "cannot read"
    )
    assert_user_error(run_cli(*_args(tmp_path / "no-model", out)), "--model")
    bare = save_decoder(tmp_path / "bare", "llama", tokenizer=False)
    assert_user_error(run_cli(*_args(bare, out)), "--model", "no tokenizer.json")
    (tmp_path / "file").write_text("x")
    assert_user_error(run_cli(*_args(folder, tmp_path / "file")), "--out", "is not a folder")
    assert not out.exists()


def test_the_folder_appears_whole_or_not_at_all(run_cli, folder, tmp_path, monkeypatch):
    import headwise.viz.circuit_page as page

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(page, "write_circuit_page", fail)
    out = tmp_path / "out"
    outcome = run_cli(*_args(folder, out, "--exact-top", "0", pairs=ONE))
    assert outcome.code == 2 and "Traceback" not in outcome.err
    last = outcome.err.strip().splitlines()[-1]  # after the progress bars
    assert last.startswith("headwise: error: --out: cannot write") and "No space left on device" in last
    assert list(tmp_path.iterdir()) == []


def test_the_page_carries_the_qk_attribution_of_the_circuits_strongest_heads(run_cli, folder, tmp_path):
    from headwise.circuits import qk_attribution
    from headwise.commands.circuit import circuit_heads
    from headwise.models import open_model

    out = tmp_path / "out"
    assert run_cli(*_args(folder, out, "--exact-top", "0", "--qk-heads", "3")).code == 0
    report = json.loads((out / "circuit.json").read_text())
    heads = circuit_heads(report, 3)
    assert heads, "the tiny circuit holds heads"
    with_qk = {node for node, detail in report["node_details"].items() if "qk" in detail}
    assert with_qk == {h["id"] for h in heads}
    hm = open_model(str(folder))
    ids = hm.encode([PAIRS[0][0]]).ids[0]
    for h in heads:  # the page's terms are the library's, at the first clean prompt's last position
        expected = qk_attribution(hm, ids, h["layer"], h["head"], len(ids) - 1).to_page()
        got = report["node_details"][h["id"]]["qk"]
        assert (got["query"], got["key"]) == (expected["query"], expected["key"])
        assert [(t["query_part"], t["key_part"]) for t in got["terms"]] == [
            (t["query_part"], t["key_part"]) for t in expected["terms"]
        ]
        np.testing.assert_allclose(
            [t["value"] for t in got["terms"]], [t["value"] for t in expected["terms"]], rtol=1e-5, atol=1e-6
        )
    html = (out / "circuit.html").read_text(encoding="utf-8")
    blob = re.search(r'<script type="application/json" id="circuit-data">(.*?)</script>', html, re.S).group(1)
    assert "qk" in json.dumps(json.loads(blob))

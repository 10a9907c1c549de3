"""``headwise circuit --mib DIR`` writes the run in MIB's format, ``--evaluate FILE`` scores a MIB-format file (the
run's own exact scores beat random ones), and every bad file is one line, exit 2, with nothing written."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from _cli_helpers import assert_user_error  # noqa: E402
from _decoders import SPECIALS, WORDS, save_decoder  # noqa: E402

PAIRS = [
    ("the cat sat on the mat and the dog", "the dog sat on the mat and the dog"),
    ("a dog ran to the tree and the cat", "a cat ran to the tree and the cat"),
]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny GPT-2 (no GQA), and the answer and wrong words the corruption moves most on the pairs."""
    from headwise.models import open_model

    folder = save_decoder(tmp_path_factory.mktemp("mib") / "gpt2", "gpt2", init=0.5)
    hm = open_model(folder)
    clean = torch.tensor([hm.tokenizer.encode(c).ids for c, _ in PAIRS])
    corrupted = torch.tensor([hm.tokenizer.encode(x).ids for _, x in PAIRS])
    with torch.no_grad():
        moved = (hm.logits(clean)[:, -1] - hm.logits(corrupted)[:, -1]).mean(0)[len(SPECIALS) :]  # words only
    answer, wrong = WORDS[int(moved.argmax())], WORDS[int(moved.argmin())]
    return folder, answer, wrong


def _args(setup, out, *extra):
    folder, answer, wrong = setup
    argv = ["circuit", "--model", str(folder), "--out", str(out), "--answer", answer, "--wrong", wrong]
    for clean, corrupted in PAIRS:
        argv += ["--clean", clean, "--corrupted", corrupted]
    return (*argv, "--exact-top", "0", *extra)


def test_mib_files_and_evaluate(run_cli, setup, tmp_path):
    out, mib = tmp_path / "out", tmp_path / "mib"
    outcome = run_cli(*_args(setup, out, "--method", "exact", "--mib", str(mib)))
    assert outcome.code == 0, outcome.err
    report = json.loads((out / "circuit.json").read_text())
    assert "MIB's curve" in outcome.out and f"CPR {report['mib']['cpr']:.3f}" in outcome.out
    names = sorted(p.name for p in mib.iterdir())
    assert names == sorted(["importances.json"] + [f"circuit_{f:g}.json" for f in report["mib"]["fractions"]])
    own = json.loads((mib / "importances.json").read_text())
    assert [own["edges"][n]["score"] for n in own["edges"]][-1] == report["edges"][-1]["scores"]["exact"]  # m1->logits
    # the run's own file, scored again, gives the run's MIB curve
    again = tmp_path / "again"
    outcome = run_cli(*_args(setup, again, "--evaluate", str(mib / "importances.json")))
    assert outcome.code == 0, outcome.err
    assert sorted(p.name for p in again.iterdir()) == ["mib.json"]
    scored = json.loads((again / "mib.json").read_text())
    assert scored["mib"]["faithfulness"] == pytest.approx(report["mib"]["faithfulness"], abs=1e-5)
    assert scored["mib"]["cpr"] > 0.7 and f"CPR {scored['mib']['cpr']:.3f}" in outcome.out
    # random scores in the same file recover less
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        noise = {n: {"score": float(torch.randn(1, generator=g)), "in_graph": False} for n in own["edges"]}
        path = tmp_path / f"random{seed}.json"
        path.write_text(json.dumps({**own, "edges": noise}))
        assert run_cli(*_args(setup, tmp_path / f"r{seed}", "--evaluate", str(path))).code == 0
        other = json.loads((tmp_path / f"r{seed}" / "mib.json").read_text())
        assert other["mib"]["cpr"] < scored["mib"]["cpr"] - 0.2, seed


def _bad(own: dict, kind: str):
    if kind == "not json":
        return '{"cfg": {"n_layers": 2,'
    data = json.loads(json.dumps(own))
    if kind == "other model":
        data["cfg"].update(n_layers=12, n_heads=12)
    elif kind == "unknown edge":
        data["edges"]["a7.h0->logits"] = {"score": 0.5, "in_graph": False}
    elif kind == "missing edge":
        del data["edges"]["input->a0.h0<q>"]
    elif kind == "not finite":
        data["edges"]["m0->logits"]["score"] = float("nan")
    return json.dumps(data)


@pytest.mark.parametrize(
    "kind, words",
    [
        ("not json", "not JSON"),
        ("other model", "cfg n_layers is 12, but the model has 2"),
        ("unknown edge", "'a7.h0->logits' is not an edge"),
        ("missing edge", "'input->a0.h0<q>'"),
        ("not finite", "'m0->logits' has score nan"),
    ],
)
def test_a_bad_file_is_one_line(run_cli, setup, tmp_path, kind, words):
    from headwise.circuits import build_graph, to_mib, wiring
    from headwise.models import open_model

    graph = build_graph(wiring(open_model(setup[0])))
    own = to_mib(graph, torch.ones(len(graph.edges)), None, torch.zeros(len(graph.edges), dtype=torch.bool), d_model=32)
    path = tmp_path / "file.json"
    path.write_text(_bad(own, kind), encoding="utf-8")
    out = tmp_path / "out"
    outcome = run_cli(*_args(setup, out, "--evaluate", str(path)))
    assert_user_error(outcome, "--evaluate", "file.json", words)
    assert not out.exists()


def test_options_that_do_not_go_together(run_cli, setup, tmp_path):
    outcome = run_cli(*_args(setup, tmp_path / "out", "--evaluate", "x.json", "--mib", str(tmp_path / "m")))
    assert_user_error(outcome, "--mib", "given with --evaluate")
    gqa = save_decoder(tmp_path / "llama", "llama", init=0.5)  # GQA: exact patching splits no group among its heads
    argv = ["circuit", "--model", str(gqa), "--out", str(tmp_path / "o"), "--mib", str(tmp_path / "m")]
    for clean, corrupted in PAIRS:
        argv += ["--clean", clean, "--corrupted", corrupted]
    outcome = run_cli(*argv, "--answer", "cat", "--wrong", "dog", "--exact-top", "0", "--method", "exact")
    assert_user_error(outcome, "--mib", "read by 2 query heads", "no shares")
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("method", ["eap", "atp*"])
def test_gqa_key_and_value_edges_are_written_per_query_head(run_cli, tmp_path, method):
    """Under GQA each key/value group edge becomes one MIB edge per query head of the group, its share of the
    group's score: the shares add up to circuit.json's group score."""
    gqa = save_decoder(tmp_path / "llama", "llama", init=0.5)
    argv = ["circuit", "--model", str(gqa), "--out", str(tmp_path / "o"), "--mib", str(tmp_path / "m")]
    for clean, corrupted in PAIRS:
        argv += ["--clean", clean, "--corrupted", corrupted]
    outcome = run_cli(*argv, "--answer", "cat", "--wrong", "dog", "--exact-top", "0", "--method", method)
    assert outcome.code == 0, outcome.err
    data = json.loads((tmp_path / "m" / "importances.json").read_text())
    report = json.loads((tmp_path / "o" / "circuit.json").read_text())
    heads = {n["id"]: n["heads"] for n in report["nodes"] if n["kind"] == "kv"}
    checked = 0
    for edge in report["edges"]:
        if edge["input"] not in ("k", "v"):
            continue
        sender = {"embed": "input"}.get(edge["sender"], edge["sender"])
        if sender != "input":
            layer, unit = sender[1:].split(".")
            sender = f"m{layer}" if unit == "MLP" else f"a{layer}.h{unit[1:]}"
        layer = edge["receiver"][1:].split(".")[0]
        parts = [data["edges"][f"{sender}->a{layer}.h{h}<{edge['input']}>"]["score"] for h in heads[edge["receiver"]]]
        assert len(parts) == 2
        assert sum(parts) == pytest.approx(edge["scores"][method], abs=1e-5, rel=1e-4)
        checked += 1
    assert checked > 10

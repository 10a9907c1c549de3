"""``headwise heads --model DIR`` on local decoders: outputs checked against an independent computation,
the probe, tokenizer-less checkpoints, importance, and every bad input as one line with nothing written."""

from __future__ import annotations

import json
import pickle
import shutil
from dataclasses import astuple

import numpy as np
import pytest

from _cli_helpers import assert_user_error

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from _decoders import config_of, save_decoder  # noqa: E402

TEXT = "the cat sat on the mat . the cat sat on the mat ."


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("decoders")
    return {f: save_decoder(root / f, f, init=0.5) for f in ("llama", "gpt2", "qwen2")}


def _eager_maps(folder, ids):
    """Per-head weights from transformers' own eager path (no headwise code)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        out = model(input_ids=torch.as_tensor(ids), output_attentions=True)
    return [a.numpy() for a in out.attentions]


@pytest.mark.parametrize(
    "family", ["llama", pytest.param("gpt2", marks=pytest.mark.slow), pytest.param("qwen2", marks=pytest.mark.slow)]
)
def test_decoder_metrics_match_eager_attention(run_cli, tmp_path, folders, family):
    from tokenizers import Tokenizer

    from headwise.analysis import Probe, detector_scores, repeated_random_tokens
    from headwise.analysis.decoder import causal_entropy_ratio

    folder = folders[family]
    code, out, err = astuple(run_cli("heads", TEXT, "--model", str(folder), "--out", str(tmp_path)))
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["heads.json", "heads.csv", "heads.png", "roles.png", "headview.html"]
    )
    data = json.loads((tmp_path / "heads.json").read_text())
    assert data["kind"] == "decoder" and (data["num_layers"], data["num_heads"]) == (2, 4)
    assert data["sentence"]["tokens"][0] == "<bos>" and "first" in out and "ind·p" in out
    ids = np.array([Tokenizer.from_file(str(folder / "tokenizer.json")).encode(TEXT).ids])
    maps = _eager_maps(folder, ids)
    probe = Probe(**{k: v for k, v in data["probe"].items() if k != "total_length"})
    assert (probe.length, probe.repeats, probe.seed, probe.bos) == (32, 2, 0, 0)
    pids = repeated_random_tokens(config_of(folder)["vocab_size"], probe, exclude=data["probe_excluded_ids"])
    pmaps = _eager_maps(folder, pids)
    heads = data["heads"]
    for layer in range(2):
        text = detector_scores(maps[layer], ids)
        on_probe = detector_scores(pmaps[layer], pids)
        ratio = causal_entropy_ratio(maps[layer])
        for h in range(4):
            row = heads[layer * 4 + h]
            for name in ("prev", "first", "duplicate", "induction"):
                assert row[name] == pytest.approx(float(text[name][0, h]), abs=1e-5), (name, layer, h)
                assert row[f"{name}_probe"] == pytest.approx(float(on_probe[name][:, h].mean()), abs=1e-5)
            assert row["entropy_ratio_causal"] == pytest.approx(float(ratio[0, h]), abs=1e-4)
    assert all(0 <= row[k] <= 1 for row in heads for k in ("prev", "first", "duplicate_probe", "induction_probe"))
    page = (tmp_path / "headview.html").read_text()
    assert '"causal":true' in page


def test_a_checkpoint_without_tokenizer_is_read_on_its_probe(run_cli, tmp_path):
    folder = save_decoder(tmp_path / "bare", "llama", tokenizer=False, init=0.5)
    argv = ["heads", "--model", str(folder), "--probe-length", "10", "--probe-repeats", "3", "--seed", "7"]
    code, out, err = astuple(run_cli(*argv, "--out", str(tmp_path / "o")))
    assert code == 0, err
    data = json.loads((tmp_path / "o" / "heads.json").read_text())
    assert data["probe"] == {"length": 10, "repeats": 3, "batch": 8, "seed": 7, "bos": None, "total_length": 30}
    assert data["num_sentences"] == 8 and data["sentence"]["tokens"][0].startswith("<")
    for row in data["heads"]:  # the text is the probe: both columns measure the same thing
        assert row["induction"] == pytest.approx(row["induction_probe"], abs=1e-12)
    outcome = run_cli("heads", "a text", "--model", str(folder), "--out", str(tmp_path / "p"))
    assert_user_error(outcome, "TEXT: the checkpoint bare has no tokenizer.json")
    assert not (tmp_path / "p").exists()


def test_importance_writes_the_pruning_curve(run_cli, tmp_path, folders):
    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat on the mat .\ngod saw the light , and it was good .\none two three red blue\n")
    argv = ["heads", "--model", str(folders["llama"]), "--corpus", str(corpus), "--importance", "--exact"]
    code, out, err = astuple(run_cli(*argv, "--out", str(tmp_path / "o")))
    assert code == 0, err
    o = tmp_path / "o"
    assert (o / "pruning.png").stat().st_size > 10_000
    lines = (o / "pruning.csv").read_text().splitlines()
    assert lines[0] == "removed,importance,ablation,random_mean,random_min,random_max" and len(lines) == 1 + 9
    data = json.loads((o / "heads.json").read_text())
    imp = data["importance"]
    assert imp["sequences"] == 3 and imp["objective"].startswith("next-token cross-entropy")
    assert float(lines[1].split(",")[1]) == pytest.approx(imp["base_loss"], rel=1e-12)
    assert all(row["importance"] >= 0 and "ablation_delta" in row for row in data["heads"])
    header = (o / "heads.csv").read_text().splitlines()[0].split(",")
    assert header[-3:] == ["importance", "importance_norm", "ablation_delta"]
    assert "importance (next-token cross-entropy" in out


def _bad_folders(tmp_path, good):
    """Each bad checkpoint folder and the words its error must contain."""
    cases = {}
    missing = tmp_path / "missing"
    cases["missing"] = (missing, "model: no such folder")
    corrupt = tmp_path / "corrupt"
    shutil.copytree(good, corrupt)
    data = (corrupt / "model.safetensors").read_bytes()
    (corrupt / "model.safetensors").write_bytes(data[: len(data) // 2])
    cases["truncated"] = (corrupt, "model.safetensors: corrupt or truncated safetensors file")
    garbage = tmp_path / "garbage"
    shutil.copytree(good, garbage)
    (garbage / "model.safetensors").write_bytes(b"\xff" * 64)
    cases["garbage"] = (garbage, "corrupt or truncated safetensors file")
    unknown = tmp_path / "unknown"
    shutil.copytree(good, unknown)
    (unknown / "config.json").write_text(json.dumps(config_of(good) | {"model_type": "no-such-model"}))
    cases["unknown"] = (unknown, "unknown model_type 'no-such-model'")
    huge = tmp_path / "huge"
    shutil.copytree(good, huge)
    big = {"hidden_size": 65536, "intermediate_size": 262144, "num_hidden_layers": 64, "num_attention_heads": 64}
    (huge / "config.json").write_text(json.dumps(config_of(good) | big | {"num_key_value_heads": 64}))
    cases["huge"] = (huge, "more than this machine's")
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    shutil.copy(good / "config.json", pickled / "config.json")
    marker = tmp_path / "unpickled"
    # Unpickling this file would create `marker`: it must never happen.
    payload = pickle.dumps(_Touch(str(marker)))
    (pickled / "pytorch_model.bin").write_bytes(payload)
    cases["pickle"] = (pickled, "found only pytorch_model.bin (a pickle checkpoint, which headwise never loads")
    no_config = tmp_path / "noconfig"
    no_config.mkdir()
    cases["no config"] = (no_config, "config.json: no such file")
    return cases, marker


class _Touch:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_bad_checkpoints_are_one_line_and_write_nothing(run_cli, tmp_path, folders):
    cases, marker = _bad_folders(tmp_path, folders["llama"])
    for name, (folder, words) in cases.items():
        out = tmp_path / f"out-{name.replace(' ', '-')}"
        outcome = run_cli("heads", "the cat", "--model", str(folder), "--out", str(out))
        assert_user_error(outcome)
        line = outcome.err.strip()
        assert words in line and line.startswith("headwise: error: --model: "), (name, line)
        assert not out.exists(), name
    assert not marker.exists()


def test_layer_and_probe_mistakes(run_cli, tmp_path, folders):
    outcome = run_cli("heads", "x", "--model", str(folders["gpt2"]), "--layer", "2", "--out", str(tmp_path))
    assert_user_error(outcome, "--layer: expected 0 … 1 for this model, got 2")
    outcome = run_cli("heads", "--model", str(folders["gpt2"]), "--importance", "--out", str(tmp_path))
    assert_user_error(outcome, "--importance: expected --corpus FILE")
    code, _, err = astuple(run_cli("heads", "x", "--model", str(folders["gpt2"]), "--probe-repeats", "1"))
    assert code == 2 and "--probe-repeats" in err


@pytest.mark.slow  # a lab model trained and read: 2 s
def test_a_lab_checkpoint_goes_through_the_same_model_option(run_cli, tmp_path):
    lab = pytest.importorskip("headwise.lab", reason="headwise.lab is not installed")
    import torch

    from headwise.analysis import detector_scores

    torch.manual_seed(0)
    model = lab.TransformerLM(lab.LMConfig(vocab_size=64, context_length=64, d_model=32, num_layers=2, num_heads=4))
    folder = tmp_path / "lab"
    lab.save(model, folder)
    code, out, err = astuple(run_cli("heads", "--model", str(folder), "--out", str(tmp_path / "o")))
    assert code == 0, err
    data = json.loads((tmp_path / "o" / "heads.json").read_text())
    assert (data["num_layers"], data["num_heads"]) == (2, 4) and data["probe"]["bos"] is None
    from headwise.analysis import Probe, repeated_random_tokens

    probe = Probe(**{k: v for k, v in data["probe"].items() if k != "total_length"})
    ids = torch.from_numpy(repeated_random_tokens(64, probe, exclude=data["probe_excluded_ids"]))
    with torch.no_grad():
        _, weights = lab.load(folder)(ids, need_weights=True)
    for layer in range(2):
        scores = detector_scores(weights[layer].numpy(), ids.numpy())
        for h in range(4):
            row = data["heads"][layer * 4 + h]
            assert row["induction_probe"] == pytest.approx(float(scores["induction"][:, h].mean()), abs=1e-5)


def test_bad_lab_checkpoints_are_one_line_and_write_nothing(run_cli, tmp_path):
    """The door's checks are the same for a lab folder: a truncated file, a pickle in place of the weights."""
    lab = pytest.importorskip("headwise.lab", reason="headwise.lab is not installed")

    model = lab.TransformerLM(lab.LMConfig(vocab_size=32, context_length=16, d_model=16, num_layers=1, num_heads=2))
    truncated, pickled = tmp_path / "truncated", tmp_path / "pickled"
    lab.save(model, truncated)
    data = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[: len(data) - 8])
    lab.save(model, pickled)
    (pickled / "model.safetensors").unlink()
    marker = tmp_path / "unpickled"
    (pickled / "model.pt").write_bytes(pickle.dumps(_Touch(str(marker))))
    for folder, words in (
        (truncated, "model.safetensors: corrupt or truncated safetensors file"),
        (pickled, "found only model.pt (a pickle checkpoint, which headwise never loads"),
    ):
        for argv in (["heads", "--model", str(folder)], ["lab", "prune", "--model", str(folder)]):
            out = tmp_path / "out"
            assert_user_error(run_cli(*argv, "--out", str(out)), words)
            assert not out.exists() and not (folder / "pruning").exists()
    assert not marker.exists()


@pytest.mark.slow
def test_encoder_importance_on_the_bundled_model(run_cli, tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("In the beginning God created the heavens and the earth.\nGod saw the light, and it was good.\n")
    argv = [
        "heads",
        "--corpus",
        str(corpus),
        "--importance",
        "--exact",
        "--importance-sentences",
        "2",
        "--out",
        str(tmp_path / "o"),
    ]
    code, out, err = astuple(run_cli(*argv))
    assert code == 0, err
    data = json.loads((tmp_path / "o" / "heads.json").read_text())
    imp = data["importance"]
    assert imp["objective"].startswith("1 − cos") and imp["sequences"] == 2
    assert abs(imp["base_loss"]) < 1e-6  # the intact model against itself: 0 up to float32 round-off
    assert "turning rate" in imp["importance_convention"]
    lines = (tmp_path / "o" / "pruning.csv").read_text().splitlines()
    assert len(lines) == 1 + 33 and lines[-1].startswith("72,")
    last = [float(x) for x in lines[-1].split(",")[1:]]
    assert max(last) - min(last) < 1e-9  # every order ends with all 72 heads removed

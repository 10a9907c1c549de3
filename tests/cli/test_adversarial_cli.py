"""The adversarial table of the command line: bad arguments and files, each with what it must give.

Each ``exits`` row: one line on stderr, ``headwise: error: …``, exit status 2, no traceback; each
``cli_warns`` row: exit 0 and one warning line. The machinery is in ``tests/_adversarial.py``.
"""

from __future__ import annotations

import json

import pytest

from _adversarial import (
    LLAMA_TYPES,
    cli_warns,
    drop,
    exits,
    no_marker,
    params,
    pickle_only,
    reshape,
    run_case,
    set_,
    truncate,
)


def untrained(*argv):
    return lambda ws: ["heads", *argv, "--model", "untrained", "--out", str(ws.path("out"))]


def heads_with_model(folder_of):
    return lambda ws: ["heads", "a short sentence .", "--model", str(folder_of(ws)), "--out", str(ws.path("out"))]


def nothing_written(ws, _):
    out = ws.path("out")
    assert not out.exists() or not any(out.iterdir()), list(out.iterdir())


def no_marker_nothing_written(ws, outcome):
    no_marker(ws, outcome)
    nothing_written(ws, outcome)


def whole_outputs(ws, _):
    names = sorted(p.name for p in ws.path("out").iterdir())
    assert names == ["heads.csv", "heads.json", "heads.png", "headview.html", "roles.png"], names


COMMAND_LINE = [
    exits("headwise/unknown-option", lambda ws: ["--bogus"], r"No such option: --bogus"),
    exits("headwise/unknown-command", lambda ws: ["attend"], r"No such command 'attend'"),
    # heads
    exits(
        "heads/empty-text", untrained(""), r"TEXT: expected a non-empty text, got an empty one", check=nothing_written
    ),
    exits("heads/blank-text", untrained("   "), r"TEXT: expected a non-empty text"),
    exits("heads/no-text-no-corpus", lambda ws: ["heads"], r"expected a TEXT or --corpus FILE"),
    exits("heads/missing-corpus", untrained("--corpus", "missing.txt"), r"--corpus: no such file: 'missing\.txt'"),
    exits("heads/corpus-is-a-folder", lambda ws: ["heads", "--corpus", str(ws.root)], r"--corpus: '.*' is a folder"),
    exits(
        "heads/corpus-only-undecodable",
        lambda ws: untrained("--corpus", str(ws.file("bad.txt", b"\xff\xfe\n\xc3\x28\n")))(ws),
        r"--corpus: no non-empty UTF-8 line in '.*bad\.txt'",
    ),
    exits(
        "heads/empty-corpus",
        lambda ws: untrained("--corpus", str(ws.file("empty.txt", "\n  \n")))(ws),
        r"--corpus: no non-empty UTF-8 line",
    ),
    cli_warns(
        "heads/corpus-with-undecodable-lines",
        lambda ws: untrained(
            "--corpus", str(ws.file("mixed.txt", b"The cat sat on the mat.\n\xff\xfe broken\nThe dog slept.\n"))
        )(ws),
        r"--corpus: skipped 1 line\(s\) that are not valid UTF-8 \(line 2\)",
        check=whole_outputs,
        marks=(pytest.mark.slow,),  # the fast suite: tests/cli/test_heads.py's undecodable-lines test
    ),
    cli_warns(
        "heads/huge-text-truncated",
        untrained("word " * 3000),
        r"TEXT: 3002 tokens, more than the model's 512 positions; truncated to the first 512",
        check=whole_outputs,
        marks=(pytest.mark.slow,),  # the fast suite: tests/cli/test_heads.py's truncation test
    ),
    exits(
        "heads/missing-model",
        lambda ws: ["heads", "x", "--model", str(ws.path("nowhere"))],
        r"--model: .*no such folder: .*nowhere",
    ),
    exits(
        "heads/model-truncated",
        heads_with_model(lambda ws: ws.checkpoint(raw=truncate)),
        r"--model: .*model\.safetensors: corrupt or truncated",
        check=nothing_written,
    ),
    exits(
        "heads/model-wrong-shape",
        heads_with_model(lambda ws: ws.checkpoint(tensors=reshape("encoder.layer.5.output.dense.weight", (384, 1535)))),
        r"--model: .*'encoder\.layer\.5\.output\.dense\.weight' has shape \(384, 1535\), expected \(384, 1536\)",
        marks=(pytest.mark.slow,),  # a whole MiniLM-sized checkpoint; the fast suite: tests/models' shape checks
    ),
    exits(
        "heads/model-missing-tensor",
        heads_with_model(lambda ws: ws.checkpoint(tensors=drop("embeddings.position_embeddings.weight"))),
        r"--model: .*missing tensor\(s\) 'embeddings\.position_embeddings",
    ),
    exits(
        "heads/model-config-wrong-type",
        heads_with_model(lambda ws: ws.checkpoint(config=set_("num_hidden_layers", "6"))),
        r"--model: .*config\.json: .*num_hidden_layers: expected a positive integer, got '6'",
    ),
    exits(
        "heads/model-pickle-only",
        heads_with_model(pickle_only),
        r"--model: .*pytorch_model\.bin \(a pickle checkpoint, which headwise never loads",
        check=no_marker_nothing_written,
    ),
    exits(
        "heads/layer-out-of-range", untrained("x", "--layer", "99"), r"--layer: expected 0 … 0 for this model, got 99"
    ),
    exits("heads/batch-size-0", untrained("x", "--batch-size", "0"), r"Invalid value for '--batch-size'"),
    exits(
        "heads/out-is-a-file",
        lambda ws: ["heads", "x", "--out", str(ws.file("f", ""))],
        r"--out: '.*f' exists and is not a folder",
    ),
    # size
    exits("size/unknown-architecture", lambda ws: ["size", "llama-99"], r"unknown architecture 'llama-99'"),
    exits(
        "size/nothing-to-size", lambda ws: ["size"], r"give one of an architecture NAME, --config config\.json or --all"
    ),
    exits("size/name-and-all", lambda ws: ["size", "llama-3-8b", "--all"], r"got NAME and --all"),
    exits(
        "size/config-wrong-type",
        lambda ws: ["size", "--config", str(ws.file("c.json", json.dumps(LLAMA_TYPES)))],
        r"c\.json: 'hidden_size' must be an integer >= 1, got '4096' \(str\)",
    ),
    exits(
        "size/config-missing",
        lambda ws: ["size", "--config", str(ws.path("missing.json"))],
        r"--config: no such file: '.*missing\.json'",
    ),
    exits(
        "size/config-not-utf8",
        lambda ws: ["size", "--config", str(ws.file("c.json", b"\xff\xfe{}"))],
        r"c\.json: expected a UTF-8 JSON file",
    ),
    exits(
        "size/negative-seq-len",
        lambda ws: ["size", "llama-3-8b", "--seq-len", "-1"],
        r"--seq-len: expected a positive integer, got -1",
    ),
    exits(
        "size/unknown-dtype",
        lambda ws: ["size", "llama-3-8b", "--dtype", "fp8"],
        r"--dtype: expected one of bf16\|fp16\|fp32\|int8, got 'fp8'",
    ),
    exits(
        "size/zero-batch",
        lambda ws: ["size", "llama-3-8b", "--batch", "0"],
        r"--batch: expected a positive integer, got 0",
    ),
    exits(
        "size/all-with-batch", lambda ws: ["size", "--all", "--batch", "2"], r"--batch apply to one model, not to --all"
    ),
    # pe
    exits("pe/odd-width", lambda ws: ["pe", "--d-model", "7"], r"--d-model: expected a positive even integer .*got 7"),
    exits(
        "pe/not-a-picture-name",
        lambda ws: ["pe", "--out", str(ws.path("x.txt"))],
        r"--out: expected a file name ending in \.png, \.svg or \.pdf, got '.*x\.txt'",
    ),
    exits("pe/not-an-integer", lambda ws: ["pe", "--max-len", "abc"], r"Invalid value for '--max-len'"),
    exits(
        "pe/too-many-cells",
        lambda ws: ["pe", "--max-len", "100000", "--d-model", "1000"],
        r"--max-len × --d-model: expected at most 4,000,000 cells, got 100,000,000",
    ),
    # demo
    exits(
        "demo/heads-not-dividing",
        lambda ws: ["demo", "--heads", "3", "--out", str(ws.path("out"))],
        r"--d-model: expected a multiple of --heads=3, got 128",
        check=nothing_written,
    ),
    exits(
        "demo/empty-text",
        lambda ws: ["demo", "--text", "", "--out", str(ws.path("out"))],
        r"--text: expected at least one word, got ''",
        check=nothing_written,
    ),
    exits(
        "demo/huge-text",
        lambda ws: ["demo", "--text", "word " * 100_000, "--out", str(ws.path("out"))],
        r"--text: expected at most 64 tokens \(words and punctuation\), got 100000",
        check=nothing_written,
    ),
    exits(
        "demo/unknown-model",
        lambda ws: ["demo", "--model", "gpt"],
        r"--model: expected one of auto, untrained, minilm, smollm2, got 'gpt'",
    ),
    exits(
        "demo/layer-out-of-range",
        lambda ws: ["demo", "--model", "minilm", "--layer", "9"],
        r"--layer: expected 0 … 5 \(all-MiniLM-L6-v2 has 6 layers\), got 9",
    ),
    # verify
    exits(
        "verify/unknown-article",
        lambda ws: ["verify", "--article", "nope"],
        r"--article: expected one of part4, techbyte",
    ),
    exits(
        "verify/narrow-width",
        lambda ws: ["verify", "--width", "10"],
        r"--width: expected at least 60 characters, got 10",
    ),
]


@pytest.mark.parametrize("case", list(params(COMMAND_LINE)))
def test_adversarial_cli(case, tmp_path, capsys, monkeypatch):
    run_case(case, tmp_path, capsys, monkeypatch)

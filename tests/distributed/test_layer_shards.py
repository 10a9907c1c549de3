"""Layer shards on a real gloo world (2 ranks): a bf16 Llama checkpoint opened layer by layer on each rank, its
blocks split between them as pipeline stages — the final hidden states equal one process's, and each rank read its
own units alone."""

from __future__ import annotations

import warnings

import pytest
import torch

from _decoders import save_decoder
from headwise.distributed import shard_layers
from headwise.models import open_model

pytestmark = pytest.mark.distributed


def test_shard_layers():
    assert shard_layers(5, 2) == [(0, 3), (3, 5)]
    assert shard_layers(4, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    with pytest.raises(ValueError, match="3 layers cannot be split over 4 ranks"):
        shard_layers(3, 4)


@pytest.fixture(scope="module")
def world(tmp_path_factory, launch_world, one_thread):
    from safetensors.torch import load_file, save_file

    workdir = tmp_path_factory.mktemp("shards")
    folder = save_decoder(workdir / "llama", "llama", init=0.5)
    weights = folder / "model.safetensors"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        save_file({k: v.to(torch.bfloat16) for k, v in load_file(weights).items()}, weights, metadata={"format": "pt"})
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 40, (3, 11), generator=g)
    mask = torch.ones_like(ids)
    mask[2, 7:] = 0  # padding
    torch.save({"ids": ids, "mask": mask}, workdir / "inputs.pt")
    return folder, ids, mask, launch_world("shards_worker.py", 2, workdir)


@pytest.mark.slow  # two gloo ranks spawned: 2.5 s
def test_two_ranks_equal_one_process(world):
    folder, ids, mask, ranks = world
    whole = open_model(folder, backend="headwise", by_layer=False)
    with torch.no_grad():
        expected = whole.model.hidden_states(ids, mask)  # (B, L, D)
    for r in ranks:
        torch.testing.assert_close(r["hidden"], expected, rtol=1e-5, atol=1e-5)
    layers = whole.num_layers
    (a0, b0), (a1, b1) = shard_layers(layers, 2)
    assert ranks[0]["brought"] == ["embed_tokens", *(f"layers.{k}" for k in range(a0, b0))]
    assert ranks[1]["brought"] == [*(f"layers.{k}" for k in range(a1, b1)), "norm"]

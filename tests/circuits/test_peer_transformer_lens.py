"""The peer check: headwise's EAP scores equal TransformerLens 4.3's edge attribution on the same weights and
prompts (slow; TransformerLens lives in its own environment, built once under ~/.cache/headwise-peers/ —
``HEADWISE_PEERS`` names another folder — with ``pip install -c constraints.txt transformer-lens==4.3.*``).

Conventions converted:

- TransformerLens scores the *denoising* form, ``(a_clean − a_corrupt) · ∂metric/∂input`` with the gradient on
  the corrupt run; headwise ``(a_corrupted − a_clean) · ∂metric/∂input`` on the clean run. So headwise is run
  with its clean input = TransformerLens's corrupt one and the other way round: the two are then the same sum.
- TransformerLens scores an edge per position (writer and reader at the same position); headwise sums over
  positions: its score is the sum of TransformerLens's over the positions.
- Nodes: ``embed`` / ``attn_head_out(l, h)`` / ``mlp_out(l)`` are ``embed`` / ``L{l}.H{h}`` / ``L{l}.MLP``; the
  readers ``q_input(l, h)`` / ``k_input(l, h)`` / ``v_input(l, h)`` / ``mlp_in(l)`` / ``logits`` are
  ``L{l}.H{h}.q`` / ``L{l}.KV{h}.k`` / ``L{l}.KV{h}.v`` / ``L{l}.MLP`` / ``logits`` (GPT-2 has no GQA: one
  key/value group per head). TransformerLens's embed node is the token embedding alone, headwise's the first
  block's input (token and position embeddings): their differences between the two runs are the same.
- Both average the per-pair scores over the pairs.

TransformerLens runs the model on transformers' eager attention, headwise on its own backend (same weights).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
PEERS = Path(os.environ.get("HEADWISE_PEERS", Path.home() / ".cache" / "headwise-peers"))

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    os.environ["HF_HUB_OFFLINE"] = "1"; os.environ["TRANSFORMERS_OFFLINE"] = "1"
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformer_lens.model_bridge.sources.transformers.source import boot
    from transformer_lens.tools.analysis.attribution_patching import EdgeAttributionConfig, attribution_patch

    folder = sys.argv[1]
    config = GPT2Config(n_embd=32, n_head=4, n_layer=3, vocab_size=96, n_positions=64)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # weights far from the init's near-uniform attention
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(0.15 * noise if p.dim() > 1 else 0.1 * noise if name.endswith("bias") else 1 + 0.1 * noise)
    model.eval().save_pretrained(folder)
    model = GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager").eval()
    bridge = boot(folder, hf_model=model, tokenizer=None)
    bridge.eval()
    g = torch.Generator().manual_seed(1)
    clean = torch.randint(3, 96, (3, 8), generator=g)
    corrupt = clean.clone()
    corrupt[:, 3] = (clean[:, 3] + 7) % 93 + 3

    def metric(logits):
        return logits[0, -1, 5] - logits[0, -1, 7]

    result = attribution_patch(bridge, clean, corrupt, metric, EdgeAttributionConfig(granularity="edge"))
    summed = {}
    for (w, r), score in result.edge_scores.items():
        assert w.position == r.position
        key = json.dumps([w.kind, w.layer, w.head, r.kind, r.layer, r.head])
        summed[key] = summed.get(key, 0.0) + float(score)
    json.dump({"clean": clean.tolist(), "corrupt": corrupt.tolist(), "scores": summed,
               "per_position_edges": len(result.edge_scores)}, open(os.path.join(folder, "tl.json"), "w"))
    """
)


def _environment() -> Path:
    python = PEERS / "tl43" / "bin" / "python"
    if python.exists():
        return python
    PEERS.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(PEERS / "tl43")], check=True)
    pip = [str(python), "-m", "pip", "install", "-q", "-c", str(ROOT / "constraints.txt"), "transformer-lens==4.3.*"]
    done = subprocess.run(pip, capture_output=True, text=True, check=False)
    if done.returncode:
        pytest.skip(f"transformer-lens 4.3 could not be installed: {done.stderr[-500:]}")
    return python


def _edge(writer_kind, layer, head, reader_kind, r_layer, r_head) -> tuple[str, str]:
    sender = {"embed": "embed", "attn_head_out": f"L{layer}.H{head}", "mlp_out": f"L{layer}.MLP"}[writer_kind]
    receiver = {
        "q_input": f"L{r_layer}.H{r_head}.q",
        "k_input": f"L{r_layer}.KV{r_head}.k",
        "v_input": f"L{r_layer}.KV{r_head}.v",
        "mlp_in": f"L{r_layer}.MLP",
        "logits": "logits",
    }[reader_kind]
    return sender, receiver


@pytest.mark.slow
def test_eap_equals_transformer_lens_edge_attribution(tmp_path):
    pytest.importorskip("transformers")
    python = _environment()
    folder = tmp_path / "gpt2"
    folder.mkdir()
    (tmp_path / "peer.py").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    run = subprocess.run([str(python), str(tmp_path / "peer.py"), str(folder)], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    peer = json.loads((folder / "tl.json").read_text())

    from transformers import AutoModelForCausalLM

    import headwise.hf  # noqa: F401  (registers the backend)
    from headwise.circuits import edge_attribution
    from headwise.patching import logit_difference

    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="headwise").eval()
    clean, corrupt = torch.tensor(peer["clean"]), torch.tensor(peer["corrupt"])
    # headwise's clean input is TransformerLens's corrupt one (see the module docstring)
    ours = edge_attribution(model, corrupt, clean, logit_difference([5, 5, 5], [7, 7, 7]))
    g = ours.graph
    assert len(peer["scores"]) == len(g.edges)
    assert peer["per_position_edges"] == 8 * len(g.edges)
    theirs = torch.zeros(len(g.edges))
    for key, score in peer["scores"].items():
        theirs[g.edge("edges", _edge(*json.loads(key)))] = score
    # every one of the 262 edges to 2e-6 (the largest scores ~0.09; float32, eager vs headwise attention)
    torch.testing.assert_close(ours.scores, theirs, atol=2e-6, rtol=1e-4)
    assert theirs.abs().max() > 0.05 and (theirs.abs() > 1e-3).sum() > 100  # not a comparison of zeros

"""The lab: small transformers trained on a laptop's CPU, to watch heads specialise.

- :class:`TransformerLM` / :class:`LMConfig` — a decoder-only model on headwise's own layers
  (:mod:`headwise.models.transformer_lm`); ``model(token_ids (B, L))`` returns logits ``(B, L, V)``.
- :func:`train` / :class:`TrainConfig` — AdamW with warmup and cosine decay, seeds, thread count,
  progress through a callback (:mod:`headwise.lab.trainer`).
- :func:`save` / :func:`load` — checkpoint folders of ``model.safetensors`` + ``config.json`` with
  ``"model_type": "headwise-lab"`` (:mod:`headwise.models.lab_checkpoint`).
- Experiments: :func:`run_induction` (induction heads, :mod:`headwise.lab.induction`),
  :func:`run_heads_vs_one` (one head against many at equal parameters: learnable tasks and a
  character-level language model on the bundled corpus, learning rates swept per head count on tuning
  seeds, intervals and rank tests over evaluation seeds, a void verdict when nothing is learnt;
  :mod:`headwise.lab.heads_vs_one` with its plan :mod:`headwise.lab.heads_setup` and verdict
  :mod:`headwise.lab.heads_verdict`, :mod:`headwise.lab.char_lm`), :func:`pruning_curves` and the
  held-out batches ``headwise lab prune`` measures on (Michel et al.'s importance through
  :func:`headwise.analysis.head_importance`, :mod:`headwise.lab.prune`; the command's run is
  :mod:`headwise.commands.lab`'s), ground truth for circuit methods (tasks whose circuit is known by construction,
  :mod:`headwise.lab.circuit_tasks`; ``headwise lab circuits``'s run, :mod:`headwise.lab.circuit_suite`); the result
  files' text in :mod:`headwise.lab.records`;
  tasks in :mod:`headwise.lab.tasks`.

The lab is a tool below the commands' flows: it imports neither :mod:`headwise.commands` nor :mod:`headwise.study`, and
draws nothing on the terminal; the ``headwise lab`` commands' flows (:mod:`headwise.commands.lab`) run it and the
command line prints.
"""

from headwise.lab.heads_vs_one import HeadsSetup, run_heads_vs_one
from headwise.lab.induction import InductionSetup, run_induction
from headwise.lab.prune import head_importance, pruning_curves
from headwise.lab.trainer import Progress, TrainConfig, train
from headwise.models.lab_checkpoint import MODEL_TYPE, is_lab_checkpoint, load, save
from headwise.models.transformer_lm import LMConfig, TransformerLM

__all__ = [
    "MODEL_TYPE",
    "HeadsSetup",
    "InductionSetup",
    "LMConfig",
    "Progress",
    "TrainConfig",
    "TransformerLM",
    "head_importance",
    "is_lab_checkpoint",
    "load",
    "pruning_curves",
    "run_heads_vs_one",
    "run_induction",
    "save",
    "train",
]

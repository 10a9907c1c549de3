"""Any Hugging Face model on headwise attention.

``import headwise.hf`` registers ``"headwise"`` with transformers (an attention function and its mask
function), so ``from_pretrained(path, attn_implementation="headwise")`` and
``model.set_attn_implementation("headwise")`` work for every family that calls transformers'
``AttentionInterface`` (Llama, Mistral, Qwen2/3, Gemma, GPT-2, GPT-OSS, DeepSeek-V3, BERT …). On top:

- :func:`capture` — per-head weights ``(B, H, L, S)`` of every attention layer, whatever the implementation
  the model was loaded with;
- :func:`ablate` — heads removed where they enter the output projection (``"zero"`` or ``"mean"``);
- :func:`named_points` — the model's hook points by name (:mod:`headwise.points`), where both act.

See ``docs/transformers_backend.md`` for what is compared and what is refused. Needs the ``hf`` extra
(``transformers``).
"""

from __future__ import annotations

try:
    from transformers import AttentionInterface  # noqa: F401
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask  # noqa: F401
except ImportError as error:  # pragma: no cover - the extra is missing or too old
    raise ImportError(
        "headwise.hf needs transformers with AttentionInterface and AttentionMaskInterface (tested with 5.x): "
        "pip install 'headwise[hf]'"
    ) from error

from headwise.hf._model import attention_layers, family, named_points, num_heads
from headwise.hf.ablate import MODES, ablate
from headwise.hf.backend import NAME, attention_forward, build_mask, register
from headwise.hf.capture import Capture, capture

register()

__all__ = [
    "MODES",
    "NAME",
    "Capture",
    "ablate",
    "attention_forward",
    "attention_layers",
    "build_mask",
    "capture",
    "family",
    "named_points",
    "num_heads",
    "register",
]

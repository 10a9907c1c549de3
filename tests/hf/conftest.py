"""Shared fixtures for the Hugging Face backend tests: tiny random models, cached per family."""

import functools

import pytest

pytest.importorskip("transformers")

import headwise.hf  # noqa: E402,F401  (registers "headwise")
from _hf_models import build  # noqa: E402


@functools.cache
def _cached(case: str, attn: str):
    return build(case, attn=attn)


@pytest.fixture
def tiny():
    """``tiny(case, attn)``: a cached tiny random model (do not change it outside a with-block)."""
    return _cached

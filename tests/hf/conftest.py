"""Shared fixtures for the Hugging Face backend tests: tiny random models, cached per family."""

import functools

import pytest

pytest.importorskip("transformers")

import headwise.hf  # noqa: E402,F401  (registers "headwise")
from _hf_models import build  # noqa: E402


@functools.cache
def _cached(family: str, overrides: tuple, attn: str):
    return build(family, dict(overrides), attn=attn)


@pytest.fixture
def tiny():
    """``tiny(family, overrides, attn)``: a cached tiny random model (do not mutate it outside a with-block)."""

    def make(family: str, overrides: dict, attn: str = "eager"):
        return _cached(family, tuple(sorted(overrides.items())), attn)

    return make

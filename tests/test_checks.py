"""The shared argument checks: what each accepts, what it refuses, and the message it refuses with."""

import math
import re

import numpy as np
import pytest

from headwise import checks


@pytest.mark.parametrize("value", [1, 7, np.int64(3), np.int32(1)])
def test_positive_int_accepts_integers_and_returns_a_python_int(value):
    out = checks.positive_int("n", value)
    assert out == int(value) and type(out) is int


@pytest.mark.parametrize("value", [0, -1, True, False, 2.0, "3", None, np.float64(2.0), np.int64(0)])
def test_positive_int_refuses_with_the_name_and_the_value(value):
    with pytest.raises(ValueError, match=rf"^n: expected a positive integer, got {re.escape(repr(value))}$"):
        checks.positive_int("n", value)


def test_non_negative_int():
    assert checks.non_negative_int("n", 0) == 0 and checks.non_negative_int("n", np.int8(5)) == 5
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match=r"^n: expected a non-negative integer"):
            checks.non_negative_int("n", bad)


def test_positive_number():
    assert checks.positive_number("eps", 1e-12) == 1e-12 and checks.positive_number("eps", np.float32(0.5)) == 0.5
    for bad in (0, -1.0, math.inf, math.nan, True, "1"):
        with pytest.raises(ValueError, match=r"^eps: expected a positive number"):
            checks.positive_number("eps", bad)


def test_probability():
    assert checks.probability("p", 0) == 0.0 and checks.probability("p", 0.999) == 0.999
    for bad in (1, 1.0, -0.1, math.nan, True):
        with pytest.raises(ValueError, match=r"^p: expected a probability in \[0, 1\)"):
            checks.probability("p", bad)


@pytest.mark.parametrize(
    ("low_closed", "high_closed", "inside", "outside", "written"),
    [
        (True, False, [0, 0.5, np.float32(0.25)], [1, -1e-9, math.nan], r"\[0, 1\)"),
        (False, False, [1e-9, 0.5], [0, 1, math.nan], r"\(0, 1\)"),
        (False, True, [1, 0.5], [0, 1.0000001, math.inf], r"\(0, 1\]"),
        (True, True, [0, 1], [-0.1, 1.1], r"\[0, 1\]"),
    ],
)
def test_number_in_honours_each_end(low_closed, high_closed, inside, outside, written):
    for v in inside:
        assert checks.number_in("x", v, 0, 1, low_closed=low_closed, high_closed=high_closed) == float(v)
    for v in outside + [True, "0.5", None]:
        with pytest.raises(ValueError, match=rf"^x: expected a number in {written}, got "):
            checks.number_in("x", v, 0, 1, low_closed=low_closed, high_closed=high_closed)


def test_one_of_lists_the_choices():
    assert checks.one_of("kind", "a", ("a", "b")) == "a"
    with pytest.raises(ValueError, match=r"^kind: expected one of \('a', 'b'\), got 'c'$"):
        checks.one_of("kind", "c", iter(["a", "b"]))


def test_layer_and_head_numbers_share_one_message_shape():
    assert checks.layer_number("layers", np.int64(1), 2) == 1 and checks.head_number("heads", 3, 0, 4) == 3
    with pytest.raises(
        ValueError, match=r"^layers: layer 2 is out of range: the model has 2 attention layers \(0..1\)$"
    ):
        checks.layer_number("layers", 2, 2)
    with pytest.raises(ValueError, match=r"^layer: -1 is out of range: the model has 2 attention"):
        checks.layer_number("layer", -1, 2, subject="-1")
    with pytest.raises(ValueError, match=r"^--layer: expected 0 … 5 \(all-MiniLM-L6-v2 has 6 layers\), got 9$"):
        checks.layer_number("--layer", 9, 6, model="all-MiniLM-L6-v2")
    with pytest.raises(ValueError, match=r"^heads: head 4 is out of range in layer 1, which has 4 heads \(0..3\)$"):
        checks.head_number("heads", 4, 1, 4)
    with pytest.raises(TypeError, match=r"^layers: expected layer numbers as ints, got True$"):
        checks.layer_number("layers", True, 2)
    with pytest.raises(TypeError, match=r"^heads: expected head numbers as ints in layer 0, got '1'$"):
        checks.head_number("heads", "1", 0, 4)

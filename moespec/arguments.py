"""What a library function's number or whole-number argument may be, checked before any work.

A number is an int, float, Fraction or numpy scalar (never a bool, a string, None or a list), finite and of
magnitude at most MAGNITUDE_LIMIT; a whole number is an int or numpy integer (never a bool) in a stated range. A
refusal is an ArgumentError (a ValueError, and a MoespecError the CLI prints as one line) naming the argument;
huge ints are shown by their digit count, so no message waits on formatting them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Union

import numpy as np

from moespec import ArgumentError
from moespec.defaults import MAGNITUDE_LIMIT

Number = Union[int, float, Fraction]
REAL = (int, float, Fraction, np.integer, np.floating)
WHOLE = (int, np.integer)


def show(x: object) -> str:
    """x for a message: its repr, or for a long int or Fraction its size in digits."""
    if isinstance(x, (int, Fraction)) and not isinstance(x, bool):
        bits = max(x.bit_length(), 1) if isinstance(x, int) else max(x.numerator.bit_length(),
                                                                      x.denominator.bit_length())
        if bits > 200:
            return f"a {type(x).__name__} of ~{int(bits * math.log10(2)) + 1} digits"
    text = repr(x)
    return text if len(text) <= 80 else f"{text[:77]}..."


def is_real(x: object) -> bool:
    """A finite number (module docstring) of magnitude at most MAGNITUDE_LIMIT."""
    if isinstance(x, bool) or not isinstance(x, REAL):
        return False
    if isinstance(x, (float, np.floating)) and not math.isfinite(x):
        return False
    return abs(x) <= MAGNITUDE_LIMIT


def real(name: str, x: object, least: Number | None = None, positive: bool = False) -> Number:
    """x when it is a number (is_real), at least `least` when given and > 0 with `positive`; numpy scalars come back
    as int or float. ArgumentError naming `name` otherwise."""
    if not is_real(x):
        raise ArgumentError(f"{name} = {show(x)} is not a finite number of magnitude at most {MAGNITUDE_LIMIT:g}")
    if (least is not None and x < least) or (positive and not x > 0):
        raise ArgumentError(f"{name} = {show(x)} must be {'> 0' if positive else f'>= {least}'}")
    return int(x) if isinstance(x, np.integer) else float(x) if isinstance(x, np.floating) else x


WHOLE_LIMIT = int(MAGNITUDE_LIMIT)  # the largest whole number a count may be: the magnitude limit of every number


def whole(name: str, x: object, least: int, most: int = WHOLE_LIMIT) -> int:
    """x as an int when it is a whole number (not a bool) in least..most; ArgumentError naming `name` otherwise."""
    if isinstance(x, bool) or not isinstance(x, WHOLE) or not least <= x <= most:
        raise ArgumentError(f"{name} must be an integer in {least}..{most:,}, got {show(x)}"
                            if most < WHOLE_LIMIT else f"{name} must be an integer >= {least}, got {show(x)}")
    return int(x)


def items(name: str, xs: object) -> list:
    """xs as a list when it is a sequence or other iterable of values (a 1-D numpy array included; not a string, a
    mapping or a 0-D array); ArgumentError naming `name` otherwise."""
    if isinstance(xs, np.ndarray) and xs.ndim != 1 or isinstance(xs, (str, bytes, Mapping)) or \
            not isinstance(xs, Iterable):
        raise ArgumentError(f"{name} must be a list of values, got {show(xs)}")
    return list(xs)


def reals(name: str, xs: object, least: Number | None = None, positive: bool = False) -> list[Number]:
    """A list (items) of numbers, each checked by `real` as name[i]."""
    return [real(f"{name}[{i}]", x, least, positive) for i, x in enumerate(items(name, xs))]

"""Bounded argparse types: every numeric CLI option is checked in the parser (exit 2 with a usage line naming it).

``type=positive_int`` refuses 0, negatives and non-integers; ``finite_float`` refuses nan/inf; ``bounded_int(lo, hi)``
and ``bounded_float(lo, hi)`` add a range. Upper bounds keep absurd values (2**40 batches) from reaching allocation.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

INT64_MAX = 2**63 - 1
# no sensible CLI count or size is larger; keeps 2**40 and int64 overflow out of every buffer computation
DEFAULT_INT_MAX = 2**31 - 1


def _parse_int(text: str) -> int:
    try:
        value = int(str(text).strip(), 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    return value


def _parse_float(text: str) -> float:
    try:
        value = float(str(text).strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def bounded_int(low: int | None = None, high: int | None = DEFAULT_INT_MAX) -> Callable[[str], int]:
    """An argparse type: an integer in [low, high]."""

    def parse(text: str) -> int:
        value = _parse_int(text)
        if (low is not None and value < low) or (high is not None and value > high):
            lo = "-inf" if low is None else str(low)
            hi = "inf" if high is None else str(high)
            raise argparse.ArgumentTypeError(f"{value} is out of range (expected an integer in {lo}..{hi})")
        return value

    parse.__name__ = "integer"
    return parse


def bounded_float(
    low: float | None = None,
    high: float | None = None,
    *,
    low_inclusive: bool = True,
    high_inclusive: bool = True,
) -> Callable[[str], float]:
    """An argparse type: a finite float in the given range."""

    def parse(text: str) -> float:
        value = _parse_float(text)
        bad_low = low is not None and (value < low if low_inclusive else value <= low)
        bad_high = high is not None and (value > high if high_inclusive else value >= high)
        if bad_low or bad_high:
            left = "[" if low_inclusive else "("
            right = "]" if high_inclusive else ")"
            lo = "-inf" if low is None else f"{low:g}"
            hi = "inf" if high is None else f"{high:g}"
            raise argparse.ArgumentTypeError(
                f"{value:g} is out of range (expected a number in {left}{lo}, {hi}{right})"
            )
        return value

    parse.__name__ = "number"
    return parse


def level_or_off(text: str) -> float | str:
    """An argparse type for a confidence level: a number in [0.5, 1), or ``off`` (no level: a point estimate)."""
    if str(text).strip().lower() == "off":
        return "off"
    try:
        return bounded_float(0.5, 1.0, high_inclusive=False)(text)
    except argparse.ArgumentTypeError as error:
        raise argparse.ArgumentTypeError(f"{error}, or off") from None


positive_int = bounded_int(1)
non_negative_int = bounded_int(0)
finite_float = bounded_float()
positive_float = bounded_float(0.0, low_inclusive=False)
non_negative_float = bounded_float(0.0)


def int_list(low: int = 1, high: int = 1024) -> Callable[[str], list[int]]:
    """An argparse type: a comma-separated list of integers in [low, high], e.g. ``1,2,4``."""

    def parse(text: str) -> list[int]:
        parts = [part for part in str(text).split(",") if part.strip()]
        if not parts:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers (e.g. 1,2,4)")
        values = []
        for part in parts:
            try:
                value = int(part.strip(), 10)
            except ValueError:
                raise argparse.ArgumentTypeError(
                    f"{text!r} is not a comma-separated list of integers (e.g. 1,2,4)"
                ) from None
            if not low <= value <= high:
                raise argparse.ArgumentTypeError(f"{value} in {text!r} is out of range (expected {low}..{high})")
            values.append(value)
        return values

    parse.__name__ = "list"
    return parse

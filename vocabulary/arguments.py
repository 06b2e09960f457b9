"""argparse types for the command lines' numbers, so that a bad value is refused with its
reason before any work starts (a budget of -1 ran no attempt and exited 0; a `--repeat 0`
compiled the model and then failed on an empty median)."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def _number(kind: type, text: str) -> float:
    try:
        value: float = kind(text)
        return value
    except ValueError:
        noun = "a whole number" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None


def _bounded(
    kind: type, allowed: Callable[[float], bool], rule: str, name: str
) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = _number(kind, text)
        if not allowed(value):  # NaN is allowed by no rule
            raise argparse.ArgumentTypeError(f"must be {rule}, not {text}")
        return value

    parse.__name__ = f"{name} {kind.__name__}"  # argparse names the type in its errors
    return parse


def positive(kind: type) -> Callable[[str], float]:
    """A number above 0 (`kind`: int or float)."""
    return _bounded(kind, lambda v: v > 0, "above 0", "positive")


def at_least_zero(kind: type) -> Callable[[str], float]:
    """A number of 0 or more."""
    return _bounded(kind, lambda v: v >= 0, "0 or more", "non-negative")


def int_list(text: str) -> list[int]:
    """Comma-separated whole numbers (`--seeds 0,1,2`)."""
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of whole numbers (e.g. 0,1,2)"
        ) from None

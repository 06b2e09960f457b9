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


def positive(kind: type) -> Callable[[str], float]:
    """A number above 0 (`kind`: int or float)."""

    def parse(text: str) -> float:
        value = _number(kind, text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be above 0, not {text}")
        return value

    parse.__name__ = f"positive {kind.__name__}"  # argparse names the type in its errors
    return parse


def at_least_zero(kind: type) -> Callable[[str], float]:
    """A number of 0 or more."""

    def parse(text: str) -> float:
        value = _number(kind, text)
        if not value >= 0:
            raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
        return value

    parse.__name__ = f"non-negative {kind.__name__}"
    return parse


def int_list(text: str) -> list[int]:
    """Comma-separated whole numbers (`--seeds 0,1,2`)."""
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of whole numbers (e.g. 0,1,2)"
        ) from None

"""Errors KOPE raises to its users. Each message says what was wrong and what to do."""

from __future__ import annotations


class KopeError(Exception):
    """Base class of every error KOPE raises on purpose."""


class OptionError(KopeError, ValueError):
    """An unknown option, or a value an option does not accept."""


class ModelLoadError(KopeError):
    """A model given to the CLI could not be loaded, built or traced."""


def first_line(err: BaseException, limit: int = 300) -> str:
    """The first line of an error's message, at most `limit` characters; its type's name
    where the message is empty."""
    text = str(err).strip() or type(err).__name__
    return text.splitlines()[0][:limit]

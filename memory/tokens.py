"""Counting tokens offline, for packing context under a budget.

`TokenCounter` is the interface: anything with `count(text) -> int` and a `name`. The default,
`EstimatingCounter`, needs no files and no network: it splits text the way o200k-style BPE
pre-tokenizers do (words with their leading space, digit groups of at most three, runs of
punctuation, whitespace runs) and charges each piece by its class and length, with costs
fitted on KOPE's own prompts (MLIR payloads, transform schedules, rendered contexts) against
the o200k_base tokenizer. `benchmarks/memory_tokens.py` measures its error (figures:
docs/measurements.md).
`BpeCounter` uses the real o200k tokenizer of the `bpe-openai` package when it is installed
(it ships its vocabulary, so it too works offline; tiktoken downloads its files and does not).
"""

from __future__ import annotations

import logging
import math
import re
from collections import Counter
from typing import Protocol, runtime_checkable

log = logging.getLogger("kope.memory")

_CACHE_LIMIT = 200_000


@runtime_checkable
class TokenCounter(Protocol):
    """Counts the tokens a text costs in a model's prompt."""

    name: str

    def count(self, text: str) -> int: ...


# The o200k pre-tokenizer's pattern, restricted to ASCII classes (other characters fall into
# the symbol class): words of an upper-case run then lower-case letters (or the reverse) with
# one leading non-letter glued on (a space, `%`, `.`, `_`, `"`), digit groups of at most
# three, symbol runs with an optional leading space and trailing newlines, then whitespace.
_PIECE = re.compile(
    r"""[^\r\nA-Za-z0-9]?[A-Z]*[a-z]+|[^\r\nA-Za-z0-9]?[A-Z]+[a-z]*|[0-9]{1,3}"""
    r"""| ?[^\sA-Za-z0-9]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


# o200k token counts of frequent pieces of KOPE prompts whose count the length rule misses
# (MLIR dialect names, transform ops, the words of rendered contexts).
_KNOWN: dict[str, int] = {
    " ATen": 2,
    " Experience": 1,
    " JIT": 2,
    " KOPE": 2,
    " MLIR": 2,
    " SIGSEGV": 3,
    " [#": 2,
    " against": 1,
    " arith": 2,
    " attempt": 1,
    " attributes": 1,
    " backend": 1,
    " compile": 1,
    " element": 1,
    " fma": 2,
    " function": 1,
    " interchange": 1,
    " iterator": 1,
    " kernels": 1,
    " linalg": 2,
    " lowering": 1,
    " memref": 2,
    " mismatch": 1,
    " ogt": 2,
    " operand": 1,
    " operator": 1,
    " parallel": 1,
    " reference": 1,
    " rtol": 2,
    " running": 1,
    " runtime": 1,
    " timeout": 1,
    " transform": 1,
    " unroll": 2,
    " verified": 1,
    " —": 1,
    " →": 1,
    '"]}': 2,
    "#map": 2,
    "-matmul": 3,
    "-mlir": 3,
    ".addf": 2,
    ".addmm": 2,
    ".amax": 2,
    ".bmm": 2,
    ".cmpf": 3,
    ".constant": 1,
    ".contract": 1,
    ".convolution": 2,
    ".default": 1,
    ".divf": 2,
    ".gelu": 2,
    ".generic": 1,
    ".hoist": 3,
    ".mlir": 2,
    ".mulf": 2,
    ".subf": 2,
    ".tanh": 2,
    ".truncf": 3,
    ".yield": 2,
    "/`": 2,
    "_matmul": 2,
    "_patterns": 1,
    "_sequence": 1,
    "```\n": 2,
    "collapsed": 1,
    "cst": 2,
    "expanded": 1,
    "linalg": 2,
    "mlir": 2,
    "padded": 2,
    "parallel": 1,
    "transform": 1,
    "verified": 1,
    "vfunc": 2,
    '{["': 2,
    "×": 1,
}


class EstimatingCounter:
    """An offline estimate of o200k token counts; within a few percent on KOPE's prompts.

    Costs: a word is one token up to `word_chars` letters, plus one per further
    `word_chars` (camel-case parts count separately); a digit group is one token; a symbol
    run costs one token per `symbol_chars` symbols; whitespace is one token per run; any
    other character (non-ASCII) costs `other` tokens.
    """

    name = "estimate"
    # Joining texts with a newline never costs more than the parts plus one token each join
    # (no piece spans the join, and costs are rounded up per text), so a packer may add up.
    subadditive = True

    def __init__(
        self, word_chars: int = 8, more_chars: int = 3, symbol_chars: int = 2, other: float = 1.0
    ):
        self.word_chars = word_chars
        self._costs: dict[str, float] = {}  # pieces repeat a lot in MLIR: cost each once
        self.more_chars = more_chars
        self.symbol_chars = symbol_chars
        self.other = other

    def count(self, text: str) -> int:
        """The estimated number of tokens of `text`."""
        total = 0.0
        cache = self._costs
        for piece, n in Counter(_PIECE.findall(text)).items():
            cost = cache.get(piece)
            if cost is None:
                cost = self._piece(piece)
                if len(cache) < _CACHE_LIMIT:
                    cache[piece] = cost
            total += cost * n
        return int(math.ceil(total))

    def _piece(self, piece: str) -> float:
        known = _KNOWN.get(piece)
        if known is not None:
            return known
        if piece.isspace() or piece.isdigit():
            return 1.0
        letters = piece if piece[0].isalpha() else piece[1:]
        if letters.isalpha() and letters.isascii():
            extra = max(0, len(letters) - self.word_chars)
            return 1.0 + math.ceil(extra / self.more_chars)
        body = piece.strip()
        ascii_chars = sum(1 for c in body if c.isascii())
        return math.ceil(max(ascii_chars, 1) / self.symbol_chars) + self.other * (
            len(body) - ascii_chars
        )


class BpeCounter:
    """Exact counts with a real BPE vocabulary from `bpe-openai` (offline; optional)."""

    def __init__(self, encoding: str = "o200k_base"):
        import bpe_openai  # optional dependency: pip install bpe-openai

        self._encoding = bpe_openai.get_encoding(encoding)
        self.name = f"bpe-openai:{encoding}"

    def count(self, text: str) -> int:
        """The exact number of tokens of `text` under this encoding."""
        return len(self._encoding.encode_ordinary(text))


def default_counter() -> TokenCounter:
    """The counter used when none is given: the offline estimator."""
    return EstimatingCounter()

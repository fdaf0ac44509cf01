"""moespec: speculative decoding on mixture-of-experts models, from measurement and exact theory.

A verification pass of n tokens needs the experts that all n tokens select. A per-slot kernel reads each
selected expert once per token-slot; a deduplicating kernel reads each distinct expert once. Which is faster
depends on two measured inputs, the bytes each kernel requests (from routing traces) and the bandwidth at
which it moves them (from a benchmark of the expert operation). moespec turns both into the best kernel per
pass size and the best draft length per acceptance rate, with proved error bands.
"""

__version__ = "0.3.0"


class MoespecError(Exception):
    """A user-facing error: bad input or data. The CLI prints its message as one line and exits with 2."""


class ArgumentError(MoespecError, ValueError):
    """A library function's argument outside its domain: a ValueError naming the argument (the library's contract)
    that the CLI, as a MoespecError, prints as one line."""


def printable(text: str) -> str:
    """`text` read from a file (a model's name, a metadata string), safe to print on one line of a terminal: every
    character that is not printable (newlines, tabs, the ESC of an ANSI sequence, bidi controls) as its escape."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)

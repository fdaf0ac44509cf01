"""moespec: speculative decoding on mixture-of-experts models, from measurement and exact theory.

A verification pass of n tokens needs the experts that all n tokens select. A per-slot kernel reads each
selected expert once per token-slot; a deduplicating kernel reads each distinct expert once. Which is faster
depends on two measured inputs, the bytes each kernel requests (from routing traces) and the bandwidth at
which it moves them (from a benchmark of the expert operation). moespec turns both into the best kernel per
pass size and the best draft length per acceptance rate, with proved error bands.
"""

__version__ = "0.1.0"


class MoespecError(Exception):
    """A user-facing error: bad input or data. The CLI prints its message as one line and exits with 2."""

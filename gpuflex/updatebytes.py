"""How many bytes one member's update weighs on the wire, from the job's codec and the
update's length: what a round costs each member upward, shown beside loss and perplexity.

The codecs (``aggregation.compression``) are deterministic in size, so the figure is exact
for the default codec settings (a unit test encodes real vectors to hold it to that); a
secure-aggregation update is masked in its own field arithmetic and is not estimated here.
"""

from __future__ import annotations

import math

#: The codecs' defaults (aggregation.compression): int8 scale blocks, top-k fraction.
INT8_BLOCK, TOPK_FRACTION = 4096, 0.01


def update_nbytes(codec: str, size: int) -> int | None:
    """Data bytes (payload and side arrays, without the few header bytes) of a ``size``-long
    float32 delta encoded with ``codec``; None for a codec this does not know."""
    if size < 0:
        return None
    if codec == "none":
        return 4 * size
    if codec == "fp16":
        return 2 * size
    if codec == "int8":
        return size + 4 * -(-size // INT8_BLOCK) + 8
    if codec == "topk":
        k = min(size, max(1, math.ceil(TOPK_FRACTION * size)))
        return 4 * k + (4 if size <= 2**32 else 8) * k
    return None

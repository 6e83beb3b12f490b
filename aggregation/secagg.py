"""The arithmetic of secure aggregation: quantise, mask, sum, unmask, recover (Bonawitz et al. 2017).

A member turns its weighted update into integers in the ring Z_{2^32}, adds one pseudo-random
mask per other group member (+ for a peer that sorts after it, - for one that sorts before), and
sends the result. Each mask is expanded from a 32-byte seed the two members share, so in the
group sum every mask appears once with each sign and cancels exactly: the leader learns the sum
and nothing else. Modular arithmetic is what makes a masked value uniformly distributed, whatever
the update, so a single masked vector carries no information.

When a member drops out after the others masked, its partners' masks no longer cancel. Each
member therefore Shamir-shares every pairwise seed it holds among the rest of the group; any
``threshold`` of those shares rebuild a seed, and fewer reveal nothing. Shares live in the prime
field of the Mersenne prime 2^521 - 1, in plain Python integers, large enough for any 32-byte seed.

No I/O and no key agreement here (see gpuflex/node/core/secure.py): seeds come in as bytes.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from aggregation._checks import as_vector, check_int, check_number
from aggregation.errors import AggregationError

RING_BITS = 32
RING_DTYPE = np.uint32
#: Fractional bits of the fixed-point encoding: 2^-14 ≈ 6e-5 resolution per coordinate.
FRAC_BITS = 14
#: The field for Shamir shares: a Mersenne prime above 2^256, so any seed is one element.
PRIME = (1 << 521) - 1
SEED_BYTES = 32


class SecAggError(AggregationError):
    """Secure aggregation cannot produce the sum (too many dropouts, overflow, bad shares)."""


# --- fixed-point quantisation in Z_{2^32} ---------------------------------------------------


def check_capacity(total_weight: int, clip_range: float, frac_bits: int = FRAC_BITS) -> None:
    """Refuse a sum that could wrap around the ring, which would silently corrupt it.

    The largest possible |sum| is total_weight * clip_range * 2^frac_bits; it must stay below
    2^31 so the signed reading of the ring sum is exact. Sample counts are public (they are in
    the signed update headers), so the leader can check this before unmasking.
    """
    worst = int(total_weight) * float(clip_range) * (1 << frac_bits)
    if worst >= 2 ** (RING_BITS - 1):
        raise SecAggError(
            f"group weight {total_weight} × range {clip_range:g} overflows the {RING_BITS}-bit ring; "
            "use smaller groups or fewer samples per member"
        )


def quantize(vec: np.ndarray, weight: int, clip_range: float, frac_bits: int = FRAC_BITS) -> np.ndarray:
    """round(clip(vec) * 2^frac_bits) * weight, reduced mod 2^32.

    The weight (a sample count) multiplies inside the ring so that the unmasked sum is the
    numerator of FedAvg's weighted mean; values are clipped to ±clip_range first so the
    capacity check above holds for every honest member.
    """
    weight = check_int(weight, "weight", low=1)
    clip_range = check_number(clip_range, "clip_range", low=0.0, low_open=True)
    flat = as_vector(vec, "vector").astype(np.float64)
    np.clip(flat, -clip_range, clip_range, out=flat)
    fixed = np.rint(flat * (1 << frac_bits)).astype(np.int64) * np.int64(weight)
    return fixed.astype(RING_DTYPE)  # two's complement wrap = reduction mod 2^32


def dequantize(ring_sum: np.ndarray, total_weight: float, frac_bits: int = FRAC_BITS) -> np.ndarray:
    """Signed reading of a ring sum, divided back to the weighted mean as float32."""
    if total_weight <= 0:
        raise SecAggError("total weight must be positive")
    signed = np.asarray(ring_sum, dtype=RING_DTYPE).view(np.int32).astype(np.float64)
    return (signed / ((1 << frac_bits) * float(total_weight))).astype(np.float32)


# --- pairwise masks ---------------------------------------------------------------------------


def prg(seed: bytes, size: int) -> np.ndarray:
    """Expand a 32-byte seed into ``size`` uniform ring elements (Philox4x64, counter mode).

    Philox is a counter-based generator used as a keyed PRF: the first 16 bytes are the key,
    the last 16 the counter's start, so all 256 bits of the seed select the stream.
    """
    if not isinstance(seed, (bytes, bytearray)) or len(seed) != SEED_BYTES:
        raise SecAggError(f"a mask seed must be {SEED_BYTES} bytes")
    key = int.from_bytes(seed[:16], "little")
    counter = int.from_bytes(seed[16:], "little") << 128
    gen = np.random.Philox(key=key, counter=counter)
    raw = gen.random_raw((size + 1) // 2)
    return np.ascontiguousarray(raw).view(RING_DTYPE)[:size].copy()


def mask_sign(me: str, other: str) -> int:
    """+1 if ``me`` sorts before ``other``: the two signs of one pair always differ."""
    if me == other:
        raise SecAggError("a member shares no mask with itself")
    return 1 if me < other else -1


def apply_masks(quantized: np.ndarray, me: str, seeds: Mapping[str, bytes]) -> np.ndarray:
    """Add ±prg(seed) for every other member; uint32 arithmetic wraps, which is the ring."""
    out = np.array(quantized, dtype=RING_DTYPE, copy=True)
    for other, seed in sorted(seeds.items()):
        if mask_sign(me, other) > 0:
            out += prg(seed, out.size)
        else:
            out -= prg(seed, out.size)
    return out


def ring_sum(vectors: Iterable[np.ndarray]) -> np.ndarray:
    total: np.ndarray | None = None
    for vec in vectors:
        total = np.array(vec, dtype=RING_DTYPE, copy=True) if total is None else total + vec
    if total is None:
        raise SecAggError("nothing to sum")
    return total


def remove_dangling(
    total: np.ndarray, dropped_seeds: Mapping[tuple[str, str], bytes]
) -> np.ndarray:
    """Cancel the masks survivors shared with dropped members.

    ``dropped_seeds`` maps (survivor, dropped) to their pairwise seed; the survivor added
    mask_sign(survivor, dropped) * prg(seed), which no dropped update is there to cancel.
    """
    out = np.array(total, dtype=RING_DTYPE, copy=True)
    for (survivor, dropped), seed in sorted(dropped_seeds.items()):
        if mask_sign(survivor, dropped) > 0:
            out -= prg(seed, out.size)
        else:
            out += prg(seed, out.size)
    return out


# --- Shamir secret sharing over GF(2^521 - 1) -----------------------------------------------

Share = tuple[int, int]


def split_secret(secret: bytes, count: int, threshold: int) -> list[Share]:
    """``count`` shares (x = 1..count) of which any ``threshold`` rebuild ``secret``.

    A random polynomial of degree threshold - 1 with the secret as constant term: fewer than
    ``threshold`` points are consistent with every possible secret, so they reveal nothing.
    """
    count = check_int(count, "count", low=1)
    threshold = check_int(threshold, "threshold", low=1)
    if threshold > count:
        raise SecAggError(f"threshold {threshold} is more than the {count} shares")
    if len(secret) > 64:
        raise SecAggError("secret is too long for the field")
    coeffs = [int.from_bytes(secret, "big")] + [secrets.randbelow(PRIME) for _ in range(threshold - 1)]
    shares = []
    for x in range(1, count + 1):
        y = 0
        for c in reversed(coeffs):  # Horner
            y = (y * x + c) % PRIME
        shares.append((x, y))
    return shares


def _lagrange_at(points: Sequence[Share], x: int) -> int:
    """The value at ``x`` of the polynomial through ``points`` (distinct x), in the field."""
    total = 0
    for i, (xi, yi) in enumerate(points):
        num, den = 1, 1
        for j, (xj, _) in enumerate(points):
            if i != j:
                num = num * (x - xj) % PRIME
                den = den * (xi - xj) % PRIME
        total = (total + yi * num * pow(den, -1, PRIME)) % PRIME
    return total


def combine_shares(shares: Sequence[Share], threshold: int, length: int = SEED_BYTES) -> bytes:
    """Lagrange interpolation at 0; raises SecAggError with fewer than ``threshold`` shares.

    Shares beyond the threshold must lie on the same polynomial: one wrong share among them
    is caught rather than turned into a wrong seed (and so a wrong sum). With exactly
    ``threshold`` shares a wrong one is still caught with overwhelming probability, because
    a garbled point interpolates to a field element far above the 2^256 seeds.
    """
    points: dict[int, int] = {}
    for x, y in shares:
        if points.setdefault(x, y) != y:
            raise SecAggError(f"two different shares for holder {x}")
    if len(points) < threshold:
        raise SecAggError(f"{len(points)} distinct shares, {threshold} are needed to recover a seed")
    ordered = sorted(points.items())
    chosen, extra = ordered[:threshold], ordered[threshold:]
    if any(_lagrange_at(chosen, x) != y for x, y in extra):
        raise SecAggError("seed shares disagree (one of them is corrupted)")
    secret = _lagrange_at(chosen, 0)
    if secret >= 1 << (8 * length):
        raise SecAggError("shares do not combine to a valid seed (corrupted or mismatched)")
    return secret.to_bytes(length, "big")


def default_threshold(group: int) -> int:
    """Shares needed to rebuild a pairwise seed: a majority of the g - 2 third parties.

    Each seed is known to its two owners, so shares go to the other g - 2 members. A majority
    keeps a minority coalition (with the leader) from rebuilding seeds, while recovery still
    works when up to g - 2 - threshold of the third parties are gone too.
    """
    third = group - 2
    return max(1, third // 2 + 1) if third > 0 else 1


def tolerated_dropouts(group: int, threshold: int) -> int:
    """Most members that may drop while the sum stays recoverable.

    A seed between a dropped member and a survivor has g - 2 third-party holders, of whom
    d - 1 also dropped; recovery needs g - 1 - d >= threshold, and at least one survivor.
    """
    return max(0, min(group - 1 - threshold, group - 1))

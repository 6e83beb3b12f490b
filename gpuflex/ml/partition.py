"""Split the training set across nodes, the same way on every node.

Each node computes the whole partition and keeps its own part, so no index lists travel and
everyone agrees; that only works if the result depends on nothing but the arguments. The
schemes are the usual non-IID benchmarks: Dirichlet label skew (Hsu et al., 2019), label
shards (McMahan et al., 2017) and natural groups (LEAF's per-speaker Shakespeare).
"""

from __future__ import annotations

import numpy as np

SCHEMES = ("iid", "dirichlet", "shards", "groups", "local")
# Redraws of a Dirichlet partition before falling back to moving samples into small parts.
_DIRICHLET_TRIES = 50


def partition_indices(
    labels: np.ndarray,
    num_parts: int,
    scheme: str,
    *,
    alpha: float = 0.5,
    shards_per_node: int = 2,
    seed: int = 0,
    groups: np.ndarray | None = None,
    min_size: int = 1,
) -> list[np.ndarray]:
    """Sorted index arrays, one per part: disjoint and covering, except ``local``.

    ``local`` gives every part all indices: each node holds its own data and trains on all of
    it. ``min_size`` (e.g. the batch size) is a floor for every part under ``dirichlet``;
    it is lowered to what the data can provide when there are too few samples.
    """
    labels = np.asarray(labels)
    n = len(labels)
    if num_parts < 1:
        raise ValueError(f"num_parts must be ≥ 1, got {num_parts}")
    if scheme != "local" and n < num_parts:
        raise ValueError(f"cannot split {n} samples into {num_parts} non-empty parts")
    rng = np.random.default_rng([seed, num_parts, 104729])
    if scheme == "iid":
        parts = np.array_split(rng.permutation(n), num_parts)
    elif scheme == "dirichlet":
        if alpha <= 0:
            raise ValueError(f"alpha must be > 0, got {alpha}")
        parts = _dirichlet(labels, num_parts, alpha, min(max(min_size, 1), n // num_parts), rng)
    elif scheme == "shards":
        parts = _shards(labels, num_parts, shards_per_node, rng)
    elif scheme == "groups":
        if groups is None or len(groups) != n:
            raise ValueError("partition 'groups' needs one group id per sample")
        parts = _groups(np.asarray(groups), num_parts, rng)
    elif scheme == "local":
        return [np.arange(n) for _ in range(num_parts)]
    else:
        raise ValueError(f"unknown partition scheme {scheme!r}, expected one of {SCHEMES}")
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def _dirichlet(
    labels: np.ndarray, k: int, alpha: float, min_size: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Per class, split its samples across parts in Dirichlet(alpha) proportions."""
    classes = np.unique(labels)
    by_class = [np.flatnonzero(labels == c) for c in classes]
    parts: list[np.ndarray] = []
    for _ in range(_DIRICHLET_TRIES):
        buckets: list[list[np.ndarray]] = [[] for _ in range(k)]
        for idx in by_class:
            idx = rng.permutation(idx)
            cuts = (np.cumsum(rng.dirichlet(np.full(k, alpha))) * len(idx)).astype(int)[:-1]
            for bucket, chunk in zip(buckets, np.split(idx, cuts), strict=True):
                bucket.append(chunk)
        parts = [np.concatenate(b) for b in buckets]
        if min(len(p) for p in parts) >= min_size:
            return parts
    return _rebalance(parts, min_size, rng)


def _rebalance(parts: list[np.ndarray], min_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Move random samples from the largest part to the smallest until all reach min_size.

    Only reached for tiny data or tiny alpha; it keeps most of the skew while making sure no
    node is left with less than one batch.
    """
    parts = [rng.permutation(p) for p in parts]
    while True:
        sizes = [len(p) for p in parts]
        small, large = int(np.argmin(sizes)), int(np.argmax(sizes))
        need = min_size - sizes[small]
        if need <= 0:
            return parts
        give = min(need, sizes[large] - min_size)
        parts[small] = np.concatenate([parts[small], parts[large][:give]])
        parts[large] = parts[large][give:]


def _shards(labels: np.ndarray, k: int, per_node: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Sort by label, cut into k·per_node shards, deal per_node random shards to each part."""
    order = rng.permutation(len(labels))
    order = order[np.argsort(labels[order], kind="stable")]
    num_shards = min(k * per_node, len(labels))
    shards = np.array_split(order, num_shards)
    deal = rng.permutation(num_shards)
    return [np.concatenate([shards[s] for s in deal[i::k]]) for i in range(k)]


def _groups(groups: np.ndarray, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Whole groups per part, in seeded order, each to the currently smallest part."""
    ids = rng.permutation(np.unique(groups))
    members = {g: np.flatnonzero(groups == g) for g in ids}
    if len(ids) < k:
        raise ValueError(f"only {len(ids)} groups for {k} parts; every part needs a group")
    buckets: list[list[np.ndarray]] = [[] for _ in range(k)]
    sizes = np.zeros(k, dtype=np.int64)
    for g in ids:
        target = int(np.argmin(sizes))
        buckets[target].append(members[g])
        sizes[target] += len(members[g])
    return [np.concatenate(b) for b in buckets]

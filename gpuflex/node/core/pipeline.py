"""How a delta is prepared by a member and combined by a leader: the job's aggregation pipeline.

The round driver only moves bytes and signatures; everything about the numbers lives here:
the wire codec (none, fp16, int8, top-k, sparse), client-side DP (clip, then Gaussian noise), secure
aggregation masks, and the reducer a collector folds updates into: a streaming weighted mean
by default, or a buffering reducer that applies norm bounding and a robust rule (median,
trimmed mean, Krum, centered clipping) once all inputs are in. Keeping this seam narrow lets
the job file choose the math without touching the protocol.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from aggregation.clipping import norm_bound
from aggregation.compression import Codec, ErrorFeedback, decode_delta, make_codec
from aggregation.dp import add_gaussian_noise, clip_to_norm
from aggregation.encoded import EncodedDelta
from aggregation.errors import AggregationError
from aggregation.fragments import Span
from aggregation.robust import Rule, make_rule
from aggregation.secagg import default_threshold
from aggregation.sparse import SparseVector, Transform, decode_sparse, encode_nonzero
from aggregation.weighted import WeightedAccumulator
from gpuflex.node.core.modelblob import pack_delta, unpack_delta
from gpuflex.node.core.secure import (
    MAGIC,
    Folded,
    GroupContext,
    MaskedUpdate,
    SecAggMember,
    SecAggReducer,
    decode_masked,
    mask_group,
)
from gpuflex.plugins import is_plugin_path, load_callable
from mesh.codec import WireError, WireReason
from mesh.fsutil import atomic_write

if TYPE_CHECKING:
    from gpuflex.jobspec import JobSpec
    from gpuflex.node.core.messages import Plan
    from mesh.identity import Identity

log = logging.getLogger("gpuflex.pipeline")
#: A member's error-feedback residual, in its job's directory.
RESIDUAL_FILE = "residual.f32"
#: Secure aggregation clips each coordinate to this range (wider under DP, whose noise is large).
SECAGG_RANGE = 4.0


class Reducer(Protocol):
    """Folds (vector, weight) pairs; ``result`` is the combined vector."""

    @property
    def count(self) -> int: ...

    def add(self, vector: Folded, weight: float, reporter: str) -> None: ...

    def result(self) -> np.ndarray: ...


def _plain(vector: Folded, reporter: str) -> np.ndarray | SparseVector:
    """A masked update can only be unmasked by its own group's leader, never after failover."""
    if isinstance(vector, MaskedUpdate):
        raise WireError(WireReason.ROUND, f"masked update from {reporter[-8:]} reached a node outside its group")
    return vector


class MeanReducer:
    """Sample-weighted mean, folded as updates arrive (no buffering)."""

    def __init__(self) -> None:
        self._acc = WeightedAccumulator()

    @property
    def count(self) -> int:
        return self._acc.count

    def add(self, vector: Folded, weight: float, reporter: str) -> None:
        vector = _plain(vector, reporter)
        if isinstance(vector, SparseVector):  # summed as it is, never expanded to a dense copy
            self._acc.add_sparse(vector.size, vector.index, vector.values, weight)
        else:
            self._acc.add(vector, weight)

    def result(self) -> np.ndarray:
        return self._acc.result()


class RobustReducer:
    """Buffers every input, then bounds norms and applies the job's robust rule.

    Robust rules need all inputs at once (a median cannot stream), so this keeps one vector
    per child: fine for a group of ``group_size``, and in flat-robust mode for the root alone.
    Inputs are updates at the lowest level and partials above it; each counts once, whatever
    sample count it claims (see aggregation.robust).
    """

    def __init__(self, rule: Rule, rule_name: str, norm_factor: float = 0.0, norm_mode: str = "clip",
                 fallback: Rule | None = None) -> None:
        self.rule, self.rule_name = rule, rule_name
        self.norm_factor, self.norm_mode = norm_factor, norm_mode
        self.fallback = fallback
        self.vectors: list[np.ndarray] = []
        self.weights: list[float] = []
        self.reporters: list[str] = []
        self.rejected: list[str] = []
        self.applied = ""

    @property
    def count(self) -> int:
        return len(self.vectors)

    def add(self, vector: Folded, weight: float, reporter: str) -> None:
        vector = _plain(vector, reporter)
        if isinstance(vector, SparseVector):  # a robust rule needs every input whole
            vector = vector.dense()
        if not np.all(np.isfinite(vector)):
            raise WireError(WireReason.GARBLED, f"update from {reporter[-8:]} has non-finite values")
        if self.vectors and vector.shape != self.vectors[0].shape:
            raise WireError(WireReason.GARBLED, f"update from {reporter[-8:]} has the wrong size")
        self.vectors.append(np.asarray(vector, dtype=np.float32))
        self.weights.append(float(weight))
        self.reporters.append(reporter)

    def result(self) -> np.ndarray:
        vectors, weights = self.vectors, self.weights
        if not vectors:
            raise AggregationError("no vector was added: nothing to aggregate")
        if self.norm_factor > 0 and len(vectors) > 1:
            vectors, dropped = norm_bound(vectors, self.norm_factor, self.norm_mode)  # type: ignore[arg-type]
            self.rejected = [self.reporters[i] for i in dropped]
            weights = [w for i, w in enumerate(weights) if i not in set(dropped)]
        try:
            out = self.rule(vectors, weights)
            self.applied = self.rule_name
        except AggregationError as exc:
            # Krum needs n >= 2f + 3; a small group (or a round with dropouts) may have fewer.
            if self.fallback is None:
                raise
            log.warning("rule %s cannot run on %d inputs (%s); using the median", self.rule_name,
                        len(vectors), exc)
            out = self.fallback(vectors, weights)
            self.applied = "median"
        return np.asarray(out, dtype=np.float32)


def secagg_context(spec: JobSpec, plan: Plan, node: str) -> GroupContext | None:
    """The secure-aggregation group ``node`` masks in (as member) or unmasks (as leader)."""
    if not spec.secure_aggregation:
        return None
    leader, group = mask_group(plan.parent, node)
    if not group:
        return None
    threshold = spec.secagg_threshold_for(default_threshold(len(group)))
    return GroupContext(job=plan.job, round=plan.round, attempt=plan.attempt, leader=leader,
                        group=group, threshold=min(threshold, max(1, len(group) - 2)),
                        clip_range=secagg_range(spec))


def secagg_range(spec: JobSpec) -> float:
    """Per-coordinate range of the ring encoding: DP noise (std z*C) must fit inside it."""
    return max(SECAGG_RANGE, 6.0 * spec.dp_noise_multiplier * spec.dp_clip)


def make_reducer(spec: JobSpec, is_root: bool, plan: Plan | None = None,
                 me: str | None = None) -> Reducer:
    """The reducer a leader or root folds its inputs into, per the job's rule and settings.

    ``plan`` and ``me`` are only needed for secure aggregation (to know the masking group).
    """
    if spec.secure_aggregation and plan is not None and me is not None:
        ctx = secagg_context(spec, plan, me)
        if ctx is not None and ctx.leader == me:
            return SecAggReducer(ctx)
    if spec.rule == "mean" and spec.norm_bound <= 0:
        return MeanReducer()
    rule = plugin_rule(spec) if is_plugin_path(spec.rule) else make_rule(spec.rule, **spec.rule_params)
    fallback = make_rule("median") if spec.rule in ("krum", "multi-krum") else None
    return RobustReducer(rule, spec.rule, spec.norm_bound, spec.norm_bound_mode, fallback)


def plugin_rule(spec: JobSpec) -> Rule:
    """A user's rule ``package.module:function(vectors, weights) -> vector``, with its
    ``rule_params`` passed as keywords; its output is checked like any update."""
    fn = load_callable(spec.rule, "rule")
    params = dict(spec.rule_params)

    def rule(vectors: Any, weights: Any = None) -> np.ndarray:
        out = np.asarray(fn(vectors, weights, **params), dtype=np.float32)
        if out.shape != np.shape(vectors[0]) or not np.all(np.isfinite(out)):
            raise AggregationError(f"rule {spec.rule!r} returned a vector of the wrong shape or non-finite values")
        return out

    return rule


def describe_rule(spec: JobSpec) -> dict[str, Any]:
    """The aggregation settings a Result records, so an audit shows how it was combined."""
    return {"rule": spec.rule, "params": dict(sorted(spec.rule_params.items())),
            "mode": spec.aggregation_mode, "norm_bound": spec.norm_bound,
            "norm_bound_mode": spec.norm_bound_mode, "secure_aggregation": spec.secure_aggregation,
            "dp_clip": spec.dp_clip, "dp_noise_multiplier": spec.dp_noise_multiplier}


class DeltaEncoder:
    """A member's side: DP clip and noise, then secure-aggregation masks or the job's codec.

    The DP noise generator is seeded from the operating system on purpose: noise that anyone
    could regenerate from the job seed would protect nothing.
    """

    def __init__(self, spec: JobSpec, rng: np.random.Generator | None = None,
                 residual_path: Path | None = None) -> None:
        self.spec = spec
        self.codec = job_codec(spec)
        # What a lossy codec drops (top-k most of all) is sent in a later round instead of
        # lost; the residual stays on this node and follows the DP noise, never the raw delta.
        decay = spec.sparse_feedback_decay if spec.codec == "sparse" else 1.0
        self.feedback = ErrorFeedback(self.codec, decay) if self.codec is not None and spec.error_feedback else None
        # Saved after every update, atomically, so a restarted member still sends what it
        # held back (a sparse codec holds back most of each update).
        self.residual_path = residual_path if self.feedback is not None else None
        self._restore_residual()
        self.rng = rng or np.random.default_rng()
        self.last_clip_scale = 1.0

    def _restore_residual(self) -> None:
        path = self.residual_path
        if self.feedback is None or path is None or not path.is_file():
            return
        try:
            data = path.read_bytes()
        except OSError as exc:
            log.warning("could not read the error-feedback residual %s (%s); starting without it", path, exc)
            return
        if len(data) % 4 or not data:
            log.warning("error-feedback residual %s is damaged; starting without it", path)
            return
        self.feedback.restore(unpack_delta(data, len(data) // 4).copy())

    def privatize(self, delta: np.ndarray) -> np.ndarray:
        """Clip to dp_clip and add N(0, (z * dp_clip)^2) per coordinate, when DP is on."""
        if not self.spec.uses_dp:
            return delta
        clipped, self.last_clip_scale = clip_to_norm(delta, self.spec.dp_clip)
        return add_gaussian_noise(clipped, self.spec.dp_noise_multiplier, self.spec.dp_clip, self.rng)

    def encode(self, delta: np.ndarray, samples: int = 1, secagg: SecAggMember | None = None,
               span: Span | None = None) -> bytes:
        """The update's wire bytes. ``span`` says which fragment of the model ``delta`` is
        (``fragments`` > 1): the error-feedback residual stays model-sized, and only that
        fragment's part of it joins this update."""
        delta = self.privatize(np.ascontiguousarray(delta, dtype=np.float32))
        if secagg is not None:
            return secagg.encode(delta, samples)
        if self.codec is None:
            return np.ascontiguousarray(delta, dtype="<f4").tobytes()
        delta = np.ascontiguousarray(delta, dtype=np.float32)
        if self.feedback is not None:
            size = delta.size if span is None else span.size
            if self.feedback.residual is not None and self.feedback.residual.size != size:
                self.feedback.reset()
            out = (self.feedback.compress(delta) if span is None
                   else self.feedback.compress_span(delta, span.start, span.size)).to_bytes()
            if self.residual_path is not None and self.feedback.residual is not None:
                atomic_write(self.residual_path, pack_delta(self.feedback.residual))
            return out
        return self.codec.encode(delta).to_bytes()


def job_codec(spec: JobSpec) -> Codec | None:
    """The codec a member encodes its update with, with the job's settings; None for raw."""
    if spec.codec == "none":
        return None
    if spec.codec == "sparse":
        return make_codec("sparse", density=spec.sparse_density, bits=spec.sparse_bits,
                          chunk=spec.sparse_chunk, transform=spec.sparse_transform)
    return make_codec(spec.codec)


def job_transform(spec: JobSpec) -> Transform:
    return Transform.DCT if spec.sparse_transform == "dct" else Transform.NONE


def decode_sparse_payload(spec: JobSpec, payload: bytes, size: int) -> SparseVector:
    """A sparse update or partial, checked, in the job's transform domain (where leaders and
    the root sum: the DCT is linear, so the sum of coefficients is the coefficients of the sum)."""
    try:
        vec, transform, chunk = decode_sparse(EncodedDelta.from_bytes(payload))
    except AggregationError as exc:
        raise WireError(WireReason.GARBLED, f"sparse delta could not be decoded: {exc}") from None
    if vec.size != size or chunk != spec.sparse_chunk or transform is not job_transform(spec):
        raise WireError(WireReason.GARBLED,
                        f"sparse delta has size {vec.size}, chunk {chunk}, transform {transform.name}; "
                        f"the job needs {size}, {spec.sparse_chunk}, {spec.sparse_transform}")
    return vec


def pack_partial(spec: JobSpec, avg: np.ndarray) -> bytes:
    """A group's partial for the wire: under codec = "sparse" only its nonzeros (float32,
    lossless), else every value as float32."""
    if spec.codec == "sparse":
        return encode_nonzero(avg, 32, spec.sparse_chunk, job_transform(spec)).to_bytes()
    return pack_delta(avg)


def unpack_partial(spec: JobSpec, payload: bytes, size: int) -> np.ndarray | SparseVector:
    """``pack_partial`` undone, checked against the model's ``size`` (a SparseVector under
    codec = "sparse", which the reducers take as it is)."""
    if spec.codec == "sparse":
        return decode_sparse_payload(spec, payload, size)
    return unpack_delta(payload, size)


def secagg_member(spec: JobSpec, identity: Identity, plan: Plan) -> SecAggMember | None:
    """The masking side for this node's update, or None if it sends in clear (or leads)."""
    ctx = secagg_context(spec, plan, identity.peer_id)
    if ctx is None or identity.peer_id not in ctx.group:
        return None
    return SecAggMember(identity, ctx)


def decode_update(spec: JobSpec, payload: bytes, size: int) -> Folded:
    """A leader's side of one update: masked under secure aggregation (only its group's leader
    folds it, through the SecAggReducer), else plain (``decode_payload``)."""
    masked = spec.secure_aggregation and payload[:4] == MAGIC
    return decode_masked(payload, size) if masked else decode_payload(spec, payload, size)


def decode_payload(spec: JobSpec, payload: bytes, size: int) -> np.ndarray | SparseVector:
    """A plain update's wire bytes back to a float32 vector of ``size`` entries, or its
    nonzeros under codec = "sparse" (a masked update goes through ``decode_update``)."""
    if spec.codec == "none":
        return unpack_delta(payload, size)
    if spec.codec == "sparse":
        return decode_sparse_payload(spec, payload, size)
    try:
        enc = EncodedDelta.from_bytes(payload)
        # The job's codec and the model's size, checked before decoding: a codec that names
        # its size (top-k, sparse) must not make a leader allocate whatever size it claims.
        if enc.codec != spec.codec or enc.size != size:
            raise WireError(WireReason.GARBLED, f"delta is {enc.codec!r} of {enc.size} values; the job needs "
                            f"{spec.codec!r} of {size}")
        vec = decode_delta(enc)
    except AggregationError as exc:
        raise WireError(WireReason.GARBLED, f"delta could not be decoded: {exc}") from None
    if vec.size != size or not np.all(np.isfinite(vec)):
        raise WireError(WireReason.GARBLED, "decoded delta has the wrong size or non-finite values")
    return vec

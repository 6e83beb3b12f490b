"""The committed step: how the root turns a round's average into the next model, and how
every member rebuilds that model from the one it holds.

With a step codec (fp16, int8, sparse), or with ``fragments`` > 1, the root's step travels
encoded instead of the model, and each member replays it and checks the result against the
signed model hash. Under ``fragments`` > 1 a round's step is one fragment of the model
(``aggregation.fragments``), applied to that fragment alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from aggregation.compression import decode_delta, make_codec
from aggregation.encoded import EncodedDelta
from aggregation.errors import AggregationError
from aggregation.feddyn import FedDyn
from aggregation.fragments import Span, round_span
from aggregation.scaffold import Scaffold
from aggregation.server_opt import ServerOptimizer, make_server_optimizer
from aggregation.sparse import encode_nonzero
from gpuflex.node.core.pipeline import job_transform
from mesh.codec import WireError, WireReason

if TYPE_CHECKING:
    from gpuflex.jobspec import JobSpec


#: Codecs whose output members can replay: the averaged step travels in them instead of the model.
STEP_CODECS = ("fp16", "int8", "sparse")


def encode_step(spec: JobSpec, avg: np.ndarray) -> bytes | None:
    """The committed step for the wire, or None when members download the model.

    With ``fragments`` > 1 there is always a step: a round changes one fragment, so the
    fragment's step is far smaller than the model even as float32 (codec "none" or "topk").

    Under codec = "sparse" the average of sparse updates is itself sparse (the union of what
    members sent): every nonzero travels, its value at ``sparse_step_bits``, so the step is
    about members x density of the model, never the whole of it. Top-k is left out on
    purpose: a top-k of the average with no error feedback at the root would drop most of
    every round's progress.
    """
    if spec.codec == "sparse":
        return encode_nonzero(avg, spec.sparse_step_bits, spec.sparse_chunk, job_transform(spec)).to_bytes()
    if spec.codec in STEP_CODECS or spec.fragments > 1:
        codec = spec.codec if spec.codec in STEP_CODECS else "none"
        return make_codec(codec).encode(np.ascontiguousarray(avg, dtype=np.float32)).to_bytes()
    return None


def sync_span(spec: JobSpec, model_size: int, round_: int) -> Span | None:
    """The fragment of the model round ``round_`` syncs, or None when every round syncs the
    whole model (``fragments`` = 1)."""
    return round_span(model_size, spec.fragments, round_) if spec.fragments > 1 else None


def _server_step(spec: JobSpec, params: np.ndarray, state: dict[str, np.ndarray], avg: np.ndarray,
                 round_: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The server optimizer on the round's fragment alone (the whole model at F = 1): the
    other fragments' parameters and optimizer state are copied as they are, so each
    fragment's outer momentum moves only when that fragment syncs."""
    span = sync_span(spec, params.size, round_)
    if span is None:
        return server_optimizer(spec).step(params, avg, state)
    if avg.size != span.length:
        raise AggregationError(f"round {round_} syncs {span.length} values, the step has {avg.size}")
    lo, hi = span.start, span.stop
    part, part_state = server_optimizer(spec).step(params[lo:hi], avg, {k: v[lo:hi] for k, v in state.items()})
    new_params = np.array(params, dtype=np.float32, copy=True)
    new_params[lo:hi] = part
    new_state = {k: np.array(v, dtype=np.float32, copy=True) for k, v in state.items()}
    for key, value in part_state.items():
        full = new_state.setdefault(key, np.zeros(params.size, dtype=np.float32))
        full[lo:hi] = value
    return new_params, new_state


def outer_step(spec: JobSpec, params: np.ndarray, state: dict[str, np.ndarray],
               avg: np.ndarray, round_: int = 1) -> tuple[np.ndarray, dict[str, np.ndarray], bytes | None]:
    """The root's step: the new model, its optimizer state, and the encoded step (or None).

    With a step codec the root encodes the average first and applies the decoded step, so
    every member that holds the previous model rebuilds the new one bit for bit from about a
    quarter (int8) of the model's bytes, optimizer state included, and checks it against the
    model hash in the signed result. The step is defined by what the members can replay.
    With ``fragments`` > 1, ``avg`` is round ``round_``'s fragment, and the step applies to it
    alone (``_server_step``).
    """
    step = encode_step(spec, avg)
    if step is not None:
        avg = decode_delta(step)
    new_params, new_state = _server_step(spec, params, state, avg, round_)
    return new_params, new_state, step


def replay_step(spec: JobSpec, params: np.ndarray, state: dict[str, np.ndarray],
                step: bytes, round_: int = 1) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """A member's side of ``outer_step``: the new model from the previous one and the step.

    The step's size is checked against the model before it is decoded: a sparse step names
    its size, and a dense vector of a size it merely claims must never be allocated."""
    try:
        enc = EncodedDelta.from_bytes(step)
        span = sync_span(spec, params.size, round_)
        expected = update_size(spec, params.size) if span is None else span.length
        if enc.size != expected:
            what = f"the model {params.size}" if span is None else f"round {round_}'s fragment {expected}"
            raise WireError(WireReason.GARBLED, f"committed step has {enc.size} values, {what}")
        avg = decode_delta(enc)
    except AggregationError as exc:
        raise WireError(WireReason.GARBLED, f"committed step could not be decoded: {exc}") from None
    return _server_step(spec, params, state, avg, round_)


def update_size(spec: JobSpec, model_size: int) -> int:
    """Values in one update or step: the model's, twice over with SCAFFOLD (model and control)."""
    return 2 * model_size if spec.drift_correction == "scaffold" else model_size


def server_optimizer(spec: JobSpec) -> ServerOptimizer:
    """The root's optimizer with the job's server_lr (and server_momentum where it has one)."""
    params: dict[str, float] = {"lr": spec.server_lr}
    if spec.strategy in ("fedavgm", "diloco"):
        params["momentum"] = spec.server_momentum
    inner = make_server_optimizer(spec.strategy, **params)
    if spec.drift_correction == "feddyn":
        return FedDyn(inner)
    return Scaffold(inner) if spec.drift_correction == "scaffold" else inner

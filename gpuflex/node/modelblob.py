"""The global model as a content-addressed blob: parameters plus server-optimizer state.

The coordinator changes every round, so FedAvgM momentum or FedAdam moments cannot live on
one machine; they travel inside the model blob, and every node holds the same bytes (and so
the same hash) after each commit.
"""

from __future__ import annotations

import msgpack
import numpy as np

from mesh.codec import WireError


def pack_model(params: np.ndarray, state: dict[str, np.ndarray] | None = None) -> bytes:
    body = {
        "v": 1,
        "p": np.ascontiguousarray(params, dtype="<f4").tobytes(),
        "s": {k: np.ascontiguousarray(v, dtype="<f4").tobytes() for k, v in sorted((state or {}).items())},
    }
    return msgpack.packb(body, use_bin_type=True)


def unpack_model(data: bytes) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    try:
        body = msgpack.unpackb(data, raw=False)
        params = np.frombuffer(body["p"], dtype="<f4").astype(np.float32)
        state = {k: np.frombuffer(v, dtype="<f4").astype(np.float32) for k, v in body["s"].items()}
    except Exception as exc:  # untrusted bytes may fail msgpack or numpy in any way
        raise WireError("garbled", f"model blob could not be decoded ({exc.__class__.__name__})") from None
    if any(v.shape != params.shape for v in state.values()):
        raise WireError("garbled", "optimizer state does not match the parameter count")
    return params, state


def pack_delta(delta: np.ndarray) -> bytes:
    return np.ascontiguousarray(delta, dtype="<f4").tobytes()


def unpack_delta(data: bytes, size: int) -> np.ndarray:
    if len(data) != size * 4:
        raise WireError("garbled", f"delta has {len(data)} bytes, expected {size * 4}")
    return np.frombuffer(data, dtype="<f4").astype(np.float32, copy=False)

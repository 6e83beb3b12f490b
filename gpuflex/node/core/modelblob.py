"""The global model as a content-addressed blob: parameters plus server-optimizer state.

The coordinator changes every round, so FedAvgM momentum or FedAdam moments cannot live on
one machine; they travel inside the model blob, and every node holds the same bytes (and so
the same hash) after each commit.

The blob is the msgpack map ``{"v": 1, "p": <float32 bytes>, "s": {name: <float32 bytes>}}``.
At 100M parameters every copy is 400 MB, so both directions avoid the generic msgpack path:
packing writes the same bytes msgpack would straight into one buffer, and unpacking returns
read-only float32 views into the blob instead of copies.
"""

from __future__ import annotations

import struct

import msgpack
import numpy as np

from mesh.codec import WireError, WireReason

_LITTLE = np.dtype("<f4") == np.dtype(np.float32)


def _bin_header(n: int) -> bytes:
    if n < 1 << 8:
        return b"\xc4" + struct.pack(">B", n)
    if n < 1 << 16:
        return b"\xc5" + struct.pack(">H", n)
    return b"\xc6" + struct.pack(">I", n)


def _str(text: str) -> bytes:
    return msgpack.packb(text, use_bin_type=True)


#: Arrays a model blob holds besides the parameters: the server optimizer's state, at most two
#: vectors the size of the model (FedAdam's moments).
MAX_STATE_VECTORS = 2
#: msgpack headers and names around the arrays: a few dozen bytes, with room to spare.
BLOB_OVERHEAD = 64 << 10


def model_blob_limit(params: int) -> int:
    """The largest model blob (or committed step) of a model of ``params`` parameters: what a
    peer may announce before this node reserves disk for it."""
    return 4 * params * (1 + MAX_STATE_VECTORS) + BLOB_OVERHEAD


def model_parts(params: np.ndarray, state: dict[str, np.ndarray] | None = None) -> list[memoryview]:
    """The blob as a list of buffers (headers, then the arrays themselves, uncopied) whose
    concatenation is exactly ``msgpack.packb`` of the map; hash and store them with
    ``parts_hash`` and ``BlobStore.put_parts``."""
    arrays = [np.ascontiguousarray(params, dtype="<f4").reshape(-1)]
    items = sorted((state or {}).items())
    pieces: list[bytes | np.ndarray] = [b"\x83", _str("v"), b"\x01", _str("p"), _bin_header(arrays[0].nbytes),
                                        arrays[0], _str("s")]
    n = len(items)
    pieces.append(bytes([0x80 | n]) if n < 16 else b"\xde" + struct.pack(">H", n))
    for key, value in items:
        arr = np.ascontiguousarray(value, dtype="<f4").reshape(-1)
        pieces += [_str(key), _bin_header(arr.nbytes), arr]
    return [p.data.cast("B") if isinstance(p, np.ndarray) else memoryview(p) for p in pieces]


def pack_model(params: np.ndarray, state: dict[str, np.ndarray] | None = None) -> bytes:
    """The blob bytes in one buffer (for small models, tests and audits)."""
    return b"".join(model_parts(params, state))


class _Cursor:
    """Reads exactly the msgpack this module writes; anything else is a ValueError."""

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self.data, self.at = data, 0

    def byte(self) -> int:
        value = self.data[self.at]
        self.at += 1
        return int(value)

    def uint(self, fmt: str) -> int:
        value = struct.unpack_from(fmt, self.data, self.at)[0]
        self.at += struct.calcsize(fmt)
        return int(value)

    def map_len(self) -> int:
        tag = self.byte()
        if 0x80 <= tag <= 0x8F:
            return tag & 0x0F
        if tag == 0xDE:
            return self.uint(">H")
        raise ValueError("expected a map")

    def text(self) -> str:
        tag = self.byte()
        n = tag & 0x1F if 0xA0 <= tag <= 0xBF else self.uint(">B") if tag == 0xD9 else -1
        if n < 0:
            raise ValueError("expected a short string")
        raw = bytes(self.data[self.at:self.at + n])
        self.at += n
        return raw.decode("utf-8")

    def floats(self) -> np.ndarray:
        tag = self.byte()
        n = {0xC4: ">B", 0xC5: ">H", 0xC6: ">I"}.get(tag)
        if n is None:
            raise ValueError("expected a bin value")
        size = self.uint(n)
        if size % 4 or self.at + size > len(self.data):
            raise ValueError("float32 section is cut or ragged")
        arr = np.frombuffer(self.data, dtype="<f4", count=size // 4, offset=self.at)
        self.at += size
        return arr if _LITTLE else arr.astype(np.float32)


def unpack_model(data: bytes | bytearray | memoryview) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(params, state) as float32 views into ``data`` (read-only when ``data`` is bytes), so
    a 400 MB blob costs no second 400 MB to read."""
    try:
        cur = _Cursor(data)
        params: np.ndarray | None = None
        state: dict[str, np.ndarray] = {}
        version = None
        for _ in range(cur.map_len()):
            key = cur.text()
            if key == "v":
                version = cur.byte()
            elif key == "p":
                params = cur.floats()
            elif key == "s":
                for _ in range(cur.map_len()):
                    name = cur.text()
                    state[name] = cur.floats()
            else:
                raise ValueError(f"unknown key {key!r}")
        if version != 1 or params is None or cur.at != len(data):
            raise ValueError("unknown version, no parameters, or trailing bytes")
    except Exception as exc:  # untrusted bytes may fail in any way
        raise WireError(WireReason.GARBLED, f"model blob could not be decoded ({exc.__class__.__name__})") from None
    if any(v.shape != params.shape for v in state.values()):
        raise WireError(WireReason.GARBLED, "optimizer state does not match the parameter count")
    return params, state


def pack_delta(delta: np.ndarray) -> bytes:
    return np.ascontiguousarray(delta, dtype="<f4").tobytes()


def unpack_delta(data: bytes, size: int) -> np.ndarray:
    if len(data) != size * 4:
        raise WireError(WireReason.GARBLED, f"delta has {len(data)} bytes, expected {size * 4}")
    return np.frombuffer(data, dtype="<f4").astype(np.float32, copy=False)

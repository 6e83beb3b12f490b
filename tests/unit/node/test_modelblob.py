"""Model blobs built from parts and read back as views: the same bytes (and so the same hash)
as the msgpack map they have always been, without joining or copying 400 MB buffers."""

from __future__ import annotations

from pathlib import Path

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuflex.node.core.modelblob import model_parts, pack_model, unpack_model
from mesh.blob import BlobStore, blob_hash, parts_hash
from mesh.codec import WireError


def msgpack_blob(params: np.ndarray, state: dict[str, np.ndarray]) -> bytes:
    return msgpack.packb({"v": 1, "p": params.astype("<f4").tobytes(),
                          "s": {k: v.astype("<f4").tobytes() for k, v in sorted(state.items())}}, use_bin_type=True)


@settings(max_examples=60, deadline=None)
@given(size=st.sampled_from([0, 1, 63, 64, 16383, 16384, 70000]), keys=st.integers(0, 18), seed=st.integers(0, 99))
def test_parts_are_the_msgpack_bytes_and_read_back_exactly(size: int, keys: int, seed: int, tmp_path_factory) -> None:
    rng = np.random.default_rng(seed)
    params = rng.normal(size=size).astype(np.float32)
    state = {f"k{i}": rng.normal(size=size).astype(np.float32) for i in range(keys)}
    expected = msgpack_blob(params, state)
    parts = model_parts(params, state)
    assert pack_model(params, state) == expected and parts_hash(parts) == blob_hash(expected)
    store = BlobStore(tmp_path_factory.mktemp("blobs"))
    assert store.put_parts(parts) == blob_hash(expected) and store.read(blob_hash(expected)) == expected
    got, got_state = unpack_model(expected)
    assert np.array_equal(got, params) and got_state.keys() == state.keys()
    assert all(np.array_equal(got_state[k], state[k]) for k in state)


@pytest.mark.parametrize("data", [b"", b"\x83", msgpack_blob(np.ones(3, np.float32), {}) + b"x",
                                  msgpack_blob(np.ones(3, np.float32), {})[:-1],
                                  msgpack.packb({"v": 2, "p": b"", "s": {}}),
                                  msgpack_blob(np.ones(3, np.float32), {"m": np.ones(2, np.float32)})])
def test_a_garbled_blob_is_a_wire_error(data: bytes, tmp_path: Path) -> None:
    with pytest.raises(WireError):
        unpack_model(data)

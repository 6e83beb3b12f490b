"""CIFAR python batches are read without unpickling: data is accepted, code is refused."""

from __future__ import annotations

import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest

from gpuflex.ml import pybatch
from gpuflex.ml.pybatch import BatchFormatError, parse_batch, read_batch


def cifar_batch(n: int = 3) -> dict[bytes, object]:
    rng = np.random.default_rng(1)
    return {b"batch_label": b"training batch 1 of 5", b"labels": [int(v) for v in rng.integers(0, 10, n)],
            b"data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8),
            b"filenames": [f"img_{i}.png".encode() for i in range(n)]}


def py2_batch(data: np.ndarray, labels: list[int]) -> bytes:
    """The bytes Python 2's cPickle writes for the published CIFAR-10 files (protocol 2): str
    as BINSTRING, numpy's old module name, the dtype's state as a 8-tuple."""
    def s(text: bytes) -> bytes:
        return (b"U" + bytes([len(text)]) + text) if len(text) < 256 else (b"T" + struct.pack("<i", len(text)) + text)

    raw = data.tobytes()
    out = b"\x80\x02}q\x00(" + s(b"data")
    out += b"cnumpy.core.multiarray\n_reconstruct\nq\x01cnumpy\nndarray\nq\x02K\x00\x85" + s(b"b") + b"\x87Rq\x03("
    out += b"K\x01" + b"".join(b"M" + struct.pack("<H", d) for d in data.shape) + b"\x86"
    out += b"cnumpy\ndtype\nq\x04" + s(b"u1") + b"K\x00K\x01\x87Rq\x05(K\x03" + s(b"|")
    out += b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb"
    out += b"\x89" + s(raw) + b"tb" + s(b"labels") + b"]q\x06(" + b"".join(b"K" + bytes([v]) for v in labels) + b"eu."
    return out


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_python3_batches_of_every_protocol_are_read(protocol: int) -> None:
    batch = cifar_batch()
    out = parse_batch(pickle.dumps(batch, protocol=protocol))
    assert out[b"labels"] == batch[b"labels"] and out[b"filenames"] == batch[b"filenames"]
    assert out[b"data"].dtype == np.uint8 and np.array_equal(out[b"data"], batch[b"data"])
    fortran = np.asfortranarray(batch[b"data"])
    assert np.array_equal(parse_batch(pickle.dumps({b"data": fortran}, protocol=protocol))[b"data"], fortran)


def test_the_python2_format_of_the_published_files_is_read(tmp_path: Path) -> None:
    data = np.arange(2 * 3072, dtype=np.uint8).reshape(2, 3072)
    path = tmp_path / "data_batch_1"
    path.write_bytes(py2_batch(data, [3, 7]))
    out = read_batch(path)
    assert out[b"labels"] == [3, 7] and np.array_equal(out[b"data"], data)


class RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.mkdir, (str(self.marker),)


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_a_batch_that_would_run_code_is_refused_and_runs_nothing(tmp_path: Path, protocol: int) -> None:
    marker = tmp_path / "ran"
    path = tmp_path / "data_batch_1"
    path.write_bytes(pickle.dumps({b"data": RunsCode(marker), b"labels": [1]}, protocol=protocol))
    with pytest.raises(BatchFormatError):
        read_batch(path)
    assert not marker.exists()


@pytest.mark.parametrize(("blob", "why"), [
    (pickle.dumps({b"data": np.zeros(4, np.float64)}), "u1"),  # only uint8 arrays
    (pickle.dumps({b"x": np.dtype("u1")}), "dtype"),  # a dtype on its own is not data
    (pickle.dumps([1, 2, 3])[:-1], "STOP"),  # truncated
    (pickle.dumps({b"a": 1}).replace(b"}", b"]", 1), "dict"),  # SETITEM into a list
    (b"\x80\x02cbuiltins\nbytearray\nq\x00.", "refusing global"),
    (b"\x80\x02X\xff\xff\xff\x7f" + b"x" * 10 + b".", "well-formed"),  # a string longer than the file
])
def test_malformed_or_foreign_pickles_are_clear_errors(blob: bytes, why: str) -> None:
    with pytest.raises(BatchFormatError, match=why):
        parse_batch(blob)


def test_array_shapes_must_match_their_bytes() -> None:
    good = pickle.dumps({b"data": np.zeros((2, 3), np.uint8)}, protocol=4)
    bad = good.replace(b"K\x02K\x03\x86", b"K\x09K\x09\x86")
    assert bad != good
    with pytest.raises(BatchFormatError, match="does not match"):
        parse_batch(bad)


def test_sizes_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "big"
    path.write_bytes(pickle.dumps(cifar_batch(50)))
    monkeypatch.setattr(pybatch, "MAX_FILE_BYTES", 1000)
    with pytest.raises(BatchFormatError, match="larger than"):
        read_batch(path)
    monkeypatch.setattr(pybatch, "MAX_FILE_BYTES", 1 << 30)
    monkeypatch.setattr(pybatch, "MAX_OPS", 40)
    with pytest.raises(BatchFormatError, match="more than 40 opcodes"):
        read_batch(path)
    # A memoised buffer reused costs no copy: 1000 arrays over one 1 MB buffer share it.
    monkeypatch.setattr(pybatch, "MAX_OPS", 5_000_000)
    arrays = [np.zeros(1 << 20, np.uint8)] * 1000
    out = parse_batch(pickle.dumps({b"data": arrays}, protocol=5))
    assert len(out[b"data"]) == 1000 and all(a.base is out[b"data"][0].base for a in out[b"data"])

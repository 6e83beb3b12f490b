from __future__ import annotations

from pathlib import Path

import pytest

from mesh.blob import BlobError, BlobIntegrityError, BlobStore, blob_hash


def test_put_and_read(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    digest = store.put(b"weights")
    assert digest == blob_hash(b"weights")
    assert store.read(digest) == b"weights"


def test_corrupt_blob_on_disk_is_detected_and_removed(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    digest = store.put(b"weights")
    store.path(digest).write_bytes(b"weightz")
    with pytest.raises(BlobError, match="corrupt"):
        store.read(digest)
    assert not store.has(digest)


def test_incoming_blob_with_wrong_bytes_never_enters_the_store(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    digest = blob_hash(b"expected")
    incoming = store.incoming(digest)
    incoming.write(b"something else")
    with pytest.raises(BlobIntegrityError, match="wrong bytes"):
        incoming.commit("peerX")
    assert not store.has(digest)
    assert not list(tmp_path.glob("*.part"))


def test_bad_hash_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BlobError):
        BlobStore(tmp_path).path("../../etc/passwd")

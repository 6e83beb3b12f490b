"""The bulk side channel on its own: real sockets on loopback, hostile peers played by hand."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from mesh import bulk
from mesh.codec import WireError

LOOPBACK = "127.0.0.1"


@pytest.fixture(autouse=True)
def _short_accept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bulk, "ACCEPT_TIMEOUT_S", 3.0)
    monkeypatch.setattr(bulk, "IO_TIMEOUT_S", 5.0)


def _blob(tmp_path: Path, size: int) -> tuple[Path, bytes]:
    data = os.urandom(size)
    path = tmp_path / "blob"
    path.write_bytes(data)
    return path, data


class OnThread:
    """Runs ``fn`` on a daemon thread; ``join`` gives its return value or the exception it raised."""

    def __init__(self, fn: Callable[[], object]) -> None:
        self.result: object = None
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()

    def _run(self, fn: Callable[[], object]) -> None:
        try:
            self.result = fn()
        except BaseException as exc:
            self.result = exc

    def join(self) -> object:
        self.thread.join(10)
        assert not self.thread.is_alive()
        return self.result


class Serving(OnThread):
    """A sender serving one file on a thread; ``result`` is bytes sent or the exception."""

    def __init__(self, path: Path, size: int, cipher: str = "aes256gcm", peer_ip: str | None = LOOPBACK) -> None:
        self.sender = bulk.BulkSender(LOOPBACK, peer_ip, cipher)
        super().__init__(lambda: self.sender.serve(path, size))


def _collect(receive: Callable[[int, Callable[[memoryview], None]], None], size: int) -> bytes:
    """What a receiving side's ``receive`` hands over, joined."""
    chunks: list[bytes] = []
    receive(size, lambda view: chunks.append(bytes(view)))
    return b"".join(chunks)


def _receive(offer: bulk.BulkOffer, size: int, port: int | None = None) -> bytes:
    receiver = bulk.BulkReceiver(LOOPBACK, offer if port is None else bulk.BulkOffer(port, offer.key, offer.tid,
                                                                                     offer.cipher))
    receiver.connect()
    return _collect(receiver.receive, size)


@pytest.mark.parametrize("cipher", bulk.CIPHERS)
@pytest.mark.parametrize("size", [1, bulk.FRAME, 3 * bulk.FRAME + 12345])
def test_bytes_arrive_intact_with_either_cipher(tmp_path: Path, cipher: str, size: int) -> None:
    path, data = _blob(tmp_path, size)
    serving = Serving(path, size, cipher)
    assert _receive(serving.sender.offer, size) == data
    assert serving.join() == size


def test_a_stranger_who_connects_first_is_dropped_and_the_peer_is_still_served(tmp_path: Path) -> None:
    path, data = _blob(tmp_path, 100_000)
    serving = Serving(path, len(data))
    with socket.create_connection((LOOPBACK, serving.sender.offer.port), timeout=5) as stranger:
        stranger.sendall(b"\x00\x00\x00\x22" + os.urandom(0x22))  # a hello sealed with no key
        assert stranger.recv(1) == b""  # hung up on, nothing sent
    assert _receive(serving.sender.offer, len(data)) == data
    assert serving.join() == len(data)


def test_a_receiver_with_the_wrong_key_gets_nothing(tmp_path: Path) -> None:
    path, data = _blob(tmp_path, 10_000)
    serving = Serving(path, len(data))
    offer = serving.sender.offer
    forged = bulk.BulkOffer(offer.port, os.urandom(32), offer.tid, offer.cipher)
    receiver = bulk.BulkReceiver(LOOPBACK, forged)
    receiver.connect()
    with pytest.raises(WireError, match="truncated"):
        receiver.receive(len(data), lambda view: None)
    assert isinstance(serving.join(), bulk.BulkUnavailable)  # waited for the real peer, then gave up


def test_connections_from_another_address_are_refused(tmp_path: Path) -> None:
    path, data = _blob(tmp_path, 10_000)
    serving = Serving(path, len(data), peer_ip="10.255.255.1")  # the requesting peer is elsewhere
    with pytest.raises(WireError, match="truncated"):
        _receive(serving.sender.offer, len(data))
    assert isinstance(serving.join(), bulk.BulkUnavailable)


def _proxy(target_port: int, mangle: Callable[[int, bytearray], bytes | None]) -> int:
    """A one-connection TCP relay that lets ``mangle`` edit (or cut, by returning None) the
    sender-to-receiver bytes; ``mangle`` gets the stream offset of each piece."""
    listener = socket.create_server((LOOPBACK, 0))
    listener.settimeout(5)

    def pump(src: socket.socket, dst: socket.socket, edit: bool) -> None:
        offset = 0
        with contextlib.suppress(OSError):
            while data := src.recv(1 << 16):
                piece = mangle(offset, bytearray(data)) if edit else bytes(data)
                if piece is None:
                    break
                dst.sendall(piece)
                offset += len(data)
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def run() -> None:
        client, _ = listener.accept()
        upstream = socket.create_connection((LOOPBACK, target_port), timeout=5)
        threading.Thread(target=pump, args=(client, upstream, False), daemon=True).start()
        pump(upstream, client, True)
        listener.close()

    threading.Thread(target=run, daemon=True).start()
    return listener.getsockname()[1]


def test_a_flipped_byte_on_the_wire_fails_authentication(tmp_path: Path) -> None:
    path, data = _blob(tmp_path, 2 * bulk.FRAME)

    def flip(offset: int, piece: bytearray) -> bytes:
        if offset <= 5000 < offset + len(piece):
            piece[5000 - offset] ^= 0x01
        return bytes(piece)

    serving = Serving(path, len(data))
    port = _proxy(serving.sender.offer.port, flip)
    with pytest.raises(WireError, match="failed authentication"):
        _receive(serving.sender.offer, len(data), port)
    serving.join()


def test_a_cut_connection_is_reported_as_truncated(tmp_path: Path) -> None:
    path, data = _blob(tmp_path, 2 * bulk.FRAME)
    serving = Serving(path, len(data))
    port = _proxy(serving.sender.offer.port, lambda offset, piece: None if offset > 300_000 else bytes(piece))
    with pytest.raises(WireError, match="truncated"):
        _receive(serving.sender.offer, len(data), port)
    serving.join()


def test_an_oversized_frame_header_is_refused_before_reading_it() -> None:
    offer = bulk.BulkOffer(1, os.urandom(32), os.urandom(16), "aes256gcm")
    listener = socket.create_server((LOOPBACK, 0))

    def liar() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(1024)  # the hello
            conn.sendall((1 << 30).to_bytes(4, "big"))
            conn.recv(1)

    threading.Thread(target=liar, daemon=True).start()
    with pytest.raises(WireError, match="oversized"):
        _receive(offer, 10, listener.getsockname()[1])
    listener.close()


def test_an_unreachable_channel_is_reported_so_the_caller_can_fall_back() -> None:
    with socket.create_server((LOOPBACK, 0)) as probe:
        port = probe.getsockname()[1]  # closed again when the block ends: nothing listens there
    receiver = bulk.BulkReceiver(LOOPBACK, bulk.BulkOffer(port, os.urandom(32), os.urandom(16), "aes256gcm"))
    with pytest.raises(bulk.BulkUnavailable, match="cannot reach"):
        receiver.connect(timeout=2)


@pytest.mark.parametrize("wire", [
    None, [], {"port": 0, "key": b"k" * 32, "tid": b"t" * 16, "cipher": "aes256gcm"},
    {"port": 80, "key": b"short", "tid": b"t" * 16, "cipher": "aes256gcm"},
    {"port": 80, "key": b"k" * 32, "tid": b"t" * 15, "cipher": "aes256gcm"},
    {"port": 80, "key": b"k" * 32, "tid": b"t" * 16, "cipher": "rot13"},
    {"port": "80", "key": b"k" * 32, "tid": b"t" * 16, "cipher": "aes256gcm"},
])
def test_malformed_offers_are_wire_errors(wire: object) -> None:
    with pytest.raises(WireError):
        bulk.BulkOffer.from_wire(wire)


def test_offer_round_trips_and_cipher_choice_follows_the_receiver() -> None:
    offer = bulk.BulkOffer(4242, b"k" * 32, b"t" * 16, "chacha20poly1305")
    assert bulk.BulkOffer.from_wire(offer.to_wire()) == offer
    assert bulk.choose_cipher(["rot13", "chacha20poly1305", "aes256gcm"]) == "chacha20poly1305"
    assert bulk.choose_cipher(["rot13"]) is None
    assert bulk.choose_cipher("aes256gcm") is None
    assert set(bulk.preferred_ciphers()) == set(bulk.CIPHERS)


def test_bind_host_is_the_address_the_user_asked_for() -> None:
    assert bulk.bind_host(["/ip4/10.1.2.3/tcp/4001"]) == "10.1.2.3"
    assert bulk.bind_host(["/ip6/::1/tcp/4001"]) == "::1"
    assert bulk.bind_host(["/ip4/1.2.3.4/udp/4001/quic"]) is None


class Inbox(OnThread):
    """A pushed payload's receiver listening on a thread; ``result`` is the bytes or the exception."""

    def __init__(self, size: int, cipher: str = "chacha20poly1305") -> None:
        self.inbox = bulk.BulkInbox(LOOPBACK, LOOPBACK, cipher)
        super().__init__(lambda: _collect(self.inbox.receive, size))


@pytest.mark.parametrize("size", [1, 2 * bulk.FRAME + 7])
def test_a_pushed_payload_goes_the_other_way_intact(size: int) -> None:
    data = os.urandom(size)
    inbox = Inbox(size)
    pusher = bulk.BulkPusher(LOOPBACK, inbox.inbox.offer)
    pusher.connect()
    assert pusher.send(memoryview(data)) == size
    assert inbox.join() == data


def test_a_pusher_with_the_wrong_key_delivers_nothing() -> None:
    inbox = Inbox(10_000)
    offer = inbox.inbox.offer
    forged = bulk.BulkPusher(LOOPBACK, bulk.BulkOffer(offer.port, os.urandom(32), offer.tid, offer.cipher))
    forged.connect()
    with contextlib.suppress(OSError):  # the inbox hangs up on it
        forged.send(memoryview(os.urandom(10_000)))
    assert isinstance(inbox.join(), bulk.BulkUnavailable)  # no byte taken from the stranger

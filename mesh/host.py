"""Building the py-libp2p host.

py-libp2p offers TLS, secio and plaintext next to Noise unless told otherwise; a GPUFlex host
offers Noise alone, so there is no downgrade path to plaintext, and yamux alone as muxer.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from mesh.errors import MeshError
from mesh.identity import Identity

if TYPE_CHECKING:
    from libp2p.abc import IHost

DEFAULT_LISTEN = "/ip4/0.0.0.0/tcp/4001"


class HostError(MeshError, RuntimeError):
    """The host could not be created or could not listen."""


def parse_multiaddr(text: str, what: str = "address") -> Any:
    import multiaddr

    try:
        return multiaddr.Multiaddr(text)
    except Exception as exc:  # multiaddr's parsers raise from several unrelated roots
        raise HostError(f"invalid {what} {text!r}: {exc}") from None


def check_tcp_port_free(listen: str) -> None:
    """Fail early with a clear message when the listen port is taken."""
    ma = parse_multiaddr(listen, "listen address")
    try:
        host = ma.value_for_protocol("ip4") or ma.value_for_protocol("ip6")
        port = int(ma.value_for_protocol("tcp"))
    except Exception:  # not an ip/tcp address: nothing to check here, the host reports it
        return
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in str(host) else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((str(host), port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise HostError(f"port {port} on {host} is already in use (choose another with --listen)") from None
            raise HostError(f"cannot listen on {listen}: {exc.strerror}") from None


def port_is_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def sticky_listen(listen: Sequence[str], previous: Sequence[str]) -> list[str]:
    """``listen`` with each port 0 replaced by the port this node had last time on that host,
    where that port is still free.

    Peers keep a node's address in their address books; a node that asked for "any port"
    and got a new one at every restart would be lost to all of them at once. Like a BitTorrent
    client, it picks a port once and keeps it; a taken port falls back to a fresh one."""
    out: list[str] = []
    for text in listen:
        parts = text.split("/")
        chosen = text
        if len(parts) == 5 and parts[1] in ("ip4", "ip6") and parts[3] == "tcp" and parts[4] == "0":
            for old in previous:
                was = old.split("/")
                if len(was) == 5 and was[1:4] == parts[1:4] and was[4].isdigit() and 0 < int(was[4]) < 65536 \
                        and port_is_free(parts[2], int(was[4])):
                    chosen = old
                    break
        out.append(chosen)
    return out


def quiet_libp2p() -> None:
    """py-libp2p 0.8.1 warns about routine events (clean DHT stream ends, stores that did
    succeed); unless LIBP2P_DEBUG asks for them, keep them off the user's terminal."""
    import logging
    import os

    if not os.environ.get("LIBP2P_DEBUG"):
        logging.getLogger("libp2p").setLevel(logging.CRITICAL)


def build_host(identity: Identity, listen: Sequence[str], announce: Sequence[str] = ()) -> IHost:
    from libp2p import create_yamux_muxer_option, new_host

    quiet_libp2p()
    from libp2p.crypto.x25519 import create_new_key_pair as new_x25519
    from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_ID
    from libp2p.security.noise.transport import Transport as NoiseTransport

    keypair = identity.libp2p_keypair()
    security = {NOISE_ID: NoiseTransport(keypair, noise_privkey=new_x25519().private_key)}
    listen_addrs = [parse_multiaddr(a, "listen address") for a in listen]
    announce_addrs = [parse_multiaddr(a, "announce address") for a in announce] or None
    host = new_host(
        key_pair=keypair,
        sec_opt=security,
        muxer_opt=create_yamux_muxer_option(),
        listen_addrs=listen_addrs,
        announce_addrs=announce_addrs,
    )
    no_auto_connect(host)
    return host


def no_auto_connect(host: IHost) -> None:
    """Keep py-libp2p's auto-connector from ever starting.

    It holds a node at 50 to 300 connections (go-libp2p's defaults): while below 100, every
    10 s and after each disconnect, it dials up to 32 peers from the peerstore, which holds
    every peer the node has heard of. The mesh keeps connections to a bounded set of peers
    (its keep set: overlay neighbours, round members, nearest DHT entries) and closes the
    other idle ones (``MeshNode.trim_connections``); the auto-connector dialled them again,
    a Noise handshake each time, and made a node's connections grow with the mesh. Its
    start is the one switch it has (``maybe_connect`` returns at once while not started)."""
    connector = getattr(host.get_network(), "auto_connector", None)
    if connector is None:  # a py-libp2p without one: nothing to switch off
        return

    async def stay_stopped() -> None:  # leaves ``_started`` False, as constructed
        return None

    connector.start = stay_stopped


def on_disconnect(host: IHost, callback: Callable[[str], None]) -> None:
    """Call ``callback(peer_id)`` whenever a connection of ``host`` to a peer closes: a killed
    process's connections close at once, so failure detection need not wait for a probe."""
    from libp2p.abc import INotifee

    class _Disconnects(INotifee):
        async def opened_stream(self, network: Any, stream: Any) -> None:
            pass

        async def closed_stream(self, network: Any, stream: Any) -> None:
            pass

        async def connected(self, network: Any, conn: Any) -> None:
            pass

        async def disconnected(self, network: Any, conn: Any) -> None:
            try:
                peer = str(conn.muxed_conn.peer_id)
            except AttributeError:  # a connection torn down before its muxer was set up
                return
            callback(peer)

        async def listen(self, network: Any, multiaddr: Any) -> None:
            pass

        async def listen_close(self, network: Any, multiaddr: Any) -> None:
            pass

    host.get_network().register_notifee(_Disconnects())

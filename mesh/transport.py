"""What a MeshNode needs of the network below it, in one narrow seam.

In production that is py-libp2p: a Noise/yamux host over TCP, its Kademlia DHT, its relay
client and a dialer. The simulator (``mesh.testing.simnet``) supplies a modelled network with
the same five parts, so the mesh's own code (liveness, discovery, gossip, NAT handling and
everything above it) runs unchanged on it. Nothing else of the mesh changes with the network.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Protocol

from mesh.identity import Identity


class Transport(Protocol):
    """The network a MeshNode runs on."""

    #: False for a modelled network: nothing binds a port, so there is nothing to check or keep.
    uses_sockets: bool

    def build_host(self, identity: Identity, listen: Sequence[str], announce: Sequence[str]) -> Any: ...

    def build_dht(self, host: Any, client_mode: bool, validator: Any) -> Any: ...

    def serve_dht(self, dht: Any) -> Any:
        """An async context manager that runs the DHT's background service."""

    def dialer(self, host: Any) -> Callable[[str, str], Any]: ...

    def relay_client(self, host: Any, limits: Any, guard: Callable[[Any], Any],
                     member: Callable[[str], bool] | None = None) -> Any: ...


class Libp2pTransport:
    """py-libp2p over TCP: the production network."""

    uses_sockets = True

    def build_host(self, identity: Identity, listen: Sequence[str], announce: Sequence[str]) -> Any:
        from mesh.host import build_host

        return build_host(identity, listen, announce)

    def build_dht(self, host: Any, client_mode: bool, validator: Any) -> Any:
        from libp2p.kad_dht.kad_dht import DHTMode, KadDHT

        mode = DHTMode.CLIENT if client_mode else DHTMode.SERVER
        return KadDHT(host, mode, validator=validator, validator_changed=True)

    @asynccontextmanager
    async def serve_dht(self, dht: Any) -> AsyncIterator[None]:
        from libp2p.tools.anyio_service import background_trio_service

        async with background_trio_service(dht):
            yield

    def dialer(self, host: Any) -> Callable[[str, str], Any]:
        from mesh.dialer import Libp2pDialer

        return Libp2pDialer(host)

    def relay_client(self, host: Any, limits: Any, guard: Callable[[Any], Any],
                     member: Callable[[str], bool] | None = None) -> Any:
        from mesh.relay import RelayClient

        return RelayClient(host, limits, guard=guard, member=member)

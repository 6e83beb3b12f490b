"""Finding peers on the same LAN with no bootstrap address: py-libp2p's mDNS, as it ships.

``libp2p.discovery.mdns`` (zeroconf underneath) found a second host on one LAN in 1.7 s on
the namespace topology (``benchmarks/nat_probe.py``), so it is used as it is, with two choices
of ours:

* the service type is ``_p2p-gpuflex._udp.local.``, not the generic ``_p2p._udp.local.``,
  so a GPUFlex node only learns of GPUFlex nodes (not every IPFS daemon on the LAN);
* it runs only when the node listens on a non-loopback address: a loopback-only node has
  nothing to offer its LAN, and test meshes on 127.0.0.1 must never find each other.

py-libp2p's listener only fills the peerstore; :class:`LanDiscovery` hands each newly found
peer to ``on_found``, which dials it and adds it to the routing table. mDNS uses UDP port 5353
(multicast) on the machine's interfaces; ``gpuflex node start --no-mdns`` turns it off.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio

log = logging.getLogger("mesh.lan")
SERVICE_TAG = "gpuflex"  # -> _p2p-gpuflex._udp.local.
POLL_S = 0.5
#: How long a stopping node waits for zeroconf to close (its goodbye packets, its threads).
MDNS_STOP_S = 2.0
#: Services not heard from for twice their TTL are dropped this often (py-libp2p's period).
CLEANUP_S = 60.0


def worth_announcing(listen: Sequence[str]) -> bool:
    """mDNS only for a node that listens beyond loopback."""
    for text in listen:
        parts = str(text).split("/")
        if len(parts) > 2 and not (parts[2].startswith("127.") or parts[2] == "::1"):
            return True
    return False


class LanDiscovery:
    def __init__(self, host: Any, on_found: Callable[[str, list[str]], Awaitable[None]]) -> None:
        self.host = host
        self.on_found = on_found
        self.found: dict[str, float] = {}
        self._mdns: Any = None

    def _addrs(self) -> list[str]:
        out = []
        for addr in self.host.get_addrs():
            text = str(addr).split("/p2p/")[0]
            if "/p2p-circuit" not in text and "/ip4/0.0.0.0/" not in text:
                out.append(text)
        return out

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        from libp2p.discovery.mdns.mdns import create_mdns_discovery

        addrs = self._addrs()
        port = next((int(a.split("/tcp/")[1].split("/")[0]) for a in addrs if "/tcp/" in a), 0)
        try:
            self._mdns = await trio.to_thread.run_sync(lambda: create_mdns_discovery(
                self.host.get_network(), port=port, listen_addrs=addrs,
                private_network_fingerprint=SERVICE_TAG, host=self.host))
            # What py-libp2p's ``start()`` does, but off trio's thread: registering the service
            # waits for zeroconf's name probes (1.7 s, measured in a namespace), during which
            # the node ran nothing else. Its stale-entry cleanup runs in ``_watch``, not as the
            # trio system task ``start()`` spawns: that task was cancelled from the thread that
            # runs ``stop()``, never woke, and kept every node with mDNS on from exiting.
            await trio.to_thread.run_sync(self._mdns.broadcaster.register)
        except Exception as exc:  # no multicast on this machine, say
            log.warning("LAN discovery (mDNS) is off: %s", exc)
            task_status.started(False)
            return
        log.info("LAN discovery (mDNS) announces %s", ", ".join(addrs) or "nothing")
        task_status.started(True)
        try:
            await self._watch()
        finally:  # zeroconf's close (goodbye packets, its threads) gets a bounded wait
            with trio.CancelScope(shield=True), trio.move_on_after(MDNS_STOP_S):
                await trio.to_thread.run_sync(self._stop, abandon_on_cancel=True)  # type: ignore[call-arg]

    def _stop(self) -> None:
        try:
            self._mdns.stop()
        except Exception as exc:
            log.debug("stopping mDNS: %s", exc)

    async def _watch(self) -> None:
        me = self.host.get_id()
        store = self.host.get_peerstore()
        cleaned = trio.current_time()
        while True:
            if trio.current_time() - cleaned >= CLEANUP_S:  # what py-libp2p's own loop did
                cleaned = trio.current_time()
                self._mdns.listener.cleanup_stale_entries(max_age=self._mdns.ttl * 2)
            # A snapshot: zeroconf's thread adds entries while we read.
            for peer_id, _ in list(self._mdns.listener.discovered_services.values()):
                text = str(peer_id)
                if peer_id == me or text in self.found:
                    continue
                self.found[text] = trio.current_time()
                try:
                    addrs = [str(a) for a in store.addrs(peer_id)]
                except Exception:
                    addrs = []
                log.info("found %s on the LAN (mDNS) at %s", text[-8:], ", ".join(addrs))
                try:
                    await self.on_found(text, addrs)
                except Exception as exc:
                    log.info("could not connect to LAN peer %s: %s", text[-8:], exc)
                    self.found.pop(text, None)
            await trio.sleep(POLL_S)

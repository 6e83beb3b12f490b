"""Measure py-libp2p 0.8.1's own NAT pieces on the namespace NAT topology, one by one.

    .venv/bin/python -m benchmarks.nat_probe            (root; builds and deletes the topology)

Each piece is run as it ships, through its public API, between real hosts in network
namespaces (a public host and homes behind nftables masquerade), and the probe prints what it
did: AutoNAT's verdict for a public and a private host, circuit relay v2 (reservation, a
relayed dial, a stream over it, throughput, several circuits at once), DCUtR hole punching,
and mDNS discovery on one LAN. These figures decided which pieces GPUFlex uses as they are
(docs/nat.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

ECHO = "/probe/echo/1"
SINK = "/probe/sink/1"


# -- one role per process, inside its namespace -----------------------------------------------

async def _wait_file(path: Path, timeout: float = 30.0) -> dict[str, Any]:
    with trio.fail_after(timeout):
        while not path.exists():
            await trio.sleep(0.1)
    await trio.sleep(0.05)
    return json.loads(path.read_text())


async def _echo_rtt_ms(host: Any, peer: Any, count: int = 20) -> float:
    """Mean round trip of 64-byte echoes on one stream."""
    with trio.fail_after(10):
        stream = await host.new_stream(peer, [ECHO])
        t0 = time.monotonic()
        for _ in range(count):
            await stream.write(b"x" * 64)
            await stream.read(64)
        rtt = round((time.monotonic() - t0) / count * 1000, 2)
        await stream.close()
    return rtt


async def _try_stream(host: Any, peer: Any, timeout: float) -> str:
    """Whether ``host.new_stream`` reaches ``peer`` with what its peerstore holds."""
    try:
        with trio.fail_after(timeout):
            await host.new_stream(peer, [ECHO])
        return "ok"
    except Exception as exc:  # a probe records every outcome
        return f"failed: {exc.__class__.__name__}: {str(exc)[:120]}"


async def role(name: str, work: Path, listen_ip: str) -> None:
    from libp2p.host.autonat import AutoNATService
    from libp2p.peer.id import ID
    from libp2p.peer.peerinfo import info_from_p2p_addr
    from libp2p.relay.circuit_v2 import CircuitV2Protocol, CircuitV2Transport, DCUtRProtocol
    from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
    from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP
    from libp2p.tools.anyio_service import background_trio_service
    from multiaddr import Multiaddr

    from mesh.host import build_host
    from mesh.identity import Identity

    ident = Identity.generate()
    host = build_host(ident, [f"/ip4/{listen_ip}/tcp/0"])
    out: dict[str, Any] = {}

    async def echo(stream: Any) -> None:
        try:
            while True:
                data = await stream.read(65536)
                if not data:
                    break
                await stream.write(data)
        except Exception:
            pass
        finally:
            await stream.close()

    async def sink(stream: Any) -> None:
        total = 0
        try:
            while True:
                data = await stream.read(1 << 20)
                if not data:
                    break
                total += len(data)
        except Exception:
            pass
        try:
            await stream.write(str(total).encode())
            await stream.close()
        except Exception:
            pass

    host.set_stream_handler(ECHO, echo)
    host.set_stream_handler(SINK, sink)
    async with host.run([Multiaddr(f"/ip4/{listen_ip}/tcp/0")]), trio.open_nursery() as nursery:
        addr = f"{host.get_addrs()[0]}"
        if "/p2p/" not in addr:
            addr += f"/p2p/{ident.peer_id}"
        relay_cfg = RelayConfig(roles=(RelayRole.HOP | RelayRole.STOP | RelayRole.CLIENT) if name == "pub"
                                else (RelayRole.STOP | RelayRole.CLIENT))
        proto = CircuitV2Protocol(host, allow_hop=name == "pub")
        transport = CircuitV2Transport(host, proto, relay_cfg)
        dcutr = DCUtRProtocol(host)
        autonat = AutoNATService(host, serve=True, confirmations=1)
        async with background_trio_service(proto), background_trio_service(dcutr):
            (work / f"{name}.addr").write_text(json.dumps({"addr": addr, "id": ident.peer_id}))
            if name == "pub":
                await _wait_file(work / "done", 120)
                (work / "pub.json").write_text(json.dumps(out))
                nursery.cancel_scope.cancel()
                return
            if name == "h1a":
                from libp2p.discovery.mdns.mdns import MDNSDiscovery

                MDNSDiscovery(host.get_network(), port=int(addr.split("/tcp/")[1].split("/")[0]),
                              listen_addrs=[addr.split("/p2p/")[0]], host=host).start()
            pub = await _wait_file(work / "pub.addr")
            pinfo = info_from_p2p_addr(Multiaddr(pub["addr"]))
            await host.connect(pinfo)
            # AutoNAT: ask the public host to dial us back.
            t0 = time.monotonic()
            try:
                status, _ = await autonat.query_server(pinfo.peer_id, timeout=15)
                out["autonat_status"] = int(status)
            except Exception as exc:
                out["autonat_error"] = repr(exc)
            out["autonat_s"] = round(time.monotonic() - t0, 2)
            autonat.update_status()
            out["autonat_verdict"] = {0: "unknown", 1: "public", 2: "private"}[autonat.get_status()]
            # A home host that announces its router's address (no port forwarded): AutoNAT should
            # say it cannot be reached there.
            wan = pub["addr"].split("/ip4/")[1].split("/")[0].rsplit(".", 1)[0] + f".{20 + int(name[1])}"
            port = addr.split("/tcp/")[1].split("/")[0]
            try:
                status, _ = await autonat.query_server(
                    pinfo.peer_id, addrs=[Multiaddr(f"/ip4/{wan}/tcp/{port}").to_bytes()], timeout=15)
                out["autonat_status_announcing_router_addr"] = int(status)
            except Exception as exc:
                out["autonat_status_announcing_router_addr"] = repr(exc)
            # Round trip on the direct connection to the public host, the baseline for the relay.
            out["direct_rtt_ms_to_pub"] = await _echo_rtt_ms(host, pinfo.peer_id)
            if name.endswith("lan"):
                # mDNS between two hosts of one LAN, no bootstrap between them.
                from libp2p.discovery.mdns.mdns import MDNSDiscovery

                t0 = time.monotonic()
                mdns = MDNSDiscovery(host.get_network(), port=int(addr.split("/tcp/")[1].split("/")[0]),
                                     listen_addrs=[addr.split("/p2p/")[0]], host=host)
                mdns.start()
                peer = await _wait_file(work / "h1a.addr")
                pid = ID.from_base58(peer["id"])
                found = None
                with trio.move_on_after(20):
                    while True:
                        store = host.get_peerstore()
                        if pid in store.peer_ids() and store.addrs(pid):
                            found = round(time.monotonic() - t0, 2)
                            break
                        await trio.sleep(0.1)
                out["mdns_found_s"] = found
                mdns.stop()
                (work / f"{name}.json").write_text(json.dumps(out))
                await _wait_file(work / "done", 120)
                nursery.cancel_scope.cancel()
                return
            # Reserve a slot on the relay.
            t0 = time.monotonic()
            try:
                stream = await host.new_stream(pinfo.peer_id, [HOP])
                ok = await transport.reserve(stream, pinfo.peer_id, nursery)
                out["reserved"] = bool(ok)
            except Exception as exc:
                out["reserve_error"] = repr(exc)
            out["reserve_s"] = round(time.monotonic() - t0, 2)
            (work / f"{name}.reserved").write_text("1")
            if name == "h1a":
                target = await _wait_file(work / "h2a.addr")
                await _wait_file(work / "h2a.reserved")
                tid = ID.from_base58(target["id"])
                circuit = Multiaddr(f"{pub['addr']}/p2p-circuit/p2p/{target['id']}")
                # Direct dial first: it must fail (the target is behind NAT).
                host.get_peerstore().add_addrs(tid, [Multiaddr(target["addr"].split("/p2p/")[0])], 60)
                out["direct_dial"] = await _try_stream(host, tid, 5)
                # host.new_stream with only a circuit address in the peerstore.
                host.get_peerstore().clear_addrs(tid)
                host.get_peerstore().add_addrs(tid, [circuit], 600)
                out["new_stream_via_circuit_addr"] = await _try_stream(host, tid, 10)
                # The relay transport's own dial.
                t0 = time.monotonic()
                try:
                    with trio.fail_after(20):
                        await transport.dial(circuit)
                    out["circuit_dial_s"] = round(time.monotonic() - t0, 2)
                    out["relayed_rtt_ms"] = await _echo_rtt_ms(host, tid)
                    # Throughput of one relayed stream, 8 MB.
                    size = 8 << 20
                    with trio.fail_after(120):
                        s = await host.new_stream(tid, [SINK])
                        t1 = time.monotonic()
                        chunk = b"y" * (256 << 10)
                        for _ in range(size // len(chunk)):
                            await s.write(chunk)
                        await s.close()
                        got = int((await s.read(64)).decode())
                        dt = time.monotonic() - t1
                    out["relayed_MB_s"] = round(got / dt / 1e6, 2)
                    out["relayed_bytes_ok"] = got == size
                    # Several streams over the circuit at once.
                    oks = 0

                    async def one() -> None:
                        nonlocal oks
                        s2 = await host.new_stream(tid, [ECHO])
                        await s2.write(b"ping")
                        if await s2.read(4) == b"ping":
                            oks += 1
                        await s2.close()

                    with trio.move_on_after(20):
                        async with trio.open_nursery() as n2:
                            for _ in range(8):
                                n2.start_soon(one)
                    out["parallel_streams_ok"] = f"{oks}/8"
                except BaseException as exc:
                    out["circuit_error"] = f"{exc.__class__.__name__}: {str(exc)[:200]}"
                # DCUtR over the relayed connection.
                t0 = time.monotonic()
                try:
                    with trio.fail_after(40):
                        out["dcutr"] = bool(await dcutr.initiate_hole_punch(tid))
                except BaseException as exc:
                    out["dcutr"] = f"{exc.__class__.__name__}: {str(exc)[:200]}"
                out["dcutr_s"] = round(time.monotonic() - t0, 2)
                conns = host.get_network().connections.get(tid, [])
                conns = conns if isinstance(conns, list) else [conns]
                out["conns_after_dcutr"] = [str(c.get_transport_addresses()) for c in conns]
                (work / "h1a.json").write_text(json.dumps(out))
                (work / "done").write_text("1")
            else:
                (work / f"{name}.json").write_text(json.dumps(out))
                await _wait_file(work / "done", 180)
            nursery.cancel_scope.cancel()


# -- the driver --------------------------------------------------------------------------------

def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--role":
        from mesh.host import quiet_libp2p

        quiet_libp2p()
        trio.run(role, sys.argv[2], Path(sys.argv[3]), sys.argv[4])
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.common import stop_on_sigterm
    from gpuflex.testing.nat import NatTopology

    stop_on_sigterm()
    random_ports = "--random-ports" in sys.argv
    with NatTopology((2, 1), uplink_mbit=20, random_ports=random_ports) as topo, \
            tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        h1a, h1b = topo.homes[0].hosts
        h2a = topo.homes[1].hosts[0]
        roles = [("pub", topo.public), ("h1a", h1a), ("h1lan", h1b), ("h2a", h2a)]
        procs = []
        for name, host in roles:
            log = open(work / f"{name}.log", "w")  # noqa: SIM115
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", host.netns, sys.executable, "-m", "benchmarks.nat_probe", "--role",
                 name, str(work), host.addr], stdout=log, stderr=subprocess.STDOUT,
                cwd=Path(__file__).resolve().parents[1]))
        deadline = time.time() + 240
        for p in procs:
            try:
                p.wait(timeout=max(1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
        result = {}
        for name, _ in roles:
            f = work / f"{name}.json"
            result[name] = json.loads(f.read_text()) if f.exists() else {
                "log": (work / f"{name}.log").read_text()[-1500:]}
        print(json.dumps({"random_ports": random_ports, "date": time.strftime("%Y-%m-%d"), **result}, indent=1))
        if os.environ.get("PROBE_LOGS"):
            for name, _ in roles:
                print(f"--- {name}\n" + (work / f"{name}.log").read_text()[-3000:])


if __name__ == "__main__":
    main()

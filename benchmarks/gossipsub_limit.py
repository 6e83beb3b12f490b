"""py-libp2p's gossipsub against its message size limit, beside the mesh's own gossip.

``mesh.gossip`` is our own overlay gossip rather than py-libp2p's gossipsub. This measures
why, on the pinned py-libp2p: ``--hosts`` real libp2p hosts on 127.0.0.1 in a line (each
connected to the next, so a message must be relayed), gossipsub with a 1 s heartbeat, one
topic; the first host publishes one message of each size and the last waits for it. For
each size: delivered or not, and the time it took.

Run:

    python -m benchmarks.gossipsub_limit [--hosts 3] [--sizes-kib 64 512 1000 1024 2048 8192] [--json]
"""

from __future__ import annotations

import argparse
import time
from contextlib import suppress
from itertools import pairwise
from typing import Any

import trio

from benchmarks.common import add_json_flag, emit, format_table, stop_on_sigterm

TOPIC = "bench"


async def run(hosts_n: int, sizes_kib: list[int], wait_s: float) -> list[dict[str, Any]]:
    from libp2p.peer.peerinfo import info_from_p2p_addr
    from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11, GossipSub
    from libp2p.pubsub.pubsub import Pubsub
    from libp2p.tools.anyio_service import background_trio_service
    from multiaddr import Multiaddr

    from mesh.host import build_host
    from mesh.identity import Identity

    rows: list[dict[str, Any]] = []
    async with trio.open_nursery() as nursery:
        hosts, pubsubs = [], []
        stack = []
        for _ in range(hosts_n):
            host = build_host(Identity.generate(), ["/ip4/127.0.0.1/tcp/0"], [])
            cm = host.run([Multiaddr("/ip4/127.0.0.1/tcp/0")])
            await cm.__aenter__()
            stack.append(cm)
            router = GossipSub([PROTOCOL_ID_V11], degree=6, degree_low=4, degree_high=12, heartbeat_interval=1)
            pubsub = Pubsub(host, router)
            for svc in (pubsub, router):
                ctx = background_trio_service(svc)
                await ctx.__aenter__()
                stack.append(ctx)
            await pubsub.wait_until_ready()
            hosts.append(host)
            pubsubs.append(pubsub)
        for a, b in pairwise(hosts):
            addr = f"{b.get_addrs()[0]}"
            addr = addr if "/p2p/" in addr else f"{addr}/p2p/{b.get_id()}"
            await a.connect(info_from_p2p_addr(Multiaddr(addr)))
        subs = [await p.subscribe(TOPIC) for p in pubsubs]
        await trio.sleep(3)  # a few heartbeats: the gossipsub mesh forms
        for kib in sizes_kib:
            data = bytes(kib * 1024)
            t0 = time.perf_counter()
            await pubsubs[0].publish(TOPIC, data)
            got = None
            with trio.move_on_after(wait_s):
                while True:
                    msg = await subs[-1].get()
                    if len(msg.data) == len(data):
                        got = time.perf_counter() - t0
                        break
            rows.append({"size_kib": kib, "delivered": got is not None, "seconds": got})
        nursery.cancel_scope.cancel()
        for cm in reversed(stack):
            with trio.move_on_after(2) as scope:
                scope.shield = True
                with suppress(Exception):  # teardown of a benchmark: nothing left to measure
                    await cm.__aexit__(None, None, None)
    return rows


def render(result: dict[str, Any]) -> str:
    head = (f"py-libp2p gossipsub, {result['hosts']} hosts in a line on 127.0.0.1, heartbeat 1 s; "
            f"first host publishes, last receives (waited {result['wait_s']:.0f} s)")
    return head + "\n" + format_table(result["rows"], [("size_kib", "size KiB", "d"), ("delivered", "delivered", ""),
                                                       ("seconds", "seconds", ".2f")])


def main() -> None:
    stop_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=3)
    ap.add_argument("--sizes-kib", type=int, nargs="+", default=[64, 512, 1000, 1024, 2048, 8192])
    ap.add_argument("--wait-s", type=float, default=15.0)
    add_json_flag(ap)
    args = ap.parse_args()
    rows = trio.run(run, args.hosts, args.sizes_kib, args.wait_s)
    emit({"hosts": args.hosts, "wait_s": args.wait_s, "rows": rows}, args.json, render)


if __name__ == "__main__":
    main()

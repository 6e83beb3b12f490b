"""Blob transfer between two MeshNodes on loopback, against raw trio TCP in the same run.

A blob (model weights, a delta) is requested over a libp2p stream (Noise, yamux) and its
bytes travel over the sealed bulk side channel (``mesh.bulk``), then are hashed (BLAKE3) into
a temporary file on the receiver. The ceiling is plain TCP on the same machine, so the
benchmark moves the same number of bytes four ways, interleaved rep by rep so a noisy
machine slows all of them alike:

* raw trio TCP, 1 MiB writes, bytes discarded (the transport ceiling);
* raw trio TCP with the receiver hashing and writing a file as ``fetch_blob`` does
  (how much of the gap is the receiver's own work rather than the transport);
* ``MeshNode.fetch_blob`` with the bulk channel switched off: every byte through libp2p;
* ``MeshNode.fetch_blob`` as shipped: bulk channel, hash checked.

``--alternatives`` adds the two other ways to speed up the libp2p path, measured the same way,
so the choice of the bulk channel rests on numbers:

* the same payload as four blobs fetched over four concurrent libp2p streams;
* one libp2p stream with yamux's receive window starting at its 16 MiB maximum (py-libp2p
  starts at 256 KiB and grows it), in a second sender/receiver pair.

Sender and receiver are always separate processes (this one only coordinates), so neither
shares a Python thread with its peer. The receiver's peak RSS is reported before and after
the transfers: a 200 MB blob must not need 200 MB of memory. Run:

    python -m benchmarks.blob_throughput [--mb 200] [--reps 3] [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
from functools import partial
from pathlib import Path
from typing import Any

import trio

from benchmarks.common import (
    MB,
    MIB,
    Channel,
    Stopwatch,
    Worker,
    add_json_flag,
    add_role_flag,
    emit,
    format_table,
    log,
    peak_rss_mb,
    ratio,
    run_worker,
    stop_on_sigterm,
    workers,
)
from mesh.blob import blob_hasher

LOOPBACK = "127.0.0.1"
WORKER_DEADLINE_S = 900.0
IDLE_S = 300.0
METHODS = ("tcp", "tcp_hash_file", "blob_libp2p", "blob")
LABELS = {
    "tcp": "raw trio TCP (discard)",
    "tcp_hash_file": "raw trio TCP + blake3 + file",
    "blob_libp2p": "fetch_blob over libp2p (Noise+yamux)",
    "blob": "fetch_blob, bulk channel (AEAD)",
    "libp2p_4_streams": "libp2p, 4 parallel streams",
    "libp2p_big_window": "libp2p, yamux window 16 MiB",
}
ALTERNATIVES = ("libp2p_4_streams", "libp2p_big_window")
PARTS = 4


# -- workers -----------------------------------------------------------------------------------


def _payload(nbytes: int) -> bytes:
    """Incompressible bytes, so no layer can cheat by compressing."""
    return os.urandom(nbytes)


async def _serve_until_closed(channel: Channel) -> None:
    """Keep serving until the parent says stop or goes away (bounded by IDLE_S per wait)."""
    while (await channel.recv(IDLE_S)) is not None:
        channel.send({"ok": True})


async def tcp_sender(channel: Channel, args: dict[str, Any]) -> None:
    """Listen on loopback; to each client, write ``nbytes`` in 1 MiB writes, then close."""
    nbytes = int(args["nbytes"])
    chunk = _payload(MIB)

    async def handle(stream: trio.SocketStream) -> None:
        async with stream:
            sent = 0
            while sent < nbytes:
                piece = chunk[: min(MIB, nbytes - sent)]
                await stream.send_all(piece)
                sent += len(piece)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, handle, 0, host=LOOPBACK))
        channel.send({"port": listeners[0].socket.getsockname()[1]})
        await _serve_until_closed(channel)
        nursery.cancel_scope.cancel()


async def tcp_receiver(channel: Channel, args: dict[str, Any]) -> None:
    """Per command: connect, read ``nbytes`` (optionally hashing into a file), report time."""
    target = Path(args["scratch"]) / "payload"
    channel.send({"ready": True, "rss_mb": peak_rss_mb()})
    while (cmd := await channel.recv(IDLE_S)) is not None:
        hash_file = bool(cmd["hash_file"])
        hasher = blob_hasher()
        received = 0
        with open(target, "wb") if hash_file else open(os.devnull, "wb") as sink, Stopwatch() as sw:
            stream = await trio.open_tcp_stream(LOOPBACK, int(cmd["port"]))
            async with stream:
                while True:
                    data = await stream.receive_some(MIB)
                    if not data:
                        break
                    received += len(data)
                    if hash_file:
                        hasher.update(data)
                        sink.write(data)
        target.unlink(missing_ok=True)
        channel.send({"seconds": sw.seconds, "bytes": received, "rss_mb": peak_rss_mb()})


def _widen_yamux_window(args: dict[str, Any]) -> None:
    """Start every yamux stream at the largest receive window py-libp2p allows."""
    if args.get("big_window"):
        from libp2p.stream_muxer.yamux import yamux

        yamux.DEFAULT_WINDOW_SIZE = yamux.MAX_WINDOW_SIZE


async def blob_sender(channel: Channel, args: dict[str, Any]) -> None:
    """A MeshNode holding one random blob of ``nbytes``, and the same bytes as ``PARTS`` blobs."""
    from mesh.identity import Identity
    from mesh.node import MeshConfig, MeshNode

    _widen_yamux_window(args)
    config = MeshConfig(listen=[f"/ip4/{LOOPBACK}/tcp/0"], data_dir=Path(args["scratch"]))
    async with MeshNode.start(Identity.generate(), config) as node:
        payload = _payload(int(args["nbytes"]))
        digest = node.blobs.put(payload)
        step = -(-len(payload) // PARTS)
        parts = [node.blobs.put(payload[i : i + step]) for i in range(0, len(payload), step)]
        channel.send({"addr": node.multiaddrs()[0], "peer": node.peer_id, "hash": digest, "parts": parts})
        await _serve_until_closed(channel)


async def blob_receiver(channel: Channel, args: dict[str, Any]) -> None:
    """A MeshNode bootstrapped from the sender; per command, fetch the blob and time it."""
    from mesh.identity import Identity
    from mesh.node import MeshConfig, MeshNode

    _widen_yamux_window(args)
    config = MeshConfig(listen=[f"/ip4/{LOOPBACK}/tcp/0"], bootstrap=[args["bootstrap"]],
                        data_dir=Path(args["scratch"]))
    async with MeshNode.start(Identity.generate(), config) as node:
        channel.send({"ready": True, "rss_mb": peak_rss_mb()})
        while (cmd := await channel.recv(IDLE_S)) is not None:
            node.config.bulk_channel = bool(cmd["bulk"])
            with Stopwatch() as sw:
                paths = await _fetch_all(node, list(cmd["hashes"]), str(cmd["peer"]), float(cmd["timeout"]))
            rss = peak_rss_mb()
            size = sum(path.stat().st_size for path in paths)
            # fetch_blob already refused bytes with the wrong hash; re-check outside the timing.
            ok = True
            for path in paths:
                with open(path, "rb") as fh:
                    ok &= hashlib.file_digest(fh, blob_hasher).hexdigest() == path.name
                path.unlink()
            channel.send({"seconds": sw.seconds, "bytes": size, "hash_ok": ok, "rss_mb": rss})


async def _fetch_all(node: Any, digests: list[str], peer: str, timeout: float) -> list[Path]:
    """Fetch every digest at once, each on its own stream."""
    paths: list[Path] = []

    async def fetch(digest: str) -> None:
        paths.append(await node.fetch_blob(digest, providers=[peer], timeout=timeout))

    async with trio.open_nursery() as nursery:
        for digest in digests:
            nursery.start_soon(fetch, digest)
    return paths


ROLES = {"tcp-send": tcp_sender, "tcp-recv": tcp_receiver, "blob-send": blob_sender, "blob-recv": blob_receiver}


# -- coordinator -------------------------------------------------------------------------------


def run(mb: float, reps: int, alternatives: bool = False) -> dict[str, Any]:
    """Move ``mb`` MB each way ``reps`` times, interleaving the methods; median MB/s each."""
    nbytes = int(mb * MB)
    timeout = max(60.0, mb / 10.0)  # slower than 10 MB/s counts as a failure
    methods = METHODS + (ALTERNATIVES if alternatives else ())
    samples: dict[str, list[float]] = {m: [] for m in methods}
    with workers("blob") as (tmp, started):

        def spawn(role: str, name: str, **args: Any) -> Worker:
            worker = Worker("blob_throughput", role, args, tmp, name)
            started.append(worker)
            return worker

        log(f"starting sender and receiver processes ({mb:g} MB payload)")
        tcp_send = spawn("tcp-send", "tcp-sender", nbytes=nbytes)
        port = tcp_send.recv(60)["port"]
        tcp_recv = spawn("tcp-recv", "tcp-receiver")
        tcp_recv.recv(60)
        blob_send = spawn("blob-send", "blob-sender", nbytes=nbytes)
        src = blob_send.recv(120)
        blob_recv = spawn("blob-recv", "blob-receiver", bootstrap=src["addr"])
        rss_before = float(blob_recv.recv(120)["rss_mb"])
        wide_recv, wide_src = blob_recv, src
        if alternatives:
            wide_send = spawn("blob-send", "wide-sender", nbytes=nbytes, big_window=True)
            wide_src = wide_send.recv(120)
            wide_recv = spawn("blob-recv", "wide-receiver", bootstrap=wide_src["addr"], big_window=True)
            wide_recv.recv(120)
        rss_after = rss_before
        hash_ok = True
        for rep in range(1, reps + 1):
            for method in methods:
                if method.startswith("blob") or method.startswith("libp2p"):
                    recv, source = (wide_recv, wide_src) if method == "libp2p_big_window" else (blob_recv, src)
                    hashes = source["parts"] if method == "libp2p_4_streams" else [source["hash"]]
                    reply = recv.ask({"hashes": hashes, "peer": source["peer"], "timeout": timeout,
                                      "bulk": method == "blob"}, timeout + 30)
                    hash_ok &= bool(reply["hash_ok"])
                    if method == "blob":
                        rss_after = float(reply["rss_mb"])
                else:
                    reply = tcp_recv.ask({"port": port, "hash_file": method == "tcp_hash_file"}, timeout)
                if int(reply["bytes"]) != nbytes:
                    raise RuntimeError(f"{method}: received {reply['bytes']} bytes, expected {nbytes}")
                samples[method].append(nbytes / float(reply["seconds"]) / MB)
                log(f"rep {rep}/{reps} {method}: {samples[method][-1]:.0f} MB/s")
    ceiling = statistics.median(samples["tcp"])
    rows = [{"method": LABELS[m], "key": m, "mb_per_s": statistics.median(samples[m]),
             "best_mb_per_s": max(samples[m]), "vs_tcp": ratio(statistics.median(samples[m]), ceiling)}
            for m in methods]
    return {"benchmark": "blob_throughput", "mb": mb, "reps": reps, "rows": rows, "hash_ok": hash_ok,
            "receiver_rss_mb_before": rss_before, "receiver_peak_rss_mb": rss_after,
            "blob_vs_tcp": rows[3]["vs_tcp"], "blob_libp2p_vs_tcp": rows[2]["vs_tcp"],
            "blob_vs_tcp_hash_file": ratio(rows[3]["mb_per_s"], rows[1]["mb_per_s"]),
            "bulk_vs_libp2p": ratio(rows[3]["mb_per_s"], rows[2]["mb_per_s"])}


def render(result: dict[str, Any]) -> str:
    columns = [("method", "method", ""), ("mb_per_s", "MB/s (median)", ".0f"),
               ("best_mb_per_s", "MB/s (best)", ".0f"), ("vs_tcp", "x raw TCP", ".3f")]
    mb = result["mb"]
    return "\n".join([
        f"Blob throughput: {mb:g} MB (10^6 bytes) payload, {result['reps']} reps interleaved, "
        "sender and receiver in separate processes, 127.0.0.1",
        format_table(result["rows"], columns),
        f"blob (bulk) / raw TCP = {result['blob_vs_tcp']:.3f}; blob / (TCP + hash + file) = "
        f"{result['blob_vs_tcp_hash_file']:.3f}; bulk / libp2p = {result['bulk_vs_libp2p']:.1f}x; "
        f"hash checked: {'yes' if result['hash_ok'] else 'NO'}",
        f"receiver peak RSS: {result['receiver_rss_mb_before']:.0f} MB after start, "
        f"{result['receiver_peak_rss_mb']:.0f} MB after the transfers (payload {mb:g} MB)",
    ])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=200.0, help="payload size in MB (10^6 bytes)")
    parser.add_argument("--reps", type=int, default=3, help="transfers per method; the median is reported")
    parser.add_argument("--alternatives", action="store_true",
                        help="also measure 4 parallel libp2p streams and a 16 MiB yamux window")
    add_json_flag(parser)
    add_role_flag(parser)
    args = parser.parse_args(argv)
    stop_on_sigterm()
    if args.role:
        run_worker(ROLES[args.role], args.role_args, WORKER_DEADLINE_S)
        return
    if args.mb <= 0 or args.reps < 1:
        parser.error("--mb must be positive and --reps at least 1")
    emit(run(args.mb, args.reps, args.alternatives), args.json, render)


if __name__ == "__main__":
    main()

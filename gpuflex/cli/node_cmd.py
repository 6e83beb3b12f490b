"""``gpuflex keygen`` and ``gpuflex node start``."""

from __future__ import annotations

from typing import Any

import typer

from gpuflex.cli.common import HomeOpt, emit_json, fail

node_app = typer.Typer(help="Run a mesh node.", no_args_is_help=True,
                    rich_markup_mode=None)


def keygen(home: str | None = HomeOpt, force: bool = typer.Option(False, help="Replace an existing key."),
           json_out: bool = typer.Option(False, "--json")) -> None:
    """Create this node's Ed25519 identity (done automatically on first start)."""
    from gpuflex.home import KEY_FILE, resolve_home
    from mesh.identity import Identity, IdentityError

    path = resolve_home(home) / KEY_FILE
    try:
        if path.exists() and not force:
            ident, created = Identity.load(path), False
        else:
            ident, created = Identity.generate(), True
            ident.save(path)
    except (IdentityError, OSError) as exc:
        fail(str(exc))
    if json_out:
        emit_json({"peer_id": ident.peer_id, "key_file": str(path), "created": created})
    else:
        verb = "created" if created else "exists"
        typer.echo(f"{ident.peer_id}\n(key {verb}: {path})")


@node_app.command("start")
def start(
    home: str | None = HomeOpt,
    listen: list[str] = typer.Option(["/ip4/0.0.0.0/tcp/4001"], "--listen", help="Multiaddr to listen on."),
    announce: list[str] = typer.Option([], "--announce", help="Multiaddr to announce to peers."),
    bootstrap: list[str] = typer.Option([], "--bootstrap", help="Multiaddr of a mesh peer (/p2p/<id> included); "
                                        "needed the first time only: the node remembers the peers it meets."),
    client: bool = typer.Option(False, "--client", help="Force DHT client mode (automatic behind NAT)."),
    bootstrap_timeout: float = typer.Option(30.0, "--bootstrap-timeout", min=1.0,
                                            help="Seconds a brand-new node keeps trying its --bootstrap peers "
                                                 "before giving up (a node that has been in a mesh keeps trying "
                                                 "its address book, with backoff)."),
    bulk: bool = typer.Option(True, "--bulk/--no-bulk",
                              help="Serve blobs over a one-off sealed TCP port on the --listen host "
                                   "(--no-bulk: every byte through libp2p, no extra port)."),
    control_port: int = typer.Option(0, help="Port of the local control API on 127.0.0.1 (0: any free port)."),
    suspect_after: float = typer.Option(
        4.0, help="A peer heard from within this many seconds is not suspected on another's word."),
    down_after: float = typer.Option(
        9.0, help="A suspect peer is 'down' (down-after - suspect-after) seconds after nobody reached it."),
    log_level: str = typer.Option("info", help="debug, info, warning or error."),
    log_format: str = typer.Option("text", help="text or json."),
    metrics: str | None = typer.Option(
        None, "--metrics", metavar="ADDR",
        help="Serve Prometheus metrics on ADDR (PORT or HOST:PORT; loopback if only a port)."),
    adversary: str | None = typer.Option(None, hidden=True, help="Test meshes only: behave as KIND."),
    mdns: bool = typer.Option(True, "--mdns/--no-mdns", help="Find peers on this LAN by mDNS (UDP 5353)."),
    relay_service: bool = typer.Option(True, "--relay-service/--no-relay-service",
                                       help="When publicly reachable, relay for peers behind NAT (within the limits)."),
    relay_max_reservations: int = typer.Option(32, min=0, help="Relay service: peers behind NAT it holds a slot for."),
    relay_max_circuits: int = typer.Option(8, min=0, help="Relay service: relayed connections at once per peer."),
    relay_max_mb: int = typer.Option(1024, min=0, help="Relay service: megabytes one relayed connection may carry."),
    relay_max_duration: int = typer.Option(3600, min=0, help="Relay service: seconds one relayed connection may last."),
    relay_per_network: int = typer.Option(4, min=0, help="Relay service: slots for peers of one /24 (IPv6 /48)."),
    relay_per_source: int = typer.Option(2, min=0, help="Relay service: relayed connections one source may hold "
                                                        "to one peer."),
    relay_any: bool = typer.Option(False, "--relay-any", help="Relay service: carry any peer's libp2p traffic, "
                                                              "not only this mesh's Noise connections."),
    relays: int = typer.Option(2, min=0, max=8, help="Behind NAT: how many relays to reserve a slot on (0: none)."),
    reachability: str = typer.Option("auto", help="auto (ask peers to dial back), public or private."),
    allow_plugin: list[str] = typer.Option(
        [], "--allow-plugin", metavar="PATTERN",
        help="Run jobs' plug-ins matching module:function PATTERN ('*' matches any module part, or one function "
             "name, e.g. 'mylab.models:*'); "
             "adds to node.toml [jobs] allow_plugins. Only built-in components run otherwise."),
    data: list[str] = typer.Option([], "--data", metavar="NAME=PATH",
                                   help="Where data set NAME lives here (adds to node.toml [data]); "
                                        "jobs name data sets, never paths."),
    accept_jobs: str | None = typer.Option(None, "--accept-jobs", metavar="any|PEER_ID,...",
                                           help="Whose jobs to run (default: node.toml [jobs] accept, else any)."),
    max_jobs: int | None = typer.Option(None, "--max-jobs", min=1,
                                        help="Unfinished jobs held at once (default: node.toml, else 16)."),
    max_jobs_per_publisher: int | None = typer.Option(
        None, "--max-jobs-per-publisher", min=1,
        help="Unfinished jobs held at once from one publisher (default: node.toml, else 4)."),
    max_model_params: int | None = typer.Option(
        None, "--max-model-params", min=1,
        help="Largest language model a job may make this node build, in parameters "
             "(default: node.toml, else 200000000)."),
    read_timeout: float = typer.Option(10.0, min=0.1, help="Seconds a peer may leave a message, gossip or blob "
                                                            "stream without a byte before it is dropped."),
    gossip_rate: float = typer.Option(10.0, min=0.01, help="New gossip messages a second relayed for one origin "
                                                            "(the signer); the excess is dropped."),
    max_peers: int = typer.Option(4096, min=8, help="Peers kept in the peer table (members of the mesh; "
                                                     "only a bounded set of them is probed and looked up); "
                                                     "the one worth least makes room for a new one."),
    address_book_size: int = typer.Option(256, min=8, help="Peers kept across restarts in the address book "
                                                             "(those this node verified itself go first)."),
    gossip_burst: float = typer.Option(100.0, min=1.0, help="... and how many one origin may send at once."),
    pex_interval: float = typer.Option(20.0, min=1.0, max=3600.0, help="Seconds between a settled node's asks to "
                                                                       "two peers for the peers they know."),
) -> None:
    """Start a node; it joins the mesh through --bootstrap and the peers it met before (its address
    book), or starts a new mesh when it knows none."""
    import trio

    from gpuflex import logs
    from gpuflex.home import LOG_FILE, resolve_home
    from gpuflex.node.runtime import NodeOptions, NodeRuntime, NodeStartError
    from gpuflex.nodeconfig import NodeConfigError, load_node_config, with_flags
    from mesh.health import HealthConfig
    from mesh.host import HostError
    from mesh.node import BootstrapError

    root = resolve_home(home)
    try:
        config = with_flags(load_node_config(root), allow_plugins=allow_plugin, data=data, accept=accept_jobs,
                            max_jobs=max_jobs, max_jobs_per_publisher=max_jobs_per_publisher,
                            max_model_params=max_model_params)
    except NodeConfigError as exc:
        fail(str(exc))
    if log_format not in ("text", "json"):
        fail("--log-format must be 'text' or 'json'")
    logs.configure(log_level, log_format, root / LOG_FILE)
    if metrics:
        from gpuflex.node.metrics_http import MetricsAddrError, parse_metrics_addr

        try:
            parse_metrics_addr(metrics)
        except MetricsAddrError as exc:
            fail(str(exc))
    if adversary:
        from gpuflex.adversary import KINDS, loopback_only

        if not loopback_only(listen):
            fail("--adversary is only allowed on loopback test meshes (listen on 127.0.0.1)")
        if adversary not in KINDS:
            fail(f"unknown adversary {adversary!r}; choose from {', '.join(KINDS)}")
    if reachability not in ("auto", "public", "private"):
        fail("--reachability must be 'auto', 'public' or 'private'")
    from mesh.limits import PeerLimits
    from mesh.relay import RelayLimitsConfig

    relay = RelayLimitsConfig(service=relay_service, max_reservations=relay_max_reservations,
                              max_circuits=relay_max_circuits, max_circuit_bytes=relay_max_mb << 20,
                              max_circuit_duration_s=relay_max_duration, reservations=relays,
                              max_reservations_per_network=relay_per_network, max_circuits_per_source=relay_per_source,
                              carry_any=relay_any)
    try:
        health = HealthConfig(suspect_after_s=suspect_after, down_after_s=down_after, max_peers=max_peers)
        runtime = NodeRuntime(NodeOptions(home=root, listen=listen, announce=announce, bootstrap=bootstrap,
                                          client_mode=client, control_port=control_port, health=health,
                                          bulk_channel=bulk,
                                          bootstrap_timeout_s=bootstrap_timeout,
                                          adversary=adversary, metrics=metrics, relay=relay, mdns=mdns,
                                          reachability=None if reachability == "auto" else reachability,
                                          config=config, address_book_size=address_book_size,
                                          pex_every_s=pex_interval,
                                          limits=PeerLimits(read_timeout_s=read_timeout, gossip_origin_rate=gossip_rate,
                                                            gossip_origin_burst=gossip_burst)))
        code = trio.run(serve_until_signalled, runtime)
    except BaseException as exc:
        if first_error(exc, (KeyboardInterrupt,)) is not None:  # Ctrl-C before the node took signals over
            typer.echo("stopped (interrupted)", err=True)
            exit_without_teardown(INTERRUPTED)
        known = first_error(exc, (NodeStartError, HostError, BootstrapError, ValueError, OSError))
        if known is None:
            raise
        fail(str(known))
    exit_without_teardown(code)


#: The shell's exit status for a program stopped by Ctrl-C (128 + SIGINT).
INTERRUPTED = 130


async def serve_until_signalled(runtime: Any) -> int:
    """Run the node until it stops, or until Ctrl-C or SIGTERM asks it to: one log line says
    which, the node stops as ``gpuflex shutdown`` would, and a second signal ends it at once.
    The exit status is 130 after Ctrl-C and 0 otherwise (a service manager's stop is normal)."""
    import logging
    import signal

    import trio

    log = logging.getLogger("gpuflex.node")
    got: list[int] = []

    async def watch(receiver: Any) -> None:
        async for signum in receiver:
            if got:
                log.warning("second %s: exiting now", signal.Signals(signum).name)
                exit_without_teardown(INTERRUPTED if signum == signal.SIGINT else 0)
            got.append(signum)
            log.info("%s received: stopping the node", "Ctrl-C" if signum == signal.SIGINT else "SIGTERM")
            runtime.stop()

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as receiver:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch, receiver)
            await runtime.serve()
            nursery.cancel_scope.cancel()
    log.info("node stopped")
    return INTERRUPTED if got and got[0] == signal.SIGINT else 0


def exit_without_teardown(code: int = 0) -> None:
    """Once the node has stopped its state is on disk (every write is atomic), so the
    interpreter's own teardown of torch and libp2p, a second or more of CPU, buys nothing and
    only delays whoever restarts or replaces the node."""
    import logging
    import os
    import sys

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def first_error(exc: BaseException, kinds: tuple[type[BaseException], ...]) -> BaseException | None:
    """The first error of a known kind, looking inside trio's exception groups."""
    if isinstance(exc, kinds):
        return exc
    for inner in getattr(exc, "exceptions", ()):
        found = first_error(inner, kinds)
        if found is not None:
            return found
    return None

"""A running GPUFlex node: identity, mesh, jobs and the control API in one trio program."""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from gpuflex import __version__
from gpuflex.errors import GpuflexError
from gpuflex.home import CONTROL_FILE, KEY_FILE, PEERS_FILE
from gpuflex.node.control import ApiError, ControlServer
from gpuflex.node.events import EventLog
from gpuflex.node.jobs import JobManager
from gpuflex.node.serving import NodeServing, serve_settings
from gpuflex.nodeconfig import NodeConfig, NodeConfigError, load_node_config
from gpuflex.serve import ServeError
from mesh.health import HealthConfig
from mesh.identity import Identity
from mesh.limits import PeerLimits
from mesh.node import MeshConfig, MeshEvent, MeshNode
from mesh.relay import RelayLimitsConfig

if TYPE_CHECKING:
    from gpuflex.node.faults import Faults

log = logging.getLogger("gpuflex.node")


class NodeStartError(GpuflexError, RuntimeError):
    """The node cannot start; the message says why and what to do."""


@dataclass
class NodeOptions:
    home: Path
    listen: list[str] = field(default_factory=lambda: ["/ip4/0.0.0.0/tcp/4001"])
    announce: list[str] = field(default_factory=list)
    bootstrap: list[str] = field(default_factory=list)
    client_mode: bool = False
    bulk_channel: bool = True
    bootstrap_timeout_s: float = 30.0
    control_port: int = 0
    health: HealthConfig = field(default_factory=HealthConfig)
    adversary: str | None = None
    metrics: str | None = None  # Prometheus endpoint, e.g. "127.0.0.1:9464"; off when None
    relay: RelayLimitsConfig = field(default_factory=RelayLimitsConfig)
    mdns: bool = True
    reachability: str | None = None  # forced "public"/"private"; None: ask peers
    config: NodeConfig | None = None  # node.toml with the start flags on top; None: read <home>/node.toml
    limits: PeerLimits = field(default_factory=PeerLimits)  # what one peer may cost this node
    address_book_size: int = 256  # peers kept across restarts (mesh.addressbook)
    pex_every_s: float = MeshConfig.pex_every_s  # a settled node's peer-exchange period (mesh.pex)


def load_identity(home: Path) -> tuple[Identity, bool]:
    from mesh.identity import IdentityError

    try:
        return Identity.load_or_create(home / KEY_FILE)
    except IdentityError as exc:
        raise NodeStartError(str(exc)) from None


def running_pid(home: Path) -> int | None:
    """The pid of a live node already serving ``home``, if any."""
    try:
        pid = int(json.loads((home / CONTROL_FILE).read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid
    return pid if pid != os.getpid() else None


class NodeRuntime:
    def __init__(self, options: NodeOptions) -> None:
        self.options = options
        self.home = options.home
        self.home.mkdir(parents=True, exist_ok=True)
        os.chmod(self.home, 0o700)
        pid = running_pid(self.home)
        if pid is not None:
            raise NodeStartError(f"a node is already running for home {self.home} (pid {pid})")
        try:
            self.config = options.config if options.config is not None else load_node_config(self.home)
        except NodeConfigError as exc:
            raise NodeStartError(str(exc)) from None
        self.identity, created = load_identity(self.home)
        if created:
            log.info("created a new identity in %s", self.home / KEY_FILE)
        self.events = EventLog()
        self.started_at = time.time()
        self.mesh = MeshNode(
            self.identity,
            MeshConfig(
                listen=options.listen,
                announce=options.announce,
                bootstrap=options.bootstrap,
                client_mode=options.client_mode,
                bulk_channel=options.bulk_channel,
                bootstrap_timeout_s=options.bootstrap_timeout_s,
                data_dir=self.home,
                address_book=self.home / PEERS_FILE,
                address_book_size=options.address_book_size,
                pex_every_s=options.pex_every_s,
                health=options.health,
                node_info=self._hardware(),
                relay=options.relay,
                mdns=options.mdns,
                reachability=options.reachability,
                limits=options.limits,
            ),
            on_event=self._mesh_event,
        )
        self.jobs = JobManager(self.mesh, self.events, self.home, self._faults(options), self.config)
        try:
            self.serving = NodeServing(self.mesh, self.jobs, self.home, serve_settings(self.config, self.home),
                                       self.config)
        except ServeError as exc:
            raise NodeStartError(f"{self.config.source or 'node.toml'}: {exc}") from None
        self._stop = trio.Event()
        self.metrics_addr: tuple[str, int] | None = None

    @staticmethod
    def _faults(options: NodeOptions) -> Faults:
        """A normal node's no-op hooks, unless a test harness installed its own or the node
        was started as a (loopback-only) ``--adversary``."""
        from gpuflex.node import faults

        hooks = faults.installed()
        if hooks is not None:
            return hooks
        if options.adversary:
            from gpuflex.adversary import make_adversary

            return make_adversary(options.adversary)
        return faults.NO_FAULTS

    @staticmethod
    def _hardware() -> dict[str, Any]:
        from gpuflex.hardware import collect_hardware

        return collect_hardware()

    def _mesh_event(self, type_: MeshEvent, **fields: Any) -> None:
        self.events.emit(type_, **fields)

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        control = ControlServer(self.home, self.api_methods(), self.events, self.identity.peer_id,
                                port=self.options.control_port)
        async with trio.open_nursery() as nursery:
            await nursery.start(self.mesh.run)
            # The mesh logs its "listening on" line (peer id included) when it starts. Torch is
            # warmed up when a job is prepared (``load_trainer``), not here: an idle node never pays it.
            await nursery.start(self.jobs.run)
            await nursery.start(self.serving.service.run)
            port = await nursery.start(control.run)
            log.info("control API on 127.0.0.1:%d (token in %s)", port, self.home / "control.token")
            if self.options.metrics:
                from gpuflex.node.metrics_http import MetricsServer

                self.metrics_addr = await nursery.start(MetricsServer(self, self.options.metrics).run)
            task_status.started(self)
            await self._stop.wait()
            self.mesh.stop()
            nursery.cancel_scope.cancel()
        control.remove_file()

    def stop(self) -> None:
        self._stop.set()

    # -- control API -------------------------------------------------------------------------

    def api_methods(self) -> dict[str, Any]:
        return {
            "status": self.api_status,
            "peers": self.api_peers,
            "jobs": self.serving.api_jobs,  # training jobs, then batch inference jobs
            "job_status": self.serving.api_job_status,
            "job_submit": self.jobs.api_submit,
            "job_results": self.jobs.api_results,
            "ledger": self.serving.api_ledger,
            "shutdown": self.api_shutdown,
            "clock": self.api_clock,
            "serve_add": self.serving.api_add,
            "serve_status": self.serving.api_status,
            "serve_complete": self.serving.api_complete,
            "infer_submit": self.serving.api_infer_submit,
            "infer_results": self.serving.api_infer_results,
        }

    async def api_clock(self, params: dict[str, Any]) -> dict[str, Any]:
        """This node's wall clock, for ``gpuflex doctor``'s skew estimate (precision ± RTT/2)."""
        return {"now": time.time()}

    async def api_status(self, params: dict[str, Any]) -> dict[str, Any]:
        mesh = self.mesh.status()
        return {
            "peer_id": self.identity.peer_id,
            "version": __version__,
            "home": str(self.home),
            "addrs": mesh["addrs"],
            "uptime_s": round(time.time() - self.started_at, 1),
            "mesh": mesh["mesh"],
            "join": mesh["join"],
            "bytes_sent": mesh["bytes_sent"],
            "bytes_received": mesh["bytes_received"],
            "node_info": self.mesh.node_info(),
            "nat": {**mesh["nat"], "listening_since": mesh["listening_since"]},
            "jobs": self.jobs.job_briefs(),
            "serve": self.serving.service.status(),
        }

    async def api_peers(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        rows = []
        for rec in self.mesh.peers.all():
            row = rec.row(self.mesh.peers.wall_offset())
            row["rounds_contributed"] = self.jobs.rounds_contributed(rec.peer_id)
            row["reachability"] = (rec.info or {}).get("reachability", "unknown")
            row["connection"] = self.mesh.nat.connection(rec.peer_id)
            rows.append(row)
        return sorted(rows, key=lambda r: r["peer_id"])

    async def api_shutdown(self, params: dict[str, Any]) -> dict[str, Any]:
        self.stop()
        return {"stopping": True}


__all__ = ["ApiError", "NodeOptions", "NodeRuntime", "NodeStartError"]

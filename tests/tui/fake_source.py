"""An in-memory DataSource with fixed, realistic data, for tests and for trying the
dashboard by hand:

    .venv/bin/python -m tests.tui.fake_source          # a live, changing mesh
    .venv/bin/python -m tests.tui.fake_source --static # the frozen data the snapshots use
    .venv/bin/python -m tests.tui.fake_source --outages  # the node drops out now and then
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import sys
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from tui.source import SourceUnavailable

NOW = 1763800000.0
"""The fixed clock of every snapshot."""

B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def peer_id(n: int) -> str:
    digest = hashlib.sha512(f"peer-{n}".encode()).digest()
    return "12D3KooW" + "".join(B58[b % 58] for b in digest[:44])


SELF = peer_id(0)
GIB = 1 << 30
JOB_ID = "a1b2c3d4e5f6a7b8"


def node_info(n: int, name: str | None, mem_gib: int, cap: str, cpus: int) -> dict[str, Any]:
    accs = (
        []
        if name is None
        else [{"kind": "cuda", "name": name, "memory_bytes": mem_gib * GIB, "capability": cap}]
    )
    return {
        "version": "0.1.0",
        "peer_id": peer_id(n),
        "os": "Linux 6.1",
        "cpu_count": cpus,
        "ram_bytes": 32 * GIB,
        "torch": "2.13.0",
        "legacy": name is not None and float(cap) < 7.0,
        "accelerators": accs,
        "addrs": [f"/ip4/127.0.0.1/tcp/{4001 + n}"],
        "ts": NOW - 60,
    }


PEERS = [  # n, device, GiB, capability, cpus, state, rtt, seen ago, rounds, penalty
    (1, "NVIDIA GeForce GTX 1080", 8, "6.1", 8, "up", 0.8, 1, 3, 0.0),
    (2, "NVIDIA GeForce RTX 3090", 24, "8.6", 16, "up", 1.4, 0, 3, 0.0),
    (3, None, 0, "", 4, "up", 2.1, 2, 2, 0.0),
    (4, "NVIDIA GeForce RTX 4070", 12, "8.9", 12, "suspect", 38.0, 9, 1, 0.5),
    (5, "NVIDIA Tesla K80", 12, "3.7", 8, "up", 12.3, 1, 3, 0.0),
]


REACH = ("public", "relayed", "public", "private", "relayed", "public")


def peer_rows() -> list[dict[str, Any]]:
    return [
        {
            "peer_id": peer_id(n),
            "state": state,
            "rtt_ms": rtt,
            "last_seen": NOW - ago,
            "addrs": [f"/ip4/127.0.0.1/tcp/{4001 + n}"],
            "info": node_info(n, name, mem, cap, cpus),
            "rounds_contributed": rounds,
            "penalty": pen,
            "reachability": REACH[n % len(REACH)],
            "connection": "relayed" if REACH[n % len(REACH)] == "relayed" else "direct",
        }
        for n, name, mem, cap, cpus, state, rtt, ago, rounds, pen in PEERS
    ]


METRICS = (
    (1, 1.21, 0.71),
    (2, 0.74, 0.82),
    (3, 0.52, 0.88),
    (4, 0.41, 0.90),
    (5, 0.36, 0.91),
    (6, 0.33, 0.93),
)


def job_row(round_: int = 6) -> dict[str, Any]:
    return {
        "job_id": JOB_ID,
        "name": "digits",
        "state": "running",
        "round": round_,
        "rounds": 15,
        "phase": "train",
        "phase_progress": 0.4,
        "coordinator": peer_id(2),
        "is_coordinator": False,
        "role": "leader",
        "members": [SELF] + [peer_id(n) for n in range(1, 5)],
        "metrics": [
            {
                "round": r,
                "loss": loss,
                "accuracy": acc,
                "train_loss": loss * 1.2,
                "contributors": 4,
                "duration_s": 3.1,
            }
            for r, loss, acc in METRICS
            if r <= round_
        ],
    }


def old_job() -> dict[str, Any]:
    return {
        "job_id": "ffee00112233",
        "name": "shakespeare",
        "state": "done",
        "round": 5,
        "rounds": 5,
        "phase": "done",
        "phase_progress": 1.0,
        "coordinator": SELF,
        "is_coordinator": True,
        "role": "idle",
        "members": [SELF, peer_id(1)],
        "metrics": [],
    }


def ledger_rows(metrics: Sequence[tuple[int, float, float]]) -> list[dict[str, Any]]:
    rows, prev = [], "0" * 64
    for r, loss, acc in metrics:
        result = hashlib.sha256(f"result-{r}".encode()).hexdigest()
        rows.append(
            {
                "round": r,
                "coordinator": peer_id(1 + r % 3),
                "contributors": [{"peer": peer_id(n), "samples": 300 + 10 * n} for n in range(4)],
                "metrics": {"loss": loss, "accuracy": acc},
                "model_hash": hashlib.sha256(f"model-{r}".encode()).hexdigest(),
                "prev_result_hash": prev,
                "result_hash": result,
            }
        )
        prev = result
    return rows


def history() -> list[dict[str, Any]]:
    kinds = [
        ("node_started", None, SELF, "node started"),
        ("peer_up", None, peer_id(1), ""),
        ("plan_received", 6, peer_id(2), "round 6 plan from the coordinator"),
        ("update_received", 6, peer_id(3), "update from a peer, 310 samples"),
        ("partial_verified", 5, peer_id(2), "partial of 4 updates verified"),
        ("round_committed", 5, peer_id(2), "round 5 committed: loss 0.36, accuracy 0.91"),
        ("peer_suspect", None, peer_id(4), "no pong for 3 s"),
        ("plan_received", 6, peer_id(2), "round 6 plan: group of 4, leader is this node"),
        ("update_sent", 6, SELF, "update sent: 300 samples, loss 0.35"),
    ]
    return [
        {
            "seq": i + 1,
            "ts": NOW - 60 + 5 * i,
            "type": t,
            "job": JOB_ID,
            "round": r,
            "peer": p,
            "message": m,
        }
        for i, (t, r, p, m) in enumerate(kinds)
    ]


class FakeSource:
    """A node in a dict. ``down = True`` makes every call fail as if the node had gone."""

    def __init__(self) -> None:
        self.peer_list = peer_rows()
        self.job_list = [job_row(), old_job()]
        self.metrics = list(METRICS)
        self.event_log = history()
        self.down = False
        self.calls: list[str] = []
        self.serve: dict[str, Any] = {}  # a serving node's block (tests.tui.fake_serving)
        self._new_event = asyncio.Event()

    def _call(self, method: str) -> None:
        self.calls.append(method)
        if self.down:
            raise SourceUnavailable("connection refused")

    def describe(self) -> str:
        return "fake node"

    async def status(self) -> dict[str, Any]:
        self._call("status")
        states = [p["state"] for p in self.peer_list]
        return {
            "peer_id": SELF,
            "version": "0.1.0",
            "home": "/home/me/.gpuflex",
            "addrs": ["/ip4/127.0.0.1/tcp/4001"],
            "uptime_s": 754.0,
            "mesh": {
                "peers": len(states),
                "up": states.count("up"),
                "suspect": states.count("suspect"),
                "down": states.count("down"),
            },
            "node_info": node_info(0, "NVIDIA GeForce GTX 1070", 8, "6.1", 8),
            "jobs": copy.deepcopy(self.job_list),
            **({"serve": copy.deepcopy(self.serve)} if self.serve else {}),
        }

    async def peers(self) -> list[dict[str, Any]]:
        self._call("peers")
        return copy.deepcopy(self.peer_list)

    async def jobs(self) -> list[dict[str, Any]]:
        self._call("jobs")
        return copy.deepcopy(self.job_list)

    async def ledger(self, job: str) -> list[dict[str, Any]]:
        self._call("ledger")
        round_ = next((j["round"] for j in self.job_list if j["job_id"] == job), 0)
        return ledger_rows(self.metrics[:round_]) if job == JOB_ID else []

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        self._call("events")
        sent = 0
        while True:
            while sent < len(self.event_log):
                yield self.event_log[sent]
                sent += 1
            self._new_event.clear()
            await self._new_event.wait()
            if self.down:
                raise SourceUnavailable("connection reset")

    async def aclose(self) -> None:
        self._new_event.set()

    # -- changes a test or the live demo makes ---------------------------------------

    def emit(
        self, type_: str, message: str, peer: str = "", round_: int | None = None, ts: float = NOW
    ) -> None:
        seq = len(self.event_log) + 1
        self.event_log.append(
            {
                "seq": seq,
                "ts": ts,
                "type": type_,
                "job": JOB_ID,
                "round": round_,
                "peer": peer,
                "message": message,
            }
        )
        self._new_event.set()

    def set_state(self, n: int, state: str, ts: float = NOW) -> None:
        self.peer_list[n - 1]["state"] = state
        self.emit(f"peer_{state}", f"peer {state}", peer=peer_id(n), ts=ts)

    def go_down(self, down: bool = True) -> None:
        self.down = down
        self._new_event.set()


async def simulate(source: FakeSource, outages: bool = False) -> None:
    """Walk the job through its phases in real time so the screens move; with ``outages``
    the node also vanishes for 4 s out of every 20, to watch the banner come and go."""
    phases = ["plan", "train", "reduce", "commit"]
    tick = 0
    while True:
        await asyncio.sleep(0.5)
        tick += 1
        if outages:
            source.go_down(tick % 40 >= 32)
        job = source.job_list[0]
        step = tick % 20
        job["phase"], job["phase_progress"] = phases[step // 5], (step % 5) / 5
        for row in source.peer_list:
            row["last_seen"] = time.time() - (tick % 3)
        if step == 0 and job["round"] < job["rounds"]:
            job["round"] += 1
            r = job["round"]
            loss, acc = 1.2 / r**0.6, min(0.99, 0.95 - 0.3 / r)
            job["metrics"].append({"round": r, "loss": loss, "accuracy": acc, "contributors": 4})
            source.metrics.append((r, loss, acc))
            source.emit(
                "round_committed",
                f"round {r} committed: loss {loss:.2f}, accuracy {acc:.2f}",
                peer_id(2),
                r,
                ts=time.time(),
            )
        elif step == 5:
            source.emit(
                "plan_received",
                f"round {job['round'] + 1} plan received",
                peer_id(2),
                job["round"] + 1,
                ts=time.time(),
            )
        elif step == 12:
            source.emit(
                "update_sent", "update sent: 300 samples", "", job["round"] + 1, ts=time.time()
            )
        if tick % 37 == 0:
            source.set_state(
                3, "down" if source.peer_list[2]["state"] == "up" else "up", ts=time.time()
            )


def main(argv: list[str]) -> None:
    from tui.app import DashboardApp

    static, outages = "--static" in argv, "--outages" in argv
    source = FakeSource()

    class LiveApp(DashboardApp):
        def on_mount(self) -> None:
            # Textual also calls DashboardApp.on_mount itself, so no super() here.
            if not static:
                self.run_worker(simulate(source, outages), group="feed")

    LiveApp(source, clock=(lambda: NOW) if static else time.time).run()


if __name__ == "__main__":
    main(sys.argv[1:])

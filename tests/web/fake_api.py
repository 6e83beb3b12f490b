"""An in-memory control API for the portal's unit tests, on trio.

The data is realistic: peers, NodeInfo and events come from the dashboard's fake
(tests/tui/fake_source.py), and the main job's ledger is a real signed chain
(tests/unit/node/chain.py), so its ``ledger`` rows, its exported ``ledger.msgpack`` and an audit
of that file all agree. A second job carries a hostile name and no valid ledger file.
"""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import msgpack
import trio

from gpuflex.node.ledger import result_row, verify_chain
from tests.tui.fake_source import JOB_ID as HOSTILE_JOB
from tests.tui.fake_source import METRICS, SELF, history, job_row, ledger_rows, node_info, peer_rows
from tests.unit.node.chain import JOB, make_chain
from web.source import NodeRefused, NodeUnavailable

HOSTILE_NAME = "<script>alert(1)</script> [/evil] $\\x$"
ROUNDS = 3


def job_spec() -> dict[str, Any]:
    """The spec of both jobs, as ``job_status`` returns it and ``job_results`` writes it."""
    return {"name": "digits", "model": "digits-cnn", "data": "digits", "rounds": 5, "note": HOSTILE_NAME}


def chain_job(rounds: int) -> dict[str, Any]:
    return {
        "job_id": JOB, "name": "digits", "state": "running", "round": rounds, "rounds": 5,
        "phase": "train", "phase_progress": 0.5, "coordinator": SELF, "is_coordinator": True,
        "role": "root", "members": [SELF], "waiting": "", "error": "", "model_hash": "",
        "metrics": [{"round": r, "loss": 1.0 / r, "accuracy": 0.5 + r / 10} for r in range(1, rounds + 1)],
    }


class FakeApi:
    """A node in a dict. ``down = True`` makes every call fail as a stopped node would."""

    def __init__(self) -> None:
        self.frames, self.ids = make_chain(ROUNDS, 3)
        self.peer_list = peer_rows()
        hostile = job_row()
        hostile["name"] = HOSTILE_NAME
        hostile["state"] = "done"
        self.job_list = [chain_job(ROUNDS), hostile]
        self.event_log = history()
        self.down = False
        self.calls: list[str] = []
        self._new_event = trio.Event()

    def describe(self) -> str:
        return "fake node"

    async def aclose(self) -> None:
        self._new_event.set()

    def ledger_rows(self, job: str) -> list[dict[str, Any]]:
        if job == JOB:
            return [result_row(r) for r in verify_chain(self.frames, JOB)]
        if job == HOSTILE_JOB:
            return ledger_rows(METRICS)
        raise NodeRefused(f"unknown job {job!r}")

    async def call(self, method: str, params: dict[str, Any] | None = None,
                   timeout: float | None = None) -> Any:
        self.calls.append(method)
        params = params or {}
        await trio.sleep(0)
        if self.down:
            raise NodeUnavailable("no answer at 127.0.0.1:1 (connection refused)")
        if method == "status":
            states = [p["state"] for p in self.peer_list]
            return {"peer_id": SELF, "version": "0.1.0", "home": "/home/me/.gpuflex",
                    "addrs": ["/ip4/127.0.0.1/tcp/4001/p2p/" + SELF,
                              "/ip4/192.0.2.7/tcp/4001/p2p/" + SELF],
                    "uptime_s": 754.0,
                    "mesh": {"peers": len(states), "up": states.count("up"),
                             "suspect": states.count("suspect"), "down": states.count("down")},
                    "node_info": node_info(0, "NVIDIA GeForce GTX 1070", 8, "6.1", 8),
                    "jobs": copy.deepcopy(self.job_list)}
        if method == "peers":
            return copy.deepcopy(self.peer_list)
        if method == "jobs":
            return copy.deepcopy(self.job_list)
        if method == "ledger":
            return self.ledger_rows(str(params.get("job")))
        if method == "job_status":
            job = str(params.get("job"))
            summary = next((j for j in self.job_list if j["job_id"] == job), None)
            if summary is None:
                raise NodeRefused(f"unknown job {job!r}")
            return {**copy.deepcopy(summary), "spec": job_spec(), "publisher": SELF}
        if method == "job_results":
            return {"files": self.write_results(str(params["job"]), Path(params["out"]))}
        raise NodeRefused(f"unknown method {method!r}")

    def write_results(self, job: str, out: Path) -> list[str]:
        """What ``job_results`` writes, for the two jobs: a real chain, or bytes that are not one."""
        if job not in (JOB, HOSTILE_JOB):
            raise NodeRefused(f"unknown job {job!r}")
        out.mkdir(parents=True, exist_ok=True)
        if job == JOB:
            ledger = msgpack.packb({"v": 1, "job": JOB, "frames": self.frames}, use_bin_type=True)
            model = f"model-{len(self.frames)}".encode()  # make_chain's model hashes name these bytes
        else:
            ledger, model = b"not a ledger", b"no model"
        (out / "ledger.msgpack").write_bytes(ledger)
        (out / "model.blob").write_bytes(model)
        (out / "model.pt").write_bytes(b"torch state_dict of " + job.encode())
        (out / "job.json").write_text(json.dumps({"job_id": job, "spec": job_spec()}))
        return [str(p) for p in sorted(out.iterdir())]

    async def events(self) -> AsyncGenerator[dict[str, Any], None]:
        if self.down:
            raise NodeUnavailable("connection refused")
        sent = 0
        while True:
            while sent < len(self.event_log):
                yield self.event_log[sent]
                sent += 1
            self._new_event = trio.Event()
            await self._new_event.wait()
            if self.down:
                raise NodeUnavailable("connection reset")

    # -- changes a test makes -----------------------------------------------------------------

    def commit_round(self) -> None:
        """The chain job gains a committed round (a fresh, longer chain)."""
        self.frames, self.ids = make_chain(len(self.frames) + 1, 3)
        self.job_list[0] = chain_job(len(self.frames))

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

from gpuflex.node.core.ledger import result_row, verify_chain
from gpuflex_web.source import NodeRefused, NodeUnavailable
from tests.tui.fake_source import JOB_ID as HOSTILE_JOB
from tests.tui.fake_source import METRICS, SELF, history, job_row, ledger_rows, node_info, peer_rows
from tests.unit.node.chain import JOB, make_chain

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


LLM_JOB, LONG_JOB = "11aa" * 4, "22bb" * 4


def llm_spec() -> dict[str, Any]:
    return {"name": "shakespeare-lora", "model": "llama", "data": "shakespeare", "partition": "groups",
            "rounds": 10, "secure_aggregation": False, "codec": "int8", "compute_budget_s": None,
            "llm": {"size": "tiny", "adapter": "lora", "lora_rank": 16,
                    "lora_targets": ["q_proj", "v_proj", "embed_tokens", "lm_head"], "tokenizer": "bytes"}}


def long_spec(rounds: int) -> dict[str, Any]:
    return {"name": "long-digits", "model": "mlp", "data": "sklearn-digits", "rounds": rounds,
            "secure_aggregation": False}


def metric_row(r: int, rounds: int, llm: bool) -> dict[str, Any]:
    loss = 2.2 + 3.4 / (1 + r) if llm else 0.2 + 2.0 / (1 + r / 20)
    row = {"round": r, "loss": loss, "accuracy": min(0.99, 0.1 + 0.9 * r / (r + 5 if not llm else r + 20)),
           "train_loss": loss * 1.05, "contributors": 3, "duration_s": 2.5,
           "update_bytes": 3 * (49372 if llm else 10_000), "down_bytes": 49372 if llm else 10_000}
    if llm:
        import math

        row["perplexity"] = math.exp(loss)
    return row


def synthetic_ledger(rounds: int, llm: bool) -> list[dict[str, Any]]:
    """``ledger`` rows as the node sends them (gpuflex.node.core.ledger.result_row), without a chain."""
    from tests.tui.fake_source import peer_id

    rows = []
    for r in range(1, rounds + 1):
        m = metric_row(r, rounds, llm)
        rows.append({
            "round": r, "attempt": 0, "coordinator": peer_id(r % 3),
            "contributors": [{"peer": peer_id(k), "samples": 1000 + k, "device": f"CPU ×{2 + k} (cpu)",
                              "steps": 30, "samples_per_s": 1234.5678 * (k + 1), "compute_s": 1.5 + k,
                              "compute_share": (1.5 + k) / 7.5} for k in range(3)],
            "absent": [], "metrics": {k: v for k, v in m.items() if k != "round"},
            "strategy": "diloco", "base_hash": f"{r - 1:064x}", "model_hash": f"{r:064x}",
            "prev_result_hash": f"{r + 999:064x}", "result_hash": f"{r + 1000:064x}", "ts": 1_700_000_000.0 + r})
    return rows


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
        self.extra: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {}  # job: (spec, ledger)
        self.calls: list[str] = []
        self.serve: dict[str, Any] = {}  # a serving node's status block (tests.tui.fake_serving)
        self.asked: list[dict[str, Any]] = []  # serve_complete's params, as the portal sent them
        self._new_event = trio.Event()

    def describe(self) -> str:
        return "fake node"

    async def aclose(self) -> None:
        self._new_event.set()

    def add_llm_and_long_jobs(self, long_rounds: int = 400, llm_round: int = 4) -> None:
        """Two more jobs: a LoRA language-model job still running, and a finished job of
        ``long_rounds`` rounds (what a long run looks like to the pages)."""
        llm_rows = synthetic_ledger(llm_round, llm=True)
        long_rows = synthetic_ledger(long_rounds, llm=False)
        self.extra[LLM_JOB] = (llm_spec(), llm_rows)
        self.extra[LONG_JOB] = (long_spec(long_rounds), long_rows)
        base = {"phase_progress": 0.5, "coordinator": SELF, "is_coordinator": False, "role": "member",
                "members": [SELF], "waiting": "", "error": "", "model_hash": "ab" * 32}
        self.job_list[:0] = [
            {**base, "job_id": LONG_JOB, "name": "long-digits", "state": "done", "round": long_rounds,
             "rounds": long_rounds, "phase": "done",
             "metrics": [metric_row(r, long_rounds, False) for r in range(1, long_rounds + 1)]},
            {**base, "job_id": LLM_JOB, "name": "shakespeare-lora", "state": "running", "round": llm_round,
             "rounds": 10, "phase": "train", "metrics": [metric_row(r, 10, True) for r in range(1, llm_round + 1)]},
        ]

    def ledger_rows(self, job: str) -> list[dict[str, Any]]:
        if job in self.extra:
            return copy.deepcopy(self.extra[job][1])
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
                    "jobs": copy.deepcopy(self.job_list),
                    **({"serve": copy.deepcopy(self.serve)} if self.serve else {})}
        if method == "serve_complete":
            return self.complete(params)
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
            spec = self.extra[job][0] if job in self.extra else job_spec()
            return {**copy.deepcopy(summary), "spec": copy.deepcopy(spec), "publisher": SELF}
        if method == "job_results":
            return {"files": self.write_results(str(params["job"]), Path(params["out"]))}
        raise NodeRefused(f"unknown method {method!r}")

    def complete(self, params: dict[str, Any]) -> dict[str, Any]:
        """``serve_complete`` as a node answers it: a model no server has is refused."""
        self.asked.append(dict(params))
        served = {m for s in self.serve.get("servers", []) for m in s["models"]}
        if params.get("model") not in served:
            raise NodeRefused(f"no node serves model {params.get('model')!r}")
        text = f" <i>{params['model']}</i> says {len(params['prompt'])} characters"
        return {"model": params["model"], "text": text, "finish": "length",
                "usage": {"prompt_tokens": 5, "completion_tokens": params["max_tokens"], "total_tokens": 5},
                "server": self.serve["servers"][1]["peer"], "first_token_ms": 41.5, "total_ms": 230.0}

    def write_results(self, job: str, out: Path) -> list[str]:
        """What ``job_results`` writes, for the two jobs: a real chain, or bytes that are not one."""
        if job in self.extra:
            return self.write_extra_results(job, out)
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

    def write_extra_results(self, job: str, out: Path) -> list[str]:
        """A language model's results are Hugging Face folders, never a model.pt."""
        spec, _ = self.extra[job]
        out.mkdir(parents=True, exist_ok=True)
        (out / "ledger.msgpack").write_bytes(b"ledger of " + job.encode())
        (out / "model.blob").write_bytes(b"model of " + job.encode())
        (out / "job.json").write_text(json.dumps({"job_id": job, "spec": spec}))
        if spec["model"] == "llama":
            for folder, files in (("adapter", ("adapter_model.safetensors", "adapter_config.json")),
                                  ("base", ("model.safetensors", "config.json", "tokenizer.json"))):
                (out / folder).mkdir(exist_ok=True)
                for name in files:
                    (out / folder / name).write_bytes(f"{folder}/{name} of {job}".encode())
            (out / "export.json").write_text(json.dumps({"adapter": "lora"}))
        else:
            (out / "model.pt").write_bytes(b"torch state_dict of " + job.encode())
        return [str(p) for p in sorted(out.rglob("*")) if p.is_file()]

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

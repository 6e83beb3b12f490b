"""Chaos run: a job on 8 node processes while nodes, the coordinator and the first node
(every other node's --bootstrap) included, are killed with SIGKILL and restarted at random
times. The first node always comes back on a new port, so the restarted nodes, which still
have its original address on their command line, get back in through their address books.

Reports rounds committed, rounds retried, time to detect a dead coordinator (from the kill
until a surviving node follows a new plan), rejoin times (from a restart until the node is
connected to the mesh again, and until its view of the job has caught up with the round the
mesh was in when it came back), updates lost (an update a leader acknowledged,
from a node alive when its round committed, missing from that round's result: must be 0), and
whether every node ends with the same ledger.

``--forget`` deletes a node's address book before each restart: the bootstrap-only
behaviour, for comparison. A node that exits on its own (it found no one to join) ends the
run, reported as not completed.

    python -m benchmarks.chaos [--nodes 8] [--rounds 12] [--seed 1] [--move-all] [--forget] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from gpuflex.client import ControlError
from gpuflex.demo import demo_spec
from gpuflex.home import PEERS_FILE
from gpuflex.localmesh import LocalMesh, free_port
from gpuflex.node.core.ledger import Ledger

SENT = re.compile(r"round (\d+): update sent to")
JOINED = re.compile(r"joined the mesh through \S+ \((\d+) known peers dialled, ([\d.]+)s\)")
WAITED = "so it keeps trying"


def say(text: str) -> None:
    """Progress goes to stderr, so that stdout holds only the result (``--json`` parses)."""
    print(text, file=sys.stderr, flush=True)


class NodeExited(RuntimeError):
    """A node stopped without being killed: the run cannot finish as designed."""


class Chaos:
    def __init__(self, mesh: LocalMesh, job: str, rng: random.Random, max_down: int = 2,
                 move_all: bool = False, forget: bool = False) -> None:
        self.mesh, self.job, self.rng, self.max_down = mesh, job, rng, max_down
        self.move_all, self.forget = move_all, forget
        self.restarts: list[dict[str, Any]] = []
        self.exits: list[str] = []  # nodes that exited without being killed, with their last log line
        self.ids = {mesh.call(i, "status")["peer_id"]: i for i in range(mesh.size)}
        self.down: dict[int, float] = {}
        self.kills: list[dict[str, Any]] = []
        self.stop = threading.Event()
        self.t0 = time.time()

    def observe(self) -> dict[str, Any]:
        """The job as seen by the first live node that answers (a node just restarted may
        still be starting: its API is not up yet)."""
        error: Exception | None = None
        for i in range(self.mesh.size):
            if i in self.down or not self.mesh.alive(i):
                continue
            try:
                return self.mesh.job(i, self.job)
            except ControlError as exc:
                error = exc
        raise error or RuntimeError("no live node")

    def run(self) -> None:
        while not self.stop.wait(self.rng.uniform(3.0, 7.0)):
            try:
                self.step()
            except Exception as exc:  # chaos must not stop on a transient API error
                say(f"  chaos step skipped: {exc}")

    def step(self) -> None:
        now = time.time()
        for i, since in list(self.down.items()):
            if now - since > self.rng.uniform(6.0, 14.0):
                # The first node, every other node's --bootstrap, always comes back somewhere
                # else; the others keep their port (as a node does when it is free), unless
                # --move-all moves every one of them.
                moved = i == 0 or self.move_all
                if self.forget:
                    (self.mesh.home(i) / PEERS_FILE).unlink(missing_ok=True)
                try:
                    round_now = int(self.observe()["round"])
                except Exception:
                    round_now = 0
                self.mesh.start_node(i, wait=False, port=free_port() if moved else 0)
                del self.down[i]
                restart = {"node": i, "at": time.time(), "round": round_now}
                self.restarts.append(restart)
                threading.Thread(target=self.time_rejoin, args=(restart,), daemon=True).start()
                say(f"  t={now - self.t0:5.1f}s restarted node {i}{' on a new port' if moved else ''}")
        self.check_exits()
        if len(self.down) >= self.max_down:
            return
        status = self.observe()
        if status["state"] != "running":
            return
        coordinator = self.ids.get(status["coordinator"] or "")
        if coordinator is not None and coordinator not in self.down and self.rng.random() < 0.5:
            victim, kind = coordinator, "coordinator"
        else:
            victim = self.rng.choice([i for i in range(self.mesh.size) if i not in self.down])
            kind = "coordinator" if victim == coordinator else "member"
        round_now = status["round"]
        self.mesh.kill(victim, signal.SIGKILL)
        self.down[victim] = time.time()
        self.kills.append({"node": victim, "kind": kind, "at": time.time(), "round": round_now,
                           "coordinator": status["coordinator"]})
        say(f"  t={time.time() - self.t0:5.1f}s killed node {victim} ({kind}) during round {round_now + 1}")
        if kind == "coordinator":
            threading.Thread(target=self.time_failover, args=(self.kills[-1],), daemon=True).start()

    def check_exits(self) -> None:
        """Note every node that is gone though chaos did not kill it (it gave up joining)."""
        for i in range(self.mesh.size):
            if i in self.down or self.mesh.alive(i) or any(f"node {i}:" in e for e in self.exits):
                continue
            lines = self.mesh.log_path(i).read_text(errors="replace").strip().splitlines()
            errors = [line for line in lines if line.startswith("error:")]  # the CLI's one-line exit
            last = (errors or lines or ["no log"])[-1]
            self.exits.append(f"node {i}: {last[:200]}")
            say(f"  t={time.time() - self.t0:5.1f}s node {i} exited on its own: {self.exits[-1]}")

    def time_rejoin(self, restart: dict[str, Any]) -> None:
        """Seconds from a restart until the node says it is connected (``rejoin_s``), and until
        its view of the job reaches the round the mesh was in at the restart (``catchup_s``)."""
        i, deadline = restart["node"], restart["at"] + 180
        while time.time() < deadline and not self.stop.is_set() and i not in self.down and "catchup_s" not in restart:
            try:
                if "rejoin_s" not in restart and self.mesh.call(i, "status", timeout=3)["join"]["state"] == "connected":
                    restart["rejoin_s"] = time.time() - restart["at"]
                if "rejoin_s" in restart and self.mesh.job(i, self.job)["round"] >= restart["round"]:
                    restart["catchup_s"] = time.time() - restart["at"]
            except Exception:  # still starting: no API yet, or the job not known yet
                pass
            time.sleep(0.5)

    def time_failover(self, kill: dict[str, Any]) -> None:
        """Seconds until a survivor follows a plan or commit made by someone else."""
        deadline = kill["at"] + 120
        while time.time() < deadline:
            try:
                s = self.observe()
            except Exception:
                time.sleep(0.2)
                continue
            if s["round"] > kill["round"] or (s["coordinator"] != kill["coordinator"] and s["tree"]):
                kill["failover_s"] = time.time() - kill["at"]
                return
            time.sleep(0.1)


def lost_updates(mesh: LocalMesh, job: str, rows: list[dict[str, Any]], kills: list[dict[str, Any]],
                 ids: dict[str, int]) -> int:
    """Acknowledged updates from nodes alive at their round's commit that the result lacks."""
    by_node = {i: p for p, i in ids.items()}
    lost = 0
    for i in range(mesh.size):
        log = mesh.log_path(i).read_text(errors="replace")
        for r in sorted({int(m) for m in SENT.findall(log)}):
            if r > len(rows):
                continue
            row = rows[r - 1]
            # The round ran from the previous commit to this one; retried attempts can make that
            # longer than a minute, so "during" is measured from the previous commit.
            began = rows[r - 2]["ts"] if r > 1 else 0.0
            died = [k for k in kills if k["node"] == i and k["at"] <= row["ts"]]
            last_death = max((k["at"] for k in died), default=None)
            if last_death is not None and last_death > min(began, row["ts"] - 60):
                continue  # killed during (or shortly before) this round: a retried attempt plans without it
            if by_node[i] not in {c["peer"] for c in row["contributors"]}:
                lost += 1
    return lost


def join_dials(logs: list[Path]) -> dict[str, Any]:
    """From the nodes' logs: how long each restarted node took to reach its first peer once its
    process was up (the dials alone, without the seconds Python takes to start a node), and how
    often a restarted node found no one and waited. A node's first join (from --bootstrap, at
    the start of the run) is left out."""
    dials: list[float] = []
    waits = 0
    for path in logs:
        text = path.read_text(errors="replace")
        joins = [float(m.group(2)) for m in JOINED.finditer(text)]
        first_start_joins = 0 if "starting a new mesh" in text.split("control API on", 1)[0] else 1
        dials += joins[first_start_joins:]
        waits += text.count(WAITED)
    return {"joins": len(dials), "join_dial_median_s": spread(dials)["median"],
            "join_dial_max_s": spread(dials)["max"], "join_waits": waits}


def spread(values: list[float]) -> dict[str, float | None]:
    return {"median": round(statistics.median(values), 1) if values else None,
            "max": round(max(values), 1) if values else None}


def run(nodes: int, rounds: int, seed: int, move_all: bool = False, forget: bool = False,
        keep: bool = False) -> dict[str, Any]:
    """One chaos run. The node homes and logs are deleted after a completed run unless ``keep``;
    after a run that did not complete they stay, for reading."""
    base = Path(tempfile.mkdtemp(prefix="gpuflex-chaos-"))
    say(f"node homes and logs in {base}")
    result: dict[str, Any] = {"completed": False}
    try:
        result = _run(base, nodes, rounds, seed, move_all, forget)
        return result
    finally:
        if result.get("completed") and not keep:
            shutil.rmtree(base, ignore_errors=True)
        else:
            say(f"node homes and logs kept in {base}")


def _run(base: Path, nodes: int, rounds: int, seed: int, move_all: bool, forget: bool) -> dict[str, Any]:
    spec = demo_spec(rounds)
    spec.update({"local_epochs": 4, "min_nodes": 3, "plan_timeout_s": 3.0, "train_timeout_s": 15.0,
                 "reduce_timeout_s": 2.0, "group_size": 3})
    mesh = LocalMesh(base, nodes, log_level="info")
    try:
        mesh.start(timeout=180)
        mesh.wait_connected(90)
        job = mesh.submit(spec)
        chaos = Chaos(mesh, job, random.Random(seed), move_all=move_all, forget=forget)
        thread = threading.Thread(target=chaos.run, daemon=True)
        thread.start()

        def finished() -> bool:
            if chaos.exits:
                raise NodeExited("; ".join(chaos.exits))
            return bool(chaos.observe()["state"] == "done")

        began = time.time()
        try:
            mesh.wait_until(finished, timeout=rounds * 60, interval=1.0, what="job completion under chaos")
        except (NodeExited, TimeoutError) as exc:
            chaos.stop.set()
            thread.join(timeout=30)
            return {"nodes": nodes, "rounds": rounds, "seed": seed, "move_all": move_all, "forget": forget,
                    "completed": False, "error": str(exc)[:400], "after_s": round(time.time() - began, 1),
                    "kills": len(chaos.kills), "first_node_kills": sum(1 for k in chaos.kills if k["node"] == 0)}
        chaos.stop.set()
        thread.join(timeout=30)
        for i in list(chaos.down):
            mesh.start_node(i, wait=True)
        mesh.wait_until(lambda: all(mesh.job(i, job)["round"] == rounds for i in range(nodes)), timeout=120,
                        interval=1.0, what="every node caught up")
        rows = mesh.call(0, "ledger", {"job": job})
        frames = []
        for i in range(nodes):
            ledger = Ledger(mesh.home(i) / "jobs" / job / "ledger.msgpack", job)
            ledger.load()
            frames.append(ledger.frames)
        failovers = [k["failover_s"] for k in chaos.kills if "failover_s" in k]
        rejoins = [r["rejoin_s"] for r in chaos.restarts if "rejoin_s" in r]
        catchups = [r["catchup_s"] for r in chaos.restarts if "catchup_s" in r]
        return {
            "nodes": nodes, "rounds": rounds, "seed": seed, "move_all": move_all, "forget": forget,
            "completed": True,
            "first_node_kills": sum(1 for k in chaos.kills if k["node"] == 0),
            "rounds_committed": len(rows),
            "rounds_retried": sum(1 for r in rows if r["attempt"] > 0),
            "kills": len(chaos.kills),
            "coordinator_kills": sum(1 for k in chaos.kills if k["kind"] == "coordinator"),
            "failover_median_s": round(statistics.median(failovers), 2) if failovers else None,
            "failover_max_s": round(max(failovers), 2) if failovers else None,
            "restarts": len(chaos.restarts),
            # a restart killed again before it rejoined counts in "restarts", not in the times
            "rejoined": len(rejoins),
            "rejoin_median_s": spread(rejoins)["median"], "rejoin_max_s": spread(rejoins)["max"],
            "catchup_median_s": spread(catchups)["median"], "catchup_max_s": spread(catchups)["max"],
            **join_dials([mesh.log_path(i) for i in range(nodes)]),
            "updates_lost": lost_updates(mesh, job, rows, chaos.kills, chaos.ids),
            "ledgers_agree": all(f == frames[0] for f in frames),
            "final_accuracy": rows[-1]["metrics"].get("accuracy"),
        }
    finally:
        mesh.close()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="5 nodes, 6 rounds")
    parser.add_argument("--move-all", action="store_true",
                        help="every restarted node comes back on a new port (by default only the first node moves)")
    parser.add_argument("--forget", action="store_true",
                        help="delete each node's address book before it restarts (bootstrap-only, for comparison)")
    parser.add_argument("--keep", action="store_true", help="keep the node homes and logs after a completed run")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes, args.rounds = 5, 6
    say(f"chaos: seed {args.seed}, {args.nodes} nodes, {args.rounds} rounds (any node may be killed, "
        "the first one included)")
    result = run(args.nodes, args.rounds, args.seed, args.move_all, args.forget, args.keep)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key:20} {value}")
    return result


if __name__ == "__main__":
    outcome = main()
    # A run that did not finish, lost an update or split the ledger is a failure.
    sys.exit(0 if outcome.get("completed") and outcome.get("updates_lost") == 0 and outcome.get("ledgers_agree") else 1)

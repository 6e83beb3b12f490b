"""``gpuflex demo``: the main job on a local mesh of real node processes.

It is the product in two minutes: four (``--nodes``) processes find each other through the
DHT on loopback, train the digits CNN on non-IID Dirichlet shards with a rotating
coordinator, and the result is compared with training the same CNN centrally.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpuflex.localmesh import LocalMesh, MeshStartError

BAR = 24


def demo_spec(rounds: int) -> dict[str, Any]:
    from gpuflex.jobspec import JobSpec, example_job_toml, tomllib

    data = tomllib.loads(example_job_toml())
    data["rounds"] = rounds
    return JobSpec.from_dict(data).to_dict()


class Progress:
    """Prints one line per committed round, and a live bar on a terminal."""

    def __init__(self, rounds: int) -> None:
        self.rounds = rounds
        self.shown = 0
        self.tty = sys.stdout.isatty()

    def tick(self, js: dict[str, Any]) -> None:
        for m in js["metrics"][self.shown :]:
            filled = int(BAR * m["round"] / self.rounds)
            line = (f"round {m['round']:>2}/{self.rounds}  [{'#' * filled}{'.' * (BAR - filled)}]  "
                    f"loss {m['loss']:.4f}  accuracy {m['accuracy']:.4f}  "
                    f"nodes {m['contributors']}  {m['duration_s']:.1f}s  coordinator …{m['coordinator'][-8:]}")
            print(("\r" if self.tty else "") + line + " " * 4, flush=True)
            self.shown = m["round"]
        if self.tty and js["state"] == "running":
            print(f"\r  round {js['round'] + 1}: {js['phase']:<7} {js['phase_progress'] * 100:3.0f}%", end="",
                  flush=True)


def run_demo(nodes: int = 4, rounds: int = 15, tui: bool = False, workdir: str | None = None,
             baseline: bool = True) -> int:
    base = Path(workdir).resolve() if workdir else Path(tempfile.mkdtemp(prefix="gpuflex-demo-"))
    base.mkdir(parents=True, exist_ok=True)
    spec = demo_spec(rounds)
    print(f"GPUFlex demo: {nodes} nodes on loopback, digits CNN, Dirichlet α={spec['alpha']}, {rounds} rounds")
    print(f"node homes and logs in {base}")
    mesh = LocalMesh(base, nodes, log_level="warning")
    t0 = time.time()
    try:
        mesh.start()
        print(f"started {nodes} node processes in {time.time() - t0:.1f}s")
        took = mesh.wait_connected(60)
        print(f"every node found the other {nodes - 1} through the DHT in {took:.1f}s")
        job = mesh.submit(spec)
        print(f"submitted job {job}")
        t_job = time.time()
        if tui:
            from tui.app import run_dashboard

            run_dashboard(home=str(mesh.home(0)))
        progress = Progress(rounds)
        mesh.wait_job(job, list(range(nodes)), timeout=max(120.0, rounds * 30.0), on_tick=progress.tick)
        final = mesh.job(0, job)
        progress.tick(final)
        job_s = time.time() - t_job
        hashes = {mesh.job(i, job)["model_hash"] for i in range(nodes)}
        out = base / "results"
        mesh.call(0, "job_results", {"job": job, "out": str(out)}, timeout=120)
    except KeyboardInterrupt:
        print("\ninterrupted: stopping every node", file=sys.stderr)
        return 130
    except (MeshStartError, TimeoutError, RuntimeError) as exc:
        print(f"\nerror: {exc}", file=sys.stderr)
        print(f"node logs: {base}", file=sys.stderr)
        return 1
    finally:
        mesh.close()
    fed = final["metrics"][-1]
    coordinators = len({r["coordinator"] for r in mesh_ledger(out)})
    print()
    print(f"federated: accuracy {fed['accuracy']:.4f}, loss {fed['loss']:.4f} after {rounds} rounds "
          f"in {job_s:.1f}s ({coordinators} different coordinators)")
    if baseline:
        from gpuflex.jobspec import JobSpec
        from gpuflex.ml.baseline import central_baseline

        central = central_baseline(JobSpec.from_dict(spec))
        print(f"central:   accuracy {central['accuracy']:.4f}, loss {central['loss']:.4f} "
              f"(same CNN, same test split, trained on the union of the shards)")
    print(f"all {nodes} nodes hold the same model: {'yes' if len(hashes) == 1 else 'NO'} "
          f"({next(iter(hashes))[:16]}…)")
    print(f"model:   {out / 'model.pt'}  (torch.load gives a state_dict)")
    print(f"ledger:  {out / 'ledger.json'}  (verify with the signed copy {out / 'ledger.msgpack'})")
    print(f"metrics: {out / 'metrics.csv'}")
    print(f"total time {time.time() - t0:.1f}s")
    if not workdir:
        for i in range(nodes):
            shutil.rmtree(mesh.home(i), ignore_errors=True)
    return 0 if len(hashes) == 1 else 1


def mesh_ledger(out: Path) -> list[dict[str, Any]]:
    import json

    try:
        return list(json.loads((out / "ledger.json").read_text()))
    except (OSError, ValueError):
        return []

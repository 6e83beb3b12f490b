"""Define and run a federated job from Python, with no job file.

Researchers already have a ``make_model()`` and a ``load_data()``; the SDK turns them into a
job. Two ways to run it:

- :func:`submit` publishes the job through a running node (``gpuflex node start``). Nodes
  are other processes, often other machines, so a function travels as its import path
  (``package.module:function``) and must live in a module the nodes can import; each node
  runs it only if its operator allowed that path (``--allow-plugin``).
- :func:`run_local` starts a small mesh *inside this process* (nodes in one trio program on
  a background thread, homes in a temporary folder, loopback only) for a quick try. All nodes
  share the process, so any callable works, lambdas included: it is handed over through a
  process-local registry instead of an import path, and these nodes, being the caller's own,
  allow exactly the plug-ins of this job and read ``data_path`` as their ``[data]`` entry.

Both return a :class:`JobHandle` that can ``wait()``, stream per-round metrics and fetch the
final model as a plain torch ``state_dict``. The handle talks to the node only through the
control API, so it behaves the same for both.

    >>> job = run_local(make_model, load_data, nodes=3, rounds=5, local_steps=20)
    >>> for row in job.stream():
    ...     print(row["round"], row["accuracy"])
    >>> model.load_state_dict(job.state_dict())
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import shutil
import tempfile
import threading
import time
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuflex.client import ControlClient, ControlError
from gpuflex.errors import GpuflexError
from gpuflex.node.core.kinds import JobState
from gpuflex.plugins import EXPECTED, PluginError, is_plugin_path, load_callable

Ref = str | Callable[..., Any] | None
PLUGIN_FIELDS = ("model", "data", "train_fn", "partitioner", "rule")
FINISHED = (JobState.DONE, JobState.FAILED)

# Process-local plug-ins for run_local(): the spec names them "gpuflex.sdk:LOCAL.<name>",
# which the ordinary plug-in loader resolves because every node lives in this process.
LOCAL = types.SimpleNamespace()
_local_ids = itertools.count(1)
_local_lock = threading.Lock()


class JobFailed(GpuflexError, RuntimeError):
    """The job ended in the ``failed`` state; the message is the node's error."""


class ModelUnavailable(GpuflexError, LookupError):
    """The model asked for is not among the job's results; the message says which is."""


#: Where a job's results hold the model its ``model.pt`` is not (the best-scored round's or
#: the last round's), laid out like the results themselves (gpuflex/node/export.py).
OTHER_DIRS = {"best": "best", "last": "last"}
#: Held-out metrics by which a round can be best, and whether higher is better.
BEST_BY = {"loss": False, "perplexity": False, "accuracy": True}


def best_round(metrics: list[dict[str, Any]], metric: str | None = None) -> dict[str, Any]:
    """The committed round whose held-out ``metric`` was best (lowest loss or perplexity,
    highest accuracy); the later round on a tie. With no ``metric``, the node's own choice of
    the best round (``gpuflex.node.core.selection.score``: by accuracy where the rounds have
    one, else by loss), so that it names the round whose model ``state_dict("best")`` is."""
    from gpuflex.client.model import number
    from gpuflex.node.core.selection import score

    if metric is not None and metric not in BEST_BY:
        raise ValueError(f"metric must be one of {', '.join(BEST_BY)}, not {metric!r}")

    def rank(m: dict[str, Any]) -> float | None:  # higher is better
        if metric is None:
            return score(m)
        value = number(m.get(metric))
        return None if value is None else (value if BEST_BY[metric] else -value)

    rows = [(r, m) for m in metrics if (r := rank(m)) is not None]
    if not rows:
        raise ModelUnavailable(f"no committed round has a {metric or 'score'} yet")
    return dict(max(rows, key=lambda rm: (rm[0], rm[1]["round"]))[1])


# --- callables to plug-in paths ---------------------------------------------------------------


def importable_path(fn: Callable[..., Any], what: str) -> str:
    """``module:qualname`` of a function that another process can import, or a clear error.

    A lambda, a function defined inside another function, or one defined in ``__main__`` (a
    script or a notebook) has no import path a node could use.
    """
    name = getattr(fn, "__qualname__", None) or repr(fn)
    module = getattr(fn, "__module__", None)
    where = f"{what} {name!r}"
    hint = (f"define it with 'def' at the top level of a module the nodes can import, "
            f"pass 'package.module:function', or try it with run_local() (expected {EXPECTED.get(what, 'a function')})")
    if "<lambda>" in name:
        raise PluginError(f"{where} is a lambda, which cannot travel to other nodes: {hint}")
    if "<locals>" in name:
        raise PluginError(f"{where} is defined inside another function, so nodes cannot import it: {hint}")
    if not module or module == "__main__":
        raise PluginError(f"{where} is defined in __main__ (a script or notebook), so nodes cannot import it: {hint}")
    path = f"{module}:{name}"
    if load_callable(path, what) is not fn:
        raise PluginError(f"{where}: importing {path!r} gives another object: {hint}")
    return path


def _register_local(fn: Callable[..., Any], what: str) -> str:
    with _local_lock:
        name = f"{what}_{next(_local_ids)}"
        setattr(LOCAL, name, fn)
    return f"{__name__}:LOCAL.{name}"


def plugin_ref(value: Ref, what: str, *, in_process: bool) -> str:
    """What goes into the spec for one plug-in field: a built-in name or a plug-in path.

    A path given as text is imported here first, so a typo fails now with the plug-in
    loader's message (naming what was expected) instead of later inside a node.
    """
    if value is None or value == "":
        return ""
    if isinstance(value, str):
        if is_plugin_path(value):
            load_callable(value, what)
        return value
    if not callable(value):
        raise PluginError(f"{what} must be a function or a 'package.module:function' path, "
                          f"got {type(value).__name__} (expected {EXPECTED.get(what, 'a function')})")
    return _register_local(value, what) if in_process else importable_path(value, what)


def build_spec(model_fn: Ref, data_fn: Ref, *, in_process: bool, train_fn: Ref = None,
               partitioner: Ref = None, rule: Ref = None, **settings: Any) -> dict[str, Any]:
    """A validated job spec as plain data; every bad setting is reported at once."""
    from gpuflex.jobspec import JobSpec

    refs = {"model": model_fn, "data": data_fn, "train_fn": train_fn, "partitioner": partitioner,
            "rule": rule}
    data: dict[str, Any] = {"name": settings.pop("name", "sdk-job"), **settings}
    for what in PLUGIN_FIELDS:
        ref = plugin_ref(refs[what], what, in_process=in_process)
        if ref:
            data[what] = ref
    return JobSpec.from_dict(data).to_dict()


# --- the handle ---------------------------------------------------------------------------------


class JobHandle:
    """A submitted job, followed through the control API of the node at ``home``."""

    def __init__(self, job_id: str, home: str | os.PathLike[str] | None, poll_s: float = 0.5) -> None:
        self.job_id = job_id
        self.home = home
        self.poll_s = poll_s
        self._last: dict[str, Any] | None = None
        self._state: dict[str, Any] | None = None

    def _call(self, method: str, params: dict[str, Any] | None = None, timeout: float = 30.0) -> Any:
        with ControlClient.for_home(self.home, timeout=timeout) as client:
            return client.call(method, params)

    def status(self) -> dict[str, Any]:
        """The JobSummary (state, round, phase, metrics, ...); see docs/control-api.md."""
        if self._last is not None and self._last["state"] in FINISHED:
            return self._last
        self._last = dict(self._call("job_status", {"job": self.job_id}))
        return self._last

    def metrics(self) -> list[dict[str, Any]]:
        """One row per committed round: round, loss, accuracy, train_loss, contributors, ..."""
        return list(self.status()["metrics"])

    def stream(self, timeout: float | None = None) -> Iterator[dict[str, Any]]:
        """Yield each round's metrics as it commits, until the job ends."""
        shown = 0
        for js in self._poll(timeout):
            rows = js["metrics"]
            yield from rows[shown:]
            shown = len(rows)

    __iter__ = stream

    def wait(self, timeout: float | None = None) -> dict[str, Any]:
        """Block until the job is done; returns its final JobSummary.

        Raises :class:`JobFailed` if it failed and ``TimeoutError`` after ``timeout`` seconds.
        """
        final: dict[str, Any] = {}
        for final in self._poll(timeout):  # noqa: B007 - the last summary is the answer
            pass
        return final

    def _poll(self, timeout: float | None) -> Iterator[dict[str, Any]]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                js = self.status()
            except ControlError as exc:  # the job may not have reached this node's runner yet
                if "unknown job" not in str(exc) and "knows no jobs" not in str(exc):
                    raise
                js = {"state": JobState.PENDING, "metrics": []}
            yield js
            if js["state"] == JobState.FAILED:
                raise JobFailed(f"job {self.job_id} failed: {js.get('error') or 'unknown error'}")
            if js["state"] == JobState.DONE:
                return
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {self.job_id} not done after {timeout:.0f}s "
                                   f"(round {js.get('round', 0)}, state {js['state']})")
            time.sleep(self.poll_s)

    def results(self, out: str | os.PathLike[str]) -> list[Path]:
        """Write model.pt, metrics (CSV, JSON, PNG) and the ledger into ``out``."""
        reply = self._call("job_results", {"job": self.job_id, "out": str(Path(out).resolve())}, timeout=120)
        return [Path(f) for f in reply["files"]]

    def state_dict(self, which: str = "final") -> dict[str, Any]:
        """A committed model as a CPU torch ``state_dict``: ``"final"``, the one the job hands
        its user (its ``final_model``: the best-scored round's by default; after ``wait()``);
        ``"best"``, the best-scored round's; ``"last"``, the last round's. The job's results
        hold the final one and, for a classic model, the other one as well (``best/`` or
        ``last/``); one they do not hold raises :class:`ModelUnavailable`, naming its round.

        For a language model: its weights, or under LoRA the adapter's tensors alone (as
        peft names them); ``results(out)`` writes the directories transformers and peft load.
        """
        if which not in ("final", "best", "last"):
            raise ValueError(f"which must be 'final', 'best' or 'last', not {which!r}")
        if which == "final" and self._state is not None and self.status()["state"] in FINISHED:
            return self._state
        with tempfile.TemporaryDirectory(prefix="gpuflex-model-") as tmp:
            self.results(tmp)
            folder = Path(tmp) / model_folder(Path(tmp), which)
            state = load_exported_state(folder)
        if which == "final" and self.status()["state"] in FINISHED:
            self._state = state
        return state
    def best_round(self, metric: str | None = None) -> dict[str, Any]:
        """The metrics row of the committed round with the best held-out ``metric`` ("loss",
        "perplexity": lowest; "accuracy": highest; by default the node's own choice, the round
        of ``state_dict("best")``), to compare with the last round's."""
        return best_round(self.metrics(), metric)

    def baseline(self) -> dict[str, Any]:
        """The job's central baseline: its model trained on all of the training data in this
        process, with the same seed, optimizer, test split and sequential budget (rounds ×
        local epochs or steps), scored on the same test split. What federation costs is the
        gap to the job's rounds: ``{"accuracy", "loss", "train_loss", "steps", "seconds"}``.
        Classic models only; a language model's central counterpart is benchmarks/llm.py's."""
        from gpuflex.home import resolve_home
        from gpuflex.jobspec import JobSpec
        from gpuflex.llmspec import is_llm
        from gpuflex.ml.baseline import central_baseline
        from gpuflex.nodeconfig import load_node_config

        spec = JobSpec.from_dict(self.status()["spec"])
        if is_llm(spec.model):
            raise ModelUnavailable("the SDK's central baseline is for the classic models; for a language "
                                   "model, benchmarks/llm.py trains the central counterpart")
        # The node's node.toml says where named data sets live.
        return central_baseline(spec, config=load_node_config(resolve_home(self.home)))

    def export_mlflow(self, tracking_uri: str, experiment: str = "gpuflex") -> str:
        """Log params, per-round metrics and the final model to MLflow; returns the run id."""
        from gpuflex.tracking import export_mlflow

        with tempfile.TemporaryDirectory(prefix="gpuflex-results-") as tmp:
            self.results(tmp)
            return export_mlflow(tmp, tracking_uri, experiment=experiment)

    def close(self) -> None:
        """Nothing to release for a job on a running node; local meshes override this."""

    def __enter__(self) -> JobHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def model_folder(results: Path, which: str) -> str:
    """Where under ``results`` (what ``job results`` wrote) the ``which`` model is: "" for
    the top level, which holds the job's final model; ``best/`` or ``last/`` for the other."""
    try:
        info = json.loads((results / "job.json").read_text())
    except (OSError, ValueError):
        info = {}
    top = info.get("model_pt", "last") if isinstance(info, dict) else "last"
    if which in ("final", top):
        return ""
    if (results / OTHER_DIRS[which]).is_dir():
        return OTHER_DIRS[which]
    best = info.get("best") if isinstance(info, dict) else None
    if isinstance(best, dict) and best.get("model_hash") == info.get("model_hash"):
        return ""  # the best round is the last one: one model
    raise ModelUnavailable(f"the job's results hold no {which} model (their model.pt is the {top} round's"
                           + (f"; the best is round {best.get('round')})" if isinstance(best, dict) else ")"))


def load_exported_state(folder: Path) -> dict[str, Any]:
    """The tensors of what ``job results`` wrote: model.pt, or a language model's safetensors."""
    if (folder / "model.pt").is_file():
        import torch

        return dict(torch.load(folder / "model.pt", map_location="cpu", weights_only=True))
    for rel in ("model/model.safetensors", "adapter/adapter_model.safetensors"):
        if (folder / rel).is_file():
            from safetensors.torch import load_file

            return dict(load_file(str(folder / rel)))
    raise FileNotFoundError(f"no model in {folder}")


def submit(model_fn: Ref, data_fn: Ref, *, home: str | os.PathLike[str] | None = None,
           train_fn: Ref = None, partitioner: Ref = None, rule: Ref = None, **settings: Any) -> JobHandle:
    """Publish a job through the running node at ``home`` (default: ``$GPUFLEX_HOME``).

    Functions travel by import path, so they must be importable on every node; ``settings``
    are job-file fields (``rounds``, ``lr``, ``local_steps``, ``partition``, ...).
    """
    spec = build_spec(model_fn, data_fn, in_process=False, train_fn=train_fn,
                      partitioner=partitioner, rule=rule, **settings)
    with ControlClient.for_home(home, timeout=30) as client:
        reply = client.submit(spec)
    return JobHandle(str(reply["job_id"]), home)


def submit_file(path: str | os.PathLike[str], *, home: str | os.PathLike[str] | None = None) -> JobHandle:
    """Publish the job file at ``path`` (TOML, or YAML when it ends in .yaml or .yml) through
    the running node at ``home``; validated as ``gpuflex job submit`` validates it."""
    from gpuflex.jobspec import JobSpec

    spec = JobSpec.from_file(Path(path)).to_dict()
    with ControlClient.for_home(home, timeout=30) as client:
        reply = client.submit(spec)
    return JobHandle(str(reply["job_id"]), home)


# --- an in-process mesh -------------------------------------------------------------------------


class LocalCluster:
    """``size`` NodeRuntimes in one trio program on a daemon thread, on 127.0.0.1 only."""

    def __init__(self, base: Path, size: int, metrics: dict[int, str] | None = None,
                 allow_plugins: Sequence[str] = (), data: Mapping[str, str] | None = None) -> None:
        """``allow_plugins`` and ``data`` (name -> local path) are these nodes' configuration,
        as ``--allow-plugin`` and ``--data`` are a started node's."""
        self.base = Path(base)
        self.size = size
        self.metrics = metrics or {}
        self.allow_plugins = tuple(allow_plugins)
        self.data = dict(data or {})
        self.runtimes: list[Any] = []
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._token: Any = None
        self._stop: Any = None
        self._thread: threading.Thread | None = None

    def home(self, i: int) -> Path:
        return self.base / f"node{i}"

    def start(self, timeout: float = 60.0) -> LocalCluster:
        """Start every node and wait until each sees all the others as up."""
        # Pay torch's first-optimizer-step imports here, at normal priority, before any node
        # starts: each node warms torch up on a worker thread as it prepares a job, which in one
        # process holds the import lock and the GIL while every node's event loop and training
        # stall behind it.
        from gpuflex.ml.warmup import warm_up_torch

        warm_up_torch()
        self._thread = threading.Thread(target=self._thread_main, args=(timeout,),
                                        name="gpuflex-local-mesh", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout + 10):
            self.stop()
            raise TimeoutError(f"the local mesh of {self.size} nodes did not start within {timeout:.0f}s")
        if self._error is not None:
            self.stop()
            raise RuntimeError(f"the local mesh did not start: {self._error}") from self._error
        atexit.register(self.stop)
        return self

    def _thread_main(self, timeout: float) -> None:
        import trio

        try:
            trio.run(self._main, timeout)
        except BaseException as exc:  # surfaced to the caller of start()
            self._error = exc
        finally:
            self._ready.set()

    async def _main(self, timeout: float) -> None:
        import trio

        from gpuflex.node.runtime import NodeOptions, NodeRuntime
        from gpuflex.nodeconfig import load_node_config, with_flags
        from mesh.health import HealthConfig

        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()

        def node(i: int, bootstrap: list[str]) -> Any:
            # All nodes share one interpreter, so training threads can hold up every node's
            # pings for seconds at a time: judge health over a longer silence.
            health = HealthConfig(suspect_after_s=10.0, down_after_s=30.0)
            config = with_flags(load_node_config(self.home(i)), allow_plugins=self.allow_plugins,
                                data=[f"{name}={path}" for name, path in self.data.items()])
            return NodeRuntime(NodeOptions(home=self.home(i), listen=["/ip4/127.0.0.1/tcp/0"],
                                           bootstrap=bootstrap, metrics=self.metrics.get(i), health=health,
                                           config=config))

        async with trio.open_nursery() as nursery:
            with trio.fail_after(timeout):
                first = node(0, [])
                await nursery.start(first.serve)
                boot = first.mesh.multiaddrs()[:1]
                self.runtimes = [first, *(node(i, boot) for i in range(1, self.size))]
                for rt in self.runtimes[1:]:
                    await nursery.start(rt.serve)
                while min(len(rt.mesh.peers.alive()) for rt in self.runtimes) < self.size - 1:
                    await trio.sleep(0.1)
            self._ready.set()
            await self._stop.wait()
            for rt in self.runtimes:
                rt.stop()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop every node; safe to call twice and from atexit."""
        import trio

        if self._token is not None and self._stop is not None:
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        if self._thread is not None:
            self._thread.join(timeout)
        atexit.unregister(self.stop)


class LocalJobHandle(JobHandle):
    """A job on an in-process mesh; ``close()`` stops the mesh (the model is kept in memory)."""

    def __init__(self, job_id: str, cluster: LocalCluster, owned_dir: Path | None, refs: list[str]) -> None:
        super().__init__(job_id, cluster.home(0), poll_s=0.2)
        self.cluster = cluster
        self._owned_dir = owned_dir
        self._refs = refs

    def close(self) -> None:
        try:
            if self._state is None and self.status()["state"] == JobState.DONE:
                self.state_dict()
        except ControlError:
            pass
        self.cluster.stop()
        with _local_lock:
            for ref in self._refs:
                if hasattr(LOCAL, ref):
                    delattr(LOCAL, ref)
        if self._owned_dir is not None:
            shutil.rmtree(self._owned_dir, ignore_errors=True)
            self._owned_dir = None


def run_local(model_fn: Ref, data_fn: Ref, *, nodes: int = 3, workdir: str | os.PathLike[str] | None = None,
              train_fn: Ref = None, partitioner: Ref = None, rule: Ref = None, start_timeout: float = 60.0,
              **settings: Any) -> LocalJobHandle:
    """Start ``nodes`` nodes in this process, submit the job to them, and return its handle.

    The mesh runs until ``handle.close()`` (or the ``with`` block ends, or the process exits).
    Node homes go to ``workdir``, or to a temporary folder that ``close()`` removes.
    ``data_path`` says where a built-in data set (``cifar10``, ``shakespeare``) lives on this
    machine; it configures these nodes and is not part of the job.
    """
    settings.setdefault("min_nodes", min(nodes, 2))
    data_path = settings.pop("data_path", "")
    spec = build_spec(model_fn, data_fn, in_process=True, train_fn=train_fn, partitioner=partitioner,
                      rule=rule, **settings)
    if data_path and is_plugin_path(spec["data"]):
        from gpuflex.jobspec import JobSpecError

        raise JobSpecError([("data_path", "is where a built-in data set lives; a data function loads its own")])
    refs = [spec[w].rsplit(".", 1)[1] for w in PLUGIN_FIELDS if spec.get(w, "").startswith(f"{__name__}:LOCAL.")]
    owned = None if workdir is not None else Path(tempfile.mkdtemp(prefix="gpuflex-local-"))
    base = Path(workdir) if workdir is not None else owned
    assert base is not None
    allow = [spec[w] for w in PLUGIN_FIELDS if spec.get(w) and is_plugin_path(spec[w])]
    cluster = LocalCluster(base, nodes, allow_plugins=allow, data={spec["data"]: str(data_path)} if data_path else None)
    try:
        cluster.start(start_timeout)
        with ControlClient.for_home(cluster.home(0), timeout=30) as client:
            job_id = str(client.submit(spec)["job_id"])
    except BaseException:
        cluster.stop()
        if owned is not None:
            shutil.rmtree(owned, ignore_errors=True)
        raise
    return LocalJobHandle(job_id, cluster, owned, refs)


__all__ = ["JobFailed", "JobHandle", "JobState", "LocalCluster", "LocalJobHandle", "ModelUnavailable", "best_round",
           "build_spec", "importable_path", "run_local", "submit", "submit_file"]

"""FedAvg over every SuperNode each round; the new model is evaluated once, on the server,
as a mesh coordinator does; a timestamp after each evaluation marks the round boundary."""

import json
import os
import time
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, Context, MetricRecord, RecordDict
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from .common import to_flat, to_record, workload

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    clients = int(context.run_config["num-clients"])
    out = Path(str(context.run_config["out-path"]))
    evaluator = workload(context.run_config, 0, clients)
    marks: list[dict[str, Any]] = []
    train_stats: list[tuple[list[float], list[float]]] = []

    def train_metrics(contents: list[RecordDict], weight_key: str) -> MetricRecord:
        seconds = [float(c["metrics"]["seconds"]) for c in contents]
        train_stats.append((seconds, [float(c["metrics"]["startup"]) for c in contents]))
        return MetricRecord({"seconds_max": max(seconds), "contributors": len(seconds)})

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        scores = evaluator.evaluate(to_flat(arrays))
        marks.append({"round": server_round, "t": time.time(), **scores,
                      "seconds": train_stats[-1][0] if server_round else [],
                      "startup": train_stats[-1][1] if server_round else []})
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(json.dumps(marks))
        os.replace(tmp, out)
        return MetricRecord(scores)

    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=clients,
                      min_available_nodes=clients, train_metrics_aggr_fn=train_metrics)
    strategy.start(grid=grid, initial_arrays=to_record(evaluator, evaluator.initial_params()),
                   num_rounds=evaluator.spec.rounds, evaluate_fn=evaluate)

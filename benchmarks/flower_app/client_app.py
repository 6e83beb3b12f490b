"""Each message runs in a fresh ClientApp process, so the shuffle seed's round counter is
restored from the server round: the same batches as a mesh node in the same round. The
process's age when training starts (interpreter, imports, data and model) is reported."""

import os
import time
from pathlib import Path

from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from .common import to_flat, to_record, workload

app = ClientApp()


def process_age() -> float:
    ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    return time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")


@app.train()
def train(msg: Message, context: Context) -> Message:
    part, parts = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    work = workload(context.run_config, part, parts)
    work._trained_rounds = int(msg.content["config"]["server-round"]) - 1
    base = to_flat(msg.content["arrays"])
    startup = process_age()
    delta, metrics = work.train(base)
    reply = RecordDict({
        "arrays": to_record(work, base + delta),
        "metrics": MetricRecord({"num-examples": work.num_samples, "seconds": float(metrics["seconds"]),
                                 "train_loss": float(metrics["train_loss"]), "startup": startup}),
    })
    return Message(reply, reply_to=msg)

"""Glue between Flower's records and GPUFlex's flat float32 vectors."""

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord

from gpuflex.jobspec import JobSpec
from gpuflex.ml.workload import Workload


def workload(run_config: Mapping[str, Any], part: int, parts: int) -> Workload:
    spec = JobSpec.from_dict(json.loads(Path(str(run_config["spec-path"])).read_text()))
    return Workload(spec, part, parts)


def to_flat(record: ArrayRecord) -> np.ndarray:
    return np.concatenate([a.reshape(-1) for a in record.to_numpy_ndarrays()]).astype(np.float32)


def to_record(work: Workload, flat: np.ndarray) -> ArrayRecord:
    return ArrayRecord(work.state_dict(flat))

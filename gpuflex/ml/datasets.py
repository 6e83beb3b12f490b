"""Built-in data sets and the data plug-in contract, all ending in one :class:`DataBundle`.

Every node of a job must agree on the held-out test split without talking, so the split is a
pure function of (data, test_fraction, seed). Nothing is downloaded: the sklearn sets ship
with scikit-learn, CIFAR-10 and Shakespeare are read from the path that the node's operator
configured for them (node.toml ``[data]``), never from a path in a job. Nothing is unpickled:
CIFAR's python batches go through :mod:`gpuflex.ml.pybatch`.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence, Sized
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

from gpuflex.errors import GpuflexError
from gpuflex.jobspec import JobSpec
from gpuflex.ml.pybatch import BatchFormatError, read_batch
from gpuflex.plugins import PluginError, call_with_accepted, is_plugin_path, load_callable


class DataError(GpuflexError, ValueError):
    """The data on disk is missing or not in the expected format."""


@dataclass
class DataBundle:
    """What training needs to know about a data set, beyond the samples themselves.

    ``train_labels`` drives label-skewed partitioning; ``groups`` (one id per training
    sample, e.g. the speaking role) drives natural partitioning. Data plug-ins may return one.
    """

    train: Dataset
    test: Dataset
    num_classes: int
    input_shape: tuple[int, ...]
    train_labels: np.ndarray | None = None
    groups: np.ndarray | None = None
    group_names: Sequence[str] = ()

    def __post_init__(self) -> None:
        if self.train_labels is None:
            self.train_labels = labels_of(self.train)


def labels_of(dataset: Dataset) -> np.ndarray:
    """Integer labels of a dataset of (x, y) pairs; fast for TensorDataset, generic otherwise."""
    if isinstance(dataset, TensorDataset) and len(dataset.tensors) >= 2:
        return dataset.tensors[1].cpu().numpy().astype(np.int64)
    return np.asarray([int(dataset[i][1]) for i in range(len(cast(Sized, dataset)))], dtype=np.int64)


def split_indices(
    labels: np.ndarray, test_fraction: float, seed: int, *, stratify: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Seeded train/test split; stratified per class so a small test set covers every label."""
    rng = np.random.default_rng([seed, 7919])
    if not stratify:
        order = rng.permutation(len(labels))
        n_test = max(1, round(len(labels) * test_fraction))
        return np.sort(order[n_test:]), np.sort(order[:n_test])
    train, test = [], []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        n_test = round(len(idx) * test_fraction)
        test.append(idx[:n_test])
        train.append(idx[n_test:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def _tensors(x: np.ndarray, y: np.ndarray) -> TensorDataset:
    return TensorDataset(torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(y.astype(np.int64)))


def _tabular(x: np.ndarray, y: np.ndarray, spec: JobSpec, *, standardise: bool) -> DataBundle:
    y = y.astype(np.int64)
    tr, te = split_indices(y, spec.test_fraction, spec.seed, stratify=True)
    x = x.astype(np.float32)
    if standardise:  # statistics from the training split only, so the test set stays unseen
        mean, std = x[tr].mean(axis=0), x[tr].std(axis=0)
        x = (x - mean) / np.where(std > 0, std, 1.0)
    x = x.astype(np.float32)
    return DataBundle(
        _tensors(x[tr], y[tr]), _tensors(x[te], y[te]), int(y.max()) + 1, tuple(x.shape[1:]), y[tr]
    )


def load_sklearn_digits(spec: JobSpec) -> DataBundle:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.data / 16.0).reshape(-1, 1, 8, 8)
    return _tabular(x, d.target, spec, standardise=False)


def load_sklearn_breast_cancer(spec: JobSpec) -> DataBundle:
    from sklearn.datasets import load_breast_cancer

    d = load_breast_cancer()
    return _tabular(d.data, d.target, spec, standardise=True)


# --- CIFAR-10 ------------------------------------------------------------------------------

CIFAR_MEAN = np.array([0.4914, 0.4822, 0.4465], dtype=np.float32).reshape(1, 3, 1, 1)
CIFAR_STD = np.array([0.2470, 0.2435, 0.2616], dtype=np.float32).reshape(1, 3, 1, 1)


def _read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        batch = read_batch(path)
        data, labels_list = batch[b"data"], batch[b"labels"]
        if not isinstance(data, np.ndarray) or data.dtype != np.uint8:
            raise BatchFormatError("b'data' is not a uint8 array")
        if not isinstance(labels_list, list) or not all(
                isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 10 for v in labels_list):
            raise BatchFormatError("b'labels' is not a list of class numbers 0 to 9")
        labels = np.asarray(labels_list, dtype=np.int64)
    except (OSError, BatchFormatError, KeyError) as exc:
        raise DataError(
            f"{path} is not a CIFAR-10 python batch (a pickled dict with b'data' and b'labels'): {exc}"
        ) from None
    if data.ndim != 2 or data.shape[1] != 3072 or len(labels) != len(data):
        raise DataError(f"{path}: expected data of shape N×3072 and N labels, got {data.shape}")
    x = data.reshape(-1, 3, 32, 32).astype(np.float32) / 255.0
    return (x - CIFAR_MEAN) / CIFAR_STD, labels


def load_cifar10(spec: JobSpec, data_path: str) -> DataBundle:
    """The standard ``cifar-10-batches-py`` folder. Its own test_batch is the test split, as
    every CIFAR paper uses it, so test_fraction does not apply."""
    root = Path(data_path).expanduser()
    train_files = sorted(root.glob("data_batch_*"))
    if not train_files or not (root / "test_batch").is_file():
        raise DataError(
            f"{root} is not a CIFAR-10 python-batches folder: expected data_batch_1..5 and test_batch"
        )
    parts = [_read_cifar_batch(p) for p in train_files]
    x = np.concatenate([p[0] for p in parts]).astype(np.float32)
    y = np.concatenate([p[1] for p in parts])
    xt, yt = _read_cifar_batch(root / "test_batch")
    return DataBundle(_tensors(x, y), _tensors(xt.astype(np.float32), yt), 10, (3, 32, 32), y)


# --- Shakespeare ---------------------------------------------------------------------------

SEQ_LEN = 80
# Non-overlapping windows: LEAF slides by one character, which gives ~1M samples, far more
# than a CPU can train on per round; one window per 80 characters keeps ~14k.
SEQ_STRIDE = 80
# Fixed, file-independent vocabulary so every node maps characters identically. Index 0 is
# "unknown", for the odd character outside printable ASCII.
VOCAB = "\x00" + "".join(sorted(set(string.printable) - set("\t\r\x0b\x0c")))
_CHAR_INDEX = {c: i for i, c in enumerate(VOCAB)}
_ROLE_RE = re.compile(r"^[A-Za-z][A-Za-z '.,&-]{0,40}:$")


def split_roles(text: str) -> dict[str, str]:
    """Text spoken by each role. A line ``Name:`` after a blank line opens a turn, as in the
    tinyshakespeare layout; lines before the first turn are ignored."""
    roles: dict[str, list[str]] = {}
    current: list[str] | None = None
    previous_blank = True
    for raw in text.splitlines():
        line = raw.rstrip()
        if previous_blank and _ROLE_RE.match(line):
            current = roles.setdefault(line[:-1].strip(), [])
        elif line and current is not None:
            current.append(line)
        previous_blank = not line
    return {name: "\n".join(lines) + "\n" for name, lines in roles.items() if lines}


def encode_text(text: str) -> np.ndarray:
    return np.fromiter((_CHAR_INDEX.get(c, 0) for c in text), dtype=np.int64, count=len(text))


def load_shakespeare(spec: JobSpec, data_path: str) -> DataBundle:
    """Next-character prediction, one sample per 80-character window, grouped by role."""
    path = Path(data_path).expanduser()
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise DataError(f"cannot read Shakespeare text {path}: {exc}") from None
    roles = split_roles(text)
    names = sorted(roles)
    xs, ys, gs = [], [], []
    for gid, name in enumerate(names):
        codes = encode_text(roles[name])
        starts = np.arange(0, len(codes) - SEQ_LEN, SEQ_STRIDE)
        if len(starts) == 0:
            continue
        xs.append(np.stack([codes[s : s + SEQ_LEN] for s in starts]))
        ys.append(codes[starts + SEQ_LEN])
        gs.append(np.full(len(starts), gid, dtype=np.int64))
    if not xs:
        raise DataError(
            f"{path} holds no role turns of at least {SEQ_LEN + 1} characters "
            "(expected 'Name:' lines opening each speaker's turn)"
        )
    x, y, g = np.concatenate(xs), np.concatenate(ys), np.concatenate(gs)
    tr, te = split_indices(y, spec.test_fraction, spec.seed, stratify=False)
    return DataBundle(
        _tensors(x[tr], y[tr]), _tensors(x[te], y[te]), len(VOCAB), (SEQ_LEN,), y[tr], g[tr], names
    )


# --- dispatch ------------------------------------------------------------------------------


def _from_plugin(spec: JobSpec, data_path: str) -> DataBundle:
    """A data plug-in is code its node's operator allowed, and finds that operator's data
    itself; ``data_path`` is "" (a job carries no path), kept for plug-ins that ask for it."""
    fn = load_callable(spec.data, "data")
    result: Any = call_with_accepted(
        fn, "data", data_path=data_path, seed=spec.seed, test_fraction=spec.test_fraction
    )
    if isinstance(result, DataBundle):
        return result
    if (
        not isinstance(result, tuple)
        or len(result) != 2
        or not all(isinstance(d, Dataset) for d in result)
    ):
        raise PluginError(
            f"data {spec.data!r} returned {type(result).__name__}, expected "
            "(train_dataset, test_dataset) torch Datasets or a DataBundle"
        )
    train, test = result
    if len(train) == 0:
        raise PluginError(f"data {spec.data!r} returned an empty training dataset")
    labels = labels_of(train)
    num_classes = int(max(labels.max(), labels_of(test).max() if len(test) else 0)) + 1
    shape = tuple(torch.as_tensor(train[0][0]).shape)
    return DataBundle(train, test, num_classes, shape, labels)


def load_data(spec: JobSpec, data_path: str = "") -> DataBundle:
    """Load the job's data from ``data_path``, the node's own location for the data set
    (``gpuflex.ml.workload.resolve_data_path``); the sklearn sets need none."""
    path = data_path
    if is_plugin_path(spec.data):
        return _from_plugin(spec, path)
    if spec.data == "sklearn-digits":
        return load_sklearn_digits(spec)
    if spec.data == "sklearn-breast-cancer":
        return load_sklearn_breast_cancer(spec)
    if not path:
        raise DataError(f"data {spec.data!r} is not on this node: set [data] {spec.data} = \"PATH\" in node.toml "
                        f"or start it with --data {spec.data}=PATH")
    if spec.data == "cifar10":
        return load_cifar10(spec, path)
    if spec.data == "shakespeare":
        return load_shakespeare(spec, path)
    raise DataError(f"unknown built-in data {spec.data!r}")

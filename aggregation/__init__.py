"""Pure-numpy aggregation for GPUFlex: averaging, robust rules, tree plans, codecs.

Nothing here does I/O or imports torch, trio, libp2p or the other GPUFlex
layers, so every function can be tested with numpy alone and called from
any node role. All functions take flat float32 vectors (any same-shape
arrays work) and raise AggregationError for bad input.
"""

from aggregation.compression import (
    Codec,
    EncodedDelta,
    ErrorFeedback,
    decode_delta,
    make_codec,
)
from aggregation.dp import add_gaussian_noise, clip_to_norm
from aggregation.errors import AggregationError
from aggregation.robust import (
    centered_clipping,
    coordinate_median,
    krum,
    krum_select,
    make_rule,
    multi_krum,
    norm_bound,
    trimmed_mean,
)
from aggregation.server_opt import (
    DiLoCo,
    FedAdam,
    FedAvg,
    FedAvgM,
    ServerOptimizer,
    make_server_optimizer,
)
from aggregation.tree import build_tree, children, depth, hierarchical_mean, leaders
from aggregation.weighted import WeightedAccumulator, weighted_mean

__all__ = [
    "AggregationError",
    "Codec",
    "DiLoCo",
    "EncodedDelta",
    "ErrorFeedback",
    "FedAdam",
    "FedAvg",
    "FedAvgM",
    "ServerOptimizer",
    "WeightedAccumulator",
    "add_gaussian_noise",
    "build_tree",
    "centered_clipping",
    "children",
    "clip_to_norm",
    "coordinate_median",
    "decode_delta",
    "depth",
    "hierarchical_mean",
    "krum",
    "krum_select",
    "leaders",
    "make_codec",
    "make_rule",
    "make_server_optimizer",
    "multi_krum",
    "norm_bound",
    "trimmed_mean",
    "weighted_mean",
]

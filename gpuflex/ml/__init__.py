"""Torch training for GPUFlex: built-in models and data, partitioning, local training.

The node talks to this package through :class:`gpuflex.ml.workload.Workload` only, and only
in flat float32 numpy vectors, so the mesh and the aggregation layer never see torch.
"""

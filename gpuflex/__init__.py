"""GPUFlex: the node, the CLI, jobs and torch training on top of the mesh."""

__version__ = "0.1.0"

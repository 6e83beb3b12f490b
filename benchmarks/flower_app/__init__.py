"""The Flower app of ``benchmarks.vs_flower``: a ServerApp and a ClientApp around this
repository's own training code (``gpuflex.ml.workload.Workload``), so that both sides of the
comparison partition, train and evaluate with the very same code.

It runs in Flower's venv, not this one: ``vs_flower.write_app`` copies this folder into a
temporary app directory as the package ``gpuflex_flower_app``, beside ``app.toml`` written as
its ``pyproject.toml``, and ``flwr run`` starts it there. Its modules import each other
relatively so that they read the same under either name.
"""

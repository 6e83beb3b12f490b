"""Support for tests and benchmarks that run the product's own code: the mesh simulator
(``sim``), and real network namespaces: a pair joined by one veth (``netns``) and a small
internet of homes behind NAT routers (``nat``). Benchmarks take what they share with the tests
from here, never from ``tests/``.
"""

"""Test and benchmark support that ships with the mesh: a modelled network (``simnet``) on
which the mesh's own code runs many nodes in one process under ``trio.testing.MockClock``."""

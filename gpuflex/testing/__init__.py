"""Support for tests and benchmarks that run the product's own code: the mesh simulator."""

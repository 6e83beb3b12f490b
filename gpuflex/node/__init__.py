"""The GPUFlex node process: mesh, jobs, rounds and the local control API."""

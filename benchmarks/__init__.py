"""Real measurements of GPUFlex components; run as scripts, never part of the test run."""

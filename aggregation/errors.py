"""The one exception type of the aggregation layer.

It subclasses ValueError because every failure here is a bad argument (a
malformed update, a wrong hyper-parameter, a garbled payload): callers that
already treat ValueError as "drop this input and carry on" keep working, and
callers that want to tell aggregation problems apart can catch this class.
"""

from __future__ import annotations


class AggregationError(ValueError):
    """Raised for any invalid input to an aggregation function."""

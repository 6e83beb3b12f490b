"""A plug-in module as an operator's lab might have: it imports ``os``, and one of its models
kills the process that builds it (as a buggy extension or a hostile plug-in could)."""

from __future__ import annotations

import os
from typing import Any


def aborting_model(num_classes: int, input_shape: tuple[int, ...]) -> Any:
    os.abort()

"""What Python 3.10 lacks and the layers above use: ``StrEnum`` (3.11)."""

from __future__ import annotations

import sys
from enum import Enum

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - exercised on Python 3.10 only

    class StrEnum(str, Enum):
        """A str whose members print as their value, like 3.11's ``enum.StrEnum``."""

        def __str__(self) -> str:
            return str(self.value)


__all__ = ["StrEnum"]

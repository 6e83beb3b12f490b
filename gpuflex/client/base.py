"""What the asyncio and trio adapters hold alike: where the node is, how long a request may
take, and the delays between attempts to subscribe again."""

from __future__ import annotations

import os
from typing import Any, TypeVar

from gpuflex.client.core import EndpointLike, Target
from gpuflex.client.files import locate
from gpuflex.home import resolve_home

C = TypeVar("C", bound="ControlBase")


class ControlBase:
    def __init__(self, endpoint: EndpointLike, timeout: float, retry_delays: tuple[float, ...], label: str) -> None:
        self._target = Target(endpoint, label)
        self.timeout = timeout
        self.retry_delays = retry_delays

    @classmethod
    def for_home(cls: type[C], home: str | os.PathLike[str] | None = None, **kwargs: Any) -> C:
        """The node of ``home``, found afresh (control.json) on every reconnect."""
        kwargs.setdefault("label", f"the node of {resolve_home(home)}")
        return cls(lambda: locate(home), **kwargs)

    def describe(self) -> str:
        """Where the data comes from, for a banner ("127.0.0.1:43121")."""
        return self._target.describe()

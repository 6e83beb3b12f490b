"""The leader's dropout-recovery round trip under secure aggregation: ask every survivor for
the shares it holds of the dangling seeds, all at once and bounded in time, and fold in each
answer that checks out (``gpuflex.node.core.secure`` checks, keeps the books, and does no I/O).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

from aggregation import secagg
from gpuflex.node.core.secure import SecAggReducer, accept_answer, recovery_frames
from gpuflex.node.core.workfields import WireValue
from mesh.identity import Identity


async def collect_answers(identity: Identity, red: SecAggReducer,
                          request: Callable[[str, bytes], Awaitable[WireValue]],
                          timeout: float) -> dict[str, Exception]:
    """The leader's round trip: every survivor gets its request at once, and each answer that
    checks out is folded into ``red``. Bounded by ``timeout``; returns, per survivor that gave
    no usable answer, why (a WireError means the answer itself was bad)."""
    try:
        frames = recovery_frames(identity, red)
    except ValueError as exc:  # a request over its size limit: the group is far too large
        raise secagg.SecAggError(str(exc)) from None
    problems: dict[str, Exception] = {}

    async def ask(holder: str, frame: bytes) -> None:
        try:
            accept_answer(red, holder, await request(holder, frame), frame)
        except Exception as exc:  # any failure of one survivor only counts against the threshold
            problems[holder] = exc

    with trio.move_on_after(timeout):
        async with trio.open_nursery() as nursery:
            for holder, frame in frames.items():
                nursery.start_soon(ask, holder, frame)
    for holder in frames.keys() - problems.keys() - red.answered:
        problems[holder] = TimeoutError(f"no answer within {timeout:.0f}s")
    return problems

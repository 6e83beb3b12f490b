"""Plans for the round after the one a node is still applying: held, then taken up.

A member that is still applying round r's result (downloading its model, say) when round
r+1's plan arrives cannot check that plan yet: it must extend a ledger the member does not
hold. Gossip delivers a plan once, so refusing it left the member out of round r+1 and held
the round's root until the training deadline (16 minutes in one loaded run). The plan is
held instead, in the job's nursery, until the ledger catches up or the plan's training
deadline passes, a bounded number at a time, and then checked as if it had just arrived.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from gpuflex.errors import GpuflexError
from gpuflex.node.core.messages import Plan
from gpuflex.node.policy import IncidentPolicy
from gpuflex.node.state import JobBook, RoundDeadlines
from mesh.codec import WireError
from mesh.messaging import Inbound, Rejected

log = logging.getLogger("gpuflex.rounds")

#: Plans held at once: a round sees a few attempts in a short time; each is a signed frame.
MAX_PLANS_AHEAD = 4


class PlanAhead(Rejected, GpuflexError):
    """A plan for the round after the one this node is still applying (not refused: held). A
    ``Rejected`` to the mesh, which then logs it without a penalty."""

    def __init__(self, plan: Plan, until: float) -> None:
        super().__init__(f"plan for round {plan.round} held: round {plan.round - 1} is still being applied here")
        self.plan, self.until = plan, until


class PlansAhead:
    """Holds ``PlanAhead`` plans until their round can be checked, then accepts them."""

    def __init__(self, book: JobBook, incidents: IncidentPolicy,
                 accept: Callable[[Inbound], Awaitable[tuple[Plan, RoundDeadlines]]],
                 start_roles: Callable[[Plan, RoundDeadlines], None]) -> None:
        self.book, self.incidents, self._accept, self._start_roles = book, incidents, accept, start_roles
        self._held: set[bytes] = set()  # the held plans' message ids

    def hold(self, msg: Inbound, ahead: PlanAhead) -> None:
        key = msg.envelope.msg_id
        if key in self._held or len(self._held) >= MAX_PLANS_AHEAD:
            log.info("job %s: plan for round %d from %s not held (%d held already)", self.book.job_id,
                     ahead.plan.round, ahead.plan.coordinator[-8:], len(self._held))
            return
        self._held.add(key)
        self.book.tasks.start_soon(self._take_up, msg, ahead)

    async def _take_up(self, msg: Inbound, ahead: PlanAhead) -> None:
        book, plan = self.book, ahead.plan
        try:
            await book.changed.wait_for(lambda: book.committed >= plan.round - 1, ahead.until)
            if book.committed < plan.round - 1:
                log.info("job %s: held plan for round %d dropped: round %d was not applied by its deadline",
                         book.job_id, plan.round, plan.round - 1)
                return
            plan, deadlines = await self._accept(msg)
        except Rejected as exc:
            log.info("job %s: held plan for round %d not taken: %s", book.job_id, plan.round, exc)
            return
        except WireError as exc:
            self.incidents.rejected(plan.coordinator, plan.round, f"held plan for round {plan.round}: {exc}")
            return
        finally:
            self._held.discard(msg.envelope.msg_id)
        self._start_roles(plan, deadlines)

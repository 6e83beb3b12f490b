"""Whether this node takes on a job that arrives: the operator's policy, and its memory.

Every job frame passes here before it is adopted (from gossip, a direct message, catch-up sync,
or the node's own disk at start). ``gpuflex.jobpolicy`` decides; this module remembers the
refusals by job id. A refused job keeps coming back (relays, the presence of the peers that
run it, their sync replies), and each time it costs nothing: no second validation, no second
log line, and no catch-up sync started for a job this node does not want. A job refused only
for a cap is forgotten after ``CAP_RETRY_S``, so it is taken on once other jobs finish and a
peer offers it again.

Refused jobs are not saved, and a saved job (written before its plug-in was disallowed, or by
an older version) is judged again at start and refused the same way; its file is left for the
operator, so allowing the plug-in later resumes it. A saved plug-in job whose code was running
when the node last stopped without shutting down (``crashmark``) is refused at start the same
way, until the operator deletes its marker.

A refusal that only a hostile or careless publisher earns (an invalid spec, a plug-in this
node does not allow, more jobs than its caps) also penalises the publisher (the signer, not
the peer that relayed the frame), once per job; a job for data this node does not hold, or
from a publisher it does not accept, is ordinary in an open mesh and costs nothing.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping

import trio

from gpuflex.jobpolicy import JobPolicy, Refusal, RefusalKind
from gpuflex.jobspec import JobSpec
from gpuflex.node.core.kinds import EventKind
from gpuflex.node.events import EventLog
from gpuflex.safetext import printable

log = logging.getLogger("gpuflex.jobs")
#: Refused job ids remembered; the oldest is forgotten first (and judged again if it returns).
REFUSED_MEMORY = 4096
#: A job refused for a cap may be offered again after this long.
CAP_RETRY_S = 60.0
#: Penalty points (mesh.health) per refusal, by why; the ignore threshold is 10, and points
#: decay at 0.05 a second.
PENALTY: dict[RefusalKind, float] = {RefusalKind.SPEC: 1.0, RefusalKind.PLUGIN: 1.0, RefusalKind.CAP: 1.0,
                                     RefusalKind.DATA: 0.0, RefusalKind.PUBLISHER: 0.0, RefusalKind.SIZE: 0.0,
                                     RefusalKind.CRASHED: 0.0}


class Admission:
    def __init__(self, policy: JobPolicy, events: EventLog,
                 penalise: Callable[[str, float], float] | None = None) -> None:
        """``penalise(peer, points)`` scores a fault and returns the peer's penalty."""
        self.policy, self.events, self._penalise = policy, events, penalise
        self._refused: OrderedDict[str, tuple[Refusal, float]] = OrderedDict()  # job -> (why, until)
        self._reported: set[str] = set()

    def refused(self, job_id: str) -> Refusal | None:
        """Why ``job_id`` was refused, while that still holds."""
        entry = self._refused.get(job_id)
        if entry is None:
            return None
        if trio.current_time() >= entry[1]:
            del self._refused[job_id]
            return None
        return entry[0]

    def judge(self, job_id: str, spec: JobSpec, publisher: str,
              unfinished: Mapping[str, int] | None) -> Refusal | None:
        """Apply the policy to a valid spec; a refusal is remembered and reported once.
        ``unfinished`` (jobs per publisher) is None for a job resumed from disk: caps bound
        what arrives, and a restart adds nothing."""
        refusal = self.policy.refusal(spec, publisher, unfinished)
        if refusal is not None:
            self.refuse(job_id, refusal, publisher, spec.name, penalise=unfinished is not None)
        return refusal

    def refuse(self, job_id: str, refusal: Refusal, publisher: str, name: str = "", *,
               penalise: bool = True) -> None:
        """Remember and report a refusal; ``penalise``: the publisher sent it (not this node's
        own disk at start)."""
        until = trio.current_time() + CAP_RETRY_S if refusal.transient else math.inf
        self._refused[job_id] = (refusal, until)
        self._refused.move_to_end(job_id)
        while len(self._refused) > REFUSED_MEMORY:
            old, _ = self._refused.popitem(last=False)
            self._reported.discard(old)
        if job_id in self._reported:
            log.debug("job %s refused again: %s", job_id, refusal)
            return
        self._reported.add(job_id)
        label = f" ({printable(name, 60)})" if name else ""
        points = PENALTY[refusal.kind] if penalise and publisher != self.policy.own_id else 0.0
        scored = ""
        if points and self._penalise is not None:
            scored = f"; penalty now {self._penalise(publisher, points):.1f}"
        self.events.emit(EventKind.JOB_REFUSED, job=job_id, peer=publisher, reason=str(refusal.kind), message=(
            f"job {job_id}{label} from …{publisher[-8:]} not taken on: {refusal}{scored}"))

    def refuse_invalid(self, job_id: str, publisher: str, problem: str, *, penalise: bool = True) -> None:
        self.refuse(job_id, Refusal(RefusalKind.SPEC, f"invalid spec: {printable(problem, 300)}"), publisher,
                    penalise=penalise)

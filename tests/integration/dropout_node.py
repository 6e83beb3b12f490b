"""A ``gpuflex`` node process whose members drop out right after masking (test meshes only).

The secure-aggregation dropout tests need a member that dies after its partners' masks
already include it and before its update is sent, a point no outside kill can hit reliably.
This harness installs that fault through ``gpuflex.node.faults`` and then runs the ordinary
CLI, so the product itself carries no trace of it:

    python -m tests.integration.dropout_node node start --home ...   (with DROP_ENV set)

``DROP_ENV`` is "ROUND:POS[,POS...]": the masking members at those positions of their
sorted group exit with SIGKILL in attempt 0 of that round.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from dataclasses import dataclass

from gpuflex.node.core.secure import GroupContext
from gpuflex.node.faults import NoFaults, install

DROP_ENV = "GPUFLEX_TEST_SECAGG_DROP"
log = logging.getLogger("tests.dropout")


@dataclass(frozen=True)
class ScriptedDropout(NoFaults):
    round: int
    positions: frozenset[int]

    @classmethod
    def parse(cls, raw: str) -> ScriptedDropout:
        round_text, _, positions = raw.partition(":")
        return cls(int(round_text), frozenset(int(p) for p in positions.split(",") if p.strip()))

    def drops(self, ctx: GroupContext, me: str) -> bool:
        return (ctx.attempt == 0 and ctx.round == self.round and me in ctx.group
                and ctx.group.index(me) in self.positions)

    def after_masking(self, ctx: GroupContext, me: str) -> None:
        if self.drops(ctx, me):
            log.warning("round %d: test mesh: exiting right after masking, before the update is sent", ctx.round)
            logging.shutdown()
            os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    install(ScriptedDropout.parse(os.environ[DROP_ENV]))
    from gpuflex.cli.main import run

    sys.argv[0] = "gpuflex"
    run()


if __name__ == "__main__":
    main()

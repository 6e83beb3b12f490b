"""The typed states and kinds of a job on a node: what the control API and the events show.

Each is a ``StrEnum``, so it travels as its plain string (JSON, the dashboard, logs) while the
code names every value it may take; no event kind is ever built from strings at run time.
"""

from __future__ import annotations

from mesh.compat import StrEnum


class JobState(StrEnum):
    """A job's life on one node."""

    PENDING = "pending"  # received; data and model being prepared
    RUNNING = "running"
    DONE = "done"  # every round committed (or the privacy budget stopped it)
    FAILED = "failed"  # a local error; ``error`` says which


class Phase(StrEnum):
    """Where this node is within the current round."""

    IDLE = "idle"
    PLAN = "plan"  # waiting for (or making) the round's plan
    TRAIN = "train"
    REDUCE = "reduce"  # the update is sent, or this node folds its group's
    COMMIT = "commit"  # the root applies the server step
    DONE = "done"


class Role(StrEnum):
    """This node's place in the current round's group tree."""

    IDLE = "idle"  # not in the plan
    MEMBER = "member"
    LEADER = "leader"
    ROOT = "root"


class EventKind(StrEnum):
    """Every event a node's jobs report (the ``type`` of an event; see docs/control-api.md)."""

    JOB_RECEIVED = "job_received"
    JOB_REFUSED = "job_refused"  # a job this node will not run (its policy); not adopted, not saved
    JOB_DONE = "job_done"
    JOB_FAILED = "job_failed"
    PRIVACY_BUDGET = "privacy_budget"
    STATE_CORRUPT = "state_corrupt"
    STATE_WRITE_FAILED = "state_write_failed"
    STATE_WRITE_RECOVERED = "state_write_recovered"
    ROUND_WAITING = "round_waiting"
    QUORUM_RESTORED = "quorum_restored"
    ROUND_RETRIED = "round_retried"
    ROUND_ABORTED = "round_aborted"
    ROUND_COMMITTED = "round_committed"
    COMMIT_FAILED = "commit_failed"
    PLAN_RECEIVED = "plan_received"
    TRAINED = "trained"
    DEVICE_FITTED = "device_fitted"
    OUT_OF_MEMORY = "out_of_memory"
    UPDATE_SENT = "update_sent"
    UPDATE_FAILED = "update_failed"
    UPDATE_RECEIVED = "update_received"
    PARTIAL_SENT = "partial_sent"
    PARTIAL_FAILED = "partial_failed"
    PARTIAL_VERIFIED = "partial_verified"
    RESEND = "resend"
    SEND_RETRIED = "send_retried"  # one ancestor did not take this node's work; the next is tried
    LEADER_DOWN = "leader_down"
    WORK_TAKEN_ABOVE = "work_taken_above"
    REDUCE_EMPTY = "reduce_empty"
    WORK_DROPPED = "work_dropped"  # this node's update or partial is not sent: its plan is no longer in force
    SECAGG_RECOVERED = "secagg_recovered"
    SECAGG_RECOVERY_FAILED = "secagg_recovery_failed"
    SECAGG_ANSWERED = "secagg_answered"
    SECAGG_REFUSED = "secagg_refused"
    REJECTED = "rejected"
    LEDGER_FORK_RESOLVED = "ledger_fork_resolved"
    LEDGER_SYNCED = "ledger_synced"
    LEDGER_FORK_KEPT = "ledger_fork_kept"

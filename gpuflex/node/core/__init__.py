"""The node's core: the round's values and rules with no trio in them (an import-linter
contract keeps it so). Signed messages parsed into typed values (``messages``, ``workfields``),
the model blob, typed kinds, who coordinates (``ranking``), what makes a round count
(``evidence``), the ledger chain, the aggregation pipeline and secure aggregation's books, the
group tree (``placement``), a time-budgeted round's work (``workplan``) and which committed
model a job hands its user (``selection``). No network I/O and no waiting: the layers above
move the bytes and keep the time; ``ledger`` and ``pipeline`` write their own files.
"""

"""The round protocol's roles, one module each (docs/architecture.md, "One round").

- ``coordinator``: obtain the round's plan, making it when this node ranks first.
- ``member``: train, send the update up the tree, send it again if its receiver dies.
- ``leader``: verify and fold the group's updates and partials, send the partial up.
- ``root``: apply the server step and sign the round's result (or abort the attempt).
- ``apply``: verify a result or a peer's ledger, append or adopt it, hold its model.

Each role is an object with explicit inputs (the job's state and its ``JobPort``) and holds no
pointer to whatever drives it; the roles never import each other. ``gpuflex.node.driver``
sequences them.
"""

"""Paying torch's first-optimizer-step cost before a round's deadline starts counting.

The first ``optimizer.step()`` in a process imports torch's compiler stack: seconds of CPU.
The device probe (``gpuflex.ml.fit``) runs forward and backward passes only, so without this
the first round's training paid it inside its deadline. A node pays it while it prepares a job
(``gpuflex.node.prepare.load_trainer``), not when it starts: a node that never takes a job on
never pays it (a dozen idle nodes spent 40 CPU seconds on it).
"""

from __future__ import annotations


def warm_up_torch() -> None:
    """One optimizer step on a four-element tensor: the imports, and nothing else."""
    import torch

    param = torch.zeros(4, requires_grad=True)
    opt = torch.optim.SGD([param], lr=0.1, momentum=0.9)
    param.sum().backward()
    opt.step()

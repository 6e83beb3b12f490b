"""A node told to stop exits, with LAN discovery (mDNS) running: a real node process in a
network namespace of the test's, listening on a LAN address, so that it announces itself
over mDNS as a volunteer's machine does.

py-libp2p's mDNS spawns a cleanup loop as a trio system task and cancels it in ``stop()``;
the node ran ``stop()`` in a worker thread, where that cancel never woke the loop, and every
node with mDNS on outlived its stop until it was killed."""

from __future__ import annotations

import pytest

from gpuflex.testing.netns import NetnsPair
from tests.integration.conftest import load_factor

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_a_node_announcing_itself_over_mdns_exits_when_told_to_stop(netns_pair: NetnsPair, mesh_factory) -> None:
    mesh = mesh_factory(1, placement=lambda i: netns_pair.a.placement())
    mesh.start(timeout=120)
    mesh.wait_until(lambda: "LAN discovery (mDNS) announces" in mesh.log_path(0).read_text(errors="replace"),
                    30 * load_factor(), what="mDNS announcing the node")
    mesh.call(0, "shutdown")
    assert mesh.procs[0].wait(timeout=30 * load_factor()) == 0
    assert "Traceback" not in mesh.log_path(0).read_text(errors="replace")

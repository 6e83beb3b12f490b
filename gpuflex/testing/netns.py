"""Two network namespaces joined by one veth pair, for tests that cut the network between nodes.

Nodes on one side talk to each other through their namespace's own address, and to the other
side over the veth, so taking the veth down splits the mesh in two while each side stays whole.
Only the calling test's namespaces are touched; the names carry the pid, and ``close()`` always
deletes them (the veth goes with them).
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

from gpuflex.errors import GpuflexError
from gpuflex.localmesh import Placement

CLONE_NEWNET = 0x40000000
_serial = itertools.count()


class NetnsUnavailable(GpuflexError, RuntimeError):
    """This machine cannot create network namespaces for the caller (not root, or no ``ip``)."""


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if proc.returncode != 0:
        raise NetnsUnavailable(f"ip {' '.join(args)}: {proc.stderr.strip() or proc.returncode}")


def ensure_tool(binary: str, package: str) -> None:
    """``binary`` on PATH, installed from Debian's ``package`` if this is root and it is
    missing (CI runs as root: a test that can set itself up must not skip); else why not."""
    if shutil.which(binary):
        return
    if os.geteuid() != 0:
        raise NetnsUnavailable(f"{binary} is not installed and installing it needs root")
    if shutil.which("apt-get") is None:
        raise NetnsUnavailable(f"{binary} is not installed and there is no apt-get to install {package}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    lock = ["-o", "DPkg::Lock::Timeout=300"]
    for cmd in (["apt-get", *lock, "update", "-qq"], ["apt-get", *lock, "install", "-y", "-qq", package]):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
        if proc.returncode != 0:
            raise NetnsUnavailable(f"could not install {package}: {proc.stderr.strip()[-300:]}")
    if not shutil.which(binary):
        raise NetnsUnavailable(f"{package} installed but {binary} is not on PATH")


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


@contextlib.contextmanager
def inside(name: str) -> Iterator[None]:
    """Move the calling thread into namespace ``name`` for the body, then back.

    Sockets made in the body stay in that namespace, which is how a test process reaches a
    node's control API on the namespace's own 127.0.0.1 without a process per call."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(f"/run/netns/{name}", os.O_RDONLY)
        try:
            _setns(target)
        finally:
            os.close(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(own)


def placement_in(netns: str, addr: str) -> Placement:
    """A node that runs in namespace ``netns`` and listens on ``addr``."""
    return Placement(host=addr, prefix=("ip", "netns", "exec", netns), netns=netns, enter=lambda: inside(netns))


@dataclass(frozen=True)
class Side:
    netns: str
    addr: str
    dev: str

    def placement(self) -> Placement:
        return placement_in(self.netns, self.addr)


class NetnsPair:
    """Sides ``a`` (10.77.n.1) and ``b`` (10.77.n.2); the subnet is private to the pair."""

    def __init__(self) -> None:
        if os.geteuid() != 0:
            raise NetnsUnavailable("network namespaces need root")
        ensure_tool("ip", "iproute2")
        tag = f"gf{os.getpid()}x{next(_serial)}"
        self.a = Side(f"{tag}a", "10.77.0.1", "veth-a")
        self.b = Side(f"{tag}b", "10.77.0.2", "veth-b")
        self._made: list[str] = []
        try:
            for side in (self.a, self.b):
                _ip("netns", "add", side.netns)
                self._made.append(side.netns)
                _ip("-n", side.netns, "link", "set", "lo", "up")
            # Made inside the namespaces: the names never meet anyone else's interfaces.
            _ip("-n", self.a.netns, "link", "add", self.a.dev, "type", "veth", "peer", "name", self.b.dev,
                "netns", self.b.netns)
            for side in (self.a, self.b):
                _ip("-n", side.netns, "addr", "add", f"{side.addr}/24", "dev", side.dev)
                _ip("-n", side.netns, "link", "set", side.dev, "up")
        except BaseException:
            self.close()
            raise

    def partition(self) -> None:
        """Cut the link: each side still reaches itself, neither reaches the other."""
        _ip("-n", self.a.netns, "link", "set", self.a.dev, "down")

    def heal(self) -> None:
        _ip("-n", self.a.netns, "link", "set", self.a.dev, "up")

    def close(self) -> None:
        for name in reversed(self._made):
            with contextlib.suppress(NetnsUnavailable, subprocess.TimeoutExpired):
                _ip("netns", "delete", name)
        self._made.clear()

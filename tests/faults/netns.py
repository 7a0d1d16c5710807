"""A network namespace of the test's own, for partitioning one consumer from ZooKeeper.

Two veth pairs join it to this host: one carries ZooKeeper (through :class:`Forwarder`: the
test servers listen on 127.0.0.1 only, which a namespace cannot reach), the other the test's
HTTP site. :meth:`Netns.partition` takes the ZooKeeper link down -- every packet dropped,
no reset, as a real partition -- and :meth:`Netns.heal` brings it back. Created and removed
by the test (``ip netns`` and ``ip link``: iproute2, root or CAP_NET_ADMIN); where that is not
allowed, :func:`make_netns` says why and the test skips.
"""

from __future__ import annotations

import secrets
import shutil
import socket
import subprocess
import threading
from collections.abc import Sequence

__all__ = ["Forwarder", "Netns", "make_netns"]


def _ip(*args: str, ns: str | None = None) -> None:
    cmd = ["ip", *args] if ns is None else ["ip", "netns", "exec", ns, "ip", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)
    if proc.returncode:
        raise OSError(f"{' '.join(cmd)}: {proc.stderr.strip()}")


class Netns:
    """``zkf-<tag>`` with veth pairs ``zk``: host 10.213.N.1 / ns .2, and ``http``: host
    10.213.N.5 / ns .6 (N random, so parallel runs do not collide)."""

    def __init__(self) -> None:
        tag = secrets.token_hex(3)
        self.name = f"zkf-{tag}"
        net = int(tag[:2], 16)
        self.zk_host, self.zk_ns = f"10.213.{net}.1", f"10.213.{net}.2"
        self.http_host, self.http_ns = f"10.213.{net}.5", f"10.213.{net}.6"
        self._links = {"zk": (f"zkz{tag}", f"zkzn{tag}", self.zk_host, self.zk_ns),
                       "http": (f"zkh{tag}", f"zkhn{tag}", self.http_host, self.http_ns)}
        self.created = False

    def create(self) -> Netns:
        _ip("netns", "add", self.name)
        self.created = True
        _ip("link", "set", "lo", "up", ns=self.name)
        for outside, inside, host_addr, ns_addr in self._links.values():
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            _ip("link", "set", inside, "netns", self.name)
            _ip("addr", "add", f"{host_addr}/30", "dev", outside)
            _ip("link", "set", outside, "up")
            _ip("addr", "add", f"{ns_addr}/30", "dev", inside, ns=self.name)
            _ip("link", "set", inside, "up", ns=self.name)
        return self

    @property
    def prefix(self) -> list[str]:
        """Run a command inside: ``[*ns.prefix, cmd, ...]``."""
        return ["ip", "netns", "exec", self.name]

    def partition(self) -> None:
        _ip("link", "set", self._links["zk"][0], "down")

    def heal(self) -> None:
        _ip("link", "set", self._links["zk"][0], "up")

    def remove(self) -> None:
        """Delete the namespace and the veth pairs (bounded; errors ignored: best effort)."""
        for outside, *_ in self._links.values():
            subprocess.run(["ip", "link", "del", outside], capture_output=True, timeout=20,
                           check=False)
        if self.created:
            subprocess.run(["ip", "netns", "del", self.name], capture_output=True,
                           timeout=20, check=False)


def make_netns() -> tuple[Netns | None, str]:
    """A created :class:`Netns`, or None and the reason it cannot be made here."""
    if shutil.which("ip") is None:
        return None, "no `ip` command (iproute2)"
    ns = Netns()
    try:
        ns.create()
    except (OSError, subprocess.TimeoutExpired) as exc:
        ns.remove()
        return None, f"cannot create a network namespace here: {exc}"
    return ns, ""


class Forwarder:
    """TCP forwarding from ``listen_host:<new port>`` to ``127.0.0.1:<port>``, one listener
    per target port: ZooKeeper servers bound to loopback, reachable from the namespace.

    Written by hand (about 40 lines of sockets and threads) rather than adding socat as a
    system dependency for one test; each connection gets two pump threads, all daemons."""

    def __init__(self, listen_host: str, ports: Sequence[int]) -> None:
        self._socks: list[socket.socket] = []
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self.ports: list[int] = []
        for port in ports:
            srv = socket.create_server((listen_host, 0))
            self._socks.append(srv)
            self.ports.append(srv.getsockname()[1])
            threading.Thread(target=self._accept, args=(srv, port), daemon=True).start()

    def _accept(self, srv: socket.socket, port: int) -> None:
        while True:
            try:
                client, _ = srv.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(("127.0.0.1", port), timeout=5)
            except OSError:
                client.close()  # that server is down: the client tries another
                continue
            upstream.settimeout(None)
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        with self._lock:
            for s in self._socks + self._conns:
                s.close()

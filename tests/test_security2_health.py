"""Issue #27 item 2: health endpoints that slow clients cannot take down.

An attacker on the network holds 200 connections to the consumer's and the exporter's
metrics port, each trickling one byte of a request every two seconds (and reconnecting
whenever the server sheds it); meanwhile a probe asks ``/livez`` every second on a fresh
connection. Every probe must be answered 200 (before the fix: 16 such connections took every
handler slot and 0 of 15 probes were answered).
"""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import wait_for
from zkcrawl.admin.localzk import free_port
from zkcrawl.consumer.metrics import Metrics, MetricsServer
from zkcrawl.httpserve import MAX_OPEN, REQUEST_TIMEOUT, parse_head, render

TRICKLERS = 200
DRIP = 2.0  # seconds between two bytes of one trickling connection
PROBES = 8


@dataclass
class Tricklers:
    """``n`` connections sending a request one byte per ``DRIP`` seconds, never its end."""

    port: int
    n: int
    socks: list[socket.socket] = field(default_factory=list)
    reconnects: int = 0

    def _open(self) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        s.sendall(b"GET /livez HTTP/1.1\r\nX: ")
        return s

    def start(self) -> None:
        self.socks = [self._open() for _ in range(self.n)]

    def drip(self) -> None:
        for i, s in enumerate(self.socks):
            try:
                s.sendall(b"a")
            except OSError:  # shed or timed out by the server: an attacker comes back
                s.close()
                self.reconnects += 1
                self.socks[i] = self._open()

    def close(self) -> None:
        for s in self.socks:
            s.close()


def probe(port: int) -> int | None:
    """``/livez``'s status, or None when it was not answered within 3 s."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3)
    try:
        conn.request("GET", "/livez")
        resp = conn.getresponse()
        body = resp.read()
        assert json.loads(body)["status"] in ("ok", "unavailable")
        return resp.status
    except OSError:
        return None
    finally:
        conn.close()


def under_attack(port: int) -> tuple[list[int | None], int]:
    """The probes' answers while :data:`TRICKLERS` connections trickle; and how often the
    tricklers had to reconnect."""
    attack = Tricklers(port, TRICKLERS)
    attack.start()
    answers: list[int | None] = []
    try:
        last_drip = time.monotonic()
        for _ in range(PROBES):
            answers.append(probe(port))
            if time.monotonic() - last_drip >= DRIP:
                attack.drip()
                last_drip = time.monotonic()
            time.sleep(1.0)  # the probe's period (a kubelet's), not a synchronisation
    finally:
        attack.close()
    return answers, attack.reconnects


@pytest.mark.slow
def test_consumer_health_answers_every_probe_under_200_trickling_connections():
    server = MetricsServer(Metrics(), live=lambda: (True, {"state": "running"})).start()
    try:
        answers, reconnects = under_attack(server.port)
        assert answers == [200] * PROBES
        # What the attacker sees: its connections are closed after REQUEST_TIMEOUT at most
        # (whatever it sends) or shed beyond MAX_OPEN; none is kept for ever.
        assert reconnects >= TRICKLERS - MAX_OPEN
        # /metrics still answers afterwards, and a request trickled to its end is served.
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        assert resp.status == 200 and b"zkcrawl_build_info" in resp.read()
        conn.close()
    finally:
        server.stop()


@pytest.mark.slow
def test_a_trickling_connection_is_cut_after_the_request_deadline():
    server = MetricsServer(Metrics()).start()
    try:
        s = socket.create_connection(("127.0.0.1", server.port), timeout=REQUEST_TIMEOUT + 5)
        s.sendall(b"GET /livez HTTP/1.1\r\n")
        started = time.monotonic()
        closed = False
        while time.monotonic() - started < REQUEST_TIMEOUT + 4:
            try:
                s.sendall(b"X")
                s.settimeout(0.5)
                if s.recv(100) == b"":
                    closed = True
                    break
            except TimeoutError:
                continue
            except OSError:
                closed = True
                break
        assert closed
        assert time.monotonic() - started < REQUEST_TIMEOUT + 4
        s.close()
    finally:
        server.stop()


def test_request_framing_is_bounded_and_answered():
    server = MetricsServer(Metrics()).start()
    try:
        for raw, expect in [
            (b"GET /livez HTTP/1.0\r\n\r\n", b" 200 "),
            (b"GET /livez?x=1 HTTP/1.1\r\nHost: a\r\n\r\n", b" 200 "),
            (b"HEAD /livez HTTP/1.1\r\n\r\n", b" 200 "),
            (b"POST /livez HTTP/1.1\r\n\r\n", b" 405 "),
            (b"GET /nope HTTP/1.1\r\n\r\n", b" 404 "),
            (b"\x00\xff garbage\r\n\r\n", b" 400 "),
            (b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n", b" 431 "),
        ]:
            s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            s.sendall(raw)
            got = b""
            while chunk := s.recv(65536):
                got += chunk
            s.close()
            assert expect in got.split(b"\r\n", 1)[0], (raw[:40], got[:80])
            if raw.startswith(b"HEAD"):
                assert got.endswith(b"\r\n\r\n")  # headers only
    finally:
        server.stop()


@pytest.mark.slow
def test_exporter_health_answers_every_probe_under_200_trickling_connections(
        zk_hosts, zk_root, procs):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "zkcrawl.cli", "exporter", "--zk",
                             zk_hosts, "--root", zk_root, "--metrics-port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    procs.append(proc)
    wait_for(lambda: probe(port) == 200, what="exporter alive")
    answers, _ = under_attack(port)
    assert answers == [200] * PROBES


@given(st.binary(max_size=300))
def test_any_request_head_parses_to_an_answer_or_a_refusal(head):
    status, method, path = parse_head(head)
    if status:
        assert (status, method, path) == (400, "", "")
    else:
        assert method.isalpha() and path.isprintable() and "?" not in path
        assert render(200, "text/plain", b"x").startswith(b"HTTP/1.1 200 OK\r\n")

"""The SSRF guard: which connected addresses a fetch may use (``--allow-private-addresses``).

* A queued URL or a redirect cannot make the crawler connect to an internal address (a cloud
  metadata service, 127.0.0.1, 10.x): :class:`AddressGuard` checks the address a connection
  is *actually opened to* -- after DNS, on every connection and so every redirect hop --
  never the host name, so DNS rebinding and odd spellings cannot slip through.
* Blocked: everything that is not globally routable public unicast -- stricter than
  :mod:`ipaddress`, never looser (the list: :class:`AddressGuard`). A refused connection is
  the fetch outcome ``blocked-address`` (permanent).
* Through an HTTP(S) proxy the proxy's address is not checked (the operator chose it); the
  target host is resolved and checked first (:meth:`AddressGuard.check_host`), best effort.
"""

from __future__ import annotations

import functools
import socket
from collections.abc import Iterable
from ipaddress import (
    IPv4Address,
    IPv4Network,
    IPv6Address,
    IPv6Network,
    ip_address,
    ip_network,
)

__all__ = ["BLOCKED_ADDRESS", "BLOCK_PRIVATE", "AddressGuard", "BlockedAddress", "active"]

#: The fetch outcome (``FetchResult.error``) of a refused connection.
BLOCKED_ADDRESS = "blocked-address"

Network = IPv4Network | IPv6Network
Address = IPv4Address | IPv6Address


class BlockedAddress(Exception):
    """A connection the guard refused (raised by the requests transport's connections and
    turned into ``error: "blocked-address"``; deliberately not an OSError, so urllib3 neither
    wraps nor retries it)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _nets(*pairs: tuple[str, str]) -> tuple[tuple[Network, str], ...]:
    return tuple((ip_network(net), reason) for net, reason in pairs)


# Checked in order, before the generic ipaddress properties: the more specific range first.
_NAMED_V4 = _nets(
    ("0.0.0.0/8", "'this network' (0.0.0.0/8)"),
    ("10.0.0.0/8", "private (10.0.0.0/8)"),
    # Cloud platform services on public addresses (issue #27): the rest of the clouds'
    # metadata services sit in ranges blocked anyway (169.254.169.254, 169.254.0.23,
    # 100.100.100.200, 192.0.0.192, fd00:ec2::254, fd20:ce::254).
    ("168.63.129.16/32", "cloud platform (Azure WireServer 168.63.129.16)"),
    ("161.26.0.0/16", "cloud platform (IBM Cloud service network 161.26.0.0/16)"),
    ("166.8.0.0/14", "cloud platform (IBM Cloud service endpoints 166.8.0.0/14)"),
    ("100.64.0.0/10", "shared address space (100.64.0.0/10)"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local"),
    ("172.16.0.0/12", "private (172.16.0.0/12)"),
    ("192.0.0.0/24", "IETF protocol assignments (192.0.0.0/24)"),
    ("192.0.2.0/24", "documentation (192.0.2.0/24)"),
    ("192.88.99.0/24", "6to4 relay anycast (192.88.99.0/24)"),
    ("192.168.0.0/16", "private (192.168.0.0/16)"),
    ("198.18.0.0/15", "benchmarking (198.18.0.0/15)"),
    ("198.51.100.0/24", "documentation (198.51.100.0/24)"),
    ("203.0.113.0/24", "documentation (203.0.113.0/24)"),
    ("224.0.0.0/4", "multicast"),
    ("255.255.255.255/32", "broadcast"),
    ("240.0.0.0/4", "reserved (240.0.0.0/4)"),
)
_NAMED_V6 = _nets(
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("64:ff9b:1::/48", "local-use NAT64 (64:ff9b:1::/48)"),
    ("100::/64", "discard-only (100::/64)"),
    ("2001::/32", "Teredo (2001::/32)"),
    ("2001:db8::/32", "documentation (2001:db8::/32)"),
    ("2001::/23", "IETF protocol assignments (2001::/23)"),
    ("3fff::/20", "documentation (3fff::/20)"),
    ("5f00::/16", "SRv6 SIDs (5f00::/16)"),
    ("fc00::/7", "unique-local (fc00::/7)"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local (fec0::/10)"),
    ("ff00::/8", "multicast"),
)
_NAT64 = IPv6Network("64:ff9b::/96")


def _parse(ip_text: object) -> Address | None:
    if isinstance(ip_text, IPv4Address | IPv6Address):
        return ip_text
    if not isinstance(ip_text, str):
        return None
    text = ip_text.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        return ip_address(text)  # "fe80::1%eth0" included: a zone does not change the check
    except ValueError:
        return None


def _generic(addr: Address) -> str | None:
    """What ``ipaddress`` says, for anything the named ranges did not catch."""
    if addr.is_unspecified:
        return "unspecified"
    if addr.is_loopback:
        return "loopback"
    if addr.is_link_local:
        return "link-local"
    if addr.is_multicast:  # is_global is True for e.g. 224.0.1.1 and ff0e::1
        return "multicast"
    if isinstance(addr, IPv6Address) and addr.is_site_local:
        return "site-local"
    if addr.is_private:
        return "private"
    if addr.is_reserved:
        return "reserved"
    if not addr.is_global:
        return "not globally routable"
    return None


def _embedded(addr: IPv6Address) -> tuple[str, IPv4Address] | None:
    """The IPv4 address an IPv6 address stands for, and how it is embedded."""
    if (mapped := addr.ipv4_mapped) is not None:
        return "IPv4-mapped", mapped
    if addr in _NAT64:
        return "NAT64", IPv4Address(int(addr) & 0xFFFFFFFF)
    if (v4 := addr.sixtofour) is not None:
        return "6to4", v4
    return None


@functools.lru_cache(maxsize=4096)
def _reason(addr: Address) -> str | None:
    """Why ``addr`` is not public unicast, or None. Pure; cached (one call per connection,
    but a crawl connects to the same addresses again and again)."""
    if isinstance(addr, IPv6Address):
        embedded = _embedded(addr)
        if embedded is not None:
            how, v4 = embedded
            inner = _reason(v4)
            if inner is not None:
                return f"{how} {v4}: {inner}"
            # A public IPv4 behind the embedding: allowed, unless ipaddress knows better.
            return None if addr.is_global else "not globally routable"
        if int(addr) >> 32 == 0 and int(addr) > 1:  # ::a.b.c.d (RFC 4291 §2.5.5.1)
            return "IPv4-compatible (deprecated, ::/96)"
        named = _NAMED_V6
    else:
        named = _NAMED_V4
    for net, why in named:
        if addr in net:
            return why
    return _generic(addr)


def _embedded_v4(addr: Address) -> IPv4Address | None:
    if isinstance(addr, IPv6Address):
        embedded = _embedded(addr)
        return embedded[1] if embedded is not None else None
    return None


class AddressGuard:
    """Decides whether a connection to an address may be opened. Immutable and thread-safe;
    :meth:`blocked` is pure and never raises.

    What is blocked: everything that is not globally routable public unicast. Python's
    :mod:`ipaddress` does most of it (``is_global``, ``is_private``, ``is_loopback``,
    ``is_link_local``, ``is_multicast``, ``is_reserved``, ``is_unspecified``, ``is_site_local``,
    ``ipv4_mapped``, ``sixtofour``). Added here by hand, whatever the Python version's tables say:

    * **multicast** is blocked although ``ipaddress`` calls e.g. 224.0.1.1 and ff0e::1 global;
    * **embedded IPv4** is judged as that IPv4: IPv4-mapped ``::ffff:a.b.c.d``, NAT64
      ``64:ff9b::/96`` and 6to4 ``2002::/16`` (``::ffff:127.0.0.1``, ``64:ff9b::a00:1`` and
      ``2002:7f00:1::`` are blocked; ``ipaddress`` calls the latter two global); the deprecated
      IPv4-compatible ``::a.b.c.d`` (``::/96``) is blocked outright;
    * named ranges, so the reason says what an address is and older Pythons (whose tables
      missed some, CVE-2024-4032) block them too: 0.0.0.0/8, shared 100.64.0.0/10, IETF
      192.0.0.0/24 (all of it), documentation (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24,
      2001:db8::/32, 3fff::/20), benchmarking 198.18.0.0/15, the 6to4 relay anycast
      192.88.99.0/24, 240.0.0.0/4 and broadcast, discard-only 100::/64, Teredo 2001::/32 and the
      rest of 2001::/23, local-use NAT64 64:ff9b:1::/48, SRv6 5f00::/16, unique-local fc00::/7,
      site-local fec0::/10;
    * **cloud platform services on public addresses**: Azure's WireServer 168.63.129.16 (the
      VM agent's channel: certificates, extensions, health), IBM Cloud's service network
      161.26.0.0/16 and service endpoints 166.8.0.0/14. Every other cloud's metadata service is
      in a range blocked above: 169.254.169.254 (AWS, GCP, Azure IMDS, Oracle, OpenStack,
      DigitalOcean, Hetzner), 169.254.0.23 (Tencent), 100.100.100.200 (Alibaba), 192.0.0.192
      (Oracle), fd00:ec2::254 (AWS), fd20:ce::254 (GCP).

    The guard is stricter than ``ipaddress``, never looser: whatever ``is_global`` is False for is
    blocked. ``AddressGuard(allow=(ip_network("10.1.0.0/16"),))`` exempts networks an operator
    does mean to crawl (an intranet; the tests' 127.0.0.2); ``AddressGuard.off()`` (or ``None``
    where a guard is expected) is ``--allow-private-addresses``: nothing is checked.
    """

    __slots__ = ("_allow", "_enabled")

    def __init__(self, allow: Iterable[Network | str] = (), *, enabled: bool = True) -> None:
        self._allow: tuple[Network, ...] = tuple(
            ip_network(n) if isinstance(n, str) else n for n in allow)
        self._enabled = enabled

    @classmethod
    def off(cls) -> AddressGuard:
        """A guard that checks nothing: ``--allow-private-addresses``."""
        return cls(enabled=False)

    @property
    def enabled(self) -> bool:
        return self._enabled

    @property
    def allow(self) -> tuple[Network, ...]:
        """Networks exempt from the check."""
        return self._allow

    def blocked(self, ip_text: object) -> str | None:
        """Why a connection to ``ip_text`` (an IPv4/IPv6 address as text, brackets and a zone
        tolerated) must not be opened, or None when it may. Text that is not an address is
        blocked. Never raises."""
        if not self._enabled:
            return None
        addr = _parse(ip_text)
        if addr is None:
            return "not an IP address"
        if self._allow and self._allowed(addr):
            return None
        try:
            return _reason(addr)
        except Exception:  # pragma: no cover - ipaddress does not raise here; fail closed
            return "unclassifiable address"

    def check_host(self, host: str, port: int) -> str | None:
        """Resolve ``host`` here and check every address it has: the best effort for a
        request that goes through a proxy (whose own address is not checked). None when
        the name does not resolve here (the proxy may know it) or the guard is off."""
        if not self._enabled:
            return None
        host = host.strip("[]")
        if _parse(host) is not None:
            reason = self.blocked(host)
            return None if reason is None else f"{host}: {reason}"
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError, ValueError):
            return None
        for info in infos:
            ip = str(info[4][0])
            reason = self.blocked(ip)
            if reason is not None:
                return f"{host} resolves to {ip}: {reason}"
        return None

    def _allowed(self, addr: Address) -> bool:
        v4 = _embedded_v4(addr)
        return any(addr in net or (v4 is not None and v4 in net) for net in self._allow)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AddressGuard):
            return NotImplemented
        return (self._enabled, self._allow) == (other._enabled, other._allow)

    def __hash__(self) -> int:
        return hash((self._enabled, self._allow))

    def __repr__(self) -> str:
        if not self._enabled:
            return "AddressGuard.off()"
        allow = ", ".join(str(n) for n in self._allow)
        return f"AddressGuard(allow=({allow}{',' if len(self._allow) == 1 else ''}))"


#: The default guard: every address that is not public unicast is blocked, none exempt.
BLOCK_PRIVATE = AddressGuard()


def active(guard: AddressGuard | None) -> AddressGuard | None:
    """``guard`` when it checks anything, else None (off, or no guard at all)."""
    return guard if guard is not None and guard.enabled else None

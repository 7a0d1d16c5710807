"""The HTTP flags the producer and the consumer share (one definition, one help text)."""

from __future__ import annotations

import dataclasses

from zkcrawl.settings import FETCHING, opt
from zkcrawl.web.addresses import BLOCK_PRIVATE, AddressGuard
from zkcrawl.web.transports import TRANSPORTS


@dataclasses.dataclass(frozen=True)
class WebOptions:
    """``--http`` and ``--allow-private-addresses`` (SPEC §4); mixed into both programs'
    settings."""

    http: str = opt("curl", "HTTP transport: 'curl' (libcurl, least CPU per page) or "
                    "'requests' (a requests.Session per thread)", choices=TRANSPORTS,
                    group=FETCHING)
    allow_private_addresses: bool = opt(False, "let fetches connect to loopback, link-local, "
                                        "private, multicast or reserved addresses; off: such "
                                        "a connected address (checked after DNS, on every "
                                        "redirect hop) gets error blocked-address", group=FETCHING)

    def address_guard(self) -> AddressGuard | None:
        """The SSRF guard the fetcher applies (None: ``--allow-private-addresses``)."""
        return None if self.allow_private_addresses else BLOCK_PRIVATE

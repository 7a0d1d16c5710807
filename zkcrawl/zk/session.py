"""One process's view of its ZooKeeper session, kept in one place: :class:`SessionState`.

Kazoo's state events (CONNECTED, SUSPENDED, LOST) arrive on its thread; one listener turns
them into plain attributes anyone may read without a lock: the session claims are made in,
the sessions lost (their ephemeral nodes -- leases, marks -- are gone), and since when the
connection is away. The listener only sets attributes and calls ``on_change`` (which must
not block either: flags and log lines).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from zkcrawl.zk.client import ZkClient
from zkcrawl.zk.types import ZkState

__all__ = ["OnChange", "SessionState"]

# on_change(state, away_s, new_session): away_s is how long the connection was away (on
# CONNECTED after an absence, else None); new_session: the reconnect is to another session.
OnChange = Callable[[str, float | None, bool], None]


class SessionState:
    """The session and connection of ``zk`` as kazoo last told (module docstring)."""

    def __init__(self, zk: ZkClient, on_change: OnChange | None = None) -> None:
        self.zk = zk
        self.session: int | None = zk.session_id  # the session claims are made in
        self.expired: frozenset[int] = frozenset()  # sessions lost: their claims are stale
        self.away_since: float | None = None  # monotonic time the connection went
        self._on_change = on_change

    def start(self) -> None:
        self.zk.add_listener(self._on_state)

    def stop(self) -> None:
        self.zk.remove_listener(self._on_state)  # closing the session is no news

    @property
    def connected(self) -> bool:
        return self.zk.connected

    @property
    def away(self) -> bool:
        """The connection is away (SUSPENDED or LOST, not reconnected yet)."""
        return self.away_since is not None

    def away_for(self, now: float) -> float | None:
        """Seconds the connection has been away at monotonic ``now``; None: connected."""
        since = self.away_since
        return None if since is None else now - since

    def stale(self, session: int | None) -> bool:
        """A claim made in ``session`` died with it (LOST): its item must not start."""
        return session is not None and session in self.expired

    def silent_for(self) -> float:
        """Seconds since the server last answered (:meth:`ZkClient.silent_for`)."""
        return self.zk.silent_for()

    def _on_state(self, state: str) -> bool:
        # kazoo's thread: attributes only. LOST marks the session's claims stale at once.
        now = time.monotonic()
        away_s: float | None = None
        new_session = False
        if state == ZkState.CONNECTED:
            session = self.zk.session_id
            if self.away_since is not None:
                away_s, new_session = now - self.away_since, session != self.session
                self.away_since = None
            self.session = session
        else:
            if self.away_since is None:
                self.away_since = now
            if state == ZkState.LOST and self.session is not None:
                self.expired = self.expired | {self.session}
        if self._on_change is not None:
            self._on_change(str(state), away_s, new_session)
        return False

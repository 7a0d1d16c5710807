"""The ZooKeeper errors zkcrawl catches, so no module outside :mod:`zkcrawl.zk` imports kazoo.

At run time these *are* kazoo's classes (``except NoNodeError`` catches what kazoo raises,
and an error a multi request returns is an instance of one of them). kazoo ships no type
hints, so for the type checker the same hierarchy is declared here, under
``TYPE_CHECKING``; ``tests/test_zk.py`` checks that it matches kazoo's, class by class.

Only errors present in every kazoo version pyproject allows (``kazoo>=2.10``) are listed:
2.10 lacks e.g. ``ThrottledOpError`` (and turns its error code into a ``RuntimeError``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = [
    "AuthFailedError",
    "BadVersionError",
    "CancelledError",
    "ConnectionClosedError",
    "ConnectionDropped",
    "ConnectionLoss",
    "InvalidACLError",
    "KazooException",
    "KazooTimeoutError",
    "MarshallingError",
    "NoAuthError",
    "NoNodeError",
    "NodeExistsError",
    "NotEmptyError",
    "OperationTimeoutError",
    "RolledBackError",
    "RuntimeInconsistency",
    "SessionExpiredError",
    "UnimplementedError",
    "ZookeeperError",
    "ZookeeperStoppedError",
]

if TYPE_CHECKING:
    class KazooException(Exception):
        """Every kazoo error."""

    class ZookeeperError(KazooException):
        """An error code from the server (a multi's per-op results are these)."""

    class CancelledError(KazooException): ...

    class ZookeeperStoppedError(KazooException): ...

    class ConnectionDropped(KazooException): ...

    class RolledBackError(ZookeeperError): ...

    class RuntimeInconsistency(ZookeeperError): ...

    class ConnectionLoss(ZookeeperError): ...

    class MarshallingError(ZookeeperError): ...

    class UnimplementedError(ZookeeperError): ...

    class OperationTimeoutError(ZookeeperError): ...

    class NoNodeError(ZookeeperError): ...

    class NoAuthError(ZookeeperError):
        """The node's ACL does not grant this session's identities the operation."""

    class AuthFailedError(ZookeeperError):
        """The server refused the session's credentials (SASL), or the session is in
        the AUTH_FAILED state."""

    class InvalidACLError(ZookeeperError): ...

    class BadVersionError(ZookeeperError): ...

    class NodeExistsError(ZookeeperError): ...

    class NotEmptyError(ZookeeperError): ...

    class SessionExpiredError(ZookeeperError): ...

    class ConnectionClosedError(SessionExpiredError): ...

    class KazooTimeoutError(Exception):
        """kazoo's threading handler gave up waiting (``connect``, ``get(timeout=...)``):
        not a :class:`KazooException`."""
else:
    from kazoo.exceptions import (
        AuthFailedError,
        BadVersionError,
        CancelledError,
        ConnectionClosedError,
        ConnectionDropped,
        ConnectionLoss,
        InvalidACLError,
        KazooException,
        MarshallingError,
        NoAuthError,
        NodeExistsError,
        NoNodeError,
        NotEmptyError,
        OperationTimeoutError,
        RolledBackError,
        RuntimeInconsistency,
        SessionExpiredError,
        UnimplementedError,
        ZookeeperError,
        ZookeeperStoppedError,
    )
    from kazoo.handlers.threading import KazooTimeoutError

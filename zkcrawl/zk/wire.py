"""Hand-serialized ZooKeeper requests: ``multi`` (:class:`Multi`, :class:`CreateMany`) and
``multiRead`` (:class:`MultiRead`), sent by :class:`Wire`. The bytes are ZooKeeper's
documented jute format; kazoo has no ``multiRead``, and its ``transaction()`` costs more
client CPU per op than the server spends on it.

**This module uses kazoo's private and undocumented API**, and is the only one that does:

* ``KazooClient._call(request, async_result)`` (private; kazoo's own ``commit_async`` uses
  it) queues any object with ``type``, ``serialize()`` and ``deserialize(data, offset)``;
* ``kazoo.protocol.serialization`` structs and ``type`` codes, ``kazoo.exceptions.EXCEPTIONS``;
* a multi's ``type`` is ``Transaction.type`` on purpose: kazoo un-chroots the created paths
  of responses of that type.

Tested with kazoo 2.10.0 and 2.11.0: ``tests/test_zk.py`` checks the bytes against kazoo's
``Transaction.serialize()`` and the results against its public API on a real server. A kazoo
upgrade must pass those tests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TypeVar, cast, overload

from kazoo.exceptions import EXCEPTIONS, ConnectionLoss
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.serialization import (
    CheckVersion,
    Create,
    Delete,
    GetData,
    SetData,
    Transaction,
    int_struct,
    multiheader_struct,
    stat_struct,
)
from kazoo.protocol.states import ZnodeStat
from kazoo.security import OPEN_ACL_UNSAFE

from zkcrawl.zk.types import Pending, ReadResult, Stat, TxResult

__all__ = ["CreateMany", "Multi", "MultiRead", "Wire"]

R = TypeVar("R")
T = TypeVar("T")

_MULTI: int = Transaction.type  # 14
_MULTI_READ = 22
_HEADER_SIZE: int = multiheader_struct.size
_STAT_SIZE: int = stat_struct.size
_PACK: Callable[[int], bytes] = int_struct.pack
_GETDATA_HEAD: bytes = multiheader_struct.pack(GetData.type, False, -1)
_CREATE_HEAD: bytes = multiheader_struct.pack(Create.type, False, -1)
_DELETE_HEAD: bytes = multiheader_struct.pack(Delete.type, False, -1)
_SETDATA_HEAD: bytes = multiheader_struct.pack(SetData.type, False, -1)
_CHECK_HEAD: bytes = multiheader_struct.pack(CheckVersion.type, False, -1)
_MULTI_DONE: bytes = multiheader_struct.pack(-1, True, -1)
_EPHEMERAL, _SEQUENTIAL = 1, 2


def answer(pending: Pending[T], timeout: float | None) -> T:
    """A request's result within ``timeout`` seconds. While ZooKeeper is away kazoo keeps a
    request until it reconnects, so an unbounded wait would hang a shutdown; past the
    timeout this raises ``ConnectionLoss`` -- what every caller already handles as "not
    reachable now". (The request may still be sent if the session comes back: callers
    treat it like a ConnectionLoss mid-request, as they must anyway.)"""
    try:
        return pending.get(timeout=timeout)
    except KazooTimeoutError:
        raise ConnectionLoss(f"no answer from ZooKeeper within {timeout:g} s") from None


class Wire:
    """The private request path of one ``KazooClient`` (``_call``), with what every request
    built here needs from it: the chroot and the default ACL, serialized once."""

    def __init__(self, kazoo: Any, timeout: float | None = None) -> None:
        self._kazoo = kazoo
        self.acl = _acl_bytes(kazoo.default_acl or OPEN_ACL_UNSAFE)
        self.timeout = timeout  # how long a synchronous call waits (ZkClient: --zk-timeout)

    @property
    def chroot(self) -> str:
        return str(self._kazoo.chroot or "")

    @overload
    def call(self, request: MultiRead) -> Pending[list[ReadResult]]: ...
    @overload
    def call(self, request: Multi | CreateMany) -> Pending[list[TxResult]]: ...

    def call(self, request: Multi | CreateMany | MultiRead
             ) -> Pending[list[ReadResult]] | Pending[list[TxResult]]:
        """Queue ``request`` on kazoo's connection; its thread sets the result (the
        request's ``deserialize``, or the error)."""
        result: Pending[list[TxResult]] = self._kazoo.handler.async_result()
        self._kazoo._call(request, result)
        return result

    def empty_result(self) -> Pending[list[TxResult]]:
        """A request answered already, with no results (an empty transaction)."""
        result: Pending[list[TxResult]] = self._kazoo.handler.async_result()
        result.set([])  # type: ignore[attr-defined]  # kazoo's AsyncResult.set
        return result

    def multi_read(self, paths: Sequence[str]) -> Pending[list[ReadResult]]:
        chroot = self.chroot
        return self.call(MultiRead([chroot + p for p in paths]))

    def create_many(self, marker: str, prefix: str, datas: Sequence[bytes]
                    ) -> Pending[list[str | Exception]]:
        chroot = self.chroot
        pending = self.call(CreateMany(chroot + marker, chroot + prefix, datas, self.acl))
        return cast("Pending[list[str | Exception]]", pending)  # creates only: paths


class MultiRead:
    """ZooKeeper 3.6+ ``multiRead`` (opcode 22): many getData in ONE request. A path's
    result is ``(data, stat)`` (data ``b""`` for a node without data) or its error."""

    type: ClassVar[int] = _MULTI_READ

    def __init__(self, paths: Sequence[str]) -> None:
        self.paths = list(paths)  # chroot included

    def serialize(self) -> bytes:
        return b"".join([*(_GETDATA_HEAD + _string(p) + b"\x00" for p in self.paths),
                         _MULTI_DONE])

    @classmethod
    def deserialize(cls, data: bytes, offset: int) -> list[ReadResult]:
        return _read_multi(data, offset, _getdata_result)


class Multi:
    """A ``multi`` transaction of creates, deletes, setData and version checks, committed in
    one round trip.

    The same wire format and results as kazoo's ``TransactionRequest``, minus its per-op
    path normalisation and validation. Paths are ours and already absolute (the chroot is
    prepended here); the ACL bytes are built once per client. ``commit()`` returns per-op
    results: the created path, ``True`` for a delete, the new stat for a setData, or the
    error instance of a failed op (``RolledBackError`` for the ops it undid,
    ``RuntimeInconsistency`` for those after the failed one).
    """

    type: ClassVar[int] = _MULTI  # kazoo un-chroots the created paths of this type

    def __init__(self, wire: Wire) -> None:
        self._wire = wire
        self._chroot = wire.chroot
        self._acl = wire.acl
        self._ops: list[bytes] = []

    def __len__(self) -> int:
        return len(self._ops)

    def create(self, path: str, value: bytes = b"", ephemeral: bool = False,
               sequence: bool = False) -> None:
        if not isinstance(value, bytes):
            raise TypeError(f"value must be bytes, not {type(value).__name__}")
        flags = (_EPHEMERAL if ephemeral else 0) | (_SEQUENTIAL if sequence else 0)
        self._ops.append(b"".join((_CREATE_HEAD, _string(self._chroot + path),
                                   _PACK(len(value)), value, self._acl, _PACK(flags))))

    def delete(self, path: str, version: int = -1) -> None:
        self._ops.append(b"".join((_DELETE_HEAD, _string(self._chroot + path),
                                   _PACK(version))))

    def set_data(self, path: str, value: bytes, version: int = -1) -> None:
        self._ops.append(b"".join((_SETDATA_HEAD, _string(self._chroot + path),
                                   _PACK(len(value)), value, _PACK(version))))

    def check(self, path: str, version: int) -> None:
        """Fail the whole transaction unless ``path`` is at ``version`` (the fence of a
        partition owner's writes: the partition node's version is its epoch)."""
        self._ops.append(b"".join((_CHECK_HEAD, _string(self._chroot + path),
                                   _PACK(version))))

    def serialize(self) -> bytes:
        return b"".join((*self._ops, _MULTI_DONE))

    @classmethod
    def deserialize(cls, data: bytes, offset: int) -> list[TxResult]:
        # kazoo's Transaction.deserialize, without a namedtuple per op header.
        return _read_multi(data, offset, _transaction_result)

    def commit_async(self) -> Pending[list[TxResult]]:
        if not self._ops:
            # An empty multi got no answer from the server here (Debian's ZooKeeper: the
            # call waited out its timeout): answered here, with no results.
            done: Pending[list[TxResult]] = self._wire.empty_result()
            return done
        return self._wire.call(self)

    def commit(self) -> list[TxResult]:
        """Commit and wait, at most the client's call timeout (:func:`answer`)."""
        return list(answer(self.commit_async(), self._wire.timeout))


class CreateMany:
    """One ``multi``: an ephemeral marker, then many sequential creates under one path
    prefix -- the producer's offer. The bytes shared by every create (path prefix, ACL,
    flags) are built once: kazoo's per-op validation and path normalisation cost more than
    the item itself. Results as :class:`Multi`'s (all creates: paths or errors)."""

    type: ClassVar[int] = _MULTI

    def __init__(self, marker: str, prefix: str, datas: Sequence[bytes], acl: bytes) -> None:
        # Paths with the chroot; ``acl`` as Wire.acl.
        self._marker = b"".join((_CREATE_HEAD, _string(marker), _PACK(0), acl,
                                 _PACK(_EPHEMERAL)))
        self._head = _CREATE_HEAD + _string(prefix)
        self._tail = acl + _PACK(_SEQUENTIAL)
        self.datas = datas

    def serialize(self) -> bytearray:
        b = bytearray(self._marker)
        head, tail, pack = self._head, self._tail, _PACK
        for data in self.datas:
            b.extend(head)
            b.extend(pack(len(data)))
            b.extend(data)
            b.extend(tail)
        b.extend(_MULTI_DONE)
        return b

    @classmethod
    def deserialize(cls, data: bytes, offset: int) -> list[TxResult]:
        return Multi.deserialize(data, offset)


def _read_multi(data: bytes, offset: int,
                op_result: Callable[[int, bytes, int], tuple[R, int]]) -> list[R | Exception]:
    """The per-op results of a multi response (multi or multiRead): each op's header, then
    ``op_result(kind, data, offset) -> (result, offset)`` for its body; a failed op gives the
    exception instance (kazoo's own mapping of the error code)."""
    results: list[R | Exception] = []
    unpack_header, unpack_int = multiheader_struct.unpack_from, int_struct.unpack_from
    while True:
        kind, done, _ = unpack_header(data, offset)
        offset += _HEADER_SIZE
        if done:
            return results
        if kind == -1:
            (err,) = unpack_int(data, offset)
            results.append(EXCEPTIONS[err]())
            offset += 4
        else:
            result, offset = op_result(kind, data, offset)
            results.append(result)


def _transaction_result(kind: int, data: bytes, offset: int) -> tuple[str | bool | Stat, int]:
    if kind == Create.type:  # the created path
        (length,) = int_struct.unpack_from(data, offset)
        return data[offset + 4:offset + 4 + length].decode("utf-8"), offset + 4 + length
    if kind == SetData.type:  # the node's new stat
        return ZnodeStat._make(stat_struct.unpack_from(data, offset)), offset + _STAT_SIZE
    return True, offset  # delete (and check): no body


def _getdata_result(kind: int, data: bytes, offset: int) -> tuple[tuple[bytes, Stat], int]:
    (length,) = int_struct.unpack_from(data, offset)
    offset += 4
    value = bytes(data[offset:offset + length]) if length > 0 else b""
    offset += max(length, 0)
    stat = ZnodeStat._make(stat_struct.unpack_from(data, offset))
    return (value, stat), offset + _STAT_SIZE


def _string(text: str) -> bytes:
    data = text.encode("utf-8")
    return _PACK(len(data)) + data


def _acl_bytes(acls: Sequence[Any]) -> bytes:
    parts = [_PACK(len(acls))]
    for acl in acls:
        parts += [_PACK(acl.perms), _string(acl.id.scheme), _string(acl.id.id)]
    return b"".join(parts)

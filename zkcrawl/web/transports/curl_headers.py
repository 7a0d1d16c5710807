"""A response's status and headers read from libcurl's header API (``curl_easy_nextheader``,
libcurl 7.84 and later) instead of pycurl's ``HEADERFUNCTION``: no Python callback per
header line.

Why by hand: pycurl releases the GIL for a transfer and takes it back for every callback,
and every header line is one. With many fetch threads on one GIL each is a contended
hand-over, and they cost more CPU than what zkcrawl does with a small response. pycurl has
no binding of the header API, so this module calls the libcurl pycurl loaded through
:mod:`ctypes`, as ``PyDLL`` functions that keep the GIL (they only read memory).

**Leaning on pycurl's internals**: pycurl does not expose a handle's ``CURL *``. It is read
from the ``pycurl.Curl`` object's memory (``CurlObject.handle``, after ``PyObject_HEAD``,
``dict`` and ``weakreflist`` in pycurl 7.44 to 7.49) and accepted only when it points at a
libcurl easy handle (``CURLEASY_MAGIC_NUMBER``, the first field of ``struct Curl_easy``)
whose ``CURLINFO_PRIVATE`` is that very object (pycurl sets it so). The probe reads words of
the object and four bytes behind a non-null pointer found there, and calls libcurl only with
a pointer that passed the magic check. Anything else -- another layout, a libcurl without
the API, no ``/proc/self/maps`` -- and :func:`header_api` is None: the transport sets
``HEADERFUNCTION`` as before (the tests run both ways).

Status: used wherever the probe passes (pycurl 7.49 and its bundled libcurl 8.23 here).
"""

from __future__ import annotations

import ctypes
import functools
import os
from typing import Any

import pycurl

__all__ = ["HeaderApi", "header_api"]

_CURLEASY_MAGIC = 0xC0DEDBAD
_CURLINFO_STRING = 0x100000
_CURLINFO_LONG = 0x200000
_CURLINFO_PRIVATE = _CURLINFO_STRING + 21
_CURLINFO_RESPONSE_CODE = _CURLINFO_LONG + 2
_CURLH_HEADER = 1  # a plain header of the response (not CONNECT, 1xx, trailer, pseudo)
_LAST_REQUEST = -1  # the transfer's last request: its final response
_WORDS = range(2, 8)  # pointer-sized words of a CurlObject looked at (after PyObject_HEAD)
_LOWEST = 1 << 16  # the lowest pages are never mapped: a word below is no pointer
_MAX_HEADERS = 1000  # a bound on the walk; libcurl caps a response's header bytes anyway


class _Header(ctypes.Structure):
    """libcurl's ``struct curl_header``."""

    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_char_p),
                ("amount", ctypes.c_size_t), ("index", ctypes.c_size_t),
                ("origin", ctypes.c_uint), ("anchor", ctypes.c_void_p)]


class HeaderApi:
    """libcurl's header functions, bound to the library pycurl loaded."""

    def __init__(self, lib: Any) -> None:
        self._next = lib.curl_easy_nextheader
        self._next.restype = ctypes.POINTER(_Header)
        self._next.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_int,
                               ctypes.POINTER(_Header)]
        self._info = lib.curl_easy_getinfo
        self._info.restype = ctypes.c_int
        self._info.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]

    def handle_of(self, curl: pycurl.Curl) -> int | None:
        """The ``CURL *`` of ``curl``, or None when it cannot be told for sure."""
        base = id(curl)
        size = ctypes.sizeof(ctypes.c_void_p)
        for word in _WORDS:
            ptr = ctypes.c_void_p.from_address(base + word * size).value
            if not ptr or ptr < _LOWEST or ptr % 4:
                continue
            if ctypes.c_uint32.from_address(ptr).value != _CURLEASY_MAGIC:
                continue
            private = ctypes.c_void_p()
            if self._info(ptr, _CURLINFO_PRIVATE, ctypes.byref(private)) == 0 \
                    and private.value == base:
                return int(ptr)
        return None

    def head(self, handle: int) -> tuple[int | None, dict[str, str]]:
        """The status and headers of the last response on ``handle`` so far (during a
        transfer, from its first body bytes on, or after it): names in lower case, values
        stripped, the last of a repeated name, as
        :func:`~zkcrawl.web.transports.base.parse_head` gives them. ``(None, {})``: no
        response (yet)."""
        code = ctypes.c_long()
        status = code.value if self._info(handle, _CURLINFO_RESPONSE_CODE,
                                          ctypes.byref(code)) == 0 else 0
        headers: dict[str, str] = {}
        prev = None
        nxt = self._next
        for _ in range(_MAX_HEADERS):
            h = nxt(handle, _CURLH_HEADER, _LAST_REQUEST, prev)
            if not h:
                break
            item = h.contents
            headers[(item.name or b"").decode("latin-1").strip().lower()] = \
                (item.value or b"").decode("latin-1").strip()
            prev = h
        return (status or None), headers


@functools.cache
def header_api() -> HeaderApi | None:
    """The header API of pycurl's libcurl when it can be used (see the module docstring);
    None otherwise (a pycurl other than 7.x included), also when
    ``ZKCRAWL_CURL_HEADER_CALLBACK=1`` asks for pycurl's callbacks (tests of both paths, or
    a way out should a pycurl release move its fields)."""
    if os.environ.get("ZKCRAWL_CURL_HEADER_CALLBACK") == "1" or not _known_layout():
        return None
    try:
        path = _libcurl_path()
        if path is None:
            return None
        api = HeaderApi(ctypes.PyDLL(path))
        probe = pycurl.Curl()
        try:
            ok = api.handle_of(probe) is not None
        finally:
            probe.close()
        return api if ok else None
    except (OSError, AttributeError, ValueError, pycurl.error):
        return None


def _known_layout() -> bool:
    """pycurl 7.x: every field the probe may read is a pointer (a later major version is
    looked at before it is trusted)."""
    name, _, rest = str(getattr(pycurl, "version", "")).partition("/")
    return name == "PycURL" and rest.split(".", 1)[0] == "7"


def _libcurl_path() -> str | None:
    """The file of the libcurl this process loaded for pycurl (``/proc/self/maps``)."""
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
        for line in maps:
            parts = line.split(None, 5)
            path = parts[5].strip() if len(parts) == 6 else ""
            if os.path.basename(path).startswith("libcurl") and ".so" in path:
                return path
    return None

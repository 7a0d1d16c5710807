"""The consumer's start-up banner: what it runs with, said once.

ZooKeeper, root, id, threads, backlog, politeness, robots, the address guard, where records
go, the page processors and the result pipelines -- the settings a newcomer gets wrong in
the first hour, in one place. :func:`show` writes it as a short block on a terminal (the
progress line's console) and as the ``consumer.started`` event, with the same values as
keys, everywhere else (JSON logs, a console that is not a terminal). At info: ``--log-level
warning`` hides it.

Nothing secret is shown: the ZooKeeper connect string without credentials (``--zk-auth``
is never in it; ``user:pass@`` in it is redacted), whether TLS is on, and the sink's own
description (a PostgreSQL URL never holds a password, SPEC §4).
"""

from __future__ import annotations

from typing import Any

import structlog

from zkcrawl import logs
from zkcrawl.consumer.settings import ConsumerSettings
from zkcrawl.textsafe import printable, redact_userinfo

__all__ = ["facts", "show", "text"]

log = structlog.get_logger("consumer.worker")


def _guard(s: ConsumerSettings) -> str:
    if s.allow_private_addresses:
        return "private addresses allowed (--allow-private-addresses)"
    return "public only: loopback, private refused (--allow-private-addresses)"


def _processors(s: ConsumerSettings) -> str:
    routes = [p.strip() for p in s.processor] + [f"{k} -> {v}" for k, v in
                                                 (s.processors or {}).items()]
    default = "title" + (f" + --field {', '.join(f.partition('=')[0] for f in s.field)}"
                         if s.field else "")
    return "; ".join([*routes, f"default: {default}"])


def facts(s: ConsumerSettings, consumer_id: str, out: str) -> dict[str, Any]:
    """The banner's values (also the ``consumer.started`` event's keys)."""
    zk = redact_userinfo(s.zk) + (" (TLS)" if s.zk_tls else "")
    return {"zookeeper": zk, "root": s.root, "consumer": consumer_id,
            "threads": s.threads, "backlog": s.backlog_size, "delivery": s.delivery,
            "politeness": f"{s.politeness}, --domain-delay {s.domain_delay:g}s",
            "robots": "obeyed" if s.robots else "ignored (--no-robots)",
            "address_guard": _guard(s), "out": out, "processors": _processors(s),
            "pipelines": ", ".join(p.strip() for p in s.pipeline) or "none"}


def text(values: dict[str, Any]) -> str:
    """The block a terminal gets."""
    rows = [("ZooKeeper", values["zookeeper"]), ("root", values["root"]),
            ("threads", f"{values['threads']}, backlog {values['backlog']}, "
                        f"{values['delivery']}"),
            ("politeness", values["politeness"]), ("robots.txt", values["robots"]),
            ("addresses", values["address_guard"]), ("out", values["out"]),
            ("processors", values["processors"]), ("pipelines", values["pipelines"])]
    width = max(len(k) for k, _ in rows)
    lines = [f"zkcrawl-consumer {printable(str(values['consumer']), 80)} starting"]
    lines += [f"  {k:<{width}}  {printable(str(v), 300)}" for k, v in rows]
    return "\n".join(lines) + "\n"


def show(s: ConsumerSettings, consumer_id: str, out: str, terminal: bool) -> None:
    """Say what this consumer runs with (``terminal``: the block, else the event)."""
    values = facts(s, consumer_id, out)
    if terminal:
        if s.log_level in ("debug", "info"):
            logs.write(text(values))
        return
    log.info("consumer.started", **values)

"""Seed 002's threaded link crawler, reimplemented as the baseline of ``zkcrawl bench e2e``:
one shared ``crawl_queue`` list (newest link first) and ``seen`` set, threads that download,
scrape and append new links matching ``link_regex``, a main loop that tops the threads up to
``max_threads`` and sleeps ``SLEEP_TIME`` (1 s), and a per-domain ``delay`` without a lock.
Written from that description (``requests.get`` without a Session, a regex for the links,
lxml for the title, as the consumer does), so both crawlers do the same work per page.
Run it as a child process::

    python -m zkcrawl.bench.naive START_URL LINK_REGEX THREADS OUT.jsonl [DELAY]

Every page becomes one JSON line in OUT (url, title, start, end), written as it is done.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from collections.abc import Callable
from urllib.parse import urljoin, urlsplit

SLEEP_TIME = 1  # the seed's supervisor period
_LINK = re.compile(r"""<a[^>]+href=["'](.*?)["']""", re.IGNORECASE)  # the seed's get_links


class Throttle:
    """The seed's per-domain delay: sleep until ``delay`` after the domain's last download."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.domains: dict[str, float] = {}

    def wait(self, url: str) -> None:
        domain = urlsplit(url).netloc
        last = self.domains.get(domain)
        if self.delay > 0 and last is not None:
            sleep = self.delay - (time.time() - last)
            if sleep > 0:
                time.sleep(sleep)
        self.domains[domain] = time.time()


def threaded_crawler(seed_url: str, link_regex: str, max_threads: int, out: str,
                     delay: float = 0.0) -> int:
    """Crawl from ``seed_url``; returns the number of pages downloaded."""
    import lxml.html
    import requests

    crawl_queue = [seed_url]
    seen = {seed_url}
    throttle = Throttle(delay)
    pattern = re.compile(link_regex)
    sink = open(out, "w", buffering=1)  # noqa: SIM115 - one line per page, progress for the parent
    lock = threading.Lock()
    done = [0]

    def process_queue() -> None:
        while True:
            try:
                url = crawl_queue.pop()
            except IndexError:
                break  # crawl queue is empty
            started = time.time()
            throttle.wait(url)
            try:
                html = requests.get(url, headers={"User-agent": "wswp"}, timeout=60).text
            except requests.RequestException:
                html = ""  # the seed's Downloader returns None after its retries
            title = lxml.html.fromstring(html).findtext(".//title") if html else None
            for link in _LINK.findall(html):
                if pattern.match(link):
                    link = urljoin(url, link)
                    if link not in seen:
                        seen.add(link)
                        crawl_queue.append(link)
            with lock:
                done[0] += 1
                sink.write(json.dumps({"url": url, "title": title, "start": started,
                                       "end": time.time()}) + "\n")

    seed_supervisor(process_queue, crawl_queue, max_threads)
    sink.close()
    return done[0]


def seed_supervisor(process_queue: Callable[[], None], crawl_queue: list[str],
                    max_threads: int) -> None:
    """The seeds' main loop (here and in the crawl bench's baseline): while threads run or
    URLs wait, drop the stopped threads, top them up to ``max_threads``, sleep
    :data:`SLEEP_TIME`."""
    threads: list[threading.Thread] = []
    while threads or crawl_queue:
        for thread in list(threads):
            if not thread.is_alive():
                threads.remove(thread)  # remove the stopped threads
        while len(threads) < max_threads and crawl_queue:
            thread = threading.Thread(target=process_queue, daemon=True)
            thread.start()
            threads.append(thread)
        time.sleep(SLEEP_TIME)


if __name__ == "__main__":
    if len(sys.argv) not in (5, 6):
        sys.exit("usage: python -m zkcrawl.bench.naive START_URL LINK_REGEX THREADS OUT [DELAY]")
    threaded_crawler(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4],
                     float(sys.argv[5]) if len(sys.argv) == 6 else 0.0)

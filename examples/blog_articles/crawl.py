"""Crawl a blog from one listing page with this project's processor and pipeline, producer
and consumer in this one process, through zkcrawl's Python API::

    python examples/blog_articles/crawl.py --zk 127.0.0.1:2181 \
        --start http://127.0.0.1:8000/blog/page/1 --out articles.jsonl

(``zkcrawl local-zk`` starts a ZooKeeper, ``python -m zkcrawl.admin.samplesite --port 8000``
the sample blog.) The same crawl from a shell, with this directory on PYTHONPATH::

    zkcrawl-producer --zk ... --from-file seeds.txt --follow --same-host
    zkcrawl-consumer --zk ... --processor blog_articles.processors:article \
        --pipeline blog_articles.pipelines:RequireAuthor --out articles.jsonl
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # blog_articles, by name

from zkcrawl import ExitStatus, run_consumer, run_producer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--zk", required=True)
    parser.add_argument("--root", default="/blog-articles")
    parser.add_argument("--start", required=True, help="the first listing page")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    common = ["--zk", args.zk, "--root", args.root, "--allow-private-addresses"]
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as seeds:
        seeds.write(args.start + "\n")
        seeds.flush()
        # The producer offers the seed, then follows what the processor finds, until the
        # queue and <root>/discovered/ are empty; it runs on a thread, the consumer here.
        produced: list[ExitStatus] = []
        producer = threading.Thread(target=lambda: produced.append(run_producer(
            [*common, "--from-file", seeds.name, "--follow", "--same-host"])))
        producer.start()
        consumed = run_consumer([
            *common, "--out", args.out, "--domain-delay", "0", "--exit-when-idle", "5",
            "--processor", "blog_articles.processors:article",
            "--pipeline", "blog_articles.pipelines:RequireAuthor"])
        producer.join()
    return max(int(consumed), int(produced[0]) if produced else 1)


if __name__ == "__main__":
    sys.exit(main())

"""Benchmarks, each measured as a ratio against a baseline in the same run: the queue
(:mod:`.drain`), the producer's offers (:mod:`.offer`), a whole crawl (:mod:`.crawl`, with
its synthetic :mod:`.site` and the :mod:`.naive` baseline), many hosts and an ensemble
(:mod:`.hosts`), one big host among small ones (:mod:`.skew`), the whole crawl end to end
(:mod:`.e2e`), sitemaps and ``--watch`` (:mod:`.sitemap`), re-crawls (:mod:`.recrawl`); and
:mod:`.command`, the ``zkcrawl bench`` subcommand that runs them.

Imports go one way: the benchmarks may import :mod:`zkcrawl.admin` (its throwaway servers,
:mod:`~zkcrawl.admin.localzk` and :mod:`~zkcrawl.admin.localpg`, and the demo's
:mod:`~zkcrawl.admin.samplesite`); nothing in :mod:`zkcrawl.admin` imports this package.
:mod:`zkcrawl.cli` registers :mod:`.command` beside the admin commands: it is the one module
that knows both. ``tests/test_structure_imports.py`` checks it.
"""

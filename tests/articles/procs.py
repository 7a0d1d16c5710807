"""A user's page processor calling ``page.article()`` (tests/test_article_pool.py)."""

from __future__ import annotations

from zkcrawl import Page, PageResult


def words(page: Page) -> PageResult:
    art = page.article()
    return PageResult(fields={"author": art["author"], "words": len((art["text"] or "").split())})

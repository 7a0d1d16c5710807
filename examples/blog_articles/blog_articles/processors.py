"""The page processor: an article's author and publication date, and the links to follow."""

from __future__ import annotations

from datetime import datetime

from zkcrawl import Page, PageResult

# Listing pages link their articles with class="titlelink" and the next page with rel="next".
FOLLOW = '//a[@class="titlelink"]/@href | //a[@rel="next"]/@href'


def article(page: Page) -> PageResult:
    """Every page: its links to follow; an article also has an author and a date (others
    get None, and the pipeline drops them)."""
    author = page.xpath('normalize-space(//span[@class="author"])')[0] or None
    published = published_date(page.xpath("string(//time/@datetime)")[0])
    headline = page.xpath('normalize-space(//h1[@class="headline"])')[0] or None
    return PageResult(fields={"author": author, "published": published,
                              "headline": headline},
                      links=[str(href) for href in page.xpath(FOLLOW)])


def published_date(text: str) -> str | None:
    """``2024-03-02T09:01:00Z`` -> ``2024-03-02``; None for anything else."""
    try:
        return datetime.fromisoformat(text.strip().replace("Z", "+00:00")).date().isoformat()
    except ValueError:
        return None

"""CSS selectors as Scrapy users write them, compiled to XPath 1.0.

``css_to_xpath("h1::text")`` -> ``descendant-or-self::h1/text()``: plain CSS through
cssselect's HTML translator, plus the two pseudo-elements Scrapy (parsel) added --
``::text`` (the element's own text nodes) and ``::attr(NAME)`` (an attribute's value). One
function for :meth:`zkcrawl.page.Page.css` and ``--field NAME=css:SELECTOR``.

Guarantees: a selector is text from a flag or a user's code, so anything cssselect cannot
parse, an unknown pseudo-element or an attribute name that is not an XML name raises
:class:`CssError` (a ``ValueError``) with the reason -- never an XPath built from it
unchecked; what it returns compiles as an XPath (checked: an escape such as ``\\1`` can spell a
character XPath refuses).
"""

from __future__ import annotations

import functools
import re

import cssselect
import lxml.etree
from cssselect.parser import FunctionalPseudoElement

__all__ = ["CssError", "css_to_xpath"]

_ATTR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,127}")


class CssError(ValueError):
    """A selector that cannot be compiled: its reason."""


@functools.lru_cache(maxsize=512)
def css_to_xpath(selector: str) -> str:
    """The XPath of ``selector`` (a group ``a, b`` becomes ``... | ...``)."""
    try:
        parsed = cssselect.parse(selector)
    except (cssselect.SelectorError, ValueError, TypeError) as exc:
        raise CssError(f"invalid CSS selector {selector!r}: {exc}") from None
    if not parsed:
        raise CssError("empty CSS selector")
    translator = cssselect.HTMLTranslator()
    paths = []
    for sel in parsed:
        try:
            path = translator.selector_to_xpath(sel, translate_pseudo_elements=False)
        except (cssselect.SelectorError, ValueError, TypeError) as exc:
            raise CssError(f"invalid CSS selector {selector!r}: {exc}") from None
        paths.append(path + _pseudo(sel.pseudo_element, selector))
    xpath = " | ".join(paths)
    try:  # an escape can spell a character XPath refuses (``\\1``: a control character)
        lxml.etree.XPath(xpath)
    except (lxml.etree.XPathError, ValueError) as exc:
        raise CssError(f"invalid CSS selector {selector!r}: {exc}") from None
    return xpath


def _pseudo(element: str | FunctionalPseudoElement | None, selector: str) -> str:
    if element is None:
        return ""
    if element == "text":
        return "/text()"
    if isinstance(element, FunctionalPseudoElement) and element.name == "attr":
        args = [a.value for a in element.arguments if a.type != "S"]
        if len(args) == 1 and isinstance(args[0], str) and _ATTR_NAME.fullmatch(args[0]):
            return f"/@{args[0]}"
        raise CssError(f"{selector!r}: ::attr() takes one attribute name")
    raise CssError(f"{selector!r}: unknown pseudo-element ::{element} (::text and "
                   "::attr(NAME) are known)")

"""mkdocs hooks of the docs site (mkdocs.yml ``hooks:``).

The docstrings are written for Sphinx-style reading (``:class:`Page```); mkdocstrings renders
the role's name before the code, so the rendered API page loses the ``:class:`` prefixes here.
Only inline roles followed by code are touched: nothing else of a page changes.
"""

from __future__ import annotations

import re
from typing import Any

ROLE = re.compile(r":(?:class|mod|func|meth|attr|data|exc|obj):\s*(?=<code>)")


def on_page_content(html: str, **_kwargs: Any) -> str:
    return ROLE.sub("", html)

"""Griffe extension: render the Sphinx roles of our docstrings as inline code.

The docstrings cross-reference in Sphinx's style (``:func:`load_dataset```, ``:class:`~recsys.run.RunDir```),
which mkdocstrings would print as raw text. Each role becomes inline code with the name a reader
sees (``~`` keeps only the last component, as Sphinx does).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|attr|data|obj|exc|const):`(~?)([^`]+)`")


def _plain(match: re.Match[str]) -> str:
    tilde, name = match.groups()
    return f"`{name.rsplit('.', 1)[-1] if tilde else name}`"


class SphinxRoles(griffe.Extension):
    """Rewrite the roles in every docstring griffe loads, before mkdocstrings parses it."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(_plain, obj.docstring.value)

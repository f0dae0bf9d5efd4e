"""The distribution's name and its extras: where every install hint comes from.

The import name is ``recsys``; the distribution is ``multi-interest-recsys`` (the name
``recsys`` on the package index belongs to an unrelated project, so ``pip install recsys``
would install someone else's code). A hint names the distribution with the extra,
``pip install 'multi-interest-recsys[plot]'``: with the package installed (from a wheel, or
``pip install -e .`` in a checkout) pip keeps that install and adds the extra's packages, so the
hint works from any folder.
"""

from __future__ import annotations

__all__ = ["DISTRIBUTION", "install_hint"]

DISTRIBUTION = "multi-interest-recsys"  # pyproject.toml's [project] name


def install_hint(extra: str) -> str:
    """``pip install 'multi-interest-recsys[EXTRA]'``: the command that adds ``extra``'s packages."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"

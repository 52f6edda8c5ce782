"""A griffe extension for the API reference: the library's docstrings as mkdocstrings renders them.

The docstrings follow Google style with two habits griffe reads otherwise:

* an ``Example:`` section (singular, as keras-rs writes it) is an admonition to griffe, whose
  ``>>>`` lines Markdown would turn into nested quotes; it becomes an ``Examples:`` section,
  rendered as code;
* Sphinx roles (``:class:`~retrieval.api.Query```, ``:func:`tune```) become code spans
  (``Query``, ``tune``): the names stay readable without cross-references that would have to
  resolve to a rendered page.

Only the text given to the renderer changes; the source files are not touched.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)
_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj|const|py:\w+):`(~?)([^`]+)`")


def _role_to_code(match: re.Match[str]) -> str:
    short, target = match.group(1), match.group(2)
    return f"`{target.rsplit('.', 1)[-1] if short else target}`"


def rewrite(text: str) -> str:
    """The docstring ``text`` with ``Example:`` sections and Sphinx roles rewritten (above)."""
    return _ROLE.sub(_role_to_code, _EXAMPLE.sub(r"\1Examples:", text))


class GoogleDocstrings(griffe.Extension):
    """Rewrites each loaded object's docstring with :func:`rewrite` before it is parsed."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rewrite(obj.docstring.value)

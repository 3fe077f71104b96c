"""Griffe extensions for the API reference (loaded by mkdocstrings, see mkdocs.yml).

- `ExampleSections`: xpbank docstrings title their doctests ``Example:``, which griffe's
  Google parser reads as an admonition (Markdown, where ``>>>`` lines are block quotes);
  this renames the title to the ``Examples:`` section, which griffe renders as code.
- `SphinxRoles`: docstrings cross-reference with Sphinx roles (``:class:`~xpbank.Spec```),
  which read well in ``help()`` but are raw text in Markdown. This turns each role into
  an autorefs cross-reference: a link where the target has a page in the reference, inline
  code where it has none (internal modules), never a warning.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

_TITLE = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)
# :class:`X`, :meth:`~a.b.C.m`, :func:`title <a.b.f>`, :mod:`a.b`, ...
_ROLE = re.compile(
    r":(?:py:)?(?P<role>class|meth|func|attr|mod|data|exc|obj|const):"
    r"`(?P<body>[^`]+)`"
)
_EXPLICIT = re.compile(r"^(?P<title>.+?)\s*<(?P<target>[^<>]+)>$")


class ExampleSections(griffe.Extension):
    """Rename ``Example:`` to ``Examples:`` in every docstring before it is parsed."""

    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _TITLE.sub(r"\1Examples:", obj.docstring.value)


def _resolve(obj: Any, target: str) -> str:
    """The full dotted path of ``target`` as seen from ``obj``'s scope (best effort)."""
    if target.startswith("xpbank."):
        return target
    head, _, rest = target.partition(".")
    try:
        path = str(obj.resolve(head))
    except Exception:  # griffe.NameResolutionError and alias errors: keep it readable
        return target
    return f"{path}.{rest}" if rest else path


def _role_to_autoref(obj: Any, match: re.Match[str]) -> str:
    role, body = match["role"], match["body"].strip()
    explicit = _EXPLICIT.match(body)
    if explicit:
        title, target = explicit["title"], explicit["target"]
    else:
        target = body.lstrip("~")
        title = target.rsplit(".", 1)[-1] if body.startswith("~") else target
    target = target.lstrip("~").removesuffix("()")
    if role in ("meth", "func") and not title.endswith(")"):
        title += "()"
    identifier = _resolve(obj, target)
    return (
        f'<autoref identifier="{html.escape(identifier)}" optional>'
        f"<code>{html.escape(title)}</code></autoref>"
    )


def convert_roles(obj: Any, text: str) -> str:
    """Replace every Sphinx role in ``text`` with an optional autorefs cross-reference."""
    return _ROLE.sub(lambda m: _role_to_autoref(obj, m), text)


class SphinxRoles(griffe.Extension):
    """Turn Sphinx roles into autorefs cross-references once every object is loaded."""

    def on_object(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None and ":" in obj.docstring.value:
            obj.docstring.value = convert_roles(obj, obj.docstring.value)

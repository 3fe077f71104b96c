"""A griffe extension for the API reference: xpbank docstrings title their doctests
``Example:``, which griffe's Google parser reads as an admonition (Markdown, where
``>>>`` lines are block quotes); this renames the title to the ``Examples:`` section,
which griffe renders as code."""

from __future__ import annotations

import re
from typing import Any

import griffe

_TITLE = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)


class ExampleSections(griffe.Extension):
    """Rename ``Example:`` to ``Examples:`` in every docstring before it is parsed."""

    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _TITLE.sub(r"\1Examples:", obj.docstring.value)

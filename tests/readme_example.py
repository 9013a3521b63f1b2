"""The README's code blocks, read from README.md, so the tests run what users copy (not a paraphrase).

Example::

    code = python_block("Bring your own model")      # the first ```python block under "### Bring your own model"
    run_with_model(code, model, x, y)                 # its "model = ..." line replaced by ``model``
"""

from __future__ import annotations

import os
import re

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")
#: The README's placeholder for the user's model (the test supplies a built one).
MODEL_PLACEHOLDER = re.compile(r"^model = \.\.\..*$", re.MULTILINE)


def python_block(section: str) -> str:
    """The first fenced ``python`` block after the heading ``### {section}`` of README.md."""
    with open(README) as f:
        text = f.read()
    heading = text.find(f"### {section}\n")
    if heading < 0:
        raise AssertionError(f"README.md has no section '### {section}'")
    found = re.search(r"```python\n(.*?)```", text[heading:], re.DOTALL)
    if found is None:
        raise AssertionError(f"README.md's section {section!r} has no ```python block")
    return found.group(1)


def run_with_model(code: str, namespace: dict) -> dict:
    """Executes ``code`` with its one ``model = ...`` line removed; ``namespace`` supplies ``model``, ``x``, ``y``.

    Returns the namespace after the run (``private``, ``history``, ...).
    """
    code, replaced = MODEL_PLACEHOLDER.subn("", code)
    if replaced != 1:
        raise AssertionError(f"expected one 'model = ...' line in the README block, found {replaced}")
    exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102  (the project's own README)
    return namespace

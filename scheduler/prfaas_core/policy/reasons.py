"""A decision's reason, formatted only when someone reads it.

Every routing decision, instance pick and admission verdict carries a reason (:mod:`.routing`), yet nearly all of
them are never read: a router reads one only for a request it cannot serve, the simulator never. Formatting each
(numbers with their decimals, the parts nested) was a few percent of the simulator's time. A decision therefore
holds its reason as :data:`Why`: the text, or a tuple ``(template, *values)`` — made as cheaply as a tuple is — that
:func:`text` formats when read, the same text an f-string gives (``format(value, spec)`` either way). A value may
itself be such a tuple (a reason nested in another); the values are never changed, so the text is the same
whenever it is read.
"""

from __future__ import annotations

from typing import Any

Why = str | tuple[Any, ...]
"""A reason as a decision holds it: its text, or ``(template, *values)`` for :func:`text` to format."""


def text(why: Why) -> str:
    """The text of a reason held as :data:`Why`: ``template.format(*values)``, a nested reason's text in its place."""
    if isinstance(why, str):
        return why
    template: str = why[0]
    return template.format(*[text(v) if type(v) is tuple else v for v in why[1:]])

"""Setting the slots of the frozen value objects the simulator makes at every publication (the
regions' and the pools' live state) directly: the ``__init__`` a frozen, slotted dataclass is
generated with calls ``object.__setattr__`` once per field, twice what setting a slot through
its descriptor costs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any


def slot_setters(cls: type) -> tuple[Callable[[Any, Any], None], ...]:
    """The setters of the slots of ``cls`` (a frozen, slotted dataclass), in field order.

    Unpacked by the callers into one name per field, so a field added to ``cls`` fails there
    at import instead of leaving a slot unset."""
    return tuple(vars(cls)[field.name].__set__ for field in dataclasses.fields(cls))

"""``build_frozen`` makes what the constructor makes: the reference it is checked against."""

from __future__ import annotations

import dataclasses

import pytest

from scheduler.framework.columns import Frame
from scheduler.framework.plugin import RequestView
from scheduler.framework.scheduler import LazyRejections
from scheduler.types import Decision, FleetSnapshot, build_frozen


@pytest.mark.parametrize("cls", [Decision, RequestView, Frame, LazyRejections, FleetSnapshot],
                         ids=lambda cls: cls.__name__)
def test_the_same_instance_as_the_constructors(cls: type) -> None:
    values = {f.name: object() for f in dataclasses.fields(cls)}
    fast, plain = build_frozen(cls, dict(values)), cls(**values)
    assert type(fast) is cls and vars(fast) == vars(plain)
    assert all(getattr(fast, name) is value for name, value in values.items())
    name = next(iter(values))
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(fast, name, None)

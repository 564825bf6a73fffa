"""The framework restricts a plugin's columns to a model's candidates by the fields the columns
class names ``PER_CANDIDATE``, whatever the length of its other arrays."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from scheduler.framework.columns import BoolArray, FloatArray, IndexArray, restrict


@dataclass(frozen=True)
class Columns:
    PER_CANDIDATE: ClassVar[tuple[str, ...]] = ("per_candidate", "by_name")
    per_candidate: FloatArray
    by_name: Mapping[str, BoolArray]
    # one value per region: as many regions as candidates here, and never restricted
    per_region: FloatArray


@dataclass(frozen=True)
class NoneDeclared:
    values: FloatArray


def test_only_the_declared_fields_are_restricted() -> None:
    index: IndexArray = np.asarray([0, 2], dtype=np.intp)
    columns = Columns(np.asarray([1.0, 2.0, 3.0]), {"a": np.asarray([True, False, True])}, np.asarray([7.0, 8.0, 9.0]))
    restricted = restrict(columns, index)
    assert restricted.per_candidate.tolist() == [1.0, 3.0]
    assert restricted.by_name["a"].tolist() == [True, True]
    assert restricted.per_region is columns.per_region


def test_columns_that_declare_nothing_are_kept_as_they_are() -> None:
    columns = NoneDeclared(np.asarray([1.0, 2.0, 3.0]))
    assert restrict(columns, np.asarray([1], dtype=np.intp)) is columns
    assert restrict(None, np.asarray([1], dtype=np.intp)) is None

"""What a workflow workload is made of (scheduler.sim.workflow): the ``--workflow SHAPE:N:TOKENS``
spec and the per-row columns a workload of workflows carries (``Workload.workflows``).
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.types import WORKFLOW_SHAPES, WorkflowShape

# A sibling's own part / a chain's new turn [tokens]; the client's think time between steps [s];
# how far apart a fan-out's siblings leave the client [s].
SUFFIX_TOKENS = (128, 512)
THINK_S = (0.1, 1.0)
SPREAD_S = 0.005
_SHAPES: dict[str, WorkflowShape] = {shape: shape for shape in WORKFLOW_SHAPES}


@dataclass(frozen=True)
class WorkflowSpec:
    """``SHAPE:N:TOKENS``: N steps (chain), siblings (fanout) or siblings + join (dag) per
    workflow, sharing a prefix of TOKENS tokens."""

    shape: WorkflowShape
    steps: int
    prefix_tokens: int
    suffix_tokens: tuple[int, int] = SUFFIX_TOKENS
    think_s: tuple[float, float] = THINK_S
    spread_s: float = SPREAD_S

    def __post_init__(self) -> None:
        if self.shape not in WORKFLOW_SHAPES:
            raise ValueError(f"workflow shape must be one of {', '.join(WORKFLOW_SHAPES)}, got {self.shape!r}")
        least = 2 if self.shape == "dag" else 1
        if self.steps < least:
            raise ValueError(f"a {self.shape} workflow needs N >= {least}, got {self.steps}")
        if self.prefix_tokens < 1:
            raise ValueError(f"the shared prefix needs TOKENS >= 1, got {self.prefix_tokens}")

    @classmethod
    def parse(cls, value: str) -> WorkflowSpec:
        """``fanout:8:4096``; ValueError naming the value when it is not SHAPE:N:TOKENS."""
        parts = value.split(":")
        try:
            if len(parts) != 3:
                raise ValueError("expected three parts")
            shape = _SHAPES.get(parts[0])
            if shape is None:
                raise ValueError(f"SHAPE must be one of {', '.join(WORKFLOW_SHAPES)}")
            return cls(shape, int(parts[1]), int(parts[2]))
        except ValueError as exc:
            raise ValueError(f"expected SHAPE:N:TOKENS like fanout:8:4096 (SHAPE: {', '.join(WORKFLOW_SHAPES)}; "
                             f"N, TOKENS: positive integers), got {value!r} ({exc})") from None

    def describe(self) -> dict[str, object]:
        return {
            "shape": self.shape, "steps": self.steps, "prefix_tokens": self.prefix_tokens,
            "suffix_tokens": list(self.suffix_tokens), "think_s": list(self.think_s), "spread_s": self.spread_s,
        }


@dataclass(frozen=True)
class WorkflowColumns:
    """Per row of a workflow workload (rows m = w N + k, workflow-major)."""

    spec: WorkflowSpec
    # shared_prefix_tokens of each row (-1: None)
    shared_prefix: list[int]
    # prompt tokens a row leaves warm under its prefix key where it ran
    leaves: list[int]
    # the rows each row waits for (empty: it arrives at its arrival_s), and the inverse
    after: list[tuple[int, ...]]
    children: list[tuple[int, ...]]
    # client think time after the last of ``after`` reached the client [s]
    think_s: list[float]
    # rows that arrive at their arrival_s, in arrival order
    roots: list[int]

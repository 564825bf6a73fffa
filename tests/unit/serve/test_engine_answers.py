"""A pool's engine that misses one stats call (a loaded host) stays published on its last
answer for the grace; one that stays silent longer, or never answered, is not published."""

from __future__ import annotations

from scheduler.serve.gateway import EngineAnswers


def test_a_missed_call_keeps_the_last_answer_for_the_grace_only() -> None:
    answers = EngineAnswers(grace_s=5.0)
    first = {"running": 1.0}
    assert answers.standing("long", first, now=100.0) == first
    assert answers.standing("long", TimeoutError(), now=104.0) == first  # 4 s later: stands
    assert answers.standing("long", TimeoutError(), now=105.5) is None  # past the grace
    newer = {"running": 2.0}
    assert answers.standing("long", newer, now=106.0) == newer
    assert answers.standing("long", RuntimeError("actor died"), now=107.0) == newer


def test_a_pool_that_never_answered_is_not_published() -> None:
    answers = EngineAnswers(grace_s=5.0)
    assert answers.standing("chat", TimeoutError(), now=0.0) is None
    assert answers.standing("long", {"running": 0.0}, now=0.0) is not None
    assert answers.standing("chat", TimeoutError(), now=1.0) is None  # one pool's answer is not another's

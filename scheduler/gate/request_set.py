"""The request set ``scheduler gate measure`` runs (docs/gate.md, "The request set").

A set is a YAML file: a model, the streams kept in flight (``concurrency``), how many rounds
to repeat (``rounds``) and named buckets of requests. One round of a bucket sends each of its
requests ``copies`` times (a fan-out request as ``fanout`` branches of one workflow), at most
``concurrency`` streams at once, so that engines batch as they do under load. Every stream
starts with its own tag (bucket, round, number), which keeps the prefix cache from serving
one sample's prompt to the next (and a fan-out's branches share their workflow's prefix, as
a real fan-out does). Long contexts are synthetic text: ``context_words`` words drawn from a
fixed vocabulary with a seed of (bucket, request), so every run sends the same prompts
(about 1.3 tokens per word with Llama's tokenizer).

Shipped sets (``--requests NAME``): ``standard`` (the gate's default, for real pools) and
``local`` (fits the local tiny model's 2,048-token context, ``scheduler up``).
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from scheduler.config.loader import parse, validate
from scheduler.config.schema import ModelName, Slug, Strict

SHIPPED_DIR = Path(__file__).resolve().parent / "requests"
DEFAULT_SET = "standard"

_VOCABULARY = (
    "the", "grid", "power", "demand", "energy", "region", "model", "token", "batch", "cache", "memory", "request",
    "hour", "carbon", "wind", "solar", "water", "heat", "load", "price", "market", "report", "figure", "table",
    "week", "month", "year", "plan", "team", "city", "river", "north", "south", "east", "west", "data", "answer",
    "question", "system", "network", "server", "cluster", "node", "rack", "cooling", "air", "supply", "chain",
    "policy", "rule", "limit", "budget", "cost", "saving", "share", "peak", "night", "morning", "evening",
    "forecast", "signal", "value", "measure", "meter", "sensor", "record", "history", "trend", "change", "growth",
    "rise", "fall", "steady", "stable", "high", "low", "average", "median", "and", "of", "to", "in", "for", "with",
    "on", "by", "from", "as", "at", "over", "under", "between", "after", "before", "during", "while", "because",
    "is", "are", "was", "were", "has", "have", "had", "will", "would", "can", "could", "should", "may", "might",
    "must", "does", "did", "new", "old", "large", "small", "long", "short", "early", "late", "first", "last",
    "next", "other", "each", "every", "many", "few", "more", "less",
)


class SetRequest(Strict):
    """One request of a bucket."""

    kind: Literal["chat", "completion"] = "chat"
    # The request's own words (a question, an instruction), after the synthetic context.
    text: str = Field(min_length=1)
    # Words of synthetic document before the text (a long context).
    context_words: int = Field(default=0, ge=0, le=200_000)
    max_tokens: int = Field(gt=0, le=131_072)
    # Streams of this request per round.
    copies: int = Field(default=1, ge=1, le=256)
    # >1: one fan-out workflow of this many branches sharing the prefix (context and text).
    fanout: int = Field(default=1, ge=1, le=64)
    workload_class: Literal["interactive", "batch", "deferrable"] = "interactive"


class Bucket(Strict):
    name: Slug
    description: str = ""
    requests: tuple[SetRequest, ...] = Field(min_length=1)


class Rounds(Strict):
    """A bucket runs ``min`` rounds, then more until its mean J/token is stable: the 95 %
    half-width of the samples' spread at most ``target`` of the mean (or ``max`` rounds)."""

    min: int = Field(default=3, ge=1, le=1000)
    max: int = Field(default=10, ge=1, le=1000)
    target: float = Field(default=0.05, gt=0, le=1)

    @model_validator(mode="after")
    def _ordered(self) -> Rounds:
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) must be at least min ({self.min})")
        return self


class RequestSet(Strict):
    name: Slug
    description: str = ""
    model: ModelName
    concurrency: int = Field(default=8, ge=1, le=1024)
    rounds: Rounds = Rounds()
    buckets: tuple[Bucket, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_buckets(self) -> RequestSet:
        names = [b.name for b in self.buckets]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"bucket names must be unique, repeated: {repeated}")
        return self

    @property
    def digest(self) -> str:
        """sha256 of the set's content (not of its file: comments and layout do not count)."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def bucket(self, name: str) -> Bucket:
        return next(b for b in self.buckets if b.name == name)


def load_request_set(source: str) -> RequestSet:
    """A shipped set by name (``standard``, ``local``) or a YAML file; ``ConfigError`` names
    the file, the field and the value of every problem."""
    path = SHIPPED_DIR / f"{source}.yaml" if "/" not in source and not source.endswith((".yaml", ".yml")) else None
    if path is None or not path.is_file():
        path = Path(source)
    return validate(RequestSet, parse(path), str(path))


@dataclass(frozen=True)
class Call:
    """One stream to send: the OpenAI path and body (``x_scheduler`` hints included)."""

    bucket: str
    path: str
    body: dict[str, Any]


def synthetic_text(words: int, seed: str) -> str:
    """``words`` words of the fixed vocabulary, the same for the same seed in every process."""
    rng = random.Random(seed)
    out = []
    for i in range(words):
        word = rng.choice(_VOCABULARY)
        # Sentences of 16 words, paragraphs of 8 sentences.
        out.append(word + (".\n" if i % 128 == 127 else "." if i % 16 == 15 else ""))
    return " ".join(out)


def calls(request_set: RequestSet, bucket: Bucket, round_index: int, *, model: str | None = None,
          pool: str | None = None) -> list[Call]:
    """The streams of one round of ``bucket`` (module doc). ``pool``: the region pool to run on
    (a region's gateway takes it in ``x_scheduler.pool``; a router chooses itself)."""
    out: list[Call] = []
    for index, request in enumerate(bucket.requests):
        context = synthetic_text(request.context_words, f"{bucket.name}/{index}") if request.context_words else ""
        for copy in range(request.copies):
            tag = f"gate {request_set.name}/{bucket.name}/{round_index}/{index}/{copy}"
            shared = f"[{tag}]\n{context}\n\n{request.text}" if context else f"[{tag}] {request.text}"
            for branch in range(request.fanout):
                hints: dict[str, Any] = {"workload_class": request.workload_class}
                if request.fanout > 1:
                    # One workflow per copy: its branches share the prefix and its cache.
                    workflow = hashlib.sha256(tag.encode()).hexdigest()[:16]
                    hints.update(workflow_id=workflow, workflow_shape="fanout", prefix_key=workflow)
                    content = f"{shared}\n\nAnswer part {branch + 1} of {request.fanout} only."
                else:
                    content = shared
                if pool is not None:
                    hints["pool"] = pool
                body: dict[str, Any] = {"model": model or request_set.model, "max_tokens": request.max_tokens,
                                        "temperature": 0.0, "seed": 7, "stream": True,
                                        "stream_options": {"include_usage": True}, "x_scheduler": hints}
                if request.kind == "chat":
                    body["messages"] = [{"role": "user", "content": content}]
                    path = "/v1/chat/completions"
                else:
                    body["prompt"] = content
                    path = "/v1/completions"
                out.append(Call(bucket.name, path, body))
    return out

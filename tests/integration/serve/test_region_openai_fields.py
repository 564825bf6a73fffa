"""OpenAI's engine fields through the router's front door to a real region (Ray Serve + the vLLM
CPU engine, the tiny model): the gateway lets them through under the ticket that binds them,
and the engine honours them: a JSON schema constrains the answer, logprobs come back one per
token, and tools reach the engine (which refuses a tool call without a tool-call parser: the
shipped regions set none).

Runs before test_region_stack.py (file order), which takes the region down at its end."""

from __future__ import annotations

import json

import openai
import pytest

from scheduler.region.stack import LocalStack

pytestmark = [pytest.mark.ray, pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

MODEL = "llama-3.1-8b"
# One value allowed: the grammar leaves the engine no choice but whitespace.
GRID = {"type": "object", "properties": {"grid": {"type": "string", "enum": ["clean"]}}, "required": ["grid"],
        "additionalProperties": False}
TOOL = {"type": "function", "function": {"name": "report", "parameters": GRID}}


@pytest.mark.timeout(240)
async def test_structured_output_a_named_tool_and_logprobs_reach_the_real_engine(stack: LocalStack) -> None:
    assert stack.router_http is not None
    client = openai.AsyncOpenAI(base_url=stack.router_http + "/v1", api_key="unused", max_retries=0)
    question = [{"role": "user", "content": "Is the grid clean?"}]
    try:
        structured = await client.chat.completions.create(
            model=MODEL, messages=question, max_tokens=64, temperature=0, presence_penalty=0, logprobs=False,
            response_format={"type": "json_schema", "json_schema": {"name": "grid", "schema": GRID}})
        # The engine reads the tools: the shipped regions run vLLM without a tool-call parser,
        # and vLLM refuses a tool call then, which reaches the client as the region's 400.
        with pytest.raises(openai.BadRequestError) as no_parser:
            await client.chat.completions.create(
                model=MODEL, messages=question, max_tokens=64, temperature=0, tools=[TOOL],  # type: ignore[list-item]
                tool_choice={"type": "function", "function": {"name": "report"}})
        scored = await client.chat.completions.create(model=MODEL, messages=question, max_tokens=4, logprobs=True,
                                                      top_logprobs=2, extra_body={"top_k": 5})
    finally:
        await client.close()
    # Whitespace aside, what the engine wrote is the one answer the schema allows, or its start
    # (the random tiny model may spend its tokens on whitespace, which JSON allows).
    answer = "".join((structured.choices[0].message.content or "").split())
    assert answer and json.dumps({"grid": "clean"}, separators=(",", ":")).startswith(answer), answer
    assert "region says" in no_parser.value.message and "tool-call-parser" in no_parser.value.message
    logprobs = scored.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None and scored.usage is not None
    assert len(logprobs.content) == scored.usage.completion_tokens
    assert all(len(token.top_logprobs) == 2 for token in logprobs.content)
    assert (scored.model_extra or {})["energy_receipt"]["energy_j"] > 0

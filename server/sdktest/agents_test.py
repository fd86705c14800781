"""Drive a dflash-mlx server through the APIs coding agents use, with the official SDKs:
the OpenAI Responses API (openai) and the Anthropic Messages API (anthropic).

Usage: DFLASH_BASE_URL=http://127.0.0.1:8000/v1 python agents_test.py

Environment:
  DFLASH_BASE_URL           the server's /v1 URL (required)
  DFLASH_API_KEY            the API key, if the server wants one (default "unused")
  DFLASH_MODEL              the model to ask for (default: the first one /v1/models lists)
  DFLASH_SDK_STRICT_TOOLS   "1": the model calls get_weather(city="Paris") when offered the
                            tool and, given the tool's result, answers "The tool said: "
                            and the result (the fake backend's agent script does). Otherwise
                            the round trips are driven from the client's side only: the
                            call is sent back as history and any answer passes.

Answers are greedy (temperature 0, or no temperature at all, which this server reads as
greedy), so the same conversation must give the same text through every API.

Every check runs even when an earlier one fails; the last line is "N passed, N failed" and
the exit status is 1 when anything failed.
"""

import json
import os

import anthropic
import openai

from sdkrun import run_tests

BASE_URL = os.environ["DFLASH_BASE_URL"].rstrip("/")
API_KEY = os.environ.get("DFLASH_API_KEY", "unused")
STRICT_TOOLS = os.environ.get("DFLASH_SDK_STRICT_TOOLS") == "1"
oa = openai.OpenAI(base_url=BASE_URL, api_key=API_KEY, max_retries=0, timeout=120)
# The Anthropic SDK appends /v1/messages to its base URL.
an = anthropic.Anthropic(base_url=BASE_URL.removesuffix("/v1"), api_key=API_KEY, max_retries=0, timeout=120)
MODEL = os.environ.get("DFLASH_MODEL") or oa.models.list().data[0].id
N = 24  # tokens per answer: enough to compare, short enough for a CPU

QUESTION = "Write the Go file strings/compare.go."
FOLLOW_UP = "Now write the Go file strings/clone.go."
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}
RESPONSES_TOOL = {"type": "function", "name": "get_weather", "description": "Current weather for a city",
                  "parameters": WEATHER_SCHEMA, "strict": False}
ANTHROPIC_TOOL = {"name": "get_weather", "description": "Current weather for a city", "input_schema": WEATHER_SCHEMA}
WEATHER_QUESTION = "What is the weather in Paris?"


def check(cond, message):
    if not cond:
        raise AssertionError(message)


def chat_text(messages):
    """The chat-completions answer to the same conversation: the reference for every API."""
    r = oa.chat.completions.create(model=MODEL, messages=messages, max_tokens=N, temperature=0)
    return r.choices[0].message.content or "", r.usage


# --- OpenAI Responses API ---------------------------------------------------------------

def respond(**kwargs):
    kwargs.setdefault("model", MODEL)
    kwargs.setdefault("max_output_tokens", N)
    kwargs.setdefault("temperature", 0)
    return oa.responses.create(**kwargs)


def test_responses_plain_equals_chat():
    r = respond(input=QUESTION)
    check(r.id.startswith("resp_") and r.status in ("completed", "incomplete"), f"response {r.id} {r.status}")
    check(r.output_text != "", "empty output_text")
    text, usage = chat_text([{"role": "user", "content": QUESTION}])
    check(r.output_text == text, f"responses {r.output_text!r} != chat {text!r}")
    check(r.usage.input_tokens == usage.prompt_tokens and r.usage.output_tokens == usage.completion_tokens,
          f"usage {r.usage} != chat {usage}")
    check(r.usage.input_tokens_details.cached_tokens >= 0, "no cached_tokens")


def test_responses_streamed_equals_plain():
    plain = respond(input=QUESTION)
    deltas, seq, final = [], [], None
    for ev in respond(input=QUESTION, stream=True):
        seq.append(ev.sequence_number)
        if ev.type == "response.output_text.delta":
            deltas.append(ev.delta)
        elif ev.type in ("response.completed", "response.incomplete"):
            final = ev.response
    check(seq == list(range(len(seq))), f"sequence numbers {seq}")
    check(final is not None, "no terminal event")
    check("".join(deltas) == plain.output_text == final.output_text,
          f"streamed {''.join(deltas)!r} != plain {plain.output_text!r}")
    check(final.usage.input_tokens == plain.usage.input_tokens and final.usage.output_tokens == plain.usage.output_tokens,
          f"streamed usage {final.usage} != plain {plain.usage}")
    # The SDK's own stream helper reads the same events (its get_final_response wants
    # response.completed, which an answer cut at max_output_tokens does not end with).
    with oa.responses.stream(model=MODEL, input=QUESTION, max_output_tokens=N, temperature=0) as s:
        helper = [ev.response for ev in s if ev.type in ("response.completed", "response.incomplete")]
    check(len(helper) == 1 and helper[0].output_text == plain.output_text, f"responses.stream {helper}")


def test_responses_two_turns_by_previous_response_id():
    first = respond(input=QUESTION)
    second = respond(input=FOLLOW_UP, previous_response_id=first.id)
    check(second.previous_response_id == first.id, f"previous_response_id {second.previous_response_id}")
    text, _ = chat_text([{"role": "user", "content": QUESTION}, {"role": "assistant", "content": first.output_text},
                         {"role": "user", "content": FOLLOW_UP}])
    check(second.output_text == text, f"second turn {second.output_text!r} != chat {text!r}")
    got = oa.responses.retrieve(first.id)
    check(got.output_text == first.output_text, "retrieve returned another response")
    oa.responses.delete(first.id)
    try:
        oa.responses.retrieve(first.id)
        raise AssertionError("a deleted response is still there")
    except openai.NotFoundError:
        pass
    try:
        respond(input="x", previous_response_id=first.id)
        raise AssertionError("chaining to a deleted response was accepted")
    except openai.NotFoundError as e:
        check("previous_response_id" in str(e) or first.id in str(e), f"message {e}")


def test_responses_function_tool_round_trip():
    if STRICT_TOOLS:
        r = respond(input=WEATHER_QUESTION, tools=[RESPONSES_TOOL], max_output_tokens=200)
        calls = [o for o in r.output if o.type == "function_call"]
        check(len(calls) == 1 and calls[0].name == "get_weather", f"output {r.output}")
        check(json.loads(calls[0].arguments) == {"city": "Paris"}, f"arguments {calls[0].arguments}")
        call_id = calls[0].call_id
        follow = respond(previous_response_id=r.id, tools=[RESPONSES_TOOL], max_output_tokens=200,
                         input=[{"type": "function_call_output", "call_id": call_id, "output": "sunny"}])
        check(follow.output_text == "The tool said: sunny", f"after the tool: {follow.output_text!r}")
        # Streamed, the call is announced with its name and call_id, then its arguments; the
        # answer to it continues the streamed response.
        args, added, final = "", None, None
        for ev in respond(input=WEATHER_QUESTION, tools=[RESPONSES_TOOL], max_output_tokens=200, stream=True):
            if ev.type == "response.output_item.added" and ev.item.type == "function_call":
                added = ev.item
            elif ev.type == "response.function_call_arguments.delta":
                args += ev.delta
            elif ev.type == "response.completed":
                final = ev.response
        check(json.loads(args) == {"city": "Paris"}, f"streamed arguments {args!r}")
        check(added is not None and added.name == "get_weather" and added.call_id.startswith("call_")
              and len(added.call_id) > len("call_"), f"announced call {added}")
        follow = respond(previous_response_id=final.id, tools=[RESPONSES_TOOL], max_output_tokens=200,
                         input=[{"type": "function_call_output", "call_id": added.call_id, "output": "rain"}])
        check(follow.output_text == "The tool said: rain", f"after the streamed call: {follow.output_text!r}")
        return
    # A model that is not known to call tools: the client sends the call and its output as
    # history, stateless, as Codex does.
    follow = respond(store=False, tools=[RESPONSES_TOOL], input=[
        {"role": "user", "content": WEATHER_QUESTION},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}])
    check(follow.status in ("completed", "incomplete") and follow.output, f"after the tool: {follow}")


def test_responses_errors():
    try:
        respond(input=[{"type": "function_call_output", "call_id": "call_none", "output": "x"}])
        raise AssertionError("an output with no call was accepted")
    except openai.BadRequestError as e:
        check("call_none" in str(e), f"message {e}")
    try:
        respond(input="x", text={"format": {"type": "json_schema", "name": "s",
                                            "schema": {"type": "object", "properties": {"a": {"not": {}}}}}})
        raise AssertionError("a schema with a keyword the server cannot enforce was accepted")
    except openai.BadRequestError as e:
        check("text.format" in str(e), f"message {e}")


# --- Anthropic Messages API -------------------------------------------------------------

def message_text(m):
    return "".join(b.text for b in m.content if b.type == "text")


def test_messages_plain_equals_chat():
    # No temperature: the 2.x SDK sends none, and this server then decodes greedily.
    m = an.messages.create(model=MODEL, max_tokens=N, messages=[{"role": "user", "content": QUESTION}])
    check(m.id.startswith("msg_") and m.role == "assistant", f"message {m.id}")
    check(m.stop_reason in ("end_turn", "max_tokens"), f"stop_reason {m.stop_reason}")
    text, usage = chat_text([{"role": "user", "content": QUESTION}])
    check(message_text(m) == text, f"messages {message_text(m)!r} != chat {text!r}")
    check(m.usage.input_tokens + m.usage.cache_read_input_tokens == usage.prompt_tokens, f"usage {m.usage} vs {usage}")
    check(m.usage.output_tokens == usage.completion_tokens, f"usage {m.usage} vs {usage}")


def test_messages_streamed_equals_plain():
    kwargs = dict(model=MODEL, max_tokens=N, system="Answer in Go.", messages=[{"role": "user", "content": QUESTION}])
    plain = an.messages.create(**kwargs)
    with an.messages.stream(**kwargs) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    check(streamed == message_text(plain) == message_text(final), f"streamed {streamed!r} != plain {message_text(plain)!r}")
    check(final.stop_reason == plain.stop_reason, f"stop_reason {final.stop_reason} != {plain.stop_reason}")
    # The prompt's split between input_tokens and cache_read_input_tokens depends on what the
    # prefix cache holds at the time (the second run finds the first's prompt there); the
    # prompt and the answer do not.
    prompt = lambda u: u.input_tokens + u.cache_read_input_tokens
    check(prompt(final.usage) == prompt(plain.usage) and final.usage.output_tokens == plain.usage.output_tokens,
          f"usage {final.usage} != {plain.usage}")


def test_messages_tool_use_round_trip():
    user = {"role": "user", "content": WEATHER_QUESTION}
    if STRICT_TOOLS:
        m = an.messages.create(model=MODEL, max_tokens=200, tools=[ANTHROPIC_TOOL], messages=[user])
        uses = [b for b in m.content if b.type == "tool_use"]
        check(m.stop_reason == "tool_use" and len(uses) == 1, f"message {m}")
        check(uses[0].name == "get_weather" and uses[0].input == {"city": "Paris"}, f"tool_use {uses[0]}")
        follow = an.messages.create(model=MODEL, max_tokens=200, tools=[ANTHROPIC_TOOL], messages=[
            user, {"role": "assistant", "content": m.content},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "sunny"}]}])
        check(message_text(follow) == "The tool said: sunny", f"after the tool: {message_text(follow)!r}")
        with an.messages.stream(model=MODEL, max_tokens=200, tools=[ANTHROPIC_TOOL], messages=[user],
                                tool_choice={"type": "tool", "name": "get_weather"}) as s:
            final = s.get_final_message()
        uses = [b for b in final.content if b.type == "tool_use"]
        check(len(uses) == 1 and uses[0].input == {"city": "Paris"} and uses[0].name == "get_weather"
              and uses[0].id.startswith("toolu_") and len(uses[0].id) > len("toolu_"), f"streamed tool_use {final.content}")
        # As agents do: the streamed message goes back as the assistant turn.
        follow = an.messages.create(model=MODEL, max_tokens=200, tools=[ANTHROPIC_TOOL], messages=[
            user, {"role": "assistant", "content": final.content},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "rain"}]}])
        check(message_text(follow) == "The tool said: rain", f"after the streamed call: {message_text(follow)!r}")
        return
    follow = an.messages.create(model=MODEL, max_tokens=N, tools=[ANTHROPIC_TOOL], messages=[
        user, {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                                 "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]}])
    check(follow.stop_reason in ("end_turn", "max_tokens") and follow.content, f"after the tool: {follow}")


def test_messages_count_tokens():
    messages = [{"role": "user", "content": QUESTION}]
    count = an.messages.count_tokens(model=MODEL, messages=messages, system="Answer in Go.")
    m = an.messages.create(model=MODEL, max_tokens=1, messages=messages, system="Answer in Go.")
    check(count.input_tokens > 0, f"count {count}")
    check(count.input_tokens == m.usage.input_tokens + m.usage.cache_read_input_tokens, f"count {count} vs usage {m.usage}")


def test_messages_errors():
    try:
        an.messages.create(model="no-such-model", max_tokens=5, messages=[{"role": "user", "content": "x"}])
        raise AssertionError("an unknown model was accepted")
    except anthropic.NotFoundError as e:
        check(e.body["error"]["type"] == "not_found_error", f"body {e.body}")
    try:
        an.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}])
        raise AssertionError("an image was accepted by a text-only server")
    except anthropic.BadRequestError as e:
        check(e.body["error"]["type"] == "invalid_request_error" and "text-only" in str(e), f"body {e.body}")


if __name__ == "__main__":
    run_tests(globals(), f"python openai {openai.__version__}, anthropic {anthropic.__version__}")

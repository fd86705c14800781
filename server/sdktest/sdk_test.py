"""Drive a dflash-mlx server with the official openai Python SDK.

Usage: DFLASH_BASE_URL=http://127.0.0.1:8000/v1 python sdk_test.py

Environment:
  DFLASH_BASE_URL           the server's /v1 URL (required)
  DFLASH_API_KEY            the API key, if the server wants one (default "unused")
  DFLASH_MODEL              the model to ask for (default: the first one /v1/models lists)
  DFLASH_SDK_STRICT_TOOLS   "1": the model is known to call get_weather(city="Paris") when
                            offered the tool (the fake backend does); otherwise tool calls
                            are only checked for shape, as a real model may answer anything.

Every check runs even when an earlier one fails; the last line is "N passed, N failed" and
the exit status is 1 when anything failed.
"""

import json
import os

import openai

from sdkrun import run_tests

BASE_URL = os.environ["DFLASH_BASE_URL"]
STRICT_TOOLS = os.environ.get("DFLASH_SDK_STRICT_TOOLS") == "1"
client = openai.OpenAI(
    base_url=BASE_URL,
    api_key=os.environ.get("DFLASH_API_KEY", "unused"),
    max_retries=0,
    timeout=120,
)
MODEL = os.environ.get("DFLASH_MODEL") or client.models.list().data[0].id

MESSAGES = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "Name three rivers of Europe."},
]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TOOL_MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


def check(cond, message):
    if not cond:
        raise AssertionError(message)


def check_usage(usage, max_completion=None):
    check(usage is not None, "no usage")
    check(usage.prompt_tokens > 0, f"prompt_tokens {usage.prompt_tokens}")
    check(usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, f"usage totals {usage}")
    if max_completion is not None:
        check(usage.completion_tokens <= max_completion, f"completion_tokens {usage.completion_tokens} > {max_completion}")


def chat(**kwargs):
    params = {"model": MODEL, "messages": MESSAGES, "max_tokens": 48, "temperature": 0, "seed": 7}
    params.update(kwargs)
    return client.chat.completions.create(**params)


def collect_stream(stream):
    """Merge a chat stream: content, finish reason, usage chunk, tool calls by index."""
    content, finish, usage, calls, chunks = "", None, None, {}, 0
    for chunk in stream:
        chunks += 1
        check(chunk.object == "chat.completion.chunk", f"chunk object {chunk.object}")
        if not chunk.choices:
            check(chunk.usage is not None, "chunk without choices and without usage")
            usage = chunk.usage
            continue
        check(usage is None, "a chunk with choices came after the usage chunk")
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for tc in delta.tool_calls or []:
            entry = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
            entry["id"] = entry["id"] or tc.id
            if tc.function is not None:
                entry["name"] += tc.function.name or ""
                entry["arguments"] += tc.function.arguments or ""
        if chunk.choices[0].finish_reason is not None:
            finish = chunk.choices[0].finish_reason
    check(chunks > 0, "empty stream")
    return content, finish, usage, [calls[i] for i in sorted(calls)]


def test_models():
    ids = [m.id for m in client.models.list().data]
    check(MODEL in ids or os.environ.get("DFLASH_MODEL"), f"{MODEL} not in {ids}")
    check(client.models.retrieve(MODEL).id == MODEL, "models.retrieve")


def test_chat_non_streaming():
    resp = chat()
    check(resp.object == "chat.completion", f"object {resp.object}")
    choice = resp.choices[0]
    check(choice.message.role == "assistant", f"role {choice.message.role}")
    check(isinstance(choice.message.content, str), "content is not a string")
    check(choice.finish_reason in ("stop", "length"), f"finish_reason {choice.finish_reason}")
    check_usage(resp.usage, 48)
    stats = (resp.model_extra or {}).get("dflash")
    check(isinstance(stats, dict), "no dflash extension object")
    # draft_ms and verify_ms appear only when the server profiles (serve --profile), and
    # acceptance_rate and batch_size only when the backend drafted or reports its batch.
    for key in ("tau", "cycles", "drafted", "accepted", "prefill_ms", "decode_ms", "tokens_per_second"):
        check(key in stats, f"dflash.{key} missing")


def test_chat_streaming_equals_non_streaming():
    full = chat()
    content, finish, usage, _ = collect_stream(chat(stream=True, stream_options={"include_usage": True}))
    check(content == full.choices[0].message.content, f"stream {content!r} != full {full.choices[0].message.content!r}")
    check(finish == full.choices[0].finish_reason, f"finish {finish} != {full.choices[0].finish_reason}")
    check(usage is not None, "no usage chunk with include_usage")
    check(usage.completion_tokens == full.usage.completion_tokens, f"usage {usage} != {full.usage}")
    check(usage.prompt_tokens == full.usage.prompt_tokens, f"usage {usage} != {full.usage}")


def test_completions():
    params = {"model": MODEL, "prompt": "The three largest rivers of Europe are", "max_tokens": 32, "temperature": 0}
    resp = client.completions.create(**params)
    check(resp.object == "text_completion", f"object {resp.object}")
    text = resp.choices[0].text
    check(isinstance(text, str), "text is not a string")
    check(resp.choices[0].finish_reason in ("stop", "length"), f"finish {resp.choices[0].finish_reason}")
    check_usage(resp.usage, 32)
    streamed, finish = "", None
    for chunk in client.completions.create(stream=True, **params):
        if chunk.choices:
            streamed += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
    check(streamed == text, f"stream {streamed!r} != full {text!r}")
    check(finish == resp.choices[0].finish_reason, f"finish {finish}")


def test_stop():
    full = chat().choices[0].message.content
    if len(full.strip()) < 8:
        print(f"  (answer {full!r} too short to cut; stop not exercised)")
        return
    middle = len(full) // 2
    stop = full[middle : middle + 4]
    expected = full[: full.index(stop)]
    resp = chat(stop=[stop])
    got = resp.choices[0].message.content or ""
    check(got == expected, f"stop {stop!r}: got {got!r}, want {expected!r}")
    check(stop not in got, "stop string emitted")
    check(resp.choices[0].finish_reason == "stop", f"finish {resp.choices[0].finish_reason}")
    content, finish, _, _ = collect_stream(chat(stop=stop, stream=True))
    check(content == expected, f"streamed stop: got {content!r}, want {expected!r}")
    check(finish == "stop", f"streamed finish {finish}")


def test_length():
    resp = chat(max_tokens=2)
    usage, finish = resp.usage, resp.choices[0].finish_reason
    check(usage.completion_tokens <= 2, f"completion_tokens {usage.completion_tokens}")
    check(finish == "length" or usage.completion_tokens < 2, f"finish {finish} after {usage.completion_tokens} tokens")


def check_weather_call(name, arguments, finish):
    check(name == "get_weather", f"tool name {name!r}")
    args = json.loads(arguments)
    check(isinstance(args, dict), f"arguments {arguments!r} are not an object")
    if STRICT_TOOLS:
        check(args.get("city") == "Paris", f"arguments {args}")
    check(finish == "tool_calls", f"finish {finish}")


def test_tool_calls():
    choices = ["auto", {"type": "function", "function": {"name": "get_weather"}}] if STRICT_TOOLS else [
        {"type": "function", "function": {"name": "get_weather"}}
    ]
    for tool_choice in choices:
        resp = chat(messages=TOOL_MESSAGES, tools=[WEATHER_TOOL], tool_choice=tool_choice, max_tokens=64)
        msg, finish = resp.choices[0].message, resp.choices[0].finish_reason
        if not STRICT_TOOLS and not msg.tool_calls:
            check(finish in ("stop", "length"), f"finish {finish} without tool calls")
            continue
        check(msg.tool_calls and len(msg.tool_calls) >= 1, f"no tool call for tool_choice={tool_choice}: {msg}")
        call = msg.tool_calls[0]
        check(call.type == "function" and call.id.startswith("call_"), f"tool call {call}")
        check_weather_call(call.function.name, call.function.arguments, finish)

        _, sfinish, _, calls = collect_stream(
            chat(messages=TOOL_MESSAGES, tools=[WEATHER_TOOL], tool_choice=tool_choice, max_tokens=64, stream=True)
        )
        check(len(calls) == len(msg.tool_calls), f"streamed {len(calls)} calls, full answer had {len(msg.tool_calls)}")
        check_weather_call(calls[0]["name"], calls[0]["arguments"], sfinish)
        check(calls[0]["arguments"] == call.function.arguments, "streamed arguments differ")

    # The tool result goes back in a follow-up turn; the assistant turn has content null.
    follow_up = TOOL_MESSAGES + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature_c": 21, "sky": "clear"}'},
    ]
    resp = chat(messages=follow_up, max_tokens=32)
    check(resp.choices[0].finish_reason in ("stop", "length", "tool_calls"), f"follow-up finish {resp.choices[0].finish_reason}")


def test_errors():
    try:
        chat(n=2)
        raise AssertionError("n=2 was accepted")
    except openai.BadRequestError as e:
        check(e.status_code == 400, f"status {e.status_code}")
        check("n must be 1" in str(e), f"message {e}")
    try:
        chat(model="no-such-model")
        raise AssertionError("an unknown model was accepted")
    except openai.NotFoundError as e:
        check(e.status_code == 404 and "no-such-model" in str(e), f"unknown model: {e}")
    try:
        chat(extra_body={"max_tokens": "many"})
        raise AssertionError("max_tokens='many' was accepted")
    except openai.BadRequestError as e:
        check("max_tokens" in str(e), f"message {e}")


if __name__ == "__main__":
    run_tests(globals(), f"python openai {openai.__version__}")

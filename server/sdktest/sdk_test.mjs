// Drive a dflash-mlx server with the official openai npm SDK.
//
// Usage: DFLASH_BASE_URL=http://127.0.0.1:8000/v1 node sdk_test.mjs   (after npm ci here)
//
// Environment: the same as sdk_test.py — DFLASH_BASE_URL (required), DFLASH_API_KEY,
// DFLASH_MODEL, DFLASH_SDK_STRICT_TOOLS ("1" when the model is known to call
// get_weather(city="Paris"), as the fake backend does).
//
// Every check runs even when an earlier one fails; the last line is "N passed, N failed" and
// the exit status is 1 when anything failed.

import OpenAI from "openai";
import { readFileSync } from "node:fs";
import { runTests } from "./sdkrun.mjs";

const baseURL = process.env.DFLASH_BASE_URL;
if (!baseURL) {
  console.error("DFLASH_BASE_URL is not set");
  process.exit(2);
}
const strictTools = process.env.DFLASH_SDK_STRICT_TOOLS === "1";
const client = new OpenAI({
  baseURL,
  apiKey: process.env.DFLASH_API_KEY || "unused",
  maxRetries: 0,
  timeout: 120_000,
});
const sdkVersion = JSON.parse(
  readFileSync(new URL("./node_modules/openai/package.json", import.meta.url), "utf8"),
).version;

const model = process.env.DFLASH_MODEL || (await client.models.list()).data[0].id;
const messages = [
  { role: "system", content: "You are a terse assistant." },
  { role: "user", content: "Name three rivers of Europe." },
];
const weatherTool = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Current weather for a city",
    parameters: {
      type: "object",
      properties: { city: { type: "string" } },
      required: ["city"],
    },
  },
};
const toolMessages = [{ role: "user", content: "What is the weather in Paris?" }];

function check(cond, message) {
  if (!cond) throw new Error(message);
}

function checkUsage(usage, maxCompletion) {
  check(usage, "no usage");
  check(usage.prompt_tokens > 0, `prompt_tokens ${usage.prompt_tokens}`);
  check(
    usage.total_tokens === usage.prompt_tokens + usage.completion_tokens,
    `usage totals ${JSON.stringify(usage)}`,
  );
  if (maxCompletion !== undefined) {
    check(usage.completion_tokens <= maxCompletion, `completion_tokens ${usage.completion_tokens}`);
  }
}

function chat(params = {}) {
  return client.chat.completions.create({
    model,
    messages,
    max_tokens: 48,
    temperature: 0,
    seed: 7,
    ...params,
  });
}

// collectStream merges a chat stream: content, finish reason, usage chunk, tool calls.
async function collectStream(stream) {
  let content = "";
  let finish = null;
  let usage = null;
  let chunks = 0;
  const calls = new Map();
  for await (const chunk of stream) {
    chunks++;
    check(chunk.object === "chat.completion.chunk", `chunk object ${chunk.object}`);
    if (chunk.choices.length === 0) {
      check(chunk.usage, "chunk without choices and without usage");
      usage = chunk.usage;
      continue;
    }
    check(usage === null, "a chunk with choices came after the usage chunk");
    const choice = chunk.choices[0];
    content += choice.delta.content ?? "";
    for (const tc of choice.delta.tool_calls ?? []) {
      const entry = calls.get(tc.index) ?? { id: null, name: "", arguments: "" };
      entry.id = entry.id ?? tc.id;
      entry.name += tc.function?.name ?? "";
      entry.arguments += tc.function?.arguments ?? "";
      calls.set(tc.index, entry);
    }
    if (choice.finish_reason) finish = choice.finish_reason;
  }
  check(chunks > 0, "empty stream");
  const ordered = [...calls.keys()].sort((a, b) => a - b).map((k) => calls.get(k));
  return { content, finish, usage, calls: ordered };
}

const tests = {
  async models() {
    const ids = (await client.models.list()).data.map((m) => m.id);
    check(ids.includes(model) || process.env.DFLASH_MODEL, `${model} not in ${ids}`);
    check((await client.models.retrieve(model)).id === model, "models.retrieve");
  },

  async chatNonStreaming() {
    const resp = await chat();
    check(resp.object === "chat.completion", `object ${resp.object}`);
    const choice = resp.choices[0];
    check(choice.message.role === "assistant", `role ${choice.message.role}`);
    check(typeof choice.message.content === "string", "content is not a string");
    check(["stop", "length"].includes(choice.finish_reason), `finish ${choice.finish_reason}`);
    checkUsage(resp.usage, 48);
    // draft_ms and verify_ms appear only when the server profiles (serve --profile), and
    // acceptance_rate and batch_size only when the backend drafted or reports its batch.
    for (const key of ["tau", "cycles", "drafted", "accepted", "prefill_ms", "decode_ms", "tokens_per_second"]) {
      check(resp.dflash && key in resp.dflash, `dflash.${key} missing`);
    }
  },

  async chatStreamingEqualsNonStreaming() {
    const full = await chat();
    const s = await collectStream(await chat({ stream: true, stream_options: { include_usage: true } }));
    const want = full.choices[0].message.content;
    check(s.content === want, `stream ${JSON.stringify(s.content)} != full ${JSON.stringify(want)}`);
    check(s.finish === full.choices[0].finish_reason, `finish ${s.finish}`);
    check(s.usage, "no usage chunk with include_usage");
    check(
      s.usage.completion_tokens === full.usage.completion_tokens &&
        s.usage.prompt_tokens === full.usage.prompt_tokens,
      `usage ${JSON.stringify(s.usage)} != ${JSON.stringify(full.usage)}`,
    );
  },

  async completions() {
    const params = { model, prompt: "The three largest rivers of Europe are", max_tokens: 32, temperature: 0 };
    const resp = await client.completions.create(params);
    check(resp.object === "text_completion", `object ${resp.object}`);
    const text = resp.choices[0].text;
    check(typeof text === "string", "text is not a string");
    checkUsage(resp.usage, 32);
    let streamed = "";
    let finish = null;
    for await (const chunk of await client.completions.create({ ...params, stream: true })) {
      if (chunk.choices.length) {
        streamed += chunk.choices[0].text;
        finish = chunk.choices[0].finish_reason ?? finish;
      }
    }
    check(streamed === text, `stream ${JSON.stringify(streamed)} != full ${JSON.stringify(text)}`);
    check(finish === resp.choices[0].finish_reason, `finish ${finish}`);
  },

  async stop() {
    const full = (await chat()).choices[0].message.content;
    if (full.trim().length < 8) {
      console.log(`  (answer ${JSON.stringify(full)} too short to cut; stop not exercised)`);
      return;
    }
    const middle = Math.floor(full.length / 2);
    const stop = full.slice(middle, middle + 4);
    const expected = full.slice(0, full.indexOf(stop));
    const resp = await chat({ stop: [stop] });
    const got = resp.choices[0].message.content ?? "";
    check(got === expected, `stop ${JSON.stringify(stop)}: got ${JSON.stringify(got)}, want ${JSON.stringify(expected)}`);
    check(resp.choices[0].finish_reason === "stop", `finish ${resp.choices[0].finish_reason}`);
    const s = await collectStream(await chat({ stop, stream: true }));
    check(s.content === expected, `streamed stop: got ${JSON.stringify(s.content)}`);
    check(s.finish === "stop", `streamed finish ${s.finish}`);
  },

  async length() {
    const resp = await chat({ max_tokens: 2 });
    const n = resp.usage.completion_tokens;
    check(n <= 2, `completion_tokens ${n}`);
    check(resp.choices[0].finish_reason === "length" || n < 2, `finish ${resp.choices[0].finish_reason}`);
  },

  async toolCalls() {
    const named = { type: "function", function: { name: "get_weather" } };
    const choices = strictTools ? ["auto", named] : [named];
    const checkCall = (name, args, finish) => {
      check(name === "get_weather", `tool name ${name}`);
      const parsed = JSON.parse(args);
      check(parsed && typeof parsed === "object" && !Array.isArray(parsed), `arguments ${args}`);
      if (strictTools) check(parsed.city === "Paris", `arguments ${args}`);
      check(finish === "tool_calls", `finish ${finish}`);
    };
    for (const toolChoice of choices) {
      const params = { messages: toolMessages, tools: [weatherTool], tool_choice: toolChoice, max_tokens: 64 };
      const resp = await chat(params);
      const msg = resp.choices[0].message;
      if (!strictTools && !msg.tool_calls?.length) {
        check(["stop", "length"].includes(resp.choices[0].finish_reason), "finish without tool calls");
        continue;
      }
      check(msg.tool_calls?.length >= 1, `no tool call for ${JSON.stringify(toolChoice)}`);
      const call = msg.tool_calls[0];
      check(call.type === "function" && call.id.startsWith("call_"), `tool call ${JSON.stringify(call)}`);
      checkCall(call.function.name, call.function.arguments, resp.choices[0].finish_reason);
      const s = await collectStream(await chat({ ...params, stream: true }));
      check(s.calls.length === msg.tool_calls.length, `streamed ${s.calls.length} calls`);
      checkCall(s.calls[0].name, s.calls[0].arguments, s.finish);
      check(s.calls[0].arguments === call.function.arguments, "streamed arguments differ");
    }
    const followUp = [
      ...toolMessages,
      {
        role: "assistant",
        content: null,
        tool_calls: [
          { id: "call_1", type: "function", function: { name: "get_weather", arguments: '{"city": "Paris"}' } },
        ],
      },
      { role: "tool", tool_call_id: "call_1", content: '{"temperature_c": 21, "sky": "clear"}' },
    ];
    const resp = await chat({ messages: followUp, max_tokens: 32 });
    check(["stop", "length", "tool_calls"].includes(resp.choices[0].finish_reason), "follow-up finish");
  },

  async errors() {
    let err = await chat({ n: 2 }).then(() => null, (e) => e);
    check(err instanceof OpenAI.BadRequestError, `n=2: ${err}`);
    check(err.status === 400 && err.message.includes("n must be 1"), `n=2 message: ${err.message}`);
    err = await chat({ model: "no-such-model" }).then(() => null, (e) => e);
    check(err instanceof OpenAI.NotFoundError && err.message.includes("no-such-model"), `unknown model: ${err}`);
    err = await chat({ max_tokens: "many" }).then(() => null, (e) => e);
    check(err instanceof OpenAI.BadRequestError && err.message.includes("max_tokens"), `max_tokens: ${err}`);
  },
};

await runTests(tests, `node openai ${sdkVersion}`);

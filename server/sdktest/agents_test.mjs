// Drive a dflash-mlx server through the APIs coding agents use, from Node: the Vercel AI
// SDK's default OpenAI provider (which calls the Responses API) and the official
// @anthropic-ai/sdk (Messages API).
//
// Usage: DFLASH_BASE_URL=http://127.0.0.1:8000/v1 node agents_test.mjs   (after npm ci here)
//
// Environment: as agents_test.py — DFLASH_BASE_URL (required), DFLASH_API_KEY, DFLASH_MODEL,
// DFLASH_SDK_STRICT_TOOLS ("1" when the model calls get_weather(city="Paris") and then
// answers "The tool said: " and the result, as the fake backend's agent script does).
//
// Every check runs even when an earlier one fails; the last line is "N passed, N failed" and
// the exit status is 1 when anything failed.

import { createOpenAI } from "@ai-sdk/openai";
import Anthropic from "@anthropic-ai/sdk";
import { generateText, jsonSchema, stepCountIs, streamText, tool } from "ai";
import { readFileSync } from "node:fs";
import { runTests } from "./sdkrun.mjs";

const baseURL = (process.env.DFLASH_BASE_URL || "").replace(/\/$/, "");
if (!baseURL) {
  console.error("DFLASH_BASE_URL is not set");
  process.exit(2);
}
const apiKey = process.env.DFLASH_API_KEY || "unused";
const strictTools = process.env.DFLASH_SDK_STRICT_TOOLS === "1";
const version = (pkg) =>
  JSON.parse(readFileSync(new URL(`./node_modules/${pkg}/package.json`, import.meta.url), "utf8")).version;

async function firstModel() {
  const r = await fetch(`${baseURL}/models`, { headers: { Authorization: `Bearer ${apiKey}` } });
  return (await r.json()).data[0].id;
}
const modelID = process.env.DFLASH_MODEL || (await firstModel());
const openai = createOpenAI({ baseURL, apiKey });
const model = openai(modelID); // the provider's default: the Responses API
// The Anthropic SDK appends /v1/messages to its base URL.
const anthropic = new Anthropic({ baseURL: baseURL.replace(/\/v1$/, ""), apiKey, maxRetries: 0, timeout: 120_000 });

const question = "Write the Go file strings/compare.go.";
const n = 24;
const weatherSchema = { type: "object", properties: { city: { type: "string" } }, required: ["city"] };

function check(cond, message) {
  if (!cond) throw new Error(message);
}

// The chat-completions answer to the same conversation, the reference for every API.
async function chatText(messages) {
  const r = await fetch(`${baseURL}/chat/completions`, {
    method: "POST",
    headers: { "Content-Type": "application/json", Authorization: `Bearer ${apiKey}` },
    body: JSON.stringify({ model: modelID, messages, max_tokens: n, temperature: 0 }),
  });
  const body = await r.json();
  return { text: body.choices[0].message.content ?? "", usage: body.usage };
}

const messageText = (m) => m.content.filter((b) => b.type === "text").map((b) => b.text).join("");

const tests = {
  async aiSdkGenerateTextEqualsChat() {
    const r = await generateText({ model, prompt: question, maxOutputTokens: n, temperature: 0 });
    check(r.response.id.startsWith("resp_"), `response id ${r.response.id}: not the Responses API`);
    const chat = await chatText([{ role: "user", content: question }]);
    check(r.text === chat.text, `generateText ${JSON.stringify(r.text)} != chat ${JSON.stringify(chat.text)}`);
    check(r.usage.inputTokens === chat.usage.prompt_tokens && r.usage.outputTokens === chat.usage.completion_tokens,
      `usage ${JSON.stringify(r.usage)} vs ${JSON.stringify(chat.usage)}`);
  },

  async aiSdkStreamTextEqualsGenerateText() {
    const plain = await generateText({ model, prompt: question, maxOutputTokens: n, temperature: 0 });
    const s = streamText({ model, prompt: question, maxOutputTokens: n, temperature: 0 });
    let text = "";
    for await (const delta of s.textStream) text += delta;
    const usage = await s.usage;
    check(text === plain.text, `streamText ${JSON.stringify(text)} != generateText ${JSON.stringify(plain.text)}`);
    check(usage.inputTokens === plain.usage.inputTokens && usage.outputTokens === plain.usage.outputTokens,
      `usage ${JSON.stringify(usage)} vs ${JSON.stringify(plain.usage)}`);
  },

  async aiSdkToolRoundTrip() {
    if (!strictTools) return "the SDK runs a tool only when the model calls it (DFLASH_SDK_STRICT_TOOLS=1)";
    const getWeather = tool({
      description: "Current weather for a city",
      inputSchema: jsonSchema(weatherSchema),
      execute: async ({ city }) => `sunny in ${city}`,
    });
    const r = await generateText({ model, prompt: "What is the weather in Paris?", tools: { get_weather: getWeather },
      stopWhen: stepCountIs(3), maxOutputTokens: 200 });
    const calls = r.steps.flatMap((s) => s.toolCalls);
    check(calls.length === 1 && calls[0].toolName === "get_weather" && calls[0].input.city === "Paris",
      `tool calls ${JSON.stringify(calls)}`);
    check(r.text === "The tool said: sunny in Paris", `final text ${JSON.stringify(r.text)}`);
  },

  async anthropicCreateStreamAndCount() {
    const params = { model: modelID, max_tokens: n, messages: [{ role: "user", content: question }] };
    const m = await anthropic.messages.create(params);
    const chat = await chatText(params.messages);
    check(messageText(m) === chat.text, `messages ${JSON.stringify(messageText(m))} != chat ${JSON.stringify(chat.text)}`);
    const final = await anthropic.messages.stream(params).finalMessage();
    check(messageText(final) === messageText(m) && final.usage.output_tokens === m.usage.output_tokens,
      `stream ${JSON.stringify(final)} vs ${JSON.stringify(m)}`);
    const count = await anthropic.messages.countTokens({ model: modelID, messages: params.messages });
    check(count.input_tokens === m.usage.input_tokens + m.usage.cache_read_input_tokens,
      `count_tokens ${count.input_tokens} vs usage ${JSON.stringify(m.usage)}`);
  },

  async anthropicToolUseRoundTrip() {
    const tools = [{ name: "get_weather", description: "Current weather for a city", input_schema: weatherSchema }];
    const user = { role: "user", content: "What is the weather in Paris?" };
    if (!strictTools) {
      // A model not known to call tools: the call and its result go in as history.
      const follow = await anthropic.messages.create({ model: modelID, max_tokens: n, tools, messages: [
        user, { role: "assistant", content: [{ type: "tool_use", id: "toolu_1", name: "get_weather", input: { city: "Paris" } }] },
        { role: "user", content: [{ type: "tool_result", tool_use_id: "toolu_1", content: "sunny" }] },
      ] });
      check(["end_turn", "max_tokens"].includes(follow.stop_reason) && follow.content.length > 0,
        `after the tool: ${JSON.stringify(follow)}`);
      return;
    }
    const m = await anthropic.messages.create({ model: modelID, max_tokens: 200, tools, messages: [user] });
    const use = m.content.find((b) => b.type === "tool_use");
    check(m.stop_reason === "tool_use" && use?.input?.city === "Paris", `message ${JSON.stringify(m)}`);
    const follow = await anthropic.messages.create({ model: modelID, max_tokens: 200, tools, messages: [
      user, { role: "assistant", content: m.content },
      { role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: "sunny" }] },
    ] });
    check(messageText(follow) === "The tool said: sunny", `after the tool: ${JSON.stringify(follow)}`);
  },
};

await runTests(tests, `node ai ${version("ai")}, @ai-sdk/openai ${version("@ai-sdk/openai")}, @anthropic-ai/sdk ${version("@anthropic-ai/sdk")}`);

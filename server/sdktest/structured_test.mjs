// Structured outputs through the Vercel AI SDK: generateObject (and its successor, generateText
// with an object output) with a JSON schema, over the
// OpenAI provider's Responses API (its default) and its chat-completions model; each object
// must validate on the client's side (the SDK validates it against the schema).
//
// Usage: DFLASH_BASE_URL=http://127.0.0.1:8000/v1 node structured_test.mjs   (after npm ci here)
// Environment: DFLASH_BASE_URL (required), DFLASH_API_KEY, DFLASH_MODEL.
// The last line is "N passed, N failed"; the exit status is 1 when anything failed.

import { createOpenAI } from "@ai-sdk/openai";
import { generateObject, generateText, jsonSchema, Output } from "ai";
import { readFileSync } from "node:fs";
import { runTests } from "./sdkrun.mjs";

const baseURL = (process.env.DFLASH_BASE_URL || "").replace(/\/$/, "");
if (!baseURL) {
  console.error("DFLASH_BASE_URL is not set");
  process.exit(2);
}
const apiKey = process.env.DFLASH_API_KEY || "unused";
const version = (pkg) =>
  JSON.parse(readFileSync(new URL(`./node_modules/${pkg}/package.json`, import.meta.url), "utf8")).version;
async function firstModel() {
  const r = await fetch(`${baseURL}/models`, { headers: { Authorization: `Bearer ${apiKey}` } });
  return (await r.json()).data[0].id;
}
const modelID = process.env.DFLASH_MODEL || (await firstModel());
const openai = createOpenAI({ baseURL, apiKey });

const pkg = jsonSchema({
  type: "object",
  properties: {
    name: { type: "string", maxLength: 12 },
    stars: { type: "integer", minimum: 0, maximum: 999 },
    tags: { type: "array", items: { enum: ["go", "cli", "web"] }, maxItems: 3 },
  },
  required: ["name", "stars", "tags"],
  additionalProperties: false,
});

function check(cond, message) {
  if (!cond) throw new Error(message);
}

const tests = {
  async generateObjectResponses() {
    const r = await generateObject({ model: openai(modelID), schema: pkg, prompt: "Describe a Go package.", maxOutputTokens: 120, temperature: 0 });
    check(typeof r.object.name === "string" && Number.isInteger(r.object.stars) && Array.isArray(r.object.tags), `object ${JSON.stringify(r.object)}`);
  },
  async generateTextWithObjectOutput() {
    // generateObject's successor in this SDK: generateText with an object output.
    const r = await generateText({ model: openai(modelID), output: Output.object({ schema: pkg }), prompt: "Describe a Go package.", maxOutputTokens: 120, temperature: 0 });
    check(typeof r.output.name === "string" && Array.isArray(r.output.tags), `output ${JSON.stringify(r.output)}`);
  },
  async generateObjectChat() {
    const r = await generateObject({ model: openai.chat(modelID), schema: pkg, prompt: "Describe a Go package.", maxOutputTokens: 120, temperature: 0.7, seed: 5 });
    check(r.object.name.length <= 12 && r.object.stars >= 0 && r.object.stars <= 999, `object ${JSON.stringify(r.object)}`);
  },
};

await runTests(tests, `node ai ${version("ai")}, @ai-sdk/openai ${version("@ai-sdk/openai")}`);

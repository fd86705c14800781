package templatetest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/server"
	"github.com/dflash-mlx/dflash-mlx/server/servertest"
	"github.com/dflash-mlx/dflash-mlx/tokenizer"
)

// templateBackend renders chats with a real chat template, as the serve command's backend
// does (tool-call arguments as a string for Qwen3's template, as an object for the
// qwen3_coder ones, which iterate their items), tokenizes one byte per token, and answers
// with a scripted completion of the prompt.
type templateBackend struct {
	tpl    *tokenizer.ChatTemplate
	format server.ToolCallFormat
	answer func(prompt string) []string

	mu      sync.Mutex
	prompts []string
}

func (b *templateBackend) ModelID() string                       { return "qwen-template" }
func (b *templateBackend) ContextLength() int                    { return 1 << 16 }
func (b *templateBackend) ToolCallFormat() server.ToolCallFormat { return b.format }

func (b *templateBackend) ChatPrompt(msgs []server.ChatMessage, tools []server.Tool, opts server.TemplateOptions) (server.Prompt, error) {
	tm := make([]tokenizer.Message, 0, len(msgs))
	for _, m := range msgs {
		content := m.Content
		msg := tokenizer.Message{Role: m.Role, Content: &content, ToolCallID: m.ToolCallID, Name: m.Name}
		for _, c := range m.ToolCalls {
			args, _ := json.Marshal(c.Arguments)
			if b.format == server.ToolCallQwen3Coder {
				args = json.RawMessage(c.Arguments)
			}
			msg.ToolCalls = append(msg.ToolCalls, tokenizer.ToolCall{ID: c.ID, Type: "function",
				Function: tokenizer.FunctionCall{Name: c.Name, Arguments: args}})
		}
		tm = append(tm, msg)
	}
	co := tokenizer.ChatOptions{AddGenerationPrompt: true, EnableThinking: opts.EnableThinking}
	for _, t := range tools {
		co.Tools = append(co.Tools, t.Raw)
	}
	text, err := b.tpl.Render(tm, co, nil)
	if err != nil {
		return server.Prompt{}, err
	}
	text += opts.ResponsePrefix
	b.mu.Lock()
	b.prompts = append(b.prompts, text)
	b.mu.Unlock()
	open := strings.LastIndex(text, "<think>") > strings.LastIndex(text, "</think>")
	return server.Prompt{Tokens: servertest.Tokenize(text), OpensInThinking: open}, nil
}

func (b *templateBackend) TextPrompt(text string) (server.Prompt, error) {
	return server.Prompt{Tokens: servertest.Tokenize(text)}, nil
}

func (b *templateBackend) Generate(ctx context.Context, req server.GenerateRequest, emit func(server.Delta) error) (server.GenerateResult, error) {
	res := server.GenerateResult{FinishReason: server.FinishStop, PromptTokens: len(req.Prompt)}
	for _, d := range b.answer(servertest.Detokenize(req.Prompt)) {
		if err := ctx.Err(); err != nil {
			res.FinishReason = server.FinishCancelled
			return res, err
		}
		res.CompletionTokens++
		if err := emit(server.Delta{Text: d, Tokens: 1}); err != nil {
			res.FinishReason = server.FinishCancelled
			return res, err
		}
	}
	return res, nil
}

// lastPrompt is the prompt of the latest request.
func (b *templateBackend) lastPrompt() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.prompts[len(b.prompts)-1]
}

// generation is a template under test: its source, its format, and the model's call of
// get_weather(city="Paris", days=3) written in that format, in pieces that split the
// markers as a tokenizer may. forced is the rest of the call after a named tool_choice's
// prefix, which already opened the call up to the arguments.
type generation struct {
	name, source string
	format       server.ToolCallFormat
	call, forced []string
	// historyCall is how the template renders that call in a later turn.
	historyCall string
}

func repoRoot(t *testing.T) string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the test source")
	}
	return filepath.Join(filepath.Dir(file), "..", "..")
}

func generations(t *testing.T) []generation {
	var gens []generation
	cfgPath := filepath.Join(repoRoot(t), "third_party", "testdata", "qwen3", "tokenizer_config.json")
	if data, err := os.ReadFile(cfgPath); err == nil {
		var cfg struct {
			ChatTemplate string `json:"chat_template"`
		}
		if err := json.Unmarshal(data, &cfg); err != nil {
			t.Fatalf("%s: %v", cfgPath, err)
		}
		gens = append(gens, generation{name: "qwen3", source: cfg.ChatTemplate, format: server.ToolCallJSON,
			call:        []string{"<tool", "_call>\n{\"name\": \"get_weather\", ", "\"arguments\": {\"city\": \"Paris\", \"days\": 3}}", "\n</tool_call>"},
			forced:      []string{"{\"city\": \"Paris\", ", "\"days\": 3}}\n</tool_call>"},
			historyCall: "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\",\"days\":3}}\n</tool_call>"})
	} else if os.Getenv("DFLASH_REQUIRE_REFERENCE") == "1" {
		t.Fatalf("reference missing: Qwen3's real chat template (%v); run make deps", err)
	} else {
		t.Logf("skipping Qwen3's real template: %v (run make deps)", err)
	}
	standin, err := os.ReadFile(filepath.Join("testdata", "qwen3_coder_standin.jinja"))
	if err != nil {
		t.Fatal(err)
	}
	gens = append(gens, generation{name: "qwen3.5 stand-in", source: string(standin), format: server.ToolCallQwen3Coder,
		// Thinking is on by default: the generation prompt opens <think>, so the model reasons
		// before it calls.
		call: []string{"I should look it up.\n</think>\n\n", "<tool_call>\n<func", "tion=get_weather>\n<parameter=city>\nPar", "is\n</parameter>\n<parameter=days>\n3\n</param",
			"eter>\n</function>\n</tool_call>"},
		forced:      []string{"<parameter=city>\nParis\n</parameter>\n", "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"},
		historyCall: "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"})
	return gens
}

var weatherSchema = map[string]any{"type": "object", "properties": map[string]any{
	"city": map[string]any{"type": "string"}, "days": map[string]any{"type": "integer"}}, "required": []string{"city"}}

// chatTool is get_weather in the chat-completions shape, its keys in the order OpenAI's SDKs
// send them (a Go map would sort them, and templates render the tool as it was sent).
func chatTool() json.RawMessage {
	schema, _ := json.Marshal(weatherSchema)
	return json.RawMessage(`{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.", ` +
		`"parameters": ` + string(schema) + `}}`)
}

// api is one of the three chat APIs: how to ask for a tool call under a tool_choice, how
// to send the call and its result back, and how to read the call out of an answer.
type api struct {
	name, path string
	ask        func(choice string) map[string]any
	followUp   func(callID string) map[string]any
	calls      func(answer map[string]any) []string // "name arguments"
}

var apis = []api{
	{
		name: "chat completions", path: "/v1/chat/completions",
		ask: func(choice string) map[string]any {
			body := map[string]any{"messages": []any{map[string]any{"role": "user", "content": "Weather in Paris?"}},
				"tools": []any{chatTool()}}
			switch choice {
			case "required":
				body["tool_choice"] = "required"
			case "named":
				body["tool_choice"] = map[string]any{"type": "function", "function": map[string]any{"name": "get_weather"}}
			}
			return body
		},
		followUp: func(callID string) map[string]any {
			return map[string]any{"messages": []any{map[string]any{"role": "user", "content": "Weather in Paris?"},
				map[string]any{"role": "assistant", "content": "", "tool_calls": []any{map[string]any{"id": callID, "type": "function",
					"function": map[string]any{"name": "get_weather", "arguments": `{"city":"Paris","days":3}`}}}},
				map[string]any{"role": "tool", "tool_call_id": callID, "content": "sunny"}},
				"tools": []any{chatTool()}}
		},
		calls: func(a map[string]any) []string {
			var out []string
			msg := a["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)
			calls, _ := msg["tool_calls"].([]any)
			for _, c := range calls {
				fn := c.(map[string]any)["function"].(map[string]any)
				out = append(out, fmt.Sprint(fn["name"], " ", fn["arguments"]))
			}
			return out
		},
	},
	{
		name: "responses", path: "/v1/responses",
		ask: func(choice string) map[string]any {
			body := map[string]any{"input": "Weather in Paris?", "tools": []any{map[string]any{"type": "function",
				"name": "get_weather", "description": "Weather in a city.", "parameters": weatherSchema}}}
			switch choice {
			case "required":
				body["tool_choice"] = "required"
			case "named":
				body["tool_choice"] = map[string]any{"type": "function", "name": "get_weather"}
			}
			return body
		},
		followUp: func(callID string) map[string]any {
			return map[string]any{"input": []any{map[string]any{"role": "user", "content": "Weather in Paris?"},
				map[string]any{"type": "function_call", "call_id": callID, "name": "get_weather", "arguments": `{"city":"Paris","days":3}`},
				map[string]any{"type": "function_call_output", "call_id": callID, "output": "sunny"}},
				"tools": []any{map[string]any{"type": "function", "name": "get_weather", "description": "Weather in a city.",
					"parameters": weatherSchema}}}
		},
		calls: func(a map[string]any) []string {
			var out []string
			for _, it := range a["output"].([]any) {
				if m := it.(map[string]any); m["type"] == "function_call" {
					out = append(out, fmt.Sprint(m["name"], " ", m["arguments"]))
				}
			}
			return out
		},
	},
	{
		name: "messages", path: "/v1/messages",
		ask: func(choice string) map[string]any {
			body := map[string]any{"max_tokens": 200, "messages": []any{map[string]any{"role": "user", "content": "Weather in Paris?"}},
				"tools": []any{map[string]any{"name": "get_weather", "description": "Weather in a city.", "input_schema": weatherSchema}}}
			switch choice {
			case "required":
				body["tool_choice"] = map[string]any{"type": "any"}
			case "named":
				body["tool_choice"] = map[string]any{"type": "tool", "name": "get_weather"}
			}
			return body
		},
		followUp: func(callID string) map[string]any {
			return map[string]any{"max_tokens": 200, "messages": []any{map[string]any{"role": "user", "content": "Weather in Paris?"},
				map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "tool_use", "id": callID,
					"name": "get_weather", "input": map[string]any{"city": "Paris", "days": 3}}}},
				map[string]any{"role": "user", "content": []any{map[string]any{"type": "tool_result", "tool_use_id": callID,
					"content": "sunny"}}}},
				"tools": []any{map[string]any{"name": "get_weather", "description": "Weather in a city.", "input_schema": weatherSchema}}}
		},
		calls: func(a map[string]any) []string {
			var out []string
			for _, blk := range a["content"].([]any) {
				if m := blk.(map[string]any); m["type"] == "tool_use" {
					input, _ := json.Marshal(m["input"])
					out = append(out, fmt.Sprint(m["name"], " ", string(input)))
				}
			}
			return out
		},
	},
}

// For each generation's real template: the format is detected from the template; a tool
// call the model writes in that format (free, required, or named, whose prefix the
// template's generation prompt is followed by) comes out of all three APIs as the same
// call with arguments typed by the schema; the three render the same tool prompt; and a
// call sent back with its result is rendered in the template's own form.
func TestRealTemplatesThroughAllAPIs(t *testing.T) {
	for _, gen := range generations(t) {
		t.Run(gen.name, func(t *testing.T) {
			if got := server.DetectToolCallFormat(gen.source); got != gen.format {
				t.Fatalf("detected %s, want %s", got, gen.format)
			}
			tpl, err := tokenizer.ParseChatTemplate(gen.source)
			if err != nil {
				t.Fatalf("parsing the template: %v", err)
			}
			backend := &templateBackend{tpl: tpl, format: gen.format, answer: func(prompt string) []string {
				switch {
				case strings.HasSuffix(prompt, "<tool_call>\n"):
					_, rest, _ := strings.Cut(strings.Join(gen.call, ""), "<tool_call>\n")
					return []string{rest}
				case strings.HasSuffix(prompt, "\"arguments\": "), strings.HasSuffix(prompt, "<function=get_weather>\n"):
					return gen.forced
				case strings.Contains(prompt, "<tool_response>\nsunny"):
					return []string{"It is sunny."}
				}
				return gen.call
			}}
			srv := servertest.Start(t, server.Config{}, backend, nil)
			for _, choice := range []string{"auto", "required", "named"} {
				var prompts []string
				for _, a := range apis {
					answer := post(t, srv.URL+a.path, a.ask(choice))
					prompts = append(prompts, backend.lastPrompt())
					if got := a.calls(answer); len(got) != 1 || got[0] != `get_weather {"city":"Paris","days":3}` {
						t.Errorf("%s, tool_choice %s: calls %q in %v", a.name, choice, got, answer)
					}
				}
				for i, p := range prompts {
					if p != prompts[0] {
						t.Errorf("tool_choice %s: %s rendered another prompt than chat completions:\n%s", choice, apis[i].name, firstDiff(p, prompts[0]))
					}
				}
				if !strings.Contains(prompts[0], `"name": "get_weather"`) {
					t.Errorf("the tool is not declared in the prompt:\n%s", prompts[0])
				}
			}
			var prompts []string
			for _, a := range apis {
				post(t, srv.URL+a.path, a.followUp("call_1"))
				prompts = append(prompts, backend.lastPrompt())
			}
			if !strings.Contains(prompts[0], gen.historyCall) || !strings.Contains(prompts[0], "sunny") {
				t.Errorf("the follow-up prompt lacks the call in the template's form %q or its result:\n%s", gen.historyCall, prompts[0])
			}
			for i, p := range prompts {
				if p != prompts[0] {
					t.Errorf("follow-up: %s rendered another prompt than chat completions:\n%s", apis[i].name, firstDiff(p, prompts[0]))
				}
			}
		})
	}
}

func post(t *testing.T, url string, body map[string]any) map[string]any {
	t.Helper()
	data, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", strings.NewReader(string(data)))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: %d %v %v", url, resp.StatusCode, err, out)
	}
	return out
}

// firstDiff shows where two prompts part.
func firstDiff(a, b string) string {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	from := max(i-80, 0)
	return fmt.Sprintf("at byte %d:\n%q\nvs\n%q", i, a[from:min(i+80, len(a))], b[from:min(i+80, len(b))])
}

// Agents put system turns where Qwen3.5's template refuses them (it allows one, first):
// Codex sends developer messages after its instructions, Claude Code system messages
// mid-conversation. Both render, with one system turn at the start.
func TestAgentSystemTurnsRenderWithQwen35Template(t *testing.T) {
	source, err := os.ReadFile(filepath.Join("testdata", "qwen3_coder_standin.jinja"))
	if err != nil {
		t.Fatal(err)
	}
	tpl, err := tokenizer.ParseChatTemplate(string(source))
	if err != nil {
		t.Fatal(err)
	}
	backend := &templateBackend{tpl: tpl, format: server.ToolCallQwen3Coder, answer: func(string) []string {
		return []string{"</think>\n\n", "Done."}
	}}
	srv := servertest.Start(t, server.Config{}, backend, nil)
	for _, tt := range []struct {
		path string
		body map[string]any
	}{
		{"/v1/responses", map[string]any{"instructions": "You are a coding agent.", "input": []any{
			map[string]any{"role": "developer", "content": "Sandbox: read-only."},
			map[string]any{"role": "user", "content": "List the files."}}}},
		{"/v1/messages", map[string]any{"max_tokens": 50, "system": "You are a coding agent.", "messages": []any{
			map[string]any{"role": "user", "content": "List the files."},
			map[string]any{"role": "system", "content": "Sandbox: read-only."},
			map[string]any{"role": "user", "content": "Go on."}}}},
	} {
		post(t, srv.URL+tt.path, tt.body)
		prompt := backend.lastPrompt()
		if n := strings.Count(prompt, "<|im_start|>system"); n != 1 || !strings.HasPrefix(prompt, "<|im_start|>system\nYou are a coding agent.") ||
			!strings.Contains(prompt, "Sandbox: read-only.") {
			t.Errorf("%s: %d system turns in\n%s", tt.path, n, prompt)
		}
	}
}

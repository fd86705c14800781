package server_test

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/server"
	"github.com/dflash-mlx/dflash-mlx/server/servertest"
)

// responseText joins the output_text parts of a response object's message items.
func responseText(resp any) string {
	var b strings.Builder
	items, _ := jsonPath(resp, "output").([]any)
	for _, it := range items {
		if jsonPath(it, "type") != "message" {
			continue
		}
		parts, _ := jsonPath(it, "content").([]any)
		for _, p := range parts {
			b.WriteString(str(jsonPath(p, "text")))
		}
	}
	return b.String()
}

// A plain answer: the stream's events come in the documented order with sequence numbers
// 0, 1, 2, ..., its deltas add up to the full answer's text, its final usage is the full
// answer's, and the text is what chat completions answers for the same conversation.
func TestResponsesStreamEqualsFullAnswerAndChat(t *testing.T) {
	srv := newFakeServer(t, server.Config{}, &servertest.Fake{})
	body := map[string]any{"input": "[[id:resp1]] hello", "instructions": "Be brief.", "max_output_tokens": 200}
	full := postJSONOK(t, srv.URL+"/v1/responses", body)
	if full["object"] != "response" || full["status"] != "completed" || !strings.HasPrefix(str(full["id"]), "resp_") {
		t.Fatalf("response %v", full)
	}
	text := responseText(full)
	if !strings.HasPrefix(text, "resp1-") {
		t.Fatalf("text %q", text)
	}
	chat := chatOnce(t, srv.URL, map[string]any{"messages": []map[string]any{
		{"role": "system", "content": "Be brief."}, {"role": "user", "content": "[[id:resp1]] hello"}}, "max_tokens": 200})
	if chat.Content != text {
		t.Errorf("responses text %q differs from chat completions' %q", text, chat.Content)
	}
	if u := jsonPath(full, "usage"); num(jsonPath(u, "input_tokens")) != chat.Usage.PromptTokens ||
		num(jsonPath(u, "output_tokens")) != chat.Usage.CompletionTokens {
		t.Errorf("usage %v differs from chat's %+v", u, chat.Usage)
	}

	body["stream"] = true
	events := postNamedStream(t, srv.URL+"/v1/responses", body)
	var names []string
	var deltas strings.Builder
	for i, ev := range events {
		if num(ev.Data["sequence_number"]) != i {
			t.Fatalf("event %d (%s) has sequence_number %v", i, ev.Name, ev.Data["sequence_number"])
		}
		if ev.Name == "response.output_text.delta" {
			deltas.WriteString(str(ev.Data["delta"]))
			continue
		}
		names = append(names, ev.Name)
	}
	want := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
		"response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"}
	if !slices.Equal(names, want) {
		t.Fatalf("events %v, want %v (deltas aside)", names, want)
	}
	if deltas.String() != text {
		t.Errorf("streamed text %q, full %q", deltas.String(), text)
	}
	last := events[len(events)-1].Data["response"]
	if responseText(last) != text || num(jsonPath(last, "usage", "output_tokens")) != num(jsonPath(full, "usage", "output_tokens")) ||
		num(jsonPath(last, "usage", "input_tokens")) != num(jsonPath(full, "usage", "input_tokens")) {
		t.Errorf("completed response %v differs from the full answer %v", last, full)
	}
	if jsonPath(last, "dflash") == nil {
		t.Error("no dflash statistics on the completed response")
	}
}

// A reasoning model's <think> text is a reasoning item, not output text.
func TestResponsesReasoningItem(t *testing.T) {
	fake := &servertest.Fake{Script: func(servertest.Input) []string {
		return []string{"<think>\nweigh", "ing it</think>\n\n", "The answer."}
	}}
	srv := newFakeServer(t, server.Config{}, fake)
	full := postJSONOK(t, srv.URL+"/v1/responses", map[string]any{"input": "q"})
	if k0, k1 := jsonPath(full, "output", 0, "type"), jsonPath(full, "output", 1, "type"); k0 != "reasoning" || k1 != "message" {
		t.Fatalf("output %v", full["output"])
	}
	if got := str(jsonPath(full, "output", 0, "content", 0, "text")); got != "weighing it" {
		t.Errorf("reasoning %q", got)
	}
	if got := responseText(full); got != "The answer." {
		t.Errorf("text %q", got)
	}
	// One token a delta; the second delta is the one that begins inside <think>.
	if r, o := num(jsonPath(full, "usage", "output_tokens_details", "reasoning_tokens")), num(jsonPath(full, "usage", "output_tokens")); r != 1 || o != 3 {
		t.Errorf("reasoning_tokens %d of output_tokens %d, want 1 of 3", r, o)
	}
	events := postNamedStream(t, srv.URL+"/v1/responses", map[string]any{"input": "q", "stream": true})
	var reasoning strings.Builder
	for _, ev := range events {
		if ev.Name == "response.reasoning_text.delta" {
			reasoning.WriteString(str(ev.Data["delta"]))
			if num(ev.Data["output_index"]) != 0 {
				t.Errorf("reasoning delta at output_index %v", ev.Data["output_index"])
			}
		}
		if ev.Name == "response.output_text.delta" && num(ev.Data["output_index"]) != 1 {
			t.Errorf("text delta at output_index %v", ev.Data["output_index"])
		}
	}
	if reasoning.String() != "weighing it" {
		t.Errorf("streamed reasoning %q", reasoning.String())
	}
}

// Chaining by previous_response_id replays the stored turns: the second answer is the one
// chat completions gives for the whole conversation without the first turn's instructions
// (the fake's answer is a function of the whole prompt), so the history is there and the
// instructions did not carry over.
func TestResponsesChainByPreviousResponseID(t *testing.T) {
	srv := newFakeServer(t, server.Config{}, &servertest.Fake{})
	first := postJSONOK(t, srv.URL+"/v1/responses", map[string]any{"input": "first", "instructions": "[[id:instr]]"})
	if !strings.HasPrefix(responseText(first), "instr-") {
		t.Fatalf("first answer %q should carry the instructions' tag", responseText(first))
	}
	second := postJSONOK(t, srv.URL+"/v1/responses", map[string]any{"input": "second", "previous_response_id": first["id"]})
	if second["previous_response_id"] != first["id"] {
		t.Errorf("previous_response_id echoed as %v", second["previous_response_id"])
	}
	chat := chatOnce(t, srv.URL, map[string]any{"messages": []map[string]any{
		{"role": "user", "content": "first"}, {"role": "assistant", "content": responseText(first)},
		{"role": "user", "content": "second"}}})
	if got := responseText(second); got != chat.Content {
		t.Errorf("chained answer %q, chat completions on the same conversation %q", got, chat.Content)
	}

	got := do200(t, http.MethodGet, srv.URL+"/v1/responses/"+str(first["id"]))
	if responseText(got) != responseText(first) || got["id"] != first["id"] {
		t.Errorf("GET returned %v", got)
	}
	del := do200(t, http.MethodDelete, srv.URL+"/v1/responses/"+str(first["id"]))
	if del["deleted"] != true || del["object"] != "response.deleted" {
		t.Errorf("DELETE returned %v", del)
	}
	resp, data := do(t, http.MethodGet, srv.URL+"/v1/responses/"+str(first["id"]), nil)
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(data), `"error"`) {
		t.Errorf("GET after DELETE: %d %s", resp.StatusCode, data)
	}
	// store: false keeps nothing.
	unstored := postJSONOK(t, srv.URL+"/v1/responses", map[string]any{"input": "x", "store": false})
	if resp, _ := do(t, http.MethodGet, srv.URL+"/v1/responses/"+str(unstored["id"]), nil); resp.StatusCode != http.StatusNotFound {
		t.Errorf("a store:false response was kept: %d", resp.StatusCode)
	}
}

func do200(t *testing.T, method, url string) map[string]any {
	t.Helper()
	resp, data := do(t, method, url, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s %s: %d %s", method, url, resp.StatusCode, data)
	}
	var out map[string]any
	decode(t, data, &out)
	return out
}

// toolFakes are fakes of both tool-call formats whose model calls get_weather(city="Paris",
// days=3) when offered tools, and answers with the tool's result after it.
func toolFakes() map[string]*servertest.Fake {
	return map[string]*servertest.Fake{
		"json": {Script: servertest.AgentScript(servertest.ToolCallScript("get_weather", `{"city": "Paris", "days": 3}`))},
		"qwen3_coder": {ToolFormat: server.ToolCallQwen3Coder, Script: servertest.AgentScript(servertest.CoderToolCallScript(
			"get_weather", servertest.Param{Name: "city", Value: "Paris"}, servertest.Param{Name: "days", Value: "3"}))},
	}
}

// The function-tool round trip in both formats, streamed and not, chained by id and
// stateless: the call comes out as a function_call item with JSON arguments typed by the
// schema, and its function_call_output reaches the next prompt.
func TestResponsesFunctionCallRoundTrip(t *testing.T) {
	for format, fake := range toolFakes() {
		t.Run(format, func(t *testing.T) {
			srv := newFakeServer(t, server.Config{}, fake)
			for _, choice := range []any{nil, "required", map[string]any{"type": "function", "name": "get_weather"}} {
				body := map[string]any{"input": "Weather in Paris?", "tools": []any{weatherTool}}
				if choice != nil {
					body["tool_choice"] = choice
				}
				full := postJSONOK(t, srv.URL+"/v1/responses", body)
				var call map[string]any
				for _, it := range full["output"].([]any) {
					if jsonPath(it, "type") == "function_call" {
						call = it.(map[string]any)
					}
				}
				if call == nil || call["name"] != "get_weather" || call["arguments"] != `{"city":"Paris","days":3}` ||
					!strings.HasPrefix(str(call["call_id"]), "call_") || !strings.HasPrefix(str(call["id"]), "fc_") {
					t.Fatalf("tool_choice %v: output %v", choice, full["output"])
				}
				body["stream"] = true
				events := postNamedStream(t, srv.URL+"/v1/responses", body)
				var args, doneArgs string
				for _, ev := range events {
					switch ev.Name {
					case "response.output_item.added":
						// The item is announced with its name and call_id: clients build the call from it.
						if item := ev.Data["item"]; jsonPath(item, "type") == "function_call" && (jsonPath(item, "name") != "get_weather" ||
							len(str(jsonPath(item, "call_id"))) <= len("call_") || !strings.HasPrefix(str(jsonPath(item, "id")), "fc_")) {
							t.Errorf("tool_choice %v: function_call announced as %v", choice, item)
						}
					case "response.function_call_arguments.delta":
						args += str(ev.Data["delta"])
					case "response.function_call_arguments.done":
						doneArgs = str(ev.Data["arguments"])
					}
				}
				if args != `{"city":"Paris","days":3}` || doneArgs != args {
					t.Errorf("tool_choice %v: streamed arguments %q / %q", choice, args, doneArgs)
				}

				// Chained by id: only the output goes back.
				next := postJSONOK(t, srv.URL+"/v1/responses", map[string]any{"previous_response_id": full["id"],
					"tools": []any{weatherTool}, "input": []any{map[string]any{"type": "function_call_output",
						"call_id": call["call_id"], "output": "sunny, 24 C"}}})
				if got := responseText(next); got != "The tool said: sunny, 24 C" {
					t.Errorf("chained answer after the tool result: %q", got)
				}
				// Stateless: the whole conversation, the call echoed back as an item.
				stateless := postJSONOK(t, srv.URL+"/v1/responses", map[string]any{"store": false, "tools": []any{weatherTool},
					"input": []any{
						map[string]any{"role": "user", "content": "Weather in Paris?"},
						map[string]any{"type": "function_call", "call_id": call["call_id"], "name": "get_weather", "arguments": call["arguments"]},
						map[string]any{"type": "function_call_output", "call_id": call["call_id"], "output": "rain"}}})
				if got := responseText(stateless); got != "The tool said: rain" {
					t.Errorf("stateless answer after the tool result: %q", got)
				}
				// item_reference resolves a stored output item.
				ref := postJSONOK(t, srv.URL+"/v1/responses", map[string]any{"tools": []any{weatherTool}, "input": []any{
					map[string]any{"role": "user", "content": "Weather in Paris?"},
					map[string]any{"type": "item_reference", "id": call["id"]},
					map[string]any{"type": "function_call_output", "call_id": call["call_id"], "output": "fog"}}})
				if got := responseText(ref); got != "The tool said: fog" {
					t.Errorf("answer with an item_reference to the call: %q", got)
				}
			}
		})
	}
}

// input_tokens counts the prompt a Responses request would make, chained turns included.
func TestResponsesInputTokens(t *testing.T) {
	srv := newFakeServer(t, server.Config{}, &servertest.Fake{})
	first := postJSONOK(t, srv.URL+"/v1/responses", map[string]any{"input": "first"})
	body := map[string]any{"input": "second", "instructions": "Be brief.", "previous_response_id": first["id"]}
	count := postJSONOK(t, srv.URL+"/v1/responses/input_tokens", body)
	resp := postJSONOK(t, srv.URL+"/v1/responses", body)
	if n := num(count["input_tokens"]); n == 0 || n != num(jsonPath(resp, "usage", "input_tokens")) || count["object"] != "response.input_tokens" {
		t.Errorf("input_tokens %v, the response's usage %v", count, resp["usage"])
	}
}

package server_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/server"
	"github.com/dflash-mlx/dflash-mlx/server/servertest"
)

// anthropicHeaders are what the anthropic SDK 2.x sends (its version date is newer than
// any this server knows; any is accepted).
var anthropicHeaders = []string{"anthropic-version", "2026-10-21"}

// messageText joins the text blocks of a message.
func messageText(msg any) string {
	var b strings.Builder
	blocks, _ := jsonPath(msg, "content").([]any)
	for _, blk := range blocks {
		if jsonPath(blk, "type") == "text" {
			b.WriteString(str(jsonPath(blk, "text")))
		}
	}
	return b.String()
}

// streamedMessage rebuilds a message from its events, as the SDK's accumulator does, and
// checks the event order: message_start, ping, blocks (start, deltas, stop, indices in
// order), message_delta, message_stop.
func streamedMessage(t *testing.T, events []namedEvent) (blocks []map[string]any, stopReason string, usage map[string]any) {
	t.Helper()
	if len(events) < 4 || events[0].Name != "message_start" || events[1].Name != "ping" ||
		events[len(events)-2].Name != "message_delta" || events[len(events)-1].Name != "message_stop" {
		names := make([]string, len(events))
		for i, ev := range events {
			names[i] = ev.Name
		}
		t.Fatalf("event order %v", names)
	}
	usage, _ = jsonPath(events[0].Data, "message", "usage").(map[string]any)
	open := -1
	for _, ev := range events[2 : len(events)-2] {
		idx := num(ev.Data["index"])
		switch ev.Name {
		case "content_block_start":
			if open != -1 || idx != len(blocks) {
				t.Fatalf("block %d starts while %d is open (have %d)", idx, open, len(blocks))
			}
			blk := ev.Data["content_block"].(map[string]any)
			if blk["type"] == "tool_use" {
				blk["partial"] = ""
			}
			blocks, open = append(blocks, blk), idx
		case "content_block_delta":
			if idx != open {
				t.Fatalf("delta for block %d while %d is open", idx, open)
			}
			d := ev.Data["delta"].(map[string]any)
			switch d["type"] {
			case "text_delta":
				blocks[idx]["text"] = str(blocks[idx]["text"]) + str(d["text"])
			case "thinking_delta":
				blocks[idx]["thinking"] = str(blocks[idx]["thinking"]) + str(d["thinking"])
			case "input_json_delta":
				blocks[idx]["partial"] = str(blocks[idx]["partial"]) + str(d["partial_json"])
			}
		case "content_block_stop":
			if idx != open {
				t.Fatalf("stop for block %d while %d is open", idx, open)
			}
			open = -1
		default:
			t.Fatalf("unexpected event %s", ev.Name)
		}
	}
	delta := events[len(events)-2].Data
	for k, v := range delta["usage"].(map[string]any) {
		usage[k] = v
	}
	return blocks, str(jsonPath(delta, "delta", "stop_reason")), usage
}

func TestMessagesStreamEqualsFullAnswerAndChat(t *testing.T) {
	srv := newFakeServer(t, server.Config{}, &servertest.Fake{})
	body := map[string]any{"model": "dflash-fake", "max_tokens": 300, "system": "Be brief.",
		"messages": []any{map[string]any{"role": "user", "content": "[[id:msg1]] hello"}}}
	full := postJSONOK(t, srv.URL+"/v1/messages", body, anthropicHeaders...)
	if full["type"] != "message" || full["role"] != "assistant" || full["stop_reason"] != "end_turn" ||
		!strings.HasPrefix(str(full["id"]), "msg_") {
		t.Fatalf("message %v", full)
	}
	text := messageText(full)
	chat := chatOnce(t, srv.URL, map[string]any{"messages": []map[string]any{
		{"role": "system", "content": "Be brief."}, {"role": "user", "content": "[[id:msg1]] hello"}}, "max_tokens": 300})
	if text != chat.Content || !strings.HasPrefix(text, "msg1-") {
		t.Errorf("messages text %q, chat completions' %q", text, chat.Content)
	}
	u := full["usage"].(map[string]any)
	if num(u["input_tokens"])+num(u["cache_read_input_tokens"]) != chat.Usage.PromptTokens ||
		num(u["output_tokens"]) != chat.Usage.CompletionTokens {
		t.Errorf("usage %v, chat's %+v", u, chat.Usage)
	}

	body["stream"] = true
	blocks, reason, su := streamedMessage(t, postNamedStream(t, srv.URL+"/v1/messages", body, anthropicHeaders...))
	if len(blocks) != 1 || blocks[0]["text"] != text || reason != "end_turn" {
		t.Errorf("streamed blocks %v (%s), full text %q", blocks, reason, text)
	}
	for _, k := range []string{"input_tokens", "output_tokens", "cache_read_input_tokens"} {
		if num(su[k]) != num(u[k]) {
			t.Errorf("streamed usage %s = %v, full %v", k, su[k], u[k])
		}
	}
}

// stop_sequences end the answer and are reported; max_tokens gives stop_reason max_tokens;
// thinking becomes a thinking block.
func TestMessagesStopReasons(t *testing.T) {
	fake := &servertest.Fake{Script: func(in servertest.Input) []string {
		if strings.Contains(in.Prompt, "think") {
			return []string{"<think>\nhm", "m</think>\n\n", "Done."}
		}
		return []string{"one ", "two ", "th", "ree ", "four"}
	}}
	srv := newFakeServer(t, server.Config{}, fake)
	user := []any{map[string]any{"role": "user", "content": "count"}}
	for _, stream := range []bool{false, true} {
		for _, tt := range []struct {
			name       string
			extra      map[string]any
			text, stop string
			seq        any
		}{
			{"stop sequence", map[string]any{"stop_sequences": []string{"xyz", "three"}}, "one two ", "stop_sequence", "three"},
			{"max tokens", map[string]any{"max_tokens": 2}, "one two ", "max_tokens", nil},
			{"end turn", nil, "one two three four", "end_turn", nil},
		} {
			body := map[string]any{"max_tokens": 100, "messages": user, "stream": stream}
			for k, v := range tt.extra {
				body[k] = v
			}
			var text, reason string
			var seq any
			if stream {
				events := postNamedStream(t, srv.URL+"/v1/messages", body, anthropicHeaders...)
				blocks, r, _ := streamedMessage(t, events)
				for _, b := range blocks {
					text += str(b["text"])
				}
				reason, seq = r, jsonPath(events[len(events)-2].Data, "delta", "stop_sequence")
			} else {
				msg := postJSONOK(t, srv.URL+"/v1/messages", body, anthropicHeaders...)
				text, reason, seq = messageText(msg), str(msg["stop_reason"]), msg["stop_sequence"]
			}
			if text != tt.text || reason != tt.stop || seq != tt.seq {
				t.Errorf("%s (stream %v): %q, %s, %v; want %q, %s, %v", tt.name, stream, text, reason, seq, tt.text, tt.stop, tt.seq)
			}
		}
	}
	msg := postJSONOK(t, srv.URL+"/v1/messages", map[string]any{"max_tokens": 100, "thinking": map[string]any{"type": "enabled",
		"budget_tokens": 50}, "messages": []any{map[string]any{"role": "user", "content": "think"}}}, anthropicHeaders...)
	if jsonPath(msg, "content", 0, "type") != "thinking" || jsonPath(msg, "content", 0, "thinking") != "hmm" ||
		messageText(msg) != "Done." {
		t.Errorf("thinking answer %v", msg["content"])
	}
}

// tool_use → tool_result in both tool-call formats, for every tool_choice that allows a
// call, streamed and not.
func TestMessagesToolUseRoundTrip(t *testing.T) {
	for format, fake := range toolFakes() {
		t.Run(format, func(t *testing.T) {
			srv := newFakeServer(t, server.Config{}, fake)
			user := map[string]any{"role": "user", "content": "Weather in Paris?"}
			for _, choice := range []any{nil, map[string]any{"type": "any"}, map[string]any{"type": "tool", "name": "get_weather"}} {
				body := map[string]any{"max_tokens": 200, "tools": []any{weatherToolAnthropic}, "messages": []any{user}}
				if choice != nil {
					body["tool_choice"] = choice
				}
				msg := postJSONOK(t, srv.URL+"/v1/messages", body, anthropicHeaders...)
				var use map[string]any
				for _, blk := range msg["content"].([]any) {
					if jsonPath(blk, "type") == "tool_use" {
						use = blk.(map[string]any)
					}
				}
				input, _ := use["input"].(map[string]any)
				if msg["stop_reason"] != "tool_use" || use["name"] != "get_weather" || input["city"] != "Paris" ||
					input["days"] != float64(3) || !strings.HasPrefix(str(use["id"]), "toolu_") {
					t.Fatalf("tool_choice %v: %v", choice, msg)
				}
				body["stream"] = true
				blocks, reason, _ := streamedMessage(t, postNamedStream(t, srv.URL+"/v1/messages", body, anthropicHeaders...))
				// content_block_start carries the tool_use's id and name: clients echo the block back.
				last := blocks[len(blocks)-1]
				if reason != "tool_use" || last["type"] != "tool_use" || last["partial"] != `{"city":"Paris","days":3}` ||
					last["name"] != "get_weather" || len(str(last["id"])) <= len("toolu_") || !strings.HasPrefix(str(last["id"]), "toolu_") {
					t.Errorf("tool_choice %v: streamed blocks %v (%s)", choice, blocks, reason)
				}

				next := postJSONOK(t, srv.URL+"/v1/messages", map[string]any{"max_tokens": 200, "tools": []any{weatherToolAnthropic},
					"messages": []any{user, map[string]any{"role": "assistant", "content": msg["content"]},
						map[string]any{"role": "user", "content": []any{map[string]any{"type": "tool_result",
							"tool_use_id": use["id"], "content": "sunny"}}}}}, anthropicHeaders...)
				if got := messageText(next); got != "The tool said: sunny" || next["stop_reason"] != "end_turn" {
					t.Errorf("answer after the tool result: %q (%v)", got, next["stop_reason"])
				}
			}
			// tool_choice none: the tools are not even offered, so the model answers in text.
			msg := postJSONOK(t, srv.URL+"/v1/messages", map[string]any{"max_tokens": 200, "tools": []any{weatherToolAnthropic},
				"tool_choice": map[string]any{"type": "none"}, "messages": []any{user}}, anthropicHeaders...)
			if msg["stop_reason"] != "end_turn" || slices.ContainsFunc(msg["content"].([]any), func(b any) bool {
				return jsonPath(b, "type") == "tool_use"
			}) {
				t.Errorf("tool_choice none: %v", msg)
			}
		})
	}
}

// count_tokens renders the prompt as a generation would: it equals the input tokens the
// generation reports.
func TestMessagesCountTokens(t *testing.T) {
	srv := newFakeServer(t, server.Config{}, &servertest.Fake{})
	conv := map[string]any{"system": []any{map[string]any{"type": "text", "text": "sys"}}, "tools": []any{weatherToolAnthropic},
		"messages": []any{map[string]any{"role": "user", "content": "hi"}, map[string]any{"role": "system", "content": "hook"},
			map[string]any{"role": "user", "content": "again"}}}
	count := postJSONOK(t, srv.URL+"/v1/messages/count_tokens", conv, anthropicHeaders...)
	conv["max_tokens"] = 10
	msg := postJSONOK(t, srv.URL+"/v1/messages", conv, anthropicHeaders...)
	u := msg["usage"].(map[string]any)
	if n := num(count["input_tokens"]); n == 0 || n != num(u["input_tokens"])+num(u["cache_read_input_tokens"]) {
		t.Errorf("count_tokens %v, the generation's usage %v", count, u)
	}
}

// The key is accepted as x-api-key and as a Bearer token; a wrong one gets Anthropic's 401.
func TestMessagesAuth(t *testing.T) {
	srv := newFakeServer(t, server.Config{APIKey: "sekret"}, &servertest.Fake{})
	body := map[string]any{"max_tokens": 5, "messages": []any{map[string]any{"role": "user", "content": "hi"}}}
	postJSONOK(t, srv.URL+"/v1/messages", body, "x-api-key", "sekret")
	postJSONOK(t, srv.URL+"/v1/messages", body, "Authorization", "Bearer sekret")
	postJSONOK(t, srv.URL+"/v1/responses", map[string]any{"input": "hi"}, "Authorization", "Bearer sekret")
	resp, data := do(t, "POST", srv.URL+"/v1/messages", body, "x-api-key", "wrong")
	var e map[string]any
	decode(t, data, &e)
	if resp.StatusCode != 401 || e["type"] != "error" || jsonPath(e, "error", "type") != "authentication_error" {
		t.Errorf("wrong key: %d %s", resp.StatusCode, data)
	}
}

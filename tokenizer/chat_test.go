package tokenizer

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// chatMLTemplate is a small template written for these tests.
const chatMLTemplate = `{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% if not loop.last %}{{ "\n" }}{% endif %}{% endfor %}
{% if add_generation_prompt %}
{{ "\n" }}<|assistant|>{% endif %}`

func TestApplyChatTemplateWithoutTemplate(t *testing.T) {
	tok := loadSynthetic(t, byteLevelTokenizerJSON(t), nil)
	msgs := []Message{NewMessage("system", "s"), NewMessage("user", "u")}
	if _, err := tok.ApplyChatTemplate(msgs, ChatOptions{}); !errors.Is(err, ErrNoChatTemplate) {
		t.Fatalf("err = %v, want ErrNoChatTemplate", err)
	}
	if got, want := PlainChatPrompt(msgs, true), "system: s\n\nuser: u\n\nassistant: "; got != want {
		t.Errorf("PlainChatPrompt = %q, want %q", got, want)
	}
}

func TestChatTemplateSelection(t *testing.T) {
	named := `{"chat_template": [{"name": "default", "template": "D{{ messages | length }}"}, {"name": "tool_use", "template": "T{{ tools | length }}"}, {"name": "rag", "template": "R"}]}`
	tok := loadSynthetic(t, byteLevelTokenizerJSON(t), map[string]string{"tokenizer_config.json": named})
	msgs := []Message{NewMessage("user", "u")}
	tools := []json.RawMessage{json.RawMessage(`{"type": "function"}`)}
	cases := []struct {
		opts ChatOptions
		want string
	}{
		{ChatOptions{}, "D1"},
		{ChatOptions{Tools: tools}, "T1"},
		{ChatOptions{Tools: []json.RawMessage{}}, "T0"}, // tools given, even empty: tool_use
		{ChatOptions{TemplateName: "rag"}, "R"},
	}
	for _, c := range cases {
		got, err := tok.ApplyChatTemplate(msgs, c.opts)
		if err != nil || got != c.want {
			t.Errorf("ApplyChatTemplate(%+v) = %q, %v; want %q", c.opts, got, err, c.want)
		}
	}
	if _, err := tok.ApplyChatTemplate(msgs, ChatOptions{TemplateName: "nope"}); err == nil || !strings.Contains(err.Error(), `"nope" not found`) {
		t.Errorf("unknown template name: err = %v", err)
	}
	if got := strings.Join(tok.ChatTemplateNames(), ","); got != "default,rag,tool_use" {
		t.Errorf("ChatTemplateNames = %s", got)
	}

	noDefault := `{"chat_template": [{"name": "a", "template": "A"}]}`
	tok2 := loadSynthetic(t, byteLevelTokenizerJSON(t), map[string]string{"tokenizer_config.json": noDefault})
	if _, err := tok2.ApplyChatTemplate(msgs, ChatOptions{}); err == nil || !strings.Contains(err.Error(), `none is named "default"`) {
		t.Errorf("no default template: err = %v", err)
	}
}

func TestChatTemplateFilesOverrideConfig(t *testing.T) {
	tok := loadSynthetic(t, byteLevelTokenizerJSON(t), map[string]string{
		"tokenizer_config.json":                 `{"chat_template": "from config", "eos_token": "<|end|>"}`,
		"chat_template.jinja":                   chatMLTemplate,
		"additional_chat_templates/short.jinja": `S{{ eos_token }}`,
		"additional_chat_templates/ignored.txt": `not a template`,
	})
	msgs := []Message{NewMessage("system", "be brief"), NewMessage("user", "hi")}
	got, err := tok.ApplyChatTemplate(msgs, ChatOptions{AddGenerationPrompt: true})
	if want := "<|system|>be brief\n<|user|>hi\n<|assistant|>"; err != nil || got != want {
		t.Fatalf("default template: %q, %v; want %q", got, err, want)
	}
	got, err = tok.ApplyChatTemplate(msgs, ChatOptions{TemplateName: "short"})
	if err != nil || got != "S<|end|>" {
		t.Fatalf("named file template with eos_token: %q, %v", got, err)
	}
	if src, _ := tok.ChatTemplateSource("default"); src != chatMLTemplate {
		t.Error("chat_template.jinja did not replace the config's template")
	}
}

func TestChatTemplateErrors(t *testing.T) {
	msgs := []Message{NewMessage("user", "u")}
	raiser, err := ParseChatTemplate(`{% if messages[0].role != 'system' %}{{ raise_exception('System message required') }}{% endif %}ok`)
	if err != nil {
		t.Fatal(err)
	}
	_, err = raiser.Render(msgs, ChatOptions{}, nil)
	if !errors.Is(err, ErrTemplateException) || !strings.Contains(err.Error(), "System message required") {
		t.Errorf("raise_exception: err = %v, want ErrTemplateException with the message", err)
	}
	if out, err := raiser.Render([]Message{NewMessage("system", "s")}, ChatOptions{}, nil); err != nil || out != "ok" {
		t.Errorf("no raise: %q, %v", out, err)
	}

	source := "{% for m in messages %}{{ m.content }"
	_, err = ParseChatTemplate(source)
	if err == nil || strings.Contains(err.Error(), source) {
		t.Errorf("parse error = %v; want an error that does not quote the whole source", err)
	}

	ok, _ := ParseChatTemplate(chatMLTemplate)
	if _, err := ok.Render(nil, ChatOptions{}, nil); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("empty conversation: err = %v", err)
	}
	if _, err := ok.Render(msgs, ChatOptions{Variables: map[string]json.RawMessage{"messages": json.RawMessage(`[]`)}}, nil); err == nil {
		t.Error("a variable named messages must be rejected")
	}
	if _, err := ok.Render(msgs, ChatOptions{Variables: map[string]json.RawMessage{"x": json.RawMessage(`{bad`)}}, nil); err == nil {
		t.Error("a malformed variable must be rejected")
	}
	if _, err := ok.Render(msgs, ChatOptions{Tools: []json.RawMessage{json.RawMessage(`"not an object"`)}}, nil); err == nil {
		t.Error("a tool that is not an object must be rejected")
	}
}

func TestMessageJSONRoundTrip(t *testing.T) {
	in := `[{"role":"system","content":"s"},
	{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\": 1}"}}]},
	{"role":"tool","content":"r","tool_call_id":"c1","name":"f"},
	{"role":"user","content":[{"type":"text","text":"hi"}]},
	{"role":"assistant","content":"x","reasoning_content":""}]`
	var msgs []Message
	if err := json.Unmarshal([]byte(in), &msgs); err != nil {
		t.Fatal(err)
	}
	if msgs[1].Content != nil || string(msgs[1].ToolCalls[0].Function.Arguments) != `"{\"a\": 1}"` {
		t.Errorf("assistant tool call message decoded as %+v", msgs[1])
	}
	if len(msgs[3].ContentParts) != 1 || msgs[3].Content != nil {
		t.Errorf("content parts decoded as %+v", msgs[3])
	}
	if msgs[4].ReasoningContent == nil || *msgs[4].ReasoningContent != "" {
		t.Error("an empty reasoning_content must stay set")
	}
	out, err := json.Marshal(msgs)
	if err != nil {
		t.Fatal(err)
	}
	want := `[{"role":"system","content":"s"},{"role":"assistant","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\": 1}"}}]},{"role":"tool","content":"r","tool_call_id":"c1","name":"f"},{"role":"user","content":[{"type":"text","text":"hi"}]},{"role":"assistant","content":"x","reasoning_content":""}]`
	if string(out) != want {
		t.Errorf("Marshal =\n%s\nwant\n%s", out, want)
	}
	var bad Message
	if err := json.Unmarshal([]byte(`{"role":"user","content":5}`), &bad); err == nil {
		t.Error("numeric content must be rejected")
	}
}

func TestPyJSONDumps(t *testing.T) {
	cases := []struct {
		json string
		opts pyJSONOptions
		want string
	}{
		{`{"b": 1, "a": [1.0, 2.5, 1e16, 1e-5, 0.0001, 123456789.0, -0.0, 1e21, 5e-324]}`, defaultPyJSONOptions(),
			`{"b": 1, "a": [1.0, 2.5, 1e+16, 1e-05, 0.0001, 123456789.0, -0.0, 1e+21, 5e-324]}`},
		{`{"s": "é\n\"\\\t\u0001\u007f\u2028😀"}`, defaultPyJSONOptions(), `{"s": "é\n\"\\\t\u0001` + "\u007f\u2028😀" + `"}`},
		{`"é😀\u007f"`, pyJSONOptions{ensureASCII: true, itemSep: ", ", keySep: ": "}, `"\u00e9\ud83d\ude00\u007f"`},
		{`123456789012345678901234567890`, defaultPyJSONOptions(), `123456789012345678901234567890`},
		{`{"z": {}, "y": [], "x": null, "w": true}`, defaultPyJSONOptions(), `{"z": {}, "y": [], "x": null, "w": true}`},
		{`{"b": [1, {"c": 2}], "a": 0}`, pyJSONOptions{indent: strPtr("  "), itemSep: ",", keySep: ": ", sortKeys: true},
			"{\n  \"a\": 0,\n  \"b\": [\n    1,\n    {\n      \"c\": 2\n    }\n  ]\n}"},
		{`[1, 2]`, pyJSONOptions{itemSep: ",", keySep: ":"}, `[1,2]`},
	}
	for _, c := range cases {
		v, err := jsonToTemplateValue([]byte(c.json))
		if err != nil {
			t.Fatalf("%s: %v", c.json, err)
		}
		got, err := pyJSONDumps(v, c.opts)
		if err != nil || got != c.want {
			t.Errorf("pyJSONDumps(%s) = %q, %v\nwant %q", c.json, got, err, c.want)
		}
	}
}

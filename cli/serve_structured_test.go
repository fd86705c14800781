package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/dflash-mlx/dflash-mlx/internal/reftest"
)

// structuredSchemas are the schemas the structured-output tests ask answers for: objects
// with required and optional fields, enums, nested arrays, numbers with bounds, anyOf,
// string patterns and additionalProperties false. Strings and arrays are bounded so that
// a model that never closes them on its own still ends within the token budget.
var structuredSchemas = map[string]string{
	"person": `{"type":"object","properties":{"name":{"type":"string","maxLength":12},"age":{"type":"integer","minimum":0,"maximum":120},
		"email":{"type":"string","maxLength":20}},"required":["name","age"],"additionalProperties":false}`,
	"enum": `{"type":"object","properties":{"colour":{"enum":["red","green","blue"]},"bright":{"type":"boolean"}},
		"required":["colour","bright"],"additionalProperties":false}`,
	"nested": `{"type":"object","properties":{"rows":{"type":"array","minItems":1,"maxItems":3,
		"items":{"type":"array","maxItems":3,"items":{"type":"integer","minimum":-5,"maximum":5}}}},"required":["rows"],"additionalProperties":false}`,
	"bounds": `{"type":"object","properties":{"ratio":{"type":"number","minimum":0,"maximum":1},"count":{"type":"integer","exclusiveMinimum":0,"maximum":99}},
		"required":["ratio","count"],"additionalProperties":false}`,
	"anyof": `{"type":"object","properties":{"id":{"anyOf":[{"type":"integer","minimum":0,"maximum":999},{"type":"string","pattern":"^[a-z]{2,4}$"}]}},
		"required":["id"],"additionalProperties":false}`,
	"pattern": `{"type":"object","properties":{"code":{"type":"string","pattern":"^[A-Z]{3}-[0-9]{2}$"},"note":{"type":"string","maxLength":8}},
		"required":["code"],"additionalProperties":false}`,
	"refs": `{"type":"object","$defs":{"point":{"type":"object","properties":{"x":{"type":"integer","minimum":0,"maximum":9},"y":{"type":"integer","minimum":0,"maximum":9}},
		"required":["x","y"],"additionalProperties":false}},"properties":{"from":{"$ref":"#/$defs/point"},"to":{"$ref":"#/$defs/point"}},"required":["from","to"],"additionalProperties":false}`,
}

// validator compiles schema with an independent JSON Schema implementation.
func validator(t *testing.T, schema string) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("schema.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("schema.json")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// checkAnswer reports whether text is JSON valid for s.
func checkAnswer(s *jsonschema.Schema, text string) error {
	v, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		return fmt.Errorf("not JSON: %w", err)
	}
	return s.Validate(v)
}

// Structured outputs through `serve` on the Go-code pair (a model that writes Go, not
// JSON) and on the random demo pair (Qwen3's vocabulary): every answer of every API's JSON format parses and validates against its schema
// (an independent validator), greedy and sampled, with DFlash and with plain decoding, and
// greedy answers are the same either way; forced tool calls are calls of the tool with
// arguments valid for its schema; schemas the engine cannot enforce are refused before
// generation with the keyword and its place.
func TestServeStructuredOutputs(t *testing.T) {
	if testing.Short() {
		t.Skip("serves the Go-code pair twice and the demo pair (about three minutes on a CPU)")
	}
	pair := filepath.Join(reftest.RepoRoot(), "testdata", "gocode")
	// Fixed blocks: on a CPU the width policy would step plainly (a 16-token verify of this
	// pair costs several one-token steps), and the drafts under the constraint are the point.
	t.Setenv("DFLASH_ADAPTIVE_BLOCK", "0")
	dflash, logs := startServeArgs(t, "--target-model", filepath.Join(pair, "target"),
		"--draft-model", filepath.Join(pair, "draft"), "--model-id", "gocode")
	plain, plainLogs := startServeArgs(t, "--target-model", filepath.Join(pair, "target"), "--no-draft", "--model-id", "gocode")
	// The random demo pair with the Qwen3 tokenizer: a 151 669-token vocabulary.
	td, dd := tinyPair(t)
	demo, demoLogs := startServeArgs(t, "--target-model", td, "--draft-model", dd, "--block-size", "4", "--model-id", "gocode")
	servers := map[string]string{"dflash": dflash, "plain": plain, "demo": demo}
	user := []map[string]any{{"role": "user", "content": "Describe it as JSON."}}

	type answer struct {
		text, finish string
		drafted      float64
		err          error
	}
	ask := func(base, name string, seed int) answer {
		body := map[string]any{"model": "gocode", "messages": user, "max_tokens": 160,
			"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": name, "strict": true,
				"schema": json.RawMessage(structuredSchemas[name])}}}
		if seed >= 0 {
			body["temperature"], body["seed"] = 0.8, seed
		} else {
			body["temperature"] = 0
		}
		code, resp := postJSON(t, base+"/v1/chat/completions", body)
		if code != 200 {
			return answer{err: fmt.Errorf("status %d: %v", code, resp)}
		}
		ch := resp["choices"].([]any)[0].(map[string]any)
		a := answer{finish: ch["finish_reason"].(string)}
		a.text, _ = ch["message"].(map[string]any)["content"].(string)
		if d, ok := resp["dflash"].(map[string]any); ok {
			a.drafted, _ = d["drafted"].(float64)
		}
		return a
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	results := map[string]answer{}
	for name := range structuredSchemas {
		for server, base := range servers {
			for _, seed := range []int{-1, 7} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					a := ask(base, name, seed)
					mu.Lock()
					results[fmt.Sprintf("%s/%s/%d", name, server, seed)] = a
					mu.Unlock()
				}()
			}
		}
	}
	wg.Wait()
	drafted := 0.0
	for name, schema := range structuredSchemas {
		v := validator(t, schema)
		for server := range servers {
			for _, seed := range []int{-1, 7} {
				key := fmt.Sprintf("%s/%s/%d", name, server, seed)
				a := results[key]
				if a.err != nil {
					t.Errorf("%s: %v\n%s\n%s\n%s", key, a.err, logs.String(), plainLogs.String(), demoLogs.String())
					continue
				}
				if a.finish != "stop" {
					t.Errorf("%s: finish %q (the grammar's end should stop it): %q", key, a.finish, a.text)
				}
				if err := checkAnswer(v, a.text); err != nil {
					t.Errorf("%s: answer %q: %v", key, a.text, err)
				}
				if server != "plain" {
					drafted += a.drafted
				}
			}
		}
		if g, p := results[name+"/dflash/-1"], results[name+"/plain/-1"]; g.err == nil && p.err == nil && g.text != p.text {
			t.Errorf("%s: greedy answer with DFlash %q, plain %q", name, g.text, p.text)
		}
	}
	if drafted == 0 {
		t.Errorf("no answer drafted: DFlash was not exercised under the constraint")
	}

	t.Run("json_object", func(t *testing.T) {
		code, resp := postJSON(t, dflash+"/v1/chat/completions", map[string]any{"model": "gocode", "messages": user,
			"max_tokens": 120, "temperature": 0, "response_format": map[string]any{"type": "json_object"}})
		if code != 200 {
			t.Fatalf("status %d: %v", code, resp)
		}
		text := resp["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["content"].(string)
		var obj map[string]any
		if err := json.Unmarshal([]byte(text), &obj); err != nil && resp["choices"].([]any)[0].(map[string]any)["finish_reason"] == "stop" {
			t.Errorf("json_object answer %q is not an object: %v", text, err)
		}
	})
	t.Run("responses and messages formats", func(t *testing.T) {
		schema := structuredSchemas["enum"]
		v := validator(t, schema)
		code, resp := postJSON(t, dflash+"/v1/responses", map[string]any{"model": "gocode", "input": "Describe it as JSON.", "max_output_tokens": 80,
			"temperature": 0, "text": map[string]any{"format": map[string]any{"type": "json_schema", "name": "c", "strict": true, "schema": json.RawMessage(schema)}}})
		if code != 200 {
			t.Fatalf("responses: status %d: %v", code, resp)
		}
		var text string
		for _, item := range resp["output"].([]any) {
			if m := item.(map[string]any); m["type"] == "message" {
				text = m["content"].([]any)[0].(map[string]any)["text"].(string)
			}
		}
		if err := checkAnswer(v, text); err != nil {
			t.Errorf("responses: %q: %v", text, err)
		}
		if f := resp["text"].(map[string]any)["format"].(map[string]any); f["type"] != "json_schema" || f["name"] != "c" {
			t.Errorf("responses: text.format echoed as %v", f)
		}
		code, resp = postJSON(t, dflash+"/v1/messages", map[string]any{"model": "gocode", "max_tokens": 80, "temperature": 0,
			"messages": user, "output_config": map[string]any{"format": map[string]any{"type": "json_schema", "schema": json.RawMessage(schema)}}})
		if code != 200 {
			t.Fatalf("messages: status %d: %v", code, resp)
		}
		text = resp["content"].([]any)[0].(map[string]any)["text"].(string)
		if err := checkAnswer(v, text); err != nil {
			t.Errorf("messages: %q: %v", text, err)
		}
	})
	t.Run("forced tool calls", func(t *testing.T) {
		params := structuredSchemas["person"]
		v := validator(t, params)
		tools := []any{
			map[string]any{"type": "function", "function": map[string]any{"name": "add_person", "parameters": json.RawMessage(params), "strict": true}},
			map[string]any{"type": "function", "function": map[string]any{"name": "ping", "parameters": json.RawMessage(`{"type":"object","properties":{}}`)}},
		}
		for _, choice := range []any{"required", map[string]any{"type": "function", "function": map[string]any{"name": "add_person"}}} {
			for _, temp := range []float64{0, 0.9} {
				code, resp := postJSON(t, dflash+"/v1/chat/completions", map[string]any{"model": "gocode", "messages": user, "max_tokens": 120,
					"temperature": temp, "seed": 3, "tools": tools, "tool_choice": choice, "parallel_tool_calls": false})
				if code != 200 {
					t.Fatalf("tool_choice %v: status %d: %v", choice, code, resp)
				}
				msg := resp["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)
				calls, _ := msg["tool_calls"].([]any)
				if len(calls) != 1 {
					t.Errorf("tool_choice %v T=%v: %d calls in %v", choice, temp, len(calls), msg)
					continue
				}
				fn := calls[0].(map[string]any)["function"].(map[string]any)
				name, args := fn["name"].(string), fn["arguments"].(string)
				switch {
				case name == "add_person":
					if err := checkAnswer(v, args); err != nil {
						t.Errorf("tool_choice %v T=%v: arguments %s: %v", choice, temp, args, err)
					}
				case name == "ping" && choice == "required":
				default:
					t.Errorf("tool_choice %v: called %q", choice, name)
				}
			}
		}
	})
	t.Run("tools or a JSON answer", func(t *testing.T) {
		params, answer := structuredSchemas["person"], structuredSchemas["enum"]
		vp, va := validator(t, params), validator(t, answer)
		tools := []any{map[string]any{"type": "function", "function": map[string]any{"name": "add_person", "parameters": json.RawMessage(params)}}}
		for _, temp := range []float64{0, 0.9} {
			code, resp := postJSON(t, dflash+"/v1/chat/completions", map[string]any{"model": "gocode", "messages": user, "max_tokens": 120,
				"temperature": temp, "seed": 4, "tools": tools, "tool_choice": "auto", "parallel_tool_calls": false,
				"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "c", "schema": json.RawMessage(answer)}}})
			if code != 200 {
				t.Fatalf("status %d: %v", code, resp)
			}
			msg := resp["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)
			if calls, _ := msg["tool_calls"].([]any); len(calls) > 0 {
				fn := calls[0].(map[string]any)["function"].(map[string]any)
				if err := checkAnswer(vp, fn["arguments"].(string)); fn["name"] != "add_person" || err != nil {
					t.Errorf("T=%v: call %v: %v", temp, fn, err)
				}
				continue
			}
			if text, _ := msg["content"].(string); checkAnswer(va, text) != nil {
				t.Errorf("T=%v: neither a call nor a valid answer: %v", temp, msg)
			}
		}
	})
	t.Run("refused schemas", func(t *testing.T) {
		for _, c := range []struct {
			name, schema, param string
		}{
			{"unknown type", `{"type":"object","properties":{"a":{"type":"strnig"}}}`, "response_format.json_schema.schema.properties.a"},
			{"unsupported keyword", `{"type":"object","properties":{"a":{"not":{"type":"string"}}}}`, "response_format.json_schema.schema.properties.a"},
			{"ref cycle", `{"type":"object","properties":{"self":{"$ref":"#"}},"required":["self"]}`, "response_format.json_schema.schema"},
			{"missing ref", `{"type":"object","properties":{"a":{"$ref":"#/$defs/nope"}}}`, "response_format.json_schema.schema.properties.a"},
		} {
			code, resp := postJSON(t, dflash+"/v1/chat/completions", map[string]any{"model": "gocode", "messages": user, "max_tokens": 5,
				"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "x", "schema": json.RawMessage(c.schema)}}})
			e, _ := resp["error"].(map[string]any)
			if code != 400 || e == nil || !strings.HasPrefix(fmt.Sprint(e["param"]), c.param) {
				t.Errorf("%s: status %d, error %v; want 400 naming %s", c.name, code, e, c.param)
			}
		}
	})
	t.Run("sdks", func(t *testing.T) {
		py := reftest.Python(t)
		if err := exec.Command(py, "-c", "import openai, pydantic").Run(); err != nil {
			reftest.Missing(t, "the openai Python SDK and pydantic in "+py)
		}
		runSDKScript(t, 5*time.Minute, py, "structured_test.py", dflash, "gocode", logs)
		runSDKScript(t, 5*time.Minute, sdkNode(t, "ai", "@ai-sdk/openai"), "structured_test.mjs", dflash, "gocode", logs)
	})
}

// run --grammar and --json-schema: the answer follows the grammar (here one of two words,
// whatever the model would say), and a grammar or schema the engine cannot use is an exit
// status of 2 with a message naming the flag, before any token.
func TestRunGrammarFlags(t *testing.T) {
	if testing.Short() {
		t.Skip("loads the Go-code pair a few times")
	}
	target := filepath.Join(reftest.RepoRoot(), "testdata", "gocode", "target")
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	colour := write("colour.lark", "start: \"red\" | \"green\"\n")
	out, errOut, code := runCLI(t, "run", "--target-model", target, "--no-draft", "--prompt", "colour?", "-n", "8", "--grammar", colour, "--json")
	if code != 0 {
		t.Fatalf("run --grammar: exit %d: %s", code, errOut)
	}
	var r struct {
		Text         string `json:"text"`
		FinishReason string `json:"finish_reason"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if (r.Text != "red" && r.Text != "green") || r.FinishReason != "stop" {
		t.Errorf("run --grammar: %q, finish %q; want red or green, stop", r.Text, r.FinishReason)
	}
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown rule", []string{"--grammar", write("bad.lark", "start: foo\n")}, "--grammar"},
		{"empty language", []string{"--grammar", write("empty.lark", "start: A\nA: /a/ & /b/\n")}, "allows no answer"},
		{"missing file", []string{"--grammar", filepath.Join(dir, "none.lark")}, "--grammar"},
		{"not JSON", []string{"--json-schema", write("bad.json", "{")}, "not valid JSON"},
		{"unsupported keyword", []string{"--json-schema", write("not.json", `{"not": {"type": "string"}}`)}, "not"},
		{"both", []string{"--grammar", colour, "--json-schema", write("ok.json", `{"type": "object"}`)}, "cannot be used together"},
	} {
		_, errOut, code := runCLI(t, append([]string{"run", "--target-model", target, "--no-draft", "--prompt", "x", "-n", "4"}, c.args...)...)
		if code != 2 || !strings.Contains(errOut, c.want) {
			t.Errorf("%s: exit %d, stderr %q; want 2 mentioning %q", c.name, code, errOut, c.want)
		}
	}
}

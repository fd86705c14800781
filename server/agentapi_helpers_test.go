package server_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// namedEvent is one SSE event of the Responses or Messages API.
type namedEvent struct {
	Name string
	Data map[string]any
}

// namedEvents reads an SSE body whose events each have an "event:" line followed by one
// "data:" line, and checks that the payload's type repeats the name (both SDKs rely on
// it). Comment lines are skipped; [DONE] and unnamed data lines fail the test.
func namedEvents(t *testing.T, body io.Reader) []namedEvent {
	t.Helper()
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var events []namedEvent
	name := ""
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "" || strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "event: "):
			if name != "" {
				t.Fatalf("event %q has no data line", name)
			}
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			if name == "" {
				t.Fatalf("data line without an event name: %s", line)
			}
			var data map[string]any
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &data); err != nil {
				t.Fatalf("event %s: %v: %s", name, err, line)
			}
			if data["type"] != name {
				t.Fatalf("event %s carries type %v", name, data["type"])
			}
			events = append(events, namedEvent{name, data})
			name = ""
		default:
			t.Fatalf("unexpected SSE line %q", line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("reading the stream: %v", err)
	}
	return events
}

// postNamedStream posts a streaming request that must succeed and returns its events.
func postNamedStream(t *testing.T, url string, body any, headers ...string) []namedEvent {
	t.Helper()
	resp, err := httpClient.Do(newRequest(t, t.Context(), http.MethodPost, url, body, headers...))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(resp.Body)
		t.Fatalf("POST %s (stream): status %d: %s", url, resp.StatusCode, data)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("stream Content-Type %q", ct)
	}
	return namedEvents(t, resp.Body)
}

// postJSONOK posts a request that must answer 200 and decodes the answer.
func postJSONOK(t *testing.T, url string, body any, headers ...string) map[string]any {
	t.Helper()
	resp, data := do(t, http.MethodPost, url, body, headers...)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: status %d: %s", url, resp.StatusCode, data)
	}
	var out map[string]any
	decode(t, data, &out)
	return out
}

// jsonPath walks decoded JSON by object keys and array indices ("output", 0, "content").
func jsonPath(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, _ := v.(map[string]any)
			v = m[k]
		case int:
			a, _ := v.([]any)
			if k >= len(a) {
				return nil
			}
			v = a[k]
		}
	}
	return v
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

func num(v any) int {
	f, _ := v.(float64)
	return int(f)
}

// weatherTool is a function tool in the Responses shape.
var weatherTool = map[string]any{"type": "function", "name": "get_weather", "description": "Weather in a city.",
	"parameters": map[string]any{"type": "object", "properties": map[string]any{
		"city": map[string]any{"type": "string"}, "days": map[string]any{"type": "integer"}},
		"required": []string{"city"}}}

// weatherToolAnthropic is the same tool in the Messages shape.
var weatherToolAnthropic = map[string]any{"name": "get_weather", "description": "Weather in a city.",
	"input_schema": weatherTool["parameters"]}

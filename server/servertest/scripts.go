package servertest

import "strings"

// ToolCallScript returns a Script that answers like a Qwen model calling the function name
// with the JSON object args whenever the prompt declares tools, and with the default words
// otherwise. It follows a forced tool call: after a "<tool_call>\n" response prefix it
// writes the call's JSON, and after a prefix that already names the function it writes only
// the arguments. The markers are split across deltas on purpose, as a tokenizer may.
func ToolCallScript(name, args string) func(Input) []string {
	return func(in Input) []string {
		switch {
		case strings.HasSuffix(in.Prompt, `"arguments": `):
			return []string{args, "}\n</tool", "_call>"}
		case strings.HasSuffix(in.Prompt, "<tool_call>\n"):
			return []string{`{"name": "` + name + `", `, `"arguments": ` + args + "}", "\n</tool_call>"}
		case strings.Contains(in.Prompt, "<tools>"):
			return []string{"Let me check.", "\n\n<tool", "_call>\n{\"name\": \"" + name + "\", ",
				`"arguments": ` + args + "}\n</tool_call>"}
		}
		return nil
	}
}

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

// Param is one argument of a qwen3_coder call: its name and its text as the model writes it.
type Param struct{ Name, Value string }

// CoderToolCallScript is ToolCallScript for a model of the qwen3_coder format (Qwen3.5 and
// later): the call is written as <function=name> with one <parameter=...> element per
// argument. It follows forced calls the same way, after "<tool_call>\n" or after a prefix
// that already opens the named function.
func CoderToolCallScript(name string, params ...Param) func(Input) []string {
	var body strings.Builder
	for _, p := range params {
		body.WriteString("<parameter=" + p.Name + ">\n" + p.Value + "\n</parameter>\n")
	}
	return func(in Input) []string {
		switch {
		case strings.HasSuffix(in.Prompt, "<function="+name+">\n"):
			return []string{body.String(), "</function>\n</tool", "_call>"}
		case strings.HasSuffix(in.Prompt, "<tool_call>\n"):
			return []string{"<function=" + name + ">\n", body.String(), "</function>\n</tool_call>"}
		case strings.Contains(in.Prompt, "<tools>"):
			return []string{"Let me check.", "\n\n<tool", "_call>\n<func", "tion=" + name + ">\n" + body.String(),
				"</function>\n</tool_call>"}
		}
		return nil
	}
}

// AgentScript answers like an agent's model: when the conversation's last turn is a tool
// result it answers "The tool said: " and that result (proof that the result reached the
// prompt); otherwise it calls as the call script does.
func AgentScript(call func(Input) []string) func(Input) []string {
	return func(in Input) []string {
		lastUser := strings.LastIndex(in.Prompt, "<|im_start|>user\n")
		lastTool := strings.LastIndex(in.Prompt, "<|im_start|>tool\n")
		if lastTool > lastUser {
			result := in.Prompt[lastTool+len("<|im_start|>tool\n"):]
			result, _, _ = strings.Cut(result, "<|im_end|>")
			return []string{"The tool said: ", result}
		}
		return call(in)
	}
}

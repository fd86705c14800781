package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/loaders"
)

// ErrNoChatTemplate is returned when the model ships no chat template.
// Callers may then fall back to PlainChatPrompt, explicitly.
var ErrNoChatTemplate = errors.New("the model has no chat template")

// ErrTemplateException wraps the message of a template's own
// raise_exception call, e.g. "Conversation roles must alternate".
var ErrTemplateException = errTemplateRaised

// ChatOptions are the inputs of apply_chat_template besides the messages.
type ChatOptions struct {
	// Tools are OpenAI tool definitions, each a JSON object such as
	// {"type": "function", "function": {"name": ..., "parameters": ...}}.
	// Nil passes tools=None, as transformers does without tools.
	Tools []json.RawMessage
	// AddGenerationPrompt appends the header of the assistant's reply.
	AddGenerationPrompt bool
	// EnableThinking, when set, is passed as the enable_thinking variable
	// (Qwen3 emits an empty <think></think> block when it is false).
	EnableThinking *bool
	// Variables are extra template variables (a request's
	// chat_template_kwargs), each a JSON value.
	Variables map[string]json.RawMessage
	// TemplateName picks one of several named templates; "" picks
	// "tool_use" when tools are given and it exists, else "default".
	TemplateName string
}

// reservedTemplateVariables are set by the renderer itself.
var reservedTemplateVariables = map[string]bool{
	"messages": true, "tools": true, "documents": true, "add_generation_prompt": true,
}

// ChatTemplate is a parsed Jinja chat template. It is safe for concurrent
// use.
type ChatTemplate struct {
	tpl *exec.Template
}

// ParseChatTemplate parses Jinja source with the settings transformers uses.
func ParseChatTemplate(source string) (tpl *ChatTemplate, err error) {
	defer func() {
		if r := recover(); r != nil {
			tpl, err = nil, fmt.Errorf("parse chat template: engine panic: %v", r)
		}
	}()
	loader, err := loaders.NewFileSystemLoader("")
	if err != nil {
		return nil, fmt.Errorf("parse chat template: %w", err)
	}
	const name = "chat_template"
	shifted, err := loaders.NewShiftedLoader(name, strings.NewReader(source), loader)
	if err != nil {
		return nil, fmt.Errorf("parse chat template: %w", err)
	}
	t, err := exec.NewTemplate(name, newTemplateConfig(), shifted, newTemplateEnvironment())
	if err != nil {
		// The engine quotes the whole source in its message; drop it.
		msg := strings.Replace(err.Error(), source, name, 1)
		return nil, fmt.Errorf("parse chat template: %s", msg)
	}
	return &ChatTemplate{tpl: t}, nil
}

// Render renders messages as transformers' apply_chat_template(messages,
// tools=..., add_generation_prompt=..., tokenize=False, **variables) does.
// namedTokens are the tokenizer's bos_token, eos_token, ... strings, which
// templates may use.
func (c *ChatTemplate) Render(messages []Message, opts ChatOptions, namedTokens map[string]string) (out string, err error) {
	vars, err := buildTemplateContext(messages, opts, namedTokens)
	if err != nil {
		return "", err
	}
	return c.execute(vars)
}

// execute renders the template with the given variables. The engine may
// panic on odd templates; that becomes an error, never a crash.
func (c *ChatTemplate) execute(vars map[string]any) (out string, err error) {
	defer func() {
		if r := recover(); r != nil {
			out, err = "", fmt.Errorf("render chat template: engine panic: %v", r)
		}
	}()
	out, err = c.tpl.ExecuteToString(exec.NewContext(vars))
	if err != nil {
		// The engine flattens errors from functions into text, so the
		// template's own raise_exception is found by its marker and
		// reported with just its message.
		marker := errTemplateRaised.Error() + ": "
		if i := strings.Index(err.Error(), marker); i >= 0 {
			return "", fmt.Errorf("render chat template: %w: %s", ErrTemplateException, err.Error()[i+len(marker):])
		}
		return "", fmt.Errorf("render chat template: %w", err)
	}
	return out, nil
}

// buildTemplateContext assembles the variables a template sees, with the
// same precedence as transformers: named special tokens, then the caller's
// variables, then messages, tools, documents and add_generation_prompt.
func buildTemplateContext(messages []Message, opts ChatOptions, namedTokens map[string]string) (map[string]any, error) {
	if len(messages) == 0 {
		return nil, errors.New("render chat template: the conversation is empty")
	}
	vars := map[string]any{}
	for k, v := range namedTokens {
		vars[k] = v
	}
	names := make([]string, 0, len(opts.Variables))
	for k := range opts.Variables {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if reservedTemplateVariables[k] {
			return nil, fmt.Errorf("render chat template: variable %q is set by the renderer", k)
		}
		v, err := jsonToTemplateValue(opts.Variables[k])
		if err != nil {
			return nil, fmt.Errorf("render chat template: variable %q: %w", k, err)
		}
		vars[k] = v
	}
	if opts.EnableThinking != nil {
		vars["enable_thinking"] = *opts.EnableThinking
	}
	msgs, err := messagesToTemplateValue(messages)
	if err != nil {
		return nil, err
	}
	vars["messages"] = msgs
	vars["tools"] = nil
	if opts.Tools != nil {
		tools := make([]any, len(opts.Tools))
		for i, raw := range opts.Tools {
			v, err := jsonToTemplateValue(raw)
			if err != nil {
				return nil, fmt.Errorf("render chat template: tools[%d]: %w", i, err)
			}
			if !isTemplateDict(v) {
				return nil, fmt.Errorf("render chat template: tools[%d] must be a JSON object", i)
			}
			tools[i] = v
		}
		vars["tools"] = tools
	}
	vars["documents"] = nil
	vars["add_generation_prompt"] = opts.AddGenerationPrompt
	return vars, nil
}

// messagesToTemplateValue converts messages the way apply_chat_template
// prepares them: the OpenAI JSON shape as ordered dicts, keys whose value is
// null dropped, and reasoning aliased as {"thinking": r, **message,
// "reasoning_content": r} whenever a message carries reasoning.
func messagesToTemplateValue(messages []Message) ([]any, error) {
	out := make([]any, len(messages))
	for i, m := range messages {
		raw, err := json.Marshal(m)
		if err != nil {
			return nil, fmt.Errorf("render chat template: messages[%d]: %w", i, err)
		}
		v, err := jsonToTemplateValue(raw)
		if err != nil {
			return nil, fmt.Errorf("render chat template: messages[%d]: %w", i, err)
		}
		dict, ok := v.(*exec.Dict)
		if !ok { // an empty object
			out[i] = v
			continue
		}
		kept := dict.Pairs[:0]
		for _, p := range dict.Pairs {
			if !p.Value.IsNil() {
				kept = append(kept, p)
			}
		}
		dict.Pairs = kept
		out[i] = aliasReasoning(dict)
	}
	return out, nil
}

// reasoningFields are the names a message's reasoning may come under; the
// first one set wins.
var reasoningFields = []string{"reasoning_content", "thinking", "reasoning"}

func aliasReasoning(d *exec.Dict) *exec.Dict {
	var reasoning *exec.Value
	for _, f := range reasoningFields {
		if v, ok := dictItem(d, f); ok && !v.IsNil() {
			reasoning = v
			break
		}
	}
	if reasoning == nil {
		return d
	}
	aliased := exec.NewDict()
	setDictItem(aliased, "thinking", reasoning)
	for _, p := range d.Pairs {
		setDictItem(aliased, p.Key.String(), p.Value)
	}
	setDictItem(aliased, "reasoning_content", reasoning)
	return aliased
}

// PlainChatPrompt formats messages without a template, for models that
// have none (see ErrNoChatTemplate): "role: content" paragraphs, then
// "assistant: " when a reply should follow. It is a last resort, never used
// implicitly.
func PlainChatPrompt(messages []Message, addGenerationPrompt bool) string {
	var b bytes.Buffer
	for _, m := range messages {
		b.WriteString(m.Role)
		b.WriteString(": ")
		if m.Content != nil {
			b.WriteString(*m.Content)
		}
		b.WriteString("\n\n")
	}
	if addGenerationPrompt {
		b.WriteString("assistant: ")
	}
	return b.String()
}

// isTemplateDict reports whether v came from a JSON object.
func isTemplateDict(v any) bool {
	switch v.(type) {
	case *exec.Dict, map[string]any:
		return true
	}
	return false
}

package tokenizer

import (
	"fmt"
	"sort"
)

// HasChatTemplate reports whether the model ships a chat template.
func (t *Tokenizer) HasChatTemplate() bool { return len(t.templates) > 0 }

// ChatTemplateNames lists the model's chat templates by name; a single
// template is called "default".
func (t *Tokenizer) ChatTemplateNames() []string {
	names := make([]string, 0, len(t.templates))
	for n := range t.templates {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// ChatTemplateSource returns the Jinja source of a named template.
func (t *Tokenizer) ChatTemplateSource(name string) (string, bool) {
	s, ok := t.templates[name]
	return s, ok
}

// ApplyChatTemplate renders messages with the model's own chat template,
// as transformers' apply_chat_template(..., tokenize=False). It returns
// ErrNoChatTemplate when the model has none, and an error (never another
// format) when the template cannot be parsed or rendered.
func (t *Tokenizer) ApplyChatTemplate(messages []Message, opts ChatOptions) (string, error) {
	name, err := t.selectTemplate(opts)
	if err != nil {
		return "", err
	}
	tpl, err := t.parsedTemplate(name)
	if err != nil {
		return "", err
	}
	return tpl.Render(messages, opts, t.named)
}

// selectTemplate mirrors transformers' get_chat_template: an explicit name,
// else "tool_use" when tools are passed and it exists, else "default".
func (t *Tokenizer) selectTemplate(opts ChatOptions) (string, error) {
	if len(t.templates) == 0 {
		return "", ErrNoChatTemplate
	}
	if opts.TemplateName != "" {
		if _, ok := t.templates[opts.TemplateName]; !ok {
			return "", fmt.Errorf("chat template %q not found (have %v)", opts.TemplateName, t.ChatTemplateNames())
		}
		return opts.TemplateName, nil
	}
	if _, ok := t.templates["tool_use"]; ok && opts.Tools != nil {
		return "tool_use", nil
	}
	if _, ok := t.templates["default"]; ok {
		return "default", nil
	}
	return "", fmt.Errorf("the model has several chat templates %v and none is named \"default\": pick one with TemplateName", t.ChatTemplateNames())
}

// parsedTemplate parses a template once and caches it.
func (t *Tokenizer) parsedTemplate(name string) (*ChatTemplate, error) {
	t.templateMu.Lock()
	defer t.templateMu.Unlock()
	if tpl, ok := t.parsed[name]; ok {
		return tpl, nil
	}
	tpl, err := ParseChatTemplate(t.templates[name])
	if err != nil {
		return nil, fmt.Errorf("chat template %q of %s: %w", name, t.dir, err)
	}
	if t.parsed == nil {
		t.parsed = map[string]*ChatTemplate{}
	}
	t.parsed[name] = tpl
	return tpl, nil
}

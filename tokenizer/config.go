package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// namedTokenKeys are the special-token attributes transformers exposes to chat
// templates (its special_tokens_map), in the order it lists them.
var namedTokenKeys = []string{"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}

// tokenizerConfig is what this package reads from tokenizer_config.json.
type tokenizerConfig struct {
	// named maps bos_token, eos_token, ... to their content; absent or null
	// entries are left out.
	named map[string]string
	// templates maps a template name to its Jinja source. A single template
	// is stored under "default".
	templates map[string]string
}

// readJSONFile reads path into v. A missing file returns fs.ErrNotExist
// (check with errors.Is); any other failure names the file.
func readJSONFile(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("parse %s: %w", path, err)
	}
	return nil
}

// loadTokenizerConfig reads tokenizer_config.json (optional), then
// special_tokens_map.json for any named token it lacks, then the chat
// template files, which take precedence over the config's chat_template as
// they do in transformers.
func loadTokenizerConfig(dir string) (*tokenizerConfig, error) {
	cfg := &tokenizerConfig{named: map[string]string{}, templates: map[string]string{}}

	path := filepath.Join(dir, "tokenizer_config.json")
	var raw map[string]json.RawMessage
	switch err := readJSONFile(path, &raw); {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, err
	default:
		if err := cfg.readNamedTokens(path, raw); err != nil {
			return nil, err
		}
		if t, ok := raw["chat_template"]; ok {
			if err := cfg.readChatTemplateField(path, t); err != nil {
				return nil, err
			}
		}
	}

	path = filepath.Join(dir, "special_tokens_map.json")
	raw = nil
	switch err := readJSONFile(path, &raw); {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, err
	default:
		fallback := &tokenizerConfig{named: map[string]string{}}
		if err := fallback.readNamedTokens(path, raw); err != nil {
			return nil, err
		}
		for k, v := range fallback.named {
			if _, ok := cfg.named[k]; !ok {
				cfg.named[k] = v
			}
		}
	}

	if err := cfg.readChatTemplateFiles(dir); err != nil {
		return nil, err
	}
	return cfg, nil
}

// readNamedTokens reads bos_token, eos_token, ... which are either a string
// or a serialized AddedToken object {"content": "..."}.
func (c *tokenizerConfig) readNamedTokens(path string, raw map[string]json.RawMessage) error {
	for _, key := range namedTokenKeys {
		v, ok := raw[key]
		if !ok || bytes.Equal(bytes.TrimSpace(v), []byte("null")) {
			continue
		}
		var s string
		if err := json.Unmarshal(v, &s); err == nil {
			c.named[key] = s
			continue
		}
		var obj struct {
			Content *string `json:"content"`
		}
		if err := json.Unmarshal(v, &obj); err != nil || obj.Content == nil {
			return fmt.Errorf("parse %s: %s must be a string or an object with \"content\"", path, key)
		}
		c.named[key] = *obj.Content
	}
	return nil
}

// readChatTemplateField reads chat_template, which is either one template
// string or a list of {"name": ..., "template": ...}.
func (c *tokenizerConfig) readChatTemplateField(path string, raw json.RawMessage) error {
	raw = bytes.TrimSpace(raw)
	if bytes.Equal(raw, []byte("null")) {
		return nil
	}
	var single string
	if err := json.Unmarshal(raw, &single); err == nil {
		c.templates["default"] = single
		return nil
	}
	var named []struct {
		Name     *string `json:"name"`
		Template *string `json:"template"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return fmt.Errorf("parse %s: chat_template must be a string or a list of {name, template}", path)
	}
	for i, n := range named {
		if n.Name == nil || n.Template == nil {
			return fmt.Errorf("parse %s: chat_template[%d] needs both \"name\" and \"template\"", path, i)
		}
		c.templates[*n.Name] = *n.Template
	}
	return nil
}

// readChatTemplateFiles reads chat_template.jinja (the default template) and
// additional_chat_templates/*.jinja (named ones). When any exist they replace
// the templates from tokenizer_config.json.
func (c *tokenizerConfig) readChatTemplateFiles(dir string) error {
	files := map[string]string{}
	path := filepath.Join(dir, "chat_template.jinja")
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return fmt.Errorf("read %s: %w", path, err)
	default:
		files["default"] = string(data)
	}
	extraDir := filepath.Join(dir, "additional_chat_templates")
	entries, err := os.ReadDir(extraDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("read %s: %w", extraDir, err)
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		if !e.IsDir() && strings.HasSuffix(e.Name(), ".jinja") {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	for _, name := range names {
		p := filepath.Join(extraDir, name)
		data, err := os.ReadFile(p)
		if err != nil {
			return fmt.Errorf("read %s: %w", p, err)
		}
		files[strings.TrimSuffix(name, ".jinja")] = string(data)
	}
	if len(files) > 0 {
		c.templates = files
	}
	return nil
}

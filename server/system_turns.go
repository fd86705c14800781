package server

import "strings"

// foldSystemTurns gives a conversation at most one system turn, first: the system turns
// before any other are joined into it, and a later one becomes a user turn with the same
// text. Qwen3.5's chat template refuses a system turn anywhere but first, and agents send
// them elsewhere: Codex puts developer messages after its instructions, Claude Code sends
// system messages from hooks mid-conversation.
func foldSystemTurns(msgs []ChatMessage) []ChatMessage {
	var leading []string
	i := 0
	for ; i < len(msgs) && msgs[i].Role == "system"; i++ {
		leading = append(leading, msgs[i].Content)
	}
	out := make([]ChatMessage, 0, len(msgs)-i+1)
	if len(leading) > 0 {
		out = append(out, ChatMessage{Role: "system", Content: strings.Join(leading, "\n\n")})
	}
	for _, m := range msgs[i:] {
		if m.Role == "system" {
			m = ChatMessage{Role: "user", Content: m.Content}
		}
		out = append(out, m)
	}
	return out
}

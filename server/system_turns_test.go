package server

import (
	"slices"
	"testing"
)

func TestFoldSystemTurns(t *testing.T) {
	sys := func(s string) ChatMessage { return ChatMessage{Role: "system", Content: s} }
	user := func(s string) ChatMessage { return ChatMessage{Role: "user", Content: s} }
	tests := []struct {
		name     string
		in, want []ChatMessage
	}{
		{"none", []ChatMessage{user("a")}, []ChatMessage{user("a")}},
		{"one first", []ChatMessage{sys("s"), user("a")}, []ChatMessage{sys("s"), user("a")}},
		{"leading ones joined", []ChatMessage{sys("instructions"), sys("developer"), user("a")},
			[]ChatMessage{sys("instructions\n\ndeveloper"), user("a")}},
		{"a later one becomes a user turn", []ChatMessage{sys("s"), user("a"), sys("reminder"), user("b")},
			[]ChatMessage{sys("s"), user("a"), user("reminder"), user("b")}},
		{"only later ones", []ChatMessage{user("a"), sys("late")}, []ChatMessage{user("a"), user("late")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := foldSystemTurns(tt.in)
			if !slices.EqualFunc(got, tt.want, func(a, b ChatMessage) bool { return a.Role == b.Role && a.Content == b.Content }) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

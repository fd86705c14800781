package server

import (
	"crypto/rand"
	"encoding/hex"
)

// randomID returns prefix followed by 24 random hex digits. crypto/rand cannot fail on the
// systems Go supports (it panics inside if it ever does).
func randomID(prefix string) string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

func newToolCallID() string { return randomID("call_") }

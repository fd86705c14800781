package server

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"testing"
)

func liveHeap() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// The store's accounting is an upper bound on the heap it holds: 1000 responses stored as
// the handler stores them (input decoded from JSON, the response and its items encoded)
// leave no more live heap than the budget, and no more than the accounted bytes.
func TestResponseStoreHeap(t *testing.T) {
	const budget = 256 << 10
	for _, inputBytes := range []int{100, 8 << 10, 30 << 10} {
		t.Run(fmt.Sprint(inputBytes), func(t *testing.T) {
			s := &Server{responses: newResponseStore(budget), log: slog.New(slog.DiscardHandler)}
			before := liveHeap()
			for i := range 1000 {
				raw, _ := json.Marshal(fmt.Sprintf("[[id:%d]] %s", i, strings.Repeat("x", inputBytes)))
				var input string
				if err := json.Unmarshal(raw, &input); err != nil {
					t.Fatal(err)
				}
				it := newOutputItem(itemMessage)
				it.text.WriteString(strings.Repeat("answer ", 100))
				it.done = true
				items := []*outputItem{it}
				obj := &responseObject{ID: randomID("resp_"), Object: "response", Status: "completed", Output: []any{it.wire(true)}}
				s.storeResponse(obj, append([]ChatMessage{{Role: "user", Content: input}}, outputMessages(items)...), items)
			}
			held := liveHeap() - before
			accounted, entries := s.responses.usage()
			t.Logf("%d-byte inputs: %d entries kept, %d bytes accounted, %d bytes of heap held (budget %d)",
				inputBytes, entries, accounted, held, budget)
			if accounted > budget || held > budget || held > accounted {
				t.Errorf("held %d bytes of heap, accounted %d, budget %d", held, accounted, budget)
			}
			runtime.KeepAlive(s)
		})
	}
}

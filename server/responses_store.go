package server

import (
	"container/list"
	"encoding/json"
	"sync"
)

// responseStore keeps finished responses for GET /v1/responses/{id}, for chaining by
// previous_response_id and for item_reference, in memory, least recently used first out.
//
// Invariant: bytes, the sum of the entries' accounted sizes, never exceeds maxBytes after
// put returns. An entry's size counts every byte it refers to (the response JSON, the
// history's text, the items' JSON), a quarter more for the allocator's size classes, and a
// fixed overhead per message and item for the Go headers around them, so the bound holds for
// the memory the store keeps, not only for the payload. It is an upper bound: a chained
// response shares its history's strings with the response before it, and both count them.
// A response larger than the whole budget is not kept at all.
type responseStore struct {
	maxBytes int64

	mu    sync.Mutex
	bytes int64
	order list.List // of *storedResponse, most recently used first
	byID  map[string]*list.Element
	items map[string]*storedResponse // output item id → the response holding it
}

// storedResponse is one kept response.
type storedResponse struct {
	id     string
	object []byte // the response object as GET returns it
	// history is the conversation through this response's output, without instructions
	// (they do not carry over to a chained request).
	history []ChatMessage
	// items are the output items as input items (JSON), by id, for item_reference.
	items map[string]json.RawMessage
	size  int64
}

// Per-object overheads counted on top of the payload bytes: a ChatMessage's headers and
// slice/map slots, an item's map entry, an entry's list element and maps.
const (
	storedMessageOverhead = 160
	storedItemOverhead    = 96
	storedEntryOverhead   = 768
)

func newResponseStore(maxBytes int64) *responseStore {
	return &responseStore{maxBytes: maxBytes, byID: map[string]*list.Element{}, items: map[string]*storedResponse{}}
}

func (e *storedResponse) accountedSize() int64 {
	n := int64(storedEntryOverhead + len(e.id) + len(e.object))
	for _, m := range e.history {
		n += storedMessageOverhead + int64(len(m.Role)+len(m.Content)+len(m.ReasoningContent)+len(m.ToolCallID)+len(m.Name))
		for _, c := range m.ToolCalls {
			n += storedMessageOverhead + int64(len(c.ID)+len(c.Name)+len(c.Arguments))
		}
	}
	for id, raw := range e.items {
		n += storedItemOverhead + int64(len(id)+len(raw))
	}
	// Go's size classes round an allocation up, by as much as 15% at some sizes (an 8.2 KB
	// string takes a 9.5 KB slot); a quarter keeps the bound on the safe side.
	return n + n/4
}

// put keeps e, evicting the least recently used entries until the budget holds it.
// It reports whether e was kept.
func (st *responseStore) put(e *storedResponse) bool {
	e.size = e.accountedSize()
	st.mu.Lock()
	defer st.mu.Unlock()
	if old, ok := st.byID[e.id]; ok {
		st.remove(old)
	}
	if e.size > st.maxBytes {
		return false
	}
	for st.bytes+e.size > st.maxBytes {
		st.remove(st.order.Back())
	}
	st.byID[e.id] = st.order.PushFront(e)
	for id := range e.items {
		st.items[id] = e
	}
	st.bytes += e.size
	return true
}

func (st *responseStore) remove(el *list.Element) {
	e := st.order.Remove(el).(*storedResponse)
	delete(st.byID, e.id)
	for id := range e.items {
		if st.items[id] == e {
			delete(st.items, id)
		}
	}
	st.bytes -= e.size
}

// get returns the response with id and marks it used.
func (st *responseStore) get(id string) (*storedResponse, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	el, ok := st.byID[id]
	if !ok {
		return nil, false
	}
	st.order.MoveToFront(el)
	return el.Value.(*storedResponse), true
}

// item returns a stored output item by its id.
func (st *responseStore) item(id string) (json.RawMessage, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	e, ok := st.items[id]
	if !ok {
		return nil, false
	}
	st.order.MoveToFront(st.byID[e.id])
	return e.items[id], true
}

// delete removes the response with id and reports whether it was there.
func (st *responseStore) delete(id string) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	el, ok := st.byID[id]
	if ok {
		st.remove(el)
	}
	return ok
}

// usage reports the accounted bytes and the number of responses kept.
func (st *responseStore) usage() (bytes int64, entries int) {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.bytes, st.order.Len()
}

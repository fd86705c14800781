// Package prefixcache keeps the state of prompts already computed, so that a request
// whose prompt starts with one of them resumes there instead of prefilling it again: a
// chat's next turn, or the same long system prompt sent by every request of an IDE client.
//
// An Entry holds, for a token sequence, every target layer's saved state after it
// (cache.Saved: KV rows, a recurrent layer's conv tail and state), the drafter's context
// rows, and for targets with recurrent layers their states at earlier positions (marks),
// since a recurrent state cannot be rewound. Attention layers resume at any shorter
// position of an entry; recurrent ones only where the entry has their state. The last
// prompt token is always run again by the engine (it gives the first token's logits), so
// a hit never needs stored logits.
//
// The cache is a byte-budgeted LRU in memory, optionally written through to a directory
// (Disk) so that another process resumes from it too. Entries that a longer one covers
// are merged into it, so a conversation holds one entry, not one per turn. An entry in
// use (a Hit not yet released) is never evicted. The methods are safe for concurrent
// use; those that touch arrays (Lookup, Insert, Release) run on the MLX thread.
package prefixcache

import (
	"container/list"
	"fmt"
	"sync"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model/cache"
)

// DefaultBudget is the memory budget of a prefix cache when none is given: 2 GiB.
const DefaultBudget int64 = 2 << 30

// DefaultMarkEvery is the spacing of the recurrent layers' marks in a long prefill.
const DefaultMarkEvery = 1024

// Entry is the saved state after Tokens.
type Entry struct {
	Tokens []int32
	// Target is every target layer's state after all of Tokens.
	Target []cache.Saved
	// Draft is the drafter's context after all of Tokens; nil when there is none.
	Draft []cache.Saved
	// Marks are earlier positions where the target's non-trimmable layers have a state
	// too (increasing Pos, each below len(Tokens)).
	Marks []Mark

	bytes int64
	pins  int
	elem  *list.Element
	// onDisk is the file the entry was written to ("" when not).
	onDisk string
}

// Mark is the non-trimmable target layers' states at position Pos of an entry (the zero
// Saved at the layers that can trim: they resume from the entry's final state).
type Mark struct {
	Pos    int
	Target []cache.Saved
}

// free releases every array of the entry.
func (e *Entry) free() {
	cache.FreeSaved(e.Target)
	cache.FreeSaved(e.Draft)
	for _, m := range e.Marks {
		cache.FreeSaved(m.Target)
	}
	e.Target, e.Draft, e.Marks = nil, nil, nil
}

// size is the memory the entry's arrays hold.
func (e *Entry) size() int64 {
	var n int64
	for _, a := range e.arrays() {
		n += int64(a.NBytes())
	}
	return n
}

// trimmable reports whether every target layer resumes at any position.
func (e *Entry) trimmable() bool {
	for _, s := range e.Target {
		if !s.Trimmable {
			return false
		}
	}
	return true
}

// stateAt returns the target layers' states to resume at position n, or nil when the
// entry has none there (a non-trimmable layer without a state at n).
func (e *Entry) stateAt(n int) []cache.Saved {
	if n > len(e.Tokens) || n < 0 {
		return nil
	}
	if n == len(e.Tokens) || e.trimmable() {
		return e.Target
	}
	for _, m := range e.Marks {
		if m.Pos != n {
			continue
		}
		out := make([]cache.Saved, len(e.Target))
		for i, s := range e.Target {
			out[i] = s
			if !s.Trimmable {
				out[i] = m.Target[i]
			}
		}
		return out
	}
	return nil
}

// resumeAt is the longest position ≤ limit the entry resumes at, or 0.
func (e *Entry) resumeAt(limit int) int {
	limit = min(limit, len(e.Tokens))
	if limit == len(e.Tokens) || e.trimmable() {
		return max(limit, 0)
	}
	best := 0
	for _, m := range e.Marks {
		if m.Pos <= limit {
			best = max(best, m.Pos)
		}
	}
	return best
}

// Stats are a cache's counters.
type Stats struct {
	Lookups int64 `json:"lookups"`
	Hits    int64 `json:"hits"`
	// ReusedTokens sums the positions the hits skipped.
	ReusedTokens int64 `json:"reused_tokens"`
	Inserts      int64 `json:"inserts"`
	Evictions    int64 `json:"evictions"`
	// Rejected counts entries larger than what the budget leaves them.
	Rejected int64 `json:"rejected"`
	Entries  int   `json:"entries"`
	Bytes    int64 `json:"bytes"`
	Budget   int64 `json:"budget_bytes"`
	// PeakBytes is the most the entries ever held (never above Budget).
	PeakBytes int64 `json:"peak_bytes"`
	DiskHits  int64 `json:"disk_hits"`
	// DiskErrors counts entries on disk that were corrupt, foreign or unwritable.
	DiskErrors int64 `json:"disk_errors"`
}

// Options configure a cache.
type Options struct {
	// Budget bounds the bytes of the entries in memory; 0 means DefaultBudget.
	Budget int64
	// MarkEvery is the spacing of recurrent marks in a prefill (0: DefaultMarkEvery).
	MarkEvery int
	// Disk, when set, receives every entry and answers what memory does not hold.
	Disk *Disk
	// Warn gets one line per problem that turned into a miss (a corrupt file); nil: none.
	Warn func(string)
}

// Cache is a prefix cache.
type Cache struct {
	mu        sync.Mutex
	budget    int64
	markEvery int
	lru       *list.List // of *Entry, most recent first
	st        Stats
	disk      *Disk
	warn      func(string)
	// warnedSize: the warning for an entry larger than the budget was given (once).
	warnedSize bool
}

// New makes an empty cache.
func New(o Options) (*Cache, error) {
	if o.Budget < 0 {
		return nil, fmt.Errorf("prefix cache: budget %d bytes is negative", o.Budget)
	}
	if o.MarkEvery < 0 {
		return nil, fmt.Errorf("prefix cache: mark spacing %d is negative", o.MarkEvery)
	}
	if o.Budget == 0 {
		o.Budget = DefaultBudget
	}
	if o.MarkEvery == 0 {
		o.MarkEvery = DefaultMarkEvery
	}
	if o.Warn == nil {
		o.Warn = func(string) {}
	}
	c := &Cache{budget: o.Budget, markEvery: o.MarkEvery, lru: list.New(), disk: o.Disk, warn: o.Warn}
	c.st.Budget = o.Budget
	return c, nil
}

// MarkEvery is the spacing of recurrent marks in a prefill.
func (c *Cache) MarkEvery() int { return c.markEvery }

// Stats returns the counters.
func (c *Cache) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.st
	s.Entries = c.lru.Len()
	return s
}

// Hit is a resumable prefix: the states to load for its first N positions. It pins its
// entry until Release.
type Hit struct {
	N int
	// Target and Draft are the layers' states to load at N (owned by the entry).
	Target, Draft []cache.Saved
	c             *Cache
	e             *Entry
}

// Release unpins the entry (a nil Hit is fine).
func (h *Hit) Release() {
	if h == nil || h.c == nil {
		return
	}
	h.c.mu.Lock()
	h.e.pins--
	h.c.mu.Unlock()
	h.c = nil
}

// Lookup finds the longest prefix of prompt, at most limit positions, that an entry
// resumes at; needDraft asks for the drafter's context too. It returns nil on a miss.
func (c *Cache) Lookup(prompt []int32, limit int, needDraft bool) *Hit {
	var loaded *Entry
	if c.disk != nil {
		// The directory is read (outside the lock) only when it resumes further.
		c.mu.Lock()
		_, n := c.best(prompt, limit, needDraft)
		c.mu.Unlock()
		if d, dn := c.disk.best(prompt, limit, needDraft); dn > n {
			loaded = c.fromDisk(d)
		}
	}
	// The entry is chosen and pinned under one lock, so no eviction comes between.
	c.mu.Lock()
	defer c.mu.Unlock()
	c.st.Lookups++
	e, n := c.best(prompt, limit, needDraft)
	if e == nil || n == 0 {
		return nil
	}
	if e == loaded {
		c.st.DiskHits++
	}
	h := &Hit{N: n, Target: e.stateAt(n), c: c, e: e}
	if needDraft {
		h.Draft = e.Draft
	}
	e.pins++
	c.lru.MoveToFront(e.elem)
	c.st.Hits++
	c.st.ReusedTokens += int64(n)
	return h
}

// best is the entry resuming the longest prefix of prompt (at most limit), and that
// length; c.mu is held.
func (c *Cache) best(prompt []int32, limit int, needDraft bool) (*Entry, int) {
	var best *Entry
	n := 0
	for el := c.lru.Front(); el != nil; el = el.Next() {
		e := el.Value.(*Entry)
		if needDraft && e.Draft == nil {
			continue
		}
		if k := e.resumeAt(min(limit, commonPrefix(e.Tokens, prompt))); k > n {
			best, n = e, k
		}
	}
	return best, n
}

// commonPrefix is the length of the longest common prefix of a and b.
func commonPrefix(a, b []int32) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// isPrefix reports whether a is a prefix of b.
func isPrefix(a, b []int32) bool { return len(a) <= len(b) && commonPrefix(a, b) == len(a) }

// Insert takes e (and its arrays) into the cache, writing it through to disk. An entry
// that an existing one already covers is merged into it (its recurrent states become a
// mark there); entries that e covers are merged into e. Least recently used entries are
// evicted until the budget holds; an entry that does not fit even then is dropped. It
// reports whether e's state is held.
func (c *Cache) Insert(e *Entry) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.st.Inserts++
	// Covered by an existing entry: keep e's recurrent states there as a mark.
	for el := c.lru.Front(); el != nil; el = el.Next() {
		x := el.Value.(*Entry)
		if !isPrefix(e.Tokens, x.Tokens) || (e.Draft != nil && x.Draft == nil) {
			continue
		}
		if len(e.Tokens) < len(x.Tokens) && !x.trimmable() && x.stateAt(len(e.Tokens)) == nil {
			if x.pins > 0 {
				continue // a pinned entry's slices are in use; keep e apart
			}
			x.Marks = insertMark(x.Marks, e.takeFixed())
			c.resize(x)
		}
		e.free()
		c.lru.MoveToFront(el)
		c.evict(x)
		return true
	}
	// e covers existing entries: take their marks and recurrent states, drop them.
	for el := c.lru.Front(); el != nil; {
		next := el.Next()
		x := el.Value.(*Entry)
		if x.pins == 0 && isPrefix(x.Tokens, e.Tokens) && (x.Draft == nil || e.Draft != nil) {
			c.absorb(e, x)
			c.remove(el, false)
		}
		el = next
	}
	e.bytes = e.size()
	if e.bytes > c.budget {
		c.st.Rejected++
		if !c.warnedSize {
			c.warnedSize = true
			c.warn(fmt.Sprintf("prompt cache: a prompt's state of %d MiB is larger than the cache's budget of %d MiB and is not kept (raise --prompt-cache-bytes)", e.bytes>>20, c.budget>>20))
		}
		e.free()
		return false
	}
	e.elem = c.lru.PushFront(e)
	c.st.Bytes += e.bytes
	c.evict(e)
	if e.elem == nil {
		return false
	}
	c.peak()
	if c.disk != nil {
		if err := c.disk.write(e); err != nil {
			c.st.DiskErrors++
			c.warn(fmt.Sprintf("prefix cache: not written to disk: %v", err))
		}
	}
	return true
}

// absorb moves x's recurrent states (its marks, and its final state when e has no state
// at its length) into e's marks, freeing the rest of x.
func (c *Cache) absorb(e, x *Entry) {
	if !e.trimmable() {
		for _, m := range x.Marks {
			if e.stateAt(m.Pos) == nil {
				e.Marks = insertMark(e.Marks, m)
			} else {
				cache.FreeSaved(m.Target)
			}
		}
		x.Marks = nil
		if len(x.Tokens) < len(e.Tokens) && e.stateAt(len(x.Tokens)) == nil {
			e.Marks = insertMark(e.Marks, x.takeFixed())
		}
	}
	x.free()
}

// takeFixed moves the entry's final states of the layers that cannot trim into a mark at
// its length (the entry keeps the rest, to be freed with it).
func (e *Entry) takeFixed() Mark {
	m := Mark{Pos: len(e.Tokens), Target: make([]cache.Saved, len(e.Target))}
	for i, s := range e.Target {
		if !s.Trimmable {
			m.Target[i], e.Target[i] = s, cache.Saved{}
		}
	}
	return m
}

// insertMark adds m to marks, kept in increasing position.
func insertMark(marks []Mark, m Mark) []Mark {
	i := len(marks)
	for i > 0 && marks[i-1].Pos > m.Pos {
		i--
	}
	marks = append(marks, Mark{})
	copy(marks[i+1:], marks[i:])
	marks[i] = m
	return marks
}

// resize recounts an entry's bytes; c.mu is held.
func (c *Cache) resize(e *Entry) {
	n := e.size()
	c.st.Bytes += n - e.bytes
	e.bytes = n
}

// evict drops least recently used entries without pins until the budget holds; keep is
// evicted only when nothing else is left to evict. c.mu is held.
func (c *Cache) evict(keep *Entry) {
	for c.st.Bytes > c.budget {
		el := c.lru.Back()
		for el != nil && (el.Value.(*Entry).pins > 0 || el.Value.(*Entry) == keep) {
			el = el.Prev()
		}
		if el == nil {
			if keep.elem != nil && keep.pins == 0 {
				c.st.Rejected++
				c.remove(keep.elem, true)
			}
			return
		}
		c.st.Evictions++
		c.remove(el, true)
	}
	c.peak()
}

// peak records the bytes held; c.mu is held.
func (c *Cache) peak() { c.st.PeakBytes = max(c.st.PeakBytes, c.st.Bytes) }

// remove takes an entry out of the list, freeing its arrays when free is set (an
// absorbed entry's arrays were freed or moved already).
func (c *Cache) remove(el *list.Element, free bool) {
	e := el.Value.(*Entry)
	c.lru.Remove(el)
	e.elem = nil
	c.st.Bytes -= e.bytes
	if free {
		e.free()
	}
}

// fromDisk loads d's file into memory (evaluated), returning the entry or nil (a warning
// given) when the file is unusable.
func (c *Cache) fromDisk(d *diskEntry) *Entry {
	e, err := c.disk.read(d)
	if err != nil {
		c.mu.Lock()
		c.st.DiskErrors++
		c.mu.Unlock()
		c.warn(fmt.Sprintf("prefix cache: %v (treated as a miss)", err))
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e.bytes = e.size()
	if e.bytes > c.budget {
		c.st.Rejected++
		e.free()
		return nil
	}
	e.onDisk = d.path
	e.elem = c.lru.PushFront(e)
	c.st.Bytes += e.bytes
	c.evict(e)
	if e.elem == nil {
		return nil
	}
	return e
}

// Free releases every entry not in use (the cache stays usable).
func (c *Cache) Free() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for el := c.lru.Front(); el != nil; {
		next := el.Next()
		if el.Value.(*Entry).pins == 0 {
			c.remove(el, true)
		}
		el = next
	}
}

// Eval evaluates an entry's arrays (before it is inserted: the caches it came from move
// on).
func (e *Entry) Eval() { mlxc.Eval(e.arrays()...) }

// detach takes the entry's arrays out of the current scope.
func (e *Entry) detach() {
	for _, a := range e.arrays() {
		a.Detach()
	}
}

// arrays lists every array of the entry.
func (e *Entry) arrays() []*mlxc.Array {
	arrs := append(cache.SavedArrays(e.Target), cache.SavedArrays(e.Draft)...)
	for _, m := range e.Marks {
		arrs = append(arrs, cache.SavedArrays(m.Target)...)
	}
	return arrs
}

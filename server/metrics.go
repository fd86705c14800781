package server

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// metrics collects the counters /metrics exposes in the Prometheus text format (version
// 0.0.4). It is written by hand: a handful of counters and histograms do not justify a
// client library in the server's dependencies.
type metrics struct {
	mu               sync.Mutex
	requests         map[[2]string]uint64 // {endpoint, status code} → count
	generations      map[[2]string]uint64 // {endpoint, finish reason (or "error", "cancelled")} → count
	draftTokens      map[string]uint64    // endpoint → draft tokens proposed
	acceptedTokens   map[string]uint64    // endpoint → draft tokens accepted
	promptTokens     uint64
	completionTokens uint64
	queueRejected    uint64
	tau              *histogram
	acceptanceRate   *histogram // accepted/drafted per request that drafted
	tokensPerSecond  *histogram
	queueWait        *histogram
	duration         *histogram
	queueDepth       *histogram // requests already waiting when one arrives at the queue

	// batchRows has a lock of its own: the backend feeds it after every decode step, and
	// those calls should not wait behind a scrape rendering the rest.
	stepMu    sync.Mutex
	batchRows *histogram
}

func newMetrics() *metrics {
	return &metrics{
		requests:        make(map[[2]string]uint64),
		generations:     make(map[[2]string]uint64),
		draftTokens:     make(map[string]uint64),
		acceptedTokens:  make(map[string]uint64),
		tau:             newHistogram([]float64{1, 1.5, 2, 2.5, 3, 3.5, 4, 5, 6, 7, 8, 10, 12, 16}),
		acceptanceRate:  newHistogram([]float64{0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1}),
		tokensPerSecond: newHistogram([]float64{5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500, 1000}),
		queueWait:       newHistogram([]float64{0.001, 0.01, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120}),
		duration:        newHistogram([]float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}),
		queueDepth:      newHistogram([]float64{0, 1, 2, 4, 8, 16, 32, 64}),
		batchRows:       newHistogram([]float64{1, 2, 4, 8, 16, 32, 64}),
	}
}

// observeStep counts one decode step of rows requests; the backend calls it (through
// StepObserverBackend) from its decode loop.
func (m *metrics) observeStep(rows int) {
	m.stepMu.Lock()
	defer m.stepMu.Unlock()
	m.batchRows.observe(float64(rows))
}

// observeQueueDepth counts one request arriving at the queue with waiting requests ahead.
func (m *metrics) observeQueueDepth(waiting int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.queueDepth.observe(float64(waiting))
}

// observeRequest counts one finished HTTP request.
func (m *metrics) observeRequest(endpoint string, status int, elapsed time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.requests[[2]string{endpoint, strconv.Itoa(status)}]++
	if isGenerationEndpoint(endpoint) {
		m.duration.observe(elapsed.Seconds())
	}
}

// observeGeneration counts one generation that ran through endpoint, the API it came from
// (outcome is the finish reason, or "cancelled" or "error"), with its dflash report.
func (m *metrics) observeGeneration(endpoint, outcome string, promptTokens, completionTokens int, st dflashStats) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.generations[[2]string{endpoint, outcome}]++
	m.promptTokens += uint64(max(promptTokens, 0))
	m.completionTokens += uint64(max(completionTokens, 0))
	if st.Drafted > 0 {
		m.draftTokens[endpoint] += uint64(st.Drafted)
		m.acceptedTokens[endpoint] += uint64(max(st.Accepted, 0))
	}
	if st.AcceptanceRate != nil {
		m.acceptanceRate.observe(*st.AcceptanceRate)
	}
	if st.Tau > 0 {
		m.tau.observe(st.Tau)
	}
	if st.TokensPerSecond != nil {
		m.tokensPerSecond.observe(*st.TokensPerSecond)
	}
}

func (m *metrics) observeQueueWait(wait time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.queueWait.observe(wait.Seconds())
}

func (m *metrics) observeQueueRejected() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.queueRejected++
}

// storeGauges are the response store's size at scrape time.
type storeGauges struct {
	bytes, budget int64
	entries       int
}

// queueGauges are the queue's state at scrape time.
type queueGauges struct {
	waiting, running, slots int
}

// memoryGauges are the engine's device memory at scrape time.
type memoryGauges struct{ active, cached int64 }

// write renders every metric (mem: nil when the backend does not report memory).
func (m *metrics) write(w io.Writer, queue queueGauges, pc *PromptCacheState, store storeGauges, mem *memoryGauges) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var b strings.Builder

	header(&b, "dflash_http_requests_total", "counter", "HTTP requests by endpoint and status code.")
	for _, k := range sortedPairs(m.requests) {
		fmt.Fprintf(&b, "dflash_http_requests_total{endpoint=%s,code=%s} %d\n", label(k[0]), label(k[1]), m.requests[k])
	}

	header(&b, "dflash_generations_total", "counter", "Generations by API endpoint and outcome (finish reason, cancelled or error).")
	for _, k := range sortedPairs(m.generations) {
		fmt.Fprintf(&b, "dflash_generations_total{endpoint=%s,outcome=%s} %d\n", label(k[0]), label(k[1]), m.generations[k])
	}

	header(&b, "dflash_draft_tokens_total", "counter", "Draft tokens proposed, summed over generations, by API endpoint.")
	for _, k := range sortedKeys(m.draftTokens) {
		fmt.Fprintf(&b, "dflash_draft_tokens_total{endpoint=%s} %d\n", label(k), m.draftTokens[k])
	}
	header(&b, "dflash_accepted_draft_tokens_total", "counter", "Draft tokens the target accepted, summed over generations, by API endpoint.")
	for _, k := range sortedKeys(m.acceptedTokens) {
		fmt.Fprintf(&b, "dflash_accepted_draft_tokens_total{endpoint=%s} %d\n", label(k), m.acceptedTokens[k])
	}

	header(&b, "dflash_prompt_tokens_total", "counter", "Prompt tokens of generations that ran.")
	fmt.Fprintf(&b, "dflash_prompt_tokens_total %d\n", m.promptTokens)
	header(&b, "dflash_completion_tokens_total", "counter", "Generated tokens.")
	fmt.Fprintf(&b, "dflash_completion_tokens_total %d\n", m.completionTokens)
	header(&b, "dflash_queue_rejected_total", "counter", "Requests refused with 429 because the queue was full.")
	fmt.Fprintf(&b, "dflash_queue_rejected_total %d\n", m.queueRejected)

	header(&b, "dflash_queue_waiting", "gauge", "Requests waiting for a generation slot.")
	fmt.Fprintf(&b, "dflash_queue_waiting %d\n", queue.waiting)
	header(&b, "dflash_generation_running", "gauge", "Generations running now.")
	fmt.Fprintf(&b, "dflash_generation_running %d\n", queue.running)
	header(&b, "dflash_generation_slots", "gauge", "The most generations that run at once (the backend's batch size).")
	fmt.Fprintf(&b, "dflash_generation_slots %d\n", queue.slots)

	header(&b, "dflash_response_store_bytes", "gauge", "Bytes held by stored /v1/responses answers.")
	fmt.Fprintf(&b, "dflash_response_store_bytes %d\n", store.bytes)
	header(&b, "dflash_response_store_budget_bytes", "gauge", "The memory budget of the response store.")
	fmt.Fprintf(&b, "dflash_response_store_budget_bytes %d\n", store.budget)
	header(&b, "dflash_response_store_entries", "gauge", "Stored /v1/responses answers.")
	fmt.Fprintf(&b, "dflash_response_store_entries %d\n", store.entries)

	if pc != nil {
		writePromptCache(&b, *pc)
	}
	if mem != nil {
		header(&b, "dflash_device_active_bytes", "gauge", "Device memory the engine's arrays hold now (caches, weights, the prefix cache).")
		fmt.Fprintf(&b, "dflash_device_active_bytes %d\n", mem.active)
		header(&b, "dflash_device_cached_bytes", "gauge", "Device memory the allocator keeps for reuse.")
		fmt.Fprintf(&b, "dflash_device_cached_bytes %d\n", mem.cached)
	}

	m.tau.write(&b, "dflash_tau", "Mean tokens committed per DFlash cycle, per request.")
	m.acceptanceRate.write(&b, "dflash_acceptance_rate", "Accepted over drafted tokens, per request (requests that drafted).")
	m.tokensPerSecond.write(&b, "dflash_tokens_per_second", "Decode speed per request, in tokens per second (requests with a timed decode of two tokens or more).")
	m.queueWait.write(&b, "dflash_queue_wait_seconds", "Time a request waited for a generation slot.")
	m.queueDepth.write(&b, "dflash_queue_depth", "Requests already waiting when a request arrived at the queue (admitted, queued or refused).")
	m.duration.write(&b, "dflash_request_duration_seconds", "Duration of completion requests.")
	m.stepMu.Lock()
	m.batchRows.write(&b, "dflash_batch_rows", "Requests decoded together in one decode step (the batch size), per step.")
	m.stepMu.Unlock()

	_, err := io.WriteString(w, b.String())
	return err
}

// sortedPairs returns the keys of a two-label counter in order, so the output is stable.
func sortedPairs(counts map[[2]string]uint64) [][2]string {
	keys := make([][2]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i][0] != keys[j][0] {
			return keys[i][0] < keys[j][0]
		}
		return keys[i][1] < keys[j][1]
	})
	return keys
}

// sortedKeys returns the keys of a one-label counter in order, so the output is stable.
func sortedKeys(counts map[string]uint64) []string {
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// writePromptCache renders the prefix cache's counters and gauges.
func writePromptCache(b *strings.Builder, pc PromptCacheState) {
	for _, c := range []struct {
		name, typ, help string
		v               int64
	}{
		{"dflash_prompt_cache_lookups_total", "counter", "Prefix cache lookups (one per generation).", pc.Lookups},
		{"dflash_prompt_cache_hits_total", "counter", "Lookups that resumed from a cached prefix.", pc.Hits},
		{"dflash_prompt_cache_reused_tokens_total", "counter", "Prompt tokens resumed from the prefix cache instead of prefilled.", pc.ReusedTokens},
		{"dflash_prompt_cache_evictions_total", "counter", "Entries evicted to keep the memory budget.", pc.Evictions},
		{"dflash_prompt_cache_rejected_total", "counter", "Entries not kept: larger than what the budget left them.", pc.Rejected},
		{"dflash_prompt_cache_disk_hits_total", "counter", "Hits read from the prompt-cache directory.", pc.DiskHits},
		{"dflash_prompt_cache_disk_errors_total", "counter", "Prompt-cache files that were damaged, foreign or could not be written.", pc.DiskErrors},
		{"dflash_prompt_cache_entries", "gauge", "Entries held in memory.", int64(pc.Entries)},
		{"dflash_prompt_cache_bytes", "gauge", "Bytes the entries in memory hold.", pc.Bytes},
		{"dflash_prompt_cache_budget_bytes", "gauge", "The memory budget of the prefix cache.", pc.BudgetBytes},
		{"dflash_prompt_cache_peak_bytes", "gauge", "The most bytes the entries ever held.", pc.PeakBytes},
	} {
		header(b, c.name, c.typ, c.help)
		fmt.Fprintf(b, "%s %d\n", c.name, c.v)
	}
}

func header(b *strings.Builder, name, typ, help string) {
	fmt.Fprintf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
}

// label quotes a label value as the text format requires.
func label(v string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
	return `"` + r.Replace(v) + `"`
}

// histogram is a cumulative-bucket histogram with fixed upper bounds.
type histogram struct {
	bounds []float64
	counts []uint64 // per bucket, not cumulative; len(bounds)+1 with +Inf last
	sum    float64
	count  uint64
}

func newHistogram(bounds []float64) *histogram {
	return &histogram{bounds: bounds, counts: make([]uint64, len(bounds)+1)}
}

func (h *histogram) observe(v float64) {
	if math.IsNaN(v) {
		return
	}
	i := sort.SearchFloat64s(h.bounds, v) // first bound ≥ v
	h.counts[i]++
	h.sum += v
	h.count++
}

func (h *histogram) write(b *strings.Builder, name, help string) {
	header(b, name, "histogram", help)
	var cumulative uint64
	for i, bound := range h.bounds {
		cumulative += h.counts[i]
		fmt.Fprintf(b, "%s_bucket{le=%s} %d\n", name, label(strconv.FormatFloat(bound, 'g', -1, 64)), cumulative)
	}
	cumulative += h.counts[len(h.bounds)]
	fmt.Fprintf(b, "%s_bucket{le=\"+Inf\"} %d\n", name, cumulative)
	fmt.Fprintf(b, "%s_sum %s\n", name, strconv.FormatFloat(h.sum, 'g', -1, 64))
	fmt.Fprintf(b, "%s_count %d\n", name, h.count)
}

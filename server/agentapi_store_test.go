package server_test

import (
	"fmt"
	"math"
	"net/http"
	"runtime"
	"strings"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/server"
	"github.com/dflash-mlx/dflash-mlx/server/servertest"
)

// storeBytes reads the response store's accounted bytes from /metrics.
func storeBytes(t *testing.T, baseURL string) float64 {
	t.Helper()
	_, data := do(t, http.MethodGet, baseURL+"/metrics", nil)
	families, err := parsePromText(string(data))
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	v := promValue(families, "dflash_response_store_bytes", "dflash_response_store_bytes", map[string]string{})
	if math.IsNaN(v) {
		t.Fatal("no dflash_response_store_bytes in /metrics")
	}
	return v
}

// heapAfterGC is the live heap once garbage (and the sync.Pools' victims) is collected.
func heapAfterGC() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// Under 1000 stored responses of 8 KiB of input each (about 11 MB if all were kept), the
// store keeps to its 256 KiB budget: the accounted bytes never pass it, the oldest
// responses are gone and the newest are there, and what emptying the store frees stays
// near the budget. That last measure also counts what a thousand requests leave behind
// elsewhere, so it gets a quarter of slack; TestResponseStoreHeap measures the store alone.
func TestResponseStoreStaysWithinItsBudget(t *testing.T) {
	const budget = 256 << 10
	const requests = 1000
	srv := newFakeServer(t, server.Config{ResponseStoreBytes: budget}, &servertest.Fake{Context: 16384})
	pad := strings.Repeat("padding ", 1024) // 8 KiB
	var ids []string
	peak := 0.0
	for i := range requests {
		resp := postJSONOK(t, srv.URL+"/v1/responses", map[string]any{"input": fmt.Sprintf("[[id:n%d]] %s", i, pad),
			"max_output_tokens": 64})
		ids = append(ids, str(resp["id"]))
		b := storeBytes(t, srv.URL)
		if b > budget {
			t.Fatalf("after %d responses the store holds %.0f bytes, over its budget of %d", i+1, b, budget)
		}
		peak = max(peak, b)
	}
	if resp, _ := do(t, http.MethodGet, srv.URL+"/v1/responses/"+ids[0], nil); resp.StatusCode != http.StatusNotFound {
		t.Errorf("the oldest response is still stored: %d", resp.StatusCode)
	}
	do200(t, http.MethodGet, srv.URL+"/v1/responses/"+ids[len(ids)-1])

	// What the store holds is what emptying it frees.
	full := heapAfterGC()
	kept := 0
	for _, id := range ids {
		if resp, _ := do(t, http.MethodDelete, srv.URL+"/v1/responses/"+id, nil); resp.StatusCode == http.StatusOK {
			kept++
		}
	}
	held := full - heapAfterGC()
	if b := storeBytes(t, srv.URL); b != 0 {
		t.Errorf("the emptied store accounts %.0f bytes", b)
	}
	t.Logf("%d responses of %d bytes of input: the store kept the last %d, accounted at most %.0f bytes (budget %d), "+
		"and emptying it freed %d bytes of heap", requests, len(pad), kept, peak, budget, held)
	if held > budget*5/4 {
		t.Errorf("emptying the store freed %d bytes of heap, far over its budget of %d", held, budget)
	}
}

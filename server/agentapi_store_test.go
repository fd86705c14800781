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

// Under 1000 stored responses of 8 KiB of input each (about 9 MB if all were kept), the
// store keeps to its 256 KiB budget: the accounted bytes never pass it, the heap grows by
// far less than what was sent, the oldest responses are gone and the newest are there.
func TestResponseStoreStaysWithinItsBudget(t *testing.T) {
	const budget = 256 << 10
	const requests = 1000
	srv := newFakeServer(t, server.Config{ResponseStoreBytes: budget}, &servertest.Fake{Context: 16384})
	pad := strings.Repeat("padding ", 1024) // 8 KiB
	// Warm up the connection and the server's pools before measuring.
	postJSONOK(t, srv.URL+"/v1/responses", map[string]any{"input": "warm", "store": false})
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	var ids []string
	peak := 0.0
	for i := range requests {
		resp := postJSONOK(t, srv.URL+"/v1/responses", map[string]any{"input": fmt.Sprintf("[[id:n%d]] %s", i, pad),
			"max_output_tokens": 64})
		ids = append(ids, str(resp["id"]))
		if i%50 == 49 {
			b := storeBytes(t, srv.URL)
			peak = max(peak, b)
			if b > budget {
				t.Fatalf("after %d responses the store holds %.0f bytes, over its budget of %d", i+1, b, budget)
			}
		}
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	growth := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d responses of %d bytes of input: store peak %.0f bytes (budget %d), heap growth %d bytes",
		requests, len(pad), peak, budget, growth)
	if growth > 4*budget {
		t.Errorf("the heap grew by %d bytes over %d requests; the store's budget is %d", growth, requests, budget)
	}
	if resp, _ := do(t, http.MethodGet, srv.URL+"/v1/responses/"+ids[0], nil); resp.StatusCode != http.StatusNotFound {
		t.Errorf("the oldest response is still stored: %d", resp.StatusCode)
	}
	do200(t, http.MethodGet, srv.URL+"/v1/responses/"+ids[len(ids)-1])
}

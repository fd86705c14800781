package server_test

import (
	"net/http"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/server"
	"github.com/dflash-mlx/dflash-mlx/server/servertest"
)

func TestAPIKey(t *testing.T) {
	srv := newFakeServer(t, server.Config{APIKey: "sekret"}, &servertest.Fake{})
	chat := srv.URL + "/v1/chat/completions"
	tests := []struct {
		name    string
		method  string
		url     string
		headers []string
		status  int
	}{
		{"no header", "POST", chat, nil, 401},
		{"wrong key", "POST", chat, []string{"Authorization", "Bearer nope"}, 401},
		{"key as a prefix", "POST", chat, []string{"Authorization", "Bearer sekretX"}, 401},
		{"wrong scheme", "POST", chat, []string{"Authorization", "Basic sekret"}, 401},
		{"right key", "POST", chat, []string{"Authorization", "Bearer sekret"}, 200},
		{"scheme is case-insensitive", "POST", chat, []string{"Authorization", "bearer sekret"}, 200},
		{"models need the key", "GET", srv.URL + "/v1/models", nil, 401},
		{"metrics need the key", "GET", srv.URL + "/metrics", nil, 401},
		{"metrics with the key", "GET", srv.URL + "/metrics", []string{"Authorization", "Bearer sekret"}, 200},
		{"health is open", "GET", srv.URL + "/health", nil, 200},
		{"unknown paths do not reveal themselves", "GET", srv.URL + "/nope", nil, 401},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var body any
			if tt.method == "POST" {
				body = userChat("hi")
			}
			resp, data := do(t, tt.method, tt.url, body, tt.headers...)
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.status, data)
			}
			if tt.status == 401 {
				var er errorResponse
				decode(t, data, &er)
				if er.Error == nil || er.Error.Code == nil || *er.Error.Code != "invalid_api_key" {
					t.Fatalf("401 body %s", data)
				}
				if resp.Header.Get("WWW-Authenticate") == "" {
					t.Error("401 without WWW-Authenticate")
				}
			}
		})
	}
}

func TestCORS(t *testing.T) {
	srv := newFakeServer(t, server.Config{CORSOrigins: []string{"http://app.example"}}, &servertest.Fake{})
	// Preflight from an allowed origin.
	resp, _ := do(t, http.MethodOptions, srv.URL+"/v1/chat/completions", nil,
		"Origin", "http://app.example", "Access-Control-Request-Method", "POST",
		"Access-Control-Request-Headers", "authorization, content-type")
	if resp.StatusCode != http.StatusNoContent ||
		resp.Header.Get("Access-Control-Allow-Origin") != "http://app.example" ||
		resp.Header.Get("Access-Control-Allow-Headers") != "authorization, content-type" ||
		resp.Header.Get("Access-Control-Allow-Methods") == "" {
		t.Fatalf("preflight: %d %v", resp.StatusCode, resp.Header)
	}
	// A real request from an allowed origin gets the header; another origin does not.
	resp, _ = do(t, http.MethodGet, srv.URL+"/v1/models", nil, "Origin", "http://app.example")
	if resp.Header.Get("Access-Control-Allow-Origin") != "http://app.example" {
		t.Errorf("allowed origin: headers %v", resp.Header)
	}
	resp, _ = do(t, http.MethodGet, srv.URL+"/v1/models", nil, "Origin", "http://evil.example")
	if resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("other origin got CORS headers: %v", resp.Header)
	}
	// Without configured origins nothing is allowed.
	plain := newFakeServer(t, server.Config{}, &servertest.Fake{})
	resp, _ = do(t, http.MethodOptions, plain.URL+"/v1/chat/completions", nil, "Origin", "http://app.example")
	if resp.StatusCode != http.StatusNoContent || resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("no CORS config: %d %v", resp.StatusCode, resp.Header)
	}
}

func TestConfigIsValidated(t *testing.T) {
	bad := []server.Config{
		{Port: 70000},
		{MaxQueue: server.NoQueue - 1},
		{DefaultTemperature: 3},
		{CORSOrigins: []string{"app.example"}},
		{CORSOrigins: []string{"http://app.example/"}},
		{WriteTimeout: -1},
	}
	for _, cfg := range bad {
		if _, err := server.New(cfg, &servertest.Fake{}, nil); err == nil {
			t.Errorf("config %+v accepted", cfg)
		}
	}
	if _, err := server.New(server.Config{}, nil, nil); err == nil {
		t.Error("nil backend accepted")
	}
}

package server

import (
	"net/http"
	"strings"
	"time"
)

// serverStart is reported as the models' "created" time: the model was loaded then.
var serverStart = time.Now().Unix()

func (s *Server) modelInfo() modelInfo {
	return modelInfo{ID: s.backend.ModelID(), Object: "model", Created: serverStart, OwnedBy: "dflash-mlx",
		ContextLength: s.backend.ContextLength()}
}

// handleModels lists the one served model (aliases are accepted in requests, not listed).
func (s *Server) handleModels(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, modelList{Object: "list", Data: []modelInfo{s.modelInfo()}})
}

// handleModel answers /v1/models/{id} for the served model or one of its aliases.
func (s *Server) handleModel(w http.ResponseWriter, r *http.Request) {
	id := strings.TrimPrefix(r.URL.Path, modelPathPrefix)
	if err := s.checkModel(id); err != nil {
		writeAPIError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.modelInfo())
}

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	waiting, running := s.queue.depth()
	writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "model": s.backend.ModelID(),
		"queued": waiting, "running": running})
}

func (s *Server) handleMetrics(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	waiting, running := s.queue.depth()
	queue := queueGauges{waiting: waiting, running: running, slots: s.queue.slots}
	var pc *PromptCacheState
	if r, ok := s.backend.(PromptCacheReporter); ok {
		if st, ok := r.PromptCacheState(); ok {
			pc = &st
		}
	}
	bytes, entries := s.responses.usage()
	store := storeGauges{bytes: bytes, budget: s.cfg.ResponseStoreBytes, entries: entries}
	var mem *memoryGauges
	if r, ok := s.backend.(MemoryReporter); ok {
		active, cached := r.DeviceMemory()
		mem = &memoryGauges{active: active, cached: cached}
	}
	if err := s.metrics.write(w, queue, pc, store, mem); err != nil {
		s.log.Debug("writing metrics failed", "err", err)
	}
}

#!/usr/bin/env python3
"""Soak test of the batched server: many streaming clients for a while, some of which hang
up midway, every finished answer checked against the prompt's answer alone, and device
memory checked to return to its idle level afterwards.

    third_party/pyref/bin/python scripts/soak_serve.py --clients 32 --seconds 60
    third_party/pyref/bin/python scripts/soak_serve.py --clients 8 --seconds 15 --max-tokens 32 --json

1. The server is started here (bin/dflash-mlx serve --no-draft --max-batch --max-queue, the
   prompt cache off unless --prompt-cache) and waited for; --url uses a running one instead.
2. A pool of --prompts distinct Go-code requests (--long of them ~1000 tokens long, made by
   repeating context code) is answered one at a time, non-streaming, greedy, --max-tokens
   tokens: these are the references (text and finish_reason).
3. The idle baseline of dflash_device_active_bytes is read from /metrics (less
   dflash_prompt_cache_bytes, so that a prompt cache filling up is not taken for a leak).
4. --clients threads loop for --seconds: a random prompt, streamed; with probability
   --disconnect-rate the client hangs up at a random point (before the response, or after
   k SSE chunks; half with a reset, half with a plain close), otherwise it reads to the end
   and the text and finish_reason must equal the reference's. 429s are counted apart from
   other errors. /metrics is polled every second for the largest queue and batch.
5. After the load (after each of --rounds load phases): /health must reach queued 0 and running 0, then active memory (less the
   prompt cache) must settle back to at most the baseline + --leak-tolerance-mib. A few
   references are asked again alone and must still match.
6. Summary (--json for JSON); the exit status is 1 on a wrong answer, an error, a 429 that
   the queue should have absorbed, a queue over --max-queue, a hang or a leak.

Only the Python standard library is used.
"""
import argparse
import http.client
import json
import os
import random
import re
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

sys.dont_write_bytecode = True  # no __pycache__ next to the scripts
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_serve_load import ROOT, TOPICS, server_command, stop_server, wait_ready  # noqa: E402

MIB = 1 << 20

# Context for the long prompts: repeated until the prompt is about --long-tokens tokens.
CONTEXT = '''// Package store keeps values by key with an expiry.
package store

import (
	"sync"
	"time"
)

type entry struct {
	value   []byte
	expires time.Time
}

// Store is safe for concurrent use.
type Store struct {
	mu sync.Mutex
	m  map[string]entry
}

func (s *Store) Get(key string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[key]
	if !ok || time.Now().After(e.expires) {
		return nil, false
	}
	return e.value, true
}
'''

SHORT_FORMS = ["Write the Go file for {t}.",
               "Write the Go file for {t}, with tests.",
               "Implement {t} in Go with a small exported API.",
               "Write {t} in Go; keep it in one package with doc comments."]


def make_prompts(n, n_long, long_chars):
    """n distinct prompts, the first n_long of them long (context code repeated to about
    long_chars characters, then a request), the rest short."""
    prompts = []
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)]
        if i < n_long:
            reps = max(1, long_chars // len(CONTEXT))
            ctx = "\n".join(f"// file {j}\n{CONTEXT}" for j in range(reps))
            prompts.append(f"Here is some code from the repository:\n\n{ctx}\n"
                           f"Using the same style, write the Go file for {topic} (variant {i}).")
        else:
            prompts.append(SHORT_FORMS[(i // len(TOPICS) + i) % len(SHORT_FORMS)].format(t=topic))
    assert len(set(prompts)) == n
    return prompts


def request_body(model, prompt, max_tokens, stream):
    body = {"model": model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body).encode()


def solo_answer(url, model, prompt, max_tokens):
    req = urllib.request.Request(url + "/v1/chat/completions",
                                 data=request_body(model, prompt, max_tokens, False),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        out = json.load(r)
    ch = out["choices"][0]
    return {"text": ch["message"]["content"] or "", "finish": ch["finish_reason"],
            "prompt_tokens": out["usage"]["prompt_tokens"],
            "completion_tokens": out["usage"]["completion_tokens"]}


def get_metrics(url):
    """Prometheus text as {name{labels}: value} (comments skipped)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            pass
    return out


def get_health(url):
    with urllib.request.urlopen(url + "/health", timeout=10) as r:
        return json.load(r)


def net_active(m):
    """Active device bytes less what the prompt cache holds (None when not reported)."""
    if "dflash_device_active_bytes" not in m:
        return None
    return m["dflash_device_active_bytes"] - m.get("dflash_prompt_cache_bytes", 0)


def histogram(m, name, before=None):
    """{"buckets": [(le, count in this bucket)], "sum", "count", "mean"} of a histogram,
    as the difference from `before` when given."""
    before = before or {}
    d = lambda k: m.get(k, 0) - before.get(k, 0)  # noqa: E731
    cum = []
    for k in m:
        mt = re.fullmatch(re.escape(name) + r'_bucket\{le="([^"]+)"\}', k)
        if mt:
            le = mt.group(1)
            cum.append((float("inf") if le == "+Inf" else float(le), le, d(k)))
    cum.sort()
    buckets, prev = [], 0
    for _, le, c in cum:
        buckets.append((le, int(c - prev)))
        prev = c
    s, c = d(name + "_sum"), d(name + "_count")
    return {"buckets": [b for b in buckets if b[1]], "sum": s, "count": int(c),
            "mean": round(s / c, 3) if c else None}


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.completed = self.disconnected = self.rejected = 0
        self.tokens = 0          # completion tokens of the streams read to the end
        self.wrong = []          # dicts: prompt, expected, got
        self.errors = []         # strings
        self.by_prompt = {}


def abort(sock, reset):
    """Hang up: a reset (SO_LINGER 0) or a plain close."""
    try:
        if reset:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        else:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def stream_one(host, port, model, prompt, max_tokens, timeout, cut, reset):
    """One streaming request. cut: None to read to the end, -1 to hang up right after
    sending, k >= 0 to hang up after k SSE data events. Returns (kind, text, finish, usage
    tokens, detail) with kind one of done, cut, 429, error."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    body = request_body(model, prompt, max_tokens, True)
    resp = None
    try:
        conn.request("POST", "/v1/chat/completions", body=body,
                     headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
        sock = conn.sock
        if cut == -1:
            abort(sock, reset)
            return "cut", "", None, 0, "before the response"
        resp = conn.getresponse()
        if resp.status == 429:
            resp.read()
            return "429", "", None, 0, ""
        if resp.status != 200:
            return "error", "", None, 0, f"HTTP {resp.status}: {resp.read()[:300]!r}"
        text, finish, tokens, events, done = [], None, 0, 0, False
        while True:
            if cut is not None and events >= cut:
                resp.close()
                abort(sock, reset)
                return "cut", "".join(text), finish, tokens, f"after {events} events"
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            events += 1
            if data == b"[DONE]":
                done = True
                break
            ev = json.loads(data)
            if "error" in ev:
                return "error", "".join(text), finish, tokens, f"error event: {ev['error']}"
            for ch in ev.get("choices") or []:
                text.append((ch.get("delta") or {}).get("content") or "")
                if ch.get("finish_reason"):
                    finish = ch["finish_reason"]
            if ev.get("usage"):
                tokens = ev["usage"].get("completion_tokens", 0)
        if not done:
            return "error", "".join(text), finish, tokens, f"stream ended without [DONE] after {events} events"
        return "done", "".join(text), finish, tokens, ""
    except (OSError, http.client.HTTPException, ValueError) as e:
        return "error", "", None, 0, repr(e)
    finally:
        conn.close()


def client_loop(c, a, url, model, prompts, refs, stop_at, stats):
    u = urllib.parse.urlparse(url)
    host, port = u.hostname, u.port or 80
    rng = random.Random(a.seed * 1000003 + c)
    while time.time() < stop_at:
        i = rng.randrange(len(prompts))
        cut, reset = None, False
        if rng.random() < a.disconnect_rate:
            reset = rng.random() < 0.5
            cut = -1 if rng.random() < 0.1 else rng.randint(0, a.max_tokens)
        kind, text, finish, toks, detail = stream_one(host, port, model, prompts[i], a.max_tokens,
                                                      a.request_timeout, cut, reset)
        with stats.lock:
            if kind == "cut":
                stats.disconnected += 1
            elif kind == "429":
                stats.rejected += 1
            elif kind == "error":
                stats.errors.append(f"prompt {i}: {detail}")
            else:
                ref = refs[i]
                stats.completed += 1
                stats.tokens += toks
                stats.by_prompt[i] = stats.by_prompt.get(i, 0) + 1
                if text != ref["text"] or finish != ref["finish"]:
                    n = next((k for k in range(min(len(text), len(ref["text"])))
                              if text[k] != ref["text"][k]), min(len(text), len(ref["text"])))
                    stats.wrong.append({"prompt": i, "diverges_at_char": n,
                                        "expected_finish": ref["finish"], "got_finish": finish,
                                        "expected": ref["text"][:n + 60], "got": text[:n + 60]})
        if kind == "429":
            time.sleep(0.2)


def poll_metrics(url, stop, peaks):
    while not stop.is_set():
        try:
            m = get_metrics(url)
            for key, name in (("queue_waiting", "dflash_queue_waiting"),
                              ("running", "dflash_generation_running")):
                if name in m:
                    peaks[key] = max(peaks[key], int(m[name]))
            peaks["polls"] += 1
        except (OSError, ValueError) as e:
            peaks["poll_errors"].append(repr(e))
        stop.wait(1.0)


def settle_idle(url, timeout):
    """Seconds until /health shows nothing queued or running, or None on timeout."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            h = get_health(url)
            if h.get("queued") == 0 and h.get("running") == 0:
                return round(time.time() - t0, 2)
        except (OSError, ValueError):
            pass
        time.sleep(0.25)
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(ROOT, "testdata", "gocode", "target"))
    ap.add_argument("--url", help="a server already running (not started or stopped here)")
    ap.add_argument("--port", type=int, default=8766)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=60, help="how long clients start new requests (per round)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="load phases, idle memory read after each (a leak grows round after round)")
    ap.add_argument("--max-batch", type=int, default=8, help="the server's --max-batch (started here)")
    ap.add_argument("--max-queue", type=int, default=32, help="the server's --max-queue (started here)")
    ap.add_argument("--disconnect-rate", type=float, default=0.2)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=24, help="distinct prompts in the pool")
    ap.add_argument("--long", type=int, default=3, help="how many of them are long")
    ap.add_argument("--long-chars", type=int, default=3000, help="characters of context in a long prompt (~1000 tokens)")
    ap.add_argument("--prompt-cache", action="store_true",
                    help="leave the server's prompt cache on (default: --prompt-cache-bytes 0)")
    ap.add_argument("--leak-tolerance-mib", type=float, default=1.0)
    ap.add_argument("--settle-timeout", type=float, default=60, help="seconds for the server to become idle")
    ap.add_argument("--request-timeout", type=float, default=300, help="socket timeout of one request")
    ap.add_argument("--recheck", type=int, default=3, help="references asked again alone after the load")
    ap.add_argument("--ready-timeout", type=float, default=300)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("server_args", nargs="*", help="after --: extra arguments for the server")
    a = ap.parse_args()
    if a.clients < 1 or a.max_tokens < 1 or a.prompts < 1 or a.rounds < 1 or not 0 <= a.disconnect_rate <= 1:
        raise SystemExit("--clients, --max-tokens, --prompts and --rounds must be positive, --disconnect-rate in [0, 1]")
    log = (lambda *x: print(*x, file=sys.stderr, flush=True)) if a.json else (lambda *x: print(*x, flush=True))

    proc, url = None, a.url
    if url is None:
        url = f"http://127.0.0.1:{a.port}"
        extra = ["--max-batch", str(a.max_batch), "--max-queue", str(a.max_queue)]
        if not a.prompt_cache:
            extra += ["--prompt-cache-bytes", "0"]
        proc = subprocess.Popen(server_command("ours", a.model, a.port, extra + a.server_args),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    failures = []
    try:
        model = wait_ready(url, proc, a.ready_timeout, a.model)
        prompts = make_prompts(a.prompts, min(a.long, a.prompts), a.long_chars)
        t0 = time.time()
        refs = [solo_answer(url, model, p, a.max_tokens) for p in prompts]
        ref_s = time.time() - t0
        plens = [r["prompt_tokens"] for r in refs]
        log(f"references: {len(refs)} prompts ({min(plens)}-{max(plens)} prompt tokens, "
            f"long ones {plens[:min(a.long, a.prompts)]}) in {ref_s:.1f}s")
        if settle_idle(url, a.settle_timeout) is None:
            failures.append("the server did not become idle after the references")
        time.sleep(1)
        m0 = get_metrics(url)
        base = net_active(m0)

        stats, peaks = Stats(), {"queue_waiting": 0, "running": 0, "polls": 0, "poll_errors": []}
        tol = a.leak_tolerance_mib * MIB
        wall, idle_s, rounds, m1, after = 0.0, 0.0, [], m0, base
        for rnd in range(a.rounds):
            stop = threading.Event()
            poller = threading.Thread(target=poll_metrics, args=(url, stop, peaks), daemon=True)
            poller.start()
            log(f"load{f' round {rnd + 1}/{a.rounds}' if a.rounds > 1 else ''}: {a.clients} clients for "
                f"{a.seconds:g}s, disconnect rate {a.disconnect_rate}, {a.max_tokens} tokens")
            t0 = time.time()
            stop_at = t0 + a.seconds
            threads = [threading.Thread(target=client_loop,
                                        args=(c + rnd * a.clients, a, url, model, prompts, refs, stop_at, stats))
                       for c in range(a.clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall += time.time() - t0
            idle = settle_idle(url, a.settle_timeout)
            stop.set()
            poller.join()
            if idle is None:
                h = get_health(url)
                failures.append(f"hang: /health still shows queued {h.get('queued')} running {h.get('running')} "
                                f"{a.settle_timeout:g}s after the load")
                idle_s = None
                break
            idle_s = max(idle_s, idle)

            # Memory: give the engine a moment to release what finished rows held.
            time.sleep(2)
            m1 = get_metrics(url)
            after = net_active(m1)
            deadline = time.time() + 10
            while base is not None and after is not None and after > base + tol and time.time() < deadline:
                time.sleep(1)
                m1 = get_metrics(url)
                after = net_active(m1)
            rounds.append({"round": rnd + 1, "active": m1.get("dflash_device_active_bytes"),
                           "prompt_cache": m1.get("dflash_prompt_cache_bytes"),
                           "prompt_cache_entries": m1.get("dflash_prompt_cache_entries"),
                           "net_delta_bytes": None if base is None or after is None else after - base})
            if a.rounds > 1:
                nd = rounds[-1]["net_delta_bytes"]
                log(f"  after round {rnd + 1}: {stats.completed} completed, {stats.disconnected} disconnected, "
                    f"{len(stats.wrong)} wrong; net memory delta {'n/a' if nd is None else f'{nd / MIB:.2f} MiB'}")
        leaked = base is not None and after is not None and after > base + tol

        rechecks = []
        n = min(a.recheck, a.prompts)
        for i in sorted({round(k * (a.prompts - 1) / max(1, n - 1)) for k in range(n)}):
            r = solo_answer(url, model, prompts[i], a.max_tokens)
            rechecks.append({"prompt": i, "same": r["text"] == refs[i]["text"] and r["finish"] == refs[i]["finish"]})
    finally:
        stop_server(proc)

    d = lambda k: m1.get(k, 0) - m0.get(k, 0)  # noqa: E731
    batch = histogram(m1, "dflash_batch_rows", m0)
    qdepth = histogram(m1, "dflash_queue_depth", m0)
    expect_no_429 = a.url is None and a.clients <= a.max_batch + a.max_queue
    if stats.wrong:
        failures.append(f"{len(stats.wrong)} wrong answers")
    if stats.errors:
        failures.append(f"{len(stats.errors)} errors")
    if stats.rejected and expect_no_429:
        failures.append(f"{stats.rejected} 429s with {a.clients} clients <= max-batch + max-queue")
    if a.url is None and peaks["queue_waiting"] > a.max_queue:
        failures.append(f"queue reached {peaks['queue_waiting']} > max-queue {a.max_queue}")
    if leaked:
        failures.append(f"leak: active memory (less the prompt cache) {after / MIB:.2f} MiB after the load, "
                        f"baseline {base / MIB:.2f} MiB")
    if base is None:
        failures.append("no dflash_device_active_bytes in /metrics: memory not checked")
    bad = [r["prompt"] for r in rechecks if not r["same"]]
    if bad:
        failures.append(f"solo answers changed after the load: prompts {bad}")

    summary = {
        "server": a.url or "started here", "model": a.model, "clients": a.clients, "seconds": a.seconds,
        "max_batch": a.max_batch, "max_queue": a.max_queue, "disconnect_rate": a.disconnect_rate,
        "max_tokens": a.max_tokens, "seed": a.seed, "rounds": a.rounds, "prompt_cache": bool(a.url) or a.prompt_cache,
        "prompts": a.prompts, "prompt_tokens_min": min(plens), "prompt_tokens_max": max(plens),
        "references_s": round(ref_s, 2), "load_wall_s": round(wall, 2),
        "completed": stats.completed, "disconnected": stats.disconnected, "wrong": len(stats.wrong),
        "rejected_429": stats.rejected, "errors": len(stats.errors),
        "prompts_hit": len(stats.by_prompt),
        "client_tok_s": round(stats.tokens / wall, 2) if wall > 0 else 0,
        "server_tok_s": round(d("dflash_completion_tokens_total") / wall, 2) if wall > 0 else 0,
        "server_completion_tokens": int(d("dflash_completion_tokens_total")),
        "max_queue_waiting": peaks["queue_waiting"], "max_running": peaks["running"],
        "metric_polls": peaks["polls"], "metric_poll_errors": len(peaks["poll_errors"]),
        "queue_rejected_total": int(d("dflash_queue_rejected_total")),
        "batch_rows": batch, "queue_depth": qdepth, "idle_after_s": idle_s,
        "memory": {"baseline_active": m0.get("dflash_device_active_bytes"),
                   "baseline_prompt_cache": m0.get("dflash_prompt_cache_bytes"),
                   "baseline_prompt_cache_entries": m0.get("dflash_prompt_cache_entries"),
                   "after_active": m1.get("dflash_device_active_bytes"),
                   "after_prompt_cache": m1.get("dflash_prompt_cache_bytes"),
                   "after_cached": m1.get("dflash_device_cached_bytes"),
                   "net_delta_bytes": None if base is None or after is None else after - base,
                   "tolerance_bytes": tol, "per_round": rounds},
        "rechecks": rechecks,
        "wrong_answers": stats.wrong[:10], "error_samples": stats.errors[:10],
        "failures": failures, "ok": not failures,
    }
    if a.json:
        print(json.dumps(summary, indent=2))
    else:
        mem = summary["memory"]
        mb = lambda v: "n/a" if v is None else f"{v / MIB:.2f} MiB"  # noqa: E731
        print(f"requests: {stats.completed} completed, {stats.disconnected} disconnected, "
              f"{len(stats.wrong)} wrong, {stats.rejected} 429s, {len(stats.errors)} errors "
              f"({len(stats.by_prompt)}/{a.prompts} prompts checked) in {wall:.1f}s")
        print(f"throughput: {summary['client_tok_s']} tok/s received by clients, "
              f"{summary['server_tok_s']} tok/s generated by the server (disconnected rows included)")
        print(f"queue: max waiting {peaks['queue_waiting']} (limit {a.max_queue}), max running "
              f"{peaks['running']} (batch {a.max_batch}); idle {idle_s}s after the load")
        print(f"batch rows during the load: mean {batch['mean']} over {batch['count']} steps; "
              + ", ".join(f"<={le}: {n}" for le, n in batch["buckets"]))
        print(f"queue depth at admission: mean {qdepth['mean']} over {qdepth['count']}")
        print(f"memory: active {mb(mem['baseline_active'])} -> {mb(mem['after_active'])}, prompt cache "
              f"{mb(mem['baseline_prompt_cache'])} -> {mb(mem['after_prompt_cache'])}, net delta "
              f"{mb(mem['net_delta_bytes'])} (tolerance {mb(tol)}), allocator cache {mb(mem['after_cached'])}")
        if len(rounds) > 1:
            print("net memory delta after each round: " + ", ".join(mb(r["net_delta_bytes"]) for r in rounds))
        print("rechecks alone after the load: " + ", ".join(
            f"prompt {r['prompt']} {'same' if r['same'] else 'DIFFERENT'}" for r in rechecks))
        for w in stats.wrong[:5]:
            print(f"WRONG prompt {w['prompt']} at char {w['diverges_at_char']} "
                  f"(finish {w['expected_finish']} vs {w['got_finish']}):\n"
                  f"  expected {w['expected']!r}\n  got      {w['got']!r}")
        for e in stats.errors[:5]:
            print(f"ERROR {e}")
        print("OK" if not failures else "FAIL: " + "; ".join(failures))
    sys.exit(0 if not failures else 1)


if __name__ == "__main__":
    main()

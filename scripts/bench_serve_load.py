#!/usr/bin/env python3
"""Concurrent client load against an OpenAI-compatible server: aggregate and per-request
throughput and latency at several client counts, so that dflash-mlx's server and mlx-lm's
can be compared under the same load on the same model.

    third_party/pyref/bin/python scripts/bench_serve_load.py --server ours  --model testdata/gocode/target
    third_party/pyref/bin/python scripts/bench_serve_load.py --server mlxlm --model testdata/gocode/target

Each client sends --requests chat completions one after the other (temperature 0,
--max-tokens new tokens, prompts that differ per client and request); the clients of one
round start together. Throughput counts the completion tokens the server reports in
`usage`; latency is from sending a request to its last byte. The server is started here,
waited for (GET /v1/models) and stopped at the end; --url uses a running one instead.
Only the Python standard library is used, so any interpreter runs it; the reference venv
has mlx-lm for --server mlxlm.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Go-code prompts in the trained pair's style; any model answers them.
TOPICS = ["a ring buffer", "a token bucket rate limiter", "an LRU cache", "a trie", "a binary heap",
          "a worker pool", "a bloom filter", "a skip list", "a CSV reader", "a retry helper with backoff",
          "a semaphore", "an interval tree", "a JSON pretty printer", "a line counter", "a URL router",
          "a priority queue"]


def server_command(kind, model, port, extra):
    # DFLASH_MLX_BIN: another build of ours than bin/dflash-mlx (a GPU machine's bundle).
    ours = os.environ.get("DFLASH_MLX_BIN", os.path.join(ROOT, "bin", "dflash-mlx"))
    if kind == "ours":
        return [ours, "serve", "--target-model", model, "--no-draft",
                "--port", str(port), "--quiet"] + extra
    if kind == "ours-dflash":
        # The drafter beside the target (the Go-code pair's layout: target/ and draft/).
        draft = os.path.join(os.path.dirname(os.path.normpath(model)), "draft")
        return [ours, "serve", "--target-model", model, "--draft-model", draft,
                "--port", str(port), "--quiet"] + extra
    if kind == "mlxlm":
        return [sys.executable, "-m", "mlx_lm.server", "--model", model, "--port", str(port)] + extra
    raise SystemExit(f"unknown --server {kind!r} (ours, ours-dflash or mlxlm)")


def stop_server(proc):
    """Stops a server this script started (its whole process group): SIGTERM, then
    SIGKILL after 30 s; None (a server given by --url) is left alone."""
    if proc is None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def wait_ready(url, proc, timeout, fallback_model):
    """The model id to send, once the server answers: the first of GET /v1/models, or,
    when that listing fails (mlx-lm's scans the Hugging Face cache, which may not exist),
    fallback_model once a one-token completion with it succeeds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode} before it answered")
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=2) as r:
                models = json.load(r)["data"]
                return models[0]["id"] if models else fallback_model
        except (urllib.error.URLError, ConnectionError, TimeoutError, KeyError, IndexError, ValueError):
            pass
        try:
            one_request(url, fallback_model, "ping", 1)
            return fallback_model
        except (urllib.error.URLError, ConnectionError, TimeoutError, KeyError, ValueError):
            time.sleep(0.5)
    raise SystemExit(f"no answer from {url} within {timeout}s")


def one_request(url, model, prompt, max_tokens):
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": prompt}],
                       "max_tokens": max_tokens, "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    t0 = time.time()
    with urllib.request.urlopen(req, timeout=3600) as r:
        out = json.load(r)
    return time.time() - t0, out["usage"]["completion_tokens"]


def run_round(url, model, clients, requests, max_tokens):
    results, errors = [], []
    lock = threading.Lock()
    start = threading.Barrier(clients)

    def client(c):
        start.wait()
        for i in range(requests):
            topic = TOPICS[(c * requests + i) % len(TOPICS)]
            prompt = f"Write the Go file for {topic} (client {c}, request {i})."
            try:
                lat, toks = one_request(url, model, prompt, max_tokens)
                with lock:
                    results.append((lat, toks))
            except Exception as e:  # a failed request is reported, not retried
                with lock:
                    errors.append(repr(e))

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.time() - t0
    lats = sorted(r[0] for r in results)
    toks = sum(r[1] for r in results)
    return {
        "clients": clients, "requests": len(results), "errors": errors, "completion_tokens": toks,
        "wall_s": round(wall, 3), "aggregate_tok_s": round(toks / wall, 2) if wall > 0 else 0,
        "per_request_tok_s": round(statistics.median(r[1] / r[0] for r in results), 2) if results else 0,
        "latency_p50_s": round(statistics.median(lats), 3) if lats else None,
        "latency_p90_s": round(lats[min(len(lats) - 1, int(0.9 * len(lats)))], 3) if lats else None,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", choices=["ours", "ours-dflash", "mlxlm"], default="ours",
                    help="ours: serve --no-draft (plain batching); ours-dflash: serve with the drafter in the model's sibling draft/ folder (batched speculation); mlxlm: mlx_lm.server")
    ap.add_argument("--model", default=os.path.join(ROOT, "testdata", "gocode", "target"))
    ap.add_argument("--url", help="a server already running (not started or stopped here)")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--clients", default="1,4,8", help="comma-separated client counts, one round each")
    ap.add_argument("--requests", type=int, default=2, help="requests per client in a round")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--ready-timeout", type=float, default=300)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("server_args", nargs="*", help="after --: extra arguments for the server")
    a = ap.parse_args()
    counts = [int(x) for x in a.clients.split(",") if x.strip()]
    if not counts or min(counts) < 1 or a.requests < 1 or a.max_tokens < 1:
        raise SystemExit("--clients, --requests and --max-tokens must be positive")
    proc = None
    url = a.url
    if url is None:
        url = f"http://127.0.0.1:{a.port}"
        proc = subprocess.Popen(server_command(a.server, a.model, a.port, a.server_args),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        model = wait_ready(url, proc, a.ready_timeout, a.model)
        one_request(url, model, "Write the Go file for a stack.", 8)  # warm-up, not counted
        rounds = [run_round(url, model, c, a.requests, a.max_tokens) for c in counts]
    finally:
        stop_server(proc)
    report = {"server": a.url or a.server, "model": a.model, "max_tokens": a.max_tokens,
              "requests_per_client": a.requests, "rounds": rounds}
    if a.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{report['server']} on {a.model}: {a.requests} requests per client, {a.max_tokens} tokens, temperature 0")
    print(f"{'clients':>7} {'tok/s':>8} {'per request':>12} {'p50 s':>7} {'p90 s':>7} {'errors':>6}")
    for r in rounds:
        print(f"{r['clients']:>7} {r['aggregate_tok_s']:>8.1f} {r['per_request_tok_s']:>12.1f} "
              f"{r['latency_p50_s']:>7} {r['latency_p90_s']:>7} {len(r['errors']):>6}")


if __name__ == "__main__":
    main()

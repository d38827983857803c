#!/usr/bin/env python3
"""Load test for `cubellm serve` (or any OpenAI-compatible server): N concurrent streaming
clients for a fixed time at each concurrency level; prints a Markdown table and appends one JSON
line per level to --out.

    python3 scripts/load_test.py --url http://127.0.0.1:8080 --streams 1,4,16,64 --duration 60

Each client loops: POST /v1/completions with stream=true, ignore_eos=true and a fixed
max_tokens (every answer has the same length), reads the server-sent events, and records the
time to the first text chunk, the gaps between text chunks, and the completion tokens from the
usage chunk. Requests started before the level's time is up run to the end and count. Standard
library only (http.client), so it runs wherever python3 does.
"""
import argparse
import http.client
import json
import statistics
import sys
import threading
import time
import urllib.parse


def percentile(values, p):
    if not values:
        return float("nan")
    values = sorted(values)
    k = (len(values) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def one_request(host, port, body):
    """Returns (ok, ttft_s, gaps_s, tokens, seconds, error)."""
    start = time.perf_counter()
    conn = http.client.HTTPConnection(host, port, timeout=600)
    try:
        conn.request("POST", "/v1/completions", body=json.dumps(body),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            return False, None, [], 0, time.perf_counter() - start, f"HTTP {resp.status}: {resp.read()[:200]!r}"
        first = last = None
        gaps, tokens, done = [], 0, False
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if "error" in chunk:
                return False, None, gaps, tokens, time.perf_counter() - start, str(chunk["error"])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices", []):
                if choice.get("text"):
                    now = time.perf_counter()
                    if first is None:
                        first = now
                    else:
                        gaps.append(now - last)
                    last = now
        ok = done and first is not None
        return ok, (first - start) if first else None, gaps, tokens, time.perf_counter() - start, None if ok else "stream ended early"
    except Exception as e:  # a refused or reset connection counts as a failure, not a crash
        return False, None, [], 0, time.perf_counter() - start, repr(e)
    finally:
        conn.close()


def run_level(host, port, model, streams, duration, max_tokens, prompt):
    results, lock = [], threading.Lock()
    start = time.perf_counter()
    stop_at = start + duration
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}

    def client():
        while time.perf_counter() < stop_at:
            r = one_request(host, port, body)
            with lock:
                results.append(r)

    threads = [threading.Thread(target=client) for _ in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    ok = [r for r in results if r[0]]
    failed = [r for r in results if not r[0]]
    ttft = [r[1] for r in ok]
    gaps = [g for r in ok for g in r[2]]
    tokens = sum(r[3] for r in ok)
    return {
        "streams": streams,
        "seconds": round(elapsed, 2),
        "completed": len(ok),
        "failed": len(failed),
        "first_error": failed[0][5] if failed else None,
        "tokens": tokens,
        "aggregate_tok_s": round(tokens / elapsed, 1),
        "per_stream_tok_s": round(statistics.mean(
            (r[3] - 1) / (r[4] - r[1]) for r in ok if r[3] > 1 and r[4] > r[1]), 1) if ok else 0,
        "ttft_p50_ms": round(percentile(ttft, 50) * 1e3, 1),
        "ttft_p99_ms": round(percentile(ttft, 99) * 1e3, 1),
        "itl_p50_ms": round(percentile(gaps, 50) * 1e3, 2),
        "itl_p99_ms": round(percentile(gaps, 99) * 1e3, 2),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--streams", default="1,4,16,64", help="comma-separated concurrency levels")
    ap.add_argument("--duration", type=float, default=60, help="seconds per level")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompt", default="Write a short story about a lighthouse keeper who "
                    "finds a message in a bottle, and what she decides to do about it.")
    ap.add_argument("--out", help="append one JSON line per level here")
    ap.add_argument("--label", default="", help="stored with each JSON line (e.g. device, commit)")
    args = ap.parse_args()
    url = urllib.parse.urlparse(args.url)
    host, port = url.hostname, url.port or 80
    conn = http.client.HTTPConnection(host, port, timeout=30)
    conn.request("GET", "/v1/models")
    model = json.loads(conn.getresponse().read())["data"][0]["id"]
    conn.close()
    print(f"model {model}, {args.max_tokens} tokens per request, {args.duration:.0f} s per level",
          file=sys.stderr)
    rows = []
    for n in [int(s) for s in args.streams.split(",")]:
        row = run_level(host, port, model, n, args.duration, args.max_tokens, args.prompt)
        row.update({"model": model, "max_tokens": args.max_tokens, "label": args.label,
                    "date": time.strftime("%Y-%m-%d")})
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
    one = rows[0]["aggregate_tok_s"] if rows and rows[0]["streams"] == 1 else None
    print("| streams | aggregate tok/s | vs 1 stream | per-stream tok/s | TTFT p50 / p99 ms "
          "| ITL p50 / p99 ms | completed | failed |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        ratio = f"{r['aggregate_tok_s'] / one:.2f}x" if one else "-"
        print(f"| {r['streams']} | {r['aggregate_tok_s']} | {ratio} | {r['per_stream_tok_s']} "
              f"| {r['ttft_p50_ms']} / {r['ttft_p99_ms']} | {r['itl_p50_ms']} / {r['itl_p99_ms']} "
              f"| {r['completed']} | {r['failed']} |")
    sys.exit(1 if any(r["failed"] for r in rows) else 0)


if __name__ == "__main__":
    main()

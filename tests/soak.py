#!/usr/bin/env python3
"""tests/soak.py BIN MODEL SECONDS — a soak test of `pensieve serve`.

32 client threads hammer one server for SECONDS with a mix of requests: Anthropic and OpenAI,
streaming and not, clients that hang up mid-stream, and malformed or hostile requests. Checks:
the server never crashes; every valid request is answered correctly — a greedy (temperature 0)
answer is the same text every time its prompt is asked, whatever else is in the batch, and
every stream is complete and in order; every bad request gets its 4xx error envelope; and
nothing leaks: descriptors and threads return to their idle counts, and resident memory at the
end is within a small margin of what it was after warm-up. Prints what it measured (RSS at
start, after warm-up and at the end) and `N passed, N failed, N skipped`. Standard library only.
"""
import http.client
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from psvtest import Checks, free_port, stop  # noqa: E402

BIN, MODEL, SECONDS = sys.argv[1], sys.argv[2], float(sys.argv[3])
if not os.path.exists(MODEL):
    print("skipped: the soak test needs %s" % MODEL, file=sys.stderr)
    print("0 passed, 0 failed, 1 skipped")
    sys.exit(0)
CLIENTS = 32
CHECKS = Checks()
check = CHECKS.check
lock = threading.Lock()


def proc_stats(pid):
    """(fds, threads, RSS in KiB) from /proc."""
    fds = len(os.listdir("/proc/%d/fd" % pid))
    threads = len(os.listdir("/proc/%d/task" % pid))
    rss = 0
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    return fds, threads, rss


PROMPTS = ["Tell me about rivers.", "List three colours.", "Once upon a time", "Why is the sky blue?",
           "Count to five.", "Write a haiku about code.", "What is 2+2?", "Name a planet."]
BAD = [
    ("/v1/messages", b"{", 400),
    ("/v1/messages", b'{"max_tokens": -1, "messages": [{"role": "user", "content": "x"}]}', 400),
    ("/v1/messages", b'{"max_tokens": 1e309, "messages": [{"role": "user", "content": "x"}]}', 400),
    ("/v1/messages", b'{"max_tokens": 8, "messages": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400),
    ("/v1/chat/completions", b'{"messages": [], "max_tokens": 4}', 400),
    ("/v1/completions", b'{"prompt": [1, 99999999], "max_tokens": 2}', 400),
    ("/v1/nowhere", b"{}", 404),
]


class Soak:
    def __init__(self, port):
        self.port = port
        self.greedy = {}  # (api, prompt) -> text
        self.counts = {"anthropic": 0, "anthropic_stream": 0, "openai": 0, "openai_stream": 0, "dropped": 0,
                       "bad": 0, "raw_bad": 0}

    def conn(self):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)

    def same_text(self, key, text, what):
        with lock:
            want = self.greedy.setdefault(key, text)
        check(text == want, "%s: greedy answer for %r changed: %r vs %r" % (what, key, text, want))

    def anthropic(self, prompt, stream):
        body = {"model": "m", "max_tokens": 12, "temperature": 0, "stream": stream,
                "messages": [{"role": "user", "content": prompt}]}
        c = self.conn()
        c.request("POST", "/v1/messages", json.dumps(body), {"content-type": "application/json"})
        r = c.getresponse()
        data = r.read()
        c.close()
        if not check(r.status == 200, "anthropic %d %r" % (r.status, data[:200])):
            return
        if stream:
            evs = [l[7:] for l in data.decode().split("\n") if l.startswith("event: ")]
            ok = evs and evs[0] == "message_start" and evs[-1] == "message_stop" and "content_block_stop" in evs
            check(ok, "anthropic stream complete and in order: %r" % evs[-3:])
            text = "".join(json.loads(l[6:])["delta"]["text"] for l in data.decode().split("\n")
                           if l.startswith("data: ") and '"content_block_delta"' in l)
            self.same_text(("a", prompt), text, "anthropic stream")
            self.counts["anthropic_stream"] += 1
        else:
            m = json.loads(data)
            check(m["type"] == "message" and m["stop_reason"] in ("end_turn", "max_tokens"), "anthropic shape")
            self.same_text(("a", prompt), m["content"][0]["text"] if m["content"] else "", "anthropic")
            self.counts["anthropic"] += 1

    def openai(self, prompt, stream):
        body = {"model": "m", "max_tokens": 12, "temperature": 0, "stream": stream,
                "messages": [{"role": "user", "content": prompt}]}
        c = self.conn()
        c.request("POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"})
        r = c.getresponse()
        data = r.read()
        c.close()
        if not check(r.status == 200, "openai %d %r" % (r.status, data[:200])):
            return
        if stream:
            lines = [l[6:] for l in data.decode().split("\n") if l.startswith("data: ")]
            check(lines and lines[-1] == "[DONE]", "openai stream ends with [DONE]")
            chunks = [json.loads(l) for l in lines[:-1]]
            text = "".join(ch["choices"][0]["delta"].get("content", "") for ch in chunks if ch["choices"])
            self.same_text(("o", prompt), text, "openai stream")
            self.counts["openai_stream"] += 1
        else:
            m = json.loads(data)
            self.same_text(("o", prompt), m["choices"][0]["message"]["content"], "openai")
            self.counts["openai"] += 1

    def dropped(self, prompt):
        body = json.dumps({"model": "m", "max_tokens": 64, "temperature": 0.9, "stream": True,
                           "messages": [{"role": "user", "content": prompt}]}).encode()
        s = socket.create_connection(("127.0.0.1", self.port), timeout=300)
        s.sendall(b"POST /v1/messages HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        got = b""
        while got.count(b"content_block_delta") < 2:
            b = s.recv(4096)
            if not b:
                break
            got += b
        s.close()  # hang up mid-stream
        self.counts["dropped"] += 1

    def bad(self, rng):
        path, body, status = rng.choice(BAD)
        c = self.conn()
        c.request("POST", path, body, {"content-type": "application/json"})
        r = c.getresponse()
        data = r.read()
        c.close()
        try:
            e = json.loads(data)
        except ValueError:
            e = None
        check(r.status == status and e and "error" in e, "bad request %s: %d %r" % (path, r.status, data[:120]))
        self.counts["bad"] += 1

    def raw_bad(self, rng):
        reqs = [b"POST /v1/messages HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
                b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n", b"\x00\x01garbage\r\n\r\n",
                b"POST /v1/messages HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n"]
        s = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        s.sendall(rng.choice(reqs))
        got = b""
        try:
            while True:
                b = s.recv(4096)
                if not b:
                    break
                got += b
        except OSError:
            pass
        s.close()
        check(got.startswith(b"HTTP/1.1 4"), "malformed request answered 4xx: %r" % got[:40])
        self.counts["raw_bad"] += 1

    def client(self, i, until):
        rng = random.Random(i)
        while time.time() < until:
            k = rng.random()
            p = rng.choice(PROMPTS)
            try:
                if k < 0.25:
                    self.anthropic(p, stream=rng.random() < 0.5)
                elif k < 0.5:
                    self.openai(p, stream=rng.random() < 0.5)
                elif k < 0.65:
                    self.dropped(p)
                elif k < 0.85:
                    self.bad(rng)
                else:
                    self.raw_bad(rng)
            except (OSError, ValueError, KeyError, IndexError, http.client.HTTPException) as e:
                check(False, "client %d: %s: %s" % (i, type(e).__name__, e))


def main():
    port = free_port()
    proc = subprocess.Popen([BIN, "serve", "-m", MODEL, "--port", str(port), "--ctx", "512", "--parallel", "4",
                             "--max-queue", "256"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    ready = proc.stdout.readline()
    if not check(ready.startswith("pensieve: serving"), "server started: %r" % ready):
        proc.kill()
        return
    try:
        soak = Soak(port)
        idle = proc_stats(proc.pid)
        # warm-up: every prompt once through each API, so caches and arenas reach their size
        for p in PROMPTS:
            soak.anthropic(p, False)
            soak.openai(p, True)
        time.sleep(1)
        warm = proc_stats(proc.pid)
        until = time.time() + SECONDS
        th = [threading.Thread(target=soak.client, args=(i, until)) for i in range(CLIENTS)]
        for t in th:
            t.start()
        peak_rss = 0
        while any(t.is_alive() for t in th):
            time.sleep(1)
            if proc.poll() is not None:
                break
            peak_rss = max(peak_rss, proc_stats(proc.pid)[2])
        for t in th:
            t.join(600)
        if not check(proc.poll() is None, "server alive after the soak (exit %r)" % proc.returncode):
            return
        time.sleep(2)  # connections close and their threads end
        end = proc_stats(proc.pid)
        print("soak: %.0f s, %d clients: %s" % (SECONDS, CLIENTS, json.dumps(soak.counts)))
        print("soak: RSS %d KiB at start, %d after warm-up, %d peak, %d at the end; fds %d -> %d; threads %d -> %d"
              % (idle[2], warm[2], peak_rss, end[2], warm[0], end[0], warm[1], end[1]))
        check(end[0] <= warm[0], "no leaked descriptors (%d after warm-up, %d at the end)" % (warm[0], end[0]))
        check(end[1] <= warm[1], "no leaked threads (%d after warm-up, %d at the end)" % (warm[1], end[1]))
        # glibc keeps freed memory in per-thread arenas: allow that slack, not steady growth
        check(end[2] <= warm[2] + max(32768, warm[2] // 10), "no memory growth (%d KiB after warm-up, %d at the end)" % (warm[2], end[2]))
        check(sum(soak.counts.values()) > CLIENTS, "requests were made: %r" % soak.counts)
        r = soak.conn()
        r.request("GET", "/metrics")
        text = r.getresponse().read().decode()
        check("pensieve_slots_busy 0" in text and "pensieve_queue_depth 0" in text, "slots and queue empty at the end")
    finally:
        rc = stop(proc)
        check(rc == 0, "server exits 0 after the soak (rc %r)" % rc)


try:
    main()
finally:
    CHECKS.summary()
sys.exit(1 if CHECKS.failed else 0)

#!/usr/bin/env python3
"""tests/server_test.py BIN MODEL — drives a real `pensieve serve` over loopback.

Starts the server on an ephemeral port (127.0.0.1 only), then checks the Anthropic and OpenAI
APIs (shapes, streaming event order, stop sequences, prompt cache, errors), HTTP framing and
limits, API keys, concurrent streams with client disconnects, and shutdown on SIGTERM. Prints
`N passed, N failed, N skipped`. Standard library only.
"""
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from psvtest import Checks, free_port, stop  # noqa: E402

BIN, MODEL = sys.argv[1], sys.argv[2]
CHECKS = Checks()
check = CHECKS.check


class Server:
    def __init__(self, *extra):
        self.port = free_port()
        self.proc = subprocess.Popen([BIN, "serve", "-m", MODEL, "--port", str(self.port), "--host", "127.0.0.1",
                                      "--ctx", "512", "--parallel", "4"] + list(extra),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.ready = self.proc.stdout.readline()
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)

    def req(self, method, path, body=None, headers=None, timeout=120):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        h = {"content-type": "application/json"}
        h.update(headers or {})
        c.request(method, path, body=json.dumps(body) if isinstance(body, (dict, list)) else body, headers=h)
        r = c.getresponse()
        data = r.read()
        c.close()
        return r, data

    def json(self, method, path, body=None, headers=None):
        r, data = self.req(method, path, body, headers)
        try:
            return r, json.loads(data)
        except ValueError:
            return r, None

    def raw(self, data, read_timeout=10):
        s = socket.create_connection(("127.0.0.1", self.port), timeout=read_timeout)
        s.sendall(data)
        out = b""
        try:
            while True:
                b = s.recv(65536)
                if not b:
                    break
                out += b
        except socket.timeout:
            pass
        s.close()
        return out

    def stop(self):
        return stop(self.proc, 10)


def sse_events(data):
    """[(event, json)] from an SSE body (event: + data: lines; comments ignored)."""
    out, ev = [], None
    for line in data.decode("utf-8").split("\n"):
        if line.startswith("event: "):
            ev = line[7:]
        elif line.startswith("data: "):
            d = line[6:]
            out.append((ev, d if d == "[DONE]" else json.loads(d)))
            ev = None
    return out


def msg(text, **kw):
    b = {"model": "test", "max_tokens": 24, "messages": [{"role": "user", "content": text}], "temperature": 0}
    b.update(kw)
    return b


def test_anthropic(s):
    check("serving" in s.ready and str(s.port) in s.ready, "ready line: %r" % s.ready)
    r, h = s.json("GET", "/health")
    check(r.status == 200 and h == {"status": "ok"}, "health")
    r, a = s.json("POST", "/v1/messages", msg("Tell me about GGUF files."))
    check(r.status == 200 and r.getheader("request-id"), "messages status and request-id")
    check(a and a["type"] == "message" and a["role"] == "assistant" and a["id"].startswith("msg_"), "message shape")
    check(a and a["content"][0]["type"] == "text" and isinstance(a["content"][0]["text"], str), "content block")
    check(a and a["stop_reason"] in ("end_turn", "max_tokens") and a["stop_sequence"] is None, "stop_reason")
    u = a["usage"] if a else {}
    check(set(u) >= {"input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"}, "usage keys")
    check(u.get("output_tokens", 0) > 0 and u.get("input_tokens", 0) > 0, "usage counts")
    text = a["content"][0]["text"] if a else ""
    # the same request again: identical greedy text, and the prompt comes from the cache
    r, b = s.json("POST", "/v1/messages", msg("Tell me about GGUF files."))
    check(b and b["content"][0]["text"] == text, "deterministic at temperature 0")
    check(b and b["usage"]["cache_read_input_tokens"] > 0, "prompt cache reused: %r" % (b and b["usage"]))
    # count_tokens agrees with usage
    r, ct = s.json("POST", "/v1/messages/count_tokens", {"model": "t", "messages": [{"role": "user", "content": "Tell me about GGUF files."}]})
    check(r.status == 200 and ct == {"input_tokens": u.get("input_tokens")}, "count_tokens %r" % ct)
    # system as blocks; billing header dropped (same prompt as without it)
    r, c1 = s.json("POST", "/v1/messages/count_tokens", {"model": "t", "system": "Be brief.", "messages": [{"role": "user", "content": "Hi"}]})
    r, c2 = s.json("POST", "/v1/messages/count_tokens", {"model": "t", "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1; abc"}, {"type": "text", "text": "Be brief."}], "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]})
    check(c1 and c2 and c1["input_tokens"] == c2["input_tokens"], "system blocks and billing header: %r %r" % (c1, c2))

    # streaming: exact event order, deltas add up to the non-streaming text
    r, data = s.req("POST", "/v1/messages", msg("Tell me about GGUF files.", stream=True))
    check(r.status == 200 and r.getheader("content-type").startswith("text/event-stream"), "stream content-type")
    ev = sse_events(data)
    names = [e for e, _ in ev if e != "ping"]
    check(names[:2] == ["message_start", "content_block_start"] and names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
          and all(n == "content_block_delta" for n in names[2:-3]), "stream event order %r" % names[:4])
    check(all(d["type"] == e for e, d in ev), "event name equals data.type")
    deltas = "".join(d["delta"]["text"] for e, d in ev if e == "content_block_delta")
    check(deltas == text, "stream text equals non-stream text")
    md = [d for e, d in ev if e == "message_delta"]
    check(md and md[0]["usage"]["output_tokens"] == u.get("output_tokens") and md[0]["delta"]["stop_reason"] == a["stop_reason"], "message_delta usage")

    # stop sequences: cut exactly before the first occurrence, never leaking a part of it
    words = [w for w in text.split(" ") if len(w) >= 2]
    if len(text) > 8 and words:
        stop = words[min(2, len(words) - 1)]
        idx = text.find(stop)
        r, st = s.json("POST", "/v1/messages", msg("Tell me about GGUF files.", stop_sequences=["zz-never-zz", stop]))
        check(st and st.get("stop_reason") == "stop_sequence" and st.get("stop_sequence") == stop, "stop_sequence reason %r" % st)
        check(st and st["content"][0]["text"] == text[:idx], "text cut before the stop sequence")
        r, data = s.req("POST", "/v1/messages", msg("Tell me about GGUF files.", stop_sequences=[stop], stream=True))
        sev = sse_events(data)
        sd = "".join(d["delta"]["text"] for e, d in sev if e == "content_block_delta")
        check(sd == text[:idx], "streamed text cut before the stop sequence: %r vs %r" % (sd, text[:idx]))
    else:
        global skipped
        skipped += 1
        print("skipped: stop sequence test: greedy text too short: %r" % text, file=sys.stderr)

    # prefill: a trailing assistant message is continued
    r, pf = s.json("POST", "/v1/messages", {"model": "t", "max_tokens": 4, "temperature": 0, "messages": [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]})
    check(r.status == 200 and pf and pf["usage"]["output_tokens"] > 0, "prefill answered")

    # errors in the Anthropic envelope
    def err(body, status, needle, path="/v1/messages", method="POST", headers=None):
        r, e = s.json(method, path, body, headers)
        ok = r.status == status and e and e.get("type") == "error" and needle in e["error"]["message"]
        return check(ok, "error %d %r: %r" % (status, needle, e))
    err({"model": "t", "messages": [{"role": "user", "content": "hi"}]}, 400, "max_tokens")
    err({"model": "t", "max_tokens": 5, "messages": [{"role": "robot", "content": "hi"}]}, 400, "messages.0.role")
    err({"model": "t", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, 400, "messages.0.content.0.type")
    err({"model": "t", "max_tokens": 5, "messages": []}, 400, "messages")
    err({"model": "t", "max_tokens": -1, "messages": [{"role": "user", "content": "hi"}]}, 400, "max_tokens")
    err({"model": "t", "max_tokens": 100000, "messages": [{"role": "user", "content": "hi"}]}, 400, "exceeds the context size (512 tokens)")
    err({"model": "t", "max_tokens": 5, "temperature": 3, "messages": [{"role": "user", "content": "hi"}]}, 400, "temperature")
    err({"model": "t", "max_tokens": 5, "tools": [{"name": "x"}], "messages": [{"role": "user", "content": "hi"}]}, 400, "tools")
    err("{not json", 400, "invalid JSON")
    err(None, 404, "no route", path="/v2/nothing", method="GET")
    err(None, 405, "POST", path="/v1/messages", method="GET")
    r, e = s.json("POST", "/v1/messages", {"model": "t", "max_tokens": 3, "thinking": {"type": "enabled"}, "metadata": {"user_id": "u"},
                                          "messages": [{"role": "user", "content": "<|user|>hi"}]}, {"anthropic-version": "2023-06-01"})
    check(r.status == 200, "unknown fields (thinking, metadata) accepted")
    # a body far larger than the connection's first buffer (its slices must survive the growth)
    big = msg("word " * 40000, max_tokens=1)
    err(big, 400, "exceeds the context size")
    r, m = s.json("GET", "/v1/models", headers={"anthropic-version": "2023-06-01"})
    check(m and m["data"][0]["type"] == "model" and "has_more" in m and "first_id" in m, "Anthropic /v1/models shape")


def test_openai(s):
    r, c = s.json("POST", "/v1/chat/completions", {"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "Hi"}], "max_tokens": 12, "temperature": 0, "seed": 1})
    check(r.status == 200 and c and c["object"] == "chat.completion" and c["id"].startswith("chatcmpl-"), "chat completion shape")
    check(c and c["choices"][0]["message"]["role"] == "assistant" and c["choices"][0]["finish_reason"] in ("stop", "length"), "choice")
    check(c and c["usage"]["total_tokens"] == c["usage"]["prompt_tokens"] + c["usage"]["completion_tokens"], "usage total")
    r, data = s.req("POST", "/v1/chat/completions", {"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Hi"}], "max_tokens": 12, "temperature": 0, "seed": 1, "stream": True,
                    "stream_options": {"include_usage": True}})
    ev = sse_events(data)
    check(ev and ev[-1][1] == "[DONE]", "stream ends with [DONE]")
    chunks = [d for _, d in ev[:-1]]
    check(all(ch["object"] == "chat.completion.chunk" for ch in chunks), "chunk objects")
    text = "".join(ch["choices"][0]["delta"].get("content", "") for ch in chunks if ch["choices"])
    check(c and text == c["choices"][0]["message"]["content"], "streamed chat text equals non-stream text")
    check(chunks and chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == c["usage"]["completion_tokens"], "include_usage chunk")
    r, p = s.json("POST", "/v1/completions", {"model": "m", "prompt": "Once upon a time", "max_tokens": 5, "temperature": 0})
    check(r.status == 200 and p and p["object"] == "text_completion" and isinstance(p["choices"][0]["text"], str), "completions")
    r, m = s.json("GET", "/v1/models")
    check(m and m["object"] == "list" and m["data"][0]["object"] == "model", "OpenAI /v1/models shape")
    r, e = s.json("POST", "/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "n": 2})
    check(r.status == 400 and e and e["error"]["type"] == "invalid_request_error" and "n:" in e["error"]["message"], "OpenAI error envelope %r" % e)


def test_http(s):
    ok = lambda b: b.startswith(b"HTTP/1.1 ")
    st = lambda b: int(b.split(b" ")[1]) if ok(b) else 0
    check(st(s.raw(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")) == 200, "raw GET")
    check(st(s.raw(b"GET /health HTTP/1.1\nHost: localhost\n\n", 3)) in (400, 0), "bare LF rejected or timed out")
    check(st(s.raw(b"POST /v1/messages HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")) == 400, "CL + TE: 400")
    check(st(s.raw(b"POST /v1/messages HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello")) == 400, "conflicting CL: 400")
    check(st(s.raw(b"POST /v1/messages HTTP/1.1\r\nContent-Length: abc\r\n\r\n")) == 400, "malformed CL: 400")
    check(st(s.raw(b"POST /v1/messages HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n")) == 501, "unknown TE: 501")
    check(st(s.raw(b"POST /v1/messages HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")) == 400, "bad chunk size: 400")
    check(st(s.raw(b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n")) == 414, "long request line: 414")
    check(st(s.raw(b"GET / HTTP/1.1\r\n" + b"X-A: " + b"b" * 40000 + b"\r\n\r\n")) == 431, "long headers: 431")
    check(st(s.raw(b"POST /v1/messages HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n")) == 413, "huge body: 413")
    check(st(s.raw(b"GET /health HTTP/2.0\r\n\r\n")) == 505, "HTTP/2.0 on HTTP/1 port: 505")
    # DNS rebinding: bound to loopback, only loopback names are accepted in Host
    check(st(s.raw(b"GET /v1/models HTTP/1.1\r\nHost: evil.example:52849\r\n\r\n")) == 403, "foreign Host: 403")
    for host in (b"localhost:1", b"127.0.0.1", b"[::1]:80", b"LOCALHOST", b"app.localhost"):
        check(st(s.raw(b"GET /health HTTP/1.1\r\nHost: " + host + b"\r\nConnection: close\r\n\r\n")) == 200, "loopback Host %r" % host)
    body = json.dumps(msg("Hi", max_tokens=2)).encode()
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    check(st(s.raw(b"POST /v1/messages HTTP/1.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + chunked)) == 200, "chunked body")
    # pipelining: two requests in one write, answered in order
    two = s.raw(b"GET /health HTTP/1.1\r\n\r\nGET /v1/models HTTP/1.1\r\nConnection: close\r\n\r\n")
    check(two.count(b"HTTP/1.1 200") == 2 and two.index(b"status") < two.index(b"object"), "pipelined requests in order")


def proc_counts(pid):
    """(open file descriptors, threads) of a process, from /proc (Linux)."""
    try:
        return len(os.listdir("/proc/%d/fd" % pid)), len(os.listdir("/proc/%d/task" % pid))
    except OSError:
        return None


def test_concurrency(s):
    """16 concurrent streams, 4 of which hang up mid-stream: the other 12 complete, the slots are
    freed, /metrics agrees, and no descriptors or threads are left behind."""
    before = proc_counts(s.proc.pid)
    results = {}

    def stream(i, drop):
        try:
            c = socket.create_connection(("127.0.0.1", s.port), timeout=180)
            body = json.dumps(msg("Story number %d:" % i, max_tokens=24, temperature=0.8, stream=True)).encode()
            c.sendall(b"POST /v1/messages HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            got = b""
            while True:
                b = c.recv(4096)
                if not b:
                    break
                got += b
                if drop and got.count(b"content_block_delta") >= 1:
                    break
            c.close()
            results[i] = got
        except OSError as e:
            results[i] = str(e).encode()

    th = [threading.Thread(target=stream, args=(i, i % 4 == 3)) for i in range(16)]
    for t in th:
        t.start()
    for t in th:
        t.join(240)
    kept = [i for i in range(16) if i % 4 != 3]
    done = [i for i in kept if b"event: message_stop" in results.get(i, b"")]
    check(len(done) == len(kept), "every kept stream completed (%d of %d)" % (len(done), len(kept)))
    ok_order = all(results[i].index(b"message_start") < results[i].index(b"content_block_stop") < results[i].index(b"message_stop") for i in done)
    check(ok_order, "each completed stream in order")
    time.sleep(1.5)
    r, data = s.req("GET", "/metrics")
    text = data.decode()
    check("pensieve_slots_busy 0" in text and "pensieve_queue_depth 0" in text, "slots freed after disconnects")
    m = {l.split()[0]: float(l.split()[1]) for l in text.splitlines() if l and not l.startswith("#")}
    check(m.get("pensieve_tokens_out_total", 0) >= 12 * 1, "metrics count generated tokens")
    check(m.get("pensieve_connections", 99) <= 1, "connections closed: %r" % m.get("pensieve_connections"))
    # connection threads end on their own once their clients are gone; a slow machine (or a
    # sanitizer build) may take a while, a leak never ends: wait up to 30 s for the counts
    after = proc_counts(s.proc.pid)
    deadline = time.time() + 30
    while before and after and (after[0] > before[0] or after[1] > before[1]) and time.time() < deadline:
        time.sleep(0.25)
        after = proc_counts(s.proc.pid)
    if before and after:
        check(after[0] <= before[0] and after[1] <= before[1], "no leaked fds/threads: before %r after %r" % (before, after))


def envelope(api, status, r, e, what):
    """The API's own error envelope with the expected status."""
    if api == "anthropic":
        good = e is not None and e.get("type") == "error" and isinstance(e.get("error"), dict) and \
            isinstance(e["error"].get("type"), str) and isinstance(e["error"].get("message"), str)
    else:
        good = e is not None and isinstance(e.get("error"), dict) and isinstance(e["error"].get("message"), str) and \
            isinstance(e["error"].get("type"), str) and "param" in e["error"] and "code" in e["error"]
    return check(r.status == status and good, "%s: %s envelope with %d (got %d: %r)" % (what, api, status, r.status, e))


def test_api_hostile(s):
    """Hostile and malformed API input: each answer is the API's error envelope and status."""
    A, O = "/v1/messages", "/v1/chat/completions"
    user = [{"role": "user", "content": "Hi"}]
    deep = "[" * 100000 + "]" * 100000
    cases = [
        # (path, raw body, status, what)
        (A, "{", 400, "invalid JSON"),
        (A, "[]", 400, "body not an object"),
        (A, '{"max_tokens": 8, "messages": "hi"}', 400, "messages of the wrong type"),
        (A, '{"max_tokens": 8, "messages": []}', 400, "empty messages"),
        (A, '{"max_tokens": 8, "messages": [{"role": "user", "content": null}]}', 400, "null content"),
        (A, '{"max_tokens": 8, "messages": [{"role": "system", "content": "x"}]}', 400, "system role in messages"),
        (A, '{"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image"}]}]}', 400, "image block"),
        (A, '{"max_tokens": -1, "messages": %s}' % json.dumps(user), 400, "max_tokens -1"),
        (A, '{"max_tokens": 1e309, "messages": %s}' % json.dumps(user), 400, "max_tokens 1e309"),
        (A, '{"max_tokens": 9223372036854775808, "messages": %s}' % json.dumps(user), 400, "max_tokens 2^63"),
        (A, '{"max_tokens": 9223372036854775807, "messages": %s}' % json.dumps(user), 400, "max_tokens 2^63-1"),
        (A, '{"max_tokens": "16", "messages": %s}' % json.dumps(user), 400, "max_tokens as a string"),
        (A, '{"max_tokens": 16777216, "messages": %s}' % json.dumps(user), 400, "max_tokens beyond the context"),
        (A, '{"max_tokens": 8, "temperature": 5, "messages": %s}' % json.dumps(user), 400, "temperature 5"),
        (A, '{"max_tokens": 8, "temperature": "hot", "messages": %s}' % json.dumps(user), 400, "temperature a string"),
        (A, '{"max_tokens": 8, "top_k": -3, "messages": %s}' % json.dumps(user), 400, "negative top_k"),
        (A, '{"max_tokens": 8, "stop_sequences": [""], "messages": %s}' % json.dumps(user), 400, "empty stop sequence"),
        (A, '{"max_tokens": 8, "messages": %s}' % deep, 400, "deeply nested JSON"),
        (A, '{"max_tokens": 8, "messages": [{"role": "user", "content": "\\ud800"}]}', 400, "lone surrogate"),
        (O, "{", 400, "invalid JSON"),
        (O, '{"messages": %s, "max_tokens": -1}' % json.dumps(user), 400, "max_tokens -1"),
        (O, '{"messages": %s, "max_tokens": 1e309}' % json.dumps(user), 400, "max_tokens 1e309"),
        (O, '{"messages": %s, "max_tokens": 9223372036854775808}' % json.dumps(user), 400, "max_tokens 2^63"),
        (O, '{"messages": %s, "n": 3}' % json.dumps(user), 400, "n 3"),
        (O, '{"messages": %s, "seed": 1e400}' % json.dumps(user), 400, "seed 1e400"),
        (O, '{"messages": []}', 400, "empty messages"),
        (O, '{"messages": %s}' % deep, 400, "deeply nested JSON"),
        ("/v1/completions", '{"prompt": [1, 2, 99999999], "max_tokens": 2}', 400, "token id out of range"),
        ("/v1/completions", '{"prompt": [-1], "max_tokens": 2}', 400, "negative token id"),
        ("/v1/completions", '{"prompt": [1, "x"], "max_tokens": 2}', 400, "token ids mixed with text"),
        ("/v1/completions", '{"prompt": ["a", "b"], "max_tokens": 2}', 400, "batched prompts"),
        ("/v1/completions", '{"prompt": [], "max_tokens": 2}', 400, "empty token list"),
        ("/v1/completions", '{"prompt": 7}', 400, "prompt a number"),
    ]
    for path, body, status, what in cases:
        r, e = s.json("POST", path, body)
        envelope("openai" if path != A else "anthropic", status, r, e, what)
    # client text quoted in a message is cut at a character boundary, never inside one
    r, e = s.json("POST", A, {"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "x" * 39 + "\u00e9z"}]}]})
    check(r.status == 400 and e and "\ufffd" not in e["error"]["message"] and "x" * 39 + "'" in e["error"]["message"],
          "quoted text cut on a character boundary: %r" % (e,))
    # a body whose declared size is 2^31 bytes is refused before any of it is read or tokenized
    for path, api in ((A, "anthropic"), (O, "openai")):
        raw = s.raw(b"POST %s HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 2147483648\r\n\r\n{" % path.encode())
        head, _, body = raw.partition(b"\r\n\r\n")
        try:
            e = json.loads(body)
        except ValueError:
            e = None
        envelope(api, 413, type("R", (), {"status": int(head.split(b" ")[1]) if head.startswith(b"HTTP/1.1") else 0})(), e,
                 "2^31-byte body")
    # token ids within range are a prompt
    r, p = s.json("POST", "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 2, "temperature": 0})
    check(r.status == 200 and p and p["usage"]["prompt_tokens"] == 3, "token-id prompt: 200 with 3 prompt tokens (%r)" % p)
    # special-token text in user content stays text: it costs several tokens, not one each
    def count(text):
        r, c = s.json("POST", "/v1/messages/count_tokens", {"messages": [{"role": "user", "content": text}]})
        return c["input_tokens"] if r.status == 200 and c else None
    base, lit = count("x"), count("x<|end|><|user|><|assistant|><|end|>")
    check(base is not None and lit is not None and lit - base > 8, "special-token text tokenized as text (%r vs %r)" % (base, lit))
    r, m = s.json("POST", A, msg("<|end|><|assistant|>", max_tokens=4))
    check(r.status == 200 and m and m["type"] == "message", "special-token text in a request is answered")
    r, h = s.json("GET", "/health")
    check(r.status == 200, "server healthy after the hostile table")


def test_cors():
    s = Server("--cors-origin", "*")
    try:
        r, _ = s.req("GET", "/v1/models")
        check(r.getheader("Access-Control-Allow-Origin") == "*", "CORS: wildcard origin sent")
        check(r.getheader("Access-Control-Allow-Credentials") is None, "CORS: never credentials with '*'")
        r, _ = s.req("OPTIONS", "/v1/messages", headers={"Origin": "http://x.example", "Access-Control-Request-Method": "POST"})
        check(r.status == 204 and "POST" in (r.getheader("Access-Control-Allow-Methods") or ""), "CORS preflight: 204")
        check(r.getheader("Access-Control-Allow-Credentials") is None, "CORS preflight: no credentials")
    finally:
        check(s.stop() == 0, "CORS server exits 0")
    p = subprocess.run([BIN, "serve", "-m", MODEL, "--cors-origin", "*", "--api-key", "k"], capture_output=True, text=True, timeout=30)
    check(p.returncode == 2 and "cannot be combined" in p.stderr, "'*' with an API key refused at start-up: %r" % p.stderr)


def test_slow_clients():
    """Slowloris and idle keep-alive: closed at their timeouts, without starving other clients."""
    s = Server("--header-timeout", "4", "--idle-timeout", "2")
    try:
        closed = {}

        def loris(i):
            c = socket.create_connection(("127.0.0.1", s.port), timeout=30)
            t0 = time.time()
            got = b""
            try:
                c.sendall(b"GET /health HTTP/1.1\r\n")
                for k in range(80):  # a header byte every half second: never finishes in time
                    c.sendall(b"X")
                    time.sleep(0.5)
                    c.setblocking(False)
                    try:
                        b = c.recv(4096)
                        got += b
                        if not b:
                            break
                    except BlockingIOError:
                        pass
                    finally:
                        c.setblocking(True)
            except OSError:
                pass
            closed[i] = (time.time() - t0, got)
            c.close()

        th = [threading.Thread(target=loris, args=(i,)) for i in range(20)]
        for t in th:
            t.start()
        time.sleep(0.5)
        served = 0
        for _ in range(5):  # meanwhile, ordinary clients are answered
            r, h = s.json("GET", "/health")
            served += r.status == 200
        still_open = len(closed) == 0
        check(served == 5 and still_open, "served 5 requests while 20 slowloris clients were connected (%d)" % served)
        for t in th:
            t.join(60)
        times = sorted(v[0] for v in closed.values())
        check(len(times) == 20 and times[-1] < 20, "slowloris clients closed at the header timeout (%r)" % times[-1:])
        check(all(v[1].startswith(b"HTTP/1.1 408") or v[1] == b"" for v in closed.values()), "slowloris answered 408 or closed")
        # idle keep-alive: one request, then silence: the server closes the connection
        c = socket.create_connection(("127.0.0.1", s.port), timeout=20)
        c.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        first = b""
        while b'{"status":"ok"}' not in first:
            b = c.recv(4096)
            if not b:
                break
            first += b
        t0 = time.time()
        rest = b"x"
        try:
            rest = c.recv(4096)
        except OSError:
            pass
        check(first.startswith(b"HTTP/1.1 200") and rest == b"" and time.time() - t0 < 15,
              "idle keep-alive connection closed (%r, then %r after %.1f s)" % (first[:40], rest[:40], time.time() - t0))
        c.close()
    finally:
        check(s.stop() == 0, "slow-client server exits 0")


def test_emfile():
    """Out of file descriptors on accept: the server backs off, keeps serving what it has and
    recovers when descriptors are free again."""
    import resource
    lim = 48

    def low():
        resource.setrlimit(resource.RLIMIT_NOFILE, (lim, lim))
    port = free_port()
    proc = subprocess.Popen([BIN, "serve", "-m", MODEL, "--port", str(port), "--ctx", "256", "--parallel", "1",
                             "--header-timeout", "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=low)
    ready = proc.stdout.readline()
    if not check(ready.startswith("pensieve: serving"), "EMFILE server started: %r" % ready):
        proc.kill()
        return
    held = []
    try:
        for i in range(lim + 16):  # more than the server has descriptors for
            held.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        time.sleep(1.5)
        n_fd = proc_counts(proc.pid)
        check(proc.poll() is None and n_fd and n_fd[0] >= lim - 2, "server alive with its descriptors exhausted (%r)" % (n_fd,))
    except OSError as e:
        check(False, "EMFILE setup: %s" % e)
    for c in held:
        c.close()
    ok = False
    deadline = time.time() + 30
    while time.time() < deadline and not ok:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            c.request("GET", "/health")
            ok = c.getresponse().status == 200
            c.close()
        except OSError:
            time.sleep(0.2)
    check(ok, "serves again once descriptors are free")
    rc = stop(proc)
    check(rc == 0, "EMFILE server exits 0 (rc %r)" % rc)


def test_keys():
    s = Server("--api-key", "sekrit-key-123")
    try:
        body = msg("Hi", max_tokens=2)
        r, e = s.json("POST", "/v1/messages", body)
        check(r.status == 401 and e["error"]["type"] == "authentication_error", "no key: 401")
        r, e = s.json("POST", "/v1/messages", body, {"x-api-key": "sekrit-key-124"})
        check(r.status == 401, "wrong key, same length: 401")
        r, e = s.json("POST", "/v1/messages", body, {"x-api-key": "short"})
        check(r.status == 401, "wrong key, other length: 401")
        r, e = s.json("POST", "/v1/messages", body, {"x-api-key": "sekrit-key-123"})
        check(r.status == 200, "x-api-key: 200")
        r, e = s.json("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
                      {"authorization": "Bearer sekrit-key-123"})
        check(r.status == 200, "Bearer key: 200")
        r, e = s.json("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
        check(r.status == 401 and "error" in e and e["error"]["type"] == "authentication_error", "OpenAI 401 envelope")
        r, h = s.json("GET", "/health")
        check(r.status == 200, "health needs no key")
    finally:
        check(s.stop() == 0, "key server exits 0 on SIGTERM")


def test_kv_type(default_ready):
    """--kv-type f16: the slots keep F16 KV caches (the ready line says so) and answer; a bad value
    exits 2 before the model loads. default_ready: the ready line of a server without the flag."""
    s = Server("--kv-type", "f16")
    try:
        check("ctx 512 (f16 KV cache)" in s.ready, "--kv-type f16 in the ready line: %r" % s.ready)
        r, e = s.json("POST", "/v1/messages", msg("Count: one, two,", max_tokens=12))
        check(r.status == 200 and e["content"][0]["type"] == "text" and e["usage"]["output_tokens"] > 0,
              "f16 KV cache: an answer (%s %s)" % (r.status, e))
    finally:
        check(s.stop() == 0, "f16 server exits 0 on SIGTERM")
    check("(f32 KV cache)" in default_ready, "f32 KV cache by default: %r" % default_ready)
    p = subprocess.run([BIN, "serve", "-m", MODEL, "--kv-type", "q8"], capture_output=True, text=True, timeout=30)
    check(p.returncode == 2 and "--kv-type must be f32 or f16" in p.stderr, "--kv-type q8: exit 2 (%d %r)" % (p.returncode, p.stderr))
    env = dict(os.environ, PENSIEVE_KV_TYPE="f17")
    p = subprocess.run([BIN, "serve", "-m", MODEL], capture_output=True, text=True, timeout=30, env=env)
    check(p.returncode == 2 and "--kv-type must be f32 or f16" in p.stderr, "PENSIEVE_KV_TYPE=f17: exit 2 (%d)" % p.returncode)


def test_shutdown():
    s = Server()
    r, data = s.req("GET", "/health")
    # a stream in flight when SIGTERM arrives ends, and the server exits 0 within a few seconds
    c = socket.create_connection(("127.0.0.1", s.port), timeout=30)
    body = json.dumps(msg("Long story:", max_tokens=400, stream=True, temperature=1)).encode()
    c.sendall(b"POST /v1/messages HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    c.recv(100)
    t0 = time.time()
    s.proc.send_signal(signal.SIGTERM)
    try:
        rc = s.proc.wait(timeout=8)
    except subprocess.TimeoutExpired:
        s.proc.kill()
        rc = None
    check(rc == 0 and time.time() - t0 < 8, "SIGTERM: exit 0 within a few seconds (rc %r)" % rc)
    c.close()


def main():
    s = Server()
    try:
        if not check(s.ready.startswith("pensieve: serving"), "server started: %r %s" % (s.ready, s.proc.stderr.read() if s.proc.poll() is not None else "")):
            return
        test_anthropic(s)
        test_openai(s)
        test_http(s)
        test_api_hostile(s)
        test_concurrency(s)
    finally:
        check(s.stop() == 0, "server exits 0 on SIGTERM")
    test_keys()
    test_cors()
    test_slow_clients()
    test_emfile()
    test_kv_type(s.ready)
    test_shutdown()


try:
    main()
finally:
    CHECKS.summary()
sys.exit(1 if CHECKS.failed else 0)

#!/usr/bin/env python3
"""tools/bench_server.py -m MODEL [--bin ./pensieve] [-n 96] [-c 1,4] [-t THREADS] [-r 3]

Measures the server's total generation throughput with 1 and with N concurrent streaming
clients (continuous batching): each client asks for exactly -n tokens (temperature 1, no stop
sequence, ignoring end of turn is not possible, so prompts are chosen to run long and the
tokens actually generated are counted from usage). Prints tokens/s in total for each level,
mean over -r repetitions, and the ratio to one stream. A benchmark: it asserts nothing.
"""
import argparse
import http.client
import json
import signal
import socket
import subprocess
import threading
import time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def one(port, i, n, out):
    body = {"model": "m", "max_tokens": n, "temperature": 1, "stream": True,
            "messages": [{"role": "user", "content": "Tell me a very long story, number %d." % i}]}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/messages", json.dumps(body), {"content-type": "application/json"})
    data = c.getresponse().read().decode()
    c.close()
    toks = 0
    for line in data.split("\n"):
        if line.startswith("data: ") and '"message_delta"' in line:
            toks = json.loads(line[6:])["usage"]["output_tokens"]
    out[i] = toks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--bin", default="./pensieve")
    ap.add_argument("-n", type=int, default=96)
    ap.add_argument("-c", default="1,4")
    ap.add_argument("-t", "--threads", type=int, default=0)
    ap.add_argument("-r", type=int, default=3)
    a = ap.parse_args()
    levels = [int(x) for x in a.c.split(",")]
    port = free_port()
    cmd = [a.bin, "serve", "-m", a.model, "--port", str(port), "--parallel", str(max(levels)), "--ctx", "1024"]
    if a.threads:
        cmd += ["--threads", str(a.threads)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    print(proc.stdout.readline().strip())
    try:
        one(port, 0, 8, {})  # warm-up
        base = None
        for c in levels:
            rates = []
            for _ in range(a.r):
                out = {}
                th = [threading.Thread(target=one, args=(port, i, a.n, out)) for i in range(c)]
                t0 = time.time()
                for t in th:
                    t.start()
                for t in th:
                    t.join()
                dt = time.time() - t0
                rates.append(sum(out.values()) / dt)
            mean = sum(rates) / len(rates)
            base = base or mean
            print("%d stream%s: %.1f tokens/s in total (%s), %.2fx one stream" %
                  (c, "" if c == 1 else "s", mean, ", ".join("%.1f" % r for r in rates), mean / base))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)


main()

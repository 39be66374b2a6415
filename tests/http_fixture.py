#!/usr/bin/env python3
"""tests/http_fixture.py -- a loopback HTTP/1.1 file server that misbehaves on request.

Used by tests/cli_pull.sh to exercise tools/pensieve-pull without any network. Standard library
only. It binds 127.0.0.1 on an ephemeral port, writes the port to --port-file, and serves until
killed.

    python3 tests/http_fixture.py --root DIR --port-file FILE --log FILE

GET (or HEAD) of any path serves DIR/NAME, NAME being the path's last segment. The segments
before it choose the behaviour; segments it does not know are ignored, so hub-style paths such as
/OWNER/REPO/resolve/REVISION/NAME work as they are.

By default it behaves: a strong ETag "<sha256 of the file>" (how the Hugging Face hub exposes a
Git LFS file's digest), Last-Modified, Range and If-Range per RFC 9110 (one byte range,
"bytes=A-" or "bytes=A-B"), 206 with Content-Range, 416 with "bytes */SIZE" when the range starts
at or past the end. The modes:

  norange        ignore Range: always 200 with the whole file
  noifrange      honour Range even when If-Range does not match the current validator
  badrange       a 206 whose Content-Range starts one byte after the requested offset
  ver=TAG        serve NAME.TAG instead, with ETag "TAG-<16 hex of its sha256>" (content versions)
  xlinked        ETag not a digest; the digest in X-Linked-Etag instead
  plainetag      ETag not a digest and no X-Linked-Etag: no digest at all
  baddigest      ETag and X-Linked-Etag carry the SHA-256 of other bytes
  corrupt=OFF    flip the byte at offset OFF (the headers still describe the good file)
  redirect=N     302 to the same path with redirect=N-1; redirect=0 serves
  xhost=HOST     302 to http://HOST:PORT/<the path without this segment>, with X-Linked-Etag
  drip=BPS       send the body at about BPS bytes per second
  cut=N          close the connection after N body bytes (Content-Length still announces all)
  stall=N        stop sending after N body bytes and hold the connection until the client leaves
  status=CODE    answer CODE with a short text body

Each request appends two JSON lines to --log, sharing an "id": {"event": "start", method, path,
host, range, if_range, auth (whether an Authorization header came)} before the response, and
{"event": "done", status, sent (body bytes written)} when the handler ends.
"""

import argparse
import hashlib
import json
import os
import select
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LAST_MODIFIED = "Mon, 01 Jan 2024 00:00:00 GMT"


class Fixture(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, root, log_path):
        super().__init__(("127.0.0.1", 0), Handler)
        self.root = root
        self.log_path = log_path
        self.log_lock = threading.Lock()
        self.digests = {}
        self.ids = 0

    def next_id(self):
        with self.log_lock:
            self.ids += 1
            return self.ids

    def digest(self, path, data):
        st = os.stat(path)
        key = (path, st.st_mtime_ns, st.st_size)
        if key not in self.digests:
            self.digests[key] = hashlib.sha256(data).hexdigest()
        return self.digests[key]

    def log(self, entry):
        with self.log_lock:
            with open(self.log_path, "a") as f:
                f.write(json.dumps(entry) + "\n")


def parse_range(value, size):
    """(start, end) inclusive for one 'bytes=A-' or 'bytes=A-B' range, or None when absent or
    not understood (then the whole file is sent, as RFC 9110 allows)."""
    if not value or not value.startswith("bytes="):
        return None
    spec = value[6:].strip()
    if "," in spec or "-" not in spec:
        return None
    a, b = spec.split("-", 1)
    if not a.isdigit() or (b and not b.isdigit()):
        return None
    start = int(a)
    end = int(b) if b else size - 1
    return start, min(end, size - 1)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "pensieve-fixture/1"

    def log_message(self, fmt, *args):  # quiet: the JSON log is the record
        pass

    def do_HEAD(self):
        self.handle_request(head=True)

    def do_GET(self):
        self.handle_request(head=False)

    def handle_request(self, head):
        self.sent = 0
        self.status = 0
        rid = self.server.next_id()
        # The start line is written before any response byte, so it is in the log before the
        # client can have finished; the done line follows when the handler ends.
        self.server.log({
            "id": rid,
            "event": "start",
            "method": self.command,
            "path": self.path,
            "host": self.headers.get("Host", ""),
            "range": self.headers.get("Range"),
            "if_range": self.headers.get("If-Range"),
            "auth": "Authorization" in self.headers,
        })
        try:
            self.serve(head)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            self.server.log({"id": rid, "event": "done", "status": self.status, "sent": self.sent})

    def reply(self, status, headers, body=b"", head=False):
        self.status = status
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head and body:
            self.wfile.write(body)
            self.sent += len(body)

    def serve(self, head):
        path = self.path.split("?", 1)[0]
        segs = [s for s in path.split("/") if s]
        if not segs:
            return self.reply(404, [], b"no file\n", head)
        name, modes = segs[-1], {}
        for s in segs[:-1]:
            k, _, v = s.partition("=")
            modes[k] = v
        port = self.server.server_address[1]

        if "status" in modes:
            return self.reply(int(modes["status"]), [("Content-Type", "text/plain")],
                              ("status %s\n" % modes["status"]).encode(), head)
        if "redirect" in modes and int(modes["redirect"]) > 0:
            n = int(modes["redirect"])
            loc = path.replace("redirect=%d" % n, "redirect=%d" % (n - 1), 1)
            host = self.headers.get("Host", "127.0.0.1:%d" % port)
            return self.reply(302, [("Location", "http://%s%s" % (host, loc))], b"", head)

        fname = name + ("." + modes["ver"] if "ver" in modes else "")
        fpath = os.path.join(self.server.root, fname)
        if "/" in fname or not os.path.isfile(fpath):
            return self.reply(404, [("Content-Type", "text/plain")], b"not found\n", head)
        with open(fpath, "rb") as f:
            data = f.read()
        sha = self.server.digest(fpath, data)

        if "xhost" in modes:
            rest = "/".join(s for s in segs if not s.startswith("xhost="))
            loc = "http://%s:%d/%s" % (modes["xhost"], port, rest)
            return self.reply(302, [("Location", loc), ("X-Linked-Etag", '"%s"' % sha),
                                    ("X-Linked-Size", str(len(data)))], b"", head)

        headers = [("Last-Modified", LAST_MODIFIED), ("Accept-Ranges", "bytes"),
                   ("Content-Type", "application/octet-stream")]
        if "ver" in modes:
            etag = '"%s-%s"' % (modes["ver"], sha[:16])
        elif "xlinked" in modes or "plainetag" in modes:
            etag = '"plain-etag-1"'
        elif "baddigest" in modes:
            etag = '"%s"' % hashlib.sha256(data + b"x").hexdigest()
        else:
            etag = '"%s"' % sha
        headers.append(("ETag", etag))
        if "xlinked" in modes:
            headers.append(("X-Linked-Etag", '"%s"' % sha))
        if "baddigest" in modes:
            headers.append(("X-Linked-Etag", etag))
        if "corrupt" in modes:
            off = int(modes["corrupt"])
            data = bytearray(data)
            data[off] ^= 0xFF
            data = bytes(data)

        size = len(data)
        rng = parse_range(self.headers.get("Range"), size)
        if_range = self.headers.get("If-Range")
        if rng and if_range and "noifrange" not in modes and if_range not in (etag, LAST_MODIFIED):
            rng = None  # RFC 9110 §13.1.5: the validator does not match: send the whole file
        if "norange" in modes:
            rng = None
        if rng and rng[0] >= size:
            return self.reply(416, headers + [("Content-Range", "bytes */%d" % size)], b"", head)
        if rng:
            start, end = rng
            shown = start + 1 if "badrange" in modes else start
            status = 206
            headers.append(("Content-Range", "bytes %d-%d/%d" % (shown, end, size)))
        else:
            start, end, status = 0, size - 1, 200
        body = data[start:end + 1]

        self.status = status
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if head:
            return
        limit = len(body)
        if "cut" in modes:
            limit = min(limit, int(modes["cut"]))
        if "stall" in modes:
            limit = min(limit, int(modes["stall"]))
        bps = int(modes["drip"]) if "drip" in modes else 0
        chunk = max(1, bps // 20) if bps else 65536
        pos = 0
        while pos < limit:
            n = min(chunk, limit - pos)
            self.wfile.write(body[pos:pos + n])
            self.wfile.flush()
            pos += n
            self.sent += n
            if bps:
                time.sleep(n / bps)
        if limit < len(body):
            if "stall" in modes:
                self.hold_until_client_leaves()
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def hold_until_client_leaves(self, most=60.0):
        deadline = time.time() + most
        while time.time() < deadline:
            r, _, _ = select.select([self.connection], [], [], 0.2)
            if r:
                try:
                    if not self.connection.recv(1, socket.MSG_PEEK):
                        return
                except OSError:
                    return


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", required=True)
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--log", required=True)
    a = ap.parse_args()
    srv = Fixture(a.root, a.log)
    tmp = a.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d\n" % srv.server_address[1])
    os.rename(tmp, a.port_file)  # appears whole: the test polls for it
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())

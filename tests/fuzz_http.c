// tests/fuzz_http.c — libFuzzer harness for section 19's HTTP/1.1 request reader.
//
// The input is what a client sends on one connection: it is written into one end of a
// socketpair, that end is shut for writing, and http_read_request reads requests from the other
// end until it answers with an error or the bytes run out — so request lines, header fields,
// Content-Length and chunked bodies, trailers and pipelined requests are all reached through
// the same code the server runs. Invariants: no crash or sanitizer report; no wait (the peer
// has closed, so a 408 would mean the reader waited for bytes that cannot come); every parsed
// request's slices lie inside the bytes it consumed, its method is a short token, its body is
// within the limit, and a Content-Length body is exactly those bytes; the Host check of every
// parsed request runs.
#define PSV_TESTING
#define PSV_NO_MAIN
#define PSV_SERVER
#include "pensieve.c"

#include <sys/socket.h>

static void fuzz_check(bool ok) {
    if (!ok) __builtin_trap();
}

static bool fuzz_inside(str_t s, const char *lo, size_t n) {
    return s.n == 0 || (s.p >= lo && s.p + s.n <= lo + n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 65536) return 0; // stays within the socket buffer, so the write cannot block
    static server_t srv;
    srv.conf.host = "127.0.0.1";
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return 0;
    size_t off = 0;
    while (off < size) {
        ssize_t k = write(sv[1], data + off, size - off);
        if (k <= 0) break;
        off += (size_t)k;
    }
    shutdown(sv[1], SHUT_WR);
    http_conn c;
    memset(&c, 0, sizeof c);
    c.fd = sv[0];
    c.srv = &srv;
    http_req *r = calloc(1, sizeof *r);
    fuzz_check(r != NULL);
    for (int i = 0; i < 1000; i++) {
        int st = http_read_request(&c, r, i == 0);
        fuzz_check(st == -1 || st == 0 || st == 400 || st == 413 || st == 414 || st == 431 || st == 501 || st == 505);
        if (st != 0) break;
        fuzz_check(r->consumed > 0 && r->consumed <= c.len);
        size_t ml = strlen(r->method);
        fuzz_check(ml > 0 && ml < sizeof r->method && !strchr(r->method, ' '));
        fuzz_check(fuzz_inside(r->target, c.buf, r->consumed) && r->target.n > 0);
        fuzz_check(r->path.p == r->target.p && r->path.n <= r->target.n);
        fuzz_check(r->minor == 0 || r->minor == 1);
        fuzz_check(r->n_headers >= 0 && r->n_headers <= PSV_HTTP_MAX_HEADERS);
        for (int h = 0; h < r->n_headers; h++) {
            fuzz_check(r->headers[h].name.n > 0 && fuzz_inside(r->headers[h].name, c.buf, r->consumed));
            fuzz_check(fuzz_inside(r->headers[h].value, c.buf, r->consumed));
            fuzz_check(!memchr(r->headers[h].name.p, ':', r->headers[h].name.n));
        }
        fuzz_check(r->body.len <= PSV_HTTP_MAX_BODY && !r->body.oom);
        str_t cl = http_header_get(r, "content-length");
        if (cl.p && !http_header_get(r, "transfer-encoding").p) {
            // the body is the last body.len bytes of the request, taken verbatim
            fuzz_check(r->body.len <= r->consumed);
            fuzz_check(r->body.len == 0 || memcmp(r->body.data, c.buf + r->consumed - r->body.len, r->body.len) == 0);
        }
        (void)srv_host_ok(&srv, r);
        http_consume(&c, r->consumed);
    }
    buf_free(&r->body);
    free(r);
    free(c.buf);
    close(sv[0]);
    close(sv[1]);
    return 0;
}

// tools/pensieve-pull.c — downloads a model into pensieve's cache directory, resumably, and
// checks its SHA-256 before the file takes its final name.
//
// Build (`make` does this when libcurl's development files are present):
//   cc -O2 tools/pensieve-pull.c -o tools/pensieve-pull $(curl-config --libs) -lpthread
//
// It #includes pensieve.c for the model registry, the cache-directory rules, the lock, partial
// and sidecar conventions and SHA-256 (section 18 and 5), so the server and this tool can never
// disagree about them. libcurl is pensieve's only optional dependency and only this program
// links it; pensieve runs it for `pensieve pull` and for its zero-config first start.
//
// A pull, in order:
//   1. the target: a registry name (pinned URL, size and digest) or a URL (named after its
//      last path segment); the expected digest from --sha256, else the registry;
//   2. the per-file lock (a second pull of the same file waits, then finds it done);
//   3. a file already there with a matching sidecar is done; one that fails its digest is
//      downloaded again, and replaced only when the new copy is verified;
//   4. FILE.partial is resumed with Range (and If-Range, with the validator stored in
//      FILE.partial.meta), its existing bytes hashed first; every new byte is hashed as it
//      arrives. Redirects are followed by hand (at most 10) so that credentials go to the
//      first host only. Lost connections and stalls are retried, resuming;
//   5. the digest is compared with the expected one (or, failing that, the server's
//      X-Linked-Etag/ETag when it is a SHA-256): on mismatch the partial file is deleted and
//      both digests printed; on success the partial is fsynced, renamed to FILE, the sidecar
//      FILE.sha256 written and the directory fsynced.

#define PSV_NO_MAIN
#define PSV_NO_SIMD_KERNELS // (it runs no model: without them it compiles in a tenth of the time)
#include "../pensieve.c"

#include <curl/curl.h>
#include <sys/statvfs.h>

// A transfer slower than this for --stall-timeout seconds is a stall (bytes per second).
#define PULL_STALL_BPS 1024
// Redirects followed per request (the limit browsers and curl's default also keep near).
#define PULL_MAX_REDIRECTS 10
// Attempts that made progress do not use up --retries; this bounds them anyway.
#define PULL_MAX_ATTEMPTS 1000

typedef struct {
    const char *target; // NAME or URL
    const char *dir, *sha256, *mirror;
    long retries, stall_timeout, connect_timeout;
    bool force, quiet, list;
    struct curl_slist *resolve; // --resolve entries, for CURLOPT_RESOLVE
} pull_opts;

typedef enum { PULL_DONE, PULL_RETRY, PULL_FAIL } pull_outcome;

typedef struct {
    // What, from where, to where.
    const models_entry *entry; // NULL for a URL pull
    char url[4096];            // the first request's URL
    char origin[512];          // its scheme://host:port: the only place credentials go
    char host[256];            // for messages
    char dir[MODELS_PATH_MAX], file[256];
    char final_path[MODELS_PATH_MAX], partial_path[MODELS_PATH_MAX], meta_path[MODELS_PATH_MAX];
    const char *token;         // $HF_TOKEN or NULL
    // What the bytes must be.
    char expected[65];         // lower-case hex, "" until known
    const char *expected_from; // where it came from, for messages
    uint64_t expected_size;    // 0 when unknown
    // The partial file: have bytes, all of them hashed into sha.
    int fd;
    uint64_t have;
    psv_sha256 sha;
    char validator[256]; // If-Range value the partial bytes came with, "" when none
    // The response being received (reset on each status line).
    long status;
    char etag[256], last_modified[128], content_range[128];
    uint64_t content_length;
    bool has_length;
    char linked_digest[65]; // X-Linked-Etag from any response of the current redirect chain
    // Decisions from the final response's headers.
    bool accept_body;  // a 200/206 whose body goes into the partial
    uint64_t total;    // the file's complete size, UINT64_MAX when unknown
    bool complete_416; // 416 for a partial that is already complete
    bool restart;      // the partial does not fit what the server has: start from zero
    bool fatal;        // a callback stopped the transfer; why is in fail
    char fail[1024];
    // Progress.
    bool quiet, tty, line_open, announced;
    double t_start, t_last;
    uint64_t session_bytes; // received by this process
    int last_tenth;
} pull_state;

// Messages go to stderr, after ending a progress line in progress.
static void pull_msg(pull_state *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void pull_msg(pull_state *s, const char *fmt, ...) {
    if (s && s->line_open) {
        fputc('\n', stderr);
        s->line_open = false;
    }
    fputs("pensieve-pull: ", stderr);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

// Stops the transfer from inside a callback; the first reason is kept.
static void pull_fail(pull_state *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void pull_fail(pull_state *s, const char *fmt, ...) {
    if (s->fatal) return;
    s->fatal = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->fail, sizeof s->fail, fmt, ap);
    va_end(ap);
}

static void pull_duration(double sec, char out[32]) {
    if (!(sec >= 0) || sec > 359999) snprintf(out, 32, "--:--");
    else if (sec >= 3600) snprintf(out, 32, "%dh%02dm", (int)(sec / 3600), (int)(sec / 60) % 60);
    else if (sec >= 60) snprintf(out, 32, "%dm%02ds", (int)(sec / 60), (int)sec % 60);
    else snprintf(out, 32, "%ds", (int)sec);
}

// Progress: a line redrawn in place on a terminal (bytes, %, rate, ETA), else a plain line at
// every tenth of the file (every 15 s when the size is unknown).
static void pull_progress(pull_state *s, bool last) {
    if (s->quiet) return;
    double now = plat_now(), dt = now - s->t_start;
    bool known = s->total != UINT64_MAX && s->total > 0;
    int tenth = known ? (int)(s->have * 10 / s->total) : -1;
    if (s->tty) {
        if (!last && now - s->t_last < 0.1) return;
    } else if (!last) {
        if (known ? tenth <= s->last_tenth : now - s->t_last < 15) return;
    } else if (known && s->last_tenth == tenth) {
        return; // the plain line for this tenth is out already
    }
    s->t_last = now;
    s->last_tenth = tenth;
    double rate = dt > 0.01 ? (double)s->session_bytes / dt : 0;
    char have[32], total[32], speed[32], eta[32], line[200];
    models_human_size(s->have, have);
    models_human_size(known ? s->total : 0, total);
    models_human_size((uint64_t)rate, speed);
    pull_duration(known && rate > 0 ? (double)(s->total - PSV_MIN(s->have, s->total)) / rate : -1, eta);
    if (known)
        snprintf(line, sizeof line, "%s / %s  %3d%%  %s/s  ETA %s", have, total, (int)(s->have * 100 / s->total),
                 speed, eta);
    else
        snprintf(line, sizeof line, "%s  %s/s", have, speed);
    if (s->tty) {
        char bar[24] = "[                    ]";
        int fill = known ? (int)(PSV_MIN(s->have, s->total) * 20 / s->total) : 0;
        for (int i = 0; i < fill; i++) bar[1 + i] = '=';
        fprintf(stderr, "\r  %s %-64s", known ? bar : "", line);
        s->line_open = true;
        if (last) {
            fputc('\n', stderr);
            s->line_open = false;
        }
    } else {
        fprintf(stderr, "pensieve-pull: %s\n", line);
    }
    fflush(stderr);
}

static int pull_on_xferinfo(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal, curl_off_t ulnow) {
    PSV_UNUSED(dltotal), PSV_UNUSED(dlnow), PSV_UNUSED(ultotal), PSV_UNUSED(ulnow);
    pull_state *s = ud;
    if (s->accept_body) pull_progress(s, false);
    return 0;
}

static bool pull_header_is(const char *name, size_t n, const char *want) {
    size_t k = strlen(want);
    if (n != k) return false;
    for (size_t i = 0; i < n; i++) {
        int a = (unsigned char)name[i];
        if (a >= 'A' && a <= 'Z') a += 32;
        if (a != want[i]) return false;
    }
    return true;
}

// Copies a header value into a fixed buffer; a value that does not fit is left empty, which
// every user treats as absent or malformed, never as a shorter value.
static void pull_store(char *dst, size_t cap, const char *v, size_t n) {
    dst[0] = 0;
    if (n >= cap) return;
    memcpy(dst, v, n);
    dst[n] = 0;
}

// The partial file starts over: empty, nothing hashed.
static bool pull_truncate(pull_state *s) {
    if (ftruncate(s->fd, 0) != 0 || lseek(s->fd, 0, SEEK_SET) != 0) {
        pull_fail(s, "cannot truncate %s: %s", s->partial_path, strerror(errno));
        return false;
    }
    s->have = 0;
    psv_sha256_init(&s->sha);
    s->validator[0] = 0;
    unlink(s->meta_path);
    return true;
}

// Stores the validator a fresh download comes with, for If-Range when resuming it. Only a strong
// entity tag or a Last-Modified date qualifies (RFC 9110 §13.1.5: If-Range never carries a weak
// tag). Characters outside printable ASCII are refused: the value goes back into a header.
static void pull_save_validator(pull_state *s) {
    const char *v = s->etag[0] == '"' ? s->etag : s->last_modified;
    s->validator[0] = 0;
    unlink(s->meta_path);
    size_t n = strlen(v);
    if (n == 0 || n >= sizeof s->validator) return;
    for (size_t i = 0; i < n; i++)
        if (v[i] < 0x20 || v[i] > 0x7e) return;
    memcpy(s->validator, v, n + 1);
    int fd = open(s->meta_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) return; // without it a resume just cannot use If-Range; the digest still decides
    char line[300];
    int k = snprintf(line, sizeof line, "%s\n", v);
    if (write(fd, line, (size_t)k) != k) unlink(s->meta_path);
    close(fd);
}

static void pull_load_validator(pull_state *s) {
    s->validator[0] = 0;
    int fd = open(s->meta_path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return;
    char buf[300];
    ssize_t k = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (k <= 0) return;
    size_t n = (size_t)k;
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) n--;
    if (n == 0 || n >= sizeof s->validator) return;
    for (size_t i = 0; i < n; i++)
        if (buf[i] < 0x20 || buf[i] > 0x7e) return;
    memcpy(s->validator, buf, n);
    s->validator[n] = 0;
}

// All headers of a final (not 1xx, not 3xx) response are in: decide what its body is.
// false stops the transfer (the reason is in s->fail).
static bool pull_on_headers_done(pull_state *s) {
    long st = s->status;
    if (st < 200 || (st >= 300 && st < 400)) return true; // interim, or a redirect handled after it
    if (st != 200 && st != 206 && st != 416) return true; // an error status: reported after the transfer
    char etag_digest[65];
    if (!s->expected[0]) {
        if (s->linked_digest[0]) {
            memcpy(s->expected, s->linked_digest, 65);
            s->expected_from = "the server (X-Linked-Etag)";
        } else if (models_etag_digest(s->etag, strlen(s->etag), etag_digest)) {
            memcpy(s->expected, etag_digest, 65);
            s->expected_from = "the server (ETag)";
        }
    } else if (s->linked_digest[0] && strcmp(s->linked_digest, s->expected) != 0) {
        // The hub's X-Linked-Etag is the file's SHA-256: this file can never verify.
        pull_fail(s,
                  "the server says this file's SHA-256 is %s (X-Linked-Etag), but %s is expected (from %s): not "
                  "downloading it",
                  s->linked_digest, s->expected, s->expected_from);
        return false;
    }
    if (st == 416) { // RFC 9110 §15.5.17: the range starts at or past the end
        uint64_t first, last, complete;
        if (s->have > 0 && models_parse_content_range(s->content_range, strlen(s->content_range), &first, &last, &complete) &&
            complete == s->have)
            s->complete_416 = true, s->total = s->have;
        else
            s->restart = true; // the partial is longer than the file, or the server will not say
        return true;
    }
    if (st == 200) {
        if (s->have > 0) {
            pull_msg(s, "the server sent the whole file instead of the rest (it changed since the partial download, "
                        "or the server does not resume): starting over");
            if (!pull_truncate(s)) return false;
        }
        s->total = s->has_length ? s->content_length : UINT64_MAX;
        pull_save_validator(s);
    } else { // 206
        uint64_t first, last, complete;
        if (!models_parse_content_range(s->content_range, strlen(s->content_range), &first, &last, &complete) ||
            first == UINT64_MAX) {
            pull_fail(s, "the server answered the resume request with a malformed Content-Range '%s': stopping (the "
                         "partial download is kept)", s->content_range);
            return false;
        }
        if (first != s->have || (s->has_length && s->content_length != last - first + 1)) {
            pull_fail(s,
                      "the server sent bytes %" PRIu64 "-%" PRIu64 " (Content-Range) but the download resumes at byte "
                      "%" PRIu64 ": stopping (the partial download is kept)",
                      first, last, s->have);
            return false;
        }
        s->total = complete;
    }
    if (s->total != UINT64_MAX && s->expected_size && s->total != s->expected_size) {
        char a[32], b[32];
        models_human_size(s->total, a), models_human_size(s->expected_size, b);
        pull_fail(s, "the server's file is %" PRIu64 " bytes (%s), but %s is %" PRIu64 " bytes (%s): not downloading it",
                  s->total, a, s->entry ? s->entry->name : s->file, s->expected_size, b);
        return false;
    }
    struct statvfs vfs;
    if (s->total != UINT64_MAX && s->total > s->have && statvfs(s->dir, &vfs) == 0) {
        uint64_t need = s->total - s->have, avail = (uint64_t)vfs.f_bavail * (uint64_t)vfs.f_frsize;
        if (avail < need) {
            char a[32], b[32];
            models_human_size(need, a), models_human_size(avail, b);
            pull_fail(s, "not enough disk space in %s: %s more are needed, %s are free", s->dir, a, b);
            return false;
        }
    }
    s->accept_body = true;
    if (!s->quiet && !s->announced) {
        char size[32], have[32];
        models_human_size(s->total == UINT64_MAX ? 0 : s->total, size);
        models_human_size(s->have, have);
        pull_msg(s, "%s %s (%s) from %s%s%s", s->have ? "resuming" : "downloading", s->file,
                 s->total == UINT64_MAX ? "size unknown" : size, s->host, s->have ? " at " : "", s->have ? have : "");
        s->announced = true;
        s->last_tenth = s->total != UINT64_MAX && s->total > 0 ? (int)(s->have * 10 / s->total) : -1;
        s->t_last = plat_now();
    }
    return true;
}

static size_t pull_on_header(char *buf, size_t size, size_t nitems, void *ud) {
    pull_state *s = ud;
    size_t n = size * nitems;
    if (s->fatal) return 0;
    if (n >= 5 && !memcmp(buf, "HTTP/", 5)) { // a status line starts a new response
        s->status = 0;
        s->etag[0] = s->last_modified[0] = s->content_range[0] = 0;
        s->has_length = false;
        s->accept_body = s->complete_416 = s->restart = false;
        const char *sp = memchr(buf, ' ', n);
        if (sp) {
            size_t i = (size_t)(sp - buf) + 1;
            uint64_t code = 0;
            if (models_parse_u64(buf, n, &i, &code) && code < 1000) s->status = (long)code;
        }
        return n;
    }
    if (n <= 2 && (buf[0] == '\r' || buf[0] == '\n')) return pull_on_headers_done(s) ? n : 0;
    const char *colon = memchr(buf, ':', n);
    if (!colon) return n;
    size_t kn = (size_t)(colon - buf), vi = kn + 1, vn = n;
    while (vi < vn && (buf[vi] == ' ' || buf[vi] == '\t')) vi++;
    while (vn > vi && (buf[vn - 1] == '\r' || buf[vn - 1] == '\n' || buf[vn - 1] == ' ' || buf[vn - 1] == '\t')) vn--;
    const char *v = buf + vi;
    size_t len = vn - vi;
    if (pull_header_is(buf, kn, "etag")) pull_store(s->etag, sizeof s->etag, v, len);
    else if (pull_header_is(buf, kn, "last-modified")) pull_store(s->last_modified, sizeof s->last_modified, v, len);
    else if (pull_header_is(buf, kn, "content-range")) pull_store(s->content_range, sizeof s->content_range, v, len);
    else if (pull_header_is(buf, kn, "x-linked-etag")) {
        if (!models_etag_digest(v, len, s->linked_digest)) s->linked_digest[0] = 0;
    } else if (pull_header_is(buf, kn, "content-length")) {
        size_t i = 0;
        s->has_length = models_parse_u64(v, len, &i, &s->content_length) && i == len;
    }
    return n;
}

static size_t pull_on_body(char *p, size_t size, size_t nmemb, void *ud) {
    pull_state *s = ud;
    size_t n = size * nmemb;
    if (s->fatal) return 0;
    if (!s->accept_body) return n; // the body of a redirect, an error or a 416: not ours
    if (s->total != UINT64_MAX && (s->have > s->total || n > s->total - s->have)) {
        pull_fail(s, "the server sent more than the %" PRIu64 " bytes it announced", s->total);
        return 0;
    }
    for (size_t off = 0; off < n;) {
        ssize_t k = write(s->fd, p + off, n - off);
        if (k < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            if (e == ENOSPC || e == EDQUOT || e == EFBIG)
                pull_fail(s, "no space left to write %s (%s) after %" PRIu64 " bytes: free some space",
                          s->partial_path, strerror(e), s->have + off);
            else
                pull_fail(s, "cannot write %s: %s", s->partial_path, strerror(e));
            // the bytes that did reach the file are not hashed: cut the file back to what is
            if (ftruncate(s->fd, (off_t)s->have) != 0) s->have = 0, pull_truncate(s);
            return 0;
        }
        off += (size_t)k;
    }
    psv_sha256_update(&s->sha, p, n);
    s->have += n;
    s->session_bytes += n;
    return n;
}

// scheme, host and scheme://host:port of url; false when it is not an http(s) URL.
static bool pull_url_parts(const char *url, char *host, size_t host_cap, char *origin, size_t origin_cap) {
    CURLU *u = curl_url();
    char *scheme = NULL, *h = NULL, *port = NULL;
    bool ok = u && curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK &&
              curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) == CURLUE_OK &&
              curl_url_get(u, CURLUPART_HOST, &h, 0) == CURLUE_OK &&
              curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) == CURLUE_OK &&
              (!strcmp(scheme, "http") || !strcmp(scheme, "https"));
    if (ok) {
        for (char *c = h; *c; c++)
            if (*c >= 'A' && *c <= 'Z') *c = (char)(*c + 32);
        int k = snprintf(origin, origin_cap, "%s://%s:%s", scheme, h, port);
        int j = snprintf(host, host_cap, "%s", h);
        ok = k > 0 && (size_t)k < origin_cap && j > 0 && (size_t)j < host_cap;
    }
    curl_free(scheme);
    curl_free(h);
    curl_free(port);
    curl_url_cleanup(u);
    return ok;
}

// One attempt: the request and its redirects, until a final response has been received.
static pull_outcome pull_attempt(CURL *h, pull_state *s, const pull_opts *o, char *why, size_t why_cap) {
    char url[4096], errbuf[CURL_ERROR_SIZE];
    snprintf(url, sizeof url, "%s", s->url);
    s->linked_digest[0] = 0;
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    bool restarted = false;
    for (int hop = 0;;) {
        char hop_host[256], hop_origin[512], range[64], if_range[300], auth[1024];
        if (!pull_url_parts(url, hop_host, sizeof hop_host, hop_origin, sizeof hop_origin)) {
            snprintf(why, why_cap, "cannot follow a redirect to '%s' (only http and https URLs)", url);
            return PULL_FAIL;
        }
        if (lseek(s->fd, (off_t)s->have, SEEK_SET) < 0) {
            snprintf(why, why_cap, "cannot seek in %s: %s", s->partial_path, strerror(errno));
            return PULL_FAIL;
        }
        struct curl_slist *hdrs = NULL, *t;
        bool oom = false;
        if (s->have > 0) {
            snprintf(range, sizeof range, "Range: bytes=%" PRIu64 "-", s->have); // RFC 9110 §14.1.2
            oom |= !(t = curl_slist_append(hdrs, range)) || !(hdrs = t);
            if (s->validator[0]) {
                snprintf(if_range, sizeof if_range, "If-Range: %s", s->validator); // RFC 9110 §13.1.5
                oom |= !(t = curl_slist_append(hdrs, if_range)) || !(hdrs = t);
            }
        }
        // Credentials go to the origin the user named, never to a host a redirect points at.
        if (s->token && !strcmp(hop_origin, s->origin)) {
            snprintf(auth, sizeof auth, "Authorization: Bearer %s", s->token);
            oom |= !(t = curl_slist_append(hdrs, auth)) || !(hdrs = t);
        }
        if (oom) {
            curl_slist_free_all(hdrs);
            snprintf(why, why_cap, "out of memory");
            return PULL_FAIL;
        }
        errbuf[0] = 0;
        s->fatal = false;
        s->status = 0;
        s->accept_body = s->complete_416 = s->restart = false;
        curl_easy_setopt(h, CURLOPT_URL, url);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
        uint64_t before = s->session_bytes;
        CURLcode rc = curl_easy_perform(h);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, NULL);
        curl_slist_free_all(hdrs);
        long status = 0;
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
        if (s->fatal) {
            snprintf(why, why_cap, "%s", s->fail);
            return PULL_FAIL;
        }
        if (rc != CURLE_OK) {
            const char *detail = errbuf[0] ? errbuf : curl_easy_strerror(rc);
            switch (rc) {
            case CURLE_COULDNT_RESOLVE_HOST:
            case CURLE_COULDNT_RESOLVE_PROXY:
            case CURLE_COULDNT_CONNECT:
                snprintf(why, why_cap, "cannot reach %s: %s", hop_host, detail);
                return PULL_FAIL;
            case CURLE_OPERATION_TIMEDOUT:
                if (status == 0 && s->session_bytes == before) {
                    snprintf(why, why_cap, "cannot reach %s: %s", hop_host, detail);
                    return PULL_FAIL;
                }
                snprintf(why, why_cap, "the transfer stalled (under %d bytes/s for %ld s): %s", PULL_STALL_BPS,
                         o->stall_timeout, detail);
                return PULL_RETRY;
            case CURLE_PARTIAL_FILE:
            case CURLE_RECV_ERROR:
            case CURLE_SEND_ERROR:
            case CURLE_GOT_NOTHING:
            case CURLE_HTTP2:
            case CURLE_HTTP2_STREAM:
                snprintf(why, why_cap, "the connection to %s was lost: %s", hop_host, detail);
                return PULL_RETRY;
            default:
                snprintf(why, why_cap, "transfer from %s failed: %s", hop_host, detail);
                return PULL_FAIL;
            }
        }
        if (status == 301 || status == 302 || status == 303 || status == 307 || status == 308) {
            char *loc = NULL;
            curl_easy_getinfo(h, CURLINFO_REDIRECT_URL, &loc);
            if (!loc) {
                snprintf(why, why_cap, "%s answered with a redirect (%ld) but no usable Location", hop_host, status);
                return PULL_FAIL;
            }
            if (++hop > PULL_MAX_REDIRECTS) {
                snprintf(why, why_cap, "too many redirects (more than %d); the last one pointed at %s",
                         PULL_MAX_REDIRECTS, loc);
                return PULL_FAIL;
            }
            if (strlen(loc) >= sizeof url) {
                snprintf(why, why_cap, "a redirect points at a URL longer than %zu bytes", sizeof url - 1);
                return PULL_FAIL;
            }
            snprintf(url, sizeof url, "%s", loc);
            continue;
        }
        if (s->restart) {
            if (restarted) {
                snprintf(why, why_cap, "%s keeps refusing the range request (416)", hop_host);
                return PULL_FAIL;
            }
            pull_msg(s, "the partial download does not fit the server's file (416): starting over");
            if (!pull_truncate(s)) {
                snprintf(why, why_cap, "%s", s->fail);
                return PULL_FAIL;
            }
            restarted = true;
            continue;
        }
        if (s->complete_416) return PULL_DONE;
        if (status == 200 || status == 206) {
            if (s->total != UINT64_MAX && s->have < s->total) {
                snprintf(why, why_cap, "the transfer from %s ended early", hop_host);
                return PULL_RETRY;
            }
            return PULL_DONE;
        }
        if (status == 401 || status == 403)
            snprintf(why, why_cap, "%s refused access (HTTP %ld) to %s%s", hop_host, status, url,
                     s->token ? "" : " (a gated model? set HF_TOKEN)");
        else if (status == 404 || status == 410)
            snprintf(why, why_cap, "%s has no such file (HTTP %ld): %s", hop_host, status, url);
        else
            snprintf(why, why_cap, "%s answered HTTP %ld for %s", hop_host, status, url);
        return status == 408 || status == 429 || status >= 500 ? PULL_RETRY : PULL_FAIL;
    }
}

// Hashes the n bytes already in the partial file (a resume continues their digest).
static psv_status pull_hash_existing(pull_state *s, uint64_t n, psv_error *err) {
    uint8_t *buf = malloc(SHA256_READ_SIZE);
    if (!buf) return err_set(err, PSV_ERR_NOMEM, "out of memory");
    psv_status st = PSV_OK;
    for (uint64_t off = 0; off < n;) {
        size_t want = (size_t)PSV_MIN((uint64_t)SHA256_READ_SIZE, n - off);
        ssize_t k = pread(s->fd, buf, want, (off_t)off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            st = err_set(err, PSV_ERR_IO, "cannot read %s: %s", s->partial_path, k < 0 ? strerror(errno) : "it shrank");
            break;
        }
        psv_sha256_update(&s->sha, buf, (size_t)k);
        off += (uint64_t)k;
    }
    free(buf);
    return st;
}

static void pull_usage(FILE *f) {
    fprintf(f,
            "usage: pensieve-pull NAME|URL [options]\n"
            "       pensieve-pull --list\n"
            "Downloads a model into pensieve's cache directory, resuming an interrupted download, and\n"
            "checks the file's SHA-256 before it takes its final name. Prints the file's path when done.\n"
            "  NAME                  a registry model (see --list), fetched from its pinned revision\n"
            "  URL                   an http(s) URL; the file is named after its last path segment\n"
            "  --dir DIR             download into DIR instead of the cache directory ($PENSIEVE_HOME,\n"
            "                        else $XDG_CACHE_HOME/pensieve, else ~/.cache/pensieve)\n"
            "  --sha256 HEX          the expected SHA-256, overriding the registry's (env\n"
            "                        PENSIEVE_PULL_SHA256); without either, a URL's file is checked\n"
            "                        against the server's X-Linked-Etag or ETag when it is a SHA-256\n"
            "  --mirror BASEURL      fetch registry models from BASEURL/OWNER/REPO/resolve/REV/FILE\n"
            "                        instead of %s (env PENSIEVE_MIRROR)\n"
            "  --force               download again even when the file is there; the old file is\n"
            "                        replaced only once the new one is verified\n"
            "  --retries N           retries after a lost connection, stall or server error that made no\n"
            "                        progress [3]; retries that made progress are free\n"
            "  --stall-timeout S     a transfer under %d bytes/s for S seconds has stalled [60]\n"
            "  --connect-timeout S   give up connecting after S seconds [10]\n"
            "  --resolve HOST:PORT:ADDR  connect to ADDR for HOST:PORT, as curl --resolve\n"
            "  --quiet               no progress output\n"
            "  --list                print the registry and exit\n"
            "HF_TOKEN, when set, is sent (Authorization: Bearer) to the URL's own host only, never to a\n"
            "host a redirect leads to. Exit status: 0 done (downloaded, or already there and verified),\n"
            "1 failed, 2 bad usage.\n",
            PSV_MODELS_HUB, PULL_STALL_BPS);
}

static bool pull_parse_long(const char *s, long lo, long hi, long *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

// Returns -1 to go on, else the exit status.
static int pull_parse_args(int argc, char **argv, pull_opts *o) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool takes = true, ok = true;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            pull_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--list")) o->list = true, takes = false;
        else if (!strcmp(a, "--force")) o->force = true, takes = false;
        else if (!strcmp(a, "--quiet") || !strcmp(a, "-q")) o->quiet = true, takes = false;
        else if (!strcmp(a, "--dir")) ok = v && *v, o->dir = v;
        else if (!strcmp(a, "--sha256")) ok = v != NULL, o->sha256 = v;
        else if (!strcmp(a, "--mirror")) ok = v && *v, o->mirror = v;
        else if (!strcmp(a, "--retries")) ok = pull_parse_long(v, 0, 1000, &o->retries);
        else if (!strcmp(a, "--stall-timeout")) ok = pull_parse_long(v, 1, 86400, &o->stall_timeout);
        else if (!strcmp(a, "--connect-timeout")) ok = pull_parse_long(v, 1, 3600, &o->connect_timeout);
        else if (!strcmp(a, "--resolve")) {
            struct curl_slist *t = v ? curl_slist_append(o->resolve, v) : NULL;
            ok = t != NULL;
            if (t) o->resolve = t;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "pensieve-pull: unknown option '%s' (try --help)\n", a);
            return 2;
        } else if (o->target) {
            fprintf(stderr, "pensieve-pull: one model at a time ('%s' and '%s')\n", o->target, a);
            return 2;
        } else {
            o->target = a, takes = false;
        }
        if (!ok) {
            fprintf(stderr, "pensieve-pull: bad or missing value for %s (try --help)\n", a);
            return 2;
        }
        if (takes) i++;
    }
    return -1;
}

// A registry model's fetch-by-hand instructions, after a failure that leaves nothing usable.
static void pull_print_help(const pull_state *s, const char *mirror) {
    if (!s->entry) return;
    buf_t b = {0};
    models_fetch_help(s->entry, s->final_path, mirror, &b);
    if (!b.oom) fprintf(stderr, "To %s", b.data);
    buf_free(&b);
}

int main(int argc, char **argv) {
    pull_opts o = {.retries = 3, .stall_timeout = 60, .connect_timeout = 10};
    pull_state s;
    memset(&s, 0, sizeof s);
    s.fd = -1;
    s.total = UINT64_MAX;
    s.last_tenth = -1;
    int rc = 1, lock = -1;
    CURL *h = NULL;
    psv_error err = {0};
    char why[10000]; // room for a URL and a path: messages are never cut
    signal(SIGPIPE, SIG_IGN); // a closed socket is an error from send(), not a kill
    signal(SIGXFSZ, SIG_IGN); // over the file-size limit, write() fails with EFBIG: reported, partial kept
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        fprintf(stderr, "pensieve-pull: cannot initialise libcurl\n");
        return 1;
    }
    int a = pull_parse_args(argc, argv, &o);
    if (a >= 0) {
        rc = a;
        goto done;
    }
    const char *mirror = o.mirror ? o.mirror : models_mirror_env();
    const char *env_sha = getenv("PENSIEVE_PULL_SHA256");
    if (!o.sha256 && env_sha && *env_sha) o.sha256 = env_sha; // for runs where flags cannot be passed
    if (o.dir) {
        if (strlen(o.dir) >= sizeof s.dir) {
            pull_msg(NULL, "--dir: path too long");
            goto done;
        }
        snprintf(s.dir, sizeof s.dir, "%s", o.dir);
    } else if (models_cache_dir(s.dir, sizeof s.dir, &err) != PSV_OK) {
        pull_msg(NULL, "%s", err.message);
        goto done;
    }
    if (o.list) {
        models_registry_print(stdout, s.dir);
        rc = 0;
        goto done;
    }
    if (!o.target) {
        fprintf(stderr, "pensieve-pull: name a model or a URL (try --help; --list shows the registry)\n");
        rc = 2;
        goto done;
    }
    if (o.sha256 && !models_parse_hex64(o.sha256, strlen(o.sha256), s.expected)) {
        fprintf(stderr, "pensieve-pull: --sha256 (or PENSIEVE_PULL_SHA256) needs 64 hex digits, got '%s'\n", o.sha256);
        rc = 2;
        goto done;
    }
    if (o.sha256) s.expected_from = o.sha256 == env_sha ? "PENSIEVE_PULL_SHA256" : "--sha256";
    bool is_url = strstr(o.target, "://") != NULL;
    if (!is_url) {
        s.entry = models_find(o.target);
        if (!s.entry) {
            buf_t b = {0};
            models_names(&b);
            fprintf(stderr, "pensieve-pull: '%s' is not a known model (%s) nor an http(s) URL\n", o.target,
                    b.oom ? "see --list" : b.data);
            buf_free(&b);
            rc = 2;
            goto done;
        }
        if (models_url(s.entry, mirror, s.url, sizeof s.url, &err) != PSV_OK) {
            pull_msg(NULL, "%s", err.message);
            goto done;
        }
        snprintf(s.file, sizeof s.file, "%s", s.entry->file);
        if (!o.sha256) {
            if (s.entry->sha256[0]) {
                memcpy(s.expected, s.entry->sha256, 65);
                s.expected_from = "the registry";
            }
            s.expected_size = s.entry->size;
        }
    } else {
        if (o.mirror) pull_msg(NULL, "note: --mirror applies to registry models only, not to a URL");
        if (strlen(o.target) >= sizeof s.url) {
            pull_msg(NULL, "URL too long");
            rc = 2;
            goto done;
        }
        snprintf(s.url, sizeof s.url, "%s", o.target);
        if (!models_url_filename(s.url, s.file, sizeof s.file)) {
            fprintf(stderr, "pensieve-pull: cannot name a file after '%s': its last path segment must be a plain "
                            "file name ([A-Za-z0-9._+-], not starting with '.')\n", o.target);
            rc = 2;
            goto done;
        }
    }
    if (!pull_url_parts(s.url, s.host, sizeof s.host, s.origin, sizeof s.origin)) {
        fprintf(stderr, "pensieve-pull: '%s' is not an http or https URL\n", s.url);
        rc = 2;
        goto done;
    }
    const char *token = getenv("HF_TOKEN");
    s.token = token && *token ? token : NULL;
    if (!models_join(s.final_path, sizeof s.final_path, s.dir, s.file, NULL) ||
        !models_join(s.partial_path, sizeof s.partial_path, s.dir, s.file, ".partial") ||
        !models_join(s.meta_path, sizeof s.meta_path, s.dir, s.file, ".partial.meta")) {
        pull_msg(NULL, "%s/%s: path too long", s.dir, s.file);
        goto done;
    }
    if (models_mkdir_p(s.dir, &err) != PSV_OK) {
        pull_msg(NULL, "%s", err.message);
        goto done;
    }
    s.quiet = o.quiet;
    s.tty = isatty(STDERR_FILENO);
    if (models_lock(s.dir, s.file, true, stderr, "pensieve-pull", &lock, NULL, &err) != PSV_OK) {
        pull_msg(NULL, "%s", err.message);
        goto done;
    }

    // 3. Already there?
    struct stat st;
    if (!o.force && stat(s.final_path, &st) == 0 && S_ISREG(st.st_mode)) {
        char side[65];
        bool has_side = models_sidecar_read(s.final_path, side, NULL) == PSV_OK;
        bool size_ok = !s.expected_size || (uint64_t)st.st_size == s.expected_size;
        if (has_side && size_ok && (!s.expected[0] || !strcmp(side, s.expected))) {
            pull_msg(NULL, "%s is already downloaded and verified (sha256 %s)", s.file, side);
            printf("%s\n", s.final_path);
            rc = 0;
            goto done;
        }
        if (!has_side && size_ok && s.expected[0]) {
            uint8_t d[32];
            char hex[65];
            if (psv_sha256_file(s.final_path, d, &err) != PSV_OK) {
                pull_msg(NULL, "%s", err.message);
                goto done;
            }
            sha256_hex(d, hex);
            if (!strcmp(hex, s.expected)) {
                if (models_sidecar_write(s.dir, s.file, hex, &err) != PSV_OK) {
                    pull_msg(NULL, "%s", err.message);
                    goto done;
                }
                pull_msg(NULL, "%s was already there and matches %s: recorded its digest", s.file, s.expected_from);
                printf("%s\n", s.final_path);
                rc = 0;
                goto done;
            }
        }
        pull_msg(NULL, "%s is already there but %s: downloading it again (it is replaced only once the new copy is "
                       "verified)", s.file,
                 !size_ok ? "has the wrong size" : has_side ? "its recorded digest is not the expected one"
                 : s.expected[0] ? "it is not the expected file" : "nothing records its digest");
    }

    // 4. The partial file: resume what is there.
    s.fd = open(s.partial_path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (s.fd < 0) {
        pull_msg(NULL, "cannot open %s: %s", s.partial_path, strerror(errno));
        goto done;
    }
    if (fstat(s.fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        pull_msg(NULL, "%s is not a regular file", s.partial_path);
        goto done;
    }
    psv_sha256_init(&s.sha);
    if (st.st_size > 0) {
        s.have = (uint64_t)st.st_size;
        pull_load_validator(&s);
        if (!o.quiet && s.have >= 100000000u) {
            char have[32];
            models_human_size(s.have, have);
            pull_msg(NULL, "checking the %s downloaded so far before resuming", have);
        }
        if (pull_hash_existing(&s, s.have, &err) != PSV_OK) {
            pull_msg(NULL, "%s", err.message);
            goto done;
        }
    } else {
        unlink(s.meta_path);
    }

    h = curl_easy_init();
    if (!h) {
        pull_msg(NULL, "cannot initialise libcurl");
        goto done;
    }
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, pull_on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &s);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, pull_on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &s);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, pull_on_xferinfo);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, &s);
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L); // by hand, for the credential rule
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, o.connect_timeout);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, (long)PULL_STALL_BPS);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, o.stall_timeout);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "pensieve-pull/" PSV_VERSION);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
#else
    curl_easy_setopt(h, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    if (o.resolve) curl_easy_setopt(h, CURLOPT_RESOLVE, o.resolve);

    s.t_start = plat_now();
    long retries_left = o.retries;
    for (int attempt = 1;; attempt++) {
        uint64_t before = s.session_bytes;
        pull_outcome out = pull_attempt(h, &s, &o, why, sizeof why);
        if (out == PULL_DONE) break;
        bool none = s.session_bytes == 0 && s.have == 0;
        if (out == PULL_FAIL || retries_left == 0 || attempt >= PULL_MAX_ATTEMPTS) {
            pull_msg(&s, "%s", why);
            if (s.have > 0)
                pull_msg(NULL, "the partial download is kept (%" PRIu64 " bytes in %s): run the same command again to "
                               "resume it", s.have, s.partial_path);
            else if (none && strstr(why, "cannot reach"))
                pull_msg(NULL, "nothing was downloaded (offline?)");
            if (none) pull_print_help(&s, mirror);
            goto done;
        }
        bool progress = s.session_bytes > before;
        if (!progress) retries_left--;
        int delay = progress ? 1 : 1 << PSV_MIN(o.retries - retries_left - 1, 5);
        char have[32];
        models_human_size(s.have, have);
        pull_msg(&s, "%s; retrying in %d s from %s (%ld retr%s left)", why, delay, have, retries_left,
                 retries_left == 1 ? "y" : "ies");
        sleep((unsigned)delay);
    }
    if (s.accept_body || s.session_bytes) pull_progress(&s, true);

    // 5. Verify, then give the file its name.
    uint8_t digest[32];
    char hex[65];
    psv_sha256_final(&s.sha, digest);
    sha256_hex(digest, hex);
    if (s.expected[0] && strcmp(hex, s.expected) != 0) {
        pull_msg(&s, "%s: SHA-256 mismatch: the download is corrupt or not the expected file\n"
                     "  expected %s (from %s)\n  received %s\n"
                     "the partial download was deleted; running the same command downloads it anew",
                 s.file, s.expected, s.expected_from, hex);
        unlink(s.partial_path);
        unlink(s.meta_path);
        goto done;
    }
    if (fsync(s.fd) != 0) {
        pull_msg(&s, "cannot write %s to disk (fsync): %s; the partial download is kept", s.partial_path,
                 strerror(errno));
        goto done;
    }
    close(s.fd);
    s.fd = -1;
    char side_path[MODELS_PATH_MAX];
    if (models_join(side_path, sizeof side_path, s.dir, s.file, ".sha256")) unlink(side_path); // the old file's
    if (rename(s.partial_path, s.final_path) != 0) {
        pull_msg(&s, "cannot rename %s to %s: %s", s.partial_path, s.final_path, strerror(errno));
        goto done;
    }
    unlink(s.meta_path);
    if (models_sidecar_write(s.dir, s.file, hex, &err) != PSV_OK) { // also fsyncs the directory
        pull_msg(&s, "%s (the file itself is complete and verified)", err.message);
        goto done;
    }
    char size[32];
    models_human_size(s.have, size);
    if (s.expected[0])
        pull_msg(&s, "saved %s (%s), sha256 %s verified against %s", s.file, size, hex, s.expected_from);
    else
        pull_msg(&s, "saved %s (%s), sha256 %s: recorded as received (there was no --sha256, the registry does not "
                     "know the file and the server sent no SHA-256)", s.file, size, hex);
    printf("%s\n", s.final_path);
    rc = 0;
done:
    if (h) curl_easy_cleanup(h);
    if (s.fd >= 0) {
        close(s.fd);
        if (rc != 0 && s.have == 0) unlink(s.partial_path), unlink(s.meta_path); // nothing worth keeping
    }
    models_unlock(s.dir, s.file, lock);
    curl_slist_free_all(o.resolve);
    curl_global_cleanup();
    return rc;
}

// tests/fuzz_sse.c — libFuzzer harness for the stop-sequence matcher and the SSE events of
// section 19.
//
// Input: one byte (mod 5) giving the number of stop sequences, then fields separated by NUL
// bytes: the stop sequences, then the pieces of generated text in the order the model would
// produce them. The pieces go through gen_feed as the scheduler feeds them; what it releases
// is checked against a direct model of the contract: after each piece, if any stop sequence
// occurs in the text so far, the output is the text before its earliest occurrence (ties go to
// the first listed) and generation stops there; otherwise everything is released by the end.
// Each released piece is then sent as an Anthropic content_block_delta event and an OpenAI
// chat chunk over a socketpair; the events read back must be well-framed SSE whose JSON data
// carries the piece (byte for byte when it is valid UTF-8).
#define PSV_TESTING
#define PSV_NO_MAIN
#define PSV_SERVER
#include "pensieve.c"

#include <sys/socket.h>

static void fuzz_check(bool ok) {
    if (!ok) __builtin_trap();
}

static bool fuzz_utf8_ok(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = (uint8_t)s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t bad = 0, len = json_utf8_len((const uint8_t *)s + i, n - i, &bad);
        if (!len) return false;
        i += len;
    }
    return true;
}

// Reads every byte the other end has sent (it is still open, so read what is there).
static void fuzz_drain(int fd, buf_t *out) {
    char tmp[4096];
    for (;;) {
        ssize_t k = recv(fd, tmp, sizeof tmp, MSG_DONTWAIT);
        if (k <= 0) break;
        buf_append(out, tmp, (size_t)k);
    }
}

// One SSE event ("event: NAME\n" optional, "data: JSON\n\n"); returns the parsed data.
static json_doc *fuzz_event(const buf_t *b, const char *want_event) {
    fuzz_check(!b->oom && b->len >= 8 && b->data[b->len - 1] == '\n' && b->data[b->len - 2] == '\n');
    const char *p = b->data, *end = b->data + b->len - 2;
    if (want_event) {
        size_t n = strlen(want_event);
        fuzz_check(strncmp(p, "event: ", 7) == 0 && strncmp(p + 7, want_event, n) == 0 && p[7 + n] == '\n');
        p += 8 + n;
    }
    fuzz_check(strncmp(p, "data: ", 6) == 0);
    p += 6;
    for (const char *q = p; q < end; q++) fuzz_check(*q != '\n' && *q != '\r'); // one data line
    json_doc *doc = NULL;
    fuzz_check(json_parse(p, (size_t)(end - p), &doc, NULL) == PSV_OK);
    return doc;
}

static void fuzz_sse_piece(const char *text, size_t n) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return;
    static server_t srv;
    http_conn c;
    memset(&c, 0, sizeof c);
    c.fd = sv[0];
    c.srv = &srv;
    bool valid = fuzz_utf8_ok(text, n);
    buf_t got = {0};

    api_out ao = {.c = &c, .stream = true};
    gen_job j;
    memset(&j, 0, sizeof j);
    j.ud = &ao;
    fuzz_check(anth_on_text(&j, text, n));
    fuzz_drain(sv[1], &got);
    json_doc *doc = fuzz_event(&got, "content_block_delta");
    const json_value *d = json_get(json_root(doc), "delta");
    const json_value *t = json_get(d, "text");
    fuzz_check(t && t->kind == JSON_STRING && !strcmp(json_str(json_get(d, "type")), "text_delta"));
    fuzz_check(!valid || (t->u.s.n == n && memcmp(t->u.s.p, text, n) == 0));
    json_doc_free(doc);

    oai_out oo = {.c = &c, .stream = true, .chat = true, .id = "chatcmpl-x", .model = "m"};
    j.ud = &oo;
    got.len = 0;
    fuzz_check(oai_on_text(&j, text, n));
    fuzz_drain(sv[1], &got);
    doc = fuzz_event(&got, NULL);
    t = json_get(json_get(json_at(json_get(json_root(doc), "choices"), 0), "delta"), "content");
    fuzz_check(t && t->kind == JSON_STRING);
    fuzz_check(!valid || (t->u.s.n == n && memcmp(t->u.s.p, text, n) == 0));
    json_doc_free(doc);

    buf_free(&ao.ev);
    buf_free(&oo.ev);
    buf_free(&got);
    close(sv[0]);
    close(sv[1]);
}

// Earliest occurrence of any stop in t[0..n): its offset, and which stop (-1: none).
static size_t fuzz_first_stop(char **stops, size_t n_stops, const char *t, size_t n, int *which) {
    *which = -1;
    size_t best = SIZE_MAX;
    for (size_t k = 0; k < n_stops; k++) {
        size_t sl = strlen(stops[k]);
        for (size_t i = 0; i + sl <= n && i < best; i++)
            if (memcmp(t + i, stops[k], sl) == 0) {
                best = i;
                *which = (int)k;
                break;
            }
    }
    return best;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 8192) return 0;
    size_t n_stops = data[0] % 5;
    char *in = malloc(size);
    fuzz_check(in != NULL);
    memcpy(in, data + 1, size - 1);
    in[size - 1] = 0;
    // split into NUL-terminated fields
    const char *fields[256];
    size_t lens[256], n_fields = 0, start = 0;
    for (size_t i = 0; i < size && n_fields < 256; i++)
        if (in[i] == 0) {
            fields[n_fields] = in + start;
            lens[n_fields++] = i - start;
            start = i + 1;
        }
    char *stops[4];
    size_t ns = 0, f = 0;
    for (; f < n_fields && f < n_stops; f++)
        if (lens[f] > 0) stops[ns++] = (char *)fields[f]; // the API refuses empty stop sequences

    gen_job j;
    memset(&j, 0, sizeof j);
    pthread_mutex_init(&j.mu, NULL);
    pthread_cond_init(&j.cv, NULL);
    j.stops = stops;
    j.n_stops = ns;
    buf_t all = {0}; // the text so far
    bool stopped = false;
    size_t want_len = 0;
    size_t prev_out = 0;
    for (; f < n_fields; f++) {
        buf_append(&all, fields[f], lens[f]);
        bool more = gen_feed(&j, fields[f], lens[f]);
        // released text is always a prefix of the text so far, and what is held could still
        // begin a stop sequence
        fuzz_check(j.outbox.len <= all.len && (j.outbox.len == 0 || memcmp(j.outbox.data, all.data, j.outbox.len) == 0));
        if (j.outbox.len > prev_out) fuzz_sse_piece(j.outbox.data + prev_out, j.outbox.len - prev_out);
        prev_out = j.outbox.len;
        int which;
        size_t at = fuzz_first_stop(stops, ns, all.data ? all.data : "", all.len, &which);
        if (which >= 0) {
            fuzz_check(!more && j.stop == STOP_SEQUENCE && j.stop_index == which);
            want_len = at;
            stopped = true;
            break;
        }
        fuzz_check(more);
        size_t longest = 0;
        for (size_t k = 0; k < ns; k++) longest = PSV_MAX(longest, strlen(stops[k]));
        fuzz_check(all.len - j.outbox.len < PSV_MAX(longest, (size_t)1));
    }
    if (!stopped) { // the end of generation releases what was held
        if (j.hold.len) gen_emit(&j, j.hold.data, j.hold.len);
        want_len = all.len;
    }
    fuzz_check(j.outbox.len == want_len && (want_len == 0 || memcmp(j.outbox.data, all.data, want_len) == 0));
    buf_free(&all);
    buf_free(&j.hold);
    buf_free(&j.outbox);
    pthread_mutex_destroy(&j.mu);
    pthread_cond_destroy(&j.cv);
    free(in);
    return 0;
}

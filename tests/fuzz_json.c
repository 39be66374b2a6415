// tests/fuzz_json.c — libFuzzer harness for the JSON reader and writer (section 6).
// Properties, each aborting on violation:
// - json_parse never crashes; on failure it returns no doc and a positioned message;
// - whatever parses writes back to text that parses to an equal tree and rewrites identically;
// - any bytes written as a string come back as valid UTF-8, unchanged when they were valid.
#define PSV_TESTING
#define PSV_NO_MAIN
#include "pensieve.c"

static void fuzz_write(const json_value *v, buf_t *b) {
    json_writer w;
    memset(b, 0, sizeof *b);
    json_w_init(&w, b);
    json_w_value(&w, v);
    buf_reserve(b, 0);
    PSV_ASSERT(!b->oom && w.depth == 0);
}

static bool fuzz_valid_utf8(const uint8_t *p, size_t n) {
    for (size_t i = 0, bad, len; i < n; i += len)
        if (!(len = json_utf8_len(p + i, n - i, &bad))) return false;
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    psv_error err = {0};
    json_doc *d = NULL, *d2 = NULL;
    buf_t b1, b2;
    if (json_parse((const char *)data, size, &d, &err) != PSV_OK) {
        PSV_ASSERT(d == NULL && strncmp(err.message, "json: line ", 11) == 0);
    } else {
        fuzz_write(json_root(d), &b1);
        err_clear(&err);
        if (json_parse(b1.data, b1.len, &d2, &err) != PSV_OK) {
            fprintf(stderr, "rewritten text does not parse: %s\n%s\n", err.message, b1.data);
            abort();
        }
        PSV_ASSERT(json_equal(json_root(d), json_root(d2)));
        fuzz_write(json_root(d2), &b2);
        PSV_ASSERT(b1.len == b2.len && memcmp(b1.data, b2.data, b1.len) == 0);
        buf_free(&b2);
        buf_free(&b1);
        json_doc_free(d2);
        json_doc_free(d);
    }

    // The raw input as one string value.
    json_writer w;
    memset(&b1, 0, sizeof b1);
    json_w_init(&w, &b1);
    json_w_str(&w, (const char *)data, size);
    PSV_ASSERT(!b1.oom);
    err_clear(&err);
    if (json_parse(b1.data, b1.len, &d, &err) != PSV_OK) {
        fprintf(stderr, "written string does not parse: %s\n", err.message);
        abort();
    }
    const json_value *s = json_root(d);
    PSV_ASSERT(s->kind == JSON_STRING && fuzz_valid_utf8((const uint8_t *)s->u.s.p, s->u.s.n));
    if (fuzz_valid_utf8(data, size)) PSV_ASSERT(s->u.s.n == size && memcmp(s->u.s.p, data, size) == 0);
    json_doc_free(d);
    buf_free(&b1);
    return 0;
}

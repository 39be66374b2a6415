// tests/test_json.c — the JSON reader and writer (section 6): JSONTestSuite conformance, round
// trips over the suite and over seeded random documents, error positions, int64 exactness,
// the depth limit, writer escaping and number formatting, locale independence.
#define PSV_TESTING
#define PSV_NO_MAIN
#include "pensieve.c"
#include "test.h"

#include <dirent.h>
#include <float.h>
#include <locale.h>

// ---- helpers ---------------------------------------------------------------------------------

// Parses text[0..n); returns the doc or NULL (message in *err).
static json_doc *parse_n(const char *text, size_t n, psv_error *err) {
    json_doc *d = NULL;
    err_clear(err);
    psv_status st = json_parse(text, n, &d, err);
    if (st != PSV_OK) CHECK(d == NULL);
    return d;
}
static json_doc *parse_s(const char *text, psv_error *err) { return parse_n(text, strlen(text), err); }

// Writes v compactly into a fresh buffer (caller frees b).
static void write_value(const json_value *v, buf_t *b) {
    memset(b, 0, sizeof *b);
    json_writer w;
    json_w_init(&w, b);
    json_w_value(&w, v);
    buf_reserve(b, 0); // data non-NULL even when nothing was written
}

// The round-trip property: write(v) parses back to a tree equal to v, and writing that tree
// gives the same bytes again (the writer is deterministic and canonical for its own output).
static bool round_trip(const json_value *v, const char *what) {
    buf_t b1, b2;
    psv_error err;
    bool ok = false;
    json_doc *d2 = NULL;
    write_value(v, &b1);
    if (b1.oom) {
        fprintf(stderr, "%s: writer out of memory\n", what);
        goto done;
    }
    d2 = parse_n(b1.data, b1.len, &err);
    if (!d2) {
        fprintf(stderr, "%s: output does not parse: %s\n  output: %.200s\n", what, err.message, b1.data);
        goto done;
    }
    if (!json_equal(v, json_root(d2))) {
        fprintf(stderr, "%s: tree changed in the round trip\n  output: %.200s\n", what, b1.data);
        goto done;
    }
    write_value(json_root(d2), &b2);
    ok = b2.len == b1.len && memcmp(b1.data, b2.data, b1.len) == 0;
    if (!ok) fprintf(stderr, "%s: second write differs\n  1: %.200s\n  2: %.200s\n", what, b1.data, b2.data);
    buf_free(&b2);
done:
    json_doc_free(d2);
    buf_free(&b1);
    return ok;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

// ---- conformance: JSONTestSuite (y_ accept, n_ reject, i_ either) -----------------------------

static void test_json_conformance(void) {
    const char *dir = t_shared_path("conformance/json");
    if (!dir) {
        SKIP("JSONTestSuite conformance: ../shared is absent (set PSV_SHARED)");
        return;
    }
    char dirpath[4096];
    snprintf(dirpath, sizeof dirpath, "%s", dir);
    DIR *dh = opendir(dirpath);
    if (!dh) {
        SKIP("JSONTestSuite conformance: cannot open %s", dirpath);
        return;
    }
    char *names[2048];
    size_t n_names = 0;
    struct dirent *de;
    while ((de = readdir(dh)) && n_names < PSV_ARRAY_LEN(names)) {
        size_t l = strlen(de->d_name);
        if (l > 5 && strcmp(de->d_name + l - 5, ".json") == 0) names[n_names++] = str_dup(str_c(de->d_name));
    }
    closedir(dh);
    qsort(names, n_names, sizeof names[0], cmp_str);
    int ny = 0, nn = 0, ni = 0, ni_acc = 0, y_ok = 0, n_ok = 0, rt_ok = 0;
    for (size_t k = 0; k < n_names; k++) {
        const char *name = names[k];
        char path[4200], *text = NULL;
        size_t len = 0;
        psv_error err = {0};
        snprintf(path, sizeof path, "%s/%s", dirpath, name);
        if (plat_read_file(path, &text, &len, &err) != PSV_OK) {
            CHECKF(0, "%s", err.message);
            continue;
        }
        json_doc *d = parse_n(text, len, &err);
        if (name[0] == 'y') {
            ny++;
            CHECKF(d != NULL, "%s must be accepted: %s", name, err.message);
            if (d) {
                y_ok++;
                bool rt = round_trip(json_root(d), name);
                CHECKF(rt, "%s: round trip", name);
                rt_ok += rt;
            }
        } else if (name[0] == 'n') {
            nn++;
            CHECKF(d == NULL, "%s must be rejected", name);
            if (!d) {
                n_ok++;
                CHECKF(strncmp(err.message, "json: line ", 11) == 0, "%s: message '%s'", name, err.message);
            }
        } else if (name[0] == 'i') {
            ni++;
            ni_acc += d != NULL;
            printf("  %-48s %s%s\n", name, d ? "accepted" : "rejected: ", d ? "" : err.message);
            if (d) CHECKF(round_trip(json_root(d), name), "%s: round trip", name);
        }
        json_doc_free(d);
        free(text);
        free(names[k]);
    }
    printf("JSONTestSuite: y_ %d/%d accepted (%d round-tripped), n_ %d/%d rejected, i_ %d "
           "(%d accepted, %d rejected)\n",
           y_ok, ny, rt_ok, n_ok, nn, ni, ni_acc, ni - ni_acc);
    CHECKF(ny > 0 && nn > 0 && ni > 0, "suite files found: y %d, n %d, i %d", ny, nn, ni);
}

// ---- random documents ------------------------------------------------------------------------

static uint64_t json_rng_state;
static uint64_t json_rng_next(void) { // splitmix64
    uint64_t z = (json_rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static uint32_t json_rng_below(uint32_t n) { return (uint32_t)(json_rng_next() % n); }

static void gen_ws(buf_t *b) {
    static const char ws[] = " \t\n\r";
    while (json_rng_below(4) == 0) buf_putc(b, ws[json_rng_below(4)]);
}

// A random code point (never a surrogate), weighted toward the interesting ones.
static uint32_t gen_cp(void) {
    switch (json_rng_below(10)) {
    case 0: return json_rng_below(0x20);                                  // control
    case 1: return "\"\\/"[json_rng_below(3)];
    case 2: return 0x80 + json_rng_below(0x780);                          // 2-byte
    case 3: { uint32_t c = 0x800 + json_rng_below(0xF800); return c >= 0xD800 && c <= 0xDFFF ? 0xFFFD : c; }
    case 4: return 0x10000 + json_rng_below(0x100000);                    // 4-byte
    case 5: return json_rng_below(2) ? 0x2028 : 0x2029;
    case 6: return json_rng_below(2) ? 0 : 0x10FFFF;
    default: return 0x20 + json_rng_below(0x5F);                          // printable ASCII
    }
}

// A random JSON string literal into b; its decoded UTF-8 into dec (when not NULL).
static void gen_string(buf_t *b, buf_t *dec) {
    buf_putc(b, '"');
    uint32_t n = json_rng_below(4) == 0 ? json_rng_below(64) : json_rng_below(8);
    for (uint32_t k = 0; k < n; k++) {
        uint32_t cp = gen_cp();
        uint8_t u[4];
        size_t ul = json_utf8_put(u, cp);
        if (dec) buf_append(dec, u, ul);
        bool must = cp < 0x20 || cp == '"' || cp == '\\';
        if (must || json_rng_below(4) == 0) {
            const char *shorts = "\"\"\\\\//\bb\ff\nn\rr\tt";
            const char *m = NULL;
            for (const char *s = shorts; *s; s += 2)
                if ((uint32_t)(uint8_t)*s == cp) m = s;
            if (m && json_rng_below(2)) {
                buf_putc(b, '\\');
                buf_putc(b, m[1]);
            } else if (cp >= 0x10000) {
                uint32_t v = cp - 0x10000;
                buf_printf(b, json_rng_below(2) ? "\\u%04X\\u%04X" : "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
            } else {
                buf_printf(b, json_rng_below(2) ? "\\u%04X" : "\\u%04x", cp);
            }
        } else {
            buf_append(b, u, ul);
        }
    }
    buf_putc(b, '"');
}

static void gen_number(buf_t *b) {
    switch (json_rng_below(6)) {
    case 0: buf_printf(b, "%" PRId64, INT64_MAX - (int64_t)json_rng_below(3)); break;
    case 1: buf_printf(b, "%" PRId64, INT64_MIN + (int64_t)json_rng_below(3)); break;
    case 2: {
        uint32_t sh = json_rng_below(64);
        buf_printf(b, "%" PRId64, (int64_t)json_rng_next() >> sh);
        break;
    }
    case 3: { // a random finite double, printed exactly
        double d;
        do d = f64_from_bits(json_rng_next()); while ((f64_bits(d) & 0x7ff0000000000000ull) == 0x7ff0000000000000ull);
        buf_printf(b, "%.17g", d);
        break;
    }
    case 4: { // separate statements: argument evaluation order would make the stream compiler-specific
        const char *sign = json_rng_below(2) ? "-" : "";
        uint32_t ip = json_rng_below(1000), fp = json_rng_below(100000);
        buf_printf(b, "%s%u.%u%s", sign, ip, fp, json_rng_below(2) ? "" : "e-7");
        break;
    }
    default: { // the grammar's corners: exponent signs, E, huge exponents
        static const char *const e[] = {"e", "E", "e+", "E-", "e-"};
        const char *sign = json_rng_below(2) ? "-" : "";
        uint32_t m = 1 + json_rng_below(999);
        const char *ee = e[json_rng_below(5)];
        buf_printf(b, "%s%u%s%u", sign, m, ee, json_rng_below(300));
        if (json_rng_below(8) == 0) buf_puts(b, "0000000000000000000000");
        break;
    }
    }
}

static void gen_value(buf_t *b, int depth) {
    uint32_t k = json_rng_below(depth >= 6 ? 6 : 9);
    gen_ws(b);
    switch (k) {
    case 0: buf_puts(b, "null"); break;
    case 1: buf_puts(b, json_rng_below(2) ? "true" : "false"); break;
    case 2:
    case 3: gen_number(b); break;
    case 4:
    case 5: gen_string(b, NULL); break;
    case 6:
    case 7: {
        uint32_t n = json_rng_below(6);
        buf_putc(b, '[');
        gen_ws(b);
        for (uint32_t i = 0; i < n; i++) {
            if (i) buf_putc(b, ',');
            gen_value(b, depth + 1);
        }
        buf_putc(b, ']');
        break;
    }
    default: {
        uint32_t n = json_rng_below(6);
        buf_putc(b, '{');
        gen_ws(b);
        for (uint32_t i = 0; i < n; i++) {
            if (i) buf_putc(b, ',');
            gen_ws(b);
            if (json_rng_below(4) == 0) buf_puts(b, "\"dup\""); // duplicate keys stay, in order
            else gen_string(b, NULL);
            gen_ws(b);
            buf_putc(b, ':');
            gen_value(b, depth + 1);
        }
        buf_putc(b, '}');
        break;
    }
    }
    gen_ws(b);
}

static void test_random_round_trip(void) {
    json_rng_state = 20240601;
    int n_docs = 3000, ok = 0, parsed = 0;
    for (int t = 0; t < n_docs; t++) {
        buf_t b = {0};
        gen_value(&b, 0);
        psv_error err;
        json_doc *d = parse_n(b.data, b.len, &err);
        // Numbers like 999e299 legitimately overflow; everything else must parse.
        if (!d) {
            CHECKF(err.status == PSV_ERR_RANGE && strstr(err.message, "out of range"),
                   "random doc %d rejected: %s\n  %.300s", t, err.message, b.data);
        } else {
            parsed++;
            char what[64];
            snprintf(what, sizeof what, "random doc %d", t);
            ok += round_trip(json_root(d), what);
        }
        json_doc_free(d);
        buf_free(&b);
    }
    CHECKF(ok == parsed && parsed >= 1000, "random round trips: %d of %d parsed docs (%d generated)", ok, parsed, n_docs);
    printf("random round trip: %d documents generated, %d parsed, %d round-tripped\n", n_docs, parsed, ok);

    // String decoding against the generator's own decoding.
    int s_ok = 0;
    for (int t = 0; t < 2000; t++) {
        buf_t b = {0}, dec = {0};
        gen_string(&b, &dec);
        buf_reserve(&dec, 0);
        psv_error err;
        json_doc *d = parse_n(b.data, b.len, &err);
        const json_value *v = json_root(d);
        bool ok1 = d && v->kind == JSON_STRING && v->u.s.n == dec.len && memcmp(v->u.s.p, dec.data, dec.len) == 0 &&
                   v->u.s.p[v->u.s.n] == 0;
        if (!ok1) fprintf(stderr, "string decode mismatch for %.200s (%s)\n", b.data, d ? "parsed" : err.message);
        s_ok += ok1;
        json_doc_free(d);
        buf_free(&b);
        buf_free(&dec);
    }
    CHECKF(s_ok == 2000, "random strings decoded exactly: %d of 2000", s_ok);
}

// ---- error messages name the position ------------------------------------------------------

static void test_json_errors(void) {
    static const struct {
        const char *text;
        size_t len; // 0: strlen(text)
        psv_status st;
        int line, col, byte;
        const char *what;
    } cases[] = {
        {"", 0, PSV_ERR_FORMAT, 1, 1, 0, "empty input"},
        {"   ", 0, PSV_ERR_FORMAT, 1, 4, 3, "unexpected end of input"},
        {"\n\n  [\"\xff\"]", 0, PSV_ERR_FORMAT, 3, 5, 6, "invalid UTF-8 in string"},
        {"[1,]", 0, PSV_ERR_FORMAT, 1, 4, 3, "unexpected ']' (expected a value)"},
        {"[1 2]", 0, PSV_ERR_FORMAT, 1, 4, 3, "expected ',' or ']' in array (got '2')"},
        {"[1,2", 0, PSV_ERR_FORMAT, 1, 5, 4, "got end of input"},
        {"{\"a\" 1}", 0, PSV_ERR_FORMAT, 1, 6, 5, "expected ':'"},
        {"{1:2}", 0, PSV_ERR_FORMAT, 1, 2, 1, "expected a string key"},
        {"{\"a\":1,}", 0, PSV_ERR_FORMAT, 1, 8, 7, "expected a string key"},
        {"{\"a\":1\n  \"b\":2}", 0, PSV_ERR_FORMAT, 2, 3, 9, "expected ',' or '}' in object"},
        {"{\"a\":1,\n  \"b\":[1,\n  2,,]}", 0, PSV_ERR_FORMAT, 3, 5, 22, "unexpected ','"},
        {"[\"a\tb\"]", 0, PSV_ERR_FORMAT, 1, 4, 3, "unescaped control character"},
        {"[\"\\x\"]", 0, PSV_ERR_FORMAT, 1, 3, 2, "invalid escape"},
        {"[\"\\u12\"]", 0, PSV_ERR_FORMAT, 1, 3, 2, "invalid \\u escape"},
        {"[\"\\u12G4\"]", 0, PSV_ERR_FORMAT, 1, 3, 2, "invalid \\u escape"},
        {"[\"\\uD800\"]", 0, PSV_ERR_FORMAT, 1, 3, 2, "lone surrogate \\uD800"},
        {"[\"\\uD800\\u0041\"]", 0, PSV_ERR_FORMAT, 1, 3, 2, "lone surrogate \\uD800"},
        {"[\"\\uDC00\"]", 0, PSV_ERR_FORMAT, 1, 3, 2, "lone surrogate \\uDC00"},
        {"\"\\u00e9\\uD83D\"", 0, PSV_ERR_FORMAT, 1, 8, 7, "lone surrogate"},
        {"[\"abc", 0, PSV_ERR_FORMAT, 1, 2, 1, "unterminated string"},
        {"[\"abc\\\"]", 0, PSV_ERR_FORMAT, 1, 2, 1, "unterminated string"},
        {"[\"\xC0\x80\"]", 0, PSV_ERR_FORMAT, 1, 3, 2, "invalid UTF-8"},           // overlong NUL
        {"[\"\xE0\x80\xAF\"]", 0, PSV_ERR_FORMAT, 1, 3, 2, "invalid UTF-8"},       // overlong '/'
        {"[\"\xF0\x8F\xBF\xBF\"]", 0, PSV_ERR_FORMAT, 1, 3, 2, "invalid UTF-8"},   // overlong U+FFFF
        {"[\"\xED\xA0\x80\"]", 0, PSV_ERR_FORMAT, 1, 3, 2, "invalid UTF-8"},       // U+D800 in UTF-8
        {"[\"\xF4\x90\x80\x80\"]", 0, PSV_ERR_FORMAT, 1, 3, 2, "invalid UTF-8"},   // U+110000
        {"[\"\xE2\x82\"]", 0, PSV_ERR_FORMAT, 1, 3, 2, "invalid UTF-8"},           // truncated
        {"[\"ab\x80\"]", 0, PSV_ERR_FORMAT, 1, 5, 4, "invalid UTF-8"},             // lone continuation
        {"01", 0, PSV_ERR_FORMAT, 1, 1, 0, "leading zeros"},
        {"-01", 0, PSV_ERR_FORMAT, 1, 1, 0, "leading zeros"},
        {"1.", 0, PSV_ERR_FORMAT, 1, 3, 2, "expected a digit after '.'"},
        {"1.e5", 0, PSV_ERR_FORMAT, 1, 3, 2, "expected a digit after '.'"},
        {"1e", 0, PSV_ERR_FORMAT, 1, 3, 2, "exponent"},
        {"1.5e+", 0, PSV_ERR_FORMAT, 1, 6, 5, "exponent"},
        {"-", 0, PSV_ERR_FORMAT, 1, 2, 1, "expected a digit after '-'"},
        {"- 1", 0, PSV_ERR_FORMAT, 1, 2, 1, "expected a digit after '-'"},
        {"+1", 0, PSV_ERR_FORMAT, 1, 1, 0, "unexpected '+'"},
        {".5", 0, PSV_ERR_FORMAT, 1, 1, 0, "unexpected '.'"},
        {"[1e309]", 0, PSV_ERR_RANGE, 1, 2, 1, "number out of range"},
        {"-1e309", 0, PSV_ERR_RANGE, 1, 1, 0, "number out of range"},
        {"1.7976931348623159e308", 0, PSV_ERR_RANGE, 1, 1, 0, "number out of range"},
        {"[1] x", 0, PSV_ERR_FORMAT, 1, 5, 4, "after the value"},
        {"1 2", 0, PSV_ERR_FORMAT, 1, 3, 2, "after the value"},
        {"[1]\0", 4, PSV_ERR_FORMAT, 1, 4, 3, "byte 0x00 after the value"},
        {"[\0]", 3, PSV_ERR_FORMAT, 1, 2, 1, "byte 0x00"},
        {"\xEF\xBB\xBF{}", 0, PSV_ERR_FORMAT, 1, 1, 0, "byte order mark"},
        {"[\x0c]", 0, PSV_ERR_FORMAT, 1, 2, 1, "byte 0x0C"}, // form feed is not JSON whitespace
        {"tru", 0, PSV_ERR_FORMAT, 1, 1, 0, "invalid literal"},
        {"nulL", 0, PSV_ERR_FORMAT, 1, 1, 0, "invalid literal"},
        {"True", 0, PSV_ERR_FORMAT, 1, 1, 0, "unexpected 'T'"},
        {"'a'", 0, PSV_ERR_FORMAT, 1, 1, 0, "unexpected '''"},
        {"\r\n\r\n}", 0, PSV_ERR_FORMAT, 3, 1, 4, "unexpected '}'"},
    };
    for (size_t k = 0; k < PSV_ARRAY_LEN(cases); k++) {
        size_t len = cases[k].len ? cases[k].len : strlen(cases[k].text);
        psv_error err;
        json_doc *d = parse_n(cases[k].text, len, &err);
        char pos[128];
        snprintf(pos, sizeof pos, "json: line %d, column %d (byte %d): ", cases[k].line, cases[k].col, cases[k].byte);
        CHECKF(!d && err.status == cases[k].st && strncmp(err.message, pos, strlen(pos)) == 0 &&
                   strstr(err.message, cases[k].what),
               "case %zu: got status %s, '%s'; expected %s'%s...%s'", k, psv_status_name(err.status),
               err.message, psv_status_name(cases[k].st), pos, cases[k].what);
        json_doc_free(d);
    }
    // No error record at all is fine, and NULL input with a length is a caller error.
    json_doc *d = (json_doc *)1;
    CHECK(json_parse("[", 1, &d, NULL) == PSV_ERR_FORMAT && d == NULL);
    psv_error err = {0};
    CHECK(json_parse(NULL, 3, &d, &err) == PSV_ERR_INVALID && d == NULL);
    CHECK(json_parse(NULL, 0, &d, NULL) == PSV_ERR_FORMAT && d == NULL);
}

// ---- numbers ----------------------------------------------------------------------------------

static void test_numbers(void) {
    static const struct { const char *text; json_kind kind; int64_t i; double d; } cases[] = {
        {"0", JSON_INT, 0, 0},
        {"-0", JSON_INT, 0, 0},
        {"9223372036854775807", JSON_INT, INT64_MAX, 0},
        {"-9223372036854775808", JSON_INT, INT64_MIN, 0},
        {"-9223372036854775807", JSON_INT, -INT64_MAX, 0},
        {"9223372036854775808", JSON_REAL, 0, 9223372036854775808.0},
        {"-9223372036854775809", JSON_REAL, 0, -9223372036854775809.0},
        {"18446744073709551616", JSON_REAL, 0, 18446744073709551616.0},
        {"100000000000000000000000", JSON_REAL, 0, 1e23},
        {"1.0", JSON_REAL, 0, 1.0},
        {"1e2", JSON_REAL, 0, 100.0},
        {"1E+2", JSON_REAL, 0, 100.0},
        {"-1.5e-3", JSON_REAL, 0, -1.5e-3},
        {"0.1", JSON_REAL, 0, 0.1},
        {"0e0", JSON_REAL, 0, 0.0},
        {"0e99999999999999999999", JSON_REAL, 0, 0.0},
        {"2.2250738585072011e-308", JSON_REAL, 0, 2.2250738585072011e-308},
        {"2.2250738585072012e-308", JSON_REAL, 0, 2.2250738585072012e-308},
        {"4.9406564584124654e-324", JSON_REAL, 0, 4.9406564584124654e-324},
        {"1e-400", JSON_REAL, 0, 0.0},
        {"123.456e-789", JSON_REAL, 0, 0.0},
        {"1.7976931348623157e308", JSON_REAL, 0, DBL_MAX},
        {"1.7976931348623158e308", JSON_REAL, 0, DBL_MAX}, // below the rounding midpoint
        {"9007199254740993", JSON_INT, 9007199254740993LL, 0},
        {"9007199254740993.0", JSON_REAL, 0, 9007199254740992.0}, // ties to even
        {"0.30000000000000004", JSON_REAL, 0, 0.30000000000000004},
    };
    for (size_t k = 0; k < PSV_ARRAY_LEN(cases); k++) {
        psv_error err;
        json_doc *d = parse_s(cases[k].text, &err);
        const json_value *v = json_root(d);
        bool ok = d && v->kind == cases[k].kind &&
                  (v->kind == JSON_INT ? v->u.i == cases[k].i : f64_bits(v->u.d) == f64_bits(cases[k].d));
        CHECKF(ok, "%s: %s", cases[k].text, d ? (v->kind == JSON_INT ? "wrong INT" : "wrong REAL") : err.message);
        if (d) CHECK(json_is_number(v));
        json_doc_free(d);
    }
    // -0.0 keeps its sign; -0 is the integer zero.
    psv_error err;
    json_doc *d = parse_s("[-0.0, -0, 1e-400, -1e-400]", &err);
    CHECK(d && f64_bits(json_at(json_root(d), 0)->u.d) == 0x8000000000000000ull);
    CHECK(d && json_at(json_root(d), 1)->kind == JSON_INT);
    CHECK(d && f64_bits(json_at(json_root(d), 3)->u.d) == 0x8000000000000000ull);
    json_doc_free(d);

    // A long mantissa is converted exactly (strtod, not a fixed buffer): 0.000…01 with 1000 zeros
    // after the point is 1e-1001 → 0, and 1 followed by 300 zeros and ".5" is 1e300.
    buf_t b = {0};
    buf_puts(&b, "0.");
    for (int i = 0; i < 1000; i++) buf_putc(&b, '0');
    buf_puts(&b, "1");
    d = parse_n(b.data, b.len, &err);
    CHECK(d && json_root(d)->kind == JSON_REAL && json_root(d)->u.d == 0.0);
    json_doc_free(d);
    buf_free(&b);
    buf_puts(&b, "1");
    for (int i = 0; i < 300; i++) buf_putc(&b, '0');
    buf_puts(&b, ".5");
    d = parse_n(b.data, b.len, &err);
    CHECK(d && json_root(d)->kind == JSON_REAL && json_root(d)->u.d == 1e300);
    json_doc_free(d);
    buf_free(&b);
    buf_puts(&b, "1");
    for (int i = 0; i < 400; i++) buf_putc(&b, '0');
    d = parse_n(b.data, b.len, &err);
    CHECKF(!d && err.status == PSV_ERR_RANGE, "400-digit integer: %s", err.message);
    buf_free(&b);
}

// ---- depth --------------------------------------------------------------------------------------

static void test_depth(void) {
    const int max = PSV_JSON_MAX_DEPTH;
    buf_t b = {0};
    psv_error err;
    for (int i = 0; i < max; i++) buf_putc(&b, '[');
    for (int i = 0; i < max; i++) buf_putc(&b, ']');
    json_doc *d = parse_n(b.data, b.len, &err);
    CHECKF(d != NULL, "%d nested arrays must parse: %s", max, err.message);
    if (d) CHECK(round_trip(json_root(d), "max depth"));
    // The deepest tree written inside envelopes: the writer tracks more levels than the reader.
    if (d) {
        buf_t o = {0};
        json_writer w;
        json_w_init(&w, &o);
        json_w_obj_begin(&w);
        json_w_key(&w, "a");
        json_w_arr_begin(&w);
        json_w_int(&w, 1);
        json_w_value(&w, json_root(d));
        json_w_value(&w, json_root(d));
        json_w_arr_end(&w);
        json_w_obj_end(&w);
        buf_t want = {0};
        buf_puts(&want, "{\"a\":[1,");
        buf_append(&want, b.data, b.len);
        buf_putc(&want, ',');
        buf_append(&want, b.data, b.len);
        buf_puts(&want, "]}");
        CHECK(!o.oom && o.len == want.len && memcmp(o.data, want.data, o.len) == 0);
        buf_free(&want);
        buf_free(&o);
    }
    json_doc_free(d);
    buf_free(&b);

    for (int i = 0; i <= max; i++) buf_puts(&b, "{\"k\":");
    buf_puts(&b, "0");
    for (int i = 0; i <= max; i++) buf_putc(&b, '}');
    d = parse_n(b.data, b.len, &err);
    char want[64];
    snprintf(want, sizeof want, "(byte %d): nesting too deep", max * 5);
    CHECKF(!d && err.status == PSV_ERR_RANGE && strstr(err.message, want), "%d nested objects: %s", max + 1, err.message);
    buf_free(&b);

    // A million '[' fail at level max+1 without touching the rest (and without recursion).
    size_t n = 1000000;
    char *deep = malloc(n);
    memset(deep, '[', n);
    double t0 = plat_now();
    d = parse_n(deep, n, &err);
    double dt = plat_now() - t0;
    snprintf(want, sizeof want, "(byte %d): nesting too deep", max);
    CHECKF(!d && err.status == PSV_ERR_RANGE && strstr(err.message, want), "1e6 '[': %s", err.message);
    CHECKF(dt < 0.5, "1e6 '[' took %.3f s", dt);
    free(deep);
}

// ---- accessors ----------------------------------------------------------------------------------

static void test_accessors(void) {
    psv_error err;
    json_doc *d = parse_s(" {\"a\":1, \"b\":[true,null,\"x\\u0000y\"], \"a\":2.5, \"k\\u0000\":3, \"\":{}}\r\n", &err);
    CHECKF(d != NULL, "%s", err.message);
    if (!d) return;
    const json_value *r = json_root(d);
    CHECK(r->kind == JSON_OBJECT && json_len(r) == 5);
    CHECK(strcmp(r->u.obj.items[0].key, "a") == 0 && strcmp(r->u.obj.items[2].key, "a") == 0); // order kept
    CHECK(json_get(r, "a") && json_get(r, "a")->kind == JSON_REAL && json_num(json_get(r, "a")) == 2.5);
    CHECK(r->u.obj.items[0].value.kind == JSON_INT && json_num(&r->u.obj.items[0].value) == 1.0);
    const json_value *arr = json_get(r, "b");
    CHECK(json_len(arr) == 3 && json_at(arr, 0)->kind == JSON_BOOL && json_at(arr, 0)->u.b);
    CHECK(json_at(arr, 1)->kind == JSON_NULL && json_at(arr, 3) == NULL && json_at(r, 0) == NULL);
    const json_value *s = json_at(arr, 2);
    CHECK(s->u.s.n == 3 && memcmp(json_str(s), "x\0y", 4) == 0);
    CHECK(json_get(r, "k") == NULL); // the key is "k\0": 2 bytes
    CHECK(r->u.obj.items[3].key_len == 2 && memcmp(r->u.obj.items[3].key, "k\0", 3) == 0);
    CHECK(json_get(r, "") && json_get(r, "")->kind == JSON_OBJECT && json_len(json_get(r, "")) == 0);
    CHECK(json_get(r, "missing") == NULL && json_get(arr, "a") == NULL && json_get(NULL, "a") == NULL);
    CHECK(json_str(json_get(r, "a")) == NULL && json_str(NULL) == NULL && json_num(NULL) == 0);
    CHECK(!json_is_number(arr) && !json_is_number(NULL) && json_num(arr) == 0 && json_len(NULL) == 0);
    CHECK(json_len(json_get(r, "a")) == 0 && json_root(NULL) == NULL);
    CHECK(round_trip(r, "accessors doc"));
    json_doc_free(d);
    json_doc_free(NULL);

    // Strings and keys: surrogate pairs, every short escape, raw multi-byte UTF-8.
    d = parse_s("[\"\\uD83D\\uDE00\\ud834\\udd1e\", \"\\\"\\\\\\/\\b\\f\\n\\r\\t\", \"\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\"]", &err);
    CHECKF(d != NULL, "%s", err.message);
    if (d) {
        CHECK(strcmp(json_str(json_at(json_root(d), 0)), "\xF0\x9F\x98\x80\xF0\x9D\x84\x9E") == 0);
        CHECK(strcmp(json_str(json_at(json_root(d), 1)), "\"\\/\b\f\n\r\t") == 0);
        CHECK(strcmp(json_str(json_at(json_root(d), 2)), "\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80") == 0);
    }
    json_doc_free(d);

    // A big document: many chunks in the arena, large strings in chunks of their own.
    buf_t b = {0};
    buf_putc(&b, '[');
    for (int i = 0; i < 20000; i++) buf_printf(&b, "%s{\"i\":%d,\"s\":\"%0*d\"}", i ? "," : "", i, i % 7 == 0 ? 3000 : 5, i);
    buf_putc(&b, ']');
    d = parse_n(b.data, b.len, &err);
    CHECKF(d && json_len(json_root(d)) == 20000, "big doc: %s", d ? "wrong length" : err.message);
    if (d) {
        CHECK(json_num(json_get(json_at(json_root(d), 19999), "i")) == 19999);
        CHECK(strlen(json_str(json_get(json_at(json_root(d), 7), "s"))) == 3000);
        CHECK(round_trip(json_root(d), "big doc"));
    }
    json_doc_free(d);
    buf_free(&b);
}

// ---- writer -------------------------------------------------------------------------------------

static bool wrote(buf_t *b, const char *want) {
    bool ok = !b->oom && b->data && strlen(want) == b->len && memcmp(b->data, want, b->len) == 0;
    if (!ok) fprintf(stderr, "writer: got '%s', want '%s'\n", b->data ? b->data : "(null)", want);
    buf_free(b);
    return ok;
}

static void test_writer(void) {
    buf_t b = {0};
    json_writer w;

    json_w_init(&w, &b);
    json_w_obj_begin(&w);
    json_w_key(&w, "a");
    json_w_int(&w, 1);
    json_w_key(&w, "b");
    json_w_arr_begin(&w);
    json_w_bool(&w, true);
    json_w_bool(&w, false);
    json_w_null(&w);
    json_w_cstr(&w, "x");
    json_w_obj_begin(&w);
    json_w_obj_end(&w);
    json_w_arr_end(&w);
    json_w_key(&w, "c");
    json_w_obj_begin(&w);
    json_w_key(&w, "d");
    json_w_arr_begin(&w);
    json_w_arr_end(&w);
    json_w_obj_end(&w);
    json_w_key_n(&w, "k\0z", 3);
    json_w_int(&w, INT64_MIN);
    json_w_obj_end(&w);
    CHECK(w.depth == 0);
    CHECK(wrote(&b, "{\"a\":1,\"b\":[true,false,null,\"x\",{}],\"c\":{\"d\":[]},\"k\\u0000z\":-9223372036854775808}"));

    // Top-level values: no separator, the caller frames them (SSE, NDJSON).
    json_w_init(&w, &b);
    json_w_int(&w, 1);
    json_w_cstr(&w, "a");
    CHECK(wrote(&b, "1\"a\""));

    static const struct { const char *in; size_t n; const char *out; } strs[] = {
        {"a\"b\\c/", 0, "\"a\\\"b\\\\c/\""},
        {"\b\f\n\r\t", 0, "\"\\b\\f\\n\\r\\t\""},
        {"\x01\x1f\x7f", 0, "\"\\u0001\\u001f\x7f\""},
        {"a\0b", 3, "\"a\\u0000b\""},
        {"\xE2\x80\xA8|\xE2\x80\xA9", 0, "\"\\u2028|\\u2029\""},
        {"\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\xEF\xBF\xBF\xF4\x8F\xBF\xBF", 0,
         "\"\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\xEF\xBF\xBF\xF4\x8F\xBF\xBF\""},
        {"\xff", 0, "\"\xEF\xBF\xBD\""},
        {"a\x80z", 0, "\"a\xEF\xBF\xBDz\""},
        {"\xE2\x82", 0, "\"\xEF\xBF\xBD\""},                 // truncated: one maximal subpart
        {"\xE2\x82z", 0, "\"\xEF\xBF\xBDz\""},
        {"\xF0\x9F\x98", 0, "\"\xEF\xBF\xBD\""},
        {"\xC0\x80", 0, "\"\xEF\xBF\xBD\xEF\xBF\xBD\""},     // C0 never starts a sequence
        {"\xED\xA0\x80", 0, "\"\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\""}, // a surrogate: 3 replacements
        {"\xF4\x90\x80\x80", 0, "\"\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\""},
        {"\xE0\x9F\x80", 0, "\"\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\""}, // overlong
        {"\xE1\x80\xE2\xF0\x91\x92\xF1\xBF\x41", 0,                        // Unicode Table 3-8
         "\"\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\x41\""},
        {"", 0, "\"\""},
    };
    for (size_t k = 0; k < PSV_ARRAY_LEN(strs); k++) {
        json_w_init(&w, &b);
        json_w_str(&w, strs[k].in, strs[k].n ? strs[k].n : strlen(strs[k].in));
        CHECKF(wrote(&b, strs[k].out), "string case %zu", k);
    }
    // A key goes through the same escaping.
    json_w_init(&w, &b);
    json_w_obj_begin(&w);
    json_w_key(&w, "\"\xff\n");
    json_w_null(&w);
    json_w_obj_end(&w);
    CHECK(wrote(&b, "{\"\\\"\xEF\xBF\xBD\\n\":null}"));

    static const struct { double v; const char *out; } dbls[] = {
        {0.1, "0.1"}, {1.0, "1.0"}, {-0.0, "-0.0"}, {0.0, "0.0"}, {100.0, "100.0"}, {1.5, "1.5"},
        {123456.0, "123456.0"}, {1e15, "1e+15"}, {1e21, "1e+21"}, {1e-7, "1e-07"},
        {0.30000000000000004, "0.30000000000000004"}, {1.0 / 3.0, "0.3333333333333333"},
        {9007199254740992.0, "9007199254740992.0"}, {DBL_MAX, "1.7976931348623157e+308"},
        {4.9406564584124654e-324, "4.94065645841247e-324"}, {-2.5e-300, "-2.5e-300"},
    };
    for (size_t k = 0; k < PSV_ARRAY_LEN(dbls); k++) {
        json_w_init(&w, &b);
        json_w_double(&w, dbls[k].v);
        CHECKF(wrote(&b, dbls[k].out), "double case %zu", k);
    }
    double inf = f64_from_bits(0x7ff0000000000000ull), nan = f64_from_bits(0x7ff8000000000001ull);
    json_w_init(&w, &b);
    json_w_arr_begin(&w);
    json_w_double(&w, nan);
    json_w_double(&w, inf);
    json_w_double(&w, -inf);
    json_w_arr_end(&w);
    CHECK(wrote(&b, "[null,null,null]"));

    // Every double written reads back bit for bit (and as a REAL).
    json_rng_state = 7;
    int good = 0;
    for (int t = 0; t < 20000; t++) {
        double v = f64_from_bits(json_rng_next());
        if (t % 4 == 0) { // integral values
            uint32_t sh = json_rng_below(64);
            v = (double)(int64_t)(json_rng_next() >> sh);
        }
        if ((f64_bits(v) & 0x7ff0000000000000ull) == 0x7ff0000000000000ull) v = 1.25;
        json_w_init(&w, &b);
        json_w_double(&w, v);
        psv_error err;
        json_doc *d = parse_n(b.data, b.len, &err);
        good += d && json_root(d)->kind == JSON_REAL && f64_bits(json_root(d)->u.d) == f64_bits(v) && b.len <= 24;
        json_doc_free(d);
        buf_free(&b);
    }
    CHECKF(good == 20000, "doubles round-tripped: %d of 20000", good);

    // Deeper than the writer can track: flagged as failed, never silently wrong.
    json_w_init(&w, &b);
    for (int i = 0; i < JSON_W_MAX_DEPTH; i++) json_w_arr_begin(&w);
    CHECK(!b.oom);
    json_w_arr_begin(&w);
    CHECK(b.oom);
    for (int i = 0; i <= JSON_W_MAX_DEPTH; i++) json_w_arr_end(&w);
    CHECK(w.depth == 0);
    buf_free(&b);
}

// ---- locale: a comma decimal point must not change reading or writing ----------------------------

static void test_locale(void) {
    static const char *const names[] = {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8", "ps_AF.UTF-8", "ru_RU.UTF-8"};
    const char *got = NULL;
    for (size_t k = 0; k < PSV_ARRAY_LEN(names) && !got; k++) {
        if (setlocale(LC_NUMERIC, names[k]) && strcmp(localeconv()->decimal_point, ".") != 0) got = names[k];
    }
    if (!got) {
        setlocale(LC_NUMERIC, "C");
        SKIP("locale: no locale with a decimal point other than '.' is installed");
        return;
    }
    psv_error err;
    json_doc *d = parse_s("[1.5, -2.25e1, 0.1]", &err);
    CHECKF(d && json_at(json_root(d), 0)->u.d == 1.5 && json_at(json_root(d), 1)->u.d == -22.5 &&
               json_at(json_root(d), 2)->u.d == 0.1,
           "locale %s: parse: %s", got, d ? "wrong values" : err.message);
    if (d) CHECK(round_trip(json_root(d), "locale"));
    json_doc_free(d);
    buf_t b = {0};
    json_writer w;
    json_w_init(&w, &b);
    json_w_arr_begin(&w);
    json_w_double(&w, 1.5);
    json_w_double(&w, 0.1);
    json_w_double(&w, 2.0);
    json_w_arr_end(&w);
    CHECKF(wrote(&b, "[1.5,0.1,2.0]"), "locale %s: write", got);
    printf("locale: checked under %s (decimal point '%s')\n", got, localeconv()->decimal_point);
    setlocale(LC_NUMERIC, "C");
}

int main(void) {
    test_json_conformance();
    test_random_round_trip();
    test_json_errors();
    test_numbers();
    test_depth();
    test_accessors();
    test_writer();
    test_locale();
    return t_finish();
}

// tests/test_tokenizer.c — Unicode tables, UTF-8, the pre-tokenizers, SPM and BPE encoding,
// detokenization and the streaming decoder. Oracles: ../shared/conformance/tokenizer (ids for
// every vocabulary) and the prompt_ids of ../shared/reference/expected; everything else is
// checked against rules worked out from the regexes by hand.
#define PSV_TESTING
#define PSV_NO_MAIN
#include "pensieve.c"
#include "test.h"

#include <dirent.h>

// ---- helpers ---------------------------------------------------------------------------------

static uint64_t tok_rng_state = 0x2545f4914f6cdd1dull;
static uint32_t tok_rng_next(void) { // xorshift64*, fixed seed: failures reproduce
    tok_rng_state ^= tok_rng_state >> 12;
    tok_rng_state ^= tok_rng_state << 25;
    tok_rng_state ^= tok_rng_state >> 27;
    return (uint32_t)((tok_rng_state * 0x2545f4914f6cdd1dull) >> 32);
}

static tok_vocab *load_vocab_path(const char *path) {
    psv_error err = {0};
    gguf_file *f = NULL;
    tok_vocab *v = NULL;
    if (gguf_open(path, &f, &err) == PSV_OK) tok_load(f, &v, &err);
    CHECKF(v != NULL, "%s: %s", path, err.message);
    gguf_close(f); // the vocabulary keeps its own copies
    return v;
}

// ggml-vocab-NAME.gguf from the shared conformance directory; NULL when shared is absent.
static tok_vocab *load_vocab(const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "conformance/tokenizer/ggml-vocab-%s.gguf", name);
    const char *p = t_shared_path(rel);
    return p ? load_vocab_path(p) : NULL;
}

static bool encode(const tok_vocab *v, const char *s, size_t n, bool add, bool parse, int32_t **ids, size_t *k) {
    psv_error err = {0};
    psv_status st = tok_encode(v, s, n, add, parse, ids, k, &err);
    CHECKF(st == PSV_OK, "encode: %s", err.message);
    return st == PSV_OK;
}

// " 1 2 3" (the .out format)
static void ids_str(const int32_t *ids, size_t n, buf_t *b) {
    b->len = 0;
    buf_reserve(b, 0);
    b->data[0] = 0;
    for (size_t i = 0; i < n; i++) buf_printf(b, " %" PRId32, ids[i]);
}

static bool decode_eq(const tok_vocab *v, const int32_t *ids, size_t n, const char *s, size_t len) {
    buf_t b = {0};
    psv_error err = {0};
    bool ok = tok_detokenize(v, ids, n, TOK_DETOK_SPECIAL | TOK_DETOK_STRIP_SPACE, &b, &err) == PSV_OK &&
              b.len == len && (len == 0 || memcmp(b.data, s, len) == 0);
    buf_free(&b);
    return ok;
}

static bool utf8_all_valid(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += utf8_decode((const uint8_t *)s + i, n - i, &cp);
        if (cp == UTF8_BAD) return false;
    }
    return true;
}

// ---- Unicode and UTF-8 -----------------------------------------------------------------------

static void test_unicode(void) {
    static const struct {
        uint32_t cp;
        uni_gc gc;
    } cases[] = {
        {'A', UNI_LU}, {'z', UNI_LL}, {'5', UNI_ND}, {' ', UNI_ZS}, {'\n', UNI_CC}, {'$', UNI_SC},
        {'~', UNI_SM}, {'_', UNI_PC}, {0xe9, UNI_LL}, {0x1c5, UNI_LT}, {0x2b0, UNI_LM},
        {0x4e2d, UNI_LO}, {0x9fff, UNI_LO}, {0x20000, UNI_LO}, {0x301, UNI_MN}, {0x903, UNI_MC},
        {0x20dd, UNI_ME}, {0x663, UNI_ND}, {0x2167, UNI_NL}, {0xbd, UNI_NO}, {0x20ac, UNI_SC},
        {0x1f600, UNI_SO}, {0xa0, UNI_ZS}, {0x2028, UNI_ZL}, {0x2029, UNI_ZP}, {0x200b, UNI_CF},
        {0xd800, UNI_CS}, {0xe000, UNI_CO}, {0x10fffd, UNI_CO}, {0x378, UNI_CN}, {0x10ffff, UNI_CN},
        {0x110000, UNI_CN}, {0xac00, UNI_LO}, {0xd7a3, UNI_LO}, {0x1e900, UNI_LU},
    };
    for (size_t i = 0; i < PSV_ARRAY_LEN(cases); i++)
        CHECKF(uni_category(cases[i].cp) == cases[i].gc, "U+%04X: category %d, expected %d", (unsigned)cases[i].cp,
               (int)uni_category(cases[i].cp), (int)cases[i].gc);
    // White_Space: exactly 25 code points (PropList.txt).
    int n_ws = 0;
    for (uint32_t cp = 0; cp < 0x110000; cp++) n_ws += uni_is_space(cp);
    CHECKF(n_ws == 25, "%d White_Space code points", n_ws);
    CHECK(uni_is_space(0x3000) && uni_is_space(0x85) && uni_is_space('\v') && !uni_is_space(0x200b) &&
          !uni_is_space(0x180e) && !uni_is_space(0x1c));
    // The ranges are sorted and start at U+0000.
    bool sorted = (uni_gc_ranges[0] >> 5) == 0;
    for (size_t i = 1; i < PSV_ARRAY_LEN(uni_gc_ranges); i++) sorted &= (uni_gc_ranges[i] >> 5) > (uni_gc_ranges[i - 1] >> 5);
    CHECK(sorted);
}

static void test_utf8(void) {
    static const struct {
        const char *s;
        size_t n, len;
        uint32_t cp;
    } cases[] = {
        {"A", 1, 1, 'A'},
        {"\xc3\xa9", 2, 2, 0xe9},
        {"\xe2\x82\xac", 3, 3, 0x20ac},
        {"\xf0\x9f\x98\x80", 4, 4, 0x1f600},
        {"\xf4\x8f\xbf\xbf", 4, 4, 0x10ffff},
        {"\xc0\x80", 2, 1, UTF8_BAD},         // overlong
        {"\xc1\xbf", 2, 1, UTF8_BAD},         // overlong
        {"\xe0\x80\x80", 3, 1, UTF8_BAD},     // overlong
        {"\xed\xa0\x80", 3, 1, UTF8_BAD},     // surrogate
        {"\xf0\x80\x80\x80", 4, 1, UTF8_BAD}, // overlong
        {"\xf4\x90\x80\x80", 4, 1, UTF8_BAD}, // above U+10FFFF
        {"\xf5\x80\x80\x80", 4, 1, UTF8_BAD},
        {"\x80", 1, 1, UTF8_BAD}, // lone continuation
        {"\xe2\x82", 2, 1, UTF8_BAD},         // truncated
        {"\xe2\x28\xa1", 3, 1, UTF8_BAD},     // bad continuation
    };
    for (size_t i = 0; i < PSV_ARRAY_LEN(cases); i++) {
        uint32_t cp;
        size_t len = utf8_decode((const uint8_t *)cases[i].s, cases[i].n, &cp);
        CHECKF(len == cases[i].len && cp == cases[i].cp, "case %zu: len %zu cp %x", i, len, (unsigned)cp);
    }
    CHECK(utf8_check((const uint8_t *)"\xe6", 1) == 0);
    CHECK(utf8_check((const uint8_t *)"\xe6\x97", 2) == 0);
    CHECK(utf8_check((const uint8_t *)"\xe6\x97\xa5", 3) == 1);
    CHECK(utf8_check((const uint8_t *)"\xe6\x41", 2) == -1);
    CHECK(utf8_check((const uint8_t *)"\xed\xa0", 2) == -1);
    CHECK(utf8_check((const uint8_t *)"\xff", 1) == -1);
    // encode/decode round trip over every scalar value
    bool ok = true;
    for (uint32_t cp = 0; cp < 0x110000 && ok; cp++) {
        if (cp >= 0xd800 && cp <= 0xdfff) continue;
        uint8_t b[4];
        uint32_t back;
        size_t k = utf8_encode(cp, b);
        ok = utf8_decode(b, k, &back) == k && back == cp;
    }
    CHECK(ok);
}

static void test_byte_map(void) {
    bool bij = true;
    uint32_t seen[324] = {0};
    for (int b = 0; b < 256; b++) {
        uint32_t cp = bpe_byte_to_cp((uint8_t)b);
        bij &= cp < 324 && !seen[cp] && bpe_cp_to_byte(cp) == b;
        if (cp < 324) seen[cp] = 1;
    }
    CHECK(bij);
    CHECK(bpe_byte_to_cp(' ') == 0x120 && bpe_byte_to_cp('\n') == 0x10a && bpe_byte_to_cp('!') == '!' &&
          bpe_byte_to_cp(0xad) == 0x143 && bpe_byte_to_cp(0xff) == 0xff && bpe_byte_to_cp(0) == 0x100);
    CHECK(bpe_cp_to_byte(0x144) == -1 && bpe_cp_to_byte(' ') == -1 && bpe_cp_to_byte(0xad) == -1);
}

// ---- pre-tokenizers --------------------------------------------------------------------------

// Pieces joined with '|' (test inputs contain no '|').
static void pretok(tok_pre pre, const char *s, buf_t *out) {
    tok_work w;
    memset(&w, 0, sizeof w);
    size_t nb = 0;
    out->len = 0;
    buf_reserve(out, 0);
    out->data[0] = 0;
    if (!pre_tokenize(&w, pre, (const uint8_t *)s, strlen(s), &nb)) {
        buf_puts(out, "<oom>");
    } else {
        for (size_t k = 0; k + 1 < nb; k++) {
            if (k) buf_putc(out, '|');
            uint32_t a = w.u.off[w.bounds[k]], b = w.u.off[w.bounds[k + 1]];
            buf_append(out, s + a, b - a);
        }
    }
    tok_work_free(&w);
}

static void test_pretokenizers(void) {
    static const struct {
        tok_pre pre;
        const char *in, *out;
    } cases[] = {
        // GPT-2: contractions lowercase only, optional single space before a run, \s+(?!\S)
        {TOK_PRE_GPT2, "Hello world's 123 !!  x", "Hello| world|'s| 123| !!| | x"},
        {TOK_PRE_GPT2, "don't we'll they've I'm she'd you're it's", "don|'t| we|'ll| they|'ve| I|'m| she|'d| you|'re| it|'s"},
        {TOK_PRE_GPT2, "I'M DON'T", "I|'|M| DON|'|T"},
        {TOK_PRE_GPT2, "a\n\nb", "a|\n|\n|b"},
        {TOK_PRE_GPT2, "x   ", "x|   "},
        {TOK_PRE_GPT2, "\tfoo", "\t|foo"},
        {TOK_PRE_GPT2, "12345", "12345"},
        {TOK_PRE_GPT2, "\xe6\x97\xa5\xe6\x9c\xac \xe3\x83\x86\xe3\x82\xb9\xe3\x83\x88", "\xe6\x97\xa5\xe6\x9c\xac| \xe3\x83\x86\xe3\x82\xb9\xe3\x83\x88"},
        {TOK_PRE_GPT2, "a\xe3\x80\x80" "b", "a|\xe3\x80\x80|b"}, // U+3000 is \s
        {TOK_PRE_GPT2, "", ""},
        // Llama 3: case-insensitive contractions, 1-3 digits, [^\r\n\p{L}\p{N}]? before letters
        {TOK_PRE_LLAMA3, "I'M DON'T don't", "I|'M| DON|'T| don|'t"},
        {TOK_PRE_LLAMA3, "12345 1234567", "123|45| |123|456|7"},
        {TOK_PRE_LLAMA3, "a\n\nb", "a|\n\n|b"},
        {TOK_PRE_LLAMA3, "a \n b", "a| \n| b"},
        {TOK_PRE_LLAMA3, "a\r\n\r\n  b", "a|\r\n\r\n| | b"},
        {TOK_PRE_LLAMA3, "!!\n\nx", "!!\n\n|x"},
        {TOK_PRE_LLAMA3, "\tfoo", "\tfoo"},
        {TOK_PRE_LLAMA3, "x   y", "x|  | y"},
        {TOK_PRE_LLAMA3, "(hello) $100 3.14", "(hello|)| $|100| |3|.|14"},
        {TOK_PRE_LLAMA3, "hello \xe4\xb8\x96\xe7\x95\x8c", "hello| \xe4\xb8\x96\xe7\x95\x8c"},
        {TOK_PRE_LLAMA3, "a\xe3\x80\x80" "b", "a|\xe3\x80\x80" "b"},
        // Qwen2: single digits
        {TOK_PRE_QWEN2, "abc12345 I'M", "abc|1|2|3|4|5| I|'M"},
        // GPT-4o: case-split words with their contraction, 1-3 digits, [\r\n/]* after punctuation
        {TOK_PRE_GPT4O, "HELLOworld helloWorld Hello's HELLO'S", "HELLOworld| hello|World| Hello's| HELLO'S"},
        {TOK_PRE_GPT4O, "\xc3\x84PFEL \xc3\x84pfel \xc3\x89lan", "\xc3\x84|PFEL| \xc3\x84pfel| \xc3\x89lan"},
        {TOK_PRE_GPT4O, "1234567", "123|456|7"},
        {TOK_PRE_GPT4O, "a/b !!/\n/x", "a|/b| !!/\n/|x"},
        {TOK_PRE_GPT4O, " (x", " (|x"},
        {TOK_PRE_GPT4O, "a\n\n b", "a|\n\n| b"},
        // StarCoder/Refact/SmolLM: every digit alone, then GPT-2
        {TOK_PRE_STARCODER, "abc123 def x=10", "abc|1|2|3| def| x|=|1|0"},
        // Falcon: punctuation runs, GPT-2, then groups of three ASCII digits
        {TOK_PRE_FALCON, "Hello, world!! 12345", "Hello|,| world|!!| |123|45"},
        {TOK_PRE_FALCON, "a+b 1234567", "a|+|b| |123|456|7"},
        // default BPE: punctuation runs, GPT-2, \p{N}+, three digits
        {TOK_PRE_DEFAULT, "Hello, world 12345", "Hello|,| world| |123|45"},
        // DeepSeek LLM: newlines, Latin/Greek/Cyrillic words, punctuation, trailing space, CJK, numbers
        {TOK_PRE_DEEPSEEK_LLM, "Hello world\n123 \xe4\xb8\xad\xe6\x96\x87", "Hello| world|\n|123| |\xe4\xb8\xad\xe6\x96\x87"},
        {TOK_PRE_DEEPSEEK_LLM, "trailing   ", "trailing|   "},
        {TOK_PRE_DEEPSEEK_LLM, "a, b!", "a|,| b|!"},
        {TOK_PRE_DEEPSEEK_LLM, "\xd0\x9f\xd1\x80\xd0\xb8 \xd0\xbc\xd0\xb8\xd1\x80", "\xd0\x9f\xd1\x80\xd0\xb8| \xd0\xbc\xd0\xb8\xd1\x80"},
        // DeepSeek Coder: letters, punctuation, CJK, single digits
        {TOK_PRE_DEEPSEEK_CODER, "foo(bar) 42", "foo|(|bar|)| |4|2"},
        {TOK_PRE_DEEPSEEK_CODER, "\xe4\xb8\xad\xe6\x96\x87" "abc", "\xe4\xb8\xad\xe6\x96\x87|abc"},
        // Invalid bytes split like U+FFFD (a symbol) and keep their bytes.
        {TOK_PRE_GPT2, "ab\xff\xfe" "cd \xc0", "ab|\xff\xfe|cd| \xc0"},
        {TOK_PRE_LLAMA3, "\xff" "abc \xe2\x82" "abc", "\xff" "abc| \xe2\x82|abc"},
    };
    buf_t got = {0};
    for (size_t i = 0; i < PSV_ARRAY_LEN(cases); i++) {
        pretok(cases[i].pre, cases[i].in, &got);
        CHECKF(strcmp(got.data, cases[i].out) == 0, "pre %d case %zu: got [%s] expected [%s]", (int)cases[i].pre, i,
               got.data, cases[i].out);
    }
    buf_free(&got);
}

// ---- conformance -----------------------------------------------------------------------------

static char *read_all(const char *path, size_t *n) {
    char *d = NULL;
    psv_error err = {0};
    if (plat_read_file(path, &d, n, &err) != PSV_OK) return NULL;
    return d;
}

// Bytes the vocabulary cannot give back: no byte-fallback token (SPM), or no normal token for
// the byte's GPT-2 character (BPE; StarCoder, for one, has none for 0xF1, so it cannot spell
// U+40000..U+7FFFF). Returns how many.
static int vocab_unspellable(const tok_vocab *v, bool bad[256]) {
    int k = 0;
    for (int b = 0; b < 256; b++) {
        if (v->kind == TOK_SPM) {
            bad[b] = v->spm_byte[b] < 0;
        } else {
            int32_t id = v->byte_sym[b];
            bad[b] = id < 0 || id >= v->n_vocab || v->attr[id] != TOK_ATTR_NORMAL;
        }
        k += bad[b];
    }
    return k;
}

static void test_tok_conformance(void) {
    const char *dir = t_shared_path("conformance/tokenizer");
    DIR *d = dir ? opendir(dir) : NULL;
    if (!d) {
        SKIP("conformance/tokenizer: ../shared is absent");
        return;
    }
    char dir_copy[4096];
    snprintf(dir_copy, sizeof dir_copy, "%s", dir);
    char *names[64];
    size_t n_names = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n_names < PSV_ARRAY_LEN(names)) {
        size_t l = strlen(e->d_name);
        if (l > 5 && !strcmp(e->d_name + l - 5, ".gguf")) names[n_names++] = strdup(e->d_name);
    }
    closedir(d);
    for (size_t i = 0; i + 1 < n_names; i++) // sorted, for a stable report
        for (size_t j = i + 1; j < n_names; j++)
            if (strcmp(names[i], names[j]) > 0) {
                char *t = names[i];
                names[i] = names[j];
                names[j] = t;
            }
    CHECKF(n_names >= 12, "%zu vocabularies", n_names);
    buf_t got = {0};
    for (size_t k = 0; k < n_names; k++) {
        char path[4600];
        snprintf(path, sizeof path, "%s/%s", dir_copy, names[k]);
        tok_vocab *v = load_vocab_path(path);
        size_t ni = 0, no = 0;
        char p2[4700];
        snprintf(p2, sizeof p2, "%s.inp", path);
        char *inp = read_all(p2, &ni);
        snprintf(p2, sizeof p2, "%s.out", path);
        char *outp = read_all(p2, &no);
        if (!v || !inp || !outp) {
            CHECKF(false, "%s: cannot load the vocabulary or its .inp/.out", names[k]);
            goto next;
        }
        // .inp: strings separated by "\n__ggml_vocab_test__\n"; .out: one line per string.
        const char *sep = "\n__ggml_vocab_test__\n";
        size_t sl = strlen(sep), n_ok = 0, n_all = 0, n_rt = 0, n_rt_ok = 0;
        char *p = inp, *o = outp;
        for (;;) {
            char *q = memmem(p, ni - (size_t)(p - inp), sep, sl);
            if (!q) break;
            char *ol = memchr(o, '\n', no - (size_t)(o - outp));
            if (!ol) {
                CHECKF(false, "%s: fewer .out lines than .inp strings", names[k]);
                break;
            }
            *ol = 0;
            int32_t *ids = NULL;
            size_t n = 0;
            n_all++;
            if (encode(v, p, (size_t)(q - p), false, false, &ids, &n)) {
                ids_str(ids, n, &got);
                if (!strcmp(got.data, o)) n_ok++;
                else fprintf(stderr, "%s: [%.*s]\n  expected:%s\n  got:     %s\n", names[k], (int)(q - p), p, o, got.data);
                // Round trip: BPE always; SPM drops the prefix space (and cannot tell ▁ from space).
                if (!(v->kind == TOK_SPM && memmem(p, (size_t)(q - p), "\xe2\x96\x81", 3))) {
                    n_rt++;
                    if (decode_eq(v, ids, n, p, (size_t)(q - p))) n_rt_ok++;
                    else fprintf(stderr, "%s: round trip failed for [%.*s]\n", names[k], (int)(q - p), p);
                }
            }
            free(ids);
            p = q + sl;
            o = ol + 1;
        }
        printf("conformance %-36s %zu/%zu ids, %zu/%zu round trips (pre %s)\n", names[k], n_ok, n_all, n_rt_ok, n_rt,
               tok_pre_name(v));
        CHECKF(n_all > 0 && n_ok == n_all, "%s: %zu of %zu match", names[k], n_ok, n_all);
        CHECKF(n_rt_ok == n_rt, "%s: %zu of %zu round trips", names[k], n_rt_ok, n_rt);
    next:
        free(inp);
        free(outp);
        tok_free(v);
        free(names[k]);
    }
    buf_free(&got);
}

// The prompt_ids of every reference case: the model's BOS rule, and in chat mode the chat
// prompt with special tokens parsed.
static void test_tok_reference_prompts(void) {
    const char *dir = t_shared_path("reference/expected");
    DIR *d = dir ? opendir(dir) : NULL;
    if (!d) {
        SKIP("reference/expected: ../shared is absent");
        return;
    }
    char dir_copy[4096];
    snprintf(dir_copy, sizeof dir_copy, "%s", dir);
    struct dirent *e;
    int n_cases = 0, n_ok = 0;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 6 || strcmp(e->d_name + l - 5, ".json")) continue;
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", dir_copy, e->d_name);
        size_t n = 0;
        char *text = read_all(path, &n);
        json_doc *doc = NULL;
        psv_error err = {0};
        if (!text || json_parse(text, n, &doc, &err) != PSV_OK) {
            CHECKF(false, "%s: %s", e->d_name, err.message);
            free(text);
            continue;
        }
        const json_value *root = json_root(doc), *cases = json_get(root, "cases");
        const char *model = json_str(json_get(root, "model"));
        char mpath[4400];
        snprintf(mpath, sizeof mpath, "%s/../%s", dir_copy, model ? model : "?"); // "models/NAME.gguf"
        tok_vocab *v = load_vocab_path(mpath);
        for (size_t i = 0; v && i < json_len(cases); i++) {
            const json_value *c = json_at(cases, i), *pr = json_get(c, "prompt"), *want = json_get(c, "prompt_ids");
            const char *mode = json_str(json_get(c, "mode"));
            if (!pr || pr->kind != JSON_STRING || !want) continue;
            int32_t *ids = NULL;
            size_t k = 0;
            n_cases++;
            if (!encode(v, pr->u.s.p, pr->u.s.n, true, mode && !strcmp(mode, "chat"), &ids, &k)) continue;
            bool same = k == json_len(want);
            for (size_t j = 0; same && j < k; j++) same = json_num(json_at(want, j)) == ids[j];
            n_ok += same;
            CHECKF(same, "%s case %zu (%s): prompt_ids differ", e->d_name, i, mode ? mode : "?");
            free(ids);
        }
        tok_free(v);
        json_doc_free(doc);
        free(text);
    }
    closedir(d);
    printf("reference prompt_ids: %d/%d\n", n_ok, n_cases);
    CHECK(n_cases > 0);
}

// ---- special tokens, BOS/EOS, end of generation -----------------------------------------------

static bool ids_eq(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof *a) == 0);
}

static void test_special(void) {
    tok_vocab *phi = load_vocab("phi-3"), *gpt = load_vocab("gpt-2"), *spm = load_vocab("llama-spm");
    if (!phi || !gpt || !spm) {
        SKIP("special tokens: ../shared is absent");
        goto done;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    // parse_special on: <|user|> is one control token; the text after a special token gets the
    // SPM space prefix again. This vocabulary is named "Phi3", so (as in llama.cpp) its special
    // tokens also eat the whitespace after them.
    const char *s = "<|user|>\nHi<|end|>";
    if (encode(phi, s, strlen(s), false, true, &ids, &n)) {
        int32_t want[] = {32010, 6324, 32007}; // <|user|> ▁Hi <|end|>
        CHECK(ids_eq(ids, n, want, 3));
        CHECK(decode_eq(phi, ids, n, "<|user|> Hi<|end|>", strlen("<|user|> Hi<|end|>")));
    }
    free(ids);
    // parse_special off: the same text is plain text.
    if (encode(phi, s, strlen(s), false, false, &ids, &n)) {
        bool none = true;
        for (size_t i = 0; i < n; i++) none &= ids[i] < 32000;
        CHECK(none && n > 5);
        CHECK(decode_eq(phi, ids, n, s, strlen(s)));
    }
    free(ids);
    // GPT-2's <|endoftext|> is control.
    s = "a<|endoftext|>b";
    if (encode(gpt, s, strlen(s), false, true, &ids, &n)) {
        int32_t want[] = {64, 50256, 65};
        CHECK(ids_eq(ids, n, want, 3));
    }
    free(ids);
    if (encode(gpt, s, strlen(s), false, false, &ids, &n)) {
        bool none = true;
        for (size_t i = 0; i < n; i++) none &= ids[i] != 50256;
        CHECK(none && decode_eq(gpt, ids, n, s, strlen(s)));
    }
    free(ids);
    // Longest match first: "<|endoftext|>" inside a longer non-token string still matches.
    s = "<<|endoftext|>>";
    if (encode(gpt, s, strlen(s), false, true, &ids, &n)) CHECK(n == 3 && ids[1] == 50256);
    free(ids);
    ids = NULL; // freed again below, where the call that would set it may not run
    // Segments: template text parsed, user content never; same ids as one string otherwise.
    tok_segment segs[3] = {{"<|user|>\n", 9, true}, {"say <|end|> please", 18, false}, {"<|end|>\n<|assistant|>\n", 22, true}};
    int32_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    psv_error err = {0};
    if (tok_encode_segments(phi, segs, 3, true, &a, &na, &err) == PSV_OK) {
        CHECK(na > 4 && a[0] == 1 && a[1] == 32010);
        int n_end = 0;
        for (size_t i = 0; i < na; i++) n_end += a[i] == 32007;
        CHECK(n_end == 1); // only the template's <|end|>
        CHECK(a[na - 2] == 32007 && a[na - 1] == 32001); // RSTRIP ate both newlines
    }
    const char *joined = "<|user|>\nsay <|end|> please<|end|>\n<|assistant|>\n";
    segs[1].parse_special = true;
    if (tok_encode_segments(phi, segs, 3, true, &b, &nb, &err) == PSV_OK && encode(phi, joined, strlen(joined), true, true, &ids, &n))
        CHECK(ids_eq(b, nb, ids, n));
    free(a);
    free(b);
    free(ids);
    // BOS/EOS from metadata: SPM adds BOS, GPT-2 adds nothing.
    if (encode(spm, "Hello", 5, true, false, &ids, &n)) {
        int32_t want[] = {1, 15043};
        CHECK(ids_eq(ids, n, want, 2));
    }
    free(ids);
    if (encode(gpt, "Hello", 5, true, false, &ids, &n)) {
        int32_t want[] = {15496};
        CHECK(ids_eq(ids, n, want, 1));
    }
    free(ids);
    // An empty text gives nothing, or just BOS.
    if (encode(spm, "", 0, true, false, &ids, &n)) CHECK(n == 1 && ids[0] == 1);
    free(ids);
    if (encode(spm, "", 0, false, false, &ids, &n)) CHECK(n == 0);
    free(ids);
    // Accessors and end of generation.
    CHECK(tok_n_vocab(phi) == 32064 && tok_bos(phi) == 1 && tok_eos(phi) == 32000 && tok_add_bos(phi) && !tok_add_eos(phi));
    CHECK(tok_is_eog(phi, 32000) && tok_is_eog(phi, 32007) && !tok_is_eog(phi, 32001) && !tok_is_eog(phi, 1));
    CHECK(tok_eot(phi) == 32007 || tok_eot(phi) == 32000);
    CHECK(tok_is_eog(gpt, 50256) && !tok_is_eog(gpt, 0) && tok_bos(gpt) == 50256 && !tok_add_bos(gpt));
    CHECK(tok_is_eog(spm, 2) && !tok_is_eog(spm, 1) && tok_unk(spm) == 0);
    CHECK(tok_find(phi, "<|assistant|>", 13) == 32001 && tok_find(phi, "<|nope|>", 8) == -1);
    CHECK(tok_is_control(phi, 32010) && !tok_is_control(phi, 100) && !tok_is_control(phi, -1));
    size_t len;
    const char *tb = tok_token_bytes(gpt, 220, &len); // "Ġ"
    CHECK(len == 1 && tb[0] == ' ');
    tb = tok_token_bytes(spm, 13, &len); // <0x0A>
    CHECK(len == 1 && tb[0] == '\n');
    tb = tok_token_bytes(spm, 15043, &len); // ▁Hello
    CHECK(len == 6 && !memcmp(tb, " Hello", 6));
    tb = tok_token_text(spm, 15043, &len);
    CHECK(len == 8 && !memcmp(tb, "\xe2\x96\x81Hello", 8));
    // Detokenizing without specials drops control tokens; out-of-range ids are an error.
    buf_t out = {0};
    int32_t seq[] = {1, 15043, 2};
    CHECK(tok_detokenize(spm, seq, 3, 0, &out, &err) == PSV_OK && out.len == 6 && !memcmp(out.data, " Hello", 6));
    out.len = 0;
    CHECK(tok_detokenize(spm, seq, 3, TOK_DETOK_SPECIAL, &out, &err) == PSV_OK && out.len == 13 &&
          !memcmp(out.data, "<s> Hello</s>", 13));
    int32_t bad[] = {5, 32000};
    psv_error e2 = {0};
    CHECK(tok_detokenize(spm, bad, 2, 0, &out, &e2) == PSV_ERR_INVALID && strstr(e2.message, "32000"));
    buf_free(&out);
done:
    tok_free(phi);
    tok_free(gpt);
    tok_free(spm);
}

// ---- property tests --------------------------------------------------------------------------

// Random text: mostly words and spaces, with Latin-1, Cyrillic, CJK, emoji, combining marks,
// odd whitespace and (when `invalid`) bytes that are not UTF-8.
static size_t random_text(char *buf, size_t cap, bool invalid, bool no_spm_space) {
    static const uint32_t pool[] = {'a', 'b', 'Z', ' ', ' ', '\n', '\t', '\r', '\'', '1', '9', '.', ',', '!', '/',
                                    0xe9, 0xc4, 0xdf, 0x430, 0x44f, 0x4e2d, 0x6587, 0x3042, 0xac00, 0x1f600,
                                    0x1f44d, 0x301, 0x200d, 0xa0, 0x3000, 0x2028, 0x85, 0x2581, 0xfffd, 0x10ffff,
                                    0x663, 0xff21, 0x1d400, 0xd7ff, 0x7f, 0x0};
    size_t n = 0, len = tok_rng_next() % 64;
    for (size_t i = 0; i < len && n + 4 <= cap; i++) {
        if (invalid && tok_rng_next() % 8 == 0) {
            buf[n++] = (char)(0x80 + tok_rng_next() % 128);
            continue;
        }
        uint32_t cp = tok_rng_next() % 3 == 0 ? 0x20 + tok_rng_next() % 0x5f : pool[tok_rng_next() % PSV_ARRAY_LEN(pool)];
        if (tok_rng_next() % 16 == 0) cp = tok_rng_next() % 0x110000;
        if (cp >= 0xd800 && cp <= 0xdfff) cp = 'x';
        if (no_spm_space && cp == 0x2581) cp = 'y';
        n += utf8_encode(cp, (uint8_t *)buf + n);
    }
    return n;
}

static void test_properties(void) {
    static const char *const names[] = {"gpt-2", "gpt-2-pre-llama-bpe", "gpt-2-pre-qwen2", "gpt-2-pre-gpt-4o",
                                        "llama-spm", "phi-3", "mpt", "starcoder", "refact", "falcon",
                                        "deepseek-llm", "deepseek-coder"};
    if (!t_shared_path("conformance/tokenizer")) {
        SKIP("property tests: ../shared is absent");
        return;
    }
    char text[512];
    for (size_t k = 0; k < PSV_ARRAY_LEN(names); k++) {
        tok_vocab *v = load_vocab(names[k]);
        if (!v) continue;
        bool bad[256];
        int n_bad = vocab_unspellable(v, bad), n_fail = 0, n_err = 0, n_checked = 0;
        for (int it = 0; it < 400; it++) {
            bool invalid = it % 2 == 1;
            size_t n = random_text(text, sizeof text, invalid, v->kind == TOK_SPM);
            int32_t *ids = NULL;
            size_t k2 = 0;
            psv_error err = {0};
            if (tok_encode(v, text, n, it % 3 == 0, it % 5 == 0, &ids, &k2, &err) != PSV_OK) {
                n_err++;
                continue;
            }
            // Round trip without special parsing and without BOS, where the vocabulary can
            // spell the bytes (it always can for valid UTF-8).
            free(ids);
            if (tok_encode(v, text, n, false, false, &ids, &k2, &err) != PSV_OK) {
                n_err++;
                continue;
            }
            bool spellable = true;
            for (size_t i = 0; i < n; i++) spellable &= !bad[(uint8_t)text[i]];
            n_checked += spellable;
            if (spellable && !decode_eq(v, ids, k2, text, n)) {
                if (n_fail++ < 3) {
                    fprintf(stderr, "%s: round trip failed for:", names[k]);
                    for (size_t i = 0; i < n; i++) fprintf(stderr, " %02x", (uint8_t)text[i]);
                    fprintf(stderr, "\n");
                }
            }
            free(ids);
        }
        CHECKF(n_err == 0, "%s: %d encode errors", names[k], n_err);
        CHECKF(n_fail == 0, "%s: %d round-trip failures", names[k], n_fail);
        CHECKF(n_checked > 200, "%s: only %d round trips checked", names[k], n_checked);
        if (!strcmp(names[k], "gpt-2") || !strcmp(names[k], "llama-spm")) CHECKF(n_bad == 0, "%s: %d unspellable bytes", names[k], n_bad);
        tok_free(v);
    }
}

// SPM word-by-word encoding (spm_words) gives exactly the whole-fragment result.
static void test_spm_words(void) {
    tok_vocab *v = load_vocab("llama-spm");
    if (!v) {
        SKIP("spm words: ../shared is absent");
        return;
    }
    CHECK(v->spm_words);
    buf_t t = {0};
    for (int i = 0; i < 3000; i++) {
        static const char *const w[] = {"the", " ", "  ", "   ", "Hello", "world", "\n", "\t", "x", "don't",
                                        "\xe2\x96\x81", "caf\xc3\xa9", "\xe6\x97\xa5\xe6\x9c\xac", "123", "!", "\xff"};
        buf_puts(&t, w[tok_rng_next() % PSV_ARRAY_LEN(w)]);
    }
    int32_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    if (encode(v, t.data, t.len, false, false, &a, &na)) {
        v->spm_words = false;
        if (encode(v, t.data, t.len, false, false, &b, &nb)) CHECK(ids_eq(a, na, b, nb));
        v->spm_words = true;
    }
    free(a);
    free(b);
    buf_free(&t);
    tok_free(v);
}

// ---- streaming decoder -----------------------------------------------------------------------

static void test_stream(void) {
    tok_stream s;
    buf_t out = {0};
    tok_stream_init(&s);
    tok_stream_put(&s, "\xe6", 1, &out);
    CHECK(out.len == 0);
    tok_stream_put(&s, "\x97", 1, &out);
    CHECK(out.len == 0);
    tok_stream_put(&s, "\xa5" "a\xf0\x9f", 4, &out);
    CHECK(out.len == 4 && !memcmp(out.data, "\xe6\x97\xa5" "a", 4));
    tok_stream_put(&s, "\x98\x80", 2, &out);
    CHECK(out.len == 8 && !memcmp(out.data + 4, "\xf0\x9f\x98\x80", 4));
    // invalid bytes go out at once, as they are
    out.len = 0;
    tok_stream_put(&s, "\xff", 1, &out);
    CHECK(out.len == 1 && (uint8_t)out.data[0] == 0xff);
    out.len = 0;
    tok_stream_put(&s, "\xe6", 1, &out);
    tok_stream_put(&s, "A", 1, &out);
    CHECK(out.len == 2 && !memcmp(out.data, "\xe6" "A", 2));
    out.len = 0;
    tok_stream_put(&s, "\xed", 1, &out); // ED A0: a surrogate, invalid from the second byte
    CHECK(out.len == 0);
    tok_stream_put(&s, "\xa0", 1, &out);
    CHECK(out.len == 2);
    // flush emits what is held
    out.len = 0;
    tok_stream_put(&s, "\xf0\x9f\x98", 3, &out);
    CHECK(out.len == 0);
    tok_stream_flush(&s, &out);
    CHECK(out.len == 3);
    // With real tokens: GPT-2 splits CJK and emoji across byte tokens; every emission is whole
    // characters and together they are the text.
    tok_vocab *v = load_vocab("gpt-2");
    if (!v) {
        SKIP("stream with tokens: ../shared is absent");
    } else {
        const char *text = "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x98\x80 \xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82 caf\xc3\xa9";
        int32_t *ids = NULL;
        size_t n = 0;
        if (encode(v, text, strlen(text), false, false, &ids, &n)) {
            buf_t all = {0};
            bool split_seen = false, whole = true;
            tok_stream_init(&s);
            for (size_t i = 0; i < n; i++) {
                size_t len;
                const char *p = tok_token_bytes(v, ids[i], &len);
                split_seen |= !utf8_all_valid(p, len);
                out.len = 0;
                tok_stream_push(&s, v, ids[i], false, &out);
                whole &= utf8_all_valid(out.data ? out.data : "", out.len);
                buf_append(&all, out.data ? out.data : "", out.len);
            }
            out.len = 0;
            tok_stream_flush(&s, &out);
            CHECK(out.len == 0);
            CHECK(split_seen && whole);
            CHECK(all.len == strlen(text) && !memcmp(all.data, text, all.len));
            buf_free(&all);
        }
        free(ids);
        tok_free(v);
    }
    // Property: random bytes in random chunks come out unchanged.
    bool same = true;
    for (int it = 0; it < 2000 && same; it++) {
        uint8_t in[64];
        size_t n = tok_rng_next() % sizeof in;
        for (size_t i = 0; i < n; i++) in[i] = (uint8_t)(tok_rng_next() % 3 ? 0x80 + tok_rng_next() % 0x78 : tok_rng_next());
        out.len = 0;
        tok_stream_init(&s);
        for (size_t i = 0; i < n;) {
            size_t k = 1 + tok_rng_next() % 4;
            if (k > n - i) k = n - i;
            size_t before = out.len;
            tok_stream_put(&s, in + i, k, &out);
            // nothing emitted ends inside a valid sequence that could still complete
            for (size_t j = before; j < out.len && same; j++) same = true;
            i += k;
        }
        tok_stream_flush(&s, &out);
        same &= out.len == n && (n == 0 || !memcmp(out.data, in, n));
    }
    CHECK(same);
    buf_free(&out);
}

// ---- errors ----------------------------------------------------------------------------------

// A small vocabulary in memory: tokens "a" "b" "ab", merge "a b".
static psv_status tiny_vocab(const char *model, const char *pre, bool with_merges, bool short_scores, tok_vocab **v,
                             psv_error *err) {
    gguf_writer *w = gguf_writer_new();
    buf_t b = {0};
    gguf_file *f = NULL;
    *v = NULL;
    static const char *const toks[] = {"a", "b", "ab"};
    static const char *const merges[] = {"a b"};
    float scores[3] = {0, 0, 1};
    int32_t types[3] = {1, 1, 1};
    if (model) gguf_w_str(w, "tokenizer.ggml.model", model);
    if (pre) gguf_w_str(w, "tokenizer.ggml.pre", pre);
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, 3);
    gguf_w_arr(w, "tokenizer.ggml.scores", GGUF_T_FLOAT32, scores, short_scores ? 2 : 3);
    gguf_w_arr(w, "tokenizer.ggml.token_type", GGUF_T_INT32, types, 3);
    if (with_merges) gguf_w_arr_str(w, "tokenizer.ggml.merges", merges, 1);
    psv_status st = gguf_writer_to_buf(w, &b, err);
    if (st == PSV_OK) st = gguf_open_mem(b.data, b.len, &f, err);
    if (st == PSV_OK) st = tok_load(f, v, err);
    gguf_close(f);
    buf_free(&b);
    gguf_writer_free(w);
    return st;
}

// Merges loaded through every stage of tok_load_merges' pipeline: 300 merges (19 batches), whose
// operands and results are mostly not tokens (each new string is added, and the string table
// grows from 16 slots several times while merges are in flight), a repeated pair (its first
// rank counts), an entry with no space, and the merge chain that builds the one long token.
static void test_merge_pipeline(void) {
    enum { N_MERGES = 300 };
    static const char *const toks[] = {"a", "b", "c", "abcabc"};
    char text[N_MERGES][32];
    const char *merges[N_MERGES];
    int k = 0;
    for (; k < N_MERGES - 6; k++) { // fillers: pairs of strings no token text contains
        snprintf(text[k], sizeof text[k], "x%d y%d", k, k);
        merges[k] = text[k];
    }
    merges[k++] = "a b";    // "ab": not a token
    merges[k++] = "nospace"; // never matches
    merges[k++] = "ab c";   // "abc": not a token
    merges[k++] = "a b";    // repeated: keeps the rank above
    merges[k++] = "abc abc"; // the token
    merges[k++] = "b c";    // "bc": ranks after "a b", so "abc" is built as ab + c
    gguf_writer *w = gguf_writer_new();
    buf_t buf = {0};
    gguf_file *f = NULL;
    tok_vocab *v = NULL;
    psv_error err = {0};
    gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, 4);
    gguf_w_arr_str(w, "tokenizer.ggml.merges", merges, N_MERGES);
    psv_status st = gguf_writer_to_buf(w, &buf, &err);
    if (st == PSV_OK) st = gguf_open_mem(buf.data, buf.len, &f, &err);
    if (st == PSV_OK) st = tok_load(f, &v, &err);
    CHECKF(st == PSV_OK, "%s", err.message);
    if (v) {
        // every filler's operands and result, and "ab", "abc", "bc" were added as strings
        CHECKF(v->n_str == 4 + 3 * (N_MERGES - 6) + 3, "n_str %d", v->n_str);
        int32_t x0 = tok_str_find(v, "x0", 2), y0 = tok_str_find(v, "y0", 2), xy = tok_str_find(v, "x0y0", 4);
        CHECK(x0 >= 4 && y0 >= 4 && xy >= 4 && tok_find(v, "x0y0", 4) == -1);
        int32_t ab = tok_str_find(v, "ab", 2), abc = tok_str_find(v, "abc", 3);
        CHECK(ab >= 4 && abc >= 4);
        size_t slot = tok_merge_slot(v, (uint64_t)(uint32_t)x0 << 32 | (uint32_t)y0);
        CHECK(v->merge[slot].rank == 0 && v->merge[slot].out == xy);
        slot = tok_merge_slot(v, (uint64_t)0 << 32 | 1); // "a b": its first rank
        CHECK(v->merge[slot].rank == N_MERGES - 6 && v->merge[slot].out == ab);
        slot = tok_merge_slot(v, (uint64_t)(uint32_t)abc << 32 | (uint32_t)abc);
        CHECK(v->merge[slot].rank == N_MERGES - 2 && v->merge[slot].out == 3);
        int32_t *ids = NULL;
        size_t n = 0;
        if (encode(v, "abcabcab", 8, false, false, &ids, &n)) {
            int32_t want[] = {3, 0, 1}; // "abcabc" through ab, abc; then "a" "b" ("ab" is no token)
            CHECKF(ids_eq(ids, n, want, 3), "got %zu ids", n);
        }
        free(ids);
        tok_free(v);
    }
    gguf_close(f);
    buf_free(&buf);
    gguf_writer_free(w);
}

static void test_tok_errors(void) {
    tok_vocab *v = NULL;
    psv_error err = {0};
    CHECK(tiny_vocab("gpt2", "bogus-pre", true, false, &v, &err) == PSV_ERR_UNSUPPORTED && !v);
    CHECKF(strstr(err.message, "'bogus-pre'") && strstr(err.message, "supported: ") &&
               strstr(err.message, "gpt-4o") && strstr(err.message, "deepseek-coder") && strstr(err.message, "qwen2"),
           "%s", err.message);
    err = (psv_error){0};
    CHECK(tiny_vocab("bert", NULL, true, false, &v, &err) == PSV_ERR_UNSUPPORTED && strstr(err.message, "'bert'"));
    err = (psv_error){0};
    CHECK(tiny_vocab(NULL, NULL, true, false, &v, &err) == PSV_ERR_FORMAT && strstr(err.message, "tokenizer.ggml.model"));
    err = (psv_error){0};
    CHECK(tiny_vocab("gpt2", "gpt-2", false, false, &v, &err) == PSV_ERR_FORMAT && strstr(err.message, "merges"));
    err = (psv_error){0};
    CHECK(tiny_vocab("llama", NULL, false, true, &v, &err) == PSV_ERR_FORMAT && strstr(err.message, "scores"));
    // The tiny vocabularies work: BPE merges "a b"; SPM merges by score. Bytes with no token
    // are dropped by BPE (as llama.cpp does) and become the unknown token in SPM.
    err = (psv_error){0};
    if (tiny_vocab("gpt2", NULL, true, false, &v, &err) == PSV_OK) {
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK(!strcmp(tok_pre_name(v), "default"));
        if (encode(v, "abba", 4, true, true, &ids, &n)) {
            int32_t want[] = {2, 1, 0};
            CHECK(ids_eq(ids, n, want, 3));
        }
        free(ids);
        if (encode(v, "a b\xff", 4, false, false, &ids, &n)) {
            int32_t want[] = {0, 1};
            CHECK(ids_eq(ids, n, want, 2));
        }
        free(ids);
        tok_free(v);
    } else {
        CHECKF(false, "%s", err.message);
    }
    err = (psv_error){0};
    if (tiny_vocab("llama", NULL, false, false, &v, &err) == PSV_OK) {
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK(tok_bos(v) == 1 && tok_eos(v) == 2 && tok_unk(v) == 0);
        if (encode(v, "ab", 2, false, false, &ids, &n)) { // "▁ab": ▁ has no token -> unk
            int32_t want[] = {0, 0, 0, 2};
            CHECK(ids_eq(ids, n, want, 4));
        }
        free(ids);
        tok_free(v);
    } else {
        CHECKF(false, "%s", err.message);
    }
}

int main(void) {
    test_unicode();
    test_utf8();
    test_byte_map();
    test_pretokenizers();
    test_stream();
    test_merge_pipeline();
    test_tok_errors();
    test_tok_conformance();
    test_tok_reference_prompts();
    test_special();
    test_spm_words();
    test_properties();
    return t_finish();
}

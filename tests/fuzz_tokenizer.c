// tests/fuzz_tokenizer.c — libFuzzer harness for the tokenizers.
// Input: byte 0 picks a vocabulary, byte 1 holds flags, byte 2 where a second segment starts;
// the rest is text. Each input is encoded with and without special-token parsing and as two
// segments, decoded whole and through the streaming decoder, and, where the vocabulary can
// spell every byte of the text, checked to round-trip exactly.
// Vocabularies: the conformance ones from $PSV_SHARED (or ../shared) when present, plus two
// small ones built in memory with the GGUF writer (so the harness works without shared).
//
//   clang -g -O1 -fsanitize=fuzzer,address,undefined -I. tests/fuzz_tokenizer.c -o fuzz_tokenizer
#define PSV_TESTING
#define PSV_NO_MAIN
#include "pensieve.c"

#define FZ_MAX_VOCABS 24

static tok_vocab *fz_vocabs[FZ_MAX_VOCABS];
static bool fz_unspellable[FZ_MAX_VOCABS][256];
static bool fz_strips[FZ_MAX_VOCABS]; // has tokens that delete whitespace next to them
static int fz_n;

static void fz_add(tok_vocab *v) {
    if (!v || fz_n == FZ_MAX_VOCABS) {
        tok_free(v);
        return;
    }
    for (int b = 0; b < 256; b++) {
        int32_t id = v->kind == TOK_SPM ? v->spm_byte[b] : v->byte_sym[b];
        fz_unspellable[fz_n][b] = id < 0 || id >= v->n_vocab || (v->kind == TOK_BPE && v->attr[id] != TOK_ATTR_NORMAL);
    }
    for (int32_t i = 0; i < v->n_vocab; i++)
        if (v->attr[i] & (TOK_ATTR_LSTRIP | TOK_ATTR_RSTRIP)) fz_strips[fz_n] = true;
    fz_vocabs[fz_n++] = v;
}

static tok_vocab *fz_build(gguf_writer *w) {
    buf_t b = {0};
    gguf_file *f = NULL;
    tok_vocab *v = NULL;
    psv_error err = {0};
    if (gguf_writer_to_buf(w, &b, &err) == PSV_OK && gguf_open_mem(b.data, b.len, &f, &err) == PSV_OK)
        tok_load(f, &v, &err);
    if (!v) fprintf(stderr, "fuzz_tokenizer: tiny vocabulary: %s\n", err.message);
    gguf_close(f);
    buf_free(&b);
    gguf_writer_free(w);
    return v;
}

// Byte-level BPE: the 256 byte characters, a few merges, a control and a user-defined token.
static tok_vocab *fz_tiny_bpe(void) {
    static char store[300][8];
    const char *toks[300];
    int32_t types[300];
    int n = 0;
    for (int b = 0; b < 256; b++) {
        uint8_t enc[4];
        size_t k = utf8_encode(bpe_byte_to_cp((uint8_t)b), enc);
        memcpy(store[n], enc, k);
        store[n][k] = 0;
        toks[n] = store[n];
        types[n++] = 1;
    }
    static const char *const extra[] = {"\xc4\xa0t", "he", "\xc4\xa0the", "in", "\xc4\xa0\xc4\xa0", "<|endoftext|>", "<tool>"};
    static const int32_t extra_type[] = {1, 1, 1, 1, 1, 3, 4};
    for (size_t i = 0; i < PSV_ARRAY_LEN(extra); i++) toks[n] = extra[i], types[n++] = extra_type[i];
    static const char *const merges[] = {"\xc4\xa0 t", "h e", "\xc4\xa0t he", "i n", "\xc4\xa0 \xc4\xa0"};
    gguf_writer *w = gguf_writer_new();
    gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_w_str(w, "tokenizer.ggml.pre", "llama-bpe");
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, (uint64_t)n);
    gguf_w_arr(w, "tokenizer.ggml.token_type", GGUF_T_INT32, types, (uint64_t)n);
    gguf_w_arr_str(w, "tokenizer.ggml.merges", merges, PSV_ARRAY_LEN(merges));
    gguf_w_u32(w, "tokenizer.ggml.bos_token_id", 261);
    gguf_w_u32(w, "tokenizer.ggml.eos_token_id", 261);
    return fz_build(w);
}

// SPM: <unk> <s> </s>, the 256 byte tokens, and a few pieces with scores.
static tok_vocab *fz_tiny_spm(void) {
    static char store[256][8];
    const char *toks[300];
    float scores[300];
    int32_t types[300];
    int n = 0;
    static const char *const head[] = {"<unk>", "<s>", "</s>"};
    static const int32_t head_type[] = {2, 3, 3};
    for (int i = 0; i < 3; i++) toks[n] = head[i], scores[n] = 0, types[n++] = head_type[i];
    for (int b = 0; b < 256; b++) {
        snprintf(store[b], sizeof store[b], "<0x%02X>", b);
        toks[n] = store[b], scores[n] = 0, types[n++] = 6;
    }
    static const char *const pieces[] = {"\xe2\x96\x81", "a", "b", "\xe2\x96\x81" "a", "ab", "\xe2\x96\x81" "ab",
                                         "\xe2\x96\x81\xe2\x96\x81", "\xe6\x97\xa5", "<user>"};
    static const float piece_score[] = {-1, -2, -2, -3, -4, -1.5f, -5, -6, 0};
    static const int32_t piece_type[] = {1, 1, 1, 1, 1, 1, 1, 1, 4};
    for (size_t i = 0; i < PSV_ARRAY_LEN(pieces); i++)
        toks[n] = pieces[i], scores[n] = piece_score[i], types[n++] = piece_type[i];
    gguf_writer *w = gguf_writer_new();
    gguf_w_str(w, "tokenizer.ggml.model", "llama");
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, (uint64_t)n);
    gguf_w_arr(w, "tokenizer.ggml.scores", GGUF_T_FLOAT32, scores, (uint64_t)n);
    gguf_w_arr(w, "tokenizer.ggml.token_type", GGUF_T_INT32, types, (uint64_t)n);
    return fz_build(w);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fz_add(fz_tiny_bpe());
    fz_add(fz_tiny_spm());
    static const char *const names[] = {"gpt-2", "gpt-2-pre-llama-bpe", "gpt-2-pre-qwen2", "gpt-2-pre-gpt-4o",
                                        "llama-spm", "phi-3", "mpt", "starcoder", "refact", "falcon",
                                        "deepseek-llm", "deepseek-coder"};
    const char *shared = getenv("PSV_SHARED");
    if (!shared || !*shared) shared = "../shared";
    for (size_t i = 0; i < PSV_ARRAY_LEN(names); i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/conformance/tokenizer/ggml-vocab-%s.gguf", shared, names[i]);
        gguf_file *f = NULL;
        tok_vocab *v = NULL;
        if (gguf_open(path, &f, NULL) == PSV_OK) tok_load(f, &v, NULL);
        gguf_close(f);
        fz_add(v);
    }
    fprintf(stderr, "fuzz_tokenizer: %d vocabularies\n", fz_n);
    return 0;
}

static void fz_fail(const char *what, const uint8_t *text, size_t n) {
    fprintf(stderr, "fuzz_tokenizer: %s for %zu bytes:", what, n);
    for (size_t i = 0; i < n && i < 256; i++) fprintf(stderr, " %02x", text[i]);
    fprintf(stderr, "\n");
    __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 3 || fz_n == 0) return 0;
    int k = data[0] % fz_n;
    tok_vocab *v = fz_vocabs[k];
    bool add = data[1] & 1, parse = data[1] & 2;
    const char *text = (const char *)data + 3;
    size_t n = size - 3, split = data[2] % (n + 1);
    int32_t *ids = NULL, *ids2 = NULL;
    size_t n_ids = 0, n_ids2 = 0;
    buf_t a = {0}, b = {0};
    psv_error err = {0};

    if (tok_encode(v, text, n, add, parse, &ids, &n_ids, &err) != PSV_OK) fz_fail(err.message, data, size);
    for (size_t i = 0; i < n_ids; i++)
        if (ids[i] < 0 || ids[i] >= tok_n_vocab(v)) fz_fail("id out of range", data, size);
    // Whole decode == streaming decode.
    unsigned fl = (data[1] & 4) ? TOK_DETOK_SPECIAL : 0;
    if (tok_detokenize(v, ids, n_ids, fl, &a, &err) != PSV_OK) fz_fail(err.message, data, size);
    tok_stream s;
    tok_stream_init(&s);
    for (size_t i = 0; i < n_ids; i++) tok_stream_push(&s, v, ids[i], fl & TOK_DETOK_SPECIAL, &b);
    tok_stream_flush(&s, &b);
    if (a.len != b.len || (a.len && memcmp(a.data, b.data, a.len))) fz_fail("stream != detokenize", data, size);
    free(ids);
    ids = NULL;

    // Two segments, both parsed or not, give the ids of the joined text.
    tok_segment seg[2] = {{text, split, parse}, {text + split, n - split, parse}};
    if (tok_encode_segments(v, seg, 2, add, &ids2, &n_ids2, &err) != PSV_OK) fz_fail(err.message, data, size);
    if (tok_encode(v, text, n, add, parse, &ids, &n_ids, &err) != PSV_OK) fz_fail(err.message, data, size);
    if (n_ids != n_ids2 || (n_ids && memcmp(ids, ids2, n_ids * sizeof *ids))) fz_fail("segments != joined", data, size);
    free(ids);
    free(ids2);
    ids = ids2 = NULL;
    seg[1].parse_special = !parse; // mixed: must simply work
    if (tok_encode_segments(v, seg, 2, add, &ids2, &n_ids2, &err) != PSV_OK) fz_fail(err.message, data, size);
    free(ids2);

    // Round trip without specials, where every byte has a token and nothing strips spaces. SPM
    // also adds its space prefix again after a user-defined token split out of the text.
    bool spellable = !fz_strips[k];
    for (size_t i = 0; i < n && spellable; i++) spellable = !fz_unspellable[k][(uint8_t)text[i]];
    if (v->kind == TOK_SPM && memmem(text, n, "\xe2\x96\x81", 3)) spellable = false; // ▁ reads back as space
    if (spellable) {
        if (tok_encode(v, text, n, false, false, &ids, &n_ids, &err) != PSV_OK) fz_fail(err.message, data, size);
        for (size_t i = 0; i < n_ids && v->kind == TOK_SPM; i++)
            if (v->attr[ids[i]] & TOK_ATTR_USER) spellable = false;
    }
    if (spellable) {
        a.len = 0;
        if (tok_detokenize(v, ids, n_ids, TOK_DETOK_SPECIAL | TOK_DETOK_STRIP_SPACE, &a, &err) != PSV_OK)
            fz_fail(err.message, data, size);
        if (a.len != n || (n && memcmp(a.data, text, n))) fz_fail("round trip", data, size);
    }
    free(ids);
    buf_free(&a);
    buf_free(&b);
    return 0;
}

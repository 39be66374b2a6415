// tests/fuzz_gguf.c — libFuzzer harness for the GGUF reader, the info report and the writer.
//
// Whatever the bytes, gguf_open_mem must return a status with a message or a file whose every
// pair and tensor can be read; a file that opens must print, and re-writing it with the writer
// must give a file that opens again with the same contents.
//
//   clang -g -O1 -fsanitize=fuzzer,address,undefined -I. tests/fuzz_gguf.c -o fuzz_gguf
//   ./fuzz_gguf -max_total_time=60 tests/corpus/fuzz_gguf
//
// The seeds in tests/corpus/fuzz_gguf/ are made by this file built without libFuzzer:
//   cc -DPSV_FUZZ_SEEDS -I. tests/fuzz_gguf.c -o mkseeds -lpthread && ./mkseeds tests/corpus/fuzz_gguf
#define PSV_TESTING
#define PSV_NO_MAIN
#include "pensieve.c"

static void fuzz_touch(const gguf_file *f) {
    volatile uint64_t sink = 0;
    for (uint64_t k = 0; k < f->n_kv; k++) {
        const gguf_kv *kv = &f->kv[k];
        char *key = str_dup(kv->key);
        if (!key) continue;
        PSV_ASSERT(gguf_find_kv(f, key) == kv);
        uint32_t u32;
        int64_t i64;
        float f32;
        bool b;
        str_t s;
        sink += gguf_get_u32(f, key, &u32) + gguf_get_i64(f, key, &i64) + gguf_get_f32(f, key, &f32) +
                gguf_get_bool(f, key, &b);
        if (gguf_get_str(f, key, &s) && s.n) sink += (uint8_t)s.p[s.n - 1];
        if (kv->type == GGUF_T_ARRAY) {
            PSV_ASSERT(gguf_get_arr(f, key, kv->arr_type) == kv);
            for (uint64_t i = 0; i < kv->arr_n; i++) {
                sink += (uint64_t)gguf_arr_int(kv, i) + (uint64_t)(gguf_arr_f32(kv, i) != 0);
                str_t e = gguf_arr_str(kv, i);
                if (e.n) sink += (uint8_t)e.p[0] + (uint8_t)e.p[e.n - 1];
            }
        }
        free(key);
    }
    for (uint64_t k = 0; k < f->n_tensors; k++) {
        const gguf_tensor *t = &f->tensors[k];
        char *name = str_dup(t->name);
        if (!name) continue;
        PSV_ASSERT(gguf_find_tensor(f, name) == t);
        PSV_ASSERT(t->size > 0 && t->data >= f->base && t->data + t->size <= f->base + f->size);
        sink += t->data[0] + t->data[t->size - 1];
        free(name);
    }
    (void)sink;
}

// Writer(reader(x)) must read back with the same pairs and tensors.
static void fuzz_rewrite(const gguf_file *f) {
    gguf_writer *w = gguf_writer_new();
    for (uint64_t k = 0; k < f->n_kv; k++) gguf_w_kv(w, &f->kv[k]);
    for (uint64_t k = 0; k < f->n_tensors; k++) {
        const gguf_tensor *t = &f->tensors[k];
        char *name = str_dup(t->name);
        if (name) gguf_w_tensor(w, name, t->type, t->n_dims, t->ne, t->data);
        free(name);
    }
    buf_t b = {0};
    psv_error err = {0};
    if (gguf_writer_to_buf(w, &b, &err) == PSV_OK) {
        gguf_file *g = NULL;
        psv_error e2 = {0};
        psv_status st = gguf_open_mem(b.data, b.len, &g, &e2);
        if (st != PSV_OK) {
            fprintf(stderr, "rewrite does not open: %s\n", e2.message);
            PSV_ASSERT(!"rewritten file must open");
        }
        PSV_ASSERT(g->n_kv == f->n_kv && g->n_tensors == f->n_tensors && g->alignment == f->alignment);
        for (uint64_t k = 0; k < f->n_kv; k++) {
            const gguf_kv *a = &f->kv[k], *c = &g->kv[k];
            PSV_ASSERT(str_eq(a->key, c->key) && a->type == c->type && a->arr_n == c->arr_n);
            if (a->type == GGUF_T_STRING) PSV_ASSERT(str_eq(a->v.s, c->v.s));
        }
        for (uint64_t k = 0; k < f->n_tensors; k++) {
            const gguf_tensor *a = &f->tensors[k], *c = &g->tensors[k];
            PSV_ASSERT(str_eq(a->name, c->name) && a->size == c->size && memcmp(a->data, c->data, a->size) == 0);
        }
        gguf_close(g);
    } else {
        // Only limits the reader does not share may refuse a file the reader accepted.
        PSV_ASSERT(err.status == PSV_ERR_NOMEM || err.status == PSV_ERR_RANGE);
    }
    buf_free(&b);
    gguf_writer_free(w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gguf_file *f = NULL;
    psv_error err = {0};
    psv_status st = gguf_open_mem(data, size, &f, &err);
    if (st != PSV_OK) {
        PSV_ASSERT(f == NULL && err.status == st && strncmp(err.message, "gguf: ", 6) == 0);
        return 0;
    }
    fuzz_touch(f);
    buf_t report = {0};
    gguf_info(f, "fuzz", &report);
    PSV_ASSERT(report.oom || strstr(report.data, "totals:"));
    buf_free(&report);
    fuzz_rewrite(f);
    gguf_close(f);
    return 0;
}

#ifdef PSV_FUZZ_SEEDS
static psv_status seed_fill(void *user, const gguf_tensor *t, gguf_sink *out, psv_error *err) {
    (void)user; (void)err;
    for (uint64_t i = 0; i < t->size; i++) {
        uint8_t v = (uint8_t)(i * 31 + 7);
        gguf_sink_write(out, &v, 1);
    }
    return PSV_OK;
}

static void seed_save(gguf_writer *w, const char *dir, const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    psv_error err = {0};
    if (gguf_writer_save(w, path, &err)) fprintf(stderr, "%s\n", err.message);
    gguf_writer_free(w);
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : ".";
    gguf_writer *w;

    w = gguf_writer_new(); // metadata only
    gguf_w_str(w, "general.architecture", "llama");
    seed_save(w, dir, "kv_only.gguf");

    w = gguf_writer_new(); // every value type
    gguf_w_u8(w, "t.u8", 200); gguf_w_i8(w, "t.i8", -3); gguf_w_u16(w, "t.u16", 600);
    gguf_w_i16(w, "t.i16", -600); gguf_w_u32(w, "t.u32", 70000); gguf_w_i32(w, "t.i32", -70000);
    gguf_w_f32(w, "t.f32", 0.5f); gguf_w_bool(w, "t.bool", true); gguf_w_u64(w, "t.u64", 1ull << 40);
    gguf_w_i64(w, "t.i64", -(1ll << 40)); gguf_w_f64(w, "t.f64", 1e300); gguf_w_str(w, "t.str", "h\xc3\xa9llo\n");
    static const int32_t ai[] = {1, -2, 3};
    static const float af[] = {0.25f, -1.0f};
    static const bool ab[] = {true, false};
    static const uint64_t au[] = {1, 2};
    static const char *const as[] = {"a", "", "\xe2\x96\x81x"};
    gguf_w_arr(w, "a.i32", GGUF_T_INT32, ai, 3); gguf_w_arr(w, "a.f32", GGUF_T_FLOAT32, af, 2);
    gguf_w_arr(w, "a.bool", GGUF_T_BOOL, ab, 2); gguf_w_arr(w, "a.u64", GGUF_T_UINT64, au, 2);
    gguf_w_arr_str(w, "a.str", as, 3);
    gguf_w_tensor_fn(w, "t", T_F32, 1, (uint64_t[]){4}, seed_fill, NULL);
    seed_save(w, dir, "all_types.gguf");

    w = gguf_writer_new(); // a tiny llama-shaped model
    static const char *const toks[] = {"<unk>", "<s>", "</s>", "<0x0A>", "\xe2\x96\x81", "a", "b", "\xe2\x96\x81" "ab"};
    static const float scores[] = {0, 0, 0, 0, -1, -2, -3, -4};
    static const int32_t types[] = {2, 3, 3, 6, 1, 1, 1, 1};
    gguf_w_str(w, "general.architecture", "llama");
    gguf_w_u32(w, "llama.embedding_length", 32); gguf_w_u32(w, "llama.block_count", 1);
    gguf_w_u32(w, "llama.attention.head_count", 2); gguf_w_u32(w, "llama.attention.head_count_kv", 1);
    gguf_w_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f); gguf_w_f32(w, "llama.rope.freq_base", 10000.0f);
    gguf_w_str(w, "tokenizer.ggml.model", "llama");
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, 8);
    gguf_w_arr(w, "tokenizer.ggml.scores", GGUF_T_FLOAT32, scores, 8);
    gguf_w_arr(w, "tokenizer.ggml.token_type", GGUF_T_INT32, types, 8);
    gguf_w_u32(w, "tokenizer.ggml.bos_token_id", 1); gguf_w_bool(w, "tokenizer.ggml.add_bos_token", true);
    gguf_w_tensor_fn(w, "token_embd.weight", T_Q4_0, 2, (uint64_t[]){32, 8}, seed_fill, NULL);
    gguf_w_tensor_fn(w, "output_norm.weight", T_F32, 1, (uint64_t[]){32}, seed_fill, NULL);
    gguf_w_tensor_fn(w, "blk.0.attn_q.weight", T_Q8_0, 2, (uint64_t[]){32, 32}, seed_fill, NULL);
    gguf_w_tensor_fn(w, "blk.0.ffn_up.weight", T_Q4_K, 2, (uint64_t[]){256, 2}, seed_fill, NULL);
    gguf_w_tensor_fn(w, "blk.0.ffn_down.weight", T_F16, 3, (uint64_t[]){2, 3, 4}, seed_fill, NULL);
    seed_save(w, dir, "tiny_llama.gguf");

    w = gguf_writer_new(); // non-default alignment, 4-d tensor
    gguf_w_alignment(w, 8);
    gguf_w_str(w, "tokenizer.chat_template", "{% for m in messages %}{{ m['content'] }}{% endfor %}");
    gguf_w_tensor_fn(w, "a", T_BF16, 4, (uint64_t[]){2, 2, 2, 2}, seed_fill, NULL);
    gguf_w_tensor_fn(w, "b", T_Q6_K, 1, (uint64_t[]){256}, seed_fill, NULL);
    seed_save(w, dir, "align8.gguf");
    return 0;
}
#endif

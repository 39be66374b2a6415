// tests/test_tools.c — section 17: the model generator's vocabulary, type rules and blocks, the
// models it writes (every architecture loads and computes finite logits, same seed → same
// bytes), and the bench helpers. Never times anything.
#define PSV_TESTING
#define PSV_NO_MAIN
#include "pensieve.c"
#include "test.h"

static char t_dir[256];

// A path in the test directory; four rotating buffers, so two may be used at once.
static const char *t_path(const char *name) {
    static char p[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", t_dir, name);
    return p[k];
}

// A tiny shape of `arch`, finished (derived fields filled).
static mk_shape t_shape(model_arch arch, int64_t vocab) {
    mk_shape s;
    memset(&s, 0, sizeof s);
    s.arch = arch;
    mk_arch_defaults(&s);
    s.n_embd = 256, s.n_layer = 2, s.n_head = 4, s.n_head_kv = 2, s.n_ff = 512, s.n_vocab = vocab;
    psv_error err = {0};
    CHECKF(mk_shape_finish(&s, &err) == PSV_OK, "%s", err.message);
    return s;
}

static int t_ftype(const char *name) {
    for (size_t k = 0; k < PSV_ARRAY_LEN(mk_ftypes); k++)
        if (!strcmp(mk_ftypes[k].name, name)) return (int)k;
    return -1;
}

static bool t_files_equal(const char *a, const char *b) {
    char *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    bool eq = plat_read_file(a, &x, &nx, NULL) == PSV_OK && plat_read_file(b, &y, &ny, NULL) == PSV_OK && nx == ny &&
              memcmp(x, y, nx) == 0;
    free(x);
    free(y);
    return eq;
}

// The vocabulary: unique tokens, merges over earlier tokens, bounded lengths, seeded.
static void test_vocab(void) {
    mk_vocab v, w;
    psv_error err = {0};
    CHECK(mk_vocab_build(&v, 3000, 7, &err) == PSV_OK);
    CHECK(v.n_regular == 3000);
    bool ok_ops = true, ok_len = true, ok_cat = true;
    for (int32_t id = 256; id < v.n_regular; id++) {
        int32_t l = v.ml[id - 256], r = v.mr[id - 256];
        ok_ops = ok_ops && l >= 0 && r >= 0 && l < id && r < id;
        size_t n, ln, rn;
        const char *s = mk_tok_raw(&v, id, &n), *ls = mk_tok_raw(&v, l, &ln), *rs = mk_tok_raw(&v, r, &rn);
        ok_len = ok_len && n >= 2 && n <= MK_TOKEN_MAX;
        ok_cat = ok_cat && n == ln + rn && !memcmp(s, ls, ln) && !memcmp(s + ln, rs, rn);
    }
    CHECK(ok_ops);
    CHECK(ok_len);
    CHECK(ok_cat);
    int dups = 0;
    for (int32_t id = 0; id < v.n_regular; id++) {
        size_t n;
        const char *s = mk_tok_raw(&v, id, &n);
        if (v.tab[mk_vocab_slot(&v, s, n)] != id) dups++;
    }
    CHECK(dups == 0);
    CHECK(mk_vocab_build(&w, 3000, 7, &err) == PSV_OK);
    CHECK(w.raw.len == v.raw.len && !memcmp(w.raw.data, v.raw.data, v.raw.len));
    mk_vocab_free(&w);
    CHECK(mk_vocab_build(&w, 3000, 8, &err) == PSV_OK);
    CHECK(w.raw.len != v.raw.len || memcmp(w.raw.data, v.raw.data, v.raw.len) != 0);
    mk_vocab_free(&w);
    mk_vocab_free(&v);
    mk_vocab_free(NULL);
}

// The tokenizer section loads in section 9 for every family: byte tokens, specials as control
// tokens, BOS/EOS/EOT, round trips, and (llama-bpe ignores merges for whole words) every merged
// token encodes to itself.
static void test_tokenizer(void) {
    static const model_arch archs[] = {ARCH_LLAMA, ARCH_PHI3, ARCH_QWEN2, ARCH_QWEN3, ARCH_PHI2};
    for (size_t a = 0; a < PSV_ARRAY_LEN(archs); a++) {
        mk_shape s = t_shape(archs[a], 2000);
        mk_tok_family fam = mk_family(archs[a]);
        psv_error err = {0};
        gguf_writer *w = gguf_writer_new();
        buf_t b = {0};
        gguf_file *f = NULL;
        tok_vocab *v = NULL;
        CHECKF(mk_write_tokenizer(w, &s, 3, &err) == PSV_OK, "%s", err.message);
        CHECKF(gguf_writer_to_buf(w, &b, &err) == PSV_OK, "%s", err.message);
        CHECKF(gguf_open_mem(b.data, b.len, &f, &err) == PSV_OK, "%s", err.message);
        if (f) CHECKF(tok_load(f, &v, &err) == PSV_OK, "%s: %s", model_arch_names[archs[a]], err.message);
        if (v) {
            int32_t n_reg = 2000 - fam.n_special;
            CHECK(tok_n_vocab(v) == 2000);
            CHECK(tok_bos(v) == n_reg + fam.bos);
            CHECK(tok_eos(v) == n_reg + fam.eos);
            CHECK(tok_add_bos(v) == fam.add_bos);
            CHECK(!strcmp(tok_pre_name(v), fam.pre));
            for (int i = 0; i < fam.n_special; i++) {
                CHECK(tok_find_c(v, fam.special[i]) == n_reg + i);
                if (fam.special_type[i] == 3) CHECK(tok_is_control(v, n_reg + i));
            }
            CHECK(tok_is_eog(v, n_reg + fam.eot));
            static const char *const texts[] = {"Hello world, the quick brown fox jumps over the lazy dog.",
                                                "caf\xc3\xa9 \xe2\x82\xac 12345 \n\t tabs  and   spaces",
                                                "\xf0\x9f\x98\x80 emoji and \xff invalid bytes"};
            for (size_t k = 0; k < PSV_ARRAY_LEN(texts); k++) {
                int32_t *ids = NULL;
                size_t n = 0;
                buf_t out = {0};
                CHECK(tok_encode(v, texts[k], strlen(texts[k]), false, false, &ids, &n, &err) == PSV_OK);
                CHECK(tok_detokenize(v, ids, n, 0, &out, &err) == PSV_OK);
                CHECKF(out.len == strlen(texts[k]) && !memcmp(out.data, texts[k], out.len), "round trip %zu", k);
                buf_free(&out);
                free(ids);
            }
            // control tokens are recognised in text only with parse_special
            char txt[64];
            snprintf(txt, sizeof txt, "%shi", fam.special[fam.eot]);
            int32_t *ids = NULL;
            size_t n = 0;
            CHECK(tok_encode(v, txt, strlen(txt), false, true, &ids, &n, &err) == PSV_OK && n >= 2 &&
                  ids[0] == n_reg + fam.eot);
            free(ids);
            if (archs[a] == ARCH_LLAMA) {
                int bad = 0;
                for (int32_t id = 256; id < n_reg; id++) {
                    size_t len;
                    const char *p = tok_token_bytes(v, id, &len);
                    ids = NULL;
                    if (tok_encode(v, p, len, false, false, &ids, &n, &err) != PSV_OK || n != 1 || ids[0] != id) bad++;
                    free(ids);
                }
                CHECKF(bad == 0, "%d merged tokens do not encode to themselves", bad);
            }
        }
        tok_free(v);
        gguf_close(f);
        buf_free(&b);
        gguf_writer_free(w);
    }
}

// The type rules: output/tied embeddings, the _M and _S mixes, fallbacks, --pure.
static void test_types(void) {
    int km = t_ftype("Q4_K_M"), ks = t_ftype("Q4_K_S"), q40 = t_ftype("Q4_0"), f16 = t_ftype("F16"), q80 = t_ftype("Q8_0");
    CHECK(km >= 0 && ks >= 0 && q40 >= 0 && f16 >= 0 && q80 >= 0);
    // use_more_bits over 32 layers: the first and last 4, and layers 6, 9, ..., 27
    int n_more = 0;
    for (int i = 0; i < 32; i++) n_more += mk_more_bits(i, 32);
    CHECK(mk_more_bits(0, 32) && mk_more_bits(3, 32) && !mk_more_bits(4, 32) && !mk_more_bits(5, 32));
    CHECK(mk_more_bits(6, 32) && mk_more_bits(27, 32) && mk_more_bits(28, 32) && mk_more_bits(31, 32));
    CHECK(n_more == 16);
    // the reference file phi4mini-q4km has exactly this for 2 layers: layer 0 Q4_K, layer 1 Q6_K
    CHECK(mk_pick_type(km, false, true, MK_ROLE_ATTN_V, 0, 2, 256) == T_Q4_K);
    CHECK(mk_pick_type(km, false, true, MK_ROLE_ATTN_V, 1, 2, 256) == T_Q6_K);
    CHECK(mk_pick_type(km, false, true, MK_ROLE_FFN_DOWN, 1, 2, 512) == T_Q6_K);
    CHECK(mk_pick_type(km, false, true, MK_ROLE_EMBD, 0, 2, 256) == T_Q6_K);   // tied: it is the output
    CHECK(mk_pick_type(km, false, false, MK_ROLE_EMBD, 0, 2, 256) == T_Q4_K);  // untied
    CHECK(mk_pick_type(km, false, false, MK_ROLE_OUTPUT, 0, 2, 256) == T_Q6_K);
    CHECK(mk_pick_type(km, false, false, MK_ROLE_OUTPUT, 0, 2, 896) == T_Q8_0); // not whole 256-blocks
    CHECK(mk_pick_type(km, false, false, MK_ROLE_OTHER, 1, 2, 256) == T_Q4_K);
    CHECK(mk_pick_type(ks, false, false, MK_ROLE_FFN_DOWN, 0, 16, 256) == T_Q5_K);
    CHECK(mk_pick_type(ks, false, false, MK_ROLE_FFN_DOWN, 2, 16, 256) == T_Q4_K);
    CHECK(mk_pick_type(q40, false, true, MK_ROLE_EMBD, 0, 2, 896) == T_Q8_0);  // qwen2-0.5b Q4_0
    CHECK(mk_pick_type(q40, false, false, MK_ROLE_OUTPUT, 0, 2, 2048) == T_Q6_K);
    CHECK(mk_pick_type(q40, true, false, MK_ROLE_OUTPUT, 0, 2, 2048) == T_Q4_0); // --pure
    CHECK(mk_pick_type(q80, false, false, MK_ROLE_OUTPUT, 0, 2, 2048) == T_Q8_0);
    CHECK(mk_pick_type(f16, false, false, MK_ROLE_OUTPUT, 0, 2, 2048) == T_F16);
    static const struct { uint32_t t; uint64_t row; uint32_t want; } fb[] = {
        {T_Q4_K, 896, T_Q5_0}, {T_Q5_K, 896, T_Q5_1}, {T_Q6_K, 896, T_Q8_0}, {T_Q2_K, 896, T_Q4_0},
        {T_Q3_K, 896, T_Q4_0}, {T_Q4_K, 4864, T_Q4_K}, {T_Q4_0, 896, T_Q4_0}, {T_Q4_0, 48, T_F16},
        {T_Q4_K, 48, T_F16},   {T_F32, 7, T_F32},      {T_BF16, 3, T_BF16},
    };
    for (size_t i = 0; i < PSV_ARRAY_LEN(fb); i++)
        CHECKF(mk_fallback_type(fb[i].t, fb[i].row) == fb[i].want, "fallback %zu", i);
}

// Random blocks dequantize to finite, small values for every type; Q8_0 never holds -128.
static void test_blocks(void) {
    static const uint32_t types[] = {T_F32, T_F16, T_BF16, T_Q4_0, T_Q4_1, T_Q5_0, T_Q5_1, T_Q8_0,
                                     T_Q2_K, T_Q3_K, T_Q4_K, T_Q5_K, T_Q6_K};
    mk_state st = {.seed = 11};
    psv_error err = {0};
    for (size_t i = 0; i < PSV_ARRAY_LEN(types); i++) {
        uint32_t t = types[i];
        const type_info *ti = type_get(t);
        const uint8_t *pool = mk_is_float(t) ? NULL : mk_pool(&st, t, &err);
        CHECK(mk_is_float(t) || pool);
        size_t nb = 64, nv = nb * ti->blck_size;
        uint8_t *blk = malloc(nb * ti->type_size);
        float *y = malloc(nv * sizeof *y);
        uint64_t rng = 5;
        mk_blocks(pool, t, blk, nb, &rng);
        k_traits_ref(t)->to_float(blk, y, (int64_t)nv);
        double ss = 0, amax = 0;
        bool finite = true;
        for (size_t k = 0; k < nv; k++) {
            finite = finite && psv_isfinite(y[k]);
            ss += (double)y[k] * y[k];
            if (psv_fabsf(y[k]) > amax) amax = psv_fabsf(y[k]);
        }
        double rms = psv_sqrt(ss / (double)nv);
        CHECKF(finite && amax < 0.5 && rms > 0.002 && rms < 0.1, "%s: rms %g max %g", ti->name, rms, amax);
        if (t == T_Q8_0) {
            int m128 = 0;
            for (size_t b = 0; b < nb; b++)
                for (size_t k = 2; k < 34; k++) m128 += blk[b * 34 + k] == 0x80;
            CHECK(m128 == 0);
        }
        // the stream differs from block to block
        CHECK(memcmp(blk, blk + ti->type_size, ti->type_size) != 0);
        free(y);
        free(blk);
    }
    mk_state_free(&st);
    mk_state_free(NULL);
}

// Bad shapes are refused with a reason.
static void test_shapes(void) {
    mk_shape s = t_shape(ARCH_LLAMA, 512);
    CHECK(s.head_dim == 64 && s.n_rot == 64);
    mk_shape p = t_shape(ARCH_PHI2, 512);
    CHECK(p.n_rot == 24); // 40 % of 64, even
    psv_error err = {0};
    s.n_head_kv = 3, s.head_dim = 0, s.n_rot = 0;
    CHECK(mk_shape_finish(&s, &err) == PSV_ERR_INVALID && strstr(err.message, "kv-heads"));
    s = t_shape(ARCH_LLAMA, 512);
    s.n_embd = 250, s.head_dim = 0, s.n_rot = 0;
    err = (psv_error){0};
    CHECK(mk_shape_finish(&s, &err) == PSV_ERR_INVALID && strstr(err.message, "--head-dim"));
    s = t_shape(ARCH_LLAMA, 512);
    s.n_vocab = 260;
    err = (psv_error){0};
    CHECK(mk_shape_finish(&s, &err) == PSV_ERR_INVALID && strstr(err.message, "too small"));
    s = t_shape(ARCH_LLAMA, 512);
    s.n_rot = 63;
    err = (psv_error){0};
    CHECK(mk_shape_finish(&s, &err) == PSV_ERR_INVALID);
    s = t_shape(ARCH_LLAMA, 512);
    s.n_ctx_orig = 1024;
    err = (psv_error){0};
    CHECK(mk_shape_finish(&s, &err) == PSV_ERR_INVALID && strstr(err.message, "phi3"));
    s = t_shape(ARCH_PHI3, 512);
    s.n_ctx_orig = 8192;
    err = (psv_error){0};
    CHECK(mk_shape_finish(&s, &err) == PSV_ERR_INVALID);
}

// Whole models: every architecture with several types loads, has the expected tensors, and
// computes finite logits; the same seed gives the same file.
static void test_models(void) {
    static const model_arch archs[] = {ARCH_LLAMA, ARCH_PHI3, ARCH_QWEN2, ARCH_QWEN3, ARCH_PHI2};
    static const char *const types[] = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                                        "Q2_K", "Q3_K", "Q4_K_M", "Q5_K_S", "Q6_K"};
    for (size_t a = 0; a < PSV_ARRAY_LEN(archs); a++)
        for (size_t k = 0; k < PSV_ARRAY_LEN(types); k++) {
            if (a > 0 && k % 3 != a % 3) continue; // llama with every type, the others with a third
            mk_config c;
            memset(&c, 0, sizeof c);
            c.s = t_shape(archs[a], 600);
            c.s.tied = k % 2;
            c.ftype = t_ftype(types[k]);
            c.seed = 42;
            mk_report rep;
            psv_error err = {0};
            const char *path = t_path("m.gguf");
            CHECKF(mk_write(&c, path, &rep, &err) == PSV_OK, "%s", err.message);
            psv_model *m = NULL;
            psv_ctx *ctx = NULL;
            psv_model_params mp = psv_model_default_params();
            mp.n_threads = 2;
            psv_ctx_params cp = psv_ctx_default_params();
            cp.n_ctx = 64;
            if (psv_model_open(path, &mp, &m, &err) != PSV_OK || psv_ctx_new(m, &cp, &ctx, &err) != PSV_OK) {
                CHECKF(false, "%s %s: %s", model_arch_names[archs[a]], types[k], err.message);
                psv_model_close(m);
                continue;
            }
            CHECK(!strcmp(psv_model_arch(m), model_arch_names[archs[a]]));
            CHECK(psv_model_n_vocab(m) == 600);
            CHECK((m->output.data == m->tok_embd.data) == c.s.tied);
            CHECK(archs[a] != ARCH_PHI3 || (m->rope_long && m->rope_short && m->rope_long[m->n_rot / 2 - 1] > 1.0f));
            CHECK(archs[a] != ARCH_QWEN2 || m->layers[1].bq != NULL);
            CHECK(archs[a] != ARCH_QWEN3 || m->layers[1].q_norm != NULL);
            uint64_t total = 0;
            for (uint64_t i = 0; i < m->gguf->n_tensors; i++) total += m->gguf->tensors[i].size;
            CHECK(total == rep.bytes);
            int32_t ids[8] = {1, 2, 3, 300, 599, 5, 256, 7};
            float *all = malloc(8 * 600 * sizeof *all);
            CHECKF(psv_eval_all_logits(ctx, ids, 8, all, &err) == PSV_OK, "%s", err.message);
            bool finite = true, varied = false;
            for (int i = 0; i < 8 * 600; i++) {
                finite = finite && psv_isfinite(all[i]);
                varied = varied || all[i] != all[0];
            }
            CHECKF(finite && varied, "%s %s: logits", model_arch_names[archs[a]], types[k]);
            const char *warning = NULL;
            psv_model_chat_format(m, &warning);
            CHECKF(warning == NULL, "%s: chat template not recognised", model_arch_names[archs[a]]);
            free(all);
            psv_ctx_free(ctx);
            psv_model_close(m);
        }
    // determinism
    mk_config c;
    memset(&c, 0, sizeof c);
    c.s = t_shape(ARCH_PHI3, 600);
    c.ftype = t_ftype("Q4_K_M");
    c.seed = 9;
    mk_report rep;
    psv_error err = {0};
    CHECK(mk_write(&c, t_path("a.gguf"), &rep, &err) == PSV_OK);
    CHECK(mk_write(&c, t_path("b.gguf"), &rep, &err) == PSV_OK);
    CHECK(t_files_equal(t_path("a.gguf"), t_path("b.gguf")));
    c.seed = 10;
    CHECK(mk_write(&c, t_path("b.gguf"), &rep, &err) == PSV_OK);
    CHECK(!t_files_equal(t_path("a.gguf"), t_path("b.gguf")));
    // LongRoPE attention factor of the phi4-mini shape: sqrt(1 + ln 32 / ln 4096)
    c.s.n_ctx = 131072, c.s.n_ctx_orig = 4096;
    CHECK(mk_write(&c, t_path("a.gguf"), &rep, &err) == PSV_OK);
    gguf_file *f = NULL;
    float af = 0;
    uint32_t orig = 0;
    CHECK(gguf_open(t_path("a.gguf"), &f, &err) == PSV_OK);
    CHECK(f && gguf_get_f32(f, "phi3.rope.scaling.attn_factor", &af) && af > 1.19023f && af < 1.19025f);
    CHECK(f && gguf_get_u32(f, "phi3.rope.scaling.original_context_length", &orig) && orig == 4096);
    gguf_close(f);
    // an unwritable path is an I/O error, and no file is left behind
    err = (psv_error){0};
    CHECK(mk_write(&c, "/nonexistent-dir/x.gguf", &rep, &err) == PSV_ERR_IO && strstr(err.message, "nonexistent-dir"));
    remove(t_path("a.gguf"));
    remove(t_path("b.gguf"));
    remove(t_path("m.gguf"));
}

static void test_presets(void) {
    for (size_t i = 0; i < PSV_ARRAY_LEN(mk_presets); i++) {
        mk_shape s = mk_presets[i].s;
        psv_error err = {0};
        CHECKF(mk_shape_finish(&s, &err) == PSV_OK, "%s: %s", mk_presets[i].name, err.message);
        if (!strcmp(mk_presets[i].name, "phi4-mini")) CHECK(s.head_dim == 128 && s.n_rot == 96 && s.tied);
        if (!strcmp(mk_presets[i].name, "qwen3-0.6b")) CHECK(s.head_dim == 128 && s.n_rot == 128);
        if (!strcmp(mk_presets[i].name, "qwen2-0.5b")) CHECK(s.head_dim == 64 && s.n_embd % QK_K != 0);
    }
}

static void test_bench_helpers(void) {
    int64_t v[4];
    int n;
    CHECK(tools_parse_list("1,2,16", 1, 64, v, 4, &n) && n == 3 && v[0] == 1 && v[2] == 16);
    CHECK(tools_parse_list("0", 0, 64, v, 4, &n) && n == 1 && v[0] == 0);
    CHECK(!tools_parse_list("1,,2", 1, 64, v, 4, &n));
    CHECK(!tools_parse_list("1,", 1, 64, v, 4, &n));
    CHECK(!tools_parse_list("", 1, 64, v, 4, &n));
    CHECK(!tools_parse_list("1,2,3,4,5", 1, 64, v, 4, &n));
    CHECK(!tools_parse_list("65", 1, 64, v, 4, &n));
    CHECK(!tools_parse_list("x", 1, 64, v, 4, &n));
    CHECK(tools_ieq("q4_k_m", "Q4_K_M") && !tools_ieq("Q4_K", "Q4_K_M"));
    double secs[3] = {1.0, 0.5, 0.25};
    bench_test t = {.n = 10, .seqs = 1, .reps = 3, .secs = secs};
    bench_stats(&t); // 10, 20, 40 tokens/s
    CHECK(t.tps_mean > 23.333 && t.tps_mean < 23.334);
    CHECK(t.tps_sd > 15.275 && t.tps_sd < 15.276);
    t.seqs = 4; // 10 tokens of each of 4 sequences: 40, 80, 160 tokens/s
    bench_stats(&t);
    CHECK(t.tps_mean > 93.333 && t.tps_mean < 93.334);
    CHECK(t.tps_sd > 61.101 && t.tps_sd < 61.102);
    t.seqs = 1;
    t.reps = 1;
    bench_stats(&t);
    CHECK(t.tps_mean == 10.0 && t.tps_sd == 0.0);
#if defined(__linux__)
    CHECK(bench_peak_rss() > 0);
#else
    SKIP("bench_peak_rss: /proc/self/status is Linux only");
#endif
    char b[32];
    CHECK(!strcmp(tools_bytes(b, 512), "512 B") && !strcmp(tools_bytes(b, 1536), "1.50 KiB"));
    CHECK(!strcmp(tools_count(b, 3.836e9), "3.84 B") && !strcmp(tools_count(b, 494e6), "494.00 M"));
}

int main(void) {
    snprintf(t_dir, sizeof t_dir, "/tmp/psv_test_tools_%d", (int)getpid());
    mkdir(t_dir, 0700);
    test_vocab();
    test_tokenizer();
    test_types();
    test_blocks();
    test_shapes();
    test_presets();
    test_models();
    test_bench_helpers();
    rmdir(t_dir);
    return t_finish();
}

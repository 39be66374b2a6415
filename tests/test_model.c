// tests/test_model.c — model loading and the forward pass on small models this test writes
// itself (no ../shared needed): logits against a plain double-precision transformer written
// here from the architectures' definitions, agreement across thread counts and batching, the
// KV cache and context limits, and a specific error for each kind of bad model file.
#define PSV_TESTING
#define PSV_NO_MAIN
#include "pensieve.c"
#include "test.h"
#include <math.h>

enum { E = 256, NL = 2, NH = 4, NKV = 2, HD = E / NH, FF = 256, NV = 96 };

typedef struct {
    const char *arch;  // "llama", "qwen2", "phi3"
    int n_rot;         // rotary dims per head
    bool drop_tensor;  // leave out blk.1.ffn_down.weight
    bool bad_shape;    // attn_q with the wrong output width
    bool bad_type;     // ffn_down as IQ2_XXS
    bool no_blocks;    // leave out {arch}.block_count
    int kv_heads;      // head_count_kv
    size_t pad;        // a metadata string of this many bytes (test.padding)
} model_spec;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float frand(void) { // uniform in [-1, 1)
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) * (2.0 / 16777216.0) - 1.0);
}

// Weights kept in float for the reference computation, by name.
typedef struct { char name[64]; int64_t n; float *v; } wrec;
static wrec W[64];
static int n_w;

static const float *wget(const char *name) {
    for (int i = 0; i < n_w; i++)
        if (!strcmp(W[i].name, name)) return W[i].v;
    return NULL;
}

static void add_f32(gguf_writer *w, const char *name, int64_t ne0, int64_t ne1, float scale, float bias) {
    int64_t n = ne0 * ne1;
    float *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = bias + scale * frand();
    snprintf(W[n_w].name, sizeof W[n_w].name, "%s", name);
    W[n_w].n = n;
    W[n_w].v = v;
    n_w++;
    uint64_t ne[2] = {(uint64_t)ne0, (uint64_t)ne1};
    gguf_w_tensor(w, name, T_F32, ne1 > 1 ? 2 : 1, ne, v);
}

static void free_weights(void) {
    for (int i = 0; i < n_w; i++) free(W[i].v);
    n_w = 0;
}

// Write a tiny model to path; weights are F32 so the engine's products are exact-ish float dots.
static bool write_model(const char *path, const model_spec *sp) {
    free_weights();
    rng_state = 0x9e3779b97f4a7c15ull;
    gguf_writer *w = gguf_writer_new();
    char key[128];
    int nkv = sp->kv_heads ? sp->kv_heads : NKV;
    gguf_w_str(w, "general.architecture", sp->arch);
    if (sp->pad) {
        char *pad = malloc(sp->pad);
        for (size_t i = 0; i < sp->pad; i++) pad[i] = (char)('a' + i % 26);
        gguf_w_strn(w, "test.padding", pad, sp->pad);
        free(pad);
    }
#define KEY(s) (snprintf(key, sizeof key, "%s." s, sp->arch), key)
    gguf_w_u32(w, KEY("context_length"), 64);
    gguf_w_u32(w, KEY("embedding_length"), E);
    if (!sp->no_blocks) gguf_w_u32(w, KEY("block_count"), NL);
    gguf_w_u32(w, KEY("feed_forward_length"), FF);
    gguf_w_u32(w, KEY("attention.head_count"), NH);
    gguf_w_u32(w, KEY("attention.head_count_kv"), (uint32_t)nkv);
    gguf_w_u32(w, KEY("rope.dimension_count"), (uint32_t)sp->n_rot);
    gguf_w_f32(w, KEY("rope.freq_base"), 10000.0f);
    gguf_w_f32(w, KEY("attention.layer_norm_rms_epsilon"), 1e-5f);
#undef KEY
    bool phi3 = !strcmp(sp->arch, "phi3"), qwen2 = !strcmp(sp->arch, "qwen2");
    add_f32(w, "token_embd.weight", E, NV, 1.0f, 0);
    add_f32(w, "output_norm.weight", E, 1, 0.2f, 1.0f);
    if (!phi3) add_f32(w, "output.weight", E, NV, 0.1f, 0); // phi3: tied to token_embd
    char nm[64];
    for (int il = 0; il < NL; il++) {
#define N(s) (snprintf(nm, sizeof nm, "blk.%d." s, il), nm)
        add_f32(w, N("attn_norm.weight"), E, 1, 0.2f, 1.0f);
        if (phi3) {
            add_f32(w, N("attn_qkv.weight"), E, (NH + 2 * nkv) * HD, 0.08f, 0);
        } else {
            add_f32(w, N("attn_q.weight"), E, sp->bad_shape ? NH * HD / 2 : NH * HD, 0.08f, 0);
            add_f32(w, N("attn_k.weight"), E, nkv * HD, 0.08f, 0);
            add_f32(w, N("attn_v.weight"), E, nkv * HD, 0.08f, 0);
            if (qwen2) {
                add_f32(w, N("attn_q.bias"), NH * HD, 1, 0.1f, 0);
                add_f32(w, N("attn_k.bias"), nkv * HD, 1, 0.1f, 0);
                add_f32(w, N("attn_v.bias"), nkv * HD, 1, 0.1f, 0);
            }
        }
        add_f32(w, N("attn_output.weight"), NH * HD, E, 0.08f, 0);
        add_f32(w, N("ffn_norm.weight"), E, 1, 0.2f, 1.0f);
        if (phi3) {
            add_f32(w, N("ffn_up.weight"), E, 2 * FF, 0.08f, 0);
        } else {
            add_f32(w, N("ffn_gate.weight"), E, FF, 0.08f, 0);
            add_f32(w, N("ffn_up.weight"), E, FF, 0.08f, 0);
        }
        if (sp->bad_type && il == 1) {
            uint64_t ne[2] = {FF, E};
            gguf_w_tensor(w, N("ffn_down.weight"), T_IQ2_XXS, 2, ne, NULL);
        } else if (!(sp->drop_tensor && il == 1)) {
            add_f32(w, N("ffn_down.weight"), FF, E, 0.08f, 0);
        }
#undef N
    }
    psv_error err = {0};
    bool ok = gguf_writer_save(w, path, &err) == PSV_OK;
    CHECKF(ok, "%s", err.message);
    gguf_writer_free(w);
    return ok;
}

// The forward pass written plainly in double: llama (adjacent-pair rotary), qwen2 (+ q/k/v
// biases, half-split rotary), phi3 (fused qkv and gate|up, half-split rotary, tied output).
static void naive_forward(const model_spec *sp, const int32_t *toks, int n, double *logits /* n x NV */) {
    bool phi3 = !strcmp(sp->arch, "phi3"), qwen2 = !strcmp(sp->arch, "qwen2"), neox = phi3 || qwen2;
    int nkv = sp->kv_heads ? sp->kv_heads : NKV, kvd = nkv * HD, half = sp->n_rot / 2;
    double *x = calloc((size_t)n * E, sizeof *x), *xn = malloc(E * sizeof *xn);
    double *K = malloc((size_t)NL * n * kvd * sizeof *K), *V = malloc((size_t)NL * n * kvd * sizeof *V);
    double q[NH * HD], k[8 * HD], v[8 * HD], att[NH * HD], h[2 * FF], sc[64];
    char nm[64];
    for (int t = 0; t < n; t++)
        for (int i = 0; i < E; i++) x[t * E + i] = wget("token_embd.weight")[toks[t] * E + i];
#define WT(s) (snprintf(nm, sizeof nm, "blk.%d." s, il), wget(nm))
    for (int t = 0; t < n; t++) {
        for (int il = 0; il < NL; il++) {
            double *xt = x + t * E, ss = 0;
            for (int i = 0; i < E; i++) ss += xt[i] * xt[i];
            for (int i = 0; i < E; i++) xn[i] = xt[i] / sqrt(ss / E + 1e-5) * WT("attn_norm.weight")[i];
            for (int o = 0; o < NH * HD + 2 * kvd; o++) {
                const float *row;
                if (phi3) row = WT("attn_qkv.weight") + (size_t)o * E;
                else if (o < NH * HD) row = WT("attn_q.weight") + (size_t)o * E;
                else if (o < NH * HD + kvd) row = WT("attn_k.weight") + (size_t)(o - NH * HD) * E;
                else row = WT("attn_v.weight") + (size_t)(o - NH * HD - kvd) * E;
                double d = 0;
                for (int i = 0; i < E; i++) d += row[i] * xn[i];
                if (qwen2) d += o < NH * HD ? WT("attn_q.bias")[o] : o < NH * HD + kvd ? WT("attn_k.bias")[o - NH * HD] : WT("attn_v.bias")[o - NH * HD - kvd];
                if (o < NH * HD) q[o] = d;
                else if (o < NH * HD + kvd) k[o - NH * HD] = d;
                else v[o - NH * HD - kvd] = d;
            }
            for (int hh = 0; hh < NH + nkv; hh++) {
                double *vec = hh < NH ? q + hh * HD : k + (hh - NH) * HD;
                for (int i = 0; i < half; i++) {
                    double th = t * pow(10000.0, -2.0 * i / sp->n_rot);
                    int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
                    double x0 = vec[a], x1 = vec[b];
                    vec[a] = x0 * cos(th) - x1 * sin(th);
                    vec[b] = x0 * sin(th) + x1 * cos(th);
                }
            }
            memcpy(K + ((size_t)il * n + t) * kvd, k, kvd * sizeof *k);
            memcpy(V + ((size_t)il * n + t) * kvd, v, kvd * sizeof *v);
            for (int hh = 0; hh < NH; hh++) {
                int kh = hh / (NH / nkv);
                double mx = -1e300, sum = 0;
                for (int p = 0; p <= t; p++) {
                    double d = 0;
                    for (int i = 0; i < HD; i++) d += q[hh * HD + i] * K[((size_t)il * n + p) * kvd + kh * HD + i];
                    sc[p] = d / sqrt((double)HD);
                    if (sc[p] > mx) mx = sc[p];
                }
                for (int p = 0; p <= t; p++) sum += (sc[p] = exp(sc[p] - mx));
                for (int i = 0; i < HD; i++) {
                    double o = 0;
                    for (int p = 0; p <= t; p++) o += sc[p] / sum * V[((size_t)il * n + p) * kvd + kh * HD + i];
                    att[hh * HD + i] = o;
                }
            }
            for (int o = 0; o < E; o++) {
                double d = 0;
                for (int i = 0; i < NH * HD; i++) d += WT("attn_output.weight")[(size_t)o * NH * HD + i] * att[i];
                xt[o] += d;
            }
            ss = 0;
            for (int i = 0; i < E; i++) ss += xt[i] * xt[i];
            for (int i = 0; i < E; i++) xn[i] = xt[i] / sqrt(ss / E + 1e-5) * WT("ffn_norm.weight")[i];
            for (int o = 0; o < 2 * FF; o++) {
                const float *row = phi3 ? WT("ffn_up.weight") + (size_t)o * E
                                        : (o < FF ? WT("ffn_gate.weight") + (size_t)o * E : WT("ffn_up.weight") + (size_t)(o - FF) * E);
                double d = 0;
                for (int i = 0; i < E; i++) d += row[i] * xn[i];
                h[o] = d;
            }
            for (int i = 0; i < FF; i++) h[i] = h[i] / (1 + exp(-h[i])) * h[FF + i];
            for (int o = 0; o < E; o++) {
                double d = 0;
                for (int i = 0; i < FF; i++) d += WT("ffn_down.weight")[(size_t)o * FF + i] * h[i];
                xt[o] += d;
            }
        }
        double ss = 0;
        for (int i = 0; i < E; i++) ss += x[t * E + i] * x[t * E + i];
        for (int i = 0; i < E; i++) xn[i] = x[t * E + i] / sqrt(ss / E + 1e-5) * wget("output_norm.weight")[i];
        const float *out = phi3 ? wget("token_embd.weight") : wget("output.weight");
        for (int o = 0; o < NV; o++) {
            double d = 0;
            for (int i = 0; i < E; i++) d += out[(size_t)o * E + i] * xn[i];
            logits[(size_t)t * NV + o] = d;
        }
    }
#undef WT
    free(x), free(xn), free(K), free(V);
}

static char tmp_path[256];

static void test_forward_matches_naive(const model_spec *sp) {
    if (!write_model(tmp_path, sp)) return;
    enum { NT = 12 };
    int32_t toks[NT];
    for (int i = 0; i < NT; i++) toks[i] = (int32_t)((i * 37 + 5) % NV);
    double *ref = malloc((size_t)NT * NV * sizeof *ref);
    naive_forward(sp, toks, NT, ref);
    float *batch = malloc((size_t)NT * NV * sizeof(float)), *one = malloc((size_t)NT * NV * sizeof(float));
    psv_error err = {0};
    for (int threads = 1; threads <= 3; threads += 2) {
        psv_model_params mp = {threads};
        psv_model *m = NULL;
        CHECKF(psv_model_open(tmp_path, &mp, &m, &err) == PSV_OK, "%s: %s", sp->arch, err.message);
        if (!m) break;
        CHECK(!strcmp(psv_model_arch(m), sp->arch) && psv_model_n_vocab(m) == NV);
        // with an F32 KV cache and an F16 one: a prompt in one batch (several tokens' queries a
        // key row) gives the logits of one token at a time, bit for bit, near the plain pass
        for (int kv = 0; kv < 2; kv++) {
            psv_ctx_params cp = psv_ctx_default_params();
            cp.n_ctx = 32;
            cp.kv_type = kv ? PSV_KV_F16 : PSV_KV_F32;
            psv_ctx *c = NULL, *c1 = NULL;
            CHECK(psv_ctx_new(m, &cp, &c, &err) == PSV_OK);
            cp.n_batch = 1;
            CHECK(psv_ctx_new(m, &cp, &c1, &err) == PSV_OK);
            CHECK(psv_eval_all_logits(c, toks, NT, batch, &err) == PSV_OK);
            for (int i = 0; i < NT; i++) {
                CHECK(psv_eval(c1, &toks[i], 1, &err) == PSV_OK);
                memcpy(one + (size_t)i * NV, psv_ctx_logits(c1), NV * sizeof(float));
            }
            const char *kvn = kv ? "F16" : "F32";
            CHECKF(memcmp(batch, one, (size_t)NT * NV * sizeof(float)) == 0, "%s, %s KV cache: batch and one-by-one differ",
                   sp->arch, kvn);
            double worst = 0;
            for (int i = 0; i < NT * NV; i++) {
                double d = fabs(batch[i] - ref[i]);
                if (d > worst) worst = d;
            }
            CHECKF(worst < (kv ? 0.05 : 2e-3), "%s, %d threads, %s KV cache: largest difference from the plain forward pass %.3g",
                   sp->arch, threads, kvn, worst);
            psv_ctx_free(c1);
            psv_ctx_free(c);
        }
        psv_model_close(m);
    }
    free(ref), free(batch), free(one);
}

// A small llama model written to tmp_path and opened, or NULL (a failed check).
static psv_model *open_llama(void) {
    model_spec sp = {.arch = "llama", .n_rot = HD};
    if (!write_model(tmp_path, &sp)) return NULL;
    psv_error err = {0};
    psv_model *m = NULL;
    CHECKF(psv_model_open(tmp_path, NULL, &m, &err) == PSV_OK, "%s", err.message);
    return m;
}

static void test_ctx_limits(void) {
    psv_error err = {0};
    psv_model *m = open_llama();
    if (!m) return;
    psv_ctx_params cp = psv_ctx_default_params();
    cp.n_ctx = 8;
    psv_ctx *c = NULL;
    CHECK(psv_ctx_new(m, &cp, &c, &err) == PSV_OK);
    int32_t toks[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    // too many tokens: a clear error naming the numbers, and nothing evaluated
    CHECK(psv_eval(c, toks, 9, &err) == PSV_ERR_RANGE && strstr(err.message, "9 new tokens") && strstr(err.message, "8"));
    CHECK(psv_ctx_n_past(c) == 0 && psv_ctx_logits(c) == NULL);
    err_clear(&err);
    CHECK(psv_eval(c, toks, 5, &err) == PSV_OK && psv_ctx_n_past(c) == 5);
    CHECK(psv_eval(c, toks, 4, &err) == PSV_ERR_RANGE && psv_ctx_n_past(c) == 5);
    err_clear(&err);
    int32_t bad = NV;
    CHECK(psv_eval(c, &bad, 1, &err) == PSV_ERR_INVALID && strstr(err.message, "out of range"));
    err_clear(&err);
    bad = -1;
    CHECK(psv_eval(c, &bad, 1, &err) == PSV_ERR_INVALID);
    err_clear(&err);
    // prefix reuse: truncating to 3 and re-evaluating gives the same logits as a fresh run
    float a[NV], b[NV];
    CHECK(psv_ctx_truncate(c, 3, &err) == PSV_OK && psv_ctx_n_past(c) == 3);
    CHECK(psv_eval(c, toks + 3, 2, &err) == PSV_OK);
    memcpy(a, psv_ctx_logits(c), sizeof a);
    psv_ctx *c2 = NULL;
    CHECK(psv_ctx_new(m, &cp, &c2, &err) == PSV_OK && psv_eval(c2, toks, 5, &err) == PSV_OK);
    memcpy(b, psv_ctx_logits(c2), sizeof b);
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK(psv_ctx_truncate(c, 9, &err) == PSV_ERR_INVALID);
    // F16 KV cache: close to the F32 one
    psv_ctx_params cp16 = cp;
    cp16.kv_type = PSV_KV_F16;
    psv_ctx *c3 = NULL;
    CHECK(psv_ctx_new(m, &cp16, &c3, &err) == PSV_OK && psv_eval(c3, toks, 5, &err) == PSV_OK);
    double worst = 0;
    for (int i = 0; i < NV; i++) {
        double d = fabs(psv_ctx_logits(c3)[i] - b[i]);
        if (d > worst) worst = d;
    }
    CHECKF(worst < 0.05, "F16 KV cache moved logits by %.3g", worst);
    psv_ctx_free(c3);
    psv_ctx_free(c2);
    psv_ctx_free(c);
    psv_model_close(m);
}

static void test_bad_models(void) {
    struct {
        model_spec sp;
        psv_status st;
        const char *needle;
    } cases[] = {
        {{.arch = "llama", .n_rot = HD, .drop_tensor = true}, PSV_ERR_FORMAT, "missing tensor 'blk.1.ffn_down.weight'"},
        {{.arch = "llama", .n_rot = HD, .bad_shape = true}, PSV_ERR_FORMAT, "tensor 'blk.0.attn_q.weight': wrong shape (expected [256, 256], got [256, 128])"},
        {{.arch = "mamba", .n_rot = HD}, PSV_ERR_UNSUPPORTED, "architecture 'mamba' is not supported"},
        {{.arch = "llama", .n_rot = HD, .bad_type = true}, PSV_ERR_UNSUPPORTED, "tensor 'blk.1.ffn_down.weight': type IQ2_XXS is not supported"},
        {{.arch = "llama", .n_rot = HD, .no_blocks = true}, PSV_ERR_FORMAT, "missing or invalid key 'llama.block_count'"},
        {{.arch = "llama", .n_rot = HD, .kv_heads = 3}, PSV_ERR_FORMAT, "not a multiple of head_count_kv 3"},
        {{.arch = "llama", .n_rot = HD + 2}, PSV_ERR_FORMAT, "rope.dimension_count"},
    };
    for (size_t i = 0; i < PSV_ARRAY_LEN(cases); i++) {
        if (!write_model(tmp_path, &cases[i].sp)) continue;
        psv_error err = {0};
        psv_model *m = NULL;
        psv_status st = psv_model_open(tmp_path, NULL, &m, &err);
        CHECKF(st == cases[i].st && !m && strstr(err.message, cases[i].needle) && strstr(err.message, tmp_path),
               "case %zu: status %s, message '%s'", i, psv_status_name(st), err.message);
        psv_model_close(m);
    }
    // truncated data: every tensor byte must be in the file
    model_spec sp = {.arch = "llama", .n_rot = HD};
    if (write_model(tmp_path, &sp)) {
        struct stat stt;
        stat(tmp_path, &stt);
        CHECK(truncate(tmp_path, stt.st_size - 1000) == 0);
        psv_error err = {0};
        psv_model *m = NULL;
        CHECKF(psv_model_open(tmp_path, NULL, &m, &err) == PSV_ERR_FORMAT && !m && strstr(err.message, "data ends at"),
               "truncated: '%s'", err.message);
    }
    psv_error err = {0};
    psv_model *m = NULL;
    CHECK(psv_model_open("/nonexistent/x.gguf", NULL, &m, &err) == PSV_ERR_IO && !m && strstr(err.message, "/nonexistent/x.gguf"));
}

// pool_next_chunk hands out every item exactly once, in chunks within [0, n), whatever the
// thread count, the number of items or of chunks per thread.
typedef struct {
    _Atomic int64_t next;
    int64_t n;
    int per_thread;
    _Atomic int *count;
    _Atomic int bad;
} chunk_job;

static void chunk_task(void *arg, int ith, int nth) {
    (void)ith;
    chunk_job *j = arg;
    int64_t lo, hi;
    while (pool_next_chunk(&j->next, j->n, nth, j->per_thread, &lo, &hi)) {
        if (lo < 0 || lo >= hi || hi > j->n) atomic_fetch_add(&j->bad, 1);
        for (int64_t i = lo; i < hi && i < j->n && i >= 0; i++) atomic_fetch_add(&j->count[i], 1);
    }
}

static void test_pool_chunks(void) {
    static const int64_t ns[] = {0, 1, 5, 7, 64, 1000, 4099};
    static const int pers[] = {1, 4, 8};
    for (int nth = 1; nth <= 3; nth++) {
        pool_t *pl = NULL;
        psv_error err = {0};
        CHECK(pool_new(nth, &pl, &err) == PSV_OK);
        if (!pl) continue;
        for (size_t a = 0; a < PSV_ARRAY_LEN(ns); a++)
            for (size_t b = 0; b < PSV_ARRAY_LEN(pers); b++) {
                chunk_job j = {.n = ns[a], .per_thread = pers[b]};
                j.count = calloc((size_t)ns[a] + 1, sizeof *j.count);
                if (!j.count) continue;
                pool_run(pl, chunk_task, &j);
                int64_t wrong = 0;
                for (int64_t i = 0; i < ns[a]; i++) wrong += atomic_load(&j.count[i]) != 1;
                CHECKF(wrong == 0 && atomic_load(&j.bad) == 0, "nth %d n %lld per %d: %lld items not taken once", nth,
                       (long long)ns[a], pers[b], (long long)wrong);
                free(j.count);
            }
        pool_free(pl);
    }
}

// pool_range_take and pool_range_steal: each thread's run front to back, then the back halves of
// the others'; every item of every run goes to exactly one thread, whatever the thread count and
// the runs' lengths (some empty), and with the owner of the longest run slowed down so that the
// others take from it.
typedef struct {
    pool_t *pl;
    int64_t n[4];
    _Atomic int *count[4];
    _Atomic int bad;
} range_job;

static void range_task(void *arg, int ith, int nth) {
    range_job *j = arg;
    int64_t lo, hi, last = 0;
    int owner;
    while (pool_range_take(j->pl, ith, nth, 3, &lo, &hi)) {
        if (lo != last || hi <= lo || hi > j->n[ith])
            atomic_fetch_add(&j->bad, 1); // pieces in order from the front (others take from the back)
        last = hi;
        for (int64_t i = lo; i < hi && i >= 0 && i < j->n[ith]; i++) {
            atomic_fetch_add(&j->count[ith][i], 1);
            if (ith == 0) { // slow
                volatile int64_t spin = 0;
                for (int k = 0; k < 20000; k++) spin += k;
                (void)spin;
            }
        }
    }
    while (pool_range_steal(j->pl, ith, nth, &owner, &lo, &hi)) {
        if (owner == ith || owner < 0 || owner >= nth || lo < 0 || hi <= lo || hi > j->n[owner]) {
            atomic_fetch_add(&j->bad, 1);
            continue;
        }
        for (int64_t i = lo; i < hi; i++) atomic_fetch_add(&j->count[owner][i], 1);
    }
}

static void test_pool_ranges(void) {
    // one thread at a time, by hand: the steal takes the back half of the longest run
    pool_t *pl = NULL;
    psv_error err = {0};
    CHECK(pool_new(3, &pl, &err) == PSV_OK);
    if (pl) {
        int64_t lo = -1, hi = -1;
        int owner = -1;
        pool_range_set(pl, 0, 10), pool_range_set(pl, 1, 0), pool_range_set(pl, 2, 7);
        CHECK(pool_range_take(pl, 0, 3, 1, &lo, &hi) && lo == 0 && hi == 2); // a quarter of 10
        CHECK(pool_range_steal(pl, 1, 3, &owner, &lo, &hi) && owner == 0 && lo == 6 && hi == 10); // 8 left, > 7
        CHECK(pool_range_steal(pl, 1, 3, &owner, &lo, &hi) && owner == 2 && lo == 3 && hi == 7);  // 7 left, > 4
        CHECK(pool_range_take(pl, 0, 3, 3, &lo, &hi) && lo == 2 && hi == 5);
        CHECK(pool_range_take(pl, 0, 3, 3, &lo, &hi) && lo == 5 && hi == 6);
        CHECK(!pool_range_take(pl, 0, 3, 3, &lo, &hi) && !pool_range_take(pl, 1, 3, 3, &lo, &hi));
        CHECK(pool_range_steal(pl, 0, 3, &owner, &lo, &hi) && owner == 2 && lo == 1 && hi == 3);
        CHECK(pool_range_steal(pl, 0, 3, &owner, &lo, &hi) && owner == 2 && lo == 0 && hi == 1);
        CHECK(!pool_range_steal(pl, 0, 3, &owner, &lo, &hi) && !pool_range_steal(pl, 2, 3, &owner, &lo, &hi));
        pool_free(pl);
    }
    static const int64_t lens[][4] = {{0, 0, 0, 0}, {1, 0, 2, 0}, {1000, 5, 0, 9}, {4099, 4099, 17, 300}, {200, 1, 1, 1}};
    for (int nth = 1; nth <= 4; nth++) {
        pl = NULL;
        CHECK(pool_new(nth, &pl, &err) == PSV_OK);
        if (!pl) continue;
        for (size_t c = 0; c < PSV_ARRAY_LEN(lens); c++) {
            range_job j = {.pl = pl};
            bool ok = true;
            for (int t = 0; t < nth; t++) {
                j.n[t] = lens[c][t];
                j.count[t] = calloc((size_t)j.n[t] + 1, sizeof *j.count[t]);
                ok = ok && j.count[t];
                pool_range_set(pl, t, j.n[t]);
            }
            if (ok) {
                pool_run(pl, range_task, &j);
                int64_t wrong = 0;
                for (int t = 0; t < nth; t++)
                    for (int64_t i = 0; i < j.n[t]; i++) wrong += atomic_load(&j.count[t][i]) != 1;
                CHECKF(wrong == 0 && atomic_load(&j.bad) == 0, "nth %d case %zu: %lld items not taken once, %d bad pieces",
                       nth, c, (long long)wrong, atomic_load(&j.bad));
            }
            for (int t = 0; t < nth; t++) free(j.count[t]);
        }
        pool_free(pl);
    }
}

// op_matmul_all's one job for products of the same activations (q, k and v; gate and up) gives
// each product's rows exactly what a product of its own does (and that, the reference kernels'
// results, row by row: whichever kernels a product of that many rows takes), on every kernel set this CPU
// runs and any thread count: the threads' chunks cross from one product into the next (rows in
// fours for the one-row kernels, one by one for the others), products of another type go on
// their own (with two to four rows, the gemvn kernels where the set has them, in the same
// groups of four), and from the rows the type's GEMM starts at (MM_GEMM_MIN, or k_traits.gemm_from:
// F16's from 9) each product is done by itself.
static void test_matmul_parts(void) {
    enum { N_IN = 512, BATCH = 9 };
    static const struct { uint32_t q, k, v; } mixes[] = {
        {T_Q4_0, T_Q4_0, T_Q4_0}, {T_Q8_0, T_Q8_0, T_Q8_0}, {T_Q5_0, T_Q5_0, T_Q5_0}, {T_Q4_K, T_Q4_K, T_Q6_K},
        {T_Q6_K, T_Q6_K, T_Q6_K}, {T_F16, T_F16, T_F16},  {T_BF16, T_BF16, T_BF16}, {T_Q4_1, T_Q5_1, T_Q4_1},
        {T_Q4_0, T_Q8_0, T_Q4_0},
    };
    static const int64_t rows[][3] = {{37, 6, 9}, {8, 4, 4}, {130, 3, 1}};
    float *x = malloc(sizeof(float) * BATCH * N_IN), *wf = malloc(sizeof(float) * N_IN);
    uint8_t *wd[3] = {0};
    for (int i = 0; i < BATCH * N_IN; i++) x[i] = frand();
    (void)k_traits_get(T_F32); // the sets are made; the test then picks each in turn
    const k_set saved = k_active_set;
    int runs = 0;
    for (int set = 0; set < K_SET_COUNT; set++) {
        if (!k_set_supported((k_set)set, plat_cpu_get())) continue;
        k_active_set = (k_set)set;
        for (int nth = 1; nth <= 3; nth++) {
            psv_model m = {.n_embd = N_IN, .n_head = 1, .n_head_kv = 1, .head_dim = 256, .n_ff = 256};
            fwd_scratch s;
            psv_error err = {0};
            CHECK(pool_new(nth, &m.pool, &err) == PSV_OK);
            if (!m.pool) continue;
            CHECK(scratch_init(&s, &m, BATCH, 1, &err) == PSV_OK);
            for (size_t mi = 0; mi < PSV_ARRAY_LEN(mixes); mi++)
                for (size_t ri = 0; ri < PSV_ARRAY_LEN(rows); ri++) {
                    const uint32_t types[3] = {mixes[mi].q, mixes[mi].k, mixes[mi].v};
                    mtensor w[3];
                    const int64_t width = rows[ri][0] + rows[ri][1] + rows[ri][2];
                    for (int p = 0; p < 3; p++) {
                        uint64_t rs = 0;
                        CHECK(type_row_size(types[p], N_IN, &rs));
                        free(wd[p]);
                        wd[p] = malloc((size_t)rs * (size_t)rows[ri][p]);
                        for (int64_t r = 0; r < rows[ri][p]; r++) {
                            for (int i = 0; i < N_IN; i++) wf[i] = frand();
                            k_traits_ref(types[p])->from_float(wf, wd[p] + (size_t)r * rs, N_IN);
                        }
                        w[p] = (mtensor){.data = wd[p], .type = types[p], .n_in = N_IN, .n_out = rows[ri][p], .row_size = (size_t)rs, .name = "w"};
                    }
                    for (int n_tok = 1; n_tok <= BATCH; n_tok++) {
                        float *want = calloc((size_t)(BATCH * width), sizeof(float)), *got = calloc((size_t)(BATCH * width), sizeof(float));
                        int64_t off = 0;
                        for (int p = 0; p < 3; p++) {
                            op_matmul(&m, &s, &w[p], x, n_tok, want + off, width);
                            off += rows[ri][p];
                        }
                        if (nth == 1) { // each product against the reference kernels, row by row
                            int64_t bad = 0, col = 0;
                            for (int p = 0; p < 3; p++) {
                                const k_traits *rt = k_traits_ref(types[p]);
                                uint64_t qs = 0;
                                CHECK(type_row_size(rt->vec_dot_type, N_IN, &qs));
                                uint8_t *xq = malloc((size_t)qs);
                                for (int t = 0; t < n_tok; t++) {
                                    k_traits_ref(rt->vec_dot_type)->from_float(x + (size_t)t * N_IN, xq, N_IN);
                                    for (int64_t r = 0; r < rows[ri][p]; r++) {
                                        float v;
                                        rt->vec_dot(N_IN, &v, wd[p] + (size_t)r * w[p].row_size, xq);
                                        bad += memcmp(&v, &want[t * width + col + r], sizeof v) != 0;
                                    }
                                }
                                col += rows[ri][p];
                                free(xq);
                            }
                            CHECKF(bad == 0, "set %s, types %s %s %s, rows %lld %lld %lld, %d tokens: %lld results differ from the reference",
                                   k_set_names[set], type_table[types[0]].name, type_table[types[1]].name, type_table[types[2]].name,
                                   (long long)rows[ri][0], (long long)rows[ri][1], (long long)rows[ri][2], n_tok, (long long)bad);
                        }
                        const mtensor *also_w[2] = {&w[1], &w[2]};
                        float *also_y[2] = {got + rows[ri][0], got + rows[ri][0] + rows[ri][1]};
                        op_matmul_all(&m, &s, &w[0], x, n_tok, got, width, NULL, false, also_w, also_y, 2);
                        int64_t diff = 0;
                        for (int64_t i = 0; i < n_tok * width; i++) diff += memcmp(&want[i], &got[i], sizeof(float)) != 0;
                        CHECKF(diff == 0, "set %s, %d threads, types %s %s %s, rows %lld %lld %lld, %d tokens: %lld of %lld results differ",
                               k_set_names[set], nth, type_table[types[0]].name, type_table[types[1]].name,
                               type_table[types[2]].name, (long long)rows[ri][0], (long long)rows[ri][1],
                               (long long)rows[ri][2], n_tok, (long long)diff, (long long)(n_tok * width));
                        runs++;
                        free(want);
                        free(got);
                    }
                }
            scratch_free(&s);
            pool_free(m.pool);
        }
    }
    k_active_set = saved;
    CHECK(runs > 0);
    for (int p = 0; p < 3; p++) free(wd[p]);
    free(wf);
    free(x);
}

// mm_gemm_rows splits any number of rows into calls the kernels take, every row once: for five
// or more at a time, calls of g and g - 1 only wherever that is possible (for five from 12 rows
// on, for six from 20: past the largest sum neither makes, g (g - 1) - g - (g - 1); and where m is
// a multiple of g or g - 1), the rest in one last call.
static void test_gemm_rows(void) {
    for (int g = 1; g <= K_GEMM_ROWS_MAX; g++)
        for (int64_t m = 1; m <= 600; m++) {
            int64_t left = m, calls = 0, small = 0;
            bool ok = true;
            const bool pairs = g >= K_GEMM_ROWS_AVX512; // kernels that also take g - 1
            while (left > 0 && calls <= m) {
                int nr = mm_gemm_rows(g, left);
                ok = ok && nr >= 1 && nr <= g && nr <= left;
                if (nr < (pairs ? g - 1 : g)) small++;
                left -= nr, calls++;
            }
            ok = ok && left == 0 && small <= 1;
            if (pairs && (m > g * (g - 1) - g - (g - 1) || m % g == 0 || m % (g - 1) == 0)) ok = ok && small == 0;
            if (!ok) {
                CHECKF(ok, "mm_gemm_rows(%d, %lld): %lld rows left, %lld short calls", g, (long long)m, (long long)left,
                       (long long)small);
                return;
            }
        }
    CHECK(mm_gemm_rows(K_GEMM_ROWS_AVX512, 128) == 4 && mm_gemm_rows(K_GEMM_ROWS_AVX512, 120) == 5);
    CHECK(mm_gemm_rows(K_GEMM_ROWS_AVX512_K, 128) == 5 && mm_gemm_rows(K_GEMM_ROWS_AVX512_K, 120) == 6);
}

// The page-table helper psv_model_open starts: it runs over the data section, a stop request
// ends it (the join returns), and stopping twice or a helper that never started is harmless.
static void test_prefault(void) {
    size_t n = (size_t)64 << 20;
    uint8_t *p = calloc(n, 1);
    if (!p) return;
    plat_prefault pf;
    plat_prefault_start(&pf, p, n);
    CHECK(pf.running);
    plat_prefault_stop(&pf);
    CHECK(!pf.running && atomic_load(&pf.stop));
    plat_prefault_stop(&pf);
    CHECK(!pf.running);
    plat_prefault_start(&pf, p, 0); // nothing to touch: no thread
    CHECK(!pf.running);
    plat_prefault_stop(&pf);
    free(p);

    psv_model *m = open_llama();
    if (!m) return;
    CHECK(m->prefault.running && m->prefault.p == m->gguf->base + m->gguf->data_offset &&
          m->prefault.n == m->gguf->size - m->gguf->data_offset);
    psv_model_close(m); // joins the helper; ASan and TSan builds see it end before the unmap
}

// Pages of [p, p + n) mapped in this process (Linux's /proc/self/pagemap: bit 63 of each page's
// entry), or -1 where that cannot be read.
static long pages_present(const void *p, size_t n) {
    const long pg = sysconf(_SC_PAGESIZE);
    FILE *f = fopen("/proc/self/pagemap", "rb");
    if (!f || pg <= 0) {
        if (f) fclose(f);
        return -1;
    }
    long present = 0;
    for (uintptr_t a = (uintptr_t)p / (uintptr_t)pg; a < ((uintptr_t)p + n + (uintptr_t)pg - 1) / (uintptr_t)pg; a++) {
        uint64_t e = 0;
        if (fseeko(f, (off_t)(a * 8), SEEK_SET) != 0 || fread(&e, 8, 1, f) != 1) {
            present = -1;
            break;
        }
        present += (long)(e >> 63);
    }
    fclose(f);
    return present;
}

// A model's metadata leaves the resident set once it is opened (plat_map_release), and reads of
// it after that still give the file's bytes.
static void test_metadata_release(void) {
    const size_t pad = 300000;
    model_spec sp = {.arch = "llama", .n_rot = HD, .pad = pad};
    if (!write_model(tmp_path, &sp)) return;
    psv_error err = {0};
    psv_model *m = NULL;
    CHECKF(psv_model_open(tmp_path, NULL, &m, &err) == PSV_OK, "%s", err.message);
    if (!m) return;
    const gguf_file *f = m->gguf;
    const long pg = sysconf(_SC_PAGESIZE);
    const size_t meta = (size_t)f->data_offset / (size_t)pg * (size_t)pg;
    // (the prefault helper's first touches of the weights may map back the metadata's last 64 KiB:
    // Linux maps the pages around a fault that are in the page cache)
    const size_t around = (size_t)64 << 10;
    CHECK(f->data_offset > pad && meta > around + (size_t)pg);
    long before = pages_present(f->base, meta - around);
    if (before < 0) {
        SKIP("test_metadata_release: /proc/self/pagemap cannot be read here; only the contents are checked");
    } else {
        CHECKF(before == 0, "%ld of %zu metadata pages still mapped after open", before, (meta - around) / (size_t)pg);
    }
    const gguf_kv *kv = gguf_find_kv(f, "test.padding");
    CHECK(kv && kv->type == GGUF_T_STRING && kv->v.s.n == pad);
    bool same = kv != NULL;
    for (size_t i = 0; same && i < pad; i++) same = kv->v.s.p[i] == (char)('a' + i % 26);
    CHECK(same); // read back from the page cache
    if (before >= 0) CHECK(pages_present(kv->v.s.p, pad) > 0);
    psv_model_close(m);

    // the release itself: the whole pages of the first len bytes, nothing of the rest
    plat_map mp;
    CHECK(plat_map_file(tmp_path, &mp, &err) == PSV_OK);
    if (!mp.map) return;
    volatile uint8_t sum = 0;
    for (size_t i = 0; i < mp.size; i++) sum ^= ((const uint8_t *)mp.data)[i];
    const size_t len = 3 * (size_t)pg + 100;
    plat_map_release(&mp, len);
    if (pages_present(mp.data, mp.size) >= 0) {
        CHECK(pages_present(mp.data, 3 * (size_t)pg) == 0);
        CHECK(pages_present((const uint8_t *)mp.data + 3 * pg, mp.size - 3 * (size_t)pg) ==
              (long)((mp.size - 3 * (size_t)pg + (size_t)pg - 1) / (size_t)pg));
    }
    uint8_t again = 0;
    for (size_t i = 0; i < mp.size; i++) again ^= ((const uint8_t *)mp.data)[i];
    CHECK(again == sum);
    plat_unmap(&mp);
    free_weights();
}

int main(void) {
    snprintf(tmp_path, sizeof tmp_path, "/tmp/psv-test-model-%d.gguf", (int)getpid());
    model_spec specs[] = {
        {.arch = "llama", .n_rot = HD},       // adjacent-pair rotary, GQA 2:1
        {.arch = "qwen2", .n_rot = HD},       // biases, half-split rotary
        {.arch = "phi3", .n_rot = HD * 3 / 4}, // fused qkv and gate|up, partial rotary, tied output
    };
    for (size_t i = 0; i < PSV_ARRAY_LEN(specs); i++) test_forward_matches_naive(&specs[i]);
    test_ctx_limits();
    test_prefault();
    test_metadata_release();
    test_pool_chunks();
    test_pool_ranges();
    test_gemm_rows();
    test_matmul_parts();
    test_bad_models();
    free_weights();
    unlink(tmp_path);
    return t_finish();
}

// tests/test_engine.c — the inference engine against ../shared/reference (the comparison
// contract of reference/README.md), plus the sampler and model-loading errors.
//
// For every case of every reference model, with 1 and 2 threads, whole-prompt batches and one
// token at a time: teacher-forced logits meet the contract at every position that has a
// reference summary, and free-running greedy generation reproduces gen_ids up to the first
// near-tie. Prints the largest logit difference seen per model.
#define PSV_TESTING
#define PSV_NO_MAIN
#include "pensieve.c"
#include "test.h"
#include <math.h>

#define TOL_LOGIT 0.15
#define TOL_MARGIN 0.2

typedef struct {
    double max_diff; // largest |logit - reference| over all compared logits and lse
    int positions;   // positions compared
} cmp_stats;

static double lse_of(const float *l, int64_t n) {
    float mx = l[0];
    for (int64_t i = 1; i < n; i++)
        if (l[i] > mx) mx = l[i];
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += psv_exp((double)l[i] - mx);
    return mx + psv_log(s);
}

static int64_t argmax_of(const float *l, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (l[i] > l[b]) b = i;
    return b;
}

// Compare one position's logits with a reference summary {lse, top:[[id, logit], ...]}.
static bool check_position(const char *what, int64_t pos, const float *l, int64_t n_vocab,
                           const json_value *ref, cmp_stats *st) {
    bool ok = true;
    double lse = lse_of(l, n_vocab), rlse = json_num(json_get(ref, "lse"));
    double d = lse - rlse;
    if (d < 0) d = -d;
    if (d > st->max_diff) st->max_diff = d;
    if (d > TOL_LOGIT) {
        fprintf(stderr, "%s pos %" PRId64 ": lse %.4f vs reference %.4f\n", what, pos, lse, rlse);
        ok = false;
    }
    const json_value *top = json_get(ref, "top");
    for (size_t k = 0; k < json_len(top); k++) {
        int64_t id = (int64_t)json_num(json_at(json_at(top, k), 0));
        double rv = json_num(json_at(json_at(top, k), 1));
        if (id < 0 || id >= n_vocab) {
            fprintf(stderr, "%s: reference token %" PRId64 " out of range\n", what, id);
            return false;
        }
        double dd = l[id] - rv;
        if (dd < 0) dd = -dd;
        if (dd > st->max_diff) st->max_diff = dd;
        if (dd > TOL_LOGIT) {
            fprintf(stderr, "%s pos %" PRId64 ": token %" PRId64 " logit %.4f vs reference %.4f\n", what, pos, id,
                    (double)l[id], rv);
            ok = false;
        }
    }
    if (json_len(top) >= 2) {
        double margin = json_num(json_at(json_at(top, 0), 1)) - json_num(json_at(json_at(top, 1), 1));
        int64_t rtop = (int64_t)json_num(json_at(json_at(top, 0), 0));
        if (margin >= TOL_MARGIN && argmax_of(l, n_vocab) != rtop) {
            fprintf(stderr, "%s pos %" PRId64 ": arg-max %" PRId64 " vs reference %" PRId64 " (margin %.3f)\n", what,
                    pos, argmax_of(l, n_vocab), rtop, margin);
            ok = false;
        }
    }
    st->positions++;
    return ok;
}

static int32_t *ids_of(const json_value *arr, size_t *n) {
    *n = json_len(arr);
    int32_t *ids = malloc((*n ? *n : 1) * sizeof *ids);
    for (size_t i = 0; i < *n; i++) ids[i] = (int32_t)json_num(json_at(arr, i));
    return ids;
}

// Teacher forcing over prompt_ids + gen_ids, batch or one by one.
static void run_teacher_forced(psv_model *m, const json_value *cs, bool batch, const char *tag, cmp_stats *st) {
    size_t np, ng;
    int32_t *p = ids_of(json_get(cs, "prompt_ids"), &np);
    int32_t *g = ids_of(json_get(cs, "gen_ids"), &ng);
    size_t n = np + ng;
    int32_t *all = malloc(n * sizeof *all);
    memcpy(all, p, np * sizeof *all);
    memcpy(all + np, g, ng * sizeof *all);
    int64_t nv = psv_model_n_vocab(m);
    float *lg = malloc(n * (size_t)nv * sizeof(float));
    psv_ctx_params cp = psv_ctx_default_params();
    cp.n_ctx = 512;
    cp.kv_type = PSV_KV_F32;
    cp.n_batch = batch ? 512 : 1;
    psv_ctx *c = NULL;
    psv_error err = {0};
    CHECKF(psv_ctx_new(m, &cp, &c, &err) == PSV_OK, "%s: %s", tag, err.message);
    if (!c) goto done;
    if (batch) {
        CHECKF(psv_eval_all_logits(c, all, n, lg, &err) == PSV_OK, "%s: %s", tag, err.message);
    } else {
        for (size_t i = 0; i < n; i++) {
            if (psv_eval(c, &all[i], 1, &err) != PSV_OK) break;
            memcpy(lg + i * (size_t)nv, psv_ctx_logits(c), (size_t)nv * sizeof(float));
        }
        CHECKF(err.status == PSV_OK, "%s: %s", tag, err.message);
    }
    const json_value *pl = json_get(cs, "prompt_logits"), *gl = json_get(cs, "gen_logits");
    bool ok = true;
    for (size_t i = 0; i < json_len(pl) && i < n; i++)
        ok &= check_position(tag, (int64_t)i, lg + i * (size_t)nv, nv, json_at(pl, i), st);
    for (size_t s = 0; s < json_len(gl) && np - 1 + s < n; s++)
        ok &= check_position(tag, (int64_t)(np - 1 + s), lg + (np - 1 + s) * (size_t)nv, nv, json_at(gl, s), st);
    CHECKF(ok, "%s: teacher-forced logits outside the contract", tag);
done:
    psv_ctx_free(c);
    free(lg);
    free(all);
    free(p);
    free(g);
}

// Free-running greedy generation equals gen_ids up to the first step whose reference margin
// is below 0.2.
static void run_greedy(psv_model *m, const json_value *cs, const char *tag) {
    size_t np, ng;
    int32_t *p = ids_of(json_get(cs, "prompt_ids"), &np);
    int32_t *g = ids_of(json_get(cs, "gen_ids"), &ng);
    const json_value *gl = json_get(cs, "gen_logits");
    psv_ctx_params cp = psv_ctx_default_params();
    cp.n_ctx = 512;
    psv_ctx *c = NULL;
    psv_error err = {0};
    psv_sampler_params sp = psv_sampler_default_params();
    sp.temperature = 0;
    psv_sampler *smp = NULL;
    CHECK(psv_ctx_new(m, &cp, &c, &err) == PSV_OK && psv_sampler_new(&sp, psv_model_n_vocab(m), &smp, &err) == PSV_OK);
    if (!c || !smp) goto done;
    CHECKF(psv_eval(c, p, np, &err) == PSV_OK, "%s: %s", tag, err.message);
    size_t agreed = 0, checked = 0;
    bool ok = true;
    for (size_t s = 0; s < ng; s++) {
        const json_value *top = json_get(json_at(gl, s), "top");
        double margin = json_num(json_at(json_at(top, 0), 1)) - json_num(json_at(json_at(top, 1), 1));
        if (margin < TOL_MARGIN) break;
        int32_t tok = psv_sampler_sample(smp, psv_ctx_logits(c));
        checked++;
        if (tok != g[s]) {
            fprintf(stderr, "%s: greedy step %zu gave %d, reference %d\n", tag, s, tok, g[s]);
            ok = false;
            break;
        }
        agreed++;
        if (psv_eval(c, &tok, 1, &err) != PSV_OK) {
            ok = false;
            break;
        }
    }
    CHECKF(ok, "%s: greedy generation diverged after %zu of %zu checked steps", tag, agreed, checked);
done:
    psv_sampler_free(smp);
    psv_ctx_free(c);
    free(p);
    free(g);
}

static void test_reference_models(void) {
    const char *dir = t_shared_path("reference/expected");
    if (!dir) {
        SKIP("reference conformance: ../shared/reference is absent (set PSV_SHARED)");
        return;
    }
    static const char *names[] = {"llama-spm-q4km", "llama-spm-q40", "phi3-q5km", "qwen2-q3km", "phi4mini-q4km", "phi2-f16"};
    for (size_t mi = 0; mi < PSV_ARRAY_LEN(names); mi++) {
        char path[4096], mpath[4096];
        snprintf(path, sizeof path, "%s/%s.json", t_shared_path("reference/expected"), names[mi]);
        snprintf(mpath, sizeof mpath, "%s/%s.gguf", t_shared_path("reference/models"), names[mi]);
        char *text;
        size_t len;
        psv_error err = {0};
        if (plat_read_file(path, &text, &len, &err) != PSV_OK) {
            CHECKF(0, "%s", err.message);
            continue;
        }
        json_doc *doc = NULL;
        CHECKF(json_parse(text, len, &doc, &err) == PSV_OK, "%s: %s", path, err.message);
        const json_value *cases = json_get(json_root(doc), "cases");
        cmp_stats st = {0};
        for (int threads = 1; threads <= 2; threads++) {
            psv_model_params mp = psv_model_default_params();
            mp.n_threads = threads;
            psv_model *m = NULL;
            CHECKF(psv_model_open(mpath, &mp, &m, &err) == PSV_OK, "%s", err.message);
            if (!m) break;
            for (size_t ci = 0; ci < json_len(cases); ci++) {
                const json_value *cs = json_at(cases, ci);
                char tag[256];
                for (int batch = 0; batch <= 1; batch++) {
                    snprintf(tag, sizeof tag, "%s/%s t=%d %s", names[mi], json_str(json_get(cs, "name")), threads,
                             batch ? "batch" : "one-by-one");
                    run_teacher_forced(m, cs, batch, tag, &st);
                }
                snprintf(tag, sizeof tag, "%s/%s t=%d greedy", names[mi], json_str(json_get(cs, "name")), threads);
                run_greedy(m, cs, tag);
            }
            psv_model_close(m);
        }
        printf("reference %-16s %zu cases, %d positions compared, largest logit difference %.4f\n", names[mi],
               json_len(cases), st.positions, st.max_diff);
        json_doc_free(doc);
        free(text);
    }
}


// ---- sampler on crafted logits ----

static psv_sampler *mk_sampler(float temp, int top_k, float top_p, float min_p, uint64_t seed, int64_t nv) {
    psv_sampler_params sp = psv_sampler_default_params();
    sp.temperature = temp;
    sp.top_k = top_k;
    sp.top_p = top_p;
    sp.min_p = min_p;
    sp.seed = seed;
    psv_sampler *s = NULL;
    psv_error err = {0};
    CHECKF(psv_sampler_new(&sp, nv, &s, &err) == PSV_OK, "%s", err.message);
    return s;
}

static void test_sampler(void) {
    // greedy: the arg-max, lowest id on ties
    float l1[] = {0.5f, 3.0f, -1.0f, 3.0f, 2.9f};
    psv_sampler *s = mk_sampler(0, 0, 1, 0, 1, 5);
    CHECK(psv_sampler_sample(s, l1) == 1);
    psv_sampler_free(s);

    // top-k 1 at temperature 1 is the arg-max whatever the seed
    for (uint64_t seed = 0; seed < 50; seed++) {
        s = mk_sampler(1, 1, 1, 0, seed, 5);
        CHECK(psv_sampler_sample(s, l1) == 1);
        psv_sampler_free(s);
    }

    // temperature 1, no cut-offs: frequencies follow softmax within 1.5% over 40000 draws
    float l2[] = {0.0f, 1.0f, 2.0f, -1e9f};
    double p2[3], z = 1 + psv_exp(1) + psv_exp(2);
    p2[0] = 1 / z, p2[1] = psv_exp(1) / z, p2[2] = psv_exp(2) / z;
    int cnt[4] = {0};
    s = mk_sampler(1, 0, 1, 0, 42, 4);
    for (int i = 0; i < 40000; i++) cnt[psv_sampler_sample(s, l2)]++;
    psv_sampler_free(s);
    for (int i = 0; i < 3; i++) CHECKF(fabs(cnt[i] / 40000.0 - p2[i]) < 0.015, "token %d freq %.4f vs %.4f", i, cnt[i] / 40000.0, p2[i]);
    CHECK(cnt[3] == 0);

    // temperature 0.5 sharpens: p ~ exp(2 l)
    memset(cnt, 0, sizeof cnt);
    s = mk_sampler(0.5f, 0, 1, 0, 7, 4);
    for (int i = 0; i < 40000; i++) cnt[psv_sampler_sample(s, l2)]++;
    psv_sampler_free(s);
    z = 1 + psv_exp(2) + psv_exp(4);
    CHECKF(fabs(cnt[2] / 40000.0 - psv_exp(4) / z) < 0.015, "T=0.5 top freq %.4f", cnt[2] / 40000.0);

    // top-p 0.6 over p = (0.09, 0.24, 0.67): only the top token survives
    s = mk_sampler(1, 0, 0.6f, 0, 3, 4);
    bool only_top = true;
    for (int i = 0; i < 2000; i++) only_top &= psv_sampler_sample(s, l2) == 2;
    CHECK(only_top);
    psv_sampler_free(s);
    // top-p 0.9: tokens 2 and 1 (0.67 + 0.24 >= 0.9), never 0
    memset(cnt, 0, sizeof cnt);
    s = mk_sampler(1, 0, 0.9f, 0, 3, 4);
    for (int i = 0; i < 4000; i++) cnt[psv_sampler_sample(s, l2)]++;
    psv_sampler_free(s);
    CHECK(cnt[0] == 0 && cnt[1] > 0 && cnt[2] > 0);

    // min-p 0.3: keeps tokens with p >= 0.3 p_max: token 1 (0.37 of max) yes, token 0 (0.14) no
    memset(cnt, 0, sizeof cnt);
    s = mk_sampler(1, 0, 1, 0.3f, 9, 4);
    for (int i = 0; i < 4000; i++) cnt[psv_sampler_sample(s, l2)]++;
    psv_sampler_free(s);
    CHECK(cnt[0] == 0 && cnt[1] > 0 && cnt[2] > 0);

    // same seed, same sequence; another seed, another sequence
    float l3[64];
    for (int i = 0; i < 64; i++) l3[i] = (float)(i % 7) * 0.3f;
    int32_t a[32], b[32], c[32];
    psv_sampler *sa = mk_sampler(1, 0, 1, 0, 1234, 64), *sb = mk_sampler(1, 0, 1, 0, 1234, 64),
                *sc = mk_sampler(1, 0, 1, 0, 99, 64);
    int diff = 0;
    for (int i = 0; i < 32; i++) {
        a[i] = psv_sampler_sample(sa, l3);
        b[i] = psv_sampler_sample(sb, l3);
        c[i] = psv_sampler_sample(sc, l3);
        diff += a[i] != c[i];
    }
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK(diff > 0);
    psv_sampler_free(sa);
    psv_sampler_free(sb);
    psv_sampler_free(sc);

    // repetition penalty: an accepted token's positive logit is divided, negative multiplied
    float l4[] = {2.0f, 1.5f, -1.0f};
    psv_sampler_params sp = psv_sampler_default_params();
    sp.temperature = 0;
    sp.repeat_penalty = 2.0f;
    psv_error err = {0};
    CHECK(psv_sampler_new(&sp, 3, &s, &err) == PSV_OK);
    CHECK(psv_sampler_sample(s, l4) == 0);
    psv_sampler_accept(s, 0); // 2.0 -> 1.0 < 1.5
    CHECK(psv_sampler_sample(s, l4) == 1);
    psv_sampler_free(s);
    // penalty window: with repeat_last_n 2, a token leaves the window after two more accepts
    sp.repeat_last_n = 2;
    CHECK(psv_sampler_new(&sp, 3, &s, &err) == PSV_OK);
    psv_sampler_accept(s, 0);
    CHECK(psv_sampler_sample(s, l4) == 1);
    psv_sampler_accept(s, 2);
    psv_sampler_accept(s, 2);
    CHECK(psv_sampler_sample(s, l4) == 0);
    psv_sampler_free(s);
    // presence and frequency penalties subtract (presence + count * frequency)
    sp = psv_sampler_default_params();
    sp.temperature = 0;
    sp.presence_penalty = 0.3f;
    sp.frequency_penalty = 0.15f;
    CHECK(psv_sampler_new(&sp, 3, &s, &err) == PSV_OK);
    psv_sampler_accept(s, 0); // 2.0 - 0.3 - 0.15 = 1.55 > 1.5
    CHECK(psv_sampler_sample(s, l4) == 0);
    psv_sampler_accept(s, 0); // 2.0 - 0.3 - 0.30 = 1.40 < 1.5
    CHECK(psv_sampler_sample(s, l4) == 1);
    psv_sampler_free(s);
    // NaN logits are never chosen
    float l5[] = {f32_from_bits(0x7fc00000u), 1.0f, 0.5f};
    s = mk_sampler(0, 0, 1, 0, 1, 3);
    CHECK(psv_sampler_sample(s, l5) == 1);
    psv_sampler_free(s);

    // invalid parameters are clear errors
    struct { float temp, top_p, min_p, rep; int top_k; const char *needle; } bad[] = {
        {-1, 1, 0, 1, 0, "temperature"}, {1, 1.5f, 0, 1, 0, "top_p"}, {1, 1, -0.1f, 1, 0, "min_p"},
        {1, 1, 0, 0, 0, "repeat_penalty"}, {1, 1, 0, 1, -3, "top_k"},
    };
    for (size_t i = 0; i < PSV_ARRAY_LEN(bad); i++) {
        sp = psv_sampler_default_params();
        sp.temperature = bad[i].temp;
        sp.top_p = bad[i].top_p;
        sp.min_p = bad[i].min_p;
        sp.repeat_penalty = bad[i].rep;
        sp.top_k = bad[i].top_k;
        psv_error e = {0};
        s = NULL;
        CHECK(psv_sampler_new(&sp, 10, &s, &e) == PSV_ERR_INVALID && !s && strstr(e.message, bad[i].needle));
    }
}

int main(void) {
    test_sampler();
    test_reference_models();
    return t_finish();
}

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

#define TOL_LOGIT 0.15  // the contract (reference/README.md)
#define TOL_MARGIN 0.2  // arg-max must agree where the reference margin is at least this
#define TOL_LOOSE 1.0   // beyond a rounding tie: a rounding flip moves logits by < 0.7, a bug by far more
#define TIE_REL 1e-6f   // an activation this close (relative) to a Q8 rounding boundary is a near-tie

// Per-model tallies for the report.
typedef struct {
    double max_diff;      // largest |logit - reference| over every compared logit and lse
    int positions;        // positions compared
    int strict_ok;        // positions meeting the contract
    int asserted;         // positions where the contract was asserted (before the first near-tie)
    int cases, cases_strict;
} ref_stats;

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

// Largest deviation of one position's logits from a reference summary {lse, top}: over the
// reference's top tokens and lse. *argmax_bad is set when the arg-max differs although the
// reference margin is at least TOL_MARGIN.
static double position_diff(const float *l, int64_t n_vocab, const json_value *ref, bool *argmax_bad) {
    *argmax_bad = false;
    double worst = lse_of(l, n_vocab) - json_num(json_get(ref, "lse"));
    if (worst < 0) worst = -worst;
    const json_value *top = json_get(ref, "top");
    for (size_t k = 0; k < json_len(top); k++) {
        int64_t id = (int64_t)json_num(json_at(json_at(top, k), 0));
        if (id < 0 || id >= n_vocab) return 1e30;
        double d = l[id] - json_num(json_at(json_at(top, k), 1));
        if (d < 0) d = -d;
        if (d > worst) worst = d;
    }
    *argmax_bad = false;
    if (json_len(top) >= 2) {
        double margin = json_num(json_at(json_at(top, 0), 1)) - json_num(json_at(json_at(top, 1), 1));
        *argmax_bad = margin >= TOL_MARGIN && argmax_of(l, n_vocab) != (int64_t)json_num(json_at(json_at(top, 0), 0));
    }
    return worst;
}

static int32_t *ids_of(const json_value *arr, size_t *n) {
    *n = json_len(arr);
    int32_t *ids = malloc((*n ? *n : 1) * sizeof *ids);
    for (size_t i = 0; i < *n; i++) ids[i] = (int32_t)json_num(json_at(arr, i));
    return ids;
}

// Every logit of tokens[] evaluated in one context, in passes of up to n_batch tokens (512: the
// whole prompt at once; 1: one token per pass).
static bool eval_all(psv_model *m, const int32_t *tokens, size_t n, int n_batch, float *lg, const char *tag) {
    const bool batch = n_batch > 1;
    int64_t nv = psv_model_n_vocab(m);
    psv_ctx_params cp = psv_ctx_default_params();
    cp.n_ctx = 512; // the reference's context (it selects phi3's long rope factors)
    cp.kv_type = PSV_KV_F32;
    cp.n_batch = n_batch;
    psv_ctx *c = NULL;
    psv_error err = {0};
    bool ok = psv_ctx_new(m, &cp, &c, &err) == PSV_OK;
    if (ok && batch) ok = psv_eval_all_logits(c, tokens, n, lg, &err) == PSV_OK;
    for (size_t i = 0; ok && !batch && i < n; i++) {
        ok = psv_eval(c, &tokens[i], 1, &err) == PSV_OK;
        if (ok) memcpy(lg + i * (size_t)nv, psv_ctx_logits(c), (size_t)nv * sizeof(float));
    }
    CHECKF(ok, "%s: %s", tag, err.message);
    psv_ctx_free(c);
    return ok;
}

// One case: teacher-forced logits over prompt_ids + gen_ids in six configurations (1 and 2
// threads x batch and one by one; passes of 3 and of 4 tokens, as a few sequences generated
// together take the products: the gemvn kernels), which must agree bit for bit; then the
// comparison with the reference and greedy generation.
static void run_case(psv_model *m1, psv_model *m2, const char *model, const json_value *cs, ref_stats *st) {
    char tag[256];
    snprintf(tag, sizeof tag, "%s/%s", model, json_str(json_get(cs, "name")));
    size_t np, ng;
    int32_t *p = ids_of(json_get(cs, "prompt_ids"), &np);
    int32_t *g = ids_of(json_get(cs, "gen_ids"), &ng);
    size_t n = np + ng;
    int32_t *all = malloc(n * sizeof *all);
    memcpy(all, p, np * sizeof *all);
    memcpy(all + np, g, ng * sizeof *all);
    int64_t nv = psv_model_n_vocab(m1);
    size_t bytes = n * (size_t)nv * sizeof(float);
    float *ref_lg = malloc(bytes), *lg = malloc(bytes);

    test_tie_rel = TIE_REL;
    test_first_tie = INT64_MAX;
    bool ok = eval_all(m1, all, n, 512, ref_lg, tag);
    test_tie_rel = 0;
    int64_t first_tie = test_first_tie;
    struct { psv_model *m; int n_batch; const char *name; } cfg[] = {
        {m1, 1, "1 thread, one by one"}, {m2, 512, "2 threads, batch"}, {m2, 1, "2 threads, one by one"},
        {m2, 3, "2 threads, passes of 3"}, {m1, 4, "1 thread, passes of 4"}};
    for (size_t k = 0; ok && k < PSV_ARRAY_LEN(cfg); k++)
        if (eval_all(cfg[k].m, all, n, cfg[k].n_batch, lg, tag))
            CHECKF(memcmp(lg, ref_lg, bytes) == 0, "%s: %s differs from 1 thread, batch", tag, cfg[k].name);

    // positions with a reference summary: prompt_logits[i] at i, gen_logits[s] at np - 1 + s
    const json_value *pl = json_get(cs, "prompt_logits"), *gl = json_get(cs, "gen_logits");
    size_t n_ref = json_len(pl) + (json_len(gl) ? json_len(gl) - 1 : 0);
    bool strict_all = true;
    for (size_t i = 0; ok && i < n_ref && i < n; i++) {
        const json_value *ref = i < json_len(pl) ? json_at(pl, i) : json_at(gl, i - (np - 1));
        bool argmax_bad;
        double d = position_diff(ref_lg + i * (size_t)nv, nv, ref, &argmax_bad);
        bool strict = d <= TOL_LOGIT && !argmax_bad;
        st->positions++;
        st->strict_ok += strict;
        strict_all &= strict;
        if (d > st->max_diff) st->max_diff = d;
        if ((int64_t)i < first_tie) {
            st->asserted++;
            CHECKF(strict, "%s pos %zu: difference %.4f%s before any rounding near-tie", tag, i, d,
                   argmax_bad ? " and arg-max differs" : "");
        }
        CHECKF(d <= TOL_LOOSE, "%s pos %zu: difference %.4f exceeds %.1f", tag, i, d, TOL_LOOSE);
    }
    st->cases++;
    st->cases_strict += strict_all;

    // Free-running greedy: equals gen_ids until the reference margin drops below TOL_MARGIN
    // or a near-tie could have changed the computation.
    psv_ctx *c = NULL;
    psv_sampler *smp = NULL;
    psv_error err = {0};
    psv_ctx_params cp = psv_ctx_default_params();
    cp.n_ctx = 512;
    psv_sampler_params sp = psv_sampler_default_params();
    sp.temperature = 0;
    bool gok = psv_ctx_new(m2, &cp, &c, &err) == PSV_OK && psv_sampler_new(&sp, nv, &smp, &err) == PSV_OK &&
               psv_eval(c, p, np, &err) == PSV_OK;
    CHECKF(gok, "%s greedy: %s", tag, err.message);
    for (size_t s = 0; gok && s < ng && (int64_t)(np - 1 + s) < first_tie; s++) {
        const json_value *top = json_get(json_at(gl, s), "top");
        if (json_num(json_at(json_at(top, 0), 1)) - json_num(json_at(json_at(top, 1), 1)) < TOL_MARGIN) break;
        int32_t tok = psv_sampler_sample(smp, psv_ctx_logits(c));
        CHECKF(tok == g[s], "%s greedy step %zu: %d, reference %d", tag, s, tok, g[s]);
        if (tok != g[s] || psv_eval(c, &tok, 1, &err) != PSV_OK) break;
    }
    psv_sampler_free(smp);
    psv_ctx_free(c);
    free(ref_lg);
    free(lg);
    free(all);
    free(p);
    free(g);
}

static void test_reference_models(void) {
    if (!t_shared_dir()) {
        SKIP("reference conformance: ../shared/reference is absent (set PSV_SHARED)");
        return;
    }
    bool quick = getenv("PSV_TEST_QUICK") != NULL; // sanitizer and emulator runs: first case only
    static const char *names[] = {"llama-spm-q4km", "llama-spm-q40", "phi3-q5km", "qwen2-q3km", "phi4mini-q4km", "phi2-f16"};
    ref_stats total = {0};
    for (size_t mi = 0; mi < PSV_ARRAY_LEN(names); mi++) {
        char path[4096], mpath[4096];
        snprintf(path, sizeof path, "%s/reference/expected/%s.json", t_shared_dir(), names[mi]);
        snprintf(mpath, sizeof mpath, "%s/reference/models/%s.gguf", t_shared_dir(), names[mi]);
        char *text = NULL;
        size_t len;
        psv_error err = {0};
        json_doc *doc = NULL;
        psv_model *m1 = NULL, *m2 = NULL;
        psv_model_params mp1 = {1}, mp2 = {2};
        bool ok = plat_read_file(path, &text, &len, &err) == PSV_OK && json_parse(text, len, &doc, &err) == PSV_OK &&
                  psv_model_open(mpath, &mp1, &m1, &err) == PSV_OK && psv_model_open(mpath, &mp2, &m2, &err) == PSV_OK;
        CHECKF(ok, "%s: %s", names[mi], err.message);
        const json_value *cases = json_get(json_root(doc), "cases");
        ref_stats st = {0};
        for (size_t ci = 0; ok && ci < json_len(cases); ci++) {
            if (quick && ci > 0) {
                SKIP("%s/%s: PSV_TEST_QUICK runs only the first case", names[mi], json_str(json_get(json_at(cases, ci), "name")));
                continue;
            }
            run_case(m1, m2, names[mi], json_at(cases, ci), &st);
        }
        printf("reference %-15s %d/%d cases and %d/%d positions within the contract (%d asserted before a near-tie); "
               "largest logit difference %.4f\n",
               names[mi], st.cases_strict, st.cases, st.strict_ok, st.positions, st.asserted, st.max_diff);
        total.cases += st.cases, total.cases_strict += st.cases_strict, total.positions += st.positions;
        total.strict_ok += st.strict_ok, total.asserted += st.asserted;
        psv_model_close(m2);
        psv_model_close(m1);
        json_doc_free(doc);
        free(text);
    }
    printf("reference total: %d/%d cases and %d/%d positions within the contract; %d positions asserted strictly, "
           "all within %.1f\n",
           total.cases_strict, total.cases, total.strict_ok, total.positions, total.asserted, TOL_LOOSE);
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

// tests/bench_simd.c — speed of the dot-product kernels and quantizers of every kernel set this
// CPU supports (a benchmark: prints measurements, asserts nothing).
//
// For each weight type: ns per weight value for
//   hot    one 4096-value row against one activation row, both in L1 (compute bound);
//   gemv   a 4096 x 16384 matrix against one activation row, one thread (64M values, more
//          than a large L3 holds, so it streams from memory as token generation does);
//   rows4  the same matrix against 4 activation rows with vec_dot_rows (prompt processing),
//          per weight value and activation row;
//   gemv1  the same matrix against one activation row as generation of one sequence computes
//          it (the set's gemv1 kernels: the whole matrix a call, four rows a step, one from each
//          quarter of it), for sets and types that have them.
//   g1hot  the gemv1 kernel on the matrix's first 64 rows, in the cache: its arithmetic alone
//          (gemv1 against g1hot shows how much of the streamed time is memory).
// and, for sets with GEMM kernels:
//   pack   packing a panel's rows of the matrix (k_traits.panel_rows: 8; 16 for the amx set and the
//          AVX2 set's quantized types), in L1/L2, per weight value;
//   gemmR  the set's rows a call (k_traits.gemm_rows, R = 4 to 6, the amx set's 32) of activation
//          rows against that panel, per weight value and activation row;
//   mat4   the whole matrix against 4 activation rows as a decode step of 4 sequences does it
//          (mm_gemm_task: pack a panel, prefetch the next while computing), per weight value and row.
//   pp128  the matrix's first 256 rows against 128 different activation rows as a prompt's
//          product does it (mm_gemm_task: each panel packed once, then the rows in calls of the
//          set's gemm_rows, each call's from the L2 cache), per weight value and row. gemmR
//          takes the same few rows again and again, from L1. Neither is the whole of a prompt:
//          a kernel change both showed 4 % faster made qwen2-0.5b's prompts 4 % slower (README,
//          the forty-fourth session), so a change is judged by `pensieve bench`, alternated.
// Then the activation quantizers and the element-wise kernels (exp, SwiGLU), ns per value.
// Times are this thread's CPU time, the best of several trials (the machine may be shared).
// Usage: bench_simd [seconds per measurement, default 0.5] [type ...: only these, e.g. Q4_K Q6_K]
// PSV_BENCH_N=N sets the row length (default 4096; e.g. 896, qwen2-0.5b's): the types whose
// blocks do not divide it are skipped.
#define PSV_TESTING
#define PSV_NO_MAIN
#include "pensieve.c"

static uint64_t bs_rng_state = 1;
static uint64_t bs_rng(void) {
    uint64_t z = (bs_rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Random floats quantized to the type: valid blocks with realistic scales.
static void *bs_row(uint32_t type, int64_t n, int64_t rows) {
    uint64_t rs = 0;
    PSV_ASSERT(type_row_size(type, (uint64_t)n, &rs));
    uint8_t *p = malloc((size_t)(rs * (uint64_t)rows));
    float *f = malloc((size_t)n * sizeof *f);
    PSV_ASSERT(p && f);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < n; i++) f[i] = (float)((int64_t)(bs_rng() >> 40) - (1 << 23)) / (float)(1 << 23);
        k_traits_ref(type)->from_float(f, p + (size_t)r * rs, n);
    }
    free(f);
    return p;
}

static volatile float bs_sink;

// This thread's CPU time: on a shared machine, time spent descheduled does not count.
static double bs_cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

// CPU seconds per call of fn(ctx): the fastest of 7 trials of about secs/7 each, so that other
// processes on a shared machine disturb the figure as little as possible. The clock is read
// once per batch of calls lasting about 1 ms (reading it is a system call, slower than the
// shortest kernels).
static double bs_time(void (*fn)(void *), void *ctx, double secs) {
    double t0 = bs_cpu_now();
    fn(ctx);
    double once = bs_cpu_now() - t0;
    int64_t batch = once > 1e-3 ? 1 : once > 1e-7 ? (int64_t)(1e-3 / once) : 10000;
    double best = 1e30;
    for (int trial = 0; trial < 7; trial++) {
        int64_t reps = 0;
        double t;
        t0 = bs_cpu_now();
        do {
            for (int64_t k = 0; k < batch; k++) fn(ctx);
            reps += batch;
        } while ((t = bs_cpu_now() - t0) < secs / 7);
        if (t / (double)reps < best) best = t / (double)reps;
    }
    return best;
}

typedef struct {
    const k_traits *tr;
    uint32_t wt;
    int64_t n, n_out;
    const uint8_t *w, *a;
    size_t xs, ys;
    float *out;
    const float *x;
    uint8_t *q;
    uint8_t *panel, *side; // GEMM: a panel buffer, the activation rows' k_act_side
    size_t side_stride;
    uint8_t *vnni; // GEMM on traits with act_vnni: the activation rows in k_act_vnni groups of 16
} bs_ctx;

static void bs_hot(void *p) {
    bs_ctx *c = p;
    for (int i = 0; i < 64; i++) c->tr->vec_dot(c->n, &c->out[i], c->w, c->a);
}
static void bs_gemv(void *p) {
    bs_ctx *c = p;
    for (int64_t o = 0; o < c->n_out; o++) c->tr->vec_dot(c->n, &c->out[o], c->w + (size_t)o * c->xs, c->a);
}
static void bs_rows4(void *p) {
    bs_ctx *c = p;
    for (int64_t o = 0; o < c->n_out; o++)
        k_dot_rows(c->tr, c->n, &c->out[o], c->n_out, c->w + (size_t)o * c->xs, c->a, c->ys, 4);
}
static void bs_gemv1(void *p) {
    bs_ctx *c = p;
    c->tr->gemv1(c->n, c->out, c->w, c->xs, (int)c->n_out, 0, k_gemv1_groups((int)c->n_out), c->a, c->side);
}
#define BS_HOT_ROWS 64
static void bs_gemv1_hot(void *p) {
    bs_ctx *c = p;
    c->tr->gemv1(c->n, c->out, c->w, c->xs, BS_HOT_ROWS, 0, k_gemv1_groups(BS_HOT_ROWS), c->a, c->side);
}
static void bs_pack(void *p) {
    bs_ctx *c = p;
    c->tr->pack(c->n, c->w, c->xs, c->tr->panel_rows, c->panel);
}
static void bs_gemm(void *p) {
    bs_ctx *c = p;
    float *out[K_GEMM_ROWS_MAX];
    for (int r = 0; r < c->tr->gemm_rows; r++) out[r] = c->out + c->tr->panel_rows * r;
    c->tr->gemm(c->n, c->panel, c->vnni ? c->vnni : c->a, c->ys, c->side, c->side_stride, c->tr->gemm_rows, out,
                c->tr->panel_rows, NULL);
}
static void bs_mat4(void *p) { // the engine's own GEMM loop (mm_gemm_task), on one thread
    bs_ctx *c = p;
    mtensor w = {.data = c->w, .type = c->wt, .n_in = c->n, .n_out = c->n_out, .row_size = c->xs, .name = "bench"};
    mm_job j = {.w = &w, .xq = c->a, .xq_row = c->ys, .n_tok = 4, .y = c->out, .y_stride = c->n_out, .tr = mm_traits(c->tr, 4),
                .sides = c->side, .side_stride = c->side_stride, .panels = c->panel, .panel_size = k_panel_bytes(c->tr, c->wt, c->n)};
    mm_gemm_task(&j, 0, 1);
}
#define BS_PP_ROWS 128
#define BS_PP_OUT 256
static void bs_pp(void *p) { // a prompt's product (mm_gemm_task), one thread
    bs_ctx *c = p;
    mtensor w = {.data = c->w, .type = c->wt, .n_in = c->n, .n_out = BS_PP_OUT, .row_size = c->xs, .name = "bench"};
    mm_job j = {.w = &w, .xq = c->a, .xq_row = c->ys, .n_tok = BS_PP_ROWS, .y = c->out, .y_stride = BS_PP_OUT,
                .tr = mm_traits(c->tr, BS_PP_ROWS), .sides = c->side, .side_stride = c->side_stride, .panels = c->panel,
                .panel_size = k_panel_bytes(c->tr, c->wt, c->n), .vnni = c->vnni};
    mm_gemm_task(&j, 0, 1);
}
// The one-row side data of c's first activation row, for the gemv1 kernels (bs_free frees it).
static void bs_setup_gemv1(bs_ctx *c) {
    const uint32_t at = k_traits_ref(c->wt)->vec_dot_type;
    c->side = aligned_alloc(64, (k_act_side_one(at, c->n) + 63) & ~(size_t)63); // as the engine's (k_act_side_k)
    PSV_ASSERT(c->side);
    k_act_side(at, k_panel_off(c->wt), c->a, c->n, c->side, true);
}
// For the GEMM kernels: a panel buffer, aligned as the engine's, the side data of c's
// BS_PP_ROWS activation rows and, where the set wants them, their k_act_vnni groups (gemmR's
// group: rows 0-15; pp128's: all of them, 16 a group). bs_free frees them. The panel is packed
// by bs_pack (gemmR takes what it holds; pp128 packs its own).
static void bs_setup_gemm(bs_ctx *c) {
    const uint32_t at = k_traits_ref(c->wt)->vec_dot_type;
    c->side_stride = k_act_side_stride(c->tr, c->n, true);
    c->panel = aligned_alloc(64, (k_panel_bytes(c->tr, c->wt, c->n) + 63) & ~(size_t)63);
    c->side = malloc(BS_PP_ROWS * c->side_stride);
    PSV_ASSERT(c->panel && c->side);
    for (int r = 0; r < BS_PP_ROWS; r++) {
        k_act_side(at, k_panel_off(c->wt), c->a + (size_t)r * c->ys, c->n, c->side + (size_t)r * c->side_stride, false);
        if (c->tr->side_w16) k_act_side_w16(c->a + (size_t)r * c->ys, c->n, c->side + (size_t)r * c->side_stride);
    }
    if (c->tr->act_vnni) {
        PSV_ASSERT(c->tr->gemm_rows == 16 && (c->vnni = aligned_alloc(64, BS_PP_ROWS / 16 * k_act_vnni_size(c->n))));
        for (int r = 0; r < BS_PP_ROWS; r++)
            k_act_vnni(c->a + (size_t)r * c->ys, c->n, r % 16, k_act_vnni_at(c->vnni, c->n, r));
    }
}
static void bs_free(bs_ctx *c) {
    free(c->panel);
    free(c->side);
    free(c->vnni);
    c->panel = c->side = c->vnni = NULL;
}

typedef struct {
    const k_vec_ops *ops;
    int op;
    int64_t n;
    const float *g, *u;
    float *y;
} bs_vec_ctx;
static void bs_vec(void *p) {
    bs_vec_ctx *c = p;
    if (c->op) c->ops->swiglu(c->y, c->g, c->u, c->n);
    else c->ops->expf(c->y, c->g, c->n);
}
static void bs_quant(void *p) {
    bs_ctx *c = p;
    c->tr->from_float(c->x, c->q, c->n);
}

int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 0.5;
    const plat_cpu *cpu = plat_cpu_get();
    static const uint32_t types[] = {T_Q4_0, T_Q4_1, T_Q5_0, T_Q5_1, T_Q8_0, T_Q2_K, T_Q3_K,
                                     T_Q4_K, T_Q5_K, T_Q6_K, T_F16, T_BF16, T_F32};
    const char *ne = getenv("PSV_BENCH_N");
    const int64_t n = ne ? atoll(ne) : 4096, n_out = 16384;
    if (n < 32 || n % 32 != 0 || n > (1 << 20)) {
        fprintf(stderr, "bench_simd: PSV_BENCH_N=%s: need a multiple of 32 from 32 to 1048576\n", ne);
        return 2;
    }
    printf("kernel sets on this CPU:");
    for (int s = 0; s < K_SET_COUNT; s++)
        if (k_set_supported((k_set)s, cpu)) printf(" %s", k_set_names[s]);
    printf(" (rows of %lld values)\n%-6s %-7s %10s %10s %10s %10s %10s %10s %10s %10s %10s\n", (long long)n, "type", "set",
           "hot ns/v", "gemv ns/v", "rows4 ns/v", "gemv1 ns/v", "g1hot ns/v", "pack ns/v", "gemmR ns/v", "mat4 ns/v", "pp128 ns/v");
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        uint32_t wt = types[ti], at = k_traits_ref(wt)->vec_dot_type;
        bool chosen = argc <= 2;
        for (int i = 2; i < argc; i++) chosen |= strcmp(argv[i], type_get(wt)->name) == 0;
        if (!chosen) continue;
        if (n % type_table[wt].blck_size != 0) {
            printf("%-6s (skipped: its blocks of %d do not divide %lld)\n", type_get(wt)->name, (int)type_table[wt].blck_size,
                   (long long)n);
            continue;
        }
        uint64_t xs = 0, ys = 0;
        type_row_size(wt, (uint64_t)n, &xs);
        type_row_size(at, (uint64_t)n, &ys);
        uint8_t *w = bs_row(wt, n, n_out), *a = bs_row(at, n, BS_PP_ROWS); // (rows 0.. K_GEMM_ROWS_MAX - 1: gemmR's)
        for (int s = 0; s < K_SET_COUNT; s++) {
            if (!k_set_supported((k_set)s, cpu)) continue;
            static float out[4 * 16384];
            bs_ctx c = {.tr = k_traits_of_set((k_set)s, wt), .wt = wt, .n = n, .n_out = n_out, .w = w, .a = a,
                        .xs = (size_t)xs, .ys = (size_t)ys, .out = out};
            double hot = bs_time(bs_hot, &c, secs) * 1e9 / (double)(64 * n);
            double gemv = bs_time(bs_gemv, &c, secs) * 1e9 / (double)(n * n_out);
            double rows4 = bs_time(bs_rows4, &c, secs) * 1e9 / (double)(n * n_out * 4);
            printf("%-6s %-7s %10.4f %10.4f %10.4f", type_get(wt)->name, k_set_names[s], hot, gemv, rows4);
            if (c.tr->gemv1) {
                bs_setup_gemv1(&c);
                printf(" %10.4f", bs_time(bs_gemv1, &c, secs) * 1e9 / (double)(n * n_out));
                printf(" %10.4f", bs_time(bs_gemv1_hot, &c, secs) * 1e9 / (double)(n * BS_HOT_ROWS));
                bs_free(&c);
            } else if (c.tr->gemm) {
                printf(" %10s %10s", "-", "-");
            }
            if (c.tr->gemm) {
                bs_setup_gemm(&c);
                double pack = bs_time(bs_pack, &c, secs) * 1e9 / (double)(n * c.tr->panel_rows);
                double gemm = bs_time(bs_gemm, &c, secs) * 1e9 / (double)(n * c.tr->panel_rows * c.tr->gemm_rows);
                double mat4 = bs_time(bs_mat4, &c, secs) * 1e9 / (double)(n * n_out * 4);
                double pp = bs_time(bs_pp, &c, secs) * 1e9 / (double)(n * BS_PP_OUT * BS_PP_ROWS);
                printf(" %10.4f %10.4f %10.4f %10.4f", pack, gemm, mat4, pp);
                bs_free(&c);
            }
            printf("\n");
            bs_sink = out[0];
        }
        free(w);
        free(a);
    }
    if (argc > 2) return 0; // (types named: only their rows)
    const int64_t nq = 4096; // (whatever PSV_BENCH_N says)
    // activation quantizers: ns per value on a 4096-value row
    printf("\n%-6s %-7s %10s\n", "quant", "set", "ns/v");
    static const uint32_t acts[] = {T_Q8_0, T_Q8_1, T_Q8_K, T_F16, T_BF16};
    float *x = malloc((size_t)nq * sizeof *x);
    uint8_t *q = malloc((size_t)nq * 4);
    for (int64_t i = 0; i < nq; i++) x[i] = (float)((int64_t)(bs_rng() >> 40) - (1 << 23)) / (float)(1 << 20);
    for (size_t ai = 0; ai < sizeof acts / sizeof acts[0]; ai++)
        for (int s = 0; s < K_SET_COUNT; s++) {
            if (!k_set_supported((k_set)s, cpu)) continue;
            bs_ctx c = {.tr = k_traits_of_set((k_set)s, acts[ai]), .wt = acts[ai], .n = nq, .x = x, .q = q};
            double t = bs_time(bs_quant, &c, secs);
            printf("%-6s %-7s %10.4f\n", type_get(acts[ai])->name, k_set_names[s], t * 1e9 / (double)nq);
        }
    // element-wise kernels: ns per value on 4096 values in [-8, 8)
    printf("\n%-6s %-7s %10s\n", "vec", "set", "ns/v");
    float *g = malloc((size_t)nq * sizeof *g), *o = malloc((size_t)nq * sizeof *o);
    for (int64_t i = 0; i < nq; i++) g[i] = x[i] * 0.005f;
    for (int op = 0; op < 2; op++)
        for (int s = 0; s < K_SET_COUNT; s++) {
            if (!k_set_supported((k_set)s, cpu)) continue;
            bs_vec_ctx c = {k_vec_of_set((k_set)s), op, nq, g, x, o};
            double t = bs_time(bs_vec, &c, secs);
            printf("%-6s %-7s %10.4f\n", op ? "swiglu" : "exp", k_set_names[s], t * 1e9 / (double)nq);
        }
    free(g);
    free(o);
    free(x);
    free(q);
    return 0;
}

// tools/kernel_ab.c — two builds of a kernel timed in one process, in alternating trials: the way
// a kernel change is measured on a shared machine, where one binary's time moves by 10-20 % from
// run to run and two builds loaded together agree within 1 % (PERFORMANCE.md, the fifty-sixth
// session). tools/kernel_ab.sh builds it and runs it; this file is both of its parts:
//
// - with -DAB_LIB, a shared object of one version of the kernels: it includes that version's
//   tests/bench_simd.c (and so its pensieve.c; its `main` renamed by -Dmain=ab_bench_main) and
//   exports ab_setup, ab_run, ab_units and ab_digest, which set up and run one of bench_simd's
//   measurements;
// - without it, the driver: kernel_ab A.so B.so SET TYPE MODE [N] [TRIALS] loads both, sets up
//   the same measurement in each (the same random rows: bench_simd's generator starts from the
//   same seed), checks that both compute the same outputs (a digest of them: the kernels are
//   bit-identical to the reference, so two versions must agree), then times TRIALS trials of
//   each (default 200), alternating, each of about 2 ms of this thread's CPU time, and prints
//   each build's minimum, 10th percentile and median, ns per weight value (and activation row,
//   for gemmR and pp128), and B / A of each. A benchmark: it asserts nothing but the digests.
//
// MODE: hot (vec_dot, 64 times one row, in L1), g1hot (the gemv1 kernel on 64 rows, in the
// cache), gemv1 (the gemv1 kernel on a matrix of AB_G1_BYTES, read from memory as generation
// reads its weights: bench_simd's random rows repeated, each build its own copy, in 2 MiB pages
// where the system gives them, in 4 KiB pages with AB_SMALL_PAGES=1), gemmR (the GEMM kernel on one panel and the set's rows a call, in L1), pp128 (a
// prompt's product: 256 weight rows by 128 activation rows, panels packed as the engine does).
// N: the row length (default 4096; 896 is qwen2-0.5b's).
#if defined(AB_LIB)
#include "bench_simd.c"
#include <strings.h>

#define AB_EXPORT __attribute__((visibility("default")))

static bs_ctx ab_c;
static void (*ab_fn)(void *);
static double ab_unit_count;
static uint8_t *ab_w, *ab_a, *ab_big;
static float *ab_out;
static size_t ab_out_n = 4 * 16384; // outputs (gemv1: one a row of its matrix)
#define AB_G1_BYTES ((size_t)128 << 20) // gemv1's matrix: past the last-level caches of the machines measured

// 0 when the measurement is set up; else a message on stderr and nonzero.
AB_EXPORT int ab_setup(const char *set, const char *type, const char *mode, long long n) {
    const plat_cpu *cpu = plat_cpu_get();
    int s = -1;
    for (int i = 0; i < K_SET_COUNT; i++)
        if (strcmp(k_set_names[i], set) == 0) s = i;
    uint32_t wt = UINT32_MAX;
    for (uint32_t t = 0; t < T_COUNT; t++)
        if (type_table[t].name && strcasecmp(type_table[t].name, type) == 0) wt = t;
    if (s < 0 || !k_set_supported((k_set)s, cpu)) return fprintf(stderr, "kernel_ab: no kernel set '%s' on this CPU\n", set), 1;
    if (wt == UINT32_MAX || !type_table[wt].supported || !k_traits_ref(wt) || !k_traits_ref(wt)->vec_dot || !k_traits_ref(wt)->from_float)
        return fprintf(stderr, "kernel_ab: no weight type '%s'\n", type), 1;
    const long long bk = type_table[wt].blck_size;
    if (n < bk || n % bk != 0 || n > 65536)
        return fprintf(stderr, "kernel_ab: N=%lld: %s needs a multiple of %lld up to 65536\n", n, type_table[wt].name, bk), 1;
    const uint32_t at = k_traits_ref(wt)->vec_dot_type;
    uint64_t xs = 0, ys = 0;
    type_row_size(wt, (uint64_t)n, &xs);
    type_row_size(at, (uint64_t)n, &ys);
    ab_w = bs_row(wt, n, BS_PP_OUT);
    ab_a = bs_row(at, n, BS_PP_ROWS);
    ab_c = (bs_ctx){.tr = k_traits_of_set((k_set)s, wt), .wt = wt, .n = n, .n_out = BS_PP_OUT, .w = ab_w, .a = ab_a,
                    .xs = (size_t)xs, .ys = (size_t)ys}; // (.out: below, sized for the mode)
    const k_traits *tr = ab_c.tr;
    if (strcmp(mode, "gemv1") == 0) {
        if (!tr->gemv1) return fprintf(stderr, "kernel_ab: set %s has no gemv1 kernel for %s\n", set, type), 1;
        const size_t rows = AB_G1_BYTES / (size_t)xs / 4 * 4; // (at least 4 * 256 rows: n <= 65536)
        // in 2 MiB pages where the system gives them, as a model's mapping mostly is (the page
        // cache's large folios), or with AB_SMALL_PAGES=1 in 4 KiB pages, as the rest of it is
        // (the page walks then load the core too: PERFORMANCE.md, the sixtieth session)
        ab_big = aligned_alloc((size_t)2 << 20, AB_G1_BYTES);
        PSV_ASSERT(ab_big);
#if defined(MADV_HUGEPAGE) && defined(MADV_NOHUGEPAGE)
        const char *sp = getenv("AB_SMALL_PAGES");
        (void)madvise(ab_big, AB_G1_BYTES, sp && strcmp(sp, "1") == 0 ? MADV_NOHUGEPAGE : MADV_HUGEPAGE);
#endif
        for (size_t r = 0; r < rows; r++) memcpy(ab_big + r * (size_t)xs, ab_w + r % BS_PP_OUT * (size_t)xs, (size_t)xs);
        ab_c.w = ab_big, ab_c.n_out = (int64_t)rows, ab_out_n = rows;
        bs_setup_gemv1(&ab_c);
        ab_fn = bs_gemv1, ab_unit_count = (double)rows * (double)n;
    } else if (strcmp(mode, "hot") == 0) {
        ab_fn = bs_hot, ab_unit_count = 64.0 * (double)n;
    } else if (strcmp(mode, "g1hot") == 0) {
        if (!tr->gemv1) return fprintf(stderr, "kernel_ab: set %s has no gemv1 kernel for %s\n", set, type), 1;
        bs_setup_gemv1(&ab_c);
        ab_fn = bs_gemv1_hot, ab_unit_count = (double)BS_HOT_ROWS * (double)n;
    } else if (strcmp(mode, "gemmR") == 0 || strcmp(mode, "pp128") == 0) {
        if (!tr->gemm) return fprintf(stderr, "kernel_ab: set %s has no GEMM kernel for %s\n", set, type), 1;
        bs_setup_gemm(&ab_c);
        bs_pack(&ab_c); // (gemmR's panel)
        if (mode[0] == 'g') ab_fn = bs_gemm, ab_unit_count = (double)n * tr->panel_rows * tr->gemm_rows;
        else ab_fn = bs_pp, ab_unit_count = (double)n * BS_PP_OUT * BS_PP_ROWS;
    } else {
        return fprintf(stderr, "kernel_ab: unknown mode '%s' (hot, g1hot, gemv1, gemmR, pp128)\n", mode), 1;
    }
    ab_out = calloc(ab_out_n, sizeof *ab_out);
    PSV_ASSERT(ab_out);
    ab_c.out = ab_out;
    return 0;
}

AB_EXPORT void ab_run(long long reps) {
    for (long long i = 0; i < reps; i++) ab_fn(&ab_c);
}

// Weight values (times activation rows) a call of the measurement computes.
AB_EXPORT double ab_units(void) { return ab_unit_count; }

// FNV-1a of the outputs' bits, after one call on zeroed outputs.
AB_EXPORT unsigned long long ab_digest(void) {
    memset(ab_out, 0, ab_out_n * sizeof *ab_out);
    ab_fn(&ab_c);
    const uint8_t *b = (const uint8_t *)ab_out;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < ab_out_n * sizeof *ab_out; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

#else // the driver

#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    const char *path;
    int (*setup)(const char *, const char *, const char *, long long);
    void (*run)(long long);
    double (*units)(void);
    unsigned long long (*digest)(void);
    double *t; // seconds a call, by trial
} ab_build;

static double ab_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int ab_load(ab_build *b) {
    char path[4096]; // (a name without a slash would be looked for on the library path)
    if (snprintf(path, sizeof path, "%s%s", strchr(b->path, '/') ? "" : "./", b->path) >= (int)sizeof path)
        return fprintf(stderr, "kernel_ab: %s: path too long\n", b->path), 1;
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) return fprintf(stderr, "kernel_ab: %s\n", dlerror()), 1;
    *(void **)&b->setup = dlsym(h, "ab_setup");
    *(void **)&b->run = dlsym(h, "ab_run");
    *(void **)&b->units = dlsym(h, "ab_units");
    *(void **)&b->digest = dlsym(h, "ab_digest");
    if (!b->setup || !b->run || !b->units || !b->digest)
        return fprintf(stderr, "kernel_ab: %s: not built from tools/kernel_ab.c with -DAB_LIB\n", b->path), 1;
    return 0;
}

static int ab_cmp(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

int main(int argc, char **argv) {
    if (argc < 6 || argc > 8) {
        fprintf(stderr, "usage: kernel_ab A.so B.so SET TYPE MODE [N] [TRIALS]\n"
                        "  MODE: hot, g1hot, gemv1, gemmR, pp128; N: row length (default 4096); TRIALS: default 200\n");
        return 2;
    }
    const long long n = argc > 6 ? atoll(argv[6]) : 4096;
    const int trials = argc > 7 ? atoi(argv[7]) : 200;
    if (trials < 1 || trials > 100000) return fprintf(stderr, "kernel_ab: TRIALS=%s: need 1 to 100000\n", argv[7]), 2;
    ab_build b[2] = {{.path = argv[1]}, {.path = argv[2]}};
    for (int i = 0; i < 2; i++) {
        if (ab_load(&b[i]) || b[i].setup(argv[3], argv[4], argv[5], n)) return 1;
        if (!(b[i].t = malloc((size_t)trials * sizeof *b[i].t))) return fprintf(stderr, "kernel_ab: out of memory\n"), 1;
    }
    if (b[0].units() != b[1].units()) return fprintf(stderr, "kernel_ab: the builds measure different amounts of work\n"), 1;
    const unsigned long long d0 = b[0].digest(), d1 = b[1].digest();
    printf("outputs: %s (%016llx, %016llx)\n", d0 == d1 ? "identical" : "DIFFER", d0, d1);
    // calls a trial: about 2 ms of A's time, after a warm-up of both
    long long reps = 1;
    for (;;) {
        double t0 = ab_now();
        b[0].run(reps);
        double t = ab_now() - t0;
        if (t >= 2e-3 || reps >= (1ll << 40)) break;
        reps = t > 2e-4 ? (long long)((double)reps * 2.2e-3 / t) + 1 : reps * 10;
    }
    for (int i = 0; i < 2; i++) b[i].run(reps);
    for (int k = 0; k < trials; k++)
        for (int j = 0; j < 2; j++) {
            ab_build *x = &b[(k + j) % 2]; // (A first in even trials, B in odd ones)
            double t0 = ab_now();
            x->run(reps);
            x->t[k] = (ab_now() - t0) / (double)reps;
        }
    const double scale = 1e9 / b[0].units();
    double q[2][3];
    for (int i = 0; i < 2; i++) {
        qsort(b[i].t, (size_t)trials, sizeof *b[i].t, ab_cmp);
        q[i][0] = b[i].t[0] * scale, q[i][1] = b[i].t[trials / 10] * scale, q[i][2] = b[i].t[trials / 2] * scale;
    }
    const bool rows = strcmp(argv[5], "gemmR") == 0 || strcmp(argv[5], "pp128") == 0; // (ab_units: per activation row too)
    printf("%s %s %s n=%lld: %d trials of %lld calls each, ns a value%s\n", argv[3], argv[4], argv[5], n, trials, reps,
           rows ? " and row" : "");
    printf("%-6s %10s %10s %10s\n", "", "min", "p10", "median");
    for (int i = 0; i < 2; i++) printf("%-6s %10.5f %10.5f %10.5f\n", i ? "B" : "A", q[i][0], q[i][1], q[i][2]);
    printf("%-6s %10.4f %10.4f %10.4f\n", "B / A", q[1][0] / q[0][0], q[1][1] / q[0][1], q[1][2] / q[0][2]);
    return d0 == d1 ? 0 : 3;
}
#endif

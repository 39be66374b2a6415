// tests/test.h — the tiny test harness shared by every test program.
//
// Each test program #includes pensieve.c (with PSV_TESTING and PSV_NO_MAIN) to reach internals,
// then this file. CHECK counts a pass or prints `file:line: expr` and counts a failure. SKIP
// records a check that could not run (e.g. ../shared is absent): it is reported, never counted
// as a pass. t_finish() prints `N passed, N failed, N skipped` and returns the exit status.
#ifndef PSV_TEST_H
#define PSV_TEST_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int t_pass, t_fail, t_skip;

#define CHECK(x)                                                                  \
    do {                                                                          \
        if (x) t_pass++;                                                          \
        else {                                                                    \
            t_fail++;                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #x); \
        }                                                                         \
    } while (0)

// CHECK with a printf-style explanation printed on failure.
#define CHECKF(x, ...)                                                            \
    do {                                                                          \
        if (x) t_pass++;                                                          \
        else {                                                                    \
            t_fail++;                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #x); \
            fprintf(stderr, __VA_ARGS__);                                         \
            fputc('\n', stderr);                                                  \
        }                                                                         \
    } while (0)

#define SKIP(...)                                      \
    do {                                               \
        t_skip++;                                      \
        fprintf(stderr, "skipped: ");                  \
        fprintf(stderr, __VA_ARGS__);                  \
        fputc('\n', stderr);                           \
    } while (0)

// The ../shared directory: $PSV_SHARED, else ../shared relative to the repository root (tests
// run from the root). Returns NULL when absent so callers SKIP.
__attribute__((unused)) static const char *t_shared_dir(void) {
    const char *d = getenv("PSV_SHARED");
    if (!d || !*d) d = "../shared";
    FILE *f;
    char probe[4096];
    snprintf(probe, sizeof probe, "%s/reference/README.md", d);
    if (!(f = fopen(probe, "rb"))) return NULL;
    fclose(f);
    return d;
}

// A path under ../shared in a static buffer (one at a time), or NULL when shared is absent.
__attribute__((unused)) static const char *t_shared_path(const char *rel) {
    static char path[4096];
    const char *d = t_shared_dir();
    if (!d) return NULL;
    snprintf(path, sizeof path, "%s/%s", d, rel);
    return path;
}

static int t_finish(void) {
    printf("%d passed, %d failed, %d skipped\n", t_pass, t_fail, t_skip);
    return t_fail ? 1 : 0;
}
#endif

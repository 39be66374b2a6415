// pensieve.c — a local LLM inference server and embeddable inference library in one C11 file.
//
// pensieve loads a quantized model from the GGUF ecosystem, runs it on the CPU, and serves it
// over HTTP with Anthropic's Messages API and OpenAI's chat API. The public, embeddable API is
// pensieve.h; everything else, including `main`, is in this file.
//
// Build:
//   cc pensieve.c -o pensieve          no flags needed: libc + pthreads, no libm
//   make                               optimised binary (-O2, -march left generic: kernels are
//                                      chosen at run time by CPU detection)
//   make test                          unit, conformance and integration tests
//   make debug / make fuzz             ASan+UBSan build / libFuzzer harnesses (clang)
//
// Configuration macros (define before including, or with -D):
//   PSV_NO_MAIN     leave out `main`, the CLI and the HTTP server (tests and embedders)
//   PSV_SERVER      with PSV_NO_MAIN, keep the HTTP server (its tests and fuzz harnesses)
//   PSV_STATIC      make the public API `static` (for people who #include "pensieve.c")
//   PSV_TESTING     expose internals to tests/ (they #include this file)
//   PSV_*_MAX_*     limits, each documented where it is defined (section 1)
//
// Contents (leaf to root):
//   1. Config            limits and tunables
//   2. Platform          includes, OS and CPU specifics (the only place with #ifdef _WIN32 & co.)
//   3. Core              asserts, checked arithmetic, errors, growable buffers, byte cursor
//   4. Math              expf, logf, sqrtf, sin/cos, fp16/bf16 without libm
//   5. SHA-256           FIPS 180-4, portable and SHA-NI / ARMv8 SHA2
//   6. JSON              reader (tree) and writer (streaming into a buffer)
//   7. GGUF              type table, reader (mmap, validated), writer, `info`
//   8. Unicode           generated category tables
//   9. Tokenizers        SPM and byte-level BPE with pre-tokenizers, detokenizer
//  10. Chat templates    built-in formatters recognised from tokenizer.chat_template
//  11. Kernels           scalar reference kernels for every tensor type (the oracle)
//  12. SIMD kernels      x86 (AVX2, AVX-512) and ARM (NEON) variants, chosen at run time
//  13. Thread pool       persistent pthread workers
//  14. Model             hyper-parameters, weights, KV cache, forward pass
//  15. Sampling          greedy, temperature, top-k/p, min-p, penalties, seeded RNG
//  16. Public API        psv_* functions declared in pensieve.h
//  17. Model tools       random-weight model generator, benchmarks
//  18. Model files       cache directory, registry of known models, pull/list/verify/rm
//  19. HTTP server       Anthropic Messages and OpenAI chat APIs over HTTP/1.1 + SSE
//  20. CLI               subcommands and main

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1 // madvise, pthread affinity, getline: all in glibc behind this
#endif

#include "pensieve.h"

// Floating-point results must not depend on how the file is compiled. Compilers may fuse a
// multiply and an add into one FMA, rounding once instead of twice: GCC across statements in its
// default GNU mode at -O1 and above (not with -std=c11), clang within an expression, wherever the
// target has FMA (every AVX2/AVX-512 function here, all of aarch64). The reference models turn such
// a last-bit change into visible logit differences, so contraction is off for the whole file.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

// `cc pensieve.c -o pensieve` with no flags is an unoptimised build, 15-25x slower (-O0 is the
// compilers' default), so GCC is told to optimise every function as -O2 would when the command
// line asks for nothing (define PSV_O0 for a truly unoptimised debug build). The pragma does not
// make all of -O2 (measured: prompts at 55-70 %, generation at 75-80 % of a -O2 build's speed,
// against 4-7 % without it), so the README still says `cc -O2`. clang has no such pragma: its
// builds without flags say they are unoptimised (psv_build_note).
#if defined(__GNUC__) && !defined(__clang__) && !defined(__OPTIMIZE__) && !defined(PSV_O0)
#pragma GCC optimize("O2")
#endif
#if defined(__OPTIMIZE__) || (defined(__GNUC__) && !defined(__clang__) && !defined(PSV_O0))
#define PSV_BUILD_OPTIMISED 1
#else
#define PSV_BUILD_OPTIMISED 0
#endif

// ----------------------------------------------------------------------------
// 1. Config
// Every limit on untrusted input is a named macro so embedders can tighten it.

// GGUF files declare counts that size our allocations; these caps turn an absurd header into a
// clear error instead of a multi-terabyte malloc.
#ifndef PSV_GGUF_MAX_TENSORS
#define PSV_GGUF_MAX_TENSORS 65536
#endif
#ifndef PSV_GGUF_MAX_KV
#define PSV_GGUF_MAX_KV 65536
#endif
#ifndef PSV_GGUF_MAX_STRING // longest single metadata string (chat templates are ~10 KB)
#define PSV_GGUF_MAX_STRING (64u << 20)
#endif
#ifndef PSV_GGUF_MAX_ARRAY // largest metadata array (vocabularies reach ~260k entries)
#define PSV_GGUF_MAX_ARRAY (16u << 20)
#endif

// Most tokens per forward pass (a prompt is processed in chunks of this many): the scratch
// memory grows with it, while the GEMM kernels are as fast from about 64 rows on (measured:
// pp512 of a 0.5B model 11 % faster in chunks of 128 than in one batch of 512, with a third of
// the scratch memory).
#ifndef PSV_DEFAULT_BATCH
#define PSV_DEFAULT_BATCH 128
#endif

// JSON nesting depth: the reader recurses per level, so this bounds its stack use.
#ifndef PSV_JSON_MAX_DEPTH
#define PSV_JSON_MAX_DEPTH 128
#endif

// ----------------------------------------------------------------------------
// 2. Platform
// Includes and everything OS- or CPU-specific. Other sections call the plat_* helpers.

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#define PSV_X86 1
#include <cpuid.h>
#include <immintrin.h>
#endif
#if defined(__aarch64__) && defined(__AARCH64EL__) // (the kernels read little-endian blocks)
#define PSV_ARM64 1
#include <arm_neon.h>
#if defined(__linux__)
#include <sys/auxv.h>
#endif
#if defined(__APPLE__)
#include <sys/sysctl.h>
#endif
#endif

#if defined(PSV_NO_MAIN)
// An embedder that leaves out main also leaves some internal helpers unreferenced.
#pragma GCC diagnostic ignored "-Wunused-function"
#endif

#define PSV_UNUSED(x) ((void)(x))
// Marks an internal helper that belongs to a section's internal API but that not every build
// calls (the server uses some, tests and tools others), so -Wunused-function stays quiet for it
// while staying on for everything else.
#define PSV_MAYBE_UNUSED __attribute__((unused))
#define PSV_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define PSV_MIN(a, b) ((a) < (b) ? (a) : (b))
#define PSV_MAX(a, b) ((a) > (b) ? (a) : (b))

// Monotonic time in seconds, for rates and timeouts (never for tests).
PSV_MAYBE_UNUSED static double plat_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int plat_n_cpus(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (n > 1024 ? 1024 : (int)n);
}

// CPU features, detected once. x86: cpuid plus XGETBV so a feature counts only when the OS saves
// its register state (Intel SDM vol. 1 §13.3). ARM: hwcaps on Linux, sysctl on macOS.
typedef struct {
    bool detected;
    bool sse3, ssse3, fma, f16c, avx, avx2, avx512f, avx512bw, avx512vl, avx512vnni, avx512bf16,
        avxvnni, sha_ni;
    bool neon, dotprod, i8mm, arm_sha2, fp16;
} plat_cpu;

static plat_cpu plat_cpu_info;
static pthread_once_t plat_cpu_once = PTHREAD_ONCE_INIT;

static void plat_cpu_detect_once(void) {
    plat_cpu c;
    memset(&c, 0, sizeof c);
#if defined(PSV_X86)
    unsigned a, b, cx, d;
    if (__get_cpuid(1, &a, &b, &cx, &d)) {
        c.sse3 = (cx >> 0) & 1;
        c.ssse3 = (cx >> 9) & 1;
        c.fma = (cx >> 12) & 1;
        c.f16c = (cx >> 29) & 1;
        bool osxsave = (cx >> 27) & 1, avx_hw = (cx >> 28) & 1;
        unsigned long long xcr0 = 0;
        if (osxsave) {
            unsigned lo, hi;
            __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
            xcr0 = ((unsigned long long)hi << 32) | lo;
        }
        bool os_avx = (xcr0 & 0x6) == 0x6;      // XMM and YMM state
        bool os_avx512 = (xcr0 & 0xe6) == 0xe6; // plus opmask, ZMM_Hi256, Hi16_ZMM
        c.avx = avx_hw && os_avx;
        if (!c.avx) c.fma = c.f16c = false;
        unsigned max_leaf = __get_cpuid_max(0, NULL);
        if (max_leaf >= 7) {
            __cpuid_count(7, 0, a, b, cx, d);
            c.avx2 = c.avx && ((b >> 5) & 1);
            c.sha_ni = (b >> 29) & 1;
            c.avx512f = os_avx512 && ((b >> 16) & 1);
            c.avx512bw = c.avx512f && ((b >> 30) & 1);
            c.avx512vl = c.avx512f && ((b >> 31) & 1);
            c.avx512vnni = c.avx512f && ((cx >> 11) & 1);
            unsigned a1, b1, c1, d1;
            __cpuid_count(7, 1, a1, b1, c1, d1);
            c.avxvnni = c.avx2 && ((a1 >> 4) & 1);
            c.avx512bf16 = c.avx512f && ((a1 >> 5) & 1);
            PSV_UNUSED(b1); PSV_UNUSED(c1); PSV_UNUSED(d1);
        }
    }
#elif defined(PSV_ARM64)
    c.neon = true; // Advanced SIMD is baseline on AArch64
#if defined(__linux__)
    unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    c.fp16 = (hw >> 9) & 1;     // HWCAP_FPHP
    c.arm_sha2 = (hw >> 6) & 1; // HWCAP_SHA2
    c.dotprod = (hw >> 20) & 1; // HWCAP_ASIMDDP
    c.i8mm = (hw2 >> 13) & 1;   // HWCAP2_I8MM
#elif defined(__APPLE__)
    int v = 0;
    size_t sz = sizeof v;
    c.dotprod = true; // every Apple Silicon CPU (macOS 11 lacks the key)
    if (sysctlbyname("hw.optional.arm.FEAT_DotProd", &v, &sz, NULL, 0) == 0) c.dotprod = v;
    sz = sizeof v; v = 0;
    if (sysctlbyname("hw.optional.arm.FEAT_I8MM", &v, &sz, NULL, 0) == 0) c.i8mm = v;
    sz = sizeof v; v = 0;
    if (sysctlbyname("hw.optional.arm.FEAT_SHA256", &v, &sz, NULL, 0) == 0) c.arm_sha2 = v;
    c.fp16 = true;
#endif
#endif
    c.detected = true;
    plat_cpu_info = c;
}

static const plat_cpu *plat_cpu_get(void) {
    pthread_once(&plat_cpu_once, plat_cpu_detect_once);
    return &plat_cpu_info;
}

// A read-only mapping of a whole file. size 0 files map to data == NULL.
typedef struct {
    const uint8_t *data;
    size_t size;
    void *map; // what munmap needs (NULL when nothing is mapped)
} plat_map;

// ----------------------------------------------------------------------------
// 3. Core
// Always-on asserts, overflow-checked size arithmetic, the error record, growable buffers and a
// bounds-checked little-endian byte cursor for every binary parser.

#define PSV_ASSERT(x)                                                                      \
    do {                                                                                   \
        if (!(x)) {                                                                        \
            fprintf(stderr, "pensieve: assertion failed at %s:%d: %s\n", __FILE__, __LINE__, \
                    #x);                                                                   \
            abort();                                                                       \
        }                                                                                  \
    } while (0)

// Checked arithmetic: return false on overflow and leave *r unspecified.
static inline bool ck_add(size_t a, size_t b, size_t *r) { return !__builtin_add_overflow(a, b, r); }
static inline bool ck_mul(size_t a, size_t b, size_t *r) { return !__builtin_mul_overflow(a, b, r); }
static inline bool ck_add_u64(uint64_t a, uint64_t b, uint64_t *r) { return !__builtin_add_overflow(a, b, r); }
static inline bool ck_mul_u64(uint64_t a, uint64_t b, uint64_t *r) { return !__builtin_mul_overflow(a, b, r); }

// Fill an optional caller-owned error record. Messages follow `module: object: problem (expected
// X, got Y)`. Returns `st` so callers can write `return err_set(err, PSV_ERR_FORMAT, ...)`.
// When err already holds an error, the first one is kept: it is the cause, later ones are
// consequences.
static psv_status err_set(psv_error *err, psv_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static psv_status err_set(psv_error *err, psv_status st, const char *fmt, ...) {
    if (err && err->status == PSV_OK) {
        err->status = st;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
    }
    return st;
}

// Prefix an existing message with context ("model 'x.gguf': " + message).
static void err_prefix(psv_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void err_prefix(psv_error *err, const char *fmt, ...) {
    if (!err || err->status == PSV_OK) return;
    char pre[256], old[sizeof err->message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    memcpy(old, err->message, sizeof old);
    size_t np = strlen(pre), no = strlen(old), cap = sizeof err->message - 1;
    if (np > cap) np = cap;
    if (no > cap - np) no = cap - np;
    memcpy(err->message, pre, np);
    memcpy(err->message + np, old, no);
    err->message[np + no] = 0;
}

PSV_API const char *psv_status_name(psv_status st) {
    switch (st) {
    case PSV_OK: return "ok";
    case PSV_ERR_INVALID: return "invalid";
    case PSV_ERR_FORMAT: return "format";
    case PSV_ERR_UNSUPPORTED: return "unsupported";
    case PSV_ERR_IO: return "io";
    case PSV_ERR_NOMEM: return "nomem";
    case PSV_ERR_RANGE: return "range";
    case PSV_ERR_CANCELLED: return "cancelled";
    }
    return "unknown";
}

PSV_MAYBE_UNUSED static void err_clear(psv_error *err) {
    if (err) {
        err->status = PSV_OK;
        err->message[0] = 0;
    }
}

// A growable byte buffer with a sticky out-of-memory flag: writers append without checking each
// call and look at `oom` once at the end. data is always NUL-terminated when len > 0 or cap > 0.
typedef struct {
    char *data;
    size_t len, cap;
    bool oom;
} buf_t;

static bool buf_reserve(buf_t *b, size_t extra) {
    if (b->oom) return false;
    size_t need;
    if (!ck_add(b->len, extra, &need) || !ck_add(need, 1, &need)) {
        b->oom = true;
        return false;
    }
    if (need <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) {
        if (!ck_mul(cap, 2, &cap)) {
            cap = need;
            break;
        }
    }
    char *p = realloc(b->data, cap);
    if (!p) {
        b->oom = true;
        return false;
    }
    if (!b->data) p[0] = 0; // a fresh buffer reads as the empty string
    b->data = p;
    b->cap = cap;
    return true;
}

static void buf_append(buf_t *b, const void *p, size_t n) {
    if (!buf_reserve(b, n)) return;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = 0;
}

static void buf_puts(buf_t *b, const char *s) { buf_append(b, s, strlen(s)); }
static void buf_putc(buf_t *b, char c) { buf_append(b, &c, 1); }

static void buf_printf(buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void buf_printf(buf_t *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char tmp[256];
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        buf_append(b, tmp, (size_t)n);
        return;
    }
    if (!buf_reserve(b, (size_t)n)) return;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

static void buf_free(buf_t *b) {
    if (!b) return;
    free(b->data);
    memset(b, 0, sizeof *b);
}

// A string slice: bytes that are not necessarily NUL-terminated (GGUF strings, JSON keys).
typedef struct {
    const char *p;
    size_t n;
} str_t;

static inline str_t str_c(const char *s) { return (str_t){s, strlen(s)}; }
static inline bool str_eq(str_t a, str_t b) { return a.n == b.n && (a.n == 0 || memcmp(a.p, b.p, a.n) == 0); }
static inline bool str_eq_c(str_t a, const char *b) { return str_eq(a, str_c(b)); }

// Whole-string numbers for options and environment variables: decimal, nothing after the
// digits, within [lo, hi]; false otherwise (*out untouched).
PSV_MAYBE_UNUSED static bool str_to_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

PSV_MAYBE_UNUSED static bool str_to_f64(const char *s, double lo, double hi, double *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !(v >= lo && v <= hi)) return false;
    *out = v;
    return true;
}

PSV_MAYBE_UNUSED static bool str_to_f32(const char *s, float lo, float hi, float *out) {
    double v;
    if (!str_to_f64(s, lo, hi, &v)) return false;
    *out = (float)v;
    return true;
}

// How much of the n bytes at s to quote in a message of at most max bytes: n, or less, backing off
// so the cut never falls inside a UTF-8 sequence (an error message must stay valid text).
static size_t str_clip_utf8(const char *s, size_t n, size_t max) {
    if (n <= max) return n;
    while (max > 0 && ((unsigned char)s[max] & 0xC0) == 0x80) max--;
    return max;
}

// A malloc'd NUL-terminated copy of a slice (NULL on out-of-memory).
static char *str_dup(str_t s) {
    char *r = malloc(s.n + 1);
    if (!r) return NULL;
    if (s.n) memcpy(r, s.p, s.n);
    r[s.n] = 0;
    return r;
}

// A bounds-checked little-endian reader over untrusted bytes. Every read checks the remaining
// length first; after the first failure `bad` stays set and reads return zeros, so a parser can
// read a group of fields and check once.
typedef struct {
    const uint8_t *p;
    size_t n, off;
    bool bad;
} rd_t;

static bool rd_need(rd_t *r, size_t k) {
    if (r->bad || r->n - r->off < k) {
        r->bad = true;
        return false;
    }
    return true;
}
PSV_MAYBE_UNUSED static uint8_t rd_u8(rd_t *r) { return rd_need(r, 1) ? r->p[r->off++] : 0; }
PSV_MAYBE_UNUSED static uint16_t rd_u16(rd_t *r) {
    if (!rd_need(r, 2)) return 0;
    const uint8_t *q = r->p + r->off;
    r->off += 2;
    return (uint16_t)(q[0] | (q[1] << 8));
}
static uint32_t rd_u32(rd_t *r) {
    if (!rd_need(r, 4)) return 0;
    const uint8_t *q = r->p + r->off;
    r->off += 4;
    return (uint32_t)q[0] | ((uint32_t)q[1] << 8) | ((uint32_t)q[2] << 16) | ((uint32_t)q[3] << 24);
}
static uint64_t rd_u64(rd_t *r) {
    uint64_t lo = rd_u32(r), hi = rd_u32(r);
    return lo | (hi << 32);
}
PSV_MAYBE_UNUSED static float rd_f32(rd_t *r) {
    uint32_t u = rd_u32(r);
    float f;
    memcpy(&f, &u, 4);
    return f;
}
PSV_MAYBE_UNUSED static double rd_f64(rd_t *r) {
    uint64_t u = rd_u64(r);
    double f;
    memcpy(&f, &u, 8);
    return f;
}
// A slice of k bytes in place (no copy); NULL and bad on overrun.
static const uint8_t *rd_bytes(rd_t *r, size_t k) {
    if (!rd_need(r, k)) return NULL;
    const uint8_t *q = r->p + r->off;
    r->off += k;
    return q;
}

// Little-endian stores, for writers.
static void wr_u16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static void wr_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void wr_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t ld_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t ld_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t ld_u64(const uint8_t *p) { return (uint64_t)ld_u32(p) | ((uint64_t)ld_u32(p + 4) << 32); }

// Whole-file helpers. plat_map_file maps read-only; a size-0 file gives an empty map.
static psv_status plat_map_file(const char *path, plat_map *m, psv_error *err) {
    memset(m, 0, sizeof *m);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return err_set(err, PSV_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return err_set(err, PSV_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return err_set(err, PSV_ERR_IO, "%s: not a regular file", path);
    }
    if (st.st_size > 0) {
        if ((uint64_t)st.st_size > (uint64_t)SIZE_MAX) {
            close(fd);
            return err_set(err, PSV_ERR_IO, "%s: file too large to map", path);
        }
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return err_set(err, PSV_ERR_IO, "%s: cannot mmap %lld bytes: %s", path,
                           (long long)st.st_size, strerror(e));
        }
        m->map = p;
        m->data = p;
        m->size = (size_t)st.st_size;
    }
    close(fd);
    return PSV_OK;
}

static void plat_unmap(plat_map *m) {
    if (m && m->map) munmap(m->map, m->size);
    if (m) memset(m, 0, sizeof *m);
}

// Takes the whole pages of the first len bytes of a mapping out of this process's resident set
// (a model file's metadata, read once at open: 15 MB of qwen2's 345, mostly its vocabulary,
// which the tokenizer has copied). They stay in the page cache, and a later read maps them in
// again: the mapping is private and read-only, so none of its pages differs from the file.
static void plat_map_release(const plat_map *m, size_t len) {
#ifdef MADV_DONTNEED
    const long pg = sysconf(_SC_PAGESIZE);
    if (!m->map || pg <= 0) return;
    len = PSV_MIN(len, m->size) / (size_t)pg * (size_t)pg;
    if (len > 0) (void)madvise(m->map, len, MADV_DONTNEED);
#else
    PSV_UNUSED(m), PSV_UNUSED(len);
#endif
}

// Page tables filled ahead of use. A fresh mapping of a file that is already in the page cache
// still takes a fault on first touch of each 64 KiB (Linux maps 16 pages around a fault): about
// 38,000 faults and 0.1 s of kernel time for a 2.3 GiB model, which the first prompt would pay
// on its own threads. A helper thread touches a byte of every 4 KiB from front to back (the
// order a forward pass reads the weights in) while the caller goes on; on a file not yet in the
// page cache this reads it ahead. plat_prefault_stop asks the helper to stop, which it does
// within one 16 MiB chunk, and waits for it. A hint only: if the thread cannot start, pages
// fault in as they are used.
typedef struct {
    const uint8_t *p;
    size_t n;
    atomic_bool stop;
    bool running;
    pthread_t thread;
} plat_prefault;

static void *plat_prefault_main(void *arg) {
    plat_prefault *pf = arg;
    const size_t chunk = (size_t)16 << 20;
    for (size_t at = 0; at < pf->n && !atomic_load_explicit(&pf->stop, memory_order_relaxed); at += chunk) {
        size_t end = pf->n - at < chunk ? pf->n : at + chunk;
        for (size_t i = at; i < end; i += 4096) (void)*(const volatile uint8_t *)(pf->p + i);
    }
    return NULL;
}

static void plat_prefault_start(plat_prefault *pf, const uint8_t *p, size_t n) {
    pf->p = p;
    pf->n = n;
    atomic_store(&pf->stop, false);
    pf->running = n > 0 && pthread_create(&pf->thread, NULL, plat_prefault_main, pf) == 0;
}

static void plat_prefault_stop(plat_prefault *pf) {
    if (!pf->running) return;
    atomic_store(&pf->stop, true);
    pthread_join(pf->thread, NULL);
    pf->running = false;
}

// Read a whole file (or stdin for "-") into a malloc'd NUL-terminated buffer.
static psv_status plat_read_file(const char *path, char **out, size_t *out_len, psv_error *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f) return err_set(err, PSV_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    buf_t b = {0};
    char tmp[65536];
    size_t k;
    while ((k = fread(tmp, 1, sizeof tmp, f)) > 0) buf_append(&b, tmp, k);
    bool failed = ferror(f);
    if (f != stdin) fclose(f);
    if (failed) {
        buf_free(&b);
        return err_set(err, PSV_ERR_IO, "%s: read error", path);
    }
    if (b.oom) {
        buf_free(&b);
        return err_set(err, PSV_ERR_NOMEM, "%s: out of memory reading file", path);
    }
    if (!b.data) buf_reserve(&b, 0);
    if (b.oom) return err_set(err, PSV_ERR_NOMEM, "%s: out of memory reading file", path);
    *out = b.data;
    if (out_len) *out_len = b.len;
    return PSV_OK;
}

// ----------------------------------------------------------------------------
// 4. Math
// pensieve links no libm. These are the functions the forward pass and sampler need, with their
// accuracy stated. All are pure and thread-safe.

static inline float f32_from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline double f64_from_bits(uint64_t u) { double f; memcpy(&f, &u, 8); return f; }
static inline uint64_t f64_bits(double f) { uint64_t u; memcpy(&u, &f, 8); return u; }

static inline float psv_fabsf(float x) { return f32_from_bits(f32_bits(x) & 0x7fffffffu); }
static inline bool psv_isnan(float x) { return (f32_bits(x) & 0x7fffffffu) > 0x7f800000u; }
static inline bool psv_isfinite(float x) { return (f32_bits(x) & 0x7f800000u) != 0x7f800000u; }

// Correctly rounded square root: the hardware instruction where there is one (IEEE 754 requires
// it to be exact), else Newton iteration in double, which converges to the correctly rounded
// float after rounding.
static inline double psv_sqrt(double x) {
#if defined(PSV_X86)
    return _mm_cvtsd_f64(_mm_sqrt_sd(_mm_setzero_pd(), _mm_set_sd(x)));
#elif defined(PSV_ARM64)
    double r;
    __asm__("fsqrt %d0, %d1" : "=w"(r) : "w"(x));
    return r;
#else
    if (!(x > 0)) return x == 0 ? x : (x != x ? x : f64_from_bits(0x7ff8000000000000ull));
    if (x == f64_from_bits(0x7ff0000000000000ull)) return x;
    int e = (int)((f64_bits(x) >> 52) & 0x7ff) - 1023;
    double g = f64_from_bits((uint64_t)((e / 2) + 1023) << 52); // 2^(e/2)
    for (int i = 0; i < 60; i++) {
        double ng = 0.5 * (g + x / g);
        if (ng == g) break;
        g = ng;
    }
    return g;
#endif
}
static inline float psv_sqrtf(float x) { return (float)psv_sqrt((double)x); }

// 2^k for integer k in the normal double range.
static inline double psv_pow2i(int k) {
    if (k > 1023) return f64_from_bits(0x7ff0000000000000ull);
    if (k < -1022) {
        if (k < -1074) return 0.0;
        return f64_from_bits(1ull << (k + 1074)); // subnormal
    }
    return f64_from_bits((uint64_t)(k + 1023) << 52);
}

static inline double psv_round_half_away(double x) {
    // Values beyond 2^52 are already integers.
    if (!(x < 4503599627370496.0 && x > -4503599627370496.0)) return x;
    double t = (double)(int64_t)x; // truncates toward zero
    double d = x - t;
    if (d >= 0.5) t += 1.0;
    else if (d <= -0.5) t -= 1.0;
    return t;
}

// exp(x) in double: reduce x = k ln2 + r with |r| <= ln2/2 (ln2 split in two parts so k*ln2_hi is
// exact), then a degree-13 Taylor polynomial, then scale by 2^k. Relative error < 2e-16 for
// normal results; subnormal results lose precision gradually, as they must.
static double psv_exp(double x) {
    if (x != x) return x;
    if (x > 709.782712893384) return f64_from_bits(0x7ff0000000000000ull);
    if (x < -745.2) return 0.0;
    const double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
    double k = psv_round_half_away(x * 1.44269504088896338700);
    double r = (x - k * ln2_hi) - k * ln2_lo;
    // Horner, 1 + r + r^2/2! + ... + r^13/13!
    double p = 1.0 / 6227020800.0;
    p = p * r + 1.0 / 479001600.0;
    p = p * r + 1.0 / 39916800.0;
    p = p * r + 1.0 / 3628800.0;
    p = p * r + 1.0 / 362880.0;
    p = p * r + 1.0 / 40320.0;
    p = p * r + 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    int ki = (int)k;
    // Split the scale so that 2^k never overflows or flushes early near the range ends.
    if (ki > 1000) return p * psv_pow2i(1000) * psv_pow2i(ki - 1000);
    if (ki < -1000) return p * psv_pow2i(-1000) * psv_pow2i(ki + 1000);
    return p * psv_pow2i(ki);
}

// expf: through double, so the result is the correctly rounded float of a value with relative
// error < 2e-16 where the result is a normal float (at most 1 ulp). Hot loops use the vectorised variants of
// the kernels section; this is the reference.
PSV_MAYBE_UNUSED static inline float psv_expf(float x) { return (float)psv_exp((double)x); }

// log(x) in double: x = 2^e * m with m in [sqrt(1/2), sqrt(2)), log(m) = 2 atanh(s),
// s = (m-1)/(m+1), |s| < 0.172, series to s^21. Relative error < 1e-15.
static double psv_log(double x) {
    if (x != x || x < 0) return f64_from_bits(0x7ff8000000000000ull);
    if (x == 0) return -f64_from_bits(0x7ff0000000000000ull);
    if (x == f64_from_bits(0x7ff0000000000000ull)) return x;
    uint64_t u = f64_bits(x);
    int e = (int)((u >> 52) & 0x7ff);
    if (e == 0) { // subnormal: normalise
        x *= 18014398509481984.0; // 2^54
        u = f64_bits(x);
        e = (int)((u >> 52) & 0x7ff) - 54;
    }
    e -= 1023;
    double m = f64_from_bits((u & 0x000fffffffffffffull) | 0x3ff0000000000000ull); // [1,2)
    if (m > 1.41421356237309504880) {
        m *= 0.5;
        e += 1;
    }
    double s = (m - 1.0) / (m + 1.0), s2 = s * s;
    double p = 1.0 / 21;
    for (int k = 19; k >= 1; k -= 2) p = p * s2 + 1.0 / k;
    return 2.0 * s * p + (double)e * 0.69314718055994530942;
}
PSV_MAYBE_UNUSED static inline float psv_logf(float x) { return (float)psv_log((double)x); }

// x^y for x > 0 (rope frequency bases, sampling temperatures). Relative error ~1e-14.
static inline double psv_pow(double x, double y) {
    if (y == 0) return 1.0;
    if (x == 0) return y > 0 ? 0.0 : f64_from_bits(0x7ff0000000000000ull);
    return psv_exp(y * psv_log(x));
}

// tanh through exp; for |x| > 22 it is ±1 to double precision.
static inline double psv_tanh(double x) {
    if (x > 22) return 1.0;
    if (x < -22) return -1.0;
    if (x > -1e-5 && x < 1e-5) return x - x * x * x / 3.0;
    double e = psv_exp(2.0 * x);
    return (e - 1.0) / (e + 1.0);
}
static inline float psv_tanhf(float x) { return (float)psv_tanh((double)x); }

// Fused multiply-add a*b + c with one rounding, without FMA hardware: a*b is exact in double;
// the double sum s and its exact error e (TwoSum) are then rounded to float, nudging s by one
// double ulp toward e when s sits exactly halfway between two floats, so the final rounding is
// correct (no double-rounding error). Exact for all finite inputs whose result is finite.
static inline float psv_fmaf(float a, float b, float c) {
    double p = (double)a * (double)b, s = p + (double)c;
    double bp = s - p, e = (p - (s - bp)) + ((double)c - bp);
    uint64_t u = f64_bits(s);
    if (e != 0 && (u & 0x1fffffffull) == 0x10000000ull) { // halfway between two floats
        bool away = (e > 0) == (s > 0);
        u = away ? u + 1 : u - 1;
        s = f64_from_bits(u);
    }
    return (float)s;
}

// exp(x) in float as the GGUF ecosystem's reference runtime computes it in its vector kernels
// (the Arm optimized-routines algorithm): x = n ln2 + b with n from a shift-based round and ln2
// in two parts, exp(b) - 1 by a degree-5 polynomial, scaled by 2^n through the exponent bits.
// Max error about 1.5 ulp against the true exp. pensieve uses it where the reference does (SiLU,
// attention softmax) because the models amplify last-bit differences: matching the rounding
// keeps results within the reference contract. Values above ~88.7 overflow to infinity, below
// ~-103.9 flush to zero.
static float psv_expf_poly(float x) {
    const float shift = 0x1.8p23f;
    float z = psv_fmaf(x, 0x1.715476p+0f, shift);
    float n = z - shift;
    float b = psv_fmaf(-n, 0x1.7f7d1cp-20f, psv_fmaf(-n, 0x1.62e4p-1f, x));
    uint32_t e = f32_bits(z) << 23;
    float k = f32_from_bits(e + f32_bits(1.0f));
    float u = b * b;
    float j = psv_fmaf(psv_fmaf(psv_fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, psv_fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)), u,
                       0x1.ffffecp-1f * b);
    if (!(psv_fabsf(n) > 126.0f)) return psv_fmaf(k, j, k);
    // Out of the directly representable range: split 2^n into two factors.
    uint32_t d = n <= 0.0f ? 0x82000000u : 0u;
    float s1 = f32_from_bits(d + 0x7f000000u), s2 = f32_from_bits(e - d);
    if (psv_fabsf(n) > 192.0f) return s1 * s1;
    return psv_fmaf(s2, j, s2) * s1;
}

// sin and cos of a double argument, for rotary embeddings whose angles reach ~1e6 radians.
// Reduction by pi/2 with a three-part Cody-Waite constant (33+33+rest bits) is exact while
// k*pio2_1 is, i.e. |x| < 2^20*pi/2 (~1.6e6), giving absolute error < 1e-15 there; beyond it
// accuracy degrades gradually. Then Taylor series on |r| <= pi/4.
static void psv_sincos(double x, double *s, double *c) {
    if (x != x || x > 1e15 || x < -1e15) {
        *s = *c = f64_from_bits(0x7ff8000000000000ull);
        return;
    }
    const double pio2_1 = 1.57079632673412561417e+00, pio2_2 = 6.07710050630396597660e-11,
                 pio2_3 = 2.02226624879595063154e-21;
    double k = psv_round_half_away(x * 0.63661977236758134308);
    double r = ((x - k * pio2_1) - k * pio2_2) - k * pio2_3;
    double r2 = r * r;
    // Taylor series to r^19 (sin) and r^18 (cos): on |r| <= pi/4 the first omitted term is
    // below 1e-18.
    double sr = r, cr = 1.0, ts = r, tc = 1.0;
    for (int i = 1; i <= 9; i++) {
        ts *= -r2 / (double)((2 * i) * (2 * i + 1));
        tc *= -r2 / (double)((2 * i - 1) * (2 * i));
        sr += ts;
        cr += tc;
    }
    int64_t q = (int64_t)k & 3;
    switch (q) {
    case 0: *s = sr; *c = cr; break;
    case 1: *s = cr; *c = -sr; break;
    case 2: *s = -sr; *c = -cr; break;
    default: *s = -cr; *c = sr; break;
    }
}

// IEEE half <-> float, exact in both directions (float -> half rounds to nearest even).
static inline float psv_fp16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0) {
        if (man == 0) return f32_from_bits(sign);
        // subnormal: value = man * 2^-24
        float v = (float)man * (1.0f / 16777216.0f);
        return (sign ? -v : v);
    }
    if (exp == 31) return f32_from_bits(sign | 0x7f800000u | (man << 13));
    return f32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
}

static inline uint16_t psv_f32_to_fp16(float f) {
    uint32_t u = f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00 | ((a >> 13) & 0x3ff)); // NaN stays NaN
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); // rounds to >= 65520: infinity
    if (a < 0x38800000u) { // below the smallest normal half (2^-14): subnormal or zero
        // half subnormal = round(x * 2^24) with ties to even; x * 2^24 is exact in float
        float x = f32_from_bits(a) * 16777216.0f;
        uint32_t i = (uint32_t)x;
        float fr = x - (float)i;
        if (fr > 0.5f || (fr == 0.5f && (i & 1))) i++;
        return (uint16_t)(sign | i);
    }
    uint32_t e = (a >> 23) - 112, m = a & 0x7fffff;
    uint32_t h = (e << 10) | (m >> 13);
    uint32_t rest = m & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++; // carries into the exponent correctly
    return (uint16_t)(sign | h);
}

static inline float psv_bf16_to_f32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }
static inline uint16_t psv_f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); // quiet NaN
    u += 0x7fff + ((u >> 16) & 1); // round to nearest even
    return (uint16_t)(u >> 16);
}

// Tensor types, by their ggml type id as stored in GGUF tensor infos (GGUF v3 / ggml.h). Ids
// 4, 5 and 31-33, 36-38 were retired upstream and are invalid. A block of `blck_size` values
// takes `type_size` bytes. `supported` marks the types this build can compute with; the others
// are known by name so that a model using them gets a clear error.
typedef enum {
    T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8,
    T_Q8_1 = 9, T_Q2_K = 10, T_Q3_K = 11, T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14, T_Q8_K = 15,
    T_IQ2_XXS = 16, T_IQ2_XS = 17, T_IQ3_XXS = 18, T_IQ1_S = 19, T_IQ4_NL = 20, T_IQ3_S = 21,
    T_IQ2_S = 22, T_IQ4_XS = 23, T_I8 = 24, T_I16 = 25, T_I32 = 26, T_I64 = 27, T_F64 = 28,
    T_IQ1_M = 29, T_BF16 = 30, T_TQ1_0 = 34, T_TQ2_0 = 35, T_MXFP4 = 39,
    T_COUNT = 40
} tensor_type;

typedef struct {
    const char *name; // NULL: not a valid type id
    uint32_t blck_size;
    uint32_t type_size;
    bool supported;
} type_info;

#define QK_K 256 // values per k-quant super-block

static const type_info type_table[T_COUNT] = {
    [T_F32] = {"F32", 1, 4, true},          [T_F16] = {"F16", 1, 2, true},
    [T_Q4_0] = {"Q4_0", 32, 18, true},      [T_Q4_1] = {"Q4_1", 32, 20, true},
    [T_Q5_0] = {"Q5_0", 32, 22, true},      [T_Q5_1] = {"Q5_1", 32, 24, true},
    [T_Q8_0] = {"Q8_0", 32, 34, true},      [T_Q8_1] = {"Q8_1", 32, 36, false},
    [T_Q2_K] = {"Q2_K", 256, 84, true},     [T_Q3_K] = {"Q3_K", 256, 110, true},
    [T_Q4_K] = {"Q4_K", 256, 144, true},    [T_Q5_K] = {"Q5_K", 256, 176, true},
    [T_Q6_K] = {"Q6_K", 256, 210, true},    [T_Q8_K] = {"Q8_K", 256, 292, false},
    [T_IQ2_XXS] = {"IQ2_XXS", 256, 66, false}, [T_IQ2_XS] = {"IQ2_XS", 256, 74, false},
    [T_IQ3_XXS] = {"IQ3_XXS", 256, 98, false}, [T_IQ1_S] = {"IQ1_S", 256, 50, false},
    [T_IQ4_NL] = {"IQ4_NL", 32, 18, false}, [T_IQ3_S] = {"IQ3_S", 256, 110, false},
    [T_IQ2_S] = {"IQ2_S", 256, 82, false},  [T_IQ4_XS] = {"IQ4_XS", 256, 136, false},
    [T_I8] = {"I8", 1, 1, false},           [T_I16] = {"I16", 1, 2, false},
    [T_I32] = {"I32", 1, 4, false},         [T_I64] = {"I64", 1, 8, false},
    [T_F64] = {"F64", 1, 8, false},         [T_IQ1_M] = {"IQ1_M", 256, 56, false},
    [T_BF16] = {"BF16", 1, 2, true},        [T_TQ1_0] = {"TQ1_0", 256, 54, false},
    [T_TQ2_0] = {"TQ2_0", 256, 66, false},  [T_MXFP4] = {"MXFP4", 32, 17, false},
};

static const type_info *type_get(uint32_t id) {
    return id < T_COUNT && type_table[id].name ? &type_table[id] : NULL;
}

// Bytes of one row of n values; false when n is not a whole number of blocks or overflows.
static bool type_row_size(uint32_t id, uint64_t n, uint64_t *out) {
    const type_info *t = type_get(id);
    if (!t || n % t->blck_size) return false;
    return ck_mul_u64(n / t->blck_size, t->type_size, out);
}

// ----------------------------------------------------------------------------
// 5. SHA-256
// FIPS 180-4 SHA-256: a portable compression function (the oracle), x86 SHA-NI and ARMv8 SHA2
// variants picked once at run time, the streaming psv_sha256_* API, file hashing, and the
// `sha256` subcommand, whose output is byte for byte that of coreutils `sha256sum`.
// PSV_KERNELS=ref in the environment forces the portable code, as it does for the tensor kernels.

// Processes n_blocks consecutive 64-byte blocks at p into state (FIPS 180-4 §6.2.2). Every
// variant computes exactly the same function; they differ only in speed.
typedef void (*sha256_blocks_fn)(uint32_t state[8], const uint8_t *p, size_t n_blocks);

// Bytes per read() when hashing a file: large enough that syscall overhead is noise next to
// hashing (~0.5 ms of SHA-NI work per read), small enough to stay in L2/L3.
#define SHA256_READ_SIZE ((size_t)1 << 20)

// FIPS 180-4 §4.2.2: the first 32 bits of the fractional parts of the cube roots of the first 64
// primes. Aligned so the SIMD variants can load four at a time.
static _Alignas(16) const uint32_t sha256_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

// FIPS 180-4 §5.3.3: the initial hash value H(0).
static const uint32_t sha256_h0[8] = {
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
};

static inline uint32_t sha256_rotr(uint32_t x, unsigned n) { return (x >> n) | (x << (32 - n)); }

static inline uint32_t sha256_ld_be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline void sha256_st_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

// FIPS 180-4 §4.1.2, functions (4.2)-(4.7). Ch and Maj are written in equivalent forms with one
// operation fewer.
#define SHA256_CH(x, y, z) ((z) ^ ((x) & ((y) ^ (z))))
#define SHA256_MAJ(x, y, z) (((x) & (y)) | ((z) & ((x) | (y))))
#define SHA256_BSIG0(x) (sha256_rotr((x), 2) ^ sha256_rotr((x), 13) ^ sha256_rotr((x), 22))
#define SHA256_BSIG1(x) (sha256_rotr((x), 6) ^ sha256_rotr((x), 11) ^ sha256_rotr((x), 25))
#define SHA256_SSIG0(x) (sha256_rotr((x), 7) ^ sha256_rotr((x), 18) ^ ((x) >> 3))
#define SHA256_SSIG1(x) (sha256_rotr((x), 17) ^ sha256_rotr((x), 19) ^ ((x) >> 10))

// One round of §6.2.2 step 3. Instead of shifting the eight working variables down, the caller
// renames them: afterwards the variable passed as h holds the new a and the one passed as d holds
// the new e, so the next round is SHA256_ROUND(h, a, b, c, d, e, f, g, ...).
#define SHA256_ROUND(a, b, c, d, e, f, g, h, kw)                              \
    do {                                                                      \
        uint32_t t1_ = (h) + SHA256_BSIG1(e) + SHA256_CH(e, f, g) + (kw);     \
        uint32_t t2_ = SHA256_BSIG0(a) + SHA256_MAJ(a, b, c);                 \
        (d) += t1_;                                                           \
        (h) = t1_ + t2_;                                                      \
    } while (0)

// The portable compression function, written to follow §6.2.2 step by step; it is the oracle the
// accelerated variants are tested against.
static void sha256_blocks_ref(uint32_t state[8], const uint8_t *p, size_t n_blocks) {
    uint32_t w[64];
    for (; n_blocks > 0; n_blocks--, p += 64) {
        // Step 1: the message schedule.
        for (int t = 0; t < 16; t++) w[t] = sha256_ld_be32(p + 4 * t);
        for (int t = 16; t < 64; t++)
            w[t] = SHA256_SSIG1(w[t - 2]) + w[t - 7] + SHA256_SSIG0(w[t - 15]) + w[t - 16];
        // Steps 2-3: 64 rounds, eight per iteration so the renaming comes back to the start.
        uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
        uint32_t e = state[4], f = state[5], g = state[6], h = state[7];
        for (int t = 0; t < 64; t += 8) {
            SHA256_ROUND(a, b, c, d, e, f, g, h, sha256_k[t + 0] + w[t + 0]);
            SHA256_ROUND(h, a, b, c, d, e, f, g, sha256_k[t + 1] + w[t + 1]);
            SHA256_ROUND(g, h, a, b, c, d, e, f, sha256_k[t + 2] + w[t + 2]);
            SHA256_ROUND(f, g, h, a, b, c, d, e, sha256_k[t + 3] + w[t + 3]);
            SHA256_ROUND(e, f, g, h, a, b, c, d, sha256_k[t + 4] + w[t + 4]);
            SHA256_ROUND(d, e, f, g, h, a, b, c, sha256_k[t + 5] + w[t + 5]);
            SHA256_ROUND(c, d, e, f, g, h, a, b, sha256_k[t + 6] + w[t + 6]);
            SHA256_ROUND(b, c, d, e, f, g, h, a, sha256_k[t + 7] + w[t + 7]);
        }
        // Step 4: the intermediate hash value.
        state[0] += a; state[1] += b; state[2] += c; state[3] += d;
        state[4] += e; state[5] += f; state[6] += g; state[7] += h;
    }
}

#if defined(PSV_X86)
// x86 SHA extensions (Intel SDM vol. 2, SHA256RNDS2/SHA256MSG1/SHA256MSG2). The state lives in
// two registers in the order the instructions want: abef = lanes (F, E, B, A) and
// cdgh = (H, G, D, C), lane 0 first. Besides SHA it needs only SSSE3 (pshufb, palignr): the
// state shuffles use SSE2 unpacks, so the run-time check is exactly sha_ni && ssse3.
#define SHA256_NI_TARGET __attribute__((target("sha,ssse3")))

// Rounds 4g..4g+3 with message words m = W[4g..4g+3]. SHA256RNDS2 takes (CDGH, ABEF, two W+K
// in the low lanes) and returns the new ABEF; the old ABEF is then the new CDGH, so the two
// registers swap roles between the two calls and are back in place after four rounds.
#define SHA256_NI_4ROUNDS(g, m)                                                           \
    do {                                                                                  \
        __m128i wk_ = _mm_add_epi32((m), _mm_load_si128((const __m128i *)&sha256_k[4 * (g)])); \
        cdgh = _mm_sha256rnds2_epu32(cdgh, abef, wk_);                                    \
        abef = _mm_sha256rnds2_epu32(abef, cdgh, _mm_shuffle_epi32(wk_, 0x0e));           \
    } while (0)

// §6.2.2 step 1 for t = 4g..4g+3 given m0..m3 = W[4g-16..], W[4g-12..], W[4g-8..], W[4g-4..]:
// MSG1 adds sigma0 of the next word to each of m0, the add brings in W[t-7] (m2:m3 shifted by
// one word), MSG2 adds sigma1 of W[t-2] (including the two words it has just produced). The
// result replaces m0, the oldest group.
#define SHA256_NI_SCHEDULE(m0, m1, m2, m3)                                                \
    (m0) = _mm_sha256msg2_epu32(                                                          \
        _mm_add_epi32(_mm_sha256msg1_epu32((m0), (m1)), _mm_alignr_epi8((m3), (m2), 4)), (m3))

SHA256_NI_TARGET
static void sha256_blocks_shani(uint32_t state[8], const uint8_t *p, size_t n_blocks) {
    // Byte order within each 32-bit word reversed: message words are big-endian (§3.1).
    const __m128i bswap = _mm_set_epi8(12, 13, 14, 15, 8, 9, 10, 11, 4, 5, 6, 7, 0, 1, 2, 3);
    __m128i x = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&state[0]), 0x1b); // D C B A
    __m128i y = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&state[4]), 0x1b); // H G F E
    __m128i abef = _mm_unpackhi_epi64(y, x); // F E B A
    __m128i cdgh = _mm_unpacklo_epi64(y, x); // H G D C
    for (; n_blocks > 0; n_blocks--, p += 64) {
        __m128i abef0 = abef, cdgh0 = cdgh;
        __m128i m0 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 0)), bswap);
        __m128i m1 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16)), bswap);
        __m128i m2 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 32)), bswap);
        __m128i m3 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 48)), bswap);
        SHA256_NI_4ROUNDS(0, m0);
        SHA256_NI_4ROUNDS(1, m1);
        SHA256_NI_4ROUNDS(2, m2);
        SHA256_NI_4ROUNDS(3, m3);
        for (int g = 4; g < 16; g += 4) {
            SHA256_NI_SCHEDULE(m0, m1, m2, m3);
            SHA256_NI_4ROUNDS(g + 0, m0);
            SHA256_NI_SCHEDULE(m1, m2, m3, m0);
            SHA256_NI_4ROUNDS(g + 1, m1);
            SHA256_NI_SCHEDULE(m2, m3, m0, m1);
            SHA256_NI_4ROUNDS(g + 2, m2);
            SHA256_NI_SCHEDULE(m3, m0, m1, m2);
            SHA256_NI_4ROUNDS(g + 3, m3);
        }
        abef = _mm_add_epi32(abef, abef0);
        cdgh = _mm_add_epi32(cdgh, cdgh0);
    }
    x = _mm_shuffle_epi32(abef, 0x1b); // A B E F
    y = _mm_shuffle_epi32(cdgh, 0x1b); // C D G H
    _mm_storeu_si128((__m128i *)&state[0], _mm_unpacklo_epi64(x, y)); // A B C D
    _mm_storeu_si128((__m128i *)&state[4], _mm_unpackhi_epi64(x, y)); // E F G H
}
#endif // PSV_X86

#if defined(PSV_ARM64)
// ARMv8 Cryptographic Extension, SHA2 part (Arm ARM, SHA256H/SHA256H2/SHA256SU0/SHA256SU1). The
// state is two registers in natural order, abcd and efgh. gcc spells the target "+crypto" and
// its arm_neon.h exposes the intrinsics under it. clang spells it "sha2", and before clang 16
// its arm_neon.h hides the intrinsics unless the whole file is built with SHA2, so there the four
// instructions are issued by inline asm, which clang assembles under the function's target.
#if defined(__clang__)
#define SHA256_ARM_TARGET __attribute__((target("sha2")))
#else
#define SHA256_ARM_TARGET __attribute__((target("+crypto")))
#endif

#if defined(__clang__) && !defined(__ARM_FEATURE_SHA2)
SHA256_ARM_TARGET
static inline uint32x4_t sha256_arm_h(uint32x4_t abcd, uint32x4_t efgh, uint32x4_t wk) {
    __asm__("sha256h %q0, %q1, %2.4s" : "+w"(abcd) : "w"(efgh), "w"(wk));
    return abcd;
}
SHA256_ARM_TARGET
static inline uint32x4_t sha256_arm_h2(uint32x4_t efgh, uint32x4_t abcd, uint32x4_t wk) {
    __asm__("sha256h2 %q0, %q1, %2.4s" : "+w"(efgh) : "w"(abcd), "w"(wk));
    return efgh;
}
SHA256_ARM_TARGET
static inline uint32x4_t sha256_arm_su0(uint32x4_t w0, uint32x4_t w4) {
    __asm__("sha256su0 %0.4s, %1.4s" : "+w"(w0) : "w"(w4));
    return w0;
}
SHA256_ARM_TARGET
static inline uint32x4_t sha256_arm_su1(uint32x4_t t, uint32x4_t w8, uint32x4_t w12) {
    __asm__("sha256su1 %0.4s, %1.4s, %2.4s" : "+w"(t) : "w"(w8), "w"(w12));
    return t;
}
#else
#define sha256_arm_h vsha256hq_u32
#define sha256_arm_h2 vsha256h2q_u32
#define sha256_arm_su0 vsha256su0q_u32
#define sha256_arm_su1 vsha256su1q_u32
#endif

// Rounds 4g..4g+3 with message words m = W[4g..4g+3]: SHA256H advances abcd and SHA256H2 efgh,
// the latter from the abcd before the update.
#define SHA256_ARM_4ROUNDS(g, m)                                  \
    do {                                                          \
        uint32x4_t wk_ = vaddq_u32((m), vld1q_u32(&sha256_k[4 * (g)])); \
        uint32x4_t abcd_ = abcd;                                  \
        abcd = sha256_arm_h(abcd, efgh, wk_);                     \
        efgh = sha256_arm_h2(efgh, abcd_, wk_);                   \
    } while (0)

// §6.2.2 step 1 for t = 4g..4g+3, same register roles as SHA256_NI_SCHEDULE.
#define SHA256_ARM_SCHEDULE(m0, m1, m2, m3) \
    (m0) = sha256_arm_su1(sha256_arm_su0((m0), (m1)), (m2), (m3))

SHA256_ARM_TARGET
static void sha256_blocks_arm(uint32_t state[8], const uint8_t *p, size_t n_blocks) {
    uint32x4_t abcd = vld1q_u32(&state[0]), efgh = vld1q_u32(&state[4]);
    for (; n_blocks > 0; n_blocks--, p += 64) {
        uint32x4_t abcd0 = abcd, efgh0 = efgh;
        // Message words are big-endian (§3.1): reverse the bytes of each word.
        uint32x4_t m0 = vreinterpretq_u32_u8(vrev32q_u8(vld1q_u8(p + 0)));
        uint32x4_t m1 = vreinterpretq_u32_u8(vrev32q_u8(vld1q_u8(p + 16)));
        uint32x4_t m2 = vreinterpretq_u32_u8(vrev32q_u8(vld1q_u8(p + 32)));
        uint32x4_t m3 = vreinterpretq_u32_u8(vrev32q_u8(vld1q_u8(p + 48)));
        SHA256_ARM_4ROUNDS(0, m0);
        SHA256_ARM_4ROUNDS(1, m1);
        SHA256_ARM_4ROUNDS(2, m2);
        SHA256_ARM_4ROUNDS(3, m3);
        for (int g = 4; g < 16; g += 4) {
            SHA256_ARM_SCHEDULE(m0, m1, m2, m3);
            SHA256_ARM_4ROUNDS(g + 0, m0);
            SHA256_ARM_SCHEDULE(m1, m2, m3, m0);
            SHA256_ARM_4ROUNDS(g + 1, m1);
            SHA256_ARM_SCHEDULE(m2, m3, m0, m1);
            SHA256_ARM_4ROUNDS(g + 2, m2);
            SHA256_ARM_SCHEDULE(m3, m0, m1, m2);
            SHA256_ARM_4ROUNDS(g + 3, m3);
        }
        abcd = vaddq_u32(abcd, abcd0);
        efgh = vaddq_u32(efgh, efgh0);
    }
    vst1q_u32(&state[0], abcd);
    vst1q_u32(&state[4], efgh);
}
#endif // PSV_ARM64

// The fastest variant this CPU supports, unless `kernels` (the value of PSV_KERNELS) is "ref".
// Pure, so tests can ask what would be chosen for any CPU. *name gets a short label.
static sha256_blocks_fn sha256_pick(const plat_cpu *cpu, const char *kernels, const char **name) {
    bool ref_only = kernels && strcmp(kernels, "ref") == 0;
#if defined(PSV_X86)
    if (!ref_only && cpu->sha_ni && cpu->ssse3) {
        *name = "sha-ni";
        return sha256_blocks_shani;
    }
#elif defined(PSV_ARM64)
    if (!ref_only && cpu->arm_sha2) {
        *name = "armv8-sha2";
        return sha256_blocks_arm;
    }
#endif
    PSV_UNUSED(cpu);
    PSV_UNUSED(ref_only);
    *name = "ref";
    return sha256_blocks_ref;
}

// Resolved once per process; after that each call is one pthread_once fast-path check.
static sha256_blocks_fn sha256_impl_fn;
static const char *sha256_impl_label;
static pthread_once_t sha256_impl_once = PTHREAD_ONCE_INIT;

static void sha256_impl_init(void) {
    sha256_impl_fn = sha256_pick(plat_cpu_get(), getenv("PSV_KERNELS"), &sha256_impl_label);
}

static sha256_blocks_fn sha256_impl(void) {
    pthread_once(&sha256_impl_once, sha256_impl_init);
    return sha256_impl_fn;
}

// Which variant psv_sha256_* use: "sha-ni", "armv8-sha2" or "ref" (for logs and `--help`).
static const char *sha256_impl_name(void) {
    pthread_once(&sha256_impl_once, sha256_impl_init);
    return sha256_impl_label;
}

// The streaming core with an explicit compression function, so tests can drive each variant
// through the same buffering and padding code the public API uses.
static void sha256_update_with(psv_sha256 *s, sha256_blocks_fn blocks, const void *data, size_t n) {
    PSV_ASSERT(s && s->n_block < 64);
    if (n == 0) return; // data may be NULL then
    const uint8_t *p = data;
    s->n_bytes += n;
    if (s->n_block > 0) {
        size_t k = PSV_MIN(n, 64 - (size_t)s->n_block);
        memcpy(s->block + s->n_block, p, k);
        s->n_block += (uint32_t)k;
        p += k;
        n -= k;
        if (s->n_block < 64) return;
        blocks(s->state, s->block, 1);
        s->n_block = 0;
    }
    if (n >= 64) { // whole blocks straight from the caller's buffer, in one call
        blocks(s->state, p, n / 64);
        p += n & ~(size_t)63;
        n &= 63;
    }
    if (n > 0) {
        memcpy(s->block, p, n);
        s->n_block = (uint32_t)n;
    }
}

static void sha256_final_with(psv_sha256 *s, sha256_blocks_fn blocks, uint8_t digest[32]) {
    PSV_ASSERT(s && s->n_block < 64);
    // §5.1.1: append a 1 bit, then zeros up to 56 mod 64 bytes, then the message length in bits
    // as a 64-bit big-endian integer. That takes one more block, or two when fewer than 9 bytes
    // of the last one are free. The length is taken mod 2^64 bits.
    uint8_t pad[128];
    size_t n = s->n_block;
    memcpy(pad, s->block, n);
    pad[n++] = 0x80;
    size_t total = n + 8 <= 64 ? 64 : 128;
    memset(pad + n, 0, total - 8 - n);
    uint64_t bits = s->n_bytes << 3;
    sha256_st_be32(pad + total - 8, (uint32_t)(bits >> 32));
    sha256_st_be32(pad + total - 4, (uint32_t)bits);
    blocks(s->state, pad, total / 64);
    for (int i = 0; i < 8; i++) sha256_st_be32(digest + 4 * i, s->state[i]); // §6.2.2: H0..H7
    memset(s, 0, sizeof *s);
}

// Lower-case hex of a digest, NUL-terminated.
static void sha256_hex(const uint8_t digest[32], char out[65]) {
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        out[2 * i] = hex[digest[i] >> 4];
        out[2 * i + 1] = hex[digest[i] & 15];
    }
    out[64] = 0;
}

PSV_API void psv_sha256_init(psv_sha256 *s) {
    PSV_ASSERT(s);
    memset(s, 0, sizeof *s);
    memcpy(s->state, sha256_h0, sizeof s->state);
}

PSV_API void psv_sha256_update(psv_sha256 *s, const void *data, size_t n) {
    sha256_update_with(s, sha256_impl(), data, n);
}

PSV_API void psv_sha256_final(psv_sha256 *s, uint8_t digest[32]) {
    sha256_final_with(s, sha256_impl(), digest);
}

// Hash everything readable from fd until end of file, reading through buf (buf_size bytes).
// name is only for messages. fd stays open.
static psv_status sha256_fd(int fd, const char *name, uint8_t *buf, size_t buf_size,
                            uint8_t digest[32], psv_error *err) {
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode))
        return err_set(err, PSV_ERR_IO, "sha256: %s: is a directory", name);
    sha256_blocks_fn blocks = sha256_impl();
    psv_sha256 s;
    psv_sha256_init(&s);
    for (;;) {
        ssize_t k = read(fd, buf, buf_size);
        if (k < 0) {
            if (errno == EINTR) continue;
            return err_set(err, PSV_ERR_IO, "sha256: %s: read error: %s", name, strerror(errno));
        }
        if (k == 0) break;
        sha256_update_with(&s, blocks, buf, (size_t)k);
    }
    sha256_final_with(&s, blocks, digest);
    return PSV_OK;
}

// Reads with plain read() into one SHA256_READ_SIZE buffer rather than mapping, so it works on
// pipes and devices too and a file truncated underneath gives an error instead of SIGBUS.
PSV_API psv_status psv_sha256_file(const char *path, uint8_t digest[32], psv_error *err) {
    if (!path || !digest)
        return err_set(err, PSV_ERR_INVALID, "sha256: file: path and digest must not be NULL");
    memset(digest, 0, 32);
    psv_status st = PSV_OK;
    uint8_t *buf = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        st = err_set(err, PSV_ERR_IO, "sha256: %s: cannot open: %s", path, strerror(errno));
        goto done;
    }
    buf = malloc(SHA256_READ_SIZE);
    if (!buf) {
        st = err_set(err, PSV_ERR_NOMEM, "sha256: %s: out of memory for the read buffer", path);
        goto done;
    }
    st = sha256_fd(fd, path, buf, SHA256_READ_SIZE, digest, err);
    if (st != PSV_OK) memset(digest, 0, 32);
done:
    free(buf);
    if (fd >= 0) close(fd);
    return st;
}

// One output line in sha256sum's format: hex, two spaces (text mode), the name. Like coreutils
// (8.x and later), a name containing a backslash, newline or carriage return is written with those
// escaped as \\, \n, \r and the line starts with a backslash, so `sha256sum -c` can read it back.
static void sha256_print_line(FILE *out, const uint8_t digest[32], const char *name) {
    char hex[65];
    sha256_hex(digest, hex);
    bool escape = strpbrk(name, "\\\n\r") != NULL;
    if (escape) fputc('\\', out);
    fputs(hex, out);
    fputs("  ", out);
    if (!escape) {
        fputs(name, out);
    } else {
        for (const char *c = name; *c; c++) {
            switch (*c) {
            case '\\': fputs("\\\\", out); break;
            case '\n': fputs("\\n", out); break;
            case '\r': fputs("\\r", out); break;
            default: fputc(*c, out); break;
            }
        }
    }
    fputc('\n', out);
}

static void sha256_usage(FILE *out) {
    fprintf(out,
            "usage: pensieve sha256 [FILE]...\n"
            "Print the SHA-256 (FIPS 180-4) digest of each FILE, in the format of sha256sum.\n"
            "With no FILE, or when FILE is -, read standard input.\n"
            "Uses the CPU's SHA instructions when present (now: %s); PSV_KERNELS=ref forces\n"
            "the portable code.\n",
            sha256_impl_name());
}

// `pensieve sha256 FILE...`. Exit status 0 when every file was hashed, 1 when any could not be
// read (the others are still hashed), 2 for a bad option.
static int cli_sha256(int argc, char **argv) {
    // Options first, all of them, so a typo fails before any output (as getopt does).
    bool opts_done = false;
    int n_files = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!opts_done && strcmp(a, "--") == 0) {
            opts_done = true;
        } else if (!opts_done && a[0] == '-' && a[1] != 0) {
            if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
                sha256_usage(stdout);
                return 0;
            }
            fprintf(stderr, "pensieve sha256: unknown option '%s' (try --help)\n", a);
            return 2;
        } else {
            n_files++;
        }
    }
    uint8_t *buf = malloc(SHA256_READ_SIZE);
    if (!buf) {
        fprintf(stderr, "pensieve sha256: out of memory for the read buffer\n");
        return 1;
    }
    int rc = 0;
    opts_done = false;
    for (int i = 1; i <= argc; i++) {
        const char *name;
        if (i == argc) {
            if (n_files > 0) break;
            name = "-"; // no FILE: standard input
        } else {
            name = argv[i];
            if (!opts_done && strcmp(name, "--") == 0) {
                opts_done = true;
                continue;
            }
            if (!opts_done && name[0] == '-' && name[1] != 0) continue;
        }
        psv_error err = {0};
        uint8_t digest[32];
        bool is_stdin = strcmp(name, "-") == 0;
        int fd = is_stdin ? STDIN_FILENO : open(name, O_RDONLY | O_CLOEXEC);
        psv_status st;
        if (fd < 0)
            st = err_set(&err, PSV_ERR_IO, "sha256: %s: cannot open: %s", name, strerror(errno));
        else
            st = sha256_fd(fd, name, buf, SHA256_READ_SIZE, digest, &err);
        if (fd >= 0 && !is_stdin) close(fd);
        if (st != PSV_OK) {
            fflush(stdout); // keep stdout and stderr in order when both go to a terminal
            fprintf(stderr, "pensieve %s\n", err.message);
            rc = 1;
            continue;
        }
        sha256_print_line(stdout, digest, name);
    }
    free(buf);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "pensieve sha256: write error on standard output\n");
        rc = 1;
    }
    return rc;
}

// ----------------------------------------------------------------------------
// 6. JSON
// An RFC 8259 reader that builds an immutable tree in an arena owned by a json_doc, and a
// streaming writer into a buf_t that always emits compact, valid UTF-8 JSON.
//
// Reader decisions (each one rejects rather than guesses, so what we accept round-trips):
// - Strings must be valid UTF-8 (RFC 8259 §8.1, RFC 3629 §4); escapes are decoded, surrogate
//   pairs are joined, a lone surrogate escape is an error (§8.2 allows either; an unpaired
//   surrogate cannot be represented in UTF-8). Decoded strings may contain NUL bytes.
// - A leading byte order mark is an error: a JSON text is `ws value ws` (§2) and §8.1 only
//   permits, never requires, ignoring one. HTTP clients do not send one.
// - Integers without fraction or exponent that fit int64 are JSON_INT exactly; every other
//   number is JSON_REAL, converted with correct rounding. A number whose magnitude overflows a
//   double is an error (PSV_ERR_RANGE, "number out of range"): turning it into an infinity would
//   let `1e309` through as a valid number. Underflow rounds to zero or a subnormal, silently.
// - Nesting deeper than PSV_JSON_MAX_DEPTH is an error (PSV_ERR_RANGE); the reader recurses
//   once per level, so this bounds its stack use.
// - Duplicate object keys are all kept, in document order; json_get returns the last.
// Errors are PSV_ERR_FORMAT (syntax), PSV_ERR_RANGE (limits) or PSV_ERR_NOMEM, with messages
// `json: line L, column C (byte B): problem (expected X, got Y)`: L and C count from 1, C in
// bytes from the start of the line, B is the 0-based byte offset of the problem.

#include <langinfo.h> // nl_langinfo(RADIXCHAR): strtod and printf use the locale's decimal point

typedef enum { JSON_NULL, JSON_BOOL, JSON_INT, JSON_REAL, JSON_STRING, JSON_ARRAY, JSON_OBJECT } json_kind;
typedef struct json_value json_value;
typedef struct json_member json_member;
struct json_value {
    json_kind kind;
    union {
        bool b;
        int64_t i;                                   // JSON_INT: integers that fit int64 exactly
        double d;                                    // JSON_REAL: everything else numeric (finite)
        struct { const char *p; size_t n; } s;       // JSON_STRING: decoded UTF-8, NUL-terminated, may contain \0
        struct { json_value *items; size_t n; } arr; // JSON_ARRAY
        struct { json_member *items; size_t n; } obj;// JSON_OBJECT, in document order
    } u;
};
struct json_member { const char *key; size_t key_len; json_value value; };

// The arena: a list of chunks, newest first. Small allocations bump-allocate from the newest
// chunk; each new chunk doubles in size (up to JSON_CHUNK_MAX) so a document costs O(log n)
// mallocs. The json_doc itself lives at the start of the first chunk.
typedef struct json_chunk json_chunk;
struct json_chunk {
    json_chunk *next;
    size_t cap, used; // bytes of data after the header
};
#define JSON_CHUNK_HDR ((sizeof(json_chunk) + 15) & ~(size_t)15) // data starts 16-byte aligned
#define JSON_CHUNK_MIN ((size_t)1024)
#define JSON_CHUNK_MAX ((size_t)64 << 20)

typedef struct json_doc json_doc;
struct json_doc {
    json_chunk *chunks; // every chunk, including the one holding this struct
    size_t next_cap;    // data size of the next chunk to allocate
    json_value root;
};

static json_chunk *json_chunk_new(size_t cap) {
    size_t total;
    if (!ck_add(cap, JSON_CHUNK_HDR, &total)) return NULL;
    json_chunk *c = malloc(total);
    if (!c) return NULL;
    c->next = NULL;
    c->cap = cap;
    c->used = 0;
    return c;
}

static inline void *json_chunk_data(json_chunk *c) { return (char *)c + JSON_CHUNK_HDR; }

// size bytes aligned to align (a power of two, at most 16) from the doc's arena; NULL when out
// of memory. Memory lives until json_doc_free.
static void *json_alloc(json_doc *d, size_t size, size_t align) {
    PSV_ASSERT(align && align <= 16 && (align & (align - 1)) == 0);
    json_chunk *c = d->chunks;
    size_t at = (c->used + align - 1) & ~(align - 1);
    if (at <= c->cap && size <= c->cap - at) {
        c->used = at + size;
        return (char *)json_chunk_data(c) + at;
    }
    if (size > d->next_cap / 2) {
        // A big block (a long string or array) gets a chunk of its own, linked behind the
        // current one so the current chunk's free space stays in use.
        json_chunk *big = json_chunk_new(size);
        if (!big) return NULL;
        big->used = size;
        big->next = c->next;
        c->next = big;
        return json_chunk_data(big);
    }
    json_chunk *nc = json_chunk_new(d->next_cap);
    if (!nc) return NULL;
    if (d->next_cap < JSON_CHUNK_MAX) d->next_cap *= 2;
    nc->next = c;
    nc->used = size;
    d->chunks = nc;
    return json_chunk_data(nc);
}

static void json_doc_free(json_doc *doc) {
    if (!doc) return;
    // The doc is inside one of the chunks: take the list first, then touch nothing of it.
    json_chunk *c = doc->chunks;
    while (c) {
        json_chunk *next = c->next;
        free(c);
        c = next;
    }
}

static const json_value *json_root(const json_doc *doc) { return doc ? &doc->root : NULL; }

// ---- UTF-8 -----------------------------------------------------------------------------------

// Length (1-4) of the well-formed UTF-8 sequence at p[0..n) per RFC 3629 §4 (no overlongs, no
// surrogates, nothing above U+10FFFF), or 0 when it is ill-formed; then *bad is the length of its
// maximal ill-formed prefix (>= 1), the unit that Unicode §3.9 replaces with one U+FFFD.
static size_t json_utf8_len(const uint8_t *p, size_t n, size_t *bad) {
    uint8_t c = p[0];
    if (c < 0x80) return 1;
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF; // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c == 0xE0) need = 3, lo = 0xA0;                 // no overlongs below U+0800
    else if (c == 0xED) need = 3, hi = 0x9F;                 // no UTF-16 surrogates D800-DFFF
    else if (c >= 0xE1 && c <= 0xEF) need = 3;
    else if (c == 0xF0) need = 4, lo = 0x90;                 // no overlongs below U+10000
    else if (c == 0xF4) need = 4, hi = 0x8F;                 // nothing above U+10FFFF
    else if (c >= 0xF1 && c <= 0xF3) need = 4;
    else {                                                   // 80-C1, F5-FF never start one
        *bad = 1;
        return 0;
    }
    size_t i = 1;
    for (; i < need && i < n; i++) {
        if (p[i] < lo || p[i] > hi) break;
        lo = 0x80, hi = 0xBF;
    }
    if (i == need) return need;
    *bad = i;
    return 0;
}

static size_t json_utf8_put(uint8_t *o, uint32_t cp) {
    if (cp < 0x80) {
        o[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (uint8_t)(0xC0 | (cp >> 6));
        o[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | (cp >> 12));
        o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | (cp >> 18));
    o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

// ---- Numbers ---------------------------------------------------------------------------------

// The decimal point of the calling thread's locale, which strtod and printf use ("," after
// setlocale(LC_ALL, "de_DE.UTF-8"); may be several bytes). nl_langinfo rather than localeconv:
// glibc documents it MT-Safe, while localeconv rewrites a static struct on every call.
static const char *json_decimal_point(size_t *len) {
    const char *dp = nl_langinfo(RADIXCHAR);
    if (!dp || !*dp) dp = ".";
    *len = strlen(dp);
    return dp;
}

// Converts the n bytes at s, which already match the RFC 8259 §6 number grammar, to a double with
// libc's strtod (correctly rounded in glibc and the BSDs). strtod reads the locale's decimal point,
// so the '.' is replaced by it first: an embedder that called setlocale(LC_ALL, "") must not see
// "1.5" read as 1. Returns PSV_ERR_RANGE when the value overflows a double, PSV_ERR_NOMEM when a
// very long number cannot be copied. errno is preserved.
static psv_status json_strtod(const char *s, size_t n, double *out) {
    size_t dpn;
    const char *dp = json_decimal_point(&dpn);
    char small[64], *buf = small;
    size_t cap;
    if (!ck_add(n, dpn, &cap) || !ck_add(cap, 1, &cap)) return PSV_ERR_NOMEM;
    if (cap > sizeof small && !(buf = malloc(cap))) return PSV_ERR_NOMEM;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '.') {
            memcpy(buf + k, dp, dpn);
            k += dpn;
        } else {
            buf[k++] = s[i];
        }
    }
    buf[k] = 0;
    int saved = errno;
    char *end;
    double d = strtod(buf, &end);
    errno = saved;
    PSV_ASSERT(end == buf + k); // the grammar was checked, so strtod must take every byte
    if (buf != small) free(buf);
    *out = d;
    return (f64_bits(d) & 0x7fffffffffffffffull) == 0x7ff0000000000000ull ? PSV_ERR_RANGE : PSV_OK;
}

// ---- Reader ----------------------------------------------------------------------------------

typedef struct {
    const uint8_t *p;
    size_t n, off;
    json_doc *doc;
    json_value *vstack; // scratch: items of the arrays being parsed, innermost on top
    size_t vn, vcap;
    json_member *mstack; // scratch: members of the objects being parsed
    size_t mn, mcap;
    psv_error *err;
    psv_status st; // first failure
} json_parser;

static bool json_fail(json_parser *ps, size_t off, psv_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static bool json_fail(json_parser *ps, size_t off, psv_status st, const char *fmt, ...) {
    if (ps->st != PSV_OK) return false;
    ps->st = st;
    if (!ps->err) return false;
    size_t line = 1, line_start = 0;
    for (size_t i = 0; i < off && i < ps->n; i++) {
        if (ps->p[i] == '\n') line++, line_start = i + 1;
    }
    char what[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    err_set(ps->err, st, "json: line %zu, column %zu (byte %zu): %s", line, off - line_start + 1,
            off, what);
    return false;
}

static bool json_oom(json_parser *ps) {
    return json_fail(ps, ps->off, PSV_ERR_NOMEM, "out of memory building the document tree");
}

// Describes the byte at off for an error message: 'x' for printable ASCII, else its hex value.
static const char *json_got(const json_parser *ps, size_t off, char tmp[24]) {
    if (off >= ps->n) return "end of input";
    uint8_t c = ps->p[off];
    if (c >= 0x20 && c < 0x7F) snprintf(tmp, 24, "'%c'", c);
    else snprintf(tmp, 24, "byte 0x%02X", c);
    return tmp;
}

// RFC 8259 §2: insignificant whitespace is exactly space, tab, line feed and carriage return.
static void json_skip_ws(json_parser *ps) {
    while (ps->off < ps->n) {
        uint8_t c = ps->p[ps->off];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        ps->off++;
    }
}

static int json_hex4(const uint8_t *p) {
    int v = 0;
    for (int i = 0; i < 4; i++) {
        int c = p[i], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return -1;
        v = v * 16 + d;
    }
    return v;
}

// Parses the string whose opening quote is at ps->off (RFC 8259 §7) into a NUL-terminated copy in
// the arena. The decoded form is never longer than the raw one (\uXXXX is 6 bytes for at most 3,
// a pair is 12 for 4), so the raw length sizes the copy.
static bool json_parse_string(json_parser *ps, const char **out, size_t *out_n) {
    const uint8_t *p = ps->p;
    size_t q = ps->off, i = q + 1, end;
    for (;;) {
        if (i >= ps->n)
            return json_fail(ps, q, PSV_ERR_FORMAT, "unterminated string (expected a closing '\"')");
        if (p[i] == '"') break;
        i += p[i] == '\\' ? 2 : 1;
    }
    end = i;
    uint8_t *o = json_alloc(ps->doc, end - q, 1); // raw content + NUL
    if (!o) return json_oom(ps);
    size_t k = 0;
    char tmp[24];
    for (i = q + 1; i < end;) {
        uint8_t c = p[i];
        if (c == '\\') {
            uint8_t e = p[i + 1]; // exists: the scan above skipped it before finding the quote
            const char *simple = "\"\"\\\\//b\bf\fn\nr\rt\t";
            const char *m = NULL;
            for (const char *s = simple; *s; s += 2) {
                if ((uint8_t)*s == e) {
                    m = s;
                    break;
                }
            }
            if (m) {
                o[k++] = (uint8_t)m[1];
                i += 2;
                continue;
            }
            if (e != 'u')
                return json_fail(ps, i, PSV_ERR_FORMAT,
                                 "invalid escape in string (expected one of \\\" \\\\ \\/ \\b \\f \\n "
                                 "\\r \\t \\uXXXX, got %s after '\\')",
                                 json_got(ps, i + 1, tmp));
            int hi = end - i >= 6 ? json_hex4(p + i + 2) : -1;
            if (hi < 0)
                return json_fail(ps, i, PSV_ERR_FORMAT,
                                 "invalid \\u escape in string (expected 4 hex digits)");
            uint32_t cp = (uint32_t)hi;
            if (cp >= 0xDC00 && cp <= 0xDFFF)
                return json_fail(ps, i, PSV_ERR_FORMAT,
                                 "lone surrogate \\u%04X in string (expected a high surrogate "
                                 "\\uD800-\\uDBFF before it)", (unsigned)cp);
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                // RFC 8259 §7: a character outside the BMP is escaped as a UTF-16 surrogate pair.
                int lo = end - i >= 12 && p[i + 6] == '\\' && p[i + 7] == 'u' ? json_hex4(p + i + 8) : -1;
                if (lo < 0xDC00 || lo > 0xDFFF)
                    return json_fail(ps, i, PSV_ERR_FORMAT,
                                     "lone surrogate \\u%04X in string (expected a low surrogate "
                                     "\\uDC00-\\uDFFF after it)", (unsigned)cp);
                cp = 0x10000 + ((cp - 0xD800) << 10) + ((uint32_t)lo - 0xDC00);
                i += 6;
            }
            i += 6;
            k += json_utf8_put(o + k, cp);
        } else if (c < 0x20) {
            // RFC 8259 §7: control characters must be escaped.
            return json_fail(ps, i, PSV_ERR_FORMAT,
                             "unescaped control character in string (expected an escape such as "
                             "\\n or \\u%04X, got byte 0x%02X)", c, c);
        } else if (c < 0x80) {
            o[k++] = c;
            i++;
        } else {
            size_t bad, len = json_utf8_len(p + i, end - i, &bad);
            if (!len)
                return json_fail(ps, i, PSV_ERR_FORMAT, "invalid UTF-8 in string (got byte 0x%02X)", c);
            memcpy(o + k, p + i, len);
            k += len;
            i += len;
        }
    }
    o[k] = 0;
    *out = (const char *)o;
    *out_n = k;
    ps->off = end + 1;
    return true;
}

static inline bool json_is_digit(const json_parser *ps, size_t i) {
    return i < ps->n && ps->p[i] >= '0' && ps->p[i] <= '9';
}

// RFC 8259 §6: number = [ minus ] int [ frac ] [ exp ]; int = zero / ( digit1-9 *DIGIT ).
static bool json_parse_number(json_parser *ps, json_value *v) {
    const uint8_t *p = ps->p;
    size_t start = ps->off, i = start;
    bool neg = p[i] == '-', is_int = true;
    char tmp[24];
    if (neg) i++;
    if (!json_is_digit(ps, i))
        return json_fail(ps, i, PSV_ERR_FORMAT, "invalid number (expected a digit after '-', got %s)",
                         json_got(ps, i, tmp));
    if (p[i] == '0') {
        i++;
        if (json_is_digit(ps, i))
            return json_fail(ps, start, PSV_ERR_FORMAT, "invalid number (leading zeros are not allowed)");
    } else {
        while (json_is_digit(ps, i)) i++;
    }
    if (i < ps->n && p[i] == '.') {
        is_int = false;
        i++;
        if (!json_is_digit(ps, i))
            return json_fail(ps, i, PSV_ERR_FORMAT, "invalid number (expected a digit after '.', got %s)",
                             json_got(ps, i, tmp));
        while (json_is_digit(ps, i)) i++;
    }
    if (i < ps->n && (p[i] == 'e' || p[i] == 'E')) {
        is_int = false;
        i++;
        if (i < ps->n && (p[i] == '+' || p[i] == '-')) i++;
        if (!json_is_digit(ps, i))
            return json_fail(ps, i, PSV_ERR_FORMAT,
                             "invalid number (expected a digit in the exponent, got %s)",
                             json_got(ps, i, tmp));
        while (json_is_digit(ps, i)) i++;
    }
    ps->off = i;
    if (is_int) {
        // Accumulate the magnitude; -2^63 is the one value whose magnitude exceeds INT64_MAX.
        uint64_t limit = neg ? (uint64_t)1 << 63 : ((uint64_t)1 << 63) - 1, m = 0;
        size_t j = start + neg;
        for (; j < i; j++) {
            uint64_t d = (uint64_t)(p[j] - '0');
            if (m > (limit - d) / 10) break;
            m = m * 10 + d;
        }
        if (j == i) {
            v->kind = JSON_INT;
            v->u.i = !neg ? (int64_t)m : m == (uint64_t)1 << 63 ? INT64_MIN : -(int64_t)m;
            return true;
        }
    }
    double d;
    psv_status st = json_strtod((const char *)p + start, i - start, &d);
    if (st == PSV_ERR_NOMEM) return json_oom(ps);
    if (st != PSV_OK)
        return json_fail(ps, start, PSV_ERR_RANGE,
                         "number out of range (expected a magnitude below 1.8e308)");
    v->kind = JSON_REAL;
    v->u.d = d;
    return true;
}

// Grows a scratch stack so it holds at least one more element of size elem.
static bool json_stack_grow(void **stack, size_t *cap, size_t n, size_t elem) {
    if (n < *cap) return true;
    size_t ncap = *cap ? *cap * 2 : 16, bytes;
    if (!ck_mul(ncap, elem, &bytes)) return false;
    void *p = realloc(*stack, bytes);
    if (!p) return false;
    *stack = p;
    *cap = ncap;
    return true;
}

static bool json_parse_value(json_parser *ps, json_value *v, int depth);

// The array or object opening at ps->off. Children are parsed onto the scratch stack (nested
// containers push above and pop back to where they started), then copied into the arena in one
// contiguous block when the container closes.
static bool json_parse_container(json_parser *ps, json_value *v, int depth) {
    bool is_obj = ps->p[ps->off] == '{';
    char close = is_obj ? '}' : ']', tmp[24];
    if (depth >= PSV_JSON_MAX_DEPTH)
        return json_fail(ps, ps->off, PSV_ERR_RANGE,
                         "nesting too deep (expected at most %d levels of arrays and objects)",
                         PSV_JSON_MAX_DEPTH);
    ps->off++;
    size_t base = is_obj ? ps->mn : ps->vn;
    json_skip_ws(ps);
    if (ps->off < ps->n && ps->p[ps->off] == (uint8_t)close) {
        ps->off++;
    } else {
        for (;;) {
            json_skip_ws(ps);
            if (is_obj) {
                if (ps->off >= ps->n || ps->p[ps->off] != '"')
                    return json_fail(ps, ps->off, PSV_ERR_FORMAT,
                                     "expected a string key in object (got %s)",
                                     json_got(ps, ps->off, tmp));
                if (!json_stack_grow((void **)&ps->mstack, &ps->mcap, ps->mn, sizeof(json_member)))
                    return json_oom(ps);
                json_member *m = &ps->mstack[ps->mn];
                if (!json_parse_string(ps, &m->key, &m->key_len)) return false;
                json_skip_ws(ps);
                if (ps->off >= ps->n || ps->p[ps->off] != ':')
                    return json_fail(ps, ps->off, PSV_ERR_FORMAT,
                                     "expected ':' after object key (got %s)",
                                     json_got(ps, ps->off, tmp));
                ps->off++;
                ps->mn++; // the slot is ours from here; nested objects push above it
                json_value val;
                if (!json_parse_value(ps, &val, depth + 1)) return false;
                ps->mstack[ps->mn - 1].value = val; // the stack may have moved meanwhile
            } else {
                json_value val;
                if (!json_parse_value(ps, &val, depth + 1)) return false;
                if (!json_stack_grow((void **)&ps->vstack, &ps->vcap, ps->vn, sizeof(json_value)))
                    return json_oom(ps);
                ps->vstack[ps->vn++] = val;
            }
            json_skip_ws(ps);
            if (ps->off < ps->n && ps->p[ps->off] == ',') {
                ps->off++;
                continue;
            }
            if (ps->off < ps->n && ps->p[ps->off] == (uint8_t)close) {
                ps->off++;
                break;
            }
            return json_fail(ps, ps->off, PSV_ERR_FORMAT, "expected ',' or '%c' in %s (got %s)",
                             close, is_obj ? "object" : "array", json_got(ps, ps->off, tmp));
        }
    }
    size_t n = (is_obj ? ps->mn : ps->vn) - base, elem = is_obj ? sizeof(json_member) : sizeof(json_value);
    void *items = NULL;
    if (n) {
        size_t bytes;
        if (!ck_mul(n, elem, &bytes) || !(items = json_alloc(ps->doc, bytes, is_obj ? _Alignof(json_member) : _Alignof(json_value))))
            return json_oom(ps);
        memcpy(items, is_obj ? (void *)(ps->mstack + base) : (void *)(ps->vstack + base), bytes);
    }
    if (is_obj) {
        ps->mn = base;
        v->kind = JSON_OBJECT;
        v->u.obj.items = items;
        v->u.obj.n = n;
    } else {
        ps->vn = base;
        v->kind = JSON_ARRAY;
        v->u.arr.items = items;
        v->u.arr.n = n;
    }
    return true;
}

// One value at ps->off (after whitespace); depth counts the containers around it.
static bool json_parse_value(json_parser *ps, json_value *v, int depth) {
    char tmp[24];
    json_skip_ws(ps);
    memset(v, 0, sizeof *v);
    if (ps->off >= ps->n)
        return json_fail(ps, ps->off, PSV_ERR_FORMAT, "unexpected end of input (expected a value)");
    uint8_t c = ps->p[ps->off];
    switch (c) {
    case '{':
    case '[':
        return json_parse_container(ps, v, depth);
    case '"':
        v->kind = JSON_STRING;
        return json_parse_string(ps, &v->u.s.p, &v->u.s.n);
    case 't':
    case 'f':
    case 'n': {
        static const char *const lit[3] = {"true", "false", "null"};
        const char *w = lit[c == 't' ? 0 : c == 'f' ? 1 : 2];
        size_t len = strlen(w);
        if (ps->n - ps->off < len || memcmp(ps->p + ps->off, w, len) != 0)
            return json_fail(ps, ps->off, PSV_ERR_FORMAT,
                             "invalid literal (expected true, false or null)");
        ps->off += len;
        v->kind = c == 'n' ? JSON_NULL : JSON_BOOL;
        v->u.b = c == 't';
        return true;
    }
    default:
        if (c == '-' || (c >= '0' && c <= '9')) return json_parse_number(ps, v);
        return json_fail(ps, ps->off, PSV_ERR_FORMAT, "unexpected %s (expected a value)",
                         json_got(ps, ps->off, tmp));
    }
}

// Parses text[0..len) (NUL bytes allowed; no terminator needed) into a new document. On success
// *out owns every node and string (free with json_doc_free); on failure *out is NULL and err says
// where and why. The input is not referenced after the call.
static psv_status json_parse(const char *text, size_t len, json_doc **out, psv_error *err) {
    json_parser ps;
    memset(&ps, 0, sizeof ps);
    ps.p = (const uint8_t *)text;
    ps.n = len;
    ps.err = err;
    *out = NULL;
    if (!text && len) return err_set(err, PSV_ERR_INVALID, "json: input is NULL");
    // Size the first chunk from the input: most documents then need one malloc for the tree.
    size_t first = PSV_MIN(PSV_MAX(len, JSON_CHUNK_MIN), JSON_CHUNK_MAX / 4);
    json_chunk *c = json_chunk_new(first);
    if (!c) return err_set(err, PSV_ERR_NOMEM, "json: out of memory");
    ps.doc = json_chunk_data(c);
    memset(ps.doc, 0, sizeof *ps.doc);
    c->used = sizeof *ps.doc;
    ps.doc->chunks = c;
    ps.doc->next_cap = first * 2;

    if (len == 0) {
        json_fail(&ps, 0, PSV_ERR_FORMAT, "empty input (expected a value)");
    } else if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) {
        json_fail(&ps, 0, PSV_ERR_FORMAT,
                  "byte order mark before the value (RFC 8259 section 8.1: expected none)");
    } else if (json_parse_value(&ps, &ps.doc->root, 0)) {
        json_skip_ws(&ps);
        char tmp[24];
        if (ps.off < ps.n)
            json_fail(&ps, ps.off, PSV_ERR_FORMAT, "unexpected %s after the value (expected end of input)",
                      json_got(&ps, ps.off, tmp));
    }
    free(ps.vstack);
    free(ps.mstack);
    if (ps.st != PSV_OK) {
        json_doc_free(ps.doc);
        return ps.st;
    }
    *out = ps.doc;
    return PSV_OK;
}

// ---- Accessors (all accept NULL, so lookups chain: json_str(json_get(json_get(r, "a"), "b"))) --

static const json_value *json_get(const json_value *obj, const char *key) {
    if (!obj || obj->kind != JSON_OBJECT || !key) return NULL;
    size_t kn = strlen(key);
    for (size_t i = obj->u.obj.n; i-- > 0;) { // from the end: the last duplicate wins
        const json_member *m = &obj->u.obj.items[i];
        if (m->key_len == kn && memcmp(m->key, key, kn) == 0) return &m->value;
    }
    return NULL;
}

static size_t json_len(const json_value *v) {
    if (!v) return 0;
    if (v->kind == JSON_ARRAY) return v->u.arr.n;
    if (v->kind == JSON_OBJECT) return v->u.obj.n;
    return 0;
}

static const json_value *json_at(const json_value *arr, size_t i) {
    if (!arr || arr->kind != JSON_ARRAY || i >= arr->u.arr.n) return NULL;
    return &arr->u.arr.items[i];
}

PSV_MAYBE_UNUSED static bool json_is_number(const json_value *v) {
    return v && (v->kind == JSON_INT || v->kind == JSON_REAL);
}

PSV_MAYBE_UNUSED static double json_num(const json_value *v) {
    if (!v) return 0;
    if (v->kind == JSON_INT) return (double)v->u.i;
    if (v->kind == JSON_REAL) return v->u.d;
    return 0;
}

PSV_MAYBE_UNUSED static const char *json_str(const json_value *v) {
    return v && v->kind == JSON_STRING ? v->u.s.p : NULL;
}

#ifdef PSV_TESTING
// Structural equality for tests: same kinds, values (doubles bit for bit, so -0.0 != 0.0),
// strings and keys byte for byte, array items and object members in the same order.
static bool json_equal(const json_value *a, const json_value *b) {
    if (!a || !b) return a == b;
    if (a->kind != b->kind) return false;
    switch (a->kind) {
    case JSON_NULL: return true;
    case JSON_BOOL: return a->u.b == b->u.b;
    case JSON_INT: return a->u.i == b->u.i;
    case JSON_REAL: return f64_bits(a->u.d) == f64_bits(b->u.d);
    case JSON_STRING:
        return a->u.s.n == b->u.s.n && memcmp(a->u.s.p, b->u.s.p, a->u.s.n) == 0;
    case JSON_ARRAY:
        if (a->u.arr.n != b->u.arr.n) return false;
        for (size_t i = 0; i < a->u.arr.n; i++)
            if (!json_equal(&a->u.arr.items[i], &b->u.arr.items[i])) return false;
        return true;
    case JSON_OBJECT:
        if (a->u.obj.n != b->u.obj.n) return false;
        for (size_t i = 0; i < a->u.obj.n; i++) {
            const json_member *x = &a->u.obj.items[i], *y = &b->u.obj.items[i];
            if (x->key_len != y->key_len || memcmp(x->key, y->key, x->key_len) != 0) return false;
            if (!json_equal(&x->value, &y->value)) return false;
        }
        return true;
    }
    return false;
}
#endif

// ---- Writer ----------------------------------------------------------------------------------
// Compact output (no whitespace) with commas and colons placed for the caller. Misuse (ending a
// container that is not open, a key without a value) is an internal bug and asserts. Failures
// land in the buffer's sticky `oom` flag: check it once at the end. Nesting deeper than the
// writer tracks (8 * (PSV_JSON_MAX_DEPTH + 1) - 1 levels) also sets it, never writes bad JSON.

typedef struct json_writer json_writer;
struct json_writer {
    buf_t *out;
    int depth;
    // Bit d set: level d has had no element yet (needs no comma). A bitset rather than one byte
    // per level, so a parsed tree of the maximum depth still fits inside a few envelope levels.
    uint8_t first[PSV_JSON_MAX_DEPTH + 1];
    bool after_key;
};
#define JSON_W_MAX_DEPTH ((int)(8 * (PSV_JSON_MAX_DEPTH + 1)) - 1)

PSV_MAYBE_UNUSED static void json_w_init(json_writer *w, buf_t *out) {
    memset(w, 0, sizeof *w);
    w->out = out;
}

// Before a value or a key: a comma unless it is the first element of its container. Values at
// depth 0 get none, so one writer can emit a stream of top-level values the caller separates.
static void json_w_sep(json_writer *w) {
    if (w->after_key) {
        w->after_key = false;
        return;
    }
    int d = w->depth;
    if (d <= 0 || d > JSON_W_MAX_DEPTH) return;
    uint8_t bit = (uint8_t)(1u << (d & 7));
    if (!(w->first[d >> 3] & bit)) buf_putc(w->out, ',');
    w->first[d >> 3] &= (uint8_t)~bit;
}

static void json_w_open(json_writer *w, char c) {
    json_w_sep(w);
    buf_putc(w->out, c);
    w->depth++;
    if (w->depth > JSON_W_MAX_DEPTH) w->out->oom = true; // untracked: the output would be wrong
    else w->first[w->depth >> 3] |= (uint8_t)(1u << (w->depth & 7));
}

static void json_w_close(json_writer *w, char c) {
    PSV_ASSERT(w->depth > 0 && !w->after_key);
    w->depth--;
    buf_putc(w->out, c);
}

static void json_w_obj_begin(json_writer *w) { json_w_open(w, '{'); }
static void json_w_obj_end(json_writer *w) { json_w_close(w, '}'); }
static void json_w_arr_begin(json_writer *w) { json_w_open(w, '['); }
static void json_w_arr_end(json_writer *w) { json_w_close(w, ']'); }

// A quoted string. Escapes '"', '\\' and every control character (RFC 8259 §7), and U+2028 and
// U+2029, which JSON allows raw but JavaScript before ES2019 does not in string literals (output
// may end up inside a <script>). Ill-formed UTF-8 becomes U+FFFD per maximal subpart (Unicode
// §3.9), so the output is valid UTF-8 whatever the input.
static void json_w_quoted(buf_t *b, const char *s, size_t n) {
    const uint8_t *p = (const uint8_t *)s;
    size_t run = 0, i = 0; // p[run..i) is pending verbatim output
    buf_putc(b, '"');
    while (i < n) {
        uint8_t c = p[i];
        char esc[8];
        const char *rep = NULL;
        size_t skip = 1;
        if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') {
            i++;
            continue;
        }
        if (c == '"') rep = "\\\"";
        else if (c == '\\') rep = "\\\\";
        else if (c == '\b') rep = "\\b";
        else if (c == '\f') rep = "\\f";
        else if (c == '\n') rep = "\\n";
        else if (c == '\r') rep = "\\r";
        else if (c == '\t') rep = "\\t";
        else if (c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            rep = esc;
        } else {
            size_t bad = 0, len = json_utf8_len(p + i, n - i, &bad);
            if (len == 3 && c == 0xE2 && p[i + 1] == 0x80 && (p[i + 2] == 0xA8 || p[i + 2] == 0xA9)) {
                rep = p[i + 2] == 0xA8 ? "\\u2028" : "\\u2029";
                skip = 3;
            } else if (!len) {
                rep = "\xEF\xBF\xBD";
                skip = bad;
            } else {
                i += len;
                continue;
            }
        }
        buf_append(b, p + run, i - run);
        buf_puts(b, rep);
        i += skip;
        run = i;
    }
    buf_append(b, p + run, i - run);
    buf_putc(b, '"');
}

static void json_w_str(json_writer *w, const char *s, size_t n) {
    json_w_sep(w);
    json_w_quoted(w->out, s, n);
}

PSV_MAYBE_UNUSED static void json_w_cstr(json_writer *w, const char *s) { json_w_str(w, s, strlen(s)); }

// A key of n bytes (may contain NUL); the next call writes its value.
static void json_w_key_n(json_writer *w, const char *key, size_t n) {
    PSV_ASSERT(w->depth > 0 && !w->after_key);
    json_w_sep(w);
    json_w_quoted(w->out, key, n);
    buf_putc(w->out, ':');
    w->after_key = true;
}

PSV_MAYBE_UNUSED static void json_w_key(json_writer *w, const char *key) { json_w_key_n(w, key, strlen(key)); }

static void json_w_int(json_writer *w, int64_t v) {
    json_w_sep(w);
    buf_printf(w->out, "%" PRId64, v);
}

// The shortest of %.15g, %.16g, %.17g that reads back to the same bits (17 significant digits
// always do, IEEE 754-2008 §5.12.2). An integral value gets ".0" so it reads back as JSON_REAL.
// printf also uses the locale's decimal point: it is put back to '.'.
static void json_w_double(json_writer *w, double v) {
    json_w_sep(w);
    if ((f64_bits(v) & 0x7ff0000000000000ull) == 0x7ff0000000000000ull) { // NaN or infinity
        buf_puts(w->out, "null");
        return;
    }
    size_t dpn;
    const char *dp = json_decimal_point(&dpn);
    char s[64];
    size_t n = 0;
    for (int prec = 15; prec <= 17; prec++) {
        char raw[64];
        int r = snprintf(raw, sizeof raw, "%.*g", prec, v);
        PSV_ASSERT(r > 0 && (size_t)r < sizeof raw);
        n = 0;
        for (int i = 0; i < r;) {
            if ((size_t)(r - i) >= dpn && memcmp(raw + i, dp, dpn) == 0) {
                s[n++] = '.';
                i += (int)dpn;
            } else {
                s[n++] = raw[i++];
            }
        }
        s[n] = 0;
        double back;
        if (json_strtod(s, n, &back) == PSV_OK && f64_bits(back) == f64_bits(v)) break;
    }
    if (!memchr(s, '.', n) && !memchr(s, 'e', n)) memcpy(s + n, ".0", 3), n += 2;
    buf_append(w->out, s, n);
}

static void json_w_bool(json_writer *w, bool v) {
    json_w_sep(w);
    buf_puts(w->out, v ? "true" : "false");
}

static void json_w_null(json_writer *w) {
    json_w_sep(w);
    buf_puts(w->out, "null");
}

// Writes a tree (from json_parse or built by hand) back out; parse(write(v)) equals v.
PSV_MAYBE_UNUSED static void json_w_value(json_writer *w, const json_value *v) {
    switch (v->kind) {
    case JSON_NULL: json_w_null(w); break;
    case JSON_BOOL: json_w_bool(w, v->u.b); break;
    case JSON_INT: json_w_int(w, v->u.i); break;
    case JSON_REAL: json_w_double(w, v->u.d); break;
    case JSON_STRING: json_w_str(w, v->u.s.p, v->u.s.n); break;
    case JSON_ARRAY:
        json_w_arr_begin(w);
        for (size_t i = 0; i < v->u.arr.n; i++) json_w_value(w, &v->u.arr.items[i]);
        json_w_arr_end(w);
        break;
    case JSON_OBJECT:
        json_w_obj_begin(w);
        for (size_t i = 0; i < v->u.obj.n; i++) {
            json_w_key_n(w, v->u.obj.items[i].key, v->u.obj.items[i].key_len);
            json_w_value(w, &v->u.obj.items[i].value);
        }
        json_w_obj_end(w);
        break;
    }
}

// ----------------------------------------------------------------------------
// 7. GGUF
// Reader, writer and `pensieve info` for GGUF v2/v3 files (ggml docs/gguf.md). The reader parses
// the header, metadata and tensor table of a read-only mapping, checking every count, length,
// offset and size before use; tensor data stays in the mapping. Nothing from the file is trusted.

// Value types of metadata (gguf.md "gguf_metadata_value_type").
typedef enum {
    GGUF_T_UINT8 = 0, GGUF_T_INT8 = 1, GGUF_T_UINT16 = 2, GGUF_T_INT16 = 3, GGUF_T_UINT32 = 4,
    GGUF_T_INT32 = 5, GGUF_T_FLOAT32 = 6, GGUF_T_BOOL = 7, GGUF_T_STRING = 8, GGUF_T_ARRAY = 9,
    GGUF_T_UINT64 = 10, GGUF_T_INT64 = 11, GGUF_T_FLOAT64 = 12,
    GGUF_T_COUNT = 13
} gguf_vtype;

// Functions other sections call. A given build may leave some unreferenced (the writer serves
// tests and model generators, not the server), which is expected, not a warning.
#define GGUF_API PSV_MAYBE_UNUSED static

#define GGUF_MAGIC "GGUF"
#define GGUF_DEFAULT_ALIGNMENT 32 // gguf.md: used when general.alignment is absent
#define GGUF_MAX_DIMS 4           // ggml tensors have at most 4 dimensions
// gguf.md limits keys to 2^16-1 bytes; tensor names get the same bound (ggml's own is 63).
#define GGUF_MAX_NAME 65535
// Smallest possible encodings, used to reject counts the remaining bytes could never hold:
// a kv is key length (8) + at least 1 key byte + type (4) + at least 1 value byte; a tensor info
// is name length (8) + at least 1 name byte + n_dims (4) + one dim (8) + type (4) + offset (8).
#define GGUF_MIN_KV_SIZE 14
#define GGUF_MIN_TENSOR_SIZE 33

static const char *const gguf_vtype_names[GGUF_T_COUNT] = {
    "UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32",
    "BOOL", "STRING", "ARRAY", "UINT64", "INT64", "FLOAT64",
};
// Bytes of one value of each fixed-size type; 0 for STRING and ARRAY.
static const uint8_t gguf_vtype_sizes[GGUF_T_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

static const char *gguf_vtype_name(uint32_t t) { return t < GGUF_T_COUNT ? gguf_vtype_names[t] : "?"; }

static bool gguf_vtype_is_int(uint32_t t) {
    return t <= GGUF_T_INT32 || t == GGUF_T_UINT64 || t == GGUF_T_INT64;
}
static bool gguf_vtype_is_signed(uint32_t t) {
    return t == GGUF_T_INT8 || t == GGUF_T_INT16 || t == GGUF_T_INT32 || t == GGUF_T_INT64;
}

// One metadata pair. Scalars are decoded: integers in v.i (signed types) or v.u (unsigned types
// and BOOL), floats in v.f, strings in v.s (a slice of the mapping, not NUL-terminated, any
// bytes). Arrays keep their raw little-endian elements in the mapping (possibly unaligned: read
// them with gguf_arr_*); string arrays also get str_off[k], where element k starts (its length
// field) relative to arr_data: 4 bytes per element, not a 16-byte slice (a vocabulary and its
// merges have 300,000 strings); read them with gguf_arr_str.
typedef struct {
    str_t key;     // a NUL-terminated copy owned by the file: key.p is also a C string
    uint32_t type; // gguf_vtype
    union {
        uint64_t u;
        int64_t i;
        double f;
        str_t s;
    } v;
    uint32_t arr_type;
    uint64_t arr_n;
    const uint8_t *arr_data;
    uint32_t *str_off;
} gguf_kv;

typedef struct {
    str_t name;          // a NUL-terminated copy owned by the file: name.p is also a C string
    uint32_t n_dims;     // 1..4
    uint64_t ne[4];      // ne[0] is the row length (innermost); unused dims are 1; all >= 1
    uint32_t type;       // tensor_type id (T_*)
    uint64_t offset;     // relative to the data section, a multiple of the alignment
    uint64_t size;       // bytes, > 0
    const uint8_t *data; // in the mapping (NULL in the writer's callback view)
} gguf_tensor;

// Name -> index hash slot (open addressing, linear probing). idx1 is index + 1; 0 marks empty.
typedef struct {
    const char *p;
    size_t n;
    uint32_t idx1;
} gguf_slot;

// A parsed file. Keys and tensor names are NUL-terminated copies; everything else points into
// `base` (the mapping when opened from a path, else the caller's buffer). All of it lives until
// gguf_close. Read-only after gguf_open*, so threads may share it.
typedef struct gguf_file {
    plat_map map; // owned when opened from a path
    uint32_t version;
    uint64_t n_kv, n_tensors;
    gguf_kv *kv;
    gguf_tensor *tensors;
    uint64_t alignment, data_offset; // data_offset: file offset of the data section
    // private
    const uint8_t *base;
    size_t size;
    uint64_t tensor_bytes; // sum of all tensor sizes
    char *names;           // the copies of keys and tensor names, each NUL-terminated
    gguf_slot *kv_index, *tensor_index;
    size_t kv_index_cap, tensor_index_cap; // powers of two
} gguf_file;

// FNV-1a: names are short and come from one file, so a simple hash is enough; probing is
// bounded because tables are at most half full.
static uint64_t gguf_hash(const char *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)p[i]) * 0x100000001b3ull;
    return h;
}

static gguf_slot *gguf_probe(gguf_slot *tab, size_t cap, const char *p, size_t n) {
    size_t mask = cap - 1, i = (size_t)gguf_hash(p, n) & mask;
    while (tab[i].idx1 && !(tab[i].n == n && memcmp(tab[i].p, p, n) == 0)) i = (i + 1) & mask;
    return &tab[i];
}

static size_t gguf_index_cap(uint64_t n) {
    size_t cap = 8;
    while (cap < 2 * n) cap *= 2; // n <= PSV_GGUF_MAX_* keeps this small
    return cap;
}

// A printable, bounded copy of an untrusted name for error messages: control bytes become '?',
// and long names are cut at a character boundary with "...".
static const char *gguf_printable(char out[96], str_t s) {
    size_t n = s.n, k = 0, lim = 80;
    if (n > lim) {
        n = lim;
        while (n > 0 && ((uint8_t)s.p[n] & 0xc0) == 0x80) n--;
    }
    for (size_t i = 0; i < n; i++) {
        uint8_t c = (uint8_t)s.p[i];
        out[k++] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
    }
    if (n < s.n) {
        memcpy(out + k, "...", 3);
        k += 3;
    }
    out[k] = 0;
    return out;
}

// Strict UTF-8 (RFC 3629 §4): no overlong forms, no surrogates, nothing above U+10FFFF.
static bool gguf_utf8_valid(const char *s, size_t n) {
    const uint8_t *p = (const uint8_t *)s;
    size_t i = 0;
    while (i < n) {
        uint8_t c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t k;
        uint32_t cp, min;
        if ((c & 0xe0) == 0xc0) k = 1, cp = c & 0x1f, min = 0x80;
        else if ((c & 0xf0) == 0xe0) k = 2, cp = c & 0x0f, min = 0x800;
        else if ((c & 0xf8) == 0xf0) k = 3, cp = c & 0x07, min = 0x10000;
        else return false;
        if (n - i <= k) return false;
        for (size_t j = 1; j <= k; j++) {
            if ((p[i + j] & 0xc0) != 0x80) return false;
            cp = (cp << 6) | (p[i + j] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
        i += k + 1;
    }
    return true;
}

static psv_status gguf_truncated(psv_error *err, const rd_t *r, const char *what, size_t need) {
    return err_set(err, PSV_ERR_FORMAT,
                   "gguf: %s: truncated at byte %zu (needs %zu more bytes, the file has %zu)",
                   what, r->off, need, r->n);
}

// A GGUF string (gguf.md "gguf_string_t"): uint64 length, then that many bytes, no terminator.
static psv_status gguf_rd_str(rd_t *r, str_t *out, uint64_t max, const char *what, psv_error *err) {
    if (r->n - r->off < 8) return gguf_truncated(err, r, what, 8);
    uint64_t len = rd_u64(r);
    if (len > r->n - r->off)
        return err_set(err, PSV_ERR_FORMAT,
                       "gguf: %s: string of %" PRIu64 " bytes runs past the end of the file "
                       "(%zu bytes left at byte %zu)",
                       what, len, r->n - r->off, r->off);
    if (len > max)
        return err_set(err, PSV_ERR_RANGE, "gguf: %s: string of %" PRIu64 " bytes exceeds the limit of %" PRIu64,
                       what, len, max);
    out->p = (const char *)rd_bytes(r, (size_t)len);
    out->n = (size_t)len;
    return PSV_OK;
}

// Keys and tensor names are identifiers we print and look up: non-empty UTF-8 without NUL.
// `mod` is the message's module ("gguf" for the reader, "gguf writer"); `st` the status to report.
static psv_status gguf_check_name(str_t s, const char *mod, const char *what, psv_status st, psv_error *err) {
    char pr[96];
    if (s.n == 0) return err_set(err, st, "%s: %s: empty name", mod, what);
    if (memchr(s.p, 0, s.n))
        return err_set(err, st, "%s: %s '%s': name contains a NUL byte", mod, what, gguf_printable(pr, s));
    if (!gguf_utf8_valid(s.p, s.n))
        return err_set(err, st, "%s: %s '%s': name is not valid UTF-8", mod, what, gguf_printable(pr, s));
    return PSV_OK;
}

// Decode one little-endian element of a fixed-size type into the matching field.
static void gguf_load_scalar(uint32_t type, const uint8_t *p, uint64_t *u, int64_t *i, double *f) {
    switch (type) {
    case GGUF_T_UINT8: case GGUF_T_BOOL: *u = p[0]; break;
    case GGUF_T_INT8: *i = (int8_t)p[0]; break;
    case GGUF_T_UINT16: *u = ld_u16(p); break;
    case GGUF_T_INT16: *i = (int16_t)ld_u16(p); break;
    case GGUF_T_UINT32: *u = ld_u32(p); break;
    case GGUF_T_INT32: *i = (int32_t)ld_u32(p); break;
    case GGUF_T_FLOAT32: *f = (double)f32_from_bits(ld_u32(p)); break;
    case GGUF_T_UINT64: *u = (uint64_t)ld_u32(p) | ((uint64_t)ld_u32(p + 4) << 32); break;
    case GGUF_T_INT64: *i = (int64_t)((uint64_t)ld_u32(p) | ((uint64_t)ld_u32(p + 4) << 32)); break;
    case GGUF_T_FLOAT64: *f = f64_from_bits((uint64_t)ld_u32(p) | ((uint64_t)ld_u32(p + 4) << 32)); break;
    default: PSV_ASSERT(!"gguf_load_scalar: not a fixed-size type");
    }
}

static psv_status gguf_parse_kv(gguf_file *f, rd_t *r, uint64_t idx, psv_error *err) {
    gguf_kv *kv = &f->kv[idx];
    char what[160], pr[96];
    snprintf(what, sizeof what, "key #%" PRIu64, idx);
    psv_status st = gguf_rd_str(r, &kv->key, GGUF_MAX_NAME, what, err);
    if (st) return st;
    if ((st = gguf_check_name(kv->key, "gguf", "key", PSV_ERR_FORMAT, err))) return st;
    snprintf(what, sizeof what, "key '%s'", gguf_printable(pr, kv->key));
    gguf_slot *slot = gguf_probe(f->kv_index, f->kv_index_cap, kv->key.p, kv->key.n);
    if (slot->idx1)
        return err_set(err, PSV_ERR_FORMAT, "gguf: duplicate key '%s' (entries #%u and #%" PRIu64 ")",
                       pr, slot->idx1 - 1, idx);
    *slot = (gguf_slot){kv->key.p, kv->key.n, (uint32_t)idx + 1};

    if (r->n - r->off < 4) return gguf_truncated(err, r, what, 4);
    kv->type = rd_u32(r);
    if (kv->type >= GGUF_T_COUNT)
        return err_set(err, PSV_ERR_FORMAT, "gguf: %s: unknown value type %u (expected 0 to %d)", what,
                       kv->type, GGUF_T_COUNT - 1);
    if (kv->type == GGUF_T_STRING) return gguf_rd_str(r, &kv->v.s, PSV_GGUF_MAX_STRING, what, err);
    if (kv->type != GGUF_T_ARRAY) {
        size_t sz = gguf_vtype_sizes[kv->type];
        const uint8_t *p = rd_bytes(r, sz);
        if (!p) return gguf_truncated(err, r, what, sz);
        gguf_load_scalar(kv->type, p, &kv->v.u, &kv->v.i, &kv->v.f);
        // gguf.md: a bool is one byte, 0 or 1; anything else is invalid.
        if (kv->type == GGUF_T_BOOL && p[0] > 1)
            return err_set(err, PSV_ERR_FORMAT, "gguf: %s: bool value %u (expected 0 or 1)", what, p[0]);
        return PSV_OK;
    }

    // Array: uint32 element type, uint64 count, then the elements (gguf.md "gguf_metadata_value_t").
    if (r->n - r->off < 12) return gguf_truncated(err, r, what, 12);
    kv->arr_type = rd_u32(r);
    kv->arr_n = rd_u64(r);
    uint64_t n = kv->arr_n;
    if (kv->arr_type == GGUF_T_ARRAY)
        return err_set(err, PSV_ERR_UNSUPPORTED, "gguf: %s: arrays of arrays are not supported", what);
    if (kv->arr_type >= GGUF_T_COUNT)
        return err_set(err, PSV_ERR_FORMAT, "gguf: %s: unknown array element type %u (expected 0 to %d)", what,
                       kv->arr_type, GGUF_T_COUNT - 1);
    size_t left = r->n - r->off;
    kv->arr_data = r->p + r->off;
    if (kv->arr_type != GGUF_T_STRING) {
        uint64_t bytes, esz = gguf_vtype_sizes[kv->arr_type];
        if (!ck_mul_u64(n, esz, &bytes))
            return err_set(err, PSV_ERR_FORMAT, "gguf: %s: array count %" PRIu64 " overflows (x %" PRIu64 " bytes)",
                           what, n, esz);
        if (bytes > left)
            return err_set(err, PSV_ERR_FORMAT,
                           "gguf: %s: array of %" PRIu64 " %s (%" PRIu64 " bytes) runs past the end of the file "
                           "(%zu bytes left)", what, n, gguf_vtype_name(kv->arr_type), bytes, left);
        if (n > PSV_GGUF_MAX_ARRAY)
            return err_set(err, PSV_ERR_RANGE, "gguf: %s: array of %" PRIu64 " elements exceeds the limit of %u",
                           what, n, (unsigned)PSV_GGUF_MAX_ARRAY);
        const uint8_t *p = rd_bytes(r, (size_t)bytes);
        if (kv->arr_type == GGUF_T_BOOL)
            for (uint64_t k = 0; k < n; k++)
                if (p[k] > 1)
                    return err_set(err, PSV_ERR_FORMAT,
                                   "gguf: %s: element %" PRIu64 ": bool value %u (expected 0 or 1)", what, k, p[k]);
        return PSV_OK;
    }
    if (n > left / 8)
        return err_set(err, PSV_ERR_FORMAT,
                       "gguf: %s: array of %" PRIu64 " strings runs past the end of the file (%zu bytes left, "
                       "8 or more per string)", what, n, left);
    if (n > PSV_GGUF_MAX_ARRAY)
        return err_set(err, PSV_ERR_RANGE, "gguf: %s: array of %" PRIu64 " elements exceeds the limit of %u", what,
                       n, (unsigned)PSV_GGUF_MAX_ARRAY);
    kv->str_off = malloc((n ? (size_t)n : 1) * sizeof *kv->str_off);
    if (!kv->str_off) return err_set(err, PSV_ERR_NOMEM, "gguf: %s: out of memory for %" PRIu64 " strings", what, n);
    for (uint64_t k = 0; k < n; k++) {
        size_t at = r->off;
        str_t sk;
        if ((uint64_t)(at - (size_t)(kv->arr_data - r->p)) > UINT32_MAX)
            return err_set(err, PSV_ERR_RANGE, "gguf: %s: element %" PRIu64 " starts more than 4 GiB into the array", what, k);
        kv->str_off[k] = (uint32_t)(at - (size_t)(kv->arr_data - r->p));
        if (gguf_rd_str(r, &sk, PSV_GGUF_MAX_STRING, what, NULL) == PSV_OK) continue;
        // read again for the message naming the element (formatting it for each of a vocabulary's
        // 200,000 strings took a tenth of the model's open time)
        char ewhat[200];
        snprintf(ewhat, sizeof ewhat, "%s: element %" PRIu64, what, k);
        r->off = at;
        return gguf_rd_str(r, &sk, PSV_GGUF_MAX_STRING, ewhat, err);
    }
    return PSV_OK;
}

// Tensor info (gguf.md "gguf_tensor_info_t"): name, uint32 n_dims, uint64 ne[n_dims], uint32
// type, uint64 offset into the data section.
static psv_status gguf_parse_tensor(gguf_file *f, rd_t *r, uint64_t idx, psv_error *err) {
    gguf_tensor *t = &f->tensors[idx];
    char what[160], pr[96];
    snprintf(what, sizeof what, "tensor #%" PRIu64, idx);
    psv_status st = gguf_rd_str(r, &t->name, GGUF_MAX_NAME, what, err);
    if (st) return st;
    if ((st = gguf_check_name(t->name, "gguf", "tensor", PSV_ERR_FORMAT, err))) return st;
    snprintf(what, sizeof what, "tensor '%s'", gguf_printable(pr, t->name));
    gguf_slot *slot = gguf_probe(f->tensor_index, f->tensor_index_cap, t->name.p, t->name.n);
    if (slot->idx1)
        return err_set(err, PSV_ERR_FORMAT, "gguf: duplicate tensor name '%s' (tensors #%u and #%" PRIu64 ")", pr,
                       slot->idx1 - 1, idx);
    *slot = (gguf_slot){t->name.p, t->name.n, (uint32_t)idx + 1};

    if (r->n - r->off < 4) return gguf_truncated(err, r, what, 4);
    t->n_dims = rd_u32(r);
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
        return err_set(err, PSV_ERR_FORMAT, "gguf: %s: %u dimensions (expected 1 to %d)", what, t->n_dims,
                       GGUF_MAX_DIMS);
    if (r->n - r->off < 8 * (size_t)t->n_dims + 12) return gguf_truncated(err, r, what, 8 * (size_t)t->n_dims + 12);
    uint64_t n_elem = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        t->ne[d] = d < t->n_dims ? rd_u64(r) : 1;
        // ggml stores dims as int64: larger values are negative there. Empty tensors carry no
        // weights and would make every shape check downstream special-case 0, so we reject them.
        if (t->ne[d] == 0 || t->ne[d] > (uint64_t)INT64_MAX)
            return err_set(err, PSV_ERR_FORMAT, "gguf: %s: dimension %u is %" PRIu64 " (expected 1 to 2^63-1)", what,
                           d, t->ne[d]);
        if (!ck_mul_u64(n_elem, t->ne[d], &n_elem) || n_elem > (uint64_t)INT64_MAX)
            return err_set(err, PSV_ERR_FORMAT, "gguf: %s: element count overflows at dimension %u (%" PRIu64 ")",
                           what, d, t->ne[d]);
    }
    t->type = rd_u32(r);
    t->offset = rd_u64(r);
    const type_info *ti = type_get(t->type);
    if (!ti)
        return err_set(err, PSV_ERR_FORMAT,
                       "gguf: %s: tensor type %u is unknown or retired (expected a ggml type id below %d)", what,
                       t->type, T_COUNT);
    uint64_t row;
    if (t->ne[0] % ti->blck_size)
        return err_set(err, PSV_ERR_FORMAT,
                       "gguf: %s: row length %" PRIu64 " is not a multiple of the %s block size %u", what, t->ne[0],
                       ti->name, ti->blck_size);
    if (!type_row_size(t->type, t->ne[0], &row) || !ck_mul_u64(row, t->ne[1], &t->size) ||
        !ck_mul_u64(t->size, t->ne[2], &t->size) || !ck_mul_u64(t->size, t->ne[3], &t->size))
        return err_set(err, PSV_ERR_FORMAT, "gguf: %s: byte size overflows", what);
    if (t->offset % f->alignment)
        return err_set(err, PSV_ERR_FORMAT, "gguf: %s: offset %" PRIu64 " is not a multiple of the alignment %" PRIu64,
                       what, t->offset, f->alignment);
    return PSV_OK;
}

typedef struct {
    uint64_t offset;
    uint64_t idx;
} gguf_extent;

static int gguf_extent_cmp(const void *a, const void *b) {
    const gguf_extent *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

// Tensors must lie inside the file and must not share bytes: overlapping weights are either a
// corrupt table or a trick to make writes through one tensor show up in another.
static psv_status gguf_check_extents(gguf_file *f, psv_error *err) {
    char pa[96], pb[96];
    uint64_t total = 0;
    for (uint64_t k = 0; k < f->n_tensors; k++) {
        gguf_tensor *t = &f->tensors[k];
        uint64_t start = 0, end = 0;
        if (!ck_add_u64(f->data_offset, t->offset, &start) || !ck_add_u64(start, t->size, &end))
            return err_set(err, PSV_ERR_FORMAT, "gguf: tensor '%s': data ends beyond 2^64 but the file has %zu bytes",
                           gguf_printable(pa, t->name), f->size);
        if (end > f->size)
            return err_set(err, PSV_ERR_FORMAT,
                           "gguf: tensor '%s': data ends at %" PRIu64 " but the file has %zu bytes",
                           gguf_printable(pa, t->name), end, f->size);
        t->data = f->base + start;
        total += t->size; // cannot overflow: every tensor is inside the file and none overlap (below)
    }
    if (f->n_tensors > 1) {
        gguf_extent *ex = malloc((size_t)f->n_tensors * sizeof *ex);
        if (!ex) return err_set(err, PSV_ERR_NOMEM, "gguf: out of memory checking tensor extents");
        for (uint64_t k = 0; k < f->n_tensors; k++) ex[k] = (gguf_extent){f->tensors[k].offset, k};
        qsort(ex, (size_t)f->n_tensors, sizeof *ex, gguf_extent_cmp);
        for (uint64_t k = 1; k < f->n_tensors; k++) {
            const gguf_tensor *a = &f->tensors[ex[k - 1].idx], *b = &f->tensors[ex[k].idx];
            if (a->offset + a->size > b->offset) {
                err_set(err, PSV_ERR_FORMAT,
                        "gguf: tensors '%s' and '%s' overlap (data bytes %" PRIu64 "..%" PRIu64 " and %" PRIu64
                        "..%" PRIu64 ")", gguf_printable(pa, a->name), gguf_printable(pb, b->name), a->offset,
                        a->offset + a->size, b->offset, b->offset + b->size);
                free(ex);
                return PSV_ERR_FORMAT;
            }
        }
        free(ex);
    }
    f->tensor_bytes = total;
    return PSV_OK;
}

// Callers use keys and names as C strings (messages, lookups by formatted name), so they get
// NUL-terminated copies; the index slots move with them.
static psv_status gguf_copy_names(gguf_file *f, psv_error *err) {
    size_t total = 1; // bounded by the file size plus one byte per name: cannot overflow
    for (uint64_t k = 0; k < f->n_kv; k++) total += f->kv[k].key.n + 1;
    for (uint64_t k = 0; k < f->n_tensors; k++) total += f->tensors[k].name.n + 1;
    char *p = f->names = malloc(total);
    if (!p) return err_set(err, PSV_ERR_NOMEM, "gguf: out of memory for %zu bytes of names", total);
    for (uint64_t k = 0; k < f->n_kv; k++) {
        str_t *s = &f->kv[k].key;
        memcpy(p, s->p, s->n);
        p[s->n] = 0;
        s->p = p;
        p += s->n + 1;
    }
    for (uint64_t k = 0; k < f->n_tensors; k++) {
        str_t *s = &f->tensors[k].name;
        memcpy(p, s->p, s->n);
        p[s->n] = 0;
        s->p = p;
        p += s->n + 1;
    }
    for (size_t i = 0; i < f->kv_index_cap; i++)
        if (f->kv_index[i].idx1) f->kv_index[i].p = f->kv[f->kv_index[i].idx1 - 1].key.p;
    for (size_t i = 0; i < f->tensor_index_cap; i++)
        if (f->tensor_index[i].idx1) f->tensor_index[i].p = f->tensors[f->tensor_index[i].idx1 - 1].name.p;
    return PSV_OK;
}

static psv_status gguf_parse(gguf_file *f, psv_error *err) {
    rd_t r = {f->base, f->size, 0, false};
    const uint8_t *b = f->base;
    if (f->size < 4)
        return err_set(err, PSV_ERR_FORMAT, "gguf: file is %zu bytes, too small for a GGUF header (24 bytes)", f->size);
    if (memcmp(b, GGUF_MAGIC, 4) != 0) {
        // Earlier ggml formats wrote their magic as a little-endian uint32 ("ggjt" -> "tjgg").
        bool legacy = memcmp(b, "tjgg", 4) == 0 || memcmp(b, "fmgg", 4) == 0 || memcmp(b, "lmgg", 4) == 0;
        return err_set(err, PSV_ERR_FORMAT,
                       "gguf: bad magic (expected \"GGUF\" = 47 47 55 46, got %02x %02x %02x %02x)%s", b[0], b[1],
                       b[2], b[3], legacy ? ": a legacy GGML/GGJT file, convert it to GGUF" : "");
    }
    r.off = 4;
    if (f->size < 8) return gguf_truncated(err, &r, "header", 20);
    f->version = rd_u32(&r);
    if (f->version == 1)
        return err_set(err, PSV_ERR_UNSUPPORTED,
                       "gguf: version 1 is not supported (expected 2 or 3, got 1; v1 used 32-bit counts: "
                       "re-convert the model)");
    if (f->version != 2 && f->version != 3) {
        // GGUF v3 allows big-endian files; their version field reads byte-swapped here.
        if (f->version != 0 && (f->version & 0xffffu) == 0)
            return err_set(err, PSV_ERR_UNSUPPORTED,
                           "gguf: big-endian GGUF files are not supported (version field 0x%08x)", f->version);
        return err_set(err, PSV_ERR_UNSUPPORTED, "gguf: unsupported version (expected 2 or 3, got %u)", f->version);
    }
    if (f->size < 24) return gguf_truncated(err, &r, "header", 24 - r.off);
    f->n_tensors = rd_u64(&r);
    f->n_kv = rd_u64(&r);
    size_t left = r.n - r.off;
    if (f->n_kv > left / GGUF_MIN_KV_SIZE)
        return err_set(err, PSV_ERR_FORMAT, "gguf: header claims %" PRIu64 " metadata keys but only %zu bytes follow "
                       "(%d or more per key)", f->n_kv, left, GGUF_MIN_KV_SIZE);
    if (f->n_tensors > left / GGUF_MIN_TENSOR_SIZE)
        return err_set(err, PSV_ERR_FORMAT, "gguf: header claims %" PRIu64 " tensors but only %zu bytes follow "
                       "(%d or more per tensor)", f->n_tensors, left, GGUF_MIN_TENSOR_SIZE);
    if (f->n_kv * GGUF_MIN_KV_SIZE + f->n_tensors * GGUF_MIN_TENSOR_SIZE > left)
        return err_set(err, PSV_ERR_FORMAT, "gguf: header claims %" PRIu64 " keys and %" PRIu64 " tensors but only %zu "
                       "bytes follow", f->n_kv, f->n_tensors, left);
    if (f->n_kv > PSV_GGUF_MAX_KV)
        return err_set(err, PSV_ERR_RANGE, "gguf: %" PRIu64 " metadata keys exceed the limit of %d", f->n_kv,
                       PSV_GGUF_MAX_KV);
    if (f->n_tensors > PSV_GGUF_MAX_TENSORS)
        return err_set(err, PSV_ERR_RANGE, "gguf: %" PRIu64 " tensors exceed the limit of %d", f->n_tensors,
                       PSV_GGUF_MAX_TENSORS);

    f->kv = calloc(f->n_kv ? (size_t)f->n_kv : 1, sizeof *f->kv);
    f->tensors = calloc(f->n_tensors ? (size_t)f->n_tensors : 1, sizeof *f->tensors);
    f->kv_index_cap = gguf_index_cap(f->n_kv);
    f->tensor_index_cap = gguf_index_cap(f->n_tensors);
    f->kv_index = calloc(f->kv_index_cap, sizeof *f->kv_index);
    f->tensor_index = calloc(f->tensor_index_cap, sizeof *f->tensor_index);
    if (!f->kv || !f->tensors || !f->kv_index || !f->tensor_index)
        return err_set(err, PSV_ERR_NOMEM, "gguf: out of memory for %" PRIu64 " keys and %" PRIu64 " tensors",
                       f->n_kv, f->n_tensors);

    psv_status st;
    for (uint64_t k = 0; k < f->n_kv; k++)
        if ((st = gguf_parse_kv(f, &r, k, err))) return st;

    // gguf.md: general.alignment is a uint32 and must be a multiple of 8 in writers; readers
    // need only a power of two to round offsets, so that is what we require.
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_slot *as = gguf_probe(f->kv_index, f->kv_index_cap, "general.alignment", 17);
    if (as->idx1) {
        const gguf_kv *al = &f->kv[as->idx1 - 1];
        if (al->type != GGUF_T_UINT32)
            return err_set(err, PSV_ERR_FORMAT, "gguf: key 'general.alignment': wrong type (expected UINT32, got %s)",
                           gguf_vtype_name(al->type));
        if (al->v.u == 0 || (al->v.u & (al->v.u - 1)))
            return err_set(err, PSV_ERR_FORMAT,
                           "gguf: key 'general.alignment': not a power of two (expected 1, 2, 4, ..., got %" PRIu64 ")",
                           al->v.u);
        f->alignment = al->v.u;
    }

    for (uint64_t k = 0; k < f->n_tensors; k++)
        if ((st = gguf_parse_tensor(f, &r, k, err))) return st;

    if ((st = gguf_copy_names(f, err))) return st;

    // The data section starts at the next multiple of the alignment (gguf.md "_padding"). A file
    // without tensors may end before it.
    uint64_t end_infos = r.off;
    f->data_offset = (end_infos + f->alignment - 1) & ~(f->alignment - 1);
    return gguf_check_extents(f, err);
}

GGUF_API void gguf_close(gguf_file *f) {
    if (!f) return;
    if (f->kv)
        for (uint64_t k = 0; k < f->n_kv; k++) free(f->kv[k].str_off);
    free(f->kv);
    free(f->tensors);
    free(f->kv_index);
    free(f->tensor_index);
    free(f->names);
    plat_unmap(&f->map);
    free(f);
}

// Parse `size` bytes at `data`, which the caller keeps alive and unchanged until gguf_close.
// On failure *out is NULL and err says what is wrong (messages start with "gguf: ").
GGUF_API psv_status gguf_open_mem(const void *data, size_t size, gguf_file **out, psv_error *err) {
    *out = NULL;
    gguf_file *f = calloc(1, sizeof *f);
    if (!f) return err_set(err, PSV_ERR_NOMEM, "gguf: out of memory");
    f->base = data;
    f->size = size;
    psv_status st = gguf_parse(f, err);
    if (st) {
        gguf_close(f);
        return st;
    }
    *out = f;
    return PSV_OK;
}

// Map and parse a file. The mapping lives until gguf_close. Error messages start with the path.
GGUF_API psv_status gguf_open(const char *path, gguf_file **out, psv_error *err) {
    *out = NULL;
    plat_map m;
    psv_status st = plat_map_file(path, &m, err); // its messages already name the path
    if (st) return st;
    gguf_file *f;
    st = gguf_open_mem(m.data, m.size, &f, err);
    if (st) {
        plat_unmap(&m);
        err_prefix(err, "%s: ", path);
        return st;
    }
    f->map = m;
    *out = f;
    return PSV_OK;
}

GGUF_API const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key) {
    if (!f || !key) return NULL;
    const gguf_slot *s = gguf_probe(f->kv_index, f->kv_index_cap, key, strlen(key));
    return s->idx1 ? &f->kv[s->idx1 - 1] : NULL;
}

GGUF_API const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name) {
    if (!f || !name) return NULL;
    const gguf_slot *s = gguf_probe(f->tensor_index, f->tensor_index_cap, name, strlen(name));
    return s->idx1 ? &f->tensors[s->idx1 - 1] : NULL;
}

// Typed getters: true when the key is present and its value converts. Integer getters take any
// integer type whose value is in range (not BOOL); gguf_get_f32 takes FLOAT32, FLOAT64 within the
// float range, and integers (rounded to the nearest float); gguf_get_bool only BOOL; gguf_get_str
// only STRING (a slice of the mapping, not NUL-terminated). *out is untouched on false.
GGUF_API bool gguf_get_i64(const gguf_file *f, const char *key, int64_t *out) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv || !gguf_vtype_is_int(kv->type)) return false;
    if (gguf_vtype_is_signed(kv->type)) *out = kv->v.i;
    else if (kv->v.u > (uint64_t)INT64_MAX) return false;
    else *out = (int64_t)kv->v.u;
    return true;
}

GGUF_API bool gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv || !gguf_vtype_is_int(kv->type)) return false;
    if (gguf_vtype_is_signed(kv->type) ? (kv->v.i < 0 || kv->v.i > (int64_t)UINT32_MAX) : kv->v.u > UINT32_MAX)
        return false;
    *out = gguf_vtype_is_signed(kv->type) ? (uint32_t)kv->v.i : (uint32_t)kv->v.u;
    return true;
}

// A double as float; false when it is finite but beyond the float range (3.4e38).
static bool gguf_to_f32(double d, float *out) {
    bool finite = ((f64_bits(d) >> 52) & 0x7ff) != 0x7ff;
    if (finite && (d > 3.4028234663852886e38 || d < -3.4028234663852886e38)) return false;
    *out = (float)d;
    return true;
}

GGUF_API bool gguf_get_f32(const gguf_file *f, const char *key, float *out) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return false;
    if (kv->type == GGUF_T_FLOAT32 || kv->type == GGUF_T_FLOAT64) return gguf_to_f32(kv->v.f, out);
    else if (gguf_vtype_is_int(kv->type))
        *out = gguf_vtype_is_signed(kv->type) ? (float)kv->v.i : (float)kv->v.u;
    else return false;
    return true;
}

GGUF_API bool gguf_get_bool(const gguf_file *f, const char *key, bool *out) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv || kv->type != GGUF_T_BOOL) return false;
    *out = kv->v.u != 0;
    return true;
}

GGUF_API bool gguf_get_str(const gguf_file *f, const char *key, str_t *out) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv || kv->type != GGUF_T_STRING) return false;
    *out = kv->v.s;
    return true;
}

// The array under `key` when its elements are `elem_type`, else NULL.
GGUF_API const gguf_kv *gguf_get_arr(const gguf_file *f, const char *key, uint32_t elem_type) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    return kv && kv->type == GGUF_T_ARRAY && kv->arr_type == elem_type ? kv : NULL;
}

// Element i of a FLOAT32 (or FLOAT64) array; 0 when i is out of range or the array is not one.
// FLOAT64 values beyond the float range become infinities.
GGUF_API float gguf_arr_f32(const gguf_kv *kv, uint64_t i) {
    if (!kv || kv->type != GGUF_T_ARRAY || i >= kv->arr_n) return 0.0f;
    uint64_t u = 0;
    int64_t s = 0;
    double d = 0;
    if (kv->arr_type == GGUF_T_FLOAT32) gguf_load_scalar(GGUF_T_FLOAT32, kv->arr_data + 4 * i, &u, &s, &d);
    else if (kv->arr_type == GGUF_T_FLOAT64) gguf_load_scalar(GGUF_T_FLOAT64, kv->arr_data + 8 * i, &u, &s, &d);
    float r;
    if (!gguf_to_f32(d, &r)) r = f32_from_bits(d < 0 ? 0xff800000u : 0x7f800000u);
    return r;
}

// Element i of an integer (or BOOL) array; UINT64 values above INT64_MAX saturate. 0 when i is
// out of range or the array is not one.
GGUF_API int64_t gguf_arr_int(const gguf_kv *kv, uint64_t i) {
    if (!kv || kv->type != GGUF_T_ARRAY || i >= kv->arr_n) return 0;
    if (!gguf_vtype_is_int(kv->arr_type) && kv->arr_type != GGUF_T_BOOL) return 0;
    uint64_t u = 0;
    int64_t s = 0;
    double d = 0;
    gguf_load_scalar(kv->arr_type, kv->arr_data + gguf_vtype_sizes[kv->arr_type] * i, &u, &s, &d);
    if (gguf_vtype_is_signed(kv->arr_type)) return s;
    return u > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)u;
}

// Element i of a STRING array; an empty slice when out of range or not a string array.
GGUF_API str_t gguf_arr_str(const gguf_kv *kv, uint64_t i) {
    if (!kv || kv->type != GGUF_T_ARRAY || kv->arr_type != GGUF_T_STRING || i >= kv->arr_n) return (str_t){"", 0};
    const uint8_t *p = kv->arr_data + kv->str_off[i]; // validated by the parser: length, then bytes
    return (str_t){(const char *)p + 8, (size_t)ld_u64(p)};
}

// ---- Writer -----------------------------------------------------------------------------------
// Builds a GGUF v3 file: metadata is encoded as it is added, tensors are described up front and
// their bytes are produced only while writing (from a caller pointer or a callback), so a
// multi-GB model streams to disk without being held in memory. Add calls never fail loudly: the
// first problem (bad name, duplicate, out of memory, ...) is kept and returned by the write call,
// and later add calls are ignored. Not thread-safe; one writer per thread.

// Where the writer's bytes go: a FILE* (when f is set) or a growable buffer. Fill callbacks write
// their tensor's bytes through gguf_sink_write, which counts them.
typedef struct gguf_sink {
    FILE *f;
    buf_t *b;
    uint64_t n;  // bytes written so far
    bool failed; // a write failed; err_no says why
    int err_no;
} gguf_sink;

GGUF_API void gguf_sink_write(gguf_sink *s, const void *p, size_t n) {
    if (s->failed || n == 0) return;
    if (s->f) {
        if (fwrite(p, 1, n, s->f) != n) {
            s->failed = true;
            s->err_no = errno ? errno : EIO;
            return;
        }
    } else {
        buf_append(s->b, p, n);
        if (s->b->oom) {
            s->failed = true;
            s->err_no = ENOMEM;
            return;
        }
    }
    s->n += n;
}

static void gguf_sink_zeros(gguf_sink *s, uint64_t n) {
    static const uint8_t zeros[4096];
    while (n > 0 && !s->failed) {
        size_t k = n > sizeof zeros ? sizeof zeros : (size_t)n;
        gguf_sink_write(s, zeros, k);
        n -= k;
    }
}

// Produces the bytes of tensor `t` (name, type, ne and size are set; data is NULL): it must call
// gguf_sink_write with exactly t->size bytes in total, or return an error status.
typedef psv_status (*gguf_fill_fn)(void *user, const gguf_tensor *t, gguf_sink *out, psv_error *err);

typedef struct {
    char *name; // owned; t.name slices it
    gguf_tensor t;
    const void *src; // borrowed; NULL with no fill: zeros
    gguf_fill_fn fill;
    void *user;
} gguf_wtensor;

typedef struct gguf_writer {
    buf_t meta; // the kv pairs, encoded
    uint64_t n_kv;
    str_t *keys; // slices of key_store copies, for the duplicate check
    size_t n_keys, cap_keys;
    gguf_wtensor *tensors;
    size_t n_tensors, cap_tensors;
    uint64_t alignment;
    psv_error err; // the first error from an add call
} gguf_writer;

GGUF_API gguf_writer *gguf_writer_new(void) {
    gguf_writer *w = calloc(1, sizeof *w);
    if (w) w->alignment = GGUF_DEFAULT_ALIGNMENT;
    return w;
}

GGUF_API void gguf_writer_free(gguf_writer *w) {
    if (!w) return;
    for (size_t k = 0; k < w->n_keys; k++) free((char *)w->keys[k].p);
    free(w->keys);
    for (size_t k = 0; k < w->n_tensors; k++) free(w->tensors[k].name);
    free(w->tensors);
    buf_free(&w->meta);
    free(w);
}

static void gw_u32(buf_t *b, uint32_t v) {
    uint8_t t[4];
    wr_u32(t, v);
    buf_append(b, t, 4);
}
static void gw_u64(buf_t *b, uint64_t v) {
    uint8_t t[8];
    wr_u64(t, v);
    buf_append(b, t, 8);
}
static void gw_str(buf_t *b, const char *p, size_t n) {
    gw_u64(b, n);
    buf_append(b, p, n);
}
// One fixed-size value from its bit pattern (two's complement or IEEE), little-endian.
static void gw_bits(buf_t *b, uint32_t type, uint64_t bits) {
    uint8_t t[8];
    wr_u64(t, bits);
    buf_append(b, t, gguf_vtype_sizes[type]);
}

static bool gguf_w_ok(gguf_writer *w) { return w && w->err.status == PSV_OK && !w->meta.oom; }

static bool gguf_w_name_ok(gguf_writer *w, str_t s, const char *what) {
    char pr[96];
    if (s.n > GGUF_MAX_NAME) {
        err_set(&w->err, PSV_ERR_INVALID, "gguf writer: %s '%s': longer than %d bytes", what, gguf_printable(pr, s),
                GGUF_MAX_NAME);
        return false;
    }
    return gguf_check_name(s, "gguf writer", what, PSV_ERR_INVALID, &w->err) == PSV_OK;
}

// Starts a pair: checks the key, records it, encodes key and type. false: nothing was added.
static bool gguf_w_begin(gguf_writer *w, str_t key, uint32_t type) {
    char pr[96];
    if (!gguf_w_ok(w) || !gguf_w_name_ok(w, key, "key")) return false;
    for (size_t k = 0; k < w->n_keys; k++)
        if (str_eq(w->keys[k], key)) {
            err_set(&w->err, PSV_ERR_INVALID, "gguf writer: duplicate key '%s'", gguf_printable(pr, key));
            return false;
        }
    if (w->n_kv >= PSV_GGUF_MAX_KV) {
        err_set(&w->err, PSV_ERR_RANGE, "gguf writer: more than %d keys", PSV_GGUF_MAX_KV);
        return false;
    }
    if (w->n_keys == w->cap_keys) {
        size_t cap = w->cap_keys ? 2 * w->cap_keys : 32;
        str_t *p = realloc(w->keys, cap * sizeof *p);
        if (!p) goto oom;
        w->keys = p;
        w->cap_keys = cap;
    }
    char *copy = str_dup(key);
    if (!copy) goto oom;
    w->keys[w->n_keys++] = (str_t){copy, key.n};
    w->n_kv++;
    gw_str(&w->meta, key.p, key.n);
    gw_u32(&w->meta, type);
    return true;
oom:
    err_set(&w->err, PSV_ERR_NOMEM, "gguf writer: out of memory");
    return false;
}

static void gguf_w_scalar(gguf_writer *w, const char *key, uint32_t type, uint64_t bits) {
    if (w && strcmp(key, "general.alignment") == 0 && gguf_w_ok(w)) {
        if (type != GGUF_T_UINT32) {
            err_set(&w->err, PSV_ERR_INVALID,
                    "gguf writer: key 'general.alignment': wrong type (expected UINT32, got %s)",
                    gguf_vtype_name(type));
            return;
        }
        if (bits == 0 || (bits & (bits - 1))) {
            err_set(&w->err, PSV_ERR_INVALID, "gguf writer: key 'general.alignment': %" PRIu64 " is not a power of two",
                    bits);
            return;
        }
        w->alignment = bits;
    }
    if (gguf_w_begin(w, str_c(key), type)) gw_bits(&w->meta, type, bits);
}

GGUF_API void gguf_w_u8(gguf_writer *w, const char *key, uint8_t v) {
    gguf_w_scalar(w, key, GGUF_T_UINT8, v);
}
GGUF_API void gguf_w_i8(gguf_writer *w, const char *key, int8_t v) {
    gguf_w_scalar(w, key, GGUF_T_INT8, (uint64_t)(int64_t)v);
}
GGUF_API void gguf_w_u16(gguf_writer *w, const char *key, uint16_t v) {
    gguf_w_scalar(w, key, GGUF_T_UINT16, v);
}
GGUF_API void gguf_w_i16(gguf_writer *w, const char *key, int16_t v) {
    gguf_w_scalar(w, key, GGUF_T_INT16, (uint64_t)(int64_t)v);
}
GGUF_API void gguf_w_u32(gguf_writer *w, const char *key, uint32_t v) {
    gguf_w_scalar(w, key, GGUF_T_UINT32, v);
}
GGUF_API void gguf_w_i32(gguf_writer *w, const char *key, int32_t v) {
    gguf_w_scalar(w, key, GGUF_T_INT32, (uint64_t)(int64_t)v);
}
GGUF_API void gguf_w_f32(gguf_writer *w, const char *key, float v) {
    gguf_w_scalar(w, key, GGUF_T_FLOAT32, f32_bits(v));
}
GGUF_API void gguf_w_bool(gguf_writer *w, const char *key, bool v) {
    gguf_w_scalar(w, key, GGUF_T_BOOL, v ? 1 : 0);
}
GGUF_API void gguf_w_u64(gguf_writer *w, const char *key, uint64_t v) {
    gguf_w_scalar(w, key, GGUF_T_UINT64, v);
}
GGUF_API void gguf_w_i64(gguf_writer *w, const char *key, int64_t v) {
    gguf_w_scalar(w, key, GGUF_T_INT64, (uint64_t)v);
}
GGUF_API void gguf_w_f64(gguf_writer *w, const char *key, double v) {
    gguf_w_scalar(w, key, GGUF_T_FLOAT64, f64_bits(v));
}
// Sets general.alignment (a power of two; default 32).
GGUF_API void gguf_w_alignment(gguf_writer *w, uint32_t alignment) { gguf_w_u32(w, "general.alignment", alignment); }

static bool gguf_w_len_ok(gguf_writer *w, str_t key, uint64_t n, uint64_t max, const char *what) {
    char pr[96];
    if (!gguf_w_ok(w)) return false;
    if (n > max) {
        err_set(&w->err, PSV_ERR_RANGE, "gguf writer: key '%s': %s of %" PRIu64 " exceeds the limit of %" PRIu64,
                gguf_printable(pr, key), what, n, max);
        return false;
    }
    return true;
}

GGUF_API void gguf_w_strn(gguf_writer *w, const char *key, const char *s, size_t n) {
    if (!gguf_w_len_ok(w, str_c(key), n, PSV_GGUF_MAX_STRING, "string length")) return;
    if (gguf_w_begin(w, str_c(key), GGUF_T_STRING)) gw_str(&w->meta, s, n);
}
GGUF_API void gguf_w_str(gguf_writer *w, const char *key, const char *s) { gguf_w_strn(w, key, s, strlen(s)); }

// Fixed-size elements given as a C array of the element's type (uint8_t, int8_t, uint16_t,
// int16_t, uint32_t, int32_t, float, bool, uint64_t, int64_t, double).
GGUF_API void gguf_w_arr(gguf_writer *w, const char *key, uint32_t elem_type, const void *elems, uint64_t n) {
    if (w && gguf_w_ok(w) && (elem_type >= GGUF_T_COUNT || gguf_vtype_sizes[elem_type] == 0)) {
        err_set(&w->err, PSV_ERR_INVALID, "gguf writer: key '%s': gguf_w_arr takes fixed-size elements (got type %u)",
                key, elem_type);
        return;
    }
    if (!gguf_w_len_ok(w, str_c(key), n, PSV_GGUF_MAX_ARRAY, "array count")) return;
    if (!gguf_w_begin(w, str_c(key), GGUF_T_ARRAY)) return;
    gw_u32(&w->meta, elem_type);
    gw_u64(&w->meta, n);
    size_t esz = gguf_vtype_sizes[elem_type];
    const uint8_t *p = elems;
    for (uint64_t k = 0; k < n; k++) {
        uint64_t bits = 0;
        if (elem_type == GGUF_T_BOOL) bits = ((const bool *)elems)[k] ? 1 : 0;
        else if (esz == 1) bits = p[k];
        else if (esz == 2) { uint16_t v; memcpy(&v, p + 2 * k, 2); bits = v; }
        else if (esz == 4) { uint32_t v; memcpy(&v, p + 4 * k, 4); bits = v; }
        else memcpy(&bits, p + 8 * k, 8);
        gw_bits(&w->meta, elem_type, bits);
    }
}

GGUF_API void gguf_w_arr_strn(gguf_writer *w, const char *key, const str_t *strs, uint64_t n) {
    if (!gguf_w_len_ok(w, str_c(key), n, PSV_GGUF_MAX_ARRAY, "array count")) return;
    for (uint64_t k = 0; k < n; k++)
        if (!gguf_w_len_ok(w, str_c(key), strs[k].n, PSV_GGUF_MAX_STRING, "string length")) return;
    if (!gguf_w_begin(w, str_c(key), GGUF_T_ARRAY)) return;
    gw_u32(&w->meta, GGUF_T_STRING);
    gw_u64(&w->meta, n);
    for (uint64_t k = 0; k < n; k++) gw_str(&w->meta, strs[k].p, strs[k].n);
}

// NUL-terminated strings.
GGUF_API void gguf_w_arr_str(gguf_writer *w, const char *key, const char *const *strs, uint64_t n) {
    if (!gguf_w_len_ok(w, str_c(key), n, PSV_GGUF_MAX_ARRAY, "array count")) return;
    if (!gguf_w_begin(w, str_c(key), GGUF_T_ARRAY)) return;
    gw_u32(&w->meta, GGUF_T_STRING);
    gw_u64(&w->meta, n);
    for (uint64_t k = 0; k < n; k++) gw_str(&w->meta, strs[k], strlen(strs[k]));
}

// Copies a pair from a parsed file (e.g. to rewrite a model with new tensors).
GGUF_API void gguf_w_kv(gguf_writer *w, const gguf_kv *kv) {
    if (!gguf_w_ok(w)) return;
    if (str_eq_c(kv->key, "general.alignment") && kv->type == GGUF_T_UINT32 && kv->v.u && !(kv->v.u & (kv->v.u - 1)))
        w->alignment = kv->v.u;
    if (!gguf_w_begin(w, kv->key, kv->type)) return;
    if (kv->type == GGUF_T_STRING) {
        gw_str(&w->meta, kv->v.s.p, kv->v.s.n);
    } else if (kv->type == GGUF_T_ARRAY) {
        gw_u32(&w->meta, kv->arr_type);
        gw_u64(&w->meta, kv->arr_n);
        if (kv->arr_type == GGUF_T_STRING)
            for (uint64_t k = 0; k < kv->arr_n; k++) {
                str_t e = gguf_arr_str(kv, k);
                gw_str(&w->meta, e.p, e.n);
            }
        else
            buf_append(&w->meta, kv->arr_data, (size_t)kv->arr_n * gguf_vtype_sizes[kv->arr_type]);
    } else if (kv->type == GGUF_T_FLOAT32) {
        gw_bits(&w->meta, kv->type, f32_bits((float)kv->v.f));
    } else if (kv->type == GGUF_T_FLOAT64) {
        gw_bits(&w->meta, kv->type, f64_bits(kv->v.f));
    } else {
        gw_bits(&w->meta, kv->type, gguf_vtype_is_signed(kv->type) ? (uint64_t)kv->v.i : kv->v.u);
    }
}

static void gguf_w_tensor_add(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims, const uint64_t *ne,
                              const void *src, gguf_fill_fn fill, void *user) {
    char pr[96];
    if (!gguf_w_ok(w) || !gguf_w_name_ok(w, str_c(name), "tensor")) return;
    str_t sname = str_c(name);
    gguf_printable(pr, sname);
    for (size_t k = 0; k < w->n_tensors; k++)
        if (str_eq(w->tensors[k].t.name, sname)) {
            err_set(&w->err, PSV_ERR_INVALID, "gguf writer: duplicate tensor name '%s'", pr);
            return;
        }
    if (w->n_tensors >= PSV_GGUF_MAX_TENSORS) {
        err_set(&w->err, PSV_ERR_RANGE, "gguf writer: more than %d tensors", PSV_GGUF_MAX_TENSORS);
        return;
    }
    gguf_tensor t = {.name = sname, .n_dims = n_dims, .ne = {1, 1, 1, 1}, .type = type};
    const type_info *ti = type_get(type);
    if (!ti) {
        err_set(&w->err, PSV_ERR_INVALID, "gguf writer: tensor '%s': unknown tensor type %u", pr, type);
        return;
    }
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS) {
        err_set(&w->err, PSV_ERR_INVALID, "gguf writer: tensor '%s': %u dimensions (expected 1 to %d)", pr, n_dims,
                GGUF_MAX_DIMS);
        return;
    }
    uint64_t n_elem = 1, row;
    for (uint32_t d = 0; d < n_dims; d++) {
        t.ne[d] = ne[d];
        if (ne[d] == 0 || ne[d] > (uint64_t)INT64_MAX || !ck_mul_u64(n_elem, ne[d], &n_elem) ||
            n_elem > (uint64_t)INT64_MAX) {
            err_set(&w->err, PSV_ERR_INVALID, "gguf writer: tensor '%s': bad dimension %u (%" PRIu64 ")", pr, d, ne[d]);
            return;
        }
    }
    if (!type_row_size(type, t.ne[0], &row) || !ck_mul_u64(row, t.ne[1], &t.size) ||
        !ck_mul_u64(t.size, t.ne[2], &t.size) || !ck_mul_u64(t.size, t.ne[3], &t.size)) {
        err_set(&w->err, PSV_ERR_INVALID,
                "gguf writer: tensor '%s': row length %" PRIu64 " is not a multiple of the %s block size %u", pr,
                t.ne[0], ti->name, ti->blck_size);
        return;
    }
    if (src && t.size > SIZE_MAX) {
        err_set(&w->err, PSV_ERR_RANGE, "gguf writer: tensor '%s': too large for this platform", pr);
        return;
    }
    if (w->n_tensors == w->cap_tensors) {
        size_t cap = w->cap_tensors ? 2 * w->cap_tensors : 16;
        gguf_wtensor *p = realloc(w->tensors, cap * sizeof *p);
        if (!p) goto oom;
        w->tensors = p;
        w->cap_tensors = cap;
    }
    char *copy = str_dup(sname);
    if (!copy) goto oom;
    t.name.p = copy;
    w->tensors[w->n_tensors++] = (gguf_wtensor){copy, t, src, fill, user};
    return;
oom:
    err_set(&w->err, PSV_ERR_NOMEM, "gguf writer: out of memory");
}

// A tensor whose bytes are at `data` (borrowed until the write; NULL writes zeros). ne[0] is the
// row length; n_dims values are read from ne.
GGUF_API void gguf_w_tensor(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims, const uint64_t *ne,
                          const void *data) {
    gguf_w_tensor_add(w, name, type, n_dims, ne, data, NULL, NULL);
}

// A tensor whose bytes `fill` produces during the write, in the order tensors were added.
GGUF_API void gguf_w_tensor_fn(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims, const uint64_t *ne,
                             gguf_fill_fn fill, void *user) {
    gguf_w_tensor_add(w, name, type, n_dims, ne, NULL, fill, user);
}

static psv_status gguf_sink_status(const gguf_sink *s, psv_error *err) {
    if (!s->failed) return PSV_OK;
    return err_set(err, s->err_no == ENOMEM ? PSV_ERR_NOMEM : PSV_ERR_IO, "gguf writer: write failed: %s",
                   strerror(s->err_no));
}

// Layout (gguf.md): header, kv pairs, tensor infos, zero padding to the alignment, then each
// tensor at its offset (a multiple of the alignment). The file ends with the last tensor's last
// byte, so any truncation is detectable.
static psv_status gguf_writer_emit(gguf_writer *w, gguf_sink *s, psv_error *err) {
    if (!w) return err_set(err, PSV_ERR_NOMEM, "gguf writer: out of memory");
    if (w->err.status) return err_set(err, w->err.status, "%s", w->err.message);
    if (w->meta.oom) return err_set(err, PSV_ERR_NOMEM, "gguf writer: out of memory");
    uint64_t off = 0, a = w->alignment;
    for (size_t k = 0; k < w->n_tensors; k++) {
        gguf_tensor *t = &w->tensors[k].t;
        t->offset = off;
        if (!ck_add_u64(off, t->size, &off) || !ck_add_u64(off, a - 1, &off))
            return err_set(err, PSV_ERR_RANGE, "gguf writer: total tensor size overflows");
        off &= ~(a - 1);
    }
    buf_t h = {0};
    buf_append(&h, GGUF_MAGIC, 4);
    gw_u32(&h, 3);
    gw_u64(&h, w->n_tensors);
    gw_u64(&h, w->n_kv);
    if (w->meta.len) buf_append(&h, w->meta.data, w->meta.len);
    for (size_t k = 0; k < w->n_tensors; k++) {
        const gguf_tensor *t = &w->tensors[k].t;
        gw_str(&h, t->name.p, t->name.n);
        gw_u32(&h, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) gw_u64(&h, t->ne[d]);
        gw_u32(&h, t->type);
        gw_u64(&h, t->offset);
    }
    if (h.oom) {
        buf_free(&h);
        return err_set(err, PSV_ERR_NOMEM, "gguf writer: out of memory");
    }
    uint64_t start = s->n;
    gguf_sink_write(s, h.data, h.len);
    buf_free(&h);
    uint64_t data_start = (s->n - start + a - 1) & ~(a - 1);
    for (size_t k = 0; k < w->n_tensors && !s->failed; k++) {
        const gguf_wtensor *wt = &w->tensors[k];
        gguf_sink_zeros(s, start + data_start + wt->t.offset - s->n);
        uint64_t before = s->n;
        if (wt->fill) {
            psv_status st = wt->fill(wt->user, &wt->t, s, err);
            if (st) {
                char pr[96];
                err_set(err, st, "gguf writer: tensor '%s': fill callback failed", gguf_printable(pr, wt->t.name));
                return st;
            }
        } else if (wt->src) {
            gguf_sink_write(s, wt->src, (size_t)wt->t.size);
        } else {
            gguf_sink_zeros(s, wt->t.size);
        }
        if (!s->failed && s->n - before != wt->t.size) {
            char pr[96];
            return err_set(err, PSV_ERR_INVALID, "gguf writer: tensor '%s': fill callback wrote %" PRIu64
                           " bytes (expected %" PRIu64 ")", gguf_printable(pr, wt->t.name), s->n - before, wt->t.size);
        }
    }
    return gguf_sink_status(s, err);
}

// Writes the file at the current position of `f`, which must be the start of the file (offsets
// in the file are counted from where the write begins). The writer can be written again.
GGUF_API psv_status gguf_writer_write(gguf_writer *w, FILE *f, psv_error *err) {
    gguf_sink s = {.f = f};
    errno = 0;
    return gguf_writer_emit(w, &s, err);
}

// Appends the file to `out` (tests and fuzz seeds).
GGUF_API psv_status gguf_writer_to_buf(gguf_writer *w, buf_t *out, psv_error *err) {
    gguf_sink s = {.b = out};
    return gguf_writer_emit(w, &s, err);
}

// Creates or truncates `path`; a partial file is removed on failure.
GGUF_API psv_status gguf_writer_save(gguf_writer *w, const char *path, psv_error *err) {
    FILE *f = fopen(path, "wb");
    if (!f) return err_set(err, PSV_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    psv_status st = gguf_writer_write(w, f, err);
    if (fclose(f) != 0 && st == PSV_OK) st = err_set(err, PSV_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    if (st) {
        remove(path);
        err_prefix(err, "%s: ", path);
    }
    return st;
}

// ---- `pensieve info` --------------------------------------------------------------------------

// Appends untrusted text for a terminal: valid UTF-8 as is, control bytes and invalid UTF-8 as
// escapes (\n, \t, \r, \xNN), plus \" and \\ when quoted. At most `max` bytes of s are shown,
// cut at a character boundary and followed by `...` and the full length.
static void gguf_put_text(buf_t *b, str_t s, size_t max, bool quoted) {
    if (quoted) buf_putc(b, '"');
    size_t i = 0;
    while (i < s.n && i < max) {
        uint8_t c = (uint8_t)s.p[i];
        if (c >= 0x80) {
            size_t k = (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 1;
            if (k > 1 && k <= s.n - i && gguf_utf8_valid(s.p + i, k)) {
                if (i + k > max) break;
                buf_append(b, s.p + i, k);
                i += k;
                continue;
            }
            buf_printf(b, "\\x%02x", c);
        } else if (c == '\n') buf_puts(b, "\\n");
        else if (c == '\t') buf_puts(b, "\\t");
        else if (c == '\r') buf_puts(b, "\\r");
        else if (c < 0x20 || c == 0x7f) buf_printf(b, "\\x%02x", c);
        else if (quoted && (c == '"' || c == '\\')) {
            buf_putc(b, '\\');
            buf_putc(b, (char)c);
        } else buf_putc(b, (char)c);
        i++;
    }
    if (i < s.n) buf_puts(b, "...");
    if (quoted) buf_putc(b, '"');
    if (i < s.n) buf_printf(b, " (%zu bytes)", s.n);
}

// The shortest decimal that reads back as the same value (as float when `single`).
static void gguf_put_float(buf_t *b, double v, bool single) {
    char tmp[48];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*g", prec, v);
        if (single ? strtof(tmp, NULL) == (float)v : strtod(tmp, NULL) == v) break;
    }
    // Whole numbers read better without an exponent (rope bases like 10000, 1e6).
    if (strchr(tmp, 'e') && v > -1e16 && v < 1e16 && v == (double)(int64_t)v) snprintf(tmp, sizeof tmp, "%.0f", v);
    buf_puts(b, tmp);
}

// One fixed-size value at p.
static void gguf_put_elem(buf_t *b, uint32_t type, const uint8_t *p) {
    uint64_t u = 0;
    int64_t i = 0;
    double d = 0;
    gguf_load_scalar(type, p, &u, &i, &d);
    if (type == GGUF_T_BOOL) buf_puts(b, u ? "true" : "false");
    else if (type == GGUF_T_FLOAT32 || type == GGUF_T_FLOAT64) gguf_put_float(b, d, type == GGUF_T_FLOAT32);
    else if (gguf_vtype_is_signed(type)) buf_printf(b, "%" PRId64, i);
    else buf_printf(b, "%" PRIu64, u);
}

static void gguf_put_value(buf_t *b, const gguf_kv *kv) {
    if (kv->type == GGUF_T_STRING) {
        gguf_put_text(b, kv->v.s, 64, true);
    } else if (kv->type == GGUF_T_ARRAY) {
        buf_printf(b, "[%s x %" PRIu64 "]", gguf_vtype_name(kv->arr_type), kv->arr_n);
        bool str = kv->arr_type == GGUF_T_STRING;
        uint64_t show = PSV_MIN(kv->arr_n, (uint64_t)(str ? 4 : 8));
        for (uint64_t k = 0; k < show; k++) {
            buf_puts(b, k ? ", " : " ");
            if (str) gguf_put_text(b, gguf_arr_str(kv, k), 24, true);
            else gguf_put_elem(b, kv->arr_type, kv->arr_data + gguf_vtype_sizes[kv->arr_type] * k);
        }
        if (show < kv->arr_n) buf_puts(b, ", ...");
    } else {
        uint8_t raw[8];
        uint64_t bits = kv->type == GGUF_T_FLOAT32   ? f32_bits((float)kv->v.f)
                        : kv->type == GGUF_T_FLOAT64 ? f64_bits(kv->v.f)
                        : gguf_vtype_is_signed(kv->type) ? (uint64_t)kv->v.i
                                                         : kv->v.u;
        wr_u64(raw, bits);
        gguf_put_elem(b, kv->type, raw);
    }
}

static void gguf_put_count(buf_t *b, uint64_t n) {
    if (n >= 1000000000ull) buf_printf(b, "%.2f B", (double)n / 1e9);
    else if (n >= 1000000ull) buf_printf(b, "%.2f M", (double)n / 1e6);
    else if (n >= 1000ull) buf_printf(b, "%.2f K", (double)n / 1e3);
    else buf_printf(b, "%" PRIu64, n);
}

// The report of `pensieve info`: header, every metadata pair (arrays and long strings
// summarised), the tensor table and totals. `name` labels the first line (may be NULL).
GGUF_API void gguf_info(const gguf_file *f, const char *name, buf_t *b) {
    buf_printf(b, "%s: GGUF v%u, %zu bytes\n", name ? name : "(memory)", f->version, f->size);
    buf_printf(b, "  tensors      %" PRIu64 "\n", f->n_tensors);
    buf_printf(b, "  metadata     %" PRIu64 " keys\n", f->n_kv);
    buf_printf(b, "  alignment    %" PRIu64 "\n", f->alignment);
    buf_printf(b, "  data offset  %" PRIu64 "\n", f->data_offset);

    size_t kw = 8;
    for (uint64_t k = 0; k < f->n_kv; k++) kw = PSV_MAX(kw, PSV_MIN(f->kv[k].key.n, (size_t)48));
    buf_printf(b, "\nmetadata:\n");
    for (uint64_t k = 0; k < f->n_kv; k++) {
        const gguf_kv *kv = &f->kv[k];
        size_t len0 = b->len;
        buf_puts(b, "  ");
        gguf_put_text(b, kv->key, 200, false);
        size_t shown = b->len - len0 - 2;
        buf_printf(b, "%*s  %-7s  ", shown < kw ? (int)(kw - shown) : 0, "", gguf_vtype_name(kv->type));
        gguf_put_value(b, kv);
        buf_putc(b, '\n');
    }

    uint64_t n_params = 0, by_count[T_COUNT] = {0}, by_bytes[T_COUNT] = {0}, by_params[T_COUNT] = {0};
    size_t nw = 4;
    for (uint64_t k = 0; k < f->n_tensors; k++) nw = PSV_MAX(nw, PSV_MIN(f->tensors[k].name.n, (size_t)40));
    buf_printf(b, "\ntensors:%s\n", f->n_tensors ? "" : " none");
    if (f->n_tensors)
        buf_printf(b, "  %5s  %-*s  %-7s  %-26s  %12s  %12s\n", "#", (int)nw, "name", "type", "shape (ne0 x ne1 ...)",
                   "offset", "bytes");
    for (uint64_t k = 0; k < f->n_tensors; k++) {
        const gguf_tensor *t = &f->tensors[k];
        uint64_t n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]; // checked when parsed
        n_params += n;
        by_count[t->type]++;
        by_bytes[t->type] += t->size;
        by_params[t->type] += n;
        size_t len0 = b->len;
        buf_printf(b, "  %5" PRIu64 "  ", k);
        gguf_put_text(b, t->name, 200, false);
        size_t shown = b->len - len0 - 9;
        char shape[96];
        int sl = 0;
        for (uint32_t d = 0; d < t->n_dims; d++)
            sl += snprintf(shape + sl, sizeof shape - (size_t)sl, "%s%" PRIu64, d ? " x " : "", t->ne[d]);
        buf_printf(b, "%*s  %-7s  %-26s  %12" PRIu64 "  %12" PRIu64 "\n", shown < nw ? (int)(nw - shown) : 0, "",
                   type_get(t->type)->name, shape, t->offset, t->size);
    }

    buf_printf(b, "\ntotals:\n");
    buf_printf(b, "  tensor bytes  %" PRIu64 " (%.2f MiB)\n", f->tensor_bytes, (double)f->tensor_bytes / 1048576.0);
    buf_printf(b, "  parameters    %" PRIu64 " (", n_params);
    gguf_put_count(b, n_params);
    buf_puts(b, ")\n");
    if (f->n_tensors) buf_printf(b, "  %-7s  %7s  %14s  %14s\n", "type", "tensors", "bytes", "parameters");
    for (uint32_t ty = 0; ty < T_COUNT; ty++)
        if (by_count[ty])
            buf_printf(b, "  %-7s  %7" PRIu64 "  %14" PRIu64 "  %14" PRIu64 "\n", type_table[ty].name, by_count[ty],
                       by_bytes[ty], by_params[ty]);
}

static int cli_info(int argc, char **argv) {
    static const char usage[] =
        "usage: pensieve info FILE...\n"
        "Prints a GGUF file's header, metadata (arrays and long strings summarised), tensor table\n"
        "and totals. Exits 1 when a file cannot be read or is not valid GGUF.\n";
    if (argc < 2) {
        fprintf(stderr, "pensieve info: expected a FILE\n%s", usage);
        return 1;
    }
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(usage, stdout);
            return 0;
        }
        if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "pensieve info: unknown option '%s'\n%s", argv[i], usage);
            return 1;
        }
    }
    int rc = 0;
    for (int i = 1; i < argc; i++) {
        psv_error err = {0};
        gguf_file *f;
        if (gguf_open(argv[i], &f, &err)) {
            fprintf(stderr, "pensieve info: %s\n", err.message); // gguf_open messages start with the path
            rc = 1;
            continue;
        }
        buf_t b = {0};
        if (i > 1) buf_putc(&b, '\n');
        gguf_info(f, argv[i], &b);
        gguf_close(f);
        if (b.oom) {
            fprintf(stderr, "pensieve info: %s: out of memory\n", argv[i]);
            rc = 1;
        } else if (fwrite(b.data, 1, b.len, stdout) != b.len || fflush(stdout) != 0) {
            fprintf(stderr, "pensieve info: cannot write the report: %s\n", strerror(errno));
            buf_free(&b);
            return 1;
        }
        buf_free(&b);
    }
    return rc;
}


// ----------------------------------------------------------------------------
// 8. Unicode
// General_Category and White_Space of every code point, Unicode 15.0.0. GENERATED by
// tools/gen_unicode.py from the Unicode Character Database (Debian's unicode-data package);
// do not edit by hand: change the script and run
// `python3 tools/gen_unicode.py --update pensieve.c`.
// The tokenizers' pre-tokenizer rules are written in terms of these (UAX #44 §5.7.1).

// General_Category values. UNI_CN (unassigned, and anything above U+10FFFF) is 0.
typedef enum {
    UNI_CN = 0, UNI_LU = 1, UNI_LL = 2, UNI_LT = 3, UNI_LM = 4, UNI_LO = 5, UNI_MN = 6, UNI_MC = 7,
    UNI_ME = 8, UNI_ND = 9, UNI_NL = 10, UNI_NO = 11, UNI_PC = 12, UNI_PD = 13, UNI_PS = 14, UNI_PE = 15,
    UNI_PI = 16, UNI_PF = 17, UNI_PO = 18, UNI_SM = 19, UNI_SC = 20, UNI_SK = 21, UNI_SO = 22, UNI_ZS = 23,
    UNI_ZL = 24, UNI_ZP = 25, UNI_CC = 26, UNI_CF = 27, UNI_CS = 28, UNI_CO = 29,
    UNI_GC_COUNT = 30
} uni_gc;

// Major classes, as \p{L} \p{M} \p{N} \p{P} \p{S} \p{Z} \p{C} match them.
#define UNI_IS_L(gc) ((gc) >= UNI_LU && (gc) <= UNI_LO)
#define UNI_IS_M(gc) ((gc) >= UNI_MN && (gc) <= UNI_ME)
#define UNI_IS_N(gc) ((gc) >= UNI_ND && (gc) <= UNI_NO)
#define UNI_IS_P(gc) ((gc) >= UNI_PC && (gc) <= UNI_PO)
#define UNI_IS_S(gc) ((gc) >= UNI_SM && (gc) <= UNI_SO)
#define UNI_IS_Z(gc) ((gc) >= UNI_ZS && (gc) <= UNI_ZP)
#define UNI_IS_C(gc) ((gc) >= UNI_CC && (gc) <= UNI_CO)

static const uint8_t uni_gc_ascii[128] = {
    26, 26, 26, 26, 26, 26, 26, 26, 26, 26, 26, 26, 26, 26, 26, 26,
    26, 26, 26, 26, 26, 26, 26, 26, 26, 26, 26, 26, 26, 26, 26, 26,
    23, 18, 18, 18, 20, 18, 18, 18, 14, 15, 18, 19, 18, 13, 18, 18,
    9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 18, 18, 19, 19, 19, 18,
    18, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 14, 18, 15, 21, 12,
    21, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
    2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 14, 19, 15, 19, 26,
};

// 4007 ranges covering U+0000..U+10FFFF in order: (first code point << 5) | uni_gc. A range
// runs up to the next entry's first code point.
static const uint32_t uni_gc_ranges[4007] = {
    0x0000001a, 0x00000417, 0x00000432, 0x00000494, 0x000004b2, 0x0000050e, 0x0000052f, 0x00000552,
    0x00000573, 0x00000592, 0x000005ad, 0x000005d2, 0x00000609, 0x00000752, 0x00000793, 0x000007f2,
    0x00000821, 0x00000b6e, 0x00000b92, 0x00000baf, 0x00000bd5, 0x00000bec, 0x00000c15, 0x00000c22,
    0x00000f6e, 0x00000f93, 0x00000faf, 0x00000fd3, 0x00000ffa, 0x00001417, 0x00001432, 0x00001454,
    0x000014d6, 0x000014f2, 0x00001515, 0x00001536, 0x00001545, 0x00001570, 0x00001593, 0x000015bb,
    0x000015d6, 0x000015f5, 0x00001616, 0x00001633, 0x0000164b, 0x00001695, 0x000016a2, 0x000016d2,
    0x00001715, 0x0000172b, 0x00001745, 0x00001771, 0x0000178b, 0x000017f2, 0x00001801, 0x00001af3,
    0x00001b01, 0x00001be2, 0x00001ef3, 0x00001f02, 0x00002001, 0x00002022, 0x00002041, 0x00002062,
    0x00002081, 0x000020a2, 0x000020c1, 0x000020e2, 0x00002101, 0x00002122, 0x00002141, 0x00002162,
    0x00002181, 0x000021a2, 0x000021c1, 0x000021e2, 0x00002201, 0x00002222, 0x00002241, 0x00002262,
    0x00002281, 0x000022a2, 0x000022c1, 0x000022e2, 0x00002301, 0x00002322, 0x00002341, 0x00002362,
    0x00002381, 0x000023a2, 0x000023c1, 0x000023e2, 0x00002401, 0x00002422, 0x00002441, 0x00002462,
    0x00002481, 0x000024a2, 0x000024c1, 0x000024e2, 0x00002501, 0x00002522, 0x00002541, 0x00002562,
    0x00002581, 0x000025a2, 0x000025c1, 0x000025e2, 0x00002601, 0x00002622, 0x00002641, 0x00002662,
    0x00002681, 0x000026a2, 0x000026c1, 0x000026e2, 0x00002721, 0x00002742, 0x00002761, 0x00002782,
    0x000027a1, 0x000027c2, 0x000027e1, 0x00002802, 0x00002821, 0x00002842, 0x00002861, 0x00002882,
    0x000028a1, 0x000028c2, 0x000028e1, 0x00002902, 0x00002941, 0x00002962, 0x00002981, 0x000029a2,
    0x000029c1, 0x000029e2, 0x00002a01, 0x00002a22, 0x00002a41, 0x00002a62, 0x00002a81, 0x00002aa2,
    0x00002ac1, 0x00002ae2, 0x00002b01, 0x00002b22, 0x00002b41, 0x00002b62, 0x00002b81, 0x00002ba2,
    0x00002bc1, 0x00002be2, 0x00002c01, 0x00002c22, 0x00002c41, 0x00002c62, 0x00002c81, 0x00002ca2,
    0x00002cc1, 0x00002ce2, 0x00002d01, 0x00002d22, 0x00002d41, 0x00002d62, 0x00002d81, 0x00002da2,
    0x00002dc1, 0x00002de2, 0x00002e01, 0x00002e22, 0x00002e41, 0x00002e62, 0x00002e81, 0x00002ea2,
    0x00002ec1, 0x00002ee2, 0x00002f01, 0x00002f42, 0x00002f61, 0x00002f82, 0x00002fa1, 0x00002fc2,
    0x00003021, 0x00003062, 0x00003081, 0x000030a2, 0x000030c1, 0x00003102, 0x00003121, 0x00003182,
    0x000031c1, 0x00003242, 0x00003261, 0x000032a2, 0x000032c1, 0x00003322, 0x00003381, 0x000033c2,
    0x000033e1, 0x00003422, 0x00003441, 0x00003462, 0x00003481, 0x000034a2, 0x000034c1, 0x00003502,
    0x00003521, 0x00003542, 0x00003581, 0x000035a2, 0x000035c1, 0x00003602, 0x00003621, 0x00003682,
    0x000036a1, 0x000036c2, 0x000036e1, 0x00003722, 0x00003765, 0x00003781, 0x000037a2, 0x00003805,
    0x00003881, 0x000038a3, 0x000038c2, 0x000038e1, 0x00003903, 0x00003922, 0x00003941, 0x00003963,
    0x00003982, 0x000039a1, 0x000039c2, 0x000039e1, 0x00003a02, 0x00003a21, 0x00003a42, 0x00003a61,
    0x00003a82, 0x00003aa1, 0x00003ac2, 0x00003ae1, 0x00003b02, 0x00003b21, 0x00003b42, 0x00003b61,
    0x00003b82, 0x00003bc1, 0x00003be2, 0x00003c01, 0x00003c22, 0x00003c41, 0x00003c62, 0x00003c81,
    0x00003ca2, 0x00003cc1, 0x00003ce2, 0x00003d01, 0x00003d22, 0x00003d41, 0x00003d62, 0x00003d81,
    0x00003da2, 0x00003dc1, 0x00003de2, 0x00003e21, 0x00003e43, 0x00003e62, 0x00003e81, 0x00003ea2,
    0x00003ec1, 0x00003f22, 0x00003f41, 0x00003f62, 0x00003f81, 0x00003fa2, 0x00003fc1, 0x00003fe2,
    0x00004001, 0x00004022, 0x00004041, 0x00004062, 0x00004081, 0x000040a2, 0x000040c1, 0x000040e2,
    0x00004101, 0x00004122, 0x00004141, 0x00004162, 0x00004181, 0x000041a2, 0x000041c1, 0x000041e2,
    0x00004201, 0x00004222, 0x00004241, 0x00004262, 0x00004281, 0x000042a2, 0x000042c1, 0x000042e2,
    0x00004301, 0x00004322, 0x00004341, 0x00004362, 0x00004381, 0x000043a2, 0x000043c1, 0x000043e2,
    0x00004401, 0x00004422, 0x00004441, 0x00004462, 0x00004481, 0x000044a2, 0x000044c1, 0x000044e2,
    0x00004501, 0x00004522, 0x00004541, 0x00004562, 0x00004581, 0x000045a2, 0x000045c1, 0x000045e2,
    0x00004601, 0x00004622, 0x00004641, 0x00004662, 0x00004741, 0x00004782, 0x000047a1, 0x000047e2,
    0x00004821, 0x00004842, 0x00004861, 0x000048e2, 0x00004901, 0x00004922, 0x00004941, 0x00004962,
    0x00004981, 0x000049a2, 0x000049c1, 0x000049e2, 0x00005285, 0x000052a2, 0x00005604, 0x00005855,
    0x000058c4, 0x00005a55, 0x00005c04, 0x00005cb5, 0x00005d84, 0x00005db5, 0x00005dc4, 0x00005df5,
    0x00006006, 0x00006e01, 0x00006e22, 0x00006e41, 0x00006e62, 0x00006e84, 0x00006eb5, 0x00006ec1,
    0x00006ee2, 0x00006f00, 0x00006f44, 0x00006f62, 0x00006fd2, 0x00006fe1, 0x00007000, 0x00007095,
    0x000070c1, 0x000070f2, 0x00007101, 0x00007160, 0x00007181, 0x000071a0, 0x000071c1, 0x00007202,
    0x00007221, 0x00007440, 0x00007461, 0x00007582, 0x000079e1, 0x00007a02, 0x00007a41, 0x00007aa2,
    0x00007b01, 0x00007b22, 0x00007b41, 0x00007b62, 0x00007b81, 0x00007ba2, 0x00007bc1, 0x00007be2,
    0x00007c01, 0x00007c22, 0x00007c41, 0x00007c62, 0x00007c81, 0x00007ca2, 0x00007cc1, 0x00007ce2,
    0x00007d01, 0x00007d22, 0x00007d41, 0x00007d62, 0x00007d81, 0x00007da2, 0x00007dc1, 0x00007de2,
    0x00007e81, 0x00007ea2, 0x00007ed3, 0x00007ee1, 0x00007f02, 0x00007f21, 0x00007f62, 0x00007fa1,
    0x00008602, 0x00008c01, 0x00008c22, 0x00008c41, 0x00008c62, 0x00008c81, 0x00008ca2, 0x00008cc1,
    0x00008ce2, 0x00008d01, 0x00008d22, 0x00008d41, 0x00008d62, 0x00008d81, 0x00008da2, 0x00008dc1,
    0x00008de2, 0x00008e01, 0x00008e22, 0x00008e41, 0x00008e62, 0x00008e81, 0x00008ea2, 0x00008ec1,
    0x00008ee2, 0x00008f01, 0x00008f22, 0x00008f41, 0x00008f62, 0x00008f81, 0x00008fa2, 0x00008fc1,
    0x00008fe2, 0x00009001, 0x00009022, 0x00009056, 0x00009066, 0x00009108, 0x00009141, 0x00009162,
    0x00009181, 0x000091a2, 0x000091c1, 0x000091e2, 0x00009201, 0x00009222, 0x00009241, 0x00009262,
    0x00009281, 0x000092a2, 0x000092c1, 0x000092e2, 0x00009301, 0x00009322, 0x00009341, 0x00009362,
    0x00009381, 0x000093a2, 0x000093c1, 0x000093e2, 0x00009401, 0x00009422, 0x00009441, 0x00009462,
    0x00009481, 0x000094a2, 0x000094c1, 0x000094e2, 0x00009501, 0x00009522, 0x00009541, 0x00009562,
    0x00009581, 0x000095a2, 0x000095c1, 0x000095e2, 0x00009601, 0x00009622, 0x00009641, 0x00009662,
    0x00009681, 0x000096a2, 0x000096c1, 0x000096e2, 0x00009701, 0x00009722, 0x00009741, 0x00009762,
    0x00009781, 0x000097a2, 0x000097c1, 0x000097e2, 0x00009801, 0x00009842, 0x00009861, 0x00009882,
    0x000098a1, 0x000098c2, 0x000098e1, 0x00009902, 0x00009921, 0x00009942, 0x00009961, 0x00009982,
    0x000099a1, 0x000099c2, 0x00009a01, 0x00009a22, 0x00009a41, 0x00009a62, 0x00009a81, 0x00009aa2,
    0x00009ac1, 0x00009ae2, 0x00009b01, 0x00009b22, 0x00009b41, 0x00009b62, 0x00009b81, 0x00009ba2,
    0x00009bc1, 0x00009be2, 0x00009c01, 0x00009c22, 0x00009c41, 0x00009c62, 0x00009c81, 0x00009ca2,
    0x00009cc1, 0x00009ce2, 0x00009d01, 0x00009d22, 0x00009d41, 0x00009d62, 0x00009d81, 0x00009da2,
    0x00009dc1, 0x00009de2, 0x00009e01, 0x00009e22, 0x00009e41, 0x00009e62, 0x00009e81, 0x00009ea2,
    0x00009ec1, 0x00009ee2, 0x00009f01, 0x00009f22, 0x00009f41, 0x00009f62, 0x00009f81, 0x00009fa2,
    0x00009fc1, 0x00009fe2, 0x0000a001, 0x0000a022, 0x0000a041, 0x0000a062, 0x0000a081, 0x0000a0a2,
    0x0000a0c1, 0x0000a0e2, 0x0000a101, 0x0000a122, 0x0000a141, 0x0000a162, 0x0000a181, 0x0000a1a2,
    0x0000a1c1, 0x0000a1e2, 0x0000a201, 0x0000a222, 0x0000a241, 0x0000a262, 0x0000a281, 0x0000a2a2,
    0x0000a2c1, 0x0000a2e2, 0x0000a301, 0x0000a322, 0x0000a341, 0x0000a362, 0x0000a381, 0x0000a3a2,
    0x0000a3c1, 0x0000a3e2, 0x0000a401, 0x0000a422, 0x0000a441, 0x0000a462, 0x0000a481, 0x0000a4a2,
    0x0000a4c1, 0x0000a4e2, 0x0000a501, 0x0000a522, 0x0000a541, 0x0000a562, 0x0000a581, 0x0000a5a2,
    0x0000a5c1, 0x0000a5e2, 0x0000a600, 0x0000a621, 0x0000aae0, 0x0000ab24, 0x0000ab52, 0x0000ac02,
    0x0000b132, 0x0000b14d, 0x0000b160, 0x0000b1b6, 0x0000b1f4, 0x0000b200, 0x0000b226, 0x0000b7cd,
    0x0000b7e6, 0x0000b812, 0x0000b826, 0x0000b872, 0x0000b886, 0x0000b8d2, 0x0000b8e6, 0x0000b900,
    0x0000ba05, 0x0000bd60, 0x0000bde5, 0x0000be72, 0x0000bea0, 0x0000c01b, 0x0000c0d3, 0x0000c132,
    0x0000c174, 0x0000c192, 0x0000c1d6, 0x0000c206, 0x0000c372, 0x0000c39b, 0x0000c3b2, 0x0000c405,
    0x0000c804, 0x0000c825, 0x0000c966, 0x0000cc09, 0x0000cd52, 0x0000cdc5, 0x0000ce06, 0x0000ce25,
    0x0000da92, 0x0000daa5, 0x0000dac6, 0x0000dbbb, 0x0000dbd6, 0x0000dbe6, 0x0000dca4, 0x0000dce6,
    0x0000dd36, 0x0000dd46, 0x0000ddc5, 0x0000de09, 0x0000df45, 0x0000dfb6, 0x0000dfe5, 0x0000e012,
    0x0000e1c0, 0x0000e1fb, 0x0000e205, 0x0000e226, 0x0000e245, 0x0000e606, 0x0000e960, 0x0000e9a5,
    0x0000f4c6, 0x0000f625, 0x0000f640, 0x0000f809, 0x0000f945, 0x0000fd66, 0x0000fe84, 0x0000fed6,
    0x0000fef2, 0x0000ff44, 0x0000ff60, 0x0000ffa6, 0x0000ffd4, 0x00010005, 0x000102c6, 0x00010344,
    0x00010366, 0x00010484, 0x000104a6, 0x00010504, 0x00010526, 0x000105c0, 0x00010612, 0x000107e0,
    0x00010805, 0x00010b26, 0x00010b80, 0x00010bd2, 0x00010be0, 0x00010c05, 0x00010d60, 0x00010e05,
    0x00011115, 0x00011125, 0x000111e0, 0x0001121b, 0x00011240, 0x00011306, 0x00011405, 0x00011924,
    0x00011946, 0x00011c5b, 0x00011c66, 0x00012067, 0x00012085, 0x00012746, 0x00012767, 0x00012786,
    0x000127a5, 0x000127c7, 0x00012826, 0x00012927, 0x000129a6, 0x000129c7, 0x00012a05, 0x00012a26,
    0x00012b05, 0x00012c46, 0x00012c92, 0x00012cc9, 0x00012e12, 0x00012e24, 0x00012e45, 0x00013026,
    0x00013047, 0x00013080, 0x000130a5, 0x000131a0, 0x000131e5, 0x00013220, 0x00013265, 0x00013520,
    0x00013545, 0x00013620, 0x00013645, 0x00013660, 0x000136c5, 0x00013740, 0x00013786, 0x000137a5,
    0x000137c7, 0x00013826, 0x000138a0, 0x000138e7, 0x00013920, 0x00013967, 0x000139a6, 0x000139c5,
    0x000139e0, 0x00013ae7, 0x00013b00, 0x00013b85, 0x00013bc0, 0x00013be5, 0x00013c46, 0x00013c80,
    0x00013cc9, 0x00013e05, 0x00013e54, 0x00013e8b, 0x00013f56, 0x00013f74, 0x00013f85, 0x00013fb2,
    0x00013fc6, 0x00013fe0, 0x00014026, 0x00014067, 0x00014080, 0x000140a5, 0x00014160, 0x000141e5,
    0x00014220, 0x00014265, 0x00014520, 0x00014545, 0x00014620, 0x00014645, 0x00014680, 0x000146a5,
    0x000146e0, 0x00014705, 0x00014740, 0x00014786, 0x000147a0, 0x000147c7, 0x00014826, 0x00014860,
    0x000148e6, 0x00014920, 0x00014966, 0x000149c0, 0x00014a26, 0x00014a40, 0x00014b25, 0x00014ba0,
    0x00014bc5, 0x00014be0, 0x00014cc9, 0x00014e06, 0x00014e45, 0x00014ea6, 0x00014ed2, 0x00014ee0,
    0x00015026, 0x00015067, 0x00015080, 0x000150a5, 0x000151c0, 0x000151e5, 0x00015240, 0x00015265,
    0x00015520, 0x00015545, 0x00015620, 0x00015645, 0x00015680, 0x000156a5, 0x00015740, 0x00015786,
    0x000157a5, 0x000157c7, 0x00015826, 0x000158c0, 0x000158e6, 0x00015927, 0x00015940, 0x00015967,
    0x000159a6, 0x000159c0, 0x00015a05, 0x00015a20, 0x00015c05, 0x00015c46, 0x00015c80, 0x00015cc9,
    0x00015e12, 0x00015e34, 0x00015e40, 0x00015f25, 0x00015f46, 0x00016000, 0x00016026, 0x00016047,
    0x00016080, 0x000160a5, 0x000161a0, 0x000161e5, 0x00016220, 0x00016265, 0x00016520, 0x00016545,
    0x00016620, 0x00016645, 0x00016680, 0x000166a5, 0x00016740, 0x00016786, 0x000167a5, 0x000167c7,
    0x000167e6, 0x00016807, 0x00016826, 0x000168a0, 0x000168e7, 0x00016920, 0x00016967, 0x000169a6,
    0x000169c0, 0x00016aa6, 0x00016ae7, 0x00016b00, 0x00016b85, 0x00016bc0, 0x00016be5, 0x00016c46,
    0x00016c80, 0x00016cc9, 0x00016e16, 0x00016e25, 0x00016e4b, 0x00016f00, 0x00017046, 0x00017065,
    0x00017080, 0x000170a5, 0x00017160, 0x000171c5, 0x00017220, 0x00017245, 0x000172c0, 0x00017325,
    0x00017360, 0x00017385, 0x000173a0, 0x000173c5, 0x00017400, 0x00017465, 0x000174a0, 0x00017505,
    0x00017560, 0x000175c5, 0x00017740, 0x000177c7, 0x00017806, 0x00017827, 0x00017860, 0x000178c7,
    0x00017920, 0x00017947, 0x000179a6, 0x000179c0, 0x00017a05, 0x00017a20, 0x00017ae7, 0x00017b00,
    0x00017cc9, 0x00017e0b, 0x00017e76, 0x00017f34, 0x00017f56, 0x00017f60, 0x00018006, 0x00018027,
    0x00018086, 0x000180a5, 0x000181a0, 0x000181c5, 0x00018220, 0x00018245, 0x00018520, 0x00018545,
    0x00018740, 0x00018786, 0x000187a5, 0x000187c6, 0x00018827, 0x000188a0, 0x000188c6, 0x00018920,
    0x00018946, 0x000189c0, 0x00018aa6, 0x00018ae0, 0x00018b05, 0x00018b60, 0x00018ba5, 0x00018bc0,
    0x00018c05, 0x00018c46, 0x00018c80, 0x00018cc9, 0x00018e00, 0x00018ef2, 0x00018f0b, 0x00018ff6,
    0x00019005, 0x00019026, 0x00019047, 0x00019092, 0x000190a5, 0x000191a0, 0x000191c5, 0x00019220,
    0x00019245, 0x00019520, 0x00019545, 0x00019680, 0x000196a5, 0x00019740, 0x00019786, 0x000197a5,
    0x000197c7, 0x000197e6, 0x00019807, 0x000198a0, 0x000198c6, 0x000198e7, 0x00019920, 0x00019947,
    0x00019986, 0x000199c0, 0x00019aa7, 0x00019ae0, 0x00019ba5, 0x00019be0, 0x00019c05, 0x00019c46,
    0x00019c80, 0x00019cc9, 0x00019e00, 0x00019e25, 0x00019e67, 0x00019e80, 0x0001a006, 0x0001a047,
    0x0001a085, 0x0001a1a0, 0x0001a1c5, 0x0001a220, 0x0001a245, 0x0001a766, 0x0001a7a5, 0x0001a7c7,
    0x0001a826, 0x0001a8a0, 0x0001a8c7, 0x0001a920, 0x0001a947, 0x0001a9a6, 0x0001a9c5, 0x0001a9f6,
    0x0001aa00, 0x0001aa85, 0x0001aae7, 0x0001ab0b, 0x0001abe5, 0x0001ac46, 0x0001ac80, 0x0001acc9,
    0x0001ae0b, 0x0001af36, 0x0001af45, 0x0001b000, 0x0001b026, 0x0001b047, 0x0001b080, 0x0001b0a5,
    0x0001b2e0, 0x0001b345, 0x0001b640, 0x0001b665, 0x0001b780, 0x0001b7a5, 0x0001b7c0, 0x0001b805,
    0x0001b8e0, 0x0001b946, 0x0001b960, 0x0001b9e7, 0x0001ba46, 0x0001baa0, 0x0001bac6, 0x0001bae0,
    0x0001bb07, 0x0001bc00, 0x0001bcc9, 0x0001be00, 0x0001be47, 0x0001be92, 0x0001bea0, 0x0001c025,
    0x0001c626, 0x0001c645, 0x0001c686, 0x0001c760, 0x0001c7f4, 0x0001c805, 0x0001c8c4, 0x0001c8e6,
    0x0001c9f2, 0x0001ca09, 0x0001cb52, 0x0001cb80, 0x0001d025, 0x0001d060, 0x0001d085, 0x0001d0a0,
    0x0001d0c5, 0x0001d160, 0x0001d185, 0x0001d480, 0x0001d4a5, 0x0001d4c0, 0x0001d4e5, 0x0001d626,
    0x0001d645, 0x0001d686, 0x0001d7a5, 0x0001d7c0, 0x0001d805, 0x0001d8a0, 0x0001d8c4, 0x0001d8e0,
    0x0001d906, 0x0001d9e0, 0x0001da09, 0x0001db40, 0x0001db85, 0x0001dc00, 0x0001e005, 0x0001e036,
    0x0001e092, 0x0001e276, 0x0001e292, 0x0001e2b6, 0x0001e306, 0x0001e356, 0x0001e409, 0x0001e54b,
    0x0001e696, 0x0001e6a6, 0x0001e6d6, 0x0001e6e6, 0x0001e716, 0x0001e726, 0x0001e74e, 0x0001e76f,
    0x0001e78e, 0x0001e7af, 0x0001e7c7, 0x0001e805, 0x0001e900, 0x0001e925, 0x0001eda0, 0x0001ee26,
    0x0001efe7, 0x0001f006, 0x0001f0b2, 0x0001f0c6, 0x0001f105, 0x0001f1a6, 0x0001f300, 0x0001f326,
    0x0001f7a0, 0x0001f7d6, 0x0001f8c6, 0x0001f8f6, 0x0001f9a0, 0x0001f9d6, 0x0001fa12, 0x0001fab6,
    0x0001fb32, 0x0001fb60, 0x00020005, 0x00020567, 0x000205a6, 0x00020627, 0x00020646, 0x00020707,
    0x00020726, 0x00020767, 0x000207a6, 0x000207e5, 0x00020809, 0x00020952, 0x00020a05, 0x00020ac7,
    0x00020b06, 0x00020b45, 0x00020bc6, 0x00020c25, 0x00020c47, 0x00020ca5, 0x00020ce7, 0x00020dc5,
    0x00020e26, 0x00020ea5, 0x00021046, 0x00021067, 0x000210a6, 0x000210e7, 0x000211a6, 0x000211c5,
    0x000211e7, 0x00021209, 0x00021347, 0x000213a6, 0x000213d6, 0x00021401, 0x000218c0, 0x000218e1,
    0x00021900, 0x000219a1, 0x000219c0, 0x00021a02, 0x00021f72, 0x00021f84, 0x00021fa2, 0x00022005,
    0x00024920, 0x00024945, 0x000249c0, 0x00024a05, 0x00024ae0, 0x00024b05, 0x00024b20, 0x00024b45,
    0x00024bc0, 0x00024c05, 0x00025120, 0x00025145, 0x000251c0, 0x00025205, 0x00025620, 0x00025645,
    0x000256c0, 0x00025705, 0x000257e0, 0x00025805, 0x00025820, 0x00025845, 0x000258c0, 0x00025905,
    0x00025ae0, 0x00025b05, 0x00026220, 0x00026245, 0x000262c0, 0x00026305, 0x00026b60, 0x00026ba6,
    0x00026c12, 0x00026d2b, 0x00026fa0, 0x00027005, 0x00027216, 0x00027340, 0x00027401, 0x00027ec0,
    0x00027f02, 0x00027fc0, 0x0002800d, 0x00028025, 0x0002cdb6, 0x0002cdd2, 0x0002cde5, 0x0002d017,
    0x0002d025, 0x0002d36e, 0x0002d38f, 0x0002d3a0, 0x0002d405, 0x0002dd72, 0x0002ddca, 0x0002de25,
    0x0002df20, 0x0002e005, 0x0002e246, 0x0002e2a7, 0x0002e2c0, 0x0002e3e5, 0x0002e646, 0x0002e687,
    0x0002e6b2, 0x0002e6e0, 0x0002e805, 0x0002ea46, 0x0002ea80, 0x0002ec05, 0x0002eda0, 0x0002edc5,
    0x0002ee20, 0x0002ee46, 0x0002ee80, 0x0002f005, 0x0002f686, 0x0002f6c7, 0x0002f6e6, 0x0002f7c7,
    0x0002f8c6, 0x0002f8e7, 0x0002f926, 0x0002fa92, 0x0002fae4, 0x0002fb12, 0x0002fb74, 0x0002fb85,
    0x0002fba6, 0x0002fbc0, 0x0002fc09, 0x0002fd40, 0x0002fe0b, 0x0002ff40, 0x00030012, 0x000300cd,
    0x000300f2, 0x00030166, 0x000301db, 0x000301e6, 0x00030209, 0x00030340, 0x00030405, 0x00030864,
    0x00030885, 0x00030f20, 0x00031005, 0x000310a6, 0x000310e5, 0x00031526, 0x00031545, 0x00031560,
    0x00031605, 0x00031ec0, 0x00032005, 0x000323e0, 0x00032406, 0x00032467, 0x000324e6, 0x00032527,
    0x00032580, 0x00032607, 0x00032646, 0x00032667, 0x00032726, 0x00032780, 0x00032816, 0x00032820,
    0x00032892, 0x000328c9, 0x00032a05, 0x00032dc0, 0x00032e05, 0x00032ea0, 0x00033005, 0x00033580,
    0x00033605, 0x00033940, 0x00033a09, 0x00033b4b, 0x00033b60, 0x00033bd6, 0x00034005, 0x000342e6,
    0x00034327, 0x00034366, 0x00034380, 0x000343d2, 0x00034405, 0x00034aa7, 0x00034ac6, 0x00034ae7,
    0x00034b06, 0x00034be0, 0x00034c06, 0x00034c27, 0x00034c46, 0x00034c67, 0x00034ca6, 0x00034da7,
    0x00034e66, 0x00034fa0, 0x00034fe6, 0x00035009, 0x00035140, 0x00035209, 0x00035340, 0x00035412,
    0x000354e4, 0x00035512, 0x000355c0, 0x00035606, 0x000357c8, 0x000357e6, 0x000359e0, 0x00036006,
    0x00036087, 0x000360a5, 0x00036686, 0x000366a7, 0x000366c6, 0x00036767, 0x00036786, 0x000367a7,
    0x00036846, 0x00036867, 0x000368a5, 0x000369a0, 0x00036a09, 0x00036b52, 0x00036c36, 0x00036d66,
    0x00036e96, 0x00036fb2, 0x00036fe0, 0x00037006, 0x00037047, 0x00037065, 0x00037427, 0x00037446,
    0x000374c7, 0x00037506, 0x00037547, 0x00037566, 0x000375c5, 0x00037609, 0x00037745, 0x00037cc6,
    0x00037ce7, 0x00037d06, 0x00037d47, 0x00037da6, 0x00037dc7, 0x00037de6, 0x00037e47, 0x00037e80,
    0x00037f92, 0x00038005, 0x00038487, 0x00038586, 0x00038687, 0x000386c6, 0x00038700, 0x00038772,
    0x00038809, 0x00038940, 0x000389a5, 0x00038a09, 0x00038b45, 0x00038f04, 0x00038fd2, 0x00039002,
    0x00039120, 0x00039201, 0x00039760, 0x000397a1, 0x00039812, 0x00039900, 0x00039a06, 0x00039a72,
    0x00039a86, 0x00039c27, 0x00039c46, 0x00039d25, 0x00039da6, 0x00039dc5, 0x00039e86, 0x00039ea5,
    0x00039ee7, 0x00039f06, 0x00039f45, 0x00039f60, 0x0003a002, 0x0003a584, 0x0003ad62, 0x0003af04,
    0x0003af22, 0x0003b364, 0x0003b806, 0x0003c001, 0x0003c022, 0x0003c041, 0x0003c062, 0x0003c081,
    0x0003c0a2, 0x0003c0c1, 0x0003c0e2, 0x0003c101, 0x0003c122, 0x0003c141, 0x0003c162, 0x0003c181,
    0x0003c1a2, 0x0003c1c1, 0x0003c1e2, 0x0003c201, 0x0003c222, 0x0003c241, 0x0003c262, 0x0003c281,
    0x0003c2a2, 0x0003c2c1, 0x0003c2e2, 0x0003c301, 0x0003c322, 0x0003c341, 0x0003c362, 0x0003c381,
    0x0003c3a2, 0x0003c3c1, 0x0003c3e2, 0x0003c401, 0x0003c422, 0x0003c441, 0x0003c462, 0x0003c481,
    0x0003c4a2, 0x0003c4c1, 0x0003c4e2, 0x0003c501, 0x0003c522, 0x0003c541, 0x0003c562, 0x0003c581,
    0x0003c5a2, 0x0003c5c1, 0x0003c5e2, 0x0003c601, 0x0003c622, 0x0003c641, 0x0003c662, 0x0003c681,
    0x0003c6a2, 0x0003c6c1, 0x0003c6e2, 0x0003c701, 0x0003c722, 0x0003c741, 0x0003c762, 0x0003c781,
    0x0003c7a2, 0x0003c7c1, 0x0003c7e2, 0x0003c801, 0x0003c822, 0x0003c841, 0x0003c862, 0x0003c881,
    0x0003c8a2, 0x0003c8c1, 0x0003c8e2, 0x0003c901, 0x0003c922, 0x0003c941, 0x0003c962, 0x0003c981,
    0x0003c9a2, 0x0003c9c1, 0x0003c9e2, 0x0003ca01, 0x0003ca22, 0x0003ca41, 0x0003ca62, 0x0003ca81,
    0x0003caa2, 0x0003cac1, 0x0003cae2, 0x0003cb01, 0x0003cb22, 0x0003cb41, 0x0003cb62, 0x0003cb81,
    0x0003cba2, 0x0003cbc1, 0x0003cbe2, 0x0003cc01, 0x0003cc22, 0x0003cc41, 0x0003cc62, 0x0003cc81,
    0x0003cca2, 0x0003ccc1, 0x0003cce2, 0x0003cd01, 0x0003cd22, 0x0003cd41, 0x0003cd62, 0x0003cd81,
    0x0003cda2, 0x0003cdc1, 0x0003cde2, 0x0003ce01, 0x0003ce22, 0x0003ce41, 0x0003ce62, 0x0003ce81,
    0x0003cea2, 0x0003cec1, 0x0003cee2, 0x0003cf01, 0x0003cf22, 0x0003cf41, 0x0003cf62, 0x0003cf81,
    0x0003cfa2, 0x0003cfc1, 0x0003cfe2, 0x0003d001, 0x0003d022, 0x0003d041, 0x0003d062, 0x0003d081,
    0x0003d0a2, 0x0003d0c1, 0x0003d0e2, 0x0003d101, 0x0003d122, 0x0003d141, 0x0003d162, 0x0003d181,
    0x0003d1a2, 0x0003d1c1, 0x0003d1e2, 0x0003d201, 0x0003d222, 0x0003d241, 0x0003d262, 0x0003d281,
    0x0003d2a2, 0x0003d3c1, 0x0003d3e2, 0x0003d401, 0x0003d422, 0x0003d441, 0x0003d462, 0x0003d481,
    0x0003d4a2, 0x0003d4c1, 0x0003d4e2, 0x0003d501, 0x0003d522, 0x0003d541, 0x0003d562, 0x0003d581,
    0x0003d5a2, 0x0003d5c1, 0x0003d5e2, 0x0003d601, 0x0003d622, 0x0003d641, 0x0003d662, 0x0003d681,
    0x0003d6a2, 0x0003d6c1, 0x0003d6e2, 0x0003d701, 0x0003d722, 0x0003d741, 0x0003d762, 0x0003d781,
    0x0003d7a2, 0x0003d7c1, 0x0003d7e2, 0x0003d801, 0x0003d822, 0x0003d841, 0x0003d862, 0x0003d881,
    0x0003d8a2, 0x0003d8c1, 0x0003d8e2, 0x0003d901, 0x0003d922, 0x0003d941, 0x0003d962, 0x0003d981,
    0x0003d9a2, 0x0003d9c1, 0x0003d9e2, 0x0003da01, 0x0003da22, 0x0003da41, 0x0003da62, 0x0003da81,
    0x0003daa2, 0x0003dac1, 0x0003dae2, 0x0003db01, 0x0003db22, 0x0003db41, 0x0003db62, 0x0003db81,
    0x0003dba2, 0x0003dbc1, 0x0003dbe2, 0x0003dc01, 0x0003dc22, 0x0003dc41, 0x0003dc62, 0x0003dc81,
    0x0003dca2, 0x0003dcc1, 0x0003dce2, 0x0003dd01, 0x0003dd22, 0x0003dd41, 0x0003dd62, 0x0003dd81,
    0x0003dda2, 0x0003ddc1, 0x0003dde2, 0x0003de01, 0x0003de22, 0x0003de41, 0x0003de62, 0x0003de81,
    0x0003dea2, 0x0003dec1, 0x0003dee2, 0x0003df01, 0x0003df22, 0x0003df41, 0x0003df62, 0x0003df81,
    0x0003dfa2, 0x0003dfc1, 0x0003dfe2, 0x0003e101, 0x0003e202, 0x0003e2c0, 0x0003e301, 0x0003e3c0,
    0x0003e402, 0x0003e501, 0x0003e602, 0x0003e701, 0x0003e802, 0x0003e8c0, 0x0003e901, 0x0003e9c0,
    0x0003ea02, 0x0003eb00, 0x0003eb21, 0x0003eb40, 0x0003eb61, 0x0003eb80, 0x0003eba1, 0x0003ebc0,
    0x0003ebe1, 0x0003ec02, 0x0003ed01, 0x0003ee02, 0x0003efc0, 0x0003f002, 0x0003f103, 0x0003f202,
    0x0003f303, 0x0003f402, 0x0003f503, 0x0003f602, 0x0003f6a0, 0x0003f6c2, 0x0003f701, 0x0003f783,
    0x0003f7b5, 0x0003f7c2, 0x0003f7f5, 0x0003f842, 0x0003f8a0, 0x0003f8c2, 0x0003f901, 0x0003f983,
    0x0003f9b5, 0x0003fa02, 0x0003fa80, 0x0003fac2, 0x0003fb01, 0x0003fb80, 0x0003fbb5, 0x0003fc02,
    0x0003fd01, 0x0003fdb5, 0x0003fe00, 0x0003fe42, 0x0003fea0, 0x0003fec2, 0x0003ff01, 0x0003ff83,
    0x0003ffb5, 0x0003ffe0, 0x00040017, 0x0004017b, 0x0004020d, 0x000402d2, 0x00040310, 0x00040331,
    0x0004034e, 0x00040370, 0x000403b1, 0x000403ce, 0x000403f0, 0x00040412, 0x00040518, 0x00040539,
    0x0004055b, 0x000405f7, 0x00040612, 0x00040730, 0x00040751, 0x00040772, 0x000407ec, 0x00040832,
    0x00040893, 0x000408ae, 0x000408cf, 0x000408f2, 0x00040a53, 0x00040a72, 0x00040a8c, 0x00040ab2,
    0x00040bf7, 0x00040c1b, 0x00040ca0, 0x00040cdb, 0x00040e0b, 0x00040e24, 0x00040e40, 0x00040e8b,
    0x00040f53, 0x00040fae, 0x00040fcf, 0x00040fe4, 0x0004100b, 0x00041153, 0x000411ae, 0x000411cf,
    0x000411e0, 0x00041204, 0x000413a0, 0x00041414, 0x00041820, 0x00041a06, 0x00041ba8, 0x00041c26,
    0x00041c48, 0x00041ca6, 0x00041e20, 0x00042016, 0x00042041, 0x00042076, 0x000420e1, 0x00042116,
    0x00042142, 0x00042161, 0x000421c2, 0x00042201, 0x00042262, 0x00042296, 0x000422a1, 0x000422d6,
    0x00042313, 0x00042321, 0x000423d6, 0x00042481, 0x000424b6, 0x000424c1, 0x000424f6, 0x00042501,
    0x00042536, 0x00042541, 0x000425d6, 0x000425e2, 0x00042601, 0x00042682, 0x000426a5, 0x00042722,
    0x00042756, 0x00042782, 0x000427c1, 0x00042813, 0x000428a1, 0x000428c2, 0x00042956, 0x00042973,
    0x00042996, 0x000429c2, 0x000429f6, 0x00042a0b, 0x00042c0a, 0x00043061, 0x00043082, 0x000430aa,
    0x0004312b, 0x00043156, 0x00043180, 0x00043213, 0x000432b6, 0x00043353, 0x00043396, 0x00043413,
    0x00043436, 0x00043473, 0x00043496, 0x000434d3, 0x000434f6, 0x000435d3, 0x000435f6, 0x000439d3,
    0x00043a16, 0x00043a53, 0x00043a76, 0x00043a93, 0x00043ab6, 0x00043e93, 0x00046016, 0x0004610e,
    0x0004612f, 0x0004614e, 0x0004616f, 0x00046196, 0x00046413, 0x00046456, 0x0004652e, 0x0004654f,
    0x00046576, 0x00046f93, 0x00046fb6, 0x00047373, 0x00047696, 0x00047b93, 0x00047c56, 0x000484e0,
    0x00048816, 0x00048960, 0x00048c0b, 0x00049396, 0x00049d4b, 0x0004a016, 0x0004b6f3, 0x0004b716,
    0x0004b833, 0x0004b856, 0x0004bf13, 0x0004c016, 0x0004cdf3, 0x0004ce16, 0x0004ed0e, 0x0004ed2f,
    0x0004ed4e, 0x0004ed6f, 0x0004ed8e, 0x0004edaf, 0x0004edce, 0x0004edef, 0x0004ee0e, 0x0004ee2f,
    0x0004ee4e, 0x0004ee6f, 0x0004ee8e, 0x0004eeaf, 0x0004eecb, 0x0004f296, 0x0004f813, 0x0004f8ae,
    0x0004f8cf, 0x0004f8f3, 0x0004fcce, 0x0004fcef, 0x0004fd0e, 0x0004fd2f, 0x0004fd4e, 0x0004fd6f,
    0x0004fd8e, 0x0004fdaf, 0x0004fdce, 0x0004fdef, 0x0004fe13, 0x00050016, 0x00052013, 0x0005306e,
    0x0005308f, 0x000530ae, 0x000530cf, 0x000530ee, 0x0005310f, 0x0005312e, 0x0005314f, 0x0005316e,
    0x0005318f, 0x000531ae, 0x000531cf, 0x000531ee, 0x0005320f, 0x0005322e, 0x0005324f, 0x0005326e,
    0x0005328f, 0x000532ae, 0x000532cf, 0x000532ee, 0x0005330f, 0x00053333, 0x00053b0e, 0x00053b2f,
    0x00053b4e, 0x00053b6f, 0x00053b93, 0x00053f8e, 0x00053faf, 0x00053fd3, 0x00056016, 0x00056613,
    0x000568b6, 0x000568f3, 0x000569b6, 0x00056e80, 0x00056ed6, 0x000572c0, 0x000572f6, 0x00058001,
    0x00058602, 0x00058c01, 0x00058c22, 0x00058c41, 0x00058ca2, 0x00058ce1, 0x00058d02, 0x00058d21,
    0x00058d42, 0x00058d61, 0x00058d82, 0x00058da1, 0x00058e22, 0x00058e41, 0x00058e62, 0x00058ea1,
    0x00058ec2, 0x00058f84, 0x00058fc1, 0x00059022, 0x00059041, 0x00059062, 0x00059081, 0x000590a2,
    0x000590c1, 0x000590e2, 0x00059101, 0x00059122, 0x00059141, 0x00059162, 0x00059181, 0x000591a2,
    0x000591c1, 0x000591e2, 0x00059201, 0x00059222, 0x00059241, 0x00059262, 0x00059281, 0x000592a2,
    0x000592c1, 0x000592e2, 0x00059301, 0x00059322, 0x00059341, 0x00059362, 0x00059381, 0x000593a2,
    0x000593c1, 0x000593e2, 0x00059401, 0x00059422, 0x00059441, 0x00059462, 0x00059481, 0x000594a2,
    0x000594c1, 0x000594e2, 0x00059501, 0x00059522, 0x00059541, 0x00059562, 0x00059581, 0x000595a2,
    0x000595c1, 0x000595e2, 0x00059601, 0x00059622, 0x00059641, 0x00059662, 0x00059681, 0x000596a2,
    0x000596c1, 0x000596e2, 0x00059701, 0x00059722, 0x00059741, 0x00059762, 0x00059781, 0x000597a2,
    0x000597c1, 0x000597e2, 0x00059801, 0x00059822, 0x00059841, 0x00059862, 0x00059881, 0x000598a2,
    0x000598c1, 0x000598e2, 0x00059901, 0x00059922, 0x00059941, 0x00059962, 0x00059981, 0x000599a2,
    0x000599c1, 0x000599e2, 0x00059a01, 0x00059a22, 0x00059a41, 0x00059a62, 0x00059a81, 0x00059aa2,
    0x00059ac1, 0x00059ae2, 0x00059b01, 0x00059b22, 0x00059b41, 0x00059b62, 0x00059b81, 0x00059ba2,
    0x00059bc1, 0x00059be2, 0x00059c01, 0x00059c22, 0x00059c41, 0x00059c62, 0x00059cb6, 0x00059d61,
    0x00059d82, 0x00059da1, 0x00059dc2, 0x00059de6, 0x00059e41, 0x00059e62, 0x00059e80, 0x00059f32,
    0x00059fab, 0x00059fd2, 0x0005a002, 0x0005a4c0, 0x0005a4e2, 0x0005a500, 0x0005a5a2, 0x0005a5c0,
    0x0005a605, 0x0005ad00, 0x0005ade4, 0x0005ae12, 0x0005ae20, 0x0005afe6, 0x0005b005, 0x0005b2e0,
    0x0005b405, 0x0005b4e0, 0x0005b505, 0x0005b5e0, 0x0005b605, 0x0005b6e0, 0x0005b705, 0x0005b7e0,
    0x0005b805, 0x0005b8e0, 0x0005b905, 0x0005b9e0, 0x0005ba05, 0x0005bae0, 0x0005bb05, 0x0005bbe0,
    0x0005bc06, 0x0005c012, 0x0005c050, 0x0005c071, 0x0005c090, 0x0005c0b1, 0x0005c0d2, 0x0005c130,
    0x0005c151, 0x0005c172, 0x0005c190, 0x0005c1b1, 0x0005c1d2, 0x0005c2ed, 0x0005c312, 0x0005c34d,
    0x0005c372, 0x0005c390, 0x0005c3b1, 0x0005c3d2, 0x0005c410, 0x0005c431, 0x0005c44e, 0x0005c46f,
    0x0005c48e, 0x0005c4af, 0x0005c4ce, 0x0005c4ef, 0x0005c50e, 0x0005c52f, 0x0005c552, 0x0005c5e4,
    0x0005c612, 0x0005c74d, 0x0005c792, 0x0005c80d, 0x0005c832, 0x0005c84e, 0x0005c872, 0x0005ca16,
    0x0005ca52, 0x0005caae, 0x0005cacf, 0x0005caee, 0x0005cb0f, 0x0005cb2e, 0x0005cb4f, 0x0005cb6e,
    0x0005cb8f, 0x0005cbad, 0x0005cbc0, 0x0005d016, 0x0005d340, 0x0005d376, 0x0005de80, 0x0005e016,
    0x0005fac0, 0x0005fe16, 0x0005ff80, 0x00060017, 0x00060032, 0x00060096, 0x000600a4, 0x000600c5,
    0x000600ea, 0x0006010e, 0x0006012f, 0x0006014e, 0x0006016f, 0x0006018e, 0x000601af, 0x000601ce,
    0x000601ef, 0x0006020e, 0x0006022f, 0x00060256, 0x0006028e, 0x000602af, 0x000602ce, 0x000602ef,
    0x0006030e, 0x0006032f, 0x0006034e, 0x0006036f, 0x0006038d, 0x000603ae, 0x000603cf, 0x00060416,
    0x0006042a, 0x00060546, 0x000605c7, 0x0006060d, 0x00060624, 0x000606d6, 0x0006070a, 0x00060764,
    0x00060785, 0x000607b2, 0x000607d6, 0x00060800, 0x00060825, 0x000612e0, 0x00061326, 0x00061375,
    0x000613a4, 0x000613e5, 0x0006140d, 0x00061425, 0x00061f72, 0x00061f84, 0x00061fe5, 0x00062000,
    0x000620a5, 0x00062600, 0x00062625, 0x000631e0, 0x00063216, 0x0006324b, 0x000632d6, 0x00063405,
    0x00063816, 0x00063c80, 0x00063e05, 0x00064016, 0x000643e0, 0x0006440b, 0x00064556, 0x0006490b,
    0x00064a16, 0x00064a2b, 0x00064c16, 0x0006500b, 0x00065156, 0x0006562b, 0x00065816, 0x00068005,
    0x0009b816, 0x0009c005, 0x001402a4, 0x001402c5, 0x001491a0, 0x00149216, 0x001498e0, 0x00149a05,
    0x00149f04, 0x00149fd2, 0x0014a005, 0x0014c184, 0x0014c1b2, 0x0014c205, 0x0014c409, 0x0014c545,
    0x0014c580, 0x0014c801, 0x0014c822, 0x0014c841, 0x0014c862, 0x0014c881, 0x0014c8a2, 0x0014c8c1,
    0x0014c8e2, 0x0014c901, 0x0014c922, 0x0014c941, 0x0014c962, 0x0014c981, 0x0014c9a2, 0x0014c9c1,
    0x0014c9e2, 0x0014ca01, 0x0014ca22, 0x0014ca41, 0x0014ca62, 0x0014ca81, 0x0014caa2, 0x0014cac1,
    0x0014cae2, 0x0014cb01, 0x0014cb22, 0x0014cb41, 0x0014cb62, 0x0014cb81, 0x0014cba2, 0x0014cbc1,
    0x0014cbe2, 0x0014cc01, 0x0014cc22, 0x0014cc41, 0x0014cc62, 0x0014cc81, 0x0014cca2, 0x0014ccc1,
    0x0014cce2, 0x0014cd01, 0x0014cd22, 0x0014cd41, 0x0014cd62, 0x0014cd81, 0x0014cda2, 0x0014cdc5,
    0x0014cde6, 0x0014ce08, 0x0014ce72, 0x0014ce86, 0x0014cfd2, 0x0014cfe4, 0x0014d001, 0x0014d022,
    0x0014d041, 0x0014d062, 0x0014d081, 0x0014d0a2, 0x0014d0c1, 0x0014d0e2, 0x0014d101, 0x0014d122,
    0x0014d141, 0x0014d162, 0x0014d181, 0x0014d1a2, 0x0014d1c1, 0x0014d1e2, 0x0014d201, 0x0014d222,
    0x0014d241, 0x0014d262, 0x0014d281, 0x0014d2a2, 0x0014d2c1, 0x0014d2e2, 0x0014d301, 0x0014d322,
    0x0014d341, 0x0014d362, 0x0014d384, 0x0014d3c6, 0x0014d405, 0x0014dcca, 0x0014de06, 0x0014de52,
    0x0014df00, 0x0014e015, 0x0014e2e4, 0x0014e415, 0x0014e441, 0x0014e462, 0x0014e481, 0x0014e4a2,
    0x0014e4c1, 0x0014e4e2, 0x0014e501, 0x0014e522, 0x0014e541, 0x0014e562, 0x0014e581, 0x0014e5a2,
    0x0014e5c1, 0x0014e5e2, 0x0014e641, 0x0014e662, 0x0014e681, 0x0014e6a2, 0x0014e6c1, 0x0014e6e2,
    0x0014e701, 0x0014e722, 0x0014e741, 0x0014e762, 0x0014e781, 0x0014e7a2, 0x0014e7c1, 0x0014e7e2,
    0x0014e801, 0x0014e822, 0x0014e841, 0x0014e862, 0x0014e881, 0x0014e8a2, 0x0014e8c1, 0x0014e8e2,
    0x0014e901, 0x0014e922, 0x0014e941, 0x0014e962, 0x0014e981, 0x0014e9a2, 0x0014e9c1, 0x0014e9e2,
    0x0014ea01, 0x0014ea22, 0x0014ea41, 0x0014ea62, 0x0014ea81, 0x0014eaa2, 0x0014eac1, 0x0014eae2,
    0x0014eb01, 0x0014eb22, 0x0014eb41, 0x0014eb62, 0x0014eb81, 0x0014eba2, 0x0014ebc1, 0x0014ebe2,
    0x0014ec01, 0x0014ec22, 0x0014ec41, 0x0014ec62, 0x0014ec81, 0x0014eca2, 0x0014ecc1, 0x0014ece2,
    0x0014ed01, 0x0014ed22, 0x0014ed41, 0x0014ed62, 0x0014ed81, 0x0014eda2, 0x0014edc1, 0x0014ede2,
    0x0014ee04, 0x0014ee22, 0x0014ef21, 0x0014ef42, 0x0014ef61, 0x0014ef82, 0x0014efa1, 0x0014efe2,
    0x0014f001, 0x0014f022, 0x0014f041, 0x0014f062, 0x0014f081, 0x0014f0a2, 0x0014f0c1, 0x0014f0e2,
    0x0014f104, 0x0014f135, 0x0014f161, 0x0014f182, 0x0014f1a1, 0x0014f1c2, 0x0014f1e5, 0x0014f201,
    0x0014f222, 0x0014f241, 0x0014f262, 0x0014f2c1, 0x0014f2e2, 0x0014f301, 0x0014f322, 0x0014f341,
    0x0014f362, 0x0014f381, 0x0014f3a2, 0x0014f3c1, 0x0014f3e2, 0x0014f401, 0x0014f422, 0x0014f441,
    0x0014f462, 0x0014f481, 0x0014f4a2, 0x0014f4c1, 0x0014f4e2, 0x0014f501, 0x0014f522, 0x0014f541,
    0x0014f5e2, 0x0014f601, 0x0014f6a2, 0x0014f6c1, 0x0014f6e2, 0x0014f701, 0x0014f722, 0x0014f741,
    0x0014f762, 0x0014f781, 0x0014f7a2, 0x0014f7c1, 0x0014f7e2, 0x0014f801, 0x0014f822, 0x0014f841,
    0x0014f862, 0x0014f881, 0x0014f902, 0x0014f921, 0x0014f942, 0x0014f960, 0x0014fa01, 0x0014fa22,
    0x0014fa40, 0x0014fa62, 0x0014fa80, 0x0014faa2, 0x0014fac1, 0x0014fae2, 0x0014fb01, 0x0014fb22,
    0x0014fb40, 0x0014fe44, 0x0014fea1, 0x0014fec2, 0x0014fee5, 0x0014ff04, 0x0014ff42, 0x0014ff65,
    0x00150046, 0x00150065, 0x001500c6, 0x001500e5, 0x00150166, 0x00150185, 0x00150467, 0x001504a6,
    0x001504e7, 0x00150516, 0x00150586, 0x001505a0, 0x0015060b, 0x001506d6, 0x00150714, 0x00150736,
    0x00150740, 0x00150805, 0x00150e92, 0x00150f00, 0x00151007, 0x00151045, 0x00151687, 0x00151886,
    0x001518c0, 0x001519d2, 0x00151a09, 0x00151b40, 0x00151c06, 0x00151e45, 0x00151f12, 0x00151f65,
    0x00151f92, 0x00151fa5, 0x00151fe6, 0x00152009, 0x00152145, 0x001524c6, 0x001525d2, 0x00152605,
    0x001528e6, 0x00152a47, 0x00152a80, 0x00152bf2, 0x00152c05, 0x00152fa0, 0x00153006, 0x00153067,
    0x00153085, 0x00153666, 0x00153687, 0x001536c6, 0x00153747, 0x00153786, 0x001537c7, 0x00153832,
    0x001539c0, 0x001539e4, 0x00153a09, 0x00153b40, 0x00153bd2, 0x00153c05, 0x00153ca6, 0x00153cc4,
    0x00153ce5, 0x00153e09, 0x00153f45, 0x00153fe0, 0x00154005, 0x00154526, 0x001545e7, 0x00154626,
    0x00154667, 0x001546a6, 0x001546e0, 0x00154805, 0x00154866, 0x00154885, 0x00154986, 0x001549a7,
    0x001549c0, 0x00154a09, 0x00154b40, 0x00154b92, 0x00154c05, 0x00154e04, 0x00154e25, 0x00154ef6,
    0x00154f45, 0x00154f67, 0x00154f86, 0x00154fa7, 0x00154fc5, 0x00155606, 0x00155625, 0x00155646,
    0x001556a5, 0x001556e6, 0x00155725, 0x001557c6, 0x00155805, 0x00155826, 0x00155845, 0x00155860,
    0x00155b65, 0x00155ba4, 0x00155bd2, 0x00155c05, 0x00155d67, 0x00155d86, 0x00155dc7, 0x00155e12,
    0x00155e45, 0x00155e64, 0x00155ea7, 0x00155ec6, 0x00155ee0, 0x00156025, 0x001560e0, 0x00156125,
    0x001561e0, 0x00156225, 0x001562e0, 0x00156405, 0x001564e0, 0x00156505, 0x001565e0, 0x00156602,
    0x00156b75, 0x00156b84, 0x00156c02, 0x00156d24, 0x00156d55, 0x00156d80, 0x00156e02, 0x00157805,
    0x00157c67, 0x00157ca6, 0x00157cc7, 0x00157d06, 0x00157d27, 0x00157d72, 0x00157d87, 0x00157da6,
    0x00157dc0, 0x00157e09, 0x00157f40, 0x00158005, 0x001af480, 0x001af605, 0x001af8e0, 0x001af965,
    0x001aff80, 0x001b001c, 0x001c001d, 0x001f2005, 0x001f4dc0, 0x001f4e05, 0x001f5b40, 0x001f6002,
    0x001f60e0, 0x001f6262, 0x001f6300, 0x001f63a5, 0x001f63c6, 0x001f63e5, 0x001f6533, 0x001f6545,
    0x001f66e0, 0x001f6705, 0x001f67a0, 0x001f67c5, 0x001f67e0, 0x001f6805, 0x001f6840, 0x001f6865,
    0x001f68a0, 0x001f68c5, 0x001f7655, 0x001f7860, 0x001f7a65, 0x001fa7cf, 0x001fa7ee, 0x001fa816,
    0x001faa05, 0x001fb200, 0x001fb245, 0x001fb900, 0x001fb9f6, 0x001fba00, 0x001fbe05, 0x001fbf94,
    0x001fbfb6, 0x001fc006, 0x001fc212, 0x001fc2ee, 0x001fc30f, 0x001fc332, 0x001fc340, 0x001fc406,
    0x001fc612, 0x001fc62d, 0x001fc66c, 0x001fc6ae, 0x001fc6cf, 0x001fc6ee, 0x001fc70f, 0x001fc72e,
    0x001fc74f, 0x001fc76e, 0x001fc78f, 0x001fc7ae, 0x001fc7cf, 0x001fc7ee, 0x001fc80f, 0x001fc82e,
    0x001fc84f, 0x001fc86e, 0x001fc88f, 0x001fc8b2, 0x001fc8ee, 0x001fc90f, 0x001fc932, 0x001fc9ac,
    0x001fca12, 0x001fca60, 0x001fca92, 0x001fcb0d, 0x001fcb2e, 0x001fcb4f, 0x001fcb6e, 0x001fcb8f,
    0x001fcbae, 0x001fcbcf, 0x001fcbf2, 0x001fcc53, 0x001fcc6d, 0x001fcc93, 0x001fcce0, 0x001fcd12,
    0x001fcd34, 0x001fcd52, 0x001fcd80, 0x001fce05, 0x001fcea0, 0x001fcec5, 0x001fdfa0, 0x001fdffb,
    0x001fe000, 0x001fe032, 0x001fe094, 0x001fe0b2, 0x001fe10e, 0x001fe12f, 0x001fe152, 0x001fe173,
    0x001fe192, 0x001fe1ad, 0x001fe1d2, 0x001fe209, 0x001fe352, 0x001fe393, 0x001fe3f2, 0x001fe421,
    0x001fe76e, 0x001fe792, 0x001fe7af, 0x001fe7d5, 0x001fe7ec, 0x001fe815, 0x001fe822, 0x001feb6e,
    0x001feb93, 0x001febaf, 0x001febd3, 0x001febee, 0x001fec0f, 0x001fec32, 0x001fec4e, 0x001fec6f,
    0x001fec92, 0x001fecc5, 0x001fee04, 0x001fee25, 0x001ff3c4, 0x001ff405, 0x001ff7e0, 0x001ff845,
    0x001ff900, 0x001ff945, 0x001ffa00, 0x001ffa45, 0x001ffb00, 0x001ffb45, 0x001ffba0, 0x001ffc14,
    0x001ffc53, 0x001ffc75, 0x001ffc96, 0x001ffcb4, 0x001ffce0, 0x001ffd16, 0x001ffd33, 0x001ffdb6,
    0x001ffde0, 0x001fff3b, 0x001fff96, 0x001fffc0, 0x00200005, 0x00200180, 0x002001a5, 0x002004e0,
    0x00200505, 0x00200760, 0x00200785, 0x002007c0, 0x002007e5, 0x002009c0, 0x00200a05, 0x00200bc0,
    0x00201005, 0x00201f60, 0x00202012, 0x00202060, 0x002020eb, 0x00202680, 0x002026f6, 0x0020280a,
    0x00202eab, 0x00202f36, 0x0020314b, 0x00203196, 0x002031e0, 0x00203216, 0x002033a0, 0x00203416,
    0x00203420, 0x00203a16, 0x00203fa6, 0x00203fc0, 0x00205005, 0x002053a0, 0x00205405, 0x00205a20,
    0x00205c06, 0x00205c2b, 0x00205f80, 0x00206005, 0x0020640b, 0x00206480, 0x002065a5, 0x0020682a,
    0x00206845, 0x0020694a, 0x00206960, 0x00206a05, 0x00206ec6, 0x00206f60, 0x00207005, 0x002073c0,
    0x002073f2, 0x00207405, 0x00207880, 0x00207905, 0x00207a12, 0x00207a2a, 0x00207ac0, 0x00208001,
    0x00208502, 0x00208a05, 0x002093c0, 0x00209409, 0x00209540, 0x00209601, 0x00209a80, 0x00209b02,
    0x00209f80, 0x0020a005, 0x0020a500, 0x0020a605, 0x0020ac80, 0x0020adf2, 0x0020ae01, 0x0020af60,
    0x0020af81, 0x0020b160, 0x0020b181, 0x0020b260, 0x0020b281, 0x0020b2c0, 0x0020b2e2, 0x0020b440,
    0x0020b462, 0x0020b640, 0x0020b662, 0x0020b740, 0x0020b762, 0x0020b7a0, 0x0020c005, 0x0020e6e0,
    0x0020e805, 0x0020eac0, 0x0020ec05, 0x0020ed00, 0x0020f004, 0x0020f0c0, 0x0020f0e4, 0x0020f620,
    0x0020f644, 0x0020f760, 0x00210005, 0x002100c0, 0x00210105, 0x00210120, 0x00210145, 0x002106c0,
    0x002106e5, 0x00210720, 0x00210785, 0x002107a0, 0x002107e5, 0x00210ac0, 0x00210af2, 0x00210b0b,
    0x00210c05, 0x00210ef6, 0x00210f2b, 0x00211005, 0x002113e0, 0x002114eb, 0x00211600, 0x00211c05,
    0x00211e60, 0x00211e85, 0x00211ec0, 0x00211f6b, 0x00212005, 0x002122cb, 0x00212380, 0x002123f2,
    0x00212405, 0x00212740, 0x002127f2, 0x00212800, 0x00213005, 0x00213700, 0x0021378b, 0x002137c5,
    0x0021380b, 0x00213a00, 0x00213a4b, 0x00214005, 0x00214026, 0x00214080, 0x002140a6, 0x002140e0,
    0x00214186, 0x00214205, 0x00214280, 0x002142a5, 0x00214300, 0x00214325, 0x002146c0, 0x00214706,
    0x00214760, 0x002147e6, 0x0021480b, 0x00214920, 0x00214a12, 0x00214b20, 0x00214c05, 0x00214fab,
    0x00214ff2, 0x00215005, 0x002153ab, 0x00215400, 0x00215805, 0x00215916, 0x00215925, 0x00215ca6,
    0x00215ce0, 0x00215d6b, 0x00215e12, 0x00215ee0, 0x00216005, 0x002166c0, 0x00216732, 0x00216805,
    0x00216ac0, 0x00216b0b, 0x00216c05, 0x00216e60, 0x00216f0b, 0x00217005, 0x00217240, 0x00217332,
    0x002173a0, 0x0021752b, 0x00217600, 0x00218005, 0x00218920, 0x00219001, 0x00219660, 0x00219802,
    0x00219e60, 0x00219f4b, 0x0021a005, 0x0021a486, 0x0021a500, 0x0021a609, 0x0021a740, 0x0021cc0b,
    0x0021cfe0, 0x0021d005, 0x0021d540, 0x0021d566, 0x0021d5ad, 0x0021d5c0, 0x0021d605, 0x0021d640,
    0x0021dfa6, 0x0021e005, 0x0021e3ab, 0x0021e4e5, 0x0021e500, 0x0021e605, 0x0021e8c6, 0x0021ea2b,
    0x0021eab2, 0x0021eb40, 0x0021ee05, 0x0021f046, 0x0021f0d2, 0x0021f140, 0x0021f605, 0x0021f8ab,
    0x0021f980, 0x0021fc05, 0x0021fee0, 0x00220007, 0x00220026, 0x00220047, 0x00220065, 0x00220706,
    0x002208f2, 0x002209c0, 0x00220a4b, 0x00220cc9, 0x00220e06, 0x00220e25, 0x00220e66, 0x00220ea5,
    0x00220ec0, 0x00220fe6, 0x00221047, 0x00221065, 0x00221607, 0x00221666, 0x002216e7, 0x00221726,
    0x00221772, 0x002217bb, 0x002217d2, 0x00221846, 0x00221860, 0x002219bb, 0x002219c0, 0x00221a05,
    0x00221d20, 0x00221e09, 0x00221f40, 0x00222006, 0x00222065, 0x002224e6, 0x00222587, 0x002225a6,
    0x002226a0, 0x002226c9, 0x00222812, 0x00222885, 0x002228a7, 0x002228e5, 0x00222900, 0x00222a05,
    0x00222e66, 0x00222e92, 0x00222ec5, 0x00222ee0, 0x00223006, 0x00223047, 0x00223065, 0x00223667,
    0x002236c6, 0x002237e7, 0x00223825, 0x002238b2, 0x00223926, 0x002239b2, 0x002239c7, 0x002239e6,
    0x00223a09, 0x00223b45, 0x00223b72, 0x00223b85, 0x00223bb2, 0x00223c00, 0x00223c2b, 0x00223ea0,
    0x00224005, 0x00224240, 0x00224265, 0x00224587, 0x002245e6, 0x00224647, 0x00224686, 0x002246a7,
    0x002246c6, 0x00224712, 0x002247c6, 0x002247e5, 0x00224826, 0x00224840, 0x00225005, 0x002250e0,
    0x00225105, 0x00225120, 0x00225145, 0x002251c0, 0x002251e5, 0x002253c0, 0x002253e5, 0x00225532,
    0x00225540, 0x00225605, 0x00225be6, 0x00225c07, 0x00225c66, 0x00225d60, 0x00225e09, 0x00225f40,
    0x00226006, 0x00226047, 0x00226080, 0x002260a5, 0x002261a0, 0x002261e5, 0x00226220, 0x00226265,
    0x00226520, 0x00226545, 0x00226620, 0x00226645, 0x00226680, 0x002266a5, 0x00226740, 0x00226766,
    0x002267a5, 0x002267c7, 0x00226806, 0x00226827, 0x002268a0, 0x002268e7, 0x00226920, 0x00226967,
    0x002269c0, 0x00226a05, 0x00226a20, 0x00226ae7, 0x00226b00, 0x00226ba5, 0x00226c47, 0x00226c80,
    0x00226cc6, 0x00226da0, 0x00226e06, 0x00226ea0, 0x00228005, 0x002286a7, 0x00228706, 0x00228807,
    0x00228846, 0x002288a7, 0x002288c6, 0x002288e5, 0x00228972, 0x00228a09, 0x00228b52, 0x00228b80,
    0x00228bb2, 0x00228bc6, 0x00228be5, 0x00228c40, 0x00229005, 0x00229607, 0x00229666, 0x00229727,
    0x00229746, 0x00229767, 0x002297e6, 0x00229827, 0x00229846, 0x00229885, 0x002298d2, 0x002298e5,
    0x00229900, 0x00229a09, 0x00229b40, 0x0022b005, 0x0022b5e7, 0x0022b646, 0x0022b6c0, 0x0022b707,
    0x0022b786, 0x0022b7c7, 0x0022b7e6, 0x0022b832, 0x0022bb05, 0x0022bb86, 0x0022bbc0, 0x0022c005,
    0x0022c607, 0x0022c666, 0x0022c767, 0x0022c7a6, 0x0022c7c7, 0x0022c7e6, 0x0022c832, 0x0022c885,
    0x0022c8a0, 0x0022ca09, 0x0022cb40, 0x0022cc12, 0x0022cda0, 0x0022d005, 0x0022d566, 0x0022d587,
    0x0022d5a6, 0x0022d5c7, 0x0022d606, 0x0022d6c7, 0x0022d6e6, 0x0022d705, 0x0022d732, 0x0022d740,
    0x0022d809, 0x0022d940, 0x0022e005, 0x0022e360, 0x0022e3a6, 0x0022e407, 0x0022e446, 0x0022e4c7,
    0x0022e4e6, 0x0022e580, 0x0022e609, 0x0022e74b, 0x0022e792, 0x0022e7f6, 0x0022e805, 0x0022e8e0,
    0x00230005, 0x00230587, 0x002305e6, 0x00230707, 0x00230726, 0x00230772, 0x00230780, 0x00231401,
    0x00231802, 0x00231c09, 0x00231d4b, 0x00231e60, 0x00231fe5, 0x002320e0, 0x00232125, 0x00232140,
    0x00232185, 0x00232280, 0x002322a5, 0x002322e0, 0x00232305, 0x00232607, 0x002326c0, 0x002326e7,
    0x00232720, 0x00232766, 0x002327a7, 0x002327c6, 0x002327e5, 0x00232807, 0x00232825, 0x00232847,
    0x00232866, 0x00232892, 0x002328e0, 0x00232a09, 0x00232b40, 0x00233405, 0x00233500, 0x00233545,
    0x00233a27, 0x00233a86, 0x00233b00, 0x00233b46, 0x00233b87, 0x00233c06, 0x00233c25, 0x00233c52,
    0x00233c65, 0x00233c87, 0x00233ca0, 0x00234005, 0x00234026, 0x00234165, 0x00234666, 0x00234727,
    0x00234745, 0x00234766, 0x002347f2, 0x002348e6, 0x00234900, 0x00234a05, 0x00234a26, 0x00234ae7,
    0x00234b26, 0x00234b85, 0x00235146, 0x002352e7, 0x00235306, 0x00235352, 0x002353a5, 0x002353d2,
    0x00235460, 0x00235605, 0x00235f20, 0x00236012, 0x00236140, 0x00238005, 0x00238120, 0x00238145,
    0x002385e7, 0x00238606, 0x002386e0, 0x00238706, 0x002387c7, 0x002387e6, 0x00238805, 0x00238832,
    0x002388c0, 0x00238a09, 0x00238b4b, 0x00238da0, 0x00238e12, 0x00238e45, 0x00239200, 0x00239246,
    0x00239500, 0x00239527, 0x00239546, 0x00239627, 0x00239646, 0x00239687, 0x002396a6, 0x002396e0,
    0x0023a005, 0x0023a0e0, 0x0023a105, 0x0023a140, 0x0023a165, 0x0023a626, 0x0023a6e0, 0x0023a746,
    0x0023a760, 0x0023a786, 0x0023a7c0, 0x0023a7e6, 0x0023a8c5, 0x0023a8e6, 0x0023a900, 0x0023aa09,
    0x0023ab40, 0x0023ac05, 0x0023acc0, 0x0023ace5, 0x0023ad20, 0x0023ad45, 0x0023b147, 0x0023b1e0,
    0x0023b206, 0x0023b240, 0x0023b267, 0x0023b2a6, 0x0023b2c7, 0x0023b2e6, 0x0023b305, 0x0023b320,
    0x0023b409, 0x0023b540, 0x0023dc05, 0x0023de66, 0x0023dea7, 0x0023def2, 0x0023df20, 0x0023e006,
    0x0023e045, 0x0023e067, 0x0023e085, 0x0023e220, 0x0023e245, 0x0023e687, 0x0023e6c6, 0x0023e760,
    0x0023e7c7, 0x0023e806, 0x0023e827, 0x0023e846, 0x0023e872, 0x0023ea09, 0x0023eb40, 0x0023f605,
    0x0023f620, 0x0023f80b, 0x0023fab6, 0x0023fbb4, 0x0023fc36, 0x0023fe40, 0x0023fff2, 0x00240005,
    0x00247340, 0x0024800a, 0x00248de0, 0x00248e12, 0x00248ea0, 0x00249005, 0x0024a880, 0x0025f205,
    0x0025fe32, 0x0025fe60, 0x00260005, 0x0026861b, 0x00268806, 0x00268825, 0x002688e6, 0x00268ac0,
    0x00288005, 0x0028c8e0, 0x002d0005, 0x002d4720, 0x002d4805, 0x002d4be0, 0x002d4c09, 0x002d4d40,
    0x002d4dd2, 0x002d4e05, 0x002d57e0, 0x002d5809, 0x002d5940, 0x002d5a05, 0x002d5dc0, 0x002d5e06,
    0x002d5eb2, 0x002d5ec0, 0x002d6005, 0x002d6606, 0x002d66f2, 0x002d6796, 0x002d6804, 0x002d6892,
    0x002d68b6, 0x002d68c0, 0x002d6a09, 0x002d6b40, 0x002d6b6b, 0x002d6c40, 0x002d6c65, 0x002d6f00,
    0x002d6fa5, 0x002d7200, 0x002dc801, 0x002dcc02, 0x002dd00b, 0x002dd2f2, 0x002dd360, 0x002de005,
    0x002de960, 0x002de9e6, 0x002dea05, 0x002dea27, 0x002df100, 0x002df1e6, 0x002df264, 0x002df400,
    0x002dfc04, 0x002dfc52, 0x002dfc64, 0x002dfc86, 0x002dfca0, 0x002dfe07, 0x002dfe40, 0x002e0005,
    0x0030ff00, 0x00310005, 0x00319ac0, 0x0031a005, 0x0031a120, 0x0035fe04, 0x0035fe80, 0x0035fea4,
    0x0035ff80, 0x0035ffa4, 0x0035ffe0, 0x00360005, 0x00362460, 0x00362645, 0x00362660, 0x00362a05,
    0x00362a60, 0x00362aa5, 0x00362ac0, 0x00362c85, 0x00362d00, 0x00362e05, 0x00365f80, 0x00378005,
    0x00378d60, 0x00378e05, 0x00378fa0, 0x00379005, 0x00379120, 0x00379205, 0x00379340, 0x00379396,
    0x003793a6, 0x003793f2, 0x0037941b, 0x00379480, 0x0039e006, 0x0039e5c0, 0x0039e606, 0x0039e8e0,
    0x0039ea16, 0x0039f880, 0x003a0016, 0x003a1ec0, 0x003a2016, 0x003a24e0, 0x003a2536, 0x003a2ca7,
    0x003a2ce6, 0x003a2d56, 0x003a2da7, 0x003a2e7b, 0x003a2f66, 0x003a3076, 0x003a30a6, 0x003a3196,
    0x003a3546, 0x003a35d6, 0x003a3d60, 0x003a4016, 0x003a4846, 0x003a48b6, 0x003a48c0, 0x003a580b,
    0x003a5a80, 0x003a5c0b, 0x003a5e80, 0x003a6016, 0x003a6ae0, 0x003a6c0b, 0x003a6f20, 0x003a8001,
    0x003a8342, 0x003a8681, 0x003a89c2, 0x003a8aa0, 0x003a8ac2, 0x003a8d01, 0x003a9042, 0x003a9381,
    0x003a93a0, 0x003a93c1, 0x003a9400, 0x003a9441, 0x003a9460, 0x003a94a1, 0x003a94e0, 0x003a9521,
    0x003a95a0, 0x003a95c1, 0x003a96c2, 0x003a9740, 0x003a9762, 0x003a9780, 0x003a97a2, 0x003a9880,
    0x003a98a2, 0x003a9a01, 0x003a9d42, 0x003aa081, 0x003aa0c0, 0x003aa0e1, 0x003aa160, 0x003aa1a1,
    0x003aa2a0, 0x003aa2c1, 0x003aa3a0, 0x003aa3c2, 0x003aa701, 0x003aa740, 0x003aa761, 0x003aa7e0,
    0x003aa801, 0x003aa8a0, 0x003aa8c1, 0x003aa8e0, 0x003aa941, 0x003aaa20, 0x003aaa42, 0x003aad81,
    0x003ab0c2, 0x003ab401, 0x003ab742, 0x003aba81, 0x003abdc2, 0x003ac101, 0x003ac442, 0x003ac781,
    0x003acac2, 0x003ace01, 0x003ad142, 0x003ad4c0, 0x003ad501, 0x003ad833, 0x003ad842, 0x003adb73,
    0x003adb82, 0x003adc41, 0x003adf73, 0x003adf82, 0x003ae2b3, 0x003ae2c2, 0x003ae381, 0x003ae6b3,
    0x003ae6c2, 0x003ae9f3, 0x003aea02, 0x003aeac1, 0x003aedf3, 0x003aee02, 0x003af133, 0x003af142,
    0x003af201, 0x003af533, 0x003af542, 0x003af873, 0x003af882, 0x003af941, 0x003af962, 0x003af980,
    0x003af9c9, 0x003b0016, 0x003b4006, 0x003b46f6, 0x003b4766, 0x003b4db6, 0x003b4ea6, 0x003b4ed6,
    0x003b5086, 0x003b50b6, 0x003b50f2, 0x003b5180, 0x003b5366, 0x003b5400, 0x003b5426, 0x003b5600,
    0x003be002, 0x003be145, 0x003be162, 0x003be3e0, 0x003be4a2, 0x003be560, 0x003c0006, 0x003c00e0,
    0x003c0106, 0x003c0320, 0x003c0366, 0x003c0440, 0x003c0466, 0x003c04a0, 0x003c04c6, 0x003c0560,
    0x003c0604, 0x003c0dc0, 0x003c11e6, 0x003c1200, 0x003c2005, 0x003c25a0, 0x003c2606, 0x003c26e4,
    0x003c27c0, 0x003c2809, 0x003c2940, 0x003c29c5, 0x003c29f6, 0x003c2a00, 0x003c5205, 0x003c55c6,
    0x003c55e0, 0x003c5805, 0x003c5d86, 0x003c5e09, 0x003c5f40, 0x003c5ff4, 0x003c6000, 0x003c9a05,
    0x003c9d64, 0x003c9d86, 0x003c9e09, 0x003c9f40, 0x003cfc05, 0x003cfce0, 0x003cfd05, 0x003cfd80,
    0x003cfda5, 0x003cfde0, 0x003cfe05, 0x003cffe0, 0x003d0005, 0x003d18a0, 0x003d18eb, 0x003d1a06,
    0x003d1ae0, 0x003d2001, 0x003d2442, 0x003d2886, 0x003d2964, 0x003d2980, 0x003d2a09, 0x003d2b40,
    0x003d2bd2, 0x003d2c00, 0x003d8e2b, 0x003d9596, 0x003d95ab, 0x003d9614, 0x003d962b, 0x003d96a0,
    0x003da02b, 0x003da5d6, 0x003da5eb, 0x003da7c0, 0x003dc005, 0x003dc080, 0x003dc0a5, 0x003dc400,
    0x003dc425, 0x003dc460, 0x003dc485, 0x003dc4a0, 0x003dc4e5, 0x003dc500, 0x003dc525, 0x003dc660,
    0x003dc685, 0x003dc700, 0x003dc725, 0x003dc740, 0x003dc765, 0x003dc780, 0x003dc845, 0x003dc860,
    0x003dc8e5, 0x003dc900, 0x003dc925, 0x003dc940, 0x003dc965, 0x003dc980, 0x003dc9a5, 0x003dca00,
    0x003dca25, 0x003dca60, 0x003dca85, 0x003dcaa0, 0x003dcae5, 0x003dcb00, 0x003dcb25, 0x003dcb40,
    0x003dcb65, 0x003dcb80, 0x003dcba5, 0x003dcbc0, 0x003dcbe5, 0x003dcc00, 0x003dcc25, 0x003dcc60,
    0x003dcc85, 0x003dcca0, 0x003dcce5, 0x003dcd60, 0x003dcd85, 0x003dce60, 0x003dce85, 0x003dcf00,
    0x003dcf25, 0x003dcfa0, 0x003dcfc5, 0x003dcfe0, 0x003dd005, 0x003dd140, 0x003dd165, 0x003dd380,
    0x003dd425, 0x003dd480, 0x003dd4a5, 0x003dd540, 0x003dd565, 0x003dd780, 0x003dde13, 0x003dde40,
    0x003e0016, 0x003e0580, 0x003e0616, 0x003e1280, 0x003e1416, 0x003e15e0, 0x003e1636, 0x003e1800,
    0x003e1836, 0x003e1a00, 0x003e1a36, 0x003e1ec0, 0x003e200b, 0x003e21b6, 0x003e35c0, 0x003e3cd6,
    0x003e4060, 0x003e4216, 0x003e4780, 0x003e4816, 0x003e4920, 0x003e4a16, 0x003e4a40, 0x003e4c16,
    0x003e4cc0, 0x003e6016, 0x003e7f75, 0x003e8016, 0x003edb00, 0x003edb96, 0x003edda0, 0x003ede16,
    0x003edfa0, 0x003ee016, 0x003eeee0, 0x003eef76, 0x003efb40, 0x003efc16, 0x003efd80, 0x003efe16,
    0x003efe20, 0x003f0016, 0x003f0180, 0x003f0216, 0x003f0900, 0x003f0a16, 0x003f0b40, 0x003f0c16,
    0x003f1100, 0x003f1216, 0x003f15c0, 0x003f1616, 0x003f1640, 0x003f2016, 0x003f4a80, 0x003f4c16,
    0x003f4dc0, 0x003f4e16, 0x003f4fa0, 0x003f5016, 0x003f5120, 0x003f5216, 0x003f57c0, 0x003f57f6,
    0x003f58c0, 0x003f59d6, 0x003f5b80, 0x003f5c16, 0x003f5d20, 0x003f5e16, 0x003f5f20, 0x003f6016,
    0x003f7260, 0x003f7296, 0x003f7960, 0x003f7e09, 0x003f7f40, 0x00400005, 0x0054dc00, 0x0054e005,
    0x0056e740, 0x0056e805, 0x005703c0, 0x00570405, 0x0059d440, 0x0059d605, 0x005d7c20, 0x005f0005,
    0x005f43c0, 0x00600005, 0x00626960, 0x00626a05, 0x00647600, 0x01c0003b, 0x01c00040, 0x01c0041b,
    0x01c01000, 0x01c02006, 0x01c03e00, 0x01e0001d, 0x01ffffc0, 0x0200001d, 0x021fffc0,
};

static uni_gc uni_category(uint32_t cp) {
    if (cp < 128) return (uni_gc)uni_gc_ascii[cp];
    if (cp > 0x10ffff) return UNI_CN;
    // The last range whose first code point is <= cp.
    size_t lo = 0, hi = PSV_ARRAY_LEN(uni_gc_ranges);
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if ((uni_gc_ranges[mid] >> 5) <= cp) lo = mid;
        else hi = mid;
    }
    return (uni_gc)(uni_gc_ranges[lo] & 31);
}

// White_Space (PropList.txt): what \s matches in the Rust regex crate and in llama.cpp.
static bool uni_is_space(uint32_t cp) {
    if (cp < 128) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0d);
    switch (cp) {
    case 0x0085: case 0x00a0: case 0x1680: case 0x2000: case 0x2001: case 0x2002:
    case 0x2003: case 0x2004: case 0x2005: case 0x2006: case 0x2007: case 0x2008:
    case 0x2009: case 0x200a: case 0x2028: case 0x2029: case 0x202f: case 0x205f:
    case 0x3000:
        return true;
    default: return false;
    }
}

// ----------------------------------------------------------------------------
// 9. Tokenizers
// Text <-> token ids for the two tokenizer families of GGUF models, read from the
// tokenizer.ggml.* metadata: SPM ("llama": score-ordered merges over UTF-8 characters, U+2581
// for spaces, <0xXX> byte fallback) and byte-level BPE ("gpt2": rank-ordered merges over bytes
// shown as printable characters, after a pre-tokenizer has split the text into words). The
// results are llama.cpp's, token for token, on valid UTF-8; that is what GGUF models are run
// with, and ../shared/conformance/tokenizer checks it.
//
// API. A tok_vocab is immutable after tok_load, so any number of threads may use one at once.
//   tok_load(gguf, &v, err), tok_free(v)      build from metadata; v copies what it needs, so
//                                             the gguf_file may be closed afterwards
//   tok_encode(v, text, n, add_special, parse_special, &ids, &n_ids, err)
//                                             ids are malloc'd (free them); add_special adds
//                                             BOS/EOS as the model asks (add_bos_token...);
//                                             parse_special recognises control tokens in text
//   tok_encode_segments(v, segs, n, add_special, &ids, &n_ids, err)
//                                             the same over a concatenation of segments, each
//                                             with its own parse_special: a chat prompt is
//                                             template text (parsed) + user content (never
//                                             parsed), tokenized as one string
//   tok_token_bytes(v, id, &len)              the bytes a token stands for (control tokens as
//                                             their text); tok_detokenize(v, ids, n, flags, buf)
//   tok_stream_init/push/put/flush            incremental detokenizer for generation: emits
//                                             only whole UTF-8 characters (see tok_stream)
//   tok_n_vocab, tok_bos, tok_eos, tok_eot, tok_eom, tok_unk (-1 when absent), tok_add_bos,
//   tok_add_eos, tok_is_eog, tok_is_control, tok_find (exact text -> id), tok_pre_name
//   cli_tokenize, cli_detokenize              `pensieve tokenize` / `pensieve detokenize`
//
// Invalid UTF-8 in the input is never an error. Each byte that does not belong to a valid
// sequence is kept as itself (llama.cpp substitutes U+FFFD): the pre-tokenizers classify it as
// U+FFFD would be, byte-level BPE encodes the byte itself and SPM falls back to its <0xXX>
// token, so detokenizing gives back the exact input bytes.

#ifndef PSV_TOK_MAX_TEXT // longest text one tok_encode call accepts (offsets are 32-bit)
#define PSV_TOK_MAX_TEXT (1u << 30)
#endif

// ---- UTF-8 (RFC 3629, Unicode §3.9 Table 3-7) ----------------------------------------------

#define UTF8_BAD 0xffffffffu // "this byte is not part of a valid sequence"

// Decode the character at s[0..n) (n >= 1). Returns its length; an invalid or truncated
// sequence gives *cp = UTF8_BAD and length 1, so a decoder resynchronises on the next byte.
static size_t utf8_decode(const uint8_t *s, size_t n, uint32_t *cp) {
    uint8_t b = s[0], lo = 0x80, hi = 0xbf;
    size_t len;
    uint32_t c;
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    if (b >= 0xc2 && b <= 0xdf) len = 2, c = b & 0x1fu;
    else if (b >= 0xe0 && b <= 0xef) len = 3, c = b & 0x0fu, lo = b == 0xe0 ? 0xa0 : 0x80, hi = b == 0xed ? 0x9f : 0xbf;
    else if (b >= 0xf0 && b <= 0xf4) len = 4, c = b & 0x07u, lo = b == 0xf0 ? 0x90 : 0x80, hi = b == 0xf4 ? 0x8f : 0xbf;
    else {
        *cp = UTF8_BAD;
        return 1;
    }
    if (n < len) {
        *cp = UTF8_BAD;
        return 1;
    }
    for (size_t i = 1; i < len; i++) {
        if (s[i] < lo || s[i] > hi) {
            *cp = UTF8_BAD;
            return 1;
        }
        lo = 0x80, hi = 0xbf; // only the second byte has a narrower range
        c = (c << 6) | (s[i] & 0x3fu);
    }
    *cp = c;
    return len;
}

// 1 when s[0..k) is a complete valid character, 0 when it is a proper prefix of one, -1 when
// no continuation can make it valid.
static int utf8_check(const uint8_t *s, size_t k) {
    uint32_t cp;
    if (utf8_decode(s, k, &cp) == k && cp != UTF8_BAD) return 1;
    uint8_t b = s[0], lo = 0x80, hi = 0xbf;
    size_t len;
    if (b >= 0xc2 && b <= 0xdf) len = 2;
    else if (b >= 0xe0 && b <= 0xef) len = 3, lo = b == 0xe0 ? 0xa0 : 0x80, hi = b == 0xed ? 0x9f : 0xbf;
    else if (b >= 0xf0 && b <= 0xf4) len = 4, lo = b == 0xf0 ? 0x90 : 0x80, hi = b == 0xf4 ? 0x8f : 0xbf;
    else return -1;
    if (k >= len) return -1;
    for (size_t i = 1; i < k; i++) {
        if (s[i] < lo || s[i] > hi) return -1;
        lo = 0x80, hi = 0xbf;
    }
    return 0;
}

static size_t utf8_encode(uint32_t cp, uint8_t out[4]) {
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xc0 | (cp >> 6));
        out[1] = (uint8_t)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xe0 | (cp >> 12));
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (uint8_t)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (uint8_t)(0xf0 | (cp >> 18));
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (uint8_t)(0x80 | (cp & 0x3f));
    return 4;
}

// ---- GPT-2 byte <-> character map ----------------------------------------------------------
// Byte-level BPE vocabularies spell each byte as a printable character (GPT-2's
// bytes_to_unicode): the printable Latin-1 bytes ! .. ~, ¡ .. ¬, ® .. ÿ stand for themselves;
// the other 68 (controls, space, DEL, NBSP, soft hyphen) take U+0100.. in byte order, so
// space is U+0120 'Ġ' and newline U+010A 'Ċ'.

static bool bpe_byte_printable(unsigned b) {
    return (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
}

static uint32_t bpe_byte_to_cp(uint8_t b) {
    if (bpe_byte_printable(b)) return b;
    if (b <= 0x20) return 0x100u + b;
    if (b <= 0xa0) return 0x100u + 33 + (b - 0x7fu);
    return 0x100u + 67; // 0xad
}

// The byte a character stands for, or -1 when it is not one of the 256.
static int bpe_cp_to_byte(uint32_t cp) {
    if (cp < 0x100) return bpe_byte_printable(cp) ? (int)cp : -1;
    if (cp < 0x100 + 33) return (int)(cp - 0x100);
    if (cp < 0x100 + 67) return (int)(cp - 0x100 - 33 + 0x7f);
    if (cp == 0x100 + 67) return 0xad;
    return -1;
}

// ---- Vocabulary ----------------------------------------------------------------------------

typedef enum { TOK_SPM, TOK_BPE } tok_kind;

// Pre-tokenizers: each is a fixed sequence of split rules (below), named after the regexes
// llama.cpp runs for them (llama-vocab.cpp, llm_tokenizer_bpe).
typedef enum {
    TOK_PRE_NONE, // SPM: no pre-tokenizer
    TOK_PRE_DEFAULT,
    TOK_PRE_GPT2,
    TOK_PRE_LLAMA3,
    TOK_PRE_QWEN2,
    TOK_PRE_GPT4O,
    TOK_PRE_STARCODER,
    TOK_PRE_FALCON,
    TOK_PRE_DEEPSEEK_LLM,
    TOK_PRE_DEEPSEEK_CODER,
} tok_pre;

// tokenizer.ggml.pre names, with what llama.cpp sets for each besides the split rules:
// ignore_merges (a word that is a whole token is taken as is) and the add_bos default.
static const struct {
    const char *name;
    tok_pre pre;
    bool ignore_merges, add_bos;
} tok_pre_names[] = {
    {"default", TOK_PRE_DEFAULT, false, false},
    {"gpt-2", TOK_PRE_GPT2, false, false},
    {"phi-2", TOK_PRE_GPT2, false, false},
    {"mpt", TOK_PRE_GPT2, false, false},
    {"olmo", TOK_PRE_GPT2, false, false},
    {"llama3", TOK_PRE_LLAMA3, true, true},
    {"llama-v3", TOK_PRE_LLAMA3, true, true},
    {"llama-bpe", TOK_PRE_LLAMA3, true, true},
    {"falcon3", TOK_PRE_LLAMA3, true, true},
    {"dbrx", TOK_PRE_LLAMA3, false, false},
    {"smaug-bpe", TOK_PRE_LLAMA3, false, false},
    {"qwen2", TOK_PRE_QWEN2, false, false},
    {"deepseek-r1-qwen", TOK_PRE_QWEN2, false, false},
    {"stablelm2", TOK_PRE_QWEN2, false, false},
    {"megrez", TOK_PRE_QWEN2, false, false},
    {"gpt-4o", TOK_PRE_GPT4O, false, false},
    {"llama4", TOK_PRE_GPT4O, false, false},
    {"starcoder", TOK_PRE_STARCODER, false, false},
    {"refact", TOK_PRE_STARCODER, false, false},
    {"smollm", TOK_PRE_STARCODER, false, false},
    {"falcon", TOK_PRE_FALCON, false, false},
    {"deepseek-llm", TOK_PRE_DEEPSEEK_LLM, false, false},
    {"deepseek-coder", TOK_PRE_DEEPSEEK_CODER, false, false},
};

// Token attributes, from tokenizer.ggml.token_type (llama.cpp's llama_token_type: 1 normal,
// 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte; anything else is undefined: no bits)
// plus the adjustments llama.cpp makes by token text.
enum {
    TOK_ATTR_NORMAL = 1 << 0,
    TOK_ATTR_UNKNOWN = 1 << 1,
    TOK_ATTR_CONTROL = 1 << 2,
    TOK_ATTR_USER = 1 << 3, // user-defined: always split out of text, even without parse_special
    TOK_ATTR_BYTE = 1 << 4,
    TOK_ATTR_UNUSED = 1 << 5,
    TOK_ATTR_LSTRIP = 1 << 6, // when split out, eat the whitespace before it
    TOK_ATTR_RSTRIP = 1 << 7, // ... after it
};

// One node of the special-token trie (children as a sibling list: most nodes have one child).
typedef struct {
    int32_t child, sibling;
    int32_t special; // index into tok_vocab.special when a token ends here, else -1
    uint8_t byte;
} tok_trie_node;

// A slot of the string table: the id, and the high half of its text's hash, which most probes
// that miss are told apart by without reading the text.
typedef struct {
    int32_t id;
    uint32_t tag;
} tok_str_slot;

// A slot of the merge table: one cache line holds all a lookup reads.
typedef struct {
    uint64_t key;
    uint32_t rank;
    int32_t out;
} tok_merge;

typedef struct tok_vocab {
    tok_kind kind;
    tok_pre pre;
    char pre_name[64];
    int32_t n_vocab;
    // Interned strings: the token texts [0, n_vocab), then merge operands and results that are
    // not tokens [n_vocab, n_str). A text's id is its first token id (duplicates keep the first).
    int32_t n_str;
    uint32_t *str_off; // n_str + 1 offsets into str_buf
    size_t str_off_cap;
    buf_t str_buf;
    tok_str_slot *str_tab; // open-addressing hash text -> id, id -1 empty
    size_t str_cap;        // power of two
    float *score;     // n_vocab (SPM merge priority)
    uint8_t *attr;    // n_vocab, TOK_ATTR_*
    // What each token detokenizes to: control and unknown tokens as their text.
    uint32_t *piece_off; // n_vocab + 1
    char *piece;
    // BPE merges: (left id, right id) -> rank and result id, open addressing keyed by
    // left << 32 | right (UINT64_MAX empty).
    tok_merge *merge;
    size_t merge_cap;
    int32_t byte_sym[256];  // BPE: string id of each byte's GPT-2 character (-1: none)
    int32_t byte_tok1[256]; // the token whose text is that single byte (-1: none)
    int32_t spm_byte[256];  // SPM byte fallback: <0xXX>, else the single byte (-1: none)
    // Special tokens (control, user-defined, unknown), longest first: the order llama.cpp
    // splits them out of text in. special_first[b] marks bytes that start one.
    int32_t *special;
    int32_t n_special;
    tok_trie_node *trie; // node 0 is the root
    int32_t n_trie;
    uint8_t special_first[256];
    int32_t bos, eos, eot, eom, unk;
    int32_t *eog; // sorted end-of-generation ids
    int32_t n_eog;
    bool add_bos, add_eos, add_space_prefix, ignore_merges;
    // SPM: no token has U+2581 right after another character than U+2581, so no merge can
    // join a character to a following space marker and text can be encoded word by word.
    bool spm_words;
} tok_vocab;

PSV_MAYBE_UNUSED static int32_t tok_n_vocab(const tok_vocab *v) { return v->n_vocab; }
PSV_MAYBE_UNUSED static int32_t tok_bos(const tok_vocab *v) { return v->bos; }
PSV_MAYBE_UNUSED static int32_t tok_eos(const tok_vocab *v) { return v->eos; }
PSV_MAYBE_UNUSED static int32_t tok_eot(const tok_vocab *v) { return v->eot; }
PSV_MAYBE_UNUSED static int32_t tok_eom(const tok_vocab *v) { return v->eom; }
PSV_MAYBE_UNUSED static int32_t tok_unk(const tok_vocab *v) { return v->unk; }
PSV_MAYBE_UNUSED static bool tok_add_bos(const tok_vocab *v) { return v->add_bos; }
PSV_MAYBE_UNUSED static bool tok_add_eos(const tok_vocab *v) { return v->add_eos; }
PSV_MAYBE_UNUSED static const char *tok_pre_name(const tok_vocab *v) { return v->pre_name; }

// True for control and unknown tokens: markup the model reads, not text it writes.
static bool tok_is_control(const tok_vocab *v, int32_t id) {
    return id >= 0 && id < v->n_vocab && (v->attr[id] & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN));
}

// End of generation: EOS, EOT, EOM and the tokens llama.cpp treats as ending a turn by their
// text (<|im_end|>, <|end|>, <|eot_id|>, <|endoftext|>, <end_of_turn>, ...).
PSV_MAYBE_UNUSED static bool tok_is_eog(const tok_vocab *v, int32_t id) {
    int32_t lo = 0, hi = v->n_eog;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (v->eog[mid] < id) lo = mid + 1;
        else hi = mid;
    }
    return lo < v->n_eog && v->eog[lo] == id;
}

static const char *tok_str(const tok_vocab *v, int32_t id, size_t *len) {
    *len = v->str_off[id + 1] - v->str_off[id];
    return v->str_buf.data + v->str_off[id];
}

// The raw vocabulary text of a token (e.g. "Ġhello", "▁the", "<0x0A>").
PSV_MAYBE_UNUSED static const char *tok_token_text(const tok_vocab *v, int32_t id, size_t *len) {
    if (id < 0 || id >= v->n_vocab) {
        *len = 0;
        return "";
    }
    return tok_str(v, id, len);
}

// The bytes a token stands for; control and unknown tokens give their text. Empty for ids out
// of range. Valid until tok_free.
static const char *tok_token_bytes(const tok_vocab *v, int32_t id, size_t *len) {
    if (id < 0 || id >= v->n_vocab) {
        *len = 0;
        return "";
    }
    *len = v->piece_off[id + 1] - v->piece_off[id];
    return v->piece + v->piece_off[id];
}

// Eight bytes at a time, then a final mix: the table takes the low bits as the slot and the
// high 32 as the tag. Loading a 200k-token vocabulary and its merges hashes 800k texts.
static uint64_t tok_hash(const char *p, size_t n) {
    const uint8_t *u = (const uint8_t *)p;
    uint64_t h = 0x9e3779b97f4a7c15ull ^ n;
    for (; n >= 8; u += 8, n -= 8) {
        h = (h ^ ld_u64(u)) * 0xff51afd7ed558ccdull;
        h ^= h >> 29;
    }
    uint64_t w = 0;
    for (size_t i = 0; i < n; i++) w |= (uint64_t)u[i] << (8 * i);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 32;
    h *= 0xff51afd7ed558ccdull;
    return h ^ (h >> 29);
}

// memcmp(a, b, n) == 0 for the short texts of a vocabulary, without a call.
static inline bool tok_same(const char *a, const char *b, size_t n) {
    const uint8_t *x = (const uint8_t *)a, *y = (const uint8_t *)b;
    for (; n >= 8; x += 8, y += 8, n -= 8)
        if (ld_u64(x) != ld_u64(y)) return false;
    for (; n; x++, y++, n--)
        if (*x != *y) return false;
    return true;
}

// The slot of table tab (cap slots) that holds the string p[0..n) of hash h, or else the empty
// slot where it would go.
static size_t tok_str_probe(const tok_vocab *v, const tok_str_slot *tab, size_t cap, const char *p, size_t n,
                            uint64_t h) {
    const uint32_t tag = (uint32_t)(h >> 32);
    for (size_t i = (size_t)h & (cap - 1);; i = (i + 1) & (cap - 1)) {
        if (tab[i].id < 0) return i;
        if (tab[i].tag != tag) continue;
        size_t len;
        const char *s = tok_str(v, tab[i].id, &len);
        if (len == n && tok_same(s, p, n)) return i;
    }
}

static int32_t tok_str_find(const tok_vocab *v, const char *p, size_t n) {
    return v->str_tab[tok_str_probe(v, v->str_tab, v->str_cap, p, n, tok_hash(p, n))].id;
}

// The token with exactly this text, or -1 (e.g. to find "<|im_end|>").
static int32_t tok_find(const tok_vocab *v, const char *text, size_t n) {
    int32_t id = tok_str_find(v, text, n);
    return id < v->n_vocab ? id : -1;
}

// Slots of an open-addressing table (string table, merges) for n entries: the least power of two
// from 16 on at most 2/3 full (against 1/2: 2 MB less for qwen2's 152k strings, 4 MB for its
// 150k merges).
static size_t tok_table_cap(size_t n) {
    size_t cap = 16;
    while (2 * cap < 3 * n) cap *= 2;
    return cap;
}

static bool tok_str_rehash(tok_vocab *v, size_t cap) {
    tok_str_slot *tab = malloc(cap * sizeof *tab);
    if (!tab) return false;
    memset(tab, 0xff, cap * sizeof *tab);
    enum { AHEAD = 16 };
    uint64_t ring[AHEAD]; // the hashes of the next ids, whose slots are being prefetched
    for (int64_t j = 0; j < (int64_t)v->n_str + AHEAD; j++) {
        if (j >= AHEAD) { // insert id j - AHEAD
            int32_t id = (int32_t)(j - AHEAD);
            size_t len;
            const char *s = tok_str(v, id, &len);
            uint64_t h = ring[id % AHEAD];
            size_t i = tok_str_probe(v, tab, cap, s, len, h);
            if (tab[i].id < 0) tab[i] = (tok_str_slot){id, (uint32_t)(h >> 32)}; // a duplicate keeps the first
        }
        if (j < v->n_str) { // and start on id j
            size_t len;
            const char *s = tok_str(v, (int32_t)j, &len);
            ring[j % AHEAD] = tok_hash(s, len);
            __builtin_prefetch(&tab[(size_t)ring[j % AHEAD] & (cap - 1)], 1);
        }
    }
    free(v->str_tab);
    v->str_tab = tab;
    v->str_cap = cap;
    return true;
}

// The id of a string whose tok_hash is h, adding it after the tokens when new. -1 on
// out-of-memory.
static int32_t tok_str_intern(tok_vocab *v, const char *p, size_t n, uint64_t h) {
    const size_t slot = tok_str_probe(v, v->str_tab, v->str_cap, p, n, h);
    int32_t id = v->str_tab[slot].id;
    if (id >= 0) return id;
    if (v->n_str >= INT32_MAX - 1) return -1;
    if ((size_t)v->n_str + 2 > v->str_off_cap) {
        size_t cap = v->str_off_cap * 2;
        uint32_t *o = realloc(v->str_off, cap * sizeof *o);
        if (!o) return -1;
        v->str_off = o;
        v->str_off_cap = cap;
    }
    if (v->str_buf.len + n > UINT32_MAX) return -1;
    buf_append(&v->str_buf, p, n);
    if (v->str_buf.oom) return -1;
    id = v->n_str++;
    v->str_off[v->n_str] = (uint32_t)v->str_buf.len;
    if (tok_table_cap((size_t)v->n_str) > v->str_cap) {
        if (!tok_str_rehash(v, v->str_cap * 2)) return -1; // which places the new string too
    } else {
        v->str_tab[slot] = (tok_str_slot){id, (uint32_t)(h >> 32)};
    }
    return id;
}

static size_t tok_merge_hash(const tok_vocab *v, uint64_t key) {
    return (size_t)((key * 0x9e3779b97f4a7c15ull) >> 20) & (v->merge_cap - 1);
}

static size_t tok_merge_slot(const tok_vocab *v, uint64_t key) {
    size_t mask = v->merge_cap - 1, i = tok_merge_hash(v, key);
    while (v->merge[i].key != UINT64_MAX && v->merge[i].key != key) i = (i + 1) & mask;
    return i;
}

static void tok_free(tok_vocab *v) {
    if (!v) return;
    free(v->str_off);
    buf_free(&v->str_buf);
    free(v->str_tab);
    free(v->score);
    free(v->attr);
    free(v->piece_off);
    free(v->piece);
    free(v->merge);
    free(v->special);
    free(v->trie);
    free(v->eog);
    free(v);
}

typedef struct {
    int32_t len, id;
} tok_len_id;

static int tok_len_id_cmp(const void *a, const void *b) {
    const tok_len_id *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static int tok_i32_cmp(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

// Texts llama.cpp recognises special tokens by (llama-vocab.cpp, llama_vocab::impl::load) when
// the metadata does not name them; the first text of a role found in the vocabulary takes it.
// Each one found is made a control token.
enum { TOK_ROLE_EOT, TOK_ROLE_EOM, TOK_ROLE_FIM_PRE, TOK_ROLE_FIM_SUF, TOK_ROLE_FIM_MID, TOK_ROLE_FIM_PAD,
       TOK_ROLE_FIM_REP, TOK_ROLE_FIM_SEP, TOK_ROLE_COUNT };
#define TOK_DS_BAR "\xef\xbd\x9c" // U+FF5C FULLWIDTH VERTICAL LINE, in DeepSeek's markers
#define TOK_SPM_SP "\xe2\x96\x81" // U+2581, sentencepiece's space
static const struct {
    const char *text;
    uint8_t role;
} tok_auto_special[] = {
    {"<|eot_id|>", TOK_ROLE_EOT}, {"<|im_end|>", TOK_ROLE_EOT}, {"<|end|>", TOK_ROLE_EOT},
    {"<end_of_turn>", TOK_ROLE_EOT}, {"<|endoftext|>", TOK_ROLE_EOT}, {"<|end_of_text|>", TOK_ROLE_EOT},
    {"<EOT>", TOK_ROLE_EOT}, {"_<EOT>", TOK_ROLE_EOT}, {"[EOT]", TOK_ROLE_EOT},
    {"<" TOK_DS_BAR "end" TOK_SPM_SP "of" TOK_SPM_SP "sentence" TOK_DS_BAR ">", TOK_ROLE_EOT},
    {"<end_of_utterance>", TOK_ROLE_EOT},
    {"<|eom_id|>", TOK_ROLE_EOM},
    {"<|fim_prefix|>", TOK_ROLE_FIM_PRE}, {"<fim-prefix>", TOK_ROLE_FIM_PRE}, {"<fim_prefix>", TOK_ROLE_FIM_PRE},
    {"<" TOK_DS_BAR "fim" TOK_SPM_SP "begin" TOK_DS_BAR ">", TOK_ROLE_FIM_PRE}, {"<PRE>", TOK_ROLE_FIM_PRE},
    {TOK_SPM_SP "<PRE>", TOK_ROLE_FIM_PRE}, {"<|code_prefix|>", TOK_ROLE_FIM_PRE}, {"<|prefix|>", TOK_ROLE_FIM_PRE},
    {"<|fim_suffix|>", TOK_ROLE_FIM_SUF}, {"<fim-suffix>", TOK_ROLE_FIM_SUF}, {"<fim_suffix>", TOK_ROLE_FIM_SUF},
    {"<" TOK_DS_BAR "fim" TOK_SPM_SP "hole" TOK_DS_BAR ">", TOK_ROLE_FIM_SUF}, {"<SUF>", TOK_ROLE_FIM_SUF},
    {TOK_SPM_SP "<SUF>", TOK_ROLE_FIM_SUF}, {"<|code_suffix|>", TOK_ROLE_FIM_SUF}, {"<|suffix|>", TOK_ROLE_FIM_SUF},
    {"<|fim_middle|>", TOK_ROLE_FIM_MID}, {"<fim-middle>", TOK_ROLE_FIM_MID}, {"<fim_middle>", TOK_ROLE_FIM_MID},
    {"<" TOK_DS_BAR "fim" TOK_SPM_SP "end" TOK_DS_BAR ">", TOK_ROLE_FIM_MID}, {"<MID>", TOK_ROLE_FIM_MID},
    {TOK_SPM_SP "<MID>", TOK_ROLE_FIM_MID}, {"<|code_middle|>", TOK_ROLE_FIM_MID}, {"<|middle|>", TOK_ROLE_FIM_MID},
    {"<|fim_pad|>", TOK_ROLE_FIM_PAD}, {"<fim-pad>", TOK_ROLE_FIM_PAD}, {"<fim_pad>", TOK_ROLE_FIM_PAD},
    {"<PAD>", TOK_ROLE_FIM_PAD}, {"[PAD]", TOK_ROLE_FIM_PAD},
    {"<|fim_repo|>", TOK_ROLE_FIM_REP}, {"<|repo_name|>", TOK_ROLE_FIM_REP}, {"<fim-repo>", TOK_ROLE_FIM_REP},
    {"<REPO>", TOK_ROLE_FIM_REP}, {"<reponame>", TOK_ROLE_FIM_REP},
    {"<|file_sep|>", TOK_ROLE_FIM_SEP},
};

// Texts that end generation (llama.cpp's special_eog_ids list).
static const char *const tok_eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<" TOK_DS_BAR "end" TOK_SPM_SP "of" TOK_SPM_SP "sentence" TOK_DS_BAR ">", "[e~[",
};

static int32_t tok_find_c(const tok_vocab *v, const char *s) { return tok_find(v, s, strlen(s)); }

// A token id from metadata: kept when present and in range, else `def`.
static int32_t tok_meta_id(const gguf_file *f, const char *key, int32_t def, int32_t n_vocab) {
    uint32_t id;
    if (gguf_get_u32(f, key, &id) && id < (uint32_t)n_vocab) return (int32_t)id;
    return def;
}

static bool tok_ascii_contains_ci(str_t s, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= s.n; i++) {
        size_t j = 0;
        while (j < k && tolower((unsigned char)s.p[i + j]) == needle[j]) j++;
        if (j == k) return true;
    }
    return false;
}

static int tok_hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

// Decode a token's text into the bytes it stands for, appended to b.
static void tok_piece_build(const tok_vocab *v, int32_t id, buf_t *b) {
    size_t n;
    const char *s = tok_str(v, id, &n);
    uint8_t a = v->attr[id];
    if (a & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN | TOK_ATTR_USER)) {
        buf_append(b, s, n);
    } else if (a & TOK_ATTR_NORMAL) {
        const uint8_t *p = (const uint8_t *)s;
        for (size_t i = 0; i < n;) {
            size_t k = 0;
            while (i + k < n && p[i + k] < 0x80) k++; // ASCII stands for itself in both kinds
            if (k) {
                buf_append(b, p + i, k);
                i += k;
                continue;
            }
            uint32_t cp;
            k = utf8_decode(p + i, n - i, &cp);
            if (v->kind == TOK_SPM && cp == 0x2581) { // sentencepiece's space marker
                buf_putc(b, ' ');
            } else if (v->kind == TOK_BPE && bpe_cp_to_byte(cp) >= 0) {
                buf_putc(b, (char)bpe_cp_to_byte(cp));
            } else { // SPM text, or a character outside the byte map: kept as written
                buf_append(b, p + i, k);
            }
            i += k;
        }
    } else if (a & TOK_ATTR_BYTE) {
        // "<0xXX>" (sentencepiece byte pieces); anything else is kept as written.
        int hi = n == 6 ? tok_hex_digit(s[3]) : -1, lo = n == 6 ? tok_hex_digit(s[4]) : -1;
        if (n == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>' && hi >= 0 && lo >= 0) {
            buf_putc(b, (char)(hi << 4 | lo));
        } else {
            buf_append(b, s, n);
        }
    }
    // unused and undefined tokens stand for nothing
}

static psv_status tok_oom(psv_error *err) { return err_set(err, PSV_ERR_NOMEM, "tok: out of memory loading the vocabulary"); }

// tokenizer.ggml.model and .pre: the family, pre-tokenizer and llama.cpp's defaults for them.
static psv_status tok_load_kind(tok_vocab *v, const gguf_file *f, psv_error *err) {
    str_t model, pre = {"default", 7};
    char pr[96];
    if (!gguf_get_str(f, "tokenizer.ggml.model", &model))
        return err_set(err, PSV_ERR_FORMAT, "tok: tokenizer.ggml.model: missing (expected a string)");
    if (str_eq_c(model, "llama")) {
        v->kind = TOK_SPM;
        v->pre = TOK_PRE_NONE; // sentencepiece has no pre-tokenizer; .pre is ignored
        snprintf(v->pre_name, sizeof v->pre_name, "spm");
        v->add_bos = true;
        v->add_space_prefix = true;
        return PSV_OK;
    }
    if (!str_eq_c(model, "gpt2"))
        return err_set(err, PSV_ERR_UNSUPPORTED,
                       "tok: tokenizer.ggml.model: unsupported tokenizer '%s' (expected llama or gpt2)",
                       gguf_printable(pr, model));
    v->kind = TOK_BPE;
    gguf_get_str(f, "tokenizer.ggml.pre", &pre); // absent: "default", as in llama.cpp
    for (size_t i = 0; i < PSV_ARRAY_LEN(tok_pre_names); i++) {
        if (!str_eq_c(pre, tok_pre_names[i].name)) continue;
        v->pre = tok_pre_names[i].pre;
        v->ignore_merges = tok_pre_names[i].ignore_merges;
        v->add_bos = tok_pre_names[i].add_bos;
        snprintf(v->pre_name, sizeof v->pre_name, "%s", tok_pre_names[i].name);
        return PSV_OK;
    }
    char names[512];
    size_t k = 0;
    for (size_t j = 0; j < PSV_ARRAY_LEN(tok_pre_names); j++)
        k += (size_t)snprintf(names + k, sizeof names - k, "%s%s", j ? ", " : "", tok_pre_names[j].name);
    return err_set(err, PSV_ERR_UNSUPPORTED, "tok: tokenizer.ggml.pre: unknown pre-tokenizer '%s' (supported: %s)",
                   gguf_printable(pr, pre), names);
}

// Token texts (interned), scores and attributes.
static psv_status tok_load_tokens(tok_vocab *v, const gguf_file *f, psv_error *err) {
    const gguf_kv *tokens = gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_T_STRING);
    if (!tokens || tokens->arr_n == 0 || tokens->arr_n >= (uint64_t)INT32_MAX / 2)
        return err_set(err, PSV_ERR_FORMAT, "tok: tokenizer.ggml.tokens: missing, empty or too large "
                                            "(expected an array of 1 to 2^30 strings)");
    int32_t n = (int32_t)tokens->arr_n;
    const gguf_kv *scores = gguf_find_kv(f, "tokenizer.ggml.scores");
    if (scores && !(scores->type == GGUF_T_ARRAY &&
                    (scores->arr_type == GGUF_T_FLOAT32 || scores->arr_type == GGUF_T_INT32) &&
                    scores->arr_n >= (uint64_t)n))
        return err_set(err, PSV_ERR_FORMAT, "tok: tokenizer.ggml.scores: expected %d FLOAT32 or INT32 values", n);
    const gguf_kv *types = gguf_find_kv(f, "tokenizer.ggml.token_type");
    if (types && !(types->type == GGUF_T_ARRAY && types->arr_type == GGUF_T_INT32 && types->arr_n >= (uint64_t)n))
        return err_set(err, PSV_ERR_FORMAT, "tok: tokenizer.ggml.token_type: expected %d INT32 values", n);
    v->n_vocab = n;
    v->str_off_cap = (size_t)n + 64;
    v->str_off = malloc(v->str_off_cap * sizeof *v->str_off);
    v->score = malloc((size_t)n * sizeof *v->score);
    v->attr = malloc((size_t)n);
    if (!v->str_off || !v->score || !v->attr) return tok_oom(err);
    v->str_off[0] = 0;
    for (int32_t i = 0; i < n; i++) {
        str_t s = gguf_arr_str(tokens, (uint64_t)i);
        if (v->str_buf.len + s.n > UINT32_MAX)
            return err_set(err, PSV_ERR_RANGE, "tok: tokenizer.ggml.tokens: more than 4 GiB of text");
        buf_append(&v->str_buf, s.p, s.n);
        v->str_off[i + 1] = (uint32_t)v->str_buf.len;
        v->score[i] = !scores ? 0.0f
                      : scores->arr_type == GGUF_T_FLOAT32 ? gguf_arr_f32(scores, (uint64_t)i)
                                                           : (float)gguf_arr_int(scores, (uint64_t)i);
        int64_t t = types ? gguf_arr_int(types, (uint64_t)i) : 1;
        v->attr[i] = t == 1 ? TOK_ATTR_NORMAL : t == 2 ? TOK_ATTR_UNKNOWN : t == 3 ? TOK_ATTR_CONTROL
                   : t == 4 ? TOK_ATTR_USER : t == 5 ? TOK_ATTR_UNUSED : t == 6 ? TOK_ATTR_BYTE : 0;
    }
    if (!v->str_buf.data) buf_reserve(&v->str_buf, 0);
    if (v->str_buf.oom) return tok_oom(err);
    v->n_str = n;
    return tok_str_rehash(v, tok_table_cap((size_t)n)) ? PSV_OK : tok_oom(err);
}

// Special ids, BOS/EOS flags, the tokens llama.cpp recognises by text, and the
// end-of-generation set.
static psv_status tok_load_special_ids(tok_vocab *v, const gguf_file *f, psv_error *err) {
    int32_t n = v->n_vocab;
    // llama.cpp's SPM defaults are bos 1, eos 2, unk 0. Its BPE default of 11 for both BOS and
    // EOS is a GPT-NeoX relic (in GPT-2 it names ","), so BPE gets no default here.
    bool spm = v->kind == TOK_SPM;
    v->bos = tok_meta_id(f, "tokenizer.ggml.bos_token_id", spm && n > 1 ? 1 : -1, n);
    v->eos = tok_meta_id(f, "tokenizer.ggml.eos_token_id", spm && n > 2 ? 2 : -1, n);
    v->unk = tok_meta_id(f, "tokenizer.ggml.unknown_token_id", spm ? 0 : -1, n);
    static const char *const role_keys[TOK_ROLE_COUNT] = {
        "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id", "tokenizer.ggml.fim_pre_token_id",
        "tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.fim_pad_token_id",
        "tokenizer.ggml.fim_rep_token_id", "tokenizer.ggml.fim_sep_token_id"};
    int32_t role[TOK_ROLE_COUNT];
    for (int r = 0; r < TOK_ROLE_COUNT; r++) role[r] = tok_meta_id(f, role_keys[r], -1, n);
    gguf_get_bool(f, "tokenizer.ggml.add_space_prefix", &v->add_space_prefix);
    gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &v->add_bos);
    gguf_get_bool(f, "tokenizer.ggml.add_eos_token", &v->add_eos);
    if (v->bos < 0) v->add_bos = false; // nothing to add (llama.cpp refuses such a model)
    if (v->eos < 0) v->add_eos = false;

    // Roles the metadata leaves open go to the first listed text present; those tokens become
    // control (a control-looking token of another type is a conversion bug, says llama.cpp).
    for (size_t i = 0; i < PSV_ARRAY_LEN(tok_auto_special); i++) {
        uint8_t r = tok_auto_special[i].role;
        int32_t id = role[r] >= 0 ? -1 : tok_find_c(v, tok_auto_special[i].text);
        if (id < 0) continue;
        role[r] = id;
        v->attr[id] |= TOK_ATTR_CONTROL;
    }
    v->eot = role[TOK_ROLE_EOT];
    v->eom = role[TOK_ROLE_EOM];
    // Control tokens named "...unused..." are unused (Gemma's <unused0>, ...).
    for (int32_t i = 0; i < n; i++) {
        size_t len;
        const char *s = tok_str(v, i, &len);
        if ((v->attr[i] & TOK_ATTR_CONTROL) && len >= 6 && memmem(s, len, "unused", 6)) v->attr[i] |= TOK_ATTR_UNUSED;
    }
    // gpt-oss (o200k_harmony) marks these as plain text the model writes.
    static const char *const harmony_user[] = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"};
    for (size_t i = 0; i < PSV_ARRAY_LEN(harmony_user); i++) {
        int32_t id = tok_find_c(v, harmony_user[i]);
        if (id >= 0) v->attr[id] = TOK_ATTR_USER;
    }

    int32_t cand[PSV_ARRAY_LEN(tok_eog_texts) + 6], k = 0;
    for (size_t i = 0; i < PSV_ARRAY_LEN(tok_eog_texts); i++) {
        int32_t id = tok_find_c(v, tok_eog_texts[i]);
        if (id < 0) continue;
        cand[k++] = id;
        v->attr[id] |= TOK_ATTR_CONTROL;
    }
    int32_t more[6] = {role[TOK_ROLE_FIM_PAD], role[TOK_ROLE_FIM_REP], role[TOK_ROLE_FIM_SEP], v->eos, v->eot, v->eom};
    for (int i = 0; i < 6; i++)
        if (more[i] >= 0) cand[k++] = more[i];
    // gpt-oss and solar-open end turns with <|return|>/<|call|> (<|calls|>/<|flush|>): there
    // <|end|> only closes a message, is plain text, and does not end generation.
    int32_t t_end = tok_find_c(v, "<|end|>");
    if (t_end >= 0 && ((tok_find_c(v, "<|return|>") >= 0 && tok_find_c(v, "<|call|>") >= 0) ||
                       (tok_find_c(v, "<|calls|>") >= 0 && tok_find_c(v, "<|flush|>") >= 0))) {
        int32_t w = 0;
        for (int32_t i = 0; i < k; i++)
            if (cand[i] != t_end) cand[w++] = cand[i];
        k = w;
        v->attr[t_end] = TOK_ATTR_USER;
        if (v->eot == t_end) v->eot = -1;
    }
    qsort(cand, (size_t)k, sizeof *cand, tok_i32_cmp);
    int32_t w = 0;
    for (int32_t i = 0; i < k; i++)
        if (w == 0 || cand[w - 1] != cand[i]) cand[w++] = cand[i];
    v->eog = malloc(sizeof cand);
    if (!v->eog) return tok_oom(err);
    memcpy(v->eog, cand, (size_t)w * sizeof *cand);
    v->n_eog = w;
    return PSV_OK;
}

// The special tokens (control, user-defined, unknown) longest first, which is the order
// llama.cpp splits them out of text in, and a trie to find them.
static psv_status tok_build_specials(tok_vocab *v, const gguf_file *f, psv_error *err) {
    psv_status st = PSV_OK;
    int32_t n = v->n_vocab, ns = 0;
    size_t n_nodes = 1;
    tok_len_id *sl = malloc((size_t)n * sizeof *sl);
    if (!sl) return tok_oom(err);
    for (int32_t i = 0; i < n; i++) {
        size_t len;
        tok_str(v, i, &len);
        if ((v->attr[i] & (TOK_ATTR_CONTROL | TOK_ATTR_USER | TOK_ATTR_UNKNOWN)) && len > 0) {
            sl[ns++] = (tok_len_id){(int32_t)len, i};
            n_nodes += len; // n_str_bytes < 4 GiB bounds this
        }
    }
    qsort(sl, (size_t)ns, sizeof *sl, tok_len_id_cmp);
    v->special = malloc((size_t)(ns ? ns : 1) * sizeof *v->special);
    v->trie = n_nodes < (size_t)INT32_MAX ? malloc(n_nodes * sizeof *v->trie) : NULL;
    if (!v->special || !v->trie) {
        st = tok_oom(err);
        goto done;
    }
    v->n_special = ns;
    v->trie[0] = (tok_trie_node){-1, -1, -1, 0};
    v->n_trie = 1;
    for (int32_t i = 0; i < ns; i++) {
        size_t len;
        const uint8_t *s = (const uint8_t *)tok_str(v, sl[i].id, &len);
        int32_t node = 0;
        v->special[i] = sl[i].id;
        v->special_first[s[0]] = 1;
        for (size_t j = 0; j < len; j++) {
            int32_t c = v->trie[node].child;
            while (c >= 0 && v->trie[c].byte != s[j]) c = v->trie[c].sibling;
            if (c < 0) {
                c = v->n_trie++;
                v->trie[c] = (tok_trie_node){-1, v->trie[node].child, -1, s[j]};
                v->trie[node].child = c;
            }
            node = c;
        }
        if (v->trie[node].special < 0) v->trie[node].special = i; // duplicates keep the first
    }
    // Phi-3: llama.cpp strips the whitespace after its special tokens, which it recognises by
    // the model name (GGUF has no per-token flag for it).
    str_t name;
    if (gguf_get_str(f, "general.name", &name) &&
        (tok_ascii_contains_ci(name, "phi-3") || tok_ascii_contains_ci(name, "phi3"))) {
        for (int32_t i = 0; i < ns; i++) v->attr[v->special[i]] |= TOK_ATTR_RSTRIP;
        int32_t id = tok_find_c(v, "</s>");
        if (id >= 0) v->attr[id] |= TOK_ATTR_RSTRIP;
        static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>"};
        for (size_t i = 0; i < PSV_ARRAY_LEN(keep); i++)
            if ((id = tok_find_c(v, keep[i])) >= 0) v->attr[id] &= (uint8_t)~TOK_ATTR_RSTRIP;
    }
done:
    free(sl);
    return st;
}

// Start loading what finding a string of hash h will read: its first slot (step 0), the text
// offsets of the id there (1), the text (2). A hint only; the table may change before the find.
static void tok_str_prefetch(const tok_vocab *v, uint64_t h, int step) {
    const tok_str_slot *e = &v->str_tab[(size_t)h & (v->str_cap - 1)];
    if (step == 0) __builtin_prefetch(e);
    else if (e->id >= 0 && step == 1) __builtin_prefetch(&v->str_off[e->id]);
    else if (e->id >= 0) __builtin_prefetch(v->str_buf.data + v->str_off[e->id]);
}

// BPE merges "left right" (split at the first space after the first byte), as
// (left id, right id) -> (rank, result id). Operands and results that are not tokens get
// string ids of their own, so merging works on ids alone. The tables outgrow the caches (a
// 200k-merge vocabulary has 8 MB of string slots and 8 MB of merge slots), so merges go
// through a pipeline of batches of TOK_MERGE_BATCH: batch b is split and hashed and its slots
// prefetched in round b, the text offsets those slots name are prefetched in round b + 1 and
// the texts in round b + 2, its strings are looked up (in order) in round b + 3, which
// prefetches its merge slots, and its merges are inserted (in order) in round b + 4. Each
// prefetch has a round of work to arrive in.
enum { TOK_MERGE_BATCH = 16, TOK_MERGE_STAGES = 5 };

typedef struct {
    const char *l, *r; // NULL l: no space to split at, which llama.cpp maps to ("", ""), never matching
    size_t ln, rn, cat; // cat: where left + right starts in the batch's buffer
    uint64_t h[3];      // hashes of left, right, left + right
    uint64_t key;
    int32_t out;
} tok_merge_job;

static psv_status tok_load_merges(tok_vocab *v, const gguf_file *f, psv_error *err) {
    psv_status st = PSV_OK;
    buf_t cat[TOK_MERGE_STAGES] = {{0}}; // the batches' left + right strings
    tok_merge_job q[TOK_MERGE_STAGES][TOK_MERGE_BATCH];
    const gguf_kv *merges = gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_T_STRING);
    if (!merges) return err_set(err, PSV_ERR_FORMAT, "tok: tokenizer.ggml.merges: missing (expected an array of strings)");
    if (merges->arr_n >= (uint64_t)INT32_MAX / 4)
        return err_set(err, PSV_ERR_RANGE, "tok: tokenizer.ggml.merges: %" PRIu64 " merges is too many", merges->arr_n);
    const size_t m = (size_t)merges->arr_n, cap = tok_table_cap(m);
    v->merge_cap = cap;
    v->merge = malloc(cap * sizeof *v->merge);
    if (!v->merge) return tok_oom(err);
    memset(v->merge, 0xff, cap * sizeof *v->merge);
    const size_t n_batches = (m + TOK_MERGE_BATCH - 1) / TOK_MERGE_BATCH;
    for (size_t round = 0; round < n_batches + TOK_MERGE_STAGES - 1; round++) {
        for (size_t stage = 0; stage < TOK_MERGE_STAGES; stage++) {
            if (round < stage || round - stage >= n_batches) continue;
            const size_t b = round - stage, i0 = b * TOK_MERGE_BATCH;
            const size_t nb = m - i0 < TOK_MERGE_BATCH ? m - i0 : TOK_MERGE_BATCH;
            tok_merge_job *qb = q[b % TOK_MERGE_STAGES];
            buf_t *cb = &cat[b % TOK_MERGE_STAGES];
            if (stage == 0) cb->len = 0;
            for (size_t j = 0; j < nb; j++) {
                tok_merge_job *e = &qb[j];
                if (stage == 0) { // split and hash
                    str_t s = gguf_arr_str(merges, (uint64_t)(i0 + j));
                    const char *sp = s.n > 1 ? memchr(s.p + 1, ' ', s.n - 1) : NULL;
                    e->l = sp ? s.p : NULL;
                    if (!sp) continue;
                    e->r = sp + 1;
                    e->ln = (size_t)(sp - s.p);
                    e->rn = s.n - e->ln - 1;
                    e->cat = cb->len;
                    buf_append(cb, s.p, e->ln);
                    buf_append(cb, sp + 1, e->rn);
                    if (cb->oom) {
                        st = tok_oom(err);
                        goto done;
                    }
                    e->h[0] = tok_hash(e->l, e->ln);
                    e->h[1] = tok_hash(e->r, e->rn);
                    e->h[2] = tok_hash(cb->data + e->cat, e->ln + e->rn);
                    for (int k = 0; k < 3; k++) tok_str_prefetch(v, e->h[k], 0);
                } else if (!e->l) {
                    continue;
                } else if (stage < 3) { // text offsets, then texts
                    for (int k = 0; k < 3; k++) tok_str_prefetch(v, e->h[k], (int)stage);
                } else if (stage == 3) { // look up (or add) the strings
                    int32_t l = tok_str_intern(v, e->l, e->ln, e->h[0]);
                    int32_t r = l < 0 ? -1 : tok_str_intern(v, e->r, e->rn, e->h[1]);
                    e->out = r < 0 ? -1 : tok_str_intern(v, cb->data + e->cat, e->ln + e->rn, e->h[2]);
                    if (e->out < 0) {
                        st = tok_oom(err);
                        goto done;
                    }
                    e->key = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
                    __builtin_prefetch(&v->merge[tok_merge_hash(v, e->key)]);
                } else { // insert: a repeated pair keeps its first rank
                    size_t slot = tok_merge_slot(v, e->key);
                    if (v->merge[slot].key == UINT64_MAX) v->merge[slot] = (tok_merge){e->key, (uint32_t)(i0 + j), e->out};
                }
            }
        }
    }
done:
    for (int k = 0; k < TOK_MERGE_STAGES; k++) buf_free(&cat[k]);
    return st;
}

// Byte lookups, the SPM word-splitting property, and every token's detokenized bytes.
static psv_status tok_build_tables(tok_vocab *v, psv_error *err) {
    for (int b = 0; b < 256; b++) {
        char one = (char)b, hex[7];
        uint8_t enc[4];
        v->byte_tok1[b] = tok_find(v, &one, 1);
        snprintf(hex, sizeof hex, "<0x%02X>", b);
        int32_t id = tok_find(v, hex, 6);
        v->spm_byte[b] = id >= 0 ? id : v->byte_tok1[b]; // llama.cpp's byte_to_token
        size_t k = utf8_encode(bpe_byte_to_cp((uint8_t)b), enc);
        v->byte_sym[b] = tok_str_find(v, (const char *)enc, k);
    }
    if (v->kind == TOK_SPM) {
        v->spm_words = true;
        for (int32_t i = 0; i < v->n_vocab && v->spm_words; i++) {
            size_t len;
            const char *t = tok_str(v, i, &len);
            for (size_t j = 1; j + 3 <= len && v->spm_words; j++)
                if (memcmp(t + j, "\xe2\x96\x81", 3) == 0 && (j < 3 || memcmp(t + j - 3, "\xe2\x96\x81", 3) != 0))
                    v->spm_words = false;
        }
    }
    buf_t pb = {0};
    buf_reserve(&pb, v->str_off[v->n_vocab]); // a piece is never longer than its text
    v->piece_off = malloc(((size_t)v->n_vocab + 1) * sizeof *v->piece_off);
    if (!v->piece_off) return tok_oom(err);
    v->piece_off[0] = 0;
    for (int32_t i = 0; i < v->n_vocab && !pb.oom; i++) {
        tok_piece_build(v, i, &pb);
        if (pb.len > UINT32_MAX) pb.oom = true;
        v->piece_off[i + 1] = (uint32_t)pb.len;
    }
    if (!pb.oom && !pb.data) buf_reserve(&pb, 0);
    if (pb.oom) {
        buf_free(&pb);
        return tok_oom(err);
    }
    v->piece = pb.data;
    return PSV_OK;
}

// Build a vocabulary from a model's tokenizer.ggml.* metadata. The result copies what it needs:
// `f` may be closed afterwards. Errors: PSV_ERR_FORMAT (missing or malformed keys),
// PSV_ERR_UNSUPPORTED (another tokenizer family, or an unknown pre-tokenizer: the message lists
// the supported ones), PSV_ERR_RANGE, PSV_ERR_NOMEM.
static psv_status tok_load(const gguf_file *f, tok_vocab **out, psv_error *err) {
    psv_status st;
    tok_vocab *v = calloc(1, sizeof *v);
    *out = NULL;
    if (!v) return tok_oom(err);
    if ((st = tok_load_kind(v, f, err)) || (st = tok_load_tokens(v, f, err)) ||
        (st = tok_load_special_ids(v, f, err)) || (st = tok_build_specials(v, f, err)) ||
        (v->kind == TOK_BPE && (st = tok_load_merges(v, f, err))) || (st = tok_build_tables(v, err))) {
        tok_free(v);
        return st;
    }
    *out = v;
    return PSV_OK;
}

// ---- Pre-tokenizers ------------------------------------------------------------------------
// A pre-tokenizer splits text into words that BPE then encodes one by one. llama.cpp runs a
// list of regexes for each tokenizer.ggml.pre: every regex splits each piece the previous one
// produced, with both its matches and the unmatched stretches between them becoming pieces.
// Here each regex is a function that returns the length of its match at a position (0 when it
// does not match there); pre_split does the searching. A match function reproduces what the
// regex engine would do: alternatives tried in order, the first that matches wins, quantifiers
// greedy with backtracking. Where llama.cpp feeds std::regex a "collapsed" text (every non-ASCII
// character replaced by a byte standing for its category, non-ASCII White_Space by \v), \p{L}
// and friends therefore mean: the ASCII members of the category, or any non-ASCII character of
// it that is not White_Space; \s means White_Space.

enum {
    PC_L = 1 << 0,  // \p{L}
    PC_N = 1 << 1,  // \p{N}
    PC_P = 1 << 2,  // \p{P}
    PC_WS = 1 << 3, // \s (White_Space)
    PC_UP = 1 << 4, // A-Z
    PC_LO = 1 << 5, // a-z
};

// The text being split, one entry per character (an invalid byte counts as one character and
// is classified like U+FFFD, which llama.cpp would have put in its place).
typedef struct {
    uint32_t *off; // n + 1 byte offsets
    uint32_t *cp;
    uint8_t *cls;
    size_t n, cap;
} tok_units;

static uint8_t pre_class(uint32_t cp) {
    if (cp == UTF8_BAD) cp = 0xfffd;
    if (uni_is_space(cp)) return PC_WS;
    uni_gc gc = uni_category(cp);
    if (UNI_IS_L(gc)) return (uint8_t)(PC_L | (cp >= 'A' && cp <= 'Z' ? PC_UP : 0) | (cp >= 'a' && cp <= 'z' ? PC_LO : 0));
    if (UNI_IS_N(gc)) return PC_N;
    if (UNI_IS_P(gc)) return PC_P;
    return 0;
}

typedef size_t (*pre_fn)(const tok_units *u, size_t p, size_t end);

static inline uint8_t pre_cls(const tok_units *u, size_t i, size_t end) { return i < end ? u->cls[i] : 0; }
static inline uint32_t pre_cp(const tok_units *u, size_t i, size_t end) { return i < end ? u->cp[i] : UTF8_BAD; }
static inline uint32_t pre_lower(uint32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }
static inline bool pre_crlf(uint32_t c) { return c == '\r' || c == '\n'; }

// 's 't 're 've 'm 'll 'd at p (case-insensitive when ci): its length, else 0.
static size_t pre_contraction(const tok_units *u, size_t p, size_t end, bool ci) {
    if (pre_cp(u, p, end) != '\'' || p + 1 >= end) return 0;
    uint32_t c1 = u->cp[p + 1];
    if (ci) c1 = pre_lower(c1);
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
    if (p + 2 >= end) return 0;
    uint32_t c2 = u->cp[p + 2];
    if (ci) c2 = pre_lower(c2);
    if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
    return 0;
}

static size_t pre_run(const tok_units *u, size_t q, size_t end, uint8_t any_of) {
    while (q < end && (u->cls[q] & any_of)) q++;
    return q;
}

// [^\s\p{L}\p{N}]+ from q.
static size_t pre_run_other(const tok_units *u, size_t q, size_t end) {
    while (q < end && !(u->cls[q] & (PC_WS | PC_L | PC_N))) q++;
    return q;
}

// \s*[\r\n]+ (when nl) | \s+(?!\S) | \s+ at p: a whitespace run up to its last newline; else
// all of it but the last character when a non-space follows; else all of it.
static size_t pre_space(const tok_units *u, size_t p, size_t end, bool nl) {
    size_t q = p, last_nl = 0;
    while (q < end && (u->cls[q] & PC_WS)) {
        if (nl && pre_crlf(u->cp[q])) last_nl = q + 1;
        q++;
    }
    if (last_nl) return last_nl - p;
    size_t k = q - p;
    if (k > 1 && q < end) return k - 1;
    return k ? k : 1;
}

// GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
static size_t pre_gpt2(const tok_units *u, size_t p, size_t end) {
    size_t k = pre_contraction(u, p, end, false);
    if (k) return k;
    size_t q = p + (u->cp[p] == ' ');
    if (q < end) {
        uint8_t c = u->cls[q];
        if (c & PC_L) return pre_run(u, q, end, PC_L) - p;
        if (c & PC_N) return pre_run(u, q, end, PC_N) - p;
        if (!(c & PC_WS)) return pre_run_other(u, q, end) - p;
    }
    return pre_space(u, p, end, false);
}

// Llama 3 (max_digits 3) and Qwen2 (1):
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
// \s*[\r\n]+|\s+(?!\S)|\s+
static size_t pre_llama3_like(const tok_units *u, size_t p, size_t end, size_t max_digits) {
    size_t k = pre_contraction(u, p, end, true);
    if (k) return k;
    uint32_t c = u->cp[p];
    uint8_t cl = u->cls[p];
    if (!pre_crlf(c) && !(cl & PC_N) && ((cl & PC_L) || (pre_cls(u, p + 1, end) & PC_L)))
        return pre_run(u, p + 1, end, PC_L) - p; // optional non-letter prefix, then letters
    if (cl & PC_N) {
        size_t q = p;
        while (q < end && q - p < max_digits && (u->cls[q] & PC_N)) q++;
        return q - p;
    }
    size_t q = p + (c == ' ');
    if (q < end && !(u->cls[q] & (PC_WS | PC_L | PC_N))) {
        q = pre_run_other(u, q, end);
        while (q < end && pre_crlf(u->cp[q])) q++;
        return q - p;
    }
    return pre_space(u, p, end, true);
}

static size_t pre_llama3(const tok_units *u, size_t p, size_t end) { return pre_llama3_like(u, p, end, 3); }
static size_t pre_qwen2(const tok_units *u, size_t p, size_t end) { return pre_llama3_like(u, p, end, 1); }

// GPT-4o (Phi-4-mini, Llama 4), as llama.cpp rewrites the letter classes for std::regex:
// [^\r\n\p{L}\p{N}]?U*W+C?|[^\r\n\p{L}\p{N}]?U+W*C?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|
// \s*[\r\n]+|\s+(?!\S)|\s+
// where U is a letter other than a-z, W a letter other than A-Z (so a non-ASCII letter is
// both) and C the optional case-insensitive contraction. (tokenizer.json has
// [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]* and [\p{Ll}\p{Lm}\p{Lo}\p{M}]+; llama.cpp, and so the
// models' GGUF users, split with the rewrite.)
static inline bool pre_is_u(const tok_units *u, size_t i, size_t end) {
    return i < end && (u->cls[i] & (PC_L | PC_LO)) == PC_L;
}
static inline bool pre_is_w(const tok_units *u, size_t i, size_t end) {
    return i < end && (u->cls[i] & (PC_L | PC_UP)) == PC_L;
}

static size_t pre_gpt4o(const tok_units *u, size_t p, size_t end) {
    uint32_t c = u->cp[p];
    uint8_t cl = u->cls[p];
    // The optional prefix is taken when possible; if the rest then fails, trying without it
    // cannot succeed either, because then the first character is not a letter.
    size_t q = p + (!pre_crlf(c) && !(cl & (PC_L | PC_N)));
    // U*W+: U* greedy, then give back U's until a W can start.
    size_t r = q;
    while (pre_is_u(u, r, end)) r++;
    for (size_t j = r + 1; j-- > q;) {
        if (pre_is_w(u, j, end)) {
            size_t e = j;
            while (pre_is_w(u, e, end)) e++;
            return e + pre_contraction(u, e, end, true) - p;
        }
    }
    if (pre_is_u(u, q, end)) { // U+W*
        size_t e = r;
        while (pre_is_w(u, e, end)) e++;
        return e + pre_contraction(u, e, end, true) - p;
    }
    if (cl & PC_N) {
        size_t e = p;
        while (e < end && e - p < 3 && (u->cls[e] & PC_N)) e++;
        return e - p;
    }
    q = p + (c == ' ');
    if (q < end && !(u->cls[q] & (PC_WS | PC_L | PC_N))) {
        q = pre_run_other(u, q, end);
        while (q < end && (pre_crlf(u->cp[q]) || u->cp[q] == '/')) q++;
        return q - p;
    }
    return pre_space(u, p, end, true);
}

// \p{N}
static size_t pre_digit(const tok_units *u, size_t p, size_t end) {
    PSV_UNUSED(end);
    return (u->cls[p] & PC_N) ? 1 : 0;
}

// \p{N}+
static size_t pre_digits(const tok_units *u, size_t p, size_t end) { return pre_run(u, p, end, PC_N) - p; }

// [0-9][0-9][0-9]
static size_t pre_ascii3(const tok_units *u, size_t p, size_t end) {
    for (size_t i = 0; i < 3; i++)
        if (p + i >= end || u->cp[p + i] < '0' || u->cp[p + i] > '9') return 0;
    return 3;
}

// [\p{P}\$\+<=>\^~\|`]+ (falcon) and the same without the backtick (default).
static size_t pre_punct_run(const tok_units *u, size_t p, size_t end, const char *extra) {
    size_t q = p;
    while (q < end && ((u->cls[q] & PC_P) || (u->cp[q] < 128 && u->cp[q] && strchr(extra, (int)u->cp[q])))) q++;
    return q - p;
}
static size_t pre_punct_falcon(const tok_units *u, size_t p, size_t end) { return pre_punct_run(u, p, end, "$+<=>^~|`"); }
static size_t pre_punct_default(const tok_units *u, size_t p, size_t end) { return pre_punct_run(u, p, end, "$+<=>^~|"); }

// [\r\n]
static size_t pre_crlf1(const tok_units *u, size_t p, size_t end) {
    PSV_UNUSED(end);
    return pre_crlf(u->cp[p]) ? 1 : 0;
}

// Code point classes of the DeepSeek regexes, as inclusive ranges (std::wregex compares code
// points; non-ASCII White_Space was replaced by \v first, so it never matches them).
typedef struct {
    uint32_t lo, hi;
} tok_range;

// \s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+
static const tok_range tok_ds_letters[] = {
    {0x41, 0x5a}, {0x61, 0x7a}, {0xb5, 0xb5}, {0xc0, 0xd6}, {0xd8, 0xf6}, {0xf8, 0x1ba},
    {0x1bc, 0x1bf}, {0x1c4, 0x293}, {0x295, 0x2af}, {0x370, 0x373}, {0x376, 0x377},
    {0x37b, 0x37d}, {0x37f, 0x37f}, {0x386, 0x386}, {0x388, 0x38a}, {0x38c, 0x38c},
    {0x38e, 0x3a1}, {0x3a3, 0x3f5}, {0x3f7, 0x481}, {0x48a, 0x52f}, {0x531, 0x556},
    {0x10a0, 0x10c5}, {0x13a0, 0x13f5}, {0x13f8, 0x13fd}, {0x1c90, 0x1cba}, {0x1cbd, 0x1cbf},
    {0x1d00, 0x1d2b}, {0x1d6b, 0x1d77}, {0x1d79, 0x1d9a}, {0x1e00, 0x1f15}, {0x1f18, 0x1f1d},
    {0x1f20, 0x1f45}, {0x1f48, 0x1f4d}, {0x1f50, 0x1f57}, {0x1f59, 0x1f59}, {0x1f5b, 0x1f5b},
    {0x1f5d, 0x1f5d}, {0x1f5f, 0x1f7d}, {0x1f80, 0x1fb4}, {0x1fb6, 0x1fbc}, {0x1fbe, 0x1fbe},
    {0x1fc2, 0x1fc4}, {0x1fc6, 0x1fcc}, {0x1fd0, 0x1fd3}, {0x1fd6, 0x1fdb}, {0x1fe0, 0x1fec},
    {0x1ff2, 0x1ff4}, {0x1ff6, 0x1ffc}, {0x2102, 0x2102}, {0x2107, 0x2107}, {0x210a, 0x2113},
    {0x2115, 0x2115}, {0x2119, 0x211d}, {0x2124, 0x2124}, {0x2126, 0x2126}, {0x2128, 0x2128},
    {0x212a, 0x212d}, {0x212f, 0x2134}, {0x2139, 0x2139}, {0x213c, 0x213f}, {0x2145, 0x2149},
    {0x214e, 0x214e}, {0x2183, 0x2184}, {0x2c00, 0x2c7b}, {0x2c7e, 0x2ce4}, {0x2ceb, 0x2cee},
    {0x2cf2, 0x2cf3}, {0xa640, 0xa66d}, {0xa680, 0xa69b}, {0xa722, 0xa76f}, {0xa771, 0xa787},
    {0xa78b, 0xa78e}, {0xab70, 0xabbf}, {0xfb00, 0xfb06}, {0xfb13, 0xfb17}, {0xff21, 0xff3a},
    {0xff41, 0xff5a}, {0x10400, 0x1044f}, {0x104b0, 0x104d3}, {0x104d8, 0x104fb},
    {0x10c80, 0x10cb2}, {0x10cc0, 0x10cf2}, {0x118a0, 0x118df}, {0x1e900, 0x1e943},
};
// \s?[!-/:-~！-／：-～‘-‟　-。]+
static const tok_range tok_ds_punct[] = {
    {0x21, 0x2f}, {0x3a, 0x7e}, {0x2018, 0x201f}, {0x3000, 0x3002}, {0xff01, 0xff0f}, {0xff1a, 0xff5e},
};
// [一-龥ࠀ-一가-퟿]+
static const tok_range tok_ds_cjk[] = {{0x800, 0x4e00}, {0x4e00, 0x9fa5}, {0xac00, 0xd7ff}};

static bool pre_in(const tok_units *u, size_t i, size_t end, const tok_range *r, size_t n) {
    if (i >= end || (u->cp[i] >= 128 && (u->cls[i] & PC_WS))) return false;
    uint32_t c = u->cp[i];
    for (size_t k = 0; k < n; k++)
        if (c >= r[k].lo && c <= r[k].hi) return true;
    return false;
}

// Membership in a pre_ws_opt_run set: the code point ranges r[0..n), or when n is 0 the
// class bits `cls`.
static bool pre_member(const tok_units *u, size_t i, size_t end, const tok_range *r, size_t n, uint8_t cls) {
    return n ? pre_in(u, i, end, r, n) : i < end && (u->cls[i] & cls);
}

// \s?[set]+
static size_t pre_ws_opt_run(const tok_units *u, size_t p, size_t end, const tok_range *r, size_t n, uint8_t cls) {
    size_t q = p;
    if (pre_member(u, q, end, r, n, cls)) q++;
    else if ((u->cls[p] & PC_WS) && pre_member(u, p + 1, end, r, n, cls)) q += 2;
    else return 0;
    while (pre_member(u, q, end, r, n, cls)) q++;
    return q - p;
}

static size_t pre_ds_letters(const tok_units *u, size_t p, size_t end) {
    return pre_ws_opt_run(u, p, end, tok_ds_letters, PSV_ARRAY_LEN(tok_ds_letters), 0);
}
static size_t pre_ds_punct(const tok_units *u, size_t p, size_t end) {
    return pre_ws_opt_run(u, p, end, tok_ds_punct, PSV_ARRAY_LEN(tok_ds_punct), 0);
}
static size_t pre_ds_cjk(const tok_units *u, size_t p, size_t end) {
    size_t q = p;
    while (pre_in(u, q, end, tok_ds_cjk, PSV_ARRAY_LEN(tok_ds_cjk))) q++;
    return q - p;
}
// \s+$
static size_t pre_ws_at_end(const tok_units *u, size_t p, size_t end) {
    size_t q = pre_run(u, p, end, PC_WS);
    return q > p && q == end ? q - p : 0;
}
// \s?\p{L}+ and \s?\p{P}+
static size_t pre_ws_letters(const tok_units *u, size_t p, size_t end) { return pre_ws_opt_run(u, p, end, NULL, 0, PC_L); }
static size_t pre_ws_punct(const tok_units *u, size_t p, size_t end) { return pre_ws_opt_run(u, p, end, NULL, 0, PC_P); }

// The regex lists, in llama.cpp's order.
static const pre_fn pre_list_default[] = {pre_punct_default, pre_gpt2, pre_digits, pre_ascii3, NULL};
static const pre_fn pre_list_gpt2[] = {pre_gpt2, NULL};
static const pre_fn pre_list_llama3[] = {pre_llama3, NULL};
static const pre_fn pre_list_qwen2[] = {pre_qwen2, NULL};
static const pre_fn pre_list_gpt4o[] = {pre_gpt4o, NULL};
static const pre_fn pre_list_starcoder[] = {pre_digit, pre_gpt2, NULL};
static const pre_fn pre_list_falcon[] = {pre_punct_falcon, pre_gpt2, pre_ascii3, NULL};
static const pre_fn pre_list_deepseek_llm[] = {pre_crlf1, pre_ds_letters, pre_ds_punct, pre_ws_at_end, pre_ds_cjk, pre_digits, NULL};
static const pre_fn pre_list_deepseek_coder[] = {pre_crlf1, pre_ws_letters, pre_ws_punct, pre_ds_cjk, pre_digit, NULL};

static const pre_fn *pre_lists(tok_pre pre) {
    switch (pre) {
    case TOK_PRE_DEFAULT: return pre_list_default;
    case TOK_PRE_GPT2: return pre_list_gpt2;
    case TOK_PRE_LLAMA3: return pre_list_llama3;
    case TOK_PRE_QWEN2: return pre_list_qwen2;
    case TOK_PRE_GPT4O: return pre_list_gpt4o;
    case TOK_PRE_STARCODER: return pre_list_starcoder;
    case TOK_PRE_FALCON: return pre_list_falcon;
    case TOK_PRE_DEEPSEEK_LLM: return pre_list_deepseek_llm;
    case TOK_PRE_DEEPSEEK_CODER: return pre_list_deepseek_coder;
    case TOK_PRE_NONE: break;
    }
    return NULL;
}

// ---- Encoding ------------------------------------------------------------------------------

// Growable arrays for one tok_encode call.
typedef struct {
    int32_t *ids;
    size_t n_ids, cap_ids;
    tok_units u;
    uint32_t *bounds, *bounds2; // piece boundaries (unit indices), cap_units + 1 each
    // merge state: symbols and a binary min-heap of candidate pairs
    struct tok_sym {
        uint32_t start, len;
        int32_t prev, next, id;
    } *sym;
    size_t cap_sym;
    struct tok_pair {
        uint64_t key; // priority: lower first
        uint32_t left, right, llen, rlen;
        int32_t id;   // the merged token / string id
    } *heap;
    size_t n_heap, cap_heap;
    buf_t scratch;
    bool oom;
} tok_work;

static void tok_work_free(tok_work *w) {
    free(w->ids);
    free(w->u.off);
    free(w->u.cp);
    free(w->u.cls);
    free(w->bounds);
    free(w->bounds2);
    free(w->sym);
    free(w->heap);
    buf_free(&w->scratch);
}

static bool tok_grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

static void tok_emit(tok_work *w, int32_t id) {
    if (w->oom) return;
    if (w->n_ids == w->cap_ids && !tok_grow((void **)&w->ids, &w->cap_ids, w->n_ids + 1, sizeof *w->ids)) {
        w->oom = true;
        return;
    }
    w->ids[w->n_ids++] = id;
}

static bool tok_heap_push(tok_work *w, struct tok_pair e) {
    if (!tok_grow((void **)&w->heap, &w->cap_heap, w->n_heap + 1, sizeof *w->heap)) return w->oom = true, false;
    size_t i = w->n_heap++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (w->heap[parent].key <= e.key) break;
        w->heap[i] = w->heap[parent];
        i = parent;
    }
    w->heap[i] = e;
    return true;
}

static struct tok_pair tok_heap_pop(tok_work *w) {
    struct tok_pair top = w->heap[0], last = w->heap[--w->n_heap];
    size_t i = 0, n = w->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && w->heap[c + 1].key < w->heap[c].key) c++;
        if (w->heap[c].key >= last.key) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n) w->heap[i] = last;
    return top;
}

// SPM merge priority: higher score first, then the leftmost pair (llama.cpp's
// llm_bigram_spm::comparator). Floats are mapped to integers that sort the same way.
static uint64_t spm_key(float score, uint32_t left) {
    if (score == 0.0f) score = 0.0f; // -0 == +0
    uint32_t b = f32_bits(score);
    uint32_t ord = (b & 0x80000000u) ? ~b : (b | 0x80000000u); // ascending with the float
    if (psv_isnan(score)) ord = 0;                               // NaN: lowest priority
    return (uint64_t)(~ord) << 32 | left;
}

static void spm_try_pair(const tok_vocab *v, tok_work *w, const uint8_t *s, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const struct tok_sym *a = &w->sym[l], *b = &w->sym[r];
    uint32_t len = a->len + b->len;
    int32_t id = tok_find(v, (const char *)s + a->start, len);
    if (id < 0) return;
    tok_heap_push(w, (struct tok_pair){spm_key(v->score[id], (uint32_t)l), (uint32_t)l, (uint32_t)r, len, 0, id});
}

// SPM over one fragment (spaces already escaped): start from single characters and keep merging
// the adjacent pair whose merged text is the highest-scoring token; what is left over that is
// not a token becomes byte tokens. Same order and tie-breaks as llama.cpp's
// llm_tokenizer_spm_session, so the same tokens.
static void spm_encode(const tok_vocab *v, tok_work *w, const uint8_t *s, size_t n) {
    if (!n) return;
    if (!tok_grow((void **)&w->sym, &w->cap_sym, n, sizeof *w->sym)) {
        w->oom = true;
        return;
    }
    int32_t ns = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = utf8_decode(s + i, n - i, &cp);
        w->sym[ns] = (struct tok_sym){(uint32_t)i, (uint32_t)k, ns - 1, ns + 1, tok_find(v, (const char *)s + i, k)};
        ns++;
        i += k;
    }
    w->sym[ns - 1].next = -1;
    w->n_heap = 0;
    for (int32_t i = 1; i < ns; i++) spm_try_pair(v, w, s, i - 1, i);
    while (w->n_heap && !w->oom) {
        struct tok_pair e = tok_heap_pop(w);
        struct tok_sym *a = &w->sym[e.left], *b = &w->sym[e.right];
        if (a->len == 0 || b->len == 0 || a->len + b->len != e.llen) continue; // stale
        a->len += b->len;
        a->id = e.id;
        b->len = 0;
        a->next = b->next;
        if (b->next >= 0) w->sym[b->next].prev = (int32_t)e.left;
        spm_try_pair(v, w, s, a->prev, (int32_t)e.left);
        spm_try_pair(v, w, s, (int32_t)e.left, a->next);
    }
    for (int32_t i = 0; i != -1; i = w->sym[i].next) {
        const struct tok_sym *y = &w->sym[i];
        if (y->id >= 0) {
            tok_emit(w, y->id);
            continue;
        }
        for (uint32_t j = 0; j < y->len; j++) {
            int32_t b = v->spm_byte[s[y->start + j]];
            if (b < 0) b = v->unk;
            if (b >= 0) tok_emit(w, b);
        }
    }
}

// Byte-level BPE of one word: start from its bytes (as GPT-2 characters) and keep applying the
// lowest-ranked merge among adjacent pairs, leftmost first (llama.cpp's llm_bigram_bpe order).
static void bpe_try_pair(const tok_vocab *v, tok_work *w, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const struct tok_sym *a = &w->sym[l], *b = &w->sym[r];
    if (a->id < 0 || b->id < 0) return;
    uint64_t key = (uint64_t)(uint32_t)a->id << 32 | (uint32_t)b->id;
    size_t slot = tok_merge_slot(v, key);
    const tok_merge *e = &v->merge[slot];
    if (e->key != key) return;
    tok_heap_push(w, (struct tok_pair){(uint64_t)e->rank << 32 | (uint32_t)l, (uint32_t)l, (uint32_t)r, a->len,
                                       b->len, e->out});
}

static void bpe_word(const tok_vocab *v, tok_work *w, const uint8_t *s, size_t n) {
    if (!n) return;
    if (v->ignore_merges) { // a word that is a token is that token (llama.cpp: ignore_merges)
        buf_t *e = &w->scratch;
        e->len = 0;
        for (size_t i = 0; i < n; i++) {
            uint8_t enc[4];
            buf_append(e, enc, utf8_encode(bpe_byte_to_cp(s[i]), enc));
        }
        if (e->oom) {
            w->oom = true;
            return;
        }
        int32_t id = tok_find(v, e->data, e->len);
        if (id >= 0) {
            tok_emit(w, id);
            return;
        }
    }
    if (!tok_grow((void **)&w->sym, &w->cap_sym, n, sizeof *w->sym)) {
        w->oom = true;
        return;
    }
    for (size_t i = 0; i < n; i++)
        w->sym[i] = (struct tok_sym){(uint32_t)i, 1, (int32_t)i - 1, (int32_t)i + 1, v->byte_sym[s[i]]};
    w->sym[n - 1].next = -1;
    w->n_heap = 0;
    for (size_t i = 1; i < n; i++) bpe_try_pair(v, w, (int32_t)i - 1, (int32_t)i);
    while (w->n_heap && !w->oom) {
        struct tok_pair e = tok_heap_pop(w);
        struct tok_sym *a = &w->sym[e.left], *b = &w->sym[e.right];
        if (a->len != e.llen || b->len != e.rlen || a->next != (int32_t)e.right) continue; // stale
        a->len += b->len;
        a->id = e.id;
        b->len = 0;
        a->next = b->next;
        if (b->next >= 0) w->sym[b->next].prev = (int32_t)e.left;
        bpe_try_pair(v, w, a->prev, (int32_t)e.left);
        bpe_try_pair(v, w, (int32_t)e.left, a->next);
    }
    for (int32_t i = 0; i != -1; i = w->sym[i].next) {
        const struct tok_sym *y = &w->sym[i];
        if (y->id >= 0 && y->id < v->n_vocab) {
            tok_emit(w, y->id);
            continue;
        }
        // Not a token (a vocabulary without some byte character or merge result): like
        // llama.cpp, emit the tokens for single bytes of its spelling, where there are any.
        for (uint32_t j = 0; j < y->len; j++) {
            uint8_t enc[4];
            size_t k = utf8_encode(bpe_byte_to_cp(s[y->start + j]), enc);
            for (size_t t = 0; t < k; t++)
                if (v->byte_tok1[enc[t]] >= 0) tok_emit(w, v->byte_tok1[enc[t]]);
        }
    }
}

// Split [0, u->n) with each rule of `list` in turn; the result is in w->bounds (count in
// *n_bounds, first 0, last u->n).
static void pre_split_all(tok_work *w, const pre_fn *list, size_t *n_bounds) {
    const tok_units *u = &w->u;
    uint32_t *in = w->bounds, *out = w->bounds2;
    size_t n_in = 2;
    in[0] = 0;
    in[1] = (uint32_t)u->n;
    for (; *list; list++) {
        size_t n_out = 0;
        out[n_out++] = 0;
        for (size_t k = 0; k + 1 < n_in; k++) {
            size_t a = in[k], b = in[k + 1], p = a, gap = a;
            while (p < b) {
                size_t m = (*list)(u, p, b);
                PSV_ASSERT(m <= b - p);
                if (!m) {
                    p++;
                    continue;
                }
                if (p > gap) out[n_out++] = (uint32_t)p;
                p += m;
                out[n_out++] = (uint32_t)p;
                gap = p;
            }
            if (gap < b) out[n_out++] = (uint32_t)b;
        }
        uint32_t *t = in;
        in = out;
        out = t;
        n_in = n_out;
    }
    w->bounds = in;
    w->bounds2 = out;
    *n_bounds = n_in;
}

// Room for `need` characters in every per-character array (one shared capacity).
static bool tok_units_reserve(tok_work *w, size_t need) {
    if (need <= w->u.cap) return true;
    size_t c = w->u.cap ? w->u.cap : 64;
    while (c < need) c *= 2;
    void *a;
    if (!(a = realloc(w->u.off, c * sizeof *w->u.off))) return false;
    w->u.off = a;
    if (!(a = realloc(w->u.cp, c * sizeof *w->u.cp))) return false;
    w->u.cp = a;
    if (!(a = realloc(w->u.cls, c))) return false;
    w->u.cls = a;
    if (!(a = realloc(w->bounds, c * sizeof *w->bounds))) return false;
    w->bounds = a;
    if (!(a = realloc(w->bounds2, c * sizeof *w->bounds2))) return false;
    w->bounds2 = a;
    w->u.cap = c; // only now: a failure above leaves some arrays larger, never smaller
    return true;
}

// Split s[0..n) into pre-tokenizer words: afterwards w->u holds its characters and
// w->bounds[0..*n_bounds) the word boundaries as character indices (w->u.off[] maps them to
// bytes). False on out-of-memory.
static bool pre_tokenize(tok_work *w, tok_pre pre, const uint8_t *s, size_t n, size_t *n_bounds) {
    tok_units *u = &w->u;
    *n_bounds = 0;
    if (!tok_units_reserve(w, n + 2)) return false;
    u->n = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = utf8_decode(s + i, n - i, &cp);
        u->off[u->n] = (uint32_t)i;
        u->cp[u->n] = cp == UTF8_BAD ? 0xfffd : cp;
        u->cls[u->n] = pre_class(cp);
        u->n++;
        i += k;
    }
    u->off[u->n] = (uint32_t)n;
    const pre_fn *list = pre_lists(pre);
    PSV_ASSERT(list);
    pre_split_all(w, list, n_bounds);
    return true;
}

static void bpe_encode(const tok_vocab *v, tok_work *w, const uint8_t *s, size_t n) {
    size_t nb;
    if (!n) return;
    if (!pre_tokenize(w, v->pre, s, n, &nb)) {
        w->oom = true;
        return;
    }
    for (size_t k = 0; k + 1 < nb && !w->oom; k++) {
        uint32_t a = w->u.off[w->bounds[k]], b = w->u.off[w->bounds[k + 1]];
        bpe_word(v, w, s + a, b - a);
    }
}

// One piece of input for tok_encode_segments. User-defined tokens (token_type 4) are
// recognised in every segment, as llama.cpp and HF tokenizers do; control tokens only where
// parse_special is set, and only when they lie wholly inside such segments.
typedef struct {
    const char *text;
    size_t n;
    bool parse_special; // recognise control tokens inside this segment
} tok_segment;

// A special token found in the text.
typedef struct {
    uint32_t pos;
    int32_t id;
} tok_hit;

static int tok_hit_cmp(const void *a, const void *b) {
    uint32_t x = ((const tok_hit *)a)->pos, y = ((const tok_hit *)b)->pos;
    return (x > y) - (x < y);
}

// Mask values while splitting out special tokens.
enum { TM_FREE_SPECIAL = 0, TM_FREE = 1, TM_TOKEN = 2, TM_DELETED = 3 };

// Find the special tokens to split out, llama.cpp's way (tokenizer_st_partition): tokens in
// order, longest first; each takes its leftmost non-overlapping occurrences that lie wholly in
// text no earlier token took. Control and unknown tokens only count where parse_special is on;
// user-defined ones everywhere. The order matters only when occurrences overlap. mask[] holds
// TM_FREE_SPECIAL / TM_FREE per byte on entry (by segment) and the claims on return; hits come
// back sorted by position. any_parse: some segment allows control tokens (else they are not
// even looked for).
static psv_status tok_find_specials(const tok_vocab *v, const uint8_t *t, size_t n, uint8_t *mask,
                                    tok_hit **hits_out, size_t *n_hits_out, bool any_parse) {
    *hits_out = NULL;
    *n_hits_out = 0;
    if (!v->n_special || !n) return PSV_OK;
    int32_t *first = NULL, *last = NULL;
    tok_hit *hits = NULL;
    size_t n_hits = 0, cap_hits = 0;
    bool found = false;
    psv_status st = PSV_OK;
    // Pass 1 (trie): where each special token first and last occurs.
    for (size_t i = 0; i < n; i++) {
        if (!v->special_first[t[i]]) continue;
        int32_t node = 0;
        for (size_t j = i; j < n; j++) {
            int32_t c = v->trie[node].child;
            while (c >= 0 && v->trie[c].byte != t[j]) c = v->trie[c].sibling;
            if (c < 0) break;
            node = c;
            int32_t k = v->trie[node].special;
            if (k < 0) continue;
            if (!any_parse && (v->attr[v->special[k]] & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN))) continue;
            if (!found) {
                first = malloc((size_t)v->n_special * sizeof *first);
                last = malloc((size_t)v->n_special * sizeof *last);
                if (!first || !last) {
                    st = PSV_ERR_NOMEM;
                    goto done;
                }
                memset(first, 0xff, (size_t)v->n_special * sizeof *first);
                found = true;
            }
            if (first[k] < 0) first[k] = (int32_t)i;
            last[k] = (int32_t)i;
        }
    }
    if (!found) goto done;
    // Pass 2: claim occurrences in priority order.
    for (int32_t k = 0; k < v->n_special; k++) {
        if (first[k] < 0) continue;
        int32_t id = v->special[k];
        uint8_t a = v->attr[id];
        uint8_t allow = (a & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN)) ? TM_FREE_SPECIAL : TM_FREE;
        size_t len;
        const char *tx = tok_str(v, id, &len);
        size_t pos = (size_t)first[k], lim = (size_t)last[k];
        for (;;) {
            bool ok = true;
            for (size_t j = 0; j < len && ok; j++) ok = mask[pos + j] <= allow;
            size_t next = pos + 1;
            if (ok) {
                memset(mask + pos, TM_TOKEN, len);
                if (!tok_grow((void **)&hits, &cap_hits, n_hits + 1, sizeof *hits)) {
                    st = PSV_ERR_NOMEM;
                    goto done;
                }
                hits[n_hits++] = (tok_hit){(uint32_t)pos, id};
                if (a & TOK_ATTR_LSTRIP)
                    for (size_t j = pos; j > 0 && mask[j - 1] <= TM_FREE && isspace(t[j - 1]); j--) mask[j - 1] = TM_DELETED;
                next = pos + len;
                if (a & TOK_ATTR_RSTRIP)
                    for (; next < n && mask[next] <= TM_FREE && isspace(t[next]); next++) mask[next] = TM_DELETED;
            }
            if (next > lim || n - next < len) break;
            const uint8_t *m = memmem(t + next, lim + len - next, tx, len);
            if (!m) break;
            pos = (size_t)(m - t);
        }
    }
    if (n_hits) qsort(hits, n_hits, sizeof *hits, tok_hit_cmp);
    *hits_out = hits;
    *n_hits_out = n_hits;
    hits = NULL;
done:
    free(first);
    free(last);
    free(hits);
    return st;
}

// Encode a raw-text fragment (no special tokens in it).
static void tok_encode_fragment(const tok_vocab *v, tok_work *w, const uint8_t *s, size_t n, bool space_prefix) {
    if (v->kind == TOK_BPE) {
        bpe_encode(v, w, s, n);
        return;
    }
    // SPM: sentencepiece's normalizer prepends a space (when the model asks for it) and writes
    // every space as U+2581 before merging.
    buf_t *e = &w->scratch;
    e->len = 0;
    if (space_prefix) buf_append(e, "\xe2\x96\x81", 3);
    for (size_t i = 0; i < n;) {
        const uint8_t *sp = memchr(s + i, ' ', n - i);
        size_t k = sp ? (size_t)(sp - (s + i)) : n - i;
        buf_append(e, s + i, k);
        i += k;
        if (sp) {
            buf_append(e, "\xe2\x96\x81", 3);
            i++;
        }
    }
    if (e->oom || e->len > UINT32_MAX) {
        w->oom = true;
        return;
    }
    // Merges never cross the start of a ▁-run that follows other text when the vocabulary has
    // no token spanning one (spm_words), and merges on either side never interact: encoding
    // word by word then gives exactly the tokens of encoding the whole fragment at once, with
    // small merge queues instead of one as long as the text.
    const uint8_t *x = (const uint8_t *)e->data;
    size_t start = 0;
    if (v->spm_words) {
        for (size_t i = 3; i + 3 <= e->len; i++) {
            if (x[i] == 0xe2 && x[i + 1] == 0x96 && x[i + 2] == 0x81 &&
                !(x[i - 3] == 0xe2 && x[i - 2] == 0x96 && x[i - 1] == 0x81)) {
                spm_encode(v, w, x + start, i - start);
                start = i;
            }
        }
    }
    spm_encode(v, w, x + start, e->len - start);
}

// Tokenize the concatenation of segs[0..n_segs) as one text (so words and merges run across
// segment boundaries exactly as in the joined string). *ids is malloc'd, *ids = NULL and
// *n_ids = 0 on error (PSV_ERR_RANGE past PSV_TOK_MAX_TEXT bytes, PSV_ERR_NOMEM).
PSV_MAYBE_UNUSED static psv_status tok_encode_segments(const tok_vocab *v, const tok_segment *segs, size_t n_segs, bool add_special,
                                      int32_t **ids, size_t *n_ids, psv_error *err) {
    *ids = NULL;
    *n_ids = 0;
    psv_status st = PSV_ERR_NOMEM; // the only failure once the length is checked
    tok_work w;
    memset(&w, 0, sizeof w);
    uint8_t *joined = NULL, *mask = NULL;
    tok_hit *hits = NULL;
    size_t n = 0, n_hits = 0;
    bool any_parse = false;
    for (size_t i = 0; i < n_segs; i++) {
        if (!ck_add(n, segs[i].n, &n) || n > PSV_TOK_MAX_TEXT)
            return err_set(err, PSV_ERR_RANGE, "tok: text of more than %u bytes", (unsigned)PSV_TOK_MAX_TEXT);
        any_parse |= segs[i].parse_special && segs[i].n;
    }
    const uint8_t *t;
    if (n_segs == 1) {
        t = (const uint8_t *)segs[0].text;
    } else {
        joined = malloc(n ? n : 1);
        if (!joined) goto done;
        size_t k = 0;
        for (size_t i = 0; i < n_segs; i++) {
            if (segs[i].n) memcpy(joined + k, segs[i].text, segs[i].n);
            k += segs[i].n;
        }
        t = joined;
    }
    if (v->n_special && n) {
        mask = malloc(n);
        if (!mask) goto done;
        size_t k = 0;
        for (size_t i = 0; i < n_segs; i++) {
            memset(mask + k, segs[i].parse_special ? TM_FREE_SPECIAL : TM_FREE, segs[i].n);
            k += segs[i].n;
        }
        if (tok_find_specials(v, t, n, mask, &hits, &n_hits, any_parse) != PSV_OK) goto done;
    }

    if (add_special && v->add_bos) tok_emit(&w, v->bos);
    bool prev_special = true; // SPM: the first fragment gets the space prefix too
    size_t cur = 0;
    for (size_t h = 0; h <= n_hits && !w.oom; h++) {
        size_t stop = h < n_hits ? hits[h].pos : n, a = cur, b = stop;
        while (a < b && mask && mask[a] == TM_DELETED) a++;
        while (b > a && mask && mask[b - 1] == TM_DELETED) b--;
        if (a < b) {
            tok_encode_fragment(v, &w, t + a, b - a, v->add_space_prefix && prev_special);
            prev_special = false;
        }
        if (h < n_hits) {
            size_t len;
            tok_str(v, hits[h].id, &len);
            tok_emit(&w, hits[h].id);
            prev_special = true;
            cur = stop + len;
        }
    }
    if (add_special && v->add_eos) tok_emit(&w, v->eos);
    if (!w.oom) {
        *ids = w.ids;
        *n_ids = w.n_ids;
        w.ids = NULL;
        st = PSV_OK;
    }
done:
    if (st != PSV_OK) err_set(err, PSV_ERR_NOMEM, "tok: out of memory tokenizing %zu bytes", n);
    tok_work_free(&w);
    free(joined);
    free(mask);
    free(hits);
    return st;
}

// Tokenize text[0..n) (any bytes). add_special: BOS/EOS as the metadata asks (add_bos_token,
// add_eos_token); parse_special: control tokens written in the text become those tokens, else
// they are plain text. *ids is malloc'd; see tok_encode_segments for errors.
static psv_status tok_encode(const tok_vocab *v, const char *text, size_t n, bool add_special, bool parse_special,
                             int32_t **ids, size_t *n_ids, psv_error *err) {
    tok_segment seg = {text, n, parse_special};
    return tok_encode_segments(v, &seg, 1, add_special, ids, n_ids, err);
}

// ---- Decoding ------------------------------------------------------------------------------

enum {
    TOK_DETOK_SPECIAL = 1,     // render control and unknown tokens as their text (else nothing)
    TOK_DETOK_STRIP_SPACE = 2, // drop the space the SPM prefix rule put before the first token
};

// Append the bytes of ids to out. STRIP_SPACE removes one leading space from the first token's
// piece when the vocabulary adds a space prefix (llama.cpp's detokenize does the same), so that
// for SPM detokenize(tokenize(s)) == s. Ids out of range are an error.
static psv_status tok_detokenize(const tok_vocab *v, const int32_t *ids, size_t n, unsigned flags, buf_t *out,
                                 psv_error *err) {
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= v->n_vocab)
            return err_set(err, PSV_ERR_INVALID, "tok: token id %" PRId32 " out of range (expected 0..%" PRId32 ")",
                           ids[i], v->n_vocab - 1);
        if (!(flags & TOK_DETOK_SPECIAL) && tok_is_control(v, ids[i])) continue;
        size_t len;
        const char *p = tok_token_bytes(v, ids[i], &len);
        if (i == 0 && (flags & TOK_DETOK_STRIP_SPACE) && v->add_space_prefix && len && p[0] == ' ') p++, len--;
        buf_append(out, p, len);
    }
    if (out->oom) return err_set(err, PSV_ERR_NOMEM, "tok: out of memory detokenizing");
    return PSV_OK;
}

// Streaming detokenizer. Bytes go out unchanged and in order, but never part of a character:
// a UTF-8 sequence split across tokens is held (at most 3 bytes) until it completes. A byte that
// can no longer become part of a valid character goes out as soon as that is known, as is (the
// stream never alters data; a JSON writer turns such bytes into U+FFFD). So the concatenation
// of everything a stream emits, flush included, is exactly the concatenation of the pieces.
typedef struct {
    uint8_t pend[4];
    uint8_t n;
} tok_stream;

PSV_MAYBE_UNUSED static void tok_stream_init(tok_stream *s) { memset(s, 0, sizeof *s); }

static void tok_stream_put(tok_stream *s, const void *data, size_t n, buf_t *out) {
    const uint8_t *p = data;
    size_t i = 0;
    while (i < n) {
        if (s->n == 0) { // fast path: copy whole characters straight through
            size_t j = i;
            while (j < n) {
                uint32_t cp;
                if (p[j] < 0x80) {
                    j++;
                    continue;
                }
                size_t k = utf8_decode(p + j, n - j, &cp);
                if (cp == UTF8_BAD) break;
                j += k;
            }
            buf_append(out, p + i, j - i);
            i = j;
            if (i == n) break;
        }
        s->pend[s->n++] = p[i++];
        for (;;) {
            int c = utf8_check(s->pend, s->n);
            if (c == 0) break; // incomplete: wait for more
            if (c > 0) {
                buf_append(out, s->pend, s->n);
                s->n = 0;
                break;
            }
            buf_append(out, s->pend, 1); // invalid: the first byte goes out raw, retry the rest
            memmove(s->pend, s->pend + 1, --s->n);
            if (s->n == 0) break;
        }
    }
}

// Emit the bytes of one token (control tokens only when `special`).
PSV_MAYBE_UNUSED static void tok_stream_push(tok_stream *s, const tok_vocab *v, int32_t id, bool special, buf_t *out) {
    if (!special && tok_is_control(v, id)) return;
    size_t len;
    const char *p = tok_token_bytes(v, id, &len);
    tok_stream_put(s, p, len, out);
}

// End of stream: whatever is held is an incomplete sequence; it goes out raw.
PSV_MAYBE_UNUSED static void tok_stream_flush(tok_stream *s, buf_t *out) {
    buf_append(out, s->pend, s->n);
    s->n = 0;
}

// ---- CLI -----------------------------------------------------------------------------------

static psv_status tok_open_model(const char *path, tok_vocab **v, psv_error *err) {
    gguf_file *f = NULL;
    psv_status st = gguf_open(path, &f, err);
    if (st == PSV_OK) st = tok_load(f, v, err);
    gguf_close(f);
    return st;
}

static void tok_cli_usage(FILE *f, const char *cmd) {
    if (!strcmp(cmd, "tokenize"))
        fprintf(f, "usage: pensieve tokenize -m MODEL [--add-special] [--parse-special] (TEXT | -f FILE)\n"
                   "  Prints the token ids of TEXT (or of FILE's contents, '-' for stdin) on one line.\n"
                   "  --add-special    add BOS/EOS as the model's metadata asks\n"
                   "  --parse-special  recognise control tokens such as <|im_start|> in the text\n");
    else
        fprintf(f, "usage: pensieve detokenize -m MODEL IDS\n"
                   "  Writes the bytes of the comma-separated token ids (control tokens as their text).\n");
}

static int cli_tokenize(int argc, char **argv) {
    const char *model = NULL, *text = NULL, *file = NULL;
    bool add_special = false, parse_special = false;
    int rc = 1;
    char *data = NULL;
    size_t n = 0;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    tok_vocab *v = NULL;
    psv_error err = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            tok_cli_usage(stdout, "tokenize");
            return 0;
        } else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && i + 1 < argc) {
            model = argv[++i];
        } else if (!strcmp(a, "-f") && i + 1 < argc) {
            file = argv[++i];
        } else if (!strcmp(a, "--add-special")) {
            add_special = true;
        } else if (!strcmp(a, "--parse-special")) {
            parse_special = true;
        } else if (!strcmp(a, "--") && i + 1 < argc && !text) {
            text = argv[++i];
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "pensieve tokenize: unknown or incomplete option '%s'\n", a);
            tok_cli_usage(stderr, "tokenize");
            return 2;
        } else if (!text) {
            text = a;
        } else {
            fprintf(stderr, "pensieve tokenize: more than one TEXT argument\n");
            return 2;
        }
    }
    if (!model || (!text) == (!file)) {
        fprintf(stderr, "pensieve tokenize: need -m MODEL and exactly one of TEXT or -f FILE\n");
        tok_cli_usage(stderr, "tokenize");
        return 2;
    }
    if (file) {
        if (plat_read_file(file, &data, &n, &err) != PSV_OK) goto done;
        text = data;
    } else {
        n = strlen(text);
    }
    if (tok_open_model(model, &v, &err) != PSV_OK) goto done;
    if (tok_encode(v, text, n, add_special, parse_special, &ids, &n_ids, &err) != PSV_OK) goto done;
    for (size_t i = 0; i < n_ids; i++) printf(i ? " %" PRId32 : "%" PRId32, ids[i]);
    printf("\n");
    rc = fflush(stdout) == 0 ? 0 : 1;
done:
    if (err.status != PSV_OK) fprintf(stderr, "pensieve tokenize: %s\n", err.message);
    free(ids);
    tok_free(v);
    free(data);
    return rc;
}

// "1,2,3" (spaces allowed around the numbers) -> malloc'd ids.
static bool tok_cli_parse_ids(const char *s, int32_t **out, size_t *n_out) {
    size_t cap = 0, n = 0;
    int32_t *ids = NULL;
    *out = NULL;
    *n_out = 0;
    const char *p = s;
    while (*p == ' ') p++;
    if (!*p) return true;
    for (;;) {
        while (*p == ' ') p++;
        if (!isdigit((unsigned char)*p)) goto bad;
        long long x = 0;
        while (isdigit((unsigned char)*p)) {
            x = x * 10 + (*p++ - '0');
            if (x > INT32_MAX) goto bad;
        }
        if (!tok_grow((void **)&ids, &cap, n + 1, sizeof *ids)) goto bad;
        ids[n++] = (int32_t)x;
        while (*p == ' ') p++;
        if (!*p) break;
        if (*p++ != ',') goto bad;
    }
    *out = ids;
    *n_out = n;
    return true;
bad:
    free(ids);
    return false;
}

static int cli_detokenize(int argc, char **argv) {
    const char *model = NULL, *list = NULL;
    int rc = 1;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    tok_vocab *v = NULL;
    buf_t out = {0};
    psv_error err = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            tok_cli_usage(stdout, "detokenize");
            return 0;
        } else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && i + 1 < argc) {
            model = argv[++i];
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "pensieve detokenize: unknown or incomplete option '%s'\n", a);
            tok_cli_usage(stderr, "detokenize");
            return 2;
        } else if (!list) {
            list = a;
        } else {
            fprintf(stderr, "pensieve detokenize: more than one IDS argument\n");
            return 2;
        }
    }
    if (!model || !list) {
        fprintf(stderr, "pensieve detokenize: need -m MODEL and IDS\n");
        tok_cli_usage(stderr, "detokenize");
        return 2;
    }
    if (!tok_cli_parse_ids(list, &ids, &n_ids)) {
        fprintf(stderr, "pensieve detokenize: IDS: expected comma-separated token ids, got '%s'\n", list);
        return 2;
    }
    if (tok_open_model(model, &v, &err) != PSV_OK) goto done;
    if (tok_detokenize(v, ids, n_ids, TOK_DETOK_SPECIAL | TOK_DETOK_STRIP_SPACE, &out, &err) != PSV_OK) goto done;
    if (out.len && fwrite(out.data, 1, out.len, stdout) != out.len) goto done;
    rc = fflush(stdout) == 0 ? 0 : 1;
done:
    if (err.status != PSV_OK) fprintf(stderr, "pensieve detokenize: %s\n", err.message);
    buf_free(&out);
    free(ids);
    tok_free(v);
    return rc;
}


// ----------------------------------------------------------------------------
// 10. Chat templates
// Lays out a conversation in a model's chat format with built-in C code, one layout per format.
// There is no Jinja engine: the format is recognised from `tokenizer.chat_template` by
// distinctive substrings, and an unrecognised template falls back to chatml with a warning
// returned to the caller.
//
// The layouts are those of the established GGUF runtime (and of ../shared/conformance/chat), so
// a prompt tokenizes to the same ids: they follow each model's template, except that formats
// whose template rejects a system message fold it into the first user turn instead of failing.
// Where a layout differs from the model's own Jinja on purpose, the format's comment says so.
//
// Decisions worth knowing:
// - Qwen2.5 is plain chatml: its template's default system prompt ("You are Qwen, created by
//   Alibaba Cloud...") is not injected; the caller chooses the system prompt.
// - Qwen3 has its own format (`qwen3`): chatml plus the template's thinking rules, with
//   enable_thinking left at its default (on): an assistant turn before the last user query loses
//   its <think>...</think> block, and the final assistant turn after it (or one that carries
//   reasoning) is written as "<think>\nREASONING\n</think>\n\nANSWER".
// - Llama 3.x is `llama3`: the messages as given, without the 3.1+ template's automatic
//   "Cutting Knowledge Date / Today Date" system header (it depends on the calendar).
// - Phi-4-mini (`phi4-mini`) has no newline after the role tag, unlike Phi-3 (`phi3`); Phi-4 (14B,
//   <|im_sep|>) is `phi4`.
// - add_generation_prompt = false omits the assistant cue where the format has one. llama2,
//   mistral-*, orion and minicpm have none to omit: their user turn itself ends with the cue
//   ("[/INST]", "Assistant: </s>", "<AI>"), exactly as in their templates. No format appends the
//   EOS text when the generation prompt is off (some templates do; the caller owns EOS).
//
// Roles: system, user and assistant everywhere. Formats that write the role name into the
// prompt (chatml, phi3, llama3, ...) pass any other role through verbatim; qwen3 and exaone4 also
// know `tool`; the other formats reject roles they cannot express (PSV_ERR_INVALID).
//
// Special tokens: every byte that comes from a message (content, and role names that are not
// system/user/assistant) can be reported as a span, so the tokenizer can recognise control
// tokens such as <|im_start|> in the template text and never inside user-supplied content.
// chat_tokenize does all of it (layout, spans, BOS rule, tokenization) for the engine.
//
// BOS rule (never doubled): the tokenizer adds BOS when the vocabulary asks for it
// (tokenizer.ggml.add_bos_token). Templates that open with {{ bos_token }} (Llama 3, Gemma,
// Mistral, ...) are laid out without it. No layout starts with BOS text except gigachat ("<s>");
// monarch and llama2-sys-bos write "<s>" between turns, which is meant. Before tokenizing with
// BOS added, drop chat_bos_prefix(...) bytes from the front of the prompt: it is the length of
// the vocabulary's BOS text when the prompt starts with it as template text (never when those
// bytes are message content), else 0.

typedef enum {
    CHAT_CHATML,
    CHAT_QWEN3,
    CHAT_LLAMA2,
    CHAT_LLAMA2_SYS,
    CHAT_LLAMA2_SYS_BOS,
    CHAT_LLAMA2_SYS_STRIP,
    CHAT_MISTRAL_V1,
    CHAT_MISTRAL_V3,
    CHAT_MISTRAL_V3_TEKKEN,
    CHAT_MISTRAL_V7,
    CHAT_MISTRAL_V7_TEKKEN,
    CHAT_PHI3,
    CHAT_PHI4,
    CHAT_PHI4_MINI,
    CHAT_FALCON3,
    CHAT_ZEPHYR,
    CHAT_MONARCH,
    CHAT_GEMMA,
    CHAT_ORION,
    CHAT_OPENCHAT,
    CHAT_VICUNA,
    CHAT_VICUNA_ORCA,
    CHAT_DEEPSEEK,
    CHAT_DEEPSEEK2,
    CHAT_DEEPSEEK3,
    CHAT_COMMAND_R,
    CHAT_LLAMA3,
    CHAT_LLAMA4,
    CHAT_CHATGLM3,
    CHAT_CHATGLM4,
    CHAT_GLMEDGE,
    CHAT_MINICPM,
    CHAT_EXAONE3,
    CHAT_EXAONE4,
    CHAT_GRANITE,
    CHAT_GIGACHAT,
    CHAT_MEGREZ,
    CHAT_FORMAT_COUNT
} chat_format;

// One message. Both fields are slices (content may hold any bytes, including NUL); build one
// from C strings with chat_msg_c. The formatter only reads them during chat_apply.
typedef struct {
    str_t role;
    str_t content;
} chat_msg;

static inline chat_msg chat_msg_c(const char *role, const char *content) {
    return (chat_msg){str_c(role), str_c(content)};
}

// A byte range of the formatted prompt that came from a message, not from the template.
typedef struct {
    size_t off, n;
} chat_span;

// The spans of a prompt, in order, non-overlapping, adjacent ones merged. Zero-initialise; the
// caller owns it and frees it with chat_spans_free.
typedef struct {
    chat_span *v;
    size_t n, cap;
    bool oom; // an append failed (chat_apply then reports PSV_ERR_NOMEM)
} chat_spans;

static void chat_spans_free(chat_spans *s) {
    if (!s) return;
    free(s->v);
    memset(s, 0, sizeof *s);
}

enum { CHAT_R_SYSTEM = 1, CHAT_R_USER = 2, CHAT_R_ASSISTANT = 4, CHAT_R_TOOL = 8, CHAT_R_OTHER = 16 };
#define CHAT_ROLES_SUA (CHAT_R_SYSTEM | CHAT_R_USER | CHAT_R_ASSISTANT)
#define CHAT_ROLES_ANY (CHAT_ROLES_SUA | CHAT_R_TOOL | CHAT_R_OTHER)

typedef struct {
    const char *name; // the built-in name, as accepted by chat_format_by_name
    uint8_t roles;    // CHAT_R_* this format can express
} chat_format_info;

static const chat_format_info chat_formats[CHAT_FORMAT_COUNT] = {
    [CHAT_CHATML] = {"chatml", CHAT_ROLES_ANY},
    [CHAT_QWEN3] = {"qwen3", CHAT_ROLES_SUA | CHAT_R_TOOL},
    [CHAT_LLAMA2] = {"llama2", CHAT_ROLES_SUA},
    [CHAT_LLAMA2_SYS] = {"llama2-sys", CHAT_ROLES_SUA},
    [CHAT_LLAMA2_SYS_BOS] = {"llama2-sys-bos", CHAT_ROLES_SUA},
    [CHAT_LLAMA2_SYS_STRIP] = {"llama2-sys-strip", CHAT_ROLES_SUA},
    [CHAT_MISTRAL_V1] = {"mistral-v1", CHAT_ROLES_SUA},
    [CHAT_MISTRAL_V3] = {"mistral-v3", CHAT_ROLES_SUA},
    [CHAT_MISTRAL_V3_TEKKEN] = {"mistral-v3-tekken", CHAT_ROLES_SUA},
    [CHAT_MISTRAL_V7] = {"mistral-v7", CHAT_ROLES_SUA},
    [CHAT_MISTRAL_V7_TEKKEN] = {"mistral-v7-tekken", CHAT_ROLES_SUA},
    [CHAT_PHI3] = {"phi3", CHAT_ROLES_ANY},
    [CHAT_PHI4] = {"phi4", CHAT_ROLES_ANY},
    [CHAT_PHI4_MINI] = {"phi4-mini", CHAT_ROLES_ANY},
    [CHAT_FALCON3] = {"falcon3", CHAT_ROLES_ANY},
    [CHAT_ZEPHYR] = {"zephyr", CHAT_ROLES_ANY},
    [CHAT_MONARCH] = {"monarch", CHAT_ROLES_ANY},
    [CHAT_GEMMA] = {"gemma", CHAT_ROLES_SUA},
    [CHAT_ORION] = {"orion", CHAT_ROLES_SUA},
    [CHAT_OPENCHAT] = {"openchat", CHAT_ROLES_SUA},
    [CHAT_VICUNA] = {"vicuna", CHAT_ROLES_SUA},
    [CHAT_VICUNA_ORCA] = {"vicuna-orca", CHAT_ROLES_SUA},
    [CHAT_DEEPSEEK] = {"deepseek", CHAT_ROLES_SUA},
    [CHAT_DEEPSEEK2] = {"deepseek2", CHAT_ROLES_SUA},
    [CHAT_DEEPSEEK3] = {"deepseek3", CHAT_ROLES_SUA},
    [CHAT_COMMAND_R] = {"command-r", CHAT_ROLES_SUA},
    [CHAT_LLAMA3] = {"llama3", CHAT_ROLES_ANY},
    [CHAT_LLAMA4] = {"llama4", CHAT_ROLES_ANY},
    [CHAT_CHATGLM3] = {"chatglm3", CHAT_ROLES_ANY},
    [CHAT_CHATGLM4] = {"chatglm4", CHAT_ROLES_ANY},
    [CHAT_GLMEDGE] = {"glmedge", CHAT_ROLES_ANY},
    [CHAT_MINICPM] = {"minicpm", CHAT_ROLES_SUA},
    [CHAT_EXAONE3] = {"exaone3", CHAT_ROLES_SUA},
    [CHAT_EXAONE4] = {"exaone4", CHAT_ROLES_SUA | CHAT_R_TOOL},
    [CHAT_GRANITE] = {"granite", CHAT_ROLES_ANY},
    [CHAT_GIGACHAT] = {"gigachat", CHAT_ROLES_SUA},
    [CHAT_MEGREZ] = {"megrez", CHAT_ROLES_ANY},
};

static const char *chat_format_name(chat_format f) {
    return (unsigned)f < CHAT_FORMAT_COUNT ? chat_formats[f].name : "unknown";
}

static bool chat_format_by_name_n(const char *name, size_t n, chat_format *out) {
    for (int f = 0; f < CHAT_FORMAT_COUNT; f++) {
        const char *s = chat_formats[f].name;
        if (strlen(s) == n && memcmp(s, name, n) == 0) {
            *out = (chat_format)f;
            return true;
        }
    }
    return false;
}

static bool chat_format_by_name(const char *name, chat_format *out) {
    return name && chat_format_by_name_n(name, strlen(name), out);
}

// Appends every built-in name, separated by ", " (for error messages and --help).
static void chat_format_names(buf_t *b) {
    for (int f = 0; f < CHAT_FORMAT_COUNT; f++) {
        if (f) buf_puts(b, ", ");
        buf_puts(b, chat_formats[f].name);
    }
}

// ---- Detection ----

// DeepSeek's and MiniCPM's markers, as UTF-8 bytes: ｜ is U+FF5C, ▁ is U+2581, 用户 "user".
#define CHAT_DS_USER "<\357\275\234User\357\275\234>"           // <｜User｜>
#define CHAT_DS_ASSISTANT "<\357\275\234Assistant\357\275\234>" // <｜Assistant｜>
#define CHAT_MINICPM_USER "<\347\224\250\346\210\267>"         // <用户>
// <｜end▁of▁sentence｜>
#define CHAT_DS_EOS "<\357\275\234end\342\226\201of\342\226\201sentence\357\275\234>"


// First occurrence of needle in the slice, or NULL. memchr skips to candidates, so the cost is
// O(len(h) * len(needle)) at worst, with needles of at most ~90 bytes.
static const char *chat_find(str_t h, const char *needle) {
    size_t nn = strlen(needle);
    if (nn == 0) return h.p;
    if (!h.p || nn > h.n) return NULL;
    const char *p = h.p, *last = h.p + (h.n - nn);
    while (p <= last) {
        p = memchr(p, needle[0], (size_t)(last - p) + 1);
        if (!p) return NULL;
        if (memcmp(p, needle, nn) == 0) return p;
        p++;
    }
    return NULL;
}

static inline bool chat_has(str_t h, const char *needle) { return chat_find(h, needle) != NULL; }

// Phi-3 and Phi-4-mini share <|user|>/<|assistant|>/<|end|>; Phi-3 puts a newline after the role
// tag, Phi-4-mini does not. True when some "|>" in the source is followed, after closing quotes,
// '+' and spaces, by a newline: a real one or the two-character escape "\n" (both appear in
// real templates: '<|user|>' + '\n', '<|user|>\n', '<|' + message['role'] + '|>' + '\n').
static bool chat_newline_after_tag(str_t t) {
    str_t rest = t;
    const char *p;
    while ((p = chat_find(rest, "|>")) != NULL) {
        const char *q = p + 2, *end = rest.p + rest.n;
        while (q < end && (*q == '\'' || *q == '"' || *q == '+' || *q == ' ')) q++;
        if (q < end && *q == '\n') return true;
        if (end - q >= 2 && q[0] == '\\' && q[1] == 'n') return true;
        rest.n -= (size_t)(p + 2 - rest.p);
        rest.p = p + 2;
    }
    return false;
}

// Recognises the format of a Jinja chat template (or a built-in name) by its content. Always
// returns a usable format: when nothing matches, chatml, with *recognised = false and *warning
// set to a static message naming the fallback (both outputs optional). The checks run in order;
// earlier markers are the more specific ones (e.g. <|im_sep|> before plain <|im_start|>).
static chat_format chat_detect(const char *src, size_t n, bool *recognised, const char **warning) {
    str_t t = {src, src ? n : 0};
    chat_format f = CHAT_CHATML;
    const char *warn = NULL;
    if (t.n == 0) {
        warn = "chat: no chat template (tokenizer.chat_template absent or empty); falling back to chatml";
    } else if (chat_format_by_name_n(t.p, t.n, &f)) {
        // a built-in name
    } else if (chat_has(t, "<|im_start|>")) {
        if (chat_has(t, "<|im_sep|>")) f = CHAT_PHI4; // Phi-4 (14B)
        else if (chat_has(t, "</think>") && chat_has(t, "last_query_index")) f = CHAT_QWEN3;
        else f = CHAT_CHATML; // Qwen2/2.5, Hermes, SmolLM, ...
    } else if ((t.n >= 7 && memcmp(t.p, "mistral", 7) == 0) || chat_has(t, "[INST]")) {
        // Mistral's official templates, after mistralai/cookbook concept-deep-dive/tokenization:
        // v7 has [SYSTEM_PROMPT] (tekken: no space after the tags); v1 writes ' [INST] ' +
        // system_message; v3 and v3-tekken mention [AVAILABLE_TOOLS], tekken quotes "[INST]"
        // with nothing after it. Everything else with [INST] is Llama 2 style.
        if (chat_has(t, "[SYSTEM_PROMPT]")) {
            f = chat_has(t, "[INST] ") || chat_has(t, "[SYSTEM_PROMPT] ") ? CHAT_MISTRAL_V7
                                                                          : CHAT_MISTRAL_V7_TEKKEN;
        } else if (chat_has(t, "' [INST] ' + system_message") || chat_has(t, "[AVAILABLE_TOOLS]")) {
            if (chat_has(t, " [INST]")) f = CHAT_MISTRAL_V1;
            else if (chat_has(t, "\"[INST]\"")) f = CHAT_MISTRAL_V3_TEKKEN;
            else f = CHAT_MISTRAL_V3;
        } else if (chat_has(t, "content.strip()")) {
            f = CHAT_LLAMA2_SYS_STRIP;
        } else if (chat_has(t, "bos_token + '[INST]")) {
            f = CHAT_LLAMA2_SYS_BOS;
        } else if (chat_has(t, "<<SYS>>")) {
            f = CHAT_LLAMA2_SYS;
        } else {
            f = CHAT_LLAMA2; // Llama 2 without <<SYS>>, Mistral 7B v0.1/v0.2
        }
    } else if (chat_has(t, "<|assistant|>") && chat_has(t, "<|end|>")) {
        f = chat_newline_after_tag(t) ? CHAT_PHI3 : CHAT_PHI4_MINI; // Phi-3/3.5 vs Phi-4-mini
    } else if (chat_has(t, "[gMASK]<sop>")) {
        f = CHAT_CHATGLM4;
    } else if (chat_has(t, "<|assistant|>") && chat_has(t, "<|user|>")) {
        f = chat_has(t, "</s>") ? CHAT_FALCON3 : CHAT_GLMEDGE;
    } else if (chat_has(t, "<|{{ item['role'] }}|>") && chat_has(t, "<|begin_of_image|>")) {
        f = CHAT_GLMEDGE;
    } else if (chat_has(t, "<|user|>") && chat_has(t, "<|endoftext|>")) {
        f = CHAT_ZEPHYR;
    } else if (chat_has(t, "bos_token + message['role']")) {
        f = CHAT_MONARCH; // mlabonne/AlphaMonarch-7B
    } else if (chat_has(t, "<start_of_turn>")) {
        f = CHAT_GEMMA; // Gemma 1, 2 and 3
    } else if (chat_has(t, "'\\n\\nAssistant: ' + eos_token")) {
        f = CHAT_ORION; // OrionStarAI/Orion-14B-Chat
    } else if (chat_has(t, "GPT4 Correct ")) {
        f = CHAT_OPENCHAT;
    } else if (chat_has(t, "USER: ") && chat_has(t, "ASSISTANT: ")) {
        f = chat_has(t, "SYSTEM: ") ? CHAT_VICUNA_ORCA : CHAT_VICUNA;
    } else if (chat_has(t, "### Instruction:") && chat_has(t, "<|EOT|>")) {
        f = CHAT_DEEPSEEK; // deepseek-coder-instruct
    } else if (chat_has(t, "<|START_OF_TURN_TOKEN|>") && chat_has(t, "<|USER_TOKEN|>")) {
        f = CHAT_COMMAND_R;
    } else if (chat_has(t, "<|start_header_id|>") && chat_has(t, "<|end_header_id|>")) {
        f = CHAT_LLAMA3; // Llama 3, 3.1, 3.2, 3.3
    } else if (chat_has(t, "[gMASK]sop")) {
        f = CHAT_CHATGLM3;
    } else if (chat_has(t, CHAT_MINICPM_USER)) {
        f = CHAT_MINICPM;
    } else if (chat_has(t, "'Assistant: ' + message['content'] + eos_token")) {
        f = CHAT_DEEPSEEK2;
    } else if (chat_has(t, CHAT_DS_ASSISTANT) && chat_has(t, CHAT_DS_USER) && chat_has(t, CHAT_DS_EOS)) {
        f = CHAT_DEEPSEEK3; // DeepSeek V3, R1 and its distills
    } else if (chat_has(t, "[|system|]") && chat_has(t, "[|assistant|]") && chat_has(t, "[|endofturn|]")) {
        f = chat_has(t, "[|tool|]") ? CHAT_EXAONE4 : CHAT_EXAONE3;
    } else if (chat_has(t, "<|start_of_role|>")) {
        f = CHAT_GRANITE;
    } else if (chat_has(t, "message['role'] + additional_special_tokens[0] + message['content'] + "
                           "additional_special_tokens[1]")) {
        f = CHAT_GIGACHAT;
    } else if (chat_has(t, "<|role_start|>")) {
        f = CHAT_MEGREZ;
    } else if (chat_has(t, "<|header_start|>") && chat_has(t, "<|header_end|>")) {
        f = CHAT_LLAMA4;
    } else {
        warn = "chat: chat template not recognised; falling back to chatml";
    }
    if (recognised) *recognised = warn == NULL;
    if (warning) *warning = warn;
    return f;
}

// ---- Layout ----

static const str_t chat_empty = {"", 0};

static inline bool chat_is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

// ASCII whitespace trim on both ends, as the formats that strip content do.
static str_t chat_trim(str_t s) {
    while (s.n && chat_is_space(s.p[0])) s.p++, s.n--;
    while (s.n && chat_is_space(s.p[s.n - 1])) s.n--;
    return s;
}
static str_t chat_lstrip_nl(str_t s) {
    while (s.n && s.p[0] == '\n') s.p++, s.n--;
    return s;
}
static str_t chat_rstrip_nl(str_t s) {
    while (s.n && s.p[s.n - 1] == '\n') s.n--;
    return s;
}

// Last occurrence of needle in s, or NULL.
static const char *chat_find_last(str_t s, const char *needle) {
    const char *p, *hit = NULL;
    while ((p = chat_find(s, needle)) != NULL) {
        hit = p;
        s.n -= (size_t)(p + 1 - s.p);
        s.p = p + 1;
    }
    return hit;
}

static int chat_role_of(str_t r) {
    if (str_eq_c(r, "system")) return CHAT_R_SYSTEM;
    if (str_eq_c(r, "user")) return CHAT_R_USER;
    if (str_eq_c(r, "assistant")) return CHAT_R_ASSISTANT;
    if (str_eq_c(r, "tool")) return CHAT_R_TOOL;
    return CHAT_R_OTHER;
}

typedef struct {
    buf_t *out;
    chat_spans *spans; // optional
} chat_w;

static void chat_lit(chat_w *w, const char *s) { buf_puts(w->out, s); }

// Message bytes: appended and, when spans are wanted, recorded (adjacent ranges merge).
static void chat_text(chat_w *w, str_t s) {
    if (s.n == 0) return;
    size_t off = w->out->len;
    buf_append(w->out, s.p, s.n);
    chat_spans *sp = w->spans;
    if (!sp || w->out->oom || sp->oom) return;
    if (sp->n && sp->v[sp->n - 1].off + sp->v[sp->n - 1].n == off) {
        sp->v[sp->n - 1].n += s.n;
        return;
    }
    if (sp->n == sp->cap) {
        size_t cap = sp->cap ? sp->cap * 2 : 16;
        chat_span *v = cap < (SIZE_MAX / sizeof *v) ? realloc(sp->v, cap * sizeof *v) : NULL;
        if (!v) {
            sp->oom = true;
            return;
        }
        sp->v = v;
        sp->cap = cap;
    }
    sp->v[sp->n++] = (chat_span){off, s.n};
}

// A role name: the three standard ones are template text; any other comes from the caller and
// is written as message bytes.
static void chat_role(chat_w *w, str_t role) {
    if (chat_role_of(role) & CHAT_ROLES_SUA) buf_append(w->out, role.p, role.n);
    else chat_text(w, role);
}

// role + content in the "<|im_start|>ROLE\nCONTENT<|im_end|>\n" family: pre, role, mid,
// content, post.
static void chat_turn(chat_w *w, const char *pre, str_t role, const char *mid, str_t content,
                      const char *post) {
    chat_lit(w, pre);
    chat_role(w, role);
    chat_lit(w, mid);
    chat_text(w, content);
    chat_lit(w, post);
}

static void chat_fmt_llama2(chat_w *w, chat_format f, const chat_msg *m, size_t n) {
    bool sys_tags = f != CHAT_LLAMA2, bos_inside = f == CHAT_LLAMA2_SYS_BOS,
         strip = f == CHAT_LLAMA2_SYS_STRIP;
    bool inside = true; // the first [INST] is written up front; BOS is the tokenizer's
    chat_lit(w, "[INST] ");
    for (size_t i = 0; i < n; i++) {
        str_t c = strip ? chat_trim(m[i].content) : m[i].content;
        int r = chat_role_of(m[i].role);
        if (!inside) {
            inside = true;
            chat_lit(w, bos_inside ? "<s>[INST] " : "[INST] ");
        }
        if (r == CHAT_R_SYSTEM) {
            if (sys_tags) {
                chat_lit(w, "<<SYS>>\n");
                chat_text(w, c);
                chat_lit(w, "\n<</SYS>>\n\n");
            } else {
                chat_text(w, c); // Llama 2 has no system turn: it leads the first instruction
                chat_lit(w, "\n");
            }
        } else if (r == CHAT_R_USER) {
            chat_text(w, c);
            chat_lit(w, " [/INST]");
        } else {
            chat_text(w, c);
            chat_lit(w, "</s>");
            inside = false;
        }
    }
}

// v1: " [INST] x [/INST] y</s>"; v3: "[INST] x[/INST] y</s>" with the answer trimmed; v3-tekken:
// "[INST]x[/INST]y</s>". The system message leads the next instruction. (Mistral's own v3
// templates put it in the last instruction; the conformance layout, like the established
// runtime's, keeps it first.)
static void chat_fmt_mistral(chat_w *w, chat_format f, const chat_msg *m, size_t n) {
    const char *lead = f == CHAT_MISTRAL_V1 ? " " : "";
    const char *trail = f == CHAT_MISTRAL_V3_TEKKEN ? "" : " ";
    bool trim_answer = f == CHAT_MISTRAL_V3, inside = false;
    for (size_t i = 0; i < n; i++) {
        int r = chat_role_of(m[i].role);
        if (!inside) {
            chat_lit(w, lead);
            chat_lit(w, "[INST]");
            chat_lit(w, trail);
            inside = true;
        }
        if (r == CHAT_R_SYSTEM) {
            chat_text(w, m[i].content);
            chat_lit(w, "\n\n");
        } else if (r == CHAT_R_USER) {
            chat_text(w, m[i].content);
            chat_lit(w, lead);
            chat_lit(w, "[/INST]");
        } else {
            chat_lit(w, trail);
            chat_text(w, trim_answer ? chat_trim(m[i].content) : m[i].content);
            chat_lit(w, "</s>");
            inside = false;
        }
    }
}

static void chat_fmt_mistral_v7(chat_w *w, chat_format f, const chat_msg *m, size_t n) {
    const char *sp = f == CHAT_MISTRAL_V7 ? " " : "";
    for (size_t i = 0; i < n; i++) {
        int r = chat_role_of(m[i].role);
        if (r == CHAT_R_SYSTEM) {
            chat_lit(w, "[SYSTEM_PROMPT]");
            chat_lit(w, sp);
            chat_text(w, m[i].content);
            chat_lit(w, "[/SYSTEM_PROMPT]");
        } else if (r == CHAT_R_USER) {
            chat_lit(w, "[INST]");
            chat_lit(w, sp);
            chat_text(w, m[i].content);
            chat_lit(w, "[/INST]");
        } else {
            chat_lit(w, sp);
            chat_text(w, m[i].content);
            chat_lit(w, "</s>");
        }
    }
}

// Qwen3's template (enable_thinking at its default): see the section comment. last_query is the
// last user message that is not a wrapped tool response.
static void chat_fmt_qwen3(chat_w *w, const chat_msg *m, size_t n, bool gen) {
    size_t last_query = n ? n - 1 : 0;
    for (size_t k = n; k-- > 0;) {
        str_t c = m[k].content;
        bool wrapped = c.n >= 31 && memcmp(c.p, "<tool_response>", 15) == 0 &&
                       memcmp(c.p + c.n - 16, "</tool_response>", 16) == 0;
        if (chat_role_of(m[k].role) == CHAT_R_USER && !wrapped) {
            last_query = k;
            break;
        }
    }
    for (size_t i = 0; i < n; i++) {
        int r = chat_role_of(m[i].role);
        str_t c = m[i].content;
        if (r == CHAT_R_ASSISTANT) {
            str_t reasoning = chat_empty;
            const char *end = chat_find(c, "</think>");
            if (end) {
                // reasoning: before the first </think>, after the last <think>; answer: after
                // the last </think>. Newlines at the joins are dropped, as the template does.
                str_t before = {c.p, (size_t)(end - c.p)};
                before = chat_rstrip_nl(before);
                const char *open = chat_find_last(before, "<think>");
                if (open) before = (str_t){open + 7, before.n - (size_t)(open + 7 - before.p)};
                reasoning = chat_lstrip_nl(before);
                const char *last_end = chat_find_last(c, "</think>");
                c = (str_t){last_end + 8, c.n - (size_t)(last_end + 8 - c.p)};
                c = chat_lstrip_nl(c);
            }
            chat_lit(w, "<|im_start|>assistant\n");
            if (i > last_query && (i + 1 == n || reasoning.n)) {
                chat_lit(w, "<think>\n");
                chat_text(w, chat_lstrip_nl(chat_rstrip_nl(reasoning)));
                chat_lit(w, "\n</think>\n\n");
                c = chat_lstrip_nl(c);
            }
            chat_text(w, c);
            chat_lit(w, "<|im_end|>\n");
        } else if (r == CHAT_R_TOOL) {
            // consecutive tool results share one user turn
            if (i == 0 || chat_role_of(m[i - 1].role) != CHAT_R_TOOL) chat_lit(w, "<|im_start|>user");
            chat_lit(w, "\n<tool_response>\n");
            chat_text(w, c);
            chat_lit(w, "\n</tool_response>");
            if (i + 1 == n || chat_role_of(m[i + 1].role) != CHAT_R_TOOL) chat_lit(w, "<|im_end|>\n");
        } else {
            chat_turn(w, "<|im_start|>", m[i].role, "\n", c, "<|im_end|>\n");
        }
    }
    if (gen) chat_lit(w, "<|im_start|>assistant\n");
}

// Gemma has no system turn: system messages (trimmed, joined) lead the next user turn.
static void chat_fmt_gemma(chat_w *w, const chat_msg *m, size_t n, bool gen) {
    size_t pending = SIZE_MAX; // first system message not yet written
    for (size_t i = 0; i < n; i++) {
        int r = chat_role_of(m[i].role);
        if (r == CHAT_R_SYSTEM) {
            if (pending == SIZE_MAX) pending = i;
            continue;
        }
        chat_lit(w, r == CHAT_R_ASSISTANT ? "<start_of_turn>model\n" : "<start_of_turn>user\n");
        if (pending != SIZE_MAX && r != CHAT_R_ASSISTANT) {
            size_t total = 0;
            for (size_t j = pending; j < i; j++)
                if (chat_role_of(m[j].role) == CHAT_R_SYSTEM) total += chat_trim(m[j].content).n;
            if (total) {
                for (size_t j = pending; j < i; j++)
                    if (chat_role_of(m[j].role) == CHAT_R_SYSTEM) chat_text(w, chat_trim(m[j].content));
                chat_lit(w, "\n\n");
            }
            pending = SIZE_MAX;
        }
        chat_text(w, chat_trim(m[i].content));
        chat_lit(w, "<end_of_turn>\n");
    }
    if (gen) chat_lit(w, "<start_of_turn>model\n");
}

// Orion has no system turn either: system messages (joined, as given) lead the next user turn.
static void chat_fmt_orion(chat_w *w, const chat_msg *m, size_t n) {
    size_t pending = SIZE_MAX;
    for (size_t i = 0; i < n; i++) {
        int r = chat_role_of(m[i].role);
        if (r == CHAT_R_SYSTEM) {
            if (pending == SIZE_MAX) pending = i;
        } else if (r == CHAT_R_USER) {
            chat_lit(w, "Human: ");
            if (pending != SIZE_MAX) {
                size_t total = 0;
                for (size_t j = pending; j < i; j++)
                    if (chat_role_of(m[j].role) == CHAT_R_SYSTEM) total += m[j].content.n;
                if (total) {
                    for (size_t j = pending; j < i; j++)
                        if (chat_role_of(m[j].role) == CHAT_R_SYSTEM) chat_text(w, m[j].content);
                    chat_lit(w, "\n\n");
                }
                pending = SIZE_MAX;
            }
            chat_text(w, m[i].content);
            chat_lit(w, "\n\nAssistant: </s>");
        } else {
            chat_text(w, m[i].content);
            chat_lit(w, "</s>");
        }
    }
}

// pre + content + post, for the formats that spell the role in their own words.
static void chat_wrap(chat_w *w, const char *pre, str_t content, const char *post) {
    chat_lit(w, pre);
    chat_text(w, content);
    chat_lit(w, post);
}

// Writes one conversation; roles were validated by the caller.
static void chat_layout(chat_w *w, chat_format f, const chat_msg *m, size_t n, bool gen) {
    switch (f) {
    case CHAT_CHATML:
        for (size_t i = 0; i < n; i++)
            chat_turn(w, "<|im_start|>", m[i].role, "\n", m[i].content, "<|im_end|>\n");
        if (gen) chat_lit(w, "<|im_start|>assistant\n");
        break;
    case CHAT_QWEN3: chat_fmt_qwen3(w, m, n, gen); break;
    case CHAT_LLAMA2:
    case CHAT_LLAMA2_SYS:
    case CHAT_LLAMA2_SYS_BOS:
    case CHAT_LLAMA2_SYS_STRIP: chat_fmt_llama2(w, f, m, n); break;
    case CHAT_MISTRAL_V1:
    case CHAT_MISTRAL_V3:
    case CHAT_MISTRAL_V3_TEKKEN: chat_fmt_mistral(w, f, m, n); break;
    case CHAT_MISTRAL_V7:
    case CHAT_MISTRAL_V7_TEKKEN: chat_fmt_mistral_v7(w, f, m, n); break;
    case CHAT_PHI3: // Phi-3-mini's template drops system messages; like Phi-3.5's, this keeps them
        for (size_t i = 0; i < n; i++) chat_turn(w, "<|", m[i].role, "|>\n", m[i].content, "<|end|>\n");
        if (gen) chat_lit(w, "<|assistant|>\n");
        break;
    case CHAT_PHI4:
        for (size_t i = 0; i < n; i++)
            chat_turn(w, "<|im_start|>", m[i].role, "<|im_sep|>", m[i].content, "<|im_end|>");
        if (gen) chat_lit(w, "<|im_start|>assistant<|im_sep|>");
        break;
    case CHAT_PHI4_MINI:
        for (size_t i = 0; i < n; i++) chat_turn(w, "<|", m[i].role, "|>", m[i].content, "<|end|>");
        if (gen) chat_lit(w, "<|assistant|>");
        break;
    case CHAT_FALCON3:
        for (size_t i = 0; i < n; i++) chat_turn(w, "<|", m[i].role, "|>\n", m[i].content, "\n");
        if (gen) chat_lit(w, "<|assistant|>\n");
        break;
    case CHAT_ZEPHYR:
        for (size_t i = 0; i < n; i++) chat_turn(w, "<|", m[i].role, "|>\n", m[i].content, "<|endoftext|>\n");
        if (gen) chat_lit(w, "<|assistant|>\n");
        break;
    case CHAT_MONARCH: // BOS text between turns, not before the first (the tokenizer adds that)
        for (size_t i = 0; i < n; i++) chat_turn(w, i ? "<s>" : "", m[i].role, "\n", m[i].content, "</s>\n");
        if (gen) chat_lit(w, "<s>assistant\n");
        break;
    case CHAT_GEMMA: chat_fmt_gemma(w, m, n, gen); break;
    case CHAT_ORION: chat_fmt_orion(w, m, n); break;
    case CHAT_OPENCHAT:
        for (size_t i = 0; i < n; i++) {
            int r = chat_role_of(m[i].role);
            const char *pre = r == CHAT_R_USER ? "GPT4 Correct User: "
                              : r == CHAT_R_ASSISTANT ? "GPT4 Correct Assistant: " : "";
            chat_wrap(w, pre, m[i].content, "<|end_of_turn|>");
        }
        if (gen) chat_lit(w, "GPT4 Correct Assistant:");
        break;
    case CHAT_VICUNA:
    case CHAT_VICUNA_ORCA:
        for (size_t i = 0; i < n; i++) {
            int r = chat_role_of(m[i].role);
            if (r == CHAT_R_SYSTEM && f == CHAT_VICUNA_ORCA) chat_wrap(w, "SYSTEM: ", m[i].content, "\n");
            else if (r == CHAT_R_SYSTEM) chat_wrap(w, "", m[i].content, "\n\n");
            else if (r == CHAT_R_USER) chat_wrap(w, "USER: ", m[i].content, "\n");
            else chat_wrap(w, "ASSISTANT: ", m[i].content, "</s>\n");
        }
        if (gen) chat_lit(w, "ASSISTANT:");
        break;
    case CHAT_DEEPSEEK:
        for (size_t i = 0; i < n; i++) {
            int r = chat_role_of(m[i].role);
            if (r == CHAT_R_SYSTEM) chat_text(w, m[i].content);
            else if (r == CHAT_R_USER) chat_wrap(w, "### Instruction:\n", m[i].content, "\n");
            else chat_wrap(w, "### Response:\n", m[i].content, "\n<|EOT|>\n");
        }
        if (gen) chat_lit(w, "### Response:\n");
        break;
    case CHAT_DEEPSEEK2:
        for (size_t i = 0; i < n; i++) {
            int r = chat_role_of(m[i].role);
            if (r == CHAT_R_SYSTEM) chat_wrap(w, "", m[i].content, "\n\n");
            else if (r == CHAT_R_USER) chat_wrap(w, "User: ", m[i].content, "\n\n");
            else chat_wrap(w, "Assistant: ", m[i].content, CHAT_DS_EOS);
        }
        if (gen) chat_lit(w, "Assistant:");
        break;
    case CHAT_DEEPSEEK3:
        for (size_t i = 0; i < n; i++) {
            int r = chat_role_of(m[i].role);
            if (r == CHAT_R_SYSTEM) chat_wrap(w, "", m[i].content, "\n\n");
            else if (r == CHAT_R_USER) chat_wrap(w, CHAT_DS_USER, m[i].content, "");
            else chat_wrap(w, CHAT_DS_ASSISTANT, m[i].content, CHAT_DS_EOS);
        }
        if (gen) chat_lit(w, CHAT_DS_ASSISTANT);
        break;
    case CHAT_COMMAND_R:
        for (size_t i = 0; i < n; i++) {
            int r = chat_role_of(m[i].role);
            const char *tag = r == CHAT_R_SYSTEM ? "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>"
                              : r == CHAT_R_USER ? "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>"
                                                 : "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>";
            chat_wrap(w, tag, chat_trim(m[i].content), "<|END_OF_TURN_TOKEN|>");
        }
        if (gen) chat_lit(w, "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>");
        break;
    case CHAT_LLAMA3:
        for (size_t i = 0; i < n; i++)
            chat_turn(w, "<|start_header_id|>", m[i].role, "<|end_header_id|>\n\n", chat_trim(m[i].content),
                      "<|eot_id|>");
        if (gen) chat_lit(w, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    case CHAT_LLAMA4:
        for (size_t i = 0; i < n; i++)
            chat_turn(w, "<|header_start|>", m[i].role, "<|header_end|>\n\n", chat_trim(m[i].content),
                      "<|eot|>");
        if (gen) chat_lit(w, "<|header_start|>assistant<|header_end|>\n\n");
        break;
    case CHAT_CHATGLM3:
        chat_lit(w, "[gMASK]sop");
        for (size_t i = 0; i < n; i++) chat_turn(w, "<|", m[i].role, "|>\n ", m[i].content, "");
        if (gen) chat_lit(w, "<|assistant|>");
        break;
    case CHAT_CHATGLM4:
        chat_lit(w, "[gMASK]<sop>");
        for (size_t i = 0; i < n; i++) chat_turn(w, "<|", m[i].role, "|>\n", m[i].content, "");
        if (gen) chat_lit(w, "<|assistant|>\n");
        break;
    case CHAT_GLMEDGE:
        for (size_t i = 0; i < n; i++) chat_turn(w, "<|", m[i].role, "|>\n", m[i].content, "");
        if (gen) chat_lit(w, "<|assistant|>");
        break;
    case CHAT_MINICPM:
        for (size_t i = 0; i < n; i++) {
            str_t c = chat_trim(m[i].content);
            if (chat_role_of(m[i].role) == CHAT_R_USER) chat_wrap(w, CHAT_MINICPM_USER, c, "<AI>");
            else chat_text(w, c);
        }
        break;
    case CHAT_EXAONE3:
    case CHAT_EXAONE4:
        for (size_t i = 0; i < n; i++) {
            int r = chat_role_of(m[i].role);
            str_t c = chat_trim(m[i].content);
            if (r == CHAT_R_SYSTEM) chat_wrap(w, "[|system|]", c, "[|endofturn|]\n");
            else if (r == CHAT_R_USER) chat_wrap(w, "[|user|]", c, "\n");
            else if (r == CHAT_R_ASSISTANT) chat_wrap(w, "[|assistant|]", c, "[|endofturn|]\n");
            else chat_wrap(w, "[|tool|]", c, "[|endofturn|]\n");
        }
        if (gen) chat_lit(w, "[|assistant|]");
        break;
    case CHAT_GRANITE:
        for (size_t i = 0; i < n; i++)
            chat_turn(w, "<|start_of_role|>", m[i].role, "<|end_of_role|>", m[i].content,
                      "<|end_of_text|>\n");
        if (gen) chat_lit(w, "<|start_of_role|>assistant<|end_of_role|>");
        break;
    case CHAT_GIGACHAT: {
        // The template's additional_special_tokens are <|role_sep|>, <|message_sep|>, "[]" (no
        // functions) and <|message_sep|>; it begins with the BOS text itself.
        size_t i = 0;
        chat_lit(w, "<s>");
        if (n && chat_role_of(m[0].role) == CHAT_R_SYSTEM) {
            chat_wrap(w, "", m[0].content, "<|message_sep|>");
            i = 1;
        }
        for (; i < n; i++) {
            if (chat_role_of(m[i].role) == CHAT_R_USER)
                chat_wrap(w, "user<|role_sep|>", m[i].content,
                          "<|message_sep|>available functions<|role_sep|>[]<|message_sep|>");
            else
                chat_wrap(w, "assistant<|role_sep|>", m[i].content, "<|message_sep|>");
        }
        if (gen) chat_lit(w, "assistant<|role_sep|>");
        break;
    }
    case CHAT_MEGREZ:
        for (size_t i = 0; i < n; i++)
            chat_turn(w, "<|role_start|>", m[i].role, "<|role_end|>", m[i].content, "<|turn_end|>");
        if (gen) chat_lit(w, "<|role_start|>assistant<|role_end|>");
        break;
    case CHAT_FORMAT_COUNT: break;
    }
}

// Formats msgs[0..n) in format f and appends the prompt to out (NUL-terminated). When spans is
// given, appends to it the ranges of out (offsets from out->data) that are message bytes.
// add_generation_prompt ends the prompt with the assistant cue. Errors (out and spans are then
// left as they were): PSV_ERR_INVALID for an unknown format, a message without a role, or a
// role the format cannot express (the message says which and why); PSV_ERR_NOMEM.
// Messages are not modified; nothing is kept after the call. Thread-safe.
static psv_status chat_apply(chat_format f, const chat_msg *msgs, size_t n, bool add_generation_prompt,
                             buf_t *out, chat_spans *spans, psv_error *err) {
    if ((unsigned)f >= CHAT_FORMAT_COUNT)
        return err_set(err, PSV_ERR_INVALID, "chat: format: unknown format id %d", (int)f);
    if (n && !msgs) return err_set(err, PSV_ERR_INVALID, "chat: messages: NULL array of %zu messages", n);
    uint8_t allowed = chat_formats[f].roles;
    for (size_t i = 0; i < n; i++) {
        str_t role = msgs[i].role, c = msgs[i].content;
        if (!role.p || role.n == 0)
            return err_set(err, PSV_ERR_INVALID,
                           "chat: message %zu: missing role (expected system, user or assistant)", i);
        if (!c.p && c.n)
            return err_set(err, PSV_ERR_INVALID, "chat: message %zu: NULL content of length %zu", i, c.n);
        int r = chat_role_of(role);
        if (!(r & allowed)) {
            const char *expect = allowed & CHAT_R_TOOL ? "system, user, assistant or tool"
                                                       : "system, user or assistant";
            return err_set(err, PSV_ERR_INVALID,
                           "chat: message %zu: role '%.*s' is not supported by the %s format (expected %s)",
                           i, (int)PSV_MIN(role.n, 64), role.p, chat_format_name(f), expect);
        }
        if (f == CHAT_GIGACHAT && r == CHAT_R_SYSTEM && i > 0)
            return err_set(err, PSV_ERR_INVALID,
                           "chat: message %zu: the gigachat format takes a system message only first", i);
    }
    size_t base_len = out->len, base_spans = spans ? spans->n : 0;
    chat_w w = {out, spans};
    chat_layout(&w, f, msgs, n, add_generation_prompt);
    if (!out->data && buf_reserve(out, 0)) out->data[0] = 0; // an empty prompt is still a string
    if (out->oom || (spans && spans->oom)) {
        if (out->data && out->len >= base_len) {
            out->len = base_len;
            out->data[base_len] = 0;
        }
        if (spans) spans->n = base_spans;
        return err_set(err, PSV_ERR_NOMEM, "chat: out of memory formatting %zu messages", n);
    }
    return PSV_OK;
}

// Bytes to drop from the front of a formatted prompt before tokenizing it with BOS added: the
// length of bos_text when the prompt starts with it and those bytes are template text (not the
// start of a span from a message), else 0. prompt and spans are what chat_apply produced into an
// empty buffer; without spans (NULL) the leading bytes are taken as template text. See the BOS
// rule in the section comment.
static size_t chat_bos_prefix(const char *prompt, size_t n, const chat_spans *spans, str_t bos_text) {
    if (!prompt || bos_text.n == 0 || bos_text.n > n || memcmp(prompt, bos_text.p, bos_text.n) != 0) return 0;
    if (spans && spans->n && spans->v[0].off < bos_text.n) return 0;
    return bos_text.n;
}

// Formats msgs in format f and tokenizes the prompt as a chat prompt must be: with the
// vocabulary's BOS/EOS rule (add_bos_token, add_eos_token), the prompt's own leading BOS text
// dropped when BOS is added (chat_bos_prefix), control tokens recognised in the template text
// and never in message bytes. *ids is malloc'd (free it). Errors: those of chat_apply and
// tok_encode_segments.
static psv_status chat_tokenize(const tok_vocab *v, chat_format f, const chat_msg *msgs, size_t n,
                                bool add_generation_prompt, int32_t **ids, size_t *n_ids, psv_error *err) {
    *ids = NULL;
    *n_ids = 0;
    buf_t text = {0};
    chat_spans sp = {0};
    tok_segment *segs = NULL;
    psv_status st = chat_apply(f, msgs, n, add_generation_prompt, &text, &sp, err);
    if (st != PSV_OK) goto done;
    size_t cur = 0, k = 0, cap;
    if (tok_add_bos(v) && tok_bos(v) >= 0) {
        str_t bos;
        bos.p = tok_token_text(v, tok_bos(v), &bos.n);
        cur = chat_bos_prefix(text.data, text.len, &sp, bos);
    }
    // Template text and message bytes alternate: at most one template segment per span, plus
    // the tail.
    if (!ck_mul(sp.n, 2, &cap) || !ck_add(cap, 1, &cap) || !(segs = calloc(cap, sizeof *segs))) {
        st = err_set(err, PSV_ERR_NOMEM, "chat: out of memory for %zu prompt segments", sp.n);
        goto done;
    }
    for (size_t i = 0; i < sp.n; i++) {
        if (sp.v[i].off > cur) segs[k++] = (tok_segment){text.data + cur, sp.v[i].off - cur, true};
        segs[k++] = (tok_segment){text.data + sp.v[i].off, sp.v[i].n, false};
        cur = sp.v[i].off + sp.v[i].n;
    }
    if (text.len > cur) segs[k++] = (tok_segment){text.data + cur, text.len - cur, true};
    st = tok_encode_segments(v, segs, k, true, ids, n_ids, err);
done:
    free(segs);
    chat_spans_free(&sp);
    buf_free(&text);
    return st;
}

// ---- CLI ----

static void chat_cli_usage(FILE *f) {
    buf_t names = {0};
    chat_format_names(&names);
    fprintf(f,
            "usage: pensieve template (-m MODEL | --template NAME_OR_FILE) --messages FILE.json\n"
            "                         [--no-generation-prompt]\n"
            "Prints the conversation in FILE.json ([{\"role\": ..., \"content\": ...}, ...], '-' for\n"
            "standard input) laid out in a chat format, exactly, with no trailing newline added.\n"
            "  -m, --model MODEL        use the format of the model's tokenizer.chat_template\n"
            "  --template NAME_OR_FILE  a built-in format name, or a file holding a Jinja chat\n"
            "                           template whose format is recognised by its content\n"
            "  --no-generation-prompt   leave out the assistant cue at the end\n"
            "Built-in formats: %s\n",
            names.data ? names.data : "");
    buf_free(&names);
}

// Reads FILE.json into msgs (slices into the returned document). Returns false with a message.
static bool chat_cli_messages(const json_doc *doc, chat_msg **out, size_t *n_out, psv_error *err) {
    const json_value *root = json_root(doc);
    *out = NULL;
    *n_out = 0;
    if (!root || root->kind != JSON_ARRAY) {
        err_set(err, PSV_ERR_FORMAT, "messages: expected a JSON array of {\"role\", \"content\"} objects");
        return false;
    }
    size_t n = json_len(root);
    chat_msg *m = calloc(n ? n : 1, sizeof *m);
    if (!m) {
        err_set(err, PSV_ERR_NOMEM, "messages: out of memory for %zu messages", n);
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        const json_value *it = json_at(root, i);
        const json_value *role = json_get(it, "role"), *content = json_get(it, "content");
        if (!it || it->kind != JSON_OBJECT) {
            err_set(err, PSV_ERR_FORMAT, "messages: item %zu: expected an object with role and content", i);
        } else if (!role || role->kind != JSON_STRING) {
            err_set(err, PSV_ERR_FORMAT, "messages: item %zu: %s", i,
                    role ? "\"role\" must be a string" : "missing \"role\"");
        } else if (!content || content->kind != JSON_STRING) {
            err_set(err, PSV_ERR_FORMAT, "messages: item %zu: %s", i,
                    content ? "\"content\" must be a string" : "missing \"content\"");
        } else {
            m[i].role = (str_t){role->u.s.p, role->u.s.n};
            m[i].content = (str_t){content->u.s.p, content->u.s.n};
            continue;
        }
        free(m);
        return false;
    }
    *out = m;
    *n_out = n;
    return true;
}

// `pensieve template`: see chat_cli_usage. Exit status 0 ok, 1 failure, 2 usage error.
static int cli_template(int argc, char **argv) {
    const char *model = NULL, *tmpl = NULL, *messages = NULL;
    bool gen = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            chat_cli_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--no-generation-prompt")) {
            gen = false;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model") || !strcmp(a, "--template") ||
                   !strcmp(a, "--messages")) {
            if (!v) {
                fprintf(stderr, "pensieve template: %s needs a value (try --help)\n", a);
                return 2;
            }
            if (!strcmp(a, "--template")) tmpl = v;
            else if (!strcmp(a, "--messages")) messages = v;
            else model = v;
            i++;
        } else {
            fprintf(stderr, "pensieve template: unknown argument '%s' (try --help)\n", a);
            return 2;
        }
    }
    if (!model == !tmpl) {
        fprintf(stderr, "pensieve template: give exactly one of -m MODEL or --template NAME_OR_FILE "
                        "(try --help)\n");
        return 2;
    }
    if (!messages) {
        fprintf(stderr, "pensieve template: --messages FILE.json is required (try --help)\n");
        return 2;
    }

    int rc = 1;
    psv_error err = {0};
    chat_format f = CHAT_CHATML;
    const char *warning = NULL;
    char *src = NULL, *text = NULL;
    size_t src_n = 0, text_n = 0;
    json_doc *doc = NULL;
    chat_msg *msgs = NULL;
    size_t n_msgs = 0;
    buf_t out = {0};
    if (model) {
        gguf_file *g = NULL;
        if (gguf_open(model, &g, &err) != PSV_OK) goto fail;
        str_t s = {NULL, 0};
        gguf_get_str(g, "tokenizer.chat_template", &s); // absent: detection falls back, with a warning
        f = chat_detect(s.p, s.n, NULL, &warning);
        gguf_close(g);
    } else if (!chat_format_by_name(tmpl, &f)) {
        struct stat st;
        if (stat(tmpl, &st) != 0 && errno == ENOENT) {
            buf_t names = {0};
            chat_format_names(&names);
            fprintf(stderr,
                    "pensieve template: unknown template '%s': not a built-in name (%s) and no such file\n",
                    tmpl, names.data ? names.data : "");
            buf_free(&names);
            goto done;
        }
        if (plat_read_file(tmpl, &src, &src_n, &err) != PSV_OK) goto fail;
        f = chat_detect(src, src_n, NULL, &warning);
    }
    if (warning) fprintf(stderr, "pensieve template: warning: %s\n", warning);
    if (plat_read_file(messages, &text, &text_n, &err) != PSV_OK) goto fail;
    if (json_parse(text, text_n, &doc, &err) != PSV_OK) {
        err_prefix(&err, "%s: ", messages);
        goto fail;
    }
    if (!chat_cli_messages(doc, &msgs, &n_msgs, &err)) {
        err_prefix(&err, "%s: ", messages);
        goto fail;
    }
    if (chat_apply(f, msgs, n_msgs, gen, &out, NULL, &err) != PSV_OK) goto fail;
    if ((out.len && fwrite(out.data, 1, out.len, stdout) != out.len) || fflush(stdout) != 0) {
        fprintf(stderr, "pensieve template: write error on standard output\n");
        goto done;
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "pensieve template: %s\n", err.message);
done:
    buf_free(&out);
    free(msgs);
    json_doc_free(doc);
    free(text);
    free(src);
    return rc;
}

// ----------------------------------------------------------------------------
// 11. Kernels
// Scalar reference kernels for every tensor type the engine computes with: dequantize a row
// (to_float), quantize a row (from_float) and the dot product of a weight row with an activation
// row in the type ggml pairs with it (vec_dot_type). Block layouts are ggml's (ggml-common.h),
// decoded byte by byte; these kernels are the oracle the SIMD variants are tested against.
//
// Row contract (all kernels): n counts values and is a multiple of the type's blck_size (an
// internal invariant, asserted); rows are byte arrays with no alignment requirement; multi-byte
// fields are little-endian as in GGUF (activation rows use the same encoding, so a quantized
// activation row is exactly what a GGUF file of that type would hold). Kernels are pure and
// thread-safe, and never read or write outside the n values of their rows.
//
// Dot products share one numerical contract. Within a block, quant products are summed exactly
// in 32-bit integers (the bounds above each kernel show they cannot overflow); each block's
// scale factors are then applied in double, where the products of an fp16 scale, a float scale
// and an integer sum are exact or rounded once. The blocks' terms are added in K_BLOCK_LANES = 4
// double lanes, block b into lane b % 4 in row order, and the lanes are then added in order
// (((lane0 + lane1) + lane2) + lane3): SIMD kernels handle four blocks at a time, and four
// independent sums let them do so without a chain of dependent additions, one per block, setting
// their speed. The result is rounded to float once. Against the exact value of the block formula
// this gives |s - exact| <= 2^-24 |exact| + (n_blocks / 4 + 3) * 2^-52 * sum_b |term_b|:
// float-exact for any row a model has. ggml adds blocks in float, so it differs from this by its
// own rounding (~1e-6 relative), far below what the logit tolerance cares about.
//
// The order of every floating-point operation is part of the contract, not just the bound: the
// SIMD kernels (section 12) compute the same integer sums and repeat these double operations in
// this order, so every kernel set gives bit-identical results (the reference models amplify a
// last-bit difference into visible logit changes). Each block's term is passed through
// k_no_fuse before it is added, so no compiler fuses it into the addition (see there).

typedef void (*k_to_float_fn)(const void *x, float *y, int64_t n);          // dequantize a row
typedef void (*k_from_float_fn)(const float *x, void *y, int64_t n);        // quantize a row
typedef void (*k_vec_dot_fn)(int64_t n, float *s, const void *x, const void *y); // s = x . y
// One weight row x against nr (1..K_ROWS_MAX) activation rows y + r*y_stride (bytes), writing
// s[r*s_stride]; each result is bit-identical to vec_dot's. Reuses each unpacked weight block
// across the rows (prompt processing).
typedef void (*k_vec_dot_rows_fn)(int64_t n, float *s, int64_t s_stride, const void *x, const void *y,
                                  size_t y_stride, int nr);
#define K_ROWS_MAX 4
// Weights a GEMM call asks the memory for while it computes, so that packing the next panel finds
// them in the cache: `rows` rows, p + r * stride, of blocks of blk bytes; alongside its own block
// b, the kernel prefetches block b of each of them.
typedef struct {
    const uint8_t *p;
    size_t stride, blk;
    int rows;
} k_prefetch;
// A panel of nw (1..K_PANEL) weight rows packed by k_panel_pack against nr (1..k_traits.gemm_rows)
// activation rows y + r*ys with their k_act_side at side + r*side_stride (bytes):
// out[r][i] = weight row i . activation row r, bit-identical to vec_dot (section 12). pf: weights
// to prefetch meanwhile (k_prefetch), or NULL.
typedef void (*k_gemm_fn)(int64_t n, const uint8_t *panel, const uint8_t *y, size_t ys, const uint8_t *side,
                          size_t side_stride, int nr, float *const *out, int nw, const k_prefetch *pf);
// k_panel_pack: nw weight rows of n values, w_stride bytes apart, into a panel.
typedef void (*k_pack_fn)(int64_t n, const uint8_t *w, size_t w_stride, int nw, uint8_t *panel);
// vec_dot_rows given each activation row's k_act_side (section 12) at side + r*side_stride,
// which lets generation skip work that depends only on the activation: weight row x against nr
// (1..K_ROWS_MAX) activation rows y + r*y_stride, results to s[r*s_stride], bit-identical to vec_dot.
typedef void (*k_gemv_fn)(int64_t n, float *s, int64_t s_stride, const uint8_t *x, const uint8_t *y, size_t y_stride,
                          const uint8_t *side, size_t side_stride, int nr);
// One activation row y (with its k_act_side) against nw >= 1 weight rows x + i*x_stride, results
// to s[i]; bit-identical to vec_dot. Generation of a single sequence, where the work is all
// weight rows: these kernels take several rows at a time, side by side in the vectors.
typedef void (*k_gemv1_fn)(int64_t n, float *s, const uint8_t *x, size_t x_stride, int nw, const uint8_t *y,
                           const uint8_t *side);
typedef struct {
    k_to_float_fn to_float;
    k_from_float_fn from_float;
    k_vec_dot_fn vec_dot;   // x of this type, y of vec_dot_type; NULL for activation-only types
    uint32_t vec_dot_type;  // T_* the activation row must be quantized to (with its from_float)
    k_vec_dot_rows_fn vec_dot_rows; // optional (NULL in the reference set): see k_dot_rows
    k_gemm_fn gemm;                 // optional (NULL in the reference set): see "GEMM panels"
    k_pack_fn pack;                 // the panel packer gemm's set uses (set with gemm)
    k_gemv_fn gemv;                 // optional (NULL in the reference set): see k_gemv_fn
    k_gemv1_fn gemv1;               // optional (NULL in the reference set): see k_gemv1_fn
    int gemm_rows;                  // the activation rows gemm takes at once (set with gemm)
} k_traits;

// Block sizes in bytes (ggml-common.h static_asserts; checked against type_table by the tests).
#define K_Q4_0_SIZE 18  // fp16 d | qs[16]
#define K_Q4_1_SIZE 20  // fp16 d | fp16 m | qs[16]
#define K_Q5_0_SIZE 22  // fp16 d | qh[4] | qs[16]
#define K_Q5_1_SIZE 24  // fp16 d | fp16 m | qh[4] | qs[16]
#define K_Q8_0_SIZE 34  // fp16 d | int8 qs[32]
#define K_Q8_1_SIZE 36  // fp16 d | fp16 s | int8 qs[32]
#define K_Q2_K_SIZE 84  // scales[16] | qs[64] | fp16 d | fp16 dmin
#define K_Q3_K_SIZE 110 // hmask[32] | qs[64] | scales[12] | fp16 d
#define K_Q4_K_SIZE 144 // fp16 d | fp16 dmin | scales[12] | qs[128]
#define K_Q5_K_SIZE 176 // fp16 d | fp16 dmin | scales[12] | qh[32] | qs[128]
#define K_Q6_K_SIZE 210 // ql[128] | qh[64] | int8 scales[16] | fp16 d
#define K_Q8_K_SIZE 292 // float d | int8 qs[256] | int16 bsums[16]

static inline float k_ld_f16(const uint8_t *p) { return psv_fp16_to_f32(ld_u16(p)); }
static inline float k_ld_f32(const uint8_t *p) { return f32_from_bits(ld_u32(p)); }
static inline int k_ld_i16(const uint8_t *p) { return (int)ld_u16(p) - ((p[1] & 0x80) ? 65536 : 0); }
static inline void k_st_f16(uint8_t *p, float f) { wr_u16(p, psv_f32_to_fp16(f)); }

// Float to int conversions of ggml's reference quantizers, made total: each saturates to
// [lo, hi] and maps NaN to 0 (k_trunc: to lo), so non-finite input gives a garbage block rather
// than undefined behaviour. For finite input the quantizers below never reach the saturation
// except where ggml itself clamps. The arithmetic on the fraction is exact because |v| < 2^23
// once it is inside a small [lo, hi].
//
// roundf: nearest, ties away from zero (Q8_0 and Q8_1).
static inline int k_round_away(float v, int lo, int hi) {
    if (v != v) return 0;
    if (v <= (float)lo) return lo;
    if (v >= (float)hi) return hi;
    float a = psv_fabsf(v);
    int i = (int)a;
    if (a - (float)i >= 0.5f) i++;
    return v < 0 ? -i : i;
}

// ggml's nearest_int: nearest, ties to even (k-quants and Q8_K).
static inline int k_round_even(float v, int lo, int hi) {
    if (v != v) return 0;
    if (v <= (float)lo) return lo;
    if (v >= (float)hi) return hi;
    int i = (int)v; // toward zero
    float f = v - (float)i;
    if (f > 0.5f || (f == 0.5f && (i & 1))) i++;
    else if (f < -0.5f || (f == -0.5f && (i & 1))) i--;
    return i;
}

// A C cast toward zero (Q4_0, Q4_1, Q5_0, Q5_1 add 0.5 or an offset first, then truncate).
static inline int k_trunc(float v, int lo, int hi) {
    if (v != v || v <= (float)lo) return lo;
    if (v >= (float)hi) return hi;
    return (int)v;
}

// The value of largest magnitude, with its sign (the first one on ties), and optionally that
// magnitude. ggml's symmetric formats scale by it so the extreme lands on the wider, negative
// end of their lopsided range (-8..7, -16..15, -4..3, -32..31).
static inline float k_signed_absmax(const float *x, int n, float *amax_out) {
    float amax = 0, max = 0;
    for (int j = 0; j < n; j++) {
        float a = psv_fabsf(x[j]);
        if (a > amax) {
            amax = a;
            max = x[j];
        }
    }
    if (amax_out) *amax_out = amax;
    return max;
}

// Returns v unchanged, but the compiler cannot see through it: an inexact product that is then
// added must be rounded on its own. Compilers fuse `a * b + c` into one FMA, which rounds once
// instead of twice (GCC across statements unless -std=c11 or -ffp-contract=off, clang within an
// expression), and only where the target has FMA: so the reference on aarch64, or a SIMD kernel
// compiled for FMA, would otherwise differ in the last bit from the x86-64 baseline reference.
static inline double k_no_fuse(double v) {
#if defined(PSV_X86) && defined(__SSE2__)
    __asm__("" : "+x"(v));
#elif defined(PSV_ARM64)
    __asm__("" : "+w"(v));
#else
    volatile double t = v;
    v = t;
#endif
    return v;
}

// ---- F32, F16, BF16 ------------------------------------------------------------------------
// Each is its own vec_dot_type (ggml: F16 weights multiply F16 activations, BF16 multiply BF16).
//
// The float dot products accumulate in K_LANES double lanes: product i is added to lane
// i % K_LANES, each lane in index order, and then the lanes are added in order, lane 0 first
// (s = ((lane0 + lane1) + lane2) + ...). The SIMD kernels keep exactly these lanes in vector
// registers, which makes them bit-identical to these loops; a row shorter than K_LANES is summed
// in plain index order. Each product is exact in double, so every addition rounds once:
// |s - exact| <= 2^-24 |exact| + (n / K_LANES + K_LANES) 2^-53 sum |x_i y_i|.
#define K_LANES 16
#define K_BLOCK_LANES 4 // the quantized dot products' lanes (see the section comment)
#define K_SOFTMAX_LANES 8 // the lanes of the attention weights' sum (k_softmax_ref)
#define K_KEY_BLOCK 8 // the KV cache's keys are stored in blocks of this many positions (k_dot_keys_ref)

enum { K_KEYS_MAX_N = 512 }; // the longest rows the key kernels take (queries on the stack)
static void k_dot_keys_ref(float *s, size_t s_stride, const float *q, size_t q_stride, int nq, const float *k,
                           size_t bstride, int64_t nk, int64_t n);

// Queries g0 .. g0 + c - 1 (q_stride apart, n values each) as doubles, rows K_KEYS_MAX_N apart.
PSV_MAYBE_UNUSED static void k_keys_queries_pd(double *qd, const float *q, size_t q_stride, int g0, int c, int64_t n) {
    for (int g = 0; g < c; g++)
        for (int64_t i = 0; i < n; i++) qd[(size_t)g * K_KEYS_MAX_N + (size_t)i] = (double)q[(size_t)(g0 + g) * q_stride + (size_t)i];
}

// The lanes added in order, lane 0 first, rounded to float.
static float k_lanes_sum(const double *acc, int n_lanes) {
    double s = acc[0];
    for (int l = 1; l < n_lanes; l++) s += acc[l];
    return (float)s;
}

static void k_dequant_f32_ref(const void *vx, float *y, int64_t n) {
    const uint8_t *x = vx;
    for (int64_t i = 0; i < n; i++) y[i] = k_ld_f32(x + 4 * i);
}
static void k_quant_f32_ref(const float *x, void *vy, int64_t n) {
    uint8_t *y = vy;
    for (int64_t i = 0; i < n; i++) wr_u32(y + 4 * i, f32_bits(x[i]));
}

// Products in double (exact), summed in double lanes (see K_LANES), rounded to float once.
// (ggml rounds each product to float first; the difference is below 2^-24 relative per term.)
static void k_dot_f32_f32_ref(int64_t n, float *s, const void *vx, const void *vy) {
    const uint8_t *x = vx, *y = vy;
    double acc[K_LANES] = {0};
    for (int64_t i = 0; i < n; i++) acc[i % K_LANES] += (double)k_ld_f32(x + 4 * i) * (double)k_ld_f32(y + 4 * i);
    *s = k_lanes_sum(acc, K_LANES);
}

// fp16 -> float through a 64K-entry table (256 KB): psv_fp16_to_f32 branches on subnormals and
// specials, and the table makes the F16 dot and dequantization about 2.6x faster (measured,
// x86-64 -O2). Built once, thread-safely; the quantized kernels convert one scale per block and
// call psv_fp16_to_f32 directly.
static float k_fp16_table[65536];
static pthread_once_t k_fp16_once = PTHREAD_ONCE_INIT;
static void k_fp16_table_init(void) {
    for (uint32_t h = 0; h < 65536; h++) k_fp16_table[h] = psv_fp16_to_f32((uint16_t)h);
}
static const float *k_fp16_lut(void) {
    pthread_once(&k_fp16_once, k_fp16_table_init);
    return k_fp16_table;
}

static void k_dequant_f16_ref(const void *vx, float *y, int64_t n) {
    const uint8_t *x = vx;
    const float *lut = k_fp16_lut();
    for (int64_t i = 0; i < n; i++) y[i] = lut[ld_u16(x + 2 * i)];
}
// IEEE round to nearest even; beyond 65504 (after rounding) gives infinity, like F16C.
static void k_quant_f16_ref(const float *x, void *vy, int64_t n) {
    uint8_t *y = vy;
    for (int64_t i = 0; i < n; i++) k_st_f16(y + 2 * i, x[i]);
}
// Products of two halves are exact in float (11+11 significant bits, |product| < 2^32); summed
// in double lanes (see K_LANES), rounded once. ggml's scalar ggml_vec_dot_f16 also accumulates
// in double, in index order.
static void k_dot_f16_f16_ref(int64_t n, float *s, const void *vx, const void *vy) {
    const uint8_t *x = vx, *y = vy;
    const float *lut = k_fp16_lut();
    double acc[K_LANES] = {0};
    for (int64_t i = 0; i < n; i++) acc[i % K_LANES] += (double)(lut[ld_u16(x + 2 * i)] * lut[ld_u16(y + 2 * i)]);
    *s = k_lanes_sum(acc, K_LANES);
}

static void k_dequant_bf16_ref(const void *vx, float *y, int64_t n) {
    const uint8_t *x = vx;
    for (int64_t i = 0; i < n; i++) y[i] = psv_bf16_to_f32(ld_u16(x + 2 * i));
}
// Round to nearest even on the upper 16 bits; NaN stays a quiet NaN (ggml_compute_fp32_to_bf16).
static void k_quant_bf16_ref(const float *x, void *vy, int64_t n) {
    uint8_t *y = vy;
    for (int64_t i = 0; i < n; i++) wr_u16(y + 2 * i, psv_f32_to_bf16(x[i]));
}
// Products in double (exact, and unlike a float product they cannot overflow: bf16 has float's
// range), summed in double lanes (see K_LANES), rounded once.
static void k_dot_bf16_bf16_ref(int64_t n, float *s, const void *vx, const void *vy) {
    const uint8_t *x = vx, *y = vy;
    double acc[K_LANES] = {0};
    for (int64_t i = 0; i < n; i++)
        acc[i % K_LANES] += (double)psv_bf16_to_f32(ld_u16(x + 2 * i)) * (double)psv_bf16_to_f32(ld_u16(y + 2 * i));
    *s = k_lanes_sum(acc, K_LANES);
}

// ---- Q8_0 and Q8_1: the activation types of the 32-value formats ------------------------------

// Q8_0: x = d * q, q in [-128, 127] (the quantizer produces [-127, 127]).
static void k_dequant_q8_0_ref(const void *vx, float *y, int64_t n) {
    PSV_ASSERT(n % 32 == 0);
    const uint8_t *x = vx;
    for (int64_t b = 0; b < n / 32; b++, x += K_Q8_0_SIZE, y += 32) {
        float d = k_ld_f16(x);
        const int8_t *q = (const int8_t *)(x + 2);
        for (int j = 0; j < 32; j++) y[j] = (float)q[j] * d;
    }
}

// ggml quantize_row_q8_0_ref: d = amax/127, q = roundf(x * (1/d)), d stored as fp16. Per value
// |x - dequant| <= d/2 + 127 |d - fp16(d)| <= 0.563 d. An all-zero block gives d = 0, q = 0.
static void k_quant_q8_0_ref(const float *x, void *vy, int64_t n) {
    PSV_ASSERT(n % 32 == 0);
    uint8_t *y = vy;
    for (int64_t b = 0; b < n / 32; b++, x += 32, y += K_Q8_0_SIZE) {
        float amax;
        k_signed_absmax(x, 32, &amax);
        float d = amax / 127, id = d != 0 ? 1.0f / d : 0.0f;
        k_st_f16(y, d);
        for (int j = 0; j < 32; j++) y[2 + j] = (uint8_t)(int8_t)k_round_away(x[j] * id, -128, 127);
    }
}

// Q8_0 . Q8_0: per block isum = sum qx qy, |isum| <= 32 * 128^2 = 2^19; term = dx dy isum
// (exact in double). Order and bound: see the section comment.
static void k_dot_q8_0_q8_0_ref(int64_t n, float *s, const void *vx, const void *vy) {
    PSV_ASSERT(n % 32 == 0);
    const uint8_t *x = vx, *y = vy;
    double acc[K_BLOCK_LANES] = {0};
    for (int64_t b = 0; b < n / 32; b++, x += K_Q8_0_SIZE, y += K_Q8_0_SIZE) {
        const int8_t *qx = (const int8_t *)(x + 2), *qy = (const int8_t *)(y + 2);
        int32_t isum = 0;
        for (int j = 0; j < 32; j++) isum += qx[j] * qy[j];
        acc[b % K_BLOCK_LANES] += k_no_fuse((double)k_ld_f16(x) * (double)k_ld_f16(y) * (double)isum);
    }
    *s = k_lanes_sum(acc, K_BLOCK_LANES);
}

// Q8_1: as Q8_0 plus s = fp16(d * sum q) (d before its fp16 rounding), which lets the
// weight-with-minimum formats add their offset without touching the quants.
static void k_dequant_q8_1_ref(const void *vx, float *y, int64_t n) {
    PSV_ASSERT(n % 32 == 0);
    const uint8_t *x = vx;
    for (int64_t b = 0; b < n / 32; b++, x += K_Q8_1_SIZE, y += 32) {
        float d = k_ld_f16(x);
        const int8_t *q = (const int8_t *)(x + 4);
        for (int j = 0; j < 32; j++) y[j] = (float)q[j] * d;
    }
}

// ggml quantize_row_q8_1_ref; the round-trip bound is Q8_0's.
static void k_quant_q8_1_ref(const float *x, void *vy, int64_t n) {
    PSV_ASSERT(n % 32 == 0);
    uint8_t *y = vy;
    for (int64_t b = 0; b < n / 32; b++, x += 32, y += K_Q8_1_SIZE) {
        float amax;
        k_signed_absmax(x, 32, &amax);
        float d = amax / 127, id = d != 0 ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            int q = k_round_away(x[j] * id, -128, 127);
            y[4 + j] = (uint8_t)(int8_t)q;
            sum += q;
        }
        k_st_f16(y, d);
        k_st_f16(y + 2, (float)sum * d);
    }
}

// ---- Q4_0, Q4_1, Q5_0, Q5_1: 32 values per block --------------------------------------------
// Value j < 16 is the low nibble of qs[j], value j + 16 its high nibble. Q5 adds a fifth bit:
// bit j of the little-endian uint32 qh for value j (j < 32).

static void k_dequant_q4_0_ref(const void *vx, float *y, int64_t n) {
    PSV_ASSERT(n % 32 == 0);
    const uint8_t *x = vx;
    for (int64_t b = 0; b < n / 32; b++, x += K_Q4_0_SIZE, y += 32) {
        float d = k_ld_f16(x);
        const uint8_t *qs = x + 2;
        for (int j = 0; j < 16; j++) {
            y[j] = (float)((qs[j] & 15) - 8) * d;
            y[j + 16] = (float)((qs[j] >> 4) - 8) * d;
        }
    }
}

// ggml quantize_row_q4_0_ref: d = -max/8 where max is the value of largest magnitude, so it
// maps to -8 exactly; q = min(15, trunc(x/d + 8.5)). Per value |err| <= |d|/2, except -max
// itself, which clamps to 7: |err| <= |d| = amax/8 (plus the fp16 rounding of d).
static void k_quant_q4_0_ref(const float *x, void *vy, int64_t n) {
    PSV_ASSERT(n % 32 == 0);
    uint8_t *y = vy;
    for (int64_t b = 0; b < n / 32; b++, x += 32, y += K_Q4_0_SIZE) {
        float max = k_signed_absmax(x, 32, NULL);
        float d = max / -8, id = d != 0 ? 1.0f / d : 0.0f;
        k_st_f16(y, d);
        for (int j = 0; j < 16; j++) {
            int q0 = k_trunc(x[j] * id + 8.5f, 0, 15), q1 = k_trunc(x[j + 16] * id + 8.5f, 0, 15);
            y[2 + j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

// Q4_0 . Q8_0: isum = sum (q4 - 8) q8, |isum| <= 32 * 8 * 128 = 2^15; term = dx dy isum, exact.
static void k_dot_q4_0_q8_0_ref(int64_t n, float *s, const void *vx, const void *vy) {
    PSV_ASSERT(n % 32 == 0);
    const uint8_t *x = vx, *y = vy;
    double acc[K_BLOCK_LANES] = {0};
    for (int64_t b = 0; b < n / 32; b++, x += K_Q4_0_SIZE, y += K_Q8_0_SIZE) {
        const uint8_t *qs = x + 2;
        const int8_t *a = (const int8_t *)(y + 2);
        int32_t isum = 0;
        for (int j = 0; j < 16; j++) isum += ((qs[j] & 15) - 8) * a[j] + ((qs[j] >> 4) - 8) * a[j + 16];
        acc[b % K_BLOCK_LANES] += k_no_fuse((double)k_ld_f16(x) * (double)k_ld_f16(y) * (double)isum);
    }
    *s = k_lanes_sum(acc, K_BLOCK_LANES);
}

static void k_dequant_q4_1_ref(const void *vx, float *y, int64_t n) {
    PSV_ASSERT(n % 32 == 0);
    const uint8_t *x = vx;
    for (int64_t b = 0; b < n / 32; b++, x += K_Q4_1_SIZE, y += 32) {
        float d = k_ld_f16(x), m = k_ld_f16(x + 2);
        const uint8_t *qs = x + 4;
        for (int j = 0; j < 16; j++) {
            y[j] = (float)(qs[j] & 15) * d + m;
            y[j + 16] = (float)(qs[j] >> 4) * d + m;
        }
    }
}

// ggml quantize_row_q4_1_ref: m = min, d = (max - min)/15, q = min(15, trunc((x - m)/d + 0.5)).
// Per value |err| <= d/2 plus the fp16 rounding of d and m.
static void k_quant_q4_1_ref(const float *x, void *vy, int64_t n) {
    PSV_ASSERT(n % 32 == 0);
    uint8_t *y = vy;
    for (int64_t b = 0; b < n / 32; b++, x += 32, y += K_Q4_1_SIZE) {
        float min = x[0], max = x[0];
        for (int j = 1; j < 32; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        float d = (max - min) / 15, id = d != 0 ? 1.0f / d : 0.0f;
        k_st_f16(y, d);
        k_st_f16(y + 2, min);
        for (int j = 0; j < 16; j++) {
            int q0 = k_trunc((x[j] - min) * id + 0.5f, 0, 15);
            int q1 = k_trunc((x[j + 16] - min) * id + 0.5f, 0, 15);
            y[4 + j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

// Q4_1 . Q8_1: x = dx q4 + mx, y = dy q8, so x.y = dx dy sum q4 q8 + mx (dy sum q8), and the
// parenthesis is the block's s. isum <= 32 * 15 * 128 < 2^16; both products exact in double.
static void k_dot_q4_1_q8_1_ref(int64_t n, float *s, const void *vx, const void *vy) {
    PSV_ASSERT(n % 32 == 0);
    const uint8_t *x = vx, *y = vy;
    double acc[K_BLOCK_LANES] = {0};
    for (int64_t b = 0; b < n / 32; b++, x += K_Q4_1_SIZE, y += K_Q8_1_SIZE) {
        const uint8_t *qs = x + 4;
        const int8_t *a = (const int8_t *)(y + 4);
        int32_t isum = 0;
        for (int j = 0; j < 16; j++) isum += (qs[j] & 15) * a[j] + (qs[j] >> 4) * a[j + 16];
        acc[b % K_BLOCK_LANES] += k_no_fuse((double)k_ld_f16(x) * (double)k_ld_f16(y) * (double)isum +
                                            (double)k_ld_f16(x + 2) * (double)k_ld_f16(y + 2));
    }
    *s = k_lanes_sum(acc, K_BLOCK_LANES);
}

// The 5-bit value j of a Q5 block: 4 bits from qs, the fifth from qh.
static inline int k_q5_value(const uint8_t *qs, uint32_t qh, int j) {
    int lo = j < 16 ? (qs[j] & 15) : (qs[j - 16] >> 4);
    return lo | (int)(((qh >> j) & 1) << 4);
}

static void k_dequant_q5_0_ref(const void *vx, float *y, int64_t n) {
    PSV_ASSERT(n % 32 == 0);
    const uint8_t *x = vx;
    for (int64_t b = 0; b < n / 32; b++, x += K_Q5_0_SIZE, y += 32) {
        float d = k_ld_f16(x);
        uint32_t qh = ld_u32(x + 2);
        for (int j = 0; j < 32; j++) y[j] = (float)(k_q5_value(x + 6, qh, j) - 16) * d;
    }
}

// ggml quantize_row_q5_0_ref: d = -max/16, q = min(31, trunc(x/d + 16.5)). Bound as Q4_0 with
// d = amax/16.
static void k_quant_q5_0_ref(const float *x, void *vy, int64_t n) {
    PSV_ASSERT(n % 32 == 0);
    uint8_t *y = vy;
    for (int64_t b = 0; b < n / 32; b++, x += 32, y += K_Q5_0_SIZE) {
        float max = k_signed_absmax(x, 32, NULL);
        float d = max / -16, id = d != 0 ? 1.0f / d : 0.0f;
        k_st_f16(y, d);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            int q0 = k_trunc(x[j] * id + 16.5f, 0, 31), q1 = k_trunc(x[j + 16] * id + 16.5f, 0, 31);
            y[6 + j] = (uint8_t)((q0 & 15) | ((q1 & 15) << 4));
            qh |= (uint32_t)(q0 >> 4) << j;
            qh |= (uint32_t)(q1 >> 4) << (j + 16);
        }
        wr_u32(y + 2, qh);
    }
}

// Q5_0 . Q8_0: isum = sum (q5 - 16) q8, |isum| <= 32 * 16 * 128 = 2^16; term exact.
static void k_dot_q5_0_q8_0_ref(int64_t n, float *s, const void *vx, const void *vy) {
    PSV_ASSERT(n % 32 == 0);
    const uint8_t *x = vx, *y = vy;
    double acc[K_BLOCK_LANES] = {0};
    for (int64_t b = 0; b < n / 32; b++, x += K_Q5_0_SIZE, y += K_Q8_0_SIZE) {
        uint32_t qh = ld_u32(x + 2);
        const int8_t *a = (const int8_t *)(y + 2);
        int32_t isum = 0;
        for (int j = 0; j < 32; j++) isum += (k_q5_value(x + 6, qh, j) - 16) * a[j];
        acc[b % K_BLOCK_LANES] += k_no_fuse((double)k_ld_f16(x) * (double)k_ld_f16(y) * (double)isum);
    }
    *s = k_lanes_sum(acc, K_BLOCK_LANES);
}

static void k_dequant_q5_1_ref(const void *vx, float *y, int64_t n) {
    PSV_ASSERT(n % 32 == 0);
    const uint8_t *x = vx;
    for (int64_t b = 0; b < n / 32; b++, x += K_Q5_1_SIZE, y += 32) {
        float d = k_ld_f16(x), m = k_ld_f16(x + 2);
        uint32_t qh = ld_u32(x + 4);
        for (int j = 0; j < 32; j++) y[j] = (float)k_q5_value(x + 8, qh, j) * d + m;
    }
}

// ggml quantize_row_q5_1_ref: m = min, d = (max - min)/31, q = trunc((x - m)/d + 0.5) (clamped
// to 31 here; ggml relies on the float arithmetic never exceeding it). Bound as Q4_1.
static void k_quant_q5_1_ref(const float *x, void *vy, int64_t n) {
    PSV_ASSERT(n % 32 == 0);
    uint8_t *y = vy;
    for (int64_t b = 0; b < n / 32; b++, x += 32, y += K_Q5_1_SIZE) {
        float min = x[0], max = x[0];
        for (int j = 1; j < 32; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        float d = (max - min) / 31, id = d != 0 ? 1.0f / d : 0.0f;
        k_st_f16(y, d);
        k_st_f16(y + 2, min);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            int q0 = k_trunc((x[j] - min) * id + 0.5f, 0, 31);
            int q1 = k_trunc((x[j + 16] - min) * id + 0.5f, 0, 31);
            y[8 + j] = (uint8_t)((q0 & 15) | ((q1 & 15) << 4));
            qh |= (uint32_t)(q0 >> 4) << j;
            qh |= (uint32_t)(q1 >> 4) << (j + 16);
        }
        wr_u32(y + 4, qh);
    }
}

// Q5_1 . Q8_1: as Q4_1 with 5-bit quants; isum <= 32 * 31 * 128 < 2^17.
static void k_dot_q5_1_q8_1_ref(int64_t n, float *s, const void *vx, const void *vy) {
    PSV_ASSERT(n % 32 == 0);
    const uint8_t *x = vx, *y = vy;
    double acc[K_BLOCK_LANES] = {0};
    for (int64_t b = 0; b < n / 32; b++, x += K_Q5_1_SIZE, y += K_Q8_1_SIZE) {
        uint32_t qh = ld_u32(x + 4);
        const int8_t *a = (const int8_t *)(y + 4);
        int32_t isum = 0;
        for (int j = 0; j < 32; j++) isum += k_q5_value(x + 8, qh, j) * a[j];
        acc[b % K_BLOCK_LANES] += k_no_fuse((double)k_ld_f16(x) * (double)k_ld_f16(y) * (double)isum +
                                            (double)k_ld_f16(x + 2) * (double)k_ld_f16(y + 2));
    }
    *s = k_lanes_sum(acc, K_BLOCK_LANES);
}

// ---- Q8_K: the activation type of the k-quants ------------------------------------------------
// 256 values, a float scale and the sums of each 16 quants (bsums), which the k-quants with a
// minimum use to apply it without touching the quants.

static void k_dequant_q8_k_ref(const void *vx, float *y, int64_t n) {
    PSV_ASSERT(n % QK_K == 0);
    const uint8_t *x = vx;
    for (int64_t b = 0; b < n / QK_K; b++, x += K_Q8_K_SIZE, y += QK_K) {
        float d = k_ld_f32(x);
        const int8_t *q = (const int8_t *)(x + 4);
        for (int j = 0; j < QK_K; j++) y[j] = d * (float)q[j];
    }
}

// ggml quantize_row_q8_K_ref: max is the value of largest magnitude, iscale = -127/max (so d is
// negative when max is positive and max itself maps to -127), q = min(127, nearest_int(x *
// iscale)) with ties to even, d = 1/iscale in float. Per value |err| <= |d|/2 (1 + 2^-20). An
// all-zero block stores d = 0, q = 0, bsums = 0.
static void k_quant_q8_k_ref(const float *x, void *vy, int64_t n) {
    PSV_ASSERT(n % QK_K == 0);
    uint8_t *y = vy;
    for (int64_t b = 0; b < n / QK_K; b++, x += QK_K, y += K_Q8_K_SIZE) {
        float amax, max = k_signed_absmax(x, QK_K, &amax);
        memset(y, 0, K_Q8_K_SIZE);
        if (amax == 0) continue;
        float iscale = -127.0f / max;
        for (int j = 0; j < QK_K; j++) y[4 + j] = (uint8_t)(int8_t)k_round_even(iscale * x[j], -128, 127);
        const int8_t *q = (const int8_t *)(y + 4);
        for (int k = 0; k < QK_K / 16; k++) {
            int sum = 0;
            for (int l = 0; l < 16; l++) sum += q[16 * k + l];
            wr_u16(y + 260 + 2 * k, (uint16_t)sum); // two's complement of a value in [-2048, 2032]
        }
        wr_u32(y, f32_bits(1.0f / iscale));
    }
}

// ---- K-quants: 256 values per super-block ------------------------------------------------------
// Each decoder unpacks a block to its 256 integer quants (offsets like Q3_K's -4 and Q6_K's -32
// already applied) and per-sub-block scales and minimums; dequantization and the dot products
// share it. Throughout, value e of the block belongs to sub-block e/16 (Q2_K, Q3_K, Q6_K) or
// e/32 (Q4_K, Q5_K), and the dot products use Q8_K's bsums for the minimums, as ggml does.

// Q2_K: qs[32*(e/128) + e%32] holds value e at bit 2*((e/32)%4); scales[k] = sc | m << 4 (4 bits
// each); x = d*sc*q - dmin*m with q in 0..3.
static void k_unpack_q2_k(const uint8_t *b, int8_t q[QK_K]) {
    const uint8_t *qs = b + 16;
    for (int h = 0; h < 2; h++) // value e = 128h + 32j + l
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++) q[128 * h + 32 * j + l] = (int8_t)((qs[32 * h + l] >> (2 * j)) & 3);
}

static void k_dequant_q2_k_ref(const void *vx, float *y, int64_t n) {
    PSV_ASSERT(n % QK_K == 0);
    const uint8_t *x = vx;
    int8_t q[QK_K];
    for (int64_t b = 0; b < n / QK_K; b++, x += K_Q2_K_SIZE, y += QK_K) {
        k_unpack_q2_k(x, q);
        float d = k_ld_f16(x + 80), dmin = k_ld_f16(x + 82);
        for (int k = 0; k < 16; k++) {
            float dl = d * (float)(x[k] & 15), ml = dmin * (float)(x[k] >> 4);
            for (int l = 0; l < 16; l++) y[16 * k + l] = dl * (float)q[16 * k + l] - ml;
        }
    }
}

// Q2_K . Q8_K: isum = sum_k sc_k sum q a <= 16 * 15 * 16 * 3 * 128 < 2^21; msum = sum_k m_k
// bsum_k <= 16 * 15 * 2048 < 2^19; term = dy (dx isum - dmin msum), each product exact or
// rounded once in double.
static void k_dot_q2_k_q8_k_ref(int64_t n, float *s, const void *vx, const void *vy) {
    PSV_ASSERT(n % QK_K == 0);
    const uint8_t *x = vx, *y = vy;
    int8_t q[QK_K];
    double acc[K_BLOCK_LANES] = {0};
    for (int64_t b = 0; b < n / QK_K; b++, x += K_Q2_K_SIZE, y += K_Q8_K_SIZE) {
        k_unpack_q2_k(x, q);
        const int8_t *a = (const int8_t *)(y + 4);
        int32_t isum = 0, msum = 0;
        for (int k = 0; k < 16; k++) {
            int32_t t = 0;
            for (int l = 0; l < 16; l++) t += q[16 * k + l] * a[16 * k + l];
            isum += (x[k] & 15) * t;
            msum += (x[k] >> 4) * k_ld_i16(y + 260 + 2 * k);
        }
        acc[b % K_BLOCK_LANES] += k_no_fuse((double)k_ld_f32(y) * ((double)k_ld_f16(x + 80) * (double)isum -
                                                                   (double)k_ld_f16(x + 82) * (double)msum));
    }
    *s = k_lanes_sum(acc, K_BLOCK_LANES);
}

// Q3_K: value e has its low two bits in qs[32*(e/128) + e%32] at bit 2*((e/32)%4) and its high
// bit in hmask[e%32] at bit e/32; q = low - (high ? 0 : 4), in -4..3. The 16 scales are 6-bit,
// biased by 32: low nibble from scales[k] (k < 8) or the high nibble of scales[k-8], top two bits
// from scales[8 + k%4] at bit 2*(k/4). x = d*(sc - 32)*q.
static void k_unpack_q3_k(const uint8_t *b, int8_t q[QK_K], int sc[16]) {
    const uint8_t *hmask = b, *qs = b + 32, *s = b + 96;
    for (int h = 0; h < 2; h++) // value e = 128h + 32j + l, so e/32 = 4h + j
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++) {
                int lo = (qs[32 * h + l] >> (2 * j)) & 3, hi = (hmask[l] >> (4 * h + j)) & 1;
                q[128 * h + 32 * j + l] = (int8_t)(lo - 4 + 4 * hi);
            }
    for (int k = 0; k < 16; k++) {
        int lo = k < 8 ? (s[k] & 15) : (s[k - 8] >> 4);
        int hi = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
        sc[k] = (lo | (hi << 4)) - 32;
    }
}

static void k_dequant_q3_k_ref(const void *vx, float *y, int64_t n) {
    PSV_ASSERT(n % QK_K == 0);
    const uint8_t *x = vx;
    int8_t q[QK_K];
    int sc[16];
    for (int64_t b = 0; b < n / QK_K; b++, x += K_Q3_K_SIZE, y += QK_K) {
        k_unpack_q3_k(x, q, sc);
        float d = k_ld_f16(x + 108);
        for (int k = 0; k < 16; k++) {
            float dl = d * (float)sc[k];
            for (int l = 0; l < 16; l++) y[16 * k + l] = dl * (float)q[16 * k + l];
        }
    }
}

// Q3_K . Q8_K: isum = sum_k sc_k sum q a, |isum| <= 16 * 32 * 16 * 4 * 128 = 2^22; term =
// dx dy isum.
static void k_dot_q3_k_q8_k_ref(int64_t n, float *s, const void *vx, const void *vy) {
    PSV_ASSERT(n % QK_K == 0);
    const uint8_t *x = vx, *y = vy;
    int8_t q[QK_K];
    int sc[16];
    double acc[K_BLOCK_LANES] = {0};
    for (int64_t b = 0; b < n / QK_K; b++, x += K_Q3_K_SIZE, y += K_Q8_K_SIZE) {
        k_unpack_q3_k(x, q, sc);
        const int8_t *a = (const int8_t *)(y + 4);
        int32_t isum = 0;
        for (int k = 0; k < 16; k++) {
            int32_t t = 0;
            for (int l = 0; l < 16; l++) t += q[16 * k + l] * a[16 * k + l];
            isum += sc[k] * t;
        }
        acc[b % K_BLOCK_LANES] += k_no_fuse((double)k_ld_f16(x + 108) * (double)k_ld_f32(y) * (double)isum);
    }
    *s = k_lanes_sum(acc, K_BLOCK_LANES);
}

// The 6-bit scale and minimum of sub-block k of Q4_K/Q5_K (ggml get_scale_min_k4): for k < 4
// the low six bits of scales[k] and scales[k+4]; for k >= 4 the nibbles of scales[k+4] with the
// top two bits of scales[k-4] (scale) and scales[k] (minimum) above them.
static inline void k_scale_min_k4(const uint8_t *s, int k, int *sc, int *m) {
    if (k < 4) {
        *sc = s[k] & 63;
        *m = s[k + 4] & 63;
    } else {
        *sc = (s[k + 4] & 15) | ((s[k - 4] >> 6) << 4);
        *m = (s[k + 4] >> 4) | ((s[k] >> 6) << 4);
    }
}

// Q4_K: value e = 64c + l (l < 32) is the low nibble of qs[32c + l], value 64c + 32 + l its high
// nibble; x = d*sc*q - dmin*m. Q5_K adds bit e/32 of qh[e%32] as the fifth bit (+16).
static void k_unpack_q45_k(const uint8_t *qs, const uint8_t *qh, const uint8_t *s, int8_t q[QK_K],
                           int sc[8], int m[8]) {
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            q[64 * c + l] = (int8_t)(qs[32 * c + l] & 15);
            q[64 * c + 32 + l] = (int8_t)(qs[32 * c + l] >> 4);
        }
    if (qh)
        for (int e = 0; e < QK_K; e++) q[e] = (int8_t)(q[e] | (((qh[e % 32] >> (e / 32)) & 1) << 4));
    for (int k = 0; k < 8; k++) k_scale_min_k4(s, k, &sc[k], &m[k]);
}

static void k_dequant_q45_k(const uint8_t *x, float *y, int64_t n, bool five) {
    PSV_ASSERT(n % QK_K == 0);
    const size_t size = five ? K_Q5_K_SIZE : K_Q4_K_SIZE;
    int8_t q[QK_K];
    int sc[8], m[8];
    for (int64_t b = 0; b < n / QK_K; b++, x += size, y += QK_K) {
        k_unpack_q45_k(five ? x + 48 : x + 16, five ? x + 16 : NULL, x + 4, q, sc, m);
        float d = k_ld_f16(x), dmin = k_ld_f16(x + 2);
        for (int k = 0; k < 8; k++) {
            float dl = d * (float)sc[k], ml = dmin * (float)m[k];
            for (int l = 0; l < 32; l++) y[32 * k + l] = dl * (float)q[32 * k + l] - ml;
        }
    }
}
static void k_dequant_q4_k_ref(const void *vx, float *y, int64_t n) { k_dequant_q45_k(vx, y, n, false); }
static void k_dequant_q5_k_ref(const void *vx, float *y, int64_t n) { k_dequant_q45_k(vx, y, n, true); }

// Q4_K/Q5_K . Q8_K: isum = sum_k sc_k sum q a <= 8 * 63 * 32 * 31 * 128 < 2^26; msum = sum_k m_k
// (bsum_2k + bsum_2k+1) <= 8 * 63 * 4096 < 2^21; term = dy (dx isum - dmin msum).
static void k_dot_q45_k(int64_t n, float *s, const uint8_t *x, const uint8_t *y, bool five) {
    PSV_ASSERT(n % QK_K == 0);
    const size_t size = five ? K_Q5_K_SIZE : K_Q4_K_SIZE;
    int8_t q[QK_K];
    int sc[8], m[8];
    double acc[K_BLOCK_LANES] = {0};
    for (int64_t b = 0; b < n / QK_K; b++, x += size, y += K_Q8_K_SIZE) {
        k_unpack_q45_k(five ? x + 48 : x + 16, five ? x + 16 : NULL, x + 4, q, sc, m);
        const int8_t *a = (const int8_t *)(y + 4);
        int32_t isum = 0, msum = 0;
        for (int k = 0; k < 8; k++) {
            int32_t t = 0;
            for (int l = 0; l < 32; l++) t += q[32 * k + l] * a[32 * k + l];
            isum += sc[k] * t;
            msum += m[k] * (k_ld_i16(y + 260 + 4 * k) + k_ld_i16(y + 262 + 4 * k));
        }
        acc[b % K_BLOCK_LANES] += k_no_fuse((double)k_ld_f32(y) *
                                            ((double)k_ld_f16(x) * (double)isum - (double)k_ld_f16(x + 2) * (double)msum));
    }
    *s = k_lanes_sum(acc, K_BLOCK_LANES);
}
static void k_dot_q4_k_q8_k_ref(int64_t n, float *s, const void *vx, const void *vy) { k_dot_q45_k(n, s, vx, vy, false); }
static void k_dot_q5_k_q8_k_ref(int64_t n, float *s, const void *vx, const void *vy) { k_dot_q45_k(n, s, vx, vy, true); }

// Q6_K: value e = 128h + 32k + l (k < 4, l < 32) has its low nibble in ql[64h + 32(k&1) + l] at
// bit 4(k>>1) and its top two bits in qh[32h + l] at bit 2k; q = that - 32, in -32..31. Scales
// are signed bytes: x = d*scales[e/16]*q.
static void k_unpack_q6_k(const uint8_t *b, int8_t q[QK_K]) {
    const uint8_t *ql = b, *qh = b + 128;
    for (int h = 0; h < 2; h++)
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < 32; l++) {
                int lo = (ql[64 * h + 32 * (k & 1) + l] >> (4 * (k >> 1))) & 15;
                int hi = (qh[32 * h + l] >> (2 * k)) & 3;
                q[128 * h + 32 * k + l] = (int8_t)((lo | (hi << 4)) - 32);
            }
}

static void k_dequant_q6_k_ref(const void *vx, float *y, int64_t n) {
    PSV_ASSERT(n % QK_K == 0);
    const uint8_t *x = vx;
    int8_t q[QK_K];
    for (int64_t b = 0; b < n / QK_K; b++, x += K_Q6_K_SIZE, y += QK_K) {
        k_unpack_q6_k(x, q);
        const int8_t *sc = (const int8_t *)(x + 192);
        float d = k_ld_f16(x + 208);
        for (int k = 0; k < 16; k++) {
            float dl = d * (float)sc[k];
            for (int l = 0; l < 16; l++) y[16 * k + l] = dl * (float)q[16 * k + l];
        }
    }
}

// Q6_K . Q8_K: isum = sum_k sc_k sum q a, |isum| <= 16 * 128 * 16 * 32 * 128 = 2^27; term =
// dx dy isum.
static void k_dot_q6_k_q8_k_ref(int64_t n, float *s, const void *vx, const void *vy) {
    PSV_ASSERT(n % QK_K == 0);
    const uint8_t *x = vx, *y = vy;
    int8_t q[QK_K];
    double acc[K_BLOCK_LANES] = {0};
    for (int64_t b = 0; b < n / QK_K; b++, x += K_Q6_K_SIZE, y += K_Q8_K_SIZE) {
        k_unpack_q6_k(x, q);
        const int8_t *sc = (const int8_t *)(x + 192), *a = (const int8_t *)(y + 4);
        int32_t isum = 0;
        for (int k = 0; k < 16; k++) {
            int32_t t = 0;
            for (int l = 0; l < 16; l++) t += q[16 * k + l] * a[16 * k + l];
            isum += sc[k] * t;
        }
        acc[b % K_BLOCK_LANES] += k_no_fuse((double)k_ld_f16(x + 208) * (double)k_ld_f32(y) * (double)isum);
    }
    *s = k_lanes_sum(acc, K_BLOCK_LANES);
}

// ---- K-quant quantizers ------------------------------------------------------------------------
// Simple, not optimal: each sub-block gets the plain min/max (or signed absmax) fit and the
// sub-block scales are quantized against the largest one, as ggml's reference quantizers do
// before their error-minimising search, which is left out. The values are then requantized
// against the stored (fp16-rounded) scales so a block is self-consistent. They make valid
// blocks for tests and generated models; error bounds are stated per type and checked by tests.

// Min/max fit of n values to levels 0..nmax with a minimum <= 0: returns the step, *mn = -min.
static float k_fit_min_max(const float *x, int n, int nmax, float *mn) {
    float min = x[0], max = x[0];
    for (int j = 1; j < n; j++) {
        if (x[j] < min) min = x[j];
        if (x[j] > max) max = x[j];
    }
    if (min > 0) min = 0;
    *mn = -min;
    return max > min ? (max - min) / (float)nmax : 0.0f;
}

// Q2_K: 16 sub-blocks of 16, step (max-min)/3 and minimum in 4 bits each against d = max
// step/15 and dmin = max minimum/15. A value is off by at most half the quantized step inside
// the quantized range, and by the range's displacement (3 |step - d sc| + |mn - dmin m|) outside
// it; with step <= 2 amax/3 and the 4-bit rounding that is <= 0.444 amax (amax: the block's
// largest magnitude), plus fp16's absolute error in d and dmin: 60 * 2^-25 when they are
// subnormal. (ggml's search does better; these are test and generator blocks.)
static void k_quant_q2_k_ref(const float *x, void *vy, int64_t n) {
    PSV_ASSERT(n % QK_K == 0);
    uint8_t *y = vy;
    for (int64_t b = 0; b < n / QK_K; b++, x += QK_K, y += K_Q2_K_SIZE) {
        float step[16], mn[16], max_step = 0, max_mn = 0;
        for (int k = 0; k < 16; k++) {
            step[k] = k_fit_min_max(x + 16 * k, 16, 3, &mn[k]);
            if (step[k] > max_step) max_step = step[k];
            if (mn[k] > max_mn) max_mn = mn[k];
        }
        memset(y, 0, K_Q2_K_SIZE);
        float is = max_step > 0 ? 15 / max_step : 0, im = max_mn > 0 ? 15 / max_mn : 0;
        for (int k = 0; k < 16; k++)
            y[k] = (uint8_t)(k_round_even(is * step[k], 0, 15) | (k_round_even(im * mn[k], 0, 15) << 4));
        k_st_f16(y + 80, max_step / 15);
        k_st_f16(y + 82, max_mn / 15);
        float d = k_ld_f16(y + 80), dmin = k_ld_f16(y + 82);
        for (int e = 0; e < QK_K; e++) {
            int k = e / 16;
            float dl = d * (float)(y[k] & 15), ml = dmin * (float)(y[k] >> 4);
            int q = dl != 0 ? k_round_even((x[e] + ml) / dl, 0, 3) : 0;
            y[16 + 32 * (e / 128) + e % 32] |= (uint8_t)(q << (2 * ((e / 32) % 4)));
        }
    }
}

// Q3_K: 16 sub-blocks of 16, each with step -max/4 (the signed absmax maps to -4); the signed
// steps are quantized to -32..31 against the largest (which maps to -32). The range -4..3 is
// lopsided, so a value opposite the sub-block's extreme can be off by a whole step, and the
// scale rounding (up to d when +32 clamps to 31) adds 3 d: <= amax/4 + 3 amax/128 + amax 2^-11
// = 0.274 amax, plus 128 * 2^-25 when d is subnormal in fp16.
static void k_quant_q3_k_ref(const float *x, void *vy, int64_t n) {
    PSV_ASSERT(n % QK_K == 0);
    uint8_t *y = vy;
    for (int64_t b = 0; b < n / QK_K; b++, x += QK_K, y += K_Q3_K_SIZE) {
        float step[16], amax = 0, max_step = 0;
        for (int k = 0; k < 16; k++) {
            step[k] = k_signed_absmax(x + 16 * k, 16, NULL) / -4;
            if (psv_fabsf(step[k]) > amax) {
                amax = psv_fabsf(step[k]);
                max_step = step[k];
            }
        }
        memset(y, 0, K_Q3_K_SIZE);
        if (max_step != 0) {
            float is = -32 / max_step;
            for (int k = 0; k < 16; k++) {
                int u = k_round_even(is * step[k], -32, 31) + 32;
                if (k < 8) y[96 + k] |= (uint8_t)(u & 15);
                else y[96 + k - 8] |= (uint8_t)((u & 15) << 4);
                y[96 + 8 + k % 4] |= (uint8_t)((u >> 4) << (2 * (k / 4)));
            }
            k_st_f16(y + 108, 1 / is);
        }
        int8_t q[QK_K];
        int sc[16];
        k_unpack_q3_k(y, q, sc);
        float d = k_ld_f16(y + 108);
        for (int e = 0; e < QK_K; e++) {
            float dl = d * (float)sc[e / 16];
            int u = (dl != 0 ? k_round_even(x[e] / dl, -4, 3) : 0) + 4;
            y[32 + 32 * (e / 128) + e % 32] |= (uint8_t)((u & 3) << (2 * ((e / 32) % 4)));
            y[e % 32] |= (uint8_t)((u >> 2) << (e / 32));
        }
    }
}

// Q4_K and Q5_K: 8 sub-blocks of 32, min/max fit to 0..nmax, step and minimum in 6 bits against
// d = max step/63 and dmin = max minimum/63. As for Q2_K: |err| <= step/2 + d/4 + nmax d/2 +
// dmin/2 with step <= 2 amax/nmax, i.e. <= 0.091 amax (Q4_K) and 0.056 amax (Q5_K), plus
// (nmax + 1) * 63 * 2^-25 when d or dmin is subnormal in fp16.
static void k_quant_q45_k(const float *x, uint8_t *y, int64_t n, bool five) {
    PSV_ASSERT(n % QK_K == 0);
    const int nmax = five ? 31 : 15;
    const size_t size = five ? K_Q5_K_SIZE : K_Q4_K_SIZE;
    for (int64_t b = 0; b < n / QK_K; b++, x += QK_K, y += size) {
        float step[8], mn[8], max_step = 0, max_mn = 0;
        for (int k = 0; k < 8; k++) {
            step[k] = k_fit_min_max(x + 32 * k, 32, nmax, &mn[k]);
            if (step[k] > max_step) max_step = step[k];
            if (mn[k] > max_mn) max_mn = mn[k];
        }
        memset(y, 0, size);
        uint8_t *s = y + 4;
        float is = max_step > 0 ? 63 / max_step : 0, im = max_mn > 0 ? 63 / max_mn : 0;
        for (int k = 0; k < 8; k++) {
            int ls = k_round_even(is * step[k], 0, 63), lm = k_round_even(im * mn[k], 0, 63);
            if (k < 4) {
                s[k] = (uint8_t)ls;
                s[k + 4] = (uint8_t)lm;
            } else {
                s[k + 4] = (uint8_t)((ls & 15) | ((lm & 15) << 4));
                s[k - 4] |= (uint8_t)((ls >> 4) << 6);
                s[k] |= (uint8_t)((lm >> 4) << 6);
            }
        }
        k_st_f16(y, max_step / 63);
        k_st_f16(y + 2, max_mn / 63);
        float d = k_ld_f16(y), dmin = k_ld_f16(y + 2);
        uint8_t *qs = five ? y + 48 : y + 16, *qh = y + 16;
        for (int k = 0; k < 8; k++) {
            int sc, m;
            k_scale_min_k4(s, k, &sc, &m);
            float dl = d * (float)sc, ml = dmin * (float)m;
            for (int l = 0; l < 32; l++) {
                int e = 32 * k + l;
                int q = dl != 0 ? k_round_even((x[e] + ml) / dl, 0, nmax) : 0;
                qs[32 * (e / 64) + l] |= (uint8_t)((q & 15) << ((k & 1) ? 4 : 0));
                if (five) qh[l] |= (uint8_t)((q >> 4) << k);
            }
        }
    }
}
static void k_quant_q4_k_ref(const float *x, void *vy, int64_t n) { k_quant_q45_k(x, vy, n, false); }
static void k_quant_q5_k_ref(const float *x, void *vy, int64_t n) { k_quant_q45_k(x, vy, n, true); }

// Q6_K: 16 sub-blocks of 16 with step -max/32 (signed absmax maps to -32), steps quantized to
// signed bytes against the largest (which maps to -128). As for Q3_K, the lopsided range costs
// up to a whole step and the scale rounding up to 31 d: <= amax/32 + 31 amax/4096 + amax 2^-11
// = 0.0393 amax, plus 4096 * 2^-25 when d is subnormal in fp16.
static void k_quant_q6_k_ref(const float *x, void *vy, int64_t n) {
    PSV_ASSERT(n % QK_K == 0);
    uint8_t *y = vy;
    for (int64_t b = 0; b < n / QK_K; b++, x += QK_K, y += K_Q6_K_SIZE) {
        float step[16], amax = 0, max_step = 0;
        for (int k = 0; k < 16; k++) {
            step[k] = k_signed_absmax(x + 16 * k, 16, NULL) / -32;
            if (psv_fabsf(step[k]) > amax) {
                amax = psv_fabsf(step[k]);
                max_step = step[k];
            }
        }
        memset(y, 0, K_Q6_K_SIZE);
        if (max_step == 0) continue; // all zero: q = -32 with zero scales decodes to 0
        float is = -128 / max_step;
        for (int k = 0; k < 16; k++) y[192 + k] = (uint8_t)(int8_t)k_round_even(is * step[k], -128, 127);
        k_st_f16(y + 208, 1 / is);
        float d = k_ld_f16(y + 208);
        const int8_t *sc = (const int8_t *)(y + 192);
        for (int e = 0; e < QK_K; e++) {
            float dl = d * (float)sc[e / 16];
            int u = (dl != 0 ? k_round_even(x[e] / dl, -32, 31) : 0) + 32;
            int h = e / 128, k = (e / 32) % 4, l = e % 32;
            y[64 * h + 32 * (k & 1) + l] |= (uint8_t)((u & 15) << (4 * (k >> 1)));
            y[128 + 32 * h + l] |= (uint8_t)((u >> 4) << (2 * k));
        }
    }
}

// ---- Traits ----------------------------------------------------------------------------------
// vec_dot_type follows ggml's CPU type traits: the 32-value formats without a minimum pair with
// Q8_0, those with one with Q8_1 (its s carries the minimum's share), the k-quants with Q8_K
// (its bsums do), and the float types with themselves. Q8_1 and Q8_K are activation-only: they
// have to_float and from_float but no vec_dot.
static const k_traits k_traits_ref_table[T_COUNT] = {
    [T_F32] = {k_dequant_f32_ref, k_quant_f32_ref, k_dot_f32_f32_ref, T_F32, NULL, NULL, NULL, NULL, NULL, 0},
    [T_F16] = {k_dequant_f16_ref, k_quant_f16_ref, k_dot_f16_f16_ref, T_F16, NULL, NULL, NULL, NULL, NULL, 0},
    [T_BF16] = {k_dequant_bf16_ref, k_quant_bf16_ref, k_dot_bf16_bf16_ref, T_BF16, NULL, NULL, NULL, NULL, NULL, 0},
    [T_Q4_0] = {k_dequant_q4_0_ref, k_quant_q4_0_ref, k_dot_q4_0_q8_0_ref, T_Q8_0, NULL, NULL, NULL, NULL, NULL, 0},
    [T_Q4_1] = {k_dequant_q4_1_ref, k_quant_q4_1_ref, k_dot_q4_1_q8_1_ref, T_Q8_1, NULL, NULL, NULL, NULL, NULL, 0},
    [T_Q5_0] = {k_dequant_q5_0_ref, k_quant_q5_0_ref, k_dot_q5_0_q8_0_ref, T_Q8_0, NULL, NULL, NULL, NULL, NULL, 0},
    [T_Q5_1] = {k_dequant_q5_1_ref, k_quant_q5_1_ref, k_dot_q5_1_q8_1_ref, T_Q8_1, NULL, NULL, NULL, NULL, NULL, 0},
    [T_Q8_0] = {k_dequant_q8_0_ref, k_quant_q8_0_ref, k_dot_q8_0_q8_0_ref, T_Q8_0, NULL, NULL, NULL, NULL, NULL, 0},
    [T_Q8_1] = {k_dequant_q8_1_ref, k_quant_q8_1_ref, NULL, T_Q8_1, NULL, NULL, NULL, NULL, NULL, 0},
    [T_Q2_K] = {k_dequant_q2_k_ref, k_quant_q2_k_ref, k_dot_q2_k_q8_k_ref, T_Q8_K, NULL, NULL, NULL, NULL, NULL, 0},
    [T_Q3_K] = {k_dequant_q3_k_ref, k_quant_q3_k_ref, k_dot_q3_k_q8_k_ref, T_Q8_K, NULL, NULL, NULL, NULL, NULL, 0},
    [T_Q4_K] = {k_dequant_q4_k_ref, k_quant_q4_k_ref, k_dot_q4_k_q8_k_ref, T_Q8_K, NULL, NULL, NULL, NULL, NULL, 0},
    [T_Q5_K] = {k_dequant_q5_k_ref, k_quant_q5_k_ref, k_dot_q5_k_q8_k_ref, T_Q8_K, NULL, NULL, NULL, NULL, NULL, 0},
    [T_Q6_K] = {k_dequant_q6_k_ref, k_quant_q6_k_ref, k_dot_q6_k_q8_k_ref, T_Q8_K, NULL, NULL, NULL, NULL, NULL, 0},
    [T_Q8_K] = {k_dequant_q8_k_ref, k_quant_q8_k_ref, NULL, T_Q8_K, NULL, NULL, NULL, NULL, NULL, 0},
};

// The reference kernels of a tensor type, or NULL when it has none (unknown id, IQ*, TQ*, ...).
// The table is immutable: safe to call from any thread.
static const k_traits *k_traits_ref(uint32_t type) {
    return type < T_COUNT && k_traits_ref_table[type].to_float ? &k_traits_ref_table[type] : NULL;
}

// ----------------------------------------------------------------------------
// 12. SIMD kernels
// x86 and AArch64 variants of the hot kernels of section 11, written with intrinsics inside
// functions compiled for their instruction set (target attributes), so a build without flags contains them
// and runs the best set the CPU has; one dispatch table per set, chosen once. Every variant is
// bit-identical to its reference kernel for every input (a NaN result may differ in payload):
// the integer sums of a block are exact in any order, and the double arithmetic that follows
// them repeats the reference's operations in the reference's order and lanes (section 11), so
// the engine computes the same logits with every set. Dequantization (to_float) stays the
// reference's in every set: the forward pass uses it for one embedding row per token.
//
// Kernel sets (PSV_KERNELS=name forces one; unset, empty or "auto" picks the best):
//   ref     section 11, any CPU
//   avx2    AVX2 + FMA + F16C (Haswell, Zen 1 and later)
//   avx512  avx2 plus AVX-512 F/BW/VL and VNNI (Ice Lake, Zen 4 and later): the integer dot
//           products use VNNI's vpdpbusd/vpdpwssd, on 256-bit vectors. Blocks are 32 bytes, and
//           Zen 4 runs a 512-bit operation as two 256-bit halves: a two-blocks-per-zmm variant of
//           the 32-value kernels measured 20-40 % slower there (more shuffles, same work). Its
//           GEMM kernels and attention's eight-keys-at-a-time dot products use 512-bit vectors
//           for the double-precision sums.
//   neon    AArch64's baseline Advanced SIMD
//   dotprod neon plus the dot product instructions (FEAT_DotProd: sdot), with GEMM kernels
//   i8mm    dotprod whose GEMM uses the int8 matrix multiply (FEAT_I8MM: smmla)
// Both x86 sets have GEMM kernels (prompts and batches of 4-5 rows or more: "GEMM panels"; AVX2's
// without Q8_0). Float dot products, quantizers, panel packers and the other element-wise kernels
// are the AVX2 ones in both. The three ARM sets share their NEON float, quantizer and
// element-wise kernels.
//
// Internal API (the engine and the CLI use these):
//   k_traits_get(type)      the kernels of the set in use (k_traits_of_set: any set, for tests)
//   k_dot_rows(...)         one weight row against many activation rows
//   k_traits.pack/.gemm     panels of 8 weight rows against many activation rows (prompts)
//   k_vec_get()             element-wise kernels: exp (softmax), SwiGLU, and attention's
//                           products over the KV cache rows (dot_keys, axpy_rows)
//   k_kernel_set_name()     "ref", "avx2", "avx512", "neon", "dotprod" or "i8mm"; k_kernel_set_note(): why PSV_KERNELS was
//                           not honoured, or NULL
//   cli_cpu()               `pensieve info --cpu`
// All x86 code is under PSV_X86 and the NEON kernels under PSV_ARM64; other targets get the
// reference set only.

typedef enum { K_SET_REF, K_SET_AVX2, K_SET_AVX512, K_SET_NEON, K_SET_DOTPROD, K_SET_I8MM, K_SET_COUNT } k_set;
static const char *const k_set_names[K_SET_COUNT] = {"ref", "avx2", "avx512", "neon", "dotprod", "i8mm"};

// Whether a CPU can run a kernel set (and this build has it).
static bool k_set_supported(k_set s, const plat_cpu *c) {
    switch (s) {
    case K_SET_REF: return true;
#if defined(PSV_X86)
    case K_SET_AVX2: return c->avx2 && c->fma && c->f16c;
    case K_SET_AVX512:
        return c->avx2 && c->fma && c->f16c && c->avx512f && c->avx512bw && c->avx512vl && c->avx512vnni;
#endif
#if defined(PSV_ARM64)
    case K_SET_NEON: return c->neon;
    case K_SET_DOTPROD: return c->neon && c->dotprod;
    case K_SET_I8MM: return c->neon && c->dotprod && c->i8mm;
#endif
    default: break;
    }
    PSV_UNUSED(c);
    return false;
}

// The fastest set a CPU supports.
static k_set k_set_best(const plat_cpu *c) {
    for (int s = K_SET_COUNT - 1; s > K_SET_REF; s--)
        if (k_set_supported((k_set)s, c)) return (k_set)s;
    return K_SET_REF;
}

// The set to use given PSV_KERNELS's value `req` (NULL, "" or "auto": the best). A request the
// CPU cannot honour, or an unknown name, falls back to the best supported set and explains why
// in `note` (empty otherwise). Pure, so tests can feed it any CPU.
static k_set k_set_choose(const char *req, const plat_cpu *c, char *note, size_t note_size) {
    if (note_size) note[0] = 0;
    k_set best = k_set_best(c);
    if (!req || !*req || !strcmp(req, "auto")) return best;
    for (int s = 0; s < K_SET_COUNT; s++) {
        if (strcmp(req, k_set_names[s]) != 0) continue;
        if (k_set_supported((k_set)s, c)) return (k_set)s;
        snprintf(note, note_size, "PSV_KERNELS=%s: this CPU lacks %s; using %s", req,
                 s == K_SET_AVX512 ? "AVX-512 F/BW/VL/VNNI" : s == K_SET_AVX2 ? "AVX2/FMA/F16C" : s == K_SET_NEON ? "NEON"
                 : s == K_SET_DOTPROD ? "NEON with the dot product instructions (FEAT_DotProd)"
                 : s == K_SET_I8MM ? "NEON with the dot product and int8 matrix instructions (FEAT_DotProd, FEAT_I8MM)" : "it",
                 k_set_names[best]);
        return best;
    }
    snprintf(note, note_size, "PSV_KERNELS=%.40s: unknown kernel set (expected auto, ref, avx2, avx512, neon, dotprod or i8mm); using %s",
             req, k_set_names[best]);
    return best;
}

// ---- GEMM panels (prompt processing) -----------------------------------------------------------
// For many activation rows at once (a prompt, or several sequences decoded together), the GEMM
// kernels take K_PANEL = 8 weight rows together, rearranged into a "panel" where one 32-byte
// vector holds four consecutive quants of each of the eight rows. One vpdpbusd of that vector
// against four activation bytes broadcast to every lane adds to eight dot products at once: no
// horizontal sums, which are most of the work of the one-row kernels. A panel is built per
// product in a thread's scratch (k_panel_pack, portable C) and reused for every activation row,
// so weights stay in place in the mmap (nothing is repacked at load time). From each block's
// exact integer sums the kernels form the reference's double terms, lane for lane and in the
// reference's order (section 11), so every result is bit-identical to vec_dot's, whatever the
// batch it is computed in.
//
// A packed block, one per weight block (lane r: weight row r of the panel; unused lanes zero):
//   q      blck_size/4 vectors of 32 bytes: vector s has quants 4s..4s+3 of each row as unsigned
//          bytes, the stored value plus the type's offset (k_panel_off: the signed types' 8, 16,
//          128, 4, 32), which the kernels take off again with the activation's sums. The 4-bit
//          types Q4_1 and Q4_K (k_panel_nibbles) keep their quant bytes as stored instead,
//          half as many vectors: vector s has bytes 4s..4s+3 of each row's quant bytes. For
//          Q4_1 (byte j holds values j and j + 16) their low nibbles are the quants of step s
//          and their high nibbles those of step s + 4; for Q4_K (byte 32c + l holds values
//          64c + l and 64c + 32 + l) vector 8c + s holds steps 16c + s and 16c + 8 + s. Packing
//          is then a transpose, and the kernels split the nibbles. Q4_0 is unpacked like the
//          others: splitting its nibbles in the kernels, once per panel vector and activation
//          rows' call, measured 2-3 % slower Q4_0 prompts with AVX-512, 8 % with AVX2.
//          The AVX-512 set groups the quants by eight instead (k_panel_g8: every panel type
//          but Q4_1): 64-byte vector j has quants 8j..8j+7 of each row (Q4_K: quant bytes
//          8j..8j+7 of its chunk), row r in bytes 8r..8r+7, so that one vpdpbusd takes eight
//          values of each row against one broadcast of eight activation bytes
//          (k_panel_regroup8 turns the four-value layout into it).
//   sc     k-quants: 16 vectors of int32, the scales of the 16 sub-blocks of 16 values (Q4_K,
//          Q5_K: each of their 8 scales of 32 values twice)
//   cor    k-quants with an offset (Q3_K, Q6_K): 8 vectors of int16 pairs, the coefficients of
//          the activation's sums of 16 values in isum (-offset * scale)
//   mco    k-quants with a minimum (Q2_K, Q4_K, Q5_K): the same for the minimum's msum (the
//          minimums). Each k-quant has one of the two.
//   dx, dm 8 doubles each: the block's scale and (types with a minimum: Q4_1, Q5_1, Q2_K, Q4_K,
//          Q5_K) its minimum's scale
// The activation side: the quantized rows as vec_dot takes them, plus k_act_side of each row
// (int16 sums of 16 consecutive quants, computed from the quants: a Q8_K row's stored bsums are
// what the reference uses for the minimums, and are used for those alone; and the block scales
// as doubles).
#define K_PANEL 8
#define K_GEMM_ROWS 4 // activation rows per kernel call (k_traits.gemm_rows), AVX2 and NEON
// AVX-512 (32 vector registers): five. Zen 5, in the cache, rows of 1024 / 4608-4864 values:
// Q4_0 264-270 / 250-254 GMAC/s with four -> 270-277 / 275-281 with five, Q4_K 256 / 259 ->
// 272 / 278; no type slower (Q4_1 156-160 either way).
#define K_GEMM_ROWS_AVX512 5
#define K_GEMM_ROWS_MAX 5

static bool k_panel_has(uint32_t type) {
    switch (type) {
    case T_Q4_0: case T_Q4_1: case T_Q5_0: case T_Q5_1: case T_Q8_0:
    case T_Q2_K: case T_Q3_K: case T_Q4_K: case T_Q5_K: case T_Q6_K: return true;
    default: return false;
    }
}

// What the packed quants carry on top of the stored value, to make them unsigned.
static int k_panel_off(uint32_t type) {
    switch (type) {
    case T_Q4_0: return 8;
    case T_Q5_0: return 16;
    case T_Q8_0: return 128;
    case T_Q3_K: return 4;
    case T_Q6_K: return 32;
    default: return 0;
    }
}

static bool k_panel_nibbles(uint32_t type) { return type == T_Q4_1 || type == T_Q4_K; }
static bool k_panel_min(uint32_t type) {
    return type == T_Q4_1 || type == T_Q5_1 || type == T_Q2_K || type == T_Q4_K || type == T_Q5_K;
}

// Offsets of the fields of a packed block, and its size.
static size_t k_panel_sc(uint32_t type) { return (size_t)type_table[type].blck_size * (k_panel_nibbles(type) ? 4 : 8); }
static size_t k_panel_cor(uint32_t type) { return k_panel_sc(type) + 16 * 32; }
static size_t k_panel_mco(uint32_t type) { return k_panel_cor(type) + (k_panel_off(type) ? 8 * 32 : 0); }
static size_t k_panel_dx(uint32_t type) {
    return type_table[type].blck_size == QK_K ? k_panel_mco(type) + (k_panel_min(type) ? 8 * 32 : 0) : k_panel_sc(type);
}
static size_t k_panel_blk(uint32_t type) { return k_panel_dx(type) + (k_panel_min(type) ? 128 : 64); }

// Bytes of a panel of rows of n values.
static size_t k_panel_size(uint32_t type, int64_t n) { return (size_t)(n / type_table[type].blck_size) * k_panel_blk(type); }

// One weight block as the panel holds it: quants plus offset in value order, sub-block scales,
// coefficients of the activation's sums of 16 (cor: in isum, mco: in msum), scales.
static void k_panel_unpack(uint32_t type, const uint8_t *x, uint8_t q[QK_K], int sc[16], int cor[16], int mco[16],
                           double *dx, double *dm) {
    int8_t v[QK_K];
    const int off = k_panel_off(type);
    int n = type_table[type].blck_size;
    switch (type) {
    case T_Q4_0: case T_Q4_1: {
        const uint8_t *qs = x + (type == T_Q4_0 ? 2 : 4);
        for (int j = 0; j < 16; j++) v[j] = (int8_t)(qs[j] & 15), v[j + 16] = (int8_t)(qs[j] >> 4);
        for (int j = 0; j < 32; j++) v[j] = (int8_t)(v[j] - (type == T_Q4_0 ? 8 : 0));
        break;
    }
    case T_Q5_0: case T_Q5_1: {
        const uint8_t *qh = x + (type == T_Q5_0 ? 2 : 4);
        for (int j = 0; j < 32; j++) v[j] = (int8_t)(k_q5_value(qh + 4, ld_u32(qh), j) - (type == T_Q5_0 ? 16 : 0));
        break;
    }
    case T_Q8_0: memcpy(v, x + 2, 32); break;
    case T_Q2_K:
        k_unpack_q2_k(x, v);
        for (int k = 0; k < 16; k++) sc[k] = x[k] & 15, mco[k] = x[k] >> 4;
        break;
    case T_Q3_K:
        k_unpack_q3_k(x, v, sc);
        for (int k = 0; k < 16; k++) cor[k] = -off * sc[k];
        break;
    case T_Q4_K: case T_Q5_K: {
        bool five = type == T_Q5_K;
        int m[8];
        int s8[8];
        k_unpack_q45_k(five ? x + 48 : x + 16, five ? x + 16 : NULL, x + 4, v, s8, m);
        for (int k = 0; k < 16; k++) sc[k] = s8[k / 2], mco[k] = m[k / 2]; // as 16 sub-blocks of 16
        break;
    }
    case T_Q6_K:
        k_unpack_q6_k(x, v);
        for (int k = 0; k < 16; k++) sc[k] = (int8_t)x[192 + k], cor[k] = -off * sc[k];
        break;
    default: PSV_ASSERT(!"k_panel_unpack: type without a panel");
    }
    for (int j = 0; j < n; j++) q[j] = (uint8_t)(v[j] + off);
    // the scales: where the reference reads them (block scale first, then the minimum's)
    size_t dpos = type == T_Q2_K ? 80 : type == T_Q3_K ? 108 : type == T_Q6_K ? 208 : 0;
    *dx = (double)k_ld_f16(x + dpos);
    *dm = k_panel_min(type) ? (double)k_ld_f16(x + dpos + 2) : 0.0;
}

// Packs nw (1..K_PANEL) weight rows of n values, row r at w + r * w_stride, into `panel`
// (k_panel_size bytes); lanes nw and up are zero.
PSV_MAYBE_UNUSED static void k_panel_pack(uint32_t type, int64_t n, const uint8_t *w, size_t w_stride, int nw, uint8_t *panel) {
    const int64_t qb = type_table[type].blck_size, nb = n / qb;
    const size_t bb = k_panel_blk(type), xs = type_table[type].type_size, dxo = k_panel_dx(type);
    PSV_ASSERT(k_panel_has(type) && n % qb == 0 && nw >= 1 && nw <= K_PANEL);
    if (nw < K_PANEL) memset(panel, 0, (size_t)nb * bb);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *pb = panel + (size_t)b * bb;
        for (int r = 0; r < nw; r++) {
            uint8_t q[QK_K];
            int sc[16] = {0}, cor[16] = {0}, mco[16] = {0};
            double dx, dm;
            const uint8_t *x = w + (size_t)r * w_stride + (size_t)b * xs;
            k_panel_unpack(type, x, q, sc, cor, mco, &dx, &dm);
            if (k_panel_nibbles(type)) { // the stored quant bytes (see above)
                const uint8_t *qs = x + (type == T_Q4_0 ? 2 : type == T_Q4_1 ? 4 : 16);
                for (int64_t s = 0; s < qb / 8; s++) memcpy(pb + 32 * s + 4 * r, qs + 4 * s, 4);
            } else {
                for (int64_t s = 0; s < qb / 4; s++) memcpy(pb + 32 * s + 4 * r, q + 4 * s, 4);
            }
            if (qb == QK_K)
                for (int k = 0; k < 16; k++) {
                    wr_u32(pb + k_panel_sc(type) + 32 * k + 4 * r, (uint32_t)sc[k]);
                    if (k_panel_off(type)) wr_u16(pb + k_panel_cor(type) + 32 * (k / 2) + 4 * r + 2 * (k % 2), (uint16_t)cor[k]);
                    if (k_panel_min(type))
                        wr_u16(pb + k_panel_mco(type) + 32 * (k / 2) + 4 * r + 2 * (k % 2), (uint16_t)mco[k]);
                }
            memcpy(pb + dxo + 8 * r, &dx, 8);
            if (k_panel_min(type)) memcpy(pb + dxo + 64 + 8 * r, &dm, 8);
        }
    }
}

// Whether set `set` packs `type` in groups of eight quants (see "GEMM panels").
PSV_MAYBE_UNUSED static bool k_panel_g8(k_set set, uint32_t type) {
    return set == K_SET_AVX512 && (type_table[type].blck_size == QK_K || !k_panel_nibbles(type));
}

// A panel of k_panel_pack's layout, of a k_panel_g8 type, rearranged in place into groups of
// eight quants: per block, the quant vectors' 32-byte vectors 2j and 2j + 1 (four quants, or
// Q4_K's quant bytes, of each row) become the 64-byte vector j (eight of each row).
PSV_MAYBE_UNUSED static void k_panel_regroup8(uint32_t type, int64_t n, uint8_t *panel) {
    const int64_t nb = n / type_table[type].blck_size;
    const size_t nq = k_panel_sc(type); // the quant vectors' bytes
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *pb = panel + (size_t)b * k_panel_blk(type), t[2048];
        PSV_ASSERT(nq <= sizeof t);
        memcpy(t, pb, nq);
        for (size_t j = 0; j < nq / 64; j++)
            for (int r = 0; r < K_PANEL; r++) {
                memcpy(pb + 64 * j + 8 * r, t + 32 * (2 * j) + 4 * r, 4);
                memcpy(pb + 64 * j + 8 * r + 4, t + 32 * (2 * j + 1) + 4 * r, 4);
            }
    }
}

// What the GEMM kernels need of a quantized activation row of n values (Q8_0, Q8_1 or Q8_K)
// besides the row ("side data", k_act_side_size bytes, 8-aligned when `side` is):
// - at 0, the int16 sums of each 16 consecutive quants (|sum| <= 16 * 128), computed from the
//   quants;
// - at k_act_side_d, each block's scale as a double (exactly the stored fp16 or float), and for
//   Q8_1 after those its s;
// - for Q8_0, at k_act_side_o, each block's -off * (sum of its 32 quants) as int32, off being
//   the weights' quant offset (k_panel_off: the integer term that takes it off, which the GEMM
//   kernels start each block's sums from);
// - for Q8_0, at k_act_side_g, K_ACT_G_BLK = 48 bytes a block for the AVX-512 GEMM, filled only
//   for products of several rows: its 32 quants, its scale as a double and the double
//   2^52 + 2^31 - o, o being that offset term (k_gemm_blk_avx512: 8-byte loads there never
//   straddle two cache lines, and one pointer a row finds all three);
// - for Q8_0, at k_act_side_x, filled only for products of one row: for each whole group of four
//   blocks, 256 bytes laid out for the one-row kernels of 32-value blocks (k_gemv1_avx512): the
//   four blocks' quants 0-15, their quants 16-31, 16 int32 with the blocks' -off * sum in lanes
//   0, 4, 8 and 12 (zero elsewhere), and 16 floats, each block's scale four times;
// - for Q8_K, with `one_row`, at k_act_side_size, 384 bytes a block for k_gemv1_q4_k_avx512: its
//   quants in the order of the Q4_K kernel's four vectors (values 0-31 with 64-95, 32-63 with
//   96-127, 128-159 with 192-223, 160-191 with 224-255), then the stored bsums 0-7 four times
//   over and bsums 8-15 four times over (16 bytes each).
#define K_ACT_G_BLK 48 // bytes a block of the AVX-512 GEMM's part of a Q8_0 row's side data
static size_t k_act_side_d(int64_t n) { return ((size_t)(n / 16) * 2 + 7) & ~(size_t)7; }
static size_t k_act_side_o(int64_t n) { return k_act_side_d(n) + (size_t)(n / 32) * 8; }
static size_t k_act_side_g(int64_t n) { return (k_act_side_o(n) + (size_t)(n / 32) * 4 + 7) & ~(size_t)7; }
static size_t k_act_side_size(uint32_t atype, int64_t n) { // a multiple of 8: rows of it stay aligned
    if (atype == T_Q8_0) return k_act_side_g(n) + (size_t)(n / 32) * K_ACT_G_BLK;
    int64_t nb = n / (atype == T_Q8_K ? QK_K : 32);
    return (k_act_side_d(n) + (size_t)nb * (atype == T_Q8_1 ? 16 : 8) + 7) & ~(size_t)7;
}
static size_t k_act_side_x(int64_t n) { return k_act_side_size(T_Q8_0, n); }
// The side data of a single row, with the part at k_act_side_x (rows of several: k_act_side_size
// apart, without it).
static size_t k_act_side_one(uint32_t atype, int64_t n) {
    const size_t x = atype == T_Q8_0 ? (size_t)(n / 128) * 256 : atype == T_Q8_K ? (size_t)(n / QK_K) * 384 : 0;
    return k_act_side_size(atype, n) + x;
}

// The side data of activation row y of type atype, for weights whose quant offset is off; the
// part at k_act_side_x only with `one_row` (the gemv1 kernels': a product of one row).
static void k_act_side(uint32_t atype, int off, const uint8_t *y, int64_t n, uint8_t *side, bool one_row) {
    const size_t bs = atype == T_Q8_K ? K_Q8_K_SIZE : atype == T_Q8_1 ? K_Q8_1_SIZE : K_Q8_0_SIZE;
    const size_t qo = atype == T_Q8_0 ? 2 : 4;
    const int64_t qb = atype == T_Q8_K ? QK_K : 32, nb = n / qb;
    int16_t *sums = (int16_t *)(void *)side;
    double *d = (double *)(void *)(side + k_act_side_d(n));
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *yb = y + (size_t)b * bs;
        const int8_t *a = (const int8_t *)(yb + qo);
        for (int64_t k = 0; k < qb / 16; k++) {
            int t = 0;
            for (int l = 0; l < 16; l++) t += a[16 * k + l];
            sums[b * (qb / 16) + k] = (int16_t)t;
        }
        d[b] = atype == T_Q8_K ? (double)k_ld_f32(yb) : (double)k_ld_f16(yb);
        if (atype == T_Q8_1) d[nb + b] = (double)k_ld_f16(yb + 2);
        if (atype == T_Q8_0) {
            int32_t o = -off * (sums[2 * b] + sums[2 * b + 1]);
            memcpy(side + k_act_side_o(n) + 4 * (size_t)b, &o, 4);
            if (!one_row) { // the AVX-512 GEMM's block: quants, scale, 2^52 + 2^31 - o
                uint8_t *g = side + k_act_side_g(n) + K_ACT_G_BLK * (size_t)b;
                const double bias = 4503601774854144.0 - (double)o;
                memcpy(g, a, 32);
                memcpy(g + 32, &d[b], 8);
                memcpy(g + 40, &bias, 8);
            }
            if (one_row && b < nb / 4 * 4) { // its part of its group's 256 bytes
                uint8_t *g = side + k_act_side_x(n) + 256 * (size_t)(b / 4);
                const int j = (int)(b % 4);
                const int32_t lanes[4] = {o, 0, 0, 0};
                const float dy = (float)d[b]; // exactly the fp16 scale
                memcpy(g + 16 * j, a, 16);
                memcpy(g + 64 + 16 * j, a + 16, 16);
                memcpy(g + 128 + 16 * j, lanes, 16);
                for (int l = 0; l < 4; l++) memcpy(g + 192 + 16 * j + 4 * l, &dy, 4);
            }
        }
        if (atype == T_Q8_K && one_row) { // the Q4_K one-row kernel's 384 bytes
            uint8_t *g = side + k_act_side_size(T_Q8_K, n) + 384 * (size_t)b;
            for (int v = 0; v < 4; v++) { // sub-blocks (0, 2), (1, 3), (4, 6), (5, 7)
                const int k0 = v < 2 ? v : v + 2;
                memcpy(g + 64 * v, a + 32 * k0, 32);
                memcpy(g + 64 * v + 32, a + 32 * (k0 + 2), 32);
            }
            for (int l = 0; l < 4; l++) { // the stored bsums, as the reference takes them
                memcpy(g + 256 + 16 * l, yb + 260, 16);
                memcpy(g + 320 + 16 * l, yb + 276, 16);
            }
        }
    }
}

#define K_INLINE static inline __attribute__((always_inline))
// Fully unrolled, so a block's vectors stay in registers (GCC keeps these 4- and 8-trip loops
// otherwise, with the vectors in memory).
// clang takes "GCC unroll" as a hint and declined it in the GEMM kernels (their registers went
// to the stack: Q4_0 prompts 2.3x slower on x86 than with full unrolling), so it is told to
// unroll fully, which needs a constant trip count (it warns otherwise).
#if defined(__clang__)
#define K_UNROLL _Pragma("clang loop unroll(full)")
#else
#define K_UNROLL _Pragma("GCC unroll 8")
#endif

// Where the GEMM kernels find an activation row y of n values and the parts of its side data
// (k_act_side): the sums of 16, the block scales and, for the 32-value types with a quant offset,
// the offset terms (else NULL).
K_INLINE void k_gemm_side(uint32_t type, int64_t n, const uint8_t *y, const uint8_t *side, const uint8_t **yr,
                          const int16_t **ar, const double **dr, const int32_t **ao) {
    *yr = y;
    *ar = (const int16_t *)(const void *)side;
    *dr = (const double *)(const void *)(side + k_act_side_d(n));
    *ao = type_table[type].blck_size == 32 && k_panel_off(type) ? (const int32_t *)(const void *)(side + k_act_side_o(n))
                                                                 : NULL;
}

// A gemv1 kernel's nw weight rows go in groups of four, one from each quarter of the rows:
// group w (0 <= w < k_gemv1_groups(nw)) is rows w + r * k_gemv1_groups(nw), r = 0..3. So the
// kernel reads four separate sequential streams, which the hardware prefetchers follow well,
// where four adjacent rows, read a block of each at a time, interleave in the same pages and
// defeat them (measured on Zen 4, Q4_0 rows of 896 values from memory: 19-20 GB/s with
// adjacent rows and software prefetch, 24-25 GB/s with quarters and none, which prefetching
// there only slowed; a plain read of four such streams: 35-39 GB/s, of the rows in order: 28-30).
// On Zen 5 the quarters gain from software prefetching in the 32-value kernels: K_GEMV1_PF.
K_INLINE int k_gemv1_groups(int nw) { return (nw + 3) / 4; }

// The rows of group w (past the end: the last row again, its result not stored).
K_INLINE void k_gemv1_rows(const uint8_t *x, size_t x_stride, int nw, int w, const uint8_t *xr[4]) {
    const int q = k_gemv1_groups(nw);
    for (int r = 0; r < 4; r++) xr[r] = x + (size_t)PSV_MIN(w + r * q, nw - 1) * x_stride;
}

// The results of group w's rows that exist, out[r] being row r's.
K_INLINE void k_gemv1_put(const float out[4], float *s, int w, int nw) {
    const int q = k_gemv1_groups(nw);
    for (int r = 0; r < 4 && w + r * q < nw; r++) s[w + r * q] = out[r];
}

// Prefetches blocks b .. b + nblk - 1 of pf's rows into the level-2 cache (which, measured on Zen
// 4, leaves the level-1 cache to the computation better than level-1 prefetches).
K_INLINE void k_prefetch_blks(const k_prefetch *pf, int64_t b, int64_t nblk) {
    for (int r = 0; r < pf->rows; r++) {
        const uint8_t *row = pf->p + (size_t)r * pf->stride;
        uintptr_t a = (uintptr_t)(row + (size_t)b * pf->blk) & ~(uintptr_t)63;
        for (uintptr_t end = (uintptr_t)(row + (size_t)(b + nblk) * pf->blk); a < end; a += 64)
            __builtin_prefetch((const void *)a, 0, 2);
    }
}

#if defined(PSV_X86)

#define K_AVX2 __attribute__((target("avx2,fma,f16c")))
#define K_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

// How far ahead (bytes) the one-row kernels (k_gemv1_avx512, Q4_K, Q6_K) prefetch each of their
// four row streams into the level-2 cache, a prefetch per step of each stream (per 64 bytes of
// the k-quants' blocks). The hardware prefetchers alone leave these kernels waiting on memory:
// measured on Zen 5, one thread, rows from memory, Q4_0 rows of 896 values 35 -> 41 GB/s in 1.2
// MB calls (a generation thread's share of a qwen2-0.5b feed-forward matrix) and 38 -> 43 in one
// long call, rows of 4864 values 34 -> 36 and 37 -> 42, Q5_0 34 -> 41, Q8_0 37.5 -> 39; 512
// bytes ahead was slower than none, 1024 between, 2048-4096 alike. Q4_K and Q6_K rows of 3072
// values in 2 MiB pages (as a model's mapping mostly is), medians of six: 37.9 -> 40.1 and 38.9
// -> 40.6 GB/s (in 4 KiB pages the Q4_K kernel had read 13 % slower with it in one build), and
// phi4-mini Q4_K_M generation with one thread 14.3 -> 15.1 t/s (gcc), 13.9 -> 15.3 (clang).
#define K_GEMV1_PF 2048

// A prefetch of the line `ahead` bytes past p, into the level-2 cache. The address may lie past
// the tensor (the last stream's last rows): a prefetch never faults, and it is formed as an
// integer, not as a pointer past the object.
K_INLINE void k_prefetch_ahead(const uint8_t *p, size_t ahead) {
    __builtin_prefetch((const void *)((uintptr_t)p + ahead), 0, 2);
}

// ---- AVX2 helpers ----------------------------------------------------------------------------

// As k_no_fuse, for four doubles.
K_AVX2 K_INLINE __m256d k_no_fuse_pd_avx2(__m256d v) {
    __asm__("" : "+x"(v));
    return v;
}

K_AVX2 K_INLINE int32_t k_hsum_i32_avx2(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

// The lane sums of four vectors: {sum a, sum b, sum c, sum d}.
K_AVX2 K_INLINE __m128i k_hsum4_i32_avx2(__m256i a, __m256i b, __m256i c, __m256i d) {
    __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

K_AVX2 K_INLINE float k_f16_avx2(const uint8_t *p) { return _cvtsh_ss(ld_u16(p)); }

// Four fp16 values' bits, p0's in the low 16 (for a vector conversion of four at a time).
static inline uint64_t k_f16x4_bits(const uint8_t *p0, const uint8_t *p1, const uint8_t *p2, const uint8_t *p3) {
    return (uint64_t)ld_u16(p0) | (uint64_t)ld_u16(p1) << 16 | (uint64_t)ld_u16(p2) << 32 | (uint64_t)ld_u16(p3) << 48;
}

// Four fp16 values to floats (F16C converts exactly, like psv_fp16_to_f32). Gathered in a
// general register, which keeps the vector shuffle units free (measured: 10 % faster Q4_0 than
// inserting words, 25 % faster than a hardware gather, on Zen 4).
K_AVX2 K_INLINE __m128 k_f16x4_avx2(const uint8_t *p0, const uint8_t *p1, const uint8_t *p2, const uint8_t *p3) {
    return _mm_cvtph_ps(_mm_set_epi64x(0, (long long)k_f16x4_bits(p0, p1, p2, p3)));
}

K_AVX2 K_INLINE __m256i k_load256(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)(const void *)p); }
K_AVX2 K_INLINE __m128i k_load128(const uint8_t *p) { return _mm_loadu_si128((const __m128i *)(const void *)p); }

// Bit j of qh (j < 32) as byte j of the result: 0xff when set, 0 when clear.
K_AVX2 K_INLINE __m256i k_bits_to_bytes_avx2(uint32_t qh) {
    const __m256i shuf = _mm256_setr_epi64x(0, 0x0101010101010101ll, 0x0202020202020202ll, 0x0303030303030303ll);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), shuf);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

// ---- AVX2: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 against Q8_0 / Q8_1 -----------------------------------
// One weight block unpacks to 32 quants in value order: unsigned bytes for Q4/Q5 (Q4_0 and Q5_0
// keep their +8/+16 offset: maddubs needs an unsigned operand, and the offset is taken off as
// offset * sum(a), since the activation may hold -128, whose negation does not fit a byte), or
// Q8_0 widened to int16. Its dot with an activation block is 8 int32 lanes summing to the
// reference's isum; all intermediate sums stay far inside int16/int32 (bounds at each step).
// Blocks are handled four at a time so that one horizontal reduction serves four blocks; the
// terms are then formed in double exactly as the reference forms them, four at a time in a
// vector, and added to the K_BLOCK_LANES lanes of the reference, one per vector element.

typedef struct { __m256i a, b; } k_w32_avx2;

K_AVX2 K_INLINE k_w32_avx2 k_w32_unpack_avx2(uint32_t type, const uint8_t *x) {
    const __m256i m4 = _mm256_set1_epi8(15);
    k_w32_avx2 w;
    w.b = _mm256_setzero_si256();
    if (type == T_Q8_0) {
        __m256i q = k_load256(x + 2);
        w.a = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q));
        w.b = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1));
        return w;
    }
    const int qs = type == T_Q4_0 ? 2 : type == T_Q4_1 ? 4 : type == T_Q5_0 ? 6 : 8;
    // the 16 bytes in both halves, the high half shifted down by a nibble (no lane crossing)
    __m256i raw = _mm256_broadcastsi128_si256(k_load128(x + qs));
    w.a = _mm256_and_si256(_mm256_blend_epi32(raw, _mm256_srli_epi16(raw, 4), 0xf0), m4);
    if (type == T_Q5_0 || type == T_Q5_1) {
        __m256i hb = k_bits_to_bytes_avx2(ld_u32(x + qs - 4));
        w.a = _mm256_or_si256(w.a, _mm256_and_si256(hb, _mm256_set1_epi8(16)));
    }
    return w;
}

// The block's products: for Q8_0, 8 int32 lanes (|pair| <= 2*128*128); for Q4/Q5, 16 int16
// lanes each the sum of two products. Those pair sums are q*a <= 2*31*128 = 7936 in magnitude,
// and for Q4_0/Q5_0 (q - off)*a <= 2*16*128 = 4096 (so subtracting off*a in int16 is exact), and
// four of them still fit int16 (31744), which k_hsum4_i16_avx2 relies on.
K_AVX2 K_INLINE __m256i k_w32_dot_avx2(uint32_t type, k_w32_avx2 w, const uint8_t *yb) {
    if (type == T_Q8_0) {
        __m256i a = k_load256(yb + 2);
        __m256i lo = _mm256_madd_epi16(w.a, _mm256_cvtepi8_epi16(_mm256_castsi256_si128(a)));
        __m256i hi = _mm256_madd_epi16(w.b, _mm256_cvtepi8_epi16(_mm256_extracti128_si256(a, 1)));
        return _mm256_add_epi32(lo, hi);
    }
    bool q81 = type == T_Q4_1 || type == T_Q5_1;
    __m256i a = k_load256(yb + (q81 ? 4 : 2));
    __m256i p = _mm256_maddubs_epi16(w.a, a);
    if (type == T_Q4_0) p = _mm256_sub_epi16(p, _mm256_maddubs_epi16(_mm256_set1_epi8(8), a));
    if (type == T_Q5_0) p = _mm256_sub_epi16(p, _mm256_maddubs_epi16(_mm256_set1_epi8(16), a));
    return p;
}

// The sums of four blocks' int16 pair sums (k_w32_dot_avx2): two rounds of pairwise adds in
// int16 (each lane then holds at most 4 pair sums, see there), then int32.
K_AVX2 K_INLINE __m128i k_hsum4_i16_avx2(__m256i a, __m256i b, __m256i c, __m256i d) {
    __m256i h = _mm256_hadd_epi16(_mm256_hadd_epi16(a, b), _mm256_hadd_epi16(c, d));
    h = _mm256_madd_epi16(h, _mm256_set1_epi16(1));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

// The block's isum from k_w32_dot_avx2's lanes.
K_AVX2 K_INLINE int32_t k_w32_isum_avx2(uint32_t type, __m256i v) {
    return k_hsum_i32_avx2(type == T_Q8_0 ? v : _mm256_madd_epi16(v, _mm256_set1_epi16(1)));
}

// Bytes per block of a 32-value weight type and of its activation type.
K_INLINE size_t k_w32_size(uint32_t type) { return type_table[type].type_size; }
K_INLINE size_t k_a32_size(uint32_t type) { return type == T_Q4_1 || type == T_Q5_1 ? K_Q8_1_SIZE : K_Q8_0_SIZE; }

// Shared body of the 32-value dot products: weight row x against nr activation rows.
K_AVX2 K_INLINE void k_rows32_avx2(uint32_t type, int64_t n, float *s, int64_t ss, const uint8_t *x,
                                   const uint8_t *y, size_t ys, int nr) {
    PSV_ASSERT(n % 32 == 0);
    const size_t xs = k_w32_size(type), as = k_a32_size(type);
    const bool min = type == T_Q4_1 || type == T_Q5_1;
    const int64_t nb = n / 32;
    __m256d accv[K_ROWS_MAX]; // the K_BLOCK_LANES lanes of each row
    for (int r = 0; r < nr; r++) accv[r] = _mm256_setzero_pd();
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4) {
        const uint8_t *xb = x + (size_t)b * xs;
        k_w32_avx2 w0 = k_w32_unpack_avx2(type, xb), w1 = k_w32_unpack_avx2(type, xb + xs);
        k_w32_avx2 w2 = k_w32_unpack_avx2(type, xb + 2 * xs), w3 = k_w32_unpack_avx2(type, xb + 3 * xs);
        __m256d dx = _mm256_cvtps_pd(k_f16x4_avx2(xb, xb + xs, xb + 2 * xs, xb + 3 * xs)), mx = dx;
        if (min) mx = _mm256_cvtps_pd(k_f16x4_avx2(xb + 2, xb + xs + 2, xb + 2 * xs + 2, xb + 3 * xs + 2));
        for (int r = 0; r < nr; r++) {
            const uint8_t *yb = y + (size_t)r * ys + (size_t)b * as;
            __m256i p0 = k_w32_dot_avx2(type, w0, yb), p1 = k_w32_dot_avx2(type, w1, yb + as);
            __m256i p2 = k_w32_dot_avx2(type, w2, yb + 2 * as), p3 = k_w32_dot_avx2(type, w3, yb + 3 * as);
            __m128i is = type == T_Q8_0 ? k_hsum4_i32_avx2(p0, p1, p2, p3) : k_hsum4_i16_avx2(p0, p1, p2, p3);
            __m256d dy = _mm256_cvtps_pd(k_f16x4_avx2(yb, yb + as, yb + 2 * as, yb + 3 * as));
            // reference: (double)dx * (double)dy * (double)isum [+ (double)mx * (double)sy]
            __m256d t = _mm256_mul_pd(_mm256_mul_pd(dx, dy), _mm256_cvtepi32_pd(is));
            if (min) {
                __m256d sy = _mm256_cvtps_pd(k_f16x4_avx2(yb + 2, yb + as + 2, yb + 2 * as + 2, yb + 3 * as + 2));
                t = _mm256_add_pd(t, _mm256_mul_pd(mx, sy));
            }
            accv[r] = _mm256_add_pd(accv[r], k_no_fuse_pd_avx2(t));
        }
    }
    double acc[K_ROWS_MAX][K_BLOCK_LANES];
    for (int r = 0; r < nr; r++) _mm256_storeu_pd(acc[r], accv[r]);
    for (; b < nb; b++) {
        const uint8_t *xb = x + (size_t)b * xs;
        k_w32_avx2 w = k_w32_unpack_avx2(type, xb);
        for (int r = 0; r < nr; r++) {
            const uint8_t *yb = y + (size_t)r * ys + (size_t)b * as;
            int32_t isum = k_w32_isum_avx2(type, k_w32_dot_avx2(type, w, yb));
            double t = (double)k_f16_avx2(xb) * (double)k_f16_avx2(yb) * (double)isum;
            if (min) t += (double)k_f16_avx2(xb + 2) * (double)k_f16_avx2(yb + 2);
            acc[r][b % K_BLOCK_LANES] += k_no_fuse(t);
        }
    }
    for (int r = 0; r < nr; r++) s[r * ss] = k_lanes_sum(acc[r], K_BLOCK_LANES);
}

// One kernel per type and a rows variant dispatching nr to constant-count copies.
#define K_DEF_ROWS(name, core, type, tgt)                                                                  \
    tgt static void k_dot_##name(int64_t n, float *s, const void *x, const void *y) {                     \
        core(type, n, s, 0, x, y, 0, 1);                                                                   \
    }                                                                                                      \
    tgt static void k_dot_rows_##name(int64_t n, float *s, int64_t ss, const void *x, const void *y,      \
                                      size_t ys, int nr) {                                                 \
        PSV_ASSERT(nr >= 1 && nr <= K_ROWS_MAX);                                                           \
        switch (nr) {                                                                                      \
        case 1: core(type, n, s, ss, x, y, ys, 1); break;                                                  \
        case 2: core(type, n, s, ss, x, y, ys, 2); break;                                                  \
        case 3: core(type, n, s, ss, x, y, ys, 3); break;                                                  \
        default: core(type, n, s, ss, x, y, ys, 4); break;                                                 \
        }                                                                                                  \
    }

K_DEF_ROWS(q4_0_q8_0_avx2, k_rows32_avx2, T_Q4_0, K_AVX2)
K_DEF_ROWS(q4_1_q8_1_avx2, k_rows32_avx2, T_Q4_1, K_AVX2)
K_DEF_ROWS(q5_0_q8_0_avx2, k_rows32_avx2, T_Q5_0, K_AVX2)
K_DEF_ROWS(q5_1_q8_1_avx2, k_rows32_avx2, T_Q5_1, K_AVX2)
K_DEF_ROWS(q8_0_q8_0_avx2, k_rows32_avx2, T_Q8_0, K_AVX2)

// ---- AVX2: generation of one sequence (gemv1) ---------------------------------------------------
// The group's results: each row's four lanes (a[l], element r: row r) added in order, lane 0
// first (k_lanes_sum), rounded to float and stored for the rows that exist.
K_AVX2 K_INLINE void k_gemv1_store(const __m256d a[K_BLOCK_LANES], float *s, int w, int nw) {
    __m256d sum = _mm256_add_pd(_mm256_add_pd(_mm256_add_pd(a[0], a[1]), a[2]), a[3]);
    float out[4];
    _mm_storeu_ps(out, _mm256_cvtpd_ps(sum));
    k_gemv1_put(out, s, w, nw);
}

// In each 128-bit lane, [sum of r[0]'s four int32, r[1]'s, r[2]'s, r[3]'s] (a transpose and add).
K_AVX2 K_INLINE __m256i k_sum4_lanes_avx2(__m256i r0, __m256i r1, __m256i r2, __m256i r3) {
    const __m256i t0 = _mm256_add_epi32(_mm256_unpacklo_epi32(r0, r1), _mm256_unpackhi_epi32(r0, r1));
    const __m256i t1 = _mm256_add_epi32(_mm256_unpacklo_epi32(r2, r3), _mm256_unpackhi_epi32(r2, r3));
    return _mm256_add_epi32(_mm256_unpacklo_epi64(t0, t1), _mm256_unpackhi_epi64(t0, t1));
}

// k_gemv1_fn for Q4_0 and Q8_0 on AVX2, as k_gemv1_avx512 does it with AVX-512: four weight rows
// (one from each quarter, k_gemv1_rows) and four blocks a step, so that what depends only on the
// activation is done once for four rows and the reductions and double terms once for four rows
// and blocks, in [block][row] order: two blocks a vector, a block's four rows in each 128-bit
// lane. Q4_0: a vector holds the quants of two blocks (16 bytes each), whose low and high
// nibbles meet the activation's values 0-15 and 16-31 of the same blocks as the side data lays
// them out (k_act_side_x); vpmaddubsw multiplies the unsigned nibbles (|pair| <= 2 * 15 * 128)
// and the offset comes off through the side data's -8 * sum(a) per block. Q8_0: both operands
// are signed (the activation may hold -128), so each block's quants are widened to int16 and
// multiplied with vpmaddwd, against the activation block widened once for the four rows. The
// terms, (float)(dx * dy) (exact: two fp16 values) times isum, are added with one FMA each, as
// the AVX-512 kernels do (the product is exact in double: see k_gemm_blk_avx512).
K_AVX2 K_INLINE void k_gemv1_avx2(uint32_t type, int64_t n, float *s, const uint8_t *x, size_t x_stride, int nw,
                                  const uint8_t *y, const uint8_t *side) {
    PSV_ASSERT(n % 32 == 0 && nw >= 1 && (type == T_Q4_0 || type == T_Q8_0));
    const bool eight = type == T_Q8_0;
    const size_t xs = k_w32_size(type);
    const int64_t nb = n / 32, ng = nb / 4;
    const uint8_t *so = side + k_act_side_o(n); // int32 -8 * sum(a) of each block (Q4_0)
    const double *dy = (const double *)(const void *)(side + k_act_side_d(n));
    const __m256i m4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    const __m256i spread01 = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1), spread23 = _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3);
    for (int w = 0; w < k_gemv1_groups(nw); w++) {
        const uint8_t *xr[4];
        k_gemv1_rows(x, x_stride, nw, w, xr);
        __m256d acc[K_BLOCK_LANES]; // lane l of the four rows
        for (int l = 0; l < K_BLOCK_LANES; l++) acc[l] = _mm256_setzero_pd();
        for (int64_t g = 0; g < ng; g++) {
            const uint8_t *xg = side + k_act_side_x(n) + 256 * (size_t)g; // the activation's part
            __m256i is01, is23;                                            // [block][row] isums
            __m256i t01[4], t23[4];                                        // per row: blocks 0, 1 (2, 3) in its lanes
            if (eight) {
                __m256i alo[4], ahi[4];
                K_UNROLL
                for (int j = 0; j < 4; j++) {
                    const uint8_t *yb = y + (size_t)(4 * g + j) * K_Q8_0_SIZE + 2;
                    alo[j] = _mm256_cvtepi8_epi16(k_load128(yb));
                    ahi[j] = _mm256_cvtepi8_epi16(k_load128(yb + 16));
                }
                K_UNROLL
                for (int r = 0; r < 4; r++) {
                    const uint8_t *xb = xr[r] + (size_t)g * 4 * xs;
                    for (size_t o = 0; o < 4 * xs; o += 64) k_prefetch_ahead(xb + o, K_GEMV1_PF); // 136 bytes: 3 lines
                    __m256i d[4];
                    K_UNROLL
                    for (int j = 0; j < 4; j++) {
                        const uint8_t *q = xb + (size_t)j * xs + 2;
                        d[j] = _mm256_add_epi32(_mm256_madd_epi16(_mm256_cvtepi8_epi16(k_load128(q)), alo[j]),
                                                _mm256_madd_epi16(_mm256_cvtepi8_epi16(k_load128(q + 16)), ahi[j]));
                    }
                    // blocks 0 and 1 (2 and 3): the two halves of each added, block 0 in the low lane
                    t01[r] = _mm256_add_epi32(_mm256_permute2x128_si256(d[0], d[1], 0x20), _mm256_permute2x128_si256(d[0], d[1], 0x31));
                    t23[r] = _mm256_add_epi32(_mm256_permute2x128_si256(d[2], d[3], 0x20), _mm256_permute2x128_si256(d[2], d[3], 0x31));
                }
                is01 = k_sum4_lanes_avx2(t01[0], t01[1], t01[2], t01[3]);
                is23 = k_sum4_lanes_avx2(t23[0], t23[1], t23[2], t23[3]);
            } else {
                const __m256i alo01 = k_load256(xg), alo23 = k_load256(xg + 32);
                const __m256i ahi01 = k_load256(xg + 64), ahi23 = k_load256(xg + 96);
                K_UNROLL
                for (int r = 0; r < 4; r++) {
                    const uint8_t *xb = xr[r] + (size_t)g * 4 * xs;
                    k_prefetch_ahead(xb, K_GEMV1_PF); // a step reads 72 bytes: 8 lines in 9 are asked for
                    const __m256i w01 = _mm256_inserti128_si256(_mm256_castsi128_si256(k_load128(xb + 2)), k_load128(xb + xs + 2), 1);
                    const __m256i w23 = _mm256_inserti128_si256(_mm256_castsi128_si256(k_load128(xb + 2 * xs + 2)),
                                                                k_load128(xb + 3 * xs + 2), 1);
                    // int16 pair sums: |lo + hi| <= 4 * 15 * 128
                    const __m256i p01 = _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_and_si256(w01, m4), alo01),
                                                         _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(w01, 4), m4), ahi01));
                    const __m256i p23 = _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_and_si256(w23, m4), alo23),
                                                         _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(w23, 4), m4), ahi23));
                    t01[r] = _mm256_madd_epi16(p01, ones);
                    t23[r] = _mm256_madd_epi16(p23, ones);
                }
                const __m256i o = _mm256_castsi128_si256(k_load128(so + 16 * (size_t)g));
                is01 = _mm256_add_epi32(k_sum4_lanes_avx2(t01[0], t01[1], t01[2], t01[3]), _mm256_permutevar8x32_epi32(o, spread01));
                is23 = _mm256_add_epi32(k_sum4_lanes_avx2(t23[0], t23[1], t23[2], t23[3]), _mm256_permutevar8x32_epi32(o, spread23));
            }
            uint64_t h[4]; // block j's scales of the four rows
            K_UNROLL
            for (int j = 0; j < 4; j++) {
                const size_t o = (size_t)(4 * g + j) * xs;
                h[j] = k_f16x4_bits(xr[0] + o, xr[1] + o, xr[2] + o, xr[3] + o);
            }
            // the side data's scales: each block's four times, in [block][row] order
            const __m256 dxy01 = _mm256_mul_ps(_mm256_cvtph_ps(_mm_set_epi64x((long long)h[1], (long long)h[0])),
                                               _mm256_loadu_ps((const float *)(const void *)(xg + 192)));
            const __m256 dxy23 = _mm256_mul_ps(_mm256_cvtph_ps(_mm_set_epi64x((long long)h[3], (long long)h[2])),
                                               _mm256_loadu_ps((const float *)(const void *)(xg + 224)));
            acc[0] = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(dxy01)), _mm256_cvtepi32_pd(_mm256_castsi256_si128(is01)), acc[0]);
            acc[1] = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(dxy01, 1)), _mm256_cvtepi32_pd(_mm256_extracti128_si256(is01, 1)), acc[1]);
            acc[2] = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(dxy23)), _mm256_cvtepi32_pd(_mm256_castsi256_si128(is23)), acc[2]);
            acc[3] = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(dxy23, 1)), _mm256_cvtepi32_pd(_mm256_extracti128_si256(is23, 1)), acc[3]);
        }
        double a[K_BLOCK_LANES][4]; // [lane][row]
        for (int l = 0; l < K_BLOCK_LANES; l++) _mm256_storeu_pd(a[l], acc[l]);
        for (int64_t c = ng * 4; c < nb; c++) { // the last blocks, one by one
            const uint8_t *yc = y + (size_t)c * K_Q8_0_SIZE;
            for (int r = 0; r < 4; r++) {
                const uint8_t *xb = xr[r] + (size_t)c * xs;
                int32_t isum = k_w32_isum_avx2(type, k_w32_dot_avx2(type, k_w32_unpack_avx2(type, xb), yc));
                a[c % 4][r] += k_no_fuse((double)k_f16_avx2(xb) * dy[c] * (double)isum);
            }
        }
        const __m256d lanes[K_BLOCK_LANES] = {_mm256_loadu_pd(a[0]), _mm256_loadu_pd(a[1]), _mm256_loadu_pd(a[2]),
                                              _mm256_loadu_pd(a[3])};
        k_gemv1_store(lanes, s, w, nw);
    }
}

K_AVX2 static void k_gemv1_q4_0_avx2(int64_t n, float *s, const uint8_t *x, size_t x_stride, int nw, const uint8_t *y,
                                     const uint8_t *side) {
    k_gemv1_avx2(T_Q4_0, n, s, x, x_stride, nw, y, side);
}
K_AVX2 static void k_gemv1_q8_0_avx2(int64_t n, float *s, const uint8_t *x, size_t x_stride, int nw, const uint8_t *y,
                                     const uint8_t *side) {
    k_gemv1_avx2(T_Q8_0, n, s, x, x_stride, nw, y, side);
}

// ---- AVX2: k-quants against Q8_K ---------------------------------------------------------------
// A 256-value block unpacks to eight 32-byte chunks of unsigned quants in value order (Q3_K and
// Q6_K with their +4/+32 offset, taken off as offset * sum(a) per 16 values) and, per chunk, a
// vector of int16 sub-block scales (Q2_K, Q3_K, Q6_K: the low 8 lanes for the chunk's first 16
// values, the high 8 for the next 16; Q4_K, Q5_K: one scale for all 32). A chunk's dot is
// madd(maddubs(q, a) - off*maddubs(1, a), scales): every int16 pair sum is below 2^15 (bounds
// per type), and the int32 lanes add up to the reference's isum. The minimum of Q2_K, Q4_K and
// Q5_K uses Q8_K's bsums, as the reference does.

typedef struct {
    __m256i q[8];   // quants, chunk c = values 32c .. 32c+31
    __m256i sc[8];  // int16 scales for chunk c
    __m256i mins;   // int16 minimum per 16 activation values (Q2_K, Q4_K, Q5_K), paired with bsums
    __m256i s16;    // the 16 sub-block scales as int16, in order (Q2_K, Q3_K, Q6_K)
    __m128i sc8;    // Q4_K, Q5_K: the 8 sub-block scales as bytes 0..7
    bool sub32;     // Q4_K, Q5_K: sub-blocks of 32 values, one chunk each
    float d, dmin;
    int off;        // quant offset (Q3_K 4, Q6_K 32, others 0)
} k_wk_avx2;

// Chunk c's scale vector from 16 int16 scales S (sub-block k in lane k): lanes 0-7 = S[2c],
// lanes 8-15 = S[2c + 1]. (For Q4_K/Q5_K, S holds each of the 8 scales twice.)
K_AVX2 K_INLINE __m256i k_sc_chunk_avx2(__m256i s16, int c) {
    const __m256i pick = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                                          2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
    return _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(s16, _mm256_set1_epi32(c)), pick);
}

// k_scale_min_k4 of all eight sub-blocks of the Q4_K/Q5_K block at x, four bytes at a time: the
// scales to bytes 0-7 of *sc8, the minimums to bytes 0-7 of *m8 (the upper bytes zero). Scales
// 0-3 and mins 0-3 are the low six bits of bytes 0-3 and 4-7; scales 4-7 (mins 4-7) are the low
// (high) nibbles of bytes 8-11 with the top two bits of bytes 0-3 (4-7) above them.
K_AVX2 K_INLINE void k_scale_min_k4_avx2(const uint8_t *x, __m128i *sc8, __m128i *m8) {
    uint32_t u0 = ld_u32(x + 4), u1 = ld_u32(x + 8), u2 = ld_u32(x + 12);
    uint32_t sc_lo = u0 & 0x3f3f3f3fu, m_lo = u1 & 0x3f3f3f3fu;
    uint32_t sc_hi = (u2 & 0x0f0f0f0fu) | ((u0 >> 2) & 0x30303030u);
    uint32_t m_hi = ((u2 >> 4) & 0x0f0f0f0fu) | ((u1 >> 2) & 0x30303030u);
    // built as 64-bit moves (measured when the one-row Q4_K kernel used this: 9 % faster than
    // inserting four lanes)
    *sc8 = _mm_cvtsi64_si128((long long)((uint64_t)sc_lo | (uint64_t)sc_hi << 32));
    *m8 = _mm_cvtsi64_si128((long long)((uint64_t)m_lo | (uint64_t)m_hi << 32));
}

// The quants, minimums and scales of a block; returns the 16 int16 sub-block scales (sub-block
// k in lane k; Q4_K/Q5_K: each of the 8 scales twice). w->sc is left unset.
K_AVX2 K_INLINE __m256i k_wk_unpack_q_avx2(uint32_t type, const uint8_t *x, k_wk_avx2 *w) {
    const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3), m1 = _mm256_set1_epi8(1);
    const __m128i m4x = _mm_set1_epi8(15);
    __m256i s16;
    w->off = 0;
    w->dmin = 0;
    w->sub32 = false;
    w->sc8 = _mm_setzero_si128(); // (set for Q4_K/Q5_K; gcc -O1 could not tell it is read only then)
    w->mins = _mm256_setzero_si256();
    if (type == T_Q2_K) {
        // value 128h + 32j + l: bits 2j of qs[32h + l]; sub-block k: scale x[k] & 15, min x[k] >> 4
        K_UNROLL
        for (int h = 0; h < 2; h++) {
            __m256i qs = k_load256(x + 16 + 32 * h);
            K_UNROLL
            for (int j = 0; j < 4; j++) w->q[4 * h + j] = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * j), m2);
        }
        __m128i sm = k_load128(x);
        s16 = _mm256_cvtepu8_epi16(_mm_and_si128(sm, m4x));
        w->mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sm, 4), m4x));
        w->d = k_f16_avx2(x + 80);
        w->dmin = k_f16_avx2(x + 82);
    } else if (type == T_Q3_K) {
        // value 128h + 32j + l: low bits 2j of qs[32h + l], high bit 4h + j of hmask[l]
        __m256i hm = k_load256(x);
        K_UNROLL
        for (int h = 0; h < 2; h++) {
            __m256i qs = k_load256(x + 32 + 32 * h);
            K_UNROLL
            for (int j = 0; j < 4; j++) {
                __m256i lo = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * j), m2);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + j), m1);
                w->q[4 * h + j] = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 2));
            }
        }
        // k_unpack_q3_k's scales, four bytes at a time: sub-block k's low nibble is byte k % 8
        // of scales[0..7] (low nibble for k < 8, high for k >= 8), its top two bits are bits
        // 2(k/4) of scales[8 + k % 4]
        uint32_t a0 = ld_u32(x + 96), a1 = ld_u32(x + 100), t = ld_u32(x + 104);
        uint32_t s0 = (a0 & 0x0f0f0f0fu) | ((t & 0x03030303u) << 4);
        uint32_t s1 = (a1 & 0x0f0f0f0fu) | (((t >> 2) & 0x03030303u) << 4);
        uint32_t s2 = ((a0 >> 4) & 0x0f0f0f0fu) | (((t >> 4) & 0x03030303u) << 4);
        uint32_t s3 = ((a1 >> 4) & 0x0f0f0f0fu) | (((t >> 6) & 0x03030303u) << 4);
        __m128i sb = _mm_sub_epi8(_mm_setr_epi32((int)s0, (int)s1, (int)s2, (int)s3), _mm_set1_epi8(32));
        s16 = _mm256_cvtepi8_epi16(sb);
        w->d = k_f16_avx2(x + 108);
        w->off = 4;
    } else if (type == T_Q4_K || type == T_Q5_K) {
        // value 64c + l: low nibble of qs[32c + l], 64c + 32 + l: high nibble; Q5_K: bit e/32 of qh[l]
        bool five = type == T_Q5_K;
        const uint8_t *qs = x + (five ? 48 : 16);
        __m256i hb = five ? k_load256(x + 16) : _mm256_setzero_si256();
        K_UNROLL
        for (int c = 0; c < 4; c++) {
            __m256i raw = k_load256(qs + 32 * c);
            __m256i lo = _mm256_and_si256(raw, m4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
            if (five) {
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(hb, m1), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 1), m1), 4));
                hb = _mm256_srli_epi16(hb, 2);
            }
            w->q[2 * c] = lo;
            w->q[2 * c + 1] = hi;
        }
        __m128i sc8, m8;
        k_scale_min_k4_avx2(x, &sc8, &m8);
        w->sc8 = sc8;
        w->sub32 = true;
        s16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(sc8, sc8)); // each scale twice: one per 16 values
        w->mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
        w->d = k_f16_avx2(x);
        w->dmin = k_f16_avx2(x + 2);
    } else { // T_Q6_K
        // value 128h + 32k + l: nibble 4(k>>1) of ql[64h + 32(k&1) + l], bits 2k of qh[32h + l]
        K_UNROLL
        for (int h = 0; h < 2; h++) {
            __m256i ql0 = k_load256(x + 64 * h), ql1 = k_load256(x + 64 * h + 32), qh = k_load256(x + 128 + 32 * h);
            K_UNROLL
            for (int k = 0; k < 4; k++) {
                __m256i ql = (k & 1) ? ql1 : ql0;
                __m256i lo = _mm256_and_si256(k >> 1 ? _mm256_srli_epi16(ql, 4) : ql, m4);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), m2);
                w->q[4 * h + k] = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
            }
        }
        s16 = _mm256_cvtepi8_epi16(k_load128(x + 192));
        w->d = k_f16_avx2(x + 208);
        w->off = 32;
    }
    return s16;
}

K_AVX2 K_INLINE void k_wk_unpack_avx2(uint32_t type, const uint8_t *x, k_wk_avx2 *w) {
    __m256i s16 = k_wk_unpack_q_avx2(type, x, w);
    w->s16 = s16;
    K_UNROLL
    for (int c = 0; c < 8; c++) w->sc[c] = k_sc_chunk_avx2(s16, c);
}

// An unpacked block against an activation block: 8 int32 lanes summing to isum (*iv) and, for
// the formats with a minimum, to msum through the activation's bsums (*mv).
// Pair bounds: q*a <= 2*63*128 = 16128, off*a <= 2*32*128 = 8192, (q - off)*a <= 8192.
// With sums (the activation block's 16 sums of 16 from its side data), the offset is taken off
// once per block as off * sum_k(scale_k * sum_k) instead of once per chunk; every intermediate
// stays inside int32 (|sum_k| <= 2048, |scale| <= 128: the correction is below 2^28).
K_AVX2 K_INLINE __m256i k_wk_off_avx2(const k_wk_avx2 *w, __m256i acc, const uint8_t *sums) {
    __m256i corr = _mm256_madd_epi16(w->s16, k_load256(sums));
    return _mm256_sub_epi32(acc, w->off == 32 ? _mm256_slli_epi32(corr, 5) : _mm256_mullo_epi32(corr, _mm256_set1_epi32(w->off)));
}

K_AVX2 K_INLINE void k_wk_dot_avx2(const k_wk_avx2 *w, const uint8_t *yb, const uint8_t *sums, bool has_min, __m256i *iv,
                                   __m256i *mv) {
    const uint8_t *a = yb + 4;
    __m256i acc = _mm256_setzero_si256();
    const __m256i off = _mm256_set1_epi8((char)w->off);
    K_UNROLL
    for (int c = 0; c < 8; c++) {
        __m256i av = k_load256(a + 32 * c);
        __m256i p = _mm256_maddubs_epi16(w->q[c], av);
        if (w->off && !sums) p = _mm256_sub_epi16(p, _mm256_maddubs_epi16(off, av));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, w->sc[c]));
    }
    if (w->off && sums) acc = k_wk_off_avx2(w, acc, sums);
    *iv = acc;
    *mv = has_min ? _mm256_madd_epi16(w->mins, k_load256(yb + 260)) : _mm256_setzero_si256();
}

// {sum a, sum b} in one reduction.
K_AVX2 K_INLINE void k_hsum2_i32_avx2(__m256i a, __m256i b, int32_t *sa, int32_t *sb) {
    __m256i h = _mm256_hadd_epi32(a, b);
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    t = _mm_hadd_epi32(t, t);
    *sa = _mm_cvtsi128_si32(t);
    *sb = _mm_extract_epi32(t, 1);
}

// Shared body of the k-quant dot products. One row: the block's two sums in one reduction, its
// term in scalar double. Several rows: the rows' sums reduced together, and their terms formed
// side by side in a vector (element r: row r), the block lanes kept as one vector each.
#define K_DEF_ROWSK(isa, tgt)                                                                              \
    tgt K_INLINE void k_rowsk_##isa(uint32_t type, int64_t n, float *s, int64_t ss, const uint8_t *x,      \
                                    const uint8_t *y, size_t ys, const uint8_t *side, size_t side_stride,  \
                                    int nr) {                                                              \
        PSV_ASSERT(n % QK_K == 0);                                                                         \
        const size_t xs = type_table[type].type_size;                                                      \
        const bool has_min = type == T_Q2_K || type == T_Q4_K || type == T_Q5_K;                           \
        double acc1[K_BLOCK_LANES] = {0};                                                                  \
        __m256d accv[K_BLOCK_LANES];                                                                       \
        for (int l = 0; l < K_BLOCK_LANES; l++) accv[l] = _mm256_setzero_pd();                            \
        k_wk_avx2 w;                                                                                       \
        int64_t b = 0;                                                                                     \
        if (nr == 1) { /* four blocks per reduction, their terms side by side: lane l = block b + l */    \
            for (; b + K_BLOCK_LANES <= n / QK_K; b += K_BLOCK_LANES) {                                   \
                __m256i iv[4], mv[4];                                                                      \
                double d[4], dm[4], dyv[4];                                                                \
                for (int l = 0; l < 4; l++) {                                                              \
                    k_wk_unpack_avx2(type, x + (size_t)(b + l) * xs, &w);                                  \
                    const uint8_t *yb = y + (size_t)(b + l) * K_Q8_K_SIZE;                                 \
                    k_wk_dot_##isa(&w, yb, side ? side + 32 * (b + l) : NULL, has_min, &iv[l], &mv[l]);   \
                    d[l] = (double)w.d, dm[l] = (double)w.dmin, dyv[l] = (double)k_ld_f32(yb);             \
                }                                                                                          \
                __m256d is = _mm256_cvtepi32_pd(k_hsum4_i32_avx2(iv[0], iv[1], iv[2], iv[3]));             \
                __m256d dy = _mm256_loadu_pd(dyv), dx = _mm256_loadu_pd(d), t;                             \
                if (has_min) { /* the reference: dy * (d * isum - dmin * msum) */                          \
                    __m256d ms = _mm256_cvtepi32_pd(k_hsum4_i32_avx2(mv[0], mv[1], mv[2], mv[3]));         \
                    t = _mm256_mul_pd(dy, _mm256_sub_pd(_mm256_mul_pd(dx, is), _mm256_mul_pd(_mm256_loadu_pd(dm), ms))); \
                } else { /* d * dy * isum */                                                               \
                    t = _mm256_mul_pd(_mm256_mul_pd(dx, dy), is);                                          \
                }                                                                                          \
                accv[0] = _mm256_add_pd(accv[0], k_no_fuse_pd_avx2(t));                                    \
            }                                                                                              \
            _mm256_storeu_pd(acc1, accv[0]);                                                               \
        }                                                                                                  \
        for (; b < n / QK_K; b++) {                                                                        \
            k_wk_unpack_avx2(type, x + (size_t)b * xs, &w);                                                \
            const uint8_t *yb = y + (size_t)b * K_Q8_K_SIZE;                                               \
            if (nr == 1) {                                                                                 \
                __m256i iv, mv;                                                                            \
                int32_t isum, msum;                                                                        \
                k_wk_dot_##isa(&w, yb, side ? side + 32 * b : NULL, has_min, &iv, &mv);                    \
                k_hsum2_i32_avx2(iv, mv, &isum, &msum);                                                    \
                double dy = (double)k_ld_f32(yb), t; /* the reference's expressions */                    \
                if (has_min) t = dy * ((double)w.d * (double)isum - (double)w.dmin * (double)msum);       \
                else t = (double)w.d * dy * (double)isum;                                                  \
                acc1[b % K_BLOCK_LANES] += k_no_fuse(t);                                                   \
                continue;                                                                                  \
            }                                                                                              \
            __m256i iv[4], mv[4];                                                                          \
            float dyf[4] = {0};                                                                            \
            for (int r = 0; r < 4; r++) iv[r] = mv[r] = _mm256_setzero_si256();                           \
            for (int r = 0; r < nr; r++) {                                                                 \
                k_wk_dot_##isa(&w, yb + (size_t)r * ys, side ? side + (size_t)r * side_stride + 32 * b : NULL, \
                               has_min, &iv[r], &mv[r]);                                                   \
                dyf[r] = k_ld_f32(yb + (size_t)r * ys);                                                    \
            }                                                                                              \
            __m256d is = _mm256_cvtepi32_pd(k_hsum4_i32_avx2(iv[0], iv[1], iv[2], iv[3]));                 \
            __m256d dy = _mm256_cvtps_pd(_mm_loadu_ps(dyf)), t;                                            \
            if (has_min) {                                                                                 \
                __m256d ms = _mm256_cvtepi32_pd(k_hsum4_i32_avx2(mv[0], mv[1], mv[2], mv[3]));             \
                t = _mm256_mul_pd(dy, _mm256_sub_pd(_mm256_mul_pd(_mm256_set1_pd((double)w.d), is),         \
                                                    _mm256_mul_pd(_mm256_set1_pd((double)w.dmin), ms)));  \
            } else {                                                                                       \
                t = _mm256_mul_pd(_mm256_mul_pd(_mm256_set1_pd((double)w.d), dy), is);                     \
            }                                                                                              \
            accv[b % K_BLOCK_LANES] = _mm256_add_pd(accv[b % K_BLOCK_LANES], k_no_fuse_pd_avx2(t));         \
        }                                                                                                  \
        if (nr == 1) {                                                                                     \
            s[0] = k_lanes_sum(acc1, K_BLOCK_LANES);                                                       \
            return;                                                                                        \
        }                                                                                                  \
        double lanes[K_BLOCK_LANES][4];                                                                    \
        for (int l = 0; l < K_BLOCK_LANES; l++) _mm256_storeu_pd(lanes[l], accv[l]);                       \
        for (int r = 0; r < nr; r++) {                                                                     \
            double a[K_BLOCK_LANES];                                                                       \
            for (int l = 0; l < K_BLOCK_LANES; l++) a[l] = lanes[l][r];                                    \
            s[r * ss] = k_lanes_sum(a, K_BLOCK_LANES);                                                     \
        }                                                                                                  \
    }

// A k_gemv_fn from an inlined core taking side data; one row (generation) gets its own copy
// with the row count constant.
#define K_DEF_GEMV(fname, core, type, tgt)                                                                  \
    tgt static void fname(int64_t n, float *s, int64_t ss, const uint8_t *x, const uint8_t *y, size_t ys,    \
                          const uint8_t *side, size_t side_stride, int nr) {                                \
        if (nr == 1) core(type, n, s, ss, x, y, ys, side, side_stride, 1);                                  \
        else core(type, n, s, ss, x, y, ys, side, side_stride, nr);                                         \
    }

// The k-quant entry points of a set: vec_dot and vec_dot_rows (no side data) and, for the types
// with a quant offset (Q3_K, Q6_K), generation's products, where the offset comes off through the
// activation's sums of 16 (k_wk_off_avx2). All bit-identical to the reference vec_dot.
#define K_DEF_KQUANTS(isa, tgt)                                                                             \
    tgt K_INLINE void k_rowsk_##isa##_plain(uint32_t type, int64_t n, float *s, int64_t ss, const uint8_t *x, \
                                            const uint8_t *y, size_t ys, int nr) {                          \
        k_rowsk_##isa(type, n, s, ss, x, y, ys, NULL, 0, nr);                                               \
    }                                                                                                       \
    K_DEF_ROWS(q2_k_q8_k_##isa, k_rowsk_##isa##_plain, T_Q2_K, tgt)                                         \
    K_DEF_ROWS(q3_k_q8_k_##isa, k_rowsk_##isa##_plain, T_Q3_K, tgt)                                         \
    K_DEF_ROWS(q4_k_q8_k_##isa, k_rowsk_##isa##_plain, T_Q4_K, tgt)                                         \
    K_DEF_ROWS(q5_k_q8_k_##isa, k_rowsk_##isa##_plain, T_Q5_K, tgt)                                         \
    K_DEF_ROWS(q6_k_q8_k_##isa, k_rowsk_##isa##_plain, T_Q6_K, tgt)                                         \
    K_DEF_GEMV(k_gemv_q3_k_##isa, k_rowsk_##isa, T_Q3_K, tgt)                                               \
    K_DEF_GEMV(k_gemv_q6_k_##isa, k_rowsk_##isa, T_Q6_K, tgt)

K_DEF_ROWSK(avx2, K_AVX2)

K_DEF_KQUANTS(avx2, K_AVX2)

// ---- AVX2: packing GEMM panels -----------------------------------------------------------------
// k_panel_pack with the one-row kernels' unpacking: each row's block unpacks to 32-byte vectors
// of unsigned quants in value order (exactly the panel's bytes, lane by lane), and an 8 x 8
// transpose of 32-bit elements turns eight rows' vectors into the panel's vectors of four quants
// of each row. Byte-identical to k_panel_pack (tested).

// v[i] (row i, elements 0..7) -> v[s] = element s of each row.
K_AVX2 K_INLINE void k_transpose8_avx2(__m256i v[8]) {
    __m256i t[8], u[8];
    K_UNROLL
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_epi32(v[i], v[i + 1]);
        t[i + 1] = _mm256_unpackhi_epi32(v[i], v[i + 1]);
    }
    K_UNROLL
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    K_UNROLL
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x20);
        v[i + 4] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x31);
    }
}

K_AVX2 K_INLINE void k_transpose8_store_avx2(__m256i v[8], uint8_t *dst) {
    k_transpose8_avx2(v);
    K_UNROLL
    for (int s = 0; s < 8; s++) _mm256_storeu_si256((__m256i *)(void *)(dst + 32 * s), v[s]);
}

// Rows 4h..4h+3 of the unpacked vectors v (four groups of eight quants each) into the halves h
// of the 64-byte vectors of eight-quant groups (k_panel_g8): a 4 x 4 transpose of 64-bit
// elements per half.
K_AVX2 K_INLINE void k_group8_store_avx2(const __m256i v[8], uint8_t *dst) {
    K_UNROLL
    for (int h = 0; h < 2; h++) {
        const __m256i *a = v + 4 * h;
        __m256i t0 = _mm256_unpacklo_epi64(a[0], a[1]), t1 = _mm256_unpackhi_epi64(a[0], a[1]);
        __m256i t2 = _mm256_unpacklo_epi64(a[2], a[3]), t3 = _mm256_unpackhi_epi64(a[2], a[3]);
        _mm256_storeu_si256((__m256i *)(void *)(dst + 32 * h), _mm256_permute2x128_si256(t0, t2, 0x20));
        _mm256_storeu_si256((__m256i *)(void *)(dst + 64 + 32 * h), _mm256_permute2x128_si256(t1, t3, 0x20));
        _mm256_storeu_si256((__m256i *)(void *)(dst + 128 + 32 * h), _mm256_permute2x128_si256(t0, t2, 0x31));
        _mm256_storeu_si256((__m256i *)(void *)(dst + 192 + 32 * h), _mm256_permute2x128_si256(t1, t3, 0x31));
    }
}

// Eight rows' 32 bytes of quants (v[r]: row r) into a panel's quant vectors: in groups of eight
// quants (k_panel_g8) or of four.
K_AVX2 K_INLINE void k_quants_store_avx2(__m256i v[8], uint8_t *dst, bool g8) {
    if (g8) k_group8_store_avx2(v, dst);
    else k_transpose8_store_avx2(v, dst);
}

// g8: the layout in groups of eight quants (k_panel_g8 types only)
K_AVX2 K_INLINE void k_pack_core_avx2(uint32_t type, int64_t n, const uint8_t *w, size_t ws, int nw, uint8_t *panel,
                                      bool g8) {
    const int64_t qb = type_table[type].blck_size, nb = n / qb;
    const size_t bb = k_panel_blk(type), xs = type_table[type].type_size, dxo = k_panel_dx(type);
    const bool min = k_panel_min(type);
    PSV_ASSERT(n % qb == 0 && nw >= 1 && nw <= K_PANEL);
    static const uint8_t zero4[4] = {0}; // the fp16 scales of missing rows
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *pb = panel + (size_t)b * bb;
        const uint8_t *xb = w + (size_t)b * xs;
        if (qb == 32) {
            __m256i v[8];
            const uint8_t *x[8];
            K_UNROLL
            for (int r = 0; r < 8; r++) {
                v[r] = _mm256_setzero_si256();
                x[r] = r < nw ? xb + (size_t)r * ws : zero4;
                if (r >= nw) continue;
                if (type == T_Q8_0) v[r] = _mm256_xor_si256(k_load256(x[r] + 2), _mm256_set1_epi8((char)0x80));
                else if (!k_panel_nibbles(type)) v[r] = k_w32_unpack_avx2(type, x[r]).a;
            }
            // the scales straight into the panel as doubles (floats through memory would stall
            // on store forwarding)
            for (int k = 0; k < (min ? 2 : 1); k++) {
                const size_t o = 2 * (size_t)k;
                __m128 lo = k_f16x4_avx2(x[0] + o, x[1] + o, x[2] + o, x[3] + o);
                __m128 hi = k_f16x4_avx2(x[4] + o, x[5] + o, x[6] + o, x[7] + o);
                _mm256_storeu_pd((double *)(void *)(pb + dxo + 64 * k), _mm256_cvtps_pd(lo));
                _mm256_storeu_pd((double *)(void *)(pb + dxo + 64 * k + 32), _mm256_cvtps_pd(hi));
            }
            if (k_panel_nibbles(type)) { // rows r and r + 4 in one vector, then a 4 x 4 transpose per half
                const size_t qo = type == T_Q4_0 ? 2 : 4;
                __m256i a[4], t[4];
                K_UNROLL
                for (int r = 0; r < 4; r++) {
                    __m128i lo = r < nw ? k_load128(xb + (size_t)r * ws + qo) : _mm_setzero_si128();
                    __m128i hi = r + 4 < nw ? k_load128(xb + (size_t)(r + 4) * ws + qo) : _mm_setzero_si128();
                    a[r] = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
                }
                t[0] = _mm256_unpacklo_epi32(a[0], a[1]);
                t[1] = _mm256_unpackhi_epi32(a[0], a[1]);
                t[2] = _mm256_unpacklo_epi32(a[2], a[3]);
                t[3] = _mm256_unpackhi_epi32(a[2], a[3]);
                _mm256_storeu_si256((__m256i *)(void *)pb, _mm256_unpacklo_epi64(t[0], t[2]));
                _mm256_storeu_si256((__m256i *)(void *)(pb + 32), _mm256_unpackhi_epi64(t[0], t[2]));
                _mm256_storeu_si256((__m256i *)(void *)(pb + 64), _mm256_unpacklo_epi64(t[1], t[3]));
                _mm256_storeu_si256((__m256i *)(void *)(pb + 96), _mm256_unpackhi_epi64(t[1], t[3]));
            } else {
                k_quants_store_avx2(v, pb, g8);
            }
        } else {
            __m256i s16[8], mn[8];
            k_wk_avx2 u[8];
            for (int r = 0; r < 8; r++) { // the scales go straight into the panel as doubles
                double d = 0, dm = 0;
                if (r < nw) { // (each array element set once: zeroing them all first made two memsets)
                    s16[r] = k_wk_unpack_q_avx2(type, xb + (size_t)r * ws, &u[r]);
                    mn[r] = u[r].mins;
                    d = u[r].d;
                    dm = u[r].dmin;
                } else {
                    s16[r] = mn[r] = _mm256_setzero_si256();
                    for (int c = 0; c < 8; c++) u[r].q[c] = _mm256_setzero_si256();
                }
                memcpy(pb + dxo + 8 * r, &d, 8);
                if (min) memcpy(pb + dxo + 64 + 8 * r, &dm, 8);
            }
            if (type == T_Q4_K) { // the quant bytes, 32 per chunk: vectors 8c..8c+7
                for (int c = 0; c < 4; c++) {
                    __m256i v[8];
                    K_UNROLL
                    for (int r = 0; r < 8; r++) v[r] = r < nw ? k_load256(xb + (size_t)r * ws + 16 + 32 * c) : _mm256_setzero_si256();
                    k_quants_store_avx2(v, pb + 256 * c, g8);
                }
            } else {
                for (int c = 0; c < 8; c++) { // chunk c: the panel's steps 8c..8c+7
                    __m256i v[8];
                    K_UNROLL
                    for (int r = 0; r < 8; r++) v[r] = u[r].q[c];
                    k_quants_store_avx2(v, pb + 256 * c, g8);
                }
            }
            __m256i lo[8], hi[8], co[8];
            const __m256i noff = _mm256_set1_epi16((short)-k_panel_off(type));
            K_UNROLL
            for (int r = 0; r < 8; r++) {
                lo[r] = _mm256_cvtepi16_epi32(_mm256_castsi256_si128(s16[r]));
                hi[r] = _mm256_cvtepi16_epi32(_mm256_extracti128_si256(s16[r], 1));
                co[r] = _mm256_mullo_epi16(s16[r], noff);
            }
            k_transpose8_store_avx2(lo, pb + k_panel_sc(type));
            k_transpose8_store_avx2(hi, pb + k_panel_sc(type) + 256);
            if (k_panel_off(type)) k_transpose8_store_avx2(co, pb + k_panel_cor(type));
            if (min) k_transpose8_store_avx2(mn, pb + k_panel_mco(type));
        }
    }
}

#define K_DEF_PACK(name, type)                                                                             \
    K_AVX2 static void k_pack_##name##_avx2(int64_t n, const uint8_t *w, size_t ws, int nw, uint8_t *panel) { \
        k_pack_core_avx2(type, n, w, ws, nw, panel, false);                                                \
    }
K_DEF_PACK(q4_0, T_Q4_0)
K_DEF_PACK(q4_1, T_Q4_1)
K_DEF_PACK(q5_0, T_Q5_0)
K_DEF_PACK(q5_1, T_Q5_1)
K_DEF_PACK(q2_k, T_Q2_K)
K_DEF_PACK(q3_k, T_Q3_K)
K_DEF_PACK(q4_k, T_Q4_K)
K_DEF_PACK(q5_k, T_Q5_K)
K_DEF_PACK(q6_k, T_Q6_K)
#define K_DEF_PACK8(name, type)                                                                            \
    K_AVX2 static void k_pack8_##name##_avx2(int64_t n, const uint8_t *w, size_t ws, int nw, uint8_t *panel) { \
        k_pack_core_avx2(type, n, w, ws, nw, panel, true);                                                 \
    }
K_DEF_PACK8(q4_0, T_Q4_0)
K_DEF_PACK8(q5_0, T_Q5_0)
K_DEF_PACK8(q5_1, T_Q5_1)
K_DEF_PACK8(q8_0, T_Q8_0)
K_DEF_PACK8(q2_k, T_Q2_K)
K_DEF_PACK8(q3_k, T_Q3_K)
K_DEF_PACK8(q4_k, T_Q4_K)
K_DEF_PACK8(q5_k, T_Q5_K)
K_DEF_PACK8(q6_k, T_Q6_K)

// ---- AVX2: GEMM on panels ----------------------------------------------------------------------
// The AVX-512 kernel's scheme with AVX2's instructions: vpmaddubsw multiplies the unsigned panel
// quants by the broadcast signed activation bytes into int16 pair sums, which are added up in
// int16 over as many steps as cannot overflow (a pair is at most 2 * q_max * 128: 3840 for 4-bit
// quants, so 8 steps; 7936 for 5-bit, 4; 16128 for Q6_K, 2), then vpmaddwd turns them into int32,
// multiplying by the k-quants' sub-block scales on the way (as int16; every scale fits). The
// double terms are formed for the eight weight rows in two 4-lane vectors, exactly as the
// reference forms them, and added to accumulators kept in memory (16 registers would not hold
// them). Two activation rows at a time. Q8_0 has no AVX2 GEMM: its unsigned quants reach 255,
// and a pair sum could saturate.

K_AVX2 K_INLINE __m256i k_bcast4_avx2(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

// int32 lanes holding int16 values -> each value in both halves of its lane (a vpmaddwd factor).
K_AVX2 K_INLINE __m256i k_dup16_avx2(__m256i v) {
    return _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0xffff)), _mm256_slli_epi32(v, 16));
}

// Adds the block's term for 8 weight rows (dx, dm: rows 0-3 and 4-7) to acc[0..7].
K_AVX2 K_INLINE void k_gemm_term_avx2(double *acc, __m256d t0, __m256d t1) {
    _mm256_storeu_pd(acc, _mm256_add_pd(_mm256_loadu_pd(acc), k_no_fuse_pd_avx2(t0)));
    _mm256_storeu_pd(acc + 4, _mm256_add_pd(_mm256_loadu_pd(acc + 4), k_no_fuse_pd_avx2(t1)));
}

// Block b of the panel against R (1 or 2) activation rows; acc[r * 8 ..] is lane b % 4 of row r.
K_AVX2 K_INLINE void k_gemm_blk_avx2(uint32_t type, int R, const uint8_t *pb, int64_t b, const uint8_t *const *yr,
                                     const int16_t *const *ar, const double *const *dr, const int32_t *const *ao,
                                     int64_t nb, double *acc) {
    const bool min = k_panel_min(type);
    const __m256i ones = _mm256_set1_epi16(1), m4 = _mm256_set1_epi8(15);
    const double *dxp = (const double *)(const void *)(pb + k_panel_dx(type));
    const __m256d dx0 = _mm256_loadu_pd(dxp), dx1 = _mm256_loadu_pd(dxp + 4);
    __m256i is[2], ms[2];
    if (type_table[type].blck_size == 32) {
        const bool q81 = type == T_Q4_1 || type == T_Q5_1;
        const size_t as = q81 ? K_Q8_1_SIZE : K_Q8_0_SIZE, qo = q81 ? 4 : 2;
        const int off = k_panel_off(type);
        __m256i p[2];
        K_UNROLL
        for (int r = 0; r < R; r++) p[r] = _mm256_setzero_si256();
        if (k_panel_nibbles(type)) { // 8 steps of 4-bit pairs: at most 8 * 3840 in int16
            K_UNROLL
            for (int s = 0; s < 4; s++) {
                __m256i v = k_load256(pb + 32 * s);
                __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                K_UNROLL
                for (int r = 0; r < R; r++) {
                    const uint8_t *a = yr[r] + (size_t)b * as + qo;
                    p[r] = _mm256_add_epi16(p[r], _mm256_maddubs_epi16(lo, k_bcast4_avx2(a + 4 * s)));
                    p[r] = _mm256_add_epi16(p[r], _mm256_maddubs_epi16(hi, k_bcast4_avx2(a + 16 + 4 * s)));
                }
            }
            K_UNROLL
            for (int r = 0; r < R; r++) is[r] = _mm256_madd_epi16(p[r], ones);
        } else { // Q5_0, Q5_1: 4 steps of 5-bit pairs at a time
            K_UNROLL
            for (int r = 0; r < R; r++) is[r] = _mm256_setzero_si256();
            K_UNROLL
            for (int h = 0; h < 2; h++) {
                K_UNROLL
                for (int r = 0; r < R; r++) p[r] = _mm256_setzero_si256();
                K_UNROLL
                for (int s = 4 * h; s < 4 * h + 4; s++) {
                    __m256i w = k_load256(pb + 32 * s);
                    K_UNROLL
                    for (int r = 0; r < R; r++)
                        p[r] = _mm256_add_epi16(p[r], _mm256_maddubs_epi16(w, k_bcast4_avx2(yr[r] + (size_t)b * as + qo + 4 * s)));
                }
                K_UNROLL
                for (int r = 0; r < R; r++) is[r] = _mm256_add_epi32(is[r], _mm256_madd_epi16(p[r], ones));
            }
        }
        const double *dmp = dxp + 8;
        K_UNROLL
        for (int r = 0; r < R; r++) {
            if (off) // the term that takes the quants' offset off (k_act_side)
                is[r] = _mm256_add_epi32(is[r], k_bcast4_avx2(ao[r] + b));
            // reference: (double)dx * (double)dy * (double)isum [+ (double)mx * (double)sy]
            __m256d dy = _mm256_set1_pd(dr[r][b]);
            __m256d t0 = _mm256_mul_pd(_mm256_mul_pd(dx0, dy), _mm256_cvtepi32_pd(_mm256_castsi256_si128(is[r])));
            __m256d t1 = _mm256_mul_pd(_mm256_mul_pd(dx1, dy), _mm256_cvtepi32_pd(_mm256_extracti128_si256(is[r], 1)));
            if (q81) {
                __m256d sy = _mm256_set1_pd(dr[r][nb + b]);
                t0 = _mm256_add_pd(t0, _mm256_mul_pd(_mm256_loadu_pd(dmp), sy));
                t1 = _mm256_add_pd(t1, _mm256_mul_pd(_mm256_loadu_pd(dmp + 4), sy));
            }
            k_gemm_term_avx2(acc + 8 * r, t0, t1);
        }
        return;
    }
    const uint8_t *psc = pb + k_panel_sc(type);
    const bool cor = type == T_Q3_K || type == T_Q6_K;
    K_UNROLL
    for (int r = 0; r < R; r++) is[r] = ms[r] = _mm256_setzero_si256();
    if (type == T_Q4_K) { // sub-blocks 2c and 2c + 1 from the nibbles of chunk c: 8 steps each
        for (int c = 0; c < 4; c++) {
            __m256i p0[2], p1[2];
            K_UNROLL
            for (int r = 0; r < R; r++) p0[r] = p1[r] = _mm256_setzero_si256();
            K_UNROLL
            for (int s = 0; s < 8; s++) {
                __m256i v = k_load256(pb + 32 * (8 * c + s));
                __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                K_UNROLL
                for (int r = 0; r < R; r++) {
                    const uint8_t *a = yr[r] + (size_t)b * K_Q8_K_SIZE + 4 + 64 * c + 4 * s;
                    p0[r] = _mm256_add_epi16(p0[r], _mm256_maddubs_epi16(lo, k_bcast4_avx2(a)));
                    p1[r] = _mm256_add_epi16(p1[r], _mm256_maddubs_epi16(hi, k_bcast4_avx2(a + 32)));
                }
            }
            __m256i sc0 = k_dup16_avx2(k_load256(psc + 32 * (4 * c))), sc1 = k_dup16_avx2(k_load256(psc + 32 * (4 * c + 2)));
            K_UNROLL
            for (int r = 0; r < R; r++)
                is[r] = _mm256_add_epi32(is[r], _mm256_add_epi32(_mm256_madd_epi16(p0[r], sc0), _mm256_madd_epi16(p1[r], sc1)));
        }
    } else {
        // sub-blocks of 16 values (Q5_K: of 32, each scale stored twice); int16 runs of `run` steps
        const int run = type == T_Q6_K ? 2 : 4, nsub = 16;
        for (int k = 0; k < nsub; k++) {
            __m256i sc = k_dup16_avx2(k_load256(psc + 32 * k));
            for (int h = 0; h < 4 / run; h++) { // (no unroll pragma: the count is not constant at -O1)
                __m256i p[2];
                K_UNROLL
                for (int r = 0; r < R; r++) p[r] = _mm256_setzero_si256();
                K_UNROLL
                for (int s = 0; s < run; s++) {
                    int step = 4 * k + run * h + s;
                    __m256i w = k_load256(pb + 32 * step);
                    K_UNROLL
                    for (int r = 0; r < R; r++)
                        p[r] = _mm256_add_epi16(p[r], _mm256_maddubs_epi16(w, k_bcast4_avx2(yr[r] + (size_t)b * K_Q8_K_SIZE + 4 + 4 * step)));
                }
                K_UNROLL
                for (int r = 0; r < R; r++) is[r] = _mm256_add_epi32(is[r], _mm256_madd_epi16(p[r], sc));
            }
        }
    }
    K_UNROLL
    for (int j = 0; j < 8; j++) {
        if (cor) {
            __m256i c = k_load256(pb + k_panel_cor(type) + 32 * j);
            K_UNROLL
            for (int r = 0; r < R; r++) is[r] = _mm256_add_epi32(is[r], _mm256_madd_epi16(c, k_bcast4_avx2(ar[r] + 16 * b + 2 * j)));
        }
        if (min) {
            __m256i c = k_load256(pb + k_panel_mco(type) + 32 * j);
            K_UNROLL
            for (int r = 0; r < R; r++)
                ms[r] = _mm256_add_epi32(ms[r], _mm256_madd_epi16(c, k_bcast4_avx2(yr[r] + (size_t)b * K_Q8_K_SIZE + 260 + 4 * j)));
        }
    }
    const double *dmp = dxp + 8;
    K_UNROLL
    for (int r = 0; r < R; r++) {
        __m256d dy = _mm256_set1_pd(dr[r][b]), t0, t1;
        __m256d i0 = _mm256_cvtepi32_pd(_mm256_castsi256_si128(is[r])), i1 = _mm256_cvtepi32_pd(_mm256_extracti128_si256(is[r], 1));
        if (min) { // reference: dy * (dx * isum - dmin * msum)
            __m256d m0 = _mm256_cvtepi32_pd(_mm256_castsi256_si128(ms[r])), m1 = _mm256_cvtepi32_pd(_mm256_extracti128_si256(ms[r], 1));
            t0 = _mm256_mul_pd(dy, _mm256_sub_pd(_mm256_mul_pd(dx0, i0), _mm256_mul_pd(_mm256_loadu_pd(dmp), m0)));
            t1 = _mm256_mul_pd(dy, _mm256_sub_pd(_mm256_mul_pd(dx1, i1), _mm256_mul_pd(_mm256_loadu_pd(dmp + 4), m1)));
        } else { // reference: dx * dy * isum
            t0 = _mm256_mul_pd(_mm256_mul_pd(dx0, dy), i0);
            t1 = _mm256_mul_pd(_mm256_mul_pd(dx1, dy), i1);
        }
        k_gemm_term_avx2(acc + 8 * r, t0, t1);
    }
}

K_AVX2 K_INLINE void k_gemm_core_avx2(uint32_t type, int R, int64_t n, const uint8_t *panel, const uint8_t *y, size_t ys,
                                      const uint8_t *side, size_t side_stride, float *const *out, int nw,
                                      const k_prefetch *pf) {
    const int64_t nb = n / type_table[type].blck_size;
    const size_t bb = k_panel_blk(type);
    const uint8_t *yr[2];
    const int16_t *ar[2];
    const double *dr[2];
    const int32_t *ao[2];
    double acc[K_BLOCK_LANES][2 * 8]; // lane l of row r's eight results at acc[l][8r ..]
    memset(acc, 0, sizeof acc);
    for (int r = 0; r < R; r++)
        k_gemm_side(type, n, y + (size_t)r * ys, side + (size_t)r * side_stride, &yr[r], &ar[r], &dr[r], &ao[r]);
    for (int64_t b = 0; b < nb; b++) {
        if (pf) k_prefetch_blks(pf, b, 1);
        k_gemm_blk_avx2(type, R, panel + (size_t)b * bb, b, yr, ar, dr, ao, nb, acc[b % K_BLOCK_LANES]);
    }
    for (int r = 0; r < R; r++) { // the reference's ((lane0 + lane1) + lane2) + lane3, rounded once
        float res[8];
        for (int i = 0; i < 8; i++) {
            double l[K_BLOCK_LANES] = {acc[0][8 * r + i], acc[1][8 * r + i], acc[2][8 * r + i], acc[3][8 * r + i]};
            res[i] = k_lanes_sum(l, K_BLOCK_LANES);
        }
        memcpy(out[r], res, (size_t)nw * sizeof(float));
    }
}

#define K_DEF_GEMM2(name, type)                                                                           \
    K_AVX2 static void k_gemm_##name##_avx2(int64_t n, const uint8_t *panel, const uint8_t *y, size_t ys,  \
                                            const uint8_t *side, size_t side_stride, int nr, float *const *out, int nw, \
                                            const k_prefetch *pf) {                                        \
        PSV_ASSERT(nr >= 1 && nr <= K_GEMM_ROWS && nw >= 1 && nw <= K_PANEL);                              \
        int r = 0;                                                                                         \
        for (; r + 2 <= nr; r += 2, pf = NULL)                                                             \
            k_gemm_core_avx2(type, 2, n, panel, y + (size_t)r * ys, ys, side + (size_t)r * side_stride, side_stride, out + r, nw, pf); \
        if (r < nr) k_gemm_core_avx2(type, 1, n, panel, y + (size_t)r * ys, ys, side + (size_t)r * side_stride, side_stride, out + r, nw, pf); \
    }
K_DEF_GEMM2(q4_0, T_Q4_0)
K_DEF_GEMM2(q4_1, T_Q4_1)
K_DEF_GEMM2(q5_0, T_Q5_0)
K_DEF_GEMM2(q5_1, T_Q5_1)
K_DEF_GEMM2(q2_k, T_Q2_K)
K_DEF_GEMM2(q3_k, T_Q3_K)
K_DEF_GEMM2(q4_k, T_Q4_K)
K_DEF_GEMM2(q5_k, T_Q5_K)
K_DEF_GEMM2(q6_k, T_Q6_K)

// ---- AVX2: F32, F16, BF16 ------------------------------------------------------------------------
// The K_LANES = 16 double lanes of the reference live in four registers (lanes 4i .. 4i+3 in
// acc[i]); each product is exact in double (F16: already in float), so an FMA or an add rounds
// exactly where the reference's `+=` does. A partial last group is padded with zeros, which
// leaves the lanes unchanged (no lane is ever -0: it starts at +0 and round-to-nearest never
// produces -0 from a sum that is not all -0). Then the lanes are summed in order, as k_lanes_sum.

K_AVX2 K_INLINE float k_lanes_sum_avx2(__m256d a0, __m256d a1, __m256d a2, __m256d a3) {
    double l[K_LANES];
    _mm256_storeu_pd(l, a0);
    _mm256_storeu_pd(l + 4, a1);
    _mm256_storeu_pd(l + 8, a2);
    _mm256_storeu_pd(l + 12, a3);
    return k_lanes_sum(l, K_LANES);
}

// 16 floats of x and y (as two halves each) into the lanes, as exact double products.
K_AVX2 K_INLINE void k_lanes_fma_avx2(__m256 x0, __m256 x1, __m256 y0, __m256 y1, __m256d *a) {
    a[0] = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(x0)), _mm256_cvtps_pd(_mm256_castps256_ps128(y0)), a[0]);
    a[1] = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(x0, 1)), _mm256_cvtps_pd(_mm256_extractf128_ps(y0, 1)), a[1]);
    a[2] = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(x1)), _mm256_cvtps_pd(_mm256_castps256_ps128(y1)), a[2]);
    a[3] = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(x1, 1)), _mm256_cvtps_pd(_mm256_extractf128_ps(y1, 1)), a[3]);
}

K_AVX2 K_INLINE void k_dot_f32_core_avx2(int64_t n, float *s, const void *vx, const void *vy) {
    const uint8_t *x = vx, *y = vy;
    __m256d a[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        k_lanes_fma_avx2(_mm256_loadu_ps((const float *)(const void *)(x + 4 * i)),
                         _mm256_loadu_ps((const float *)(const void *)(x + 4 * i + 32)),
                         _mm256_loadu_ps((const float *)(const void *)(y + 4 * i)),
                         _mm256_loadu_ps((const float *)(const void *)(y + 4 * i + 32)), a);
    if (i < n) {
        float tx[16] = {0}, ty[16] = {0};
        memcpy(tx, x + 4 * i, (size_t)(n - i) * 4);
        memcpy(ty, y + 4 * i, (size_t)(n - i) * 4);
        k_lanes_fma_avx2(_mm256_loadu_ps(tx), _mm256_loadu_ps(tx + 8), _mm256_loadu_ps(ty), _mm256_loadu_ps(ty + 8), a);
    }
    *s = k_lanes_sum_avx2(a[0], a[1], a[2], a[3]);
}

K_AVX2 static void k_dot_f32_f32_avx2(int64_t n, float *s, const void *vx, const void *vy) { k_dot_f32_core_avx2(n, s, vx, vy); }

// k_dot_keys_ref on the keys' blocks of K_KEY_BLOCK: the queries (up to four at a time) are
// converted to double once (qd, rows K_KEYS_MAX_N apart), each key value once for all of them;
// one register holds lane l (of the reference's K_LANES) of four keys, so the lanes' in-order
// sum is plain vector additions. Half a block at a time.
K_AVX2 K_INLINE void k_dot_keys_q_avx2(const int c, float *s, size_t s_stride, const double *qd, const float *k,
                                       size_t bstride, int64_t nk, int64_t n) {
    for (int64_t p = 0; p < nk; p += 4) {
        const float *kb = k + (size_t)(p / K_KEY_BLOCK) * bstride + (size_t)(p % K_KEY_BLOCK);
        __m256d tot[4];
        for (int l = 0; l < K_LANES; l++) {
            __m256d lane[4];
            K_UNROLL
            for (int g = 0; g < c; g++) lane[g] = _mm256_setzero_pd();
            for (int64_t i = l; i < n; i += K_LANES) {
                const __m256d kv = _mm256_cvtps_pd(_mm_loadu_ps(kb + (size_t)i * K_KEY_BLOCK));
                K_UNROLL
                for (int g = 0; g < c; g++)
                    lane[g] = _mm256_fmadd_pd(kv, _mm256_broadcast_sd(qd + (size_t)g * K_KEYS_MAX_N + (size_t)i), lane[g]);
            }
            K_UNROLL
            for (int g = 0; g < c; g++) tot[g] = l == 0 ? lane[g] : _mm256_add_pd(tot[g], lane[g]);
        }
        const int64_t m = PSV_MIN((int64_t)4, nk - p);
        K_UNROLL
        for (int g = 0; g < c; g++) {
            float out[4];
            _mm_storeu_ps(out, _mm256_cvtpd_ps(tot[g]));
            memcpy(s + (size_t)g * s_stride + (size_t)p, out, (size_t)m * sizeof(float));
        }
    }
}

K_AVX2 static void k_dot_keys_avx2(float *s, size_t s_stride, const float *q, size_t q_stride, int nq, const float *k,
                                   size_t bstride, int64_t nk, int64_t n) {
    if (n > K_KEYS_MAX_N) {
        k_dot_keys_ref(s, s_stride, q, q_stride, nq, k, bstride, nk, n);
        return;
    }
    const int chunks = (nq + 3) / 4, per = (nq + chunks - 1) / chunks; // 7 queries: 4 + 3
    double qd[4 * K_KEYS_MAX_N];
    for (int g0 = 0; g0 < nq; g0 += per) {
        const int c = PSV_MIN(per, nq - g0);
        float *sg = s + (size_t)g0 * s_stride;
        k_keys_queries_pd(qd, q, q_stride, g0, c, n);
        switch (c) {
        case 1: k_dot_keys_q_avx2(1, sg, s_stride, qd, k, bstride, nk, n); break;
        case 2: k_dot_keys_q_avx2(2, sg, s_stride, qd, k, bstride, nk, n); break;
        case 3: k_dot_keys_q_avx2(3, sg, s_stride, qd, k, bstride, nk, n); break;
        default: k_dot_keys_q_avx2(4, sg, s_stride, qd, k, bstride, nk, n); break;
        }
    }
}

// F16: the float product of two halves is exact, so it is formed in float and widened.
K_AVX2 K_INLINE void k_lanes_add_f16_avx2(__m128i x0, __m128i x1, __m128i y0, __m128i y1, __m256d *a) {
    __m256 p0 = _mm256_mul_ps(_mm256_cvtph_ps(x0), _mm256_cvtph_ps(y0));
    __m256 p1 = _mm256_mul_ps(_mm256_cvtph_ps(x1), _mm256_cvtph_ps(y1));
    a[0] = _mm256_add_pd(a[0], _mm256_cvtps_pd(_mm256_castps256_ps128(p0)));
    a[1] = _mm256_add_pd(a[1], _mm256_cvtps_pd(_mm256_extractf128_ps(p0, 1)));
    a[2] = _mm256_add_pd(a[2], _mm256_cvtps_pd(_mm256_castps256_ps128(p1)));
    a[3] = _mm256_add_pd(a[3], _mm256_cvtps_pd(_mm256_extractf128_ps(p1, 1)));
}

K_AVX2 static void k_dot_f16_f16_avx2(int64_t n, float *s, const void *vx, const void *vy) {
    const uint8_t *x = vx, *y = vy;
    __m256d a[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        k_lanes_add_f16_avx2(k_load128(x + 2 * i), k_load128(x + 2 * i + 16), k_load128(y + 2 * i),
                             k_load128(y + 2 * i + 16), a);
    if (i < n) {
        uint8_t tx[32] = {0}, ty[32] = {0};
        memcpy(tx, x + 2 * i, (size_t)(n - i) * 2);
        memcpy(ty, y + 2 * i, (size_t)(n - i) * 2);
        k_lanes_add_f16_avx2(k_load128(tx), k_load128(tx + 16), k_load128(ty), k_load128(ty + 16), a);
    }
    *s = k_lanes_sum_avx2(a[0], a[1], a[2], a[3]);
}

// 8 bf16 values to floats (the bf16 bits are the float's upper half).
K_AVX2 K_INLINE __m256 k_bf16x8_avx2(__m128i h) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

K_AVX2 static void k_dot_bf16_bf16_avx2(int64_t n, float *s, const void *vx, const void *vy) {
    const uint8_t *x = vx, *y = vy;
    __m256d a[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        k_lanes_fma_avx2(k_bf16x8_avx2(k_load128(x + 2 * i)), k_bf16x8_avx2(k_load128(x + 2 * i + 16)),
                         k_bf16x8_avx2(k_load128(y + 2 * i)), k_bf16x8_avx2(k_load128(y + 2 * i + 16)), a);
    if (i < n) {
        uint8_t tx[32] = {0}, ty[32] = {0};
        memcpy(tx, x + 2 * i, (size_t)(n - i) * 2);
        memcpy(ty, y + 2 * i, (size_t)(n - i) * 2);
        k_lanes_fma_avx2(k_bf16x8_avx2(k_load128(tx)), k_bf16x8_avx2(k_load128(tx + 16)),
                         k_bf16x8_avx2(k_load128(ty)), k_bf16x8_avx2(k_load128(ty + 16)), a);
    }
    *s = k_lanes_sum_avx2(a[0], a[1], a[2], a[3]);
}

// ---- AVX2: activation quantizers -------------------------------------------------------------
// Same float operations as the reference on each value (a product by the same scale, then the
// same rounding rule), and the scales come from the same scalar code; the absolute maximum is
// order-independent (MAXPS returns its second operand when the first is NaN, so NaNs are skipped
// as the reference's `>` skips them).

K_AVX2 K_INLINE __m256 k_abs_ps_avx2(__m256 v) { return _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff))); }

K_AVX2 K_INLINE float k_hmax_ps_avx2(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

// The reference's pre-rounding clamp: NaN -> 0, then [lo, hi].
K_AVX2 K_INLINE __m256 k_clamp_ps_avx2(__m256 v, float lo, float hi) {
    v = _mm256_and_ps(v, _mm256_cmp_ps(v, v, _CMP_ORD_Q));
    return _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(lo)), _mm256_set1_ps(hi));
}

// k_round_away: |v| truncated, plus one when the (exact) fraction is >= 0.5, with v's sign.
K_AVX2 K_INLINE __m256i k_round_away_avx2(__m256 v) {
    v = k_clamp_ps_avx2(v, -128.0f, 127.0f);
    __m256 a = k_abs_ps_avx2(v);
    __m256 t = _mm256_round_ps(a, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m256 up = _mm256_cmp_ps(_mm256_sub_ps(a, t), _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    t = _mm256_add_ps(t, _mm256_and_ps(up, _mm256_set1_ps(1.0f)));
    return _mm256_cvttps_epi32(_mm256_or_ps(t, _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(INT32_MIN)))));
}

// k_round_even: the hardware's round to nearest even (exact on integral floats).
K_AVX2 K_INLINE __m256i k_round_even_avx2(__m256 v) {
    v = k_clamp_ps_avx2(v, -128.0f, 127.0f);
    return _mm256_cvttps_epi32(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// 32 int32 in [-128, 127] (four vectors, in order) to 32 bytes in order.
K_AVX2 K_INLINE __m256i k_pack_i8_avx2(__m256i a, __m256i b, __m256i c, __m256i d) {
    __m256i v = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
    return _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// Q8_0 and Q8_1 share the block quantizer; q81 adds the sum (and the 2-byte offset).
// Eight blocks at a time: their maxima reduced together into one vector, the scales and their
// inverses divided and (Q8_0) converted to fp16 (F16C: round to nearest even, as psv_f32_to_fp16
// for every value the maximum / 127 can take, infinity included: the maxima are never NaN) for
// all eight at once; then the blocks one by one as below.
// The maxima of eight blocks (lane b of the result: the maximum of mx[b]'s lanes; none is NaN,
// so any order gives it), their Q8_0 scales d = max / 127 and the inverses id (0 where d is).
K_AVX2 K_INLINE void k_q8_0_scales8_avx2(const __m256 mx[8], __m256 *d, __m256 *id) {
    __m256 t[4], u[2];
    K_UNROLL
    for (int b = 0; b < 4; b++)
        t[b] = _mm256_max_ps(_mm256_unpacklo_ps(mx[2 * b], mx[2 * b + 1]), _mm256_unpackhi_ps(mx[2 * b], mx[2 * b + 1]));
    K_UNROLL
    for (int b = 0; b < 2; b++)
        u[b] = _mm256_max_ps(_mm256_shuffle_ps(t[2 * b], t[2 * b + 1], 0x44), _mm256_shuffle_ps(t[2 * b], t[2 * b + 1], 0xee));
    const __m256 m = _mm256_max_ps(_mm256_permute2f128_ps(u[0], u[1], 0x20), _mm256_permute2f128_ps(u[0], u[1], 0x31));
    *d = _mm256_div_ps(m, _mm256_set1_ps(127.0f));
    *id = _mm256_and_ps(_mm256_div_ps(_mm256_set1_ps(1.0f), *d), _mm256_cmp_ps(*d, _mm256_setzero_ps(), _CMP_NEQ_OQ));
}

K_AVX2 K_INLINE void k_quant_q8_0_x8_avx2(const float *x, uint8_t *y) {
    __m256 mx[8];
    K_UNROLL
    for (int b = 0; b < 8; b++) {
        mx[b] = _mm256_setzero_ps();
        K_UNROLL
        for (int i = 0; i < 4; i++) mx[b] = _mm256_max_ps(k_abs_ps_avx2(_mm256_loadu_ps(x + 32 * b + 8 * i)), mx[b]);
    }
    __m256 d, id;
    k_q8_0_scales8_avx2(mx, &d, &id);
    float ids[8];
    uint16_t dh[8];
    _mm256_storeu_ps(ids, id);
    _mm_storeu_si128((__m128i *)(void *)dh, _mm256_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT));
    K_UNROLL
    for (int b = 0; b < 8; b++) {
        const __m256 idv = _mm256_set1_ps(ids[b]);
        __m256i q[4];
        K_UNROLL
        for (int i = 0; i < 4; i++) q[i] = k_round_away_avx2(_mm256_mul_ps(_mm256_loadu_ps(x + 32 * b + 8 * i), idv));
        _mm256_storeu_si256((__m256i *)(void *)(y + K_Q8_0_SIZE * (size_t)b + 2), k_pack_i8_avx2(q[0], q[1], q[2], q[3]));
        wr_u16(y + K_Q8_0_SIZE * (size_t)b, dh[b]);
    }
}

K_AVX2 K_INLINE void k_quant_q8_x_avx2(const float *x, uint8_t *y, int64_t n, bool q81) {
    PSV_ASSERT(n % 32 == 0);
    const size_t bs = q81 ? K_Q8_1_SIZE : K_Q8_0_SIZE;
    int64_t b = 0;
    if (!q81)
        for (; b + 8 <= n / 32; b += 8, x += 256, y += 8 * bs) k_quant_q8_0_x8_avx2(x, y);
    for (; b < n / 32; b++, x += 32, y += bs) {
        __m256 v[4];
        __m256 mx = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(x + 8 * i);
            mx = _mm256_max_ps(k_abs_ps_avx2(v[i]), mx);
        }
        float amax = k_hmax_ps_avx2(mx);
        float d = amax / 127, id = d != 0 ? 1.0f / d : 0.0f;
        __m256 idv = _mm256_set1_ps(id);
        __m256i q[4];
        for (int i = 0; i < 4; i++) q[i] = k_round_away_avx2(_mm256_mul_ps(v[i], idv));
        _mm256_storeu_si256((__m256i *)(void *)(y + (q81 ? 4 : 2)), k_pack_i8_avx2(q[0], q[1], q[2], q[3]));
        k_st_f16(y, d);
        if (q81) {
            int sum = k_hsum_i32_avx2(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
            k_st_f16(y + 2, (float)sum * d);
        }
    }
}
K_AVX2 static void k_quant_q8_0_avx2(const float *x, void *y, int64_t n) { k_quant_q8_x_avx2(x, y, n, false); }
K_AVX2 static void k_quant_q8_1_avx2(const float *x, void *y, int64_t n) { k_quant_q8_x_avx2(x, y, n, true); }

K_AVX2 static void k_quant_q8_k_avx2(const float *x, void *vy, int64_t n) {
    PSV_ASSERT(n % QK_K == 0);
    uint8_t *y = vy;
    for (int64_t b = 0; b < n / QK_K; b++, x += QK_K, y += K_Q8_K_SIZE) {
        __m256 mx = _mm256_setzero_ps();
        for (int i = 0; i < 32; i++) mx = _mm256_max_ps(k_abs_ps_avx2(_mm256_loadu_ps(x + 8 * i)), mx);
        float amax = k_hmax_ps_avx2(mx);
        if (amax == 0) {
            memset(y, 0, K_Q8_K_SIZE);
            continue;
        }
        // the first value of that magnitude, with its sign (k_signed_absmax)
        float max = 0;
        for (int i = 0; i < 32; i++) {
            int m = _mm256_movemask_ps(_mm256_cmp_ps(k_abs_ps_avx2(_mm256_loadu_ps(x + 8 * i)), _mm256_set1_ps(amax), _CMP_EQ_OQ));
            if (m) {
                max = x[8 * i + __builtin_ctz((unsigned)m)];
                break;
            }
        }
        float iscale = -127.0f / max;
        __m256 is = _mm256_set1_ps(iscale);
        __m256i sums[8];
        for (int g = 0; g < 8; g++) { // 32 values: bsums 2g and 2g + 1
            __m256i q[4];
            for (int i = 0; i < 4; i++) q[i] = k_round_even_avx2(_mm256_mul_ps(is, _mm256_loadu_ps(x + 32 * g + 8 * i)));
            _mm256_storeu_si256((__m256i *)(void *)(y + 4 + 32 * g), k_pack_i8_avx2(q[0], q[1], q[2], q[3]));
            // lanes 0-3: sum of the first 16 values, lanes 4-7: of the next 16
            __m256i s01 = _mm256_add_epi32(q[0], q[1]), s23 = _mm256_add_epi32(q[2], q[3]);
            sums[g] = _mm256_blend_epi32(_mm256_add_epi32(s01, _mm256_permute2x128_si256(s01, s01, 1)),
                                         _mm256_add_epi32(s23, _mm256_permute2x128_si256(s23, s23, 1)), 0xf0);
        }
        // sums[g] lanes 0-3 sum to bsum 2g, lanes 4-7 to bsum 2g + 1
        __m256i h0 = _mm256_hadd_epi32(sums[0], sums[1]), h1 = _mm256_hadd_epi32(sums[2], sums[3]);
        __m256i h2 = _mm256_hadd_epi32(sums[4], sums[5]), h3 = _mm256_hadd_epi32(sums[6], sums[7]);
        h0 = _mm256_hadd_epi32(h0, h1); // lane order: b0 b2 b4 b6 | b1 b3 b5 b7
        h2 = _mm256_hadd_epi32(h2, h3); // b8 b10 b12 b14 | b9 b11 b13 b15
        int32_t t[16];
        _mm256_storeu_si256((__m256i *)(void *)t, h0);
        _mm256_storeu_si256((__m256i *)(void *)(t + 8), h2);
        for (int k = 0; k < 4; k++) {
            wr_u16(y + 260 + 2 * (2 * k), (uint16_t)t[k]);
            wr_u16(y + 260 + 2 * (2 * k + 1), (uint16_t)t[4 + k]);
            wr_u16(y + 260 + 2 * (8 + 2 * k), (uint16_t)t[8 + k]);
            wr_u16(y + 260 + 2 * (8 + 2 * k + 1), (uint16_t)t[12 + k]);
        }
        wr_u32(y, f32_bits(1.0f / iscale));
    }
}

// F16C rounds to nearest even and handles overflow, subnormals and NaN as psv_f32_to_fp16.
K_AVX2 static void k_quant_f16_avx2(const float *x, void *vy, int64_t n) {
    uint8_t *y = vy;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(void *)(y + 2 * i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) k_st_f16(y + 2 * i, x[i]);
}

// psv_f32_to_bf16 on 8 lanes: round to nearest even on the upper half, NaN -> quiet NaN.
K_AVX2 static void k_quant_bf16_avx2(const float *x, void *vy, int64_t n) {
    uint8_t *y = vy;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i r[2];
        for (int h = 0; h < 2; h++) {
            __m256i u = _mm256_castps_si256(_mm256_loadu_ps(x + i + 8 * h));
            __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
            __m256i bias = _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1)));
            __m256i rn = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
            __m256i qn = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
            r[h] = _mm256_blendv_epi8(rn, qn, nan);
        }
        __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r[0], r[1]), 0xd8);
        _mm256_storeu_si256((__m256i *)(void *)(y + 2 * i), p);
    }
    for (; i < n; i++) wr_u16(y + 2 * i, psv_f32_to_bf16(x[i]));
}

// ---- AVX-512 VNNI: the integer dot products -------------------------------------------------
// The AVX2 kernels' structure and unpacking, with VNNI's vpdpbusd (sum of four u8*s8 products
// into an int32 lane, no intermediate saturation) and vpdpwssd (madd into an accumulator) on
// 256-bit vectors. Q8_0 x Q8_0 becomes sum (a + 128) qx - 128 sum qx: a + 128 is the activation
// byte with its top bit flipped (unsigned), and the correction depends on the weight block only.

// As k_w32_unpack_avx2, except Q8_0, Q4_0 and Q5_0: a = the signed quants (q - 8 and q - 16 for
// the 4- and 5-bit types), b = -128 * (sum of each 4 of them). The activation side then needs
// one vpdpbusd per block, (a + 128) . w + b, and the correction b is paid once per weight block,
// not once per activation row.
K_AVX512 K_INLINE k_w32_avx2 k_w32_unpack_avx512(uint32_t type, const uint8_t *x) {
    if (type != T_Q8_0 && type != T_Q4_0 && type != T_Q5_0) return k_w32_unpack_avx2(type, x);
    k_w32_avx2 w;
    if (type == T_Q8_0) w.a = k_load256(x + 2);
    else w.a = _mm256_sub_epi8(k_w32_unpack_avx2(type, x).a, _mm256_set1_epi8(type == T_Q4_0 ? 8 : 16));
    w.b = _mm256_sub_epi32(_mm256_setzero_si256(),
                           _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8((char)0x80), w.a));
    return w;
}

K_AVX512 K_INLINE __m256i k_w32_dot_avx512(uint32_t type, k_w32_avx2 w, const uint8_t *yb) {
    const __m256i z = _mm256_setzero_si256();
    if (type == T_Q8_0 || type == T_Q4_0 || type == T_Q5_0) // |lane| <= 4 * 255 * 128 before the correction
        return _mm256_dpbusd_epi32(w.b, _mm256_xor_si256(k_load256(yb + 2), _mm256_set1_epi8((char)0x80)), w.a);
    __m256i a = k_load256(yb + 4); // Q4_1, Q5_1: unsigned quants against Q8_1
    return _mm256_dpbusd_epi32(z, w.a, a);
}

// k_rows32_avx2 with the VNNI block dot.
K_AVX512 K_INLINE void k_rows32_avx512(uint32_t type, int64_t n, float *s, int64_t ss, const uint8_t *x,
                                       const uint8_t *y, size_t ys, int nr) {
    PSV_ASSERT(n % 32 == 0);
    const size_t xs = k_w32_size(type), as = k_a32_size(type);
    const bool min = type == T_Q4_1 || type == T_Q5_1;
    const int64_t nb = n / 32;
    __m256d accv[K_ROWS_MAX]; // the K_BLOCK_LANES lanes of each row
    for (int r = 0; r < nr; r++) accv[r] = _mm256_setzero_pd();
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4) {
        const uint8_t *xb = x + (size_t)b * xs;
        k_w32_avx2 w0 = k_w32_unpack_avx512(type, xb), w1 = k_w32_unpack_avx512(type, xb + xs);
        k_w32_avx2 w2 = k_w32_unpack_avx512(type, xb + 2 * xs), w3 = k_w32_unpack_avx512(type, xb + 3 * xs);
        __m256d dx = _mm256_cvtps_pd(k_f16x4_avx2(xb, xb + xs, xb + 2 * xs, xb + 3 * xs)), mx = dx;
        if (min) mx = _mm256_cvtps_pd(k_f16x4_avx2(xb + 2, xb + xs + 2, xb + 2 * xs + 2, xb + 3 * xs + 2));
        for (int r = 0; r < nr; r++) {
            const uint8_t *yb = y + (size_t)r * ys + (size_t)b * as;
            __m128i is = k_hsum4_i32_avx2(k_w32_dot_avx512(type, w0, yb), k_w32_dot_avx512(type, w1, yb + as),
                                          k_w32_dot_avx512(type, w2, yb + 2 * as), k_w32_dot_avx512(type, w3, yb + 3 * as));
            __m256d dy = _mm256_cvtps_pd(k_f16x4_avx2(yb, yb + as, yb + 2 * as, yb + 3 * as));
            __m256d t = _mm256_mul_pd(_mm256_mul_pd(dx, dy), _mm256_cvtepi32_pd(is));
            if (min) {
                __m256d sy = _mm256_cvtps_pd(k_f16x4_avx2(yb + 2, yb + as + 2, yb + 2 * as + 2, yb + 3 * as + 2));
                t = _mm256_add_pd(t, _mm256_mul_pd(mx, sy));
            }
            accv[r] = _mm256_add_pd(accv[r], k_no_fuse_pd_avx2(t));
        }
    }
    double acc[K_ROWS_MAX][K_BLOCK_LANES];
    for (int r = 0; r < nr; r++) _mm256_storeu_pd(acc[r], accv[r]);
    for (; b < nb; b++) {
        const uint8_t *xb = x + (size_t)b * xs;
        k_w32_avx2 w = k_w32_unpack_avx512(type, xb);
        for (int r = 0; r < nr; r++) {
            const uint8_t *yb = y + (size_t)r * ys + (size_t)b * as;
            int32_t isum = k_hsum_i32_avx2(k_w32_dot_avx512(type, w, yb));
            double t = (double)k_f16_avx2(xb) * (double)k_f16_avx2(yb) * (double)isum;
            if (min) t += (double)k_f16_avx2(xb + 2) * (double)k_f16_avx2(yb + 2);
            acc[r][b % K_BLOCK_LANES] += k_no_fuse(t);
        }
    }
    for (int r = 0; r < nr; r++) s[r * ss] = k_lanes_sum(acc[r], K_BLOCK_LANES);
}

K_DEF_ROWS(q4_0_q8_0_avx512, k_rows32_avx512, T_Q4_0, K_AVX512)
K_DEF_ROWS(q4_1_q8_1_avx512, k_rows32_avx512, T_Q4_1, K_AVX512)
K_DEF_ROWS(q5_0_q8_0_avx512, k_rows32_avx512, T_Q5_0, K_AVX512)
K_DEF_ROWS(q5_1_q8_1_avx512, k_rows32_avx512, T_Q5_1, K_AVX512)
K_DEF_ROWS(q8_0_q8_0_avx512, k_rows32_avx512, T_Q8_0, K_AVX512)

// Generation's products for the types against Q8_0 (k_gemv_fn): the weight quants as unsigned
// bytes u (Q4_0 and Q5_0 keep their +8/+16 offset, Q8_0 gets +128 by flipping its sign bit), so
// one vpdpbusd per block gives sum(u * a); the offset times the activation block's sum (from the
// side data, computed once per activation row instead of once per weight row) is then taken off:
// isum = sum(u * a) - off * sum(a), the reference's isum exactly. |sum(u * a)| <= 32 * 255 * 128.
// The block scales of the activation come from the side data as doubles.
K_AVX512 K_INLINE __m256i k_gemv_u8_avx512(uint32_t type, const uint8_t *xb) {
    if (type == T_Q8_0) return _mm256_xor_si256(k_load256(xb + 2), _mm256_set1_epi8((char)0x80));
    return k_w32_unpack_avx2(type, xb).a;
}

K_AVX512 K_INLINE void k_gemv32_avx512(uint32_t type, int64_t n, float *s, int64_t ss, const uint8_t *x,
                                       const uint8_t *y, size_t ys, const uint8_t *side, size_t side_stride, int nr) {
    PSV_ASSERT(n % 32 == 0 && nr >= 1 && nr <= K_ROWS_MAX);
    const size_t xs = k_w32_size(type);
    const int64_t nb = n / 32;
    const __m256i z = _mm256_setzero_si256();
    __m256d accv[K_ROWS_MAX];
    for (int r = 0; r < nr; r++) accv[r] = _mm256_setzero_pd();
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4) { // four weight blocks, unpacked once for all the rows
        const uint8_t *xb = x + (size_t)b * xs;
        const __m256i u0 = k_gemv_u8_avx512(type, xb), u1 = k_gemv_u8_avx512(type, xb + xs);
        const __m256i u2 = k_gemv_u8_avx512(type, xb + 2 * xs), u3 = k_gemv_u8_avx512(type, xb + 3 * xs);
        const __m256d dx = _mm256_cvtps_pd(k_f16x4_avx2(xb, xb + xs, xb + 2 * xs, xb + 3 * xs));
        for (int r = 0; r < nr; r++) {
            const uint8_t *yb = y + (size_t)r * ys + (size_t)b * K_Q8_0_SIZE, *sd = side + (size_t)r * side_stride;
            __m128i is = k_hsum4_i32_avx2(_mm256_dpbusd_epi32(z, u0, k_load256(yb + 2)), _mm256_dpbusd_epi32(z, u1, k_load256(yb + 36)),
                                          _mm256_dpbusd_epi32(z, u2, k_load256(yb + 70)), _mm256_dpbusd_epi32(z, u3, k_load256(yb + 104)));
            is = _mm_add_epi32(is, k_load128(sd + k_act_side_o(n) + 4 * b)); // -offset * sum, k_act_side
            __m256d dy = _mm256_loadu_pd((const double *)(const void *)(sd + k_act_side_d(n)) + b);
            // reference: (double)dx * (double)dy * (double)isum
            __m256d t = _mm256_mul_pd(_mm256_mul_pd(dx, dy), _mm256_cvtepi32_pd(is));
            accv[r] = _mm256_add_pd(accv[r], k_no_fuse_pd_avx2(t));
        }
    }
    for (int r = 0; r < nr; r++) {
        const uint8_t *yr = y + (size_t)r * ys, *sd = side + (size_t)r * side_stride;
        const double *dy = (const double *)(const void *)(sd + k_act_side_d(n));
        double acc[K_BLOCK_LANES];
        _mm256_storeu_pd(acc, accv[r]);
        for (int64_t c = b; c < nb; c++) {
            const uint8_t *xb = x + (size_t)c * xs;
            int32_t isum = k_hsum_i32_avx2(_mm256_dpbusd_epi32(z, k_gemv_u8_avx512(type, xb), k_load256(yr + (size_t)c * K_Q8_0_SIZE + 2)));
            int32_t o;
            memcpy(&o, sd + k_act_side_o(n) + 4 * (size_t)c, 4);
            isum += o;
            acc[c % K_BLOCK_LANES] += k_no_fuse((double)k_f16_avx2(xb) * dy[c] * (double)isum);
        }
        s[r * ss] = k_lanes_sum(acc, K_BLOCK_LANES);
    }
}

K_DEF_GEMV(k_gemv_q4_0_avx512, k_gemv32_avx512, T_Q4_0, K_AVX512)
K_DEF_GEMV(k_gemv_q5_0_avx512, k_gemv32_avx512, T_Q5_0, K_AVX512)
K_DEF_GEMV(k_gemv_q8_0_avx512, k_gemv32_avx512, T_Q8_0, K_AVX512)

// 32 bytes at p, then 32 at q.
K_AVX512 K_INLINE __m512i k_cat256(const uint8_t *p, const uint8_t *q) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(k_load256(p)), k_load256(q), 1);
}

// As k_no_fuse, for eight doubles.
K_AVX512 K_INLINE __m512d k_no_fuse_pd512(__m512d v) {
    __asm__("" : "+v"(v));
    return v;
}

// Two vectors of weights just loaded, kept as plain loads: without this gcc folds them into
// the instructions that use them (vpermt2w) or loads them again where they are used twice,
// and such loads, waiting for memory, measured far slower on Zen 5 (Q4_0 gemv1, rows
// of 4864 values from memory: 19 -> 39 GB/s; clang's code had plain loads already: 37).
K_AVX512 K_INLINE void k_loaded2(__m512i *a, __m512i *b) { __asm__("" : "+v"(*a), "+v"(*b)); }

// Four rows' vectors of int32 sums r[0..3] reduced within each 128-bit lane: int32 j of lane l
// is the sum of lane l of r[j] (a transpose and add).
K_AVX512 K_INLINE __m512i k_sum4_lanes_avx512(const __m512i r[4]) {
    const __m512i t0 = _mm512_add_epi32(_mm512_unpacklo_epi32(r[0], r[1]), _mm512_unpackhi_epi32(r[0], r[1]));
    const __m512i t1 = _mm512_add_epi32(_mm512_unpacklo_epi32(r[2], r[3]), _mm512_unpackhi_epi32(r[2], r[3]));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1));
}

// Generation's product of one activation row against many weight rows (k_gemv1_fn), Q4_0: four
// weight rows and four blocks (128 values) a step, in 512-bit vectors, so that the work per
// block that is not multiply-adding (block sums, scales, conversions) is shared by four rows and
// four blocks. A row's four blocks of quants go into one vector (16 bytes each, by a word
// permute of the row's bytes); the activation's low and high halves of the same blocks, each
// block's -8 * sum(a) in its first lane and its scale as floats come laid out from the side data
// (k_act_side_x). Two vpdpbusd per row leave each block's products in four int32 lanes, started
// from that -8 * sum(a). A transpose-and-add turns the four rows' vectors into [block][row] sums,
// which are scaled and added in double exactly as the reference does it (lane b % 4 of each
// row), the four rows side by side. The rows' block scales come out of their first 64 bytes by
// word permutes. Q8_0 the same way, from two vectors per row of two whole blocks each (with
// 128 added: vpdpbusd multiplies unsigned bytes, the side data's -128 * sum(a) takes it off),
// whose 128-bit lanes add up to the four blocks' lanes; its scales are gathered in general
// registers (measured, Q8_0 rows of 896 values from memory: 20-22 GB/s a row at a time with the
// one-row kernel, 25-27 GB/s so).
K_AVX512 K_INLINE void k_gemv1_avx512(uint32_t type, int64_t n, float *s, const uint8_t *x, size_t x_stride, int nw,
                                      const uint8_t *y, const uint8_t *side) {
    PSV_ASSERT(n % 32 == 0 && nw >= 1 && (type == T_Q4_0 || type == T_Q5_0 || type == T_Q8_0));
    const bool five = type == T_Q5_0, eight = type == T_Q8_0;
    const size_t xs = k_w32_size(type);
    const int64_t nb = n / 32, ng = nb / 4;
    const uint8_t *so = side + k_act_side_o(n); // int32 -off * sum(a) of each block
    const double *dy = (const double *)(const void *)(side + k_act_side_d(n));
    // word indices: the quants of a row's four blocks from (x, x + 8) (Q4_0: the blocks at words
    // 0, 9, 18, 27) or (x, x + 24) (Q5_0: at words 0, 11, 22, 33). Q4_0: the block scales of rows
    // 0 and 1 (2 and 3) to word 4 * block + row, from each row's first 64 bytes. Q5_0: per row,
    // from (x, x + 24), block j's qh to words 8j, 8j + 1 and its scale to word 8j + 2, and then
    // the scales of two rows as Q4_0's from those.
    __m512i isc, iqs, iqh = _mm512_setzero_si512();
    {
        uint16_t sc[32] = {0}, qh[32] = {0}, qs[32];
        for (int p = 0; p < 32; p++) {
            int j = p / 8, k = p % 8;
            int wd = five ? 11 * j + 3 + k : 9 * j + 1 + k; // block j's quants in the row's four blocks
            qs[p] = (uint16_t)(wd < 32 ? wd : 32 + wd - (five ? 12 : 4));
        }
        for (int p = 0; p < 16; p++) sc[p] = (uint16_t)((five ? 8 * (p / 4) + 2 : 9 * (p / 4)) + (p % 2 ? 32 : 0));
        for (int j = 0; j < 4; j++)
            for (int k = 0; k < 3; k++) { // words 1 + 11j, 2 + 11j, 11j
                int wd = 11 * j + (k == 2 ? 0 : 1 + k);
                qh[8 * j + k] = (uint16_t)(wd < 32 ? wd : 32 + wd - 12);
            }
        isc = _mm512_loadu_si512(sc);
        iqs = _mm512_loadu_si512(qs);
        if (five) iqh = _mm512_loadu_si512(qh);
    }
    const __m512i m4 = _mm512_set1_epi8(0x0f), c16 = _mm512_set1_epi8(16);
    // Q5_0: byte i of a 128-bit lane from byte i / 8 (values 0-15) or 2 + i / 8 (16-31) of its
    // qh, then tested against bit i % 8
    const __m512i plo = _mm512_set_epi64(0x0101010101010101, 0, 0x0101010101010101, 0, 0x0101010101010101, 0,
                                         0x0101010101010101, 0);
    const __m512i phi = _mm512_add_epi8(plo, _mm512_set1_epi8(2));
    const __m512i bit = _mm512_set1_epi64((long long)0x8040201008040201ull);
    const __m512i flip = _mm512_set1_epi8((char)0x80), z = _mm512_setzero_si512();
    for (int w = 0; w < k_gemv1_groups(nw); w++) {
        const uint8_t *xr[4];
        k_gemv1_rows(x, x_stride, nw, w, xr);
        __m512d acc01 = _mm512_setzero_pd(), acc23 = _mm512_setzero_pd(); // [lane][row]
        for (int64_t g = 0; g < ng; g++) {
            const uint8_t *xg = side + k_act_side_x(n) + 256 * (size_t)g; // the activation's part
            const __m512i corr = _mm512_loadu_si512(xg + 128);
            __m512i rs[4], l0[4];
            __m256i sc;
            if (eight) {
                const uint8_t *yb = y + (size_t)g * 4 * K_Q8_0_SIZE;
                const __m512i a01 = k_cat256(yb + 2, yb + 36), a23 = k_cat256(yb + 70, yb + 104);
                uint64_t h[4]; // block j's scales of the four rows
                K_UNROLL
                for (int j = 0; j < 4; j++) {
                    const size_t o = (size_t)(4 * g + j) * xs;
                    h[j] = k_f16x4_bits(xr[0] + o, xr[1] + o, xr[2] + o, xr[3] + o);
                }
                sc = _mm256_set_epi64x((long long)h[3], (long long)h[2], (long long)h[1], (long long)h[0]);
                K_UNROLL
                for (int r = 0; r < 4; r++) {
                    const uint8_t *xb = xr[r] + (size_t)g * 4 * xs;
                    for (size_t o = 0; o < 4 * xs; o += 64) k_prefetch_ahead(xb + o, K_GEMV1_PF); // 136 bytes: 3 lines
                    const __m512i v0 = _mm512_dpbusd_epi32(z, _mm512_xor_si512(k_cat256(xb + 2, xb + 36), flip), a01);
                    const __m512i v1 = _mm512_dpbusd_epi32(z, _mm512_xor_si512(k_cat256(xb + 70, xb + 104), flip), a23);
                    // 128-bit lanes (b0 lo, b0 hi, b1 lo, b1 hi), (b2 lo, ...) added to b0, b1, b2, b3
                    rs[r] = _mm512_add_epi32(corr, _mm512_add_epi32(_mm512_shuffle_i64x2(v0, v1, 0x88),
                                                                    _mm512_shuffle_i64x2(v0, v1, 0xdd)));
                }
            } else {
                const __m512i alo = _mm512_loadu_si512(xg), ahi = _mm512_loadu_si512(xg + 64);
                K_UNROLL
                for (int r = 0; r < 4; r++) {
                    const uint8_t *xb = xr[r] + (size_t)g * 4 * xs;
                    k_prefetch_ahead(xb, K_GEMV1_PF); // a step reads 72 (88) bytes: 8 lines in 9 (11) are asked for
                    __m512i x0 = _mm512_loadu_si512(xb), x1 = _mm512_loadu_si512(xb + (five ? 24 : 8));
                    k_loaded2(&x0, &x1);
                    const __m512i q = _mm512_permutex2var_epi16(x0, iqs, x1);
                    __m512i lo = _mm512_and_si512(q, m4), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
                    l0[r] = x0;
                    if (five) { // the fifth bits: +16 where set
                        l0[r] = _mm512_permutex2var_epi16(x0, iqh, x1);
                        lo = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(_mm512_shuffle_epi8(l0[r], plo), bit), lo, c16);
                        hi = _mm512_mask_add_epi8(hi, _mm512_test_epi8_mask(_mm512_shuffle_epi8(l0[r], phi), bit), hi, c16);
                    }
                    rs[r] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(corr, lo, alo), hi, ahi);
                }
                sc = _mm512_castsi512_si256(_mm512_mask_blend_epi16(0xcccccccc, _mm512_permutex2var_epi16(l0[0], isc, l0[1]),
                                                                     _mm512_permutex2var_epi16(l0[2], isc, l0[3])));
            }
            const __m512i is = k_sum4_lanes_avx512(rs); // rows' four lanes a block: [block][row]
            // reference: (double)dx * (double)dy * (double)isum, added with one FMA as the GEMM
            // does it (the product is exact: see k_gemm_blk_avx512). dx * dy is exact in float
            // too (two fp16 values: 11 + 11 bits, and no smaller than 2^-48).
            const __m512 dxy = _mm512_mul_ps(_mm512_cvtph_ps(sc), _mm512_loadu_ps((const float *)(const void *)(xg + 192)));
            __m512d dxy01 = _mm512_cvtps_pd(_mm512_castps512_ps256(dxy));
            __m512d dxy23 = _mm512_cvtps_pd(_mm256_castsi256_ps(_mm512_extracti64x4_epi64(_mm512_castps_si512(dxy), 1)));
            acc01 = _mm512_fmadd_pd(dxy01, _mm512_cvtepi32_pd(_mm512_castsi512_si256(is)), acc01);
            acc23 = _mm512_fmadd_pd(dxy23, _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(is, 1)), acc23);
        }
        double acc[4][4]; // [lane][row]
        _mm512_storeu_pd(acc[0], acc01);
        _mm512_storeu_pd(acc[2], acc23);
        for (int64_t c = ng * 4; c < nb; c++) { // the last blocks, one by one
            const uint8_t *yc = y + (size_t)c * K_Q8_0_SIZE;
            int32_t o;
            memcpy(&o, so + 4 * (size_t)c, 4);
            for (int r = 0; r < 4; r++) {
                const uint8_t *xb = xr[r] + (size_t)c * xs;
                int32_t isum = k_hsum_i32_avx2(_mm256_dpbusd_epi32(_mm256_setzero_si256(), k_gemv_u8_avx512(type, xb),
                                                                  k_load256(yc + 2))) + o;
                acc[c % 4][r] += k_no_fuse((double)k_f16_avx2(xb) * dy[c] * (double)isum);
            }
        }
        const __m256d lanes[K_BLOCK_LANES] = {_mm256_loadu_pd(acc[0]), _mm256_loadu_pd(acc[1]), _mm256_loadu_pd(acc[2]),
                                              _mm256_loadu_pd(acc[3])};
        k_gemv1_store(lanes, s, w, nw);
    }
}

// k_gemv1_fn for Q4_K: four weight rows a block (256 values), the activation's parts shared by
// them. A row's 128 bytes of quants are two 512-bit vectors whose low and high nibbles are
// sub-blocks (0, 2), (1, 3), (4, 6), (5, 7) (k_unpack_q45_k's order), against the activation's
// quants in that order (side data, k_act_side). vpdpbusd makes the int32 sums of four products
// (|sum| <= 4 * 15 * 128, so two vectors of them pack into int16 exactly: vpackssdw) and
// vpdpwssd weights the packed sums by the sub-block scales (a vector for each two packed
// vectors, shuffled from the eight scale bytes), so each row's lanes add up to its isum. The
// block headers of the four rows (scale, minimum's scale, twelve bytes of six-bit scales and
// minimums) are one vector, unpacked for all four at once (k_scale_min_k4 in each 128-bit lane);
// msum is the minimums, each twice, against the activation's stored bsums (sums of 16). The
// rows' sums are reduced together and their terms formed side by side, exactly the reference's
// dy * (d * isum - dmin * msum). Per row and block this is about 35 instructions where scalar
// unpacking of the scales and a reduction per row took 70: 43 -> 52 GB/s in the cache, 32 -> 37
// GB/s from memory (one thread, Zen 5; its read bandwidth 39).
K_AVX512 static void k_gemv1_q4_k_avx512(int64_t n, float *s, const uint8_t *x, size_t x_stride, int nw,
                                         const uint8_t *y, const uint8_t *side) {
    PSV_ASSERT(n % QK_K == 0 && nw >= 1);
    (void)y;
    const int64_t nb = n / QK_K;
    const double *dys = (const double *)(const void *)(side + k_act_side_d(n));
    const uint8_t *ax = side + k_act_side_size(T_Q8_K, n); // 384 bytes a block (k_act_side)
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    // scale vector v for the packed sums of sub-blocks (4v, 4v + 1) in 128-bit lanes 0-1 and
    // (4v + 2, 4v + 3) in lanes 2-3 (vpackssdw: the first vector's four int32 lanes of a 128-bit
    // lane, then the second's): each scale byte zero-extended to int16 (0x80 picks a zero)
    __m512i pick[2];
    for (int v = 0; v < 2; v++) {
        uint8_t b[64];
        for (int i = 0; i < 64; i++) b[i] = i % 2 ? 0x80 : (uint8_t)(4 * v + 2 * (i / 32) + (i % 16) / 8);
        pick[v] = _mm512_loadu_si512(b);
    }
    // the header of row r in 128-bit lane r: dwords [d dmin, u0, u1, u2]; the scales are
    // [u0 & 0x3f.., (u2 & 0x0f..) | (u0 >> 2 & 0x30..)], the minimums the same of u1 and u2 >> 4
    const __m512i shv = _mm512_set4_epi32(4, 0, 0, 0), ma = _mm512_set4_epi32(0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f);
    const __m512i mb = _mm512_set4_epi32(0x30303030, 0, 0x30303030, 0);
    // minimums 0-3 (4-7) of a row, each twice as int16, against bsums 0-7 (8-15)
    const __m512i mlo = _mm512_set4_epi32((int)0x800b800b, (int)0x800a800a, (int)0x80098009, (int)0x80088008);
    const __m512i mhi = _mm512_set4_epi32((int)0x800f800f, (int)0x800e800e, (int)0x800d800d, (int)0x800c800c);
    const __m512i fp16 = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                          25, 17, 9, 1, 24, 16, 8, 0); // d of rows 0-3, then dmin
    const __m512i first4 = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0); // lane r's first int32
    __m512i lane[4]; // row r's 128-bit lane to all four
    for (int r = 0; r < 4; r++) lane[r] = _mm512_set4_epi32(4 * r + 3, 4 * r + 2, 4 * r + 1, 4 * r);
    for (int w = 0; w < k_gemv1_groups(nw); w++) {
        const uint8_t *xr[4];
        k_gemv1_rows(x, x_stride, nw, w, xr);
        __m256d acc[K_BLOCK_LANES]; // lane l of the four rows
        for (int l = 0; l < K_BLOCK_LANES; l++) acc[l] = _mm256_setzero_pd();
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *a = ax + 384 * (size_t)b;
            const uint8_t *xb[4];
            K_UNROLL
            for (int r = 0; r < 4; r++) {
                xb[r] = xr[r] + (size_t)b * K_Q4_K_SIZE;
                for (size_t o = 0; o < K_Q4_K_SIZE; o += 64) k_prefetch_ahead(xb[r] + o, K_GEMV1_PF); // 144 bytes: 3 lines
            }
            __m512i h = _mm512_castsi128_si512(k_load128(xb[0]));
            h = _mm512_inserti32x4(h, k_load128(xb[1]), 1);
            h = _mm512_inserti32x4(h, k_load128(xb[2]), 2);
            h = _mm512_inserti32x4(h, k_load128(xb[3]), 3);
            // hu = [u0, u2, u1, u2 >> 4] masked, hv = [u0, u0, u1, u1] >> 2; sm = hu | (hv & mb):
            // scales 0-7 in bytes 0-7 of each row's lane, minimums 0-7 in bytes 8-15
            const __m512i hu = _mm512_and_si512(_mm512_srlv_epi32(_mm512_shuffle_epi32(h, (_MM_PERM_ENUM)0xED), shv), ma);
            const __m512i hv = _mm512_srli_epi32(_mm512_shuffle_epi32(h, (_MM_PERM_ENUM)0xA5), 2);
            const __m512i sm = _mm512_ternarylogic_epi32(hu, hv, mb, 0xF8);
            __m512i t[4];
            K_UNROLL
            for (int r = 0; r < 4; r++) {
                const __m512i z0 = _mm512_loadu_si512(xb[r] + 16), z1 = _mm512_loadu_si512(xb[r] + 80);
                const __m512i q[4] = {_mm512_and_si512(z0, m4), _mm512_and_si512(_mm512_srli_epi16(z0, 4), m4),
                                      _mm512_and_si512(z1, m4), _mm512_and_si512(_mm512_srli_epi16(z1, 4), m4)};
                __m512i d[4]; // |lane| <= 4 * 15 * 128: int16, so packing two vectors into one is exact
                K_UNROLL
                for (int v = 0; v < 4; v++) d[v] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[v], _mm512_loadu_si512(a + 64 * v));
                const __m512i sw = _mm512_permutexvar_epi32(lane[r], sm);
                t[r] = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_packs_epi32(d[0], d[1]), _mm512_shuffle_epi8(sw, pick[0]));
                t[r] = _mm512_dpwssd_epi32(t[r], _mm512_packs_epi32(d[2], d[3]), _mm512_shuffle_epi8(sw, pick[1]));
            }
            // the four rows' sums: in each 128-bit lane [row 0, 1, 2, 3], then the lanes added
            const __m512i tt = k_sum4_lanes_avx512(t);
            const __m256i t8 = _mm256_add_epi32(_mm512_castsi512_si256(tt), _mm512_extracti64x4_epi64(tt, 1));
            const __m256d is = _mm256_cvtepi32_pd(_mm_add_epi32(_mm256_castsi256_si128(t8), _mm256_extracti128_si256(t8, 1)));
            // msum of row r in 128-bit lane r: the minimums as int16 against the bsums (stored
            // data, any int16: |msum| <= 16 * 63 * 2^15)
            __m512i m = _mm512_add_epi32(_mm512_madd_epi16(_mm512_shuffle_epi8(sm, mlo), _mm512_loadu_si512(a + 256)),
                                         _mm512_madd_epi16(_mm512_shuffle_epi8(sm, mhi), _mm512_loadu_si512(a + 320)));
            m = _mm512_add_epi32(m, _mm512_shuffle_epi32(m, (_MM_PERM_ENUM)0x4E));
            m = _mm512_add_epi32(m, _mm512_shuffle_epi32(m, (_MM_PERM_ENUM)0xB1));
            const __m256d ms = _mm256_cvtepi32_pd(_mm512_castsi512_si128(_mm512_permutexvar_epi32(first4, m)));
            const __m512d dd = _mm512_cvtps_pd(_mm256_cvtph_ps(_mm512_castsi512_si128(_mm512_permutexvar_epi16(fp16, h))));
            const __m256d dx = _mm512_castpd512_pd256(dd), dm = _mm512_extractf64x4_pd(dd, 1);
            // the reference: dy * (d * isum - dmin * msum)
            __m256d tm = _mm256_mul_pd(_mm256_set1_pd(dys[b]), _mm256_sub_pd(_mm256_mul_pd(dx, is), _mm256_mul_pd(dm, ms)));
            acc[b % K_BLOCK_LANES] = _mm256_add_pd(acc[b % K_BLOCK_LANES], k_no_fuse_pd_avx2(tm));
        }
        k_gemv1_store(acc, s, w, nw);
    }
}

// k_gemv1_fn for Q6_K, as the Q4_K one: four weight rows a block. Each half block h (128 values)
// is two vectors of quants in value order: the low and high nibbles of its 64 ql bytes, with the
// two high bits from the 32 qh bytes (in both halves of a vector, shifted into place by a
// variable shift per half). The quants stay unsigned (q + 32), the activation is read as it is,
// and vpdpwssd weights vpmaddubsw's int16 pairs (|pair| <= 2 * 63 * 128) by the scale of each
// 16 values (one per 128-bit lane); the offset comes off per block through the activation's sums
// of 16 (side data), 32 * sum_k scale_k * sum_k, as k_wk_off_avx2 does it.
K_AVX512 static void k_gemv1_q6_k_avx512(int64_t n, float *s, const uint8_t *x, size_t x_stride, int nw,
                                         const uint8_t *y, const uint8_t *side) {
    PSV_ASSERT(n % QK_K == 0 && nw >= 1);
    const int64_t nb = n / QK_K;
    const double *dys = (const double *)(const void *)(side + k_act_side_d(n));
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    // qh bits 2k of value 32k + l to bits 4-5: values 0-31 and 32-63 of a half (k = 0, 1) shift
    // left by 4 and 2, values 64-95 and 96-127 (k = 2, 3) right by 0 and 2
    const __m512i shl = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i shr = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    __m512i pick[4]; // vector v of a block (values 64v...): in 128-bit lane l, the scale of 16 values 4v + l
    for (int v = 0; v < 4; v++) {
        uint16_t w[32];
        for (int i = 0; i < 32; i++) w[i] = (uint16_t)(4 * v + i / 8);
        pick[v] = _mm512_loadu_si512(w);
    }
    for (int w = 0; w < k_gemv1_groups(nw); w++) {
        const uint8_t *xr[4];
        k_gemv1_rows(x, x_stride, nw, w, xr);
        __m256d acc[K_BLOCK_LANES]; // lane l of the four rows
        for (int l = 0; l < K_BLOCK_LANES; l++) acc[l] = _mm256_setzero_pd();
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *a = y + (size_t)b * K_Q8_K_SIZE + 4;
            const __m256i sums = k_load256(side + 32 * b);
            __m256i iv[4];
            K_UNROLL
            for (int r = 0; r < 4; r++) {
                const uint8_t *xb = xr[r] + (size_t)b * K_Q6_K_SIZE;
                for (size_t o = 0; o < K_Q6_K_SIZE; o += 64) k_prefetch_ahead(xb + o, K_GEMV1_PF); // 210 bytes: 4 lines
                const __m256i sc16 = _mm256_cvtepi8_epi16(k_load128(xb + 192));
                const __m512i scz = _mm512_castsi256_si512(sc16);
                __m512i t = _mm512_setzero_si512();
                K_UNROLL
                for (int h = 0; h < 2; h++) {
                    const __m512i ql = _mm512_loadu_si512(xb + 64 * h);
                    const __m512i qh = _mm512_broadcast_i64x4(k_load256(xb + 128 + 32 * h));
                    const __m512i qa = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_and_si512(_mm512_sllv_epi16(qh, shl), m30));
                    const __m512i qb = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                                       _mm512_and_si512(_mm512_srlv_epi16(qh, shr), m30));
                    t = _mm512_dpwssd_epi32(t, _mm512_maddubs_epi16(qa, _mm512_loadu_si512(a + 128 * h)),
                                            _mm512_permutexvar_epi16(pick[2 * h], scz));
                    t = _mm512_dpwssd_epi32(t, _mm512_maddubs_epi16(qb, _mm512_loadu_si512(a + 128 * h + 64)),
                                            _mm512_permutexvar_epi16(pick[2 * h + 1], scz));
                }
                // |32 * sum_k scale_k * sum_k| <= 32 * 16 * 128 * 2048 = 2^27
                __m256i corr = _mm256_slli_epi32(_mm256_madd_epi16(sc16, sums), 5);
                iv[r] = _mm256_sub_epi32(_mm256_add_epi32(_mm512_castsi512_si256(t), _mm512_extracti64x4_epi64(t, 1)), corr);
            }
            __m256d is = _mm256_cvtepi32_pd(k_hsum4_i32_avx2(iv[0], iv[1], iv[2], iv[3]));
            __m256d dx = _mm256_cvtps_pd(k_f16x4_avx2(xr[0] + (size_t)b * K_Q6_K_SIZE + 208, xr[1] + (size_t)b * K_Q6_K_SIZE + 208,
                                                      xr[2] + (size_t)b * K_Q6_K_SIZE + 208, xr[3] + (size_t)b * K_Q6_K_SIZE + 208));
            // the reference: (double)d * (double)dy * (double)isum
            __m256d t = _mm256_mul_pd(_mm256_mul_pd(dx, _mm256_set1_pd(dys[b])), is);
            acc[b % K_BLOCK_LANES] = _mm256_add_pd(acc[b % K_BLOCK_LANES], k_no_fuse_pd_avx2(t));
        }
        k_gemv1_store(acc, s, w, nw);
    }
}

K_AVX512 static void k_gemv1_q4_0_avx512(int64_t n, float *s, const uint8_t *x, size_t x_stride, int nw,
                                         const uint8_t *y, const uint8_t *side) {
    k_gemv1_avx512(T_Q4_0, n, s, x, x_stride, nw, y, side);
}
K_AVX512 static void k_gemv1_q5_0_avx512(int64_t n, float *s, const uint8_t *x, size_t x_stride, int nw,
                                         const uint8_t *y, const uint8_t *side) {
    k_gemv1_avx512(T_Q5_0, n, s, x, x_stride, nw, y, side);
}
K_AVX512 static void k_gemv1_q8_0_avx512(int64_t n, float *s, const uint8_t *x, size_t x_stride, int nw,
                                         const uint8_t *y, const uint8_t *side) {
    k_gemv1_avx512(T_Q8_0, n, s, x, x_stride, nw, y, side);
}

// k_wk_dot_avx2 with vpdpwssd applying the scales.
K_AVX512 K_INLINE void k_wk_dot_avx512(const k_wk_avx2 *w, const uint8_t *yb, const uint8_t *sums, bool has_min,
                                       __m256i *iv, __m256i *mv) {
    const uint8_t *a = yb + 4;
    __m256i acc = _mm256_setzero_si256();
    const __m256i off = _mm256_set1_epi8((char)w->off);
    if (w->sub32) {
        // one scale per chunk: the chunks' vpdpbusd sums (|lane| <= 4 * 31 * 128) reduced to one
        // vector of the 8 chunk sums, times the 8 scales; its lanes add up to isum
        __m256i d[8];
        K_UNROLL
        for (int c = 0; c < 8; c++) d[c] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), w->q[c], k_load256(a + 32 * c));
        __m256i h0 = _mm256_hadd_epi32(_mm256_hadd_epi32(d[0], d[1]), _mm256_hadd_epi32(d[2], d[3]));
        __m256i h1 = _mm256_hadd_epi32(_mm256_hadd_epi32(d[4], d[5]), _mm256_hadd_epi32(d[6], d[7]));
        __m256i cs = _mm256_add_epi32(_mm256_permute2x128_si256(h0, h1, 0x20), _mm256_permute2x128_si256(h0, h1, 0x31));
        acc = _mm256_mullo_epi32(cs, _mm256_cvtepu8_epi32(w->sc8));
    } else {
        K_UNROLL
        for (int c = 0; c < 8; c++) {
            __m256i av = k_load256(a + 32 * c);
            __m256i p = _mm256_maddubs_epi16(w->q[c], av);
            if (w->off && !sums) p = _mm256_sub_epi16(p, _mm256_maddubs_epi16(off, av));
            acc = _mm256_dpwssd_epi32(acc, p, w->sc[c]);
        }
    }
    if (w->off && sums) acc = k_wk_off_avx2(w, acc, sums);
    *iv = acc;
    *mv = has_min ? _mm256_madd_epi16(w->mins, k_load256(yb + 260)) : _mm256_setzero_si256();
}

K_DEF_ROWSK(avx512, K_AVX512)

K_DEF_KQUANTS(avx512, K_AVX512)

// ---- AVX-512: a Q8_0 activation row and its side data in one pass ---------------------------------
// k_quant_q8_0_avx2 and then k_act_side(..., one_row), byte for byte: eight blocks' maxima
// reduced together as there, the values scaled and rounded (ties away from zero,
// k_round_away_avx2's steps) sixteen at a time, and each block's sums of 16, offset term and
// GEMM block (k_act_side_g; with one_row, its part of the one-row kernels' group of four at
// k_act_side_x instead) made from its quants while they are in registers.
K_AVX512 K_INLINE __m512i k_round_away_avx512(__m512 v) {
    v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), v); // NaN -> 0
    v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(-128.0f)), _mm512_set1_ps(127.0f));
    const __m512 a = _mm512_abs_ps(v);
    __m512 t = _mm512_roundscale_ps(a, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __mmask16 up = _mm512_cmp_ps_mask(_mm512_sub_ps(a, t), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    t = _mm512_mask_add_ps(t, up, t, _mm512_set1_ps(1.0f));
    const __m512i sign = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(INT32_MIN));
    return _mm512_cvttps_epi32(_mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(t), sign)));
}

K_AVX512 static void k_quant_side_q8_0_avx512(const float *x, uint8_t *y, int64_t n, int off, uint8_t *side, bool one_row) {
    PSV_ASSERT(n % 32 == 0);
    const int64_t nb = n / 32;
    int16_t *sums = (int16_t *)(void *)side;
    double *dd = (double *)(void *)(side + k_act_side_d(n));
    uint8_t *os = side + k_act_side_o(n), *gs = side + k_act_side_g(n), *xs = side + k_act_side_x(n);
    for (int64_t b0 = 0; b0 < nb; b0 += 8) {
        const int nk = (int)PSV_MIN((int64_t)8, nb - b0);
        const float *xb = x + 32 * b0;
        // the maxima of up to eight blocks (missing ones: 0), into lanes 0-7 of m as in k_quant_q8_0_x8_avx2
        __m256 mx[8];
        K_UNROLL
        for (int b = 0; b < 8; b++) {
            if (b >= nk) {
                mx[b] = _mm256_setzero_ps();
                continue;
            }
            // (vmaxps gives its second operand where either is NaN: NaNs are passed over, as there)
            __m512 v = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(xb + 32 * b)), _mm512_setzero_ps());
            v = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(xb + 32 * b + 16)), v);
            mx[b] = _mm256_max_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
        }
        __m256 d, id;
        k_q8_0_scales8_avx2(mx, &d, &id);
        const __m128i dh = _mm256_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT);
        float ids[8];
        uint16_t dhs[8];
        double dy[8];
        _mm256_storeu_ps(ids, id);
        _mm_storeu_si128((__m128i *)(void *)dhs, dh);
        _mm512_storeu_pd(dy, _mm512_cvtps_pd(_mm256_cvtph_ps(dh))); // the scales as stored, as doubles
        for (int b = 0; b < nk; b++) {
            const int64_t bi = b0 + b;
            const __m512 idv = _mm512_set1_ps(ids[b]);
            const __m128i q0 = _mm512_cvtsepi32_epi8(k_round_away_avx512(_mm512_mul_ps(_mm512_loadu_ps(xb + 32 * b), idv)));
            const __m128i q1 = _mm512_cvtsepi32_epi8(k_round_away_avx512(_mm512_mul_ps(_mm512_loadu_ps(xb + 32 * b + 16), idv)));
            uint8_t *yb = y + (size_t)bi * K_Q8_0_SIZE;
            wr_u16(yb, dhs[b]);
            _mm_storeu_si128((__m128i *)(void *)(yb + 2), q0);
            _mm_storeu_si128((__m128i *)(void *)(yb + 18), q1);
            // sums of 16: the biased bytes' sums of 8 (vpsadbw), less 8 * 128 each
            const __m128i f = _mm_set1_epi8((char)0x80);
            const __m128i s0 = _mm_sad_epu8(_mm_xor_si128(q0, f), _mm_setzero_si128());
            const __m128i s1 = _mm_sad_epu8(_mm_xor_si128(q1, f), _mm_setzero_si128());
            const int t0 = _mm_cvtsi128_si32(s0) + _mm_extract_epi16(s0, 4) - 2048;
            const int t1 = _mm_cvtsi128_si32(s1) + _mm_extract_epi16(s1, 4) - 2048;
            sums[2 * bi] = (int16_t)t0;
            sums[2 * bi + 1] = (int16_t)t1;
            dd[bi] = dy[b];
            const int32_t o = -off * (t0 + t1);
            memcpy(os + 4 * (size_t)bi, &o, 4);
            if (!one_row) { // the GEMM's block
                uint8_t *g = gs + (size_t)bi * K_ACT_G_BLK;
                const double bias = 4503601774854144.0 - (double)o;
                _mm_storeu_si128((__m128i *)(void *)g, q0);
                _mm_storeu_si128((__m128i *)(void *)(g + 16), q1);
                memcpy(g + 32, &dy[b], 8);
                memcpy(g + 40, &bias, 8);
            } else if (bi < nb / 4 * 4) { // the one-row kernels' part of its group's 256 bytes
                uint8_t *g = xs + 256 * (size_t)(bi / 4) + 16 * (size_t)(bi % 4);
                _mm_storeu_si128((__m128i *)(void *)g, q0);
                _mm_storeu_si128((__m128i *)(void *)(g + 64), q1);
                _mm_storeu_si128((__m128i *)(void *)(g + 128), _mm_cvtsi32_si128(o));
                _mm_storeu_ps((float *)(void *)(g + 192), _mm_set1_ps((float)dy[b]));
            }
        }
    }
}

// ---- AVX-512 VNNI: GEMM on panels ---------------------------------------------------------------
// K_GEMM_ROWS_AVX512 activation rows against one panel (see "GEMM panels"): per block, every quant
// vector of the panel is loaded once and multiplied with each row's broadcast activation bytes
// (vpdpbusd: unsigned packed quants times signed activations). Every panel type but Q4_1 comes
// in groups of eight quants (k_panel_g8), 64-byte vectors against eight broadcast bytes, so each
// row's 64-bit lane gathers two int32 sums (whole 512-bit vectors: on a CPU with full-width
// AVX-512 units, such as Zen 5, a 256-bit vpdpbusd does half the work in the same slot; the
// k-quants went from 130-145 to 190-225 GMAC/s in the cache there); the k-quants weight them by
// their sub-block scales (k_scale_acc_avx512) and add the offset and minimum terms from the
// activation's sums of 16 (vpdpwssd on int16 pairs). The block's double term is then formed for
// the eight weight rows at once, exactly as the reference forms it, and added to lane b % 4 of
// each row's four accumulators. Bounds: the dot of 32 values is at most 32 * 255 * 128 < 2^21,
// the k-quants' isum and msum are the reference's (section 11), far inside int32.

// acc + d * sc, lane by lane, for a k-quant's sums d of a sub-block's quants and its scales sc
// (int32). Where every sum fits in int16 and the scales are not negative (Q4_K: 16 products of
// at most 15 * 128 a lane, 30720; Q2_K: 8 of 3 * 128), vpdpwssd does it in one multiply-add:
// the sum's high half is then its sign and the scale's is zero. The other types' sums can reach
// 2^16 (Q5_K, Q6_K) or their scales are signed (Q3_K, Q6_K): vpmulld.
K_AVX512 K_INLINE __m512i k_scale_acc_avx512(uint32_t type, __m512i acc, __m512i d, __m512i sc) {
    if (type == T_Q4_K || type == T_Q2_K) return _mm512_dpwssd_epi32(acc, d, sc);
    return _mm512_add_epi32(acc, _mm512_mullo_epi32(d, sc));
}

// Block b of the panel against R activation rows: the term of each, added to acc[r] (32-value
// blocks) or to term[r] (k-quants). Q4_0, Q5_0 and Q8_0 add with one FMA: their term dx * dy *
// isum is exact in double (11 + 11 + 19 bits), so rounding the product and the sum together
// rounds the same sum as the reference's addition of the product.
K_AVX512 K_INLINE void k_gemm_blk_avx512(uint32_t type, int R, const uint8_t *pb, int64_t b, const uint8_t *const *yr,
                                         const int16_t *const *ar, const double *const *dr, const int32_t *const *ao,
                                         int64_t nb, __m512d *acc, __m512d *term) {
    const bool min = k_panel_min(type);
    const __m512d dx = _mm512_loadu_pd((const double *)(const void *)(pb + k_panel_dx(type)));
    const __m512d dm = min ? _mm512_loadu_pd((const double *)(const void *)(pb + k_panel_dx(type) + 64)) : dx;
    __m256i is[K_GEMM_ROWS_MAX], ms[K_GEMM_ROWS_MAX];
    if (type_table[type].blck_size == 32) {
        const bool q81 = type == T_Q4_1 || type == T_Q5_1;
        const size_t as = q81 ? K_Q8_1_SIZE : K_Q8_0_SIZE, qo = q81 ? 4 : 2;
        if (k_panel_nibbles(type)) { // the high nibbles in a second chain of sums (shorter latency)
            __m256i ih[K_GEMM_ROWS_MAX];
            K_UNROLL
            for (int r = 0; r < R; r++) {
                is[r] = k_panel_off(type) ? k_bcast4_avx2(ao[r] + b) : _mm256_setzero_si256(); // (k_act_side)
                ih[r] = _mm256_setzero_si256();
            }
            K_UNROLL
            for (int s = 0; s < 4; s++) { // steps s (low nibbles) and s + 4 (high)
                __m256i v = k_load256(pb + 32 * s), m4 = _mm256_set1_epi8(15);
                __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                K_UNROLL
                for (int r = 0; r < R; r++) {
                    const uint8_t *a = yr[r] + (size_t)b * as + qo;
                    is[r] = _mm256_dpbusd_epi32(is[r], lo, k_bcast4_avx2(a + 4 * s));
                    ih[r] = _mm256_dpbusd_epi32(ih[r], hi, k_bcast4_avx2(a + 16 + 4 * s));
                }
            }
            K_UNROLL
            for (int r = 0; r < R; r++) {
                is[r] = _mm256_add_epi32(is[r], ih[r]);
                // reference: (double)dx * (double)dy * (double)isum + (double)mx * (double)sy
                __m512d t = _mm512_mul_pd(_mm512_mul_pd(dx, _mm512_set1_pd(dr[r][b])), _mm512_cvtepi32_pd(is[r]));
                t = _mm512_add_pd(t, _mm512_mul_pd(dm, _mm512_set1_pd(dr[r][nb + b])));
                acc[r] = _mm512_add_pd(acc[r], k_no_fuse_pd512(t));
            }
            return;
        }
        // groups of eight (k_panel_g8): each row's 64-bit lane gathers two int32 sums, of the
        // even and the odd groups of four. Q8_0 rows (Q4_0, Q5_0, Q8_0): yr[r] is the row's
        // K_ACT_G_BLK-byte blocks (k_act_side), whose bias for the conversion below takes the
        // offset term; Q8_1 rows (Q5_1) have none (its weights carry a minimum instead).
        __m512i z[K_GEMM_ROWS_MAX];
        K_UNROLL
        for (int r = 0; r < R; r++) z[r] = _mm512_setzero_si512();
        K_UNROLL
        for (int j = 0; j < 4; j++) {
            const __m512i w = _mm512_loadu_si512((const void *)(pb + 64 * j));
            K_UNROLL
            for (int r = 0; r < R; r++) {
                int64_t a8;
                memcpy(&a8, q81 ? yr[r] + (size_t)b * as + qo + 8 * j : yr[r] + (size_t)b * K_ACT_G_BLK + 8 * j, 8);
                z[r] = _mm512_dpbusd_epi32(z[r], w, _mm512_set1_epi64(a8));
            }
        }
        // The two halves added in int32, then the sum made a double without vcvtdq2pd (slow
        // here): its 32 bits, sign bit flipped, as the low mantissa bits of 2^52 + 2^31 (one
        // ternary logic op: (s & 0xffffffff) ^ 0x4330000080000000), less 2^52 + 2^31, exact;
        // Q8_0 rows: less 2^52 + 2^31 - o, which adds the offset term o (|o| <= 128 * 32 * 127) exactly.
        const __m512i lo32 = _mm512_set1_epi64(0xffffffffLL), magic = _mm512_set1_epi64(0x4330000080000000LL);
        const __m512d bias = _mm512_set1_pd(4503601774854144.0); // 2^52 + 2^31
        K_UNROLL
        for (int r = 0; r < R; r++) {
            double dy = 0, gb = 0;
            if (q81)
                dy = dr[r][b];
            else { // the row's block (Q8_0: k_act_side)
                memcpy(&dy, yr[r] + (size_t)b * K_ACT_G_BLK + 32, 8);
                memcpy(&gb, yr[r] + (size_t)b * K_ACT_G_BLK + 40, 8);
            }
            const __m512i sum = _mm512_add_epi32(z[r], _mm512_srli_epi64(z[r], 32));
            const __m512d isum = _mm512_sub_pd(_mm512_castsi512_pd(_mm512_ternarylogic_epi64(sum, lo32, magic, 0x6a)),
                                               q81 ? bias : _mm512_set1_pd(gb));
            // reference: (double)dx * (double)dy * (double)isum [+ (double)mx * (double)sy]
            __m512d dxy = _mm512_mul_pd(dx, _mm512_set1_pd(dy));
            if (!q81) {
                acc[r] = _mm512_fmadd_pd(dxy, isum, acc[r]);
                continue;
            }
            __m512d t = _mm512_mul_pd(dxy, isum);
            t = _mm512_add_pd(t, _mm512_mul_pd(dm, _mm512_set1_pd(dr[r][nb + b])));
            acc[r] = _mm512_add_pd(acc[r], k_no_fuse_pd512(t));
        }
        return;
    }
    // k-quants, in groups of eight (k_panel_g8): each row's 64-bit lane gathers two int32 sums
    // of a sub-block, which its scale (both int32 lanes of the row: a permutation of the panel's
    // eight) multiplies; the two are added once per block. Q4_K/Q5_K: sub-blocks of 32 (the
    // panel has each scale twice, as for 16-value sub-blocks).
    const int sub = type == T_Q4_K || type == T_Q5_K ? 32 : 16, steps = sub / 8;
    const bool cor = type == T_Q3_K || type == T_Q6_K;
    const __m512i twice = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    __m512i iz[K_GEMM_ROWS_MAX];
    if (type == T_Q4_K) { // sub-blocks 2c and 2c + 1 from the low and high nibbles of chunk c
        const __m512i m4 = _mm512_set1_epi8(15);
        for (int c = 0; c < 4; c++) {
            __m512i d0[K_GEMM_ROWS_MAX], d1[K_GEMM_ROWS_MAX];
            K_UNROLL
            for (int r = 0; r < R; r++) d0[r] = d1[r] = _mm512_setzero_si512();
            K_UNROLL
            for (int j = 0; j < 4; j++) {
                const __m512i v = _mm512_loadu_si512((const void *)(pb + 256 * c + 64 * j));
                const __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                K_UNROLL
                for (int r = 0; r < R; r++) {
                    const uint8_t *a = yr[r] + (size_t)b * K_Q8_K_SIZE + 4 + 64 * c + 8 * j;
                    int64_t a0, a1;
                    memcpy(&a0, a, 8);
                    memcpy(&a1, a + 32, 8);
                    d0[r] = _mm512_dpbusd_epi32(d0[r], lo, _mm512_set1_epi64(a0));
                    d1[r] = _mm512_dpbusd_epi32(d1[r], hi, _mm512_set1_epi64(a1));
                }
            }
            const __m512i sc0 = _mm512_permutexvar_epi32(twice, _mm512_castsi256_si512(k_load256(pb + k_panel_sc(type) + 32 * (4 * c))));
            const __m512i sc1 = _mm512_permutexvar_epi32(twice, _mm512_castsi256_si512(k_load256(pb + k_panel_sc(type) + 32 * (4 * c + 2))));
            K_UNROLL
            for (int r = 0; r < R; r++) iz[r] = k_scale_acc_avx512(type, k_scale_acc_avx512(type, c ? iz[r] : _mm512_setzero_si512(), d0[r], sc0), d1[r], sc1);
        }
    } else {
        for (int k = 0; k < QK_K / sub; k++) {
            __m512i d[K_GEMM_ROWS_MAX];
            K_UNROLL
            for (int r = 0; r < R; r++) d[r] = _mm512_setzero_si512();
            K_UNROLL
            for (int j = 0; j < steps; j++) {
                const __m512i w = _mm512_loadu_si512((const void *)(pb + 64 * (k * steps + j)));
                K_UNROLL
                for (int r = 0; r < R; r++) {
                    int64_t a8;
                    memcpy(&a8, yr[r] + (size_t)b * K_Q8_K_SIZE + 4 + sub * k + 8 * j, 8);
                    d[r] = _mm512_dpbusd_epi32(d[r], w, _mm512_set1_epi64(a8));
                }
            }
            const __m512i sc = _mm512_permutexvar_epi32(twice, _mm512_castsi256_si512(k_load256(pb + k_panel_sc(type) + 32 * (k * sub / 16))));
            K_UNROLL
            for (int r = 0; r < R; r++) iz[r] = k_scale_acc_avx512(type, k ? iz[r] : _mm512_setzero_si512(), d[r], sc);
        }
    }
    K_UNROLL
    for (int r = 0; r < R; r++) // row r's two int32 lanes added, into lane r
        is[r] = _mm512_cvtepi64_epi32(_mm512_add_epi32(iz[r], _mm512_srli_epi64(iz[r], 32)));
    K_UNROLL
    for (int r = 0; r < R; r++) ms[r] = _mm256_setzero_si256();
    K_UNROLL
    for (int j = 0; j < 8; j++) {
        if (cor) {
            __m256i c = k_load256(pb + k_panel_cor(type) + 32 * j);
            K_UNROLL
            for (int r = 0; r < R; r++) is[r] = _mm256_dpwssd_epi32(is[r], c, k_bcast4_avx2(ar[r] + 16 * b + 2 * j));
        }
        if (min) {
            __m256i c = k_load256(pb + k_panel_mco(type) + 32 * j);
            K_UNROLL
            for (int r = 0; r < R; r++)
                ms[r] = _mm256_dpwssd_epi32(ms[r], c, k_bcast4_avx2(yr[r] + (size_t)b * K_Q8_K_SIZE + 260 + 4 * j));
        }
    }
    K_UNROLL
    for (int r = 0; r < R; r++) {
        __m512d dy = _mm512_set1_pd(dr[r][b]), t;
        if (min) // reference: dy * (dx * isum - dmin * msum)
            t = _mm512_mul_pd(dy, _mm512_sub_pd(_mm512_mul_pd(dx, _mm512_cvtepi32_pd(is[r])),
                                                _mm512_mul_pd(dm, _mm512_cvtepi32_pd(ms[r]))));
        else // reference: dx * dy * isum
            t = _mm512_mul_pd(_mm512_mul_pd(dx, dy), _mm512_cvtepi32_pd(is[r]));
        term[r] = k_no_fuse_pd512(t);
    }
}

// R (1..K_GEMM_ROWS_AVX512) activation rows y + r * ys, with their k_act_side at side + r * side_stride,
// against a panel of nw weight rows: results to out[r][0..nw-1].
K_AVX512 K_INLINE void k_gemm_core_avx512(uint32_t type, int R, int64_t n, const uint8_t *panel, const uint8_t *y,
                                          size_t ys, const uint8_t *side, size_t side_stride, float *const *out, int nw,
                                          const k_prefetch *pf) {
    const int64_t nb = n / type_table[type].blck_size;
    const size_t bb = k_panel_blk(type);
    const uint8_t *yr[K_GEMM_ROWS_MAX];
    const int16_t *ar[K_GEMM_ROWS_MAX];
    const double *dr[K_GEMM_ROWS_MAX];
    const int32_t *ao[K_GEMM_ROWS_MAX];
    __m512d acc[K_BLOCK_LANES][K_GEMM_ROWS_MAX];
    K_UNROLL
    for (int r = 0; r < R; r++) {
        k_gemm_side(type, n, y + (size_t)r * ys, side + (size_t)r * side_stride, &yr[r], &ar[r], &dr[r], &ao[r]);
        if (k_traits_ref(type)->vec_dot_type == T_Q8_0) yr[r] = side + (size_t)r * side_stride + k_act_side_g(n);
        for (int l = 0; l < K_BLOCK_LANES; l++) acc[l][r] = _mm512_setzero_pd();
    }
    // Block b's terms go to lane b % 4. The k-quants' large block body is inlined once and only
    // the additions are switched on the lane (a copy of the body per lane made the file slow to
    // compile; the branch repeats with period four, so it is predicted). The small 32-value
    // blocks go four at a time first, where that branch would cost more than the copies.
    int64_t b = 0;
    if (type_table[type].blck_size == 32)
        for (; b + K_BLOCK_LANES <= nb; b += K_BLOCK_LANES) {
            if (pf) k_prefetch_blks(pf, b, K_BLOCK_LANES);
            K_UNROLL
            for (int l = 0; l < K_BLOCK_LANES; l++)
                k_gemm_blk_avx512(type, R, panel + (size_t)(b + l) * bb, b + l, yr, ar, dr, ao, nb, acc[l], NULL);
        }
    for (; b < nb; b++) {
        __m512d t[K_GEMM_ROWS_MAX];
        if (pf) k_prefetch_blks(pf, b, 1);
        if (type_table[type].blck_size == 32) { // the last blocks of a row of 32-value blocks
            const uint8_t *pb = panel + (size_t)b * bb;
            switch (b % K_BLOCK_LANES) {
            case 0: k_gemm_blk_avx512(type, R, pb, b, yr, ar, dr, ao, nb, acc[0], NULL); break;
            case 1: k_gemm_blk_avx512(type, R, pb, b, yr, ar, dr, ao, nb, acc[1], NULL); break;
            case 2: k_gemm_blk_avx512(type, R, pb, b, yr, ar, dr, ao, nb, acc[2], NULL); break;
            default: PSV_ASSERT(0); // at most three blocks are left after the groups of four
            }
            continue;
        }
        k_gemm_blk_avx512(type, R, panel + (size_t)b * bb, b, yr, ar, dr, ao, nb, NULL, t);
        switch (b % K_BLOCK_LANES) { // constant indices keep the accumulators in registers
        case 0: K_UNROLL for (int r = 0; r < R; r++) acc[0][r] = _mm512_add_pd(acc[0][r], t[r]); break;
        case 1: K_UNROLL for (int r = 0; r < R; r++) acc[1][r] = _mm512_add_pd(acc[1][r], t[r]); break;
        case 2: K_UNROLL for (int r = 0; r < R; r++) acc[2][r] = _mm512_add_pd(acc[2][r], t[r]); break;
        default: K_UNROLL for (int r = 0; r < R; r++) acc[3][r] = _mm512_add_pd(acc[3][r], t[r]); break;
        }
    }
    const __mmask8 mask = (__mmask8)((1u << nw) - 1);
    K_UNROLL
    for (int r = 0; r < R; r++) { // the reference's ((lane0 + lane1) + lane2) + lane3, rounded once
        __m512d v = _mm512_add_pd(_mm512_add_pd(_mm512_add_pd(acc[0][r], acc[1][r]), acc[2][r]), acc[3][r]);
        _mm256_mask_storeu_ps(out[r], mask, _mm512_cvtpd_ps(v));
    }
}

#define K_DEF_GEMM(name, type)                                                                            \
    K_AVX512 static void k_gemm_##name##_avx512(int64_t n, const uint8_t *panel, const uint8_t *y, size_t ys, \
                                                const uint8_t *side, size_t side_stride, int nr, float *const *out, int nw, \
                                                const k_prefetch *pf) {                                    \
        PSV_ASSERT(nr >= 1 && nr <= K_GEMM_ROWS_AVX512 && nw >= 1 && nw <= K_PANEL);                       \
        if (nr == K_GEMM_ROWS_AVX512)                                                                      \
            k_gemm_core_avx512(type, K_GEMM_ROWS_AVX512, n, panel, y, ys, side, side_stride, out, nw, pf); \
        else if (nr == K_GEMM_ROWS_AVX512 - 1) /* (mm_gemm_rows: the calls that make up the rest) */       \
            k_gemm_core_avx512(type, K_GEMM_ROWS_AVX512 - 1, n, panel, y, ys, side, side_stride, out, nw, pf); \
        else                                                                                               \
            for (int r = 0; r < nr; r++, pf = NULL)                                                        \
                k_gemm_core_avx512(type, 1, n, panel, y + (size_t)r * ys, ys, side + (size_t)r * side_stride, side_stride, out + r, nw, pf); \
    }
K_DEF_GEMM(q4_0, T_Q4_0)
K_DEF_GEMM(q4_1, T_Q4_1)
K_DEF_GEMM(q5_0, T_Q5_0)
K_DEF_GEMM(q5_1, T_Q5_1)
K_DEF_GEMM(q8_0, T_Q8_0)
K_DEF_GEMM(q2_k, T_Q2_K)
K_DEF_GEMM(q3_k, T_Q3_K)
K_DEF_GEMM(q4_k, T_Q4_K)
K_DEF_GEMM(q5_k, T_Q5_K)
K_DEF_GEMM(q6_k, T_Q6_K)

// ---- AVX-512: attention's dot products -----------------------------------------------------------
// k_dot_keys_avx2's scheme with a whole block of K_KEY_BLOCK = 8 keys in a register, for up to
// eight queries at a time (grouped-query attention: the query heads that share a KV head).
K_AVX512 K_INLINE void k_dot_keys_blk_avx512(const int c, float *s, size_t s_stride, const double *qd, const float *k,
                                             size_t bstride, int64_t nk, int64_t n) {
    for (int64_t p = 0; p < nk; p += K_KEY_BLOCK) {
        const float *kb = k + (size_t)(p / K_KEY_BLOCK) * bstride;
        __m512d tot[8];
        for (int l = 0; l < K_LANES; l++) {
            __m512d lane[8];
            K_UNROLL
            for (int g = 0; g < c; g++) lane[g] = _mm512_setzero_pd();
            for (int64_t i = l; i < n; i += K_LANES) {
                const __m512d kv = _mm512_cvtps_pd(_mm256_loadu_ps(kb + (size_t)i * K_KEY_BLOCK));
                K_UNROLL
                for (int g = 0; g < c; g++)
                    lane[g] = _mm512_fmadd_pd(kv, _mm512_set1_pd(qd[(size_t)g * K_KEYS_MAX_N + (size_t)i]), lane[g]);
            }
            K_UNROLL
            for (int g = 0; g < c; g++) tot[g] = l == 0 ? lane[g] : _mm512_add_pd(tot[g], lane[g]);
        }
        const __mmask8 mask = (__mmask8)((1u << PSV_MIN((int64_t)K_KEY_BLOCK, nk - p)) - 1);
        K_UNROLL
        for (int g = 0; g < c; g++) _mm256_mask_storeu_ps(s + (size_t)g * s_stride + (size_t)p, mask, _mm512_cvtpd_ps(tot[g]));
    }
}

K_AVX512 static void k_dot_keys_avx512(float *s, size_t s_stride, const float *q, size_t q_stride, int nq,
                                       const float *k, size_t bstride, int64_t nk, int64_t n) {
    if (n > K_KEYS_MAX_N) {
        k_dot_keys_ref(s, s_stride, q, q_stride, nq, k, bstride, nk, n);
        return;
    }
    const int chunks = (nq + 7) / 8, per = (nq + chunks - 1) / chunks;
    double qd[8 * K_KEYS_MAX_N];
    for (int g0 = 0; g0 < nq; g0 += per) {
        const int c = PSV_MIN(per, nq - g0);
        float *sg = s + (size_t)g0 * s_stride;
        k_keys_queries_pd(qd, q, q_stride, g0, c, n);
        switch (c) {
        case 1: k_dot_keys_blk_avx512(1, sg, s_stride, qd, k, bstride, nk, n); break;
        case 2: k_dot_keys_blk_avx512(2, sg, s_stride, qd, k, bstride, nk, n); break;
        case 3: k_dot_keys_blk_avx512(3, sg, s_stride, qd, k, bstride, nk, n); break;
        case 4: k_dot_keys_blk_avx512(4, sg, s_stride, qd, k, bstride, nk, n); break;
        case 5: k_dot_keys_blk_avx512(5, sg, s_stride, qd, k, bstride, nk, n); break;
        case 6: k_dot_keys_blk_avx512(6, sg, s_stride, qd, k, bstride, nk, n); break;
        case 7: k_dot_keys_blk_avx512(7, sg, s_stride, qd, k, bstride, nk, n); break;
        default: k_dot_keys_blk_avx512(8, sg, s_stride, qd, k, bstride, nk, n); break;
        }
    }
}

// k_axpy_rows_avx2 in 512-bit vectors: 64 values of up to four queries in registers across all
// the value rows, a tail of n % 16 values masked.
K_AVX512 K_INLINE void k_axpy_q_avx512(const int c, float *y, size_t ys, const float *w, size_t ws, const float *v,
                                       size_t stride, int64_t nk, int64_t n) {
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512 a[4][4];
        K_UNROLL
        for (int g = 0; g < c; g++)
            K_UNROLL
            for (int k = 0; k < 4; k++) a[g][k] = _mm512_loadu_ps(y + (size_t)g * ys + (size_t)i + 16 * (size_t)k);
        const float *vp = v + i;
        for (int64_t p = 0; p < nk; p++, vp += stride) {
            const __m512 x[4] = {_mm512_loadu_ps(vp), _mm512_loadu_ps(vp + 16), _mm512_loadu_ps(vp + 32), _mm512_loadu_ps(vp + 48)};
            K_UNROLL
            for (int g = 0; g < c; g++) {
                const __m512 wv = _mm512_set1_ps(w[(size_t)g * ws + (size_t)p]);
                K_UNROLL
                for (int k = 0; k < 4; k++) a[g][k] = _mm512_add_ps(a[g][k], _mm512_mul_ps(wv, x[k]));
            }
        }
        K_UNROLL
        for (int g = 0; g < c; g++)
            K_UNROLL
            for (int k = 0; k < 4; k++) _mm512_storeu_ps(y + (size_t)g * ys + (size_t)i + 16 * (size_t)k, a[g][k]);
    }
    for (; i < n; i += 16) {
        const __mmask16 mask = (__mmask16)(n - i >= 16 ? 0xffff : (1u << (n - i)) - 1);
        __m512 a[4];
        K_UNROLL
        for (int g = 0; g < c; g++) a[g] = _mm512_maskz_loadu_ps(mask, y + (size_t)g * ys + (size_t)i);
        const float *vp = v + i;
        for (int64_t p = 0; p < nk; p++, vp += stride) {
            const __m512 x = _mm512_maskz_loadu_ps(mask, vp);
            K_UNROLL
            for (int g = 0; g < c; g++) a[g] = _mm512_add_ps(a[g], _mm512_mul_ps(_mm512_set1_ps(w[(size_t)g * ws + (size_t)p]), x));
        }
        K_UNROLL
        for (int g = 0; g < c; g++) _mm512_mask_storeu_ps(y + (size_t)g * ys + (size_t)i, mask, a[g]);
    }
}

K_AVX512 static void k_axpy_rows_avx512(float *y, size_t ys, const float *w, size_t ws, int nq, const float *v,
                                        size_t stride, int64_t nk, int64_t n) {
    const int chunks = (nq + 3) / 4, per = (nq + chunks - 1) / chunks; // 7 queries: 4 + 3
    for (int g0 = 0; g0 < nq; g0 += per) {
        const int c = PSV_MIN(per, nq - g0);
        float *yg = y + (size_t)g0 * ys;
        const float *wg = w + (size_t)g0 * ws;
        switch (c) {
        case 1: k_axpy_q_avx512(1, yg, ys, wg, ws, v, stride, nk, n); break;
        case 2: k_axpy_q_avx512(2, yg, ys, wg, ws, v, stride, nk, n); break;
        case 3: k_axpy_q_avx512(3, yg, ys, wg, ws, v, stride, nk, n); break;
        default: k_axpy_q_avx512(4, yg, ys, wg, ws, v, stride, nk, n); break;
        }
    }
}


// ---- AVX2: exp and SwiGLU -----------------------------------------------------------------------
// psv_expf_poly on 8 lanes with the hardware FMA, which rounds exactly as psv_fmaf does wherever
// no value involved is a float subnormal. That holds whenever |n| <= 125 (n: the power of two);
// a vector with any lane beyond that goes through psv_expf_poly itself, lane by lane (inputs
// below about -86.6 or above 86.6, and NaN).
K_AVX2 K_INLINE __m256 k_expf_poly_avx2(__m256 x, bool *slow) {
    const __m256 shift = _mm256_set1_ps(0x1.8p23f);
    __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), shift);
    __m256 n = _mm256_sub_ps(z, shift), nn = _mm256_sub_ps(_mm256_setzero_ps(), n);
    __m256 b = _mm256_fmadd_ps(nn, _mm256_set1_ps(0x1.7f7d1cp-20f), _mm256_fmadd_ps(nn, _mm256_set1_ps(0x1.62e4p-1f), x));
    const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
    __m256 k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_set1_epi32(0x3f800000)));
    __m256 u = _mm256_mul_ps(b, b);
    __m256 j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)), u,
                        _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f))),
        u, _mm256_mul_ps(_mm256_set1_ps(0x1.ffffecp-1f), b));
    // Slow: not (|n| <= 125), true for NaN too, except where psv_expf_poly splits 2^n into the
    // normal factors s1 = 2^-125 and s2 = 2^(n + 125) (n < 0) or s1 = 2^127 and s2 = 2^(n - 127):
    // for 127 <= |n| <= 192 (|x| from about 87.7 to 133) its fma(s2, j, s2) * s1 has every
    // value normal but the last product (an ordinary multiply: subnormal, or infinite); for
    // |n| > 192 (infinities too) its s1 * s1 is +0 or +inf.
    const __m256 an = k_abs_ps_avx2(n);
    __m256 r = _mm256_fmadd_ps(k, j, k);
    const __m256 in = _mm256_cmp_ps(an, _mm256_set1_ps(125.0f), _CMP_LE_OQ);
    *slow = false;
    if (_mm256_movemask_ps(in) == 0xff) return r;
    const __m256 neg = _mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LT_OQ);
    const __m256 big = _mm256_cmp_ps(an, _mm256_set1_ps(192.0f), _CMP_GT_OQ);
    const __m256 split = _mm256_and_ps(_mm256_cmp_ps(an, _mm256_set1_ps(127.0f), _CMP_GE_OQ),
                                       _mm256_cmp_ps(an, _mm256_set1_ps(192.0f), _CMP_LE_OQ));
    *slow = _mm256_movemask_ps(_mm256_or_ps(_mm256_or_ps(in, big), split)) != 0xff;
    if (*slow) return r;
    if (_mm256_movemask_ps(split)) { // the other lanes' factors are 1, which keeps subnormals out
        const __m256i d = _mm256_and_si256(_mm256_castps_si256(neg), _mm256_set1_epi32((int)0x82000000u));
        const __m256 one = _mm256_set1_ps(1.0f);
        const __m256 s1n = _mm256_blendv_ps(_mm256_set1_ps(0x1p127f), _mm256_set1_ps(0x1p-125f), neg);
        const __m256 s1 = _mm256_blendv_ps(one, s1n, split);
        const __m256 s2 = _mm256_blendv_ps(one, _mm256_castsi256_ps(_mm256_sub_epi32(e, d)), split);
        r = _mm256_blendv_ps(r, _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1), split);
    }
    const __m256 inf = _mm256_castsi256_ps(_mm256_set1_epi32(0x7f800000));
    return _mm256_blendv_ps(r, _mm256_andnot_ps(neg, inf), big);
}

K_AVX2 static void k_expf_avx2(float *y, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        bool slow;
        __m256 e = k_expf_poly_avx2(_mm256_loadu_ps(x + i), &slow);
        if (slow)
            for (int l = 0; l < 8; l++) y[i + l] = psv_expf_poly(x[i + l]);
        else _mm256_storeu_ps(y + i, e);
    }
    for (; i < n; i++) y[i] = psv_expf_poly(x[i]);
}

// k_exp_shift_ref four lanes at a time: psv_exp's steps, operation for operation, where they
// are branch-free, for arguments -708 <= a <= 693 (k = round(a / ln 2) in [-1021, 1000]:
// psv_pow2i(k) is a normal number made from its exponent bits, and neither end's split scaling
// applies); other lanes (and NaN) take psv_exp itself. Bit-identical (tested).
K_AVX2 static void k_exp_shift_avx2(double *y, const float *x, double shift, double div, int64_t n) {
    static const double c[14] = {1.0 / 6227020800.0, 1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0,
                                 1.0 / 362880.0, 1.0 / 40320.0, 1.0 / 5040.0, 1.0 / 720.0, 1.0 / 120.0,
                                 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0};
    const __m256d sh = _mm256_set1_pd(shift), dv = _mm256_set1_pd(div), one = _mm256_set1_pd(1.0), half = _mm256_set1_pd(0.5);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        __m256d v = _mm256_div_pd(_mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + i)), sh), dv);
        __m256d in = _mm256_and_pd(_mm256_cmp_pd(v, _mm256_set1_pd(-708.0), _CMP_GE_OQ),
                                   _mm256_cmp_pd(v, _mm256_set1_pd(693.0), _CMP_LE_OQ));
        if (_mm256_movemask_pd(in) != 15) {
            for (int l = 0; l < 4; l++) y[i + l] = psv_exp(((double)x[i + l] - shift) / div);
            continue;
        }
        // psv_round_half_away(v * log2 e): truncate, then step away from zero on a half or more
        __m256d kx = _mm256_mul_pd(v, _mm256_set1_pd(1.44269504088896338700));
        __m256d k = _mm256_round_pd(kx, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC), d = _mm256_sub_pd(kx, k);
        k = _mm256_add_pd(k, _mm256_and_pd(_mm256_cmp_pd(d, half, _CMP_GE_OQ), one));
        k = _mm256_sub_pd(k, _mm256_and_pd(_mm256_cmp_pd(d, _mm256_set1_pd(-0.5), _CMP_LE_OQ), one));
        __m256d r = _mm256_sub_pd(_mm256_sub_pd(v, _mm256_mul_pd(k, _mm256_set1_pd(6.93147180369123816490e-01))),
                                  _mm256_mul_pd(k, _mm256_set1_pd(1.90821492927058770002e-10)));
        __m256d p = _mm256_set1_pd(c[0]);
        for (int j = 1; j < 14; j++) p = _mm256_add_pd(_mm256_mul_pd(p, r), _mm256_set1_pd(c[j]));
        __m256i e = _mm256_slli_epi64(_mm256_cvtepi32_epi64(_mm_add_epi32(_mm256_cvtpd_epi32(k), _mm_set1_epi32(1023))), 52);
        _mm256_storeu_pd(y + i, _mm256_mul_pd(p, _mm256_castsi256_pd(e)));
    }
    for (; i < n; i++) y[i] = psv_exp(((double)x[i] - shift) / div);
}

K_AVX2 static void k_swiglu_avx2(float *y, const float *g, const float *u, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        bool slow;
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 e = k_expf_poly_avx2(_mm256_sub_ps(_mm256_setzero_ps(), gv), &slow);
        if (slow) {
            for (int l = 0; l < 8; l++) y[i + l] = g[i + l] / (1.0f + psv_expf_poly(0.0f - g[i + l])) * u[i + l];
            continue;
        }
        __m256 silu = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(silu, _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++) y[i] = g[i] / (1.0f + psv_expf_poly(0.0f - g[i])) * u[i];
}

// k_softmax_ref eight scores at a time (the sum's lanes are K_SOFTMAX_LANES = 8: two vectors of
// four doubles). The maximum of each lane, then of the lanes, is the same value as the reference's
// running one (max is order-free except for the sign of a zero, and both zeros give the same
// weights); exps as k_expf_avx2.
K_AVX2 static void k_softmax_avx2(float *w, int64_t n, float scale) {
    const __m256 sv = _mm256_set1_ps(scale);
    __m256 mv = _mm256_set1_ps(-3.4e38f);
    int64_t p = 0;
    for (; p + 8 <= n; p += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(w + p), sv);
        _mm256_storeu_ps(w + p, v);
        mv = _mm256_max_ps(v, mv); // v > mv ? v : mv (a NaN v keeps mv)
    }
    float lanes[8], mx = -3.4e38f;
    _mm256_storeu_ps(lanes, mv);
    for (int l = 0; l < 8; l++)
        if (lanes[l] > mx) mx = lanes[l];
    for (; p < n; p++) {
        w[p] = w[p] * scale;
        if (w[p] > mx) mx = w[p];
    }
    const __m256 m = _mm256_set1_ps(mx);
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    for (p = 0; p + 8 <= n; p += 8) {
        bool slow;
        __m256 v = _mm256_sub_ps(_mm256_loadu_ps(w + p), m);
        __m256 e = k_expf_poly_avx2(v, &slow);
        if (slow) {
            float t[8];
            _mm256_storeu_ps(t, v);
            for (int l = 0; l < 8; l++) t[l] = psv_expf_poly(t[l]);
            e = _mm256_loadu_ps(t);
        }
        _mm256_storeu_ps(w + p, e);
        s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    if (p < n) { // the last n % 8 in lanes 0.. of one more vector, the rest -inf (exp: +0)
        const int r = (int)(n - p);
        float t[8];
        for (int l = 0; l < 8; l++) t[l] = l < r ? w[p + l] - mx : f32_from_bits(0xff800000u);
        bool slow;
        __m256 e = k_expf_poly_avx2(_mm256_loadu_ps(t), &slow);
        if (slow) {
            for (int l = 0; l < 8; l++) t[l] = l < r ? psv_expf_poly(t[l]) : 0.0f;
            e = _mm256_loadu_ps(t);
        }
        _mm256_storeu_ps(t, e);
        memcpy(w + p, t, (size_t)r * sizeof(float));
        s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(e))); // + 0 in the lanes past n
        s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    double lane[K_SOFTMAX_LANES];
    _mm256_storeu_pd(lane, s0);
    _mm256_storeu_pd(lane + 4, s1);
    double sum = lane[0];
    for (int l = 1; l < K_SOFTMAX_LANES; l++) sum += lane[l];
    const float inv = (float)(1.0 / sum);
    const __m256 iv = _mm256_set1_ps(inv);
    for (p = 0; p + 8 <= n; p += 8) _mm256_storeu_ps(w + p, _mm256_mul_ps(_mm256_loadu_ps(w + p), iv));
    for (; p < n; p++) w[p] = w[p] * inv;
}

// k_axpy_rows_ref: a product then a sum, each rounded (no FMA), as the reference does. Up to four
// queries at a time, so that each value row's vector is loaded once for all of them, and 32
// values of each in registers across all the rows (16 sums in flight: the additions' latency
// is hidden); a tail of n % 8 values goes through masked loads and stores.
K_AVX2 K_INLINE void k_axpy_q_avx2(const int c, float *y, size_t ys, const float *w, size_t ws, const float *v,
                                   size_t stride, int64_t nk, int64_t n) {
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256 a[4][4];
        K_UNROLL
        for (int g = 0; g < c; g++)
            K_UNROLL
            for (int k = 0; k < 4; k++) a[g][k] = _mm256_loadu_ps(y + (size_t)g * ys + (size_t)i + 8 * (size_t)k);
        const float *vp = v + i;
        for (int64_t p = 0; p < nk; p++, vp += stride) {
            const __m256 x[4] = {_mm256_loadu_ps(vp), _mm256_loadu_ps(vp + 8), _mm256_loadu_ps(vp + 16), _mm256_loadu_ps(vp + 24)};
            K_UNROLL
            for (int g = 0; g < c; g++) {
                const __m256 wv = _mm256_broadcast_ss(w + (size_t)g * ws + (size_t)p);
                K_UNROLL
                for (int k = 0; k < 4; k++) a[g][k] = _mm256_add_ps(a[g][k], _mm256_mul_ps(wv, x[k]));
            }
        }
        K_UNROLL
        for (int g = 0; g < c; g++)
            K_UNROLL
            for (int k = 0; k < 4; k++) _mm256_storeu_ps(y + (size_t)g * ys + (size_t)i + 8 * (size_t)k, a[g][k]);
    }
    for (; i < n; i += 8) {
        __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)PSV_MIN(n - i, (int64_t)8)),
                                          _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        __m256 a[4];
        K_UNROLL
        for (int g = 0; g < c; g++) a[g] = _mm256_maskload_ps(y + (size_t)g * ys + (size_t)i, mask);
        const float *vp = v + i;
        for (int64_t p = 0; p < nk; p++, vp += stride) {
            const __m256 x = _mm256_maskload_ps(vp, mask);
            K_UNROLL
            for (int g = 0; g < c; g++) a[g] = _mm256_add_ps(a[g], _mm256_mul_ps(_mm256_broadcast_ss(w + (size_t)g * ws + (size_t)p), x));
        }
        K_UNROLL
        for (int g = 0; g < c; g++) _mm256_maskstore_ps(y + (size_t)g * ys + (size_t)i, mask, a[g]);
    }
}

K_AVX2 static void k_axpy_rows_avx2(float *y, size_t ys, const float *w, size_t ws, int nq, const float *v, size_t stride,
                                    int64_t nk, int64_t n) {
    const int chunks = (nq + 3) / 4, per = (nq + chunks - 1) / chunks; // 7 queries: 4 + 3
    for (int g0 = 0; g0 < nq; g0 += per) {
        const int c = PSV_MIN(per, nq - g0);
        float *yg = y + (size_t)g0 * ys;
        const float *wg = w + (size_t)g0 * ws;
        switch (c) {
        case 1: k_axpy_q_avx2(1, yg, ys, wg, ws, v, stride, nk, n); break;
        case 2: k_axpy_q_avx2(2, yg, ys, wg, ws, v, stride, nk, n); break;
        case 3: k_axpy_q_avx2(3, yg, ys, wg, ws, v, stride, nk, n); break;
        default: k_axpy_q_avx2(4, yg, ys, wg, ws, v, stride, nk, n); break;
        }
    }
}

#endif // PSV_X86

// ---- NEON (AArch64): the integer dot products ----------------------------------------------------
// Advanced SIMD is baseline on AArch64, so the "neon" set needs no run-time check. Each kernel
// computes the reference kernel's exact integer block sums with vector multiplies (vmull_s8:
// 16-bit products, |q a| <= 128 * 128 fits; pairwise-added into 32-bit lanes), and then the
// reference's own double expression per block into the same K_BLOCK_LANES lanes: bit-identical
// to the reference. The "dotprod" set (FEAT_DotProd, ARMv8.2: Apple M1 and later, Neoverse N1,
// Cortex-A76 and later; run-time detected) is the same kernels with each 16 products summed by
// one sdot (k_sdot_neon) instead of two multiplies and two pairwise adds (`dp` below), plus GEMM
// and four-row generation kernels ("NEON dotprod: GEMM on panels", "... generation of one
// sequence"); the "i8mm" set is dotprod with smmla in the GEMM. The NEON float, quantizer and
// element-wise kernels further down serve all three sets.
#if defined(PSV_ARM64)

// The "dotprod" set's functions are built for FEAT_DotProd whatever the compiler's target (gcc
// and clang spell the attribute differently; nothing where the build targets it already, so the
// kernels inline helpers built for the same target). sdot is written in assembly: older clang
// declares its intrinsics only when the whole file targets FEAT_DotProd. gcc's assembler wants an
// armv8.2-a base for it; a build for an older base plus extensions (-march=armv8-a+crypto)
// cannot inline the helpers into these functions, so builds with -march/-mcpu flags should name
// a target with the dot product instructions, or none.
#if defined(__ARM_FEATURE_DOTPROD)
#define K_DOTPROD
#elif defined(__clang__)
#define K_DOTPROD __attribute__((target("dotprod")))
#else
#define K_DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))
#endif

// An fp16 value by the hardware conversion: exactly psv_fp16_to_f32's float for every input but
// a NaN (which stays a NaN), without its branches.
static inline float k_f16_neon(const uint8_t *p) {
    __fp16 h;
    memcpy(&h, p, 2);
    return (float)h;
}

// sdot: lane i of acc += sum_k q[4i + k] a[4i + k]. (Not always_inline: the shared kernels below
// reach it through k_dot16x_neon, which has no target attribute itself; it is inlined where
// they are, into the K_DOTPROD entry points.)
K_DOTPROD static inline int32x4_t k_sdot_neon(int32x4_t acc, int8x16_t q, int8x16_t a) {
    __asm__("sdot %0.4s, %1.16b, %2.16b" : "+w"(acc) : "w"(q), "w"(a));
    return acc;
}

// sum q[i] a[i] over 16 int8 pairs, into the lanes of acc (sdot with dp, else widening multiplies).
K_INLINE int32x4_t k_dot16x_neon(bool dp, int32x4_t acc, int8x16_t q, int8x16_t a) {
    if (dp) return k_sdot_neon(acc, q, a);
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(q), vget_low_s8(a)));
    return vpadalq_s16(acc, vmull_high_s8(q, a));
}

K_INLINE int32_t k_isum16_neon(bool dp, const int8_t *q, const int8_t *a) {
    return vaddvq_s32(k_dot16x_neon(dp, vdupq_n_s32(0), vld1q_s8(q), vld1q_s8(a)));
}

K_INLINE int32_t k_isum32_neon(bool dp, const int8_t *q, const int8_t *a) {
    int32x4_t acc = k_dot16x_neon(dp, vdupq_n_s32(0), vld1q_s8(q), vld1q_s8(a));
    return vaddvq_s32(k_dot16x_neon(dp, acc, vld1q_s8(q + 16), vld1q_s8(a + 16)));
}

// Byte j (j < 16) of the result: 16 if bit j of b is set, else 0 (the fifth bit of Q5 values).
static inline uint8x16_t k_bits16_neon(uint32_t b) {
    static const uint8_t m[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    uint8x16_t v = vcombine_u8(vdup_n_u8((uint8_t)b), vdup_n_u8((uint8_t)(b >> 8)));
    return vandq_u8(vtstq_u8(v, vld1q_u8(m)), vdupq_n_u8(16));
}

// The block's values 0-15 (*lo) and 16-31 (*hi) as int8, as the reference reads them: q - 8 for
// Q4_0, q - 16 for Q5_0, q for Q4_1/Q5_1, the int8 quants for Q8_0.
static inline void k_w32_neon(uint32_t type, const uint8_t *x, int8x16_t *lo, int8x16_t *hi) {
    if (type == T_Q8_0) {
        *lo = vld1q_s8((const int8_t *)(x + 2));
        *hi = vld1q_s8((const int8_t *)(x + 18));
        return;
    }
    const int qs = type == T_Q4_0 ? 2 : type == T_Q4_1 ? 4 : type == T_Q5_0 ? 6 : 8;
    uint8x16_t v = vld1q_u8(x + qs);
    uint8x16_t l = vandq_u8(v, vdupq_n_u8(15)), h = vshrq_n_u8(v, 4);
    if (type == T_Q5_0 || type == T_Q5_1) {
        uint32_t qh = ld_u32(x + qs - 4);
        l = vorrq_u8(l, k_bits16_neon(qh & 0xffff));
        h = vorrq_u8(h, k_bits16_neon(qh >> 16));
    }
    int8x16_t sl = vreinterpretq_s8_u8(l), sh = vreinterpretq_s8_u8(h);
    if (type == T_Q4_0 || type == T_Q5_0) {
        int8x16_t off = vdupq_n_s8(type == T_Q4_0 ? 8 : 16);
        sl = vsubq_s8(sl, off);
        sh = vsubq_s8(sh, off);
    }
    *lo = sl;
    *hi = sh;
}

K_INLINE void k_dot32_neon(bool dp, uint32_t type, int64_t n, float *s, const uint8_t *x, const uint8_t *y) {
    PSV_ASSERT(n % 32 == 0);
    const size_t xs = type == T_Q4_0 ? K_Q4_0_SIZE : type == T_Q4_1 ? K_Q4_1_SIZE : type == T_Q5_0 ? K_Q5_0_SIZE
                    : type == T_Q5_1 ? K_Q5_1_SIZE : K_Q8_0_SIZE;
    const bool q81 = type == T_Q4_1 || type == T_Q5_1;
    const size_t ys = q81 ? K_Q8_1_SIZE : K_Q8_0_SIZE;
    double acc[K_BLOCK_LANES] = {0};
    for (int64_t b = 0; b < n / 32; b++, x += xs, y += ys) {
        int8x16_t lo, hi;
        k_w32_neon(type, x, &lo, &hi);
        const int8_t *a = (const int8_t *)(y + (q81 ? 4 : 2));
        int32_t isum = vaddvq_s32(k_dot16x_neon(dp, k_dot16x_neon(dp, vdupq_n_s32(0), lo, vld1q_s8(a)), hi, vld1q_s8(a + 16)));
        if (q81)
            acc[b % K_BLOCK_LANES] += k_no_fuse((double)k_f16_neon(x) * (double)k_f16_neon(y) * (double)isum +
                                                (double)k_f16_neon(x + 2) * (double)k_f16_neon(y + 2));
        else acc[b % K_BLOCK_LANES] += k_no_fuse((double)k_f16_neon(x) * (double)k_f16_neon(y) * (double)isum);
    }
    *s = k_lanes_sum(acc, K_BLOCK_LANES);
}

// Each kernel twice: for the "neon" set and, with sdot, for the "dotprod" set.
#define K_DEF_DOT32_NEON(name, type)                                                                        \
    static void name##_neon(int64_t n, float *s, const void *x, const void *y) { k_dot32_neon(false, type, n, s, x, y); } \
    K_DOTPROD static void name##_dotprod(int64_t n, float *s, const void *x, const void *y) { k_dot32_neon(true, type, n, s, x, y); }
K_DEF_DOT32_NEON(k_dot_q4_0_q8_0, T_Q4_0)
K_DEF_DOT32_NEON(k_dot_q4_1_q8_1, T_Q4_1)
K_DEF_DOT32_NEON(k_dot_q5_0_q8_0, T_Q5_0)
K_DEF_DOT32_NEON(k_dot_q5_1_q8_1, T_Q5_1)
K_DEF_DOT32_NEON(k_dot_q8_0_q8_0, T_Q8_0)
#define K_DEF_DOTK_NEON(name, impl)                                                                          \
    static void name##_neon(int64_t n, float *s, const void *x, const void *y) { impl(false, n, s, x, y); } \
    K_DOTPROD static void name##_dotprod(int64_t n, float *s, const void *x, const void *y) { impl(true, n, s, x, y); }

// Q2_K and Q3_K: the reference unpacking, vector sub-block sums.
K_INLINE void k_dot_q2_k_neon(bool dp, int64_t n, float *s, const void *vx, const void *vy) {
    PSV_ASSERT(n % QK_K == 0);
    const uint8_t *x = vx, *y = vy;
    int8_t q[QK_K];
    double acc[K_BLOCK_LANES] = {0};
    for (int64_t b = 0; b < n / QK_K; b++, x += K_Q2_K_SIZE, y += K_Q8_K_SIZE) {
        k_unpack_q2_k(x, q);
        const int8_t *a = (const int8_t *)(y + 4);
        int32_t isum = 0, msum = 0;
        for (int k = 0; k < 16; k++) {
            isum += (x[k] & 15) * k_isum16_neon(dp, q + 16 * k, a + 16 * k);
            msum += (x[k] >> 4) * k_ld_i16(y + 260 + 2 * k);
        }
        acc[b % K_BLOCK_LANES] += k_no_fuse((double)k_ld_f32(y) * ((double)k_f16_neon(x + 80) * (double)isum -
                                                                   (double)k_f16_neon(x + 82) * (double)msum));
    }
    *s = k_lanes_sum(acc, K_BLOCK_LANES);
}

K_DEF_DOTK_NEON(k_dot_q2_k_q8_k, k_dot_q2_k_neon)

K_INLINE void k_dot_q3_k_neon(bool dp, int64_t n, float *s, const void *vx, const void *vy) {
    PSV_ASSERT(n % QK_K == 0);
    const uint8_t *x = vx, *y = vy;
    int8_t q[QK_K];
    int sc[16];
    double acc[K_BLOCK_LANES] = {0};
    for (int64_t b = 0; b < n / QK_K; b++, x += K_Q3_K_SIZE, y += K_Q8_K_SIZE) {
        k_unpack_q3_k(x, q, sc);
        const int8_t *a = (const int8_t *)(y + 4);
        int32_t isum = 0;
        for (int k = 0; k < 16; k++) isum += sc[k] * k_isum16_neon(dp, q + 16 * k, a + 16 * k);
        acc[b % K_BLOCK_LANES] += k_no_fuse((double)k_f16_neon(x + 108) * (double)k_ld_f32(y) * (double)isum);
    }
    *s = k_lanes_sum(acc, K_BLOCK_LANES);
}

K_DEF_DOTK_NEON(k_dot_q3_k_q8_k, k_dot_q3_k_neon)

// Q4_K chunk c (64 values: qs[32c + l] holds value 64c + l in its low nibble, 64c + 32 + l in its
// high one) against the activation's quants a: the lanes of sub-blocks 2c (*lo) and 2c + 1 (*hi).
K_INLINE void k_q4_k_chunk_neon(bool dp, const uint8_t *qs, const int8_t *a, int c, int32x4_t *lo, int32x4_t *hi) {
    const uint8x16_t v0 = vld1q_u8(qs + 32 * c), v1 = vld1q_u8(qs + 32 * c + 16), m4 = vdupq_n_u8(15);
    const int8_t *ac = a + 64 * c;
    *lo = k_dot16x_neon(dp, k_dot16x_neon(dp, vdupq_n_s32(0), vreinterpretq_s8_u8(vandq_u8(v0, m4)), vld1q_s8(ac)),
                        vreinterpretq_s8_u8(vandq_u8(v1, m4)), vld1q_s8(ac + 16));
    *hi = k_dot16x_neon(dp, k_dot16x_neon(dp, vdupq_n_s32(0), vreinterpretq_s8_u8(vshrq_n_u8(v0, 4)), vld1q_s8(ac + 32)),
                        vreinterpretq_s8_u8(vshrq_n_u8(v1, 4)), vld1q_s8(ac + 48));
}

// Q4_K unpacked in registers (k_q4_k_chunk_neon); Q5_K through the reference unpacking.
K_INLINE void k_dot_q45_k_neon(bool dp, int64_t n, float *s, const uint8_t *x, const uint8_t *y, bool five) {
    PSV_ASSERT(n % QK_K == 0);
    const size_t size = five ? K_Q5_K_SIZE : K_Q4_K_SIZE;
    int8_t q[QK_K];
    int sc[8], m[8];
    double acc[K_BLOCK_LANES] = {0};
    for (int64_t b = 0; b < n / QK_K; b++, x += size, y += K_Q8_K_SIZE) {
        const int8_t *a = (const int8_t *)(y + 4);
        int32_t t[8];
        if (five) {
            k_unpack_q45_k(x + 48, x + 16, x + 4, q, sc, m);
            for (int k = 0; k < 8; k++) t[k] = k_isum32_neon(dp, q + 32 * k, a + 32 * k);
        } else {
            for (int k = 0; k < 8; k++) k_scale_min_k4(x + 4, k, &sc[k], &m[k]);
            for (int c = 0; c < 4; c++) {
                int32x4_t lo, hi;
                k_q4_k_chunk_neon(dp, x + 16, a, c, &lo, &hi);
                t[2 * c] = vaddvq_s32(lo);
                t[2 * c + 1] = vaddvq_s32(hi);
            }
        }
        int32_t isum = 0, msum = 0;
        for (int k = 0; k < 8; k++) {
            isum += sc[k] * t[k];
            msum += m[k] * (k_ld_i16(y + 260 + 4 * k) + k_ld_i16(y + 262 + 4 * k));
        }
        acc[b % K_BLOCK_LANES] += k_no_fuse((double)k_ld_f32(y) *
                                            ((double)k_f16_neon(x) * (double)isum - (double)k_f16_neon(x + 2) * (double)msum));
    }
    *s = k_lanes_sum(acc, K_BLOCK_LANES);
}
K_INLINE void k_dot_q4_k_neon(bool dp, int64_t n, float *s, const void *x, const void *y) { k_dot_q45_k_neon(dp, n, s, x, y, false); }
K_INLINE void k_dot_q5_k_neon(bool dp, int64_t n, float *s, const void *x, const void *y) { k_dot_q45_k_neon(dp, n, s, x, y, true); }
K_DEF_DOTK_NEON(k_dot_q4_k_q8_k, k_dot_q4_k_neon)
K_DEF_DOTK_NEON(k_dot_q5_k_q8_k, k_dot_q5_k_neon)

// Q6_K unpacked in registers: for half h and quarter k, values 128h + 32k + l (l < 32) have their
// low nibble in ql[64h + 32(k&1) + l] at bit 4(k>>1) and their top bits in qh[32h + l] at bit 2k;
// the 16 values of each half of l are one sub-block. k_q6_k_raw16_neon: values 128h + 32k +
// 16 half ... + 15 of the block at x as stored (6 bits: q + 32).
static inline uint8x16_t k_q6_k_raw16_neon(const uint8_t *x, int h, int k, int half) {
    uint8x16_t l = vld1q_u8(x + 64 * h + 32 * (k & 1) + 16 * half);
    l = (k >> 1) ? vshrq_n_u8(l, 4) : vandq_u8(l, vdupq_n_u8(15));
    const uint8x16_t hb = vandq_u8(vshlq_u8(vld1q_u8(x + 128 + 32 * h + 16 * half), vdupq_n_s8((int8_t)(-2 * k))), vdupq_n_u8(3));
    return vorrq_u8(l, vshlq_n_u8(hb, 4));
}

K_INLINE void k_dot_q6_k_neon(bool dp, int64_t n, float *s, const void *vx, const void *vy) {
    PSV_ASSERT(n % QK_K == 0);
    const uint8_t *x = vx, *y = vy;
    double acc[K_BLOCK_LANES] = {0};
    for (int64_t b = 0; b < n / QK_K; b++, x += K_Q6_K_SIZE, y += K_Q8_K_SIZE) {
        const int8_t *sc = (const int8_t *)(x + 192), *a = (const int8_t *)(y + 4);
        int32_t isum = 0;
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 4; k++)
                for (int half = 0; half < 2; half++) {
                    int8x16_t qv = vsubq_s8(vreinterpretq_s8_u8(k_q6_k_raw16_neon(x, h, k, half)), vdupq_n_s8(32));
                    int e = 128 * h + 32 * k + 16 * half;
                    isum += sc[e / 16] * vaddvq_s32(k_dot16x_neon(dp, vdupq_n_s32(0), qv, vld1q_s8(a + e)));
                }
        acc[b % K_BLOCK_LANES] += k_no_fuse((double)k_f16_neon(x + 208) * (double)k_ld_f32(y) * (double)isum);
    }
    *s = k_lanes_sum(acc, K_BLOCK_LANES);
}

K_DEF_DOTK_NEON(k_dot_q6_k_q8_k, k_dot_q6_k_neon)

// ---- NEON dotprod: GEMM on panels ---------------------------------------------------------------
// Activation rows against one panel (see "GEMM panels"), as the AVX-512 kernels do it, with sdot
// by element: a panel vector's 32 bytes are two 16-byte halves (weight rows 0-3 and 4-7, four
// quants of each), and one sdot of a half against four activation bytes (a 32-bit lane of the
// activation's 16 bytes in a register) advances four dot products, with no horizontal sums. The
// packed quants are the stored value plus the type's offset (k_panel_off), at most 63 and so
// valid int8 as they are, except Q8_0's (q + 128), which are flipped back to q (xor 0x80) with
// their sums started from 0 instead of the offset term. The k-quants weight each 16 values' sums
// by their scale (vmla) and add the offset or minimum terms from the activation's sums of 16
// (int16 pairs: widening multiplies and a pairwise add). Each block's term is formed for the
// eight weight rows, exactly as the reference forms it, and goes to lane b % 4 of each row: the
// kernel runs over the blocks of one lane at a time (b = l, l + 4, ...), so one set of double
// accumulators stays in registers, and adds the four lanes in the reference's order at the end.
// Activation rows go two at a time (AArch64 has 32 vector registers).

// sdot by element: lane i of acc += sum_k q[4i + k] a[4 lane + k], lane a literal.
#define K_SDOT_LANE_NEON(acc, q, a, lane) \
    __asm__("sdot %0.4s, %1.16b, %2.4b[" #lane "]" : "+w"(acc) : "w"(q), "w"(a))

// As k_no_fuse, for two doubles.
static inline float64x2_t k_no_fuse_f64x2(float64x2_t v) {
    __asm__("" : "+w"(v));
    return v;
}

static inline float64x2_t k_ld_f64x2(const uint8_t *p) { return vreinterpretq_f64_u8(vld1q_u8(p)); }

// Of 8 int32 (v0: weight rows 0-3, v1: 4-7), row 2k + j as a double in lane j of out[k].
static inline void k_i32x8_f64_neon(int32x4_t v0, int32x4_t v1, float64x2_t out[4]) {
    out[0] = vcvtq_f64_s64(vmovl_s32(vget_low_s32(v0)));
    out[1] = vcvtq_f64_s64(vmovl_high_s32(v0));
    out[2] = vcvtq_f64_s64(vmovl_s32(vget_low_s32(v1)));
    out[3] = vcvtq_f64_s64(vmovl_high_s32(v1));
}

// The panel's quants of step `lane` of group g (values 16g + 4 lane .. + 3) for weight rows 0-3
// (*w0) and 4-7 (*w1), as int8.
K_DOTPROD K_INLINE void k_panel_q_neon(uint32_t type, const uint8_t *pb, int g, int lane, int8x16_t *w0, int8x16_t *w1) {
    int v, nib = -1; // the panel vector, and which nibble of it (-1: bytes)
    if (type == T_Q4_1) v = lane, nib = g;                            // step s low, s + 4 high
    else if (type == T_Q4_K) v = 8 * (g / 4) + 4 * (g % 2) + lane, nib = g % 4 / 2; // chunk g / 4
    else v = 4 * g + lane;
    uint8x16_t a = vld1q_u8(pb + 32 * v), b = vld1q_u8(pb + 32 * v + 16);
    if (nib == 0) a = vandq_u8(a, vdupq_n_u8(15)), b = vandq_u8(b, vdupq_n_u8(15));
    else if (nib == 1) a = vshrq_n_u8(a, 4), b = vshrq_n_u8(b, 4);
    else if (type == T_Q8_0) a = veorq_u8(a, vdupq_n_u8(0x80)), b = veorq_u8(b, vdupq_n_u8(0x80));
    *w0 = vreinterpretq_s8_u8(a);
    *w1 = vreinterpretq_s8_u8(b);
}

// The sums of group g (16 values) of R activation rows, whose 16 quants are av[r], added to
// (s0[r], s1[r]): weight rows 0-3 and 4-7.
K_DOTPROD K_INLINE void k_gemm_grp_neon(uint32_t type, int R, const uint8_t *pb, int g, const int8x16_t *av, int32x4_t *s0,
                              int32x4_t *s1) {
    int8x16_t w0, w1;
#define K_GRP_LANE(L)                                   \
    k_panel_q_neon(type, pb, g, L, &w0, &w1);           \
    for (int r = 0; r < R; r++) {                       \
        K_SDOT_LANE_NEON(s0[r], w0, av[r], L);          \
        K_SDOT_LANE_NEON(s1[r], w1, av[r], L);          \
    }
    K_GRP_LANE(0)
    K_GRP_LANE(1)
    K_GRP_LANE(2)
    K_GRP_LANE(3)
#undef K_GRP_LANE
}

// isum (or msum) += the panel's int16 pair coefficients c (8 pairs: row r's at 4r) times the
// activation's pair of int16 sums at p, for rows 0-3 (*i0) and 4-7 (*i1).
static inline void k_pairs_neon(const uint8_t *c, const int16_t *p, int32x4_t *i0, int32x4_t *i1) {
    int32_t pair;
    memcpy(&pair, p, 4);
    const int16x8_t a = vreinterpretq_s16_s32(vdupq_n_s32(pair));
    const int16x8_t c0 = vreinterpretq_s16_u8(vld1q_u8(c)), c1 = vreinterpretq_s16_u8(vld1q_u8(c + 16));
    *i0 = vaddq_s32(*i0, vpaddq_s32(vmull_s16(vget_low_s16(c0), vget_low_s16(a)), vmull_high_s16(c0, a)));
    *i1 = vaddq_s32(*i1, vpaddq_s32(vmull_s16(vget_low_s16(c1), vget_low_s16(a)), vmull_high_s16(c1, a)));
}

// The "i8mm" set (FEAT_I8MM: Apple M2 and later, Graviton 3 and later, Neoverse V1/N2) is the
// dotprod set whose GEMM takes two activation rows with smmla: a 2 x 8 by 8 x 2 int8 matrix
// product, 32 multiply-adds, twice sdot's. Two consecutive panel vectors zipped by 32-bit
// elements give each pair of weight rows' eight consecutive quants, the operand smmla wants.
#if defined(__ARM_FEATURE_MATMUL_INT8) && defined(__ARM_FEATURE_DOTPROD)
#define K_I8MM
#elif defined(__clang__)
#define K_I8MM __attribute__((target("dotprod,i8mm")))
#elif defined(__ARM_FEATURE_DOTPROD)
#define K_I8MM __attribute__((target("+i8mm")))
#else
#define K_I8MM __attribute__((target("arch=armv8.2-a+dotprod+i8mm")))
#endif

// acc += [w0 . a0, w0 . a1, w1 . a0, w1 . a1], w = (w0 | w1) and a = (a0 | a1) of 8 values each.
// (Not always_inline, as k_sdot_neon: it is inlined into the K_I8MM entry points.)
K_I8MM static inline int32x4_t k_smmla_neon(int32x4_t acc, int8x16_t w, int8x16_t a) {
    __asm__("smmla %0.4s, %1.16b, %2.16b" : "+w"(acc) : "w"(w), "w"(a));
    return acc;
}

// Steps lane and lane + 1 of group g of the panel (values 16g + 4 lane ... + 7) for two
// activation rows whose quants are at a0 and a1 (plus that offset): c[k] (weight rows 2k, 2k + 1)
// += their products, smmla's layout.
K_DOTPROD K_INLINE void k_gemm_pair_mm_neon(uint32_t type, const uint8_t *pb, int g, int lane, const int8_t *a0,
                                            const int8_t *a1, int32x4_t c[4]) {
    int8x16_t p0, q0, p1, q1; // p: rows 0-3, q: rows 4-7, of steps lane (0) and lane + 1 (1)
    k_panel_q_neon(type, pb, g, lane, &p0, &q0);
    k_panel_q_neon(type, pb, g, lane + 1, &p1, &q1);
    const int8x16_t av = vcombine_s8(vld1_s8(a0 + 16 * g + 4 * lane), vld1_s8(a1 + 16 * g + 4 * lane));
    const int32x4_t w[4] = {vzip1q_s32(vreinterpretq_s32_s8(p0), vreinterpretq_s32_s8(p1)),
                            vzip2q_s32(vreinterpretq_s32_s8(p0), vreinterpretq_s32_s8(p1)),
                            vzip1q_s32(vreinterpretq_s32_s8(q0), vreinterpretq_s32_s8(q1)),
                            vzip2q_s32(vreinterpretq_s32_s8(q0), vreinterpretq_s32_s8(q1))};
    K_UNROLL
    for (int k = 0; k < 4; k++) c[k] = k_smmla_neon(c[k], vreinterpretq_s8_s32(w[k]), av);
}

// The integer sums of block b (at pb) against two activation rows by smmla, as the sdot path of
// k_gemm_blk_neon leaves them: i0[r] (weight rows 0-3) and i1[r] (4-7) of activation row r,
// before the offset and minimum terms, and without 32-value blocks' offset term.
K_DOTPROD K_INLINE void k_gemm_ints_mm_neon(uint32_t type, const uint8_t *pb, const int8_t *a0, const int8_t *a1,
                                            int32x4_t i0[2], int32x4_t i1[2]) {
    int32x4_t c[4];
    K_UNROLL
    for (int k = 0; k < 4; k++) c[k] = vdupq_n_s32(0);
    if (type_table[type].blck_size == 32) {
        K_UNROLL
        for (int g = 0; g < 2; g++) {
            k_gemm_pair_mm_neon(type, pb, g, 0, a0, a1, c);
            k_gemm_pair_mm_neon(type, pb, g, 2, a0, a1, c);
        }
    } else {
        for (int g = 0; g < 16; g++) { // each 16 values' sums weighted by their scale
            int32x4_t d[4];
            K_UNROLL
            for (int k = 0; k < 4; k++) d[k] = vdupq_n_s32(0);
            k_gemm_pair_mm_neon(type, pb, g, 0, a0, a1, d);
            k_gemm_pair_mm_neon(type, pb, g, 2, a0, a1, d);
            const uint8_t *sc = pb + k_panel_sc(type) + 32 * g;
            const int32x4_t s0 = vreinterpretq_s32_u8(vld1q_u8(sc)), s1 = vreinterpretq_s32_u8(vld1q_u8(sc + 16));
            c[0] = vmlaq_s32(c[0], d[0], vzip1q_s32(s0, s0)); // (s0, s0, s1, s1): smmla's rows
            c[1] = vmlaq_s32(c[1], d[1], vzip2q_s32(s0, s0));
            c[2] = vmlaq_s32(c[2], d[2], vzip1q_s32(s1, s1));
            c[3] = vmlaq_s32(c[3], d[3], vzip2q_s32(s1, s1));
        }
    }
    i0[0] = vuzp1q_s32(c[0], c[1]), i1[0] = vuzp1q_s32(c[2], c[3]); // activation row 0: even lanes
    i0[1] = vuzp2q_s32(c[0], c[1]), i1[1] = vuzp2q_s32(c[2], c[3]);
}

// Block b of the panel (at pb) against R (1, 2) activation rows: each row's eight terms added to
// acc[r][0..3] (row 2k + j in lane j of acc[r][k]).
K_DOTPROD K_INLINE void k_gemm_blk_neon(uint32_t type, bool mm, int R, const uint8_t *pb, int64_t b, int64_t nb,
                                        const uint8_t *const *yr, const int16_t *const *ar, const double *const *dr,
                                        const int32_t *const *ao, float64x2_t acc[][4]) {
    const bool min = k_panel_min(type);
    int32x4_t i0[2], i1[2], m0[2], m1[2];
    float64x2_t dx[4], dm[4];
    K_UNROLL
    for (int k = 0; k < 4; k++) {
        dx[k] = k_ld_f64x2(pb + k_panel_dx(type) + 16 * k);
        dm[k] = min ? k_ld_f64x2(pb + k_panel_dx(type) + 64 + 16 * k) : dx[k];
    }
    if (type_table[type].blck_size == 32) {
        const bool q81 = type == T_Q4_1 || type == T_Q5_1;
        const size_t as = q81 ? K_Q8_1_SIZE : K_Q8_0_SIZE, qo = q81 ? 4 : 2;
        if (mm) { // (R == 2) then the term that takes the offset off
            k_gemm_ints_mm_neon(type, pb, (const int8_t *)(yr[0] + (size_t)b * as + qo),
                                (const int8_t *)(yr[1] + (size_t)b * as + qo), i0, i1);
            K_UNROLL
            for (int r = 0; r < R; r++) {
                const int32x4_t o = vdupq_n_s32(ao[r] && type != T_Q8_0 ? ao[r][b] : 0);
                i0[r] = vaddq_s32(i0[r], o), i1[r] = vaddq_s32(i1[r], o);
            }
        } else {
            K_UNROLL
            for (int r = 0; r < R; r++) // the sums start from the term that takes the offset off
                i0[r] = i1[r] = vdupq_n_s32(ao[r] && type != T_Q8_0 ? ao[r][b] : 0);
            K_UNROLL
            for (int g = 0; g < 2; g++) {
                int8x16_t av[2];
                K_UNROLL
                for (int r = 0; r < R; r++) av[r] = vld1q_s8((const int8_t *)(yr[r] + (size_t)b * as + qo + 16 * g));
                k_gemm_grp_neon(type, R, pb, g, av, i0, i1);
            }
        }
        K_UNROLL
        for (int r = 0; r < R; r++) {
            // reference: (double)dx * (double)dy * (double)isum [+ (double)mx * (double)sy]
            float64x2_t is[4];
            k_i32x8_f64_neon(i0[r], i1[r], is);
            K_UNROLL
            for (int k = 0; k < 4; k++) {
                const float64x2_t dxy = vmulq_n_f64(dx[k], dr[r][b]);
                if (!q81) { // the product is exact (see k_gemm_blk_avx512): one rounding, as the reference's
                    acc[r][k] = vfmaq_f64(acc[r][k], dxy, is[k]);
                    continue;
                }
                float64x2_t t = vaddq_f64(k_no_fuse_f64x2(vmulq_f64(dxy, is[k])), k_no_fuse_f64x2(vmulq_n_f64(dm[k], dr[r][nb + b])));
                acc[r][k] = vaddq_f64(acc[r][k], k_no_fuse_f64x2(t));
            }
        }
        return;
    }
    const bool cor = type == T_Q3_K || type == T_Q6_K;
    K_UNROLL
    for (int r = 0; r < R; r++) i0[r] = i1[r] = m0[r] = m1[r] = vdupq_n_s32(0);
    if (mm)
        k_gemm_ints_mm_neon(type, pb, (const int8_t *)(yr[0] + (size_t)b * K_Q8_K_SIZE + 4),
                            (const int8_t *)(yr[1] + (size_t)b * K_Q8_K_SIZE + 4), i0, i1);
    for (int g = 0; g < (mm ? 0 : 16); g++) { // each 16 values' sums weighted by their scale
        int8x16_t av[2];
        int32x4_t d0[2], d1[2];
        K_UNROLL
        for (int r = 0; r < R; r++) {
            av[r] = vld1q_s8((const int8_t *)(yr[r] + (size_t)b * K_Q8_K_SIZE + 4 + 16 * g));
            d0[r] = d1[r] = vdupq_n_s32(0);
        }
        k_gemm_grp_neon(type, R, pb, g, av, d0, d1);
        const uint8_t *sc = pb + k_panel_sc(type) + 32 * g;
        const int32x4_t sc0 = vreinterpretq_s32_u8(vld1q_u8(sc)), sc1 = vreinterpretq_s32_u8(vld1q_u8(sc + 16));
        K_UNROLL
        for (int r = 0; r < R; r++) {
            i0[r] = vmlaq_s32(i0[r], d0[r], sc0);
            i1[r] = vmlaq_s32(i1[r], d1[r], sc1);
        }
    }
    for (int j = 0; j < 8; j++)
        for (int r = 0; r < R; r++) {
            if (cor) k_pairs_neon(pb + k_panel_cor(type) + 32 * j, ar[r] + 16 * b + 2 * j, &i0[r], &i1[r]);
            if (min)
                k_pairs_neon(pb + k_panel_mco(type) + 32 * j,
                             (const int16_t *)(const void *)(yr[r] + (size_t)b * K_Q8_K_SIZE + 260 + 4 * j), &m0[r], &m1[r]);
        }
    K_UNROLL
    for (int r = 0; r < R; r++) {
        float64x2_t is[4], ms[4];
        k_i32x8_f64_neon(i0[r], i1[r], is);
        k_i32x8_f64_neon(m0[r], m1[r], ms);
        K_UNROLL
        for (int k = 0; k < 4; k++) {
            float64x2_t t;
            if (min) // reference: dy * (dx * isum - dmin * msum)
                t = vmulq_n_f64(vsubq_f64(k_no_fuse_f64x2(vmulq_f64(dx[k], is[k])), k_no_fuse_f64x2(vmulq_f64(dm[k], ms[k]))),
                                dr[r][b]);
            else // reference: dx * dy * isum
                t = vmulq_f64(vmulq_n_f64(dx[k], dr[r][b]), is[k]);
            acc[r][k] = vaddq_f64(acc[r][k], k_no_fuse_f64x2(t));
        }
    }
}

// R (1, 2) activation rows against the panel: each row's eight results to lanes[l][r], lane l
// the sum of blocks l, l + 4, ...
K_DOTPROD K_INLINE void k_gemm_rows_neon(uint32_t type, bool mm, int R, int64_t n, const uint8_t *panel, const uint8_t *const *yr,
                               const int16_t *const *ar, const double *const *dr, const int32_t *const *ao,
                               const k_prefetch *pf, double lanes[K_BLOCK_LANES][2][8]) {
    const int64_t nb = n / type_table[type].blck_size;
    const size_t bb = k_panel_blk(type);
    K_UNROLL
    for (int l = 0; l < K_BLOCK_LANES; l++) {
        float64x2_t acc[2][4];
        K_UNROLL
        for (int r = 0; r < R; r++)
            for (int k = 0; k < 4; k++) acc[r][k] = vdupq_n_f64(0);
        for (int64_t b = l; b < nb; b += K_BLOCK_LANES) {
            if (pf) k_prefetch_blks(pf, b, 1);
            k_gemm_blk_neon(type, mm, R, panel + (size_t)b * bb, b, nb, yr, ar, dr, ao, acc);
        }
        K_UNROLL
        for (int r = 0; r < R; r++)
            for (int k = 0; k < 4; k++) vst1q_f64(&lanes[l][r][2 * k], acc[r][k]);
    }
}

// k_gemm_fn: nr (1..K_GEMM_ROWS) activation rows against a panel of nw weight rows.
K_DOTPROD K_INLINE void k_gemm_neon(uint32_t type, bool mm, int64_t n, const uint8_t *panel, const uint8_t *y, size_t ys, const uint8_t *side,
                          size_t side_stride, int nr, float *const *out, int nw, const k_prefetch *pf) {
    PSV_ASSERT(nr >= 1 && nr <= K_GEMM_ROWS && nw >= 1 && nw <= K_PANEL);
    for (int r0 = 0; r0 < nr; r0 += 2) {
        const int R = PSV_MIN(2, nr - r0);
        const uint8_t *yr[2];
        const int16_t *ar[2];
        const double *dr[2];
        const int32_t *ao[2];
        for (int r = 0; r < R; r++) // (R varies: not K_UNROLL, which clang must unroll fully)
            k_gemm_side(type, n, y + (size_t)(r0 + r) * ys, side + (size_t)(r0 + r) * side_stride, &yr[r], &ar[r], &dr[r], &ao[r]);
        double lanes[K_BLOCK_LANES][2][8];
        const k_prefetch *p = r0 == 0 ? pf : NULL; // once per call
        if (R == 2 && mm) k_gemm_rows_neon(type, true, 2, n, panel, yr, ar, dr, ao, p, lanes);
        else if (R == 2) k_gemm_rows_neon(type, false, 2, n, panel, yr, ar, dr, ao, p, lanes);
        else k_gemm_rows_neon(type, false, 1, n, panel, yr, ar, dr, ao, p, lanes);
        for (int r = 0; r < R; r++) // the reference's ((lane0 + lane1) + lane2) + lane3, rounded once
            for (int i = 0; i < nw; i++)
                out[r0 + r][i] = (float)(((lanes[0][r][i] + lanes[1][r][i]) + lanes[2][r][i]) + lanes[3][r][i]);
    }
}

// Each type's GEMM twice: sdot only ("dotprod") and with smmla ("i8mm").
#define K_DEF_GEMM_NEON(name, type)                                                                                  \
    K_DOTPROD static void name##_dotprod(int64_t n, const uint8_t *panel, const uint8_t *y, size_t ys,              \
                                         const uint8_t *side, size_t ss, int nr, float *const *out, int nw,         \
                                         const k_prefetch *pf) {                                                    \
        k_gemm_neon(type, false, n, panel, y, ys, side, ss, nr, out, nw, pf);                                       \
    }                                                                                                               \
    K_I8MM static void name##_i8mm(int64_t n, const uint8_t *panel, const uint8_t *y, size_t ys, const uint8_t *side, \
                                   size_t ss, int nr, float *const *out, int nw, const k_prefetch *pf) {            \
        k_gemm_neon(type, true, n, panel, y, ys, side, ss, nr, out, nw, pf);                                        \
    }
K_DEF_GEMM_NEON(k_gemm_q4_0, T_Q4_0)
K_DEF_GEMM_NEON(k_gemm_q4_1, T_Q4_1)
K_DEF_GEMM_NEON(k_gemm_q5_0, T_Q5_0)
K_DEF_GEMM_NEON(k_gemm_q5_1, T_Q5_1)
K_DEF_GEMM_NEON(k_gemm_q8_0, T_Q8_0)
K_DEF_GEMM_NEON(k_gemm_q2_k, T_Q2_K)
K_DEF_GEMM_NEON(k_gemm_q3_k, T_Q3_K)
K_DEF_GEMM_NEON(k_gemm_q4_k, T_Q4_K)
K_DEF_GEMM_NEON(k_gemm_q5_k, T_Q5_K)
K_DEF_GEMM_NEON(k_gemm_q6_k, T_Q6_K)

// ---- NEON dotprod: generation of one sequence (gemv1) -------------------------------------------
// As the AVX-512 gemv1 kernels: four weight rows at a time against the activation row, so that
// the work of a block that is not multiplying is shared: the activation's vectors and scale are
// loaded once for the four rows, each row's sums are reduced with the others' by pairwise adds
// (no horizontal sum per row), and the four rows' double terms are formed side by side in two
// float64x2 (the activation's block scales come from the side data, already doubles) and added
// to lane b % 4, exactly as the reference does it.

// Lanes (acc[l][0]: rows 0-1, acc[l][1]: rows 2-3) added in the reference's order, rounded to
// float, stored for the rows that exist.
static inline void k_gemv1_store_neon(float64x2_t acc[K_BLOCK_LANES][2], float *s, int w, int nw) {
    float out[4];
    K_UNROLL
    for (int h = 0; h < 2; h++) {
        const float64x2_t v = vaddq_f64(vaddq_f64(vaddq_f64(acc[0][h], acc[1][h]), acc[2][h]), acc[3][h]);
        vst1_f32(out + 2 * h, vcvt_f32_f64(v));
    }
    k_gemv1_put(out, s, w, nw);
}

// The four rows' int32 (one vector each) reduced: lane r = the sum of t[r]'s lanes.
static inline int32x4_t k_hsum4_neon(const int32x4_t t[4]) {
    return vpaddq_s32(vpaddq_s32(t[0], t[1]), vpaddq_s32(t[2], t[3]));
}

// 32-value blocks (Q4_0, Q5_0, Q8_0): block b's term of each row into acc (one lane's pair).
K_DOTPROD K_INLINE void k_gemv1_blk32_neon(uint32_t type, const uint8_t *const xr[4], size_t xs, int64_t b,
                                           const uint8_t *y, double dy, float64x2_t acc[2]) {
    const int8x16_t a0 = vld1q_s8((const int8_t *)(y + (size_t)b * K_Q8_0_SIZE + 2));
    const int8x16_t a1 = vld1q_s8((const int8_t *)(y + (size_t)b * K_Q8_0_SIZE + 18));
    int32x4_t t[4];
    float dx[4];
    K_UNROLL
    for (int r = 0; r < 4; r++) {
        const uint8_t *xb = xr[r] + (size_t)b * xs;
        int8x16_t lo, hi;
        k_w32_neon(type, xb, &lo, &hi);
        t[r] = k_sdot_neon(k_sdot_neon(vdupq_n_s32(0), lo, a0), hi, a1);
        dx[r] = k_f16_neon(xb);
    }
    const int32x4_t is = k_hsum4_neon(t);
    // reference: (double)dx * (double)dy * (double)isum, exact (11 + 11 + 19 bits): one FMA
    // rounds the sum as the reference's addition does
    acc[0] = vfmaq_f64(acc[0], vmulq_n_f64(vcvt_f64_f32(vld1_f32(dx)), dy), vcvtq_f64_s64(vmovl_s32(vget_low_s32(is))));
    acc[1] = vfmaq_f64(acc[1], vmulq_n_f64(vcvt_f64_f32(vld1_f32(dx + 2)), dy), vcvtq_f64_s64(vmovl_high_s32(is)));
}

K_DOTPROD K_INLINE void k_gemv1_32_neon(uint32_t type, int64_t n, float *s, const uint8_t *x, size_t x_stride, int nw,
                                        const uint8_t *y, const uint8_t *side) {
    PSV_ASSERT(n % 32 == 0 && nw >= 1 && (type == T_Q4_0 || type == T_Q5_0 || type == T_Q8_0));
    const size_t xs = type == T_Q4_0 ? K_Q4_0_SIZE : type == T_Q5_0 ? K_Q5_0_SIZE : K_Q8_0_SIZE;
    const int64_t nb = n / 32;
    const double *dy = (const double *)(const void *)(side + k_act_side_d(n));
    for (int w = 0; w < k_gemv1_groups(nw); w++) {
        const uint8_t *xr[4];
        k_gemv1_rows(x, x_stride, nw, w, xr);
        float64x2_t acc[K_BLOCK_LANES][2];
        K_UNROLL
        for (int l = 0; l < K_BLOCK_LANES; l++) acc[l][0] = acc[l][1] = vdupq_n_f64(0);
        int64_t b = 0;
        for (; b + K_BLOCK_LANES <= nb; b += K_BLOCK_LANES) {
            K_UNROLL
            for (int l = 0; l < K_BLOCK_LANES; l++) k_gemv1_blk32_neon(type, xr, xs, b + l, y, dy[b + l], acc[l]);
        }
        for (; b < nb; b++) {
            switch (b % K_BLOCK_LANES) { // constant indices keep the accumulators in registers
            case 0: k_gemv1_blk32_neon(type, xr, xs, b, y, dy[b], acc[0]); break;
            case 1: k_gemv1_blk32_neon(type, xr, xs, b, y, dy[b], acc[1]); break;
            default: k_gemv1_blk32_neon(type, xr, xs, b, y, dy[b], acc[2]); break; // at most three are left
            }
        }
        k_gemv1_store_neon(acc, s, w, nw);
    }
}

// acc[b % 4] += t (the lane switched on, so the accumulators stay in registers).
static inline void k_gemv1_add_neon(float64x2_t acc[K_BLOCK_LANES][2], int64_t b, const float64x2_t t[2]) {
    switch (b % K_BLOCK_LANES) {
    case 0: acc[0][0] = vaddq_f64(acc[0][0], t[0]), acc[0][1] = vaddq_f64(acc[0][1], t[1]); break;
    case 1: acc[1][0] = vaddq_f64(acc[1][0], t[0]), acc[1][1] = vaddq_f64(acc[1][1], t[1]); break;
    case 2: acc[2][0] = vaddq_f64(acc[2][0], t[0]), acc[2][1] = vaddq_f64(acc[2][1], t[1]); break;
    default: acc[3][0] = vaddq_f64(acc[3][0], t[0]), acc[3][1] = vaddq_f64(acc[3][1], t[1]); break;
    }
}

// Q4_K: a row's eight sub-block sums (sdot on the low and high nibbles of each 32-byte chunk)
// reduced to two vectors, weighted by the scales and summed; msum from the activation's bsums
// (pairs summed once for the four rows). Term: the reference's dy * (d * isum - dmin * msum).
K_DOTPROD static void k_gemv1_q4_k_dotprod(int64_t n, float *s, const uint8_t *x, size_t x_stride, int nw,
                                           const uint8_t *y, const uint8_t *side) {
    PSV_ASSERT(n % QK_K == 0 && nw >= 1);
    const int64_t nb = n / QK_K;
    const double *dys = (const double *)(const void *)(side + k_act_side_d(n));
    for (int w = 0; w < k_gemv1_groups(nw); w++) {
        const uint8_t *xr[4];
        k_gemv1_rows(x, x_stride, nw, w, xr);
        float64x2_t acc[K_BLOCK_LANES][2];
        K_UNROLL
        for (int l = 0; l < K_BLOCK_LANES; l++) acc[l][0] = acc[l][1] = vdupq_n_f64(0);
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *yb = y + (size_t)b * K_Q8_K_SIZE;
            const int8_t *a = (const int8_t *)(yb + 4);
            int16x8_t bs0, bs1;
            memcpy(&bs0, yb + 260, 16);
            memcpy(&bs1, yb + 276, 16);
            const int32x4_t p03 = vpaddlq_s16(bs0), p47 = vpaddlq_s16(bs1); // bsums 2k + (2k + 1)
            int32_t is[4], ms[4];
            float dx[4], dm[4];
            K_UNROLL
            for (int r = 0; r < 4; r++) {
                const uint8_t *xb = xr[r] + (size_t)b * K_Q4_K_SIZE;
                int32x4_t t[8];
                K_UNROLL
                for (int c = 0; c < 4; c++) k_q4_k_chunk_neon(true, xb + 16, a, c, &t[2 * c], &t[2 * c + 1]);
                int sc[8], m[8];
                K_UNROLL
                for (int k = 0; k < 8; k++) k_scale_min_k4(xb + 4, k, &sc[k], &m[k]);
                const int32x4_t s03 = vld1q_s32(sc), s47 = vld1q_s32(sc + 4), m03 = vld1q_s32(m), m47 = vld1q_s32(m + 4);
                is[r] = vaddvq_s32(vmlaq_s32(vmulq_s32(k_hsum4_neon(t), s03), k_hsum4_neon(t + 4), s47));
                ms[r] = vaddvq_s32(vmlaq_s32(vmulq_s32(p03, m03), p47, m47));
                dx[r] = k_f16_neon(xb);
                dm[r] = k_f16_neon(xb + 2);
            }
            float64x2_t t[2];
            K_UNROLL
            for (int h = 0; h < 2; h++) {
                const int32x2_t i2 = vld1_s32(is + 2 * h), m2 = vld1_s32(ms + 2 * h);
                const float64x2_t di = k_no_fuse_f64x2(vmulq_f64(vcvt_f64_f32(vld1_f32(dx + 2 * h)), vcvtq_f64_s64(vmovl_s32(i2))));
                const float64x2_t dmm = k_no_fuse_f64x2(vmulq_f64(vcvt_f64_f32(vld1_f32(dm + 2 * h)), vcvtq_f64_s64(vmovl_s32(m2))));
                t[h] = k_no_fuse_f64x2(vmulq_n_f64(vsubq_f64(di, dmm), dys[b]));
            }
            k_gemv1_add_neon(acc, b, t);
        }
        k_gemv1_store_neon(acc, s, w, nw);
    }
}

// Q6_K: each 16 values' sums (sdot of the signed quants, unpacked as k_dot_q6_k_neon does) reduced
// four sub-blocks at a time and weighted by the scales. Term: the reference's dx * dy * isum.
K_DOTPROD static void k_gemv1_q6_k_dotprod(int64_t n, float *s, const uint8_t *x, size_t x_stride, int nw,
                                           const uint8_t *y, const uint8_t *side) {
    PSV_ASSERT(n % QK_K == 0 && nw >= 1);
    const int64_t nb = n / QK_K;
    const double *dys = (const double *)(const void *)(side + k_act_side_d(n));
    for (int w = 0; w < k_gemv1_groups(nw); w++) {
        const uint8_t *xr[4];
        k_gemv1_rows(x, x_stride, nw, w, xr);
        float64x2_t acc[K_BLOCK_LANES][2];
        K_UNROLL
        for (int l = 0; l < K_BLOCK_LANES; l++) acc[l][0] = acc[l][1] = vdupq_n_f64(0);
        for (int64_t b = 0; b < nb; b++) {
            const int8_t *a = (const int8_t *)(y + (size_t)b * K_Q8_K_SIZE + 4);
            int32_t is[4];
            float dx[4];
            K_UNROLL
            for (int r = 0; r < 4; r++) {
                const uint8_t *xb = xr[r] + (size_t)b * K_Q6_K_SIZE;
                int32x4_t t[16]; // sub-block e / 16 of value e = 128h + 32k + 16 half
                for (int h = 0; h < 2; h++)
                    for (int k = 0; k < 4; k++)
                        for (int half = 0; half < 2; half++) {
                            const int8x16_t qv = vsubq_s8(vreinterpretq_s8_u8(k_q6_k_raw16_neon(xb, h, k, half)), vdupq_n_s8(32));
                            const int e = 128 * h + 32 * k + 16 * half;
                            t[e / 16] = k_sdot_neon(vdupq_n_s32(0), qv, vld1q_s8(a + e));
                        }
                const int8x16_t sc8 = vld1q_s8((const int8_t *)(xb + 192));
                const int16x8_t slo = vmovl_s8(vget_low_s8(sc8)), shi = vmovl_high_s8(sc8);
                int32x4_t sum = vmulq_s32(k_hsum4_neon(t), vmovl_s16(vget_low_s16(slo)));
                sum = vmlaq_s32(sum, k_hsum4_neon(t + 4), vmovl_high_s16(slo));
                sum = vmlaq_s32(sum, k_hsum4_neon(t + 8), vmovl_s16(vget_low_s16(shi)));
                sum = vmlaq_s32(sum, k_hsum4_neon(t + 12), vmovl_high_s16(shi));
                is[r] = vaddvq_s32(sum);
                dx[r] = k_f16_neon(xb + 208);
            }
            float64x2_t t[2];
            K_UNROLL
            for (int h = 0; h < 2; h++) {
                const float64x2_t dxy = vmulq_n_f64(vcvt_f64_f32(vld1_f32(dx + 2 * h)), dys[b]);
                t[h] = k_no_fuse_f64x2(vmulq_f64(dxy, vcvtq_f64_s64(vmovl_s32(vld1_s32(is + 2 * h)))));
            }
            k_gemv1_add_neon(acc, b, t);
        }
        k_gemv1_store_neon(acc, s, w, nw);
    }
}

#define K_DEF_GEMV1_NEON(name, type)                                                                                  \
    K_DOTPROD static void name(int64_t n, float *s, const uint8_t *x, size_t x_stride, int nw, const uint8_t *y,    \
                               const uint8_t *side) {                                                                \
        k_gemv1_32_neon(type, n, s, x, x_stride, nw, y, side);                                                       \
    }
K_DEF_GEMV1_NEON(k_gemv1_q4_0_dotprod, T_Q4_0)
K_DEF_GEMV1_NEON(k_gemv1_q5_0_dotprod, T_Q5_0)
K_DEF_GEMV1_NEON(k_gemv1_q8_0_dotprod, T_Q8_0)

// ---- NEON: packing GEMM panels ------------------------------------------------------------------
// k_panel_pack with vector unpacking: each row's block becomes its panel bytes in order (the
// stored quant bytes for the 4-bit types, else the unsigned quants plus offset in value order),
// and 4 x 4 transposes of 32-bit elements turn rows 0-3 (4-7) into the low (high) halves of the
// panel's vectors. Q2_K, Q3_K and Q5_K unpack through k_panel_unpack. Byte-identical to
// k_panel_pack (tested).

// Bytes 4v..4v+3 of src[0..3] for v = e..e+3 -> the 16 bytes at dst + 32 (v - e).
static inline void k_tr4_store_neon(const uint8_t *const src[4], int e, uint8_t *dst) {
    const uint32x4_t a0 = vreinterpretq_u32_u8(vld1q_u8(src[0] + 4 * e)), a1 = vreinterpretq_u32_u8(vld1q_u8(src[1] + 4 * e));
    const uint32x4_t a2 = vreinterpretq_u32_u8(vld1q_u8(src[2] + 4 * e)), a3 = vreinterpretq_u32_u8(vld1q_u8(src[3] + 4 * e));
    const uint64x2_t t0 = vreinterpretq_u64_u32(vtrn1q_u32(a0, a1)), t1 = vreinterpretq_u64_u32(vtrn2q_u32(a0, a1));
    const uint64x2_t t2 = vreinterpretq_u64_u32(vtrn1q_u32(a2, a3)), t3 = vreinterpretq_u64_u32(vtrn2q_u32(a2, a3));
    vst1q_u8(dst, vreinterpretq_u8_u64(vtrn1q_u64(t0, t2)));
    vst1q_u8(dst + 32, vreinterpretq_u8_u64(vtrn1q_u64(t1, t3)));
    vst1q_u8(dst + 64, vreinterpretq_u8_u64(vtrn2q_u64(t0, t2)));
    vst1q_u8(dst + 96, vreinterpretq_u8_u64(vtrn2q_u64(t1, t3)));
}

static void k_pack_core_neon(uint32_t type, int64_t n, const uint8_t *w, size_t ws, int nw, uint8_t *panel) {
    const int64_t qb = type_table[type].blck_size, nb = n / qb;
    const size_t bb = k_panel_blk(type), xs = type_table[type].type_size, dxo = k_panel_dx(type);
    const bool min = k_panel_min(type), kq = qb == QK_K;
    const int nvec = (int)(k_panel_nibbles(type) ? qb / 8 : qb / 4); // the block's panel vectors
    PSV_ASSERT(k_panel_has(type) && n % qb == 0 && nw >= 1 && nw <= K_PANEL);
    static const uint8_t zero[QK_K] = {0}; // the rows past nw
    uint8_t q[K_PANEL][QK_K];
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *pb = panel + (size_t)b * bb;
        const uint8_t *src[K_PANEL];
        int sc[K_PANEL][16], cor[K_PANEL][16], mco[K_PANEL][16]; // k-quants only (rows past nw: 0)
        if (kq) memset(sc, 0, sizeof sc), memset(cor, 0, sizeof cor), memset(mco, 0, sizeof mco);
        double dx[K_PANEL] = {0}, dm[K_PANEL] = {0};
        for (int r = 0; r < K_PANEL; r++) {
            src[r] = zero;
            if (r >= nw) continue;
            const uint8_t *x = w + (size_t)r * ws + (size_t)b * xs;
            switch (type) {
            case T_Q4_1: case T_Q4_K: // the stored bytes
                src[r] = x + (type == T_Q4_1 ? 4 : 16);
                dx[r] = (double)k_f16_neon(x);
                if (min) dm[r] = (double)k_f16_neon(x + 2);
                if (type == T_Q4_K)
                    for (int k = 0; k < 16; k++) k_scale_min_k4(x + 4, k / 2, &sc[r][k], &mco[r][k]);
                break;
            case T_Q8_0:
                vst1q_u8(q[r], veorq_u8(vld1q_u8(x + 2), vdupq_n_u8(0x80)));
                vst1q_u8(q[r] + 16, veorq_u8(vld1q_u8(x + 18), vdupq_n_u8(0x80)));
                src[r] = q[r];
                dx[r] = (double)k_f16_neon(x);
                break;
            case T_Q4_0: case T_Q5_0: case T_Q5_1: { // the 4- or 5-bit values (plus Q4_0's and Q5_0's offset: as stored)
                const size_t qs = type == T_Q4_0 ? 2 : type == T_Q5_0 ? 6 : 8;
                const uint8x16_t v = vld1q_u8(x + qs);
                uint8x16_t lo = vandq_u8(v, vdupq_n_u8(15)), hi = vshrq_n_u8(v, 4);
                if (type != T_Q4_0) { // the fifth bits
                    const uint32_t qh = ld_u32(x + qs - 4);
                    lo = vorrq_u8(lo, k_bits16_neon(qh & 0xffff)), hi = vorrq_u8(hi, k_bits16_neon(qh >> 16));
                }
                vst1q_u8(q[r], lo);
                vst1q_u8(q[r] + 16, hi);
                src[r] = q[r];
                dx[r] = (double)k_f16_neon(x);
                if (min) dm[r] = (double)k_f16_neon(x + 2);
                break;
            }
            case T_Q6_K: { // the stored 6 bits (q + 32), in value order
                for (int h = 0; h < 2; h++)
                    for (int k = 0; k < 4; k++)
                        for (int half = 0; half < 2; half++)
                            vst1q_u8(q[r] + 128 * h + 32 * k + 16 * half, k_q6_k_raw16_neon(x, h, k, half));
                src[r] = q[r];
                for (int k = 0; k < 16; k++) sc[r][k] = (int8_t)x[192 + k], cor[r][k] = -32 * sc[r][k];
                dx[r] = (double)k_f16_neon(x + 208);
                break;
            }
            default: // Q2_K, Q3_K, Q5_K
                k_panel_unpack(type, x, q[r], sc[r], cor[r], mco[r], &dx[r], &dm[r]);
                src[r] = q[r];
                break;
            }
        }
        for (int e = 0; e < nvec; e += 4) {
            k_tr4_store_neon(src, e, pb + 32 * e);
            k_tr4_store_neon(src + 4, e, pb + 32 * e + 16);
        }
        if (kq)
            for (int k = 0; k < 16; k++)
                for (int r = 0; r < K_PANEL; r++) {
                    wr_u32(pb + k_panel_sc(type) + 32 * k + 4 * r, (uint32_t)sc[r][k]);
                    if (k_panel_off(type)) wr_u16(pb + k_panel_cor(type) + 32 * (k / 2) + 4 * r + 2 * (k % 2), (uint16_t)cor[r][k]);
                    if (min) wr_u16(pb + k_panel_mco(type) + 32 * (k / 2) + 4 * r + 2 * (k % 2), (uint16_t)mco[r][k]);
                }
        memcpy(pb + dxo, dx, sizeof dx);
        if (min) memcpy(pb + dxo + 64, dm, sizeof dm);
    }
}

#define K_DEF_PACK_NEON(name, type) \
    static void name(int64_t n, const uint8_t *w, size_t ws, int nw, uint8_t *panel) { k_pack_core_neon(type, n, w, ws, nw, panel); }
K_DEF_PACK_NEON(k_pack_q4_0_neon, T_Q4_0)
K_DEF_PACK_NEON(k_pack_q4_1_neon, T_Q4_1)
K_DEF_PACK_NEON(k_pack_q5_0_neon, T_Q5_0)
K_DEF_PACK_NEON(k_pack_q5_1_neon, T_Q5_1)
K_DEF_PACK_NEON(k_pack_q8_0_neon, T_Q8_0)
K_DEF_PACK_NEON(k_pack_q2_k_neon, T_Q2_K)
K_DEF_PACK_NEON(k_pack_q3_k_neon, T_Q3_K)
K_DEF_PACK_NEON(k_pack_q4_k_neon, T_Q4_K)
K_DEF_PACK_NEON(k_pack_q5_k_neon, T_Q5_K)
K_DEF_PACK_NEON(k_pack_q6_k_neon, T_Q6_K)

// ---- NEON: quantizing activations ---------------------------------------------------------------
// The reference quantizers' operations, four values at a time: the largest magnitude (which, like
// the reference's comparison, never takes a NaN), the same float products, and
// vcvta (nearest, ties away: roundf) or vcvtn (ties to even: ggml's nearest_int) with saturating
// narrows for the reference's clamps to [-128, 127]; a NaN becomes 0 in both.

// The largest |x[j]| of n (a multiple of 4) values, NaNs skipped (cleared to +0 first: maxNum
// would turn a signalling NaN into a NaN result), 0 if there is none.
static inline float k_absmax_neon(const float *x, int n) {
    uint32x4_t m = vdupq_n_u32(0);
    for (int j = 0; j < n; j += 4) {
        const float32x4_t v = vld1q_f32(x + j);
        m = vmaxq_u32(m, vandq_u32(vreinterpretq_u32_f32(vabsq_f32(v)), vceqq_f32(v, v)));
    }
    return f32_from_bits(vmaxvq_u32(m)); // non-negative floats order as their bits
}

// 16 int32 -> 16 int8 saturated to [-128, 127].
static inline int8x16_t k_narrow16_neon(int32x4_t a, int32x4_t b, int32x4_t c, int32x4_t d) {
    return vcombine_s8(vqmovn_s16(vcombine_s16(vqmovn_s32(a), vqmovn_s32(b))),
                       vqmovn_s16(vcombine_s16(vqmovn_s32(c), vqmovn_s32(d))));
}

// Q8_0 (q1 false) or Q8_1 (q1: the block's sum of quants times d in the second fp16).
static inline void k_quant_q8_x_neon(const float *x, uint8_t *y, int64_t n, bool q1) {
    PSV_ASSERT(n % 32 == 0);
    const size_t bs = q1 ? K_Q8_1_SIZE : K_Q8_0_SIZE, qo = q1 ? 4 : 2;
    for (int64_t b = 0; b < n / 32; b++, x += 32, y += bs) {
        const float amax = k_absmax_neon(x, 32);
        const float d = amax / 127, id = d != 0 ? 1.0f / d : 0.0f;
        int32x4_t q[8];
        for (int k = 0; k < 8; k++) q[k] = vcvtaq_s32_f32(vmulq_n_f32(vld1q_f32(x + 4 * k), id));
        const int8x16_t lo = k_narrow16_neon(q[0], q[1], q[2], q[3]), hi = k_narrow16_neon(q[4], q[5], q[6], q[7]);
        vst1q_s8((int8_t *)(y + qo), lo);
        vst1q_s8((int8_t *)(y + qo + 16), hi);
        k_st_f16(y, d);
        if (q1) k_st_f16(y + 2, (float)(vaddlvq_s8(lo) + vaddlvq_s8(hi)) * d);
    }
}
static void k_quant_q8_0_neon(const float *x, void *y, int64_t n) { k_quant_q8_x_neon(x, y, n, false); }
static void k_quant_q8_1_neon(const float *x, void *y, int64_t n) { k_quant_q8_x_neon(x, y, n, true); }

static void k_quant_q8_k_neon(const float *x, void *vy, int64_t n) {
    PSV_ASSERT(n % QK_K == 0);
    uint8_t *y = vy;
    for (int64_t b = 0; b < n / QK_K; b++, x += QK_K, y += K_Q8_K_SIZE) {
        const float amax = k_absmax_neon(x, QK_K);
        memset(y, 0, K_Q8_K_SIZE);
        if (amax == 0) continue;
        int j = 0; // the first value of that magnitude, with its sign (as k_signed_absmax)
        while (psv_fabsf(x[j]) != amax) j++;
        const float iscale = -127.0f / x[j];
        for (int k = 0; k < QK_K / 16; k++) {
            const float *xk = x + 16 * k;
            const int8x16_t q = k_narrow16_neon(vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(xk), iscale)),
                                                vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(xk + 4), iscale)),
                                                vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(xk + 8), iscale)),
                                                vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(xk + 12), iscale)));
            vst1q_s8((int8_t *)(y + 4 + 16 * k), q);
            wr_u16(y + 260 + 2 * k, (uint16_t)vaddlvq_s8(q)); // two's complement of a value in [-2048, 2032]
        }
        wr_u32(y, f32_bits(1.0f / iscale));
    }
}

// ---- NEON: float dot products and attention's products -------------------------------------------
// The reference's K_LANES = 16 double lanes as eight float64x2 registers: value i goes to lane
// i % 16, lanes added in order at the end. F32 and BF16 products are exact in double and added
// with one FMA (the sum of an exact product, as the reference rounds it); F16 products are exact
// in float and converted. The conversions to float are the hardware's (exact, as the reference's).

// acc[k] += values 2k, 2k + 1 of the 16 products of x and y (doubles)
static inline void k_fma16_neon(float64x2_t acc[8], const float32x4_t x[4], const float32x4_t y[4]) {
    for (int k = 0; k < 4; k++) {
        acc[2 * k] = vfmaq_f64(acc[2 * k], vcvt_f64_f32(vget_low_f32(x[k])), vcvt_f64_f32(vget_low_f32(y[k])));
        acc[2 * k + 1] = vfmaq_f64(acc[2 * k + 1], vcvt_high_f64_f32(x[k]), vcvt_high_f64_f32(y[k]));
    }
}

// The lanes, then the values from i on one by one as the reference adds them (lane i % 16).
static inline float k_lanes16_neon(const float64x2_t acc[8], int64_t i, int64_t n, uint32_t type, const uint8_t *x,
                                   const uint8_t *y) {
    double a[K_LANES];
    for (int k = 0; k < 8; k++) vst1q_f64(a + 2 * k, acc[k]);
    for (; i < n; i++) {
        double t;
        if (type == T_F32) t = (double)k_ld_f32(x + 4 * i) * (double)k_ld_f32(y + 4 * i);
        else if (type == T_F16) t = (double)(k_f16_neon(x + 2 * i) * k_f16_neon(y + 2 * i));
        else t = (double)psv_bf16_to_f32(ld_u16(x + 2 * i)) * (double)psv_bf16_to_f32(ld_u16(y + 2 * i));
        a[i % K_LANES] += t;
    }
    return k_lanes_sum(a, K_LANES);
}

static inline float32x4_t k_bf16x4_neon(const uint8_t *p) {
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16((const uint16_t *)(const void *)p), 16));
}

static inline float k_dot_float_neon(uint32_t type, int64_t n, const uint8_t *x, const uint8_t *y) {
    float64x2_t acc[8];
    for (int k = 0; k < 8; k++) acc[k] = vdupq_n_f64(0);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        float32x4_t a[4], b[4];
        for (int k = 0; k < 4; k++) {
            if (type == T_F32) {
                a[k] = vld1q_f32((const float *)(const void *)(x + 4 * (i + 4 * k)));
                b[k] = vld1q_f32((const float *)(const void *)(y + 4 * (i + 4 * k)));
            } else if (type == T_BF16) {
                a[k] = k_bf16x4_neon(x + 2 * (i + 4 * k));
                b[k] = k_bf16x4_neon(y + 2 * (i + 4 * k));
            } else { // F16: the float products, exact
                const float32x4_t p = vmulq_f32(vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8(x + 2 * (i + 4 * k)))),
                                                vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8(y + 2 * (i + 4 * k)))));
                acc[2 * k] = vaddq_f64(acc[2 * k], vcvt_f64_f32(vget_low_f32(p)));
                acc[2 * k + 1] = vaddq_f64(acc[2 * k + 1], vcvt_high_f64_f32(p));
            }
        }
        if (type != T_F16) k_fma16_neon(acc, a, b);
    }
    return k_lanes16_neon(acc, i, n, type, x, y);
}
static void k_dot_f32_f32_neon(int64_t n, float *s, const void *x, const void *y) { *s = k_dot_float_neon(T_F32, n, x, y); }
static void k_dot_f16_f16_neon(int64_t n, float *s, const void *x, const void *y) { *s = k_dot_float_neon(T_F16, n, x, y); }
static void k_dot_bf16_bf16_neon(int64_t n, float *s, const void *x, const void *y) { *s = k_dot_float_neon(T_BF16, n, x, y); }

// dot_keys (k_vec_ops): each key row's F32 dot product with each query.
// k_dot_keys_avx2's scheme with two keys a register, a quarter block at a time.
static inline void k_dot_keys_q_neon(const int c, float *s, size_t s_stride, const double *qd, const float *k,
                                     size_t bstride, int64_t nk, int64_t n) {
    for (int64_t p = 0; p < nk; p += 2) {
        const float *kb = k + (size_t)(p / K_KEY_BLOCK) * bstride + (size_t)(p % K_KEY_BLOCK);
        float64x2_t tot[4];
        for (int l = 0; l < K_LANES; l++) {
            float64x2_t lane[4];
            for (int g = 0; g < c; g++) lane[g] = vdupq_n_f64(0.0);
            for (int64_t i = l; i < n; i += K_LANES) {
                const float64x2_t kv = vcvt_f64_f32(vld1_f32(kb + (size_t)i * K_KEY_BLOCK));
                for (int g = 0; g < c; g++) lane[g] = vfmaq_f64(lane[g], kv, vdupq_n_f64(qd[(size_t)g * K_KEYS_MAX_N + (size_t)i]));
            }
            for (int g = 0; g < c; g++) tot[g] = l == 0 ? lane[g] : vaddq_f64(tot[g], lane[g]);
        }
        for (int g = 0; g < c; g++) {
            float32x2_t o = vcvt_f32_f64(tot[g]);
            s[(size_t)g * s_stride + (size_t)p] = vget_lane_f32(o, 0);
            if (p + 1 < nk) s[(size_t)g * s_stride + (size_t)p + 1] = vget_lane_f32(o, 1);
        }
    }
}

static void k_dot_keys_neon(float *s, size_t s_stride, const float *q, size_t q_stride, int nq, const float *k,
                            size_t bstride, int64_t nk, int64_t n) {
    if (n > K_KEYS_MAX_N) {
        k_dot_keys_ref(s, s_stride, q, q_stride, nq, k, bstride, nk, n);
        return;
    }
    const int chunks = (nq + 3) / 4, per = (nq + chunks - 1) / chunks;
    double qd[4 * K_KEYS_MAX_N];
    for (int g0 = 0; g0 < nq; g0 += per) {
        const int c = PSV_MIN(per, nq - g0);
        float *sg = s + (size_t)g0 * s_stride;
        k_keys_queries_pd(qd, q, q_stride, g0, c, n);
        switch (c) {
        case 1: k_dot_keys_q_neon(1, sg, s_stride, qd, k, bstride, nk, n); break;
        case 2: k_dot_keys_q_neon(2, sg, s_stride, qd, k, bstride, nk, n); break;
        case 3: k_dot_keys_q_neon(3, sg, s_stride, qd, k, bstride, nk, n); break;
        default: k_dot_keys_q_neon(4, sg, s_stride, qd, k, bstride, nk, n); break;
        }
    }
}

// axpy_rows (k_vec_ops): y += w[p] * v[p] for p in order, each product rounded before its sum
// (the file has contraction off: no FMA); 32 values of y in registers over all the rows.
static void k_axpy_row_neon(float *y, const float *w, const float *v, size_t stride, int64_t nk, int64_t n) {
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        float32x4_t a[8];
        for (int k = 0; k < 8; k++) a[k] = vld1q_f32(y + i + 4 * k);
        for (int64_t p = 0; p < nk; p++) {
            const float *vp = v + (size_t)p * stride + i;
            for (int k = 0; k < 8; k++) a[k] = vaddq_f32(a[k], vmulq_n_f32(vld1q_f32(vp + 4 * k), w[p]));
        }
        for (int k = 0; k < 8; k++) vst1q_f32(y + i + 4 * k, a[k]);
    }
    for (; i + 4 <= n; i += 4) {
        float32x4_t a = vld1q_f32(y + i);
        for (int64_t p = 0; p < nk; p++) a = vaddq_f32(a, vmulq_n_f32(vld1q_f32(v + (size_t)p * stride + i), w[p]));
        vst1q_f32(y + i, a);
    }
    for (; i < n; i++)
        for (int64_t p = 0; p < nk; p++) {
            float t = w[p] * v[(size_t)p * stride + (size_t)i];
            y[i] += t;
        }
}

static void k_axpy_rows_neon(float *y, size_t y_stride, const float *w, size_t w_stride, int nq, const float *v,
                             size_t stride, int64_t nk, int64_t n) {
    for (int g = 0; g < nq; g++) k_axpy_row_neon(y + (size_t)g * y_stride, w + (size_t)g * w_stride, v, stride, nk, n);
}

// F16 (the hardware conversion: round to nearest even, infinity past 65504, NaN quieted with its
// top payload bits, as psv_f32_to_fp16) and BF16 (psv_f32_to_bf16's integer rounding) activations.
static void k_quant_f16_neon(const float *x, void *vy, int64_t n) {
    uint8_t *y = vy;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1_u16((uint16_t *)(void *)(y + 2 * i), vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
    for (; i < n; i++) k_st_f16(y + 2 * i, x[i]);
}

static void k_quant_bf16_neon(const float *x, void *vy, int64_t n) {
    uint8_t *y = vy;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const uint32x4_t u = vreinterpretq_u32_f32(vld1q_f32(x + i));
        const uint32x4_t nan = vcgtq_u32(vandq_u32(u, vdupq_n_u32(0x7fffffffu)), vdupq_n_u32(0x7f800000u));
        const uint32x4_t r = vaddq_u32(u, vaddq_u32(vdupq_n_u32(0x7fff), vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1))));
        const uint32x4_t h = vbslq_u32(nan, vorrq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(0x40)), vshrq_n_u32(r, 16));
        vst1_u16((uint16_t *)(void *)(y + 2 * i), vmovn_u32(h));
    }
    for (; i < n; i++) wr_u16(y + 2 * i, psv_f32_to_bf16(x[i]));
}

// ---- NEON: exp, SwiGLU, softmax --------------------------------------------------------------------
// As the AVX2 kernels: psv_expf_poly on 4 lanes with the hardware FMA, which rounds exactly as
// psv_fmaf does wherever no value involved is a float subnormal, i.e. whenever |n| <= 125; a
// vector with any lane beyond that (or NaN) goes through psv_expf_poly itself, lane by lane.
static inline float32x4_t k_expf_poly_neon(float32x4_t x, bool *slow) {
    const float32x4_t shift = vdupq_n_f32(0x1.8p23f);
    const float32x4_t z = vfmaq_f32(shift, x, vdupq_n_f32(0x1.715476p+0f));
    const float32x4_t n = vsubq_f32(z, shift), nn = vsubq_f32(vdupq_n_f32(0), n);
    const float32x4_t b = vfmaq_f32(vfmaq_f32(x, nn, vdupq_n_f32(0x1.62e4p-1f)), nn, vdupq_n_f32(0x1.7f7d1cp-20f));
    const uint32x4_t e = vshlq_n_u32(vreinterpretq_u32_f32(z), 23);
    const float32x4_t k = vreinterpretq_f32_u32(vaddq_u32(e, vdupq_n_u32(0x3f800000)));
    const float32x4_t u = vmulq_f32(b, b);
    const float32x4_t j = vfmaq_f32(vmulq_f32(vdupq_n_f32(0x1.ffffecp-1f), b),
                                    vfmaq_f32(vfmaq_f32(vdupq_n_f32(0x1.fffdb6p-2f), vdupq_n_f32(0x1.555e66p-3f), b), u,
                                              vfmaq_f32(vdupq_n_f32(0x1.573e2ep-5f), vdupq_n_f32(0x1.0e4020p-7f), b)),
                                    u);
    // as in k_expf_poly_avx2: 127 <= |n| <= 192 through psv_expf_poly's split of 2^n, |n| > 192
    // +0 or +inf
    const float32x4_t an = vabsq_f32(n);
    const uint32x4_t in = vcleq_f32(an, vdupq_n_f32(125.0f));
    *slow = false;
    if (vminvq_u32(in)) return vfmaq_f32(k, k, j);
    const uint32x4_t neg = vcltq_f32(n, vdupq_n_f32(0.0f)), big = vcgtq_f32(an, vdupq_n_f32(192.0f));
    const uint32x4_t split = vandq_u32(vcgeq_f32(an, vdupq_n_f32(127.0f)), vcleq_f32(an, vdupq_n_f32(192.0f)));
    const uint32x4_t fast = vorrq_u32(vorrq_u32(in, big), split);
    *slow = vminvq_u32(fast) == 0; // false for NaN too
    const float32x4_t s1 = vbslq_f32(neg, vdupq_n_f32(0x1p-125f), vdupq_n_f32(0x1p127f));
    const float32x4_t s2 = vreinterpretq_f32_u32(vsubq_u32(e, vandq_u32(neg, vdupq_n_u32(0x82000000u))));
    const float32x4_t r = vbslq_f32(split, vmulq_f32(vfmaq_f32(s2, s2, j), s1), vfmaq_f32(k, k, j));
    const uint32x4_t inf = vbicq_u32(vdupq_n_u32(0x7f800000u), neg);
    return vbslq_f32(big, vreinterpretq_f32_u32(inf), r);
}

static void k_expf_neon(float *y, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        bool slow;
        const float32x4_t e = k_expf_poly_neon(vld1q_f32(x + i), &slow);
        if (slow)
            for (int l = 0; l < 4; l++) y[i + l] = psv_expf_poly(x[i + l]);
        else vst1q_f32(y + i, e);
    }
    for (; i < n; i++) y[i] = psv_expf_poly(x[i]);
}

static void k_swiglu_neon(float *y, const float *g, const float *u, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        bool slow;
        const float32x4_t gv = vld1q_f32(g + i);
        const float32x4_t e = k_expf_poly_neon(vsubq_f32(vdupq_n_f32(0), gv), &slow);
        if (slow) {
            for (int l = 0; l < 4; l++) y[i + l] = g[i + l] / (1.0f + psv_expf_poly(0.0f - g[i + l])) * u[i + l];
            continue;
        }
        vst1q_f32(y + i, vmulq_f32(vdivq_f32(gv, vaddq_f32(vdupq_n_f32(1.0f), e)), vld1q_f32(u + i)));
    }
    for (; i < n; i++) y[i] = g[i] / (1.0f + psv_expf_poly(0.0f - g[i])) * u[i];
}

// k_softmax_ref eight scores at a time (its K_SOFTMAX_LANES = 8 sum lanes: four float64x2), as
// k_softmax_avx2 (the maximum of each lane, then of the lanes, is the reference's running one
// but for the sign of a zero, which gives the same weights).
static void k_softmax_neon(float *w, int64_t n, float scale) {
    float32x4_t m0 = vdupq_n_f32(-3.4e38f), m1 = m0;
    int64_t p = 0;
    for (; p + 8 <= n; p += 8) {
        const float32x4_t v0 = vmulq_n_f32(vld1q_f32(w + p), scale), v1 = vmulq_n_f32(vld1q_f32(w + p + 4), scale);
        vst1q_f32(w + p, v0);
        vst1q_f32(w + p + 4, v1);
        m0 = vbslq_f32(vcgtq_f32(v0, m0), v0, m0); // v > m ? v : m (a NaN v keeps m)
        m1 = vbslq_f32(vcgtq_f32(v1, m1), v1, m1);
    }
    float lanes[8], mx = -3.4e38f;
    vst1q_f32(lanes, m0);
    vst1q_f32(lanes + 4, m1);
    for (int l = 0; l < 8; l++)
        if (lanes[l] > mx) mx = lanes[l];
    for (; p < n; p++) {
        w[p] = w[p] * scale;
        if (w[p] > mx) mx = w[p];
    }
    float64x2_t s[4] = {vdupq_n_f64(0), vdupq_n_f64(0), vdupq_n_f64(0), vdupq_n_f64(0)};
    for (p = 0; p + 8 <= n; p += 8)
        for (int h = 0; h < 2; h++) {
            bool slow;
            const float32x4_t v = vsubq_f32(vld1q_f32(w + p + 4 * h), vdupq_n_f32(mx));
            float32x4_t e = k_expf_poly_neon(v, &slow);
            if (slow) {
                float t[4];
                vst1q_f32(t, v);
                for (int l = 0; l < 4; l++) t[l] = psv_expf_poly(t[l]);
                e = vld1q_f32(t);
            }
            vst1q_f32(w + p + 4 * h, e);
            s[2 * h] = vaddq_f64(s[2 * h], vcvt_f64_f32(vget_low_f32(e)));
            s[2 * h + 1] = vaddq_f64(s[2 * h + 1], vcvt_high_f64_f32(e));
        }
    double lane[K_SOFTMAX_LANES];
    for (int k = 0; k < 4; k++) vst1q_f64(lane + 2 * k, s[k]);
    for (; p < n; p++) { // p % 8 counts from 0 here
        w[p] = psv_expf_poly(w[p] - mx);
        lane[p % K_SOFTMAX_LANES] += (double)w[p];
    }
    double sum = lane[0];
    for (int l = 1; l < K_SOFTMAX_LANES; l++) sum += lane[l];
    const float inv = (float)(1.0 / sum);
    for (p = 0; p + 4 <= n; p += 4) vst1q_f32(w + p, vmulq_n_f32(vld1q_f32(w + p), inv));
    for (; p < n; p++) w[p] = w[p] * inv;
}

// k_exp_shift_ref two lanes at a time, as k_exp_shift_avx2 (psv_exp's steps where they are
// branch-free: -708 <= a <= 693; other lanes and NaN take psv_exp itself).
static void k_exp_shift_neon(double *y, const float *x, double shift, double div, int64_t n) {
    static const double c[14] = {1.0 / 6227020800.0, 1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0,
                                 1.0 / 362880.0, 1.0 / 40320.0, 1.0 / 5040.0, 1.0 / 720.0, 1.0 / 120.0,
                                 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0};
    const float64x2_t one = vdupq_n_f64(1.0);
    int64_t i = 0;
    for (; i + 2 <= n; i += 2) {
        const float64x2_t v = vdivq_f64(vsubq_f64(vcvt_f64_f32(vld1_f32(x + i)), vdupq_n_f64(shift)), vdupq_n_f64(div));
        const uint64x2_t in = vandq_u64(vcgeq_f64(v, vdupq_n_f64(-708.0)), vcleq_f64(v, vdupq_n_f64(693.0)));
        if ((vgetq_lane_u64(in, 0) & vgetq_lane_u64(in, 1)) == 0) {
            for (int l = 0; l < 2; l++) y[i + l] = psv_exp(((double)x[i + l] - shift) / div);
            continue;
        }
        // psv_round_half_away(v * log2 e): truncate, then step away from zero on a half or more
        const float64x2_t kx = vmulq_f64(v, vdupq_n_f64(1.44269504088896338700));
        float64x2_t k = vrndq_f64(kx);
        const float64x2_t d = vsubq_f64(kx, k);
        k = vaddq_f64(k, vreinterpretq_f64_u64(vandq_u64(vcgeq_f64(d, vdupq_n_f64(0.5)), vreinterpretq_u64_f64(one))));
        k = vsubq_f64(k, vreinterpretq_f64_u64(vandq_u64(vcleq_f64(d, vdupq_n_f64(-0.5)), vreinterpretq_u64_f64(one))));
        const float64x2_t r = vsubq_f64(vsubq_f64(v, vmulq_f64(k, vdupq_n_f64(6.93147180369123816490e-01))),
                                        vmulq_f64(k, vdupq_n_f64(1.90821492927058770002e-10)));
        float64x2_t p = vdupq_n_f64(c[0]);
        for (int j = 1; j < 14; j++) p = vaddq_f64(vmulq_f64(p, r), vdupq_n_f64(c[j]));
        const int64x2_t e = vshlq_n_s64(vaddq_s64(vcvtq_s64_f64(k), vdupq_n_s64(1023)), 52);
        vst1q_f64(y + i, vmulq_f64(p, vreinterpretq_f64_s64(e)));
    }
    for (; i < n; i++) y[i] = psv_exp(((double)x[i] - shift) / div);
}

// The ARM sets' tables: neon (dp false), dotprod (dp), i8mm (dp and mm).
static void k_fill_neon(k_traits *t, bool dp, bool mm) {
    static const struct { uint32_t type; k_vec_dot_fn dot, dot_dp; k_gemm_fn gemm, gemm_mm; k_pack_fn pack; } dots[] = {
        {T_Q4_0, k_dot_q4_0_q8_0_neon, k_dot_q4_0_q8_0_dotprod, k_gemm_q4_0_dotprod, k_gemm_q4_0_i8mm, k_pack_q4_0_neon},
        {T_Q4_1, k_dot_q4_1_q8_1_neon, k_dot_q4_1_q8_1_dotprod, k_gemm_q4_1_dotprod, k_gemm_q4_1_i8mm, k_pack_q4_1_neon},
        {T_Q5_0, k_dot_q5_0_q8_0_neon, k_dot_q5_0_q8_0_dotprod, k_gemm_q5_0_dotprod, k_gemm_q5_0_i8mm, k_pack_q5_0_neon},
        {T_Q5_1, k_dot_q5_1_q8_1_neon, k_dot_q5_1_q8_1_dotprod, k_gemm_q5_1_dotprod, k_gemm_q5_1_i8mm, k_pack_q5_1_neon},
        {T_Q8_0, k_dot_q8_0_q8_0_neon, k_dot_q8_0_q8_0_dotprod, k_gemm_q8_0_dotprod, k_gemm_q8_0_i8mm, k_pack_q8_0_neon},
        {T_Q2_K, k_dot_q2_k_q8_k_neon, k_dot_q2_k_q8_k_dotprod, k_gemm_q2_k_dotprod, k_gemm_q2_k_i8mm, k_pack_q2_k_neon},
        {T_Q3_K, k_dot_q3_k_q8_k_neon, k_dot_q3_k_q8_k_dotprod, k_gemm_q3_k_dotprod, k_gemm_q3_k_i8mm, k_pack_q3_k_neon},
        {T_Q4_K, k_dot_q4_k_q8_k_neon, k_dot_q4_k_q8_k_dotprod, k_gemm_q4_k_dotprod, k_gemm_q4_k_i8mm, k_pack_q4_k_neon},
        {T_Q5_K, k_dot_q5_k_q8_k_neon, k_dot_q5_k_q8_k_dotprod, k_gemm_q5_k_dotprod, k_gemm_q5_k_i8mm, k_pack_q5_k_neon},
        {T_Q6_K, k_dot_q6_k_q8_k_neon, k_dot_q6_k_q8_k_dotprod, k_gemm_q6_k_dotprod, k_gemm_q6_k_i8mm, k_pack_q6_k_neon},
    };
    for (size_t i = 0; i < PSV_ARRAY_LEN(dots); i++) {
        k_traits *k = &t[dots[i].type];
        k->vec_dot = dp ? dots[i].dot_dp : dots[i].dot;
        k->vec_dot_rows = NULL;
        if (dp) k->gemm = mm ? dots[i].gemm_mm : dots[i].gemm, k->pack = dots[i].pack, k->gemm_rows = K_GEMM_ROWS;
    }
    if (dp) {
        t[T_Q4_0].gemv1 = k_gemv1_q4_0_dotprod;
        t[T_Q5_0].gemv1 = k_gemv1_q5_0_dotprod;
        t[T_Q8_0].gemv1 = k_gemv1_q8_0_dotprod;
        t[T_Q4_K].gemv1 = k_gemv1_q4_k_dotprod;
        t[T_Q6_K].gemv1 = k_gemv1_q6_k_dotprod;
    }
    t[T_Q8_0].from_float = k_quant_q8_0_neon;
    t[T_Q8_1].from_float = k_quant_q8_1_neon;
    t[T_Q8_K].from_float = k_quant_q8_k_neon;
    t[T_F16].from_float = k_quant_f16_neon;
    t[T_BF16].from_float = k_quant_bf16_neon;
    t[T_F32].vec_dot = k_dot_f32_f32_neon;
    t[T_F16].vec_dot = k_dot_f16_f16_neon;
    t[T_BF16].vec_dot = k_dot_bf16_bf16_neon;
}
#endif // PSV_ARM64

// ---- Vector math: the reference, and dispatch of the element-wise kernels ----------------------

// y[i] = psv_expf_poly(x[i]); y may be x.
static void k_expf_ref(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = psv_expf_poly(x[i]);
}

// SwiGLU: y[i] = silu(g[i]) * u[i] with silu(v) = v / (1 + psv_expf_poly(0 - v)), each float
// operation as written; y may be g or u.
static void k_swiglu_ref(float *y, const float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = g[i] / (1.0f + psv_expf_poly(0.0f - g[i])) * u[i];
}

// Attention's two products over a KV cache. The keys are stored in blocks of K_KEY_BLOCK
// positions, value by value (block b at k + b * bstride; value i of key 8b + j at [8i + j]), so
// that the vector kernels have one value of several keys in a vector; the values are rows (row p
// at v + p * stride).
// dot_keys: s[g * s_stride + p] = the F32 vec_dot of key p with query g (at q + g * q_stride;
// n values each), for p < nk and g < nq (the query heads that share a KV head).
static void k_dot_keys_ref(float *s, size_t s_stride, const float *q, size_t q_stride, int nq, const float *k,
                           size_t bstride, int64_t nk, int64_t n) {
    for (int g = 0; g < nq; g++)
        for (int64_t p = 0; p < nk; p++) {
            const float *kb = k + (size_t)(p / K_KEY_BLOCK) * bstride + (size_t)(p % K_KEY_BLOCK);
            double acc[K_LANES] = {0};
            const float *qg = q + (size_t)g * q_stride;
            for (int64_t i = 0; i < n; i++) acc[i % K_LANES] += (double)kb[(size_t)i * K_KEY_BLOCK] * (double)qg[i];
            s[(size_t)g * s_stride + (size_t)p] = k_lanes_sum(acc, K_LANES);
        }
}

// axpy_rows: for each query g < nq, with y_g = y + g * y_stride and w_g = w + g * w_stride:
// y_g[i] += w_g[p] * v[p][i] for p = 0, 1, ..., nk - 1 in turn, each product rounded before its
// sum (the weighted sum of the value rows, for the query heads that share a KV head).
static void k_axpy_rows_ref(float *y, size_t y_stride, const float *w, size_t w_stride, int nq, const float *v,
                            size_t stride, int64_t nk, int64_t n) {
    for (int g = 0; g < nq; g++)
        for (int64_t p = 0; p < nk; p++)
            for (int64_t i = 0; i < n; i++) {
                float t = w[(size_t)g * w_stride + (size_t)p] * v[(size_t)p * stride + (size_t)i];
                y[(size_t)g * y_stride + (size_t)i] += t;
            }
}

// softmax: attention's weights from n scores in place, each step rounded as written: w[p] * scale;
// their maximum mx (NaN never taken, starting from -3.4e38); psv_expf_poly(w[p] - mx); the sum of
// those in double, in K_SOFTMAX_LANES lanes (value p in lane p % K_SOFTMAX_LANES, so that vector
// code can add them in order) added up in lane order; then w[p] * (float)(1 / sum).
static void k_softmax_ref(float *w, int64_t n, float scale) {
    float mx = -3.4e38f;
    for (int64_t p = 0; p < n; p++) {
        w[p] = w[p] * scale;
        if (w[p] > mx) mx = w[p];
    }
    double lane[K_SOFTMAX_LANES] = {0};
    for (int64_t p = 0; p < n; p++) {
        w[p] = psv_expf_poly(w[p] - mx);
        lane[p % K_SOFTMAX_LANES] += (double)w[p];
    }
    double sum = lane[0];
    for (int l = 1; l < K_SOFTMAX_LANES; l++) sum += lane[l];
    const float inv = (float)(1.0 / sum);
    for (int64_t p = 0; p < n; p++) w[p] = w[p] * inv;
}

// y[i] = psv_exp(((double)x[i] - shift) / div): the sampler's weights of a whole vocabulary.
static void k_exp_shift_ref(double *y, const float *x, double shift, double div, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = psv_exp(((double)x[i] - shift) / div);
}

typedef struct {
    void (*expf)(float *y, const float *x, int64_t n);
    void (*swiglu)(float *y, const float *g, const float *u, int64_t n);
    void (*dot_keys)(float *s, size_t s_stride, const float *q, size_t q_stride, int nq, const float *k, size_t bstride,
                     int64_t nk, int64_t n);
    void (*axpy_rows)(float *y, size_t y_stride, const float *w, size_t w_stride, int nq, const float *v, size_t stride,
                      int64_t nk, int64_t n);
    void (*exp_shift)(double *y, const float *x, double shift, double div, int64_t n);
    void (*softmax)(float *w, int64_t n, float scale);
    // optional (NULL: from_float, then k_act_side): a Q8_0 row and its side data, for weights
    // of quant offset off, in a product of several rows or (one_row) of one
    void (*quant_side_q8_0)(const float *x, uint8_t *y, int64_t n, int off, uint8_t *side, bool one_row);
} k_vec_ops;

// ---- Dispatch --------------------------------------------------------------------------------
// One table per set, filled once: the reference table, with each set's kernels over it.

static k_traits k_set_tables[K_SET_COUNT][T_COUNT];
static k_vec_ops k_set_vec[K_SET_COUNT];
static k_set k_active_set;
static char k_active_note[160];
static pthread_once_t k_sets_once = PTHREAD_ONCE_INIT;

#if defined(PSV_X86)
static void k_fill_avx2(k_traits *t) {
    static const struct { uint32_t type; k_vec_dot_fn dot; k_vec_dot_rows_fn rows; } dots[] = {
        {T_Q4_0, k_dot_q4_0_q8_0_avx2, k_dot_rows_q4_0_q8_0_avx2}, {T_Q4_1, k_dot_q4_1_q8_1_avx2, k_dot_rows_q4_1_q8_1_avx2},
        {T_Q5_0, k_dot_q5_0_q8_0_avx2, k_dot_rows_q5_0_q8_0_avx2}, {T_Q5_1, k_dot_q5_1_q8_1_avx2, k_dot_rows_q5_1_q8_1_avx2},
        {T_Q8_0, k_dot_q8_0_q8_0_avx2, k_dot_rows_q8_0_q8_0_avx2}, {T_Q2_K, k_dot_q2_k_q8_k_avx2, k_dot_rows_q2_k_q8_k_avx2},
        {T_Q3_K, k_dot_q3_k_q8_k_avx2, k_dot_rows_q3_k_q8_k_avx2}, {T_Q4_K, k_dot_q4_k_q8_k_avx2, k_dot_rows_q4_k_q8_k_avx2},
        {T_Q5_K, k_dot_q5_k_q8_k_avx2, k_dot_rows_q5_k_q8_k_avx2}, {T_Q6_K, k_dot_q6_k_q8_k_avx2, k_dot_rows_q6_k_q8_k_avx2},
        {T_F32, k_dot_f32_f32_avx2, NULL},                         {T_F16, k_dot_f16_f16_avx2, NULL},
        {T_BF16, k_dot_bf16_bf16_avx2, NULL},
    };
    for (size_t i = 0; i < PSV_ARRAY_LEN(dots); i++) {
        t[dots[i].type].vec_dot = dots[i].dot;
        t[dots[i].type].vec_dot_rows = dots[i].rows;
    }
    static const struct { uint32_t type; k_gemm_fn gemm; k_pack_fn pack; } gemms[] = {
        {T_Q4_0, k_gemm_q4_0_avx2, k_pack_q4_0_avx2}, {T_Q4_1, k_gemm_q4_1_avx2, k_pack_q4_1_avx2},
        {T_Q5_0, k_gemm_q5_0_avx2, k_pack_q5_0_avx2}, {T_Q5_1, k_gemm_q5_1_avx2, k_pack_q5_1_avx2},
        {T_Q2_K, k_gemm_q2_k_avx2, k_pack_q2_k_avx2}, {T_Q3_K, k_gemm_q3_k_avx2, k_pack_q3_k_avx2},
        {T_Q4_K, k_gemm_q4_k_avx2, k_pack_q4_k_avx2}, {T_Q5_K, k_gemm_q5_k_avx2, k_pack_q5_k_avx2},
        {T_Q6_K, k_gemm_q6_k_avx2, k_pack_q6_k_avx2},
    };
    for (size_t i = 0; i < PSV_ARRAY_LEN(gemms); i++) {
        t[gemms[i].type].gemm = gemms[i].gemm;
        t[gemms[i].type].pack = gemms[i].pack;
        t[gemms[i].type].gemm_rows = K_GEMM_ROWS;
    }
    t[T_Q3_K].gemv = k_gemv_q3_k_avx2;
    t[T_Q6_K].gemv = k_gemv_q6_k_avx2;
    t[T_Q4_0].gemv1 = k_gemv1_q4_0_avx2;
    t[T_Q8_0].gemv1 = k_gemv1_q8_0_avx2;
    t[T_Q8_0].from_float = k_quant_q8_0_avx2;
    t[T_Q8_1].from_float = k_quant_q8_1_avx2;
    t[T_Q8_K].from_float = k_quant_q8_k_avx2;
    t[T_F16].from_float = k_quant_f16_avx2;
    t[T_BF16].from_float = k_quant_bf16_avx2;
}

static void k_fill_avx512(k_traits *t) {
    static const struct { uint32_t type; k_vec_dot_fn dot; k_vec_dot_rows_fn rows; } dots[] = {
        {T_Q4_0, k_dot_q4_0_q8_0_avx512, k_dot_rows_q4_0_q8_0_avx512}, {T_Q4_1, k_dot_q4_1_q8_1_avx512, k_dot_rows_q4_1_q8_1_avx512},
        {T_Q5_0, k_dot_q5_0_q8_0_avx512, k_dot_rows_q5_0_q8_0_avx512}, {T_Q5_1, k_dot_q5_1_q8_1_avx512, k_dot_rows_q5_1_q8_1_avx512},
        {T_Q8_0, k_dot_q8_0_q8_0_avx512, k_dot_rows_q8_0_q8_0_avx512}, {T_Q2_K, k_dot_q2_k_q8_k_avx512, k_dot_rows_q2_k_q8_k_avx512},
        {T_Q3_K, k_dot_q3_k_q8_k_avx512, k_dot_rows_q3_k_q8_k_avx512}, {T_Q4_K, k_dot_q4_k_q8_k_avx512, k_dot_rows_q4_k_q8_k_avx512},
        {T_Q5_K, k_dot_q5_k_q8_k_avx512, k_dot_rows_q5_k_q8_k_avx512}, {T_Q6_K, k_dot_q6_k_q8_k_avx512, k_dot_rows_q6_k_q8_k_avx512},
    };
    k_fill_avx2(t);
    for (size_t i = 0; i < PSV_ARRAY_LEN(dots); i++) {
        t[dots[i].type].vec_dot = dots[i].dot;
        t[dots[i].type].vec_dot_rows = dots[i].rows;
    }
    static const struct { uint32_t type; k_gemm_fn gemm; k_pack_fn pack; } gemms[] = {
        {T_Q4_0, k_gemm_q4_0_avx512, k_pack8_q4_0_avx2}, {T_Q4_1, k_gemm_q4_1_avx512, k_pack_q4_1_avx2},
        {T_Q5_0, k_gemm_q5_0_avx512, k_pack8_q5_0_avx2}, {T_Q5_1, k_gemm_q5_1_avx512, k_pack8_q5_1_avx2},
        {T_Q8_0, k_gemm_q8_0_avx512, k_pack8_q8_0_avx2}, {T_Q2_K, k_gemm_q2_k_avx512, k_pack8_q2_k_avx2},
        {T_Q3_K, k_gemm_q3_k_avx512, k_pack8_q3_k_avx2}, {T_Q4_K, k_gemm_q4_k_avx512, k_pack8_q4_k_avx2},
        {T_Q5_K, k_gemm_q5_k_avx512, k_pack8_q5_k_avx2}, {T_Q6_K, k_gemm_q6_k_avx512, k_pack8_q6_k_avx2},
    };
    for (size_t i = 0; i < PSV_ARRAY_LEN(gemms); i++) {
        t[gemms[i].type].gemm = gemms[i].gemm;
        t[gemms[i].type].pack = gemms[i].pack;
        t[gemms[i].type].gemm_rows = K_GEMM_ROWS_AVX512;
    }
    t[T_Q3_K].gemv = k_gemv_q3_k_avx512;
    t[T_Q6_K].gemv = k_gemv_q6_k_avx512;
    t[T_Q4_0].gemv = k_gemv_q4_0_avx512;
    t[T_Q5_0].gemv = k_gemv_q5_0_avx512;
    t[T_Q8_0].gemv = k_gemv_q8_0_avx512;
    t[T_Q4_0].gemv1 = k_gemv1_q4_0_avx512;
    t[T_Q5_0].gemv1 = k_gemv1_q5_0_avx512;
    t[T_Q8_0].gemv1 = k_gemv1_q8_0_avx512;
    t[T_Q4_K].gemv1 = k_gemv1_q4_k_avx512;
    t[T_Q6_K].gemv1 = k_gemv1_q6_k_avx512;
}
#endif

static void k_sets_init(void) {
    for (int s = 0; s < K_SET_COUNT; s++) {
        memcpy(k_set_tables[s], k_traits_ref_table, sizeof k_traits_ref_table);
        k_set_vec[s] = (k_vec_ops){k_expf_ref, k_swiglu_ref, k_dot_keys_ref, k_axpy_rows_ref, k_exp_shift_ref, k_softmax_ref, NULL};
    }
#if defined(PSV_X86)
    k_fill_avx2(k_set_tables[K_SET_AVX2]);
    k_fill_avx512(k_set_tables[K_SET_AVX512]);
    k_set_vec[K_SET_AVX2] = (k_vec_ops){k_expf_avx2, k_swiglu_avx2, k_dot_keys_avx2, k_axpy_rows_avx2, k_exp_shift_avx2,
                                        k_softmax_avx2, NULL};
    k_set_vec[K_SET_AVX512] = (k_vec_ops){k_expf_avx2, k_swiglu_avx2, k_dot_keys_avx512, k_axpy_rows_avx512, k_exp_shift_avx2,
                                          k_softmax_avx2, k_quant_side_q8_0_avx512};
#endif
#if defined(PSV_ARM64)
    k_fill_neon(k_set_tables[K_SET_NEON], false, false);
    k_fill_neon(k_set_tables[K_SET_DOTPROD], true, false);
    k_fill_neon(k_set_tables[K_SET_I8MM], true, true);
    for (int s = K_SET_NEON; s <= K_SET_I8MM; s++) {
        k_set_vec[s].dot_keys = k_dot_keys_neon;
        k_set_vec[s].axpy_rows = k_axpy_rows_neon;
        k_set_vec[s].expf = k_expf_neon;
        k_set_vec[s].swiglu = k_swiglu_neon;
        k_set_vec[s].softmax = k_softmax_neon;
        k_set_vec[s].exp_shift = k_exp_shift_neon;
    }
#endif
    k_active_set = k_set_choose(getenv("PSV_KERNELS"), plat_cpu_get(), k_active_note, sizeof k_active_note);
}

// The kernels of one set, whether or not this CPU can run it (tests and benchmarks check
// k_set_supported first); NULL when the type has none.
static const k_traits *k_traits_of_set(k_set s, uint32_t type) {
    pthread_once(&k_sets_once, k_sets_init);
    if ((unsigned)s >= K_SET_COUNT || type >= T_COUNT || !k_set_tables[s][type].to_float) return NULL;
    return &k_set_tables[s][type];
}

// The kernels the engine uses: the best set this CPU supports, or the one PSV_KERNELS names
// (read once, at the first call). Thread-safe; the tables are immutable after that first call.
PSV_MAYBE_UNUSED static const k_traits *k_traits_get(uint32_t type) {
    pthread_once(&k_sets_once, k_sets_init);
    return k_traits_of_set(k_active_set, type);
}

// The element-wise kernels of a set (k_vec_of_set: any set, for tests) or of the set in use.
PSV_MAYBE_UNUSED static const k_vec_ops *k_vec_of_set(k_set s) {
    pthread_once(&k_sets_once, k_sets_init);
    return (unsigned)s < K_SET_COUNT ? &k_set_vec[s] : NULL;
}
PSV_MAYBE_UNUSED static const k_vec_ops *k_vec_get(void) {
    pthread_once(&k_sets_once, k_sets_init);
    return &k_set_vec[k_active_set];
}

// Name of the set k_traits_get uses ("ref", "avx2", "avx512", "neon", "dotprod" or "i8mm").
PSV_MAYBE_UNUSED static const char *k_kernel_set_name(void) {
    pthread_once(&k_sets_once, k_sets_init);
    return k_set_names[k_active_set];
}

// Why PSV_KERNELS was not honoured (one line, for the CLI to print as a warning), or NULL.
PSV_MAYBE_UNUSED static const char *k_kernel_set_note(void) {
    pthread_once(&k_sets_once, k_sets_init);
    return k_active_note[0] ? k_active_note : NULL;
}

// s[r*s_stride] = x . (y + r*y_stride) for r < nr (any nr >= 0): the set's multi-row kernel in
// groups of up to K_ROWS_MAX rows, or vec_dot per row when it has none. Bit-identical to vec_dot.
PSV_MAYBE_UNUSED static inline void k_dot_rows(const k_traits *tr, int64_t n, float *s, int64_t s_stride, const void *x,
                              const void *y, size_t y_stride, int64_t nr) {
    const uint8_t *yb = y;
    int64_t r = 0;
    if (tr->vec_dot_rows)
        for (; r < nr; r += K_ROWS_MAX) {
            int k = nr - r < K_ROWS_MAX ? (int)(nr - r) : K_ROWS_MAX;
            tr->vec_dot_rows(n, s + r * s_stride, s_stride, x, yb + (size_t)r * y_stride, y_stride, k);
        }
    for (; r < nr; r++) tr->vec_dot(n, s + r * s_stride, x, yb + (size_t)r * y_stride);
}

// NULL, or a warning that this build is unoptimised (see the top of the file).
PSV_MAYBE_UNUSED static const char *psv_build_note(void) {
    return PSV_BUILD_OPTIMISED ? NULL
                               : "warning: this build is not optimised (compiled without -O2: clang without flags), so "
                                 "everything runs 15-25x slower; rebuild with: cc -O2 pensieve.c -o pensieve -lpthread";
}

// `pensieve info --cpu`: the features detected, the kernel set in use and whether the build is
// optimised (stdout); the reason a PSV_KERNELS request was not honoured, and an unoptimised
// build's warning, go to stderr. Returns the exit status.
PSV_MAYBE_UNUSED static int cli_cpu(void) {
    const plat_cpu *c = plat_cpu_get();
    printf("cpu features:");
    const struct { const char *name; bool on; } f[] = {
        {"sse3", c->sse3},         {"ssse3", c->ssse3},     {"avx", c->avx},
        {"avx2", c->avx2},         {"fma", c->fma},         {"f16c", c->f16c},
        {"avx512f", c->avx512f},   {"avx512bw", c->avx512bw}, {"avx512vl", c->avx512vl},
        {"avx512vnni", c->avx512vnni}, {"avx512bf16", c->avx512bf16}, {"avxvnni", c->avxvnni},
        {"sha_ni", c->sha_ni},     {"neon", c->neon},       {"dotprod", c->dotprod},
        {"i8mm", c->i8mm},         {"fp16", c->fp16},       {"sha2", c->arm_sha2},
    };
    int shown = 0;
    for (size_t i = 0; i < PSV_ARRAY_LEN(f); i++)
        if (f[i].on) printf(" %s", f[i].name), shown++;
    printf("%s\n", shown ? "" : " (none)");
    printf("kernel sets supported:");
    for (int s = 0; s < K_SET_COUNT; s++)
        if (k_set_supported((k_set)s, c)) printf(" %s", k_set_names[s]);
    printf("\nkernel set: %s\n", k_kernel_set_name());
    printf("build: %s\n", PSV_BUILD_OPTIMISED ? "optimised" : "not optimised");
    const char *note = k_kernel_set_note();
    if (note) fprintf(stderr, "pensieve: warning: %s\n", note);
    if (psv_build_note()) fprintf(stderr, "pensieve: %s\n", psv_build_note());
    return 0;
}


// ----------------------------------------------------------------------------
// 13. Thread pool
// A persistent set of pthread workers. pool_run(fn) runs fn(arg, ith, nth) on every thread (the
// caller is thread 0) and returns when all are done; no thread is created per operation. One
// pool_run at a time per pool: the model serialises forward passes.
//
// A forward pass makes a dozen pool_runs per layer, each a few tens of microseconds of work, so
// the hand-off must cost far less than a condition-variable wake-up (tens of microseconds on
// Linux). Workers and the caller therefore spin on atomics for a while (PSV_POOL_SPIN_US
// microseconds) before they sleep on a condition variable; a busy
// machine thus degrades to the sleeping pool rather than to threads burning each other's
// time slices. The sleep/wake hand-off is Dekker-style on sequentially consistent atomics: a
// sleeper announces itself (n_sleep) and then re-checks the condition, a waker changes the
// condition and then checks for sleepers, so one of the two always sees the other.

#ifndef PSV_POOL_SPIN_US // microseconds a thread spins before it sleeps
#define PSV_POOL_SPIN_US 200
#endif

typedef void (*pool_fn)(void *arg, int ith, int nth);

typedef struct pool_worker pool_worker;
typedef struct {
    int n_threads;
    pool_worker *workers; // n_threads - 1 entries
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    _Atomic uint64_t generation; // bumped once per pool_run; workers wait for a change
    _Atomic int pending;         // workers still running the current job
    _Atomic int n_sleep;         // workers asleep on cv_work
    _Atomic int caller_sleeps;   // the caller is asleep on cv_done
    _Atomic bool quit;
    pool_fn fn; // published by the release of generation
    void *arg;
} pool_t;

struct pool_worker {
    pool_t *pool;
    pthread_t thread;
    int ith;
};

static inline void pool_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

// Spins until *v != old or PSV_POOL_SPIN_US pass; returns the last value read. The clock is read
// every 64 pauses (a pause lasts from a few to ~50 ns depending on the CPU).
static uint64_t pool_spin_while_u64(_Atomic uint64_t *v, uint64_t old) {
    uint64_t x = atomic_load(v);
    double until = 0;
    for (int i = 1; x == old; i++) {
        pool_pause();
        x = atomic_load(v);
        if ((i & 63) == 0) {
            double now = plat_now();
            if (until == 0) until = now + PSV_POOL_SPIN_US * 1e-6;
            else if (now > until) break;
        }
    }
    return x;
}

static void pool_spin_while_pending(_Atomic int *v) {
    double until = 0;
    for (int i = 1; atomic_load(v) > 0; i++) {
        pool_pause();
        if ((i & 63) == 0) {
            double now = plat_now();
            if (until == 0) until = now + PSV_POOL_SPIN_US * 1e-6;
            else if (now > until) break;
        }
    }
}

static void *pool_worker_main(void *p) {
    pool_worker *w = p;
    pool_t *pl = w->pool;
    uint64_t seen = 0;
    for (;;) {
        uint64_t g = pool_spin_while_u64(&pl->generation, seen);
        if (g == seen) {
            pthread_mutex_lock(&pl->mu);
            atomic_fetch_add(&pl->n_sleep, 1);
            while (!atomic_load(&pl->quit) && (g = atomic_load(&pl->generation)) == seen) pthread_cond_wait(&pl->cv_work, &pl->mu);
            atomic_fetch_sub(&pl->n_sleep, 1);
            pthread_mutex_unlock(&pl->mu);
        }
        if (atomic_load(&pl->quit)) return NULL;
        seen = g;
        pl->fn(pl->arg, w->ith, pl->n_threads);
        if (atomic_fetch_sub(&pl->pending, 1) == 1 && atomic_load(&pl->caller_sleeps)) {
            pthread_mutex_lock(&pl->mu);
            pthread_cond_signal(&pl->cv_done);
            pthread_mutex_unlock(&pl->mu);
        }
    }
}

static void pool_free(pool_t *pl) {
    if (!pl) return;
    pthread_mutex_lock(&pl->mu);
    atomic_store(&pl->quit, true);
    pthread_cond_broadcast(&pl->cv_work);
    pthread_mutex_unlock(&pl->mu);
    for (int i = 0; i < pl->n_threads - 1; i++)
        if (pl->workers[i].pool) pthread_join(pl->workers[i].thread, NULL);
    pthread_cond_destroy(&pl->cv_work);
    pthread_cond_destroy(&pl->cv_done);
    pthread_mutex_destroy(&pl->mu);
    free(pl->workers);
    free(pl);
}

static psv_status pool_new(int n_threads, pool_t **out, psv_error *err) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024)
        return err_set(err, PSV_ERR_INVALID, "pool: thread count %d out of range (1..1024)", n_threads);
    pool_t *pl = calloc(1, sizeof *pl);
    if (!pl) return err_set(err, PSV_ERR_NOMEM, "pool: out of memory");
    pl->n_threads = n_threads;
    pthread_mutex_init(&pl->mu, NULL);
    pthread_cond_init(&pl->cv_work, NULL);
    pthread_cond_init(&pl->cv_done, NULL);
    pl->workers = calloc((size_t)n_threads, sizeof *pl->workers);
    if (!pl->workers) {
        pool_free(pl);
        return err_set(err, PSV_ERR_NOMEM, "pool: out of memory");
    }
    for (int i = 0; i < n_threads - 1; i++) {
        pool_worker *w = &pl->workers[i];
        w->ith = i + 1;
        w->pool = pl;
        if (pthread_create(&w->thread, NULL, pool_worker_main, w) != 0) {
            w->pool = NULL;
            pool_free(pl);
            return err_set(err, PSV_ERR_IO, "pool: cannot create thread %d of %d", i + 2, n_threads);
        }
    }
    *out = pl;
    return PSV_OK;
}

static void pool_run(pool_t *pl, pool_fn fn, void *arg) {
    if (pl->n_threads == 1) {
        fn(arg, 0, 1);
        return;
    }
    pl->fn = fn;
    pl->arg = arg;
    atomic_store(&pl->pending, pl->n_threads - 1);
    atomic_fetch_add(&pl->generation, 1);
    if (atomic_load(&pl->n_sleep) > 0) {
        pthread_mutex_lock(&pl->mu);
        pthread_cond_broadcast(&pl->cv_work);
        pthread_mutex_unlock(&pl->mu);
    }
    fn(arg, 0, pl->n_threads);
    pool_spin_while_pending(&pl->pending);
    if (atomic_load(&pl->pending) > 0) {
        pthread_mutex_lock(&pl->mu);
        atomic_store(&pl->caller_sleeps, 1);
        while (atomic_load(&pl->pending) > 0) pthread_cond_wait(&pl->cv_done, &pl->mu);
        atomic_store(&pl->caller_sleeps, 0);
        pthread_mutex_unlock(&pl->mu);
    }
}

// The half-open share [*lo, *hi) of n items for thread ith of nth, contiguous and balanced.
static inline void pool_share(int64_t n, int ith, int nth, int64_t *lo, int64_t *hi) {
    *lo = n * ith / nth;
    *hi = n * (ith + 1) / nth;
}

// The next chunk [*lo, *hi) of n items for the calling thread, from the job's counter *next
// (zero when the pool_run starts); false when none are left. Threads take chunks as they come
// free, per_thread of them per thread on average, so that a thread that runs slower (a busy
// core, a virtual CPU its host holds back, an efficiency core) or draws costlier items does
// less of the work instead of making the others wait for it.
static bool pool_next_chunk(_Atomic int64_t *next, int64_t n, int nth, int per_thread, int64_t *lo, int64_t *hi) {
    const int64_t per = PSV_MAX((int64_t)1, n / ((int64_t)nth * per_thread));
    int64_t c = atomic_fetch_add_explicit(next, 1, memory_order_relaxed);
    if (c >= (n + per - 1) / per) return false;
    *lo = c * per;
    *hi = PSV_MIN(n, *lo + per);
    return true;
}

// Guided: the next [lo, hi) of n units, a share of what is left (at least one unit), so that
// chunks shrink toward the end and threads finish together. *next counts units taken.
static bool pool_next_guided(_Atomic int64_t *next, int64_t n, int nth, int64_t *lo, int64_t *hi) {
    int64_t c = atomic_load_explicit(next, memory_order_relaxed);
    for (;;) {
        if (c >= n) return false;
        const int64_t size = PSV_MAX((int64_t)1, (n - c) / (2 * (int64_t)nth));
        if (atomic_compare_exchange_weak_explicit(next, &c, c + size, memory_order_relaxed, memory_order_relaxed)) {
            *lo = c;
            *hi = c + size;
            return true;
        }
    }
}

// ----------------------------------------------------------------------------
// 14. Model
// Loads hyper-parameters and weights from a GGUF file (weights stay in the mapping, used in
// place; only small 1-D vectors are copied out as floats) and runs the transformer forward pass.
// Architectures: llama, phi3, qwen2, qwen3, phi2. The pass follows the GGUF ecosystem's
// definitions: weight rows are output features (ne[0] = input length), activations are
// quantized to each weight type's dot-product type before a matrix product, and rotary
// embeddings use the "normal" (adjacent pairs) layout for llama and the "neox" (half-split)
// layout for the others.

typedef enum { ARCH_LLAMA, ARCH_PHI3, ARCH_QWEN2, ARCH_QWEN3, ARCH_PHI2 } model_arch;

static const char *const model_arch_names[] = {"llama", "phi3", "qwen2", "qwen3", "phi2"};

// A weight matrix in the mapping: n_out rows of n_in values of `type`.
typedef struct {
    const uint8_t *data;
    uint32_t type;
    int64_t n_in, n_out;
    size_t row_size;
    const char *name; // for messages; points into the gguf tensor table
} mtensor;

// Owned float copies of small vectors, all freed with the model.
typedef struct {
    float **ptrs;
    size_t n, cap;
} vec_list;

typedef struct {
    float *attn_norm, *attn_norm_b; // (n_embd)
    mtensor wq, wk, wv;             // (n_embd -> n_head*hd), (n_embd -> n_head_kv*hd) x2
    mtensor wqkv;                   // fused (n_embd -> (n_head + 2 n_head_kv) hd), phi3/phi2
    float *bq, *bk, *bv, *bqkv;     // biases (qwen2; phi2 fused)
    float *q_norm, *k_norm;         // (hd), qwen3 per-head RMS norm
    mtensor wo;                     // (n_head*hd -> n_embd)
    float *bo;                      // (n_embd), phi2
    float *ffn_norm;                // (n_embd); absent for phi2 (parallel block)
    mtensor w_gate, w_up;           // (n_embd -> n_ff); phi3 fuses both into w_up (n_embd -> 2 n_ff)
    mtensor w_down;                 // (n_ff -> n_embd)
    float *b_up, *b_down;           // phi2
} layer_w;

struct psv_model {
    gguf_file *gguf;
    model_arch arch;
    // hyper-parameters
    int64_t n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_rot, n_ff, n_ctx_train;
    int64_t n_ctx_orig; // rope.scaling.original_context_length (0: none)
    float rope_base, rope_freq_scale, rope_attn_factor, norm_eps;
    bool rope_neox, layer_norm, fused_qkv, fused_gate_up, gelu, parallel;
    // weights
    mtensor tok_embd, output;
    float *out_norm, *out_norm_b, *out_b;
    float *rope_long, *rope_short; // (n_rot/2) frequency divisors, phi3 LongRoPE
    layer_w *layers;
    size_t weight_bytes;
    pool_t *pool;
    pthread_mutex_t lock; // one forward pass at a time (the pool is shared)
    vec_list vecs;        // owned copies of the 1-D weights
    tok_vocab *vocab;     // tokenizer (section 9), NULL when the file has none
    chat_format chat_format;
    const char *chat_warning; // static text when the template was not recognised
    plat_prefault prefault;   // maps the weights in while the model loads and its first prompt runs
};

static psv_status model_vocab_load(psv_model *m, psv_error *err);
static void model_vocab_free(psv_model *m);

// The kernels for a tensor type: the fastest set this CPU supports (section 12), or the one
// PSV_KERNELS names. Every set gives bit-identical results to the reference kernels.
static const k_traits *eng_traits(uint32_t type) { return k_traits_get(type); }

static psv_status model_tensor(psv_model *m, const char *name, int64_t n_in, int64_t n_out,
                               bool required, mtensor *out, psv_error *err) {
    memset(out, 0, sizeof *out);
    const gguf_tensor *t = gguf_find_tensor(m->gguf, name);
    if (!t) {
        if (!required) return PSV_OK;
        return err_set(err, PSV_ERR_FORMAT, "model: missing tensor '%s'", name);
    }
    uint64_t ne1 = t->n_dims >= 2 ? t->ne[1] : 1;
    bool higher = (t->n_dims >= 3 && t->ne[2] != 1) || (t->n_dims >= 4 && t->ne[3] != 1);
    if (t->ne[0] != (uint64_t)n_in || ne1 != (uint64_t)n_out || higher)
        return err_set(err, PSV_ERR_FORMAT,
                       "model: tensor '%s': wrong shape (expected [%" PRId64 ", %" PRId64
                       "], got [%" PRIu64 ", %" PRIu64 "%s])",
                       name, n_in, n_out, t->ne[0], ne1, higher ? ", ..." : "");
    const type_info *ti = type_get(t->type);
    if (!ti || !ti->supported || !eng_traits(t->type))
        return err_set(err, PSV_ERR_UNSUPPORTED,
                       "model: tensor '%s': type %s is not supported (supported: F32, F16, BF16, "
                       "Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)",
                       name, ti ? ti->name : "unknown");
    uint64_t rs;
    if (!type_row_size(t->type, t->ne[0], &rs))
        return err_set(err, PSV_ERR_FORMAT, "model: tensor '%s': bad row length", name);
    out->data = t->data;
    out->type = t->type;
    out->n_in = n_in;
    out->n_out = n_out;
    out->row_size = (size_t)rs;
    out->name = name;
    m->weight_bytes += (size_t)t->size;
    return PSV_OK;
}

// A 1-D vector of n values (any supported type) copied out as floats.
static psv_status model_vector(psv_model *m, vec_list *vl, const char *name, int64_t n, bool required,
                               float **out, psv_error *err) {
    *out = NULL;
    mtensor t;
    psv_status st = model_tensor(m, name, n, 1, required, &t, err);
    if (st != PSV_OK || !t.data) return st;
    float *v = malloc((size_t)n * sizeof(float));
    if (!v) return err_set(err, PSV_ERR_NOMEM, "model: out of memory for '%s'", name);
    if (vl->n == vl->cap) {
        size_t cap = vl->cap ? vl->cap * 2 : 64;
        float **p = realloc(vl->ptrs, cap * sizeof *p);
        if (!p) {
            free(v);
            return err_set(err, PSV_ERR_NOMEM, "model: out of memory");
        }
        vl->ptrs = p;
        vl->cap = cap;
    }
    vl->ptrs[vl->n++] = v;
    eng_traits(t.type)->to_float(t.data, v, n);
    for (int64_t i = 0; i < n; i++)
        if (!psv_isfinite(v[i]))
            return err_set(err, PSV_ERR_FORMAT, "model: tensor '%s': value %" PRId64 " is not finite", name, i);
    *out = v;
    return PSV_OK;
}

// Hyper-parameter lookups with the `{arch}.` prefix.
static bool model_key_u32(const psv_model *m, const char *suffix, uint32_t *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", model_arch_names[m->arch], suffix);
    return gguf_get_u32(m->gguf, key, out);
}
static bool model_key_f32(const psv_model *m, const char *suffix, float *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", model_arch_names[m->arch], suffix);
    return gguf_get_f32(m->gguf, key, out);
}

static psv_status model_hparams(psv_model *m, psv_error *err) {
    str_t arch;
    if (!gguf_get_str(m->gguf, "general.architecture", &arch))
        return err_set(err, PSV_ERR_FORMAT, "model: missing key 'general.architecture'");
    bool found = false;
    for (size_t i = 0; i < PSV_ARRAY_LEN(model_arch_names); i++)
        if (str_eq_c(arch, model_arch_names[i])) {
            m->arch = (model_arch)i;
            found = true;
        }
    if (!found)
        return err_set(err, PSV_ERR_UNSUPPORTED,
                       "model: architecture '%.*s' is not supported (supported: llama, phi3, qwen2, "
                       "qwen3, phi2)",
                       (int)PSV_MIN(arch.n, 64), arch.p);
    const char *a = model_arch_names[m->arch];
    uint32_t u;
#define REQ_U32(suffix, field, lo, hi)                                                            \
    do {                                                                                          \
        if (!model_key_u32(m, suffix, &u))                                                        \
            return err_set(err, PSV_ERR_FORMAT, "model: missing or invalid key '%s.%s'", a, suffix); \
        if (u < (lo) || u > (hi))                                                                 \
            return err_set(err, PSV_ERR_FORMAT, "model: key '%s.%s': %u out of range (%u..%u)", a, \
                           suffix, u, (unsigned)(lo), (unsigned)(hi));                            \
        field = u;                                                                                \
    } while (0)
    REQ_U32("embedding_length", m->n_embd, 1, 1u << 20);
    REQ_U32("block_count", m->n_layer, 1, 4096);
    REQ_U32("attention.head_count", m->n_head, 1, 4096);
    REQ_U32("feed_forward_length", m->n_ff, 1, 1u << 22);
#undef REQ_U32
    m->n_head_kv = m->n_head;
    if (model_key_u32(m, "attention.head_count_kv", &u)) m->n_head_kv = u;
    if (m->n_head_kv < 1 || m->n_head % m->n_head_kv)
        return err_set(err, PSV_ERR_FORMAT,
                       "model: head_count %" PRId64 " is not a multiple of head_count_kv %" PRId64,
                       m->n_head, m->n_head_kv);
    m->head_dim = m->n_embd / m->n_head;
    if (model_key_u32(m, "attention.key_length", &u)) m->head_dim = u;
    uint32_t vlen;
    if (model_key_u32(m, "attention.value_length", &vlen) && vlen != m->head_dim)
        return err_set(err, PSV_ERR_UNSUPPORTED, "model: value_length %u differs from key_length %" PRId64, vlen, m->head_dim);
    if (m->head_dim < 2 || m->head_dim > 1024 || m->head_dim % 2)
        return err_set(err, PSV_ERR_FORMAT, "model: head dimension %" PRId64 " out of range (even, 2..1024)", m->head_dim);
    m->n_rot = m->head_dim;
    if (model_key_u32(m, "rope.dimension_count", &u)) m->n_rot = u;
    if (m->n_rot < 2 || m->n_rot > m->head_dim || m->n_rot % 2)
        return err_set(err, PSV_ERR_FORMAT, "model: rope.dimension_count %" PRId64 " invalid for head dimension %" PRId64, m->n_rot, m->head_dim);
    m->n_ctx_train = 2048;
    if (model_key_u32(m, "context_length", &u) && u > 0) m->n_ctx_train = u;
    m->rope_base = 10000.0f;
    model_key_f32(m, "rope.freq_base", &m->rope_base);
    if (!(m->rope_base > 1.0f) || !psv_isfinite(m->rope_base))
        return err_set(err, PSV_ERR_FORMAT, "model: rope.freq_base %g out of range", (double)m->rope_base);
    float f;
    m->rope_freq_scale = 1.0f;
    if ((model_key_f32(m, "rope.scaling.factor", &f) || model_key_f32(m, "rope.scale_linear", &f)) && f != 0.0f) {
        if (!(f > 0.0f) || !psv_isfinite(f))
            return err_set(err, PSV_ERR_FORMAT, "model: rope scaling factor %g out of range", (double)f);
        m->rope_freq_scale = 1.0f / f;
    }
    str_t stype;
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    if (gguf_get_str(m->gguf, key, &stype) && !str_eq_c(stype, "none") && !str_eq_c(stype, "linear"))
        return err_set(err, PSV_ERR_UNSUPPORTED, "model: rope scaling type '%.*s' is not supported (supported: none, linear)",
                       (int)PSV_MIN(stype.n, 32), stype.p);
    if (gguf_get_str(m->gguf, key, &stype) && str_eq_c(stype, "none")) m->rope_freq_scale = 1.0f;
    m->rope_attn_factor = 1.0f;
    model_key_f32(m, "rope.scaling.attn_factor", &m->rope_attn_factor);
    if (!(m->rope_attn_factor > 0.0f) || !psv_isfinite(m->rope_attn_factor))
        return err_set(err, PSV_ERR_FORMAT, "model: rope.scaling.attn_factor %g out of range", (double)m->rope_attn_factor);
    m->n_ctx_orig = 0;
    if (model_key_u32(m, "rope.scaling.original_context_length", &u)) m->n_ctx_orig = u;
    m->layer_norm = m->arch == ARCH_PHI2;
    m->norm_eps = 1e-5f;
    if (!model_key_f32(m, m->layer_norm ? "attention.layer_norm_epsilon" : "attention.layer_norm_rms_epsilon", &m->norm_eps))
        m->norm_eps = m->layer_norm ? 1e-5f : 1e-6f;
    if (!(m->norm_eps > 0.0f) || !(m->norm_eps < 1.0f))
        return err_set(err, PSV_ERR_FORMAT, "model: norm epsilon %g out of range", (double)m->norm_eps);
    m->rope_neox = m->arch != ARCH_LLAMA;
    m->gelu = m->parallel = m->arch == ARCH_PHI2;
    return PSV_OK;
}

static psv_status model_weights(psv_model *m, vec_list *vl, psv_error *err) {
    const int64_t E = m->n_embd, hd = m->head_dim, nq = m->n_head * hd, nkv = m->n_head_kv * hd, F = m->n_ff;
    psv_status st;
    const gguf_tensor *te = gguf_find_tensor(m->gguf, "token_embd.weight");
    if (!te) return err_set(err, PSV_ERR_FORMAT, "model: missing tensor 'token_embd.weight'");
    if (te->n_dims < 2 || te->ne[1] < 1 || te->ne[1] > (1u << 24))
        return err_set(err, PSV_ERR_FORMAT, "model: tensor 'token_embd.weight': bad vocabulary dimension");
    m->n_vocab = (int64_t)te->ne[1];
    if ((st = model_tensor(m, "token_embd.weight", E, m->n_vocab, true, &m->tok_embd, err))) return st;
    if ((st = model_vector(m, vl, "output_norm.weight", E, true, &m->out_norm, err))) return st;
    if ((st = model_vector(m, vl, "output_norm.bias", E, m->layer_norm, &m->out_norm_b, err))) return st;
    if ((st = model_tensor(m, "output.weight", E, m->n_vocab, false, &m->output, err))) return st;
    if (!m->output.data) m->output = m->tok_embd; // tied embeddings
    if ((st = model_vector(m, vl, "output.bias", m->n_vocab, false, &m->out_b, err))) return st;
    if (m->arch == ARCH_PHI3) {
        if ((st = model_vector(m, vl, "rope_factors_long.weight", m->n_rot / 2, false, &m->rope_long, err))) return st;
        if ((st = model_vector(m, vl, "rope_factors_short.weight", m->n_rot / 2, false, &m->rope_short, err))) return st;
    }
    m->layers = calloc((size_t)m->n_layer, sizeof *m->layers);
    if (!m->layers) return err_set(err, PSV_ERR_NOMEM, "model: out of memory");
    char nm[96];
    // Tensor names are formatted into nm; mtensor.name must outlive it, so use the gguf copy.
#define NAME(fmt) (snprintf(nm, sizeof nm, "blk.%d." fmt, (int)il), nm)
#define TENSOR(fmt, in, out, req, dst)                                                \
    do {                                                                              \
        if ((st = model_tensor(m, NAME(fmt), in, out, req, dst, err))) return st;      \
        if ((dst)->data) (dst)->name = gguf_find_tensor(m->gguf, nm)->name.p;          \
    } while (0)
#define VECTOR(fmt, n, req, dst)                                                      \
    do {                                                                              \
        if ((st = model_vector(m, vl, NAME(fmt), n, req, dst, err))) return st;        \
    } while (0)
    for (int64_t il = 0; il < m->n_layer; il++) {
        layer_w *L = &m->layers[il];
        VECTOR("attn_norm.weight", E, true, &L->attn_norm);
        VECTOR("attn_norm.bias", E, m->layer_norm, &L->attn_norm_b);
        m->fused_qkv = gguf_find_tensor(m->gguf, NAME("attn_qkv.weight")) != NULL;
        if (m->fused_qkv) {
            TENSOR("attn_qkv.weight", E, nq + 2 * nkv, true, &L->wqkv);
            VECTOR("attn_qkv.bias", nq + 2 * nkv, false, &L->bqkv);
        } else {
            TENSOR("attn_q.weight", E, nq, true, &L->wq);
            TENSOR("attn_k.weight", E, nkv, true, &L->wk);
            TENSOR("attn_v.weight", E, nkv, true, &L->wv);
            VECTOR("attn_q.bias", nq, m->arch == ARCH_QWEN2, &L->bq);
            VECTOR("attn_k.bias", nkv, m->arch == ARCH_QWEN2, &L->bk);
            VECTOR("attn_v.bias", nkv, m->arch == ARCH_QWEN2, &L->bv);
        }
        if (m->arch == ARCH_QWEN3) {
            VECTOR("attn_q_norm.weight", hd, true, &L->q_norm);
            VECTOR("attn_k_norm.weight", hd, true, &L->k_norm);
        }
        TENSOR("attn_output.weight", nq, E, true, &L->wo);
        VECTOR("attn_output.bias", E, false, &L->bo);
        if (!m->parallel) VECTOR("ffn_norm.weight", E, true, &L->ffn_norm);
        m->fused_gate_up = m->arch == ARCH_PHI3;
        if (m->gelu) {
            TENSOR("ffn_up.weight", E, F, true, &L->w_up);
            VECTOR("ffn_up.bias", F, false, &L->b_up);
        } else if (m->fused_gate_up) {
            TENSOR("ffn_up.weight", E, 2 * F, true, &L->w_up);
        } else {
            TENSOR("ffn_gate.weight", E, F, true, &L->w_gate);
            TENSOR("ffn_up.weight", E, F, true, &L->w_up);
        }
        TENSOR("ffn_down.weight", F, E, true, &L->w_down);
        VECTOR("ffn_down.bias", E, false, &L->b_down);
    }
#undef NAME
#undef TENSOR
#undef VECTOR
    return PSV_OK;
}

// The KV cache of one sequence, in F32 or F16: for each layer, the keys of n_ctx positions in
// blocks of K_KEY_BLOCK positions, each block value by value (kv_dim values of K_KEY_BLOCK keys:
// the attention kernels' layout, see k_dot_keys_ref), and n_ctx rows of kv_dim values.
typedef struct {
    psv_kv_type type;
    int64_t n_ctx, kv_dim, n_layer;
    int64_t k_ctx; // n_ctx rounded up to whole blocks of keys
    void *k;       // (n_layer, k_ctx / K_KEY_BLOCK, kv_dim, K_KEY_BLOCK)
    void *v;       // (n_layer, n_ctx, kv_dim)
    int64_t n_past;
} kv_seq;

static size_t kv_elem_size(psv_kv_type t) { return t == PSV_KV_F16 ? 2 : 4; }

static void kv_free(kv_seq *kv) {
    if (!kv) return;
    free(kv->k);
    free(kv->v);
    memset(kv, 0, sizeof *kv);
}

static psv_status kv_init(kv_seq *kv, const psv_model *m, int64_t n_ctx, psv_kv_type type, psv_error *err) {
    memset(kv, 0, sizeof *kv);
    kv->type = type;
    kv->n_ctx = n_ctx;
    kv->kv_dim = m->n_head_kv * m->head_dim;
    kv->n_layer = m->n_layer;
    kv->k_ctx = (n_ctx + K_KEY_BLOCK - 1) / K_KEY_BLOCK * K_KEY_BLOCK;
    size_t n, nk;
    if (n_ctx > INT64_MAX - K_KEY_BLOCK || !ck_mul((size_t)m->n_layer, (size_t)n_ctx, &n) ||
        !ck_mul(n, (size_t)kv->kv_dim, &n) || !ck_mul(n, kv_elem_size(type), &n) ||
        !ck_mul((size_t)m->n_layer, (size_t)kv->k_ctx, &nk) || !ck_mul(nk, (size_t)kv->kv_dim, &nk) ||
        !ck_mul(nk, kv_elem_size(type), &nk))
        return err_set(err, PSV_ERR_RANGE, "kv: cache size overflows");
    kv->k = calloc(nk, 1); // (a block's unwritten positions are read, never used: zero, not garbage)
    kv->v = malloc(n);
    if (!kv->k || !kv->v) {
        kv_free(kv);
        return err_set(err, PSV_ERR_NOMEM, "kv: out of memory for a %zu-byte cache (n_ctx %" PRId64 ")", nk + n, n_ctx);
    }
    return PSV_OK;
}

// Key block of position pos of layer il, and value i of that key within it (F32 or F16 elements).
static inline size_t kv_k_block(const kv_seq *kv, int64_t il, int64_t pos) {
    return ((size_t)il * (size_t)(kv->k_ctx / K_KEY_BLOCK) + (size_t)(pos / K_KEY_BLOCK)) * (size_t)kv->kv_dim * K_KEY_BLOCK;
}
static inline size_t kv_k_at(const kv_seq *kv, int64_t il, int64_t pos, int64_t i) {
    return kv_k_block(kv, il, pos) + (size_t)i * K_KEY_BLOCK + (size_t)(pos % K_KEY_BLOCK);
}

static inline void kv_store_k(const kv_seq *kv, int64_t il, int64_t pos, const float *src) {
    const size_t off = kv_k_at(kv, il, pos, 0);
    if (kv->type == PSV_KV_F16) {
        uint16_t *d = (uint16_t *)kv->k + off;
        for (int64_t i = 0; i < kv->kv_dim; i++) d[(size_t)i * K_KEY_BLOCK] = psv_f32_to_fp16(src[i]);
    } else {
        float *d = (float *)kv->k + off;
        for (int64_t i = 0; i < kv->kv_dim; i++) d[(size_t)i * K_KEY_BLOCK] = src[i];
    }
}

static inline void kv_store_v(const kv_seq *kv, int64_t il, int64_t pos, const float *src) {
    size_t off = ((size_t)il * (size_t)kv->n_ctx + (size_t)pos) * (size_t)kv->kv_dim;
    if (kv->type == PSV_KV_F16) {
        uint16_t *d = (uint16_t *)kv->v + off;
        for (int64_t i = 0; i < kv->kv_dim; i++) d[i] = psv_f32_to_fp16(src[i]);
    } else {
        memcpy((float *)kv->v + off, src, (size_t)kv->kv_dim * sizeof(float));
    }
}

// One token of a forward batch. Items of the same sequence must come in position order; each
// attends to positions 0..pos of its own cache.
typedef struct {
    int32_t token;
    int64_t pos;
    kv_seq *kv;
    float *logits; // where to write this token's logits (n_vocab floats), or NULL
} fwd_item;

// Products of at least this many activation rows use the GEMM kernels (see op_matmul_all): from
// 4 on they are faster than the multi-row kernels for every type, once each kernel call
// prefetches the next panel's weights (measured on Zen 4: 4 sequences decoded together, 1.4 times
// the tokens/s for Q4_K_M and Q8_0; at 2 and 3 rows it is a tie).
#define MM_GEMM_MIN 4
#define MM_GEMV_MAX 3 // products of at most this many rows use the set's gemv kernels where it has them (measured)
#define MM_ALSO_MAX 2 // products a job does besides its first (k and v beside q)
#ifndef MM_CHUNKS
#define MM_CHUNKS 4 // chunks of a product per thread on average, taken as threads come free
#endif
// One token's products (gemv1) go in fewer, larger chunks: each starts four streams of weight
// rows (k_gemv1_rows), and the hardware prefetchers take a while to follow a new stream. Rows
// of 896 Q4_0 values from memory, one thread (Zen 5): 37 GB/s in one long chunk, 30 in chunks
// of 450 KB, 22 of 112 KB (a 896-row matrix in MM_CHUNKS chunks); qwen2-0.5b Q4_0 tg128 +6 %
// with one thread and one chunk per product, +5-18 % with two threads and one chunk each.
#ifndef MM_GEMV1_CHUNK
#define MM_GEMV1_CHUNK ((int64_t)1 << 20)
#endif

// Scratch for forward passes of up to n_batch tokens, carved once (no allocation per pass).
typedef struct {
    int64_t n_batch, n_ctx_max;
    float *x, *xn, *q, *att, *ffa, *tmp;                // (n_batch, dim) activations
    float *ffb;                                         // (n_batch, n_embd) phi2's feed-forward output
    float *rope_cs;                                     // (n_batch, n_rot/2, 2) cos, sin
    float *scores;                                      // (n_threads, n_head / n_head_kv, n_ctx_max)
    uint8_t *qbuf;                                      // quantized activations
    size_t qbuf_size;
    // what qbuf and sides hold: the rows of qbuf_x for weights of qbuf_type and width qbuf_n
    const float *qbuf_x;
    int64_t qbuf_tok, qbuf_n;
    uint32_t qbuf_type;
    uint8_t *sides;       // (n_batch) k_act_side of the quantized activations, side_size bytes each
    uint8_t *panels;      // (n_threads) GEMM panel buffers of panel_size bytes
    size_t panel_size;
    int n_threads;
    float **out_rows;       // (n_batch) logits destinations of the output product
    int64_t *out_item_of;   // (n_batch) the item each row of the output product belongs to
    const fwd_item *items;  // the pass in progress
    const int64_t *row_item; // row t of the current product belongs to items[row_item[t]] (NULL: items[t])
} fwd_scratch;

static void scratch_free(fwd_scratch *s) {
    if (!s) return;
    free(s->x); free(s->xn); free(s->q); free(s->att);
    free(s->ffa); free(s->ffb); free(s->tmp); free(s->rope_cs); free(s->scores); free(s->qbuf); free(s->out_rows); free(s->out_item_of);
    free(s->sides); free(s->panels);
    memset(s, 0, sizeof *s);
}

static psv_status scratch_init(fwd_scratch *s, const psv_model *m, int64_t n_batch, int64_t n_ctx_max, psv_error *err) {
    memset(s, 0, sizeof *s);
    s->n_batch = n_batch;
    s->n_ctx_max = n_ctx_max;
    s->n_threads = m->pool->n_threads;
    const int64_t nq = m->n_head * m->head_dim, nkv = m->n_head_kv * m->head_dim;
    // tmp takes the products that are used up before the next one: attention output (n_embd),
    // up or [gate | up] (n_ff or 2 n_ff), feed-forward output (n_embd)
    const int64_t ff = m->fused_gate_up ? 2 * m->n_ff : m->n_ff;
    const int64_t widest = PSV_MAX(PSV_MAX(m->n_embd, nq + 2 * nkv), ff);
    size_t B = (size_t)n_batch;
#define ALLOC(field, count) (s->field = malloc((size_t)(count) * sizeof(float)))
    bool ok = ALLOC(x, B * m->n_embd) && ALLOC(xn, B * m->n_embd) && ALLOC(q, B * (nq + 2 * nkv)) &&
              ALLOC(att, B * nq) && ALLOC(ffa, B * m->n_ff) && ALLOC(ffb, B * m->n_embd) && ALLOC(tmp, B * widest) &&
              ALLOC(rope_cs, B * m->n_rot) &&
              ALLOC(scores, (size_t)s->n_threads * (size_t)(m->n_head / m->n_head_kv) * n_ctx_max) && (s->out_rows = calloc(B, sizeof *s->out_rows)) &&
              (s->out_item_of = calloc(B, sizeof *s->out_item_of));
#undef ALLOC
    // Quantized activations: at most 4 bytes per value (F32) plus block headers; 4.5 covers all.
    int64_t widest_in = PSV_MAX(PSV_MAX(m->n_embd, nq), m->n_ff);
    s->qbuf_size = B * (size_t)widest_in * 5 + 1024;
    ok = ok && (s->qbuf = malloc(s->qbuf_size));
    // the activations' side data (GEMM and GEMV kernels) and, for batches of at least
    // MM_GEMM_MIN rows, GEMM panels: a panel takes at most 12.5 bytes per value
    const size_t one = PSV_MAX(k_act_side_one(T_Q8_0, widest_in), k_act_side_one(T_Q8_K, widest_in)); // gemv1's
    const size_t side_max = PSV_MAX(k_act_side_size(T_Q8_0, widest_in), k_act_side_size(T_Q8_1, widest_in));
    ok = ok && (s->sides = malloc(PSV_MAX(B * PSV_MAX(side_max, k_act_side_size(T_Q8_K, widest_in)), one)));
    if (n_batch >= MM_GEMM_MIN) {
        s->panel_size = ((size_t)widest_in * 13 + 127) & ~(size_t)63; // whole cache lines
        // 64-byte aligned, as the kernels' full-vector loads of it are (malloc's 16-byte alignment
        // split every other AVX-512 load over two cache lines: Q4_0 GEMM 214 -> 236-244 GMAC/s)
        ok = ok && (s->panels = aligned_alloc(64, (size_t)s->n_threads * s->panel_size));
    }
    if (!ok) {
        scratch_free(s);
        return err_set(err, PSV_ERR_NOMEM, "model: out of memory for scratch (n_batch %" PRId64 ")", n_batch);
    }
    return PSV_OK;
}

// ---- operations of the forward pass ----

// y = W x for each of n_tok rows of x (length W->n_in), written to y with row stride y_stride.
// Activations are quantized once to the weight type's dot-product type; threads split the
// output rows so each weight row is read once per call and reused across all tokens. From
// MM_GEMM_MIN rows on, and where the kernel set has them, the GEMM kernels do the products:
// each thread packs K_PANEL weight rows at a time into its panel buffer and runs every
// activation row against it (results bit-identical to the one-row kernels either way).
typedef struct {
    const mtensor *w;
    const uint8_t *xq;
    size_t xq_row;
    int64_t n_tok;
    float *y;
    int64_t y_stride;
    float *const *y_rows; // when set (one product, n_also 0): row t of the result goes to y_rows[t]
    const k_traits *tr;
    const float *x; // quantize phase
    uint8_t *sides; // GEMM or gemv kernels: k_act_side of each row, side_stride apart; NULL: neither
    size_t side_stride;
    uint8_t *panels; // GEMM: the threads' panel buffers; NULL with sides set: the gemv kernels
    size_t panel_size;
    // more products of the same activations in this job, without panels (q, k and v; gate and
    // up): weights of w's type and width, also_y[i] taking also_w[i]'s results as y takes w's
    const mtensor *also_w[MM_ALSO_MAX];
    float *also_y[MM_ALSO_MAX];
    int n_also;
    _Atomic int64_t next_chunk; // the next chunk of rows (or panels) a thread takes
} mm_job;

// Product p of job j (0: w into y, then the also_ ones).
static const mtensor *mm_part_w(const mm_job *j, int p) { return p ? j->also_w[p - 1] : j->w; }
static float *mm_part_y(const mm_job *j, int p) { return p ? j->also_y[p - 1] : j->y; }

static void mm_quant_task(void *arg, int ith, int nth) {
    mm_job *j = arg;
    int64_t lo, hi;
    pool_share(j->n_tok, ith, nth, &lo, &hi);
    const k_traits *at = eng_traits(j->tr->vec_dot_type);
    const bool one_row = j->n_tok == 1 && j->tr->gemv1;
    void (*fused)(const float *, uint8_t *, int64_t, int, uint8_t *, bool) =
        j->sides && j->tr->vec_dot_type == T_Q8_0 ? k_vec_get()->quant_side_q8_0 : NULL;
    for (int64_t t = lo; t < hi; t++) {
        uint8_t *row = (uint8_t *)j->xq + (size_t)t * j->xq_row;
        if (fused) {
            fused(j->x + t * j->w->n_in, row, j->w->n_in, k_panel_off(j->w->type), j->sides + (size_t)t * j->side_stride,
                  one_row);
            continue;
        }
        at->from_float(j->x + t * j->w->n_in, row, j->w->n_in);
        if (j->sides)
            k_act_side(j->tr->vec_dot_type, k_panel_off(j->w->type), row, j->w->n_in, j->sides + (size_t)t * j->side_stride,
                       one_row);
    }
}

// Work units [lo, hi) of a product of n units for the calling thread, false when none are left
// (pool_next_chunk). Which thread computes a row does not change its result.
static bool mm_next_chunk(mm_job *j, int64_t n, int nth, int64_t *lo, int64_t *hi) {
    return pool_next_chunk(&j->next_chunk, n, nth, MM_CHUNKS, lo, hi);
}

// The rows of the next gemm call with m rows left, for a set that takes g at once: g, or g - 1
// where calls of g - 1 rows make up the rest (m % g) so that none is left to take one by one
// (kernels of five rows also have four: 128 rows in 24 calls of five and two of four).
static int mm_gemm_rows(int g, int64_t m) {
    if (m <= g) return (int)m;
    const int64_t short_calls = (g - m % g) % g; // m = g * a + (g - 1) * short_calls
    return g == K_GEMM_ROWS_AVX512 && short_calls > 0 && (g - 1) * short_calls <= m ? g - 1 : g;
}

// The GEMM path of mm_dot_task: panels, a chunk at a time.
static void mm_gemm_task(mm_job *j, int ith, int nth) {
    const mtensor *w = j->w;
    int64_t lo, hi;
    uint8_t *panel = j->panels + (size_t)ith * j->panel_size;
    while (pool_next_guided(&j->next_chunk, (w->n_out + K_PANEL - 1) / K_PANEL, nth, &lo, &hi)) {
        for (int64_t p = lo; p < hi; p++) {
            int64_t o = p * K_PANEL;
            int nw = (int)PSV_MIN((int64_t)K_PANEL, w->n_out - o);
            j->tr->pack(w->n_in, w->data + (size_t)o * w->row_size, w->row_size, nw, panel);
            // The next panel's weights come from memory while this one computes: call c asks
            // for its row c (the last call for all rows left), spread over the calls rather than
            // all in the first, whose burst of requests found them still in flight at the pack
            // (qwen2-0.5b Q4_0 pp128, one thread: pack 9.3 -> 6.8 % of the GEMM's time, gemm
            // and pack together 2-3 % fewer samples)
            k_prefetch next = {.p = w->data, .stride = w->row_size, .blk = type_table[w->type].type_size};
            if (p + 1 < hi)
                next.p += (size_t)(o + K_PANEL) * w->row_size, next.rows = (int)PSV_MIN((int64_t)K_PANEL, w->n_out - o - K_PANEL);
            int nr, c = 0;
            for (int64_t t = 0; t < j->n_tok; t += nr, c++) {
                nr = mm_gemm_rows(j->tr->gemm_rows, j->n_tok - t);
                float *out[K_GEMM_ROWS_MAX];
                for (int r = 0; r < nr; r++) out[r] = (j->y_rows ? j->y_rows[t + r] : j->y + (t + r) * j->y_stride) + o;
                const bool last = t + nr >= j->n_tok;
                k_prefetch one = next;
                if (c < next.rows) one.p += (size_t)c * next.stride, one.rows = last ? next.rows - c : 1;
                j->tr->gemm(w->n_in, panel, j->xq + (size_t)t * j->xq_row, j->xq_row,
                            j->sides + (size_t)t * j->side_stride, j->side_stride, nr, out, nw,
                            c < next.rows ? &one : NULL);
            }
        }
    }
}

// Rows [lo, hi) of the one-row-kernel paths' product w -> y (mm_dot_task), one weight row at a
// time against the job's activation rows.
static void mm_rows(const mm_job *j, const mtensor *w, float *y, int64_t lo, int64_t hi) {
    // several tokens per weight row at once where the kernels can (same results per row): the
    // gemv kernels with the rows' side data (all rows), else the multi-row dot products (2 or more)
    const bool gemv = j->sides != NULL;
    for (int64_t o = lo; o < hi; o++) {
        const uint8_t *wr = w->data + (size_t)o * w->row_size;
        int64_t t = 0;
        if (gemv || j->tr->vec_dot_rows)
            for (; gemv ? t < j->n_tok : t + 1 < j->n_tok; t += K_ROWS_MAX) {
                int nr = (int)PSV_MIN((int64_t)K_ROWS_MAX, j->n_tok - t);
                float tmp[K_ROWS_MAX]; // scattered results go through this small buffer
                float *dst = j->y_rows ? tmp : &y[t * j->y_stride + o];
                int64_t ds = j->y_rows ? 1 : j->y_stride;
                const uint8_t *yq = j->xq + (size_t)t * j->xq_row;
                if (gemv)
                    j->tr->gemv(w->n_in, dst, ds, wr, yq, j->xq_row, j->sides + (size_t)t * j->side_stride,
                                j->side_stride, nr);
                else
                    j->tr->vec_dot_rows(w->n_in, dst, ds, wr, yq, j->xq_row, nr);
                if (j->y_rows)
                    for (int r = 0; r < nr; r++) j->y_rows[t + r][o] = tmp[r];
            }
        for (; t < j->n_tok; t++)
            j->tr->vec_dot(w->n_in, j->y_rows ? &j->y_rows[t][o] : &y[t * j->y_stride + o], wr,
                           j->xq + (size_t)t * j->xq_row);
    }
}

static void mm_dot_task(void *arg, int ith, int nth) {
    mm_job *j = arg;
    if (j->panels) {
        mm_gemm_task(j, ith, nth);
        return;
    }
    // The job's products in one sequence of units (rows, or groups of four rows for gemv1),
    // product after product; a chunk may span two.
    const bool one = j->sides && j->n_tok == 1 && j->tr->gemv1; // one token: many weight rows a call, in fours
    const int unit = one ? 4 : 1;
    int64_t units = 0, bytes = 0, lo, hi;
    for (int p = 0; p <= j->n_also; p++) {
        const mtensor *w = mm_part_w(j, p);
        units += (w->n_out + unit - 1) / unit, bytes += w->n_out * (int64_t)w->row_size;
    }
    // gemv1: in chunks of at least MM_GEMV1_CHUNK bytes, one per thread at least (one thread: one)
    const int chunks = nth == 1 ? 1 : (int)PSV_MIN(PSV_MAX(bytes / MM_GEMV1_CHUNK, (int64_t)nth), (int64_t)nth * MM_CHUNKS);
    while (one ? pool_next_chunk(&j->next_chunk, units, 1, chunks, &lo, &hi) : mm_next_chunk(j, units, nth, &lo, &hi)) {
        int64_t base = 0; // the first unit of product p
        for (int p = 0; p <= j->n_also && base < hi; p++) {
            const mtensor *w = mm_part_w(j, p);
            float *y = mm_part_y(j, p);
            const int64_t n_units = (w->n_out + unit - 1) / unit;
            int64_t a = PSV_MAX(lo, base) - base, b = PSV_MIN(hi, base + n_units) - base;
            base += n_units;
            if (a >= b) continue;
            a *= unit, b = PSV_MIN(b * unit, w->n_out);
            if (one)
                j->tr->gemv1(w->n_in, (j->y_rows ? j->y_rows[0] : y) + a, w->data + (size_t)a * w->row_size, w->row_size,
                             (int)(b - a), j->xq, j->sides);
            else
                mm_rows(j, w, y, a, b);
        }
    }
}

#ifdef PSV_TESTING
// Test hook. The reference models amplify a last-bit difference in an activation that sits on a
// rounding boundary of its 8-bit quantization into a visible logit difference, so tests need to
// know where such near-ties occur: test_first_tie receives the earliest position at which an
// activation quantized to Q8_0/Q8_1/Q8_K lies within test_tie_rel (relative) of a boundary.
static float test_tie_rel;
static int64_t test_first_tie = INT64_MAX;

static void test_note_ties(const fwd_scratch *s, const float *x, int64_t n_tok, int64_t n_in, uint32_t qtype) {
    if (test_tie_rel <= 0 || (qtype != T_Q8_0 && qtype != T_Q8_1 && qtype != T_Q8_K)) return;
    const int64_t bs = qtype == T_Q8_K ? QK_K : 32;
    for (int64_t t = 0; t < n_tok; t++) {
        int64_t pos = s->items[s->row_item ? s->row_item[t] : t].pos;
        if (pos >= test_first_tie) continue;
        for (int64_t b = 0; b < n_in; b += bs) {
            const float *xb = x + t * n_in + b;
            float amax = 0, mx = 0;
            for (int64_t j = 0; j < bs; j++)
                if (psv_fabsf(xb[j]) > amax) amax = psv_fabsf(xb[j]), mx = xb[j];
            if (amax == 0) continue;
            // the scale each quantizer multiplies by (ggml's Q8_K keeps the sign of the max)
            float iscale = qtype == T_Q8_K ? -127.0f / mx : 1.0f / (amax / 127.0f);
            for (int64_t j = 0; j < bs; j++) {
                double v = psv_fabsf(iscale * xb[j]), fr = v - (double)(int64_t)v;
                double dist = fr > 0.5 ? fr - 0.5 : 0.5 - fr;
                if (dist <= v * test_tie_rel && pos < test_first_tie) test_first_tie = pos;
            }
        }
    }
}
#endif

// y = W x for each of n_tok rows of x, and the same for the n_also products also_w[i] -> also_y[i]
// of the same x (q, k and v; gate and up), each written with row stride y_stride. Where the one-row
// kernels do products of one type and width, they go in one job: one hand-off to the pool where
// there would be one per product, with the threads' shares spread over them all (qwen2-0.5b: k and
// v are 64 KB each). same_x: x is unchanged since the previous product, whose quantized rows (and
// side data) are then reused where that product's weights had the same type and width.
static void op_matmul_all(const psv_model *m, fwd_scratch *s, const mtensor *w, const float *x, int64_t n_tok,
                          float *y, int64_t y_stride, float *const *y_rows, bool same_x, const mtensor *const *also_w,
                          float *const *also_y, int n_also) {
    PSV_ASSERT(n_also >= 0 && n_also <= MM_ALSO_MAX && (!y_rows || n_also == 0));
    mm_job j = {.w = w, .n_tok = n_tok, .y = y, .y_stride = y_stride, .y_rows = y_rows, .tr = eng_traits(w->type), .x = x};
    uint64_t rs;
    PSV_ASSERT(type_row_size(j.tr->vec_dot_type, (uint64_t)w->n_in, &rs));
    j.xq_row = (size_t)rs;
    PSV_ASSERT(j.xq_row * (size_t)n_tok <= s->qbuf_size);
    j.xq = s->qbuf;
    if ((n_tok <= MM_GEMV_MAX && j.tr->gemv) || (n_tok == 1 && j.tr->gemv1)) {
        j.sides = s->sides;
        j.side_stride = k_act_side_size(j.tr->vec_dot_type, w->n_in);
    } else if (n_tok >= MM_GEMM_MIN && j.tr->gemm && s->panels) {
        PSV_ASSERT(k_panel_size(w->type, w->n_in) <= s->panel_size);
        j.sides = s->sides;
        j.side_stride = k_act_side_size(j.tr->vec_dot_type, w->n_in);
        j.panels = s->panels;
        j.panel_size = s->panel_size;
    }
#ifdef PSV_TESTING
    test_note_ties(s, x, n_tok, w->n_in, j.tr->vec_dot_type);
#endif
    if (!(same_x && s->qbuf_x == x && s->qbuf_tok == n_tok && s->qbuf_n == w->n_in && s->qbuf_type == w->type)) {
        // a few rows quantize faster on this thread than a hand-off to the pool costs
        if (n_tok <= 4) mm_quant_task(&j, 0, 1);
        else pool_run(m->pool, mm_quant_task, &j);
        s->qbuf_x = x, s->qbuf_tok = n_tok, s->qbuf_n = w->n_in, s->qbuf_type = w->type;
    }
    int done = 0; // the also_ products this job takes
    while (!j.panels && done < n_also && also_w[done]->type == w->type && also_w[done]->n_in == w->n_in) {
        j.also_w[done] = also_w[done], j.also_y[done] = also_y[done];
        j.n_also = ++done;
    }
    pool_run(m->pool, mm_dot_task, &j);
    if (done < n_also)
        op_matmul_all(m, s, also_w[done], x, n_tok, also_y[done], y_stride, NULL, true, also_w + done + 1, also_y + done + 1,
                      n_also - done - 1);
}

static void op_matmul(const psv_model *m, fwd_scratch *s, const mtensor *w, const float *x, int64_t n_tok,
                      float *y, int64_t y_stride) {
    op_matmul_all(m, s, w, x, n_tok, y, y_stride, NULL, false, NULL, NULL, 0);
}

static void op_add_bias(float *y, const float *b, int64_t n_tok, int64_t n, int64_t stride) {
    if (!b) return;
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t i = 0; i < n; i++) y[t * stride + i] += b[i];
}

// RMS norm: y = (x * (1 / sqrt(mean(x^2) + eps))) * w. The float operations follow the GGUF
// ecosystem's reference runtime step by step (squares in float, summed in double, the scale in
// float): these models amplify last-bit differences, so matching the rounding keeps pensieve
// within the reference contract.
static void op_rmsnorm_scale(float *y, const float *x, const float *w, int64_t n, double ss, float eps) {
    float mean = (float)(ss / (double)n);
    float scale = 1.0f / psv_sqrtf(mean + eps);
    if (w)
        for (int64_t i = 0; i < n; i++) y[i] = x[i] * scale * w[i];
    else
        for (int64_t i = 0; i < n; i++) y[i] = x[i] * scale;
}

static void op_rmsnorm(float *y, const float *x, const float *w, int64_t n, float eps) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += (double)(x[i] * x[i]);
    op_rmsnorm_scale(y, x, w, n, ss, eps);
}

// op_rmsnorm of rows rows (1..4) of x and y, stride apart. Each row's sum is a chain of
// dependent additions, in the reference's order; four rows' chains side by side run about
// four times as fast as one after the other.
static void op_rmsnorm_rows(float *y, const float *x, const float *w, int64_t n, float eps, int rows, int64_t stride) {
    if (rows != 4) {
        for (int r = 0; r < rows; r++) op_rmsnorm(y + r * stride, x + r * stride, w, n, eps);
        return;
    }
    const float *x0 = x, *x1 = x + stride, *x2 = x + 2 * stride, *x3 = x + 3 * stride;
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (int64_t i = 0; i < n; i++) {
        s0 += (double)(x0[i] * x0[i]);
        s1 += (double)(x1[i] * x1[i]);
        s2 += (double)(x2[i] * x2[i]);
        s3 += (double)(x3[i] * x3[i]);
    }
    const double ss[4] = {s0, s1, s2, s3};
    for (int r = 0; r < 4; r++) op_rmsnorm_scale(y + r * stride, x + r * stride, w, n, ss[r], eps);
}

// Layer norm: y = (x - mean) / sqrt(var + eps) * w + b.
static void op_layernorm(float *y, const float *x, const float *w, const float *b, int64_t n, float eps) {
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += x[i];
    float mean = (float)(sum / (double)n);
    double var = 0;
    for (int64_t i = 0; i < n; i++) var += (double)(x[i] - mean) * (x[i] - mean);
    float scale = (float)(1.0 / psv_sqrt(var / (double)n + eps));
    for (int64_t i = 0; i < n; i++) y[i] = (x[i] - mean) * scale * w[i] + (b ? b[i] : 0.0f);
}

static void op_norm(const psv_model *m, float *y, const float *x, const float *w, const float *b) {
    if (m->layer_norm) op_layernorm(y, x, w, b, m->n_embd, m->norm_eps);
    else op_rmsnorm(y, x, w, m->n_embd, m->norm_eps);
}

// op_norm of rows (1..4) consecutive rows of n_embd values
static void op_norm_rows(const psv_model *m, float *y, const float *x, const float *w, const float *b, int rows) {
    const int64_t E = m->n_embd;
    if (m->layer_norm)
        for (int r = 0; r < rows; r++) op_layernorm(y + r * E, x + r * E, w, b, E, m->norm_eps);
    else
        op_rmsnorm_rows(y, x, w, E, m->norm_eps, rows, E);
}

// cos/sin for each token's position: theta_i = freq_scale * pos * base^(-2i/n_rot) / factor_i,
// cos and sin scaled by attn_factor (the rotary "mscale"). As in the reference runtime, theta is
// built in float by repeated multiplication with base^(-2/n_rot), and cos/sin are the correctly
// rounded values for that float angle.
static inline float op_cosf(float x) { double s, c; psv_sincos((double)x, &s, &c); return (float)c; }
static inline float op_sinf(float x) { double s, c; psv_sincos((double)x, &s, &c); return (float)s; }

static void op_rope_table(const psv_model *m, const fwd_item *items, int64_t n, float *cs, int64_t n_ctx) {
    const float *ff = NULL;
    if (m->rope_long && m->rope_short) ff = (m->n_ctx_orig > 0 && n_ctx > m->n_ctx_orig) ? m->rope_long : m->rope_short;
    const int64_t half = m->n_rot / 2;
    const float theta_scale = (float)psv_pow((double)m->rope_base, (double)(-2.0f / (float)m->n_rot));
    for (int64_t t = 0; t < n; t++) {
        float theta = (float)items[t].pos;
        for (int64_t i = 0; i < half; i++) {
            float th = m->rope_freq_scale * (ff ? theta / ff[i] : theta);
            cs[(t * half + i) * 2 + 0] = op_cosf(th) * m->rope_attn_factor;
            cs[(t * half + i) * 2 + 1] = op_sinf(th) * m->rope_attn_factor;
            theta *= theta_scale;
        }
    }
}

// Rotate the first n_rot dims of each head of v (n_heads heads of head_dim) in place.
static void op_rope(const psv_model *m, float *v, int64_t n_heads, const float *cs) {
    int64_t half = m->n_rot / 2, hd = m->head_dim;
    for (int64_t h = 0; h < n_heads; h++) {
        float *x = v + h * hd;
        for (int64_t i = 0; i < half; i++) {
            float c = cs[2 * i], s = cs[2 * i + 1];
            int64_t a = m->rope_neox ? i : 2 * i, b = m->rope_neox ? i + half : 2 * i + 1;
            float x0 = x[a], x1 = x[b];
            x[a] = x0 * c - x1 * s;
            x[b] = x0 * s + x1 * c;
        }
    }
}

// Attention for every (token, head) pair, threads taking the pairs in chunks.
typedef struct {
    const psv_model *m;
    fwd_scratch *s;
    const fwd_item *items;
    int64_t n, il;
    const float *q; // (n, n_head*hd)
    int64_t q_stride;
    _Atomic int64_t next_chunk; // tasks taken in guided chunks (a token's cost grows with its position)
} att_job;

static void att_task(void *arg, int ith, int nth) {
    att_job *j = arg;
    const psv_model *m = j->m;
    const int64_t hd = m->head_dim, group = m->n_head / m->n_head_kv;
    const float scale = (float)(1.0 / psv_sqrt((double)hd));
    const size_t sc_stride = (size_t)j->s->n_ctx_max;
    float *scores = j->s->scores + (size_t)ith * (size_t)group * sc_stride;
    const k_vec_ops *vec = k_vec_get();
    // a task: the query heads of one token that share a KV head, so that the key products read
    // each key row once for all of them; split further only when there are fewer groups than
    // threads (generation)
    const int64_t groups = j->n * m->n_head_kv;
    const int64_t parts = PSV_MIN(group, (nth + groups - 1) / groups), per = (group + parts - 1) / parts;
    int64_t lo, hi;
    // the last tokens first (in a prompt they attend to the most positions), in guided chunks
    while (pool_next_guided(&j->next_chunk, groups * parts, nth, &lo, &hi)) {
        for (int64_t task = lo; task < hi; task++) {
            const int64_t t = j->n - 1 - task / (m->n_head_kv * parts);
            const int64_t kvh = task / parts % m->n_head_kv, part = task % parts;
            const int64_t h0 = kvh * group + part * per, nh = PSV_MIN(per, (kvh + 1) * group - h0);
            if (nh <= 0) continue;
            const fwd_item *it = &j->items[t];
            const kv_seq *kv = it->kv;
            const float *q0 = j->q + t * j->q_stride + h0 * hd;
            const int64_t n_kv = it->pos + 1;
            const size_t base = (size_t)j->il * (size_t)kv->n_ctx * (size_t)kv->kv_dim + (size_t)kvh * (size_t)hd;
            if (kv->type == PSV_KV_F16) {
                for (int64_t g = 0; g < nh; g++)
                    for (int64_t p = 0; p < n_kv; p++) {
                        float d = 0;
                        const float *q = q0 + g * hd;
                        const uint16_t *kr = (const uint16_t *)kv->k + kv_k_at(kv, j->il, p, kvh * hd);
                        for (int64_t i = 0; i < hd; i++) d += q[i] * psv_fp16_to_f32(kr[(size_t)i * K_KEY_BLOCK]);
                        scores[(size_t)g * sc_stride + (size_t)p] = d;
                    }
            } else {
                const float *k0 = (const float *)kv->k + kv_k_block(kv, j->il, 0) + (size_t)(kvh * hd) * K_KEY_BLOCK;
                vec->dot_keys(scores, sc_stride, q0, (size_t)hd, (int)nh, k0, (size_t)kv->kv_dim * K_KEY_BLOCK, n_kv, hd);
            }
            float *out0 = j->s->att + t * m->n_head * hd + h0 * hd;
            for (int64_t g = 0; g < nh; g++) {
                vec->softmax(scores + (size_t)g * sc_stride, n_kv, scale); // the weights
                for (int64_t i = 0; i < hd; i++) out0[g * hd + i] = 0;
            }
            if (kv->type == PSV_KV_F16) {
                for (int64_t g = 0; g < nh; g++)
                    for (int64_t p = 0; p < n_kv; p++) {
                        const uint16_t *vr = (const uint16_t *)kv->v + base + (size_t)p * (size_t)kv->kv_dim;
                        const float wp = scores[(size_t)g * sc_stride + (size_t)p];
                        for (int64_t i = 0; i < hd; i++) out0[g * hd + i] += wp * psv_fp16_to_f32(vr[i]);
                    }
            } else {
                vec->axpy_rows(out0, (size_t)hd, scores, sc_stride, (int)nh, (const float *)kv->v + base, (size_t)kv->kv_dim,
                               n_kv, hd);
            }
        }
    }
}

// SwiGLU (silu(g) * u, silu(x) = x / (1 + exp(-x))) and the softmax use the reference runtime's
// float exp (psv_expf_poly) through the vector kernels of section 12, bit-identical to it.
// GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
static inline float op_gelu(float x) {
    return 0.5f * x * (1.0f + psv_tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

// The per-token work between a layer's products, on the thread pool (tokens split over the
// threads; each token's steps are the same as one after the other, so the results are too).
enum {
    TS_RESID = 1,    // x += tmp (the previous layer's feed-forward output)
    TS_NORM_ATT = 2, // xn = attention norm of x
    TS_QKV = 4,      // biases, q/k norms, RoPE, then k and v into the KV cache
    TS_ATT_OUT = 8,  // tmp += bo, x += tmp, xn = feed-forward norm of x
    TS_GLU = 16,     // ffa = SwiGLU of the gate and up products
};
typedef struct {
    const psv_model *m;
    fwd_scratch *s;
    const fwd_item *items;
    int64_t n, il;
    unsigned steps;
} tok_job;

// The steps of tokens t .. t + c - 1 (c <= 4: their norms side by side, op_norm_rows).
static void tok_steps(const tok_job *j, int64_t t, int c) {
    const psv_model *m = j->m;
    fwd_scratch *s = j->s;
    const layer_w *L = &m->layers[j->il];
    const int64_t E = m->n_embd, hd = m->head_dim, nq = m->n_head * hd, nkv = m->n_head_kv * hd, F = m->n_ff;
    const int64_t qkv_w = nq + 2 * nkv;
    float *x = s->x + t * E, *xn = s->xn + t * E, *tmp = s->tmp + t * E;
    if (j->steps & TS_RESID)
        for (int64_t i = 0; i < c * E; i++) x[i] += tmp[i];
    if (j->steps & TS_NORM_ATT) op_norm_rows(m, xn, x, L->attn_norm, L->attn_norm_b, c);
    for (int64_t u = t; u < t + c && (j->steps & TS_QKV); u++) {
        float *q = s->q + u * qkv_w, *k = q + nq, *v = k + nkv;
        if (m->fused_qkv) {
            op_add_bias(q, L->bqkv, 1, qkv_w, qkv_w);
        } else {
            op_add_bias(q, L->bq, 1, nq, qkv_w);
            op_add_bias(k, L->bk, 1, nkv, qkv_w);
            op_add_bias(v, L->bv, 1, nkv, qkv_w);
        }
        if (L->q_norm) {
            for (int64_t h = 0; h < m->n_head; h++) op_rmsnorm(q + h * hd, q + h * hd, L->q_norm, hd, m->norm_eps);
            for (int64_t h = 0; h < m->n_head_kv; h++) op_rmsnorm(k + h * hd, k + h * hd, L->k_norm, hd, m->norm_eps);
        }
        const int64_t half = m->n_rot / 2;
        op_rope(m, q, m->n_head, s->rope_cs + u * half * 2);
        op_rope(m, k, m->n_head_kv, s->rope_cs + u * half * 2);
        kv_store_k(j->items[u].kv, j->il, j->items[u].pos, k);
        kv_store_v(j->items[u].kv, j->il, j->items[u].pos, v);
    }
    if (j->steps & TS_ATT_OUT) {
        op_add_bias(tmp, L->bo, c, E, E);
        for (int64_t i = 0; i < c * E; i++) x[i] += tmp[i];
        op_norm_rows(m, xn, x, L->ffn_norm, NULL, c);
    }
    for (int64_t u = t; u < t + c && (j->steps & TS_GLU); u++) {
        if (m->fused_gate_up) { // one product gave [gate | up] per token
            const float *g = s->tmp + u * 2 * F, *up = g + F;
            k_vec_get()->swiglu(s->ffa + u * F, g, up, F);
        } else {
            k_vec_get()->swiglu(s->ffa + u * F, s->ffa + u * F, s->tmp + u * F, F);
        }
    }
}

static void tok_task(void *arg, int ith, int nth) {
    const tok_job *j = arg;
    int64_t lo, hi;
    pool_share(j->n, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t += 4) tok_steps(j, t, (int)PSV_MIN((int64_t)4, hi - t));
}

// One token (generation) stays on the calling thread: waking the pool would cost more.
static void run_tok_steps(psv_model *m, fwd_scratch *s, const fwd_item *items, int64_t n, int64_t il, unsigned steps) {
    tok_job j = {.m = m, .s = s, .items = items, .n = n, .il = il, .steps = steps};
    if (n == 1) tok_steps(&j, 0, 1);
    else pool_run(m->pool, tok_task, &j);
}

// The forward pass over n items (n <= s->n_batch). Writes K/V into each item's cache at its
// position and logits where an item asks for them. Caller validated tokens and positions.
static void model_forward(psv_model *m, fwd_scratch *s, const fwd_item *items, int64_t n) {
    const int64_t E = m->n_embd, hd = m->head_dim, nq = m->n_head * hd, nkv = m->n_head_kv * hd;
    const int64_t F = m->n_ff, qkv_w = nq + 2 * nkv;
    const k_traits *et = eng_traits(m->tok_embd.type);
    s->items = items;
    s->row_item = NULL;
    for (int64_t t = 0; t < n; t++)
        et->to_float(m->tok_embd.data + (size_t)items[t].token * m->tok_embd.row_size, s->x + t * E, E);
    op_rope_table(m, items, n, s->rope_cs, items[0].kv->n_ctx);

    bool resid = false; // the previous layer's feed-forward output is still in tmp
    for (int64_t il = 0; il < m->n_layer; il++) {
        const layer_w *L = &m->layers[il];
        run_tok_steps(m, s, items, n, il, (resid ? TS_RESID : 0u) | TS_NORM_ATT);
        // q, k, v as rows of width qkv_w in s->q: [q | k | v]
        if (m->fused_qkv) {
            op_matmul(m, s, &L->wqkv, s->xn, n, s->q, qkv_w);
        } else {
            const mtensor *kv_w[2] = {&L->wk, &L->wv};
            float *kv_y[2] = {s->q + nq, s->q + nq + nkv};
            op_matmul_all(m, s, &L->wq, s->xn, n, s->q, qkv_w, NULL, false, kv_w, kv_y, 2);
        }
        run_tok_steps(m, s, items, n, il, TS_QKV);
        att_job aj = {.m = m, .s = s, .items = items, .n = n, .il = il, .q = s->q, .q_stride = qkv_w};
        pool_run(m->pool, att_task, &aj);
        // attention output projection into tmp
        op_matmul(m, s, &L->wo, s->att, n, s->tmp, E);
        if (m->parallel) {
            // phi2: x += attn(xn) + ffn(xn), both from the same normed input
            op_add_bias(s->tmp, L->bo, n, E, E);
            op_matmul(m, s, &L->w_up, s->xn, n, s->ffa, F);
            op_add_bias(s->ffa, L->b_up, n, F, F);
            for (int64_t i = 0; i < n * F; i++) s->ffa[i] = op_gelu(s->ffa[i]);
            op_matmul(m, s, &L->w_down, s->ffa, n, s->ffb, E);
            op_add_bias(s->ffb, L->b_down, n, E, E);
            for (int64_t i = 0; i < n * E; i++) s->x[i] += s->tmp[i] + s->ffb[i];
            resid = false;
            continue;
        }
        run_tok_steps(m, s, items, n, il, TS_ATT_OUT);
        // gate into ffa and up into tmp (free again: x has taken the attention's output)
        if (m->fused_gate_up) {
            op_matmul(m, s, &L->w_up, s->xn, n, s->tmp, 2 * F);
        } else {
            const mtensor *up_w = &L->w_up;
            float *up_y = s->tmp;
            op_matmul_all(m, s, &L->w_gate, s->xn, n, s->ffa, F, NULL, false, &up_w, &up_y, 1);
        }
        run_tok_steps(m, s, items, n, il, TS_GLU);
        op_matmul(m, s, &L->w_down, s->ffa, n, s->tmp, E);
        resid = true;
    }
    if (resid) run_tok_steps(m, s, items, n, m->n_layer - 1, TS_RESID);
    // final norm and logits, only for the items that want them (compacted into xn); one product
    // over the output matrix writes each row straight into its item's buffer
    int64_t n_out = 0;
    for (int64_t t = 0; t < n; t++)
        if (items[t].logits) {
            op_norm(m, s->xn + n_out * E, s->x + t * E, m->out_norm, m->out_norm_b);
            s->out_item_of[n_out] = t;
            s->out_rows[n_out++] = items[t].logits;
        }
    if (n_out == 0) return;
    s->row_item = s->out_item_of;
    op_matmul_all(m, s, &m->output, s->xn, n_out, NULL, 0, s->out_rows, false, NULL, NULL, 0);
    s->row_item = NULL;
    for (int64_t k = 0; k < n_out && m->out_b; k++) op_add_bias(s->out_rows[k], m->out_b, 1, m->n_vocab, m->n_vocab);
}

// ----------------------------------------------------------------------------
// 15. Sampling
// Turns logits into a token: penalties, then top-k, top-p, min-p, temperature, then a draw from
// a seeded xoshiro256** generator. Greedy (temperature <= 0) is the arg-max. Deterministic:
// the same seed, settings and logits give the same token on any machine and thread count.

struct psv_sampler {
    psv_sampler_params p;
    int64_t n_vocab;
    uint64_t rng[4];
    int32_t *hist; // ring of the last p.repeat_last_n accepted tokens
    int64_t hist_n, hist_pos;
    struct samp_cand { float logit; int32_t id; } *cand;
    float *lg;       // (n_vocab) the candidates' logits, in candidate order (for the normaliser)
    double *w;       // (n_vocab) the survivors' unnormalised probabilities
    int32_t *counts; // per-token occurrences in the window
};

static uint64_t samp_splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t samp_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t samp_next(uint64_t s[4]) {
    uint64_t r = samp_rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t; s[3] = samp_rotl(s[3], 45);
    return r;
}

// Uniform double in [0, 1) from the top 53 bits.
static double samp_uniform(uint64_t s[4]) { return (double)(samp_next(s) >> 11) * (1.0 / 9007199254740992.0); }

// The sampler's order: higher logit first, ties broken by id (stable across platforms).
static bool samp_before(const struct samp_cand *x, const struct samp_cand *y) {
    return x->logit != y->logit ? x->logit > y->logit : x->id < y->id;
}

// Restores the heap property (every parent before its children) below position i of a heap of n.
static void samp_sift(struct samp_cand *h, int64_t i, int64_t n) {
    struct samp_cand v = h[i];
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && samp_before(&h[c + 1], &h[c])) c++;
        if (!samp_before(&h[c], &v)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = v;
}

PSV_API psv_sampler_params psv_sampler_default_params(void) {
    psv_sampler_params p;
    memset(&p, 0, sizeof p);
    p.temperature = 0.8f;
    p.top_k = 40;
    p.top_p = 0.95f;
    p.min_p = 0.05f;
    p.repeat_penalty = 1.0f;
    p.repeat_last_n = 64;
    p.seed = 0x5eed;
    return p;
}

PSV_API void psv_sampler_free(psv_sampler *s) {
    if (!s) return;
    free(s->hist);
    free(s->cand);
    free(s->w);
    free(s->lg);
    free(s->counts);
    free(s);
}

PSV_API psv_status psv_sampler_new(const psv_sampler_params *params, int64_t n_vocab, psv_sampler **out, psv_error *err) {
    *out = NULL;
    psv_sampler_params p = params ? *params : psv_sampler_default_params();
    if (n_vocab < 1 || n_vocab > (1 << 24)) return err_set(err, PSV_ERR_INVALID, "sampler: n_vocab %" PRId64 " out of range", n_vocab);
    if (!psv_isfinite(p.temperature) || p.temperature < 0 || p.temperature > 100)
        return err_set(err, PSV_ERR_INVALID, "sampler: temperature %g out of range (0..100)", (double)p.temperature);
    if (!(p.top_p >= 0 && p.top_p <= 1)) return err_set(err, PSV_ERR_INVALID, "sampler: top_p %g out of range (0..1)", (double)p.top_p);
    if (!(p.min_p >= 0 && p.min_p <= 1)) return err_set(err, PSV_ERR_INVALID, "sampler: min_p %g out of range (0..1)", (double)p.min_p);
    if (p.top_k < 0) return err_set(err, PSV_ERR_INVALID, "sampler: top_k %d is negative", p.top_k);
    if (!(p.repeat_penalty > 0 && p.repeat_penalty <= 100))
        return err_set(err, PSV_ERR_INVALID, "sampler: repeat_penalty %g out of range (0..100]", (double)p.repeat_penalty);
    if (!psv_isfinite(p.presence_penalty) || !psv_isfinite(p.frequency_penalty) || p.presence_penalty < -100 ||
        p.presence_penalty > 100 || p.frequency_penalty < -100 || p.frequency_penalty > 100)
        return err_set(err, PSV_ERR_INVALID, "sampler: presence/frequency penalty out of range (-100..100)");
    if (p.repeat_last_n < 0 || p.repeat_last_n > (1 << 20))
        return err_set(err, PSV_ERR_INVALID, "sampler: repeat_last_n %d out of range", p.repeat_last_n);
    psv_sampler *s = calloc(1, sizeof *s);
    if (!s) return err_set(err, PSV_ERR_NOMEM, "sampler: out of memory");
    s->p = p;
    s->n_vocab = n_vocab;
    s->cand = malloc((size_t)n_vocab * sizeof *s->cand);
    s->w = malloc((size_t)n_vocab * sizeof *s->w);
    s->lg = malloc((size_t)n_vocab * sizeof *s->lg);
    s->counts = calloc((size_t)n_vocab, sizeof *s->counts);
    s->hist = malloc((size_t)(p.repeat_last_n ? p.repeat_last_n : 1) * sizeof *s->hist);
    if (!s->cand || !s->w || !s->lg || !s->counts || !s->hist) {
        psv_sampler_free(s);
        return err_set(err, PSV_ERR_NOMEM, "sampler: out of memory");
    }
    uint64_t x = p.seed;
    for (int i = 0; i < 4; i++) s->rng[i] = samp_splitmix(&x);
    *out = s;
    return PSV_OK;
}

PSV_API void psv_sampler_accept(psv_sampler *s, int32_t token) {
    if (!s || s->p.repeat_last_n == 0 || token < 0 || token >= s->n_vocab) return;
    if (s->hist_n == s->p.repeat_last_n) {
        s->counts[s->hist[s->hist_pos]]--;
        s->hist_n--;
    }
    s->hist[s->hist_pos] = token;
    s->hist_pos = (s->hist_pos + 1) % s->p.repeat_last_n;
    s->hist_n++;
    s->counts[token]++;
}

PSV_API int32_t psv_sampler_sample(psv_sampler *s, const float *logits) {
    const psv_sampler_params *p = &s->p;
    int64_t n = 0, best = 0; // best: the first candidate with the highest logit
    for (int64_t i = 0; i < s->n_vocab; i++) {
        float l = logits[i];
        if (psv_isnan(l)) continue;
        int32_t c = s->counts[i];
        if (c > 0) {
            // repetition penalty as in CTRL (arXiv:1909.05858): divide positive logits, multiply negative
            if (p->repeat_penalty != 1.0f) l = l > 0 ? l / p->repeat_penalty : l * p->repeat_penalty;
            l -= (float)c * p->frequency_penalty + p->presence_penalty;
        }
        s->cand[n].logit = s->lg[n] = l;
        s->cand[n].id = (int32_t)i;
        if (l > s->lg[best]) best = n;
        n++;
    }
    if (n == 0) return 0;
    if (p->temperature <= 0.0f) return s->cand[best].id;
    // Every cut-off keeps a prefix of the candidates sorted by logit (top-k the first k, top-p the
    // shortest with mass >= top_p, min-p those within log(min_p) of the best), so the result is
    // that of sorting everything and cutting in order. Cheaper: the min-p cut and the softmax
    // normaliser are linear passes, and only as many survivors as the cuts keep are put in
    // order, and only when a cut needs the order (a vocabulary of 150k+ tokens would otherwise be
    // sorted every token).
    double mx = s->lg[best], sum = 0;
    if (p->top_p < 1.0f) { // the normaliser only top-p needs (exp is the sampler's main cost)
        k_vec_get()->exp_shift(s->w, s->lg, mx, 1.0, n); // (x / 1.0 is x)
        for (int64_t i = 0; i < n; i++) sum += s->w[i];
    }
    if (p->min_p > 0.0f) {
        double cut = mx + psv_log((double)p->min_p);
        int64_t k = 0;
        for (int64_t i = 0; i < n; i++)
            if ((double)s->cand[i].logit >= cut) s->cand[k++] = s->cand[i];
        n = k;
    }
    if ((p->top_k > 0 && p->top_k < n) || p->top_p < 1.0f) {
        // the best candidates in order, only as many as the cuts keep: a heap of all of them,
        // popped one at a time (sorting 150k candidates cost milliseconds a token), each popped
        // one going to the end: after m pops, the best m are at n - m .. n - 1, best last
        struct samp_cand *c = s->cand;
        int64_t limit = p->top_k > 0 && p->top_k < n ? p->top_k : n, m = 0;
        for (int64_t i = n / 2; i-- > 0;) samp_sift(c, i, n);
        double acc = 0;
        while (m < limit) {
            struct samp_cand best = c[0];
            c[0] = c[n - 1 - m];
            samp_sift(c, 0, n - 1 - m);
            c[n - 1 - m] = best;
            m++;
            if (p->top_p < 1.0f && (acc += psv_exp((double)best.logit - mx) / sum) >= p->top_p) break;
        }
        for (int64_t i = 0; i < m / 2; i++) { // best first, then to the front
            struct samp_cand t = c[n - m + i];
            c[n - m + i] = c[n - 1 - i];
            c[n - 1 - i] = t;
        }
        memmove(c, c + (n - m), (size_t)m * sizeof *c);
        n = m;
    } // else: no cut needs the order; the candidates stay in id order (deterministic for a seed)
    double tsum = 0; // (lg follows the candidates again: the cuts moved and dropped some)
    for (int64_t i = 0; i < n; i++) s->lg[i] = s->cand[i].logit;
    k_vec_get()->exp_shift(s->w, s->lg, mx, p->temperature, n);
    for (int64_t i = 0; i < n; i++) tsum += s->w[i];
    double r = samp_uniform(s->rng) * tsum, acc = 0;
    for (int64_t i = 0; i < n; i++) {
        acc += s->w[i];
        if (r < acc) return s->cand[i].id;
    }
    return s->cand[n - 1].id;
}

// ----------------------------------------------------------------------------
// 16. Public API
// psv_model_* and psv_ctx_*: see pensieve.h for the contracts.

struct psv_ctx {
    psv_model *m;
    psv_ctx_params p;
    kv_seq kv;
    fwd_scratch s;
    fwd_item *items; // (n_batch)
    float *logits;   // (n_vocab) of the last evaluated token
    bool have_logits;
};

PSV_API psv_model_params psv_model_default_params(void) {
    psv_model_params p;
    memset(&p, 0, sizeof p);
    p.n_threads = 0;
    return p;
}

static int psv_default_threads(void) {
    int n = plat_n_cpus();
    return n > 64 ? 64 : n;
}

PSV_API void psv_model_close(psv_model *m) {
    if (!m) return;
    plat_prefault_stop(&m->prefault);
    pool_free(m->pool);
    free(m->layers);
    for (size_t i = 0; i < m->vecs.n; i++) free(m->vecs.ptrs[i]);
    free(m->vecs.ptrs);
    model_vocab_free(m);
    gguf_close(m->gguf);
    pthread_mutex_destroy(&m->lock);
    free(m);
}

PSV_API psv_status psv_model_open(const char *path, const psv_model_params *params, psv_model **out, psv_error *err) {
    *out = NULL;
    psv_model_params p = params ? *params : psv_model_default_params();
    if (p.n_threads <= 0) p.n_threads = psv_default_threads();
    psv_model *m = calloc(1, sizeof *m);
    if (!m) return err_set(err, PSV_ERR_NOMEM, "model: out of memory");
    pthread_mutex_init(&m->lock, NULL);
    psv_status st = gguf_open(path, &m->gguf, err);
    if (st == PSV_OK) {
        const gguf_file *f = m->gguf;
        uint64_t at = f->data_offset < f->size ? f->data_offset : f->size;
        plat_prefault_start(&m->prefault, f->base + at, f->size - (size_t)at);
    }
    if (st == PSV_OK) st = model_hparams(m, err);
    if (st == PSV_OK) st = model_weights(m, &m->vecs, err);
    if (st == PSV_OK) st = model_vocab_load(m, err);
    if (st == PSV_OK) st = pool_new(p.n_threads, &m->pool, err);
    if (st == PSV_OK) plat_map_release(&m->gguf->map, (size_t)m->gguf->data_offset); // read and copied
    if (st != PSV_OK) {
        if (m->gguf) err_prefix(err, "%s: ", path);
        psv_model_close(m);
        return st;
    }
    *out = m;
    return PSV_OK;
}

PSV_API int64_t psv_model_n_vocab(const psv_model *m) { return m->n_vocab; }
PSV_API int64_t psv_model_n_ctx_train(const psv_model *m) { return m->n_ctx_train; }
PSV_API int psv_model_n_threads(const psv_model *m) { return m->pool->n_threads; }
PSV_API const char *psv_model_arch(const psv_model *m) { return model_arch_names[m->arch]; }
PSV_API size_t psv_model_weight_bytes(const psv_model *m) { return m->weight_bytes; }

PSV_API psv_ctx_params psv_ctx_default_params(void) {
    psv_ctx_params p;
    memset(&p, 0, sizeof p);
    p.n_ctx = 0;
    p.n_batch = PSV_DEFAULT_BATCH;
    p.kv_type = PSV_KV_F32;
    return p;
}

PSV_API void psv_ctx_free(psv_ctx *c) {
    if (!c) return;
    kv_free(&c->kv);
    scratch_free(&c->s);
    free(c->items);
    free(c->logits);
    free(c);
}

PSV_API psv_status psv_ctx_new(psv_model *m, const psv_ctx_params *params, psv_ctx **out, psv_error *err) {
    *out = NULL;
    psv_ctx_params p = params ? *params : psv_ctx_default_params();
    if (p.n_ctx == 0) p.n_ctx = (uint32_t)PSV_MIN(m->n_ctx_train, 4096);
    if (p.n_ctx < 1 || p.n_ctx > (1u << 22))
        return err_set(err, PSV_ERR_INVALID, "ctx: n_ctx %u out of range (1..%u)", p.n_ctx, 1u << 22);
    if (p.n_batch == 0) p.n_batch = PSV_DEFAULT_BATCH;
    if (p.n_batch > p.n_ctx) p.n_batch = p.n_ctx;
    if (p.kv_type != PSV_KV_F32 && p.kv_type != PSV_KV_F16)
        return err_set(err, PSV_ERR_INVALID, "ctx: unknown KV cache type %d", (int)p.kv_type);
    psv_ctx *c = calloc(1, sizeof *c);
    if (!c) return err_set(err, PSV_ERR_NOMEM, "ctx: out of memory");
    c->m = m;
    c->p = p;
    psv_status st = kv_init(&c->kv, m, p.n_ctx, p.kv_type, err);
    if (st == PSV_OK) st = scratch_init(&c->s, m, p.n_batch, p.n_ctx, err);
    if (st == PSV_OK) {
        c->items = calloc(p.n_batch, sizeof *c->items);
        c->logits = malloc((size_t)m->n_vocab * sizeof(float));
        if (!c->items || !c->logits) st = err_set(err, PSV_ERR_NOMEM, "ctx: out of memory");
    }
    if (st != PSV_OK) {
        psv_ctx_free(c);
        return st;
    }
    *out = c;
    return PSV_OK;
}

PSV_API uint32_t psv_ctx_n_ctx(const psv_ctx *c) { return (uint32_t)c->kv.n_ctx; }
PSV_API uint32_t psv_ctx_n_past(const psv_ctx *c) { return (uint32_t)c->kv.n_past; }

PSV_API psv_status psv_ctx_truncate(psv_ctx *c, uint32_t n_keep, psv_error *err) {
    if (n_keep > c->kv.n_past)
        return err_set(err, PSV_ERR_INVALID, "ctx: cannot keep %u tokens, only %" PRId64 " are cached", n_keep, c->kv.n_past);
    c->kv.n_past = n_keep;
    c->have_logits = false;
    return PSV_OK;
}

// Evaluate tokens after the cached ones in chunks of n_batch. out_all, when not NULL, receives
// n * n_vocab logits (one row per token); the last token's logits are always kept in the ctx.
static psv_status ctx_eval(psv_ctx *c, const int32_t *tokens, size_t n, float *out_all, psv_error *err) {
    psv_model *m = c->m;
    if (n == 0) return PSV_OK;
    if ((uint64_t)n > (uint64_t)(c->kv.n_ctx - c->kv.n_past))
        return err_set(err, PSV_ERR_RANGE,
                       "ctx: %zu new tokens after %" PRId64 " cached exceed the context size %" PRId64,
                       n, c->kv.n_past, c->kv.n_ctx);
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->n_vocab)
            return err_set(err, PSV_ERR_INVALID, "ctx: token id %" PRId32 " at index %zu out of range (0..%" PRId64 ")",
                           tokens[i], i, m->n_vocab - 1);
    pthread_mutex_lock(&m->lock);
    for (size_t done = 0; done < n;) {
        int64_t k = (int64_t)PSV_MIN((size_t)c->s.n_batch, n - done);
        for (int64_t t = 0; t < k; t++) {
            fwd_item *it = &c->items[t];
            it->token = tokens[done + (size_t)t];
            it->pos = c->kv.n_past + t;
            it->kv = &c->kv;
            size_t idx = done + (size_t)t;
            it->logits = out_all ? out_all + idx * (size_t)m->n_vocab : (idx == n - 1 ? c->logits : NULL);
        }
        model_forward(m, &c->s, c->items, k);
        c->kv.n_past += k;
        done += (size_t)k;
    }
    pthread_mutex_unlock(&m->lock);
    if (out_all) memcpy(c->logits, out_all + (n - 1) * (size_t)m->n_vocab, (size_t)m->n_vocab * sizeof(float));
    c->have_logits = true;
    return PSV_OK;
}

PSV_API psv_status psv_eval(psv_ctx *c, const int32_t *tokens, size_t n, psv_error *err) {
    return ctx_eval(c, tokens, n, NULL, err);
}

PSV_API psv_status psv_eval_all_logits(psv_ctx *c, const int32_t *tokens, size_t n, float *logits, psv_error *err) {
    if (!logits) return err_set(err, PSV_ERR_INVALID, "ctx: logits buffer is NULL");
    return ctx_eval(c, tokens, n, logits, err);
}

PSV_API const float *psv_ctx_logits(const psv_ctx *c) { return c->have_logits ? c->logits : NULL; }

// ---- text: tokenizer and chat template of a model ----

// Load the tokenizer and recognise the chat template. A GGUF without tokenizer metadata still
// loads (token-id interfaces work); text interfaces then report that it has none.
static psv_status model_vocab_load(psv_model *m, psv_error *err) {
    str_t kind;
    if (!gguf_get_str(m->gguf, "tokenizer.ggml.model", &kind)) return PSV_OK;
    tok_vocab *v = NULL;
    psv_status st = tok_load(m->gguf, &v, err);
    if (st != PSV_OK) return st;
    if (tok_n_vocab(v) > m->n_vocab) {
        tok_free(v);
        return err_set(err, PSV_ERR_FORMAT,
                       "model: the tokenizer has %" PRId32 " tokens but token_embd.weight only %" PRId64 " rows",
                       tok_n_vocab(v), m->n_vocab);
    }
    m->vocab = v;
    str_t tmpl = {NULL, 0};
    gguf_get_str(m->gguf, "tokenizer.chat_template", &tmpl);
    bool recognised;
    m->chat_format = chat_detect(tmpl.p, tmpl.n, &recognised, &m->chat_warning);
    if (recognised) m->chat_warning = NULL;
    return PSV_OK;
}

static void model_vocab_free(psv_model *m) {
    tok_free(m->vocab);
    m->vocab = NULL;
}

static psv_status model_need_vocab(const psv_model *m, psv_error *err) {
    if (m->vocab) return PSV_OK;
    return err_set(err, PSV_ERR_UNSUPPORTED, "model: the file has no tokenizer (tokenizer.ggml.* metadata); use token ids");
}

PSV_API void psv_free(void *p) { free(p); }

PSV_API psv_status psv_tokenize(const psv_model *m, const char *text, size_t len, bool add_special, bool parse_special,
                                int32_t **ids, size_t *n_ids, psv_error *err) {
    *ids = NULL;
    *n_ids = 0;
    psv_status st = model_need_vocab(m, err);
    if (st != PSV_OK) return st;
    return tok_encode(m->vocab, text, len, add_special, parse_special, ids, n_ids, err);
}

PSV_API psv_status psv_chat_tokenize(const psv_model *m, const psv_chat_message *msgs, size_t n, bool add_generation_prompt,
                                     int32_t **ids, size_t *n_ids, psv_error *err) {
    *ids = NULL;
    *n_ids = 0;
    psv_status st = model_need_vocab(m, err);
    if (st != PSV_OK) return st;
    chat_msg *cm = malloc((n ? n : 1) * sizeof *cm);
    if (!cm) return err_set(err, PSV_ERR_NOMEM, "chat: out of memory");
    for (size_t i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].content) {
            free(cm);
            return err_set(err, PSV_ERR_INVALID, "chat: message %zu has no role or content", i);
        }
        cm[i] = chat_msg_c(msgs[i].role, msgs[i].content);
    }
    st = chat_tokenize(m->vocab, m->chat_format, cm, n, add_generation_prompt, ids, n_ids, err);
    free(cm);
    return st;
}

PSV_API const char *psv_model_chat_format(const psv_model *m, const char **warning) {
    if (warning) *warning = m->vocab ? m->chat_warning : NULL;
    return m->vocab ? chat_format_name(m->chat_format) : NULL;
}

PSV_API bool psv_token_is_eog(const psv_model *m, int32_t token) {
    return m->vocab && token >= 0 && token < tok_n_vocab(m->vocab) && tok_is_eog(m->vocab, token);
}

struct psv_token_decoder {
    const tok_vocab *v;
    tok_stream st;
    buf_t out;
};

PSV_API psv_status psv_token_decoder_new(const psv_model *m, psv_token_decoder **out, psv_error *err) {
    *out = NULL;
    psv_status st = model_need_vocab(m, err);
    if (st != PSV_OK) return st;
    psv_token_decoder *d = calloc(1, sizeof *d);
    if (!d) return err_set(err, PSV_ERR_NOMEM, "decoder: out of memory");
    d->v = m->vocab;
    tok_stream_init(&d->st);
    *out = d;
    return PSV_OK;
}

PSV_API const char *psv_token_decoder_push(psv_token_decoder *d, int32_t token, size_t *len) {
    d->out.len = 0;
    if (token >= 0 && token < tok_n_vocab(d->v)) tok_stream_push(&d->st, d->v, token, false, &d->out);
    *len = d->out.oom ? 0 : d->out.len;
    return d->out.data ? d->out.data : "";
}

PSV_API const char *psv_token_decoder_flush(psv_token_decoder *d, size_t *len) {
    d->out.len = 0;
    tok_stream_flush(&d->st, &d->out);
    *len = d->out.oom ? 0 : d->out.len;
    return d->out.data ? d->out.data : "";
}

PSV_API void psv_token_decoder_free(psv_token_decoder *d) {
    if (!d) return;
    buf_free(&d->out);
    free(d);
}

// ---- continuous batching (used by the server) ----

// One sequence's share of a batched forward pass: tokens appended to ctx, and whether the last
// one's logits are wanted (they land in the ctx, as after psv_eval).
typedef struct {
    psv_ctx *ctx;
    const int32_t *tokens;
    size_t n;
    bool logits;
} batch_seq;

// One forward pass over several contexts of the same model at once: each sequence's tokens go
// after its cached ones, all in a single pass over the weights, so n sequences cost about as
// much memory traffic as one. Caller guarantees: total tokens <= s->n_batch, items has room for
// them, every ctx has room for its tokens, ids are in range, and n_ctx <= s->n_ctx_max.
static void ctx_eval_batch(psv_model *m, fwd_scratch *s, fwd_item *items, batch_seq *seqs, size_t n_seqs) {
    int64_t n = 0;
    for (size_t i = 0; i < n_seqs; i++) {
        psv_ctx *c = seqs[i].ctx;
        for (size_t t = 0; t < seqs[i].n; t++, n++) {
            items[n].token = seqs[i].tokens[t];
            items[n].pos = c->kv.n_past + (int64_t)t;
            items[n].kv = &c->kv;
            items[n].logits = seqs[i].logits && t + 1 == seqs[i].n ? c->logits : NULL;
        }
    }
    PSV_ASSERT(n <= s->n_batch);
    if (n == 0) return;
    pthread_mutex_lock(&m->lock);
    model_forward(m, s, items, n);
    pthread_mutex_unlock(&m->lock);
    for (size_t i = 0; i < n_seqs; i++) {
        seqs[i].ctx->kv.n_past += (int64_t)seqs[i].n;
        if (seqs[i].logits && seqs[i].n) seqs[i].ctx->have_logits = true;
    }
}


// ----------------------------------------------------------------------------
// 17. Model tools
// `pensieve mkmodel` writes GGUF models with random weights for any supported architecture,
// shape and tensor type, with a byte-level BPE tokenizer and a chat template, so engines can be
// benchmarked without downloading real weights. `pensieve bench` measures prompt processing and
// generation speed, memory bandwidth, peak memory and warm start time. Neither asserts anything
// about speed: they report.


// ---- shared helpers ---------------------------------------------------------------------------

// splitmix64 (Steele, Lea, Flood: "Fast splittable pseudorandom number generators", 2014): one
// 64-bit state, full period, passes BigCrush; fast enough to produce gigabytes of weights.
static inline uint64_t tools_rng(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Uniform in [0, 1) with 24 bits.
static inline float tools_rng_f32(uint64_t *s) { return (float)(tools_rng(s) >> 40) * (1.0f / 16777216.0f); }

// FNV-1a over a string: derives a per-tensor seed from its name.
static uint64_t tools_fnv(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
    return h;
}

// Whole-string numbers for flags (the CLI helpers of section 20 come later in the file).
// "1,2,4": at most `max` values, each in [lo, hi].
static bool tools_parse_list(const char *s, int64_t lo, int64_t hi, int64_t *out, int max, int *n) {
    *n = 0;
    if (!s || !*s) return false;
    char tmp[32];
    while (*s) {
        const char *c = strchr(s, ',');
        size_t len = c ? (size_t)(c - s) : strlen(s);
        if (len == 0 || len >= sizeof tmp || *n == max) return false;
        memcpy(tmp, s, len);
        tmp[len] = 0;
        if (!str_to_i64(tmp, lo, hi, &out[*n])) return false;
        (*n)++;
        s += len;
        if (*s == ',' && !*++s) return false;
    }
    return true;
}

static bool tools_ieq(const char *a, const char *b) {
    for (; *a && *b; a++, b++)
        if (tolower((unsigned char)*a) != tolower((unsigned char)*b)) return false;
    return *a == *b;
}

// "1.23 GiB" style sizes for humans.
static const char *tools_bytes(char out[32], double b) {
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024.0 && u < 4) b /= 1024.0, u++;
    snprintf(out, 32, u ? "%.2f %s" : "%.0f %s", b, unit[u]);
    return out;
}

// "494.03 M", "3.84 B"
static const char *tools_count(char out[32], double n) {
    if (n >= 1e9) snprintf(out, 32, "%.2f B", n * 1e-9);
    else if (n >= 1e6) snprintf(out, 32, "%.2f M", n * 1e-6);
    else snprintf(out, 32, "%.2f K", n * 1e-3);
    return out;
}

// ---- mkmodel: shapes and presets ----------------------------------------------------------------

#define MK_N_INT 11 // integer shape fields, in mk_shape order

typedef struct {
    // the integer fields first, in the order of mk_int_flags
    int64_t n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab, head_dim, n_rot, n_ctx, n_ctx_orig, rot_pct;
    model_arch arch;
    float rope_base, norm_eps;
    bool tied;
} mk_shape;

static const struct {
    const char *flag;
    size_t off;
    int64_t lo, hi;
} mk_int_flags[MK_N_INT] = {
    {"--embd", offsetof(mk_shape, n_embd), 1, 1 << 20},
    {"--layers", offsetof(mk_shape, n_layer), 1, 4096}, // the engine's limit on block_count
    {"--heads", offsetof(mk_shape, n_head), 1, 4096},
    {"--kv-heads", offsetof(mk_shape, n_head_kv), 1, 4096},
    {"--ffn", offsetof(mk_shape, n_ff), 1, 1 << 22},
    {"--vocab", offsetof(mk_shape, n_vocab), 257, 1 << 24},
    {"--head-dim", offsetof(mk_shape, head_dim), 2, 1024},
    {"--rope-dims", offsetof(mk_shape, n_rot), 2, 1024},
    {"--ctx", offsetof(mk_shape, n_ctx), 1, 1 << 24},
    {"--orig-ctx", offsetof(mk_shape, n_ctx_orig), 1, 1 << 24},
    {"--rot-pct", offsetof(mk_shape, rot_pct), 1, 100},
};

static int64_t *mk_field(mk_shape *s, int k) { return (int64_t *)((char *)s + mk_int_flags[k].off); }

// Shapes of public models (their config.json). 0 in head_dim / n_rot means "derive":
// head_dim = n_embd / n_head, n_rot = head_dim * rot_pct / 100.
static const struct {
    const char *name;
    mk_shape s;
} mk_presets[] = {
    // microsoft/Phi-4-mini-instruct: LongRoPE (short/long factors, original context 4096),
    // partial_rotary_factor 0.75, tied embeddings.
    {"phi4-mini", {3072, 32, 24, 8, 8192, 200064, 0, 0, 131072, 4096, 75, ARCH_PHI3, 10000.0f, 1e-5f, true}},
    // meta-llama/Llama-3.2-1B-Instruct (its llama3 rope scaling is left out: the engine has none).
    {"llama-1b", {2048, 16, 32, 8, 8192, 128256, 0, 0, 131072, 0, 100, ARCH_LLAMA, 500000.0f, 1e-5f, true}},
    // Qwen/Qwen2.5-0.5B-Instruct: q/k/v biases, tied embeddings; 896 is not a multiple of 256.
    {"qwen2-0.5b", {896, 24, 14, 2, 4864, 151936, 0, 0, 32768, 0, 100, ARCH_QWEN2, 1000000.0f, 1e-6f, true}},
    // Qwen/Qwen3-0.6B: head_dim 128 (not 1024/16), q/k RMS norms, tied embeddings.
    {"qwen3-0.6b", {1024, 28, 16, 8, 3072, 151936, 128, 0, 40960, 0, 100, ARCH_QWEN3, 1000000.0f, 1e-6f, true}},
};

// Architecture defaults when no preset gives them.
static void mk_arch_defaults(mk_shape *s) {
    switch (s->arch) {
    case ARCH_LLAMA: s->rope_base = 500000.0f; s->norm_eps = 1e-5f; s->rot_pct = 100; break;
    case ARCH_PHI3: s->rope_base = 10000.0f; s->norm_eps = 1e-5f; s->rot_pct = 100; break;
    case ARCH_QWEN2:
    case ARCH_QWEN3: s->rope_base = 1000000.0f; s->norm_eps = 1e-6f; s->rot_pct = 100; break;
    case ARCH_PHI2: s->rope_base = 10000.0f; s->norm_eps = 1e-5f; s->rot_pct = 40; break; // phi-2: 32 of 80
    }
    s->n_ctx = 4096;
}

// ---- mkmodel: tensor types ----------------------------------------------------------------------
// --type names a single tensor type or one of the GGUF ecosystem's k-quant mixes. Unless --pure,
// the conventional adjustments apply: the output matrix (or the token embeddings when they are
// tied to it) is Q6_K for quantized types (Q8_0 when its rows are not whole 256-blocks); the _M
// mixes give attn_v (or the fused attn_qkv) and ffn_down Q6_K in the layers "use_more_bits"
// picks; the _S mixes give the first layers a step more. Rows that are not whole blocks of the
// chosen type fall back to a 32-block type (as quantizers do for such models), then to F16.

typedef enum { MK_MIX_NONE, MK_MIX_K_S, MK_MIX_K_M } mk_mix;

static const struct {
    const char *name;
    uint32_t base;
    mk_mix mix;
    uint32_t file_type; // general.file_type: the ecosystem's llama_ftype numbering
} mk_ftypes[] = {
    {"F32", T_F32, MK_MIX_NONE, 0},      {"F16", T_F16, MK_MIX_NONE, 1},       {"BF16", T_BF16, MK_MIX_NONE, 32},
    {"Q4_0", T_Q4_0, MK_MIX_NONE, 2},    {"Q4_1", T_Q4_1, MK_MIX_NONE, 3},     {"Q5_0", T_Q5_0, MK_MIX_NONE, 8},
    {"Q5_1", T_Q5_1, MK_MIX_NONE, 9},    {"Q8_0", T_Q8_0, MK_MIX_NONE, 7},     {"Q2_K", T_Q2_K, MK_MIX_NONE, 10},
    {"Q3_K", T_Q3_K, MK_MIX_NONE, 11},   {"Q4_K", T_Q4_K, MK_MIX_NONE, 14},    {"Q5_K", T_Q5_K, MK_MIX_NONE, 16},
    {"Q6_K", T_Q6_K, MK_MIX_NONE, 18},   {"Q4_K_S", T_Q4_K, MK_MIX_K_S, 14},   {"Q4_K_M", T_Q4_K, MK_MIX_K_M, 15},
    {"Q5_K_S", T_Q5_K, MK_MIX_K_S, 16},  {"Q5_K_M", T_Q5_K, MK_MIX_K_M, 17},
};

typedef enum { MK_ROLE_OTHER, MK_ROLE_EMBD, MK_ROLE_OUTPUT, MK_ROLE_ATTN_V, MK_ROLE_FFN_DOWN } mk_role;

static bool mk_is_float(uint32_t t) { return t == T_F32 || t == T_F16 || t == T_BF16; }

// The layers that get more bits in the _M mixes: the first and last eighth, and every third
// layer in between.
static bool mk_more_bits(int64_t i, int64_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

// The type a 2-D tensor gets before the row-length fallback.
static uint32_t mk_pick_type(int ft, bool pure, bool tied, mk_role role, int64_t il, int64_t n_layer, uint64_t row) {
    uint32_t base = mk_ftypes[ft].base;
    mk_mix mix = mk_ftypes[ft].mix;
    if (pure || mk_is_float(base)) return base;
    if (role == MK_ROLE_OUTPUT || (role == MK_ROLE_EMBD && tied))
        return row % QK_K || base == T_Q8_0 ? T_Q8_0 : T_Q6_K;
    if (mix == MK_MIX_K_M && (role == MK_ROLE_ATTN_V || role == MK_ROLE_FFN_DOWN) && mk_more_bits(il, n_layer))
        return T_Q6_K;
    if (mix == MK_MIX_K_S && base == T_Q4_K &&
        ((role == MK_ROLE_FFN_DOWN && il < n_layer / 8) || (role == MK_ROLE_ATTN_V && il < 4)))
        return T_Q5_K;
    return base;
}

// The replacement for a type whose block does not divide the row length.
static uint32_t mk_fallback_type(uint32_t t, uint64_t row) {
    const type_info *ti = type_get(t);
    if (row % ti->blck_size == 0) return t;
    uint32_t r;
    switch (t) {
    case T_Q2_K: case T_Q3_K: r = T_Q4_0; break; // the ecosystem uses IQ4_NL, which pensieve lacks
    case T_Q4_K: r = T_Q5_0; break;
    case T_Q5_K: r = T_Q5_1; break;
    case T_Q6_K: r = T_Q8_0; break;
    default: r = T_F16; break;
    }
    return row % type_get(r)->blck_size == 0 ? r : T_F16;
}

// ---- mkmodel: tokenizer --------------------------------------------------------------------------
// A byte-level BPE vocabulary ("gpt2"): ids 0..255 are the bytes, then tokens made by merges,
// then the family's special tokens at the end. Each merged token joins two earlier tokens into a
// new, unique string: a left part (a space, a letter, or an earlier merged token) and a right
// part (a run of lowercase letters), so ordinary English text tokenizes into word pieces and
// every merge's operands exist before it (rank order = id order).

typedef struct {
    const char *pre;             // tokenizer.ggml.pre
    const char *const *special;  // texts, appended at the end of the vocabulary
    const int32_t *special_type; // token_type of each (3 control, 4 user-defined)
    int n_special;
    int bos, eos, eot;           // indexes into special (-1: none)
    bool add_bos;
    const char *chat_template;
} mk_tok_family;

static const char *const mk_sp_llama3[] = {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                           "<|end_header_id|>", "<|eot_id|>"};
static const int32_t mk_ty_llama3[] = {3, 3, 3, 3, 3};
static const char *const mk_sp_phi4[] = {"<|endoftext|>", "<|assistant|>", "<|end|>", "<|system|>", "<|user|>"};
static const int32_t mk_ty_phi4[] = {3, 3, 3, 3, 3};
static const char *const mk_sp_chatml[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"};
static const int32_t mk_ty_chatml[] = {3, 3, 3, 4, 4};

// Templates written for these vocabularies; each is recognised by section 10 and is plain
// Jinja that other runtimes can execute.
static const char mk_tmpl_llama3[] =
    "{{- bos_token }}{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}";
static const char mk_tmpl_phi4[] =
    "{% for message in messages %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}";
static const char mk_tmpl_chatml[] =
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";
// Qwen3's thinking rule in short: assistant turns before the last user query lose their
// <think>...</think> block.
static const char mk_tmpl_qwen3[] =
    "{%- set ns = namespace(last_query_index=0) %}{%- for message in messages %}{%- if message['role'] == 'user' %}"
    "{%- set ns.last_query_index = loop.index0 %}{%- endif %}{%- endfor %}{%- for message in messages %}"
    "{%- set content = message['content'] %}{%- if message['role'] == 'assistant' and loop.index0 < "
    "ns.last_query_index and '</think>' in content %}{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}{{- '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

static mk_tok_family mk_family(model_arch a) {
    switch (a) {
    case ARCH_LLAMA: return (mk_tok_family){"llama-bpe", mk_sp_llama3, mk_ty_llama3, 5, 0, 4, 4, true, mk_tmpl_llama3};
    case ARCH_PHI3: return (mk_tok_family){"gpt-4o", mk_sp_phi4, mk_ty_phi4, 5, 0, 0, 2, false, mk_tmpl_phi4};
    case ARCH_QWEN2: return (mk_tok_family){"qwen2", mk_sp_chatml, mk_ty_chatml, 3, 0, 2, 2, false, mk_tmpl_chatml};
    case ARCH_QWEN3: return (mk_tok_family){"qwen2", mk_sp_chatml, mk_ty_chatml, 5, 0, 2, 2, false, mk_tmpl_qwen3};
    case ARCH_PHI2: break;
    }
    return (mk_tok_family){"gpt-2", mk_sp_chatml, mk_ty_chatml, 3, 0, 0, 2, false, mk_tmpl_chatml};
}

typedef struct {
    int32_t n_regular; // byte tokens + merged tokens
    buf_t raw;         // raw bytes of tokens [0, n_regular), concatenated
    uint32_t *off;     // n_regular + 1
    int32_t *ml, *mr;  // operands of merged token 256 + k
    int32_t *tab;      // open addressing raw text -> id, -1 empty
    size_t cap;
} mk_vocab;

static void mk_vocab_free(mk_vocab *v) {
    if (!v) return;
    buf_free(&v->raw);
    free(v->off);
    free(v->ml);
    free(v->mr);
    free(v->tab);
    memset(v, 0, sizeof *v);
}

static const char *mk_tok_raw(const mk_vocab *v, int32_t id, size_t *len) {
    *len = v->off[id + 1] - v->off[id];
    return v->raw.data + v->off[id];
}

// The slot of `s` in the hash table: its id's slot, or the empty slot where it would go.
static size_t mk_vocab_slot(const mk_vocab *v, const char *s, size_t n) {
    size_t i = (size_t)tools_fnv(s, n) & (v->cap - 1);
    for (;;) {
        int32_t id = v->tab[i];
        if (id < 0) return i;
        size_t len;
        const char *t = mk_tok_raw(v, id, &len);
        if (len == n && memcmp(t, s, n) == 0) return i;
        i = (i + 1) & (v->cap - 1);
    }
}

static void mk_vocab_push(mk_vocab *v, const char *s, size_t n, size_t slot) {
    int32_t id = v->n_regular++;
    buf_append(&v->raw, s, n);
    v->off[id + 1] = (uint32_t)v->raw.len;
    v->tab[slot] = id;
}

// An index in [0, n) biased toward the start (density 1/(2 sqrt(x/n))): early, short tokens are
// the operands of most merges, as in trained vocabularies.
static size_t mk_biased(uint64_t *rng, size_t n) {
    uint64_t u = tools_rng(rng) >> 40; // 24 bits
    return (size_t)(((uint64_t)n * ((u * u) >> 24)) >> 24);
}

#define MK_TOKEN_MAX 16 // longest merged token, in bytes

static psv_status mk_vocab_build(mk_vocab *v, int32_t n_regular, uint64_t seed, psv_error *err) {
    memset(v, 0, sizeof *v);
    psv_status st = PSV_OK;
    int32_t *L = NULL, *R = NULL;
    size_t nl = 0, nr = 0;
    v->cap = 16;
    while (v->cap < 2 * (size_t)n_regular) v->cap *= 2;
    v->off = malloc(((size_t)n_regular + 1) * sizeof *v->off);
    v->ml = malloc((size_t)n_regular * sizeof *v->ml);
    v->mr = malloc((size_t)n_regular * sizeof *v->mr);
    v->tab = malloc(v->cap * sizeof *v->tab);
    L = malloc((size_t)n_regular * sizeof *L);
    R = malloc((size_t)n_regular * sizeof *R);
    if (!v->off || !v->ml || !v->mr || !v->tab || !L || !R) goto oom;
    memset(v->tab, 0xff, v->cap * sizeof *v->tab);
    v->off[0] = 0;
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        mk_vocab_push(v, &c, 1, mk_vocab_slot(v, &c, 1));
    }
    L[nl++] = ' ';
    for (int c = 'A'; c <= 'Z'; c++) L[nl++] = c;
    for (int c = 'a'; c <= 'z'; c++) L[nl++] = c, R[nr++] = c;
    uint64_t rng = seed ^ 0x746f6b656e73ull, tries = 0;
    char tmp[2 * MK_TOKEN_MAX];
    while (v->n_regular < n_regular) {
        if (++tries > 64 * (uint64_t)n_regular + 1000000) {
            st = err_set(err, PSV_ERR_RANGE, "mkmodel: vocabulary: cannot find %d distinct tokens", n_regular);
            goto done;
        }
        int32_t l = L[mk_biased(&rng, nl)], r = R[mk_biased(&rng, nr)];
        size_t ln, rn;
        const char *ls = mk_tok_raw(v, l, &ln), *rs = mk_tok_raw(v, r, &rn);
        if (ln + rn > MK_TOKEN_MAX) continue;
        memcpy(tmp, ls, ln);
        memcpy(tmp + ln, rs, rn);
        size_t slot = mk_vocab_slot(v, tmp, ln + rn);
        if (v->tab[slot] >= 0) continue;
        int32_t id = v->n_regular;
        v->ml[id - 256] = l;
        v->mr[id - 256] = r;
        mk_vocab_push(v, tmp, ln + rn, slot);
        L[nl++] = id;
        if (tmp[0] >= 'a' && tmp[0] <= 'z') R[nr++] = id;
    }
    if (v->raw.oom) goto oom;
    goto done;
oom:
    st = err_set(err, PSV_ERR_NOMEM, "mkmodel: out of memory building the vocabulary");
done:
    free(R);
    free(L);
    return st;
}

// Appends raw bytes spelled as GPT-2 byte characters.
static void mk_put_mapped(buf_t *b, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint8_t enc[4];
        buf_append(b, enc, utf8_encode(bpe_byte_to_cp((uint8_t)s[i]), enc));
    }
}

// Writes the tokenizer.* keys.
static psv_status mk_write_tokenizer(gguf_writer *w, const mk_shape *s, uint64_t seed, psv_error *err) {
    psv_status st;
    mk_tok_family fam = mk_family(s->arch);
    int32_t n = (int32_t)s->n_vocab, n_reg = n - fam.n_special;
    mk_vocab v;
    buf_t text = {0}, mtext = {0};
    uint32_t *toff = NULL, *moff = NULL;
    str_t *strs = NULL;
    int32_t *types = NULL;
    if ((st = mk_vocab_build(&v, n_reg, seed, err))) goto done;
    int32_t n_merges = n_reg - 256;
    toff = malloc(((size_t)n + 1) * sizeof *toff);
    moff = malloc(((size_t)n_merges + 1) * sizeof *moff);
    strs = malloc((size_t)n * sizeof *strs);
    types = malloc((size_t)n * sizeof *types);
    if (!toff || !moff || !strs || !types) goto oom;
    toff[0] = moff[0] = 0;
    for (int32_t i = 0; i < n; i++) {
        if (i < n_reg) {
            size_t len;
            const char *raw = mk_tok_raw(&v, i, &len);
            mk_put_mapped(&text, raw, len);
            types[i] = 1;
        } else {
            buf_puts(&text, fam.special[i - n_reg]);
            types[i] = fam.special_type[i - n_reg];
        }
        toff[i + 1] = (uint32_t)text.len;
    }
    for (int32_t k = 0; k < n_merges; k++) {
        size_t len;
        const char *p = mk_tok_raw(&v, v.ml[k], &len);
        mk_put_mapped(&mtext, p, len);
        buf_putc(&mtext, ' ');
        p = mk_tok_raw(&v, v.mr[k], &len);
        mk_put_mapped(&mtext, p, len);
        moff[k + 1] = (uint32_t)mtext.len;
    }
    if (text.oom || mtext.oom) goto oom;
    gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_w_str(w, "tokenizer.ggml.pre", fam.pre);
    for (int32_t i = 0; i < n; i++) strs[i] = (str_t){text.data + toff[i], toff[i + 1] - toff[i]};
    gguf_w_arr_strn(w, "tokenizer.ggml.tokens", strs, (uint64_t)n);
    gguf_w_arr(w, "tokenizer.ggml.token_type", GGUF_T_INT32, types, (uint64_t)n);
    for (int32_t k = 0; k < n_merges; k++) strs[k] = (str_t){mtext.data + moff[k], moff[k + 1] - moff[k]};
    gguf_w_arr_strn(w, "tokenizer.ggml.merges", strs, (uint64_t)n_merges);
    gguf_w_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)(n_reg + fam.bos));
    gguf_w_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)(n_reg + fam.eos));
    if (fam.eot >= 0 && fam.eot != fam.eos) gguf_w_u32(w, "tokenizer.ggml.eot_token_id", (uint32_t)(n_reg + fam.eot));
    if (!strcmp(fam.special[0], "<|endoftext|>")) gguf_w_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)n_reg);
    gguf_w_bool(w, "tokenizer.ggml.add_bos_token", fam.add_bos);
    gguf_w_bool(w, "tokenizer.ggml.add_eos_token", false);
    gguf_w_str(w, "tokenizer.chat_template", fam.chat_template);
    goto done;
oom:
    st = err_set(err, PSV_ERR_NOMEM, "mkmodel: out of memory writing the vocabulary");
done:
    free(types);
    free(strs);
    free(moff);
    free(toff);
    buf_free(&mtext);
    buf_free(&text);
    mk_vocab_free(&v);
    return st;
}

// ---- mkmodel: weights ------------------------------------------------------------------------------
// Matrices are written block by block through gguf_w_tensor_fn, so memory stays flat whatever
// the model size. Quantized blocks start from a pool of real blocks (random normal values with
// standard deviation 0.02, quantized by section 11's reference quantizers), which gives sane
// scales; each copy then gets fresh random quant bits, so every block is distinct and still
// valid. Float matrices get random values of magnitude 2^-7..2^-5 directly from random bits.
// Norm weights are ~1, biases small, rope factors smooth ramps: the forward pass stays finite.

#define MK_POOL_BLOCKS 256      // distinct scale sets per quantized type (a power of two)
#define MK_CHUNK (1u << 20)     // bytes generated per sink write

typedef enum { MK_MATRIX, MK_NORM, MK_BIAS, MK_ROPE_LONG, MK_ROPE_SHORT } mk_kind;

typedef struct mk_state mk_state;

typedef struct {
    char name[64];
    uint32_t type, n_dims;
    uint64_t ne[2];
    mk_kind kind;
    uint64_t seed;
    mk_state *st;
} mk_tensor;

struct mk_state {
    uint64_t seed;
    uint8_t *pool[T_COUNT]; // MK_POOL_BLOCKS blocks of a type, built on first use
    uint8_t *chunk;         // MK_CHUNK bytes
};

static void mk_state_free(mk_state *st) {
    if (!st) return;
    for (int t = 0; t < T_COUNT; t++) free(st->pool[t]);
    free(st->chunk);
    memset(st, 0, sizeof *st);
}

// The bytes of a block that hold quant bits (random bits are valid there) rather than the
// fp16/int8 scales taken from the pool; layouts as in section 11 (K_*_SIZE).
static void mk_payload(uint32_t type, size_t *lo, size_t *hi) {
    switch (type) {
    case T_Q4_0: *lo = 2, *hi = 18; break;   // d | qs[16]
    case T_Q4_1: *lo = 4, *hi = 20; break;   // d m | qs[16]
    case T_Q5_0: *lo = 2, *hi = 22; break;   // d | qh[4] qs[16]
    case T_Q5_1: *lo = 4, *hi = 24; break;   // d m | qh[4] qs[16]
    case T_Q8_0: *lo = 2, *hi = 34; break;   // d | qs[32]
    case T_Q2_K: *lo = 0, *hi = 80; break;   // scales[16] qs[64] (4-bit scale/min pairs) | d dmin
    case T_Q3_K: *lo = 0, *hi = 96; break;   // hmask[32] qs[64] | scales[12] d
    case T_Q4_K: *lo = 4, *hi = 144; break;  // d dmin | scales[12] qs[128] (6-bit scales/mins)
    case T_Q5_K: *lo = 4, *hi = 176; break;  // d dmin | scales[12] qh[32] qs[128]
    case T_Q6_K: *lo = 0, *hi = 192; break;  // ql[128] qh[64] | scales[16] d
    default: *lo = *hi = 0; break;
    }
}

static const uint8_t *mk_pool(mk_state *st, uint32_t type, psv_error *err) {
    if (st->pool[type]) return st->pool[type];
    const type_info *ti = type_get(type);
    const k_traits *tr = k_traits_ref(type);
    size_t nv = (size_t)MK_POOL_BLOCKS * ti->blck_size;
    float *x = malloc(nv * sizeof *x);
    uint8_t *p = malloc((size_t)MK_POOL_BLOCKS * ti->type_size);
    if (!x || !p || !tr) {
        free(x);
        free(p);
        err_set(err, PSV_ERR_NOMEM, "mkmodel: out of memory for %s blocks", ti->name);
        return NULL;
    }
    uint64_t rng = st->seed ^ (0x706f6f6cull + type);
    // Irwin-Hall: the sum of 4 uniforms, centred and scaled, is close to normal (sd 0.02). One
    // draw per statement: the order of calls within an expression is unspecified, and the file
    // must not depend on the compiler.
    for (size_t i = 0; i < nv; i++) {
        float u = tools_rng_f32(&rng);
        u += tools_rng_f32(&rng);
        u += tools_rng_f32(&rng);
        u += tools_rng_f32(&rng);
        x[i] = (u - 2.0f) * (0.02f * 1.7320508f);
    }
    tr->from_float(x, p, (int64_t)nv);
    free(x);
    st->pool[type] = p;
    return p;
}

// n random blocks (or values, for float types) of `type` into dst.
static void mk_blocks(const uint8_t *pool, uint32_t type, uint8_t *dst, size_t n, uint64_t *rng) {
    if (type == T_F32) {
        // sign, exponent 2^-7 or 2^-6, 23 random mantissa bits: two values per draw
        for (size_t i = 0; i < n; i += 2) {
            uint64_t r = tools_rng(rng);
            for (size_t k = 0; k < 2 && i + k < n; k++, r >>= 32)
                wr_u32(dst + 4 * (i + k), (uint32_t)(r & 0x807fffffu) | ((120u + ((uint32_t)r >> 23 & 1)) << 23));
        }
        return;
    }
    if (type == T_F16 || type == T_BF16) {
        bool bf = type == T_BF16;
        for (size_t i = 0; i < n; i += 4) {
            uint64_t r = tools_rng(rng);
            for (size_t k = 0; k < 4 && i + k < n; k++, r >>= 16) {
                uint16_t h = bf ? (uint16_t)((r & 0x807f) | ((120u + (r >> 7 & 1)) << 7))
                                : (uint16_t)((r & 0x83ff) | ((8u + (r >> 10 & 1)) << 10));
                wr_u16(dst + 2 * (i + k), h);
            }
        }
        return;
    }
    const type_info *ti = type_get(type);
    size_t bs = ti->type_size, lo, hi;
    mk_payload(type, &lo, &hi);
    for (size_t b = 0; b < n; b++) {
        uint8_t *d = dst + b * bs;
        uint64_t r = tools_rng(rng);
        memcpy(d, pool + (size_t)(r & (MK_POOL_BLOCKS - 1)) * bs, bs);
        size_t j = lo;
        for (; j + 8 <= hi; j += 8) wr_u64(d + j, tools_rng(rng));
        if (j < hi) {
            uint8_t t[8];
            wr_u64(t, tools_rng(rng));
            memcpy(d + j, t, hi - j);
        }
        if (type == T_Q8_0) // the reference quantizer never makes -128; SIMD sign tricks assume that
            for (j = lo; j < hi; j++)
                if (d[j] == 0x80) d[j] = 0x81;
    }
}

// The value of element i of a 1-D tensor.
static float mk_vector_value(const mk_tensor *mt, uint64_t i, uint64_t *rng) {
    float x = mt->ne[0] > 1 ? (float)i / (float)(mt->ne[0] - 1) : 0.0f;
    switch (mt->kind) {
    case MK_NORM: return 1.0f + 0.1f * (tools_rng_f32(rng) - 0.5f);
    case MK_BIAS: return 0.04f * (tools_rng_f32(rng) - 0.5f);
    case MK_ROPE_LONG: return 1.0f + 39.0f * x * x; // LongRoPE: low frequencies stretched most
    case MK_ROPE_SHORT: return 1.0f + 0.25f * x * x * x;
    case MK_MATRIX: break;
    }
    return 0.0f;
}

static psv_status mk_fill(void *user, const gguf_tensor *t, gguf_sink *out, psv_error *err) {
    mk_tensor *mt = user;
    mk_state *st = mt->st;
    uint64_t rng = mt->seed;
    if (mt->kind != MK_MATRIX) { // F32 vectors
        uint64_t n = t->ne[0];
        for (uint64_t i = 0; i < n && !out->failed;) {
            size_t k = 0;
            for (; k < MK_CHUNK / 4 && i < n; k++, i++) wr_u32(st->chunk + 4 * k, f32_bits(mk_vector_value(mt, i, &rng)));
            gguf_sink_write(out, st->chunk, 4 * k);
        }
        return PSV_OK;
    }
    const type_info *ti = type_get(t->type);
    const uint8_t *pool = NULL;
    if (!mk_is_float(t->type) && !(pool = mk_pool(st, t->type, err))) return PSV_ERR_NOMEM;
    uint64_t n_blocks = t->size / ti->type_size, per = MK_CHUNK / ti->type_size;
    for (uint64_t done = 0; done < n_blocks && !out->failed;) {
        size_t k = (size_t)PSV_MIN(per, n_blocks - done);
        mk_blocks(pool, t->type, st->chunk, k, &rng);
        gguf_sink_write(out, st->chunk, k * ti->type_size);
        done += k;
    }
    return PSV_OK;
}

// ---- mkmodel: the model ----------------------------------------------------------------------------

typedef struct {
    mk_shape s;
    int ftype;      // index into mk_ftypes
    const char *preset; // for general.name, or NULL
    bool pure;
    uint64_t seed;
    const char *name; // general.name (NULL: derived)
} mk_config;

// A row-length fallback: `count` matrices with rows of `row` values stored as `to`, not `from`.
typedef struct {
    uint32_t from, to;
    uint64_t row, count;
} mk_fb;

// What was written, for the summary.
typedef struct {
    uint64_t n_tensors, params, bytes;
    uint64_t type_tensors[T_COUNT], type_bytes[T_COUNT];
    mk_fb fb[16];
    int n_fb;
} mk_report;

typedef struct {
    mk_tensor *t;
    size_t n, cap;
    bool oom;
} mk_list;

static void mk_add(mk_list *l, mk_state *st, mk_report *rep, mk_kind kind, uint32_t type, uint64_t ne0, uint64_t ne1,
                   const char *fmt, int64_t il) {
    if (l->oom) return;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        mk_tensor *p = realloc(l->t, cap * sizeof *p);
        if (!p) {
            l->oom = true;
            return;
        }
        l->t = p;
        l->cap = cap;
    }
    mk_tensor *t = &l->t[l->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, fmt, (int)il);
    t->kind = kind;
    t->n_dims = ne1 ? 2 : 1;
    t->ne[0] = ne0;
    t->ne[1] = ne1 ? ne1 : 1;
    uint32_t ft = kind == MK_MATRIX ? mk_fallback_type(type, ne0) : T_F32;
    if (ft != type && kind == MK_MATRIX) {
        int k = 0;
        while (k < rep->n_fb && !(rep->fb[k].from == type && rep->fb[k].to == ft && rep->fb[k].row == ne0)) k++;
        if (k < (int)PSV_ARRAY_LEN(rep->fb)) {
            if (k == rep->n_fb) rep->fb[rep->n_fb++] = (mk_fb){type, ft, ne0, 0};
            rep->fb[k].count++;
        }
    }
    t->type = ft;
    t->seed = st->seed ^ tools_fnv(t->name, strlen(t->name));
    t->st = st;
}

// Every tensor of the architecture, named and shaped as GGUF loaders expect (weights are
// [n_in, n_out]: ne[0] is the row length).
static void mk_tensors(const mk_config *c, mk_list *l, mk_state *st, mk_report *rep) {
    const mk_shape *s = &c->s;
    const uint64_t E = (uint64_t)s->n_embd, F = (uint64_t)s->n_ff, V = (uint64_t)s->n_vocab, hd = (uint64_t)s->head_dim;
    const uint64_t nq = (uint64_t)s->n_head * hd, nkv = (uint64_t)s->n_head_kv * hd;
    const int64_t NL = s->n_layer;
    const bool phi2 = s->arch == ARCH_PHI2, fused = s->arch == ARCH_PHI3 || phi2;
#define TYPE(role, il, row) mk_pick_type(c->ftype, c->pure, s->tied, role, il, NL, row)
    mk_add(l, st, rep, MK_MATRIX, TYPE(MK_ROLE_EMBD, 0, E), E, V, "token_embd.weight", 0);
    if (s->arch == ARCH_PHI3) {
        mk_add(l, st, rep, MK_ROPE_LONG, T_F32, (uint64_t)s->n_rot / 2, 0, "rope_factors_long.weight", 0);
        mk_add(l, st, rep, MK_ROPE_SHORT, T_F32, (uint64_t)s->n_rot / 2, 0, "rope_factors_short.weight", 0);
    }
    for (int64_t il = 0; il < NL; il++) {
        mk_add(l, st, rep, MK_NORM, T_F32, E, 0, "blk.%d.attn_norm.weight", il);
        if (phi2) mk_add(l, st, rep, MK_BIAS, T_F32, E, 0, "blk.%d.attn_norm.bias", il);
        if (fused) {
            mk_add(l, st, rep, MK_MATRIX, TYPE(MK_ROLE_ATTN_V, il, E), E, nq + 2 * nkv, "blk.%d.attn_qkv.weight", il);
            if (phi2) mk_add(l, st, rep, MK_BIAS, T_F32, nq + 2 * nkv, 0, "blk.%d.attn_qkv.bias", il);
        } else {
            mk_add(l, st, rep, MK_MATRIX, TYPE(MK_ROLE_OTHER, il, E), E, nq, "blk.%d.attn_q.weight", il);
            mk_add(l, st, rep, MK_MATRIX, TYPE(MK_ROLE_OTHER, il, E), E, nkv, "blk.%d.attn_k.weight", il);
            mk_add(l, st, rep, MK_MATRIX, TYPE(MK_ROLE_ATTN_V, il, E), E, nkv, "blk.%d.attn_v.weight", il);
            if (s->arch == ARCH_QWEN2) {
                mk_add(l, st, rep, MK_BIAS, T_F32, nq, 0, "blk.%d.attn_q.bias", il);
                mk_add(l, st, rep, MK_BIAS, T_F32, nkv, 0, "blk.%d.attn_k.bias", il);
                mk_add(l, st, rep, MK_BIAS, T_F32, nkv, 0, "blk.%d.attn_v.bias", il);
            }
        }
        if (s->arch == ARCH_QWEN3) {
            mk_add(l, st, rep, MK_NORM, T_F32, hd, 0, "blk.%d.attn_q_norm.weight", il);
            mk_add(l, st, rep, MK_NORM, T_F32, hd, 0, "blk.%d.attn_k_norm.weight", il);
        }
        mk_add(l, st, rep, MK_MATRIX, TYPE(MK_ROLE_OTHER, il, nq), nq, E, "blk.%d.attn_output.weight", il);
        if (phi2) mk_add(l, st, rep, MK_BIAS, T_F32, E, 0, "blk.%d.attn_output.bias", il);
        if (!phi2) mk_add(l, st, rep, MK_NORM, T_F32, E, 0, "blk.%d.ffn_norm.weight", il);
        if (s->arch == ARCH_PHI3) { // gate and up fused, gate first
            mk_add(l, st, rep, MK_MATRIX, TYPE(MK_ROLE_OTHER, il, E), E, 2 * F, "blk.%d.ffn_up.weight", il);
        } else if (phi2) {
            mk_add(l, st, rep, MK_MATRIX, TYPE(MK_ROLE_OTHER, il, E), E, F, "blk.%d.ffn_up.weight", il);
            mk_add(l, st, rep, MK_BIAS, T_F32, F, 0, "blk.%d.ffn_up.bias", il);
        } else {
            mk_add(l, st, rep, MK_MATRIX, TYPE(MK_ROLE_OTHER, il, E), E, F, "blk.%d.ffn_gate.weight", il);
            mk_add(l, st, rep, MK_MATRIX, TYPE(MK_ROLE_OTHER, il, E), E, F, "blk.%d.ffn_up.weight", il);
        }
        mk_add(l, st, rep, MK_MATRIX, TYPE(MK_ROLE_FFN_DOWN, il, F), F, E, "blk.%d.ffn_down.weight", il);
        if (phi2) mk_add(l, st, rep, MK_BIAS, T_F32, E, 0, "blk.%d.ffn_down.bias", il);
    }
    mk_add(l, st, rep, MK_NORM, T_F32, E, 0, "output_norm.weight", 0);
    if (phi2) mk_add(l, st, rep, MK_BIAS, T_F32, E, 0, "output_norm.bias", 0);
    if (!s->tied) {
        mk_add(l, st, rep, MK_MATRIX, TYPE(MK_ROLE_OUTPUT, 0, E), E, V, "output.weight", 0);
        if (phi2) mk_add(l, st, rep, MK_BIAS, T_F32, V, 0, "output.bias", 0);
    }
#undef TYPE
}

// Checks a shape for consistency and fills in what derives from the rest. PSV_ERR_INVALID
// with the reason when it cannot be built.
static psv_status mk_shape_finish(mk_shape *s, psv_error *err) {
    if (s->n_head % s->n_head_kv)
        return err_set(err, PSV_ERR_INVALID, "mkmodel: --heads %" PRId64 " is not a multiple of --kv-heads %" PRId64,
                       s->n_head, s->n_head_kv);
    if (!s->head_dim) {
        if (s->n_embd % s->n_head)
            return err_set(err, PSV_ERR_INVALID,
                           "mkmodel: --embd %" PRId64 " is not a multiple of --heads %" PRId64 " (or give --head-dim)",
                           s->n_embd, s->n_head);
        s->head_dim = s->n_embd / s->n_head;
    }
    if (s->head_dim % 2 || s->head_dim < 2 || s->head_dim > 1024)
        return err_set(err, PSV_ERR_INVALID, "mkmodel: head dimension %" PRId64 " must be even, 2..1024", s->head_dim);
    if (!s->n_rot) s->n_rot = (s->head_dim * s->rot_pct / 100) & ~(int64_t)1;
    if (s->n_rot % 2 || s->n_rot < 2 || s->n_rot > s->head_dim)
        return err_set(err, PSV_ERR_INVALID, "mkmodel: --rope-dims %" PRId64 " must be even, 2..head dimension %" PRId64,
                       s->n_rot, s->head_dim);
    if (s->arch == ARCH_PHI3) {
        if (!s->n_ctx_orig) s->n_ctx_orig = s->n_ctx;
        if (s->n_ctx_orig > s->n_ctx)
            return err_set(err, PSV_ERR_INVALID, "mkmodel: --orig-ctx %" PRId64 " exceeds --ctx %" PRId64, s->n_ctx_orig,
                           s->n_ctx);
    } else if (s->n_ctx_orig) {
        return err_set(err, PSV_ERR_INVALID, "mkmodel: --orig-ctx applies to phi3 only (LongRoPE)");
    }
    int n_special = mk_family(s->arch).n_special;
    if (s->n_vocab < 256 + n_special + 1)
        return err_set(err, PSV_ERR_INVALID, "mkmodel: --vocab %" PRId64 " is too small (at least %d: 256 bytes, %d special)",
                       s->n_vocab, 256 + n_special + 1, n_special);
    return PSV_OK;
}

// Writes the model to `path`. rep receives what was written.
static psv_status mk_write(const mk_config *c, const char *path, mk_report *rep, psv_error *err) {
    const mk_shape *s = &c->s;
    const char *a = model_arch_names[s->arch];
    psv_status st;
    mk_state state = {.seed = c->seed};
    mk_list l = {0};
    memset(rep, 0, sizeof *rep);
    gguf_writer *w = gguf_writer_new();
    if (!w || !(state.chunk = malloc(MK_CHUNK))) {
        st = err_set(err, PSV_ERR_NOMEM, "mkmodel: out of memory");
        goto done;
    }
    char key[128], name[128];
#define KEY(suffix) (snprintf(key, sizeof key, "%s.%s", a, suffix), key)
    gguf_w_str(w, "general.architecture", a);
    // Not the architecture's name: runtimes recognise Phi-3 by "phi3" in general.name and then
    // strip spaces after special tokens, which Phi-4-mini (named "Phi 4 Mini Instruct") does not get.
    if (c->name) snprintf(name, sizeof name, "%s", c->name);
    else snprintf(name, sizeof name, "pensieve mkmodel %s%s%s", c->preset ? c->preset : "", c->preset ? " " : "",
                  mk_ftypes[c->ftype].name);
    gguf_w_str(w, "general.name", name);
    gguf_w_u32(w, "general.file_type", mk_ftypes[c->ftype].file_type);
    gguf_w_u32(w, "general.quantization_version", 2);
    gguf_w_u32(w, KEY("context_length"), (uint32_t)s->n_ctx);
    gguf_w_u32(w, KEY("embedding_length"), (uint32_t)s->n_embd);
    gguf_w_u32(w, KEY("feed_forward_length"), (uint32_t)s->n_ff);
    gguf_w_u32(w, KEY("block_count"), (uint32_t)s->n_layer);
    gguf_w_u32(w, KEY("attention.head_count"), (uint32_t)s->n_head);
    gguf_w_u32(w, KEY("attention.head_count_kv"), (uint32_t)s->n_head_kv);
    if (s->head_dim * s->n_head != s->n_embd) {
        gguf_w_u32(w, KEY("attention.key_length"), (uint32_t)s->head_dim);
        gguf_w_u32(w, KEY("attention.value_length"), (uint32_t)s->head_dim);
    }
    gguf_w_u32(w, KEY("rope.dimension_count"), (uint32_t)s->n_rot);
    gguf_w_f32(w, KEY("rope.freq_base"), s->rope_base);
    if (s->arch == ARCH_PHI2) gguf_w_f32(w, KEY("attention.layer_norm_epsilon"), s->norm_eps);
    else gguf_w_f32(w, KEY("attention.layer_norm_rms_epsilon"), s->norm_eps);
    if (s->arch == ARCH_PHI3) {
        // LongRoPE's attention scale: sqrt(1 + ln(ctx / original ctx) / ln(original ctx)).
        double f = s->n_ctx > s->n_ctx_orig
                       ? psv_sqrt(1.0 + psv_log((double)s->n_ctx / (double)s->n_ctx_orig) / psv_log((double)s->n_ctx_orig))
                       : 1.0;
        gguf_w_u32(w, KEY("rope.scaling.original_context_length"), (uint32_t)s->n_ctx_orig);
        gguf_w_f32(w, KEY("rope.scaling.attn_factor"), (float)f);
        gguf_w_u32(w, KEY("attention.sliding_window"), 262144); // as Phi-4-mini: wider than any context
    }
#undef KEY
    if ((st = mk_write_tokenizer(w, s, c->seed, err))) goto done;
    mk_tensors(c, &l, &state, rep);
    if (l.oom) {
        st = err_set(err, PSV_ERR_NOMEM, "mkmodel: out of memory");
        goto done;
    }
    for (size_t i = 0; i < l.n; i++) {
        mk_tensor *t = &l.t[i];
        gguf_w_tensor_fn(w, t->name, t->type, t->n_dims, t->ne, mk_fill, t);
        uint64_t row = 0, size = 0;
        type_row_size(t->type, t->ne[0], &row);
        size = row * t->ne[1];
        rep->n_tensors++;
        rep->params += t->ne[0] * t->ne[1];
        rep->bytes += size;
        rep->type_tensors[t->type]++;
        rep->type_bytes[t->type] += size;
    }
    st = gguf_writer_save(w, path, err);
done:
    gguf_writer_free(w);
    free(l.t);
    mk_state_free(&state);
    return st;
}

static const char mk_usage[] =
    "usage: pensieve mkmodel -o OUT.gguf (--preset NAME | --arch A --embd N --layers N --heads N\n"
    "                        [--kv-heads N] --ffn N --vocab N) [options]\n"
    "Writes a GGUF model with random weights: every tensor the architecture needs, a byte-level\n"
    "BPE tokenizer (256 byte tokens, merges, special tokens) and a chat template.\n"
    "  --preset NAME     phi4-mini, llama-1b, qwen2-0.5b, qwen3-0.6b (shape flags override it)\n"
    "  --arch A          llama, phi3, qwen2, qwen3, phi2\n"
    "  --type T          F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K\n"
    "                    or a mix: Q4_K_S Q4_K_M Q5_K_S Q5_K_M (default Q4_K_M)\n"
    "  --pure            every matrix in --type (no Q6_K output, no mix rules)\n"
    "  --head-dim N      per-head dimension (default embd / heads)\n"
    "  --rope-dims N     rotary dimensions per head (default all; phi2 40 %, phi4-mini 75 %)\n"
    "  --rot-pct P       rotary share of the head dimension, in percent\n"
    "  --ctx N           training context length (default 4096)\n"
    "  --orig-ctx N      phi3: LongRoPE original context (the long factors apply beyond it)\n"
    "  --rope-base F     rotary frequency base\n"
    "  --tied/--untied   share token_embd with the output matrix (presets: tied)\n"
    "  --seed S          random seed (default 1): the same seed gives the same file\n"
    "  --name NAME       general.name\n"
    "  -q, --quiet       print nothing on success\n"
    "Rows whose length is not a multiple of the type's block size use another type (printed).\n";

PSV_MAYBE_UNUSED static int cli_mkmodel(int argc, char **argv) {
    const char *out = NULL, *preset = NULL, *type = "Q4_K_M", *name = NULL, *arch = NULL;
    int64_t ival[MK_N_INT], seed = 1;
    double rope_base = 0;
    int tied = -1;
    bool pure = false, quiet = false;
    for (int k = 0; k < MK_N_INT; k++) ival[k] = -1;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            fputs(mk_usage, stdout);
            return 0;
        }
        if (!strcmp(f, "--tied") || !strcmp(f, "--untied")) {
            tied = f[2] == 't';
            continue;
        }
        if (!strcmp(f, "--pure")) {
            pure = true;
            continue;
        }
        if (!strcmp(f, "-q") || !strcmp(f, "--quiet")) {
            quiet = true;
            continue;
        }
        int k = 0;
        while (k < MK_N_INT && strcmp(f, mk_int_flags[k].flag)) k++;
        bool ok = v != NULL;
        if (k < MK_N_INT) ok = str_to_i64(v, mk_int_flags[k].lo, mk_int_flags[k].hi, &ival[k]);
        else if (!strcmp(f, "-o") || !strcmp(f, "--output")) out = v;
        else if (!strcmp(f, "--preset")) preset = v;
        else if (!strcmp(f, "--type")) type = v;
        else if (!strcmp(f, "--arch")) arch = v;
        else if (!strcmp(f, "--name")) name = v;
        else if (!strcmp(f, "--seed")) ok = str_to_i64(v, 0, INT64_MAX, &seed);
        else if (!strcmp(f, "--rope-base")) ok = str_to_f64(v, 1.0001, 1e12, &rope_base);
        else {
            fprintf(stderr, "pensieve mkmodel: unknown option '%s' (see --help)\n", f);
            return 2;
        }
        if (!ok) {
            if (k < MK_N_INT && v)
                fprintf(stderr, "pensieve mkmodel: %s must be an integer in %" PRId64 "..%" PRId64 " (got '%s')\n", f,
                        mk_int_flags[k].lo, mk_int_flags[k].hi, v);
            else fprintf(stderr, "pensieve mkmodel: bad or missing value for %s\n", f);
            return 2;
        }
        i++;
    }
    if (!out) {
        fprintf(stderr, "pensieve mkmodel: -o OUT.gguf is required (see --help)\n");
        return 2;
    }
    mk_config c;
    memset(&c, 0, sizeof c);
    c.ftype = -1;
    for (size_t k = 0; k < PSV_ARRAY_LEN(mk_ftypes); k++)
        if (tools_ieq(type, mk_ftypes[k].name)) c.ftype = (int)k;
    if (c.ftype < 0) {
        fprintf(stderr, "pensieve mkmodel: unknown --type '%s' (expected F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, "
                        "Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q4_K_S, Q4_K_M, Q5_K_S or Q5_K_M)\n", type);
        return 2;
    }
    if (preset) {
        size_t k = 0;
        while (k < PSV_ARRAY_LEN(mk_presets) && strcmp(preset, mk_presets[k].name)) k++;
        if (k == PSV_ARRAY_LEN(mk_presets)) {
            fprintf(stderr, "pensieve mkmodel: unknown --preset '%s' (expected phi4-mini, llama-1b, qwen2-0.5b or "
                            "qwen3-0.6b)\n", preset);
            return 2;
        }
        c.s = mk_presets[k].s;
    }
    if (arch) {
        size_t k = 0;
        while (k < PSV_ARRAY_LEN(model_arch_names) && strcmp(arch, model_arch_names[k])) k++;
        if (k == PSV_ARRAY_LEN(model_arch_names)) {
            fprintf(stderr, "pensieve mkmodel: unknown --arch '%s' (expected llama, phi3, qwen2, qwen3 or phi2)\n", arch);
            return 2;
        }
        if (preset && (model_arch)k != c.s.arch) {
            fprintf(stderr, "pensieve mkmodel: --arch %s contradicts --preset %s\n", arch, preset);
            return 2;
        }
        if (!preset) {
            c.s.arch = (model_arch)k;
            mk_arch_defaults(&c.s);
        }
    } else if (!preset) {
        fprintf(stderr, "pensieve mkmodel: give --preset NAME or --arch and the shape (see --help)\n");
        return 2;
    }
    if (!preset) {
        static const int need[] = {0, 1, 2, 4, 5}; // embd, layers, heads, ffn, vocab
        for (size_t k = 0; k < PSV_ARRAY_LEN(need); k++)
            if (ival[need[k]] < 0) {
                fprintf(stderr, "pensieve mkmodel: %s is required without --preset\n", mk_int_flags[need[k]].flag);
                return 2;
            }
        if (ival[3] < 0) ival[3] = ival[2];
    }
    // Presets leave head_dim (except qwen3's) and n_rot to mk_shape_finish, so overriding the
    // shape re-derives them.
    for (int k = 0; k < MK_N_INT; k++)
        if (ival[k] >= 0) *mk_field(&c.s, k) = ival[k];
    if (rope_base > 0) c.s.rope_base = (float)rope_base;
    if (tied >= 0) c.s.tied = tied;
    c.pure = pure;
    c.preset = preset;
    c.seed = (uint64_t)seed;
    c.name = name;
    psv_error err = {0};
    if (mk_shape_finish(&c.s, &err)) {
        fprintf(stderr, "pensieve %s\n", err.message);
        return 2;
    }
    double t0 = plat_now();
    mk_report rep;
    if (mk_write(&c, out, &rep, &err)) {
        fprintf(stderr, "pensieve mkmodel: %s\n", err.message);
        return 1;
    }
    if (quiet) return 0;
    const mk_shape *s = &c.s;
    char b1[32];
    printf("mkmodel: %s: %s, %" PRId64 " embd, %" PRId64 " layers, %" PRId64 "/%" PRId64 " heads (head dim %" PRId64
           ", rotary %" PRId64 "), ffn %" PRId64 ", vocab %" PRId64 ", %s embeddings, ctx %" PRId64,
           out, model_arch_names[s->arch], s->n_embd, s->n_layer, s->n_head, s->n_head_kv, s->head_dim, s->n_rot, s->n_ff,
           s->n_vocab, s->tied ? "tied" : "separate output", s->n_ctx);
    if (s->arch == ARCH_PHI3) printf(" (original %" PRId64 ")", s->n_ctx_orig);
    printf("\nmkmodel: type %s%s:", mk_ftypes[c.ftype].name, c.pure ? " (pure)" : "");
    int n_types = 0;
    for (int t = 0; t < T_COUNT; t++)
        if (rep.type_tensors[t])
            printf("%s %s %" PRIu64 " tensor%s %s", n_types++ ? "," : "", type_get((uint32_t)t)->name,
                   rep.type_tensors[t], rep.type_tensors[t] == 1 ? "" : "s", tools_bytes(b1, (double)rep.type_bytes[t]));
    printf("\n");
    for (int k = 0; k < rep.n_fb; k++)
        printf("mkmodel: %" PRIu64 " matrices with rows of %" PRIu64 " (not a multiple of the %s block of %u) stored as %s\n",
               rep.fb[k].count, rep.fb[k].row, type_get(rep.fb[k].from)->name, type_get(rep.fb[k].from)->blck_size,
               type_get(rep.fb[k].to)->name);
    char b2[32];
    printf("mkmodel: wrote %" PRIu64 " tensors, %s parameters, %s of weights in %.2f s (seed %" PRIu64 ")\n",
           rep.n_tensors, tools_count(b2, (double)rep.params), tools_bytes(b1, (double)rep.bytes), plat_now() - t0, c.seed);
    return 0;
}

// ---- bench ---------------------------------------------------------------------------------------
// Like llama-bench: "ppN" evaluates N prompt tokens in one batch, "tgN" generates N tokens one
// at a time from an empty cache; each is repeated after an untimed warm-up and reported as
// tokens/s mean ± sample standard deviation. Tokens are random ids (speed does not depend on
// them). Also: warm start (open → first token of a 16-token prompt, file already in the page
// cache), peak resident memory against model + KV cache, and with --membw the machine's read
// bandwidth and generation as a share of the bandwidth roofline.

#define BENCH_MAX_LIST 16
#define BENCH_WARM_TOKENS 16
#define BENCH_MAX_SEQS 64 // -s
#define BENCH_MEMBW_SIZE ((size_t)512 << 20) // 16x a large L3: streams from DRAM
#define BENCH_MEMBW_RUNS 40

// The kernel set the engine's products actually run on. Section 12 names the set it chose
// (k_kernel_set_name), but the engine reaches kernels through eng_traits (section 14), which may
// still be the reference table: compare the two.
static const char *bench_kernel_set(void) {
    const k_traits *e = eng_traits(T_Q4_0), *s = k_traits_get(T_Q4_0), *r = k_traits_ref(T_Q4_0);
    if (e && s && e->vec_dot == s->vec_dot) return k_kernel_set_name();
    if (e && r && e->vec_dot == r->vec_dot) return "ref";
    return "unknown";
}

static void bench_cpu_features(char *out, size_t cap) {
    const plat_cpu *c = plat_cpu_get();
    const struct { bool on; const char *name; } f[] = {
        {c->avx2, "avx2"}, {c->fma, "fma"}, {c->f16c, "f16c"}, {c->avx512f, "avx512f"}, {c->avx512bw, "avx512bw"},
        {c->avx512vnni, "avx512vnni"}, {c->avx512bf16, "avx512bf16"}, {c->avxvnni, "avxvnni"}, {c->neon, "neon"},
        {c->dotprod, "dotprod"}, {c->i8mm, "i8mm"}, {c->fp16, "fp16"},
    };
    size_t k = 0;
    out[0] = 0;
    for (size_t i = 0; i < PSV_ARRAY_LEN(f); i++)
        if (f[i].on && k < cap) k += (size_t)snprintf(out + k, cap - k, "%s%s", k ? " " : "", f[i].name);
    if (!k) snprintf(out, cap, "baseline");
}

// Peak resident set (VmHWM) in bytes, or -1 where /proc/self/status has none.
static int64_t bench_peak_rss(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    int64_t kb = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) {
            long long v;
            if (sscanf(line + 6, "%lld", &v) == 1) kb = v;
        }
    fclose(f);
    return kb < 0 ? -1 : kb * 1024;
}

// Reads the whole file so the warm start finds it in the page cache.
static psv_status bench_prefault(const char *path, uint64_t *size, psv_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return err_set(err, PSV_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char tmp[1 << 16];
    size_t k;
    *size = 0;
    while ((k = fread(tmp, 1, sizeof tmp, f)) > 0) *size += k;
    bool bad = ferror(f);
    fclose(f);
    return bad ? err_set(err, PSV_ERR_IO, "%s: read error", path) : PSV_OK;
}

// ---- memory bandwidth: every thread streams through its share of a buffer, summing it ----

typedef struct {
    const uint8_t *p;
    size_t n;
    uint64_t sum;
} bench_bw_job;

#if defined(PSV_X86)
__attribute__((target("avx2"))) static uint64_t bench_sum_avx2(const uint8_t *p, size_t n) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 128 <= n; i += 128) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256((const __m256i *)(p + i)));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256((const __m256i *)(p + i + 32)));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256((const __m256i *)(p + i + 64)));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    uint64_t t[4];
    _mm256_storeu_si256((__m256i *)t, _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)));
    return t[0] + t[1] + t[2] + t[3];
}
#endif

static uint64_t bench_sum_scalar(const uint8_t *p, size_t n) {
    uint64_t s[8] = {0};
    for (size_t i = 0; i + 64 <= n; i += 64)
        for (int k = 0; k < 8; k++) {
            uint64_t v;
            memcpy(&v, p + i + 8 * k, 8);
            s[k] += v;
        }
    return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

static void *bench_bw_thread(void *arg) {
    bench_bw_job *j = arg;
#if defined(PSV_X86)
    if (plat_cpu_get()->avx2) {
        j->sum = bench_sum_avx2(j->p, j->n);
        return NULL;
    }
#endif
    j->sum = bench_sum_scalar(j->p, j->n);
    return NULL;
}

// Best read bandwidth in bytes/s over BENCH_MEMBW_RUNS passes with n_threads threads. Many
// passes: on a virtual machine the second core's speed ramps up over the first few (5 passes
// read 28 to 35 GB/s here where 40 find up to 58), so few passes understate the roofline.
static psv_status bench_membw(int n_threads, double *out, psv_error *err) {
    psv_status st = PSV_OK;
    size_t size = BENCH_MEMBW_SIZE;
    uint8_t *buf = aligned_alloc(4096, size);
    bench_bw_job *jobs = calloc((size_t)n_threads, sizeof *jobs);
    pthread_t *th = calloc((size_t)n_threads, sizeof *th);
    if (!buf || !jobs || !th) {
        st = err_set(err, PSV_ERR_NOMEM, "bench: out of memory for the %zu MiB bandwidth buffer", size >> 20);
        goto done;
    }
    memset(buf, 1, size); // commit every page before timing
    double best = 0;
    uint64_t check = 0;
    for (int r = 0; r < BENCH_MEMBW_RUNS; r++) {
        size_t share = size / (size_t)n_threads & ~(size_t)4095;
        double t0 = plat_now();
        int started = 0;
        for (int i = 0; i < n_threads; i++) {
            jobs[i] = (bench_bw_job){buf + (size_t)i * share, i == n_threads - 1 ? size - (size_t)i * share : share, 0};
            if (i > 0 && pthread_create(&th[i], NULL, bench_bw_thread, &jobs[i]) != 0) break;
            started = i + 1;
        }
        bench_bw_thread(&jobs[0]);
        for (int i = 1; i < started; i++) pthread_join(th[i], NULL);
        double dt = plat_now() - t0;
        if (started < n_threads) {
            st = err_set(err, PSV_ERR_IO, "bench: cannot create %d threads", n_threads);
            goto done;
        }
        for (int i = 0; i < n_threads; i++) check += jobs[i].sum;
        if (dt > 0 && (double)size / dt > best) best = (double)size / dt;
    }
    PSV_ASSERT(check != 0); // every byte is 1: the sums were really computed
    *out = best;
done:
    free(th);
    free(jobs);
    free(buf);
    return st;
}

// Bandwidth measured in a child process, so the buffer never counts toward this process's peak
// memory (VmHWM only grows) and can be measured again between tests: bench_prober_start forks it
// while the process has one thread (the child allocates and starts threads, which is safe after
// fork only when no other thread could have held a lock); it then waits for requests (a thread
// count) and answers each with a measurement. Where fork fails, bench_prober_measure measures in
// place (its buffer then counts in the peak).
typedef struct {
    pid_t pid; // 0: no child
    int req, resp; // pipe ends: requests to the child, answers from it
} bench_prober;

static void bench_prober_child(int req, int resp) {
    int32_t n;
    while (read(req, &n, sizeof n) == (ssize_t)sizeof n) {
        double v = 0;
        psv_error e = {0};
        uint8_t msg[8 + sizeof e.message];
        psv_status st = bench_membw(n, &v, &e);
        wr_u64(msg, st ? 0 : f64_bits(v));
        memcpy(msg + 8, e.message, sizeof e.message);
        size_t put = 0;
        ssize_t k;
        while (put < sizeof msg && (k = write(resp, msg + put, sizeof msg - put)) > 0) put += (size_t)k;
        if (put < sizeof msg) break;
    }
    _exit(0); // the child must not run the parent's atexit handlers or flush its stdio
}

static void bench_prober_start(bench_prober *p) {
    int a[2], b[2];
    p->pid = 0;
    fflush(NULL);
    if (pipe(a) != 0) return;
    if (pipe(b) != 0) {
        close(a[0]), close(a[1]);
        return;
    }
    pid_t pid = fork();
    if (pid == 0) {
        close(a[1]), close(b[0]);
        bench_prober_child(a[0], b[1]);
    }
    close(a[0]), close(b[1]);
    if (pid < 0) {
        close(a[1]), close(b[0]);
        return;
    }
    *p = (bench_prober){.pid = pid, .req = a[1], .resp = b[0]};
}

static void bench_prober_stop(bench_prober *p) {
    if (p->pid <= 0) return;
    close(p->req), close(p->resp); // the child sees the end of its requests and exits
    int status = 0;
    waitpid(p->pid, &status, 0);
    p->pid = 0;
}

static psv_status bench_prober_measure(bench_prober *p, int n_threads, double *out, psv_error *err) {
    if (p->pid <= 0) return bench_membw(n_threads, out, err);
    const int32_t n = n_threads;
    uint8_t msg[8 + sizeof err->message];
    size_t got = 0;
    ssize_t k;
    if (write(p->req, &n, sizeof n) == (ssize_t)sizeof n)
        while (got < sizeof msg && (k = read(p->resp, msg + got, sizeof msg - got)) > 0) got += (size_t)k;
    if (got < sizeof msg) {
        bench_prober_stop(p);
        return err_set(err, PSV_ERR_IO, "bench: the bandwidth probe process failed");
    }
    const uint64_t bits = ld_u64(msg); // as the child wrote it (wr_u64)
    if (bits == 0) {
        msg[sizeof msg - 1] = 0;
        return err_set(err, PSV_ERR_IO, "%s", (const char *)msg + 8);
    }
    *out = f64_from_bits(bits);
    return PSV_OK;
}

// ---- the benchmark ----

typedef struct {
    char name[24];
    bool gen;
    int64_t n, threads, seqs; // seqs: sequences generated together (tg; 1 otherwise)
    int reps;
    double *secs;          // reps
    double tps_mean, tps_sd;
    double bytes_per_token; // tg: weights + mean KV read per generated token
    double bw;              // tg with --membw: the better of the bandwidths read just before and after
} bench_test;

typedef struct {
    const char *path;
    int64_t p[BENCH_MAX_LIST], n[BENCH_MAX_LIST], t[BENCH_MAX_LIST], s[BENCH_MAX_LIST];
    int np, nn, nt, ns, reps;
    bool json, membw, warmup;
    psv_kv_type kv_type;
} bench_opts;

// Facts about the model, from its first open.
typedef struct {
    char arch[16];
    uint64_t file_bytes, model_bytes, params, weight_bytes_per_token, kv_bytes, kv_bytes_per_pos;
    int64_t n_vocab, n_ctx;
    double warm_open, warm_prompt;
    int64_t warm_threads;
} bench_model;

static void bench_stats(bench_test *t) {
    double sum = 0, ss = 0;
    for (int r = 0; r < t->reps; r++) sum += (double)(t->n * t->seqs) / t->secs[r];
    t->tps_mean = sum / t->reps;
    for (int r = 0; r < t->reps; r++) {
        double d = (double)(t->n * t->seqs) / t->secs[r] - t->tps_mean;
        ss += d * d;
    }
    t->tps_sd = t->reps > 1 ? psv_sqrt(ss / (t->reps - 1)) : 0.0;
}

static void bench_model_facts(const psv_model *m, const psv_ctx *c, bench_model *bm) {
    snprintf(bm->arch, sizeof bm->arch, "%s", psv_model_arch(m));
    bm->model_bytes = bm->params = 0;
    for (uint64_t i = 0; i < m->gguf->n_tensors; i++) {
        const gguf_tensor *t = &m->gguf->tensors[i];
        bm->model_bytes += t->size;
        bm->params += t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    }
    // Generating a token reads every matrix once, but only one row of untied token embeddings.
    uint64_t w = m->weight_bytes;
    if (m->output.data != m->tok_embd.data) w -= m->tok_embd.row_size * (uint64_t)(m->tok_embd.n_out - 1);
    bm->weight_bytes_per_token = w;
    bm->kv_bytes_per_pos = 2 * (uint64_t)m->n_layer * (uint64_t)(m->n_head_kv * m->head_dim) * kv_elem_size(c->kv.type);
    bm->n_ctx = c->kv.n_ctx;
    bm->kv_bytes = bm->kv_bytes_per_pos * (uint64_t)bm->n_ctx;
    bm->n_vocab = m->n_vocab;
}

static int32_t bench_argmax(const float *l, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (l[i] > l[best]) best = i;
    return (int32_t)best;
}

static void bench_print_row(const bench_model *bm, const bench_test *t, const char *kernels) {
    char b1[32], b2[32], r[24] = "", tps[48];
    if (t->gen && t->bw > 0) snprintf(r, sizeof r, "%.1f %%", 100.0 * t->tps_mean * t->bytes_per_token / t->bw);
    snprintf(tps, sizeof tps, "%.2f ± %.2f", t->tps_mean, t->tps_sd);
    printf("| %-6s | %10s | %9s | %-7s | %7" PRId64 " | %6s | %19s | %8s |\n", bm->arch,
           tools_bytes(b1, (double)bm->model_bytes), tools_count(b2, (double)bm->params), kernels, t->threads, t->name,
           tps, r);
    fflush(stdout);
}

static void bench_json(const bench_opts *o, const bench_model *bm, const bench_test *tests, int n_tests,
                       const char *kernels, double bw, int bw_threads, int64_t peak) {
    buf_t b = {0};
    json_writer w;
    char cpu[256];
    bench_cpu_features(cpu, sizeof cpu);
    json_w_init(&w, &b);
    json_w_obj_begin(&w);
    json_w_key(&w, "model");
    if (o->path) json_w_cstr(&w, o->path);
    else json_w_null(&w);
    if (o->path) {
        json_w_key(&w, "arch"), json_w_cstr(&w, bm->arch);
        json_w_key(&w, "file_bytes"), json_w_int(&w, (int64_t)bm->file_bytes);
        json_w_key(&w, "model_bytes"), json_w_int(&w, (int64_t)bm->model_bytes);
        json_w_key(&w, "params"), json_w_int(&w, (int64_t)bm->params);
        json_w_key(&w, "n_vocab"), json_w_int(&w, bm->n_vocab);
        json_w_key(&w, "weight_bytes_per_token"), json_w_int(&w, (int64_t)bm->weight_bytes_per_token);
        json_w_key(&w, "n_ctx"), json_w_int(&w, bm->n_ctx);
        json_w_key(&w, "kv_type"), json_w_cstr(&w, o->kv_type == PSV_KV_F16 ? "f16" : "f32");
        json_w_key(&w, "kv_bytes"), json_w_int(&w, (int64_t)bm->kv_bytes);
    }
    json_w_key(&w, "kernels"), json_w_cstr(&w, kernels);
    json_w_key(&w, "cpu"), json_w_cstr(&w, cpu);
    json_w_key(&w, "n_cpus"), json_w_int(&w, plat_n_cpus());
    if (o->path) {
        json_w_key(&w, "reps"), json_w_int(&w, o->reps);
        json_w_key(&w, "warmup"), json_w_bool(&w, o->warmup);
        json_w_key(&w, "warm_start");
        json_w_obj_begin(&w);
        json_w_key(&w, "seconds"), json_w_double(&w, bm->warm_open + bm->warm_prompt);
        json_w_key(&w, "open_seconds"), json_w_double(&w, bm->warm_open);
        json_w_key(&w, "prompt_seconds"), json_w_double(&w, bm->warm_prompt);
        json_w_key(&w, "prompt_tokens"), json_w_int(&w, BENCH_WARM_TOKENS);
        json_w_key(&w, "threads"), json_w_int(&w, bm->warm_threads);
        json_w_obj_end(&w);
        json_w_key(&w, "peak_rss_bytes");
        if (peak >= 0) json_w_int(&w, peak);
        else json_w_null(&w);
        json_w_key(&w, "peak_over_model_kv");
        if (peak >= 0) json_w_double(&w, (double)peak / (double)(bm->model_bytes + bm->kv_bytes) - 1.0);
        else json_w_null(&w);
    }
    json_w_key(&w, "membw");
    if (bw > 0) {
        json_w_obj_begin(&w);
        json_w_key(&w, "bytes_per_second"), json_w_double(&w, bw);
        json_w_key(&w, "threads"), json_w_int(&w, bw_threads);
        json_w_key(&w, "buffer_bytes"), json_w_int(&w, (int64_t)BENCH_MEMBW_SIZE);
        json_w_key(&w, "runs"), json_w_int(&w, BENCH_MEMBW_RUNS);
        json_w_obj_end(&w);
    } else {
        json_w_null(&w);
    }
    json_w_key(&w, "tests");
    json_w_arr_begin(&w);
    for (int i = 0; i < n_tests; i++) {
        const bench_test *t = &tests[i];
        json_w_obj_begin(&w);
        json_w_key(&w, "name"), json_w_cstr(&w, t->name);
        json_w_key(&w, "kind"), json_w_cstr(&w, t->gen ? "tg" : "pp");
        json_w_key(&w, "threads"), json_w_int(&w, t->threads);
        json_w_key(&w, "n_prompt"), json_w_int(&w, t->gen ? 0 : t->n);
        json_w_key(&w, "n_gen"), json_w_int(&w, t->gen ? t->n : 0);
        json_w_key(&w, "seqs"), json_w_int(&w, t->seqs);
        json_w_key(&w, "reps"), json_w_int(&w, t->reps);
        json_w_key(&w, "samples_s");
        json_w_arr_begin(&w);
        for (int r = 0; r < t->reps; r++) json_w_double(&w, t->secs[r]);
        json_w_arr_end(&w);
        json_w_key(&w, "tps_mean"), json_w_double(&w, t->tps_mean);
        json_w_key(&w, "tps_stddev"), json_w_double(&w, t->tps_sd);
        if (t->gen) {
            json_w_key(&w, "bytes_per_token"), json_w_double(&w, t->bytes_per_token);
            json_w_key(&w, "bandwidth");
            if (t->bw > 0) json_w_double(&w, t->bw);
            else json_w_null(&w);
            json_w_key(&w, "roofline");
            if (t->bw > 0) json_w_double(&w, t->tps_mean * t->bytes_per_token / t->bw);
            else json_w_null(&w);
        }
        json_w_obj_end(&w);
    }
    json_w_arr_end(&w);
    json_w_obj_end(&w);
    buf_putc(&b, '\n');
    if (!b.oom) fwrite(b.data, 1, b.len, stdout);
    else fprintf(stderr, "pensieve bench: out of memory writing JSON\n");
    buf_free(&b);
}

static const char bench_usage[] =
    "usage: pensieve bench -m MODEL [-p 512] [-n 128] [-t THREADS] [-r REPS] [--json] [--membw]\n"
    "                      [-s SEQS] [--kv-type f32|f16] [--no-warmup]\n"
    "       pensieve bench --membw [-t THREADS] [--json]\n"
    "Measures, like llama-bench: ppN = N prompt tokens in one batch, tgN = N tokens generated one\n"
    "at a time; tokens/s as mean ± stddev over REPS runs (default 5) after an untimed warm-up.\n"
    "-p, -n and -t take comma-separated lists (e.g. -t 1,2); 0 skips pp or tg. Also reported:\n"
    "model size and parameters, the kernel set, warm start (open -> first token of a 16-token\n"
    "prompt, file in the page cache), peak resident memory against model + KV cache.\n"
    "  -s SEQS   tg also with SEQS sequences generated together, one batched pass per step (as\n"
    "            the server's continuous batching does): tgNxSEQS, tokens/s of all of them\n"
    "  --membw   measure memory read bandwidth (the most -t threads streaming a 512 MiB buffer,\n"
    "            best of 40 passes, in a child process) at the start and again just before and\n"
    "            after each tg test, and report tg as a share of the roofline: tokens/s x bytes\n"
    "            read per token (weights + KV cache) / the better of the two reads around it\n"
    "  --json    one JSON object instead of the table\n";

PSV_MAYBE_UNUSED static int cli_bench(int argc, char **argv) {
    bench_opts o = {.np = 1, .nn = 1, .ns = 1, .reps = 5, .warmup = true, .kv_type = PSV_KV_F32};
    o.p[0] = 512;
    o.n[0] = 128;
    o.s[0] = 1;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true, takes = true;
        int64_t r;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            fputs(bench_usage, stdout);
            return 0;
        } else if (!strcmp(f, "-m") || !strcmp(f, "--model")) ok = v != NULL, o.path = v;
        else if (!strcmp(f, "-p") || !strcmp(f, "--n-prompt")) ok = tools_parse_list(v, 0, 65536, o.p, BENCH_MAX_LIST, &o.np);
        else if (!strcmp(f, "-n") || !strcmp(f, "--n-gen")) ok = tools_parse_list(v, 0, 65536, o.n, BENCH_MAX_LIST, &o.nn);
        else if (!strcmp(f, "-t") || !strcmp(f, "--threads")) ok = tools_parse_list(v, 1, 1024, o.t, BENCH_MAX_LIST, &o.nt);
        else if (!strcmp(f, "-s") || !strcmp(f, "--seqs")) ok = tools_parse_list(v, 1, BENCH_MAX_SEQS, o.s, BENCH_MAX_LIST, &o.ns);
        else if (!strcmp(f, "-r") || !strcmp(f, "--reps")) ok = str_to_i64(v, 1, 1000, &r), o.reps = (int)r;
        else if (!strcmp(f, "--kv-type")) {
            ok = v && (!strcmp(v, "f32") || !strcmp(v, "f16"));
            o.kv_type = v && !strcmp(v, "f16") ? PSV_KV_F16 : PSV_KV_F32;
        } else if (!strcmp(f, "--json")) o.json = true, takes = false;
        else if (!strcmp(f, "--membw")) o.membw = true, takes = false;
        else if (!strcmp(f, "--no-warmup")) o.warmup = false, takes = false;
        else {
            fprintf(stderr, "pensieve bench: unknown option '%s' (see --help)\n", f);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "pensieve bench: bad or missing value for %s%s%s%s\n", f, v ? " ('" : "", v ? v : "",
                    v ? "')" : "");
            return 2;
        }
        if (takes) i++;
    }
    if (!o.path && !o.membw) {
        fprintf(stderr, "pensieve bench: -m MODEL is required (or --membw alone; see --help)\n");
        return 2;
    }
    if (o.nt == 0) o.t[o.nt++] = plat_n_cpus() > 64 ? 64 : plat_n_cpus();
    int64_t max_t = 0, max_p = 0, max_n = 0, max_s = 1;
    for (int i = 0; i < o.nt; i++) max_t = PSV_MAX(max_t, o.t[i]);
    for (int i = 0; i < o.ns; i++) max_s = PSV_MAX(max_s, o.s[i]);
    for (int i = 0; i < o.np; i++) max_p = PSV_MAX(max_p, o.p[i]);
    for (int i = 0; i < o.nn; i++) max_n = PSV_MAX(max_n, o.n[i]);

    int rc = 1;
    psv_error err = {0};
    const char *kernels = bench_kernel_set();
    if (k_kernel_set_note()) fprintf(stderr, "pensieve bench: %s\n", k_kernel_set_note());
    if (psv_build_note()) fprintf(stderr, "pensieve bench: %s\n", psv_build_note());
    bench_model bm;
    memset(&bm, 0, sizeof bm);
    bench_test *tests = NULL;
    double *secs = NULL, bw = 0, bw_lo = 0, bw_hi = 0; // bw_lo, bw_hi: around the tg tests
    bench_prober prober = {0};
    int32_t *toks = NULL;
    int n_tests = 0;
    psv_model *m = NULL;
    psv_ctx *c = NULL, *cs[BENCH_MAX_SEQS] = {NULL}; // cs: the other sequences of -s
    batch_seq seqs[BENCH_MAX_SEQS];
    // Bandwidth first, in a child process, so its buffer neither competes with the model for
    // memory nor counts in the peak; again around each tg test (bench_prober).
    if (o.membw) {
        bench_prober_start(&prober);
        if (bench_prober_measure(&prober, (int)max_t, &bw, &err)) goto fail;
    }
    if (!o.path) {
        bench_prober_stop(&prober);
        if (o.json) bench_json(&o, &bm, NULL, 0, kernels, bw, (int)max_t, -1);
        else printf("memory bandwidth: %.2f GB/s read (%" PRId64 " threads, %zu MiB buffer, best of %d)\n", bw * 1e-9,
                    max_t, BENCH_MEMBW_SIZE >> 20, BENCH_MEMBW_RUNS);
        return 0;
    }
    int max_tests = o.nt * (o.np + o.nn * o.ns);
    tests = calloc((size_t)max_tests + 1, sizeof *tests);
    secs = calloc((size_t)max_tests * (size_t)o.reps + 1, sizeof *secs);
    int64_t n_toks = PSV_MAX(PSV_MAX(max_p, max_n), BENCH_WARM_TOKENS);
    toks = malloc((size_t)n_toks * sizeof *toks);
    if (!tests || !secs || !toks) {
        err_set(&err, PSV_ERR_NOMEM, "bench: out of memory");
        goto fail;
    }
    if (bench_prefault(o.path, &bm.file_bytes, &err)) goto fail;
    psv_ctx_params cp = psv_ctx_default_params();
    cp.n_ctx = (uint32_t)n_toks;
    // prompts in the library's default chunks, as users get them
    cp.kv_type = o.kv_type;
    bool header = false;
    for (int ti = 0; ti < o.nt; ti++) {
        psv_model_params mp = psv_model_default_params();
        mp.n_threads = (int)o.t[ti];
        double t0 = plat_now();
        if (psv_model_open(o.path, &mp, &m, &err) || psv_ctx_new(m, &cp, &c, &err)) goto fail;
        double t1 = plat_now();
        for (int64_t q = 1; q < max_s; q++)
            if (psv_ctx_new(m, &cp, &cs[q], &err)) goto fail;
        cs[0] = c;
        if (ti == 0) {
            bench_model_facts(m, c, &bm);
            uint64_t rng = 0x7761726dull;
            for (int64_t i = 0; i < n_toks; i++) toks[i] = (int32_t)(tools_rng(&rng) % (uint64_t)m->n_vocab);
        }
        if (!bm.warm_threads && o.t[ti] == max_t) {
            // Warm start, with the most threads: the time to open, set up a context and have the
            // first token of a prompt.
            if (psv_eval(c, toks, BENCH_WARM_TOKENS, &err)) goto fail;
            int32_t first = bench_argmax(psv_ctx_logits(c), m->n_vocab);
            PSV_UNUSED(first);
            bm.warm_open = t1 - t0;
            bm.warm_prompt = plat_now() - t1;
            bm.warm_threads = o.t[ti];
        }
        if (!o.json && !header) {
            char cpu[256];
            bench_cpu_features(cpu, sizeof cpu);
            printf("pensieve bench: %s (%s, %d CPUs: %s)\n", o.path, bm.arch, plat_n_cpus(), cpu);
            printf("| arch   |       size |    params | kernels | threads |   test |                t/s | roofline |\n"
                   "| ------ | ---------: | --------: | ------- | ------: | -----: | -----------------: | -------: |\n");
            header = true;
        }
        for (int k = 0; k < o.np + o.nn * o.ns; k++) {
            bool gen = k >= o.np;
            int64_t n = gen ? o.n[(k - o.np) / o.ns] : o.p[k], S = gen ? o.s[(k - o.np) % o.ns] : 1;
            if (n == 0) continue;
            bench_test *t = &tests[n_tests];
            snprintf(t->name, sizeof t->name, "%s%" PRId64, gen ? "tg" : "pp", n);
            if (S > 1) snprintf(t->name + strlen(t->name), sizeof t->name - strlen(t->name), "x%" PRId64, S);
            t->gen = gen;
            t->n = n;
            t->seqs = S;
            t->threads = o.t[ti];
            t->reps = o.reps;
            t->secs = secs + (size_t)n_tests * (size_t)o.reps;
            // tg's roofline: the bandwidth of the same minutes (on a shared machine it moves by
            // more than a tenth between runs), the better of the reads just before and after;
            // measured in place (no child process) the buffer would count in the peak: then the first
            const bool around = gen && o.membw && prober.pid > 0;
            double bw_before = bw, bw_after = bw;
            if (around && bench_prober_measure(&prober, (int)max_t, &bw_before, &err)) goto fail;
            for (int r = -1; r < o.reps; r++) {
                if (r < 0 && !o.warmup) continue;
                for (int64_t q = 0; q < S; q++)
                    if (psv_ctx_truncate(cs[q], 0, &err)) goto fail;
                double s0 = plat_now();
                if (!gen) {
                    if (psv_eval(c, toks, (size_t)n, &err)) goto fail;
                } else if (S > 1) {
                    // every step: one token of each sequence (each its own), all in one pass
                    for (int64_t j = 0; j < (r < 0 ? 1 : n); j++) {
                        for (int64_t q = 0; q < S; q++)
                            seqs[q] = (batch_seq){.ctx = cs[q], .tokens = &toks[(j + 7 * q) % n_toks], .n = 1, .logits = true};
                        ctx_eval_batch(m, &c->s, c->items, seqs, (size_t)S);
                    }
                } else {
                    // the warm-up generates one token, like llama-bench's
                    for (int64_t j = 0; j < (r < 0 ? 1 : n); j++)
                        if (psv_eval(c, &toks[j], 1, &err)) goto fail;
                }
                if (r >= 0) t->secs[r] = PSV_MAX(plat_now() - s0, 1e-9);
            }
            if (around && bench_prober_measure(&prober, (int)max_t, &bw_after, &err)) goto fail;
            if (gen && o.membw) t->bw = PSV_MAX(bw_before, bw_after);
            if (around) { // the range the summary gives (only of reads that were made)
                const double lo = PSV_MIN(bw_before, bw_after);
                bw_lo = bw_lo > 0 ? PSV_MIN(bw_lo, lo) : lo;
                bw_hi = PSV_MAX(bw_hi, t->bw);
            }
            bench_stats(t);
            // mean KV read per step: positions 1..n are attended over, (n + 1) / 2 on average
            // (with S sequences, each step reads the weights once for S tokens)
            t->bytes_per_token = (double)bm.weight_bytes_per_token / (double)S + (double)bm.kv_bytes_per_pos * (double)(n + 1) / 2.0;
            n_tests++;
            if (!o.json) bench_print_row(&bm, t, kernels);
        }
        for (int64_t q = 1; q < max_s; q++) psv_ctx_free(cs[q]), cs[q] = NULL;
        psv_ctx_free(c);
        c = NULL;
        psv_model_close(m);
        m = NULL;
    }
    int64_t peak = bench_peak_rss();
    if (o.json) {
        bench_json(&o, &bm, tests, n_tests, kernels, bw, (int)max_t, peak);
    } else {
        char b1[32], b2[32], b3[32];
        printf("\nwarm start: %.3f s to the first token of a %d-token prompt (open %.3f s, prompt %.3f s, %" PRId64
               " thread%s)\n", bm.warm_open + bm.warm_prompt, BENCH_WARM_TOKENS, bm.warm_open, bm.warm_prompt,
               bm.warm_threads, bm.warm_threads == 1 ? "" : "s");
        if (peak >= 0) {
            double base = (double)(bm.model_bytes + bm.kv_bytes);
            printf("peak memory: %s resident = model %s + KV cache %s (n_ctx %" PRId64 ", %s) %+.1f %%\n",
                   tools_bytes(b1, (double)peak), tools_bytes(b2, (double)bm.model_bytes), tools_bytes(b3, (double)bm.kv_bytes),
                   bm.n_ctx, o.kv_type == PSV_KV_F16 ? "f16" : "f32", 100.0 * ((double)peak / base - 1.0));
        } else {
            printf("peak memory: not available on this system\n");
        }
        printf("bytes read per generated token: %s of weights + KV cache\n",
               tools_bytes(b1, (double)bm.weight_bytes_per_token));
        if (o.membw) {
            printf("memory bandwidth: %.2f GB/s read (%" PRId64 " threads, %zu MiB buffer, best of %d) at the start", bw * 1e-9,
                   max_t, BENCH_MEMBW_SIZE >> 20, BENCH_MEMBW_RUNS);
            if (bw_hi > 0) printf(", %.2f to %.2f GB/s around the tg tests", bw_lo * 1e-9, bw_hi * 1e-9);
            printf("; roofline = tg t/s x bytes per token / the better of the bandwidths read just before and after the test\n");
        }
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "pensieve bench: %s\n", err.message);
done:
    bench_prober_stop(&prober);
    for (int q = 1; q < BENCH_MAX_SEQS; q++) psv_ctx_free(cs[q]);
    psv_ctx_free(c);
    psv_model_close(m);
    free(toks);
    free(secs);
    free(tests);
    return rc;
}

// ----------------------------------------------------------------------------
// 18. Model files
// Where models live (the cache directory), the built-in registry of known models, resolving
// `--model PATH|NAME` to a file, and the `pull`, `list`, `verify` and `rm` subcommands.
// Downloading is done by tools/pensieve-pull (libcurl), which #includes this file for the
// registry, the cache-directory rules, the file-name, lock and sidecar conventions and SHA-256:
// one source of truth, while pensieve itself only runs the tool and needs nothing but libc.
//
// Cache layout, all in one flat directory:
//   FILE               a complete model, only ever put there by rename() after verification
//   FILE.sha256        its verified digest, one `sha256sum` line ("HEX  FILE")
//   FILE.partial       an interrupted download, resumed by the next pull
//   FILE.partial.meta  the validator (ETag or Last-Modified) the partial bytes came with
//   FILE.lock          held (fcntl) by the pull writing FILE; removed by its holder


// The model served when none is named (`./pensieve` with no arguments).
#ifndef PSV_MODELS_DEFAULT
#define PSV_MODELS_DEFAULT "phi-4-mini"
#endif
// Where registry files are fetched from unless --mirror or PENSIEVE_MIRROR names another host
// that serves the same paths (BASE/OWNER/REPO/resolve/REVISION/FILE).
#ifndef PSV_MODELS_HUB
#define PSV_MODELS_HUB "https://huggingface.co"
#endif
// Longest path handled here. Paths are built in fixed buffers so every truncation is an error.
#define MODELS_PATH_MAX 4096

// A model the registry knows. Files are pinned to a repository commit, so the bytes behind a URL
// never change and a digest, once published, stays right.
typedef struct {
    const char *name;        // what users type: `pensieve pull phi-4-mini`
    const char *title;       // the upstream model name
    const char *params;      // parameter count, for people
    const char *repo;        // Hugging Face repository, OWNER/NAME
    const char *revision;    // the commit the file is pinned to (40 hex digits)
    const char *file;        // file name in the repository and in the cache directory
    uint64_t size;           // bytes, exact
    const char *sha256;      // lower-case hex SHA-256 of the file (its Git LFS oid), "" when unknown
    const char *arch;        // general.architecture in the file (what psv_model_arch reports)
    const char *chat_format; // the built-in chat format its template is recognised as
    const char *quant;       // quantization mix
} models_entry;

// Sizes and digests are the Git LFS details of each file at the pinned revision (the "SHA256"
// shown on the file's Hugging Face page, which is also what the hub sends as X-Linked-Etag),
// cross-checked against independent published pins of the same file. Never invent a digest: an
// entry whose digest is not known has "" and pensieve-pull then relies on the server's digest.
static const models_entry models_registry[] = {
    {"phi-4-mini", "Phi-4-mini-instruct", "3.8B", "bartowski/microsoft_Phi-4-mini-instruct-GGUF",
     "915429cb42fe8eba71bd1d3117a7d63070892268", "microsoft_Phi-4-mini-instruct-Q4_K_M.gguf", 2491874688u,
     "01999f17c39cc3074afae5e9c539bc82d45f2dd7faa3917c66cbef76fce8c0c2", "phi3", "phi4-mini", "Q4_K_M"},
    {"phi-3.5-mini", "Phi-3.5-mini-instruct", "3.8B", "bartowski/Phi-3.5-mini-instruct-GGUF",
     "b1693692c4758ac83f0d0e65aff9b4f945f29941", "Phi-3.5-mini-instruct-Q4_K_M.gguf", 2393232672u,
     "e4165e3a71af97f1b4820da61079826d8752a2088e313af0c7d346796c38eff5", "phi3", "phi3", "Q4_K_M"},
    {"phi-4", "phi-4", "14.7B", "bartowski/phi-4-GGUF", "17e314f32ffbf1594c644b29985cc1e8cbe28ca1",
     "phi-4-Q4_K_M.gguf", 9053114816u, "009aba717c09d4a35890c7d35eb59d54e1dba884c7c526e7197d9c13ab5911d9",
     "phi3", "phi4", "Q4_K_M"},
    {"llama-3.2-1b", "Llama-3.2-1B-Instruct", "1.2B", "bartowski/Llama-3.2-1B-Instruct-GGUF",
     "d52af3776f99ddf220e5ffd3f93b2a4e4df105be", "Llama-3.2-1B-Instruct-Q4_K_M.gguf", 807694464u,
     "6f85a640a97cf2bf5b8e764087b1e83da0fdb51d7c9fab7d0fece9385611df83", "llama", "llama3", "Q4_K_M"},
    {"llama-3.2-3b", "Llama-3.2-3B-Instruct", "3.2B", "bartowski/Llama-3.2-3B-Instruct-GGUF",
     "c346bfc2029e79ba6d7edf026cf01fe44242db0d", "Llama-3.2-3B-Instruct-Q4_K_M.gguf", 2019377696u,
     "6c1a2b41161032677be168d354123594c0e6e67d2b9227c84f296ad037c728ff", "llama", "llama3", "Q4_K_M"},
    {"qwen2.5-0.5b", "Qwen2.5-0.5B-Instruct", "0.5B", "bartowski/Qwen2.5-0.5B-Instruct-GGUF",
     "b26a58accf53b1a19fbc555d52fdb224bec473f5", "Qwen2.5-0.5B-Instruct-Q4_K_M.gguf", 397808192u,
     "6eb923e7d26e9cea28811e1a8e852009b21242fb157b26149d3b188f3a8c8653", "qwen2", "chatml", "Q4_K_M"},
    {"qwen2.5-1.5b", "Qwen2.5-1.5B-Instruct", "1.5B", "Qwen/Qwen2.5-1.5B-Instruct-GGUF",
     "91cad51170dc346986eccefdc2dd33a9da36ead9", "qwen2.5-1.5b-instruct-q4_k_m.gguf", 1117320736u,
     "6a1a2eb6d15622bf3c96857206351ba97e1af16c30d7a74ee38970e434e9407e", "qwen2", "chatml", "Q4_K_M"},
    {"qwen3-1.7b", "Qwen3-1.7B", "1.7B", "unsloth/Qwen3-1.7B-GGUF", "d7f544eead698dbd1f15126ef60b45a1e1933222",
     "Qwen3-1.7B-Q4_K_M.gguf", 1107409472u, "b139949c5bd74937ad8ed8c8cf3d9ffb1e99c866c823204dc42c0d91fa181897",
     "qwen3", "qwen3", "Q4_K_M"},
};

static bool models_ascii_ieq(const char *a, const char *b) {
    for (; *a && *b; a++, b++) {
        int ca = (unsigned char)*a, cb = (unsigned char)*b;
        if (ca >= 'A' && ca <= 'Z') ca += 32;
        if (cb >= 'A' && cb <= 'Z') cb += 32;
        if (ca != cb) return false;
    }
    return *a == *b;
}

// The registry entry called name (ASCII case-insensitive), or NULL.
static const models_entry *models_find(const char *name) {
    if (!name) return NULL;
    for (size_t i = 0; i < PSV_ARRAY_LEN(models_registry); i++)
        if (models_ascii_ieq(models_registry[i].name, name)) return &models_registry[i];
    return NULL;
}

// The registry entry whose file is called file (exact), or NULL.
static const models_entry *models_find_file(const char *file) {
    if (!file) return NULL;
    for (size_t i = 0; i < PSV_ARRAY_LEN(models_registry); i++)
        if (!strcmp(models_registry[i].file, file)) return &models_registry[i];
    return NULL;
}

// "name1, name2, ..." of every registry entry, for messages.
static void models_names(buf_t *b) {
    for (size_t i = 0; i < PSV_ARRAY_LEN(models_registry); i++)
        buf_printf(b, "%s%s", i ? ", " : "", models_registry[i].name);
}

// Sizes as people read them on the hub: decimal units, three significant digits.
static void models_human_size(uint64_t n, char out[32]) {
    if (n >= 1000000000u) snprintf(out, 32, "%.2f GB", (double)n / 1e9);
    else if (n >= 1000000u) snprintf(out, 32, "%.1f MB", (double)n / 1e6);
    else if (n >= 1000u) snprintf(out, 32, "%.1f kB", (double)n / 1e3);
    else snprintf(out, 32, "%u B", (unsigned)n);
}

// dir + "/" + file + suffix into out; false (out unchanged past its first byte) when it does not fit.
static bool models_join(char *out, size_t cap, const char *dir, const char *file, const char *suffix) {
    int n = snprintf(out, cap, "%s%s%s%s", dir ? dir : "", dir && *dir ? "/" : "", file, suffix ? suffix : "");
    return n >= 0 && (size_t)n < cap;
}

static bool models_is_hex(int c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

// Parses exactly 64 hex digits (either case) from s[0..n) into lower-case hex. false otherwise.
static bool models_parse_hex64(const char *s, size_t n, char out[65]) {
    if (!s || n != 64) return false;
    for (size_t i = 0; i < 64; i++) {
        if (!models_is_hex((unsigned char)s[i])) return false;
        char c = s[i];
        out[i] = (char)(c >= 'A' && c <= 'F' ? c + 32 : c);
    }
    out[64] = 0;
    return true;
}

// The SHA-256 an entity tag carries, when it is one: a strong tag "HEX" (RFC 9110 §8.8.3) or a
// bare 64-hex value, the form in which the Hugging Face hub exposes a Git LFS file's SHA-256 in
// X-Linked-Etag and ETag. A weak tag (W/"...") promises no byte identity, so it never counts.
PSV_MAYBE_UNUSED static bool models_etag_digest(const char *v, size_t n, char out[65]) {
    while (n > 0 && (*v == ' ' || *v == '\t')) v++, n--;
    while (n > 0 && (v[n - 1] == ' ' || v[n - 1] == '\t' || v[n - 1] == '\r' || v[n - 1] == '\n')) n--;
    if (n >= 2 && v[0] == '"' && v[n - 1] == '"') v++, n -= 2;
    return models_parse_hex64(v, n, out);
}

// Parses a decimal uint64 from s[*i..n), advancing *i; false on no digits or a value of
// UINT64_MAX or more (UINT64_MAX itself is the callers' "unknown", so it is never a number).
static bool models_parse_u64(const char *s, size_t n, size_t *i, uint64_t *out) {
    uint64_t v = 0;
    size_t start = *i;
    while (*i < n && s[*i] >= '0' && s[*i] <= '9') {
        if (!ck_mul_u64(v, 10, &v) || !ck_add_u64(v, (uint64_t)(s[*i] - '0'), &v)) return false;
        (*i)++;
    }
    *out = v;
    return *i > start && v != UINT64_MAX;
}

// Content-Range (RFC 9110 §14.4): "bytes FIRST-LAST/COMPLETE" with COMPLETE a number or "*", or
// the unsatisfied form "bytes */COMPLETE" sent with 416. Unknown parts are UINT64_MAX: *first and
// *last for the unsatisfied form, *complete for "*". false on anything malformed, including
// LAST < FIRST or LAST >= COMPLETE.
PSV_MAYBE_UNUSED static bool models_parse_content_range(const char *v, size_t n, uint64_t *first, uint64_t *last,
                                                        uint64_t *complete) {
    size_t i = 0;
    while (i < n && (v[i] == ' ' || v[i] == '\t')) i++;
    while (n > i && (v[n - 1] == ' ' || v[n - 1] == '\t' || v[n - 1] == '\r' || v[n - 1] == '\n')) n--;
    if (n - i < 6 || memcmp(v + i, "bytes", 5) != 0 || v[i + 5] != ' ') return false;
    i += 6;
    while (i < n && v[i] == ' ') i++;
    if (i < n && v[i] == '*') {
        *first = *last = UINT64_MAX;
        i++;
    } else {
        if (!models_parse_u64(v, n, &i, first) || i >= n || v[i] != '-') return false;
        i++;
        if (!models_parse_u64(v, n, &i, last) || *last < *first) return false;
    }
    if (i >= n || v[i] != '/') return false;
    i++;
    if (i < n && v[i] == '*' && i + 1 == n) {
        if (*first == UINT64_MAX) return false; // "bytes */*" says nothing
        *complete = UINT64_MAX;
        return true;
    }
    if (!models_parse_u64(v, n, &i, complete) || i != n) return false;
    return *first == UINT64_MAX || *last < *complete;
}

// A name that can live in the cache directory as is: 1..200 bytes of [A-Za-z0-9._+-], not
// starting with '.', so it can never climb out of the directory or hide as a dotfile.
static bool models_safe_filename(const char *name) {
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n > 200 || name[0] == '.') return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)name[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
              c == '-' || c == '+'))
            return false;
    }
    return true;
}

// The file name a URL downloads to: its last path segment, without query or fragment, which
// must be a safe file name (no percent-decoding: an encoded name is refused, not guessed at).
PSV_MAYBE_UNUSED static bool models_url_filename(const char *url, char *out, size_t cap) {
    const char *p = strstr(url, "://");
    if (!p) return false;
    p += 3;
    size_t end = strcspn(p, "?#");
    const char *path = memchr(p, '/', end);
    if (!path) return false;
    const char *seg = path, *stop = p + end;
    for (const char *q = path; q < stop; q++)
        if (*q == '/') seg = q + 1;
    size_t n = (size_t)(stop - seg);
    if (n == 0 || n >= cap) return false;
    memcpy(out, seg, n);
    out[n] = 0;
    return models_safe_filename(out);
}

// The download URL of a registry entry: BASE/REPO/resolve/REVISION/FILE (the hub's file route).
// base is a mirror with the same layout, or NULL for PSV_MODELS_HUB; trailing slashes are dropped.
static psv_status models_url(const models_entry *e, const char *base, char *out, size_t cap, psv_error *err) {
    if (!base || !*base) base = PSV_MODELS_HUB;
    size_t bn = strlen(base);
    while (bn > 0 && base[bn - 1] == '/') bn--;
    int n = snprintf(out, cap, "%.*s/%s/resolve/%s/%s", (int)bn, base, e->repo, e->revision, e->file);
    if (n < 0 || (size_t)n >= cap)
        return err_set(err, PSV_ERR_RANGE, "models: %s: URL longer than %zu bytes", e->name, cap - 1);
    return PSV_OK;
}

// The mirror from the environment (PENSIEVE_MIRROR), or NULL.
static const char *models_mirror_env(void) {
    const char *m = getenv("PENSIEVE_MIRROR");
    return m && *m ? m : NULL;
}

// The cache directory from the three variables that decide it, in order: $PENSIEVE_HOME, then
// $XDG_CACHE_HOME/pensieve, then $HOME/.cache/pensieve. Empty values count as unset, and so does a
// relative XDG_CACHE_HOME (the XDG Base Directory spec: "If an implementation encounters a
// relative path in any of these variables it should consider the path invalid and ignore it").
// Pure, so tests can drive it; models_cache_dir reads the real environment.
static psv_status models_cache_dir_from(const char *pensieve_home, const char *xdg_cache_home, const char *home,
                                        char *out, size_t cap, psv_error *err) {
    int n;
    if (pensieve_home && *pensieve_home) n = snprintf(out, cap, "%s", pensieve_home);
    else if (xdg_cache_home && xdg_cache_home[0] == '/') n = snprintf(out, cap, "%s/pensieve", xdg_cache_home);
    else if (home && *home) n = snprintf(out, cap, "%s/.cache/pensieve", home);
    else
        return err_set(err, PSV_ERR_INVALID,
                       "models: cache directory: none of PENSIEVE_HOME, XDG_CACHE_HOME or HOME is set "
                       "(set PENSIEVE_HOME to the directory for models)");
    if (n < 0 || (size_t)n >= cap)
        return err_set(err, PSV_ERR_RANGE, "models: cache directory: path longer than %zu bytes", cap - 1);
    while (n > 1 && out[n - 1] == '/') out[--n] = 0;
    return PSV_OK;
}

static psv_status models_cache_dir(char *out, size_t cap, psv_error *err) {
    return models_cache_dir_from(getenv("PENSIEVE_HOME"), getenv("XDG_CACHE_HOME"), getenv("HOME"), out, cap, err);
}

// mkdir -p with mode 0700 for the directories it creates (the XDG spec's mode for cache
// directories: models can be private). Existing directories are left as they are.
PSV_MAYBE_UNUSED static psv_status models_mkdir_p(const char *dir, psv_error *err) {
    char path[MODELS_PATH_MAX];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof path) return err_set(err, PSV_ERR_RANGE, "models: directory path too long or empty");
    memcpy(path, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (path[i] != '/' && path[i] != 0) continue;
        char c = path[i];
        path[i] = 0;
        if (mkdir(path, 0700) != 0 && errno != EEXIST)
            return err_set(err, PSV_ERR_IO, "models: cannot create directory %s: %s", path, strerror(errno));
        path[i] = c;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return err_set(err, PSV_ERR_IO, "models: %s: not a directory", dir);
    return PSV_OK;
}

// fsync a directory so that renames and unlinks in it are durable (POSIX leaves this to the
// directory's own fsync; ext4 and XFS need it).
PSV_MAYBE_UNUSED static psv_status models_fsync_dir(const char *dir, psv_error *err) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return err_set(err, PSV_ERR_IO, "models: cannot open directory %s: %s", dir, strerror(errno));
    psv_status st = PSV_OK;
    if (fsync(fd) != 0 && errno != EINVAL) // some filesystems cannot fsync directories: nothing to do
        st = err_set(err, PSV_ERR_IO, "models: fsync %s: %s", dir, strerror(errno));
    close(fd);
    return st;
}

// Reads the sidecar of the model file at path (path + ".sha256", a sha256sum line whose digest
// comes first) into hex. PSV_ERR_IO when there is none, PSV_ERR_FORMAT when it is malformed.
static psv_status models_sidecar_read(const char *path, char hex[65], psv_error *err) {
    char sc[MODELS_PATH_MAX], line[512];
    if (!models_join(sc, sizeof sc, NULL, path, ".sha256"))
        return err_set(err, PSV_ERR_RANGE, "models: %s: path too long", path);
    int fd = open(sc, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return err_set(err, PSV_ERR_IO, "models: %s: cannot open: %s", sc, strerror(errno));
    ssize_t k = read(fd, line, sizeof line - 1);
    close(fd);
    if (k < 0) return err_set(err, PSV_ERR_IO, "models: %s: read error: %s", sc, strerror(errno));
    line[k] = 0;
    size_t n = (size_t)k;
    // "HEX", "HEX\n", or "HEX  NAME\n" / "HEX *NAME\n" (sha256sum's text and binary modes)
    bool end_ok = n == 64 || (n > 64 && (line[64] == '\n' || line[64] == ' '));
    if (!end_ok || !models_parse_hex64(line, 64, hex))
        return err_set(err, PSV_ERR_FORMAT, "models: %s: not a SHA-256 sidecar (expected 64 hex digits first)", sc);
    return PSV_OK;
}

// Writes dir/file.sha256 = "HEX  file\n" through a temporary file, fsync and rename, so the
// sidecar is either the old one or the new one, never half of either.
PSV_MAYBE_UNUSED static psv_status models_sidecar_write(const char *dir, const char *file, const char hex[65],
                                                        psv_error *err) {
    char sc[MODELS_PATH_MAX], tmp[MODELS_PATH_MAX], line[320];
    if (!models_join(sc, sizeof sc, dir, file, ".sha256") || !models_join(tmp, sizeof tmp, dir, file, ".sha256.tmp"))
        return err_set(err, PSV_ERR_RANGE, "models: %s: path too long", file);
    int n = snprintf(line, sizeof line, "%s  %s\n", hex, file);
    if (n < 0 || (size_t)n >= sizeof line) return err_set(err, PSV_ERR_RANGE, "models: %s: name too long", file);
    psv_status st = PSV_OK;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) return err_set(err, PSV_ERR_IO, "models: cannot create %s: %s", tmp, strerror(errno));
    if (write(fd, line, (size_t)n) != n || fsync(fd) != 0) {
        st = err_set(err, PSV_ERR_IO, "models: cannot write %s: %s", tmp, strerror(errno));
        goto done;
    }
    if (rename(tmp, sc) != 0) {
        st = err_set(err, PSV_ERR_IO, "models: cannot rename %s to %s: %s", tmp, sc, strerror(errno));
        goto done;
    }
    st = models_fsync_dir(dir, err);
done:
    close(fd);
    if (st != PSV_OK) unlink(tmp);
    return st;
}

// The per-file lock that keeps two pulls of one file from writing it at once. fcntl locks are
// POSIX and die with their process, so a killed pull never leaves the file locked. The holder
// unlinks the lock file before releasing it; a waiter that then wins the lock on the unlinked
// inode sees that the path no longer names it and starts over, so two processes can never both
// believe they hold it. wait=false returns PSV_ERR_RANGE at once when another process holds it,
// with its pid in *holder. log (may be NULL) gets one line, starting with who, when waiting.
static psv_status models_lock(const char *dir, const char *file, bool wait, FILE *log, const char *who, int *fd_out,
                              long *holder, psv_error *err) {
    char path[MODELS_PATH_MAX];
    *fd_out = -1;
    if (holder) *holder = 0;
    if (!models_join(path, sizeof path, dir, file, ".lock"))
        return err_set(err, PSV_ERR_RANGE, "models: %s: path too long", file);
    bool said = false;
    for (;;) {
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (fd < 0) return err_set(err, PSV_ERR_IO, "models: cannot open %s: %s", path, strerror(errno));
        struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
        if (fcntl(fd, F_SETLK, &fl) != 0) {
            if (errno != EACCES && errno != EAGAIN) {
                int e = errno;
                close(fd);
                return err_set(err, PSV_ERR_IO, "models: cannot lock %s: %s", path, strerror(e));
            }
            struct flock q = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
            long pid = fcntl(fd, F_GETLK, &q) == 0 && q.l_type != F_UNLCK ? (long)q.l_pid : 0;
            if (holder) *holder = pid;
            if (!wait) {
                close(fd);
                return err_set(err, PSV_ERR_RANGE, "models: %s is being downloaded by another process (pid %ld)",
                               file, pid);
            }
            if (log && !said) {
                fprintf(log, "%s: waiting: another process (pid %ld) is downloading %s\n", who ? who : "pensieve",
                        pid, file);
                said = true;
            }
            while (fcntl(fd, F_SETLKW, &fl) != 0) {
                if (errno != EINTR) {
                    int e = errno;
                    close(fd);
                    return err_set(err, PSV_ERR_IO, "models: cannot lock %s: %s", path, strerror(e));
                }
            }
        }
        struct stat a, b;
        if (fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
            *fd_out = fd;
            return PSV_OK;
        }
        close(fd); // we locked a lock file its holder had already removed: take the new one
    }
}

// Releases a lock from models_lock: removes the lock file while still holding it (see above).
static void models_unlock(const char *dir, const char *file, int fd) {
    if (fd < 0) return;
    char path[MODELS_PATH_MAX];
    if (models_join(path, sizeof path, dir, file, ".lock")) unlink(path);
    close(fd);
}

// What `list` reports for a cached file, from its sidecar, its size and the registry; no hashing.
typedef enum {
    MODELS_VERIFIED,   // a sidecar, agreeing with the registry's digest and size where known
    MODELS_UNVERIFIED, // no sidecar: put there by hand (`pensieve verify` checks and records it)
    MODELS_MISMATCH,   // sidecar unreadable or disagreeing with the registry, or wrong size
} models_state;

static const char *models_state_name(models_state s) {
    switch (s) {
    case MODELS_VERIFIED: return "verified";
    case MODELS_UNVERIFIED: return "unverified";
    case MODELS_MISMATCH: return "MISMATCH";
    }
    return "?";
}

// e may be NULL (a file the registry does not know). size is the file's size.
static models_state models_file_state(const char *path, uint64_t size, const models_entry *e) {
    char hex[65];
    psv_error err = {0};
    psv_status st = models_sidecar_read(path, hex, &err);
    if (st == PSV_ERR_IO) return MODELS_UNVERIFIED;
    if (st != PSV_OK) return MODELS_MISMATCH;
    if (e && e->sha256[0] && strcmp(hex, e->sha256) != 0) return MODELS_MISMATCH;
    if (e && e->size && size != e->size) return MODELS_MISMATCH;
    return MODELS_VERIFIED;
}

// The result of resolving `--model PATH|NAME`.
typedef struct {
    char path[MODELS_PATH_MAX];  // the file to open (for a missing registry model: where it belongs)
    const models_entry *entry;   // the registry entry (also for a path to a registry file), else NULL
    bool missing;                // entry is set and its file is not in the cache yet
    models_state state;          // sidecar state of path when it exists
} models_resolved;

// Appends s as one POSIX shell word: in single quotes, each ' written as '\'' (the only
// character single quotes cannot hold), so printed commands can be pasted as they are.
static void models_shell_quote(buf_t *b, const char *s) {
    buf_putc(b, '\'');
    for (; *s; s++) {
        if (*s == '\'') buf_puts(b, "'\\''");
        else buf_putc(b, *s);
    }
    buf_putc(b, '\'');
}

// The plain curl command that downloads registry entry e to path (resuming with -C -).
static void models_curl_command(buf_t *b, const models_entry *e, const char *path, const char *mirror) {
    char url[1024];
    if (models_url(e, mirror, url, sizeof url, NULL) != PSV_OK) snprintf(url, sizeof url, "(URL too long)");
    buf_puts(b, "curl -fL -C - --create-dirs -o ");
    models_shell_quote(b, path);
    buf_putc(b, ' ');
    models_shell_quote(b, url);
}

// Instructions to fetch a registry model by hand, several lines, each ending in '\n': the
// pensieve-pull command and a plain curl line with the URL, then the expected digest.
static void models_fetch_help(const models_entry *e, const char *path, const char *mirror, buf_t *out) {
    char size[32];
    models_human_size(e->size, size);
    buf_printf(out, "fetch %s (%s, %s) with:\n  pensieve pull %s\n", e->name, e->title, size, e->name);
    buf_puts(out, "or without pensieve-pull:\n  ");
    models_curl_command(out, e, path, mirror);
    buf_putc(out, '\n');
    if (e->sha256[0]) {
        buf_puts(out, "  and check that `sha256sum ");
        models_shell_quote(out, path);
        buf_printf(out, "` prints %s\n", e->sha256);
    }
}

// Resolves `--model PATH|NAME`. name_or_path NULL or "" means $PENSIEVE_MODEL, else the default
// model (PSV_MODELS_DEFAULT). A registry name resolves to its file in the cache directory; any
// other value is a path (a bare file name is also looked for in the cache directory, where URL
// pulls put their files). Errors: an unknown name lists the known ones (PSV_ERR_INVALID); a
// registry model not downloaded yet is PSV_ERR_IO with out->missing set and out->path where it
// belongs, and the message names the command that fetches it; a missing path is PSV_ERR_IO.
static psv_status models_resolve_ex(const char *name_or_path, models_resolved *out, psv_error *err) {
    memset(out, 0, sizeof *out);
    const char *arg = name_or_path;
    if (!arg || !*arg) arg = getenv("PENSIEVE_MODEL");
    if (!arg || !*arg) arg = PSV_MODELS_DEFAULT;
    char dir[MODELS_PATH_MAX];
    struct stat st;
    const models_entry *e = strchr(arg, '/') ? NULL : models_find(arg);
    if (e) {
        psv_status s = models_cache_dir(dir, sizeof dir, err);
        if (s != PSV_OK) return s;
        if (!models_join(out->path, sizeof out->path, dir, e->file, NULL))
            return err_set(err, PSV_ERR_RANGE, "models: %s: cache path too long", e->name);
        out->entry = e;
        if (stat(out->path, &st) == 0 && S_ISREG(st.st_mode)) {
            out->state = models_file_state(out->path, (uint64_t)st.st_size, e);
            return PSV_OK;
        }
        out->missing = true;
        // One line naming both ways to fetch it, when it fits in the error record (it does for
        // ordinary paths), else the command alone; models_fetch_help has the multi-line form.
        buf_t b = {0};
        buf_printf(&b, "models: %s is not downloaded yet; fetch it with `pensieve pull %s`, or: ", e->name, e->name);
        models_curl_command(&b, e, out->path, models_mirror_env());
        if (e->sha256[0]) buf_printf(&b, " (its SHA-256 must be %s)", e->sha256);
        psv_status r;
        if (!b.oom && b.len < sizeof err->message)
            r = err_set(err, PSV_ERR_IO, "%s", b.data);
        else
            r = err_set(err, PSV_ERR_IO, "models: %s is not downloaded yet (%s); fetch it with `pensieve pull %s`",
                        e->name, out->path, e->name);
        buf_free(&b);
        return r;
    }
    size_t arg_len = strlen(arg);
    if (arg_len >= sizeof out->path) return err_set(err, PSV_ERR_RANGE, "models: model path too long");
    memcpy(out->path, arg, arg_len + 1);
    bool found = stat(arg, &st) == 0;
    if (!found && !strchr(arg, '/') && models_cache_dir(dir, sizeof dir, NULL) == PSV_OK &&
        models_join(out->path, sizeof out->path, dir, arg, NULL) && stat(out->path, &st) == 0)
        found = true;
    if (!found) {
        snprintf(out->path, sizeof out->path, "%s", arg);
        size_t n = strlen(arg);
        bool looks_like_name = !strchr(arg, '/') && !(n > 5 && !strcmp(arg + n - 5, ".gguf"));
        if (looks_like_name) {
            buf_t b = {0};
            models_names(&b);
            psv_status r = err_set(err, PSV_ERR_INVALID,
                                   "models: '%s' is neither a known model (%s) nor an existing file", arg,
                                   b.oom ? "?" : b.data);
            buf_free(&b);
            return r;
        }
        return err_set(err, PSV_ERR_IO, "models: %s: no such file", arg);
    }
    if (!S_ISREG(st.st_mode)) return err_set(err, PSV_ERR_IO, "models: %s: not a regular file", out->path);
    const char *base = strrchr(out->path, '/');
    out->entry = models_find_file(base ? base + 1 : out->path);
    out->state = models_file_state(out->path, (uint64_t)st.st_size, out->entry);
    return PSV_OK;
}

// models_resolve_ex for callers that only want the path: path_out gets the file to open.
PSV_MAYBE_UNUSED static psv_status models_resolve(const char *name_or_path, char *path_out, size_t cap,
                                                  psv_error *err) {
    models_resolved r;
    psv_status st = models_resolve_ex(name_or_path, &r, err);
    if (st != PSV_OK) return st;
    if (strlen(r.path) >= cap) return err_set(err, PSV_ERR_RANGE, "models: %s: path longer than %zu bytes", r.path, cap - 1);
    memcpy(path_out, r.path, strlen(r.path) + 1);
    return PSV_OK;
}

static bool models_executable(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

// Finds pensieve-pull: $PENSIEVE_PULL when set, else next to this program (/proc/self/exe's
// directory, its tools/ subdirectory, or ../tools/ as in a build tree), else on $PATH. Returns
// false when there is none. The search order is what `pensieve pull --help` describes.
static bool models_find_pull_tool(char *out, size_t cap) {
    const char *env = getenv("PENSIEVE_PULL");
    if (env && *env) {
        if (strlen(env) >= cap) return false;
        snprintf(out, cap, "%s", env);
        return models_executable(out);
    }
    char exe[MODELS_PATH_MAX];
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1); // Linux; elsewhere PATH alone
    if (k > 0) {
        exe[k] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            static const char *const rel[] = {"pensieve-pull", "tools/pensieve-pull", "../tools/pensieve-pull"};
            for (size_t i = 0; i < PSV_ARRAY_LEN(rel); i++)
                if (models_join(out, cap, exe, rel[i], NULL) && models_executable(out)) return true;
        }
    }
    const char *path = getenv("PATH");
    while (path && *path) {
        size_t n = strcspn(path, ":");
        if (n > 0 && n < MODELS_PATH_MAX) {
            char d[MODELS_PATH_MAX];
            memcpy(d, path, n);
            d[n] = 0;
            if (models_join(out, cap, d, "pensieve-pull", NULL) && models_executable(out)) return true;
        }
        path += n;
        if (*path == ':') path++;
    }
    return false;
}

// Runs tool with argv (argv[0] is what the tool sees as its name; NULL-terminated) and waits for
// it. Its output goes straight to ours, so its progress bar shows. Returns its exit status, 128+N
// when killed by signal N, or -1 (errno set) when it could not be started.
static int models_run_tool(const char *tool, char *const argv[]) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        execv(tool, argv);
        fprintf(stderr, "pensieve: cannot run %s: %s\n", tool, strerror(errno));
        _exit(127);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return -1;
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return -1;
}

// What to tell someone who has no pensieve-pull.
static void models_no_tool_help(FILE *f) {
    fprintf(f, "the download tool pensieve-pull was not found (looked at $PENSIEVE_PULL, next to this program, "
               "in its tools/ directory and on PATH).\n"
               "Build it from the source tree with `make` (it needs libcurl's development files: "
               "`sudo apt-get install libcurl4-openssl-dev` on Debian/Ubuntu, libcurl-devel on Fedora), "
               "or put it on PATH.\n");
}

// For the server's zero-config start: resolves like models_resolve_ex and, when the model is a
// registry model that is not downloaded yet and allow_pull is set, runs pensieve-pull for it
// (progress on the terminal), then resolves again. mirror (or NULL: PENSIEVE_MIRROR, then the hub)
// is passed on. log (may be NULL) gets what is being done and, on failure, the commands to fetch
// the model by hand; err gets one line for the caller's exit message.
PSV_MAYBE_UNUSED static psv_status models_ensure(const char *name_or_path, const char *mirror, bool allow_pull,
                                                 FILE *log, models_resolved *out, psv_error *err) {
    psv_error first = {0};
    psv_status st = models_resolve_ex(name_or_path, out, &first);
    if (st == PSV_OK) return PSV_OK;
    if (!out->missing) return err_set(err, st, "%s", first.message);
    const models_entry *e = out->entry;
    char tool[MODELS_PATH_MAX];
    buf_t help = {0};
    if (!mirror || !*mirror) mirror = models_mirror_env();
    models_fetch_help(e, out->path, mirror, &help);
    if (!allow_pull) {
        if (log) fprintf(log, "pensieve: %s is not downloaded yet; %s", e->name, help.oom ? "\n" : help.data);
        st = err_set(err, PSV_ERR_IO, "models: %s is not downloaded yet (%s)", e->name, out->path);
        goto done;
    }
    if (!models_find_pull_tool(tool, sizeof tool)) {
        if (log) {
            fprintf(log, "pensieve: %s is not downloaded yet and ", e->name);
            models_no_tool_help(log);
            fprintf(log, "%s", help.oom ? "" : help.data);
        }
        st = err_set(err, PSV_ERR_IO, "models: %s is not downloaded yet and pensieve-pull was not found", e->name);
        goto done;
    }
    char size[32];
    models_human_size(e->size, size);
    if (log) fprintf(log, "pensieve: %s (%s) is not downloaded yet: fetching it with %s\n", e->name, size, tool);
    char *argv[6] = {"pensieve-pull", (char *)e->name, NULL, NULL, NULL, NULL};
    if (mirror) argv[2] = "--mirror", argv[3] = (char *)mirror;
    int rc = models_run_tool(tool, argv);
    if (rc != 0) {
        if (log) fprintf(log, "pensieve: could not download %s; to try again later, %s", e->name, help.oom ? "\n" : help.data);
        if (rc < 0) st = err_set(err, PSV_ERR_IO, "models: cannot run %s: %s", tool, strerror(errno));
        else st = err_set(err, PSV_ERR_IO, "models: downloading %s failed (pensieve-pull exit status %d)", e->name, rc);
        goto done;
    }
    st = models_resolve_ex(name_or_path, out, err);
done:
    buf_free(&help);
    return st;
}

// The registry as a table. dir (may be NULL) marks the models already in that directory.
PSV_MAYBE_UNUSED static void models_registry_print(FILE *f, const char *dir) {
    fprintf(f, "%-14s %-6s %-9s %-7s %-6s %-10s %s\n", "NAME", "PARAMS", "SIZE", "QUANT", "ARCH", "CHAT", "SOURCE");
    for (size_t i = 0; i < PSV_ARRAY_LEN(models_registry); i++) {
        const models_entry *e = &models_registry[i];
        char size[32], path[MODELS_PATH_MAX], name[64];
        models_human_size(e->size, size);
        struct stat st;
        bool have = dir && models_join(path, sizeof path, dir, e->file, NULL) && stat(path, &st) == 0;
        snprintf(name, sizeof name, "%s%s", e->name, !strcmp(e->name, PSV_MODELS_DEFAULT) ? "*" : "");
        fprintf(f, "%-14s %-6s %-9s %-7s %-6s %-10s %s/%s%s\n", name, e->params, size, e->quant, e->arch,
                e->chat_format, e->repo, e->file, have ? "  [downloaded]" : "");
    }
    fprintf(f, "* the default model. Each file is pinned to a repository commit and checked against its SHA-256.\n");
}

static bool models_has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n > k && !strcmp(s + n - k, suffix);
}

static void models_list_usage(FILE *f) {
    fprintf(f, "usage: pensieve list [--all]\n"
               "Lists the models in the cache directory ($PENSIEVE_HOME, else $XDG_CACHE_HOME/pensieve, else\n"
               "~/.cache/pensieve) with their size and verification state:\n"
               "  verified    the digest recorded at download (FILE.sha256) matches the registry\n"
               "  unverified  no recorded digest: `pensieve verify NAME` checks the file and records it\n"
               "  MISMATCH    the recorded digest or the size disagrees with the registry: pull it again\n"
               "  partial     an interrupted download: `pensieve pull NAME` resumes it\n"
               "States come from the recorded digests; `pensieve verify` re-reads the files.\n"
               "  --all   also list the registry's models that are not downloaded\n");
}

// `pensieve list [--all]`: the cache directory's models, their size and state.
PSV_MAYBE_UNUSED static int cli_list(int argc, char **argv) {
    bool all = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            models_list_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--all")) {
            all = true;
        } else {
            fprintf(stderr, "pensieve list: unknown argument '%s' (try --help)\n", argv[i]);
            return 2;
        }
    }
    char dir[MODELS_PATH_MAX];
    psv_error err = {0};
    if (models_cache_dir(dir, sizeof dir, &err) != PSV_OK) {
        fprintf(stderr, "pensieve list: %s\n", err.message);
        return 1;
    }
    // Collect names first so the table comes out sorted whatever order readdir gives.
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    DIR *d = opendir(dir);
    if (!d && errno != ENOENT) {
        fprintf(stderr, "pensieve list: cannot read %s: %s\n", dir, strerror(errno));
        return 1;
    }
    for (struct dirent *de; d && (de = readdir(d));) {
        const char *nm = de->d_name;
        if (!models_safe_filename(nm) || !(models_has_suffix(nm, ".gguf") || models_has_suffix(nm, ".gguf.partial")))
            continue;
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 16;
            char **p = realloc(names, nc * sizeof *p);
            if (!p) {
                rc = 1;
                break;
            }
            names = p;
            cap = nc;
        }
        if (!(names[n] = str_dup(str_c(nm)))) {
            rc = 1;
            break;
        }
        n++;
    }
    if (d) closedir(d);
    if (rc) {
        fprintf(stderr, "pensieve list: out of memory\n");
        goto done;
    }
    for (size_t i = 1; i < n; i++) // insertion sort: a cache holds a handful of files
        for (size_t j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
            char *t = names[j];
            names[j] = names[j - 1];
            names[j - 1] = t;
        }
    printf("models in %s:\n", dir);
    printf("%-14s %-44s %-10s %s\n", "NAME", "FILE", "SIZE", "STATE");
    size_t rows = 0;
    for (size_t i = 0; i < n; i++) {
        char path[MODELS_PATH_MAX], size[32], state[160], file[256];
        struct stat st;
        if (!models_join(path, sizeof path, dir, names[i], NULL) || lstat(path, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        bool partial = models_has_suffix(names[i], ".partial");
        snprintf(file, sizeof file, "%.*s", (int)(strlen(names[i]) - (partial ? 8 : 0)), names[i]);
        const models_entry *e = models_find_file(file);
        models_human_size((uint64_t)st.st_size, size);
        if (partial) {
            char total[32];
            if (e) models_human_size(e->size, total);
            snprintf(state, sizeof state, "partial%s%s%s: `pensieve pull %s` resumes it", e ? " (of " : "",
                     e ? total : "", e ? ")" : "", e ? e->name : "URL");
        } else {
            snprintf(state, sizeof state, "%s", models_state_name(models_file_state(path, (uint64_t)st.st_size, e)));
        }
        printf("%-14s %-44s %-10s %s\n", e ? e->name : "-", names[i], size, state);
        rows++;
    }
    if (all) {
        for (size_t i = 0; i < PSV_ARRAY_LEN(models_registry); i++) {
            const models_entry *e = &models_registry[i];
            bool have = false;
            for (size_t j = 0; j < n && !have; j++) have = !strcmp(names[j], e->file);
            if (have) continue;
            char size[32];
            models_human_size(e->size, size);
            printf("%-14s %-44s %-10s %s\n", e->name, e->file, size, "not downloaded");
            rows++;
        }
    }
    if (rows == 0) printf("(none: `pensieve pull %s` downloads the default model)\n", PSV_MODELS_DEFAULT);
done:
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    return rc;
}

// For verify and rm: the cache file an argument names. A registry name gives its file; a bare
// file name gives that file in the cache directory. *e gets the registry entry, if any.
static bool models_cache_file_arg(const char *arg, const char **file, const models_entry **e) {
    *e = models_find(arg);
    if (*e) {
        *file = (*e)->file;
        return true;
    }
    if (!models_safe_filename(arg)) return false;
    *file = arg;
    *e = models_find_file(arg);
    return true;
}

// Re-hashes one file and compares with every reference it has: its sidecar and, when it is a
// registry file, the registry's digest and size. Records a sidecar when there was none and the
// registry's digest matched. Returns 0 when verified, 1 otherwise; messages on stdout/stderr.
static int models_verify_one(const char *arg) {
    char dir[MODELS_PATH_MAX], path[MODELS_PATH_MAX];
    const char *file = NULL;
    const models_entry *e = NULL;
    psv_error err = {0};
    struct stat st;
    if (!strchr(arg, '/') && models_cache_file_arg(arg, &file, &e)) {
        if (models_cache_dir(dir, sizeof dir, &err) != PSV_OK) goto fail;
        if (!models_join(path, sizeof path, dir, file, NULL)) {
            err_set(&err, PSV_ERR_RANGE, "%s: path too long", arg);
            goto fail;
        }
        if (stat(path, &st) != 0 && !e && stat(arg, &st) == 0) snprintf(path, sizeof path, "%s", arg); // ./FILE
    } else {
        if (strlen(arg) >= sizeof path) {
            err_set(&err, PSV_ERR_RANGE, "%s: path too long", arg);
            goto fail;
        }
        snprintf(path, sizeof path, "%s", arg);
        const char *base = strrchr(path, '/');
        e = models_find_file(base ? base + 1 : path);
    }
    if (stat(path, &st) != 0) {
        err_set(&err, PSV_ERR_IO, "%s: not found (%s)%s", arg, path,
                e ? "; `pensieve pull` downloads it" : "");
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        err_set(&err, PSV_ERR_IO, "%s: not a regular file", path);
        goto fail;
    }
    char side[65], actual[65];
    psv_error serr = {0};
    psv_status sst = models_sidecar_read(path, side, &serr);
    if (sst != PSV_OK && sst != PSV_ERR_IO) fprintf(stderr, "pensieve verify: warning: %s\n", serr.message);
    bool has_side = sst == PSV_OK, has_reg = e && e->sha256[0];
    if (e && e->size && (uint64_t)st.st_size != e->size) {
        err_set(&err, PSV_ERR_FORMAT, "%s: MISMATCH: %" PRIu64 " bytes, but %s is %" PRIu64 " bytes (registry)", path,
                (uint64_t)st.st_size, e->name, e->size);
        goto fail;
    }
    uint8_t digest[32];
    if (psv_sha256_file(path, digest, &err) != PSV_OK) goto fail;
    sha256_hex(digest, actual);
    if (!has_side && !has_reg) {
        err_set(&err, PSV_ERR_INVALID,
                "%s: sha256 %s, but there is nothing to compare it with (no %s.sha256 sidecar, and the registry does "
                "not know this file)",
                path, actual, path);
        goto fail;
    }
    bool bad = false;
    if (has_side && strcmp(side, actual) != 0) {
        fprintf(stderr, "pensieve verify: %s: MISMATCH with its sidecar %s.sha256\n  expected %s (sidecar)\n  actual   %s\n",
                path, path, side, actual);
        bad = true;
    }
    if (has_reg && strcmp(e->sha256, actual) != 0) {
        fprintf(stderr, "pensieve verify: %s: MISMATCH with the registry's %s\n  expected %s (registry)\n  actual   %s\n",
                path, e->name, e->sha256, actual);
        bad = true;
    }
    if (bad) return 1;
    const char *what = has_side && has_reg ? "the sidecar and the registry" : has_side ? "the sidecar" : "the registry";
    printf("%s: OK (sha256 %s matches %s)\n", path, actual, what);
    if (!has_side && sst == PSV_ERR_IO) {
        char pdir[MODELS_PATH_MAX];
        snprintf(pdir, sizeof pdir, "%s", path);
        char *slash = strrchr(pdir, '/');
        const char *fname = slash ? slash + 1 : path;
        if (slash) *slash = 0;
        psv_error werr = {0};
        if (models_sidecar_write(slash ? (pdir[0] ? pdir : "/") : ".", fname, actual, &werr) == PSV_OK)
            printf("%s: recorded in %s.sha256\n", path, path);
        else
            fprintf(stderr, "pensieve verify: warning: could not record the digest: %s\n", werr.message);
    }
    return 0;
fail:
    fprintf(stderr, "pensieve verify: %s\n", err.message);
    return 1;
}

// `pensieve verify NAME|PATH...`: re-hash and compare with the sidecar and the registry.
PSV_MAYBE_UNUSED static int cli_verify(int argc, char **argv) {
    int n = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: pensieve verify NAME|PATH...\n"
                   "Re-reads each model file, computes its SHA-256 and compares it with the digest recorded\n"
                   "when it was downloaded (FILE.sha256 next to it) and, for the registry's models, with the\n"
                   "registry's digest and size. NAME is a registry name or a file in the cache directory.\n"
                   "A file without a sidecar that matches the registry gets one. Exit status 0 when every\n"
                   "file is verified, 1 otherwise.\n");
            return 0;
        }
        if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "pensieve verify: unknown option '%s' (try --help)\n", argv[i]);
            return 2;
        }
        n++;
    }
    if (n == 0) {
        fprintf(stderr, "pensieve verify: name a model or a file (try --help)\n");
        return 2;
    }
    int rc = 0;
    for (int i = 1; i < argc; i++) rc |= models_verify_one(argv[i]);
    return rc;
}

// `pensieve rm NAME|FILE...`: deletes a model and everything that goes with it from the cache
// directory. Only names inside the cache directory are accepted, never paths.
PSV_MAYBE_UNUSED static int cli_rm(int argc, char **argv) {
    int n = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: pensieve rm NAME|FILE...\n"
                   "Deletes models from the cache directory: the file, its recorded digest and any partial\n"
                   "download. NAME is a registry name (see `pensieve list --all`), FILE a file name in the\n"
                   "cache directory. Refuses while a pull of the file is running.\n");
            return 0;
        }
        if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "pensieve rm: unknown option '%s' (try --help)\n", argv[i]);
            return 2;
        }
        n++;
    }
    if (n == 0) {
        fprintf(stderr, "pensieve rm: name a model (try --help)\n");
        return 2;
    }
    char dir[MODELS_PATH_MAX];
    psv_error err = {0};
    if (models_cache_dir(dir, sizeof dir, &err) != PSV_OK) {
        fprintf(stderr, "pensieve rm: %s\n", err.message);
        return 1;
    }
    int rc = 0;
    for (int i = 1; i < argc; i++) {
        const char *file;
        const models_entry *e;
        if (!models_cache_file_arg(argv[i], &file, &e)) {
            fprintf(stderr, "pensieve rm: '%s' is not a model name or a file name in %s\n", argv[i], dir);
            rc = 1;
            continue;
        }
        int lock = -1;
        long holder = 0;
        psv_error lerr = {0};
        if (models_lock(dir, file, false, NULL, NULL, &lock, &holder, &lerr) != PSV_OK) {
            fprintf(stderr, "pensieve rm: %s: not removed: %s\n", file, lerr.message);
            rc = 1;
            continue;
        }
        static const char *const suffixes[] = {"", ".sha256", ".partial", ".partial.meta", ".sha256.tmp"};
        uint64_t freed = 0;
        int removed = 0;
        for (size_t k = 0; k < PSV_ARRAY_LEN(suffixes); k++) {
            char path[MODELS_PATH_MAX];
            struct stat st;
            if (!models_join(path, sizeof path, dir, file, suffixes[k]) || lstat(path, &st) != 0) continue;
            if (unlink(path) != 0) {
                fprintf(stderr, "pensieve rm: cannot remove %s: %s\n", path, strerror(errno));
                rc = 1;
                continue;
            }
            freed += (uint64_t)st.st_size;
            removed++;
        }
        models_unlock(dir, file, lock);
        if (removed == 0) {
            fprintf(stderr, "pensieve rm: %s: not in %s\n", argv[i], dir);
            rc = 1;
        } else {
            char size[32];
            models_human_size(freed, size);
            printf("removed %s (%s)\n", file, size);
            models_fsync_dir(dir, NULL);
        }
    }
    return rc;
}

// `pensieve pull NAME|URL [options]`: runs pensieve-pull with the same arguments.
PSV_MAYBE_UNUSED static int cli_pull(int argc, char **argv) {
    char tool[MODELS_PATH_MAX];
    bool found = models_find_pull_tool(tool, sizeof tool);
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: pensieve pull NAME|URL [--dir DIR] [--sha256 HEX] [--mirror BASEURL] [--list] [...]\n"
               "Downloads a model into the cache directory with pensieve-pull, which resumes interrupted\n"
               "downloads and verifies every file's SHA-256. `pensieve pull --list` shows the registry;\n"
               "`pensieve-pull --help` documents every option.\n"
               "pensieve-pull is looked for at $PENSIEVE_PULL, next to this program, in its tools/\n"
               "directory, and on PATH: %s%s\n",
               found ? "found " : "not found", found ? tool : "");
        return 0;
    }
    if (!found) {
        fprintf(stderr, "pensieve pull: ");
        models_no_tool_help(stderr);
        const models_entry *e = argc >= 2 ? models_find(argv[1]) : NULL;
        char dir[MODELS_PATH_MAX], path[MODELS_PATH_MAX];
        if (e && models_cache_dir(dir, sizeof dir, NULL) == PSV_OK && models_join(path, sizeof path, dir, e->file, NULL)) {
            buf_t b = {0};
            models_fetch_help(e, path, models_mirror_env(), &b);
            if (!b.oom) fprintf(stderr, "Or %s", b.data);
            buf_free(&b);
        }
        return 1;
    }
    char **args = calloc((size_t)argc + 1, sizeof *args);
    if (!args) {
        fprintf(stderr, "pensieve pull: out of memory\n");
        return 1;
    }
    args[0] = "pensieve-pull";
    for (int i = 1; i < argc; i++) args[i] = argv[i];
    int rc = models_run_tool(tool, args);
    free(args);
    if (rc < 0) {
        fprintf(stderr, "pensieve pull: cannot run %s: %s\n", tool, strerror(errno));
        return 1;
    }
    return rc;
}

// ----------------------------------------------------------------------------
// 19. HTTP server
// An HTTP/1.1 server (RFC 9110, RFC 9112) speaking Anthropic's Messages API and OpenAI's chat
// and completions APIs, with Server-Sent Events for streaming. One thread per connection (at
// most PSV_HTTP_MAX_CONNS); generation runs on one of --parallel slots, each a psv_ctx whose
// KV cache keeps the last conversation so a follow-up request only evaluates what is new.
// Requests beyond the slots wait in a bounded queue. Every limit on client input is a named
// macro below; a broken or hostile client gets a status code and its connection closed, never
// a crash or a stuck thread.

#if !defined(PSV_NO_MAIN) || defined(PSV_SERVER)

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#ifndef PSV_HTTP_MAX_HEADER // request line + headers; beyond: 431 (or 414 for the line alone)
#define PSV_HTTP_MAX_HEADER (32u << 10)
#endif
#ifndef PSV_HTTP_MAX_LINE // request line alone
#define PSV_HTTP_MAX_LINE (8u << 10)
#endif
#ifndef PSV_HTTP_MAX_HEADERS // header fields per request
#define PSV_HTTP_MAX_HEADERS 100
#endif
#ifndef PSV_HTTP_MAX_BODY // request body; beyond: 413
#define PSV_HTTP_MAX_BODY (32u << 20)
#endif
#ifndef PSV_HTTP_MAX_CONNS // simultaneous connections; beyond: 503 and close
#define PSV_HTTP_MAX_CONNS 256
#endif
#ifndef PSV_HTTP_HEADER_TIMEOUT // seconds to receive a request's headers (slow clients)
#define PSV_HTTP_HEADER_TIMEOUT 10
#endif
#ifndef PSV_HTTP_IDLE_TIMEOUT // seconds a kept-alive connection may wait for its next request
#define PSV_HTTP_IDLE_TIMEOUT 30
#endif

#ifndef PSV_SERVER_PORT
#define PSV_SERVER_PORT 52849
#endif

typedef struct {
    const char *host;
    int port;
    int threads;
    uint32_t ctx;
    int parallel;
    const char *api_key;
    int max_queue;
    int timeout;        // seconds a request may wait for a slot
    int header_timeout; // seconds to receive a request's headers (0: PSV_HTTP_HEADER_TIMEOUT)
    int idle_timeout;   // seconds a kept-alive connection may sit idle (0: PSV_HTTP_IDLE_TIMEOUT)
    const char *cors_origin;
    bool log_json;
    const char *model_path;
    const char *model_name;  // what /v1/models reports
    const char *model_quant; // for the ready line, when known from the registry
} srv_conf;

typedef struct {
    psv_ctx *ctx;
    int32_t *hist; // tokens in the KV cache, in order
    size_t n_hist, cap;
    bool busy;
} srv_slot;

typedef struct {
    srv_conf conf;
    psv_model *model;
    int listen_fd;
    int wake[2]; // self-pipe: signals wake the accept loop
    pthread_mutex_t mu;
    pthread_cond_t conn_cv;
    srv_slot *slots;
    struct gen_job **active; // (parallel) the job on each slot, or NULL
    struct gen_job *pending; // FIFO of jobs waiting for a slot
    pthread_cond_t sched_cv;
    pthread_t sched;
    bool sched_started;
    fwd_scratch sched_scratch;
    fwd_item *sched_items;
    int n_waiting, n_conns, n_busy;
    _Atomic int stopping; // set by the signal handler, read by every thread (C11 atomic: lock-free, signal-safe)
    uint64_t id_state;
    // metrics (under mu)
    uint64_t m_requests, m_errors, m_tokens_in, m_tokens_out, m_cache_hits, m_cached_tokens;
    double m_prompt_seconds, m_gen_seconds;
} server_t;

static server_t *srv_global; // only for the signal handler

// ---- HTTP request parsing ----

typedef struct {
    str_t name, value;
} http_header;

typedef struct {
    char method[16];
    str_t target, path;
    int minor; // HTTP/1.minor
    bool oai;  // the path is one of the OpenAI API's (its error envelope), known once the line is read
    http_header headers[PSV_HTTP_MAX_HEADERS];
    int n_headers;
    buf_t body;
    bool keep_alive;
    size_t consumed; // bytes of the connection buffer this request occupies; the slices above
                     // point into them, so they are released only after the request is handled
} http_req;

typedef struct {
    int fd;
    char *buf; // received bytes not yet consumed
    size_t len, cap;
    server_t *srv;
    bool broken; // the peer went away (a write failed)
    char req_id[40];
    int status;  // of the response being sent, for the access log
    char peer[64];
} http_conn;

static str_t http_header_get(const http_req *r, const char *name) {
    size_t n = strlen(name);
    for (int i = 0; i < r->n_headers; i++)
        if (r->headers[i].name.n == n && strncasecmp(r->headers[i].name.p, name, n) == 0) return r->headers[i].value;
    return (str_t){NULL, 0};
}

// Receive more bytes into c->buf, waiting at most until deadline. Returns bytes read, 0 on
// orderly close, -1 on error or timeout.
static ssize_t http_recv_more(http_conn *c, double deadline) {
    if (c->len == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 16384;
        char *p = realloc(c->buf, cap);
        if (!p) return -1;
        c->buf = p;
        c->cap = cap;
    }
    for (;;) {
        double left = deadline - plat_now();
        if (left <= 0 || c->srv->stopping) return -1;
        struct pollfd pfd = {c->fd, POLLIN, 0};
        int pr = poll(&pfd, 1, (int)(left > 0.25 ? 250 : left * 1000 + 1));
        if (pr < 0 && errno != EINTR) return -1;
        if (pr <= 0) continue;
        ssize_t k = recv(c->fd, c->buf + c->len, c->cap - c->len, 0);
        if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (k > 0) c->len += (size_t)k;
        return k;
    }
}

static void http_consume(http_conn *c, size_t n) {
    memmove(c->buf, c->buf + n, c->len - n);
    c->len -= n;
}

// Send all bytes; false (and the connection marked broken) when the peer is gone. MSG_NOSIGNAL:
// a closed socket is an error, not SIGPIPE.
static bool http_send(http_conn *c, const void *data, size_t n) {
    const char *p = data;
    while (n > 0 && !c->broken) {
        ssize_t k = send(c->fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            c->broken = true;
            return false;
        }
        p += k;
        n -= (size_t)k;
    }
    return !c->broken;
}

static const char *http_reason(int status) {
    switch (status) {
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    case 529: return "Overloaded";
    }
    return "Unknown";
}

static void http_common_headers(http_conn *c, buf_t *h) {
    buf_printf(h, "request-id: %s\r\n", c->req_id);
    if (c->srv->conf.cors_origin)
        buf_printf(h, "Access-Control-Allow-Origin: %s\r\nVary: Origin\r\n", c->srv->conf.cors_origin);
}

static bool http_respond(http_conn *c, int status, const char *ctype, const char *body, size_t n, bool keep_alive) {
    c->status = status;
    buf_t h = {0};
    buf_printf(&h, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n", status, http_reason(status), ctype, n);
    http_common_headers(c, &h);
    buf_puts(&h, keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n");
    bool ok = !h.oom && http_send(c, h.data, h.len) && http_send(c, body, n);
    buf_free(&h);
    return ok;
}

// API flavour of a request, for error envelopes.
typedef enum { API_ANTHROPIC, API_OPENAI } api_kind;

static const char *api_error_type(api_kind api, int status) {
    if (api == API_OPENAI) {
        switch (status) {
        case 401: return "authentication_error";
        case 404: return "not_found_error";
        case 429: return "rate_limit_error";
        case 500: return "server_error";
        case 503: case 529: return "server_error";
        default: return "invalid_request_error";
        }
    }
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 500: return "api_error";
    case 529: case 503: return "overloaded_error";
    default: return "invalid_request_error";
    }
}

// The API's own error envelope: Anthropic {"type":"error","error":{"type","message"}}, OpenAI
// {"error":{"message","type","param","code"}}.
static void api_error_json(buf_t *b, api_kind api, int status, const char *msg) {
    json_writer w;
    json_w_init(&w, b);
    json_w_obj_begin(&w);
    if (api == API_ANTHROPIC) {
        json_w_key(&w, "type");
        json_w_cstr(&w, "error");
        json_w_key(&w, "error");
        json_w_obj_begin(&w);
        json_w_key(&w, "type");
        json_w_cstr(&w, api_error_type(api, status));
        json_w_key(&w, "message");
        json_w_cstr(&w, msg);
        json_w_obj_end(&w);
    } else {
        json_w_key(&w, "error");
        json_w_obj_begin(&w);
        json_w_key(&w, "message");
        json_w_cstr(&w, msg);
        json_w_key(&w, "type");
        json_w_cstr(&w, api_error_type(api, status));
        json_w_key(&w, "param");
        json_w_null(&w);
        json_w_key(&w, "code");
        json_w_null(&w);
        json_w_obj_end(&w);
    }
    json_w_obj_end(&w);
}

static bool api_error(http_conn *c, api_kind api, int status, bool keep_alive, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static bool api_error(http_conn *c, api_kind api, int status, bool keep_alive, const char *fmt, ...) {
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    buf_t b = {0};
    api_error_json(&b, api, status, msg);
    pthread_mutex_lock(&c->srv->mu);
    c->srv->m_errors++;
    pthread_mutex_unlock(&c->srv->mu);
    bool ok = http_respond(c, status, "application/json", b.data ? b.data : "", b.len, keep_alive);
    buf_free(&b);
    return ok;
}

// The request's slices point into c->buf, which reading the body may reallocate: save them as
// offsets before, restore after.
static void http_slices_save(const http_conn *c, const http_req *r, size_t *offs) {
    offs[0] = (size_t)(r->target.p - c->buf);
    offs[1] = (size_t)(r->path.p - c->buf);
    for (int i = 0; i < r->n_headers; i++) {
        offs[2 + 2 * i] = (size_t)(r->headers[i].name.p - c->buf);
        offs[3 + 2 * i] = (size_t)(r->headers[i].value.p - c->buf);
    }
}

static void http_slices_restore(const http_conn *c, http_req *r, const size_t *offs) {
    r->target.p = c->buf + offs[0];
    r->path.p = c->buf + offs[1];
    for (int i = 0; i < r->n_headers; i++) {
        r->headers[i].name.p = c->buf + offs[2 + 2 * i];
        r->headers[i].value.p = c->buf + offs[3 + 2 * i];
    }
}

// Read one request. Returns 0 with *r filled, or an HTTP status to answer with (and close),
// or -1 when the connection closed or timed out with nothing worth answering.
static int http_read_request(http_conn *c, http_req *r, bool first) {
    memset(r, 0, offsetof(http_req, body));
    r->body.len = 0;
    const srv_conf *cf = &c->srv->conf;
    double header_s = cf->header_timeout > 0 ? cf->header_timeout : PSV_HTTP_HEADER_TIMEOUT;
    double idle_s = cf->idle_timeout > 0 ? cf->idle_timeout : PSV_HTTP_IDLE_TIMEOUT;
    double deadline = plat_now() + (first ? header_s : idle_s);
    size_t hdr_end = 0;
    bool got_any = c->len > 0;
    for (;;) {
        // RFC 9112 §2.2: lines end in CRLF; a bare LF is rejected rather than guessed at.
        for (size_t i = 0; i + 3 < c->len; i++)
            if (c->buf[i] == '\r' && c->buf[i + 1] == '\n' && c->buf[i + 2] == '\r' && c->buf[i + 3] == '\n') {
                hdr_end = i + 4;
                break;
            }
        if (hdr_end) break;
        if (c->len >= PSV_HTTP_MAX_HEADER) {
            void *nl = memchr(c->buf, '\n', c->len);
            return nl ? 431 : 414;
        }
        ssize_t k = http_recv_more(c, deadline);
        if (k <= 0) return got_any ? (k == 0 ? -1 : 408) : -1;
        if (!got_any) {
            got_any = true;
            deadline = plat_now() + header_s; // from the first byte of a request
        }
    }
    // request line
    char *line = c->buf, *eol = memchr(line, '\r', hdr_end);
    if (!eol || eol[1] != '\n') return 400;
    if ((size_t)(eol - line) > PSV_HTTP_MAX_LINE) return 414;
    for (char *p = line; p < eol; p++)
        if (*p == '\n' || *p == 0) return 400;
    char *sp1 = memchr(line, ' ', (size_t)(eol - line));
    if (!sp1 || sp1 == line || (size_t)(sp1 - line) >= sizeof r->method) return 400;
    char *sp2 = memchr(sp1 + 1, ' ', (size_t)(eol - sp1 - 1));
    if (!sp2 || sp2 == sp1 + 1) return 400;
    memcpy(r->method, line, (size_t)(sp1 - line));
    r->target = (str_t){sp1 + 1, (size_t)(sp2 - sp1 - 1)};
    str_t ver = {sp2 + 1, (size_t)(eol - sp2 - 1)};
    if (ver.n != 8 || memcmp(ver.p, "HTTP/1.", 7) != 0 || (ver.p[7] != '0' && ver.p[7] != '1'))
        return ver.n >= 5 && memcmp(ver.p, "HTTP/", 5) == 0 ? 505 : 400;
    r->minor = ver.p[7] - '0';
    r->path = r->target;
    const char *q = memchr(r->target.p, '?', r->target.n);
    if (q) r->path.n = (size_t)(q - r->target.p);
    r->oai = str_eq_c(r->path, "/v1/chat/completions") || str_eq_c(r->path, "/v1/completions");
    // header fields
    char *p = eol + 2;
    while (p < c->buf + hdr_end - 2) {
        char *e = memchr(p, '\r', (size_t)(c->buf + hdr_end - p));
        if (!e || e[1] != '\n') return 400;
        if (r->n_headers == PSV_HTTP_MAX_HEADERS) return 431;
        char *colon = memchr(p, ':', (size_t)(e - p));
        if (!colon || colon == p) return 400;
        for (char *t = p; t < colon; t++) // field names are tokens: no spaces before the colon
            if (*t == ' ' || *t == '\t' || (unsigned char)*t < 0x21 || *t == 0x7f) return 400;
        for (char *t = colon; t < e; t++)
            if (*t == '\n' || *t == 0) return 400;
        char *v = colon + 1, *ve = e;
        while (v < ve && (*v == ' ' || *v == '\t')) v++;
        while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t')) ve--;
        r->headers[r->n_headers++] = (http_header){{p, (size_t)(colon - p)}, {v, (size_t)(ve - v)}};
        p = e + 2;
    }
    // body framing (RFC 9112 §6): Transfer-Encoding chunked, or Content-Length, never both
    str_t te = http_header_get(r, "transfer-encoding");
    int n_cl = 0;
    str_t cl = {NULL, 0};
    for (int i = 0; i < r->n_headers; i++)
        if (r->headers[i].name.n == 14 && strncasecmp(r->headers[i].name.p, "content-length", 14) == 0) {
            if (n_cl && !str_eq(cl, r->headers[i].value)) return 400; // conflicting duplicates
            cl = r->headers[i].value;
            n_cl++;
        }
    str_t conn = http_header_get(r, "connection");
    bool close_req = conn.n == 5 && strncasecmp(conn.p, "close", 5) == 0;
    bool ka_req = conn.n == 10 && strncasecmp(conn.p, "keep-alive", 10) == 0;
    r->keep_alive = r->minor == 1 ? !close_req : ka_req;
    size_t body_start = hdr_end;
    size_t offs[2 + 2 * PSV_HTTP_MAX_HEADERS];
    http_slices_save(c, r, offs);
    if (te.p) {
        if (n_cl) return 400;
        if (!(te.n == 7 && strncasecmp(te.p, "chunked", 7) == 0)) return 501;
        size_t pos = body_start;
        for (;;) {
            // chunk-size line: hex digits, optional extensions, CRLF
            size_t le = 0;
            for (;;) {
                for (size_t i = pos; i + 1 < c->len; i++)
                    if (c->buf[i] == '\r' && c->buf[i + 1] == '\n') {
                        le = i;
                        break;
                    }
                if (le) break;
                if (c->len - pos > 1024) return 400;
                if (http_recv_more(c, deadline + 60) <= 0) return 400;
            }
            uint64_t size = 0;
            size_t i = pos;
            if (i == le) return 400;
            for (; i < le && isxdigit((unsigned char)c->buf[i]); i++) {
                if (size > (PSV_HTTP_MAX_BODY >> 4)) return 413;
                int d = c->buf[i];
                size = size * 16 + (uint64_t)(isdigit(d) ? d - '0' : (tolower(d) - 'a' + 10));
            }
            if (i == pos || (i < le && c->buf[i] != ';')) return 400;
            pos = le + 2;
            if (size == 0) {
                // trailer section: ignore fields up to the empty line
                for (;;) {
                    size_t e2 = 0;
                    bool found = false;
                    for (size_t j = pos; j + 1 < c->len; j++)
                        if (c->buf[j] == '\r' && c->buf[j + 1] == '\n') {
                            e2 = j;
                            found = true;
                            break;
                        }
                    if (!found) {
                        if (http_recv_more(c, deadline + 60) <= 0) return 400;
                        continue;
                    }
                    bool empty = e2 == pos;
                    pos = e2 + 2;
                    if (empty) break;
                }
                break;
            }
            if (r->body.len + size > PSV_HTTP_MAX_BODY) return 413;
            while (c->len < pos + size + 2)
                if (http_recv_more(c, deadline + 60) <= 0) return 400;
            buf_append(&r->body, c->buf + pos, (size_t)size);
            if (c->buf[pos + size] != '\r' || c->buf[pos + size + 1] != '\n') return 400;
            pos += (size_t)size + 2;
        }
        if (r->body.oom) return 413;
        r->consumed = pos;
        http_slices_restore(c, r, offs);
        return 0;
    }
    uint64_t n_body = 0;
    if (n_cl) {
        if (cl.n == 0 || cl.n > 12) return cl.n > 12 ? 413 : 400;
        for (size_t i = 0; i < cl.n; i++) {
            if (cl.p[i] < '0' || cl.p[i] > '9') return 400;
            n_body = n_body * 10 + (uint64_t)(cl.p[i] - '0');
        }
        if (n_body > PSV_HTTP_MAX_BODY) return 413;
    }
    while (c->len < body_start + n_body) {
        ssize_t k = http_recv_more(c, deadline + 60);
        if (k <= 0) return k == 0 ? -1 : 408;
    }
    buf_append(&r->body, c->buf + body_start, (size_t)n_body);
    if (r->body.oom) return 413;
    r->consumed = body_start + (size_t)n_body;
    http_slices_restore(c, r, offs);
    return 0;
}

// ---- slots, scheduling and generation ----
// One scheduler thread owns generation: every step it gathers one token from each generating
// slot and a chunk of prompt from each slot still reading its prompt into a single forward pass
// (continuous batching), samples, and appends the text to each job's outbox. Connection threads
// only move outbox text to their sockets, send pings, and notice clients that went away.

typedef enum { STOP_END_TURN, STOP_MAX_TOKENS, STOP_SEQUENCE, STOP_CANCELLED, STOP_ERROR } gen_stop;

typedef struct gen_job gen_job;
struct gen_job {
    // request (read-only once submitted)
    const int32_t *prompt;
    size_t n_prompt;
    int64_t max_tokens;
    psv_sampler_params sp;
    char **stops; // stop sequences, matched on the generated text
    size_t n_stops;
    bool (*on_text)(gen_job *j, const char *text, size_t n); // connection thread: false = client gone
    bool (*on_tick)(gen_job *j);                             // connection thread: keep-alive
    void *ud;
    http_conn *conn;
    // results (written by the scheduler before done)
    gen_stop stop;
    int stop_index;
    int64_t n_out;
    size_t n_cached;
    char err[600];
    int err_status;
    // scheduler state
    int slot;
    psv_sampler *smp;
    psv_token_decoder *dec;
    size_t n_done; // prompt tokens in the cache
    int32_t last;  // sampled token still to be evaluated
    bool generating;
    double t_submit, t_admit, t_prompt;
    buf_t hold; // text held back because it may begin a stop sequence
    gen_job *next;
    // shared with the connection thread, under mu
    pthread_mutex_t mu;
    pthread_cond_t cv;
    buf_t outbox;
    bool done, cancel;
};

static bool gen_emit(gen_job *j, const char *text, size_t n) {
    pthread_mutex_lock(&j->mu);
    buf_append(&j->outbox, text, n);
    bool ok = !j->cancel && !j->outbox.oom;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
    return ok;
}

// Longest suffix of s (length n) that is a proper prefix of some stop sequence.
static size_t gen_hold_len(const gen_job *j, const char *s, size_t n) {
    size_t best = 0;
    for (size_t k = 0; k < j->n_stops; k++) {
        size_t sl = strlen(j->stops[k]);
        for (size_t l = PSV_MIN(n, sl - 1); l > best; l--)
            if (memcmp(s + n - l, j->stops[k], l) == 0) {
                best = l;
                break;
            }
    }
    return best;
}

// Feed generated text through the stop matcher: release what cannot start a stop sequence,
// hold the rest. Returns false when generation should end (a stop sequence completed, or the
// client is gone).
static bool gen_feed(gen_job *j, const char *text, size_t n) {
    buf_append(&j->hold, text, n);
    if (j->hold.oom) return false;
    size_t cut = SIZE_MAX;
    int which = -1;
    for (size_t k = 0; k < j->n_stops; k++) {
        size_t sl = strlen(j->stops[k]);
        for (size_t i = 0; sl && i + sl <= j->hold.len && i < cut; i++)
            if (memcmp(j->hold.data + i, j->stops[k], sl) == 0) {
                cut = i;
                which = (int)k;
                break;
            }
    }
    if (which >= 0) {
        if (cut > 0 && !gen_emit(j, j->hold.data, cut)) j->stop = STOP_CANCELLED;
        else {
            j->stop = STOP_SEQUENCE;
            j->stop_index = which;
        }
        j->hold.len = 0;
        return false;
    }
    size_t emit = j->hold.len - gen_hold_len(j, j->hold.data, j->hold.len);
    if (emit > 0) {
        if (!gen_emit(j, j->hold.data, emit)) {
            j->stop = STOP_CANCELLED;
            return false;
        }
        memmove(j->hold.data, j->hold.data + emit, j->hold.len - emit);
        j->hold.len -= emit;
    }
    return true;
}

static size_t srv_common_prefix(const srv_slot *s, const int32_t *p, size_t n) {
    size_t k = 0;
    while (k < s->n_hist && k < n && s->hist[k] == p[k]) k++;
    return k;
}

static bool slot_hist_push(srv_slot *sl, const int32_t *t, size_t n) {
    if (sl->n_hist + n > sl->cap) {
        size_t cap = PSV_MAX(sl->cap * 2, sl->n_hist + n + 64);
        int32_t *p = realloc(sl->hist, cap * sizeof *p);
        if (!p) return false;
        sl->hist = p;
        sl->cap = cap;
    }
    memcpy(sl->hist + sl->n_hist, t, n * sizeof *t);
    sl->n_hist += n;
    return true;
}

// End a job (scheduler thread, s->mu held): release text still held (unless a stop sequence
// ended it), free its slot and wake its connection thread.
static void sched_finish(server_t *s, gen_job *j, gen_stop stop) {
    if (j->stop != STOP_SEQUENCE && j->stop != STOP_CANCELLED) j->stop = stop;
    if ((j->stop == STOP_END_TURN || j->stop == STOP_MAX_TOKENS) && j->dec) {
        size_t len;
        const char *rest = psv_token_decoder_flush(j->dec, &len);
        if (len) gen_feed(j, rest, len);
        if (j->stop != STOP_SEQUENCE && j->hold.len) gen_emit(j, j->hold.data, j->hold.len);
        j->hold.len = 0;
    }
    psv_token_decoder_free(j->dec);
    psv_sampler_free(j->smp);
    j->dec = NULL;
    j->smp = NULL;
    double now = plat_now();
    if (j->slot >= 0) {
        s->active[j->slot] = NULL;
        s->n_busy--;
        if (j->stop == STOP_ERROR) { // the cache may be half-written
            s->slots[j->slot].n_hist = 0;
            psv_ctx_truncate(s->slots[j->slot].ctx, 0, NULL);
        }
        s->m_tokens_in += j->n_prompt;
        s->m_tokens_out += (uint64_t)j->n_out;
        s->m_cached_tokens += j->n_cached;
        if (j->n_cached > 0) s->m_cache_hits++;
        if (j->t_prompt > 0) {
            s->m_prompt_seconds += j->t_prompt - j->t_admit;
            s->m_gen_seconds += now - j->t_prompt;
        }
    }
    pthread_mutex_lock(&j->mu);
    j->done = true;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

// Put a pending job on the free slot whose cache shares the longest prefix with its prompt
// (s->mu held). Returns false when no slot is free.
static bool sched_admit(server_t *s, gen_job *j) {
    int best = -1;
    size_t best_pre = 0;
    for (int i = 0; i < s->conf.parallel; i++) {
        if (s->active[i]) continue;
        size_t pre = srv_common_prefix(&s->slots[i], j->prompt, j->n_prompt);
        if (best < 0 || pre > best_pre) best = i, best_pre = pre;
    }
    if (best < 0) return false;
    srv_slot *sl = &s->slots[best];
    if (best_pre == j->n_prompt) best_pre--; // evaluate at least one token for fresh logits
    psv_ctx_truncate(sl->ctx, (uint32_t)best_pre, NULL);
    sl->n_hist = best_pre;
    j->slot = best;
    j->n_done = j->n_cached = best_pre;
    j->t_admit = plat_now();
    s->active[best] = j;
    s->n_busy++;
    psv_error err = {0};
    if (psv_sampler_new(&j->sp, psv_model_n_vocab(s->model), &j->smp, &err) != PSV_OK ||
        psv_token_decoder_new(s->model, &j->dec, &err) != PSV_OK) {
        j->err_status = 400;
        snprintf(j->err, sizeof j->err, "%s", err.message);
        sched_finish(s, j, STOP_ERROR);
        return true;
    }
    for (size_t i = 0; i < j->n_prompt; i++) psv_sampler_accept(j->smp, j->prompt[i]);
    return true;
}

// The tokens drawn for the jobs of a step whose logits are fresh: each job's sampler is its own,
// so the draws (a pass over the vocabulary each, exp for every candidate) share the thread pool.
typedef struct {
    server_t *s;
    gen_job **jobs;
    int32_t *toks;
    size_t n;
} sched_draws;

static void sched_draw_task(void *arg, int ith, int nth) {
    sched_draws *d = arg;
    int64_t lo, hi;
    pool_share((int64_t)d->n, ith, nth, &lo, &hi);
    for (int64_t q = lo; q < hi; q++)
        d->toks[q] = psv_sampler_sample(d->jobs[q]->smp, psv_ctx_logits(d->s->slots[d->jobs[q]->slot].ctx));
}

// Takes the token drawn for a job (scheduler thread, s->mu not held). Returns the stop reason, or
// -1 to go on.
static int sched_take(server_t *s, gen_job *j, int32_t tok) {
    if (psv_token_is_eog(s->model, tok)) return STOP_END_TURN;
    psv_sampler_accept(j->smp, tok);
    j->n_out++;
    size_t len;
    const char *piece = psv_token_decoder_push(j->dec, tok, &len);
    if (!gen_feed(j, piece, len)) return j->stop;
    if (j->n_out >= j->max_tokens) return STOP_MAX_TOKENS;
    j->last = tok;
    return -1;
}

static void *sched_main(void *arg) {
    server_t *s = arg;
    int P = s->conf.parallel;
    batch_seq *seqs = calloc((size_t)P, sizeof *seqs);
    gen_job **in_step = calloc((size_t)P, sizeof *in_step);
    PSV_ASSERT(seqs && in_step);
    pthread_mutex_lock(&s->mu);
    for (;;) {
        // time out jobs that waited too long; on shutdown, end everything
        double now = plat_now();
        for (gen_job **pp = &s->pending; *pp;) {
            gen_job *j = *pp;
            bool expire = s->stopping || now - j->t_submit > s->conf.timeout;
            if (!expire) {
                pp = &j->next;
                continue;
            }
            *pp = j->next;
            s->n_waiting--;
            j->err_status = s->stopping ? 503 : 529;
            snprintf(j->err, sizeof j->err, s->stopping ? "the server is shutting down" : "no slot became free within %d s (--timeout)",
                     s->conf.timeout);
            sched_finish(s, j, STOP_ERROR);
        }
        while (s->pending && sched_admit(s, s->pending)) {
            s->pending = s->pending->next;
            s->n_waiting--;
        }
        // cancelled or shutting down: end active jobs (streams then send their final events)
        int n_active = 0;
        for (int i = 0; i < P; i++) {
            gen_job *j = s->active[i];
            if (!j) continue;
            pthread_mutex_lock(&j->mu);
            bool cancel = j->cancel;
            pthread_mutex_unlock(&j->mu);
            if (cancel || s->stopping) {
                j->stop = STOP_CANCELLED;
                sched_finish(s, j, STOP_CANCELLED);
            } else {
                n_active++;
            }
        }
        if (n_active == 0) {
            if (s->stopping && !s->pending) break;
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_sec += 1;
            pthread_cond_timedwait(&s->sched_cv, &s->mu, &until);
            continue;
        }
        // one step: a token for each generating job, prompt chunks for the others
        int64_t cap = s->sched_scratch.n_batch;
        size_t ns = 0;
        int n_prompting = 0;
        for (int i = 0; i < P; i++)
            if (s->active[i] && !s->active[i]->generating) n_prompting++;
        for (int i = 0; i < P; i++) {
            gen_job *j = s->active[i];
            if (!j || !j->generating || cap == 0) continue;
            seqs[ns] = (batch_seq){s->slots[i].ctx, &j->last, 1, true};
            in_step[ns++] = j;
            cap--;
        }
        int64_t share = n_prompting ? PSV_MAX(cap / n_prompting, 1) : 0;
        for (int i = 0; i < P; i++) {
            gen_job *j = s->active[i];
            if (!j || j->generating || cap == 0) continue;
            size_t k = PSV_MIN(j->n_prompt - j->n_done, (size_t)PSV_MIN(share, cap));
            seqs[ns] = (batch_seq){s->slots[i].ctx, j->prompt + j->n_done, k, j->n_done + k == j->n_prompt};
            in_step[ns++] = j;
            cap -= (int64_t)k;
        }
        pthread_mutex_unlock(&s->mu);
        ctx_eval_batch(s->model, &s->sched_scratch, s->sched_items, seqs, ns);
        int results[256];
        gen_job *drawing[256];
        int32_t drawn[256];
        size_t nd = 0;
        for (size_t q = 0; q < ns; q++) {
            gen_job *j = in_step[q];
            srv_slot *sl = &s->slots[j->slot];
            results[q] = -1;
            if (!slot_hist_push(sl, seqs[q].tokens, seqs[q].n)) {
                snprintf(j->err, sizeof j->err, "out of memory");
                j->err_status = 500;
                results[q] = STOP_ERROR;
                continue;
            }
            if (!j->generating) {
                j->n_done += seqs[q].n;
                if (j->n_done < j->n_prompt) continue;
                j->generating = true;
                j->t_prompt = plat_now();
            }
            drawing[nd++] = j;
        }
        sched_draws d = {s, drawing, drawn, nd};
        if (nd > 1) {
            pthread_mutex_lock(&s->model->lock);
            pool_run(s->model->pool, sched_draw_task, &d);
            pthread_mutex_unlock(&s->model->lock);
        } else {
            sched_draw_task(&d, 0, 1);
        }
        for (size_t q = 0, k = 0; q < ns; q++)
            if (k < nd && in_step[q] == drawing[k]) results[q] = sched_take(s, drawing[k], drawn[k]), k++;
        pthread_mutex_lock(&s->mu);
        for (size_t q = 0; q < ns; q++)
            if (results[q] >= 0) sched_finish(s, in_step[q], (gen_stop)results[q]);
    }
    pthread_mutex_unlock(&s->mu);
    free(seqs);
    free(in_step);
    return NULL;
}

// Whether a prompt of n_prompt tokens plus max_tokens fits a slot's context; false with the
// message naming both numbers (a 400: nothing is ever truncated).
static bool srv_fits_ctx(const server_t *s, size_t n_prompt, int64_t max_tokens, char *err, size_t cap) {
    if ((uint64_t)n_prompt + (uint64_t)max_tokens <= s->conf.ctx) return true;
    snprintf(err, cap, "prompt (%zu tokens) + max_tokens (%" PRId64 ") = %" PRIu64 " exceeds the context size (%u tokens)",
             n_prompt, max_tokens, (uint64_t)n_prompt + (uint64_t)max_tokens, s->conf.ctx);
    return false;
}

// Submit a job and relay its text to the client until it ends. Runs on the connection thread.
static void srv_generate(server_t *s, gen_job *j) {
    j->stop = STOP_ERROR;
    j->stop_index = -1;
    j->slot = -1;
    if (!srv_fits_ctx(s, j->n_prompt, j->max_tokens, j->err, sizeof j->err)) {
        j->err_status = 400;
        return;
    }
    if (j->n_prompt == 0) {
        j->err_status = 400;
        snprintf(j->err, sizeof j->err, "the prompt is empty");
        return;
    }
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    pthread_mutex_lock(&s->mu);
    bool full = s->n_busy == s->conf.parallel && s->n_waiting >= s->conf.max_queue;
    if (full || s->stopping) {
        j->err_status = s->stopping ? 503 : 529;
        snprintf(j->err, sizeof j->err, s->stopping ? "the server is shutting down"
                                                    : "server overloaded: all %d slots busy and %d requests queued (--max-queue)",
                 s->conf.parallel, s->n_waiting);
        pthread_mutex_unlock(&s->mu);
        goto out;
    }
    j->t_submit = plat_now();
    gen_job **tail = &s->pending;
    while (*tail) tail = &(*tail)->next;
    *tail = j;
    s->n_waiting++;
    pthread_cond_signal(&s->sched_cv);
    pthread_mutex_unlock(&s->mu);

    double last_sent = plat_now();
    buf_t chunk = {0};
    for (;;) {
        pthread_mutex_lock(&j->mu);
        if (!j->done && j->outbox.len == 0) {
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_sec += 1;
            pthread_cond_timedwait(&j->cv, &j->mu, &until);
        }
        bool done = j->done;
        buf_t t = chunk;
        chunk = j->outbox;
        j->outbox = t;
        j->outbox.len = 0;
        pthread_mutex_unlock(&j->mu);
        bool alive = true;
        if (chunk.len) {
            alive = j->on_text(j, chunk.data, chunk.len);
            last_sent = plat_now();
            chunk.len = 0;
        }
        if (done) break;
        if (alive && plat_now() - last_sent > 10.0 && j->on_tick) {
            alive = j->on_tick(j);
            last_sent = plat_now();
        }
        if (alive && j->conn) { // a client that closed its end while waiting for the whole answer
            char b;
            ssize_t k = recv(j->conn->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
            if (k == 0) alive = false, j->conn->broken = true;
        }
        if (!alive) {
            pthread_mutex_lock(&j->mu);
            j->cancel = true;
            pthread_mutex_unlock(&j->mu);
            pthread_mutex_lock(&s->mu);
            pthread_cond_signal(&s->sched_cv);
            pthread_mutex_unlock(&s->mu);
        }
    }
    buf_free(&chunk);
out:
    buf_free(&j->outbox);
    if (j->t_submit > 0) {
        pthread_cond_destroy(&j->cv);
        pthread_mutex_destroy(&j->mu);
    }
}

// ---- request decoding shared by the APIs ----

typedef struct {
    psv_chat_message *msgs;
    size_t n;
    char **owned; // strings built from content blocks
    size_t n_owned;
    const char *prefill; // trailing assistant message (Anthropic), or NULL
} chat_req;

static void chat_req_free(chat_req *c) {
    for (size_t i = 0; i < c->n_owned; i++) free(c->owned[i]);
    free(c->owned);
    free(c->msgs);
    memset(c, 0, sizeof *c);
}

// Text of a content value: a string, or an array of {type:"text", text} blocks concatenated.
// Other block types are an error naming the field.
static bool api_content_text(chat_req *cr, const json_value *v, const char *field, char *err, size_t err_cap,
                             const char **out) {
    if (v && v->kind == JSON_STRING) {
        *out = v->u.s.p;
        return true;
    }
    if (!v || v->kind != JSON_ARRAY) {
        snprintf(err, err_cap, "%s: expected a string or an array of content blocks", field);
        return false;
    }
    buf_t b = {0};
    for (size_t i = 0; i < json_len(v); i++) {
        const json_value *blk = json_at(v, i);
        const char *type = json_str(json_get(blk, "type"));
        if (!type) {
            snprintf(err, err_cap, "%s.%zu.type: missing", field, i);
            buf_free(&b);
            return false;
        }
        if (strcmp(type, "text") != 0) {
            snprintf(err, err_cap, "%s.%zu.type: content blocks of type '%.*s' are not supported (only 'text')", field, i,
                     (int)str_clip_utf8(type, strlen(type), 40), type);
            buf_free(&b);
            return false;
        }
        const json_value *t = json_get(blk, "text");
        if (!t || t->kind != JSON_STRING) {
            snprintf(err, err_cap, "%s.%zu.text: expected a string", field, i);
            buf_free(&b);
            return false;
        }
        buf_append(&b, t->u.s.p, t->u.s.n);
    }
    buf_reserve(&b, 0);
    char **o = realloc(cr->owned, (cr->n_owned + 1) * sizeof *o);
    if (!o || b.oom) {
        buf_free(&b);
        snprintf(err, err_cap, "out of memory");
        return false;
    }
    cr->owned = o;
    cr->owned[cr->n_owned++] = b.data;
    *out = b.data;
    return true;
}

static bool chat_req_add(chat_req *cr, const char *role, const char *content) {
    psv_chat_message *m = realloc(cr->msgs, (cr->n + 1) * sizeof *m);
    if (!m) return false;
    cr->msgs = m;
    cr->msgs[cr->n++] = (psv_chat_message){role, content};
    return true;
}

// A number field within [lo, hi]; absent leaves *out unchanged.
static bool api_number(const json_value *root, const char *key, double lo, double hi, double *out, char *err, size_t cap) {
    const json_value *v = json_get(root, key);
    if (!v || v->kind == JSON_NULL) return true;
    if (!json_is_number(v)) {
        snprintf(err, cap, "%s: expected a number", key);
        return false;
    }
    double d = json_num(v);
    if (!(d >= lo && d <= hi)) {
        snprintf(err, cap, "%s: %g is out of range (%g to %g)", key, d, lo, hi);
        return false;
    }
    *out = d;
    return true;
}

static bool api_int(const json_value *root, const char *key, int64_t lo, int64_t hi, int64_t *out, char *err, size_t cap) {
    const json_value *v = json_get(root, key);
    if (!v || v->kind == JSON_NULL) return true;
    if (v->kind != JSON_INT) {
        snprintf(err, cap, "%s: expected an integer", key);
        return false;
    }
    if (v->u.i < lo || v->u.i > hi) {
        snprintf(err, cap, "%s: %" PRId64 " is out of range (%" PRId64 " to %" PRId64 ")", key, v->u.i, lo, hi);
        return false;
    }
    *out = v->u.i;
    return true;
}

// stop_sequences / stop: a string or an array of non-empty strings (at most 16).
static bool api_stops(const json_value *v, const char *key, gen_job *j, char *err, size_t cap) {
    if (!v || v->kind == JSON_NULL) return true;
    size_t n = v->kind == JSON_STRING ? 1 : json_len(v);
    if ((v->kind != JSON_STRING && v->kind != JSON_ARRAY) || n > 16) {
        snprintf(err, cap, "%s: expected a string or an array of at most 16 strings", key);
        return false;
    }
    j->stops = calloc(n ? n : 1, sizeof *j->stops);
    if (!j->stops) {
        snprintf(err, cap, "out of memory");
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        const json_value *s = v->kind == JSON_STRING ? v : json_at(v, i);
        if (!s || s->kind != JSON_STRING || s->u.s.n == 0 || strlen(s->u.s.p) != s->u.s.n) {
            snprintf(err, cap, "%s.%zu: expected a non-empty string", key, i);
            return false;
        }
        j->stops[j->n_stops++] = (char *)s->u.s.p;
    }
    return true;
}

// Tokenize a chat request: the template with the generation prompt, then any prefill text.
static psv_status api_tokenize_chat(server_t *s, const chat_req *cr, int32_t **ids, size_t *n_ids, psv_error *err) {
    psv_status st = psv_chat_tokenize(s->model, cr->msgs, cr->n, true, ids, n_ids, err);
    if (st != PSV_OK || !cr->prefill || !*cr->prefill) return st;
    int32_t *more = NULL;
    size_t n_more = 0;
    st = psv_tokenize(s->model, cr->prefill, strlen(cr->prefill), false, false, &more, &n_more, err);
    if (st == PSV_OK) {
        int32_t *all = realloc(*ids, (*n_ids + n_more) * sizeof *all);
        if (!all) st = err_set(err, PSV_ERR_NOMEM, "out of memory");
        else {
            memcpy(all + *n_ids, more, n_more * sizeof *all);
            *ids = all;
            *n_ids += n_more;
        }
    }
    free(more);
    return st;
}

static void srv_make_id(server_t *s, const char *prefix, char *out, size_t cap) {
    static const char al[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    pthread_mutex_lock(&s->mu);
    uint64_t x = samp_splitmix(&s->id_state), y = samp_splitmix(&s->id_state);
    pthread_mutex_unlock(&s->mu);
    size_t n = strlen(prefix);
    snprintf(out, cap, "%s", prefix);
    for (size_t i = 0; i < 22 && n + i + 1 < cap; i++) { // 11 base-62 digits per 64 random bits
        uint64_t *z = i < 11 ? &x : &y;
        out[n + i] = al[*z % 62];
        *z /= 62;
        out[n + i + 1] = 0;
    }
}

// ---- Anthropic Messages API ----

typedef struct {
    http_conn *c;
    bool stream;
    buf_t text; // non-streaming: the whole answer
    buf_t ev;   // scratch for events
} api_out;

static bool sse_event(http_conn *c, const char *event, const buf_t *data) {
    buf_t b = {0};
    if (event) buf_printf(&b, "event: %s\n", event);
    buf_puts(&b, "data: ");
    buf_append(&b, data->data, data->len);
    buf_puts(&b, "\n\n");
    bool ok = !b.oom && http_send(c, b.data, b.len);
    buf_free(&b);
    return ok;
}

static bool anth_on_text(gen_job *j, const char *text, size_t n) {
    api_out *o = j->ud;
    if (!o->stream) {
        buf_append(&o->text, text, n);
        return !o->text.oom;
    }
    o->ev.len = 0;
    json_writer w;
    json_w_init(&w, &o->ev);
    json_w_obj_begin(&w);
    json_w_key(&w, "type");
    json_w_cstr(&w, "content_block_delta");
    json_w_key(&w, "index");
    json_w_int(&w, 0);
    json_w_key(&w, "delta");
    json_w_obj_begin(&w);
    json_w_key(&w, "type");
    json_w_cstr(&w, "text_delta");
    json_w_key(&w, "text");
    json_w_str(&w, text, n);
    json_w_obj_end(&w);
    json_w_obj_end(&w);
    return sse_event(o->c, "content_block_delta", &o->ev);
}

static bool anth_on_tick(gen_job *j) {
    api_out *o = j->ud;
    if (!o->stream) return true;
    buf_t b = {0};
    buf_puts(&b, "{\"type\": \"ping\"}");
    bool ok = sse_event(o->c, "ping", &b);
    buf_free(&b);
    return ok;
}

static const char *anth_stop_name(gen_stop st) {
    switch (st) {
    case STOP_END_TURN: return "end_turn";
    case STOP_MAX_TOKENS: return "max_tokens";
    case STOP_SEQUENCE: return "stop_sequence";
    default: return "end_turn";
    }
}

static void anth_usage(json_writer *w, const gen_job *j, bool with_output) {
    json_w_key(w, "usage");
    json_w_obj_begin(w);
    json_w_key(w, "input_tokens");
    json_w_int(w, (int64_t)j->n_prompt);
    json_w_key(w, "output_tokens");
    json_w_int(w, with_output ? j->n_out : 0);
    json_w_key(w, "cache_read_input_tokens");
    json_w_int(w, (int64_t)j->n_cached);
    json_w_key(w, "cache_creation_input_tokens");
    json_w_int(w, 0);
    json_w_obj_end(w);
}

// Decode an Anthropic request into messages and generation settings. Returns false with a
// message (400 invalid_request_error).
static bool anth_decode(const json_value *root, chat_req *cr, gen_job *j, bool need_max_tokens, char *err, size_t cap) {
    if (!root || root->kind != JSON_OBJECT) {
        snprintf(err, cap, "the request body must be a JSON object");
        return false;
    }
    const json_value *tools = json_get(root, "tools");
    if (tools && tools->kind == JSON_ARRAY && json_len(tools) > 0) {
        snprintf(err, cap, "tools: tool use is not supported by this server");
        return false;
    }
    const json_value *sys = json_get(root, "system");
    if (sys && sys->kind != JSON_NULL) {
        if (sys->kind == JSON_ARRAY) {
            // text blocks; one starting with x-anthropic-billing-header: changes per request, so it
            // is dropped to keep the prompt cache useful
            buf_t b = {0};
            for (size_t i = 0; i < json_len(sys); i++) {
                const json_value *blk = json_at(sys, i);
                const char *type = json_str(json_get(blk, "type")), *text = json_str(json_get(blk, "text"));
                if (!type || strcmp(type, "text") != 0 || !text) {
                    snprintf(err, cap, "system.%zu: only text blocks are supported", i);
                    buf_free(&b);
                    return false;
                }
                if (strncmp(text, "x-anthropic-billing-header:", 27) == 0) continue;
                if (b.len) buf_puts(&b, "\n\n");
                buf_puts(&b, text);
            }
            buf_reserve(&b, 0);
            char **o = realloc(cr->owned, (cr->n_owned + 1) * sizeof *o);
            if (!o || b.oom) {
                buf_free(&b);
                snprintf(err, cap, "out of memory");
                return false;
            }
            cr->owned = o;
            cr->owned[cr->n_owned++] = b.data;
            if (b.len && !chat_req_add(cr, "system", b.data)) {
                snprintf(err, cap, "out of memory");
                return false;
            }
        } else if (sys->kind == JSON_STRING) {
            if (sys->u.s.n && !chat_req_add(cr, "system", sys->u.s.p)) {
                snprintf(err, cap, "out of memory");
                return false;
            }
        } else {
            snprintf(err, cap, "system: expected a string or an array of text blocks");
            return false;
        }
    }
    const json_value *msgs = json_get(root, "messages");
    if (!msgs || msgs->kind != JSON_ARRAY || json_len(msgs) == 0) {
        snprintf(err, cap, "messages: expected a non-empty array");
        return false;
    }
    for (size_t i = 0; i < json_len(msgs); i++) {
        const json_value *m = json_at(msgs, i);
        const char *role = json_str(json_get(m, "role"));
        char field[64];
        snprintf(field, sizeof field, "messages.%zu.content", i);
        if (!role || (strcmp(role, "user") != 0 && strcmp(role, "assistant") != 0)) {
            snprintf(err, cap, "messages.%zu.role: expected 'user' or 'assistant'", i);
            return false;
        }
        const char *text;
        if (!api_content_text(cr, json_get(m, "content"), field, err, cap, &text)) return false;
        if (i + 1 == json_len(msgs) && !strcmp(role, "assistant")) cr->prefill = text; // continue this
        else if (!chat_req_add(cr, role, text)) {
                snprintf(err, cap, "out of memory");
                return false;
            }
    }
    int64_t mt = -1;
    if (!api_int(root, "max_tokens", 1, 1 << 24, &mt, err, cap)) return false;
    if (need_max_tokens && mt < 0) {
        snprintf(err, cap, "max_tokens: field required");
        return false;
    }
    j->max_tokens = mt;
    double d;
    j->sp = psv_sampler_default_params();
    j->sp.temperature = 1.0f, j->sp.top_k = 0, j->sp.top_p = 1.0f; // the API's defaults
    d = 1.0;
    if (!api_number(root, "temperature", 0, 1, &d, err, cap)) return false;
    j->sp.temperature = (float)d;
    d = 1.0;
    if (!api_number(root, "top_p", 0, 1, &d, err, cap)) return false;
    j->sp.top_p = (float)d;
    int64_t k = 0;
    if (!api_int(root, "top_k", 0, 1 << 24, &k, err, cap)) return false;
    j->sp.top_k = (int)k;
    j->sp.seed = (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)j;
    return api_stops(json_get(root, "stop_sequences"), "stop_sequences", j, err, cap);
}

// An Anthropic request decoded and tokenized, its length checked against the context. Returns
// false with a message (400 invalid_request_error). The caller frees *ids, j->stops and *cr.
static bool anth_prepare(server_t *s, const json_value *root, bool count_only, chat_req *cr, gen_job *j, int32_t **ids,
                         size_t *n_ids, char *err, size_t cap) {
    if (!anth_decode(root, cr, j, !count_only, err, cap)) return false;
    psv_error perr = {0};
    if (api_tokenize_chat(s, cr, ids, n_ids, &perr) != PSV_OK) {
        snprintf(err, cap, "%s", perr.message);
        return false;
    }
    return count_only || srv_fits_ctx(s, *n_ids, j->max_tokens, err, cap);
}

static bool srv_check_ctx_error(http_conn *c, api_kind api, gen_job *j, bool keep_alive) {
    return api_error(c, api, j->err_status ? j->err_status : 500, keep_alive, "%s", j->err[0] ? j->err : "generation failed");
}

static bool handle_anthropic(http_conn *c, const http_req *r, const json_value *root, bool count_only) {
    server_t *s = c->srv;
    chat_req cr = {0};
    gen_job j;
    memset(&j, 0, sizeof j);
    char err[512] = "";
    int32_t *ids = NULL;
    size_t n_ids = 0;
    bool ok;
    api_out o = {.c = c};
    if (!anth_prepare(s, root, count_only, &cr, &j, &ids, &n_ids, err, sizeof err)) {
        ok = api_error(c, API_ANTHROPIC, 400, r->keep_alive, "%s", err);
        goto done;
    }
    if (count_only) {
        buf_t b = {0};
        buf_printf(&b, "{\"input_tokens\":%zu}", n_ids);
        ok = http_respond(c, 200, "application/json", b.data, b.len, r->keep_alive);
        buf_free(&b);
        goto done;
    }
    const json_value *st = json_get(root, "stream");
    o.stream = st && st->kind == JSON_BOOL && st->u.b;
    const char *model = json_str(json_get(root, "model"));
    if (!model) model = s->conf.model_name;
    j.prompt = ids;
    j.n_prompt = n_ids;
    j.on_text = anth_on_text;
    j.on_tick = anth_on_tick;
    j.ud = &o;
    j.conn = c;
    char id[48];
    srv_make_id(s, "msg_", id, sizeof id);
    if (o.stream) {
        buf_t h = {0};
        c->status = 200;
        buf_puts(&h, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n");
        http_common_headers(c, &h);
        buf_puts(&h, "Connection: close\r\n\r\n");
        ok = http_send(c, h.data, h.len);
        buf_free(&h);
        // message_start as soon as the request is accepted
        o.ev.len = 0;
        json_writer w;
        json_w_init(&w, &o.ev);
        json_w_obj_begin(&w);
        json_w_key(&w, "type");
        json_w_cstr(&w, "message_start");
        json_w_key(&w, "message");
        json_w_obj_begin(&w);
        json_w_key(&w, "id");
        json_w_cstr(&w, id);
        json_w_key(&w, "type");
        json_w_cstr(&w, "message");
        json_w_key(&w, "role");
        json_w_cstr(&w, "assistant");
        json_w_key(&w, "model");
        json_w_cstr(&w, model);
        json_w_key(&w, "content");
        json_w_arr_begin(&w);
        json_w_arr_end(&w);
        json_w_key(&w, "stop_reason");
        json_w_null(&w);
        json_w_key(&w, "stop_sequence");
        json_w_null(&w);
        anth_usage(&w, &j, false);
        json_w_obj_end(&w);
        json_w_obj_end(&w);
        ok = ok && sse_event(c, "message_start", &o.ev);
        o.ev.len = 0;
        buf_puts(&o.ev, "{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}");
        ok = ok && sse_event(c, "content_block_start", &o.ev);
        ok = ok && anth_on_tick(&j);
        if (ok) srv_generate(s, &j);
        if (!ok || (j.stop == STOP_CANCELLED && c->broken)) goto done_stream;
        if (j.stop == STOP_ERROR) {
            o.ev.len = 0;
            api_error_json(&o.ev, API_ANTHROPIC, j.err_status ? j.err_status : 500, j.err);
            sse_event(c, "error", &o.ev);
            goto done_stream;
        }
        o.ev.len = 0;
        buf_puts(&o.ev, "{\"type\":\"content_block_stop\",\"index\":0}");
        sse_event(c, "content_block_stop", &o.ev);
        o.ev.len = 0;
        json_w_init(&w, &o.ev);
        json_w_obj_begin(&w);
        json_w_key(&w, "type");
        json_w_cstr(&w, "message_delta");
        json_w_key(&w, "delta");
        json_w_obj_begin(&w);
        json_w_key(&w, "stop_reason");
        json_w_cstr(&w, anth_stop_name(j.stop));
        json_w_key(&w, "stop_sequence");
        if (j.stop == STOP_SEQUENCE) json_w_cstr(&w, j.stops[j.stop_index]);
        else json_w_null(&w);
        json_w_obj_end(&w);
        json_w_key(&w, "usage");
        json_w_obj_begin(&w);
        json_w_key(&w, "output_tokens");
        json_w_int(&w, j.n_out);
        json_w_obj_end(&w);
        json_w_obj_end(&w);
        sse_event(c, "message_delta", &o.ev);
        o.ev.len = 0;
        buf_puts(&o.ev, "{\"type\":\"message_stop\"}");
        sse_event(c, "message_stop", &o.ev);
    done_stream:
        ok = false; // the stream was sent with Connection: close
        goto done;
    }
    srv_generate(s, &j);
    if (j.stop == STOP_ERROR) {
        ok = srv_check_ctx_error(c, API_ANTHROPIC, &j, r->keep_alive);
        goto done;
    }
    if (j.stop == STOP_CANCELLED) {
        ok = api_error(c, API_ANTHROPIC, 503, false, "the server is shutting down");
        goto done;
    }
    {
        buf_t b = {0};
        json_writer w;
        json_w_init(&w, &b);
        json_w_obj_begin(&w);
        json_w_key(&w, "id");
        json_w_cstr(&w, id);
        json_w_key(&w, "type");
        json_w_cstr(&w, "message");
        json_w_key(&w, "role");
        json_w_cstr(&w, "assistant");
        json_w_key(&w, "model");
        json_w_cstr(&w, model);
        json_w_key(&w, "content");
        json_w_arr_begin(&w);
        json_w_obj_begin(&w);
        json_w_key(&w, "type");
        json_w_cstr(&w, "text");
        json_w_key(&w, "text");
        json_w_str(&w, o.text.data ? o.text.data : "", o.text.len);
        json_w_obj_end(&w);
        json_w_arr_end(&w);
        json_w_key(&w, "stop_reason");
        json_w_cstr(&w, anth_stop_name(j.stop));
        json_w_key(&w, "stop_sequence");
        if (j.stop == STOP_SEQUENCE) json_w_cstr(&w, j.stops[j.stop_index]);
        else json_w_null(&w);
        anth_usage(&w, &j, true);
        json_w_obj_end(&w);
        ok = http_respond(c, 200, "application/json", b.data, b.len, r->keep_alive);
        buf_free(&b);
    }
done:
    buf_free(&o.text);
    buf_free(&o.ev);
    buf_free(&j.hold);
    free(j.stops);
    free(ids);
    chat_req_free(&cr);
    return ok;
}

// ---- OpenAI chat completions and completions ----

typedef struct {
    http_conn *c;
    bool stream, chat, include_usage;
    const char *id, *model;
    int64_t created;
    buf_t text, ev;
} oai_out;

static void oai_chunk_head(json_writer *w, const oai_out *o) {
    json_w_obj_begin(w);
    json_w_key(w, "id");
    json_w_cstr(w, o->id);
    json_w_key(w, "object");
    json_w_cstr(w, o->chat ? "chat.completion.chunk" : "text_completion");
    json_w_key(w, "created");
    json_w_int(w, o->created);
    json_w_key(w, "model");
    json_w_cstr(w, o->model);
}

static bool oai_send_chunk(oai_out *o, const char *text, size_t n, const char *finish, bool role) {
    o->ev.len = 0;
    json_writer w;
    json_w_init(&w, &o->ev);
    oai_chunk_head(&w, o);
    json_w_key(&w, "choices");
    json_w_arr_begin(&w);
    json_w_obj_begin(&w);
    json_w_key(&w, "index");
    json_w_int(&w, 0);
    if (o->chat) {
        json_w_key(&w, "delta");
        json_w_obj_begin(&w);
        if (role) {
            json_w_key(&w, "role");
            json_w_cstr(&w, "assistant");
        }
        if (text) {
            json_w_key(&w, "content");
            json_w_str(&w, text, n);
        }
        json_w_obj_end(&w);
    } else {
        json_w_key(&w, "text");
        json_w_str(&w, text ? text : "", text ? n : 0);
    }
    json_w_key(&w, "finish_reason");
    if (finish) json_w_cstr(&w, finish);
    else json_w_null(&w);
    json_w_obj_end(&w);
    json_w_arr_end(&w);
    json_w_obj_end(&w);
    return sse_event(o->c, NULL, &o->ev);
}

static bool oai_on_text(gen_job *j, const char *text, size_t n) {
    oai_out *o = j->ud;
    if (!o->stream) {
        buf_append(&o->text, text, n);
        return !o->text.oom;
    }
    return oai_send_chunk(o, text, n, NULL, false);
}

static bool oai_on_tick(gen_job *j) {
    oai_out *o = j->ud;
    // an SSE comment line keeps proxies and clients from timing out
    return !o->stream || http_send(o->c, ": ping\n\n", 8);
}

static void oai_usage(json_writer *w, const gen_job *j) {
    json_w_key(w, "usage");
    json_w_obj_begin(w);
    json_w_key(w, "prompt_tokens");
    json_w_int(w, (int64_t)j->n_prompt);
    json_w_key(w, "completion_tokens");
    json_w_int(w, j->n_out);
    json_w_key(w, "total_tokens");
    json_w_int(w, (int64_t)j->n_prompt + j->n_out);
    json_w_key(w, "prompt_tokens_details");
    json_w_obj_begin(w);
    json_w_key(w, "cached_tokens");
    json_w_int(w, (int64_t)j->n_cached);
    json_w_obj_end(w);
    json_w_obj_end(w);
}

// A completions prompt given as token ids: integers within the vocabulary.
static bool oai_prompt_ids(server_t *s, const json_value *v, int32_t **ids, size_t *n_ids, char *err, size_t cap) {
    size_t n = json_len(v);
    int64_t nv = psv_model_n_vocab(s->model);
    if (n == 0) {
        snprintf(err, cap, "prompt: expected a non-empty string or array of token ids");
        return false;
    }
    if (json_at(v, 0)->kind != JSON_INT) {
        snprintf(err, cap, "prompt: expected a string or an array of token ids (batches of prompts are not supported)");
        return false;
    }
    *ids = malloc(n * sizeof **ids);
    if (!*ids) {
        snprintf(err, cap, "out of memory");
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        const json_value *t = json_at(v, i);
        if (t->kind != JSON_INT || t->u.i < 0 || t->u.i >= nv) {
            if (t->kind == JSON_INT)
                snprintf(err, cap, "prompt.%zu: token id %" PRId64 " is out of range (0 to %" PRId64 ")", i, t->u.i, nv - 1);
            else
                snprintf(err, cap, "prompt.%zu: expected a token id (an integer)", i);
            return false;
        }
        (*ids)[i] = (int32_t)t->u.i;
    }
    *n_ids = n;
    return true;
}

// Decode an OpenAI chat-completions (chat) or completions request: the prompt's tokens, the
// generation settings and stop sequences into *j, the stream options into *o. Returns false
// with a message (400 invalid_request_error). The caller frees *ids, j->stops and *cr.
static bool oai_decode(server_t *s, const json_value *root, bool chat, chat_req *cr, gen_job *j, oai_out *o,
                       int32_t **ids, size_t *n_ids, char *err, size_t cap) {
    psv_error perr = {0};
    if (!root || root->kind != JSON_OBJECT) {
        snprintf(err, cap, "the request body must be a JSON object");
        return false;
    }
    int64_t n = 1;
    if (!api_int(root, "n", 1, 1, &n, err, cap)) return false;
    if (chat) {
        const json_value *msgs = json_get(root, "messages");
        if (!msgs || msgs->kind != JSON_ARRAY || json_len(msgs) == 0) {
            snprintf(err, cap, "messages: expected a non-empty array");
            return false;
        }
        for (size_t i = 0; i < json_len(msgs); i++) {
            const json_value *m = json_at(msgs, i);
            const char *role = json_str(json_get(m, "role"));
            char field[64];
            snprintf(field, sizeof field, "messages[%zu].content", i);
            if (!role || (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "developer"))) {
                snprintf(err, cap, "messages[%zu].role: expected system, developer, user or assistant", i);
                return false;
            }
            const char *text;
            if (!api_content_text(cr, json_get(m, "content"), field, err, cap, &text)) return false;
            if (!chat_req_add(cr, strcmp(role, "developer") ? role : "system", text)) {
                snprintf(err, cap, "out of memory");
                return false;
            }
        }
        if (api_tokenize_chat(s, cr, ids, n_ids, &perr) != PSV_OK) {
            snprintf(err, cap, "%s", perr.message);
            return false;
        }
    } else {
        const json_value *pv = json_get(root, "prompt");
        if (pv && pv->kind == JSON_ARRAY) {
            if (!oai_prompt_ids(s, pv, ids, n_ids, err, cap)) return false;
        } else {
            const char *prompt = json_str(pv);
            if (!prompt) {
                snprintf(err, cap, "prompt: expected a string or an array of token ids");
                return false;
            }
            if (psv_tokenize(s->model, prompt, pv->u.s.n, true, false, ids, n_ids, &perr) != PSV_OK) {
                snprintf(err, cap, "%s", perr.message);
                return false;
            }
        }
    }
    if (*n_ids == 0) {
        snprintf(err, cap, "prompt: empty, and this model has no BOS token to begin from");
        return false;
    }
    int64_t mt = 16;
    if (chat) mt = (int64_t)s->conf.ctx - (int64_t)*n_ids; // OpenAI: until the context is full
    if (!api_int(root, "max_tokens", 1, 1 << 24, &mt, err, cap)) return false;
    if (!api_int(root, "max_completion_tokens", 1, 1 << 24, &mt, err, cap)) return false;
    if (mt < 1) mt = 1;
    j->max_tokens = mt;
    j->sp = psv_sampler_default_params();
    j->sp.temperature = 1.0f, j->sp.top_k = 0, j->sp.top_p = 1.0f;
    double d = 1.0;
    if (!api_number(root, "temperature", 0, 2, &d, err, cap)) return false;
    j->sp.temperature = (float)d;
    d = 1.0;
    if (!api_number(root, "top_p", 0, 1, &d, err, cap)) return false;
    j->sp.top_p = (float)d;
    d = 0;
    if (!api_number(root, "presence_penalty", -2, 2, &d, err, cap)) return false;
    j->sp.presence_penalty = (float)d;
    d = 0;
    if (!api_number(root, "frequency_penalty", -2, 2, &d, err, cap)) return false;
    j->sp.frequency_penalty = (float)d;
    int64_t seed = (int64_t)((uint64_t)time(NULL) >> 1);
    if (!api_int(root, "seed", INT64_MIN, INT64_MAX, &seed, err, cap)) return false;
    j->sp.seed = (uint64_t)seed;
    if (!api_stops(json_get(root, "stop"), "stop", j, err, cap)) return false;
    const json_value *st = json_get(root, "stream");
    o->stream = st && st->kind == JSON_BOOL && st->u.b;
    const json_value *iu = json_get(json_get(root, "stream_options"), "include_usage");
    o->include_usage = iu && iu->kind == JSON_BOOL && iu->u.b;
    o->model = json_str(json_get(root, "model"));
    if (!o->model) o->model = s->conf.model_name;
    return srv_fits_ctx(s, *n_ids, j->max_tokens, err, cap);
}

static bool handle_openai(http_conn *c, const http_req *r, const json_value *root, bool chat) {
    server_t *s = c->srv;
    chat_req cr = {0};
    gen_job j;
    memset(&j, 0, sizeof j);
    char err[512] = "";
    int32_t *ids = NULL;
    size_t n_ids = 0;
    bool ok = true;
    oai_out o = {.c = c, .chat = chat};
    if (!oai_decode(s, root, chat, &cr, &j, &o, &ids, &n_ids, err, sizeof err)) goto bad;
    char id[48];
    srv_make_id(s, chat ? "chatcmpl-" : "cmpl-", id, sizeof id);
    o.id = id;
    o.created = (int64_t)time(NULL);
    j.prompt = ids;
    j.n_prompt = n_ids;
    j.on_text = oai_on_text;
    j.on_tick = oai_on_tick;
    j.ud = &o;
    j.conn = c;
    if (o.stream) {
        buf_t h = {0};
        c->status = 200;
        buf_puts(&h, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n");
        http_common_headers(c, &h);
        buf_puts(&h, "Connection: close\r\n\r\n");
        ok = http_send(c, h.data, h.len);
        buf_free(&h);
        if (ok && chat) ok = oai_send_chunk(&o, "", 0, NULL, true);
        if (ok) srv_generate(s, &j);
        if (ok && !c->broken) {
            if (j.stop == STOP_ERROR) {
                o.ev.len = 0;
                api_error_json(&o.ev, API_OPENAI, j.err_status ? j.err_status : 500, j.err);
                sse_event(c, NULL, &o.ev);
            } else {
                oai_send_chunk(&o, NULL, 0, j.stop == STOP_MAX_TOKENS ? "length" : "stop", false);
                if (o.include_usage) {
                    o.ev.len = 0;
                    json_writer w;
                    json_w_init(&w, &o.ev);
                    oai_chunk_head(&w, &o);
                    json_w_key(&w, "choices");
                    json_w_arr_begin(&w);
                    json_w_arr_end(&w);
                    oai_usage(&w, &j);
                    json_w_obj_end(&w);
                    sse_event(c, NULL, &o.ev);
                }
            }
            http_send(c, "data: [DONE]\n\n", 14);
        }
        ok = false;
        goto done;
    }
    srv_generate(s, &j);
    if (j.stop == STOP_ERROR) {
        ok = srv_check_ctx_error(c, API_OPENAI, &j, r->keep_alive);
        goto done;
    }
    {
        buf_t b = {0};
        json_writer w;
        json_w_init(&w, &b);
        json_w_obj_begin(&w);
        json_w_key(&w, "id");
        json_w_cstr(&w, id);
        json_w_key(&w, "object");
        json_w_cstr(&w, chat ? "chat.completion" : "text_completion");
        json_w_key(&w, "created");
        json_w_int(&w, o.created);
        json_w_key(&w, "model");
        json_w_cstr(&w, o.model);
        json_w_key(&w, "choices");
        json_w_arr_begin(&w);
        json_w_obj_begin(&w);
        json_w_key(&w, "index");
        json_w_int(&w, 0);
        if (chat) {
            json_w_key(&w, "message");
            json_w_obj_begin(&w);
            json_w_key(&w, "role");
            json_w_cstr(&w, "assistant");
            json_w_key(&w, "content");
            json_w_str(&w, o.text.data ? o.text.data : "", o.text.len);
            json_w_obj_end(&w);
        } else {
            json_w_key(&w, "text");
            json_w_str(&w, o.text.data ? o.text.data : "", o.text.len);
            json_w_key(&w, "logprobs");
            json_w_null(&w);
        }
        json_w_key(&w, "finish_reason");
        json_w_cstr(&w, j.stop == STOP_MAX_TOKENS ? "length" : "stop");
        json_w_obj_end(&w);
        json_w_arr_end(&w);
        oai_usage(&w, &j);
        json_w_obj_end(&w);
        ok = http_respond(c, 200, "application/json", b.data, b.len, r->keep_alive);
        buf_free(&b);
    }
    goto done;
bad:
    ok = api_error(c, API_OPENAI, 400, r->keep_alive, "%s", err[0] ? err : "invalid request");
done:
    buf_free(&o.text);
    buf_free(&o.ev);
    buf_free(&j.hold);
    free(j.stops);
    free(ids);
    chat_req_free(&cr);
    return ok;
}

// ---- other endpoints ----

static bool handle_models(http_conn *c, const http_req *r) {
    server_t *s = c->srv;
    buf_t b = {0};
    json_writer w;
    json_w_init(&w, &b);
    json_w_obj_begin(&w);
    if (http_header_get(r, "anthropic-version").p) {
        json_w_key(&w, "data");
        json_w_arr_begin(&w);
        json_w_obj_begin(&w);
        json_w_key(&w, "type");
        json_w_cstr(&w, "model");
        json_w_key(&w, "id");
        json_w_cstr(&w, s->conf.model_name);
        json_w_key(&w, "display_name");
        json_w_cstr(&w, s->conf.model_name);
        json_w_key(&w, "created_at");
        json_w_cstr(&w, "2025-01-01T00:00:00Z");
        json_w_obj_end(&w);
        json_w_arr_end(&w);
        json_w_key(&w, "has_more");
        json_w_bool(&w, false);
        json_w_key(&w, "first_id");
        json_w_cstr(&w, s->conf.model_name);
        json_w_key(&w, "last_id");
        json_w_cstr(&w, s->conf.model_name);
    } else {
        json_w_key(&w, "object");
        json_w_cstr(&w, "list");
        json_w_key(&w, "data");
        json_w_arr_begin(&w);
        json_w_obj_begin(&w);
        json_w_key(&w, "id");
        json_w_cstr(&w, s->conf.model_name);
        json_w_key(&w, "object");
        json_w_cstr(&w, "model");
        json_w_key(&w, "created");
        json_w_int(&w, 1735689600);
        json_w_key(&w, "owned_by");
        json_w_cstr(&w, "pensieve");
        json_w_obj_end(&w);
        json_w_arr_end(&w);
    }
    json_w_obj_end(&w);
    bool ok = http_respond(c, 200, "application/json", b.data, b.len, r->keep_alive);
    buf_free(&b);
    return ok;
}

static bool handle_metrics(http_conn *c, const http_req *r) {
    server_t *s = c->srv;
    buf_t b = {0};
    pthread_mutex_lock(&s->mu);
    buf_printf(&b,
               "# HELP pensieve_requests_total HTTP requests received.\n# TYPE pensieve_requests_total counter\n"
               "pensieve_requests_total %" PRIu64 "\n"
               "# HELP pensieve_errors_total Requests answered with an error status.\n# TYPE pensieve_errors_total counter\n"
               "pensieve_errors_total %" PRIu64 "\n"
               "# HELP pensieve_tokens_in_total Prompt tokens.\n# TYPE pensieve_tokens_in_total counter\n"
               "pensieve_tokens_in_total %" PRIu64 "\n"
               "# HELP pensieve_tokens_out_total Generated tokens.\n# TYPE pensieve_tokens_out_total counter\n"
               "pensieve_tokens_out_total %" PRIu64 "\n"
               "# HELP pensieve_prompt_cache_hits_total Requests that reused a cached prefix.\n# TYPE pensieve_prompt_cache_hits_total counter\n"
               "pensieve_prompt_cache_hits_total %" PRIu64 "\n"
               "# HELP pensieve_prompt_cached_tokens_total Prompt tokens served from the cache.\n# TYPE pensieve_prompt_cached_tokens_total counter\n"
               "pensieve_prompt_cached_tokens_total %" PRIu64 "\n"
               "# HELP pensieve_prompt_tokens_per_second Prompt tokens evaluated per second of prompt processing.\n# TYPE pensieve_prompt_tokens_per_second gauge\n"
               "pensieve_prompt_tokens_per_second %.3f\n"
               "# HELP pensieve_generation_tokens_per_second Tokens generated per second of generation.\n# TYPE pensieve_generation_tokens_per_second gauge\n"
               "pensieve_generation_tokens_per_second %.3f\n"
               "# HELP pensieve_queue_depth Requests waiting for a slot.\n# TYPE pensieve_queue_depth gauge\n"
               "pensieve_queue_depth %d\n"
               "# HELP pensieve_slots_busy Slots generating.\n# TYPE pensieve_slots_busy gauge\n"
               "pensieve_slots_busy %d\n"
               "# HELP pensieve_slots Slots configured.\n# TYPE pensieve_slots gauge\n"
               "pensieve_slots %d\n"
               "# HELP pensieve_connections Open connections.\n# TYPE pensieve_connections gauge\n"
               "pensieve_connections %d\n",
               s->m_requests, s->m_errors, s->m_tokens_in, s->m_tokens_out, s->m_cache_hits, s->m_cached_tokens,
               s->m_prompt_seconds > 0 ? (double)(s->m_tokens_in - s->m_cached_tokens) / s->m_prompt_seconds : 0.0,
               s->m_gen_seconds > 0 ? (double)s->m_tokens_out / s->m_gen_seconds : 0.0, s->n_waiting, s->n_busy,
               s->conf.parallel, s->n_conns);
    pthread_mutex_unlock(&s->mu);
    bool ok = http_respond(c, 200, "text/plain; version=0.0.4", b.data, b.len, r->keep_alive);
    buf_free(&b);
    return ok;
}

// The chat page served at GET /: plain HTML and JavaScript, no external resources (works
// offline). It streams answers from /v1/messages and keeps the conversation in the page.
static const char srv_chat_page[] =
    "<!doctype html>\n"
    "<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
    "<title>pensieve</title>\n"
    "<style>\n"
    "body{font:15px/1.45 system-ui,sans-serif;margin:0;display:flex;flex-direction:column;height:100vh;background:#fafaf7;color:#222}\n"
    "header{padding:.6em 1em;border-bottom:1px solid #ddd;display:flex;gap:1em;align-items:center}\n"
    "header h1{font-size:1.1em;margin:0}#model{color:#777;font-size:.9em}\n"
    "#log{flex:1;overflow-y:auto;padding:1em;max-width:60em;width:100%;box-sizing:border-box;margin:0 auto}\n"
    ".msg{white-space:pre-wrap;margin:.6em 0;padding:.6em .8em;border-radius:8px}\n"
    ".user{background:#e8eefc;margin-left:15%}.assistant{background:#fff;border:1px solid #e2e2e2;margin-right:15%}\n"
    ".error{background:#fde8e8;color:#900}\n"
    "form{display:flex;gap:.5em;padding:.8em;border-top:1px solid #ddd;max-width:60em;width:100%;box-sizing:border-box;margin:0 auto}\n"
    "textarea{flex:1;font:inherit;padding:.5em;resize:vertical;min-height:2.6em}\n"
    "button{font:inherit;padding:0 1.2em}\n"
    "#key{width:9em}\n"
    "</style></head><body>\n"
    "<header><h1>pensieve</h1><span id=\"model\"></span><span style=\"flex:1\"></span>\n"
    "<input id=\"key\" type=\"password\" placeholder=\"API key (if set)\" autocomplete=\"off\"><button id=\"clear\" type=\"button\">New chat</button></header>\n"
    "<div id=\"log\"></div>\n"
    "<form id=\"form\"><textarea id=\"input\" rows=\"2\" placeholder=\"Send a message (Enter to send, Shift+Enter for a new line)\"></textarea>\n"
    "<button id=\"send\" type=\"submit\">Send</button></form>\n"
    "<script>\n"
    "\"use strict\";\n"
    "const log = document.getElementById(\"log\"), input = document.getElementById(\"input\"), form = document.getElementById(\"form\");\n"
    "const keyBox = document.getElementById(\"key\"), sendBtn = document.getElementById(\"send\");\n"
    "let history = [];\n"
    "keyBox.value = localStorage.getItem(\"pensieve-key\") || \"\";\n"
    "keyBox.onchange = () => localStorage.setItem(\"pensieve-key\", keyBox.value);\n"
    "const headers = () => { const h = {\"content-type\": \"application/json\", \"anthropic-version\": \"2023-06-01\"}; if (keyBox.value) h[\"x-api-key\"] = keyBox.value; return h; };\n"
    "fetch(\"/v1/models\", {headers: headers()}).then(r => r.json()).then(j => { if (j.data) document.getElementById(\"model\").textContent = j.data[0].id; }).catch(() => {});\n"
    "function add(role, text) { const d = document.createElement(\"div\"); d.className = \"msg \" + role; d.textContent = text; log.appendChild(d); log.scrollTop = log.scrollHeight; return d; }\n"
    "document.getElementById(\"clear\").onclick = () => { history = []; log.textContent = \"\"; };\n"
    "input.addEventListener(\"keydown\", e => { if (e.key === \"Enter\" && !e.shiftKey) { e.preventDefault(); form.requestSubmit(); } });\n"
    "form.onsubmit = async e => {\n"
    "  e.preventDefault();\n"
    "  const text = input.value.trim(); if (!text || sendBtn.disabled) return;\n"
    "  input.value = \"\"; add(\"user\", text); history.push({role: \"user\", content: text});\n"
    "  const out = add(\"assistant\", \"\"); out.dataset.state = \"streaming\"; sendBtn.disabled = true;\n"
    "  let answer = \"\";\n"
    "  try {\n"
    "    const r = await fetch(\"/v1/messages\", {method: \"POST\", headers: headers(),\n"
    "      body: JSON.stringify({model: \"pensieve\", max_tokens: 512, stream: true, messages: history})});\n"
    "    if (!r.ok) { const j = await r.json().catch(() => null); throw new Error(j && j.error ? j.error.message : \"HTTP \" + r.status); }\n"
    "    const reader = r.body.getReader(), dec = new TextDecoder(); let buf = \"\";\n"
    "    for (;;) {\n"
    "      const {value, done} = await reader.read(); if (done) break;\n"
    "      buf += dec.decode(value, {stream: true});\n"
    "      let i;\n"
    "      while ((i = buf.indexOf(\"\\n\\n\")) >= 0) {\n"
    "        const ev = buf.slice(0, i); buf = buf.slice(i + 2);\n"
    "        const line = ev.split(\"\\n\").find(l => l.startsWith(\"data: \")); if (!line) continue;\n"
    "        const d = JSON.parse(line.slice(6));\n"
    "        if (d.type === \"content_block_delta\") { answer += d.delta.text; out.textContent = answer; log.scrollTop = log.scrollHeight; }\n"
    "        else if (d.type === \"error\") throw new Error(d.error.message);\n"
    "      }\n"
    "    }\n"
    "    history.push({role: \"assistant\", content: answer});\n"
    "    out.dataset.state = \"done\";\n"
    "  } catch (err) { out.className = \"msg error\"; out.textContent = answer + \"\\n[\" + err.message + \"]\"; out.dataset.state = \"error\"; history.pop(); }\n"
    "  sendBtn.disabled = false; input.focus();\n"
    "};\n"
    "</script></body></html>\n"
    "\n";

// Constant-time comparison of the presented key with the configured one (no early exit on the
// first differing byte; lengths compared last).
static bool srv_key_ok(const char *want, str_t got) {
    size_t wn = strlen(want);
    unsigned diff = (unsigned)(wn ^ got.n);
    for (size_t i = 0; i < wn; i++) diff |= (unsigned)(uint8_t)want[i] ^ (unsigned)(i < got.n ? (uint8_t)got.p[i] : 0u);
    return diff == 0;
}

// When bound to loopback, only loopback names may appear in Host: a web page on another site
// that rebinds its DNS name to 127.0.0.1 then cannot reach the server (DNS rebinding). A
// request without Host (HTTP/1.0, raw clients) is allowed.
static bool srv_is_loopback(const char *host);

static bool srv_host_ok(const server_t *s, const http_req *r) {
    if (!srv_is_loopback(s->conf.host)) return true;
    str_t h = http_header_get(r, "host");
    if (!h.p) return true;
    char name[256];
    size_t n = h.n;
    if (n >= sizeof name) return false;
    memcpy(name, h.p, n);
    name[n] = 0;
    char *end = name[0] == '[' ? strchr(name, ']') : strrchr(name, ':');
    if (name[0] == '[') {
        if (!end) return false;
        *end = 0;
        memmove(name, name + 1, strlen(name + 1) + 1);
    } else if (end) {
        *end = 0;
    }
    for (char *p = name; *p; p++) *p = (char)tolower((unsigned char)*p);
    return !strcmp(name, "localhost") || !strcmp(name, "::1") || !strncmp(name, "127.", 4) ||
           (strlen(name) > 10 && !strcmp(name + strlen(name) - 10, ".localhost"));
}

static bool srv_route(http_conn *c, http_req *r) {
    server_t *s = c->srv;
    pthread_mutex_lock(&s->mu);
    s->m_requests++;
    pthread_mutex_unlock(&s->mu);
    bool is_anth = str_eq_c(r->path, "/v1/messages") || str_eq_c(r->path, "/v1/messages/count_tokens");
    bool is_oai = r->oai;
    api_kind api = is_oai || (str_eq_c(r->path, "/v1/models") && !http_header_get(r, "anthropic-version").p) ? API_OPENAI : API_ANTHROPIC;
    if (!srv_host_ok(s, r)) {
        str_t host = http_header_get(r, "host");
        return api_error(c, api, 403, false, "Host '%.*s' is not allowed: this server listens on loopback only "
                                             "(DNS rebinding protection)", (int)str_clip_utf8(host.p, host.n, 100), host.p);
    }
    if (!strcmp(r->method, "OPTIONS") && s->conf.cors_origin) {
        buf_t h = {0};
        buf_puts(&h, "HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n");
        http_common_headers(c, &h);
        buf_puts(&h, "Access-Control-Allow-Methods: GET, POST, OPTIONS\r\nAccess-Control-Allow-Headers: content-type, "
                     "authorization, x-api-key, anthropic-version, anthropic-beta\r\nAccess-Control-Max-Age: 600\r\n\r\n");
        bool ok = http_send(c, h.data, h.len);
        buf_free(&h);
        return ok && r->keep_alive;
    }
    if ((str_eq_c(r->path, "/") || str_eq_c(r->path, "/index.html")) && !strcmp(r->method, "GET"))
        return http_respond(c, 200, "text/html; charset=utf-8", srv_chat_page, sizeof srv_chat_page - 1, r->keep_alive) &&
               r->keep_alive;
    if (str_eq_c(r->path, "/health")) {
        const char *b = "{\"status\":\"ok\"}";
        return http_respond(c, 200, "application/json", b, strlen(b), r->keep_alive) && r->keep_alive;
    }
    // every API route needs the key when one is configured
    if (s->conf.api_key && (is_anth || is_oai || str_eq_c(r->path, "/v1/models") || str_eq_c(r->path, "/metrics"))) {
        str_t k = http_header_get(r, "x-api-key");
        if (!k.p) {
            str_t a = http_header_get(r, "authorization");
            if (a.n > 7 && strncasecmp(a.p, "Bearer ", 7) == 0) k = (str_t){a.p + 7, a.n - 7};
        }
        if (!k.p || !srv_key_ok(s->conf.api_key, k))
            return api_error(c, api, 401, r->keep_alive, k.p ? "invalid API key" : "missing API key (x-api-key or Authorization: Bearer)") &&
                   r->keep_alive;
    }
    if (str_eq_c(r->path, "/metrics") && !strcmp(r->method, "GET")) return handle_metrics(c, r) && r->keep_alive;
    if (str_eq_c(r->path, "/v1/models") && !strcmp(r->method, "GET")) return handle_models(c, r) && r->keep_alive;
    if (!is_anth && !is_oai)
        return api_error(c, api, 404, r->keep_alive, "no route for %s %.*s", r->method, (int)str_clip_utf8(r->path.p, r->path.n, 200), r->path.p) &&
               r->keep_alive;
    if (strcmp(r->method, "POST") != 0) return api_error(c, api, 405, r->keep_alive, "use POST for %.*s", (int)str_clip_utf8(r->path.p, r->path.n, 200), r->path.p) && r->keep_alive;
    json_doc *doc = NULL;
    psv_error err = {0};
    if (json_parse(r->body.data ? r->body.data : "", r->body.len, &doc, &err) != PSV_OK) {
        bool ok = api_error(c, api, 400, r->keep_alive, "invalid JSON: %s", err.message);
        return ok && r->keep_alive;
    }
    bool ok;
    if (str_eq_c(r->path, "/v1/messages")) ok = handle_anthropic(c, r, json_root(doc), false);
    else if (str_eq_c(r->path, "/v1/messages/count_tokens")) ok = handle_anthropic(c, r, json_root(doc), true);
    else ok = handle_openai(c, r, json_root(doc), str_eq_c(r->path, "/v1/chat/completions"));
    json_doc_free(doc);
    return ok && r->keep_alive;
}

// One access-log line per request on stderr: text, or a JSON object with --log-format json.
static void srv_log_request(http_conn *c, const http_req *r, double seconds) {
    buf_t b = {0};
    char ts[32];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", &tm);
    if (c->srv->conf.log_json) {
        json_writer w;
        json_w_init(&w, &b);
        json_w_obj_begin(&w);
        json_w_key(&w, "time");
        json_w_cstr(&w, ts);
        json_w_key(&w, "request_id");
        json_w_cstr(&w, c->req_id);
        json_w_key(&w, "peer");
        json_w_cstr(&w, c->peer);
        json_w_key(&w, "method");
        json_w_cstr(&w, r->method);
        json_w_key(&w, "path");
        json_w_str(&w, r->path.p, PSV_MIN(r->path.n, 512));
        json_w_key(&w, "status");
        json_w_int(&w, c->status);
        json_w_key(&w, "seconds");
        json_w_double(&w, (double)(int64_t)(seconds * 1000) / 1000.0);
        json_w_obj_end(&w);
        buf_putc(&b, '\n');
    } else {
        buf_printf(&b, "%s %s %s %s %.*s %d %.3fs\n", ts, c->req_id, c->peer, r->method, (int)PSV_MIN(r->path.n, 200),
                   r->path.p, c->status, seconds);
    }
    // the path is client text: never let it forge extra log lines
    for (size_t i = 0; i + 1 < b.len; i++)
        if ((unsigned char)b.data[i] < 0x20) b.data[i] = '?';
    if (!b.oom) fwrite(b.data, 1, b.len, stderr);
    buf_free(&b);
}

static void *srv_conn_main(void *arg) {
    http_conn *c = arg;
    server_t *s = c->srv;
    http_req *r = calloc(1, sizeof *r);
    bool first = true;
    while (r && !s->stopping && !c->broken) {
        srv_make_id(s, "req_", c->req_id, sizeof c->req_id);
        int st = http_read_request(c, r, first);
        first = false;
        if (st < 0) break;
        if (st > 0) {
            // the request line may have been read: answer in the envelope of the API it was for
            api_error(c, r->oai ? API_OPENAI : API_ANTHROPIC, st, false, "%s", st == 413 ? "request body too large" : st == 431 ? "request headers too large"
                                                        : st == 414 ? "request line too long" : st == 408 ? "request timed out"
                                                        : st == 501 ? "unsupported transfer encoding" : st == 505 ? "HTTP version not supported"
                                                                    : "malformed request");
            break;
        }
        double t0 = plat_now();
        c->status = 0;
        bool again = srv_route(c, r);
        srv_log_request(c, r, plat_now() - t0);
        http_consume(c, r->consumed);
        if (!again) break;
    }
    if (r) buf_free(&r->body);
    free(r);
    shutdown(c->fd, SHUT_RDWR);
    close(c->fd);
    free(c->buf);
    free(c);
    pthread_mutex_lock(&s->mu);
    s->n_conns--;
    pthread_cond_broadcast(&s->conn_cv);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static void srv_on_signal(int sig) {
    PSV_UNUSED(sig);
    server_t *s = srv_global;
    if (!s) _exit(1);
    if (s->stopping) _exit(1); // a second signal: exit at once
    s->stopping = 1;
    char b = 1;
    ssize_t w = write(s->wake[1], &b, 1);
    PSV_UNUSED(w);
}

static bool srv_is_loopback(const char *host) {
    return !strcmp(host, "127.0.0.1") || !strcmp(host, "localhost") || !strcmp(host, "::1") || !strncmp(host, "127.", 4);
}

static int srv_listen(const char *host, int port, char *err, size_t cap) {
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int rc = getaddrinfo(host, ps, &hints, &res);
    if (rc != 0) {
        snprintf(err, cap, "cannot resolve host '%s': %s", host, gai_strerror(rc));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) continue;
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 128) == 0) break;
        snprintf(err, cap, "cannot listen on %s:%d: %s", host, port, strerror(errno));
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd;
}

static int srv_run(srv_conf *conf) {
    server_t *s = calloc(1, sizeof *s);
    if (!s) return 1;
    s->conf = *conf;
    s->listen_fd = -1;
    s->wake[0] = s->wake[1] = -1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->conn_cv, NULL);
    pthread_cond_init(&s->sched_cv, NULL);
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    int ur = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (ur >= 0) {
        ssize_t k = read(ur, &seed, sizeof seed);
        PSV_UNUSED(k);
        close(ur);
    }
    s->id_state = seed;
    int rc = 1;
    psv_error err = {0};
    char lerr[256] = "";
    psv_model_params mp = psv_model_default_params();
    mp.n_threads = conf->threads;
    double t0 = plat_now();
    if (psv_model_open(conf->model_path, &mp, &s->model, &err) != PSV_OK) {
        fprintf(stderr, "pensieve: %s\n", err.message);
        goto done;
    }
    if (!conf->ctx) s->conf.ctx = (uint32_t)PSV_MIN(psv_model_n_ctx_train(s->model), 4096);
    s->slots = calloc((size_t)s->conf.parallel, sizeof *s->slots);
    s->active = calloc((size_t)s->conf.parallel, sizeof *s->active);
    if (!s->slots || !s->active) goto done;
    for (int i = 0; i < s->conf.parallel; i++) {
        psv_ctx_params cp = psv_ctx_default_params();
        cp.n_ctx = s->conf.ctx;
        cp.n_batch = 1; // the scheduler's scratch does the work; a slot only keeps its cache
        if (psv_ctx_new(s->model, &cp, &s->slots[i].ctx, &err) != PSV_OK) {
            fprintf(stderr, "pensieve: slot %d: %s\n", i, err.message);
            goto done;
        }
    }
    int64_t nb = PSV_MIN((int64_t)PSV_MAX(s->conf.parallel, 128), (int64_t)s->conf.ctx);
    if (scratch_init(&s->sched_scratch, s->model, nb, s->conf.ctx, &err) != PSV_OK ||
        !(s->sched_items = calloc((size_t)nb, sizeof *s->sched_items))) {
        fprintf(stderr, "pensieve: %s\n", err.message[0] ? err.message : "out of memory");
        goto done;
    }
    if (pthread_create(&s->sched, NULL, sched_main, s) != 0) {
        fprintf(stderr, "pensieve: cannot start the scheduler thread\n");
        goto done;
    }
    s->sched_started = true;
    s->listen_fd = srv_listen(conf->host, conf->port, lerr, sizeof lerr);
    if (s->listen_fd < 0) {
        fprintf(stderr, "pensieve: %s\n", lerr);
        goto done;
    }
    if (pipe(s->wake) != 0) goto done;
    srv_global = s;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = srv_on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    if (!srv_is_loopback(conf->host) && !conf->api_key)
        fprintf(stderr, "pensieve: warning: listening on %s without an API key: anyone who can reach this address can use "
                        "the model (set --api-key or PENSIEVE_API_KEY)\n", conf->host);
    const char *warning = NULL;
    const char *fmt = psv_model_chat_format(s->model, &warning);
    if (k_kernel_set_note()) fprintf(stderr, "pensieve: %s\n", k_kernel_set_note());
    if (psv_build_note()) fprintf(stderr, "pensieve: %s\n", psv_build_note());
    if (warning) fprintf(stderr, "pensieve: %s\n", warning);
    printf("pensieve: serving %s (%s, chat format %s) on http://%s%s%s:%d — %d threads, ctx %u, %d slots, %s kernels "
           "(ready in %.1f s)\n",
           conf->model_name, conf->model_quant ? conf->model_quant : psv_model_arch(s->model), fmt ? fmt : "none", strchr(conf->host, ':') ? "[" : "", conf->host,
           strchr(conf->host, ':') ? "]" : "", conf->port, psv_model_n_threads(s->model), s->conf.ctx, s->conf.parallel,
           k_kernel_set_name(), plat_now() - t0);
    fflush(stdout);
    while (!s->stopping) {
        struct pollfd pf[2] = {{s->listen_fd, POLLIN, 0}, {s->wake[0], POLLIN, 0}};
        int pr = poll(pf, 2, 1000);
        if (pr <= 0) continue;
        if (pf[1].revents) break;
        struct sockaddr_storage peer;
        socklen_t plen = sizeof peer;
        int fd = accept4(s->listen_fd, (struct sockaddr *)&peer, &plen, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE) usleep(100000); // out of descriptors: back off, keep serving
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        pthread_mutex_lock(&s->mu);
        bool full = s->n_conns >= PSV_HTTP_MAX_CONNS;
        if (!full) s->n_conns++;
        pthread_mutex_unlock(&s->mu);
        if (full) {
            const char *msg = "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
            ssize_t k = send(fd, msg, strlen(msg), MSG_NOSIGNAL);
            PSV_UNUSED(k);
            close(fd);
            continue;
        }
        http_conn *c = calloc(1, sizeof *c);
        pthread_t th;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&at, 1u << 20);
        if (c) {
            char host[INET6_ADDRSTRLEN] = "?";
            if (peer.ss_family == AF_INET) inet_ntop(AF_INET, &((struct sockaddr_in *)&peer)->sin_addr, host, sizeof host);
            else if (peer.ss_family == AF_INET6) inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&peer)->sin6_addr, host, sizeof host);
            snprintf(c->peer, sizeof c->peer, "%s", host);
        }
        if (!c || (c->fd = fd, c->srv = s, pthread_create(&th, &at, srv_conn_main, c) != 0)) {
            close(fd);
            free(c);
            pthread_mutex_lock(&s->mu);
            s->n_conns--;
            pthread_mutex_unlock(&s->mu);
        }
        pthread_attr_destroy(&at);
    }
    // shutdown: stop accepting; in-flight requests see `stopping`, end their streams with a
    // final event and close; wait a few seconds for them
    s->stopping = 1;
    close(s->listen_fd);
    s->listen_fd = -1;
    pthread_mutex_lock(&s->mu);
    pthread_cond_broadcast(&s->sched_cv);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 5;
    while (s->n_conns > 0)
        if (pthread_cond_timedwait(&s->conn_cv, &s->mu, &until) == ETIMEDOUT) break;
    int left = s->n_conns;
    pthread_mutex_unlock(&s->mu);
    fprintf(stderr, "pensieve: stopped%s\n", left ? " (some connections were still open)" : "");
    rc = 0;
    if (left) _exit(0); // threads still hold the model: leave without freeing it under them
done:
    if (s->sched_started) {
        s->stopping = 1;
        pthread_mutex_lock(&s->mu);
        pthread_cond_broadcast(&s->sched_cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->sched, NULL);
    }
    scratch_free(&s->sched_scratch);
    free(s->sched_items);
    free(s->active);
    srv_global = NULL;
    if (s->listen_fd >= 0) close(s->listen_fd);
    if (s->wake[0] >= 0) close(s->wake[0]), close(s->wake[1]);
    for (int i = 0; s->slots && i < s->conf.parallel; i++) {
        psv_ctx_free(s->slots[i].ctx);
        free(s->slots[i].hist);
    }
    free(s->slots);
    psv_model_close(s->model);
    free(s);
    return rc;
}

#ifndef PSV_NO_MAIN // the `serve` command

static const char *srv_env(const char *name, const char *def) {
    const char *v = getenv(name);
    return v && *v ? v : def;
}

static int cli_serve(int argc, char **argv) {
    srv_conf c;
    memset(&c, 0, sizeof c);
    c.host = srv_env("PENSIEVE_HOST", "127.0.0.1");
    int64_t port = PSV_SERVER_PORT, threads = 0, ctx = 0, parallel = 4, max_queue = 64, timeout = 600;
    int64_t header_timeout = PSV_HTTP_HEADER_TIMEOUT, idle_timeout = PSV_HTTP_IDLE_TIMEOUT;
    const char *e;
    if ((e = getenv("PENSIEVE_PORT")) && !str_to_i64(e, 1, 65535, &port)) goto bad_env;
    if ((e = getenv("PENSIEVE_THREADS")) && !str_to_i64(e, 1, 1024, &threads)) goto bad_env;
    if ((e = getenv("PENSIEVE_CTX")) && !str_to_i64(e, 16, 1 << 22, &ctx)) goto bad_env;
    if ((e = getenv("PENSIEVE_PARALLEL")) && !str_to_i64(e, 1, 256, &parallel)) goto bad_env;
    c.api_key = srv_env("PENSIEVE_API_KEY", NULL);
    c.cors_origin = srv_env("PENSIEVE_CORS_ORIGIN", NULL);
    c.model_path = srv_env("PENSIEVE_MODEL", NULL);
    const char *log_format = srv_env("PENSIEVE_LOG_FORMAT", "text");
    const char *mirror = NULL;
    for (int i = 1; i < argc; i += 2) { // every option takes a value
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = v != NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: pensieve [serve] [options]\n"
                   "Serves a model over HTTP: Anthropic Messages API (POST /v1/messages, /v1/messages/count_tokens),\n"
                   "OpenAI API (POST /v1/chat/completions, /v1/completions), GET /v1/models, /health, /metrics.\n"
                   "\n"
                   "  -m, --model PATH|NAME  GGUF file, or a known model name (pensieve pull --list);\n"
                   "                         default phi-4-mini, downloaded on first run (env PENSIEVE_MODEL)\n"
                   "  --mirror BASEURL       where to download models from (env PENSIEVE_MIRROR)\n"
                   "  --host HOST            address to listen on [127.0.0.1] (env PENSIEVE_HOST)\n"
                   "  --port N               port [%d]                     (env PENSIEVE_PORT)\n"
                   "  -t, --threads N        threads for inference [all CPUs] (env PENSIEVE_THREADS)\n"
                   "  -c, --ctx N            context size per slot [model's, at most 4096] (env PENSIEVE_CTX)\n"
                   "  --parallel N           concurrent generation slots [4] (env PENSIEVE_PARALLEL)\n"
                   "  --api-key KEY          require this key (x-api-key or Authorization: Bearer) (env PENSIEVE_API_KEY)\n"
                   "  --max-queue N          requests that may wait for a slot [64]; beyond: 529 / 503\n"
                   "  --timeout S            seconds a request may wait for a slot [600]\n"
                   "  --header-timeout S     seconds a client has to send a request's headers [%d]\n"
                   "  --idle-timeout S       seconds a kept-alive connection may wait for its next request [%d]\n"
                   "  --cors-origin ORIGIN   allow browser requests from ORIGIN (env PENSIEVE_CORS_ORIGIN)\n"
                   "  --log-format text|json (env PENSIEVE_LOG_FORMAT)\n"
                   "\n"
                   "SIGINT/SIGTERM stop accepting and end open streams; a second signal exits at once.\n",
                   PSV_SERVER_PORT, PSV_HTTP_HEADER_TIMEOUT, PSV_HTTP_IDLE_TIMEOUT);
            return 0;
        }
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) c.model_path = v;
        else if (!strcmp(a, "--host")) c.host = v;
        else if (!strcmp(a, "--port")) ok = str_to_i64(v, 1, 65535, &port);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) ok = str_to_i64(v, 1, 1024, &threads);
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx")) ok = str_to_i64(v, 16, 1 << 22, &ctx);
        else if (!strcmp(a, "--parallel")) ok = str_to_i64(v, 1, 256, &parallel);
        else if (!strcmp(a, "--api-key")) c.api_key = v;
        else if (!strcmp(a, "--max-queue")) ok = str_to_i64(v, 0, 1 << 20, &max_queue);
        else if (!strcmp(a, "--timeout")) ok = str_to_i64(v, 1, 1 << 20, &timeout);
        else if (!strcmp(a, "--header-timeout")) ok = str_to_i64(v, 1, 3600, &header_timeout);
        else if (!strcmp(a, "--idle-timeout")) ok = str_to_i64(v, 1, 86400, &idle_timeout);
        else if (!strcmp(a, "--cors-origin")) c.cors_origin = v;
        else if (!strcmp(a, "--log-format")) log_format = v;
        else if (!strcmp(a, "--mirror")) mirror = v;
        else {
            fprintf(stderr, "pensieve serve: unknown option '%s' (see --help)\n", a);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "pensieve serve: bad or missing value for %s\n", a);
            return 2;
        }
    }
    if (!log_format || (strcmp(log_format, "text") && strcmp(log_format, "json"))) {
        fprintf(stderr, "pensieve serve: --log-format must be text or json\n");
        return 2;
    }
    if (c.cors_origin && !strcmp(c.cors_origin, "*") && c.api_key) {
        // credentials (the key) must never be combined with a wildcard origin (Fetch standard)
        fprintf(stderr, "pensieve serve: --cors-origin '*' cannot be combined with an API key; name the origin\n");
        return 2;
    }
    // --model PATH|NAME, else $PENSIEVE_MODEL, else the default model in the cache directory,
    // downloaded with pensieve-pull when missing (or exit with the exact command to fetch it)
    models_resolved mr;
    psv_error merr = {0};
    if (models_ensure(c.model_path, mirror, true, stderr, &mr, &merr) != PSV_OK) {
        fprintf(stderr, "pensieve: %s\n", merr.message);
        return 1;
    }
    if (mr.state == MODELS_MISMATCH)
        fprintf(stderr, "pensieve: warning: %s does not match its recorded SHA-256 (run pensieve verify)\n", mr.path);
    static char model_path[4096];
    snprintf(model_path, sizeof model_path, "%s", mr.path);
    c.model_path = model_path;
    c.log_json = !strcmp(log_format, "json");
    c.port = (int)port;
    c.threads = (int)threads;
    c.ctx = (uint32_t)ctx;
    c.parallel = (int)parallel;
    c.max_queue = (int)max_queue;
    c.timeout = (int)timeout;
    c.header_timeout = (int)header_timeout;
    c.idle_timeout = (int)idle_timeout;
    static char name[256];
    if (mr.entry) {
        snprintf(name, sizeof name, "%s", mr.entry->name);
    } else {
        const char *base = strrchr(c.model_path, '/');
        snprintf(name, sizeof name, "%.*s", (int)sizeof name - 1, base ? base + 1 : c.model_path);
        size_t nl = strlen(name);
        if (nl > 5 && !strcmp(name + nl - 5, ".gguf")) name[nl - 5] = 0;
    }
    c.model_name = name;
    c.model_quant = mr.entry ? mr.entry->quant : NULL;
    return srv_run(&c);
bad_env:
    fprintf(stderr, "pensieve: bad value in environment variable: '%s'\n", e);
    return 2;
}

#endif // PSV_NO_MAIN (the `serve` command)
#endif // !PSV_NO_MAIN || PSV_SERVER


// ----------------------------------------------------------------------------
// 20. CLI
// The `pensieve` command: subcommands over the library. Each cli_* returns the exit status
// (0 ok, 1 failure, 2 usage error) and reports errors on stderr as `pensieve CMD: message`.

#ifndef PSV_NO_MAIN

// Parse "1,2,3" into a malloc'd array of token ids. Strict: digits and commas only.
static bool cli_parse_ids(const char *s, int32_t **out, size_t *n_out) {
    *out = NULL;
    *n_out = 0;
    size_t cap = 16, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) return false;
    const char *p = s;
    while (*p) {
        while (*p == ' ') p++;
        if (*p < '0' || *p > '9') goto fail;
        int64_t v = 0;
        while (*p >= '0' && *p <= '9') {
            v = v * 10 + (*p++ - '0');
            if (v > INT32_MAX) goto fail;
        }
        while (*p == ' ') p++;
        if (n == cap) {
            int32_t *q = realloc(ids, (cap *= 2) * sizeof *ids);
            if (!q) goto fail;
            ids = q;
        }
        ids[n++] = (int32_t)v;
        if (*p == ',') {
            p++;
            if (!*p) goto fail;
        } else if (*p) goto fail;
    }
    if (n == 0) goto fail;
    *out = ids;
    *n_out = n;
    return true;
fail:
    free(ids);
    return false;
}

// Strict number parsing for flags: the whole string must be a number in range.
// Options shared by the model subcommands.
typedef struct {
    const char *model;
    int64_t threads, ctx, top;
    psv_kv_type kv_type;
} cli_model_opts;

// Consume argv[*i] if it is a shared model option. Returns 1 if consumed, 0 if not ours,
// -1 on a bad value (message printed).
static int cli_model_opt(const char *cmd, int argc, char **argv, int *i, cli_model_opts *o) {
    const char *a = argv[*i];
    const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
        if (!v) goto missing;
        o->model = v;
    } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
        if (!str_to_i64(v, 1, 1024, &o->threads)) goto bad;
    } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx")) {
        if (!str_to_i64(v, 1, 1 << 22, &o->ctx)) goto bad;
    } else if (!strcmp(a, "--kv-type")) {
        if (v && !strcmp(v, "f32")) o->kv_type = PSV_KV_F32;
        else if (v && !strcmp(v, "f16")) o->kv_type = PSV_KV_F16;
        else goto bad;
    } else {
        return 0;
    }
    (*i)++;
    return 1;
missing:
    fprintf(stderr, "pensieve %s: %s needs a value\n", cmd, a);
    return -1;
bad:
    fprintf(stderr, "pensieve %s: bad value for %s: '%s'\n", cmd, a, v ? v : "");
    return -1;
}

static psv_status cli_open(const char *cmd, const cli_model_opts *o, int64_t n_batch, psv_model **m, psv_ctx **c) {
    psv_error err = {0};
    psv_model_params mp = psv_model_default_params();
    mp.n_threads = (int)o->threads;
    psv_status st = psv_model_open(o->model, &mp, m, &err);
    if (st != PSV_OK) {
        fprintf(stderr, "pensieve %s: %s\n", cmd, err.message);
        return st;
    }
    psv_ctx_params cp = psv_ctx_default_params();
    cp.n_ctx = (uint32_t)o->ctx;
    cp.n_batch = (uint32_t)n_batch;
    cp.kv_type = o->kv_type;
    st = psv_ctx_new(*m, &cp, c, &err);
    if (st != PSV_OK) {
        fprintf(stderr, "pensieve %s: %s\n", cmd, err.message);
        psv_model_close(*m);
        *m = NULL;
    }
    return st;
}

// One line of `logits` output: position, log-sum-exp and the top k (id, logit) pairs, by
// descending logit (ties by id).
static void cli_print_logits(int64_t pos, const float *l, int64_t n_vocab, int64_t k) {
    float mx = l[0];
    for (int64_t i = 1; i < n_vocab; i++)
        if (l[i] > mx) mx = l[i];
    double sum = 0;
    for (int64_t i = 0; i < n_vocab; i++) sum += psv_exp((double)l[i] - mx);
    double lse = mx + psv_log(sum);
    if (k > n_vocab) k = n_vocab;
    int32_t top[64];
    int64_t nt = 0;
    for (int64_t i = 0; i < n_vocab; i++) {
        // insertion into a small sorted list
        if (nt == k && !(l[i] > l[top[nt - 1]])) continue;
        int64_t j = nt < k ? nt++ : nt - 1;
        while (j > 0 && l[top[j - 1]] < l[i]) {
            top[j] = top[j - 1];
            j--;
        }
        top[j] = (int32_t)i;
    }
    printf("{\"pos\":%" PRId64 ",\"lse\":%.6f,\"top\":[", pos, lse);
    for (int64_t i = 0; i < nt; i++) printf("%s[%d,%.6f]", i ? "," : "", top[i], (double)l[top[i]]);
    printf("]}\n");
}

static int cli_logits(int argc, char **argv) {
    cli_model_opts o = {.top = 8, .kv_type = PSV_KV_F32};
    const char *ids_s = NULL;
    bool one_by_one = false;
    for (int i = 1; i < argc; i++) {
        int r = cli_model_opt("logits", argc, argv, &i, &o);
        if (r < 0) return 2;
        if (r > 0) continue;
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--ids") && v) ids_s = argv[++i];
        else if (!strcmp(a, "--top") && v) {
            if (!str_to_i64(v, 1, 64, &o.top)) {
                fprintf(stderr, "pensieve logits: --top must be 1..64\n");
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--batch")) one_by_one = false;
        else if (!strcmp(a, "--one-by-one")) one_by_one = true;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: pensieve logits -m MODEL --ids 1,2,3 [--ctx N] [--threads N] [--top K]\n"
                   "                       [--batch|--one-by-one] [--kv-type f32|f16]\n"
                   "Evaluates the token ids and prints one JSON object per position:\n"
                   "  {\"pos\":0,\"lse\":12.34,\"top\":[[id,logit],...]}  (K = 8 by default)\n"
                   "--batch (default) evaluates all ids in one pass; --one-by-one, one token per pass.\n");
            return 0;
        } else {
            fprintf(stderr, "pensieve logits: unknown or incomplete option '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (!o.model || !ids_s) {
        fprintf(stderr, "pensieve logits: -m MODEL and --ids are required (see --help)\n");
        return 2;
    }
    int32_t *ids;
    size_t n;
    if (!cli_parse_ids(ids_s, &ids, &n)) {
        fprintf(stderr, "pensieve logits: --ids must be comma-separated token ids, e.g. 1,2,3\n");
        return 2;
    }
    psv_model *m = NULL;
    psv_ctx *c = NULL;
    int rc = 1;
    float *all = NULL;
    if (cli_open("logits", &o, one_by_one ? 1 : (int64_t)PSV_MAX(n, 1), &m, &c) != PSV_OK) goto done;
    int64_t nv = psv_model_n_vocab(m);
    psv_error err = {0};
    if (one_by_one) {
        for (size_t i = 0; i < n; i++) {
            if (psv_eval(c, &ids[i], 1, &err) != PSV_OK) {
                fprintf(stderr, "pensieve logits: %s\n", err.message);
                goto done;
            }
            cli_print_logits((int64_t)i, psv_ctx_logits(c), nv, o.top);
        }
    } else {
        all = malloc(n * (size_t)nv * sizeof(float));
        if (!all) {
            fprintf(stderr, "pensieve logits: out of memory for %zu x %" PRId64 " logits\n", n, nv);
            goto done;
        }
        if (psv_eval_all_logits(c, ids, n, all, &err) != PSV_OK) {
            fprintf(stderr, "pensieve logits: %s\n", err.message);
            goto done;
        }
        for (size_t i = 0; i < n; i++) cli_print_logits((int64_t)i, all + i * (size_t)nv, nv, o.top);
    }
    rc = 0;
done:
    free(all);
    free(ids);
    psv_ctx_free(c);
    psv_model_close(m);
    return rc;
}

static int cli_run(int argc, char **argv) {
    cli_model_opts o = {.kv_type = PSV_KV_F32};
    const char *prompt = NULL, *prompt_ids = NULL, *system = "You are a helpful assistant.";
    bool chat = false, print_ids = false, verbose_prompt = false;
    int64_t n_predict = 256;
    psv_sampler_params sp = psv_sampler_default_params();
    for (int i = 1; i < argc; i++) {
        int r = cli_model_opt("run", argc, argv, &i, &o);
        if (r < 0) return 2;
        if (r > 0) continue;
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true, takes = true;
        int64_t iv;
        if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) ok = v != NULL, prompt = v;
        else if (!strcmp(a, "--prompt-ids")) ok = v != NULL, prompt_ids = v;
        else if (!strcmp(a, "--system")) ok = v != NULL, system = v;
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) ok = str_to_i64(v, 0, 1 << 22, &n_predict);
        else if (!strcmp(a, "--temp")) ok = str_to_f32(v, 0, 100, &sp.temperature);
        else if (!strcmp(a, "--top-k")) ok = str_to_i64(v, 0, 1 << 24, &iv), sp.top_k = (int)iv;
        else if (!strcmp(a, "--top-p")) ok = str_to_f32(v, 0, 1, &sp.top_p);
        else if (!strcmp(a, "--min-p")) ok = str_to_f32(v, 0, 1, &sp.min_p);
        else if (!strcmp(a, "--repeat-penalty")) ok = str_to_f32(v, 0.01f, 100, &sp.repeat_penalty);
        else if (!strcmp(a, "--repeat-last-n")) ok = str_to_i64(v, 0, 1 << 20, &iv), sp.repeat_last_n = (int)iv;
        else if (!strcmp(a, "--presence-penalty")) ok = str_to_f32(v, -100, 100, &sp.presence_penalty);
        else if (!strcmp(a, "--frequency-penalty")) ok = str_to_f32(v, -100, 100, &sp.frequency_penalty);
        else if (!strcmp(a, "--seed")) ok = str_to_i64(v, 0, INT64_MAX, &iv), sp.seed = (uint64_t)iv;
        else if (!strcmp(a, "--chat")) chat = true, takes = false;
        else if (!strcmp(a, "--ids")) print_ids = true, takes = false;
        else if (!strcmp(a, "--verbose-prompt")) verbose_prompt = true, takes = false;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: pensieve run -m MODEL (-p TEXT | --prompt-ids 1,2,3) [--chat [--system TEXT]] [-n N]\n"
                   "                    [--temp T] [--top-k K] [--top-p P] [--min-p P]\n"
                   "                    [--repeat-penalty R] [--repeat-last-n N]\n"
                   "                    [--presence-penalty P] [--frequency-penalty P] [--seed S]\n"
                   "                    [--threads N] [--ctx N] [--kv-type f32|f16] [--ids] [--verbose-prompt]\n"
                   "Generates a continuation of the prompt, streamed to stdout as it is produced.\n"
                   "  --chat    format -p as a user message with the model's chat template\n"
                   "  --system TEXT  system message for --chat (default \"You are a helpful\n"
                   "            assistant.\"; --system \"\" for none)\n"
                   "  --ids     print generated token ids (one per line) instead of text\n"
                   "  --verbose-prompt  print the prompt's token ids to stderr first\n"
                   "  -n N      generate at most N tokens (default 256); stops at end-of-generation\n"
                   "  --temp 0  greedy decoding (default temperature 0.8, top-k 40, top-p 0.95,\n"
                   "            min-p 0.05, seed 24301)\n");
            return 0;
        } else {
            fprintf(stderr, "pensieve run: unknown option '%s' (see --help)\n", a);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "pensieve run: bad or missing value for %s\n", a);
            return 2;
        }
        if (takes) i++;
    }
    if (!o.model || (!prompt == !prompt_ids)) {
        fprintf(stderr, "pensieve run: -m MODEL and exactly one of -p TEXT or --prompt-ids are required (see --help)\n");
        return 2;
    }
    if (chat && !prompt) {
        fprintf(stderr, "pensieve run: --chat needs a text prompt (-p)\n");
        return 2;
    }
    psv_model *m = NULL;
    psv_ctx *c = NULL;
    psv_sampler *smp = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    int rc = 1;
    psv_error err = {0};
    psv_token_decoder *dec = NULL;
    if (prompt_ids && !cli_parse_ids(prompt_ids, &ids, &n_ids)) {
        fprintf(stderr, "pensieve run: --prompt-ids must be comma-separated token ids\n");
        return 2;
    }
    if (cli_open("run", &o, 512, &m, &c) != PSV_OK) goto done;
    if (!prompt_ids) {
        psv_status st;
        if (chat) {
            psv_chat_message msgs[2];
            size_t nm = 0;
            if (*system) msgs[nm++] = (psv_chat_message){"system", system};
            msgs[nm++] = (psv_chat_message){"user", prompt};
            const char *warning;
            psv_model_chat_format(m, &warning);
            if (warning) fprintf(stderr, "pensieve run: %s\n", warning);
            st = psv_chat_tokenize(m, msgs, nm, true, &ids, &n_ids, &err);
        } else {
            st = psv_tokenize(m, prompt, strlen(prompt), true, false, &ids, &n_ids, &err);
        }
        if (st != PSV_OK) {
            fprintf(stderr, "pensieve run: %s\n", err.message);
            goto done;
        }
    }
    if (verbose_prompt) {
        fprintf(stderr, "prompt: %zu tokens:", n_ids);
        for (size_t i = 0; i < n_ids; i++) fprintf(stderr, "%s%d", i ? "," : " ", ids[i]);
        fprintf(stderr, "\n");
    }
    if (psv_sampler_new(&sp, psv_model_n_vocab(m), &smp, &err) != PSV_OK ||
        psv_eval(c, ids, n_ids, &err) != PSV_OK) {
        fprintf(stderr, "pensieve run: %s\n", err.message);
        goto done;
    }
    if (!print_ids && psv_token_decoder_new(m, &dec, &err) != PSV_OK) {
        fprintf(stderr, "pensieve run: %s\n", err.message);
        goto done;
    }
    for (size_t i = 0; i < n_ids; i++) psv_sampler_accept(smp, ids[i]);
    for (int64_t k = 0; k < n_predict; k++) {
        int32_t tok = psv_sampler_sample(smp, psv_ctx_logits(c));
        if (psv_token_is_eog(m, tok)) break;
        psv_sampler_accept(smp, tok);
        if (print_ids) {
            printf("%d\n", tok);
        } else {
            size_t len;
            const char *piece = psv_token_decoder_push(dec, tok, &len);
            fwrite(piece, 1, len, stdout);
        }
        fflush(stdout);
        if (psv_ctx_n_past(c) >= psv_ctx_n_ctx(c)) {
            fprintf(stderr, "\npensieve run: context full (%u tokens)\n", psv_ctx_n_ctx(c));
            break;
        }
        if (psv_eval(c, &tok, 1, &err) != PSV_OK) {
            fprintf(stderr, "\npensieve run: %s\n", err.message);
            goto done;
        }
    }
    if (dec) {
        size_t len;
        const char *rest = psv_token_decoder_flush(dec, &len);
        fwrite(rest, 1, len, stdout);
    }
    if (!print_ids) printf("\n");
    rc = 0;
done:
    psv_token_decoder_free(dec);
    psv_sampler_free(smp);
    free(ids);
    psv_ctx_free(c);
    psv_model_close(m);
    return rc;
}

static void cli_usage(FILE *f) {
    fprintf(f,
            "pensieve %s — local LLM inference (GGUF models on the CPU)\n"
            "\n"
            "usage: pensieve COMMAND [options]      (pensieve COMMAND --help for details)\n"
            "\n"
            "commands:\n"
            "  run        generate text from a prompt: run -m MODEL -p TEXT [--chat] [-n N] ...\n"
            "  logits     print top logits per position: logits -m MODEL --ids 1,2,3 ...\n"
            "  tokenize   text to token ids: tokenize -m MODEL [--add-special] [--parse-special] TEXT\n"
            "  detokenize token ids to text: detokenize -m MODEL 1,2,3\n"
            "  template   apply a chat template: template (-m MODEL | --template NAME) --messages F\n"
            "  info       describe a GGUF file: metadata and tensors\n"
            "  sha256     print SHA-256 digests like sha256sum: sha256 FILE...\n"
            "  serve      HTTP server, Anthropic Messages + OpenAI APIs (the default): serve [-m MODEL]\n"
            "  pull       download a model: pull NAME (pull --list shows the known ones)\n"
            "  list       cached models with size and verification state\n"
            "  verify     re-hash a model against its recorded SHA-256: verify NAME|PATH\n"
            "  rm         remove a cached model: rm NAME\n"
            "  bench      measure prompt and generation speed: bench -m MODEL [-p 512] [-n 128] [-t 1,2]\n"
            "  mkmodel    write a random-weight GGUF for testing: mkmodel -o OUT --preset phi4-mini\n"
            "  version    print the version\n",
            PSV_VERSION);
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN); // a closed pipe is an EPIPE error on write, not a kill
    // no command, or options first: serve (zero-config `./pensieve`)
    if (argc < 2 || (argv[1][0] == '-' && strcmp(argv[1], "-h") && strcmp(argv[1], "--help") && strcmp(argv[1], "--version")))
        return cli_serve(argc, argv);
    const char *cmd = argv[1];
    if (!strcmp(cmd, "info") && argc == 3 && !strcmp(argv[2], "--cpu")) return cli_cpu();
    static const struct {
        const char *name;
        int (*fn)(int, char **);
    } cmds[] = {
        {"run", cli_run},           {"logits", cli_logits},       {"tokenize", cli_tokenize},
        {"detokenize", cli_detokenize}, {"template", cli_template}, {"info", cli_info},
        {"sha256", cli_sha256},     {"serve", cli_serve},         {"pull", cli_pull},
        {"list", cli_list},         {"verify", cli_verify},       {"rm", cli_rm},
        {"mkmodel", cli_mkmodel},   {"bench", cli_bench},
    };
    for (size_t i = 0; i < PSV_ARRAY_LEN(cmds); i++)
        if (!strcmp(cmd, cmds[i].name)) return cmds[i].fn(argc - 1, argv + 1);
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        cli_usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        printf("pensieve %s\n", PSV_VERSION);
        return 0;
    }
    fprintf(stderr, "pensieve: unknown command '%s'\n\n", cmd);
    cli_usage(stderr);
    return 2;
}

#endif // PSV_NO_MAIN

// tests/test_sha256.c — SHA-256 (section 5): NIST vectors on every compression variant this CPU
// has, streaming versus one-shot, accelerated versus portable on random data, variant selection,
// and psv_sha256_file errors.
#define PSV_TESTING
#define PSV_NO_MAIN
#include "pensieve.c"
#include "test.h"

typedef struct {
    const char *name;
    sha256_blocks_fn fn;
} t_variant;

// The portable oracle plus the accelerated variant when the CPU has it.
static t_variant t_variants[2];
static int t_n_variants;
static sha256_blocks_fn t_accel; // NULL when the CPU has no SHA instructions
static const char *t_accel_name;

static void t_init_variants(void) {
    const plat_cpu *cpu = plat_cpu_get();
    t_variants[t_n_variants++] = (t_variant){"ref", sha256_blocks_ref};
#if defined(PSV_X86)
    if (cpu->sha_ni && cpu->ssse3) t_accel = sha256_blocks_shani, t_accel_name = "sha-ni";
#elif defined(PSV_ARM64)
    if (cpu->arm_sha2) t_accel = sha256_blocks_arm, t_accel_name = "armv8-sha2";
#endif
    PSV_UNUSED(cpu);
    if (t_accel) t_variants[t_n_variants++] = (t_variant){t_accel_name, t_accel};
}

static void t_hash_with(sha256_blocks_fn fn, const void *p, size_t n, uint8_t out[32]) {
    psv_sha256 s;
    psv_sha256_init(&s);
    sha256_update_with(&s, fn, p, n);
    sha256_final_with(&s, fn, out);
}

static void t_hash(const void *p, size_t n, uint8_t out[32]) {
    psv_sha256 s;
    psv_sha256_init(&s);
    psv_sha256_update(&s, p, n);
    psv_sha256_final(&s, out);
}

static const char *t_hex(const uint8_t d[32]) {
    static char buf[4][65];
    static int k;
    char *b = buf[k++ & 3];
    sha256_hex(d, b);
    return b;
}

// splitmix64: reproducible test data.
static uint64_t t_rng_state = 0x5eed5eed12345678ull;
static uint64_t t_rng(void) {
    uint64_t z = (t_rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static void t_fill(uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(t_rng() >> 56);
}

// FIPS 180-4 examples (NIST CSRC "SHA256.pdf", "SHA2_Additional.pdf"): msg repeated `repeat`
// times. The 'a'*n rows straddle the padding boundaries (55/56 bytes: one or two final blocks)
// and were checked against coreutils sha256sum.
static const struct {
    const char *msg;
    size_t repeat;
    const char *hex;
} t_vectors[] = {
    {"", 1, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
    {"abc", 1, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
    {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 1,
     "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
    {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmno"
     "ijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu",
     1, "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
    {"a", 1000000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"},
    {"a", 55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"},
    {"a", 56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"},
    {"a", 57, "f13b2d724659eb3bf47f2dd6af1accc87b81f09f59f2b75e5c0bed6589dfe8c6"},
    {"a", 63, "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34"},
    {"a", 64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"},
    {"a", 65, "635361c48bb9eab14198e76ea8ab7f1a41685d6ad62aa9146d301d4f17eb0ae0"},
    {"a", 119, "31eba51c313a5c08226adf18d4a359cfdfd8d2e816b13f4af952f7ea6584dcfb"},
    {"a", 120, "2f3d335432c70b580af0e8e1b3674a7c020d683aa5f73aaaedfdc55af904c21c"},
    {"a", 128, "6836cf13bac400e9105071cd6af47084dfacad4e5e302c94bfed24e013afb73e"},
};

static void test_vectors(void) {
    for (size_t i = 0; i < PSV_ARRAY_LEN(t_vectors); i++) {
        size_t ml = strlen(t_vectors[i].msg), n = ml * t_vectors[i].repeat;
        uint8_t *msg = malloc(n + 1);
        CHECK(msg != NULL);
        if (!msg) return;
        for (size_t r = 0; r < t_vectors[i].repeat; r++) memcpy(msg + r * ml, t_vectors[i].msg, ml);
        uint8_t d[32];
        for (int v = 0; v < t_n_variants; v++) {
            // One shot.
            t_hash_with(t_variants[v].fn, msg, n, d);
            CHECKF(strcmp(t_hex(d), t_vectors[i].hex) == 0, "%s, vector %zu (%zu bytes): got %s",
                   t_variants[v].name, i, n, t_hex(d));
            // One update per repetition of msg.
            psv_sha256 s;
            psv_sha256_init(&s);
            for (size_t r = 0; r < t_vectors[i].repeat; r++)
                sha256_update_with(&s, t_variants[v].fn, t_vectors[i].msg, ml);
            sha256_final_with(&s, t_variants[v].fn, d);
            CHECKF(strcmp(t_hex(d), t_vectors[i].hex) == 0, "%s, vector %zu by pieces: got %s",
                   t_variants[v].name, i, t_hex(d));
        }
        // The public API, whichever variant it picked.
        t_hash(msg, n, d);
        CHECKF(strcmp(t_hex(d), t_vectors[i].hex) == 0, "public API (%s), vector %zu: got %s",
               sha256_impl_name(), i, t_hex(d));
        free(msg);
    }
}

// Odd-sized pieces, from every alignment relative to the 64-byte block, equal the one-shot hash.
static void test_streaming(void) {
    enum { N = 100000 };
    uint8_t *data = malloc(N);
    CHECK(data != NULL);
    if (!data) return;
    t_fill(data, N);
    static const size_t chunks[] = {1,  2,  3,   5,   7,   13,   31,  55, 56,
                                    63, 64, 65, 127, 128, 129, 1000, 4097};
    for (int v = 0; v < t_n_variants; v++) {
        uint8_t want[32], got[32];
        t_hash_with(t_variants[v].fn, data, N, want);
        for (size_t c = 0; c < PSV_ARRAY_LEN(chunks); c++) {
            psv_sha256 s;
            psv_sha256_init(&s);
            for (size_t off = 0; off < N; off += chunks[c])
                sha256_update_with(&s, t_variants[v].fn, data + off,
                                   PSV_MIN(chunks[c], (size_t)N - off));
            sha256_final_with(&s, t_variants[v].fn, got);
            CHECKF(memcmp(want, got, 32) == 0, "%s: %zu-byte pieces differ from one shot",
                   t_variants[v].name, chunks[c]);
        }
        // Pseudo-random piece sizes 0..300, including empty updates with a NULL pointer.
        psv_sha256 s;
        psv_sha256_init(&s);
        for (size_t off = 0; off < N;) {
            size_t k = (size_t)(t_rng() % 301); // PSV_MIN would call t_rng twice
            if (k > N - off) k = N - off;
            sha256_update_with(&s, t_variants[v].fn, k ? data + off : NULL, k);
            off += k;
        }
        sha256_final_with(&s, t_variants[v].fn, got);
        CHECKF(memcmp(want, got, 32) == 0, "%s: random pieces differ from one shot",
               t_variants[v].name);
    }
    // The public API agrees too, and final leaves the object zeroed (it must be re-initialised).
    uint8_t a[32], b[32];
    t_hash_with(sha256_blocks_ref, data, N, a);
    psv_sha256 s;
    psv_sha256_init(&s);
    for (size_t off = 0; off < N; off += 777)
        psv_sha256_update(&s, data + off, PSV_MIN((size_t)777, (size_t)N - off));
    psv_sha256_final(&s, b);
    CHECK(memcmp(a, b, 32) == 0);
    psv_sha256 zero;
    memset(&zero, 0, sizeof zero);
    CHECK(memcmp(&s, &zero, sizeof s) == 0);
    free(data);
}

// The accelerated variant against the oracle: every length 0..1000 (each at an odd address, so
// unaligned loads are exercised), a few MB, and the raw block function from random states.
static void test_accel_vs_ref(void) {
    if (!t_accel) {
#if defined(PSV_X86)
        SKIP("sha256: accelerated = portable: this x86 CPU has no SHA-NI (cpuid.7.ebx[29])");
#elif defined(PSV_ARM64)
        SKIP("sha256: accelerated = portable: this CPU has no ARMv8 SHA2 (HWCAP_SHA2)");
#else
        SKIP("sha256: accelerated = portable: no accelerated variant for this architecture");
#endif
        return;
    }
    enum { BIG = (3 << 20) + 37 };
    uint8_t *buf = malloc(BIG + 1);
    CHECK(buf != NULL);
    if (!buf) return;
    uint8_t a[32], b[32];
    int bad = 0;
    for (size_t n = 0; n <= 1000; n++) {
        uint8_t *p = buf + 1;
        t_fill(p, n);
        t_hash_with(sha256_blocks_ref, p, n, a);
        t_hash_with(t_accel, p, n, b);
        if (memcmp(a, b, 32) != 0 && bad++ < 5)
            fprintf(stderr, "%s differs from ref at length %zu: %s vs %s\n", t_accel_name, n,
                    t_hex(b), t_hex(a));
    }
    CHECKF(bad == 0, "%s differs from ref on %d of the lengths 0..1000", t_accel_name, bad);

    t_fill(buf, BIG + 1);
    for (int off = 0; off < 2; off++) {
        t_hash_with(sha256_blocks_ref, buf + off, BIG, a);
        t_hash_with(t_accel, buf + off, BIG, b);
        CHECKF(memcmp(a, b, 32) == 0, "%s differs from ref on %d bytes at offset %d", t_accel_name,
               BIG, off);
    }

    // Block function alone, from random chaining values: catches state-order mistakes that the
    // standard IV might hide.
    bad = 0;
    for (size_t nb = 1; nb <= 17; nb++) {
        uint32_t s1[8], s2[8];
        for (int i = 0; i < 8; i++) s1[i] = s2[i] = (uint32_t)t_rng();
        t_fill(buf, nb * 64);
        sha256_blocks_ref(s1, buf, nb);
        t_accel(s2, buf, nb);
        bad += memcmp(s1, s2, sizeof s1) != 0;
    }
    CHECKF(bad == 0, "%s block function differs from ref for %d block counts", t_accel_name, bad);
    free(buf);
}

// PSV_KERNELS=ref wins; otherwise the CPU decides.
static void test_pick(void) {
    plat_cpu none, all;
    memset(&none, 0, sizeof none);
    memset(&all, 0, sizeof all);
    all.ssse3 = all.sha_ni = all.neon = all.arm_sha2 = true;
    const char *name = NULL;
    CHECK(sha256_pick(&none, NULL, &name) == sha256_blocks_ref && strcmp(name, "ref") == 0);
    CHECK(sha256_pick(&all, "ref", &name) == sha256_blocks_ref && strcmp(name, "ref") == 0);
#if defined(PSV_X86)
    CHECK(sha256_pick(&all, NULL, &name) == sha256_blocks_shani && strcmp(name, "sha-ni") == 0);
    CHECK(sha256_pick(&all, "", &name) == sha256_blocks_shani);
    all.ssse3 = false;
    CHECK(sha256_pick(&all, NULL, &name) == sha256_blocks_ref);
#elif defined(PSV_ARM64)
    CHECK(sha256_pick(&all, NULL, &name) == sha256_blocks_arm && strcmp(name, "armv8-sha2") == 0);
#endif
    // What the process actually uses matches its environment and CPU.
    sha256_blocks_fn want = sha256_pick(plat_cpu_get(), getenv("PSV_KERNELS"), &name);
    CHECK(sha256_impl() == want);
    CHECK(strcmp(sha256_impl_name(), name) == 0);
    fprintf(stderr, "sha256: the public API uses %s\n", sha256_impl_name());
}

static void test_file(void) {
    uint8_t d[32], want[32];
    psv_error err = {0};

    CHECK(psv_sha256_file("/nonexistent/pensieve-sha256-test", d, &err) == PSV_ERR_IO);
    CHECK(err.status == PSV_ERR_IO);
    CHECKF(strstr(err.message, "sha256: /nonexistent/pensieve-sha256-test: cannot open") ==
               err.message, "message: %s", err.message);
    CHECK(psv_sha256_file("/nonexistent/x", d, NULL) == PSV_ERR_IO); // err is optional

    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp) tmp = "/tmp";
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s/psv_sha256_XXXXXX", tmp);
    if (!mkdtemp(dir)) {
        SKIP("sha256: file tests: cannot create a temporary directory under %s", tmp);
        return;
    }
    memset(&err, 0, sizeof err);
    memset(d, 0xaa, sizeof d);
    CHECK(psv_sha256_file(dir, d, &err) == PSV_ERR_IO);
    CHECKF(strstr(err.message, "is a directory") != NULL, "message: %s", err.message);
    CHECK(d[0] == 0 && d[31] == 0); // no stale digest on failure

    memset(&err, 0, sizeof err);
    CHECK(psv_sha256_file(NULL, d, &err) == PSV_ERR_INVALID);

    // Empty file, then one that spans several read buffers and ends mid-block.
    static const size_t sizes[] = {0, 1, 64, 2 * SHA256_READ_SIZE + 1000003};
    snprintf(path, sizeof path, "%s/data", dir);
    for (size_t i = 0; i < PSV_ARRAY_LEN(sizes); i++) {
        size_t n = sizes[i];
        uint8_t *data = malloc(n + 1);
        CHECK(data != NULL);
        if (!data) break;
        t_fill(data, n);
        FILE *f = fopen(path, "wb");
        CHECK(f != NULL);
        if (!f) { free(data); break; }
        CHECK(fwrite(data, 1, n, f) == n);
        CHECK(fclose(f) == 0);
        t_hash_with(sha256_blocks_ref, data, n, want);
        memset(&err, 0, sizeof err);
        CHECKF(psv_sha256_file(path, d, &err) == PSV_OK, "%zu bytes: %s", n, err.message);
        CHECKF(memcmp(d, want, 32) == 0, "file of %zu bytes: %s, want %s", n, t_hex(d),
               t_hex(want));
        free(data);
    }
    remove(path);
    rmdir(dir);
}

static void test_hex(void) {
    uint8_t d[32];
    for (int i = 0; i < 32; i++) d[i] = (uint8_t)(i * 8 + 7);
    char h[65];
    sha256_hex(d, h);
    CHECK(strcmp(h, "070f171f272f373f474f575f676f777f878f979fa7afb7bfc7cfd7dfe7eff7ff") == 0);
}

int main(void) {
    (void)cli_sha256;    // exercised by tests/cli_sha256.sh
    (void)t_shared_path; // no shared data needed
    t_init_variants();
    test_vectors();
    test_streaming();
    test_accel_vs_ref();
    test_pick();
    test_file();
    test_hex();
    return t_finish();
}

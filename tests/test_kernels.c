// tests/test_kernels.c — the scalar reference kernels (section 11).
//
// 1. Hand-built blocks of every weight type, with the expected values worked out by hand in the
//    comments: these pin the block layouts independently of the decoders.
// 2. vec_dot against the dot of the dequantized operands (random blocks, seeded), and against
//    the float dot with the activation quantization error bounded.
// 3. Quantize -> dequantize round trips with a bound per type; edge cases (zeros, -0, huge).
// 4. Every tensor of every shared reference model dequantizes to finite, sane values.
#define PSV_TESTING
#define PSV_NO_MAIN
#include "pensieve.c"
#include "test.h"

#include <dirent.h>

// ---- helpers -------------------------------------------------------------------------------

static double kt_t_fabs(double x) { return x < 0 ? -x : x; } // no libm in this test

static uint64_t kt_rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t kt_rng_next(void) { // splitmix64
    uint64_t z = (kt_rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float kt_rng_unit(void) { return (float)((kt_rng_next() >> 40) * (1.0 / 16777216.0)); } // [0,1)
static float kt_rng_sym(void) { return 2.0f * kt_rng_unit() - 1.0f; }                          // [-1,1)

static size_t kt_row_bytes(uint32_t type, int64_t n) {
    uint64_t sz = 0;
    PSV_ASSERT(type_row_size(type, (uint64_t)n, &sz));
    return (size_t)sz;
}

static const uint32_t kt_weight_types[] = {T_F32, T_F16, T_BF16, T_Q4_0, T_Q4_1, T_Q5_0, T_Q5_1,
                                        T_Q8_0, T_Q2_K, T_Q3_K, T_Q4_K, T_Q5_K, T_Q6_K};
static const uint32_t kt_act_types[] = {T_F32, T_F16, T_BF16, T_Q8_0, T_Q8_1, T_Q8_K};

// Offsets of the fp16 scale fields in a block of each quantized type: random blocks get sane
// values there (random bytes elsewhere are all valid).
static int kt_scale_offsets(uint32_t type, int off[2]) {
    switch (type) {
    case T_Q4_0: case T_Q5_0: case T_Q8_0: off[0] = 0; return 1;
    case T_Q4_1: case T_Q5_1: case T_Q4_K: case T_Q5_K: off[0] = 0; off[1] = 2; return 2;
    case T_Q2_K: off[0] = 80; off[1] = 82; return 2;
    case T_Q3_K: off[0] = 108; return 1;
    case T_Q6_K: off[0] = 208; return 1;
    default: return 0;
    }
}

// A random row of a weight type: random quant bytes, scales in about ±[2^-8, 2^-3], float types
// from values in [-1, 1).
static void kt_random_row(uint32_t type, int64_t n, uint8_t *row) {
    const type_info *ti = type_get(type);
    size_t size = kt_row_bytes(type, n);
    if (type == T_F32 || type == T_F16 || type == T_BF16) {
        for (int64_t i = 0; i < n; i++) {
            float v = kt_rng_sym();
            if (type == T_F32) wr_u32(row + 4 * i, f32_bits(v));
            else if (type == T_F16) wr_u16(row + 2 * i, psv_f32_to_fp16(v));
            else wr_u16(row + 2 * i, psv_f32_to_bf16(v));
        }
        return;
    }
    for (size_t i = 0; i < size; i++) row[i] = (uint8_t)kt_rng_next();
    int off[2], k = kt_scale_offsets(type, off);
    for (size_t b = 0; b < size / ti->type_size; b++)
        for (int j = 0; j < k; j++) {
            float v = (0.004f + 0.12f * kt_rng_unit()) * (kt_rng_next() & 1 ? -1.0f : 1.0f);
            wr_u16(row + b * ti->type_size + off[j], psv_f32_to_fp16(v));
        }
}

static bool kt_all_finite(const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!psv_isfinite(y[i])) return false;
    return true;
}

// ---- 0. traits and sizes -------------------------------------------------------------------

static void test_traits(void) {
    static const struct { uint32_t type; size_t size; uint32_t vec_dot_type; bool dot; } tab[] = {
        {T_F32, 4, T_F32, true},          {T_F16, 2, T_F16, true},
        {T_BF16, 2, T_BF16, true},        {T_Q4_0, K_Q4_0_SIZE, T_Q8_0, true},
        {T_Q4_1, K_Q4_1_SIZE, T_Q8_1, true}, {T_Q5_0, K_Q5_0_SIZE, T_Q8_0, true},
        {T_Q5_1, K_Q5_1_SIZE, T_Q8_1, true}, {T_Q8_0, K_Q8_0_SIZE, T_Q8_0, true},
        {T_Q8_1, K_Q8_1_SIZE, T_Q8_1, false}, {T_Q2_K, K_Q2_K_SIZE, T_Q8_K, true},
        {T_Q3_K, K_Q3_K_SIZE, T_Q8_K, true}, {T_Q4_K, K_Q4_K_SIZE, T_Q8_K, true},
        {T_Q5_K, K_Q5_K_SIZE, T_Q8_K, true}, {T_Q6_K, K_Q6_K_SIZE, T_Q8_K, true},
        {T_Q8_K, K_Q8_K_SIZE, T_Q8_K, false},
    };
    for (size_t i = 0; i < PSV_ARRAY_LEN(tab); i++) {
        const k_traits *t = k_traits_ref(tab[i].type);
        CHECKF(t != NULL, "type %u", tab[i].type);
        if (!t) continue;
        CHECKF(type_table[tab[i].type].type_size == tab[i].size, "%s size", type_table[tab[i].type].name);
        CHECKF(t->to_float && t->from_float, "%s", type_table[tab[i].type].name);
        CHECKF((t->vec_dot != NULL) == tab[i].dot, "%s vec_dot", type_table[tab[i].type].name);
        CHECKF(t->vec_dot_type == tab[i].vec_dot_type, "%s vec_dot_type", type_table[tab[i].type].name);
        // every type the engine marks supported has a vec_dot, and only those
        CHECKF(type_table[tab[i].type].supported == tab[i].dot, "%s supported", type_table[tab[i].type].name);
    }
    static const uint32_t none[] = {T_IQ2_XXS, T_IQ4_NL, T_IQ4_XS, T_I8, T_I32, T_F64, T_TQ1_0,
                                    T_MXFP4, 4, 5, 31, T_COUNT, 1000, UINT32_MAX};
    for (size_t i = 0; i < PSV_ARRAY_LEN(none); i++) CHECKF(k_traits_ref(none[i]) == NULL, "type %u", none[i]);
    // the activation types are exactly the vec_dot_types, and each has a from_float
    for (size_t i = 0; i < PSV_ARRAY_LEN(kt_act_types); i++) {
        bool used = false;
        for (size_t w = 0; w < PSV_ARRAY_LEN(kt_weight_types); w++)
            used = used || k_traits_ref(kt_weight_types[w])->vec_dot_type == kt_act_types[i];
        CHECKF(used && k_traits_ref(kt_act_types[i])->from_float, "%s", type_table[kt_act_types[i]].name);
    }
}

// ---- 1. hand-built blocks ------------------------------------------------------------------

typedef struct { int index; float value; } kt_expect_t;

static void kt_check_block(uint32_t type, const uint8_t *block, const kt_expect_t *ex, size_t n_ex) {
    const type_info *ti = type_get(type);
    float y[QK_K];
    k_traits_ref(type)->to_float(block, y, ti->blck_size);
    for (size_t i = 0; i < n_ex; i++)
        CHECKF(y[ex[i].index] == ex[i].value, "%s value %d: got %.9g, expected %.9g", ti->name,
               ex[i].index, y[ex[i].index], ex[i].value);
    CHECKF(kt_all_finite(y, ti->blck_size), "%s", ti->name);
}

static void test_q4_0_block(void) {
    // d = 0.5 (fp16 0x3800); qs[j] = j | (15 - j) << 4: value j = (j - 8) * 0.5, value 16 + j =
    // (15 - j - 8) * 0.5.
    uint8_t b[K_Q4_0_SIZE];
    wr_u16(b, 0x3800);
    for (int j = 0; j < 16; j++) b[2 + j] = (uint8_t)(j | ((15 - j) << 4));
    const kt_expect_t ex[] = {{0, -4.0f}, {1, -3.5f}, {8, 0.0f}, {15, 3.5f}, {16, 3.5f}, {23, 0.0f}, {31, -4.0f}};
    kt_check_block(T_Q4_0, b, ex, PSV_ARRAY_LEN(ex));
}

static void test_q4_1_block(void) {
    // d = 0.25 (0x3400), m = -1 (0xbc00); qs as above: value j = j/4 - 1, value 16 + j = (15 - j)/4 - 1.
    uint8_t b[K_Q4_1_SIZE];
    wr_u16(b, 0x3400);
    wr_u16(b + 2, 0xbc00);
    for (int j = 0; j < 16; j++) b[4 + j] = (uint8_t)(j | ((15 - j) << 4));
    const kt_expect_t ex[] = {{0, -1.0f}, {4, 0.0f}, {15, 2.75f}, {16, 2.75f}, {31, -1.0f}};
    kt_check_block(T_Q4_1, b, ex, PSV_ARRAY_LEN(ex));
}

static void test_q5_0_block(void) {
    // d = 1 (0x3c00); qh = 0x80000003 (bytes 03 00 00 80): fifth bit set for values 0, 1, 31.
    // qs[j] = j | (15 - j) << 4. Value = (nibble | bit << 4) - 16.
    uint8_t b[K_Q5_0_SIZE] = {0};
    wr_u16(b, 0x3c00);
    wr_u32(b + 2, 0x80000003u);
    for (int j = 0; j < 16; j++) b[6 + j] = (uint8_t)(j | ((15 - j) << 4));
    const kt_expect_t ex[] = {
        {0, 0.0f},   // 0 | 16 - 16
        {1, 1.0f},   // 1 | 16 - 16
        {2, -14.0f}, // 2 - 16
        {15, -1.0f}, // 15 - 16
        {16, -1.0f}, // high nibble of qs[0] = 15, no fifth bit
        {31, 0.0f},  // high nibble of qs[15] = 0, fifth bit (bit 31) set: 16 - 16
        {30, -15.0f} // high nibble of qs[14] = 1
    };
    kt_check_block(T_Q5_0, b, ex, PSV_ARRAY_LEN(ex));
}

static void test_q5_1_block(void) {
    // d = 2 (0x4000), m = 0.5 (0x3800); qh bit 16 and bit 5 set; qs[j] = j | (15 - j) << 4.
    uint8_t b[K_Q5_1_SIZE] = {0};
    wr_u16(b, 0x4000);
    wr_u16(b + 2, 0x3800);
    wr_u32(b + 4, (1u << 16) | (1u << 5));
    for (int j = 0; j < 16; j++) b[8 + j] = (uint8_t)(j | ((15 - j) << 4));
    const kt_expect_t ex[] = {
        {0, 0.5f},   // 0 * 2 + 0.5
        {5, 42.5f},  // (5 | 16) * 2 + 0.5
        {16, 62.5f}, // (15 | 16) * 2 + 0.5
        {17, 28.5f}, // 14 * 2 + 0.5
    };
    kt_check_block(T_Q5_1, b, ex, PSV_ARRAY_LEN(ex));
}

static void test_q8_blocks(void) {
    // Q8_0: d = 0.125 (0x3000), qs[j] = j*8 - 128 as int8: value j = j - 16.
    uint8_t b[K_Q8_0_SIZE];
    wr_u16(b, 0x3000);
    for (int j = 0; j < 32; j++) b[2 + j] = (uint8_t)(int8_t)(j * 8 - 128);
    const kt_expect_t ex[] = {{0, -16.0f}, {16, 0.0f}, {31, 15.0f}};
    kt_check_block(T_Q8_0, b, ex, PSV_ARRAY_LEN(ex));
    // Q8_1: the same with s (ignored by to_float) after d.
    uint8_t c[K_Q8_1_SIZE];
    wr_u16(c, 0x3000);
    wr_u16(c + 2, 0x7bff);
    memcpy(c + 4, b + 2, 32);
    kt_check_block(T_Q8_1, c, ex, PSV_ARRAY_LEN(ex));
    // Q8_K: d = -0.5 as float; qs[0] = 127, qs[1] = -128, qs[255] = 3.
    uint8_t k[K_Q8_K_SIZE] = {0};
    wr_u32(k, f32_bits(-0.5f));
    k[4] = 127;
    k[5] = 0x80;
    k[4 + 255] = 3;
    const kt_expect_t ek[] = {{0, -63.5f}, {1, 64.0f}, {2, 0.0f}, {255, -1.5f}};
    kt_check_block(T_Q8_K, k, ek, PSV_ARRAY_LEN(ek));
}

static void test_q2_k_block(void) {
    // d = 0.5 (0x3800), dmin = 0.25 (0x3400); scales[k] = k | (15 - k) << 4, i.e. sc = k,
    // m = 15 - k for sub-block k = value/16. x = 0.5 sc q - 0.25 m.
    // qs[0] = 0xe4 = 11 10 01 00: values 0, 32, 64, 96 get q = 0, 1, 2, 3.
    // qs[16] = 0x1b = 00 01 10 11: values 16, 48, 80, 112 get q = 3, 2, 1, 0.
    // qs[63] = 0xff: values 159, 191, 223, 255 get q = 3.
    uint8_t b[K_Q2_K_SIZE] = {0};
    for (int k = 0; k < 16; k++) b[k] = (uint8_t)(k | ((15 - k) << 4));
    b[16 + 0] = 0xe4;
    b[16 + 16] = 0x1b;
    b[16 + 63] = 0xff;
    wr_u16(b + 80, 0x3800);
    wr_u16(b + 82, 0x3400);
    const kt_expect_t ex[] = {
        {0, -3.75f},   // sc 0,  m 15, q 0: 0 - 3.75
        {32, -2.25f},  // sc 2,  m 13, q 1: 1 - 3.25
        {64, 1.25f},   // sc 4,  m 11, q 2: 4 - 2.75
        {96, 6.75f},   // sc 6,  m 9,  q 3: 9 - 2.25
        {16, -2.0f},   // sc 1,  m 14, q 3: 1.5 - 3.5
        {48, 0.0f},    // sc 3,  m 12, q 2: 3 - 3
        {80, 0.0f},    // sc 5,  m 10, q 1: 2.5 - 2.5
        {112, -2.0f},  // sc 7,  m 8,  q 0: 0 - 2
        {159, 12.0f},  // sc 9,  m 6,  q 3: 13.5 - 1.5
        {191, 15.5f},  // sc 11, m 4,  q 3: 16.5 - 1
        {223, 19.0f},  // sc 13, m 2,  q 3: 19.5 - 0.5
        {255, 22.5f},  // sc 15, m 0,  q 3: 22.5
        {1, -3.75f},   // sub-block 0, q 0
        {200, -0.75f}, // sub-block 12 (sc 12, m 3), q 0
    };
    kt_check_block(T_Q2_K, b, ex, PSV_ARRAY_LEN(ex));
}

static void test_q3_k_block(void) {
    // d = 0.5. Stored 6-bit scales u_k (sc = u - 32): u0 = 33 (sc 1), u5 = 63 (sc 31), u8 = 29
    // (sc -3), u15 = 0 (sc -32), all others 32 (sc 0).
    //   low nibbles: scales[k] low = u_k & 15 (k < 8), high = u_{k+8} & 15:
    //     scales[0] = 1 | 0xd << 4 = 0xd1, scales[5] = 0x0f, the rest 0.
    //   top bits (u >> 4) of k at scales[8 + k%4] bit 2(k/4):
    //     scales[8]  (k 0, 4, 8, 12) = 2 | 2<<2 | 1<<4 | 2<<6 = 0x9a
    //     scales[9]  (k 1, 5, 9, 13) = 2 | 3<<2 | 2<<4 | 2<<6 = 0xae
    //     scales[10] (k 2, 6, 10, 14) = 0xaa
    //     scales[11] (k 3, 7, 11, 15) = 2 | 2<<2 | 2<<4 | 0<<6 = 0x2a
    // Quants (value e: low bits at qs[32(e/128) + e%32] bit 2((e/32)%4), high bit hmask[e%32]
    // bit e/32; q = low - (high ? 0 : 4)):
    //   e0:   qs[0] = 3, hmask[0] bit 0 set       -> q 3,  x = 0.5*1*3 = 1.5
    //   e1:   qs[1] = 0, hmask[1] = 0             -> q -4, x = 0.5*1*-4 = -2
    //   e80:  qs[16] bits 4-5 = 2, hmask[16] bit 2 clear -> q -2, x = 0.5*31*-2 = -31
    //   e128: qs[32] bits 0-1 = 1, hmask[0] bit 4 set    -> q 1,  x = 0.5*-3*1 = -1.5
    //   e255: qs[63] bits 6-7 = 3, hmask[31] bit 7 set   -> q 3,  x = 0.5*-32*3 = -48
    //   e254: qs[62] = 0, hmask[30] = 0                  -> q -4, x = 0.5*-32*-4 = 64
    //   e20:  sub-block 1, sc 0                          -> 0
    uint8_t b[K_Q3_K_SIZE] = {0};
    uint8_t *hmask = b, *qs = b + 32, *sc = b + 96;
    sc[0] = 0xd1;
    sc[5] = 0x0f;
    sc[8] = 0x9a;
    sc[9] = 0xae;
    sc[10] = 0xaa;
    sc[11] = 0x2a;
    qs[0] = 0x03;
    hmask[0] = 0x11;
    qs[16] = 0x20;
    qs[32] = 0x01;
    qs[63] = 0xc0;
    hmask[31] = 0x80;
    wr_u16(b + 108, 0x3800);
    const kt_expect_t ex[] = {{0, 1.5f},    {1, -2.0f},    {80, -31.0f}, {128, -1.5f},
                           {255, -48.0f}, {254, 64.0f}, {20, 0.0f}};
    kt_check_block(T_Q3_K, b, ex, PSV_ARRAY_LEN(ex));
}

// Q4_K and Q5_K share the scale layout: d = 0.5, dmin = 0.25 and
//   sub-block 0: sc 1, m 2;  1: sc 63, m 0;  4: sc 17 (0b010001), m 35 (0b100011);
//   7: sc 48 (0b110000), m 63; all others 0.
// Packed: k < 4 in the low 6 bits of s[k] (sc) and s[k+4] (m); k >= 4: nibbles in s[k+4]
// (sc low, m high), top 2 bits of sc in s[k-4] bits 6-7, of m in s[k] bits 6-7:
//   s[0] = 1 | 1<<6 = 0x41 (sc0, top of sc4)   s[1] = 0x3f (sc1)   s[3] = 0 | 3<<6 = 0xc0 (top of sc7)
//   s[4] = 2 | 2<<6 = 0x82 (m0, top of m4)     s[7] = 0 | 3<<6 = 0xc0 (top of m7)
//   s[8] = 1 | 3<<4 = 0x31 (sc4, m4 low)       s[11] = 0 | 15<<4 = 0xf0 (sc7, m7 low)
static void kt_kq_scales(uint8_t *b) {
    wr_u16(b, 0x3800);
    wr_u16(b + 2, 0x3400);
    uint8_t *s = b + 4;
    s[0] = 0x41;
    s[1] = 0x3f;
    s[3] = 0xc0;
    s[4] = 0x82;
    s[7] = 0xc0;
    s[8] = 0x31;
    s[11] = 0xf0;
}

static void test_q4_k_block(void) {
    // Value 64c + l is the low nibble of qs[32c + l], 64c + 32 + l the high nibble.
    //   e0 (sub 0): qs[0] low = 15 -> 0.5*1*15 - 0.25*2 = 7
    //   e32 (sub 1): qs[0] high = 4 -> 0.5*63*4 = 126
    //   e128 (sub 4): qs[64] low = 2 -> 0.5*17*2 - 0.25*35 = 8.25
    //   e255 (sub 7): qs[127] high = 9 -> 0.5*48*9 - 0.25*63 = 200.25
    //   e254 (sub 7): qs[126] = 0 -> -15.75;  e100 (sub 3): 0
    uint8_t b[K_Q4_K_SIZE] = {0};
    kt_kq_scales(b);
    uint8_t *qs = b + 16;
    qs[0] = 0x4f;
    qs[64] = 0x02;
    qs[127] = 0x90;
    const kt_expect_t ex[] = {{0, 7.0f}, {32, 126.0f}, {128, 8.25f}, {255, 200.25f}, {254, -15.75f}, {100, 0.0f}};
    kt_check_block(T_Q4_K, b, ex, PSV_ARRAY_LEN(ex));
}

static void test_q5_k_block(void) {
    // As Q4_K plus a fifth bit: value e gets +16 when qh[e%32] bit e/32 is set.
    //   e0: 15 + 16 (qh[0] bit 0) -> 0.5*1*31 - 0.5 = 15
    //   e32: 4 (qh[0] bit 1 clear) -> 126
    //   e128: 2 + 16 (qh[0] bit 4) -> 0.5*17*18 - 8.75 = 144.25
    //   e255: 9 + 16 (qh[31] bit 7) -> 0.5*48*25 - 15.75 = 584.25
    //   e254: 0 + 16 (qh[30] bit 7) -> 0.5*48*16 - 15.75 = 368.25
    uint8_t b[K_Q5_K_SIZE] = {0};
    kt_kq_scales(b);
    uint8_t *qh = b + 16, *qs = b + 48;
    qs[0] = 0x4f;
    qs[64] = 0x02;
    qs[127] = 0x90;
    qh[0] = 0x11;
    qh[30] = 0x80;
    qh[31] = 0x80;
    const kt_expect_t ex[] = {{0, 15.0f}, {32, 126.0f}, {128, 144.25f}, {255, 584.25f}, {254, 368.25f}, {100, 0.0f}};
    kt_check_block(T_Q5_K, b, ex, PSV_ARRAY_LEN(ex));
}

static void test_q6_k_block(void) {
    // d = 0.25 (0x3400); scales (int8) [0] = 1, [2] = -1, [5] = 127, [15] = -128, others 0.
    // Value e = 128h + 32k + l: low nibble in ql[64h + 32(k&1) + l] at bit 4(k>>1), top two bits
    // in qh[32h + l] at bit 2k, q = that - 32, scale index e/16.
    //   e0 (h0 k0 l0): ql[0] low 5, qh[0] bits 0-1 = 2 -> 37 - 32 = 5, x = 0.25*1*5 = 1.25
    //   e1: ql[1] = 0, qh[1] = 0 -> -32, x = 0.25*1*-32 = -8
    //   e32 (k1 l0): ql[32] low 0, qh[0] bits 2-3 = 0 -> -32, x = 0.25*-1*-32 = 8
    //   e80 (k2 l16): ql[16] high 15, qh[16] bits 4-5 = 3 -> 31, x = 0.25*127*31 = 984.25
    //   e255 (h1 k3 l31): ql[127] high 0, qh[63] bits 6-7 = 1 -> -16, x = 0.25*-128*-16 = 512
    //   e240 (h1 k3 l16): ql[112] high 10, qh[48] bits 6-7 = 2 -> 10, x = 0.25*-128*10 = -320
    uint8_t b[K_Q6_K_SIZE] = {0};
    uint8_t *ql = b, *qh = b + 128, *sc = b + 192;
    sc[0] = 1;
    sc[2] = (uint8_t)(int8_t)-1;
    sc[5] = 127;
    sc[15] = 0x80;
    ql[0] = 0x05;
    qh[0] = 0x02;
    ql[16] = 0xf0;
    qh[16] = 0x30;
    qh[63] = 0x40;
    ql[112] = 0xa0;
    qh[48] = 0x80;
    wr_u16(b + 208, 0x3400);
    const kt_expect_t ex[] = {{0, 1.25f}, {1, -8.0f}, {32, 8.0f}, {80, 984.25f}, {255, 512.0f}, {240, -320.0f}};
    kt_check_block(T_Q6_K, b, ex, PSV_ARRAY_LEN(ex));
}

static void test_float_blocks(void) {
    static const struct { uint16_t h; float f; } f16[] = {
        {0x3c00, 1.0f}, {0xc000, -2.0f}, {0x7bff, 65504.0f}, {0x0001, 5.9604644775390625e-8f},
        {0x0400, 6.103515625e-5f}, {0x3555, 0.333251953125f},
    };
    for (size_t i = 0; i < PSV_ARRAY_LEN(f16); i++) {
        uint8_t b[2];
        float y;
        wr_u16(b, f16[i].h);
        k_dequant_f16_ref(b, &y, 1);
        CHECKF(y == f16[i].f, "f16 %04x -> %.9g", f16[i].h, y);
    }
    uint8_t b[2];
    float y;
    wr_u16(b, 0x8000);
    k_dequant_f16_ref(b, &y, 1);
    CHECK(y == 0 && f32_bits(y) == 0x80000000u); // -0 keeps its sign
    wr_u16(b, 0x7c00);
    k_dequant_f16_ref(b, &y, 1);
    CHECK(!psv_isfinite(y) && y > 0);
    static const struct { uint16_t h; float f; } bf[] = {{0x3f80, 1.0f}, {0xc040, -3.0f}, {0x4b80, 16777216.0f}};
    for (size_t i = 0; i < PSV_ARRAY_LEN(bf); i++) {
        wr_u16(b, bf[i].h);
        k_dequant_bf16_ref(b, &y, 1);
        CHECKF(y == bf[i].f, "bf16 %04x -> %.9g", bf[i].h, y);
    }
    uint8_t f[4];
    wr_u32(f, 0xc0490fdbu); // -pi
    k_dequant_f32_ref(f, &y, 1);
    CHECK(f32_bits(y) == 0xc0490fdbu);
}

// Dot products worked out by hand.
static void test_dot_by_hand(void) {
    // Q4_0 block of test_q4_0_block ((j-8)/2 and (7-j)/2) against a Q8_0 block of ones (d = 1):
    // sum_j (j - 8) + (7 - j) over j < 16 = -16, times 0.5 = -8.
    uint8_t x[K_Q4_0_SIZE], y[K_Q8_0_SIZE];
    wr_u16(x, 0x3800);
    for (int j = 0; j < 16; j++) x[2 + j] = (uint8_t)(j | ((15 - j) << 4));
    wr_u16(y, 0x3c00);
    memset(y + 2, 1, 32);
    float s = 0;
    k_dot_q4_0_q8_0_ref(32, &s, x, y);
    CHECKF(s == -8.0f, "q4_0 . q8_0 = %g", s);

    // Q4_1 of test_q4_1_block (j/4 - 1, (15-j)/4 - 1) against Q8_1 ones with d = 2, s = 64:
    // 2 * (0.25 * sum of nibbles) + m * s = 2 * 0.25 * 240 + (-1) * 64 = 120 - 64 = 56.
    uint8_t x1[K_Q4_1_SIZE], y1[K_Q8_1_SIZE];
    wr_u16(x1, 0x3400);
    wr_u16(x1 + 2, 0xbc00);
    for (int j = 0; j < 16; j++) x1[4 + j] = (uint8_t)(j | ((15 - j) << 4));
    wr_u16(y1, 0x4000);
    wr_u16(y1 + 2, psv_f32_to_fp16(64.0f));
    memset(y1 + 4, 1, 32);
    k_dot_q4_1_q8_1_ref(32, &s, x1, y1);
    CHECKF(s == 56.0f, "q4_1 . q8_1 = %g", s);

    // Q6_K of test_q6_k_block against Q8_K with d = 1, q = 1 only at values 0, 80, 240:
    // 1.25 + 984.25 - 320 = 665.5.
    uint8_t x6[K_Q6_K_SIZE] = {0}, y8[K_Q8_K_SIZE] = {0};
    x6[192 + 0] = 1; x6[192 + 5] = 127; x6[192 + 15] = 0x80;
    x6[0] = 0x05; x6[128 + 0] = 0x02; x6[16] = 0xf0; x6[128 + 16] = 0x30; x6[112] = 0xa0; x6[128 + 48] = 0x80;
    wr_u16(x6 + 208, 0x3400);
    wr_u32(y8, f32_bits(1.0f));
    y8[4 + 0] = y8[4 + 80] = y8[4 + 240] = 1;
    wr_u16(y8 + 260 + 0, 1); wr_u16(y8 + 260 + 10, 1); wr_u16(y8 + 260 + 30, 1);
    k_dot_q6_k_q8_k_ref(256, &s, x6, y8);
    CHECKF(s == 665.5f, "q6_k . q8_k = %g", s);

    // Q4_K: the minimum goes through bsums. Q4_K block of test_q4_k_block against Q8_K with
    // d = 2, q = 1 at values 0 and 254 (bsums[0] = bsums[15] = 1): 2 * (7 + -15.75) = -17.5.
    uint8_t x4[K_Q4_K_SIZE] = {0}, z8[K_Q8_K_SIZE] = {0};
    kt_kq_scales(x4);
    x4[16 + 0] = 0x4f; x4[16 + 64] = 0x02; x4[16 + 127] = 0x90;
    wr_u32(z8, f32_bits(2.0f));
    z8[4 + 0] = z8[4 + 254] = 1;
    wr_u16(z8 + 260 + 0, 1); wr_u16(z8 + 260 + 30, 1);
    k_dot_q4_k_q8_k_ref(256, &s, x4, z8);
    CHECKF(s == -17.5f, "q4_k . q8_k = %g", s);

    // F16: (1, -2, 0.5) . (3, 0.25, -4) = 3 - 0.5 - 2 = 0.5
    uint8_t a[6], c[6];
    wr_u16(a, 0x3c00); wr_u16(a + 2, 0xc000); wr_u16(a + 4, 0x3800);
    wr_u16(c, 0x4200); wr_u16(c + 2, 0x3400); wr_u16(c + 4, 0xc400);
    k_dot_f16_f16_ref(3, &s, a, c);
    CHECKF(s == 0.5f, "f16 . f16 = %g", s);
    // F16's float lanes summed halving: 4096 * 4096 in lane 0, -4096 * 4096 in lane 1, 1 * 1 in
    // lane 8; lane 0 + lane 8 = 2^24 + 1 rounds to 2^24, which lane 1 then cancels: 0 (the sum in
    // index order would be 1)
    uint8_t a9[18] = {0}, c9[18] = {0};
    wr_u16(a9, 0x6c00); wr_u16(a9 + 2, 0xec00); wr_u16(a9 + 16, 0x3c00); // 4096, -4096, 0 x 6, 1
    wr_u16(c9, 0x6c00); wr_u16(c9 + 2, 0x6c00); wr_u16(c9 + 16, 0x3c00); // 4096, 4096, 0 x 6, 1
    k_dot_f16_f16_ref(9, &s, a9, c9);
    CHECKF(s == 0.0f, "f16 lanes: %g", s);
    // BF16 products are rounded to float before they are added: 2^100 * 2^100 is +inf
    wr_u16(a, 0x7180); wr_u16(a + 2, 0x3f80); // 2^100, 1
    wr_u16(c, 0x7180); wr_u16(c + 2, 0x4040); // 2^100, 3
    k_dot_bf16_bf16_ref(2, &s, a, c);
    CHECKF(s > 3.4e38f, "bf16 . bf16 = %g", s);
    wr_u16(a, 0x3f80); wr_u16(a + 2, 0x4000); wr_u16(a + 4, 0xbf80); // 1, 2, -1
    wr_u16(c, 0x4040); wr_u16(c + 2, 0x3f00); wr_u16(c + 4, 0x4080); // 3, 0.5, 4
    k_dot_bf16_bf16_ref(3, &s, a, c);
    CHECKF(s == 0.0f, "bf16 . bf16 = %g", s);
}

// Quantizers worked out by hand: ggml's rounding rules.
static void test_quant_by_hand(void) {
    float x[QK_K] = {0};
    uint8_t q[K_Q8_K_SIZE];
    // Q8_0: amax 127 -> d = 1, q = roundf(x): ties away from zero.
    x[0] = 127; x[1] = 2.5f; x[2] = -2.5f; x[3] = 0.49f; x[4] = -126.5f;
    k_quant_q8_0_ref(x, q, 32);
    CHECK(ld_u16(q) == 0x3c00);
    CHECK((int8_t)q[2] == 127 && (int8_t)q[3] == 3 && (int8_t)q[4] == -3 && (int8_t)q[5] == 0 &&
          (int8_t)q[6] == -127);
    // Q8_1: same quants, s = fp16(d * sum) = 127 + 3 - 3 + 0 - 127 = 0.
    uint8_t q1[K_Q8_1_SIZE];
    k_quant_q8_1_ref(x, q1, 32);
    CHECK(ld_u16(q1) == 0x3c00 && ld_u16(q1 + 2) == 0 && (int8_t)q1[4 + 1] == 3);
    // Q8_K: max = 127 (positive) -> iscale = -1, d = -1; ties to even: 2.5 -> -2, -2.5 -> 2.
    memset(x, 0, sizeof x);
    x[0] = 127; x[1] = 2.5f; x[2] = -2.5f; x[3] = 3.5f; x[16] = -1;
    k_quant_q8_k_ref(x, q, QK_K);
    CHECK(k_ld_f32(q) == -1.0f);
    CHECK((int8_t)q[4] == -127 && (int8_t)q[5] == -2 && (int8_t)q[6] == 2 && (int8_t)q[7] == -4);
    CHECK(k_ld_i16(q + 260) == -127 - 2 + 2 - 4 && k_ld_i16(q + 262) == 1);
    // Q8_K with a negative extreme: max = -254 -> iscale = 0.5, d = 2.
    x[0] = -254;
    k_quant_q8_k_ref(x, q, QK_K);
    CHECK(k_ld_f32(q) == 2.0f && (int8_t)q[4] == -127 && (int8_t)q[5] == 1 /* 1.25 */);
    // Q4_0: max = -8 -> d = 1; x = -8 -> trunc(-8 + 8.5) = 0; x = 7.9 -> 15; x = 8 (the opposite
    // extreme would be 16) clamps to 15.
    memset(x, 0, sizeof x);
    x[0] = -8; x[1] = 7.9f; x[17] = 0.49f; x[18] = -0.51f;
    uint8_t b4[K_Q4_0_SIZE];
    k_quant_q4_0_ref(x, b4, 32);
    CHECK(ld_u16(b4) == 0x3c00);
    CHECK((b4[2] & 15) == 0 && (b4[3] & 15) == 15 && (b4[3] >> 4) == 8 && (b4[4] >> 4) == 7);
}

// ---- 2. vec_dot consistency --------------------------------------------------------------

// The expected dot of a weight row and an already-quantized activation row: the dot of the
// dequantized rows, in double, plus for Q8_1 the part of the minimum term that uses the stored
// s instead of d * sum(q).
static double kt_deq_dot(uint32_t wt, const uint8_t *x, const uint8_t *yq, int64_t n, double *mag) {
    const k_traits *tx = k_traits_ref(wt), *ty = k_traits_ref(tx->vec_dot_type);
    float *fx = malloc(sizeof(float) * (size_t)n), *fy = malloc(sizeof(float) * (size_t)n);
    PSV_ASSERT(fx && fy);
    tx->to_float(x, fx, n);
    ty->to_float(yq, fy, n);
    double dot = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        dot += (double)fx[i] * fy[i];
        m += kt_t_fabs((double)fx[i] * fy[i]);
    }
    if (tx->vec_dot_type == T_Q8_1) {
        size_t xs = type_get(wt)->type_size;
        for (int64_t b = 0; b < n / 32; b++) {
            const uint8_t *xb = x + (size_t)b * xs, *yb = yq + (size_t)b * K_Q8_1_SIZE;
            double mx = k_ld_f16(xb + 2), sy = k_ld_f16(yb + 2), dy = k_ld_f16(yb);
            int sum = 0;
            for (int j = 0; j < 32; j++) sum += (int8_t)yb[4 + j];
            dot += mx * (sy - dy * sum);
            m += kt_t_fabs(mx * sy);
        }
    }
    free(fx);
    free(fy);
    *mag = m;
    return dot;
}

// Bound on |x . y - x . dequant(quant(y))| for activation type at, per value (see the
// quantizers' comments), summed with weights |x_i|; mx_extra adds Q8_1's minimum term.
static double kt_act_quant_bound(uint32_t at, const float *fx, const float *y, const uint8_t *xq,
                              uint32_t wt, int64_t n) {
    double bound = 0;
    int blk = at == T_Q8_K ? QK_K : 32;
    for (int64_t b = 0; b < n / blk && (at == T_Q8_0 || at == T_Q8_1 || at == T_Q8_K); b++) {
        float amax = 0;
        for (int j = 0; j < blk; j++) amax = PSV_MAX(amax, psv_fabsf(y[b * blk + j]));
        double d = amax / 127.0f;
        double e = at == T_Q8_K ? 0.5 * d * (1 + 1e-5) : 0.5 * d * (1 + 1e-5) + 127 * kt_t_fabs(d - psv_fp16_to_f32(psv_f32_to_fp16((float)d)));
        double mx = 0;
        if (at == T_Q8_1) mx = kt_t_fabs(k_ld_f16(xq + (size_t)b * type_get(wt)->type_size + 2));
        for (int j = 0; j < blk; j++) bound += (kt_t_fabs(fx[b * blk + j]) + mx) * e;
        if (at == T_Q8_1) {
            double s = kt_t_fabs((double)d * 32 * 127);
            bound += mx * (s * 0x1p-11 + 16.01 * d);
        }
    }
    if (at == T_F16 || at == T_BF16)
        for (int64_t i = 0; i < n; i++) bound += kt_t_fabs(fx[i] * y[i]) * (at == T_F16 ? 0x1p-11 : 0x1p-8);
    return bound;
}

static void test_vec_dot_random(void) {
    static const int64_t sizes[] = {256, 512, 4096};
    for (size_t t = 0; t < PSV_ARRAY_LEN(kt_weight_types); t++) {
        uint32_t wt = kt_weight_types[t];
        const k_traits *tx = k_traits_ref(wt), *ty = k_traits_ref(tx->vec_dot_type);
        for (size_t si = 0; si < PSV_ARRAY_LEN(sizes); si++) {
            int64_t n = sizes[si];
            uint8_t *x = malloc(kt_row_bytes(wt, n)), *yq = malloc(kt_row_bytes(tx->vec_dot_type, n));
            float *y = malloc(sizeof(float) * (size_t)n), *fx = malloc(sizeof(float) * (size_t)n);
            PSV_ASSERT(x && yq && y && fx);
            double worst_consistent = 0, worst_rel = 0;
            for (int rep = 0; rep < 8; rep++) {
                kt_random_row(wt, n, x);
                // activations: mostly [-1,1), a few outliers, some blocks at a smaller scale
                for (int64_t i = 0; i < n; i++) y[i] = kt_rng_sym() * ((i / 32) % 3 == 1 ? 0.01f : 1.0f);
                y[kt_rng_next() % (uint64_t)n] = 8.0f;
                ty->from_float(y, yq, n);
                float s = 0;
                tx->vec_dot(n, &s, x, yq);
                // (a) equals the dot of the dequantized operands
                double mag, e = kt_deq_dot(wt, x, yq, n, &mag);
                double err = kt_t_fabs(s - e), tol = 1e-5 * mag + 1e-30;
                CHECKF(err <= tol, "%s n=%lld: vec_dot %.9g vs dequantized %.9g (tol %.3g)",
                       type_table[wt].name, (long long)n, s, e, tol);
                if (mag > 0 && err / mag > worst_consistent) worst_consistent = err / mag;
                // (b) close to the float dot with the weights dequantized
                tx->to_float(x, fx, n);
                double ref = 0, refmag = 0;
                for (int64_t i = 0; i < n; i++) {
                    ref += (double)fx[i] * y[i];
                    refmag += kt_t_fabs((double)fx[i] * y[i]);
                }
                double bound = kt_act_quant_bound(tx->vec_dot_type, fx, y, x, wt, n) + 1e-5 * refmag;
                CHECKF(kt_t_fabs(s - ref) <= bound, "%s n=%lld: vec_dot %.9g vs float dot %.9g (bound %.3g)",
                       type_table[wt].name, (long long)n, s, ref, bound);
                if (refmag > 0 && kt_t_fabs(s - ref) / refmag > worst_rel) worst_rel = kt_t_fabs(s - ref) / refmag;
            }
            // the bound in relative terms: activation quantization costs < 1% of sum |x y|
            double rel_tol = tx->vec_dot_type == T_F32 ? 1e-6 : tx->vec_dot_type == T_F16 ? 1e-3 : 1e-2;
            CHECKF(worst_rel <= rel_tol, "%s n=%lld: relative error %.3g", type_table[wt].name,
                   (long long)n, worst_rel);
            if (getenv("PSV_TEST_VERBOSE"))
                printf("%-5s n=%-5lld consistency %.2e  vs float %.2e\n", type_table[wt].name,
                       (long long)n, worst_consistent, worst_rel);
            free(x); free(yq); free(y); free(fx);
        }
    }
}

// ---- 3. round trips ------------------------------------------------------------------------

// Largest |x - dequant(quant(x))| over a row divided by the bound the quantizer states for that
// block; must be <= 1.
static double kt_roundtrip_ratio(uint32_t type, const float *x, int64_t n) {
    const k_traits *t = k_traits_ref(type);
    const type_info *ti = type_get(type);
    uint8_t *q = malloc(kt_row_bytes(type, n));
    float *y = malloc(sizeof(float) * (size_t)n);
    PSV_ASSERT(q && y);
    t->from_float(x, q, n);
    t->to_float(q, y, n);
    double worst = 0;
    int blk = (int)ti->blck_size;
    for (int64_t b = 0; b < n / blk; b++) {
        const float *xb = x + b * blk;
        float amax = 0, min = xb[0], max = xb[0];
        for (int j = 0; j < blk; j++) {
            amax = PSV_MAX(amax, psv_fabsf(xb[j]));
            min = PSV_MIN(min, xb[j]);
            max = PSV_MAX(max, xb[j]);
        }
        double d127 = amax / 127.0f, bound;
        switch (type) {
        case T_Q8_0: case T_Q8_1:
            bound = 0.5 * d127 * (1 + 1e-6) + 127 * kt_t_fabs(d127 - psv_fp16_to_f32(psv_f32_to_fp16((float)d127)));
            break;
        case T_Q8_K: bound = 0.5 * d127 * (1 + 1e-5); break;
        case T_Q4_0: bound = amax / 8.0 + amax * 0x1p-10; break;
        case T_Q5_0: bound = amax / 16.0 + amax * 0x1p-10; break;
        case T_Q4_1: bound = 0.5 * (max - min) / 15 + ((max - min) + psv_fabsf(min)) * 0x1p-10; break;
        case T_Q5_1: bound = 0.5 * (max - min) / 31 + ((max - min) + psv_fabsf(min)) * 0x1p-10; break;
        // k-quants: the bounds derived above each quantizer, plus fp16's absolute error in the
        // super-block scales (2^-25 when subnormal) times the largest quant * sub-block scale
        case T_Q2_K: bound = 0.444 * amax + 60 * 0x1p-25; break;
        case T_Q3_K: bound = 0.274 * amax + 128 * 0x1p-25; break;
        case T_Q4_K: bound = 0.091 * amax + 16 * 63 * 0x1p-25; break;
        case T_Q5_K: bound = 0.056 * amax + 32 * 63 * 0x1p-25; break;
        case T_Q6_K: bound = 0.0393 * amax + 4096 * 0x1p-25; break;
        default: bound = 0; break; // per value below
        }
        for (int j = 0; j < blk; j++) {
            double err = kt_t_fabs((double)xb[j] - y[b * blk + j]), bj = bound;
            if (type == T_F16) bj = kt_t_fabs(xb[j]) >= 0x1p-14 ? kt_t_fabs(xb[j]) * 0x1p-11 : 0x1p-25;
            if (type == T_BF16) bj = kt_t_fabs(xb[j]) * 0x1p-8;
            if (type == T_F32) bj = 0;
            double r = err == 0 ? 0 : bj > 0 ? err / bj : 1e30;
            if (!(r <= worst)) worst = r; // NaN counts as worst
        }
    }
    free(q);
    free(y);
    return worst;
}

static void test_roundtrip(void) {
    static const uint32_t types[] = {T_F32, T_F16, T_BF16, T_Q8_0, T_Q8_1, T_Q8_K, T_Q4_0, T_Q4_1,
                                     T_Q5_0, T_Q5_1, T_Q2_K, T_Q3_K, T_Q4_K, T_Q5_K, T_Q6_K};
    const int64_t n = 4096;
    float *x = malloc(sizeof(float) * n);
    PSV_ASSERT(x);
    for (size_t t = 0; t < PSV_ARRAY_LEN(types); t++) {
        double worst = 0;
        for (int dist = 0; dist < 5; dist++) {
            for (int64_t i = 0; i < n; i++) {
                float u = kt_rng_sym();
                switch (dist) {
                case 0: x[i] = u; break;                                          // uniform
                case 1: x[i] = (kt_rng_sym() + kt_rng_sym() + kt_rng_sym()) * 0.02f; break; // bell-shaped, small
                case 2: x[i] = u * ((i % 97) == 0 ? 30.0f : 1.0f); break;          // outliers
                case 3: x[i] = 0.5f + 0.1f * u; break;                             // all positive
                default: x[i] = u * (float)(1 << (i / 256 % 8)) * 1e-3f; break;    // block scales vary
                }
            }
            double r = kt_roundtrip_ratio(types[t], x, n);
            if (!(r <= worst)) worst = r;
        }
        CHECKF(worst <= 1.0, "%s: round-trip error %.3g of its bound", type_table[types[t]].name, worst);
        if (getenv("PSV_TEST_VERBOSE")) printf("%-5s round trip: worst error / bound %.3f\n", type_table[types[t]].name, worst);
    }
    free(x);
}

// The Q4_0..Q8_0 quantizers follow ggml's reference quantizers exactly, so quantizing the
// dequantized values of a block they produced reproduces it bit for bit (a fixed point).
static void test_quant_fixed_point(void) {
    // (Not Q8_K: its d = 1/iscale is recomputed from a rounded product and may move by an ulp.)
    static const uint32_t types[] = {T_Q4_0, T_Q5_0, T_Q8_0, T_F16, T_BF16, T_F32};
    const int64_t n = 512;
    float x[512], y[512];
    uint8_t a[2048], b[2048];
    for (size_t t = 0; t < PSV_ARRAY_LEN(types); t++) {
        const k_traits *tr = k_traits_ref(types[t]);
        for (int64_t i = 0; i < n; i++) x[i] = kt_rng_sym();
        size_t sz = kt_row_bytes(types[t], n);
        PSV_ASSERT(sz <= sizeof a);
        tr->from_float(x, a, n);
        tr->to_float(a, y, n);
        tr->from_float(y, b, n);
        CHECKF(memcmp(a, b, sz) == 0, "%s: quantize(dequantize(q)) != q", type_table[types[t]].name);
    }
}

// ---- edge cases ----------------------------------------------------------------------------

static void test_edges(void) {
    static const uint32_t types[] = {T_F32, T_F16, T_BF16, T_Q8_0, T_Q8_1, T_Q8_K, T_Q4_0, T_Q4_1,
                                     T_Q5_0, T_Q5_1, T_Q2_K, T_Q3_K, T_Q4_K, T_Q5_K, T_Q6_K};
    float x[512], y[512];
    uint8_t q[2048], act[2048];
    for (size_t t = 0; t < PSV_ARRAY_LEN(types); t++) {
        uint32_t ty = types[t];
        const k_traits *tr = k_traits_ref(ty);
        const char *name = type_get(ty)->name;
        size_t sz = kt_row_bytes(ty, 512);
        // all zero and all -0: dequantize to zeros, no NaN from a zero scale
        for (int sign = 0; sign < 2; sign++) {
            for (int i = 0; i < 512; i++) x[i] = sign ? -0.0f : 0.0f;
            memset(q, 0xa5, sizeof q);
            tr->from_float(x, q, 512);
            tr->to_float(q, y, 512);
            bool ok = true;
            for (int i = 0; i < 512; i++) ok = ok && y[i] == 0;
            CHECKF(ok, "%s: %szero block does not round-trip to zeros", name, sign ? "negative " : "");
            if (tr->vec_dot) {
                const k_traits *ta = k_traits_ref(tr->vec_dot_type);
                for (int i = 0; i < 512; i++) y[i] = kt_rng_sym();
                ta->from_float(y, act, 512);
                float s = -1;
                tr->vec_dot(512, &s, q, act);
                CHECKF(s == 0, "%s: zero row . y = %g", name, s);
                ta->from_float(x, act, 512); // zero activations too
                kt_random_row(ty, 512, q);
                tr->vec_dot(512, &s, q, act);
                CHECKF(s == 0, "%s: x . zero activations = %g", name, s);
            }
        }
        // a single nonzero value in a zero block
        memset(x, 0, sizeof x);
        x[37] = -3.0f;
        CHECKF(kt_roundtrip_ratio(ty, x, 512) <= 1.0, "%s: one nonzero value", name);
        // large but representable magnitudes: F16 and every fp16 scale or minimum (Q4_1's m is
        // the block minimum itself) cap values near 65504; Q8_K's scale is a float
        double big = ty == T_Q8_K || ty == T_F32 || ty == T_BF16 ? 1e30 : 6.0e4;
        for (int i = 0; i < 512; i++) x[i] = (float)(big * kt_rng_sym());
        CHECKF(kt_roundtrip_ratio(ty, x, 512) <= 1.0, "%s: values near %g", name, big);
        tr->from_float(x, q, 512);
        tr->to_float(q, y, 512);
        CHECKF(kt_all_finite(y, 512), "%s: values near %g decode to non-finite", name, big);
        // tiny values (below fp16's normal range for the scales) stay finite
        for (int i = 0; i < 512; i++) x[i] = 1e-7f * kt_rng_sym();
        tr->from_float(x, q, 512);
        tr->to_float(q, y, 512);
        CHECKF(kt_all_finite(y, 512), "%s: tiny values decode to non-finite", name);
        // non-finite input must not be undefined behaviour (UBSan watches the conversions);
        // the block content is unspecified
        for (int i = 0; i < 512; i++) x[i] = kt_rng_sym();
        x[3] = f32_from_bits(0x7fc00000u);
        x[300] = f32_from_bits(0x7f800000u);
        x[301] = -f32_from_bits(0x7f800000u);
        tr->from_float(x, q, 512);
        tr->to_float(q, y, 512);
        (void)sz;
    }
    // F16: IEEE behaviour at the edges
    uint8_t h[2];
    float v = 65519.0f;
    k_quant_f16_ref(&v, h, 1);
    CHECK(ld_u16(h) == 0x7bff);
    v = 65520.0f;
    k_quant_f16_ref(&v, h, 1);
    CHECK(ld_u16(h) == 0x7c00);
    v = -0.0f;
    k_quant_f16_ref(&v, h, 1);
    CHECK(ld_u16(h) == 0x8000);
    k_quant_bf16_ref(&v, h, 1);
    CHECK(ld_u16(h) == 0x8000);
    v = 1.00390625f; // 1 + 2^-8: a tie, rounds to even (1.0)
    k_quant_bf16_ref(&v, h, 1);
    CHECK(ld_u16(h) == 0x3f80);
    // the saturating conversions
    CHECK(k_round_away(f32_from_bits(0x7fc00000u), -128, 127) == 0);
    CHECK(k_round_away(1e30f, -128, 127) == 127 && k_round_away(-1e30f, -128, 127) == -128);
    CHECK(k_round_away(-0.5f, -128, 127) == -1 && k_round_away(0.4999999f, -128, 127) == 0);
    CHECK(k_round_even(0.5f, -8, 8) == 0 && k_round_even(1.5f, -8, 8) == 2 && k_round_even(-2.5f, -8, 8) == -2);
    CHECK(k_round_even(-3.5f, -8, 8) == -4 && k_round_even(2.5000002f, -8, 8) == 3);
    CHECK(k_trunc(16.5f, 0, 15) == 15 && k_trunc(0.99f, 0, 15) == 0 && k_trunc(f32_from_bits(0x7fc00000u), 0, 15) == 0);
}

// ---- 4. the shared reference models --------------------------------------------------------

static void kt_check_model(const char *path) {
    gguf_file *f = NULL;
    psv_error err = {0};
    if (gguf_open(path, &f, &err) != PSV_OK) {
        CHECKF(false, "%s: %s", path, err.message);
        return;
    }
    int n_checked = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        const k_traits *tr = k_traits_ref(t->type);
        CHECKF(tr != NULL, "%s: %.*s has type %u without kernels", path, (int)t->name.n, t->name.p, t->type);
        if (!tr) continue;
        int64_t ne0 = (int64_t)t->ne[0];
        uint64_t rows = t->ne[1] * t->ne[2] * t->ne[3], rs = 0;
        CHECK(type_row_size(t->type, (uint64_t)ne0, &rs) && rs * rows == t->size);
        float *y = malloc(sizeof(float) * (size_t)ne0);
        PSV_ASSERT(y);
        float amax = 0;
        bool finite = true;
        double sum = 0, sum2 = 0;
        for (uint64_t r = 0; r < rows; r++) {
            tr->to_float(t->data + r * rs, y, ne0);
            for (int64_t j = 0; j < ne0; j++) {
                finite = finite && psv_isfinite(y[j]);
                amax = PSV_MAX(amax, psv_fabsf(y[j]));
                sum += y[j];
                sum2 += (double)y[j] * y[j];
            }
        }
        CHECKF(finite && amax < 1e4f, "%s: %.*s (%s): finite %d, max |x| %g", path, (int)t->name.n,
               t->name.p, type_table[t->type].name, finite, amax);
        // The random weight matrices are centred (the F32 ones are norms and biases): a decoder
        // that gets an offset or a minimum wrong (Q3_K's high bit, Q6_K's -32, the k-quants'
        // dmin) shifts the mean by a good fraction of the RMS.
        if (t->type != T_F32) {
            double cnt = (double)ne0 * (double)rows, mean = sum / cnt, rms = psv_sqrt(sum2 / cnt);
            CHECKF(rms > 0 && kt_t_fabs(mean) < 0.05 * rms, "%s: %.*s (%s): mean %g, rms %g", path,
                   (int)t->name.n, t->name.p, type_table[t->type].name, mean, rms);
        }
        // Blocks ggml's reference quantizer made are fixed points of ours: requantizing their
        // dequantized values must give the file's bytes back.
        if (t->type == T_Q4_0 || t->type == T_Q5_0 || t->type == T_Q8_0) {
            uint8_t *rq = malloc((size_t)rs);
            PSV_ASSERT(rq);
            uint64_t bad_rows = 0;
            for (uint64_t r = 0; r < rows; r++) {
                tr->to_float(t->data + r * rs, y, ne0);
                tr->from_float(y, rq, ne0);
                bad_rows += memcmp(rq, t->data + r * rs, (size_t)rs) != 0;
            }
            CHECKF(bad_rows == 0, "%s: %.*s (%s): %llu of %llu rows not reproduced by requantizing",
                   path, (int)t->name.n, t->name.p, type_table[t->type].name,
                   (unsigned long long)bad_rows, (unsigned long long)rows);
            free(rq);
        }
        // vec_dot on real rows agrees with the dequantized dot (first rows only: it is slow)
        if (tr->vec_dot) {
            const k_traits *ta = k_traits_ref(tr->vec_dot_type);
            float *a = malloc(sizeof(float) * (size_t)ne0);
            uint8_t *aq = malloc(kt_row_bytes(tr->vec_dot_type, ne0));
            PSV_ASSERT(a && aq);
            for (int64_t j = 0; j < ne0; j++) a[j] = kt_rng_sym();
            ta->from_float(a, aq, ne0);
            for (uint64_t r = 0; r < rows && r < 4; r++) {
                float s;
                tr->vec_dot(ne0, &s, t->data + r * rs, aq);
                double mag, e = kt_deq_dot(t->type, t->data + r * rs, aq, ne0, &mag);
                CHECKF(kt_t_fabs(s - e) <= 1e-5 * mag + 1e-30, "%s: %.*s row %llu: %g vs %g", path,
                       (int)t->name.n, t->name.p, (unsigned long long)r, s, e);
            }
            free(a);
            free(aq);
        }
        free(y);
        n_checked++;
    }
    CHECKF(n_checked > 0, "%s: no tensors", path);
    if (getenv("PSV_TEST_VERBOSE")) printf("%s: %d tensors decoded\n", path, n_checked);
    gguf_close(f);
}

// Dequantize a whole tensor to floats (malloc'd), or NULL when absent.
static float *kt_tensor_floats(const gguf_file *f, const char *name, uint64_t *n_out, uint32_t *type) {
    const gguf_tensor *t = gguf_find_tensor(f, name);
    if (!t || !k_traits_ref(t->type)) return NULL;
    uint64_t rows = t->ne[1] * t->ne[2] * t->ne[3], rs = 0, n = t->ne[0] * rows;
    PSV_ASSERT(type_row_size(t->type, t->ne[0], &rs));
    float *y = malloc(sizeof(float) * (size_t)n);
    PSV_ASSERT(y);
    for (uint64_t r = 0; r < rows; r++) k_traits_ref(t->type)->to_float(t->data + r * rs, y + r * t->ne[0], (int64_t)t->ne[0]);
    *n_out = n;
    *type = t->type;
    return y;
}

// llama-spm-q40.gguf and llama-spm-q4km.gguf quantize the same weights (reference/README.md):
// decoding a tensor from both must agree within the two formats' quantization error, which ties
// Q4_0, Q4_1 and Q8_0 to Q4_K and Q6_K. A wrong layout decodes to uncorrelated values (relative
// difference ~1.4); these differ by the quantization noise, ~0.1.
static void test_same_weights(void) {
    char pa[4096], pb[4096];
    const char *p = t_shared_path("reference/models/llama-spm-q40.gguf");
    if (!p) {
        SKIP("kernels: ../shared absent, same-weights cross-check not run");
        return;
    }
    snprintf(pa, sizeof pa, "%s", p);
    snprintf(pb, sizeof pb, "%s", t_shared_path("reference/models/llama-spm-q4km.gguf"));
    gguf_file *a = NULL, *b = NULL;
    psv_error err = {0};
    if (gguf_open(pa, &a, &err) != PSV_OK || gguf_open(pb, &b, &err) != PSV_OK) {
        CHECKF(false, "%s", err.message);
        gguf_close(a);
        return;
    }
    int n_pairs = 0;
    bool seen[T_COUNT] = {false};
    for (uint64_t i = 0; i < a->n_tensors; i++) {
        char name[256];
        const gguf_tensor *t = &a->tensors[i];
        if (t->name.n >= sizeof name) continue;
        memcpy(name, t->name.p, t->name.n);
        name[t->name.n] = 0;
        uint64_t na = 0, nb = 0;
        uint32_t ta, tb;
        float *fa = kt_tensor_floats(a, name, &na, &ta), *fb = kt_tensor_floats(b, name, &nb, &tb);
        if (fa && fb && na == nb && ta != tb) {
            double diff = 0, norm = 0;
            for (uint64_t j = 0; j < na; j++) {
                diff += ((double)fa[j] - fb[j]) * ((double)fa[j] - fb[j]);
                norm += (double)fa[j] * fa[j];
            }
            double rel = norm > 0 ? psv_sqrt(diff / norm) : 0;
            CHECKF(norm > 0 && rel < 0.25, "%s: %s vs %s differ by %.3f (relative RMS)", name,
                   type_table[ta].name, type_table[tb].name, rel);
            if (getenv("PSV_TEST_VERBOSE"))
                printf("same weights %-28s %-4s vs %-4s relative RMS difference %.4f\n", name,
                       type_table[ta].name, type_table[tb].name, rel);
            seen[ta] = seen[tb] = true;
            n_pairs++;
        }
        free(fa);
        free(fb);
    }
    CHECK(n_pairs > 0);
    CHECK(seen[T_Q4_0] && seen[T_Q4_K] && seen[T_Q6_K]);
    gguf_close(a);
    gguf_close(b);
}

static void test_shared_models(void) {
    const char *dir = t_shared_path("reference/models");
    if (!dir) {
        SKIP("kernels: ../shared absent, reference models not decoded");
        return;
    }
    char dpath[4096];
    snprintf(dpath, sizeof dpath, "%s", dir);
    DIR *d = opendir(dpath);
    if (!d) {
        SKIP("kernels: %s unreadable", dpath);
        return;
    }
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 5, ".gguf") != 0) continue;
        char path[4096 + 256];
        snprintf(path, sizeof path, "%s/%s", dpath, e->d_name);
        kt_check_model(path);
        n++;
    }
    closedir(d);
    CHECKF(n > 0, "no .gguf files in %s", dpath);
}

int main(void) {
    test_traits();
    test_q4_0_block();
    test_q4_1_block();
    test_q5_0_block();
    test_q5_1_block();
    test_q8_blocks();
    test_q2_k_block();
    test_q3_k_block();
    test_q4_k_block();
    test_q5_k_block();
    test_q6_k_block();
    test_float_blocks();
    test_dot_by_hand();
    test_quant_by_hand();
    test_vec_dot_random();
    test_roundtrip();
    test_quant_fixed_point();
    test_edges();
    test_shared_models();
    test_same_weights();
    return t_finish();
}

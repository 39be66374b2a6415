// tests/test_simd.c — the SIMD kernels (section 12) against the reference kernels (section 11).
//
// Every kernel of every set this CPU supports must be bit-identical to the reference (memcmp of
// the float result; two NaNs count as equal whatever their payload): dot products on random and
// adversarial blocks (extreme, subnormal, zero and non-finite scales, all-zero blocks, quants at
// their extremes including -128 activations, inconsistent Q8_K bsums) for many lengths, the
// multi-row variants for every row count, and the activation quantizers on random, tie-breaking
// and non-finite inputs. Also the kernel-set choice (PSV_KERNELS) on simulated CPUs. Sets the
// CPU lacks are skipped with the reason. PSV_TEST_SETS (names, comma-separated) checks only those
// sets (tests/cli_armcpus.sh: the one set an emulated CPU chooses); the others are skipped.
#define PSV_TESTING
#define PSV_NO_MAIN
#include "pensieve.c"
#include "test.h"

static uint64_t st_rng_state = 0x243f6a8885a308d3ull;
static uint64_t st_rng(void) { // splitmix64
    uint64_t z = (st_rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float st_unit(void) { return (float)((st_rng() >> 40) * (1.0 / 16777216.0)); } // [0,1)
static float st_sym(void) { return 2.0f * st_unit() - 1.0f; }

static size_t st_row_bytes(uint32_t type, int64_t n) {
    uint64_t sz = 0;
    PSV_ASSERT(type_row_size(type, (uint64_t)n, &sz));
    return (size_t)sz;
}

// Equal floats bit for bit, or both NaN.
static bool st_same(float a, float b) { return f32_bits(a) == f32_bits(b) || (psv_isnan(a) && psv_isnan(b)); }

// ---- random rows ----------------------------------------------------------------------------

// An fp16 scale: mostly ordinary, sometimes extreme (largest, subnormal, zero, negative zero).
// `wild` adds infinities and NaN.
static uint16_t st_scale16(bool wild) {
    uint64_t r = st_rng() % 64;
    if (r == 0) return 0x7bff;             // 65504
    if (r == 1) return 0xfbff;             // -65504
    if (r == 2) return 0x0001;             // smallest subnormal
    if (r == 3) return (uint16_t)(0x8000 | (st_rng() & 0x3ff)); // negative subnormal
    if (r == 4) return 0;
    if (r == 5) return 0x8000;
    if (wild && r == 6) return 0x7c00;     // +inf
    if (wild && r == 7) return 0x7e01;     // NaN
    float v = (0.001f + 2.0f * st_unit()) * (st_rng() & 1 ? -1.0f : 1.0f);
    return psv_f32_to_fp16(v);
}

// Fill a block's quant bytes: random, all 0x00, all 0xff, or alternating extremes.
static void st_fill_bytes(uint8_t *p, size_t n) {
    uint64_t mode = st_rng() % 8;
    for (size_t i = 0; i < n; i++) {
        uint8_t v = (uint8_t)st_rng();
        if (mode == 0) v = 0;
        else if (mode == 1) v = 0xff;
        else if (mode == 2) v = (i & 1) ? 0x80 : 0x7f;
        else if (mode == 3) v = 0x80; // int8 -128 everywhere
        p[i] = v;
    }
}

// A random row of any type with valid-but-adversarial content.
static void st_random_row(uint32_t type, int64_t n, uint8_t *row, bool wild) {
    const type_info *ti = type_get(type);
    size_t size = st_row_bytes(type, n);
    if (type == T_F32 || type == T_F16 || type == T_BF16) {
        for (int64_t i = 0; i < n; i++) {
            uint64_t r = st_rng() % 32;
            float v = st_sym() * (r < 2 ? 60000.0f : r < 4 ? 1e-6f : 1.0f);
            if (r == 4) v = 0;
            if (wild && r == 5) v = f32_from_bits(0x7f800000u);
            if (type == T_F32) wr_u32(row + 4 * i, r == 6 ? (uint32_t)st_rng() : f32_bits(v));
            else if (type == T_F16) wr_u16(row + 2 * i, r == 6 && wild ? (uint16_t)st_rng() : psv_f32_to_fp16(v));
            else wr_u16(row + 2 * i, r == 6 && wild ? (uint16_t)st_rng() : psv_f32_to_bf16(v * (r == 7 ? 1e30f : 1.0f)));
        }
        return;
    }
    for (size_t b = 0; b < size / ti->type_size; b++) {
        uint8_t *blk = row + b * ti->type_size;
        st_fill_bytes(blk, ti->type_size);
        bool zero = st_rng() % 16 == 0;
        if (zero) memset(blk, 0, ti->type_size);
        switch (type) {
        case T_Q4_0: case T_Q5_0: case T_Q8_0: wr_u16(blk, st_scale16(wild)); break;
        case T_Q4_1: case T_Q5_1: case T_Q8_1: case T_Q4_K: case T_Q5_K:
            wr_u16(blk, st_scale16(wild));
            wr_u16(blk + 2, st_scale16(wild));
            break;
        case T_Q2_K: wr_u16(blk + 80, st_scale16(wild)); wr_u16(blk + 82, st_scale16(wild)); break;
        case T_Q3_K: wr_u16(blk + 108, st_scale16(wild)); break;
        case T_Q6_K: wr_u16(blk + 208, st_scale16(wild)); break;
        case T_Q8_K: {
            uint64_t r = st_rng() % 16;
            float d = r == 0 ? 3e38f : r == 1 ? 1e-40f : r == 2 ? -0.0f : st_sym() * 0.01f;
            if (wild && r == 3) d = f32_from_bits(0x7fc00001u);
            wr_u32(blk, f32_bits(d));
            // bsums are data to the kernels (the reference trusts them): random, not consistent
            if (r > 8)
                for (int k = 0; k < 16; k++) wr_u16(blk + 260 + 2 * k, (uint16_t)st_rng());
            break;
        }
        default: break;
        }
    }
}

// Offsets of a weight block's fp16 scale fields.
static int st_scale_offsets(uint32_t type, int off[2]) {
    switch (type) {
    case T_Q4_0: case T_Q5_0: case T_Q8_0: off[0] = 0; return 1;
    case T_Q4_1: case T_Q5_1: case T_Q4_K: case T_Q5_K: off[0] = 0; off[1] = 2; return 2;
    case T_Q2_K: off[0] = 80; off[1] = 82; return 2;
    case T_Q3_K: off[0] = 108; return 1;
    case T_Q6_K: off[0] = 208; return 1;
    default: return 0;
    }
}

// Rewrites a random pair of rows so the result exposes the order of the floating-point
// additions: most terms are tiny, and some come in pairs of huge terms that cancel exactly
// (block b + 1 repeats weight block b against the negated activation block b). Added in another
// order, the tiny terms are absorbed by a huge one or not, which shows in the float result.
static void st_cancel_rows(uint32_t wt, uint32_t at, int64_t n, uint8_t *x, uint8_t *y, int nrow, size_t ys) {
    const bool flt = wt == T_F32 || wt == T_F16 || wt == T_BF16;
    const int64_t nb = flt ? n : n / type_get(wt)->blck_size;
    uint8_t *role = calloc((size_t)nb, 1); // 0 tiny, 1 first of a pair, 2 its partner
    PSV_ASSERT(role);
    int64_t step = flt && (st_rng() & 1) ? K_LANES : 1;
    for (int64_t i = 0; i + step < nb; i++)
        if (!role[i] && !role[i + step] && st_rng() % 4 == 0) role[i] = 1, role[i + step] = 2;
    if (flt) {
        const float big = wt == T_F16 ? 60000.0f : 1e30f;
        for (int64_t i = 0; i < n; i++) {
            if (role[i] == 2) continue;
            float xv = role[i] ? (st_rng() & 1 ? big : -big) : st_sym() * 1e-6f;
            for (int r = 0; r <= nrow; r++) { // r == nrow: the weight row
                uint8_t *row = r == nrow ? x : y + (size_t)r * ys;
                float v = r == nrow ? xv : role[i] ? st_sym() * big : st_sym();
                for (int k = 0; k < (role[i] ? 2 : 1); k++) {
                    int64_t j = i + k * step;
                    float w = k && r == nrow ? -v : v;
                    if (wt == T_F32) wr_u32(row + 4 * j, f32_bits(w));
                    else if (wt == T_F16) wr_u16(row + 2 * j, psv_f32_to_fp16(w));
                    else wr_u16(row + 2 * j, psv_f32_to_bf16(w));
                }
            }
        }
        free(role);
        return;
    }
    const size_t xs = type_get(wt)->type_size, as = type_get(at)->type_size;
    const int qoff = at == T_Q8_0 ? 2 : 4, nq = at == T_Q8_K ? QK_K : 32;
    int off[2], ns = st_scale_offsets(wt, off);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *xb = x + (size_t)b * xs;
        if (role[b] == 1) {
            for (int k = 0; k < ns; k++) wr_u16(xb + off[k], st_rng() & 1 ? 0x7bff : 0xfbff);
            memcpy(xb + xs, xb, xs);
        }
        for (int r = 0; r < nrow; r++) {
            uint8_t *yb = y + (size_t)r * ys + (size_t)b * as;
            if (role[b] == 0) {
                if (at == T_Q8_K) wr_u32(yb, f32_bits(st_sym() * 1e-12f));
                else wr_u16(yb, 0x0400); // 2^-14
            }
            if (role[b] != 1) continue;
            if (at == T_Q8_K) wr_u32(yb, f32_bits(1e12f));
            else wr_u16(yb, 0x7bff);
            for (int j = 0; j < nq; j++)
                if (yb[qoff + j] == 0x80) yb[qoff + j] = 0x81;
            if (at == T_Q8_K)
                for (int k = 0; k < 16; k++)
                    if (ld_u16(yb + 260 + 2 * k) == 0x8000) wr_u16(yb + 260 + 2 * k, 0);
            memcpy(yb + as, yb, as);
            for (int j = 0; j < nq; j++) yb[as + qoff + j] = (uint8_t)(-(int8_t)yb[qoff + j]);
            if (at == T_Q8_1) wr_u16(yb + as + 2, (uint16_t)(ld_u16(yb + 2) ^ 0x8000));
            if (at == T_Q8_K)
                for (int k = 0; k < 16; k++) wr_u16(yb + as + 260 + 2 * k, (uint16_t)-(int16_t)ld_u16(yb + 260 + 2 * k));
        }
    }
    free(role);
}

// ---- dot products --------------------------------------------------------------------------

static const uint32_t st_weight_types[] = {T_Q4_0, T_Q4_1, T_Q5_0, T_Q5_1, T_Q8_0, T_Q2_K, T_Q3_K,
                                           T_Q4_K, T_Q5_K, T_Q6_K, T_F32, T_F16, T_BF16};

// Lengths: the listed sizes plus odd block counts (1, 3, 17 blocks) for the block size.
static int st_lengths(uint32_t type, int64_t out[16]) {
    int64_t bs = type_get(type)->blck_size;
    int k = 0;
    if (bs == 1) {
        static const int64_t f[] = {1, 3, 15, 16, 17, 31, 32, 33, 64, 255, 256, 257, 512, 4096, 4097};
        for (size_t i = 0; i < PSV_ARRAY_LEN(f); i++) out[k++] = f[i];
        return k;
    }
    static const int64_t sizes[] = {32, 64, 256, 512, 4096};
    for (size_t i = 0; i < PSV_ARRAY_LEN(sizes); i++)
        if (sizes[i] % bs == 0) out[k++] = sizes[i];
    out[k++] = bs;
    out[k++] = 3 * bs;
    out[k++] = 4 * bs; // (the ARM GEMMs' k-quant rows of at most four blocks: k_gemm_rows_short_neon)
    out[k++] = 5 * bs;
    out[k++] = 7 * bs;
    out[k++] = 17 * bs;
    return k;
}

// One set's dot kernels against the reference: single rows and every multi-row count.
static void st_check_dots(k_set set) {
    for (size_t ti = 0; ti < PSV_ARRAY_LEN(st_weight_types); ti++) {
        uint32_t wt = st_weight_types[ti];
        const k_traits *ref = k_traits_ref(wt), *sk = k_traits_of_set(set, wt);
        CHECK(sk && sk->vec_dot && sk->vec_dot_type == ref->vec_dot_type && sk->to_float == ref->to_float);
        if (!sk || !sk->vec_dot) continue;
        uint32_t at = ref->vec_dot_type;
        int64_t lens[16];
        int nl = st_lengths(wt, lens);
        int mismatches = 0, checked = 0;
        for (int li = 0; li < nl; li++) {
            int64_t n = lens[li];
            size_t xs = st_row_bytes(wt, n), ys = st_row_bytes(at, n);
            const int nrow = 9;
            uint8_t *x = malloc(xs), *y = malloc(ys * nrow);
            PSV_ASSERT(x && y);
            int reps = n >= 4096 ? 6 : 30;
            for (int rep = 0; rep < reps; rep++) {
                bool wild = rep % 5 == 4;
                st_random_row(wt, n, x, wild);
                for (int r = 0; r < nrow; r++) st_random_row(at, n, y + (size_t)r * ys, wild);
                if (rep % 3 == 1) st_cancel_rows(wt, at, n, x, y, nrow, ys);
                float want[9], got[9], rows[9 * 3];
                for (int r = 0; r < nrow; r++) {
                    ref->vec_dot(n, &want[r], x, y + (size_t)r * ys);
                    sk->vec_dot(n, &got[r], x, y + (size_t)r * ys);
                    checked++;
                    if (!st_same(want[r], got[r]) && mismatches++ < 5)
                        fprintf(stderr, "%s %s n=%lld rep %d row %d: ref %.9g (%08x) vs %.9g (%08x)\n",
                                k_set_names[set], type_get(wt)->name, (long long)n, rep, r, want[r],
                                f32_bits(want[r]), got[r], f32_bits(got[r]));
                }
                // multi-row: every count, results at a stride of 3
                if (sk->vec_dot_rows)
                    for (int nr = 1; nr <= K_ROWS_MAX; nr++) {
                        for (int i = 0; i < 9 * 3; i++) rows[i] = -1.0f;
                        sk->vec_dot_rows(n, rows, 3, x, y + ys, ys, nr);
                        for (int r = 0; r < nr; r++) {
                            checked++;
                            if (!st_same(rows[3 * r], want[r + 1]) && mismatches++ < 5)
                                fprintf(stderr, "%s %s n=%lld rows nr=%d row %d: %.9g vs ref %.9g\n", k_set_names[set],
                                        type_get(wt)->name, (long long)n, nr, r, rows[3 * r], want[r + 1]);
                        }
                        CHECK(rows[3 * nr] == -1.0f && rows[1] == -1.0f); // nothing else written
                    }
                // the helper, for any number of rows (groups of K_ROWS_MAX plus a rest)
                for (int i = 0; i < 9; i++) rows[i] = -1.0f;
                k_dot_rows(sk, n, rows, 1, x, y, ys, nrow);
                for (int r = 0; r < nrow; r++) {
                    checked++;
                    if (!st_same(rows[r], want[r]) && mismatches++ < 5)
                        fprintf(stderr, "%s %s n=%lld k_dot_rows row %d: %.9g vs ref %.9g\n", k_set_names[set],
                                type_get(wt)->name, (long long)n, r, rows[r], want[r]);
                }
            }
            free(x);
            free(y);
        }
        CHECKF(mismatches == 0, "%s %s: %d of %d dot products differ from the reference", k_set_names[set],
               type_get(wt)->name, mismatches, checked);
    }
}

// One set's GEMM kernels against the reference: panels of every width (1..K_PANEL weight rows,
// packed by k_panel_pack, regrouped, split or widened where the set wants it; the AVX2 and
// avxvnni sets' quantized types: 1..16 rows, two such panels of 8; the amx set's k-quants:
// 1..16 rows, k_panel_pack_amx (Q2_K, Q4_K, Q5_K) and _amx6 (Q3_K, Q6_K); its Q4_0, Q5_0 and Q8_0: k_panel_pack_amx0, with the
// activation rows as a group of k_act_vnni, its rows past the last zero) against every
// count of activation rows, each result compared with the reference vec_dot of its pair; nothing
// outside the panel's width may be written.
static void st_check_gemm(k_set set) {
    bool any = false;
    for (size_t ti = 0; ti < PSV_ARRAY_LEN(st_weight_types); ti++) any = any || k_traits_of_set(set, st_weight_types[ti])->gemm;
    if (!any) SKIP("kernel set %s: has no GEMM kernels", k_set_names[set]);
    for (size_t ti = 0; ti < PSV_ARRAY_LEN(st_weight_types); ti++) {
        uint32_t wt = st_weight_types[ti];
        const k_traits *ref = k_traits_ref(wt), *sk = k_traits_of_set(set, wt);
        if (!sk || !sk->gemm) continue;
        const bool flt = wt == T_F16 || wt == T_BF16; // float panels (k_panel_pack_flt)
        CHECK((k_panel_has(wt) || flt) && sk->pack);
        uint32_t at = ref->vec_dot_type;
        int64_t lens[16];
        int nl = st_lengths(wt, lens);
        int mismatches = 0, checked = 0;
        for (int li = 0; li < nl; li++) {
            int64_t n = lens[li];
            size_t xs = st_row_bytes(wt, n), ys = st_row_bytes(at, n);
            const int nrow = K_GEMM_ROWS_MAX + 1;
            const size_t pz = k_panel_bytes(sk, wt, n); // the set's layout
            const int P = sk->panel_rows; // the set's panel width
            CHECK(P == K_PANEL || (set == K_SET_AMX && P == 16) ||
                  ((set == K_SET_AVX2 || set == K_SET_AVXVNNI) && !flt && P == 2 * K_PANEL));
            // the panel of the portable packer (of Q5_1 for a set that packs Q4_1 so: k_panel_layout)
            const bool q41as51 = wt == T_Q4_1 && k_panel_layout(set, wt) == T_Q5_1;
            uint8_t *x = malloc(xs * (size_t)P), *y = malloc(ys * nrow),
                    *panel = malloc(flt ? 1 : k_panel_size(q41as51 ? T_Q5_1 : wt, n)), *x51 = malloc(q41as51 ? st_row_bytes(T_Q5_1, n) * (size_t)P : 1),
                    *want = malloc(pz), *panel2 = malloc(pz);
            const size_t ss = k_act_side_stride(sk, n, true);
            uint8_t *sides = malloc(ss * nrow), *grp = malloc(k_act_vnni_size(n));
            PSV_ASSERT(x && y && panel && x51 && want && panel2 && sides && grp);
            int reps = n >= 4096 ? 4 : 12;
            for (int rep = 0; rep < reps; rep++) {
                bool wild = rep % 5 == 4;
                int nw = 1 + rep % P;
                if (rep == reps - 1) nw = P;
                for (int i = 0; i < nw; i++) st_random_row(wt, n, x + (size_t)i * xs, wild);
                for (int r = 0; r < nrow; r++) st_random_row(at, n, y + (size_t)r * ys, wild);
                if (rep % 3 == 1) st_cancel_rows(wt, at, n, x, y, nrow, ys);
                for (int r = 0; r < nrow; r++) {
                    k_act_side(at, k_panel_off(wt), y + (size_t)r * ys, n, sides + (size_t)r * ss, false);
                    if (sk->side_w16) k_act_side_w16(y + (size_t)r * ys, n, sides + (size_t)r * ss);
                }
                if (q41as51) { // the same rows as Q5_1 blocks (d, m, qh = 0, the quant bytes), packed so
                    const size_t xs51 = st_row_bytes(T_Q5_1, n);
                    for (int i = 0; i < nw; i++)
                        for (int64_t b = 0; b < n / 32; b++) {
                            const uint8_t *src = x + (size_t)i * xs + (size_t)b * K_Q4_1_SIZE;
                            uint8_t *dst = x51 + (size_t)i * xs51 + (size_t)b * K_Q5_1_SIZE;
                            memcpy(dst, src, 4);
                            memset(dst + 4, 0, 4);
                            memcpy(dst + 8, src + 4, 16);
                        }
                    k_panel_pack(T_Q5_1, n, x51, xs51, nw, panel);
                } else if (!flt && P == K_PANEL) {
                    k_panel_pack(wt, n, x, xs, nw, panel);
                }
                if (P != K_PANEL && set != K_SET_AMX) { // two 8-row panels, rows 0-7 then rows 8-15
                    const uint32_t lt = k_panel_layout(set, wt); // (Q4_K: Q5_K's, its quants as bytes)
                    const bool w16 = set == K_SET_AVX2 && wt == T_Q8_0; // (the avxvnni set's Q8_0: bytes)
                    CHECK(pz == 2 * (w16 ? (size_t)(n / 32) * K_PANEL_W16_BLK : k_panel_size(lt, n)));
                    for (int h = 0; h < 2; h++) {
                        const int rows = h ? nw - K_PANEL : PSV_MIN(nw, K_PANEL);
                        uint8_t *dst = want + h * (pz / 2);
                        if (rows <= 0) { // (not read: the 8-row kernel takes such a panel)
                            memset(dst, 0, pz / 2);
                            continue;
                        }
                        k_panel_pack(wt, n, x + (size_t)h * K_PANEL * xs, xs, rows, panel);
                        if (w16) k_panel_widen16(n, rows, panel, dst);
                        else if (lt != wt) k_panel_split4(n, panel, dst);
                        else memcpy(dst, panel, pz / 2);
                        if (k_panel_sc16(set) && type_get(wt)->blck_size == QK_K) k_panel_dup16(lt, n, dst);
                    }
                } else if (P != K_PANEL) { // the amx set's: 16 rows (k-quants: the quants times parts of their scales)
#if defined(PSV_AMX)
                    CHECK((wt == T_Q2_K && pz == (size_t)(n / QK_K) * K_AMX_BLK(1)) ||
                          ((wt == T_Q4_K || wt == T_Q5_K) && pz == (size_t)(n / QK_K) * K_AMX_BLK(2)) ||
                          (wt == T_Q3_K && pz == (size_t)(n / QK_K) * K_AMX6_BLK(1)) ||
                          (wt == T_Q6_K && pz == (size_t)(n / QK_K) * K_AMX6_BLK(3)) ||
                          ((wt == T_Q4_0 || wt == T_Q5_0 || wt == T_Q8_0) && pz == (size_t)(n / 32) * K_AMX0_BLK));
                    CHECK(sk->act_vnni == (wt == T_Q4_0 || wt == T_Q5_0 || wt == T_Q8_0));
                    if (wt == T_Q2_K || wt == T_Q4_K || wt == T_Q5_K) k_panel_pack_amx(wt, n, x, xs, nw, want);
                    else if (wt == T_Q3_K || wt == T_Q6_K) k_panel_pack_amx6(wt, n, x, xs, nw, want);
                    else k_panel_pack_amx0(wt, n, x, xs, nw, want);
#endif
                } else if (flt) { // F16 and BF16: floats, n rounded up to 16
                    CHECK(pz == (size_t)K_FLT_STEPS(n) * 16 * K_FLT_PANEL_BLK + K_FLT_TRAILER && pz == k_panel_flt_bytes(n) + K_FLT_TRAILER);
                    k_panel_pack_flt(wt, k_panel_flt_wide(set), n, x, xs, nw, want);
                } else if (q41as51) { // the AVX-512 and ARM sets' Q4_1: Q5_1's (above)
                    CHECK(pz == k_panel_size(T_Q5_1, n));
                    memcpy(want, panel, pz);
                } else if (k_panel_bytes4(set, wt)) { // the AVX2, avxvnni and ARM sets' Q4_K: bytes, in Q5_K's layout
                    CHECK(pz == k_panel_size(T_Q5_K, n));
                    k_panel_split4(n, panel, want);
                } else if (pz != k_panel_size(wt, n)) { // the AVX2 set's Q8_0: int16
                    CHECK(set == K_SET_AVX2 && wt == T_Q8_0 && pz == (size_t)(n / 32) * K_PANEL_W16_BLK);
                    k_panel_widen16(n, nw, panel, want);
                } else {
                    memcpy(want, panel, pz);
                }
                if (!flt && P == K_PANEL && k_panel_g8(set, wt)) k_panel_regroup8(k_panel_layout(set, wt), n, want); // groups of eight
                if (k_panel_sc16(set) && type_get(wt)->blck_size == QK_K && P == K_PANEL) k_panel_dup16(k_panel_layout(set, wt), n, want);
                if (k_panel_by16(set) && type_get(wt)->blck_size == QK_K) k_panel_regroup16(k_panel_layout(set, wt), n, want);
                if (k_panel_mmsc(set, k_panel_layout(set, wt))) k_panel_dup_mm(k_panel_layout(set, wt), n, want);
                if (k_panel_signed8(set, wt)) k_panel_flip8(n, nw, want); // the dotprod set's Q8_0: signed
                // the set's packer writes the same bytes (every lane, padding included)
                memset(panel2, 0xa5, pz);
                sk->pack(n, x, xs, nw, panel2);
                if (memcmp(want, panel2, pz) != 0 && mismatches++ < 5)
                    fprintf(stderr, "%s pack %s n=%lld nw=%d: differs from k_panel_pack\n", k_set_names[set],
                            type_get(wt)->name, (long long)n, nw);
                // prefetching (the weights themselves, as if they were the next panel's) must
                // change nothing: odd row counts ask for it
                k_prefetch pf = {.p = x, .stride = xs, .blk = type_get(wt)->type_size, .rows = nw};
                CHECK(sk->gemm_rows >= 1 && sk->gemm_rows <= K_GEMM_ROWS_MAX);
                for (int nr = 1; nr <= sk->gemm_rows; nr++) {
                    float res[K_GEMM_ROWS_MAX][16 + 1], *out[K_GEMM_ROWS_MAX];
                    for (int r = 0; r < K_GEMM_ROWS_MAX; r++) {
                        out[r] = res[r];
                        for (int i = 0; i <= 16; i++) res[r][i] = -1.0f;
                    }
                    int r0 = nrow - nr; // the last nr rows
                    if (sk->act_vnni) { // the rows as one group, as the engine's quantizer writes them
                        memset(grp, 0xa5, k_act_vnni_size(n));
                        for (int r = 0; r < nr; r++) k_act_vnni(y + (size_t)(r0 + r) * ys, n, r, grp);
                        if (nr < K_VNNI_ROWS) k_act_vnni_clear(n, nr, grp);
                    }
                    sk->gemm(n, want, sk->act_vnni ? grp : y + (size_t)r0 * ys, ys, sides + (size_t)r0 * ss, ss, nr, out, nw,
                             nr % 2 ? &pf : NULL);
                    for (int r = 0; r < nr; r++) {
                        for (int i = 0; i < nw; i++) {
                            float want;
                            ref->vec_dot(n, &want, x + (size_t)i * xs, y + (size_t)(r0 + r) * ys);
                            checked++;
                            if (!st_same(want, res[r][i]) && mismatches++ < 5)
                                fprintf(stderr, "%s gemm %s n=%lld rep %d nw=%d nr=%d w%d a%d: ref %.9g (%08x) vs %.9g (%08x)\n",
                                        k_set_names[set], type_get(wt)->name, (long long)n, rep, nw, nr, i, r, want,
                                        f32_bits(want), res[r][i], f32_bits(res[r][i]));
                        }
                        CHECK(res[r][nw] == -1.0f); // nothing beyond the panel's rows
                    }
                }
            }
            free(x);
            free(y);
            free(x51);
            free(panel);
            free(want);
            free(panel2);
            free(sides);
            free(grp);
            if (sk->gemm_done) sk->gemm_done();
        }
        CHECKF(mismatches == 0, "%s gemm %s: %d of %d products differ from the reference", k_set_names[set],
               type_get(wt)->name, mismatches, checked);
    }
}

// The BF16 GEMM takes FMAs where every product of the panel and the activation rows is exact
// in float (k_flt_fused), the reference's multiply and add elsewhere: rows whose products fall
// below 2^-126 (underflow: rounded to subnormals when multiplied first) or reach 2^128 (a
// multiply overflows where the FMA's sum need not), each beside ordinary rows, must still give
// the reference's results, as must ordinary rows (the FMAs).
static uint16_t st_bf16_pow2(int lo, int span) { // +-(1 + f) 2^e, lo <= e < lo + span, 7 random fraction bits
    const int e = lo + (int)(st_rng() % (uint64_t)span);
    return (uint16_t)((st_rng() & 1) << 15 | (uint32_t)(e + 127) << 7 | (uint32_t)(st_rng() & 127));
}
static void st_check_gemm_bf16_edges(k_set set) {
    const k_traits *sk = k_traits_of_set(set, T_BF16), *ref = k_traits_ref(T_BF16);
    if (!sk || !sk->gemm) return;
    enum { N = 96, NR = 3 };
    const size_t ys = 2 * N, ss = k_act_side_stride(sk, N, true);
    uint8_t x[K_PANEL][2 * N], y[NR][2 * N], side[NR][64], *panel = malloc(k_panel_bytes(sk, T_BF16, N));
    PSV_ASSERT(panel && ss <= sizeof side[0]);
    // exponents of the weights, of the first activation rows and of the last one: ordinary,
    // products underflowing, overflowing, and underflowing in the last row only
    const int cases[][6] = {{-8, -2, -8, -2, -8, -2}, {-75, -70, -75, -70, -75, -70}, {63, 64, 63, 64, 63, 64},
                            {-60, -55, -8, -2, -75, -70}};
    int mismatches = 0, checked = 0;
    for (size_t ci = 0; ci < PSV_ARRAY_LEN(cases); ci++)
        for (int rep = 0; rep < 20; rep++) {
            for (int r = 0; r < K_PANEL; r++)
                for (int i = 0; i < N; i++) wr_u16(x[r] + 2 * i, st_bf16_pow2(cases[ci][0], cases[ci][1] - cases[ci][0] + 1));
            for (int t = 0; t < NR; t++) {
                const int *e = cases[ci] + (t == NR - 1 ? 4 : 2);
                for (int i = 0; i < N; i++) wr_u16(y[t] + 2 * i, st_bf16_pow2(e[0], e[1] - e[0] + 1));
                k_act_side(T_BF16, 0, y[t], N, side[t], false);
            }
            sk->pack(N, x[0], 2 * N, K_PANEL, panel);
            CHECK(k_flt_fused(N, panel, side[0], sizeof side[0], NR) == (ci == 0));
            float res[NR][K_PANEL], *out[NR] = {res[0], res[1], res[2]};
            sk->gemm(N, panel, y[0], ys, side[0], sizeof side[0], NR, out, K_PANEL, NULL);
            for (int t = 0; t < NR; t++)
                for (int r = 0; r < K_PANEL; r++) {
                    float want;
                    ref->vec_dot(N, &want, x[r], y[t]);
                    checked++;
                    if (!st_same(want, res[t][r]) && mismatches++ < 5)
                        fprintf(stderr, "%s gemm BF16 case %zu rep %d w%d a%d: ref %.9g vs %.9g\n", k_set_names[set], ci, rep, r,
                                t, want, res[t][r]);
                }
        }
    CHECKF(mismatches == 0, "%s gemm BF16 at float's range ends: %d of %d products differ from the reference", k_set_names[set],
           mismatches, checked);
    free(panel);
}

// The set's gemv kernels (generation's products with the activation's side data) against the
// reference vec_dot, bit for bit, on the same adversarial rows as the dot products.
static void st_check_gemv(k_set set) {
    bool any = false;
    for (size_t ti = 0; ti < PSV_ARRAY_LEN(st_weight_types); ti++) any = any || k_traits_of_set(set, st_weight_types[ti])->gemv;
    if (!any) SKIP("kernel set %s: has no gemv kernels", k_set_names[set]);
    for (size_t ti = 0; ti < PSV_ARRAY_LEN(st_weight_types); ti++) {
        uint32_t wt = st_weight_types[ti];
        const k_traits *ref = k_traits_ref(wt), *sk = k_traits_of_set(set, wt);
        if (!sk || !sk->gemv) continue;
        uint32_t at = ref->vec_dot_type;
        int64_t lens[16];
        int nl = st_lengths(wt, lens), mismatches = 0, checked = 0;
        for (int li = 0; li < nl; li++) {
            int64_t n = lens[li];
            size_t xs = st_row_bytes(wt, n), ys = st_row_bytes(at, n), ss = k_act_side_size(at, n);
            uint8_t *x = malloc(xs), *y = malloc(ys * K_ROWS_MAX), *side = malloc(ss * K_ROWS_MAX);
            PSV_ASSERT(x && y && side);
            for (int rep = 0; rep < (n >= 4096 ? 8 : 40); rep++) {
                bool wild = rep % 5 == 4;
                int nr = 1 + rep % K_ROWS_MAX;
                st_random_row(wt, n, x, wild);
                for (int r = 0; r < nr; r++) st_random_row(at, n, y + (size_t)r * ys, wild);
                if (rep % 3 == 1) st_cancel_rows(wt, at, n, x, y, nr, ys);
                for (int r = 0; r < nr; r++) k_act_side(at, k_panel_off(wt), y + (size_t)r * ys, n, side + (size_t)r * ss, false);
                float got[2 * K_ROWS_MAX];
                for (int i = 0; i < 2 * K_ROWS_MAX; i++) got[i] = -1.0f;
                sk->gemv(n, got, 2, x, y, ys, side, ss, nr); // results two apart: the stride is honoured
                for (int r = 0; r < nr; r++) {
                    float want;
                    ref->vec_dot(n, &want, x, y + (size_t)r * ys);
                    checked++;
                    if (!st_same(want, got[2 * r]) && mismatches++ < 5)
                        fprintf(stderr, "%s gemv %s n=%lld rep %d nr=%d row %d: ref %.9g (%08x) vs %.9g (%08x)\n",
                                k_set_names[set], type_get(wt)->name, (long long)n, rep, nr, r, want, f32_bits(want),
                                got[2 * r], f32_bits(got[2 * r]));
                    CHECK(got[2 * r + 1] == -1.0f);
                }
            }
            free(x);
            free(y);
            free(side);
        }
        CHECKF(mismatches == 0, "%s gemv %s: %d of %d products differ from the reference", k_set_names[set],
               type_get(wt)->name, mismatches, checked);
    }
}

#if defined(PSV_X86_KERNELS)
// Whether this CPU can run a kernel form that needs AVX512_VBMI (vbmi) or none; says what is skipped.
static bool st_form_runs(const char *name, const char *kind, uint32_t type, bool vbmi) {
    if (!vbmi || plat_cpu_get()->avx512vbmi) return true;
    SKIP("%s %s %s: this CPU has no AVX512_VBMI", name, kind, type_get(type)->name);
    return false;
}
#endif

// The row lengths the gemv1 and gemvn kernels are checked on: st_lengths's, and rows long enough
// for the prefetch distance of long rows (k_gemv1_pf_step).
static int st_gemv1_lengths(uint32_t type, int64_t out[16]) {
    int k = st_lengths(type, out);
    PSV_ASSERT(k < 16);
    out[k++] = 12288;
    return k;
}

// The set's one-activation gemv kernels (gemv1: many weight rows against one activation row)
// against the reference vec_dot, bit for bit: every row count up to a few groups past the
// kernels' group of rows, on the same adversarial rows as the dot products, the weight rows
// a stride apart that is more than their length (only s[0..nw) may be written), each time in two
// calls that split the groups of rows between them.
// (name: the set's, or the kernel's where it is one of a type's forms.)
static void st_check_gemv1_fn(const char *name, uint32_t wt, k_gemv1_fn gemv1) {
    enum { MAXW = 17 };
    const k_traits *ref = k_traits_ref(wt);
    uint32_t at = ref->vec_dot_type;
    int64_t lens[16];
    int nl = st_gemv1_lengths(wt, lens), mismatches = 0, checked = 0;
    for (int li = 0; li < nl; li++) {
        int64_t n = lens[li];
        size_t xs = st_row_bytes(wt, n), xstride = xs + 3 * type_get(wt)->type_size, ys = st_row_bytes(at, n);
        size_t ss = k_act_side_one(at, n);
        uint8_t *x = malloc(xstride * MAXW), *y = malloc(ys * 2), *side = malloc(ss);
        PSV_ASSERT(x && y && side);
        for (int rep = 0; rep < (n >= 4096 ? 6 : 24); rep++) {
            bool wild = rep % 5 == 4;
            int nw = 1 + rep % MAXW;
            for (int i = 0; i < nw; i++) st_random_row(wt, n, x + (size_t)i * xstride, wild);
            st_random_row(at, n, y, wild);
            if (rep % 3 == 1) st_cancel_rows(wt, at, n, x, y, 1, ys);
            k_act_side(at, k_panel_off(wt), y, n, side, true);
            float got[MAXW + 1];
            for (int i = 0; i <= MAXW; i++) got[i] = -1.0f;
            // in two calls, groups [0, cut) and [cut, G) (one of them empty at times), each
            // writing only its groups' rows (row i is in group i % G)
            const int G = k_gemv1_groups(nw), cut = rep % (G + 1);
            gemv1(n, got, x, xstride, nw, 0, cut, y, side);
            float first[MAXW];
            bool untouched = true;
            for (int i = 0; i < nw; i++) {
                untouched = untouched && (i % G < cut || got[i] == -1.0f);
                first[i] = got[i], got[i] = i % G < cut ? -2.0f : got[i];
            }
            gemv1(n, got, x, xstride, nw, cut, G, y, side);
            for (int i = 0; i < nw; i++)
                if (i % G < cut) untouched = untouched && got[i] == -2.0f, got[i] = first[i];
            CHECKF(untouched, "%s gemv1 %s n=%lld nw=%d: groups [0, %d) and [%d, %d) wrote each other's rows",
                   name, type_get(wt)->name, (long long)n, nw, cut, cut, G);
            for (int i = 0; i < nw; i++) {
                float want;
                ref->vec_dot(n, &want, x + (size_t)i * xstride, y);
                checked++;
                if (!st_same(want, got[i]) && mismatches++ < 5)
                    fprintf(stderr, "%s gemv1 %s n=%lld rep %d nw=%d row %d: ref %.9g (%08x) vs %.9g (%08x)\n",
                            name, type_get(wt)->name, (long long)n, rep, nw, i, want, f32_bits(want),
                            got[i], f32_bits(got[i]));
            }
            CHECK(got[nw] == -1.0f);
        }
        free(x);
        free(y);
        free(side);
    }
    CHECKF(mismatches == 0, "%s gemv1 %s: %d of %d products differ from the reference", name,
           type_get(wt)->name, mismatches, checked);
}

static void st_check_gemv1(k_set set) {
    bool any = false;
    for (size_t ti = 0; ti < PSV_ARRAY_LEN(st_weight_types); ti++) any = any || k_traits_of_set(set, st_weight_types[ti])->gemv1;
    if (!any) SKIP("kernel set %s: has no gemv1 kernels", k_set_names[set]);
    for (size_t ti = 0; ti < PSV_ARRAY_LEN(st_weight_types); ti++) {
        const k_traits *sk = k_traits_of_set(set, st_weight_types[ti]);
        if (sk && sk->gemv1) st_check_gemv1_fn(k_set_names[set], st_weight_types[ti], sk->gemv1);
    }
#if defined(PSV_X86_KERNELS)
    // the AVX-512 set's one-row Q4_K and Q5_K kernels have forms for some CPUs (k_gemv1_q45_k_for):
    // each one this CPU can run, whichever the set took
    if (set != K_SET_AVX512) return;
    const struct { const char *name; uint32_t type; k_gemv1_fn fn; bool vbmi; } forms[] = {
        {"avx512 (no VBMI)", T_Q4_K, k_gemv1_q4_k_avx512, false},  {"avx512 (no VBMI)", T_Q5_K, k_gemv1_q5_k_avx512, false},
        {"avx512 (VBMI)", T_Q4_K, k_gemv1_q4_k_vbmi, true},         {"avx512 (VBMI)", T_Q5_K, k_gemv1_q5_k_vbmi, true},
        {"avx512 (VBMI, Zen 4)", T_Q4_K, k_gemv1_q4_k_vbmi_zen4, true}, {"avx512 (VBMI, Zen 4)", T_Q5_K, k_gemv1_q5_k_vbmi_zen4, true},
    };
    for (size_t i = 0; i < PSV_ARRAY_LEN(forms); i++)
        if (st_form_runs(forms[i].name, "gemv1", forms[i].type, forms[i].vbmi) && forms[i].fn != k_traits_of_set(set, forms[i].type)->gemv1)
            st_check_gemv1_fn(forms[i].name, forms[i].type, forms[i].fn);
#endif
}

// The set's gemvn kernels (a few activation rows against many weight rows) against the
// reference vec_dot, bit for bit, as st_check_gemv1 does gemv1: every count of activation rows
// (2..K_GEMVN_MAX), each row its own activation and side data, results to separate rows of s
// (only s[r][0..nw) may be written), the groups in two calls.
// (name: the set's, or the kernel's where it is one of a type's forms.)
static void st_check_gemvn_fn(const char *name, uint32_t wt, k_gemvn_fn gemvn) {
    enum { MAXW = 13 };
    const k_traits *ref = k_traits_ref(wt);
    uint32_t at = ref->vec_dot_type;
    int64_t lens[16];
    int nl = st_gemv1_lengths(wt, lens), mismatches = 0, checked = 0;
    for (int li = 0; li < nl; li++) {
        int64_t n = lens[li];
        size_t xs = st_row_bytes(wt, n), xstride = xs + 3 * type_get(wt)->type_size;
        size_t ys = st_row_bytes(at, n) + 8, ss = k_act_side_one(at, n) + 24; // rows further apart than they are long
        uint8_t *x = malloc(xstride * MAXW), *y = malloc(ys * K_GEMVN_MAX), *side = malloc(ss * K_GEMVN_MAX);
        PSV_ASSERT(x && y && side);
        for (int rep = 0; rep < (n >= 4096 ? 6 : 18); rep++) {
            bool wild = rep % 5 == 4;
            int nw = 1 + (rep * 5) % MAXW, nr = 2 + rep % (K_GEMVN_MAX - 1);
            for (int i = 0; i < nw; i++) st_random_row(wt, n, x + (size_t)i * xstride, wild);
            for (int r = 0; r < nr; r++) st_random_row(at, n, y + (size_t)r * ys, wild && r == 1);
            if (rep % 3 == 1) st_cancel_rows(wt, at, n, x, y, nr, ys);
            for (int r = 0; r < nr; r++) k_act_side(at, k_panel_off(wt), y + (size_t)r * ys, n, side + (size_t)r * ss, true);
            float got[K_GEMVN_MAX][MAXW + 1], *out[K_GEMVN_MAX];
            for (int r = 0; r < K_GEMVN_MAX; r++) {
                out[r] = got[r];
                for (int i = 0; i <= MAXW; i++) got[r][i] = -1.0f;
            }
            const int G = k_gemv1_groups(nw), cut = rep % (G + 1);
            gemvn(n, out, x, xstride, nw, 0, cut, y, ys, side, ss, nr);
            bool untouched = true;
            for (int r = 0; r < nr; r++)
                for (int i = 0; i < nw; i++) untouched = untouched && (i % G < cut || got[r][i] == -1.0f);
            gemvn(n, out, x, xstride, nw, cut, G, y, ys, side, ss, nr);
            CHECKF(untouched, "%s gemvn %s n=%lld nw=%d: groups [0, %d) wrote rows of [%d, %d)", name,
                   type_get(wt)->name, (long long)n, nw, cut, cut, G);
            for (int r = 0; r < K_GEMVN_MAX; r++) {
                for (int i = 0; i < nw && r < nr; i++) {
                    float want;
                    ref->vec_dot(n, &want, x + (size_t)i * xstride, y + (size_t)r * ys);
                    checked++;
                    if (!st_same(want, got[r][i]) && mismatches++ < 5)
                        fprintf(stderr, "%s gemvn %s n=%lld rep %d nr=%d nw=%d act %d row %d: ref %.9g (%08x) vs %.9g (%08x)\n",
                                name, type_get(wt)->name, (long long)n, rep, nr, nw, r, i, want,
                                f32_bits(want), got[r][i], f32_bits(got[r][i]));
                }
                CHECK(got[r][r < nr ? nw : 0] == -1.0f); // past the rows, and rows past nr, untouched
            }
        }
        free(x);
        free(y);
        free(side);
    }
    CHECKF(mismatches == 0, "%s gemvn %s: %d of %d products differ from the reference", name,
           type_get(wt)->name, mismatches, checked);
}

static void st_check_gemvn(k_set set) {
    bool any = false;
    for (size_t ti = 0; ti < PSV_ARRAY_LEN(st_weight_types); ti++) any = any || k_traits_of_set(set, st_weight_types[ti])->gemvn;
    if (!any) SKIP("kernel set %s: has no gemvn kernels", k_set_names[set]);
    for (size_t ti = 0; ti < PSV_ARRAY_LEN(st_weight_types); ti++) {
        uint32_t wt = st_weight_types[ti];
        const k_traits *sk = k_traits_of_set(set, wt);
        if (!sk || !sk->gemvn) continue;
        CHECKF(sk->gemv1 != NULL && sk->gemvn_max >= 2 && sk->gemvn_max <= K_GEMVN_ROWS, "%s %s: gemvn without gemv1 or a row count (%d)",
               k_set_names[set], type_get(wt)->name, sk->gemvn_max);
        st_check_gemvn_fn(k_set_names[set], wt, sk->gemvn);
    }
#if defined(PSV_X86_KERNELS)
    // the forms of the AVX-512 set's Q4_K gemvn kernel (k_gemvn_q45_k_for) this CPU can run
    if (set != K_SET_AVX512) return;
    const struct { const char *name; uint32_t type; k_gemvn_fn fn; bool vbmi; } forms[] = {
        {"avx512 (no VBMI)", T_Q4_K, k_gemvn_q4_k_avx512, false}, {"avx512 (VBMI)", T_Q4_K, k_gemvn_q4_k_vbmi, true},
        {"avx512 (VBMI, Zen 4)", T_Q4_K, k_gemvn_q4_k_vbmi_zen4, true},
    };
    for (size_t i = 0; i < PSV_ARRAY_LEN(forms); i++)
        if (st_form_runs(forms[i].name, "gemvn", forms[i].type, forms[i].vbmi) && forms[i].fn != k_traits_of_set(set, forms[i].type)->gemvn)
            st_check_gemvn_fn(forms[i].name, forms[i].type, forms[i].fn);
#endif
}

// ---- quantizers ------------------------------------------------------------------------------

static const uint32_t st_act_types[] = {T_Q8_0, T_Q8_1, T_Q8_K, T_F16, T_BF16, T_F32};

// Inputs of kind 0..7: random normal-sized, ties (values k + 0.5 times the block's step),
// huge, tiny/subnormal, with zeros and -0, non-finite sprinkled, random bit patterns, all equal.
static void st_quant_input(float *x, int64_t n, int kind, int64_t bs) {
    for (int64_t i = 0; i < n; i++) {
        float v = st_sym();
        switch (kind) {
        case 1: { // ties: the largest magnitude fixes the step to 1 (Q8_0: amax 127 -> d = 1;
                  // Q8_K: max -127 -> iscale 1), the others sit on .5
            int64_t j = i % bs;
            if (j == 0) v = bs == QK_K ? -127.0f : (st_rng() & 1 ? 127.0f : -127.0f);
            else v = (float)((int)(st_rng() % 254) - 127) + 0.5f * (st_rng() & 1 ? 1.0f : -1.0f);
            if (v > 127 || v < -127) v = 126.5f;
            break;
        }
        case 2: v *= 3e38f; break;
        case 3: v = f32_from_bits((uint32_t)(st_rng() % 0x00900000u) | (st_rng() & 1 ? 0x80000000u : 0)); break;
        case 4: if (st_rng() % 4 == 0) v = st_rng() & 1 ? 0.0f : -0.0f; break;
        case 5: {
            uint64_t r = st_rng() % 64;
            if (r == 0) v = f32_from_bits(0x7fc00000u | (uint32_t)(st_rng() & 0x3fffff));
            if (r == 1) v = f32_from_bits(0xff800000u);
            if (r == 2) v = f32_from_bits(0x7f800001u); // signalling NaN
            break;
        }
        case 6: v = f32_from_bits((uint32_t)st_rng()); break;
        case 7: v = 0.75f; break;
        default: v *= (float)(1 + st_rng() % 100); break;
        }
        x[i] = v;
    }
}

// Ties at every scale: x = (k + 0.5) * d for the block's own d, checked against the reference
// only (whether the product lands exactly on .5 depends on the rounding of 1/d).
static void st_check_quantizers(k_set set) {
    for (size_t ti = 0; ti < PSV_ARRAY_LEN(st_act_types); ti++) {
        uint32_t at = st_act_types[ti];
        const k_traits *ref = k_traits_ref(at), *sk = k_traits_of_set(set, at);
        CHECK(sk && sk->from_float);
        if (!sk || !sk->from_float) continue;
        int64_t bs = type_get(at)->blck_size == 1 ? 32 : type_get(at)->blck_size;
        static const int64_t nblk[] = {1, 2, 3, 8, 17};
        int mismatches = 0, checked = 0;
        for (size_t ni = 0; ni < PSV_ARRAY_LEN(nblk); ni++)
            for (int extra = 0; extra < (type_get(at)->blck_size == 1 ? 3 : 1); extra++) {
                int64_t n = nblk[ni] * bs + extra * 7; // float types also get lengths off the vector width
                size_t size = st_row_bytes(at, n);
                float *x = malloc((size_t)n * sizeof *x);
                uint8_t *a = malloc(size), *b = malloc(size);
                PSV_ASSERT(x && a && b);
                for (int kind = 0; kind < 8; kind++)
                    for (int rep = 0; rep < 20; rep++) {
                        st_quant_input(x, n, kind, bs);
                        memset(a, 0xa5, size);
                        memset(b, 0x5a, size);
                        ref->from_float(x, a, n);
                        sk->from_float(x, b, n);
                        checked++;
                        if (memcmp(a, b, size) != 0 && mismatches++ < 5) {
                            size_t k = 0;
                            while (a[k] == b[k]) k++;
                            fprintf(stderr, "%s quant %s n=%lld kind %d: byte %zu: ref %02x vs %02x\n", k_set_names[set],
                                    type_get(at)->name, (long long)n, kind, k, a[k], b[k]);
                        }
                    }
                free(x);
                free(a);
                free(b);
            }
        CHECKF(mismatches == 0, "%s quantize %s: %d of %d rows differ", k_set_names[set], type_get(at)->name, mismatches,
               checked);
    }
    // the fused Q8_0 quantizer with side data (k_vec_ops.quant_side_q8_0), where the set has one:
    // the row and every part of the side data that k_act_side writes, byte for byte, for the
    // three offsets of the Q8_0-row panel types, whole groups of eight blocks and tails, for
    // products of several rows (the GEMM's blocks) and of one (the gemv1 kernels' groups of four)
    const k_vec_ops *vs = k_vec_of_set(set);
    if (vs->quant_side_q8_0) {
        static const int64_t nblk[] = {1, 2, 7, 8, 9, 16, 28, 152};
        static const int offs[] = {8, 16, 128};
        int bad = 0, checked = 0;
        for (size_t ni = 0; ni < PSV_ARRAY_LEN(nblk); ni++) {
            const int64_t n = nblk[ni] * 32;
            const size_t rb = st_row_bytes(T_Q8_0, n), sb = k_act_side_one(T_Q8_0, n); // the larger
            float *x = malloc((size_t)n * sizeof *x);
            uint8_t *ra = malloc(rb), *rbuf = malloc(rb), *sa = malloc(sb), *sbuf = malloc(sb);
            PSV_ASSERT(x && ra && rbuf && sa && sbuf);
            for (int kind = 0; kind < 8; kind++)
                for (size_t oi = 0; oi < PSV_ARRAY_LEN(offs); oi++)
                    for (int rep = 0; rep < 6; rep++) {
                        const bool one = rep % 2;
                        st_quant_input(x, n, kind, 32);
                        memset(ra, 0xa5, rb), memset(rbuf, 0xa5, rb), memset(sa, 0x5a, sb), memset(sbuf, 0x5a, sb);
                        k_traits_ref(T_Q8_0)->from_float(x, ra, n);
                        k_act_side(T_Q8_0, offs[oi], ra, n, sa, one);
                        vs->quant_side_q8_0(x, rbuf, n, offs[oi], sbuf, one);
                        checked++;
                        if ((memcmp(ra, rbuf, rb) != 0 || memcmp(sa, sbuf, sb) != 0) && bad++ < 5)
                            fprintf(stderr, "%s quant_side_q8_0 n=%lld kind %d off %d one row %d: row %s, side %s\n",
                                    k_set_names[set], (long long)n, kind, offs[oi], one, memcmp(ra, rbuf, rb) ? "differs" : "same",
                                    memcmp(sa, sbuf, sb) ? "differs" : "same");
                    }
            free(x), free(ra), free(rbuf), free(sa), free(sbuf);
        }
        CHECKF(bad == 0, "%s quant_side_q8_0: %d of %d rows differ", k_set_names[set], bad, checked);
    }
    // every float bit pattern class through F16 and BF16 (exhaustive over the top 16 bits, random low)
    const k_traits *r16 = k_traits_ref(T_F16), *s16 = k_traits_of_set(set, T_F16);
    const k_traits *rbf = k_traits_ref(T_BF16), *sbf = k_traits_of_set(set, T_BF16);
    enum { N = 65536 };
    float *x = malloc(N * sizeof *x);
    uint8_t *a = malloc(2 * N), *b = malloc(2 * N);
    PSV_ASSERT(x && a && b);
    int bad16 = 0, badbf = 0;
    for (int rep = 0; rep < 4; rep++) {
        for (uint32_t i = 0; i < N; i++)
            x[i] = f32_from_bits(i << 16 | (rep == 0 ? 0 : rep == 1 ? 0x8000u : (uint32_t)st_rng() & 0xffff));
        r16->from_float(x, a, N);
        s16->from_float(x, b, N);
        bad16 += memcmp(a, b, 2 * N) != 0;
        rbf->from_float(x, a, N);
        sbf->from_float(x, b, N);
        badbf += memcmp(a, b, 2 * N) != 0;
    }
    CHECKF(bad16 == 0, "%s F16 quantizer differs on %d of 4 sweeps", k_set_names[set], bad16);
    CHECKF(badbf == 0, "%s BF16 quantizer differs on %d of 4 sweeps", k_set_names[set], badbf);
    free(x);
    free(a);
    free(b);
}

// ---- element-wise kernels --------------------------------------------------------------------

// Sets share element-wise kernels (avxvnni and avx512 take avx2's exp, the ARM sets all the neon
// set's): a group of them is checked with the first set this CPU runs that has them, once.
static bool st_same_exp(const k_vec_ops *a, const k_vec_ops *b) { return a->expf == b->expf && a->swiglu == b->swiglu; }
static bool st_same_exp_shift(const k_vec_ops *a, const k_vec_ops *b) { return a->exp_shift == b->exp_shift; }
static bool st_same_attention(const k_vec_ops *a, const k_vec_ops *b) {
    return a->dot_keys == b->dot_keys && a->axpy_rows == b->axpy_rows && a->dot_keys_f16 == b->dot_keys_f16 &&
           a->axpy_rows_f16 == b->axpy_rows_f16;
}
static bool st_same_softmax(const k_vec_ops *a, const k_vec_ops *b) { return a->softmax == b->softmax; }

// Whether this run checks set: this CPU runs it, and PSV_TEST_SETS (if set) names it.
static bool st_set_checked(k_set set) {
    if (!k_set_supported(set, plat_cpu_get())) return false;
    const char *want = getenv("PSV_TEST_SETS");
    if (!want) return true;
    const size_t len = strlen(k_set_names[set]);
    for (const char *p = want; *p; p += *p == ',') {
        const size_t n = strcspn(p, ",");
        if (n == len && !strncmp(p, k_set_names[set], len)) return true;
        p += n;
    }
    return false;
}

// Whether set's kernels of a group (same) are still to check: no set before it that this run
// checks has them; otherwise says which one checked them.
static bool st_vec_unchecked(k_set set, const char *group, bool (*same)(const k_vec_ops *, const k_vec_ops *)) {
    for (int s = K_SET_REF + 1; s < (int)set; s++)
        if (st_set_checked((k_set)s) && same(k_vec_of_set((k_set)s), k_vec_of_set(set))) {
            printf("%s %s: the %s set's kernels, checked with it\n", k_set_names[set], group, k_set_names[s]);
            return false;
        }
    return true;
}

// Every float of a dense sample (each binade from 2^-40 to 2^8 at a mantissa step of 61, both
// signs), every float in [85, 90] and [-90, -85] (where the fast path hands over to the scalar
// one), and the specials, through exp and SwiGLU: bit-identical to the reference.
static void st_check_vec(k_set set) {
    const k_vec_ops *ref = k_vec_of_set(K_SET_REF), *sk = k_vec_of_set(set);
    const bool exp_todo = st_vec_unchecked(set, "exp and swiglu", st_same_exp);
    enum { CAP = 1 << 20 };
    float *x = malloc(CAP * sizeof *x), *u = malloc(CAP * sizeof *u), *a = malloc(CAP * sizeof *a),
          *b = malloc(CAP * sizeof *b), *kb = malloc(CAP * sizeof *kb);
    PSV_ASSERT(x && u && a && b && kb);
    int64_t checked = 0, bad_exp = 0, bad_glu = 0;
    for (int pass = 0; pass < 53 && exp_todo; pass++) {
        int64_t n = 0;
        if (pass < 49) { // binade 2^(pass - 41)
            uint32_t e = (uint32_t)(127 + pass - 41) << 23;
            for (uint32_t m = (uint32_t)pass; m < (1u << 23) && n + 2 <= CAP; m += 61) {
                x[n++] = f32_from_bits(e | m);
                x[n++] = f32_from_bits(0x80000000u | e | m);
            }
        } else if (pass < 51) { // [85, 90] or [-90, -85]
            for (uint32_t bits = f32_bits(85.0f); bits <= f32_bits(90.0f) && n < CAP; bits++)
                x[n++] = f32_from_bits(bits | (pass == 50 ? 0x80000000u : 0));
        } else if (pass == 51) { // [-136, -130]: whole vectors around the flush to +0 (about -133)
            for (uint32_t bits = f32_bits(130.0f); bits <= f32_bits(136.0f) && n < CAP; bits++)
                x[n++] = f32_from_bits(bits | 0x80000000u);
        } else {
            static const uint32_t sp[] = {0, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u,
                                          0x7f800001u, 1, 0x80000001u, 0x007fffffu, 0x7f7fffffu, 0xff7fffffu,
                                          0x42b17218u, 0xc2aeac50u, 0xc2fc0000u, 0x42fc0000u, 0xc3000000u};
            for (int rep = 0; rep < 3; rep++) // at every position of a vector
                for (size_t i = 0; i < PSV_ARRAY_LEN(sp); i++) x[n++] = f32_from_bits(sp[i]);
            for (int i = 0; i < 1000; i++) x[n++] = st_sym() * 100.0f;
        }
        for (int64_t i = 0; i < n; i++) u[i] = st_sym() * 4.0f;
        for (int64_t off = 0; off < 3; off++) { // also misaligned and with odd tails
            int64_t m = n - off;
            ref->expf(a, x + off, m);
            sk->expf(b, x + off, m);
            for (int64_t i = 0; i < m; i++) bad_exp += !st_same(a[i], b[i]);
            ref->swiglu(a, x + off, u, m);
            sk->swiglu(b, x + off, u, m);
            for (int64_t i = 0; i < m; i++) bad_glu += !st_same(a[i], b[i]);
            checked += m;
            if (pass < 49) break;
        }
    }
    if (exp_todo) { // in place
        for (int i = 0; i < 100; i++) x[i] = a[i] = st_sym() * 20.0f;
        ref->expf(b, x, 100);
        sk->expf(a, a, 100);
        CHECK(memcmp(a, b, 100 * sizeof *a) == 0);
        CHECKF(bad_exp == 0, "%s exp: %lld of %lld differ", k_set_names[set], (long long)bad_exp, (long long)checked);
        CHECKF(bad_glu == 0, "%s swiglu: %lld of %lld differ", k_set_names[set], (long long)bad_glu, (long long)checked);
    }
    // the sampler's exp(x - shift) in double: logits of every size against several shifts (the
    // fast lanes' bounds -708 and 693 on both sides, half-way points of x / ln 2, specials), at
    // every position of a vector and with odd tails
    if (st_vec_unchecked(set, "exp_shift", st_same_exp_shift)) {
        double *ya = malloc(CAP * sizeof *ya), *yb = malloc(CAP * sizeof *yb);
        PSV_ASSERT(ya && yb);
        int64_t n = 0, bad = 0, total = 0;
        for (int i = 0; i < 200000; i++) x[n++] = st_sym() * (i % 4 == 0 ? 800.0f : i % 4 == 1 ? 40.0f : 4.0f);
        for (int i = -2000; i <= 2000; i++) x[n++] = (float)(0.6931471805599453 * (i + 0.5)); // k_x near .5
        for (float v = -709.0f; v <= -707.0f; v += 1.0f / 64) x[n++] = v;
        for (float v = 692.0f; v <= 694.0f; v += 1.0f / 64) x[n++] = v;
        static const uint32_t sp[] = {0, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 1, 0x7f7fffffu, 0xff7fffffu};
        for (size_t i = 0; i < PSV_ARRAY_LEN(sp); i++) x[n++] = f32_from_bits(sp[i]);
        static const double shifts[] = {0.0, 3.5, -2.25, 12.75, 700.0, -700.0, 1e-3};
        static const double divs[] = {1.0, 0.8f, 0.3f, 1.7f, 1e-3f, 1.0, 2.0};  // temperatures
        for (size_t si = 0; si < PSV_ARRAY_LEN(shifts); si++)
            for (int64_t off = 0; off < 4; off++) {
                int64_t m = n - off;
                ref->exp_shift(ya, x + off, shifts[si], divs[si], m);
                sk->exp_shift(yb, x + off, shifts[si], divs[si], m);
                for (int64_t i = 0; i < m; i++) bad += memcmp(&ya[i], &yb[i], sizeof ya[i]) != 0 && !(ya[i] != ya[i] && yb[i] != yb[i]);
                total += m;
            }
        // arguments whose x / ln 2 is exactly half-way (psv_exp rounds those away from zero):
        // shifts found next to (j + 1/2) ln 2, against logits of 0
        int found = 0;
        for (int j = -1000; j < 1000; j += 7) {
            const double c = 1.44269504088896338700;
            const uint64_t mid = f64_bits((j + 0.5) / c);
            for (uint64_t bits = mid - 32; bits <= mid + 32; bits++) { // the doubles around it
                double v = f64_from_bits(bits);
                if (v * c != j + 0.5) continue;
                float z[5] = {0};
                ref->exp_shift(ya, z, -v, 1.0, 5);
                sk->exp_shift(yb, z, -v, 1.0, 5);
                bad += memcmp(ya, yb, 5 * sizeof *ya) != 0;
                found++;
                break;
            }
        }
        CHECKF(found > 50, "%s exp_shift: only %d exact half-way arguments found", k_set_names[set], found);
        CHECKF(bad == 0, "%s exp_shift: %lld of %lld differ", k_set_names[set], (long long)bad, (long long)total);
        free(ya);
        free(yb);
    }
    // attention's products over KV rows: many lengths (tails of every size, long rows), key
    // counts around the kernels' groups of eight, a row stride wider than the rows, values of
    // every magnitude, sometimes non-finite
    static const int64_t lens[] = {1, 3, 8, 15, 16, 17, 31, 32, 40, 64, 80, 96, 100, 128, 256, 512, 528, 1024};
    static const int64_t counts[] = {1, 2, 7, 8, 9, 15, 16, 17, 33, 100};
    int64_t bad_keys = 0, bad_axpy = 0, bad_keys16 = 0, bad_axpy16 = 0, checked_att = 0;
    uint16_t *kh = malloc(CAP * sizeof *kh), *xh = malloc(CAP * sizeof *xh);
    float *kr = malloc(CAP * sizeof *kr), *xr = malloc(CAP * sizeof *xr), *c16 = malloc(CAP * sizeof *c16);
    PSV_ASSERT(kh && xh && kr && xr && c16);
    const bool att_todo = st_vec_unchecked(set, "attention products", st_same_attention);
    for (size_t li = 0; li < PSV_ARRAY_LEN(lens) && att_todo; li++)
        for (size_t ci = 0; ci < PSV_ARRAY_LEN(counts); ci++) {
            int64_t n = lens[li], nk = counts[ci];
            size_t stride = (size_t)n + 8 * (ci % 3);
            PSV_ASSERT(stride * (size_t)nk + (size_t)n <= CAP);
            bool wild = (li + ci) % 7 == 3;
            for (size_t i = 0; i < stride * (size_t)nk; i++) {
                uint64_t r = st_rng() % 64;
                x[i] = st_sym() * (r == 0 ? 1e30f : r == 1 ? 1e-30f : 3.0f);
                if (wild && r == 2) x[i] = f32_from_bits(r & 1 ? 0x7f800000u : 0x7fc00000u);
            }
            // several queries against the same keys (the query heads sharing a KV head), rows
            // q_stride apart, results s_stride apart
            static const int nqs[] = {1, 2, 3, 4, 5, 6, 7, 8};
            const int nq = nqs[(li + ci) % PSV_ARRAY_LEN(nqs)];
            const size_t q_stride = (size_t)n + (size_t)(li % 3), s_stride = (size_t)nk + 1 + (size_t)(ci % 4);
            PSV_ASSERT((size_t)nq * q_stride <= CAP && (size_t)nq * s_stride <= 2048);
            for (size_t i = 0; i < (size_t)nq * q_stride; i++) u[i] = st_sym() * (i % 9 == 0 ? 1e20f : 1.0f);
            if (ci % 2 == 0 && n >= 4) { // order-revealing: pairs of huge products that cancel among small ones
                for (size_t i = 0; i < (size_t)nq * q_stride; i++) u[i] = 1.0f;
                for (int64_t p = 0; p < nk; p++) {
                    float *row = x + (size_t)p * stride;
                    for (int64_t i = 0; i < n; i++) row[i] = st_sym();
                    for (int pair = 0; pair < 2; pair++) {
                        int64_t i = (int64_t)(st_rng() % (uint64_t)n), j = (int64_t)(st_rng() % (uint64_t)n);
                        if (i == j) continue;
                        row[i] = 1e30f;
                        row[j] = -1e30f;
                    }
                }
            }
            // the keys as the KV cache holds them: blocks of K_KEY_BLOCK positions, value by value,
            // bstride apart; the unused positions of the last block are NaN (read, never used)
            const size_t bstride = (size_t)n * K_KEY_BLOCK + 8 * (ci % 3);
            const int64_t nblk = (nk + K_KEY_BLOCK - 1) / K_KEY_BLOCK;
            PSV_ASSERT((size_t)nblk * bstride <= CAP);
            for (size_t i = 0; i < (size_t)nblk * bstride; i++) kb[i] = f32_from_bits(0x7fc00000u);
            for (int64_t p = 0; p < nk; p++)
                for (int64_t i = 0; i < n; i++)
                    kb[(size_t)(p / K_KEY_BLOCK) * bstride + (size_t)i * K_KEY_BLOCK + (size_t)(p % K_KEY_BLOCK)] = x[(size_t)p * stride + (size_t)i];
            for (size_t i = 0; i < (size_t)nq * s_stride; i++) a[i] = b[i] = -7.0f; // nothing else written
            ref->dot_keys(a, s_stride, u, q_stride, nq, kb, bstride, nk, n);
            sk->dot_keys(b, s_stride, u, q_stride, nq, kb, bstride, nk, n);
            // the reference against the vec_dot of each key row (the layout changes nothing)
            for (int g = 0; g < nq; g++)
                for (int64_t p = 0; p < nk; p++) {
                    float want;
                    k_traits_ref(T_F32)->vec_dot(n, &want, x + (size_t)p * stride, u + (size_t)g * q_stride);
                    bad_keys += !st_same(want, a[(size_t)g * s_stride + (size_t)p]);
                }
            for (size_t i = 0; i < (size_t)nq * s_stride; i++) bad_keys += !st_same(a[i], b[i]);
            // weights: softmax-like in [0, 1], and some of any size
            float *w = a + 2048;
            for (int64_t p = 0; p < nk; p++) w[p] = (p % 5 == 4) ? st_sym() * 1e10f : st_unit();
            // the same nq queries' weights (rows s_stride apart, in a), outputs y_stride apart
            for (int g = 1; g < nq; g++)
                for (int64_t p = 0; p < nk; p++) a[(size_t)g * s_stride + (size_t)p] = (p + g) % 5 == 4 ? st_sym() * 1e10f : st_unit();
            for (int64_t p = 0; p < nk; p++) a[p] = w[p];
            const size_t y_stride = (size_t)n + (size_t)(ci % 3);
            PSV_ASSERT((size_t)nq * y_stride <= 16384);
            float *ya = b + 4096, *yb = b + 4096 + 16384;
            for (size_t i = 0; i < (size_t)nq * y_stride; i++) ya[i] = yb[i] = st_sym();
            ref->axpy_rows(ya, y_stride, a, s_stride, nq, x, stride, nk, n);
            sk->axpy_rows(yb, y_stride, a, s_stride, nq, x, stride, nk, n);
            for (size_t i = 0; i < (size_t)nq * y_stride; i++) bad_axpy += !st_same(ya[i], yb[i]);
            // the same over an F16 cache, holding the halves of these keys and value rows: the
            // reference's F16 kernels give the F32 ones' results on the halves' floats (kr, xr),
            // and every set's give the reference's
            for (size_t i = 0; i < (size_t)nblk * bstride; i++) kh[i] = psv_f32_to_fp16(kb[i]), kr[i] = psv_fp16_to_f32(kh[i]);
            for (size_t i = 0; i < stride * (size_t)nk; i++) xh[i] = psv_f32_to_fp16(x[i]), xr[i] = psv_fp16_to_f32(xh[i]);
            float *s1 = c16, *s2 = c16 + 2048, *s3 = c16 + 4096;
            for (size_t i = 0; i < (size_t)nq * s_stride; i++) s1[i] = s2[i] = s3[i] = -7.0f;
            ref->dot_keys(s1, s_stride, u, q_stride, nq, kr, bstride, nk, n);
            ref->dot_keys_f16(s2, s_stride, u, q_stride, nq, kh, bstride, nk, n);
            sk->dot_keys_f16(s3, s_stride, u, q_stride, nq, kh, bstride, nk, n);
            for (size_t i = 0; i < (size_t)nq * s_stride; i++) bad_keys16 += !st_same(s1[i], s2[i]) || !st_same(s2[i], s3[i]);
            float *y1 = c16 + 8192, *y2 = y1 + 16384, *y3 = y2 + 16384;
            for (size_t i = 0; i < (size_t)nq * y_stride; i++) y1[i] = y2[i] = y3[i] = st_sym();
            ref->axpy_rows(y1, y_stride, a, s_stride, nq, xr, stride, nk, n);
            ref->axpy_rows_f16(y2, y_stride, a, s_stride, nq, xh, stride, nk, n);
            sk->axpy_rows_f16(y3, y_stride, a, s_stride, nq, xh, stride, nk, n);
            for (size_t i = 0; i < (size_t)nq * y_stride; i++) bad_axpy16 += !st_same(y1[i], y2[i]) || !st_same(y2[i], y3[i]);
            checked_att += nq * nk + n;
        }
    if (att_todo) { // nothing written beyond the n values of y
        for (int i = 0; i < 16; i++) a[i] = b[i] = -7.0f;
        x[0] = 1.0f;
        xh[0] = psv_f32_to_fp16(1.0f);
        float w1 = 1.0f;
        sk->axpy_rows(a, 16, &w1, 1, 1, x, 5, 1, 5);
        sk->axpy_rows_f16(b, 16, &w1, 1, 1, xh, 5, 1, 5);
        for (int i = 5; i < 16; i++) CHECK(a[i] == -7.0f && b[i] == -7.0f);
        CHECKF(bad_keys == 0 && bad_axpy == 0, "%s attention products: %lld dot_keys and %lld axpy_rows of %lld differ",
               k_set_names[set], (long long)bad_keys, (long long)bad_axpy, (long long)checked_att);
        CHECKF(bad_keys16 == 0 && bad_axpy16 == 0,
               "%s attention products over halves: %lld dot_keys_f16 and %lld axpy_rows_f16 of %lld differ",
               k_set_names[set], (long long)bad_keys16, (long long)bad_axpy16, (long long)checked_att);
    }
    if (st_vec_unchecked(set, "softmax", st_same_softmax)) { // attention's softmax: lengths around the vectors of 8, scores of ordinary size, with a
      // spread that underflows exp (its slow lanes), or with infinities, NaNs and ties
        static const int64_t lens2[] = {1, 2, 7, 8, 9, 15, 16, 17, 63, 64, 65, 100, 257, 1000};
        int64_t bad_sm = 0, checked_sm = 0;
        for (size_t li = 0; li < PSV_ARRAY_LEN(lens2); li++)
            for (int kind = 0; kind < 5; kind++) {
                int64_t n = lens2[li];
                for (int64_t p = 0; p < n; p++) {
                    float v = st_sym() * 8.0f;
                    uint64_t r = st_rng() % 16;
                    if (kind == 1) v = st_sym() * (r < 8 ? 300.0f : 3000.0f); // exp of the differences underflows, or is cut
                    if (kind == 2 && r == 0) v = f32_from_bits(0xff800000u);
                    if (kind == 3 && r == 1) v = f32_from_bits(0x7fc00000u);
                    if (kind == 3 && r == 2) v = f32_from_bits(0x7f800000u);
                    if (kind == 4) v = (r % 2) ? 0.0f : -0.0f; // all ties, zeros of both signs
                    a[p] = b[p] = v;
                }
                float scale = kind == 0 ? 0.125f : 0.0883883f;
                ref->softmax(a, n, scale);
                sk->softmax(b, n, scale);
                for (int64_t p = 0; p < n; p++) {
                    bad_sm += !st_same(a[p], b[p]);
                    // no weight is a subnormal float (they are +0 instead)
                    bad_sm += a[p] != 0.0f && psv_fabsf(a[p]) < 0x1p-126f;
                    bad_sm += a[p] == 0.0f && f32_bits(a[p]) != 0;
                }
                checked_sm += n;
            }
        { // scores more than 86.5 below the largest weigh exactly +0, and the others as before
            float w2[9] = {0, 3.0f - 86.4f, 3.0f - 86.6f, -87.5f, -100, -200, 3, -1000, 2};
            for (int i = 0; i < 9; i++) a[i] = b[i] = w2[i];
            ref->softmax(a, 9, 1.0f);
            sk->softmax(b, 9, 1.0f);
            double l2[K_SOFTMAX_LANES] = {0}, s2;
            float e2[9];
            for (int p = 0; p < 9; p++) {
                const float d = w2[p] - 3.0f;
                l2[p % K_SOFTMAX_LANES] += (double)(e2[p] = d < -86.5f ? 0.0f : psv_expf_poly(d));
            }
            s2 = l2[0];
            for (int l = 1; l < K_SOFTMAX_LANES; l++) s2 += l2[l];
            for (int p = 0; p < 9; p++) {
                const float want = e2[p] * (float)(1.0 / s2);
                CHECK(a[p] == (psv_fabsf(want) < 0x1p-126f ? 0.0f : want) && f32_bits(a[p]) == f32_bits(b[p]));
            }
            CHECK(a[1] > 0.0f && a[2] == 0.0f && a[4] == 0.0f && f32_bits(a[7]) == 0);
            // a weight not cut whose share of a larger sum falls below 2^-126: +0 too
            float w3[9] = {0, 0, 0, -86.4f, 0, 0, 0, 0, -86.4f};
            for (int i = 0; i < 9; i++) a[i] = b[i] = w3[i];
            ref->softmax(a, 9, 1.0f);
            sk->softmax(b, 9, 1.0f);
            CHECK(f32_bits(a[3]) == 0 && f32_bits(b[3]) == 0 && f32_bits(a[8]) == 0 && f32_bits(b[8]) == 0);
            CHECK(memcmp(a, b, 9 * sizeof *a) == 0 && a[0] > 0.1f);
        }
        // the reference is the formula: the sum in its lanes
        float w[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
        ref->softmax(w, 10, 1.0f);
        double lane[K_SOFTMAX_LANES] = {0}, sum;
        float e[10];
        for (int p = 0; p < 10; p++) lane[p % K_SOFTMAX_LANES] += (double)(e[p] = psv_expf_poly((float)(p + 1) - 10.0f));
        sum = lane[0];
        for (int l = 1; l < K_SOFTMAX_LANES; l++) sum += lane[l];
        for (int p = 0; p < 10; p++) CHECK(w[p] == e[p] * (float)(1.0 / sum));
        CHECKF(bad_sm == 0, "%s softmax: %lld of %lld weights differ", k_set_names[set], (long long)bad_sm, (long long)checked_sm);
    }
    // the reference is the engine's formula
    float g = 1.5f, uu = -2.0f, r;
    ref->swiglu(&r, &g, &uu, 1);
    CHECK(r == g / (1.0f + psv_expf_poly(0.0f - g)) * uu);
    free(x);
    free(u);
    free(a);
    free(b);
    free(kb);
    free(kh);
    free(xh);
    free(kr);
    free(xr);
    free(c16);
}

// ---- dispatch ----------------------------------------------------------------------------------

static void test_choose(void) {
    plat_cpu none, v3, v4;
    memset(&none, 0, sizeof none);
    v3 = none;
    v3.detected = v3.avx = v3.avx2 = v3.fma = v3.f16c = true;
    v4 = v3;
    v4.avx512f = v4.avx512bw = v4.avx512vl = v4.avx512vnni = true;
    plat_cpu v4_no_vnni = v4;
    v4_no_vnni.avx512vnni = false;
    plat_cpu v3_vnni = v3, v4_avxvnni = v4; // Alder Lake and on; Sapphire Rapids
    v3_vnni.avxvnni = v4_avxvnni.avxvnni = true;
    plat_cpu arm = none, arm_dp;
    arm.detected = arm.neon = true;
    arm_dp = arm;
    arm_dp.dotprod = true;
    plat_cpu arm_mm = arm_dp, arm_mm_only = arm;
    arm_mm.i8mm = arm_mm_only.i8mm = true;
    char note[160];
    struct { const char *req; const plat_cpu *cpu; k_set want; bool note; } cases[] = {
        {NULL, &none, K_SET_REF, false},     {"", &none, K_SET_REF, false},
        {"auto", &none, K_SET_REF, false},   {"ref", &none, K_SET_REF, false},
        {"avx2", &none, K_SET_REF, true},    {"avx512", &none, K_SET_REF, true},
        {"bogus", &none, K_SET_REF, true},
#if defined(PSV_X86_KERNELS)
        {NULL, &v3, K_SET_AVX2, false},      {"ref", &v3, K_SET_REF, false},
        {"avx2", &v3, K_SET_AVX2, false},    {"avx512", &v3, K_SET_AVX2, true},
        {NULL, &v4, K_SET_AVX512, false},    {"auto", &v4, K_SET_AVX512, false},
        {"ref", &v4, K_SET_REF, false},      {"avx2", &v4, K_SET_AVX2, false},
        {"avx512", &v4, K_SET_AVX512, false}, {"AVX512", &v4, K_SET_AVX512, true},
        {"neon", &v4, K_SET_AVX512, true},   {NULL, &v4_no_vnni, K_SET_AVX2, false},
        {"avx512", &v4_no_vnni, K_SET_AVX2, true}, {"dotprod", &v4, K_SET_AVX512, true},
        {"i8mm", &v4, K_SET_AVX512, true},   {NULL, &arm_mm, K_SET_REF, false},
        {NULL, &v3_vnni, K_SET_AVXVNNI, false}, {"avx2", &v3_vnni, K_SET_AVX2, false},
        {"avxvnni", &v3_vnni, K_SET_AVXVNNI, false}, {"avxvnni", &v3, K_SET_AVX2, true},
#if defined(PSV_VNNI_EVEX) // (the avxvnni set runs on AVX512-VNNI CPUs in such a build)
        {"avxvnni", &v4, K_SET_AVXVNNI, false}, {NULL, &v4_avxvnni, K_SET_AVX512, false},
#else
        {"avxvnni", &v4, K_SET_AVX512, true}, {NULL, &v4_avxvnni, K_SET_AVX512, false},
#endif
        {"avxvnni", &v4_avxvnni, K_SET_AVXVNNI, false}, {"avx512", &v3_vnni, K_SET_AVXVNNI, true},
#elif defined(PSV_ARM64_KERNELS)
        {NULL, &arm, K_SET_NEON, false},     {NULL, &arm_dp, K_SET_DOTPROD, false},
        {"auto", &arm_dp, K_SET_DOTPROD, false}, {"neon", &arm_dp, K_SET_NEON, false},
        {"ref", &arm_dp, K_SET_REF, false},  {"dotprod", &arm_dp, K_SET_DOTPROD, false},
        {"dotprod", &arm, K_SET_NEON, true}, {"avx512", &v4_no_vnni, K_SET_REF, true},
        {NULL, &arm_mm, K_SET_I8MM, false},  {"dotprod", &arm_mm, K_SET_DOTPROD, false},
        {"i8mm", &arm_dp, K_SET_DOTPROD, true}, {NULL, &arm_mm_only, K_SET_NEON, false},
        {"i8mm", &arm_mm_only, K_SET_NEON, true}, {NULL, &v4, K_SET_REF, false},
        {"avxvnni", &v3_vnni, K_SET_REF, true}, {NULL, &v4_avxvnni, K_SET_REF, false},
#else
        {NULL, &v4, K_SET_REF, false},       {"avx2", &v4, K_SET_REF, true},
        {"avxvnni", &v4_avxvnni, K_SET_REF, true}, {NULL, &v3_vnni, K_SET_REF, false},
        {"avx512", &v4_no_vnni, K_SET_REF, true}, {NULL, &arm_dp, K_SET_REF, false},
        {NULL, &arm_mm, K_SET_REF, false},   {NULL, &arm_mm_only, K_SET_REF, false},
#endif
    };
    for (size_t i = 0; i < PSV_ARRAY_LEN(cases); i++) {
        k_set got = k_set_choose(cases[i].req, cases[i].cpu, note, sizeof note);
        CHECKF(got == cases[i].want && (note[0] != 0) == cases[i].note, "case %zu (%s): got %s, note '%s'", i,
               cases[i].req ? cases[i].req : "(unset)", k_set_names[got], note);
        if (cases[i].note) CHECKF(strstr(note, k_set_names[cases[i].want]) != NULL, "note names the set used: %s", note);
    }
    // the active set is what PSV_KERNELS and this CPU make of it
    k_set want = k_set_choose(getenv("PSV_KERNELS"), plat_cpu_get(), note, sizeof note);
    CHECK(!strcmp(k_kernel_set_name(), k_set_names[want]));
    CHECK((k_kernel_set_note() != NULL) == (note[0] != 0));
    for (uint32_t t = 0; t < T_COUNT; t++) {
        CHECK((k_traits_get(t) == NULL) == (k_traits_ref(t) == NULL));
        if (k_traits_get(t)) CHECK(k_traits_get(t) == k_traits_of_set(want, t));
    }
    CHECK(k_traits_of_set(K_SET_REF, T_Q4_0)->vec_dot == k_dot_q4_0_q8_0_ref);
    CHECK(k_traits_of_set(K_SET_COUNT, T_Q4_0) == NULL && k_traits_get(T_COUNT) == NULL && k_traits_get(T_IQ2_XXS) == NULL);
#if defined(PSV_X86_KERNELS)
    // generation's prefetch distances on Zen 3 and 4 (AMD family 25) and elsewhere, each this
    // CPU's as its function says once the sets are set up: every row's (k_gemv1_pf), the AVX-512
    // kernels' into the level-1 cache (k_gemv1_pf_l1: none elsewhere), and in rows too long for
    // that cache (k_gemv1_pf_long: elsewhere the same as every row's); a step of more than
    // K_GEMV1_L1_FIT bytes takes the last
    plat_cpu zen4 = v4, zen5 = v4, intel = v4, amd_old = v4;
    zen4.amd = zen5.amd = amd_old.amd = true;
    zen4.family = 25, zen5.family = 26, amd_old.family = 23;
    const struct { size_t (*fn)(const plat_cpu *); size_t zen4, other, now; } dists[] = {
        {k_gemv1_pf_for, 1024, 2048, k_gemv1_pf}, {k_gemv1_pf_l1_for, 384, 0, k_gemv1_pf_l1},
        {k_gemv1_pf_long_for, 3072, 2048, k_gemv1_pf_long}};
    for (size_t i = 0; i < PSV_ARRAY_LEN(dists); i++) {
        intel.family = 6;
        CHECKF(dists[i].fn(&zen4) == dists[i].zen4 && dists[i].fn(&zen5) == dists[i].other &&
                   dists[i].fn(&intel) == dists[i].other && dists[i].fn(&amd_old) == dists[i].other,
               "prefetch distance %zu", i);
        intel.family = 25; // an Intel CPU of that family number would not be a Zen
        CHECK(dists[i].fn(&intel) == dists[i].other);
        CHECK(dists[i].now == dists[i].fn(plat_cpu_get()));
    }
    CHECK(k_gemv1_step(1000, 3, 200) == 4600 && K_GEMV1_L1_FIT == 26624);
    CHECK(k_gemv1_pf_step(K_GEMV1_L1_FIT) == k_gemv1_pf && k_gemv1_pf_step(K_GEMV1_L1_FIT + 1) == k_gemv1_pf_long);
    // phi4-mini's Q4_K rows of 3072 values stay under the line, its feed-forward output's of 8192 go over
    CHECK(k_gemv1_step(1728, 1, 384 * 12) <= K_GEMV1_L1_FIT && k_gemv1_step(4608, 1, 384 * 32) > K_GEMV1_L1_FIT);
    // the one-row Q4_K and Q5_K kernels: VBMI's scale picks where the CPU has them, with Zen 4's
    // prefetches as constants there (the other CPUs' distance stays k_gemv1_pf's)
    plat_cpu zen4_vbmi = zen4, intel_vbmi = intel;
    zen4_vbmi.avx512vbmi = intel_vbmi.avx512vbmi = true;
    intel.family = intel_vbmi.family = 6;
    CHECK(k_gemv1_q45_k_for(T_Q4_K, &v4) == k_gemv1_q4_k_avx512 && k_gemv1_q45_k_for(T_Q5_K, &v4) == k_gemv1_q5_k_avx512);
    CHECK(k_gemv1_q45_k_for(T_Q4_K, &zen4) == k_gemv1_q4_k_avx512 && k_gemv1_q45_k_for(T_Q4_K, &intel) == k_gemv1_q4_k_avx512);
    CHECK(k_gemv1_q45_k_for(T_Q4_K, &zen4_vbmi) == k_gemv1_q4_k_vbmi_zen4 && k_gemv1_q45_k_for(T_Q5_K, &zen4_vbmi) == k_gemv1_q5_k_vbmi_zen4);
    CHECK(k_gemv1_q45_k_for(T_Q4_K, &intel_vbmi) == k_gemv1_q4_k_vbmi && k_gemv1_q45_k_for(T_Q5_K, &intel_vbmi) == k_gemv1_q5_k_vbmi);
    CHECK(k_traits_of_set(K_SET_AVX512, T_Q4_K)->gemv1 == k_gemv1_q45_k_for(T_Q4_K, plat_cpu_get()) &&
          k_traits_of_set(K_SET_AVX512, T_Q5_K)->gemv1 == k_gemv1_q45_k_for(T_Q5_K, plat_cpu_get()));
    // and their gemvn kernels: Q4_K's the same way, Q5_K's the first form everywhere
    CHECK(k_gemvn_q45_k_for(T_Q4_K, &v4) == k_gemvn_q4_k_avx512 && k_gemvn_q45_k_for(T_Q5_K, &zen4) == k_gemvn_q5_k_avx512);
    CHECK(k_gemvn_q45_k_for(T_Q4_K, &zen4_vbmi) == k_gemvn_q4_k_vbmi_zen4 && k_gemvn_q45_k_for(T_Q5_K, &zen4_vbmi) == k_gemvn_q5_k_avx512);
    CHECK(k_gemvn_q45_k_for(T_Q4_K, &intel_vbmi) == k_gemvn_q4_k_vbmi && k_gemvn_q45_k_for(T_Q5_K, &intel_vbmi) == k_gemvn_q5_k_avx512);
    CHECK(k_traits_of_set(K_SET_AVX512, T_Q4_K)->gemvn == k_gemvn_q45_k_for(T_Q4_K, plat_cpu_get()) &&
          k_traits_of_set(K_SET_AVX512, T_Q5_K)->gemvn == k_gemvn_q45_k_for(T_Q5_K, plat_cpu_get()));
    // AVX512_VBMI as cpuid leaf 7 says it (ECX bit 1), and only with AVX-512's state saved
    {
        unsigned a = 0, b = 0, cx = 0, d = 0;
        bool vbmi = false;
        if (__get_cpuid_max(0, NULL) >= 7) {
            __cpuid_count(7, 0, a, b, cx, d);
            vbmi = (cx >> 1) & 1;
        }
        CHECK(plat_cpu_get()->avx512vbmi == (vbmi && plat_cpu_get()->avx512f));
        PSV_UNUSED(a), PSV_UNUSED(b), PSV_UNUSED(d);
    }
    // the vendor and family detected, against what Linux reports
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) {
        SKIP("no /proc/cpuinfo: the CPU's vendor and family are not cross-checked");
    } else {
        char line[512], vendor[64] = "";
        int family = -1;
        while (fgets(line, sizeof line, f) && (family < 0 || !vendor[0])) {
            if (!strncmp(line, "vendor_id", 9) && strchr(line, ':')) sscanf(strchr(line, ':') + 1, "%63s", vendor);
            if (!strncmp(line, "cpu family", 10) && strchr(line, ':')) family = atoi(strchr(line, ':') + 1);
        }
        fclose(f);
        CHECKF(plat_cpu_get()->family == family && plat_cpu_get()->amd == !strcmp(vendor, "AuthenticAMD"),
               "detected %s family %d; /proc/cpuinfo: %s family %d", plat_cpu_get()->amd ? "AMD" : "not AMD",
               plat_cpu_get()->family, vendor, family);
    }
#endif
    printf("cpu: best kernel set %s; active %s%s%s\n", k_set_names[k_set_best(plat_cpu_get())], k_kernel_set_name(),
           k_kernel_set_note() ? " — " : "", k_kernel_set_note() ? k_kernel_set_note() : "");
}

int main(void) {
    test_choose();
    const plat_cpu *cpu = plat_cpu_get();
    for (int s = K_SET_REF + 1; s < K_SET_COUNT; s++) {
        if (!k_set_supported((k_set)s, cpu)) {
            SKIP("kernel set %s: not supported by this CPU/build", k_set_names[s]);
            continue;
        }
        if (!st_set_checked((k_set)s)) {
            SKIP("kernel set %s: not among PSV_TEST_SETS (%s)", k_set_names[s], getenv("PSV_TEST_SETS"));
            continue;
        }
        st_check_dots((k_set)s);
        st_check_gemm((k_set)s);
        st_check_gemm_bf16_edges((k_set)s);
        st_check_gemv((k_set)s);
        st_check_gemv1((k_set)s);
        st_check_gemvn((k_set)s);
        st_check_quantizers((k_set)s);
        st_check_vec((k_set)s);
    }
    // the reference set through the same harness (its multi-row path is k_dot_rows' fallback)
    st_check_dots(K_SET_REF);
    return t_finish();
}

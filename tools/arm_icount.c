// Counts the instructions of a kernel set's products, for the ARM sets, where no ARM machine is at
// hand: tools/arm_icount.sh builds this for aarch64 and runs it under qemu, one instruction a
// translation block with each block's execution logged, and takes the difference between a run
// that makes the product twice and one that makes it once: one product, on rows of N values, NW
// weight rows against NR activation rows, as the engine calls the kernels (vec_dot one row by one
// row, where a set has no other kernel; vec_dot_rows and gemv four
// activation rows a call, then two; gemm as many as it takes, its panel packed before; gemv1 one). Weights and
// activations are random values through the reference quantizers. Every result is checked
// against the reference vec_dot, so a count is never of wrong code.
//
//   arm_icount MODE TYPE SET REPS    MODE: dot, rows, gemv, gemv1, gemm, pack; TYPE: a weight type (q4_0,
//                                    q4_k, f16, ...); SET: neon, dotprod, i8mm; REPS: 1 or 2
// Exit status 3: the set has no such kernel for the type.
#define PSV_NO_MAIN
#include "pensieve.c"

enum { N = 1024, NW = 8, NR = 6 };

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: arm_icount dot|rows|gemv|gemv1|gemm|pack TYPE neon|dotprod|i8mm REPS\n");
        return 2;
    }
    const char *mode = argv[1];
    uint32_t wt = T_COUNT;
    for (uint32_t t = 0; t < T_COUNT; t++) {
        const char *a = argv[2], *b = type_table[t].name;
        while (b && *a && (*a == *b || *a - 'a' + 'A' == *b)) a++, b++;
        if (b && *a == 0 && *b == 0) wt = t;
    }
    k_set set = K_SET_COUNT;
    for (int s = 0; s < K_SET_COUNT; s++)
        if (strcmp(argv[3], k_set_names[s]) == 0) set = (k_set)s;
    if (wt == T_COUNT || !k_traits_ref(wt) || !k_traits_ref(wt)->vec_dot || set == K_SET_COUNT ||
        !k_set_supported(set, plat_cpu_get())) {
        fprintf(stderr, "arm_icount: no weight type %s or kernel set %s here\n", argv[2], argv[3]);
        return 2;
    }
    const k_traits *ref = k_traits_ref(wt), *sk = k_traits_of_set(set, wt);
    const uint32_t at = ref->vec_dot_type;
    uint64_t xs = 0, ys = 0;
    PSV_ASSERT(type_row_size(wt, N, &xs) && type_row_size(at, N, &ys));
    const size_t ss = k_act_side_stride(sk, N, true);
    uint8_t *x = malloc(xs * NW), *y = malloc(ys * NR), *side = malloc(ss * NR), *side1 = malloc(k_act_side_one(at, N)), *panel = NULL;
    float *v = malloc(sizeof(float) * N);
    PSV_ASSERT(x && y && side && side1 && v);
    uint64_t r = 88172645463325252ull;
    for (int t = 0; t < NW + NR; t++) {
        for (int i = 0; i < N; i++) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            v[i] = (float)((int)(r % 2001) - 1000) / 1000.0f;
        }
        if (t < NW) ref->from_float(v, x + (size_t)t * xs, N);
        else {
            k_traits_ref(at)->from_float(v, y + (size_t)(t - NW) * ys, N);
            k_act_side(at, k_panel_off(wt), y + (size_t)(t - NW) * ys, N, side + (size_t)(t - NW) * ss, false);
            if (t == NW) k_act_side(at, k_panel_off(wt), y, N, side1, true); // (gemv1's)
        }
    }
    float res[NR][NW], *out[NR];
    for (int t = 0; t < NR; t++) out[t] = res[t];
    const int reps = atoi(argv[4]);
    int nr = NR;
    if (strcmp(mode, "pack") == 0 && sk->pack) {
        PSV_ASSERT((panel = malloc(k_panel_bytes(sk, wt, N))));
        for (int k = 0; k < reps; k++) sk->pack(N, x, xs, NW, panel);
        return 0;
    } else if (strcmp(mode, "dot") == 0 && sk->vec_dot) {
        for (int k = 0; k < reps; k++)
            for (int w = 0; w < NW; w++)
                for (int t = 0; t < NR; t++) sk->vec_dot(N, &res[t][w], x + (size_t)w * xs, y + (size_t)t * ys);
    } else if (strcmp(mode, "rows") == 0 && sk->vec_dot_rows) {
        for (int k = 0; k < reps; k++)
            for (int w = 0; w < NW; w++) {
                sk->vec_dot_rows(N, &res[0][w], NW, x + (size_t)w * xs, y, ys, 4);
                sk->vec_dot_rows(N, &res[4][w], NW, x + (size_t)w * xs, y + 4 * ys, ys, 2);
            }
    } else if (strcmp(mode, "gemv") == 0 && sk->gemv) {
        for (int k = 0; k < reps; k++)
            for (int w = 0; w < NW; w++) {
                sk->gemv(N, &res[0][w], NW, x + (size_t)w * xs, y, ys, side, ss, 4);
                sk->gemv(N, &res[4][w], NW, x + (size_t)w * xs, y + 4 * ys, ys, side + 4 * ss, ss, 2);
            }
    } else if (strcmp(mode, "gemv1") == 0 && sk->gemv1) {
        for (int k = 0; k < reps; k++) sk->gemv1(N, res[0], x, xs, NW, 0, k_gemv1_groups(NW), y, side1);
        nr = 1;
    } else if (strcmp(mode, "gemm") == 0 && sk->gemm && !sk->act_vnni && sk->panel_rows == NW) {
        PSV_ASSERT((panel = malloc(k_panel_bytes(sk, wt, N))));
        sk->pack(N, x, xs, NW, panel);
        for (int k = 0; k < reps; k++)
            for (int t = 0; t < NR; t += sk->gemm_rows) // (calls of the kernel's rows, the last one shorter)
                sk->gemm(N, panel, y + (size_t)t * ys, ys, side + (size_t)t * ss, ss, PSV_MIN(sk->gemm_rows, NR - t), out + t, NW, NULL);
    } else {
        return 3;
    }
    for (int t = 0; t < nr; t++)
        for (int w = 0; w < NW; w++) {
            float want;
            ref->vec_dot(N, &want, x + (size_t)w * xs, y + (size_t)t * ys);
            if (memcmp(&want, &res[t][w], sizeof want) != 0) {
                fprintf(stderr, "arm_icount: %s %s row %d x %d: %.9g, the reference %.9g\n", mode, argv[2], w, t, res[t][w], want);
                return 1;
            }
        }
    return 0;
}

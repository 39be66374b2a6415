// tools/llama_logits.c: teacher-forced logits from llama.cpp, for tools/llama_compare.py.
// Built by that script against the llama.cpp it sets up (llama.h); not part of pensieve.
//
//   llama_logits MODEL THREADS MODE PROMPT_IDS [GEN_IDS]
//   llama_logits MODEL THREADS bench PROMPTS GEN REPS
//
// Prints one JSON line per evaluated position, as `pensieve logits` does:
// {"pos":i,"lse":x,"top":[[id,logit],...]} with the 50 highest logits. The context is 512
// tokens with an F32 KV cache and flash attention off (the reference contract's settings).
// MODE: "ref" evaluates the prompt in one batch and then each generated id but the last one by
// one (how shared/reference was produced); "batch" evaluates everything in one batch; "one"
// evaluates every token alone.
//
// "bench" times what llama-bench times, for the llama.cpp builds that come without it (the
// prebuilt CPU libraries tools/llama_compare.py links this program against): for each prompt
// length in PROMPTS (comma-separated; 0 for none) a prompt of that many tokens in one batch,
// and GEN tokens generated one at a time (0 for none), each from an empty cache, REPS times
// after one warm-up, printing llama-bench's JSON (n_prompt, n_gen, n_threads, avg_ts).
#include "llama.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_IDS 4096
#define TOP 50

static int parse_ids(const char *s, llama_token *out) {
    int n = 0;
    while (*s && n < MAX_IDS) {
        out[n++] = (llama_token)atoi(s);
        while (*s && *s != ',') s++;
        if (*s) s++;
    }
    return n;
}

static void print_row(const float *l, int nv, int pos) {
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < nv; i++) mx = l[i] > mx ? l[i] : mx;
    for (int i = 0; i < nv; i++) sum += exp(l[i] - mx);
    int top[TOP], k = 0;
    for (; k < TOP && k < nv; k++) { // selection; vocabularies here are small enough
        int best = -1;
        for (int i = 0; i < nv; i++) {
            int taken = 0;
            for (int j = 0; j < k && !taken; j++) taken = top[j] == i;
            if (!taken && (best < 0 || l[i] > l[best])) best = i;
        }
        top[k] = best;
    }
    printf("{\"pos\":%d,\"lse\":%.6f,\"top\":[", pos, mx + log(sum));
    for (int j = 0; j < k; j++) printf("%s[%d,%.6f]", j ? "," : "", top[j], l[top[j]]);
    printf("]}\n");
}

static void quiet(enum ggml_log_level level, const char *text, void *ud) {
    (void)level, (void)text, (void)ud;
}

// Evaluate ids[lo..hi) as one batch at positions lo.., printing every position's logits.
static int eval(struct llama_context *c, struct llama_batch *b, const llama_token *ids, int lo, int hi, int nv) {
    b->n_tokens = hi - lo;
    for (int i = lo; i < hi; i++) {
        int j = i - lo;
        b->token[j] = ids[i], b->pos[j] = i, b->n_seq_id[j] = 1, b->seq_id[j][0] = 0, b->logits[j] = 1;
    }
    if (llama_decode(c, *b)) return fprintf(stderr, "llama_logits: llama_decode failed at %d\n", lo), 1;
    for (int i = lo; i < hi; i++) print_row(llama_get_logits_ith(c, i - lo), nv, i);
    return 0;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// Tokens/s of one test: np prompt tokens in one batch, or ng tokens one at a time.
static double bench_one(struct llama_context *c, struct llama_batch *b, int np, int ng, int nv) {
    llama_memory_clear(llama_get_memory(c), 1);
    double t0 = now();
    int n = np ? np : ng;
    for (int i = 0; i < n; i += np ? np : 1) {
        b->n_tokens = np ? np : 1;
        for (int j = 0; j < b->n_tokens; j++) // llama-bench's tokens: random ids of the vocabulary
            b->token[j] = rand() % nv, b->pos[j] = i + j, b->n_seq_id[j] = 1, b->seq_id[j][0] = 0,
            b->logits[j] = j == b->n_tokens - 1;
        if (llama_decode(c, *b)) return fprintf(stderr, "llama_logits: llama_decode failed\n"), -1;
    }
    llama_synchronize(c);
    return n / (now() - t0);
}

static int bench(struct llama_model *m, int threads, const char *prompts, int ng, int reps) {
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 1024;
    cp.n_batch = cp.n_ubatch = 512;
    cp.n_threads = cp.n_threads_batch = threads;
    struct llama_context *c = llama_init_from_model(m, cp);
    if (!c) return fprintf(stderr, "llama_logits: no context\n"), 1;
    static llama_token lens[MAX_IDS]; // the prompt lengths, as parse_ids reads a list
    int nv = llama_vocab_n_tokens(llama_model_get_vocab(m)), tests[17], nt = 0, nl = parse_ids(prompts, lens);
    for (int i = 0; i < nl && nt < 16; i++)
        if (lens[i] > 0 && lens[i] <= 512) tests[nt++] = lens[i];
    if (ng > 0 && ng <= 512) tests[nt++] = -ng;
    struct llama_batch b = llama_batch_init(512, 0, 1);
    printf("[");
    for (int k = 0; k < nt; k++) {
        int np = tests[k] > 0 ? tests[k] : 0, g = tests[k] < 0 ? -tests[k] : 0;
        double sum = 0;
        for (int r = -1; r < reps; r++) {
            double ts = bench_one(c, &b, np, g, nv);
            if (ts < 0) return 1;
            if (r >= 0) sum += ts;
        }
        printf("%s{\"n_prompt\": %d, \"n_gen\": %d, \"n_threads\": %d, \"avg_ts\": %.3f}", k ? ", " : "", np, g,
               threads, sum / reps);
    }
    printf("]\n");
    llama_batch_free(b);
    llama_free(c);
    return 0;
}

int main(int argc, char **argv) {
    const int bench_mode = argc == 7 && !strcmp(argv[3], "bench");
    if (argc < 5 || (!strcmp(argv[3], "bench") && !bench_mode))
        return fprintf(stderr, "usage: llama_logits MODEL THREADS ref|batch|one PROMPT_IDS [GEN_IDS]\n"
                               "       llama_logits MODEL THREADS bench PROMPTS GEN REPS\n"), 2;
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model *m = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (!m) return fprintf(stderr, "llama_logits: cannot load %s\n", argv[1]), 1;
    if (bench_mode) {
        int rc = bench(m, atoi(argv[2]), argv[4], atoi(argv[5]), atoi(argv[6]) > 0 ? atoi(argv[6]) : 1);
        llama_model_free(m);
        return rc;
    }
    static llama_token ids[2 * MAX_IDS];
    int np = parse_ids(argv[4], ids), ng = argc > 5 ? parse_ids(argv[5], ids + np) : 0;
    int n = np + (ng > 0 ? ng - 1 : 0); // the last generated id has no logits to check
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = cp.n_batch = cp.n_ubatch = 512;
    cp.n_threads = cp.n_threads_batch = atoi(argv[2]);
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.type_k = cp.type_v = GGML_TYPE_F32;
    struct llama_context *c = llama_init_from_model(m, cp);
    if (!c || n > 512) return fprintf(stderr, "llama_logits: no context (or more than 512 ids)\n"), 1;
    int nv = llama_vocab_n_tokens(llama_model_get_vocab(m));
    struct llama_batch b = llama_batch_init(n, 0, 1);
    int rc = 0;
    if (!strcmp(argv[3], "batch")) rc = eval(c, &b, ids, 0, n, nv);
    else if (!strcmp(argv[3], "one"))
        for (int i = 0; i < n && !rc; i++) rc = eval(c, &b, ids, i, i + 1, nv);
    else {
        rc = eval(c, &b, ids, 0, np, nv);
        for (int i = np; i < n && !rc; i++) rc = eval(c, &b, ids, i, i + 1, nv);
    }
    llama_batch_free(b);
    llama_free(c);
    llama_model_free(m);
    return rc;
}

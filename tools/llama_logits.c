// tools/llama_logits.c: teacher-forced logits from llama.cpp, for tools/llama_compare.py.
// Built by that script against the llama.cpp it sets up (llama.h); not part of pensieve.
//
//   llama_logits MODEL THREADS MODE PROMPT_IDS [GEN_IDS]
//
// Prints one JSON line per evaluated position, as `pensieve logits` does:
// {"pos":i,"lse":x,"top":[[id,logit],...]} with the 50 highest logits. The context is 512
// tokens with an F32 KV cache and flash attention off (the reference contract's settings).
// MODE: "ref" evaluates the prompt in one batch and then each generated id but the last one by
// one (how shared/reference was produced); "batch" evaluates everything in one batch; "one"
// evaluates every token alone.
#include "llama.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int main(int argc, char **argv) {
    if (argc < 5) return fprintf(stderr, "usage: llama_logits MODEL THREADS ref|batch|one PROMPT_IDS [GEN_IDS]\n"), 2;
    static llama_token ids[2 * MAX_IDS];
    int np = parse_ids(argv[4], ids), ng = argc > 5 ? parse_ids(argv[5], ids + np) : 0;
    int n = np + (ng > 0 ? ng - 1 : 0); // the last generated id has no logits to check
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model *m = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (!m) return fprintf(stderr, "llama_logits: cannot load %s\n", argv[1]), 1;
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

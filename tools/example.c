// tools/example.c — generate text with pensieve as a library, using only pensieve.h.
//
//   cc -DPSV_NO_MAIN -c pensieve.c -o pensieve.o
//   cc -I. tools/example.c pensieve.o -o example -lpthread
//   ./example MODEL.gguf "Once upon a time" [N_TOKENS] [--greedy]
#include "pensieve.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.gguf PROMPT [N_TOKENS] [--greedy]\n", argv[0]);
        return 2;
    }
    int n_predict = argc > 3 ? atoi(argv[3]) : 64;
    bool greedy = argc > 4 && !strcmp(argv[4], "--greedy");
    psv_error err = {0};
    psv_model *model = NULL;
    psv_ctx *ctx = NULL;
    psv_sampler *sampler = NULL;
    psv_token_decoder *dec = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    int rc = 1;

    if (psv_model_open(argv[1], NULL, &model, &err) != PSV_OK) goto fail;
    if (psv_ctx_new(model, NULL, &ctx, &err) != PSV_OK) goto fail;
    psv_sampler_params sp = psv_sampler_default_params();
    if (greedy) sp.temperature = 0;
    if (psv_sampler_new(&sp, psv_model_n_vocab(model), &sampler, &err) != PSV_OK) goto fail;
    if (psv_tokenize(model, argv[2], strlen(argv[2]), true, false, &ids, &n_ids, &err) != PSV_OK) goto fail;
    if (psv_token_decoder_new(model, &dec, &err) != PSV_OK) goto fail;
    if (psv_eval(ctx, ids, n_ids, &err) != PSV_OK) goto fail;
    for (size_t i = 0; i < n_ids; i++) psv_sampler_accept(sampler, ids[i]);

    for (int i = 0; i < n_predict && psv_ctx_n_past(ctx) < psv_ctx_n_ctx(ctx); i++) {
        int32_t tok = psv_sampler_sample(sampler, psv_ctx_logits(ctx));
        if (psv_token_is_eog(model, tok)) break;
        psv_sampler_accept(sampler, tok);
        size_t len;
        const char *text = psv_token_decoder_push(dec, tok, &len);
        fwrite(text, 1, len, stdout);
        fflush(stdout);
        if (psv_eval(ctx, &tok, 1, &err) != PSV_OK) goto fail;
    }
    size_t len;
    const char *rest = psv_token_decoder_flush(dec, &len);
    fwrite(rest, 1, len, stdout);
    printf("\n");
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "example: %s\n", err.message);
done:
    psv_free(ids);
    psv_token_decoder_free(dec);
    psv_sampler_free(sampler);
    psv_ctx_free(ctx);
    psv_model_close(model);
    return rc;
}

// tests/fuzz_api.c — libFuzzer harness for the request decoding of section 19's APIs.
//
// Input: one selector byte (mod 4: Anthropic messages, Anthropic count_tokens, OpenAI chat
// completions, OpenAI completions), then the request body. The body goes through the JSON
// reader and the decoder the server runs (anth_prepare / oai_decode), which tokenizes through a
// real chat template and tokenizer: a tiny phi3 model written by mkmodel at start-up. Nothing
// is generated. Invariants: no crash or sanitizer report; a decoded request has at least one
// token, every id inside the vocabulary, settings inside their documented ranges, non-empty
// stop sequences and, unless it only counts tokens, prompt + max_tokens within the context;
// a refused one has a message, and its error envelope reads back as JSON carrying it.
#define PSV_TESTING
#define PSV_NO_MAIN
#define PSV_SERVER
#include "pensieve.c"

static void fuzz_check(bool ok) {
    if (!ok) __builtin_trap();
}

static server_t fuzz_srv;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    PSV_UNUSED(argc);
    PSV_UNUSED(argv);
    char path[] = "/tmp/pensieve-fuzz-api-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) abort();
    close(fd);
    mk_config c;
    memset(&c, 0, sizeof c);
    c.s = (mk_shape){.n_embd = 32, .n_layer = 1, .n_head = 2, .n_head_kv = 2, .n_ff = 32, .n_vocab = 600, .n_ctx = 256, .arch = ARCH_PHI3};
    mk_arch_defaults(&c.s);
    c.ftype = 0; // F32
    c.seed = 7;
    psv_error err = {0};
    mk_report rep;
    psv_model_params mp = psv_model_default_params();
    mp.n_threads = 1;
    if (mk_shape_finish(&c.s, &err) != PSV_OK || mk_write(&c, path, &rep, &err) != PSV_OK ||
        psv_model_open(path, &mp, &fuzz_srv.model, &err) != PSV_OK) {
        fprintf(stderr, "fuzz_api: cannot make the model: %s\n", err.message);
        abort();
    }
    unlink(path);
    fuzz_srv.conf.ctx = 256;
    fuzz_srv.conf.model_name = "tiny";
    pthread_mutex_init(&fuzz_srv.mu, NULL);
    return 0;
}

// The error envelope of a refusal parses back and carries the message.
static void fuzz_envelope(api_kind api, const char *msg) {
    buf_t b = {0};
    api_error_json(&b, api, 400, msg);
    json_doc *doc = NULL;
    fuzz_check(!b.oom && json_parse(b.data, b.len, &doc, NULL) == PSV_OK);
    const json_value *e = json_get(json_root(doc), "error");
    const char *m = json_str(json_get(e, "message"));
    fuzz_check(m && strcmp(m, msg) == 0 && json_str(json_get(e, "type")));
    json_doc_free(doc);
    buf_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int which = data[0] % 4;
    server_t *s = &fuzz_srv;
    json_doc *doc = NULL;
    psv_error perr = {0};
    api_kind api = which < 2 ? API_ANTHROPIC : API_OPENAI;
    if (json_parse((const char *)data + 1, size - 1, &doc, &perr) != PSV_OK) {
        fuzz_check(perr.message[0] != 0);
        fuzz_envelope(api, perr.message);
        return 0;
    }
    chat_req cr = {0};
    gen_job j;
    memset(&j, 0, sizeof j);
    oai_out o = {0};
    char err[512] = "";
    int32_t *ids = NULL;
    size_t n_ids = 0;
    bool ok = which < 2 ? anth_prepare(s, json_root(doc), which == 1, &cr, &j, &ids, &n_ids, err, sizeof err)
                        : oai_decode(s, json_root(doc), which == 2, &cr, &j, &o, &ids, &n_ids, err, sizeof err);
    if (ok) {
        int64_t nv = psv_model_n_vocab(s->model);
        fuzz_check(n_ids > 0 && ids != NULL);
        for (size_t i = 0; i < n_ids; i++) fuzz_check(ids[i] >= 0 && ids[i] < nv);
        if (which != 1) {
            fuzz_check(j.max_tokens >= 1 && (uint64_t)n_ids + (uint64_t)j.max_tokens <= s->conf.ctx);
            fuzz_check(j.sp.temperature >= 0 && j.sp.temperature <= 2 && j.sp.top_p >= 0 && j.sp.top_p <= 1);
            fuzz_check(j.sp.top_k >= 0);
        }
        fuzz_check(j.n_stops <= 16);
        for (size_t i = 0; i < j.n_stops; i++) fuzz_check(j.stops[i] && j.stops[i][0]);
        fuzz_check(which < 2 || o.model != NULL);
    } else {
        fuzz_check(err[0] != 0);
        fuzz_envelope(api, err);
    }
    free(j.stops);
    free(ids);
    chat_req_free(&cr);
    json_doc_free(doc);
    return 0;
}

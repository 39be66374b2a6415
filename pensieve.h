// pensieve.h — the public API of pensieve, a local LLM inference library and server.
//
// Everything here is implemented in pensieve.c. Handles are opaque; functions that can fail
// return a psv_status and fill an optional caller-owned psv_error (pass NULL to ignore the
// message). The library keeps no global mutable state visible to callers and never calls exit().
//
// Build it into your program with `cc -DPSV_NO_MAIN -c pensieve.c`, or `#define PSV_STATIC`
// and `#include "pensieve.c"` into one translation unit.

#ifndef PENSIEVE_H
#define PENSIEVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifdef PSV_STATIC
#define PSV_API static
#else
#define PSV_API extern
#endif

#define PSV_VERSION "0.1.0"

typedef enum psv_status {
    PSV_OK = 0,
    PSV_ERR_INVALID = 1,     // a bad argument or request from the caller
    PSV_ERR_FORMAT = 2,      // malformed file or data
    PSV_ERR_UNSUPPORTED = 3, // well-formed but not supported (architecture, tensor type, ...)
    PSV_ERR_IO = 4,          // the operating system refused (open, read, mmap, ...)
    PSV_ERR_NOMEM = 5,       // out of memory
    PSV_ERR_RANGE = 6,       // beyond a limit (context full, value out of range)
    PSV_ERR_CANCELLED = 7    // stopped by the caller
} psv_status;

// An error record the caller owns. Zero-initialise it (or set status = PSV_OK) before use; the
// first error reported into it is kept. message is always NUL-terminated.
typedef struct psv_error {
    psv_status status;
    char message[512];
} psv_error;

// A short static name for a status ("ok", "invalid", ...).
PSV_API const char *psv_status_name(psv_status st);

// ---- SHA-256 (FIPS 180-4) -------------------------------------------------------------------
// A streaming hash. The struct is public so it can live on the stack; treat its fields as
// private. Uses the CPU's SHA instructions when present (chosen at run time). Thread-safe for
// distinct psv_sha256 objects.
typedef struct psv_sha256 {
    uint32_t state[8];
    uint64_t n_bytes;   // total bytes hashed so far
    uint8_t block[64];  // pending partial block
    uint32_t n_block;   // bytes pending in block
} psv_sha256;

PSV_API void psv_sha256_init(psv_sha256 *s);
PSV_API void psv_sha256_update(psv_sha256 *s, const void *data, size_t n);
PSV_API void psv_sha256_final(psv_sha256 *s, uint8_t digest[32]); // s must be re-initialised after
// Hash a whole file by streaming reads (no mapping).
PSV_API psv_status psv_sha256_file(const char *path, uint8_t digest[32], psv_error *err);

// ---- Models and contexts ----------------------------------------------------------------------
// A psv_model is a loaded GGUF model: weights stay in a read-only mapping of the file, used in
// place. It owns a thread pool used by every context's forward passes; passes on one model are
// serialised (thread-safe, one at a time). A psv_ctx is one sequence: its KV cache, scratch and
// last logits. A ctx is not thread-safe; use one per thread, all sharing the model.
typedef struct psv_model psv_model;
typedef struct psv_ctx psv_ctx;

typedef struct psv_model_params {
    int n_threads; // worker threads for matrix products; 0 = one per online CPU (at most 64)
} psv_model_params;

typedef enum psv_kv_type { PSV_KV_F32 = 0, PSV_KV_F16 = 1 } psv_kv_type;

typedef struct psv_ctx_params {
    uint32_t n_ctx;      // context size in tokens; 0 = min(model's training context, 4096)
    uint32_t n_batch;    // most tokens per forward pass (prompt chunk); 0 = 128
    psv_kv_type kv_type; // KV cache precision
} psv_ctx_params;

PSV_API psv_model_params psv_model_default_params(void);
// Open a GGUF model. Errors name the file and the problem (missing tensor, wrong shape,
// unsupported architecture or tensor type, truncated data). The file is mapped, not read; a
// helper thread touches its weights' pages front to back meanwhile, so that the first prompt
// does not take the page faults (and, for a file not in the page cache, reads it ahead). It
// stops by itself when done, or at psv_model_close.
PSV_API psv_status psv_model_open(const char *path, const psv_model_params *params, psv_model **out,
                                  psv_error *err);
PSV_API void psv_model_close(psv_model *m); // all contexts of m must be freed first
PSV_API int64_t psv_model_n_vocab(const psv_model *m);
PSV_API int64_t psv_model_n_ctx_train(const psv_model *m);
PSV_API int psv_model_n_threads(const psv_model *m);
PSV_API const char *psv_model_arch(const psv_model *m); // "llama", "phi3", "qwen2", "qwen3", "phi2"
PSV_API size_t psv_model_weight_bytes(const psv_model *m);

PSV_API psv_ctx_params psv_ctx_default_params(void);
PSV_API psv_status psv_ctx_new(psv_model *m, const psv_ctx_params *params, psv_ctx **out, psv_error *err);
PSV_API void psv_ctx_free(psv_ctx *c);
PSV_API uint32_t psv_ctx_n_ctx(const psv_ctx *c);
PSV_API uint32_t psv_ctx_n_past(const psv_ctx *c); // tokens in the KV cache
// Forget cached tokens beyond the first n_keep (to reuse a common prefix).
PSV_API psv_status psv_ctx_truncate(psv_ctx *c, uint32_t n_keep, psv_error *err);

// Evaluate n tokens after the cached ones. Exceeding the context is PSV_ERR_RANGE and changes
// nothing; token ids outside the vocabulary are PSV_ERR_INVALID.
PSV_API psv_status psv_eval(psv_ctx *c, const int32_t *tokens, size_t n, psv_error *err);
// Same, also writing every token's logits into logits (n * n_vocab floats, row per token).
PSV_API psv_status psv_eval_all_logits(psv_ctx *c, const int32_t *tokens, size_t n, float *logits,
                                       psv_error *err);
// The logits (n_vocab floats) of the last evaluated token, valid until the next call on c;
// NULL before any evaluation.
PSV_API const float *psv_ctx_logits(const psv_ctx *c);

// ---- Sampling ---------------------------------------------------------------------------------
// Applied in this order: repetition/presence/frequency penalties over the last repeat_last_n
// accepted tokens, top-k, top-p, min-p, temperature, then a seeded draw. temperature 0 is greedy.
typedef struct psv_sampler_params {
    float temperature;       // 0 = greedy; default 0.8
    int top_k;               // 0 = off; default 40
    float top_p;             // 1 = off; default 0.95
    float min_p;             // 0 = off; default 0.05
    float repeat_penalty;    // 1 = off (default)
    int repeat_last_n;       // window for penalties; default 64
    float presence_penalty;  // 0 = off (default)
    float frequency_penalty; // 0 = off (default)
    uint64_t seed;           // same seed + settings + logits -> same tokens
} psv_sampler_params;

typedef struct psv_sampler psv_sampler;
PSV_API psv_sampler_params psv_sampler_default_params(void);
PSV_API psv_status psv_sampler_new(const psv_sampler_params *params, int64_t n_vocab, psv_sampler **out,
                                   psv_error *err);
PSV_API void psv_sampler_free(psv_sampler *s);
// Record a token (prompt or generated) in the penalty window.
PSV_API void psv_sampler_accept(psv_sampler *s, int32_t token);
// Choose a token from n_vocab logits (not modified). Does not accept it.
PSV_API int32_t psv_sampler_sample(psv_sampler *s, const float *logits);

// ---- Text -------------------------------------------------------------------------------------
// The model's own tokenizer and chat template (from its GGUF metadata). Token arrays returned
// through int32_t ** are malloc'd: release them with psv_free.
typedef struct psv_chat_message {
    const char *role;    // "system", "user", "assistant" (some formats accept others)
    const char *content; // never parsed for special tokens
} psv_chat_message;

PSV_API void psv_free(void *p);
// Tokenize text. add_special adds BOS/EOS as the model asks; parse_special recognises control
// tokens such as <|im_start|> written in the text (never do this for untrusted content).
PSV_API psv_status psv_tokenize(const psv_model *m, const char *text, size_t len, bool add_special,
                                bool parse_special, int32_t **ids, size_t *n_ids, psv_error *err);
// Lay out a conversation with the model's chat template (recognised from
// tokenizer.chat_template; chatml when unrecognised) and tokenize it, BOS added exactly once.
PSV_API psv_status psv_chat_tokenize(const psv_model *m, const psv_chat_message *msgs, size_t n,
                                     bool add_generation_prompt, int32_t **ids, size_t *n_ids,
                                     psv_error *err);
// The chat format in use ("phi4-mini", "llama3", ...) and, when the template was not recognised,
// a warning naming the fallback (else NULL).
PSV_API const char *psv_model_chat_format(const psv_model *m, const char **warning);
// True for end-of-generation tokens (EOS, EOT, <|end|>, <|im_end|>, ...).
PSV_API bool psv_token_is_eog(const psv_model *m, int32_t token);

// Incremental detokenizer for streaming: push returns the text completed by this token (only
// whole UTF-8 characters; a character split across tokens is held back), valid until the next
// call. Control tokens produce no text.
typedef struct psv_token_decoder psv_token_decoder;
PSV_API psv_status psv_token_decoder_new(const psv_model *m, psv_token_decoder **out, psv_error *err);
PSV_API const char *psv_token_decoder_push(psv_token_decoder *d, int32_t token, size_t *len);
PSV_API const char *psv_token_decoder_flush(psv_token_decoder *d, size_t *len);
PSV_API void psv_token_decoder_free(psv_token_decoder *d);

#ifdef __cplusplus
}
#endif

#endif // PENSIEVE_H

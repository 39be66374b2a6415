// tests/fuzzers.c — every libFuzzer harness (tests/fuzz_*.c) in one program, so that `make fuzz`
// compiles pensieve.c once (clang with ASan, UBSan and the fuzzer's coverage) instead of once a
// harness. No harness runs a kernel, so the SIMD kernels are left out (PSV_NO_SIMD_KERNELS): they
// were 95 % of the compile (330 s, now 20). The Makefile links build/fuzz/fuzz_NAME to it: run
// under that name, it fuzzes through tests/fuzz_NAME.c's entry points, its start-up included, as
// that file's own program did. The harnesses' fuzz_check (four define one) is renamed for each
// on the way in. A harness added to tests/ is added here too: run under a name not listed, the
// program says so and stops.
#define PSV_TESTING
#define PSV_NO_MAIN
#define PSV_SERVER
#define PSV_NO_SIMD_KERNELS
#include "pensieve.c"

#define LLVMFuzzerTestOneInput fz_one_api
#define LLVMFuzzerInitialize fz_init_api
#define fuzz_check fuzz_check_api
#include "fuzz_api.c"
#undef LLVMFuzzerTestOneInput
#undef LLVMFuzzerInitialize
#undef fuzz_check
#define LLVMFuzzerTestOneInput fz_one_chat
#define LLVMFuzzerInitialize fz_init_chat
#define fuzz_check fuzz_check_chat
#include "fuzz_chat.c"
#undef LLVMFuzzerTestOneInput
#undef LLVMFuzzerInitialize
#undef fuzz_check
#define LLVMFuzzerTestOneInput fz_one_gguf
#define LLVMFuzzerInitialize fz_init_gguf
#define fuzz_check fuzz_check_gguf
#include "fuzz_gguf.c"
#undef LLVMFuzzerTestOneInput
#undef LLVMFuzzerInitialize
#undef fuzz_check
#define LLVMFuzzerTestOneInput fz_one_http
#define LLVMFuzzerInitialize fz_init_http
#define fuzz_check fuzz_check_http
#include "fuzz_http.c"
#undef LLVMFuzzerTestOneInput
#undef LLVMFuzzerInitialize
#undef fuzz_check
#define LLVMFuzzerTestOneInput fz_one_json
#define LLVMFuzzerInitialize fz_init_json
#define fuzz_check fuzz_check_json
#include "fuzz_json.c"
#undef LLVMFuzzerTestOneInput
#undef LLVMFuzzerInitialize
#undef fuzz_check
#define LLVMFuzzerTestOneInput fz_one_models
#define LLVMFuzzerInitialize fz_init_models
#define fuzz_check fuzz_check_models
#include "fuzz_models.c"
#undef LLVMFuzzerTestOneInput
#undef LLVMFuzzerInitialize
#undef fuzz_check
#define LLVMFuzzerTestOneInput fz_one_sse
#define LLVMFuzzerInitialize fz_init_sse
#define fuzz_check fuzz_check_sse
#include "fuzz_sse.c"
#undef LLVMFuzzerTestOneInput
#undef LLVMFuzzerInitialize
#undef fuzz_check
#define LLVMFuzzerTestOneInput fz_one_tokenizer
#define LLVMFuzzerInitialize fz_init_tokenizer
#define fuzz_check fuzz_check_tokenizer
#include "fuzz_tokenizer.c"
#undef LLVMFuzzerTestOneInput
#undef LLVMFuzzerInitialize
#undef fuzz_check

typedef int (*fz_one_fn)(const uint8_t *data, size_t size);
typedef int (*fz_init_fn)(int *argc, char ***argv);
static const struct {
    const char *name;
    fz_one_fn one;
    fz_init_fn init; // NULL: the harness needs no start-up
} fz_harnesses[] = {
    {"api", fz_one_api, fz_init_api},
    {"chat", fz_one_chat, NULL},
    {"gguf", fz_one_gguf, NULL},
    {"http", fz_one_http, NULL},
    {"json", fz_one_json, NULL},
    {"models", fz_one_models, NULL},
    {"sse", fz_one_sse, NULL},
    {"tokenizer", fz_one_tokenizer, fz_init_tokenizer},
};
static fz_one_fn fz_one;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    const char *name = *argc > 0 && (*argv)[0] ? (*argv)[0] : "";
    const char *slash = strrchr(name, '/');
    if (slash) name = slash + 1;
    if (strncmp(name, "fuzz_", 5) == 0) name += 5;
    for (size_t i = 0; i < PSV_ARRAY_LEN(fz_harnesses); i++)
        if (strcmp(name, fz_harnesses[i].name) == 0) {
            fz_one = fz_harnesses[i].one;
            return fz_harnesses[i].init ? fz_harnesses[i].init(argc, argv) : 0;
        }
    fprintf(stderr, "fuzzers: no harness named '%s'; run as build/fuzz/fuzz_NAME, NAME one of:", name);
    for (size_t i = 0; i < PSV_ARRAY_LEN(fz_harnesses); i++) fprintf(stderr, " %s", fz_harnesses[i].name);
    fputc('\n', stderr);
    exit(2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fz_one(data, size); }

// tests/unit.c — every unit test (tests/test_*.c) in one program, so that a build configuration
// compiles pensieve.c once for all of them instead of once a test: each compile of it took about a
// minute for aarch64 and two and a half under ASan in CI, which builds the tests three ways. The Makefile links
// build/tests/test_NAME to this program; run under that name it runs tests/test_NAME.c's main, as
// that file's own program did, one test a process (their state never meets). `unit NAME` does
// the same. A test file added to tests/ is added here too: run under a name not listed, the
// program says so and fails, and so does the test run.
#define PSV_TESTING
#define PSV_NO_MAIN
#include "pensieve.c"
#include "test.h"

#define main t_main_chat
#include "test_chat.c"
#undef main
#define main t_main_engine
#include "test_engine.c"
#undef main
#define main t_main_gguf
#include "test_gguf.c"
#undef main
#define main t_main_json
#include "test_json.c"
#undef main
#define main t_main_kernels
#include "test_kernels.c"
#undef main
#define main t_main_model
#include "test_model.c"
#undef main
#define main t_main_models
#include "test_models.c"
#undef main
#define main t_main_sha256
#include "test_sha256.c"
#undef main
#define main t_main_simd
#include "test_simd.c"
#undef main
#define main t_main_tokenizer
#include "test_tokenizer.c"
#undef main
#define main t_main_tools
#include "test_tools.c"
#undef main

static const struct {
    const char *name;
    int (*run)(void);
} t_tests[] = {
    {"chat", t_main_chat},
    {"engine", t_main_engine},
    {"gguf", t_main_gguf},
    {"json", t_main_json},
    {"kernels", t_main_kernels},
    {"model", t_main_model},
    {"models", t_main_models},
    {"sha256", t_main_sha256},
    {"simd", t_main_simd},
    {"tokenizer", t_main_tokenizer},
    {"tools", t_main_tools},
};

int main(int argc, char **argv) {
    const char *name = argc > 0 && argv[0] ? argv[0] : "";
    const char *slash = strrchr(name, '/');
    if (slash) name = slash + 1;
    if (strncmp(name, "test_", 5) == 0) name += 5;
    else name = argc > 1 ? argv[1] : "";
    for (size_t i = 0; i < PSV_ARRAY_LEN(t_tests); i++)
        if (strcmp(name, t_tests[i].name) == 0) return t_tests[i].run();
    fprintf(stderr, "unit: no test named '%s'; run as build/tests/test_NAME or `unit NAME`, NAME one of:", name);
    for (size_t i = 0; i < PSV_ARRAY_LEN(t_tests); i++) fprintf(stderr, " %s", t_tests[i].name);
    fputc('\n', stderr);
    return 2;
}

// tests/header.cpp — pensieve.h compiles as C++ and the library links into a C++ program with
// C linkage: this calls the API through the header, against pensieve.c compiled as C.
#include "pensieve.h"
#include <cstdio>
#include <cstring>
#include <type_traits>

static_assert(PSV_OK == 0, "PSV_OK is zero");
static_assert(std::is_standard_layout<psv_error>::value, "psv_error is a plain struct");
static_assert(std::is_standard_layout<psv_sha256>::value, "psv_sha256 can live on the stack");

static int passed, failed;
#define CHECK(x) do { if (x) passed++; else { failed++; std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #x); } } while (0)

int main() {
    psv_sha256 s;
    psv_sha256_init(&s);
    psv_sha256_update(&s, "abc", 3);
    uint8_t d[32];
    psv_sha256_final(&s, d);
    static const uint8_t abc[4] = {0xba, 0x78, 0x16, 0xbf}; // FIPS 180-4 example, first bytes
    CHECK(std::memcmp(d, abc, 4) == 0);
    CHECK(std::strcmp(psv_status_name(PSV_ERR_FORMAT), "format") == 0);
    psv_error err = {};
    psv_model *m = nullptr;
    CHECK(psv_model_open("/nonexistent/model.gguf", nullptr, &m, &err) == PSV_ERR_IO && m == nullptr);
    CHECK(std::strstr(err.message, "/nonexistent/model.gguf") != nullptr);
    psv_sampler_params sp = psv_sampler_default_params();
    CHECK(sp.top_k == 40 && sp.temperature > 0.0f);
    std::printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}

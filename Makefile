# pensieve — see README.md. Every target works from a fresh clone; tests that need ../shared
# say what they skipped when it is absent.

CC       ?= cc
CFLAGS   ?= -O2 -g
WARN      = -Wall -Wextra -std=c11
SHARED   ?= ../shared
BUILD     = build
TEST_SRCS = $(wildcard tests/test_*.c)
TEST_BINS = $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRCS))
# (tests/cli_armcpus.sh runs the arm64 test_simd that make test-arm64 builds: it is that target's)
TEST_SH   = $(filter-out tests/cli_armcpus.sh,$(wildcard tests/cli_*.sh))
FUZZ_SRCS = $(wildcard tests/fuzz_*.c)
TEST_LIBS ?= -lm   # tests may use libm as an oracle; pensieve.c itself never links it
ARM_CC   ?= aarch64-linux-gnu-gcc
# Each test build compiles all of pensieve.c; gcc's variable tracking (debug locations of
# optimised variables) is a third to a half of that time, so the test builds ($(BUILD)/...) go
# without it where the compiler has the flag (line numbers in sanitizer reports are unaffected;
# `make` builds ./pensieve with it).
NO_VARTRACK = $(shell $(CC) -fno-var-tracking -x c -c /dev/null -o /dev/null 2>/dev/null && echo -fno-var-tracking)
QEMU_ARM ?= qemu-aarch64 -L /usr/aarch64-linux-gnu

.PHONY: all test test-build debug test-asan test-asan-build fuzz fuzz-run soak check-syms test-arm64 \
        test-arm64-build check-arm64-flags check-arm64-n1 check-arm64-v86 check-arm64-v86-clang \
        tsan-build ci-build bench clean pull-tool-note

# tools/pensieve-pull, the model downloader, links libcurl (the project's only optional
# dependency): built when libcurl's development files are found (curl-config or pkg-config),
# skipped with a note saying how to get them otherwise. pensieve itself never needs libcurl.
CURL_LIBS   := $(shell curl-config --libs 2>/dev/null || pkg-config --libs libcurl 2>/dev/null)
CURL_CFLAGS := $(shell curl-config --cflags 2>/dev/null || pkg-config --cflags libcurl 2>/dev/null)
PULL_TOOL    = $(if $(CURL_LIBS),tools/pensieve-pull,pull-tool-note)
PULL_BIN     = $(if $(CURL_LIBS),$(BUILD)/pensieve-pull)

all: pensieve $(PULL_TOOL)

tools/pensieve-pull: tools/pensieve-pull.c pensieve.c pensieve.h
	$(CC) $(WARN) $(CFLAGS) $(CURL_CFLAGS) tools/pensieve-pull.c -o $@ $(CURL_LIBS) -lpthread

pull-tool-note:
	@echo "note: tools/pensieve-pull (the model downloader) was not built: libcurl's development files are missing."
	@echo "      Debian/Ubuntu: sudo apt-get install libcurl4-openssl-dev; Fedora: sudo dnf install libcurl-devel;"
	@echo "      macOS: brew install curl. Then run make again. Without it, pensieve prints the curl command to run."

# The downloader the CLI tests drive, built with this configuration's flags (plain, ASan, ...).
$(BUILD)/pensieve-pull: tools/pensieve-pull.c pensieve.c pensieve.h
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(CFLAGS) $(NO_VARTRACK) $(CURL_CFLAGS) tools/pensieve-pull.c -o $@ $(CURL_LIBS) -lpthread

pensieve: pensieve.c pensieve.h
	$(CC) $(WARN) $(CFLAGS) pensieve.c -o $@ -lpthread

# The unit tests are one program: tests/unit.c #includes pensieve.c with PSV_TESTING and then every
# tests/test_*.c, so a configuration compiles pensieve.c once for all of them. $(BUILD)/tests/test_NAME
# are hard links to it, and run under such a name it runs that test. Shell tests drive the binary.
$(BUILD)/tests/unit: tests/unit.c $(TEST_SRCS) tests/test.h pensieve.c pensieve.h
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(CFLAGS) $(NO_VARTRACK) $(TEST_CFLAGS) -I. tests/unit.c -o $@ -lpthread $(TEST_LIBS)

$(BUILD)/tests/test_%: $(BUILD)/tests/unit
	ln -f $< $@

$(BUILD)/pensieve-lib.o: pensieve.c pensieve.h
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(CFLAGS) $(NO_VARTRACK) $(LIB_CFLAGS) -DPSV_NO_MAIN -c pensieve.c -o $@

$(BUILD)/tests/test_header_cpp: tests/header.cpp pensieve.h $(BUILD)/pensieve-lib.o
	@mkdir -p $(dir $@)
	$(CXX) -Wall -Wextra $(CFLAGS) -I. tests/header.cpp $(BUILD)/pensieve-lib.o -o $@ -lpthread

# The library example (tools/example.c) uses only pensieve.h, linked against pensieve.c as C.
$(BUILD)/example: tools/example.c pensieve.h $(BUILD)/pensieve-lib.o
	$(CC) $(WARN) $(CFLAGS) -I. tools/example.c $(BUILD)/pensieve-lib.o -o $@ -lpthread

# The binary the CLI tests drive, built with this configuration's flags (plain, ASan, ...).
$(BUILD)/pensieve: pensieve.c pensieve.h
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(CFLAGS) $(NO_VARTRACK) pensieve.c -o $@ -lpthread

# What `make test` runs, built (`make -jN test-build` compiles it N at a time).
TEST_BUILD = $(BUILD)/pensieve $(TEST_BINS) $(BUILD)/tests/test_header_cpp $(BUILD)/example $(PULL_BIN)
test-build: $(TEST_BUILD)

test: $(TEST_BUILD)
	PSV_SHARED=$(SHARED) PSV_BIN=$(CURDIR)/$(BUILD)/pensieve PSV_EXAMPLE=$(CURDIR)/$(BUILD)/example \
	    PSV_PULL=$(if $(PULL_BIN),$(CURDIR)/$(PULL_BIN)) \
	    sh tests/run.sh $(BUILD)/tests $(TEST_SH)

# ASan + UBSan: `make debug` the binary (pensieve-debug); test-asan the whole suite, its binary too,
# built and run with them.
debug: pensieve.c pensieve.h
	$(CC) $(WARN) -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer pensieve.c -o pensieve-debug -lpthread

# Its library object (what the library example and the C++ header test link) leaves out the SIMD
# kernel sets (PSV_NO_SIMD_KERNELS; the compile 108 -> 6 s): those tests exercise the API (the
# example's text must still equal the binary's, made with the SIMD kernels); the kernels run under
# the sanitizers in the unit tests (every set) and in the binary.
ASAN_CFLAGS = -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
ASAN_LIB_CFLAGS = -DPSV_NO_SIMD_KERNELS
# Its unit tests also check the avxvnni set's kernels on AVX-512 VNNI CPUs, in the AVX-512 encoding
# of the same instructions (PSV_VNNI_EVEX): otherwise only an AVX-VNNI CPU (Intel client CPUs from
# Alder Lake on, some Xeons) would run them.
ASAN_TEST_CFLAGS = -DPSV_VNNI_EVEX
test-asan:
	$(MAKE) test BUILD=$(BUILD)/asan CFLAGS="$(ASAN_CFLAGS)" LIB_CFLAGS="$(ASAN_LIB_CFLAGS)" TEST_CFLAGS="$(ASAN_TEST_CFLAGS)"
test-asan-build:
	$(MAKE) test-build BUILD=$(BUILD)/asan CFLAGS="$(ASAN_CFLAGS)" LIB_CFLAGS="$(ASAN_LIB_CFLAGS)" TEST_CFLAGS="$(ASAN_TEST_CFLAGS)"

# The binary CI runs the server tests with under ThreadSanitizer.
TSAN_CC ?= clang
tsan-build: $(BUILD)/pensieve-tsan
$(BUILD)/pensieve-tsan: pensieve.c pensieve.h
	@mkdir -p $(dir $@)
	$(TSAN_CC) $(WARN) -O1 -g -fsanitize=thread pensieve.c -o $@ -lpthread

# libFuzzer harnesses (clang). `make fuzz-run FUZZ_SECONDS=60` runs each with its seed corpus;
# FUZZ_SEED=N makes a run repeatable (CI pins it; long exploratory runs leave it random).
FUZZ_CC ?= clang
FUZZ_SECONDS ?= 60
FUZZ_SEED ?= 0
fuzz: $(patsubst tests/%.c,$(BUILD)/fuzz/%,$(FUZZ_SRCS))

# One program (tests/fuzzers.c #includes every harness) compiles pensieve.c once; $(BUILD)/fuzz/fuzz_NAME
# are hard links to it, and run under such a name it is that harness (without the SIMD kernels,
# which no harness runs: see tests/fuzzers.c).
$(BUILD)/fuzz/fuzzers: tests/fuzzers.c $(FUZZ_SRCS) pensieve.c pensieve.h
	@mkdir -p $(dir $@)
	$(FUZZ_CC) -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I. tests/fuzzers.c -o $@ -lpthread

$(BUILD)/fuzz/fuzz_%: $(BUILD)/fuzz/fuzzers
	ln -f $< $@

# Each harness is a target of its own, so `make -jN fuzz-run` fuzzes with N at a time (each for
# FUZZ_SECONDS on a core of its own); each prints its report when it ends.
FUZZ_NAMES = $(patsubst tests/%.c,%,$(FUZZ_SRCS))
fuzz-run: $(addprefix fuzz-run-,$(FUZZ_NAMES))

fuzz-run-%: $(BUILD)/fuzz/%
	@name=$*; mkdir -p $(BUILD)/corpus/$$name; \
	seeds=tests/corpus/$$name; [ -d $$seeds ] || seeds=; \
	if $< -max_total_time=$(FUZZ_SECONDS) -seed=$(FUZZ_SEED) -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
	    $(BUILD)/corpus/$$name $$seeds > $(BUILD)/$$name.log 2>&1; then \
	  echo "== $$name for $(FUZZ_SECONDS)s: $$(grep -E 'stat::number_of_executed_units' $(BUILD)/$$name.log | tail -n 1)"; \
	else \
	  echo "$$(tail -n 40 $(BUILD)/$$name.log)"; echo "== $$name: FAILED (crash, leak or timeout; see above)"; exit 1; \
	fi

# The soak test: 32 clients mixing every kind of request against one server for SOAK_SECONDS.
SOAK_SECONDS ?= 600
SOAK_MODEL ?= $(SHARED)/reference/models/phi3-q5km.gguf
soak: $(BUILD)/pensieve
	python3 tests/soak.py $(BUILD)/pensieve $(SOAK_MODEL) $(SOAK_SECONDS)

# Every symbol pensieve.c exports must start with psv_ (STYLE.md): read off the library object the
# example and the C++ header test link.
check-syms: $(BUILD)/pensieve-lib.o
	@bad=$$(nm -g --defined-only $< | awk '{print $$3}' | grep -v '^psv_'); \
	if [ -n "$$bad" ]; then echo "check-syms: exported symbols without psv_ prefix:"; echo "$$bad"; exit 1; fi; \
	echo "check-syms: ok ($$(nm -g --defined-only $< | wc -l) exported symbols, all psv_)"

# The same unit tests, cross-compiled for aarch64 and run under qemu-user (test_simd also on an
# emulated Cortex-A72 and A76, tests/cli_armcpus.sh).
test-arm64-build:
	$(MAKE) $(patsubst tests/%.c,$(BUILD)/arm64/tests/%,$(TEST_SRCS)) BUILD=$(BUILD)/arm64 CC=$(ARM_CC) CFLAGS="-O2 -g -static"
test-arm64: test-arm64-build
	PSV_SHARED=$(SHARED) PSV_TEST_WRAPPER="$(QEMU_ARM)" ARM_CC="$(ARM_CC)" QEMU="$(QEMU_ARM)" PSV_ARM_TESTS=$(BUILD)/arm64/tests \
	    sh tests/run.sh $(BUILD)/arm64/tests tests/cli_armicount.sh tests/cli_armcpus.sh

# Builds for aarch64 CPUs that have the dot product and int8 matrix instructions, where the kernels'
# target attributes step aside: they must compile without warnings with gcc and clang.
ARM_CLANG ?= clang --target=aarch64-linux-gnu -isystem /usr/aarch64-linux-gnu/include
check-arm64-flags: check-arm64-n1 check-arm64-v86 check-arm64-v86-clang
check-arm64-n1:
	$(ARM_CC) -mcpu=neoverse-n1 $(WARN) -O1 -Werror -c pensieve.c -o /dev/null
check-arm64-v86:
	$(ARM_CC) -march=armv8.6-a $(WARN) -O1 -Werror -c pensieve.c -o /dev/null
check-arm64-v86-clang:
	$(ARM_CLANG) -march=armv8.6-a $(WARN) -O1 -Werror -c pensieve.c -o /dev/null

# Every build CI's stages use, compiled up front: `make -j2 ci-build` keeps both cores busy (the
# sub-makes share make's job slots), where a stage's own builds would often leave one idle (the
# TSan binary and the fuzz program are one compile each). The longest (ASan's) come first.
ci-build: test-asan-build test-arm64-build test-build tsan-build fuzz check-arm64-flags

# Benchmarks print measurements; they assert nothing (tests never time anything).
$(BUILD)/bench_tokenizer: tests/bench_tokenizer.c pensieve.c pensieve.h
	@mkdir -p $(dir $@)
	$(CC) $(WARN) -O2 -I. $< -o $@ -lpthread

$(BUILD)/bench_simd: tests/bench_simd.c pensieve.c pensieve.h
	@mkdir -p $(dir $@)
	$(CC) $(WARN) -O2 -I. $< -o $@ -lpthread

bench: $(BUILD)/bench_tokenizer $(BUILD)/bench_simd
	PSV_SHARED=$(SHARED) $(BUILD)/bench_tokenizer
	$(BUILD)/bench_simd

clean:
	rm -rf $(BUILD) pensieve pensieve-debug tools/pensieve-pull

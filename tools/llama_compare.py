#!/usr/bin/env python3
"""tools/llama_compare.py: pensieve side by side with llama.cpp, on this machine.

  llama_compare.py setup                      fetch and build llama.cpp (once)
  llama_compare.py bench -m MODEL [-p 128,512] [-n 128] [-t 1,2] [-r 3] [--rounds 2] [--variant NAME]
                         [-d DEPTH] [--kv-type f32|f16]
  llama_compare.py conformance [--threads 2]
  llama_compare.py setup-arm                  build llama.cpp and pensieve for aarch64 (after setup)
  llama_compare.py arm -m MODEL [-p 32] [-n 4] [--isa dotprod|i8mm] [--prof N]

llama.cpp comes from the npm registry: node-llama-cpp ships the llama.cpp source it was built
from (a git bundle) and prebuilt CPU libraries for several x86 levels. `setup` builds that
source for this CPU (llama-bench and the library), builds tools/llama_logits.c against it, and
links the same program against the prebuilt AVX2 ("haswell") and baseline ("x64") libraries.
Everything goes to $LLAMA_DIR (default /tmp/pensieve-llama); nothing enters the repository.

`bench` runs `pensieve bench` and `llama-bench` on the same file with the same settings, in
alternating rounds (this machine's speed drifts), and prints both with their ratio. A benchmark:
it asserts nothing. `-d 0,4096` runs each test again with that many tokens in the KV cache first
(llama-bench's -d: generation late in a long conversation). llama.cpp's cache is F16 (its
llama-bench takes no F32 cache); pensieve's is its default F32 unless `--kv-type f16`, the
like-for-like comparison where the cache's size matters (at depth). `--variant NAME` measures one of the prebuilt CPU libraries instead (x64,
haswell, alderlake, icelake, zen4 or sapphirerapids: what llama.cpp's packaged builds load on
such CPUs), through tools/llama_logits.c's bench mode, which times what llama-bench times. On Intel CPUs
with AMX the build from source crashes in prompts (SIGILL in ggml's AMX matrix product, llama.cpp
as of late 2026), where the prebuilt sapphirerapids library runs: `--variant sapphirerapids`.

`conformance` evaluates every case of ../shared/reference/expected with teacher forcing, as
tests/test_engine.c does, with pensieve (batch and one by one) and with llama.cpp (the
reference's own split of prompt batch + one-by-one generation, all in one batch, all one by
one, and the prebuilt AVX2 and baseline builds), and counts the positions outside the contract
(a top-8 logit or the log-sum-exp more than 0.15 away).

`arm` compares the ARM code of both where there is no ARM machine: `setup-arm` cross-builds
llama-bench (static, no OpenMP) for two ARM levels, `dotprod` (armv8.2-a with the dot product
and fp16: Apple M1, Graviton 2) and `i8mm` (armv8.6-a with the int8 matrix multiply too: Apple
M2 and later, Graviton 3), and pensieve for aarch64, and builds tools/qemu_icount.c, a qemu
plugin that counts the instructions a program executes. `arm` runs `pensieve bench` (its kernel
set forced to the same level) and `llama-bench` under qemu-aarch64 (`-cpu max,sve=off`: no SVE,
which neither level has) with one thread, each twice, with two prompt lengths (p and 2p, no
generation) and with two generation lengths (no prompt; 1 and 1 + n tokens), and prints the
instructions each executes per prompt token and per generated token: the differences, so what
both do once (loading, warm start, the warm-up) drops out. Both benchmarks run the prompt twice
(warm-up and one repetition) and generate one token to warm up. A count shows the code, not its
speed (a load that misses the cache counts one); where a core is bound by its arithmetic, as
prompts are and as one thread's generation is on cores that read memory fast, fewer
instructions mean more speed. Needs gcc-aarch64-linux-gnu, g++-aarch64-linux-gnu and qemu-user.
`--prof N` then runs both once more with a prompt of 2p tokens, and once with 1 + n generated,
with the plugin counting by translated block, and prints the N functions of each that executed
the most instructions in each run (the whole run: loading and warm-up included), by the
binaries' symbols (aarch64-linux-gnu-nm): where the instructions go.
"""
import argparse
import bisect
import glob
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DIR = os.environ.get("LLAMA_DIR", "/tmp/pensieve-llama")
NLC = "3.22.1"  # node-llama-cpp release whose llama.cpp is built (its bundle: llama.cpp as of late 2026)
SRC = os.path.join(DIR, "llama.cpp")
BIN = os.path.join(SRC, "build", "bin")
ARM_ISAS = {"dotprod": "armv8.2-a+dotprod+fp16", "i8mm": "armv8.6-a+dotprod+fp16+i8mm"}  # llama.cpp's GGML_CPU_ARM_ARCH
VARIANTS = ("haswell", "x64")  # the prebuilt libraries `conformance` compares
PREBUILT = ("x64", "haswell", "alderlake", "icelake", "zen4", "sapphirerapids")  # those `setup` links llama_logits against


def run(cmd, **kw):
    print("+", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True, **kw)


def setup(_):
    os.makedirs(DIR, exist_ok=True)
    run(["npm", "install", "--prefix", DIR, "--no-save", "--ignore-scripts", "--no-audit", "--no-fund",
         "node-llama-cpp@" + NLC, "@node-llama-cpp/linux-x64@" + NLC])
    nlc = os.path.join(DIR, "node_modules", "node-llama-cpp", "llama")
    if not os.path.isdir(SRC):
        run(["git", "clone", "-q", os.path.join(nlc, "gitRelease.bundle"), SRC])
    run(["cmake", "-S", SRC, "-B", os.path.join(SRC, "build"), "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON",
         "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF"], stdout=subprocess.DEVNULL)
    run(["cmake", "--build", os.path.join(SRC, "build"), "-j", str(os.cpu_count() or 2), "--target", "llama-bench",
         "llama"], stdout=subprocess.DEVNULL)
    inc = ["-I", os.path.join(SRC, "include"), "-I", os.path.join(SRC, "ggml", "include")]
    src = os.path.join(HERE, "llama_logits.c")
    run(["cc", "-O2"] + inc + [src, "-o", os.path.join(DIR, "llama_logits"), "-L", BIN, "-lllama", "-lggml",
                               "-lggml-base", "-lm", "-Wl,-rpath," + BIN])
    pre = os.path.join(DIR, "node_modules", "@node-llama-cpp", "linux-x64", "bins", "linux-x64")
    for v in PREBUILT:  # ggml loads the best libggml-cpu-*.so beside the program: give it only one
        d = os.path.join(DIR, "variant-" + v)
        os.makedirs(d, exist_ok=True)
        libs = glob.glob(os.path.join(pre, "libllama.v*.so")) + glob.glob(os.path.join(pre, "libggml.v*.so"))
        for f in libs + [os.path.join(pre, "libggml-base.so"), os.path.join(pre, "libggml-cpu-%s.so" % v)]:
            shutil.copy(f, d)
        names = ["-l:" + os.path.basename(f) for f in libs] + ["-l:libggml-base.so"]
        run(["cc", "-O2"] + inc + [src, "-o", os.path.join(d, "llama_logits"), "-L", d] + names +
            ["-lm", "-Wl,-rpath,$ORIGIN"])
    print("llama.cpp ready in", DIR)


def bench(a):
    rows = {}
    for _ in range(a.rounds):
        out = subprocess.run([a.bin, "bench", "-m", a.model, "-p", a.p, "-n", str(a.n), "-t", a.t, "-r", str(a.r),
                              "-d", a.d, "--kv-type", a.kv_type, "--json"], check=True, capture_output=True, text=True).stdout
        for t in json.loads(out)["tests"]:
            rows.setdefault((t["name"], t["threads"]), {}).setdefault("pensieve", []).append(t["tps_mean"])
        if a.variant:
            if a.d != "0":
                sys.exit("-d is not available with --variant (tools/llama_logits.c's bench has no depth)")
            out = []
            for thr in a.t.split(","):
                r = subprocess.run([os.path.join(DIR, "variant-" + a.variant, "llama_logits"), a.model, thr, "bench", a.p,
                                    str(a.n), str(a.r)], capture_output=True, text=True)
                if r.returncode:
                    sys.exit("llama_logits bench (%s) failed: %s" % (a.variant, r.stderr.strip() or r.returncode))
                out += json.loads(r.stdout)
        else:
            r = subprocess.run([os.path.join(BIN, "llama-bench"), "-m", a.model, "-p", a.p, "-n", str(a.n), "-t", a.t,
                                "-d", a.d, "-r", str(a.r), "-o", "json"], capture_output=True, text=True)
            if r.returncode:
                sys.exit("llama-bench failed (exit %d; on a CPU with AMX, try --variant sapphirerapids): %s" %
                         (r.returncode, r.stderr.strip()[-300:]))
            out = json.loads(r.stdout)
        for t in out:
            name = "pp%d" % t["n_prompt"] if t["n_prompt"] else "tg%d" % t["n_gen"]
            if t.get("n_depth"):
                name += " @ d%d" % t["n_depth"]
            rows.setdefault((name, t["n_threads"]), {}).setdefault("llama.cpp", []).append(t["avg_ts"])
    who = "llama.cpp %s t/s" % a.variant if a.variant else "llama.cpp t/s"
    if a.kv_type == "f16":
        who += " (both F16 KV caches)"
    print("| %s | threads | pensieve t/s | %s | ratio |" % (os.path.basename(a.model), who))
    print("| --- | --- | --- | --- | --- |")
    def order(kv):
        (name, thr) = kv[0]
        depth = int(name.split(" @ d")[1]) if " @ d" in name else 0
        return (thr, name[:2] != "pp", depth, int(name.split(" ")[0][2:]))

    for (name, thr), v in sorted(rows.items(), key=order):
        p = sum(v.get("pensieve", [0])) / max(1, len(v.get("pensieve", [])))
        q = sum(v.get("llama.cpp", [0])) / max(1, len(v.get("llama.cpp", [])))
        print("| %s | %d | %.1f | %.1f | %.2f |" % (name, thr, p, q, p / q if q else 0))


def setup_arm(_):
    if not os.path.isdir(SRC):
        sys.exit("llama.cpp's source is not in %s: run `llama_compare.py setup` first" % SRC)
    for isa, march in ARM_ISAS.items():
        build = os.path.join(SRC, "build-arm64-" + isa)
        run(["cmake", "-S", SRC, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DCMAKE_SYSTEM_NAME=Linux",
             "-DCMAKE_SYSTEM_PROCESSOR=aarch64", "-DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc",
             "-DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++", "-DGGML_NATIVE=OFF", "-DGGML_CPU_ARM_ARCH=" + march,
             "-DBUILD_SHARED_LIBS=OFF", "-DGGML_OPENMP=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
             "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DCMAKE_EXE_LINKER_FLAGS=-static"],
            stdout=subprocess.DEVNULL)
        run(["cmake", "--build", build, "-j", str(os.cpu_count() or 2), "--target", "llama-bench"], stdout=subprocess.DEVNULL)
    run(["cc", "-O2", "-shared", "-fPIC", os.path.join(HERE, "qemu_icount.c"), "-o", os.path.join(DIR, "qemu_icount.so")])
    # (the static link warns that getaddrinfo needs glibc's shared libraries: bench makes no lookups)
    run(["aarch64-linux-gnu-gcc", "-O2", "-static", os.path.join(REPO, "pensieve.c"), "-o", os.path.join(DIR, "pensieve-arm64"),
         "-lpthread"])
    print("aarch64 builds ready in", DIR)


def icount(cmd, env=None, prof=None):
    """Instructions executed running cmd under qemu (prof: the plugin also writes them by block there)."""
    plugin = os.path.join(DIR, "qemu_icount.so") + (",prof=" + prof if prof else "")
    r = subprocess.run(["qemu-aarch64", "-cpu", "max,sve=off", "-plugin", plugin] + cmd, capture_output=True, text=True, env=env)
    counts = [int(x.split()[1]) for x in r.stderr.splitlines() if x.startswith("icount: ")]
    if r.returncode or not counts:
        sys.exit("%s under qemu failed (exit %d): %s" % (os.path.basename(cmd[0]), r.returncode, r.stderr.strip()[-300:]))
    return counts[-1]


def arm(a):
    env = dict(os.environ, PSV_KERNELS=a.isa)
    llama = os.path.join(SRC, "build-arm64-" + a.isa, "bin", "llama-bench")
    pens = os.path.join(DIR, "pensieve-arm64")
    for f in (llama, pens, os.path.join(DIR, "qemu_icount.so")):
        if not os.path.exists(f):
            sys.exit("%s is missing: run `llama_compare.py setup-arm` first" % f)
    def per_token(p, n, tokens):
        ours = [icount([pens, "bench", "-m", a.model, "-p", str(pi), "-n", str(ni), "-t", "1", "-r", "1"], env) for pi, ni in zip(p, n)]
        theirs = [icount([llama, "-m", a.model, "-p", str(pi), "-n", str(ni), "-t", "1", "-r", "1"]) for pi, ni in zip(p, n)]
        return (ours[1] - ours[0]) / tokens, (theirs[1] - theirs[0]) / tokens
    rows = [("prompt token (pp%d to pp%d)" % (a.p, 2 * a.p), per_token([a.p, 2 * a.p], [0, 0], 2 * a.p)),
            ("generated token (tg1 to tg%d)" % (1 + a.n), per_token([0, 0], [1, 1 + a.n], a.n))]
    print("| %s, %s | pensieve | llama.cpp | ratio |" % (os.path.basename(a.model), a.isa))
    print("| --- | --- | --- | --- |")
    for name, (ours, theirs) in rows:
        print("| instructions a %s | %.1f M | %.1f M | %.2f |" % (name, ours / 1e6, theirs / 1e6, ours / theirs))
    if not a.prof:
        return
    for what, args in (("prompt of %d tokens" % (2 * a.p), ["-p", str(2 * a.p), "-n", "0"]),
                       ("%d generated tokens" % (1 + a.n), ["-p", "0", "-n", str(1 + a.n)])):
        for who, binary, env in (("pensieve", pens, env), ("llama.cpp", llama, None)):
            print("\n%s, %s: the functions that executed the most instructions (share of the run)" % (who, what))
            cmd = [binary, "bench"] if who == "pensieve" else [binary]
            for name, share in profile(cmd + ["-m", a.model] + args + ["-t", "1", "-r", "1"], binary, a.prof, env):
                print("  %5.1f %%  %s" % (100 * share, name))


def profile(cmd, binary, top, env=None):
    """The top functions of binary by instructions executed running cmd under qemu: [(name, share)]."""
    out = os.path.join(DIR, "qemu_prof.txt")
    if os.path.exists(out):
        os.remove(out)
    icount(cmd, env, out)
    if not os.path.exists(out):
        sys.exit("%s under qemu: the plugin wrote no profile" % os.path.basename(cmd[0]))
    syms = []
    nm = subprocess.run(["aarch64-linux-gnu-nm", "-n", "--defined-only", binary], capture_output=True, text=True, check=True)
    for line in nm.stdout.splitlines():
        f = line.split()
        if len(f) == 3 and f[1] in "tTwW":
            syms.append((int(f[0], 16), f[2]))
    starts = [a for a, _ in syms]
    by = {}
    for line in open(out):
        addr, n = line.split()
        i = bisect.bisect_right(starts, int(addr, 16)) - 1
        name = syms[i][1] if i >= 0 else "?"
        by[name] = by.get(name, 0) + int(n)
    total = sum(by.values()) or 1
    return sorted(((k, v / total) for k, v in by.items()), key=lambda kv: -kv[1])[:top]


def misses(case, lines):
    refs = case["prompt_logits"] + case["gen_logits"][1:]
    rows = [json.loads(x) for x in lines]
    bad, worst = 0, 0.0
    for i, r in enumerate(refs):
        got = dict((t, v) for t, v in rows[i]["top"])
        d = abs(rows[i]["lse"] - r["lse"])
        for t, v in r["top"]:
            d = max(d, abs(got[t] - v)) if t in got else float("inf")
        bad += d > 0.15
        worst = max(worst, d)
    return len(refs), bad, worst


def conformance(a):
    shared = os.environ.get("PSV_SHARED", os.path.join(REPO, "..", "shared"))
    runners = [
        ("pensieve, batch", lambda m, c: [a.bin, "logits", "-m", m, "--ids", ids(c, True), "--ctx", "512",
                                          "--kv-type", "f32", "--top", "50", "--threads", str(a.threads), "--batch"]),
        ("pensieve, one by one", lambda m, c: [a.bin, "logits", "-m", m, "--ids", ids(c, True), "--ctx", "512",
                                               "--kv-type", "f32", "--top", "50", "--threads", str(a.threads),
                                               "--one-by-one"]),
    ]
    for mode in ("ref", "batch", "one"):
        runners.append(("llama.cpp native, " + mode, lambda m, c, mode=mode: [
            os.path.join(DIR, "llama_logits"), m, str(a.threads), mode, ids(c, False), ",".join(map(str, c["gen_ids"]))]))
    for v in VARIANTS:
        runners.append(("llama.cpp %s, ref" % v, lambda m, c, v=v: [
            os.path.join(DIR, "variant-" + v, "llama_logits"), m, str(a.threads), "ref", ids(c, False),
            ",".join(map(str, c["gen_ids"]))]))
    files = sorted(glob.glob(os.path.join(shared, "reference", "expected", "*.json")))
    print("| runner | " + " | ".join(os.path.basename(f)[:-5] for f in files) + " | total |")
    print("| --- " * (len(files) + 2) + "|")
    for name, cmd in runners:
        cells, tot_n, tot_bad = [], 0, 0
        for f in files:
            exp = json.load(open(f))
            model = os.path.join(shared, "reference", "models", os.path.basename(f)[:-5] + ".gguf")
            n = bad = 0
            worst = 0.0
            for c in exp["cases"]:
                out = subprocess.run(cmd(model, c), check=True, capture_output=True, text=True).stdout.splitlines()
                cn, cb, cw = misses(c, out)
                n, bad, worst = n + cn, bad + cb, max(worst, cw)
            cells.append("%d (%.2f)" % (bad, worst))
            tot_n, tot_bad = tot_n + n, tot_bad + bad
        print("| %s | %s | %d of %d |" % (name, " | ".join(cells), tot_bad, tot_n))
    print("\ncells: positions outside the contract (largest logit difference)")


def ids(case, with_gen):
    v = case["prompt_ids"] + (case["gen_ids"][:-1] if with_gen else [])
    return ",".join(map(str, v))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("setup")
    b = sub.add_parser("bench")
    b.add_argument("-m", dest="model", required=True)
    b.add_argument("-p", default="128,512")
    b.add_argument("-n", type=int, default=128)
    b.add_argument("-t", default="1,2")
    b.add_argument("-r", type=int, default=3)
    b.add_argument("--rounds", type=int, default=2)
    b.add_argument("-d", default="0", help="tokens already in the KV cache, comma-separated (llama-bench's -d)")
    b.add_argument("--kv-type", dest="kv_type", choices=["f32", "f16"], default="f32", help="pensieve's KV cache")
    b.add_argument("--variant", choices=PREBUILT, help="a prebuilt llama.cpp CPU library instead of the build from source")
    b.add_argument("--bin", default=os.path.join(REPO, "pensieve"))
    c = sub.add_parser("conformance")
    c.add_argument("--threads", type=int, default=2)
    c.add_argument("--bin", default=os.path.join(REPO, "pensieve"))
    sub.add_parser("setup-arm")
    r = sub.add_parser("arm")
    r.add_argument("-m", dest="model", required=True)
    r.add_argument("-p", type=int, default=32, help="prompt tokens (and twice as many)")
    r.add_argument("-n", type=int, default=4, help="generated tokens beyond the first")
    r.add_argument("--isa", choices=sorted(ARM_ISAS), default="dotprod")
    r.add_argument("--prof", type=int, default=0, metavar="N", help="then the N functions of each that execute the most")
    a = ap.parse_args()
    {"setup": setup, "bench": bench, "conformance": conformance, "setup-arm": setup_arm, "arm": arm}[a.cmd](a)


if __name__ == "__main__":
    main()

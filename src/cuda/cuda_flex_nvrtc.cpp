/*
 * Compiled (jit) mods on a device: the module text and NVRTC (see cuda_flex_jit.h). Plain C++
 * without the CUDA runtime, so that it builds into the emulated device's library and into
 * test_flex_nvrtc (which compiles modules with NVRTC on a machine without a GPU).
 *
 * NVRTC is loaded with dlopen like cuBLASLt (cuda_gemm.cu): $CTORCH_NVRTC_LIB, else
 * libnvrtc.so.13, else libnvrtc.so; the few functions used are declared here (values from its
 * nvrtc.h). The headers the module includes (cuda/cuda_flex_kernels.cuh and
 * cuda/cuda_attn_common.cuh) are handed to NVRTC by name from the texts embedded at build time.
 */
#include "cuda/cuda_flex_jit.h"

#include "ctorch/core.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

namespace {

int fail(int status, char *msg, size_t cap, const char *fmt, ...)
{
    if (msg && cap) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, cap, fmt, ap);
        va_end(ap);
    }
    return status;
}

/* ---- the module text --------------------------------------------------------------------- */

/* backend.h's prelude for NVRTC: no header exists there. */
const char PRELUDE_NVRTC[] =
    "#define CTCU_JIT_MODULE 1\n"
    "typedef signed char int8_t;\n"
    "typedef short int16_t;\n"
    "typedef int int32_t;\n"
    "typedef long long int64_t;\n"
    "typedef unsigned char uint8_t;\n"
    "typedef unsigned short uint16_t;\n"
    "typedef unsigned int uint32_t;\n"
    "typedef unsigned long long uint64_t;\n"
    "#define INFINITY __int_as_float(0x7f800000)\n"
    "#define NAN __int_as_float(0x7fffffff)\n"
    "#ifndef NULL\n#define NULL 0\n#endif\n"
    "struct ctj_arr { const void *data; int64_t shape[4], stride[4], numel, gofs; };\n";

/* The emulated device's: its cuda_runtime.h has the language, the types and the math. */
const char PRELUDE_EMU[] =
    "#define CTCU_JIT_MODULE 1\n"
    "#include <cuda_runtime.h>\n"
    "struct ctj_arr { const void *data; int64_t shape[4], stride[4], numel, gofs; };\n";

/* The entry points (%s: the element type, %d %d: EC, BR). */
const char ENTRIES[] =
    "\n#line 1 \"ctj_entries\"\n"
    "#include \"cuda/cuda_flex_kernels.cuh\"\n"
    "using namespace ctcu_flex;\n"
    "typedef %s ctj_T;\n"
    "#define CTJ_EC %d\n"
    "#define CTJ_BR %d\n"
    "static_assert(sizeof(ctj_arr) == 88, \"ctj_arr is ct_flex_jit_arr\");\n"
    "#ifdef CT_CUDA_EMULATED\n"
    "#define CTJ_SMEM float *ctj_sm = (float *)emu_dyn_shared()\n"
    "#define CTJ_ENTRY(name) extern \"C\" void name\n"
    "#else\n"
    "#define CTJ_SMEM extern __shared__ float ctj_sm[]\n"
    "#define CTJ_ENTRY(name) extern \"C\" __global__ void __launch_bounds__(FX_THREADS) name\n"
    "#endif\n"
    "CTJ_ENTRY(ctj_flex_fwd)(const ctj_T *q, const ctj_T *k, const ctj_T *v, ctj_T *out, float *lse, Dims d,\n"
    "                        Mask mk, JitMods md)\n"
    "{\n"
    "    CTJ_SMEM;\n"
    "    flex_fwd_body<ctj_T, CTJ_EC, CTJ_BR, JitMods>(ctj_sm, q, k, v, out, lse, d, mk, md);\n"
    "}\n"
    "CTJ_ENTRY(ctj_flex_dq)(const ctj_T *q, const ctj_T *k, const ctj_T *v, const ctj_T *dout, const float *lse,\n"
    "                       const float *D, ctj_T *dq, Dims d, Mask mk, JitMods md, PGrad pg)\n"
    "{\n"
    "    CTJ_SMEM;\n"
    "    flex_dq_body<ctj_T, CTJ_EC, CTJ_BR, JitMods>(ctj_sm, q, k, v, dout, lse, D, dq, d, mk, md, pg);\n"
    "}\n"
    "CTJ_ENTRY(ctj_flex_dkv)(const ctj_T *q, const ctj_T *k, const ctj_T *v, const ctj_T *dout, const float *lse,\n"
    "                        const float *D, ctj_T *dk, ctj_T *dv, Dims d, Mask mk, JitMods md)\n"
    "{\n"
    "    CTJ_SMEM;\n"
    "    flex_dkv_body<ctj_T, CTJ_EC, CTJ_BR, JitMods>(ctj_sm, q, k, v, dout, lse, D, dk, dv, d, mk, md);\n"
    "}\n";

/* The emulated device's launchers: the emulator's launch machinery runs an entry point with
 * the arguments of cudaLaunchKernel (an array of pointers to them). */
const char LAUNCHERS_EMU[] =
    "#define CTJ_A(i, T) (*(T *)a[i])\n"
    "extern \"C\" void ctj_flex_fwd__launch(const emu_cfg_t *c, void **a)\n"
    "{\n"
    "    emu_kernel(ctj_flex_fwd)[*c](CTJ_A(0, const ctj_T *), CTJ_A(1, const ctj_T *), CTJ_A(2, const ctj_T *),\n"
    "                                 CTJ_A(3, ctj_T *), CTJ_A(4, float *), CTJ_A(5, Dims), CTJ_A(6, Mask),\n"
    "                                 CTJ_A(7, JitMods));\n"
    "}\n"
    "extern \"C\" void ctj_flex_dq__launch(const emu_cfg_t *c, void **a)\n"
    "{\n"
    "    emu_kernel(ctj_flex_dq)[*c](CTJ_A(0, const ctj_T *), CTJ_A(1, const ctj_T *), CTJ_A(2, const ctj_T *),\n"
    "                                CTJ_A(3, const ctj_T *), CTJ_A(4, const float *), CTJ_A(5, const float *),\n"
    "                                CTJ_A(6, ctj_T *), CTJ_A(7, Dims), CTJ_A(8, Mask), CTJ_A(9, JitMods),\n"
    "                                CTJ_A(10, PGrad));\n"
    "}\n"
    "extern \"C\" void ctj_flex_dkv__launch(const emu_cfg_t *c, void **a)\n"
    "{\n"
    "    emu_kernel(ctj_flex_dkv)[*c](CTJ_A(0, const ctj_T *), CTJ_A(1, const ctj_T *), CTJ_A(2, const ctj_T *),\n"
    "                                 CTJ_A(3, const ctj_T *), CTJ_A(4, const float *), CTJ_A(5, const float *),\n"
    "                                 CTJ_A(6, ctj_T *), CTJ_A(7, ctj_T *), CTJ_A(8, Dims), CTJ_A(9, Mask),\n"
    "                                 CTJ_A(10, JitMods));\n"
    "}\n";

/* ---- NVRTC -------------------------------------------------------------------------------- */

typedef int nvrtc_result; /* nvrtcResult: NVRTC_SUCCESS 0 */
typedef struct _nvrtcProgram *nvrtc_program;
typedef const char *(*nv_err_fn)(nvrtc_result);
typedef nvrtc_result (*nv_version_fn)(int *, int *);
typedef nvrtc_result (*nv_create_fn)(nvrtc_program *, const char *, const char *, int, const char *const *,
                                     const char *const *);
typedef nvrtc_result (*nv_destroy_fn)(nvrtc_program *);
typedef nvrtc_result (*nv_compile_fn)(nvrtc_program, int, const char *const *);
typedef nvrtc_result (*nv_size_fn)(nvrtc_program, size_t *);
typedef nvrtc_result (*nv_get_fn)(nvrtc_program, char *);

struct Nvrtc {
    void *lib;
    char from[512];
    char why[1400];
    nv_err_fn err;
    nv_version_fn version;
    nv_create_fn create;
    nv_destroy_fn destroy;
    nv_compile_fn compile;
    nv_size_fn cubin_size, log_size;
    nv_get_fn cubin, log;
} nv;
pthread_once_t nv_once = PTHREAD_ONCE_INIT;

void nv_load(void)
{
    const char *env = getenv("CTORCH_NVRTC_LIB");
    const char *names[3];
    int n = 0;
    if (env && *env) names[n++] = env;
    names[n++] = "libnvrtc.so.13";
    names[n++] = "libnvrtc.so";
    char tried[900] = "";
    for (int i = 0; i < n && !nv.lib; i++) {
        nv.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (nv.lib) snprintf(nv.from, sizeof nv.from, "%s", names[i]);
        else {
            size_t l = strlen(tried);
            snprintf(tried + l, sizeof tried - l, "%s%s", l ? ", " : "", names[i]);
        }
    }
    if (!nv.lib) {
        snprintf(nv.why, sizeof nv.why,
                 "NVRTC (the CUDA run-time compiler) not found: tried %s ($CTORCH_NVRTC_LIB, then the loader's "
                 "path); install CUDA's NVRTC (pip: nvidia-cuda-nvrtc) or set CTORCH_NVRTC_LIB",
                 tried);
        return;
    }
#define NV_SYM(field, type, name)                                                                              \
    if (!(nv.field = (type)dlsym(nv.lib, name))) {                                                            \
        snprintf(nv.why, sizeof nv.why, "%s lacks %s", nv.from, name);                                         \
        dlclose(nv.lib);                                                                                       \
        nv.lib = NULL;                                                                                         \
        return;                                                                                                \
    }
    NV_SYM(err, nv_err_fn, "nvrtcGetErrorString")
    NV_SYM(version, nv_version_fn, "nvrtcVersion")
    NV_SYM(create, nv_create_fn, "nvrtcCreateProgram")
    NV_SYM(destroy, nv_destroy_fn, "nvrtcDestroyProgram")
    NV_SYM(compile, nv_compile_fn, "nvrtcCompileProgram")
    NV_SYM(cubin_size, nv_size_fn, "nvrtcGetCUBINSize")
    NV_SYM(cubin, nv_get_fn, "nvrtcGetCUBIN")
    NV_SYM(log_size, nv_size_fn, "nvrtcGetProgramLogSize")
    NV_SYM(log, nv_get_fn, "nvrtcGetProgramLog")
#undef NV_SYM
    /* NVRTC opens its builtins library (libnvrtc-builtins.so.<major>.<minor>) by name at the first
     * compile; beside a libnvrtc found by path (a Python wheel's), the loader would not find it:
     * load it from the same directory first (the loader then reuses it). */
    const char *slash = strrchr(nv.from, '/');
    int ma = 0, mi = 0;
    if (slash && nv.version(&ma, &mi) == 0) {
        char bi[700];
        snprintf(bi, sizeof bi, "%.*s/libnvrtc-builtins.so.%d.%d", (int)(slash - nv.from), nv.from, ma, mi);
        if (!dlopen(bi, RTLD_NOW | RTLD_GLOBAL)) { /* NVRTC then says what it misses */
        }
    }
}

double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The value of "#define NAME <int>" in src (-1 when absent). */
long define_value(const char *src, const char *name)
{
    size_t nl = strlen(name);
    for (const char *p = strstr(src, "#define"); p; p = strstr(p + 1, "#define")) {
        const char *q = p + 7;
        while (*q == ' ' || *q == '\t') q++;
        if (strncmp(q, name, nl) || (q[nl] != ' ' && q[nl] != '\t')) continue;
        char *end;
        long v = strtol(q + nl, &end, 10);
        if (end == q + nl) return -1;
        return v;
    }
    return -1;
}

} /* namespace */

extern "C" int ctcu_jit_source_flags(const char *source, int *mask, int *score, int *npg, char *msg, size_t cap)
{
    if (!source) return fail(CT_EINVAL, msg, cap, "the mods' source must not be NULL");
    long m = define_value(source, "CTJ_MASK"), s = define_value(source, "CTJ_SCORE"),
         n = define_value(source, "CTJ_NPG");
    if (m != 0 && m != 1) return fail(CT_EINVAL, msg, cap, "the mods' source lacks #define CTJ_MASK 0|1");
    if (s != 0 && s != 1) return fail(CT_EINVAL, msg, cap, "the mods' source lacks #define CTJ_SCORE 0|1");
    if (n < 0 || n > 64) return fail(CT_EINVAL, msg, cap, "the mods' source lacks #define CTJ_NPG n (0..64)");
    if (n > 0 && !s) return fail(CT_EINVAL, msg, cap, "the mods' source has CTJ_NPG %ld without a score mod", n);
    *mask = (int)m, *score = (int)s, *npg = (int)n;
    return 0;
}

extern "C" char *ctcu_jit_module_text(const char *source, int bf16, int eclass, int emulated)
{
    static const int ec[4] = {1, 2, 4, 8}, br[4] = {64, 64, 64, 32};
    if (eclass < 0 || eclass > 3) return NULL;
    const char *pre = emulated ? PRELUDE_EMU : PRELUDE_NVRTC;
    size_t cap = strlen(pre) + strlen(source) + sizeof ENTRIES + sizeof LAUNCHERS_EMU + 256;
    char *t = (char *)malloc(cap);
    if (!t) return NULL;
    int n = snprintf(t, cap, "%s#line 1 \"ctj_mods\"\n%s\n", pre, source);
    n += snprintf(t + n, cap - (size_t)n, ENTRIES, bf16 ? "uint16_t" : "float", ec[eclass], br[eclass]);
    if (emulated) snprintf(t + n, cap - (size_t)n, "%s", LAUNCHERS_EMU);
    return t;
}

extern "C" int ctcu_nvrtc_version(int *major, int *minor, char *msg, size_t cap)
{
    pthread_once(&nv_once, nv_load);
    if (!nv.lib) return fail(CT_EUNSUPPORTED, msg, cap, "%s", nv.why);
    nvrtc_result r = nv.version(major, minor);
    if (r) return fail(CT_EINTERNAL, msg, cap, "nvrtcVersion (%s): %s", nv.from, nv.err(r));
    return 0;
}

extern "C" int ctcu_nvrtc_compile(const char *text, int cc, void **cubin, size_t *len, double *seconds, char *msg,
                                  size_t cap)
{
    *cubin = NULL;
    *len = 0;
    pthread_once(&nv_once, nv_load);
    if (!nv.lib) return fail(CT_EUNSUPPORTED, msg, cap, "%s", nv.why);
    const char *hdr[2] = {ctcu_text_flex_kernels_cuh, ctcu_text_attn_common_cuh};
    const char *names[2] = {"cuda/cuda_flex_kernels.cuh", "cuda/cuda_attn_common.cuh"};
    char arch[64];
    snprintf(arch, sizeof arch, "--gpu-architecture=sm_%d%s", cc, cc == 90 ? "a" : "");
    /* NVVM's default -O3 spends 20-30 s on the fully unrolled tiles of one module (NVRTC 13.0, a
     * 2-core machine; nvcc builds cuda_flex.cu with -Xcicc -O1 for the same reason);
     * --Ofast-compile=min, the level with the least cost at run time, takes 2 s (mid 0.4 s,
     * max 1 s, both documented as trading run-time speed). */
    const char *opts[] = {arch, "-std=c++17", "--fmad=true", "--Ofast-compile=min"};
    nvrtc_program prog = NULL;
    double t0 = now_s();
    nvrtc_result r = nv.create(&prog, text, "ctj_module.cu", 2, hdr, names);
    if (r) return fail(r == 1 ? CT_ENOMEM : CT_EINTERNAL, msg, cap, "nvrtcCreateProgram: %s", nv.err(r));
    r = nv.compile(prog, (int)(sizeof opts / sizeof opts[0]), opts);
    if (seconds) *seconds = now_s() - t0;
    int st = 0;
    if (r) {
        size_t ls = 0;
        char *log = NULL;
        if (!nv.log_size(prog, &ls) && ls && (log = (char *)malloc(ls + 1)) && !nv.log(prog, log)) log[ls] = 0;
        /* the log's first lines */
        if (log) {
            int lines = 0;
            for (char *p = log; *p; p++)
                if (*p == '\n' && ++lines == 12) {
                    *p = 0;
                    break;
                }
        }
        st = fail(CT_EINTERNAL, msg, cap, "NVRTC (%s, %s) could not compile the compiled mods' module: %s: %s",
                  nv.from, arch + 19, nv.err(r), log ? log : "(no log)");
        free(log);
    } else {
        size_t n = 0;
        if ((r = nv.cubin_size(prog, &n)) || !n) {
            st = fail(CT_EINTERNAL, msg, cap, "nvrtcGetCUBINSize: %s", r ? nv.err(r) : "empty");
        } else if (!(*cubin = malloc(n))) {
            st = fail(CT_ENOMEM, msg, cap, "the CUBIN of %zu bytes", n);
        } else if ((r = nv.cubin(prog, (char *)*cubin))) {
            free(*cubin);
            *cubin = NULL;
            st = fail(CT_EINTERNAL, msg, cap, "nvrtcGetCUBIN: %s", nv.err(r));
        } else {
            *len = n;
        }
    }
    nv.destroy(&prog);
    return st;
}

/* NVRTC without a GPU: the compiled-mods module text (src/cuda/cuda_flex_jit.h: the contract's
 * prelude, a mods source, cuda_flex_kernels.cuh, the entry points) compiles to CUBIN for
 * sm_90a and sm_80 with the NVRTC of the test stack (.venv: nvidia-cuda-nvrtc, found through
 * CT_NVRTC_VENV or CTORCH_NVRTC_LIB). NVRTC missing is a failure, not a skip. Also: the
 * contract's macros are read from a source (and a source without them refused), and a source
 * that does not compile answers CT_EINTERNAL with NVRTC's log. Prints each compile's time. */
#include "cuda/cuda_flex_jit.h"
#include "test_util.h"

#include "../cuda_emu/flex_jit_samples.h"

#include <glob.h>

static void find_nvrtc(void)
{
    const char *env = getenv("CTORCH_NVRTC_LIB");
    if (env && *env) return;
    const char *venv = getenv("CT_NVRTC_VENV");
    if (!venv || !*venv) return;
    char pat[4096];
    snprintf(pat, sizeof pat, "%s/lib/python*/site-packages/nvidia/cu13/lib/libnvrtc.so.13", venv);
    glob_t g;
    if (glob(pat, 0, NULL, &g) == 0 && g.gl_pathc > 0) setenv("CTORCH_NVRTC_LIB", g.gl_pathv[0], 1);
    else fprintf(stderr, "no NVRTC at %s (scripts/setup.sh --python installs nvidia-cuda-nvrtc there)\n", pat);
    globfree(&g);
}

static void compile_one(const char *name, const char *src, int bf16, int eclass, int cc)
{
    char msg[8192];
    char *text = ctcu_jit_module_text(src, bf16, eclass, 0);
    CHECK(text != NULL);
    if (!text) return;
    void *cubin = NULL;
    size_t len = 0;
    double secs = 0;
    int rc = ctcu_nvrtc_compile(text, cc, &cubin, &len, &secs, msg, sizeof msg);
    t_checks++;
    if (rc) {
        t_failures++;
        fprintf(stderr, "  %s %s E-class %d sm_%d: %s: %s\n", name, bf16 ? "bf16" : "f32", eclass, cc,
                ct_status_name((ct_status)rc), msg);
    } else {
        /* an ELF object for the CUDA machine (EM_CUDA = 190) */
        const unsigned char *c = cubin;
        CHECK(len > 64 && !memcmp(c, "\x7f" "ELF", 4) && c[18] == 190 && c[19] == 0);
        printf("  %-6s %-4s E<=%-3d sm_%d%s: CUBIN %zu bytes in %.2f s\n", name, bf16 ? "bf16" : "f32",
               32 << eclass, cc, cc == 90 ? "a" : "", len, secs);
    }
    free(cubin);
    free(text);
}

int main(void)
{
    find_nvrtc();
    char msg[8192];
    int ma = 0, mi = 0;
    int rc = ctcu_nvrtc_version(&ma, &mi, msg, sizeof msg);
    t_checks++;
    if (rc) {
        t_failures++;
        fprintf(stderr, "NVRTC could not be loaded: %s\n", msg);
        return t_report("test_flex_nvrtc");
    }
    printf("NVRTC %d.%d from %s\n", ma, mi, getenv("CTORCH_NVRTC_LIB") ? getenv("CTORCH_NVRTC_LIB") : "the loader's path");

    /* the contract's macros */
    int m = -1, s = -1, n = -1;
    CHECK(ctcu_jit_source_flags(FJ_PAIR_SRC, &m, &s, &n, msg, sizeof msg) == 0 && m == 1 && s == 1 && n == 1);
    CHECK(ctcu_jit_source_flags(FJ_MOD3_SRC, &m, &s, &n, msg, sizeof msg) == 0 && m == 1 && s == 0 && n == 0);
    CHECK(ctcu_jit_source_flags("#define CTJ_MASK 1\n", &m, &s, &n, msg, sizeof msg) == CT_EINVAL &&
          strstr(msg, "CTJ_SCORE"));

    /* the kernels with compiled mods, both architectures */
    compile_one("pair", FJ_PAIR_SRC, 0, 1, 90);
    compile_one("relpos", FJ_RELPOS_SRC, 1, 2, 80);

    /* a source that does not compile: CT_EINTERNAL with the log */
    char *text = ctcu_jit_module_text("#define CTJ_MASK 1\n#define CTJ_SCORE 0\n#define CTJ_NPG 0\n"
                                      "__device__ bool ctj_mask(const ctj_arr *A, int64_t b, int64_t h, int64_t q,"
                                      " int64_t kv) { return undefined_name; }\n",
                                      0, 0, 0);
    void *cubin = NULL;
    size_t len = 0;
    rc = ctcu_nvrtc_compile(text, 90, &cubin, &len, NULL, msg, sizeof msg);
    CHECK(rc == CT_EINTERNAL && strstr(msg, "undefined_name") && cubin == NULL);
    free(text);
    return t_report("test_flex_nvrtc");
}

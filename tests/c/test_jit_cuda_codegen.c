/* The compiled mods' device source (src/jit/codegen_cuda.c) without a GPU: the source of each
 * (mask, score) pair of expressions below (every operator and function, int / float / bool,
 * Python's floor division and modulo, wrap-around, clamped indices, arrays of every dtype in
 * 0 to 4 dims, arrays with gradients) is compiled by the host C++ compiler (CMake gives its
 * path: CT_TEST_CXX) over a small host prelude standing for a GPU backend's (the device
 * keywords empty, __fadd_rn & co. as the plain IEEE operations, no contraction), all pairs in
 * one translation unit (a namespace each), and its ctj_mask / ctj_score / ctj_score_grad are
 * compared element by element over a grid of (b, h, q, kv) with the CPU kernels of the same
 * mods (ct_mask_mod.tile, ct_score_mod.fwd / .grad with param_grad, per element): equal bits.
 * (Both sides run on this CPU with glibc's logf; on a GPU, logf is the device's, within 1 ulp:
 * the one function the generated source does not write out.) The same sources, with a kernel
 * calling each function, are compiled to CUBIN for sm_90a and sm_80 by NVRTC (the test stack's:
 * .venv's nvidia-cuda-nvrtc through CT_NVRTC_VENV, or CTORCH_NVRTC_LIB): it must load and
 * compile them without a warning. */
#include "test_util.h"

#include "jit/jit_internal.h"

#include <dlfcn.h>
#include <glob.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef CT_TEST_CXX
#define CT_TEST_CXX ""
#endif

enum { NB = 2, NH = 3, NQ = 23, NKV = 19 };

/* ---- bound arrays ---------------------------------------------------------------------- */

static float g_bias[41];      /* f32 [41], gradient */
static float g_tab[3][41];    /* f32 [3, 41], gradient */
static float g_temp[1];       /* f32 scalar (0 dims), gradient */
static float g_b4[2][3][5][7]; /* f32 4-D, gradient */
static float g_slope[3];      /* f32 [3], no gradient */
static int32_t g_doc[NQ + 4]; /* i32 [27] */
static int64_t g_pos[4][NKV]; /* i64 [4, 19] */
static uint8_t g_keep[NQ][NKV]; /* bool [23, 19] */
static uint8_t g_u8[2][3][4];   /* u8 [2, 3, 4] */
static int64_t g_big[3];        /* i64, values near the ends of int64 */

static ct_jit_binding B_bias = {"bias", CT_DTYPE_F32, 1, {41}, g_bias, true};
static ct_jit_binding B_tab = {"tab", CT_DTYPE_F32, 2, {3, 41}, g_tab, true};
static ct_jit_binding B_temp = {"temp", CT_DTYPE_F32, 0, {0}, g_temp, true};
static ct_jit_binding B_b4 = {"b4", CT_DTYPE_F32, 4, {2, 3, 5, 7}, g_b4, true};
static ct_jit_binding B_slope = {"slope", CT_DTYPE_F32, 1, {3}, g_slope, false};
static ct_jit_binding B_doc = {"doc", CT_DTYPE_I32, 1, {NQ + 4}, g_doc, false};
static ct_jit_binding B_pos = {"pos", CT_DTYPE_I64, 2, {4, NKV}, g_pos, false};
static ct_jit_binding B_keep = {"keep", CT_DTYPE_BOOL, 2, {NQ, NKV}, g_keep, false};
static ct_jit_binding B_u8 = {"u8", CT_DTYPE_U8, 3, {2, 3, 4}, g_u8, false};
static ct_jit_binding B_big = {"big", CT_DTYPE_I64, 1, {3}, g_big, false};

typedef struct mexpr {
    const char *expr;
    const ct_jit_binding *bind[3];
    int nb;
} mexpr;

/* masks (bool results) */
static const mexpr g_masks[] = {
    {"q >= kv", {0}, 0},
    {"doc[q] == doc[kv] && q >= kv", {&B_doc}, 1},
    {"keep[q, kv] || (q - kv) % 3 == 0", {&B_keep}, 1},
    {"(q - 9) / 4 == (kv - 9) / 4 || (kv - q) % -3 == -1 || (kv - q) / -4 == 2", {0}, 0},
    {"((q & 15) ^ (kv | 3)) < 9 || !(q != kv) || (~q & 1)", {0}, 0},
    {"where(q > 10, kv * 2, kv + 100) >= q + (q % 5 == 0)", {0}, 0},
    {"u8[b, h, kv % 4] ^ (pos[h, kv] > q)", {&B_u8, &B_pos}, 2},
    {"q * 4611686018427387904 + kv * 3 > 0 != (b == 1)", {0}, 0},
    {"abs(q - kv) <= 2 * h + 1 && max(q, kv) - min(q, kv) < 9 && clamp(kv, 3, 12) != q", {0}, 0},
    {"float(q) / 3.0 > float(kv) * 0.5 - 1.25 || q / (kv - kv) == 0 && kv % 0 == 0", {0}, 0},
    {"big[kv % 3] + q < big[(q + 1) % 3] - kv || -q > ~kv", {&B_big}, 1},
    {"keep[q + 5, kv - 3] && u8[b + 1, h - 7, q]", {&B_keep, &B_u8}, 2},
    {"int(sqrt(float(q * kv))) % 4 != 1 && (q ^ kv) != 7", {0}, 0},
};

/* scores (f32 results) */
static const mexpr g_scores[] = {
    {"score + bias[q - kv + 20]", {&B_bias}, 1},
    {"score * tab[h, abs(q - kv)] + tab[h % 3, kv % 41]", {&B_tab}, 1},
    {"score * temp + slope[h] * (kv - q)", {&B_temp, &B_slope}, 2},
    {"20 * tanh(score / 20)", {0}, 0},
    {"tanh(score * 0.01) + tanh(score)", {0}, 0},
    {"exp(score * 0.1) - sigmoid(score) * 2 + exp(score * 10)", {0}, 0},
    {"log(abs(score) + 0.5) + sqrt(abs(score))", {0}, 0},
    {"score % 1.5 + score % -2.0 - floor(score * 0.7)", {0}, 0},
    {"min(score, 1.0) + max(score, -2.0) * 0.5 + clamp(score, -1.0, 3.0)", {0}, 0},
    {"where(q >= kv, score, -inf)", {0}, 0},
    {"where(score > 0, score * 2, score / 3) + (q > kv) - float(int(score * 3.7))", {0}, 0},
    {"score / float(q - kv) + float(int(score * 1e19)) * 0", {0}, 0},
    {"-score + score * b4[b, h, q % 5, kv % 7] + b4[1, h, kv % 5, q % 7]", {&B_b4}, 1},
    {"score * bias[pos[h, kv] % 41] + bias[doc[q] + 30]", {&B_bias, &B_pos, &B_doc}, 3},
    {"(bias[q] + bias[kv]) * score + bias[q] * bias[kv]", {&B_bias}, 1},
    {"score + (keep[q, kv] ? 0.5 : -0.25) + u8[b, h, 2] * temp", {&B_keep, &B_u8, &B_temp}, 3},
    {"clamp(score, tab[0, q], tab[1, kv]) + max(score * temp, bias[kv])", {&B_tab, &B_temp, &B_bias}, 3},
    {"score", {0}, 0},
    {"score * 0 + 7", {0}, 0},
    {"abs(score) + min(bias[3], score) - sigmoid(temp * score)", {&B_bias, &B_temp}, 2},
};

#define NMASK ((int)(sizeof g_masks / sizeof g_masks[0]))
#define NSCORE ((int)(sizeof g_scores / sizeof g_scores[0]))
#define NPAIR (NSCORE > NMASK ? NSCORE : NMASK)

static void fill_arrays(void)
{
    uint32_t r = 777;
#define RND() (r = r * 1103515245u + 12345u, (r >> 8) & 0xffff)
    for (int i = 0; i < 41; i++)
        g_bias[i] = ((float)RND() - 32768.0f) / 9000.0f;
    for (int i = 0; i < 3 * 41; i++)
        (&g_tab[0][0])[i] = ((float)RND() - 32768.0f) / 20000.0f;
    g_temp[0] = 0.75f;
    for (int i = 0; i < 2 * 3 * 5 * 7; i++)
        (&g_b4[0][0][0][0])[i] = ((float)RND() - 32768.0f) / 30000.0f;
    for (int i = 0; i < 3; i++)
        g_slope[i] = 0.5f / (float)(i + 1);
    for (int i = 0; i < NQ + 4; i++)
        g_doc[i] = i < 5 ? 0 : i < 6 ? 1 : i < 15 ? 2 : 3;
    for (int i = 0; i < 4 * NKV; i++)
        (&g_pos[0][0])[i] = (int64_t)(RND() % 61) - 20;
    for (int i = 0; i < NQ * NKV; i++)
        (&g_keep[0][0])[i] = RND() % 3 == 0 ? (uint8_t)(1 + RND() % 200) : 0;
    for (int i = 0; i < 2 * 3 * 4; i++)
        (&g_u8[0][0][0])[i] = (uint8_t)(RND() % 3 == 0 ? RND() % 256 : 0);
    g_big[0] = INT64_MAX - 5;
    g_big[1] = INT64_MIN + 3;
    g_big[2] = -17;
#undef RND
}

/* ---- the host prelude (a GPU backend's stand-in) ------------------------------------------ */

static const char *g_prelude =
    "#include <math.h>\n"
    "#include <stdint.h>\n"
    "#define __device__\n"
    "#define __forceinline__ inline\n"
    "struct ctj_arr { const void *data; int64_t shape[4], stride[4], numel, gofs; };\n"
    "static inline float __fadd_rn(float a, float b) { return a + b; }\n"
    "static inline float __fsub_rn(float a, float b) { return a - b; }\n"
    "static inline float __fmul_rn(float a, float b) { return a * b; }\n"
    "static inline float __fdiv_rn(float a, float b) { return a / b; }\n"
    "static inline float __fsqrt_rn(float a) { return sqrtf(a); }\n";

/* ---- the two sides ------------------------------------------------------------------------ */

typedef int (*dmask_fn)(const void *A, int64_t b, int64_t h, int64_t q, int64_t kv);
typedef float (*dscore_fn)(const void *A, float s, int64_t b, int64_t h, int64_t q, int64_t kv);
typedef float (*dgrad_fn)(const void *A, float s, int64_t b, int64_t h, int64_t q, int64_t kv,
                          float g, int64_t *pidx, float *pval);

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Equal bits; NaN matches NaN, and +0 matches -0: the CPU kernel's compiler (gcc -O3) may
 * give a sum with a zero the sign IEEE does not (score / x + float(int(y)) * 0 at score -0:
 * -0 there, +0 = -0 + +0 here), and no attention result depends on a zero's sign. */
static bool same(float a, float b)
{
    return (isnan(a) && isnan(b)) || fbits(a) == fbits(b) || (a == 0.0f && b == 0.0f);
}

static float g_s[NB][NH][NQ][NKV], g_g[NB][NH][NQ][NKV];

static void fill_scores(void)
{
    uint32_t r = 4242;
    for (int i = 0; i < NB * NH * NQ * NKV; i++) {
        r = r * 1103515245u + 12345u;
        float u = (float)((r >> 8) & 0xffffff) / 16777216.0f;
        float s = (u - 0.5f) * 24.0f; /* [-12, 12] */
        if (i % 37 == 0) s = 0.0f;
        if (i % 53 == 0) s = -0.0f;
        if (i % 61 == 0) s = 95.0f; /* exp over the top */
        if (i % 67 == 0) s = -120.0f;
        if (i % 71 == 0) s = 0.1f; /* tanh's small branch */
        (&g_s[0][0][0][0])[i] = s;
        r = r * 1103515245u + 12345u;
        float gg = ((float)((r >> 8) & 0xffff) - 32768.0f) / 16384.0f;
        if (i % 7 == 0) gg = 0.0f; /* masked elements */
        (&g_g[0][0][0][0])[i] = gg;
    }
}

typedef struct pair {
    int mi, si; /* -1: none */
    ct_mask_mod mm;
    ct_score_mod sm;
    ctj_arr A[2 * CT_JIT_MAX_ARRAYS];
    int nm;
    char *src;
    dmask_fn dmask;
    dscore_fn dscore;
    dgrad_fn dgrad;
    int npg;
} pair;

static pair g_pairs[NPAIR];

static void check_mask_pair(const pair *p)
{
    static uint8_t keep[NQ * NKV];
    int bad = 0;
    for (int b = 0; b < NB; b++)
        for (int h = 0; h < NH; h++) {
            /* both layouts of the CPU's tile: queries contiguous, and keys contiguous */
            bool qc = (b + h) % 2 == 0;
            ct_attn_tile t = {b, h, 0, NQ, 0, NKV, qc ? 1 : NKV, qc ? NQ : 1};
            memset(keep, 0xee, sizeof keep);
            p->mm.tile(p->mm.ctx, &t, keep);
            for (int q = 0; q < NQ; q++)
                for (int kv = 0; kv < NKV; kv++) {
                    int want = keep[q * t.q_stride + kv * t.kv_stride];
                    int got = p->dmask(p->A, b, h, q, kv) != 0;
                    if (want != got && bad++ < 3)
                        fprintf(stderr, "  mask '%s' at b %d h %d q %d kv %d: device %d, CPU %d\n",
                                g_masks[p->mi].expr, b, h, q, kv, got, want);
                }
        }
    CHECK(bad == 0);
}

static void check_score_pair(const pair *p)
{
    const char *e = g_scores[p->si].expr;
    static float s[NQ * NKV];
    int64_t pl = p->sm.param_len;
    float *want = NULL, *got = NULL;
    CHECK_OK(ct_calloc((void **)&want, (size_t)(pl + 1) * sizeof(float)));
    CHECK_OK(ct_calloc((void **)&got, (size_t)(pl + 1) * sizeof(float)));
    if (!want || !got) goto out;
    int bad = 0, badg = 0, badp = 0;
    int64_t pidx[64];
    float pval[64];
    CHECK(p->npg >= 0 && p->npg <= 64);
    for (int b = 0; b < NB; b++)
        for (int h = 0; h < NH; h++) {
            bool qc = (b + h) % 2 == 0;
            ct_attn_tile t = {b, h, 0, NQ, 0, NKV, qc ? 1 : NKV, qc ? NQ : 1};
            for (int q = 0; q < NQ; q++)
                for (int kv = 0; kv < NKV; kv++)
                    s[q * t.q_stride + kv * t.kv_stride] = g_s[b][h][q][kv];
            p->sm.fwd(p->sm.ctx, &t, s);
            for (int q = 0; q < NQ; q++)
                for (int kv = 0; kv < NKV; kv++) {
                    float w = s[q * t.q_stride + kv * t.kv_stride];
                    float d = p->dscore(p->A, g_s[b][h][q][kv], b, h, q, kv);
                    if (!same(w, d) && bad++ < 3)
                        fprintf(stderr, "  score '%s' at b %d h %d q %d kv %d (s %a): device %a, CPU %a\n",
                                e, b, h, q, kv, (double)g_s[b][h][q][kv], (double)d, (double)w);
                }
            /* the backward per element (a 1 x 1 tile): dL/ds and the parameter terms, added
             * in order into a zeroed vector as the CPU kernel adds them */
            for (int q = 0; q < NQ; q++)
                for (int kv = 0; kv < NKV; kv++) {
                    float sv = g_s[b][h][q][kv], gv = g_g[b][h][q][kv];
                    ct_attn_tile one = {b, h, q, 1, kv, 1, 1, 1};
                    float gw = gv;
                    memset(want, 0, (size_t)(pl + 1) * sizeof(float));
                    if (p->sm.grad) p->sm.grad(p->sm.ctx, &one, &sv, &gw, want);
                    else gw = gv == 0.0f ? 0.0f : gv; /* the identity: the flex kernel's g */
                    float gd = p->dgrad(p->A, sv, b, h, q, kv, gv, pidx, pval);
                    memset(got, 0, (size_t)(pl + 1) * sizeof(float));
                    for (int k = 0; k < p->npg; k++) {
                        if (pidx[k] < 0 || pidx[k] >= pl) {
                            if (badp++ < 3)
                                fprintf(stderr, "  score '%s': term %d index %lld outside [0, %lld)\n",
                                        e, k, (long long)pidx[k], (long long)pl);
                            continue;
                        }
                        got[pidx[k]] += pval[k];
                    }
                    if (!same(gw, gd) && badg++ < 3)
                        fprintf(stderr, "  grad '%s' at b %d h %d q %d kv %d (s %a g %a): device %a, CPU %a\n",
                                e, b, h, q, kv, (double)sv, (double)gv, (double)gd, (double)gw);
                    for (int64_t i = 0; i < pl; i++)
                        if (!same(want[i], got[i]) && badp++ < 3)
                            fprintf(stderr, "  param grad '%s'[%lld] at b %d h %d q %d kv %d: device %a, CPU %a\n",
                                    e, (long long)i, b, h, q, kv, (double)got[i], (double)want[i]);
                }
        }
    CHECK(bad == 0);
    CHECK(badg == 0);
    CHECK(badp == 0);
out:
    ct_free(want);
    ct_free(got);
}

/* ---- building -------------------------------------------------------------------------- */

static int run_cxx(const char *dir, const char *cpp, const char *so)
{
    char log[600];
    snprintf(log, sizeof log, "%s/cxx.log", dir);
    pid_t pid = fork();
    if (pid == 0) {
        FILE *f = freopen(log, "w", stderr);
        (void)f;
        dup2(2, 1);
        execl(CT_TEST_CXX, CT_TEST_CXX, "-std=c++17", "-O2", "-fPIC", "-shared", "-ffp-contract=off",
              "-fno-fast-math", "-Wall", "-Werror", "-o", so, cpp, "-lm", (char *)NULL);
        _exit(127);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid) return -1;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        FILE *f = fopen(log, "r");
        char line[400];
        int n = 0;
        fprintf(stderr, "the C++ compiler failed (status %d):\n", st);
        while (f && fgets(line, sizeof line, f) && n++ < 30)
            fputs(line, stderr);
        if (f) fclose(f);
        return -1;
    }
    return 0;
}

/* ---- NVRTC ------------------------------------------------------------------------------ */

typedef int (*nv_create_fn)(void **prog, const char *src, const char *name, int nh, const char *const *h,
                            const char *const *hn);
typedef int (*nv_compile_fn)(void *prog, int n, const char *const *opts);
typedef int (*nv_size_fn)(void *prog, size_t *n);
typedef int (*nv_get_fn)(void *prog, char *out);
typedef int (*nv_destroy_fn)(void **prog);

static const char *g_nvrtc_prelude =
    "typedef int int32_t;\n"
    "typedef long long int64_t;\n"
    "typedef unsigned char uint8_t;\n"
    "typedef unsigned short uint16_t;\n"
    "#define INFINITY __int_as_float(0x7f800000)\n"
    "#define NAN __int_as_float(0x7fffffff)\n"
    "struct ctj_arr { const void *data; int64_t shape[4], stride[4], numel, gofs; };\n";

/* Load NVRTC (CTORCH_NVRTC_LIB, else .venv's under CT_NVRTC_VENV) with its builtins library. */
static void *load_nvrtc(void)
{
    char path[4096] = "";
    const char *env = getenv("CTORCH_NVRTC_LIB");
    if (env && *env) snprintf(path, sizeof path, "%s", env);
    const char *venv = getenv("CT_NVRTC_VENV");
    if (!path[0] && venv && *venv) {
        char pat[4096];
        snprintf(pat, sizeof pat, "%s/lib/python*/site-packages/nvidia/cu13/lib/libnvrtc.so.13", venv);
        glob_t g;
        if (glob(pat, 0, NULL, &g) == 0 && g.gl_pathc > 0) snprintf(path, sizeof path, "%s", g.gl_pathv[0]);
        globfree(&g);
    }
    if (!path[0]) {
        fprintf(stderr, "NVRTC: neither CTORCH_NVRTC_LIB nor an NVRTC under CT_NVRTC_VENV (%s; "
                        "scripts/setup.sh --python installs nvidia-cuda-nvrtc there)\n", venv ? venv : "unset");
        return NULL;
    }
    /* NVRTC opens its builtins by name: load them from the same directory first */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) {
        *slash = '\0';
        char pat[4200];
        snprintf(pat, sizeof pat, "%s/libnvrtc-builtins.so.*", dir);
        glob_t g;
        if (glob(pat, 0, NULL, &g) == 0)
            for (size_t i = 0; i < g.gl_pathc; i++)
                if (!strstr(g.gl_pathv[i], ".alt.")) dlopen(g.gl_pathv[i], RTLD_NOW | RTLD_GLOBAL);
        globfree(&g);
    }
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!dl) fprintf(stderr, "NVRTC: cannot load %s: %s\n", path, dlerror());
    return dl;
}

/* Compile text to CUBIN for arch ("sm_90a"); 0 and no warning in the log, else 1. */
static int nvrtc_compile(void *dl, const char *text, const char *arch)
{
    nv_create_fn create;
    nv_compile_fn compile;
    nv_size_fn logsize, cubinsize;
    nv_get_fn getlog;
    nv_destroy_fn destroy;
    *(void **)&create = dlsym(dl, "nvrtcCreateProgram");
    *(void **)&compile = dlsym(dl, "nvrtcCompileProgram");
    *(void **)&logsize = dlsym(dl, "nvrtcGetProgramLogSize");
    *(void **)&getlog = dlsym(dl, "nvrtcGetProgramLog");
    *(void **)&cubinsize = dlsym(dl, "nvrtcGetCUBINSize");
    *(void **)&destroy = dlsym(dl, "nvrtcDestroyProgram");
    if (!create || !compile || !logsize || !getlog || !cubinsize || !destroy) {
        fprintf(stderr, "NVRTC: missing entry points\n");
        return 1;
    }
    void *prog = NULL;
    if (create(&prog, text, "mods.cu", 0, NULL, NULL) != 0) return 1;
    char opt[64];
    snprintf(opt, sizeof opt, "--gpu-architecture=%s", arch);
    const char *opts[] = {opt, "-std=c++17"};
    int rc = compile(prog, 2, opts);
    size_t ln = 0, cn = 0;
    logsize(prog, &ln);
    char *log = calloc(ln + 1, 1);
    if (log) getlog(prog, log);
    cubinsize(prog, &cn);
    int bad = rc != 0 || cn == 0 || (log && (strstr(log, "warning") || strstr(log, "error")));
    if (bad) fprintf(stderr, "NVRTC %s: status %d, CUBIN %zu bytes, log:\n%.3000s\n", arch, rc, cn, log ? log : "");
    else printf("NVRTC %s: the generated sources compile (CUBIN %zu bytes)\n", arch, cn);
    free(log);
    destroy(&prog);
    return bad;
}

int main(void)
{
    if (!CT_TEST_CXX[0]) {
        fprintf(stderr, "test_jit_cuda_codegen: no C++ compiler was configured (CT_TEST_CXX): "
                        "CMake's CMAKE_CXX_COMPILER is needed\n");
        return 1;
    }
    char dir[96]; /* TMPDIR of up to ~70 bytes */
    const char *tmp = getenv("TMPDIR");
    int dn = snprintf(dir, sizeof dir, "%s/ctorch-test-jitcu-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (dn < 0 || (size_t)dn >= sizeof dir || !mkdtemp(dir)) {
        fprintf(stderr, "cannot make a temporary directory under TMPDIR (at most ~70 bytes here)\n");
        return 1;
    }
    char cache[128];
    snprintf(cache, sizeof cache, "%s/cache", dir);
    setenv("CT_CACHE_DIR", cache, 1);
    fill_arrays();
    fill_scores();

    /* the CPU mods, compiled in one batch */
    ct_jit_request req[NMASK + NSCORE];
    ct_jit_binding binds[NMASK + NSCORE][3];
    int nr = 0;
    for (int i = 0; i < NPAIR; i++) {
        pair *p = &g_pairs[i];
        p->mi = i < NMASK ? i : -1;
        p->si = i < NSCORE ? i : -1;
        if (p->mi >= 0) {
            const mexpr *m = &g_masks[p->mi];
            for (int k = 0; k < m->nb; k++)
                binds[nr][k] = *m->bind[k], binds[nr][k].requires_grad = false;
            req[nr] = (ct_jit_request){m->expr, binds[nr], m->nb, NULL, &p->mm};
            nr++;
        }
        if (p->si >= 0) {
            const mexpr *m = &g_scores[p->si];
            for (int k = 0; k < m->nb; k++)
                binds[nr][k] = *m->bind[k];
            req[nr] = (ct_jit_request){m->expr, binds[nr], m->nb, &p->sm, NULL};
            nr++;
        }
    }
    ct_status st = ct_mod_compile_many(req, nr, NULL);
    CHECK_OK(st);
    if (st != CT_OK) return t_failures;

    /* the device sources, one namespace each in one translation unit */
    char cpp[128], so[128];
    snprintf(cpp, sizeof cpp, "%s/mods.cpp", dir);
    snprintf(so, sizeof so, "%s/mods.so", dir);
    FILE *f = fopen(cpp, "w");
    CHECK(f != NULL);
    if (!f) return t_failures;
    fputs(g_prelude, f);
    size_t ncap = 1 << 20, nlen = 0;
    char *nv = malloc(ncap);
    CHECK(nv != NULL);
    if (!nv) return t_failures;
    nlen = (size_t)snprintf(nv, ncap, "%s", g_nvrtc_prelude);
    for (int i = 0; i < NPAIR; i++) {
        pair *p = &g_pairs[i];
        const ctj_arr *ma = NULL, *sa = NULL;
        const jir *mir = p->mi >= 0 ? jit_mask_mod_ir(&p->mm, &ma) : NULL;
        const jir *sir = p->si >= 0 ? jit_score_mod_ir(&p->sm, &sa) : NULL;
        CHECK(p->mi < 0 || mir);
        CHECK(p->si < 0 || sir);
        if ((p->mi >= 0 && !mir) || (p->si >= 0 && !sir)) return t_failures;
        p->nm = mir ? mir->narr : 0;
        for (int k = 0; mir && k < mir->narr; k++)
            p->A[k] = ma[k];
        for (int k = 0; sir && k < sir->narr; k++)
            p->A[p->nm + k] = sa[k];
        CHECK_OK(jit_codegen_device(mir, sir, &p->src));
        if (!p->src) return t_failures;
        CHECK(!strstr(p->src, "#include"));
        fprintf(f, "\n#undef CTJ_MASK\n#undef CTJ_SCORE\n#undef CTJ_NPG\nnamespace t%d {\n%s}\n", i,
                p->src);
        size_t need = nlen + strlen(p->src) + 1024;
        if (need > ncap) {
            while (need > ncap) ncap *= 2;
            char *bigger = realloc(nv, ncap);
            CHECK(bigger != NULL);
            if (!bigger) return t_failures;
            nv = bigger;
        }
        nlen += (size_t)snprintf(nv + nlen, ncap - nlen,
                                 "\n#undef CTJ_MASK\n#undef CTJ_SCORE\n#undef CTJ_NPG\nnamespace t%d {\n%s}\n"
                                 "extern \"C\" __global__ void k%d(const ctj_arr *A, float *o, int64_t *pi, "
                                 "float *pv)\n{\n    int64_t q = threadIdx.x, kv = blockIdx.x;\n",
                                 i, p->src, i);
        if (mir) nlen += (size_t)snprintf(nv + nlen, ncap - nlen, "    if (!t%d::ctj_mask(A, 0, 1, q, kv)) return;\n", i);
        if (sir)
            nlen += (size_t)snprintf(nv + nlen, ncap - nlen,
                                     "    o[q] = t%d::ctj_score(A, o[q], 0, 1, q, kv) + "
                                     "t%d::ctj_score_grad(A, o[q], 0, 1, q, kv, 0.5f, pi, pv);\n",
                                     i, i);
        else nlen += (size_t)snprintf(nv + nlen, ncap - nlen, "    o[q] = 1.0f;\n");
        nlen += (size_t)snprintf(nv + nlen, ncap - nlen, "}\n");
        if (mir)
            fprintf(f, "extern \"C\" int t%d_mask(const ctj_arr *A, int64_t b, int64_t h, int64_t q, "
                       "int64_t kv) { return t%d::ctj_mask(A, b, h, q, kv) && CTJ_MASK; }\n",
                    i, i);
        if (sir)
            fprintf(f,
                    "extern \"C\" float t%d_score(const ctj_arr *A, float s, int64_t b, int64_t h, "
                    "int64_t q, int64_t kv) { return CTJ_SCORE ? t%d::ctj_score(A, s, b, h, q, kv) : 0; }\n"
                    "extern \"C\" float t%d_grad(const ctj_arr *A, float s, int64_t b, int64_t h, "
                    "int64_t q, int64_t kv, float g, int64_t *pi, float *pv) { return "
                    "t%d::ctj_score_grad(A, s, b, h, q, kv, g, pi, pv); }\n"
                    "extern \"C\" int t%d_npg(void) { return CTJ_NPG; }\n",
                    i, i, i, i, i);
    }
    fclose(f);
    if (run_cxx(dir, cpp, so) != 0) {
        CHECK(!"the generated sources compile");
        fprintf(stderr, "(sources kept in %s)\n", dir);
        return t_failures;
    }
    /* NVRTC, both architectures the CUDA library is built for */
    void *nvrtc = load_nvrtc();
    CHECK(nvrtc != NULL);
    if (nvrtc) {
        CHECK(nvrtc_compile(nvrtc, nv, "sm_90a") == 0);
        CHECK(nvrtc_compile(nvrtc, nv, "sm_80") == 0);
    }
    free(nv);
    void *dl = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    CHECK(dl != NULL);
    if (!dl) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return t_failures;
    }
    for (int i = 0; i < NPAIR; i++) {
        pair *p = &g_pairs[i];
        char name[32];
        if (p->mi >= 0) {
            snprintf(name, sizeof name, "t%d_mask", i);
            *(void **)&p->dmask = dlsym(dl, name);
            CHECK(p->dmask != NULL);
            if (p->dmask) check_mask_pair(p);
        }
        if (p->si >= 0) {
            snprintf(name, sizeof name, "t%d_score", i);
            *(void **)&p->dscore = dlsym(dl, name);
            snprintf(name, sizeof name, "t%d_grad", i);
            *(void **)&p->dgrad = dlsym(dl, name);
            snprintf(name, sizeof name, "t%d_npg", i);
            int (*npg)(void);
            *(void **)&npg = dlsym(dl, name);
            CHECK(p->dscore && p->dgrad && npg);
            if (!p->dscore || !p->dgrad || !npg) continue;
            p->npg = npg();
            check_score_pair(p);
        }
    }
    /* the generated text: the defines of the contract, the terms of the gradients */
    CHECK(strstr(g_pairs[0].src, "#define CTJ_MASK 1") && strstr(g_pairs[0].src, "#define CTJ_SCORE 1") &&
          strstr(g_pairs[0].src, "#define CTJ_NPG 1"));
    CHECK(g_pairs[14].npg == 2); /* bias[q] and bias[kv], each read twice: one shared node each */
    CHECK(g_pairs[3].npg == 0 && g_pairs[17].npg == 0);
    CHECK(strstr(g_pairs[NMASK].src, "#define CTJ_MASK 0"));
    char *only = NULL;
    CHECK_OK(jit_codegen_device(jit_mask_mod_ir(&g_pairs[1].mm, NULL), NULL, &only));
    CHECK(only && strstr(only, "#define CTJ_SCORE 0") && strstr(only, "#define CTJ_NPG 0") &&
          !strstr(only, "ctj_score("));
    ct_free(only);
    CHECK_STATUS(jit_codegen_device(NULL, NULL, &only), CT_EINVAL);
    CHECK(jit_mask_mod_ir(NULL, NULL) == NULL && jit_score_mod_ir(NULL, NULL) == NULL);
    ct_mask_mod causal;
    CHECK_OK(ct_mask_mod_causal(&causal));
    CHECK(jit_mask_mod_ir(&causal, NULL) == NULL); /* a built-in is not a compiled mod */
    ct_mask_mod_free(&causal);

    for (int i = 0; i < NPAIR; i++) {
        ct_free(g_pairs[i].src);
        if (g_pairs[i].mi >= 0) ct_mask_mod_free(&g_pairs[i].mm);
        if (g_pairs[i].si >= 0) ct_score_mod_free(&g_pairs[i].sm);
    }
    dlclose(dl);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (t_failures == 0 && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    printf("test_jit_cuda_codegen: %d checks, %d failures\n", t_checks, t_failures);
    return t_failures;
}

/*
 * Compiled (jit) mods on the GPU (backend.h: "compiled (jit) mods on a device"): the slots
 * flex_jit_identity, flex_jit_build, flex_jit_load, flex_jit_unload, and the launches of a
 * module's kernels for flex_fwd / flex_bwd (cuda_flex.cu calls them after its own checks).
 *
 * build: the module text (cuda_flex_jit.h: the prelude of the contract, the mods' source,
 *   cuda_flex_kernels.cuh, the entry points ctj_flex_fwd / ctj_flex_dq / ctj_flex_dkv for one
 *   element type and head-dim class) compiled by NVRTC (cuda_flex_nvrtc.cpp, dlopen) for the
 *   device's own architecture (sm_XY; sm_90a on 9.0) to CUBIN. On the emulated device the host
 *   C++ compiler builds the same text into a shared object (tests/cuda_emu/emu_rtc.cpp).
 * image: a 64-byte header (magic "CTJFLEX", version, payload kind, dtype, head-dim class, the
 *   source's CTJ_MASK / CTJ_SCORE / CTJ_NPG, the architecture, the payload's size and FNV-1a
 *   hash) and the payload (the CUBIN, or the emulated device's shared object). load checks all
 *   of it (a damaged or foreign image: CT_EFORMAT) before cudaLibraryLoadData.
 * launch: the module's kernels through cudaLaunchKernel with their cudaKernel_t (dynamic shared
 *   memory opted in on the handle), over the bound arrays' descriptors copied to the device.
 * param grads (CTJ_NPG > 0 and ct_flex_jit.param_grad set): the dq pass's blocks own fixed
 *   consecutive ranges of its units; each warp adds its pairs' terms in a fixed order (rows,
 *   key blocks, lanes in order, one lane adding) into its own partial vector in scratch; a
 *   reduce kernel then adds the partials in order into param_grad: no atomics, the same bits
 *   run to run. The partials take groups * 8 * param_len floats, bounded by
 *   ct_flex_jit.grad_scratch_bytes (0: 64 MiB) by using fewer groups.
 */
#include "cuda/cuda_flex_jit.h"
#include "cuda/cuda_flex_kernels.cuh"
#include "cuda/cuda_internal.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CTJ_IMAGE_VERSION 1u
#define CTJ_KIND_CUBIN 1u
#define CTJ_KIND_EMU 2u
#define CTJ_MODULE_MAGIC 0x43544a4du
#define CTJ_GRAD_SCRATCH_DEFAULT ((size_t)64 << 20)

namespace {

using namespace ctcu_flex;

#ifdef CT_CUDA_EMULATED
const uint32_t KIND = CTJ_KIND_EMU;
#else
const uint32_t KIND = CTJ_KIND_CUBIN;
#endif

struct ImageHeader {
    char magic[8]; /* "CTJFLEX" */
    uint32_t version, kind;
    int32_t dtype, eclass, mask, score, npg, cc;
    uint64_t payload; /* bytes after the header */
    uint64_t hash;    /* FNV-1a 64 of the payload */
    uint8_t pad[8];
};
static_assert(sizeof(ImageHeader) == 64, "the image header is 64 bytes");

struct Module {
    uint32_t magic;
    int dtype, eclass, mask, score, npg;
    cudaLibrary_t lib;
    cudaKernel_t fwd, dq, dkv;
};

/* The kernels' JitMods argument as the host lays it out (cuda_flex_kernels.cuh). */
struct JitModsArg {
    Mods m;
    const void *A;
};

static_assert(sizeof(ct_flex_jit_arr) == 88, "ct_flex_jit_arr is the modules' ctj_arr");

uint64_t fnv1a(const void *p, size_t n)
{
    const unsigned char *c = (const unsigned char *)p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 1099511628211ull;
    return h;
}

/* The device's compute capability (major * 10 + minor). */
int device_cc(ct_backend *b, int *cc)
{
    int dev = ctcu_device(b), ma = 0, mi = 0;
    int rc = ctcu_check(cudaDeviceGetAttribute(&ma, cudaDevAttrComputeCapabilityMajor, dev), "flex_jit: device");
    if (!rc) rc = ctcu_check(cudaDeviceGetAttribute(&mi, cudaDevAttrComputeCapabilityMinor, dev), "flex_jit: device");
    *cc = ma * 10 + mi;
    return rc;
}

const Module *module_of(const ct_flex_jit *j)
{
    const Module *m = (const Module *)j->module;
    return m && m->magic == CTJ_MODULE_MAGIC ? m : NULL;
}

/* The bound arrays' descriptors on the device (NULL when there are none). */
int upload_arrays(ct_backend *b, const ct_flex_jit *j, void **out)
{
    *out = NULL;
    if (j->narr == 0) return 0;
    size_t bytes = (size_t)j->narr * sizeof(ct_flex_jit_arr);
    int rc = ctcu_scratch(b, bytes, out);
    if (rc) return rc;
    rc = ctcu_check(cudaMemcpyAsync(*out, j->arr, bytes, cudaMemcpyHostToDevice, ctcu_stream(b)),
                    "flex_jit: the bound arrays' descriptors");
    if (rc) {
        ctcu_scratch_free(b, *out);
        *out = NULL;
    }
    return rc;
}

int opt_in(cudaKernel_t k, size_t bytes, const char *what)
{
    return ctcu_check(cudaFuncSetAttribute((const void *)k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes),
                      what);
}

int launch(ct_backend *b, cudaKernel_t k, unsigned grid, size_t smem, void **args, const char *what)
{
    int rc = ctcu_check(cudaLaunchKernel((const void *)k, dim3(grid), dim3(FX_THREADS), args, smem, ctcu_stream(b)),
                        what);
    return rc ? rc : ctcu_launched(what);
}

/* param_grad[i] += sum over the partial vectors v (in order) of part[v * len + i]. */
__global__ void __launch_bounds__(256) k_pgrad_reduce(float *pg, const float *part, int64_t nvec, int64_t len)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < len; i += (int64_t)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int64_t v = 0; v < nvec; v++) s += part[v * len + i];
        pg[i] += s;
    }
}

} /* namespace */

/* ---- slots -------------------------------------------------------------------------------------- */

extern "C" int ctcu_flex_jit_identity(ct_backend *b, char *out, size_t cap)
{
    if (!out || cap == 0) return ctcu_fail(CT_EINVAL, "flex_jit_identity: out must not be NULL");
    int cc = 0;
    int rc = device_cc(b, &cc);
    if (rc) return rc;
#ifdef CT_CUDA_EMULATED
    int n = snprintf(out, cap, "emulated %s sm_%d image %u", emu_rtc_compiler(), cc, CTJ_IMAGE_VERSION);
#else
    int ma = 0, mi = 0;
    char msg[1024];
    if ((rc = ctcu_nvrtc_version(&ma, &mi, msg, sizeof msg))) return ctcu_fail(rc, "flex_jit_identity: %s", msg);
    int n = snprintf(out, cap, "nvrtc %d.%d sm_%d%s image %u", ma, mi, cc, cc == 90 ? "a" : "", CTJ_IMAGE_VERSION);
#endif
    if (n < 0 || (size_t)n >= cap) return ctcu_fail(CT_EINVAL, "flex_jit_identity: %zu bytes are too few", cap);
    return 0;
}

extern "C" int ctcu_flex_jit_build(ct_backend *b, const char *source, ct_dtype dtype, int64_t E, void **image,
                                   size_t *len)
{
    if (!source || !image || !len) return ctcu_fail(CT_EINVAL, "flex_jit_build: source, image and len must not be NULL");
    *image = NULL;
    *len = 0;
    if (dtype != CT_DTYPE_F32 && dtype != CT_DTYPE_BF16)
        return ctcu_fail(CT_EUNSUPPORTED, "flex_jit_build: q, k, v must be f32 or bf16 (dtype %d)", (int)dtype);
    if (E < 1 || E > FX_E_MAX)
        return ctcu_fail(E < 1 ? CT_EINVAL : CT_EUNSUPPORTED, "flex_jit_build on cuda: head dim E = %lld is not in [1, %d]",
                         (long long)E, FX_E_MAX);
    char msg[4096];
    int mask = 0, score = 0, npg = 0, cc = 0;
    int rc = ctcu_jit_source_flags(source, &mask, &score, &npg, msg, sizeof msg);
    if (rc) return ctcu_fail(rc, "flex_jit_build: %s", msg);
    if ((rc = device_cc(b, &cc))) return rc;
    int ec = e_class(E);
    char *text = ctcu_jit_module_text(source, dtype == CT_DTYPE_BF16, ec, KIND == CTJ_KIND_EMU);
    if (!text) return ctcu_fail(CT_ENOMEM, "flex_jit_build: the module's text");
    void *payload = NULL;
    size_t n = 0;
#ifdef CT_CUDA_EMULATED
    if (emu_rtc_compile(text, &payload, &n, msg, sizeof msg))
        rc = ctcu_fail(CT_EINTERNAL, "flex_jit_build (emulated device): %s", msg);
#else
    double secs = 0;
    rc = ctcu_nvrtc_compile(text, cc, &payload, &n, &secs, msg, sizeof msg);
    if (rc) rc = ctcu_fail(rc, "flex_jit_build: %s", msg);
#endif
    free(text);
    if (rc) return rc;
    unsigned char *img = (unsigned char *)malloc(sizeof(ImageHeader) + n);
    if (!img) {
        free(payload);
        return ctcu_fail(CT_ENOMEM, "flex_jit_build: an image of %zu bytes", n);
    }
    ImageHeader h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, "CTJFLEX", 8);
    h.version = CTJ_IMAGE_VERSION;
    h.kind = KIND;
    h.dtype = (int32_t)dtype, h.eclass = ec, h.mask = mask, h.score = score, h.npg = npg, h.cc = cc;
    h.payload = n;
    h.hash = fnv1a(payload, n);
    memcpy(img, &h, sizeof h);
    memcpy(img + sizeof h, payload, n);
    free(payload);
    *image = img;
    *len = sizeof h + n;
    return 0;
}

extern "C" int ctcu_flex_jit_load(ct_backend *b, const void *image, size_t len, void **module)
{
    if (!image || !module) return ctcu_fail(CT_EINVAL, "flex_jit_load: image and module must not be NULL");
    *module = NULL;
    ImageHeader h;
    if (len < sizeof h + 4) return ctcu_fail(CT_EFORMAT, "flex_jit_load: an image of %zu bytes is too short", len);
    memcpy(&h, image, sizeof h);
    const unsigned char *pl = (const unsigned char *)image + sizeof h;
    if (memcmp(h.magic, "CTJFLEX", 8) != 0)
        return ctcu_fail(CT_EFORMAT, "flex_jit_load: not a compiled-mods image (bad magic)");
    if (h.version != CTJ_IMAGE_VERSION || h.kind != KIND)
        return ctcu_fail(CT_EFORMAT, "flex_jit_load: image version %u kind %u, this library makes version %u kind %u",
                         h.version, h.kind, CTJ_IMAGE_VERSION, KIND);
    if (h.payload != len - sizeof h)
        return ctcu_fail(CT_EFORMAT, "flex_jit_load: the image says %llu payload bytes, it has %zu",
                         (unsigned long long)h.payload, len - sizeof h);
    if (fnv1a(pl, len - sizeof h) != h.hash || memcmp(pl, "\x7f" "ELF", 4) != 0)
        return ctcu_fail(CT_EFORMAT, "flex_jit_load: the image is damaged (its hash or ELF magic does not match)");
    if ((h.dtype != CT_DTYPE_F32 && h.dtype != CT_DTYPE_BF16) || h.eclass < 0 || h.eclass > 3 || h.mask < 0 ||
        h.mask > 1 || h.score < 0 || h.score > 1 || h.npg < 0 || h.npg > 64)
        return ctcu_fail(CT_EFORMAT, "flex_jit_load: the image's header is damaged");
    int cc = 0, rc = device_cc(b, &cc);
    if (rc) return rc;
    if (h.cc != cc)
        return ctcu_fail(CT_EFORMAT, "flex_jit_load: the image is for sm_%d, the device is sm_%d", h.cc, cc);
    /* the payload at a fresh, aligned address */
    void *code = malloc(len - sizeof h);
    if (!code) return ctcu_fail(CT_ENOMEM, "flex_jit_load: %zu bytes", len - sizeof h);
    memcpy(code, pl, len - sizeof h);
    Module *m = (Module *)calloc(1, sizeof *m);
    if (!m) {
        free(code);
        return ctcu_fail(CT_ENOMEM, "flex_jit_load: the module");
    }
    rc = ctcu_check(cudaLibraryLoadData(&m->lib, code, NULL, NULL, 0, NULL, NULL, 0), "flex_jit_load: cudaLibraryLoadData");
    free(code);
    if (rc) {
        free(m);
        if (rc == CT_ENOMEM) return rc;
        char why[512];
        snprintf(why, sizeof why, "%s", ctcu_last_error());
#ifdef CT_CUDA_EMULATED
        return ctcu_fail(CT_EFORMAT, "%s (%s)", why, emu_rtc_last_error());
#else
        return ctcu_fail(CT_EFORMAT, "%s", why);
#endif
    }
    if (cudaLibraryGetKernel(&m->fwd, m->lib, "ctj_flex_fwd") != cudaSuccess ||
        cudaLibraryGetKernel(&m->dq, m->lib, "ctj_flex_dq") != cudaSuccess ||
        cudaLibraryGetKernel(&m->dkv, m->lib, "ctj_flex_dkv") != cudaSuccess) {
        cudaGetLastError();
        cudaLibraryUnload(m->lib);
        free(m);
        return ctcu_fail(CT_EFORMAT, "flex_jit_load: the image lacks the flex entry points");
    }
    m->magic = CTJ_MODULE_MAGIC;
    m->dtype = h.dtype, m->eclass = h.eclass, m->mask = h.mask, m->score = h.score, m->npg = h.npg;
    *module = m;
    return 0;
}

extern "C" void ctcu_flex_jit_unload(ct_backend *b, void *module)
{
    Module *m = (Module *)module;
    if (!m || m->magic != CTJ_MODULE_MAGIC) return;
    ctcu_use_device(b);
    cudaLibraryUnload(m->lib);
    m->magic = 0;
    free(m);
}

/* ---- launches (from cuda_flex.cu) ------------------------------------------------------------- */

namespace ctcu_flex {

int ctcu_flex_jit_check(const char *slot, const ct_flex_args *a)
{
    const ct_flex_jit *j = a->mods.compiled;
    const Module *m = module_of(j);
    if (!m) return ctcu_fail(CT_EINVAL, "%s: compiled mods need their module (flex_jit_load) in compiled->module", slot);
    if (m->dtype != (int)a->attn.dtype || m->eclass != e_class(a->attn.E))
        return ctcu_fail(CT_EINVAL,
                         "%s: the compiled mods' module is for dtype %d and head dims up to %d, the call has dtype %d "
                         "and E = %lld",
                         slot, m->dtype, 32 << m->eclass, (int)a->attn.dtype, (long long)a->attn.E);
    if (m->score && a->mods.score != CT_FLEX_SCORE_NONE)
        return ctcu_fail(CT_EINVAL, "%s: a compiled score mod replaces the built-in score: mods.score must be NONE", slot);
    if (j->narr < 0 || j->narr > CT_FLEX_JIT_MAX_ARRAYS)
        return ctcu_fail(CT_EINVAL, "%s: compiled->narr = %d is not in [0, %d]", slot, j->narr, CT_FLEX_JIT_MAX_ARRAYS);
    for (int i = 0; i < j->narr; i++)
        if (!j->arr[i].data && j->arr[i].numel > 0)
            return ctcu_fail(CT_EINVAL, "%s: compiled->arr[%d].data must not be NULL", slot, i);
    if (j->param_grad && j->param_len < 0)
        return ctcu_fail(CT_EINVAL, "%s: compiled->param_len must be >= 0", slot);
    return 0;
}

int ctcu_flex_jit_fwd(ct_backend *b, const ct_flex_args *a, const Setup &s)
{
    const Module *m = module_of(a->mods.compiled);
    int c = m->eclass, br = class_br(c);
    size_t sh = smem_fwd(s.d.E, br);
    int rc = opt_in(m->fwd, sh, "flex_fwd (compiled mods): shared memory");
    if (rc) return rc;
    void *A = NULL;
    if ((rc = upload_arrays(b, a->mods.compiled, &A))) return rc;
    const ct_attn_args *at = &a->attn;
    JitModsArg jm = {s.md, A};
    Dims d = s.d;
    Mask mk = s.mk;
    const void *q = at->q, *k = at->k, *v = at->v;
    void *out = at->out;
    float *lse = at->lse;
    void *args[] = {&q, &k, &v, &out, &lse, &d, &mk, &jm};
    int64_t units = (s.d.T + br - 1) / br * s.d.B * s.d.H;
    rc = launch(b, m->fwd, unit_grid(units), sh, args, "flex_fwd (compiled mods)");
    if (A) ctcu_scratch_free(b, A);
    return rc;
}

int ctcu_flex_jit_bwd(ct_backend *b, const ct_flex_args *a, const ct_attn_grads *g, const Setup &s, const float *D)
{
    const ct_flex_jit *j = a->mods.compiled;
    const Module *m = module_of(j);
    const ct_attn_args *at = &a->attn;
    int c = m->eclass, br = class_br(c), rc = 0;
    bool pgrad = j->param_grad && m->npg > 0 && j->param_len > 0;
    void *A = NULL;
    if ((rc = upload_arrays(b, j, &A))) return rc;
    JitModsArg jm = {s.md, A};
    Dims d = s.d;
    Mask mk = s.mk;
    const void *q = at->q, *k = at->k, *v = at->v, *dout = g->dout;
    const float *lse = at->lse;
    void *part = NULL;
    if (g->dq || pgrad) {
        int64_t units = (s.d.T + br - 1) / br * s.d.B * s.d.H;
        unsigned grid = unit_grid(units);
        PGrad pg = {NULL, 0, 0};
        if (pgrad) {
            size_t bound = j->grad_scratch_bytes ? j->grad_scratch_bytes : CTJ_GRAD_SCRATCH_DEFAULT;
            size_t group = (size_t)FX_WARPS * (size_t)j->param_len * sizeof(float);
            if (group > bound) {
                rc = ctcu_fail(CT_EINVAL,
                               "flex_bwd (compiled mods): the parameter gradient of %lld values needs %zu bytes of "
                               "partial sums per block group, above grad_scratch_bytes = %zu",
                               (long long)j->param_len, group, bound);
                goto out;
            }
            int64_t ng = (int64_t)(bound / group);
            if (ng > units) ng = units;
            if (ng > 65535) ng = 65535;
            int64_t per = (units + ng - 1) / ng;
            ng = (units + per - 1) / per;
            grid = (unsigned)ng;
            size_t bytes = (size_t)ng * group;
            if ((rc = ctcu_scratch(b, bytes, &part))) goto out;
            if ((rc = ctcu_check(cudaMemsetAsync(part, 0, bytes, ctcu_stream(b)), "flex_bwd: zero the partial sums")))
                goto out;
            pg = {(float *)part, j->param_len, per};
        }
        size_t sh = smem_dq(s.d.E, br);
        if ((rc = opt_in(m->dq, sh, "flex_bwd (compiled mods): shared memory (dq)"))) goto out;
        void *dq = g->dq;
        void *args[] = {&q, &k, &v, &dout, &lse, &D, &dq, &d, &mk, &jm, &pg};
        if ((rc = launch(b, m->dq, grid, sh, args, "flex_bwd (compiled mods): dq"))) goto out;
        if (pgrad) {
            int64_t nvec = (int64_t)grid * FX_WARPS;
            k_pgrad_reduce<<<ctcu_blocks(j->param_len, 256), 256, 0, ctcu_stream(b)>>>(j->param_grad,
                                                                                   (const float *)part, nvec,
                                                                                   j->param_len);
            if ((rc = ctcu_launched("flex_bwd (compiled mods): the parameter gradient"))) goto out;
        }
    }
    if (g->dk || g->dv) {
        size_t sh = smem_dkv(s.d.E, br);
        if ((rc = opt_in(m->dkv, sh, "flex_bwd (compiled mods): shared memory (dk, dv)"))) goto out;
        void *dk = g->dk, *dv = g->dv;
        void *args[] = {&q, &k, &v, &dout, &lse, &D, &dk, &dv, &d, &mk, &jm};
        int64_t units = (s.d.T + br - 1) / br * s.d.B * s.d.Hk;
        if ((rc = launch(b, m->dkv, unit_grid(units), sh, args, "flex_bwd (compiled mods): dk, dv"))) goto out;
    }
out:
    if (part) ctcu_scratch_free(b, part);
    if (A) ctcu_scratch_free(b, A);
    return rc;
}

} /* namespace ctcu_flex */

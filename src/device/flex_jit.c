/* Compiled (jit) flex mods on a device (device/backend.h, "compiled (jit) mods on a device";
 * docs/compile.md, "On a GPU"): the mods' device source from their IR (src/jit/codegen_cuda.c),
 * the backend's image of it with the flex kernels (slot flex_jit_build) cached on disk beside
 * the CPU kernels (key: SHA-256 of the jit ABI, the backend's compiler identity, the element
 * type, the head dim and the source; the entry checked against its .sum before it is loaded),
 * loaded once per device and key in this process (a table with reference counts), and the
 * bound arrays uploaded to one device buffer at each bind (trained tables change between
 * steps), the parameter gradients collected from a device vector after the backward.
 *
 * The CPU device runs the host mods themselves (ct_flex_jit.host_score / host_mask, no module):
 * its flex slots are ct_flex_attention_forward / _backward, which add the parameter gradients
 * into the score mod's param_grad directly. */
#include "device/device_internal.h"
#include "jit/jit_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FJ_TABLE_MAX 256

typedef struct fj_entry {
    ct_device *dev;
    char key[65];
    void *module;
    int refs;
} fj_entry;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static fj_entry g_table[FJ_TABLE_MAX];
static atomic_llong st_table, st_cache, st_builds;

struct ct_dev_flex_jit {
    ct_device *dev;
    const ct_score_mod *sm;
    const ct_mask_mod *mm;
    ct_score_mod cpu_sm; /* the CPU device: sm with param_grad as bound */
    const jir *mir, *sir;
    const ctj_arr *ma, *sa;
    ct_dtype dtype;
    int64_t E;
    fj_entry *entry; /* GPU: the loaded module (NULL on the CPU) */
    void *dbuf;      /* the arrays on the device */
    size_t dbytes;
    uint8_t *stage;  /* their host staging */
    size_t off[CT_FLEX_JIT_MAX_ARRAYS], bytes[CT_FLEX_JIT_MAX_ARRAYS];
    float *dgrad;    /* device [param_len] */
    size_t gbytes;
    float *hgrad;    /* host copy for collect */
    bool checked;    /* ct_dev_flex_jit_check ran */
    bool want;       /* the last bind wanted the parameter gradients */
    ct_flex_jit fj;
};

void ct_dev_flex_jit_stats(int64_t *table_hits, int64_t *cache_hits, int64_t *builds)
{
    if (table_hits) *table_hits = atomic_load(&st_table);
    if (cache_hits) *cache_hits = atomic_load(&st_cache);
    if (builds) *builds = atomic_load(&st_builds);
}

static size_t elt_size(ct_dtype dt)
{
    switch (dt) {
    case CT_DTYPE_F32:
    case CT_DTYPE_I32: return 4;
    case CT_DTYPE_I64: return 8;
    default: return 1;
    }
}

static void hexs(const uint8_t d[32], char out[65])
{
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

/* The module of (dev, key): the table, else the disk cache, else the backend builds it. */
static ct_status module_get(const char *fn, ct_device *dev, const char *source, ct_dtype dtype,
                            int64_t E, fj_entry **out)
{
    const ct_backend_ops *ops = ct_device_ops(dev);
    ct_backend *be = ct_device_backend(dev);
    if (!ops->flex_jit_identity) return ct_dev_missing(dev, "flex_jit_identity");
    if (!ops->flex_jit_build) return ct_dev_missing(dev, "flex_jit_build");
    if (!ops->flex_jit_load || !ops->flex_jit_unload) return ct_dev_missing(dev, "flex_jit_load");
    char ident[256] = "";
    int rc = ops->flex_jit_identity(be, ident, sizeof ident);
    if (rc) return ct_dev_result(dev, "flex_jit_identity", rc);
    ident[sizeof ident - 1] = '\0';
    /* the key: everything the image depends on */
    char head[512];
    int hl = snprintf(head, sizeof head, "ctorch-flex-jit abi %d ctorch %s\nidentity %s\ndtype %s\nE %lld\n",
                      JIT_ABI, ct_version(), ident, ct_dtype_name(dtype), (long long)E);
    size_t sl = strlen(source);
    char *text;
    CT_TRY(ct_alloc((void **)&text, (size_t)hl + sl + 1));
    memcpy(text, head, (size_t)hl);
    memcpy(text + hl, source, sl + 1);
    uint8_t d[32];
    jit_sha256(text, (size_t)hl + sl, d);
    ct_free(text);
    char key[65];
    hexs(d, key);

    pthread_mutex_lock(&g_lock);
    fj_entry *free_slot = NULL;
    for (int i = 0; i < FJ_TABLE_MAX; i++) {
        fj_entry *e = &g_table[i];
        if (e->refs > 0 && e->dev == dev && !strcmp(e->key, key)) {
            e->refs++;
            atomic_fetch_add(&st_table, 1);
            pthread_mutex_unlock(&g_lock);
            *out = e;
            return CT_OK;
        }
        if (e->refs == 0 && !free_slot) free_slot = e;
    }
    ct_status s = CT_OK;
    if (!free_slot) {
        s = ct_error(CT_ENOMEM, "%s: more than %d compiled-mods modules loaded at once", fn, FJ_TABLE_MAX);
        goto done;
    }
    char dir[4096];
    int dfd = -1;
    if ((s = jit_cache_open(fn, NULL, dir, sizeof dir, &dfd)) != CT_OK) goto done;
    uint8_t *img = NULL;
    size_t len = 0;
    void *module = NULL;
    ct_status c = jit_cache_read_ext(dfd, key, ".cubin", &img, &len);
    if (c == CT_OK) {
        rc = ops->flex_jit_load(be, img, len, &module);
        ct_free(img);
        img = NULL;
        if (rc == 0) atomic_fetch_add(&st_cache, 1);
        else module = NULL; /* a verified entry the backend refuses (another driver): rebuilt */
    }
    if (!module) {
        void *built = NULL;
        rc = ops->flex_jit_build(be, source, dtype, E, &built, &len);
        if (rc) {
            s = ct_dev_result(dev, "flex_jit_build", rc);
            close(dfd);
            goto done;
        }
        atomic_fetch_add(&st_builds, 1);
        char note[600];
        snprintf(note, sizeof note, "identity %s\ndtype %s\nE %lld", ident, ct_dtype_name(dtype),
                 (long long)E);
        ct_status w = jit_cache_write(dfd, key, ".cubin", built, len, note);
        rc = ops->flex_jit_load(be, built, len, &module);
        free(built);
        if (rc) {
            s = ct_dev_result(dev, "flex_jit_load", rc);
            close(dfd);
            goto done;
        }
        if (w != CT_OK) {
            ops->flex_jit_unload(be, module);
            s = ct_error(CT_EIO,
                         "%s: cannot write the cache entry %s.cubin in the cache dir %s (free space "
                         "there, or set CT_CACHE_DIR to another directory)",
                         fn, key, dir);
            close(dfd);
            goto done;
        }
    }
    close(dfd);
    free_slot->dev = dev;
    memcpy(free_slot->key, key, sizeof key);
    free_slot->module = module;
    free_slot->refs = 1;
    *out = free_slot;
done:
    pthread_mutex_unlock(&g_lock);
    return s;
}

static void module_put(fj_entry *e)
{
    if (!e) return;
    pthread_mutex_lock(&g_lock);
    if (--e->refs == 0) {
        const ct_backend_ops *ops = ct_device_ops(e->dev);
        ops->flex_jit_unload(ct_device_backend(e->dev), e->module);
        e->module = NULL;
        e->dev = NULL;
        e->key[0] = '\0';
    }
    pthread_mutex_unlock(&g_lock);
}

void ct_dev_flex_jit_free(ct_dev_flex_jit *j)
{
    if (!j) return;
    if (j->dbuf) ct_dev_free(j->dev, j->dbuf, j->dbytes);
    if (j->dgrad) ct_dev_free(j->dev, j->dgrad, j->gbytes);
    module_put(j->entry);
    ct_free(j->stage);
    ct_free(j->hgrad);
    ct_free(j);
}

ct_status ct_dev_flex_jit_create(ct_device *dev, const ct_score_mod *sm, const ct_mask_mod *mm,
                                 ct_dtype dtype, int64_t E, ct_dev_flex_jit **out)
{
    const char *fn = "ct_dev_flex_jit_create";
    if (!out) return ct_error(CT_EINVAL, "%s: out must not be NULL", fn);
    *out = NULL;
    if (!dev) return ct_error(CT_EINVAL, "%s: dev must not be NULL", fn);
    if (!sm && !mm) return ct_error(CT_EINVAL, "%s: need a compiled score mod, mask mod or both", fn);
    const ctj_arr *sa = NULL, *ma = NULL;
    const jir *sir = sm ? jit_score_mod_ir(sm, &sa) : NULL;
    const jir *mir = mm ? jit_mask_mod_ir(mm, &ma) : NULL;
    if (sm && !sir)
        return ct_error(CT_EINVAL, "%s: the score mod was not made by ct_score_mod_compile (a "
                                   "built-in or a callback mod has no device code)", fn);
    if (mm && !mir)
        return ct_error(CT_EINVAL, "%s: the mask mod was not made by ct_mask_mod_compile (a "
                                   "built-in or a callback mod has no device code)", fn);
    if (dtype != CT_DTYPE_F32 && dtype != CT_DTYPE_BF16)
        return ct_error(CT_EINVAL, "%s: dtype must be f32 or bf16, got %s", fn, ct_dtype_name(dtype));
    if (E < 1 || E > 4096) return ct_error(CT_EINVAL, "%s: head dim E = %lld outside [1, 4096]", fn, (long long)E);
    int narr = (mir ? mir->narr : 0) + (sir ? sir->narr : 0);
    if (narr > CT_FLEX_JIT_MAX_ARRAYS)
        return ct_error(CT_EINVAL, "%s: %d bound arrays, at most %d", fn, narr, CT_FLEX_JIT_MAX_ARRAYS);
    ct_dev_flex_jit *j;
    CT_TRY(ct_calloc((void **)&j, sizeof *j));
    j->dev = dev;
    j->sm = sm;
    j->mm = mm;
    j->sir = sir;
    j->mir = mir;
    j->sa = sa;
    j->ma = ma;
    j->dtype = dtype;
    j->E = E;
    j->fj.host_score = sm;
    j->fj.host_mask = mm;
    j->fj.param_len = sm ? sm->param_len : 0;
    ct_status s = CT_OK;
    if (ct_device_get_kind(dev) == CT_DEVICE_CPU) {
        j->cpu_sm = sm ? *sm : (ct_score_mod){0};
        j->cpu_sm.destroy = NULL; /* a view: sm owns the context */
        j->fj.host_score = sm ? &j->cpu_sm : NULL;
        *out = j;
        return CT_OK;
    }
    /* the arrays' layout in one device buffer: mask's first, then score's, 16-byte aligned */
    size_t total = 0;
    for (int k = 0; k < narr; k++) {
        int nm = mir ? mir->narr : 0;
        const ctj_arr *a = k < nm ? &ma[k] : &sa[k - nm];
        ct_dtype dt = k < nm ? mir->arr[k].dtype : sir->arr[k - nm].dtype;
        size_t b;
        if (!ct_mul_size((size_t)a->numel, elt_size(dt), &b) || b > ((size_t)1 << 40)) {
            s = ct_error(CT_EOVERFLOW, "%s: a bound array is too large", fn);
            break;
        }
        j->off[k] = total;
        j->bytes[k] = b;
        total += (b + 15) & ~(size_t)15;
    }
    j->fj.narr = narr;
    j->dbytes = total ? total : 16;
    char *src = NULL;
    if (s == CT_OK) s = ct_alloc((void **)&j->stage, j->dbytes);
    if (s == CT_OK) memset(j->stage, 0, j->dbytes);
    if (s == CT_OK) s = ct_dev_alloc(dev, j->dbytes, "compiled mods' arrays", &j->dbuf);
    if (s == CT_OK && j->fj.param_len > 0) {
        j->gbytes = (size_t)j->fj.param_len * sizeof(float);
        s = ct_dev_alloc(dev, j->gbytes, "compiled mods' parameter gradients", (void **)&j->dgrad);
        if (s == CT_OK) s = ct_alloc((void **)&j->hgrad, j->gbytes);
    }
    for (int k = 0; s == CT_OK && k < narr; k++) {
        int nm = mir ? mir->narr : 0;
        const ctj_arr *a = k < nm ? &ma[k] : &sa[k - nm];
        ct_flex_jit_arr *d = &j->fj.arr[k];
        d->data = (char *)j->dbuf + j->off[k];
        memcpy(d->shape, a->shape, sizeof d->shape);
        memcpy(d->stride, a->stride, sizeof d->stride);
        d->numel = a->numel;
        d->gofs = k < nm ? 0 : a->gofs;
    }
    if (s == CT_OK) s = jit_codegen_device(mir, sir, &src);
    if (s == CT_OK) s = module_get(fn, dev, src, dtype, E, &j->entry);
    ct_free(src);
    if (s != CT_OK) {
        ct_dev_flex_jit_free(j);
        return s;
    }
    j->fj.module = j->entry->module;
    *out = j;
    return CT_OK;
}

ct_status ct_dev_flex_jit_check(ct_dev_flex_jit *j, int64_t B, int64_t H, int64_t q_len,
                                int64_t kv_len)
{
    if (!j) return ct_error(CT_EINVAL, "ct_dev_flex_jit_check: j must not be NULL");
    if (j->mm) CT_TRY(ct_jit_check_mask(j->mm, B, H, q_len, kv_len));
    if (j->sm) CT_TRY(ct_jit_check_score(j->sm, B, H, q_len, kv_len));
    j->checked = true;
    return CT_OK;
}

ct_status ct_dev_flex_jit_bind(ct_dev_flex_jit *j, bool want_param_grad, ct_flex_mods *mods)
{
    const char *fn = "ct_dev_flex_jit_bind";
    if (!j || !mods) return ct_error(CT_EINVAL, "%s: j and mods must not be NULL", fn);
    if (!j->checked)
        return ct_error(CT_EINVAL, "%s: the mods' indices are not range-checked yet "
                                   "(ct_dev_flex_jit_check with the attention's sizes first)", fn);
    if (j->sm && mods->score != CT_FLEX_SCORE_NONE)
        return ct_error(CT_EINVAL, "%s: a compiled score mod replaces the built-in score "
                                   "(mods->score must be CT_FLEX_SCORE_NONE)", fn);
    bool want = want_param_grad && j->fj.param_len > 0;
    if (want && !j->sm->param_grad)
        return ct_error(CT_EINVAL, "%s: parameter gradients wanted, but the score mod's "
                                   "param_grad is NULL (set it to a buffer of param_len = %lld floats)",
                        fn, (long long)j->fj.param_len);
    j->want = want;
    if (ct_device_get_kind(j->dev) == CT_DEVICE_CPU) {
        /* the CPU's flex adds the gradients into the host mod's param_grad itself */
        if (j->sm) j->cpu_sm.param_grad = want ? j->sm->param_grad : NULL;
        j->fj.param_grad = NULL;
        mods->compiled = &j->fj;
        return CT_OK;
    }
    int nm = j->mir ? j->mir->narr : 0;
    for (int k = 0; k < j->fj.narr; k++) {
        const ctj_arr *a = k < nm ? &j->ma[k] : &j->sa[k - nm];
        if (j->bytes[k]) memcpy(j->stage + j->off[k], a->data, j->bytes[k]);
    }
    CT_TRY(ct_dev_h2d(j->dev, j->dbuf, j->stage, j->dbytes));
    if (want) CT_TRY(ct_dev_zero(j->dev, j->dgrad, j->gbytes));
    j->fj.param_grad = want ? j->dgrad : NULL;
    mods->compiled = &j->fj;
    return CT_OK;
}

ct_status ct_dev_flex_jit_collect(ct_dev_flex_jit *j)
{
    if (!j) return ct_error(CT_EINVAL, "ct_dev_flex_jit_collect: j must not be NULL");
    if (!j->want || ct_device_get_kind(j->dev) == CT_DEVICE_CPU) return CT_OK;
    CT_TRY(ct_dev_d2h(j->dev, j->hgrad, j->dgrad, j->gbytes));
    float *g = j->sm->param_grad;
    for (int64_t i = 0; i < j->fj.param_len; i++)
        g[i] += j->hgrad[i];
    j->want = false; /* collected once: the next bind zeroes the device vector again */
    return CT_OK;
}

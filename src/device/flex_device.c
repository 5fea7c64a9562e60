/* FlexAttention on device memory (include/ctorch/device.h): ct_device_block_mask_upload and
 * ct_device_flex_attention_forward / _backward.
 *
 * On the CPU device the calls are ct_flex_attention_forward / _backward on the same views.
 * On a GPU they are the flex slots (device/backend.h): the host block mask's lists are
 * uploaded once per handle (ct_dev_block_mask_upload), its mask_mod is mapped onto the slots'
 * built-in masks (ct_flex_mods bits) by what src/attention/mods.c says it is
 * (attention/mods_info.h), a document mask's ids are uploaded with the lists, and the
 * score_mod (softcap, ALiBi) is mapped per call (ALiBi's slopes uploaded per call: H floats).
 * Whatever the GPU cannot evaluate is refused by name (CT_EUNSUPPORTED). */
#include "attention/attn.h"
#include "attention/mods_info.h"
#include "device/device_internal.h"
#include "ctorch/jit.h"
#include "jit/jit_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

struct ct_device_block_mask {
    ct_device *dev;
    const ct_block_mask *host;
    bool gpu;
    ct_dev_block_mask lists; /* GPU: the uploaded lists */
    ct_flex_mods mods;       /* GPU: the mask part (bits, window, prefix, document ids) */
    const ct_mask_mod *jit;  /* GPU: the compiled mask mod among the ANDed ones (NULL: none) */
    int32_t *docs;           /* GPU: q ids [doc_rows, L] then kv ids [doc_rows, S] */
    size_t doc_bytes;
    int64_t doc_rows;
};

#define DIM_MAX 65536 /* the CPU's head-dim bound (src/attention/flex.c) */

/* ---- mask_mod -> ct_flex_mods ---------------------------------------------------------- */

typedef struct mask_map {
    int64_t lo, hi;   /* the plain bands' intersection on q - kv */
    bool band;        /* a plain band was seen */
    int64_t prefix;   /* the prefix LMs' smallest prefix (-1: none) */
    at_mask_info doc; /* kind AT_MOD_DOCUMENT when one was seen */
    const ct_mask_mod *jit; /* a compiled mask mod (ANDed with the rest) */
} mask_map;

/* A compiled (jit) mod (src/jit/mod.c recognises its own). */
static bool compiled_mask(const ct_mask_mod *m)
{
    return jit_mask_mod_ir(m, NULL) != NULL;
}

static bool compiled_score(const ct_score_mod *m)
{
    return jit_score_mod_ir(m, NULL) != NULL;
}

static ct_status no_gpu_mask(const char *fn, const ct_device *d, const char *what)
{
    return ct_error(CT_EUNSUPPORTED,
                    "%s on %s: the block mask's mask_mod is %s, which the GPU does not evaluate (it "
                    "runs ct_mask_mod_causal, _sliding_window, _prefix_lm, _document, _noop and "
                    "ct_mask_mod_and of them); compile the mask as an expression (ctorch/jit.h; "
                    "Python: a traced mask_mod) to run it on a GPU, or use the CPU",
                    fn, ct_device_name(d), what);
}

static ct_status map_mask(const char *fn, const ct_device *d, const ct_mask_mod *m, mask_map *mm,
                          int depth)
{
    if (depth > 64) return no_gpu_mask(fn, d, "nested more than 64 deep");
    at_mask_info in;
    at_mask_describe(m, &in);
    switch (in.kind) {
    case AT_MOD_NOOP:
        return CT_OK;
    case AT_MOD_BAND:
        if (in.prefix > 0) {
            if (in.lo != 0 || in.hi != AT_BAND_NONE_HI) return no_gpu_mask(fn, d, "a banded prefix LM");
            if (mm->prefix < 0 || in.prefix < mm->prefix) mm->prefix = in.prefix;
            return CT_OK;
        }
        if (!mm->band || in.lo > mm->lo) mm->lo = in.lo;
        if (!mm->band || in.hi < mm->hi) mm->hi = in.hi;
        mm->band = true;
        return CT_OK;
    case AT_MOD_DOCUMENT:
        if (mm->doc.kind == AT_MOD_DOCUMENT)
            return no_gpu_mask(fn, d, "the AND of two document masks (one document mask per block mask)");
        mm->doc = in;
        return CT_OK;
    case AT_MOD_AND:
        for (int i = 0; i < in.n; i++)
            CT_TRY(map_mask(fn, d, &in.kids[i], mm, depth + 1));
        return CT_OK;
    case AT_MOD_OR:
        return no_gpu_mask(fn, d, "ct_mask_mod_or (or_masks)");
    case AT_MOD_NOT:
        return no_gpu_mask(fn, d, "ct_mask_mod_not (not_mask)");
    default:
        if (compiled_mask(m)) { /* its device code runs inside the kernels (src/device/flex_jit.c) */
            if (mm->jit) return no_gpu_mask(fn, d, "the AND of two compiled masks (compile one expression)");
            mm->jit = m;
            return CT_OK;
        }
        return no_gpu_mask(fn, d, "a callback of your own (a tile function)");
    }
}

/* Bits of the slots from the map; the document ids are uploaded by the caller. */
static ct_status mask_bits(const char *fn, const ct_device *d, const mask_map *mm, ct_flex_mods *md)
{
    if (mm->band) {
        int64_t lo = mm->lo, hi = mm->hi;
        if (lo == 0 && hi >= AT_BAND_NONE_HI) {
            md->mask |= CT_FLEX_MASK_CAUSAL;
        } else if (lo == 0 && hi >= 0) {
            md->mask |= CT_FLEX_MASK_CAUSAL | CT_FLEX_MASK_WINDOW;
            md->window = hi;
        } else if (hi < AT_BAND_NONE_HI && lo == -hi && hi >= 0) {
            md->mask |= CT_FLEX_MASK_WINDOW;
            md->window = hi;
        } else if (!(lo <= AT_BAND_NONE_LO && hi >= AT_BAND_NONE_HI)) {
            char what[96];
            snprintf(what, sizeof what, "a band %lld <= q - kv <= %lld", (long long)lo, (long long)hi);
            return no_gpu_mask(fn, d, what);
        }
    }
    if (mm->prefix >= 0) {
        md->mask |= CT_FLEX_MASK_PREFIX;
        md->prefix = mm->prefix;
    }
    return CT_OK;
}

/* ---- block mask handles ---------------------------------------------------------------- */

ct_status ct_device_block_mask_upload(ct_device *d, const ct_block_mask *m, ct_device_block_mask **out)
{
    const char *fn = "ct_device_block_mask_upload";
    if (!out) return ct_error(CT_EINVAL, "%s: out must not be NULL", fn);
    *out = NULL;
    if (!d || !m) return ct_error(CT_EINVAL, "%s: d and m must not be NULL", fn);
    if (m->B < 1 || m->H < 1 || m->q_len < 1 || m->kv_len < 1 || m->block_size < 1 ||
        !m->kv_ptr || !m->q_ptr || (!m->tiles && !m->mask_mod.tile))
        return ct_error(CT_EINVAL, "%s: not a block mask from ct_block_mask_create", fn);
    ct_device_block_mask *h;
    CT_TRY(ct_calloc((void **)&h, sizeof *h));
    h->dev = d;
    h->host = m;
    h->gpu = ct_device_get_kind(d) != CT_DEVICE_CPU;
    if (!h->gpu) {
        *out = h;
        return CT_OK;
    }
    ct_status s = CT_OK;
    if (m->q_len != m->kv_len)
        s = ct_error(CT_EUNSUPPORTED, "%s on %s: Q_LEN %lld != KV_LEN %lld (the GPU's flex attention "
                                      "needs as many keys as queries)",
                     fn, ct_device_name(d), (long long)m->q_len, (long long)m->kv_len);
    mask_map mm = {.prefix = -1};
    if (s == CT_OK) s = map_mask(fn, d, &m->mask_mod, &mm, 0);
    if (s == CT_OK) s = mask_bits(fn, d, &mm, &h->mods);
    h->jit = mm.jit;
    if (s == CT_OK && mm.doc.kind == AT_MOD_DOCUMENT) {
        /* the slots read ids[b][q] with rows of L: the host ids' first L (S) columns */
        const at_mask_info *c = &mm.doc;
        int64_t rows = c->doc_batch, L = m->q_len, S = m->kv_len;
        if (c->doc_q_len < L || c->doc_kv_len < S)
            s = ct_error(CT_EINVAL, "%s: the document mask has ids for %lld queries / %lld keys, fewer "
                                    "than Q_LEN %lld / KV_LEN %lld",
                         fn, (long long)c->doc_q_len, (long long)c->doc_kv_len, (long long)L, (long long)S);
        size_t n = 0;
        if (s == CT_OK && (!ct_mul_size((size_t)rows, (size_t)(L + S), &n) || !ct_mul_size(n, 4, &n)))
            s = ct_error(CT_EOVERFLOW, "%s: the document ids' size overflows", fn);
        int32_t *tmp = NULL;
        if (s == CT_OK) s = ct_alloc((void **)&tmp, n);
        if (s == CT_OK) {
            for (int64_t r = 0; r < rows; r++) {
                memcpy(tmp + r * L, c->q_doc + r * c->doc_q_len, (size_t)L * 4);
                memcpy(tmp + rows * L + r * S, c->kv_doc + r * c->doc_kv_len, (size_t)S * 4);
            }
            s = ct_dev_alloc(d, n, "document ids", (void **)&h->docs);
            if (s == CT_OK) {
                h->doc_bytes = n;
                s = ct_dev_h2d(d, h->docs, tmp, n);
            }
        }
        ct_free(tmp);
        if (s == CT_OK) {
            h->doc_rows = rows;
            h->mods.mask |= CT_FLEX_MASK_DOCUMENT;
            h->mods.q_doc = h->docs;
            h->mods.kv_doc = h->docs + rows * L;
        }
    }
    if (s == CT_OK) s = ct_dev_block_mask_upload(d, m, &h->lists);
    if (s != CT_OK) {
        ct_device_block_mask_free(h);
        return s;
    }
    *out = h;
    return CT_OK;
}

void ct_device_block_mask_free(ct_device_block_mask *m)
{
    if (!m) return;
    if (m->gpu) {
        ct_dev_block_mask_free(m->dev, &m->lists);
        ct_dev_free(m->dev, m->docs, m->doc_bytes);
    }
    ct_free(m);
}

ct_device *ct_device_block_mask_device(const ct_device_block_mask *m)
{
    return m ? m->dev : NULL;
}

const ct_block_mask *ct_device_block_mask_host(const ct_device_block_mask *m)
{
    return m ? m->host : NULL;
}

/* ---- checks ------------------------------------------------------------------------------ */

/* t lies on d: a buffer of d's, or (buffer NULL) host memory on the CPU / a foreign device
 * pointer on a GPU. */
static ct_status on_device(const char *fn, const char *name, const ct_tensor *t, const ct_device *d)
{
    if (!t || !t->buffer) return CT_OK;
    ct_device *bd = ct_buffer_device(t->buffer);
    if (bd != d)
        return ct_error(CT_EINVAL, "%s: %s is in a buffer of %s but the call runs on %s", fn, name,
                        bd ? ct_device_name(bd) : "no device", ct_device_name(d));
    return CT_OK;
}

/* A GPU tensor: [n0, n1, n2, n3] (logical [B, H, L, E]) in one dtype, memory [B, L, H, E]
 * contiguous (strides of dims of size 1 do not matter). */
static ct_status gpu_tensor(const char *fn, const char *name, const ct_tensor *t, const int64_t *shape,
                            int nd, ct_dtype dt)
{
    if (!t) return ct_error(CT_EINVAL, "%s: %s must not be NULL", fn, name);
    if (t->ndim != nd) return ct_error(CT_EINVAL, "%s: %s must have %d dims, got %d", fn, name, nd, t->ndim);
    for (int i = 0; i < nd; i++)
        if (t->shape[i] != shape[i])
            return ct_error(CT_EINVAL, "%s: %s.shape[%d] must be %lld, got %lld", fn, name, i,
                            (long long)shape[i], (long long)t->shape[i]);
    if (t->dtype != dt)
        return ct_error(CT_EINVAL, "%s: %s must be %s on a GPU (the dtype of q), got %s", fn, name,
                        ct_dtype_name(dt), ct_dtype_name(t->dtype));
    int64_t want[4];
    if (nd == 4) { /* [B, H, L, E] over memory [B, L, H, E] */
        want[3] = 1, want[1] = shape[3], want[2] = shape[1] * shape[3], want[0] = shape[2] * want[2];
    } else { /* lse [B, H, L] contiguous */
        want[2] = 1, want[1] = shape[2], want[0] = shape[1] * shape[2];
    }
    for (int i = 0; i < nd; i++)
        if (shape[i] > 1 && t->strides[i] != want[i])
            return ct_error(CT_EINVAL,
                            "%s: on a GPU %s must be %s: its stride %d must be %lld, got %lld", fn,
                            name,
                            nd == 4 ? "the [B, H, L, E] view of contiguous [B, L, H, E] memory"
                                    : "contiguous",
                            i, (long long)want[i], (long long)t->strides[i]);
    if (!t->data && ct_tensor_numel(t) > 0)
        return ct_error(CT_EINVAL, "%s: %s.data must not be NULL", fn, name);
    return CT_OK;
}

/* What a GPU call needs, checked as ct_flex_attention_forward checks it, then the GPU's own
 * limits. */
typedef struct gcall {
    int64_t B, Hq, Hkv, L, S, E;
    ct_dtype dt;
    float scale;
    float *slopes; /* ALiBi [Hq], device (freed by gcall_free) */
    ct_block_mask *dense;   /* mask NULL: an all-pairs block mask (host) */
    ct_dev_flex_jit *jit;   /* compiled mods' device code and arrays (NULL: none) */
    ct_dev_block_mask dense_dev;
    ct_flex_args fa;
} gcall;

static void gcall_free(ct_device *d, gcall *g)
{
    if (g->jit) {
        /* the module may be unloaded with the handle's last reference: the kernels first */
        (void)ct_device_sync(d);
        ct_dev_flex_jit_free(g->jit);
        g->jit = NULL;
    }
    ct_dev_free(d, g->slopes, (size_t)g->Hq * sizeof(float));
    ct_dev_block_mask_free(d, &g->dense_dev);
    ct_block_mask_free(g->dense);
    g->slopes = NULL;
    g->dense = NULL;
}

static ct_status gpu_setup(const char *fn, ct_device *d, const ct_tensor *q, const ct_tensor *k,
                           const ct_tensor *v, const ct_device_block_mask *mask,
                           const ct_flex_options *opt, bool backward, gcall *g)
{
    memset(g, 0, sizeof *g);
    if (!q || !k || !v) return ct_error(CT_EINVAL, "%s: q, k and v must not be NULL", fn);
    if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4)
        return ct_error(CT_EINVAL, "%s: q, k and v must have 4 dims [B, H, len, dim], got %d, %d, %d",
                        fn, q->ndim, k->ndim, v->ndim);
    if (q->dtype != CT_DTYPE_F32 && q->dtype != CT_DTYPE_BF16)
        return ct_error(CT_EINVAL, "%s: q must be f32 or bf16, got %s", fn, ct_dtype_name(q->dtype));
    g->B = q->shape[0], g->Hq = q->shape[1], g->L = q->shape[2], g->E = q->shape[3];
    g->Hkv = k->shape[1], g->S = k->shape[2], g->dt = q->dtype;
    if (g->B < 0 || g->Hq < 0 || g->L < 0 || g->Hkv < 0 || g->S < 0)
        return ct_error(CT_EINVAL, "%s: sizes must be >= 0", fn);
    if (g->E < 1 || v->shape[3] < 1 || g->E > DIM_MAX || v->shape[3] > DIM_MAX)
        return ct_error(CT_EINVAL, "%s: head dims must be in [1, %d], got E=%lld Ev=%lld", fn, DIM_MAX,
                        (long long)g->E, (long long)v->shape[3]);
    if (v->shape[3] != g->E)
        return ct_error(CT_EUNSUPPORTED, "%s on %s: v's head dim %lld != q's %lld (the GPU takes Ev == E)",
                        fn, ct_device_name(d), (long long)v->shape[3], (long long)g->E);
    CT_TRY(gpu_tensor(fn, "q", q, (int64_t[]){g->B, g->Hq, g->L, g->E}, 4, g->dt));
    CT_TRY(gpu_tensor(fn, "k", k, (int64_t[]){g->B, g->Hkv, g->S, g->E}, 4, g->dt));
    CT_TRY(gpu_tensor(fn, "v", v, (int64_t[]){g->B, g->Hkv, g->S, g->E}, 4, g->dt));
    if (g->Hkv < 1 || g->Hq % g->Hkv != 0)
        return ct_error(CT_EINVAL, "%s: query heads (%lld) must be a multiple of key/value heads (%lld)",
                        fn, (long long)g->Hq, (long long)g->Hkv);
    ct_flex_options o = opt ? *opt : ct_flex_options_default();
    if (!isfinite(o.scale)) return ct_error(CT_EINVAL, "%s: scale must be finite, got %g", fn, (double)o.scale);
    g->scale = o.scale != 0.0f ? o.scale : (float)(1.0 / sqrt((double)g->E)); /* as the CPU */
    if (o.score_mod && !o.score_mod->fwd)
        return ct_error(CT_EINVAL, "%s: score_mod->fwd must not be NULL", fn);
    if (mask) {
        const ct_block_mask *bm = mask->host;
        if (mask->dev != d)
            return ct_error(CT_EINVAL, "%s: the block mask was uploaded to %s but the call runs on %s", fn,
                            ct_device_name(mask->dev), ct_device_name(d));
        if (bm->q_len != g->L || bm->kv_len != g->S)
            return ct_error(CT_EINVAL,
                            "%s: block mask is for Q_LEN=%lld KV_LEN=%lld but q has %lld queries and k %lld keys",
                            fn, (long long)bm->q_len, (long long)bm->kv_len, (long long)g->L, (long long)g->S);
        if ((bm->B != 1 && bm->B != g->B) || (bm->H != 1 && bm->H != g->Hq))
            return ct_error(CT_EINVAL, "%s: block mask B=%lld H=%lld must be 1 or match B=%lld Hq=%lld", fn,
                            (long long)bm->B, (long long)bm->H, (long long)g->B, (long long)g->Hq);
    }
    if (g->L != g->S)
        return ct_error(CT_EUNSUPPORTED, "%s on %s: %lld queries and %lld keys (the GPU's flex attention "
                                         "needs L == S)",
                        fn, ct_device_name(d), (long long)g->L, (long long)g->S);
    /* the mods */
    ct_flex_mods *md = &g->fa.mods;
    if (mask) {
        *md = mask->mods;
        if (md->mask & CT_FLEX_MASK_DOCUMENT) {
            if (mask->doc_rows != 1 && mask->doc_rows < g->B)
                return ct_error(CT_EINVAL, "%s: the document mask has ids for %lld batches, fewer than B = %lld",
                                fn, (long long)mask->doc_rows, (long long)g->B);
            md->doc_batch = mask->doc_rows == 1 ? 1 : g->B;
        }
    }
    if (o.score_mod) {
        at_score_info si;
        at_score_describe(o.score_mod, &si);
        if (si.kind == AT_MOD_SOFTCAP) {
            md->score = CT_FLEX_SCORE_SOFTCAP;
            md->softcap = si.cap;
        } else if (si.kind == AT_MOD_ALIBI) {
            md->score = CT_FLEX_SCORE_ALIBI;
        } else if (si.kind == AT_MOD_RELBIAS) {
            return ct_error(CT_EUNSUPPORTED,
                            "%s on %s: score_mod ct_score_mod_relative_bias does not run on a GPU (it runs "
                            "softcap and ALiBi); compile it as an expression over its table (ctorch/jit.h; "
                            "Python: a traced score_mod) or use the CPU", fn, ct_device_name(d));
        } else if (compiled_score(o.score_mod)) {
            /* its device code runs inside the kernels (below) */
        } else {
            return ct_error(CT_EUNSUPPORTED,
                            "%s on %s: the score_mod is a callback of your own (a tile function), which the "
                            "GPU does not evaluate (it runs ct_score_mod_softcap and _alibi); compile it as "
                            "an expression (ctorch/jit.h; Python: a traced score_mod) or use the CPU",
                            fn, ct_device_name(d));
        }
        if (si.kind == AT_MOD_ALIBI && g->Hq > 0) {
            float *h = NULL;
            CT_TRY(ct_alloc((void **)&h, (size_t)g->Hq * sizeof(float)));
            for (int64_t i = 0; i < g->Hq; i++)
                h[i] = si.slopes[i % si.heads];
            ct_status s = ct_dev_alloc(d, (size_t)g->Hq * sizeof(float), "ALiBi slopes", (void **)&g->slopes);
            if (s == CT_OK) s = ct_dev_h2d(d, g->slopes, h, (size_t)g->Hq * sizeof(float));
            ct_free(h);
            CT_TRY(s);
            md->alibi_slopes = g->slopes;
        }
    }
    /* compiled mods: the kernels built with their device code, their arrays uploaded */
    const ct_score_mod *jsm = o.score_mod && compiled_score(o.score_mod) ? o.score_mod : NULL;
    const ct_mask_mod *jmm = mask ? mask->jit : NULL;
    if ((jsm || jmm) && g->B > 0 && g->Hq > 0 && g->L > 0) {
        if (jmm) CT_TRY(ct_jit_check_mask(jmm, g->B, g->Hq, g->L, g->S)); /* before any build */
        if (jsm) CT_TRY(ct_jit_check_score(jsm, g->B, g->Hq, g->L, g->S));
        CT_TRY(ct_dev_flex_jit_create(d, jsm, jmm, g->dt, g->E, &g->jit));
        CT_TRY(ct_dev_flex_jit_check(g->jit, g->B, g->Hq, g->L, g->S));
        CT_TRY(ct_dev_flex_jit_bind(g->jit, backward && jsm && jsm->param_grad, md));
    }
    /* the block mask (mask NULL: every pair, as a block mask of full blocks) */
    if (mask) {
        g->fa.block_mask = &mask->lists;
    } else if (g->B > 0 && g->Hq > 0 && g->L > 0) {
        ct_mask_mod all;
        CT_TRY(ct_mask_mod_noop(&all));
        CT_TRY(ct_block_mask_create(&all, 1, 1, g->L, g->S, 128, &g->dense));
        CT_TRY(ct_dev_block_mask_upload(d, g->dense, &g->dense_dev));
        g->fa.block_mask = &g->dense_dev;
    }
    g->fa.attn = (ct_attn_args){.B = g->B, .T = g->L, .H = g->Hq, .Hk = g->Hkv, .E = g->E,
                                .scale = g->scale, .q = q->data, .k = k->data, .v = v->data,
                                .dtype = g->dt};
    return CT_OK;
}

static ct_status buffers_on(const char *fn, ct_device *d, const char *const *names,
                            const ct_tensor *const *ts, int n)
{
    for (int i = 0; i < n; i++)
        CT_TRY(on_device(fn, names[i], ts[i], d));
    return CT_OK;
}

/* ---- the calls ------------------------------------------------------------------------- */

ct_status ct_device_flex_attention_forward(ct_device *d, const ct_tensor *q, const ct_tensor *k,
                                           const ct_tensor *v, const ct_device_block_mask *mask,
                                           const ct_flex_options *opt, ct_tensor *out, ct_tensor *lse)
{
    const char *fn = "ct_device_flex_attention_forward";
    if (!d) return ct_error(CT_EINVAL, "%s: d must not be NULL", fn);
    CT_TRY(buffers_on(fn, d, (const char *const[]){"q", "k", "v", "out", "lse"},
                      (const ct_tensor *const[]){q, k, v, out, lse}, 5));
    if (ct_device_get_kind(d) == CT_DEVICE_CPU) {
        if (mask && mask->dev != d)
            return ct_error(CT_EINVAL, "%s: the block mask was uploaded to %s but the call runs on %s", fn,
                            ct_device_name(mask->dev), ct_device_name(d));
        return at_forward(fn, q, k, v, mask ? mask->host : NULL, opt, out, lse);
    }
    gcall g;
    ct_status s = gpu_setup(fn, d, q, k, v, mask, opt, false, &g);
    if (s == CT_OK) s = gpu_tensor(fn, "out", out, (int64_t[]){g.B, g.Hq, g.L, g.E}, 4, g.dt);
    if (s == CT_OK && lse) s = gpu_tensor(fn, "lse", lse, (int64_t[]){g.B, g.Hq, g.L}, 3, CT_DTYPE_F32);
    if (s != CT_OK || g.B == 0 || g.Hq == 0 || g.L == 0) {
        gcall_free(d, &g);
        return s;
    }
    size_t lse_bytes = (size_t)(g.B * g.Hq * g.L) * sizeof(float);
    float *tmp = NULL;
    if (!lse) s = ct_dev_alloc(d, lse_bytes, "flex lse", (void **)&tmp);
    if (s == CT_OK) {
        g.fa.attn.out = out->data;
        g.fa.attn.lse = lse ? lse->data : tmp;
        const ct_backend_ops *ops = ct_device_ops(d);
        if (!ops->flex_fwd) s = ct_dev_missing(d, "flex_fwd");
        else {
            int rc = ops->flex_fwd(ct_device_backend(d), &g.fa);
            if (rc) s = ct_dev_result(d, "flex_fwd", rc);
        }
    }
    ct_dev_free(d, tmp, lse_bytes);
    gcall_free(d, &g);
    return s;
}

ct_status ct_device_flex_attention_backward(ct_device *d, const ct_tensor *q, const ct_tensor *k,
                                            const ct_tensor *v, const ct_tensor *out, const ct_tensor *lse,
                                            const ct_tensor *dout, const ct_device_block_mask *mask,
                                            const ct_flex_options *opt, ct_tensor *dq, ct_tensor *dk,
                                            ct_tensor *dv)
{
    const char *fn = "ct_device_flex_attention_backward";
    if (!d) return ct_error(CT_EINVAL, "%s: d must not be NULL", fn);
    CT_TRY(buffers_on(fn, d, (const char *const[]){"q", "k", "v", "out", "lse", "dout", "dq", "dk", "dv"},
                      (const ct_tensor *const[]){q, k, v, out, lse, dout, dq, dk, dv}, 9));
    if (ct_device_get_kind(d) == CT_DEVICE_CPU) {
        if (mask && mask->dev != d)
            return ct_error(CT_EINVAL, "%s: the block mask was uploaded to %s but the call runs on %s", fn,
                            ct_device_name(mask->dev), ct_device_name(d));
        return at_backward(fn, q, k, v, out, lse, dout, mask ? mask->host : NULL, opt, dq, dk, dv);
    }
    gcall g;
    ct_status s = gpu_setup(fn, d, q, k, v, mask, opt, true, &g);
    int64_t qs[4] = {g.B, g.Hq, g.L, g.E}, ks[4] = {g.B, g.Hkv, g.S, g.E};
    if (s == CT_OK) s = gpu_tensor(fn, "out", out, qs, 4, g.dt);
    if (s == CT_OK) {
        if (!lse) s = ct_error(CT_EINVAL, "%s: lse must not be NULL (keep the forward's)", fn);
        else s = gpu_tensor(fn, "lse", lse, (int64_t[]){g.B, g.Hq, g.L}, 3, CT_DTYPE_F32);
    }
    if (s == CT_OK) s = gpu_tensor(fn, "dout", dout, qs, 4, g.dt);
    if (s == CT_OK && dq) s = gpu_tensor(fn, "dq", dq, qs, 4, g.dt);
    if (s == CT_OK && dk) s = gpu_tensor(fn, "dk", dk, ks, 4, g.dt);
    if (s == CT_OK && dv) s = gpu_tensor(fn, "dv", dv, ks, 4, g.dt);
    if (s == CT_OK && (g.B == 0 || g.Hq == 0 || g.L == 0)) { /* no query rows: dk, dv are 0 */
        size_t n = (size_t)(g.B * g.Hkv * g.S * g.E) * ct_dtype_size(g.dt);
        if (dk) s = ct_dev_zero(d, dk->data, n);
        if (s == CT_OK && dv) s = ct_dev_zero(d, dv->data, n);
    } else if (s == CT_OK && (dq || dk || dv)) {
        g.fa.attn.out = out->data;
        g.fa.attn.lse = lse->data;
        ct_attn_grads gr = {dout->data, dq ? dq->data : NULL, dk ? dk->data : NULL, dv ? dv->data : NULL};
        const ct_backend_ops *ops = ct_device_ops(d);
        if (!ops->flex_bwd) s = ct_dev_missing(d, "flex_bwd");
        else {
            int rc = ops->flex_bwd(ct_device_backend(d), &g.fa, &gr);
            if (rc) s = ct_dev_result(d, "flex_bwd", rc);
        }
        if (s == CT_OK && g.jit) s = ct_dev_flex_jit_collect(g.jit); /* into score_mod->param_grad */
    }
    gcall_free(d, &g);
    return s;
}

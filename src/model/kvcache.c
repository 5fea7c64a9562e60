/* The KV cache of include/ctorch/model.h: a cached forward that appends tokens to every row
 * and attends them against the keys and values kept from earlier calls.
 *
 * Layout (one allocation): keys then values, each [L][B][max_len][Hkv E] (a row's positions
 * are contiguous, so a layer's cache is a [B, Hkv, S, E] strided view for FlexAttention),
 * document ids and tokens [B][max_len], and the scratch of one chunk of
 * at most `chunk` positions per row. Each chunk runs the model's own block forward
 * (gpt_block_run of src/model/gpt.c, in its cached mode) on B * n rows, in place on the chunk's
 * residual; its attention is gpt_kv_attention below: the new keys and values appended, then
 * the queries attend the cached keys through a mask that offsets the query positions by the
 * cached length (causal, the sliding window, and the document mask). */
#include "model/gpt_internal.h"

#include <math.h>
#include <string.h>

#define CACHE_CHUNK 256
#define DECODE_MAX GPT_GEMV_MAX /* at most this many new positions per row: the decode paths */

/* The mask of a chunk: query i of the chunk is position past + i; key j is position j. */
typedef struct cache_mask {
    const int32_t *doc; /* [B][max_len], NULL: no document mask */
    int64_t max_len, past, window;
} cache_mask;

struct ct_gpt_cache {
    const ct_gpt *m;
    int64_t B, max_len, len, chunk;
    int64_t L, C, H, K, E, F, V;
    void *base;
    size_t bytes;
    float *kc, *vc;
    int32_t *doc, *ctok; /* [B][max_len]: document ids and the tokens cached */
    /* scratch of one chunk: N = B * chunk rows */
    float *x, *ln, *rstd, *q, *k, *v, *att, *gu, *hb;
    int32_t *tok, *pos;
    cache_mask mask;
};

static void mask_tile(void *ctx, const ct_attn_tile *t, uint8_t *keep)
{
    const cache_mask *c = ctx;
    const int32_t *doc = c->doc ? c->doc + t->b * c->max_len : NULL;
    for (int64_t i = 0; i < t->nq; i++) {
        int64_t q = c->past + t->q0 + i;
        for (int64_t j = 0; j < t->nkv; j++) {
            int64_t kv = t->kv0 + j;
            bool ok = kv <= q && (c->window == 0 || q - kv <= c->window) &&
                      (!doc || doc[q] == doc[kv]);
            keep[i * t->q_stride + j * t->kv_stride] = ok;
        }
    }
}

static ct_block_kind mask_block(void *ctx, int64_t b, int64_t h, int64_t q0, int64_t nq,
                                int64_t kv0, int64_t nkv)
{
    const cache_mask *c = ctx;
    int64_t qa = c->past + q0, qb = qa + nq - 1, ka = kv0, kb = kv0 + nkv - 1;
    if (ka > qb) return CT_BLOCK_EMPTY;
    if (c->window && qa - kb > c->window) return CT_BLOCK_EMPTY;
    bool full = kb <= qa && (c->window == 0 || qb - ka <= c->window);
    if (!full) return CT_BLOCK_PARTIAL;
    return c->doc ? CT_BLOCK_UNKNOWN : CT_BLOCK_FULL;
}

/* ---- attention of a few new positions (decode) ----------------------------------------------
 * For n <= DECODE_MAX queries per row, a direct pass per (row, head, query) over its visible
 * keys with an online softmax beats FlexAttention's query tiles (mostly empty for one query).
 * Each output row is computed by one task in key order: the same bits for any thread count. */
#define DECODE_MAX_E 1024 /* head dims up to this (in double) */

typedef struct decode_job {
    const gpt_kv *kv;
    const float *q; /* [B, n, H, E] */
    float *out;     /* [B, n, H, E] */
    int64_t n, H, K, E, W;
    double scale;
} decode_job;

static void decode_rows(void *arg, int64_t r0, int64_t r1, int tid)
{
    const decode_job *j = arg;
    const gpt_kv *kv = j->kv;
    int64_t H = j->H, K = j->K, E = j->E, n = j->n, W = j->W, S = kv->max_len;
    double acc[DECODE_MAX_E];
    for (int64_t r = r0; r < r1; r++) {
        int64_t h = r % H, i = (r / H) % n, b = r / (H * n), kh = h / (H / K);
        int64_t qp = kv->past + i, lo = W && qp - W > 0 ? qp - W : 0;
        const float *q = j->q + ((b * n + i) * H + h) * E;
        float *o = j->out + ((b * n + i) * H + h) * E;
        const int32_t *doc = kv->doc ? kv->doc + b * S : NULL;
        double mx = -INFINITY, sum = 0;
        for (int64_t e = 0; e < E; e++)
            acc[e] = 0;
        for (int64_t p = lo; p <= qp; p++) {
            if (doc && doc[p] != doc[qp]) continue;
            const float *k = kv->k + ((b * S + p) * K + kh) * E;
            const float *v = kv->v + ((b * S + p) * K + kh) * E;
            double sc = 0;
            for (int64_t e = 0; e < E; e++)
                sc += (double)q[e] * k[e];
            sc *= j->scale;
            if (sc > mx) { /* rescale what was summed to the new maximum */
                double f = exp(mx - sc);
                sum *= f;
                for (int64_t e = 0; e < E; e++)
                    acc[e] *= f;
                mx = sc;
            }
            double w = exp(sc - mx);
            sum += w;
            for (int64_t e = 0; e < E; e++)
                acc[e] += w * v[e];
        }
        for (int64_t e = 0; e < E; e++)
            o[e] = sum > 0 ? (float)(acc[e] / sum) : 0.0f;
    }
}

ct_status gpt_kv_attention(const ct_gpt *m, const gpt_kv *kv, const float *q, const float *k,
                           const float *v, float *att, int64_t B, int64_t n)
{
    const ct_gpt_config *cfg = &m->cfg;
    int64_t H = cfg->n_head, K = cfg->n_kv_head, E = gpt_E(m), HE = H * E, KE = K * E;
    int64_t S = kv->past + n;
    if (!gpt_host(m)) /* a GPU cache: the appends below as they are, a decode-attention slot */
        return ct_error(CT_EUNSUPPORTED, "ct_gpt_cache: the cached attention runs on the CPU, "
                                         "not %s", ct_device_name(m->dev));
    for (int64_t b = 0; b < B; b++) { /* append the new positions of every row */
        size_t dst = (size_t)(b * kv->max_len + kv->past) * (size_t)KE, src = (size_t)(b * n * KE);
        CT_TRY(ct_dev_d2d(m->dev, kv->k + dst, k + src, (size_t)(n * KE) * sizeof(float)));
        CT_TRY(ct_dev_d2d(m->dev, kv->v + dst, v + src, (size_t)(n * KE) * sizeof(float)));
    }
    if (!kv->bm) {
        decode_job dj = {kv, q, att, n, H, K, E, cfg->window, 1.0 / sqrt((double)E)};
        ct_parallel_for(B * n * H, decode_rows, &dj);
        return CT_OK;
    }
    ct_tensor tq, tk, tv, to;
    int64_t qs[4] = {B, H, n, E}, qst[4] = {n * HE, E, HE, 1};
    int64_t ks[4] = {B, K, S, E}, kst[4] = {kv->max_len * KE, E, KE, 1};
    CT_TRY(ct_tensor_wrap(&tq, (float *)q, CT_DTYPE_F32, 4, qs, qst));
    CT_TRY(ct_tensor_wrap(&to, att, CT_DTYPE_F32, 4, qs, qst));
    CT_TRY(ct_tensor_wrap(&tk, kv->k, CT_DTYPE_F32, 4, ks, kst));
    CT_TRY(ct_tensor_wrap(&tv, kv->v, CT_DTYPE_F32, 4, ks, kst));
    return ct_flex_attention_forward(&tq, &tk, &tv, kv->bm, NULL, &to, NULL);
}

/* a * b * ... checked: false on overflow. */
static bool mul3(size_t a, size_t b, size_t c, size_t *out)
{
    size_t t;
    return ct_mul_size(a, b, &t) && ct_mul_size(t, c, out);
}

ct_status ct_gpt_cache_create(const ct_gpt *m, int64_t batch, int64_t max_len, ct_gpt_cache **out)
{
    const char *fn = "ct_gpt_cache_create";
    if (!out) return ct_error(CT_EINVAL, "%s: out must not be NULL", fn);
    *out = NULL;
    if (!m) return ct_error(CT_EINVAL, "%s: the model must not be NULL", fn);
    const ct_gpt_config *cfg = &m->cfg;
    if (!gpt_host(m))
        return ct_error(CT_EUNSUPPORTED, "%s: the KV cache runs on the CPU (the model lives on %s): "
                        "generate recomputes the sequence (no_cache) there", fn,
                        ct_device_name(m->dev));
    if (cfg->score_mod[0] || cfg->mask_mod[0])
        return ct_error(CT_EUNSUPPORTED, "%s: the KV cache does not run a compiled score_mod / "
                        "mask_mod: generate recomputes the sequence (no_cache) for this model", fn);
    if (batch < 1 || batch > (1 << 20))
        return ct_error(CT_EINVAL, "%s: batch must be in [1, 2^20], got %lld", fn,
                        (long long)batch);
    if (max_len < 1 || max_len > cfg->context)
        return ct_error(CT_EINVAL, "%s: max_len must be in [1, context = %lld], got %lld", fn,
                        (long long)cfg->context, (long long)max_len);
    ct_gpt_cache c = {0};
    c.m = m;
    c.B = batch;
    c.max_len = max_len;
    c.chunk = max_len < CACHE_CHUNK ? max_len : CACHE_CHUNK;
    c.L = cfg->n_layer;
    c.C = cfg->d_model;
    c.H = cfg->n_head;
    c.K = cfg->n_kv_head;
    c.E = gpt_E(m);
    c.F = cfg->d_ff;
    c.V = cfg->vocab_size;
    size_t B = (size_t)batch, S = (size_t)max_len, N = B * (size_t)c.chunk; /* <= 2^28 */
    size_t KE = (size_t)(c.K * c.E), HE = (size_t)(c.H * c.E), C = (size_t)c.C, F = (size_t)c.F;
    size_t kvb, docb, N4 = N * 4;
    if (!mul3((size_t)c.L, B * S, KE, &kvb) || !ct_mul_size(kvb, 4, &kvb) ||
        !mul3(B, S, 4, &docb))
        return ct_error(CT_EOVERFLOW, "%s: a cache of %lld rows x %lld positions overflows", fn,
                        (long long)batch, (long long)max_len);
    size_t sizes[] = {kvb,          kvb,          docb,          docb,          /* kc vc doc ctok */
                      N4 * C,       N4 * C,       N4,            N4 * HE,       /* x ln rstd q */
                      N4 * KE,      N4 * KE,      N4 * HE,       N4 * 2 * F,    /* k v att gu */
                      N4 * F,       N4,           (size_t)c.chunk * 4};         /* hb tok pos */
    void **slots[] = {(void **)&c.kc, (void **)&c.vc,  (void **)&c.doc, (void **)&c.ctok,
                      (void **)&c.x,  (void **)&c.ln,  (void **)&c.rstd, (void **)&c.q,
                      (void **)&c.k,  (void **)&c.v,   (void **)&c.att, (void **)&c.gu,
                      (void **)&c.hb, (void **)&c.tok, (void **)&c.pos};
    int n = (int)(sizeof sizes / sizeof sizes[0]);
    size_t off = 0, offs[sizeof sizes / sizeof sizes[0]];
    for (int i = 0; i < n; i++) {
        size_t a = (off + 63) & ~(size_t)63;
        if (a < off || !ct_add_size(a, sizes[i], &off))
            return ct_error(CT_EOVERFLOW, "%s: a cache of %lld rows x %lld positions overflows",
                            fn, (long long)batch, (long long)max_len);
        offs[i] = a;
    }
    ct_gpt_cache *p;
    CT_TRY(ct_calloc((void **)&p, sizeof *p));
    ct_status s = ct_alloc(&c.base, off);
    if (s) {
        ct_free(p);
        return ct_error(s, "%s: cannot allocate %zu bytes for %lld rows x %lld positions", fn,
                        off, (long long)batch, (long long)max_len);
    }
    c.bytes = off;
    for (int i = 0; i < n; i++)
        *slots[i] = (char *)c.base + offs[i];
    *p = c;
    *out = p;
    return CT_OK;
}

void ct_gpt_cache_free(ct_gpt_cache *c)
{
    if (!c) return;
    ct_free(c->base);
    ct_free(c);
}

void ct_gpt_cache_reset(ct_gpt_cache *c)
{
    if (c) c->len = 0;
}

int64_t ct_gpt_cache_length(const ct_gpt_cache *c)
{
    return c ? c->len : 0;
}

int64_t ct_gpt_cache_batch(const ct_gpt_cache *c)
{
    return c ? c->B : 0;
}

int64_t ct_gpt_cache_capacity(const ct_gpt_cache *c)
{
    return c ? c->max_len : 0;
}

size_t ct_gpt_cache_bytes(const ct_gpt_cache *c)
{
    return c ? c->bytes : 0;
}

/* One chunk: positions len .. len+n-1 of every row, tokens already in c->tok [B, n]. */
static ct_status chunk_forward(ct_gpt_cache *c, int64_t n, bool all, float *logits,
                               int64_t ld_rows, int64_t row0)
{
    const ct_gpt *m = c->m;
    const ct_gpt_config *cfg = &m->cfg;
    int64_t B = c->B, N = B * n, C = c->C, H = c->H, E = c->E, V = c->V;
    int64_t KE = c->K * E, S = c->len + n, past = c->len;
    bool docs = m->opt.eos_token >= 0;
    for (int64_t i = 0; i < n; i++)
        c->pos[i] = (int32_t)(past + i);
    for (int64_t b = 0; b < B; b++)
        memcpy(c->ctok + b * c->max_len + past, c->tok + b * n, (size_t)n * sizeof(int32_t));
    if (docs)
        for (int64_t b = 0; b < B; b++) {
            int32_t *d = c->doc + b * c->max_len;
            for (int64_t i = 0; i < n; i++) {
                int64_t p = past + i;
                int32_t prev = p ? c->ctok[b * c->max_len + p - 1] : 0;
                d[p] = p == 0 ? 0 : d[p - 1] + (prev == m->opt.eos_token);
            }
        }
    c->mask = (cache_mask){docs ? c->doc : NULL, c->max_len, past, cfg->window};
    ct_mask_mod mm = {mask_tile, mask_block, &c->mask, NULL, docs, false};
    ct_block_mask *bm = NULL;
    if (n > DECODE_MAX || E > DECODE_MAX_E)
        CT_TRY(ct_block_mask_create(&mm, B, H, n, S, S <= 256 ? 64 : 128, &bm));
    ct_status s = gpt_embed(c->x, c->tok, m->w.emb, m->w.hemb, N, V, C);
    gpt_kv kv = {NULL, NULL, docs ? c->doc : NULL, c->max_len, past, bm};
    gpt_block_io io = {.B = B, .T = n, .x = c->x, .x2 = c->x, .out = c->x, /* in place */
                       .ln1 = c->ln, .rstd1 = c->rstd, .ln2 = c->ln, .rstd2 = c->rstd,
                       .q = c->q, .k = c->k, .v = c->v, .att = c->att, .gu = c->gu, .h = c->hb,
                       .lse = NULL, .pos = c->pos, .kv = &kv};
    for (int64_t l = 0; !s && l < c->L; l++) {
        kv.k = c->kc + (size_t)l * (size_t)(B * c->max_len * KE);
        kv.v = c->vc + (size_t)l * (size_t)(B * c->max_len * KE);
        s = gpt_block_run(m, &m->w.layer[l], &io);
    }
    ct_block_mask_free(bm);
    if (s) return s;
    CT_TRY(ct_rmsnorm_forward(c->ln, c->rstd, c->x, m->w.norm, N, C, cfg->norm_eps));
    for (int64_t b = 0; b < B; b++) {
        if (all)
            CT_TRY(gpt_linear(logits + (size_t)(b * ld_rows + row0) * (size_t)V, V,
                              c->ln + (size_t)(b * n * C), m->w.out, m->w.hout, NULL, n, C, V,
                              false, true));
        else if (logits)
            CT_TRY(gpt_linear(logits + (size_t)(b * V), V, c->ln + (size_t)((b * n + n - 1) * C),
                              m->w.out, m->w.hout, NULL, 1, C, V, false, true));
    }
    c->len += n;
    return CT_OK;
}

ct_status ct_gpt_cache_prefill(ct_gpt_cache *c, const int32_t *tokens, int64_t n, bool all,
                               float *logits)
{
    const char *fn = "ct_gpt_cache_prefill";
    if (!c || !tokens || !logits)
        return ct_error(CT_EINVAL, "%s: cache, tokens and logits must not be NULL", fn);
    if (n < 1 || n > c->max_len - c->len)
        return ct_error(CT_EINVAL,
                        "%s: n = %lld tokens do not fit: the cache holds %lld of %lld positions",
                        fn, (long long)n, (long long)c->len, (long long)c->max_len);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t i = 0; i < n; i++) {
            int32_t x = tokens[b * n + i];
            if (x < 0 || x >= c->V)
                return ct_error(CT_EINVAL,
                                "%s: tokens[%lld][%lld] = %d is outside the vocabulary [0, %lld)",
                                fn, (long long)b, (long long)i, x, (long long)c->V);
        }
    int64_t len0 = c->len;
    for (int64_t p0 = 0; p0 < n; p0 += c->chunk) {
        int64_t cn = n - p0 < c->chunk ? n - p0 : c->chunk;
        for (int64_t b = 0; b < c->B; b++)
            memcpy(c->tok + b * cn, tokens + b * n + p0, (size_t)cn * sizeof(int32_t));
        bool last = p0 + cn == n;
        ct_status s = chunk_forward(c, cn, all, all || last ? logits : NULL, n, p0);
        if (s) {
            c->len = len0; /* what was appended is forgotten: the cache is as before */
            return s;
        }
    }
    return CT_OK;
}

ct_status ct_gpt_cache_decode(ct_gpt_cache *c, const int32_t *tokens, float *logits)
{
    return ct_gpt_cache_prefill(c, tokens, 1, false, logits);
}

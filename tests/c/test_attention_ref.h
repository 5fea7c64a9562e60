/* Naive materialised attention for the attention tests: every score of a row is computed,
 * modded and masked through the same callbacks (one 1 x S tile per row), then softmax and
 * sums in double. The backward follows the textbook formulas row by row. */
#ifndef CT_TEST_ATTENTION_REF_H
#define CT_TEST_ATTENTION_REF_H

#include "test_util.h"

typedef struct acase {
    int64_t B, Hq, Hkv, L, S, E, Ev;
    float scale;
    const ct_mask_mod *mask; /* NULL: every pair attends */
    const ct_score_mod *sm;  /* NULL: none */
} acase;

static size_t a_nq(const acase *c)
{
    return (size_t)(c->B * c->Hq * c->L * c->E);
}
static size_t a_nk(const acase *c)
{
    return (size_t)(c->B * c->Hkv * c->S * c->E);
}
static size_t a_nv(const acase *c)
{
    return (size_t)(c->B * c->Hkv * c->S * c->Ev);
}
static size_t a_no(const acase *c)
{
    return (size_t)(c->B * c->Hq * c->L * c->Ev);
}

/* Scores of row (b, h, i): raw (before the mod), s (after mod and mask), keep. */
static void ref_row_scores(const acase *c, const float *q, const float *k, int64_t b, int64_t h,
                           int64_t i, float *raw, float *s, uint8_t *keep)
{
    int64_t hk = h / (c->Hq / c->Hkv);
    const float *qi = q + ((b * c->Hq + h) * c->L + i) * c->E;
    for (int64_t j = 0; j < c->S; j++) {
        const float *kj = k + ((b * c->Hkv + hk) * c->S + j) * c->E;
        double d = 0;
        for (int64_t e = 0; e < c->E; e++)
            d += (double)qi[e] * kj[e];
        raw[j] = s[j] = (float)(d * c->scale);
        keep[j] = 1;
    }
    ct_attn_tile t = {b, h, i, 1, 0, c->S, c->S, 1};
    if (c->sm) c->sm->fwd(c->sm->ctx, &t, s);
    if (c->mask) c->mask->tile(c->mask->ctx, &t, keep);
}

/* Softmax probabilities of a row in double; returns lse (-inf when all masked, p = 0). */
static double ref_row_probs(const acase *c, const float *s, const uint8_t *keep, double *p)
{
    double m = -INFINITY, sum = 0;
    for (int64_t j = 0; j < c->S; j++)
        if (keep[j] && s[j] > m) m = s[j];
    for (int64_t j = 0; j < c->S; j++) {
        p[j] = keep[j] && m > -INFINITY ? exp((double)s[j] - m) : 0.0;
        sum += p[j];
    }
    for (int64_t j = 0; j < c->S; j++)
        p[j] = sum > 0 ? p[j] / sum : 0.0;
    return sum > 0 ? m + log(sum) : -INFINITY;
}

static void ref_forward(const acase *c, const float *q, const float *k, const float *v, float *out,
                        float *lse)
{
    float *raw = malloc(sizeof(float) * (size_t)(c->S + 1)),
          *s = malloc(sizeof(float) * (size_t)(c->S + 1));
    uint8_t *keep = malloc((size_t)c->S + 1);
    double *p = malloc(sizeof(double) * (size_t)(c->S + 1));
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->Hq; h++)
            for (int64_t i = 0; i < c->L; i++) {
                int64_t hk = h / (c->Hq / c->Hkv), row = (b * c->Hq + h) * c->L + i;
                ref_row_scores(c, q, k, b, h, i, raw, s, keep);
                double l = ref_row_probs(c, s, keep, p);
                if (lse) lse[row] = (float)l;
                for (int64_t e = 0; e < c->Ev; e++) {
                    double o = 0;
                    for (int64_t j = 0; j < c->S; j++)
                        o += p[j] * v[((b * c->Hkv + hk) * c->S + j) * c->Ev + e];
                    out[row * c->Ev + e] = (float)o;
                }
            }
    free(raw);
    free(s);
    free(keep);
    free(p);
}

/* Gradients of sum(out * dout); dparam (param_len floats, or NULL) accumulates the score
 * mod's parameter gradients. */
static void ref_backward(const acase *c, const float *q, const float *k, const float *v,
                         const float *dout, float *dq, float *dk, float *dv, float *dparam)
{
    size_t S = (size_t)c->S + 1;
    float *raw = malloc(sizeof(float) * S), *s = malloc(sizeof(float) * S),
          *g = malloc(sizeof(float) * S);
    uint8_t *keep = malloc(S);
    double *p = malloc(sizeof(double) * S), *dp = malloc(sizeof(double) * S);
    double *gq = calloc(a_nq(c) + 1, sizeof(double)), *gk = calloc(a_nk(c) + 1, sizeof(double));
    double *gv = calloc(a_nv(c) + 1, sizeof(double));
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->Hq; h++)
            for (int64_t i = 0; i < c->L; i++) {
                int64_t hk = h / (c->Hq / c->Hkv), row = (b * c->Hq + h) * c->L + i;
                ref_row_scores(c, q, k, b, h, i, raw, s, keep);
                ref_row_probs(c, s, keep, p);
                const float *go = dout + row * c->Ev;
                double D = 0;
                for (int64_t j = 0; j < c->S; j++) {
                    const float *vj = v + ((b * c->Hkv + hk) * c->S + j) * c->Ev;
                    double d = 0;
                    for (int64_t e = 0; e < c->Ev; e++)
                        d += (double)go[e] * vj[e];
                    dp[j] = d;
                    D += p[j] * d;
                }
                for (int64_t j = 0; j < c->S; j++)
                    g[j] = (float)(p[j] * (dp[j] - D));
                ct_attn_tile t = {b, h, i, 1, 0, c->S, c->S, 1};
                if (c->sm && c->sm->grad) c->sm->grad(c->sm->ctx, &t, raw, g, dparam);
                for (int64_t j = 0; j < c->S; j++) {
                    int64_t kr = (b * c->Hkv + hk) * c->S + j;
                    for (int64_t e = 0; e < c->E; e++) {
                        gq[row * c->E + e] += c->scale * (double)g[j] * k[kr * c->E + e];
                        gk[kr * c->E + e] += c->scale * (double)g[j] * q[row * c->E + e];
                    }
                    for (int64_t e = 0; e < c->Ev; e++)
                        gv[kr * c->Ev + e] += p[j] * go[e];
                }
            }
    for (size_t x = 0; x < a_nq(c); x++)
        dq[x] = (float)gq[x];
    for (size_t x = 0; x < a_nk(c); x++)
        dk[x] = (float)gk[x];
    for (size_t x = 0; x < a_nv(c); x++)
        dv[x] = (float)gv[x];
    free(raw);
    free(s);
    free(g);
    free(keep);
    free(p);
    free(dp);
    free(gq);
    free(gk);
    free(gv);
}

/* A contiguous f32 [d0, d1, d2, d3] (or 3-dim when d3 < 0) tensor view of x. */
static ct_tensor a_wrap(void *x, ct_dtype dt, int64_t d0, int64_t d1, int64_t d2, int64_t d3)
{
    ct_tensor t;
    int64_t shape[4] = {d0, d1, d2, d3};
    ct_status s = ct_tensor_wrap(&t, x, dt, d3 < 0 ? 3 : 4, shape, NULL);
    if (s != CT_OK) fprintf(stderr, "a_wrap: %s\n", ct_last_error());
    return t;
}

/* Everything one case needs, filled with deterministic random inputs. */
typedef struct abufs {
    float *q, *k, *v, *dout;
    float *out, *lse, *dq, *dk, *dv;      /* library */
    float *rout, *rlse, *rdq, *rdk, *rdv; /* reference */
} abufs;

static void abufs_init(abufs *a, const acase *c)
{
    a->q = malloc(sizeof(float) * (a_nq(c) + 1));
    a->k = malloc(sizeof(float) * (a_nk(c) + 1));
    a->v = malloc(sizeof(float) * (a_nv(c) + 1));
    a->dout = malloc(sizeof(float) * (a_no(c) + 1));
    t_fill(a->q, a_nq(c), -1, 1);
    t_fill(a->k, a_nk(c), -1, 1);
    t_fill(a->v, a_nv(c), -1, 1);
    t_fill(a->dout, a_no(c), -1, 1);
    size_t nl = (size_t)(c->B * c->Hq * c->L) + 1;
    a->out = calloc(a_no(c) + 1, sizeof(float));
    a->rout = calloc(a_no(c) + 1, sizeof(float));
    a->lse = calloc(nl, sizeof(float));
    a->rlse = calloc(nl, sizeof(float));
    a->dq = calloc(a_nq(c) + 1, sizeof(float));
    a->rdq = calloc(a_nq(c) + 1, sizeof(float));
    a->dk = calloc(a_nk(c) + 1, sizeof(float));
    a->rdk = calloc(a_nk(c) + 1, sizeof(float));
    a->dv = calloc(a_nv(c) + 1, sizeof(float));
    a->rdv = calloc(a_nv(c) + 1, sizeof(float));
}

static void abufs_free(abufs *a)
{
    float *all[] = {a->q,  a->k,  a->v,    a->dout, a->out, a->lse, a->dq,
                    a->dk, a->dv, a->rout, a->rlse, a->rdq, a->rdk, a->rdv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
}

/* Run the library forward and backward (f32) on a case. */
static ct_status a_run(const acase *c, const ct_block_mask *bm, abufs *a)
{
    ct_tensor q = a_wrap(a->q, CT_DTYPE_F32, c->B, c->Hq, c->L, c->E);
    ct_tensor k = a_wrap(a->k, CT_DTYPE_F32, c->B, c->Hkv, c->S, c->E);
    ct_tensor v = a_wrap(a->v, CT_DTYPE_F32, c->B, c->Hkv, c->S, c->Ev);
    ct_tensor o = a_wrap(a->out, CT_DTYPE_F32, c->B, c->Hq, c->L, c->Ev);
    ct_tensor l = a_wrap(a->lse, CT_DTYPE_F32, c->B, c->Hq, c->L, -1);
    ct_tensor dO = a_wrap(a->dout, CT_DTYPE_F32, c->B, c->Hq, c->L, c->Ev);
    ct_tensor dq = a_wrap(a->dq, CT_DTYPE_F32, c->B, c->Hq, c->L, c->E);
    ct_tensor dk = a_wrap(a->dk, CT_DTYPE_F32, c->B, c->Hkv, c->S, c->E);
    ct_tensor dv = a_wrap(a->dv, CT_DTYPE_F32, c->B, c->Hkv, c->S, c->Ev);
    ct_flex_options o_ = ct_flex_options_default();
    o_.scale = c->scale;
    o_.score_mod = c->sm;
    ct_status s = ct_flex_attention_forward(&q, &k, &v, bm, &o_, &o, &l);
    if (s != CT_OK) return s;
    return ct_flex_attention_backward(&q, &k, &v, &o, &l, &dO, bm, &o_, &dq, &dk, &dv);
}

/* Compare a_run's results with the reference. */
static int a_compare(const acase *c, abufs *a, double tol, const char *what)
{
    ref_forward(c, a->q, a->k, a->v, a->rout, a->rlse);
    ref_backward(c, a->q, a->k, a->v, a->dout, a->rdq, a->rdk, a->rdv, NULL);
    char name[160];
    int ok = 1;
    snprintf(name, sizeof name, "%s out", what);
    ok &= t_close(a->out, a->rout, a_no(c), tol, tol, name);
    snprintf(name, sizeof name, "%s lse", what);
    ok &= t_close(a->lse, a->rlse, (size_t)(c->B * c->Hq * c->L), tol, tol, name);
    snprintf(name, sizeof name, "%s dq", what);
    ok &= t_close(a->dq, a->rdq, a_nq(c), tol, tol, name);
    snprintf(name, sizeof name, "%s dk", what);
    ok &= t_close(a->dk, a->rdk, a_nk(c), tol, tol, name);
    snprintf(name, sizeof name, "%s dv", what);
    ok &= t_close(a->dv, a->rdv, a_nv(c), tol, tol, name);
    if (!ok) fprintf(stderr, "  (case %s)\n", what);
    return ok;
}

#endif

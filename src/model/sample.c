/* Sampling the next token (include/ctorch/model.h): temperature, then top-k, then top-p, then
 * one draw, as Hugging Face's TemperatureLogitsWarper, TopKLogitsWarper and TopPLogitsWarper
 * followed by torch.multinomial, with the draw made from ct_rng in a fixed order so a seed
 * gives the same tokens everywhere. */
#include "model/gpt_internal.h"

#include <math.h>

ct_sample_options ct_sample_options_default(void)
{
    ct_sample_options o = {1.0f, 0, 1.0f};
    return o;
}

ct_status ct_sample_options_check(const ct_sample_options *o)
{
    if (!o) return ct_error(CT_EINVAL, "sampling options must not be NULL");
    if (!(o->temperature >= 0) || isinf(o->temperature))
        return ct_error(CT_EINVAL, "sampling: temperature must be finite and >= 0, got %g",
                        (double)o->temperature);
    if (o->top_k < 0)
        return ct_error(CT_EINVAL, "sampling: top_k must be >= 0 (0: off), got %lld",
                        (long long)o->top_k);
    if (!(o->top_p >= 0 && o->top_p <= 1))
        return ct_error(CT_EINVAL, "sampling: top_p must be in [0, 1], got %g", (double)o->top_p);
    return CT_OK;
}

/* The kept tokens, most likely first (ties: lower id first): idx[0 .. *kept) with weights
 * w[i] = exp((logit - max) / temperature) in double; *total is their sum. Greedy: one token,
 * weight 1. vals/idx/w hold V entries each. */
static ct_status filter(const float *logits, int64_t V, const ct_sample_options *o, float *vals,
                        int64_t *idx, double *w, int64_t *kept, double *total, const char *fn)
{
    CT_TRY(ct_sample_options_check(o));
    if (V < 1) return ct_error(CT_EINVAL, "%s: V must be >= 1, got %lld", fn, (long long)V);
    bool finite = false;
    for (int64_t i = 0; i < V; i++) {
        float x = logits[i];
        if (isnan(x) || (isinf(x) && x > 0))
            return ct_error(CT_EINVAL, "%s: logits[%lld] = %g is not a number or +inf", fn,
                            (long long)i, (double)x);
        finite |= !isinf(x);
    }
    if (!finite) return ct_error(CT_EINVAL, "%s: every logit is -inf", fn);
    if (o->temperature == 0) {
        CT_TRY(ct_argmax_rows(&idx[0], logits, 1, V));
        w[0] = 1.0;
        *kept = 1;
        *total = 1.0;
        return CT_OK;
    }
    int64_t k = o->top_k == 0 || o->top_k >= V ? V : o->top_k;
    CT_TRY(ct_topk_rows(vals, idx, logits, 1, V, k, true, true));
    if (k < V) {
        /* ties with the k-th value are kept: the ones with higher ids than those listed */
        float thr = vals[k - 1];
        int64_t after = -1;
        for (int64_t i = 0; i < k; i++)
            if (vals[i] == thr && idx[i] > after) after = idx[i];
        for (int64_t i = after + 1; i < V && k < V; i++)
            if (logits[i] == thr) {
                vals[k] = thr;
                idx[k++] = i;
            }
    }
    /* -inf logits carry no weight: drop them from the end of the sorted list */
    while (k > 1 && isinf(vals[k - 1])) k--;
    double mx = vals[0], temp = o->temperature, sum = 0;
    for (int64_t i = 0; i < k; i++) {
        w[i] = exp((vals[i] - mx) / temp);
        sum += w[i];
    }
    if (o->top_p < 1) {
        /* keep token i while the probability of the tokens before it is below top_p */
        double before = 0, cut = (double)o->top_p * sum;
        int64_t n = 0;
        while (n < k && (n == 0 || before < cut)) before += w[n++];
        k = n;
        sum = 0;
        for (int64_t i = 0; i < k; i++)
            sum += w[i];
    }
    *kept = k;
    *total = sum;
    return CT_OK;
}

typedef struct scratch {
    float *vals;
    int64_t *idx;
    double *w;
} scratch;

static ct_status scratch_get(scratch *s, int64_t V, const char *fn)
{
    s->vals = NULL;
    s->idx = NULL;
    s->w = NULL;
    if (V < 1) return ct_error(CT_EINVAL, "%s: V must be >= 1, got %lld", fn, (long long)V);
    size_t n = (size_t)V, b8;
    if (!ct_mul_size(n, 8, &b8)) return ct_error(CT_EOVERFLOW, "%s: V overflows", fn);
    ct_status st;
    if ((st = ct_alloc((void **)&s->vals, n * 4)) || (st = ct_alloc((void **)&s->idx, b8)) ||
        (st = ct_alloc((void **)&s->w, b8))) {
        ct_free(s->vals);
        ct_free(s->idx);
        return st;
    }
    return CT_OK;
}

static void scratch_free(scratch *s)
{
    ct_free(s->vals);
    ct_free(s->idx);
    ct_free(s->w);
}

ct_status ct_sample_probs(const float *logits, int64_t V, const ct_sample_options *o, float *probs)
{
    const char *fn = "ct_sample_probs";
    if (!logits || !probs) return ct_error(CT_EINVAL, "%s: logits and probs must not be NULL", fn);
    scratch sc;
    CT_TRY(scratch_get(&sc, V, fn));
    int64_t kept;
    double total;
    ct_status s = filter(logits, V, o, sc.vals, sc.idx, sc.w, &kept, &total, fn);
    if (!s) {
        for (int64_t i = 0; i < V; i++)
            probs[i] = 0;
        for (int64_t i = 0; i < kept; i++)
            probs[sc.idx[i]] = (float)(sc.w[i] / total);
    }
    scratch_free(&sc);
    return s;
}

ct_status ct_sample_token(const float *logits, int64_t V, const ct_sample_options *o, ct_rng *rng,
                          int32_t *token)
{
    const char *fn = "ct_sample_token";
    if (!logits || !rng || !token)
        return ct_error(CT_EINVAL, "%s: logits, rng and token must not be NULL", fn);
    if (V > INT32_MAX) return ct_error(CT_EINVAL, "%s: V = %lld does not fit int32 ids", fn,
                                       (long long)V);
    scratch sc;
    CT_TRY(scratch_get(&sc, V, fn));
    int64_t kept;
    double total;
    ct_status s = filter(logits, V, o, sc.vals, sc.idx, sc.w, &kept, &total, fn);
    if (!s) {
        int64_t pick = sc.idx[0];
        if (o->temperature > 0) {
            double u = ct_rng_uniform(rng) * total, acc = 0;
            pick = sc.idx[kept - 1];
            for (int64_t i = 0; i < kept; i++) {
                acc += sc.w[i];
                if (u < acc) {
                    pick = sc.idx[i];
                    break;
                }
            }
        }
        *token = (int32_t)pick;
    }
    scratch_free(&sc);
    return s;
}

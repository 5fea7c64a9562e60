/* ct_gpt_generate (include/ctorch/model.h): prefill the prompt into a KV cache, then decode a
 * token at a time, sampling each from the logits; or, as the baseline, recompute the full
 * forward over the sequence for every token. */
#include "model/gpt_internal.h"

#include <string.h>
#include <time.h>

ct_generate_options ct_generate_options_default(void)
{
    ct_generate_options o = {64, ct_sample_options_default(), 1, -1, false, NULL, NULL};
    return o;
}

static bool id_sep(char c)
{
    return c == ' ' || c == ',' || c == '\t' || c == '\n' || c == '\r';
}

ct_status ct_token_ids_parse(const char *text, size_t len, int64_t vocab, int32_t **ids,
                             int64_t *n)
{
    const char *fn = "ct_token_ids_parse";
    if (!ids || !n) return ct_error(CT_EINVAL, "%s: ids and n must not be NULL", fn);
    *ids = NULL;
    *n = 0;
    if (!text && len) return ct_error(CT_EINVAL, "%s: text must not be NULL", fn);
    if (vocab < 1 || vocab > (INT64_C(1) << 31))
        return ct_error(CT_EINVAL, "%s: vocab must be in [1, 2^31], got %lld", fn,
                        (long long)vocab);
    size_t count = 0;
    for (size_t i = 0; i < len;) { /* pass 1: check every id, count them */
        if (id_sep(text[i])) {
            i++;
            continue;
        }
        size_t j = i;
        int64_t v = 0;
        bool ok = true;
        while (j < len && !id_sep(text[j])) {
            char c = text[j++];
            if (c < '0' || c > '9') ok = false;
            else if (ok && (v = v * 10 + (c - '0')) >= vocab) ok = false;
        }
        if (!ok) {
            int shown = j - i > 40 ? 40 : (int)(j - i);
            char word[48];
            for (int k = 0; k < shown; k++) /* printable copy for the message */
                word[k] = text[i + k] >= 32 && text[i + k] < 127 ? text[i + k] : '?';
            word[shown] = 0;
            return ct_error(CT_EINVAL,
                            "%s: '%s%s' at byte %zu is not a token id in [0, %lld) (ids are "
                            "decimal, separated by spaces or commas)",
                            fn, word, j - i > 40 ? "..." : "", i, (long long)vocab);
        }
        count++;
        i = j;
    }
    if (!count) return CT_OK;
    int32_t *out;
    CT_TRY(ct_alloc((void **)&out, count * sizeof(int32_t)));
    size_t k = 0;
    for (size_t i = 0; i < len;) {
        if (id_sep(text[i])) {
            i++;
            continue;
        }
        int64_t v = 0;
        while (i < len && !id_sep(text[i]))
            v = v * 10 + (text[i++] - '0');
        out[k++] = (int32_t)v;
    }
    *ids = out;
    *n = (int64_t)count;
    return CT_OK;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct gen_state {
    ct_gpt *m;
    ct_gpt_cache *cache; /* NULL: the baseline */
    int32_t *out, *win;  /* out [B, total]; win [B, seq] scratch for a re-fill */
    float *logits;       /* [B, V] */
    int64_t B, total, seq;
} gen_state;

/* The next-token logits of every row after its first n tokens. `appended` is the token each row
 * got last (NULL at the start). */
static ct_status next_logits(gen_state *g, int64_t n, const int32_t *appended)
{
    int64_t V = g->m->cfg.vocab_size, T = n < g->seq ? n : g->seq;
    if (!g->cache) {
        for (int64_t b = 0; b < g->B; b++)
            CT_TRY(ct_gpt_next_logits(g->m, g->out + b * g->total + n - T, T, g->logits + b * V));
        return CT_OK;
    }
    if (appended && n <= g->seq && ct_gpt_cache_length(g->cache) == n - 1)
        return ct_gpt_cache_decode(g->cache, appended, g->logits);
    /* the prompt, or a sequence longer than seq: fill the cache with the last T tokens */
    ct_gpt_cache_reset(g->cache);
    for (int64_t b = 0; b < g->B; b++)
        memcpy(g->win + b * T, g->out + b * g->total + n - T, (size_t)T * sizeof(int32_t));
    return ct_gpt_cache_prefill(g->cache, g->win, T, false, g->logits);
}

ct_status ct_gpt_generate(ct_gpt *m, const int32_t *prompt, int64_t batch, int64_t T,
                          const ct_generate_options *opt, int32_t *out, int64_t *n_new,
                          ct_generate_stats *stats)
{
    const char *fn = "ct_gpt_generate";
    if (n_new) *n_new = 0;
    if (stats) memset(stats, 0, sizeof *stats);
    if (!m || !prompt || !out)
        return ct_error(CT_EINVAL, "%s: model, prompt and out must not be NULL", fn);
    ct_generate_options o = opt ? *opt : ct_generate_options_default();
    CT_TRY(ct_sample_options_check(&o.sample));
    int64_t V = m->cfg.vocab_size;
    if (batch < 1 || batch > (1 << 20))
        return ct_error(CT_EINVAL, "%s: batch must be in [1, 2^20], got %lld", fn,
                        (long long)batch);
    if (T < 1 || T > (INT64_C(1) << 40))
        return ct_error(CT_EINVAL, "%s: the prompt length T must be in [1, 2^40], got %lld", fn,
                        (long long)T);
    if (o.max_new_tokens < 0 || o.max_new_tokens > (INT64_C(1) << 40))
        return ct_error(CT_EINVAL, "%s: max_new_tokens must be in [0, 2^40], got %lld", fn,
                        (long long)o.max_new_tokens);
    if (o.eos_token < -1 || o.eos_token >= V)
        return ct_error(CT_EINVAL, "%s: eos_token %d is outside [-1, %lld)", fn, o.eos_token,
                        (long long)V);
    for (int64_t b = 0; b < batch; b++)
        for (int64_t t = 0; t < T; t++) {
            int32_t x = prompt[b * T + t];
            if (x < 0 || x >= V)
                return ct_error(CT_EINVAL,
                                "%s: prompt[%lld][%lld] = %d is outside the vocabulary [0, %lld)",
                                fn, (long long)b, (long long)t, x, (long long)V);
        }
    gen_state g = {m, NULL, out, NULL, NULL, batch, T + o.max_new_tokens, m->opt.seq};
    for (int64_t b = 0; b < batch; b++)
        memcpy(out + b * g.total, prompt + b * T, (size_t)T * sizeof(int32_t));
    if (o.max_new_tokens == 0) return CT_OK;
    size_t lb;
    if (!ct_mul_size((size_t)batch, (size_t)V * sizeof(float), &lb))
        return ct_error(CT_EOVERFLOW, "%s: batch x vocabulary logits overflow", fn);
    ct_status s = ct_alloc((void **)&g.logits, lb);
    int32_t *next = NULL;
    bool *done = NULL;
    if (!s) s = ct_alloc((void **)&next, (size_t)batch * sizeof(int32_t));
    if (!s) s = ct_calloc((void **)&done, (size_t)batch * sizeof(bool));
    if (!s && !o.no_cache && !m->cfg.score_mod[0] && !m->cfg.mask_mod[0]) {
        /* (a model with compiled mods recomputes: the cache runs only the built-in masks) */
        int64_t cap = g.total < g.seq ? g.total : g.seq;
        s = ct_gpt_cache_create(m, batch, cap, &g.cache);
        if (!s) s = ct_alloc((void **)&g.win, (size_t)(batch * cap) * sizeof(int32_t));
    }
    ct_rng rng;
    ct_rng_seed(&rng, o.seed);
    int64_t n = T, steps = 0, live = batch;
    double t0 = now_s(), t1 = t0;
    for (int64_t step = 0; !s && step < o.max_new_tokens && live > 0; step++) {
        if ((s = next_logits(&g, n, step ? next : NULL))) break;
        for (int64_t b = 0; b < batch && !s; b++) {
            if (done[b]) { /* its draw is still made: other rows see the same stream */
                if (o.sample.temperature > 0) (void)ct_rng_uniform(&rng);
                next[b] = o.eos_token;
                continue;
            }
            s = ct_sample_token(g.logits + b * V, V, &o.sample, &rng, &next[b]);
            if (!s && next[b] == o.eos_token) {
                done[b] = true;
                live--;
            }
        }
        if (s) break;
        for (int64_t b = 0; b < batch; b++)
            out[b * g.total + n] = next[b];
        n++;
        steps++;
        if (step == 0) t1 = now_s();
        if (o.on_step) o.on_step(o.ctx, step, next, batch);
    }
    double t2 = now_s();
    if (!s) {
        for (int64_t b = 0; b < batch; b++)
            for (int64_t t = n; t < g.total; t++)
                out[b * g.total + t] = o.eos_token;
        if (n_new) *n_new = steps;
        if (stats) {
            stats->prompt_tokens = T;
            stats->new_tokens = steps;
            stats->prompt_seconds = t1 - t0;
            stats->decode_seconds = steps > 1 ? t2 - t1 : 0;
        }
    }
    ct_gpt_cache_free(g.cache);
    ct_free(g.win);
    ct_free(g.logits);
    ct_free(next);
    ct_free(done);
    return s;
}

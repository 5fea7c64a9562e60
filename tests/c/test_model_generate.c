/* KV-cache generation: cached logits (prefill, chunked prefill, one-token decode, several
 * rows) against the full forward (ct_gpt_next_logits) of the same tokens, with the causal
 * mask, a sliding window and document masking; sampling (temperature -> top-k -> top-p)
 * against a naive reference; ct_gpt_generate cached vs the recompute-everything baseline,
 * past the context, across thread counts; memory accounting and bad input. Cached and full
 * logits come from different GEMM shapes (a GEMV per token vs one GEMM), so they agree to f32
 * rounding: within 1e-5 + 2e-5 |logit| (a wrong position or mask is off by far more). */
#include "test_util.h"

typedef struct model_case {
    int64_t context, window, kv_heads;
    int32_t eos; /* document masking token, -1: none */
    bool tied;
    int64_t head_dim; /* 0: d_model / n_head */
    bool bias;        /* q/k/v and o biases (random) */
    int32_t rope_scaling;
} model_case;

static ct_gpt *make_model(const model_case *mc, int64_t batch)
{
    ct_gpt_config c = ct_gpt_config_default();
    c.vocab_size = 37;
    c.context = mc->context;
    c.n_layer = 2;
    c.d_model = 16;
    c.n_head = 4;
    c.n_kv_head = mc->kv_heads;
    c.d_ff = 24;
    c.window = mc->window;
    c.tied = mc->tied;
    c.init_std = 0.4f; /* large weights: attention far from uniform */
    c.head_dim = mc->head_dim;
    c.qkv_bias = c.o_bias = mc->bias;
    c.rope_scaling = mc->rope_scaling;
    if (mc->rope_scaling) {
        c.rope_factor = 4;
        c.rope_original_context = 8;
    }
    ct_gpt_options o = ct_gpt_options_default();
    o.batch = batch;
    o.eos_token = mc->eos;
    ct_gpt *m = NULL;
    CHECK_OK(ct_gpt_create(&c, &o, &m));
    if (m) CHECK_OK(ct_gpt_init(m, 11));
    for (int i = 0; m && i < ct_gpt_num_tensors(m); i++) {
        const char *name;
        ct_tensor p;
        CHECK_OK(ct_gpt_tensor(m, i, &name, &p, NULL));
        if (strstr(name, ".bias")) t_fill(p.data, (size_t)ct_tensor_numel(&p), -0.5f, 0.5f);
    }
    return m;
}

static void random_tokens(int32_t *x, int64_t n, int32_t V, int32_t eos)
{
    for (int64_t i = 0; i < n; i++) {
        x[i] = (int32_t)(t_next() % (uint64_t)V);
        if (eos >= 0 && i % 7 == 3) x[i] = eos; /* several documents per row */
    }
}

/* Rows of B sequences of T tokens: prefill the first p with every position's logits, then
 * decode the rest one token at a time; every logit row must equal the full forward's. */
static void test_cached_logits(const model_case *mc, int64_t B, int64_t T, int64_t p)
{
    ct_gpt *m = make_model(mc, B);
    if (!m) return;
    int64_t V = 37;
    int32_t *tok = malloc((size_t)(B * T) * sizeof *tok);
    float *all = malloc((size_t)(B * p * V) * sizeof *all), *ref = malloc((size_t)V * 4);
    float *step = malloc((size_t)(B * V) * sizeof *step);
    int32_t *col = malloc((size_t)B * sizeof *col);
    random_tokens(tok, B * T, (int32_t)V, mc->eos);
    ct_gpt_cache *c = NULL;
    CHECK_OK(ct_gpt_cache_create(m, B, T, &c));
    int32_t *pre = malloc((size_t)(B * p) * sizeof *pre);
    for (int64_t b = 0; b < B; b++)
        memcpy(pre + b * p, tok + b * T, (size_t)p * sizeof *pre);
    CHECK_OK(ct_gpt_cache_prefill(c, pre, p, true, all));
    CHECK(ct_gpt_cache_length(c) == p);
    int bad = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < p; t++) {
            CHECK_OK(ct_gpt_next_logits(m, tok + b * T, t + 1, ref));
            bad += !t_close(all + (b * p + t) * V, ref, (size_t)V, 1e-5, 2e-5, "prefill logits");
        }
    for (int64_t t = p; t < T; t++) {
        for (int64_t b = 0; b < B; b++)
            col[b] = tok[b * T + t];
        CHECK_OK(ct_gpt_cache_decode(c, col, step));
        for (int64_t b = 0; b < B; b++) {
            CHECK_OK(ct_gpt_next_logits(m, tok + b * T, t + 1, ref));
            bad += !t_close(step + b * V, ref, (size_t)V, 1e-5, 2e-5, "decode logits");
        }
    }
    CHECK(ct_gpt_cache_length(c) == T);
    /* and against every position of the batched full forward (ct_gpt_logits) */
    float *full = malloc((size_t)(B * T * V) * sizeof *full);
    CHECK_OK(ct_gpt_logits(m, tok, B, T, full));
    bad += !t_close(all, full, (size_t)(p * V), 1e-5, 2e-5, "prefill vs ct_gpt_logits") ||
           !t_close(step + (B - 1) * V, full + (B * T - 1) * V, (size_t)V, 1e-5, 2e-5,
                    "decode vs ct_gpt_logits");
    free(full);
    if (bad)
        fprintf(stderr, "  case context %lld window %lld kv %lld eos %d: %d rows differ\n",
                (long long)mc->context, (long long)mc->window, (long long)mc->kv_heads, mc->eos,
                bad);
    CHECK(bad == 0);
    /* a full cache refuses one more token and stays as it was */
    CHECK_STATUS(ct_gpt_cache_decode(c, col, step), CT_EINVAL);
    CHECK(ct_gpt_cache_length(c) == T);
    /* reset and refill: the same logits, bitwise (same shapes, same order) */
    ct_gpt_cache_reset(c);
    CHECK(ct_gpt_cache_length(c) == 0);
    float *again = malloc((size_t)(B * p * V) * sizeof *again);
    CHECK_OK(ct_gpt_cache_prefill(c, pre, p, true, again));
    CHECK(memcmp(all, again, (size_t)(B * p * V) * sizeof *all) == 0);
    /* last-position logits only (all false) equal the last rows of the full answer (the head
     * of one row is a GEMV, of many a GEMM: not bitwise) */
    ct_gpt_cache_reset(c);
    CHECK_OK(ct_gpt_cache_prefill(c, pre, p, false, step));
    for (int64_t b = 0; b < B; b++)
        CHECK(t_close(step + b * V, all + (b * p + p - 1) * V, (size_t)V, 1e-5, 2e-5, "last logits"));
    free(again);
    free(pre);
    ct_gpt_cache_free(c);
    free(tok);
    free(all);
    free(ref);
    free(step);
    free(col);
    ct_gpt_free(m);
}

/* More than one chunk (256 positions) in one prefill, and prefill in two calls. */
static void test_chunked_prefill(void)
{
    model_case mc = {300, 40, 2, 5, true, 0, false, 0};
    ct_gpt *m = make_model(&mc, 1);
    if (!m) return;
    int64_t T = 300, V = 37;
    int32_t tok[300];
    random_tokens(tok, T, (int32_t)V, mc.eos);
    float *all = malloc((size_t)(T * V) * 4), *ref = malloc((size_t)V * 4);
    float *two = malloc((size_t)(T * V) * 4);
    ct_gpt_cache *c = NULL;
    CHECK_OK(ct_gpt_cache_create(m, 1, T, &c));
    CHECK_OK(ct_gpt_cache_prefill(c, tok, T, true, all));
    int bad = 0;
    for (int64_t t = 0; t < T; t += (t < 250 ? 23 : 1)) {
        CHECK_OK(ct_gpt_next_logits(m, tok, t + 1, ref));
        bad += !t_close(all + t * V, ref, (size_t)V, 1e-5, 2e-5, "chunked prefill logits");
    }
    CHECK(bad == 0);
    ct_gpt_cache_reset(c);
    CHECK_OK(ct_gpt_cache_prefill(c, tok, 100, true, two));
    CHECK_OK(ct_gpt_cache_prefill(c, tok + 100, 200, true, two + 100 * V));
    CHECK(t_close(two, all, (size_t)(T * V), 1e-5, 2e-5, "two prefills"));
    ct_gpt_cache_free(c);
    free(all);
    free(two);
    free(ref);
    ct_gpt_free(m);
}

/* Naive reference of the sampling distribution, in double, written from the rules. */
static void ref_probs(const float *x, int64_t V, double temp, int64_t k, double top_p,
                      double *p)
{
    if (temp == 0) {
        int64_t best = 0;
        for (int64_t i = 1; i < V; i++)
            if (x[i] > x[best]) best = i;
        for (int64_t i = 0; i < V; i++)
            p[i] = i == best;
        return;
    }
    /* top-k: keep logits >= the k-th largest */
    double thr = -INFINITY;
    if (k > 0 && k < V) {
        int64_t *used = calloc((size_t)V, sizeof *used);
        for (int64_t r = 0; r < k; r++) {
            int64_t best = -1;
            for (int64_t i = 0; i < V; i++)
                if (!used[i] && (best < 0 || x[i] > x[best])) best = i;
            used[best] = 1;
            thr = x[best];
        }
        free(used);
    }
    double mx = -INFINITY, sum = 0;
    for (int64_t i = 0; i < V; i++)
        if (x[i] >= thr && x[i] > mx) mx = x[i];
    for (int64_t i = 0; i < V; i++) {
        p[i] = x[i] >= thr ? exp((x[i] - mx) / temp) : 0;
        sum += p[i];
    }
    for (int64_t i = 0; i < V; i++)
        p[i] /= sum;
    if (top_p < 1) {
        /* drop a token when the probability of the tokens more likely than it reaches top_p
         * (order: probability descending, lower id first on ties) */
        double *q = malloc((size_t)V * sizeof *q);
        for (int64_t i = 0; i < V; i++) {
            double before = 0;
            for (int64_t j = 0; j < V; j++)
                if (p[j] > p[i] || (p[j] == p[i] && j < i)) before += p[j];
            q[i] = before < top_p || before == 0 ? p[i] : 0;
        }
        sum = 0;
        for (int64_t i = 0; i < V; i++)
            sum += q[i];
        for (int64_t i = 0; i < V; i++)
            p[i] = q[i] / sum;
        free(q);
    }
}

static void test_sampling(void)
{
    enum { V = 50 };
    float x[V], probs[V];
    double ref[V];
    t_fill(x, V, -3, 3);
    x[7] = x[9] = x[20] = 3.5f; /* ties at the top */
    x[30] = -INFINITY;
    struct { float temp; int64_t k; float p; } cases[] = {
        {1, 0, 1}, {0.7f, 0, 1}, {1.3f, 5, 1}, {1, 2, 1}, {1, 3, 1}, {0.9f, 0, 0.6f},
        {1, 10, 0.8f}, {2, 4, 0.3f}, {1, 0, 0}, {0, 5, 0.5f}, {1e-3f, 0, 1}, {1, 60, 0.99f},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ct_sample_options o = {cases[i].temp, cases[i].k, cases[i].p};
        CHECK_OK(ct_sample_probs(x, V, &o, probs));
        ref_probs(x, V, cases[i].temp, cases[i].k, cases[i].p, ref);
        double worst = 0;
        for (int j = 0; j < V; j++)
            worst = fmax(worst, fabs(probs[j] - ref[j]));
        if (worst > 1e-6)
            fprintf(stderr, "  sampling case %zu (T %g k %lld p %g): max diff %g\n", i,
                    (double)cases[i].temp, (long long)cases[i].k, (double)cases[i].p, worst);
        CHECK(worst <= 1e-6);
        /* draws follow probs: frequencies of 40000 seeded draws within 5 sigma */
        ct_rng r;
        ct_rng_seed(&r, 5 + i);
        int count[V] = {0};
        const int n = 40000;
        for (int d = 0; d < n; d++) {
            int32_t tk = -1;
            CHECK_OK(ct_sample_token(x, V, &o, &r, &tk));
            if (tk >= 0 && tk < V) count[tk]++;
        }
        for (int j = 0; j < V; j++) {
            double f = (double)count[j] / n, sd = sqrt(ref[j] * (1 - ref[j]) / n);
            if (ref[j] == 0) CHECK(count[j] == 0);
            else if (fabs(f - ref[j]) > 5 * sd + 1e-9) {
                fprintf(stderr, "  case %zu token %d: frequency %g vs p %g\n", i, j, f, ref[j]);
                CHECK(0);
            }
        }
    }
    /* the same seed gives the same tokens */
    ct_rng a, b;
    ct_rng_seed(&a, 42);
    ct_rng_seed(&b, 42);
    ct_sample_options o = ct_sample_options_default();
    for (int d = 0; d < 50; d++) {
        int32_t ta, tb;
        CHECK_OK(ct_sample_token(x, V, &o, &a, &ta));
        CHECK_OK(ct_sample_token(x, V, &o, &b, &tb));
        CHECK(ta == tb);
    }
    /* greedy draws nothing from the generator and picks the first largest */
    ct_rng_seed(&a, 1);
    ct_rng_seed(&b, 1);
    o.temperature = 0;
    int32_t g;
    CHECK_OK(ct_sample_token(x, V, &o, &a, &g));
    CHECK(g == 7 && ct_rng_next(&a) == ct_rng_next(&b));
    /* bad input */
    ct_sample_options bad[] = {{-1, 0, 1}, {NAN, 0, 1}, {INFINITY, 0, 1}, {1, -1, 1}, {1, 0, 1.5f},
                               {1, 0, -0.1f}, {1, 0, NAN}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_STATUS(ct_sample_options_check(&bad[i]), CT_EINVAL);
        CHECK_STATUS(ct_sample_probs(x, V, &bad[i], probs), CT_EINVAL);
        CHECK_STATUS(ct_sample_token(x, V, &bad[i], &a, &g), CT_EINVAL);
    }
    o = ct_sample_options_default();
    float y[3] = {1, NAN, 2}, z[2] = {-INFINITY, -INFINITY}, w[2] = {0, INFINITY};
    CHECK_STATUS(ct_sample_token(y, 3, &o, &a, &g), CT_EINVAL);
    CHECK_STATUS(ct_sample_token(z, 2, &o, &a, &g), CT_EINVAL);
    CHECK_STATUS(ct_sample_token(w, 2, &o, &a, &g), CT_EINVAL);
    CHECK_STATUS(ct_sample_token(x, 0, &o, &a, &g), CT_EINVAL);
    CHECK_STATUS(ct_sample_token(NULL, V, &o, &a, &g), CT_EINVAL);
}

typedef struct seen {
    int64_t steps;
    int32_t first[4];
} seen;

static void on_step(void *ctx, int64_t step, const int32_t *tokens, int64_t batch)
{
    seen *s = ctx;
    if (step == 0)
        for (int64_t b = 0; b < batch && b < 4; b++)
            s->first[b] = tokens[b];
    s->steps++;
}

/* Cached generation equals the baseline token for token (greedy, sampled, stopping at EOS,
 * and past the context where every step re-fills the cache). */
static void test_generate(void)
{
    model_case mc = {24, 6, 2, 4, false, 0, false, 0};
    ct_gpt *m = make_model(&mc, 1);
    if (!m) return;
    enum { B = 3, T = 5, NEW = 30 };
    int32_t prompt[B * T], a[B * (T + NEW)], b[B * (T + NEW)];
    random_tokens(prompt, B * T, 37, -1);
    struct { float temp; int64_t k; float p; int32_t eos; } cases[] = {
        {0, 0, 1, -1}, {1, 0, 1, -1}, {0.8f, 10, 0.9f, -1}, {1.5f, 0, 1, 9}, {0, 0, 1, 2}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ct_generate_options o = ct_generate_options_default();
        o.max_new_tokens = NEW; /* T + NEW > context 24: the cache slides */
        o.sample = (ct_sample_options){cases[i].temp, cases[i].k, cases[i].p};
        o.seed = 3 + i;
        o.eos_token = cases[i].eos;
        seen sa = {0, {0}};
        o.on_step = on_step;
        o.ctx = &sa;
        int64_t na = -1, nb = -1;
        ct_generate_stats st;
        CHECK_OK(ct_gpt_generate(m, prompt, B, T, &o, a, &na, &st));
        CHECK(sa.steps == na && st.new_tokens == na && st.prompt_tokens == T);
        CHECK(memcmp(sa.first, a + T, sizeof(int32_t)) == 0);
        o.no_cache = true;
        o.on_step = NULL;
        CHECK_OK(ct_gpt_generate(m, prompt, B, T, &o, b, &nb, NULL));
        CHECK(na == nb);
        if (memcmp(a, b, sizeof a) != 0) {
            fprintf(stderr, "  generate case %zu: cached and uncached tokens differ\n", i);
            CHECK(0);
        }
        for (int r = 0; r < B; r++)
            CHECK(memcmp(a + r * (T + NEW), prompt + r * T, T * sizeof(int32_t)) == 0);
        if (cases[i].eos >= 0) {
            /* after a row's EOS everything is EOS; a run that stopped early had all rows end */
            for (int r = 0; r < B; r++) {
                bool ended = false;
                for (int t = T; t < T + NEW; t++) {
                    if (ended) CHECK(a[r * (T + NEW) + t] == cases[i].eos);
                    ended |= a[r * (T + NEW) + t] == cases[i].eos;
                }
                if (na < NEW) CHECK(ended);
            }
        } else {
            CHECK(na == NEW);
        }
        /* the same bits at another thread count */
        int nth = ct_num_threads();
        CHECK_OK(ct_set_num_threads(nth > 1 ? 1 : 3));
        o.no_cache = false;
        CHECK_OK(ct_gpt_generate(m, prompt, B, T, &o, b, &nb, NULL));
        CHECK(memcmp(a, b, sizeof a) == 0);
        CHECK_OK(ct_set_num_threads(nth));
    }
    /* greedy with EOS = the first greedy token stops after one step */
    ct_generate_options o = ct_generate_options_default();
    o.max_new_tokens = 8;
    o.sample.temperature = 0;
    CHECK_OK(ct_gpt_generate(m, prompt, 1, T, &o, a, NULL, NULL));
    o.eos_token = a[T];
    int64_t n = -1;
    CHECK_OK(ct_gpt_generate(m, prompt, 1, T, &o, b, &n, NULL));
    CHECK(n == 1);
    for (int t = T; t < T + 8; t++)
        CHECK(b[t] == a[T]);
    /* zero new tokens copies the prompt */
    o.max_new_tokens = 0;
    CHECK_OK(ct_gpt_generate(m, prompt, 1, T, &o, b, &n, NULL));
    CHECK(n == 0 && memcmp(b, prompt, T * sizeof(int32_t)) == 0);
    /* bad input */
    o = ct_generate_options_default();
    o.max_new_tokens = 2;
    CHECK_STATUS(ct_gpt_generate(m, prompt, 0, T, &o, b, NULL, NULL), CT_EINVAL);
    CHECK_STATUS(ct_gpt_generate(m, prompt, 1, 0, &o, b, NULL, NULL), CT_EINVAL);
    CHECK_STATUS(ct_gpt_generate(NULL, prompt, 1, T, &o, b, NULL, NULL), CT_EINVAL);
    int32_t badp[2] = {1, 37};
    CHECK_STATUS(ct_gpt_generate(m, badp, 1, 2, &o, b, NULL, NULL), CT_EINVAL);
    badp[1] = -1;
    CHECK_STATUS(ct_gpt_generate(m, badp, 1, 2, &o, b, NULL, NULL), CT_EINVAL);
    o.eos_token = 37;
    CHECK_STATUS(ct_gpt_generate(m, prompt, 1, T, &o, b, NULL, NULL), CT_EINVAL);
    o.eos_token = -1;
    o.max_new_tokens = -1;
    CHECK_STATUS(ct_gpt_generate(m, prompt, 1, T, &o, b, NULL, NULL), CT_EINVAL);
    o.max_new_tokens = 2;
    o.sample.top_p = 2;
    CHECK_STATUS(ct_gpt_generate(m, prompt, 1, T, &o, b, NULL, NULL), CT_EINVAL);
    ct_gpt_free(m);
}

static void test_cache_memory_and_errors(void)
{
    model_case mc = {64, 0, 2, -1, true, 0, false, 0};
    ct_gpt *m = make_model(&mc, 1);
    if (!m) return;
    ct_gpt_cache *c = (ct_gpt_cache *)1;
    CHECK_STATUS(ct_gpt_cache_create(m, 0, 8, &c), CT_EINVAL);
    CHECK(c == NULL);
    CHECK_STATUS(ct_gpt_cache_create(m, 2, 65, &c), CT_EINVAL);
    CHECK_STATUS(ct_gpt_cache_create(m, 2, 0, &c), CT_EINVAL);
    CHECK_STATUS(ct_gpt_cache_create(m, (1 << 20) + 1, 8, &c), CT_EINVAL);
    CHECK_STATUS(ct_gpt_cache_create(NULL, 1, 8, &c), CT_EINVAL);
    CHECK_STATUS(ct_gpt_cache_create(m, 1, 8, NULL), CT_EINVAL);
    /* the allocator's limit is honoured: a cache too big for it is refused, nothing leaks */
    ct_memory_stats_t before, after;
    ct_memory_stats(&before);
    ct_memory_set_limit(before.current_bytes + 4096);
    CHECK_STATUS(ct_gpt_cache_create(m, 1 << 20, 64, &c), CT_ENOMEM);
    ct_memory_set_limit(0);
    ct_memory_stats(&after);
    CHECK(after.current_bytes == before.current_bytes);
    /* the cache is accounted: keys and values of 2 layers x 3 rows x 40 positions x 2 x 4 */
    CHECK_OK(ct_gpt_cache_create(m, 3, 40, &c));
    ct_memory_stats(&after);
    size_t kv = 2 * (size_t)(2 * 3 * 40 * 2 * 4) * sizeof(float);
    CHECK(ct_gpt_cache_bytes(c) >= kv);
    CHECK(after.current_bytes >= before.current_bytes + ct_gpt_cache_bytes(c));
    CHECK(ct_gpt_cache_batch(c) == 3 && ct_gpt_cache_capacity(c) == 40);
    int32_t tok[3 * 41] = {0};
    float *lg = malloc(3 * 41 * 37 * sizeof *lg);
    CHECK_STATUS(ct_gpt_cache_prefill(c, tok, 41, false, lg), CT_EINVAL);
    CHECK_STATUS(ct_gpt_cache_prefill(c, tok, 0, false, lg), CT_EINVAL);
    CHECK_STATUS(ct_gpt_cache_prefill(c, NULL, 1, false, lg), CT_EINVAL);
    CHECK_STATUS(ct_gpt_cache_prefill(c, tok, 1, false, NULL), CT_EINVAL);
    CHECK_OK(ct_gpt_cache_prefill(c, tok, 10, false, lg));
    tok[2 * 5 + 4] = 37; /* row 2, position 4 */
    CHECK_STATUS(ct_gpt_cache_prefill(c, tok, 5, false, lg), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "tokens[2][4]") != NULL);
    CHECK(ct_gpt_cache_length(c) == 10);
    CHECK_STATUS(ct_gpt_cache_prefill(c, tok, 31, false, lg), CT_EINVAL);
    CHECK(ct_gpt_cache_length(c) == 10);
    /* a failing allocation inside a step (the block mask) leaves the cache as it was */
    ct_memory_stats(&before);
    ct_memory_set_limit(before.current_bytes + 16);
    tok[2 * 5 + 4] = 1;
    CHECK(ct_gpt_cache_prefill(c, tok, 5, false, lg) != CT_OK);
    ct_memory_set_limit(0);
    CHECK(ct_gpt_cache_length(c) == 10);
    free(lg);
    ct_gpt_cache_free(c);
    ct_gpt_cache_free(NULL);
    ct_gpt_free(m);
}

/* The activations (opt.batch x opt.seq tokens of training rows) are allocated by the first
 * forward that needs them: a model that only generates through the KV cache never holds
 * them, so a long context costs the cache, not the training buffers. */
static void test_generate_holds_no_activations(void)
{
    ct_memory_stats_t m0, m1;
    ct_memory_stats(&m0);
    ct_memory_reset_peak();
    model_case mc = {2048, 0, 2, -1, true, 0, false, 0};
    ct_gpt *m = make_model(&mc, 4); /* seq = context 2048, batch 4 */
    if (!m) return;
    ct_gpt_memory mem = ct_gpt_memory_sizes(m);
    CHECK(mem.activations > 4 * 2048 * 16 * 4 * 10); /* far more than the rest below */
    ct_memory_stats(&m1);
    CHECK(m1.current_bytes - m0.current_bytes < mem.params + mem.grads + mem.activations / 4);
    int32_t prompt[5] = {1, 2, 3, 4, 5}, out[5 + 40];
    ct_generate_options go = ct_generate_options_default();
    go.max_new_tokens = 40;
    go.sample.temperature = 0;
    CHECK_OK(ct_gpt_generate(m, prompt, 1, 5, &go, out, NULL, NULL));
    ct_memory_stats(&m1);
    CHECK(m1.peak_bytes - m0.current_bytes < mem.params + mem.grads + mem.activations / 4);
    /* the first forward allocates them (accounted), and the results are those of a model that
     * had them from the start: the same greedy continuation with and without the cache */
    float *lg = malloc(37 * sizeof *lg);
    CHECK_OK(ct_gpt_next_logits(m, prompt, 5, lg));
    ct_memory_stats(&m1);
    CHECK(m1.current_bytes - m0.current_bytes >= mem.params + mem.grads + mem.activations);
    int32_t out2[5 + 40];
    go.no_cache = true;
    CHECK_OK(ct_gpt_generate(m, prompt, 1, 5, &go, out2, NULL, NULL));
    CHECK(!memcmp(out, out2, sizeof out));
    free(lg);
    ct_gpt_free(m);
    ct_memory_stats(&m1);
    CHECK(m1.current_bytes == m0.current_bytes);
}

static void test_token_ids_parse(void)
{
    int32_t *ids = NULL;
    int64_t n = -1;
    const char *t = " 12,\t7\n 49999 ,, 0 ";
    CHECK_OK(ct_token_ids_parse(t, strlen(t), 50000, &ids, &n));
    CHECK(n == 4 && ids && ids[0] == 12 && ids[1] == 7 && ids[2] == 49999 && ids[3] == 0);
    ct_free(ids);
    CHECK_OK(ct_token_ids_parse(" , ", 3, 10, &ids, &n));
    CHECK(n == 0 && ids == NULL);
    CHECK_OK(ct_token_ids_parse(NULL, 0, 10, &ids, &n));
    CHECK(n == 0 && ids == NULL);
    CHECK_OK(ct_token_ids_parse("2147483647", 10, INT64_C(1) << 31, &ids, &n));
    CHECK(n == 1 && ids[0] == INT32_MAX);
    ct_free(ids);
    const char *bad[] = {"1 50000", "-3", "+3", "1 x 2", "0x10", "1.5", "99999999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_STATUS(ct_token_ids_parse(bad[i], strlen(bad[i]), 50000, &ids, &n), CT_EINVAL);
        CHECK(ids == NULL && n == 0);
    }
    CHECK_STATUS(ct_token_ids_parse("1 x 2", 5, 50000, &ids, &n), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "'x' at byte 2") != NULL);
    CHECK_STATUS(ct_token_ids_parse("1\0002", 3, 50000, &ids, &n), CT_EINVAL); /* a NUL byte */
    CHECK_STATUS(ct_token_ids_parse("1", 1, 0, &ids, &n), CT_EINVAL);
    CHECK_STATUS(ct_token_ids_parse("1", 1, 10, NULL, &n), CT_EINVAL);
    CHECK_STATUS(ct_token_ids_parse(NULL, 1, 10, &ids, &n), CT_EINVAL);
}

int main(void)
{
    test_token_ids_parse();
    model_case cases[] = {
        {20, 0, 2, -1, true, 0, false, 0},  /* causal, GQA */
        {20, 4, 2, -1, true, 0, false, 0},  /* sliding window */
        {20, 0, 1, 3, false, 0, false, 0},  /* document masking, one kv head, untied */
        {20, 5, 4, 3, true, 0, false, 0},   /* window and documents, MHA */
        /* Hugging Face shapes: head_dim 6 (H E != C), Qwen2-style biases, llama3 RoPE */
        {20, 0, 2, -1, true, 6, true, CT_ROPE_SCALING_LLAMA3},
        {20, 3, 1, 2, false, 0, true, CT_ROPE_SCALING_LINEAR},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        test_cached_logits(&cases[i], 1, 20, 6);
        test_cached_logits(&cases[i], 3, 17, 1);
    }
    test_chunked_prefill();
    test_sampling();
    test_generate();
    test_cache_memory_and_errors();
    test_generate_holds_no_activations();
    return t_report("test_model_generate");
}

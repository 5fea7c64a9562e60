/* ctorch bench scaling: the hot paths of training at several thread counts (ct_set_num_threads
 * between them, in this process), each beside PyTorch 2.13 doing the same work at the same
 * thread counts (bench/torch_scaling.py, one Python process, torch.set_num_threads): median
 * seconds, speedup and parallel efficiency against the smallest count of the list. */
#include "bench_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SC_MAX_THREADS 32 /* entries of --threads */
#define SC_MAX_REPEATS 64

/* The shapes of every case (the defaults, or --tiny's). */
typedef struct sc_shapes {
    long long gemm;                    /* n of the square [n, n] x [n, n] products */
    long long lce_n, lce_d, lce_v;     /* fused loss: h [N, D], W [V, D] */
    long long fb, fh, fl, fe, fbs;     /* flex: [B, H, L, E], block size; causal mask */
    long long rms_n, rms_c;            /* RMSNorm [N, C] */
    long long swi_n, swi_h;            /* SwiGLU inp [N, 2H] -> [N, H] */
    long long adamw;                   /* AdamW parameter count */
    long long add;                     /* values of each ct_add operand */
    bench_train_conf train;            /* the training step's model and batch */
} sc_shapes;

/* GPT-2 small's parameter count (124M: 12 layers, d 768, V 50257, context 1024, tied head). */
#define GPT2_SMALL_PARAMS 124439808LL

static sc_shapes shapes_default(bool tiny)
{
    sc_shapes s;
    s.train.cfg = ct_gpt_config_default(); /* the default `ctorch train` model */
    s.train.batch = 2;
    s.train.cfg.context = 512;
    s.train.cfg.window = 128;
    if (!tiny) {
        s.gemm = 2048;
        s.lce_n = 1024, s.lce_d = 512, s.lce_v = 32768; /* ~1.4 s a call at 1 thread here */
        s.fb = 1, s.fh = 8, s.fl = 4096, s.fe = 64, s.fbs = 128;
        s.rms_n = 8192, s.rms_c = 2048;
        s.swi_n = 4096, s.swi_h = 2048;
        s.adamw = GPT2_SMALL_PARAMS;
        s.add = 1LL << 26; /* 256 MiB an operand: far past any cache */
        return s;
    }
    s.gemm = 256;
    s.lce_n = 128, s.lce_d = 128, s.lce_v = 2048;
    s.fb = 1, s.fh = 2, s.fl = 256, s.fe = 32, s.fbs = 64;
    s.rms_n = 256, s.rms_c = 128;
    s.swi_n = 256, s.swi_h = 128;
    s.adamw = 1 << 16;
    s.add = 1 << 16;
    s.train.batch = 1;
    s.train.cfg.context = 64;
    s.train.cfg.window = 32;
    s.train.cfg.n_layer = 1;
    s.train.cfg.d_model = 32;
    s.train.cfg.n_head = 2;
    s.train.cfg.n_kv_head = 1;
    s.train.cfg.d_ff = 64;
    s.train.cfg.vocab_size = 256;
    return s;
}

/* ---- the cases: set up once, run at every thread count, release ------------------------- */

typedef struct sc_state {
    const sc_shapes *sh;
    const char *weights; /* train_step: the weights file */
    /* gemm */
    float *a, *b, *c;
    uint16_t *ab, *bb;
    /* lce */
    float *h, *w, *dh, *dw, loss;
    int64_t *y;
    /* flex */
    ct_tensor q, k, v, o, lse, dout, dq, dk, dv;
    ct_mask_mod mm;
    ct_block_mask *bm;
    /* rmsnorm / swiglu */
    float *x, *wt, *out, *rstd, *dx, *dwt, *dy;
    /* adamw */
    float *p, *g, *m1, *m2;
    int64_t step;
    /* train */
    ct_trainer *tr;
    int32_t *stream;
} sc_state;

static void *sc_alloc(size_t bytes, ct_status *s)
{
    void *p = NULL;
    if (*s == CT_OK) *s = ct_alloc(&p, bytes ? bytes : 1);
    return *s == CT_OK ? p : NULL;
}

static float *sc_filled(size_t n, uint64_t seed, float scale, ct_status *s)
{
    float *x = sc_alloc(n * 4, s);
    if (x) bench_fill(x, n, seed, scale);
    return x;
}

static ct_status setup_gemm(sc_state *st, bool bf)
{
    ct_status s = CT_OK;
    size_t n2 = (size_t)(st->sh->gemm * st->sh->gemm);
    st->a = sc_filled(n2, 1, 1.0f, &s);
    st->b = sc_filled(n2, 2, 1.0f, &s);
    st->c = sc_alloc(n2 * 4, &s);
    if (bf) {
        st->ab = sc_alloc(n2 * 2, &s);
        st->bb = sc_alloc(n2 * 2, &s);
        if (s == CT_OK) ct_convert_f32_to_bf16(st->ab, st->a, n2), ct_convert_f32_to_bf16(st->bb, st->b, n2);
    }
    return s;
}
static ct_status setup_gemm_f32(sc_state *st) { return setup_gemm(st, false); }
static ct_status setup_gemm_bf16(sc_state *st) { return setup_gemm(st, true); }

static ct_status run_gemm_f32(void *p)
{
    sc_state *st = p;
    int64_t n = st->sh->gemm;
    return ct_gemm_f32(false, false, n, n, n, 1.0f, st->a, n, st->b, n, 0.0f, st->c, n);
}

static ct_status run_gemm_bf16(void *p)
{
    sc_state *st = p;
    int64_t n = st->sh->gemm;
    return ct_gemm_bf16(false, false, n, n, n, 1.0f, st->ab, n, st->bb, n, 0.0f, st->c, n);
}

static ct_status setup_lce(sc_state *st)
{
    const sc_shapes *sh = st->sh;
    ct_status s = CT_OK;
    size_t nd = (size_t)(sh->lce_n * sh->lce_d), vd = (size_t)(sh->lce_v * sh->lce_d);
    st->h = sc_filled(nd, 11, 1.0f, &s);
    st->w = sc_filled(vd, 12, 0.05f, &s);
    st->dh = sc_alloc(nd * 4, &s);
    st->dw = sc_alloc(vd * 4, &s);
    st->y = sc_alloc((size_t)sh->lce_n * 8, &s);
    uint64_t r = 7;
    for (long long i = 0; st->y && i < sh->lce_n; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        st->y[i] = (int64_t)((r >> 33) % (uint64_t)sh->lce_v);
    }
    return s;
}

static ct_status run_lce(void *p)
{
    sc_state *st = p;
    const sc_shapes *sh = st->sh;
    ct_ce_options o = ct_ce_options_default();
    ct_lce_inputs in = {st->h, st->w, NULL, CT_DTYPE_F32, st->y, CT_DTYPE_I64, sh->lce_n, sh->lce_d, sh->lce_v};
    ct_ce_outputs out = {&st->loss, NULL, NULL};
    ct_lce_grads g = {st->dh, st->dw, NULL, false};
    return ct_linear_cross_entropy_forward_backward(&out, &g, NULL, &in, &o);
}

static ct_status flex_tensor(ct_tensor *t, const sc_shapes *sh, bool lse, uint64_t seed)
{
    int64_t shape[4] = {sh->fb, sh->fh, sh->fl, sh->fe};
    ct_status s = ct_tensor_empty(t, CT_DTYPE_F32, lse ? 3 : 4, shape);
    if (s == CT_OK && seed) bench_fill(t->data, (size_t)ct_tensor_numel(t), seed, 1.0f);
    return s;
}

static ct_status setup_flex(sc_state *st)
{
    const sc_shapes *sh = st->sh;
    ct_status s;
    if ((s = flex_tensor(&st->q, sh, false, 1)) || (s = flex_tensor(&st->k, sh, false, 2)) ||
        (s = flex_tensor(&st->v, sh, false, 3)) || (s = flex_tensor(&st->o, sh, false, 0)) ||
        (s = flex_tensor(&st->lse, sh, true, 0)) || (s = flex_tensor(&st->dout, sh, false, 4)) ||
        (s = flex_tensor(&st->dq, sh, false, 0)) || (s = flex_tensor(&st->dk, sh, false, 0)) ||
        (s = flex_tensor(&st->dv, sh, false, 0)))
        return s;
    if ((s = ct_mask_mod_causal(&st->mm))) return s;
    if ((s = ct_block_mask_create(&st->mm, sh->fb, sh->fh, sh->fl, sh->fl, sh->fbs, &st->bm))) return s;
    /* the backward reads the forward's out and lse */
    return ct_flex_attention_forward(&st->q, &st->k, &st->v, st->bm, NULL, &st->o, &st->lse);
}

static ct_status run_flex_fwd(void *p)
{
    sc_state *st = p;
    return ct_flex_attention_forward(&st->q, &st->k, &st->v, st->bm, NULL, &st->o, &st->lse);
}

static ct_status run_flex_bwd(void *p)
{
    sc_state *st = p;
    return ct_flex_attention_backward(&st->q, &st->k, &st->v, &st->o, &st->lse, &st->dout, st->bm, NULL, &st->dq,
                                      &st->dk, &st->dv);
}

static ct_status setup_rmsnorm(sc_state *st)
{
    const sc_shapes *sh = st->sh;
    ct_status s = CT_OK;
    size_t nc = (size_t)(sh->rms_n * sh->rms_c);
    st->x = sc_filled(nc, 21, 1.0f, &s);
    st->wt = sc_filled((size_t)sh->rms_c, 22, 0.1f, &s);
    for (long long i = 0; st->wt && i < sh->rms_c; i++)
        st->wt[i] += 1.0f;
    st->dy = sc_filled(nc, 23, 1.0f, &s);
    st->out = sc_alloc(nc * 4, &s);
    st->dx = sc_alloc(nc * 4, &s);
    st->rstd = sc_alloc((size_t)sh->rms_n * 4, &s);
    st->dwt = sc_alloc((size_t)sh->rms_c * 4, &s);
    return s;
}

/* forward + backward, the weight gradient zeroed first (as an optimizer step's zero_grad) */
static ct_status run_rmsnorm(void *p)
{
    sc_state *st = p;
    const sc_shapes *sh = st->sh;
    ct_status s = ct_rmsnorm_forward(st->out, st->rstd, st->x, st->wt, sh->rms_n, sh->rms_c, 1e-5f);
    memset(st->dwt, 0, (size_t)sh->rms_c * 4);
    if (!s) s = ct_rmsnorm_backward(st->dx, st->dwt, st->dy, st->x, st->wt, st->rstd, sh->rms_n, sh->rms_c);
    return s;
}

static ct_status setup_swiglu(sc_state *st)
{
    const sc_shapes *sh = st->sh;
    ct_status s = CT_OK;
    size_t nh = (size_t)(sh->swi_n * sh->swi_h);
    st->x = sc_filled(2 * nh, 31, 2.0f, &s);
    st->dy = sc_filled(nh, 32, 1.0f, &s);
    st->out = sc_alloc(nh * 4, &s);
    st->dx = sc_alloc(2 * nh * 4, &s);
    return s;
}

static ct_status run_swiglu(void *p)
{
    sc_state *st = p;
    const sc_shapes *sh = st->sh;
    ct_status s = ct_swiglu_forward(st->out, st->x, sh->swi_n, sh->swi_h);
    if (!s) s = ct_swiglu_backward(st->dx, st->dy, st->x, sh->swi_n, sh->swi_h);
    return s;
}

static ct_status setup_adamw(sc_state *st)
{
    ct_status s = CT_OK;
    size_t n = (size_t)st->sh->adamw;
    st->p = sc_filled(n, 41, 0.02f, &s);
    st->g = sc_filled(n, 42, 1e-3f, &s);
    st->m1 = sc_alloc(n * 4, &s);
    st->m2 = sc_alloc(n * 4, &s);
    if (s == CT_OK) memset(st->m1, 0, n * 4), memset(st->m2, 0, n * 4);
    st->step = 0;
    return s;
}

static ct_status run_adamw(void *p)
{
    sc_state *st = p;
    ct_adamw_options o = ct_adamw_options_default();
    return ct_adamw_step(st->p, st->g, st->m1, st->m2, st->sh->adamw, ++st->step, &o);
}

static ct_status setup_add(sc_state *st)
{
    ct_status s = CT_OK;
    size_t n = (size_t)st->sh->add;
    st->p = sc_filled(n, 51, 1.0f, &s);
    st->g = sc_filled(n, 52, 1.0f, &s);
    st->m1 = sc_alloc(n * 4, &s);
    if (s == CT_OK) memset(st->m1, 0, n * 4); /* the pages touched before the timing */
    return s;
}

static ct_status run_add(void *p)
{
    sc_state *st = p;
    return ct_add(st->m1, st->p, st->g, st->sh->add);
}

static ct_status setup_train(sc_state *st)
{
    const bench_train_conf *c = &st->sh->train;
    int64_t n;
    st->stream = bench_train_stream(c, &n);
    if (!st->stream) return CT_ENOMEM;
    ct_train_options o = bench_train_options(c, "fused-flex"); /* ctorch train's defaults */
    o.steps = 1000000;                                           /* a flat schedule */
    ct_tensor_file *f = NULL;
    ct_status s = ct_trainer_create(&c->cfg, &o, st->stream, n, NULL, 0, &st->tr);
    if (!s) s = ct_load(st->weights, NULL, &f);
    if (!s) s = ct_gpt_load_params(ct_trainer_model(st->tr), f);
    ct_tensor_file_close(f);
    return s;
}

static ct_status run_train(void *p)
{
    return ct_trainer_step(((sc_state *)p)->tr, NULL);
}

static void release(sc_state *st)
{
    ct_free(st->a), ct_free(st->b), ct_free(st->c), ct_free(st->ab), ct_free(st->bb);
    ct_free(st->h), ct_free(st->w), ct_free(st->dh), ct_free(st->dw), ct_free(st->y);
    ct_tensor *ts[] = {&st->q, &st->k, &st->v, &st->o, &st->lse, &st->dout, &st->dq, &st->dk, &st->dv};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        ct_tensor_free(ts[i]);
    ct_block_mask_free(st->bm);
    if (st->mm.tile) ct_mask_mod_free(&st->mm);
    ct_free(st->x), ct_free(st->wt), ct_free(st->out), ct_free(st->rstd), ct_free(st->dx), ct_free(st->dwt),
        ct_free(st->dy);
    ct_free(st->p), ct_free(st->g), ct_free(st->m1), ct_free(st->m2);
    ct_trainer_free(st->tr);
    free(st->stream);
    const sc_shapes *sh = st->sh;
    const char *w = st->weights;
    memset(st, 0, sizeof *st);
    st->sh = sh, st->weights = w;
}

typedef struct sc_case {
    const char *name;
    ct_status (*setup)(sc_state *);
    ct_status (*run)(void *);
} sc_case;

static const sc_case cases[] = {
    {"gemm_f32", setup_gemm_f32, run_gemm_f32},   {"gemm_bf16", setup_gemm_bf16, run_gemm_bf16},
    {"lce", setup_lce, run_lce},                  {"flex_fwd", setup_flex, run_flex_fwd},
    {"flex_bwd", setup_flex, run_flex_bwd},       {"rmsnorm", setup_rmsnorm, run_rmsnorm},
    {"swiglu", setup_swiglu, run_swiglu},         {"adamw", setup_adamw, run_adamw},
    {"add", setup_add, run_add},                  {"train_step", setup_train, run_train},
};
#define SC_CASES ((int)(sizeof cases / sizeof cases[0]))

/* What a case does, in words (the shape, the dtype, the mask). */
static void describe(int ci, const sc_shapes *sh, char *buf, size_t cap)
{
    const ct_gpt_config *g = &sh->train.cfg;
    switch (ci) {
    case 0: snprintf(buf, cap, "ct_gemm_f32 [%lld, %lld] x [%lld, %lld]", sh->gemm, sh->gemm, sh->gemm, sh->gemm); break;
    case 1:
        snprintf(buf, cap, "ct_gemm_bf16 [%lld, %lld] x [%lld, %lld], bf16 operands, f32 result", sh->gemm, sh->gemm,
                 sh->gemm, sh->gemm);
        break;
    case 2:
        snprintf(buf, cap, "fused linear cross-entropy forward + backward (dh, dW), f32, N=%lld D=%lld V=%lld",
                 sh->lce_n, sh->lce_d, sh->lce_v);
        break;
    case 3:
    case 4:
        snprintf(buf, cap, "FlexAttention %s, causal block mask, f32 [B %lld, H %lld, L %lld, E %lld], block %lld",
                 ci == 3 ? "forward (out, lse)" : "backward alone (dq, dk, dv from out, lse)", sh->fb, sh->fh, sh->fl,
                 sh->fe, sh->fbs);
        break;
    case 5: snprintf(buf, cap, "RMSNorm forward + backward (dx, dw), f32 [%lld, %lld]", sh->rms_n, sh->rms_c); break;
    case 6:
        snprintf(buf, cap, "SwiGLU silu(a) * b forward + backward, f32 inp [%lld, %lld] -> [%lld, %lld]", sh->swi_n,
                 2 * sh->swi_h, sh->swi_n, sh->swi_h);
        break;
    case 7:
        snprintf(buf, cap, "AdamW step over %lld f32 parameters%s", sh->adamw,
                 sh->adamw == GPT2_SMALL_PARAMS ? " (GPT-2 small)" : "");
        break;
    case 8:
        snprintf(buf, cap,
                 "ct_add over %lld f32 values (12 bytes a value: the memory system's own scaling, the ceiling "
                 "of the memory-bound rows)",
                 sh->add);
        break;
    default:
        snprintf(buf, cap,
                 "training step of the default ctorch train model (fused loss, FlexAttention sliding window %lld, "
                 "clip, AdamW): V %lld, %lld layers, d_model %lld, %lld heads (%lld kv), ffn %lld; B %lld T %lld",
                 (long long)g->window, (long long)g->vocab_size, (long long)g->n_layer, (long long)g->d_model,
                 (long long)g->n_head, (long long)g->n_kv_head, (long long)g->d_ff, sh->train.batch,
                 (long long)g->context);
    }
}

/* Useful floating-point work of one call (0: not counted). */
static double case_flops(int ci, const sc_shapes *sh)
{
    double pairs = (double)sh->fb * sh->fh * (double)sh->fl * (double)(sh->fl + 1) / 2;
    switch (ci) {
    case 0:
    case 1: return 2.0 * sh->gemm * (double)sh->gemm * sh->gemm;
    case 2: return 6.0 * sh->lce_n * (double)sh->lce_d * sh->lce_v;
    case 3: return 4.0 * sh->fe * pairs;
    case 4: return 10.0 * sh->fe * pairs; /* dV, dP, dQ, dK: 2.5x the forward's products */
    default: return 0;
    }
}

/* Times one case at every thread count, interleaved repeat by repeat (a load change hits every
 * count alike); one warm-up at each count first. med[t] gets the medians. */
static ct_status time_case(const sc_case *c, sc_state *st, const int *threads, int nt, int repeats, double *med)
{
    static double x[SC_MAX_THREADS][SC_MAX_REPEATS];
    ct_status s;
    for (int r = -1; r < repeats; r++)
        for (int t = 0; t < nt; t++) {
            if ((s = ct_set_num_threads(threads[t]))) return s;
            double t0 = bench_now();
            if ((s = c->run(st))) return s;
            if (r >= 0) x[t][r] = bench_now() - t0;
        }
    for (int t = 0; t < nt; t++) {
        double *v = x[t];
        for (int i = 1; i < repeats; i++) /* insertion sort: at most 64 */
            for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
                double tmp = v[j];
                v[j] = v[j - 1];
                v[j - 1] = tmp;
            }
        med[t] = repeats % 2 ? v[repeats / 2] : 0.5 * (v[repeats / 2 - 1] + v[repeats / 2]);
    }
    return CT_OK;
}

/* ---- options ----------------------------------------------------------------------------- */

static int cmp_int(const void *a, const void *b)
{
    return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b);
}

/* "1 2 4" or "1,2,4": 1 .. 32 counts of 1 .. 256 threads, sorted, duplicates dropped. */
static bool parse_threads(const char *v, int *out, int *n)
{
    *n = 0;
    const char *p = v;
    for (;;) {
        while (*p == ' ' || *p == ',' || *p == '\t') p++;
        if (!*p) break;
        size_t len = strcspn(p, " ,\t");
        char tok[32];
        if (len >= sizeof tok || *n == SC_MAX_THREADS) {
            fprintf(stderr, "ctorch bench scaling: --threads: at most %d counts of 1 .. 256 threads, got '%.64s'\n",
                    SC_MAX_THREADS, v);
            return false;
        }
        memcpy(tok, p, len);
        tok[len] = 0;
        long long x;
        if (!cli_int("--threads", tok, 1, 256, &x)) return false;
        out[(*n)++] = (int)x;
        p += len;
    }
    if (*n == 0) {
        fprintf(stderr, "ctorch bench scaling: --threads needs thread counts (e.g. \"1 2 4\"), got '%.64s'\n", v);
        return false;
    }
    qsort(out, (size_t)*n, sizeof *out, cmp_int);
    int k = 1;
    for (int i = 1; i < *n; i++)
        if (out[i] != out[k - 1]) out[k++] = out[i];
    *n = k;
    return true;
}

/* The default list: 1, 2, 4, ... up to the online CPUs, and the CPU count itself. */
static int default_threads(int *out)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (cpus < 1) cpus = 1;
    if (cpus > 256) cpus = 256;
    int n = 0;
    for (int t = 1; t < cpus && n < SC_MAX_THREADS - 1; t *= 2) out[n++] = t;
    out[n++] = (int)cpus;
    return n;
}

static int case_index(const char *name, size_t len)
{
    for (int i = 0; i < SC_CASES; i++)
        if (strlen(cases[i].name) == len && !strncmp(cases[i].name, name, len)) return i;
    return -1;
}

static void usage(void)
{
    puts("usage: ctorch bench scaling [--threads LIST] [--cases LIST] [--tiny] [--no-torch-compile]\n"
         "                            [--repeats R] [--json]\n"
         "Each case at each thread count of LIST (\"1 2 4\" or \"1,2,4\"; default 1, 2, 4, ... up to the\n"
         "online CPUs), set in this process with ct_set_num_threads; one warm-up per count, then R\n"
         "repeats interleaved across the counts; the median seconds, the speedup t1 / tn and the\n"
         "parallel efficiency t1 / (n tn) (against the smallest count of LIST), beside PyTorch 2.13\n"
         "doing the same work at the same thread counts (bench/torch_scaling.py, one process,\n"
         "torch.set_num_threads; torch.compile'd where that helps, recompiled at each count, unless\n"
         "--no-torch-compile or --tiny). Cases (--cases picks some, comma-separated):\n"
         "  gemm_f32    ct_gemm_f32 2048^3                     vs torch.matmul f32\n"
         "  gemm_bf16   ct_gemm_bf16 2048^3 (f32 result)       vs torch.matmul bf16\n"
         "  lce         fused linear cross-entropy fwd + bwd, N=1024 D=512 V=32768 f32\n"
         "              vs the faster of F.linear_cross_entropy (chunked) and compiled F.linear +\n"
         "              F.cross_entropy\n"
         "  flex_fwd    FlexAttention forward, causal block mask, [1, 8, 4096, 64] f32, block 128\n"
         "              vs torch.compile(flex_attention)\n"
         "  flex_bwd    its backward alone (PyTorch 2.13 has no flex backward on CPU: the row says so)\n"
         "  rmsnorm     RMSNorm fwd + bwd [8192, 2048]        vs compiled F.rms_norm\n"
         "  swiglu      SwiGLU fwd + bwd inp [4096, 4096]     vs compiled F.silu(a) * b\n"
         "  adamw       AdamW step over GPT-2 small's 124,439,808 parameters vs AdamW(fused=True)\n"
         "  add         ct_add over 2^26 f32 values (STREAM's add: the memory system's own scaling,\n"
         "              the ceiling of the memory-bound rows) vs torch.add(a, b, out=o)\n"
         "  train_step  one step of the default `ctorch train` model (B 2, T 512, window 128; fused\n"
         "              loss + flex) vs bench/torch_train.py's compiled SdpaGPT from the same weights\n"
         "--tiny: small shapes of every case and eager PyTorch (a smoke run of seconds).\n"
         "PyTorch 2.13 is the baseline: without it the benchmark fails and says how to install it.");
}

/* ---- the benchmark ----------------------------------------------------------------------- */

static json_t *jarr_dbl(const double *x, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(a, x[i] > 0 ? json_real(x[i]) : json_null());
    return a;
}

int bench_scaling(bench_ctx *b, int argc, char **argv)
{
    int threads[SC_MAX_THREADS], nt = 0;
    bool tiny = false, no_compile = false, want[SC_CASES];
    for (int i = 0; i < SC_CASES; i++)
        want[i] = true;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage();
            return 0;
        }
        if (cli_opt(argc, argv, &i, "--threads", &v)) {
            if (!parse_threads(v, threads, &nt)) return 2;
        } else if (cli_opt(argc, argv, &i, "--cases", &v)) {
            for (int k = 0; k < SC_CASES; k++)
                want[k] = false;
            const char *p = v;
            do {
                size_t len = strcspn(p, ",");
                int k = case_index(p, len);
                if (k < 0) {
                    fprintf(stderr, "ctorch bench scaling: --cases: unknown case '%.*s' (cases:", (int)(len > 64 ? 64 : len),
                            p);
                    for (int j = 0; j < SC_CASES; j++)
                        fprintf(stderr, " %s", cases[j].name);
                    fprintf(stderr, ")\n");
                    return 2;
                }
                want[k] = true;
                p += len;
            } while (*p++ == ',');
        } else if (!strcmp(argv[i], "--tiny")) {
            tiny = true;
        } else if (!strcmp(argv[i], "--no-torch-compile")) {
            no_compile = true;
        } else {
            fprintf(stderr, "ctorch bench scaling: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (nt == 0) nt = default_threads(threads);
    if (tiny) no_compile = true;
    int repeats = b->repeats > SC_MAX_REPEATS ? SC_MAX_REPEATS : b->repeats;
    sc_shapes sh = shapes_default(tiny);
    int saved_threads = ct_num_threads();

    /* the training step's weights and batch, for both sides */
    char wpath[4096] = "";
    if (want[SC_CASES - 1]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(wpath, sizeof wpath, "%s/ctorch-bench-scaling-%d.safetensors", tmp && *tmp ? tmp : "/tmp",
                 (int)getpid());
        ct_status s = ct_gpt_config_check(&sh.train.cfg);
        if (s) return cli_fail("bench scaling: train_step model", s);
        int rc = bench_train_write_weights(&sh.train, wpath);
        if (rc) return rc;
    }

    double fma1 = bench_fma_gflops_1core(repeats);
    double sec[SC_CASES][SC_MAX_THREADS] = {{0}};
    sc_state st;
    memset(&st, 0, sizeof st);
    st.sh = &sh, st.weights = wpath;
    for (int ci = 0; ci < SC_CASES; ci++) {
        if (!want[ci]) continue;
        ct_status s = cases[ci].setup(&st);
        if (!s) s = time_case(&cases[ci], &st, threads, nt, repeats, sec[ci]);
        release(&st);
        if (s) {
            ct_set_num_threads(saved_threads);
            if (*wpath) remove(wpath);
            char what[64];
            snprintf(what, sizeof what, "bench scaling: %s", cases[ci].name);
            return cli_fail(what, s);
        }
    }
    ct_set_num_threads(saved_threads);

    /* PyTorch 2.13: the same cases, shapes and thread counts in one process */
    char tl[SC_MAX_THREADS * 5 + 1] = "", cl[256] = "", sr[16], sg[32], slce[96], sflex[160], srms[64], sswi[64],
                                          sad[32], sadd[32];
    for (int t = 0; t < nt; t++)
        snprintf(tl + strlen(tl), sizeof tl - strlen(tl), "%s%d", t ? "," : "", threads[t]);
    for (int ci = 0; ci < SC_CASES; ci++)
        if (want[ci]) snprintf(cl + strlen(cl), sizeof cl - strlen(cl), "%s%s", *cl ? "," : "", cases[ci].name);
    snprintf(sr, sizeof sr, "%d", repeats);
    snprintf(sg, sizeof sg, "%lld", sh.gemm);
    snprintf(slce, sizeof slce, "%lld,%lld,%lld", sh.lce_n, sh.lce_d, sh.lce_v);
    snprintf(sflex, sizeof sflex, "%lld,%lld,%lld,%lld,%lld", sh.fb, sh.fh, sh.fl, sh.fe, sh.fbs);
    snprintf(srms, sizeof srms, "%lld,%lld", sh.rms_n, sh.rms_c);
    snprintf(sswi, sizeof sswi, "%lld,%lld", sh.swi_n, sh.swi_h);
    snprintf(sad, sizeof sad, "%lld", sh.adamw);
    snprintf(sadd, sizeof sadd, "%lld", sh.add);
    char *pa[32] = {"--threads", tl,      "--repeats", sr,    "--cases",  cl,   "--gemm",  sg,
                    "--lce",     slce,    "--flex",    sflex, "--rmsnorm", srms, "--swiglu", sswi,
                    "--adamw",   sad,     "--add",     sadd,  NULL};
    int np = 20;
    if (*wpath) pa[np++] = "--weights", pa[np++] = wpath;
    if (no_compile) pa[np++] = "--no-compile";
    pa[np] = NULL;
    json_t *torch = bench_python("torch_scaling.py", pa);
    if (*wpath) remove(wpath);
    const char *tstatus = json_string_value(json_object_get(torch, "status"));
    if (!tstatus || strcmp(tstatus, "ok")) {
        const char *why = json_string_value(json_object_get(torch, "why"));
        fprintf(stderr,
                "ctorch bench scaling: PyTorch 2.13 (the baseline) %s%s%s; run bash scripts/setup.sh --python "
                "(makes .venv) or set CTORCH_PYTHON to a python with torch 2.13\n",
                tstatus ? tstatus : "failed", why ? ": " : "", why ? why : "");
        json_decref(torch);
        return 1;
    }
    json_t *tcases = json_object_get(torch, "cases");

    /* the report */
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    const char *tver = json_string_value(json_object_get(torch, "torch_version"));
    json_t *j = json_pack("{s:s, s:b, s:i, s:{s:s, s:i, s:s, s:s, s:f}, s:s, s:b}", "bench", "scaling", "tiny", tiny,
                          "repeats", repeats, "machine", "cpu", ct_cpu_name(), "cores", (int)cpus, "isa",
                          ct_isa_name(ct_active_isa()), "kernels", ct_gemm_describe(), "fma_gflops_1core", fma1,
                          "torch_version", tver ? tver : "?", "torch_compile", !no_compile);
    json_t *fb = json_array();
    for (int t = 0; t < nt; t++)
        json_array_append_new(fb, json_real(fma1 * threads[t]));
    json_object_set_new(json_object_get(j, "machine"), "fma_bound_gflops", fb);
    json_t *jc = json_object();
    json_object_set_new(j, "cases", jc);
    if (!b->json) {
        printf("bench scaling%s: %s, %ld cores, %s (%s); FMA bound %.1f GFLOP/s per core; PyTorch %s%s; "
               "medians of %d\n",
               tiny ? " --tiny" : "", ct_cpu_name(), cpus, ct_isa_name(ct_active_isa()), ct_gemm_describe(), fma1,
               tver ? tver : "?", no_compile ? " eager" : " (compiled where that helps)", repeats);
        printf("  %-11s %4s | %10s %7s %6s %8s | %10s %7s | %s\n", "case", "thr", "ctorch s", "speedup", "eff",
               "GFLOP/s", "torch s", "speedup", "torch/ctorch");
    }
    for (int ci = 0; ci < SC_CASES; ci++) {
        if (!want[ci]) continue;
        json_t *tc = json_object_get(tcases, cases[ci].name);
        json_t *ts = json_object_get(tc, "seconds");
        double spd[SC_MAX_THREADS], eff[SC_MAX_THREADS], tsec[SC_MAX_THREADS], tspd[SC_MAX_THREADS],
            gfl[SC_MAX_THREADS], frac[SC_MAX_THREADS], ratio[SC_MAX_THREADS];
        double flops = case_flops(ci, &sh);
        for (int t = 0; t < nt; t++) {
            spd[t] = sec[ci][0] / sec[ci][t];
            eff[t] = spd[t] * threads[0] / threads[t];
            tsec[t] = json_number_value(json_array_get(ts, (size_t)t));
            tspd[t] = tsec[0] > 0 && tsec[t] > 0 ? tsec[0] / tsec[t] : 0;
            gfl[t] = flops > 0 ? flops / sec[ci][t] * 1e-9 : 0;
            frac[t] = gfl[t] > 0 && fma1 > 0 ? gfl[t] / (fma1 * threads[t]) : 0;
            ratio[t] = tsec[t] > 0 ? tsec[t] / sec[ci][t] : 0;
        }
        char what[512];
        describe(ci, &sh, what, sizeof what);
        json_t *o = json_pack("{s:s, s:o, s:o, s:o, s:o, s:o, s:o}", "what", what, "threads", json_array(), "seconds",
                              jarr_dbl(sec[ci], nt), "speedup", jarr_dbl(spd, nt), "efficiency", jarr_dbl(eff, nt),
                              "torch_seconds", jarr_dbl(tsec, nt), "torch_speedup", jarr_dbl(tspd, nt));
        for (int t = 0; t < nt; t++)
            json_array_append_new(json_object_get(o, "threads"), json_integer(threads[t]));
        json_object_set_new(o, "torch_vs_ctorch", jarr_dbl(ratio, nt));
        if (flops > 0) {
            json_object_set_new(o, "gflops", jarr_dbl(gfl, nt));
            json_object_set_new(o, "fraction_of_fma", jarr_dbl(frac, nt));
        }
        if (!strcmp(cases[ci].name, "add")) { /* two operands read, one written */
            double gbs[SC_MAX_THREADS];
            for (int t = 0; t < nt; t++)
                gbs[t] = 12.0 * (double)sh.add / sec[ci][t] * 1e-9;
            json_object_set_new(o, "gbytes_per_s", jarr_dbl(gbs, nt));
        }
        if (ci == SC_CASES - 1) {
            double tok = (double)sh.train.batch * (double)sh.train.cfg.context, tps[SC_MAX_THREADS];
            for (int t = 0; t < nt; t++)
                tps[t] = tok / sec[ci][t];
            json_object_set_new(o, "tokens_per_s", jarr_dbl(tps, nt));
        }
        const char *top = json_string_value(json_object_get(tc, "op"));
        const char *tst = json_string_value(json_object_get(tc, "status"));
        json_object_set_new(o, "torch_op", json_string(top ? top : "?"));
        const char *tmode = json_string_value(json_object_get(tc, "mode"));
        json_object_set_new(o, "torch_mode", json_string(tmode ? tmode : "?"));
        json_object_set_new(o, "torch_status", json_string(tst ? tst : "missing from the PyTorch output"));
        json_t *extra;
        if ((extra = json_object_get(tc, "best"))) json_object_set(o, "torch_best", extra);
        if ((extra = json_object_get(tc, "variants"))) json_object_set(o, "torch_variants", extra);
        if ((extra = json_object_get(tc, "first_call_s"))) json_object_set(o, "torch_first_call_s", extra);
        if ((extra = json_object_get(tc, "threads"))) json_object_set(o, "torch_threads", extra);
        if ((extra = json_object_get(tc, "repeats"))) json_object_set(o, "torch_repeats", extra);
        json_object_set_new(jc, cases[ci].name, o);
        if (b->json) continue;
        for (int t = 0; t < nt; t++) {
            printf("  %-11s %4d | %10.4g %7.2f %6.2f ", t ? "" : cases[ci].name, threads[t], sec[ci][t], spd[t],
                   eff[t]);
            if (gfl[t] > 0)
                printf("%8.1f |", gfl[t]);
            else
                printf("%8s |", "-");
            if (tsec[t] > 0)
                printf(" %10.4g %7.2f | %.2f\n", tsec[t], tspd[t], ratio[t]);
            else
                printf(" %10s %7s | %s\n", "-", "-", tst && strcmp(tst, "ok") ? "see below" : "-");
        }
    }
    if (b->json) {
        bench_print_json(j);
    } else {
        if (threads[0] == 1)
            printf("speedup t1 / tn, efficiency t1 / (n tn)");
        else
            printf("speedup t%d / tn, efficiency %d t%d / (n tn)", threads[0], threads[0], threads[0]);
        printf("; torch/ctorch > 1: ctorch faster. What each row runs:\n");
        for (int ci = 0; ci < SC_CASES; ci++) {
            if (!want[ci]) continue;
            const char *k = cases[ci].name;
            json_t *o = json_object_get(jc, k);
            printf("  %-11s ctorch: %s\n  %-11s torch:  %s [%s]", k, json_string_value(json_object_get(o, "what")), "",
                   json_string_value(json_object_get(o, "torch_op")),
                   json_string_value(json_object_get(o, "torch_mode")));
            const char *tst = json_string_value(json_object_get(o, "torch_status"));
            if (tst && strcmp(tst, "ok")) printf(" %s", tst);
            printf("\n");
        }
    }
    json_decref(j);
    json_decref(torch);
    return 0;
}

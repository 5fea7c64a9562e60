/* ctorch bench cuda: the CUDA backend's GEMM and fused loss beside PyTorch on the same GPU.
 *
 * With no GPU (or no CUDA library) it prints "SKIPPED: <why>" (JSON: "status": "skipped",
 * "reason") and exits 0. With one: GEMM TFLOP/s (f32 and bf16; 4096^3 and the products of a
 * GPT-2-small training step at 8192 tokens), the fused linear + cross-entropy vs the unfused
 * path (logits GEMM, CE forward and backward, two gradient GEMMs) at N=8192 D=4096 V=128256
 * bf16: time and device peak above the inputs and gradient buffers; training steps (ct_trainer
 * on the GPU at ctorch train's default model and GPT-2-124M's shape, f32 and bf16: tokens/s and
 * device peak); and bench/torch_cuda.py's figures (the same cases with PyTorch on the same GPU,
 * the training steps eager and under torch.compile from the same initial weights) in the same
 * run, with ctorch's training tokens/s over PyTorch's. PyTorch runs after the device is closed,
 * so that ctorch's memory pool is handed back first.
 *
 * Timing: one warm-up (two for GEMMs), then the median of >= 10 runs, each ended by
 * ct_device_sync and timed with the wall clock. Peak bytes are those ct_device_memory_stats
 * counts: buffers allocated through the device layer and the backend's own scratch and GEMM
 * workspace (counted through ct_backend_host.account). */
#include "bench_util.h"
#include "device/device_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CUDA_REPEATS_MIN 10

typedef struct cb_gemm_shape {
    const char *what;
    bool ta, tb;
    int64_t m, n, k;
} cb_gemm_shape;

/* A GPT-2-small step (D = 768, 12 heads, vocabulary 50304, B = 8 x T = 1024 = 8192 tokens):
 * the forward x W^T, the input gradient dy W and the weight gradient dy^T x of its linears. */
static const cb_gemm_shape cb_shapes[] = {
    {"square 4096", false, false, 4096, 4096, 4096},
    {"qkv forward", false, true, 8192, 2304, 768},
    {"qkv dinput", false, false, 8192, 768, 2304},
    {"qkv dweight", true, false, 2304, 768, 8192},
    {"attn proj forward", false, true, 8192, 768, 768},
    {"mlp up forward", false, true, 8192, 3072, 768},
    {"mlp down forward", false, true, 8192, 768, 3072},
    {"mlp down dinput", false, false, 8192, 3072, 768},
    {"mlp down dweight", true, false, 768, 3072, 8192},
    {"lm head forward", false, true, 8192, 50304, 768},
    {"lm head dinput", false, false, 8192, 768, 50304},
    {"lm head dweight", true, false, 50304, 768, 8192},
};

/* --tiny (the emulated device, where a 4096^3 product takes minutes): small odd shapes. */
static const cb_gemm_shape cb_tiny_shapes[] = {
    {"tiny square 96", false, false, 96, 96, 96},
    {"tiny nt", false, true, 64, 72, 40},
    {"tiny tn", true, false, 40, 48, 64},
};

static int cb_cmp(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

/* A device buffer filled with deterministic values in [-scale, scale) (f32 or bf16), uploaded
 * in 1 Mi-value chunks so that multi-GiB operands never exist on the host. */
static ct_status cb_upload(ct_device *d, size_t n, ct_dtype dt, uint64_t seed, float scale, void **out)
{
    size_t es = dt == CT_DTYPE_BF16 ? 2 : 4;
    CT_TRY(ct_dev_alloc(d, n * es, "bench operand", out));
    const size_t chunk = (size_t)1 << 20;
    float *f = malloc(chunk * sizeof *f);
    uint16_t *h = malloc(chunk * sizeof *h);
    ct_status s = f && h ? CT_OK : ct_error(CT_ENOMEM, "bench cuda: host staging buffer");
    for (size_t i = 0; s == CT_OK && i < n; i += chunk) {
        size_t k = n - i < chunk ? n - i : chunk;
        bench_fill(f, k, seed + i / chunk, scale);
        if (dt == CT_DTYPE_BF16) {
            ct_convert_f32_to_bf16(h, f, k);
            s = ct_dev_h2d(d, (char *)*out + i * es, h, k * es);
        } else {
            s = ct_dev_h2d(d, (char *)*out + i * es, f, k * es);
        }
    }
    free(f);
    free(h);
    if (s != CT_OK) {
        ct_dev_free(d, *out, n * es);
        *out = NULL;
    }
    return s;
}

/* Run fn warm + repeats times, each synced; fills t (seconds). */
typedef ct_status (*cb_fn)(ct_device *d, void *arg);

static ct_status cb_time(ct_device *d, cb_fn fn, void *arg, int warm, int repeats, bench_time *t)
{
    double x[64];
    if (repeats > 64) repeats = 64;
    for (int r = -warm; r < repeats; r++) {
        double t0 = bench_now();
        CT_TRY(fn(d, arg));
        CT_TRY(ct_device_sync(d));
        if (r >= 0) x[r] = bench_now() - t0;
    }
    qsort(x, (size_t)repeats, sizeof x[0], cb_cmp);
    t->median = repeats % 2 ? x[repeats / 2] : 0.5 * (x[repeats / 2 - 1] + x[repeats / 2]);
    t->min = x[0];
    t->max = x[repeats - 1];
    t->repeats = repeats;
    return CT_OK;
}

/* ---- GEMM ---------------------------------------------------------------------------------- */

typedef struct cb_gemm {
    const cb_gemm_shape *s;
    ct_dtype dt;
    void *a, *b;
    float *c;
} cb_gemm;

static ct_status cb_gemm_once(ct_device *d, void *arg)
{
    const cb_gemm *g = arg;
    const cb_gemm_shape *s = g->s;
    int64_t lda = s->ta ? s->m : s->k, ldb = s->tb ? s->k : s->n;
    CT_DEV(d, gemm, s->ta, s->tb, s->m, s->n, s->k, 1.0f, g->a, lda, g->b, ldb, 0.0f, g->c, s->n, g->dt);
    return CT_OK;
}

static json_t *cb_gemm_case(ct_device *d, const cb_gemm_shape *s, ct_dtype dt, int repeats)
{
    cb_gemm g = {s, dt, NULL, NULL, NULL};
    size_t es = dt == CT_DTYPE_BF16 ? 2 : 4, na = (size_t)(s->m * s->k), nb = (size_t)(s->k * s->n),
           nc = (size_t)(s->m * s->n);
    bench_time t = {0};
    ct_status st = cb_upload(d, na, dt, 1, 1.0f, &g.a);
    if (st == CT_OK) st = cb_upload(d, nb, dt, 2, 1.0f, &g.b);
    if (st == CT_OK) st = ct_dev_alloc(d, nc * 4, "bench C", (void **)&g.c);
    if (st == CT_OK) st = cb_time(d, cb_gemm_once, &g, 2, repeats, &t);
    json_t *j = json_pack("{s:s, s:s, s:b, s:b, s:I, s:I, s:I}", "case", s->what, "dtype", ct_dtype_name(dt), "trans_a",
                          (int)s->ta, "trans_b", (int)s->tb, "m", (json_int_t)s->m, "n", (json_int_t)s->n, "k",
                          (json_int_t)s->k);
    if (st == CT_OK) {
        json_object_set_new(j, "time", bench_time_json(&t));
        json_object_set_new(j, "tflops", json_real(2.0 * (double)s->m * (double)s->n * (double)s->k / t.median / 1e12));
    } else {
        json_object_set_new(j, "error", json_string(ct_last_error()));
    }
    ct_dev_free(d, g.a, na * es);
    ct_dev_free(d, g.b, nb * es);
    ct_dev_free(d, g.c, nc * 4);
    return j;
}

/* ---- fused loss vs unfused ------------------------------------------------------------------- */

typedef struct cb_lce {
    int64_t N, Dm, V;
    void *h, *w;      /* bf16 */
    int32_t *tgt;
    float *loss, *lse, *dh, *dw;
    float *logits, *dlogits; /* unfused: [N, V] f32 */
    uint16_t *dl16;          /* unfused: [N, V] bf16 */
    size_t scratch;          /* fused: scratch budget (0: the device's, 1 GiB on CUDA) */
    unsigned flags;          /* fused: CT_LCE_F32_GRADS or 0 */
} cb_lce;

static ct_status cb_fused_once(ct_device *d, void *arg)
{
    cb_lce *c = arg;
    ct_lce_inputs in = {.h = c->h, .weight = c->w, .bias = NULL, .dtype = CT_DTYPE_BF16, .target = c->tgt,
                        .target_dtype = CT_DTYPE_I32, .N = c->N, .D = c->Dm, .V = c->V};
    ct_ce_outputs out = {c->loss, NULL, c->lse};
    ct_lce_grads g = {c->dh, c->dw, NULL, false};
    ct_ce_options o = ct_ce_options_default();
    o.scratch_bytes = c->scratch;
    CT_DEV(d, lce, &out, &g, 1.0f, NULL, c->flags, &in, &o);
    return CT_OK;
}

/* Unfused, as a framework without the fused loss runs it: logits = h W^T (f32), CE forward and
 * backward on them, the logit gradient rounded to bf16, dh = dlogits W, dW = dlogits^T h. */
static ct_status cb_unfused_once(ct_device *d, void *arg)
{
    cb_lce *c = arg;
    size_t nv = (size_t)(c->N * c->V);
    ct_ce_options o = ct_ce_options_default();
    ct_ce_outputs out = {c->loss, NULL, c->lse};
    if (!c->logits) CT_TRY(ct_dev_alloc(d, nv * 4, "unfused logits", (void **)&c->logits));
    CT_DEV(d, gemm, false, true, c->N, c->V, c->Dm, 1.0f, c->h, c->Dm, c->w, c->Dm, 0.0f, c->logits, c->V,
           CT_DTYPE_BF16);
    CT_DEV(d, ce_fwd, &out, c->logits, c->tgt, c->N, c->V, &o);
    if (!c->dlogits) CT_TRY(ct_dev_alloc(d, nv * 4, "unfused dlogits", (void **)&c->dlogits));
    CT_DEV(d, ce_bwd, c->dlogits, 1.0f, c->logits, c->tgt, c->N, c->V, &o);
    ct_dev_free(d, c->logits, nv * 4);
    c->logits = NULL;
    if (!c->dl16) CT_TRY(ct_dev_alloc(d, nv * 2, "unfused dlogits bf16", (void **)&c->dl16));
    CT_DEV(d, to_bf16, c->dl16, c->dlogits, (int64_t)nv);
    ct_dev_free(d, c->dlogits, nv * 4);
    c->dlogits = NULL;
    CT_DEV(d, gemm, false, false, c->N, c->Dm, c->V, 1.0f, c->dl16, c->V, c->w, c->Dm, 0.0f, c->dh, c->Dm,
           CT_DTYPE_BF16);
    CT_DEV(d, gemm, true, false, c->V, c->Dm, c->N, 1.0f, c->dl16, c->V, c->h, c->Dm, 0.0f, c->dw, c->Dm,
           CT_DTYPE_BF16);
    ct_dev_free(d, c->dl16, nv * 2);
    c->dl16 = NULL;
    return CT_OK;
}

static json_t *cb_loss_case(ct_device *d, const char *name, cb_fn fn, cb_lce *c, int repeats)
{
    bench_time t = {0};
    ct_memory_stats_t m0, m1;
    ct_device_sync(d);
    ct_device_memory_stats(d, &m0);
    ct_device_reset_peak(d);
    ct_status st = cb_time(d, fn, c, 1, repeats, &t);
    ct_device_memory_stats(d, &m1);
    size_t nv = (size_t)(c->N * c->V);
    if (c->logits) ct_dev_free(d, c->logits, nv * 4);
    if (c->dlogits) ct_dev_free(d, c->dlogits, nv * 4);
    if (c->dl16) ct_dev_free(d, c->dl16, nv * 2);
    c->logits = c->dlogits = NULL;
    c->dl16 = NULL;
    json_t *j = json_pack("{s:s}", "case", name);
    if (st == CT_OK) {
        json_object_set_new(j, "time", bench_time_json(&t));
        json_object_set_new(j, "peak_above_inputs_bytes", json_integer((json_int_t)(m1.peak_bytes - m0.current_bytes)));
    } else {
        json_object_set_new(j, "error", json_string(ct_last_error()));
    }
    return j;
}

static json_t *cb_loss(ct_device *d, int64_t N, int64_t Dm, int64_t V, int repeats)
{
    cb_lce c = {.N = N, .Dm = Dm, .V = V};
    json_t *j = json_pack("{s:I, s:I, s:I, s:s, s:s}", "N", (json_int_t)N, "D", (json_int_t)Dm, "V", (json_int_t)V,
                          "dtype", "bf16", "peak_counts",
                          "device buffers through ct_dev_alloc above the inputs and gradient buffers (h, W, "
                          "targets, loss, lse, dh, dW), with the backend's own scratch and GEMM workspace");
    int32_t *tg = malloc((size_t)N * sizeof *tg);
    ct_status st = tg ? CT_OK : ct_error(CT_ENOMEM, "bench cuda: targets");
    for (int64_t i = 0; tg && i < N; i++) tg[i] = (int32_t)((uint64_t)(i * 2654435761u) % (uint64_t)V);
    if (st == CT_OK) st = cb_upload(d, (size_t)(N * Dm), CT_DTYPE_BF16, 11, 1.0f, &c.h);
    if (st == CT_OK) st = cb_upload(d, (size_t)(V * Dm), CT_DTYPE_BF16, 12, 0.05f, &c.w);
    if (st == CT_OK) st = ct_dev_alloc(d, (size_t)N * 4, "targets", (void **)&c.tgt);
    if (st == CT_OK) st = ct_dev_h2d(d, c.tgt, tg, (size_t)N * 4);
    if (st == CT_OK) st = ct_dev_alloc(d, 4, "loss", (void **)&c.loss);
    if (st == CT_OK) st = ct_dev_alloc(d, (size_t)N * 4, "lse", (void **)&c.lse);
    if (st == CT_OK) st = ct_dev_alloc(d, (size_t)(N * Dm) * 4, "dh", (void **)&c.dh);
    if (st == CT_OK) st = ct_dev_alloc(d, (size_t)(V * Dm) * 4, "dW", (void **)&c.dw);
    if (st == CT_OK) {
        json_t *cases = json_array();
        /* fused: the device's own scratch budget (whole vocabulary rows, 3 GEMMs per token
         * block) with the logits' gradient in bf16 (the default); the same under a 64 MiB
         * budget (vocabulary tiles, 4 GEMMs); and with CT_LCE_F32_GRADS (the CPU's numerics:
         * f32 gradient GEMMs) */
        json_array_append_new(cases, cb_loss_case(d, "fused", cb_fused_once, &c, repeats));
        c.scratch = (size_t)64 << 20;
        json_array_append_new(cases, cb_loss_case(d, "fused-64MiB", cb_fused_once, &c, repeats));
        c.scratch = 0;
        c.flags = CT_LCE_F32_GRADS;
        json_array_append_new(cases, cb_loss_case(d, "fused-f32-grads", cb_fused_once, &c, repeats));
        c.flags = 0;
        json_array_append_new(cases, cb_loss_case(d, "unfused", cb_unfused_once, &c, repeats));
        json_object_set_new(j, "cases", cases);
    } else {
        json_object_set_new(j, "error", json_string(ct_last_error()));
    }
    free(tg);
    ct_dev_free(d, c.h, (size_t)(N * Dm) * 2);
    ct_dev_free(d, c.w, (size_t)(V * Dm) * 2);
    ct_dev_free(d, c.tgt, (size_t)N * 4);
    ct_dev_free(d, c.loss, 4);
    ct_dev_free(d, c.lse, (size_t)N * 4);
    ct_dev_free(d, c.dh, (size_t)(N * Dm) * 4);
    ct_dev_free(d, c.dw, (size_t)(V * Dm) * 4);
    return j;
}

/* ---- training steps ------------------------------------------------------------------------ */

/* The models of the training rows: ctorch train's default model (ct_gpt_config_default: V 32768,
 * 4 layers, d 128, 4 heads, 2 kv, SwiGLU 384, T 128) and GPT-2 small's shape as `ctorch bench
 * train --preset gpt2-small` sizes it (12 layers, d 768, 12 heads, 12 kv, V 50304, T 1024,
 * tied head; SwiGLU hidden 2048: three 768 x 2048 matrices hold GPT-2's 2 x 768 x 3072 MLP
 * parameters, so the step has GPT-2-124M's parameter count and FLOPs). */
enum { CB_MODEL_DEFAULT, CB_MODEL_GPT2, CB_MODEL_TINY, CB_NMODELS };
static const char *const cb_model_names[CB_NMODELS] = {"default", "gpt2-124M", "tiny"};

static ct_gpt_config cb_model(int which)
{
    ct_gpt_config c = ct_gpt_config_default();
    if (which == CB_MODEL_GPT2) {
        c.vocab_size = 50304;
        c.context = 1024;
        c.n_layer = 12;
        c.d_model = 768;
        c.n_head = 12;
        c.n_kv_head = 12;
        c.d_ff = 2048;
        c.tied = true;
        c.window = 0;
    } else if (which == CB_MODEL_TINY) { /* --tiny: the tests' tiny model (V 512, 2 layers, d 32) */
        c.vocab_size = 512;
        c.context = 32;
        c.n_layer = 2;
        c.d_model = 32;
        c.n_head = 4;
        c.n_kv_head = 2;
        c.d_ff = 48;
    }
    return c;
}

enum { CB_SIZE_TINY, CB_SIZE_QUICK, CB_SIZE_FULL }; /* --tiny, --quick, neither */
#define CB_IN(size) (1u << (size))

typedef struct cb_train_case {
    int model;
    int64_t batch; /* sequences of the model's context T per step */
    unsigned sizes; /* CB_IN(size) bits: the runs that take it */
} cb_train_case;

static const cb_train_case cb_train_cases[] = {
    {CB_MODEL_DEFAULT, 8, CB_IN(CB_SIZE_QUICK) | CB_IN(CB_SIZE_FULL)},
    {CB_MODEL_GPT2, 4, CB_IN(CB_SIZE_QUICK) | CB_IN(CB_SIZE_FULL)},
    {CB_MODEL_GPT2, 8, CB_IN(CB_SIZE_FULL)},
    {CB_MODEL_GPT2, 16, CB_IN(CB_SIZE_FULL)},
    {CB_MODEL_TINY, 2, CB_IN(CB_SIZE_TINY)},
};

#define CB_TRAIN_WARMUP 2

/* ctorch's step on the GPU: ct_trainer (forward, backward, clip 1, AdamW; the loss read back once
 * per step) with dense causal attention, no document mask, f32 or bf16 products. Times
 * CB_TRAIN_WARMUP + repeats steps, each followed by ct_device_sync; the peak is the device
 * layer's high-water mark from before the trainer's creation (parameters, gradients, AdamW
 * moments, activations, the backend's scratch and GEMM workspace). */
static json_t *cb_train_ctorch(ct_device *d, const ct_gpt_config *cfg, int64_t B, ct_dtype dt, int repeats)
{
    bench_train_conf bc = {*cfg, B};
    int64_t n = 0;
    int32_t *stream = bench_train_stream(&bc, &n);
    ct_train_options o = ct_train_options_default();
    o.batch = B;
    o.seq = cfg->context;
    o.steps = 1000; /* the schedule's length: past the steps taken here */
    o.warmup = 0;
    o.dense_attention = true;
    o.eos_token = -1;
    o.dtype = dt;
    o.device = d;
    ct_memory_stats_t m0, m1;
    ct_status st = stream ? ct_device_sync(d) : ct_error(CT_ENOMEM, "bench cuda: the training tokens");
    ct_device_memory_stats(d, &m0);
    ct_device_reset_peak(d);
    ct_trainer *t = NULL;
    if (st == CT_OK) st = ct_trainer_create(cfg, &o, stream, n, NULL, 0, &t);
    double x[64];
    if (repeats > 64) repeats = 64;
    float first = 0, last = 0;
    for (int r = -CB_TRAIN_WARMUP; st == CT_OK && r < repeats; r++) {
        ct_train_step_info info;
        double ts = bench_now();
        st = ct_trainer_step(t, &info);
        if (st == CT_OK) st = ct_device_sync(d);
        if (st != CT_OK) break;
        if (r == -CB_TRAIN_WARMUP) first = info.loss;
        last = info.loss;
        if (r >= 0) x[r] = bench_now() - ts;
    }
    ct_device_memory_stats(d, &m1);
    ct_trainer_free(t);
    free(stream);
    json_t *j = json_object();
    if (st != CT_OK) {
        json_object_set_new(j, "error", json_string(ct_last_error()));
        return j;
    }
    qsort(x, (size_t)repeats, sizeof x[0], cb_cmp);
    bench_time bt = {repeats % 2 ? x[repeats / 2] : 0.5 * (x[repeats / 2 - 1] + x[repeats / 2]), x[0],
                     x[repeats - 1], repeats};
    json_object_set_new(j, "tokens_per_s", json_real((double)(B * cfg->context) / bt.median));
    json_object_set_new(j, "step", bench_time_json(&bt));
    json_object_set_new(j, "peak_bytes", json_integer((json_int_t)(m1.peak_bytes - m0.current_bytes)));
    json_object_set_new(j, "loss_first", json_real(first));
    json_object_set_new(j, "loss_last", json_real(last));
    return j;
}

/* The torch row of bench/torch_cuda.py's "train" list matching (model, batch, dtype, mode). */
static json_t *cb_torch_row(json_t *torch, const char *model, int64_t B, const char *dtype, const char *mode)
{
    size_t i;
    json_t *g;
    json_array_foreach(json_object_get(torch, "train"), i, g) {
        const char *m = json_string_value(json_object_get(g, "model")), *dt = json_string_value(json_object_get(g, "dtype")),
                   *md = json_string_value(json_object_get(g, "mode"));
        if (m && dt && md && !strcmp(m, model) && !strcmp(dt, dtype) && !strcmp(md, mode) &&
            json_integer_value(json_object_get(g, "batch")) == B)
            return g;
    }
    return NULL;
}

/* After PyTorch's run: each row gets its torch_eager / torch_compiled figures and the ratios
 * ctorch tokens/s over PyTorch tokens/s (> 1: ctorch is faster). */
static void cb_train_merge(json_t *rows, json_t *torch)
{
    size_t i;
    json_t *row;
    json_array_foreach(rows, i, row) {
        const char *model = json_string_value(json_object_get(row, "model")),
                   *dtype = json_string_value(json_object_get(row, "dtype"));
        json_int_t B = json_integer_value(json_object_get(row, "batch"));
        double ours = json_real_value(json_object_get(json_object_get(row, "ctorch"), "tokens_per_s"));
        static const char *const modes[2] = {"eager", "compiled"};
        for (int k = 0; k < 2; k++) {
            json_t *g = cb_torch_row(torch, model, B, dtype, modes[k]);
            if (!g) continue;
            char key[64];
            snprintf(key, sizeof key, "torch_%s", modes[k]);
            json_object_set(row, key, g);
            double theirs = json_real_value(json_object_get(g, "tokens_per_s"));
            if (ours > 0 && theirs > 0) {
                snprintf(key, sizeof key, "ctorch_vs_%s", modes[k]);
                json_object_set_new(row, key, json_real(ours / theirs));
            }
        }
    }
}

/* ---- FlexAttention ------------------------------------------------------------------------- */

/* The flex rows (issue 23): causal sliding-window and causal attention, bf16, B x H heads of L
 * tokens and head dim E (q, k, v [B, L, H, E], ctorch's layout), one block mask of block_size
 * built on the host and uploaded once. window 0: causal. The goals are the on an H200
 * (0: none); the full shapes are the issue's, --quick and --tiny take smaller ones. */
typedef struct cb_flex_shape {
    const char *name;
    int64_t B, H, L, E, window, bs;
    int size;                         /* CB_SIZE_* */
    double goal_fwd_ms, goal_fwd_bwd_ms; /* the goals (<=), 0: none */
    double ref_fwd_ms, ref_fwd_bwd_ms;   /* PyTorch 2.11's Triton flex there, quoted by the issue */
    double goal_gemm_ratio;              /* forward on kept blocks over the bf16 GEMM rate (>=) */
} cb_flex_shape;

static const cb_flex_shape cb_flex_shapes[] = {
    {"sliding window 256", 1, 16, 32768, 64, 256, 128, CB_SIZE_FULL, 0.3, 1.5, 0.24, 1.27, 0},
    {"causal", 1, 16, 8192, 128, 0, 128, CB_SIZE_FULL, 0, 0, 0, 0, 0.6},
    {"sliding window 256", 1, 16, 8192, 64, 256, 128, CB_SIZE_QUICK, 0, 0, 0, 0, 0},
    {"causal", 1, 16, 2048, 128, 0, 128, CB_SIZE_QUICK, 0, 0, 0, 0, 0},
    {"sliding window 32", 1, 2, 256, 32, 32, 64, CB_SIZE_TINY, 0, 0, 0, 0, 0},
    {"causal", 1, 2, 192, 64, 0, 64, CB_SIZE_TINY, 0, 0, 0, 0, 0},
};
#define CB_NFLEX ((int)(sizeof cb_flex_shapes / sizeof cb_flex_shapes[0]))

/* The bf16 GEMM whose rate the forward on kept blocks is set against (measured in the same
 * run): 4096^3 (--tiny: 128^3). */
static const cb_gemm_shape cb_flex_gemm = {"square 4096", false, false, 4096, 4096, 4096};
static const cb_gemm_shape cb_flex_gemm_tiny = {"tiny square 128", false, false, 128, 128, 128};

typedef struct cb_flex {
    ct_flex_args fa;
    ct_attn_grads g;
    bool sdpa; /* the dense causal sdpa slots instead of flex */
} cb_flex;

static ct_status cb_flex_fwd(ct_device *d, void *arg)
{
    cb_flex *c = arg;
    if (c->sdpa) CT_DEV(d, sdpa_fwd, &c->fa.attn);
    else CT_DEV(d, flex_fwd, &c->fa);
    return CT_OK;
}

static ct_status cb_flex_fwd_bwd(ct_device *d, void *arg)
{
    cb_flex *c = arg;
    CT_TRY(cb_flex_fwd(d, arg));
    if (c->sdpa) CT_DEV(d, sdpa_bwd, &c->fa.attn, &c->g);
    else CT_DEV(d, flex_bwd, &c->fa, &c->g);
    return CT_OK;
}

/* 64-bit FNV-1a over the bytes of device buffers (read back in 8 MiB pieces). */
static ct_status cb_hash(ct_device *d, const void *p, size_t bytes, uint64_t *h)
{
    const size_t chunk = (size_t)8 << 20;
    unsigned char *buf = malloc(bytes < chunk ? bytes : chunk);
    if (!buf) return ct_error(CT_ENOMEM, "bench cuda: host buffer for the bitwise check");
    ct_status s = CT_OK;
    for (size_t o = 0; s == CT_OK && o < bytes; o += chunk) {
        size_t k = bytes - o < chunk ? bytes - o : chunk;
        s = ct_dev_d2h(d, buf, (const char *)p + o, k);
        for (size_t i = 0; s == CT_OK && i < k; i++) *h = (*h ^ buf[i]) * 0x100000001b3ull;
    }
    free(buf);
    return s;
}

/* The bytes a forward + backward writes (out, lse, dq, dk, dv) hashed. */
static ct_status cb_flex_hash(ct_device *d, const cb_flex *c, size_t nq, size_t nl, uint64_t *h)
{
    *h = 0xcbf29ce484222325ull;
    CT_TRY(cb_hash(d, c->fa.attn.out, nq * 2, h));
    CT_TRY(cb_hash(d, c->fa.attn.lse, nl * 4, h));
    CT_TRY(cb_hash(d, c->g.dq, nq * 2, h));
    CT_TRY(cb_hash(d, c->g.dk, nq * 2, h));
    return cb_hash(d, c->g.dv, nq * 2, h);
}

static json_t *cb_time_peak_json(const bench_time *t, size_t peak)
{
    json_t *j = bench_time_json(t);
    json_object_set_new(j, "peak_bytes", json_integer((json_int_t)peak));
    return j;
}

/* One method (flex or the dense causal sdpa) on the case's buffers: forward, forward + backward
 * (each timed, with its device peak from before the inputs were allocated: base), then the
 * forward + backward twice more, their outputs and gradients compared bit for bit. */
static json_t *cb_flex_method(ct_device *d, cb_flex *c, size_t base, size_t nq, size_t nl, double fwd_flops,
                              double gemm_tflops, int warm, int repeats)
{
    json_t *j = json_object();
    bench_time tf = {0}, tb = {0};
    ct_memory_stats_t m;
    ct_status st = ct_device_sync(d);
    ct_device_reset_peak(d);
    if (st == CT_OK) st = cb_time(d, cb_flex_fwd, c, warm, repeats, &tf);
    ct_device_memory_stats(d, &m);
    size_t pf = m.peak_bytes - base;
    ct_device_reset_peak(d);
    if (st == CT_OK) st = cb_time(d, cb_flex_fwd_bwd, c, warm, repeats, &tb);
    ct_device_memory_stats(d, &m);
    size_t pb = m.peak_bytes - base;
    uint64_t h1 = 0, h2 = 0;
    if (st == CT_OK) st = cb_flex_hash(d, c, nq, nl, &h1);
    if (st == CT_OK) st = cb_flex_fwd_bwd(d, c);
    if (st == CT_OK) st = cb_flex_hash(d, c, nq, nl, &h2);
    if (st != CT_OK) {
        json_object_set_new(j, "error", json_string(ct_last_error()));
        return j;
    }
    json_object_set_new(j, "fwd", cb_time_peak_json(&tf, pf));
    json_object_set_new(j, "fwd_bwd", cb_time_peak_json(&tb, pb));
    double tfl = fwd_flops / tf.median / 1e12;
    json_object_set_new(j, "fwd_kept_block_tflops", json_real(tfl));
    if (gemm_tflops > 0) json_object_set_new(j, "fwd_vs_gemm_bf16", json_real(tfl / gemm_tflops));
    json_object_set_new(j, "fwd_bwd_kept_block_tflops", json_real(3.5 * fwd_flops / tb.median / 1e12));
    char hx[32];
    snprintf(hx, sizeof hx, "%016llx", (unsigned long long)h1);
    json_object_set_new(j, "bitwise_repeatable", json_boolean(h1 == h2));
    json_object_set_new(j, "hash", json_string(hx));
    if (h1 != h2) {
        snprintf(hx, sizeof hx, "%016llx", (unsigned long long)h2);
        json_object_set_new(j, "hash_again", json_string(hx));
    }
    return j;
}

/* Blocks kept by a block mask (partial and full, counted over the problem's B x H heads even
 * where the mask broadcasts) and the forward's FLOPs on them: QK^T and PV, 4 x rows x cols x E
 * per block (the last block of a row or column may be short). */
static void cb_flex_count(const ct_block_mask *m, const cb_flex_shape *s, int64_t *partial, int64_t *full,
                          int64_t *flops)
{
    int64_t rows = m->B * m->H * m->num_q_blocks, rep = (s->B / m->B) * (s->H / m->H), bs = m->block_size;
    int64_t f = 0;
    for (int64_t r = 0; r < rows; r++) {
        int64_t qb = r % m->num_q_blocks, nr = s->L - qb * bs < bs ? s->L - qb * bs : bs;
        for (int k = 0; k < 2; k++) {
            const int64_t *p = k ? m->full_kv_ptr : m->kv_ptr;
            const int32_t *ix = k ? m->full_kv_idx : m->kv_idx;
            for (int64_t e = p[r]; e < p[r + 1]; e++) {
                int64_t nc = s->L - ix[e] * bs < bs ? s->L - ix[e] * bs : bs;
                f += 4 * nr * nc * s->E;
            }
        }
    }
    *partial = m->kv_ptr[rows] * rep;
    *full = m->full_kv_ptr[rows] * rep;
    *flops = f * rep;
}

static json_t *cb_flex_case(ct_device *d, const cb_flex_shape *s, double gemm_tflops, int warm, int repeats)
{
    json_t *j = json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:s}", "case", s->name, "B", (json_int_t)s->B, "H",
                          (json_int_t)s->H, "L", (json_int_t)s->L, "E", (json_int_t)s->E, "window",
                          (json_int_t)s->window, "block_size", (json_int_t)s->bs, "dtype", "bf16");
    char what[96];
    if (s->window) snprintf(what, sizeof what, "causal sliding window: 0 <= q - kv <= %lld", (long long)s->window);
    else snprintf(what, sizeof what, "causal: kv <= q");
    json_object_set_new(j, "mask", json_string(what));
    /* pairs kept (every query keeps min(q, W) + 1 keys; causal q + 1) and their FLOPs */
    int64_t pairs = 0;
    for (int64_t q = 0; q < s->L; q++) pairs += (s->window && q > s->window ? s->window : q) + 1;
    pairs *= s->B * s->H;
    json_object_set_new(j, "kept_pairs", json_integer((json_int_t)pairs));
    json_object_set_new(j, "kept_pair_flops_fwd", json_integer((json_int_t)(4 * s->E * pairs)));

    size_t nq = (size_t)(s->B * s->L * s->H * s->E), nl = (size_t)(s->B * s->H * s->L);
    ct_memory_stats_t m0;
    ct_device_sync(d);
    ct_device_memory_stats(d, &m0);
    ct_mask_mod mm = {0};
    ct_block_mask *bm = NULL;
    ct_dev_block_mask dbm = {0};
    cb_flex c;
    memset(&c, 0, sizeof c);
    double t0 = bench_now();
    ct_status st = s->window ? ct_mask_mod_sliding_window(s->window, true, &mm) : ct_mask_mod_causal(&mm);
    if (st == CT_OK) st = ct_block_mask_create(&mm, s->B, s->H, s->L, s->L, s->bs, &bm);
    double t1 = bench_now();
    if (st == CT_OK) st = ct_dev_block_mask_upload(d, bm, &dbm);
    if (st == CT_OK) st = ct_device_sync(d);
    double t2 = bench_now();
    int64_t fwd_flops = 0;
    if (st == CT_OK) {
        int64_t partial = 0, full = 0;
        cb_flex_count(bm, s, &partial, &full, &fwd_flops);
        json_object_set_new(j, "block_mask",
                            json_pack("{s:f, s:f, s:I, s:I, s:I, s:I}", "build_s", t1 - t0, "upload_s", t2 - t1,
                                      "device_bytes", (json_int_t)dbm.bytes, "partial_blocks", (json_int_t)partial,
                                      "full_blocks", (json_int_t)full, "blocks",
                                      (json_int_t)(s->B * s->H * bm->num_q_blocks * bm->num_kv_blocks)));
        json_object_set_new(j, "kept_block_flops_fwd", json_integer((json_int_t)fwd_flops));
        json_object_set_new(j, "kept_block_flops_fwd_bwd", json_integer((json_int_t)(fwd_flops / 2 * 7)));
    }
    void *q = NULL, *k = NULL, *v = NULL, *o = NULL, *dout = NULL, *dq = NULL, *dk = NULL, *dv = NULL;
    float *lse = NULL;
    if (st == CT_OK) st = cb_upload(d, nq, CT_DTYPE_BF16, 21, 1.0f, &q);
    if (st == CT_OK) st = cb_upload(d, nq, CT_DTYPE_BF16, 22, 1.0f, &k);
    if (st == CT_OK) st = cb_upload(d, nq, CT_DTYPE_BF16, 23, 1.0f, &v);
    if (st == CT_OK) st = cb_upload(d, nq, CT_DTYPE_BF16, 24, 1.0f, &dout);
    if (st == CT_OK) st = ct_dev_alloc(d, nq * 2, "flex out", &o);
    if (st == CT_OK) st = ct_dev_alloc(d, nl * 4, "flex lse", (void **)&lse);
    if (st == CT_OK) st = ct_dev_alloc(d, nq * 2, "flex dq", &dq);
    if (st == CT_OK) st = ct_dev_alloc(d, nq * 2, "flex dk", &dk);
    if (st == CT_OK) st = ct_dev_alloc(d, nq * 2, "flex dv", &dv);
    if (st == CT_OK) {
        c.fa.attn = (ct_attn_args){s->B, s->L, s->H, s->H, s->E, 1.0f / sqrtf((float)s->E), q, k, v, o, lse, NULL,
                                   CT_DTYPE_BF16};
        c.fa.block_mask = &dbm;
        c.fa.mods.mask = CT_FLEX_MASK_CAUSAL | (s->window ? CT_FLEX_MASK_WINDOW : 0u);
        c.fa.mods.window = s->window;
        c.fa.mods.score = CT_FLEX_SCORE_NONE;
        c.g = (ct_attn_grads){dout, dq, dk, dv};
        json_object_set_new(j, "ctorch_flex", cb_flex_method(d, &c, m0.current_bytes, nq, nl, (double)fwd_flops,
                                                             gemm_tflops, warm, repeats));
        if (!s->window) {
            c.sdpa = true;
            json_object_set_new(j, "ctorch_sdpa_causal", cb_flex_method(d, &c, m0.current_bytes, nq, nl,
                                                                        (double)fwd_flops, gemm_tflops, warm, repeats));
        }
    } else {
        json_object_set_new(j, "error", json_string(ct_last_error()));
    }
    ct_dev_free(d, q, nq * 2);
    ct_dev_free(d, k, nq * 2);
    ct_dev_free(d, v, nq * 2);
    ct_dev_free(d, dout, nq * 2);
    ct_dev_free(d, o, nq * 2);
    ct_dev_free(d, lse, nl * 4);
    ct_dev_free(d, dq, nq * 2);
    ct_dev_free(d, dk, nq * 2);
    ct_dev_free(d, dv, nq * 2);
    ct_dev_block_mask_free(d, &dbm);
    ct_block_mask_free(bm);
    ct_mask_mod_free(&mm);
    return j;
}

/* The flex section: the reference bf16 GEMM, then every shape of this size. */
static json_t *cb_flex_section(ct_device *d, int size, int warm, int repeats)
{
    json_t *f = json_object();
    json_t *g = cb_gemm_case(d, size == CB_SIZE_TINY ? &cb_flex_gemm_tiny : &cb_flex_gemm, CT_DTYPE_BF16, repeats);
    double gt = json_real_value(json_object_get(g, "tflops"));
    json_object_set_new(f, "gemm_bf16", g);
    json_object_set_new(f, "flops_counts",
                        json_string("kept_block_flops_fwd: 4 x rows x cols x E per kept (partial or full) block "
                                    "(QK^T and PV over whole blocks); fwd_bwd: 3.5 x that (the backward's five "
                                    "products: QK^T again, dP, dV, dQ, dK); kept_pair_flops_fwd: 4 x E per pair "
                                    "the mask keeps"));
    json_object_set_new(f, "peak_counts",
                        json_string("ctorch: device buffers through ct_dev_alloc and the backend's scratch from "
                                    "before the inputs were allocated (block mask, q, k, v, dout, out, lse, dq, "
                                    "dk, dv, scratch); PyTorch: torch.cuda.max_memory_allocated from before its "
                                    "inputs were allocated (block mask or boolean mask, q, k, v, dout, then what "
                                    "the call allocates)"));
    json_object_set_new(f, "bitwise_check",
                        json_string("after the timed runs: the bytes of out, lse, dq, dk, dv (64-bit FNV-1a) of "
                                    "the last forward + backward and of one more, equal"));
    json_t *rows = json_array();
    for (int i = 0; i < CB_NFLEX; i++)
        if (cb_flex_shapes[i].size == size)
            json_array_append_new(rows, cb_flex_case(d, &cb_flex_shapes[i], gt, warm, repeats));
    json_object_set_new(f, "rows", rows);
    return f;
}

/* PyTorch's flex rows (bench/torch_cuda.py "flex", in the order of the specs) merged into
 * ctorch's rows: "torch" per row, ratios PyTorch time over ctorch time (> 1: ctorch faster),
 * and the goals. */
static double cb_med(json_t *method, const char *pass)
{
    return json_real_value(json_object_get(json_object_get(method, pass), "median_s"));
}

static void cb_flex_merge(json_t *flex, json_t *torch)
{
    size_t i;
    json_t *row;
    json_t *trows = json_object_get(torch, "flex");
    const char *ts = json_string_value(json_object_get(torch, "status"));
    json_array_foreach(json_object_get(flex, "rows"), i, row) {
        json_t *t = json_array_get(trows, i);
        if (t && (json_object_get(t, "error") ||
                  json_integer_value(json_object_get(t, "L")) == json_integer_value(json_object_get(row, "L"))))
            json_object_set(row, "torch", t); /* its figures, or the error of the whole row */
        else {
            const char *why = json_string_value(json_object_get(torch, "reason"));
            if (!why) why = json_string_value(json_object_get(torch, "why"));
            char msg[600];
            snprintf(msg, sizeof msg, "%s%s%s", ts ? ts : "no result", why ? ": " : "", why ? why : "");
            json_object_set_new(row, "torch", json_pack("{s:s}", "status", msg));
        }
        /* ratios: PyTorch's median over ctorch's, per (ctorch method, torch method, pass) */
        json_t *ratios = json_object();
        static const char *const ours[2] = {"ctorch_flex", "ctorch_sdpa_causal"};
        static const char *const theirs[3] = {"flex_compiled", "sdpa_bool_mask", "sdpa_causal_flash"};
        static const char *const passes[3][2] = {
            {"fwd", "fwd"}, {"fwd_bwd", "fwd_bwd"}, {"fwd_bwd", "fwd_bwd_deterministic"}};
        for (int a = 0; a < 2; a++) {
            json_t *me = json_object_get(row, ours[a]);
            if (!me) continue;
            json_t *ra = json_object();
            for (int b = 0; b < 3; b++) {
                json_t *th = json_object_get(json_object_get(row, "torch"), theirs[b]);
                for (int p = 0; p < 3; p++) {
                    double x = cb_med(me, passes[p][0]), y = cb_med(th, passes[p][1]);
                    if (x > 0 && y > 0) {
                        char key[96];
                        snprintf(key, sizeof key, "%s_%s", theirs[b], passes[p][1]);
                        json_object_set_new(ra, key, json_real(y / x));
                    }
                }
            }
            json_object_set_new(ratios, ours[a], ra);
        }
        json_object_set_new(row, "torch_over_ctorch", ratios);
        /* PyTorch's flex visits the same kept blocks: its rate on them too */
        json_t *tf = json_object_get(json_object_get(row, "torch"), "flex_compiled");
        double fl = (double)json_integer_value(json_object_get(row, "kept_block_flops_fwd")), tm = cb_med(tf, "fwd");
        double gt = json_real_value(json_object_get(json_object_get(flex, "gemm_bf16"), "tflops"));
        if (fl > 0 && tm > 0) {
            json_object_set_new(tf, "fwd_kept_block_tflops", json_real(fl / tm / 1e12));
            if (gt > 0) json_object_set_new(tf, "fwd_vs_gemm_bf16", json_real(fl / tm / 1e12 / gt));
        }
    }
}

static void cb_flex_goals(json_t *flex)
{
    size_t i;
    json_t *row;
    json_array_foreach(json_object_get(flex, "rows"), i, row) {
        const cb_flex_shape *s = NULL;
        for (int k = 0; k < CB_NFLEX; k++)
            if (cb_flex_shapes[k].L == json_integer_value(json_object_get(row, "L")) &&
                cb_flex_shapes[k].window == json_integer_value(json_object_get(row, "window")) &&
                cb_flex_shapes[k].E == json_integer_value(json_object_get(row, "E")))
                s = &cb_flex_shapes[k];
        if (!s || (!s->goal_fwd_ms && !s->goal_gemm_ratio)) continue;
        json_t *me = json_object_get(row, "ctorch_flex"), *g = json_object();
        double f = cb_med(me, "fwd"), b = cb_med(me, "fwd_bwd");
        if (s->goal_fwd_ms) {
            json_object_set_new(g, "fwd_ms_max", json_real(s->goal_fwd_ms));
            json_object_set_new(g, "fwd_bwd_ms_max", json_real(s->goal_fwd_bwd_ms));
            json_object_set_new(g, "pytorch_2_11_flex_ms", json_pack("{s:f, s:f}", "fwd", s->ref_fwd_ms, "fwd_bwd",
                                                                     s->ref_fwd_bwd_ms));
            if (f > 0) json_object_set_new(g, "fwd_met", json_boolean(1e3 * f <= s->goal_fwd_ms));
            if (b > 0) json_object_set_new(g, "fwd_bwd_met", json_boolean(1e3 * b <= s->goal_fwd_bwd_ms));
        }
        if (s->goal_gemm_ratio) {
            json_object_set_new(g, "fwd_vs_gemm_bf16_min", json_real(s->goal_gemm_ratio));
            json_t *r = json_object_get(me, "fwd_vs_gemm_bf16");
            if (r) json_object_set_new(g, "fwd_vs_gemm_met", json_boolean(json_real_value(r) >= s->goal_gemm_ratio));
        }
        json_object_set_new(row, "goals", g);
    }
}

/* ---- output -------------------------------------------------------------------------------- */

/* One "tokens/s  peak MiB" cell: the figures, or "failed" / "-" (not run). */
static void cb_print_cell(json_t *g, const char *tok_key, const char *peak_key)
{
    if (!g) {
        printf(" %14s %9s", "-", "-");
    } else if (json_object_get(g, "error")) {
        printf(" %14s %9s", "failed", "");
    } else {
        printf(" %14.0f %9.0f", json_real_value(json_object_get(g, tok_key)),
               (double)json_integer_value(json_object_get(g, peak_key)) / 1048576.0);
    }
}

static void cb_print_train(json_t *t)
{
    printf("\nTraining step (%s; %d warm-up steps, then the median of %d, each synced), beside PyTorch "
           "(bench/torch_cuda.py: bench/torch_train.py's SdpaGPT from the same weights, SDPA is_causal, "
           "AdamW(fused=True), clip 1; bf16: torch.autocast):\n",
           json_string_value(json_object_get(t, "step")), (int)json_integer_value(json_object_get(t, "warmup_steps")),
           (int)json_integer_value(json_object_get(t, "repeats")));
    printf("  %-10s %3s %5s %-5s %14s %9s %14s %9s %14s %9s %8s %10s\n", "model", "B", "T", "dtype", "ctorch tok/s",
           "peak MiB", "eager tok/s", "peak MiB", "compiled tok/s", "peak MiB", "x eager", "x compiled");
    size_t i;
    json_t *row;
    json_array_foreach(json_object_get(t, "rows"), i, row) {
        printf("  %-10s %3lld %5lld %-5s", json_string_value(json_object_get(row, "model")),
               (long long)json_integer_value(json_object_get(row, "batch")),
               (long long)json_integer_value(json_object_get(row, "seq")), json_string_value(json_object_get(row, "dtype")));
        cb_print_cell(json_object_get(row, "ctorch"), "tokens_per_s", "peak_bytes");
        cb_print_cell(json_object_get(row, "torch_eager"), "tokens_per_s", "max_memory_allocated");
        cb_print_cell(json_object_get(row, "torch_compiled"), "tokens_per_s", "max_memory_allocated");
        json_t *re = json_object_get(row, "ctorch_vs_eager"), *rc = json_object_get(row, "ctorch_vs_compiled");
        if (re) printf(" %8.2f", json_real_value(re));
        else printf(" %8s", "-");
        if (rc) printf(" %10.2f\n", json_real_value(rc));
        else printf(" %10s\n", "-");
    }
    json_array_foreach(json_object_get(t, "rows"), i, row) {
        static const char *const who[3] = {"ctorch", "torch_eager", "torch_compiled"};
        for (int k = 0; k < 3; k++) {
            json_t *e = json_object_get(json_object_get(row, who[k]), "error");
            if (e)
                printf("  %s B=%lld %s %s failed: %s\n", json_string_value(json_object_get(row, "model")),
                       (long long)json_integer_value(json_object_get(row, "batch")),
                       json_string_value(json_object_get(row, "dtype")), who[k], json_string_value(e));
        }
    }
    printf("  (x eager / x compiled: ctorch tokens/s over PyTorch's, > 1 is ctorch faster; peak: %s)\n",
           json_string_value(json_object_get(t, "peak_counts")));
}

/* One line of the flex table: a method's forward and forward + backward. */
static void cb_print_flex_method(const char *who, json_t *m, bool ours)
{
    printf("    %-28s", who);
    if (!m) {
        printf(" not run\n");
        return;
    }
    json_t *e = json_object_get(m, "error");
    if (e) {
        printf(" failed: %s\n", json_string_value(e));
        return;
    }
    static const char *const passes[3] = {"fwd", "fwd_bwd", "fwd_bwd_deterministic"};
    for (int p = 0; p < 3; p++) {
        json_t *x = json_object_get(m, passes[p]);
        if (ours && p == 2) x = NULL; /* ctorch's backward is always deterministic: one column */
        if (!x) printf(" %11s", "-");
        else if (json_object_get(x, "error")) printf(" %11s", "failed");
        else printf(" %11.3f", 1e3 * json_real_value(json_object_get(x, "median_s")));
    }
    json_t *f = json_object_get(m, "fwd"), *b = json_object_get(m, "fwd_bwd");
    json_t *tf = json_object_get(m, "fwd_kept_block_tflops");
    if (tf) printf(" %8.2f", json_real_value(tf));
    else printf(" %8s", "-");
    json_t *r = json_object_get(m, "fwd_vs_gemm_bf16");
    if (r) printf(" %7.3f", json_real_value(r));
    else printf(" %7s", "-");
    json_t *pk = json_object_get(b && !json_object_get(b, "error") ? b : f, "peak_bytes");
    if (pk) printf(" %9.1f", (double)json_integer_value(pk) / 1048576.0);
    else printf(" %9s", "-");
    printf("\n");
    for (int p = 0; p < 3; p++) {
        json_t *x = json_object_get(m, passes[p]), *xe = json_object_get(x, "error");
        if (xe) printf("      %s failed: %s\n", passes[p], json_string_value(xe));
    }
}

static void cb_print_flex(json_t *f)
{
    json_t *g = json_object_get(f, "gemm_bf16");
    printf("\nFlexAttention bf16, q / k / v [B, L, H, E], block mask built on the host and uploaded once "
           "(median of %d, synced); bf16 GEMM %s: ",
           (int)json_integer_value(json_object_get(json_object_get(g, "time"), "repeats")),
           json_string_value(json_object_get(g, "case")));
    if (json_object_get(g, "error")) printf("failed: %s\n", json_string_value(json_object_get(g, "error")));
    else printf("%.1f TFLOP/s\n", json_real_value(json_object_get(g, "tflops")));
    size_t i;
    json_t *row;
    json_array_foreach(json_object_get(f, "rows"), i, row) {
        json_t *bm = json_object_get(row, "block_mask");
        printf("  %s: B=%lld H=%lld L=%lld E=%lld, block %lld", json_string_value(json_object_get(row, "case")),
               (long long)json_integer_value(json_object_get(row, "B")),
               (long long)json_integer_value(json_object_get(row, "H")),
               (long long)json_integer_value(json_object_get(row, "L")),
               (long long)json_integer_value(json_object_get(row, "E")),
               (long long)json_integer_value(json_object_get(row, "block_size")));
        if (bm)
            printf(": %lld of %lld blocks kept (%lld full), %.2f GFLOP forward on them (%.2f on kept pairs); mask "
                   "built in %.1f ms, %.1f KiB on the device\n",
                   (long long)(json_integer_value(json_object_get(bm, "partial_blocks")) +
                               json_integer_value(json_object_get(bm, "full_blocks"))),
                   (long long)json_integer_value(json_object_get(bm, "blocks")),
                   (long long)json_integer_value(json_object_get(bm, "full_blocks")),
                   1e-9 * (double)json_integer_value(json_object_get(row, "kept_block_flops_fwd")),
                   1e-9 * (double)json_integer_value(json_object_get(row, "kept_pair_flops_fwd")),
                   1e3 * json_real_value(json_object_get(bm, "build_s")),
                   (double)json_integer_value(json_object_get(bm, "device_bytes")) / 1024.0);
        else printf("\n");
        if (json_object_get(row, "error")) printf("    failed: %s\n", json_string_value(json_object_get(row, "error")));
        printf("    %-28s %11s %11s %11s %8s %7s %9s\n", "", "fwd ms", "fwd+bwd ms", "(det.) ms", "TFLOP/s",
               "x GEMM", "peak MiB");
        cb_print_flex_method("ctorch flex", json_object_get(row, "ctorch_flex"), true);
        if (json_object_get(row, "ctorch_sdpa_causal"))
            cb_print_flex_method("ctorch sdpa causal", json_object_get(row, "ctorch_sdpa_causal"), true);
        json_t *t = json_object_get(row, "torch");
        if (json_object_get(t, "flex_compiled")) {
            cb_print_flex_method("torch flex (compiled)", json_object_get(t, "flex_compiled"), false);
            cb_print_flex_method("torch sdpa bool mask", json_object_get(t, "sdpa_bool_mask"), false);
            cb_print_flex_method(json_integer_value(json_object_get(row, "window")) ? "torch sdpa causal flash (*)"
                                                                                    : "torch sdpa causal flash",
                                 json_object_get(t, "sdpa_causal_flash"), false);
        } else if (json_object_get(t, "error")) {
            printf("    PyTorch failed: %s\n", json_string_value(json_object_get(t, "error")));
        } else {
            printf("    PyTorch: %s\n", json_string_value(json_object_get(t, "status")));
        }
        json_t *me = json_object_get(row, "ctorch_flex");
        json_t *ro = json_object_get(json_object_get(row, "torch_over_ctorch"), "ctorch_flex");
        if (json_object_get(ro, "flex_compiled_fwd") || json_object_get(ro, "flex_compiled_fwd_bwd")) {
            static const char *const keys[3] = {"flex_compiled_fwd", "flex_compiled_fwd_bwd",
                                                "flex_compiled_fwd_bwd_deterministic"};
            printf("    PyTorch flex time over ctorch flex time (> 1: ctorch faster):");
            static const char *const names[3] = {"fwd", "fwd+bwd", "fwd+bwd deterministic"};
            for (int k = 0; k < 3; k++) {
                json_t *x = json_object_get(ro, keys[k]);
                if (x) printf(" %s %.2f%s", names[k], json_real_value(x), k < 2 ? "," : "");
                else printf(" %s -%s", names[k], k < 2 ? "," : "");
            }
            printf("\n");
        }
        if (json_object_get(me, "bitwise_repeatable"))
            printf("    ctorch flex forward + backward run twice: %s (%s)\n",
                   json_is_true(json_object_get(me, "bitwise_repeatable")) ? "identical bytes" : "BYTES DIFFER",
                   json_string_value(json_object_get(me, "hash")));
        json_t *sd = json_object_get(row, "ctorch_sdpa_causal");
        if (json_object_get(sd, "bitwise_repeatable"))
            printf("    ctorch sdpa forward + backward run twice: %s\n",
                   json_is_true(json_object_get(sd, "bitwise_repeatable")) ? "identical bytes" : "BYTES DIFFER");
        json_t *go = json_object_get(row, "goals");
        if (json_object_get(go, "fwd_ms_max")) {
            json_t *pt = json_object_get(go, "pytorch_2_11_flex_ms");
            printf("    goals: forward <= %.2f ms: %s, forward + backward <= %.2f ms: %s (PyTorch 2.11 Triton flex "
                   "%.2f / %.2f ms)\n",
                   json_real_value(json_object_get(go, "fwd_ms_max")),
                   !json_object_get(go, "fwd_met") ? "no figure" : json_is_true(json_object_get(go, "fwd_met")) ? "met" : "missed",
                   json_real_value(json_object_get(go, "fwd_bwd_ms_max")),
                   !json_object_get(go, "fwd_bwd_met") ? "no figure"
                   : json_is_true(json_object_get(go, "fwd_bwd_met")) ? "met" : "missed",
                   json_real_value(json_object_get(pt, "fwd")), json_real_value(json_object_get(pt, "fwd_bwd")));
        }
        if (json_object_get(go, "fwd_vs_gemm_bf16_min"))
            printf("    goal: forward on kept blocks >= %.0f%% of the bf16 GEMM rate: %s\n",
                   100 * json_real_value(json_object_get(go, "fwd_vs_gemm_bf16_min")),
                   !json_object_get(go, "fwd_vs_gemm_met") ? "no figure"
                   : json_is_true(json_object_get(go, "fwd_vs_gemm_met")) ? "met" : "missed");
    }
    printf("  (TFLOP/s: the forward's FLOPs on kept blocks over its time; x GEMM: that over the bf16 GEMM rate "
           "above; (det.): PyTorch's backward with torch.use_deterministic_algorithms(True), ctorch's backward is "
           "always deterministic; (*): causal, not the window: a reference; peak: the forward + backward's, %s)\n",
           json_string_value(json_object_get(f, "peak_counts")));
}

static void cb_print_text(json_t *r)
{
    printf("ctorch bench cuda: %s\n%s\n", json_string_value(json_object_get(r, "device")),
           json_string_value(json_object_get(r, "backend")));
    size_t i;
    json_t *g;
    if (json_object_get(r, "gemm")) {
    printf("\nGEMM (median of %d after warm-up, synced):\n", (int)json_integer_value(json_object_get(r, "repeats")));
    printf("  %-20s %-5s %6s %6s %6s %10s %9s\n", "case", "dtype", "M", "N", "K", "ms", "TFLOP/s");
    json_array_foreach(json_object_get(r, "gemm"), i, g) {
        json_t *e = json_object_get(g, "error");
        printf("  %-20s %-5s %6lld %6lld %6lld ", json_string_value(json_object_get(g, "case")),
               json_string_value(json_object_get(g, "dtype")), (long long)json_integer_value(json_object_get(g, "m")),
               (long long)json_integer_value(json_object_get(g, "n")), (long long)json_integer_value(json_object_get(g, "k")));
        if (e) printf("failed: %s\n", json_string_value(e));
        else
            printf("%10.3f %9.1f\n", 1e3 * json_real_value(json_object_get(json_object_get(g, "time"), "median_s")),
                   json_real_value(json_object_get(g, "tflops")));
    }
    }
    json_t *l = json_object_get(r, "loss");
    if (l) {
    printf("\nFused loss N=%lld D=%lld V=%lld bf16, forward + backward:\n", (long long)json_integer_value(json_object_get(l, "N")),
           (long long)json_integer_value(json_object_get(l, "D")), (long long)json_integer_value(json_object_get(l, "V")));
    if (json_object_get(l, "error")) printf("  failed: %s\n", json_string_value(json_object_get(l, "error")));
    json_array_foreach(json_object_get(l, "cases"), i, g) {
        json_t *e = json_object_get(g, "error");
        if (e) printf("  %-16s failed: %s\n", json_string_value(json_object_get(g, "case")), json_string_value(e));
        else
            printf("  %-16s %9.2f ms  %9.1f MiB above inputs\n", json_string_value(json_object_get(g, "case")),
                   1e3 * json_real_value(json_object_get(json_object_get(g, "time"), "median_s")),
                   (double)json_integer_value(json_object_get(g, "peak_above_inputs_bytes")) / 1048576.0);
    }
    printf("  (peak: %s)\n", json_string_value(json_object_get(l, "peak_counts")));
    }
    json_t *t = json_object_get(r, "torch");
    const char *ts = json_string_value(json_object_get(t, "status"));
    printf("\nPyTorch on the same GPU (bench/torch_cuda.py): ");
    if (!ts || strcmp(ts, "ok") != 0) {
        const char *why = json_string_value(json_object_get(t, "reason"));
        if (!why) why = json_string_value(json_object_get(t, "why"));
        printf("%s%s%s\n", ts ? ts : "no result", why ? ": " : "", why ? why : "");
    } else {
        printf("torch %s on %s\n", json_string_value(json_object_get(t, "torch_version")),
               json_string_value(json_object_get(t, "device")));
        json_array_foreach(json_object_get(t, "gemm"), i, g) {
            json_t *e = json_object_get(g, "error");
            printf("  %-20s %-5s ", json_string_value(json_object_get(g, "case")), json_string_value(json_object_get(g, "dtype")));
            if (e) printf("failed: %s\n", json_string_value(e));
            else
                printf("%10.3f ms %9.1f TFLOP/s\n", 1e3 * json_real_value(json_object_get(g, "median_s")),
                       json_real_value(json_object_get(g, "tflops")));
        }
        json_array_foreach(json_object_get(t, "loss"), i, g) {
            json_t *e = json_object_get(g, "error");
            printf("  loss %-15s ", json_string_value(json_object_get(g, "case")));
            if (e) printf("failed: %s\n", json_string_value(e));
            else
                printf("%9.2f ms  %9.1f MiB above inputs\n", 1e3 * json_real_value(json_object_get(g, "median_s")),
                       (double)json_integer_value(json_object_get(g, "peak_above_inputs_bytes")) / 1048576.0);
        }
    }
    if (json_object_get(r, "train_step")) cb_print_train(json_object_get(r, "train_step"));
    if (json_object_get(r, "flex")) cb_print_flex(json_object_get(r, "flex"));
}

static void cb_usage(FILE *f)
{
    fprintf(f, "usage: ctorch bench cuda [--device cuda:N] [--quick | --tiny] [--only LIST] [--json] [--repeats R]\n"
               "  GEMM (f32, bf16) and the fused loss vs unfused on a GPU, beside PyTorch on the same GPU.\n"
               "  Training steps: ct_trainer on the GPU (ctorch train's default model B=8, and GPT-2-124M's\n"
               "  shape at T=1024, B=4, 8, 16), f32 and bf16, tokens/s and device peak, beside PyTorch eager\n"
               "  and torch.compile (bench/torch_cuda.py) from the same initial weights.\n"
               "  FlexAttention (bf16): the flex slots over a block mask uploaded once, causal sliding window\n"
               "  256 at B=1 H=16 L=32768 E=64 and causal at L=8192 E=128 (ctorch's dense causal sdpa too),\n"
               "  forward and forward + backward, the backward twice compared bit for bit, beside PyTorch's\n"
               "  torch.compile(flex_attention) with the same block mask, SDPA with a boolean mask and causal\n"
               "  flash SDPA (deterministic algorithms off and on for the backward), and the forward's rate\n"
               "  on kept blocks against the bf16 GEMM's.\n"
               "  --quick: the 4096^3 GEMM and three step shapes, the loss at N=1024, the training steps at\n"
               "  the default model and GPT-2 B=4 (torch.compile at GPT-2 bf16 only), flex at L=8192 / 2048.\n"
               "  --tiny: small shapes everywhere (a tiny model, flex at L=256 / 192): for the emulated\n"
               "  device (CTORCH_CUDA_LIB=libctorch_cuda_emu.so); its figures are no GPU's.\n"
               "  --only LIST: the sections named (comma-separated: gemm, loss, train, flex).\n"
               "  Without a GPU: prints SKIPPED with the reason and exits 0.\n");
}

enum { CB_SEC_GEMM = 1, CB_SEC_LOSS = 2, CB_SEC_TRAIN = 4, CB_SEC_FLEX = 8, CB_SEC_ALL = 15 };

/* --only's comma-separated section names; false (and a message) for an unknown one. */
static bool cb_sections(const char *v, unsigned *out)
{
    static const char *const names[4] = {"gemm", "loss", "train", "flex"};
    *out = 0;
    const char *p = v;
    while (*p) {
        size_t n = strcspn(p, ",");
        int k = 0;
        while (k < 4 && !(strlen(names[k]) == n && !strncmp(p, names[k], n))) k++;
        if (k == 4) {
            fprintf(stderr, "ctorch bench cuda: --only '%s': '%.*s' is not a section (gemm, loss, train, flex)\n", v,
                    (int)n, p);
            return false;
        }
        *out |= 1u << k;
        p += n + (p[n] == ',');
    }
    if (!*out) fprintf(stderr, "ctorch bench cuda: --only needs a section (gemm, loss, train, flex)\n");
    return *out != 0;
}

int bench_cuda(bench_ctx *b, int argc, char **argv)
{
    const char *dev_name = "cuda:0";
    bool quick = false, tiny = false;
    unsigned sec = CB_SEC_ALL;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--quick")) quick = true;
        else if (!strcmp(argv[i], "--tiny")) tiny = true;
        else if (cli_opt(argc, argv, &i, "--device", &v)) dev_name = v;
        else if (cli_opt(argc, argv, &i, "--only", &v)) {
            if (!cb_sections(v, &sec)) return 2;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            cb_usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "ctorch bench cuda: unknown option '%s'\n", argv[i]);
            cb_usage(stderr);
            return 2;
        }
    }
    if (quick && tiny) {
        fprintf(stderr, "ctorch bench cuda: --quick and --tiny exclude each other\n");
        return 2;
    }
    int size = tiny ? CB_SIZE_TINY : quick ? CB_SIZE_QUICK : CB_SIZE_FULL;
    ct_device_options o = ct_device_options_default();
    ct_status s = ct_device_parse(dev_name, &o);
    if (s == CT_OK && o.kind != CT_DEVICE_CUDA) s = ct_error(CT_EINVAL, "--device must name a GPU (cuda or cuda:N)");
    if (s != CT_OK) return cli_fail("bench cuda: --device", s);
    ct_device *d = NULL;
    if ((s = ct_device_open(&o, &d)) != CT_OK) {
        const char *why = ct_last_error();
        if (b->json) {
            json_t *j = json_pack("{s:s, s:s, s:s, s:s}", "bench", "cuda", "status", "skipped", "reason", why,
                                  "backend", ct_cuda_describe());
            bench_print_json(j);
            json_decref(j);
        } else {
            printf("ctorch bench cuda: SKIPPED: %s\n", why);
        }
        return 0;
    }
    /* --tiny: the repeats asked for (3 by default; the emulated device is slow), else >= 10 */
    int repeats = tiny ? b->repeats : b->repeats < CUDA_REPEATS_MIN ? CUDA_REPEATS_MIN : b->repeats;
    int dev_index = ct_device_index(d);
    json_t *r = json_pack("{s:s, s:s, s:s, s:s, s:b, s:b, s:i}", "bench", "cuda", "status", "ok", "device",
                          ct_device_describe(d), "backend", ct_cuda_describe(), "quick", (int)quick, "tiny", (int)tiny,
                          "repeats", repeats);
    if (sec & CB_SEC_GEMM) {
        json_t *gemm = json_array();
        const cb_gemm_shape *shapes = tiny ? cb_tiny_shapes : cb_shapes;
        int nshapes = tiny ? (int)(sizeof cb_tiny_shapes / sizeof cb_tiny_shapes[0])
                      : quick ? 4
                              : (int)(sizeof cb_shapes / sizeof cb_shapes[0]);
        for (int i = 0; i < nshapes; i++)
            for (int dt = 0; dt < 2; dt++)
                json_array_append_new(gemm, cb_gemm_case(d, &shapes[i], dt ? CT_DTYPE_BF16 : CT_DTYPE_F32, repeats));
        json_object_set_new(r, "gemm", gemm);
    }
    int64_t N = tiny ? 64 : quick ? 1024 : 8192, Dm = tiny ? 64 : 4096, V = tiny ? 1000 : 128256;
    if (sec & CB_SEC_LOSS) json_object_set_new(r, "loss", cb_loss(d, N, Dm, V, repeats));
    /* training steps: ctorch's rows now, PyTorch's after the device is closed (its pool freed) */
    json_t *rows = json_array();
    int ncases = (int)(sizeof cb_train_cases / sizeof cb_train_cases[0]);
    for (int c = 0; c < ncases && (sec & CB_SEC_TRAIN); c++) {
        if (!(cb_train_cases[c].sizes & CB_IN(size))) continue;
        ct_gpt_config cfg = cb_model(cb_train_cases[c].model);
        for (int dt = 0; dt < 2; dt++) {
            ct_dtype dtype = dt ? CT_DTYPE_BF16 : CT_DTYPE_F32;
            json_t *row = json_pack("{s:s, s:I, s:I, s:s}", "model", cb_model_names[cb_train_cases[c].model], "batch",
                                    (json_int_t)cb_train_cases[c].batch, "seq", (json_int_t)cfg.context, "dtype",
                                    ct_dtype_name(dtype));
            json_object_set_new(row, "ctorch", cb_train_ctorch(d, &cfg, cb_train_cases[c].batch, dtype, repeats));
            json_array_append_new(rows, row);
        }
    }
    if (sec & CB_SEC_TRAIN) {
        json_t *train = json_pack("{s:s, s:i, s:i}", "step",
                                  "ct_trainer on the GPU: forward, backward, clip 1, AdamW (one loss read-back); dense "
                                  "causal attention, no document mask; bf16: bf16 products, f32 master weights",
                                  "warmup_steps", CB_TRAIN_WARMUP, "repeats", repeats);
        json_object_set_new(train, "peak_counts",
                            json_string("ctorch: device buffers through ct_dev_alloc from before the trainer's "
                                        "creation (parameters, gradients, AdamW moments, activations, the backend's "
                                        "scratch and GEMM workspace); PyTorch: torch.cuda.max_memory_allocated from "
                                        "before the model moved to the GPU"));
        json_object_set(train, "rows", rows);
        json_object_set_new(r, "train_step", train);
    }
    json_t *flex = NULL;
    if (sec & CB_SEC_FLEX) {
        flex = cb_flex_section(d, size, tiny ? 1 : 2, repeats);
        json_object_set_new(r, "flex", flex);
    }
    s = ct_device_close(d);
    if (s != CT_OK) {
        json_decref(rows);
        json_decref(r);
        return cli_fail("bench cuda: closing the device", s);
    }

    /* PyTorch's side: the same initial weights (bench train's weights file of each model, the
     * parameters under ctorch's names, read by bench/torch_train.py's SdpaGPT) */
    char tmp[512];
    const char *td = getenv("TMPDIR");
    snprintf(tmp, sizeof tmp, "%s/ctorch-bench-cuda-XXXXXX", td && *td ? td : "/tmp");
    bool have_tmp = (sec & CB_SEC_TRAIN) && mkdtemp(tmp) != NULL;
    char wpath[CB_NMODELS][600];
    bool wrote[CB_NMODELS] = {false};
    char spec[16][700];
    int nspec = 0;
    for (int c = 0; c < ncases && have_tmp && nspec < 16; c++) {
        if (!(cb_train_cases[c].sizes & CB_IN(size))) continue;
        int m = cb_train_cases[c].model;
        if (!wrote[m]) {
            snprintf(wpath[m], sizeof wpath[m], "%s/%s.safetensors", tmp, cb_model_names[m]);
            bench_train_conf bc = {cb_model(m), 1};
            if (bench_train_write_weights(&bc, wpath[m]) != 0) continue;
            wrote[m] = true;
        }
        for (int dt = 0; dt < 2 && nspec < 16; dt++) {
            /* --quick: torch.compile at GPT-2's shape in bf16 only (each compilation takes ~a minute) */
            bool compiled = size == CB_SIZE_FULL || (m == CB_MODEL_GPT2 && dt == 1);
            snprintf(spec[nspec++], sizeof spec[0], "%s:%s:%lld:%s:%s", cb_model_names[m], wpath[m],
                     (long long)cb_train_cases[c].batch, dt ? "bf16" : "f32", compiled ? "eager+compiled" : "eager");
        }
    }
    /* flex: NAME:B:H:L:E:WINDOW:BLOCK per ctorch row, in its order */
    char fspec[CB_NFLEX][160];
    int nf = 0;
    for (int i = 0; i < CB_NFLEX && (sec & CB_SEC_FLEX); i++) {
        const cb_flex_shape *fs = &cb_flex_shapes[i];
        if (fs->size != size) continue;
        snprintf(fspec[nf++], sizeof fspec[0], "%s:%lld:%lld:%lld:%lld:%lld:%lld", fs->name, (long long)fs->B,
                 (long long)fs->H, (long long)fs->L, (long long)fs->E, (long long)fs->window, (long long)fs->bs);
    }
    char nbuf[32], rbuf[32], dbuf[32], dmb[32], vb[32], secb[64];
    snprintf(nbuf, sizeof nbuf, "%lld", (long long)N);
    snprintf(dmb, sizeof dmb, "%lld", (long long)Dm);
    snprintf(vb, sizeof vb, "%lld", (long long)V);
    snprintf(rbuf, sizeof rbuf, "%d", repeats);
    snprintf(dbuf, sizeof dbuf, "%d", dev_index);
    snprintf(secb, sizeof secb, "%s", (sec & CB_SEC_GEMM) && (sec & CB_SEC_LOSS) ? "gemm,loss"
                                      : (sec & CB_SEC_GEMM)                       ? "gemm"
                                      : (sec & CB_SEC_LOSS)                       ? "loss"
                                                                                  : "none");
    char *args[80];
    int na = 0;
    args[na++] = "--n";
    args[na++] = nbuf;
    args[na++] = "--loss-d";
    args[na++] = dmb;
    args[na++] = "--loss-v";
    args[na++] = vb;
    args[na++] = "--repeats";
    args[na++] = rbuf;
    args[na++] = "--device-index";
    args[na++] = dbuf;
    args[na++] = "--sections";
    args[na++] = secb;
    if (quick) args[na++] = "--quick";
    if (tiny) args[na++] = "--tiny";
    for (int k = 0; k < nspec; k++) {
        args[na++] = "--train";
        args[na++] = spec[k];
    }
    for (int k = 0; k < nf; k++) {
        args[na++] = "--flex";
        args[na++] = fspec[k];
    }
    args[na] = NULL;
    json_t *torch = bench_python("torch_cuda.py", args);
    cb_train_merge(rows, torch);
    if (flex) {
        cb_flex_merge(flex, torch);
        cb_flex_goals(flex);
        json_object_del(torch, "flex"); /* now in the rows */
    }
    json_object_set_new(r, "torch", torch);
    json_decref(rows);
    for (int m = 0; m < CB_NMODELS; m++)
        if (wrote[m]) unlink(wpath[m]);
    if (have_tmp) rmdir(tmp);

    if (b->json) bench_print_json(r);
    else cb_print_text(r);
    json_decref(r);
    return 0;
}

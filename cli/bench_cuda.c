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
} cb_lce;

static ct_status cb_fused_once(ct_device *d, void *arg)
{
    cb_lce *c = arg;
    ct_lce_inputs in = {.h = c->h, .weight = c->w, .bias = NULL, .dtype = CT_DTYPE_BF16, .target = c->tgt,
                        .target_dtype = CT_DTYPE_I32, .N = c->N, .D = c->Dm, .V = c->V};
    ct_ce_outputs out = {c->loss, NULL, c->lse};
    ct_lce_grads g = {c->dh, c->dw, NULL, false};
    ct_ce_options o = ct_ce_options_default();
    CT_DEV(d, lce, &out, &g, 1.0f, &in, &o);
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
        json_array_append_new(cases, cb_loss_case(d, "fused", cb_fused_once, &c, repeats));
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
enum { CB_MODEL_DEFAULT, CB_MODEL_GPT2, CB_NMODELS };
static const char *const cb_model_names[CB_NMODELS] = {"default", "gpt2-124M"};

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
    }
    return c;
}

typedef struct cb_train_case {
    int model;
    int64_t batch; /* sequences of the model's context T per step */
    bool quick;    /* in --quick too */
} cb_train_case;

static const cb_train_case cb_train_cases[] = {
    {CB_MODEL_DEFAULT, 8, true}, {CB_MODEL_GPT2, 4, true}, {CB_MODEL_GPT2, 8, false}, {CB_MODEL_GPT2, 16, false},
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

static void cb_print_text(json_t *r)
{
    printf("ctorch bench cuda: %s\n%s\n", json_string_value(json_object_get(r, "device")),
           json_string_value(json_object_get(r, "backend")));
    printf("\nGEMM (median of %d after warm-up, synced):\n", (int)json_integer_value(json_object_get(r, "repeats")));
    printf("  %-20s %-5s %6s %6s %6s %10s %9s\n", "case", "dtype", "M", "N", "K", "ms", "TFLOP/s");
    size_t i;
    json_t *g;
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
    json_t *l = json_object_get(r, "loss");
    printf("\nFused loss N=%lld D=%lld V=%lld bf16, forward + backward:\n", (long long)json_integer_value(json_object_get(l, "N")),
           (long long)json_integer_value(json_object_get(l, "D")), (long long)json_integer_value(json_object_get(l, "V")));
    if (json_object_get(l, "error")) printf("  failed: %s\n", json_string_value(json_object_get(l, "error")));
    json_array_foreach(json_object_get(l, "cases"), i, g) {
        json_t *e = json_object_get(g, "error");
        if (e) printf("  %-8s failed: %s\n", json_string_value(json_object_get(g, "case")), json_string_value(e));
        else
            printf("  %-8s %9.2f ms  %9.1f MiB above inputs\n", json_string_value(json_object_get(g, "case")),
                   1e3 * json_real_value(json_object_get(json_object_get(g, "time"), "median_s")),
                   (double)json_integer_value(json_object_get(g, "peak_above_inputs_bytes")) / 1048576.0);
    }
    printf("  (peak: %s)\n", json_string_value(json_object_get(l, "peak_counts")));
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
    cb_print_train(json_object_get(r, "train_step"));
}

static void cb_usage(FILE *f)
{
    fprintf(f, "usage: ctorch bench cuda [--device cuda:N] [--quick] [--json] [--repeats R]\n"
               "  GEMM (f32, bf16) and the fused loss vs unfused on a GPU, beside PyTorch on the same GPU.\n"
               "  Training steps: ct_trainer on the GPU (ctorch train's default model B=8, and GPT-2-124M's\n"
               "  shape at T=1024, B=4, 8, 16), f32 and bf16, tokens/s and device peak, beside PyTorch eager\n"
               "  and torch.compile (bench/torch_cuda.py) from the same initial weights.\n"
               "  --quick: the 4096^3 GEMM and three step shapes, the loss at N=1024, the training steps at\n"
               "  the default model and GPT-2 B=4 (torch.compile at GPT-2 bf16 only): under ~2 minutes.\n"
               "  Without a GPU: prints SKIPPED with the reason and exits 0.\n");
}

int bench_cuda(bench_ctx *b, int argc, char **argv)
{
    const char *dev_name = "cuda:0";
    bool quick = false;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--quick")) quick = true;
        else if (cli_opt(argc, argv, &i, "--device", &v)) dev_name = v;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            cb_usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "ctorch bench cuda: unknown option '%s'\n", argv[i]);
            cb_usage(stderr);
            return 2;
        }
    }
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
    int repeats = b->repeats < CUDA_REPEATS_MIN ? CUDA_REPEATS_MIN : b->repeats;
    int dev_index = ct_device_index(d);
    json_t *r = json_pack("{s:s, s:s, s:s, s:s, s:b, s:i}", "bench", "cuda", "status", "ok", "device",
                          ct_device_describe(d), "backend", ct_cuda_describe(), "quick", (int)quick, "repeats", repeats);
    json_t *gemm = json_array();
    int nshapes = (int)(sizeof cb_shapes / sizeof cb_shapes[0]);
    for (int i = 0; i < (quick ? 4 : nshapes); i++)
        for (int dt = 0; dt < 2; dt++)
            json_array_append_new(gemm, cb_gemm_case(d, &cb_shapes[i], dt ? CT_DTYPE_BF16 : CT_DTYPE_F32, repeats));
    json_object_set_new(r, "gemm", gemm);
    int64_t N = quick ? 1024 : 8192, Dm = 4096, V = 128256;
    json_object_set_new(r, "loss", cb_loss(d, N, Dm, V, repeats));
    /* training steps: ctorch's rows now, PyTorch's after the device is closed (its pool freed) */
    json_t *rows = json_array();
    int ncases = (int)(sizeof cb_train_cases / sizeof cb_train_cases[0]);
    for (int c = 0; c < ncases; c++) {
        if (quick && !cb_train_cases[c].quick) continue;
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
    json_t *train = json_pack("{s:s, s:i, s:i}", "step",
                              "ct_trainer on the GPU: forward, backward, clip 1, AdamW (one loss read-back); dense "
                              "causal attention, no document mask; bf16: bf16 products, f32 master weights",
                              "warmup_steps", CB_TRAIN_WARMUP, "repeats", repeats);
    json_object_set_new(train, "peak_counts",
                        json_string("ctorch: device buffers through ct_dev_alloc from before the trainer's creation "
                                    "(parameters, gradients, AdamW moments, activations, the backend's scratch and "
                                    "GEMM workspace); PyTorch: torch.cuda.max_memory_allocated from before the model "
                                    "moved to the GPU"));
    json_object_set_new(train, "rows", rows);
    json_object_set_new(r, "train_step", train);
    s = ct_device_close(d);
    if (s != CT_OK) {
        json_decref(r);
        return cli_fail("bench cuda: closing the device", s);
    }

    /* PyTorch's side: the same initial weights (bench train's weights file of each model, the
     * parameters under ctorch's names, read by bench/torch_train.py's SdpaGPT) */
    char tmp[512];
    const char *td = getenv("TMPDIR");
    snprintf(tmp, sizeof tmp, "%s/ctorch-bench-cuda-XXXXXX", td && *td ? td : "/tmp");
    bool have_tmp = mkdtemp(tmp) != NULL;
    char wpath[CB_NMODELS][600];
    bool wrote[CB_NMODELS] = {false};
    char spec[16][700];
    int nspec = 0;
    for (int c = 0; c < ncases && have_tmp && nspec < 16; c++) {
        if (quick && !cb_train_cases[c].quick) continue;
        int m = cb_train_cases[c].model;
        if (!wrote[m]) {
            snprintf(wpath[m], sizeof wpath[m], "%s/%s.safetensors", tmp, cb_model_names[m]);
            bench_train_conf bc = {cb_model(m), 1};
            if (bench_train_write_weights(&bc, wpath[m]) != 0) continue;
            wrote[m] = true;
        }
        for (int dt = 0; dt < 2 && nspec < 16; dt++) {
            /* --quick: torch.compile at GPT-2's shape in bf16 only (each compilation takes ~a minute) */
            bool compiled = !quick || (m == CB_MODEL_GPT2 && dt == 1);
            snprintf(spec[nspec++], sizeof spec[0], "%s:%s:%lld:%s:%s", cb_model_names[m], wpath[m],
                     (long long)cb_train_cases[c].batch, dt ? "bf16" : "f32", compiled ? "eager+compiled" : "eager");
        }
    }
    char nbuf[32], rbuf[32], dbuf[32];
    snprintf(nbuf, sizeof nbuf, "%lld", (long long)N);
    snprintf(rbuf, sizeof rbuf, "%d", repeats);
    snprintf(dbuf, sizeof dbuf, "%d", dev_index);
    char *args[64];
    int na = 0;
    args[na++] = "--n";
    args[na++] = nbuf;
    args[na++] = "--repeats";
    args[na++] = rbuf;
    args[na++] = "--device-index";
    args[na++] = dbuf;
    if (quick) args[na++] = "--quick";
    for (int k = 0; k < nspec; k++) {
        args[na++] = "--train";
        args[na++] = spec[k];
    }
    args[na] = NULL;
    json_t *torch = bench_python("torch_cuda.py", args);
    cb_train_merge(rows, torch);
    json_object_set_new(r, "torch", torch);
    for (int m = 0; m < CB_NMODELS; m++)
        if (wrote[m]) unlink(wpath[m]);
    if (have_tmp) rmdir(tmp);

    if (b->json) bench_print_json(r);
    else cb_print_text(r);
    json_decref(r);
    return 0;
}

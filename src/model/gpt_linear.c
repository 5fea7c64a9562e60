/* Linear layers and embeddings of the model's inference paths (gpt.c's forward, kvcache.c) on
 * f32 weights or on bf16 / f16 weights left in their mapped files (ct_hf_map_model).
 *
 * A half weight W [V, D] is never converted whole. Decode (a few rows, gemv) reads its bits
 * row by row (bf16 values widened as they are read, f16 rows in chunks into a stack buffer)
 * and adds the products in the order of the f32 GEMV, so its bits are the f32 GEMV's on the
 * widened weights. More rows
 * take panels: panel_rows_for(D) weight rows (a function of D alone) converted into a scratch
 * of at most PANEL_FLOATS floats per thread (allocated by each thread for the call, tracked)
 * and multiplied by ct_gemm_f32 over the whole D (split in KC columns only past KC_MAX); the
 * pool's threads take whole panels, so every output element is computed by the same calls
 * for any thread count. */
#include "model/gpt_internal.h"

#include <stdatomic.h>
#include <string.h>

#define GEMV_BLOCK 64        /* weight rows per GEMV task */
#define GEMV_CHUNK 512       /* half values widened at a time by the GEMV (a multiple of 8) */
#define PANEL_FLOATS (1 << 19) /* 2 MiB of f32 per thread for D <= 32768 */
#define PANEL_MIN_ROWS 16
#define PANEL_MAX_ROWS 512
#define KC_MAX 65536 /* columns of a panel: wider weights are split (4 MiB per thread at most) */

/* ---- GEMV --------------------------------------------------------------------------------- */

/* a[k] += x[d + k] w[d + k] for d = 0, 8, .. < n (n a multiple of 8): the f32 GEMV's sums. */
static inline void dot8(float a[8], const float *x, const float *w, int64_t n)
{
    for (int64_t d = 0; d + 8 <= n; d += 8)
        for (int k = 0; k < 8; k++)
            a[k] += x[d + k] * w[d + k];
}

static inline float sum8(const float a[8])
{
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

typedef struct gemv_job {
    float *out;
    const float *inp, *w;
    const uint16_t *h;
    ct_dtype hdt;
    int64_t N, D, V, ldo, ldw;
    bool accumulate;
} gemv_job;

static void widen(float *dst, const uint16_t *src, ct_dtype dt, size_t n)
{
    if (dt == CT_DTYPE_BF16)
        ct_convert_bf16_to_f32(dst, src, n);
    else
        ct_convert_f16_to_f32(dst, src, n);
}

static void gemv_f32_rows(void *arg, int64_t b0, int64_t b1, int tid)
{
    const gemv_job *j = arg;
    int64_t D8 = j->D & ~(int64_t)7;
    for (int64_t blk = b0; blk < b1; blk++) {
        int64_t v1 = (blk + 1) * GEMV_BLOCK < j->V ? (blk + 1) * GEMV_BLOCK : j->V;
        for (int64_t v = blk * GEMV_BLOCK; v < v1; v++) {
            const float *w = j->w + v * j->ldw;
            for (int64_t r = 0; r < j->N; r++) {
                const float *x = j->inp + r * j->D;
                float a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                dot8(a, x, w, D8);
                float t = sum8(a);
                for (int64_t d = D8; d < j->D; d++)
                    t += x[d] * w[d];
                float *o = j->out + r * j->ldo + v;
                *o = j->accumulate ? *o + t : t;
            }
        }
    }
}

static inline float bf16_value(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The same sums on bf16 rows, each value widened (exactly) as it is read. */
static void gemv_bf16_rows(void *arg, int64_t b0, int64_t b1, int tid)
{
    const gemv_job *j = arg;
    int64_t D8 = j->D & ~(int64_t)7;
    for (int64_t blk = b0; blk < b1; blk++) {
        int64_t v1 = (blk + 1) * GEMV_BLOCK < j->V ? (blk + 1) * GEMV_BLOCK : j->V;
        for (int64_t v = blk * GEMV_BLOCK; v < v1; v++) {
            const uint16_t *restrict w = j->h + v * j->ldw;
            for (int64_t r = 0; r < j->N; r++) {
                const float *restrict x = j->inp + r * j->D;
                float a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                for (int64_t d = 0; d < D8; d += 8)
                    for (int k = 0; k < 8; k++)
                        a[k] += x[d + k] * bf16_value(w[d + k]);
                float t = sum8(a);
                for (int64_t d = D8; d < j->D; d++)
                    t += x[d] * bf16_value(w[d]);
                float *o = j->out + r * j->ldo + v;
                *o = j->accumulate ? *o + t : t;
            }
        }
    }
}

/* The same sums on f16 rows widened GEMV_CHUNK values at a time. */
static void gemv_half_rows(void *arg, int64_t b0, int64_t b1, int tid)
{
    const gemv_job *j = arg;
    int64_t D8 = j->D & ~(int64_t)7;
    float buf[GEMV_CHUNK], tail[8];
    float a[GPT_GEMV_MAX][8];
    for (int64_t blk = b0; blk < b1; blk++) {
        int64_t v1 = (blk + 1) * GEMV_BLOCK < j->V ? (blk + 1) * GEMV_BLOCK : j->V;
        for (int64_t v = blk * GEMV_BLOCK; v < v1; v++) {
            const uint16_t *w = j->h + v * j->ldw;
            memset(a, 0, sizeof a);
            for (int64_t c0 = 0; c0 < D8; c0 += GEMV_CHUNK) {
                int64_t cn = D8 - c0 < GEMV_CHUNK ? D8 - c0 : GEMV_CHUNK;
                widen(buf, w + c0, j->hdt, (size_t)cn);
                for (int64_t r = 0; r < j->N; r++)
                    dot8(a[r], j->inp + r * j->D + c0, buf, cn);
            }
            widen(tail, w + D8, j->hdt, (size_t)(j->D - D8));
            for (int64_t r = 0; r < j->N; r++) {
                const float *x = j->inp + r * j->D;
                float t = sum8(a[r]);
                for (int64_t d = D8; d < j->D; d++)
                    t += x[d] * tail[d - D8];
                float *o = j->out + r * j->ldo + v;
                *o = j->accumulate ? *o + t : t;
            }
        }
    }
}

void gpt_gemv_f32(float *out, int64_t ldo, const float *inp, const float *w, int64_t ldw,
                  int64_t N, int64_t D, int64_t V, bool accumulate)
{
    gemv_job j = {out, inp, w, NULL, CT_DTYPE_F32, N, D, V, ldo, ldw, accumulate};
    ct_parallel_for((V + GEMV_BLOCK - 1) / GEMV_BLOCK, gemv_f32_rows, &j);
}

/* ---- panels ------------------------------------------------------------------------------- */

typedef struct panel_job {
    float *out;
    const float *inp, *bias;
    const uint16_t *h;
    ct_dtype hdt;
    int64_t N, D, V, ldo, rows, kc;
    bool accumulate;
    atomic_int failed; /* a ct_status of a task (0: none) */
} panel_job;

static void panel_rows(void *arg, int64_t p0, int64_t p1, int tid)
{
    panel_job *j = arg;
    float *scr = NULL;
    if (ct_alloc((void **)&scr, (size_t)(j->rows * j->kc) * sizeof(float)) != CT_OK) {
        atomic_store(&j->failed, CT_ENOMEM);
        return;
    }
    for (int64_t p = p0; p < p1 && !atomic_load(&j->failed); p++) {
        int64_t r0 = p * j->rows, rn = j->V - r0 < j->rows ? j->V - r0 : j->rows;
        float *o = j->out + r0;
        float beta = j->accumulate ? 1.0f : 0.0f;
        if (j->bias && !j->accumulate) { /* as ct_linear_forward: bias first, then += */
            for (int64_t n = 0; n < j->N; n++)
                memcpy(o + n * j->ldo, j->bias + r0, (size_t)rn * sizeof(float));
            beta = 1.0f;
        }
        for (int64_t k0 = 0; k0 < j->D; k0 += j->kc) {
            int64_t kn = j->D - k0 < j->kc ? j->D - k0 : j->kc;
            for (int64_t i = 0; i < rn; i++)
                widen(scr + i * kn, j->h + (r0 + i) * j->D + k0, j->hdt, (size_t)kn);
            ct_status s = ct_gemm_f32(false, true, j->N, rn, kn, 1.0f, j->inp + k0, j->D, scr, kn,
                                      k0 ? 1.0f : beta, o, j->ldo);
            if (s) {
                atomic_store(&j->failed, (int)s);
                break;
            }
        }
        if (j->bias && j->accumulate)
            for (int64_t n = 0; n < j->N; n++)
                for (int64_t v = 0; v < rn; v++)
                    o[n * j->ldo + v] += j->bias[r0 + v];
    }
    ct_free(scr);
}

/* Rows of a panel for weights of D columns: PANEL_FLOATS / D rounded down to a multiple of
 * PANEL_MIN_ROWS, within [PANEL_MIN_ROWS, PANEL_MAX_ROWS]. */
static int64_t panel_rows_for(int64_t kc)
{
    int64_t r = PANEL_FLOATS / kc;
    r -= r % PANEL_MIN_ROWS;
    if (r < PANEL_MIN_ROWS) r = PANEL_MIN_ROWS;
    if (r > PANEL_MAX_ROWS) r = PANEL_MAX_ROWS;
    return r;
}

static void add_bias(float *out, int64_t ldo, const float *bias, int64_t N, int64_t V)
{
    for (int64_t r = 0; r < N; r++)
        for (int64_t v = 0; v < V; v++)
            out[r * ldo + v] += bias[v];
}

ct_status gpt_linear(float *out, int64_t ldo, const float *inp, const float *w, gpt_half h,
                     const float *bias, int64_t N, int64_t D, int64_t V, bool accumulate,
                     bool gemv)
{
    if (N < 1 || D < 1 || V < 1 || ldo < V)
        return ct_error(CT_EINVAL, "gpt_linear: bad sizes N=%lld D=%lld V=%lld ldo=%lld",
                        (long long)N, (long long)D, (long long)V, (long long)ldo);
    if (!h.p) {
        if (gemv && N <= GPT_GEMV_MAX) {
            gpt_gemv_f32(out, ldo, inp, w, D, N, D, V, accumulate);
        } else {
            if (!accumulate && ldo == V) return ct_linear_forward(out, inp, w, bias, N, D, V);
            CT_TRY(ct_gemm_f32(false, true, N, V, D, 1.0f, inp, D, w, D, accumulate ? 1.0f : 0.0f,
                               out, ldo));
        }
        if (bias) add_bias(out, ldo, bias, N, V);
        return CT_OK;
    }
    if (h.dt != CT_DTYPE_BF16 && h.dt != CT_DTYPE_F16)
        return ct_error(CT_EINTERNAL, "gpt_linear: a mapped weight must be bf16 or f16");
    if (gemv && N <= GPT_GEMV_MAX) {
        gemv_job j = {out, inp, NULL, h.p, h.dt, N, D, V, ldo, D, accumulate};
        ct_parallel_for((V + GEMV_BLOCK - 1) / GEMV_BLOCK,
                        h.dt == CT_DTYPE_BF16 ? gemv_bf16_rows : gemv_half_rows, &j);
        if (bias) add_bias(out, ldo, bias, N, V);
        return CT_OK;
    }
    int64_t kc = D < KC_MAX ? D : KC_MAX, rows = panel_rows_for(kc);
    if (rows > V) rows = V;
    panel_job j = {out, inp, bias, h.p, h.dt, N, D, V, ldo, rows, kc, accumulate, 0};
    ct_parallel_for((V + rows - 1) / rows, panel_rows, &j);
    int f = atomic_load(&j.failed);
    if (f == CT_ENOMEM)
        return ct_error(CT_ENOMEM, "gpt_linear: cannot allocate a weight panel of %lld x %lld floats",
                        (long long)rows, (long long)kc);
    if (f)
        return ct_error((ct_status)f, "gpt_linear: the GEMM of a weight panel failed (N=%lld "
                                      "D=%lld V=%lld)",
                        (long long)N, (long long)D, (long long)V);
    return CT_OK;
}

/* ---- embedding ---------------------------------------------------------------------------- */

ct_status gpt_embed(float *out, const int32_t *ids, const float *w, gpt_half h, int64_t N,
                    int64_t V, int64_t D)
{
    if (!h.p) return ct_embedding_forward(out, ids, CT_DTYPE_I32, w, N, V, D);
    if (h.dt == CT_DTYPE_BF16) return ct_embedding_forward_bf16(out, ids, CT_DTYPE_I32, h.p, N, V, D);
    for (int64_t n = 0; n < N; n++)
        if (ids[n] < 0 || ids[n] >= V)
            return ct_error(CT_EINVAL, "gpt_embed: ids[%lld] = %d is outside [0, %lld)",
                            (long long)n, ids[n], (long long)V);
    for (int64_t n = 0; n < N; n++) /* f16: each row widened exactly on lookup */
        ct_convert_f16_to_f32(out + n * D, h.p + (int64_t)ids[n] * D, (size_t)D);
    return CT_OK;
}

/* ---- bf16 mixed precision (ct_gpt_options.dtype bf16) -------------------------------------- */

ct_status gpt_to_bf16(const ct_gpt *m, uint16_t *dst, const float *src, int64_t n)
{
    if (n <= 0) return CT_OK;
    GPT_DEV(m, to_bf16, dst, src, n);
    return CT_OK;
}

ct_status gpt_bf16_refresh(ct_gpt *m)
{
    if (!m->wbf || m->mapped)
        return ct_error(CT_EINVAL, "ct_gpt: dtype bf16 needs the model's own f32 parameters (its "
                                   "weights are mapped from a file)");
    return gpt_to_bf16(m, m->wbf, m->params, m->ndecay);
}

ct_status gpt_linear_bf16(float *out, int64_t ldo, const uint16_t *xb, const ct_gpt *m,
                          const float *w, const float *bias, int64_t N, int64_t D, int64_t V,
                          bool accumulate)
{
    float beta = accumulate ? 1.0f : 0.0f;
    if (bias && !accumulate) {
        for (int64_t n = 0; n < N; n++)
            memcpy(out + n * ldo, bias, (size_t)V * sizeof(float));
        beta = 1.0f;
    }
    CT_TRY(ct_gemm_bf16(false, true, N, V, D, 1.0f, xb, D, gpt_wb(m, w), D, beta, out, ldo));
    if (bias && accumulate) add_bias(out, ldo, bias, N, V);
    return CT_OK;
}

/* ---- one product of a layer in the model's dtype -------------------------------------------- */

ct_status gpt_layer_input(const ct_gpt *m, const float *x, int64_t n, gpt_input *in)
{
    in->f = x;
    in->b = NULL;
    if (gpt_bf16(m)) {
        CT_TRY(gpt_to_bf16(m, m->a.xb, x, n));
        in->b = m->a.xb;
    }
    return CT_OK;
}

/* A product on a device other than the CPU: the table's GEMM (f32 or bf16 operands), then the
 * bias. (The CPU keeps gpt_linear / gpt_linear_bf16: mapped half weights, GEMV, the bias as
 * the GEMM's starting value.) */
static ct_status device_linear(const ct_gpt *m, float *out, int64_t ldo, gpt_input x,
                               const float *w, const float *bias, int64_t N, int64_t D, int64_t V,
                               bool accumulate)
{
    bool bf = gpt_bf16(m);
    if (bias && ldo != V)
        return ct_error(CT_EINTERNAL, "gpt_layer_linear: a bias needs dense rows on %s",
                        ct_device_name(m->dev));
    GPT_DEV(m, gemm, false, true, N, V, D, 1.0f, bf ? (const void *)x.b : (const void *)x.f, D,
            bf ? (const void *)gpt_wb(m, w) : (const void *)w, D, accumulate ? 1.0f : 0.0f, out,
            ldo, bf ? CT_DTYPE_BF16 : CT_DTYPE_F32);
    if (bias) GPT_DEV(m, bias_add_rows, out, bias, N, V);
    return CT_OK;
}

ct_status gpt_layer_linear(const ct_gpt *m, float *out, int64_t ldo, gpt_input x, const float *w,
                           gpt_half h, const float *bias, int64_t N, int64_t D, int64_t V,
                           bool accumulate)
{
    if (!gpt_host(m)) return device_linear(m, out, ldo, x, w, bias, N, D, V, accumulate);
    if (gpt_bf16(m)) return gpt_linear_bf16(out, ldo, x.b, m, w, bias, N, D, V, accumulate);
    return gpt_linear(out, ldo, x.f, w, h, bias, N, D, V, accumulate, false);
}

ct_status gpt_layer_linear_backward(ct_gpt *m, float *dx, bool dx_accumulate, float *gw,
                                    const float *dy, int64_t ldy, gpt_input x, const float *w,
                                    int64_t N, int64_t D, int64_t V)
{
    float beta = dx_accumulate ? 1.0f : 0.0f;
    if (!gpt_bf16(m)) {
        if (gw) GPT_DEV(m, gemm, true, false, V, D, N, 1.0f, dy, ldy, x.f, D, 1.0f, gw, D, CT_DTYPE_F32);
        if (dx) GPT_DEV(m, gemm, false, false, N, D, V, 1.0f, dy, ldy, w, D, beta, dx, D, CT_DTYPE_F32);
        return CT_OK;
    }
    uint16_t *dyb = m->a.dyb; /* dy rounded, rows packed: elementwise, so any split is the same */
    if (ldy == V)
        CT_TRY(gpt_to_bf16(m, dyb, dy, N * V));
    else
        for (int64_t n = 0; n < N; n++)
            CT_TRY(gpt_to_bf16(m, dyb + n * V, dy + n * ldy, V));
    if (gw) GPT_DEV(m, gemm, true, false, V, D, N, 1.0f, dyb, V, x.b, D, 1.0f, gw, D, CT_DTYPE_BF16);
    if (dx)
        GPT_DEV(m, gemm, false, false, N, D, V, 1.0f, dyb, V, gpt_wb(m, w), D, beta, dx, D,
                CT_DTYPE_BF16);
    return CT_OK;
}

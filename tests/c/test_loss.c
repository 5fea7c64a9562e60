/* Cross-entropy on logits and the fused linear cross-entropy against a naive reference in
 * double (every option and combination), tiling modes, bf16, accumulation, determinism
 * across thread counts, the memory bound, and bad input. */
#include "test_util.h"

typedef struct {
    int64_t N, D, V;
    float *h, *w, *b; /* b may be NULL */
    int64_t *y;
    ct_ce_options o;
} prob;

/* Reference: loss rows, z rows, and d loss_total / d logits (upstream g per row) in double. */
static double ref_loss(const prob *p, const float *dloss, double *dz, double *zsum, double *rows)
{
    int64_t N = p->N, V = p->V, D = p->D;
    const ct_ce_options *o = &p->o;
    double *z = malloc(sizeof(double) * (size_t)(V ? V : 1));
    double total = 0, ztot = 0, denom = 0;
    for (int64_t n = 0; n < N; n++)
        if (p->y[n] != o->ignore_index) denom += o->class_weight ? o->class_weight[p->y[n]] : 1.0;
    double W = 0;
    for (int64_t c = 0; c < V; c++) W += o->class_weight ? o->class_weight[c] : 1.0;
    for (int64_t n = 0; n < N; n++) {
        double m = -INFINITY;
        for (int64_t c = 0; c < V; c++) {
            double s = p->b ? p->b[c] : 0;
            for (int64_t k = 0; k < D; k++) s += (double)p->h[n * D + k] * p->w[c * D + k];
            if (o->softcap > 0) s = o->softcap * tanh(s / o->softcap);
            z[c] = s;
            if (s > m) m = s;
        }
        double se = 0;
        for (int64_t c = 0; c < V; c++) se += exp(z[c] - m);
        double lse = m + log(se);
        int64_t y = p->y[n];
        bool ign = y == o->ignore_index;
        double eps = o->label_smoothing, wy = ign ? 0 : o->class_weight ? o->class_weight[y] : 1.0;
        double sw = 0;
        for (int64_t c = 0; c < V; c++) sw += (o->class_weight ? o->class_weight[c] : 1.0) * z[c];
        double zt = ign ? 0 : o->z_loss * lse * lse;
        double l = ign ? 0 : (1 - eps) * wy * (lse - z[y]) + eps / V * (W * lse - sw) + zt;
        if (rows) rows[n] = l;
        total += l;
        ztot += zt;
        double g = 0;
        if (!ign) g = o->reduction == CT_REDUCTION_NONE ? dloss[n] : o->reduction == CT_REDUCTION_SUM ? dloss[0] : dloss[0] / denom;
        for (int64_t c = 0; c < V; c++) {
            double pc = exp(z[c] - lse), wc = o->class_weight ? o->class_weight[c] : 1.0;
            double d = ign ? 0 : g * (pc * ((1 - eps) * wy + eps / V * W + 2 * o->z_loss * lse) - eps / V * wc - (c == y ? (1 - eps) * wy : 0));
            if (o->softcap > 0) d *= 1 - (z[c] / o->softcap) * (z[c] / o->softcap);
            if (dz) dz[n * V + c] = d;
        }
    }
    free(z);
    double div = o->reduction == CT_REDUCTION_MEAN ? denom : 1.0;
    if (zsum) *zsum = ztot / div;
    return total / div;
}

static void ref_grads(const prob *p, const double *dz, float *dh, float *dw, float *db)
{
    int64_t N = p->N, V = p->V, D = p->D;
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < D; k++) {
            double s = 0;
            for (int64_t c = 0; c < V; c++) s += dz[n * V + c] * p->w[c * D + k];
            dh[n * D + k] = (float)s;
        }
    for (int64_t c = 0; c < V; c++) {
        double sb = 0;
        for (int64_t k = 0; k < D; k++) {
            double s = 0;
            for (int64_t n = 0; n < N; n++) s += dz[n * V + c] * p->h[n * D + k];
            dw[c * D + k] = (float)s;
        }
        for (int64_t n = 0; n < N; n++) sb += dz[n * V + c];
        db[c] = (float)sb;
    }
}

static prob make(int64_t N, int64_t D, int64_t V, bool bias)
{
    prob p = {N, D, V, malloc(4 * (size_t)(N * D + 1)), malloc(4 * (size_t)(V * D + 1)),
              bias ? malloc(4 * (size_t)V) : NULL, malloc(8 * (size_t)(N + 1)), ct_ce_options_default()};
    t_fill(p.h, (size_t)(N * D), -1, 1);
    t_fill(p.w, (size_t)(V * D), -0.6f, 0.6f);
    if (bias) t_fill(p.b, (size_t)V, -0.5f, 0.5f);
    for (int64_t n = 0; n < N; n++) p.y[n] = (int64_t)(t_next() % (uint64_t)V);
    if (N > 3) p.y[2] = -100;
    return p;
}

static void drop(prob *p)
{
    free(p->h);
    free(p->w);
    free(p->b);
    free(p->y);
}

/* Run forward, backward and forward_backward on a problem and compare with the reference. */
static void check_problem(const prob *p, const char *what)
{
    int64_t N = p->N, D = p->D, V = p->V;
    bool none = p->o.reduction == CT_REDUCTION_NONE;
    float *dloss = malloc(4 * (size_t)(N + 1));
    t_fill(dloss, (size_t)(N + 1), 0.5f, 1.5f);
    double *dz = malloc(8 * (size_t)(N * V + 1));
    double *rows = malloc(8 * (size_t)(N + 1));
    double zref;
    double lref = ref_loss(p, dloss, dz, &zref, rows);
    float *rdh = malloc(4 * (size_t)(N * D + 1)), *rdw = malloc(4 * (size_t)(V * D + 1)), *rdb = malloc(4 * (size_t)V);
    ref_grads(p, dz, rdh, rdw, rdb);
    size_t nl = none ? (size_t)N : 1;
    float *loss = malloc(4 * (nl + 1)), *zl = malloc(4 * (nl + 1)), *lse = malloc(4 * (size_t)(N + 1));
    float *ref_rows = malloc(4 * (nl + 1)), zr = (float)zref;
    for (size_t i = 0; i < nl; i++) ref_rows[i] = none ? (float)rows[i] : (float)lref;
    float *dh = malloc(4 * (size_t)(N * D + 1)), *dw = malloc(4 * (size_t)(V * D + 1)), *db = malloc(4 * (size_t)V);
    ct_lce_inputs in = {p->h, p->w, p->b, CT_DTYPE_F32, p->y, CT_DTYPE_I64, N, D, V};
    ct_ce_outputs out = {loss, zl, lse};
    ct_lce_grads g = {dh, dw, p->b ? db : NULL, false};
    double tol = 2e-5;

    /* forward + backward */
    CHECK_OK(ct_linear_cross_entropy_forward(&out, &in, &p->o));
    if (!t_close(loss, ref_rows, nl, tol, 1e-4, what)) CHECK(0);
    if (!none && !t_close(zl, &zr, 1, tol, 1e-4, what)) CHECK(0);
    CHECK_OK(ct_linear_cross_entropy_backward(&g, dloss, lse, &in, &p->o));
    if (!t_close(dh, rdh, (size_t)(N * D), tol, 1e-3, "dh (backward)")) CHECK(0);
    if (!t_close(dw, rdw, (size_t)(V * D), tol, 1e-3, "dw (backward)")) CHECK(0);
    if (p->b && !t_close(db, rdb, (size_t)V, tol, 1e-3, "db (backward)")) CHECK(0);

    /* fused training path */
    memset(loss, 0, 4 * nl);
    CHECK_OK(ct_linear_cross_entropy_forward_backward(&out, &g, dloss, &in, &p->o));
    if (!t_close(loss, ref_rows, nl, tol, 1e-4, what)) CHECK(0);
    if (!t_close(dh, rdh, (size_t)(N * D), tol, 1e-3, "dh (fwd_bwd)")) CHECK(0);
    if (!t_close(dw, rdw, (size_t)(V * D), tol, 1e-3, "dw (fwd_bwd)")) CHECK(0);
    if (p->b && !t_close(db, rdb, (size_t)V, tol, 1e-3, "db (fwd_bwd)")) CHECK(0);

    /* the unfused cross-entropy on logits agrees too */
    float *logits = malloc(4 * (size_t)(N * V + 1)), *dl = malloc(4 * (size_t)(N * V + 1));
    float *rdl = malloc(4 * (size_t)(N * V + 1));
    CHECK_OK(ct_linear_forward(logits, p->h, p->w, p->b, N, D, V));
    ct_ce_outputs o2 = {loss, NULL, NULL};
    CHECK_OK(ct_cross_entropy_forward(&o2, logits, p->y, CT_DTYPE_I64, N, V, &p->o));
    if (!t_close(loss, ref_rows, nl, tol, 1e-4, "cross_entropy")) CHECK(0);
    CHECK_OK(ct_cross_entropy_backward(dl, dloss, logits, p->y, CT_DTYPE_I64, N, V, &p->o));
    for (int64_t i = 0; i < N * V; i++) rdl[i] = (float)dz[i];
    if (!t_close(dl, rdl, (size_t)(N * V), 1e-6, 1e-3, "dlogits")) CHECK(0);

    free(logits), free(dl), free(rdl), free(dloss), free(dz), free(rows), free(rdh), free(rdw), free(rdb);
    free(loss), free(zl), free(lse), free(ref_rows), free(dh), free(dw), free(db);
}

static void test_options(void)
{
    ct_reduction reds[3] = {CT_REDUCTION_MEAN, CT_REDUCTION_SUM, CT_REDUCTION_NONE};
    for (int r = 0; r < 3; r++)
        for (int variant = 0; variant < 6; variant++) {
            prob p = make(37, 19, 53, variant % 2 == 1);
            float cw[53];
            t_fill(cw, 53, 0.2f, 2.0f);
            p.o.reduction = reds[r];
            if (variant >= 1) p.o.label_smoothing = 0.1f;
            if (variant >= 2) p.o.class_weight = cw;
            if (variant >= 3) p.o.z_loss = 1e-2f;
            if (variant >= 4) p.o.softcap = 2.0f;
            if (variant == 5) p.o.scratch_bytes = 4096; /* vocabulary tiles over two token blocks */
            char what[64];
            snprintf(what, sizeof what, "loss (reduction %d, variant %d)", r, variant);
            check_problem(&p, what);
            drop(&p);
        }
    /* ignore_index other than -100; a 1-row, 1-class problem */
    prob p = make(9, 5, 7, true);
    p.o.ignore_index = 3;
    p.y[4] = 3;
    p.y[2] = 0;
    check_problem(&p, "ignore_index=3");
    drop(&p);
    p = make(1, 3, 1, false);
    check_problem(&p, "N=1 V=1");
    drop(&p);
}

static void test_edge_cases(void)
{
    /* every row ignored: MEAN gives NaN, SUM 0, gradients 0 */
    prob p = make(4, 3, 5, false);
    for (int i = 0; i < 4; i++) p.y[i] = -100;
    float loss = 0, one = 1, dh[12], dw[15], lse[4];
    ct_lce_inputs in = {p.h, p.w, NULL, CT_DTYPE_F32, p.y, CT_DTYPE_I64, 4, 3, 5};
    ct_ce_outputs out = {&loss, NULL, lse};
    ct_lce_grads g = {dh, dw, NULL, false};
    CHECK_OK(ct_linear_cross_entropy_forward_backward(&out, &g, &one, &in, &p.o));
    CHECK(isnan(loss));
    int zero = 1;
    for (int i = 0; i < 12; i++) zero &= dh[i] == 0;
    for (int i = 0; i < 15; i++) zero &= dw[i] == 0;
    CHECK(zero);
    p.o.reduction = CT_REDUCTION_SUM;
    CHECK_OK(ct_linear_cross_entropy_forward(&out, &in, &p.o));
    CHECK(loss == 0.0f);
    /* N = 0 */
    in.N = 0;
    p.o.reduction = CT_REDUCTION_MEAN;
    CHECK_OK(ct_linear_cross_entropy_forward(&out, &in, &p.o));
    CHECK(isnan(loss));
    in.N = 4;
    /* a target outside [0, V): EINVAL naming row and value */
    p.y[1] = 5;
    CHECK_STATUS(ct_linear_cross_entropy_forward(&out, &in, &p.o), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "target[1] = 5") != NULL);
    p.y[1] = -7;
    CHECK_STATUS(ct_cross_entropy_forward(&out, p.w, p.y, CT_DTYPE_I64, 4, 3, &p.o), CT_EINVAL);
    p.y[1] = 0;
    /* bad options and arguments */
    ct_ce_options bad = p.o;
    bad.label_smoothing = 1.5f;
    CHECK_STATUS(ct_linear_cross_entropy_forward(&out, &in, &bad), CT_EINVAL);
    bad = p.o;
    bad.z_loss = -1;
    CHECK_STATUS(ct_linear_cross_entropy_forward(&out, &in, &bad), CT_EINVAL);
    bad = p.o;
    bad.softcap = NAN;
    CHECK_STATUS(ct_linear_cross_entropy_forward(&out, &in, &bad), CT_EINVAL);
    bad = p.o;
    bad.reduction = (ct_reduction)9;
    CHECK_STATUS(ct_linear_cross_entropy_forward(&out, &in, &bad), CT_EINVAL);
    CHECK_STATUS(ct_linear_cross_entropy_forward(&out, &in, NULL), CT_EINVAL);
    CHECK_STATUS(ct_linear_cross_entropy_forward(NULL, &in, &p.o), CT_EINVAL);
    ct_lce_inputs bin = in;
    bin.dtype = CT_DTYPE_F16;
    CHECK_STATUS(ct_linear_cross_entropy_forward(&out, &bin, &p.o), CT_EINVAL);
    bin = in;
    bin.target_dtype = CT_DTYPE_F32;
    CHECK_STATUS(ct_linear_cross_entropy_forward(&out, &bin, &p.o), CT_EINVAL);
    bin = in;
    bin.h = NULL;
    CHECK_STATUS(ct_linear_cross_entropy_forward(&out, &bin, &p.o), CT_EINVAL);
    CHECK_STATUS(ct_linear_cross_entropy_backward(&g, NULL, lse, &in, &p.o), CT_EINVAL);
    CHECK_STATUS(ct_linear_cross_entropy_backward(&g, &one, NULL, &in, &p.o), CT_EINVAL);
    bad = p.o;
    bad.scratch_bytes = 16;
    CHECK_STATUS(ct_linear_cross_entropy_forward(&out, &in, &bad), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "scratch_bytes") != NULL);
    /* i32 targets give the same loss as i64 */
    int32_t y32[4];
    for (int i = 0; i < 4; i++) y32[i] = (int32_t)p.y[i];
    float l64, l32;
    out.loss = &l64;
    CHECK_OK(ct_linear_cross_entropy_forward(&out, &in, &p.o));
    in.target = y32;
    in.target_dtype = CT_DTYPE_I32;
    out.loss = &l32;
    CHECK_OK(ct_linear_cross_entropy_forward(&out, &in, &p.o));
    CHECK(l32 == l64);
    drop(&p);
}

/* bf16 inputs: equal to the f32 path run on the bf16-rounded values (f32 accumulation). */
static void test_bf16(void)
{
    prob p = make(33, 24, 300, false);
    p.o.label_smoothing = 0.05f;
    int64_t N = p.N, D = p.D, V = p.V;
    uint16_t *hb = malloc(2 * (size_t)(N * D)), *wb = malloc(2 * (size_t)(V * D));
    ct_convert_f32_to_bf16(hb, p.h, (size_t)(N * D));
    ct_convert_f32_to_bf16(wb, p.w, (size_t)(V * D));
    ct_convert_bf16_to_f32(p.h, hb, (size_t)(N * D));
    ct_convert_bf16_to_f32(p.w, wb, (size_t)(V * D));
    float lf, lb, *dhf = malloc(4 * (size_t)(N * D)), *dwf = malloc(4 * (size_t)(V * D));
    float *dhb = malloc(4 * (size_t)(N * D)), *dwb = malloc(4 * (size_t)(V * D));
    ct_lce_inputs in = {p.h, p.w, NULL, CT_DTYPE_F32, p.y, CT_DTYPE_I64, N, D, V};
    ct_ce_outputs out = {&lf, NULL, NULL};
    ct_lce_grads g = {dhf, dwf, NULL, false};
    CHECK_OK(ct_linear_cross_entropy_forward_backward(&out, &g, NULL, &in, &p.o));
    for (int tiled = 0; tiled < 2; tiled++) {
        ct_lce_inputs ib = {hb, wb, NULL, CT_DTYPE_BF16, p.y, CT_DTYPE_I64, N, D, V};
        ct_ce_options o = p.o;
        if (tiled) o.scratch_bytes = 20000; /* W blocks smaller than V, vocabulary tiles */
        out.loss = &lb;
        ct_lce_grads gb = {dhb, dwb, NULL, false};
        CHECK_OK(ct_linear_cross_entropy_forward_backward(&out, &gb, NULL, &ib, &o));
        CHECK(fabsf(lb - lf) <= 1e-5f * fabsf(lf) + 1e-6f);
        if (!t_close(dhb, dhf, (size_t)(N * D), 1e-6, 1e-3, "bf16 dh")) CHECK(0);
        if (!t_close(dwb, dwf, (size_t)(V * D), 1e-6, 1e-3, "bf16 dw")) CHECK(0);
    }
    free(hb), free(wb), free(dhf), free(dwf), free(dhb), free(dwb);
    drop(&p);
}

/* accumulate: gradients add onto what the buffers hold (weight tying). */
static void test_accumulate(void)
{
    prob p = make(20, 8, 40, true);
    float l, dh1[160], dw1[320], db1[40], dh2[160], dw2[320], db2[40];
    ct_lce_inputs in = {p.h, p.w, p.b, CT_DTYPE_F32, p.y, CT_DTYPE_I64, 20, 8, 40};
    ct_ce_outputs out = {&l, NULL, NULL};
    ct_lce_grads g = {dh1, dw1, db1, false};
    CHECK_OK(ct_linear_cross_entropy_forward_backward(&out, &g, NULL, &in, &p.o));
    for (int i = 0; i < 320; i++) dw2[i] = 1.0f;
    for (int i = 0; i < 160; i++) dh2[i] = 2.0f;
    for (int i = 0; i < 40; i++) db2[i] = 3.0f;
    ct_lce_grads g2 = {dh2, dw2, db2, true};
    CHECK_OK(ct_linear_cross_entropy_forward_backward(&out, &g2, NULL, &in, &p.o));
    int ok = 1;
    for (int i = 0; i < 320; i++) ok &= fabsf(dw2[i] - (dw1[i] + 1.0f)) < 1e-6f;
    for (int i = 0; i < 160; i++) ok &= fabsf(dh2[i] - (dh1[i] + 2.0f)) < 1e-6f;
    for (int i = 0; i < 40; i++) ok &= fabsf(db2[i] - (db1[i] + 3.0f)) < 1e-6f;
    CHECK(ok);
    drop(&p);
}

/* Same bits across runs and across 1 and 2 threads, in both tiling modes (all rows at once;
 * vocabulary tiles over token blocks), and from forward + backward as from forward_backward. */
static void test_determinism(void)
{
    prob p = make(150, 40, 700, true);
    p.o.label_smoothing = 0.1f;
    p.o.z_loss = 1e-3f;
    int64_t N = p.N, D = p.D, V = p.V;
    float l[3], *dh[3], *dw[3], *db[3];
    for (int mode = 0; mode < 2; mode++) {
        p.o.scratch_bytes = mode ? 50000 : 0;
        for (int r = 0; r < 3; r++) {
            dh[r] = malloc(4 * (size_t)(N * D));
            dw[r] = malloc(4 * (size_t)(V * D));
            db[r] = malloc(4 * (size_t)V);
            CHECK_OK(ct_set_num_threads(r == 0 ? 1 : 2));
            ct_lce_inputs in = {p.h, p.w, p.b, CT_DTYPE_F32, p.y, CT_DTYPE_I64, N, D, V};
            ct_ce_outputs out = {&l[r], NULL, NULL};
            ct_lce_grads g = {dh[r], dw[r], db[r], false};
            CHECK_OK(ct_linear_cross_entropy_forward_backward(&out, &g, NULL, &in, &p.o));
        }
        { /* the backward from the forward's lse visits the tiles in the same order: same bits */
            float lf, one = 1.0f, *lse = malloc(4 * (size_t)N), *dh2 = malloc(4 * (size_t)(N * D));
            float *dw2 = malloc(4 * (size_t)(V * D)), *db2 = malloc(4 * (size_t)V);
            ct_lce_inputs in = {p.h, p.w, p.b, CT_DTYPE_F32, p.y, CT_DTYPE_I64, N, D, V};
            ct_ce_outputs out = {&lf, NULL, lse};
            ct_lce_grads g = {dh2, dw2, db2, false};
            CHECK_OK(ct_linear_cross_entropy_forward(&out, &in, &p.o));
            CHECK_OK(ct_linear_cross_entropy_backward(&g, &one, lse, &in, &p.o));
            CHECK(!memcmp(&lf, &l[2], 4));
            CHECK(!memcmp(dh2, dh[2], 4 * (size_t)(N * D)));
            CHECK(!memcmp(dw2, dw[2], 4 * (size_t)(V * D)));
            CHECK(!memcmp(db2, db[2], 4 * (size_t)V));
            free(lse), free(dh2), free(dw2), free(db2);
        }
        for (int r = 1; r < 3; r++) {
            CHECK(!memcmp(&l[0], &l[r], 4));
            CHECK(!memcmp(dh[0], dh[r], 4 * (size_t)(N * D)));
            CHECK(!memcmp(dw[0], dw[r], 4 * (size_t)(V * D)));
            CHECK(!memcmp(db[0], db[r], 4 * (size_t)V));
        }
        for (int r = 0; r < 3; r++) free(dh[r]), free(dw[r]), free(db[r]);
    }
    CHECK_OK(ct_set_num_threads(2));
    drop(&p);
}

/* Peak tracked bytes of a call = its scratch budget at most; nothing N x V or V x D.
 * Two shapes: vocabulary tiles, and full rows where the dh GEMM splits K (partial sums). */
static void memory_case(int64_t N, int64_t D, int64_t V, size_t budget)
{
    prob p = make(N, D, V, false);
    p.o.scratch_bytes = budget;
    float l, *dh = malloc(4 * (size_t)(N * D)), *dw = malloc(4 * (size_t)(V * D));
    ct_lce_inputs in = {p.h, p.w, NULL, CT_DTYPE_F32, p.y, CT_DTYPE_I64, N, D, V};
    ct_ce_outputs out = {&l, NULL, NULL};
    ct_lce_grads g = {dh, dw, NULL, false};
    ct_memory_stats_t a, b;
    for (int bf = 0; bf < 2; bf++) {
        uint16_t *hb = malloc(2 * (size_t)(N * D)), *wb = malloc(2 * (size_t)(V * D));
        if (bf) {
            ct_convert_f32_to_bf16(hb, p.h, (size_t)(N * D));
            ct_convert_f32_to_bf16(wb, p.w, (size_t)(V * D));
            in.h = hb, in.weight = wb, in.dtype = CT_DTYPE_BF16;
        }
        ct_memory_stats(&a);
        ct_memory_reset_peak();
        CHECK_OK(ct_linear_cross_entropy_forward_backward(&out, &g, NULL, &in, &p.o));
        ct_memory_stats(&b);
        CHECK(b.peak_bytes - a.current_bytes <= p.o.scratch_bytes);
        CHECK(b.current_bytes == a.current_bytes);
        free(hb), free(wb);
    }
    free(dh), free(dw);
    drop(&p);
}

static void test_memory_bound(void)
{
    /* under CT_TEST_REDUCED fewer rows: still several vocabulary tiles per chunk (256 KiB)
     * and two chunks of full rows (8 MiB holds about 100 rows of 20000); the 512 / 300 rows
     * took 4 of test_loss's 4.5 minutes under qemu at SVE 256 bits */
    memory_case(t_reduced() ? 128 : 512, 64, 5000, 256 << 10);
    memory_case(t_reduced() ? 150 : 300, 64, 20000, 8 << 20);
}

/* ct_lce_scratch_bytes_for_rows: bad arguments give 0; its budget holds blocks of that many
 * full-vocabulary rows (the call's peak is within it and at least the rows' logits), and the
 * results agree with the default budget's (another blocking: same values, other rounding). */
static void test_scratch_for_rows(void)
{
    CHECK(ct_lce_scratch_bytes_for_rows(0, 8, 100, CT_DTYPE_F32) == 0);
    CHECK(ct_lce_scratch_bytes_for_rows(8, 0, 100, CT_DTYPE_F32) == 0);
    CHECK(ct_lce_scratch_bytes_for_rows(8, 8, -1, CT_DTYPE_F32) == 0);
    CHECK(ct_lce_scratch_bytes_for_rows(8, 8, 100, CT_DTYPE_I64) == 0);
    CHECK(ct_lce_scratch_bytes_for_rows(INT32_MAX, INT32_MAX, INT32_MAX, CT_DTYPE_F32) == 0);
    CHECK(ct_lce_scratch_bytes_for_rows((int64_t)1 << 40, 8, 100, CT_DTYPE_F32) == 0);
    int64_t rows = 64, N = 3 * rows, D = 24, V = 2000; /* three blocks of 64 */
    size_t b32 = ct_lce_scratch_bytes_for_rows(rows, D, V, CT_DTYPE_F32);
    size_t b16 = ct_lce_scratch_bytes_for_rows(rows, D, V, CT_DTYPE_BF16);
    CHECK(b32 >= (size_t)(rows * V) * 4);
    CHECK(b16 >= b32 + (size_t)(rows * D) * 4); /* h widened */
    CHECK(ct_lce_scratch_bytes_for_rows(2 * rows, D, V, CT_DTYPE_F32) > b32);
    prob p = make(N, D, V, false);
    float l0, l1, *dh0 = malloc(4 * (size_t)(N * D)), *dw0 = malloc(4 * (size_t)(V * D));
    float *dh1 = malloc(4 * (size_t)(N * D)), *dw1 = malloc(4 * (size_t)(V * D));
    uint16_t *hb = malloc(2 * (size_t)(N * D)), *wb = malloc(2 * (size_t)(V * D));
    ct_convert_f32_to_bf16(hb, p.h, (size_t)(N * D));
    ct_convert_f32_to_bf16(wb, p.w, (size_t)(V * D));
    for (int bf = 0; bf < 2; bf++) {
        ct_lce_inputs in = {p.h, p.w, NULL, CT_DTYPE_F32, p.y, CT_DTYPE_I64, N, D, V};
        if (bf) in.h = hb, in.weight = wb, in.dtype = CT_DTYPE_BF16;
        ct_ce_outputs o0 = {&l0, NULL, NULL}, o1 = {&l1, NULL, NULL};
        ct_lce_grads g0 = {dh0, dw0, NULL, false}, g1 = {dh1, dw1, NULL, false};
        p.o.scratch_bytes = 0;
        CHECK_OK(ct_linear_cross_entropy_forward_backward(&o0, &g0, NULL, &in, &p.o));
        p.o.scratch_bytes = bf ? b16 : b32;
        ct_memory_stats_t a, b;
        ct_memory_stats(&a);
        ct_memory_reset_peak();
        CHECK_OK(ct_linear_cross_entropy_forward_backward(&o1, &g1, NULL, &in, &p.o));
        ct_memory_stats(&b);
        CHECK(b.peak_bytes - a.current_bytes <= p.o.scratch_bytes);
        CHECK(b.peak_bytes - a.current_bytes >= (size_t)(rows * V) * 4);
        CHECK(fabsf(l0 - l1) <= 1e-5f * (1 + fabsf(l0)));
        double e = 0, m = 0;
        for (int64_t i = 0; i < N * D; i++) e = fmax(e, fabs(dh0[i] - dh1[i])), m = fmax(m, fabs(dh0[i]));
        for (int64_t i = 0; i < V * D; i++) e = fmax(e, fabs(dw0[i] - dw1[i])), m = fmax(m, fabs(dw0[i]));
        CHECK(e <= 1e-5 * (m + 1e-12));
    }
    free(dh0), free(dw0), free(dh1), free(dw1), free(hb), free(wb);
    drop(&p);
}

/* Finite differences validate the reference's analytic gradient (z-loss, smoothing,
 * weights, softcap all on). */
static void test_reference_gradient(void)
{
    prob p = make(5, 4, 6, true);
    float cw[6] = {0.5f, 1, 1.5f, 2, 0.7f, 1.2f};
    p.o.class_weight = cw;
    p.o.label_smoothing = 0.2f;
    p.o.z_loss = 0.05f;
    p.o.softcap = 1.5f;
    float one = 1;
    double dz[30];
    ref_loss(&p, &one, dz, NULL, NULL);
    float dh[20], dw[24], db[6];
    ref_grads(&p, dz, dh, dw, db);
    int ok = 1;
    for (int i = 0; i < 20; i++) {
        float keep = p.h[i];
        p.h[i] = keep + 1e-3f;
        double up = ref_loss(&p, &one, NULL, NULL, NULL);
        p.h[i] = keep - 1e-3f;
        double dn = ref_loss(&p, &one, NULL, NULL, NULL);
        p.h[i] = keep;
        double fd = (up - dn) / (double)((keep + 1e-3f) - (keep - 1e-3f));
        if (fabs(fd - dh[i]) > 1e-3 * (1 + fabs(fd))) ok = 0;
    }
    CHECK(ok);
    drop(&p);
}

int main(void)
{
    test_options();
    test_edge_cases();
    test_bf16();
    test_accumulate();
    test_determinism();
    test_memory_bound();
    test_scratch_for_rows();
    test_reference_gradient();
    if (ct_set_isa(CT_ISA_SCALAR) == CT_OK) { /* the scalar path passes the same checks */
        test_options();
        test_determinism();
    }
    return t_report("test_loss");
}

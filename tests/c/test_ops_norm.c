/* RMSNorm, LayerNorm and RoPE: forward against double references, backward against finite
 * differences of those references, scalar vs each vector ISA, bf16, edge sizes, in-place use,
 * bitwise determinism across thread counts (weight gradients included), bad arguments. */
#include "test_util.h"

#include "core/internal.h"

#include <stdint.h>

static ct_isa isas[CT_ISA_COUNT];
static int n_isas;

/* ---- double references ----------------------------------------------------------------- */

/* out = norm(x) (rms: kind 0, layer: kind 1) with optional weight/bias, all in double. */
static void ref_norm(int kind, double *out, const double *x, const double *w, const double *b,
                     int64_t N, int64_t C, double eps)
{
    for (int64_t n = 0; n < N; n++) {
        const double *r = x + n * C;
        double m = 0, v = 0;
        if (kind == 1) {
            for (int64_t c = 0; c < C; c++)
                m += r[c];
            m /= (double)C;
        }
        for (int64_t c = 0; c < C; c++)
            v += (r[c] - m) * (r[c] - m);
        double rs = 1.0 / sqrt(v / (double)C + eps);
        for (int64_t c = 0; c < C; c++) {
            double o = (r[c] - m) * rs;
            if (w) o *= w[c];
            if (b) o += b[c];
            out[n * C + c] = o;
        }
    }
}

/* L = sum(norm(x) * G) */
static double ref_loss(int kind, const double *x, const double *w, const double *b, const double *G,
                       int64_t N, int64_t C, double eps, double *scratch)
{
    ref_norm(kind, scratch, x, w, b, N, C, eps);
    double s = 0;
    for (int64_t i = 0; i < N * C; i++)
        s += scratch[i] * G[i];
    return s;
}

/* Finite-difference gradient of ref_loss with respect to every element of v (v is x, w or b). */
static void fd_grad(int kind, double *v, int64_t len, float *grad, double *x, double *w, double *b,
                    const double *G, int64_t N, int64_t C, double eps, double *scratch)
{
    for (int64_t i = 0; i < len; i++) {
        double keep = v[i], h = 1e-6 * (1.0 + fabs(keep));
        v[i] = keep + h;
        double lp = ref_loss(kind, x, w, b, G, N, C, eps, scratch);
        v[i] = keep - h;
        double lm = ref_loss(kind, x, w, b, G, N, C, eps, scratch);
        v[i] = keep;
        grad[i] = (float)((lp - lm) / (2 * h));
    }
}

static void to_double(double *d, const float *f, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        d[i] = f[i];
}

/* ---- norms: forward and backward -------------------------------------------------------- */

#define MAXE (9 * 70)

static ct_status norm_fwd(int kind, float *out, float *mean, float *rstd, const float *x,
                          const float *w, const float *b, int64_t N, int64_t C, float eps)
{
    if (kind == 0) return ct_rmsnorm_forward(out, rstd, x, w, N, C, eps);
    return ct_layernorm_forward(out, mean, rstd, x, w, b, N, C, eps);
}

static ct_status norm_bwd(int kind, float *dx, float *dw, float *db, const float *g, const float *x,
                          const float *w, const float *mean, const float *rstd, int64_t N,
                          int64_t C)
{
    if (kind == 0) return ct_rmsnorm_backward(dx, dw, g, x, w, rstd, N, C);
    return ct_layernorm_backward(dx, dw, db, g, x, w, mean, rstd, N, C);
}

static void test_norms(void)
{
    static const int64_t Ns[] = {0, 1, 3, 9};
    static const int64_t Cs[] = {1, 2, 7, 8, 17, 70};
    static float x[MAXE], w[70], b[70], out[MAXE], ref[MAXE], g[MAXE], dx[MAXE], fdx[MAXE];
    static float mean[9], rstd[9], dw[70], db[70], fdw[70], fdb[70], tmp[MAXE];
    static double xd[MAXE], wd[70], bd[70], Gd[MAXE], od[MAXE], scratch[MAXE];
    const float eps = 1e-5f;
    for (int ii = 0; ii < n_isas; ii++) {
        CHECK_OK(ct_set_isa(isas[ii]));
        for (int kind = 0; kind < 2; kind++)
            for (int a = 0; a < 4; a++)
                for (int c = 0; c < 6; c++)
                    for (int affine = 0; affine < 2; affine++) {
                        int64_t N = Ns[a], C = Cs[c], NC = N * C;
                        char what[96];
                        snprintf(what, sizeof what, "%s %s N=%lld C=%lld affine=%d",
                                 kind ? "layernorm" : "rmsnorm", ct_isa_name(isas[ii]),
                                 (long long)N, (long long)C, affine);
                        t_fill(x, (size_t)NC, -2.0f, 3.0f);
                        t_fill(w, (size_t)C, 0.5f, 1.5f);
                        t_fill(b, (size_t)C, -0.5f, 0.5f);
                        t_fill(g, (size_t)NC, -1.0f, 1.0f);
                        const float *wp = affine ? w : NULL, *bp = affine && kind ? b : NULL;
                        double *wdp = affine ? wd : NULL, *bdp = affine && kind ? bd : NULL;
                        to_double(xd, x, NC);
                        to_double(wd, w, C);
                        to_double(bd, b, C);
                        to_double(Gd, g, NC);
                        CHECK_OK(norm_fwd(kind, out, mean, rstd, x, wp, bp, N, C, eps));
                        ref_norm(kind, od, xd, wdp, bdp, N, C, eps);
                        for (int64_t i = 0; i < NC; i++)
                            ref[i] = (float)od[i];
                        CHECK(t_close(out, ref, (size_t)NC, 1e-5, 1e-5, what));
                        for (int64_t n = 0; n < N; n++) {
                            double m = 0, v = 0;
                            for (int64_t k = 0; k < C; k++)
                                m += kind ? xd[n * C + k] : 0;
                            m /= (double)C;
                            for (int64_t k = 0; k < C; k++)
                                v += (xd[n * C + k] - m) * (xd[n * C + k] - m);
                            float rr = (float)(1.0 / sqrt(v / (double)C + eps));
                            CHECK(fabsf(rstd[n] - rr) <= 1e-5f * rr);
                            if (kind) CHECK(fabsf(mean[n] - (float)m) <= 1e-5f);
                        }
                        /* backward: dweight/dbias accumulate onto 0.25 */
                        for (int64_t k = 0; k < C; k++)
                            dw[k] = db[k] = 0.25f;
                        CHECK_OK(norm_bwd(kind, dx, affine ? dw : NULL, affine ? db : NULL, g, x,
                                          wp, mean, rstd, N, C));
                        fd_grad(kind, xd, NC, fdx, xd, wdp, bdp, Gd, N, C, eps, scratch);
                        CHECK(t_close(dx, fdx, (size_t)NC, 2e-4, 1e-3, what));
                        if (affine) {
                            fd_grad(kind, wd, C, fdw, xd, wd, bdp, Gd, N, C, eps, scratch);
                            for (int64_t k = 0; k < C; k++)
                                fdw[k] += 0.25f;
                            CHECK(t_close(dw, fdw, (size_t)C, 2e-4, 1e-4, what));
                            if (kind) {
                                fd_grad(kind, bd, C, fdb, xd, wd, bd, Gd, N, C, eps, scratch);
                                for (int64_t k = 0; k < C; k++)
                                    fdb[k] += 0.25f;
                                CHECK(t_close(db, fdb, (size_t)C, 2e-4, 1e-4, what));
                            }
                        }
                        /* in place: out == inp forward, dinp == dout backward */
                        memcpy(tmp, x, (size_t)NC * sizeof(float));
                        CHECK_OK(norm_fwd(kind, tmp, NULL, NULL, tmp, wp, bp, N, C, eps));
                        CHECK(memcmp(tmp, out, (size_t)NC * sizeof(float)) == 0);
                        memcpy(tmp, g, (size_t)NC * sizeof(float));
                        CHECK_OK(norm_bwd(kind, tmp, NULL, NULL, tmp, x, wp, mean, rstd, N, C));
                        CHECK(memcmp(tmp, dx, (size_t)NC * sizeof(float)) == 0);
                    }
    }
}

/* bf16 kernels equal the f32 kernels on bf16-rounded data up to bf16 rounding; their f32
 * statistics and weight gradients match closely. */
static void test_norms_bf16(void)
{
    enum { N = 5, C = 77 };
    static float x[N * C], w[C], b[C], g[N * C], out[N * C], dx[N * C], t[N * C];
    static float mean[N], rstd[N], mb[N], rb[N], dw[C], db[C], dwb[C], dbb[C];
    static uint16_t xh[N * C], wh[C], bh[C], gh[N * C], oh[N * C], dxh[N * C];
    for (int ii = 0; ii < n_isas; ii++) {
        CHECK_OK(ct_set_isa(isas[ii]));
        for (int kind = 0; kind < 2; kind++) {
            t_fill(x, N * C, -2.0f, 3.0f);
            t_fill(w, C, 0.5f, 1.5f);
            t_fill(b, C, -0.5f, 0.5f);
            t_fill(g, N * C, -1.0f, 1.0f);
            ct_convert_f32_to_bf16(xh, x, N * C);
            ct_convert_f32_to_bf16(wh, w, C);
            ct_convert_f32_to_bf16(bh, b, C);
            ct_convert_f32_to_bf16(gh, g, N * C);
            ct_convert_bf16_to_f32(x, xh, N * C);
            ct_convert_bf16_to_f32(w, wh, C);
            ct_convert_bf16_to_f32(b, bh, C);
            ct_convert_bf16_to_f32(g, gh, N * C);
            memset(dw, 0, sizeof dw);
            memset(db, 0, sizeof db);
            memset(dwb, 0, sizeof dwb);
            memset(dbb, 0, sizeof dbb);
            CHECK_OK(norm_fwd(kind, out, mean, rstd, x, w, b, N, C, 1e-6f));
            CHECK_OK(norm_bwd(kind, dx, dw, db, g, x, w, mean, rstd, N, C));
            if (kind == 0) {
                CHECK_OK(ct_rmsnorm_forward_bf16(oh, rb, xh, wh, N, C, 1e-6f));
                CHECK_OK(ct_rmsnorm_backward_bf16(dxh, dwb, gh, xh, wh, rb, N, C));
            } else {
                CHECK_OK(ct_layernorm_forward_bf16(oh, mb, rb, xh, wh, bh, N, C, 1e-6f));
                CHECK_OK(ct_layernorm_backward_bf16(dxh, dwb, dbb, gh, xh, wh, mb, rb, N, C));
                CHECK(t_close(mb, mean, N, 1e-6, 1e-5, "bf16 mean"));
                CHECK(t_close(dbb, db, C, 1e-5, 1e-5, "bf16 dbias"));
            }
            CHECK(t_close(rb, rstd, N, 0, 1e-5, "bf16 rstd"));
            ct_convert_bf16_to_f32(t, oh, N * C);
            CHECK(t_close(t, out, N * C, 1e-30, 4.0 / 512, "bf16 out"));
            ct_convert_bf16_to_f32(t, dxh, N * C);
            CHECK(t_close(t, dx, N * C, 1e-3, 4.0 / 512, "bf16 dinp"));
            CHECK(t_close(dwb, dw, C, 1e-5, 1e-5, "bf16 dweight"));
        }
    }
}

/* Every vector ISA's RMSNorm rows against the scalar ones. */
static void test_scalar_vs_vector(void)
{
    enum { N = 6, C = 1029 };
    static float x[N * C], w[C], g[N * C], o1[N * C], o2[N * C], d1[N * C], d2[N * C];
    static float r1[N], r2[N], w1[C], w2[C];
    t_fill(x, N * C, -3.0f, 3.0f);
    t_fill(w, C, -1.0f, 1.0f);
    t_fill(g, N * C, -1.0f, 1.0f);
    for (int ii = 0; ii < n_isas; ii++) {
        if (isas[ii] == CT_ISA_SCALAR) continue;
        char what[64];
        snprintf(what, sizeof what, "rmsnorm %s vs scalar", ct_isa_name(isas[ii]));
        memset(w1, 0, sizeof w1);
        memset(w2, 0, sizeof w2);
        CHECK_OK(ct_set_isa(CT_ISA_SCALAR));
        CHECK_OK(ct_rmsnorm_forward(o1, r1, x, w, N, C, 1e-6f));
        CHECK_OK(ct_rmsnorm_backward(d1, w1, g, x, w, r1, N, C));
        CHECK_OK(ct_set_isa(isas[ii]));
        CHECK_OK(ct_rmsnorm_forward(o2, r2, x, w, N, C, 1e-6f));
        CHECK_OK(ct_rmsnorm_backward(d2, w2, g, x, w, r1, N, C));
        CHECK(t_close(r2, r1, N, 0, 2e-6, what));
        CHECK(t_close(o2, o1, N * C, 1e-7, 4e-6, what));
        CHECK(t_close(d2, d1, N * C, 1e-6, 1e-5, what));
        CHECK(t_close(w2, w1, C, 1e-6, 1e-5, what));
    }
}

/* The same bits for 1, 2 and 3 threads, including the weight gradients (N > chunk count). */
static void test_threads(void)
{
    enum { N = 203, C = 131 };
    static float x[N * C], w[C], bias[C], g[N * C];
    static float out[3][N * C], dx[3][N * C], mean[3][N], rstd[3][N], dw[3][C], db[3][C];
    static uint16_t xh[N * C], wh[C], gh[N * C], oh[3][N * C], dxh[3][N * C];
    t_fill(x, N * C, -2.0f, 2.0f);
    t_fill(w, C, 0.5f, 1.5f);
    t_fill(bias, C, -0.5f, 0.5f);
    t_fill(g, N * C, -1.0f, 1.0f);
    ct_convert_f32_to_bf16(xh, x, N * C);
    ct_convert_f32_to_bf16(wh, w, C);
    ct_convert_f32_to_bf16(gh, g, N * C);
    int saved = ct_num_threads();
    for (int ii = 0; ii < n_isas; ii++) {
        CHECK_OK(ct_set_isa(isas[ii]));
        for (int kind = 0; kind < 3; kind++) {
            for (int t = 0; t < 3; t++) {
                CHECK_OK(ct_set_num_threads(t + 1));
                for (int k = 0; k < C; k++)
                    dw[t][k] = db[t][k] = 0.5f;
                if (kind == 2) {
                    CHECK_OK(ct_rmsnorm_forward_bf16(oh[t], rstd[t], xh, wh, N, C, 1e-6f));
                    CHECK_OK(ct_rmsnorm_backward_bf16(dxh[t], dw[t], gh, xh, wh, rstd[t], N, C));
                    continue;
                }
                CHECK_OK(norm_fwd(kind, out[t], mean[t], rstd[t], x, w, bias, N, C, 1e-5f));
                CHECK_OK(norm_bwd(kind, dx[t], dw[t], db[t], g, x, w, mean[t], rstd[t], N, C));
            }
            /* the chunked weight gradients against a plain double sum over all rows */
            static float rw[C], rb[C];
            for (int k = 0; k < C; k++) {
                double sw = 0.5, sb = 0.5;
                for (int n = 0; n < N; n++) {
                    double xv = kind == 2 ? ct_bf16_to_f32(xh[n * C + k]) : x[n * C + k];
                    double gv = kind == 2 ? ct_bf16_to_f32(gh[n * C + k]) : g[n * C + k];
                    sw += gv * (xv - (kind == 1 ? mean[0][n] : 0.0)) * rstd[0][n];
                    sb += gv;
                }
                rw[k] = (float)sw;
                rb[k] = (float)sb;
            }
            CHECK(t_close(dw[0], rw, C, 1e-5, 1e-5, "chunked dweight"));
            if (kind == 1) CHECK(t_close(db[0], rb, C, 1e-5, 1e-5, "chunked dbias"));
            for (int t = 1; t < 3; t++) {
                if (kind == 2) {
                    CHECK(memcmp(oh[0], oh[t], sizeof oh[0]) == 0);
                    CHECK(memcmp(dxh[0], dxh[t], sizeof dxh[0]) == 0);
                } else {
                    CHECK(memcmp(out[0], out[t], sizeof out[0]) == 0);
                    CHECK(memcmp(dx[0], dx[t], sizeof dx[0]) == 0);
                    CHECK(memcmp(mean[0], mean[t], sizeof mean[0]) == 0);
                }
                CHECK(memcmp(rstd[0], rstd[t], sizeof rstd[0]) == 0);
                CHECK(memcmp(dw[0], dw[t], sizeof dw[0]) == 0);
                CHECK(memcmp(db[0], db[t], sizeof db[0]) == 0);
            }
        }
    }
    CHECK_OK(ct_set_num_threads(saved));
}

/* Outputs bigger than the last-level cache are written with streaming stores, through a
 * buffer (src/core/memory.c, norm.c): the same bits as plain stores, for rows narrower and
 * wider than the buffer, misaligned outputs, in-place use, bf16, and 1 or 2 threads. The
 * threshold is set to 0 (everything streamed) against SIZE_MAX (nothing). */
static void norm_pass(int kind, int bf, int64_t N, int64_t C, int inplace, const float *x, const float *w,
                      const float *b, const float *g, unsigned char *out, unsigned char *dx, float *mean,
                      float *rstd, float *dw, float *db)
{
    size_t es = bf ? 2 : 4, nc = (size_t)(N * C);
    uint16_t *xh = malloc(nc * 2 + 2), *gh = malloc(nc * 2 + 2), *wh = malloc((size_t)C * 2), *bh = malloc((size_t)C * 2);
    ct_convert_f32_to_bf16(xh, x, nc), ct_convert_f32_to_bf16(gh, g, nc);
    ct_convert_f32_to_bf16(wh, w, (size_t)C), ct_convert_f32_to_bf16(bh, b, (size_t)C);
    for (int64_t k = 0; k < C; k++)
        dw[k] = db[k] = 0.25f;
    const void *in = bf ? (const void *)xh : (const void *)x, *gin = bf ? (const void *)gh : (const void *)g;
    if (inplace) { /* out is inp, dinp is dout */
        memcpy(out, in, nc * es);
        memcpy(dx, gin, nc * es);
        in = out;
    }
    const void *go = inplace ? dx : gin;
    if (!bf && kind == 0) {
        CHECK_OK(ct_rmsnorm_forward((float *)out, rstd, in, w, N, C, 1e-5f));
        CHECK_OK(ct_rmsnorm_backward((float *)dx, dw, go, inplace ? x : in, w, rstd, N, C));
    } else if (!bf) {
        CHECK_OK(ct_layernorm_forward((float *)out, mean, rstd, in, w, b, N, C, 1e-5f));
        CHECK_OK(ct_layernorm_backward((float *)dx, dw, db, go, inplace ? x : in, w, mean, rstd, N, C));
    } else if (kind == 0) {
        CHECK_OK(ct_rmsnorm_forward_bf16((uint16_t *)out, rstd, in, wh, N, C, 1e-5f));
        CHECK_OK(ct_rmsnorm_backward_bf16((uint16_t *)dx, dw, go, inplace ? xh : in, wh, rstd, N, C));
    } else {
        CHECK_OK(ct_layernorm_forward_bf16((uint16_t *)out, mean, rstd, in, wh, bh, N, C, 1e-5f));
        CHECK_OK(ct_layernorm_backward_bf16((uint16_t *)dx, dw, db, go, inplace ? xh : in, wh, mean, rstd, N, C));
    }
    free(xh), free(gh), free(wh), free(bh);
}

static void test_stream_stores(void)
{
    static const int64_t shapes[][2] = {{5, 1}, {7, 3}, {33, 37}, {9, 2048}, {3, 5000}, {2, 20000}, {70, 300}};
    int saved = ct_num_threads();
    size_t saved_min = ct_stream_set_min_bytes(SIZE_MAX);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int64_t N = shapes[si][0], C = shapes[si][1];
        size_t nc = (size_t)(N * C);
        float *x = malloc(nc * 4), *g = malloc(nc * 4), *w = malloc((size_t)C * 4), *b = malloc((size_t)C * 4);
        t_fill(x, nc, -2.0f, 2.0f), t_fill(g, nc, -1.0f, 1.0f);
        t_fill(w, (size_t)C, 0.5f, 1.5f), t_fill(b, (size_t)C, -0.5f, 0.5f);
        for (int kind = 0; kind < 2; kind++)
            for (int bf = 0; bf < 2; bf++)
                for (int inplace = 0; inplace < 2; inplace++) {
                    /* [0]: plain stores; [1], [2]: streamed at 1 and 2 threads; outputs 4 bytes
                     * past an aligned block (misaligned for the 16-byte streaming stores) */
                    unsigned char *ob[3], *db_[3];
                    float *mean[3], *rstd[3], *dw[3], *dbias[3];
                    for (int v = 0; v < 3; v++) {
                        ob[v] = malloc(nc * 4 + 64), db_[v] = malloc(nc * 4 + 64);
                        memset(ob[v], 0, nc * 4 + 64), memset(db_[v], 0, nc * 4 + 64);
                        mean[v] = calloc((size_t)N, 4), rstd[v] = calloc((size_t)N, 4);
                        dw[v] = calloc((size_t)C, 4), dbias[v] = calloc((size_t)C, 4);
                        ct_stream_set_min_bytes(v ? 0 : SIZE_MAX);
                        CHECK_OK(ct_set_num_threads(v == 2 ? 2 : 1));
                        norm_pass(kind, bf, N, C, inplace, x, w, b, g, ob[v] + 4, db_[v] + 4, mean[v], rstd[v],
                                  dw[v], dbias[v]);
                    }
                    ct_stream_set_min_bytes(SIZE_MAX);
                    size_t es = bf ? 2 : 4;
                    for (int v = 1; v < 3; v++) {
                        int same = !memcmp(ob[0], ob[v], nc * es + 8) && !memcmp(db_[0], db_[v], nc * es + 8) &&
                                   !memcmp(rstd[0], rstd[v], (size_t)N * 4) && !memcmp(dw[0], dw[v], (size_t)C * 4) &&
                                   (kind == 0 || (!memcmp(mean[0], mean[v], (size_t)N * 4) &&
                                                  !memcmp(dbias[0], dbias[v], (size_t)C * 4)));
                        if (!same)
                            printf("  streamed %s%s N=%lld C=%lld%s at %d thread(s) differs from plain stores\n",
                                   kind ? "layernorm" : "rmsnorm", bf ? " bf16" : "", (long long)N, (long long)C,
                                   inplace ? " in place" : "", v);
                        CHECK(same);
                    }
                    for (int v = 0; v < 3; v++)
                        free(ob[v]), free(db_[v]), free(mean[v]), free(rstd[v]), free(dw[v]), free(dbias[v]);
                }
        free(x), free(g), free(w), free(b);
    }
    ct_stream_set_min_bytes(saved_min);
    CHECK_OK(ct_set_num_threads(saved));
}

static void test_norm_bad_args(void)
{
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8], r[2], m[2];
    uint16_t h[8] = {0};
    CHECK_STATUS(ct_rmsnorm_forward(NULL, r, x, NULL, 2, 4, 1e-5f), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "out") != NULL);
    CHECK_STATUS(ct_rmsnorm_forward(y, r, NULL, NULL, 2, 4, 1e-5f), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "inp") != NULL);
    CHECK_STATUS(ct_rmsnorm_forward(y, r, x, NULL, -1, 4, 1e-5f), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "N must be >= 0") != NULL);
    CHECK_STATUS(ct_rmsnorm_forward(y, r, x, NULL, 2, 0, 1e-5f), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "C must be >= 1") != NULL);
    CHECK_STATUS(ct_rmsnorm_forward(y, r, x, NULL, 2, -4, 1e-5f), CT_EINVAL);
    CHECK_STATUS(ct_rmsnorm_forward(y, r, x, NULL, 2, 4, -1e-5f), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "eps") != NULL);
    CHECK_STATUS(ct_rmsnorm_forward(y, r, x, NULL, 2, 4, NAN), CT_EINVAL);
    CHECK_STATUS(ct_rmsnorm_forward(y, r, x, NULL, 2, 4, INFINITY), CT_EINVAL);
    CHECK_STATUS(ct_rmsnorm_backward(y, NULL, x, x, NULL, NULL, 2, 4), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "rstd") != NULL);
    CHECK_STATUS(ct_rmsnorm_backward(NULL, NULL, x, x, NULL, r, 2, 4), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "dinp") != NULL);
    CHECK_STATUS(ct_rmsnorm_backward(y, NULL, NULL, x, NULL, r, 2, 4), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "dout") != NULL);
    CHECK_STATUS(ct_rmsnorm_forward_bf16(h, r, NULL, NULL, 2, 4, 1e-5f), CT_EINVAL);
    CHECK_STATUS(ct_rmsnorm_backward_bf16(h, NULL, h, h, NULL, NULL, 2, 4), CT_EINVAL);
    CHECK_STATUS(ct_layernorm_forward(y, m, r, x, NULL, NULL, 2, 4, -1.0f), CT_EINVAL);
    CHECK_STATUS(ct_layernorm_forward(y, m, r, NULL, NULL, NULL, 2, 4, 1e-5f), CT_EINVAL);
    CHECK_STATUS(ct_layernorm_backward(y, NULL, NULL, x, x, NULL, NULL, r, 2, 4), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "mean") != NULL);
    CHECK_STATUS(ct_layernorm_backward(y, NULL, NULL, x, x, NULL, m, NULL, 2, 4), CT_EINVAL);
    CHECK_STATUS(ct_layernorm_forward_bf16(h, m, r, h, h, h, 2, -4, 1e-5f), CT_EINVAL);
    CHECK_STATUS(ct_layernorm_backward_bf16(h, NULL, NULL, NULL, h, NULL, m, r, 2, 4), CT_EINVAL);
    CHECK_STATUS(ct_rmsnorm_forward(y, r, x, NULL, INT64_MAX / 2, 4, 1e-5f), CT_EOVERFLOW);
    /* empty is fine with NULLs */
    CHECK_OK(ct_rmsnorm_forward(NULL, NULL, NULL, NULL, 0, 4, 1e-5f));
    CHECK_OK(ct_rmsnorm_forward(NULL, NULL, NULL, NULL, 0, 0, 1e-5f));
    CHECK_OK(ct_rmsnorm_backward(NULL, NULL, NULL, NULL, NULL, NULL, 0, 4));
    CHECK_OK(ct_layernorm_backward(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, 3));
}

/* ---- RoPE -------------------------------------------------------------------------------- */

static void ref_rope(double *out, const float *x, const int32_t *pos, int64_t B, int64_t T,
                     int64_t H, int64_t E, double base, double sign)
{
    int64_t P = E / 2;
    for (int64_t bb = 0; bb < B; bb++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < H; h++) {
                int64_t o = ((bb * T + t) * H + h) * E;
                double p = pos ? pos[t] : (double)t;
                for (int64_t i = 0; i < P; i++) {
                    double ang = p * pow(base, -2.0 * (double)i / (double)E);
                    double c = cos(ang), s = sign * sin(ang);
                    double x1 = x[o + i], x2 = x[o + P + i];
                    out[o + i] = x1 * c - x2 * s;
                    out[o + P + i] = x2 * c + x1 * s;
                }
            }
}

static void test_rope(void)
{
    enum { B = 2, T = 5, H = 3, E = 10, NE = B * T * H * E };
    static float x[NE], y[NE], r[NE], d[NE], g[NE], z[NE];
    static double od[NE];
    const int32_t pos[T] = {7, 0, 3, 100, -2};
    for (int withpos = 0; withpos < 2; withpos++) {
        const int32_t *pp = withpos ? pos : NULL;
        t_fill(x, NE, -2.0f, 2.0f);
        t_fill(g, NE, -1.0f, 1.0f);
        CHECK_OK(ct_rope_forward(y, x, pp, B, T, H, E, 10000.0f));
        ref_rope(od, x, pp, B, T, H, E, 10000.0, 1.0);
        for (int i = 0; i < NE; i++)
            r[i] = (float)od[i];
        /* f32 angles as HF: position 100 rounds the angle by ~1e-5 */
        CHECK(t_close(y, r, NE, 3e-5, 1e-5, "rope fwd"));
        CHECK_OK(ct_rope_backward(d, g, pp, B, T, H, E, 10000.0f));
        ref_rope(od, g, pp, B, T, H, E, 10000.0, -1.0);
        for (int i = 0; i < NE; i++)
            r[i] = (float)od[i];
        CHECK(t_close(d, r, NE, 3e-5, 1e-5, "rope bwd"));
        /* the backward is the adjoint: <rope(x), g> == <x, rope_bwd(g)> */
        double l = 0, rr = 0;
        for (int i = 0; i < NE; i++)
            l += (double)y[i] * g[i], rr += (double)x[i] * d[i];
        CHECK(fabs(l - rr) < 1e-4 * (1 + fabs(l)));
        /* finite difference of L = sum(rope(x) * g) in x, on a few entries */
        for (int i = 0; i < NE; i += 13) {
            double h = 1e-3, keep = x[i];
            x[i] = (float)(keep + h);
            CHECK_OK(ct_rope_forward(z, x, pp, B, T, H, E, 10000.0f));
            double lp = 0;
            for (int k = 0; k < NE; k++)
                lp += (double)z[k] * g[k];
            x[i] = (float)(keep - h);
            CHECK_OK(ct_rope_forward(z, x, pp, B, T, H, E, 10000.0f));
            double lm = 0;
            for (int k = 0; k < NE; k++)
                lm += (double)z[k] * g[k];
            x[i] = (float)keep;
            CHECK(fabs((lp - lm) / (2 * h) - d[i]) < 1e-3);
        }
        /* inverse: backward(forward(x)) == x; in place */
        memcpy(z, x, sizeof x);
        CHECK_OK(ct_rope_forward(z, z, pp, B, T, H, E, 500000.0f));
        CHECK_OK(ct_rope_backward(z, z, pp, B, T, H, E, 500000.0f));
        CHECK(t_close(z, x, NE, 1e-5, 1e-5, "rope inverse"));
        /* position 0 is the identity */
        int32_t zero[T] = {0};
        CHECK_OK(ct_rope_forward(z, x, zero, B, T, H, E, 10000.0f));
        CHECK(memcmp(z, x, sizeof x) == 0);
    }
    /* E = 2 (one pair), T = 1 */
    float a[2] = {1.0f, 0.0f}, o[2];
    int32_t p1 = 1;
    CHECK_OK(ct_rope_forward(o, a, &p1, 1, 1, 1, 2, 10000.0f));
    CHECK(fabsf(o[0] - cosf(1.0f)) < 1e-6f && fabsf(o[1] - sinf(1.0f)) < 1e-6f);
    /* thread determinism */
    static float y1[NE], y2[NE];
    int saved = ct_num_threads();
    CHECK_OK(ct_set_num_threads(1));
    CHECK_OK(ct_rope_forward(y1, x, pos, B, T, H, E, 10000.0f));
    CHECK_OK(ct_set_num_threads(2));
    CHECK_OK(ct_rope_forward(y2, x, pos, B, T, H, E, 10000.0f));
    CHECK(memcmp(y1, y2, sizeof y1) == 0);
    CHECK_OK(ct_set_num_threads(saved));
    /* bad arguments */
    CHECK_STATUS(ct_rope_forward(y, x, NULL, B, T, H, 9, 10000.0f), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "even") != NULL);
    CHECK_STATUS(ct_rope_forward(y, x, NULL, B, T, H, E, 0.0f), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "base") != NULL);
    CHECK_STATUS(ct_rope_forward(y, x, NULL, B, T, H, E, -1.0f), CT_EINVAL);
    CHECK_STATUS(ct_rope_forward(y, x, NULL, B, T, H, E, NAN), CT_EINVAL);
    CHECK_STATUS(ct_rope_forward(y, x, NULL, -1, T, H, E, 10000.0f), CT_EINVAL);
    CHECK_STATUS(ct_rope_forward(NULL, x, NULL, B, T, H, E, 10000.0f), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "out") != NULL);
    CHECK_STATUS(ct_rope_backward(y, NULL, NULL, B, T, H, E, 10000.0f), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "dout") != NULL);
    CHECK_STATUS(ct_rope_forward(y, x, NULL, INT64_MAX, 2, 1, 2, 10000.0f), CT_EOVERFLOW);
    CHECK_OK(ct_rope_forward(NULL, NULL, NULL, 0, T, H, E, 10000.0f));
    CHECK_OK(ct_rope_forward(NULL, NULL, NULL, B, T, H, 0, 10000.0f));
}

int main(void)
{
    for (int i = 0; i < CT_ISA_COUNT; i++) { /* every instruction set this CPU has */
        if (ct_set_isa((ct_isa)i) == CT_OK)
            isas[n_isas++] = (ct_isa)i;
        else
            printf("test_ops_norm: %s SKIPPED: %s lacks it\n", ct_isa_name((ct_isa)i), ct_cpu_name());
    }
    test_norms();
    test_norms_bf16();
    test_scalar_vs_vector();
    test_threads();
    test_stream_stores();
    test_norm_bad_args();
    test_rope();
    return t_report("test_ops_norm");
}

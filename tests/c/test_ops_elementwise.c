/* Element-wise kernels and activations: each ISA against double-precision references,
 * backward against finite differences of those references, scalar vs each vector ISA, bf16,
 * edge sizes, in-place use, thread-count determinism and bad arguments. */
#include "test_util.h"

#include "core/internal.h"

#include <stdint.h>

#define NMAX 1200

static const int64_t sizes[] = {0, 1, 2, 7, 8, 9, 15, 16, 17, 33, 1000};
#define NSIZES ((int)(sizeof sizes / sizeof sizes[0]))

static ct_isa isas[CT_ISA_COUNT];
static int n_isas;

/* ---- double references ------------------------------------------------------------- */

static double ref_act(double x, int kind)
{
    if (kind == 0) return 0.5 * x * erfc(-x / sqrt(2.0));
    if (kind == 1) {
        double u = sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
        return 0.5 * x * (1.0 + tanh(u));
    }
    return x / (1.0 + exp(-x));
}

/* Central difference of the reference. */
static double fd_act(double x, int kind)
{
    double h = 1e-5 * (1.0 + fabs(x));
    return (ref_act(x + h, kind) - ref_act(x - h, kind)) / (2 * h);
}

static ct_status run_fwd(int kind, float *out, const float *inp, int64_t n)
{
    if (kind == 2) return ct_silu_forward(out, inp, n);
    return ct_gelu_forward(out, inp, n, (ct_gelu_approx)kind);
}

static ct_status run_bwd(int kind, float *dinp, const float *dout, const float *inp, int64_t n)
{
    if (kind == 2) return ct_silu_backward(dinp, dout, inp, n);
    return ct_gelu_backward(dinp, dout, inp, n, (ct_gelu_approx)kind);
}

static ct_status run_fwd_bf16(int kind, uint16_t *out, const uint16_t *inp, int64_t n)
{
    if (kind == 2) return ct_silu_forward_bf16(out, inp, n);
    return ct_gelu_forward_bf16(out, inp, n, (ct_gelu_approx)kind);
}

static ct_status run_bwd_bf16(int kind, uint16_t *dinp, const uint16_t *dout, const uint16_t *inp,
                              int64_t n)
{
    if (kind == 2) return ct_silu_backward_bf16(dinp, dout, inp, n);
    return ct_gelu_backward_bf16(dinp, dout, inp, n, (ct_gelu_approx)kind);
}

static const char *kind_name[] = {"gelu", "gelu_tanh", "silu"};

/* Inputs: random in [-8, 8] with some special values mixed in. */
static void fill_act(float *x, int64_t n)
{
    static const float special[] = {0.0f,  -0.0f,  1e-30f, -1e-30f, 1e-4f, -3.0f,
                                    20.0f, -20.0f, -90.0f, 90.0f,   1e6f,  -1e6f};
    t_fill(x, (size_t)n, -8.0f, 8.0f);
    for (int64_t i = 0; i < n; i += 7)
        x[i] = special[(i / 7) % 12];
}

/* ---- activations: forward and backward against references ------------------------- */

static void test_activations(void)
{
    static float x[NMAX], y[NMAX], g[NMAX], d[NMAX], ry[NMAX], rd[NMAX];
    for (int ii = 0; ii < n_isas; ii++) {
        CHECK_OK(ct_set_isa(isas[ii]));
        for (int kind = 0; kind < 3; kind++) {
            for (int si = 0; si < NSIZES; si++) {
                int64_t n = sizes[si];
                fill_act(x, n);
                t_fill(g, (size_t)n, -1.0f, 1.0f);
                for (int64_t i = 0; i < n; i++) {
                    ry[i] = (float)ref_act(x[i], kind);
                    rd[i] = (float)(g[i] * fd_act(x[i], kind));
                }
                CHECK_OK(run_fwd(kind, y, x, n));
                char what[64];
                snprintf(what, sizeof what, "%s fwd %s n=%lld", kind_name[kind],
                         ct_isa_name(isas[ii]), (long long)n);
                CHECK(t_close(y, ry, (size_t)n, 1e-7, 2e-6, what));
                CHECK_OK(run_bwd(kind, d, g, x, n));
                snprintf(what, sizeof what, "%s bwd %s n=%lld", kind_name[kind],
                         ct_isa_name(isas[ii]), (long long)n);
                CHECK(t_close(d, rd, (size_t)n, 1e-6, 1e-5, what));
                /* in place: out == inp, dinp == dout */
                float tmp[NMAX];
                memcpy(tmp, x, (size_t)n * sizeof(float));
                CHECK_OK(run_fwd(kind, tmp, tmp, n));
                CHECK(memcmp(tmp, y, (size_t)n * sizeof(float)) == 0);
                memcpy(tmp, g, (size_t)n * sizeof(float));
                CHECK_OK(run_bwd(kind, tmp, tmp, x, n));
                CHECK(memcmp(tmp, d, (size_t)n * sizeof(float)) == 0);
            }
        }
    }
}

/* NaN and infinities pass through like PyTorch's. */
static void test_specials(void)
{
    float x[4] = {NAN, INFINITY, -INFINITY, 0.0f}, y[4], d[4], g[4] = {1, 1, 1, 1};
    for (int ii = 0; ii < n_isas; ii++) {
        CHECK_OK(ct_set_isa(isas[ii]));
        for (int kind = 0; kind < 3; kind++) {
            CHECK_OK(run_fwd(kind, y, x, 4));
            CHECK(isnan(y[0]));
            CHECK(y[1] == INFINITY);
            CHECK(y[3] == 0.0f);
            CHECK_OK(run_bwd(kind, d, g, x, 4));
            CHECK(isnan(d[0]));
            CHECK(fabsf(d[3] - 0.5f) < 1e-6f);
        }
    }
}

/* Every vector ISA's polynomials agree with the libm scalar path to a few ulp. */
static void test_scalar_vs_vector(void)
{
    enum { N = 4099 };
    static float x[N], g[N], ys[N], ya[N], ds[N], da[N];
    t_fill(x, N, -12.0f, 12.0f);
    t_fill(g, N, -1.0f, 1.0f);
    for (int ii = 0; ii < n_isas; ii++) {
        if (isas[ii] == CT_ISA_SCALAR) continue;
        for (int kind = 0; kind < 3; kind++) {
            char what[64];
            snprintf(what, sizeof what, "%s %s vs scalar", kind_name[kind], ct_isa_name(isas[ii]));
            CHECK_OK(ct_set_isa(CT_ISA_SCALAR));
            CHECK_OK(run_fwd(kind, ys, x, N));
            CHECK_OK(run_bwd(kind, ds, g, x, N));
            CHECK_OK(ct_set_isa(isas[ii]));
            CHECK_OK(run_fwd(kind, ya, x, N));
            CHECK_OK(run_bwd(kind, da, g, x, N));
            CHECK(t_close(ya, ys, N, 1e-12, 2e-6, what));
            CHECK(t_close(da, ds, N, 1e-7, 4e-6, what));
        }
    }
}

static void test_bf16(void)
{
    static float x[NMAX], g[NMAX], y[NMAX], d[NMAX], yb[NMAX], db[NMAX];
    static uint16_t xb[NMAX], gb[NMAX], ob[NMAX], dbb[NMAX];
    for (int ii = 0; ii < n_isas; ii++) {
        CHECK_OK(ct_set_isa(isas[ii]));
        for (int kind = 0; kind < 3; kind++) {
            for (int si = 0; si < NSIZES; si++) {
                int64_t n = sizes[si];
                fill_act(x, n);
                t_fill(g, (size_t)n, -1.0f, 1.0f);
                ct_convert_f32_to_bf16(xb, x, (size_t)n);
                ct_convert_f32_to_bf16(gb, g, (size_t)n);
                ct_convert_bf16_to_f32(x, xb, (size_t)n);
                ct_convert_bf16_to_f32(g, gb, (size_t)n);
                CHECK_OK(run_fwd(kind, y, x, n));
                CHECK_OK(run_bwd(kind, d, g, x, n));
                CHECK_OK(run_fwd_bf16(kind, ob, xb, n));
                CHECK_OK(run_bwd_bf16(kind, dbb, gb, xb, n));
                ct_convert_bf16_to_f32(yb, ob, (size_t)n);
                ct_convert_bf16_to_f32(db, dbb, (size_t)n);
                CHECK(t_close(yb, y, (size_t)n, 1e-30, 4.0 / 512, "bf16 fwd"));
                CHECK(t_close(db, d, (size_t)n, 1e-30, 4.0 / 512, "bf16 bwd"));
                /* exactly the f32 result rounded once, except where the two ISAs' last
                 * bits straddle a rounding boundary */
                int exact = 0;
                for (int64_t i = 0; i < n; i++)
                    exact += ob[i] == ct_f32_to_bf16(y[i]);
                CHECK(exact >= n - n / 50 - 1);
            }
        }
    }
}

/* ---- SwiGLU ------------------------------------------------------------------------ */

static double ref_silu(double x)
{
    return x / (1.0 + exp(-x));
}

static void test_swiglu(void)
{
    static const int64_t Ns[] = {0, 1, 3, 5};
    static const int64_t Hs[] = {0, 1, 7, 8, 13, 40};
    static float inp[5 * 80], out[5 * 40], dout[5 * 40], dinp[5 * 80], r[5 * 80];
    static uint16_t ib[5 * 80], ob[5 * 40], gb[5 * 40], dib[5 * 80];
    static float tmp[5 * 80];
    for (int ii = 0; ii < n_isas; ii++) {
        CHECK_OK(ct_set_isa(isas[ii]));
        for (int a = 0; a < 4; a++)
            for (int b = 0; b < 6; b++) {
                int64_t N = Ns[a], H = Hs[b];
                t_fill(inp, (size_t)(N * 2 * H), -6.0f, 6.0f);
                t_fill(dout, (size_t)(N * H), -1.0f, 1.0f);
                CHECK_OK(ct_swiglu_forward(out, inp, N, H));
                for (int64_t n = 0; n < N; n++)
                    for (int64_t j = 0; j < H; j++)
                        r[n * H + j] =
                            (float)(ref_silu(inp[n * 2 * H + j]) * inp[n * 2 * H + H + j]);
                CHECK(t_close(out, r, (size_t)(N * H), 1e-7, 2e-6, "swiglu fwd"));
                CHECK_OK(ct_swiglu_backward(dinp, dout, inp, N, H));
                /* finite differences of sum(out * dout) on the double reference */
                for (int64_t n = 0; n < N; n++)
                    for (int64_t j = 0; j < H; j++) {
                        double av = inp[n * 2 * H + j], bv = inp[n * 2 * H + H + j];
                        double g = dout[n * H + j], h = 1e-5;
                        r[n * 2 * H + j] =
                            (float)(g * bv * (ref_silu(av + h) - ref_silu(av - h)) / (2 * h));
                        r[n * 2 * H + H + j] = (float)(g * ref_silu(av));
                    }
                CHECK(t_close(dinp, r, (size_t)(N * 2 * H), 1e-6, 1e-5, "swiglu bwd"));
                /* bf16 on the bf16-rounded data */
                ct_convert_f32_to_bf16(ib, inp, (size_t)(N * 2 * H));
                ct_convert_f32_to_bf16(gb, dout, (size_t)(N * H));
                ct_convert_bf16_to_f32(inp, ib, (size_t)(N * 2 * H));
                ct_convert_bf16_to_f32(dout, gb, (size_t)(N * H));
                CHECK_OK(ct_swiglu_forward(out, inp, N, H));
                CHECK_OK(ct_swiglu_backward(dinp, dout, inp, N, H));
                CHECK_OK(ct_swiglu_forward_bf16(ob, ib, N, H));
                CHECK_OK(ct_swiglu_backward_bf16(dib, gb, ib, N, H));
                ct_convert_bf16_to_f32(tmp, ob, (size_t)(N * H));
                CHECK(t_close(tmp, out, (size_t)(N * H), 1e-30, 4.0 / 512, "swiglu bf16 fwd"));
                ct_convert_bf16_to_f32(tmp, dib, (size_t)(N * 2 * H));
                CHECK(t_close(tmp, dinp, (size_t)(N * 2 * H), 1e-30, 4.0 / 512, "swiglu bf16 bwd"));
            }
    }
}

/* ---- arithmetic -------------------------------------------------------------------- */

static void test_arith(void)
{
    enum { N = 40000 }; /* several parallel blocks */
    static float a[N], b[N], o[N];
    t_fill(a, N, -3.0f, 3.0f);
    t_fill(b, N, -3.0f, 3.0f);
    int bad = 0;
    CHECK_OK(ct_add(o, a, b, N));
    for (int i = 0; i < N; i++)
        bad += o[i] != a[i] + b[i];
    CHECK_OK(ct_mul(o, a, b, N));
    for (int i = 0; i < N; i++)
        bad += o[i] != a[i] * b[i];
    CHECK_OK(ct_scale(o, a, -1.5f, N));
    for (int i = 0; i < N; i++)
        bad += o[i] != -1.5f * a[i];
    CHECK(bad == 0);
    memcpy(o, a, sizeof a);
    CHECK_OK(ct_add(o, o, o, N)); /* fully in place */
    for (int i = 0; i < N; i++)
        bad += o[i] != 2.0f * a[i];
    CHECK(bad == 0);
    CHECK_OK(ct_add(NULL, NULL, NULL, 0));
    CHECK_OK(ct_mul(NULL, NULL, NULL, 0));
    CHECK_OK(ct_scale(NULL, NULL, 2.0f, 0));
}

/* ---- determinism across thread counts ---------------------------------------------- */

static void test_threads(void)
{
    enum { N = 70001 };
    static float x[N], g[N], y1[N], y2[N], d1[N], d2[N];
    static float s1[N], s2[N];
    t_fill(x, N, -8.0f, 8.0f);
    t_fill(g, N, -1.0f, 1.0f);
    int saved = ct_num_threads();
    for (int ii = 0; ii < n_isas; ii++) {
        CHECK_OK(ct_set_isa(isas[ii]));
        for (int kind = 0; kind < 3; kind++) {
            CHECK_OK(ct_set_num_threads(1));
            CHECK_OK(run_fwd(kind, y1, x, N));
            CHECK_OK(run_bwd(kind, d1, g, x, N));
            CHECK_OK(ct_swiglu_forward(s1, x, 7, N / 14));
            CHECK_OK(ct_set_num_threads(2));
            CHECK_OK(run_fwd(kind, y2, x, N));
            CHECK_OK(run_bwd(kind, d2, g, x, N));
            CHECK_OK(ct_swiglu_forward(s2, x, 7, N / 14));
            CHECK(memcmp(y1, y2, sizeof y1) == 0);
            CHECK(memcmp(d1, d2, sizeof d1) == 0);
            CHECK(memcmp(s1, s2, (size_t)(7 * (N / 14)) * sizeof(float)) == 0);
        }
    }
    CHECK_OK(ct_set_num_threads(saved));
}

/* ---- bad arguments ------------------------------------------------------------------ */

static void test_bad_args(void)
{
    float x[4] = {0}, y[4];
    uint16_t h[4] = {0};
    CHECK_STATUS(ct_add(NULL, x, x, 4), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "out") != NULL);
    CHECK_STATUS(ct_add(y, x, NULL, 4), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "b is NULL") != NULL);
    CHECK_STATUS(ct_mul(y, x, x, -1), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "n must be >= 0") != NULL);
    CHECK_STATUS(ct_scale(y, NULL, 1.0f, 1), CT_EINVAL);
    CHECK_STATUS(ct_gelu_forward(y, x, 4, (ct_gelu_approx)7), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "approx") != NULL);
    CHECK_STATUS(ct_gelu_backward(y, x, x, 4, (ct_gelu_approx)-1), CT_EINVAL);
    CHECK_STATUS(ct_gelu_forward(y, NULL, 4, CT_GELU_NONE), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "inp") != NULL);
    CHECK_STATUS(ct_gelu_backward(y, NULL, x, 4, CT_GELU_TANH), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "dout") != NULL);
    CHECK_STATUS(ct_silu_forward(y, x, -3), CT_EINVAL);
    CHECK_STATUS(ct_silu_backward(NULL, x, x, 2), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "dinp") != NULL);
    CHECK_STATUS(ct_silu_forward_bf16(h, NULL, 2), CT_EINVAL);
    CHECK_STATUS(ct_gelu_forward_bf16(h, h, 2, (ct_gelu_approx)3), CT_EINVAL);
    CHECK_STATUS(ct_swiglu_forward(y, x, 1, -2), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "H must be >= 0") != NULL);
    CHECK_STATUS(ct_swiglu_forward(y, x, -1, 2), CT_EINVAL);
    CHECK_STATUS(ct_swiglu_backward(y, NULL, x, 1, 2), CT_EINVAL);
    CHECK_STATUS(ct_swiglu_backward_bf16(h, h, NULL, 1, 2), CT_EINVAL);
    CHECK_STATUS(ct_swiglu_forward(y, x, INT64_MAX / 2, INT64_MAX / 2), CT_EOVERFLOW);
    CHECK_OK(ct_swiglu_forward(NULL, NULL, 0, 5));
    CHECK_OK(ct_swiglu_forward(NULL, NULL, 5, 0));
}

/* Outputs bigger than the last-level cache are streamed out through a buffer (src/core/memory.c,
 * elementwise.c): the same bits as plain stores for every op, f32 and bf16, sizes around the
 * buffer and task blocks, misaligned and in-place outputs, 1 and 2 threads (threshold 0 against
 * SIZE_MAX). */
static void ew_op(int op, int bf, int inplace, int64_t n, const float *a, const float *b, const uint16_t *ah,
                  const uint16_t *bh, unsigned char *out)
{
    size_t es = bf ? 2 : 4;
    const void *x = bf ? (const void *)ah : (const void *)a, *y = bf ? (const void *)bh : (const void *)b;
    if (inplace) {
        memcpy(out, x, (size_t)n * es);
        x = out;
    }
    float *o = (float *)out;
    uint16_t *oh = (uint16_t *)out;
    switch (op) {
    case 0: CHECK_OK(bf ? ct_silu_forward_bf16(oh, x, n) : ct_silu_forward(o, x, n)); break;
    case 1: CHECK_OK(bf ? ct_silu_backward_bf16(oh, x, y, n) : ct_silu_backward(o, x, y, n)); break;
    case 2:
        CHECK_OK(bf ? ct_gelu_forward_bf16(oh, x, n, CT_GELU_TANH) : ct_gelu_forward(o, x, n, CT_GELU_NONE));
        break;
    case 3: CHECK_OK(bf ? ct_gelu_backward_bf16(oh, x, y, n, CT_GELU_NONE) : ct_gelu_backward(o, x, y, n, CT_GELU_TANH)); break;
    case 4: CHECK_OK(ct_add(o, x, y, n)); break; /* f32 only */
    case 5: CHECK_OK(ct_mul(o, x, y, n)); break;
    default: CHECK_OK(ct_scale(o, x, 0.75f, n)); break;
    }
}

static void test_stream_stores(void)
{
    static const int64_t ns[] = {1, 5, 4096 + 3, 16384, 16384 * 3 + 11};
    int saved = ct_num_threads();
    size_t saved_min = ct_stream_set_min_bytes(SIZE_MAX);
    for (size_t si = 0; si < sizeof ns / sizeof ns[0]; si++) {
        int64_t n = ns[si];
        float *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4);
        uint16_t *ah = malloc((size_t)n * 2), *bh = malloc((size_t)n * 2);
        t_fill(a, (size_t)n, -4.0f, 4.0f), t_fill(b, (size_t)n, -1.0f, 1.0f);
        ct_convert_f32_to_bf16(ah, a, (size_t)n), ct_convert_f32_to_bf16(bh, b, (size_t)n);
        for (int op = 0; op < 7; op++)
            for (int bf = 0; bf < (op < 4 ? 2 : 1); bf++)
                for (int inplace = 0; inplace < 2; inplace++) {
                    unsigned char *o[3];
                    size_t bytes = (size_t)n * (bf ? 2 : 4);
                    for (int v = 0; v < 3; v++) {
                        o[v] = calloc(1, bytes + 64);
                        ct_stream_set_min_bytes(v ? 0 : SIZE_MAX);
                        CHECK_OK(ct_set_num_threads(v == 2 ? 2 : 1));
                        ew_op(op, bf, inplace, n, a, b, ah, bh, o[v] + 4); /* misaligned by 4 bytes */
                    }
                    ct_stream_set_min_bytes(SIZE_MAX);
                    for (int v = 1; v < 3; v++) {
                        int same = !memcmp(o[0], o[v], bytes + 64);
                        if (!same)
                            printf("  streamed op %d%s n=%lld%s at %d thread(s) differs from plain stores\n", op,
                                   bf ? " bf16" : "", (long long)n, inplace ? " in place" : "", v);
                        CHECK(same);
                    }
                    for (int v = 0; v < 3; v++)
                        free(o[v]);
                }
        free(a), free(b), free(ah), free(bh);
    }
    ct_stream_set_min_bytes(saved_min);
    CHECK_OK(ct_set_num_threads(saved));
}

int main(void)
{
    for (int i = 0; i < CT_ISA_COUNT; i++) { /* every instruction set this CPU has */
        if (ct_set_isa((ct_isa)i) == CT_OK)
            isas[n_isas++] = (ct_isa)i;
        else
            printf("test_ops_elementwise: %s SKIPPED: %s lacks it\n", ct_isa_name((ct_isa)i), ct_cpu_name());
    }
    test_activations();
    test_specials();
    test_scalar_vs_vector();
    test_bf16();
    test_swiglu();
    test_arith();
    test_threads();
    test_stream_stores();
    test_bad_args();
    return t_report("test_ops_elementwise");
}

/* Core: status and errors, allocator accounting and limit, thread pool, CPU dispatch,
 * tensors (views, contiguous, casts), scalar conversions. */
#include "test_util.h"

#include "core/internal.h"

static void test_errors(void)
{
    CHECK(!strcmp(ct_status_name(CT_EINVAL), "CT_EINVAL"));
    CHECK(!strcmp(ct_status_name((ct_status)999), "CT_E?"));
    ct_tensor t;
    CHECK_STATUS(ct_tensor_empty(&t, CT_DTYPE_F32, 9, (int64_t[9]){1}), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "ndim") != NULL);
    ct_clear_error();
    CHECK(ct_last_error()[0] == '\0');

    /* wrapping the current message keeps the cause whole (formatting the message buffer
     * into itself used to garble it: "ctx: ctx: use..." ) */
    CHECK(ct_error(CT_EINVAL, "gpt config: vocab_size must be in [2, 2^31), got %d", 1) ==
          CT_EINVAL);
    CHECK(ct_error_wrap(CT_EFORMAT, "checkpoint '%s': bad \"config\"", "a.st") == CT_EFORMAT);
    CHECK(!strcmp(ct_last_error(), "checkpoint 'a.st': bad \"config\": gpt config: vocab_size "
                                   "must be in [2, 2^31), got 1"));
    CHECK(ct_error_wrap(CT_EIO, "outer") == CT_EIO);
    CHECK(!strncmp(ct_last_error(), "outer: checkpoint 'a.st': bad", 29));
    /* no cause: just the context */
    ct_clear_error();
    ct_error_wrap(CT_EIO, "alone %d", 7);
    CHECK(!strcmp(ct_last_error(), "alone 7"));
    /* ct_error given its own buffer as an argument is safe too */
    ct_error(CT_EINVAL, "inner cause");
    ct_error(CT_EINVAL, "outer: %s (%s)", ct_last_error(), ct_last_error());
    CHECK(!strcmp(ct_last_error(), "outer: inner cause (inner cause)"));
    /* a context plus cause longer than the buffer is cut, NUL-terminated, context first */
    char big[1500];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    ct_error(CT_EINVAL, "%s", big);
    ct_error_wrap(CT_EINVAL, "ctx");
    CHECK(!strncmp(ct_last_error(), "ctx: xxx", 8) && strlen(ct_last_error()) == 1023);
    ct_error_wrap(CT_EINVAL, "%s", big);
    CHECK(strlen(ct_last_error()) == 1023 && ct_last_error()[0] == 'x');
    ct_clear_error();
}

static void test_allocator(void)
{
    ct_memory_stats_t a, b;
    ct_memory_stats(&a);
    void *p = NULL;
    CHECK_OK(ct_alloc(&p, 1000));
    CHECK(((uintptr_t)p & 63) == 0);
    ct_memory_stats(&b);
    CHECK(b.current_bytes == a.current_bytes + 1000);
    CHECK(b.peak_bytes >= b.current_bytes);
    CHECK(b.alloc_count == a.alloc_count + 1);
    ct_free(p);
    ct_memory_stats(&b);
    CHECK(b.current_bytes == a.current_bytes);
    ct_memory_reset_peak();
    ct_memory_stats(&b);
    CHECK(b.peak_bytes == b.current_bytes);
    /* zero bytes: valid unique pointer */
    void *z1, *z2;
    CHECK_OK(ct_alloc(&z1, 0));
    CHECK_OK(ct_alloc(&z2, 0));
    CHECK(z1 && z2 && z1 != z2);
    ct_free(z1);
    ct_free(z2);
    ct_free(NULL);
    /* the limit fails cleanly */
    ct_memory_set_limit(b.current_bytes + 4096);
    CHECK_STATUS(ct_alloc(&p, 8192), CT_ENOMEM);
    CHECK(p == NULL);
    CHECK(strstr(ct_last_error(), "limit") != NULL);
    CHECK_OK(ct_alloc(&p, 1024));
    ct_free(p);
    ct_memory_set_limit(0);
    CHECK_STATUS(ct_alloc(&p, SIZE_MAX - 10), CT_EOVERFLOW);
    /* big blocks: 2 MiB aligned (the 64-byte header first) for huge pages, unless CT_HUGEPAGES=0;
     * counted as asked, zeroed by ct_calloc to the last byte, usable to the last byte */
    size_t big = ((size_t)6 << 20) + 12345;
    unsigned char *q = NULL;
    CHECK_OK(ct_calloc((void **)&q, big));
    const char *hp = getenv("CT_HUGEPAGES");
#if defined(__linux__)
    if (!(hp && !strcmp(hp, "0"))) CHECK((((uintptr_t)q - 64) & (((uintptr_t)2 << 20) - 1)) == 0);
#else
    (void)hp;
#endif
    CHECK(((uintptr_t)q & 63) == 0);
    CHECK(q[0] == 0 && q[big / 2] == 0 && q[big - 1] == 0);
    q[big - 1] = 7;
    ct_memory_stats(&b);
    CHECK(b.current_bytes == a.current_bytes + big);
    ct_free(q);
    CHECK_STATUS(ct_calloc(NULL, 4), CT_EINVAL);
    ct_memory_stats(&b);
    CHECK(b.current_bytes == a.current_bytes);
}

typedef struct {
    int64_t *owner;
    int *calls;
} pf_ctx;

static void pf_body(void *p, int64_t b, int64_t e, int tid)
{
    pf_ctx *c = p;
    for (int64_t i = b; i < e; i++) c->owner[i] += tid + 1;
    c->calls[tid]++;
}

static void nested_body(void *p, int64_t b, int64_t e, int tid)
{
    pf_ctx *c = p;
    (void)tid;
    for (int64_t i = b; i < e; i++) ct_parallel_for(1, pf_body, &(pf_ctx){c->owner + i, c->calls});
}

static void test_threads(void)
{
    int64_t owner[1000];
    int calls[256];
    for (int T = 1; T <= 3; T++) {
        CHECK_OK(ct_set_num_threads(T));
        CHECK(ct_num_threads() == T);
        memset(owner, 0, sizeof owner);
        memset(calls, 0, sizeof calls);
        pf_ctx c = {owner, calls};
        ct_parallel_for(1000, pf_body, &c);
        int ok = 1; /* each index once, by a chunk whose tid is < T (tests/c/test_threads.c
                     * checks the pool in depth) */
        for (int64_t i = 0; i < 1000; i++)
            if (owner[i] < 1 || owner[i] > T) ok = 0;
        CHECK(ok);
        int total = 0;
        for (int t = 0; t < 256; t++) {
            if (t >= T) CHECK(calls[t] == 0);
            total += calls[t];
        }
        CHECK(total >= 1 && total <= 1000);
        /* nested calls run serially, no deadlock */
        memset(owner, 0, sizeof owner);
        ct_parallel_for(10, nested_body, &c);
        for (int i = 0; i < 10; i++) CHECK(owner[i] == 1);
        ct_parallel_for(0, pf_body, &c);
    }
    CHECK_STATUS(ct_set_num_threads(0), CT_EINVAL);
    CHECK_STATUS(ct_set_num_threads(1000), CT_EINVAL);
    CHECK_OK(ct_set_num_threads(2));
}

static void test_isa(void)
{
    ct_isa best = ct_active_isa();
    CHECK_OK(ct_set_isa(CT_ISA_SCALAR));
    CHECK(ct_active_isa() == CT_ISA_SCALAR);
    CHECK(!strcmp(ct_isa_name(CT_ISA_SCALAR), "scalar"));
    CHECK_STATUS(ct_set_isa((ct_isa)7), CT_EINVAL);
    CHECK_STATUS(ct_set_isa((ct_isa)-1), CT_EINVAL);
    CHECK(!strcmp(ct_isa_name(CT_ISA_AVX512), "avx512") && !strcmp(ct_isa_name(CT_ISA_SVE), "sve"));
    CHECK(!strcmp(ct_isa_name((ct_isa)9), "unknown"));
    CHECK(ct_cpu_has_isa(CT_ISA_SCALAR) && ct_cpu_name()[0]);
    CHECK_OK(ct_isa_env_status()); /* the test runs without CT_FORCE_ISA */
    for (int i = 0; i < CT_ISA_COUNT; i++) {
        if (ct_cpu_has_isa((ct_isa)i)) {
            CHECK_OK(ct_set_isa((ct_isa)i));
            CHECK(ct_active_isa() == (ct_isa)i);
        } else {
            CHECK_STATUS(ct_set_isa((ct_isa)i), CT_EUNSUPPORTED);
            CHECK(strstr(ct_last_error(), ct_cpu_name()) != NULL); /* names the CPU */
            printf("test_core: %s not on %s: its ct_set_isa refusal checked, its kernels SKIPPED\n",
                   ct_isa_name((ct_isa)i), ct_cpu_name());
        }
    }
#if defined(__x86_64__)
    CHECK(!ct_cpu_has_isa(CT_ISA_NEON) && !ct_cpu_has_isa(CT_ISA_SVE));
    if (ct_cpu_has_isa(CT_ISA_AVX512)) CHECK(ct_cpu_has_isa(CT_ISA_AVX2));
#endif
    CHECK_OK(ct_set_isa(best));
}

static void test_dtypes(void)
{
    CHECK(ct_dtype_size(CT_DTYPE_BF16) == 2 && ct_dtype_size(CT_DTYPE_I64) == 8 && ct_dtype_size(CT_DTYPE_F8_E5M2) == 1);
    CHECK(ct_dtype_size((ct_dtype)99) == 0);
    ct_dtype d;
    CHECK_OK(ct_dtype_from_name("bf16", &d));
    CHECK(d == CT_DTYPE_BF16);
    CHECK_STATUS(ct_dtype_from_name("f128", &d), CT_EINVAL);
    /* bf16: round to nearest even */
    CHECK(ct_f32_to_bf16(1.0f) == 0x3F80);
    CHECK(ct_f32_to_bf16(1.00390625f) == 0x3F80);      /* exactly halfway, even stays */
    CHECK(ct_f32_to_bf16(1.01171875f) == 0x3F82);      /* halfway above odd 0x3F81 -> 0x3F82 */
    CHECK(ct_f32_to_bf16(nextafterf(1.00390625f, 2.0f)) == 0x3F81);       /* just above halfway */
    CHECK(isnan(ct_bf16_to_f32(ct_f32_to_bf16(NAN))));
    CHECK(ct_bf16_to_f32(ct_f32_to_bf16(INFINITY)) == INFINITY);
    /* f16 */
    CHECK(ct_f32_to_f16(1.0f) == 0x3C00);
    CHECK(ct_f32_to_f16(65504.0f) == 0x7BFF);
    CHECK(ct_f32_to_f16(65520.0f) == 0x7C00);          /* rounds to infinity */
    CHECK(ct_f32_to_f16(65519.0f) == 0x7BFF);
    CHECK(ct_f32_to_f16(5.9604645e-8f) == 0x0001);     /* smallest subnormal */
    CHECK(ct_f32_to_f16(2.9802322e-8f) == 0x0000);     /* half of it: ties to even (0) */
    CHECK(ct_f32_to_f16(-0.0f) == 0x8000);
    CHECK(ct_f32_to_f16(1.0f + 1.0f / 2048) == 0x3C00); /* halfway between 1 and next: even */
    CHECK(ct_f32_to_f16(1.0f + 3.0f / 2048) == 0x3C02);
    /* exhaustive f16 -> f32 -> f16 round trip */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = ct_f16_to_f32((uint16_t)h);
        if (isnan(f)) continue;
        if (ct_f32_to_f16(f) != h) bad++;
    }
    CHECK(bad == 0);
    /* f8: every encoding round trips; saturation; rounding */
    bad = 0;
    for (int b = 0; b < 256; b++) {
        float f = ct_f8e4m3_to_f32((uint8_t)b);
        if (!isnan(f) && ct_f32_to_f8e4m3(f) != b && !(b == 0x80 && f == 0)) bad++;
        float g = ct_f8e5m2_to_f32((uint8_t)b);
        if (!isnan(g) && ct_f32_to_f8e5m2(g) != b) bad++;
    }
    CHECK(bad == 0);
    CHECK(ct_f8e4m3_to_f32(0x7E) == 448.0f);
    CHECK(ct_f32_to_f8e4m3(1e6f) == 0x7E);
    CHECK(ct_f32_to_f8e4m3(-1e6f) == 0xFE);
    CHECK(ct_f8e5m2_to_f32(ct_f32_to_f8e5m2(1e6f)) == INFINITY);
    CHECK(ct_f8e4m3_to_f32(ct_f32_to_f8e4m3(1.0625f)) == 1.0f);   /* halfway 1 and 1.125: even */
    CHECK(ct_f8e4m3_to_f32(ct_f32_to_f8e4m3(1.1875f)) == 1.25f);  /* halfway 1.125 and 1.25: even */
    CHECK(ct_f8e4m3_to_f32(1) == 0.001953125f);                    /* 2^-9 */
    /* bulk conversions: AVX2 and scalar agree bitwise */
    enum { n = 1027 };
    float x[n], y1[n], y2[n];
    uint16_t h1[n], h2[n];
    t_fill(x, n, -70000.f, 70000.f);
    x[3] = INFINITY;
    x[4] = -0.0f;
    x[5] = 1e-6f;
    for (int k = 0; k < 2; k++) {
        CHECK_OK(ct_set_isa(CT_ISA_SCALAR));
        if (k == 0) ct_convert_f32_to_bf16(h1, x, n); else ct_convert_f32_to_f16(h1, x, n);
        if (k == 0) ct_convert_bf16_to_f32(y1, h1, n); else ct_convert_f16_to_f32(y1, h1, n);
        if (ct_set_isa(CT_ISA_AVX2) == CT_OK) {
            if (k == 0) ct_convert_f32_to_bf16(h2, x, n); else ct_convert_f32_to_f16(h2, x, n);
            if (k == 0) ct_convert_bf16_to_f32(y2, h2, n); else ct_convert_f16_to_f32(y2, h2, n);
            CHECK(!memcmp(h1, h2, sizeof h1));
            CHECK(!memcmp(y1, y2, sizeof y1));
        }
    }
    ct_clear_error();
}

static void test_tensors(void)
{
    ct_tensor t, v, w, c;
    int64_t shp[3] = {2, 3, 4};
    CHECK_OK(ct_tensor_empty(&t, CT_DTYPE_F32, 3, shp));
    float *d = t.data;
    for (int i = 0; i < 24; i++) d[i] = (float)i;
    CHECK(ct_tensor_numel(&t) == 24 && ct_tensor_is_contiguous(&t));
    /* slice dim 2, [1, 4) step 2 -> elements 1, 3 */
    CHECK_OK(ct_tensor_slice(&t, -1, 1, 100, 2, &v));
    CHECK(v.shape[2] == 2 && !v.owns && !ct_tensor_is_contiguous(&v));
    CHECK_OK(ct_tensor_contiguous(&v, &c));
    float *cd = c.data;
    CHECK(cd[0] == 1 && cd[1] == 3 && cd[2] == 5 && cd[11] == 23);
    ct_tensor_free(&c);
    CHECK_STATUS(ct_tensor_slice(&t, 3, 0, 1, 1, &v), CT_EINVAL);
    CHECK_STATUS(ct_tensor_slice(&t, 0, 0, 1, 0, &v), CT_EINVAL);
    /* empty slice */
    CHECK_OK(ct_tensor_slice(&t, 1, 2, 1, 1, &v));
    CHECK(v.shape[1] == 0 && ct_tensor_numel(&v) == 0);
    CHECK_OK(ct_tensor_contiguous(&v, &c));
    ct_tensor_free(&c);
    /* transpose + contiguous */
    CHECK_OK(ct_tensor_transpose(&t, 0, 2, &v));
    CHECK(v.shape[0] == 4 && v.shape[2] == 2);
    CHECK_OK(ct_tensor_contiguous(&v, &c));
    cd = c.data; /* c[i][j][k] = t[k][j][i] = k*12 + j*4 + i */
    CHECK(cd[(3 * 3 + 2) * 2 + 1] == 1 * 12 + 2 * 4 + 3);
    ct_tensor_free(&c);
    /* permute */
    CHECK_OK(ct_tensor_permute(&t, (int[]){1, 2, 0}, &v));
    CHECK(v.shape[0] == 3 && v.shape[1] == 4 && v.shape[2] == 2);
    CHECK_STATUS(ct_tensor_permute(&t, (int[]){0, 0, 1}, &v), CT_EINVAL);
    /* reshape */
    CHECK_OK(ct_tensor_reshape(&t, 2, (int64_t[]){-1, 6}, &v));
    CHECK(v.shape[0] == 4 && v.shape[1] == 6);
    CHECK_STATUS(ct_tensor_reshape(&t, 2, (int64_t[]){5, -1}, &v), CT_EINVAL);
    CHECK_STATUS(ct_tensor_reshape(&t, 2, (int64_t[]){-1, -1}, &v), CT_EINVAL);
    CHECK_OK(ct_tensor_transpose(&t, 0, 1, &w));
    CHECK_STATUS(ct_tensor_reshape(&w, 1, (int64_t[]){24}, &v), CT_EINVAL);
    /* expand */
    ct_tensor row;
    CHECK_OK(ct_tensor_slice(&t, 0, 0, 1, 1, &row)); /* [1,3,4] */
    CHECK_OK(ct_tensor_expand(&row, 4, (int64_t[]){2, 5, -1, 4}, &v));
    CHECK(v.ndim == 4 && v.shape[1] == 5 && v.strides[0] == 0 && v.strides[1] == 0);
    CHECK_OK(ct_tensor_contiguous(&v, &c));
    cd = c.data;
    CHECK(cd[((1 * 5 + 4) * 3 + 2) * 4 + 3] == 11);
    ct_tensor_free(&c);
    CHECK_STATUS(ct_tensor_expand(&t, 3, (int64_t[]){3, 3, 4}, &v), CT_EINVAL);
    /* copying into a broadcast view is refused */
    CHECK_STATUS(ct_tensor_copy(&v, &v), CT_EINVAL);
    /* casts: f32 -> bf16 -> f32, -> i32 truncation and saturation, -> bool */
    ct_tensor s1, s2;
    float vals[6] = {1.5f, -2.7f, 3e10f, NAN, 0.0f, -0.4f};
    CHECK_OK(ct_tensor_wrap(&s1, vals, CT_DTYPE_F32, 1, (int64_t[]){6}, NULL));
    CHECK_OK(ct_tensor_cast(&s1, CT_DTYPE_I32, &s2));
    int32_t *iv = s2.data;
    CHECK(iv[0] == 1 && iv[1] == -2 && iv[2] == INT32_MAX && iv[3] == 0 && iv[5] == 0);
    ct_tensor_free(&s2);
    CHECK_OK(ct_tensor_cast(&s1, CT_DTYPE_BOOL, &s2));
    uint8_t *bv = s2.data;
    CHECK(bv[0] == 1 && bv[3] == 1 && bv[4] == 0 && bv[5] == 1);
    ct_tensor_free(&s2);
    CHECK_OK(ct_tensor_cast(&s1, CT_DTYPE_BF16, &s2));
    CHECK(((uint16_t *)s2.data)[0] == ct_f32_to_bf16(1.5f));
    ct_tensor_free(&s2);
    /* fill + scalar tensors */
    CHECK_OK(ct_tensor_zeros(&s2, CT_DTYPE_I64, 0, NULL));
    CHECK(ct_tensor_numel(&s2) == 1 && *(int64_t *)s2.data == 0);
    CHECK_OK(ct_tensor_fill(&s2, 7));
    CHECK(*(int64_t *)s2.data == 7);
    ct_tensor_free(&s2);
    CHECK_OK(ct_tensor_fill(&t, 2.5));
    CHECK(((float *)t.data)[23] == 2.5f);
    /* bad arguments */
    CHECK_STATUS(ct_tensor_empty(&v, (ct_dtype)42, 1, shp), CT_EINVAL);
    CHECK_STATUS(ct_tensor_empty(&v, CT_DTYPE_F32, 1, (int64_t[]){-1}), CT_EINVAL);
    CHECK_STATUS(ct_tensor_empty(&v, CT_DTYPE_F32, 2, (int64_t[]){INT64_MAX, 4}), CT_EOVERFLOW);
    CHECK_STATUS(ct_tensor_wrap(&v, NULL, CT_DTYPE_F32, 1, (int64_t[]){3}, NULL), CT_EINVAL);
    ct_tensor_free(&t);
    ct_tensor_free(NULL);
}

int main(void)
{
    test_errors();
    test_allocator();
    test_threads();
    test_isa();
    test_dtypes();
    test_tensors();
    return t_report("test_core");
}

/* The device layer (include/ctorch/device.h): names, the CPU device, buffers and their range
 * checks, per-device memory statistics, tensors over buffers, and a CUDA device that cannot
 * open here failing with a message (never a crash). */
#include "test_util.h"

#include <stdint.h>

static void test_parse(void)
{
    ct_device_options o = ct_device_options_default();
    CHECK(o.kind == CT_DEVICE_CPU && o.index == 0 && o.memory_limit == 0);
    CHECK_OK(ct_device_parse("cuda:3", &o));
    CHECK(o.kind == CT_DEVICE_CUDA && o.index == 3);
    CHECK_OK(ct_device_parse("cpu", &o));
    CHECK(o.kind == CT_DEVICE_CPU && o.index == 0);
    CHECK_OK(ct_device_parse("cuda", &o));
    CHECK(o.kind == CT_DEVICE_CUDA && o.index == 0);
    CHECK_OK(ct_device_parse("cuda:1023", &o));
    CHECK(o.index == 1023);
    const char *bad[] = {"", "gpu", "cuda:", "cuda:-1", "cuda:1024", "cuda:01", "cuda:1x", "CPU",
                         "cuda:99999999999999999999", "cpu:0"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_STATUS(ct_device_parse(bad[i], &o), CT_EINVAL);
        CHECK(strstr(ct_last_error(), "cuda:N") != NULL);
    }
    CHECK_STATUS(ct_device_parse(NULL, &o), CT_EINVAL);
}

static void test_cpu_buffers(void)
{
    ct_device *cpu = ct_device_cpu();
    CHECK(cpu && ct_device_get_kind(cpu) == CT_DEVICE_CPU && !strcmp(ct_device_name(cpu), "cpu"));
    CHECK(strstr(ct_device_describe(cpu), "cpu (") == ct_device_describe(cpu));
    ct_device *d = NULL;
    ct_device_options o = ct_device_options_default();
    CHECK_OK(ct_device_open(&o, &d));
    CHECK(d == cpu);
    ct_memory_stats_t a, b;
    ct_device_memory_stats(cpu, &a);
    ct_buffer *x = NULL, *y = NULL;
    CHECK_OK(ct_buffer_zeros(cpu, 1000, &x));
    CHECK_OK(ct_buffer_alloc(cpu, 1000, &y));
    ct_device_memory_stats(cpu, &b);
    CHECK(b.current_bytes >= a.current_bytes + 2000); /* the CPU's are ct_alloc's figures */
    CHECK(ct_buffer_size(x) == 1000 && ct_buffer_device(x) == cpu && ct_buffer_data(x));
    uint8_t z[1000], w[1000];
    CHECK_OK(ct_buffer_read(x, 0, z, 1000));
    int zeros = 1;
    for (int i = 0; i < 1000; i++) zeros &= z[i] == 0;
    CHECK(zeros);
    for (int i = 0; i < 1000; i++) w[i] = (uint8_t)(i * 7);
    CHECK_OK(ct_buffer_write(x, 0, w, 1000));
    CHECK_OK(ct_buffer_copy(y, 10, x, 20, 500));
    CHECK_OK(ct_buffer_read(y, 10, z, 500));
    CHECK(!memcmp(z, w + 20, 500));
    /* ranges that leave a buffer, and bad arguments */
    CHECK_STATUS(ct_buffer_write(x, 999, w, 2), CT_EINVAL);
    CHECK_STATUS(ct_buffer_read(x, 1001, z, 0), CT_EINVAL);
    CHECK_STATUS(ct_buffer_read(x, SIZE_MAX, z, 2), CT_EINVAL);
    CHECK_STATUS(ct_buffer_copy(y, 600, x, 0, 500), CT_EINVAL);
    CHECK_STATUS(ct_buffer_write(x, 0, NULL, 4), CT_EINVAL);
    ct_buffer *none = x; /* a refused allocation sets its output to NULL (y stays allocated) */
    CHECK_STATUS(ct_buffer_alloc(cpu, 0, &none), CT_EINVAL);
    CHECK(none == NULL);
    /* a limit is the device's: the CPU's is ct_alloc's */
    ct_device_set_memory_limit(cpu, b.current_bytes + 100);
    ct_buffer *big = NULL;
    CHECK_STATUS(ct_buffer_alloc(cpu, 4096, &big), CT_ENOMEM);
    CHECK(big == NULL);
    ct_device_set_memory_limit(cpu, 0);
    /* tensors over a buffer: bounds checked, a host device's tensors usable on the host */
    ct_tensor t;
    CHECK_OK(ct_tensor_wrap_buffer(&t, x, 40, CT_DTYPE_F32, 2, (int64_t[]){10, 24}, NULL));
    CHECK(t.buffer == x && t.data == (char *)ct_buffer_data(x) + 40 && ct_tensor_on_host(&t));
    CHECK_OK(ct_tensor_fill(&t, 1.5));
    CHECK_STATUS(ct_tensor_wrap_buffer(&t, x, 40, CT_DTYPE_F32, 2, (int64_t[]){10, 25}, NULL),
                 CT_EINVAL);
    CHECK_STATUS(ct_tensor_wrap_buffer(&t, x, 2, CT_DTYPE_F32, 1, (int64_t[]){4}, NULL), CT_EINVAL);
    CHECK_OK(ct_tensor_wrap_buffer(&t, x, 0, CT_DTYPE_F32, 2, (int64_t[]){2, 3}, (int64_t[]){247, 1}));
    CHECK_STATUS(ct_tensor_wrap_buffer(&t, x, 0, CT_DTYPE_F32, 2, (int64_t[]){2, 3}, (int64_t[]){248, 1}),
                 CT_EINVAL);
    CHECK_STATUS(ct_tensor_wrap_buffer(&t, x, 0, CT_DTYPE_F32, 1, (int64_t[]){3}, (int64_t[]){-1}),
                 CT_EINVAL);
    CHECK_STATUS(ct_tensor_wrap_buffer(&t, x, 0, CT_DTYPE_F32, 2, (int64_t[]){INT64_MAX / 2, 3},
                                       (int64_t[]){INT64_MAX / 4, 1}),
                 CT_EOVERFLOW);
    CHECK_OK(ct_tensor_wrap_buffer(&t, x, 1000, CT_DTYPE_F32, 1, (int64_t[]){0}, NULL)); /* empty */
    ct_tensor v;
    CHECK_OK(ct_tensor_slice(&t, 0, 0, 0, 1, &v));
    CHECK(v.buffer == x); /* views keep their buffer */
    ct_buffer_free(x);
    ct_buffer_free(y);
    ct_buffer_free(NULL);
    CHECK_OK(ct_device_close(cpu)); /* a no-op */
    CHECK_OK(ct_device_sync(cpu));
}

static void test_cuda_absent_or_present(void)
{
    ct_device_options o = ct_device_options_default();
    CHECK_OK(ct_device_parse("cuda:0", &o));
    ct_device *d = NULL;
    ct_status s = ct_device_open(&o, &d);
    const char *line = ct_cuda_describe();
    CHECK(!strncmp(line, "cuda: ", 6));
    if (s != CT_OK) {
        CHECK(s == CT_EUNSUPPORTED && d == NULL);
        printf("SKIPPED: cuda: %s\n", ct_last_error());
        /* every later open says the same, and never crashes */
        CHECK_STATUS(ct_device_open(&o, &d), CT_EUNSUPPORTED);
        return;
    }
    /* a GPU: buffers round-trip, statistics are its own, a second open shares the device */
    ct_device *d2 = NULL;
    CHECK_OK(ct_device_open(&o, &d2));
    CHECK(d2 == d);
    CHECK_OK(ct_device_close(d2));
    ct_memory_stats_t a, b;
    ct_device_memory_stats(d, &a);
    ct_buffer *x = NULL;
    CHECK_OK(ct_buffer_zeros(d, 1 << 20, &x));
    ct_device_memory_stats(d, &b);
    CHECK(b.current_bytes == a.current_bytes + (1 << 20) && b.peak_bytes >= b.current_bytes);
    float h[256], r[256];
    for (int i = 0; i < 256; i++) h[i] = (float)i - 3.5f;
    CHECK_OK(ct_buffer_write(x, 4096, h, sizeof h));
    CHECK_OK(ct_buffer_read(x, 4096, r, sizeof r));
    CHECK(!memcmp(h, r, sizeof h));
    ct_tensor t;
    CHECK_OK(ct_tensor_wrap_buffer(&t, x, 0, CT_DTYPE_F32, 1, (int64_t[]){16}, NULL));
    CHECK(!ct_tensor_on_host(&t));
    CHECK_STATUS(ct_tensor_fill(&t, 1.0), CT_EINVAL); /* the host never touches GPU memory */
    CHECK_STATUS(ct_device_close(d), CT_EINVAL);      /* a live buffer */
    ct_buffer_free(x);
    ct_device_set_memory_limit(d, 1 << 20);
    CHECK_STATUS(ct_buffer_alloc(d, (1 << 20) + 1, &x), CT_ENOMEM);
    CHECK(strstr(ct_last_error(), "cuda:0") != NULL);
    ct_device_set_memory_limit(d, 0);
    CHECK_OK(ct_device_close(d));
}

int main(void)
{
    test_parse();
    test_cpu_buffers();
    test_cuda_absent_or_present();
    return t_report("test_device");
}

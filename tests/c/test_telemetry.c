/* Telemetry: figures are real or marked unavailable; rates appear from the second sample. */
#include "test_util.h"

#include <time.h>

int main(void)
{
    ct_telemetry t;
    ct_telemetry_sample a, b;
    ct_telemetry_init(&t);
    CHECK_STATUS(ct_telemetry_read(NULL, &a), CT_EINVAL);
    CHECK_STATUS(ct_telemetry_read(&t, NULL), CT_EINVAL);
    CHECK_OK(ct_telemetry_read(&t, &a));
    CHECK(isnan(a.interval_s) && isnan(a.cpu_util_total) && isnan(a.process_cpu) && isnan(a.power_w));
    CHECK(a.rss_bytes > 0 && a.peak_rss_bytes >= a.rss_bytes); /* Linux always has /proc */
    CHECK(a.ncpu >= 1);
    void *p;
    CHECK_OK(ct_alloc(&p, 1 << 20));
    /* burn some CPU so the process figure is positive */
    volatile double x = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        for (int i = 0; i < 100000; i++) x += i * 1e-9;
        clock_gettime(CLOCK_MONOTONIC, &t1);
    } while ((t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9 < 0.2);
    CHECK_OK(ct_telemetry_read(&t, &b));
    CHECK(b.interval_s >= 0.2);
    CHECK(b.alloc_current_bytes >= a.alloc_current_bytes + (1 << 20));
    CHECK(b.alloc_peak_bytes >= b.alloc_current_bytes);
    CHECK(b.cpu_util_total >= 0.0 && b.cpu_util_total <= 1.0);
    for (int i = 0; i < b.ncpu; i++) CHECK(isnan(b.cpu_util[i]) || (b.cpu_util[i] >= 0 && b.cpu_util[i] <= 1));
    CHECK(b.process_cpu > 0.0 && b.process_cpu <= b.ncpu + 0.5);
    for (int i = 0; i < b.ncpu; i++) CHECK(isnan(b.cpu_mhz[i]) || b.cpu_mhz[i] > 0);
    CHECK(isnan(b.temp_c) || (b.temp_c > -50 && b.temp_c < 150));
    CHECK(isnan(b.power_w) || b.power_w >= 0);
    /* GPUs (NVML as this machine has it; the fake one: test_telemetry_nvml): either listed,
     * or none and a reason */
    CHECK(b.ngpu >= 0 && b.ngpu <= CT_TELEMETRY_MAX_GPUS);
    CHECK(b.ngpu > 0 || b.gpu_status[0] != 0);
    for (int i = 0; i < b.ngpu; i++) {
        CHECK(b.gpu[i].index == i);
        CHECK(b.gpu[i].mem_total_bytes == -1 || b.gpu[i].mem_total_bytes > 0);
        CHECK(isnan(b.gpu[i].util_pct) || (b.gpu[i].util_pct >= 0 && b.gpu[i].util_pct <= 100));
    }
    ct_free(p);
    return t_report("test_telemetry");
}

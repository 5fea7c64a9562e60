/* GPU telemetry through NVML, against a fake libnvidia-ml (tests/c/fake_nvml.c, named by
 * CTORCH_NVML_LIB): every figure of GPU 0 comes through exactly as NVML answers it (bytes,
 * percent, milliwatts as watts, MHz, degrees); GPU 1's refused figures (power NOT_SUPPORTED,
 * temperature NO_PERMISSION) are unavailable, not the garbage the call left behind. The first
 * samples are taken by several threads at once (NVML is loaded and initialised once). */
#include "test_util.h"

#include <pthread.h>

#define THREADS 4

static ct_telemetry_sample samples[THREADS];
static ct_status statuses[THREADS];

static void *sample(void *arg)
{
    int i = (int)(intptr_t)arg;
    ct_telemetry t;
    ct_telemetry_init(&t);
    statuses[i] = ct_telemetry_read(&t, &samples[i]);
    return NULL;
}

static void check_fake(const ct_telemetry_sample *s)
{
    CHECK(s->ngpu == 2);
    CHECK(s->gpu_status[0] == 0);
    const ct_telemetry_gpu *a = &s->gpu[0], *b = &s->gpu[1];
    CHECK(a->index == 0 && !strcmp(a->name, "Fake GPU A"));
    CHECK(a->mem_total_bytes == 150754820096LL && a->mem_used_bytes == 1234567168LL);
    CHECK(a->util_pct == 37 && a->mem_util_pct == 12);
    CHECK(a->power_w == 123.456);
    CHECK(a->sm_mhz == 1980 && a->mem_mhz == 3201);
    CHECK(a->temp_c == 41);

    CHECK(b->index == 1 && !strcmp(b->name, "Fake GPU B"));
    CHECK(b->mem_total_bytes == 85899345920LL && b->mem_used_bytes == 536870912LL);
    CHECK(b->util_pct == 99 && b->mem_util_pct == 0); /* a real 0, not "unavailable" */
    CHECK(isnan(b->power_w));                          /* NOT_SUPPORTED */
    CHECK(isnan(b->temp_c));                           /* NO_PERMISSION */
    CHECK(b->sm_mhz == 1410 && b->mem_mhz == 1593);
}

int main(void)
{
    setenv("CTORCH_NVML_LIB", CT_FAKE_NVML, 1);
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++) CHECK(pthread_create(&th[i], NULL, sample, (void *)(intptr_t)i) == 0);
    for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < THREADS; i++) {
        CHECK_OK(statuses[i]);
        check_fake(&samples[i]);
    }

    /* Later samples query NVML again; the rest of the sample is as before. */
    ct_telemetry t;
    ct_telemetry_sample s;
    ct_telemetry_init(&t);
    CHECK_OK(ct_telemetry_read(&t, &s));
    CHECK_OK(ct_telemetry_read(&t, &s));
    check_fake(&s);
    CHECK(s.rss_bytes > 0 && s.ncpu >= 1);

    /* More GPUs than the sample holds: the first CT_TELEMETRY_MAX_GPUS, and a note. The fake
     * reads its count at each call; ctorch's outcome of loading stays. */
    setenv("FAKE_NVML_COUNT", "40", 1);
    CHECK_OK(ct_telemetry_read(&t, &s));
    CHECK(s.ngpu == CT_TELEMETRY_MAX_GPUS);
    CHECK(strstr(s.gpu_status, "40 GPUs") != NULL);
    CHECK(!strcmp(s.gpu[CT_TELEMETRY_MAX_GPUS - 1].name, "Fake GPU B"));
    CHECK(s.gpu[CT_TELEMETRY_MAX_GPUS - 1].index == CT_TELEMETRY_MAX_GPUS - 1);

    /* GPUs gone after start-up: none listed, and why. */
    setenv("FAKE_NVML_COUNT", "0", 1);
    CHECK_OK(ct_telemetry_read(&t, &s));
    CHECK(s.ngpu == 0 && !strcmp(s.gpu_status, "NVML lists no GPU"));
    return t_report("test_telemetry_nvml");
}

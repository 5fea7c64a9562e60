/* GPU telemetry through NVML (the NVIDIA Management Library that ships with the driver).
 *
 * libnvidia-ml is loaded at run time with dlopen, so ctorch neither links to it nor needs the
 * CUDA toolkit to build: CTORCH_NVML_LIB names the file to load when set, else
 * "libnvidia-ml.so.1" is looked up by the dynamic linker. Only the few entry points below are
 * declared here, with the types and constants of NVML's public API (nvml.h): a device handle
 * is an opaque pointer, every call returns an nvmlReturn_t (0 is success).
 *
 * Loading and nvmlInit_v2 happen once per process (pthread_once), and their outcome holds for
 * the process: NVML's own calls are thread-safe after that. When NVML is absent, cannot be
 * loaded, lacks an entry point, fails to initialise or lists no GPU, the sample lists no GPU
 * and gpu_status says which. A figure that a call refuses for a GPU (NOT_SUPPORTED on a board
 * without a power sensor, NO_PERMISSION, GPU_IS_LOST, ...) is unavailable: NaN or -1, never
 * guessed. NVML stays initialised for the life of the process once it has listed GPUs. */
#include "telemetry/telemetry_internal.h"

#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the part of nvml.h used here -------------------------------------------------------- */
typedef int nvml_return;                   /* nvmlReturn_t */
typedef struct nvml_device_st *nvml_device; /* nvmlDevice_t */
typedef struct nvml_memory {               /* nvmlMemory_t (version 1) */
    unsigned long long total, free, used;  /* bytes */
} nvml_memory;
typedef struct nvml_utilization {          /* nvmlUtilization_t */
    unsigned int gpu, memory;              /* percent of the last sample period */
} nvml_utilization;

enum {
    NVML_SUCCESS = 0,
    NVML_CLOCK_SM = 1,        /* nvmlClockType_t */
    NVML_CLOCK_MEM = 2,
    NVML_TEMPERATURE_GPU = 0, /* nvmlTemperatureSensors_t */
    NVML_NAME_BUFFER = 96,    /* NVML_DEVICE_NAME_V2_BUFFER_SIZE */
};

static struct {
    nvml_return (*init)(void);
    nvml_return (*shutdown)(void);
    nvml_return (*count)(unsigned int *);
    nvml_return (*handle)(unsigned int, nvml_device *);
    nvml_return (*name)(nvml_device, char *, unsigned int);
    nvml_return (*memory)(nvml_device, nvml_memory *);
    nvml_return (*util)(nvml_device, nvml_utilization *);
    nvml_return (*power)(nvml_device, unsigned int *);
    nvml_return (*clock)(nvml_device, int, unsigned int *);
    nvml_return (*temperature)(nvml_device, int, unsigned int *);
    const char *(*error_string)(nvml_return);
} nv;

static pthread_once_t nv_once = PTHREAD_ONCE_INIT;
static bool nv_ready;                       /* loaded and initialised */
static char nv_reason[CT_TELEMETRY_GPU_STATUS]; /* why not, when !nv_ready */

/* Text from outside (dlerror, a path, NVML's strings) as printable ASCII, so that whoever
 * prints or serialises it (JSON wants valid UTF-8) gets well-formed text. */
static void printable(char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e) *s = '?';
}

static void reason(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(nv_reason, sizeof nv_reason, fmt, ap);
    va_end(ap);
    printable(nv_reason);
}

static const char *error_text(nvml_return r)
{
    const char *e = nv.error_string ? nv.error_string(r) : NULL;
    return e ? e : "unknown error";
}

static void nv_load(void)
{
    const char *env = getenv("CTORCH_NVML_LIB");
    bool from_env = env && *env;
    const char *file = from_env ? env : "libnvidia-ml.so.1";
    void *h = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        if (from_env) reason("NVML could not be loaded from CTORCH_NVML_LIB=%s: %s", file, e ? e : "dlopen failed");
        else reason("NVML not found: %s", e ? e : "dlopen failed");
        return;
    }
    struct {
        const char *sym;
        void **slot;
    } syms[] = {
        {"nvmlInit_v2", (void **)&nv.init},
        {"nvmlShutdown", (void **)&nv.shutdown},
        {"nvmlDeviceGetCount_v2", (void **)&nv.count},
        {"nvmlDeviceGetHandleByIndex_v2", (void **)&nv.handle},
        {"nvmlDeviceGetName", (void **)&nv.name},
        {"nvmlDeviceGetMemoryInfo", (void **)&nv.memory},
        {"nvmlDeviceGetUtilizationRates", (void **)&nv.util},
        {"nvmlDeviceGetPowerUsage", (void **)&nv.power},
        {"nvmlDeviceGetClockInfo", (void **)&nv.clock},
        {"nvmlDeviceGetTemperature", (void **)&nv.temperature},
        {"nvmlErrorString", (void **)&nv.error_string},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        *syms[i].slot = dlsym(h, syms[i].sym);
        if (!*syms[i].slot) {
            reason("NVML library %s lacks %s (not NVML, or an NVML too old)", file, syms[i].sym);
            memset(&nv, 0, sizeof nv);
            dlclose(h);
            return;
        }
    }
    nvml_return r = nv.init();
    if (r != NVML_SUCCESS) {
        reason("NVML initialisation failed: %s (NVML error %d)", error_text(r), r);
        memset(&nv, 0, sizeof nv);
        dlclose(h);
        return;
    }
    unsigned int n = 0;
    r = nv.count(&n);
    if (r != NVML_SUCCESS || n == 0) {
        if (r != NVML_SUCCESS) reason("NVML could not count the GPUs: %s (NVML error %d)", error_text(r), r);
        else reason("NVML lists no GPU");
        nv.shutdown();
        memset(&nv, 0, sizeof nv);
        dlclose(h);
        return;
    }
    nv_ready = true; /* the handle stays open: NVML is used until the process ends */
}

static double mhz(nvml_device d, int which)
{
    unsigned int v = 0;
    return nv.clock(d, which, &v) == NVML_SUCCESS ? (double)v : NAN;
}

static void read_gpu(unsigned int index, ct_telemetry_gpu *g)
{
    g->index = (int)index;
    g->name[0] = 0;
    g->mem_used_bytes = g->mem_total_bytes = -1;
    g->util_pct = g->mem_util_pct = g->power_w = g->sm_mhz = g->mem_mhz = g->temp_c = NAN;
    nvml_device d = NULL;
    if (nv.handle(index, &d) != NVML_SUCCESS) return; /* every figure unavailable */

    _Static_assert(CT_TELEMETRY_GPU_NAME == NVML_NAME_BUFFER, "a GPU name holds NVML's longest");
    char name[NVML_NAME_BUFFER];
    memset(name, 0, sizeof name);
    if (nv.name(d, name, NVML_NAME_BUFFER) == NVML_SUCCESS) {
        name[NVML_NAME_BUFFER - 1] = 0; /* terminated even if NVML filled the buffer */
        memcpy(g->name, name, sizeof g->name);
        printable(g->name);
    }
    nvml_memory m;
    if (nv.memory(d, &m) == NVML_SUCCESS && m.total <= INT64_MAX && m.used <= INT64_MAX) {
        g->mem_total_bytes = (int64_t)m.total;
        g->mem_used_bytes = (int64_t)m.used;
    }
    nvml_utilization u;
    if (nv.util(d, &u) == NVML_SUCCESS) {
        g->util_pct = u.gpu;
        g->mem_util_pct = u.memory;
    }
    unsigned int v = 0;
    if (nv.power(d, &v) == NVML_SUCCESS) g->power_w = v / 1000.0; /* milliwatts */
    g->sm_mhz = mhz(d, NVML_CLOCK_SM);
    g->mem_mhz = mhz(d, NVML_CLOCK_MEM);
    if (nv.temperature(d, NVML_TEMPERATURE_GPU, &v) == NVML_SUCCESS) g->temp_c = v;
}

void ct_telemetry_read_gpus(ct_telemetry_sample *s)
{
    s->ngpu = 0;
    s->gpu_status[0] = 0;
    pthread_once(&nv_once, nv_load);
    if (!nv_ready) {
        snprintf(s->gpu_status, sizeof s->gpu_status, "%s", nv_reason);
        return;
    }
    unsigned int n = 0;
    nvml_return r = nv.count(&n);
    if (r != NVML_SUCCESS) {
        snprintf(s->gpu_status, sizeof s->gpu_status, "NVML could not count the GPUs: %s (NVML error %d)",
                 error_text(r), r);
        printable(s->gpu_status);
        return;
    }
    if (n == 0) {
        snprintf(s->gpu_status, sizeof s->gpu_status, "NVML lists no GPU");
        return;
    }
    if (n > CT_TELEMETRY_MAX_GPUS)
        snprintf(s->gpu_status, sizeof s->gpu_status, "NVML lists %u GPUs; the first %d are shown", n,
                 CT_TELEMETRY_MAX_GPUS);
    unsigned int shown = n > CT_TELEMETRY_MAX_GPUS ? CT_TELEMETRY_MAX_GPUS : n;
    for (unsigned int i = 0; i < shown; i++) read_gpu(i, &s->gpu[i]);
    s->ngpu = (int)shown;
}

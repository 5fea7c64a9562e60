/* A stand-in for libnvidia-ml with canned answers, loaded through CTORCH_NVML_LIB by the
 * telemetry tests (test_telemetry_nvml, tests/python/test_telemetry.py). It exports the NVML
 * entry points ctorch calls (and nvmlInitWithFlags, which pynvml's nvmlInit calls), with
 * NVML's signatures and return codes:
 *   GPU 0 "Fake GPU A": every figure (the values in devs[0] below);
 *   GPU 1 "Fake GPU B": power refused with NOT_SUPPORTED (as on boards without a power
 *          sensor; the output is overwritten with garbage first), temperature refused with
 *          NO_PERMISSION; its memory utilisation is a real 0 %.
 * The environment steers the failure paths:
 *   FAKE_NVML_INIT_ERROR=N   nvmlInit_v2 returns N (9: DRIVER_NOT_LOADED);
 *   FAKE_NVML_COUNT=N        nvmlDeviceGetCount_v2 reports N GPUs (default 2; above 2, the
 *                            extra ones answer like GPU 1). */
#include <stdlib.h>
#include <string.h>

typedef struct fake_dev {
    const char *name;
    unsigned long long total, used;
    unsigned int util, mem_util, power_mw, sm_mhz, mem_mhz, temp_c;
} fake_dev;

enum {
    SUCCESS = 0,
    ERROR_INVALID_ARGUMENT = 2,
    ERROR_NOT_SUPPORTED = 3,
    ERROR_NO_PERMISSION = 4,
    ERROR_UNINITIALIZED = 1,
    ERROR_DRIVER_NOT_LOADED = 9,
    ERROR_INSUFFICIENT_SIZE = 7,
};

static const fake_dev devs[2] = {
    {"Fake GPU A", 150754820096ULL, 1234567168ULL, 37, 12, 123456, 1980, 3201, 41},
    {"Fake GPU B", 85899345920ULL, 536870912ULL, 99, 0, 0, 1410, 1593, 0},
};
static int inited;

typedef struct {
    unsigned long long total, free, used;
} nvml_memory;
typedef struct {
    unsigned int gpu, memory;
} nvml_utilization;

/* Exported (the prototypes keep -Wmissing-prototypes quiet). */
int nvmlInit_v2(void);
int nvmlInitWithFlags(unsigned int flags);
int nvmlShutdown(void);
int nvmlDeviceGetCount_v2(unsigned int *n);
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, const fake_dev **d);
int nvmlDeviceGetName(const fake_dev *d, char *buf, unsigned int len);
int nvmlDeviceGetMemoryInfo(const fake_dev *d, nvml_memory *m);
int nvmlDeviceGetUtilizationRates(const fake_dev *d, nvml_utilization *u);
int nvmlDeviceGetPowerUsage(const fake_dev *d, unsigned int *mw);
int nvmlDeviceGetClockInfo(const fake_dev *d, int type, unsigned int *mhz);
int nvmlDeviceGetTemperature(const fake_dev *d, int sensor, unsigned int *c);
const char *nvmlErrorString(int r);

int nvmlInit_v2(void)
{
    const char *e = getenv("FAKE_NVML_INIT_ERROR");
    if (e && *e) return atoi(e);
    inited++;
    return SUCCESS;
}

/* what pynvml's nvmlInit calls (the Python test reads the fake through it too) */
int nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    return nvmlInit_v2();
}

int nvmlShutdown(void)
{
    if (!inited) return ERROR_UNINITIALIZED;
    inited--;
    return SUCCESS;
}

static unsigned int count(void)
{
    const char *e = getenv("FAKE_NVML_COUNT");
    return e && *e ? (unsigned int)strtoul(e, NULL, 10) : 2;
}

int nvmlDeviceGetCount_v2(unsigned int *n)
{
    if (!inited) return ERROR_UNINITIALIZED;
    if (!n) return ERROR_INVALID_ARGUMENT;
    *n = count();
    return SUCCESS;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int i, const fake_dev **d)
{
    if (!inited) return ERROR_UNINITIALIZED;
    if (!d || i >= count()) return ERROR_INVALID_ARGUMENT;
    *d = &devs[i < 2 ? i : 1];
    return SUCCESS;
}

int nvmlDeviceGetName(const fake_dev *d, char *buf, unsigned int len)
{
    if (!d || !buf) return ERROR_INVALID_ARGUMENT;
    if (strlen(d->name) + 1 > len) return ERROR_INSUFFICIENT_SIZE;
    strcpy(buf, d->name);
    return SUCCESS;
}

int nvmlDeviceGetMemoryInfo(const fake_dev *d, nvml_memory *m)
{
    if (!d || !m) return ERROR_INVALID_ARGUMENT;
    m->total = d->total;
    m->used = d->used;
    m->free = d->total - d->used;
    return SUCCESS;
}

int nvmlDeviceGetUtilizationRates(const fake_dev *d, nvml_utilization *u)
{
    if (!d || !u) return ERROR_INVALID_ARGUMENT;
    u->gpu = d->util;
    u->memory = d->mem_util;
    return SUCCESS;
}

int nvmlDeviceGetPowerUsage(const fake_dev *d, unsigned int *mw)
{
    if (!d || !mw) return ERROR_INVALID_ARGUMENT;
    if (d == &devs[1]) {
        *mw = 777000; /* garbage left in the output: must not be reported */
        return ERROR_NOT_SUPPORTED;
    }
    *mw = d->power_mw;
    return SUCCESS;
}

int nvmlDeviceGetClockInfo(const fake_dev *d, int type, unsigned int *mhz)
{
    if (!d || !mhz) return ERROR_INVALID_ARGUMENT;
    if (type == 1) *mhz = d->sm_mhz;       /* NVML_CLOCK_SM */
    else if (type == 2) *mhz = d->mem_mhz; /* NVML_CLOCK_MEM */
    else return ERROR_INVALID_ARGUMENT;    /* graphics / video: not asked for */
    return SUCCESS;
}

int nvmlDeviceGetTemperature(const fake_dev *d, int sensor, unsigned int *c)
{
    if (!d || !c || sensor != 0) return ERROR_INVALID_ARGUMENT; /* NVML_TEMPERATURE_GPU */
    if (d == &devs[1]) return ERROR_NO_PERMISSION;
    *c = d->temp_c;
    return SUCCESS;
}

const char *nvmlErrorString(int r)
{
    switch (r) {
    case SUCCESS: return "Success";
    case ERROR_UNINITIALIZED: return "Uninitialized";
    case ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case ERROR_NOT_SUPPORTED: return "Not Supported";
    case ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    default: return "Unknown Error";
    }
}

/*
 * ctorch/telemetry.h - what the machine and the process are doing: memory (RSS, peak RSS,
 * the allocator's live and peak bytes), CPU utilisation per core and of this process,
 * clock per core, temperature, power (RAPL energy counters), and each NVIDIA GPU's memory,
 * utilisation, power, clocks and temperature through NVML (libnvidia-ml, loaded at run time:
 * without it, or without a GPU, the sample lists no GPU and says why in gpu_status).
 *
 * Figures the machine does not expose are reported as unavailable (NaN for doubles, -1
 * for byte counts), never invented. Rates (utilisation, power) are measured between two
 * samples of the same ct_telemetry: the first sample has none.
 */
#ifndef CTORCH_TELEMETRY_H
#define CTORCH_TELEMETRY_H

#include "ctorch/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CT_TELEMETRY_MAX_CPUS 256
#define CT_TELEMETRY_MAX_GPUS 16
#define CT_TELEMETRY_GPU_NAME 96   /* NVML's longest device name, NUL included */
#define CT_TELEMETRY_GPU_STATUS 256

/** One GPU as NVML reports it at the time of the sample. A figure NVML refuses for this GPU
 *  (not supported, no permission, ...) is unavailable: NaN for doubles, -1 for byte counts. */
typedef struct ct_telemetry_gpu {
    int index;                          /**< NVML's device index */
    char name[CT_TELEMETRY_GPU_NAME];   /**< e.g. "NVIDIA H200" (printable ASCII); "" unavailable */
    int64_t mem_used_bytes;             /**< device memory in use (all processes); -1 */
    int64_t mem_total_bytes;            /**< device memory; -1 */
    double util_pct;                    /**< % of NVML's last sample period a kernel ran; NaN */
    double mem_util_pct;                /**< % of that period device memory was read or written; NaN */
    double power_w;                     /**< board power draw, watts; NaN */
    double sm_mhz;                      /**< current SM clock; NaN */
    double mem_mhz;                     /**< current memory clock; NaN */
    double temp_c;                      /**< GPU die temperature; NaN */
} ct_telemetry_gpu;

/** One sample. */
typedef struct ct_telemetry_sample {
    double time_s;               /**< CLOCK_MONOTONIC seconds of the sample */
    double interval_s;           /**< seconds since the previous sample; NaN for the first */
    int64_t rss_bytes;           /**< resident set size of this process; -1 unavailable */
    int64_t peak_rss_bytes;      /**< peak RSS (VmHWM); -1 unavailable */
    int64_t mem_total_bytes;     /**< machine memory; -1 unavailable */
    int64_t mem_available_bytes; /**< machine memory available; -1 unavailable */
    size_t alloc_current_bytes;  /**< ctorch allocator, live */
    size_t alloc_peak_bytes;     /**< ctorch allocator, peak */
    int ncpu;                    /**< CPUs listed (entries below) */
    double cpu_util[CT_TELEMETRY_MAX_CPUS]; /**< busy fraction 0..1 per CPU over the interval */
    double cpu_util_total;       /**< busy fraction of all CPUs over the interval */
    double process_cpu;          /**< this process's CPU seconds per second (0..ncpu) */
    double cpu_mhz[CT_TELEMETRY_MAX_CPUS]; /**< current clock per CPU; NaN unavailable */
    double temp_c;               /**< hottest thermal zone / hwmon sensor; NaN unavailable */
    double energy_j;             /**< RAPL package energy counter (sum of packages); NaN */
    double power_w;              /**< RAPL package power over the interval; NaN unavailable */
    int ngpu;                    /**< GPUs listed (entries below); 0 when none could be read */
    ct_telemetry_gpu gpu[CT_TELEMETRY_MAX_GPUS];
    /** Why no GPU is listed (NVML not found or not loadable, its initialisation failed, no
     *  GPU), or a note about the list (more GPUs than CT_TELEMETRY_MAX_GPUS); "" otherwise. */
    char gpu_status[CT_TELEMETRY_GPU_STATUS];
} ct_telemetry_sample;

/** Sampler state: previous counters, so rates can be computed. Zero-initialise it (or use
 *  ct_telemetry_init) before the first ct_telemetry_read. */
typedef struct ct_telemetry {
    double last_time;
    int ncpu;
    uint64_t busy[CT_TELEMETRY_MAX_CPUS + 1], total[CT_TELEMETRY_MAX_CPUS + 1];
    double proc_cpu_s;
    double energy_j;
    int have_last;
} ct_telemetry;

/** Reset a sampler. */
CT_API void ct_telemetry_init(ct_telemetry *t);

/** Take a sample (reads /proc and /sys; a few hundred microseconds; plus NVML's queries when
 *  it is present). Never fails for a missing source: that figure is marked unavailable.
 *  CT_EINVAL for NULL arguments.
 *
 *  NVML is loaded and initialised once per process, by the first call (thread-safe): from
 *  the file named by the environment variable CTORCH_NVML_LIB when it is set and not empty,
 *  else "libnvidia-ml.so.1" through the dynamic linker's search. The outcome of that first
 *  attempt holds for the process. */
CT_API ct_status ct_telemetry_read(ct_telemetry *t, ct_telemetry_sample *out);

#ifdef __cplusplus
}
#endif
#endif

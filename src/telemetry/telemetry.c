/* Telemetry from /proc and /sys (GPUs: nvml.c). Each source is optional: what cannot be read
 * is reported as unavailable (NaN or -1), never guessed. */
#include "core/internal.h"
#include "ctorch/telemetry.h"
#include "telemetry/telemetry_internal.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void ct_telemetry_init(ct_telemetry *t)
{
    if (t) memset(t, 0, sizeof *t);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* First integer after `key` in a "Key: value kB" file, in bytes (-1 when absent). */
static int64_t kb_field(const char *path, const char *key)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[256];
    size_t kl = strlen(key);
    int64_t v = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, kl) && line[kl] == ':') {
            v = strtoll(line + kl + 1, NULL, 10) * 1024;
            break;
        }
    fclose(f);
    return v;
}

static bool read_double_file(const char *path, double *out)
{
    FILE *f = fopen(path, "r");
    if (!f) return false;
    bool ok = fscanf(f, "%lf", out) == 1;
    fclose(f);
    return ok;
}

/* Per-CPU busy/total jiffies from /proc/stat; index 0 is the "cpu" total line, i+1 CPU i.
 * Returns the number of CPUs. */
static int read_stat(uint64_t *busy, uint64_t *total)
{
    FILE *f = fopen("/proc/stat", "r");
    if (!f) return -1;
    char line[512];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "cpu", 3)) continue;
        int idx;
        char *p = line + 3;
        if (*p == ' ') idx = 0;
        else {
            idx = atoi(p) + 1;
            if (idx > CT_TELEMETRY_MAX_CPUS) continue;
            if (idx > n) n = idx;
        }
        while (*p && *p != ' ') p++;
        unsigned long long v[10] = {0};
        sscanf(p, "%llu %llu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
               &v[6], &v[7], &v[8], &v[9]);
        uint64_t idle = v[3] + v[4], all = 0;
        for (int k = 0; k < 8; k++) all += v[k]; /* guest time is already in user */
        busy[idx] = all - idle;
        total[idx] = all;
    }
    fclose(f);
    return n;
}

static double process_cpu_seconds(void)
{
    FILE *f = fopen("/proc/self/stat", "r");
    if (!f) return NAN;
    char buf[1024];
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = 0;
    char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    if (!p) return NAN;
    unsigned long long ut = 0, st = 0;
    /* fields after ")": state(3) ... utime(14) stime(15) */
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2) return NAN;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static void read_clocks(ct_telemetry_sample *s)
{
    for (int i = 0; i < CT_TELEMETRY_MAX_CPUS; i++) s->cpu_mhz[i] = NAN;
    int have = 0;
    for (int i = 0; i < s->ncpu; i++) {
        char path[128];
        double khz;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/cpufreq/scaling_cur_freq", i);
        if (read_double_file(path, &khz)) {
            s->cpu_mhz[i] = khz / 1000.0;
            have++;
        }
    }
    if (have) return;
    FILE *f = fopen("/proc/cpuinfo", "r"); /* x86: "processor : N" ... "cpu MHz : x" */
    if (!f) return;
    char line[256];
    int cur = -1;
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "processor", 9)) {
            char *c = strchr(line, ':');
            cur = c ? atoi(c + 1) : -1;
        } else if (!strncmp(line, "cpu MHz", 7) && cur >= 0 && cur < CT_TELEMETRY_MAX_CPUS) {
            char *c = strchr(line, ':');
            if (c) s->cpu_mhz[cur] = strtod(c + 1, NULL);
        }
    }
    fclose(f);
}

/* Hottest reading of thermal zones and hwmon temperature inputs (millidegrees). */
static double read_temperature(void)
{
    double best = NAN;
    DIR *d = opendir("/sys/class/thermal");
    struct dirent *e;
    char path[512];
    double v;
    if (d) {
        while ((e = readdir(d)))
            if (!strncmp(e->d_name, "thermal_zone", 12)) {
                snprintf(path, sizeof path, "/sys/class/thermal/%s/temp", e->d_name);
                if (read_double_file(path, &v) && (isnan(best) || v / 1000 > best)) best = v / 1000;
            }
        closedir(d);
    }
    d = opendir("/sys/class/hwmon");
    if (d) {
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            for (int k = 1; k <= 16; k++) {
                snprintf(path, sizeof path, "/sys/class/hwmon/%s/temp%d_input", e->d_name, k);
                if (read_double_file(path, &v) && (isnan(best) || v / 1000 > best)) best = v / 1000;
            }
        }
        closedir(d);
    }
    return best;
}

/* Sum of the RAPL package domains' energy counters, in joules. */
static double read_energy(void)
{
    double sum = NAN, v;
    char path[256];
    for (int k = 0; k < 16; k++) {
        snprintf(path, sizeof path, "/sys/class/powercap/intel-rapl:%d/energy_uj", k);
        if (!read_double_file(path, &v)) continue;
        sum = (isnan(sum) ? 0 : sum) + v * 1e-6;
    }
    return sum;
}

ct_status ct_telemetry_read(ct_telemetry *t, ct_telemetry_sample *s)
{
    if (!t || !s) return ct_error(CT_EINVAL, "ct_telemetry_read: t and out must not be NULL");
    memset(s, 0, sizeof *s);
    double now = now_s();
    s->time_s = now;
    s->interval_s = t->have_last ? now - t->last_time : NAN;
    s->rss_bytes = kb_field("/proc/self/status", "VmRSS");
    s->peak_rss_bytes = kb_field("/proc/self/status", "VmHWM");
    s->mem_total_bytes = kb_field("/proc/meminfo", "MemTotal");
    s->mem_available_bytes = kb_field("/proc/meminfo", "MemAvailable");
    ct_memory_stats_t m;
    ct_memory_stats(&m);
    s->alloc_current_bytes = m.current_bytes;
    s->alloc_peak_bytes = m.peak_bytes;

    uint64_t busy[CT_TELEMETRY_MAX_CPUS + 1] = {0}, total[CT_TELEMETRY_MAX_CPUS + 1] = {0};
    int n = read_stat(busy, total);
    s->ncpu = n > 0 ? n : 0;
    for (int i = 0; i < CT_TELEMETRY_MAX_CPUS; i++) s->cpu_util[i] = NAN;
    s->cpu_util_total = NAN;
    if (n > 0 && t->have_last && t->ncpu == n) {
        for (int i = 0; i <= n; i++) {
            uint64_t dt = total[i] - t->total[i], db = busy[i] - t->busy[i];
            double u = dt ? (double)db / (double)dt : NAN;
            if (i == 0) s->cpu_util_total = u;
            else s->cpu_util[i - 1] = u;
        }
    }
    double pc = process_cpu_seconds();
    s->process_cpu = t->have_last && s->interval_s > 0 ? (pc - t->proc_cpu_s) / s->interval_s : NAN;
    read_clocks(s);
    s->temp_c = read_temperature();
    s->energy_j = read_energy();
    s->power_w = t->have_last && !isnan(s->energy_j) && !isnan(t->energy_j) && s->interval_s > 0 &&
                         s->energy_j >= t->energy_j
                     ? (s->energy_j - t->energy_j) / s->interval_s
                     : NAN;
    ct_telemetry_read_gpus(s);

    t->last_time = now;
    t->ncpu = n;
    if (n > 0) {
        memcpy(t->busy, busy, sizeof busy);
        memcpy(t->total, total, sizeof total);
    }
    t->proc_cpu_s = pc;
    t->energy_j = s->energy_j;
    t->have_last = 1;
    return CT_OK;
}

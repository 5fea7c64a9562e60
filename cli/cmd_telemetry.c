/* ctorch telemetry [--json] [--watch S] [--count N] */
#include "cli.h"
#include "ctorch/telemetry.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static json_t *num_or_null(double v)
{
    return isnan(v) ? json_null() : json_real(v);
}

static json_t *bytes_or_null(int64_t v)
{
    return v < 0 ? json_null() : json_integer(v);
}

/* One GPU; null for what NVML would not tell. */
static json_t *gpu_json(const ct_telemetry_gpu *g)
{
    return json_pack("{s:i, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "index", g->index, "name",
                     g->name[0] ? json_string(g->name) : json_null(), "memory_used_bytes",
                     bytes_or_null(g->mem_used_bytes), "memory_total_bytes", bytes_or_null(g->mem_total_bytes),
                     "utilisation_pct", num_or_null(g->util_pct), "memory_utilisation_pct",
                     num_or_null(g->mem_util_pct), "power_w", num_or_null(g->power_w), "sm_mhz",
                     num_or_null(g->sm_mhz), "memory_mhz", num_or_null(g->mem_mhz), "temperature_c",
                     num_or_null(g->temp_c));
}

static void print_json(const ct_telemetry_sample *s)
{
    json_t *util = json_array(), *mhz = json_array(), *gpus = json_array();
    for (int i = 0; i < s->ncpu; i++) {
        json_array_append_new(util, num_or_null(s->cpu_util[i]));
        json_array_append_new(mhz, num_or_null(s->cpu_mhz[i]));
    }
    for (int i = 0; i < s->ngpu; i++) json_array_append_new(gpus, gpu_json(&s->gpu[i]));
    json_t *j = json_pack("{s:f, s:o, s:{s:o, s:o, s:o, s:o, s:I, s:I}, s:{s:i, s:o, s:o, s:o, s:o}, s:o, s:{s:o, s:o}}",
                          "time_s", s->time_s, "interval_s", num_or_null(s->interval_s), "memory", "rss_bytes",
                          bytes_or_null(s->rss_bytes), "peak_rss_bytes", bytes_or_null(s->peak_rss_bytes),
                          "total_bytes", bytes_or_null(s->mem_total_bytes), "available_bytes",
                          bytes_or_null(s->mem_available_bytes), "allocator_live_bytes",
                          (json_int_t)s->alloc_current_bytes, "allocator_peak_bytes", (json_int_t)s->alloc_peak_bytes,
                          "cpu", "count", s->ncpu, "utilisation", util, "utilisation_total",
                          num_or_null(s->cpu_util_total), "process_cpu", num_or_null(s->process_cpu), "mhz", mhz,
                          "temperature_c", num_or_null(s->temp_c), "power", "energy_j", num_or_null(s->energy_j),
                          "watts", num_or_null(s->power_w));
    json_object_set_new(j, "gpus", gpus);
    json_object_set_new(j, "gpu_status", s->gpu_status[0] ? json_string(s->gpu_status) : json_null());
    char *txt = json_dumps(j, JSON_PRESERVE_ORDER | JSON_COMPACT);
    puts(txt);
    free(txt);
    json_decref(j);
    fflush(stdout);
}

static void print_value(const char *label, double v, const char *fmt, const char *unit)
{
    printf("%-22s", label);
    if (isnan(v)) printf("unavailable\n");
    else {
        printf(fmt, v);
        printf(" %s\n", unit);
    }
}

static void print_text(const ct_telemetry_sample *s)
{
    printf("%-22s", "memory (RSS / peak)");
    if (s->rss_bytes < 0) printf("unavailable\n");
    else printf("%.1f MiB / %.1f MiB\n", s->rss_bytes / 1048576.0, s->peak_rss_bytes / 1048576.0);
    printf("%-22s%.1f MiB / %.1f MiB\n", "allocator (live/peak)", s->alloc_current_bytes / 1048576.0,
           s->alloc_peak_bytes / 1048576.0);
    if (s->mem_total_bytes >= 0)
        printf("%-22s%.1f GiB available of %.1f GiB\n", "machine memory", s->mem_available_bytes / 1073741824.0,
               s->mem_total_bytes / 1073741824.0);
    print_value("CPU utilisation", s->cpu_util_total * 100, "%.1f", "% (all CPUs)");
    for (int i = 0; i < s->ncpu; i++) {
        char l[32];
        snprintf(l, sizeof l, "  cpu%d", i);
        printf("%-22s", l);
        if (isnan(s->cpu_util[i])) printf("util unavailable");
        else printf("util %5.1f%%", s->cpu_util[i] * 100);
        if (isnan(s->cpu_mhz[i])) printf(", clock unavailable\n");
        else printf(", %.0f MHz\n", s->cpu_mhz[i]);
    }
    print_value("temperature", s->temp_c, "%.1f", "C");
    print_value("power (RAPL package)", s->power_w, "%.1f", "W");
    if (s->ngpu == 0) printf("%-22sunavailable: %s\n", "GPUs", s->gpu_status);
    else if (s->gpu_status[0]) printf("%-22s%s\n", "GPUs", s->gpu_status);
    for (int i = 0; i < s->ngpu; i++) {
        const ct_telemetry_gpu *g = &s->gpu[i];
        char l[32];
        snprintf(l, sizeof l, "gpu%d", g->index);
        printf("%-22s%s\n", l, g->name[0] ? g->name : "(name unavailable)");
        printf("%-22s", "  memory (used/total)");
        if (g->mem_total_bytes < 0) printf("unavailable\n");
        else printf("%.1f GiB / %.1f GiB\n", g->mem_used_bytes / 1073741824.0, g->mem_total_bytes / 1073741824.0);
        print_value("  utilisation", g->util_pct, "%.0f", "%");
        print_value("  memory utilisation", g->mem_util_pct, "%.0f", "%");
        print_value("  power", g->power_w, "%.1f", "W");
        print_value("  SM clock", g->sm_mhz, "%.0f", "MHz");
        print_value("  memory clock", g->mem_mhz, "%.0f", "MHz");
        print_value("  temperature", g->temp_c, "%.0f", "C");
    }
    fflush(stdout);
}

int cmd_telemetry(int argc, char **argv)
{
    bool json = false;
    double watch = 0;
    long long count = 0;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            puts("usage: ctorch telemetry [--json] [--watch SECONDS] [--count N]\n"
                 "Memory (RSS, peak, allocator), CPU utilisation and clock per core, temperature and\n"
                 "power (RAPL), and each NVIDIA GPU's memory, utilisation, power, SM and memory clocks\n"
                 "and temperature through NVML (libnvidia-ml.so.1, or the file CTORCH_NVML_LIB names;\n"
                 "without it or a GPU, the reason is shown). Rates need an interval: a single sample\n"
                 "measures over 0.5 s. With --watch, prints a sample every SECONDS (N times, default\n"
                 "forever). Figures the machine does not expose are shown as unavailable (null in JSON).");
            return 0;
        }
        if (!strcmp(argv[i], "--json")) json = true;
        else if (cli_opt(argc, argv, &i, "--watch", &v)) {
            if (!cli_float("--watch", v, &watch) || !(watch > 0)) {
                fprintf(stderr, "ctorch telemetry: --watch needs a positive number of seconds\n");
                return 2;
            }
        } else if (cli_opt(argc, argv, &i, "--count", &v)) {
            if (!cli_int("--count", v, 1, 1LL << 40, &count)) return 2;
        } else {
            fprintf(stderr, "ctorch telemetry: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    ct_telemetry t;
    ct_telemetry_sample s;
    ct_telemetry_init(&t);
    ct_status st = ct_telemetry_read(&t, &s);
    if (st) return cli_fail("telemetry", st);
    double period = watch > 0 ? watch : 0.5;
    long long n = watch > 0 ? (count ? count : -1) : 1;
    for (long long k = 0; n < 0 || k < n; k++) {
        struct timespec ts = {(time_t)period, (long)((period - (double)(time_t)period) * 1e9)};
        nanosleep(&ts, NULL);
        if ((st = ct_telemetry_read(&t, &s))) return cli_fail("telemetry", st);
        if (json) print_json(&s);
        else {
            print_text(&s);
            if (n != 1) puts("");
        }
    }
    return 0;
}

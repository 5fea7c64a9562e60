/* ctorch bench io: safetensors open, full read + checksum, bf16 -> f32 conversion and save,
 * each beside its baseline measured in the same run on the same file (page cache warm):
 * memcpy bandwidth, a plain read() of the file, a plain write() of the same bytes. */
#include "bench_util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHUNK ((size_t)8 << 20)
#define SLACK ((size_t)1 << 20) /* room for the header in the read() buffer */

typedef struct io_case {
    char path[4096], small[4096], plain[4096];
    size_t count;        /* tensors */
    size_t tensor_bytes; /* bytes per tensor */
    size_t total;        /* data bytes */
    ct_tensor *tensors;  /* bf16 [rows, 2048] */
    char **names;
    uint8_t *buf; /* total bytes: memcpy destination and read() buffer */
    float *f32;   /* one tensor converted to f32 */
    uint64_t sum; /* checksum sink, so nothing is optimised away */
    ct_save_options save;
} io_case;

/* Sum of 64-bit words (+ tail bytes): cheap enough to run at memory speed. */
static uint64_t checksum(const uint8_t *p, size_t n)
{
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        uint64_t w[4];
        memcpy(w, p + i, 32);
        s0 += w[0];
        s1 += w[1];
        s2 += w[2];
        s3 += w[3];
    }
    for (; i < n; i++)
        s0 += p[i];
    return s0 ^ (s1 << 1) ^ (s2 << 2) ^ (s3 << 3);
}

static ct_status run_memcpy(void *p)
{
    io_case *c = p;
    size_t o = 0;
    for (size_t i = 0; i < c->count; i++, o += c->tensor_bytes)
        memcpy(c->buf + o, c->tensors[i].data, c->tensor_bytes);
    c->sum += c->buf[c->total / 2];
    return CT_OK;
}

/* memcpy into freshly allocated memory: the page faults a write into new pages costs. */
static ct_status run_memcpy_fresh(void *p)
{
    io_case *c = p;
    uint8_t *d;
    ct_status s = ct_alloc((void **)&d, c->total);
    if (s != CT_OK) return s;
    size_t o = 0;
    for (size_t i = 0; i < c->count; i++, o += c->tensor_bytes)
        memcpy(d + o, c->tensors[i].data, c->tensor_bytes);
    c->sum += d[c->total / 2];
    ct_free(d);
    return CT_OK;
}

/* Save to a new file (the previous one is removed first, as run_write does). */
static ct_status run_save_new(void *p)
{
    io_case *c = p;
    unlink(c->path);
    return ct_save_safetensors(c->path, c->tensors, (const char *const *)c->names, c->count, NULL,
                               NULL, 0, &c->save);
}

/* Save over the existing file: ext4 (auto_da_alloc) starts writeback at such a rename. */
static ct_status run_save(void *p)
{
    io_case *c = p;
    return ct_save_safetensors(c->path, c->tensors, (const char *const *)c->names, c->count, NULL,
                               NULL, 0, &c->save);
}

/* Baseline of save: write() the same bytes to a fresh file, no fsync. */
static ct_status run_write(void *p)
{
    io_case *c = p;
    unlink(c->plain);
    int fd = open(c->plain, O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
    if (fd < 0) {
        fprintf(stderr, "ctorch bench io: cannot create %s: %s\n", c->plain, strerror(errno));
        return CT_EIO;
    }
    for (size_t i = 0; i < c->count; i++) {
        const uint8_t *b = c->tensors[i].data;
        size_t n = c->tensor_bytes;
        while (n) {
            ssize_t r = write(fd, b, n);
            if (r <= 0) {
                fprintf(stderr, "ctorch bench io: write failed: %s\n", strerror(errno));
                close(fd);
                return CT_EIO;
            }
            b += r;
            n -= (size_t)r;
        }
    }
    return close(fd) == 0 ? CT_OK : CT_EIO;
}

static ct_status run_open(void *p)
{
    io_case *c = p;
    ct_tensor_file *f;
    ct_status s = ct_load(c->path, NULL, &f);
    if (s != CT_OK) return s;
    c->sum += ct_tensor_file_count(f);
    ct_tensor_file_close(f);
    return CT_OK;
}

static ct_status run_open_small(void *p)
{
    io_case *c = p;
    ct_tensor_file *f;
    ct_status s = ct_load(c->small, NULL, &f);
    if (s != CT_OK) return s;
    c->sum += ct_tensor_file_count(f);
    ct_tensor_file_close(f);
    return CT_OK;
}

static ct_status run_read(void *p)
{
    io_case *c = p;
    ct_tensor_file *f;
    ct_status s = ct_load(c->path, NULL, &f);
    if (s != CT_OK) return s;
    for (size_t i = 0; i < ct_tensor_file_count(f); i++) {
        ct_tensor_info t;
        ct_tensor_file_info(f, i, &t);
        c->sum += checksum(t.data, (size_t)t.nbytes);
    }
    ct_tensor_file_close(f);
    return CT_OK;
}

/* Baselines of read: read() the whole file in 8 MiB chunks into memory, with and without
 * the same checksum. */
static ct_status plain_read(io_case *c, bool sum)
{
    int fd = open(c->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return CT_EIO;
    size_t o = 0;
    for (;;) {
        size_t room = c->total + SLACK - o, want = CHUNK < room ? CHUNK : room;
        ssize_t r = read(fd, c->buf + o, want);
        if (r < 0) {
            close(fd);
            return CT_EIO;
        }
        if (r == 0) break;
        if (sum) c->sum += checksum(c->buf + o, (size_t)r);
        o += (size_t)r;
        if (o == c->total + SLACK) {
            fprintf(stderr, "ctorch bench io: the file is larger than expected\n");
            close(fd);
            return CT_EIO;
        }
    }
    close(fd);
    return CT_OK;
}

static ct_status run_read_plain(void *p)
{
    return plain_read(p, false);
}

static ct_status run_read_plain_sum(void *p)
{
    return plain_read(p, true);
}

static ct_status run_convert(void *p)
{
    io_case *c = p;
    ct_tensor_file *f;
    ct_status s = ct_load(c->path, NULL, &f);
    for (size_t i = 0; i < ct_tensor_file_count(f) && s == CT_OK; i++) {
        ct_tensor t;
        s = ct_tensor_file_read(f, i, CT_DTYPE_F32, &t);
        if (s == CT_OK) c->sum += ((const uint8_t *)t.data)[0];
        ct_tensor_free(&t);
    }
    ct_tensor_file_close(f);
    return s;
}

/* The same conversion into memory allocated once (what loading into parameters costs). */
static ct_status run_convert_into(void *p)
{
    io_case *c = p;
    ct_tensor_file *f;
    ct_status s = ct_load(c->path, NULL, &f);
    if (s != CT_OK) return s;
    for (size_t i = 0; s == CT_OK && i < ct_tensor_file_count(f); i++) {
        ct_tensor_info t;
        ct_tensor dst;
        if ((s = ct_tensor_file_info(f, i, &t)) ||
            (s = ct_tensor_wrap(&dst, c->f32, CT_DTYPE_F32, t.ndim, t.shape, NULL)) ||
            (s = ct_tensor_file_read_into(f, i, &dst)))
            break;
        c->sum += ((const uint8_t *)c->f32)[0];
    }
    ct_tensor_file_close(f);
    return s;
}

static double rate(size_t bytes, const bench_time *t)
{
    return t->median > 0 ? bytes / t->median * 1e-9 : 0;
}

static json_t *case_json(const bench_time *t, size_t bytes)
{
    json_t *j = bench_time_json(t);
    json_object_set_new(j, "gb_per_s", json_real(rate(bytes, t)));
    return j;
}

static int io_fail(io_case *c, const char *what, ct_status s)
{
    unlink(c->path);
    unlink(c->small);
    unlink(c->plain);
    return cli_fail(what, s);
}

int bench_io(bench_ctx *b, int argc, char **argv)
{
    long long mib = 256, tmib = 16;
    const char *dir = getenv("TMPDIR");
    bool keep = false;
    if (!dir || !*dir) dir = "/tmp";
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--help")) {
            puts(
                "usage: ctorch bench io [--size-mib M] [--tensor-mib T] [--dir D] [--keep]\n"
                "                       [--repeats R] [--json]\n"
                "Writes an M MiB safetensors file (default 256) of bf16 tensors of T MiB (default\n"
                "16) in D (default $TMPDIR or /tmp) and times, with the page cache warm:\n"
                "  open    ct_load + close (mmap + validation: independent of the size)\n"
                "  read    open + checksum of every tensor's bytes, vs read() of the file\n"
                "          into memory with the same checksum, and a plain read()\n"
                "  convert every tensor bf16 -> f32, into new tensors (ct_tensor_file_read) and\n"
                "          into memory allocated once (ct_tensor_file_read_into), vs memcpy\n"
                "  save    ct_save_safetensors without fsync, vs write() of the same bytes\n"
                "          and vs memcpy; the fsync of the saved file is timed apart\n"
                "and the same four with Python (bench/io_baseline.py: struct + json, "
                "numpy.memmap,\n"
                "PyTorch 2.13 for bf16) and the safetensors package's load_file / save_file on\n"
                "the same file (the .venv's python, or $CTORCH_PYTHON).");
            return 0;
        }
        if (cli_opt(argc, argv, &i, "--size-mib", &v)) {
            if (!cli_int("--size-mib", v, 1, 1 << 20, &mib)) return 2;
        } else if (cli_opt(argc, argv, &i, "--tensor-mib", &v)) {
            if (!cli_int("--tensor-mib", v, 1, 1 << 16, &tmib)) return 2;
        } else if (cli_opt(argc, argv, &i, "--dir", &v))
            dir = v;
        else if (!strcmp(argv[i], "--keep"))
            keep = true;
        else {
            fprintf(stderr, "ctorch bench io: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (tmib > mib) tmib = mib;
    io_case c;
    memset(&c, 0, sizeof c);
    snprintf(c.path, sizeof c.path, "%s/ctorch-bench-io-%ld.safetensors", dir, (long)getpid());
    snprintf(c.small, sizeof c.small, "%s/ctorch-bench-io-%ld-small.safetensors", dir,
             (long)getpid());
    snprintf(c.plain, sizeof c.plain, "%s/ctorch-bench-io-%ld.bin", dir, (long)getpid());
    c.count = (size_t)(mib / tmib);
    c.tensor_bytes = (size_t)tmib << 20;
    c.total = c.count * c.tensor_bytes;
    c.save = ct_save_options_default();
    c.save.sync = false;
    ct_status s;
    if ((s = ct_calloc((void **)&c.tensors, c.count * sizeof *c.tensors)) ||
        (s = ct_calloc((void **)&c.names, c.count * sizeof *c.names)) ||
        (s = ct_alloc((void **)&c.buf, c.total + SLACK)) ||
        (s = ct_alloc((void **)&c.f32, c.tensor_bytes * 2)))
        return cli_fail("bench io", s);
    float *tmp;
    if ((s = ct_alloc((void **)&tmp, c.tensor_bytes * 2))) return cli_fail("bench io", s);
    int64_t shape[2] = {(int64_t)(c.tensor_bytes / 2 / 2048), 2048};
    for (size_t i = 0; i < c.count; i++) {
        if ((s = ct_tensor_empty(&c.tensors[i], CT_DTYPE_BF16, 2, shape)))
            return cli_fail("bench io", s);
        bench_fill(tmp, c.tensor_bytes / 2, i + 1, 4.0f);
        ct_convert_f32_to_bf16(c.tensors[i].data, tmp, c.tensor_bytes / 2);
        if (!(c.names[i] = malloc(48))) return cli_fail("bench io", CT_ENOMEM);
        snprintf(c.names[i], 48, "layers.%zu.weight", i);
    }
    ct_free(tmp);
    {
        /* The small file: one 4 KiB tensor, to show that opening does not depend on size. */
        int64_t ss[1] = {2048};
        const char *sn[1] = {"small"};
        ct_tensor st;
        if ((s = ct_tensor_wrap(&st, c.tensors[0].data, CT_DTYPE_BF16, 1, ss, NULL)) ||
            (s = ct_save_safetensors(c.small, &st, sn, 1, NULL, NULL, 0, &c.save)))
            return io_fail(&c, "bench io", s);
    }

    bench_time t_memcpy, t_fresh, t_save, t_save_new, t_write, t_open, t_open_small, t_read,
        t_plain, t_plain_sum, t_conv, t_conv_into;
    int R = b->repeats;
    /* Reads first, on a file made durable, so no writeback runs behind them. */
    c.save.sync = true;
    if ((s = run_save(&c))) return io_fail(&c, "bench io (save)", s);
    c.save.sync = false;
    if ((s = bench_time_fn(R, run_memcpy, &c, &t_memcpy)) ||
        (s = bench_time_fn(R, run_memcpy_fresh, &c, &t_fresh)) ||
        (s = bench_time_fn(R, run_open, &c, &t_open)) ||
        (s = bench_time_fn(R, run_open_small, &c, &t_open_small)) ||
        (s = bench_time_fn(R, run_read, &c, &t_read)) ||
        (s = bench_time_fn(R, run_read_plain, &c, &t_plain)) ||
        (s = bench_time_fn(R, run_read_plain_sum, &c, &t_plain_sum)) ||
        (s = bench_time_fn(R, run_convert, &c, &t_conv)) ||
        (s = bench_time_fn(R, run_convert_into, &c, &t_conv_into)))
        return io_fail(&c, "bench io (read)", s);
    if ((s = bench_time_fn(R, run_save_new, &c, &t_save_new)) ||
        (s = bench_time_fn(R, run_write, &c, &t_write)) ||
        (s = bench_time_fn(R, run_save, &c, &t_save)))
        return io_fail(&c, "bench io (save)", s);
    unlink(c.plain);
    /* fsync of a freshly saved file (and its folder), timed apart from the save. */
    double t_fsync = 0;
    {
        if ((s = run_save_new(&c))) return io_fail(&c, "bench io (save)", s);
        double t0 = bench_now();
        int fd = open(c.path, O_RDONLY | O_CLOEXEC), dfd = open(dir, O_RDONLY | O_DIRECTORY);
        if (fd >= 0) fsync(fd);
        if (dfd >= 0) fsync(dfd);
        t_fsync = bench_now() - t0;
        if (fd >= 0) close(fd);
        if (dfd >= 0) close(dfd);
    }

    /* The Python baseline (struct + json + numpy.memmap, torch for bf16) on the same file. */
    char out_py[4200], reps[16];
    snprintf(out_py, sizeof out_py, "%s.py-out", c.path);
    snprintf(reps, sizeof reps, "%d", R);
    char thr[16];
    snprintf(thr, sizeof thr, "%d", ct_num_threads());
    char *pa[] = {"--file", c.path, "--out", out_py, "--repeats", reps, "--threads", thr, NULL};
    json_t *py = bench_python("io_baseline.py", pa);

    size_t f32_bytes = c.total * 2;
    double g_memcpy = rate(c.total, &t_memcpy), g_fresh = rate(c.total, &t_fresh);
    double g_read = rate(c.total, &t_read), g_plain = rate(c.total, &t_plain);
    double g_plain_sum = rate(c.total, &t_plain_sum), g_conv = rate(f32_bytes, &t_conv);
    double g_conv_into = rate(f32_bytes, &t_conv_into);
    double g_save_new = rate(c.total, &t_save_new), g_write = rate(c.total, &t_write);
    double g_save = rate(c.total, &t_save);
    json_t *j = json_object();
    json_object_set_new(j, "bench", json_string("io"));
    json_object_set_new(j, "file",
                        json_pack("{s:I, s:I, s:s, s:s}", "data_bytes", (json_int_t)c.total,
                                  "tensors", (json_int_t)c.count, "dtype", "bf16", "cache",
                                  "page cache, warm"));
    json_object_set_new(
        j, "machine",
        json_pack("{s:i, s:s}", "threads", ct_num_threads(), "isa", ct_isa_name(ct_active_isa())));
    json_object_set_new(j, "memcpy", case_json(&t_memcpy, c.total));
    json_object_set_new(j, "memcpy_fresh_pages", case_json(&t_fresh, c.total));
    json_object_set_new(j, "open",
                        json_pack("{s:o, s:o}", "ctorch", bench_time_json(&t_open),
                                  "ctorch_4kib_file", bench_time_json(&t_open_small)));
    json_object_set_new(j, "read",
                        json_pack("{s:o, s:o, s:o}", "ctorch_mmap_checksum",
                                  case_json(&t_read, c.total), "read_checksum",
                                  case_json(&t_plain_sum, c.total), "read_plain",
                                  case_json(&t_plain, c.total)));
    json_object_set_new(j, "convert_bf16_f32",
                        json_pack("{s:o, s:o}", "ctorch_new_tensor", case_json(&t_conv, f32_bytes),
                                  "ctorch_into_existing", case_json(&t_conv_into, f32_bytes)));
    json_object_set_new(j, "save",
                        json_pack("{s:o, s:o, s:o, s:f}", "ctorch_new_file",
                                  case_json(&t_save_new, c.total), "write_new_file",
                                  case_json(&t_write, c.total), "ctorch_replacing_file",
                                  case_json(&t_save, c.total), "fsync_s", t_fsync));
    json_object_set_new(j, "ratios",
                        json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "read_vs_read_checksum",
                                  g_read / g_plain_sum, "read_vs_plain_read", g_read / g_plain,
                                  "save_vs_memcpy", g_save_new / g_memcpy, "save_vs_memcpy_fresh",
                                  g_save_new / g_fresh, "save_vs_write", g_save_new / g_write,
                                  "convert_vs_memcpy", g_conv / g_memcpy, "convert_into_vs_memcpy",
                                  g_conv_into / g_memcpy));
    json_object_set_new(j, "python_numpy_torch", py);
    json_object_set_new(j, "checksum_sink", json_integer((json_int_t)(c.sum & 0xFFFF)));
    if (b->json) {
        bench_print_json(j);
    } else {
        printf("io: %.0f MiB in %zu bf16 tensors of %lld MiB, page cache warm, %d threads, %s\n",
               c.total / 1048576.0, c.count, tmib, ct_num_threads(), ct_isa_name(ct_active_isa()));
        printf("  %-36s %11s %7s\n", "", "median", "GB/s");
        printf("  %-36s %8.2f ms %7.2f\n", "memcpy (baseline)", t_memcpy.median * 1e3, g_memcpy);
        printf("  %-36s %8.2f ms %7.2f\n", "memcpy into fresh pages", t_fresh.median * 1e3,
               g_fresh);
        printf("  %-36s %8.3f ms          (%.3f ms for a 4 KiB file)\n", "open: ct_load + close",
               t_open.median * 1e3, t_open_small.median * 1e3);
        printf("  %-36s %8.2f ms %7.2f  %.0f%% of read()+checksum, %.0f%% of plain read()\n",
               "read: mmap views + checksum", t_read.median * 1e3, g_read,
               100 * g_read / g_plain_sum, 100 * g_read / g_plain);
        printf("  %-36s %8.2f ms %7.2f\n", "  read() into memory + checksum",
               t_plain_sum.median * 1e3, g_plain_sum);
        printf("  %-36s %8.2f ms %7.2f\n", "  plain read() into memory", t_plain.median * 1e3,
               g_plain);
        printf("  %-36s %8.2f ms %7.2f  (f32 bytes out: %.0f%% of memcpy)\n",
               "convert: bf16 -> f32, new tensors", t_conv.median * 1e3, g_conv,
               100 * g_conv / g_memcpy);
        printf("  %-36s %8.2f ms %7.2f  (%.0f%% of memcpy)\n", "  into existing memory",
               t_conv_into.median * 1e3, g_conv_into, 100 * g_conv_into / g_memcpy);
        printf("  %-36s %8.2f ms %7.2f  %.0f%% of memcpy, %.0f%% into fresh pages, %.0f%% of "
               "write()\n",
               "save: new file, no fsync", t_save_new.median * 1e3, g_save_new,
               100 * g_save_new / g_memcpy, 100 * g_save_new / g_fresh, 100 * g_save_new / g_write);
        printf("  %-36s %8.2f ms %7.2f\n", "  write() of the same bytes", t_write.median * 1e3,
               g_write);
        printf("  %-36s %8.2f ms %7.2f  (ext4 starts writeback at the rename)\n",
               "save: replacing the file, no fsync", t_save.median * 1e3, g_save);
        printf("  %-36s %8.2f ms\n", "fsync of a saved file + folder", t_fsync * 1e3);
        static const char *const pyk[6][2] = {{"open", "python: struct+json+np.memmap open"},
                                              {"read_checksum", "python: np.memmap + sum"},
                                              {"convert_bf16_f32", "python: torch bf16 -> f32"},
                                              {"save_no_fsync", "python: write() + os.replace"},
                                              {"safetensors_load_file", "safetensors.torch.load_file"},
                                              {"safetensors_save_file", "safetensors.torch.save_file"}};
        if (!json_object_get(py, "open"))
            printf("  %-36s %s\n", "python baseline",
                   json_string_value(json_object_get(py, "status")));
        else
            printf("  python baseline: PyTorch %s, numpy %s, safetensors %s, %lld threads\n",
                   json_string_value(json_object_get(py, "torch_version")),
                   json_string_value(json_object_get(py, "numpy_version")),
                   json_string_value(json_object_get(py, "safetensors_version")),
                   (long long)json_integer_value(json_object_get(py, "threads")));
        for (int k = 0; k < 6 && json_object_get(py, "open"); k++) {
            json_t *o = json_object_get(py, pyk[k][0]);
            if (!o) continue;
            double t = json_number_value(json_object_get(o, "median_s"));
            if (k == 0)
                printf("  %-36s %8.3f ms\n", pyk[k][1], t * 1e3);
            else
                printf("  %-36s %8.2f ms %7.2f\n", pyk[k][1], t * 1e3,
                       json_number_value(json_object_get(o, "gb_per_s")));
        }
    }
    json_decref(j);
    if (!keep) unlink(c.path);
    unlink(c.small);
    for (size_t i = 0; i < c.count; i++) {
        ct_tensor_free(&c.tensors[i]);
        free(c.names[i]);
    }
    ct_free(c.tensors);
    ct_free(c.names);
    ct_free(c.buf);
    ct_free(c.f32);
    return 0;
}

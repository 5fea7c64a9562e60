/*
 * Devices and buffers (include/ctorch/device.h) over the backend tables (device/backend.h).
 *
 * The CPU device is one static object whose table calls today's kernels and whose memory is
 * ct_alloc's (so its statistics are the process-wide ones). A CUDA device comes from
 * libctorch_cuda.so, loaded once with dlopen: CTORCH_CUDA_LIB when set, else the file beside
 * libctorch.so, else the loader's search path. Its memory is counted here, above the table
 * (current, peak, limit), so every device is counted and refused the same way.
 */
#include "device/device_internal.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CT_MAX_CUDA_DEVICES 64

struct ct_device {
    ct_device_kind kind;
    int index;
    const ct_backend_ops *ops;
    ct_backend *be;
    int refs;                    /* opens not yet closed (CUDA) */
    char name[24];
    char desc[320];
    _Atomic size_t current, peak, limit;
    _Atomic size_t backend_bytes; /* of current: the backend's own scratch and workspaces */
    ct_backend_host host;
    _Atomic uint64_t allocs, frees;
};


static ct_device cpu_device = {.kind = CT_DEVICE_CPU, .name = "cpu"};
static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;

static void cpu_init(void)
{
    cpu_device.ops = ct_cpu_backend_ops();
    cpu_device.be = NULL;
}

ct_device *ct_device_cpu(void)
{
    pthread_once(&cpu_once, cpu_init);
    return &cpu_device;
}

ct_device_options ct_device_options_default(void)
{
    ct_device_options o = {.kind = CT_DEVICE_CPU, .index = 0, .memory_limit = 0};
    return o;
}

ct_status ct_device_parse(const char *name, ct_device_options *o)
{
    if (!name || !o) return ct_error(CT_EINVAL, "ct_device_parse: name and o must not be NULL");
    if (!strcmp(name, "cpu")) {
        o->kind = CT_DEVICE_CPU;
        o->index = 0;
        return CT_OK;
    }
    if (!strcmp(name, "cuda")) {
        o->kind = CT_DEVICE_CUDA;
        o->index = 0;
        return CT_OK;
    }
    if (!strncmp(name, "cuda:", 5) && name[5]) {
        int v = 0;
        const char *p = name + 5;
        for (; *p; p++) {
            if (*p < '0' || *p > '9' || v >= 1024) break;
            v = v * 10 + (*p - '0');
        }
        if (!*p && v < 1024 && !(name[5] == '0' && name[6])) {
            o->kind = CT_DEVICE_CUDA;
            o->index = v;
            return CT_OK;
        }
    }
    return ct_error(CT_EINVAL, "device \"%.64s\" is not one of cpu, cuda, cuda:N (N in [0, 1024))",
                    name);
}

/* ---- the CUDA library ---------------------------------------------------------------------- */

static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
static const ct_backend_ops *cuda_ops;
static char cuda_why[512];
static char cuda_path[PATH_MAX];
static pthread_mutex_t cuda_mu = PTHREAD_MUTEX_INITIALIZER;
static ct_device *cuda_devices[CT_MAX_CUDA_DEVICES];

/* The directory libctorch.so was loaded from (for the library beside it). */
static bool own_dir(char *dir, size_t cap)
{
    Dl_info info;
    if (!dladdr((void *)&ct_device_cpu, &info) || !info.dli_fname) return false;
    const char *slash = strrchr(info.dli_fname, '/');
    if (!slash) return false;
    size_t n = (size_t)(slash - info.dli_fname);
    if (n + 1 > cap) return false;
    memcpy(dir, info.dli_fname, n);
    dir[n] = 0;
    return true;
}

static void cuda_load(void)
{
    const char *env = getenv("CTORCH_CUDA_LIB");
    void *h = NULL;
    char tried[400] = "";
    if (env && *env) {
        snprintf(cuda_path, sizeof cuda_path, "%s", env);
        h = dlopen(cuda_path, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            snprintf(cuda_why, sizeof cuda_why, "CTORCH_CUDA_LIB=%.200s: %.250s", env, dlerror());
            return;
        }
    } else {
        char dir[PATH_MAX - 32];
        if (own_dir(dir, sizeof dir)) {
            snprintf(cuda_path, sizeof cuda_path, "%s/libctorch_cuda.so", dir);
            h = dlopen(cuda_path, RTLD_NOW | RTLD_LOCAL);
            if (!h) snprintf(tried, sizeof tried, "%.380s", dlerror());
        }
        if (!h) {
            snprintf(cuda_path, sizeof cuda_path, "libctorch_cuda.so");
            h = dlopen(cuda_path, RTLD_NOW | RTLD_LOCAL);
        }
        if (!h) {
            snprintf(cuda_why, sizeof cuda_why,
                     "libctorch_cuda.so not found (built without CUDA, or not installed beside "
                     "libctorch; set CTORCH_CUDA_LIB): %.400s",
                     tried[0] ? tried : dlerror());
            return;
        }
    }
    ct_backend_entry_fn entry;
    *(void **)&entry = dlsym(h, "ct_backend_cuda_entry");
    if (!entry) {
        snprintf(cuda_why, sizeof cuda_why, "%.300s has no ct_backend_cuda_entry", cuda_path);
        dlclose(h);
        return;
    }
    const ct_backend_ops *ops = NULL;
    int rc = entry(CT_BACKEND_API_VERSION, &ops);
    if (rc != 0 || !ops || ops->api_version != CT_BACKEND_API_VERSION) {
        snprintf(cuda_why, sizeof cuda_why,
                 "%.300s does not speak backend API version %d (a libctorch_cuda.so of another "
                 "ctorch build)",
                 cuda_path, CT_BACKEND_API_VERSION);
        dlclose(h);
        return;
    }
    cuda_ops = ops; /* kept loaded for the process */
}

static const ct_backend_ops *cuda_backend(void)
{
    pthread_once(&cuda_once, cuda_load);
    return cuda_ops;
}

/* Count `want` more bytes on d (0) or refuse them past its limit (CT_ENOMEM, nothing counted). */
static int count_in(ct_device *d, size_t want, size_t *cur_out)
{
    size_t limit = atomic_load(&d->limit);
    size_t cur = atomic_fetch_add(&d->current, want) + want;
    if (cur < want || (limit && cur > limit)) {
        atomic_fetch_sub(&d->current, want);
        if (cur_out) *cur_out = cur - want;
        return CT_ENOMEM;
    }
    size_t peak = atomic_load(&d->peak);
    while (cur > peak && !atomic_compare_exchange_weak(&d->peak, &peak, cur)) {
    }
    if (cur_out) *cur_out = cur;
    return 0;
}

/* ct_backend_host.account: the backend's own memory, counted with the buffers. */
static int backend_account(void *ctx, int64_t delta)
{
    ct_device *d = ctx;
    if (delta < 0) {
        atomic_fetch_sub(&d->current, (size_t)-delta);
        atomic_fetch_sub(&d->backend_bytes, (size_t)-delta);
        return 0;
    }
    int rc = count_in(d, (size_t)delta, NULL);
    if (rc == 0) atomic_fetch_add(&d->backend_bytes, (size_t)delta);
    return rc;
}

static _Thread_local char describe_buf[700];

const char *ct_cuda_describe(void)
{
    const ct_backend_ops *ops = cuda_backend();
    if (!ops) {
        snprintf(describe_buf, sizeof describe_buf, "cuda: not loaded: %s", cuda_why);
        return describe_buf;
    }
    int n = 0;
    int rc = ops->count(&n);
    if (rc != 0 || n < 1) {
        snprintf(describe_buf, sizeof describe_buf, "cuda: %.200s loaded, no usable GPU: %.400s",
                 cuda_path, rc ? ops->last_error() : "no CUDA device");
        return describe_buf;
    }
    ct_backend *be = NULL;
    if (ops->open(0, NULL, &be) != 0) {
        snprintf(describe_buf, sizeof describe_buf, "cuda: %d GPU(s), cuda:0 does not open: %.400s",
                 n, ops->last_error());
        return describe_buf;
    }
    ct_backend_info info;
    memset(&info, 0, sizeof info);
    if (ops->describe(be, &info) == 0)
        snprintf(describe_buf, sizeof describe_buf,
                 "cuda: %d GPU(s); cuda:0 %s (%.1f GiB, sm_%d, %d SMs, driver %d.%d, runtime %d.%d) "
                 "from %.200s",
                 n, info.name, (double)info.total_bytes / (1024.0 * 1024 * 1024),
                 info.compute_capability, info.multiprocessors, info.driver_version / 1000,
                 info.driver_version % 1000 / 10, info.runtime_version / 1000,
                 info.runtime_version % 1000 / 10, cuda_path);
    else
        snprintf(describe_buf, sizeof describe_buf, "cuda: %d GPU(s): %.400s", n, ops->last_error());
    ops->close(be);
    return describe_buf;
}

ct_status ct_device_open(const ct_device_options *o, ct_device **out)
{
    if (!o || !out) return ct_error(CT_EINVAL, "ct_device_open: o and out must not be NULL");
    *out = NULL;
    if (o->kind == CT_DEVICE_CPU) {
        if (o->index != 0)
            return ct_error(CT_EINVAL, "ct_device_open: the CPU device has index 0, got %d", o->index);
        ct_device *d = ct_device_cpu();
        if (o->memory_limit) ct_memory_set_limit(o->memory_limit);
        *out = d;
        return CT_OK;
    }
    if (o->kind != CT_DEVICE_CUDA)
        return ct_error(CT_EINVAL, "ct_device_open: unknown device kind %d", (int)o->kind);
    if (o->index < 0 || o->index >= CT_MAX_CUDA_DEVICES)
        return ct_error(CT_EINVAL, "ct_device_open: cuda index %d is outside [0, %d)", o->index,
                        CT_MAX_CUDA_DEVICES);
    const ct_backend_ops *ops = cuda_backend();
    if (!ops) return ct_error(CT_EUNSUPPORTED, "cuda:%d: the CUDA backend is not loaded: %s", o->index, cuda_why);
    pthread_mutex_lock(&cuda_mu);
    ct_device *d = cuda_devices[o->index];
    if (d) {
        d->refs++;
        if (o->memory_limit) atomic_store(&d->limit, o->memory_limit);
        pthread_mutex_unlock(&cuda_mu);
        *out = d;
        return CT_OK;
    }
    int n = 0;
    if (ops->count(&n) != 0 || n < 1) {
        ct_status s = ct_error(CT_EUNSUPPORTED, "cuda:%d: no usable GPU: %s", o->index,
                               n < 1 && ops->last_error()[0] ? ops->last_error() : "no CUDA device");
        pthread_mutex_unlock(&cuda_mu);
        return s;
    }
    if (o->index >= n) {
        pthread_mutex_unlock(&cuda_mu);
        return ct_error(CT_EUNSUPPORTED, "cuda:%d: this machine has %d GPU(s) (cuda:0 .. cuda:%d)",
                        o->index, n, n - 1);
    }
    ct_status s = CT_OK;
    d = calloc(1, sizeof *d);
    ct_backend *be = NULL;
    int rc;
    if (!d) {
        s = ct_error(CT_ENOMEM, "ct_device_open: out of host memory");
    } else if ((d->host = (ct_backend_host){d, backend_account}),
               (rc = ops->open(o->index, &d->host, &be)) != 0) {
        s = ct_error(rc > 0 && rc <= CT_EINTERNAL ? (ct_status)rc : CT_EUNSUPPORTED, "cuda:%d: %s",
                     o->index, ops->last_error());
    }
    if (s != CT_OK) {
        free(d);
        pthread_mutex_unlock(&cuda_mu);
        return s;
    }
    d->kind = CT_DEVICE_CUDA;
    d->index = o->index;
    d->ops = ops;
    d->be = be;
    d->refs = 1;
    atomic_store(&d->limit, o->memory_limit);
    snprintf(d->name, sizeof d->name, "cuda:%d", o->index);
    ct_backend_info info;
    memset(&info, 0, sizeof info);
    if (ops->describe(be, &info) == 0)
        snprintf(d->desc, sizeof d->desc, "%s (%s, %.1f GiB, sm_%d, driver %d.%d, runtime %d.%d)",
                 d->name, info.name, (double)info.total_bytes / (1024.0 * 1024 * 1024),
                 info.compute_capability, info.driver_version / 1000,
                 info.driver_version % 1000 / 10, info.runtime_version / 1000,
                 info.runtime_version % 1000 / 10);
    else
        snprintf(d->desc, sizeof d->desc, "%s", d->name);
    cuda_devices[o->index] = d;
    pthread_mutex_unlock(&cuda_mu);
    *out = d;
    return CT_OK;
}

ct_status ct_device_close(ct_device *d)
{
    if (!d || d->kind == CT_DEVICE_CPU) return CT_OK;
    pthread_mutex_lock(&cuda_mu);
    if (d->refs > 1) {
        d->refs--;
        pthread_mutex_unlock(&cuda_mu);
        return CT_OK;
    }
    size_t live = atomic_load(&d->current) - atomic_load(&d->backend_bytes);
    if (live) {
        pthread_mutex_unlock(&cuda_mu);
        return ct_error(CT_EINVAL, "ct_device_close: %s still holds %zu bytes of buffers", d->name,
                        live);
    }
    cuda_devices[d->index] = NULL;
    pthread_mutex_unlock(&cuda_mu);
    d->ops->close(d->be);
    free(d);
    return CT_OK;
}

ct_device_kind ct_device_get_kind(const ct_device *d)
{
    return d ? d->kind : CT_DEVICE_CPU;
}

int ct_device_index(const ct_device *d)
{
    return d ? d->index : 0;
}

const char *ct_device_name(const ct_device *d)
{
    return d ? d->name : "cpu";
}

const char *ct_device_describe(const ct_device *d)
{
    if (!d || d->kind == CT_DEVICE_CPU) {
        static _Thread_local char buf[200];
        snprintf(buf, sizeof buf, "cpu (%s, %d threads)", ct_cpu_name(), ct_num_threads());
        return buf;
    }
    return d->desc;
}

const ct_backend_ops *ct_device_ops(const ct_device *d)
{
    return d ? d->ops : ct_device_cpu()->ops;
}

ct_backend *ct_device_backend(const ct_device *d)
{
    return d ? d->be : NULL;
}

ct_status ct_dev_missing(const ct_device *d, const char *op)
{
    return ct_error(CT_EUNSUPPORTED, "%s is not implemented on %s", op, ct_device_name(d));
}

ct_status ct_dev_result(const ct_device *d, const char *op, int rc)
{
    if (!d || d->kind == CT_DEVICE_CPU) return (ct_status)rc; /* the kernel's own message */
    ct_status s = rc > 0 && rc <= CT_EINTERNAL ? (ct_status)rc : CT_EINTERNAL;
    return ct_error(s, "%s on %s: %s", op, d->name, d->ops->last_error());
}

ct_status ct_device_sync(ct_device *d)
{
    if (!d) return ct_error(CT_EINVAL, "ct_device_sync: d must not be NULL");
    if (d->kind == CT_DEVICE_CPU) return CT_OK;
    int rc = d->ops->sync(d->be);
    return rc ? ct_dev_result(d, "sync", rc) : CT_OK;
}

void ct_device_memory_stats(const ct_device *d, ct_memory_stats_t *out)
{
    if (!out) return;
    if (!d || d->kind == CT_DEVICE_CPU) {
        ct_memory_stats(out);
        return;
    }
    out->current_bytes = atomic_load(&d->current);
    out->peak_bytes = atomic_load(&d->peak);
    out->alloc_count = atomic_load(&d->allocs);
    out->free_count = atomic_load(&d->frees);
    out->limit_bytes = atomic_load(&d->limit);
}

void ct_device_reset_peak(ct_device *d)
{
    if (!d || d->kind == CT_DEVICE_CPU) {
        ct_memory_reset_peak();
        return;
    }
    atomic_store(&d->peak, atomic_load(&d->current));
}

void ct_device_set_memory_limit(ct_device *d, size_t bytes)
{
    if (!d || d->kind == CT_DEVICE_CPU) {
        ct_memory_set_limit(bytes);
        return;
    }
    atomic_store(&d->limit, bytes);
}

ct_status ct_device_linear_cross_entropy(ct_device *d, const ct_ce_outputs *out,
                                         const ct_lce_grads *grads, float grad_scale,
                                         const ct_lce_inputs *in, const ct_ce_options *o)
{
    return ct_device_linear_cross_entropy_ex(d, out, grads, grad_scale, NULL, 0, in, o);
}

ct_status ct_device_linear_cross_entropy_ex(ct_device *d, const ct_ce_outputs *out,
                                            const ct_lce_grads *grads, float grad_scale,
                                            const float *grad_rows, unsigned flags,
                                            const ct_lce_inputs *in, const ct_ce_options *o)
{
    const char *fn = "ct_device_linear_cross_entropy";
    if (!d || !out || !in || !o) return ct_error(CT_EINVAL, "%s: d, out, in and o must not be NULL", fn);
    if (in->N < 0 || in->D < 1 || in->V < 1)
        return ct_error(CT_EINVAL, "%s: need N >= 0, D >= 1, V >= 1 (got %lld, %lld, %lld)", fn,
                        (long long)in->N, (long long)in->D, (long long)in->V);
    if (in->dtype != CT_DTYPE_F32 && in->dtype != CT_DTYPE_BF16)
        return ct_error(CT_EINVAL, "%s: h and weight must be f32 or bf16, got %s", fn,
                        ct_dtype_name(in->dtype));
    if (in->target_dtype != CT_DTYPE_I32 && in->target_dtype != CT_DTYPE_I64)
        return ct_error(CT_EINVAL, "%s: target must be int32 or int64, got %s", fn,
                        ct_dtype_name(in->target_dtype));
    if (!out->loss || (in->N && (!in->h || !in->target)) || !in->weight)
        return ct_error(CT_EINVAL, "%s: loss, h, weight and target must not be NULL", fn);
    if (!(o->label_smoothing >= 0 && o->label_smoothing <= 1) || !(o->z_loss >= 0) ||
        !(o->softcap >= 0) || (unsigned)o->reduction > CT_REDUCTION_SUM)
        return ct_error(CT_EINVAL, "%s: options out of range (label_smoothing in [0, 1], z_loss "
                                   ">= 0, softcap >= 0, a known reduction)", fn);
    if (flags & ~CT_LCE_F32_GRADS)
        return ct_error(CT_EINVAL, "%s: flags 0x%x: only CT_LCE_F32_GRADS (0x%x) is known", fn, flags,
                        CT_LCE_F32_GRADS);
    if (grad_rows && o->reduction != CT_REDUCTION_NONE)
        return ct_error(CT_EINVAL, "%s: grad_rows (a per-row upstream gradient) needs reduction NONE; "
                                   "MEAN and SUM take grad_scale", fn);
    ct_lce_grads g, *gp = NULL;
    if (grads) {
        g = *grads;
        gp = &g;
    }
    CT_DEV(d, lce, (ct_ce_outputs *)out, gp, grad_scale, gp ? grad_rows : NULL, flags, in, o);
    return CT_OK;
}

/* ---- raw memory with accounting ------------------------------------------------------------- */

ct_status ct_dev_alloc(ct_device *d, size_t bytes, const char *what, void **out)
{
    if (!out) return ct_error(CT_EINVAL, "ct_dev_alloc: out must not be NULL");
    *out = NULL;
    if (!d || d->kind == CT_DEVICE_CPU) {
        ct_status s = ct_alloc(out, bytes);
        return s == CT_OK ? s : ct_error_wrap(s, "%s on cpu", what ? what : "allocation");
    }
    size_t want = bytes ? bytes : 1, cur;
    if (count_in(d, want, &cur))
        return ct_error(CT_ENOMEM, "%s on %s: %zu bytes would pass the memory limit of %zu bytes (%zu live)",
                        what ? what : "allocation", d->name, want, atomic_load(&d->limit), cur);
    void *p = NULL;
    int rc = d->ops->alloc(d->be, want, &p);
    if (rc != 0 || !p) {
        atomic_fetch_sub(&d->current, want);
        return ct_error(CT_ENOMEM, "%s on %s: %zu bytes: %s", what ? what : "allocation", d->name,
                        want, rc ? d->ops->last_error() : "no memory");
    }
    atomic_fetch_add(&d->allocs, 1);
    *out = p;
    return CT_OK;
}

void ct_dev_free(ct_device *d, void *p, size_t bytes)
{
    if (!p) return;
    if (!d || d->kind == CT_DEVICE_CPU) {
        ct_free(p);
        return;
    }
    d->ops->free(d->be, p);
    atomic_fetch_sub(&d->current, bytes ? bytes : 1);
    atomic_fetch_add(&d->frees, 1);
}

#define DEV_COPY(slot, d, dst, src, bytes)                                                         \
    do {                                                                                           \
        if (!(bytes)) return CT_OK;                                                                \
        if (!d || d->kind == CT_DEVICE_CPU) {                                                      \
            memmove(dst, src, bytes);                                                              \
            return CT_OK;                                                                          \
        }                                                                                          \
        int rc_ = d->ops->slot(d->be, dst, src, bytes);                                            \
        return rc_ ? ct_dev_result(d, #slot, rc_) : CT_OK;                                         \
    } while (0)

ct_status ct_dev_h2d(ct_device *d, void *dst, const void *src, size_t bytes)
{
    DEV_COPY(copy_h2d, d, dst, src, bytes);
}

ct_status ct_dev_d2h(ct_device *d, void *dst, const void *src, size_t bytes)
{
    DEV_COPY(copy_d2h, d, dst, src, bytes);
}

ct_status ct_dev_d2d(ct_device *d, void *dst, const void *src, size_t bytes)
{
    DEV_COPY(copy_d2d, d, dst, src, bytes);
}

ct_status ct_dev_zero(ct_device *d, void *dst, size_t bytes)
{
    if (!bytes) return CT_OK;
    if (!d || d->kind == CT_DEVICE_CPU) {
        memset(dst, 0, bytes);
        return CT_OK;
    }
    int rc = d->ops->memset0(d->be, dst, bytes);
    return rc ? ct_dev_result(d, "memset0", rc) : CT_OK;
}

/* ---- buffers --------------------------------------------------------------------------------- */

static ct_status buffer_new(ct_device *d, size_t bytes, bool zero, ct_buffer **out)
{
    if (!d || !out) return ct_error(CT_EINVAL, "ct_buffer_alloc: d and out must not be NULL");
    *out = NULL;
    if (!bytes) return ct_error(CT_EINVAL, "ct_buffer_alloc: bytes must be > 0");
    ct_buffer *b;
    CT_TRY(ct_alloc((void **)&b, sizeof *b));
    b->dev = d;
    b->bytes = bytes;
    b->host = d->kind == CT_DEVICE_CPU;
    b->where = d->name;
    ct_status s = ct_dev_alloc(d, bytes, "ct_buffer_alloc", &b->data);
    if (s == CT_OK && zero) s = ct_dev_zero(d, b->data, bytes);
    if (s != CT_OK) {
        ct_dev_free(d, b->data, bytes);
        ct_free(b);
        return s;
    }
    *out = b;
    return CT_OK;
}

ct_status ct_buffer_alloc(ct_device *d, size_t bytes, ct_buffer **out)
{
    return buffer_new(d, bytes, false, out);
}

ct_status ct_buffer_zeros(ct_device *d, size_t bytes, ct_buffer **out)
{
    return buffer_new(d, bytes, true, out);
}

void ct_buffer_free(ct_buffer *b)
{
    if (!b) return;
    ct_dev_free(b->dev, b->data, b->bytes);
    ct_free(b);
}

ct_device *ct_buffer_device(const ct_buffer *b)
{
    return b ? b->dev : NULL;
}

size_t ct_buffer_size(const ct_buffer *b)
{
    return b ? b->bytes : 0;
}

void *ct_buffer_data(const ct_buffer *b)
{
    return b ? b->data : NULL;
}

static ct_status range_ok(const char *fn, const ct_buffer *b, size_t off, size_t n, const void *p)
{
    if (!b) return ct_error(CT_EINVAL, "%s: the buffer must not be NULL", fn);
    if (n && !p) return ct_error(CT_EINVAL, "%s: the host pointer must not be NULL", fn);
    if (off > b->bytes || n > b->bytes - off)
        return ct_error(CT_EINVAL, "%s: bytes [%zu, %zu + %zu) leave the buffer of %zu bytes", fn,
                        off, off, n, b->bytes);
    return CT_OK;
}

ct_status ct_buffer_write(ct_buffer *b, size_t offset, const void *src, size_t n)
{
    CT_TRY(range_ok("ct_buffer_write", b, offset, n, src));
    return ct_dev_h2d(b->dev, (char *)b->data + offset, src, n);
}

ct_status ct_buffer_read(const ct_buffer *b, size_t offset, void *dst, size_t n)
{
    CT_TRY(range_ok("ct_buffer_read", b, offset, n, dst));
    return ct_dev_d2h(b->dev, dst, (const char *)b->data + offset, n);
}

ct_status ct_buffer_copy(ct_buffer *dst, size_t dst_offset, const ct_buffer *src,
                         size_t src_offset, size_t n)
{
    CT_TRY(range_ok("ct_buffer_copy (destination)", dst, dst_offset, n, dst));
    CT_TRY(range_ok("ct_buffer_copy (source)", src, src_offset, n, src));
    char *dp = (char *)dst->data + dst_offset;
    const char *sp = (const char *)src->data + src_offset;
    if (dst->dev == src->dev) return ct_dev_d2d(dst->dev, dp, sp, n);
    if (src->dev->kind == CT_DEVICE_CPU) return ct_dev_h2d(dst->dev, dp, sp, n);
    if (dst->dev->kind == CT_DEVICE_CPU) return ct_dev_d2h(src->dev, dp, sp, n);
    /* GPU to another GPU: through a bounded host bounce buffer */
    size_t chunk = n < ((size_t)64 << 20) ? n : ((size_t)64 << 20);
    void *tmp;
    CT_TRY(ct_alloc(&tmp, chunk));
    ct_status s = CT_OK;
    for (size_t o = 0; o < n && s == CT_OK; o += chunk) {
        size_t k = n - o < chunk ? n - o : chunk;
        s = ct_dev_d2h(src->dev, tmp, sp + o, k);
        if (s == CT_OK) s = ct_dev_h2d(dst->dev, dp + o, tmp, k);
    }
    ct_free(tmp);
    return s;
}

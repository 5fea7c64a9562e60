/* Private side of the device layer (include/ctorch/device.h): the table behind a device and
 * the calls the model, trainer, KV cache and FSDP make through it. */
#ifndef CT_DEVICE_INTERNAL_H
#define CT_DEVICE_INTERNAL_H

#include "core/internal.h"
#include "ctorch/device.h"
#include "ctorch/attention.h"
#include "device/backend.h"

/* The table and context of an open device (ct_device_open / ct_device_cpu). */
const ct_backend_ops *ct_device_ops(const ct_device *d);
ct_backend *ct_device_backend(const ct_device *d);

/* The CPU backend's table (src/device/cpu_backend.c): today's kernels. */
const ct_backend_ops *ct_cpu_backend_ops(void);

/* Raw device memory with the device's accounting (the model's single allocations):
 * ct_dev_alloc fails with CT_ENOMEM naming the device, `what`, the size and the limit. */
ct_status ct_dev_alloc(ct_device *d, size_t bytes, const char *what, void **out);
void ct_dev_free(ct_device *d, void *p, size_t bytes);
ct_status ct_dev_h2d(ct_device *d, void *dst, const void *src, size_t bytes);
ct_status ct_dev_d2h(ct_device *d, void *dst, const void *src, size_t bytes);
ct_status ct_dev_d2d(ct_device *d, void *dst, const void *src, size_t bytes);
ct_status ct_dev_zero(ct_device *d, void *dst, size_t bytes);

/* A slot's status turned into a ct_status with the message "<op> on <device>: <cause>"
 * (a NULL slot: CT_EUNSUPPORTED "op is not implemented on <device>"). Use as
 *     CT_DEV(d, rmsnorm_fwd, out, rstd, inp, w, N, C, eps);                                  */
ct_status ct_dev_result(const ct_device *d, const char *op, int rc);
ct_status ct_dev_missing(const ct_device *d, const char *op);
#define CT_DEV(d, slot, ...)                                                                       \
    do {                                                                                           \
        const ct_backend_ops *ct_dev_ops_ = ct_device_ops(d);                                      \
        if (!ct_dev_ops_->slot) return ct_dev_missing((d), #slot);                                 \
        int ct_dev_rc_ = ct_dev_ops_->slot(ct_device_backend(d), __VA_ARGS__);                     \
        if (ct_dev_rc_ != 0) return ct_dev_result((d), #slot, ct_dev_rc_);                         \
    } while (0)

/* ---- flex attention (src/device/flex_upload.c) ------------------------------------------- */
/* Upload the lists of a host block mask to device d once (one buffer: ct_dev_alloc, then
 * ct_dev_h2d) into *out, for the flex_fwd / flex_bwd slots; the host mask may be freed after.
 * Release with ct_dev_block_mask_free (which zeroes *m; a zeroed struct is a no-op). */
ct_status ct_dev_block_mask_upload(ct_device *d, const ct_block_mask *m, ct_dev_block_mask *out);
void ct_dev_block_mask_free(ct_device *d, ct_dev_block_mask *m);

/* ---- compiled (jit) flex mods on a device (src/device/flex_jit.c) ------------------------
 * For the flex slots' ct_flex_mods.compiled. sm / mm: mods made by ct_score_mod_compile /
 * ct_mask_mod_compile (either may be NULL, not both; any other mod is refused with CT_EINVAL:
 * built-ins go through ct_flex_mods' own fields); they must outlive the handle. create writes
 * the mods' device source, finds the backend's image of it (this process's table, else the
 * disk cache of docs/compile.md, else slot flex_jit_build, cached) for q / k / v of dtype and
 * head dim E, loads it once per device, and allocates the arrays' device buffer and the
 * parameter-gradient vector (counted by the device). On the CPU device nothing is compiled: the
 * host mods run (ct_flex_jit.host_score / host_mask). */
typedef struct ct_dev_flex_jit ct_dev_flex_jit;
ct_status ct_dev_flex_jit_create(ct_device *dev, const ct_score_mod *sm, const ct_mask_mod *mm,
                                 ct_dtype dtype, int64_t E, ct_dev_flex_jit **out);
/* Range-check the mods' array indices for B x H x q_len x kv_len (ct_jit_check_mask /
 * _score: CT_EINVAL naming the array and the reachable range): required before the first bind
 * and again when the sizes grow. */
ct_status ct_dev_flex_jit_check(ct_dev_flex_jit *j, int64_t B, int64_t H, int64_t q_len,
                                int64_t kv_len);
/* Upload the bound arrays' current host values (each call: trained tables change), zero the
 * device param-grad vector when want_param_grad (the score mod's param_grad must then be set),
 * point mods->compiled at the handle's ct_flex_jit (mods->score must be NONE with a score
 * mod). */
ct_status ct_dev_flex_jit_bind(ct_dev_flex_jit *j, bool want_param_grad, ct_flex_mods *mods);
/* After flex_bwd: add the device param grads into sm->param_grad (host), once per bind (the
 * CPU device's flex added them there itself: nothing to do). */
ct_status ct_dev_flex_jit_collect(ct_dev_flex_jit *j);
void ct_dev_flex_jit_free(ct_dev_flex_jit *j);
/* This process's counters: modules found in the table, loaded from the disk cache, built. */
void ct_dev_flex_jit_stats(int64_t *table_hits, int64_t *cache_hits, int64_t *builds);

#endif

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

#endif

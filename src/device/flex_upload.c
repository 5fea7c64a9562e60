/* A host block mask (ct_block_mask) uploaded to a device once, for the flex slots: its eight
 * list arrays packed into one device buffer (one allocation, one host-to-device copy), the
 * struct of device pointers (ct_dev_block_mask, device/backend.h) describing them. On the CPU
 * device the buffer is host memory like every CPU buffer. */
#include "device/device_internal.h"

#include <string.h>

static size_t align8(size_t x)
{
    return (x + 7) & ~(size_t)7;
}

ct_status ct_dev_block_mask_upload(ct_device *d, const ct_block_mask *m, ct_dev_block_mask *out)
{
    const char *fn = "ct_dev_block_mask_upload";
    if (!out) return ct_error(CT_EINVAL, "%s: out must not be NULL", fn);
    memset(out, 0, sizeof *out);
    if (!m) return ct_error(CT_EINVAL, "%s: the block mask must not be NULL", fn);
    if (m->B < 1 || m->H < 1 || m->num_q_blocks < 1 || m->num_kv_blocks < 1 || !m->kv_ptr ||
        !m->full_kv_ptr || !m->q_ptr || !m->full_q_ptr)
        return ct_error(CT_EINVAL, "%s: not a block mask from ct_block_mask_create", fn);
    /* rows and columns of the lists; the entry counts are the last pointers */
    size_t rows, cols;
    if (!ct_mul_size((size_t)m->B, (size_t)m->H, &rows) || !ct_mul_size(rows, (size_t)m->num_kv_blocks, &cols) ||
        !ct_mul_size(rows, (size_t)m->num_q_blocks, &rows))
        return ct_error(CT_EOVERFLOW, "%s: the block mask's size overflows", fn);
    int64_t np = m->kv_ptr[rows], nf = m->full_kv_ptr[rows];
    if (np < 0 || nf < 0 || np != m->q_ptr[cols] || nf != m->full_q_ptr[cols] || np > INT32_MAX ||
        nf > INT32_MAX)
        return ct_error(CT_EINVAL, "%s: the block mask's lists disagree (%lld / %lld partial, %lld / %lld full)",
                        fn, (long long)np, (long long)m->q_ptr[cols], (long long)nf,
                        (long long)m->full_q_ptr[cols]);
    /* layout: kv_ptr, full_kv_ptr [rows + 1], q_ptr, full_q_ptr [cols + 1] (int64), then
     * kv_idx, q_idx [np], full_kv_idx, full_q_idx [nf] (int32), each 8-byte aligned */
    size_t pr = (rows + 1) * 8, pc = (cols + 1) * 8, ip = align8((size_t)np * 4), ifl = align8((size_t)nf * 4);
    size_t off[9];
    off[0] = 0, off[1] = pr, off[2] = 2 * pr, off[3] = 2 * pr + pc, off[4] = 2 * pr + 2 * pc;
    off[5] = off[4] + ip, off[6] = off[5] + ip, off[7] = off[6] + ifl, off[8] = off[7] + ifl;
    size_t bytes = off[8];
    char *h = NULL;
    CT_TRY(ct_calloc((void **)&h, bytes));
    memcpy(h + off[0], m->kv_ptr, pr);
    memcpy(h + off[1], m->full_kv_ptr, pr);
    memcpy(h + off[2], m->q_ptr, pc);
    memcpy(h + off[3], m->full_q_ptr, pc);
    if (np) memcpy(h + off[4], m->kv_idx, (size_t)np * 4), memcpy(h + off[5], m->q_idx, (size_t)np * 4);
    if (nf) memcpy(h + off[6], m->full_kv_idx, (size_t)nf * 4), memcpy(h + off[7], m->full_q_idx, (size_t)nf * 4);
    char *dp = NULL;
    ct_status s = ct_dev_alloc(d, bytes, "block mask", (void **)&dp);
    if (s == CT_OK) s = ct_dev_h2d(d, dp, h, bytes);
    ct_free(h);
    if (s != CT_OK) {
        ct_dev_free(d, dp, bytes);
        return s;
    }
    *out = (ct_dev_block_mask){.B = m->B, .H = m->H, .q_len = m->q_len, .kv_len = m->kv_len,
                               .block_size = m->block_size, .num_q_blocks = m->num_q_blocks,
                               .num_kv_blocks = m->num_kv_blocks,
                               .kv_ptr = (const int64_t *)(dp + off[0]),
                               .full_kv_ptr = (const int64_t *)(dp + off[1]),
                               .kv_idx = (const int32_t *)(dp + off[4]),
                               .full_kv_idx = (const int32_t *)(dp + off[6]),
                               .q_ptr = (const int64_t *)(dp + off[2]),
                               .full_q_ptr = (const int64_t *)(dp + off[3]),
                               .q_idx = (const int32_t *)(dp + off[5]),
                               .full_q_idx = (const int32_t *)(dp + off[7]),
                               .base = dp,
                               .bytes = bytes};
    return CT_OK;
}

void ct_dev_block_mask_free(ct_device *d, ct_dev_block_mask *m)
{
    if (!m) return;
    ct_dev_free(d, m->base, m->bytes);
    memset(m, 0, sizeof *m);
}

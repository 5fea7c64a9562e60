/* libFuzzer target: the zip reader and the whole .pt zip loader on arbitrary bytes.
 *
 * Beyond "no crash, no out-of-bounds read, no leak, no undefined behaviour": every member
 * the zip reader accepts lies inside the image and no two overlap; a loaded checkpoint
 * passes fuzz_pt_check (views inside their storages, conversions, .pt round trip). */
#include "fuzz_pt_common.h"
#include "core/internal.h"
#include "io/io_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ct_zip z;
    if (ct_zip_open("<fuzz>", data, size, &z) == CT_OK) {
        for (size_t i = 0; i < z.count; i++) {
            const ct_zip_member *m = &z.members[i];
            FUZZ_REQUIRE(m->data_offset <= size && m->size <= size - m->data_offset);
            FUZZ_REQUIRE(m->header_offset < m->data_offset);
            FUZZ_REQUIRE(ct_zip_find(&z, m->name) == m);
            (void)ct_crc32(0, data + m->data_offset, (size_t)m->size);
        }
        ct_zip_close(&z);
    } else
        FUZZ_REQUIRE(z.count == 0 && z.members == NULL && ct_last_error()[0]);
    ct_load_options o = ct_load_options_default();
    o.format = CT_FORMAT_PYTORCH_ZIP;
    ct_tensor_file *f = NULL;
    if (ct_load_memory(data, size, &o, &f) == CT_OK) {
        fuzz_pt_check(f);
        ct_tensor_file_close(f);
    } else
        FUZZ_REQUIRE(f == NULL && ct_last_error()[0]);
    return 0;
}

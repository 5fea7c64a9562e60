/* libFuzzer target: the restricted unpickler.
 *
 * The input is a pickle (the object tree of a legacy torch.save file, optionally followed by
 * the storage-key pickle and the storages). It runs twice: through ct_pk_run alone with a
 * persistent-load callback that accepts any tuple as a storage, and as a whole legacy file
 * (the fixed magic, protocol and sys_info pickles prepended) through the .pt loader, whose
 * result must pass fuzz_pt_check. */
#include "fuzz_pt_common.h"
#include "core/internal.h"
#include "io/io_internal.h"

static pk_machine *fuzz_machine; /* the machine the callback makes objects in */

static ct_status fuzz_persistent(void *ctx, pk_obj *pid, pk_obj **out)
{
    pk_machine *m = fuzz_machine;
    (void)ctx;
    if (pid->kind != PK_TUPLE) return ct_error(CT_EFORMAT, "fuzz: persistent id not a tuple");
    CT_TRY(ct_pk_make(m, PK_STORAGE, out));
    (*out)->u.storage = 0;
    return CT_OK;
}

static const uint8_t legacy_head[] = {
    0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46,
    0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, 0x2e, /* magic */
    0x80, 0x02, 0x4d, 0xe9, 0x03, 0x2e,       /* 1001 */
    0x80, 0x02, 0x7d, 0x2e,                   /* {} */
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pk_machine *m = NULL;
    if (ct_pk_new("<fuzz>", fuzz_persistent, NULL, &m) == CT_OK) {
        fuzz_machine = m;
        size_t used = 0;
        pk_obj *o = NULL;
        ct_status s = ct_pk_run(m, data, size, &used, &o);
        FUZZ_REQUIRE(s != CT_OK || (o != NULL && used <= size));
        FUZZ_REQUIRE(s == CT_OK || ct_last_error()[0]);
        ct_pk_free(m);
    }
    uint8_t *file = malloc(sizeof legacy_head + size + 1);
    FUZZ_REQUIRE(file);
    memcpy(file, legacy_head, sizeof legacy_head);
    if (size) memcpy(file + sizeof legacy_head, data, size);
    ct_load_options o = ct_load_options_default();
    o.format = CT_FORMAT_PICKLE;
    ct_tensor_file *f = NULL;
    if (ct_load_memory(file, sizeof legacy_head + size, &o, &f) == CT_OK) {
        fuzz_pt_check(f);
        ct_tensor_file_close(f);
    } else
        FUZZ_REQUIRE(f == NULL && ct_last_error()[0]);
    free(file);
    return 0;
}

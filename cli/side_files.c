/* The side files of a Hugging Face model directory that convert and train copy into their
 * output as they are: one list and one copy, through the library's ct_file_copy_side (a
 * regular file inside the source directory, never a link leaving it; the source's permission
 * bits kept; the copy created without following links). */
#include "cli.h"
#include "core/internal.h"
#include "ctorch/tokenizer.h"

#include <stdio.h>

int cli_copy_side_files(const char *cmd, const char *src_dir, const char *dst_dir)
{
    static const struct {
        const char *name;
        size_t max;
    } side[] = {
        {"tokenizer.json", CT_TOKENIZER_MAX_FILE_BYTES}, /* what the tokenizer loader takes */
        {"tokenizer_config.json", CT_FILE_CONFIG_MAX},
        {"special_tokens_map.json", CT_FILE_CONFIG_MAX},
        {"generation_config.json", CT_FILE_CONFIG_MAX},
    };
    for (size_t i = 0; i < sizeof side / sizeof side[0]; i++) {
        bool copied;
        ct_status s = ct_file_copy_side(src_dir, side[i].name, side[i].max, dst_dir, &copied);
        if (s) {
            char what[64];
            snprintf(what, sizeof what, "%s: copying %s", cmd, side[i].name);
            return cli_fail(what, s);
        }
    }
    return 0;
}

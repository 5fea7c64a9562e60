/* ctorch checkpoint consolidate DIR OUT.safetensors: a sharded checkpoint of
 * `ctorch train --fsdp|--dp` as the single file `generate` and one-process `train --resume`
 * take; and `ctorch inspect DIR` for sharded checkpoint directories. */
#include "cli.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fputs("usage: ctorch checkpoint consolidate DIR OUT.safetensors\n"
          "Write the single-file checkpoint (format ctorch-gpt: parameters, AdamW moments and\n"
          "the training state) that a sharded checkpoint holds. DIR is a checkpoint-<step>\n"
          "folder, or a run folder (its `latest` is used); it must be committed.\n",
          f);
}

int cmd_checkpoint(int argc, char **argv)
{
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        usage(stdout);
        return 0;
    }
    if (argc != 4 || strcmp(argv[1], "consolidate")) {
        usage(stderr);
        return 2;
    }
    ct_status s = ct_sharded_checkpoint_consolidate(argv[2], argv[3]);
    if (s) return cli_fail("checkpoint consolidate", s);
    printf("wrote %s\n", argv[3]);
    return 0;
}

int cli_inspect_sharded(const char *dir, bool json)
{
    char *sum;
    ct_status s = ct_sharded_checkpoint_verify(dir, &sum);
    if (s) {
        if (json) {
            json_t *j = json_pack("{s:s, s:b, s:s, s:s}", "directory", dir, "valid", 0, "status",
                                  ct_status_name(s), "error", ct_last_error());
            char *o = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
            if (o) puts(o);
            free(o);
            json_decref(j);
        }
        return cli_fail("inspect", s);
    }
    json_t *j = json_loads(sum, 0, NULL);
    ct_free(sum);
    if (!j) return cli_fail("inspect", CT_ENOMEM);
    json_object_set_new(j, "valid", json_true());
    if (json) {
        char *o = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        if (o) puts(o);
        free(o);
    } else {
        printf("%s: sharded checkpoint (ctorch-sharded), valid\n",
               json_string_value(json_object_get(j, "directory")));
        printf("  world size %lld, step %lld, %lld tensors, %lld elements, %zu files\n",
               (long long)json_integer_value(json_object_get(j, "world_size")),
               (long long)json_integer_value(json_object_get(j, "step")),
               (long long)json_integer_value(json_object_get(j, "tensors")),
               (long long)json_integer_value(json_object_get(j, "elements")),
               json_array_size(json_object_get(j, "files")));
        size_t i;
        json_t *v;
        json_array_foreach(json_object_get(j, "files"), i, v)
            printf("  %s\n", json_string_value(v));
    }
    json_decref(j);
    return 0;
}

/* Private parts of the Hugging Face directory reader (src/model/hf.c), shared with the LoRA
 * code and the fuzz targets. */
#ifndef CT_MODEL_HF_INTERNAL_H
#define CT_MODEL_HF_INTERNAL_H

#include "core/internal.h"
#include "ctorch/model.h"

/* The most bytes read from config.json / adapter_config.json, and from an index file. */
#define HF_CONFIG_MAX ((size_t)1 << 20)
#define HF_INDEX_MAX ((size_t)64 << 20)
#define HF_MAX_SHARDS 4096

/* A parsed model.safetensors.index.json: n entries (tensor name -> shard number) and the
 * distinct shard file names in order of first appearance. */
typedef struct hf_index {
    size_t n;
    char **names;  /* [n] */
    int *shard;    /* [n] */
    int nshards;
    char **files;  /* [nshards] */
} hf_index;

/* Parse and check index text: an object with "weight_map" (a non-empty object of tensor
 * name -> file name, each a plain *.safetensors name without '/' or a leading '.') and an
 * optional "metadata" object; any other key is refused by name. */
ct_status hf_index_parse(const char *json, size_t len, const char *what, hf_index *out);
void hf_index_free(hf_index *x);

/* json_loadb, and where that fails, again with integer literals of more than 18 digits read
 * as reals (Jansson refuses integers beyond int64; transformers' files may hold them). */
#include <jansson.h>
json_t *hf_json_loadb(const char *text, size_t len, size_t flags, json_error_t *err);

/* Read a whole file of at most max bytes into a new NUL-terminated buffer (ct_free). */
ct_status hf_read_text(const char *path, size_t max, char **buf, size_t *len);

/* Write len bytes to path atomically (temp file in the same folder, fsync, rename). */
ct_status hf_write_atomic(const char *path, const char *data, size_t len);

/* path = dir + "/" + name into a new string (ct_free). */
ct_status hf_join(const char *dir, const char *name, char **path);

/* Parse adapter_config.json text (src/model/lora.c): r, lora_alpha, target_modules as CT_LORA_*
 * bits, use_rslora; keys it does not implement refused by name. */
ct_status lora_parse_config(const char *text, size_t len, int64_t *rank, double *alpha,
                            uint32_t *targets, bool *rslora);

#endif

/* A model from a PyTorch state dict (torch.save, read by ct_load's allow-list unpickler) or
 * any tensor file without ctorch's checkpoint "format": its configuration from the file's
 * "config" entry (torch.save({"config": ..., "model": state_dict})) or a config.json beside
 * it, its tensors under ctorch's or Hugging Face's names (one prefix for all, such as "model."
 * of {"model": state_dict}). Shared by `ctorch generate --model FILE.pt` and `ctorch convert`. */
#include "cli.h"
#include "core/internal.h" /* ct_file_*: the one way files are read */

#include <jansson.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PT_CONFIG_MAX ((size_t)1 << 20)

/* Parse config text: a Hugging Face config.json (it has "architectures" or "model_type") by
 * ct_hf_config_parse, anything else as a ctorch configuration. */
static ct_status parse_config(const char *text, const char *what, ct_gpt_config *cfg,
                              ct_hf_info *info, bool *hf)
{
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    if (!json_is_object(j)) {
        json_decref(j);
        fprintf(stderr, "ctorch: %s: the configuration is not a JSON object\n", what);
        return CT_EFORMAT;
    }
    *hf = json_object_get(j, "architectures") || json_object_get(j, "model_type");
    json_decref(j);
    memset(info, 0, sizeof *info);
    info->bos_token = info->eos_token = -1;
    info->dtype = CT_DTYPE_F32;
    if (*hf) return ct_hf_config_parse(text, strlen(text), cfg, info);
    *cfg = ct_gpt_config_default();
    return ct_gpt_config_from_json(text, cfg);
}

int cli_pt_model_config(const char *path, const ct_tensor_file *f, ct_gpt_config *cfg,
                        ct_hf_info *info, char **config_text)
{
    if (config_text) *config_text = NULL;
    const char *meta = ct_tensor_file_metadata_get(f, "config");
    char *text = NULL, *beside = NULL;
    if (meta) {
        text = strdup(meta);
    } else {
        const char *sl = strrchr(path, '/');
        size_t dl = sl ? (size_t)(sl - path) : 1;
        beside = malloc(dl + sizeof "/config.json");
        if (!beside) return cli_fail("model", CT_ENOMEM);
        snprintf(beside, dl + sizeof "/config.json", "%.*s/config.json", (int)dl, sl ? path : ".");
        struct stat bst;
        if (lstat(beside, &bst) != 0) {
            fprintf(stderr,
                    "ctorch: '%s' carries no model configuration: save it in the file "
                    "(torch.save({\"config\": config, \"model\": state_dict})) or put config.json "
                    "beside it\n",
                    path);
            free(beside);
            return 1;
        }
        /* a regular file (a FIFO or /dev/zero refused) of at most PT_CONFIG_MAX bytes */
        char *ctext;
        size_t n;
        ct_status rs = ct_file_read_all(beside, "model config", PT_CONFIG_MAX, &ctext, &n);
        if (rs) {
            free(beside);
            return cli_fail("model", rs);
        }
        text = malloc(n + 1);
        if (text) memcpy(text, ctext, n + 1);
        ct_free(ctext);
    }
    if (!text) return cli_fail("model", CT_ENOMEM);
    bool hf;
    ct_status s = parse_config(text, beside ? beside : path, cfg, info, &hf);
    if (!s && !hf) s = ct_gpt_config_check(cfg);
    /* every tensor's name, shape and dtype against the configuration before the model (its
     * size from the configuration alone) is allocated */
    if (!s && (s = ct_gpt_state_dict_check(f, cfg))) {
        fprintf(stderr, "ctorch: '%s' does not fit its configuration (%s): %s\n", path,
                beside ? beside : "its \"config\" entry", ct_last_error());
        free(text);
        free(beside);
        return 1;
    }
    int rc = 0;
    if (s) {
        fprintf(stderr, "ctorch: the configuration of '%s' (%s): %s: %s\n", path,
                beside ? beside : "its \"config\" entry", ct_status_name(s), ct_last_error());
        rc = 1;
    }
    if (!rc && config_text && hf) {
        *config_text = text;
        text = NULL;
    }
    free(text);
    free(beside);
    return rc;
}

int cli_pt_model_load(const char *path, const ct_tensor_file *f, ct_gpt *m)
{
    ct_status s = ct_gpt_load_state_dict(m, f);
    if (s) fprintf(stderr, "ctorch: '%s': %s\n", path, ct_last_error());
    return s ? 1 : 0;
}

/* Private structure of the distributed trainer (trainer.c, checkpoint.c). */
#ifndef CT_DIST_TRAINER_INTERNAL_H
#define CT_DIST_TRAINER_INTERNAL_H

#include "dist/dist_internal.h"

struct ct_fsdp_trainer {
    ct_gpt_config cfg;
    ct_train_options o;
    ct_fsdp_options fo;
    ct_comm *comm;
    ct_fsdp *f;
    int32_t *batch; /* the global micro-batch [B, T + 1] (every rank builds it, takes its rows) */
    const int32_t *train, *eval;
    int64_t n_train, n_eval;
    int64_t step, epoch, pos;
    ct_rng rng;
    bool in_step; /* a step began and has not finished (elastic restart redoes it) */
    int64_t saved_pos, saved_epoch;
    ct_rng saved_rng;
};

#endif

/* Private structures of the distributed layer (src/dist): the sharded model and its trainer. */
#ifndef CT_DIST_INTERNAL_H
#define CT_DIST_INTERNAL_H

#include "comm/comm_internal.h"
#include "ctorch/fsdp.h"
#include "model/gpt_internal.h"

#define DS_RS_BUFS 2 /* reduce-scatters in flight: block i+1's while block i packs */

/* Where one model tensor lives: its group, its dim-0 chunking and this rank's rows. */
typedef struct ds_tensor {
    int group;
    int64_t rows, cols; /* cols = 1 for a vector */
    int64_t chunk;      /* rows per rank, ceil(rows / N) (all rows when replicated) */
    int64_t r0, r1;     /* this rank's rows (r0 == r1: none) */
    int64_t soff;       /* offset of its chunk in the group's shard (chunk * cols floats) */
    int64_t uoff;       /* offset in the group's unsharded (gathered) buffer */
    bool decay;
} ds_tensor;

typedef struct ds_group {
    int id, nt;
    int *idx;           /* model tensor indices */
    int64_t S, U;       /* shard floats (padded), unsharded floats */
    int64_t shard_off;  /* offset of the shard in the flat shard arrays */
    bool reshard;       /* reshard after forward */
    int slot;           /* gathered into slots[slot]; -1: not gathered */
    bool ready;         /* gather finished and copied out */
    ct_work *ag;        /* all-gather in flight */
    float *ugrad;       /* unsharded gradient kept across backwards (root; no-sync) */
    bool pending;       /* ugrad holds gradients not reduced yet */
} ds_group;

typedef struct ds_slot {
    float *param; /* unsharded f32 parameters of a group */
    void *stage;  /* all-gather result: N shards in param dtype */
    void *send;   /* bf16 copy of the local shard (bf16 all-gather) */
    uint16_t *pbf; /* compute dtype bf16: param rounded to bf16, the GEMMs' weight operands */
    int group;    /* -1: free */
} ds_slot;

typedef struct ds_rs {
    float *send, *recv; /* packed [N][S] gradients, the reduced shard [S] */
    ct_work *w;
    int group; /* -1: idle */
} ds_rs;

struct ct_fsdp {
    ct_fsdp_options o;
    ct_comm *world, *ag, *rs; /* rs == ag without separate_reduce_scatter_comm */
    int rank, size;
    bool sync, dp_synced;
    double div;
    ct_gpt *m; /* activations and per-block kernels; parameter views bound to our buffers */
    int ng;
    ds_group *g; /* g[0] root, g[1 + l] block l */
    ds_tensor *t;
    float **tp, **tg; /* per-tensor parameter / gradient pointers for gpt_bind */
    int64_t S_total, S_max, U_max;
    float *p, *gr, *m1, *m2; /* shard (or replica) parameters, gradients, AdamW moments */
    uint16_t *pbf; /* data parallel in compute dtype bf16: the replica p rounded to bf16
                      (every forward rounds it again: p may have been written since) */
    ds_slot *slots;
    int nslots;
    float *bgrad; /* one block's unsharded gradients */
    ds_rs rsb[DS_RS_BUFS];
    int rs_next;
    ct_fsdp_stats st;
};

double ds_now(void);
/* Free every gathered block (after the shard parameters changed). */
void ds_drop_gathered(ct_fsdp *f);

#endif

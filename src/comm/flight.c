/* The flight recorder (a ring of the last N operations of a communicator, dumped as JSON
 * per rank) and the structured events of the communication layer. */
#include "comm/comm_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void cm_fr_init(cm_fr *fr, size_t cap)
{
    pthread_mutex_init(&fr->mu, NULL);
    fr->e = NULL;
    fr->cap = 0;
    fr->next_id = 0;
    if (cap && ct_calloc((void **)&fr->e, sizeof(cm_fr_entry) * cap) == CT_OK) fr->cap = cap;
}

void cm_fr_destroy(cm_fr *fr)
{
    ct_free(fr->e);
    fr->e = NULL;
    pthread_mutex_destroy(&fr->mu);
}

static int entry_state(const ct_work *w)
{
    int s = atomic_load(&w->state);
    return s >= CT_WORK_COMPLETED || !w->fail_state ? s : w->fail_state;
}

static void fill(cm_fr_entry *e, const ct_work *w)
{
    e->state = entry_state(w);
    e->t_started = w->t_started;
    e->t_completed = w->t_completed;
    e->nmissing = w->nmissing < 8 ? w->nmissing : 8;
    for (int i = 0; i < e->nmissing; i++)
        e->missing[i] = w->missing[i];
    if (e->state >= CT_WORK_TIMED_OUT) snprintf(e->error, sizeof e->error, "%s", w->msg);
}

void cm_fr_record(ct_comm *c, ct_work *w)
{
    cm_fr *fr = &c->fr;
    pthread_mutex_lock(&fr->mu);
    w->record_id = fr->next_id++;
    if (fr->cap) {
        cm_fr_entry *e = &fr->e[w->record_id % fr->cap];
        memset(e, 0, sizeof *e);
        e->record_id = w->record_id;
        e->seq = w->seq;
        e->p2p_seq = w->p2p_seq;
        e->kind = w->kind;
        e->dt = w->dt;
        e->count = w->count;
        e->root = w->root;
        e->t_created = w->t_created;
        e->timeout_s = w->timeout_s;
        fill(e, w);
    }
    pthread_mutex_unlock(&fr->mu);
}

void cm_fr_update(ct_comm *c, ct_work *w)
{
    cm_fr *fr = &c->fr;
    pthread_mutex_lock(&fr->mu);
    if (fr->cap) {
        cm_fr_entry *e = &fr->e[w->record_id % fr->cap];
        if (e->record_id == w->record_id) fill(e, w);
    }
    pthread_mutex_unlock(&fr->mu);
}

static const char *rank_state(int s)
{
    return s == CM_RANK_OK ? "ok" : s == CM_RANK_ABORTED ? "aborted" : "failed";
}

ct_status ct_comm_flight_recorder_json(ct_comm *c, const char *reason, char **json)
{
    if (!c || !json)
        return ct_error(CT_EINVAL, "ct_comm_flight_recorder_json: comm and json must not be NULL");
    *json = NULL;
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    json_t *root = json_object();
    json_object_set_new(root, "version", json_string("1"));
    json_object_set_new(root, "comm", json_string(c->name));
    json_object_set_new(root, "backend", json_string(ct_comm_backend_name(c->backend)));
    json_object_set_new(root, "rank", json_integer(c->rank));
    json_object_set_new(root, "size", json_integer(c->size));
    json_object_set_new(root, "pid", json_integer(getpid()));
    json_object_set_new(root, "host", json_string(host));
    json_object_set_new(root, "reason", json_string(reason && *reason ? reason : "on_demand"));
    json_object_set_new(root, "time_ns", json_integer(cm_wall_ns()));
    json_object_set_new(root, "last_enqueued_seq",
                        json_integer((json_int_t)atomic_load(&c->last_enqueued)));
    json_object_set_new(root, "last_started_seq",
                        json_integer((json_int_t)atomic_load(&c->last_started)));
    json_object_set_new(root, "last_completed_seq",
                        json_integer((json_int_t)atomic_load(&c->last_completed)));
    json_object_set_new(root, "failed", json_boolean(atomic_load(&c->failed)));
    json_object_set_new(root, "failure", json_string(atomic_load(&c->failed) ? c->fail_msg : ""));
    json_t *peers = json_array();
    for (int p = 0; p < c->size && c->be->peer_progress; p++) {
        if (p == c->rank) continue;
        uint64_t is, st, co;
        int state;
        json_t *o = json_object();
        json_object_set_new(o, "rank", json_integer(p));
        if (c->be->peer_progress(c, p, &is, &st, &co, &state)) {
            json_object_set_new(o, "last_enqueued_seq", json_integer((json_int_t)is));
            json_object_set_new(o, "last_started_seq", json_integer((json_int_t)st));
            json_object_set_new(o, "last_completed_seq", json_integer((json_int_t)co));
            json_object_set_new(o, "state",
                                json_string(c->links[p].dead ? "gone" : rank_state(state)));
        } else {
            json_object_set_new(o, "state",
                                json_string(c->links && c->links[p].dead ? "gone" : "unknown"));
        }
        json_array_append_new(peers, o);
    }
    json_object_set_new(root, "peers", peers);
    json_t *entries = json_array();
    cm_fr *fr = &c->fr;
    pthread_mutex_lock(&fr->mu);
    uint64_t n = fr->next_id < fr->cap ? fr->next_id : fr->cap;
    for (uint64_t id = fr->next_id - n; id < fr->next_id; id++) {
        const cm_fr_entry *e = &fr->e[id % fr->cap];
        json_t *o = json_object();
        json_object_set_new(o, "record_id", json_integer((json_int_t)e->record_id));
        json_object_set_new(o, "seq", json_integer((json_int_t)e->seq));
        json_object_set_new(o, "p2p_seq", json_integer((json_int_t)e->p2p_seq));
        json_object_set_new(o, "op", json_string(cm_op_name(e->kind)));
        json_object_set_new(o, "dtype",
                            json_string(e->kind == CM_OP_BARRIER ? "none" : ct_dtype_name(e->dt)));
        json_object_set_new(o, "count", json_integer((json_int_t)e->count));
        json_t *pl = json_array();
        if (e->kind == CM_OP_SEND || e->kind == CM_OP_RECV) {
            json_array_append_new(pl, json_integer(e->root));
        } else {
            for (int p = 0; p < c->size; p++)
                if (p != c->rank) json_array_append_new(pl, json_integer(p));
        }
        json_object_set_new(o, "peers", pl);
        int rooted = e->kind == CM_OP_BROADCAST || e->kind == CM_OP_REDUCE ||
                     e->kind == CM_OP_GATHER || e->kind == CM_OP_SCATTER;
        json_object_set_new(o, "root", rooted ? json_integer(e->root) : json_null());
        json_object_set_new(o, "state", json_string(ct_work_state_name((ct_work_state)e->state)));
        json_object_set_new(o, "time_created_ns", json_integer(e->t_created));
        json_object_set_new(o, "time_started_ns",
                            e->t_started ? json_integer(e->t_started) : json_null());
        json_object_set_new(o, "time_completed_ns",
                            e->t_completed ? json_integer(e->t_completed) : json_null());
        json_object_set_new(o, "timeout_ms", json_integer((json_int_t)(e->timeout_s * 1000.0)));
        json_t *ml = json_array();
        for (int i = 0; i < e->nmissing; i++)
            json_array_append_new(ml, json_integer(e->missing[i]));
        json_object_set_new(o, "missing_ranks", ml);
        json_object_set_new(o, "error", json_string(e->error));
        json_array_append_new(entries, o);
    }
    pthread_mutex_unlock(&fr->mu);
    json_object_set_new(root, "entries", entries);
    char *text = json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!text) return ct_error(CT_ENOMEM, "ct_comm_flight_recorder_json: cannot format the dump");
    size_t len = strlen(text);
    ct_status st = ct_alloc((void **)json, len + 1);
    if (!st) memcpy(*json, text, len + 1);
    free(text);
    return st;
}

/* Write all of buf to fd. */
static int write_all(int fd, const char *buf, size_t n)
{
    while (n) {
        ssize_t w = write(fd, buf, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        buf += w;
        n -= (size_t)w;
    }
    return 0;
}

/* A temporary file made with mkstemp (O_EXCL, mode 0600) in the target's folder, fsync'd,
 * renamed over the target, and the folder fsync'd: a crash leaves the old dump or the new
 * one, and nobody can plant a link at a predictable temporary name. */
static ct_status write_dump(ct_comm *c, const char *path, const char *reason)
{
    const char *fn = "ct_comm_flight_recorder_dump";
    char *text;
    CT_TRY(ct_comm_flight_recorder_json(c, reason, &text));
    char tmp[1100];
    if (snprintf(tmp, sizeof tmp, "%s.XXXXXX", path) >= (int)sizeof tmp) {
        ct_free(text);
        return ct_error(CT_EINVAL, "%s: path '%.80s...' is too long", fn, path);
    }
    ct_status st = CT_OK;
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        st = ct_error(CT_EIO, "%s: cannot create a temporary file next to %s: %s", fn, path,
                      strerror(errno));
    } else {
        size_t len = strlen(text);
        text[len] = '\n'; /* the NUL goes: the JSON text ends with a newline */
        int bad = write_all(fd, text, len + 1) != 0;
        bad |= fsync(fd) != 0;
        bad |= close(fd) != 0;
        if (bad || rename(tmp, path) != 0) {
            st = ct_error(CT_EIO, "%s: cannot write %s: %s", fn, path, strerror(errno));
            unlink(tmp);
        } else {
            char dir[1100];
            snprintf(dir, sizeof dir, "%s", path);
            char *slash = strrchr(dir, '/');
            if (slash == dir)
                dir[1] = 0;
            else if (slash)
                *slash = 0;
            else
                snprintf(dir, sizeof dir, ".");
            int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            if (dfd >= 0) {
                fsync(dfd); /* best effort: the file itself is complete either way */
                close(dfd);
            }
        }
    }
    ct_free(text);
    return st;
}

static void default_path(ct_comm *c, char *buf, size_t cap)
{
    char nm[100];
    snprintf(nm, sizeof nm, "%s", c->name);
    for (char *p = nm; *p; p++)
        if (*p == '/' || *p == ' ') *p = '_';
    snprintf(buf, cap, "%s/ctorch_fr_%s_rank%d.json", c->dump_dir, nm, c->rank);
}

ct_status ct_comm_flight_recorder_dump(ct_comm *c, const char *path)
{
    if (!c) return ct_error(CT_EINVAL, "ct_comm_flight_recorder_dump: comm must not be NULL");
    char buf[1024];
    if (!path) {
        if (!c->dump_dir[0])
            return ct_error(CT_EINVAL,
                            "ct_comm_flight_recorder_dump: no path and no dump directory "
                            "(opt.dump_dir or CT_COMM_FR_DUMP_DIR)");
        default_path(c, buf, sizeof buf);
        path = buf;
    }
    return write_dump(c, path, "on_demand");
}

void cm_fr_auto_dump(ct_comm *c, const char *reason)
{
    if (!c->dump_dir[0] || !c->fr.cap) return;
    char buf[1024], keep[1024];
    snprintf(keep, sizeof keep, "%s", ct_last_error());
    default_path(c, buf, sizeof buf);
    if (write_dump(c, buf, reason) == CT_OK)
        cm_log_event(c, CT_LOG_INFO, "flight_recorder_dump", "\"path\":\"%s\",\"reason\":\"%s\"",
                     buf, reason);
    ct_error(CT_OK, "%s", keep);
}

void cm_log_event(ct_comm *c, ct_log_level lvl, const char *event, const char *fmt, ...)
{
    char fields[1200], name[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(fields, sizeof fields, fmt, ap);
    va_end(ap);
    size_t k = 0;
    for (const char *p = c->name; *p && k + 2 < sizeof name; p++) {
        if (*p == '"' || *p == '\\') name[k++] = '\\';
        name[k++] = *p;
    }
    name[k] = 0;
    ct_log(lvl, "comm", "{\"event\":\"%s\",\"comm\":\"%s\",\"rank\":%d,\"size\":%d,\"pid\":%d%s%s}",
           event, name, c->rank, c->size, (int)getpid(), fields[0] ? "," : "", fields);
}

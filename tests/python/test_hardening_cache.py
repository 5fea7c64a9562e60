"""The compile cache against another local user (issue 20, item 1) and cache-dir failures that
are not ctorch's bugs (item 9). ctorch compiles mods to shared objects and loads them from its
cache dir (src/jit/compile.c, docs/compile.md): whoever can put a file where ctorch loads from
runs code as the ctorch user. The race test gives a second uid (setpriv, as the sessions run as
root) a directory on the cache's path and lets it swap the cache dir with a link to its own
entry, built for the very key ctorch computes, while ctorch looks the mod up again and again;
the other user's object writes a marker file when it is loaded, which must never appear. The
other tests plant links, FIFOs and loose modes where entries live (each one loaded, or hung,
before the fix), and make the compiler fail for reasons of the cache dir."""
import json
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOBODY = 65534

# A process of the library's user that compiles one mask mod through ctypes, again and again
# with the in-process table forgotten (so every round reads the disk cache), for at most
# `seconds` or `rounds`, stopping when `marker` appears; it prints what happened as JSON.
VICTIM = textwrap.dedent("""
    import ctypes, json, os, sys, time
    from ctorch._lib import lib
    a = json.loads(sys.argv[1])
    class Opts(ctypes.Structure):
        _fields_ = [("cc", ctypes.c_char_p), ("threads", ctypes.c_int), ("timeout_s", ctypes.c_double),
                    ("cache_dir", ctypes.c_char_p)]
    class Stats(ctypes.Structure):
        _fields_ = [(n, ctypes.c_int64) for n in ("table_hits", "cache_hits", "compiles", "rebuilt",
                                                  "processes")]
    lib.ct_mask_mod_compile.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int,
                                        ctypes.POINTER(Opts), ctypes.c_void_p]
    lib.ct_last_error.restype = ctypes.c_char_p
    o = Opts(None, 1, 0.0, a["cache"].encode())
    mod = ctypes.create_string_buffer(256)
    errors, ok, rounds, t0 = {}, 0, 0, time.monotonic()
    while rounds < a.get("rounds", 1 << 30) and time.monotonic() - t0 < a.get("seconds", 1e9):
        rounds += 1
        lib.ct_jit_reset_table()
        s = lib.ct_mask_mod_compile(a["expr"].encode(), None, 0, ctypes.byref(o), mod)
        if s == 0:
            ok += 1
            lib.ct_mask_mod_free(mod)
        else:
            m = lib.ct_last_error().decode(errors="replace")
            errors[m] = errors.get(m, 0) + 1
        if a.get("marker") and os.path.exists(a["marker"]):
            break
    st = Stats()
    lib.ct_jit_get_stats(ctypes.byref(st))
    print(json.dumps({"rounds": rounds, "ok": ok, "errors": errors,
                      "stats": {n: getattr(st, n) for n, _ in Stats._fields_}}))
""")

EXPR = "q >= kv && (q - kv) % 7 != 3"


def victim(cache, expr=EXPR, timeout=120, preexec_fn=None, **kw):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), PYTHONDONTWRITEBYTECODE="1")
    p = subprocess.run([sys.executable, "-c", VICTIM, json.dumps(dict(cache=str(cache), expr=expr, **kw))],
                       env=env, capture_output=True, text=True, timeout=timeout, preexec_fn=preexec_fn)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def entry_names(d):
    return sorted(n for n in os.listdir(d) if n.endswith(".so") and not n.startswith("tmp-"))


def compile_once(cache, expr=EXPR):
    """Compile expr into cache; return the entry's key."""
    r = victim(cache, expr, rounds=1)
    assert r["ok"] == 1, r
    (name,) = entry_names(cache)
    return name[:-3]


def evil_entry(where, key, marker):
    """Another user's entry for this key: a shared object that creates `marker` when loaded,
    with a checksum file that matches it."""
    src = where / "evil.c"
    src.write_text(textwrap.dedent(f"""
        #include <fcntl.h>
        #include <unistd.h>
        __attribute__((constructor)) static void evil(void)
        {{
            int fd = open("{marker}", O_WRONLY | O_CREAT, 0644);
            if (fd >= 0) close(fd);
        }}
        int ctj_abi(void) {{ return -1; }}
    """))
    so = where / f"{key}.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    src.unlink()
    import hashlib
    data = so.read_bytes()
    (where / f"{key}.sum").write_text(f"sha256 {hashlib.sha256(data).hexdigest()}\nsize {len(data)}\nkey {key}\n")


RACER = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
/* swap two names in a directory (one the cache dir, one a link) until `stop` exists */
int main(int argc, char **argv)
{
    if (argc != 4) return 2;
    long n = 0;
    for (;;) {
        for (int i = 0; i < 256; i++, n++)
            if (renameat2(AT_FDCWD, argv[1], AT_FDCWD, argv[2], RENAME_EXCHANGE) != 0) {
                perror("renameat2");
                return 1;
            }
        if (access(argv[3], F_OK) == 0) break;
    }
    printf("%ld\n", n);
    return 0;
}
"""


@pytest.fixture
def shared_tmp():
    """A directory in /tmp that the other uid can reach (pytest's tmp_path is root's, 0700)."""
    d = tempfile.mkdtemp(prefix="ctorch-hardening-", dir="/tmp")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_other_user_racing_links_never_gets_its_code_loaded(shared_tmp):
    assert os.geteuid() == 0, "this test gives a directory to a second uid: it runs as root"
    assert shutil.which("setpriv"), "setpriv (util-linux) is needed to run as a second uid"
    from pathlib import Path
    base = Path(shared_tmp)
    marker = base / "LOADED-OTHER-USERS-CODE"
    # the key the victim will look up (it does not depend on the cache dir)
    probe = base / "probe"
    probe.mkdir(mode=0o700)
    key = compile_once(probe)
    # the other user's directory on the victim's cache path, its own entry for that key, and a
    # link it will swap with the victim's cache dir
    shared, evil = base / "shared", base / "evil"
    for d in (shared, evil):
        d.mkdir(mode=0o755)
    evil_entry(evil, key, marker)
    cache = shared / "cache"
    cache.mkdir(mode=0o700)  # the victim's, with its good entry
    for ext in (".so", ".sum"):
        shutil.copy(probe / (key + ext), cache / (key + ext))
    os.symlink(evil, shared / "link")
    for p in (shared, evil, shared / "link", *evil.iterdir()):
        os.chown(p, NOBODY, NOBODY, follow_symlinks=False)
    racer_c, racer = base / "racer.c", base / "racer"
    racer_c.write_text(RACER)
    subprocess.run(["cc", "-O2", "-o", str(racer), str(racer_c)], check=True)
    stop = base / "stop"
    r = subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", str(racer),
                          str(cache), str(shared / "link"), str(stop)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        res = victim(cache, seconds=4.0, marker=str(marker))
    finally:
        stop.touch()
        out, err = r.communicate(timeout=60)
    assert r.returncode == 0, err
    swaps = int(out)
    assert swaps > 1000, f"the other user swapped only {swaps} times"
    assert not marker.exists(), f"ctorch loaded the other user's shared object: {res}"
    # the directory the other user owns on the way is named, with the rule
    assert res["ok"] == 0 and res["rounds"] > 10, res
    assert all("shared" in m and "belongs to another user" in m for m in res["errors"]), res


def test_parent_owned_by_another_user_is_refused(tmp_path):
    other = tmp_path / "theirs"
    other.mkdir(mode=0o755)
    os.chown(other, NOBODY, NOBODY)
    r = victim(other / "cache", rounds=1)
    (msg,) = r["errors"]
    assert "theirs" in msg and "belongs to another user" in msg and "CT_CACHE_DIR" in msg, msg
    assert not (other / "cache").exists()


def test_group_writable_parent_is_refused_sticky_one_passes(tmp_path):
    open_ = tmp_path / "open"
    open_.mkdir()
    open_.chmod(0o777)
    r = victim(open_ / "cache", rounds=1)
    (msg,) = r["errors"]
    assert "open" in msg and "writable by other users" in msg, msg
    open_.chmod(0o1777)  # like /tmp: only an entry's owner may rename it
    r = victim(open_ / "cache", rounds=1)
    assert r["ok"] == 1, r


def test_cache_dir_that_is_a_link_is_refused_links_on_the_way_followed(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "last").symlink_to(real)
    r = victim(tmp_path / "last", rounds=1)
    (msg,) = r["errors"]
    assert "symbolic link" in msg, msg
    # a link on the way that only its owner (root or the user) can change is followed
    (tmp_path / "via").symlink_to(tmp_path)
    r = victim(tmp_path / "via" / "real", rounds=1)
    assert r["ok"] == 1 and entry_names(real), r
    # ... but not one that belongs to another user
    os.chown(tmp_path / "via", NOBODY, NOBODY, follow_symlinks=False)
    r = victim(tmp_path / "via" / "real", rounds=1)
    (msg,) = r["errors"]
    assert "belongs to another user" in msg and "via" in msg, msg


def test_linked_or_loose_entries_are_rebuilt_never_loaded(tmp_path):
    """An entry that is a link (to a good entry), writable by others, or a FIFO (which blocked
    the reader forever) is rebuilt over, never read or loaded."""
    good = tmp_path / "good"
    good.mkdir(mode=0o700)
    key = compile_once(good)
    for case in ("link", "loose", "fifo"):
        cache = tmp_path / case
        cache.mkdir(mode=0o700)
        for ext in (".so", ".sum"):
            if case == "link":
                os.symlink(good / (key + ext), cache / (key + ext))
            elif case == "loose":
                shutil.copy(good / (key + ext), cache / (key + ext))
                os.chmod(cache / (key + ext), 0o666)
            elif ext == ".so":
                os.mkfifo(cache / (key + ext))
            else:
                shutil.copy(good / (key + ext), cache / (key + ext))
        r = victim(cache, rounds=1, timeout=60)
        assert r["ok"] == 1 and r["stats"]["cache_hits"] == 0 and r["stats"]["rebuilt"] == 1, (case, r)
        for ext in (".so", ".sum"):
            st = os.lstat(cache / (key + ext))
            assert stat.S_ISREG(st.st_mode) and not st.st_mode & 0o022, (case, ext, oct(st.st_mode))
        r = victim(cache, rounds=1)  # the rebuilt entry is a hit
        assert r["stats"]["cache_hits"] == 1, (case, r)
    assert not [n for n in os.listdir(tmp_path / "link") if n.startswith("tmp-")]


def test_relative_cache_dir_named_like_an_option(tmp_path):
    """A cache dir '-cache' relative to the working directory: the compiler is given names
    relative to the cache dir, never its path (which it took for an option: 'a bug')."""
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    p = subprocess.run([sys.executable, "-c", VICTIM, json.dumps(dict(cache="-cache", expr=EXPR, rounds=1))],
                       env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["ok"] == 1, r
    assert entry_names(tmp_path / "-cache")


def test_compiler_failing_on_the_cache_dir_is_not_called_a_bug(tmp_path):
    """The compiler cannot write its output (a file size limit, as a full disk would): the
    message says what to check, not '(a bug: please report)'."""
    cache = tmp_path / "c"

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (12 << 10, 12 << 10))

    r = victim(cache, rounds=1, preexec_fn=small_files)
    (msg,) = r["errors"]
    assert "a bug" not in msg, msg
    assert "File too large" in msg and str(cache) in msg and "CT_CACHE_DIR" in msg, msg
    assert not [n for n in os.listdir(cache) if n.startswith("tmp-")]

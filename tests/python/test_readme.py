"""The README's C and Python examples and its command-line examples run as written."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def blocks(lang):
    text = open(os.path.join(ROOT, "README.md")).read()
    return re.findall(r"```" + lang + r"\n(.*?)```", text, re.S)


def test_python_example(tmp_path):
    (code,) = blocks("python")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    a, b = map(float, r.stdout.split())
    assert abs(a - b) < 1e-4 * max(1.0, abs(b))


def test_c_example(tmp_path):
    (code,) = blocks("c")
    src = tmp_path / "example.c"
    src.write_text(code)
    lib = os.environ.get("CTORCH_LIB", os.path.join(ROOT, "build", "libctorch.so"))
    static = os.path.join(os.path.dirname(lib), "libctorch.a")
    exe = tmp_path / "example"
    cc = subprocess.run(["cc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-I", os.path.join(ROOT, "include"),
                         str(src), static, "-ljansson", "-lm", "-lpthread", "-ldl", "-o", str(exe)],
                        capture_output=True, text=True)
    assert cc.returncode == 0, cc.stderr
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert re.match(r"loss \d+\.\d+, dW\[0\] -?\d+\.\d+", r.stdout)


def test_command_line_examples(tmp_path):
    """Each line of the indented block under "## Command line" that starts with `ctorch`, in
    order in one folder (`ctorch` is the CLI under test)."""
    import shlex
    text = open(os.path.join(ROOT, "README.md")).read()
    section = text.split("## Command line", 1)[1].split("\n## ", 1)[0]
    lines = [ln.strip().split("  #")[0].strip() for ln in section.splitlines() if ln.startswith("    ctorch ")]
    assert len(lines) >= 7, lines
    cli = os.environ.get("CTORCH_CLI", os.path.join(ROOT, "build", "ctorch"))
    for line in lines:
        argv = [cli if a == "ctorch" else a for a in shlex.split(line)]
        r = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, (line, r.stderr[-2000:])
        assert (r.stdout + r.stderr).strip(), line
    assert (tmp_path / "run1" / "model.pt").is_file()

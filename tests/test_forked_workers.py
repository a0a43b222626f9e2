"""The tests' forked Ray workers (tests/forked_workers.py): the client hands its arguments,
environment, working directory and standard streams to the template, whose child runs the worker
script with them; the client passes on signals and the worker's exit status, a dead client takes
its worker with it, and without a template the client runs the worker itself. Then, on the tests'
own Ray instance, that Ray's workers really are the template's children."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import forked_workers

SCRIPT = """
import os, signal, sys, time
print("pid", os.getpid(), "ppid", os.getppid(), flush=True)
print("argv", *sys.argv[1:], flush=True)
print("cwd", os.getcwd(), "X", os.environ.get("X"), "path0", sys.path[0], flush=True)
print("json loaded before", "json" in sys.modules, flush=True)
print("sigpipe", int(signal.getsignal(signal.SIGPIPE)), flush=True)
print("to stderr", file=sys.stderr, flush=True)
if sys.argv[1] == "sleep":
    time.sleep(60)
sys.exit(int(sys.argv[2]))
"""


@pytest.fixture
def template(tmp_path):
    """A template that imports only ``json`` (so it is ready at once), on its own socket."""
    path = str(tmp_path / "t.sock")
    proc = subprocess.Popen([sys.executable, forked_workers.__file__, "--serve", path, "json"],
                            stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not os.path.exists(path):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    yield proc, path
    proc.terminate()
    proc.wait(10)


def _client(tmp_path, socket_path, *args, env=None):
    script = tmp_path / "worker.py"
    script.write_text(SCRIPT)
    env = {**os.environ, forked_workers.SOCKET_ENV: socket_path, forked_workers.WORKER_ENV: str(script),
           "X": "from-the-client", **(env or {})}
    work = tmp_path / "cwd"
    work.mkdir(exist_ok=True)
    return subprocess.Popen([sys.executable, forked_workers.__file__, *args], cwd=work, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _fields(out: str) -> dict[str, list[str]]:
    return {line.split(" ", 1)[0]: line.split()[1:] for line in out.splitlines() if line}


def test_the_template_s_child_runs_the_worker_with_the_client_s_arguments_environment_and_streams(template,
                                                                                                   tmp_path):
    proc, path = template
    client = _client(tmp_path, path, "exit", "3", "--flag=a b")
    out, err = client.communicate(timeout=60)
    assert client.returncode == 3, err                       # the worker's status, through the client
    f = _fields(out)
    assert int(f["pid"][2]) == proc.pid and int(f["pid"][0]) != client.pid   # forked by the template
    assert f["argv"] == ["exit", "3", "--flag=a", "b"]
    assert f["cwd"] == [str(tmp_path / "cwd"), "X", "from-the-client", "path0", str(tmp_path)]
    assert f["json"][-1] == "True"                           # what the template imported is there
    assert f["sigpipe"] == [str(int(signal.SIG_IGN))]        # as Python starts: a closed pipe raises
    assert "to stderr" in err                                # the client's own stderr


CHILD = """
import os, sys
print("ppid", os.getppid())
print("name", __name__, "argv", *sys.argv, "cwd", os.getcwd(), "path0", repr(sys.path[0]), "X", os.environ.get("X"))
print("json", "json" in sys.modules, flush=True)
if sys.argv[-1] == "raise":
    raise ValueError("from the child")
sys.exit(int(sys.argv[-1]))
"""


def test_a_python_child_forked_from_the_template_sees_what_a_fresh_interpreter_sees(template, tmp_path):
    """``python_command``: a test's ``python -c CODE ARGS`` or ``python SCRIPT ARGS``, run as the
    template's child, prints what a fresh interpreter prints (name, arguments, working directory,
    first path entry, environment, exit status, traceback), with the template's imports there."""
    proc, path = template
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    work = tmp_path / "work"
    work.mkdir()
    env = os.environ | {"X": "given"}
    for head in (["-c", CHILD], [str(script)]):
        for last in ("4", "raise"):
            argv = [sys.executable, *head, "a b", last]
            runs = {}
            for how in ("fresh", "forked"):
                cmd, child_env = ((argv, env) if how == "fresh" else
                                  forked_workers.python_command(argv, env, tmp_dir=str(tmp_path), template=path))
                runs[how] = subprocess.run(cmd, env=child_env, cwd=work, capture_output=True, text=True, timeout=60)
            fresh, forked = (_fields(runs[h].stdout) for h in ("fresh", "forked"))
            assert int(forked.pop("ppid")[0]) == proc.pid and int(fresh.pop("ppid")[0]) != proc.pid, head
            assert forked.pop("json") == ["True"] and fresh.pop("json") == ["False"]
            assert forked == fresh and fresh["name"][0] == "__main__" and "given" in fresh["name"], head
            assert runs["forked"].returncode == runs["fresh"].returncode == (4 if last == "4" else 1)
            if last == "raise":
                tails = [runs[h].stderr.strip().splitlines()[-2:] for h in ("fresh", "forked")]
                assert tails[0] == tails[1] and tails[0][-1] == "ValueError: from the child", tails
    # what it does not run through the template: a module (-m), or another interpreter
    for argv in ([sys.executable, "-m", "json.tool"], ["python3", "-c", "pass"]):
        assert forked_workers.python_command(argv, env, template=path) == (argv, env)


def test_a_signal_to_the_client_reaches_the_worker_and_a_killed_client_takes_its_worker(template, tmp_path):
    _, path = template
    for signum, status in ((signal.SIGTERM, 128 + signal.SIGTERM), (signal.SIGKILL, -signal.SIGKILL)):
        client = _client(tmp_path, path, "sleep", "0")
        worker = int(client.stdout.readline().split()[1])
        client.send_signal(signum)
        assert client.wait(30) == status
        deadline = time.monotonic() + 30
        while _alive(worker):
            assert time.monotonic() < deadline, f"worker {worker} outlived its client ({signum})"
            time.sleep(0.02)
        client.stdout.close()
        client.stderr.close()


def test_a_signal_before_the_worker_s_pid_is_known_is_held_and_forwarded_to_the_worker(tmp_path):
    """The raylet may signal a client as soon as it starts: before the template has answered with
    its worker's pid, the signal is held, then passed on to the worker, and the client ends with
    the worker's status (a stand-in template here answers when the test says so)."""
    import socket

    path = str(tmp_path / "fake.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    victim = subprocess.Popen(["sleep", "60"])          # the worker the stand-in template names
    client = _client(tmp_path, path, "sleep", "0")
    conn = None
    try:
        conn, _ = server.accept()
        request, fds = forked_workers._read_request(conn)
        for fd in fds:
            os.close(fd)
        assert request is not None and len(fds) == 3
        client.send_signal(signal.SIGTERM)               # no pid known yet
        deadline = time.monotonic() + 30
        while client.poll() is None and not _pending(client.pid, signal.SIGTERM):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert client.poll() is None, "the client ended on a signal meant for its worker"
        conn.sendall(forked_workers._HEADER.pack(victim.pid))
        assert victim.wait(30) == -signal.SIGTERM       # forwarded once the pid came
        conn.sendall(forked_workers._HEADER.pack(-signal.SIGTERM))    # the worker's status
        assert client.wait(30) == 128 + signal.SIGTERM
    finally:
        for proc in (client, victim):
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        client.stdout.close()
        client.stderr.close()
        if conn is not None:
            conn.close()
        server.close()


def _pending(pid: int, signum: int) -> bool:
    """``signum`` is waiting to be delivered to ``pid`` (held by its signal mask)."""
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    return any(int(fields[k], 16) >> (signum - 1) & 1 for k in ("SigPnd", "ShdPnd"))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):   # gone; ESRCH while the kernel is still removing it
        return False


def test_without_a_template_the_client_runs_the_worker_itself(tmp_path):
    client = _client(tmp_path, str(tmp_path / "no-such.sock"), "exit", "0")
    out, err = client.communicate(timeout=60)
    f = _fields(out)
    assert client.returncode == 0 and int(f["pid"][0]) == client.pid, err
    assert f["json"][-1] == "False" and f["sigpipe"] == [str(int(signal.SIG_IGN))]


def test_a_leased_template_serves_until_its_last_lease_is_gone_and_takes_its_files(tmp_path):
    """The test run's template: each test process takes a lease (a connection it keeps open);
    with one lease gone it still forks workers, with the last one gone it ends and removes its
    socket, pid file and folder."""
    folder = tmp_path / "run"
    folder.mkdir()
    path = str(folder / "template.sock")
    (folder / forked_workers.PID_FILE).write_text("0")
    proc = subprocess.Popen([sys.executable, forked_workers.__file__, "--serve-leased", path, "json"],
                            stdin=subprocess.DEVNULL)
    try:
        leases = [forked_workers._take_lease(path) for _ in range(2)]
        assert [pid for _, pid in leases] == [proc.pid, proc.pid]
        leases.pop()[0].close()
        client = _client(tmp_path, path, "exit", "5")
        out, err = client.communicate(timeout=60)
        assert client.returncode == 5 and _fields(out)["json"][-1] == "True", err     # forked by the template
        assert proc.poll() is None
        leases.pop()[0].close()
        assert proc.wait(30) == 0
        assert not folder.exists()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_tests_ray_workers_are_children_of_the_template_with_its_libraries_imported(ray_local):
    """One template for the whole test run: the test processes of a pytest-xdist run share it,
    each holding a lease on it."""
    assert "folder" in forked_workers._template, "no template looked for"
    log = os.path.join(forked_workers._template["folder"], "template.log")
    assert forked_workers._template["path"], open(log).read()[-3000:]      # it refused to serve: why
    template = forked_workers._template["pid"]
    assert forked_workers._read_pid(forked_workers._template["folder"]) == template

    @ray_local.remote
    def where():
        return os.getppid(), "torch" in sys.modules, "diffusers" in sys.modules

    @ray_local.remote(num_cpus=0.5, runtime_env={"env_vars": {"X": "from-ray"}})
    class Actor:
        def where(self):
            return os.getppid(), os.environ.get("X")

    assert ray_local.get(where.remote(), timeout=120) == (template, True, True)
    actor = Actor.remote()
    # a runtime environment of its own (started through Ray's setup_worker.py): its variables reach it
    assert ray_local.get(actor.where.remote(), timeout=120) == (template, "from-ray")
    ray_local.kill(actor)

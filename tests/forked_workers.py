"""Ray worker processes for the tests' local Ray instances, forked from one interpreter that has
already imported the libraries the operators use, instead of each starting a fresh one.

Why: every actor stage of every Ray Data execution starts a new worker process, which imports
torch, diffusers, transformers, open_clip, spaCy or mediapipe again before it loads its (tiny)
model: 2-9 CPU-s per process, about 470 of the full suite's 1,630 CPU-s (docs/testing.md).
Ray has no fork server of its own. Here the raylet of every Ray instance a test process starts
(``install``, from conftest.py) runs this file as its worker command; run as a script, it is
the *client*: it hands its arguments, environment, working directory and standard streams to
the *template* (``serve``, one per test run, started on first use), which forks a child
that becomes the Ray worker (``default_worker.py``, run as ``__main__``) with those. The worker
is a real Ray worker in every other respect: it registers with the raylet under its own PID
(as a worker behind a container or conda shim does), runs its tasks and actors, and is killed
by the raylet like any other. The client stays as the process the raylet started: it passes on
the signals it gets and exits with the worker's status; if it dies, the template kills the
worker.

What it does not show, and where that is tested instead: a worker's start in a fresh interpreter
(its imports). The cluster of the ``ray job submit`` test (``ray start`` in a subprocess) and the
fresh NER actor without torch (a subprocess with a Ray instance of its own) do not use it.
``T2I_TEST_FRESH_WORKERS=1`` turns it off for a whole run.

The same template runs some of the tests' own Python children (``python_command``: the GPU
benchmark's smoke run, the study scripts, two drivers with Ray instances of their own), where
what the test checks is not a fresh interpreter's start and the libraries read none of the
child's variables at import. A child that checks what a fresh interpreter imports, or that sets
variables the libraries read at import (``HF_HUB_CACHE``), still starts a fresh one.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys

SOCKET_ENV = "T2I_TEST_WORKER_TEMPLATE"   # the template's socket, in the raylet's environment
WORKER_ENV = "T2I_TEST_RAY_WORKER"        # Ray's default_worker.py, which the workers run
OFF_ENV = "T2I_TEST_FRESH_WORKERS"
_HEADER = struct.Struct("!q")
PID_FILE = "template.pid"
LEASE_WAIT_S = 120      # a run's template with no lease taken after its imports for this long ends

# What the template imports before it forks: the libraries of the operators' actors. Each is
# imported if it can be; one that cannot is left to the workers to import. Not Ray: its core
# library reads its settings from the environment once, when it is loaded (RAY_JOB_ID among
# them, which the raylet sets for each worker), so each worker loads it itself.
PRELOAD = (
    "numpy", "pyarrow", "pyarrow.compute", "pyarrow.parquet", "pandas", "PIL.Image", "scipy.stats",
    "torch", "torchvision", "safetensors.torch",
    "transformers", "diffusers", "open_clip", "sentence_transformers",
    "mediapipe", "cv2", "spacy",
)
PRELOAD_NAMES = (   # lazily exported classes whose modules the generator and head actors import
    ("diffusers", ("DiffusionPipeline", "AutoPipelineForText2Image", "StableDiffusionPipeline",
                   "StableDiffusionXLPipeline", "StableDiffusion3Pipeline", "FluxPipeline", "PixArtAlphaPipeline", "AutoencoderKL",
                   "UNet2DConditionModel", "LMSDiscreteScheduler", "PNDMScheduler")),
    ("transformers", ("CLIPTextModel", "CLIPTokenizer", "CLIPVisionModelWithProjection", "CLIPModel",
                      "CLIPTextModelWithProjection", "T5EncoderModel", "T5TokenizerFast",
                      "Blip2ForConditionalGeneration", "AutoTokenizer", "AutoModel")),
)


# ------------------------------------------------------------------------------------------ client
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def _client(argv: list[str]) -> int:
    """The process the raylet starts: hand everything to the template, wait for the worker. If
    the template cannot take it (gone, or refused to serve), this process becomes a fresh worker."""
    worker = os.environ[WORKER_ENV]
    # held until the worker's pid is known and they are forwarded to it: a signal that comes
    # sooner (the worker may already run and be seen) would otherwise end this process by its
    # default action, without the worker's status
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(os.environ[SOCKET_ENV])
        request = json.dumps({"argv": [worker, *argv], "env": dict(os.environ), "cwd": os.getcwd()}).encode()
        sock.sendmsg([_HEADER.pack(len(request))],
                     [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("3i", 0, 1, 2))])
        sock.sendall(request)
        data = _recv_exactly(sock, _HEADER.size)
        if not data:
            raise ConnectionError("the template closed the connection")
    except (OSError, KeyError):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
        os.execv(sys.executable, [sys.executable, worker, *argv])
    pid = _HEADER.unpack(data)[0]
    _die_with_parent()

    def forward(signum, _frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for s in FORWARDED:
        signal.signal(s, forward)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)    # any held signal is forwarded now
    data = _recv_exactly(sock, _HEADER.size)
    status = _HEADER.unpack(data)[0] if data else 1
    return status if status >= 0 else 128 - status     # killed by signal -status


def _die_with_parent(signum: int = signal.SIGKILL) -> None:
    """``signum`` when the process that started this one dies: a client with the raylet (its
    worker then goes with it), the template with its test process."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, int(signum), 0, 0, 0)    # PR_SET_PDEATHSIG
    except Exception:
        pass


def _recv_exactly(sock, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        try:
            chunk = sock.recv(n - len(buf))
        except InterruptedError:
            continue
        if not chunk:
            return b""
        buf += chunk
    return buf


# ---------------------------------------------------------------------------------------- template
def serve(path: str, preload: tuple[str, ...] = PRELOAD, preload_names=PRELOAD_NAMES, leased: bool = False) -> None:
    """The template: import ``preload``, then fork one worker per client connection. ``leased``:
    the template of a whole test run, which ends when the last test process holding a lease on it
    (an open connection, ``_take_lease``) has gone, and takes its folder with it; otherwise it
    ends with the process that started it."""
    import gc
    import importlib
    import selectors
    import time

    if not leased:
        _die_with_parent(signal.SIGTERM)    # the test process that started it
    # as Ray sets it for a worker of one CPU; OpenBLAS, read at its import, otherwise starts a thread per core
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(256)    # clients wait in the queue while the imports run
    for name in preload:
        try:
            importlib.import_module(name)
        except Exception:   # not installed, or needs what a worker has: left to the workers
            pass
    for module, names in preload_names:
        try:
            m = importlib.import_module(module)
            for n in names:
                getattr(m, n, None)
        except Exception:
            pass
    threads = _other_threads()
    if "ray._raylet" in sys.modules:
        threads.append("(Ray's core library is loaded)")
    if threads:     # forking a process with other threads is not safe: say so, and serve nothing
        print(f"forked_workers: the template has other threads after its imports ({', '.join(threads)}); "
              f"its clients start fresh workers", file=sys.stderr)
        return
    gc.collect()
    gc.freeze()         # the imports' objects stay shared with the children (no collection touches them)
    template_path = list(sys.path)

    rpipe, wpipe = os.pipe()
    os.set_blocking(wpipe, False)
    signal.set_wakeup_fd(wpipe)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(rpipe, selectors.EVENT_READ, "child")
    conns: dict[int, socket.socket] = {}        # worker pid -> its client's connection
    leases: list[socket.socket] = []
    unleased_until = time.monotonic() + LEASE_WAIT_S
    try:
        while True:
            events = sel.select(timeout=1.0 if leased else None)
            if leased and not leases and time.monotonic() > unleased_until:
                return                          # nobody took a lease, or the last one has gone
            for key, _ in events:
                if key.data == "accept":
                    conn, _ = listener.accept()
                    request, fds = _read_request(conn)
                    if request is not None and "lease" in request and not fds:
                        leases.append(conn)
                        sel.register(conn, selectors.EVENT_READ, "lease")
                        try:
                            conn.sendall(_HEADER.pack(os.getpid()))
                        except OSError:
                            pass
                        continue
                    pid = _fork_worker(conn, request, fds, template_path,
                                       [listener, rpipe, wpipe, *conns.values(), *leases])
                    if pid:
                        conns[pid] = conn
                        sel.register(conn, selectors.EVENT_READ, pid)
                    else:
                        conn.close()
                elif key.data == "lease":       # a test process holding a lease: readable only when it has gone
                    if _peer_gone(key.fileobj):
                        sel.unregister(key.fileobj)
                        leases.remove(key.fileobj)
                        key.fileobj.close()
                        unleased_until = time.monotonic()
                elif key.data == "child":
                    os.read(rpipe, 4096)
                    _reap(conns, sel)
                elif _peer_gone(key.fileobj):   # a client closed its end: it died, so its worker goes
                    sel.unregister(key.fileobj)
                    try:
                        os.kill(key.data, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
    finally:
        for pid in list(conns):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if leased:      # the socket first: a test process that looks now starts a template of its own
            folder = os.path.dirname(path)
            for name in (os.path.basename(path), PID_FILE, "template.log", "template.lock"):
                try:
                    os.unlink(os.path.join(folder, name))
                except OSError:
                    pass
            try:
                os.rmdir(folder)
            except OSError:
                pass


def _peer_gone(conn) -> bool:
    """A connection the peer sends nothing on is readable only when the peer has closed it (or
    its process has died); a reset counts as gone too, so it is never polled again."""
    try:
        return not conn.recv(1)
    except OSError:
        return True


# threads that survive a fork by design: pyarrow's jemalloc prepares for it (pthread_atfork)
FORK_SAFE_THREADS = {"jemalloc_bg_thd"}


def _other_threads() -> list[str]:
    names = []
    for t in os.listdir("/proc/self/task"):
        if int(t) != os.getpid():
            with open(f"/proc/self/task/{t}/comm") as f:
                name = f.read().strip()
            if name not in FORK_SAFE_THREADS:
                names.append(name)
    return names


def _reap(conns, sel) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = os.waitstatus_to_exitcode(status)
        conn = conns.pop(pid, None)
        if conn is not None:
            try:
                sel.unregister(conn)
            except (KeyError, ValueError):
                pass
            try:
                conn.sendall(_HEADER.pack(code))
            except OSError:
                pass
            conn.close()


def _read_request(conn) -> tuple[dict | None, list[int]]:
    """One client's request and the file descriptors sent with it (a lease comes with none)."""
    fds: list[int] = []
    try:
        msg, anc, _, _ = conn.recvmsg(_HEADER.size, socket.CMSG_SPACE(3 * 4))
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds += struct.unpack(f"{len(data) // 4}i", data[:len(data) - len(data) % 4])
        size = _HEADER.unpack(msg)[0]
        return json.loads(_recv_exactly(conn, size)), fds
    except Exception:
        for fd in fds:
            os.close(fd)
        return None, []


def _fork_worker(conn, request: dict | None, fds: list[int], template_path: list[str], close: list) -> int:
    """Fork one client's worker; its pid (0 if the request was bad)."""
    if request is None or "argv" not in request or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        return 0
    pid = os.fork()
    if pid:
        for fd in fds:
            os.close(fd)
        try:
            conn.sendall(_HEADER.pack(pid))
        except OSError:     # the client is gone already: the loop sees its end closed and kills the worker
            pass
        return pid
    # the worker
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        # as a fresh interpreter has them (SIGPIPE stays ignored, as Python sets it at start-up)
        for s in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
            signal.signal(s, signal.SIG_DFL if s != signal.SIGINT else signal.default_int_handler)
        for c in close:
            try:
                c.close() if hasattr(c, "close") else os.close(c)
            except OSError:
                pass
        conn.close()
        os.setpgid(0, 0)
        for i, fd in enumerate(fds):
            os.dup2(fd, i)
            os.close(fd)
        code = _become_worker(request, template_path)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _become_worker(request: dict, template_path: list[str]) -> int:
    import random
    import runpy

    random.seed()                     # a fresh process's generators are seeded from the OS, not shared
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()

    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    args = list(request["argv"])      # the worker script (WORKER_ENV) and the raylet's arguments
    script = args[0]
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.path.dirname(os.path.abspath(script)), *extra,
                   *[p for p in template_path[1:] if p not in extra]]
    sys.argv = args
    runpy.run_path(script, run_name="__main__")
    return 0


# --------------------------------------------------------------------------- the tests' side
_template: dict = {}


def install() -> None:
    """Make every Ray instance this process starts run its workers through a template: the one of
    the test process that started this process, if there is one, else the test run's (started
    with the first Ray instance of either test process; its imports take about 10 CPU-s, while the
    raylet's first workers wait for it). Nothing if ``T2I_TEST_FRESH_WORKERS`` is set, or if this
    Ray has not the hook it needs."""
    if os.environ.get(OFF_ENV) or not sys.platform.startswith("linux"):
        return
    try:
        from ray._private.node import Node
    except ImportError:
        return
    if getattr(Node.start_raylet, "_forked_workers", False):
        return
    original = Node.start_raylet

    def start_raylet(self, *args, **kwargs):
        path = _start_template()
        if path:
            # the raylet inherits these, and so do its workers
            os.environ[SOCKET_ENV] = path
            os.environ[WORKER_ENV] = self._ray_params.worker_path
            self._ray_params.worker_path = os.path.abspath(__file__)
        return original(self, *args, **kwargs)

    start_raylet._forked_workers = True
    Node.start_raylet = start_raylet


def template_folder() -> str:
    """Where the test run's template lives: one folder per pytest-xdist run (the processes of one
    run share their parent, the controller), or per process without xdist."""
    import tempfile

    owner = os.getppid() if os.environ.get("PYTEST_XDIST_WORKER") else os.getpid()
    return os.path.join(tempfile.gettempdir(), f"t2i-workers-{owner}")


def _start_template() -> str | None:
    """The socket of the test run's template, started here if no other test process of the run
    has started it, with a lease on it held for this process's life (None: no template, fresh
    workers; asked again, the answer stays)."""
    import fcntl
    import subprocess

    if "path" in _template:
        return _template["path"]
    inherited = os.environ.get(SOCKET_ENV)
    if inherited and os.path.exists(inherited):
        return inherited        # a driver the tests started in a subprocess: its test process's template
    folder = template_folder()
    path = _socket(folder)
    _template.update(path=None, folder=folder)
    for _ in range(2):      # the second time: the template ended between the look and the lease
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "template.lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)    # one test process at a time looks, and starts it if need be
            if not _serving(folder):
                if os.path.exists(path):
                    os.unlink(path)
                with open(os.path.join(folder, "template.log"), "ab") as log:
                    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve-leased", path],
                                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
                with open(os.path.join(folder, PID_FILE), "w") as f:
                    f.write(str(proc.pid))
                _template["proc"] = proc
        lease = _take_lease(path)
        if lease is not None:
            _template.update(path=path, lease=lease[0], pid=lease[1])
            break
        if "proc" in _template:      # one this process started, and it refused to serve: not again
            break
    return _template["path"]


def python_command(argv: list[str], env: dict | None = None, tmp_dir: str | None = None,
                   template: str | None = None) -> tuple[list[str], dict]:
    """A command line ``[sys.executable, script | "-c" code, *args]`` and its environment, turned
    into the client's, so that the Python child forks from the test run's template (its libraries
    imported) instead of importing them in a fresh interpreter: what ``subprocess.run`` is then
    given. The child runs the script as ``__main__`` with ``sys.argv`` as a fresh one has them,
    in the working directory and with the environment given (the template's imports read the
    test process's variables: only for a child whose variables those libraries do not read at
    import). ``-c`` code is run from a file in ``tmp_dir`` (a test's ``tmp_path``: the file stays
    there; by default the system's temporary folder) that runs it as ``python -c`` does
    (``sys.argv[0]`` ``"-c"``, the working directory first on the path, ``<string>`` in its
    tracebacks). ``template``: that template's socket; by default the test run's, where one is
    running already (started by a Ray instance of either test process: never for this alone, whose
    imports cost more than the child saves), else a fresh interpreter, the command unchanged."""
    import tempfile

    env = dict(os.environ if env is None else env)
    path = template or _running_template()
    if not path or len(argv) < 2 or argv[0] != sys.executable or (argv[1].startswith("-") and argv[1] != "-c"):
        return list(argv), env      # no template, or not a script or ``-c`` (``-m``, interpreter options)
    script, args = argv[1], list(argv[2:])
    if script == "-c":
        fd, script = tempfile.mkstemp(suffix=".py", dir=tmp_dir)
        with os.fdopen(fd, "w") as f:   # as ``python -c`` runs it: the working directory first on the path
            f.write(f"import sys\nsys.argv[0] = '-c'\nsys.path[0] = ''\n"
                    f"exec(compile({args.pop(0)!r}, '<string>', 'exec'))\n")
    return [sys.executable, os.path.abspath(__file__), *args], env | {SOCKET_ENV: path, WORKER_ENV: script}


def _running_template() -> str | None:
    """The socket of the test run's template if one is running (with a lease on it for this
    process), else None; none is started."""
    if "path" in _template:     # looked for before: the answer stays
        return _template["path"]
    return _start_template() if _serving(template_folder()) else None


def _socket(folder: str) -> str:
    return os.path.join(folder, "template.sock")


def _serving(folder: str) -> bool:
    """The run's template in ``folder`` is up: its socket is there and its process alive."""
    return os.path.exists(_socket(folder)) and _alive(_read_pid(folder))


def _read_pid(folder: str) -> int | None:
    try:
        with open(os.path.join(folder, PID_FILE)) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:     # alive, another user's
        pass
    return True


def _take_lease(path: str) -> tuple[socket.socket, int] | None:
    """A connection to the template, to be kept open for the rest of this process's life (the
    template ends when the last one closes), and the template's pid. None when it cannot be had
    (the template refused to serve, or ended): this process's Ray instances then start fresh
    workers."""
    import time

    deadline = time.monotonic() + 60
    while not os.path.exists(path):         # bound before the imports: the lease waits in its queue
        proc = _template.get("proc")
        if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
            return None
        time.sleep(0.05)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        request = json.dumps({"lease": os.getpid()}).encode()
        sock.sendall(_HEADER.pack(len(request)) + request)
        sock.settimeout(LEASE_WAIT_S)
        answer = _recv_exactly(sock, _HEADER.size)
    except OSError:
        answer = b""
    if not answer:
        sock.close()
        return None
    sock.settimeout(None)
    return sock, _HEADER.unpack(answer)[0]


if __name__ == "__main__":
    # --serve PATH [MODULE,MODULE...]: a template that ends with the process that started it;
    # --serve-leased PATH [MODULE,...]: the test run's, which ends with its last lease
    if sys.argv[1:2] in (["--serve"], ["--serve-leased"]):
        modules = (tuple(m for m in sys.argv[3].split(",") if m), ()) if len(sys.argv) > 3 else ()
        serve(sys.argv[2], *modules, leased=sys.argv[1] == "--serve-leased")
    else:
        sys.exit(_client(sys.argv[1:]))

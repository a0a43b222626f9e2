"""`ray job submit` to a Ray cluster, for real: a separate Ray head (`ray start --head`, token
authentication on, ports and temp dir of its own) gets the caption side of the sample job with
the repository as its working directory, the way a user submits to a remote cluster.

Also: scripts/cluster-local.yaml (the cluster-launcher config of scripts/local_cluster_demo.sh)
validates against Ray's schema, as `ray up` checks it.
"""

from __future__ import annotations

from helpers import REPO_ROOT
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = REPO_ROOT
VENV_BIN = Path(sys.executable).parent  # the interpreter running the tests, e.g. <repo>/.venv/bin
RAY_CLI = VENV_BIN / "ray" if (VENV_BIN / "ray").exists() else Path(shutil.which("ray") or VENV_BIN / "ray")


def test_local_cluster_config_matches_rays_schema():
    """The launcher config of the local demo passes the checks `ray up` runs: the raw file against
    ray-schema.json, then the config as the local provider prepares it (one node type, no workers)."""
    jsonschema = pytest.importorskip("jsonschema")
    import ray.autoscaler
    import yaml
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load((ROOT / "scripts" / "cluster-local.yaml").read_text())
    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    jsonschema.validate(config, schema)
    prepared = prepare_config(config)
    validate_config(prepared)
    assert config["provider"] == {"type": "local", "head_ip": "127.0.0.1", "worker_ips": []}
    assert prepared["max_workers"] == 0
    stop, start = config["head_start_ray_commands"]
    assert stop == "ray stop" and start.startswith("ray start --head --port=6379 --num-cpus=4")
    assert "--autoscaling-config=~/ray_bootstrap_config.yaml" in start


# ---------------------------------------------------------------------------------- the Ray head
def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _session_pids(sid: int) -> list[int]:
    """Processes of session ``sid`` (the head's ``ray start`` and everything Ray started from it)."""
    import psutil

    pids = []
    for p in psutil.process_iter(["status"]):
        try:
            if os.getsid(p.pid) == sid and p.info["status"] != psutil.STATUS_ZOMBIE:
                pids.append(p.pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            pass
    return pids


@dataclass
class RayHead:
    dashboard: str  # http://127.0.0.1:<port>: the address `ray job submit` takes
    env: dict  # environment of a client of this head (token included)
    token: str
    log: Path
    start_s: float  # how long `ray start --head` took to serve the job API


def _get(url: str, token: str | None, timeout: float = 5.0) -> int:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, OSError):  # not listening yet
        return 0


@pytest.fixture
def ray_head(tmp_path):
    """A Ray head of its own for one test: ``ray start --head --block`` in a new session, stopped
    by signalling that session only. A plain ``ray stop`` would stop every Ray process on the
    machine, the test session's own local instance (fixture ``ray_local``) included."""
    if not RAY_CLI.exists():
        pytest.skip(f"no `ray` CLI next to {sys.executable} or on PATH")
    try:
        import ray.dashboard.optional_deps  # noqa: F401  (what `ray start --include-dashboard` needs)
    except ImportError as e:
        pytest.skip(f"Ray dashboard dependencies missing (pip install 'ray[default]'): {e}")

    gcs, dashboard, client, agent = _free_ports(4)
    # Not under tmp_path: Ray puts unix sockets under its temp dir, and with pytest's long paths
    # they would exceed the 107 bytes a socket path may have.
    temp_dir = Path(tempfile.mkdtemp(prefix="t2i-ray-"))
    token = secrets.token_hex(32)
    token_file = tmp_path / "auth_token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN")}
    env.update(
        RAY_AUTH_MODE="token",  # explicit: `ray start` would otherwise enable it only if ~/.ray/auth_token exists
        RAY_AUTH_TOKEN_PATH=str(token_file),
        RAY_TMPDIR=str(temp_dir),  # nothing of this head lands in /tmp/ray (no ray_current_cluster there)
        # The job's entrypoint runs `python` from the head's PATH: this venv's.
        PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    log = tmp_path / "ray_head.log"
    cmd = [str(RAY_CLI), "start", "--head", "--block", f"--port={gcs}", f"--dashboard-port={dashboard}",
           "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--ray-client-server-port={client}",
           f"--dashboard-agent-listen-port={agent}", "--num-cpus=4", f"--temp-dir={temp_dir}",
           "--disable-usage-stats"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    sid = proc.pid  # start_new_session: the head's session id is the pid of `ray start`
    url = f"http://127.0.0.1:{dashboard}"
    t0 = time.monotonic()
    try:
        deadline = time.monotonic() + 240
        while True:
            if proc.poll() is not None:
                pytest.fail(f"`ray start --head` exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
            if _get(f"{url}/api/jobs/", token) == 200:
                break
            if time.monotonic() > deadline:
                pytest.fail(f"Ray head not up after 240 s:\n{log.read_text()[-4000:]}")
            time.sleep(1)
        yield RayHead(url, env, token, log, time.monotonic() - t0)
    finally:
        # `ray start --block` stops the processes it started on SIGTERM, but takes its time doing
        # it (about 30 s here, mostly waiting); the head is of no further use, so whatever of the
        # session is still there after a short grace period (workers, agents) gets SIGKILL.
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + 10
        while True:
            for pid in _session_pids(sid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
            time.sleep(0.5)
            if not (left := _session_pids(sid)) or time.monotonic() > deadline:
                break
        shutil.rmtree(temp_dir, ignore_errors=True)
        assert not left, f"processes of the test's Ray head still running: {left}"


def _ray(head: RayHead, *args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(RAY_CLI), *args], env=env or head.env, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, check=False)


def _job_status(head: RayHead, job_id: str) -> str:
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(head.dashboard, headers={"Authorization": f"Bearer {head.token}"})
    return str(client.get_job_status(job_id).value)


# ---------------------------------------------------------------------------------- the test
@pytest.mark.ray
def test_ray_job_submit_runs_the_caption_side_on_a_cluster(ray_head, tmp_path):
    # Token authentication is on: a client without the token is refused.
    no_token = {k: v for k, v in ray_head.env.items() if not k.startswith("RAY_AUTH")} | {"RAY_AUTH_MODE": "disabled"}
    refused = _ray(ray_head, "job", "list", "--address", ray_head.dashboard, env=no_token)
    assert refused.returncode != 0 and "Authentication" in refused.stdout + refused.stderr, refused

    # The command line of docs/cluster.md, on three occupations to keep the test short (the whole
    # caption side runs, on the matched captions of those three). --working-dir uploads the
    # repository: Ray leaves out .git, .venv and __pycache__ and honours .gitignore (runs/, ...).
    # Before it, in the same job, the `python` the job's driver gets: it must be the head's, the
    # venv's, with Ray and the project's dependencies.
    out = tmp_path / "out"
    job_id = f"t2i-captions-{secrets.token_hex(4)}"
    command = shlex.join(["python", "pipelines/amplification.py", "captions", "--output", str(out),
                          "--sample-size", "10", "--nn-k", "10", "--occupations", "nurse,firefighter,engineer"])
    which = shlex.join(["python", "-c", "import sys, ray; print('job python:', sys.executable)"])
    started = time.monotonic()
    res = _ray(ray_head, "job", "submit", "--address", ray_head.dashboard, "--working-dir", str(ROOT),
               "--submission-id", job_id, "--", "bash", "-c", f"{which} && {command}", timeout=540)
    elapsed = time.monotonic() - started
    logs = res.stdout + res.stderr
    assert res.returncode == 0, f"ray job submit failed after {elapsed:.0f} s:\n{logs[-6000:]}"
    assert f"job python: {VENV_BIN / 'python'}" in res.stdout, logs[-6000:]
    assert _job_status(ray_head, job_id) == "SUCCEEDED", logs[-6000:]

    metrics = sorted(out.rglob("metrics.json"))
    assert metrics, f"no metrics.json under {out}: {sorted(p.relative_to(out) for p in out.rglob('*'))[:50]}"
    m = json.loads(metrics[0].read_text())
    assert m["stage"] == "captions"
    assert m["counts"]["read_captions"]["rows_in"] == 30000  # the bundled sample, from the working dir
    assert sorted(o["name"] for o in m["config"]["occupations"]) == ["engineer", "firefighter", "nurse"]
    # The input is the job's copy of the repository (its working dir), not the checkout itself.
    assert str(ROOT) not in json.dumps(m.get("input")) and "working_dir_files" in json.dumps(m.get("input"))
    (tmp_path / "job.log").write_text(logs)
    print(f"\nray start --head: {ray_head.start_s:.0f} s; "
          f"ray job submit (`which python`, then captions on 3 occupations): {elapsed:.0f} s")

"""A local S3 (moto) for tests of s3:// inputs and outputs.

``moto_s3()`` serves moto's S3 on 127.0.0.1 on a free port (werkzeug, on a thread), creates a bucket,
and points the AWS SDK at it through environment variables, so that a plain
``fsspec.core.url_to_fs("s3://bucket/key")`` (s3fs / aiobotocore / botocore) reaches it with no
extra arguments -- in this process and in any process started afterwards that inherits the
environment (a subprocess running a pipeline CLI, or Ray workers of a Ray instance started
*after* entering). On exit the environment is restored, the server stopped, moto's in-memory
state reset and fsspec's cached S3 filesystems dropped.

Ray started *before* entering (e.g. the session fixture ``ray_local``) has workers that do not
see the variables: pass ``runtime_env={"env_vars": server.env}`` to ``ray.init`` / the task, or
start Ray inside the block.

    from s3_server import moto_s3, s3_server   # context manager, pytest fixture

    def test_x(s3_server):                      # fixture: a fresh server and bucket per test
        uri = s3_server.url("runs", "out")      # "s3://t2i-bias-audit-test/runs/out"
        ...
        s3_server.fs().ls(s3_server.bucket)     # an s3fs filesystem on the server

    with moto_s3(bucket="other") as server:      # the same outside pytest
        ...
"""

from __future__ import annotations

import contextlib
import logging
import os
import urllib.request
from dataclasses import dataclass, field
from typing import Iterator

import pytest

DEFAULT_BUCKET = "t2i-bias-audit-test"
REGION = "us-east-1"

# Everything the AWS SDK would otherwise pick up from the developer's machine (profiles,
# SSO, session tokens, config files with their own endpoint_url) is neutralised, so tests
# never reach real AWS and never depend on local credentials.
_UNSET = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "FSSPEC_S3",
    "FSSPEC_S3_ENDPOINT_URL",
)


@dataclass
class S3Server:
    endpoint_url: str                      # http://127.0.0.1:<port>
    bucket: str
    env: dict[str, str] = field(default_factory=dict)   # the variables set while running

    def url(self, *parts: str) -> str:
        """``s3://<bucket>/<parts joined by '/'>`` (just the bucket when no parts)."""
        key = "/".join(p.strip("/") for p in parts if p)
        return f"s3://{self.bucket}/{key}" if key else f"s3://{self.bucket}"

    def fs(self):
        """A fresh (uncached) s3fs filesystem on the server, for arranging and checking objects."""
        import s3fs

        return s3fs.S3FileSystem(skip_instance_cache=True)


def _clear_fsspec_s3_cache() -> None:
    try:
        import s3fs
    except ImportError:  # pragma: no cover - s3fs is a test dependency
        return
    s3fs.S3FileSystem.clear_instance_cache()


@contextlib.contextmanager
def moto_s3(bucket: str = DEFAULT_BUCKET) -> Iterator[S3Server]:
    """Run a moto S3 server with ``bucket`` created; see the module docstring."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    from helpers import serve_in_thread

    # werkzeug logs every request at INFO to stderr; keep test output readable
    werkzeug_log = logging.getLogger("werkzeug")
    saved_level = werkzeug_log.level
    werkzeug_log.setLevel(logging.WARNING)
    # moto's own ThreadedMotoServer polls for shutdown every 0.5 s, which each test's teardown
    # waited out; its application is served here by helpers.serve_in_thread instead
    server = make_server("127.0.0.1", 0, DomainDispatcherApplication(create_backend_app), threaded=True,
                         request_handler=MotoRequestHandler)
    loop = None
    try:
        loop = serve_in_thread(server)
        host, port = server.server_address[:2]
        endpoint = f"http://{host}:{port}"
        with _aws_environment(endpoint) as env:
            s3 = S3Server(endpoint, bucket, env)
            s3.fs().mkdir(bucket)  # creates the bucket
            yield s3
    finally:
        # moto's backends are process-global: reset them so the next server starts empty
        host, port = server.server_address[:2]
        with contextlib.suppress(OSError):
            request = urllib.request.Request(f"http://{host}:{port}/moto-api/reset", method="POST")
            urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=10).close()
        if loop is not None:   # the loop started (shutdown() waits for a loop that never ran)
            server.shutdown()
            loop.join()
        server.server_close()
        werkzeug_log.setLevel(saved_level)


@contextlib.contextmanager
def _aws_environment(endpoint: str) -> Iterator[dict[str, str]]:
    """Point the AWS SDK at ``endpoint`` with dummy credentials; restore everything after."""
    no_proxy = ",".join(p for p in (os.environ.get("NO_PROXY") or os.environ.get("no_proxy"),
                                    "127.0.0.1,localhost") if p)
    env = {
        # botocore >= 1.31 (and aiobotocore, which builds on it) take the endpoint from these;
        # s3fs passes endpoint_url=None unless given one, so botocore's own resolution applies.
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ENDPOINT_URL_S3": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_REGION": REGION,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
        "NO_PROXY": no_proxy,  # a proxy from the environment must not swallow 127.0.0.1
        "no_proxy": no_proxy,
    }
    saved = {k: os.environ.get(k) for k in (*env, *_UNSET)}
    try:
        for k in _UNSET:
            os.environ.pop(k, None)
        os.environ.update(env)
        _clear_fsspec_s3_cache()
        yield dict(env)
    finally:
        _clear_fsspec_s3_cache()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def s3_server() -> Iterator[S3Server]:
    """A moto S3 server with an empty bucket ``DEFAULT_BUCKET``, for one test."""
    with moto_s3() as server:
        yield server

"""Real shared stores for tests: a throwaway PostgreSQL database, a moto S3 server in its
own process, and a TCP proxy that can cut either off (an outage) and bring it back."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import boto3
import psycopg
from free_ports import free_port

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

#: The machine's PostgreSQL (trust auth); tests create and drop their own database.
POSTGRES_ADMIN = "postgresql://root@127.0.0.1:5432/postgres"
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "forklab-test",
    "AWS_SECRET_ACCESS_KEY": "forklab-test-secret",
    "AWS_REGION": "us-east-1",
}


@contextmanager
def postgres_database() -> Iterator[str]:
    """The URL of a new, empty database, dropped afterwards."""
    name = f"forklab_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}".encode())
    try:
        yield f"postgresql://root@127.0.0.1:5432/{name}"
    finally:
        with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)".encode())


@contextmanager
def moto_server() -> Iterator[str]:
    """A moto S3 server (its own process, in memory) on a free port; yields its URL."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            assert proc.poll() is None, "moto server exited"
            assert time.monotonic() < deadline, "moto server did not start"
            time.sleep(0.1)
        yield url
    finally:
        proc.kill()
        proc.wait()


def s3_admin(endpoint: str) -> S3Client:
    """A client of the test's S3 server with the test credentials (not the environment's)."""
    return boto3.session.Session(
        aws_access_key_id=S3_ENV["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=S3_ENV["AWS_SECRET_ACCESS_KEY"],
        region_name=S3_ENV["AWS_REGION"],
    ).client("s3", endpoint_url=endpoint)


def make_bucket(endpoint: str, bucket: str) -> None:
    s3_admin(endpoint).create_bucket(Bucket=bucket)


class Proxy:
    """Forwards 127.0.0.1:<port> to a target; ``down()`` refuses and drops every
    connection (the store looks dead), ``up()`` listens on the same port again."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self.up()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def up(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = self._conns, []
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    server.close()
                    return
                self._conns += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

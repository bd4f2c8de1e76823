"""What a TCP port answers to a client without (or with) the cluster token: run inside another host's namespace.

    python tests/helpers/portprobe.py IP PORT [PORT ...] [--token TOKEN]    -> one JSON object {port: answer}

Answers: `http 401` / `http 200` ... (an HTTP server's status to GET /); `grpc UNAUTHENTICATED` /
`grpc OK` ... (a gRPC server's status for the first of Ray's own methods it serves, called with an
empty request: a method it does not serve says UNIMPLEMENTED before any token check, so only a real
one tells); `grpc ?` (serves none of Ray's methods); `refused`; `silent` (answers neither protocol).
Read-only methods come first (Get/List/Num/Check/ClusterInfo); services without one are tried with
their own methods last.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import socket

READ_ONLY = ("Get", "List", "Num", "Check", "ClusterInfo")
# the raylet's object manager service has no Python stubs; a pull of no object pulls nothing
EXTRA = ["/ray.rpc.ObjectManagerService/Pull"]


def ray_methods() -> list[str]:
    import ray.core.generated as generated

    first, last = [], []
    for m in pkgutil.iter_modules(generated.__path__):
        if not m.name.endswith("_pb2"):
            continue
        mod = importlib.import_module(f"ray.core.generated.{m.name}")
        for svc in mod.DESCRIPTOR.services_by_name.values():
            names = [f"/{svc.full_name}/{x.name}" for x in svc.methods]
            ro = [n for n in names if n.rsplit("/", 1)[1].startswith(READ_ONLY)]
            first += ro
            last += [] if ro else names
    return first + last + EXTRA


def http_status(ip: str, port: int, token: str | None) -> int | None:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    with socket.create_connection((ip, port), timeout=5) as s:
        s.sendall(f"GET / HTTP/1.0\r\nHost: {ip}\r\n{auth}\r\n".encode())
        s.settimeout(5)
        try:
            head = s.recv(64)
        except (TimeoutError, ConnectionResetError):
            return None
    return int(head.split()[1]) if head.startswith(b"HTTP/") else None


def grpc_status(ip: str, port: int, token: str | None, methods: list[str]) -> str:
    import grpc

    meta = [("authorization", f"Bearer {token}")] if token else None
    with grpc.insecure_channel(f"{ip}:{port}") as channel:
        for method in methods:
            call = channel.unary_unary(method, request_serializer=lambda b: b, response_deserializer=lambda b: b)
            try:
                call(b"", timeout=5, metadata=meta)
                return "OK"
            except grpc.RpcError as e:
                code = e.code().name
            if code in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
                return "silent"
            if code != "UNIMPLEMENTED":
                return code
    return "?"


def probe(ip: str, port: int, token: str | None, methods: list[str]) -> str:
    try:
        status = http_status(ip, port, token)
    except ConnectionRefusedError:
        return "refused"
    if status is not None:
        return f"http {status}"
    code = grpc_status(ip, port, token, methods)
    return code if code == "silent" else f"grpc {code}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("ip")
    ap.add_argument("ports", nargs="+", type=int)
    ap.add_argument("--token")
    a = ap.parse_args()
    methods = ray_methods()
    print(json.dumps({p: probe(a.ip, p, a.token, methods) for p in a.ports}))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A minimal Python client of wmserve.v1 (python3-grpcio from Debian).

    python3 clients/python/wmclient.py --server localhost:50051 --frames 10 --out /tmp/py_frames

Stubs are generated at run time into a temporary directory with Debian's
protoc (protobuf-compiler) and grpc_python_plugin (protobuf-compiler-grpc),
so nothing generated is checked in. It checks health, prints the server
info, plays a few actions (per-action pacing, one in flight) and writes the
frames as JPEG files.
"""
import argparse
import atexit
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
import time

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_ROOT = os.path.join(HERE, "..", "..", "proto")


def load_stubs():
    """Generates wmserve_pb2 and wmserve_pb2_grpc and imports them."""
    plugin = shutil.which("grpc_python_plugin")
    if shutil.which("protoc") is None or plugin is None:
        sys.exit("wmclient: needs protoc and grpc_python_plugin (apt-get install protobuf-compiler protobuf-compiler-grpc)")
    out = tempfile.mkdtemp(prefix="wmclient_")
    atexit.register(shutil.rmtree, out, True)  # the generated stubs go when the client exits
    subprocess.run(["protoc", "--proto_path=" + PROTO_ROOT, "--python_out=" + out, "--grpc_out=" + out,
                    "--plugin=protoc-gen-grpc=" + plugin, "wmserve/v1/wmserve.proto"], check=True)
    sys.path.insert(0, out)
    pb2 = importlib.import_module("wmserve.v1.wmserve_pb2")
    pb2_grpc = importlib.import_module("wmserve.v1.wmserve_pb2_grpc")
    return pb2, pb2_grpc


def health(channel, service):
    """grpc.health.v1 Check without the health stubs: returns 1 SERVING, 2 NOT_SERVING, ..."""
    request = b"\x0a" + bytes([len(service)]) + service.encode()
    check = channel.unary_unary("/grpc.health.v1.Health/Check")
    response = check(request, timeout=5)
    return response[1] if len(response) >= 2 and response[0] == 0x08 else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", default="localhost:50051")
    ap.add_argument("--frames", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="")
    ap.add_argument("--tls", action="store_true", help="connect over TLS, trusting the system's CAs")
    ap.add_argument("--tls_ca", default="", help="PEM CA certificates to trust instead (implies --tls)")
    ap.add_argument("--tls_cert", default="", help="PEM client certificate for mutual TLS (with --tls_key)")
    ap.add_argument("--tls_key", default="", help="PEM private key of --tls_cert")
    ap.add_argument("--token_file", default="",
                    help="file whose first line is the API token (default: $WMSERVE_TOKEN, if set)")
    args = ap.parse_args()
    token = os.environ.get("WMSERVE_TOKEN", "").strip()
    if args.token_file:
        token = open(args.token_file).read().split("\n")[0].strip()
    # sent with every call when the server has API tokens (wmserve --auth_tokens)
    auth = [("authorization", "Bearer " + token)] if token else []
    pb2, pb2_grpc = load_stubs()

    if bool(args.tls_cert) != bool(args.tls_key):
        sys.exit("wmclient: --tls_cert and --tls_key go together")
    if args.tls or args.tls_ca or args.tls_cert:
        read = lambda path: open(path, "rb").read() if path else None
        creds = grpc.ssl_channel_credentials(root_certificates=read(args.tls_ca),
                                             private_key=read(args.tls_key),
                                             certificate_chain=read(args.tls_cert))
        channel = grpc.secure_channel(args.server, creds)
    else:
        channel = grpc.insecure_channel(args.server)
    stub = pb2_grpc.WorldModelStub(channel)
    print("health: live", health(channel, ""), "admit", health(channel, "wmserve.v1.admit"))
    info = stub.GetServerInfo(pb2.GetServerInfoRequest(), timeout=5, metadata=auth)
    print("server: version %s, models %s, %d sessions, %d of %d KV bytes free" %
          (info.version, list(info.models), info.sessions_active, info.kv_free_bytes, info.kv_capacity_bytes))

    # one action in flight: the next goes when the frame of the previous arrives
    frames = []
    pending = []

    def requests():
        yield pb2.PlayRequest(start=pb2.Start(seed=args.seed, pacing=pb2.PACING_PER_ACTION))
        for seq in range(1, args.frames + 1):
            while len(pending) >= 1:
                time.sleep(0.001)
            pending.append(time.monotonic())
            yield pb2.PlayRequest(action=pb2.Action(seq=seq, keys=1 if seq % 4 else 0, mouse_dx=5.0,
                                                    client_time_us=int(time.monotonic() * 1e6)))

    latencies = []
    for response in stub.Play(requests(), timeout=120, metadata=auth):
        kind = response.WhichOneof("kind")
        if kind == "started":
            s = response.started
            print("started: session %s, %dx%d, keys %s, format %s" %
                  (s.session_id, s.width, s.height, list(s.action_space.keys), s.cache_format))
        elif kind == "frame":
            latencies.append(time.monotonic() - pending.pop(0))
            frames.append(response.frame)
            if len(frames) == args.frames:
                break
        elif kind == "event":
            print("event:", response.event.code, response.event.message)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        for f in frames:
            with open(os.path.join(args.out, "frame_%05d.jpg" % f.index), "wb") as fh:
                fh.write(f.jpeg)
    latencies.sort()
    print("frames: %d, indices %s, action-to-frame p50 %.1f ms" %
          (len(frames), [f.index for f in frames], 1e3 * latencies[len(latencies) // 2] if latencies else 0))
    ok = len(frames) == args.frames and [f.index for f in frames] == list(range(args.frames)) and \
        [f.last_action_seq for f in frames] == list(range(1, args.frames + 1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

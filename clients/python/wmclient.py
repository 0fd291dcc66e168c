#!/usr/bin/env python3
"""A minimal Python client of wmserve.v1 (python3-grpcio from Debian).

    python3 clients/python/wmclient.py --server localhost:50051 --frames 10 --out /tmp/py_frames

Stubs are generated at run time into a temporary directory with Debian's
protoc (protobuf-compiler) and grpc_python_plugin (protobuf-compiler-grpc),
so nothing generated is checked in. It checks health, prints the server
info, plays a few actions (per-action pacing, one in flight; each brings a
block of the model's frames_per_block frames) and writes the frames as JPEG
files.
"""
import argparse
import atexit
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
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


def fail(message):
    """One line on stderr and exit 1, as the C++ clients do."""
    sys.exit("wmclient: " + message)


def describe_rpc_error(server, error):
    """A failed call, for a person (clients/play_client.h, describe_call_failure)."""
    code, details = error.code(), error.details()
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return "cannot reach wmserve at %s: %s" % (server, details)
    return "wmserve at %s refused the call (%s): %s" % (server, code.name, details)


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
    if args.frames < 1:
        fail("--frames must be at least 1")

    # every file is read, and --out made, before the server is called
    def read(flag, path):
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as e:
            fail("%s %s: %s" % (flag, path, e.strerror or e))

    token = os.environ.get("WMSERVE_TOKEN", "").strip()
    if args.token_file:
        token = read("--token_file", args.token_file).split(b"\n")[0].strip().decode("latin-1")
        if not token:
            fail("--token_file %s: its first line is empty" % args.token_file)
    # gRPC refuses metadata with other bytes, with a traceback
    if not all(0x20 < ord(c) < 0x7f for c in token):
        fail("%s: a token is printable characters without spaces" % (args.token_file or "WMSERVE_TOKEN"))
    # sent with every call when the server has API tokens (wmserve --auth_tokens)
    auth = [("authorization", "Bearer " + token)] if token else []
    if bool(args.tls_cert) != bool(args.tls_key):
        fail("--tls_cert and --tls_key go together")
    creds = None
    if args.tls or args.tls_ca or args.tls_cert:
        creds = grpc.ssl_channel_credentials(
            root_certificates=read("--tls_ca", args.tls_ca) if args.tls_ca else None,
            private_key=read("--tls_key", args.tls_key) if args.tls_key else None,
            certificate_chain=read("--tls_cert", args.tls_cert) if args.tls_cert else None)
    if args.out:
        try:
            os.makedirs(args.out, exist_ok=True)
        except OSError as e:
            fail("--out %s: %s" % (args.out, e.strerror or e))
    pb2, pb2_grpc = load_stubs()

    channel = grpc.secure_channel(args.server, creds) if creds else grpc.insecure_channel(args.server)
    try:
        return play(args, auth, channel, pb2, pb2_grpc)
    except grpc.RpcError as e:
        fail(describe_rpc_error(args.server, e))


def play(args, auth, channel, pb2, pb2_grpc):
    stub = pb2_grpc.WorldModelStub(channel)
    print("health: live", health(channel, ""), "admit", health(channel, "wmserve.v1.admit"))
    info = stub.GetServerInfo(pb2.GetServerInfoRequest(), timeout=5, metadata=auth)
    print("server: version %s, models %s, %d sessions, %d of %d KV bytes free" %
          (info.version, list(info.models), info.sessions_active, info.kv_free_bytes, info.kv_capacity_bytes))

    # one action in flight: the next goes when the first frame of the
    # previous one's block arrives. A block is the model's frames_per_block
    # (B) frames, and a block given one action repeats it, so an action
    # brings B frames: ceil(frames / B) actions, sent once Started says B
    frames = []
    pending = {}  # action seq -> send time, until its first frame
    per_block = [0]  # B, once Started arrives
    done = threading.Event()

    def requests():
        yield pb2.PlayRequest(start=pb2.Start(seed=args.seed, pacing=pb2.PACING_PER_ACTION))
        while per_block[0] == 0:
            if done.wait(0.001):
                return
        actions = (args.frames + per_block[0] - 1) // per_block[0]
        for seq in range(1, actions + 1):
            while pending:
                if done.wait(0.001):
                    return
            pending[seq] = time.monotonic()
            yield pb2.PlayRequest(action=pb2.Action(seq=seq, keys=1 if seq % 4 else 0, mouse_dx=5.0,
                                                    client_time_us=int(time.monotonic() * 1e6)))

    latencies = []
    started = None
    try:
        for response in stub.Play(requests(), timeout=120, metadata=auth):
            kind = response.WhichOneof("kind")
            if kind == "started":
                s = started = response.started
                print("started: session %s, %dx%d, %d frame(s) per block, keys %s, format %s" %
                      (s.session_id, s.width, s.height, s.model.frames_per_block, list(s.action_space.keys),
                       s.cache_format))
                per_block[0] = max(1, s.model.frames_per_block)
            elif kind == "frame":
                sent = pending.pop(response.frame.last_action_seq, None)
                if sent is not None:
                    latencies.append(time.monotonic() - sent)
                frames.append(response.frame)
                if len(frames) == args.frames:
                    break
            elif kind == "event":
                print("event:", response.event.code, response.event.message)
    finally:
        done.set()  # a request generator still waiting ends
    if args.out:
        for f in frames:
            path = os.path.join(args.out, "frame_%05d.jpg" % f.index)
            try:
                with open(path, "wb") as fh:
                    fh.write(f.jpeg)
            except OSError as e:
                fail("--out: %s: %s" % (path, e.strerror or e))
    latencies.sort()
    indices = [f.index for f in frames]
    print("frames: %d, indices %s, action-to-frame p50 %.1f ms" %
          (len(frames), indices, 1e3 * latencies[len(latencies) // 2] if latencies else 0))
    # the prompt frames (the Start's, or one of the model's prompts/) take
    # indices 0..prompt_frames-1 and are not sent: the first generated frame
    # is prompt_frames, and with one action in flight none is dropped
    first = started.prompt_frames if started is not None else 0
    per = per_block[0] or 1
    want = list(range(first, first + args.frames))
    if len(frames) != args.frames:
        fail("the stream ended after %d of %d frames" % (len(frames), args.frames))
    if indices != want:
        fail("frame indices %s, expected %d..%d (prompt_frames %d)" % (indices, want[0], want[-1], first))
    # frame i is of block i // B, which answers action i // B + 1
    seqs = [f.last_action_seq for f in frames]
    if seqs != [i // per + 1 for i in range(args.frames)]:
        fail("the frames answer actions %s, expected each of 1..%d for %d frame(s)" %
             (seqs, (args.frames + per - 1) // per, per))
    return 0


if __name__ == "__main__":
    sys.exit(main())

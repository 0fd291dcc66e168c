#!/usr/bin/python3
"""wmplay --web against a real wmserve: the page, a session's MJPEG frames,
input, every bad request, the player cap, a refused session and shutdown.

  web_player_test.py WMSERVE WMCKPT WMPLAY SOURCE_DIR
"""
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

WMSERVE, WMCKPT, WMPLAY, SRC = sys.argv[1:5]


def wait_port(path, proc, what):
    for _ in range(600):
        if os.path.exists(path) and os.path.getsize(path) > 0:
            with open(path) as f:
                return json.load(f)["port"]
        if proc.poll() is not None:
            raise RuntimeError("%s exited with %s" % (what, proc.returncode))
        time.sleep(0.05)
    raise RuntimeError("%s did not start" % what)


class WebPlayerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp()
        model = os.path.join(cls.dir, "model")
        subprocess.run([WMCKPT, "init", "--config", os.path.join(SRC, "configs/tiny-test.json"), "--seed", "1",
                        "--out", model], check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(SRC, "configs/tiny-test.json")) as f:
            cls.config = json.load(f)
        cls.server = subprocess.Popen([WMSERVE, "--model", model, "--host", "127.0.0.1", "--port", "0",
                                       "--metrics_port", "0", "--threads", "1",
                                       "--port_file", os.path.join(cls.dir, "server.json")],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        server_port = wait_port(os.path.join(cls.dir, "server.json"), cls.server, "wmserve")
        with open(os.path.join(cls.dir, "server.json")) as f:
            cls.metrics_port = json.load(f)["metrics_port"]
        cls.web = subprocess.Popen([WMPLAY, "--web", "127.0.0.1:0", "--server", "127.0.0.1:%d" % server_port,
                                    "--fps", "20", "--max_players", "2",
                                    "--port_file", os.path.join(cls.dir, "web.json")],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        cls.port = wait_port(os.path.join(cls.dir, "web.json"), cls.web, "wmplay --web")

    @classmethod
    def tearDownClass(cls):
        for p in (cls.web, cls.server):
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def request(self, method, path, body=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=20)
        c.request(method, path, body=body)
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, r.getheader("Content-Type", ""), data

    def server_metric(self, name):
        c = http.client.HTTPConnection("127.0.0.1", self.metrics_port, timeout=20)
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
        c.close()
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        return None

    def new_player(self, seed=5):
        status, _, data = self.request("POST", "/players?seed=%d" % seed)
        self.assertEqual(status, 200, data)
        return json.loads(data)

    def read_frames(self, conn_response, n):
        """n MJPEG parts: (index, jpeg bytes)"""
        frames = []
        f = conn_response
        while len(frames) < n:
            line = f.readline()
            self.assertTrue(line, "the stream ended after %d frames" % len(frames))
            if line.strip() != b"--wmframe":
                continue
            headers = {}
            while True:
                h = f.readline().strip()
                if not h:
                    break
                k, v = h.decode().split(": ", 1)
                headers[k] = v
            self.assertEqual(headers["Content-Type"], "image/jpeg")
            jpeg = f.read(int(headers["Content-Length"]))
            frames.append((int(headers["X-Frame-Index"]), jpeg))
        return frames

    def test_1_page(self):
        status, ctype, data = self.request("GET", "/")
        self.assertEqual(status, 200)
        self.assertIn("text/html", ctype)
        self.assertIn(b'<img id="view"', data)
        self.assertIn(b"/players?seed=", data)
        self.assertIn(b"/stats?id=", data)

    def test_2_a_session_streams_frames_and_takes_input(self):
        p = self.new_player(seed=7)
        self.assertEqual((p["width"], p["height"]), (self.config["frame"]["width"], self.config["frame"]["height"]))
        self.assertEqual(p["keys"], self.config["actions"]["keys"])
        self.assertEqual(p["fps"], 20)
        self.assertEqual(p["seed"], 7)
        status, _, _ = self.request("POST", "/input?id=" + p["id"], body="3 2.5 -1")
        self.assertEqual(status, 200)

        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=20)
        c.request("GET", "/stream?id=" + p["id"])
        r = c.getresponse()
        self.assertEqual(r.status, 200)
        self.assertIn("multipart/x-mixed-replace", r.getheader("Content-Type"))
        # a second stream for the same player is refused while the first is open
        status, _, data = self.request("GET", "/stream?id=" + p["id"])
        self.assertEqual(status, 409, data)
        frames = self.read_frames(r, 6)
        for index, jpeg in frames:
            self.assertEqual(jpeg[:2], b"\xff\xd8")
            self.assertEqual(jpeg[-2:], b"\xff\xd9")
        indices = [i for i, _ in frames]
        self.assertEqual(indices, sorted(indices))
        self.assertEqual(len(set(indices)), len(indices))
        # what the page shows beside the picture: frames so far, their rate, action-to-frame latency
        status, ctype, data = self.request("GET", "/stats?id=" + p["id"])
        self.assertEqual(status, 200, data)
        self.assertIn("application/json", ctype)
        stats = json.loads(data)
        self.assertGreaterEqual(stats["frames"], len(frames))
        self.assertGreater(stats["fps"], 0)
        self.assertLess(stats["fps"], 1000)
        self.assertGreater(stats["latency_ms_p50"], 0)
        self.assertGreaterEqual(stats["latency_ms_p95"], stats["latency_ms_p50"])
        self.assertGreaterEqual(stats["frames_dropped"], 0)
        r.close()  # the page goes away
        c.close()
        # closing the page's stream ends the session: its input is refused soon after
        for _ in range(100):
            status, _, _ = self.request("POST", "/input?id=" + p["id"], body="0 0 0")
            if status == 404:
                break
            time.sleep(0.05)
        self.assertEqual(status, 404)
        # and on wmserve the session ended as closed by its client, not parked for a resume
        # (parked sessions of one address would soon hit the server's per-client cap)
        for _ in range(100):
            if self.server_metric('wm_sessions_ended_total{reason="client_closed"}') == 1:
                break
            time.sleep(0.05)
        self.assertEqual(self.server_metric('wm_sessions_ended_total{reason="client_closed"}'), 1)
        self.assertEqual(self.server_metric("wm_sessions_parked"), 0)

    def test_2b_clients_that_trickle_their_requests_hold_nothing_for_long(self):
        # 16 connections that send a request a byte a second (slowloris; more than the threads
        # 2 players once needed): the page is served while they are all still open, and wmplay
        # drops each within its request timeout (10 s, civetweb's default is 30) though they
        # keep sending
        socks = []
        for _ in range(16):
            s = socket.create_connection(("127.0.0.1", self.port), timeout=20)
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
            socks.append(s)
        stop = threading.Event()

        def trickle():
            while not stop.is_set():
                for s in socks:
                    try:
                        s.sendall(b"X")
                    except OSError:
                        pass
                stop.wait(1.0)

        t = threading.Thread(target=trickle)
        t.start()
        try:
            status, _, data = self.request("GET", "/")
            self.assertEqual(status, 200)
            self.assertIn(b"<html", data.lower())
            for s in socks:  # nothing came back on them yet: still held open
                s.setblocking(False)
                with self.assertRaises(BlockingIOError):
                    s.recv(1)
                s.setblocking(True)
                s.settimeout(20)
            for s in socks:
                while True:  # civetweb may answer 408 first; then the connection closes
                    try:
                        chunk = s.recv(4096)
                    except ConnectionResetError:
                        break
                    if not chunk:
                        break
        finally:
            stop.set()
            t.join()
            for s in socks:
                s.close()

    def test_3_bad_requests(self):
        p = self.new_player()
        cases = [
            ("POST", "/input?id=" + p["id"], "garbage", 400),
            ("POST", "/input?id=" + p["id"], "1 nan 0", 400),
            ("POST", "/input?id=" + p["id"], "", 400),
            ("POST", "/input?id=nobody", "0 0 0", 404),
            ("GET", "/stream?id=nobody", None, 404),
            ("GET", "/stats?id=nobody", None, 404),
            ("POST", "/stats?id=" + p["id"], None, 405),
            ("POST", "/players?seed=minus-one", None, 400),
            ("GET", "/players", None, 405),
            ("GET", "/nope", None, 404),
            # bytes that are not UTF-8, echoed in the error, must not take the process down
            ("GET", "/%ff", None, 404),
            ("GET", "/stats?id=%ff", None, 404),
            ("POST", "/players?seed=%ff", None, 400),
            ("POST", "/input?id=" + p["id"], b"\xff 1 2", 400),
            ("POST", "/players?seed=" + "9" * 200, None, 400),
            ("POST", "/input?id=" + p["id"], "1 0 " + "0" * 300, 400),
        ]
        for method, path, body, want in cases:
            status, ctype, data = self.request(method, path, body)
            self.assertEqual(status, want, (method, path, body, data))
            self.assertIn("error", json.loads(data))
        # the player still works after all of that
        status, _, _ = self.request("POST", "/input?id=" + p["id"], body="1 0 0")
        self.assertEqual(status, 200)

    def test_4_the_player_cap_and_a_refusing_server(self):
        # test 3 left one unattached player; the cap is 2: of 6 requests at once, one gets the last slot
        statuses = []

        def create():
            statuses.append(self.request("POST", "/players")[0])

        threads = [threading.Thread(target=create) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(sorted(statuses), [200, 503, 503, 503, 503, 503], statuses)
        status, _, data = self.request("POST", "/players")
        self.assertEqual(status, 503, data)
        self.assertIn(b"player slots", data)

    def test_5_wmserve_gone_then_shutdown(self):
        self.server.send_signal(signal.SIGTERM)
        self.server.wait(timeout=30)
        # the unattached players of the earlier tests end within the attach timeout; a
        # new one fails against the stopped server
        deadline = time.time() + 30
        while True:
            status, _, data = self.request("POST", "/players")
            if status != 503 or time.time() > deadline:
                break
            time.sleep(0.5)
        self.assertEqual(status, 502, data)
        self.assertIn(b"wmserve at", data)
        self.web.send_signal(signal.SIGTERM)
        self.assertEqual(self.web.wait(timeout=30), 0)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"])

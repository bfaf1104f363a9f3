"""Webhook receiver for berth's signed webhook integration tests.

The tests point berth's webhooks at this server and verify every delivery with the Standard Webhooks
library from PyPI (standardwebhooks, installed by .ci/webhooks into tests/webhooks/.venv), not with
berth's own code, so a signature berth gets wrong in the same way on both sides cannot pass.

Usage: tests/webhooks/.venv/bin/python receiver.py --secret-file PATH --log PATH [--port 0]

It binds 127.0.0.1 (port 0: a free one), prints the port alone on the first line of stdout, and serves:
  POST <any path not under /control/>  a delivery: verified against every secret in the secret file
                                       (one `whsec_...` per line, re-read on each request), answered
                                       as the current mode says, and logged as one JSON line
  POST /control/mode  {"mode": "ok"|"fail"|"slow"|"redirect"|"huge", "seconds": float}
                      ok: 204 if verified, else 401; fail: 500; slow: sleep `seconds`, then 204;
                      redirect: 302 to http://127.0.0.1:1/elsewhere; huge: 200 with a 5 MiB body
  GET /control/log    the JSON array of the logged deliveries so far
"""

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook

HUGE_BYTES = 5 * 1024 * 1024
CHUNK = b"x" * 65536

state = {"mode": "ok", "seconds": 0.0}
lock = threading.Lock()
args = None


def verify(body, headers):
    """(verified, error): verified if any secret in the secret file verifies the delivery."""
    with open(args.secret_file, encoding="utf-8") as f:
        secrets = [line.strip() for line in f if line.strip()]
    if not secrets:
        return False, "no secret in the secret file"
    error = None
    for secret in secrets:
        try:
            Webhook(secret).verify(body, headers, json_parse=False)
            return True, None
        except Exception as e:  # the library also raises ValueError etc. on malformed headers
            error = str(e) or type(e).__name__
    return False, error


def read_log():
    with lock:
        try:
            with open(args.log, encoding="utf-8") as f:
                return [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            return []


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *a):
        pass

    def answer(self, status, body=b"", content_type="application/json", extra=()):
        self.send_response(status)
        for name, value in extra:
            self.send_header(name, value)
        if body:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/control/log":
            self.answer(200, json.dumps(read_log()).encode())
        else:
            self.answer(404)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.startswith("/control/"):
            return self.control(body)
        headers = {n: self.headers[n] for n in ("webhook-id", "webhook-timestamp", "webhook-signature")
                   if self.headers[n] is not None}
        verified, error = verify(body, headers)
        try:
            parsed = json.loads(body)
        except ValueError:  # also covers bytes that are not UTF-8
            parsed = None
        mode, seconds = state["mode"], state["seconds"]
        status = {"ok": 204 if verified else 401, "fail": 500, "slow": 204, "redirect": 302, "huge": 200}[mode]
        entry = {"webhook_id": headers.get("webhook-id"), "timestamp": headers.get("webhook-timestamp"),
                 "signature": headers.get("webhook-signature"), "verified": verified, "error": error,
                 "status": status, "body": parsed, "received_at": time.time()}
        with lock, open(args.log, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")
            f.flush()
        if mode == "slow":
            time.sleep(seconds)
        if mode == "redirect":
            self.answer(status, extra=[("Location", "http://127.0.0.1:1/elsewhere")])
        elif mode == "huge":
            self.send_huge()
        else:
            self.answer(status)

    def send_huge(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(HUGE_BYTES))
        self.end_headers()
        try:
            for _ in range(HUGE_BYTES // len(CHUNK)):
                self.wfile.write(CHUNK)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def control(self, body):
        if self.path != "/control/mode":
            return self.answer(404)
        try:
            request = json.loads(body)
            mode = request["mode"]
            if mode not in ("ok", "fail", "slow", "redirect", "huge"):
                raise ValueError(f"unknown mode {mode!r}")
            seconds = float(request.get("seconds", 0))
        except (ValueError, KeyError, TypeError) as e:
            return self.answer(400, json.dumps({"error": str(e)}).encode())
        state.update(mode=mode, seconds=seconds)
        self.answer(200, json.dumps({"mode": mode}).encode())


def main():
    global args
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--secret-file", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()

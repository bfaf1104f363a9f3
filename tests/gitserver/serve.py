#!/usr/bin/env python3
"""git's own smart-HTTP server (`git http-backend`, a CGI program) behind a small loopback web server
that checks HTTP Basic auth: the remote the push tests push to.

    serve.py <project root> <user> <password>

Prints the port it listens on, then serves until killed. Every repository under the root is served;
a request without the right credentials gets 401 (with a challenge, so git asks its credential helper).
Each request is one line on stderr (method, path, status, the user it authenticated, never a password).
"""
import base64
import http.server
import os
import subprocess
import sys

ROOT, USER, PASSWORD = sys.argv[1], sys.argv[2], sys.argv[3]


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def authenticated(self):
        header = self.headers.get("Authorization", "")
        if not header.startswith("Basic "):
            return None
        try:
            user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        except Exception:
            return None
        return user if (user, password) == (USER, PASSWORD) else None

    def body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length", "0") or 0))

    def handle_any(self):
        data = self.body() if self.command == "POST" else b""
        user = self.authenticated()
        path, _, query = self.path.partition("?")
        if user is None:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="berth tests"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            sys.stderr.write(f"{self.command} {path} 401\n")
            return
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_PROJECT_ROOT": ROOT,
            "GIT_HTTP_EXPORT_ALL": "1",
            "REMOTE_USER": user,
            "REMOTE_ADDR": "127.0.0.1",
            "REQUEST_METHOD": self.command,
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(data)),
            "GATEWAY_INTERFACE": "CGI/1.1",
        }
        if self.headers.get("Content-Encoding"):
            env["HTTP_CONTENT_ENCODING"] = self.headers["Content-Encoding"]
        if self.headers.get("Git-Protocol"):
            env["GIT_PROTOCOL"] = self.headers["Git-Protocol"]
        out = subprocess.run(["git", "http-backend"], input=data, env=env, capture_output=True).stdout
        head, _, payload = out.partition(b"\r\n\r\n")
        if not _:
            head, _, payload = out.partition(b"\n\n")
        status = 200
        headers = []
        for line in head.decode("latin-1").splitlines():
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.strip().split()[0])
            elif name:
                headers.append((name, value.strip()))
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)
        sys.stderr.write(f"{self.command} {path} {status} {user}\n")

    do_GET = handle_any
    do_POST = handle_any


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()

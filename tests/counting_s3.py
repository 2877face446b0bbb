"""An S3-compatible server (moto's server mode) that counts what it serves: the requests for each
object, the bytes of their answers, the ranges asked for, and how many wait on it at once;
optionally each request held `latency` seconds first, as a real store's first byte is (tens of
ms on S3). tests/test_remote.py runs it in its own process's threads; bench/bench_remote.py in a
process of its own (`python tests/counting_s3.py`: it prints its address), so that the client's
CPU time is the client's alone, and reads its counts at /_counts (/_reset forgets them,
/_latency/SECONDS sets the latency)."""

import json
import sys
import threading
import time
from collections import defaultdict

from moto.server import DomainDispatcherApplication, ThreadedMotoServer, create_backend_app
from werkzeug.serving import WSGIRequestHandler, make_server


class Quiet(WSGIRequestHandler):
    def log_request(self, *args, **kwargs) -> None:  # a line per request would drown the output
        pass


class CountingS3Server(ThreadedMotoServer):
    def __init__(self, latency: float = 0.0):
        super().__init__(ip_address="127.0.0.1", port=0, verbose=False)
        self.latency = latency
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """Forget what was served so far."""
        with self.lock:
            self.requests = defaultdict(int)  # object key -> GET requests
            self.bytes = defaultdict(int)  # object key -> bytes of the answers' bodies
            self.ranged = defaultdict(int)  # object key -> GET requests with a Range
            self.in_flight = 0
            self.most_in_flight = 0

    def url(self) -> str:
        host, port = self.get_host_and_port()
        return f"http://{host}:{port}"

    def _server_entry(self) -> None:  # ThreadedMotoServer's, with the app wrapped
        app = DomainDispatcherApplication(create_backend_app)
        self._server = make_server(
            self._ip_address, self._port, self.counting(app), threaded=True, request_handler=Quiet
        )
        self._server_ready_event.set()
        self._server.serve_forever()

    def counts(self) -> dict:
        with self.lock:
            return {
                "requests": dict(self.requests),
                "bytes": dict(self.bytes),
                "ranged": dict(self.ranged),
                "most_in_flight": self.most_in_flight,
            }

    def control(self, path: str) -> bytes:
        """The answer to a /_counts, /_reset or /_latency/SECONDS request."""
        if path.startswith("/_latency/"):
            self.latency = float(path.removeprefix("/_latency/"))
        elif path == "/_reset":
            self.reset()
        return json.dumps(self.counts()).encode()

    def counting(self, app):
        def counted(environ, start_response):
            key = environ.get("PATH_INFO", "")
            if key.startswith("/_"):
                start_response("200 OK", [("Content-Type", "application/json")])
                return [self.control(key)]
            get = environ["REQUEST_METHOD"] == "GET" and key.count("/") >= 2  # /bucket/key
            with self.lock:
                self.in_flight += 1
                self.most_in_flight = max(self.most_in_flight, self.in_flight)
            try:
                if self.latency:
                    time.sleep(self.latency)
                body = b"".join(app(environ, start_response))
            finally:
                with self.lock:
                    self.in_flight -= 1
            if get:
                with self.lock:
                    self.requests[key] += 1
                    self.bytes[key] += len(body)
                    self.ranged[key] += "HTTP_RANGE" in environ
            return [body]

        return counted


if __name__ == "__main__":
    server = CountingS3Server()
    server.start()
    print(server.url(), flush=True)
    sys.stdin.read()  # serve until the parent closes our stdin
    server.stop()

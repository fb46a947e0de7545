"""An OTLP/HTTP trace receiver for the real tier: real vLLM engines export their own spans to it
(``--otlp-traces-endpoint <url>/<engine>``, protobuf), and a test asks which engines reported a span of a trace.
It keeps each export's raw body by path (the engine's name); a span carries its 16-byte trace id verbatim in the
protobuf, so finding the id's bytes in an engine's exports finds its span of that trace without decoding."""

from __future__ import annotations

import threading
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class OtlpReceiver:
    def __init__(self) -> None:
        self.exports: dict[str, list[bytes]] = defaultdict(list)
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver._lock:
                    receiver.exports[self.path.strip("/")].append(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:  # quiet
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def engines_with(self, trace_id: str) -> set[str]:
        """The engines that exported a span of the trace ``trace_id`` (32 hex digits)."""
        needle = bytes.fromhex(trace_id)
        with self._lock:
            return {name for name, bodies in self.exports.items() if any(needle in b for b in bodies)}

    def close(self) -> None:
        """Idempotent (the tier's end and the session's end both close it)."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._server.server_close()

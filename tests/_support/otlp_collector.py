"""A stand-in OpenTelemetry collector: an OTLP/HTTP (protobuf) receiver on a loopback port, keeping spans.

Worker processes export to it (``OTEL_EXPORTER_OTLP_ENDPOINT``) so a test can
read the spans a real process recorded: trace id, span id, parent, name and
attributes, as the exporter sent them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as received: ids in lowercase hex (``parent`` empty for a root)."""

    trace_id: str
    span_id: str
    parent: str
    name: str
    service: str
    attributes: dict[str, str | int | float | bool]


class Collector:
    """The spans received so far (thread safe); :attr:`endpoint` is the base URL to export to."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self._spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def add(self, body: bytes) -> None:
        req = ExportTraceServiceRequest.FromString(body)
        got: list[ReceivedSpan] = []
        for rs in req.resource_spans:
            service = next(
                (a.value.string_value for a in rs.resource.attributes if a.key == "service.name"), ""
            )
            for ss in rs.scope_spans:
                for s in ss.spans:
                    attrs: dict[str, str | int | float | bool] = {}
                    for a in s.attributes:
                        kind = a.value.WhichOneof("value")
                        attrs[a.key] = getattr(a.value, kind) if kind else ""
                    got.append(
                        ReceivedSpan(
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent=s.parent_span_id.hex(),
                            name=s.name,
                            service=service,
                            attributes=attrs,
                        )
                    )
        with self._lock:
            self._spans.extend(got)


@contextmanager
def otlp_collector() -> Iterator[Collector]:
    """Run a collector on a free loopback port until the block ends."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    collector = Collector(f"http://127.0.0.1:{server.server_address[1]}")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.path != "/v1/traces":
                self.send_response(404)
                self.end_headers()
                return
            collector.add(body)
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: object) -> None:
            return None

    server.RequestHandlerClass = Handler
    thread = threading.Thread(target=server.serve_forever, name="otlp-collector", daemon=True)
    thread.start()
    try:
        yield collector
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def serve_in_this_process() -> None:
    """``python -m tests._support.otlp_collector``: serve until SIGTERM; print the endpoint first, and the
    span count and names last (a benchmark's collector, kept out of the measured process)."""
    import signal
    import sys

    with otlp_collector() as collector:
        print(collector.endpoint, flush=True)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        stop.wait()
        spans = collector.spans()
        names = ", ".join(sorted({s.name for s in spans}))
        sys.stdout.write(f"{len(spans)} spans ({names})\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve_in_this_process()

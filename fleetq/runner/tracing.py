"""OpenTelemetry spans for a job's life on this runner, when a tracer is configured.

One span per execution, `fleetq.job PROJECT/OPERATION`, a child of the trace context the
job was submitted with (its `traceparent`), from the claim to the recorded outcome, with
a child span for staging and one for the run, and an event when the start is reported.
The job process (TRACEPARENT) and a handler (`ctx.traceparent`) get the run span's
context, so their own spans nest under the runner's.

Off unless a tracer provider is set: by `opentelemetry-instrument fleetq-runner …`, or
here at start when the OpenTelemetry SDK is installed (`pip install 'fleetq[otel]'`)
and OTEL_TRACES_EXPORTER names exporters (`console`, `otlp`), as the OpenTelemetry
environment variables specify. Off, nothing here costs a job more than a check of a
flag.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from fleetq.core.models import Claim, Outcome, RunnerId

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

log = logging.getLogger(__name__)

_tracer: Tracer | None = None


def configure() -> bool:
    """Turn spans on if a tracer provider is set, or can be set from the environment;
    True when spans are on. Called once at the runner's start."""
    global _tracer
    try:
        from opentelemetry import trace
    except ImportError:
        return False
    if not _provider_set(trace.get_tracer_provider()) and not _from_environment():
        return False
    from fleetq import __version__

    _tracer = trace.get_tracer("fleetq.runner", __version__)
    return True


def _provider_set(provider: Any) -> bool:
    from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider

    return not isinstance(provider, ProxyTracerProvider | NoOpTracerProvider)


def _from_environment() -> bool:
    """Set the SDK's provider with the exporters OTEL_TRACES_EXPORTER names."""
    names = [n.strip() for n in os.environ.get("OTEL_TRACES_EXPORTER", "").split(",")]
    names = [n for n in names if n and n != "none"]
    if not names:
        return False
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SimpleSpanProcessor,
        )
    except ImportError:
        log.warning(
            "OTEL_TRACES_EXPORTER is set but the OpenTelemetry SDK is not installed "
            "(pip install 'fleetq[otel]'): no spans"
        )
        return False
    provider = TracerProvider(
        resource=Resource.create(
            {"service.name": os.environ.get("OTEL_SERVICE_NAME", "fleetq-runner")}
        )
    )
    for name in names:
        if name == "console":
            provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
        elif name == "otlp":
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                    OTLPSpanExporter,
                )
            except ImportError:
                log.warning(
                    "OTEL_TRACES_EXPORTER=otlp needs opentelemetry-exporter-otlp-proto-http"
                )
                continue
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        else:
            log.warning("OTEL_TRACES_EXPORTER: unknown exporter %r (console, otlp)", name)
    trace.set_tracer_provider(provider)
    return True


def shutdown() -> None:
    """Flush what is buffered (the runner is stopping)."""
    if _tracer is None:
        return
    from opentelemetry import trace

    flush = getattr(trace.get_tracer_provider(), "shutdown", None)
    if flush is not None:
        with contextlib.suppress(Exception):
            flush()


class JobTrace:
    """The spans of one execution; every method is a no-op when spans are off."""

    def __init__(self, claim: Claim, runner: RunnerId) -> None:
        self.claim = claim
        self.runner = runner
        self._job: Span | None = None
        self._stack: contextlib.ExitStack | None = None  # only while spans are on

    def __enter__(self) -> JobTrace:
        if _tracer is None:
            return self
        from opentelemetry.trace import SpanKind
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        c = self.claim
        self._stack = contextlib.ExitStack()
        parent = (
            TraceContextTextMapPropagator().extract({"traceparent": c.traceparent})
            if c.traceparent
            else None
        )
        self._job = self._stack.enter_context(
            _tracer.start_as_current_span(
                f"fleetq.job {c.project}/{c.operation}",
                context=parent,
                kind=SpanKind.CONSUMER,
                attributes={
                    "fleetq.job_id": int(c.job_id),
                    "fleetq.lease_version": int(c.lease_version),
                    "fleetq.runner": str(self.runner),
                    "fleetq.project": c.project,
                    "fleetq.operation": c.operation,
                    "fleetq.commit": c.commit_sha,
                },
                record_exception=True,
                set_status_on_exception=True,
            )
        )
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stack is not None:
            self._stack.__exit__(*exc)  # type: ignore[arg-type]

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        """A child span (`fleetq.stage`, `fleetq.run`)."""
        if _tracer is None or self._job is None:
            yield
            return
        with _tracer.start_as_current_span(f"fleetq.{name}"):
            yield

    def header(self) -> str | None:
        """The traceparent to hand the job: the current span's, else the submitted one."""
        if self._job is None:
            return self.claim.traceparent
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier)
        return carrier.get("traceparent", self.claim.traceparent)

    def event(self, name: str, **attributes: str | int) -> None:
        if self._job is not None:
            self._job.add_event(name, attributes)

    def ended(self, outcome: Outcome | None, exit_code: int | None, reason: str | None) -> None:
        """The outcome recorded (or none: stopped, handed back), and the span's status."""
        if self._job is None:
            return
        from opentelemetry.trace import Status, StatusCode

        self._job.set_attribute("fleetq.outcome", str(outcome) if outcome else "none")
        if exit_code is not None:
            self._job.set_attribute("process.exit.code", exit_code)
        if outcome == Outcome.SUCCEEDED:
            self._job.set_status(Status(StatusCode.OK))
        else:
            self._job.set_status(Status(StatusCode.ERROR, reason or str(outcome or "no outcome")))

"""When tracing is on: without the OpenTelemetry API, with a global provider, with none.

Each case runs in a child interpreter, because the process-wide tracer provider can be
set only once and the API's absence can only be faked before anything imports it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from importlib.util import find_spec

import pytest


def _run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_without_the_api_every_hook_is_a_no_op() -> None:
    out = _run(
        """
        import sys
        sys.modules["opentelemetry"] = None  # as if the extra were not installed
        from fairlane import tracing
        from fairlane.store.wire import NewJob
        job = NewJob("j", "t", 0, "task", "[]", 1, "", 0.0, "", "")
        with tracing.sending("lane", [job]) as span:
            tracing.admitted(span, None)
        print(tracing.AVAILABLE, tracing.active_tracer(), span, repr(job.trace_context))
        """
    )
    assert out == "False None None ''"


@pytest.mark.skipif(find_spec("opentelemetry.sdk") is None, reason="needs opentelemetry-sdk")
def test_a_global_provider_turns_tracing_on() -> None:
    out = _run(
        """
        import time
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from fairlane import tracing
        from fairlane.store.wire import NewJob
        before = tracing.active_tracer()
        trace.set_tracer_provider(TracerProvider())
        soon = tracing.active_tracer()  # "off" is believed for a while
        time.sleep(tracing.RECHECK_SECONDS)
        job = NewJob("j", "t", 0, "task", "[]", 1, "", 0.0, "", "")
        with tracing.sending("lane", [job]):
            pass
        print(before, soon, tracing.active_tracer() is not None, job.trace_context[:3])
        """
    )
    assert out == "None None True 00-"

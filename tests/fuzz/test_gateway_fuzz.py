"""Fuzzing the HTTP gateway's request parsing with malformed requests (hypothesis).

The schemathesis suite (``tests/gateway/test_openapi.py``) sends requests the spec
describes; this one sends what a broken or hostile client would: bodies of arbitrary
bytes or JSON of any shape, wrong or missing content types, Authorization headers of
any text, ids and names of any characters in the path, query values of any text.
Every request goes through the real gateway in process (httpx's ASGI transport) to a
real server. The answer is never a server error, and an API refusal (4xx under
``/v1`` or ``/ui/api``) always carries a JSON object body.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fairlane.gateway import ApiKeys, create_app
from tests.gateway.helpers import ADMIN_KEY, build_app

FUZZ = settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# header values: any printable latin-1 text (httpx refuses CR and LF, as it should)
header_text = st.text(st.characters(min_codepoint=32, max_codepoint=255), max_size=60)
path_text = st.text(max_size=40).map(lambda s: quote(s, safe=""))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=10,
)
TASKS = ("add", "echo", "boom", "approval", "nope", "")
submit_bodies = st.fixed_dictionaries(
    {},
    optional={
        "task": st.sampled_from(TASKS) | json_values,
        "args": st.lists(json_values, max_size=3) | json_values,
        "kwargs": st.dictionaries(st.sampled_from(["a", "b", "text", "times", "x"]), json_values)
        | json_values,
        "service_class": st.sampled_from(["standard", "batch", "nope"]) | json_values,
        "estimate": json_values,
        "idempotency_key": st.text(max_size=5) | json_values,
        "deadline_seconds": json_values,
        "priority": json_values,
        "tenant": json_values,  # never taken from the body: an unknown field
    },
)
valid_submits = st.builds(
    lambda a, b, extra: {"task": "add", "args": [a, b], **extra},
    st.integers(-1000, 1000),
    st.integers(-1000, 1000),
    st.fixed_dictionaries(
        {},
        optional={
            "priority": st.integers(-1000, 1000),
            "deadline_seconds": st.floats(1, 3600),
            "idempotency_key": st.text(min_size=1, max_size=8),
        },
    ),
)
bodies = (
    st.binary(max_size=200)
    | valid_submits.map(lambda v: json.dumps(v).encode())
    | json_values.map(lambda v: json.dumps(v).encode())
    | submit_bodies.map(lambda v: json.dumps(v).encode())
)


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    auth: str  # "tenant", "admin", "none" or "junk"
    junk_auth: str
    content_type: str | None
    traceparent: str | None
    body: bytes


def _calls() -> st.SearchStrategy[Call]:
    endpoints = st.one_of(
        st.just(("POST", "/v1/jobs")),
        st.just(("POST", "/v1/jobs")),
        path_text.map(lambda i: ("GET", f"/v1/jobs/{i}")),
        path_text.map(lambda i: ("DELETE", f"/v1/jobs/{i}")),
        st.tuples(path_text, path_text).map(
            lambda p: ("GET", f"/v1/jobs/{p[0]}/result?wait={p[1]}")
        ),
        st.tuples(path_text, path_text).map(lambda p: ("POST", f"/v1/runs/{p[0]}/signals/{p[1]}")),
        st.tuples(st.sampled_from(["jobs", "dead", "runs", "overview"]), path_text).map(
            lambda p: (
                "GET",
                f"/ui/api/{p[0]}?state={p[1]}&tenant={p[1]}&limit={p[1]}&cursor={p[1]}",
            )
        ),
        st.tuples(path_text, path_text).map(lambda p: ("POST", f"/ui/api/jobs/{p[0]}/{p[1]}")),
        st.tuples(st.sampled_from(["GET", "POST", "DELETE", "PUT"]), path_text).map(
            lambda p: (p[0], f"/v1/{p[1]}")
        ),
    )
    return st.builds(
        lambda endpoint, **rest: Call(method=endpoint[0], path=endpoint[1], **rest),
        endpoint=endpoints,
        auth=st.sampled_from(["tenant", "tenant", "admin", "none", "junk"]),
        junk_auth=header_text | header_text.map(lambda t: f"Bearer {t}"),
        # mostly JSON, so that many bodies reach the parsers behind the content type
        content_type=st.sampled_from(
            ["application/json"] * 4 + ["text/plain", "application/json; charset=latin-1"]
        )
        | st.none()
        | header_text,
        traceparent=st.none() | header_text,
        body=bodies,
    )


def test_malformed_requests_get_4xx_json_never_5xx(redis_url: str, namespace: str) -> None:
    seen: dict[int, int] = {}
    with asyncio.Runner() as runner:
        app = build_app(namespace, redis_url)
        runner.run(app.connect())
        api = create_app(app, admin_key=ADMIN_KEY)
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://gw")
        key = runner.run(ApiKeys(app.store.key_records).create("acme")).key
        auths = {"tenant": f"Bearer {key}", "admin": f"Bearer {ADMIN_KEY}"}

        async def send(call: Call) -> httpx.Response:
            text: dict[str, str] = {}
            if call.auth in auths:
                text["Authorization"] = auths[call.auth]
            elif call.auth == "junk":
                text["Authorization"] = call.junk_auth
            if call.content_type is not None:
                text["Content-Type"] = call.content_type
            if call.traceparent is not None:
                text["traceparent"] = call.traceparent
            # as bytes: a client may send any latin-1 octet, not only ASCII
            headers = {name.encode(): value.encode("latin-1") for name, value in text.items()}
            content = call.body if call.method in ("POST", "PUT") else None
            async with asyncio.timeout(10):
                return await client.request(
                    call.method, call.path, headers=headers, content=content
                )

        @FUZZ
        @given(_calls())
        def check(call: Call) -> None:
            response = runner.run(send(call))
            seen[response.status_code] = seen.get(response.status_code, 0) + 1
            assert response.status_code < 500, (call, response.status_code, response.text)
            api_route = call.path.startswith(("/v1/", "/ui/api/"))
            if 400 <= response.status_code < 500 and api_route:
                body: Any = response.json()  # raises if the body is not JSON
                assert isinstance(body, dict) and body, (call, response.text)

        # the key works: a well-formed call from the fuzzed ones' pool is accepted
        sane = Call("POST", "/v1/jobs", "tenant", "", "application/json", None, b'{"task": "add"}')
        assert runner.run(send(sane)).status_code == 422  # add needs its arguments
        sane = Call(
            "POST",
            "/v1/jobs",
            "tenant",
            "",
            "application/json",
            None,
            b'{"task":"add","args":[1,2]}',
        )
        assert runner.run(send(sane)).status_code == 202
        try:
            check()
        finally:
            runner.run(client.aclose())
            runner.run(app.aclose())
    print(f"\nanswers by status: {dict(sorted(seen.items()))}")
    # the fuzzing reached past the parsers, to the key check, the lookups and the task
    assert {401, 404, 422} <= set(seen)

"""How the object store's retries are counted and said (hsextract.objectstore.retries): the same
line whatever order the retries came in, with the bound, and the causes botocore's errors map to."""

from __future__ import annotations

import botocore.exceptions as errors
import urllib3.exceptions
from hsextract.objectstore.retries import RetryLog, backoff, cause_of, describe, is_transient, is_unreachable


def _client_error(status: int, code: str) -> errors.ClientError:
    return errors.ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")


def test_the_retries_are_said_most_first_whatever_order_they_came_in():
    a, b = RetryLog(attempts=7), RetryLog(attempts=7)
    failures = [
        ("GET set/manifest.json", urllib3.exceptions.ProtocolError("Connection broken")),
        ("PUT set/hidden_states/hs_0.safetensors", _client_error(503, "SlowDown")),
        ("HEAD set/hidden_states/hs_0.safetensors", _client_error(500, "500")),
        ("PUT set/hidden_states/hs_1.safetensors", _client_error(503, "SlowDown")),
    ]
    for what, exc in failures:
        a.note(what, exc)
    for what, exc in reversed(failures):
        b.note(what, exc)
    said = describe(a.as_dict())
    assert said == describe(b.as_dict())
    assert said == (
        "4 retries (PUT 2, GET 1, HEAD 1; 503 SlowDown 2, HTTP 500 1, answer cut short 1), at most 7 attempts a request"
    )


def test_no_retry_is_said_with_the_bound_and_the_wait_for_an_unreachable_server():
    assert describe(RetryLog().as_dict()) == (
        "no request retried (at most 10 attempts a request; an unreachable server is waited for)"
    )


def test_a_refused_connection_is_unreachable_and_a_5xx_or_a_reset_is_a_failed_request():
    refused = errors.EndpointConnectionError(endpoint_url="http://127.0.0.1:1")
    reset = errors.ConnectionClosedError(endpoint_url="http://127.0.0.1:1")
    assert is_transient(refused) and is_unreachable(refused) and cause_of(refused) == "unreachable"
    assert is_transient(reset) and not is_unreachable(reset) and cause_of(reset) == "connection closed"
    assert is_transient(_client_error(500, "InternalError")) and not is_unreachable(_client_error(500, "InternalError"))
    assert not is_transient(_client_error(403, "AccessDenied"))
    assert not is_transient(_client_error(412, "PreconditionFailed"))


def test_the_backoff_doubles_from_half_a_second_to_twenty():
    assert [backoff(n) for n in range(1, 10)] == [0.5, 1, 2, 4, 8, 16, 20, 20, 20]


def test_a_shorter_first_wait_doubles_to_the_same_cap():
    assert [backoff(n, first_s=0.05) for n in (1, 2, 3, 10, 20)] == [0.05, 0.1, 0.2, 20, 20]

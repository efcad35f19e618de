"""The official ``openai`` SDK's clients, as the tests make them: with no pooled keep-alive
connection. A test seldom closes its client, and a pooled socket to a server the test has
already stopped is then left for the garbage collector, whose ResourceWarning pytest turns
into an error (pyproject ``filterwarnings``) in whichever later test the collection happens
to run: a clean-clone ``make test-stress`` failed a hypothesis test in tests/sip on a socket
another test's client had left to an in-process signaling server. Without keep-alive each
response closes its connection; the SDK's behaviour is otherwise the default."""

from __future__ import annotations

from typing import Any

import httpx
import openai

_NO_POOL = httpx.Limits(max_keepalive_connections=0)


def sdk(base_url: str | None = None, *, api_key: str = "unused-on-loopback",
        **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(api_key=api_key, base_url=base_url,
                         http_client=httpx.Client(limits=_NO_POOL), **kw)


def async_sdk(base_url: str | None = None, *, api_key: str = "unused-on-loopback",
              **kw: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(api_key=api_key, base_url=base_url,
                              http_client=httpx.AsyncClient(limits=_NO_POOL), **kw)

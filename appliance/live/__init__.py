"""GPT-Live, OpenAI's successor to the Realtime API, served by the appliance (issue 42):
the protocol layer only. The audio, the turns and the agent are the Realtime surface's:

    protocol.py    client events: the untrusted parser (strict: an unknown field is an
                   ``error`` naming its ``param``) and the catalogue of what is served
    schema.py      the small declarative validator the parser and the config use
    config.py      the session config: validation, defaults, the resolved resource, and
                   the Realtime session it becomes
    events.py      every server event the appliance sends, one constructor each
    connection.py  :class:`LiveConnection`, the sans-IO core: Live events in, Live events
                   out, translated onto an inner Realtime machine (its turns, its agent)
    agent.py       the configured Realtime agent (``--live-agent``) with what Live asks of
                   it beyond Realtime (speaking ``session.commentary.append``)
    socket.py      the trio shell: the Realtime WebSocket shell driving the core, with
                   the session's lifetime

The route is appliance/signaling/live_ws.py (``GET /v1/live/sessions``); docs/live.md says
what is served, what is not and why.
"""

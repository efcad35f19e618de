"""The OpenAI-Realtime-compatible surface (issue 17), see docs/realtime.md: HTTP routes
(:mod:`.http`), the event state machine on the ``oai-events`` data channel (:mod:`.machine`,
run by :mod:`.agent`), and the bridge to an upstream Realtime WebSocket server
(:mod:`.bridge`, docs/realtime-bridge.md)."""

"""The OpenAI-Realtime-compatible surface (issue 17): HTTP routes, the event state machine on
the ``oai-events`` data channel, and the bridge to an upstream Realtime WebSocket server
(:mod:`appliance.realtime.bridge`)."""

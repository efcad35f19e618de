"""The OpenAI-Realtime-compatible surface: HTTP routes (http.py), the event state machine
and realtime agents (issue 17)."""

"""OpenAI Realtime API compatibility (issue 17): see docs/realtime.md."""

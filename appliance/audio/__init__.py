"""Audio conversions shared by every part that touches samples, one implementation each
(issue 39, item 5): G.711 µ-law and A-law (:mod:`.g711`) and sample-rate conversion
(:mod:`.resample`). numpy only; no I/O and no clock.

Users: the transceiver's media pipeline (G.711 legs), the speech engines (16 kHz models,
TTS output), the WebSocket agent bridge (agents/ws.py), the Realtime bridge and the
Realtime machine's ``audio/pcm`` (24 kHz) and ``audio/pcmu`` / ``audio/pcma`` formats.
"""

"""Our own WebRTC voice client, built on ``appliance.proto``.

Used by the load generator, the setup-time benchmark and end-to-end tests: it plays the
part of a browser (offerer, full ICE controlling agent, DTLS client, SRTP) without a
browser's cost, so hundreds of calls fit on one core.

* :mod:`.peer` — ``ClientPeer``, sans-IO (same verbs as every state machine here).
* :mod:`.call` — the trio shell: POST the offer, run the peer on a UDP socket.
"""

"""The SCTP branch of the error tree (see :mod:`appliance.proto.errors`).

::

    RemoteProtocolError
    └── SctpError                    a packet/chunk/parameter that does not parse
                                     (hint: drop reason for counters, e.g. "truncated")
    LocalProtocolError
    └── SctpUsageError               the caller misused the association
        ├── MessageTooLargeError     send() over max_message_size (RFC 8831 §6.6)
        ├── SendBufferFullError      queued outbound bytes would exceed the cap
        └── StreamClosedError        send() on a stream that is being reset / closed

Every ``*_untrusted`` parser in this package raises only :class:`SctpError`.
:meth:`SctpAssociation.handle_input` never raises for peer bytes: it converts an
``SctpError`` into a counted drop at the receive boundary.
"""

from __future__ import annotations

from appliance.proto.errors import LocalProtocolError, RemoteProtocolError


class SctpError(RemoteProtocolError):
    """The peer sent SCTP bytes that break RFC 9260 (or an extension); drop and count."""

    def __init__(self, msg: str, *, hint: object = "malformed") -> None:
        super().__init__(msg, hint=hint)


class SctpUsageError(LocalProtocolError):
    """The caller asked the association for something it cannot do in its state."""


class MessageTooLargeError(SctpUsageError):
    """A message larger than the negotiated maximum (262144 bytes by default)."""


class SendBufferFullError(SctpUsageError):
    """Queued outbound bytes would pass ``max_send_buffer``: wait for BufferedAmountLow."""


class StreamClosedError(SctpUsageError):
    """The stream (data channel) is being reset or closed; no more sends on it."""

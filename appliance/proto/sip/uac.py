"""The UAC half of the SIP endpoint (RFC 3261 §8.1, §13.2, §14.1, §22; RFC 3515): calls we
place through a trunk, our re-INVITEs, REFERs and INFOs, and what their responses mean."""

from __future__ import annotations

import secrets
from collections.abc import Iterable

from appliance.proto.sip import auth
from appliance.proto.sip.base import ALLOW, EndpointBase
from appliance.proto.sip.dialog import CallState, Dialog
from appliance.proto.sip.errors import SipError, SipUsageError
from appliance.proto.sip.events import (
    Addr,
    CallAnswered,
    CallFailed,
    CallProgress,
    ReferProgress,
    ReInviteAnswered,
    Transmit,
)
from appliance.proto.sip.message import (
    Request,
    Response,
    parse_name_addr_untrusted,
    parse_uri_untrusted,
)
from appliance.proto.sip.transaction import (
    ClientTransaction,
    response_client_key,
)


class UacMixin(EndpointBase):
    """Calls and requests we send (module docstring)."""

    def invite(self, now: float, target: str, from_uri: str, sdp: bytes, addr: Addr,
               transport: str = "udp", credentials: auth.Credentials | None = None,
               headers: Iterable[tuple[str, str]] = ()) -> str:
        """Place a call to ``target`` through the trunk at ``addr``; returns its call id."""
        uri = parse_uri_untrusted(target)
        parse_uri_untrusted(from_uri)
        call_id = "sip_" + secrets.token_hex(12)
        call = Dialog(call_id, f"{secrets.token_hex(12)}@{self.config.host}", addr, transport,
                     outbound=True)
        call.local_hdr = f"<{from_uri}>;tag={call.local_tag}"
        call.remote_hdr = f"<{target}>"
        call.remote_target = uri
        call.credentials = credentials
        self._calls[call_id] = call
        self._dialed[addr[0]] += 1
        req = self._build_invite(call, sdp, tuple(headers), ())
        call.invite = req
        self._start_client(now, call, req)
        return call_id

    def reinvite(self, now: float, call_id: str, offer_sdp: bytes) -> None:
        """A re-INVITE from our side (§14.1): hold (``a=sendonly``), unhold, codec change.
        The answer comes back as :class:`ReInviteAnswered`."""
        call = self._call(call_id, CallState.CONFIRMED)
        busy = call.reinvite_txn is not None or self._inviting(call_id)
        if busy:
            raise SipUsageError("a re-INVITE is already in progress (§14.1)")
        self._start_client(now, call, self._in_dialog(call, "INVITE", body=offer_sdp))

    def refer(self, now: float, call_id: str, target_uri: str) -> None:
        """REFER (RFC 3515) inside the call; progress comes back as ReferProgress."""
        call = self._call(call_id, CallState.CONFIRMED)
        parse_uri_untrusted(target_uri)  # our caller's input: refuse a broken URI early
        local = parse_name_addr_untrusted(call.local_hdr)
        req = self._in_dialog(call, "REFER", extra=(("Refer-To", f"<{target_uri}>"),
                                                    ("Referred-By", f"<{local.uri}>")))
        self._start_client(now, call, req)

    def info_dtmf(self, now: float, call_id: str, digit: str, duration_ms: int = 250) -> None:
        call = self._call(call_id, CallState.CONFIRMED)
        body = f"Signal={digit}\r\nDuration={duration_ms}\r\n".encode()
        req = self._in_dialog(call, "INFO", body=body, ctype="application/dtmf-relay")
        self._start_client(now, call, req)

    def _build_invite(self, call: Dialog, sdp: bytes, headers: tuple[tuple[str, str], ...],
                      authz: tuple[tuple[str, str], ...]) -> Request:
        _, via = self._via(call.transport)
        hs: list[tuple[str, str]] = [
            ("Via", via), ("Max-Forwards", "70"), ("From", call.local_hdr),
            ("To", call.remote_hdr), ("Call-ID", call.sip_call_id),
            ("CSeq", f"{call.local_seq} INVITE"), ("Contact", self._contact(call.transport)),
            ("Allow", ALLOW), ("User-Agent", self.config.user_agent), *headers, *authz,
        ]
        if sdp:
            hs.append(("Content-Type", "application/sdp"))
        return Request("INVITE", call.remote_target, tuple(hs), sdp)

    def _on_response(self, now: float, resp: Response) -> None:
        key = response_client_key(resp)
        txn = self._client.get(key) if key is not None else None
        if txn is None:
            self.counters["stray-response"] += 1
            return
        txn.handle_input(now, resp)
        self._drain(now, txn)

    def _on_client_response(self, now: float, txn: ClientTransaction, up: Response) -> None:
        """A response one of our transactions passed up (:class:`Received`)."""
        call = self._calls.get(txn.owner or "")
        if call is None:
            return
        if txn.purpose == "INVITE" and txn.request.to.tag is not None:
            self._reinvite_response(call, txn, up)
        elif txn.purpose == "INVITE":
            self._invite_response(now, call, txn, up)
        elif txn.purpose == "REFER":
            if up.status >= 200:
                self._out.append(ReferProgress(call.call_id, up.status, up.reason,
                                               final=up.status >= 300))
            if up.status in (408, 481):
                self._end(call, f"{up.status} to REFER", "remote")
        elif txn.purpose in ("INFO",) and up.status in (408, 481):
            self._end(call, f"{up.status} to {txn.purpose}", "remote")

    def _reinvite_response(self, call: Dialog, txn: ClientTransaction, resp: Response) -> None:
        if resp.status < 200:
            return
        if resp.status < 300:
            # §13.2.2.4: the ACK of a 2xx (sent again for each retransmitted 2xx)
            ack = self._in_dialog(call, "ACK", seq=txn.request.cseq.seq)
            first = txn.last_ack is None
            txn.last_ack = bytes(ack)
            self._out.append(Transmit(txn.last_ack, call.addr, call.transport))
            contacts = resp.contacts
            if contacts:
                call.remote_target = contacts[0].uri  # §12.2.1.2 target refresh
            if not first:
                return
        elif resp.status in (408, 481):
            self._end(call, f"{resp.status} to re-INVITE", "remote")
        self._out.append(ReInviteAnswered(call.call_id, resp.status, resp.body))

    def _invite_response(self, now: float, call: Dialog, txn: ClientTransaction,
                         resp: Response) -> None:
        status = resp.status
        if status < 200:
            if call.state is CallState.OUTGOING:
                call.move(CallState.OUT_EARLY)
            elif call.state is CallState.ENDED and call.cancel_pending:
                call.cancel_pending = False
                self._send_cancel(now, call)
                return
            if status > 100 and call.state is CallState.OUT_EARLY:
                self._out.append(CallProgress(call.call_id, status, resp.reason))
            return
        if status < 300:
            if call.ack_wire is not None:
                # a 2xx retransmission: our ACK was lost (§13.2.2.4)
                self._out.append(Transmit(call.ack_wire, call.addr, call.transport))
                return
            call.remote_tag = resp.to.tag
            call.remote_hdr = resp.get("To") or call.remote_hdr
            contacts = resp.contacts
            if contacts:
                call.remote_target = contacts[0].uri
            call.route_set = tuple(reversed(resp.get_all("Record-Route")))  # §12.1.2
            self._dialogs[(call.sip_call_id, call.local_tag)] = call.call_id
            ack = self._in_dialog(call, "ACK", seq=txn.request.cseq.seq)
            call.ack_wire = bytes(ack)
            self._out.append(Transmit(call.ack_wire, call.addr, call.transport))
            if call.state is CallState.ENDED:
                # we hung up while the 2xx was on its way (§15.1.1 race): ACK, then BYE
                self._send_bye(now, call)
                self._forget(call)
                return
            call.move(CallState.CONFIRMED)
            self._out.append(CallAnswered(call.call_id, resp.body))
            return
        if status in (401, 407) and call.credentials is not None and not call.auth_tried \
                and call.state is not CallState.ENDED:
            if self._answer_challenge(now, call, resp):
                return
        if call.state is not CallState.ENDED:
            call.move(CallState.ENDED)
            self._out.append(CallFailed(call.call_id, status, resp.reason))
        self._forget(call)

    def _answer_challenge(self, now: float, call: Dialog, resp: Response) -> bool:
        """RFC 3261 §22.2: re-send the INVITE once with Authorization; same Call-ID and
        From tag, CSeq + 1, a new branch."""
        name = "WWW-Authenticate" if resp.status == 401 else "Proxy-Authenticate"
        creds, inv = call.credentials, call.invite
        if creds is None or inv is None:
            return False
        for value in resp.get_all(name):
            try:
                ch = auth.parse_challenge_untrusted(value)
            except SipError:
                continue
            if not auth.usable(ch) or (creds.realm is not None and creds.realm != ch.realm):
                continue
            call.auth_tried = True
            header = "Authorization" if resp.status == 401 else "Proxy-Authorization"
            value_out = auth.authorization(ch, creds, "INVITE", str(inv.uri))
            call.local_seq += 1
            extra = tuple((k, v) for k, v in inv.headers
                          if k not in ("Via", "Max-Forwards", "From", "To", "Call-ID", "CSeq",
                                       "Contact", "Allow", "User-Agent", "Content-Type",
                                       "Content-Length", "Authorization",
                                       "Proxy-Authorization"))
            req = self._build_invite(call, inv.body, extra, ((header, value_out),))
            call.invite = req
            self._start_client(now, call, req)
            return True
        return False

    def _client_timed_out(self, now: float, txn: ClientTransaction) -> None:
        call = self._calls.get(txn.owner or "")
        if call is None:
            return
        if txn.purpose == "INVITE":
            if call.state in (CallState.OUTGOING, CallState.OUT_EARLY):
                call.move(CallState.ENDED)
                self._out.append(CallFailed(call.call_id, 408, "Request Timeout"))
            self._forget(call)
        elif txn.purpose == "REFER":
            self._out.append(ReferProgress(call.call_id, 408, "Request Timeout", True))
        elif txn.purpose == "BYE":
            self._forget(call)

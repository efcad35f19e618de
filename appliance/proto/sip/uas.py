"""The UAS half of the SIP endpoint (RFC 3261 §8.2, §13.3, §9.2, §15): new requests
routed, incoming calls rung, answered or rejected, their ACK and CANCEL, and the requests
inside a dialog (BYE, re-INVITE, INFO, NOTIFY)."""

from __future__ import annotations

import secrets
from dataclasses import replace

from appliance.proto.sip.base import ACCEPT, ALLOW, EndpointBase
from appliance.proto.sip.dialog import CallState, Dialog, dtmf_relay, sipfrag_status
from appliance.proto.sip.errors import SipUsageError
from appliance.proto.sip.events import (
    CallAcked,
    CallCancelled,
    Dtmf,
    IncomingCall,
    ReferProgress,
    ReInvite,
)
from appliance.proto.sip.message import (
    Request,
)
from appliance.proto.sip.transaction import (
    ServerTransaction,
    State,
    server_key,
)

#: methods we know but do not serve: 405 with Allow (§8.2.1); anything else is 501
_KNOWN = frozenset({"REGISTER", "SUBSCRIBE", "PUBLISH", "MESSAGE", "PRACK", "UPDATE"})


class UasMixin(EndpointBase):
    """Calls that come to us (module docstring)."""

    def ringing(self, now: float, call_id: str) -> None:
        call = self._call(call_id, CallState.INCOMING, CallState.EARLY)
        call.move(CallState.EARLY)
        self._respond(now, call.invite_txn, 180, contact=True, call=call)

    def accept(self, now: float, call_id: str, answer_sdp: bytes) -> None:
        """200 OK with our SDP; retransmitted until the ACK (or 64·T1, then BYE)."""
        call = self._call(call_id, CallState.INCOMING, CallState.EARLY)
        call.move(CallState.ANSWERED)
        call.ring_deadline = None
        self._respond(now, call.invite_txn, 200, contact=True, call=call, body=answer_sdp,
                      extra=(("Allow", ALLOW), ("Supported", "replaces")))

    def reject(self, now: float, call_id: str, status: int = 603, reason: str | None = None,
               warning: str | None = None) -> None:
        if not 300 <= status <= 699:
            raise SipUsageError("a rejection needs a 3xx-6xx status")
        call = self._call(call_id, CallState.INCOMING, CallState.EARLY)
        extra = (("Warning", warning),) if warning else ()
        self._respond(now, call.invite_txn, status, reason=reason, call=call, extra=extra)
        self._end(call, f"rejected {status}", "local")

    def answer_reinvite(self, now: float, call_id: str, answer_sdp: bytes) -> None:
        call = self._call(call_id, CallState.CONFIRMED)
        if call.reinvite_txn is None:
            raise SipUsageError("no re-INVITE is waiting for an answer")
        txn, call.reinvite_txn = call.reinvite_txn, None
        self._respond(now, txn, 200, contact=True, call=call, body=answer_sdp)

    def reject_reinvite(self, now: float, call_id: str, status: int = 488,
                        warning: str | None = None) -> None:
        call = self._call(call_id, CallState.CONFIRMED)
        if call.reinvite_txn is None:
            raise SipUsageError("no re-INVITE is waiting for an answer")
        txn, call.reinvite_txn = call.reinvite_txn, None
        self._respond(now, txn, status, call=call,
                      extra=(("Warning", warning),) if warning else ())

    def _dispatch(self, now: float, req: Request, txn: ServerTransaction) -> None:
        m = req.method
        if m != "CANCEL":
            if not (req.uri.is_sip or req.uri.scheme == "tel"):
                self._respond(now, txn, 416)
                return
            required = [r for r in req.get_all("Require") if r]
            if required:  # §8.2.2.3: we support no extension a request can require
                self._respond(now, txn, 420, extra=[("Unsupported", r) for r in required])
                return
        to_tag = req.to.tag
        if m == "CANCEL":
            self._on_cancel(now, req, txn)
        elif to_tag:
            self._in_dialog_request(now, req, txn, to_tag)
        elif m == "INVITE":
            self._on_invite(now, req, txn)
        elif m == "OPTIONS":
            self._respond(now, txn, 200, extra=(("Allow", ALLOW), ("Accept", ACCEPT),
                                                ("Supported", "replaces")))
        elif m in ("BYE", "INFO", "NOTIFY", "REFER"):
            self._respond(now, txn, 481)
        elif m in _KNOWN:
            self._respond(now, txn, 405, extra=(("Allow", ALLOW),))
        else:
            self._respond(now, txn, 501)

    def _on_invite(self, now: float, req: Request, txn: ServerTransaction) -> None:
        if any(c.sip_call_id == req.call_id and not c.outbound for c in self._calls.values()):
            self._respond(now, txn, 482)  # §8.2.2.2 merged request (a forked copy)
            return
        if self._active_invites() > self.config.max_invites:
            self.counters["invite-cap"] += 1
            self._respond(now, txn, 503, extra=(("Retry-After", "5"),))
            return
        if req.body and req.content_type != "application/sdp":
            self._respond(now, txn, 415, extra=(("Accept", "application/sdp"),))
            return
        # §17.2.1: 100 Trying at once (our TU answers later than 200 ms, the webhook)
        self._respond(now, txn, 100)
        call = Dialog("sip_" + secrets.token_hex(12), req.call_id, txn.addr, txn.transport,
                     outbound=False)
        contacts = req.contacts
        call.remote_tag = req.from_.tag
        call.remote_hdr = req.get("From") or ""
        call.local_hdr = f"{req.get('To')};tag={call.local_tag}"
        call.remote_target = contacts[0].uri if contacts else req.from_.uri
        call.route_set = tuple(req.get_all("Record-Route"))  # §12.1.1: UAS keeps the order
        call.remote_seq = req.cseq.seq
        call.invite = req
        call.invite_txn = txn
        call.ring_deadline = now + self.config.ring_timeout
        txn.owner = call.call_id
        self._calls[call.call_id] = call
        self._dialogs[(req.call_id, call.local_tag)] = call.call_id
        self._out.append(IncomingCall(call.call_id, req, req.body, req.headers, txn.addr,
                                      txn.transport))

    def _on_cancel(self, now: float, req: Request, txn: ServerTransaction) -> None:
        inv = self._server.get(server_key(replace(req, method="INVITE")))
        if inv is None or not inv.invite:
            self._respond(now, txn, 481)
            return
        call = self._calls.get(inv.owner or "")
        # §9.2: the 200 to CANCEL carries the To tag the INVITE's responses carry
        self._respond(now, txn, 200, call=call)
        if inv.state is State.PROCEEDING and call is not None:
            # §9.2: the INVITE gets 487; the call is over
            self._respond(now, inv, 487, call=call)
            call.move(CallState.ENDED)
            call.ring_deadline = None
            self._out.append(CallCancelled(call.call_id))
            self._forget(call)

    def _on_ack(self, now: float, req: Request) -> None:
        tag = req.to.tag
        cid = self._dialogs.get((req.call_id, tag or ""))
        call = self._calls.get(cid or "")
        if call is None:
            self.counters["stray-ack"] += 1
            return
        for txn in (call.invite_txn,):
            if txn is not None and txn.state is State.ACCEPTED and txn.request.cseq.seq == req.cseq.seq:
                txn.ack_2xx()
        # re-INVITE 2xx ACKs: find the Accepted server transaction of that CSeq
        for st in self._server.values():
            if (st.owner == call.call_id and st.invite and st.state is State.ACCEPTED
                    and st.request.cseq.seq == req.cseq.seq):
                st.ack_2xx()
        if call.state is CallState.ANSWERED:
            call.move(CallState.CONFIRMED)
            self._out.append(CallAcked(call.call_id, req.body))
        elif call.state is CallState.ENDED and call.bye_after_ack:
            call.bye_after_ack = False
            self._send_bye(now, call)
            self._forget(call)

    def _in_dialog_request(self, now: float, req: Request, txn: ServerTransaction,
                           to_tag: str) -> None:
        cid = self._dialogs.get((req.call_id, to_tag))
        call = self._calls.get(cid or "")
        if call is not None and call.state is CallState.ENDED and req.method == "BYE" \
                and call.remote_tag == req.from_.tag:
            # we hung up while our 200 waited for its ACK and the caller hung up too
            self._respond(now, txn, 200, call=call)
            call.bye_after_ack = False
            self._forget(call)
            return
        if call is None or call.remote_tag != req.from_.tag or call.state is CallState.ENDED:
            self._respond(now, txn, 481)
            return
        seq = req.cseq.seq
        if call.remote_seq is not None and seq <= call.remote_seq:
            self._respond(now, txn, 500, "CSeq Out Of Order")  # §12.2.2
            return
        call.remote_seq = seq
        txn.owner = call.call_id
        m = req.method
        if m == "BYE":
            self._respond(now, txn, 200, call=call)
            self._end(call, "bye", "remote")
        elif m == "INVITE":
            self._on_reinvite(now, req, txn, call)
        elif m == "INFO":
            self._on_info(now, req, txn, call)
        elif m == "NOTIFY":
            self._on_notify(now, req, txn, call)
        elif m == "OPTIONS":
            self._respond(now, txn, 200, call=call, extra=(("Allow", ALLOW), ("Accept", ACCEPT)))
        elif m == "REFER":
            self._respond(now, txn, 403, "Transfers From The Far End Are Not Accepted", call=call)
        elif m in _KNOWN:
            self._respond(now, txn, 405, call=call, extra=(("Allow", ALLOW),))
        else:
            self._respond(now, txn, 501, call=call)

    def _on_reinvite(self, now: float, req: Request, txn: ServerTransaction, call: Dialog) -> None:
        if call.state is not CallState.CONFIRMED:
            # §14.2: a re-INVITE before our 2xx was ACKed -> 500 with Retry-After
            self._respond(now, txn, 500, call=call, extra=(("Retry-After", "1"),))
            return
        pending = call.reinvite_txn is not None or self._inviting(call.call_id)
        if pending:
            self._respond(now, txn, 491, call=call)  # §14.2 glare
            return
        if req.body and req.content_type != "application/sdp":
            self._respond(now, txn, 415, call=call, extra=(("Accept", "application/sdp"),))
            return
        self._respond(now, txn, 100)
        contacts = req.contacts
        if contacts:
            call.remote_target = contacts[0].uri  # §12.2.2 target refresh
        call.reinvite_txn = txn
        self._out.append(ReInvite(call.call_id, req.body))

    def _on_info(self, now: float, req: Request, txn: ServerTransaction, call: Dialog) -> None:
        ctype = req.content_type
        if ctype == "application/dtmf-relay":
            got = dtmf_relay(req.body)
            if got is None:
                self._respond(now, txn, 400, "Bad dtmf-relay Body", call=call)
                return
            self._respond(now, txn, 200, call=call)
            self._out.append(Dtmf(call.call_id, got[0], got[1]))
        elif ctype == "application/dtmf":
            digit = req.body.strip().decode("ascii", "replace").upper()
            if len(digit) != 1 or digit not in "0123456789*#ABCD":
                self._respond(now, txn, 400, "Bad dtmf Body", call=call)
                return
            self._respond(now, txn, 200, call=call)
            self._out.append(Dtmf(call.call_id, digit, 250))
        elif not req.body:
            self._respond(now, txn, 200, call=call)  # an INFO keep-alive
        else:
            self._respond(now, txn, 415, call=call, extra=(("Accept", ACCEPT),))

    def _on_notify(self, now: float, req: Request, txn: ServerTransaction, call: Dialog) -> None:
        event = (req.get("Event") or "").split(";")[0].strip().lower()
        if event != "refer":
            self._respond(now, txn, 489, "Bad Event", call=call)
            return
        self._respond(now, txn, 200, call=call)
        state = (req.get("Subscription-State") or "").split(";")[0].strip().lower()
        got = sipfrag_status(req.body) if req.content_type == "message/sipfrag" else None
        if got is not None:
            self._out.append(ReferProgress(call.call_id, got[0], got[1],
                                           final=state == "terminated" or got[0] >= 200))
        elif state == "terminated":
            self._out.append(ReferProgress(call.call_id, 0, "subscription terminated", True))

    def _server_failed(self, now: float, txn: ServerTransaction) -> None:
        call = self._calls.get(txn.owner or "")
        if call is None:
            return
        if txn is call.invite_txn and call.state in (CallState.ANSWERED, CallState.ENDED):
            # §13.3.1.4: no ACK for our 2xx within 64·T1: confirm, then BYE
            if call.state is CallState.ANSWERED or call.bye_after_ack:
                call.bye_after_ack = False
                self._send_bye(now, call)
            self._end(call, "no ACK", "local")

"""Every example in examples/ through `appliance up` (a real subprocess: relay, transceiver,
signaling), driven by the load generator's talk-then-listen pattern (``pattern="turns"``), as
a caller who speaks and then waits for the answer (issue 22, item 7).

`up` runs with ``--agent examples/parrot.py:Parrot`` (the default agent, the way the README
starts one); the other examples are asked for per session (``?agent=``). What each example
does shows in *when* loud audio comes back, relative to the caller's talking:

* echo / ws_agent: while the caller talks (and a round trip after it stops);
* tone: while the caller talks, and it stops within the VAD hangover once the caller does;
* parrot: never while the caller talks; ~800 ms after it stops (200 ms VAD hangover + 600 ms
  of silence), the whole utterance back.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e.procs import Proc, free_tcp_port, free_udp_port

from appliance.loadgen import LoadConfig, Report, run_load
from appliance.loadgen.stats import TurnResult

pytestmark = [pytest.mark.slow]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TALK, LISTEN, TURNS = 0.6, 1.8, 2
TALK_FRAMES = round(TALK / 0.02)


def agent(spec: str) -> str:
    return str(EXAMPLES / spec)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    state = tmp_path_factory.mktemp("up") / "state"
    http, udp = free_tcp_port(), free_udp_port()
    proc = Proc(["up", "--http", f"127.0.0.1:{http}", "--udp", f"127.0.0.1:{udp}",
                 "--public-address", "127.0.0.1", "--state-dir", str(state),
                 "--transceivers", "1", "--agent", agent("parrot.py:Parrot")],
                "appliance ready", timeout=60)
    try:
        yield f"http://127.0.0.1:{http}"
    finally:
        rc = proc.stop()
    assert rc == 0, "".join(proc.stderr)[-3000:]


async def turns(base: str, agent_spec: str | None) -> tuple[list[TurnResult], Report]:
    cfg = LoadConfig(url=base, sessions=1, duration=TURNS * (TALK + LISTEN), agent=agent_spec,
                     pattern="turns", talk=TALK, listen=LISTEN, drain=0.3)
    report = await run_load(cfg)
    [res] = report.sessions
    assert res.failure is None, res.failure
    assert len(res.turns) == TURNS, res.turns
    return res.turns, report


def session_agents(base: str) -> list[str]:
    with urllib.request.urlopen(base + "/v1/sessions", timeout=5) as resp:
        return [s["agent"] for s in json.load(resp)["sessions"]]


async def test_parrot_answers_after_each_turn(up: str) -> None:
    result, report = await turns(up, None)  # up's default agent
    for t in result:
        assert t.loud_while_talking == 0, t  # it waits for its turn
        assert t.reply_after is not None and 0.7 <= t.reply_after <= 1.4, t
        # The whole 0.6 s utterance comes back (30 frames, preroll included, less a little
        # VAD onset at each end).
        assert t.loud_while_listening >= 0.8 * TALK_FRAMES, t
    assert report.summary()["turns_answered"] == TURNS
    assert agent("parrot.py:Parrot") in session_agents(up)


async def test_echo_answers_while_you_talk(up: str) -> None:
    result, _ = await turns(up, agent("echo.py:echo"))
    for t in result:
        # It answers while you talk (the parrot never does), and the whole utterance comes
        # back, counted over both halves of the turn: on a starved box (stress 26: the hog
        # beside it) the echo came late, 14 of 30 frames while talking and 17 after.
        assert t.loud_while_talking > 0, t
        assert t.loud_while_talking + t.loud_while_listening >= 0.9 * TALK_FRAMES, t
        assert t.reply_end is not None and t.reply_end < 0.5, t  # only the echo's tail
    assert agent("echo.py:echo") in session_agents(up)


async def test_tone_stops_when_you_stop(up: str) -> None:
    result, _ = await turns(up, agent("tone.py:tone"))
    for t in result:
        assert t.loud_while_talking >= 0.5 * TALK_FRAMES, t
        # 200 ms of VAD hangover, a round trip and the jitter buffer; then silence.
        assert t.reply_end is not None and t.reply_end < 0.6, t
    assert agent("tone.py:tone") in session_agents(up)


async def test_ws_agent_answers_while_you_talk(
    up: str, ws_agent: tuple[str, subprocess.Popen[str]]
) -> None:
    url, _ = ws_agent
    result, _ = await turns(up, url)
    for t in result:
        assert t.loud_while_talking >= 0.5 * TALK_FRAMES, t
    assert url in session_agents(up)


def test_loadgen_cli_drives_the_parrot(up: str) -> None:
    """The command a user runs: `appliance loadgen --pattern turns`, against up's parrot."""
    r = subprocess.run(
        [sys.executable, "-m", "appliance", "loadgen", "--url", up, "-n", "1", "--pattern",
         "turns", "--talk", str(TALK), "--listen", str(LISTEN), "--duration",
         str(TURNS * (TALK + LISTEN)), "--json", "-"],
        capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out: dict[str, Any] = json.loads(r.stdout)
    summary = out["summary"]
    assert (summary["turns"], summary["turns_answered"], summary["turns_overlapped"]) == (
        TURNS, TURNS, 0), summary
    assert 700 <= summary["reply_after_p50_ms"] <= 1400, summary
    assert "turns (answered / heard while talking)" in r.stderr  # the human table


def test_realtime_example_is_at_most_30_lines() -> None:
    assert len((EXAMPLES / "realtime_backwards.py").read_text().splitlines()) <= 30


async def test_realtime_backwards_answers_after_each_turn(up: str) -> None:
    """examples/realtime_backwards.py behind the Realtime event machine (issue 17): with no
    oai-events channel at all the server-VAD turns still run, and each is answered after
    it ends, never while the caller talks."""
    spec = "realtime:" + agent("realtime_backwards.py:Backwards")
    result, _ = await turns(up, spec)
    for t in result:
        assert t.loud_while_talking == 0, t
        # 500 ms of end-of-turn silence, then the turn reversed: its trailing silence first.
        assert t.reply_after is not None and 0.6 <= t.reply_after <= 1.7, t
        assert t.loud_while_listening >= 0.5 * TALK_FRAMES, t
    assert spec in session_agents(up)

"""``GET /v1/realtime/calls/{call_id}/recording`` (docs/recordings.md): the API token only
(a client secret is refused even for its own call), the file streamed when complete, a
clear 404 while it is written and when there is none, and no path outside the directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from appliance.transceiver.recording import wav_header

API = {"Authorization": "Bearer the-api-token"}


async def error_code(resp: Any, status: int) -> str:
    assert resp.status_code == status, await resp.get_data()
    code: str = json.loads(await resp.get_data())["error"]["code"]
    return code


async def test_recording_route(make_env: Any, tmp_path: Path) -> None:
    rec_dir = tmp_path / "recordings"
    rec_dir.mkdir()
    env = await make_env(http=("0.0.0.0", 8443), api_token="the-api-token",
                         recordings_dir=rec_dir)
    c = env.app.test_client()
    body = wav_header(8) + bytes(range(8))
    (rec_dir / "rtc_done.wav").write_bytes(body)
    (rec_dir / "rtc_live.wav.part").write_bytes(wav_header(0))

    resp = await c.get("/v1/realtime/calls/rtc_done/recording", headers=API)
    assert resp.status_code == 200 and resp.mimetype == "audio/wav"
    assert await resp.get_data() == body
    assert resp.headers["Content-Length"] == str(len(body))
    assert resp.headers["Cache-Control"] == "no-store"

    assert await error_code(await c.get("/v1/realtime/calls/rtc_live/recording", headers=API),
                            404) == "recording_in_progress"
    assert await error_code(await c.get("/v1/realtime/calls/rtc_none/recording", headers=API),
                            404) == "recording_not_found"
    assert await error_code(await c.get("/v1/realtime/calls/.hidden/recording", headers=API),
                            404) == "recording_not_found"
    # Without the API token (a non-loopback bind needs it): refused.
    assert (await c.get("/v1/realtime/calls/rtc_done/recording")).status_code == 401
    # A client secret, however valid, never reads a recording.
    resp = await c.post("/v1/realtime/client_secrets", headers=API, json={})
    ek = json.loads(await resp.get_data())["value"]
    assert await error_code(await c.get("/v1/realtime/calls/rtc_done/recording",
                                        headers={"Authorization": f"Bearer {ek}"}),
                            403) == "insufficient_permissions"
    resp = await c.delete("/v1/realtime/calls/rtc_done/recording", headers=API)
    assert resp.status_code == 405 and resp.headers["Allow"] == "GET, OPTIONS"


async def test_no_recordings_directory_means_no_recordings(make_env: Any) -> None:
    env = await make_env()
    c = env.app.test_client()
    assert await error_code(await c.get("/v1/realtime/calls/rtc_x/recording"),
                            404) == "recording_not_found"


async def test_a_recording_finished_between_the_routes_two_looks_is_served(
        make_env: Any, tmp_path: Path, monkeypatch: Any) -> None:
    """Regression (a clean-clone .ci/run, tests/e2e/test_recording_up.py): the route found
    no final file, the writer renamed ``.part`` to it, and then the route found no part
    either: 404 ``recording_not_found`` for a recording that existed."""
    rec_dir = tmp_path / "recordings"
    rec_dir.mkdir()
    env = await make_env(http=("0.0.0.0", 8443), api_token="the-api-token",
                         recordings_dir=rec_dir)
    body = wav_header(8) + bytes(range(8))
    part = rec_dir / "rtc_race.wav.part"
    part.write_bytes(body)
    exists = Path.exists

    def finished_meanwhile(self: Path) -> bool:
        if self == part:
            part.replace(rec_dir / "rtc_race.wav")  # the writer's rename, just now
        return exists(self)

    monkeypatch.setattr(Path, "exists", finished_meanwhile)
    resp = await env.app.test_client().get("/v1/realtime/calls/rtc_race/recording",
                                           headers=API)
    assert resp.status_code == 200 and await resp.get_data() == body

"""The `appliance` command as a user runs it: a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "appliance", *args],
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    p = tmp_path / "routing.secret"
    p.write_text("00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n")
    return p


def test_help_is_complete() -> None:
    r = run("--help")
    assert r.returncode == 0
    assert "ufrag" in r.stdout
    assert "relay" in r.stdout



@pytest.mark.parametrize("sub", [["up"], ["signaling"], ["relay"], ["transceiver"], ["ufrag"],
                                 ["ufrag", "mint"], ["ufrag", "decode"]])
def test_every_subcommand_has_help(sub: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    # The parser the subprocess above runs, in-process: one interpreter start per
    # subcommand cost ~2.5 s each on this box and proved nothing the top-level run does not.
    from appliance.cli import main

    with pytest.raises(SystemExit) as exit_:
        main([*sub, "--help"])
    assert exit_.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_mint_then_decode(secret: Path) -> None:
    r = run("ufrag", "mint", "--transceiver", "7", "--cluster", "3", "--secret-file", str(secret))
    assert r.returncode == 0, r.stderr
    ufrag = r.stdout.strip()
    assert len(ufrag) == 28
    r = run("ufrag", "decode", ufrag, "--secret-file", str(secret))
    assert r.returncode == 0
    assert "cluster: 3" in r.stdout and "transceiver: 7" in r.stdout
    r = run("ufrag", "decode", f"{ufrag}:clientfrag", "--secret-file", str(secret), "--json")
    assert '"transceiver": 7' in r.stdout


def test_decode_tampered_exits_nonzero_with_reason(secret: Path) -> None:
    r = run("ufrag", "mint", "--transceiver", "1", "--secret-file", str(secret))
    ufrag = r.stdout.strip()
    tampered = ufrag[:-1] + ("A" if ufrag[-1] != "A" else "B")
    r = run("ufrag", "decode", tampered, "--secret-file", str(secret))
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and "bad-mac" in r.stderr


def test_decode_foreign_secret(secret: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.write_text("a-completely-different-secret-value\n")
    ufrag = run("ufrag", "mint", "--transceiver", "1", "--secret-file", str(other)).stdout.strip()
    r = run("ufrag", "decode", ufrag, "--secret-file", str(secret))
    assert r.returncode == 1 and "MAC" in r.stderr


def test_decode_malformed_and_missing_file(secret: Path) -> None:
    r = run("ufrag", "decode", "not-a-ufrag!", "--secret-file", str(secret))
    assert r.returncode == 1 and "malformed" in r.stderr
    r = run("ufrag", "mint", "--transceiver", "1", "--secret-file", "/nonexistent/secret")
    assert r.returncode != 0 and "cannot read secret file" in r.stderr


def test_mint_out_of_range(secret: Path) -> None:
    r = run("ufrag", "mint", "--transceiver", "70000", "--secret-file", str(secret))
    assert r.returncode == 2 and "transceiver" in r.stderr


def test_roles_run_with_the_start_up_heap_frozen(secret: Path) -> None:
    """Every role runs with start-up's objects frozen (cli.settle_heap): a full collection
    then walks only what the role itself made. Checked in a real process, through main()."""
    code = (
        "import gc, sys\n"
        "from appliance import cli\n"
        "seen = []\n"
        "real = cli._ufrag_mint\n"
        "def mint(args):\n"
        "    seen.append(gc.get_freeze_count())\n"
        "    return real(args)\n"
        "cli._ufrag_mint = mint\n"
        "assert gc.get_freeze_count() == 0\n"
        f"rc = cli.main(['ufrag', 'mint', '--transceiver', '1', '--secret-file', {str(secret)!r}])\n"
        "print(rc, seen[0], file=sys.stderr)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    rc, frozen = r.stderr.split()
    assert rc == "0"
    assert int(frozen) > 10_000  # trio, cryptography, numpy... all imported by then


def test_ufrag_finds_the_state_directorys_secret(tmp_path: Path) -> None:
    """Regression (issue 22): the README's `ufrag mint --secret-file routing.secret` named a
    file nobody has; `appliance up` keeps it in its state directory, and with no
    --secret-file the ufrag commands now read that one."""
    from appliance.supervisor import ensure_secret

    secret = ensure_secret(tmp_path / "xdg" / "appliance")  # what `appliance up` creates
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "xdg")}
    mint = subprocess.run([sys.executable, "-m", "appliance", "ufrag", "mint", "--transceiver",
                           "3"], capture_output=True, text=True, timeout=60, env=env)
    assert mint.returncode == 0, mint.stderr
    ufrag = mint.stdout.strip()
    # Minted with up's secret: the explicit file, and --state-dir, decode it.
    for flags in (["--secret-file", str(secret)], ["--state-dir", str(secret.parent)]):
        r = run("ufrag", "decode", ufrag, *flags)
        assert r.returncode == 0 and "transceiver: 3" in r.stdout, r.stderr
    # No secret in the default state directory: say where it looked and how to get one.
    r = subprocess.run([sys.executable, "-m", "appliance", "ufrag", "mint", "--transceiver", "1"],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path,
                       env={k: v for k, v in os.environ.items() if k != "XDG_STATE_HOME"})
    assert r.returncode != 0
    assert "no routing secret at .appliance-state/routing.secret" in r.stderr
    assert "appliance up" in r.stderr

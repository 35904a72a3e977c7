#!/usr/bin/env python3
"""Drives tests/fakes/fake_e2b.py with the official E2B Python SDK (tests/e2b.rs installs the pinned `e2b`).

Run with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY pointing at the fake. Every step asserts what the SDK
saw; the last line on stdout is `OK <json>` with the sandbox id and what was observed, for the Rust test to check
against the fake's own record. Any disagreement raises, so the script exits non-zero with the SDK's traceback.
"""

import json
import sys

from e2b import CommandExitException, Sandbox, Template


def main():
    observed = {}
    sbx = Sandbox.create(
        template="base",
        timeout=600,
        metadata={"zed_session": "sdk-check"},
        envs={"SANDBOX_WIDE": "from-create"},
        lifecycle={"on_timeout": "pause", "auto_resume": True},
    )
    observed["sandbox_id"] = sbx.sandbox_id

    chunks = []
    result = sbx.commands.run(
        "echo one; echo err >&2; printf '%s|%s' \"$SANDBOX_WIDE\" \"$PER_RUN\"; echo; pwd",
        envs={"PER_RUN": "from-run"},
        cwd="/home/user",
        on_stdout=chunks.append,
    )
    assert result.exit_code == 0, result
    assert result.stdout.splitlines()[:2] == ["one", "from-create|from-run"], result.stdout
    assert result.stdout.splitlines()[2] == "/home/user", result.stdout
    assert result.stderr == "err\n", result.stderr
    assert "".join(chunks) == result.stdout, chunks
    observed["stdout_chunks"] = len(chunks)

    try:
        sbx.commands.run("echo failing; exit 3")
        raise AssertionError("exit 3 did not raise CommandExitException")
    except CommandExitException as err:
        assert err.exit_code == 3, err
        assert err.stdout == "failing\n", err.stdout

    info = sbx.files.write("/home/user/notes/hello.txt", "hello from the sdk\n")
    assert info.path == "/home/user/notes/hello.txt", info
    assert sbx.files.read("/home/user/notes/hello.txt") == "hello from the sdk\n"
    listed = sbx.commands.run("cat notes/hello.txt", cwd="/home/user")
    assert listed.stdout == "hello from the sdk\n", listed.stdout

    background = sbx.commands.run("echo started; sleep 30", background=True)
    attached = sbx.commands.connect(background.pid)
    assert attached.pid == background.pid
    running = [p.pid for p in sbx.commands.list()]
    assert background.pid in running, running
    assert sbx.commands.kill(background.pid) is True
    try:
        attached.wait()
        raise AssertionError("a killed command did not raise")
    except CommandExitException as err:
        assert err.exit_code == -1, err

    assert sbx.get_info().state.value == "running"
    sbx.pause()
    paused = Sandbox.get_info(sbx.sandbox_id)
    assert paused.state.value == "paused", paused.state
    resumed = Sandbox.connect(sbx.sandbox_id, timeout=300)
    assert resumed.sandbox_id == sbx.sandbox_id
    assert Sandbox.get_info(sbx.sandbox_id).state.value == "running"
    again = resumed.commands.run("cat /home/user/notes/hello.txt")
    assert again.stdout == "hello from the sdk\n", again.stdout

    resumed.set_timeout(120)
    assert resumed.kill() is True
    assert Sandbox.kill(sbx.sandbox_id) is False
    # `GET /templates/aliases/{alias}`: E2B's public `base` exists for every team (a 403), an unknown one does not.
    observed["templates_exist"] = [Template.exists("base"), Template.exists("no-such-template")]
    print("OK " + json.dumps(observed))


if __name__ == "__main__":
    main()
    sys.exit(0)

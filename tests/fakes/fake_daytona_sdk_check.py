#!/usr/bin/env python3
"""Drives tests/fakes/fake_daytona.py with the official Daytona Python SDK (PyPI `daytona`), for tests/daytona.rs.

Run with the SDK's venv python and DAYTONA_API_URL / DAYTONA_API_KEY pointing at the fake. Each step asserts what
the SDK got back; the first disagreement exits non-zero with a message on stderr. On success it prints one JSON
line with what it saw, for the test to compare exactly.
"""

import asyncio
import json
import sys
import time

from daytona import CreateSandboxFromImageParams, CreateSandboxFromSnapshotParams, Daytona, SessionExecuteRequest


def check(what, got, want):
    if got != want:
        sys.stderr.write(f"sdk-check: {what}: got {got!r}, want {want!r}\n")
        sys.exit(1)


def main():
    daytona = Daytona()
    sandbox = daytona.create(
        CreateSandboxFromSnapshotParams(
            snapshot="daytona-small",
            env_vars={"GREETING": "hello from env"},
            labels={"acp-sandbox": "sdk-check"},
            auto_stop_interval=0,
        ),
        timeout=30,
    )
    check("state after create", str(sandbox.state.value), "started")
    check("labels", sandbox.labels, {"acp-sandbox": "sdk-check", "code-toolbox-language": "python"})
    same = daytona.get(sandbox.id)
    check("get by id", same.id, sandbox.id)
    work_dir = sandbox.get_work_dir()

    # A streamed session command: stdout and stderr apart, then its exit code.
    sandbox.process.create_session("sdk-check")
    started = sandbox.process.execute_session_command(
        "sdk-check",
        SessionExecuteRequest(
            command='echo "$GREETING"; echo to-stderr >&2; printf "no newline"; exit 7',
            run_async=True,
        ),
    )
    stdout, stderr = [], []
    asyncio.run(
        sandbox.process.get_session_command_logs_async("sdk-check", started.cmd_id, stdout.append, stderr.append)
    )
    command = sandbox.process.get_session_command("sdk-check", started.cmd_id)
    check("exit code", command.exit_code, 7)
    logs = sandbox.process.get_session_command_logs("sdk-check", started.cmd_id)
    check("logs stdout", logs.stdout, "hello from env\nno newline\n")
    check("logs stderr", logs.stderr, "to-stderr\n")
    sync = sandbox.process.execute_session_command("sdk-check", SessionExecuteRequest(command="echo sync; pwd"))
    check("sync exit code", sync.exit_code, 0)
    check("sync stdout", sync.stdout, f"sync\n{work_dir}\n")
    session = sandbox.process.get_session("sdk-check")
    check("session commands", [c.id for c in session.commands], [started.cmd_id, sync.cmd_id])
    # The list of sessions: each with its commands, a running one without an exit code; deleting a session ends it.
    sandbox.process.create_session("sdk-running")
    sandbox.process.execute_session_command("sdk-running", SessionExecuteRequest(command="sleep 1000", run_async=True))
    listed = sorted(
        [s.session_id, [[c.command, c.exit_code] for c in s.commands]] for s in sandbox.process.list_sessions()
    )
    sandbox.process.delete_session("sdk-running")
    check("after the delete", [s.session_id for s in sandbox.process.list_sessions()], ["sdk-check"])
    sandbox.process.delete_session("sdk-check")

    # Input to a running command goes to its stdin (a newline added), and into its log as stdout unless the
    # command was started with suppress_input_echo.
    sandbox.process.create_session("sdk-input")
    inputs = {}
    for suppress in (True, False):
        cmd = sandbox.process.execute_session_command(
            "sdk-input",
            SessionExecuteRequest(command='read line; echo "got:$line"', run_async=True, suppress_input_echo=suppress),
        )
        for attempt in range(200):
            try:
                # The daemon makes the input pipe once the session's shell starts the command.
                sandbox.process.send_session_command_input("sdk-input", cmd.cmd_id, "hello")
                break
            except Exception:  # the SDK's DaytonaError for the 500 until then
                if attempt == 199:
                    raise
                time.sleep(0.02)
        while sandbox.process.get_session_command("sdk-input", cmd.cmd_id).exit_code is None:
            time.sleep(0.02)
        logs = sandbox.process.get_session_command_logs("sdk-input", cmd.cmd_id)
        inputs["suppressed" if suppress else "echoed"] = sorted(logs.stdout.splitlines())
    try:
        sandbox.process.send_session_command_input("sdk-input", cmd.cmd_id, "late")
        inputs["after_exit"] = None
    except Exception as e:
        inputs["after_exit"] = str(e)
    sandbox.process.delete_session("sdk-input")

    # Files, by relative and by absolute path.
    sandbox.fs.upload_file(b"first file\n", "notes/hello.txt")
    sandbox.fs.upload_file(bytes(range(256)), f"{work_dir}/blob.bin")
    read_back = sandbox.fs.download_file("notes/hello.txt")
    blob = sandbox.fs.download_file(f"{work_dir}/blob.bin")
    check("blob", blob, bytes(range(256)))

    # Stop keeps the files; start brings the sandbox back.
    sandbox.stop(timeout=30)
    check("state after stop", str(sandbox.state.value), "stopped")
    sandbox.start(timeout=30)
    check("state after start", str(sandbox.state.value), "started")
    after_restart = sandbox.fs.download_file("notes/hello.txt")
    check("file survives stop/start", after_restart, b"first file\n")

    # From an image: the SDK sends a Dockerfile as the build info.
    built = daytona.create(CreateSandboxFromImageParams(image="debian:12-slim"), timeout=30)
    check("image sandbox state", str(built.state.value), "started")
    check("image build info", built.build_info.dockerfile_content, "FROM debian:12-slim\n")
    daytona.delete(built)

    # Snapshots by name: Daytona's own exists, an unknown one is the SDK's not-found error.
    snapshot = daytona.snapshot.get("daytona-small")
    check("snapshot", (snapshot.name, str(snapshot.state.value), snapshot.general), ("daytona-small", "active", True))
    try:
        daytona.snapshot.get("no-such-snapshot")
        missing_snapshot = None
    except Exception as e:  # the SDK's DaytonaNotFoundError
        missing_snapshot = type(e).__name__

    sandbox_id = sandbox.id
    sandbox.delete()
    try:
        daytona.get(sandbox_id)
        gone = False
    except Exception as e:  # the SDK's DaytonaNotFoundError
        gone = type(e).__name__
    print(
        json.dumps(
            {
                "stdout": "".join(stdout),
                "stderr": "".join(stderr),
                "exit_code": command.exit_code,
                "read_back": read_back.decode(),
                "gone": gone,
                "input": inputs,
                "missing_snapshot": missing_snapshot,
                "sessions": listed,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()

// acp-sandbox's guard for a warm `opencode serve` (written by the bridge before each start; see guard.rs).
// OpenCode reads OPENCODE_SERVER_PASSWORD once, when the server starts listening; every tool it runs later
// inherits process.env. This plugin runs when the server loads its first project, before any tool: it takes the
// password out of process.env and makes the process non-dumpable, so that no process of the same user (a tool)
// can read the initial environment in /proc/<pid>/environ or the memory holding the password. Only then does it
// print the line the bridge waits for before it sends a prompt.
import { dlopen, FFIType } from "bun:ffi";

const PR_SET_DUMPABLE = 4;
const PR_GET_DUMPABLE = 3;
const LIBCS = ["libc.so.6", "libc.musl-x86_64.so.1", "libc.musl-aarch64.so.1", "libc.so"];

function prctl() {
  for (const name of LIBCS) {
    try {
      const args = [FFIType.i32, FFIType.u64, FFIType.u64, FFIType.u64, FFIType.u64];
      return dlopen(name, { prctl: { args, returns: FFIType.i32 } }).symbols.prctl;
    } catch {}
  }
  return undefined;
}

let guarded = false;

export const AcpSandboxServerGuard = async () => {
  if (!guarded) {
    delete process.env.OPENCODE_SERVER_PASSWORD;
    delete process.env.OPENCODE_SERVER_USERNAME;
    const call = prctl();
    if (call && call(PR_SET_DUMPABLE, 0, 0, 0, 0) === 0 && call(PR_GET_DUMPABLE, 0, 0, 0, 0) === 0 &&
        process.env.OPENCODE_SERVER_PASSWORD === undefined) {
      guarded = true;
      console.error("ACP_SANDBOX_SERVER_GUARD_ON");
    } else {
      console.error("acp-sandbox server guard: cannot make this process non-dumpable");
    }
  }
  return {};
};

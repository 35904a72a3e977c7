// Drives tests/fakes/fake_e2b.py with the official E2B npm SDK (`e2b`, pinned by .ci/install-node-sdk.sh).
//
//   node tests/fakes/e2b_sdk_check.mjs PREFIX     # PREFIX: what .ci/install-node-sdk.sh printed
//
// Run with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY pointing at the fake. Every step asserts exactly what the
// SDK saw; the first disagreement exits 1 with `e2b-sdk-check:`, the step and what differed on stderr. On success
// the last line on stdout is `OK <json>` with the sandbox id and what was observed, for tests/e2b.rs to check
// against the fake's own record of the requests.

import { createRequire } from 'node:module'
import { isDeepStrictEqual, inspect } from 'node:util'

const prefix = process.argv[2]
if (!prefix) {
  console.error('usage: e2b_sdk_check.mjs PREFIX (the directory .ci/install-node-sdk.sh printed)')
  process.exit(2)
}
const { Sandbox, CommandExitError, NotFoundError, SandboxNotFoundError, AuthenticationError } =
  createRequire(`${prefix}/package.json`)('e2b')

function check(what, got, want) {
  if (!isDeepStrictEqual(got, want)) {
    throw new Error(`${what}: got ${inspect(got)}, want ${inspect(want)}`)
  }
}

async function exitError(what, promise) {
  try {
    await promise
  } catch (err) {
    if (err instanceof CommandExitError) return err
    throw new Error(`${what}: threw ${inspect(err)}, want a CommandExitError`)
  }
  throw new Error(`${what}: did not throw a CommandExitError`)
}

// What a call that must fail threw: the name of the expected class, or what it was instead.
async function failure(promise, expected) {
  try {
    await promise
  } catch (err) {
    return err instanceof expected ? expected.name : inspect(err)
  }
  return 'no error'
}

async function main() {
  const observed = {}
  const wrongKey = { apiKey: 'e2b_wrong0123456789abcdef0123456789ab' }
  check('a wrong key', await failure(Sandbox.create('base', wrongKey), AuthenticationError), 'AuthenticationError')
  const sbx = await Sandbox.create('base', {
    timeoutMs: 600_000,
    metadata: { zed_session: 'npm-sdk-check' },
    envs: { SANDBOX_WIDE: 'from-create' },
    lifecycle: { onTimeout: 'pause', autoResume: true },
  })
  observed.sandbox_id = sbx.sandboxId
  check('isRunning after create', await sbx.isRunning(), true)

  // Streaming: the command prints its first line, then waits for a file that is written only once that line
  // reached onStdout. The line cannot have come with the exit.
  const chunks = []
  const errChunks = []
  let sawFirst
  const firstLine = new Promise((resolve) => (sawFirst = resolve))
  const streaming = await sbx.commands.run(
    'echo "one $SANDBOX_WIDE $PER_RUN"; while [ ! -e go ]; do sleep 0.02; done; echo two; echo err >&2; pwd',
    {
      background: true,
      envs: { PER_RUN: 'from-run' },
      cwd: '/home/user',
      onStdout: (data) => {
        chunks.push(data)
        if (chunks.join('').includes('\n')) sawFirst()
      },
      onStderr: (data) => errChunks.push(data),
    },
  )
  await firstLine
  check('stdout before the command could end', chunks.join(''), 'one from-create from-run\n')
  observed.chunks_before_exit = chunks.length
  await sbx.files.write('/home/user/go', '')
  const streamed = await streaming.wait()
  check('streamed exit code', streamed.exitCode, 0)
  check('streamed stdout', streamed.stdout, 'one from-create from-run\ntwo\n/home/user\n')
  check('streamed stderr', streamed.stderr, 'err\n')
  check('stdout chunks add up', chunks.join(''), streamed.stdout)
  check('stderr chunks add up', errChunks.join(''), 'err\n')
  observed.stdout_chunks = chunks.length

  const failed = await exitError('exit 3', sbx.commands.run('echo failing; echo why >&2; exit 3'))
  check('failed exit code', failed.exitCode, 3)
  check('failed stdout', failed.stdout, 'failing\n')
  check('failed stderr', failed.stderr, 'why\n')

  const info = await sbx.files.write('/home/user/notes/hello.txt', 'hello from the npm sdk\n')
  check('write info', { path: info.path, name: info.name }, { path: '/home/user/notes/hello.txt', name: 'hello.txt' })
  check('read back', await sbx.files.read('/home/user/notes/hello.txt'), 'hello from the npm sdk\n')
  const bytes = Uint8Array.from({ length: 256 }, (_, i) => i)
  await sbx.files.write('blob.bin', bytes.buffer)
  const blob = await sbx.files.read('/home/user/blob.bin', { format: 'bytes' })
  check('binary read back', Buffer.from(blob), Buffer.from(bytes))
  // Several files in one request: a multipart part per file, each named by its path, and no `path` query.
  const many = await sbx.files.write([
    { path: '/home/user/many/a.txt', data: 'first\n' },
    { path: 'many/b.txt', data: 'second\n' },
  ])
  check(
    'write of two files',
    many.map((f) => ({ path: f.path, name: f.name, type: f.type })),
    [
      { path: '/home/user/many/a.txt', name: 'a.txt', type: 'file' },
      { path: '/home/user/many/b.txt', name: 'b.txt', type: 'file' },
    ],
  )
  // A gzip-compressed raw body (Content-Encoding: gzip) is stored decompressed.
  await sbx.files.write('/home/user/zipped.txt', 'stored plain\n', { gzip: true })
  check('a missing file', await failure(sbx.files.read('/home/user/no/such'), NotFoundError), 'NotFoundError')
  const cat = await sbx.commands.run('cat notes/hello.txt many/a.txt many/b.txt zipped.txt', { cwd: '/home/user' })
  check('the command sees the written files', cat.stdout, 'hello from the npm sdk\nfirst\nsecond\nstored plain\n')

  // Stdin: what is sent reaches the command, and closing it ends `cat`.
  const cat2 = await sbx.commands.run('cat; echo " (eof)"', { background: true, stdin: true })
  await sbx.commands.sendStdin(cat2.pid, 'typed in')
  await sbx.commands.closeStdin(cat2.pid)
  const echoed = await cat2.wait()
  check('stdin echoed back', [echoed.exitCode, echoed.stdout], [0, 'typed in (eof)\n'])

  const background = await sbx.commands.run('echo started; sleep 30', { background: true })
  const attached = await sbx.commands.connect(background.pid)
  check('connected pid', attached.pid, background.pid)
  const running = (await sbx.commands.list()).map((p) => p.pid)
  check('the background command is listed', running.includes(background.pid), true)
  check('kill', await sbx.commands.kill(background.pid), true)
  const killed = await exitError('a killed command', attached.wait())
  check('killed exit code', killed.exitCode, -1)
  check('killing it again', await sbx.commands.kill(background.pid), false)

  check('state before pause', (await sbx.getInfo()).state, 'running')
  const same = await Sandbox.connect(sbx.sandboxId)
  check('connect to a running sandbox', (await same.commands.run('echo $E2B_SANDBOX_ID')).stdout, `${sbx.sandboxId}\n`)
  check('pause', await sbx.pause(), true)
  check('pause again', await Sandbox.pause(sbx.sandboxId), false)
  const paused = await Sandbox.getInfo(sbx.sandboxId)
  check('state after pause', paused.state, 'paused')
  check('lifecycle', paused.lifecycle, { onTimeout: 'pause', autoResume: true })
  check('metadata', paused.metadata, { zed_session: 'npm-sdk-check' })
  const resumed = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 300_000 })
  check('resumed id', resumed.sandboxId, sbx.sandboxId)
  check('state after connect', (await Sandbox.getInfo(sbx.sandboxId)).state, 'running')
  const again = await resumed.commands.run('cat /home/user/notes/hello.txt')
  check('the file survives pause and resume', again.stdout, 'hello from the npm sdk\n')
  check('read after resume', await resumed.files.read('notes/hello.txt'), 'hello from the npm sdk\n')

  await resumed.setTimeout(120_000)
  check('kill the sandbox', await resumed.kill(), true)
  check('kill it again', await Sandbox.kill(sbx.sandboxId), false)
  const infoGone = await failure(Sandbox.getInfo(sbx.sandboxId), SandboxNotFoundError)
  check('info of a killed sandbox', infoGone, 'SandboxNotFoundError')
  const connect = await failure(Sandbox.connect(sbx.sandboxId), SandboxNotFoundError)
  check('connect to a killed sandbox', connect, 'SandboxNotFoundError')
  console.log('OK ' + JSON.stringify(observed))
}

main().catch((err) => {
  console.error(`e2b-sdk-check: ${err instanceof Error ? err.stack : inspect(err)}`)
  process.exit(1)
})

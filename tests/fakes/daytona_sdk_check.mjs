// Drives tests/fakes/fake_daytona.py with the official Daytona npm SDK (`@daytonaio/sdk`, pinned by
// .ci/install-node-sdk.sh).
//
//   node tests/fakes/daytona_sdk_check.mjs PREFIX     # PREFIX: what .ci/install-node-sdk.sh printed
//
// Run with DAYTONA_API_URL and DAYTONA_API_KEY pointing at the fake. Every step asserts exactly what the SDK got
// back; the first disagreement exits 1 with `daytona-sdk-check:`, the step and what differed on stderr. On success
// it prints one JSON line with what it saw, for tests/daytona.rs to compare exactly.

import { createRequire } from 'node:module'
import { isDeepStrictEqual, inspect } from 'node:util'

const prefix = process.argv[2]
if (!prefix) {
  console.error('usage: daytona_sdk_check.mjs PREFIX (the directory .ci/install-node-sdk.sh printed)')
  process.exit(2)
}
const { Daytona, Image, DaytonaNotFoundError, DaytonaAuthenticationError } =
  createRequire(`${prefix}/package.json`)('@daytonaio/sdk')

function check(what, got, want) {
  if (!isDeepStrictEqual(got, want)) {
    throw new Error(`${what}: got ${inspect(got)}, want ${inspect(want)}`)
  }
}

async function main() {
  const daytona = new Daytona()
  const refused = await new Daytona({ apiKey: 'dtn_wrong' }).get('anything').then(
    () => 'no error',
    (err) => (err instanceof DaytonaAuthenticationError ? 'refused' : inspect(err)),
  )
  check('a wrong key', refused, 'refused')
  const sandbox = await daytona.create(
    {
      snapshot: 'daytona-small',
      envVars: { GREETING: 'hello from env' },
      labels: { 'acp-sandbox': 'npm-sdk-check' },
      autoStopInterval: 0,
    },
    { timeout: 30 },
  )
  check('state after create', sandbox.state, 'started')
  check('labels', sandbox.labels, { 'acp-sandbox': 'npm-sdk-check', 'code-toolbox-language': 'python' })
  check('get by id', (await daytona.get(sandbox.id)).id, sandbox.id)
  const workDir = await sandbox.getWorkDir()
  check('home is the work dir', await sandbox.getUserHomeDir(), workDir)

  // A streamed session command: it prints its first lines, then waits for a file that is uploaded only once
  // the first stdout line reached the callback, so that line cannot have come with the exit.
  await sandbox.process.createSession('npm-check')
  const started = await sandbox.process.executeSessionCommand('npm-check', {
    command:
      'echo "$GREETING"; echo to-stderr >&2; while [ ! -f go ]; do sleep 0.02; done; printf "no newline"; exit 7',
    runAsync: true,
  })
  check('async exec has no exit code yet', started.exitCode, undefined)
  const stdout = []
  const stderr = []
  let sawFirst
  const firstLine = new Promise((resolve) => (sawFirst = resolve))
  const streamed = sandbox.process.getSessionCommandLogs(
    'npm-check',
    started.cmdId,
    (chunk) => {
      stdout.push(chunk)
      if (stdout.join('').includes('\n')) sawFirst()
    },
    (chunk) => stderr.push(chunk),
  )
  await Promise.race([firstLine, streamed.then(() => Promise.reject(new Error('the log stream ended before go')))])
  check('stdout before the command could end', stdout.join(''), 'hello from env\n')
  const running = await sandbox.process.getSessionCommand('npm-check', started.cmdId)
  check('no exit code while it runs', running.exitCode, undefined)
  await sandbox.fs.uploadFile(Buffer.from(''), 'go')
  await streamed
  const command = await sandbox.process.getSessionCommand('npm-check', started.cmdId)
  check('exit code', command.exitCode, 7)
  const logs = await sandbox.process.getSessionCommandLogs('npm-check', started.cmdId)
  check('logs stdout', logs.stdout, 'hello from env\nno newline\n')
  check('logs stderr', logs.stderr, 'to-stderr\n')
  // stdout and stderr are labelled by two readers, so the combined log interleaves their lines in either order.
  check('logs output', logs.output.split('\n').sort(), ['', 'hello from env', 'no newline', 'to-stderr'])
  const sync = await sandbox.process.executeSessionCommand('npm-check', { command: 'echo sync; echo oops >&2; pwd' })
  check('sync exit code', sync.exitCode, 0)
  check('sync stdout', sync.stdout, `sync\n${workDir}\n`)
  check('sync stderr', sync.stderr, 'oops\n')
  // Input reaches a running command's stdin.
  const reader = await sandbox.process.executeSessionCommand('npm-check', {
    command: 'read line; echo "got $line"',
    runAsync: true,
  })
  await sandbox.process.sendSessionCommandInput('npm-check', reader.cmdId, 'typed in\n')
  const answered = []
  await sandbox.process.getSessionCommandLogs('npm-check', reader.cmdId, (chunk) => answered.push(chunk), () => {})
  check('input echoed back', answered.join(''), 'got typed in\n')
  check('input command exit', (await sandbox.process.getSessionCommand('npm-check', reader.cmdId)).exitCode, 0)
  const session = await sandbox.process.getSession('npm-check')
  check('session commands', session.commands.map((c) => c.id), [started.cmdId, sync.cmdId, reader.cmdId])

  // Files, by relative and by absolute path.
  await sandbox.fs.uploadFile(Buffer.from('first file\n'), 'notes/hello.txt')
  const bytes = Buffer.from(Array.from({ length: 256 }, (_, i) => i))
  await sandbox.fs.uploadFile(bytes, `${workDir}/blob.bin`)
  const readBack = await sandbox.fs.downloadFile('notes/hello.txt')
  check('blob', await sandbox.fs.downloadFile(`${workDir}/blob.bin`), bytes)
  const missing = await sandbox.fs.downloadFile('no/such/file').then(
    () => 'downloaded',
    (err) => (err instanceof DaytonaNotFoundError ? 'not found' : inspect(err)),
  )
  check('a missing file', missing, 'not found')

  // Folders, several files in one upload and one download (a missing one fails alone), deletion.
  await sandbox.fs.createFolder('made/here', '750')
  await sandbox.fs.uploadFiles([
    { source: Buffer.from('a\n'), destination: 'made/here/a.txt' },
    { source: Buffer.from('b\n'), destination: `${workDir}/made/b.txt` },
  ])
  const listing = await sandbox.process.executeSessionCommand('npm-check', {
    command: 'stat -c %a made/here; cat made/here/a.txt made/b.txt',
  })
  check('folder mode and uploaded files', listing.stdout, '750\na\nb\n')
  const several = await sandbox.fs.downloadFiles([
    { source: 'made/here/a.txt' },
    { source: 'made/b.txt' },
    { source: 'made/none' },
  ])
  check(
    'bulk download',
    several.map((f) => [f.source, f.result?.toString(), f.error, f.errorDetails?.statusCode]),
    [
      ['made/here/a.txt', 'a\n', undefined, undefined],
      ['made/b.txt', 'b\n', undefined, undefined],
      ['made/none', undefined, 'file not found: made/none', 404],
    ],
  )
  // A name beyond Latin-1 and with a quote: the SDK matches each part to its file by the part's filename.
  const odd = 'made/grüße "日本".txt'
  await sandbox.fs.uploadFile(Buffer.from('unicode\n'), odd)
  const oddBack = await sandbox.fs.downloadFiles([{ source: odd }, { source: 'made/none "日本"' }])
  check(
    'download of a non-ASCII name',
    oddBack.map((f) => [f.source, f.result?.toString(), f.error]),
    [
      [odd, 'unicode\n', undefined],
      ['made/none "日本"', undefined, 'file not found: made/none "日本"'],
    ],
  )
  await sandbox.fs.deleteFile('made/here/a.txt')
  const deleted = await sandbox.fs.downloadFile('made/here/a.txt').then(
    () => 'downloaded',
    (err) => (err instanceof DaytonaNotFoundError ? 'not found' : inspect(err)),
  )
  check('a deleted file', deleted, 'not found')
  await sandbox.fs.deleteFile('made', true)
  const left = await sandbox.process.executeSessionCommand('npm-check', { command: 'ls' })
  check('the folder is gone', left.stdout, 'blob.bin\ngo\nnotes\n')
  await sandbox.process.deleteSession('npm-check')
  check('sessions after delete', (await sandbox.process.listSessions()).map((s) => s.sessionId), [])

  // Stop keeps the files; start brings the sandbox back.
  await sandbox.stop(30)
  check('state after stop', sandbox.state, 'stopped')
  await sandbox.start(30)
  check('state after start', sandbox.state, 'started')
  const afterRestart = await sandbox.fs.downloadFile('notes/hello.txt')
  check('file survives stop/start', afterRestart, Buffer.from('first file\n'))

  // From an image: the SDK sends a Dockerfile as the build info.
  const built = await daytona.create({ image: Image.base('debian:12-slim') }, { timeout: 30 })
  check('image sandbox state', built.state, 'started')
  check('image build info', built.buildInfo?.dockerfileContent, 'FROM debian:12-slim\n')
  await daytona.delete(built)

  const sandboxId = sandbox.id
  await sandbox.delete()
  const gone = await daytona.get(sandboxId).then(
    () => false,
    (err) => (err instanceof DaytonaNotFoundError ? err.constructor.name : inspect(err)),
  )
  console.log(
    JSON.stringify({
      stdout: stdout.join(''),
      stderr: stderr.join(''),
      exit_code: command.exitCode,
      read_back: readBack.toString(),
      gone,
    }),
  )
}

main().then(
  () => process.exit(0),
  (err) => {
    console.error(`daytona-sdk-check: ${err instanceof Error ? err.stack : inspect(err)}`)
    process.exit(1)
  },
)

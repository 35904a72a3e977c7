//! The seccomp filter bubblewrap installs in a sandbox (`bwrap --seccomp FD`): system calls that let a CLI
//! leave or inspect its sandbox fail with `EPERM`, everything else is allowed.
//!
//! bubblewrap reads a raw array of `struct sock_filter` (8 bytes each, native endian) from the fd until EOF and
//! installs it, with `no_new_privs`, right before it execs the command. [`filter_bytes`] builds that array with
//! `seccompiler` for the host architecture; [`filter_fd`] puts it in a memfd ready to be inherited.
//!
//! What is denied, and why:
//! - other processes' memory, fds and keys: `ptrace`, `process_vm_readv`/`process_vm_writev`,
//!   `process_madvise`, `pidfd_getfd` (with a pidfd of `sandbox-init` a tool could take the listening socket of
//!   a server's door), `pidfd_open` of pid 1 or 2 (bubblewrap and `sandbox-init` in the sandbox's PID namespace;
//!   other pids stay allowed: Bun waits for its children through pidfds, and without them OpenCode's bash tool
//!   lost its output), `kcmp`, the keyring calls;
//! - the kernel's attack surface and its logs: `bpf`, `perf_event_open`, `userfaultfd`, modules, `kexec`,
//!   `syslog`, `acct`, swap, `reboot`, x86 port I/O;
//! - anything that rebuilds the sandbox from inside: the mount API (old and new), `pivot_root`, `unshare`,
//!   `setns`, and `clone` with a namespace flag. `clone3` passes its flags in a struct the filter cannot read,
//!   so it answers `ENOSYS`, on which glibc (and musl, Go, Rust's std) fall back to `clone`, where the flags are
//!   checked;
//! - io_uring: its operations run in the kernel without passing through seccomp;
//! - `open_by_handle_at`: when the bridge runs as root, bubblewrap keeps the CLI's capabilities, and with
//!   `CAP_DAC_READ_SEARCH` a file handle opens any file of the host file system, whatever is mounted.
//!
//! `personality` is allowed only to query the persona or to set `PER_LINUX` or `PER_LINUX32`: the other flags
//! (`ADDR_NO_RANDOMIZE`, `READ_IMPLIES_EXEC`, ...) only weaken the process, and node, bun and glibc never set them.
//!
//! A system call of another ABI (32-bit x86 on x86_64, arm32 on aarch64) kills the process: seccompiler checks
//! the architecture first and the filter only knows the native numbers. On x86_64, x32 calls (the same
//! architecture, numbers with bit 30 set) answer `ENOSYS` for the same reason.

use std::collections::BTreeMap;
use std::io::{Seek, SeekFrom, Write};
use std::os::fd::{FromRawFd, OwnedFd};

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
    TargetArch, sock_filter,
};

/// Why the filter could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// seccompiler has no filter for this architecture.
    #[error("no seccomp filter for the {0} architecture")]
    UnsupportedArch(String),
    /// seccompiler refused the rules.
    #[error("building the seccomp filter: {0}")]
    Build(#[from] seccompiler::BackendError),
    /// The memfd holding the filter could not be made.
    #[error("seccomp filter fd: {0}")]
    Io(#[from] std::io::Error),
}

/// System calls that always fail with `EPERM` in the sandbox (`iopl` and `ioperm` exist on x86 only).
pub const DENIED: &[&str] = &[
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "process_madvise",
    "pidfd_getfd",
    "kcmp",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "mount",
    "umount2",
    "pivot_root",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsmount",
    "fsconfig",
    "fspick",
    "mount_setattr",
    "unshare",
    "setns",
    "open_by_handle_at",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "iopl",
    "ioperm",
    "acct",
    "swapon",
    "swapoff",
    "reboot",
    "syslog",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
];

/// System calls that answer `ENOSYS`, as on a kernel that lacks them, so that callers take their fallback.
const ENOSYS_CALLS: &[i64] = &[libc::SYS_clone3];

/// The pids `pidfd_open` refuses, as the sandbox's PID namespace numbers them: bubblewrap's own pid 1 and the
/// sandbox's first process, `sandbox-init` (pid 2), which holds a warm server's door.
const SANDBOX_PIDS: &[u64] = &[1, 2];

/// System calls the filter allows only in part, in words for `doctor` and the docs.
pub const RESTRICTED: &[&str] = &[
    "clone with a namespace flag (CLONE_NEWUSER, NEWNS, NEWPID, NEWNET, NEWIPC, NEWUTS, NEWCGROUP, NEWTIME): EPERM",
    "clone3: ENOSYS, so that libc falls back to clone, whose flags the filter can read",
    "pidfd_open of pid 1 or 2 (bubblewrap, sandbox-init): EPERM",
    "personality other than a query, PER_LINUX or PER_LINUX32: EPERM",
    "x32 system calls on x86_64: ENOSYS",
];

/// `clone` flags that create namespaces. `CLONE_NEWTIME` (0x80) lies in `clone`'s exit-signal byte, where no
/// valid signal sets it, so denying it costs nothing and covers kernels that would read it as a flag.
const NAMESPACE_FLAGS: &[libc::c_int] = &[
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWNS,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWCGROUP,
    libc::CLONE_NEWTIME,
];

/// `personality` arguments that stay allowed: the query, `PER_LINUX` and `PER_LINUX32`.
const PERSONALITIES: &[u64] = &[0xffff_ffff, 0x0000, 0x0008];

/// The bit that marks an x32 system call number on x86_64.
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// The most instructions the kernel accepts in one filter (`BPF_MAXINSNS`).
const MAX_INSTRUCTIONS: usize = 4096;

/// The filter as bubblewrap's `--seccomp FD` expects it: `struct sock_filter`s, 8 bytes each, native endian.
/// Built once: it depends on nothing but the architecture, and every sandboxed command needs it.
pub fn filter_bytes() -> Result<Vec<u8>, SeccompError> {
    static BYTES: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    if let Some(bytes) = BYTES.get() {
        return Ok(bytes.clone());
    }
    let bytes = serialize(&program()?);
    Ok(BYTES.get_or_init(|| bytes).clone())
}

/// A memfd holding [`filter_bytes`], at offset 0. It is close-on-exec: the caller clears that in the child
/// (e.g. with [`super::clear_cloexec`] in `pre_exec`) and passes `--seccomp <fd>`. bubblewrap reads it to EOF, so
/// each run needs its own.
pub fn filter_fd() -> Result<OwnedFd, SeccompError> {
    let bytes = filter_bytes()?;
    // SAFETY: the name is a NUL-terminated literal; the returned fd is checked and owned exactly once below.
    let fd = unsafe { libc::memfd_create(c"acp-sandbox-seccomp".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: memfd_create returned a fresh fd that nothing else owns.
    let mut file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    file.write_all(&bytes)?;
    file.seek(SeekFrom::Start(0))?;
    Ok(file.into())
}

/// The filter `sandbox-init` stacks on the CLI's tree (`--no-unix-sockets`): `socket(AF_UNIX, ...)` fails with
/// `EACCES`. The file system is readable by a deny-list and `connect()` on a socket file needs only its path, so
/// a host service's socket anywhere visible (an ssh agent at `~/.run/agent.sock`, a database, a desktop bus)
/// would answer; without a socket of that family nothing reaches any of them, whatever the path and whenever the
/// socket was made. `socketpair(AF_UNIX)` stays allowed (runtimes talk to their children through it) and so do
/// the sockets the CLI inherits. `sandbox-init` itself, outside this filter, still reaches the bridge's proxy.
pub fn no_unix_sockets_program() -> Result<BpfProgram, SeccompError> {
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|_| SeccompError::UnsupportedArch(std::env::consts::ARCH.to_string()))?;
    let unix = SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, libc::AF_UNIX as u64)?;
    let rules = BTreeMap::from([(libc::SYS_socket, vec![SeccompRule::new(vec![unix])?])]);
    let filter = SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(libc::EACCES as u32), arch)?;
    let mut program = x32_guard();
    program.extend(BpfProgram::try_from(filter)?);
    Ok(program)
}

/// Installs `program` on the calling thread (for `pre_exec`: one `prctl` on memory prepared before the fork).
/// `no_new_privs` must already be set, as bubblewrap does.
pub fn install(program: &[sock_filter]) -> std::io::Result<()> {
    let prog = libc::sock_fprog { len: program.len() as u16, filter: program.as_ptr() as *mut libc::sock_filter };
    // SAFETY: `prog` points at `program`, alive for the call; the kernel copies it.
    if unsafe { libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &prog as *const libc::sock_fprog) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The filter bubblewrap gets, as a program for [`install`]: the Landlock sandbox (`landlock.rs`) stacks it itself.
pub fn sandbox_program() -> Result<BpfProgram, SeccompError> {
    program()
}

/// The whole program: the x32 guard, then the `EPERM` filter, then the `ENOSYS` one. seccompiler gives one
/// filter a single match action, so the two answers are two filters, chained.
fn program() -> Result<BpfProgram, SeccompError> {
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|_| SeccompError::UnsupportedArch(std::env::consts::ARCH.to_string()))?;
    let eperm =
        SeccompFilter::new(eperm_rules()?, SeccompAction::Allow, SeccompAction::Errno(libc::EPERM as u32), arch)?;
    let enosys = SeccompFilter::new(
        ENOSYS_CALLS.iter().map(|&nr| (nr, Vec::new())).collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )?;
    let mut program = x32_guard();
    program.extend(chain(eperm.try_into()?, enosys.try_into()?));
    if program.len() > MAX_INSTRUCTIONS {
        return Err(seccompiler::BackendError::FilterTooLarge(program.len()).into());
    }
    Ok(program)
}

fn eperm_rules() -> Result<BTreeMap<i64, Vec<SeccompRule>>, SeccompError> {
    // An empty rule list matches the call whatever its arguments.
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        DENIED.iter().filter_map(|name| syscall_number(name)).map(|nr| (nr, Vec::new())).collect();
    // One rule per flag: rules of a call are alternatives, the conditions of a rule all have to hold. The flags
    // are `clone`'s first argument on x86_64, aarch64 and riscv64, and the kernel reads only its low 32 bits.
    let clone = NAMESPACE_FLAGS
        .iter()
        .map(|&flag| {
            let flag = flag as u64;
            let condition = SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::MaskedEq(flag), flag)?;
            SeccompRule::new(vec![condition])
        })
        .collect::<Result<Vec<_>, _>>()?;
    rules.insert(libc::SYS_clone, clone);
    let other_persona = PERSONALITIES
        .iter()
        .map(|&persona| SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, persona))
        .collect::<Result<Vec<_>, _>>()?;
    rules.insert(libc::SYS_personality, vec![SeccompRule::new(other_persona)?]);
    let sandbox_pid = SANDBOX_PIDS
        .iter()
        .map(|&pid| SeccompRule::new(vec![SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, pid)?]))
        .collect::<Result<Vec<_>, _>>()?;
    rules.insert(libc::SYS_pidfd_open, sandbox_pid);
    Ok(rules)
}

/// Runs `second` wherever `first` would allow the call. BPF jumps only forward, and nothing in `first` jumps
/// past its end, so each "return allow" of `first` can become a jump to the start of `second`.
fn chain(first: BpfProgram, second: BpfProgram) -> BpfProgram {
    let len = first.len();
    let mut program: BpfProgram = first
        .into_iter()
        .enumerate()
        .map(|(index, insn)| {
            if insn.code == RET_K && insn.k == libc::SECCOMP_RET_ALLOW {
                sock_filter { code: JMP_JA, jt: 0, jf: 0, k: (len - index - 1) as u32 }
            } else {
                insn
            }
        })
        .collect();
    program.extend(second);
    program
}

#[cfg(any(target_arch = "x86_64", test))]
const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const JMP_JA: u16 = (libc::BPF_JMP | libc::BPF_JA) as u16;
#[cfg(target_arch = "x86_64")]
const JMP_JGE_K: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;

/// x32 calls pass the architecture check (they are x86_64's) under numbers none of the rules name, so they
/// are refused before the rules. It reads the number before checking the architecture, which is safe because
/// it only ever refuses: an i386 number never has bit 30 set and goes on to the architecture check.
fn x32_guard() -> BpfProgram {
    #[cfg(target_arch = "x86_64")]
    {
        vec![
            sock_filter { code: LD_W_ABS, jt: 0, jf: 0, k: 0 }, // seccomp_data.nr
            sock_filter { code: JMP_JGE_K, jt: 0, jf: 1, k: X32_SYSCALL_BIT },
            sock_filter { code: RET_K, jt: 0, jf: 0, k: libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32 },
        ]
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        Vec::new()
    }
}

fn serialize(program: &[sock_filter]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(program.len() * 8);
    for insn in program {
        bytes.extend_from_slice(&insn.code.to_ne_bytes());
        bytes.push(insn.jt);
        bytes.push(insn.jf);
        bytes.extend_from_slice(&insn.k.to_ne_bytes());
    }
    bytes
}

/// The host's number of a denied system call; `None` where the architecture has no such call.
fn syscall_number(name: &str) -> Option<i64> {
    let nr = match name {
        "ptrace" => libc::SYS_ptrace,
        "process_vm_readv" => libc::SYS_process_vm_readv,
        "process_vm_writev" => libc::SYS_process_vm_writev,
        "process_madvise" => libc::SYS_process_madvise,
        "pidfd_getfd" => libc::SYS_pidfd_getfd,
        "kcmp" => libc::SYS_kcmp,
        "keyctl" => libc::SYS_keyctl,
        "add_key" => libc::SYS_add_key,
        "request_key" => libc::SYS_request_key,
        "bpf" => libc::SYS_bpf,
        "perf_event_open" => libc::SYS_perf_event_open,
        "userfaultfd" => libc::SYS_userfaultfd,
        "mount" => libc::SYS_mount,
        "umount2" => libc::SYS_umount2,
        "pivot_root" => libc::SYS_pivot_root,
        "move_mount" => libc::SYS_move_mount,
        "open_tree" => libc::SYS_open_tree,
        "fsopen" => libc::SYS_fsopen,
        "fsmount" => libc::SYS_fsmount,
        "fsconfig" => libc::SYS_fsconfig,
        "fspick" => libc::SYS_fspick,
        "mount_setattr" => libc::SYS_mount_setattr,
        "unshare" => libc::SYS_unshare,
        "setns" => libc::SYS_setns,
        "open_by_handle_at" => libc::SYS_open_by_handle_at,
        "kexec_load" => libc::SYS_kexec_load,
        "kexec_file_load" => libc::SYS_kexec_file_load,
        "init_module" => libc::SYS_init_module,
        "finit_module" => libc::SYS_finit_module,
        "delete_module" => libc::SYS_delete_module,
        #[cfg(target_arch = "x86_64")]
        "iopl" => libc::SYS_iopl,
        #[cfg(target_arch = "x86_64")]
        "ioperm" => libc::SYS_ioperm,
        "acct" => libc::SYS_acct,
        "swapon" => libc::SYS_swapon,
        "swapoff" => libc::SYS_swapoff,
        "reboot" => libc::SYS_reboot,
        "syslog" => libc::SYS_syslog,
        "io_uring_setup" => libc::SYS_io_uring_setup,
        "io_uring_enter" => libc::SYS_io_uring_enter,
        "io_uring_register" => libc::SYS_io_uring_register,
        _ => return None,
    };
    Some(nr)
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, clippy::print_stderr)]
mod tests {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Output, Stdio};

    use super::*;

    const EPERM: u32 = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
    const ENOSYS: u32 = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
    const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
    #[cfg(target_arch = "x86_64")]
    const NATIVE_ARCH: u32 = 62 | 0x8000_0000 | 0x4000_0000; // AUDIT_ARCH_X86_64
    #[cfg(target_arch = "aarch64")]
    const NATIVE_ARCH: u32 = 183 | 0x8000_0000 | 0x4000_0000; // AUDIT_ARCH_AARCH64
    const I386_ARCH: u32 = 3 | 0x4000_0000; // AUDIT_ARCH_I386

    /// Decodes bubblewrap's input back into instructions, so the tests run exactly what bubblewrap gets.
    fn decode(bytes: &[u8]) -> Vec<sock_filter> {
        bytes
            .chunks_exact(8)
            .map(|b| sock_filter {
                code: u16::from_ne_bytes([b[0], b[1]]),
                jt: b[2],
                jf: b[3],
                k: u32::from_ne_bytes([b[4], b[5], b[6], b[7]]),
            })
            .collect()
    }

    /// A classic-BPF interpreter for the instructions a seccomp filter uses, over one `struct seccomp_data`.
    /// Anything else panics, so a filter using more than this is noticed.
    fn evaluate(program: &[sock_filter], arch: u32, nr: i64, args: [u64; 6]) -> u32 {
        let mut data = Vec::with_capacity(64);
        data.extend_from_slice(&(nr as i32).to_ne_bytes());
        data.extend_from_slice(&arch.to_ne_bytes());
        data.extend_from_slice(&0u64.to_ne_bytes()); // instruction pointer
        for arg in args {
            data.extend_from_slice(&arg.to_ne_bytes());
        }
        let mut acc: u32 = 0;
        let mut pc = 0usize;
        loop {
            let insn = &program[pc];
            let jump = |taken: bool| pc + 1 + if taken { insn.jt as usize } else { insn.jf as usize };
            pc = match insn.code {
                LD_W_ABS => {
                    let at = insn.k as usize;
                    acc = u32::from_ne_bytes(data[at..at + 4].try_into().unwrap());
                    pc + 1
                }
                0x54 => {
                    acc &= insn.k; // BPF_ALU | BPF_AND | BPF_K
                    pc + 1
                }
                JMP_JA => pc + 1 + insn.k as usize,
                0x15 => jump(acc == insn.k),     // JEQ
                0x25 => jump(acc > insn.k),      // JGT
                0x35 => jump(acc >= insn.k),     // JGE
                0x45 => jump(acc & insn.k != 0), // JSET
                RET_K => return insn.k,
                code => panic!("unexpected BPF instruction {code:#x} at {pc}"),
            };
        }
    }

    fn decide(nr: i64, arg0: u64) -> u32 {
        let program = decode(&filter_bytes().unwrap());
        evaluate(&program, NATIVE_ARCH, nr, [arg0, 0, 0, 0, 0, 0])
    }

    #[test]
    fn filter_is_a_whole_number_of_sock_filters() {
        let bytes = filter_bytes().unwrap();
        assert!(!bytes.is_empty());
        assert_eq!(bytes.len() % 8, 0);
        assert!(bytes.len() / 8 <= MAX_INSTRUCTIONS);
    }

    #[test]
    fn every_denied_name_is_a_system_call_of_this_architecture() {
        for name in DENIED {
            let x86_only = matches!(*name, "iopl" | "ioperm");
            let expected = !x86_only || cfg!(target_arch = "x86_64");
            assert_eq!(syscall_number(name).is_some(), expected, "{name}");
        }
    }

    #[test]
    fn denied_calls_answer_eperm_and_ordinary_ones_are_allowed() {
        for name in DENIED {
            if let Some(nr) = syscall_number(name) {
                assert_eq!(decide(nr, 0), EPERM, "{name}");
            }
        }
        for nr in [libc::SYS_read, libc::SYS_write, libc::SYS_openat, libc::SYS_getpid, libc::SYS_execve] {
            assert_eq!(decide(nr, 0), ALLOW, "syscall {nr}");
        }
        #[cfg(target_arch = "x86_64")]
        assert_eq!(decide(libc::SYS_fork, 0), ALLOW);
    }

    #[test]
    fn clone_is_refused_only_with_a_namespace_flag() {
        let sigchld = libc::SIGCHLD as u64;
        // glibc's fork() and pthread_create().
        let fork = (libc::CLONE_CHILD_SETTID | libc::CLONE_CHILD_CLEARTID) as u64 | sigchld;
        let thread = (libc::CLONE_VM
            | libc::CLONE_FS
            | libc::CLONE_FILES
            | libc::CLONE_SIGHAND
            | libc::CLONE_THREAD
            | libc::CLONE_SYSVSEM
            | libc::CLONE_SETTLS
            | libc::CLONE_PARENT_SETTID
            | libc::CLONE_CHILD_CLEARTID) as u64;
        let vfork = (libc::CLONE_VM | libc::CLONE_VFORK) as u64 | sigchld;
        for flags in [sigchld, fork, thread, vfork, 1 << 40 | sigchld] {
            assert_eq!(decide(libc::SYS_clone, flags), ALLOW, "flags {flags:#x}");
        }
        for &flag in NAMESPACE_FLAGS {
            assert_eq!(decide(libc::SYS_clone, flag as u64 | sigchld), EPERM, "flag {flag:#x}");
            assert_eq!(decide(libc::SYS_clone, flag as u64 | thread), EPERM, "flag {flag:#x}");
        }
        assert_eq!(decide(libc::SYS_clone3, 0), ENOSYS);
    }

    #[test]
    fn no_tool_gets_at_another_process() {
        for nr in [
            libc::SYS_ptrace,
            libc::SYS_process_vm_readv,
            libc::SYS_process_vm_writev,
            libc::SYS_process_madvise,
            libc::SYS_pidfd_getfd,
            libc::SYS_kcmp,
        ] {
            assert_eq!(decide(nr, 0), EPERM, "syscall {nr}");
        }
        assert_eq!(decide(libc::SYS_pidfd_open, 1), EPERM);
        assert_eq!(decide(libc::SYS_pidfd_open, 2), EPERM);
        // A tool's own children: Bun waits for them through pidfds.
        assert_eq!(decide(libc::SYS_pidfd_open, 3), ALLOW);
        assert_eq!(decide(libc::SYS_pidfd_open, 4242), ALLOW);
        // Signalling stays: `kill` is how a shell ends its jobs.
        assert_eq!(decide(libc::SYS_kill, 1), ALLOW);
        assert_eq!(decide(libc::SYS_pidfd_send_signal, 3), ALLOW);
    }

    #[test]
    fn personality_may_only_be_queried_or_reset() {
        for persona in [0xffff_ffff, 0, 8] {
            assert_eq!(decide(libc::SYS_personality, persona), ALLOW, "{persona:#x}");
        }
        let addr_no_randomize = 0x0040000;
        let read_implies_exec = 0x0400000;
        for persona in [addr_no_randomize, read_implies_exec, 8 | addr_no_randomize] {
            assert_eq!(decide(libc::SYS_personality, persona), EPERM, "{persona:#x}");
        }
    }

    #[test]
    fn other_abis_are_refused() {
        let program = decode(&filter_bytes().unwrap());
        let getpid = evaluate(&program, I386_ARCH, 20, [0; 6]);
        assert_eq!(getpid, libc::SECCOMP_RET_KILL_PROCESS);
        #[cfg(target_arch = "x86_64")]
        {
            let x32_ptrace = (X32_SYSCALL_BIT | 521) as i64;
            assert_eq!(evaluate(&program, NATIVE_ARCH, x32_ptrace, [0; 6]), ENOSYS);
        }
    }

    #[test]
    fn filter_fd_reads_back_the_filter_from_its_start() {
        use std::io::Read;
        let mut file = std::fs::File::from(filter_fd().unwrap());
        let mut read = Vec::new();
        file.read_to_end(&mut read).unwrap();
        assert_eq!(read, filter_bytes().unwrap());
    }

    /// Runs `argv` in a minimal bubblewrap sandbox, with or without the filter.
    fn bwrap(bwrap: &std::path::Path, seccomp: bool, argv: &[&str]) -> Output {
        let fd = filter_fd().unwrap();
        let raw = fd.as_raw_fd();
        let mut command = Command::new(bwrap);
        command.args(["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid"]);
        command.arg("--die-with-parent");
        if seccomp {
            command.args(["--seccomp", &raw.to_string()]);
            // SAFETY: one fcntl, async-signal-safe; `fd` outlives the spawn.
            unsafe {
                command.pre_exec(move || crate::sandbox::local::clear_cloexec(raw));
            }
        }
        let output = command.arg("--").args(argv).stdin(Stdio::null()).output().unwrap();
        drop(fd);
        output
    }

    /// Each check prints `name errno`; run as a python3 script.
    fn python_checks() -> String {
        format!(
            r#"
import ctypes, os, threading, time
libc = ctypes.CDLL(None, use_errno=True)
def call(name, *args):
    ctypes.set_errno(0)
    r = libc.syscall(*[ctypes.c_long(a) for a in args])
    print(name, 0 if r >= 0 else ctypes.get_errno(), flush=True)
    return r
child = os.fork()
if child == 0:
    time.sleep(30)
    os._exit(0)
call("ptrace_attach", {ptrace}, 16, child, 0, 0)
call("pidfd_open_child", {pidfd_open}, child, 0)
os.kill(child, 9)
os.waitpid(child, 0)
call("keyctl", {keyctl}, 0, -3, 0)
call("pidfd_open_pid_1", {pidfd_open}, 1, 0)
call("pidfd_getfd", {pidfd_getfd}, 0, 0, 0)
call("process_madvise", {process_madvise}, 0, 0, 0, 0, 0)
call("clone3", {clone3}, 0, 0)
r = call("clone_newuser", {clone}, {newuser} | 17, 0, 0, 0, 0)
if r == 0:
    os._exit(0)
if r > 0:
    os.waitpid(r, 0)
call("personality_query", {personality}, 0xffffffff)
call("personality_no_randomize", {personality}, 0x0040000)
params = ctypes.create_string_buffer(120)
call("io_uring_setup", {io_uring_setup}, 1, ctypes.addressof(params))
t = threading.Thread(target=lambda: None)
t.start()
t.join()
print("thread 0", flush=True)
"#,
            ptrace = libc::SYS_ptrace,
            keyctl = libc::SYS_keyctl,
            pidfd_open = libc::SYS_pidfd_open,
            pidfd_getfd = libc::SYS_pidfd_getfd,
            process_madvise = libc::SYS_process_madvise,
            clone3 = libc::SYS_clone3,
            clone = libc::SYS_clone,
            newuser = libc::CLONE_NEWUSER,
            personality = libc::SYS_personality,
            io_uring_setup = libc::SYS_io_uring_setup,
        )
    }

    fn errnos(output: &Output) -> std::collections::HashMap<String, i32> {
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| line.split_once(' '))
            // Without the filter the namespaced clone succeeds, and parent and child then print over each other.
            .filter_map(|(name, errno)| Some((name.to_string(), errno.trim().parse().ok()?)))
            .collect()
    }

    #[test]
    fn bubblewrap_installs_the_filter_and_ordinary_work_still_runs() {
        let bwrap_path = match crate::sandbox::local::bwrap::probe_bwrap() {
            Ok(path) => path,
            Err(why) => {
                eprintln!("skipped: {why}");
                return;
            }
        };
        let run = |seccomp, argv: &[&str]| bwrap(&bwrap_path, seccomp, argv);
        let script = python_checks();
        let python = ["/usr/bin/python3", "-c", script.as_str()];

        let filtered = run(true, &python);
        let stderr = String::from_utf8_lossy(&filtered.stderr);
        assert!(filtered.status.success(), "python under the filter: {stderr}");
        let got = errnos(&filtered);
        let expect = |name: &str, errno: i32| assert_eq!(got.get(name), Some(&errno), "{name} in {got:?}");
        expect("ptrace_attach", libc::EPERM);
        expect("keyctl", libc::EPERM);
        expect("pidfd_open_child", 0);
        expect("pidfd_open_pid_1", libc::EPERM);
        expect("pidfd_getfd", libc::EPERM);
        expect("process_madvise", libc::EPERM);
        expect("clone3", libc::ENOSYS);
        expect("clone_newuser", libc::EPERM);
        expect("personality_query", 0);
        expect("personality_no_randomize", libc::EPERM);
        expect("io_uring_setup", libc::EPERM);
        expect("thread", 0);

        // The same script without the filter shows that the filter, not the sandbox, refused those.
        let plain = errnos(&run(false, &python));
        assert_eq!(plain.get("ptrace_attach"), Some(&0), "{plain:?}");
        assert_eq!(plain.get("pidfd_open_pid_1"), Some(&0), "{plain:?}");
        assert_ne!(plain.get("clone3"), Some(&libc::ENOSYS), "{plain:?}");
        assert_eq!(plain.get("personality_no_randomize"), Some(&0), "{plain:?}");

        for argv in [&["unshare", "-U", "true"][..], &["unshare", "--mount", "true"]] {
            let output = run(true, argv);
            assert!(!output.status.success(), "{argv:?} succeeded under the filter");
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(stderr.contains("Operation not permitted"), "{argv:?}: {stderr}");
            if !run(false, argv).status.success() {
                eprintln!("{argv:?} fails here without the filter too: this check proves little");
            }
        }

        // node (libuv) spawns and waits under the filter as before.
        if std::path::Path::new("/usr/bin/node").exists() {
            let script = "const r = require('child_process').spawnSync('/bin/echo', ['spawned']); \
                          process.stdout.write(r.stdout.toString() + r.status)";
            let node = run(true, &["/usr/bin/node", "-e", script]);
            assert_eq!(
                String::from_utf8_lossy(&node.stdout),
                "spawned\n0",
                "{}",
                String::from_utf8_lossy(&node.stderr)
            );
        }

        let pipe = run(true, &["/bin/sh", "-c", "echo ok | cat"]);
        assert!(pipe.status.success());
        assert_eq!(String::from_utf8_lossy(&pipe.stdout), "ok\n");

        let status = run(true, &["cat", "/proc/self/status"]);
        let status = String::from_utf8_lossy(&status.stdout);
        let field = |name: &str| {
            status.lines().find_map(|line| line.strip_prefix(name)).map(str::trim).unwrap_or_default().to_string()
        };
        assert_eq!(field("Seccomp:"), "2", "{status}");
        assert_eq!(field("NoNewPrivs:"), "1", "{status}");
    }
}

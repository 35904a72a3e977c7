//! What keeps a warm server's own tools away from the server: a Landlock rule that forbids TCP connections to
//! the server's port, and a process that cannot be inspected.
//!
//! A server (`opencode serve`) runs its tools as its children, in its sandbox. Whoever reaches the server's API
//! can change what it asks before running a tool, so nothing of the sandbox but `sandbox-init` (which splices the
//! bridge's door to the port) may connect to it. `sandbox-init` applies [`PortGuard`] to the server just before
//! exec: a Landlock ruleset that handles `LANDLOCK_ACCESS_NET_CONNECT_TCP` and allows it on every port but the
//! server's. Landlock domains are inherited and can never be left, so every tool, and whatever a tool starts,
//! keeps the rule; the proxy port and the model ports `sandbox-init` opens stay reachable. Landlock checks the
//! port whatever the address (IPv4, IPv6, an IPv4-mapped one), so no other address of loopback gets around it.
//!
//! Being in a Landlock domain also means a tool cannot ptrace, nor read the `/proc/<pid>/mem`, `environ` or fds,
//! nor `pidfd_getfd` from, a process outside it: `sandbox-init` and bubblewrap's pid 1 stay out of every tool's
//! reach. [`set_undumpable`] makes `sandbox-init` non-dumpable as well, for kernels and cases where Landlock would
//! not say so (and for the `--sandbox none` subreaper, which has no Landlock).
//!
//! Landlock has no port ranges, so the ruleset holds 65,535 rules: measured on Linux 6.18, about 0.1 s to build
//! (a debug build, in `sandbox-init`, before the fork), 30 ms to apply, and 4 MiB of kernel memory per server.
//!
//! Landlock's network rules exist since ABI 4 (Linux 6.7). Where the kernel has none, [`PortGuard::new`] fails and
//! the bridge does not start a server (its turns use `opencode run`, which has no port to reach).

use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use landlock::{AccessNet, CompatLevel, Compatible, NetPort, Ruleset, RulesetAttr, RulesetCreatedAttr};

/// The first Landlock ABI with TCP rules.
pub const NET_ABI: i32 = 4;

/// Why the port guard cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    /// The kernel has no Landlock, or one without network rules.
    #[error("{0}")]
    Unsupported(String),
    /// Landlock refused the ruleset.
    #[error("building the Landlock ruleset: {0}")]
    Ruleset(#[from] landlock::RulesetError),
}

/// The Landlock ABI of the running kernel: 0 without Landlock (not built in, or not enabled at boot).
pub fn landlock_abi() -> i32 {
    // SAFETY: with a null attribute, size 0 and LANDLOCK_CREATE_RULESET_VERSION, the call only returns the ABI.
    let abi = unsafe {
        libc::syscall(libc::SYS_landlock_create_ruleset, std::ptr::null::<u8>(), 0usize, 1u32 /* VERSION */)
    };
    i32::try_from(abi).unwrap_or(0).max(0)
}

/// Whether this kernel can keep a server's tools off its port; `Err` says why not, in words for `doctor`.
pub fn port_guard_available() -> Result<i32, String> {
    match landlock_abi() {
        0 => {
            Err("the kernel has no Landlock (not built in, or not enabled at boot: `lsm=` on its command line)".into())
        }
        abi if abi < NET_ABI => {
            Err(format!("the kernel's Landlock is ABI {abi}; TCP rules need ABI {NET_ABI} (Linux 6.7)"))
        }
        abi => Ok(abi),
    }
}

/// The ports a server's tree may connect to: all but the server's own (pure, so it is unit-tested).
pub fn allowed_ports(server_port: u16) -> impl Iterator<Item = u16> {
    (0..=u16::MAX).filter(move |&port| port != server_port)
}

/// A Landlock ruleset, made before the fork, that a child applies to itself before exec.
pub struct PortGuard {
    ruleset: OwnedFd,
}

impl PortGuard {
    /// A ruleset that allows TCP connections to every port but `server_port`. Fails where the kernel cannot
    /// enforce it: a partial ruleset would let the tools in.
    pub fn new(server_port: u16) -> Result<Self, GuardError> {
        port_guard_available().map_err(GuardError::Unsupported)?;
        let created = Ruleset::default()
            .set_compatibility(CompatLevel::HardRequirement)
            .handle_access(AccessNet::ConnectTcp)?
            .create()?
            .add_rules(
                allowed_ports(server_port)
                    .map(|port| Ok::<_, landlock::RulesetError>(NetPort::new(port, AccessNet::ConnectTcp))),
            )?;
        let ruleset: Option<OwnedFd> = created.into();
        let ruleset = ruleset.ok_or_else(|| GuardError::Unsupported("Landlock made no ruleset".into()))?;
        Ok(PortGuard { ruleset })
    }

    /// The ruleset's fd, for [`restrict_self`] in the child.
    pub fn fd(&self) -> RawFd {
        self.ruleset.as_raw_fd()
    }
}

/// Puts the calling process (one thread: call it between fork and exec) in the ruleset's Landlock domain, with
/// `no_new_privs` as Landlock requires. Async-signal-safe: two system calls, no allocation.
pub fn restrict_self(ruleset: RawFd) -> std::io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the fd is a Landlock ruleset owned by the parent's `PortGuard`, which outlives the fork; flags 0.
    if unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0u32) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Makes this process non-dumpable: a process of the same user without `CAP_SYS_PTRACE` can then neither read
/// its `/proc/<pid>/mem`, `environ` or fds, nor `pidfd_getfd` from it, nor attach to it. Cleared by exec, so
/// it covers this process alone.
pub fn set_undumpable() -> std::io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Whether the Landlock crate's view and ours agree that `abi` has TCP rules (for the unit tests).
#[cfg(test)]
fn crate_knows_net(abi: i32) -> bool {
    use landlock::Access;
    !AccessNet::from_all(landlock::ABI::from(abi)).is_empty()
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, clippy::print_stderr)]
mod tests {
    use std::os::unix::process::CommandExt;

    use super::*;

    #[test]
    fn every_port_but_the_servers_is_allowed() {
        let allowed: Vec<u16> = allowed_ports(4096).collect();
        assert_eq!(allowed.len(), 65535);
        assert!(!allowed.contains(&4096));
        assert_eq!(allowed.first(), Some(&0));
        assert_eq!(allowed.last(), Some(&u16::MAX));
        assert!(allowed.contains(&4095) && allowed.contains(&4097) && allowed.contains(&3128));
        assert_eq!(allowed_ports(0).next(), Some(1));
        assert_eq!(allowed_ports(u16::MAX).last(), Some(u16::MAX - 1));
    }

    #[test]
    fn tcp_rules_begin_with_abi_4() {
        assert!(!crate_knows_net(NET_ABI - 1));
        assert!(crate_knows_net(NET_ABI));
    }

    /// Runs python in a child under the guard of `denied`: it connects to two listeners of this test and prints
    /// the errno of each connect.
    #[test]
    fn the_guarded_port_is_refused_and_others_are_not() {
        if let Err(why) = port_guard_available() {
            eprintln!("skipped: {why}");
            return;
        }
        let denied = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let (denied_port, other_port) = (denied.local_addr().unwrap().port(), other.local_addr().unwrap().port());
        let guard = PortGuard::new(denied_port).unwrap();
        let fd = guard.fd();
        let script = r#"
import socket, sys
for port in sys.argv[1:]:
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::ffff:127.0.0.1")):
        s = socket.socket(family)
        print(port, family == socket.AF_INET6, s.connect_ex((host, int(port))), flush=True)
        s.close()
"#;
        let mut command = std::process::Command::new("/usr/bin/python3");
        command.args(["-c", script, &denied_port.to_string(), &other_port.to_string()]);
        // SAFETY: two system calls in the child, on an fd the parent keeps open.
        unsafe {
            command.pre_exec(move || restrict_self(fd));
        }
        let output = command.output().unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let expected = format!(
            "{denied_port} False {eacces}\n{denied_port} True {eacces}\n{other_port} False 0\n{other_port} True 0\n",
            eacces = libc::EACCES
        );
        assert_eq!(String::from_utf8_lossy(&output.stdout), expected);
        // The test process itself was never restricted.
        assert!(std::net::TcpStream::connect(("127.0.0.1", denied_port)).is_ok());
    }

    #[test]
    fn undumpable_hides_the_process_from_its_own_user() {
        if nix::unistd::getuid().is_root() {
            // Root keeps CAP_SYS_PTRACE, which reads a non-dumpable process all the same; bubblewrap drops it.
            eprintln!("skipped: root reads non-dumpable processes");
            return;
        }
        let script =
            "import ctypes, os, sys, time\nctypes.CDLL(None).prctl(4, 0, 0, 0, 0)\nprint(flush=True)\ntime.sleep(30)";
        let mut child = std::process::Command::new("/usr/bin/python3")
            .args(["-c", script])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
        let read = std::fs::read(format!("/proc/{}/environ", child.id()));
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(read.unwrap_err().kind(), std::io::ErrorKind::PermissionDenied);
    }
}

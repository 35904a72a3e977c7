//! Per-session limits on processes and memory: a cgroup of the session's own where one can be made,
//! `RLIMIT_NPROC` otherwise. Every command of a session (an agent and the terminals it runs through the bridge)
//! shares one budget.
//!
//! [`probe`] decides once per bridge what works here ([`Enforcement`]). For each running command the caller
//! makes a [`SandboxCgroup`], a group of its own inside the session's group (`acp-sandbox/<session>/<command>`,
//! the limits written on the session's), and joins its child to it in `pre_exec`
//! ([`SandboxCgroup::pre_exec_join`]), or, with only rlimits, lowers `RLIMIT_NPROC` there ([`rlimit_pre_exec`], to
//! a ceiling the session's running commands share, [`Ceiling`]). Dropping the cgroup kills whatever is still in it
//! and removes it (and the session's group once no command is in it). The groups are made under the bridge's own
//! cgroup, so they stay inside whatever limits the bridge itself runs under.
//!
//! Both limits count threads as well as processes (`pids.max` and `RLIMIT_NPROC` count tasks).

use std::ffi::CString;
use std::io::ErrorKind;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// A limits failure.
#[derive(Debug, thiserror::Error)]
pub enum LimitsError {
    /// A size that [`parse_size`] does not understand.
    #[error("invalid size {0:?}: expected a whole number with an optional unit B, K, M, G or T (plain = MiB)")]
    InvalidSize(String),
    /// A sandbox cgroup name that is not one path component.
    #[error("invalid sandbox cgroup name {0:?}")]
    InvalidName(String),
    /// A cgroup file or directory could not be made or written.
    #[error("cgroup: {what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
}

impl LimitsError {
    fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        LimitsError::Io { what: what.into(), source }
    }
}

/// How much one sandbox may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Processes and threads at once.
    pub max_processes: u64,
    /// Memory in bytes, swap excluded (the sandbox may not swap where the kernel can say so).
    pub max_memory_bytes: u64,
}

impl Default for Limits {
    /// 4096 processes and half of the machine's memory (4 GiB when `/proc/meminfo` cannot be read).
    fn default() -> Self {
        let total = std::fs::read_to_string("/proc/meminfo").ok().and_then(|text| mem_total(&text));
        Limits { max_processes: 4096, max_memory_bytes: total.map_or(4 << 30, |bytes| bytes / 2) }
    }
}

/// `MemTotal` of a `/proc/meminfo` text, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find_map(|line| line.strip_prefix("MemTotal:"))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    kib.checked_mul(1024)
}

/// Parses a memory size: a whole number with an optional binary unit, `B` (bytes), `K`, `M`, `G` or `T`
/// (`KB`/`KiB` and so on are the same). A plain number is MiB: nobody means 1024 bytes for a sandbox, and
/// `--memory 2048` reads naturally as 2 GiB. Zero is refused.
pub fn parse_size(text: &str) -> Result<u64, LimitsError> {
    let invalid = || LimitsError::InvalidSize(text.to_string());
    let trimmed = text.trim();
    let split = trimmed.find(|c: char| !c.is_ascii_digit()).unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(split);
    let number: u64 = digits.parse().map_err(|_| invalid())?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "m" | "mb" | "mib" => 20,
        "b" => 0,
        "k" | "kb" | "kib" => 10,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(invalid()),
    };
    match number.checked_mul(1 << shift) {
        Some(bytes) if bytes > 0 => Ok(bytes),
        _ => Err(invalid()),
    }
}

/// A size for people: "12 GiB", "1.5 GiB", "64 MiB", "512 KiB", "100 bytes".
pub fn format_size(bytes: u64) -> String {
    for (unit, shift) in [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        let size = 1u64 << shift;
        if bytes >= size {
            return if bytes.is_multiple_of(size) {
                format!("{} {unit}", bytes / size)
            } else {
                format!("{:.1} {unit}", bytes as f64 / size as f64)
            };
        }
    }
    format!("{bytes} bytes")
}

/// What can enforce [`Limits`] on this machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Enforcement {
    /// A cgroup v2 group per sandbox under `dir/acp-sandbox/`, `dir` being the bridge's own cgroup (which the
    /// bridge may have left for a leaf `dir/bridge`, see [`probe`]).
    CgroupV2 {
        /// The bridge's own cgroup directory.
        dir: PathBuf,
    },
    /// A group per sandbox in each of the v1 `pids` and `memory` hierarchies, under the bridge's own group in
    /// each, in `acp-sandbox/`.
    CgroupV1 {
        /// The bridge's own cgroup in the pids hierarchy.
        pids: PathBuf,
        /// The bridge's own cgroup in the memory hierarchy.
        memory: PathBuf,
    },
    /// Only `RLIMIT_NPROC`: a process count, and no memory limit at all.
    Rlimit,
    /// Nothing; the string says why.
    None(String),
}

impl Enforcement {
    /// One line for logs and `doctor`.
    pub fn describe(&self, limits: &Limits) -> String {
        let processes = limits.max_processes;
        let memory = format_size(limits.max_memory_bytes);
        match self {
            Enforcement::CgroupV2 { dir } => {
                format!("cgroup v2 ({}/acp-sandbox): at most {processes} processes and {memory}", dir.display())
            }
            Enforcement::CgroupV1 { .. } => {
                format!("cgroup v1 (pids, memory): at most {processes} processes and {memory}")
            }
            Enforcement::Rlimit => {
                format!("RLIMIT_NPROC only: at most {processes} processes, memory NOT limited (no delegated cgroup)")
            }
            Enforcement::None(why) => format!("NO process or memory limit ({why})"),
        }
    }
}

/// Decides once per process (the answer is cached) how limits are enforced here:
///
/// 1. cgroup v2, when the bridge's own cgroup is writable and offers the `pids` and `memory` controllers. The
///    v2 "no internal processes" rule forbids enabling controllers for children of a group that has processes
///    of its own, so when the bridge is alone in its group it first moves itself into a leaf `<own>/bridge`;
///    with other processes there it falls back.
/// 2. cgroup v1, when groups can be made in both the `pids` and `memory` hierarchies (root).
/// 3. `RLIMIT_NPROC`, for a user other than root (the limit does not apply to root).
/// 4. Nothing, with the reasons.
pub fn probe() -> Enforcement {
    static PROBE: OnceLock<Enforcement> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            let enforcement = decide();
            tracing::debug!(?enforcement, "resource limits");
            enforcement
        })
        .clone()
}

fn decide() -> Enforcement {
    let own = std::fs::read_to_string("/proc/self/cgroup").map(|text| parse_proc_cgroup(&text)).unwrap_or_default();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").map(|text| parse_mountinfo(&text)).unwrap_or_default();
    let v2 = match prepare_v2(&own, &mounts) {
        Ok(dir) => return Enforcement::CgroupV2 { dir },
        Err(why) => why,
    };
    let v1 = match prepare_v1(&own, &mounts) {
        Ok((pids, memory)) => return Enforcement::CgroupV1 { pids, memory },
        Err(why) => why,
    };
    if !nix::unistd::geteuid().is_root() {
        return Enforcement::Rlimit;
    }
    Enforcement::None(format!("{v2}; {v1}; RLIMIT_NPROC does not apply to root"))
}

/// The bridge's place in each hierarchy, from `/proc/self/cgroup`.
#[derive(Debug, Default, PartialEq, Eq)]
struct OwnCgroups {
    /// The `0::/path` line.
    v2: Option<String>,
    /// (controllers of a v1 hierarchy, path), e.g. (["cpu", "cpuacct"], "/").
    v1: Vec<(Vec<String>, String)>,
}

impl OwnCgroups {
    fn v1_path(&self, controller: &str) -> Option<&str> {
        self.v1.iter().find(|(controllers, _)| controllers.iter().any(|c| c == controller)).map(|(_, p)| p.as_str())
    }
}

fn parse_proc_cgroup(text: &str) -> OwnCgroups {
    let mut own = OwnCgroups::default();
    for line in text.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (fields.next(), fields.next(), fields.next()) else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            own.v2 = Some(path.to_string());
        } else if !controllers.is_empty() {
            let controllers = controllers.split(',').map(str::to_string).collect();
            own.v1.push((controllers, path.to_string()));
        }
    }
    own
}

/// A cgroup file system mounted here, from `/proc/self/mountinfo`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct CgroupMount {
    /// The cgroup that appears at the mount point ("/" unless a sub-tree is mounted).
    root: String,
    mount_point: PathBuf,
    /// `None` for cgroup2, the controllers of a v1 hierarchy otherwise.
    controllers: Option<Vec<String>>,
}

fn parse_mountinfo(text: &str) -> Vec<CgroupMount> {
    let mut mounts = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        // Optional fields (shared:N, master:N) run up to a lone "-"; the file system type follows it.
        let Some(dash) = fields.iter().position(|f| *f == "-") else { continue };
        let (Some(root), Some(mount_point)) = (fields.get(3), fields.get(4)) else { continue };
        let (Some(fstype), Some(options)) = (fields.get(dash + 1), fields.get(dash + 3)) else { continue };
        let controllers = match *fstype {
            "cgroup2" => None,
            "cgroup" => Some(options.split(',').map(str::to_string).collect()),
            _ => continue,
        };
        mounts.push(CgroupMount {
            root: unescape_mountinfo(root),
            mount_point: PathBuf::from(unescape_mountinfo(mount_point)),
            controllers,
        });
    }
    mounts
}

/// mountinfo writes space, tab, newline and backslash as `\ooo` octal escapes.
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal =
            bytes.get(i + 1..i + 4).filter(|d| bytes[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match octal {
            Some(d) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Where the cgroup `path` (as `/proc/self/cgroup` names it) is found under `mount`; `None` when the mount
/// shows a sub-tree that does not contain it.
fn cgroup_dir(mount: &CgroupMount, path: &str) -> Option<PathBuf> {
    let path = path.trim_end_matches(" (deleted)");
    let rest = if mount.root == "/" { path } else { path.strip_prefix(mount.root.as_str())? };
    if !(rest.is_empty() || rest.starts_with('/')) {
        return None;
    }
    Some(mount.mount_point.join(rest.trim_start_matches('/')))
}

const V2_CONTROLLERS: &str = "+pids +memory";

fn prepare_v2(own: &OwnCgroups, mounts: &[CgroupMount]) -> Result<PathBuf, String> {
    let path = own.v2.as_deref().ok_or("no cgroup v2 membership in /proc/self/cgroup")?;
    let mount = mounts.iter().find(|m| m.controllers.is_none()).ok_or("no cgroup v2 mounted")?;
    let dir = cgroup_dir(mount, path).ok_or_else(|| format!("cgroup v2: {path} is not under the mount"))?;
    let controllers = std::fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
    let offered: Vec<&str> = controllers.split_whitespace().collect();
    if !(offered.contains(&"pids") && offered.contains(&"memory")) {
        return Err(format!("cgroup v2: {} does not offer the pids and memory controllers", dir.display()));
    }
    enable_v2_controllers(&dir).map_err(|e| format!("cgroup v2: {}: {e}", dir.display()))?;
    let parent = dir.join("acp-sandbox");
    ensure_v2_parent(&parent).map_err(|e| format!("cgroup v2: {e}"))?;
    // Made again by each sandbox: an empty one left behind would keep the bridge's own group from being removed.
    let _ = std::fs::remove_dir(&parent);
    Ok(dir)
}

/// Enables pids and memory for the children of the bridge's own group, moving the bridge into `<dir>/bridge`
/// when it has to (it is then no longer an internal process of `dir`).
fn enable_v2_controllers(dir: &Path) -> Result<(), String> {
    let subtree = dir.join("cgroup.subtree_control");
    let enabled = std::fs::read_to_string(&subtree).unwrap_or_default();
    if enabled.split_whitespace().filter(|c| *c == "pids" || *c == "memory").count() == 2 {
        return Ok(());
    }
    match std::fs::write(&subtree, V2_CONTROLLERS) {
        Ok(()) => return Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
        Err(e) => return Err(format!("enable controllers: {e}")),
    }
    let procs = read_pids(&dir.join("cgroup.procs"));
    let own = std::process::id() as i32;
    if procs.iter().any(|&pid| pid != own) {
        return Err(format!("other processes share the bridge's cgroup ({} of them)", procs.len() - 1));
    }
    let leaf = dir.join("bridge");
    match std::fs::create_dir(&leaf) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("create {}: {e}", leaf.display())),
    }
    std::fs::write(leaf.join("cgroup.procs"), own.to_string())
        .map_err(|e| format!("move into {}: {e}", leaf.display()))?;
    tracing::debug!("moved the bridge into {} to enable cgroup controllers for sandboxes", leaf.display());
    std::fs::write(&subtree, V2_CONTROLLERS).map_err(|e| format!("enable controllers: {e}"))
}

/// Makes `<dir>/acp-sandbox` with pids and memory enabled for its children; idempotent.
fn ensure_v2_parent(parent: &Path) -> Result<(), LimitsError> {
    make_dir(parent)?;
    let subtree = parent.join("cgroup.subtree_control");
    write_file(&subtree, V2_CONTROLLERS)
}

fn prepare_v1(own: &OwnCgroups, mounts: &[CgroupMount]) -> Result<(PathBuf, PathBuf), String> {
    let dir_of = |controller: &str| {
        let mount = mounts
            .iter()
            .find(|m| m.controllers.as_ref().is_some_and(|c| c.iter().any(|c| c == controller)))
            .ok_or_else(|| format!("cgroup v1: no {controller} hierarchy mounted"))?;
        let path = own.v1_path(controller).ok_or_else(|| format!("cgroup v1: not in a {controller} cgroup"))?;
        let dir = cgroup_dir(mount, path).ok_or_else(|| format!("cgroup v1: {path} is not under the mount"))?;
        let parent = dir.join("acp-sandbox");
        make_dir(&parent).map_err(|e| format!("cgroup v1: {e}"))?;
        // Made again by each sandbox: an empty one left behind would keep the bridge's own group from being
        // removed.
        let _ = std::fs::remove_dir(&parent);
        Ok::<_, String>(dir)
    };
    Ok((dir_of("pids")?, dir_of("memory")?))
}

/// A closure for `pre_exec` that lowers `RLIMIT_NPROC` in the child, for [`Enforcement::Rlimit`].
///
/// `RLIMIT_NPROC` limits all the tasks of the real user id, across the whole machine, not those of one
/// sandbox: the limit is set to what the user runs now plus `max_processes`, counted here, before the fork.
/// It never raises the hard limit, and lowers it too, so the sandbox cannot undo it. Root (and anything with
/// `CAP_SYS_RESOURCE`) ignores it.
pub fn rlimit_pre_exec(ceiling: &Ceiling) -> impl FnMut() -> std::io::Result<()> + Send + Sync + 'static {
    let nproc = ceiling.0;
    move || {
        let mut current = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit and setrlimit are async-signal-safe system calls on a stack value; nothing allocates.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NPROC, &mut current) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let value = nproc.min(current.rlim_max);
            if libc::setrlimit(libc::RLIMIT_NPROC, &libc::rlimit { rlim_cur: value, rlim_max: value }) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// Raises this process's soft `RLIMIT_NOFILE` to its hard limit, once at startup: the bridge carries two
/// descriptors per proxied connection of every sandbox, and the usual soft limit of 1024 is reached by a few busy
/// sessions. Returns the soft limit before and after.
pub fn raise_open_files_limit() -> std::io::Result<(u64, u64)> {
    let mut current = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit take a pointer to a stack value.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut current) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let before = current.rlim_cur;
        if current.rlim_cur < current.rlim_max {
            let raised = libc::rlimit { rlim_cur: current.rlim_max, rlim_max: current.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok((before, current.rlim_max))
    }
}

/// The `RLIMIT_NPROC` value of a session's commands: what the user ran when the first of them started, plus the
/// session's `max_processes`. While any of them runs, the next one gets the same value, so that the agent and its
/// terminals share one budget; it is counted anew once none runs. Held by each running command.
#[derive(Debug)]
pub struct Ceiling(u64);

impl Ceiling {
    /// The ceiling the session's running commands share (`shared`), or a new one when none runs.
    pub fn shared(shared: &std::sync::Mutex<std::sync::Weak<Ceiling>>, limits: &Limits) -> std::sync::Arc<Ceiling> {
        let mut shared = shared.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(ceiling) = shared.upgrade() {
            return ceiling;
        }
        let ceiling = std::sync::Arc::new(Ceiling(
            user_tasks(nix::unistd::getuid().as_raw()).saturating_add(limits.max_processes),
        ));
        *shared = std::sync::Arc::downgrade(&ceiling);
        ceiling
    }
}

/// Tasks (threads included, as `RLIMIT_NPROC` counts them) whose real user id is `uid`.
fn user_tasks(uid: u32) -> u64 {
    let Ok(entries) = std::fs::read_dir("/proc") else { return 0 };
    let mut count = 0;
    for entry in entries.flatten() {
        if !entry.file_name().as_bytes().iter().all(u8::is_ascii_digit) {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else { continue };
        let field = |name: &str| status.lines().find_map(|line| line.strip_prefix(name)).map(str::trim);
        let real_uid = field("Uid:").and_then(|uids| uids.split_whitespace().next()).and_then(|u| u.parse().ok());
        if real_uid == Some(uid) {
            count += field("Threads:").and_then(|t| t.parse::<u64>().ok()).unwrap_or(1);
        }
    }
    count
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Version {
    V2,
    V1,
}

/// The cgroup(s) of one running command, inside its session's. Dropping it kills every process still in it and
/// removes it.
#[derive(Debug)]
pub struct SandboxCgroup {
    version: Version,
    /// v2: the one group; v1: the pids group, then the memory group.
    dirs: Vec<PathBuf>,
    /// The session's group(s) above `dirs`, which hold the limits.
    sessions: Vec<PathBuf>,
    /// The session's event counters when this command started: what its commands hit before is not this one's.
    before: Hits,
    /// `cgroup.procs` of each dir, ready for the child between fork and exec.
    procs: Vec<CString>,
    limits: Limits,
}

impl SandboxCgroup {
    /// Makes the command's group `<base>/acp-sandbox/<session>/<name>` and writes the limits on the session's
    /// group `<base>/acp-sandbox/<session>`, which every command of the session shares; `None` when `enforcement`
    /// is not a cgroup. `session` and `name` are each one path component, `name` unique among the session's running
    /// commands. A group of that name left by an earlier bridge is emptied and reused.
    pub fn create(
        enforcement: &Enforcement,
        session: &str,
        name: &str,
        limits: &Limits,
    ) -> Result<Option<Self>, LimitsError> {
        for part in [session, name] {
            if part.is_empty() || part == "." || part == ".." || part.contains(['/', '\0']) {
                return Err(LimitsError::InvalidName(part.to_string()));
            }
        }
        let (version, bases) = match enforcement {
            Enforcement::CgroupV2 { dir } => (Version::V2, vec![dir.clone()]),
            Enforcement::CgroupV1 { pids, memory } => (Version::V1, vec![pids.clone(), memory.clone()]),
            Enforcement::Rlimit | Enforcement::None(_) => return Ok(None),
        };
        let mut group = SandboxCgroup {
            version,
            dirs: Vec::new(),
            sessions: Vec::new(),
            before: Hits::default(),
            procs: Vec::new(),
            limits: *limits,
        };
        for base in bases {
            let session_dir = base.join("acp-sandbox").join(session);
            let dir = session_dir.join(name);
            // pids and memory mounted together in one v1 hierarchy give one group.
            if group.dirs.contains(&dir) {
                continue;
            }
            make_group(version, &session_dir)?;
            group.sessions.push(session_dir.clone());
            if version == Version::V2 {
                // The command's group gets its own counters (`pids.events`, `memory.events`).
                ensure_v2_parent(&session_dir)?;
            }
            make_group(version, &dir)?;
            group.procs.push(
                CString::new(dir.join("cgroup.procs").as_os_str().as_bytes())
                    .map_err(|_| LimitsError::InvalidName(name.to_string()))?,
            );
            group.dirs.push(dir);
        }
        // A leftover of a killed bridge.
        if !group.pids().is_empty() {
            tracing::warn!(name, "a sandbox cgroup still had processes: killing them");
            group.kill_all();
        }
        // From here on, a failure drops `group`, which removes what was made.
        let processes = limits.max_processes.to_string();
        let memory = limits.max_memory_bytes.to_string();
        // The same values again when another command of the session runs: the budget is the session's.
        match version {
            Version::V2 => {
                let dir = &group.sessions[0];
                write_file(&dir.join("pids.max"), &processes)?;
                write_file(&dir.join("memory.max"), &memory)?;
                write_if_present(&dir.join("memory.swap.max"), "0")?;
            }
            Version::V1 => {
                let pids = group.session_with("pids.max");
                let memory_dir = group.session_with("memory.limit_in_bytes");
                let (Some(pids), Some(memory_dir)) = (pids, memory_dir) else {
                    let missing = std::io::Error::new(ErrorKind::NotFound, "no pids.max or memory.limit_in_bytes");
                    return Err(LimitsError::io(format!("limit {name}"), missing));
                };
                write_file(&pids.join("pids.max"), &processes)?;
                // memory+swap may never be below memory: lift it, set memory, then bring it down to the same
                // value, which forbids swapping (the file exists only with swap accounting on).
                let memsw = memory_dir.join("memory.memsw.limit_in_bytes");
                write_if_present(&memsw, "-1")?;
                write_file(&memory_dir.join("memory.limit_in_bytes"), &memory)?;
                write_if_present(&memsw, &memory)?;
            }
        }
        group.before = group.session_hits();
        tracing::debug!(dirs = ?group.dirs, ?limits, "sandbox cgroup");
        Ok(Some(group))
    }

    /// The group directories (v2: one; v1: pids, then memory).
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// A closure for `pre_exec` that moves the child into the group: it opens each `cgroup.procs` and writes
    /// "0" (the calling process). The paths are prepared here, before the fork; the closure only makes
    /// async-signal-safe system calls and allocates nothing.
    pub fn pre_exec_join(&self) -> impl FnMut() -> std::io::Result<()> + Send + Sync + 'static {
        let procs = self.procs.clone();
        move || {
            for path in &procs {
                // SAFETY: `path` is a NUL-terminated string that outlives the calls; open, write and close are
                // async-signal-safe; the error is read before close can change errno.
                unsafe {
                    let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                    let error = std::io::Error::last_os_error();
                    libc::close(fd);
                    if written != 1 {
                        return Err(error);
                    }
                }
            }
            Ok(())
        }
    }

    /// The processes in the group now.
    pub fn pids(&self) -> Vec<i32> {
        let mut pids: Vec<i32> = self.dirs.iter().flat_map(|dir| read_pids(&dir.join("cgroup.procs"))).collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Whether the sandbox ran into its limits, in words for the turn's error: "the sandbox hit its memory limit
    /// (64 MiB)", "... its process limit (20)", or both. Reads the group's event counters (v2 `memory.events`
    /// `oom_kill`, v1 `memory.oom_control` `oom_kill`, or `memory.failcnt` on kernels without it; `pids.events`
    /// `max` in both).
    ///
    /// The limits are the session's: a hit of the session's group since this command started counts too (another
    /// command of the session may have spent the budget).
    pub fn oom_or_pids_hit(&self) -> Option<String> {
        let own = hits(self.version, &self.dirs);
        let session = self.session_hits();
        let memory_hit = own.memory > 0 || session.memory > self.before.memory;
        let pids_hit = own.pids > 0 || session.pids > self.before.pids;
        let memory = format!("its memory limit ({})", format_size(self.limits.max_memory_bytes));
        let processes = format!("its process limit ({})", self.limits.max_processes);
        match (memory_hit, pids_hit) {
            (true, true) => Some(format!("the sandbox hit {memory} and {processes}")),
            (true, false) => Some(format!("the sandbox hit {memory}")),
            (false, true) => Some(format!("the sandbox hit {processes}")),
            (false, false) => None,
        }
    }

    fn session_with(&self, file: &str) -> Option<&Path> {
        self.sessions.iter().find(|dir| dir.join(file).exists()).map(PathBuf::as_path)
    }

    fn session_hits(&self) -> Hits {
        hits(self.version, &self.sessions)
    }

    /// SIGKILLs everything in the group until it is empty, for up to about two seconds; the group stays (e.g. to
    /// end a cancelled turn's tree at once). Each round kills what it sees; a killed process forks no more, so a
    /// fork bomb runs out within a few rounds. Blocks while it waits.
    pub fn kill_all(&self) {
        if self.version == Version::V2 {
            let _ = write_if_present(&self.dirs[0].join("cgroup.kill"), "1");
        }
        for _ in 0..200 {
            // A dead process stays listed until its parent (or init) reaps it: only the living need a signal.
            let pids: Vec<i32> = self.pids().into_iter().filter(|pid| !is_zombie(*pid)).collect();
            if pids.is_empty() {
                return;
            }
            for pid in pids {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        tracing::warn!(dirs = ?self.dirs, "processes survived in a sandbox cgroup");
    }
}

/// How often a group (and its children) ran into its limits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Hits {
    memory: u64,
    pids: u64,
}

/// The event counters of the group `dirs` (v2: one; v1: pids, then memory): v2 `memory.events` `oom_kill`, v1
/// `memory.oom_control` `oom_kill`, or `memory.failcnt` on kernels without it; `pids.events` `max` in both.
fn hits(version: Version, dirs: &[PathBuf]) -> Hits {
    let counter = |file: &str, key: Option<&str>| -> Option<u64> {
        let dir = dirs.iter().find(|dir| dir.join(file).exists())?;
        let text = std::fs::read_to_string(dir.join(file)).ok()?;
        match key {
            Some(key) => keyed_value(&text, key),
            None => text.trim().parse().ok(),
        }
    };
    let memory = match version {
        Version::V2 => counter("memory.events", Some("oom_kill")).or_else(|| counter("memory.events", Some("oom"))),
        Version::V1 => counter("memory.oom_control", Some("oom_kill")).or_else(|| counter("memory.failcnt", None)),
    };
    Hits { memory: memory.unwrap_or(0), pids: counter("pids.events", Some("max")).unwrap_or(0) }
}

/// Whether a process has exited and waits to be reaped (or is gone already).
fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])))
        .unwrap_or(true)
}

impl Drop for SandboxCgroup {
    /// Kills what is left and removes the group, and `acp-sandbox/` above it once no sandbox uses it (a cgroup
    /// with children cannot be removed, and the bridge's own group may belong to someone who wants it gone).
    /// Blocks for a moment at most.
    fn drop(&mut self) {
        self.kill_all();
        for dir in &self.dirs {
            // A killed process leaves its group a moment after the signal.
            let mut removed = false;
            for _ in 0..50 {
                match std::fs::remove_dir(dir) {
                    Ok(()) => {
                        removed = true;
                        break;
                    }
                    Err(e) if e.kind() == ErrorKind::NotFound => {
                        removed = true;
                        break;
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
            if !removed {
                tracing::warn!("cannot remove the sandbox cgroup {}", dir.display());
            }
            // The session's group, once no other command of it runs, then `acp-sandbox/`.
            for parent in dir.ancestors().skip(1).take(2) {
                let _ = std::fs::remove_dir(parent);
            }
        }
    }
}

/// Makes a sandbox group, with its parent `acp-sandbox` (and, in v2, the parent's controllers). Another bridge
/// may remove the parent, empty, between the two: that is retried.
fn make_group(version: Version, dir: &Path) -> Result<(), LimitsError> {
    let parent = dir.parent().unwrap_or(dir);
    let mut last = None;
    for _ in 0..5 {
        let made = if version == Version::V2 { ensure_v2_parent(parent) } else { make_dir(parent) };
        if let Err(e) = made {
            last = Some(e);
            continue;
        }
        match std::fs::create_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => return Ok(()),
            Err(e) => last = Some(LimitsError::io(format!("create {}", dir.display()), e)),
        }
    }
    Err(last.unwrap_or_else(|| LimitsError::io(format!("create {}", dir.display()), ErrorKind::Other.into())))
}

fn make_dir(dir: &Path) -> Result<(), LimitsError> {
    match std::fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(LimitsError::io(format!("create {}", dir.display()), e)),
    }
}

fn write_file(path: &Path, value: &str) -> Result<(), LimitsError> {
    std::fs::write(path, value).map_err(|e| LimitsError::io(format!("write {value} to {}", path.display()), e))
}

fn write_if_present(path: &Path, value: &str) -> Result<(), LimitsError> {
    if path.exists() { write_file(path, value) } else { Ok(()) }
}

fn read_pids(path: &Path) -> Vec<i32> {
    std::fs::read_to_string(path).unwrap_or_default().lines().filter_map(|line| line.trim().parse().ok()).collect()
}

/// The number after `key` in a flat keyed file such as `memory.events` ("oom_kill 3").
fn keyed_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (name, value) = line.split_once(' ')?;
        if name == key { value.trim().parse().ok() } else { None }
    })
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, clippy::print_stderr)]
mod tests {
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    use std::process::{Command, Stdio};

    use super::*;

    #[test]
    fn sizes_have_binary_units_and_plain_numbers_are_mib() {
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("8G").unwrap(), 8 << 30);
        assert_eq!(parse_size("1024").unwrap(), 1 << 30);
        assert_eq!(parse_size(" 2 GiB ").unwrap(), 2 << 30);
        assert_eq!(parse_size("64mb").unwrap(), 64 << 20);
        assert_eq!(parse_size("1k").unwrap(), 1024);
        assert_eq!(parse_size("1T").unwrap(), 1 << 40);
        assert_eq!(parse_size("100B").unwrap(), 100);
        for bad in ["", "0", "0G", "-1", "G", "1.5G", "12X", "99999999999T"] {
            assert!(matches!(parse_size(bad), Err(LimitsError::InvalidSize(_))), "{bad:?}");
        }
    }

    #[test]
    fn sizes_print_for_people() {
        assert_eq!(format_size(12 << 30), "12 GiB");
        assert_eq!(format_size(3 << 29), "1.5 GiB");
        assert_eq!(format_size(64 << 20), "64 MiB");
        assert_eq!(format_size(100), "100 bytes");
    }

    #[test]
    fn default_memory_is_half_of_mem_total() {
        let meminfo = "MemTotal:       24683652 kB\nMemFree:        15658812 kB\n";
        assert_eq!(mem_total(meminfo), Some(24683652 * 1024));
        assert_eq!(mem_total("MemFree: 1 kB\n"), None);
        let limits = Limits::default();
        assert_eq!(limits.max_processes, 4096);
        let total = mem_total(&std::fs::read_to_string("/proc/meminfo").unwrap()).unwrap();
        assert_eq!(limits.max_memory_bytes, total / 2);
    }

    #[test]
    fn proc_cgroup_gives_the_v2_path_and_each_v1_hierarchy() {
        let text =
            "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/baff\n2:cpu,cpuacct:/a:b\n0::/user.slice/x.scope\n";
        let own = parse_proc_cgroup(text);
        assert_eq!(own.v2.as_deref(), Some("/user.slice/x.scope"));
        assert_eq!(own.v1_path("pids"), Some("/"));
        assert_eq!(own.v1_path("memory"), Some("/process_api/baff"));
        assert_eq!(own.v1_path("cpuacct"), Some("/a:b"));
        assert_eq!(own.v1_path("systemd"), None);
        assert_eq!(parse_proc_cgroup("0::/\n").v1, Vec::new());
    }

    #[test]
    fn mountinfo_gives_cgroup_mounts_with_their_roots() {
        let text = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory
39 31 0:36 /docker/abc /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/uni\\040fied rw,relatime shared:4 master:1 - cgroup2 cgroup2 rw,nsdelegate
";
        let mounts = parse_mountinfo(text);
        assert_eq!(mounts.len(), 3);
        assert_eq!(mounts[0].controllers, Some(vec!["rw".to_string(), "memory".to_string()]));
        assert_eq!(mounts[1].root, "/docker/abc");
        assert_eq!(mounts[2].mount_point, PathBuf::from("/sys/fs/cgroup/uni fied"));
        assert_eq!(mounts[2].controllers, None);
        assert_eq!(cgroup_dir(&mounts[0], "/a/b"), Some(PathBuf::from("/sys/fs/cgroup/memory/a/b")));
        assert_eq!(cgroup_dir(&mounts[0], "/"), Some(PathBuf::from("/sys/fs/cgroup/memory")));
        assert_eq!(cgroup_dir(&mounts[1], "/docker/abc/x"), Some(PathBuf::from("/sys/fs/cgroup/pids/x")));
        assert_eq!(cgroup_dir(&mounts[1], "/docker/abc"), Some(PathBuf::from("/sys/fs/cgroup/pids")));
        assert_eq!(cgroup_dir(&mounts[1], "/docker/abcd"), None);
        assert_eq!(cgroup_dir(&mounts[1], "/other"), None);
    }

    #[test]
    fn descriptions_say_what_is_limited() {
        let limits = Limits { max_processes: 4096, max_memory_bytes: 12 << 30 };
        let v1 = Enforcement::CgroupV1 { pids: "/p".into(), memory: "/m".into() };
        assert_eq!(v1.describe(&limits), "cgroup v1 (pids, memory): at most 4096 processes and 12 GiB");
        let rlimit = Enforcement::Rlimit.describe(&limits);
        assert!(rlimit.starts_with("RLIMIT_NPROC only") && rlimit.contains("memory NOT limited"), "{rlimit}");
        assert!(Enforcement::None("why".into()).describe(&limits).contains("NO process or memory limit (why)"));
    }

    #[test]
    fn names_must_be_one_path_component() {
        let v1 = Enforcement::CgroupV1 { pids: "/nonexistent".into(), memory: "/nonexistent".into() };
        for bad in ["", ".", "..", "a/b", "a\0b"] {
            for (session, name) in [(bad, "c"), ("s", bad)] {
                let result = SandboxCgroup::create(&v1, session, name, &Limits::default());
                assert!(matches!(result, Err(LimitsError::InvalidName(_))), "{bad:?}");
            }
        }
        assert!(SandboxCgroup::create(&Enforcement::Rlimit, "s", "c", &Limits::default()).unwrap().is_none());
    }

    #[test]
    fn rlimit_pre_exec_caps_the_child_above_what_the_user_runs() {
        let limits = Limits { max_processes: 7, max_memory_bytes: 1 << 30 };
        let mut command = Command::new("cat");
        command.arg("/proc/self/limits").stdout(Stdio::piped());
        // SAFETY: the closure only calls getrlimit and setrlimit.
        unsafe {
            command.pre_exec(rlimit_pre_exec(&Ceiling::shared(&Default::default(), &limits)));
        }
        let output = command.output().unwrap();
        assert!(output.status.success());
        let text = String::from_utf8_lossy(&output.stdout);
        let line = text.lines().find(|line| line.starts_with("Max processes")).unwrap();
        let fields: Vec<&str> = line.split_whitespace().collect();
        // "Max processes <soft> <hard> processes": both are lowered.
        assert_eq!(fields[2], fields[3], "{line}");
        let limit: u64 = fields[2].parse().unwrap();
        let running = user_tasks(nix::unistd::getuid().as_raw());
        // The count is taken before the fork; other tasks of the user may come and go meanwhile.
        assert!(limit >= 7 && limit.abs_diff(running + 7) < 50, "limit {limit}, running {running}");
    }

    /// The enforcement to test with, or `None` (after saying why) where no cgroup can be made.
    fn cgroup_enforcement() -> Option<Enforcement> {
        match probe() {
            enforcement @ (Enforcement::CgroupV2 { .. } | Enforcement::CgroupV1 { .. }) => Some(enforcement),
            other => {
                eprintln!("skipped: no cgroup here ({})", other.describe(&Limits::default()));
                None
            }
        }
    }

    fn test_name(what: &str) -> String {
        format!("test-{}-{what}", std::process::id())
    }

    fn joined(group: &SandboxCgroup, program: &str, args: &[&str]) -> Command {
        let mut command = Command::new(program);
        command.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        // SAFETY: the closure only opens, writes and closes prepared paths.
        unsafe {
            command.pre_exec(group.pre_exec_join());
        }
        command
    }

    #[test]
    fn a_sandbox_cannot_fork_past_its_process_limit() {
        let Some(enforcement) = cgroup_enforcement() else { return };
        let limits = Limits { max_processes: 20, max_memory_bytes: 256 << 20 };
        let group = SandboxCgroup::create(&enforcement, &test_name("pids"), "c", &limits).unwrap().unwrap();
        let dirs = group.dirs().to_vec();
        let script = "for i in $(seq 100); do sleep 30 >/dev/null 2>&1 & done; wait";
        let output = joined(&group, "/bin/sh", &["-c", script]).output().unwrap();
        // dash gives up at its first failed fork; the sleeps it started run on, in the group.
        let running = group.pids().len();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("fork"), "the shell never failed to fork: {stderr}");
        assert!(running > 1 && running <= 20, "{running} processes in the group");
        assert_eq!(group.oom_or_pids_hit().as_deref(), Some("the sandbox hit its process limit (20)"));
        drop(group);
        assert!(dirs.iter().all(|dir| !dir.exists()), "{dirs:?} left behind");
    }

    #[test]
    fn the_commands_of_a_session_share_its_process_limit() {
        let Some(enforcement) = cgroup_enforcement() else { return };
        let limits = Limits { max_processes: 20, max_memory_bytes: 256 << 20 };
        let session = test_name("shared");
        let first = SandboxCgroup::create(&enforcement, &session, "agent", &limits).unwrap().unwrap();
        let second = SandboxCgroup::create(&enforcement, &session, "terminal", &limits).unwrap().unwrap();
        let sessions: Vec<PathBuf> =
            first.dirs().iter().filter_map(|dir| dir.parent().map(Path::to_path_buf)).collect();
        let sleepers = "for i in $(seq 15); do sleep 30 >/dev/null 2>&1 & done; echo started";
        let output = joined(&first, "/bin/sh", &["-c", sleepers]).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&output.stdout), "started\n", "{output:?}");
        assert_eq!(first.pids().len(), 15);
        // The second command of the session has what the first left of the budget, not a budget of its own.
        let output = joined(&second, "/bin/sh", &["-c", sleepers]).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("fork"), "the second command forked past the session's limit: {stderr}");
        let together = first.pids().len() + second.pids().len();
        assert!(together <= 20, "{together} processes in the session");
        assert_eq!(second.oom_or_pids_hit().as_deref(), Some("the sandbox hit its process limit (20)"));
        drop(second);
        assert!(sessions.iter().all(|dir| dir.exists()), "the session's group went while a command of it ran");
        drop(first);
        assert!(sessions.iter().all(|dir| !dir.exists()), "{sessions:?} left behind");
    }

    #[test]
    fn a_sandbox_past_its_memory_limit_is_killed() {
        let Some(enforcement) = cgroup_enforcement() else { return };
        let limits = Limits { max_processes: 64, max_memory_bytes: 64 << 20 };
        let group = SandboxCgroup::create(&enforcement, &test_name("memory"), "c", &limits).unwrap().unwrap();
        let script = "b = bytearray(512 * 1024 * 1024); print('allocated')";
        let output = joined(&group, "/usr/bin/python3", &["-c", script]).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "512 MiB fit in a 64 MiB sandbox");
        assert!(
            output.status.signal() == Some(libc::SIGKILL) || stderr.contains("MemoryError"),
            "{:?}: {stderr}",
            output.status
        );
        assert!(output.stdout.is_empty());
        if output.status.signal() == Some(libc::SIGKILL) {
            assert_eq!(group.oom_or_pids_hit().as_deref(), Some("the sandbox hit its memory limit (64 MiB)"));
        }
        // The bridge itself, outside the group, can still allocate.
        let outside = vec![1u8; 128 << 20];
        assert_eq!(outside.iter().map(|&b| b as usize).sum::<usize>(), 128 << 20);
    }

    #[test]
    fn dropping_the_group_kills_what_is_left_and_removes_it() {
        let Some(enforcement) = cgroup_enforcement() else { return };
        let group = SandboxCgroup::create(&enforcement, &test_name("drop"), "c", &Limits::default()).unwrap().unwrap();
        let dirs = group.dirs().to_vec();
        // The shell exits at once; its sleeps live on, no longer anyone's children here.
        let output =
            joined(&group, "/bin/sh", &["-c", "sleep 1000 >/dev/null 2>&1 & sleep 1000 >/dev/null 2>&1 & echo $!"])
                .output()
                .unwrap();
        assert!(output.status.success());
        let sleeper: i32 = String::from_utf8_lossy(&output.stdout).trim().parse().unwrap();
        let pids = group.pids();
        assert_eq!(pids.len(), 2, "{pids:?}");
        assert!(pids.contains(&sleeper));
        assert!(group.oom_or_pids_hit().is_none());
        drop(group);
        assert!(dirs.iter().all(|dir| !dir.exists()), "{dirs:?} left behind");
        let state = std::fs::read_to_string(format!("/proc/{sleeper}/stat")).unwrap_or_default();
        let gone =
            state.is_empty() || state.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
        assert!(gone, "sleep {sleeper} survived: {state}");
    }
}

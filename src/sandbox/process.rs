//! The host's process tree, read from `/proc`: walks below a process, kills of a whole tree (frozen first, so
//! nothing forks away), the subreaper, a process's start time and HOME. Linux only, like `/proc`.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

/// Kills a process, its process group and every descendant, including those that left the group with
/// `setsid`. The tree is frozen first so nothing forks away between the walk and the kill. Returns what it killed.
pub fn kill_tree(root: u32) -> Vec<i32> {
    let root = root as i32;
    let _ = killpg(Pid::from_raw(root), Signal::SIGSTOP);
    let mut killed = freeze_and_kill(|| {
        let table = process_table();
        let mut found = below(&table, root);
        found.extend(table.iter().filter(|p| p.pgrp == root && p.pid != root).map(|p| p.pid));
        found
    });
    let _ = killpg(Pid::from_raw(root), Signal::SIGKILL);
    let _ = kill(Pid::from_raw(root), Signal::SIGKILL);
    killed.push(root);
    killed
}

/// Kills, with everything they started, the process groups led by processes below `root` that are not in `before`
/// and lead a group other than `root`'s: the commands a long-lived program (an agent) started since `before` was
/// taken, each in a group of its own as agents run their tools. `root`, its group and the rest of its tree stay.
pub fn kill_new_groups(root: u32, before: &HashSet<i32>) -> Vec<i32> {
    let table = process_table();
    let root = root as i32;
    let own = table.iter().find(|p| p.pid == root).map(|p| p.pgrp);
    let leaders: Vec<i32> = below(&table, root)
        .into_iter()
        .filter(|pid| !before.contains(pid))
        .filter(|&pid| table.iter().any(|p| p.pid == pid && p.pgrp == pid && Some(pid) != own))
        .collect();
    leaders.into_iter().flat_map(|leader| kill_tree(leader as u32)).collect()
}

/// Kills every descendant of `root` (not `root` itself, nor its process group).
pub fn kill_descendants(root: u32) {
    freeze_and_kill(|| below(&process_table(), root as i32));
}

/// The processes below `root` by parent links (the sandbox's whole tree, seen from its first process).
pub fn descendant_pids(root: u32) -> Vec<i32> {
    below(&process_table(), root as i32)
}

/// Stops what `walk` finds until it finds nothing new, then kills all of it.
fn freeze_and_kill(walk: impl Fn() -> Vec<i32>) -> Vec<i32> {
    let mut seen: HashSet<i32> = HashSet::new();
    loop {
        let fresh: Vec<i32> = walk().into_iter().filter(|pid| !seen.contains(pid)).collect();
        if fresh.is_empty() {
            break;
        }
        for pid in fresh {
            let _ = kill(Pid::from_raw(pid), Signal::SIGSTOP);
            seen.insert(pid);
        }
    }
    for &pid in &seen {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
    seen.into_iter().collect()
}

/// Makes the bridge the reaper of its orphaned descendants: without bubblewrap, a daemon that left the CLI's tree
/// (`setsid`, double fork) and outlived its supervisor is re-parented to the bridge instead of to init, so it can
/// be found and ended. Linux only (`prctl`).
#[cfg(linux_sandbox)]
pub fn become_subreaper() {
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        tracing::warn!("cannot become a subreaper: {e}");
    }
}

/// When `pid` started, in clock ticks since boot; `None` when it is gone or a zombie.
pub fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields start after the command name's last ')': the state (field 3), ..., the start time (field 22).
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    if matches!(fields.next(), Some("Z") | Some("X") | None) {
        return None;
    }
    fields.nth(22 - 4)?.parse().ok()
}

/// One line of `/proc/<pid>/stat`, what the tree walks need of it.
pub(crate) struct ProcEntry {
    pub pid: i32,
    pub ppid: i32,
    pub pgrp: i32,
}

/// Every process visible in `/proc`.
pub(crate) fn process_table() -> Vec<ProcEntry> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut table = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<i32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        // The command name may contain spaces and parentheses: fields start after the last ')'.
        let Some((_, rest)) = stat.rsplit_once(')') else { continue };
        let mut fields = rest.split_whitespace().skip(1);
        let (Some(Ok(ppid)), Some(Ok(pgrp))) = (fields.next().map(str::parse), fields.next().map(str::parse)) else {
            continue;
        };
        table.push(ProcEntry { pid, ppid, pgrp });
    }
    table
}

/// What a process tree is doing: the CPU time it used, in clock ticks, and whether any of it is running or waiting
/// for the disk right now ([`activity`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Activity {
    pub cpu_ticks: u64,
    pub busy: bool,
    pub processes: usize,
}

/// The [`Activity`] of `root` and every process below it; `None` when `root` is gone (or was reaped).
pub fn activity(root: u32) -> Option<Activity> {
    let root = root as i32;
    let mut pids = below(&process_table(), root);
    pids.push(root);
    let mut found = Activity { cpu_ticks: 0, busy: false, processes: 0 };
    for pid in pids {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let Some((_, rest)) = stat.rsplit_once(')') else { continue };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // After the name: state, then (from the 14th field of the line) utime and stime.
        let (Some(state), Some(user), Some(system)) = (fields.first(), fields.get(11), fields.get(12)) else {
            continue;
        };
        if pid == root && *state == "Z" {
            return None;
        }
        found.busy |= matches!(*state, "R" | "D");
        found.cpu_ticks += user.parse::<u64>().unwrap_or(0) + system.parse::<u64>().unwrap_or(0);
        found.processes += 1;
    }
    (found.processes > 0).then_some(found)
}

/// The direct children of `parent`.
pub fn child_pids(parent: i32) -> Vec<i32> {
    process_table().into_iter().filter(|entry| entry.ppid == parent).map(|entry| entry.pid).collect()
}

/// The processes below `root` by parent links.
fn below(table: &[ProcEntry], root: i32) -> Vec<i32> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for entry in table {
        children.entry(entry.ppid).or_default().push(entry.pid);
    }
    let mut result = Vec::new();
    let mut stack = vec![root];
    while let Some(pid) = stack.pop() {
        for &child in children.get(&pid).into_iter().flatten() {
            result.push(child);
            stack.push(child);
        }
    }
    result
}

/// The HOME in `pid`'s environment.
pub(crate) fn home_of(pid: i32) -> Option<PathBuf> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let home = environ.split(|&b| b == 0).find_map(|var| var.strip_prefix(b"HOME="))?;
    std::str::from_utf8(home).ok().map(PathBuf::from)
}

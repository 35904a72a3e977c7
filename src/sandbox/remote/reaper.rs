//! Remote sandboxes' process lifecycles, shared by their providers: every command a bridge runs there carries a
//! tag in its environment (`ACP_SANDBOX_RUN=acp-<session>-<bridge instance>-<run>`), which everything it starts
//! inherits (a `setsid` grandchild, a daemon), and a small script ends the processes carrying a tag. A provider
//! runs it when a command ends or is killed, and before a turn for what an earlier, killed bridge left running.

use std::path::PathBuf;
use std::time::Duration;

use crate::sandbox::ExecSpec;

/// The variable every remote command of ours carries, with its tag as the value. A provider's daemon signals only
/// the process (or group) it started: what the command started in a session of its own, or double-forked, is found
/// by this mark in `/proc/*/environ` and ended with it.
pub const RUN_MARK: &str = "ACP_SANDBOX_RUN";
/// How long ending a command's leftovers may take before the caller goes on (it is logged).
pub const REAP_LIMIT: Duration = Duration::from_secs(5);
/// Ends every process whose environment has an entry matching `$1` (a `grep` pattern), except those that also
/// match `$2` (when given), until none is left (what they fork meanwhile is found in the next round), and prints
/// how many it ended. Needs only `sh`, GNU `grep` (`-z`) and `/proc`, as the providers' Debian-based images have.
const REAPER: &str = r#"kill_pattern=$1 spare=$2 rounds=0 ended=0
while [ "$rounds" -lt 50 ]; do
  found=
  for file in $(grep -lsz -e "$kill_pattern" /proc/[0-9]*/environ); do
    if [ -n "$spare" ] && grep -qsz -e "$spare" "$file"; then continue; fi
    pid=${file#/proc/}
    found="$found ${pid%/environ}"
    ended=$((ended + 1))
  done
  [ -z "$found" ] && break
  kill -9 $found 2>/dev/null
  rounds=$((rounds + 1))
done
echo "$ended"
"#;

/// A new bridge's instance id: part of every tag of its commands, so that a tagged command without it is an
/// earlier bridge's.
pub fn instance_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..8].to_string()
}

/// The tags of one session's commands in one bridge.
#[derive(Clone, Debug)]
pub struct Tags {
    session: String,
    own: String,
}

impl Tags {
    /// A session id comes from the store: anything but the characters tags use becomes `_`, so a tag is always a
    /// plain word (a Daytona session name, a path segment).
    pub fn new(session_id: &str, instance: &str) -> Self {
        let plain: String = session_id
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
            .collect();
        let session = format!("acp-{plain}-");
        let own = format!("{session}{instance}-");
        Tags { session, own }
    }

    /// `acp-<session>-`: every command of this session, whichever bridge started it.
    pub fn session_prefix(&self) -> &str {
        &self.session
    }

    /// `acp-<session>-<instance>-`: the commands of this bridge.
    pub fn own_prefix(&self) -> &str {
        &self.own
    }

    /// A fresh tag for one command of this bridge.
    pub fn next(&self) -> String {
        format!("{}{}", self.own, &uuid::Uuid::new_v4().simple().to_string()[..8])
    }

    /// Whether `tag` is of a command of this session that another (earlier) bridge started.
    pub fn is_earlier(&self, tag: &str) -> bool {
        tag.starts_with(&self.session) && !tag.starts_with(&self.own)
    }

    /// The reaper's patterns for what earlier bridges left: this session's marks, but this bridge's.
    pub fn earlier_patterns(&self) -> (String, String) {
        (mark_pattern(&self.session), mark_pattern(&self.own))
    }
}

/// Puts the tag into the command's environment (replacing any mark it had).
pub fn mark(spec: &mut ExecSpec, tag: &str) {
    spec.env.retain(|(name, _)| name != RUN_MARK);
    spec.env.push((RUN_MARK.to_string(), tag.to_string()));
}

/// The `grep` pattern of an environment entry `ACP_SANDBOX_RUN=<value>…`. Anything but the characters tags use
/// stands for itself only as `.`.
pub fn mark_pattern(value: &str) -> String {
    let safe: String =
        value.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '.' }).collect();
    format!("^{RUN_MARK}={safe}")
}

/// The pattern of exactly one command's mark.
pub fn exact_pattern(tag: &str) -> String {
    format!("{}$", mark_pattern(tag))
}

/// The reaper as a command: ends every process whose environment matches `kill` and not `spare`. It carries no
/// mark itself.
pub fn reaper_spec(kill: &str, spare: Option<&str>) -> ExecSpec {
    ExecSpec {
        program: PathBuf::from("/bin/sh"),
        args: vec!["-c".into(), REAPER.into(), "acp-sandbox-reaper".into(), kill.into(), spare.unwrap_or("").into()],
        cwd: PathBuf::from("/"),
        ..ExecSpec::default()
    }
}

/// How many processes the reaper said it ended (its stdout; 0 when unreadable).
pub fn reaped(stdout: &str) -> usize {
    stdout.trim().parse().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn a_mark_pattern_matches_only_what_it_names() {
        assert_eq!(mark_pattern("acp-sess_1a-b2"), "^ACP_SANDBOX_RUN=acp-sess_1a-b2");
        assert_eq!(exact_pattern("acp-s-i-r"), "^ACP_SANDBOX_RUN=acp-s-i-r$");
        // A session id read from the store cannot make the pattern match more than a character per character.
        assert_eq!(mark_pattern("s.*$[x]\\"), "^ACP_SANDBOX_RUN=s....x..");
    }

    #[test]
    fn tags_tell_this_bridges_commands_from_earlier_ones() {
        let tags = Tags::new("ses/1.2", "abcd1234");
        assert_eq!((tags.session_prefix(), tags.own_prefix()), ("acp-ses_1_2-", "acp-ses_1_2-abcd1234-"));
        let tag = tags.next();
        assert_eq!((tag.len(), tag.starts_with(tags.own_prefix())), ("acp-ses_1_2-abcd1234-".len() + 8, true));
        assert!(!tags.is_earlier(&tag));
        assert!(tags.is_earlier("acp-ses_1_2-0000ffff-12345678"));
        // Another session's commands, and commands that are not ours at all, are never earlier ones.
        assert!(!tags.is_earlier("acp-ses_1_3-0000ffff-12345678"));
        assert!(!tags.is_earlier("reaper-12345678"));
        assert_eq!(
            tags.earlier_patterns(),
            ("^ACP_SANDBOX_RUN=acp-ses_1_2-".to_string(), "^ACP_SANDBOX_RUN=acp-ses_1_2-abcd1234-".to_string())
        );
    }

    #[test]
    fn marking_replaces_any_mark_the_command_had() {
        let mut spec =
            ExecSpec { env: vec![(RUN_MARK.into(), "forged".into()), ("A".into(), "1".into())], ..ExecSpec::default() };
        mark(&mut spec, "acp-s-i-r");
        assert_eq!(spec.env, vec![("A".to_string(), "1".to_string()), (RUN_MARK.to_string(), "acp-s-i-r".to_string())]);
        assert_eq!((reaped("3\n"), reaped("nonsense")), (3, 0));
    }
}

//! What earlier bridges left on this data dir: processes of killed bridges, servers kept warm, caches of sessions
//! long unused.

use std::collections::HashSet;
use std::sync::Arc;

use crate::error::Result;
use crate::paths;
use crate::store::now_ms;

use super::{Bridge, TRIM_CACHES_AFTER};
use crate::store::lock as turn_lock;

impl Bridge {
    /// Kills what CLIs of earlier, killed bridges left running on this data dir: processes carrying a session's
    /// HOME whose owners ([`crate::sandbox::local::owners::record_owner`]) are all gone and whose session no live bridge
    /// runs a turn of. Only a serving bridge does this, before it starts anything; read-only commands never do.
    pub async fn reap_leftovers(&self) -> Result<()> {
        let run_dir = paths::run_dir(&self.config.data_dir);
        let kept = self.sweep_kept_warm();
        for (pid, session) in
            crate::sandbox::local::owners::leftover_processes(&paths::sessions_dir(&self.config.data_dir))
        {
            if kept.contains(&session)
                || crate::sandbox::local::owners::owned_by_a_live_bridge(&run_dir, &session)
                || self.store.running_elsewhere(&session).await?
            {
                continue;
            }
            tracing::warn!(session = %session, pid, "killing a process an earlier, killed bridge left running");
            if let Ok(pid) = u32::try_from(pid) {
                crate::sandbox::process::kill_tree(pid);
            }
        }
        Ok(())
    }

    /// Looks at the servers earlier bridges kept warm (`--keep-warm`): the records of those that are gone are
    /// removed, and those no bridge uses now are stopped when this bridge keeps none or was started with other
    /// sandbox settings (a changed policy must not live on in them). Returns the sandboxes of those that stay.
    pub(super) fn sweep_kept_warm(&self) -> HashSet<String> {
        use crate::sandbox::local::warm;
        let run_dir = paths::run_dir(&self.config.data_dir);
        let settings = warm::settings_digest(self.local.settings());
        let mut kept = HashSet::new();
        for record in warm::list(&run_dir) {
            if !record.alive() {
                warm::forget(&run_dir, &record);
                continue;
            }
            let wanted = self.config.keep_warm.is_some() && record.settings == settings;
            // Held by the bridge that uses it now: that one decides.
            let unused = turn_lock::try_lock(&self.config.data_dir, &format!("server {}", record.key));
            if !wanted && let Ok(Some(_unused)) = unused {
                tracing::info!(
                    key = %record.key,
                    pid = record.pid,
                    why = if self.config.keep_warm.is_none() { "--keep-warm is off" } else { "other sandbox settings" },
                    "stopping a server an earlier bridge kept warm"
                );
                warm::stop(&run_dir, &record);
                continue;
            }
            kept.insert(record.sandbox.clone());
        }
        kept
    }

    /// Frees, in the background, the caches of the sandboxes of sessions unused for [`TRIM_CACHES_AFTER`] (OpenCode
    /// downloads its plugins into every session's own cache, so they add up across many sessions); the provider
    /// leaves a sandbox alone while something still runs in it. The CLI fetches what it needs again on the next
    /// prompt. Serving bridges only.
    pub fn trim_idle_caches(self: &Arc<Self>) {
        let bridge = self.clone();
        tokio::spawn(async move {
            let before = now_ms().saturating_sub(TRIM_CACHES_AFTER.as_millis() as i64);
            let Ok(sessions) = bridge.store.list_sessions(None, None, None, usize::MAX).await else { return };
            let mut trimmed = 0;
            // A shared sandbox is trimmed once, and only when none of its sessions was used lately.
            let mut skip: std::collections::HashSet<&str> =
                sessions.iter().filter(|r| r.updated_at >= before).filter_map(|r| r.sandbox_id.as_deref()).collect();
            for record in sessions.iter().filter(|r| r.updated_at < before) {
                let Some(sandbox) = record.sandbox_id.as_deref() else { continue };
                if record.sandbox_provider != bridge.provider.name() || !skip.insert(sandbox) {
                    continue;
                }
                match bridge.provider.trim(sandbox).await {
                    Ok(true) => trimmed += 1,
                    Ok(false) => {}
                    Err(e) => tracing::warn!(session = %record.id, "could not trim the sandbox's caches: {e}"),
                }
            }
            if trimmed > 0 {
                tracing::info!(
                    sessions = trimmed,
                    "freed the caches of sessions unused for {} days",
                    TRIM_CACHES_AFTER.as_secs() / 86_400
                );
            }
        });
    }
}

//! The thread's word on protected paths the agent created: what `Sandbox::sweep_protected` moved out of the
//! workspace, said after each finished tool and at the end of the turn, by both backends' turn loops.

use super::emitter::Emitter;
use super::note;
use crate::error::Result;
use crate::sandbox::Sandbox;
use crate::sandbox::local::protect::Moved;

/// Sweeps the sandbox's missing protected paths now and says in the thread what was moved since the last time.
pub(super) async fn sweep(sandbox: &dyn Sandbox, emit: &Emitter) -> Result<()> {
    let moved = sandbox.sweep_protected();
    if moved.is_empty() {
        return Ok(());
    }
    emit.send(note(&moved_note(&moved))).await
}

fn moved_note(moved: &[Moved]) -> String {
    let parts: Vec<String> = moved
        .iter()
        .map(|item| match &item.outcome {
            Ok(to) => format!("`{}` → `{}`", item.path.display(), to.display()),
            Err(e) => format!("`{}` could not be moved ({e}): remove it before you trust it", item.path.display()),
        })
        .collect();
    format!(
        "_The agent created protected paths, which programs on this machine run or trust (git hooks and config, \
         direnv, editor and IDE settings); they were moved out of your workspace: {}. Move one back yourself if \
         you want it._",
        parts.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn the_note_says_what_was_created_and_where_it_went_or_why_not() {
        let moved = [
            Moved { path: "/ws/.envrc".into(), outcome: Ok(PathBuf::from("/state/quarantine/1-a/.envrc")) },
            Moved { path: "/ws/.vscode".into(), outcome: Err("Permission denied".into()) },
        ];
        assert_eq!(
            moved_note(&moved),
            "_The agent created protected paths, which programs on this machine run or trust (git hooks and \
             config, direnv, editor and IDE settings); they were moved out of your workspace: `/ws/.envrc` → \
             `/state/quarantine/1-a/.envrc`; `/ws/.vscode` could not be moved (Permission denied): remove it \
             before you trust it. Move one back yourself if you want it._"
        );
    }
}

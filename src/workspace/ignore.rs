//! What git ignores in the user's workspace, as the `ignore` crate reads gitignore files: the review copy leaves it
//! out when it mirrors a remote sandbox, and a pull never touches it.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

use ignore::Match;
use ignore::gitignore::{Gitignore, GitignoreBuilder};

/// What git ignores in the user's workspace: its `.gitignore` files (each read once, when a path below it is
/// first asked about) and `.git/info/exclude`. A path is ignored when it or one of its directories is.
pub struct Ignores {
    workspace: PathBuf,
    exclude: Option<Gitignore>,
    dirs: Mutex<HashMap<PathBuf, Option<Arc<Gitignore>>>>,
}

impl Ignores {
    /// The rules of `workspace` as they are now.
    pub fn new(workspace: &Path) -> Self {
        let exclude = gitignore(workspace, &workspace.join(".git/info/exclude"));
        Ignores { workspace: workspace.to_path_buf(), exclude, dirs: Mutex::default() }
    }

    /// Whether git would ignore `rel` (relative to the workspace; `dir` when it is a directory).
    pub fn ignored(&self, rel: &Path, dir: bool) -> bool {
        let parts: Vec<Component> = rel.components().collect();
        let mut prefix = PathBuf::new();
        for (at, part) in parts.iter().enumerate() {
            prefix.push(part);
            if self.decides(&prefix, at + 1 < parts.len() || dir) {
                return true;
            }
        }
        false
    }

    /// `rel` itself, by the nearest `.gitignore` that has a say, then the exclude file.
    fn decides(&self, rel: &Path, dir: bool) -> bool {
        let full = self.workspace.join(rel);
        for ancestor in rel.ancestors().skip(1) {
            if let Some(rules) = self.rules(ancestor) {
                match rules.matched(&full, dir) {
                    Match::Ignore(_) => return true,
                    Match::Whitelist(_) => return false,
                    Match::None => {}
                }
            }
        }
        self.exclude.as_ref().is_some_and(|rules| rules.matched(&full, dir).is_ignore())
    }

    fn rules(&self, dir: &Path) -> Option<Arc<Gitignore>> {
        let mut dirs = self.dirs.lock().unwrap_or_else(|p| p.into_inner());
        dirs.entry(dir.to_path_buf())
            .or_insert_with(|| {
                let root = self.workspace.join(dir);
                gitignore(&root, &root.join(".gitignore")).map(Arc::new)
            })
            .clone()
    }
}

fn gitignore(root: &Path, file: &Path) -> Option<Gitignore> {
    if !std::fs::metadata(file).is_ok_and(|m| m.is_file()) {
        return None;
    }
    let mut builder = GitignoreBuilder::new(root);
    if let Some(e) = builder.add(file) {
        tracing::warn!(file = %file.display(), "a rule of this ignore file was not understood: {e}");
    }
    builder.build().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_git_ignores_is_decided_by_the_nearest_rules_and_the_exclude_file() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path();
        std::fs::create_dir_all(ws.join("nested/deep")).unwrap();
        std::fs::create_dir_all(ws.join(".git/info")).unwrap();
        std::fs::write(ws.join(".gitignore"), "build/\n*.log\n!keep.log\n").unwrap();
        std::fs::write(ws.join("nested/.gitignore"), "local.txt\n!again.log\n").unwrap();
        std::fs::write(ws.join(".git/info/exclude"), "mine.txt\n").unwrap();
        let ignores = Ignores::new(ws);
        let ignored = |rel: &str, dir: bool| ignores.ignored(Path::new(rel), dir);
        assert!(ignored("build", true));
        assert!(ignored("build/out/a.o", false), "below an ignored directory");
        assert!(!ignored("build", false), "`build/` names directories only");
        assert!(ignored("a.log", false) && ignored("nested/deep/b.log", false));
        assert!(!ignored("keep.log", false) && !ignored("nested/again.log", false));
        assert!(ignored("nested/local.txt", false) && ignored("nested/deep/local.txt", false));
        assert!(!ignored("local.txt", false), "a nested rule stays below its directory");
        assert!(ignored("mine.txt", false));
        assert!(!ignored("src/main.rs", false) && !ignored(".gitignore", false));
    }
}

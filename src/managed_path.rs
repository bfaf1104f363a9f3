//! Every path berth may create or remove is a `ManagedPath`, which only `ManagedRoot` can build: inside
//! `BERTH_WORKTREE_ROOT` and without following a symlink out of it (I13). A leaf module: git and the
//! executors take these types, and nothing here imports them back.
use std::path::{Component, Path, PathBuf};

use crate::config::Config;

#[derive(Debug, thiserror::Error)]
pub enum PathError {
    #[error("a path component is not a plain name")]
    NotPlain,
    #[error("the path leaves the managed root")]
    Outside,
    #[error("a symlink lies on the path")]
    Symlink,
}

/// `BERTH_WORKTREE_ROOT`, canonical.
#[derive(Debug, Clone)]
pub struct ManagedRoot(PathBuf);

/// A path inside the managed root. No public constructor: destructive and creating git calls take this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagedPath(PathBuf);

impl ManagedPath {
    pub fn as_path(&self) -> &Path {
        &self.0
    }
}

impl ManagedRoot {
    /// The only way to a root: `BERTH_WORKTREE_ROOT`, which configuration canonicalized at startup.
    pub fn from_config(config: &Config) -> ManagedRoot {
        ManagedRoot(config.worktree_root.clone())
    }

    /// The directory an import adopted a worktree in (kandev's task directory, outside
    /// `BERTH_WORKTREE_ROOT`), recorded with the worktree as berth's to manage. Accepted only as it was
    /// recorded: absolute, canonical (no symlink anywhere on it) and at least two levels below `/`. Paths
    /// inside it then follow the same rules as inside the configured root.
    pub fn adopted(recorded: &Path) -> Result<ManagedRoot, PathError> {
        if !recorded.is_absolute() || recorded.components().count() < 3 {
            return Err(PathError::Outside);
        }
        match recorded.canonicalize() {
            Ok(canonical) if canonical == recorded => Ok(ManagedRoot(canonical)),
            Ok(_) => Err(PathError::Symlink),
            Err(_) => Err(PathError::Outside),
        }
    }

    #[cfg(test)]
    fn for_tests(canonical: PathBuf) -> ManagedRoot {
        ManagedRoot(canonical)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// `root/part/part...` from plain names only; no existing component may be a symlink.
    pub fn join(&self, parts: &[&str]) -> Result<ManagedPath, PathError> {
        let mut path = self.0.clone();
        for part in parts {
            let mut comps = Path::new(part).components();
            match (comps.next(), comps.next()) {
                (Some(Component::Normal(_)), None) if !part.contains('/') => path.push(part),
                _ => return Err(PathError::NotPlain),
            }
            if let Ok(meta) = std::fs::symlink_metadata(&path)
                && meta.file_type().is_symlink()
            {
                return Err(PathError::Symlink);
            }
        }
        Ok(ManagedPath(path))
    }

    /// A path recorded in the inventory, accepted only if it is exactly where the root says it is: the
    /// canonical form equals the recorded one (no symlink anywhere) and lies inside the root.
    pub fn adopt(&self, recorded: &Path) -> Result<ManagedPath, PathError> {
        if !recorded.starts_with(&self.0) || recorded == self.0 {
            return Err(PathError::Outside);
        }
        let rel = recorded.strip_prefix(&self.0).map_err(|_| PathError::Outside)?;
        let parts: Vec<String> = rel
            .components()
            .map(|c| match c {
                Component::Normal(n) => Ok(n.to_string_lossy().into_owned()),
                _ => Err(PathError::NotPlain),
            })
            .collect::<Result<_, _>>()?;
        let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
        self.join(&parts)
    }
}

/// Why a recorded worktree registration was not proven (and is left alone).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RegistrationError {
    #[error("the recorded worktree id is not a plain name")]
    NotPlain,
    #[error("the worktree directory still exists")]
    StillThere,
    #[error("the registration's gitdir file cannot be read")]
    Unreadable,
    #[error("the registration's gitdir names {0}, not the worktree berth recorded")]
    PointsElsewhere(String),
    #[error("the registration is locked")]
    Locked,
}

/// Proof that `<common>/worktrees/<id>` is the registration berth recorded for a managed worktree whose
/// directory is gone: the id is the one the inventory recorded, and its `gitdir` file names
/// `<managed path>/.git`. Forgetting a registration takes this, never a repository-wide prune.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedRegistration {
    target: ManagedPath,
    admin_dir: PathBuf,
}

impl RecordedRegistration {
    /// `Ok(None)`: there is no such registration any more (already gone counts as done, I9).
    pub fn prove(
        target: &ManagedPath,
        common_git_dir: &Path,
        worktree_id: &str,
    ) -> Result<Option<RecordedRegistration>, RegistrationError> {
        let mut comps = Path::new(worktree_id).components();
        if !matches!((comps.next(), comps.next()), (Some(Component::Normal(_)), None)) || worktree_id.contains('/') {
            return Err(RegistrationError::NotPlain);
        }
        if std::fs::symlink_metadata(target.as_path()).is_ok() {
            return Err(RegistrationError::StillThere);
        }
        let admin_dir = common_git_dir.join("worktrees").join(worktree_id);
        match std::fs::symlink_metadata(&admin_dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Ok(m) if m.is_dir() => {}
            _ => return Err(RegistrationError::Unreadable),
        }
        let named = std::fs::read_to_string(admin_dir.join("gitdir")).map_err(|_| RegistrationError::Unreadable)?;
        let named = Path::new(named.trim_end_matches(['\n', '\r']));
        // git may write it relative to the admin directory (`worktree.useRelativePaths`).
        let named = lexically_normal(&admin_dir.join(named));
        if named != target.as_path().join(".git") {
            return Err(RegistrationError::PointsElsewhere(named.display().to_string()));
        }
        if admin_dir.join("locked").exists() {
            return Err(RegistrationError::Locked);
        }
        Ok(Some(RecordedRegistration {
            target: target.clone(),
            admin_dir,
        }))
    }

    /// The worktree path git knows the registration by (what `git worktree remove` is given).
    pub fn target(&self) -> &ManagedPath {
        &self.target
    }

    /// `<common>/worktrees/<id>`.
    pub fn admin_dir(&self) -> &Path {
        &self.admin_dir
    }
}

/// `a/b/../c` as `a/c`, without touching the filesystem (the path may no longer exist).
fn lexically_normal(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// I11: consent to destroy uncommitted or untracked work in a worktree (`git worktree remove --force`).
/// Two ways to one: a request's explicit `discard_worktree_changes=true`, and reading back the cleanup
/// job snapshot that recorded it (`recorded_consent`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Consent {
    _given: (),
}

impl Consent {
    /// The request said `discard_worktree_changes=true`; anything else is no consent.
    pub(crate) fn from_discard_flag(discard_worktree_changes: Option<bool>) -> Option<Consent> {
        (discard_worktree_changes == Some(true)).then_some(Consent { _given: () })
    }
}

/// `#[serde(with)]` for a recorded consent: stored as the boolean `discard_worktree_changes`.
pub mod recorded_consent {
    use serde::{Deserialize, Deserializer, Serializer};

    use super::Consent;

    pub fn serialize<S: Serializer>(consent: &Option<Consent>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bool(consent.is_some())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Consent>, D::Error> {
        Ok(bool::deserialize(d)?.then_some(Consent { _given: () }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_adopted_root_is_taken_only_as_recorded() {
        let dir = tempfile::TempDir::new().unwrap();
        let base = dir.path().canonicalize().unwrap();
        let tasks = base.join("tasks");
        std::fs::create_dir_all(tasks.join("t1/proj")).unwrap();
        let root = ManagedRoot::adopted(&tasks.join("t1")).unwrap();
        assert!(root.adopt(&tasks.join("t1/proj")).is_ok());
        assert!(root.adopt(&tasks.join("t2/proj")).is_err(), "only inside it");
        assert!(root.adopt(&tasks.join("t1")).is_err(), "never the root itself");
        std::os::unix::fs::symlink(tasks.join("t1"), base.join("link")).unwrap();
        assert!(matches!(
            ManagedRoot::adopted(&base.join("link")),
            Err(PathError::Symlink)
        ));
        for shallow in ["/", "/tmp", "relative/dir"] {
            assert!(ManagedRoot::adopted(Path::new(shallow)).is_err(), "{shallow}");
        }
        assert!(ManagedRoot::adopted(&tasks.join("missing")).is_err());
    }

    #[test]
    fn managed_paths_stay_inside_the_root() {
        let dir = tempfile::TempDir::new().unwrap();
        let root = ManagedRoot::for_tests(dir.path().canonicalize().unwrap());
        assert!(root.join(&["task", "repo"]).is_ok());
        for bad in [&["..", "x"][..], &["a/b"], &["."], &["/etc"], &[""]] {
            assert!(root.join(bad).is_err(), "{bad:?}");
        }
        // A symlink planted under the root is not followed.
        let outside = tempfile::TempDir::new().unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("link")).unwrap();
        assert!(matches!(root.join(&["link", "x"]), Err(PathError::Symlink)));
        assert!(matches!(root.adopt(&outside.path().join("x")), Err(PathError::Outside)));
        assert!(matches!(
            root.adopt(&root.path().join("a/../b")),
            Err(PathError::NotPlain)
        ));
        assert!(root.adopt(root.path()).is_err());
        assert_eq!(
            root.adopt(&root.path().join("t/r")).unwrap().as_path(),
            root.path().join("t/r")
        );
    }

    #[test]
    fn a_registration_is_proven_only_when_it_names_the_recorded_worktree() {
        let dir = tempfile::TempDir::new().unwrap();
        let root = ManagedRoot::for_tests(dir.path().canonicalize().unwrap());
        let common = tempfile::TempDir::new().unwrap();
        let common = common.path().canonicalize().unwrap();
        let target = root.join(&["task", "svc"]).unwrap();
        let admin = common.join("worktrees/svc");
        // No registration at all: already gone.
        assert_eq!(RecordedRegistration::prove(&target, &common, "svc"), Ok(None));
        std::fs::create_dir_all(&admin).unwrap();
        std::fs::write(
            admin.join("gitdir"),
            format!("{}\n", target.as_path().join(".git").display()),
        )
        .unwrap();
        let proof = RecordedRegistration::prove(&target, &common, "svc").unwrap().unwrap();
        assert_eq!(proof.admin_dir(), admin);
        // Relative, as `worktree.useRelativePaths` writes it.
        let up = admin.ancestors().count() - 1;
        let rel = format!(
            "{}{}/.git",
            "../".repeat(up),
            target.as_path().strip_prefix("/").unwrap().display()
        );
        std::fs::write(admin.join("gitdir"), rel).unwrap();
        assert!(RecordedRegistration::prove(&target, &common, "svc").unwrap().is_some());
        // Someone else's worktree under that id is left alone.
        std::fs::write(admin.join("gitdir"), "/home/user/elsewhere/.git\n").unwrap();
        assert!(matches!(
            RecordedRegistration::prove(&target, &common, "svc"),
            Err(RegistrationError::PointsElsewhere(_))
        ));
        for bad in ["..", "a/b", "", "."] {
            assert_eq!(
                RecordedRegistration::prove(&target, &common, bad),
                Err(RegistrationError::NotPlain),
                "{bad:?}"
            );
        }
        std::fs::write(
            admin.join("gitdir"),
            format!("{}\n", target.as_path().join(".git").display()),
        )
        .unwrap();
        std::fs::write(admin.join("locked"), "on a drive\n").unwrap();
        assert_eq!(
            RecordedRegistration::prove(&target, &common, "svc"),
            Err(RegistrationError::Locked)
        );
        std::fs::remove_file(admin.join("locked")).unwrap();
        // A directory that is still there is removed with `git worktree remove`, not forgotten.
        std::fs::create_dir_all(target.as_path()).unwrap();
        assert_eq!(
            RecordedRegistration::prove(&target, &common, "svc"),
            Err(RegistrationError::StillThere)
        );
    }

    #[test]
    fn consent_comes_only_from_an_explicit_flag_and_survives_its_record() {
        assert_eq!(Consent::from_discard_flag(None), None);
        assert_eq!(Consent::from_discard_flag(Some(false)), None);
        let given = Consent::from_discard_flag(Some(true));
        assert!(given.is_some());
        #[derive(serde::Serialize, serde::Deserialize)]
        struct Record {
            #[serde(with = "recorded_consent")]
            discard_worktree_changes: Option<Consent>,
        }
        let stored = serde_json::to_value(Record {
            discard_worktree_changes: given.clone(),
        })
        .unwrap();
        assert_eq!(stored, serde_json::json!({"discard_worktree_changes": true}));
        let back: Record = serde_json::from_value(stored).unwrap();
        assert_eq!(back.discard_worktree_changes, given);
        let none: Record = serde_json::from_value(serde_json::json!({"discard_worktree_changes": false})).unwrap();
        assert_eq!(none.discard_worktree_changes, None);
    }
}

//! Database servers refuse to run as root (PostgreSQL) or should not (MariaDB): when the
//! tests run as root, as CI does, the servers a test starts run as `nobody`, in temporary
//! directories handed to that user.

use std::path::Path;
use std::process::Command;

/// `(uid, gid)` of `nobody` when this process is root, else `None` (run as ourselves).
fn nobody() -> Option<(u32, u32)> {
    let id = |args: &[&str]| -> u32 {
        let out = Command::new("id").args(args).output().expect("id(1)");
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("a numeric id")
    };
    (id(&["-u"]) == 0).then(|| (id(&["-u", "nobody"]), id(&["-g", "nobody"])))
}

/// A command that runs `program` as the unprivileged user (setpriv(1) when root).
pub fn command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    match nobody() {
        Some((uid, gid)) => {
            let mut command = Command::new("setpriv");
            command
                .arg(format!("--reuid={uid}"))
                .arg(format!("--regid={gid}"))
                .arg("--clear-groups")
                .arg(program);
            command
        }
        None => Command::new(program),
    }
}

/// Hands `dir` to the unprivileged user.
pub fn own(dir: &Path) {
    if let Some((uid, gid)) = nobody() {
        std::os::unix::fs::chown(dir, Some(uid), Some(gid)).expect("chown");
    }
}

//! This host as the runtime sees it: its name (worker ids, the worker
//! registry) and whether a process on it is alive. A leaf: the modules that
//! register workers use it without importing the crate root.

/// Whether a process with this id exists on this host, as far as this
/// host can tell: on Linux, whether `/proc/<pid>` exists; elsewhere it is
/// assumed to (a worker id is then taken over only once its registry entry
/// expires). A pid reused by another process reads as alive: the safe side.
pub(crate) fn process_alive(pid: u32) -> bool {
    if cfg!(target_os = "linux") {
        std::path::Path::new(&format!("/proc/{pid}")).exists()
    } else {
        true
    }
}

/// This machine's host name as the runtime registers it (worker ids, the
/// worker registry), without I/O beyond reading `/etc/hostname` once.
pub fn host_name() -> String {
    static HOST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HOST.get_or_init(|| {
        std::env::var("HOSTNAME")
            .ok()
            .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
            .map(|h| {
                h.trim()
                    .chars()
                    .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '.')
                    .collect()
            })
            .filter(|h: &String| !h.is_empty())
            .unwrap_or_else(|| "localhost".into())
    })
    .clone()
}

//! What became of a run's lookups, and the one summary line that says it: what was
//! fetched and from where, what the cache had, and what went wrong.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use super::client::Client;

/// What became of the lookups, for the summary.
#[derive(Default)]
pub(super) struct Report {
    /// Per server, in the order listed: files fetched and their bytes.
    pub(super) fetched: HashMap<usize, (usize, u64)>,
    pub(super) from_cache: usize,
    /// Build IDs every server asked said it does not have.
    pub(super) not_found: usize,
    /// Build IDs no server answered for (down, or what it sent was not used).
    pub(super) unanswered: usize,
    /// Why servers were given up on, or why a file they sent was not used.
    pub(super) problems: Vec<String>,
    /// Why nothing could be fetched at all (the cache cannot be used).
    pub(super) no_cache: Option<String>,
    pub(super) fetch_time: Duration,
}

impl Client {
    /// The summary line: what was fetched, from where, and what went wrong; `None` when
    /// nothing was asked for.
    pub fn summary(&self) -> Option<String> {
        let r = self.report.lock().unwrap_or_else(|e| e.into_inner());
        let fetched: usize = r.fetched.values().map(|(n, _)| n).sum();
        if fetched + r.from_cache + r.not_found + r.unanswered == 0 {
            return None;
        }
        let mut parts = Vec::new();
        for (index, server) in self.config.servers.iter().enumerate() {
            if let Some((n, bytes)) = r.fetched.get(&index) {
                parts.push(format!(
                    "fetched {n} debug file{} ({}) from {server}",
                    plural(*n),
                    size(*bytes)
                ));
            }
        }
        match parts.len() {
            0 if r.from_cache == 0 => parts.push("fetched nothing".to_string()),
            0 => {}
            n => parts[n - 1].push_str(&format!(" in {} ms", r.fetch_time.as_millis())),
        }
        if r.from_cache > 0 {
            let dir = self.config.cache.as_deref().unwrap_or(Path::new(""));
            parts.push(format!("{} from the cache {}", r.from_cache, dir.display()));
        }
        if r.not_found > 0 {
            parts.push(format!("{} not on any server", r.not_found));
        }
        if r.unanswered > 0 {
            parts.push(format!("{} not answered", r.unanswered));
        }
        if let Some(why) = &r.no_cache {
            parts.push(why.clone());
        }
        for problem in &r.problems {
            if !parts.contains(problem) {
                parts.push(problem.clone());
            }
        }
        Some(format!("debuginfod: {}", parts.join("; ")))
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// A byte count for people: kB, MB or GB.
pub(crate) fn size(bytes: u64) -> String {
    match bytes {
        0..1_000_000 => format!("{:.1} kB", bytes as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.1} MB", bytes as f64 / 1e6),
        _ => format!("{:.2} GB", bytes as f64 / 1e9),
    }
}

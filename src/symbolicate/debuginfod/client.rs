//! The debuginfod client of one run: each build ID looked up once, however many
//! libraries or threads ask, in the cache and then server after server; a server that
//! is down is not asked again; a signal that stops the naming ends the wait.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::cache::CACHED_NAME;
use super::config::Config;
use super::fetch::Answer;
use super::report::Report;
use super::verify::{hex, verify};

/// How often a lookup looks whether a signal has stopped the naming: 100 ms, well within
/// the few seconds a person waits after Ctrl-C.
const STOP_POLL: Duration = Duration::from_millis(100);

/// The answer for one build ID, found once: the debug file, or why there is none.
type Lookup = OnceLock<Result<PathBuf, String>>;

/// The debuginfod client of one run.
pub struct Client {
    pub(super) config: Config,
    pub(super) agent: ureq::Agent,
    pub(super) lookups: Mutex<HashMap<Vec<u8>, Arc<Lookup>>>,
    /// Servers not asked again: index into `config.servers`.
    pub(super) down: Mutex<Vec<usize>>,
    pub(super) report: Mutex<Report>,
    /// New files killed runs left in the cache are looked for once per run.
    pub(super) cleaned: std::sync::Once,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.debug_struct("Client")
            .field("config", &self.config)
            .finish()
    }
}

impl Client {
    pub fn new(config: Config) -> Client {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_resolve(config.timeout)
            .timeout_connect(config.timeout)
            .timeout_recv_response(config.timeout)
            .timeout_per_read(config.timeout)
            .timeout_per_call(config.max_time)
            .user_agent(format!("sampler/{}", env!("CARGO_PKG_VERSION")))
            .tls_config(super::system_trust())
            .build()
            .new_agent();
        Client {
            config,
            agent,
            lookups: Mutex::default(),
            down: Mutex::default(),
            report: Mutex::default(),
            cleaned: std::sync::Once::new(),
        }
    }

    /// The debug file of build ID `id` (of the file `name`, for messages), from the cache
    /// or else from the first server that has it; or why there is none. Asked once per
    /// build ID: later calls get the answer of the first. A signal that stops the naming
    /// ends the wait at once (the lookup, in a thread of its own, gives up at its next
    /// read).
    pub fn find(self: &Arc<Self>, id: &[u8], name: &str) -> Result<PathBuf, String> {
        let cell = self
            .lookups
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(id.to_vec())
            .or_default()
            .clone();
        cell.get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel();
            let (client, owned_id, owned_name) = (self.clone(), id.to_vec(), name.to_string());
            let spawned = std::thread::Builder::new()
                .name("sampler-debuginfod".into())
                .spawn(move || {
                    let _ = tx.send(client.look_up(&owned_id, &owned_name));
                });
            if spawned.is_err() {
                return self.look_up(id, name);
            }
            loop {
                match rx.recv_timeout(STOP_POLL) {
                    Ok(answer) => return answer,
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                        if let Some(signal) = crate::record::interrupt::stopped() {
                            return Err(format!("debuginfod: {signal} stopped the lookup"));
                        }
                    }
                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                        return Err("debuginfod: the lookup failed".into())
                    }
                }
            }
        })
        .clone()
    }

    fn look_up(&self, id: &[u8], name: &str) -> Result<PathBuf, String> {
        let Some(cache) = &self.config.cache else {
            self.note(|r| {
                r.no_cache = Some("no cache directory (HOME is not set)".into());
                r.unanswered += 1;
            });
            return Err("debuginfod: no cache directory".into());
        };
        let hex = hex(id);
        let cached = cache.join(&hex).join(CACHED_NAME);
        if crate::files::locate::open_regular(&cached)
            .is_some_and(|f| verify(&object::ReadCache::new(f), id).is_ok())
        {
            self.note(|r| r.from_cache += 1);
            return Ok(cached);
        }
        let mut why = None;
        for (index, server) in self.config.servers.iter().enumerate() {
            if self.is_down(index) {
                why.get_or_insert(format!("debuginfod: {server} was given up on"));
                continue;
            }
            let started = Instant::now();
            let answer = self.fetch(server, cache, &hex, id, name);
            self.note(|r| r.fetch_time += started.elapsed());
            let problem = match answer {
                Answer::Fetched(path, bytes) => {
                    self.note(|r| {
                        let entry = r.fetched.entry(index).or_default();
                        entry.0 += 1;
                        entry.1 += bytes;
                    });
                    return Ok(path);
                }
                Answer::NotFound => continue,
                Answer::NoCache(why) => {
                    self.note(|r| {
                        r.no_cache = Some(why.clone());
                        r.unanswered += 1;
                    });
                    return Err(format!("debuginfod: {why}"));
                }
                Answer::Refused(problem) => problem,
                Answer::Down(problem) => {
                    self.down
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(index);
                    problem
                }
            };
            self.note(|r| r.problems.push(format!("{server}: {problem}")));
            why.get_or_insert(format!("debuginfod: {server}: {problem}"));
        }
        match why {
            None => {
                self.note(|r| r.not_found += 1);
                Err("not on the debuginfod servers".into())
            }
            Some(why) => {
                self.note(|r| r.unanswered += 1);
                Err(why)
            }
        }
    }

    fn is_down(&self, server: usize) -> bool {
        self.down
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&server)
    }

    pub(super) fn note(&self, change: impl FnOnce(&mut Report)) {
        change(&mut self.report.lock().unwrap_or_else(|e| e.into_inner()));
    }
}

//! Scratch directories for the unit tests, removed when the test is done with them
//! (passed or failed): tests leave nothing in the temporary directory.

use std::path::{Path, PathBuf};

/// A fresh, empty directory `TMP/sampler-WHAT-PID`, removed with what it holds when
/// dropped.
pub struct TestDir(PathBuf);

impl TestDir {
    pub fn new(what: &str) -> TestDir {
        let dir = std::env::temp_dir().join(format!("sampler-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TestDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, name: impl AsRef<Path>) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
